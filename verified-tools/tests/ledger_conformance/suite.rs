//! The ledger contract, as tests generic over the backend: every backend
//! module instantiates all of them with `conformance!`. The operator's door
//! (`Ledger::record`, `in_doubt`, `resolve`), which a backend may leave
//! unsupported, has cases of its own that a backend adds with
//! `operator = true`.
//!
//! Time is tokio's: a backend whose clock follows it (the in-memory one)
//! runs on paused time, where the sleeps below are instant; a store with its
//! own clock runs on real time.
//!
//! Real time on a loaded machine (two cores, a build beside the tests) is
//! where margins break, so no check depends on a round trip being fast:
//! what must happen inside a lease or a TTL has a long one ([`CONFIG`]: 10 s
//! and 30 s, that nothing here comes near); what must happen after one has a
//! short one ([`SHORT_LEASE`], [`SHORT_TTL`]: 2 s), does the checks that need
//! it alive at once, and then waits until the store itself says it ended
//! ([`past_lease`], [`past_ttl`]: its own clock), not for a fixed time.

use std::any::Any;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use tokio::time::sleep;
use verified_tools::ledger::{
    Claim, ClaimRequest, Claimed, End, Fence, Ledger, LedgerError, Progress, RecordState,
    RecordView, Recorded, Replay, Resolution, Settle,
};
use verified_tools::{IdempotencyKey, PayloadDigest};

/// How a backend's store is set up for one test.
#[derive(Debug, Clone, Copy)]
pub struct Config {
    pub lease: Duration,
    pub ttl: Duration,
}

/// What the tests that never wait for a lease or a TTL use: long enough
/// that neither ends during a test on the slowest machine.
pub const CONFIG: Config = Config { lease: Duration::from_secs(10), ttl: Duration::from_secs(30) };

/// For the tests that wait for a lease to end.
pub const SHORT_LEASE: Config = Config { lease: Duration::from_secs(2), ..CONFIG };

/// For the tests that wait for records to expire.
pub const SHORT_TTL: Config = Config { ttl: Duration::from_secs(2), ..CONFIG };

/// Slack for a store to notice the time passed (its clock, a round trip),
/// where its clock cannot be asked.
pub const SLACK: Duration = Duration::from_millis(150);

/// How long past a lease or a TTL a store may take to say it ended: a
/// bound for a stuck test, not a margin any run comes near.
pub const PATIENCE: Duration = Duration::from_secs(30);

/// A ledger backend under test.
pub trait Backend: Send + Sync + 'static {
    /// Two handles on one fresh, empty store: what two processes see (one
    /// and the same ledger for a backend that lives in the process).
    fn open(
        &self,
        config: Config,
    ) -> impl Future<Output = (Arc<dyn Ledger>, Arc<dyn Ledger>)> + Send;
}

/// Runs one suite test on the runtime its backend needs.
pub fn run<B, F>(backend: Option<B>, paused: bool, test: impl FnOnce(Arc<B>) -> F)
where
    B: Backend,
    F: Future<Output = ()>,
{
    let Some(backend) = backend else { return };
    let mut builder = tokio::runtime::Builder::new_current_thread();
    builder.enable_all().start_paused(paused);
    builder.build().expect("a runtime").block_on(test(Arc::new(backend)));
}

