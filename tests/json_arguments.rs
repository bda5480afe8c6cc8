//! A tool call's JSON arguments as the model writes them: one text is one
//! payload (an object that names a member twice is refused, not read as its
//! last value), and a number of the wrong kind is told what is true of it
//! (serde_json reads `18446744073709551616` and `-0` as floats: neither is
//! "a number with a fraction"). Against a small fake bank; Tokio time is
//! paused.

use std::sync::Mutex;
use std::sync::atomic::{AtomicU32, Ordering};

use serde_json::{Value, json};
use verified_tools::__private::args::{JsonTextError, parse_arguments, parse_value};
use verified_tools::toolset::{Status, ToolSet};
use verified_tools::{Classify, Context, ErrorClass, Verdict, verified_tool};

/// A fake bank that records its charges and counts dispatches.
#[derive(Default)]
pub struct Bank {
    charges: Mutex<Vec<(u64, u64)>>,
    dispatches: AtomicU32,
}

impl Bank {
    fn dispatches(&self) -> u32 {
        self.dispatches.load(Ordering::SeqCst)
    }
}

#[derive(Debug, thiserror::Error)]
#[error("the card was declined")]
pub struct Declined;

impl Classify for Declined {
    fn classify(&self) -> ErrorClass {
        ErrorClass::Definitive
    }
}

/// Charges a card for an order.
#[verified_tool(
    side_effect = "irreversible",
    verify = charged,
    skip(bank),
    secret(card),
    schema = true,
    params(order = "The order's id.", amount = "In cents.", card = "The card's token.")
)]
pub async fn charge(bank: &Bank, order: u64, amount: u64, card: &str) -> Result<u64, Declined> {
    bank.dispatches.fetch_add(1, Ordering::SeqCst);
    let _ = card;
    bank.charges.lock().unwrap().push((order, amount));
    Ok(amount)
}

async fn charged(bank: &Bank, order: &u64, _amount: &u64, _card: &str) -> Verdict<u64> {
    let charges = bank.charges.lock().unwrap();
    charges.iter().find(|(o, _)| o == order).map(|&(_, amount)| amount).into()
}

/// Holds seats, moved by `shift` rows, behind a PIN.
#[verified_tool(side_effect = "low", skip(bank), secret(pin), schema = true)]
pub async fn hold(bank: &Bank, seats: u8, shift: i32, pin: u16) -> Result<u8, Declined> {
    bank.dispatches.fetch_add(1, Ordering::SeqCst);
    let _ = (shift, pin);
    Ok(seats)
}

fn tools() -> ToolSet<Bank> {
    ToolSet::new(Bank::default())
        .with_context(Context::new("json-arguments-test"))
        .with(charge_tool())
        .with(hold_tool())
}

/// The error of a call whose arguments serde_json reads from `text` (as
/// `ToolSet::call_text` does today), after checking that it was refused
/// before dispatch.
async fn refusal(set: &ToolSet<Bank>, tool: &str, text: &str) -> String {
    let arguments: Value = serde_json::from_str(text).expect("JSON");
    let outcome = set.call(tool, &arguments, "call_numbers").await;
    assert_eq!(outcome.status, Status::InvalidArguments, "{text}: {outcome:?}");
    assert_eq!(set.state().dispatches(), 0, "{text}: nothing is dispatched");
    outcome.error.expect("an error")
}

#[tokio::test(start_paused = true)]
async fn a_member_given_twice_in_call_text_is_refused_before_dispatch() {
    let set = tools();
    let text = r#"{"order":7,"amount":1,"card":"t","amount":99999}"#;
    let outcome = set.call_text("charge", text, "call_twice").await;
    assert_eq!(outcome.status, Status::InvalidArguments, "{outcome:?}");
    let error = outcome.error.expect("an error");
    assert!(error.contains("`amount`") && error.contains("twice"), "{error}");
    assert_eq!(set.state().dispatches(), 0);
    assert!(set.state().charges.lock().unwrap().is_empty());
}

