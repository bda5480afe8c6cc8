//! Which logical call an MCP `tools/call` is, through rmcp's own client
//! in-process (paused time, no faults): the id a client sends in `_meta`
//! reaches the handler (rmcp moves it into the request context) and changes
//! the key; a call without an id is keyed within its session for one
//! window; two sessions never share a call unless a business key says they
//! are the same action; the same id with other arguments is refused; a
//! replay says it was one.

use std::sync::Arc;
use std::time::Duration;

use rmcp::ServiceExt as _;
use rmcp::model::{CallToolRequestParams, RequestMetaObject};
use rmcp::service::{RoleClient, RunningService};
use serde_json::{Value, json};
use verified_tools::mcp::{IDEMPOTENCY_KEY_META, McpServer, TOOL_CALL_ID_META};
use verified_tools::sim::{FaultProfile, Op, SimConfig, SimServer};
use verified_tools::toolset::ToolSet;
use verified_tools::{Context, TokioClock};
use verified_tools_suite::llm::tool_set;
use verified_tools_suite::tools::SimClient;

type Client = RunningService<RoleClient, ()>;

/// A client of `server` over an in-process pipe (the server task runs until
/// the client closes).
async fn connect(server: McpServer<SimClient>) -> Client {
    let (server_io, client_io) = tokio::io::duplex(1 << 16);
    tokio::spawn(async move {
        if let Ok(running) = server.serve(server_io).await {
            let _ = running.waiting().await;
        }
    });
    ().serve(client_io).await.expect("the client connects")
}

fn request(name: &'static str, arguments: Value, meta: &[(&str, &str)]) -> CallToolRequestParams {
    let Value::Object(arguments) = arguments else { unreachable!("an object") };
    let mut params = CallToolRequestParams::new(name).with_arguments(arguments);
    if !meta.is_empty() {
        let meta: serde_json::Map<String, Value> =
            meta.iter().map(|(k, v)| ((*k).to_owned(), Value::from(*v))).collect();
        params.meta = Some(RequestMetaObject::from(meta));
    }
    params
}

async fn call(client: &Client, params: CallToolRequestParams) -> Value {
    let result = client.call_tool(params).await.expect("tools/call");
    result.structured_content.expect("structured")
}

/// The simulator's tools without faults, in one shared set.
fn set() -> (Arc<ToolSet<SimClient>>, verified_tools::sim::Oracle) {
    let (server, oracle) = SimServer::new(SimConfig::new(1, FaultProfile::NONE));
    // Buckets on tokio's (paused) clock, so that the test can move past one.
    let clock = Arc::new(TokioClock::starting_at(1_700_000_000_000));
    let cx = Context::new("mcp-server").with_clock(clock);
    (Arc::new(tool_set(SimClient::new(server, false)).with_context(cx)), oracle)
}

/// Whether the outcome is of a call that ran (proven by its answer, or by
/// the verifier after it: `update_invoice_row` verifies every OK answer).
fn ran(outcome: &Value) -> bool {
    outcome["status"] == "success" && outcome["proof"] != "ledger"
}

fn row(row: u64, invoice: u64) -> Value {
    json!({"row": row, "invoice_id": invoice, "amount": 1250})
}

#[tokio::test(start_paused = true)]
async fn a_tool_call_id_in_meta_is_the_identity_of_the_call() {
    let (set, oracle) = set();
    let client = connect(McpServer::shared(set.clone())).await;
    let a =
        call(&client, request("update_invoice_row", row(1, 10), &[(TOOL_CALL_ID_META, "call_A")]))
            .await;
    let b =
        call(&client, request("update_invoice_row", row(1, 10), &[(TOOL_CALL_ID_META, "call_B")]))
            .await;
    assert!(ran(&a) && ran(&b), "{a} {b}");
    assert_ne!(a["key"], b["key"], "two ids, two calls: the id reached the handler");
    let again =
        call(&client, request("update_invoice_row", row(1, 10), &[(TOOL_CALL_ID_META, "call_A")]))
            .await;
    assert_eq!((&again["proof"], &again["key"]), (&json!("ledger"), &a["key"]));
    assert!(again["instruction"].as_str().unwrap().starts_with("Replayed"), "{again}");
    // The same id with other arguments: refused, nothing written.
    let other =
        call(&client, request("update_invoice_row", row(1, 11), &[(TOOL_CALL_ID_META, "call_A")]))
            .await;
    assert_eq!(other["status"], "refused", "{other}");
    assert_eq!(set.state().calls(), 2);
    assert_eq!(oracle.truth().applied(Op::UpdateInvoiceRow, 1).applied, 2);
    client.cancel().await.expect("the client closes");
}

