//! The call's span as OpenTelemetry exports it, end to end: `#[verified_tool]`
//! and `engine::call` under `tracing-subscriber` with the
//! `tracing-opentelemetry` layer, collected by the SDK's in-memory exporter
//! (what a user wires up, with an OTLP or stdout exporter in its place).
//!
//! A capturing subscriber (`tests/telemetry.rs`) sees fields as `tracing`
//! hands them over; only the layer shows what exporters receive: the status
//! it derives, an `exception` event made of a field named `error`, a `u64`
//! turned into text. So these tests read the exported spans: status,
//! attribute types, event names, and the audit's values in the events.

use std::collections::VecDeque;
use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use opentelemetry::trace::{Status, TracerProvider as _};
use opentelemetry::{KeyValue, Value};
use opentelemetry_sdk::trace::{InMemorySpanExporter, SdkTracerProvider, SpanData};
use serde_json::json;
use tracing_subscriber::layer::SubscriberExt;
use verified_tools::audit::MemoryAudit;
use verified_tools::ledger::{Codec, MemoryLedger};
use verified_tools::{
    CallError, Classify, Context, ErrorClass, IdempotencyKey, Proof, RetryPolicy, SideEffect,
    ToolResult, ToolSpec, Verdict, engine, verified_tool,
};

const TOKEN: &str = "s3cr3t-t0ken";

/// What the mail service does with one attempt.
#[derive(Debug, Clone, Copy)]
enum Step {
    /// Sends and answers.
    Answer,
    /// Sends, then the answer is lost: the attempt times out.
    SendThenHang,
    /// Never sends, never answers.
    Hang,
}

#[derive(Debug)]
struct Bounced;

impl std::fmt::Display for Bounced {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("550 mailbox unavailable")
    }
}

impl Classify for Bounced {
    fn classify(&self) -> ErrorClass {
        ErrorClass::Definitive
    }
}

#[derive(Default)]
struct Mailer {
    script: Mutex<VecDeque<Step>>,
    sent: Mutex<Vec<u64>>,
    /// Its verifier reads a replica that never answers clearly.
    blind: bool,
}

impl Mailer {
    fn scripted(script: &[Step]) -> Self {
        Self { script: Mutex::new(script.iter().copied().collect()), ..Self::default() }
    }
}

/// Sends the welcome mail.
#[verified_tool(side_effect = "high", verify = welcome_sent, skip(mailer), secret(token))]
async fn send_welcome(
    mailer: &Mailer,
    user: u64,
    token: &str,
    key: IdempotencyKey,
) -> Result<u32, Bounced> {
    let _ = (token, key);
    let step = mailer.script.lock().unwrap().pop_front().unwrap_or(Step::Answer);
    tokio::time::sleep(Duration::from_millis(10)).await;
    if !matches!(step, Step::Hang) {
        mailer.sent.lock().unwrap().push(user);
    }
    if !matches!(step, Step::Answer) {
        std::future::pending::<()>().await;
    }
    Ok(1)
}

async fn welcome_sent(mailer: &Mailer, user: &u64, _token: &str) -> Verdict<u32> {
    tokio::time::sleep(Duration::from_millis(5)).await;
    if mailer.blind {
        return Verdict::Unknown;
    }
    let sent = mailer.sent.lock().unwrap().iter().filter(|u| *u == user).count() as u32;
    if sent > 0 { Verdict::Holds(sent) } else { Verdict::Absent }
}

/// What one run exported, and the audit trail of the same calls.
struct Exported {
    spans: Vec<SpanData>,
    audit: Vec<serde_json::Value>,
}

/// The context of these tests: attempts time out after 100 ms, the service
/// settles at an attempt's deadline, and the calls go to a memory audit.
fn context(audit: &Arc<MemoryAudit>) -> Context {
    Context::new("support-agent")
        .map_policies(|class, _| {
            RetryPolicy::for_class(class)
                .with_attempt_timeout(Some(Duration::from_millis(100)))
                .with_settle(Some(Duration::ZERO))
        })
        .with_ledger(Arc::new(MemoryLedger::new()))
        .with_audit(audit.clone())
}

