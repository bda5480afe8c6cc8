//! The engine at its edges: a record completed without a value, a first
//! attempt that follows a wait, a check with nothing recorded, verification
//! rounds, and the key a repeat across a bucket's end is known by. Each test
//! failed before the fix it names (a review of the engine found them).
use std::io;
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use verified_tools::ledger::{Codec, Ledger, MemoryLedger, Resolution};
use verified_tools::{
    Context, IdempotencyKey, RetryPolicy, SideEffect, ToolResult, ToolSpec, Verdict, VerifyBudget,
    engine,
};

static HIGH: ToolSpec = ToolSpec::new("send", SideEffect::High).with_verifier();

type Out = ToolResult<u32, io::Error>;

/// `send (1)` on `cx`, with `dispatch` and `verify`: the call these tests
/// make.
async fn send<D, DF, V, VF>(cx: &Context, dispatch: D, verify: V) -> Out
where
    D: FnMut(engine::Attempt) -> DF,
    DF: Future<Output = Result<u32, io::Error>>,
    V: FnMut(IdempotencyKey) -> VF,
    VF: Future<Output = Verdict<u32>>,
{
    engine::call(cx, &HIGH, &(1u8,), &(1u8,), dispatch, Some(verify), Codec::serde()).await
}

fn policy() -> RetryPolicy {
    RetryPolicy::for_class(SideEffect::High)
        .with_attempt_timeout(Some(Duration::from_millis(100)))
        .with_call_timeout(Duration::from_secs(1))
        .with_settle(Some(Duration::ZERO))
        .with_verify(VerifyBudget::new(1, Duration::from_millis(10)))
}

/// A call the ledger records as completed (a person resolved it Applied)
/// is repeated; its verifier is slow, and the call's deadline strikes while
/// it reads. The effect happened (the ledger says so): `NotApplied` is false.
#[tokio::test(start_paused = true)]
async fn a_completed_call_is_not_reported_not_applied_when_the_deadline_strikes() {
    let ledger = Arc::new(MemoryLedger::new());
    let cx = Context::new("a").with_ledger(ledger.clone()).with_policy(SideEffect::High, policy());
    // 1. The first call: the attempt times out, the verifier cannot tell.
    let r: Out = send(
        &cx,
        |_a| async { Err(io::ErrorKind::TimedOut.into()) },
        |_k| async { Verdict::Unknown },
    )
    .await;
    assert!(matches!(r, ToolResult::Unknown { .. }), "{r:?}");
    let key = r.key().unwrap();
    // 2. A person looks and resolves it: applied.
    ledger.resolve(key, Resolution::Applied).await.unwrap();
    // 3. The repeat: its verifier hangs past the call's deadline (no
    // attempt timeout bounds the read, only the call's deadline).
    let cx = cx.with_policy(SideEffect::High, policy().with_attempt_timeout(None));
    let sent = AtomicU32::new(0);
    let r: Out = send(
        &cx,
        |_a| {
            sent.fetch_add(1, Ordering::SeqCst);
            async { Ok(1) }
        },
        |_k| async {
            tokio::time::sleep(Duration::from_secs(60)).await;
            Verdict::Unknown
        },
    )
    .await;
    assert_eq!(sent.load(Ordering::SeqCst), 0);
    assert!(!matches!(r, ToolResult::NotApplied { .. }), "the ledger says completed, got {r:?}");
}

/// The same with a verifier that answers Unknown fast and a read budget
/// whose intervals outlast the deadline (no attempt timeout involved).
#[tokio::test(start_paused = true)]
async fn a_completed_call_is_not_reported_not_applied_when_reads_outlast_the_deadline() {
    let ledger = Arc::new(MemoryLedger::new());
    let p = policy().with_verify(VerifyBudget::new(10, Duration::from_millis(300)));
    let cx = Context::new("a").with_ledger(ledger.clone()).with_policy(SideEffect::High, p);
    let r: Out = send(
        &cx,
        |_a| async { Err(io::ErrorKind::TimedOut.into()) },
        |_k| async { Verdict::Unknown },
    )
    .await;
    let key = r.key().unwrap();
    ledger.resolve(key, Resolution::Applied).await.unwrap();
    let r: Out = send(&cx, |_a| async { Ok(1) }, |_k| async { Verdict::Unknown }).await;
    assert!(!matches!(r, ToolResult::NotApplied { .. }), "the ledger says completed, got {r:?}");
}

