//! What a host sees of a long `tools/call`, through rmcp's own client
//! in-process (tokio time paused): `notifications/progress` in plain words
//! while the engine waits (an attempt timed out and the verifier is read,
//! the settle margin, another request holding the key), increasing, and
//! none after the answer; and `notifications/cancelled` as the engine's
//! cancellation: an attempt already out is seen to its end, nothing new is
//! sent after the cancel, the key is left in doubt, and the re-send of the
//! same call checks before it sends.

use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rmcp::model::{
    CallToolRequest, CallToolRequestParams, ClientRequest, ProgressNotificationParam,
    ProgressToken, RequestMetaObject, ServerResult,
};
use rmcp::service::{NotificationContext, PeerRequestOptions, RequestHandle, RunningService};
use rmcp::{ClientHandler, RoleClient, ServiceExt as _};
use serde_json::{Value, json};
use tokio::io::{AsyncBufReadExt as _, AsyncWriteExt as _, BufReader};
use tokio::sync::Notify;
use verified_tools::audit::MemoryAudit;
use verified_tools::ledger::{Ledger, MemoryLedger, RecordState};
use verified_tools::mcp::{McpServer, TOOL_CALL_ID_META, serve_lines};
use verified_tools::toolset::{Status, ToolSet};
use verified_tools::{Classify, Context, ErrorClass, Verdict, verified_tool};

/// How the bank treats the first attempt that reaches it.
#[derive(Clone, Copy)]
enum First {
    /// It never answers and never applies (lost on the way in).
    Lost,
    /// It waits for [`Bank::release`], then applies and answers.
    Held,
}

/// A payment service whose first request is slow or lost.
struct Bank {
    first: First,
    /// Requests that reached the bank.
    attempts: AtomicU32,
    /// While set, the verifier cannot read the bank.
    blind: AtomicBool,
    charged: Mutex<Vec<u64>>,
    arrived: Notify,
    release: Notify,
}

impl Bank {
    fn new(first: First) -> Self {
        Self {
            first,
            attempts: AtomicU32::new(0),
            blind: AtomicBool::new(false),
            charged: Mutex::default(),
            arrived: Notify::new(),
            release: Notify::new(),
        }
    }

    fn attempts(&self) -> u32 {
        self.attempts.load(Ordering::SeqCst)
    }

    fn charges(&self) -> usize {
        self.charged.lock().unwrap().len()
    }
}

#[derive(Debug)]
pub struct Unreachable;

impl std::fmt::Display for Unreachable {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("the bank is unreachable")
    }
}

impl std::error::Error for Unreachable {}

impl Classify for Unreachable {
    fn classify(&self) -> ErrorClass {
        ErrorClass::Ambiguous
    }
}

/// Charges an order.
#[verified_tool(side_effect = "high", verify = charged, skip(bank), timeout = "5s",
                settle = "1s", schema = true)]
async fn charge(bank: &Bank, order: u64) -> Result<u64, Unreachable> {
    let n = bank.attempts.fetch_add(1, Ordering::SeqCst) + 1;
    bank.arrived.notify_one();
    if n == 1 {
        match bank.first {
            First::Lost => std::future::pending::<()>().await,
            First::Held => bank.release.notified().await,
        }
    }
    bank.charged.lock().unwrap().push(order);
    Ok(order)
}

/// Is the order charged?
async fn charged(bank: &Bank, order: &u64) -> Verdict<u64> {
    if bank.blind.load(Ordering::SeqCst) {
        return Verdict::Unknown;
    }
    bank.charged.lock().unwrap().contains(order).then_some(*order).into()
}

/// The progress notifications a client received, by token.
#[derive(Clone, Default)]
struct Watcher {
    seen: Arc<Mutex<Vec<ProgressNotificationParam>>>,
    arrived: Arc<Notify>,
}

impl Watcher {
    fn of(&self, token: &ProgressToken) -> Vec<(f64, String)> {
        let seen = self.seen.lock().unwrap();
        let of = seen.iter().filter(|p| &p.progress_token == token);
        of.map(|p| (p.progress, p.message.clone().unwrap_or_default())).collect()
    }

    /// Waits until a notification of `token` says `words` (a minute of
    /// paused time: a failure, not a hang, when it never does).
    async fn until(&self, token: &ProgressToken, words: &str) {
        let said = async {
            loop {
                let arrived = self.arrived.notified();
                if self.of(token).iter().any(|(_, m)| m.contains(words)) {
                    return;
                }
                arrived.await;
            }
        };
        if tokio::time::timeout(Duration::from_secs(60), said).await.is_err() {
            panic!("never said {words:?}: {:?}", self.of(token));
        }
    }
}

impl ClientHandler for Watcher {
    async fn on_progress(
        &self,
        params: ProgressNotificationParam,
        _context: NotificationContext<RoleClient>,
    ) {
        self.seen.lock().unwrap().push(params);
        self.arrived.notify_waiters();
    }
}

type Client = RunningService<RoleClient, Watcher>;

