//! JSON Schemas of tool arguments and outcomes, built with schemars for the
//! code `#[verified_tool(schema = true)]` generates (through
//! `verified_tools::__private::schema`; not public API).
//!
//! The arguments' schema is the schema of what `<tool>_json` accepts,
//! exactly: an object with one property per key-relevant parameter, named
//! as the parameter (raw identifiers unraw'ed), typed as the type the field
//! is read as (`&str` a string, `&[T]` an array), required unless the type
//! reads an absent field (`null`) as a value (an `Option`), and no other
//! properties. Subschemas are inlined (models read inline schemas best);
//! only recursive types keep a `$defs` entry.
//!
//! Every schema is made portable ([`portable`]) before it is listed: no
//! `format` that JSON Schema does not define (schemars writes `uint64`,
//! `int32`, `double`... for Rust's numbers; the bounds they stand for stay
//! as `minimum`/`maximum`), and a nullable value written as `anyOf: [{..},
//! {"type": "null"}]` rather than as a `type` array, which clients that map
//! schemas onto a single-`type` dialect (Gemini's OpenAPI subset) reject.
//! `anyOf` rather than leaving the property out of `required`: serde writes
//! `None` as `null`, so an outcome's `null` must validate, and a tool reads
//! an argument's `null` as absent, so the schema may as well say so; absent
//! and `null` are different contracts, and the wire has both.

use std::marker::PhantomData;

use schemars::generate::{SchemaGenerator, SchemaSettings};
use schemars::{JsonSchema, Schema};
use serde_json::{Map, Value, json};

use super::outcome::Status;
use crate::UnknownReason;

pub use schemars;

/// A JSON Schema object.
pub type JsonObject = Map<String, Value>;

/// The generator of argument schemas: draft 2020-12 (MCP's dialect),
/// subschemas inline, no `$schema` keyword (OpenAI and Anthropic take the
/// schema as a bare object).
pub fn generator() -> SchemaGenerator {
    SchemaSettings::draft2020_12()
        .with(|s| {
            s.meta_schema = None;
            s.inline_subschemas = true;
        })
        .into_generator()
}

/// One property of the arguments object.
#[derive(Debug)]
pub struct Property {
    name: &'static str,
    schema: Schema,
    required: bool,
}

/// The property `name`, typed `T` (the type the field is read as).
pub fn property<T: JsonSchema + ?Sized>(
    generator: &mut SchemaGenerator,
    name: &'static str,
    description: Option<&'static str>,
    required: bool,
) -> Property {
    let mut schema = generator.subschema_for::<T>();
    if let Some(description) = description {
        schema.insert("description".to_owned(), description.into());
    }
    Property { name, schema, required }
}

/// Whether `T` reads `null` (the value of an absent field in `<tool>_json`)
/// as a value: then the field is not required. (The generated code asks
/// `__private::NullProbe`; this is its twin for the tests below.)
#[cfg(test)]
fn accepts_null<T: serde::Deserialize<'static>>() -> bool {
    static NULL: Value = Value::Null;
    T::deserialize(&NULL).is_ok()
}

/// The arguments object of these properties.
pub fn object(mut generator: SchemaGenerator, properties: Vec<Property>) -> JsonObject {
    let mut props = Map::new();
    let mut required = Vec::new();
    for p in properties {
        if p.required {
            required.push(Value::from(p.name));
        }
        props.insert(p.name.to_owned(), p.schema.to_value());
    }
    let mut object = Map::new();
    object.insert("type".to_owned(), "object".into());
    object.insert("properties".to_owned(), Value::Object(props));
    object.insert("required".to_owned(), Value::Array(required));
    object.insert("additionalProperties".to_owned(), false.into());
    let defs = generator.take_definitions(true);
    if !defs.is_empty() {
        object.insert("$defs".to_owned(), Value::Object(defs));
    }
    let mut object = Value::Object(object);
    portable(&mut object);
    match object {
        Value::Object(map) => map,
        _ => unreachable!("built as an object"),
    }
}

/// The formats JSON Schema (draft 2020-12, §7.3) defines: any other is
/// unknown to a validator, which may refuse the schema for it.
const STANDARD_FORMATS: [&str; 19] = [
    "date-time",
    "date",
    "time",
    "duration",
    "email",
    "idn-email",
    "hostname",
    "idn-hostname",
    "ipv4",
    "ipv6",
    "uri",
    "uri-reference",
    "iri",
    "iri-reference",
    "uuid",
    "uri-template",
    "json-pointer",
    "relative-json-pointer",
    "regex",
];

