//! `ToolSet`: verified tools listed for OpenAI, Anthropic and MCP (golden
//! JSON, reviewed by hand, in `tests/golden/`), dispatched by name with the
//! provider's tool-call id as the identity of the call, and outcomes a model
//! can read — against a small fake CRM. Tokio time is paused.
//!
//! Regenerate the goldens with `VT_BLESS=1 cargo test --test toolset` and
//! review the diff.

use std::collections::HashMap;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};

use serde_json::{Value, json};
use verified_tools::toolset::{Has, Status, ToolOutcome, ToolSet};
use verified_tools::{Classify, Context, ErrorClass, Proof, UnknownReason, Verdict, verified_tool};

/// A customer as the CRM stores it.
#[derive(Debug, Clone, PartialEq, serde::Serialize, schemars::JsonSchema)]
pub struct Customer {
    /// Its id.
    pub id: u64,
    /// Its full name.
    pub name: String,
    /// Its plan.
    pub tier: Tier,
}

/// A plan.
#[derive(
    Debug, Clone, Copy, PartialEq, serde::Serialize, serde::Deserialize, schemars::JsonSchema,
)]
#[serde(rename_all = "snake_case")]
pub enum Tier {
    /// The free plan.
    Free,
    /// The paid plan.
    Pro,
}

/// A receipt with no schema: its tool has no output schema.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Receipt(pub u64);

#[derive(Debug, thiserror::Error)]
pub enum CrmError {
    #[error("customer {0} does not exist")]
    NotFound(u64),
}

impl Classify for CrmError {
    fn classify(&self) -> ErrorClass {
        ErrorClass::Definitive
    }
}

/// A fake CRM that counts dispatches, and can lose an answer after applying
/// a write or be unreadable for its verifier.
#[derive(Default)]
pub struct Crm {
    customers: Mutex<HashMap<u64, Customer>>,
    dispatches: AtomicU32,
    lose_next_answer: AtomicBool,
    blind: AtomicBool,
}

impl Crm {
    fn dispatches(&self) -> u32 {
        self.dispatches.load(Ordering::SeqCst)
    }

    /// Looks a customer up.
    #[verified_tool(side_effect = "none", schema = true, params(id = "The customer's id."))]
    pub async fn find(&self, id: u64) -> Result<Option<Customer>, CrmError> {
        self.dispatches.fetch_add(1, Ordering::SeqCst);
        Ok(self.customers.lock().unwrap().get(&id).cloned())
    }
}

/// An outbox, the second thing a tool may skip.
#[derive(Default)]
pub struct Mailer {
    sent: Mutex<Vec<String>>,
}

/// The state of the set: both.
#[derive(Default)]
pub struct App {
    crm: Crm,
    mailer: Mailer,
}

impl Has<Crm> for App {
    fn get(app: &Self) -> &Crm {
        &app.crm
    }
}

impl Has<Mailer> for App {
    fn get(app: &Self) -> &Mailer {
        &app.mailer
    }
}

/// Creates a customer.
#[verified_tool(
    side_effect = "high",
    verify = customer_exists,
    skip(crm),
    timeout = "1s",
    schema = true,
    params(id = "The new customer's id.", name = "Their full name.", tier = "Their plan; free when absent.")
)]
pub async fn create_customer(
    crm: &Crm,
    id: u64,
    name: &str,
    tier: Option<Tier>,
) -> Result<Customer, CrmError> {
    crm.dispatches.fetch_add(1, Ordering::SeqCst);
    let customer = Customer { id, name: name.to_owned(), tier: tier.unwrap_or(Tier::Free) };
    crm.customers.lock().unwrap().insert(id, customer.clone());
    if crm.lose_next_answer.swap(false, Ordering::SeqCst) {
        // Applied; the answer never comes.
        std::future::pending::<()>().await;
    }
    Ok(customer)
}

async fn customer_exists(
    crm: &Crm,
    id: &u64,
    _name: &str,
    _tier: &Option<Tier>,
) -> Verdict<Customer> {
    if crm.blind.load(Ordering::SeqCst) {
        return Verdict::Unknown;
    }
    crm.customers.lock().unwrap().get(id).cloned().into()
}

