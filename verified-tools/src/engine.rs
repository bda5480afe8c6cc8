//! The verify-before-retry engine: Algorithm 1 of the paper as a state
//! machine, with the retry-only and verify-only arms for comparison.
//!
//! A call moves through [`CallState`]s:
//!
//! ```text
//! Planned ─► Dispatched ─► Ok ───────────────────────────► VerifiedSuccess
//!               │  ▲        └─(verify_response)─┐
//!               │  │ Absent, budget left        ▼
//!               │  └──────────────────── PendingVisibility ─► Holds ─► VerifiedSuccess
//!               ├─► definitive error ─► VerifiedFailure     ├─► Absent, no budget ─► VerifiedFailure
//!               └─► ambiguous/conflict ─────────┘           └─► Unknown ×reads ─► Unknown / Escalated
//! ```
//!
//! Invariants, checked by property tests: never a retry without a verifier's
//! `Absent` (in the default mode, for tools with a verifier); never a
//! dispatch after `Holds`; the same key on every attempt; at most
//! `1 + retries` dispatches per key, across repeated, cancelled and
//! taken-over calls (the ledger carries the count).

use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::sync::Arc;
use std::task::Poll;
use std::time::Duration;

use serde::Serialize;
use serde_json::value::RawValue;
use tokio::time::{Instant, sleep, timeout};

use crate::audit::{AuditEvent, CallState};
use crate::escalation::Ticket;
use crate::ledger::{Begin, Doubt, Finish, Hold, Ledger};
use crate::{
    CallError, Cause, Classify, Context, ErrorClass, IdempotencyKey, KeyScope, Mode, PayloadDigest,
    Proof, RetryPolicy, SideEffect, ToolResult, ToolSpec, UnknownReason, Verdict,
};

/// The verifier type of a tool that has none; see [`no_verifier`].
pub type NoVerifier<T> = fn(IdempotencyKey) -> std::future::Ready<Verdict<T>>;

/// `None`, typed as a verifier, for tools without one.
pub const fn no_verifier<T>() -> Option<NoVerifier<T>> {
    None
}

/// Runs one logical call of a tool through the engine.
///
/// `payload` is what the key is derived from (the tool's key-relevant
/// arguments); `audit_args` is what the audit and escalation tickets show
/// (secrets redacted). `dispatch` performs one attempt with the call's key;
/// `verify` reads the postcondition (it gets the key as well, for services
/// that answer "what became of the request with this key"). This is what `#[verified_tool]`
/// generates a call to; it can be used by hand as well.
///
/// ```
/// use verified_tools::{engine, Context, SideEffect, ToolResult, ToolSpec, Verdict};
/// use std::io;
///
/// static SEND: ToolSpec = ToolSpec::new("send", SideEffect::High).with_verifier();
///
/// # #[tokio::main(flavor = "current_thread", start_paused = true)] async fn main() {
/// let cx = Context::new("agent");
/// let mut attempts = 0;
/// let result: ToolResult<u32, io::Error> = engine::call(
///     &cx, &SEND, &("bob",), &("bob",),
///     |_key| { attempts += 1; async { Err(io::ErrorKind::TimedOut.into()) } },
///     Some(|_key| async { Verdict::Holds(7) }),
/// ).await;
/// // The response was lost, the verifier saw the effect: no retry.
/// assert!(matches!(result, ToolResult::Success { value: 7, .. }));
/// assert_eq!(attempts, 1);
/// # }
/// ```
pub async fn call<T, E, P, A, D, DF, V, VF>(
    cx: &Context,
    spec: &'static ToolSpec,
    payload: &P,
    audit_args: &A,
    dispatch: D,
    verify: Option<V>,
) -> ToolResult<T, E>
where
    T: Clone + Send + Sync + 'static,
    E: Classify,
    P: Serialize + ?Sized,
    A: Serialize + ?Sized,
    D: FnMut(IdempotencyKey) -> DF,
    DF: Future<Output = Result<T, E>>,
    V: FnMut(IdempotencyKey) -> VF,
    VF: Future<Output = Verdict<T>>,
{
    let policy = Effective::new(cx, spec);
    let mut call = Call {
        cx,
        spec,
        policy,
        key: None,
        attempts: 0,
        started: cx.audit.as_ref().map(|_| Instant::now()),
        args: None,
        claim: None,
        dispatch,
        verify,
    };
    if cx.audit.is_some() || cx.escalation.is_some() {
        call.args = serde_json::value::to_raw_value(audit_args).ok();
    }
    let result = call.run(payload).await;
    call.finish(&result);
    result
}

