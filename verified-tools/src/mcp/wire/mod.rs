//! The wire below rmcp: every message a client sends is read here before
//! rmcp sees it, so that
//!
//! - **every request gets an answer.** rmcp drops what it cannot parse
//!   (bad JSON, a line nested too deep, a line over its limit) without a
//!   word, and answers a message of the wrong shape with an id of `null`;
//!   either way the host waits for the answer until its own timeout. Here
//!   each gets a JSON-RPC 2.0 error on the same transport: `-32700` for
//!   what is not JSON, `-32600` for what is not a JSON-RPC 2.0 request
//!   (with the request's id whenever it can be read, also from the first
//!   bytes of a line over the limit), `-32602` for the params of a
//!   `tools/call` that do not fit. Notifications and responses are never
//!   answered (JSON-RPC says so): they are dropped, and logged.
//! - **SEP-3182's `idempotencyKey` reaches the handler.** rmcp's
//!   `CallToolRequestParams` has no such field and drops unknown fields, so
//!   a string `params.idempotencyKey` of a `tools/call` is copied into
//!   `params._meta` under [`IDEMPOTENCY_KEY_META`].
//! - **no key is given twice.** JSON parsers keep one of two equal keys
//!   (serde_json the last, others the first), so a message with a
//!   duplicate key means different things to different readers. A
//!   duplicate inside a `tools/call`'s `arguments` is answered as a tool
//!   result the model can correct (`invalid_arguments`); anywhere else, as
//!   an invalid request naming the key's path.
//!
//! One pure function decides ([`inspect`], [`too_large`]); the glue around
//! it serves stdio-style line streams ([`serve_lines`]) and streamable HTTP
//! ([`HttpService`]).

use std::io::Write as _;

use rmcp::model::ClientJsonRpcMessage;
use serde_json::{Map, Value, json};

use crate::ArgsError;
use crate::toolset::ToolOutcome;

/// The `_meta` key of a `tools/call` under which the handler finds the
/// request's SEP-3182 `params.idempotencyKey` (the wire copies it there:
/// rmcp drops params fields it does not know).
///
/// A client may also send it in `_meta` itself; when both are given they
/// must be equal, or the call is refused (`-32602`).
pub const IDEMPOTENCY_KEY_META: &str = "verified-tools/idempotency_key";

/// The default limit on one message, in bytes (4 MiB): rmcp's own default
/// for a streamable HTTP request body (`max_request_body_bytes`), so that
/// stdio and HTTP accept the same messages.
pub const DEFAULT_MAX_MESSAGE_BYTES: usize = 4 * 1024 * 1024;

/// The deepest nesting of arrays and objects in a message: what
/// serde_json's parser, and so rmcp, reads (128 levels fail).
pub(crate) const MAX_DEPTH: usize = 127;

/// The longest `idempotencyKey`, in bytes.
pub(crate) const MAX_IDEMPOTENCY_KEY_BYTES: usize = 255;

/// [`ArgsError::new`] wants a tool's `'static` name, which a name read off
/// the wire is not; the outcome does not show it (only the message), so
/// the error is labelled with the method instead.
const WIRE_TOOL_LABEL: &str = "tools/call";

mod lines;
mod parse;
mod streamable;
#[cfg(test)]
mod tests;

pub use self::lines::serve_lines;
pub use self::streamable::{HttpResponse, HttpService};

use self::parse::{JsonPath, Segment, WireError, parse_message, scan_top};

// ---------------------------------------------------------------------------
// The decision.

/// A message that is answered here, not handed to rmcp.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Answer {
    /// What is wrong with it, for the log.
    pub(crate) problem: WireError,
    /// The JSON-RPC response (one line, without its newline); `None` for a
    /// notification or a response, which JSON-RPC never answers.
    pub(crate) reply: Option<Vec<u8>>,
}

/// What to do with one message.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Inspected {
    /// Hand it to rmcp: the message (without a line ending), rewritten
    /// when its `idempotencyKey` was copied into `_meta`.
    Forward(Vec<u8>),
    /// Answer it here (or drop it, a notification), and log why.
    Answer(Answer),
}

fn answer(problem: WireError, id: Option<&Value>) -> Inspected {
    let reply = id.map(|id| problem.reply(id));
    Inspected::Answer(Answer { problem, reply })
}