/// The keywords of a schema that annotate rather than validate: they stay
/// on a nullable schema's outside when its type is split into `anyOf`.
const ANNOTATIONS: [&str; 8] = [
    "title",
    "description",
    "default",
    "examples",
    "deprecated",
    "readOnly",
    "writeOnly",
    "$comment",
];

/// Rewrites a schema (and every schema inside it) into the portable subset
/// the module's documentation describes: formats JSON Schema does not
/// define are dropped (an unsigned integer's keeps its `minimum: 0`), and
/// a `type` array becomes `anyOf` with one `type` in each branch.
///
/// ```
/// use serde_json::json;
/// use verified_tools::toolset::schema::portable;
///
/// let mut schema = json!({
///     "type": ["integer", "null"], "format": "uint64", "minimum": 0,
///     "description": "The amount, if known."
/// });
/// portable(&mut schema);
/// assert_eq!(schema, json!({
///     "anyOf": [{"type": "integer", "minimum": 0}, {"type": "null"}],
///     "description": "The amount, if known."
/// }));
/// ```
pub fn portable(schema: &mut Value) {
    // A boolean subschema (schemars writes `true` for a `serde_json::Value`)
    // is valid JSON Schema, but clients that read a property's schema as an
    // object (the TypeScript SDK refuses the whole `tools/list`) do not
    // take it: `{}` and `{"not": {}}` say the same.
    match schema {
        Value::Bool(true) => *schema = json!({}),
        Value::Bool(false) => *schema = json!({"not": {}}),
        _ => {}
    }
    let Value::Object(map) = schema else { return };
    for key in ["properties", "patternProperties", "$defs", "definitions", "dependentSchemas"] {
        if let Some(Value::Object(schemas)) = map.get_mut(key) {
            schemas.values_mut().for_each(portable);
        }
    }
    // Where `false` is the idiom (no other properties, no other items),
    // booleans stay: every client reads them there.
    for key in
        ["additionalProperties", "additionalItems", "unevaluatedItems", "unevaluatedProperties"]
    {
        if let Some(schema @ Value::Object(_)) = map.get_mut(key) {
            portable(schema);
        }
    }
    for key in ["items", "contains", "propertyNames", "not", "if", "then", "else"] {
        match map.get_mut(key) {
            Some(Value::Array(schemas)) => schemas.iter_mut().for_each(portable),
            Some(schema @ Value::Object(_)) => portable(schema),
            _ => {}
        }
    }
    for key in ["allOf", "anyOf", "oneOf", "prefixItems"] {
        if let Some(Value::Array(schemas)) = map.get_mut(key) {
            schemas.iter_mut().for_each(portable);
        }
    }
    if let Some(Value::String(format)) = map.get("format")
        && !STANDARD_FORMATS.contains(&format.as_str())
    {
        // schemars' unsigned formats always come with `minimum: 0`; a
        // hand-written one may not, and the bound is what the format said.
        if format.starts_with("uint") && !map.contains_key("minimum") {
            map.insert("minimum".to_owned(), 0.into());
        }
        map.remove("format");
    }
    if let Some(Value::Array(types)) = map.get("type") {
        let types = types.clone();
        map.remove("type");
        let (annotations, rest): (Map<String, Value>, Map<String, Value>) =
            std::mem::take(map).into_iter().partition(|(k, _)| ANNOTATIONS.contains(&k.as_str()));
        let branches: Vec<Value> = types
            .into_iter()
            .map(|ty| {
                let mut branch = Map::new();
                let null = ty == "null";
                branch.insert("type".to_owned(), ty);
                if !null {
                    branch.extend(rest.clone());
                }
                Value::Object(branch)
            })
            .collect();
        *map = annotations;
        match <[Value; 1]>::try_from(branches) {
            // One type in an array: no need for `anyOf`.
            Ok([Value::Object(only)]) => map.extend(only),
            Ok(_) => unreachable!("branches are objects"),
            Err(branches) => {
                map.insert("anyOf".to_owned(), Value::Array(branches));
            }
        }
    }
}