/// Sends a note to customers.
#[verified_tool(side_effect = "low", skip(crm, mailer), secret(token), schema = true)]
pub async fn send_note(
    crm: &Crm,
    mailer: &Mailer,
    r#type: &str,
    to: &[u64],
    token: &str,
    meta: Option<Value>,
) -> Result<usize, CrmError> {
    crm.dispatches.fetch_add(1, Ordering::SeqCst);
    let _ = (token, meta);
    let mut sent = mailer.sent.lock().unwrap();
    for id in to {
        sent.push(format!("{type} to {id}"));
    }
    Ok(to.len())
}

/// Deletes a customer, for good.
#[verified_tool(side_effect = "irreversible", verify = is_deleted, skip(crm), schema = true)]
pub async fn delete_customer(crm: &Crm, id: u64) -> Result<Receipt, CrmError> {
    crm.dispatches.fetch_add(1, Ordering::SeqCst);
    match crm.customers.lock().unwrap().remove(&id) {
        Some(_) => Ok(Receipt(id)),
        None => Err(CrmError::NotFound(id)),
    }
}

async fn is_deleted(crm: &Crm, id: &u64) -> Verdict<Receipt> {
    match crm.customers.lock().unwrap().contains_key(id) {
        true => Verdict::Absent,
        false => Verdict::Holds(Receipt(*id)),
    }
}

fn tools() -> ToolSet<App> {
    ToolSet::new(App::default())
        .with_context(Context::new("toolset-test"))
        .with(create_customer_tool())
        .with(Crm::find_tool())
        .with(send_note_tool())
        .with(delete_customer_tool())
}

/// Compares with `tests/golden/<name>.json`, or writes it under `VT_BLESS=1`.
fn golden(name: &str, actual: &Value) {
    let path = format!("{}/tests/golden/{name}.json", env!("CARGO_MANIFEST_DIR"));
    let text = serde_json::to_string_pretty(actual).unwrap() + "\n";
    if std::env::var_os("VT_BLESS").is_some() {
        std::fs::create_dir_all(std::path::Path::new(&path).parent().unwrap()).unwrap();
        std::fs::write(&path, text).unwrap();
        return;
    }
    let expected = std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("{path}: {e}; write it with VT_BLESS=1 and review it"));
    let expected: Value = serde_json::from_str(&expected).unwrap();
    assert_eq!(
        actual, &expected,
        "{name} changed; if on purpose, rerun with VT_BLESS=1 and review the diff:\n{text}"
    );
}

#[test]
fn listings_match_the_goldens() {
    let set = tools();
    golden("toolset_openai", &set.openai_tools());
    golden("toolset_anthropic", &set.anthropic_tools());
    golden("toolset_mcp", &set.mcp_tools());
}

#[test]
fn the_schema_is_the_json_entry_point_s() {
    let set = tools();
    let note = set.get("send_note").expect("listed").input_schema();
    // Raw identifiers lose their `r#`; `&str` is a string, `&[u64]` an
    // array; an `Option` is not required; nothing else is accepted.
    assert_eq!(note["required"], json!(["type", "to", "token"]));
    assert_eq!(note["properties"]["type"]["type"], "string");
    assert_eq!(note["properties"]["to"]["type"], "array");
    assert_eq!(note["properties"]["to"]["items"]["type"], "integer");
    assert_eq!(note["additionalProperties"], false);
    // Skipped parameters are not arguments.
    assert!(note["properties"].get("crm").is_none() && note["properties"].get("mailer").is_none());
    let create = set.get("create_customer").expect("listed");
    let schema = create.input_schema();
    assert_eq!(schema["properties"]["tier"]["description"], "Their plan; free when absent.");
    let tier = &schema["properties"]["tier"];
    assert_eq!(tier["anyOf"][0]["oneOf"][1]["const"], "pro");
    assert_eq!(tier["anyOf"][1], json!({"type": "null"}));
    assert_eq!(create.spec().description, "Creates a customer.");
    // An output schema where the value type has one.
    let output = create.output_schema().expect("Customer has a schema");
    assert_eq!(output["properties"]["value"]["required"], json!(["id", "name", "tier"]));
    assert!(set.get("delete_customer").expect("listed").output_schema().is_none());
}

