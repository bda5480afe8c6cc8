//! The `tracing` span of a call, by the OpenTelemetry GenAI conventions, as
//! a subscriber sees it: its name and fields, an event per transition, and
//! no argument (so no secret) anywhere.

mod fake;

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use fake::{Attempt, Fake};
use tracing::field::{Field, Visit};
use tracing::span::{Attributes, Id, Record};
use tracing::{Event, Subscriber};
use tracing_subscriber::layer::{Context as LayerContext, SubscriberExt};
use tracing_subscriber::registry::LookupSpan;
use tracing_subscriber::{Layer, Registry};
use verified_tools::ledger::Codec;
use verified_tools::{Context, RetryPolicy, SideEffect, ToolResult, ToolSpec, engine};

static SEND: ToolSpec = ToolSpec::new("send_welcome", SideEffect::High)
    .with_verifier()
    .with_description("Sends the welcome mail.");

/// Every field of every span and event, as text.
#[derive(Default, Clone)]
struct Captured(Arc<Mutex<Seen>>);

#[derive(Default, Debug)]
struct Seen {
    spans: Vec<(String, BTreeMap<String, String>)>,
    events: Vec<BTreeMap<String, String>>,
}

struct Fields<'a>(&'a mut BTreeMap<String, String>);

impl Visit for Fields<'_> {
    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        self.0.insert(field.name().to_owned(), format!("{value:?}"));
    }

    fn record_str(&mut self, field: &Field, value: &str) {
        self.0.insert(field.name().to_owned(), value.to_owned());
    }
}

impl<S: Subscriber + for<'a> LookupSpan<'a>> Layer<S> for Captured {
    fn on_new_span(&self, attrs: &Attributes<'_>, _: &Id, _: LayerContext<'_, S>) {
        let mut fields = BTreeMap::new();
        attrs.record(&mut Fields(&mut fields));
        self.0.lock().unwrap().spans.push((attrs.metadata().name().to_owned(), fields));
    }

    fn on_record(&self, _: &Id, values: &Record<'_>, _: LayerContext<'_, S>) {
        let mut seen = self.0.lock().unwrap();
        if let Some((_, fields)) = seen.spans.last_mut() {
            values.record(&mut Fields(fields));
        }
    }

    fn on_event(&self, event: &Event<'_>, _: LayerContext<'_, S>) {
        let mut fields = BTreeMap::new();
        event.record(&mut Fields(&mut fields));
        self.0.lock().unwrap().events.push(fields);
    }
}

fn cx() -> Context {
    let policy = RetryPolicy::for_class(SideEffect::High)
        .with_attempt_timeout(Some(Duration::from_millis(100)))
        .with_settle(Some(Duration::ZERO));
    Context::new("support-agent").with_policy(SideEffect::High, policy).for_tool_call("call_Zx81")
}

/// One call under a capturing subscriber: the lost answer is verified.
fn traced(attempts: &[Attempt]) -> (ToolResult<u32, fake::FakeError>, Seen) {
    let captured = Captured::default();
    let subscriber = Registry::default().with(captured.clone());
    let fake = Fake::new(attempts, &[]);
    let rt = tokio::runtime::Builder::new_current_thread().enable_time().start_paused(true).build();
    let result = tracing::subscriber::with_default(subscriber, || {
        rt.unwrap().block_on(engine::call(
            &cx(),
            &SEND,
            &(42u64, "hunter2-secret"),
            &(42u64, "<redacted>"),
            |a| fake.send(a),
            Some(|_| fake.check()),
            Codec::serde(),
        ))
    });
    let seen = std::mem::take(&mut *captured.0.lock().unwrap());
    (result, seen)
}