/// The policy of one call: the class default by reference (it is large, and
/// the call's future carries it), with the tool's overrides resolved; the
/// same values as [`Context::policy_for`] (one rule: `context::overrides`).
struct Effective<'a> {
    base: &'a RetryPolicy,
    retries: u32,
    attempt_timeout: Option<Duration>,
    verify_response: bool,
}

impl<'a> Effective<'a> {
    fn new(cx: &'a Context, spec: &ToolSpec) -> Self {
        let base = cx.policy_ref(spec.side_effect);
        let (retries, attempt_timeout, verify_response) = crate::context::overrides(spec, base);
        Self { base, retries, attempt_timeout, verify_response }
    }
}

/// Where the state machine goes next.
enum Phase<T, E> {
    Dispatch,
    Verify { cause: Cause<E> },
    Done(ToolResult<T, E>),
}

struct Call<'a, D, V> {
    cx: &'a Context,
    spec: &'static ToolSpec,
    policy: Effective<'a>,
    key: Option<IdempotencyKey>,
    attempts: u32,
    started: Option<Instant>,
    args: Option<Box<RawValue>>,
    claim: Option<Claim<'a>>,
    dispatch: D,
    verify: Option<V>,
}

impl<'a, D, V> Call<'a, D, V> {
    async fn run<T, E, P, DF, VF>(&mut self, payload: &P) -> ToolResult<T, E>
    where
        T: Clone + Send + Sync + 'static,
        E: Classify,
        P: Serialize + ?Sized,
        D: FnMut(IdempotencyKey) -> DF,
        DF: Future<Output = Result<T, E>>,
        V: FnMut(IdempotencyKey) -> VF,
        VF: Future<Output = Verdict<T>>,
    {
        let digest = match self.derive(payload) {
            Ok(digest) => digest,
            Err(refused) => return refused,
        };
        // Reads are not recorded: replaying an old read would be a stale read.
        let recorded = self.spec.side_effect != SideEffect::None;
        let mut phase = match self.cx.ledger.as_deref().filter(|_| recorded) {
            Some(ledger) => match self.claim(ledger, digest).await {
                Ok(phase) => phase,
                Err(refused) => return refused,
            },
            None => Phase::Dispatch,
        };
        loop {
            phase = match phase {
                Phase::Dispatch => self.dispatch().await,
                // Boxed: only failures verify, and the verifier's future would
                // otherwise make every call's future larger.
                Phase::Verify { cause } => Box::pin(self.verify(cause)).await,
                Phase::Done(result) => return result,
            };
        }
    }

    /// Derives the key, once for the whole logical call.
    fn derive<T, E, P>(&mut self, payload: &P) -> Result<PayloadDigest, ToolResult<T, E>>
    where
        P: Serialize + ?Sized,
    {
        let cx = self.cx;
        let tool = self.spec.name;
        let mut bucket = KeyScope::DEFAULT;
        let scope = cx.scope_for(self.spec, &mut bucket);
        let now = match scope {
            KeyScope::TimeBucket(_) => cx.clock().unix_ms(),
            _ => 0,
        };
        let (key, digest) =
            IdempotencyKey::derive_with_fingerprint(cx.agent(), tool, payload, scope, now)
                .map_err(|source| ToolResult::Refused(CallError::Payload { tool, source }))?;
        self.key = Some(key);
        self.audit(CallState::Planned, None, None, None);
        Ok(digest)
    }

