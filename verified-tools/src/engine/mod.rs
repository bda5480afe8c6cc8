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

mod claim;
mod decide;
mod outcome;
mod verify;

pub use outcome::record_refusal;

use self::claim::Hold;
use self::outcome::Detail;

use std::any::Any;
use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::task::Poll;
use std::time::Duration;

use serde::Serialize;
use serde_json::value::RawValue;
use tokio::time::Instant;

use self::decide::{Event, Facts, Next, Rules, Stage};
use crate::audit::{CallIdentity, CallState};
use crate::clock;
use crate::deadline::Timeline;
use crate::key::payload::PayloadDigest;
use crate::key::{Derived, Payload};
use crate::ledger::{ClaimRequest, Codec, End, LedgerError, Progress};
use crate::telemetry;
use crate::tool::Tool;
use crate::{
    CallError, Cause, Classify, Context, Deadline, ErrorClass, IdempotencyKey, KeyScope,
    RetryPolicy, SideEffect, ToolResult, ToolSpec, UnknownReason, Verdict,
};

/// One attempt of a logical call, as the tool receives it.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct Attempt {
    /// The call's idempotency key: the same on every attempt.
    pub key: IdempotencyKey,
    /// This attempt's deadline, to forward to the server. Until it has
    /// passed, no other call can have taken the key over (a lease outlasts
    /// the call's deadline): [`Deadline::has_passed`] right before sending is
    /// the free "am I still the holder?" (see [`Holder`](crate::Holder)).
    pub deadline: Deadline,
    /// 1 for the first attempt under the key (earlier calls' attempts count).
    pub number: u32,
    /// The call's hold on its ledger record, for a tool that asks the store
    /// whether it still holds the key before it sends; filled for a
    /// [`ToolSpec`] made [`with_holder`](ToolSpec::with_holder), otherwise
    /// [`Holder::unrecorded`](crate::Holder::unrecorded).
    pub holder: crate::Holder,
    /// For a tool that commits its own record ([`Tool::commits_record`]),
    /// the claim to make in this attempt's transaction (its
    /// [`first`](ClaimRequest::first) progress is this attempt); `None` for
    /// every other tool, whose key the engine claims.
    pub claim: Option<ClaimRequest>,
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
    P: Payload + ?Sized,
    A: Serialize + ?Sized,
    D: FnMut(Attempt) -> DF,
    DF: Future<Output = Result<T, E>>,
    V: FnMut(IdempotencyKey) -> VF,
    VF: Future<Output = Verdict<T>>,
{
    run(cx, Closures { spec, dispatch, verify, codec }, payload, audit_args).await
}

/// Runs one logical call of any [`Tool`] through the engine: the one entry
/// point, which [`call`] and `#[verified_tool]` reach too.
///
/// `payload` is what the key is derived from (the tool's key-relevant
/// arguments, or an [`Effect`](crate::key::Effect)); `audit_args` is what
/// the audit and escalation tickets show (secrets redacted).
pub async fn run<X, P, A>(
    cx: &Context,
    tool: X,
    payload: &P,
    audit_args: &A,
) -> ToolResult<X::Output, X::Error>
where
    X: Tool,
    P: Payload + ?Sized,
    A: Serialize + ?Sized,
{
    let spec = tool.spec();
    let policy = Effective::new(cx, spec, tool.commits_record());
    let rules = Rules {
        class: spec.side_effect,
        mode: cx.mode(),
        verifier: tool.verifies(),
        retries: policy.retries,
        verify_response: policy.verify_response,
        check: cx.is_check(),
    };
    let started = Instant::from_std(cx.clock().now());
    let timeline =
        Timeline::new(started, policy.call_timeout, policy.attempt_timeout, policy.settle);
    let span = telemetry::call(cx, spec);
    let mut call = Call {
        cx,
        spec,
        span: &span,
        identity: CallIdentity::Explicit,
        policy,
        rules,
        facts: Facts::default(),
        timeline,
        started,
        key: None,
        stage: Stage::Deriving,
        hold: None,
        own_claim: None,
        first_recorded: false,
        planned: false,
        first_at: Some(Duration::ZERO),
        panic: None,
        value: None,
        cause: None,
        absent_seen: false,
        args: None,
        tool,
    };
    // Only the audit trail and escalation tickets show the arguments (a
    // span never records them), so a subscriber alone serializes nothing.
    if cx.audit.is_some() || cx.escalation.is_some() {
        call.args = serde_json::value::to_raw_value(audit_args).ok();
    }
    telemetry::in_span(&span, async {
        let result = call.bounded(payload).await;
        call.finish(result).await
    })
    .await
}