/// Runs `calls` under a subscriber with the OpenTelemetry layer, on a
/// current-thread runtime with paused time. `activation: false` keeps the
/// layer's span a builder until it closes (the other path a status takes).
fn exported<F: Future>(
    activation: bool,
    calls: impl FnOnce(Context) -> F,
) -> (F::Output, Exported) {
    let exporter = InMemorySpanExporter::default();
    let provider = SdkTracerProvider::builder().with_simple_exporter(exporter.clone()).build();
    let layer = tracing_opentelemetry::layer()
        .with_tracer(provider.tracer("verified-tools-tests"))
        .with_context_activation(activation);
    let subscriber = tracing_subscriber::registry().with(layer);
    let audit = Arc::new(MemoryAudit::new());
    let cx = context(&audit);
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .start_paused(true)
        .build()
        .expect("runtime");
    let out = tracing::subscriber::with_default(subscriber, || rt.block_on(calls(cx)));
    provider.force_flush().expect("flush");
    let spans = exporter.get_finished_spans().expect("spans");
    let audit = audit.events().iter().map(|e| serde_json::from_str(&e.json).unwrap()).collect();
    (out, Exported { spans, audit })
}

fn attr<'a>(attributes: &'a [KeyValue], key: &str) -> Option<&'a Value> {
    attributes.iter().find(|kv| kv.key.as_str() == key).map(|kv| &kv.value)
}

/// A string attribute: present and a string, or absent.
fn text<'a>(attributes: &'a [KeyValue], key: &str) -> Option<&'a str> {
    attr(attributes, key).map(|v| match v {
        Value::String(s) => s.as_str(),
        other => panic!("`{key}` is not a string: {other:?}"),
    })
}

/// An integer attribute: present and an `i64`, or absent.
fn int(attributes: &[KeyValue], key: &str) -> Option<i64> {
    attr(attributes, key).map(|v| match v {
        Value::I64(n) => *n,
        other => panic!("`{key}` is not an integer: {other:?}"),
    })
}

fn flag(attributes: &[KeyValue], key: &str) -> Option<bool> {
    attr(attributes, key).map(|v| match v {
        Value::Bool(b) => *b,
        other => panic!("`{key}` is not a bool: {other:?}"),
    })
}

fn typed(value: &Value) -> serde_json::Value {
    match value {
        Value::Bool(b) => json!(b),
        Value::I64(n) => json!(n),
        Value::F64(x) => json!(x),
        Value::String(s) => json!(s.as_str()),
        other => json!(other.to_string()),
    }
}

/// A span as JSON, with attribute values of their exported types.
fn as_json(span: &SpanData) -> serde_json::Value {
    let attributes = |kvs: &[KeyValue]| {
        kvs.iter()
            .map(|kv| (kv.key.to_string(), typed(&kv.value)))
            .collect::<serde_json::Map<_, _>>()
    };
    json!({
        "name": span.name,
        "status": match &span.status {
            Status::Ok => json!("Ok"),
            Status::Error { description } => json!({ "Error": description }),
            Status::Unset => json!("Unset"),
        },
        "attributes": attributes(&span.attributes),
        "events": span.events.iter().map(|e| json!({
            "name": e.name,
            "attributes": attributes(&e.attributes),
        })).collect::<Vec<_>>(),
    })
}

