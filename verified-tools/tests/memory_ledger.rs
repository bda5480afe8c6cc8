//! The in-memory ledger's bounds: what it keeps of the records it pushes
//! out (tombstones), how it degrades when calls in doubt pile up, and that
//! neither turns a repeat into a blind dispatch. Driven through the `Ledger`
//! trait, and through the engine where the answer matters to a tool.

use std::any::Any;
use std::io;
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use tokio::time::Instant;
use verified_tools::ledger::{
    ClaimRequest, Claimed, Codec, End, Ledger, LedgerError, MemoryLedger, Progress, Recorded,
    Replay, Resolution, Settle,
};
use verified_tools::{
    Context, IdempotencyKey, PayloadDigest, Proof, RetryPolicy, SideEffect, ToolResult, ToolSpec,
    UnknownReason, Verdict, engine,
};

/// Key `n`, spread over the shards as derived keys are (the shard is picked
/// by the high 64 bits, the hash by the low ones).
fn key(n: u64) -> IdempotencyKey {
    let low = n.wrapping_mul(0x9E37_79B9_7F4A_7C15).wrapping_add(1);
    IdempotencyKey::from_u128((u128::from(n) << 64) | u128::from(low))
}

/// Key `n` of one and the same shard.
fn same_shard(n: u64) -> IdempotencyKey {
    IdempotencyKey::from_u128((7u128 << 64) | u128::from(n + 1))
}

fn fp(n: u128) -> PayloadDigest {
    PayloadDigest::from_u128(n)
}

fn request(key: IdempotencyKey, fingerprint: PayloadDigest) -> ClaimRequest {
    let first = Progress { attempts: 1, after_ok: false, settle: Settle::NOW };
    ClaimRequest { key, fingerprint, previous: None, first, now: Instant::now() }
}

/// What a key compacted from doubt resumes with.
const NO_BUDGET: Progress = Progress { attempts: u32::MAX, after_ok: true, settle: Settle::Never };

struct Value(u32);

impl Recorded for Value {
    fn local(&self) -> Arc<dyn Any + Send + Sync> {
        Arc::new(self.0)
    }

    fn encode(&self) -> Option<Vec<u8>> {
        Some(self.0.to_le_bytes().to_vec())
    }
}

async fn state(ledger: &MemoryLedger, key: IdempotencyKey, fingerprint: PayloadDigest) -> Claimed {
    ledger.claim(request(key, fingerprint)).await.expect("the claim is answered").state
}

/// Claims `key` fresh and ends the call as `end` says.
async fn call(
    ledger: &MemoryLedger,
    key: IdempotencyKey,
    fingerprint: PayloadDigest,
    end: End<'_>,
) {
    let Claimed::Fresh(fence) = state(ledger, key, fingerprint).await else {
        panic!("{key} is not fresh")
    };
    ledger.finish(key, fence, end).await.expect("the hold is ours");
}

async fn complete(ledger: &MemoryLedger, key: IdempotencyKey) {
    call(ledger, key, fp(1), End::Completed(&Value(7))).await;
}

async fn in_doubt(ledger: &MemoryLedger, key: IdempotencyKey) {
    call(ledger, key, fp(1), End::InDoubt).await;
}

fn is_unrecorded(claimed: &Claimed) -> bool {
    matches!(claimed, Claimed::Completed(Replay::Unrecorded))
}

// ---- A completed record pushed out by the cap ----

#[tokio::test(start_paused = true)]
async fn a_completed_call_pushed_out_by_2000_later_calls_is_still_known_completed() {
    let ledger = MemoryLedger::new().with_capacity(64);
    complete(&ledger, key(0)).await;
    for n in 1..2000 {
        complete(&ledger, key(n)).await;
    }
    assert!(ledger.len() <= ledger.capacity(), "{ledger:?}");
    let repeat = state(&ledger, key(0), fp(1)).await;
    assert!(is_unrecorded(&repeat), "{repeat:?}");
    // And again: a tombstone answers every repeat, it is not used up.
    assert!(is_unrecorded(&state(&ledger, key(0), fp(1)).await));
}

