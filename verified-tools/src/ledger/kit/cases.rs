//! The contract's cases: one `async fn` per rule, generic over the backend.

use std::sync::Arc;
use std::time::Duration;

use tokio::time::sleep;

use super::*;
use crate::ledger::{
    ClaimRequest, Claimed, End, Fence, Ledger, LedgerError, Progress, RecordState, RecordView,
    Replay, Resolution, Settle,
};

/// Rule 1: a fresh claim holds the key; every other claim, from either handle, finds it in flight.
pub async fn fresh_claim_then_in_flight<B: Backend>(b: Arc<B>) {
    let (ledger, other) = b.open(CONFIG).await;
    let k = key(1);
    let fence = fresh(&*ledger, request(k, fp(1))).await;
    for handle in [&ledger, &other] {
        match claim(&**handle, request(k, fp(1))).await {
            Claim { key, state: Claimed::InFlight(left) } => {
                assert_eq!(key, k);
                assert!(left <= CONFIG.lease && left > CONFIG.lease / 2, "lease left {left:?}");
            }
            other => panic!("a held key is in flight, got {other:?}"),
        }
    }
    ledger.finish(k, fence, End::InDoubt).await.expect("the holder finishes");
}

/// Rule 1: claims racing on one key give exactly one holder.
pub async fn concurrent_claims_give_one_holder<B: Backend>(b: Arc<B>) {
    let (a, c) = b.open(CONFIG).await;
    let k = key(2);
    let mut claims = Vec::new();
    for i in 0..16 {
        let ledger = if i % 2 == 0 { Arc::clone(&a) } else { Arc::clone(&c) };
        claims.push(tokio::spawn(async move { ledger.claim(request(k, fp(2))).await }));
    }
    let mut fresh = 0;
    for handle in claims {
        match handle.await.expect("no panic").expect("the store answers").state {
            Claimed::Fresh(_) => fresh += 1,
            Claimed::InFlight(_) => {}
            other => panic!("a concurrent claim got {other:?}"),
        }
    }
    assert_eq!(fresh, 1, "exactly one of 16 concurrent claims holds the key");
}

/// A completed call's value is replayed to a claim from another handle.
pub async fn completed_value_is_replayed_by_another_handle<B: Backend>(b: Arc<B>) {
    let (ledger, other) = b.open(CONFIG).await;
    let k = key(3);
    let fence = fresh(&*ledger, request(k, fp(3))).await;
    ledger.finish(k, fence, End::Completed(&Value { n: 77, serializes: true })).await.unwrap();
    for handle in [&ledger, &other] {
        match claim(&**handle, request(k, fp(3))).await.state {
            Claimed::Completed(replay) => assert_eq!(replayed(&replay), Some(77), "{replay:?}"),
            other => panic!("a completed key replays, got {other:?}"),
        }
    }
}

/// A value that does not serialize is recorded completed without a value (a repeat verifies, never dispatches).
pub async fn unserializable_value_is_completed_without_value<B: Backend>(b: Arc<B>) {
    let (ledger, other) = b.open(CONFIG).await;
    let k = key(4);
    let fence = fresh(&*ledger, request(k, fp(4))).await;
    ledger.finish(k, fence, End::Completed(&Value { n: 5, serializes: false })).await.unwrap();
    match claim(&*other, request(k, fp(4))).await.state {
        // In the process the value itself is kept; a store keeps "completed".
        Claimed::Completed(Replay::Local(value)) => assert_eq!(value.downcast_ref(), Some(&5u32)),
        Claimed::Completed(Replay::Unrecorded) => {}
        other => panic!("completed without value, got {other:?}"),
    }
}

/// The same key with another payload fingerprint is a mismatch, never a new call.
pub async fn another_payload_is_a_mismatch<B: Backend>(b: Arc<B>) {
    let (ledger, other) = b.open(CONFIG).await;
    let k = key(5);
    let fence = fresh(&*ledger, request(k, fp(5))).await;
    assert!(matches!(claim(&*other, request(k, fp(6))).await.state, Claimed::Mismatch));
    ledger.finish(k, fence, End::Completed(&Value { n: 1, serializes: true })).await.unwrap();
    assert!(matches!(claim(&*other, request(k, fp(6))).await.state, Claimed::Mismatch));
}