/// What every exported call span must be, whatever its outcome: GenAI
/// attributes, typed values, named events and no exception; each event
/// says what its audit event says, in the audit's own words. Returns the
/// states of its events.
fn check_shape(span: &SpanData, audit: &[serde_json::Value]) -> Vec<String> {
    let a = &span.attributes;
    assert_eq!(span.name, "execute_tool send_welcome");
    assert_eq!(text(a, "gen_ai.operation.name"), Some("execute_tool"));
    assert_eq!(text(a, "gen_ai.tool.name"), Some("send_welcome"));
    assert_eq!(text(a, "gen_ai.tool.type"), Some("function"));
    assert_eq!(text(a, "gen_ai.tool.description"), Some("Sends the welcome mail."));
    assert_eq!(text(a, "verified_tools.agent"), Some("support-agent"));
    assert_eq!(text(a, "verified_tools.side_effect"), Some("high"));
    // The layer consumes its `otel.*` fields; none is left as an attribute.
    assert!(a.iter().all(|kv| !kv.key.as_str().starts_with("otel.")), "{a:?}");

    let terminal = audit.last().expect("an audit event");
    assert_eq!(int(a, "verified_tools.attempts"), terminal["attempt"].as_i64());
    assert_eq!(text(a, "verified_tools.outcome"), terminal["outcome"].as_str());
    assert_eq!(text(a, "verified_tools.proof"), terminal["proof"].as_str());
    assert_eq!(text(a, "verified_tools.reason"), terminal["reason"].as_str());
    assert_eq!(text(a, "verified_tools.key"), audit[0]["key"].as_str());
    let success = terminal["outcome"] == "success";
    assert_eq!(text(a, "error.type"), if success { None } else { terminal["outcome"].as_str() });
    match &span.status {
        Status::Ok => assert!(success, "{:#}", as_json(span)),
        Status::Error { description } => {
            assert!(!success, "{:#}", as_json(span));
            assert!(
                description.starts_with(terminal["outcome"].as_str().unwrap()),
                "{description}"
            );
            if let Some(error) = terminal["error"].as_str() {
                assert!(description.ends_with(error), "{description}");
            }
        }
        Status::Unset => panic!("no status: {:#}", as_json(span)),
    }

    assert_eq!(span.events.len(), audit.len(), "{:#}", as_json(span));
    let mut states = Vec::new();
    for (event, audited) in span.events.iter().zip(audit) {
        let e = &event.attributes;
        assert_eq!(event.name, "verified_tools.transition", "{event:?}");
        assert!(
            e.iter()
                .all(|kv| kv.key.as_str() != "error" && !kv.key.as_str().starts_with("exception")),
            "{event:?}"
        );
        for field in ["state", "verdict", "error_class", "error", "outcome", "proof", "reason"] {
            let key = format!("verified_tools.{field}");
            assert_eq!(text(e, &key), audited[field].as_str(), "{field} of {event:?}");
        }
        for field in ["attempt", "elapsed_ms", "deadline_ms"] {
            let key = format!("verified_tools.{field}");
            assert_eq!(int(e, &key), audited[field].as_i64(), "{field} of {event:?}");
        }
        assert_eq!(flag(e, "verified_tools.settled"), audited["settled"].as_bool());
        states.push(audited["state"].as_str().unwrap().to_owned());
    }
    states
}

#[test]
fn a_success_by_response_is_ok_with_integer_attempts() {
    let mailer = Mailer::scripted(&[Step::Answer]);
    let (result, out) = exported(true, |cx| async move {
        // Opted out of reading back the OK answer: this is the span of a success by response.
        let believing = cx.policy(SideEffect::High).with_verify_response(false);
        let cx = cx.with_policy(SideEffect::High, believing);
        send_welcome(&cx.for_tool_call("call_Zx81"), &mailer, 42, TOKEN).await
    });
    assert!(matches!(result, ToolResult::Success { proof: Proof::Response, .. }), "{result:?}");
    assert_eq!(out.spans.len(), 1);
    let span = &out.spans[0];
    let states = check_shape(span, &out.audit);
    assert_eq!(states, ["planned", "dispatched", "verified_success"]);
    assert_eq!(span.status, Status::Ok);
    assert_eq!(text(&span.attributes, "gen_ai.tool.call.id"), Some("call_Zx81"));
    assert_eq!(int(&span.attributes, "verified_tools.attempts"), Some(1));
    assert_eq!(text(&span.attributes, "verified_tools.proof"), Some("response"));
}