#[tokio::test(start_paused = true)]
async fn calls_dispatch_by_name_and_replay_by_tool_call_id() {
    let set = tools();
    let args = json!({"id": 7, "name": "Ada"});
    let first = set.call("create_customer", &args, "call_1").await;
    assert_eq!(first.status, Status::Success, "{first:?}");
    // A high tool's OK answer is read back: the value is the verifier's.
    assert_eq!(first.proof, Some(Proof::Verifier));
    assert_eq!(first.value, Some(json!({"id": 7, "name": "Ada", "tier": "free"})));
    assert_eq!(set.state().crm.dispatches(), 1);

    // The same tool call again: replayed from the ledger, not dispatched.
    let again = set.call("create_customer", &args, "call_1").await;
    assert_eq!(again.status, Status::Success);
    assert_eq!(again.proof, Some(Proof::Ledger));
    assert_eq!((again.key, again.value), (first.key, first.value.clone()));
    assert_eq!(set.state().crm.dispatches(), 1);

    // Another tool call with the same arguments is another logical call.
    let other = set.call("create_customer", &args, "call_2").await;
    assert_eq!(other.proof, Some(Proof::Verifier));
    assert_ne!(other.key, first.key);
    assert_eq!(set.state().crm.dispatches(), 2);

    // A method tool, and a tool that skips two parts of the state.
    let found = set.call("find", &json!({"id": 7}), "call_3").await;
    assert_eq!(found.value, Some(json!({"id": 7, "name": "Ada", "tier": "free"})));
    let note = json!({"type": "welcome", "to": [7, 8], "token": "s3cret"});
    let sent = set.call_text("send_note", &note.to_string(), "call_4").await;
    assert_eq!(sent.value, Some(json!(2)));
    assert_eq!(
        set.state().mailer.sent.lock().unwrap().as_slice(),
        ["welcome to 7", "welcome to 8"]
    );

    // A definitive error is `failed`, with the error's message.
    let gone = set.call("delete_customer", &json!({"id": 99}), "call_5").await;
    assert_eq!(gone.status, Status::Failed);
    assert_eq!(gone.error.as_deref(), Some("customer 99 does not exist"));
    assert!(gone.instruction.is_some());
}

#[tokio::test(start_paused = true)]
async fn a_lost_answer_is_in_doubt_and_a_repeat_checks_first() {
    let set = tools();
    let crm = &set.state().crm;
    crm.lose_next_answer.store(true, Ordering::SeqCst);
    crm.blind.store(true, Ordering::SeqCst);
    let args = json!({"id": 3, "name": "Grace", "tier": "pro"});
    let lost = set.call("create_customer", &args, "call_lost").await;
    assert_eq!(lost.status, Status::Unknown, "{lost:?}");
    assert_eq!(lost.reason, Some(UnknownReason::VerifierInconclusive));
    assert_eq!(lost.error.as_deref(), Some("no answer within 1s"));
    let key = lost.key.expect("a key to check with");
    let json = serde_json::to_value(&lost).unwrap();
    let instruction = json["instruction"].as_str().unwrap();
    assert!(instruction.starts_with("Do not repeat this call"), "{instruction}");
    assert!(instruction.contains(&key.to_string()), "{instruction}");
    assert!(json.get("value").is_none() && json.get("proof").is_none());
    assert_eq!(crm.dispatches(), 1);

    // The same tool call later, once the CRM can be read: verified, not
    // executed again.
    crm.blind.store(false, Ordering::SeqCst);
    let repeat = set.call("create_customer", &args, "call_lost").await;
    assert_eq!(repeat.status, Status::Success, "{repeat:?}");
    assert_eq!(repeat.proof, Some(Proof::Verifier));
    assert_eq!(repeat.key, Some(key));
    assert_eq!(crm.dispatches(), 1);
}