/// A record a person resolved not applied (its attempts cleared) is taken
/// over; the verifier needs two reads (2 s apart) to say `Absent`, then the
/// first attempt of this call goes out. Its deadline must be its own timeout
/// (1 s) from when it is sent, not from the call's start.
#[tokio::test(start_paused = true)]
async fn the_first_attempt_after_a_resume_gets_its_whole_timeout() {
    let ledger = Arc::new(MemoryLedger::new());
    let p = policy()
        .with_attempt_timeout(Some(Duration::from_secs(1)))
        .with_call_timeout(Duration::from_secs(30))
        .with_verify(VerifyBudget::new(3, Duration::from_secs(2)));
    let cx = Context::new("a").with_ledger(ledger.clone()).with_policy(SideEffect::High, p);
    let r: Out = send(
        &cx,
        |_a| async { Err(io::ErrorKind::TimedOut.into()) },
        |_k| async { Verdict::Unknown },
    )
    .await;
    let key = r.key().unwrap();
    ledger.resolve(key, Resolution::NotApplied).await.unwrap();
    let reads = AtomicU32::new(0);
    let remaining = std::sync::Mutex::new(Vec::new());
    let r: Out = send(
        &cx,
        |a| {
            remaining.lock().unwrap().push((a.number, a.deadline.remaining()));
            async {
                tokio::time::sleep(Duration::from_millis(500)).await;
                Ok(1)
            }
        },
        |_k| {
            let n = reads.fetch_add(1, Ordering::SeqCst);
            async move {
                if n == 0 {
                    Verdict::Unknown
                } else if n == 1 {
                    Verdict::Absent
                } else {
                    Verdict::Holds(1)
                }
            }
        },
    )
    .await;
    let remaining = remaining.lock().unwrap().clone();
    println!("attempts (number, remaining): {remaining:?}; result {r:?}");
    assert_eq!(remaining.len(), 1);
    assert_eq!(remaining[0].1, Duration::from_secs(1), "deadline measured from the call's start");
    assert!(r.is_success(), "{r:?}");
}

/// The consequence: the resumed call's first attempt is cut at once (its
/// deadline passed before it was sent), and its settle point (deadline +
/// margin) is already behind: a verifier's `Absent` read right after it is
/// believed while the request is still on its way, and a second attempt
/// goes out. The service (ignoring keys, as the settle margin allows) lands
/// both: two effects.
#[tokio::test(start_paused = true)]
async fn a_resumed_call_never_retries_while_its_first_attempt_may_still_land() {
    let ledger = Arc::new(MemoryLedger::new());
    let p = policy()
        .with_attempt_timeout(Some(Duration::from_secs(1)))
        .with_call_timeout(Duration::from_secs(30))
        .with_settle(Some(Duration::from_millis(500)))
        .with_verify_response(false)
        .with_verify(VerifyBudget::new(3, Duration::from_secs(2)));
    let cx = Context::new("a").with_ledger(ledger.clone()).with_policy(SideEffect::High, p);
    let r: Out = send(
        &cx,
        |_a| async { Err(io::ErrorKind::TimedOut.into()) },
        |_k| async { Verdict::Unknown },
    )
    .await;
    let key = r.key().unwrap();
    ledger.resolve(key, Resolution::NotApplied).await.unwrap();
    // The service: a request lands 300 ms after it is sent; its answer is lost.
    let effects = Arc::new(AtomicU32::new(0));
    let reads = AtomicU32::new(0);
    let r: Out = send(
        &cx,
        |_a| {
            let effects = effects.clone();
            tokio::spawn(async move {
                tokio::time::sleep(Duration::from_millis(300)).await;
                effects.fetch_add(1, Ordering::SeqCst);
            });
            std::future::pending::<Result<u32, io::Error>>()
        },
        |_k| {
            let first = reads.fetch_add(1, Ordering::SeqCst) == 0;
            let applied = effects.load(Ordering::SeqCst);
            async move {
                match (first, applied) {
                    (true, _) => Verdict::Unknown,
                    (false, 0) => Verdict::Absent,
                    (false, n) => Verdict::Holds(n),
                }
            }
        },
    )
    .await;
    tokio::time::sleep(Duration::from_secs(5)).await;
    println!("result {r:?}");
    assert_eq!(
        effects.load(Ordering::SeqCst),
        1,
        "a retry went out while the first attempt could still land"
    );
}