/// One `#[test]` per suite test, for the backend `$make` builds (`None`:
/// its server is missing, see `support::missing`).
///
/// `operator = true` adds the cases of the operator's door. A backend that
/// implements `record`, `in_doubt` and `resolve` must list it; the in-memory
/// ledger does not implement them yet, and joins by writing
/// `conformance!(Some(Memory), paused = true, operator = true)`.
#[macro_export]
macro_rules! conformance {
    ($make:expr, paused = $paused:expr, operator = true) => {
        $crate::conformance!($make, paused = $paused);
        $crate::conformance!(@tests $make, $paused;
            a_record_in_doubt_is_listed_and_shown,
            the_listing_is_bounded_by_its_limit,
            a_held_record_is_neither_listed_nor_resolved,
            a_decision_never_overwrites_what_a_call_proved,
            resolving_applied_completes_the_call_without_a_value,
            resolving_not_applied_gives_the_call_its_whole_budget,
            a_hold_past_its_lease_is_in_doubt_and_its_holder_is_fenced_by_a_decision,
            resolved_records_expire_like_finished_ones,
            an_unknown_key_has_no_record_and_resolves_to_none,
        );
    };
    ($make:expr, paused = $paused:expr) => {
        $crate::conformance!(@tests $make, $paused;
            fresh_claim_then_in_flight,
            concurrent_claims_give_one_holder,
            completed_value_is_replayed_by_another_handle,
            unserializable_value_is_completed_without_value,
            another_payload_is_a_mismatch,
            takeover_after_the_lease_fences_the_old_holder,
            budget_and_settle_time_carry_across_handles,
            abandon_ends_the_hold_at_once,
            settled_records_resume_with_their_budget,
            completed_records_expire_in_doubt_never,
            previous_bucket_record_answers_the_claim,
            fences_grow_across_keys_and_handles,
            hold_answers_for_its_fence_only_while_it_holds,
            hold_ends_with_the_lease_and_stays_ended_after_a_takeover,
        );
    };
    (@tests $make:expr, $paused:expr; $($name:ident,)*) => {
        $(
            #[test]
            fn $name() {
                $crate::suite::run($make, $paused, $crate::suite::$name);
            }
        )*
    };
}

// ---------------------------------------------------------------- helpers

/// A key of this test: random high bits, so tests sharing a store never meet.
pub fn key(n: u64) -> IdempotencyKey {
    IdempotencyKey::from_u128((u128::from(salt()) << 64) | u128::from(n))
}

fn salt() -> u64 {
    use std::hash::{BuildHasher, RandomState};
    thread_local!(static SALT: u64 = RandomState::new().hash_one(std::thread::current().id()));
    SALT.with(|s| *s)
}

pub fn fp(n: u128) -> PayloadDigest {
    PayloadDigest::from_u128(n)
}

pub fn first(settle: Settle) -> Progress {
    Progress { attempts: 1, after_ok: false, settle }
}

pub fn request(key: IdempotencyKey, fingerprint: PayloadDigest) -> ClaimRequest {
    ClaimRequest {
        key,
        fingerprint,
        previous: None,
        first: first(Settle::NOW),
        now: tokio::time::Instant::now(),
    }
}

async fn claim(ledger: &dyn Ledger, request: ClaimRequest) -> Claim {
    ledger.claim(request).await.expect("the store answers")
}

async fn fresh(ledger: &dyn Ledger, request: ClaimRequest) -> Fence {
    match claim(ledger, request).await.state {
        Claimed::Fresh(fence) => fence,
        other => panic!("expected a fresh claim, got {other:?}"),
    }
}

async fn resumed(ledger: &dyn Ledger, request: ClaimRequest) -> (Fence, Progress) {
    match claim(ledger, request).await.state {
        Claimed::Resume(fence, progress) => (fence, progress),
        other => panic!("expected a resumed claim, got {other:?}"),
    }
}

/// A value that serializes (or, with `serializes: false`, does not).
struct Value {
    n: u32,
    serializes: bool,
}

impl Recorded for Value {
    fn local(&self) -> Arc<dyn Any + Send + Sync> {
        Arc::new(self.n)
    }

    fn encode(&self) -> Option<Vec<u8>> {
        self.serializes.then(|| serde_json::to_vec(&self.n).expect("u32 serializes"))
    }
}