/// Rules 2 and 3: past its lease a hold is taken over in doubt, and the old holder's writes are fenced.
pub async fn takeover_after_the_lease_fences_the_old_holder<B: Backend>(b: Arc<B>) {
    let (ledger, other) = b.open(SHORT_LEASE).await;
    let k = key(6);
    let old = fresh(&*ledger, request(k, fp(6))).await;
    past_lease(&*other, k, SHORT_LEASE.lease).await;
    let (new, progress) = resumed(&*other, request(k, fp(6))).await;
    // At once, well inside the new hold's lease: it is in flight for others.
    assert!(matches!(claim(&*ledger, request(k, fp(6))).await.state, Claimed::InFlight(_)));
    assert!(new > old, "a takeover gets a greater fence: {new} > {old}");
    assert_eq!(progress.attempts, 1, "the old holder's first attempt is carried");
    // The old holder wakes up: every write of it is refused, none lands.
    let late = Progress { attempts: 2, after_ok: false, settle: Settle::NOW };
    assert_eq!(ledger.dispatching(k, old, late).await, Err(LedgerError::Fenced(old)));
    let end = End::Completed(&Value { n: 9, serializes: true });
    assert_eq!(ledger.finish(k, old, end).await, Err(LedgerError::Fenced(old)));
    ledger.abandon(k, old);
    // The new holder is untouched by any of it (the abandon may land in the
    // background: give it time), whether or not its lease has run out
    // since: its writes land, and its outcome stands.
    sleep(Duration::from_millis(500)).await;
    let next = Progress { attempts: 2, after_ok: false, settle: Settle::NOW };
    other.dispatching(k, new, next).await.expect("the current holder writes");
    other.finish(k, new, End::Completed(&Value { n: 10, serializes: true })).await.unwrap();
    match claim(&*ledger, request(k, fp(6))).await.state {
        Claimed::Completed(replay) => assert_eq!(replayed(&replay), Some(10)),
        other => panic!("the successor's outcome stands, got {other:?}"),
    }
}

/// Rule 4: attempts and the settle time written through reach a call that takes the key over, from another handle.
pub async fn budget_and_settle_time_carry_across_handles<B: Backend>(b: Arc<B>) {
    let (ledger, other) = b.open(CONFIG).await;
    let k = key(7);
    let settle = Duration::from_secs(30);
    let fence =
        fresh(&*ledger, ClaimRequest { first: first(Settle::After(settle)), ..request(k, fp(7)) })
            .await;
    let second = Progress { attempts: 2, after_ok: true, settle: Settle::After(settle) };
    ledger.dispatching(k, fence, second).await.unwrap();
    ledger.finish(k, fence, End::InDoubt).await.unwrap();
    let (_, progress) = resumed(&*other, request(k, fp(7))).await;
    assert_eq!((progress.attempts, progress.after_ok), (2, true));
    match progress.settle {
        Settle::After(left) => {
            assert!(left <= settle && left + Duration::from_secs(2) > settle, "settles in {left:?}")
        }
        Settle::Never => panic!("a settle time was recorded"),
    }
    // A second key whose attempt never settles says so.
    let k2 = key(8);
    let fence =
        fresh(&*ledger, ClaimRequest { first: first(Settle::Never), ..request(k2, fp(8)) }).await;
    ledger.finish(k2, fence, End::InDoubt).await.unwrap();
    let (_, progress) = resumed(&*other, request(k2, fp(8))).await;
    assert_eq!(progress.settle, Settle::Never);
}

