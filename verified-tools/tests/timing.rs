//! Guarantees under real timing (issue 9): late arrivals, long replica lag,
//! key-bucket edges, and every path that could still duplicate, hang or
//! panic. Each test is one of the cases, written from its
//! description, against a payment service with its own timing.
//!
//! The service runs its side of a request in a task of its own: a request
//! travels, may be applied after the client gave up, commits, and shows up in
//! the replica the verifier reads after a lag.
//!
//! Every case runs twice ([`both!`]): on paused time (a current-thread
//! runtime, durations as written), and in real time on a multi-thread
//! runtime with every duration, the policy's included, divided by ten. The
//! cases leave tens of milliseconds between the events they order at that
//! scale, so scheduling jitter does not reorder them.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::task::JoinSet;
use tokio::time::{Instant, sleep};
use verified_tools::engine::{self, Attempt};
use verified_tools::ledger::{Codec, MemoryLedger};
use verified_tools::{
    Backoff, CallError, Classify, Context, ErrorClass, IdempotencyKey, InFlight, Mode, Proof,
    RetryPolicy, SideEffect, TokioClock, ToolResult, ToolSpec, UnknownReason, Verdict,
    VerifyBudget,
};

/// How a case runs.
#[derive(Debug, Clone, Copy)]
struct Time {
    /// Every duration of the case is divided by this.
    divisor: u32,
    /// How late a measured wait may end (scheduling, timer granularity).
    slack: Duration,
}

impl Time {
    /// Paused tokio time on a current-thread runtime: exact.
    const PAUSED: Time = Time { divisor: 1, slack: Duration::ZERO };
    /// Real time on a multi-thread runtime, ten times faster.
    const REAL: Time = Time { divisor: 10, slack: Duration::from_millis(200) };

    fn ms(self, ms: u64) -> Duration {
        Duration::from_millis(ms) / self.divisor
    }

    fn secs(self, secs: u64) -> Duration {
        self.ms(secs * 1000)
    }

    /// `waited` is `expected`, give or take the slack (never earlier).
    fn assert_about(self, waited: Duration, expected: Duration, what: &str) {
        assert!(
            waited >= expected && waited <= expected + self.slack,
            "{what}: waited {waited:?}, expected {expected:?}"
        );
    }
}

