//! The verify-before-retry engine: Algorithm 1 of the paper as a state
//! machine, with the retry-only and verify-only arms for comparison.
//!
//! A call moves through [`CallState`]s:
//!
//! ```text
//! Planned ─► Dispatched ─► Ok ───────────────────────────► VerifiedSuccess
//!               │  ▲        └─(verify_response)─┐
//!               │  │ settled Absent, budget left ▼
//!               │  └──────────────────── PendingVisibility ─► Holds ─► VerifiedSuccess
//!               ├─► definitive error ─► VerifiedFailure     ├─► settled Absent, no budget ─► VerifiedFailure
//!               └─► ambiguous/conflict ─────────┘           └─► Unknown, or Absent too early ─► Unknown / Escalated
//! ```
//!
//! Every choice is made by one pure function (`decide.rs`, tested over its
//! whole table); this module carries the choices out: it claims the key in
//! the [ledger](crate::ledger), dispatches attempts with their key and
//! [`Deadline`], reads the verifier until the last attempt has settled, and
//! bounds the whole call by its deadline.
//!
//! Invariants: never a retry in doubt without a verifier's `Absent` read
//! after the settle point (in the default mode, for tools with a verifier);
//! never a dispatch after `Holds`; the same key on every attempt; at most
//! `1 + retries` dispatches per key across repeated, cancelled and taken-over
//! calls; an irreversible call in doubt is never dispatched again.

mod decide;

use std::any::Any;
use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::sync::Arc;
use std::task::Poll;
use std::time::Duration;

use serde::Serialize;
use serde_json::value::RawValue;
use tokio::time::{Instant, sleep, sleep_until, timeout_at};

use self::decide::{Event, Facts, Next, Rules};
use crate::audit::{AuditEvent, CallIdentity, CallState};
use crate::context::LedgerOutage;
use crate::deadline::Timeline;
use crate::escalation::Ticket;
use crate::key::Derived;
use crate::ledger::{
    ClaimRequest, Claimed, Codec, End, Fence, Ledger, LedgerError, Progress, Recorded, Replay,
};
use crate::telemetry;
use crate::{
    CallError, Cause, Classify, Context, Deadline, ErrorClass, IdempotencyKey, KeyScope, Proof,
    RetryPolicy, SideEffect, ToolResult, ToolSpec, UnknownReason, Verdict,
};

/// One attempt of a logical call, as the tool receives it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct Attempt {
    /// The call's idempotency key: the same on every attempt.
    pub key: IdempotencyKey,
    /// This attempt's deadline, to forward to the server.
    pub deadline: Deadline,
    /// 1 for the first attempt under the key (earlier calls' attempts count).
    pub number: u32,
}

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
/// (secrets redacted). `dispatch` performs one [`Attempt`]; `verify` reads the
/// postcondition (it gets the key as well, for services that answer "what
/// became of the request with this key"). `codec` says how a success's value
/// is kept in a ledger that stores records outside the process
/// ([`Codec::serde`], or [`Codec::unrecorded`] for a value that does not
/// serialize). This is what `#[verified_tool]` generates a call to; it can be
/// used by hand as well.
///
/// ```
/// use verified_tools::{engine, Context, SideEffect, ToolResult, ToolSpec, Verdict};
/// use verified_tools::ledger::Codec;
/// use std::io;
///
/// static SEND: ToolSpec = ToolSpec::new("send", SideEffect::High).with_verifier();
///
/// # #[tokio::main(flavor = "current_thread", start_paused = true)] async fn main() {
/// let cx = Context::new("agent");
/// let mut attempts = 0;
/// let result: ToolResult<u32, io::Error> = engine::call(
///     &cx, &SEND, &("bob",), &("bob",),
///     |_attempt| { attempts += 1; async { Err(io::ErrorKind::TimedOut.into()) } },
///     Some(|_key| async { Verdict::Holds(7) }),
///     Codec::serde(),
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
    codec: Codec<T>,
) -> ToolResult<T, E>
where
    T: Clone + Send + Sync + 'static,
    E: Classify,
    P: Serialize + ?Sized,
    A: Serialize + ?Sized,
    D: FnMut(Attempt) -> DF,
    DF: Future<Output = Result<T, E>>,
    V: FnMut(IdempotencyKey) -> VF,
    VF: Future<Output = Verdict<T>>,
{
    let policy = Effective::new(cx, spec);
    let rules = Rules {
        class: spec.side_effect,
        mode: cx.mode(),
        verifier: verify.is_some(),
        retries: policy.retries,
        verify_response: policy.verify_response,
    };
    let started = Instant::now();
    let timeline =
        Timeline::new(started, policy.call_timeout, policy.attempt_timeout, policy.settle);
    let span = telemetry::call(cx, spec);
    let mut call = Call {
        cx,
        spec,
        span: span.clone(),
        identity: CallIdentity::Explicit,
        policy,
        rules,
        facts: Facts::default(),
        timeline,
        started,
        key: None,
        stage: Stage::Deriving,
        hold: None,
        first_recorded: false,
        backoff: false,
        value: None,
        cause: None,
        absent_seen: false,
        args: None,
        dispatch,
        verify,
        codec,
    };
    if cx.audit.is_some() || cx.escalation.is_some() || telemetry::listening(&span) {
        call.args = serde_json::value::to_raw_value(audit_args).ok();
    }
    telemetry::instrument(span, async {
        let result = call.bounded(payload).await;
        call.finish(&result).await;
        result
    })
    .await
}

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

