//! An agent backend, wired whole: an HTTP tool (reqwest) against a payments
//! service that loses answers, listed in a `ToolSet` with `check_call`,
//! recorded in a SQLite ledger, audited as JSON lines and traced through
//! OpenTelemetry.
//!
//! ```text
//! cargo run --example backend --features examples           # in a fresh temp directory
//! cargo run --example backend --features examples -- DIR    # the ledger and audit in DIR (new)
//! cargo run --example ledger --features sqlite -- --ledger sqlite:DIR/ledger.db list
//! ```
//!
//! The payments service runs in-process on `127.0.0.1:0` (axum), scripted
//! to fail as real ones do: it charges and then loses the answer, it gets
//! to a request only after the client's deadline, its read side goes down.
//! It charges every request it gets to, as a service that ignores
//! idempotency keys would: what keeps an order from being charged twice is
//! verify-before-retry and the ledger. The model's tool calls are written
//! out as a model would make them (`ToolSet::call_text` with the
//! `function.arguments` text and the `tool_call_id`); put the set's
//! `openai_tools()` in a chat request and its calls there instead.

use std::collections::{HashMap, VecDeque};
use std::error::Error;
use std::io::Write;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::extract::{Path as UrlPath, State};
use axum::http::{HeaderMap, StatusCode};
use axum::routing::{get, post};
use axum::{Json, Router};
use opentelemetry::trace::{Status as SpanStatus, TracerProvider as _};
use opentelemetry::{KeyValue, Value as OtelValue};
use opentelemetry_sdk::trace::{InMemorySpanExporter, SdkTracerProvider, SpanData};
use serde::{Deserialize, Serialize};
use tokio::time::Instant;
use tracing::instrument::WithSubscriber as _;
use tracing_subscriber::layer::SubscriberExt as _;
use verified_tools::audit::JsonLinesAudit;
use verified_tools::deadline::{DeadlineExt as _, TIMEOUT_HEADER};
use verified_tools::escalation::{MemoryEscalations, Ticket};
use verified_tools::ledger::SqliteLedger;
use verified_tools::toolset::{CHECK_TOOL, ToolOutcome, ToolSet};
use verified_tools::{Context, Deadline, IdempotencyKey, Verdict, verified_tool};

// ---------------------------------------------------------------------------
// The tool: what an application writes.

/// A charge, as the payments service answers it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct Charge {
    /// The service's id of the charge.
    pub id: u64,
    /// The order charged.
    pub order: u64,
    /// The amount, in cents.
    pub cents: u64,
}

#[derive(Debug, Serialize, Deserialize)]
struct ChargeRequest {
    order: u64,
    cents: u64,
}

/// The client of the payments service: the state the tools share.
pub struct Payments {
    http: reqwest::Client,
    base: String,
}

impl Payments {
    /// A client of the service at `addr`.
    pub fn new(addr: SocketAddr) -> Self {
        Self { http: reqwest::Client::new(), base: format!("http://{addr}") }
    }
}

/// Charges an order. The order is the identity of the payment (`key(order)`):
/// asked again, by another tool call or another process, it is the same call.
#[verified_tool(
    side_effect = "irreversible",
    verify = charged,
    skip(payments),
    key(order),
    retries = 1,
    timeout = "2s",
    settle = "1s",
    schema = true,
    params(order = "The order to charge.", cents = "The amount, in cents.")
)]
pub async fn charge(
    payments: &Payments,
    order: u64,
    cents: u64,
    key: IdempotencyKey,
    deadline: Deadline,
) -> Result<Charge, reqwest::Error> {
    // `reqwest::Error` is classified by the crate (feature `reqwest`): a
    // refused connection is retried, a timeout or a 5xx goes to the verifier.
    payments
        .http
        .post(format!("{}/charges", payments.base))
        .header("Idempotency-Key", key.to_string())
        .with_deadline(deadline)
        .json(&ChargeRequest { order, cents })
        .send()
        .await?
        .error_for_status()?
        .json()
        .await
}

