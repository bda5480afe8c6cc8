//! The engine on a clock of its context's choosing, without a tokio runtime:
//! a virtual clock whose time moves only when every task waits (what tokio's
//! paused time does, written here in a few lines), and an executor that
//! polls one future on this thread. Any wait the engine made on tokio's
//! timers would panic here ("there is no reactor running").

use std::future::Future;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context as TaskContext, Poll, Wake, Waker};
use std::time::{Duration, Instant};

use verified_tools::engine::{self, Attempt};
use verified_tools::ledger::{Codec, MemoryLedger};
use verified_tools::{
    Clock, Context, ErrorClass, IdempotencyKey, InFlight, Proof, RetryPolicy, SideEffect, Sleep,
    ToolResult, ToolSpec, Verdict,
};

/// Virtual time: `now` moves to the earliest wait's end when nothing else
/// can run.
#[derive(Clone)]
struct Virtual(Arc<State>);

struct State {
    start: Instant,
    now: Mutex<Instant>,
    waits: Mutex<Vec<(Instant, Waker)>>,
}

impl Virtual {
    fn new() -> Self {
        let start = Instant::now();
        Self(Arc::new(State { start, now: Mutex::new(start), waits: Mutex::new(Vec::new()) }))
    }

    fn elapsed(&self) -> Duration {
        self.now() - self.0.start
    }

    /// Moves to the end of the earliest wait and wakes what ends then;
    /// `false` if nothing waits.
    fn advance(&self) -> bool {
        let mut waits = self.0.waits.lock().unwrap();
        let Some(next) = waits.iter().map(|(at, _)| *at).min() else { return false };
        *self.0.now.lock().unwrap() = next.max(self.now());
        let (due, later): (Vec<_>, Vec<_>) = waits.drain(..).partition(|(at, _)| *at <= next);
        *waits = later;
        drop(waits);
        due.into_iter().for_each(|(_, waker)| waker.wake());
        true
    }
}

impl Clock for Virtual {
    fn unix_ms(&self) -> u64 {
        1_700_000_000_000 + self.elapsed().as_millis() as u64
    }

    fn now(&self) -> Instant {
        *self.0.now.lock().unwrap()
    }

    fn sleep_until(&self, at: Instant) -> Sleep {
        let state = Arc::clone(&self.0);
        Sleep::new(std::future::poll_fn(move |task| {
            if *state.now.lock().unwrap() >= at {
                return Poll::Ready(());
            }
            state.waits.lock().unwrap().push((at, task.waker().clone()));
            Poll::Pending
        }))
    }
}

struct Flag(AtomicBool);

impl Wake for Flag {
    fn wake(self: Arc<Self>) {
        self.0.store(true, Ordering::SeqCst);
    }
}

/// Polls `future` on this thread, advancing `clock` whenever it waits.
fn block_on<F: Future>(clock: &Virtual, future: F) -> F::Output {
    let flag = Arc::new(Flag(AtomicBool::new(false)));
    let waker = Waker::from(Arc::clone(&flag));
    let mut task = TaskContext::from_waker(&waker);
    let mut future = std::pin::pin!(future);
    loop {
        if let Poll::Ready(output) = future.as_mut().poll(&mut task) {
            return output;
        }
        if !flag.0.swap(false, Ordering::SeqCst) {
            assert!(clock.advance(), "the call waits on something other than its clock");
        }
    }
}

#[derive(Debug, thiserror::Error)]
#[error("no answer")]
struct NoAnswer;

impl verified_tools::Classify for NoAnswer {
    fn classify(&self) -> ErrorClass {
        ErrorClass::Ambiguous
    }
}