#[test]
fn the_arguments_parser_refuses_a_member_given_twice_at_any_depth() {
    let error = |text: &str| parse_arguments("charge", text).expect_err(text).message;
    assert_eq!(
        error(r#"{"order":7,"amount":1,"card":"t","amount":99999}"#),
        "field `amount` is given twice"
    );
    assert_eq!(
        error(r#"{"items":[{"sku":"a"},{"sku":"b"},{"qty":2,"sku":"c","sku":"d"}]}"#),
        "field `items[2].sku` is given twice"
    );
    // One key, spelled two ways.
    assert_eq!(error(r#"{"amount":1,"\u0061mount":99999}"#), "field `amount` is given twice");
    // A secret's name is shown, never its values.
    let secret = error(r#"{"card":"tok_4242","card":"tok_9999"}"#);
    assert_eq!(secret, "field `card` is given twice");
    let error = parse_arguments("charge", r#"{"amount":1,"amount":2}"#).unwrap_err();
    assert_eq!(error.tool, "charge");
}

#[tokio::test(start_paused = true)]
async fn the_arguments_parser_reads_everything_else_as_serde_json_does() {
    let set = tools();
    let text = r#"{"order": 7, "amount": 1250, "card": "tok_visa"}"#;
    let parsed = parse_arguments("charge", text).expect("one of each");
    assert_eq!(parsed, serde_json::from_str::<Value>(text).unwrap());
    let outcome = set.call("charge", &parsed, "call_ok").await;
    assert_eq!(outcome.status, Status::Success, "{outcome:?}");
    assert_eq!(outcome.value, Some(json!(1250)));
    assert_eq!(set.state().charges.lock().unwrap().as_slice(), [(7, 1250)]);

    assert_eq!(parse_arguments("charge", "").unwrap(), json!({}));
    assert_eq!(parse_arguments("charge", " \n\t").unwrap(), json!({}));
    assert_eq!(
        parse_arguments("charge", r#"{"order": 7"#).unwrap_err().message,
        "the arguments are not valid JSON (EOF while parsing an object at line 1 column 11)"
    );
    // Not an object: for the tool to refuse, as it refuses a `Value`.
    assert_eq!(parse_arguments("charge", "[1]").unwrap(), json!([1]));
}

#[test]
fn nesting_beyond_the_parsers_limit_names_the_field() {
    let deep = "[".repeat(127) + &"]".repeat(127);
    let text = format!(r#"{{"order": 7, "meta": {deep}}}"#);
    assert_eq!(
        parse_arguments("charge", &text).unwrap_err().message,
        "field `meta`: nested deeper than 126 levels of arrays and objects"
    );
    let fits = "[".repeat(126) + &"]".repeat(126);
    assert!(parse_arguments("charge", &format!(r#"{{"meta": {fits}}}"#)).is_ok());
}

#[test]
fn an_mcp_message_says_where_the_duplicate_is() {
    let line = r#"{"jsonrpc":"2.0","id":3,"method":"tools/call","params":{"name":"charge",
        "arguments":{"order":7,"lines":[{"amount":1,"amount":99999}]}}}"#;
    let Err(JsonTextError::DuplicateKey(duplicate)) = parse_value(line) else {
        panic!("a duplicate")
    };
    assert_eq!(duplicate.path().to_string(), "params.arguments.lines[0].amount");
    assert_eq!(duplicate.key(), "amount");
    assert_eq!(duplicate.in_arguments().map(|p| p.to_string()).as_deref(), Some("lines[0].amount"));
    assert_eq!(
        duplicate.to_string(),
        "the member `params.arguments.lines[0].amount` is given twice"
    );

    let envelope = r#"{"jsonrpc":"2.0","id":3,"method":"tools/call","method":"tools/list"}"#;
    let Err(JsonTextError::DuplicateKey(duplicate)) = parse_value(envelope) else {
        panic!("a duplicate")
    };
    assert_eq!((duplicate.path().to_string(), duplicate.in_arguments()), ("method".into(), None));

    let line = r#"{"jsonrpc":"2.0","id":3,"method":"tools/call","params":{"arguments":{"a":1}}}"#;
    assert_eq!(parse_value(line).unwrap(), serde_json::from_str::<Value>(line).unwrap());
    assert!(matches!(parse_value("{"), Err(JsonTextError::NotJson(_))));
}

#[tokio::test(start_paused = true)]
async fn an_integer_beyond_64_bits_is_not_called_a_fraction() {
    let set = tools();
    assert_eq!(
        refusal(&set, "charge", r#"{"order": 7, "amount": 18446744073709551616, "card": "t"}"#)
            .await,
        "field `amount`: expected a non-negative integer no larger than 18446744073709551615, \
         got a larger integer"
    );
    assert_eq!(
        refusal(&set, "hold", r#"{"seats": 1, "shift": -1e30, "pin": 1}"#).await,
        "field `shift`: expected an integer from -2147483648 to 2147483647, got a smaller integer"
    );
    assert_eq!(
        refusal(&set, "charge", "18446744073709551616").await,
        "the arguments must be a JSON object, got an integer beyond 64 bits"
    );
}

#[tokio::test(start_paused = true)]
async fn minus_zero_is_refused_by_name() {
    let set = tools();
    assert_eq!(
        refusal(&set, "charge", r#"{"order": -0, "amount": 1, "card": "t"}"#).await,
        "field `order`: expected a non-negative integer, got -0 (write 0)"
    );
    assert_eq!(
        refusal(&set, "hold", r#"{"seats": 1, "shift": -0, "pin": 1}"#).await,
        "field `shift`: expected an integer, got -0 (write 0)"
    );
}

#[tokio::test(start_paused = true)]
async fn a_fraction_is_still_a_fraction() {
    let set = tools();
    assert_eq!(
        refusal(&set, "charge", r#"{"order": 7, "amount": 1.5, "card": "t"}"#).await,
        "field `amount`: expected a non-negative integer, got a number with a fraction"
    );
    assert_eq!(
        refusal(&set, "charge", r#"{"order": 7, "amount": 1e3, "card": "t"}"#).await,
        "field `amount`: expected a non-negative integer, got a number with a decimal point or \
         an exponent"
    );
}

#[tokio::test(start_paused = true)]
async fn an_integer_beyond_a_small_type_names_its_bound() {
    let set = tools();
    assert_eq!(
        refusal(&set, "hold", r#"{"seats": 300, "shift": 0, "pin": 1}"#).await,
        "field `seats`: expected a non-negative integer no larger than 255, got 300"
    );
    assert_eq!(
        refusal(&set, "hold", r#"{"seats": 1, "shift": 3000000000, "pin": 1}"#).await,
        "field `shift`: expected an integer from -2147483648 to 2147483647, got 3000000000"
    );
    assert_eq!(
        refusal(&set, "hold", r#"{"seats": -1, "shift": 0, "pin": 1}"#).await,
        "field `seats`: expected a non-negative integer, got -1"
    );
}

#[tokio::test(start_paused = true)]
async fn a_secret_number_is_never_quoted() {
    let set = tools();
    for pin in ["98765", "18446744073709551616", "-0", "-98765"] {
        let text = format!(r#"{{"seats": 1, "shift": 0, "pin": {pin}}}"#);
        assert_eq!(
            refusal(&set, "hold", &text).await,
            "secret field `pin`: expected a non-negative integer (the value given is not shown)",
            "{pin}"
        );
    }
    assert_eq!(
        refusal(&set, "hold", r#"{"seats": 1, "shift": 0, "pin": 98.765}"#).await,
        "secret field `pin`: expected a non-negative integer, got a number with a fraction"
    );
}
