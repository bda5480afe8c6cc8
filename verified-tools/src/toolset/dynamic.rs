//! The one trait a [`ToolSet`](super::ToolSet) holds its tools by: what
//! `#[verified_tool(schema)]` generates ([`ToolDef`]) and a tool defined
//! while the program runs (one proxied to another MCP server, whose name,
//! schema and class are read from that server's `tools/list`).

use serde::ser::{Serialize, SerializeTuple, Serializer};
use serde_json::{Map, Value};

use super::args::{check_depth, missing_field, not_an_object};
use super::def::{ToolDef, ToolFuture};
use super::schema::JsonObject;
use crate::key::Payload;
use crate::{ArgsError, Context, ToolSpec};

/// A tool as a [`ToolSet`](super::ToolSet) lists and calls it: its
/// descriptor, the JSON Schemas it is listed with, and a call with JSON
/// arguments that ends in a [`ToolOutcome`](super::ToolOutcome). Object
/// safe: the set keeps each tool as one of these, whatever its types.
///
/// [`ToolDef`] (what `<name>_tool()` returns) implements it. A tool known
/// only at run time implements it by hand, usually in three lines around
/// the engine: the arguments' key payload ([`json_payload`]), one
/// [`engine::run`](crate::engine::run) of a [`Tool`](crate::Tool) of its
/// own, and [`ToolOutcome::from_result`](super::ToolOutcome::from_result).
/// Add it with [`ToolSet::with_dyn`](super::ToolSet::with_dyn).
///
/// ```
/// use serde_json::{json, Value};
/// use std::io;
/// use std::sync::Mutex;
/// use verified_tools::engine::{self, Attempt};
/// use verified_tools::toolset::{json_payload, DynTool, JsonObject, Status, ToolFuture, ToolOutcome, ToolSet};
/// use verified_tools::{intern, Context, IdempotencyKey, SideEffect, Tool, ToolSpec, Verdict};
///
/// /// Another server's tools, as this process reaches them.
/// #[derive(Default)]
/// struct Upstream { sent: Mutex<Vec<(String, IdempotencyKey)>> }
///
/// /// One upstream tool, listed under the name and schema the upstream gave.
/// struct Proxied { spec: &'static ToolSpec, schema: JsonObject }
///
/// /// One call of it: what the engine runs.
/// struct ProxiedCall<'a> { spec: &'static ToolSpec, upstream: &'a Upstream }
///
/// impl Tool for ProxiedCall<'_> {
///     type Output = Value;
///     type Error = io::Error;
///     fn spec(&self) -> &'static ToolSpec { self.spec }
///     async fn dispatch(&mut self, attempt: Attempt) -> Result<Value, io::Error> {
///         // The key goes upstream with every attempt (MCP: `_meta`).
///         self.upstream.sent.lock().unwrap().push((self.spec.name.to_owned(), attempt.key));
///         Ok(json!({"queued": true}))
///     }
///     async fn verify(&mut self, key: IdempotencyKey) -> Verdict<Value> {
///         let sent = self.upstream.sent.lock().unwrap().iter().any(|(_, k)| *k == key);
///         if sent { Verdict::Holds(json!({"queued": true})) } else { Verdict::Absent }
///     }
/// }
///
/// impl DynTool<Upstream> for Proxied {
///     fn spec(&self) -> &'static ToolSpec { self.spec }
///     fn input_schema(&self) -> JsonObject { self.schema.clone() }
///     fn call<'a>(&'a self, cx: &'a Context, up: &'a Upstream, args: &'a Value) -> ToolFuture<'a> {
///         Box::pin(async move {
///             let payload = match json_payload(self.spec, args) {
///                 Ok(payload) => payload,
///                 Err(error) => return ToolOutcome::invalid_arguments(&error),
///             };
///             let call = ProxiedCall { spec: self.spec, upstream: up };
///             ToolOutcome::from_result(engine::run(cx, call, &payload, args).await)
///         })
///     }
/// }
///
/// # #[tokio::main(flavor = "current_thread", start_paused = true)] async fn main() {
/// // Read from the upstream's `tools/list`. The descriptor is kept for the
/// // rest of the process, once per content (`intern`): reading the listing
/// // again gives back the same one.
/// let listed = json!({"name": "send_mail", "inputSchema": {"type": "object"}});
/// let name = intern::text(listed["name"].as_str().unwrap());
/// let spec = intern::spec(ToolSpec::new(name, SideEffect::High).with_verifier());
/// let schema = listed["inputSchema"].as_object().unwrap().clone();
///
/// let set = ToolSet::new(Upstream::default()).with_dyn(Proxied { spec, schema });
/// assert_eq!(set.mcp_tools()[0]["name"], "send_mail");
/// let args = json!({"to": "bob@example.com"});
/// assert_eq!(set.call("send_mail", &args, "call_1").await.status, Status::Success);
/// // The same tool call again is replayed: one mail.
/// assert_eq!(set.call("send_mail", &args, "call_1").await.status, Status::Success);
/// assert_eq!(set.state().sent.lock().unwrap().len(), 1);
/// # }
/// ```
pub trait DynTool<S: ?Sized>: Send + Sync {
    /// The tool's descriptor: its name, class, effect identity
    /// ([`ToolSpec::effect_key`]) and policy overrides.
    fn spec(&self) -> &'static ToolSpec;