/// Decides about one message: a line of stdio (with or without its `\n` or
/// `\r\n`) or an HTTP body. Anything longer than `limit` bytes is refused
/// (as by [`too_large`]); a leading UTF-8 byte order mark is skipped (RFC
/// 8259 lets a parser ignore it, and rmcp does).
pub(crate) fn inspect(line: &[u8], limit: usize) -> Inspected {
    let message = trim_line(line);
    if message.len() > limit {
        return too_large(message, limit);
    }
    if message.iter().all(u8::is_ascii_whitespace) {
        return answer(WireError::Parse("the message is empty".to_owned()), Some(&Value::Null));
    }
    let mut value = match parse_message(message) {
        Ok(value) => value,
        Err(WireError::DuplicateKey(path)) => return duplicate(message, path),
        Err(WireError::TooDeep) => return refuse_partial(message, WireError::TooDeep),
        Err(problem) => return answer(problem, Some(&Value::Null)),
    };
    let shape = match shape(&value) {
        Ok(shape) => shape,
        Err(refused) => return refused,
    };
    let mut rewritten = false;
    if let Shape::Request { id, method } = &shape
        && method == "tools/call"
    {
        match tools_call(value.get_mut("params")) {
            Ok(changed) => rewritten = changed,
            Err(problem) => return answer(problem, Some(id)),
        }
    }
    let forward = if rewritten { to_bytes(&value) } else { message.to_vec() };
    // What passes here but not rmcp's own parse would reach rmcp only to be
    // answered with an id of `null`, or a notification answered at all.
    if let Err(e) = serde_json::from_slice::<ClientJsonRpcMessage>(&forward) {
        return match shape {
            Shape::Request { id, method } => answer(
                WireError::InvalidParams(format!("the params of `{method}` do not fit: {e}")),
                Some(&id),
            ),
            Shape::Notification { method } => answer(
                WireError::InvalidRequest(format!("the notification `{method}` does not fit: {e}")),
                None,
            ),
            Shape::Response => {
                answer(WireError::InvalidRequest(format!("the response does not fit: {e}")), None)
            }
        };
    }
    Inspected::Forward(forward)
}

/// Decides about a message longer than `limit`, of which `prefix` is the
/// beginning (the reader stops keeping a line once it is over the limit):
/// answered with the request's id when the prefix shows it.
pub(crate) fn too_large(prefix: &[u8], limit: usize) -> Inspected {
    refuse_partial(prefix, WireError::TooLarge { limit })
}

/// Refuses a message that cannot be parsed whole, with the id its top level
/// shows before it fails: only that of a request (a `method` was seen), so
/// that a client's response to the server is never answered under an id of
/// the client's own requests.
fn refuse_partial(message: &[u8], problem: WireError) -> Inspected {
    let partial = scan_top(strip_bom(message));
    if partial.response && !partial.method {
        return answer(problem, None);
    }
    let id = partial.id.filter(|id| partial.method && is_valid_id(id)).unwrap_or(Value::Null);
    answer(problem, Some(&id))
}

/// A message with a duplicate key at `path`: read as serde_json would (the
/// last of the two wins) only to find who to answer and how.
fn duplicate(message: &[u8], path: JsonPath) -> Inspected {
    let Ok(value) = serde_json::from_slice::<Value>(message) else {
        return answer(WireError::DuplicateKey(path), Some(&Value::Null));
    };
    let (id, method) = match shape(&value) {
        Err(refused) => return refused,
        Ok(Shape::Notification { .. } | Shape::Response) => {
            return answer(WireError::DuplicateKey(path), None);
        }
        Ok(Shape::Request { id, method }) => (id, method),
    };
    let tool = value.pointer("/params/name").and_then(Value::as_str);
    match (path.0.as_slice(), tool) {
        // Two ids: which one the client waits for is anyone's guess.
        ([Segment::Key(key)], _) if key == "id" => {
            answer(WireError::DuplicateKey(path), Some(&Value::Null))
        }
        ([Segment::Key(params), Segment::Key(arguments), field @ ..], Some(tool))
            if method == "tools/call"
                && params == "params"
                && arguments == "arguments"
                && !field.is_empty() =>
        {
            let field = JsonPath(field.to_vec()).to_string();
            let reply = duplicate_argument(&id, &field);
            Inspected::Answer(Answer {
                problem: WireError::DuplicateArgument { tool: tool.to_owned(), field },
                reply: Some(reply),
            })
        }
        _ => answer(WireError::DuplicateKey(path), Some(&id)),
    }
}