/// One case, as two tests: `paused` and `multi_thread`.
macro_rules! both {
    ($(#[$doc:meta])* async fn $name:ident($t:ident: Time) $body:block) => {
        $(#[$doc])*
        mod $name {
            use super::*;

            #[tokio::test(start_paused = true)]
            async fn paused() {
                case(Time::PAUSED).await
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn multi_thread() {
                case(Time::REAL).await
            }

            async fn case($t: Time) $body
        }
    };
}

static PAY: ToolSpec = ToolSpec::new("pay", SideEffect::High).with_verifier();
static PAY_IRREVERSIBLE: ToolSpec = ToolSpec::new("pay", SideEffect::Irreversible);

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Timeout;

impl std::fmt::Display for Timeout {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("the payment service did not answer")
    }
}

impl Classify for Timeout {
    fn classify(&self) -> ErrorClass {
        ErrorClass::Ambiguous
    }
}

/// How the payment service behaves.
#[derive(Debug, Clone, Copy)]
struct Behaviour {
    honours_keys: bool,
    honours_deadlines: bool,
    /// Time a request travels to the server (and the answer back).
    travel: Duration,
    /// Time the first request travels, if it differs (a congested link).
    first_travel: Option<Duration>,
    /// Time from arrival until the payment is committed.
    commit: Duration,
    /// Time from commit until the replica the verifier reads shows it.
    lag: Duration,
    /// Time a verifier read takes.
    read: Duration,
}

/// A service that answers at once (10 ms each way, 5 ms to commit).
fn quick(t: Time) -> Behaviour {
    Behaviour {
        honours_keys: false,
        honours_deadlines: false,
        travel: t.ms(10),
        first_travel: None,
        commit: t.ms(5),
        lag: Duration::ZERO,
        read: t.ms(2),
    }
}

#[derive(Debug, Default)]
struct Ledgers {
    /// Payments applied, with the key they carried and when they show.
    applied: Vec<(IdempotencyKey, Instant)>,
    requests: u32,
}

#[derive(Debug, Clone)]
struct Payments {
    how: Behaviour,
    state: Arc<Mutex<Ledgers>>,
}

impl Payments {
    fn new(how: Behaviour) -> Self {
        Self { how, state: Arc::default() }
    }

    fn payments(&self) -> usize {
        self.state.lock().unwrap().applied.len()
    }

    fn requests(&self) -> u32 {
        self.state.lock().unwrap().requests
    }

    /// One attempt: the server side runs on, whatever the client does.
    async fn pay(&self, attempt: Attempt) -> Result<u32, Timeout> {
        let first = {
            let mut state = self.state.lock().unwrap();
            state.requests += 1;
            state.requests == 1
        };
        let travel = self.how.first_travel.filter(|_| first).unwrap_or(self.how.travel);
        let (how, state) = (self.how, Arc::clone(&self.state));
        let deadline = attempt.deadline.instant();
        let server = tokio::spawn(async move {
            sleep(travel).await;
            if how.honours_deadlines && Instant::now() >= deadline {
                return false; // too late: dropped, never applied
            }
            {
                let mut state = state.lock().unwrap();
                if how.honours_keys && state.applied.iter().any(|(k, _)| *k == attempt.key) {
                    return true; // a duplicate: answered, not applied again
                }
                let shows = Instant::now() + how.commit + how.lag;
                state.applied.push((attempt.key, shows));
            }
            sleep(how.commit).await;
            true
        });
        let applied = server.await.unwrap_or(false);
        sleep(travel).await;
        if applied { Ok(1) } else { Err(Timeout) }
    }

    /// The verifier: reads the replica.
    async fn check(&self) -> Verdict<u32> {
        sleep(self.how.read).await;
        let now = Instant::now();
        let seen = self.state.lock().unwrap().applied.iter().filter(|(_, at)| *at <= now).count();
        if seen > 0 { Verdict::Holds(seen as u32) } else { Verdict::Absent }
    }
}

type Out = ToolResult<u32, Timeout>;

async fn pay(cx: &Context, spec: &'static ToolSpec, service: &Payments) -> Out {
    engine::call(
        cx,
        spec,
        &("order-7", 2500u32),
        &(),
        |attempt| service.pay(attempt),
        Some(|_| service.check()),
        Codec::serde(),
    )
    .await
}

async fn pay_unverified(cx: &Context, spec: &'static ToolSpec, service: &Payments) -> Out {
    engine::call(
        cx,
        spec,
        &("order-7", 2500u32),
        &(),
        |attempt| service.pay(attempt),
        engine::no_verifier(),
        Codec::serde(),
    )
    .await
}

/// The high class's policy at the case's scale: 3 verifier reads 250 ms
/// apart, backoff from 20 ms to 200 ms, a 120 s call deadline.
fn policy(t: Time, attempt: Duration, settle: Option<Duration>) -> RetryPolicy {
    RetryPolicy::for_class(SideEffect::High)
        .with_attempt_timeout(Some(attempt))
        .with_settle(settle)
        .with_backoff(Backoff::new(t.ms(20), 2, t.ms(200)))
        .with_verify(VerifyBudget::new(3, t.ms(250)))
        .with_call_timeout(t.secs(120))
}

fn cx_with(policy: RetryPolicy) -> Context {
    Context::new("billing").with_policy(SideEffect::High, policy).for_step("checkout-1", 3)
}

// ---------------------------------------------------------------- case 1

both! {
    /// A request delayed in the network lands after its attempt timed out:
    /// the first read says Absent, a retry would go out, then the first
    /// request lands. With no settle bound declared, that `Absent` is not
    /// believed.
    async fn case1_a_late_request_is_not_retried_over_when_nothing_bounds_it(t: Time) {
        let late = Behaviour { travel: t.secs(3), ..quick(t) };
        let service = Payments::new(late);
        let r = pay(&cx_with(policy(t, t.secs(1), None)), &PAY, &service).await;
        sleep(t.secs(5)).await; // let the late request land
        assert_eq!(service.payments(), 1, "{r:?}");
        assert_eq!(service.requests(), 1, "no retry without a believable Absent");
        assert!(matches!(r, ToolResult::Unknown { reason: UnknownReason::Unsettled, .. }), "{r:?}");
    }
}

both! {
    /// The same late request against a server that honours the attempt's
    /// deadline: it is dropped on arrival, so the verifier's `Absent` after
    /// the settle point is true, and the one retry pays once.
    async fn case1_a_server_honouring_deadlines_drops_the_late_request_and_the_retry_pays_once(
        t: Time
    ) {
        let late =
            Behaviour { first_travel: Some(t.ms(1500)), honours_deadlines: true, ..quick(t) };
        let service = Payments::new(late);
        let settle = Some(t.ms(200));
        let r = pay(&cx_with(policy(t, t.secs(1), settle)), &PAY, &service).await;
        sleep(t.secs(5)).await; // the late request arrives, and is dropped
        assert!(r.is_success(), "{r:?}");
        assert_eq!(service.requests(), 2);
        assert_eq!(service.payments(), 1);
    }
}

both! {
    /// Where the settle margin is shorter than the real delay and the server
    /// honours neither keys nor deadlines, the guarantee does not hold: this
    /// is the row "neither" of the guarantee table, shown here so that the
    /// docs cannot claim more.
    async fn case1_a_margin_shorter_than_the_delay_on_a_server_honouring_nothing_duplicates(
        t: Time
    ) {
        let late = Behaviour { first_travel: Some(t.secs(3)), ..quick(t) };
        let service = Payments::new(late);
        let settle = Some(t.ms(200));
        let r = pay(&cx_with(policy(t, t.secs(1), settle)), &PAY, &service).await;
        sleep(t.secs(5)).await;
        assert!(r.is_success(), "{r:?}");
        assert_eq!(service.payments(), 2, "the late request landed after the retry");
        // A margin that covers the delay: the late request is seen, not re-sent.
        let service = Payments::new(late);
        let settle = Some(t.ms(2500));
        let cx = cx_with(policy(t, t.secs(1), settle)).for_step("checkout-2", 1);
        let r = pay(&cx, &PAY, &service).await;
        sleep(t.secs(5)).await;
        assert!(matches!(r, ToolResult::Success { proof: Proof::Verifier, .. }), "{r:?}");
        assert_eq!(service.payments(), 1);
    }
}

both! {
    /// A commit that takes 1.5 s behind a 1 s attempt timeout (the PostgreSQL
    /// trigger of the issue), 40 payments at once: the uncommitted row is
    /// invisible; with a settle margin that covers the commit, the verifier
    /// sees it and nothing is retried.
    async fn case1_a_slow_commit_is_seen_once_settled_not_paid_twice(t: Time) {
        let slow = Behaviour { commit: t.ms(1500), ..quick(t) };
        let settle = Some(t.secs(2));
        let mut calls = JoinSet::new();
        for n in 0..40 {
            let service = Payments::new(slow);
            let cx = cx_with(policy(t, t.secs(1), settle)).for_step("checkout", n);
            calls.spawn(async move {
                let r = pay(&cx, &PAY, &service).await;
                sleep(t.secs(5)).await;
                (n, r, service.payments())
            });
        }
        while let Some(done) = calls.join_next().await {
            let (n, r, payments) = done.expect("a call panicked");
            assert_eq!(payments, 1, "payment {n}: {r:?}");
            assert!(r.is_success(), "payment {n}: {r:?}");
        }
    }
}

// ---------------------------------------------------------------- case 2

both! {
    /// Key-honouring server, answer lost after the write, replica lag 60 s:
    /// the call must not say NotApplied (the planner would pay again under a
    /// new key). It ends Unknown, and the same logical call re-issued after
    /// the lag proves the payment instead of paying twice.
    async fn case2_a_long_replica_lag_is_unknown_not_not_applied(t: Time) {
        let lagging =
            Behaviour { honours_keys: true, travel: t.ms(800), lag: t.secs(60), ..quick(t) };
        let service = Payments::new(lagging);
        let cx = cx_with(policy(t, t.secs(1), None));
        let r = pay(&cx, &PAY, &service).await;
        assert!(matches!(r, ToolResult::Unknown { .. }), "{r:?}");
        sleep(t.secs(61)).await;
        let again = pay(&cx, &PAY, &service).await;
        assert!(matches!(again, ToolResult::Success { .. }), "{again:?}");
        assert_eq!(service.payments(), 1);
        assert_eq!(service.requests(), 1, "the re-issue verified first and sent nothing");
    }
}

// ---------------------------------------------------------------- case 3

both! {
    /// With `Context::new` (5-minute buckets), a call dropped after its write
    /// applied and re-issued 1 s later across a bucket edge is still the
    /// same logical call: it verifies first and does not dispatch again.
    async fn case3_a_reissue_across_a_bucket_edge_verifies_first(t: Time) {
        let edge: u64 = 300_000; // the first 5-minute edge after the epoch, in ms
        let before_edge = t.ms(1600).as_millis() as u64;
        let clock = Arc::new(TokioClock::starting_at(edge - before_edge));
        let cx = Context::new("billing")
            .with_clock(clock)
            .with_policy(SideEffect::High, policy(t, t.secs(5), None));
        let service = Payments::new(Behaviour { travel: t.secs(1), ..quick(t) });
        // Dropped after the request left (and was applied), before the answer.
        let dropped = tokio::time::timeout(t.ms(1500), pay(&cx, &PAY, &service)).await;
        assert!(dropped.is_err());
        assert_eq!(service.payments(), 1, "applied before the call was dropped");
        sleep(t.secs(1)).await; // now past the bucket edge
        let again = pay(&cx, &PAY, &service).await;
        assert!(matches!(again, ToolResult::Success { .. }), "{again:?}");
        assert_eq!(service.requests(), 1, "verified first: not sent again");
        assert_eq!(service.payments(), 1);
    }
}

both! {
    /// An LLM that deliberately asks for the same reminder twice makes two
    /// tool calls with two ids: two effects. A re-issue of one id is one.
    async fn case3_tool_call_ids_tell_two_calls_from_a_reissue(t: Time) {
        let service = Payments::new(quick(t));
        let cx = Context::new("assistant")
            .with_policy(SideEffect::High, policy(t, t.secs(1), None));
        assert!(pay(&cx.for_tool_call("call_a1"), &PAY, &service).await.is_success());
        assert!(pay(&cx.for_tool_call("call_b2"), &PAY, &service).await.is_success());
        let replay = pay(&cx.for_tool_call("call_a1"), &PAY, &service).await;
        assert!(matches!(replay, ToolResult::Success { proof: Proof::Ledger, .. }), "{replay:?}");
        assert_eq!(service.payments(), 2, "two tool calls, two payments; the re-issue replays");
    }
}

// ---------------------------------------------------------------- case 4

both! {
    /// An irreversible tool without a verifier, retries allowed, answer lost
    /// after the payment: one dispatch, and no success claimed, in every
    /// mode.
    async fn case4_an_irreversible_call_in_doubt_is_never_dispatched_again(t: Time) {
        let lost = Behaviour { travel: t.ms(900), ..quick(t) };
        let one_retry = policy(t, t.secs(1), Some(Duration::ZERO)).with_retries(1);
        for mode in [Mode::VerifyBeforeRetry, Mode::RetryOnly, Mode::VerifyOnly] {
            let service = Payments::new(lost);
            let cx = Context::new("billing")
                .with_mode(mode)
                .with_policy(SideEffect::Irreversible, one_retry)
                .for_step("checkout", 1);
            let r = pay_unverified(&cx, &PAY_IRREVERSIBLE, &service).await;
            sleep(t.secs(2)).await;
            assert_eq!(service.requests(), 1, "{mode:?}: {r:?}");
            assert_eq!(service.payments(), 1, "{mode:?}");
            assert!(matches!(r, ToolResult::Escalated { .. }), "{mode:?}: {r:?}");
        }
    }
}

// ---------------------------------------------------------------- case 5

both! {
    /// No attempt timeout and a verifier that never answers: the call still
    /// ends, at its deadline, in doubt.
    async fn case5_a_verifier_that_never_answers_cannot_hang_the_call(t: Time) {
        let service = Payments::new(Behaviour { travel: t.secs(3600), ..quick(t) });
        let policy = policy(t, t.secs(1), None)
            .with_attempt_timeout(None)
            .with_call_timeout(t.secs(30));
        let cx = cx_with(policy);
        let started = Instant::now();
        let r: Out = engine::call(
            &cx,
            &PAY,
            &("order-7",),
            &(),
            |attempt| service.pay(attempt),
            Some(|_| std::future::pending::<Verdict<u32>>()),
            Codec::serde(),
        )
        .await;
        assert!(
            matches!(r, ToolResult::Unknown { reason: UnknownReason::DeadlineExceeded, .. }),
            "{r:?}"
        );
        t.assert_about(started.elapsed(), t.secs(30), "the call's deadline");
    }
}

both! {
    /// `InFlight::Wait { poll: 0, .. }` once spun without advancing time; a
    /// poll longer than the wait refused one poll late.
    async fn case5_waiting_for_a_key_in_flight_ends_at_its_limit(t: Time) {
        // The holder's call takes 10 s, the waiter gives up after 3.
        let service = Payments::new(Behaviour { travel: t.secs(5), ..quick(t) });
        let holder = cx_with(policy(t, t.secs(60), None));
        for (poll, max) in [(Duration::ZERO, t.secs(3)), (t.secs(10), t.secs(3))] {
            let waiter = holder.clone().with_in_flight(InFlight::Wait { poll, max });
            let step = format!("hold-{}", poll.as_millis());
            let (holder, waiter) = (holder.for_step(&step, 1), waiter.for_step(&step, 1));
            let first = pay(&holder, &PAY, &service);
            let second = async {
                sleep(t.ms(10)).await;
                let started = Instant::now();
                let r = pay(&waiter, &PAY, &service).await;
                (r, started.elapsed())
            };
            let (_, (r, waited)) = tokio::join!(first, second);
            assert!(matches!(r, ToolResult::Refused(CallError::InProgress { .. })), "{r:?}");
            // Paused: within the 1 ms tick; real: well before the next poll.
            let limit = Time { slack: t.slack.max(Duration::from_millis(4)), ..t };
            limit.assert_about(waited, max, &format!("poll {poll:?}"));
        }
    }
}

// ---------------------------------------------------------------- case 6

both! {
    /// Out-of-range policy values never panic inside the engine: a NaN
    /// jitter reaches the first retry (a settled `Absent`) and is clamped.
    async fn case6_a_nan_jitter_does_not_panic_at_the_first_retry(t: Time) {
        // The first request is dropped at the server's door (it honours
        // deadlines), so the settled `Absent` is true and the retry goes out.
        let late = Behaviour { first_travel: Some(t.ms(1500)), honours_deadlines: true, ..quick(t) };
        let service = Payments::new(late);
        let backoff = Backoff::new(t.ms(20), 2, t.ms(200)).with_jitter(f64::NAN, 1);
        let policy = policy(t, t.secs(1), Some(t.ms(200))).with_backoff(backoff);
        let r = pay(&cx_with(policy), &PAY, &service).await;
        assert!(r.is_success(), "{r:?}");
        assert_eq!(service.requests(), 2, "the retry went out");
    }
}

both! {
    /// A clock started at the end of time saturates instead of overflowing.
    async fn case6_a_clock_at_the_end_of_time_saturates(t: Time) {
        use verified_tools::Clock;
        let clock = TokioClock::starting_at(u64::MAX - 5);
        sleep(t.secs(1)).await;
        assert_eq!(clock.unix_ms(), u64::MAX);
    }
}

both! {
    /// A panic in the tool body is recorded as a call in doubt (so the next
    /// call with the key verifies first) before it reaches the caller.
    async fn case6_a_panicking_tool_leaves_its_key_in_doubt(t: Time) {
        let service = Payments::new(quick(t));
        let cx = cx_with(policy(t, t.secs(1), Some(Duration::ZERO)));
        let panicked = {
            let (cx, service) = (cx.clone(), service.clone());
            tokio::spawn(async move {
                let r: Out = engine::call(
                    &cx,
                    &PAY,
                    &("order-7", 2500u32),
                    &(),
                    |attempt| {
                        let service = service.clone();
                        async move {
                            let _ = service.pay(attempt).await; // applied, then the body panics
                            panic!("tool bug")
                        }
                    },
                    Some(|_| service.check()),
                    Codec::serde(),
                )
                .await;
                r
            })
            .await
        };
        assert!(panicked.unwrap_err().is_panic());
        let again = pay(&cx, &PAY, &service).await;
        assert!(matches!(again, ToolResult::Success { proof: Proof::Verifier, .. }), "{again:?}");
        assert_eq!(service.payments(), 1, "the next call verified first and sent nothing");
    }
}

// ---------------------------------------------------------------- case 8

both! {
    /// A lease shorter than the call could let a second holder in while the
    /// first still runs: such a configuration is refused, typed, before
    /// dispatch.
    async fn case8_a_lease_shorter_than_the_call_is_refused(t: Time) {
        let service = Payments::new(quick(t));
        let ledger = Arc::new(MemoryLedger::new().with_lease(t.secs(5)));
        let cx = cx_with(policy(t, t.secs(1), None)).with_ledger(ledger);
        let r = pay(&cx, &PAY, &service).await;
        assert!(matches!(r, ToolResult::Refused(CallError::LeaseTooShort { .. })), "{r:?}");
        assert_eq!(service.requests(), 0);
    }
}

both! {
    /// With a lease that outlasts the call, a second caller waits, then
    /// replays.
    async fn case8_two_callers_of_one_key_pay_once(t: Time) {
        let service = Payments::new(Behaviour { travel: t.secs(2), ..quick(t) });
        let cx = cx_with(policy(t, t.secs(10), None))
            .with_in_flight(InFlight::Wait { poll: t.ms(50), max: t.secs(30) });
        let (a, b) = tokio::join!(pay(&cx, &PAY, &service), pay(&cx, &PAY, &service));
        assert!(a.is_success() && b.is_success(), "{a:?} {b:?}");
        assert_eq!(service.payments(), 1);
        assert!(matches!(b, ToolResult::Success { proof: Proof::Ledger, .. }), "{b:?}");
    }
}
