//! The one parser of JSON texts that carry tool calls: serde_json keeps
//! the last of two members of the same name, so `{"amount": 1, "amount":
//! 99999}` would be audited as one payload by whoever reads the first and
//! executed as another. These refuse any object that names a member twice.

use std::fmt;
use std::str::FromStr;
use std::sync::OnceLock;

use serde::de::{self, DeserializeSeed, MapAccess, SeqAccess, Visitor};
use serde_json::{Map, Number, Value};

use crate::ArgsError;

/// The deepest nesting of arrays and objects serde_json's parser reads in
/// a JSON text, the outermost value's own level included: a text nested
/// one level deeper is refused ([`JsonTextError::TooDeep`]). One less than
/// [`MAX_DEPTH`](super::MAX_DEPTH): serde_json refuses the container that would be its 128th
/// level.
pub const TEXT_DEPTH: usize = 127;

/// Parses the arguments text of a tool call (OpenAI's
/// `function.arguments`), as [`parse_value`] does.
///
/// - An empty (or whitespace) text is no arguments: `{}`.
/// - Text that is not JSON, with serde_json's message: `{"id": 7` reads
///   "the arguments are not valid JSON (EOF while parsing an object at
///   line 1 column 8)".
/// - An object, at any depth, that names a member twice: "field `amount`
///   is given twice", "field `items[2].sku` is given twice" (the path of
///   the member, as [`JsonPath`] writes it). serde_json would keep the
///   last value, so the arguments the model's text shows and the ones the
///   tool runs with could differ.
/// - Nesting beyond what serde_json reads ([`TEXT_DEPTH`] levels, the
///   arguments object included): "field `meta`: nested deeper than 126
///   levels of arrays and objects", counted, as [`check_depth`](super::check_depth) counts,
///   from the field's own value.
///
/// A value that is not an object is returned as it is: the tool refuses
/// it ([`not_an_object`](super::not_an_object)).
pub fn parse_arguments(tool: &'static str, text: &str) -> Result<Value, ArgsError> {
    if text.trim().is_empty() {
        return Ok(Value::Object(Map::new()));
    }
    parse_value(text).map_err(|error| match error {
        JsonTextError::NotJson(e) => {
            ArgsError::new(tool, format!("the arguments are not valid JSON ({e})"))
        }
        JsonTextError::DuplicateKey(duplicate) => duplicate_field(tool, duplicate.path()),
        JsonTextError::TooDeep { path } => match path.steps().first() {
            Some(Step::Key(field)) => ArgsError::new(
                tool,
                format!(
                    "field `{}`: nested deeper than {} levels of arrays and objects",
                    JsonPath(vec![Step::Key(field.clone())]),
                    TEXT_DEPTH - 1
                ),
            ),
            _ => ArgsError::new(
                tool,
                format!(
                    "the arguments are nested deeper than {TEXT_DEPTH} levels of arrays and objects"
                ),
            ),
        },
    })
}

/// A member of the arguments is given twice: "field `items[2].sku` is
/// given twice". `path` is the member's path from the arguments object.
pub fn duplicate_field(tool: &'static str, path: &JsonPath) -> ArgsError {
    ArgsError::new(tool, format!("field `{path}` is given twice"))
}

/// Parses a JSON text into a `Value`, refusing any object, at any depth,
/// that names a member twice — serde_json alone keeps the last value.
///
/// One pass of serde_json's parser: the `Value` is built by a visitor that
/// checks each key against the object it is building, so nothing is parsed
/// twice and nothing recurses deeper than serde_json's own limit. Keys are
/// compared after unescaping (`"amount"` and `"am\u006funt"` are the same
/// member). The first duplicate in the text's order is the one reported.
///
/// Otherwise the result is what `serde_json::from_str::<Value>` gives,
/// except that serde_json's private keys are plain keys:
/// `{"$serde_json::private::RawValue": "99999"}` stays that object (with
/// serde_json's `raw_value` feature, `from_str::<Value>` would read the
/// string as JSON and return `99999`). When serde_json is built with
/// `arbitrary_precision` (by any crate in the build), its parser hands each
/// number over as an object with the one member
/// `$serde_json::private::Number`, and such an object is a number, as it is
/// for serde_json's own `Value`.
///
/// Errors: [`JsonTextError::NotJson`] (serde_json's error, with line and
/// column; trailing characters included), [`JsonTextError::DuplicateKey`]
/// (with the member's [`JsonPath`] from the root, and
/// [`DuplicateKey::in_arguments`] for the path below an MCP request's
/// `params.arguments`), [`JsonTextError::TooDeep`] (more than
/// [`TEXT_DEPTH`] levels of arrays and objects).
///
/// ```
/// use verified_tools::__private::args::{parse_value, JsonTextError};
///
/// let line = r#"{"jsonrpc":"2.0","id":1,"method":"tools/call",
///     "params":{"name":"charge","arguments":{"amount":1,"amount":99999}}}"#;
/// let Err(JsonTextError::DuplicateKey(duplicate)) = parse_value(line) else { panic!() };
/// assert_eq!(duplicate.path().to_string(), "params.arguments.amount");
/// assert_eq!(duplicate.in_arguments().unwrap().to_string(), "amount");
/// ```
pub fn parse_value(text: &str) -> Result<Value, JsonTextError> {
    let mut reader = Reader {
        path: Vec::new(),
        failed_at: None,
        duplicate: None,
        numbers_as_maps: numbers_as_maps(),
    };
    let mut de = serde_json::Deserializer::from_str(text);
    let parsed = ValueSeed { reader: &mut reader }.deserialize(&mut de).and_then(|value| {
        de.end()?;
        Ok(value)
    });
    parsed.map_err(|e| reader.refusal(e))
}

