//! `tracing` spans and events from a call's transitions (feature `tracing`,
//! on by default), shaped by the OpenTelemetry semantic conventions for
//! generative AI: one span per logical call, `execute_tool {tool}`.
//!
//! The conventions are still "development" upstream: their attribute names
//! live here and nowhere else.
//!
//! | span field | value |
//! |---|---|
//! | `otel.name` | `execute_tool {tool}` (the span's name for OpenTelemetry exporters) |
//! | `otel.status_code` | `OK` for a success, `ERROR` for every other outcome, set once, at the end |
//! | `otel.status_description` | an error's outcome, reason and text: `unknown (retries_exhausted): no answer within 100 ms` |
//! | `gen_ai.operation.name` | `execute_tool` |
//! | `gen_ai.tool.name` | the tool's name |
//! | `gen_ai.tool.type` | `function`: the tool runs in the agent's own process |
//! | `gen_ai.tool.description` | its doc comment, when it has one |
//! | `gen_ai.tool.call.id` | the LLM provider's tool-call id, when the call is keyed by one |
//! | `error.type` | the outcome, when it is not a success (`not_applied`, `unknown`, `refused`, ...) |
//! | `verified_tools.agent`, `.key`, `.side_effect`, `.outcome`, `.proof`, `.reason` | ours, strings |
//! | `verified_tools.attempts` | attempts dispatched, an integer |
//!
//! An event named `verified_tools.transition` (level DEBUG) marks each
//! transition, with what the audit trail records of it under the audit's own
//! names and values, prefixed: `verified_tools.state`, `.attempt`,
//! `.elapsed_ms`, `.deadline_ms` (integers), `.verdict`, `.settled`,
//! `.error_class`, `.error`, `.outcome`, `.proof`, `.reason`. Every name and
//! value is the audit's snake_case (`planned`, `verifier`), so one query fits
//! spans, events and audit lines. Arguments are never recorded: secrets stay
//! out.
//!
//! Why these shapes, for `tracing-opentelemetry`: a field named `error` (or
//! `exception.*`) on an event turns it into an `exception` event and the span
//! into an error, though the call may still end in a proven success (a lost
//! answer the verifier found applied); so the attempt's error is
//! `verified_tools.error`, and the status is decided once, from the outcome.
//! An OpenTelemetry attribute is an `i64`, not a `u64` (a `u64` arrives as
//! its text): counts and durations are recorded as `i64`. A `refused` call
//! is an error too: the effect the agent asked for did not happen, and
//! `error.type` is set, which the conventions pair with the Error status.
//!
//! Exporting the spans with OpenTelemetry (`tracing-opentelemetry` 0.32,
//! `opentelemetry` and `opentelemetry_sdk` 0.31, `tracing-subscriber` 0.3):
//!
//! ```
//! use opentelemetry::trace::TracerProvider as _;
//! use opentelemetry_sdk::trace::{InMemorySpanExporter, SdkTracerProvider};
//! use tracing_subscriber::layer::SubscriberExt;
//!
//! let exporter = InMemorySpanExporter::default(); // or OTLP, or stdout
//! let provider = SdkTracerProvider::builder().with_simple_exporter(exporter.clone()).build();
//! let otel = tracing_opentelemetry::layer().with_tracer(provider.tracer("my-agent"));
//! let subscriber = tracing_subscriber::registry().with(otel);
//! tracing::subscriber::set_global_default(subscriber)?;
//! # let cx = verified_tools::Context::new("agent");
//! # static SPEC: verified_tools::ToolSpec =
//! #     verified_tools::ToolSpec::new("save_draft", verified_tools::SideEffect::Low);
//! # let rt = tokio::runtime::Builder::new_current_thread().enable_time().build()?;
//! # let result: verified_tools::ToolResult<u32, std::io::Error> = rt.block_on(
//! #     verified_tools::engine::call(&cx, &SPEC, &1u8, &1u8, |_| async { Ok(7) },
//! #         verified_tools::engine::no_verifier(), verified_tools::ledger::Codec::serde()));
//! # assert!(result.is_success());
//! // ... the agent's calls of verified tools ...
//! provider.force_flush()?;
//! # let spans = exporter.get_finished_spans()?;
//! # assert_eq!(spans[0].name, "execute_tool save_draft");
//! # assert_eq!(spans[0].status, opentelemetry::trace::Status::Ok);
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

use crate::audit::AuditEvent;

#[cfg(feature = "tracing")]
mod spans {
    use std::fmt;
    use std::sync::OnceLock;

    use tracing::field::{Empty, Field, Value};

    use crate::audit::{AuditEvent, CallState};
    use crate::{Context, ErrorClass, KeyScope, Proof, ToolSpec, UnknownReason, Verdict};

    /// The span of one logical call.
    pub(crate) type Span = tracing::Span;