#[tokio::test(start_paused = true)]
async fn a_pushed_out_key_claimed_with_another_fingerprint_is_a_mismatch() {
    let ledger = MemoryLedger::new().with_capacity(64);
    complete(&ledger, same_shard(0)).await;
    complete(&ledger, same_shard(1)).await;
    assert_eq!(ledger.tombstones(), 1, "{ledger:?}");
    let other = state(&ledger, same_shard(0), fp(2)).await;
    assert!(matches!(other, Claimed::Mismatch), "{other:?}");
    assert!(is_unrecorded(&state(&ledger, same_shard(0), fp(1)).await));
}

#[tokio::test(start_paused = true)]
async fn a_settled_call_pushed_out_is_forgotten_its_effect_being_known_absent() {
    let ledger = MemoryLedger::new().with_capacity(64);
    call(&ledger, same_shard(0), fp(1), End::Settled).await;
    complete(&ledger, same_shard(1)).await;
    assert_eq!(ledger.tombstones(), 0, "tombstones are spent on completed calls only");
    complete(&ledger, same_shard(2)).await;
    assert_eq!(ledger.tombstones(), 1);
    assert!(is_unrecorded(&state(&ledger, same_shard(1), fp(1)).await));
    assert!(matches!(state(&ledger, same_shard(0), fp(1)).await, Claimed::Fresh(_)));
}

#[tokio::test(start_paused = true)]
async fn a_previous_bucket_record_pushed_out_still_answers_for_its_key() {
    let ledger = MemoryLedger::new().with_capacity(64);
    let earlier = same_shard(0);
    complete(&ledger, earlier).await;
    complete(&ledger, same_shard(1)).await;
    let mut next_bucket = request(key(99), fp(99));
    next_bucket.previous = Some((earlier, fp(1)));
    let claim = ledger.claim(next_bucket).await.unwrap();
    assert_eq!(claim.key, earlier);
    assert!(is_unrecorded(&claim.state), "{:?}", claim.state);
}

#[tokio::test(start_paused = true)]
async fn a_tombstone_past_the_ttl_is_gone() {
    let ttl = Duration::from_secs(3600);
    let ledger = MemoryLedger::new().with_capacity(64).with_ttl(ttl);
    complete(&ledger, same_shard(0)).await;
    tokio::time::advance(Duration::from_secs(60)).await;
    complete(&ledger, same_shard(1)).await;
    assert_eq!(ledger.tombstones(), 1);
    // Still known just before the record would have expired.
    tokio::time::advance(ttl - Duration::from_secs(61)).await;
    assert!(is_unrecorded(&state(&ledger, same_shard(0), fp(1)).await));
    tokio::time::advance(Duration::from_secs(2)).await;
    ledger.purge_expired();
    assert_eq!(ledger.tombstones(), 0, "{ledger:?}");
    assert!(matches!(state(&ledger, same_shard(0), fp(1)).await, Claimed::Fresh(_)));
}

#[tokio::test(start_paused = true)]
async fn an_expired_tombstone_is_dropped_by_the_next_claim_of_its_shard() {
    let ttl = Duration::from_secs(60);
    let ledger = MemoryLedger::new().with_capacity(64).with_ttl(ttl);
    complete(&ledger, same_shard(0)).await;
    complete(&ledger, same_shard(1)).await;
    assert!(is_unrecorded(&state(&ledger, same_shard(0), fp(1)).await));
    tokio::time::advance(ttl + Duration::from_secs(1)).await;
    assert!(matches!(state(&ledger, same_shard(0), fp(1)).await, Claimed::Fresh(_)));
    assert_eq!(ledger.tombstones(), 0);
}

// ---- Records in doubt past their bound ----

