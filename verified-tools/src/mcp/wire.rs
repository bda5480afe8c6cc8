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

use std::cell::RefCell;
use std::convert::Infallible;
use std::fmt;
use std::future::Future;
use std::io;
use std::io::Write as _;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use http_body_util::combinators::BoxBody;
use http_body_util::{BodyExt as _, Full};
use hyper::body::{Body, Buf as _, Bytes};
use hyper::header::{self, HeaderValue};
use hyper::{Method, Request, Response, StatusCode};
use rmcp::model::ClientJsonRpcMessage;
use rmcp::service::QuitReason;
use rmcp::transport::StreamableHttpService;
use rmcp::transport::streamable_http_server::SessionManager;
use rmcp::transport::streamable_http_server::session::local::LocalSessionManager;
use rmcp::{ServerHandler, ServiceExt as _};
use serde::de::{self, IgnoredAny, MapAccess, Visitor};
use serde_json::{Map, Value, json};
use tokio::io::{AsyncBufReadExt as _, AsyncRead, AsyncWrite, AsyncWriteExt as _, BufReader};
use tokio::sync::{Semaphore, mpsc};

#[cfg(doc)]
use super::http::Principal;
use super::http::{Authenticate, HttpLimits, authenticate, unauthorized};

use crate::ArgsError;
use crate::toolset::ToolOutcome;
use crate::toolset::args::{self, JsonTextError, Step};

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

// ---------------------------------------------------------------------------
// What is wrong with a message.

/// One step of a path into a JSON message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Segment {
    /// A key of an object.
    Key(String),
    /// An index into an array.
    Index(usize),
}

/// Where in a message: `params.arguments.amount`, `items[2].sku`,
/// `params._meta["verified-tools/idempotency_key"]`.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub(crate) struct JsonPath(pub(crate) Vec<Segment>);

impl fmt::Display for JsonPath {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, segment) in self.0.iter().enumerate() {
            match segment {
                Segment::Index(index) => write!(f, "[{index}]")?,
                Segment::Key(key) if is_plain(key) => {
                    if i > 0 {
                        f.write_str(".")?;
                    }
                    f.write_str(key)?;
                }
                Segment::Key(key) => write!(f, "[{}]", Value::String(key.clone()))?,
            }
        }
        Ok(())
    }
}

/// A key that reads unambiguously after a dot.
fn is_plain(key: &str) -> bool {
    !key.is_empty() && key.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
}

/// Why a message is not handed to rmcp.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum WireError {
    /// Not JSON (or not UTF-8), in the parser's words (`-32700`).
    Parse(String),
    /// Longer than the limit, in bytes (`-32600`).
    TooLarge {
        /// The limit.
        limit: usize,
    },
    /// Nested deeper than [`MAX_DEPTH`] (`-32600`).
    TooDeep,
    /// An object gives the same key twice: the path of the second
    /// (`-32600`).
    DuplicateKey(JsonPath),
    /// Not a JSON-RPC 2.0 message (`-32600`).
    InvalidRequest(String),
    /// The params of a request do not fit (`-32602`).
    InvalidParams(String),
    /// A `tools/call`'s arguments give a field twice: answered as a tool
    /// result the model can correct.
    DuplicateArgument {
        /// The tool called.
        tool: String,
        /// The field, as a path into the arguments.
        field: String,
    },
}

impl WireError {
    /// The JSON-RPC error code.
    pub(crate) fn code(&self) -> i64 {
        match self {
            Self::Parse(_) => -32700,
            Self::TooLarge { .. }
            | Self::TooDeep
            | Self::DuplicateKey(_)
            | Self::InvalidRequest(_) => -32600,
            Self::InvalidParams(_) | Self::DuplicateArgument { .. } => -32602,
        }
    }

    /// The error's `data`: the limit a message broke, or where.
    fn data(&self) -> Option<Value> {
        match self {
            Self::TooLarge { limit } => Some(json!({ "maxBytes": limit })),
            Self::TooDeep => Some(json!({ "maxDepth": MAX_DEPTH })),
            Self::DuplicateKey(path) => Some(json!({ "path": path.to_string() })),
            _ => None,
        }
    }

    /// The JSON-RPC error response to the request of `id`.
    pub(crate) fn reply(&self, id: &Value) -> Vec<u8> {
        let mut error = json!({ "code": self.code(), "message": self.to_string() });
        if let Some(data) = self.data() {
            error["data"] = data;
        }
        to_bytes(&json!({ "jsonrpc": "2.0", "id": id, "error": error }))
    }
}

impl fmt::Display for WireError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Parse(e) => write!(f, "Parse error: {e}"),
            Self::TooLarge { limit } => {
                write!(f, "Invalid request: the message is longer than the limit of {limit} bytes")
            }
            Self::TooDeep => write!(
                f,
                "Invalid request: the message nests arrays and objects deeper than the limit \
                 of {MAX_DEPTH} levels"
            ),
            Self::DuplicateKey(path) => {
                write!(f, "Invalid request: the key `{path}` is given twice")
            }
            Self::InvalidRequest(why) => write!(f, "Invalid request: {why}"),
            Self::InvalidParams(why) => write!(f, "Invalid params: {why}"),
            Self::DuplicateArgument { tool, field } => {
                write!(f, "tool `{tool}`: field `{field}` is given twice")
            }
        }
    }
}

// ---------------------------------------------------------------------------
// Parsing one message.

/// Parses one message into a `Value`, refusing a key given twice in any
/// object (with the path of the second), what nests deeper than
/// [`MAX_DEPTH`], and trailing characters: the tool set's one
/// duplicate-aware parser ([`args::parse_value`]), so that a message and a
/// tool call's arguments text are read alike.
pub(crate) fn parse_message(bytes: &[u8]) -> Result<Value, WireError> {
    let text = std::str::from_utf8(bytes)
        .map_err(|e| WireError::Parse(format!("the message is not UTF-8: {e}")))?;
    args::parse_value(text).map_err(|e| match e {
        JsonTextError::DuplicateKey(duplicate) => {
            let steps = duplicate.path().steps().iter();
            WireError::DuplicateKey(JsonPath(steps.map(Segment::from).collect()))
        }
        JsonTextError::TooDeep { .. } => WireError::TooDeep,
        JsonTextError::NotJson(e) => WireError::Parse(e.to_string()),
    })
}

impl From<&Step> for Segment {
    fn from(step: &Step) -> Self {
        match step {
            Step::Key(key) => Segment::Key(key.clone()),
            Step::Index(index) => Segment::Index(*index),
        }
    }
}

/// What the top level of a message that cannot be parsed whole (too deep,
/// cut at the limit) says about itself before the point where it fails.
#[derive(Debug, Default)]
struct Partial {
    id: Option<Value>,
    method: bool,
    response: bool,
}

fn scan_top(bytes: &[u8]) -> Partial {
    struct Scan<'a>(&'a RefCell<Partial>);

    impl<'de> Visitor<'de> for Scan<'_> {
        type Value = ();

        fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.write_str("a JSON-RPC message")
        }

        fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<(), A::Error> {
            while let Some(key) = map.next_key::<String>()? {
                match key.as_str() {
                    "id" => {
                        let id = map.next_value::<Value>()?;
                        self.0.borrow_mut().id = Some(id);
                    }
                    "method" => {
                        self.0.borrow_mut().method = true;
                        map.next_value::<IgnoredAny>()?;
                    }
                    "result" | "error" => {
                        self.0.borrow_mut().response = true;
                        map.next_value::<IgnoredAny>()?;
                    }
                    _ => {
                        map.next_value::<IgnoredAny>()?;
                    }
                }
            }
            Ok(())
        }
    }

    let partial = RefCell::new(Partial::default());
    let mut parser = serde_json::Deserializer::from_slice(bytes);
    // It fails where the message does; what was seen before stays.
    let _ = de::Deserializer::deserialize_map(&mut parser, Scan(&partial));
    partial.into_inner()
}

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