/// One call of `spec` for "bob": `dispatch` makes each attempt, `verify`
/// reads the postcondition.
async fn send_bob<D, DF, V, VF>(
    cx: &Context,
    spec: &'static ToolSpec,
    dispatch: D,
    verify: V,
) -> ToolResult<u32, NoAnswer>
where
    D: FnMut(Attempt) -> DF,
    DF: Future<Output = Result<u32, NoAnswer>>,
    V: FnMut(IdempotencyKey) -> VF,
    VF: Future<Output = Verdict<u32>>,
{
    engine::call(cx, spec, &("bob",), &("bob",), dispatch, Some(verify), Codec::serde()).await
}

static SEND: ToolSpec = ToolSpec::new("send", SideEffect::High).with_verifier();

#[test]
fn a_call_times_out_verifies_waits_to_settle_and_retries_on_its_contexts_clock() {
    let clock = Virtual::new();
    let shared: Arc<dyn Clock> = Arc::new(clock.clone());
    let policy = RetryPolicy::for_class(SideEffect::High)
        .with_attempt_timeout(Some(Duration::from_secs(1)))
        .with_settle(Some(Duration::from_secs(2)))
        .with_call_timeout(Duration::from_secs(30));
    let cx = Context::new("agent")
        .with_clock(Arc::clone(&shared))
        .with_ledger(Arc::new(MemoryLedger::new().with_clock(shared)))
        .with_policy(SideEffect::High, policy);

    // The first attempt never answers (and was not applied); the second is.
    let sent = Mutex::new(Vec::new());
    let applied = Mutex::new(false);
    let result: ToolResult<u32, NoAnswer> = block_on(
        &clock,
        send_bob(
            &cx,
            &SEND,
            |attempt: Attempt| {
                sent.lock().unwrap().push((clock.elapsed(), attempt.deadline.instant()));
                let first = sent.lock().unwrap().len() == 1;
                let applied = &applied;
                async move {
                    if first {
                        std::future::pending::<()>().await;
                    }
                    *applied.lock().unwrap() = true;
                    Ok(7)
                }
            },
            |_key| async {
                match *applied.lock().unwrap() {
                    true => Verdict::Holds(7),
                    false => Verdict::Absent,
                }
            },
        ),
    );

    assert!(
        matches!(result, ToolResult::Success { value: 7, proof: Proof::Verifier, .. }),
        "{result:?}"
    );
    let sent = sent.into_inner().unwrap();
    assert_eq!(sent.len(), 2, "{sent:?}");
    // The first attempt's deadline is 1 s after the call's start, on the
    // context's clock.
    assert_eq!(sent[0].0, Duration::ZERO);
    assert_eq!(sent[0].1.into_std(), clock.0.start + Duration::from_secs(1));
    // The retry waited for the first attempt to settle: its deadline (1 s)
    // and the settle margin (2 s), measured on the virtual clock.
    assert!(sent[1].0 >= Duration::from_secs(3), "retried at {:?}", sent[1].0);
    assert!(sent[1].0 < Duration::from_secs(4), "retried at {:?}", sent[1].0);
}

