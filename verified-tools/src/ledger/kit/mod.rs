//! The ledger contract as a test kit (feature `ledger-kit`): every rule of
//! the [contract](super#the-rules-a-backend-keeps) as an `async fn` generic
//! over a [`Backend`], for a third party's ledger to run through the same
//! door as the project's own (its memory, SQLite, Redis and PostgreSQL
//! ledgers run exactly these, in `verified-tools/tests/ledger_conformance/`).
//!
//! ```ignore
//! use std::sync::Arc;
//! use crate::ledger::kit::{self, Backend, Config};
//! use crate::ledger::Ledger;
//!
//! struct Mine;
//! impl Backend for Mine {
//!     async fn open(&self, config: Config) -> (Arc<dyn Ledger>, Arc<dyn Ledger>) {
//!         // two handles on one fresh, empty store, with config's lease and TTL
//!         # unimplemented!()
//!     }
//! }
//!
//! #[test]
//! fn fresh_claim_then_in_flight() {
//!     kit::run(Some(Mine), false, kit::fresh_claim_then_in_flight);
//! }
//! ```
//!
//! The ledger contract, as tests generic over the backend: every backend
//! of this project instantiates all of them. The operator's door
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

use crate::ledger::{
    Claim, ClaimRequest, Claimed, Fence, Ledger, LedgerError, Progress, RecordState, Recorded,
    Replay, Settle,
};
use crate::{IdempotencyKey, PayloadDigest};
use tokio::time::sleep;

/// How a backend's store is set up for one test.
#[derive(Debug, Clone, Copy)]
pub struct Config {
    /// How long a hold lasts.
    pub lease: Duration,
    /// How long a finished record is kept.
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
    /// Two handles on one fresh, empty store, set up as `config` says.
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

/// Payload fingerprint `n`.
pub fn fp(n: u128) -> PayloadDigest {
    PayloadDigest::from_u128(n)
}

/// A first attempt's progress, settling as `settle` says.
pub fn first(settle: Settle) -> Progress {
    Progress { attempts: 1, after_ok: false, settle }
}

/// A claim of `key` with `fingerprint`, its first attempt settled at once.
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

mod cases;

pub use cases::*;
