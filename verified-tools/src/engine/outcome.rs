//! How a call ends: the `ToolResult` of each decision, the ledger's record of
//! it, and the one hook through which every transition reaches the audit
//! sink and the call's span.

use std::time::Duration;

use super::claim::Value;
use super::decide::{self, Event, Refusal};
use super::{Call, Fail, Out};
use crate::audit::{AuditEvent, CallIdentity, CallState};
use crate::escalation::Ticket;
use crate::ledger::{End, LedgerError};
use crate::telemetry;
use crate::tool::Tool;
use crate::{
    CallError, Cause, Classify, Context, ErrorClass, KeyScope, Proof, ToolResult, ToolSpec,
    UnknownReason, Verdict,
};

/// Records a call refused before it had a key, for its JSON arguments did not
/// fit the tool (what `<tool>_json` calls before it returns the error): the
/// audit trail and the call's span show it like any other refusal.
pub fn record_refusal(cx: &Context, spec: &'static ToolSpec, error: &crate::ArgsError) {
    let span = telemetry::call(cx, spec);
    if cx.audit.is_none() && !telemetry::listening(&span) {
        return;
    }
    let text = error.to_string();
    let mut bucket = KeyScope::DEFAULT;
    let scope = cx.scope_for(spec, &mut bucket);
    let event = AuditEvent {
        at_unix_ms: cx.clock().unix_ms(),
        agent: cx.agent(),
        tool: spec.name,
        key: None,
        call: CallIdentity::of(scope),
        effect_key: spec.effect_key,
        state: CallState::Refused,
        attempt: 0,
        elapsed_ms: 0,
        deadline_ms: None,
        verdict: None,
        settled: None,
        error_class: None,
        error: Some(&text),
        outcome: Some("refused"),
        proof: None,
        reason: None,
        args: None,
    };
    if let Some(sink) = &cx.audit {
        sink.record(&event);
    }
    telemetry::transition(&span, &event);
}

/// A negative ending of a holder whose hold was taken over: in doubt, for
/// the call that took the key over may have made the effect since.
fn superseded<T, E>(result: ToolResult<T, E>) -> ToolResult<T, E> {
    match result {
        ToolResult::Failed { error, key } => ToolResult::Unknown {
            reason: UnknownReason::Superseded,
            cause: Cause::Error(error),
            key,
        },
        ToolResult::NotApplied { cause, key } => {
            ToolResult::Unknown { reason: UnknownReason::Superseded, cause, key }
        }
        other => other,
    }
}

/// What a transition adds to its event.
pub(super) enum Detail<'d, T, E> {
    None,
    /// An attempt went out with this time limit.
    Dispatched(Duration),
    /// An attempt failed with this error.
    Failed(ErrorClass, &'d E),
    /// An attempt ran past its limit.
    TimedOut(Duration),
    /// A verifier read: what it said, and whether the last attempt had settled.
    Read(Verdict, bool),
    Panicked,
    LedgerLost,
    /// The call ended so.
    Ended(&'d ToolResult<T, E>),
}

/// The last failure in words: the error's own text where there is one.
fn cause_text<E: Classify>(cause: &Cause<E>) -> String {
    match cause {
        Cause::Error(error) => error.describe(),
        Cause::TimedOut(limit) => format!("no answer within {} ms", limit.as_millis()),
        Cause::DeadlineReached(call) => {
            format!("no answer before the call's deadline ({} ms) passed", call.as_millis())
        }
        other => describe(other).to_owned(),
    }
}

fn describe<E>(cause: &Cause<E>) -> &'static str {
    match cause {
        Cause::Error(_) => "the tool returned an ambiguous error",
        Cause::TimedOut(_) => "an attempt timed out",
        Cause::DeadlineReached(_) => "the call's deadline passed",
        Cause::Unconfirmed => "the tool answered OK but the postcondition was not found",
        Cause::Interrupted => "an earlier call with this key ended in doubt",
        Cause::NeverSent => "nothing was ever sent under this key",
    }
}