#[test]
fn a_call_that_finds_its_key_held_polls_on_the_clock_and_replays_the_holders_outcome() {
    let clock = Virtual::new();
    let shared: Arc<dyn Clock> = Arc::new(clock.clone());
    let cx = Context::new("agent")
        .with_clock(Arc::clone(&shared))
        .with_ledger(Arc::new(MemoryLedger::new().with_clock(shared)))
        .with_in_flight(InFlight::Wait {
            poll: Duration::from_secs(1),
            max: Duration::from_secs(30),
        })
        .for_step("run-7", 1);
    let dispatches = Mutex::new(0);
    // The holder's service takes 5 s of the clock to answer.
    let call = || {
        send_bob(
            &cx,
            &SEND,
            |_: Attempt| {
                *dispatches.lock().unwrap() += 1;
                let answer = clock.sleep_until(clock.now() + Duration::from_secs(5));
                async move {
                    answer.await;
                    Ok::<u32, NoAnswer>(7)
                }
            },
            |_key| async { Verdict::Holds(7) },
        )
    };
    let (mut holder, mut repeat) = (Box::pin(call()), Box::pin(call()));
    let (mut first, mut second) = (None, None);
    block_on(
        &clock,
        std::future::poll_fn(|task| {
            if first.is_none()
                && let Poll::Ready(result) = holder.as_mut().poll(task)
            {
                first = Some((result, clock.elapsed()));
            }
            if second.is_none()
                && let Poll::Ready(result) = repeat.as_mut().poll(task)
            {
                second = Some((result, clock.elapsed()));
            }
            match (&first, &second) {
                (Some(_), Some(_)) => Poll::Ready(()),
                _ => Poll::Pending,
            }
        }),
    );
    let (first, at_first) = first.unwrap();
    let (second, at_second) = second.unwrap();
    assert!(matches!(first, ToolResult::Success { value: 7, .. }), "{first:?}");
    // The repeat waited for the holder, polling every second of the clock,
    // and got its outcome: nothing dispatched twice.
    assert!(
        matches!(second, ToolResult::Success { value: 7, proof: Proof::Ledger, .. }),
        "{second:?}"
    );
    assert_eq!(*dispatches.lock().unwrap(), 1);
    assert_eq!(at_first, Duration::from_secs(5));
    assert!(
        at_second >= at_first && at_second <= at_first + Duration::from_secs(1),
        "{at_second:?}"
    );
}

static HELD: ToolSpec = ToolSpec::new("send_held", SideEffect::High).with_verifier().with_holder();

#[test]
fn a_context_made_with_a_clock_keeps_its_default_ledger_on_that_clock() {
    let clock = Virtual::new();
    // No ledger given: the one `Context::new` made follows the clock.
    let cx = Context::new("agent").with_clock(Arc::new(clock.clone())).for_step("run", 1);
    let lease_left = Mutex::new(None);
    let result: ToolResult<u32, NoAnswer> = block_on(
        &clock,
        send_bob(
            &cx,
            &HELD,
            |attempt: Attempt| {
                let (clock, lease_left) = (&clock, &lease_left);
                async move {
                    // The service takes 5 s of the clock before it sends.
                    clock.sleep_until(clock.now() + Duration::from_secs(5)).await;
                    *lease_left.lock().unwrap() = attempt.holder.lease_left().await.ok().flatten();
                    Ok(7)
                }
            },
            |_key| async { Verdict::Holds(7) },
        ),
    );
    assert!(matches!(result, ToolResult::Success { value: 7, .. }), "{result:?}");
    // The memory ledger's lease (10 minutes) less the 5 s on the clock; a
    // ledger on tokio's clock would have seen no time pass.
    let left = lease_left.into_inner().unwrap().expect("the call holds its key");
    assert_eq!(left, Duration::from_secs(600 - 5));
}

#[test]
fn a_clock_set_on_a_clone_of_a_context_in_use_keeps_the_shared_ledger() {
    let clock = Virtual::new();
    let cx = Context::new("agent").with_clock(Arc::new(clock.clone())).for_step("run", 1);
    let dispatches = Mutex::new(0);
    let send = |cx: &Context| {
        let cx = cx.clone();
        let dispatches = &dispatches;
        async move {
            send_bob(
                &cx,
                &SEND,
                |_: Attempt| {
                    *dispatches.lock().unwrap() += 1;
                    async { Ok::<u32, NoAnswer>(7) }
                },
                |_key| async { Verdict::Holds(7) },
            )
            .await
        }
    };
    let first = block_on(&clock, send(&cx));
    assert!(matches!(first, ToolResult::Success { proof: Proof::Verifier, .. }), "{first:?}");
    // Another clock on a clone: the two contexts still share one ledger, so
    // the repeat is replayed, not sent again.
    let moved = cx.clone().with_clock(Arc::new(clock.clone()));
    let again = block_on(&clock, send(&moved));
    assert!(matches!(again, ToolResult::Success { proof: Proof::Ledger, .. }), "{again:?}");
    assert_eq!(*dispatches.lock().unwrap(), 1);
}