    /// Claims the key in the ledger: a repeat returns the recorded outcome, a
    /// call in doubt is verified first, a call in flight is waited for.
    async fn claim<'l, T, E>(
        &mut self,
        ledger: &'l dyn Ledger,
        digest: PayloadDigest,
    ) -> Result<Phase<T, E>, ToolResult<T, E>>
    where
        'l: 'a,
        T: Clone + Send + Sync + 'static,
    {
        let (cx, tool, key) = (self.cx, self.spec.name, self.key());
        let mut waited = Duration::ZERO;
        loop {
            let begin = ledger
                .begin(key, digest)
                .map_err(|e| ToolResult::Refused(CallError::Ledger { tool, key, message: e.0 }))?;
            match begin {
                Begin::Claimed(hold) => {
                    self.claim = Some(Claim { ledger, key, hold, doubt: Doubt::default() });
                    return Ok(Phase::Dispatch);
                }
                Begin::Resume(hold, doubt) => {
                    // The budget is per logical call: earlier attempts count.
                    self.attempts = doubt.attempts;
                    self.claim = Some(Claim { ledger, key, hold, doubt });
                    return Ok(self.resume(doubt));
                }
                Begin::Completed(stored) => {
                    return match stored.downcast_ref::<T>() {
                        Some(value) => Ok(Phase::Done(ToolResult::Success {
                            value: value.clone(),
                            proof: Proof::Ledger,
                            key,
                        })),
                        None => Err(ToolResult::Refused(CallError::KeyReuse { tool, key })),
                    };
                }
                Begin::Mismatch => {
                    return Err(ToolResult::Refused(CallError::KeyReuse { tool, key }));
                }
                Begin::InFlight => match cx.in_flight() {
                    crate::InFlight::Wait { poll, max } if waited < max => {
                        sleep(poll).await;
                        waited += poll;
                    }
                    _ => return Err(ToolResult::Refused(CallError::InProgress { tool, key })),
                },
            }
        }
    }

    /// Where a call picks up a key that earlier calls left in doubt.
    fn resume<T, E>(&mut self, doubt: Doubt) -> Phase<T, E> {
        let verifies = self.verify.is_some() && self.cx.mode() != Mode::RetryOnly;
        if verifies {
            // The earlier call may have applied the effect: look first.
            let cause = if doubt.after_ok { Cause::Unconfirmed } else { Cause::Interrupted };
            return Phase::Verify { cause };
        }
        let blind_retry = self.cx.mode() != Mode::VerifyOnly
            && !doubt.after_ok
            && self.spec.side_effect != SideEffect::Irreversible
            && self.attempts <= self.policy.retries;
        if blind_retry {
            // No verifier (or retry-only mode): the key is the only guard.
            Phase::Dispatch
        } else {
            self.unresolved(UnknownReason::RetriesExhausted, Verdict::Unknown, Cause::Interrupted)
        }
    }

    /// One attempt, with the call's key.
    async fn dispatch<T, E, DF, VF>(&mut self) -> Phase<T, E>
    where
        E: Classify,
        D: FnMut(IdempotencyKey) -> DF,
        DF: Future<Output = Result<T, E>>,
        V: FnMut(IdempotencyKey) -> VF,
    {
        let key = self.key();
        self.attempts += 1;
        if let Some(claim) = &mut self.claim {
            claim.doubt = Doubt { attempts: self.attempts, after_ok: false };
            // Written through before the attempt goes out, so a call that
            // takes the key over after the lease inherits the count; and a
            // holder whose key was taken over stops here.
            if !claim.ledger.dispatching(key, claim.hold, claim.doubt) {
                self.attempts -= 1;
                self.claim = None;
                let cause = Cause::Interrupted;
                return Phase::Done(ToolResult::Unknown {
                    reason: UnknownReason::Superseded,
                    cause,
                    key,
                });
            }
        }
        self.audit(CallState::Dispatched, None, None, None);
        let mut attempt = std::pin::pin!((self.dispatch)(key));
        // A tool that answers on its first poll never arms the timer (nor
        // reads the clock): the common case pays nothing for the timeout.
        let first = std::future::poll_fn(|task| Poll::Ready(attempt.as_mut().poll(task))).await;
        let outcome = match (first, self.policy.attempt_timeout) {
            (Poll::Ready(answer), _) => Ok(answer),
            (Poll::Pending, Some(limit)) => {
                timeout(limit, attempt).await.map_err(|_| Cause::TimedOut(limit))
            }
            (Poll::Pending, None) => Ok(attempt.await),
        };
        let cause = match outcome {
            Ok(Ok(value)) => {
                let confirm = self.policy.verify_response && self.verify.is_some();
                return if confirm && self.cx.mode() != Mode::RetryOnly {
                    if let Some(claim) = &mut self.claim {
                        claim.doubt.after_ok = true;
                        claim.ledger.dispatching(key, claim.hold, claim.doubt);
                    }
                    Phase::Verify { cause: Cause::Unconfirmed }
                } else {
                    Phase::Done(ToolResult::Success { value, proof: Proof::Response, key })
                };
            }
            Ok(Err(error)) => match error.classify() {
                ErrorClass::Definitive => {
                    self.audit(
                        CallState::VerifiedFailure,
                        None,
                        Some(ErrorClass::Definitive),
                        None,
                    );
                    return Phase::Done(ToolResult::Failed { error, key });
                }
                class => {
                    self.audit(CallState::PendingVisibility, None, Some(class), Some("error"));
                    Cause::Error(error)
                }
            },
            Err(timed_out) => {
                self.audit(
                    CallState::PendingVisibility,
                    None,
                    Some(ErrorClass::Ambiguous),
                    Some("timeout"),
                );
                timed_out
            }
        };
        let wait = self.policy.base.backoff.delay(self.attempts, key);
        let verifies = self.verify.is_some() && self.cx.mode() != Mode::RetryOnly;
        if verifies {
            sleep(wait).await;
            Phase::Verify { cause }
        } else if self.cx.mode() != Mode::VerifyOnly && self.attempts <= self.policy.retries {
            // Retry-only mode, or a tool without a verifier (none/low classes):
            // the key is all that guards against duplicates.
            sleep(wait).await;
            Phase::Dispatch
        } else {
            self.unresolved(UnknownReason::RetriesExhausted, Verdict::Unknown, cause)
        }
    }

    /// Reads the verifier until it gives a believable answer or the read
    /// budget runs out.
    async fn verify<T, E, VF>(&mut self, cause: Cause<E>) -> Phase<T, E>
    where
        V: FnMut(IdempotencyKey) -> VF,
        VF: Future<Output = Verdict<T>>,
    {
        let key = self.key();
        let budget = self.policy.base.verify;
        let reads = budget.reads.max(1);
        // The tool answered OK: only the whole budget reading Absent outweighs
        // that answer (a single early read may just be a stale replica).
        let needed = match cause {
            Cause::Unconfirmed => reads,
            _ => budget.absent_reads.clamp(1, reads),
        };
        let mut absent = 0;
        for read in 0..reads {
            if read > 0 {
                sleep(budget.interval).await;
            }
            let verdict = self.read_verifier().await;
            self.audit(CallState::PendingVisibility, Some(verdict.kind()), None, Some("verify"));
            match verdict {
                Verdict::Holds(value) => {
                    return Phase::Done(ToolResult::Success { value, proof: Proof::Verifier, key });
                }
                Verdict::Absent => {
                    absent += 1;
                    if absent >= needed {
                        return self.absent(cause);
                    }
                }
                Verdict::Unknown => absent = 0,
            }
        }
        self.unresolved(UnknownReason::VerifierInconclusive, Verdict::Unknown, cause)
    }

    /// The verifier confirmed the effect absent: retry if the mode and the
    /// budget allow, else report it.
    fn absent<T, E>(&mut self, cause: Cause<E>) -> Phase<T, E> {
        // After an OK answer the server has recorded the key: a retry with the
        // same key would replay the incomplete answer (or, on a server that
        // ignores keys, apply the effect again). Completing it is a new
        // logical call, the caller's decision.
        let replayable = !matches!(cause, Cause::Unconfirmed);
        // An irreversible call found in doubt by a later call (escalated, or
        // cancelled after dispatch) stays with the person it went to: a
        // repeat call must not buy a fresh retry budget.
        let resumed_irreversible = matches!(cause, Cause::Interrupted)
            && self.spec.side_effect == SideEffect::Irreversible;
        let retry = self.cx.mode() == Mode::VerifyBeforeRetry
            && replayable
            && !resumed_irreversible
            && self.attempts <= self.policy.retries;
        if retry {
            Phase::Dispatch
        } else if self.spec.side_effect == SideEffect::Irreversible {
            self.unresolved(UnknownReason::RetriesExhausted, Verdict::Absent, cause)
        } else {
            Phase::Done(ToolResult::NotApplied { cause, key: self.key() })
        }
    }

    /// The budget ran out in doubt: irreversible actions go to a person.
    fn unresolved<T, E>(
        &mut self,
        reason: UnknownReason,
        verdict: Verdict,
        cause: Cause<E>,
    ) -> Phase<T, E> {
        let key = self.key();
        if self.spec.side_effect != SideEffect::Irreversible {
            return Phase::Done(ToolResult::Unknown { reason, cause, key });
        }
        if let Some(escalation) = &self.cx.escalation {
            escalation.escalate(Ticket {
                key,
                tool: self.spec.name,
                agent: self.cx.agent().to_owned(),
                verdict,
                cause: describe(&cause).to_owned(),
                args: self.args.as_ref().map(|a| a.get().to_owned()),
            });
        }
        Phase::Done(ToolResult::Escalated { verdict, cause, key })
    }

    /// One verifier read: a panic, a timeout or a failed read is `Unknown`.
    async fn read_verifier<T, VF>(&mut self) -> Verdict<T>
    where
        V: FnMut(IdempotencyKey) -> VF,
        VF: Future<Output = Verdict<T>>,
    {
        let key = self.key();
        let Some(verify) = self.verify.as_mut() else {
            return Verdict::Unknown;
        };
        let Ok(read) = std::panic::catch_unwind(AssertUnwindSafe(|| verify(key))) else {
            return Verdict::Unknown;
        };
        let guarded = catch_unwind(read);
        let verdict = match self.policy.attempt_timeout {
            Some(limit) => timeout(limit, guarded).await.ok().flatten(),
            None => guarded.await,
        };
        verdict.unwrap_or(Verdict::Unknown)
    }

    fn key(&self) -> IdempotencyKey {
        // derive() sets the key before any phase runs.
        self.key.unwrap_or(IdempotencyKey::from_u128(0))
    }

    fn finish<T: Clone + Send + Sync + 'static, E>(&mut self, result: &ToolResult<T, E>) {
        // The ledger first: an audit sink that panics must not leave a
        // proven success recorded as in doubt.
        if let Some(claim) = self.claim.take() {
            // One key is one logical call with one budget: whatever did not
            // prove its effect stays recorded, so a repeat verifies first and
            // has only the attempts left (none after a contradicted OK).
            let dispatched = claim.doubt.attempts > 0 || claim.doubt.after_ok;
            let finish = match result {
                ToolResult::Success { value, .. } => Finish::Completed(Arc::new(value.clone())),
                _ if !dispatched => Finish::Released,
                ToolResult::Failed { .. } | ToolResult::NotApplied { .. } => {
                    Finish::Settled(claim.doubt)
                }
                _ => Finish::InDoubt(claim.doubt),
            };
            claim.close(finish);
        }
        if self.cx.audit.is_none() {
            return;
        }
        let (state, detail) = match result {
            ToolResult::Success { proof, .. } => (
                CallState::VerifiedSuccess,
                match proof {
                    Proof::Response => "response",
                    Proof::Verifier => "verifier",
                    Proof::Ledger => "ledger",
                },
            ),
            ToolResult::Failed { .. } | ToolResult::NotApplied { .. } => {
                (CallState::VerifiedFailure, result.label())
            }
            ToolResult::Unknown { .. } => (CallState::Unknown, result.label()),
            ToolResult::Escalated { .. } => (CallState::Escalated, result.label()),
            ToolResult::Refused(_) => (CallState::Refused, result.label()),
        };
        self.audit(state, None, None, Some(detail));
    }

    #[inline]
    fn audit(
        &self,
        state: CallState,
        verdict: Option<Verdict>,
        error: Option<ErrorClass>,
        detail: Option<&'static str>,
    ) {
        if let Some(sink) = &self.cx.audit {
            self.record(&**sink, state, verdict, error, detail);
        }
    }

    #[inline(never)]
    fn record(
        &self,
        sink: &dyn crate::audit::AuditSink,
        state: CallState,
        verdict: Option<Verdict>,
        error: Option<ErrorClass>,
        detail: Option<&'static str>,
    ) {
        sink.record(&AuditEvent {
            key: self.key,
            tool: self.spec.name,
            agent: self.cx.agent(),
            attempt: self.attempts,
            state,
            verdict,
            error,
            detail,
            elapsed: self.started.map_or(Duration::ZERO, |s| s.elapsed()),
            at_unix_ms: self.cx.clock().unix_ms(),
            args: if state == CallState::Planned { self.args.as_deref() } else { None },
        });
    }
}