/// An abandoned hold ends at once, in doubt, without waiting for the lease.
pub async fn abandon_ends_the_hold_at_once<B: Backend>(b: Arc<B>) {
    let (ledger, other) = b.open(CONFIG).await;
    let k = key(9);
    let fence = fresh(&*ledger, request(k, fp(9))).await;
    ledger.abandon(k, fence);
    // A store may end the hold in the background: well before the lease.
    let mut waited = Duration::ZERO;
    loop {
        match claim(&*other, request(k, fp(9))).await.state {
            Claimed::Resume(new, progress) => {
                assert!(new > fence);
                assert_eq!(progress.attempts, 1, "the abandoned call's attempt counts");
                break;
            }
            Claimed::InFlight(_) if waited < CONFIG.lease / 3 => {
                sleep(Duration::from_millis(10)).await;
                waited += Duration::from_millis(10);
            }
            other => panic!("an abandoned key is resumed promptly, got {other:?} after {waited:?}"),
        }
    }
}

/// A settled record resumes with what is left of its budget.
pub async fn settled_records_resume_with_their_budget<B: Backend>(b: Arc<B>) {
    let (ledger, other) = b.open(CONFIG).await;
    let k = key(10);
    let fence = fresh(&*ledger, request(k, fp(10))).await;
    ledger.finish(k, fence, End::Settled).await.unwrap();
    let (_, progress) = resumed(&*other, request(k, fp(10))).await;
    assert_eq!(progress.attempts, 1);
}

/// Rule 5: completed records expire after the TTL; records in doubt never do.
pub async fn completed_records_expire_in_doubt_never<B: Backend>(b: Arc<B>) {
    let (ledger, other) = b.open(SHORT_TTL).await;
    let (done, doubt) = (key(11), key(12));
    let fence = fresh(&*ledger, request(done, fp(11))).await;
    ledger.finish(done, fence, End::Completed(&Value { n: 3, serializes: true })).await.unwrap();
    let fence = fresh(&*ledger, request(doubt, fp(12))).await;
    ledger.finish(doubt, fence, End::InDoubt).await.unwrap();
    past_ttl(&*other, done, SHORT_TTL.ttl).await;
    // The completed record is gone: a new logical call starts afresh.
    let fence = fresh(&*other, request(done, fp(11))).await;
    other.finish(done, fence, End::Settled).await.unwrap();
    // The record in doubt is still there, whatever the TTL.
    let (_, progress) = resumed(&*other, request(doubt, fp(12))).await;
    assert_eq!(progress.attempts, 1);
}

/// A live record under the previous bucket's key answers the claim, for that key.
pub async fn previous_bucket_record_answers_the_claim<B: Backend>(b: Arc<B>) {
    let (ledger, other) = b.open(CONFIG).await;
    let (earlier, now) = (key(13), key(14));
    let fence = fresh(&*ledger, request(earlier, fp(13))).await;
    ledger.finish(earlier, fence, End::InDoubt).await.unwrap();
    let across = ClaimRequest { previous: Some((earlier, fp(13))), ..request(now, fp(14)) };
    match claim(&*other, across).await {
        Claim { key, state: Claimed::Resume(_, progress) } => {
            assert_eq!(key, earlier, "the call is the one recorded in the previous bucket");
            assert_eq!(progress.attempts, 1);
        }
        other => panic!("the previous bucket's record answers, got {other:?}"),
    }
    // No record in the previous bucket: the key itself is claimed.
    let (quiet, fresh_key) = (key(15), key(16));
    let lone = ClaimRequest { previous: Some((quiet, fp(15))), ..request(fresh_key, fp(16)) };
    match claim(&*other, lone).await {
        Claim { key, state: Claimed::Fresh(_) } => assert_eq!(key, fresh_key),
        other => panic!("without a previous record the key is claimed, got {other:?}"),
    }
}

/// Rule 2: fences grow strictly, across keys and handles.
pub async fn fences_grow_across_keys_and_handles<B: Backend>(b: Arc<B>) {
    let (ledger, other) = b.open(CONFIG).await;
    let mut last = Fence(0);
    for n in 0..6 {
        let handle = if n % 2 == 0 { &ledger } else { &other };
        let fence = fresh(&**handle, request(key(100 + n), fp(100))).await;
        assert!(fence > last, "fence {fence} after {last}");
        last = fence;
    }
}