#[tokio::test(start_paused = true)]
async fn bad_calls_are_outcomes_the_model_can_act_on() {
    let set = tools();
    let cases: [(&str, Value, &str); 6] = [
        (
            "create_customer",
            json!({"id": "seven", "name": "Ada"}),
            "field `id`: expected a non-negative integer, got a string",
        ),
        (
            "create_customer",
            json!({"id": -7, "name": "Ada"}),
            "field `id`: expected a non-negative integer, got -7",
        ),
        ("create_customer", json!({"name": "Ada"}), "missing field `id`"),
        (
            "create_customer",
            json!({"id": 1, "name": "Ada", "tier": "gold"}),
            "field `tier`: unknown value `gold`, expected `free` or `pro`",
        ),
        (
            "create_customer",
            json!({"id": 1, "nmae": "Ada"}),
            "unknown field `nmae`; the fields are `id`, `name`, `tier`",
        ),
        ("find", json!([7]), "the arguments must be a JSON object, got an array"),
    ];
    for (tool, args, message) in cases {
        let outcome = set.call(tool, &args, "call_bad").await;
        assert_eq!(outcome.status, Status::InvalidArguments, "{args}");
        assert_eq!(outcome.error.as_deref(), Some(message), "{args}");
        assert_eq!(
            outcome.instruction.as_deref(),
            Some("Nothing was done. Correct the arguments and call the tool again.")
        );
    }
    // A secret is never quoted back.
    let secret = json!({"type": "x", "to": [], "token": 4242});
    let outcome = set.call("send_note", &secret, "call_secret").await;
    assert_eq!(
        outcome.error.as_deref(),
        Some("secret field `token`: expected a string, got an integer")
    );
    // Text that is not JSON, as a model may write it.
    let outcome = set.call_text("find", "{\"id\": 7", "call_text").await;
    assert_eq!(outcome.status, Status::InvalidArguments);
    assert!(outcome.error.unwrap().starts_with("the arguments are not valid JSON"));
    // An empty text is no arguments.
    let outcome = set.call_text("find", " ", "call_empty").await;
    assert_eq!(outcome.error.as_deref(), Some("missing field `id`"));
    // No such tool: the model learns the names.
    let outcome = set.call("create_client", &json!({}), "call_x").await;
    assert_eq!(outcome.status, Status::NoSuchTool);
    assert_eq!(outcome.error.as_deref(), Some("there is no tool named `create_client`"));
    assert_eq!(
        outcome.instruction.as_deref(),
        Some(
            "Nothing was done. The tools are: `create_customer`, `find`, `send_note`, \
             `delete_customer`."
        )
    );
    assert_eq!(set.state().crm.dispatches(), 0, "nothing was dispatched");
}

/// A `Value` nested `depth` arrays deep, built in memory (serde_json's
/// parser would stop at 128).
fn nested(depth: usize) -> Value {
    let mut value = json!(1);
    for _ in 0..depth {
        value = Value::Array(vec![value]);
    }
    value
}

/// Takes a deep value apart without recursion (dropping it would recurse).
fn dismantle(mut value: Value) {
    loop {
        value = match value {
            Value::Array(mut items) => items.pop().unwrap_or(Value::Null),
            Value::Object(mut map) => match map.keys().next().cloned() {
                Some(k) => map.remove(&k).unwrap_or(Value::Null),
                None => return,
            },
            _ => return,
        }
    }
}

#[tokio::test(start_paused = true)]
async fn hostile_nesting_is_an_argument_error_not_a_crash() {
    let set = tools();
    let mut args = json!({"type": "x", "to": [1], "token": "t"});
    args["meta"] = nested(10_000);
    let outcome = set.call("send_note", &args, "call_deep").await;
    assert_eq!(outcome.status, Status::InvalidArguments);
    assert_eq!(
        outcome.error.as_deref(),
        Some("field `meta`: nested deeper than 128 levels of arrays and objects")
    );
    // The JSON entry point itself, as the issue called it.
    let app = set.state();
    let direct = send_note_json(&Context::new("t"), &app.crm, &app.mailer, &args).await;
    let error = direct.expect_err("refused");
    assert_eq!(error.tool, "send_note");
    assert_eq!(app.crm.dispatches(), 0);
    // 128 levels are accepted, as serde_json's parser accepts them.
    args["meta"] = nested(127);
    let outcome = set.call("send_note", &args, "call_ok").await;
    assert_eq!(outcome.status, Status::Success, "{outcome:?}");
    dismantle(args);
}

#[test]
fn an_outcome_reads_back() {
    let outcome = ToolOutcome::no_such_tool("x", ["a"]);
    let text = serde_json::to_string(&outcome).unwrap();
    assert_eq!(serde_json::from_str::<ToolOutcome>(&text).unwrap(), outcome);
}