#[tokio::test(start_paused = true)]
async fn a_thousand_calls_in_doubt_in_a_ledger_of_64_do_not_refuse_a_new_key() {
    let ledger = MemoryLedger::new().with_capacity(64);
    for n in 0..1000 {
        in_doubt(&ledger, key(n)).await;
    }
    assert!(ledger.len() <= ledger.doubt_capacity(), "{ledger:?}");
    assert!(matches!(state(&ledger, key(5000), fp(1)).await, Claimed::Fresh(_)));
    // The oldest in doubt was compacted, not dropped: it resumes with no
    // budget, after an OK answer, never settled; and is a full record again.
    let Claimed::Resume(_, progress) = state(&ledger, key(0), fp(1)).await else {
        panic!("the oldest call in doubt must resume")
    };
    assert_eq!(progress, NO_BUDGET);
    assert!(matches!(state(&ledger, key(0), fp(1)).await, Claimed::InFlight(_)));
    assert!(matches!(state(&ledger, key(0), fp(2)).await, Claimed::Mismatch));
    assert_eq!(ledger.forgotten(), 0);
}

#[tokio::test(start_paused = true)]
async fn a_compacted_doubt_with_another_fingerprint_is_a_mismatch_and_stays() {
    let ledger = MemoryLedger::new().with_capacity(64);
    in_doubt(&ledger, same_shard(0)).await;
    in_doubt(&ledger, same_shard(1)).await;
    assert_eq!(ledger.tombstones(), 1);
    assert!(matches!(state(&ledger, same_shard(0), fp(2)).await, Claimed::Mismatch));
    assert!(matches!(state(&ledger, same_shard(0), fp(1)).await, Claimed::Resume(_, NO_BUDGET)));
}

#[tokio::test(start_paused = true)]
async fn an_abandoned_hold_counts_against_the_doubt_bound_too() {
    let ledger = MemoryLedger::new().with_capacity(64);
    for n in 0..3 {
        let Claimed::Fresh(fence) = state(&ledger, same_shard(n), fp(1)).await else { panic!() };
        ledger.abandon(same_shard(n), fence);
    }
    assert_eq!((ledger.len(), ledger.tombstones()), (1, 2), "{ledger:?}");
    assert!(matches!(state(&ledger, same_shard(0), fp(1)).await, Claimed::Resume(_, NO_BUDGET)));
    // The newest in doubt is still a full record, with its own progress.
    let Claimed::Resume(_, progress) = state(&ledger, same_shard(2), fp(1)).await else { panic!() };
    assert_eq!(progress.attempts, 1);
}

#[tokio::test(start_paused = true)]
async fn an_in_doubt_tombstone_outlives_the_ttl() {
    let ttl = Duration::from_secs(60);
    let ledger = MemoryLedger::new().with_capacity(64).with_ttl(ttl);
    in_doubt(&ledger, same_shard(0)).await;
    in_doubt(&ledger, same_shard(1)).await;
    tokio::time::advance(ttl * 100).await;
    ledger.purge_expired();
    assert_eq!(ledger.tombstones(), 1);
    assert!(matches!(state(&ledger, same_shard(0), fp(1)).await, Claimed::Resume(_, NO_BUDGET)));
}

#[tokio::test(start_paused = true)]
async fn a_shard_all_held_still_refuses_a_new_key() {
    // One record per shard: a call in flight fills it; doubt does not.
    let ledger = MemoryLedger::new().with_capacity(64);
    in_doubt(&ledger, same_shard(0)).await;
    let Claimed::Fresh(_) = state(&ledger, same_shard(1), fp(1)).await else { panic!() };
    let refused = ledger.claim(request(same_shard(2), fp(1))).await;
    assert!(matches!(refused, Err(LedgerError::Full(64))), "{refused:?}");
}

// ---- The bounds ----

