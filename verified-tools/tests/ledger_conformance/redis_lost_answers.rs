//! The Redis ledger when Redis's answers are lost on the way (issue 20): a
//! lossy proxy (`support/lossy.rs`) between the ledger and a real server
//! closes connections or stalls answers, after the server ran the command.
//!
//! Each lost answer is of an operation that did land, so the ledger must
//! send it again without harm (a claim gets its own hold back, a finish is
//! done, not fenced), and undo what a caller that never got its answer
//! would otherwise leave behind: a hold nobody knows of, an attempt counted
//! that never left. Then payments through links that lose 5 % and 20 % of
//! the answers: each is sent exactly once, and no call is told its budget
//! was spent by attempts that never went out.

use std::collections::HashMap;
use std::io;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use verified_tools::ledger::{
    Claimed, Codec, End, Ledger, LedgerError, Progress, RecordState, RedisLedger, Settle,
};
use verified_tools::{
    Context, InFlight, RetryPolicy, SideEffect, ToolResult, ToolSpec, Verdict, engine,
};

use crate::redis::unique_prefix;
use crate::suite;
use crate::support::lossy::{Loss, LossyProxy};
use crate::support::redis::RedisServer;

/// The timeout of each answer through the proxy: shorter than a stall, so a
/// stalled answer is one the client gave up on.
const ANSWER_TIMEOUT: Duration = Duration::from_millis(250);

/// A server of these tests: nothing to persist, so no fsync to wait for.
fn server() -> Option<RedisServer> {
    RedisServer::private_with(&["--appendonly", "no", "--save", ""])
}

async fn through(proxy: &LossyProxy, prefix: &str, retry_for: Duration) -> RedisLedger {
    let ledger = RedisLedger::connect_with_timeout(&proxy.url, ANSWER_TIMEOUT)
        .await
        .expect("redis answers through the proxy");
    ledger.with_prefix(prefix).with_retry_for(retry_for)
}

async fn direct(server: &RedisServer, prefix: &str) -> RedisLedger {
    RedisLedger::connect(&server.url).await.expect("redis answers").with_prefix(prefix)
}