/// A check without a ledger knows nothing of what was sent under the key;
/// its verifier is slow and the call's deadline strikes before it answers.
/// Nothing showed the effect absent: `NotApplied` is unproven.
#[tokio::test(start_paused = true)]
async fn a_check_without_a_ledger_is_not_not_applied_when_its_verifier_times_out() {
    let cx = Context::new("a")
        .without_ledger()
        .with_policy(SideEffect::High, policy().with_attempt_timeout(None))
        .for_check();
    let r: Out = send(
        &cx,
        |_a| async { Ok(1) },
        |_k| async {
            tokio::time::sleep(Duration::from_secs(60)).await;
            Verdict::Unknown
        },
    )
    .await;
    // Control: the same check whose verifier answers Unknown at once.
    let control: Out = send(&cx, |_a| async { Ok(1) }, |_k| async { Verdict::Unknown }).await;
    println!("slow verifier: {r:?}\nUnknown verifier: {control:?}");
    assert!(!matches!(r, ToolResult::NotApplied { .. }), "{r:?}");
}

/// A call whose only attempt lands 2.5 s after it went out (the server may
/// apply an attempt up to 3 s after its 1 s deadline), then a check of it
/// at once, without a ledger: what was sent under the key, and when, is
/// unknown, so the check's first `Absent` says nothing (it said
/// `NotApplied`, and the effect landed after). Given the time an attempt
/// sent now would take to settle, the same check can prove the effect absent.
#[tokio::test(start_paused = true)]
async fn a_check_without_a_record_believes_absent_only_once_any_attempt_has_settled() {
    let policy = |call_timeout| {
        RetryPolicy::for_class(SideEffect::High)
            .with_attempt_timeout(Some(Duration::from_secs(1)))
            .with_call_timeout(call_timeout)
            .with_settle(Some(Duration::from_secs(3)))
            .with_verify(VerifyBudget::new(1, Duration::from_millis(10)))
    };
    let cx = Context::new("a")
        .without_ledger()
        .with_policy(SideEffect::High, policy(Duration::from_secs(2)));
    let effects = Arc::new(AtomicU32::new(0));
    let verify = |_k| {
        let n = effects.load(Ordering::SeqCst);
        async move { if n == 0 { Verdict::Absent } else { Verdict::Holds(n) } }
    };
    let call: Out = send(
        &cx,
        |_a| {
            let effects = effects.clone();
            tokio::spawn(async move {
                tokio::time::sleep(Duration::from_millis(2500)).await;
                effects.fetch_add(1, Ordering::SeqCst);
            });
            std::future::pending::<Result<u32, io::Error>>()
        },
        verify,
    )
    .await;
    assert!(matches!(call, ToolResult::Unknown { .. }), "{call:?}");
    let check = |cx: Context| async move {
        let sent = |_a| async { Ok::<u32, io::Error>(99) };
        let r: Out = send(&cx.for_check(), sent, verify).await;
        r
    };
    let early = check(cx.clone()).await;
    assert!(!matches!(early, ToolResult::NotApplied { .. }), "{early:?}");
    tokio::time::sleep(Duration::from_secs(5)).await;
    assert_eq!(effects.load(Ordering::SeqCst), 1, "the effect landed after the check");
    // A verifier that never sees it, and a check long enough to wait out
    // an attempt sent at its start: absent, proven.
    let never = |_k| async { Verdict::<u32>::Absent };
    let cx = cx.with_policy(SideEffect::High, policy(Duration::from_secs(10))).for_check();
    let sent = |_a| async { Ok::<u32, io::Error>(99) };
    let late: Out =
        engine::call(&cx, &HIGH, &(2u8,), &(2u8,), sent, Some(never), Codec::serde()).await;
    assert!(matches!(late, ToolResult::NotApplied { .. }), "{late:?}");
}

static PLAIN: ToolSpec = ToolSpec::new("plain", SideEffect::Low);

