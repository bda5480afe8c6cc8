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
//! | `gen_ai.operation.name` | `execute_tool` |
//! | `gen_ai.tool.name` | the tool's name |
//! | `gen_ai.tool.description` | its doc comment |
//! | `gen_ai.tool.call.id` | the LLM provider's tool-call id, when the call is keyed by one |
//! | `error.type` | the outcome, when it is not a success (`not_applied`, `unknown`, ...) |
//! | `verified_tools.agent`, `.key`, `.side_effect`, `.attempts`, `.outcome`, `.proof` | ours |
//!
//! An event (level DEBUG) marks each transition, with `state` and what the
//! audit trail records of it. Arguments are never recorded: secrets stay out.

use crate::audit::AuditEvent;

#[cfg(feature = "tracing")]
mod spans {
    use tracing::field::Empty;

    use crate::audit::{AuditEvent, CallState};
    use crate::{Context, KeyScope, ToolSpec};

    /// The span of one logical call.
    pub(crate) type Span = tracing::Span;

    pub(crate) fn call(cx: &Context, spec: &ToolSpec) -> Span {
        // No subscriber was ever set: skip the callsite's interest lookup.
        if !tracing::dispatcher::has_been_set() {
            return Span::none();
        }
        let span = tracing::info_span!(
            "execute_tool",
            otel.name = %format_args!("execute_tool {}", spec.name),
            gen_ai.operation.name = "execute_tool",
            gen_ai.tool.name = spec.name,
            gen_ai.tool.description = spec.description,
            gen_ai.tool.call.id = Empty,
            error.type = Empty,
            verified_tools.agent = cx.agent(),
            verified_tools.key = Empty,
            verified_tools.side_effect = spec.side_effect.as_str(),
            verified_tools.attempts = Empty,
            verified_tools.outcome = Empty,
            verified_tools.proof = Empty,
        );
        if let Some(KeyScope::ToolCall(id)) = cx.scope() {
            span.record("gen_ai.tool.call.id", id.as_str());
        }
        span
    }

    pub(crate) fn transition(span: &Span, e: &AuditEvent<'_>) {
        if span.is_disabled() {
            return;
        }
        if let (CallState::Planned, Some(key)) = (e.state, e.key) {
            span.record("verified_tools.key", tracing::field::display(key));
        }
        if e.state.is_terminal() {
            span.record("verified_tools.attempts", e.attempt);
            if let Some(outcome) = e.outcome {
                span.record("verified_tools.outcome", outcome);
                if outcome != "success" {
                    span.record("error.type", outcome);
                }
            }
            if let Some(proof) = e.proof {
                span.record("verified_tools.proof", tracing::field::debug(proof));
            }
        }
        tracing::debug!(
            parent: span,
            state = ?e.state,
            attempt = e.attempt,
            elapsed_ms = e.elapsed_ms,
            verdict = e.verdict.map(tracing::field::display),
            settled = e.settled,
            error_class = e.error_class.map(tracing::field::debug),
            error = e.error,
            reason = e.reason.map(tracing::field::debug),
        );
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

/// Runs `future` inside the call's span (so the tool's own spans nest).
#[cfg(feature = "tracing")]
pub(crate) fn instrument<F: std::future::Future>(
    span: Span,
    future: F,
) -> tracing::instrument::Instrumented<F> {
    tracing::Instrument::instrument(future, span)
}

/// Runs `future` as it is, without the feature.
#[cfg(not(feature = "tracing"))]
pub(crate) fn instrument<F: std::future::Future>(_: Span, future: F) -> F {
    future
}