// ---------------------------------------------------------------------------
// stdio (any line stream).

/// One line of input.
enum Line {
    /// A whole line, with its line ending (none at the end of input).
    Whole(Vec<u8>),
    /// A line over the limit: its first bytes (the rest is skipped).
    TooLong(Vec<u8>),
}

/// Reads lines without ever keeping more than the limit of one: the rest
/// of a longer line is read and dropped up to its newline.
struct LineReader<R> {
    input: BufReader<R>,
    line: Vec<u8>,
    limit: usize,
    skipping: bool,
}

impl<R: AsyncRead + Unpin> LineReader<R> {
    fn new(input: R, limit: usize) -> Self {
        Self { input: BufReader::new(input), line: Vec::new(), limit, skipping: false }
    }

    async fn next(&mut self) -> io::Result<Option<Line>> {
        // A line of `limit` bytes may still end in "\r\n".
        let most = self.limit.saturating_add(1);
        loop {
            let available = self.input.fill_buf().await?;
            if available.is_empty() {
                return Ok((!self.skipping && !self.line.is_empty())
                    .then(|| Line::Whole(std::mem::take(&mut self.line))));
            }
            let newline = available.iter().position(|&b| b == b'\n');
            let taken = newline.map_or(available.len(), |at| at + 1);
            let content = newline.unwrap_or(available.len());
            let line = if self.skipping {
                self.skipping = newline.is_none();
                None
            } else if self.line.len().saturating_add(content) > most {
                let room = most.saturating_sub(self.line.len());
                self.line.extend_from_slice(&available[..room]);
                self.skipping = newline.is_none();
                Some(Line::TooLong(std::mem::take(&mut self.line)))
            } else {
                self.line.extend_from_slice(&available[..taken]);
                newline.map(|_| Line::Whole(std::mem::take(&mut self.line)))
            };
            self.input.consume(taken);
            if line.is_some() {
                return Ok(line);
            }
        }
    }
}

/// Serves `handler` over a stream of newline-delimited JSON-RPC messages
/// (MCP's stdio transport: `tokio::io::stdin()` and `stdout()`, or
/// `rmcp::transport::stdio_pipes()`), with every line read by the wire
/// first (see the module's documentation), no line longer than `limit`
/// bytes kept ([`DEFAULT_MAX_MESSAGE_BYTES`] is rmcp's HTTP limit).
///
/// rmcp serves the lines that pass through an in-memory pipe; its answers
/// and the wire's own are written to `output` by one writer, a whole line
/// at a time. Blank lines are skipped. Ends when `input` ends (rmcp's input
/// is closed then, so it ends too) or when rmcp ends, with rmcp's reason.
///
/// # Errors
///
/// When the MCP handshake fails (also when `input` ends before it), the
/// serving task panics, or writing to `output` fails.
pub async fn serve_lines<H, R, W>(
    handler: H,
    input: R,
    output: W,
    limit: usize,
) -> io::Result<QuitReason>
where
    H: ServerHandler,
    R: AsyncRead + Unpin + Send + 'static,
    W: AsyncWrite + Unpin + Send + 'static,
{
    const PIPE_BYTES: usize = 64 * 1024;
    let (to_rmcp, rmcp_input) = tokio::io::duplex(PIPE_BYTES);
    let (rmcp_output, from_rmcp) = tokio::io::duplex(PIPE_BYTES);
    let (lines, queue) = mpsc::channel::<Vec<u8>>(64);
    let writer = tokio::spawn(write_lines(queue, output));
    let pump = tokio::spawn(pump_lines(from_rmcp, lines.clone()));
    let mut server = tokio::spawn(async move {
        let running = handler.serve((rmcp_input, rmcp_output)).await.map_err(io::Error::other)?;
        running.waiting().await.map_err(io::Error::other)
    });
    let served = tokio::select! {
        () = read_lines(input, limit, to_rmcp, lines) => server.await,
        served = &mut server => served,
    };
    let served = served.map_err(io::Error::other).and_then(|served| served);
    // rmcp's output closes once it has ended; then the writer's queue does.
    let _ = pump.await;
    let written = writer.await.map_err(io::Error::other).and_then(|written| written);
    let reason = served?;
    written?;
    Ok(reason)
}

async fn read_lines<R: AsyncRead + Unpin>(
    input: R,
    limit: usize,
    mut to_rmcp: tokio::io::DuplexStream,
    answers: mpsc::Sender<Vec<u8>>,
) {
    let mut reader = LineReader::new(input, limit);
    loop {
        let inspected = match reader.next().await {
            Ok(Some(Line::Whole(line))) if line.iter().all(u8::is_ascii_whitespace) => continue,
            Ok(Some(Line::Whole(line))) => inspect(&line, limit),
            Ok(Some(Line::TooLong(prefix))) => too_large(&prefix, limit),
            Ok(None) => return,
            Err(e) => {
                let _ = writeln!(
                    std::io::stderr(),
                    "verified-tools mcp: reading the input failed: {e}"
                );
                return;
            }
        };
        match inspected {
            Inspected::Forward(mut message) => {
                message.push(b'\n');
                if to_rmcp.write_all(&message).await.is_err() {
                    return;
                }
            }
            Inspected::Answer(answer) => {
                log(&answer);
                if let Some(mut reply) = answer.reply {
                    reply.push(b'\n');
                    if answers.send(reply).await.is_err() {
                        return;
                    }
                }
            }
        }
    }
}

/// Hands rmcp's output to the writer a whole line at a time, so that the
/// wire's own answers fall between lines, never inside one.
async fn pump_lines(from_rmcp: tokio::io::DuplexStream, lines: mpsc::Sender<Vec<u8>>) {
    let mut from_rmcp = BufReader::new(from_rmcp);
    loop {
        let mut line = Vec::new();
        match from_rmcp.read_until(b'\n', &mut line).await {
            Ok(0) | Err(_) => return,
            Ok(_) => {}
        }
        if !line.ends_with(b"\n") {
            line.push(b'\n');
        }
        if lines.send(line).await.is_err() {
            return;
        }
    }
}

async fn write_lines<W: AsyncWrite + Unpin>(
    mut queue: mpsc::Receiver<Vec<u8>>,
    mut output: W,
) -> io::Result<()> {
    while let Some(line) = queue.recv().await {
        output.write_all(&line).await?;
        // Flushing per line would cost a write per message under load;
        // flushing when nothing is waiting still never holds an answer back.
        if queue.is_empty() {
            output.flush().await?;
        }
    }
    output.flush().await
}

// ---------------------------------------------------------------------------
// Streamable HTTP.

/// A response of [`HttpService`]: rmcp's own response type.
pub type HttpResponse = Response<BoxBody<Bytes, Infallible>>;