/// Why [`parse_value`] refused a JSON text.
#[derive(Debug, thiserror::Error)]
pub enum JsonTextError {
    /// The text is not JSON: serde_json's error, with its line and column.
    #[error("not valid JSON ({0})")]
    NotJson(serde_json::Error),
    /// An object names a member twice.
    #[error(transparent)]
    DuplicateKey(DuplicateKey),
    /// Arrays and objects nest deeper than serde_json's parser reads
    /// ([`TEXT_DEPTH`] levels, the outermost value included).
    #[error("nested deeper than {TEXT_DEPTH} levels of arrays and objects, at `{path}`")]
    TooDeep {
        /// The value that would have been one level too many.
        path: JsonPath,
    },
}

/// An object of a JSON text names a member twice ([`parse_value`]).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("the member `{path}` is given twice")]
pub struct DuplicateKey {
    path: JsonPath,
}

impl DuplicateKey {
    /// The member given twice, from the root of the text: its last step is
    /// the key (`params.arguments.items[2].sku`).
    pub fn path(&self) -> &JsonPath {
        &self.path
    }

    /// The key given twice, unescaped.
    pub fn key(&self) -> &str {
        match self.path.steps().last() {
            Some(Step::Key(key)) => key,
            _ => "",
        }
    }

    /// The member's path below `params.arguments` when it is inside a tool
    /// call's arguments (an MCP `tools/call` request): `amount` for
    /// `params.arguments.amount`. Read from the path alone, whatever the
    /// message's `method`. `None` anywhere else: `params.arguments` itself
    /// given twice, `params.name` twice, the envelope's members (`id`
    /// twice), and any member of a JSON-RPC batch (a top-level array, which
    /// MCP no longer allows).
    pub fn in_arguments(&self) -> Option<JsonPath> {
        self.path.below(&["params", "arguments"])
    }
}

/// One step into a JSON value.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Step {
    /// The member of an object with this key (unescaped).
    Key(String),
    /// The element of an array at this index, from 0.
    Index(usize),
}

/// Where a value is in a JSON text: the steps from the root.
///
/// Written as `items[2].sku`; a key that is not made of letters, digits,
/// `_` and `-` alone is written as a JSON string in brackets (`["a.b"]`,
/// `meta[""]`), so that every path reads one way. The root is the empty
/// path, written as nothing.
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash)]
pub struct JsonPath(Vec<Step>);

impl JsonPath {
    /// A path of these steps.
    pub fn new(steps: Vec<Step>) -> Self {
        Self(steps)
    }

    /// The steps, from the root.
    pub fn steps(&self) -> &[Step] {
        &self.0
    }

    /// The rest of the path below the members `keys`, from the root: `None`
    /// unless the path starts with them and goes further.
    pub fn below(&self, keys: &[&str]) -> Option<JsonPath> {
        let starts = self.0.len() > keys.len()
            && self.0.iter().zip(keys).all(|(step, key)| matches!(step, Step::Key(k) if k == key));
        starts.then(|| JsonPath(self.0[keys.len()..].to_vec()))
    }
}

impl fmt::Display for JsonPath {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, step) in self.0.iter().enumerate() {
            match step {
                Step::Index(index) => write!(f, "[{index}]")?,
                Step::Key(key) if is_plain(key) => {
                    if i > 0 {
                        f.write_str(".")?;
                    }
                    f.write_str(key)?;
                }
                Step::Key(key) => {
                    let quoted = serde_json::to_string(key).map_err(|_| fmt::Error)?;
                    write!(f, "[{quoted}]")?;
                }
            }
        }
        Ok(())
    }
}