/// Waits (on real time, bounded) until `done` holds of the record of `k`.
async fn until(
    ledger: &RedisLedger,
    k: verified_tools::IdempotencyKey,
    what: &str,
    done: impl Fn(Option<&verified_tools::ledger::RecordView>) -> bool,
) {
    let started = std::time::Instant::now();
    loop {
        let view = ledger.record(k).await.expect("the store reads");
        if done(view.as_ref()) {
            return;
        }
        assert!(started.elapsed() < Duration::from_secs(10), "{what}: the record is {view:?}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test]
async fn a_claim_whose_answer_was_lost_gets_its_own_hold_back() {
    let Some(server) = server() else { return };
    let proxy = LossyProxy::start(server.port(), 0.0, 0.0, 1).await;
    let prefix = unique_prefix();
    let (lossy, other) =
        (through(&proxy, &prefix, Duration::from_secs(5)).await, direct(&server, &prefix).await);
    for (n, how) in [(1, Loss::Close), (2, Loss::Stall)] {
        // A fresh key: the claim lands, its answer is lost, it is sent again
        // and answered with the hold it took, not "in flight" on it.
        let k = suite::key(n);
        proxy.lose_next(how);
        let fence = match lossy.claim(suite::request(k, suite::fp(1))).await {
            Ok(claim) => match claim.state {
                Claimed::Fresh(fence) => fence,
                other => panic!("{how:?}: the claim got {other:?}, not its own fresh hold"),
            },
            Err(error) => panic!("{how:?}: the claim failed: {error}"),
        };
        assert!(matches!(
            other.claim(suite::request(k, suite::fp(1))).await.unwrap().state,
            Claimed::InFlight(_)
        ));
        lossy.finish(k, fence, End::InDoubt).await.expect("the holder finishes");

        // A key in doubt: taken over; sent again, the same takeover.
        proxy.lose_next(how);
        match lossy.claim(suite::request(k, suite::fp(1))).await {
            Ok(claim) => match claim.state {
                Claimed::Resume(again, progress) => {
                    assert!(again > fence);
                    assert_eq!(progress.attempts, 1, "{how:?}: the progress as it was");
                    lossy.finish(k, again, End::Settled).await.expect("the holder finishes");
                }
                other => panic!("{how:?}: the takeover got {other:?}, not its own hold"),
            },
            Err(error) => panic!("{how:?}: the takeover failed: {error}"),
        }
    }
}

#[tokio::test]
async fn writes_whose_answers_were_lost_are_done_not_fenced() {
    let Some(server) = server() else { return };
    let proxy = LossyProxy::start(server.port(), 0.0, 0.0, 2).await;
    let prefix = unique_prefix();
    let lossy = through(&proxy, &prefix, Duration::from_secs(5)).await;
    for (n, how) in [(1, Loss::Close), (2, Loss::Stall)] {
        let k = suite::key(10 + n);
        let Claimed::Fresh(fence) =
            lossy.claim(suite::request(k, suite::fp(1))).await.unwrap().state
        else {
            panic!("a fresh key")
        };
        proxy.lose_next(how);
        let second = Progress { attempts: 2, after_ok: false, settle: Settle::NOW };
        let written = lossy.dispatching(k, fence, second).await;
        assert_eq!(written, Ok(()), "{how:?}: the write-through sent again");
        let view = lossy.record(k).await.unwrap().expect("a record");
        assert_eq!((view.state, view.progress.attempts), (RecordState::Held, 2));
        proxy.lose_next(how);
        let value = Json(5);
        let finished = lossy.finish(k, fence, End::Completed(&value)).await;
        assert_eq!(finished, Ok(()), "{how:?}: a finish that landed is done, not fenced");
        let claim = lossy.claim(suite::request(k, suite::fp(1))).await.unwrap();
        assert!(matches!(claim.state, Claimed::Completed(_)), "{claim:?}");
    }
}

#[tokio::test]
async fn what_a_caller_never_learnt_of_is_undone() {
    let Some(server) = server() else { return };
    let proxy = LossyProxy::start(server.port(), 0.0, 0.0, 3).await;
    let prefix = unique_prefix();
    // Retries end before a stalled answer comes: the caller gets an error.
    let impatient = through(&proxy, &prefix, Duration::from_millis(300)).await;
    let other = direct(&server, &prefix).await;

    // A claim that landed, answered to nobody: released (a fresh hold is
    // deleted), so the next call claims the key fresh, not in doubt.
    let k = suite::key(21);
    proxy.lose_next(Loss::Stall);
    let claim = impatient.claim(suite::request(k, suite::fp(1))).await;
    assert!(matches!(claim, Err(LedgerError::Unavailable(_))), "{claim:?}");
    until(&other, k, "the unanswered claim is released", |view| view.is_none()).await;
    let Claimed::Fresh(fence) = other.claim(suite::request(k, suite::fp(1))).await.unwrap().state
    else {
        panic!("the key is free again")
    };

    // A write-through that landed, answered to nobody: its caller did not
    // dispatch, and the attempt is taken back.
    let lossy = through(&proxy, &prefix, Duration::from_millis(300)).await;
    let k2 = suite::key(22);
    let Claimed::Fresh(fence2) = lossy.claim(suite::request(k2, suite::fp(1))).await.unwrap().state
    else {
        panic!("a fresh key")
    };
    proxy.lose_next(Loss::Stall);
    let second = Progress { attempts: 2, after_ok: false, settle: Settle::NOW };
    let written = lossy.dispatching(k2, fence2, second).await;
    assert!(matches!(written, Err(LedgerError::Unavailable(_))), "{written:?}");
    until(&other, k2, "the unsent attempt is taken back", |view| {
        view.is_some_and(|v| v.progress.attempts == 1)
    })
    .await;
    // The holder halts and says it is in doubt; a repeat has the budget of
    // the one attempt that went out.
    lossy.finish(k2, fence2, End::InDoubt).await.expect("the store answers again");
    match other.claim(suite::request(k2, suite::fp(1))).await.unwrap().state {
        Claimed::Resume(_, progress) => assert_eq!(progress.attempts, 1),
        state => panic!("in doubt, got {state:?}"),
    }
    other.finish(k, fence, End::Settled).await.unwrap();
}

// ---------------------------------------------------------------- payments

const PAYMENTS: u64 = 300;
const WORKERS: u64 = 3;
/// Concurrent calls per worker: they share its connection, as the tasks of
/// one process do.
const TASKS: u64 = 4;
/// Re-issues of one payment by one worker before it gives up: far more
/// than any run needs.
const REISSUES: u32 = 10;

static PAY: ToolSpec = ToolSpec::new("pay", SideEffect::High).with_verifier();

struct Json(u64);

impl verified_tools::ledger::Recorded for Json {
    fn local(&self) -> Arc<dyn std::any::Any + Send + Sync> {
        Arc::new(self.0)
    }

    fn encode(&self) -> Option<Vec<u8>> {
        serde_json::to_vec(&self.0).ok()
    }
}

/// What the run saw.
#[derive(Default)]
struct Books {
    /// Dispatches per payment.
    sent: HashMap<u64, u32>,
    /// Final outcome per (worker, payment).
    outcomes: HashMap<&'static str, u32>,
    /// Calls told the effect did not happen, with what they were told.
    not_applied: Vec<(u64, u64, String)>,
    /// (worker, payment) that never ended in a success.
    unresolved: Vec<(u64, u64, String)>,
    /// Calls refused because the key was in flight.
    in_progress: u32,
    calls: u32,
}

async fn payments_through_a_lossy_link(loss: f64, seed: u64) {
    let Some(server) = server() else { return };
    // A quarter of the losses stall (the client times out), the rest close
    // the connection.
    let proxy = LossyProxy::start(server.port(), loss, 0.25, seed).await;
    let prefix = unique_prefix();
    let lease = Duration::from_secs(4);
    let books = Arc::new(Mutex::new(Books::default()));
    let mut contexts = Vec::new();
    for _ in 0..WORKERS {
        let ledger = through(&proxy, &prefix, Duration::from_secs(3)).await.with_lease(lease);
        let policy = RetryPolicy::for_class(SideEffect::High)
            .with_attempt_timeout(Some(Duration::from_millis(500)))
            .with_call_timeout(lease)
            .with_settle(Some(Duration::ZERO));
        let cx = Context::new("payer")
            .with_ledger(Arc::new(ledger))
            .with_policy(SideEffect::High, policy)
            .with_in_flight(InFlight::Wait { poll: Duration::from_millis(20), max: lease * 2 });
        contexts.push(Arc::new(cx));
    }
    proxy.arm();
    let mut tasks = tokio::task::JoinSet::new();
    for (worker, cx) in contexts.iter().enumerate() {
        let worker = worker as u64;
        for task in 0..TASKS {
            let (cx, books) = (Arc::clone(cx), Arc::clone(&books));
            tasks.spawn(async move {
                // Each worker walks the payments from its own offset: they
                // meet on keys, as workers making the same calls do.
                let offset = worker * PAYMENTS / WORKERS;
                let mut order: Vec<u64> = (0..PAYMENTS).filter(|p| p % TASKS == task).collect();
                order.sort_by_key(|p| (p + PAYMENTS - offset) % PAYMENTS);
                for payment in order {
                    pay(&cx, &books, worker, payment).await;
                }
            });
        }
    }
    let run = async {
        while let Some(done) = tasks.join_next().await {
            done.expect("no worker panicked");
        }
    };
    let finished = tokio::time::timeout(Duration::from_secs(240), run).await.is_ok();
    proxy.disarm();
    let books = books.lock().unwrap();
    let never: Vec<u64> = (0..PAYMENTS).filter(|p| !books.sent.contains_key(p)).collect();
    let twice: Vec<(u64, u32)> =
        books.sent.iter().filter(|(_, n)| **n > 1).map(|(p, n)| (*p, *n)).collect();
    let summary = format!(
        "loss {loss}: {} calls, final outcomes {:?}, {} refused in progress on the way; \
         payments never sent {} {never:?}, sent twice {twice:?}; told not applied {}: {:?}; \
         unresolved {}: {:?}; proxy: {}",
        books.calls,
        books.outcomes,
        books.in_progress,
        never.len(),
        books.not_applied.len(),
        books.not_applied.iter().take(10).collect::<Vec<_>>(),
        books.unresolved.len(),
        books.unresolved.iter().take(10).collect::<Vec<_>>(),
        proxy.report(),
    );
    eprintln!("{summary}");
    assert!(finished, "the run did not end in time: {summary}");
    assert!(never.is_empty() && twice.is_empty(), "each payment once: {summary}");
    assert!(books.not_applied.is_empty(), "nothing was told it did not happen: {summary}");
    assert!(books.unresolved.is_empty(), "every call ends in a success: {summary}");
    assert_eq!(books.outcomes.get("success"), Some(&((PAYMENTS * WORKERS) as u32)), "{summary}");
}

/// One worker's payment: re-issued, as an agent would, until it is known to
/// have happened.
async fn pay(cx: &Context, books: &Mutex<Books>, worker: u64, payment: u64) {
    let cx = cx.for_step("payments", payment);
    let mut last = String::new();
    for _ in 0..=REISSUES {
        let result: ToolResult<u64, io::Error> = engine::call(
            &cx,
            &PAY,
            &(payment,),
            &(payment,),
            |_attempt| {
                *books.lock().unwrap().sent.entry(payment).or_insert(0) += 1;
                async move { Ok(payment) }
            },
            Some(|_key| {
                let sent = books.lock().unwrap().sent.contains_key(&payment);
                async move { if sent { Verdict::Holds(payment) } else { Verdict::Absent } }
            }),
            Codec::serde(),
        )
        .await;
        {
            let mut b = books.lock().unwrap();
            b.calls += 1;
            match &result {
                ToolResult::Success { .. } => {
                    *b.outcomes.entry("success").or_insert(0) += 1;
                    return;
                }
                ToolResult::NotApplied { cause, .. } => {
                    let sent = b.sent.get(&payment).copied().unwrap_or(0);
                    b.not_applied.push((worker, payment, format!("{cause:?}, sent {sent} times")));
                    *b.outcomes.entry("not_applied").or_insert(0) += 1;
                    return;
                }
                ToolResult::Refused(verified_tools::CallError::InProgress { .. }) => {
                    b.in_progress += 1
                }
                _ => {}
            }
        }
        last = format!("{result:?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let mut b = books.lock().unwrap();
    *b.outcomes.entry("unresolved").or_insert(0) += 1;
    b.unresolved.push((worker, payment, last));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn payments_through_a_link_losing_5_percent_of_answers_are_each_sent_once() {
    payments_through_a_lossy_link(0.05, 0x5eed_0005).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn payments_through_a_link_losing_20_percent_of_answers_are_each_sent_once() {
    payments_through_a_lossy_link(0.20, 0x5eed_0020).await;
}