    /// The tool's name ([`ToolSpec::name`]).
    fn name(&self) -> &'static str {
        self.spec().name
    }

    /// The JSON Schema of the arguments object.
    fn input_schema(&self) -> JsonObject;

    /// The JSON Schema of the outcome's value, if the tool has one. By
    /// default: none.
    fn output_schema(&self) -> Option<JsonObject> {
        None
    }

    /// Calls the tool with `arguments` in `cx` (the set scopes it to the
    /// call's tool-call id): an argument error is an outcome too
    /// ([`Status::InvalidArguments`](super::Status::InvalidArguments)),
    /// and nothing is dispatched then.
    fn call<'a>(&'a self, cx: &'a Context, state: &'a S, arguments: &'a Value) -> ToolFuture<'a>;
}

impl<S: ?Sized> DynTool<S> for ToolDef<S> {
    fn spec(&self) -> &'static ToolSpec {
        ToolDef::spec(self)
    }

    fn input_schema(&self) -> JsonObject {
        ToolDef::input_schema(self)
    }

    fn output_schema(&self) -> Option<JsonObject> {
        ToolDef::output_schema(self)
    }

    fn call<'a>(&'a self, cx: &'a Context, state: &'a S, arguments: &'a Value) -> ToolFuture<'a> {
        ToolDef::call(self, cx, state, arguments)
    }
}

/// A shared tool (one a proxy keeps for every set it builds, as its
/// upstream's listing changes) is a tool of each set it is added to.
impl<S: ?Sized, T: DynTool<S> + ?Sized> DynTool<S> for std::sync::Arc<T> {
    fn spec(&self) -> &'static ToolSpec {
        (**self).spec()
    }

    fn name(&self) -> &'static str {
        (**self).name()
    }

    fn input_schema(&self) -> JsonObject {
        (**self).input_schema()
    }

    fn output_schema(&self) -> Option<JsonObject> {
        (**self).output_schema()
    }

    fn call<'a>(&'a self, cx: &'a Context, state: &'a S, arguments: &'a Value) -> ToolFuture<'a> {
        (**self).call(cx, state, arguments)
    }
}

/// The key payload of a call whose arguments are a JSON object: every
/// argument (the fingerprint commits to them all, whatever order the model
/// wrote them in), and the descriptor's effect identity
/// ([`ToolSpec::effect_key`]) picked from them. See [`json_payload`].
#[derive(Debug, Clone, Copy)]
pub struct JsonPayload<'a> {
    identity: JsonFields<'a>,
    arguments: &'a Value,
}

/// The named members of an arguments object, in the descriptor's order: a
/// [`JsonPayload`]'s effect identity, serialized as the tuple the
/// attribute's `key(..)` makes of the same parameters (an absent member as
/// `null`).
#[derive(Debug, Clone, Copy)]
pub struct JsonFields<'a> {
    names: &'static [&'static str],
    object: &'a Map<String, Value>,
}

impl Serialize for JsonFields<'_> {
    fn serialize<Z: Serializer>(&self, serializer: Z) -> Result<Z::Ok, Z::Error> {
        let mut tuple = serializer.serialize_tuple(self.names.len())?;
        for name in self.names {
            tuple.serialize_element(&self.object.get(*name).unwrap_or(&Value::Null))?;
        }
        tuple.end()
    }
}

impl<'a> Payload for JsonPayload<'a> {
    type Effect = JsonFields<'a>;
    type Args = Value;

    fn effect(&self) -> Option<&JsonFields<'a>> {
        (!self.identity.names.is_empty()).then_some(&self.identity)
    }

    fn args(&self) -> &Value {
        self.arguments
    }
}

/// The key payload of a run-time tool's call, from its JSON arguments, or
/// the argument error to answer instead (before anything is dispatched):
/// arguments that are not an object, a member nested deeper than 128
/// levels of arrays and objects, or a member of the effect
/// identity that is absent or `null` (an action the call does not name).
///
/// The key follows the same rules as a generated tool's: with an effect
/// identity (`spec.effect_key`, e.g. `["order"]`) it is derived from those
/// members alone, so a request for the same action under a new tool-call id
/// meets the same key, and the same action with other arguments is refused
/// as a key reuse; without one, from all the arguments and the call's
/// scope. A tool of the same name and agent declared with
/// `#[verified_tool(key(order))]`, over an `order` that serializes as its
/// JSON does, derives the same key: the same action reached natively and
/// through a proxy is never done twice. (With one ledger the second is
/// refused as a key reuse rather than replayed: the fingerprint of an
/// arguments object is not the one of the generated tool's arguments.)
pub fn json_payload<'a>(
    spec: &'static ToolSpec,
    arguments: &'a Value,
) -> Result<JsonPayload<'a>, ArgsError> {
    let Value::Object(object) = arguments else {
        return Err(not_an_object(spec.name, arguments));
    };
    for (field, value) in object {
        check_depth(spec.name, field, value)?;
    }
    if let Some(absent) =
        spec.effect_key.iter().find(|name| object.get(**name).is_none_or(Value::is_null))
    {
        return Err(missing_field(spec.name, absent));
    }
    Ok(JsonPayload { identity: JsonFields { names: spec.effect_key, object }, arguments })
}