/// The schema of a [`ToolOutcome`](super::ToolOutcome) whose value is a
/// `T` (what it serializes as): an MCP tool's `outputSchema`.
pub fn outcome_schema<T: JsonSchema + ?Sized>() -> JsonObject {
    let mut generator = SchemaSettings::draft2020_12()
        .with(|s| {
            s.meta_schema = None;
            s.inline_subschemas = true;
        })
        .for_serialize()
        .into_generator();
    let mut value = generator.subschema_for::<T>();
    value.insert(
        "description".to_owned(),
        "The tool's value (status `success`): its answer, or what its verifier observed.".into(),
    );
    let statuses: Vec<&str> = Status::ALL.iter().map(|s| s.as_str()).collect();
    let reasons: Vec<&str> = UNKNOWN_REASONS.iter().map(|(_, name)| *name).collect();
    let mut object = json!({
        "type": "object",
        "properties": {
            "status": {
                "type": "string",
                "enum": statuses,
                "description": "How the call ended. Anything but `success` comes with an `instruction`."
            },
            "value": value.to_value(),
            "proof": {
                "type": "string",
                "enum": ["response", "verifier", "ledger"],
                "description": "How the success was established."
            },
            "key": {
                "type": "string",
                "pattern": "^[0-9a-f]{32}$",
                "description": "The call's idempotency key, to check the effect with later."
            },
            "reason": {
                "type": "string",
                "enum": reasons,
                "description": "Why the call stayed in doubt (status `unknown` or `escalated`)."
            },
            "error": {"type": "string", "description": "What went wrong."},
            "instruction": {"type": "string", "description": "What to do next, in plain words."}
        },
        "required": ["status"]
    });
    let defs = generator.take_definitions(true);
    if !defs.is_empty()
        && let Some(map) = object.as_object_mut()
    {
        map.insert("$defs".to_owned(), Value::Object(defs));
    }
    portable(&mut object);
    match object {
        Value::Object(map) => map,
        _ => unreachable!("built as an object"),
    }
}

/// Every [`UnknownReason`] with its serialized name. The exhaustive match
/// keeps the list complete: a new reason does not compile until it is here.
const UNKNOWN_REASONS: [(UnknownReason, &str); 7] = [
    (UnknownReason::RetriesExhausted, "retries_exhausted"),
    (UnknownReason::Superseded, "superseded"),
    (UnknownReason::VerifierInconclusive, "verifier_inconclusive"),
    (UnknownReason::Unsettled, "unsettled"),
    (UnknownReason::DeadlineExceeded, "deadline_exceeded"),
    (UnknownReason::LedgerUnavailable, "ledger_unavailable"),
    (UnknownReason::ValueNotRecorded, "value_not_recorded"),
];

#[allow(dead_code)]
const fn every_reason_is_listed(reason: UnknownReason) -> usize {
    match reason {
        UnknownReason::RetriesExhausted => 0,
        UnknownReason::Superseded => 1,
        UnknownReason::VerifierInconclusive => 2,
        UnknownReason::Unsettled => 3,
        UnknownReason::DeadlineExceeded => 4,
        UnknownReason::LedgerUnavailable => 5,
        UnknownReason::ValueNotRecorded => 6,
    }
}

/// A key is 32 lowercase hex digits.
impl JsonSchema for crate::IdempotencyKey {
    fn inline_schema() -> bool {
        true
    }

    fn schema_name() -> std::borrow::Cow<'static, str> {
        "IdempotencyKey".into()
    }

    fn json_schema(_: &mut SchemaGenerator) -> Schema {
        schemars::json_schema!({
            "type": "string",
            "pattern": "^[0-9a-f]{32}$",
            "description": "An idempotency key: 32 lowercase hex digits."
        })
    }
}

/// Picks the output schema of a tool whose value is a `T`: the outcome's
/// schema when `T: JsonSchema`, none otherwise, at compile time (autoref
/// specialization, as [`CodecProbe`](crate::ledger::CodecProbe) does):
/// `(&OutputProbe::<T>::new()).output_schema()` with [`WithOutputSchema`]
/// and [`WithoutOutputSchema`] in scope.
pub struct OutputProbe<T: ?Sized>(PhantomData<fn() -> PhantomData<T>>);

impl<T: ?Sized> OutputProbe<T> {
    /// A probe for `T`.
    pub const fn new() -> Self {
        Self(PhantomData)
    }
}

impl<T: ?Sized> Default for OutputProbe<T> {
    fn default() -> Self {
        Self::new()
    }
}