fn describe<E>(cause: &Cause<E>) -> &'static str {
    match cause {
        Cause::Error(_) => "the tool returned an ambiguous error",
        Cause::TimedOut(_) => "an attempt timed out",
        Cause::Unconfirmed => "the tool answered OK but the postcondition was not found",
        Cause::Interrupted => "an earlier call with this key ended in doubt",
    }
}

/// A held ledger key. Dropped without `close` (the call's future was
/// cancelled), it leaves the record in doubt if anything was dispatched, so
/// the next call with the key verifies before it dispatches.
struct Claim<'a> {
    ledger: &'a dyn Ledger,
    key: IdempotencyKey,
    hold: Hold,
    /// Attempts under this key so far (earlier calls included).
    doubt: Doubt,
}

impl Claim<'_> {
    fn close(self, finish: Finish) {
        // Disarm the drop guard first: a backend whose `finish` panics must
        // not be called again while unwinding.
        let this = std::mem::ManuallyDrop::new(self);
        this.ledger.finish(this.key, this.hold, finish);
    }
}

impl Drop for Claim<'_> {
    fn drop(&mut self) {
        let in_doubt = self.doubt.attempts > 0 || self.doubt.after_ok;
        let finish = if in_doubt { Finish::InDoubt(self.doubt) } else { Finish::Released };
        self.ledger.finish(self.key, self.hold, finish);
    }
}

/// Polls `fut`, turning a panic into `None`.
async fn catch_unwind<F: Future>(fut: F) -> Option<F::Output> {
    let mut fut = std::pin::pin!(fut);
    std::future::poll_fn(move |cx| {
        match std::panic::catch_unwind(AssertUnwindSafe(|| fut.as_mut().poll(cx))) {
            Ok(Poll::Ready(value)) => Poll::Ready(Some(value)),
            Ok(Poll::Pending) => Poll::Pending,
            Err(_) => Poll::Ready(None),
        }
    })
    .await
}