#[test]
fn one_span_per_call_named_and_shaped_by_the_genai_conventions() {
    let (result, seen) = traced(&[Attempt::TimeoutApplied]);
    assert!(result.is_success(), "{result:?}");
    assert_eq!(seen.spans.len(), 1, "{seen:#?}");
    let (name, fields) = &seen.spans[0];
    assert_eq!(name, "execute_tool");
    let field = |k: &str| fields.get(k).map(String::as_str);
    assert_eq!(field("otel.name"), Some("execute_tool send_welcome"));
    assert_eq!(field("gen_ai.operation.name"), Some("execute_tool"));
    assert_eq!(field("gen_ai.tool.name"), Some("send_welcome"));
    assert_eq!(field("gen_ai.tool.description"), Some("Sends the welcome mail."));
    assert_eq!(field("gen_ai.tool.call.id"), Some("call_Zx81"));
    assert_eq!(field("verified_tools.agent"), Some("support-agent"));
    assert_eq!(field("verified_tools.side_effect"), Some("high"));
    assert_eq!(field("verified_tools.key"), Some(result.key().unwrap().to_string().as_str()));
    assert_eq!(field("verified_tools.attempts"), Some("1"));
    assert_eq!(field("verified_tools.outcome"), Some("success"));
    assert_eq!(field("verified_tools.proof"), Some("verifier"), "the audit's casing");
    assert_eq!(field("gen_ai.tool.type"), Some("function"));
    assert_eq!(field("otel.status_code"), Some("OK"));
    assert_eq!(field("otel.status_description"), None);
    assert_eq!(field("error.type"), None, "a success has no error type");
}

#[test]
fn an_event_per_transition_and_an_error_type_in_doubt() {
    let (result, seen) = traced(&[Attempt::Hang, Attempt::Hang]);
    assert!(!result.is_success(), "{result:?}");
    let states: Vec<&str> = seen
        .events
        .iter()
        .filter_map(|e| e.get("verified_tools.state").map(String::as_str))
        .collect();
    assert_eq!(states.first(), Some(&"planned"));
    assert!(states.contains(&"dispatched") && states.contains(&"pending_visibility"), "{states:?}");
    assert_eq!(
        states
            .iter()
            .filter(|s| ["verified_failure", "unknown", "verified_success"].contains(s))
            .count(),
        1
    );
    // No event field is named `error`: OpenTelemetry layers read that as an
    // exception and fail the span.
    assert!(seen.events.iter().all(|e| !e.contains_key("error")), "{:?}", seen.events);
    assert!(seen.events.iter().any(|e| e.contains_key("verified_tools.error")));
    let fields = &seen.spans[0].1;
    assert_eq!(fields.get("error.type").map(String::as_str), Some(result.label()));
    assert_eq!(fields.get("otel.status_code").map(String::as_str), Some("ERROR"));
    let description = fields.get("otel.status_description").map(String::as_str).unwrap_or("");
    assert!(description.starts_with(result.label()), "{description:?}");
}

#[test]
fn no_argument_and_so_no_secret_reaches_a_span_or_an_event() {
    let (_, seen) = traced(&[Attempt::TimeoutApplied]);
    let everything = format!("{seen:?}");
    assert!(!everything.contains("hunter2"), "{everything}");
    assert!(!everything.contains("redacted"), "arguments are not recorded at all");
}

/// Arguments whose serialization is counted.
struct Counted(Arc<std::sync::atomic::AtomicUsize>);

impl serde::Serialize for Counted {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        self.0.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        s.serialize_str("<redacted>")
    }
}

/// Serializations of the audit arguments in one successful call.
fn serializations(cx: &Context) -> usize {
    let count = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let subscriber = Registry::default().with(Captured::default());
    let rt = tokio::runtime::Builder::new_current_thread().enable_time().build().unwrap();
    let result: ToolResult<u32, std::io::Error> =
        tracing::subscriber::with_default(subscriber, || {
            rt.block_on(engine::call(
                cx,
                &SEND,
                &7u64,
                &Counted(count.clone()),
                |_| async { Ok(7) },
                Some(|_| async { verified_tools::Verdict::Holds(7) }),
                Codec::serde(),
            ))
        });
    assert!(result.is_success(), "{result:?}");
    count.load(std::sync::atomic::Ordering::Relaxed)
}

#[test]
fn a_subscriber_alone_serializes_no_argument_and_an_audit_does_once() {
    assert_eq!(serializations(&cx()), 0, "a span records no argument: nothing to serialize");
    let audit = Arc::new(verified_tools::audit::MemoryAudit::new());
    assert_eq!(serializations(&cx().with_audit(audit.clone())), 1);
    let planned = audit.events();
    assert!(
        planned.iter().any(|e| e.args.as_deref() == Some("\"<redacted>\"")),
        "the audit shows them: {planned:?}"
    );
}