/// The tool result of a call whose arguments give `field` twice, as the
/// handler answers arguments that do not fit.
fn duplicate_argument(id: &Value, field: &str) -> Vec<u8> {
    let error = ArgsError::new(WIRE_TOOL_LABEL, format!("field `{field}` is given twice"));
    let outcome =
        serde_json::to_value(ToolOutcome::invalid_arguments(&error)).expect("an outcome is JSON");
    to_bytes(&json!({
        "jsonrpc": "2.0",
        "id": id,
        "result": {
            "content": [{ "type": "text", "text": outcome.to_string() }],
            "structuredContent": outcome,
            "isError": true,
        },
    }))
}

/// The kind of a well-formed JSON-RPC 2.0 message.
enum Shape {
    Request { id: Value, method: String },
    Notification { method: String },
    Response,
}

/// Classifies a message as rmcp does (by which of `method`, `id`,
/// `result`, `error` it has), refusing what is not JSON-RPC 2.0.
fn shape(value: &Value) -> Result<Shape, Inspected> {
    let object = match value {
        Value::Object(object) => object,
        Value::Array(_) => {
            return Err(invalid(
                "a batch (a JSON array) is not supported: send one message at a time".to_owned(),
                Some(&Value::Null),
            ));
        }
        other => {
            return Err(invalid(
                format!("a JSON-RPC message is an object, not {}", kind(other)),
                Some(&Value::Null),
            ));
        }
    };
    let id = object.get("id");
    let method = object.get("method");
    let is_response =
        method.is_none() && (object.contains_key("result") || object.contains_key("error"));
    let jsonrpc = match object.get("jsonrpc") {
        Some(Value::String(version)) if version == "2.0" => None,
        None => Some("`jsonrpc` is missing: it must be \"2.0\"".to_owned()),
        Some(other) => Some(format!("`jsonrpc` must be \"2.0\", not {}", show(other))),
    };
    if is_response {
        let why = jsonrpc.or_else(|| {
            id.filter(|id| !id.is_null() && !is_valid_id(id)).map(|id| {
                format!("the `id` of a response must be a string or an integer, not {}", kind(id))
            })
        });
        return match why {
            Some(why) => Err(invalid(format!("a response: {why}"), None)),
            None => Ok(Shape::Response),
        };
    }
    // JSON-RPC answers a request whose id cannot be read with `null`; only
    // what is plainly a notification (a string method, no id) goes
    // unanswered.
    let notification = id.is_none() && method.is_some_and(Value::is_string);
    let reply_id = match id {
        Some(id) if is_valid_id(id) => id.clone(),
        _ => Value::Null,
    };
    let refuse = |why: String| Err(invalid(why, (!notification).then_some(&reply_id)));
    if let Some(why) = jsonrpc {
        return refuse(why);
    }
    if let Some(id) = id
        && !is_valid_id(id)
    {
        return refuse(format!("`id` must be a string or an integer, not {}", kind(id)));
    }
    let method = match method {
        Some(Value::String(method)) => method.clone(),
        Some(other) => return refuse(format!("`method` must be a string, not {}", kind(other))),
        None => return refuse("`method` is missing".to_owned()),
    };
    if object.contains_key("result") || object.contains_key("error") {
        return refuse("a message has either a `method` or a `result` or `error`".to_owned());
    }
    if let Some(params) = object.get("params")
        && !(params.is_object() || params.is_array())
    {
        return refuse(format!("`params` must be an object, not {}", kind(params)));
    }
    Ok(match id {
        Some(id) => Shape::Request { id: id.clone(), method },
        None => Shape::Notification { method },
    })
}

fn invalid(why: String, id: Option<&Value>) -> Inspected {
    answer(WireError::InvalidRequest(why), id)
}