/// Read-only, the whole postcondition: is the order charged, for these cents?
async fn charged(
    payments: &Payments,
    order: &u64,
    cents: &u64,
) -> Result<Verdict<Charge>, reqwest::Error> {
    let url = format!("{}/charges/{order}", payments.base);
    let response = payments.http.get(url).send().await?;
    if response.status() == reqwest::StatusCode::NOT_FOUND {
        return Ok(Verdict::Absent);
    }
    // An error (the read side is down) is `Unknown`: nothing is proven.
    let charge: Charge = response.error_for_status()?.json().await?;
    // Charged for another amount is not this action, nor its absence.
    Ok(if charge.cents == *cents { Verdict::Holds(charge) } else { Verdict::Unknown })
}

// ---------------------------------------------------------------------------
// The backend: the tool set, the ledger, the audit, the tracing.

/// What a run did.
pub struct Run {
    /// Each tool call of the conversation: its id, the tool, the outcome.
    pub calls: Vec<(String, String, ToolOutcome)>,
    /// The payments service, as the run left it.
    pub service: Arc<PaymentsService>,
    /// The calls handed to a person.
    pub escalations: Vec<Ticket>,
    /// The spans OpenTelemetry exported.
    pub spans: Vec<SpanData>,
    /// The SQLite ledger's file.
    pub ledger: PathBuf,
    /// The audit trail's file, one JSON object per line.
    pub audit: PathBuf,
}

/// Starts the payments service, makes the conversation's calls and prints
/// what happened to `out`. `dir` gets the ledger and the audit trail; it
/// must hold no ledger yet: one from an earlier run remembers charges this
/// run's service (in memory) never made.
pub async fn run(dir: &Path, out: &mut impl Write) -> Result<Run, Box<dyn Error>> {
    let (ledger, audit) = (dir.join("ledger.db"), dir.join("audit.jsonl"));
    if ledger.exists() {
        return Err(format!("{} exists: give the example a new directory", ledger.display()).into());
    }
    let service = Arc::new(PaymentsService::default());
    let addr = service.start().await?;

    let sink = Arc::new(JsonLinesAudit::append(&audit)?);
    // Where irreversible calls in doubt go: a pager, a ticketing system.
    let pager = Arc::new(MemoryEscalations::new());
    let cx = Context::new("billing-agent")
        // Durable: a restarted backend, or a second one on this host,
        // verifies before it charges, and replays what is done.
        .with_ledger(Arc::new(SqliteLedger::open(&ledger)?))
        .with_audit(sink.clone())
        .with_escalation(pager.clone());
    let tools = ToolSet::new(Payments::new(addr))
        .with_context(cx)
        .with(charge_tool())
        // Lists `check_call {key}`: the model's way out of doubt.
        .with_checks(1000);

    // An application puts its OTLP exporter (of the opentelemetry 0.31
    // line) where the in-memory one is, and sets the subscriber globally.
    let exporter = InMemorySpanExporter::default();
    let provider = SdkTracerProvider::builder().with_simple_exporter(exporter.clone()).build();
    let otel = tracing_opentelemetry::layer().with_tracer(provider.tracer("billing-agent"));
    let subscriber = tracing_subscriber::registry().with(otel);

    let calls = conversation(&tools, &service, out).with_subscriber(subscriber).await?;

    provider.force_flush()?;
    let spans = exporter.get_finished_spans()?;
    sink.flush()?;
    let escalations = pager.take();
    for ticket in &escalations {
        let args = ticket.args.as_ref().map(ToString::to_string).unwrap_or_default();
        writeln!(
            out,
            "escalated to a person: {} {args}, key {}: {}",
            ticket.tool, ticket.key, ticket.cause
        )?;
    }
    report(&service, &spans, out)?;
    let events = std::fs::read_to_string(&audit)?.lines().count();
    writeln!(out, "audit: {events} events in {}", audit.display())?;
    // What an operator lists the calls in doubt with (none are left).
    let list = format!(
        "cargo run --example ledger --features sqlite -- --ledger sqlite:{} list",
        ledger.display()
    );
    writeln!(out, "ledger: {} (`{list}`)", ledger.display())?;
    Ok(Run { calls, service, escalations, spans, ledger, audit })
}