/// The tool [`call`] makes of its closures.
struct Closures<T, D, V> {
    spec: &'static ToolSpec,
    dispatch: D,
    verify: Option<V>,
    codec: Codec<T>,
}

impl<T, E, D, DF, V, VF> Tool for Closures<T, D, V>
where
    T: Clone + Send + Sync + 'static,
    E: Classify,
    D: FnMut(Attempt) -> DF,
    DF: Future<Output = Result<T, E>>,
    V: FnMut(IdempotencyKey) -> VF,
    VF: Future<Output = Verdict<T>>,
{
    type Output = T;
    type Error = E;

    fn spec(&self) -> &'static ToolSpec {
        self.spec
    }

    fn dispatch(&mut self, attempt: Attempt) -> impl Future<Output = Result<T, E>> {
        (self.dispatch)(attempt)
    }

    fn verifies(&self) -> bool {
        self.verify.is_some()
    }

    fn verify(&mut self, key: IdempotencyKey) -> impl Future<Output = Verdict<T>> {
        let read = self.verify.as_mut().map(|verify| verify(key));
        async move {
            match read {
                Some(read) => read.await,
                None => Verdict::Unknown,
            }
        }
    }

    fn codec(&self) -> Codec<T> {
        self.codec
    }
}

/// The value of a tool's success.
type Out<X> = <X as Tool>::Output;
/// The error of a tool's failed attempt.
type Fail<X> = <X as Tool>::Error;

/// The policy of one call: the class default by reference (it is large, and
/// the call's future carries it), with the tool's overrides resolved (one
/// rule: [`Context::policy_for`]). A tool whose attempt commits its record
/// with its effect has nothing to wait for and nothing to re-read: its
/// commit's answer is the proof, and a committed effect is visible at once.
struct Effective<'a> {
    base: &'a RetryPolicy,
    retries: u32,
    attempt_timeout: Option<Duration>,
    call_timeout: Duration,
    settle: Option<Duration>,
    verify_response: bool,
}

impl<'a> Effective<'a> {
    fn new(cx: &'a Context, spec: &ToolSpec, commits_record: bool) -> Self {
        let base = cx.policy_ref(spec.side_effect);
        let o = crate::context::Overrides::of(spec, base);
        Self {
            base,
            retries: o.retries,
            attempt_timeout: o.attempt_timeout,
            call_timeout: o.call_timeout,
            settle: if commits_record { Some(Duration::ZERO) } else { o.settle },
            verify_response: o.verify_response && !commits_record,
        }
    }
}

struct Call<'a, X: Tool> {
    cx: &'a Context,
    spec: &'static ToolSpec,
    /// Where the transitions go besides the audit sink.
    span: &'a telemetry::Span,
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
    /// The claim a tool that commits its own record makes in each attempt.
    own_claim: Option<ClaimRequest>,
    /// The claim recorded the first attempt already.
    first_recorded: bool,
    /// `Planned` was marked.
    planned: bool,
    /// When the first attempt goes out, if known without reading the clock
    /// (on the call's timeline): the call's start, or the claim after a wait
    /// for another call. `None` after anything else that may have waited
    /// (a verification of a record taken over, a slow store, an outage).
    first_at: Option<Duration>,
    /// The payload of the tool's panic, until the call unwinds with it.
    panic: Option<Box<dyn Any + Send>>,
    /// The value of the answer or of the verifier's `Holds`.
    value: Option<Out<X>>,
    /// The last failure.
    cause: Option<Cause<Fail<X>>>,
    absent_seen: bool,
    args: Option<Box<RawValue>>,
    tool: X,
}

impl<'a, X: Tool> Call<'a, X> {
    /// Runs the call within its deadline. A call that never waits (the tool
    /// answers on its first poll) never arms the timer. The first poll is
    /// made here rather than left to [`clock::within`] (which polls once
    /// more before it arms the timer): through `within` alone the success
    /// path cost ~200 Ir more, its future being larger.
    async fn bounded<P: Payload + ?Sized>(&mut self, payload: &P) -> ToolResult<Out<X>, Fail<X>> {
        let (timeline, cx) = (self.timeline, self.cx);
        let outcome = {
            let mut run = std::pin::pin!(self.run(payload));
            match std::future::poll_fn(|task| Poll::Ready(run.as_mut().poll(task))).await {
                Poll::Ready(result) => Some(result),
                Poll::Pending => {
                    clock::within(cx.clock(), timeline.call_deadline().into_std(), run).await
                }
            }
        };
        match outcome {
            Some(result) => result,
            None => self.expired(),
        }
    }