impl<'a, X: Tool> Call<'a, X> {
    pub(super) fn succeed(&mut self, event: Event) -> ToolResult<Out<X>, Fail<X>> {
        let key = self.key();
        let proof = match event {
            Event::Answered => Proof::Response,
            Event::Replayed => Proof::Ledger,
            _ if self.facts.completed => Proof::Ledger,
            _ => Proof::Verifier,
        };
        match self.value.take() {
            Some(value) => ToolResult::Success { value, proof, key },
            // Unreachable: both events that succeed store a value first.
            None => self.unresolved(UnknownReason::VerifierInconclusive),
        }
    }

    pub(super) fn failed(&mut self) -> ToolResult<Out<X>, Fail<X>> {
        match self.cause.take() {
            Some(Cause::Error(error)) => ToolResult::Failed { error, key: self.key() },
            // Unreachable: only a definitive error fails.
            other => {
                ToolResult::NotApplied { cause: other.unwrap_or(self.no_cause()), key: self.key() }
            }
        }
    }

    /// The cause of an ending no failure of this call explains: a check
    /// that found nothing sent says so; otherwise earlier calls left it.
    fn no_cause(&self) -> Cause<Fail<X>> {
        if self.facts.attempts == 0 { Cause::NeverSent } else { Cause::Interrupted }
    }

    pub(super) fn not_applied(&mut self) -> ToolResult<Out<X>, Fail<X>> {
        ToolResult::NotApplied {
            cause: self.cause.take().unwrap_or(self.no_cause()),
            key: self.key(),
        }
    }

    /// Nothing more can be done in doubt: irreversible actions go to a person.
    pub(super) fn unresolved(&mut self, reason: UnknownReason) -> ToolResult<Out<X>, Fail<X>> {
        let key = self.key();
        let cause = self.cause.take().unwrap_or(self.no_cause());
        if !decide::escalates(self.spec.side_effect, reason) {
            return ToolResult::Unknown { reason, cause, key };
        }
        let verdict = if self.absent_seen { Verdict::Absent } else { Verdict::Unknown };
        if let Some(escalation) = &self.cx.escalation {
            escalation.escalate(Ticket {
                key,
                tool: self.spec.name,
                agent: self.cx.agent().to_owned(),
                verdict,
                cause: cause_text(&cause),
                args: self.args.as_ref().and_then(|a| serde_json::from_str(a.get()).ok()),
            });
        }
        ToolResult::Escalated { reason, verdict, cause, key }
    }

    /// Refused before acting: the ledger never answered the claim, or
    /// another call held the key for the whole deadline.
    pub(super) fn refused(&mut self, refusal: Refusal) -> ToolResult<Out<X>, Fail<X>> {
        let (tool, key) = (self.spec.name, self.key());
        match refusal {
            Refusal::LedgerSilent => {
                let source =
                    LedgerError::Unavailable("no answer within the call's deadline".into());
                ToolResult::Refused(CallError::Ledger { tool, key, source })
            }
            Refusal::InProgress => ToolResult::Refused(CallError::InProgress { tool, key }),
        }
    }