#[tokio::test(start_paused = true)]
async fn tombstones_stay_within_their_bound_however_many_records_are_pushed_out() {
    let ledger = MemoryLedger::new().with_capacity(64).with_tombstones(256);
    assert_eq!((ledger.capacity(), ledger.tombstone_capacity()), (64, 256));
    for n in 0..20_000 {
        complete(&ledger, key(n)).await;
        if n % 1000 == 0 {
            assert!(ledger.tombstones() <= 256, "{ledger:?}");
        }
    }
    assert!(ledger.len() <= 64, "{ledger:?}");
    assert_eq!(ledger.tombstones(), 256, "every shard keeps its share, no more");
    // The newest tombstones are the ones kept.
    assert!(is_unrecorded(&state(&ledger, key(19_900), fp(1)).await));
    assert!(matches!(state(&ledger, key(0), fp(1)).await, Claimed::Fresh(_)));
}

#[tokio::test(start_paused = true)]
async fn doubt_is_forgotten_only_past_the_hard_bound_and_counted() {
    let ledger = MemoryLedger::new().with_capacity(64).with_tombstones(256);
    assert_eq!(ledger.doubt_capacity(), 64);
    for n in 0..20_000 {
        in_doubt(&ledger, key(n)).await;
    }
    assert!(ledger.len() <= ledger.doubt_capacity(), "{ledger:?}");
    assert_eq!(ledger.tombstones(), 256);
    // Each shard keeps 1 record and 4 tombstones in doubt: the rest went.
    assert_eq!(ledger.forgotten(), 20_000 - 64 - 256);
    assert!(matches!(state(&ledger, key(19_999), fp(1)).await, Claimed::Resume(_, _)));
    assert!(matches!(state(&ledger, key(19_900), fp(1)).await, Claimed::Resume(_, NO_BUDGET)));
}

#[tokio::test(start_paused = true)]
async fn when_tombstones_overflow_completed_ones_go_before_those_in_doubt() {
    // One record, one in doubt and four tombstones per shard.
    let ledger = MemoryLedger::new().with_capacity(64).with_tombstones(256);
    in_doubt(&ledger, same_shard(0)).await;
    in_doubt(&ledger, same_shard(1)).await; // compacts 0
    for n in 2..100 {
        complete(&ledger, same_shard(n)).await;
    }
    assert_eq!(ledger.tombstones(), 4);
    assert_eq!(ledger.forgotten(), 0);
    let Claimed::Resume(fence, NO_BUDGET) = state(&ledger, same_shard(0), fp(1)).await else {
        panic!("the call in doubt outlived 97 completed ones")
    };
    ledger.finish(same_shard(0), fence, End::Settled).await.unwrap();
    // The newest completed calls are still known; older ones not.
    assert!(is_unrecorded(&state(&ledger, same_shard(98), fp(1)).await));
    assert!(matches!(state(&ledger, same_shard(2), fp(1)).await, Claimed::Fresh(_)));
}

#[tokio::test(start_paused = true)]
async fn a_key_in_and_out_of_doubt_many_times_stays_known_within_the_bounds() {
    let ledger = MemoryLedger::new().with_capacity(64).with_tombstones(256);
    in_doubt(&ledger, same_shard(0)).await;
    for round in 1..10_000 {
        // The newcomer compacts key 0; key 0 resumes and ends in doubt
        // again, compacting the newcomer, which resumes and settles.
        in_doubt(&ledger, same_shard(round)).await;
        let Claimed::Resume(fence, NO_BUDGET) = state(&ledger, same_shard(0), fp(1)).await else {
            panic!("round {round}")
        };
        ledger.finish(same_shard(0), fence, End::InDoubt).await.unwrap();
        let Claimed::Resume(fence, NO_BUDGET) = state(&ledger, same_shard(round), fp(1)).await
        else {
            panic!("round {round}")
        };
        ledger.finish(same_shard(round), fence, End::Settled).await.unwrap();
    }
    assert!(ledger.tombstones() <= 4, "{ledger:?}");
    assert!(ledger.len() <= 2, "{ledger:?}");
    assert_eq!(ledger.forgotten(), 0);
}