    /// The call's deadline struck: `decide` says what that means where the
    /// call was.
    fn expired(&mut self) -> ToolResult<Out<X>, Fail<X>> {
        if self.stage == Stage::Attempting {
            self.cause = Some(Cause::DeadlineReached(self.policy.call_timeout));
        }
        let event = Event::Expired(self.stage);
        match self.rules.next(&mut self.facts, event) {
            Next::Refused(refusal) => self.refused(refusal),
            Next::NotApplied => self.not_applied(),
            Next::Unresolved(reason) => self.unresolved(reason),
            // Unreachable: a deadline decides an ending.
            _ => self.unresolved(UnknownReason::DeadlineExceeded),
        }
    }

    async fn run<P: Payload + ?Sized>(&mut self, payload: &P) -> ToolResult<Out<X>, Fail<X>> {
        let derived = match self.derive(payload) {
            Ok(derived) => derived,
            Err(refused) => return refused,
        };
        // Reads are not recorded: replaying an old read would be a stale read.
        let ledger =
            self.cx.ledger.as_deref().filter(|_| self.spec.side_effect != SideEffect::None);
        let mut event = match ledger {
            // Its attempts claim the key in their own transactions.
            Some(_) if self.tool.commits_record() => {
                self.own_claim = Some(self.request(derived));
                Event::Claimed
            }
            Some(ledger) => match self.claim(ledger, derived).await {
                Ok(event) => event,
                Err(done) => return done,
            },
            None => Event::Unrecorded,
        };
        self.plan();
        self.stage = Stage::Running;
        loop {
            let next = self.rules.next(&mut self.facts, event);
            if decide::backs_off(event, next) {
                let delay = self.policy.base.backoff.delay(self.facts.attempts, self.key());
                clock::sleep(self.cx.clock(), delay).await;
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
                Next::Unwind => self.unwind().await,
                Next::Refused(refusal) => return self.refused(refusal),
            };
        }
    }

    /// Derives the key, once for the whole logical call.
    fn derive<P: Payload + ?Sized>(
        &mut self,
        payload: &P,
    ) -> Result<Derived, ToolResult<Out<X>, Fail<X>>> {
        let cx = self.cx;
        let tool = self.spec.name;
        let mut bucket = KeyScope::DEFAULT;
        let scope = cx.scope_for(self.spec, &mut bucket);
        self.identity = match scope {
            KeyScope::TimeBucket(width) => CallIdentity::Bucket(width.as_millis() as u64),
            _ => cx.scope().map_or(CallIdentity::Explicit, CallIdentity::of),
        };
        // Only a bucket reads the clock, and not when an effect identity
        // names the call.
        let bucketed = matches!(scope, KeyScope::TimeBucket(_) | KeyScope::Window { .. })
            && payload.effect().is_none();
        let derived = match cx.checked_key() {
            // A check of a bucketed call: the key of the bucket it was made
            // in, which is its own fingerprint (see `key`'s format).
            Some(key) if bucketed => {
                let fingerprint = PayloadDigest::from_u128(key.as_u128());
                Derived { key, fingerprint, previous: None }
            }
            _ => {
                let now = if bucketed { cx.clock().unix_ms() } else { 0 };
                // Only a ledger can find the previous bucket's record.
                let previous = cx.ledger.is_some();
                IdempotencyKey::derive_call(cx.agent(), tool, payload, scope, now, previous)
                    .map_err(|source| ToolResult::Refused(CallError::Payload { tool, source }))?
            }
        };
        self.key = Some(derived.key);
        Ok(derived)
    }

    /// Marks the call planned, once its key is final: after the claim,
    /// which may choose the previous bucket's record (a repeat across a
    /// bucket's end), so that every event of the call names the key of its
    /// result; or at its end, if it ends before (a refused claim).
    fn plan(&mut self) {
        if !self.planned && self.key.is_some() {
            self.planned = true;
            self.note(CallState::Planned, Detail::None);
        }
    }