/// Checks the params of a `tools/call` request, and copies its
/// `idempotencyKey` into `_meta`: whether the message changed.
fn tools_call(params: Option<&mut Value>) -> Result<bool, WireError> {
    let Some(Value::Object(params)) = params else {
        return Err(WireError::InvalidParams(
            "`params` of `tools/call` must be an object with the tool's `name`".to_owned(),
        ));
    };
    match params.get("name") {
        Some(Value::String(_)) => {}
        Some(other) => {
            return Err(WireError::InvalidParams(format!(
                "`params.name` must be the tool's name, a string, not {}",
                kind(other)
            )));
        }
        None => {
            return Err(WireError::InvalidParams(
                "`params.name` (the tool's name) is missing".to_owned(),
            ));
        }
    }
    match params.get("arguments") {
        None | Some(Value::Null | Value::Object(_)) => {}
        Some(other) => {
            return Err(WireError::InvalidParams(format!(
                "`params.arguments` must be an object, not {}",
                kind(other)
            )));
        }
    }
    match params.get("_meta") {
        None | Some(Value::Null | Value::Object(_)) => {}
        Some(other) => {
            return Err(WireError::InvalidParams(format!(
                "`params._meta` must be an object, not {}",
                kind(other)
            )));
        }
    }
    let key = match params.get("idempotencyKey") {
        None => return Ok(false),
        Some(Value::String(key)) if key.is_empty() => {
            return Err(WireError::InvalidParams(
                "`params.idempotencyKey` must not be empty".to_owned(),
            ));
        }
        Some(Value::String(key)) if key.len() > MAX_IDEMPOTENCY_KEY_BYTES => {
            return Err(WireError::InvalidParams(format!(
                "`params.idempotencyKey` is {} bytes long, over the limit of \
                 {MAX_IDEMPOTENCY_KEY_BYTES}",
                key.len()
            )));
        }
        Some(Value::String(key)) => key.clone(),
        Some(other) => {
            return Err(WireError::InvalidParams(format!(
                "`params.idempotencyKey` must be a non-empty string, not {}",
                kind(other)
            )));
        }
    };
    let meta = params.entry("_meta").or_insert(Value::Null);
    if meta.is_null() {
        *meta = Value::Object(Map::new());
    }
    let Value::Object(meta) = meta else { unreachable!("`_meta` was checked to be an object") };
    match meta.get(IDEMPOTENCY_KEY_META) {
        None => {
            meta.insert(IDEMPOTENCY_KEY_META.to_owned(), Value::String(key));
            Ok(true)
        }
        Some(Value::String(given)) if *given == key => Ok(false),
        Some(given) => Err(WireError::InvalidParams(format!(
            "`params.idempotencyKey` ({}) and `params._meta[\"{IDEMPOTENCY_KEY_META}\"]` ({}) \
             disagree",
            Value::String(key),
            show(given)
        ))),
    }
}

/// A JSON-RPC id as MCP (and rmcp) takes it: a string, or an integer
/// (also written `1.0`).
fn is_valid_id(id: &Value) -> bool {
    match id {
        Value::String(_) => true,
        Value::Number(n) => {
            n.as_i64().is_some()
                || n.as_f64().is_some_and(|f| f.fract() == 0.0 && f.abs() < 9_007_199_254_740_992.0)
        }
        _ => false,
    }
}

fn kind(value: &Value) -> &'static str {
    match value {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

/// A short value as JSON text, a long or nested one by its kind.
fn show(value: &Value) -> String {
    match value {
        Value::String(s) if s.len() <= 64 => value.to_string(),
        Value::Number(_) | Value::Bool(_) | Value::Null => value.to_string(),
        other => kind(other).to_owned(),
    }
}

/// Strips one line ending (`\n`, `\r\n`) and a leading byte order mark.
fn trim_line(line: &[u8]) -> &[u8] {
    let line = line.strip_suffix(b"\n").unwrap_or(line);
    let line = line.strip_suffix(b"\r").unwrap_or(line);
    strip_bom(line)
}

fn strip_bom(bytes: &[u8]) -> &[u8] {
    bytes.strip_prefix(b"\xEF\xBB\xBF").unwrap_or(bytes)
}

fn to_bytes(value: &Value) -> Vec<u8> {
    serde_json::to_vec(value).expect("a Value is JSON")
}

/// Logs a message answered or dropped here, once: to the `tracing`
/// subscriber when there is one, else to stderr (never stdout, which is
/// the protocol of a stdio server).
fn log(answer: &Answer) {
    let what = if answer.reply.is_some() { "answered" } else { "dropped" };
    #[cfg(feature = "tracing")]
    if has_subscriber() {
        tracing::warn!(
            target: "verified_tools::mcp",
            code = answer.problem.code(),
            "{what} a message: {}",
            answer.problem
        );
        return;
    }
    // `eprintln!` panics when stderr is closed (a host that reads only the
    // first line of it): a log line must never take the server down.
    let _ = writeln!(std::io::stderr(), "verified-tools mcp: {what} a message: {}", answer.problem);
}

/// Whether a `tracing` subscriber would see an event: without one (a stdio
/// server rarely installs one), an event would go nowhere.
#[cfg(feature = "tracing")]
fn has_subscriber() -> bool {
    !tracing::dispatcher::get_default(|d| d.is::<tracing::subscriber::NoSubscriber>())
}