/// The policy of one call: the class default by reference (it is large, and
/// the call's future carries it), with the tool's overrides resolved (one
/// rule: [`Context::policy_for`]).
struct Effective<'a> {
    base: &'a RetryPolicy,
    retries: u32,
    attempt_timeout: Option<Duration>,
    call_timeout: Duration,
    settle: Option<Duration>,
    verify_response: bool,
}

impl<'a> Effective<'a> {
    fn new(cx: &'a Context, spec: &ToolSpec) -> Self {
        let base = cx.policy_ref(spec.side_effect);
        let o = crate::context::Overrides::of(spec, base);
        Self {
            base,
            retries: o.retries,
            attempt_timeout: o.attempt_timeout,
            call_timeout: o.call_timeout,
            settle: o.settle,
            verify_response: o.verify_response,
        }
    }
}

/// Where the call is, for the answer it gives when its deadline strikes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Stage {
    Deriving,
    Claiming,
    /// Another call holds the key.
    Waiting,
    Running,
    /// An attempt is out: its effect is in doubt until it answers.
    Attempting,
}

/// A held ledger key. Dropped while armed (the call's future was cancelled,
/// or unwound), it abandons the hold: the record stays in doubt, so the next
/// call with the key verifies before it dispatches.
struct Hold<'a> {
    ledger: &'a dyn Ledger,
    key: IdempotencyKey,
    fence: Fence,
}

impl Hold<'_> {
    async fn close(self, end: End<'_>) -> Result<(), LedgerError> {
        // Still armed while the store answers: cancelled mid-way, the drop
        // abandons the hold (a no-op if the end was written).
        let result = self.ledger.finish(self.key, self.fence, end).await;
        std::mem::forget(self);
        result
    }
}

impl Drop for Hold<'_> {
    fn drop(&mut self) {
        self.ledger.abandon(self.key, self.fence);
    }
}

/// A success's value, offered to the ledger.
struct Value<'v, T> {
    value: &'v T,
    codec: Codec<T>,
}

impl<T: Clone + Send + Sync + 'static> Recorded for Value<'_, T> {
    fn local(&self) -> Arc<dyn Any + Send + Sync> {
        Arc::new(self.value.clone())
    }

    fn encode(&self) -> Option<Vec<u8>> {
        self.codec.encode(self.value)
    }
}