/// `Ledger::hold`, asked by `ledger` for `fence`, must say held, with no
/// more than `lease` left and (asked right after the claim, inside a long
/// lease) more than half of it.
async fn holds(ledger: &dyn Ledger, k: IdempotencyKey, fence: Fence, lease: Duration) {
    match ledger.hold(k, fence).await.expect("the store answers") {
        Some(left) => {
            assert!(left <= lease && left > lease / 2, "lease left {left:?} of {lease:?}")
        }
        None => panic!("fence {fence} holds {k}, yet hold answered None"),
    }
}

/// `Ledger::hold` answers the lease left for the holder's fence only, and nothing once the call finished or abandoned.
pub async fn hold_answers_for_its_fence_only_while_it_holds<B: Backend>(b: Arc<B>) {
    let (ledger, other) = b.open(CONFIG).await;
    let k = key(17);
    let fence = fresh(&*ledger, request(k, fp(17))).await;
    // Both handles see it: the answer is the store's, not the process's.
    holds(&*ledger, k, fence, CONFIG.lease).await;
    holds(&*other, k, fence, CONFIG.lease).await;
    for stranger in [Fence(fence.0 + 1), Fence(fence.0.wrapping_sub(1))] {
        assert_eq!(other.hold(k, stranger).await, Ok(None), "fence {stranger} never held {k}");
    }
    assert_eq!(other.hold(key(18), fence).await, Ok(None), "a key nobody claimed");
    // Reading wrote nothing: the holder's writes still land.
    let second = Progress { attempts: 2, after_ok: false, settle: Settle::NOW };
    ledger.dispatching(k, fence, second).await.expect("the holder writes");
    ledger.finish(k, fence, End::Settled).await.expect("the holder finishes");
    assert_eq!(other.hold(k, fence).await, Ok(None), "a finished hold is over");
    // The next call takes the settled record over: only its fence holds.
    let (next, _) = resumed(&*other, request(k, fp(17))).await;
    holds(&*ledger, k, next, CONFIG.lease).await;
    assert_eq!(ledger.hold(k, fence).await, Ok(None), "the finished fence stays out");
    other.abandon(k, next);
    let started = tokio::time::Instant::now();
    // The abandon may land in the background: the store says when.
    while ledger.hold(k, next).await.expect("the store answers").is_some() {
        assert!(started.elapsed() < PATIENCE, "an abandoned hold still holds");
        sleep(Duration::from_millis(20)).await;
    }
}

/// `Ledger::hold` ends with the lease (the store's clock) and stays ended after a takeover.
pub async fn hold_ends_with_the_lease_and_stays_ended_after_a_takeover<B: Backend>(b: Arc<B>) {
    let (ledger, other) = b.open(SHORT_LEASE).await;
    let k = key(19);
    let old = fresh(&*ledger, request(k, fp(19))).await;
    past_lease(&*other, k, SHORT_LEASE.lease).await;
    // Nobody took the key over yet, but it may be at any moment: not held.
    assert_eq!(ledger.hold(k, old).await, Ok(None), "a hold past its lease is over");
    let (new, progress) = resumed(&*other, request(k, fp(19))).await;
    assert_eq!(progress.attempts, 1, "taken over");
    assert_eq!(ledger.hold(k, old).await, Ok(None), "the old holder is out");
    match other.hold(k, new).await.expect("the store answers") {
        Some(left) => assert!(left <= SHORT_LEASE.lease, "lease left {left:?}"),
        None => panic!("the successor holds {k}"),
    }
}

// ---------------------------------------------------------------- the operator's door

async fn listed(ledger: &dyn Ledger) -> Vec<RecordView> {
    ledger.in_doubt(1000).await.expect("the store lists")
}