/// Issue 19: the lost answer proven by the verifier was exported as an
/// error, with an `exception` event, for the timed-out attempt's `error`.
fn verified_after_a_timeout(activation: bool) {
    let mailer = Mailer::scripted(&[Step::SendThenHang]);
    let (result, out) = exported(activation, |cx| async move {
        send_welcome(&cx.for_tool_call("call_Zx81"), &mailer, 42, TOKEN).await
    });
    assert!(matches!(result, ToolResult::Success { proof: Proof::Verifier, .. }), "{result:?}");
    assert_eq!(out.spans.len(), 1);
    let span = &out.spans[0];
    // What an exporter receives, for `-- --nocapture`.
    println!("{}", serde_json::to_string_pretty(&as_json(span)).unwrap());
    let states = check_shape(span, &out.audit);
    // The attempt's timeout, then the verifier's read: both `pending_visibility`.
    assert_eq!(
        states,
        ["planned", "dispatched", "pending_visibility", "pending_visibility", "verified_success"]
    );
    assert_eq!(span.status, Status::Ok, "a proven success is never an error");
    assert_eq!(text(&span.attributes, "verified_tools.outcome"), Some("success"));
    assert_eq!(text(&span.attributes, "verified_tools.proof"), Some("verifier"));
    assert_eq!(text(&span.attributes, "error.type"), None);
    let timed_out = &span.events[2].attributes;
    assert_eq!(text(timed_out, "verified_tools.error_class"), Some("ambiguous"));
    assert_eq!(text(timed_out, "verified_tools.error"), Some("no answer within 100 ms"));
    let read = &span.events[3].attributes;
    assert_eq!(text(read, "verified_tools.verdict"), Some("holds"));
    assert_eq!(int(&span.events[1].attributes, "verified_tools.deadline_ms"), Some(100));
}

#[test]
fn a_success_proven_by_the_verifier_after_a_timeout_is_ok_without_exception() {
    verified_after_a_timeout(true);
}

#[test]
fn a_success_proven_by_the_verifier_is_ok_without_context_activation_too() {
    verified_after_a_timeout(false);
}

#[test]
fn an_unknown_is_an_error_with_its_reason() {
    let mailer = Mailer { blind: true, ..Mailer::scripted(&[Step::Hang]) };
    let (result, out) = exported(true, |cx| async move {
        send_welcome(&cx.for_tool_call("call_Q7"), &mailer, 42, TOKEN).await
    });
    let ToolResult::Unknown { reason, .. } = &result else { panic!("{result:?}") };
    assert_eq!(out.spans.len(), 1);
    let span = &out.spans[0];
    let states = check_shape(span, &out.audit);
    assert_eq!(states.last().map(String::as_str), Some("unknown"));
    let a = &span.attributes;
    assert_eq!(text(a, "error.type"), Some("unknown"));
    assert_eq!(text(a, "verified_tools.outcome"), Some("unknown"));
    let reason = serde_json::to_value(reason).unwrap();
    assert_eq!(text(a, "verified_tools.reason"), reason.as_str());
    let Status::Error { description } = &span.status else { panic!("{:?}", span.status) };
    assert_eq!(
        description.as_ref(),
        format!(
            "unknown ({}): {}",
            reason.as_str().unwrap(),
            out.audit.last().unwrap()["error"].as_str().unwrap()
        )
    );
}

/// `refused` is an error: the effect the agent asked for did not happen, and
/// `error.type` is set, which the conventions pair with the Error status.
#[test]
fn a_refusal_is_an_error_with_its_message() {
    let mailer = Mailer::scripted(&[Step::Answer]);
    let key = IdempotencyKey::from_u128(0x5eed);
    let (results, out) = exported(true, |cx| async move {
        let cx = cx.for_key(key);
        let first = send_welcome(&cx, &mailer, 42, TOKEN).await;
        let reused = send_welcome(&cx, &mailer, 43, TOKEN).await;
        (first, reused)
    });
    assert!(results.0.is_success(), "{:?}", results.0);
    let ToolResult::Refused(error @ CallError::KeyReuse { .. }) = &results.1 else {
        panic!("{:?}", results.1)
    };
    assert_eq!(out.spans.len(), 2);
    let first_events = out.spans[0].events.len();
    check_shape(&out.spans[0], &out.audit[..first_events]);
    let span = &out.spans[1];
    let states = check_shape(span, &out.audit[first_events..]);
    assert_eq!(states.last().map(String::as_str), Some("refused"));
    assert_eq!(text(&span.attributes, "error.type"), Some("refused"));
    assert_eq!(int(&span.attributes, "verified_tools.attempts"), Some(0));
    assert_eq!(span.status, Status::error(format!("refused: {error}")));
}