    pub(crate) fn call(cx: &Context, spec: &ToolSpec) -> Span {
        // No subscriber was ever set: skip the callsite's interest lookup.
        if !tracing::dispatcher::has_been_set() {
            return Span::none();
        }
        let description = (!spec.description.is_empty()).then_some(spec.description);
        let call_id = match cx.scope() {
            Some(KeyScope::ToolCall(id)) => Some(id.as_str()),
            _ => None,
        };
        let span = tracing::info_span!(
            "execute_tool",
            otel.name = %format_args!("execute_tool {}", spec.name),
            otel.status_code = Empty,
            otel.status_description = Empty,
            gen_ai.operation.name = "execute_tool",
            gen_ai.tool.name = spec.name,
            gen_ai.tool.type = "function",
            gen_ai.tool.description = description,
            gen_ai.tool.call.id = call_id,
            error.type = Empty,
            verified_tools.agent = cx.agent(),
            verified_tools.key = Empty,
            verified_tools.side_effect = spec.side_effect.as_str(),
            verified_tools.attempts = Empty,
            verified_tools.outcome = Empty,
            verified_tools.proof = Empty,
            verified_tools.reason = Empty,
        );
        span
    }

    /// The fields the call's span records after it is made, looked up by
    /// name once: every call's span comes from the one callsite above, so
    /// they are the same for all (a lookup by name compares strings field
    /// by field, on every `record`).
    struct Fields {
        key: Field,
        attempts: Field,
        outcome: Field,
        proof: Field,
        reason: Field,
        status_code: Field,
        status_description: Field,
        error_type: Field,
    }

    impl Fields {
        fn of(span: &Span) -> Option<&'static Fields> {
            static FIELDS: OnceLock<Option<Fields>> = OnceLock::new();
            let set = span.metadata()?.fields();
            FIELDS
                .get_or_init(|| {
                    Some(Fields {
                        key: set.field("verified_tools.key")?,
                        attempts: set.field("verified_tools.attempts")?,
                        outcome: set.field("verified_tools.outcome")?,
                        proof: set.field("verified_tools.proof")?,
                        reason: set.field("verified_tools.reason")?,
                        status_code: set.field("otel.status_code")?,
                        status_description: set.field("otel.status_description")?,
                        error_type: set.field("error.type")?,
                    })
                })
                .as_ref()
        }
    }

    pub(crate) fn transition(span: &Span, e: &AuditEvent<'_>) {
        if span.is_disabled() {
            return;
        }
        if let (CallState::Planned, Some(key), Some(f)) = (e.state, e.key, Fields::of(span)) {
            span.record(&f.key, tracing::field::display(key));
        }
        if e.state.is_terminal() {
            end(span, e);
        }
        tracing::event!(
            name: "verified_tools.transition",
            parent: span,
            tracing::Level::DEBUG,
            verified_tools.state = state_name(e.state),
            verified_tools.attempt = i64::from(e.attempt),
            verified_tools.elapsed_ms = int(e.elapsed_ms),
            verified_tools.deadline_ms = e.deadline_ms.map(int),
            verified_tools.verdict = e.verdict.map(verdict_name),
            verified_tools.settled = e.settled,
            verified_tools.error_class = e.error_class.map(class_name),
            verified_tools.error = e.error,
            verified_tools.outcome = e.outcome,
            verified_tools.proof = e.proof.map(proof_name),
            verified_tools.reason = e.reason.map(reason_name),
        );
    }

    /// The terminal transition decides the status, so what happened on the
    /// way (a timed-out attempt, an `ERROR` event of the tool) never makes a
    /// proven success an error. One `record_all`: one visit of the
    /// subscriber for every field of the ending.
    fn end(span: &Span, e: &AuditEvent<'_>) {
        let (Some(f), Some(meta)) = (Fields::of(span), span.metadata()) else {
            return;
        };
        let attempts = i64::from(e.attempt);
        let outcome = e.outcome.unwrap_or(state_name(e.state));
        let proof = e.proof.map(proof_name);
        let reason = e.reason.map(reason_name);
        let ok = e.state == CallState::VerifiedSuccess;
        let code = if ok { "OK" } else { "ERROR" };
        let description = tracing::field::display(Status(outcome, e));
        // The code before the description: `tracing-opentelemetry` reads
        // `ERROR` as an error with an empty description, which would
        // replace one recorded before it (a value set is visited in order).
        let values: [(&Field, Option<&dyn Value>); 7] = [
            (&f.attempts, Some(&attempts)),
            (&f.outcome, Some(&outcome)),
            (&f.proof, proof.as_ref().map(|p| p as &dyn Value)),
            (&f.reason, reason.as_ref().map(|r| r as &dyn Value)),
            (&f.error_type, (!ok).then_some(&outcome as &dyn Value)),
            (&f.status_code, Some(&code)),
            (&f.status_description, (!ok).then_some(&description as &dyn Value)),
        ];
        span.record_all(&meta.fields().value_set(&values));
    }

    /// An error status's description, formatted only by a subscriber that
    /// asks for it.
    struct Status<'a>(&'static str, &'a AuditEvent<'a>);

    impl fmt::Display for Status<'_> {
        fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            let Status(outcome, e) = self;
            f.write_str(outcome)?;
            if let Some(reason) = e.reason {
                write!(f, " ({})", reason_name(reason))?;
            }
            if let Some(error) = e.error {
                write!(f, ": {error}")?;
            }
            Ok(())
        }
    }

    /// OpenTelemetry has no unsigned integer: a `u64` would arrive as text.
    fn int(n: u64) -> i64 {
        i64::try_from(n).unwrap_or(i64::MAX)
    }

    // The audit's serde names (`rename_all = "snake_case"`), spelled out
    // here so that a span costs no serializer; `tests/otel.rs` checks that
    // both say the same.

    fn state_name(state: CallState) -> &'static str {
        match state {
            CallState::Planned => "planned",
            CallState::Dispatched => "dispatched",
            CallState::PendingVisibility => "pending_visibility",
            CallState::VerifiedSuccess => "verified_success",
            CallState::VerifiedFailure => "verified_failure",
            CallState::Unknown => "unknown",
            CallState::Escalated => "escalated",
            CallState::Refused => "refused",
        }
    }

    fn proof_name(proof: Proof) -> &'static str {
        match proof {
            Proof::Response => "response",
            Proof::Verifier => "verifier",
            Proof::Ledger => "ledger",
        }
    }

    fn class_name(class: ErrorClass) -> &'static str {
        match class {
            ErrorClass::Definitive => "definitive",
            ErrorClass::NotSent => "not_sent",
            ErrorClass::Ambiguous => "ambiguous",
            ErrorClass::Conflict => "conflict",
        }
    }

    fn reason_name(reason: UnknownReason) -> &'static str {
        match reason {
            UnknownReason::RetriesExhausted => "retries_exhausted",
            UnknownReason::Superseded => "superseded",
            UnknownReason::VerifierInconclusive => "verifier_inconclusive",
            UnknownReason::Unsettled => "unsettled",
            UnknownReason::DeadlineExceeded => "deadline_exceeded",
            UnknownReason::LedgerUnavailable => "ledger_unavailable",
            UnknownReason::ValueNotRecorded => "value_not_recorded",
        }
    }

    fn verdict_name(verdict: Verdict) -> &'static str {
        match verdict {
            Verdict::Holds(()) => "holds",
            Verdict::Absent => "absent",
            Verdict::Unknown => "unknown",
        }
    }
}