/// rmcp's streamable HTTP endpoint ([`StreamableHttpService`]) with every
/// POST body read by the wire first (see the module's documentation): a
/// tower service, to serve with hyper (`hyper_util`'s
/// `TowerToHyperService`) or mount in axum (`Router::route_service`, or
/// `nest_service`).
///
/// A POST whose `Content-Type` is JSON is collected up to the limit (`413
/// Payload Too Large` past it, with a JSON-RPC error) and inspected: a
/// message that passes goes on to rmcp as one buffered body (rewritten when
/// its `idempotencyKey` was copied into `_meta`); one that does not is
/// answered here with `application/json`: `200 OK` for a request refused
/// for its params (`-32602`, or a tool result for a duplicate argument),
/// `400 Bad Request` for what is not JSON-RPC 2.0 and for notifications.
/// Every other request (GET, DELETE, another content type) goes to rmcp
/// untouched.
///
/// The trade-offs: a POST body is buffered before rmcp sees it (rmcp
/// buffers it too, so the memory of one request is at most twice the
/// limit); and a message this service answers itself skips rmcp's header
/// checks other than `Host` and `Origin` (`Accept`, the session id, the
/// protocol version header), since no handler runs for it. The `Host` and
/// `Origin` checks (DNS rebinding protection) still come first: the
/// request's headers are shown to rmcp, without a body and under a method
/// it serves none of, and its refusal (`403`, `400`) is returned as is.
///
/// With an [`Authenticate`] ([`with_authenticator`](Self::with_authenticator)),
/// every request must carry `Authorization: Bearer TOKEN`, checked before
/// anything else (`401` and a `WWW-Authenticate: Bearer` challenge
/// otherwise, RFC 6750 §3); the [`Principal`] it yields goes into the
/// request's extensions, where the handler finds it. Past
/// [`HttpLimits::max_concurrent_requests`] a request is refused with `503`;
/// a JSON POST body that takes longer than
/// [`HttpLimits::body_read_timeout`] with `408`.
pub struct HttpService<S, M = LocalSessionManager> {
    inner: StreamableHttpService<S, M>,
    limit: usize,
    auth: Option<Arc<dyn Authenticate>>,
    body_timeout: Duration,
    requests: Arc<Semaphore>,
}

impl<S, M> Clone for HttpService<S, M> {
    fn clone(&self) -> Self {
        Self {
            inner: self.inner.clone(),
            limit: self.limit,
            auth: self.auth.clone(),
            body_timeout: self.body_timeout,
            requests: Arc::clone(&self.requests),
        }
    }
}

impl<S, M> fmt::Debug for HttpService<S, M> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("HttpService")
            .field("limit", &self.limit)
            .field("authenticates", &self.auth.is_some())
            .field("body_timeout", &self.body_timeout)
            .finish_non_exhaustive()
    }
}

/// `inner` behind the wire, refusing bodies over `limit` bytes (use the
/// `max_request_body_bytes` of `inner`'s config, as [`HttpService::new`]
/// does, so that the two limits agree).
pub(crate) fn http_layer<S, M>(
    inner: StreamableHttpService<S, M>,
    limit: usize,
) -> HttpService<S, M> {
    let limits = HttpLimits::default();
    HttpService {
        inner,
        limit,
        auth: None,
        body_timeout: limits.body_read_timeout,
        requests: Arc::new(Semaphore::new(limits.max_concurrent_requests)),
    }
}

impl<S, M> HttpService<S, M>
where
    S: ServerHandler + Send + 'static,
    M: SessionManager,
{
    /// `inner` behind the wire, with the body limit of `inner`'s config
    /// (`max_request_body_bytes`, 4 MiB by default).
    pub fn new(inner: StreamableHttpService<S, M>) -> Self {
        let limit = inner.config.max_request_body_bytes;
        http_layer(inner, limit)
    }

    /// The rmcp service behind the wire.
    pub fn inner(&self) -> &StreamableHttpService<S, M> {
        &self.inner
    }

    /// Requires a bearer token on every request, checked by `auth`.
    #[must_use]
    pub fn with_authenticator(mut self, auth: Arc<dyn Authenticate>) -> Self {
        self.auth = Some(auth);
        self
    }

    /// Applies the body read timeout and the cap on concurrent requests of
    /// `limits` (the rest are the accept loop's: see
    /// [`McpServer::serve_http`](super::McpServer::serve_http)).
    #[must_use]
    pub fn with_limits(mut self, limits: &HttpLimits) -> Self {
        self.body_timeout = limits.body_read_timeout;
        self.requests = Arc::new(Semaphore::new(limits.max_concurrent_requests));
        self
    }

    /// Answers one HTTP request.
    pub async fn handle<B>(&self, mut request: Request<B>) -> HttpResponse
    where
        B: Body + Send + 'static,
        B::Data: Send,
        B::Error: fmt::Display,
    {
        // Who asks comes first: an unauthenticated client learns nothing
        // else about the server, not even its Host and Origin rules.
        if let Some(auth) = &self.auth {
            match authenticate(auth.as_ref(), request.headers()) {
                Ok(principal) => {
                    request.extensions_mut().insert(principal);
                }
                Err(e) => return unauthorized(&e),
            }
        }
        let Ok(permit) = Arc::clone(&self.requests).try_acquire_owned() else {
            return busy();
        };
        let response = self.answer(request).await;
        // The slot is held until the answer has been sent in full: an SSE
        // answer is where a tool call does its work.
        let (parts, body) = response.into_parts();
        Response::from_parts(parts, Guarded { body, _permit: permit }.boxed())
    }

    async fn answer<B>(&self, request: Request<B>) -> HttpResponse
    where
        B: Body + Send + 'static,
        B::Data: Send,
        B::Error: fmt::Display,
    {
        if request.method() != Method::POST || !is_json(request.headers()) {
            return self.inner.handle(request).await;
        }
        let (mut parts, body) = request.into_parts();
        let collected = tokio::time::timeout(self.body_timeout, collect(body, self.limit)).await;
        let inspected = match collected {
            Ok(Collected::Whole(bytes)) => inspect(&bytes, self.limit),
            Ok(Collected::TooLarge(prefix)) => too_large(&prefix, self.limit),
            Ok(Collected::Failed(e)) => {
                return plain(
                    StatusCode::INTERNAL_SERVER_ERROR,
                    format!("Failed to read request body: {e}"),
                );
            }
            Err(_) => {
                let mut response = plain(
                    StatusCode::REQUEST_TIMEOUT,
                    format!(
                        "Request Timeout: the body did not arrive within {:?}",
                        self.body_timeout
                    ),
                );
                // The rest of the body may still be on its way: the
                // connection cannot carry another request.
                response
                    .headers_mut()
                    .insert(header::CONNECTION, HeaderValue::from_static("close"));
                return response;
            }
        };
        let answer = match inspected {
            Inspected::Forward(message) => {
                if parts.headers.contains_key(header::CONTENT_LENGTH) {
                    parts.headers.insert(header::CONTENT_LENGTH, HeaderValue::from(message.len()));
                }
                let request = Request::from_parts(parts, Full::new(Bytes::from(message)));
                return self.inner.handle(request).await;
            }
            Inspected::Answer(answer) => answer,
        };
        if let Some(refused) = self.refusal(&parts).await {
            return refused;
        }
        log(&answer);
        let status = http_status(&answer);
        let body = answer.reply.unwrap_or_else(|| answer.problem.reply(&Value::Null));
        Response::builder()
            .status(status)
            .header(header::CONTENT_TYPE, "application/json")
            .body(Full::new(Bytes::from(body)).boxed())
            .expect("a valid response")
    }

    /// rmcp's own refusal of the request's `Host` or `Origin`, if any: it
    /// checks them before it looks at the method, and answers a method it
    /// does not serve with `405` and nothing else.
    async fn refusal(&self, parts: &hyper::http::request::Parts) -> Option<HttpResponse> {
        let mut probe = Request::new(Full::<Bytes>::default());
        *probe.method_mut() = Method::PATCH;
        probe.uri_mut().clone_from(&parts.uri);
        probe.headers_mut().clone_from(&parts.headers);
        let response = self.inner.handle(probe).await;
        (response.status() != StatusCode::METHOD_NOT_ALLOWED).then_some(response)
    }
}