/// Whether a key reads unambiguously after a `.`.
fn is_plain(key: &str) -> bool {
    !key.is_empty() && key.chars().all(|c| c.is_alphanumeric() || c == '_' || c == '-')
}

// The private key under which serde_json's parser hands a number to a
// visitor when it is built with `arbitrary_precision`: one constant with
// the payload hasher's.
use crate::key::number::TOKEN as NUMBER_TOKEN;

/// Whether serde_json is built with `arbitrary_precision`. A feature of a
/// dependency cannot be tested with `cfg`, and any crate in the build may
/// turn it on; serde_json's own `Value` tells.
fn numbers_as_maps() -> bool {
    static ON: OnceLock<bool> = OnceLock::new();
    *ON.get_or_init(|| {
        let probe = format!(r#"{{"{NUMBER_TOKEN}":"1"}}"#);
        serde_json::from_str::<Value>(&probe).is_ok_and(|v| v.is_number())
    })
}

/// What the visitors share while one text is parsed.
struct Reader {
    /// The path of the value being read.
    path: Vec<Step>,
    /// Where the first error surfaced: the innermost value that failed.
    failed_at: Option<Vec<Step>>,
    /// The first member given twice. serde_json's errors carry only a
    /// message, so the typed refusal travels here.
    duplicate: Option<Vec<Step>>,
    /// See [`numbers_as_maps`].
    numbers_as_maps: bool,
}

impl Reader {
    /// Notes where an error surfaced, the first time.
    fn failed(&mut self) {
        if self.failed_at.is_none() {
            self.failed_at = Some(self.path.clone());
        }
    }

    /// The refusal that `error`, returned by serde_json, stands for.
    fn refusal(self, error: serde_json::Error) -> JsonTextError {
        if let Some(path) = self.duplicate {
            return JsonTextError::DuplicateKey(DuplicateKey { path: JsonPath(path) });
        }
        // serde_json's error codes are private: its message is the only sign.
        if error.is_syntax() && error.to_string().starts_with("recursion limit exceeded") {
            return JsonTextError::TooDeep { path: JsonPath(self.failed_at.unwrap_or_default()) };
        }
        JsonTextError::NotJson(error)
    }
}

/// Reads one JSON value (and, as its own visitor, builds it).
struct ValueSeed<'r> {
    reader: &'r mut Reader,
}