    /// One attempt, with the call's key and the attempt's deadline.
    async fn attempt(&mut self) -> Event {
        let key = self.key();
        // The first attempt uses the time its claim recorded for it (the
        // call's start, unless the call waited): no second clock read on the
        // success path (its deadline is a little earlier, never later).
        let now = match (self.facts.attempts, self.first_at) {
            (0, Some(at)) => at,
            _ => self.timeline.at(self.now()),
        };
        let deadline = self.timeline.attempt(now);
        // Counted once announced: an attempt whose write-through failed
        // never left.
        let number = self.facts.attempts + 1;
        self.timeline.dispatched(deadline);
        if let Some(hold) = &self.hold
            && !std::mem::take(&mut self.first_recorded)
        {
            // Written through before the attempt goes out, so a call that
            // takes the key over after the lease inherits the count; and a
            // holder whose key was taken over stops here.
            let progress = Progress {
                attempts: number,
                after_ok: self.facts.after_ok,
                settle: self.timeline.settle(now),
            };
            if let Err(error) = hold.ledger.dispatching(key, hold.fence, progress).await {
                return self.halted(error);
            }
        }
        self.facts.attempts = number;
        let limit = deadline.saturating_sub(now);
        self.note(CallState::Dispatched, Detail::Dispatched(limit));
        self.stage = Stage::Attempting;
        let deadline = self.timeline.deadline(deadline);
        let holder = match (&self.hold, &self.cx.ledger) {
            (Some(hold), Some(ledger)) if self.spec.holder => {
                crate::Holder::new(std::sync::Arc::clone(ledger), key, hold.fence)
            }
            _ => crate::Holder::unrecorded(),
        };
        let claim = self.own_claim.map(|request| ClaimRequest {
            first: Progress { attempts: number, ..request.first },
            ..request
        });
        let attempt = Attempt { key, deadline, number, holder, claim };
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
                Event::Failed(class)
            }
            Ok(None) => {
                self.note(CallState::PendingVisibility, Detail::TimedOut(limit));
                // An attempt the call's deadline cut short timed out on the
                // call, not on its own timeout: say which (a 9 ms "timeout"
                // under a 1 s attempt timeout reads as a bug).
                self.cause = Some(match self.timeline.cut_by_call(now) {
                    true => Cause::DeadlineReached(self.policy.call_timeout),
                    false => Cause::TimedOut(limit),
                });
                Event::TimedOut
            }
            Err(panic) => {
                self.panic = Some(panic);
                Event::Panicked
            }
        }
    }

    /// Sends one attempt: `Ok(None)` when it ran past its deadline, `Err`
    /// with the payload when the tool panicked.
    async fn send(
        &mut self,
        attempt: Attempt,
        deadline: Deadline,
    ) -> Result<Option<Result<Out<X>, Fail<X>>>, Box<dyn Any + Send>> {
        let (tool, clock) = (&mut self.tool, self.cx.clock());
        let future = std::panic::catch_unwind(AssertUnwindSafe(|| tool.dispatch(attempt)))?;
        let mut future = std::pin::pin!(catch_unwind(future));
        // A tool that answers on its first poll never arms the timer: the
        // common case pays nothing for the timeout.
        let first = std::future::poll_fn(|task| Poll::Ready(future.as_mut().poll(task))).await;
        match first {
            Poll::Ready(answer) => answer.map(Some),
            Poll::Pending => {
                match clock::within(clock, deadline.instant().into_std(), future).await {
                    Some(answer) => answer.map(Some),
                    None => Ok(None),
                }
            }
        }
    }

    /// The tool panicked: its effect is in doubt. Recorded as such (so the
    /// next call with the key verifies first), then the panic goes on.
    async fn unwind(&mut self) -> ! {
        self.note(CallState::Unknown, Detail::Panicked);
        if let Some(hold) = self.hold.take() {
            let _ = hold.close(End::InDoubt).await;
        }
        let panic = self.panic.take().unwrap_or_else(|| Box::new("the tool panicked"));
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
        Event::Halted(reason)
    }

    /// Now, on the context's clock.
    fn now(&self) -> Instant {
        Instant::from_std(self.cx.clock().now())
    }

    fn key(&self) -> IdempotencyKey {
        // derive() sets the key before any phase runs.
        self.key.unwrap_or(IdempotencyKey::from_u128(0))
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
