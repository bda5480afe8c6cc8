//! One tool of a set: its descriptor, schemas and JSON entry point.

use std::fmt;
use std::future::Future;
use std::pin::Pin;

use serde_json::Value;

use super::ToolOutcome;
use super::schema::JsonObject;
use crate::{Context, ToolSpec};

/// The future of one dispatched call.
pub type ToolFuture<'a> = Pin<Box<dyn Future<Output = ToolOutcome> + Send + 'a>>;

/// A tool's JSON entry point: context, shared state, arguments.
pub type CallFn<S> = for<'a> fn(&'a Context, &'a S, &'a Value) -> ToolFuture<'a>;

/// Builds a JSON Schema.
pub type SchemaFn = fn() -> JsonObject;

/// What a tool takes from the state of its [`ToolSet`](super::ToolSet): the
/// `&self` of a method tool, or a skipped parameter (a client, a pool).
///
/// Every type has itself (`S: Has<S>`), so a set whose state is the one
/// client its tools skip needs nothing more. Tools that skip different
/// things share one state that has each of them, as axum's `FromRef` does:
///
/// ```
/// use verified_tools::toolset::Has;
///
/// pub struct Crm;
/// pub struct Mailer;
/// pub struct AppState { crm: Crm, mailer: Mailer }
///
/// impl Has<Crm> for AppState {
///     fn get(state: &Self) -> &Crm { &state.crm }
/// }
/// impl Has<Mailer> for AppState {
///     fn get(state: &Self) -> &Mailer { &state.mailer }
/// }
/// // A tool with `skip(crm, mailer)` then lists in a `ToolSet<AppState>`,
/// // and so does a tool that skips only a `&Crm`.
/// fn takes<S: Has<Crm> + Has<Mailer>>(_: &S) {}
/// takes(&AppState { crm: Crm, mailer: Mailer });
/// ```
///
/// `get` takes the state as an argument, not as `self`, so that having the
/// trait in scope adds no `.get()` method to every type.
pub trait Has<T: ?Sized> {
    /// The part of the state a tool borrows.
    fn get(state: &Self) -> &T;
}

impl<T: ?Sized> Has<T> for T {
    fn get(state: &Self) -> &T {
        state
    }
}

/// A verified tool as a [`ToolSet`](super::ToolSet) lists and dispatches
/// it: its [`ToolSpec`], the JSON Schema of its arguments (and of its
/// outcome, when its value type has one) and its JSON entry point over a
/// shared state `S`.
///
/// `#[verified_tool(schema = true)]` generates `<name>_tool()`, which
/// returns one, for any state that [`Has`] what the tool borrows.
pub struct ToolDef<S: ?Sized> {
    spec: &'static ToolSpec,
    input_schema: SchemaFn,
    output_schema: Option<SchemaFn>,
    call: CallFn<S>,
}

impl<S: ?Sized> ToolDef<S> {
    /// A tool from its parts (what the attribute generates).
    pub const fn new(
        spec: &'static ToolSpec,
        input_schema: SchemaFn,
        output_schema: Option<SchemaFn>,
        call: CallFn<S>,
    ) -> Self {
        Self { spec, input_schema, output_schema, call }
    }

    /// The tool's descriptor.
    pub fn spec(&self) -> &'static ToolSpec {
        self.spec
    }

    /// The tool's name.
    pub fn name(&self) -> &'static str {
        self.spec.name
    }

    /// The JSON Schema of the arguments object.
    pub fn input_schema(&self) -> JsonObject {
        (self.input_schema)()
    }

    /// The JSON Schema of the outcome, when the value type has a schema.
    pub fn output_schema(&self) -> Option<JsonObject> {
        self.output_schema.map(|f| f())
    }

    /// Calls the tool with `arguments`: an argument error is an outcome
    /// too ([`Status::InvalidArguments`](super::Status::InvalidArguments)),
    /// and nothing is dispatched then.
    pub fn call<'a>(&self, cx: &'a Context, state: &'a S, arguments: &'a Value) -> ToolFuture<'a> {
        (self.call)(cx, state, arguments)
    }
}

impl<S: ?Sized> Clone for ToolDef<S> {
    fn clone(&self) -> Self {
        *self
    }
}

impl<S: ?Sized> Copy for ToolDef<S> {}

impl<S: ?Sized> fmt::Debug for ToolDef<S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ToolDef")
            .field("name", &self.spec.name)
            .field("side_effect", &self.spec.side_effect)
            .field("output_schema", &self.output_schema.is_some())
            .finish_non_exhaustive()
    }
}