impl<'de> DeserializeSeed<'de> for ValueSeed<'_> {
    type Value = Value;

    fn deserialize<D: de::Deserializer<'de>>(self, deserializer: D) -> Result<Value, D::Error> {
        deserializer.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for ValueSeed<'_> {
    type Value = Value;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("any JSON value")
    }

    fn visit_bool<E>(self, v: bool) -> Result<Value, E> {
        Ok(Value::Bool(v))
    }

    fn visit_i64<E>(self, v: i64) -> Result<Value, E> {
        Ok(Value::Number(v.into()))
    }

    fn visit_u64<E>(self, v: u64) -> Result<Value, E> {
        Ok(Value::Number(v.into()))
    }

    fn visit_f64<E>(self, v: f64) -> Result<Value, E> {
        // As serde_json's `Value`: JSON text has no infinities to reach here.
        Ok(Number::from_f64(v).map_or(Value::Null, Value::Number))
    }

    fn visit_str<E>(self, v: &str) -> Result<Value, E> {
        Ok(Value::String(v.to_owned()))
    }

    fn visit_string<E>(self, v: String) -> Result<Value, E> {
        Ok(Value::String(v))
    }

    fn visit_unit<E>(self) -> Result<Value, E> {
        Ok(Value::Null)
    }

    fn visit_none<E>(self) -> Result<Value, E> {
        Ok(Value::Null)
    }

    fn visit_some<D: de::Deserializer<'de>>(self, deserializer: D) -> Result<Value, D::Error> {
        self.deserialize(deserializer)
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Value, A::Error> {
        let mut items = Vec::new();
        loop {
            self.reader.path.push(Step::Index(items.len()));
            let item = seq.next_element_seed(ValueSeed { reader: &mut *self.reader });
            match item {
                Ok(Some(item)) => items.push(item),
                Ok(None) => break,
                Err(e) => {
                    self.reader.failed();
                    return Err(e);
                }
            }
            self.reader.path.pop();
        }
        self.reader.path.pop();
        Ok(Value::Array(items))
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Value, A::Error> {
        let mut object = Map::new();
        while let Some(key) = map.next_key::<String>()? {
            if object.is_empty() && self.reader.numbers_as_maps && key == NUMBER_TOKEN {
                let text: String = map.next_value()?;
                return Number::from_str(&text).map(Value::Number).map_err(de::Error::custom);
            }
            if object.contains_key(&key) {
                let mut path = self.reader.path.clone();
                path.push(Step::Key(key));
                self.reader.duplicate = Some(path);
                return Err(de::Error::custom("a member is given twice"));
            }
            // Moved into the path and back: each key is copied out of the
            // text once, as serde_json's own `Value` copies it.
            self.reader.path.push(Step::Key(key));
            let value = match map.next_value_seed(ValueSeed { reader: &mut *self.reader }) {
                Ok(value) => value,
                Err(e) => {
                    self.reader.failed();
                    return Err(e);
                }
            };
            let Some(Step::Key(key)) = self.reader.path.pop() else {
                unreachable!("the key pushed above");
            };
            object.insert(key, value);
        }
        Ok(Value::Object(object))
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn refused(text: &str) -> JsonTextError {
        parse_value(text).expect_err("refused")
    }

    fn duplicate_in(text: &str) -> DuplicateKey {
        match refused(text) {
            JsonTextError::DuplicateKey(duplicate) => duplicate,
            other => panic!("{text}: {other:?}"),
        }
    }

    #[test]
    fn parsing_builds_what_serde_json_builds() {
        let text = r#"{"a": [1, -2, 2.5, 18446744073709551615, -0, 1e3, "x\u00e9", true, null, {}],
                       "b": {"c": {"d": []}}, "": 0}"#;
        assert_eq!(parse_value(text).unwrap(), serde_json::from_str::<Value>(text).unwrap());
        assert_eq!(parse_value(" 7 ").unwrap(), json!(7));
    }

    #[test]
    fn a_member_given_twice_is_refused_at_any_depth() {
        let top = duplicate_in(r#"{"order":7,"amount":1,"card":"t","amount":99999}"#);
        assert_eq!((top.path().to_string(), top.key()), ("amount".to_owned(), "amount"));
        let nested =
            duplicate_in(r#"{"items":[{"sku":"a"},{"sku":"b"},{"sku":"c","qty":1,"sku":"d"}]}"#);
        assert_eq!(nested.path().to_string(), "items[2].sku");
        assert_eq!(
            nested.path().steps(),
            [Step::Key("items".into()), Step::Index(2), Step::Key("sku".into())]
        );
        let in_array = duplicate_in(r#"[[0, {"a": {"b": 1, "b": 1}}]]"#);
        assert_eq!(in_array.path().to_string(), "[0][1].a.b");
        // The same value twice is still two members.
        assert_eq!(duplicate_in(r#"{"x": null, "x": null}"#).key(), "x");
        // The first duplicate in the text's order.
        assert_eq!(duplicate_in(r#"{"a": 1, "b": 2, "b": 3, "a": 4}"#).key(), "b");
    }

    #[test]
    fn keys_are_compared_unescaped() {
        let duplicate = duplicate_in(r#"{"amount": 1, "am\u006funt": 99999}"#);
        assert_eq!(duplicate.key(), "amount");
    }

    #[test]
    fn odd_keys_are_written_quoted_in_paths() {
        let path = duplicate_in(r#"{"a.b": {"": {"x y": 1, "x y": 2}}}"#).path().clone();
        assert_eq!(path.to_string(), r#"["a.b"][""]["x y"]"#);
        assert_eq!(
            duplicate_in(r#"{"user-id_2": 1, "user-id_2": 1}"#).to_string(),
            "the member `user-id_2` is given twice"
        );
    }

    #[test]
    fn an_mcp_request_says_whether_the_duplicate_is_in_the_arguments() {
        let request = |params: &str| {
            format!(r#"{{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{params}}}"#)
        };
        let inside = duplicate_in(&request(r#"{"name":"charge","arguments":{"a":{"b":1,"b":2}}}"#));
        assert_eq!(inside.path().to_string(), "params.arguments.a.b");
        assert_eq!(inside.in_arguments().map(|p| p.to_string()).as_deref(), Some("a.b"));
        let arguments_twice =
            duplicate_in(&request(r#"{"name":"charge","arguments":{},"arguments":{"a":1}}"#));
        assert_eq!(arguments_twice.path().to_string(), "params.arguments");
        assert_eq!(arguments_twice.in_arguments(), None);
        let name_twice = duplicate_in(&request(r#"{"name":"a","name":"b","arguments":{}}"#));
        assert_eq!(name_twice.in_arguments(), None);
        let envelope = duplicate_in(r#"{"id":1,"id":2,"params":{}}"#);
        assert_eq!((envelope.path().to_string(), envelope.in_arguments()), ("id".to_owned(), None));
    }

    #[test]
    fn serde_jsons_private_keys_are_plain_keys() {
        // With the `raw_value` feature (on in this crate), serde_json's own
        // `Value` reads this object as the number in the string.
        let text = r#"{"amount": {"$serde_json::private::RawValue": "99999"}}"#;
        assert_eq!(serde_json::from_str::<Value>(text).unwrap()["amount"], 99999);
        let value = parse_value(text).unwrap();
        assert_eq!(value["amount"]["$serde_json::private::RawValue"], "99999");
        let text = r#"{"amount": {"$serde_json::private::Number": "99999"}}"#;
        assert!(!numbers_as_maps(), "serde_json is built without arbitrary_precision here");
        assert!(parse_value(text).unwrap()["amount"].is_object());
    }

    #[test]
    fn numbers_handed_over_as_maps_are_numbers() {
        // What serde_json's parser does with `arbitrary_precision`, which no
        // crate of this workspace turns on.
        let mut reader =
            Reader { path: Vec::new(), failed_at: None, duplicate: None, numbers_as_maps: true };
        let text = r#"[{"$serde_json::private::Number": "12"}, {"a": {"$serde_json::private::Number": "1.5"}}]"#;
        let mut de = serde_json::Deserializer::from_str(text);
        let value = ValueSeed { reader: &mut reader }.deserialize(&mut de).unwrap();
        assert_eq!(value, json!([12, {"a": 1.5}]));
    }

    #[test]
    fn text_that_is_not_json_keeps_serdes_message() {
        let JsonTextError::NotJson(e) = refused(r#"{"id": 7"#) else { panic!() };
        assert_eq!(e.to_string(), "EOF while parsing an object at line 1 column 8");
        let JsonTextError::NotJson(e) = refused(r#"{"id": 7} x"#) else { panic!() };
        assert_eq!(e.to_string(), "trailing characters at line 1 column 11");
        assert!(matches!(refused(""), JsonTextError::NotJson(_)));
    }

    #[test]
    fn the_text_depth_is_serde_jsons() {
        let deep = |levels: usize| "[".repeat(levels) + &"]".repeat(levels);
        for text in [deep(TEXT_DEPTH), format!(r#"{{"a":{}}}"#, deep(TEXT_DEPTH - 1))] {
            assert!(serde_json::from_str::<Value>(&text).is_ok());
            assert!(parse_value(&text).is_ok());
        }
        for text in [deep(TEXT_DEPTH + 1), format!(r#"{{"a":{}}}"#, deep(TEXT_DEPTH))] {
            assert!(serde_json::from_str::<Value>(&text).is_err());
            assert!(matches!(refused(&text), JsonTextError::TooDeep { .. }), "{text}");
        }
        let JsonTextError::TooDeep { path } =
            refused(&format!(r#"{{"a":[{{"b":{}}}]}}"#, deep(200)))
        else {
            panic!()
        };
        assert_eq!(
            path.steps()[..3],
            [Step::Key("a".into()), Step::Index(0), Step::Key("b".into())]
        );
        assert_eq!(path.steps().len(), TEXT_DEPTH);
    }

    #[test]
    fn arguments_text_errors_are_worded_for_the_model() {
        assert_eq!(parse_arguments("t", " \n").unwrap(), json!({}));
        assert_eq!(parse_arguments("t", r#"{"a":[1]}"#).unwrap(), json!({"a": [1]}));
        let error = |text: &str| parse_arguments("t", text).unwrap_err().message;
        assert_eq!(
            error(r#"{"order":7,"amount":1,"card":"t","amount":99999}"#),
            "field `amount` is given twice"
        );
        assert_eq!(
            error(r#"{"items":[{},{},{"sku":"a","sku":"b"}]}"#),
            "field `items[2].sku` is given twice"
        );
        assert_eq!(
            error(r#"{"id": 7"#),
            "the arguments are not valid JSON (EOF while parsing an object at line 1 column 8)"
        );
        let deep = "[".repeat(TEXT_DEPTH) + &"]".repeat(TEXT_DEPTH);
        assert_eq!(
            error(&format!(r#"{{"ok": 1, "meta": {deep}}}"#)),
            "field `meta`: nested deeper than 126 levels of arrays and objects"
        );
        assert_eq!(
            error(&format!("[{deep}]")),
            "the arguments are nested deeper than 127 levels of arrays and objects"
        );
    }
}