struct Fixture {
    bank: Arc<ToolSet<Bank>>,
    ledger: Arc<MemoryLedger>,
    audit: Arc<MemoryAudit>,
    client: Client,
    watcher: Watcher,
}

async fn fixture(first: First) -> Fixture {
    let ledger = Arc::new(MemoryLedger::new());
    let audit = Arc::new(MemoryAudit::new());
    let cx = Context::new("mcp-server").with_ledger(ledger.clone()).with_audit(audit.clone());
    let set = ToolSet::new(Bank::new(first)).with(charge_tool()).with_checks(8);
    let bank = Arc::new(set.with_context(cx));
    let server = McpServer::shared(Arc::clone(&bank));
    let (server_io, client_io) = tokio::io::duplex(1 << 16);
    tokio::spawn(async move {
        if let Ok(running) = server.serve(server_io).await {
            let _ = running.waiting().await;
        }
    });
    let watcher = Watcher::default();
    let client = watcher.clone().serve(client_io).await.expect("the client connects");
    Fixture { bank, ledger, audit, client, watcher }
}

/// `charge {order}` as tool call `id`, sent (rmcp gives it a progress token).
async fn send(client: &Client, order: u64, id: &str) -> RequestHandle<RoleClient> {
    let Value::Object(arguments) = json!({"order": order}) else { unreachable!() };
    let mut params = CallToolRequestParams::new("charge").with_arguments(arguments);
    let meta: serde_json::Map<String, Value> =
        [(TOOL_CALL_ID_META.to_owned(), json!(id))].into_iter().collect();
    params.meta = Some(RequestMetaObject::from(meta));
    let request = ClientRequest::CallToolRequest(CallToolRequest::new(params));
    client.send_cancellable_request(request, PeerRequestOptions::no_options()).await.expect("sent")
}

async fn outcome(handle: RequestHandle<RoleClient>) -> Value {
    match handle.await_response().await.expect("an answer") {
        ServerResult::CallToolResult(result) => result.structured_content.expect("structured"),
        other => panic!("not a tool result: {other:?}"),
    }
}

fn messages(progress: &[(f64, String)]) -> Vec<&str> {
    progress.iter().map(|(_, m)| m.as_str()).collect()
}

/// Strictly increasing, as MCP asks of `progress`.
fn increasing(progress: &[(f64, String)]) -> bool {
    progress.windows(2).all(|w| w[0].0 < w[1].0)
}

#[tokio::test(start_paused = true)]
async fn a_call_that_waits_says_why_in_progress_notifications() {
    let f = fixture(First::Lost).await;
    let handle = send(&f.client, 1, "call_1").await;
    let token = handle.progress_token.clone();
    let charged = outcome(handle).await;
    assert_eq!((&charged["status"], &charged["proof"]), (&json!("success"), &json!("verifier")));
    assert_eq!(f.bank.state().attempts(), 2);
    let progress = f.watcher.of(&token);
    let said = messages(&progress);
    let expected = [
        "attempt 1 timed out (no answer within 5000 ms); checking whether it took effect before \
         retrying",
        "attempt 1 is not visible yet; waiting for its settle margin before believing it did \
         not take effect",
        "the check shows attempt 1 did not take effect, and it can no longer",
        "retrying: attempt 2 sent",
        "the check shows attempt 2 took effect",
    ];
    assert_eq!(said, expected, "{progress:?}");
    assert!(increasing(&progress), "{progress:?}");
    // Nothing comes after the answer: a later round trip brings no more.
    f.client.list_tools(None).await.expect("tools/list");
    assert_eq!(f.watcher.of(&token).len(), expected.len());
    f.client.cancel().await.expect("the client closes");
}

#[tokio::test(start_paused = true)]
async fn a_cancel_lets_the_attempt_out_finish_and_the_re_send_gets_its_outcome() {
    // The Python SDK's way: time out, cancel, send the same call again.
    let f = fixture(First::Held).await;
    let first = send(&f.client, 2, "call_2").await;
    f.bank.state().arrived.notified().await;
    first.cancel(Some("read timeout".into())).await.expect("cancelled");
    let again = send(&f.client, 2, "call_2").await;
    let token = again.progress_token.clone();
    // The re-send waits on the key while the first attempt is out.
    f.watcher.until(&token, "in flight; waiting for its outcome").await;
    f.bank.state().release.notify_one();
    let resent = outcome(again).await;
    assert_eq!((&resent["status"], &resent["proof"]), (&json!("success"), &json!("ledger")));
    assert_eq!((f.bank.state().attempts(), f.bank.state().charges()), (1, 1), "sent once");
    f.client.cancel().await.expect("the client closes");
}