/// The arm of [`OutputProbe`] for a value type with a schema.
pub trait WithOutputSchema {
    /// The output schema's builder.
    fn output_schema(&self) -> Option<fn() -> JsonObject>;
}

impl<T: JsonSchema + ?Sized> WithOutputSchema for OutputProbe<T> {
    fn output_schema(&self) -> Option<fn() -> JsonObject> {
        Some(outcome_schema::<T>)
    }
}

/// The fallback arm of [`OutputProbe`].
pub trait WithoutOutputSchema {
    /// No output schema.
    fn output_schema(&self) -> Option<fn() -> JsonObject>;
}

impl<T: ?Sized> WithoutOutputSchema for &OutputProbe<T> {
    fn output_schema(&self) -> Option<fn() -> JsonObject> {
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reasons_serialize_as_listed() {
        for (i, (reason, name)) in UNKNOWN_REASONS.iter().enumerate() {
            assert_eq!(serde_json::to_value(reason).unwrap(), *name);
            assert_eq!(every_reason_is_listed(*reason), i);
        }
    }

    #[test]
    fn the_arguments_object_is_exact() {
        let mut g = generator();
        let props = vec![
            property::<u64>(&mut g, "customer", Some("The customer's id."), !accepts_null::<u64>()),
            property::<Option<&str>>(&mut g, "note", None, !accepts_null::<Option<&str>>()),
            property::<Vec<String>>(&mut g, "tags", None, !accepts_null::<Vec<String>>()),
        ];
        let schema = Value::Object(object(g, props));
        assert_eq!(
            schema,
            json!({
                "type": "object",
                "properties": {
                    "customer": {
                        "type": "integer", "minimum": 0,
                        "description": "The customer's id."
                    },
                    "note": {"anyOf": [{"type": "string"}, {"type": "null"}]},
                    "tags": {"type": "array", "items": {"type": "string"}}
                },
                "required": ["customer", "tags"],
                "additionalProperties": false
            })
        );
    }

    #[test]
    fn portable_schemas_keep_what_they_say() {
        let mut schema = json!({
            "type": "object",
            "properties": {
                "small": {"type": "integer", "format": "uint8", "minimum": 0, "maximum": 255},
                "signed": {"type": "integer", "format": "int32"},
                "when": {"type": "string", "format": "date-time"},
                "bare": {"type": "integer", "format": "uint32"},
                "tags": {"type": ["array", "null"], "items": {"type": "number", "format": "double"}},
                "maybe": {
                    "type": ["string", "null"], "enum": ["a", "b", null],
                    "description": "Either."
                },
                "one": {"type": ["boolean"]},
                "format": {"type": "string"},
                "any": true,
                "none": false
            },
            "additionalProperties": false,
            "$defs": {"Node": {"type": ["object", "null"], "properties": {}}}
        });
        portable(&mut schema);
        assert_eq!(
            schema,
            json!({
                "type": "object",
                "properties": {
                    "small": {"type": "integer", "minimum": 0, "maximum": 255},
                    "signed": {"type": "integer"},
                    "when": {"type": "string", "format": "date-time"},
                    "bare": {"type": "integer", "minimum": 0},
                    "tags": {"anyOf": [
                        {"type": "array", "items": {"type": "number"}},
                        {"type": "null"}
                    ]},
                    "maybe": {
                        "anyOf": [{"type": "string", "enum": ["a", "b", null]}, {"type": "null"}],
                        "description": "Either."
                    },
                    "one": {"type": "boolean"},
                    "format": {"type": "string"},
                    "any": {},
                    "none": {"not": {}}
                },
                "additionalProperties": false,
                "$defs": {"Node": {"anyOf": [{"type": "object", "properties": {}}, {"type": "null"}]}}
            })
        );
    }

    #[test]
    #[allow(clippy::needless_borrow)] // the borrow picks the arm
    fn an_output_schema_only_with_a_value_schema() {
        use super::{WithOutputSchema as _, WithoutOutputSchema as _};
        struct NoSchema;
        assert!((&OutputProbe::<NoSchema>::new()).output_schema().is_none());
        let schema = (&OutputProbe::<u32>::new()).output_schema().expect("u32 has a schema")();
        assert_eq!(schema["type"], "object");
        assert_eq!(schema["properties"]["value"]["type"], "integer");
        assert_eq!(schema["required"], json!(["status"]));
        assert_eq!(schema["properties"]["status"]["enum"][3], "unknown");
    }
}