// ---- Through the engine ----

static SEND: ToolSpec = ToolSpec::new("send_welcome", SideEffect::High).with_verifier();

fn cx(ledger: Arc<MemoryLedger>) -> Context {
    let policy = RetryPolicy::for_class(SideEffect::High)
        .with_attempt_timeout(Some(Duration::from_millis(100)))
        .with_settle(Some(Duration::ZERO));
    Context::new("agent-1").with_policy(SideEffect::High, policy).with_ledger(ledger)
}

/// A tool that counts its dispatches and verifier reads per payload: it
/// answers `Ok`, or times out when `fail`; its verifier reads `verdict`.
struct Tool {
    dispatches: Vec<AtomicU32>,
    reads: Vec<AtomicU32>,
    fail: bool,
    verdict: fn(u64) -> Verdict<u64>,
}

impl Tool {
    fn new(calls: usize, fail: bool, verdict: fn(u64) -> Verdict<u64>) -> Self {
        let counters = || (0..calls).map(|_| AtomicU32::new(0)).collect();
        Self { dispatches: counters(), reads: counters(), fail, verdict }
    }

    async fn call(&self, cx: &Context, n: u64) -> ToolResult<u64, io::Error> {
        engine::call(
            &cx.for_key(key(n)),
            &SEND,
            &(n,),
            &(n,),
            |_attempt| {
                self.dispatches[n as usize].fetch_add(1, Ordering::Relaxed);
                let fail = self.fail;
                async move { if fail { Err(io::ErrorKind::TimedOut.into()) } else { Ok(n) } }
            },
            Some(|_key| {
                self.reads[n as usize].fetch_add(1, Ordering::Relaxed);
                let verdict = (self.verdict)(n);
                async move { verdict }
            }),
            Codec::serde(),
        )
        .await
    }

    fn dispatched(&self, n: u64) -> u32 {
        self.dispatches[n as usize].load(Ordering::Relaxed)
    }

    fn read(&self, n: u64) -> u32 {
        self.reads[n as usize].load(Ordering::Relaxed)
    }
}

#[tokio::test(start_paused = true)]
async fn a_completed_call_pushed_out_by_2000_later_calls_is_verified_not_dispatched_again() {
    let ledger = Arc::new(MemoryLedger::new().with_capacity(64));
    let cx = cx(Arc::clone(&ledger));
    let tool = Tool::new(2000, false, Verdict::Holds);
    for n in 0..2000 {
        let r = tool.call(&cx, n).await;
        // A high tool's OK answer is read back (one read per call).
        assert!(matches!(r, ToolResult::Success { proof: Proof::Verifier, .. }), "{n}: {r:?}");
    }
    assert!(ledger.tombstones() > 0, "{ledger:?}");
    // The ledger says it completed but no longer has the value: the
    // verifier gives it (the proof is the ledger's, the engine's rule for a
    // completed call), and nothing is dispatched.
    let repeat = tool.call(&cx, 0).await;
    assert!(
        matches!(repeat, ToolResult::Success { value: 0, proof: Proof::Ledger, .. }),
        "{repeat:?}"
    );
    assert_eq!((tool.dispatched(0), tool.read(0)), (1, 2), "the OK's read, then the repeat's");
    // A call still recorded in full replays its value, with no read of its own.
    let recent = tool.call(&cx, 1999).await;
    assert!(matches!(recent, ToolResult::Success { proof: Proof::Ledger, .. }), "{recent:?}");
    assert_eq!((tool.dispatched(1999), tool.read(1999)), (1, 1), "the OK's read only");
}