impl<B, S, M> tower_service::Service<Request<B>> for HttpService<S, M>
where
    B: Body + Send + 'static,
    B::Data: Send,
    B::Error: fmt::Display,
    S: ServerHandler + Send + 'static,
    M: SessionManager,
{
    type Response = HttpResponse;
    type Error = Infallible;
    type Future = Pin<Box<dyn Future<Output = Result<HttpResponse, Infallible>> + Send>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: Request<B>) -> Self::Future {
        let service = self.clone();
        Box::pin(async move { Ok(service.handle(request).await) })
    }
}

fn http_status(answer: &Answer) -> StatusCode {
    match answer.problem {
        WireError::TooLarge { .. } => StatusCode::PAYLOAD_TOO_LARGE,
        _ if answer.reply.is_none() => StatusCode::BAD_REQUEST,
        WireError::InvalidParams(_) | WireError::DuplicateArgument { .. } => StatusCode::OK,
        _ => StatusCode::BAD_REQUEST,
    }
}

fn is_json(headers: &hyper::HeaderMap) -> bool {
    headers.get(header::CONTENT_TYPE).and_then(|value| value.to_str().ok()).is_some_and(|value| {
        let essence = value.split_once(';').map_or(value, |(essence, _)| essence);
        essence.trim().eq_ignore_ascii_case("application/json")
    })
}

/// The answer past the cap on concurrent requests.
fn busy() -> HttpResponse {
    let mut response = plain(
        StatusCode::SERVICE_UNAVAILABLE,
        "Service Unavailable: too many requests at once; try again".to_owned(),
    );
    response.headers_mut().insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
    response
}

/// A response body that holds a slot of the concurrency cap until it is
/// dropped (sent in full, or abandoned with its connection).
struct Guarded {
    body: BoxBody<Bytes, Infallible>,
    _permit: tokio::sync::OwnedSemaphorePermit,
}