#[test]
fn no_secret_reaches_an_attribute_or_an_event() {
    static SEND: ToolSpec = ToolSpec::new("send_welcome", SideEffect::High)
        .with_verifier()
        .with_description("Sends the welcome mail.");
    let mailer = Mailer::scripted(&[Step::SendThenHang]);
    let blind = Mailer { blind: true, ..Mailer::scripted(&[Step::Hang]) };
    let (_, out) = exported(true, |cx| async move {
        let by_macro = send_welcome(&cx.for_tool_call("call_1"), &mailer, 42, TOKEN).await;
        // The engine's own entry: the payload (in the key) has the secret,
        // the audit's arguments do not.
        let by_engine: ToolResult<u32, Bounced> = engine::call(
            &cx.for_tool_call("call_2"),
            &SEND,
            &(7u64, TOKEN),
            &json!({ "user": 7, "token": "<redacted>" }),
            |_| async { std::future::pending().await },
            Some(|_| welcome_sent(&blind, &7, TOKEN)),
            Codec::serde(),
        )
        .await;
        (by_macro, by_engine)
    });
    assert_eq!(out.spans.len(), 2);
    assert!(out.audit.iter().any(|e| e["args"]["token"] == "<redacted>"), "{:?}", out.audit);
    for span in &out.spans {
        let everything = as_json(span).to_string();
        assert!(!everything.contains("s3cr3t"), "{everything}");
        assert!(!everything.contains("redacted"), "arguments are not recorded at all");
    }
}

/// A span opened by the tool while it runs, and one opened while its
/// future is dropped (the agent gave up on the call), are children of the
/// call's span: the call is entered on every poll and around that drop.
#[test]
fn the_tools_own_spans_nest_in_the_call_even_when_it_is_cancelled() {
    static SPEC: ToolSpec = ToolSpec::new("upload_report", SideEffect::Low);

    /// Opens a span of its own when dropped, as a client's cleanup might.
    struct Cleanup;
    impl Drop for Cleanup {
        fn drop(&mut self) {
            let _ = tracing::info_span!("cleanup").entered();
        }
    }

    let (cancelled, out) = exported(true, |cx| async move {
        let done: ToolResult<u32, Bounced> = engine::call(
            &cx,
            &SPEC,
            &1u8,
            &1u8,
            |_| async { tracing::info_span!("upload").in_scope(|| Ok(7)) },
            engine::no_verifier(),
            Codec::serde(),
        )
        .await;
        assert!(done.is_success(), "{done:?}");
        let hanging = engine::call(
            &cx,
            &SPEC,
            &2u8,
            &2u8,
            |_| async {
                let _cleanup = Cleanup;
                std::future::pending::<Result<u32, Bounced>>().await
            },
            engine::no_verifier(),
            Codec::serde(),
        );
        // Gives up before the attempt's own 100 ms timeout.
        tokio::time::timeout(Duration::from_millis(10), hanging).await.is_err()
    });
    assert!(cancelled, "the second call should still hang when it is dropped");
    let named =
        |name: &str| -> Vec<&SpanData> { out.spans.iter().filter(|s| s.name == name).collect() };
    let calls = named("execute_tool upload_report");
    assert_eq!(calls.len(), 2, "{:?}", out.spans.iter().map(|s| &s.name).collect::<Vec<_>>());
    let (upload, cleanup) = (named("upload"), named("cleanup"));
    assert_eq!((upload.len(), cleanup.len()), (1, 1));
    assert_eq!(upload[0].parent_span_id, calls[0].span_context.span_id());
    assert_eq!(cleanup[0].parent_span_id, calls[1].span_context.span_id());
}