struct Call<'a, T, E, D, V> {
    cx: &'a Context,
    spec: &'static ToolSpec,
    /// Where the transitions go besides the audit sink.
    span: telemetry::Span,
    /// What the key was derived from, for the audit.
    identity: CallIdentity<'a>,
    policy: Effective<'a>,
    rules: Rules,
    facts: Facts,
    timeline: Timeline,
    started: Instant,
    key: Option<IdempotencyKey>,
    stage: Stage,
    hold: Option<Hold<'a>>,
    /// The claim recorded the first attempt already.
    first_recorded: bool,
    /// The last attempt failed: back off before what comes next.
    backoff: bool,
    /// The value of the answer or of the verifier's `Holds`.
    value: Option<T>,
    /// The last failure.
    cause: Option<Cause<E>>,
    absent_seen: bool,
    args: Option<Box<RawValue>>,
    dispatch: D,
    verify: Option<V>,
    codec: Codec<T>,
}

impl<'a, T, E, D, V, DF, VF> Call<'a, T, E, D, V>
where
    T: Clone + Send + Sync + 'static,
    E: Classify,
    D: FnMut(Attempt) -> DF,
    DF: Future<Output = Result<T, E>>,
    V: FnMut(IdempotencyKey) -> VF,
    VF: Future<Output = Verdict<T>>,
{
    /// Runs the call within its deadline. A call that never waits (the tool
    /// answers on its first poll) never arms the timer.
    async fn bounded<P: Serialize + ?Sized>(&mut self, payload: &P) -> ToolResult<T, E> {
        let timeline = self.timeline;
        let outcome = {
            let mut run = std::pin::pin!(self.run(payload));
            match std::future::poll_fn(|task| Poll::Ready(run.as_mut().poll(task))).await {
                Poll::Ready(result) => Some(result),
                Poll::Pending => timeout_at(timeline.call_deadline(), run).await.ok(),
            }
        };
        match outcome {
            Some(result) => result,
            None => self.expired(),
        }
    }

    async fn run<P: Serialize + ?Sized>(&mut self, payload: &P) -> ToolResult<T, E> {
        let derived = match self.derive(payload) {
            Ok(derived) => derived,
            Err(refused) => return refused,
        };
        // Reads are not recorded: replaying an old read would be a stale read.
        let ledger =
            self.cx.ledger.as_deref().filter(|_| self.spec.side_effect != SideEffect::None);
        let mut event = match ledger {
            Some(ledger) => match self.claim(ledger, derived).await {
                Ok(event) => event,
                Err(done) => return done,
            },
            None => Event::Claimed,
        };
        self.stage = Stage::Running;
        loop {
            let next = self.rules.next(&mut self.facts, event);
            let backoff = std::mem::take(&mut self.backoff);
            if backoff && matches!(next, Next::Dispatch | Next::Verify) {
                sleep(self.policy.base.backoff.delay(self.facts.attempts, self.key())).await;
            }
            event = match next {
                Next::Dispatch => self.attempt().await,
                // Boxed: only failures verify, and the verifier's future would
                // otherwise make every call's future larger.
                Next::Verify => Box::pin(self.verify(event)).await,
                Next::Succeed => return self.succeed(event),
                Next::Fail => return self.failed(),
                Next::NotApplied => return self.not_applied(),
                Next::Unresolved(reason) => return self.unresolved(reason),
            };
        }
    }

    /// Derives the key, once for the whole logical call.
    fn derive<P: Serialize + ?Sized>(&mut self, payload: &P) -> Result<Derived, ToolResult<T, E>> {
        let cx = self.cx;
        let tool = self.spec.name;
        let mut bucket = KeyScope::DEFAULT;
        let scope = cx.scope_for(self.spec, &mut bucket);
        self.identity = match scope {
            KeyScope::TimeBucket(width) => CallIdentity::Bucket(width.as_millis() as u64),
            _ => cx.scope().map_or(CallIdentity::Explicit, CallIdentity::of),
        };
        let now = match scope {
            KeyScope::TimeBucket(_) => cx.clock().unix_ms(),
            _ => 0,
        };
        // Only a ledger can find the previous bucket's record.
        let previous = cx.ledger.is_some();
        let derived = IdempotencyKey::derive_call(cx.agent(), tool, payload, scope, now, previous)
            .map_err(|source| ToolResult::Refused(CallError::Payload { tool, source }))?;
        self.key = Some(derived.key);
        self.note(CallState::Planned, Detail::None);
        Ok(derived)
    }

    /// Claims the key in the ledger: a repeat returns the recorded outcome, a
    /// call in doubt is verified first, a call in flight is waited for.
    async fn claim(
        &mut self,
        ledger: &'a dyn Ledger,
        derived: Derived,
    ) -> Result<Event, ToolResult<T, E>> {
        let (cx, tool) = (self.cx, self.spec.name);
        let lease = ledger.lease();
        if lease < self.policy.call_timeout {
            let call_timeout = self.policy.call_timeout;
            return Err(ToolResult::Refused(CallError::LeaseTooShort {
                tool,
                lease,
                call_timeout,
            }));
        }
        self.stage = Stage::Claiming;
        let mut first = self.timeline;
        first.dispatched(first.attempt(Duration::ZERO));
        let mut request = ClaimRequest {
            key: derived.key,
            fingerprint: derived.fingerprint,
            previous: derived.previous,
            first: Progress { attempts: 1, after_ok: false, settle: first.settle(Duration::ZERO) },
            now: self.started,
        };
        let mut waited = Duration::ZERO;
        loop {
            let claim = match ledger.claim(request).await {
                Ok(claim) => claim,
                Err(_) if self.outage_tolerated() => return Ok(Event::Claimed),
                Err(source) => {
                    let key = derived.key;
                    return Err(ToolResult::Refused(CallError::Ledger { tool, key, source }));
                }
            };
            let key = claim.key;
            self.key = Some(key);
            match claim.state {
                Claimed::Fresh(fence) => {
                    self.hold = Some(Hold { ledger, key, fence });
                    self.first_recorded = true;
                    return Ok(Event::Claimed);
                }
                Claimed::Resume(fence, progress) => {
                    self.hold = Some(Hold { ledger, key, fence });
                    // The budget is per logical call: earlier attempts count.
                    self.facts.attempts = progress.attempts;
                    self.facts.after_ok = progress.after_ok;
                    let at = self.timeline.at(Instant::now());
                    self.timeline.resumed(at, progress.settle);
                    let cause =
                        if progress.after_ok { Cause::Unconfirmed } else { Cause::Interrupted };
                    self.cause = Some(cause);
                    return Ok(Event::Resumed);
                }
                Claimed::Completed(replay) => {
                    let value = match replay {
                        Replay::Local(value) => value.downcast_ref::<T>().cloned(),
                        Replay::Encoded(bytes) => self.codec.decode(&bytes),
                        Replay::Unrecorded => None,
                    };
                    return match value {
                        Some(value) => {
                            Err(ToolResult::Success { value, proof: Proof::Ledger, key })
                        }
                        None => Ok(Event::Unreplayable),
                    };
                }
                Claimed::Mismatch => {
                    return Err(ToolResult::Refused(CallError::KeyReuse { tool, key }));
                }
                Claimed::InFlight(lease_left) => match cx.in_flight() {
                    crate::InFlight::Wait { poll, max } if waited < max => {
                        self.stage = Stage::Waiting;
                        let step =
                            poll.max(Duration::from_millis(1)).min(max - waited).min(lease_left);
                        sleep(step.max(Duration::from_millis(1))).await;
                        waited += step;
                        self.stage = Stage::Claiming;
                        request.now = Instant::now();
                    }
                    _ => return Err(ToolResult::Refused(CallError::InProgress { tool, key })),
                },
            }
        }
    }

    /// Whether a low-risk call may go on while the ledger is unreachable.
    fn outage_tolerated(&self) -> bool {
        self.cx.ledger_outage() == LedgerOutage::ProceedLowRisk
            && self.spec.side_effect <= SideEffect::Low
    }

    /// One attempt, with the call's key and the attempt's deadline.
    async fn attempt(&mut self) -> Event {
        let key = self.key();
        // The first attempt uses the call's start: no second clock read on
        // the success path (its deadline is a little earlier, never later).
        let now = if self.facts.attempts == 0 {
            Duration::ZERO
        } else {
            self.timeline.at(Instant::now())
        };
        let deadline = self.timeline.attempt(now);
        self.facts.attempts += 1;
        self.timeline.dispatched(deadline);
        if let Some(hold) = &self.hold
            && !std::mem::take(&mut self.first_recorded)
        {
            // Written through before the attempt goes out, so a call that
            // takes the key over after the lease inherits the count; and a
            // holder whose key was taken over stops here.
            let progress = Progress {
                attempts: self.facts.attempts,
                after_ok: self.facts.after_ok,
                settle: self.timeline.settle(now),
            };
            if let Err(error) = hold.ledger.dispatching(key, hold.fence, progress).await {
                self.facts.attempts -= 1;
                return self.halted(error);
            }
        }
        let limit = deadline.saturating_sub(now);
        self.note(CallState::Dispatched, Detail::Dispatched(limit));
        self.stage = Stage::Attempting;
        let deadline = self.timeline.deadline(deadline);
        let attempt = Attempt { key, deadline, number: self.facts.attempts };
        let answer = self.send(attempt, deadline).await;
        self.stage = Stage::Running;
        match answer {
            Ok(Some(Ok(value))) => {
                self.value = Some(value);
                Event::Answered
            }
            Ok(Some(Err(error))) => {
                let class = error.classify();
                // A definitive error ends the call: its terminal event says it.
                if class != ErrorClass::Definitive {
                    self.note(CallState::PendingVisibility, Detail::Failed(class, &error));
                }
                self.cause = Some(Cause::Error(error));
                self.backoff = true;
                Event::Failed(class)
            }
            Ok(None) => {
                self.note(CallState::PendingVisibility, Detail::TimedOut(limit));
                self.cause = Some(Cause::TimedOut(limit));
                self.backoff = true;
                Event::TimedOut
            }
            Err(panic) => self.panicked(panic).await,
        }
    }

    /// Sends one attempt: `Ok(None)` when it ran past its deadline, `Err`
    /// with the payload when the tool panicked.
    async fn send(
        &mut self,
        attempt: Attempt,
        deadline: Deadline,
    ) -> Result<Option<Result<T, E>>, Box<dyn Any + Send>> {
        let future = std::panic::catch_unwind(AssertUnwindSafe(|| (self.dispatch)(attempt)))?;
        let mut future = std::pin::pin!(catch_unwind(future));
        // A tool that answers on its first poll never arms the timer: the
        // common case pays nothing for the timeout.
        let first = std::future::poll_fn(|task| Poll::Ready(future.as_mut().poll(task))).await;
        match first {
            Poll::Ready(answer) => answer.map(Some),
            Poll::Pending => match timeout_at(deadline.instant(), future).await {
                Ok(answer) => answer.map(Some),
                Err(_) => Ok(None),
            },
        }
    }

    /// The tool panicked: its effect is in doubt. Recorded as such (so the
    /// next call with the key verifies first), then the panic goes on.
    async fn panicked(&mut self, panic: Box<dyn Any + Send>) -> Event {
        self.facts.in_doubt = true;
        self.note(CallState::Unknown, Detail::Panicked);
        if let Some(hold) = self.hold.take() {
            let _ = hold.close(End::InDoubt).await;
        }
        std::panic::resume_unwind(panic)
    }

    /// The ledger refused or lost a write-through: nothing more goes out.
    fn halted(&mut self, error: LedgerError) -> Event {
        let reason = match error {
            LedgerError::Fenced(_) => {
                // Another call owns the key now: our hold is gone.
                if let Some(hold) = self.hold.take() {
                    std::mem::forget(hold);
                }
                UnknownReason::Superseded
            }
            _ => UnknownReason::LedgerUnavailable,
        };
        self.facts.in_doubt = true;
        Event::Halted(reason)
    }

    /// Reads the verifier until the effect is shown, or shown absent after
    /// the last attempt settled, or the reads run out.
    async fn verify(&mut self, after: Event) -> Event {
        if after == Event::Answered {
            // An OK answer the verifier must confirm: the service may still
            // hide it for the settle margin. Nothing more goes out under the
            // key (a takeover must know).
            let now = self.timeline.at(Instant::now());
            self.timeline.dispatched(now);
            self.cause = Some(Cause::Unconfirmed);
            if let Some(hold) = &self.hold {
                let progress = Progress {
                    attempts: self.facts.attempts,
                    after_ok: true,
                    settle: self.timeline.settle(now),
                };
                if let Err(error) = hold.ledger.dispatching(hold.key, hold.fence, progress).await {
                    return self.halted(error);
                }
            }
        }
        let budget = self.policy.base.verify;
        for read in 0..budget.reads.max(1) {
            if read > 0 {
                sleep(budget.interval).await;
            }
            if let Some(event) = self.read().await {
                return event;
            }
        }
        // The reads ran out before the last attempt settled: wait for it and
        // read once more, if the call's deadline comes later.
        if let Some(at) = self.timeline.settles_in_time()
            && self.timeline.at(Instant::now()) < at
        {
            sleep_until(self.timeline.instant(at)).await;
            if let Some(event) = self.read().await {
                return event;
            }
        }
        Event::Inconclusive { absent_seen: self.absent_seen }
    }

    /// One verifier read: an event if it settles the question.
    async fn read(&mut self) -> Option<Event> {
        // The read saw the state as of when it started: that is the time to
        // hold against the settle point.
        let started = self.timeline.at(Instant::now());
        let verdict = self.read_verifier().await;
        let settled = self.timeline.settled(started);
        self.note(CallState::PendingVisibility, Detail::Read(verdict.kind(), settled));
        match verdict {
            Verdict::Holds(value) => {
                self.value = Some(value);
                Some(Event::Holds)
            }
            Verdict::Absent if settled => Some(Event::Absent),
            Verdict::Absent => {
                self.absent_seen = true;
                None
            }
            Verdict::Unknown => None,
        }
    }

    /// One verifier read: a panic, a timeout or a failed read is `Unknown`.
    async fn read_verifier(&mut self) -> Verdict<T> {
        let key = self.key();
        let Some(verify) = self.verify.as_mut() else {
            return Verdict::Unknown;
        };
        let Ok(read) = std::panic::catch_unwind(AssertUnwindSafe(|| verify(key))) else {
            return Verdict::Unknown;
        };
        let guarded = catch_unwind(read);
        // Bounded by the attempt timeout; without one, by the call deadline.
        let verdict = match self.policy.attempt_timeout {
            Some(limit) => timeout_at(crate::deadline::later(Instant::now(), limit), guarded)
                .await
                .ok()
                .and_then(Result::ok),
            None => guarded.await.ok(),
        };
        verdict.unwrap_or(Verdict::Unknown)
    }

    fn succeed(&mut self, event: Event) -> ToolResult<T, E> {
        let key = self.key();
        let proof = match event {
            Event::Answered => Proof::Response,
            _ if self.facts.completed => Proof::Ledger,
            _ => Proof::Verifier,
        };
        match self.value.take() {
            Some(value) => ToolResult::Success { value, proof, key },
            // Unreachable: both events that succeed store a value first.
            None => self.unresolved(UnknownReason::VerifierInconclusive),
        }
    }

    fn failed(&mut self) -> ToolResult<T, E> {
        match self.cause.take() {
            Some(Cause::Error(error)) => ToolResult::Failed { error, key: self.key() },
            // Unreachable: only a definitive error fails.
            other => ToolResult::NotApplied {
                cause: other.unwrap_or(Cause::Interrupted),
                key: self.key(),
            },
        }
    }

    fn not_applied(&mut self) -> ToolResult<T, E> {
        ToolResult::NotApplied {
            cause: self.cause.take().unwrap_or(Cause::Interrupted),
            key: self.key(),
        }
    }

    /// Nothing more can be done in doubt: irreversible actions go to a person.
    fn unresolved(&mut self, reason: UnknownReason) -> ToolResult<T, E> {
        let key = self.key();
        let cause = self.cause.take().unwrap_or(Cause::Interrupted);
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

    /// The call's deadline struck: what can be said of it.
    fn expired(&mut self) -> ToolResult<T, E> {
        let (tool, key) = (self.spec.name, self.key());
        match self.stage {
            Stage::Deriving | Stage::Claiming => {
                let source =
                    LedgerError::Unavailable("no answer within the call's deadline".into());
                ToolResult::Refused(CallError::Ledger { tool, key, source })
            }
            Stage::Waiting => ToolResult::Refused(CallError::InProgress { tool, key }),
            Stage::Running | Stage::Attempting => {
                if self.stage == Stage::Attempting {
                    self.facts.in_doubt = true;
                    self.cause = Some(Cause::TimedOut(self.policy.call_timeout));
                }
                if self.facts.in_doubt {
                    self.unresolved(UnknownReason::DeadlineExceeded)
                } else {
                    self.not_applied()
                }
            }
        }
    }

    fn key(&self) -> IdempotencyKey {
        // derive() sets the key before any phase runs.
        self.key.unwrap_or(IdempotencyKey::from_u128(0))
    }

    async fn finish(&mut self, result: &ToolResult<T, E>) {
        // The ledger first: an audit sink that panics must not leave a
        // proven success recorded as in doubt.
        if let Some(hold) = self.hold.take() {
            // One key is one logical call with one budget: whatever did not
            // prove its effect stays recorded, so a repeat verifies first and
            // has only the attempts left (none after a contradicted OK).
            let written = match result {
                ToolResult::Success { value, .. } => {
                    hold.close(End::Completed(&Value { value, codec: self.codec })).await
                }
                ToolResult::Failed { .. } | ToolResult::NotApplied { .. } => {
                    hold.close(End::Settled).await
                }
                _ => hold.close(End::InDoubt).await,
            };
            if written.is_err() {
                // The record stays held until its lease ends, then in doubt:
                // the next call verifies first. Nothing is lost.
                self.note(CallState::PendingVisibility, Detail::LedgerLost);
            }
        }
        let state = match result {
            ToolResult::Success { .. } => CallState::VerifiedSuccess,
            ToolResult::Failed { .. } | ToolResult::NotApplied { .. } => CallState::VerifiedFailure,
            ToolResult::Unknown { .. } => CallState::Unknown,
            ToolResult::Escalated { .. } => CallState::Escalated,
            ToolResult::Refused(_) => CallState::Refused,
        };
        self.note(state, Detail::Ended(result));
    }

    /// The one hook of every transition: the audit sink and the span.
    #[inline]
    fn note(&self, state: CallState, detail: Detail<'_, T, E>) {
        if self.cx.audit.is_some() || telemetry::listening(&self.span) {
            self.emit(state, detail);
        }
    }

    #[inline(never)]
    fn emit(&self, state: CallState, detail: Detail<'_, T, E>) {
        let mut text = None;
        let mut e = AuditEvent {
            at_unix_ms: self.cx.clock().unix_ms(),
            agent: self.cx.agent(),
            tool: self.spec.name,
            key: self.key,
            call: self.identity,
            state,
            attempt: self.facts.attempts,
            elapsed_ms: self.started.elapsed().as_millis() as u64,
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
                text = Some(error.to_string());
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
                        text = Some(error.to_string());
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
            sink.record(&e);
        }
        telemetry::transition(&self.span, &e);
    }
}

/// What a transition adds to its event.
enum Detail<'d, T, E> {
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
        Cause::Error(error) => error.to_string(),
        Cause::TimedOut(limit) => format!("no answer within {} ms", limit.as_millis()),
        other => describe(other).to_owned(),
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

/// Polls `fut`, returning a panic's payload instead of unwinding.
async fn catch_unwind<F: Future>(fut: F) -> Result<F::Output, Box<dyn Any + Send>> {
    let mut fut = std::pin::pin!(fut);
    std::future::poll_fn(move |cx| {
        match std::panic::catch_unwind(AssertUnwindSafe(|| fut.as_mut().poll(cx))) {
            Ok(Poll::Ready(value)) => Poll::Ready(Ok(value)),
            Ok(Poll::Pending) => Poll::Pending,
            Err(panic) => Poll::Ready(Err(panic)),
        }
    })
    .await
}