impl Body for Guarded {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<hyper::body::Frame<Bytes>, Infallible>>> {
        Pin::new(&mut self.body).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> hyper::body::SizeHint {
        self.body.size_hint()
    }
}

fn plain(status: StatusCode, text: String) -> HttpResponse {
    Response::builder()
        .status(status)
        .body(Full::new(Bytes::from(text)).boxed())
        .expect("a valid response")
}

enum Collected {
    Whole(Vec<u8>),
    /// The body is over the limit: its first `limit` bytes (the rest is not
    /// read).
    TooLarge(Vec<u8>),
    Failed(String),
}

async fn collect<B>(body: B, limit: usize) -> Collected
where
    B: Body,
    B::Error: fmt::Display,
{
    let mut body = std::pin::pin!(body);
    let mut bytes = Vec::new();
    while let Some(frame) = body.frame().await {
        let frame = match frame {
            Ok(frame) => frame,
            Err(e) => return Collected::Failed(e.to_string()),
        };
        let Ok(mut data) = frame.into_data() else { continue };
        let room = limit - bytes.len();
        let over = data.remaining() > room;
        while data.has_remaining() && bytes.len() < limit {
            let chunk = data.chunk();
            let take = chunk.len().min(limit - bytes.len());
            bytes.extend_from_slice(&chunk[..take]);
            data.advance(take);
        }
        if over {
            return Collected::TooLarge(bytes);
        }
    }
    Collected::Whole(bytes)
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use rmcp::model::{
        CallToolRequestParams, CallToolResponse, CallToolResult, ServerCapabilities, ServerConfig,
    };
    use rmcp::service::RequestContext;
    use rmcp::transport::streamable_http_server::StreamableHttpServerConfig;
    use rmcp::{ErrorData, RoleServer};
    use tokio::io::{AsyncBufReadExt as _, AsyncWriteExt as _};

    use super::*;
    use crate::mcp::McpServer;
    use crate::toolset::ToolSet;

    const LIMIT: usize = 1 << 16;

    /// The reply of an answered message, parsed; panics on anything else.
    fn reply(inspected: &Inspected) -> Value {
        match inspected {
            Inspected::Answer(Answer { reply: Some(reply), .. }) => {
                serde_json::from_slice(reply).expect("a reply is JSON")
            }
            other => panic!("expected a reply, got {other:?}"),
        }
    }

    /// The code and id of an error reply.
    fn error(line: &str) -> (i64, Value) {
        let reply = reply(&inspect(line.as_bytes(), LIMIT));
        assert_eq!(reply["jsonrpc"], "2.0", "{reply}");
        let code = reply["error"]["code"].as_i64().unwrap_or_else(|| panic!("an error: {reply}"));
        (code, reply["id"].clone())
    }

    fn message(line: &str) -> String {
        let reply = reply(&inspect(line.as_bytes(), LIMIT));
        reply["error"]["message"].as_str().expect("a message").to_owned()
    }

    fn dropped(line: &[u8]) -> bool {
        matches!(inspect(line, LIMIT), Inspected::Answer(Answer { reply: None, .. }))
    }

    fn forwarded(line: &[u8]) -> Value {
        match inspect(line, LIMIT) {
            Inspected::Forward(bytes) => serde_json::from_slice(&bytes).expect("forwarded JSON"),
            other => panic!("expected to forward {}, got {other:?}", String::from_utf8_lossy(line)),
        }
    }

    fn nested(depth: usize) -> String {
        format!("{}{}", "[".repeat(depth), "]".repeat(depth))
    }

    #[test]
    fn what_is_not_json_is_a_parse_error_with_a_null_id() {
        for line in [
            &b"garbage"[..],
            b"{\"jsonrpc\":\"2.0\",\"id\":1,",
            b"{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"ping\"} trailing",
            b"\xff\xfe{}",
            b"{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"p\xffng\"}",
            b"",
            b"  \r\n",
        ] {
            let inspected = inspect(line, LIMIT);
            let reply = reply(&inspected);
            assert_eq!(
                reply["error"]["code"],
                -32700,
                "{}: {reply}",
                String::from_utf8_lossy(line)
            );
            assert_eq!(reply["id"], Value::Null);
            assert!(reply["error"]["message"].as_str().unwrap().starts_with("Parse error: "));
        }
    }

    #[test]
    fn what_is_not_json_rpc_2_is_an_invalid_request_with_its_id() {
        let table: &[(&str, Value)] = &[
            (r#"{"jsonrpc":"1.0","id":3,"method":"ping"}"#, json!(3)),
            (r#"{"id":"a","method":"ping"}"#, json!("a")),
            (r#"{"jsonrpc":2.0,"id":4,"method":"ping"}"#, json!(4)),
            (r#"{"jsonrpc":"2.0","id":5}"#, json!(5)),
            (r#"{"jsonrpc":"2.0","id":6,"method":7}"#, json!(6)),
            (r#"{"jsonrpc":"2.0","id":7,"method":"ping","params":"x"}"#, json!(7)),
            (r#"{"jsonrpc":"2.0","id":8,"method":"ping","result":{}}"#, json!(8)),
            (r#"{"jsonrpc":"2.0","id":1.0,"method":"ping","params":1}"#, json!(1.0)),
            // An id that cannot be one is answered as unreadable.
            (r#"{"jsonrpc":"2.0","id":{"a":1},"method":"ping"}"#, Value::Null),
            (r#"{"jsonrpc":"2.0","id":null,"method":"ping"}"#, Value::Null),
            (r#"{"jsonrpc":"2.0","id":1.5,"method":"ping"}"#, Value::Null),
            (r#"{"jsonrpc":"2.0","id":true,"method":"ping"}"#, Value::Null),
            // Not an object at all.
            (r#"[{"jsonrpc":"2.0","id":1,"method":"ping"}]"#, Value::Null),
            ("[]", Value::Null),
            ("42", Value::Null),
            ("null", Value::Null),
            (r#""ping""#, Value::Null),
            (r#"{}"#, Value::Null),
            // JSON-RPC's own example: no id, but no string method either.
            (r#"{"jsonrpc":"2.0","method":1,"params":"bar"}"#, Value::Null),
        ];
        for (line, id) in table {
            assert_eq!(error(line), (-32600, id.clone()), "{line}");
        }
        assert_eq!(
            message(r#"{"jsonrpc":"1.0","id":3,"method":"ping"}"#),
            r#"Invalid request: `jsonrpc` must be "2.0", not "1.0""#
        );
        assert_eq!(
            message(r#"{"id":3,"method":"ping"}"#),
            r#"Invalid request: `jsonrpc` is missing: it must be "2.0""#
        );
        assert_eq!(message(r#"{"jsonrpc":"2.0","id":5}"#), "Invalid request: `method` is missing");
        assert!(message("[]").contains("batch"));
    }

    #[test]
    fn malformed_notifications_and_responses_are_dropped() {
        for line in [
            r#"{"jsonrpc":"1.0","method":"notifications/initialized"}"#,
            r#"{"method":"notifications/initialized"}"#,
            r#"{"jsonrpc":"2.0","method":"notifications/cancelled","params":"x"}"#,
            r#"{"jsonrpc":"1.0","id":1,"result":{}}"#,
            r#"{"jsonrpc":"2.0","id":[1],"result":{}}"#,
            r#"{"jsonrpc":"2.0","method":"notifications/initialized","a":1,"a":2}"#,
            r#"{"jsonrpc":"2.0","id":1,"result":{"a":1,"a":2}}"#,
        ] {
            assert!(dropped(line.as_bytes()), "{line}: {:?}", inspect(line.as_bytes(), LIMIT));
        }
    }

    #[test]
    fn good_messages_are_forwarded_as_they_came() {
        for line in [
            r#"{"jsonrpc":"2.0","id":1,"method":"ping"}"#,
            r#"{"jsonrpc":"2.0","id":"x","method":"tools/list","params":{}}"#,
            r#"{"jsonrpc":"2.0","method":"notifications/initialized"}"#,
            r#"{"jsonrpc":"2.0","id":1,"result":{}}"#,
            r#"{"jsonrpc":"2.0","id":1,"error":{"code":-1,"message":"no"}}"#,
            r#"{"jsonrpc":"2.0","id":2,"method":"tools/call","params":{"name":"t","arguments":{"n":1.5e300,"big":18446744073709551615}}}"#,
            // rmcp answers an unknown method itself (-32601), with the id.
            r#"{"jsonrpc":"2.0","id":3,"method":"no/such/method","params":{"x":1}}"#,
        ] {
            assert_eq!(
                inspect(line.as_bytes(), LIMIT),
                Inspected::Forward(line.as_bytes().to_vec())
            );
        }
    }

    #[test]
    fn line_endings_and_a_byte_order_mark_are_stripped() {
        let ping = br#"{"jsonrpc":"2.0","id":1,"method":"ping"}"#;
        for line in [
            [&ping[..], b"\n"].concat(),
            [&ping[..], b"\r\n"].concat(),
            [&b"\xEF\xBB\xBF"[..], ping, b"\r\n"].concat(),
        ] {
            assert_eq!(inspect(&line, LIMIT), Inspected::Forward(ping.to_vec()));
        }
    }

    #[test]
    fn nesting_deeper_than_serde_json_reads_is_refused_with_the_id() {
        // 127 levels in all (the message, `params`, then 125 arrays) pass.
        let deepest = format!(
            r#"{{"jsonrpc":"2.0","id":4,"method":"tools/call","params":{{"name":"t","arguments":{{"a":{}}}}}}}"#,
            nested(MAX_DEPTH - 3)
        );
        assert!(matches!(inspect(deepest.as_bytes(), LIMIT), Inspected::Forward(_)));
        let deeper = format!(
            r#"{{"jsonrpc":"2.0","id":4,"method":"tools/call","params":{{"name":"t","arguments":{{"a":{}}}}}}}"#,
            nested(MAX_DEPTH - 2)
        );
        let refused = reply(&inspect(deeper.as_bytes(), LIMIT));
        assert_eq!(refused["id"], 4);
        assert_eq!(refused["error"]["code"], -32600);
        assert_eq!(refused["error"]["data"], json!({ "maxDepth": 127 }));
        assert!(refused["error"]["message"].as_str().unwrap().contains("127 levels"), "{refused}");
        for depth in [128, 129, 100_000] {
            assert_eq!(error(&nested(depth)), (-32600, Value::Null), "{depth}");
        }
        // A notification cannot be told from a request whose id comes later.
        let notification = format!(r#"{{"jsonrpc":"2.0","method":"x","params":{}}}"#, nested(200));
        assert_eq!(error(&notification), (-32600, Value::Null));
        // A response is never answered.
        let response = format!(r#"{{"jsonrpc":"2.0","id":9,"result":{}}}"#, nested(200));
        assert!(dropped(response.as_bytes()));
    }

    #[test]
    fn a_message_over_the_limit_is_refused_with_the_id_its_start_shows() {
        let limit = 64;
        let sized = |len: usize, id: &str| {
            let head = format!(r#"{{"jsonrpc":"2.0","id":{id},"method":"ping","params":{{"p":""#);
            let padding = "x".repeat(len - head.len() - 3);
            let line = format!("{head}{padding}\"}}}}");
            assert_eq!(line.len(), len);
            line
        };
        let at = sized(limit, "1");
        assert!(matches!(inspect(at.as_bytes(), limit), Inspected::Forward(_)));
        assert!(matches!(inspect(format!("{at}\r\n").as_bytes(), limit), Inspected::Forward(_)));
        let over = reply(&inspect(sized(limit + 1, "\"r-1\"").as_bytes(), limit));
        assert_eq!(over["id"], "r-1");
        assert_eq!(over["error"]["code"], -32600);
        assert_eq!(over["error"]["data"], json!({ "maxBytes": 64 }));
        assert_eq!(
            over["error"]["message"],
            "Invalid request: the message is longer than the limit of 64 bytes"
        );
        // The reader hands over only the start of a longer line.
        let start = br#"{"jsonrpc":"2.0","id":12,"method":"tools/call","params":{"name":"t","argu"#;
        assert_eq!(reply(&too_large(start, limit))["id"], 12);
        assert_eq!(reply(&too_large(br#"{"jsonrpc":"2.0","params":{"#, limit))["id"], Value::Null);
        assert_eq!(reply(&too_large(b"\x00garbage", limit))["id"], Value::Null);
        let Inspected::Answer(answer) = too_large(br#"{"jsonrpc":"2.0","id":3,"result":{"#, limit)
        else {
            panic!("refused")
        };
        assert_eq!(answer, Answer { problem: WireError::TooLarge { limit }, reply: None });
    }

    #[test]
    fn an_idempotency_key_is_copied_into_meta() {
        let line = r#"{"jsonrpc":"2.0","id":5,"method":"tools/call","params":{"name":"pay","arguments":{"amount":3},"idempotencyKey":"order-7","_meta":{"progressToken":1}}}"#;
        let rewritten = forwarded(line.as_bytes());
        assert_eq!(
            rewritten["params"]["_meta"],
            json!({ "progressToken": 1, IDEMPOTENCY_KEY_META: "order-7" })
        );
        assert_eq!(rewritten["params"]["arguments"], json!({ "amount": 3 }));
        assert_eq!(rewritten["id"], 5);

        // Without `_meta`, or with `_meta: null`, one is made.
        for meta in ["", r#","_meta":null"#] {
            let line = format!(
                r#"{{"jsonrpc":"2.0","id":5,"method":"tools/call","params":{{"name":"pay","idempotencyKey":"k"{meta}}}}}"#
            );
            assert_eq!(
                forwarded(line.as_bytes())["params"]["_meta"],
                json!({ IDEMPOTENCY_KEY_META: "k" })
            );
        }
        // The same key in both places is no conflict: as it came.
        let both = format!(
            r#"{{"jsonrpc":"2.0","id":5,"method":"tools/call","params":{{"name":"pay","idempotencyKey":"k","_meta":{{"{IDEMPOTENCY_KEY_META}":"k"}}}}}}"#
        );
        assert_eq!(inspect(both.as_bytes(), LIMIT), Inspected::Forward(both.into_bytes()));
        // 255 bytes is the longest key.
        let longest = format!(
            r#"{{"jsonrpc":"2.0","id":5,"method":"tools/call","params":{{"name":"pay","idempotencyKey":"{}"}}}}"#,
            "k".repeat(MAX_IDEMPOTENCY_KEY_BYTES)
        );
        assert!(matches!(inspect(longest.as_bytes(), LIMIT), Inspected::Forward(_)));
        // Other methods are none of the wire's business.
        let other =
            r#"{"jsonrpc":"2.0","id":5,"method":"tools/list","params":{"idempotencyKey":7}}"#;
        assert_eq!(inspect(other.as_bytes(), LIMIT), Inspected::Forward(other.as_bytes().to_vec()));
    }

    #[test]
    fn a_bad_idempotency_key_or_tools_call_is_invalid_params_with_the_id() {
        let call = |params: &str| {
            format!(r#"{{"jsonrpc":"2.0","id":"c-1","method":"tools/call","params":{params}}}"#)
        };
        let long = format!(r#"{{"name":"pay","idempotencyKey":"{}"}}"#, "k".repeat(256));
        let conflict = format!(
            r#"{{"name":"pay","idempotencyKey":"a","_meta":{{"{IDEMPOTENCY_KEY_META}":"b"}}}}"#
        );
        let not_a_string = format!(
            r#"{{"name":"pay","idempotencyKey":"a","_meta":{{"{IDEMPOTENCY_KEY_META}":1}}}}"#
        );
        let table: &[(&str, &str)] = &[
            (r#"{"name":"pay","idempotencyKey":""}"#, "`params.idempotencyKey` must not be empty"),
            (
                r#"{"name":"pay","idempotencyKey":7}"#,
                "`params.idempotencyKey` must be a non-empty string, not a number",
            ),
            (
                r#"{"name":"pay","idempotencyKey":null}"#,
                "`params.idempotencyKey` must be a non-empty string, not null",
            ),
            (&long, "`params.idempotencyKey` is 256 bytes long, over the limit of 255"),
            (
                &conflict,
                r#"`params.idempotencyKey` ("a") and `params._meta["verified-tools/idempotency_key"]` ("b") disagree"#,
            ),
            (
                &not_a_string,
                r#"`params.idempotencyKey` ("a") and `params._meta["verified-tools/idempotency_key"]` (1) disagree"#,
            ),
            (
                r#"{"name":"pay","idempotencyKey":"a","_meta":[]}"#,
                "`params._meta` must be an object, not an array",
            ),
            (r#"{"arguments":{}}"#, "`params.name` (the tool's name) is missing"),
            (r#"{"name":3}"#, "`params.name` must be the tool's name, a string, not a number"),
            (
                r#"{"name":"pay","arguments":"{\"a\":1}"}"#,
                "`params.arguments` must be an object, not a string",
            ),
            ("[]", "`params` of `tools/call` must be an object with the tool's `name`"),
        ];
        for (params, why) in table {
            let line = call(params);
            assert_eq!(error(&line), (-32602, json!("c-1")), "{line}");
            assert_eq!(message(&line), format!("Invalid params: {why}"));
        }
        let missing = r#"{"jsonrpc":"2.0","id":2,"method":"tools/call"}"#;
        assert_eq!(error(missing), (-32602, json!(2)));
    }

    #[test]
    fn what_rmcp_cannot_read_is_answered_with_the_id() {
        // Params rmcp's own types refuse: it would answer with an id of null.
        for line in [
            r#"{"jsonrpc":"2.0","id":9,"method":"tools/list","params":[1]}"#,
            r#"{"jsonrpc":"2.0","id":9,"method":"ping","params":{"_meta":5}}"#,
        ] {
            assert_eq!(error(line), (-32602, json!(9)), "{line}");
            assert!(message(line).starts_with("Invalid params: the params of "), "{line}");
        }
    }

    #[test]
    fn a_duplicate_argument_is_a_tool_result_the_model_can_correct() {
        let line = r#"{"jsonrpc":"2.0","id":7,"method":"tools/call","params":{"name":"pay","arguments":{"amount":1,"to":"bob","amount":2}}}"#;
        let inspected = inspect(line.as_bytes(), LIMIT);
        let Inspected::Answer(Answer { problem, .. }) = &inspected else { panic!("answered") };
        assert_eq!(
            problem,
            &WireError::DuplicateArgument { tool: "pay".into(), field: "amount".into() }
        );
        let outcome = serde_json::to_value(ToolOutcome::invalid_arguments(&ArgsError::new(
            "pay",
            "field `amount` is given twice",
        )))
        .unwrap();
        assert_eq!(
            reply(&inspected),
            json!({
                "jsonrpc": "2.0",
                "id": 7,
                "result": {
                    "content": [{ "type": "text", "text": outcome.to_string() }],
                    "structuredContent": outcome,
                    "isError": true,
                },
            })
        );
        assert_eq!(outcome["status"], "invalid_arguments");
        // rmcp's client reads it as a tool result.
        let result: CallToolResult =
            serde_json::from_value(reply(&inspected)["result"].clone()).unwrap();
        assert_eq!(result.is_error, Some(true));

        let deep = r#"{"jsonrpc":"2.0","id":8,"method":"tools/call","params":{"name":"pay","arguments":{"to":{"address":{"city":"A","city":"B"}},"items":[{"sku":1,"sku":2}]}}}"#;
        let text =
            reply(&inspect(deep.as_bytes(), LIMIT))["result"]["structuredContent"]["error"].clone();
        assert_eq!(text, "field `to.address.city` is given twice");
        let items = r#"{"jsonrpc":"2.0","id":8,"method":"tools/call","params":{"name":"pay","arguments":{"items":[{"sku":1},{"sku":1,"sku":2}]}}}"#;
        let text = reply(&inspect(items.as_bytes(), LIMIT))["result"]["structuredContent"]["error"]
            .clone();
        assert_eq!(text, "field `items[1].sku` is given twice");
    }

    #[test]
    fn a_duplicate_key_elsewhere_is_an_invalid_request_naming_its_path() {
        let table: &[(&str, Value, &str)] = &[
            (
                r#"{"jsonrpc":"2.0","id":1,"method":"ping","method":"tools/list"}"#,
                json!(1),
                "method",
            ),
            (r#"{"jsonrpc":"2.0","id":1,"id":2,"method":"ping"}"#, Value::Null, "id"),
            (
                r#"{"jsonrpc":"2.0","id":3,"method":"tools/call","params":{"name":"a","name":"b"}}"#,
                json!(3),
                "params.name",
            ),
            (
                r#"{"jsonrpc":"2.0","id":3,"method":"tools/call","params":{"name":"a","arguments":{},"arguments":{}}}"#,
                json!(3),
                "params.arguments",
            ),
            (
                r#"{"jsonrpc":"2.0","id":3,"method":"tools/call","params":{"name":"a","_meta":{"k":1,"k":2}}}"#,
                json!(3),
                "params._meta.k",
            ),
            (
                r#"{"jsonrpc":"2.0","id":3,"method":"tools/call","params":{"name":"a","_meta":{"verified-tools/x":1,"verified-tools/x":2}}}"#,
                json!(3),
                r#"params._meta["verified-tools/x"]"#,
            ),
            (
                r#"{"jsonrpc":"2.0","id":4,"method":"x/y","params":{"arguments":{"a":1,"a":2}}}"#,
                json!(4),
                "params.arguments.a",
            ),
            (
                r#"{"jsonrpc":"2.0","id":5,"method":"ping","params":{"l":[0,{"":1,"":2}]}}"#,
                json!(5),
                r#"params.l[1][""]"#,
            ),
        ];
        for (line, id, path) in table {
            let reply = reply(&inspect(line.as_bytes(), LIMIT));
            assert_eq!(
                (reply["error"]["code"].as_i64(), &reply["id"]),
                (Some(-32600), id),
                "{line}"
            );
            assert_eq!(reply["error"]["data"], json!({ "path": path }), "{line}");
            assert_eq!(
                reply["error"]["message"],
                format!("Invalid request: the key `{path}` is given twice")
            );
        }
        // The envelope is checked first.
        assert_eq!(error(r#"{"jsonrpc":"1.0","id":1,"method":"ping","method":"x"}"#).0, -32600);
        assert!(
            message(r#"{"jsonrpc":"1.0","id":1,"method":"ping","method":"x"}"#).contains("jsonrpc")
        );
    }

    #[test]
    fn parse_message_builds_what_serde_json_builds() {
        let text = r#"{"a":[1,-2,3.5,1e300,18446744073709551615,-9223372036854775808,true,false,null],"b":{"c":"\u00e9\n\"","d":{}},"":[]}"#;
        assert_eq!(
            parse_message(text.as_bytes()),
            Ok(serde_json::from_str::<Value>(text).unwrap())
        );
        assert_eq!(
            parse_message(br#"{"a":{"b":[{"c":1,"c":1}]}}"#),
            Err(WireError::DuplicateKey(JsonPath(vec![
                Segment::Key("a".into()),
                Segment::Key("b".into()),
                Segment::Index(0),
                Segment::Key("c".into()),
            ])))
        );
        assert_eq!(parse_message(nested(128).as_bytes()), Err(WireError::TooDeep));
        assert!(parse_message(nested(127).as_bytes()).is_ok());
        assert!(matches!(parse_message(b"{} {}"), Err(WireError::Parse(_))));
    }

    #[cfg(feature = "tracing")]
    #[test]
    fn the_log_goes_to_stderr_unless_a_subscriber_listens() {
        assert!(!has_subscriber());
        tracing::subscriber::with_default(tracing_subscriber::registry(), || {
            assert!(has_subscriber());
        });
    }

    #[test]
    fn the_default_limit_is_rmcps_http_limit() {
        assert_eq!(
            DEFAULT_MAX_MESSAGE_BYTES,
            StreamableHttpServerConfig::default().max_request_body_bytes
        );
    }

    #[tokio::test]
    async fn the_line_reader_keeps_no_more_than_the_limit() {
        let limit = 8;
        let input: &[u8] =
            b"12345678\n12345678\r\n123456789\nthis one is far too long\nab\r\n\ntail";
        let mut reader = LineReader::new(input, limit);
        let mut lines = Vec::new();
        while let Some(line) = reader.next().await.unwrap() {
            assert!(reader.line.capacity() <= 64, "nothing long is kept");
            lines.push(match line {
                Line::Whole(line) => format!("whole {}", String::from_utf8_lossy(&line)),
                Line::TooLong(start) => {
                    assert!(start.len() <= limit + 1);
                    format!("too long {}", String::from_utf8_lossy(&start))
                }
            });
        }
        assert_eq!(
            lines,
            [
                "whole 12345678\n",
                "whole 12345678\r\n",
                "whole 123456789\n",
                "too long this one ",
                "whole ab\r\n",
                "whole \n",
                "whole tail",
            ]
        );
        // The line of 9 bytes is over a limit of 8 (only a "\r" may follow).
        assert!(matches!(
            inspect(b"123456789\n", limit),
            Inspected::Answer(Answer { problem: WireError::TooLarge { limit: 8 }, .. })
        ));
    }

    #[tokio::test]
    async fn the_line_reader_skips_a_long_line_across_reads() {
        let (mut client, server) = tokio::io::duplex(16);
        let writer = tokio::spawn(async move {
            client.write_all(&[b'x'; 1000]).await.unwrap();
            client.write_all(b"\n{}\n").await.unwrap();
        });
        let mut reader = LineReader::new(server, 32);
        assert!(
            matches!(reader.next().await.unwrap(), Some(Line::TooLong(start)) if start.len() == 33)
        );
        assert!(matches!(reader.next().await.unwrap(), Some(Line::Whole(line)) if line == b"{}\n"));
        assert!(reader.next().await.unwrap().is_none());
        writer.await.unwrap();
    }

    /// A handler whose one tool answers with the `_meta` it was given (rmcp
    /// hands it over in the context, not in the params).
    #[derive(Clone)]
    struct EchoMeta;

    impl ServerHandler for EchoMeta {
        fn get_info(&self) -> ServerConfig {
            ServerConfig::new(ServerCapabilities::builder().enable_tools().build())
        }

        async fn call_tool(
            &self,
            _request: CallToolRequestParams,
            context: RequestContext<RoleServer>,
        ) -> Result<CallToolResponse, ErrorData> {
            let meta = serde_json::to_value(&context.meta).unwrap();
            Ok(CallToolResponse::from(CallToolResult::structured(json!({ "meta": meta }))))
        }
    }

    const INITIALIZE: &str = r#"{"jsonrpc":"2.0","id":0,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"wire-test","version":"0"}}}"#;
    const INITIALIZED: &str = r#"{"jsonrpc":"2.0","method":"notifications/initialized"}"#;

    async fn next_line(
        lines: &mut tokio::io::Lines<tokio::io::BufReader<tokio::io::DuplexStream>>,
    ) -> Value {
        let line = tokio::time::timeout(Duration::from_secs(30), lines.next_line())
            .await
            .expect("an answer within 30 s")
            .expect("readable")
            .expect("a line");
        serde_json::from_str(&line).expect("JSON")
    }

    #[tokio::test]
    async fn serve_lines_delivers_the_idempotency_key_to_the_handler() {
        let (mut client, server_input) = tokio::io::duplex(1 << 16);
        let (server_output, client_output) = tokio::io::duplex(1 << 16);
        let serving = tokio::spawn(serve_lines(EchoMeta, server_input, server_output, LIMIT));
        let mut lines = tokio::io::BufReader::new(client_output).lines();
        client.write_all(format!("{INITIALIZE}\n{INITIALIZED}\n").as_bytes()).await.unwrap();
        assert_eq!(next_line(&mut lines).await["id"], 0);
        let call = r#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"echo","arguments":{},"idempotencyKey":"order-7","_meta":{"other":true}}}"#;
        client.write_all(format!("{call}\n").as_bytes()).await.unwrap();
        let answer = next_line(&mut lines).await;
        assert_eq!(answer["id"], 1, "{answer}");
        assert_eq!(
            answer["result"]["structuredContent"]["meta"],
            json!({ "other": true, IDEMPOTENCY_KEY_META: "order-7" })
        );
        drop(client);
        let reason = serving.await.unwrap().expect("served");
        assert!(matches!(reason, QuitReason::Closed), "{reason:?}");
        assert!(lines.next_line().await.unwrap().is_none(), "the output is closed");
    }

    #[tokio::test]
    async fn serve_lines_fails_when_the_input_ends_before_the_handshake() {
        let (client, server_input) = tokio::io::duplex(64);
        let (server_output, _client_output) = tokio::io::duplex(64);
        let serving = tokio::spawn(serve_lines(EchoMeta, server_input, server_output, LIMIT));
        drop(client);
        let served = tokio::time::timeout(Duration::from_secs(30), serving).await.unwrap();
        assert!(served.unwrap().is_err());
    }

    // Streamable HTTP.

    fn http(limit: usize) -> HttpService<McpServer<()>> {
        http_layer(McpServer::new(ToolSet::new(())).http_service().inner().clone(), limit)
    }

    fn post(content_type: &str, body: &str) -> Request<Full<Bytes>> {
        Request::post("http://localhost/mcp")
            .header(header::HOST, "localhost")
            .header(header::CONTENT_TYPE, content_type)
            .header(header::ACCEPT, "application/json, text/event-stream")
            .body(Full::new(Bytes::from(body.to_owned())))
            .unwrap()
    }

    fn request(body: &str) -> Request<Full<Bytes>> {
        post("application/json", body)
    }

    async fn json_of(response: HttpResponse) -> (StatusCode, Value) {
        let status = response.status();
        assert_eq!(response.headers()[header::CONTENT_TYPE], "application/json");
        let body = response.into_body().collect().await.unwrap().to_bytes();
        (status, serde_json::from_slice(&body).expect("a JSON body"))
    }

    #[tokio::test]
    async fn http_answers_what_is_not_json_rpc_with_a_json_rpc_error() {
        let service = http(LIMIT);
        let (status, body) = json_of(service.handle(request("garbage")).await).await;
        assert_eq!(
            (status, &body["error"]["code"], &body["id"]),
            (StatusCode::BAD_REQUEST, &json!(-32700), &Value::Null)
        );
        let (status, body) =
            json_of(service.handle(request(r#"{"jsonrpc":"1.0","id":3,"method":"ping"}"#)).await)
                .await;
        assert_eq!(
            (status, &body["error"]["code"], &body["id"]),
            (StatusCode::BAD_REQUEST, &json!(-32600), &json!(3))
        );
        // A notification has no id to answer; the body says why anyway.
        let (status, body) = json_of(
            service
                .handle(request(r#"{"jsonrpc":"1.0","method":"notifications/initialized"}"#))
                .await,
        )
        .await;
        assert_eq!(
            (status, &body["error"]["code"], &body["id"]),
            (StatusCode::BAD_REQUEST, &json!(-32600), &Value::Null)
        );
        // Invalid params of a request are a JSON-RPC answer, not an HTTP error.
        let conflict = format!(
            r#"{{"jsonrpc":"2.0","id":"c","method":"tools/call","params":{{"name":"t","idempotencyKey":"a","_meta":{{"{IDEMPOTENCY_KEY_META}":"b"}}}}}}"#
        );
        let (status, body) = json_of(service.handle(request(&conflict)).await).await;
        assert_eq!(
            (status, &body["error"]["code"], &body["id"]),
            (StatusCode::OK, &json!(-32602), &json!("c"))
        );
        let duplicate = r#"{"jsonrpc":"2.0","id":4,"method":"tools/call","params":{"name":"t","arguments":{"a":1,"a":2}}}"#;
        let (status, body) = json_of(service.handle(request(duplicate)).await).await;
        assert_eq!((status, &body["result"]["isError"]), (StatusCode::OK, &json!(true)));
    }

    #[tokio::test]
    async fn http_refuses_a_body_over_the_limit_with_413() {
        let service = http(64);
        let body = format!(
            r#"{{"jsonrpc":"2.0","id":5,"method":"ping","params":{{"p":"{}"}}}}"#,
            "x".repeat(100)
        );
        let (status, body) = json_of(service.handle(request(&body)).await).await;
        assert_eq!(status, StatusCode::PAYLOAD_TOO_LARGE);
        assert_eq!((&body["id"], &body["error"]["data"]), (&json!(5), &json!({ "maxBytes": 64 })));
    }

    #[tokio::test]
    async fn http_forwards_good_messages_and_leaves_the_rest_to_rmcp() {
        let service = http(LIMIT);
        let response = service.handle(request(INITIALIZE)).await;
        assert_eq!(response.status(), StatusCode::OK);
        assert!(response.headers().contains_key("mcp-session-id"), "{response:?}");
        // Not JSON, not POST: rmcp's own answers, untouched.
        let text = post("text/plain", "garbage");
        assert_eq!(service.handle(text).await.status(), StatusCode::UNSUPPORTED_MEDIA_TYPE);
        let get = Request::get("http://localhost/mcp")
            .header(header::HOST, "localhost")
            .body(Full::<Bytes>::default())
            .unwrap();
        let direct = Request::get("http://localhost/mcp")
            .header(header::HOST, "localhost")
            .body(Full::<Bytes>::default())
            .unwrap();
        assert_eq!(
            service.handle(get).await.status(),
            service.inner().handle(direct).await.status()
        );
    }

    #[tokio::test]
    async fn http_keeps_rmcps_host_check_ahead_of_its_own_answers() {
        let service = http(LIMIT);
        let mut evil = request("garbage");
        evil.headers_mut().insert(header::HOST, HeaderValue::from_static("evil.example"));
        *evil.uri_mut() = "http://evil.example/mcp".parse().unwrap();
        assert_eq!(service.handle(evil).await.status(), StatusCode::FORBIDDEN);
    }

    #[tokio::test]
    async fn http_service_is_a_tower_service() {
        let mut service = http(LIMIT);
        let response =
            tower_service::Service::call(&mut service, request("garbage")).await.unwrap();
        assert_eq!(response.status(), StatusCode::BAD_REQUEST);
    }
}