#[tokio::test(start_paused = true)]
async fn the_oldest_of_a_thousand_calls_in_doubt_repeated_is_verified_and_never_dispatched() {
    let ledger = Arc::new(MemoryLedger::new().with_capacity(64));
    let cx = cx(Arc::clone(&ledger));
    let doubtful = Tool::new(1000, true, |_| Verdict::Unknown);
    for n in 0..1000 {
        let r = doubtful.call(&cx, n).await;
        assert!(matches!(r, ToolResult::Unknown { .. }), "{n}: {r:?}");
    }
    assert!(ledger.tombstones() > 0, "{ledger:?}");
    // The service now reads Absent, settled: a record in doubt with budget
    // left would retry. The compacted one has none, and its attempt never
    // settles: the Absent is not believed, nothing is dispatched.
    let absent = Tool::new(1000, false, |_| Verdict::Absent);
    let r = absent.call(&cx, 0).await;
    assert!(matches!(r, ToolResult::Unknown { reason: UnknownReason::Unsettled, .. }), "{r:?}");
    assert_eq!(absent.dispatched(0), 0);
    assert!(absent.read(0) > 0);
    // Verified present, it completes without a dispatch either.
    let holds = Tool::new(1000, false, Verdict::Holds);
    let r = holds.call(&cx, 0).await;
    assert!(matches!(r, ToolResult::Success { value: 0, proof: Proof::Verifier, .. }), "{r:?}");
    assert_eq!(holds.dispatched(0), 0);
    // A new call is not refused.
    let fresh = Tool::new(1001, false, Verdict::Holds);
    let r = fresh.call(&cx, 1000).await;
    assert!(matches!(r, ToolResult::Success { proof: Proof::Verifier, .. }), "{r:?}");
    assert_eq!((fresh.dispatched(1000), fresh.read(1000)), (1, 1));
}

#[tokio::test(start_paused = true)]
async fn an_operator_lists_shows_and_resolves_what_is_in_doubt_and_nothing_else() {
    use verified_tools::ledger::{RecordState, Resolution};
    let ledger = MemoryLedger::new();
    let (doubt, held) = (key(1), key(2));
    let Claimed::Fresh(fence) = ledger.claim(request(doubt, fp(1))).await.unwrap().state else {
        panic!("fresh")
    };
    ledger.finish(doubt, fence, End::InDoubt).await.unwrap();
    let Claimed::Fresh(holder) = ledger.claim(request(held, fp(2))).await.unwrap().state else {
        panic!("fresh")
    };
    let listed = ledger.in_doubt(10).await.unwrap();
    assert_eq!(listed.iter().map(|r| r.key).collect::<Vec<_>>(), [doubt]);
    assert_eq!(ledger.record(held).await.unwrap().map(|r| r.state), Some(RecordState::Held));
    // A held record is not a person's to decide.
    let kept = ledger.resolve(held, Resolution::Applied).await.unwrap();
    assert_eq!(kept, Some(RecordState::Held));
    assert!(matches!(
        ledger.claim(request(held, fp(2))).await.unwrap().state,
        Claimed::InFlight(_)
    ));
    // Resolved as applied: a repeat obtains the value by verifying.
    let was = ledger.resolve(doubt, Resolution::Applied).await.unwrap();
    assert_eq!(was, Some(RecordState::InDoubt));
    assert!(matches!(
        ledger.claim(request(doubt, fp(1))).await.unwrap().state,
        Claimed::Completed(Replay::Unrecorded)
    ));
    assert!(ledger.in_doubt(10).await.unwrap().is_empty());
    // Past its lease the held record is in doubt; resolved as not applied,
    // its old holder is fenced and a repeat resumes with the whole budget.
    tokio::time::advance(ledger.lease() + Duration::from_secs(1)).await;
    assert_eq!(ledger.in_doubt(10).await.unwrap().len(), 1);
    let was = ledger.resolve(held, Resolution::NotApplied).await.unwrap();
    assert_eq!(was, Some(RecordState::InDoubt));
    assert!(matches!(ledger.finish(held, holder, End::InDoubt).await, Err(LedgerError::Fenced(_))));
    let Claimed::Resume(_, progress) = ledger.claim(request(held, fp(2))).await.unwrap().state
    else {
        panic!("resumes")
    };
    assert_eq!(progress.attempts, 0);
    assert_eq!(ledger.resolve(key(3), Resolution::Applied).await.unwrap(), None);
}