#[tokio::test(start_paused = true)]
async fn nothing_is_sent_after_a_cancel_and_the_key_is_left_in_doubt() {
    let f = fixture(First::Lost).await;
    let first = send(&f.client, 3, "call_3").await;
    f.bank.state().arrived.notified().await;
    first.cancel(None).await.expect("cancelled");
    // Left alone, the call would time out, see the charge absent once
    // settled, and retry. Cancelled, it stops where it would send attempt
    // 2, and its hold is abandoned: the record is in doubt.
    let key = f.audit.events()[0].key.expect("the call's key");
    loop {
        let record = f.ledger.record(key).await.expect("a record").expect("recorded");
        if record.state != RecordState::Held {
            assert_eq!(record.state, RecordState::InDoubt, "{record:?}");
            assert_eq!(record.progress.attempts, 1, "{record:?}");
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!((f.bank.state().attempts(), f.bank.state().charges()), (1, 0), "no retry");
    // The re-send checks first, sees the charge absent, and sends it.
    let again = send(&f.client, 3, "call_3").await;
    let token = again.progress_token.clone();
    let resent = outcome(again).await;
    assert_eq!(resent["status"], "success", "{resent}");
    assert_eq!((f.bank.state().attempts(), f.bank.state().charges()), (2, 1));
    let progress = f.watcher.of(&token);
    assert!(messages(&progress)[0].starts_with("an earlier request of this call"), "{progress:?}");
    f.client.cancel().await.expect("the client closes");
}

#[tokio::test(start_paused = true)]
async fn a_call_cancelled_with_its_attempt_out_is_checked_later_on_the_sets_ledger() {
    let f = fixture(First::Lost).await;
    f.bank.state().blind.store(true, Ordering::SeqCst);
    let first = send(&f.client, 4, "call_4").await;
    f.bank.state().arrived.notified().await;
    first.cancel(None).await.expect("cancelled");
    // The attempt out is seen to its end, the verifier cannot tell: the
    // call ends in doubt and is kept for checking.
    let kept = async {
        while f.bank.pending_checks() == 0 {
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    };
    tokio::time::timeout(Duration::from_secs(60), kept).await.expect("kept within a minute");
    f.bank.state().blind.store(false, Ordering::SeqCst);
    // The check reads the bank on the set's own ledger: the cancelled
    // request's ledger gate, closed by the cancel, is not part of it (the
    // check parked on it until its deadline, and was refused).
    let key = f.audit.events()[0].key.expect("the call's key");
    let checked = f.bank.check(key).await.expect("kept for checking");
    assert_eq!(checked.status, Status::NotApplied, "{checked:?}");
    assert_eq!((f.bank.state().attempts(), f.bank.state().charges()), (1, 0), "nothing sent");
    assert_eq!(f.bank.pending_checks(), 0, "the check settled it");
    f.client.cancel().await.expect("the client closes");
}

/// One JSON-RPC message per line, as stdio carries them.
async fn line(reader: &mut (impl tokio::io::AsyncBufRead + Unpin)) -> Value {
    let mut line = String::new();
    reader.read_line(&mut line).await.expect("a line");
    serde_json::from_str(&line).expect("JSON")
}

#[tokio::test(start_paused = true)]
async fn on_the_wire_every_progress_notification_comes_before_the_answer() {
    let ledger = Arc::new(MemoryLedger::new());
    let cx = Context::new("mcp-server").with_ledger(ledger);
    let set = ToolSet::new(Bank::new(First::Lost)).with(charge_tool()).with_context(cx);
    let (server_io, client_io) = tokio::io::duplex(1 << 16);
    let (input, output) = tokio::io::split(server_io);
    tokio::spawn(serve_lines(McpServer::new(set), input, output, 1 << 20));
    let (reader, mut writer) = tokio::io::split(client_io);
    let mut reader = BufReader::new(reader);
    let requests = [
        json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
            "protocolVersion": "2025-06-18", "capabilities": {},
            "clientInfo": {"name": "lines", "version": "1"}}}),
        json!({"jsonrpc": "2.0", "method": "notifications/initialized"}),
        json!({"jsonrpc": "2.0", "id": 2, "method": "tools/call", "params": {
            "name": "charge", "arguments": {"order": 4}, "_meta": {"progressToken": "p-4"}}}),
    ];
    for request in &requests {
        writer.write_all(format!("{request}\n").as_bytes()).await.unwrap();
    }
    assert_eq!(line(&mut reader).await["id"], 1);
    let mut progress = Vec::new();
    let answer = loop {
        let message = line(&mut reader).await;
        match message["method"].as_str() {
            Some("notifications/progress") => progress.push(message["params"].clone()),
            _ => break message,
        }
    };
    assert_eq!(answer["id"], 2, "{answer}");
    assert_eq!(answer["result"]["structuredContent"]["status"], "success", "{answer}");
    assert_eq!(progress.len(), 5, "{progress:?}");
    assert!(progress.iter().all(|p| p["progressToken"] == "p-4"), "{progress:?}");
    let values: Vec<f64> = progress.iter().map(|p| p["progress"].as_f64().unwrap()).collect();
    assert!(values.windows(2).all(|w| w[0] < w[1]), "{values:?}");
    // The next line is the ping's answer: nothing trailed the call's.
    let ping = json!({"jsonrpc": "2.0", "id": 3, "method": "ping"});
    writer.write_all(format!("{ping}\n").as_bytes()).await.unwrap();
    assert_eq!(line(&mut reader).await["id"], 3);
}