async fn shown(ledger: &dyn Ledger, key: IdempotencyKey) -> Option<RecordView> {
    ledger.record(key).await.expect("the store reads")
}

async fn resolve(
    ledger: &dyn Ledger,
    key: IdempotencyKey,
    resolution: Resolution,
) -> Option<RecordState> {
    ledger.resolve(key, resolution).await.expect("the store resolves")
}

/// A key whose call ended in doubt after `attempts` attempts, the last
/// answered OK unconfirmed, settling in 30 s.
async fn left_in_doubt(ledger: &dyn Ledger, k: IdempotencyKey, attempts: u32) {
    let settle = Settle::After(Duration::from_secs(30));
    let fence = fresh(ledger, ClaimRequest { first: first(settle), ..request(k, fp(1)) }).await;
    let progress = Progress { attempts, after_ok: true, settle };
    ledger.dispatching(k, fence, progress).await.expect("the holder writes");
    ledger.finish(k, fence, End::InDoubt).await.expect("the holder finishes");
}

/// The operator's door: a record in doubt is listed and shown with its progress.
pub async fn a_record_in_doubt_is_listed_and_shown<B: Backend>(b: Arc<B>) {
    let (ledger, other) = b.open(CONFIG).await;
    let (doubt, done, settled) = (key(200), key(201), key(202));
    left_in_doubt(&*ledger, doubt, 2).await;
    let fence = fresh(&*ledger, request(done, fp(1))).await;
    ledger.finish(done, fence, End::Completed(&Value { n: 1, serializes: true })).await.unwrap();
    let fence = fresh(&*ledger, request(settled, fp(1))).await;
    ledger.finish(settled, fence, End::Settled).await.unwrap();

    // Another process lists it: only the record in doubt, as it was left.
    let list = listed(&*other).await;
    assert_eq!(list.iter().map(|view| view.key).collect::<Vec<_>>(), [doubt], "{list:?}");
    let view = list[0];
    assert_eq!(view.state, RecordState::InDoubt);
    assert_eq!((view.progress.attempts, view.progress.after_ok), (2, true));
    match view.progress.settle {
        Settle::After(left) => assert!(
            left <= Duration::from_secs(30) && left > Duration::from_secs(20),
            "settles in {left:?}"
        ),
        Settle::Never => panic!("a settle time was recorded"),
    }
    // Shown by itself, the same; the finished records show what they are.
    let one = shown(&*other, doubt).await.expect("a record");
    assert_eq!((one.key, one.state, one.progress.attempts), (doubt, RecordState::InDoubt, 2));
    assert_eq!(shown(&*other, done).await.map(|v| v.state), Some(RecordState::Completed));
    assert_eq!(shown(&*other, settled).await.map(|v| v.state), Some(RecordState::Settled));
    // Looking changes nothing: the next call still verifies first.
    let (_, progress) = resumed(&*ledger, request(doubt, fp(1))).await;
    assert_eq!(progress.attempts, 2);
}

/// The operator's door: the listing returns no more than its limit.
pub async fn the_listing_is_bounded_by_its_limit<B: Backend>(b: Arc<B>) {
    let (ledger, other) = b.open(CONFIG).await;
    for n in 0..3 {
        left_in_doubt(&*ledger, key(210 + n), 1).await;
    }
    assert_eq!(listed(&*other).await.len(), 3);
    let two = other.in_doubt(2).await.expect("the store lists");
    assert_eq!(two.len(), 2, "{two:?}");
    assert!(two[0].key != two[1].key, "each record once: {two:?}");
    assert!(other.in_doubt(0).await.expect("the store lists").is_empty());
}