#[tokio::test(start_paused = true)]
async fn a_resolution_keeps_its_shard_within_the_record_cap() {
    use verified_tools::ledger::Resolution;
    // One record per shard. A record in doubt does not count against the
    // cap, so a finished one fits beside it; once resolved, it counts.
    let ledger = MemoryLedger::new().with_capacity(64);
    in_doubt(&ledger, same_shard(1)).await;
    complete(&ledger, same_shard(0)).await;
    assert_eq!((ledger.len(), ledger.tombstones()), (2, 0), "{ledger:?}");
    ledger.resolve(same_shard(1), Resolution::Applied).await.unwrap();
    // The oldest finished record made room, as a tombstone: both calls
    // are still known complete.
    assert_eq!((ledger.len(), ledger.tombstones()), (1, 1), "{ledger:?}");
    for n in 0..2 {
        assert!(is_unrecorded(&state(&ledger, same_shard(n), fp(1)).await), "{n}");
    }
}

static SEND_ASKING: ToolSpec =
    ToolSpec::new("send", SideEffect::High).with_verifier().with_holder();
static SEND_ASKING_BELIEVED: ToolSpec = SEND_ASKING.with_verify_response(false);

/// A holder whose host stood still while the store's clock ran on (a
/// suspended VM): its attempt's deadline has not passed, yet a successor,
/// by the store's clock past the lease, took its key over. The deadline
/// cannot tell; `Holder::ensure` reads the store and does, so nothing is
/// sent and the call ends in doubt, superseded, never "not applied".
#[tokio::test(start_paused = true)]
async fn a_takeover_the_deadline_cannot_see_is_seen_by_the_holder() {
    let lease = Duration::from_secs(300);
    let ledger = Arc::new(MemoryLedger::new().with_lease(lease));
    let cx = Context::new("mailer").with_ledger(ledger.clone());
    let sent = AtomicU32::new(0);
    let result: ToolResult<(), verified_tools::HoldLost> = engine::call(
        &cx,
        &SEND_ASKING,
        &("bob",),
        &("bob",),
        |attempt: engine::Attempt| {
            let (ledger, sent) = (&ledger, &sent);
            async move {
                assert!(attempt.holder.fence().is_some(), "the spec asked for the holder");
                // The successor claims with the store's clock, past the lease.
                let mut successor =
                    request(attempt.key, PayloadDigest::from_u128(attempt.key.as_u128()));
                successor.now = Instant::now() + lease + Duration::from_millis(1);
                let taken = ledger.claim(successor).await.expect("the claim is answered");
                assert!(matches!(taken.state, Claimed::Resume(..)), "{:?}", taken.state);
                assert!(!attempt.deadline.has_passed(), "the deadline cannot tell");
                attempt.holder.ensure(attempt.deadline.remaining()).await?;
                sent.fetch_add(1, Ordering::SeqCst);
                Ok(())
            }
        },
        Some(|_key| async { Verdict::Absent }),
        Codec::serde(),
    )
    .await;
    assert_eq!(sent.load(Ordering::SeqCst), 0, "nothing was sent after the takeover");
    assert!(
        matches!(result, ToolResult::Unknown { reason: UnknownReason::Superseded, .. }),
        "{result:?}"
    );
}