    /// Records how the call ended, and says it. A holder whose hold was
    /// taken over (it was paused past its lease) cannot say the effect did
    /// not happen: the call that took the key over may have made it, so a
    /// `Failed` or `NotApplied` it reached becomes `Unknown { Superseded }`.
    pub(super) async fn finish(
        &mut self,
        mut result: ToolResult<Out<X>, Fail<X>>,
    ) -> ToolResult<Out<X>, Fail<X>> {
        self.plan();
        // The ledger first: an audit sink that panics must not leave a
        // proven success recorded as in doubt.
        if let Some(hold) = self.hold.take() {
            // One key is one logical call with one budget: whatever did not
            // prove its effect stays recorded, so a repeat verifies first and
            // has only the attempts left (none after a contradicted OK).
            let written = match &result {
                ToolResult::Success { value, .. } => {
                    hold.close(End::Completed(&Value { value, codec: self.tool.codec() })).await
                }
                ToolResult::Failed { .. } | ToolResult::NotApplied { .. } => {
                    hold.close(End::Settled).await
                }
                _ => hold.close(End::InDoubt).await,
            };
            match written {
                Ok(()) => {}
                Err(LedgerError::Fenced(_)) => result = superseded(result),
                Err(_) => {
                    // The record stays held until its lease ends, then in
                    // doubt: the next call verifies first. Nothing is lost.
                    self.note(CallState::PendingVisibility, Detail::LedgerLost);
                }
            }
        }
        let state = match &result {
            ToolResult::Success { .. } => CallState::VerifiedSuccess,
            ToolResult::Failed { .. } | ToolResult::NotApplied { .. } => CallState::VerifiedFailure,
            ToolResult::Unknown { .. } => CallState::Unknown,
            ToolResult::Escalated { .. } => CallState::Escalated,
            ToolResult::Refused(_) => CallState::Refused,
        };
        self.note(state, Detail::Ended(&result));
        result
    }

    /// The one hook of every transition: the audit sink and the span.
    #[inline]
    pub(super) fn note(&self, state: CallState, detail: Detail<'_, Out<X>, Fail<X>>) {
        if self.cx.audit.is_some() || telemetry::listening(self.span) {
            self.emit(state, detail);
        }
    }

    #[inline(never)]
    fn emit(&self, state: CallState, detail: Detail<'_, Out<X>, Fail<X>>) {
        let mut text = None;
        let mut e = AuditEvent {
            // The wall clock is read for the audit only (below): a span
            // keeps its own times.
            at_unix_ms: 0,
            agent: self.cx.agent(),
            tool: self.spec.name,
            key: self.key,
            call: self.identity,
            effect_key: self.spec.effect_key,
            state,
            attempt: self.facts.attempts,
            elapsed_ms: self.now().saturating_duration_since(self.started).as_millis() as u64,
            deadline_ms: None,
            verdict: None,
            settled: None,
            error_class: None,
            error: None,
            outcome: None,
            proof: None,
            reason: None,
            args: if state == CallState::Planned { self.args.as_deref() } else { None },
        };
        match detail {
            Detail::None => {}
            Detail::Dispatched(limit) => e.deadline_ms = Some(limit.as_millis() as u64),
            Detail::Failed(class, error) => {
                e.error_class = Some(class);
                text = Some(error.describe());
            }
            Detail::TimedOut(limit) => {
                e.error_class = Some(ErrorClass::Ambiguous);
                text = Some(format!("no answer within {} ms", limit.as_millis()));
            }
            Detail::Read(verdict, settled) => {
                e.verdict = Some(verdict);
                e.settled = Some(settled);
            }
            Detail::Panicked => text = Some("the tool panicked; its effect is in doubt".into()),
            Detail::LedgerLost => text = Some("the ledger did not record the outcome".into()),
            Detail::Ended(result) => {
                e.outcome = Some(result.label());
                match result {
                    ToolResult::Success { proof, .. } => e.proof = Some(*proof),
                    ToolResult::Failed { error, .. } => {
                        e.error_class = Some(ErrorClass::Definitive);
                        text = Some(error.describe());
                    }
                    ToolResult::NotApplied { cause, .. } => text = Some(cause_text(cause)),
                    ToolResult::Unknown { reason, cause, .. }
                    | ToolResult::Escalated { cause, reason, .. } => {
                        e.reason = Some(*reason);
                        text = Some(cause_text(cause));
                    }
                    ToolResult::Refused(error) => text = Some(error.to_string()),
                }
            }
        }
        e.error = text.as_deref();
        if let Some(sink) = &self.cx.audit {
            e.at_unix_ms = self.cx.clock().unix_ms();
            sink.record(&e);
        }
        telemetry::transition(self.span, &e);
    }
}