#[tokio::test(start_paused = true)]
async fn an_idempotency_key_is_the_identity_of_the_call() {
    let (set, _oracle) = set();
    let client = connect(McpServer::shared(set.clone())).await;
    let plain = call(&client, request("update_invoice_row", row(2, 10), &[])).await;
    let keyed =
        call(&client, request("update_invoice_row", row(2, 10), &[(IDEMPOTENCY_KEY_META, "k-1")]))
            .await;
    assert!(ran(&keyed), "a key of its own: a call of its own: {keyed}");
    assert_ne!(keyed["key"], plain["key"]);
    let again =
        call(&client, request("update_invoice_row", row(2, 10), &[(IDEMPOTENCY_KEY_META, "k-1")]))
            .await;
    assert_eq!((&again["proof"], &again["key"]), (&json!("ledger"), &keyed["key"]));
    let reused =
        call(&client, request("update_invoice_row", row(2, 99), &[(IDEMPOTENCY_KEY_META, "k-1")]))
            .await;
    assert_eq!(reused["status"], "refused", "{reused}");
    assert_eq!(set.state().calls(), 2);
    client.cancel().await.expect("the client closes");
}

#[tokio::test(start_paused = true)]
async fn a_call_without_an_id_is_the_same_call_within_its_session_s_window_only() {
    let (set, _oracle) = set();
    let client = connect(McpServer::shared(set.clone())).await;
    let first = call(&client, request("update_invoice_row", row(3, 10), &[])).await;
    assert!(ran(&first), "{first}");
    // A re-send (the client timed out, or the model asked again) within the
    // window: the same call, replayed, and said so.
    tokio::time::advance(Duration::from_secs(60)).await;
    let resent = call(&client, request("update_invoice_row", row(3, 10), &[])).await;
    assert_eq!((&resent["proof"], &resent["key"]), (&json!("ledger"), &first["key"]));
    assert!(resent["instruction"].as_str().unwrap().contains("idempotencyKey"), "{resent}");
    assert_eq!(set.state().calls(), 1);
    // Two windows later the server cannot tell a repeat from a new request:
    // a new call (what a tool without a business key means).
    tokio::time::advance(Duration::from_secs(11 * 60)).await;
    let later = call(&client, request("update_invoice_row", row(3, 10), &[])).await;
    assert!(ran(&later), "{later}");
    assert_ne!(later["key"], first["key"]);
    client.cancel().await.expect("the client closes");
}

#[tokio::test(start_paused = true)]
async fn two_sessions_share_a_call_only_when_a_business_key_says_so() {
    let (set, oracle) = set();
    let server = McpServer::shared(set.clone());
    let one = connect(server.new_session()).await;
    let two = connect(server.new_session()).await;
    // No business key, no id: each session's call is its own.
    let a = call(&one, request("update_invoice_row", row(4, 10), &[])).await;
    let b = call(&two, request("update_invoice_row", row(4, 10), &[])).await;
    assert!(ran(&a) && ran(&b), "{a} {b}");
    assert_ne!(a["key"], b["key"]);
    assert_eq!(oracle.truth().applied(Op::UpdateInvoiceRow, 4).applied, 2);
    // `create_customer` names its action by the customer: one, whoever asks.
    let created = call(&one, request("create_customer", json!({"customer": 7001}), &[])).await;
    let asked = call(
        &two,
        request("create_customer", json!({"customer": 7001}), &[(TOOL_CALL_ID_META, "call_Z")]),
    )
    .await;
    assert!(ran(&created), "{created}");
    assert_eq!((&asked["proof"], &asked["key"]), (&json!("ledger"), &created["key"]));
    assert_eq!(oracle.truth().applied(Op::CreateCustomer, 7001).applied, 1);
    one.cancel().await.expect("the client closes");
    two.cancel().await.expect("the client closes");
}

#[tokio::test(start_paused = true)]
async fn a_welcome_mail_asked_again_ten_minutes_later_is_not_sent_again() {
    // The failure an identity by time bucket gave: the same call 615 s later
    // was a new effect, a second welcome mail. `send_welcome` names its
    // action by the customer: asked again at any time, by any session.
    let (set, oracle) = set();
    let server = McpServer::shared(set.clone());
    let client = connect(server.new_session()).await;
    let customer = json!({"customer": 31});
    let created = call(&client, request("create_customer", customer.clone(), &[])).await;
    assert!(ran(&created), "{created}");
    let sent = call(&client, request("send_welcome", customer.clone(), &[])).await;
    assert!(ran(&sent), "{sent}");
    tokio::time::advance(Duration::from_secs(615)).await;
    let again =
        call(&client, request("send_welcome", customer.clone(), &[(TOOL_CALL_ID_META, "call_B")]))
            .await;
    assert_eq!((&again["proof"], &again["key"]), (&json!("ledger"), &sent["key"]), "{again}");
    let other = connect(server.new_session()).await;
    let elsewhere = call(&other, request("send_welcome", customer, &[])).await;
    assert_eq!(elsewhere["proof"], "ledger", "{elsewhere}");
    assert_eq!(oracle.truth().applied(Op::SendWelcome, 31).applied, 1, "one welcome mail");
    client.cancel().await.expect("the client closes");
    other.cancel().await.expect("the client closes");
}