/// A check of a tool without a verifier, on a record in doubt: the reason
/// names a verifier that does not exist.
#[tokio::test(start_paused = true)]
async fn a_check_of_a_tool_without_verifier_does_not_blame_a_verifier() {
    let cx = Context::new("a").with_policy(SideEffect::Low, policy().with_retries(1));
    // In doubt by a cancelled call: drop the call mid-attempt.
    let fut = engine::call(
        &cx,
        &PLAIN,
        &(1u8,),
        &(1u8,),
        |_a| std::future::pending::<Result<u32, io::Error>>(),
        engine::no_verifier(),
        Codec::serde(),
    );
    let _ = tokio::time::timeout(Duration::from_millis(10), fut).await;
    let r: Out = engine::call(
        &cx.for_check(),
        &PLAIN,
        &(1u8,),
        &(1u8,),
        |_a| async { Ok(1) },
        engine::no_verifier(),
        Codec::serde(),
    )
    .await;
    println!("check of a tool without verifier: {r:?}");
    assert!(
        !matches!(
            r,
            ToolResult::Unknown { reason: verified_tools::UnknownReason::VerifierInconclusive, .. }
        ),
        "{r:?}"
    );
}

/// Round 1 reads an early `Absent`, waits for the settle point and reads a
/// believed `Absent`; the retry times out and round 2's reads are all
/// `Unknown`. Nothing said `Absent` about the retry: the reason must be
/// `VerifierInconclusive`, not `Unsettled` (an early `Absent` of round 1).
#[tokio::test(start_paused = true)]
async fn an_early_absent_of_an_earlier_round_is_not_the_reason_of_the_last() {
    let p = policy()
        .with_attempt_timeout(Some(Duration::from_millis(100)))
        .with_settle(Some(Duration::from_millis(300)))
        .with_verify(VerifyBudget::new(2, Duration::from_millis(20)));
    let cx = Context::new("a").with_policy(SideEffect::High, p);
    let sent = Arc::new(AtomicU32::new(0));
    let log = std::sync::Mutex::new(Vec::new());
    let r: Out = send(
        &cx,
        |_a| {
            sent.fetch_add(1, Ordering::SeqCst);
            std::future::pending::<Result<u32, io::Error>>()
        },
        |_k| {
            let v =
                if sent.load(Ordering::SeqCst) < 2 { Verdict::Absent } else { Verdict::Unknown };
            log.lock().unwrap().push((sent.load(Ordering::SeqCst), v.kind()));
            async move { v }
        },
    )
    .await;
    println!("reads (attempts sent, verdict): {:?}\nresult: {r:?}", log.lock().unwrap());
    assert_eq!(sent.load(Ordering::SeqCst), 2);
    assert!(
        matches!(
            r,
            ToolResult::Unknown { reason: verified_tools::UnknownReason::VerifierInconclusive, .. }
        ),
        "{r:?}"
    );
}

/// The default scope (time buckets): a call in doubt at the end of a bucket
/// is repeated in the next; the ledger answers for the previous bucket's key,
/// which becomes the call's key. Every transition of one call must name the
/// same key: the `planned` event (and the span's `verified_tools.key`) names
/// the new bucket's key, every later one the previous bucket's.
#[tokio::test(start_paused = true)]
async fn every_event_of_a_call_names_the_key_of_its_result() {
    use verified_tools::TokioClock;
    use verified_tools::audit::MemoryAudit;
    let audit = Arc::new(MemoryAudit::new());
    // 1 s before a 5-minute bucket ends.
    let clock = Arc::new(TokioClock::starting_at(300_000 * 1000 - 1000));
    let cx = Context::new("a")
        .with_clock(clock)
        .with_policy(SideEffect::High, policy())
        .with_audit(audit.clone());
    let first: Out = send(
        &cx,
        |_a| async { Err(io::ErrorKind::TimedOut.into()) },
        |_k| async { Verdict::Unknown },
    )
    .await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    let before = audit.events().len();
    let repeat: Out = send(&cx, |_a| async { Ok(1) }, |_k| async { Verdict::Holds(1) }).await;
    assert_eq!(first.key(), repeat.key(), "the repeat is the same logical call");
    let keys: Vec<_> = audit.events()[before..].iter().map(|e| (e.key, e.json.clone())).collect();
    for (k, json) in &keys {
        println!("{k:?} {json}");
    }
    assert!(keys.iter().all(|(k, _)| *k == repeat.key()), "one call, two keys in its audit");
}
