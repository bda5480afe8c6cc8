//! Handing verified tools to a model: outcomes it can read, and (feature
//! `schema`) tool sets that list tools with their JSON Schemas and dispatch
//! the model's calls by name.
//!
//! - [`ToolOutcome`]: a [`ToolResult`](crate::ToolResult) (or an argument
//!   error) serialized for the model: `status`, `value`, `proof`, `key`,
//!   `reason`, `error`, and for everything but a success an `instruction`
//!   in plain words. Always available.
//! - `ToolSet` (feature `schema`): built from the `<name>_tool()`
//!   descriptors of `#[verified_tool(schema = true)]` tools and their
//!   shared state; lists them as OpenAI, Anthropic or MCP tools
//!   (`mcp_annotations` from what a tool declares: its class, effect kind
//!   and effect identity); dispatches a call by name, with the provider's
//!   tool-call id as the request identity of the logical call.
//! - `DynTool` (feature `schema`): the one trait the set holds its tools
//!   by. The generated descriptors implement it, and so does a tool defined
//!   while the program runs (one proxied to another MCP server), with
//!   `json_payload` for the key of its JSON arguments.
//! - `verified_tools::mcp` (feature `mcp`) serves a tool set over MCP.
//!
//! # Hostile arguments
//!
//! A model's arguments are untrusted input. `<name>_json` refuses, as an
//! argument error and before anything is dispatched: a non-object, unknown
//! fields, missing or ill-typed fields (named, with the JSON type expected:
//! "field `customer`: expected a non-negative integer, got a string"), and
//! any field nested deeper than 128 levels of arrays and objects, enforced
//! without recursion, so a `Value` built in memory 100,000 levels deep is an
//! error, not a stack overflow. Arguments given as text (`ToolSet::call_text`,
//! the MCP server's wire) are parsed once by a parser that also refuses an
//! object giving a field twice, at any depth ("field `amount` is given
//! twice"): with serde_json's last-wins, what the audit shows and what the
//! tool executes could differ. Text nests at most as deep as serde_json's
//! parser allows (127 levels below the arguments object).

// What the generated `<name>_json` and `<name>_tool` call, through
// `verified_tools::__private`: not public API.
#[doc(hidden)]
pub mod args;
mod outcome;

#[cfg(feature = "schema")]
mod checks;
#[cfg(feature = "schema")]
mod def;
#[cfg(feature = "schema")]
mod dynamic;
#[cfg(feature = "schema")]
#[doc(hidden)]
pub mod schema;
#[cfg(feature = "schema")]
mod set;

pub use outcome::{Status, ToolOutcome};

/// Parse a tool call's arguments text with this before handing the `Value`
/// to `<name>_json`: it refuses a field given twice, which a plain
/// `serde_json::from_str` resolves silently (last value wins).
pub use args::parse_arguments;

#[cfg(feature = "schema")]
pub use checks::{CHECK_TOOL, Reconciled};
#[cfg(feature = "schema")]
pub use def::{CallFn, Has, SchemaFn, ToolDef, ToolFuture};
#[cfg(feature = "schema")]
pub use dynamic::{DynTool, JsonFields, JsonPayload, json_payload};
#[cfg(feature = "schema")]
pub use schema::JsonObject;
#[cfg(feature = "schema")]
pub use set::{ToolSet, mcp_annotations};

/// The items of `#[verified_tool(schema = true)]`: emitted as they are with
/// the `schema` feature, replaced by one error saying how to enable it
/// without.
#[cfg(feature = "schema")]
#[doc(hidden)]
#[macro_export]
macro_rules! __verified_tools_schema_items {
    ($($items:tt)*) => { $($items)* };
}

/// See the other definition.
#[cfg(not(feature = "schema"))]
#[doc(hidden)]
#[macro_export]
macro_rules! __verified_tools_schema_items {
    ($($items:tt)*) => {
        ::core::compile_error!(
            "`schema = true` needs the `schema` feature of verified-tools: \
             `verified-tools = { version = \"0.1\", features = [\"schema\"] }`"
        );
    };
}
