//! Reading one message: what can be wrong with it, said with where in the
//! message it is, and the parse that finds it. Apart from the decision so
//! that the decision reads as rules over these few types.

use std::cell::RefCell;
use std::fmt;

use serde::de::{self, IgnoredAny, MapAccess, Visitor};
use serde_json::{Value, json};

use super::{MAX_DEPTH, to_bytes};
use crate::toolset::args::{self, JsonTextError, Step};

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
pub(super) struct Partial {
    pub(super) id: Option<Value>,
    pub(super) method: bool,
    pub(super) response: bool,
}

pub(super) fn scan_top(bytes: &[u8]) -> Partial {
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