#[cfg(not(feature = "tracing"))]
mod spans {
    use crate::audit::AuditEvent;
    use crate::{Context, ToolSpec};

    /// Nothing, without the feature.
    #[derive(Debug, Clone)]
    pub(crate) struct Span;

    pub(crate) fn call(_: &Context, _: &ToolSpec) -> Span {
        Span
    }

    pub(crate) fn transition(_: &Span, _: &AuditEvent<'_>) {}
}

pub(crate) use spans::{Span, call};

/// Whether anyone listens to a call's transitions in this span.
pub(crate) fn listening(span: &Span) -> bool {
    #[cfg(feature = "tracing")]
    return !span.is_disabled();
    #[cfg(not(feature = "tracing"))]
    return {
        let _ = span;
        false
    };
}

/// Marks one transition on the call's span.
pub(crate) fn transition(span: &Span, event: &AuditEvent<'_>) {
    spans::transition(span, event);
}

/// Runs `future` inside the call's span, so that the tool's own spans and
/// events nest in it: entered on every poll, and while the future is
/// dropped unfinished (a cancelled call).
///
/// `tracing::Instrument` would do the same, but it owns its span: the call,
/// which marks its transitions on the span, would hold a clone (another
/// reference counted in the subscriber, and another close), and it enters
/// the span once more to drop a future that has already finished. Both
/// showed on a traced success (~430 Ir of ~2 800 with
/// `tracing_subscriber::registry()`, `benches/ir_driver.rs`).
#[cfg(feature = "tracing")]
pub(crate) fn in_span<F: std::future::Future>(span: &Span, future: F) -> InSpan<'_, F> {
    InSpan { span, future: Some(future) }
}

#[cfg(feature = "tracing")]
pin_project_lite::pin_project! {
    /// A future run inside a borrowed span (see [`in_span`]).
    pub(crate) struct InSpan<'s, F> {
        span: &'s Span,
        // `None` once finished: dropping it then needs no span.
        #[pin]
        future: Option<F>,
    }

    impl<F> PinnedDrop for InSpan<'_, F> {
        fn drop(this: Pin<&mut Self>) {
            let mut this = this.project();
            if this.future.is_some() {
                let _entered = this.span.enter();
                this.future.set(None);
            }
        }
    }
}

#[cfg(feature = "tracing")]
impl<F: std::future::Future> std::future::Future for InSpan<'_, F> {
    type Output = F::Output;

    fn poll(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<F::Output> {
        let mut this = self.project();
        let _entered = this.span.enter();
        // Never polled again once it finished.
        let Some(future) = this.future.as_mut().as_pin_mut() else {
            return std::task::Poll::Pending;
        };
        let out = std::task::ready!(future.poll(cx));
        this.future.set(None);
        std::task::Poll::Ready(out)
    }
}

/// Runs `future` as it is, without the feature.
#[cfg(not(feature = "tracing"))]
pub(crate) fn in_span<F: std::future::Future>(_: &Span, future: F) -> F {
    future
}