/// The control: a hold still ours answers its lease, and `ensure` lets the
/// request go, unless it needs more than is left.
#[tokio::test(start_paused = true)]
async fn a_hold_still_held_answers_its_lease_left() {
    let lease = Duration::from_secs(300);
    let ledger = Arc::new(MemoryLedger::new().with_lease(lease));
    let cx = Context::new("mailer").with_ledger(ledger);
    let result: ToolResult<Duration, verified_tools::HoldLost> = engine::call(
        &cx,
        &SEND_ASKING_BELIEVED,
        &("bob",),
        &("bob",),
        |attempt: engine::Attempt| async move {
            tokio::time::sleep(Duration::from_secs(10)).await;
            let left =
                attempt.holder.lease_left().await.expect("memory answers").unwrap_or_default();
            let too_long = attempt.holder.ensure(left + Duration::from_millis(1)).await;
            assert!(
                matches!(too_long, Err(verified_tools::HoldLost::Expiring { .. })),
                "{too_long:?}"
            );
            attempt.holder.ensure(left).await?;
            Ok(left)
        },
        Some(|_key| async { Verdict::Absent }),
        Codec::serde(),
    )
    .await;
    match result {
        ToolResult::Success { value: left, proof: Proof::Response, .. } => {
            assert_eq!(left, lease - Duration::from_secs(10), "the lease less the 10 s spent")
        }
        other => panic!("{other:?}"),
    }
}

static CHARGE: ToolSpec = ToolSpec::new("charge", SideEffect::Irreversible).with_verifier();

/// An irreversible call that a check found never sent, then a person's
/// "not applied" on a call in doubt: each says what the record shows
/// (`NeverSent`, not "an earlier call ended in doubt"), and the call made
/// again is verified and then sent, once.
#[tokio::test(start_paused = true)]
async fn a_record_nothing_was_sent_under_says_so_and_is_sent_when_called_again() {
    let ledger = Arc::new(MemoryLedger::new());
    let cx = Context::new("billing").with_ledger(ledger.clone()).for_tool_call("call_1");
    let sent = AtomicU32::new(0);
    let charged_keys = std::sync::Mutex::new(Vec::new());
    let charge = |cx: Context, attempt_fails: bool| {
        let (sent, charged_keys) = (&sent, &charged_keys);
        async move {
            let result: ToolResult<u32, io::Error> = engine::call(
                &cx,
                &CHARGE,
                &("order-7",),
                &("order-7",),
                |attempt: engine::Attempt| async move {
                    sent.fetch_add(1, Ordering::SeqCst);
                    if attempt_fails {
                        return Err(io::Error::from(io::ErrorKind::TimedOut));
                    }
                    charged_keys.lock().unwrap().push(attempt.key);
                    Ok(7)
                },
                Some(|key| async move {
                    let charged = charged_keys.lock().unwrap().contains(&key);
                    if charged { Verdict::Holds(7) } else { Verdict::Absent }
                }),
                Codec::serde(),
            )
            .await;
            result
        }
    };
    // A check before anything was sent: not applied, and never sent.
    let checked = charge(cx.for_check(), false).await;
    assert!(
        matches!(checked, ToolResult::NotApplied { cause: verified_tools::Cause::NeverSent, .. }),
        "{checked:?}"
    );
    assert_eq!(sent.load(Ordering::SeqCst), 0);
    // The call itself, after the check: verified, then sent once.
    let charged = charge(cx.clone(), false).await;
    assert!(matches!(charged, ToolResult::Success { value: 7, .. }), "{charged:?}");
    assert_eq!(sent.load(Ordering::SeqCst), 1);

    // Another order: in doubt (the verifier reads Absent too early: no settle
    // margin), resolved "not applied" by a person, then called again.
    let cx = cx.for_tool_call("call_2");
    let doubt = charge(cx.clone(), true).await;
    assert!(matches!(doubt, ToolResult::Escalated { .. }), "{doubt:?}");
    let key = doubt.key().expect("a key");
    let was = ledger.resolve(key, Resolution::NotApplied).await.expect("resolved");
    assert_eq!(was, Some(verified_tools::ledger::RecordState::InDoubt));
    let again = charge(cx, false).await;
    assert!(matches!(again, ToolResult::Success { value: 7, .. }), "{again:?}");
    assert_eq!(sent.load(Ordering::SeqCst), 3, "the resolved call was sent once more");
}