/// The operator's door: a held record is neither listed nor resolved.
pub async fn a_held_record_is_neither_listed_nor_resolved<B: Backend>(b: Arc<B>) {
    let (ledger, other) = b.open(CONFIG).await;
    let k = key(220);
    let fence = fresh(&*ledger, request(k, fp(1))).await;
    assert!(listed(&*other).await.is_empty(), "a live hold is not in doubt");
    let view = shown(&*other, k).await.expect("a record");
    assert_eq!((view.state, view.progress.attempts), (RecordState::Held, 1));
    for resolution in [Resolution::Applied, Resolution::NotApplied] {
        assert_eq!(resolve(&*other, k, resolution).await, Some(RecordState::Held));
    }
    // Nothing changed: the holder's writes land, and its outcome stands.
    assert_eq!(shown(&*other, k).await, Some(view));
    let second = Progress { attempts: 2, after_ok: false, settle: Settle::NOW };
    ledger.dispatching(k, fence, second).await.expect("the holder still holds the key");
    ledger.finish(k, fence, End::Completed(&Value { n: 8, serializes: true })).await.unwrap();
    match claim(&*other, request(k, fp(1))).await.state {
        Claimed::Completed(replay) => assert_eq!(replayed(&replay), Some(8)),
        other => panic!("the holder's outcome stands, got {other:?}"),
    }
}

/// The operator's door: a person's decision never overwrites a completed or settled record.
pub async fn a_decision_never_overwrites_what_a_call_proved<B: Backend>(b: Arc<B>) {
    let (ledger, other) = b.open(CONFIG).await;
    let (done, settled) = (key(230), key(231));
    let fence = fresh(&*ledger, request(done, fp(1))).await;
    ledger.finish(done, fence, End::Completed(&Value { n: 4, serializes: true })).await.unwrap();
    let fence = fresh(&*ledger, request(settled, fp(1))).await;
    ledger.finish(settled, fence, End::Settled).await.unwrap();
    assert_eq!(resolve(&*other, done, Resolution::NotApplied).await, Some(RecordState::Completed));
    assert_eq!(resolve(&*other, settled, Resolution::Applied).await, Some(RecordState::Settled));
    match claim(&*ledger, request(done, fp(1))).await.state {
        Claimed::Completed(replay) => assert_eq!(replayed(&replay), Some(4), "{replay:?}"),
        other => panic!("the completed call still replays, got {other:?}"),
    }
    let (_, progress) = resumed(&*ledger, request(settled, fp(1))).await;
    assert_eq!(progress.attempts, 1, "the settled record keeps its attempts");
}

/// The operator's door: resolved applied, the call is completed without a value.
pub async fn resolving_applied_completes_the_call_without_a_value<B: Backend>(b: Arc<B>) {
    let (ledger, other) = b.open(CONFIG).await;
    let k = key(240);
    left_in_doubt(&*ledger, k, 2).await;
    assert_eq!(resolve(&*other, k, Resolution::Applied).await, Some(RecordState::InDoubt));
    assert!(listed(&*other).await.is_empty(), "no longer in doubt");
    assert_eq!(shown(&*other, k).await.map(|v| v.state), Some(RecordState::Completed));
    // A repeat is told the call completed: it verifies to obtain the value
    // and never dispatches.
    for handle in [&ledger, &other] {
        match claim(&**handle, request(k, fp(1))).await.state {
            Claimed::Completed(Replay::Unrecorded) => {}
            other => panic!("completed without a value, got {other:?}"),
        }
    }
    // Decided once: a second decision is refused, as for any completed call.
    assert_eq!(resolve(&*ledger, k, Resolution::NotApplied).await, Some(RecordState::Completed));
}

/// The operator's door: resolved not applied, the call has its whole budget again.
pub async fn resolving_not_applied_gives_the_call_its_whole_budget<B: Backend>(b: Arc<B>) {
    let (ledger, other) = b.open(CONFIG).await;
    let k = key(250);
    left_in_doubt(&*ledger, k, 2).await;
    assert_eq!(resolve(&*other, k, Resolution::NotApplied).await, Some(RecordState::InDoubt));
    assert!(listed(&*other).await.is_empty(), "no longer in doubt");
    let settled_now = Progress { attempts: 0, after_ok: false, settle: Settle::NOW };
    let view = shown(&*other, k).await.expect("a record");
    assert_eq!((view.state, view.progress), (RecordState::Settled, settled_now));
    // A repeat verifies first (nothing can land any more: an `Absent` is
    // believed at once), then has every attempt of the key.
    let (_, progress) = resumed(&*ledger, request(k, fp(1))).await;
    assert_eq!(progress, settled_now);
}