/// Waits until the store says the hold on `k` (taken just before) ended:
/// its lease passed on the store's clock. A backend without the operator's
/// door is given the lease and some slack instead.
pub async fn past_lease(ledger: &dyn Ledger, k: IdempotencyKey, lease: Duration) {
    sleep(lease).await;
    let started = tokio::time::Instant::now();
    loop {
        match ledger.record(k).await {
            Err(LedgerError::Unsupported(_)) => return sleep(SLACK).await,
            Ok(Some(view)) if view.state == RecordState::Held => {}
            _ => return,
        }
        assert!(started.elapsed() < PATIENCE, "the hold on {k} outlived its lease");
        sleep(Duration::from_millis(20)).await;
    }
}

/// Waits until the store says the finished record of `k` expired.
pub async fn past_ttl(ledger: &dyn Ledger, k: IdempotencyKey, ttl: Duration) {
    sleep(ttl).await;
    let started = tokio::time::Instant::now();
    loop {
        match ledger.record(k).await {
            Err(LedgerError::Unsupported(_)) => return sleep(SLACK).await,
            Ok(None) => return,
            _ => {}
        }
        assert!(started.elapsed() < PATIENCE, "the record of {k} outlived its TTL");
        sleep(Duration::from_millis(20)).await;
    }
}

fn replayed(replay: &Replay) -> Option<u32> {
    match replay {
        Replay::Local(value) => value.downcast_ref::<u32>().copied(),
        Replay::Encoded(bytes) => serde_json::from_slice(bytes).ok(),
        Replay::Unrecorded => None,
    }
}

// ---------------------------------------------------------------- the tests

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

pub async fn another_payload_is_a_mismatch<B: Backend>(b: Arc<B>) {
    let (ledger, other) = b.open(CONFIG).await;
    let k = key(5);
    let fence = fresh(&*ledger, request(k, fp(5))).await;
    assert!(matches!(claim(&*other, request(k, fp(6))).await.state, Claimed::Mismatch));
    ledger.finish(k, fence, End::Completed(&Value { n: 1, serializes: true })).await.unwrap();
    assert!(matches!(claim(&*other, request(k, fp(6))).await.state, Claimed::Mismatch));
}

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

pub async fn settled_records_resume_with_their_budget<B: Backend>(b: Arc<B>) {
    let (ledger, other) = b.open(CONFIG).await;
    let k = key(10);
    let fence = fresh(&*ledger, request(k, fp(10))).await;
    ledger.finish(k, fence, End::Settled).await.unwrap();
    let (_, progress) = resumed(&*other, request(k, fp(10))).await;
    assert_eq!(progress.attempts, 1);
}

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

/// An invoice service for the engine-level tests of a backend: it counts
/// what it was sent, and its verifier sees exactly that (a `high` tool reads
/// its OK answer back).
#[derive(Default)]
pub struct Invoices {
    sent: std::sync::Mutex<std::collections::HashSet<u64>>,
    dispatched: std::sync::atomic::AtomicU32,
}

static SEND_INVOICE: verified_tools::ToolSpec =
    verified_tools::ToolSpec::new("send_invoice", verified_tools::SideEffect::High).with_verifier();

impl Invoices {
    /// Sends `invoice` through the engine in `cx`.
    pub async fn send(
        &self,
        cx: &verified_tools::Context,
        invoice: u64,
    ) -> verified_tools::ToolResult<u64, std::io::Error> {
        use std::sync::atomic::Ordering;
        verified_tools::engine::call(
            cx,
            &SEND_INVOICE,
            &(invoice,),
            &(invoice,),
            |_attempt| {
                self.dispatched.fetch_add(1, Ordering::SeqCst);
                self.sent.lock().unwrap().insert(invoice);
                async move { Ok(invoice) }
            },
            Some(|_key| async move {
                match self.sent.lock().unwrap().contains(&invoice) {
                    true => verified_tools::Verdict::Holds(invoice),
                    false => verified_tools::Verdict::Absent,
                }
            }),
            verified_tools::ledger::Codec::serde(),
        )
        .await
    }

    /// Attempts dispatched so far.
    pub fn dispatched(&self) -> u32 {
        self.dispatched.load(std::sync::atomic::Ordering::SeqCst)
    }
}