/// The model's tool calls, and what the service does with each.
async fn conversation(
    tools: &ToolSet<Payments>,
    service: &PaymentsService,
    out: &mut impl Write,
) -> Result<Vec<(String, String, ToolOutcome)>, Box<dyn Error>> {
    let mut calls = Vec::new();
    let mut ask = async |id: &str, tool: &str, arguments: &str| -> std::io::Result<ToolOutcome> {
        let outcome = tools.call_text(tool, arguments, id).await;
        let proof =
            outcome.proof.map(|p| format!(" ({})", serde_json::json!(p).as_str().unwrap_or("")));
        writeln!(
            out,
            "{id} {tool} {arguments} -> {}{}",
            outcome.status,
            proof.unwrap_or_default()
        )?;
        if let Some(instruction) = &outcome.instruction {
            writeln!(out, "    the model reads: {instruction}")?;
        }
        calls.push((id.to_owned(), tool.to_owned(), outcome.clone()));
        Ok(outcome)
    };

    ask("call_1", "charge", r#"{"order": 1001, "cents": 2500}"#).await?;
    // Charged, and the answer lost: the verifier finds the charge.
    service.script(1002, [Fate::ChargeThenLoseAnswer]);
    ask("call_2", "charge", r#"{"order": 1002, "cents": 990}"#).await?;
    // The model asks again for the same order, in a new tool call:
    // replayed from the ledger, not sent.
    ask("call_3", "charge", r#"{"order": 1002, "cents": 990}"#).await?;
    // Reached only past its deadline, so dropped uncharged: `Absent` is
    // believed once the settle margin has passed, and the retry (same key)
    // charges.
    service.script(1003, [Fate::Stall]);
    ask("call_4", "charge", r#"{"order": 1003, "cents": 4200}"#).await?;
    // The same order for another amount: refused, nothing sent.
    ask("call_5", "charge", r#"{"order": 1002, "cents": 1990}"#).await?;
    // Charged, the answer lost, and the read side down: an irreversible
    // action in doubt is escalated, with its key.
    service.script(1004, [Fate::ChargeThenLoseAnswer]);
    service.reads_down.store(true, Ordering::SeqCst);
    let doubt = ask("call_6", "charge", r#"{"order": 1004, "cents": 1500}"#).await?;
    // Later, with the read side back, the model follows the instruction.
    service.reads_down.store(false, Ordering::SeqCst);
    let key = doubt.key.ok_or("an escalated call has a key")?;
    ask("call_7", CHECK_TOOL, &format!(r#"{{"key": "{key}"}}"#)).await?;
    if tools.pending_checks() != 0 {
        return Err("a call is still in doubt".into());
    }
    Ok(calls)
}

/// What the service received and charged, and what was traced.
fn report(
    service: &PaymentsService,
    spans: &[SpanData],
    out: &mut impl Write,
) -> std::io::Result<()> {
    let requests = service.requests();
    let charges = service.charges();
    writeln!(out, "payments service: {} requests, {} charges", requests.len(), charges.len())?;
    let mut orders: Vec<u64> = requests.iter().map(|r| r.order).collect();
    orders.sort_unstable();
    orders.dedup();
    for order in orders {
        let received = requests.iter().filter(|r| r.order == order).count();
        let charged = charges.iter().filter(|c| c.order == order).count();
        let times = if charged == 1 { "once".to_owned() } else { format!("{charged} times") };
        let requests = if received == 1 { "request" } else { "requests" };
        writeln!(out, "  order {order}: charged {times}, {received} {requests}")?;
    }
    for span in spans {
        let status = match &span.status {
            SpanStatus::Ok => "OK".to_owned(),
            SpanStatus::Error { description } => format!("ERROR {description}"),
            SpanStatus::Unset => "UNSET".to_owned(),
        };
        let id = attribute(&span.attributes, "gen_ai.tool.call.id");
        writeln!(out, "span `{}` {id}: {status}", span.name)?;
    }
    Ok(())
}

fn attribute(attributes: &[KeyValue], key: &str) -> String {
    attributes.iter().find(|kv| kv.key.as_str() == key).map_or_else(String::new, |kv| {
        match &kv.value {
            OtelValue::String(s) => s.to_string(),
            other => other.to_string(),
        }
    })
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn Error>> {
    let dir = match std::env::args_os().nth(1) {
        Some(dir) => PathBuf::from(dir),
        None => std::env::temp_dir().join(format!("verified-tools-backend-{}", std::process::id())),
    };
    std::fs::create_dir_all(&dir)?;
    run(&dir, &mut std::io::stdout()).await?;
    Ok(())
}

// ---------------------------------------------------------------------------
// The payments service: elsewhere in production; here in-process, scripted.

/// What the service does with a request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fate {
    /// Charges and answers.
    Answer,
    /// Charges; the answer never comes (the client gives up at its deadline).
    ChargeThenLoseAnswer,
    /// Gets to the request only when the client's deadline
    /// (`connect-timeout-ms`) has passed, and honours it: drops it uncharged.
    Stall,
}

/// A `POST /charges` as the service received it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Received {
    /// The order.
    pub order: u64,
    /// Its `Idempotency-Key` header.
    pub key: Option<String>,
    /// Its `connect-timeout-ms` header: the time the client had left.
    pub timeout_ms: Option<u64>,
}

/// An in-memory payments service: `POST /charges`, `GET /charges/{order}`.
#[derive(Default)]
pub struct PaymentsService {
    charges: Mutex<Vec<Charge>>,
    requests: Mutex<Vec<Received>>,
    /// The fates of the next requests for an order; `Answer` past them.
    script: Mutex<HashMap<u64, VecDeque<Fate>>>,
    /// Reads fail with 503 while set.
    pub reads_down: AtomicBool,
}

impl PaymentsService {
    /// Serves on a free port of 127.0.0.1, until the runtime ends.
    pub async fn start(self: &Arc<Self>) -> std::io::Result<SocketAddr> {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        let app = Router::new()
            .route("/charges", post(create_charge))
            .route("/charges/{order}", get(find_charge))
            .with_state(Arc::clone(self));
        tokio::spawn(async move { axum::serve(listener, app).await });
        Ok(addr)
    }

    /// Sets the fates of the next requests for `order`.
    pub fn script(&self, order: u64, fates: impl IntoIterator<Item = Fate>) {
        self.script.lock().unwrap().entry(order).or_default().extend(fates);
    }

    /// Every charge made, in order.
    pub fn charges(&self) -> Vec<Charge> {
        self.charges.lock().unwrap().clone()
    }

    /// Every `POST` received, in order.
    pub fn requests(&self) -> Vec<Received> {
        self.requests.lock().unwrap().clone()
    }

    fn charge(&self, request: &ChargeRequest) -> Charge {
        let mut charges = self.charges.lock().unwrap();
        let charge =
            Charge { id: charges.len() as u64 + 1, order: request.order, cents: request.cents };
        charges.push(charge.clone());
        charge
    }
}

async fn create_charge(
    State(service): State<Arc<PaymentsService>>,
    headers: HeaderMap,
    Json(request): Json<ChargeRequest>,
) -> Result<Json<Charge>, StatusCode> {
    let header = |name: &str| headers.get(name).and_then(|v| v.to_str().ok());
    let timeout_ms = header(TIMEOUT_HEADER).and_then(|ms| ms.parse().ok());
    // The client's deadline, on this clock: the time it said it had left.
    let deadline = timeout_ms.map(|ms| Instant::now() + Duration::from_millis(ms));
    let key = header("idempotency-key").map(str::to_owned);
    service.requests.lock().unwrap().push(Received { order: request.order, key, timeout_ms });
    let fate = service.script.lock().unwrap().get_mut(&request.order).and_then(VecDeque::pop_front);
    match fate.unwrap_or(Fate::Answer) {
        Fate::Answer => Ok(Json(service.charge(&request))),
        Fate::ChargeThenLoseAnswer => {
            service.charge(&request);
            std::future::pending().await
        }
        Fate::Stall => {
            if let Some(deadline) = deadline {
                tokio::time::sleep_until(deadline).await;
            }
            Err(StatusCode::SERVICE_UNAVAILABLE)
        }
    }
}

async fn find_charge(
    State(service): State<Arc<PaymentsService>>,
    UrlPath(order): UrlPath<u64>,
) -> Result<Json<Charge>, StatusCode> {
    if service.reads_down.load(Ordering::SeqCst) {
        return Err(StatusCode::SERVICE_UNAVAILABLE);
    }
    let charges = service.charges.lock().unwrap();
    charges.iter().find(|c| c.order == order).cloned().map(Json).ok_or(StatusCode::NOT_FOUND)
}