/// The operator's door: a hold past its lease is in doubt, and a decision on it fences its holder.
pub async fn a_hold_past_its_lease_is_in_doubt_and_its_holder_is_fenced_by_a_decision<
    B: Backend,
>(
    b: Arc<B>,
) {
    let (ledger, other) = b.open(SHORT_LEASE).await;
    let k = key(260);
    let old = fresh(&*ledger, request(k, fp(1))).await;
    past_lease(&*other, k, SHORT_LEASE.lease).await;
    // Its holder is presumed dead: the next call would take it over in doubt.
    let list = listed(&*other).await;
    assert_eq!(
        list.iter().map(|view| (view.key, view.state)).collect::<Vec<_>>(),
        [(k, RecordState::InDoubt)]
    );
    assert_eq!(shown(&*other, k).await.map(|v| v.state), Some(RecordState::InDoubt));
    assert_eq!(resolve(&*other, k, Resolution::NotApplied).await, Some(RecordState::InDoubt));
    // The holder wakes up: none of its writes lands over the decision.
    let late = Progress { attempts: 2, after_ok: false, settle: Settle::NOW };
    assert_eq!(ledger.dispatching(k, old, late).await, Err(LedgerError::Fenced(old)));
    let end = End::Completed(&Value { n: 9, serializes: true });
    assert_eq!(ledger.finish(k, old, end).await, Err(LedgerError::Fenced(old)));
    ledger.abandon(k, old);
    sleep(Duration::from_millis(500)).await;
    let (new, progress) = resumed(&*other, request(k, fp(1))).await;
    assert!(new > old, "fence {new} after {old}");
    assert_eq!(progress.attempts, 0, "the decision stands");
}

/// The operator's door: resolved records expire like finished ones.
pub async fn resolved_records_expire_like_finished_ones<B: Backend>(b: Arc<B>) {
    let (ledger, other) = b.open(SHORT_TTL).await;
    let (applied, not_applied, doubt) = (key(270), key(271), key(272));
    for k in [applied, not_applied, doubt] {
        left_in_doubt(&*ledger, k, 1).await;
    }
    assert_eq!(resolve(&*other, applied, Resolution::Applied).await, Some(RecordState::InDoubt));
    let decided = resolve(&*other, not_applied, Resolution::NotApplied).await;
    assert_eq!(decided, Some(RecordState::InDoubt));
    past_ttl(&*other, applied, SHORT_TTL.ttl).await;
    past_ttl(&*other, not_applied, SHORT_TTL.ttl).await;
    assert_eq!(shown(&*other, applied).await, None);
    assert_eq!(shown(&*other, not_applied).await, None);
    fresh(&*ledger, request(applied, fp(1))).await;
    fresh(&*ledger, request(not_applied, fp(1))).await;
    // The record left in doubt is still there.
    assert_eq!(listed(&*other).await.iter().map(|view| view.key).collect::<Vec<_>>(), [doubt]);
}

/// The operator's door: an unknown key has no record, and resolving it changes nothing.
pub async fn an_unknown_key_has_no_record_and_resolves_to_none<B: Backend>(b: Arc<B>) {
    let (ledger, other) = b.open(CONFIG).await;
    let k = key(280);
    assert_eq!(shown(&*other, k).await, None);
    assert_eq!(resolve(&*other, k, Resolution::Applied).await, None);
    assert_eq!(resolve(&*other, k, Resolution::NotApplied).await, None);
    assert_eq!(shown(&*other, k).await, None, "resolving created nothing");
    assert!(listed(&*other).await.is_empty());
    fresh(&*ledger, request(k, fp(1))).await;
}
