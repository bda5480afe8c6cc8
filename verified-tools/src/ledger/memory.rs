//! The in-memory ledger: sharded, bounded, in this process only.

use std::collections::{HashMap, VecDeque};
use std::hash::{BuildHasherDefault, Hasher};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use tokio::time::Instant;

use super::{
    Claim, ClaimRequest, Claimed, End, Fence, Ledger, LedgerError, LedgerFuture, Progress, Replay,
    Settle,
};
use crate::deadline::later;
use crate::{IdempotencyKey, PayloadDigest};

const SHARDS: usize = 64;

/// The default ledger: records in this process, sharded so that workers do
/// not contend on one lock, bounded by a record cap.
///
/// - Completed and settled records live for a TTL (24 h, as Stripe keeps
///   keys). They sit in a per-shard queue in the order they finished; expired
///   ones are dropped from its front as calls come, and when a shard reaches
///   its share of the cap the oldest finished record is evicted early.
/// - Records in doubt and held keys are never evicted: when a shard is full
///   of them, a claim fails with [`LedgerError::Full`] and the call is
///   refused before it dispatches.
/// - Time is tokio's ([`tokio::time::Instant`]): the caller's reading of it
///   in [`ClaimRequest::now`], so a call reads the clock once; leases and
///   TTLs follow paused time in tests.
///
/// Its guarantees end with the process: use `SqliteLedger` or `RedisLedger`
/// for calls that must survive a restart or be shared.
///
/// ```
/// use verified_tools::ledger::{ClaimRequest, Claimed, Ledger, MemoryLedger, Progress, Settle};
/// use verified_tools::{IdempotencyKey, PayloadDigest};
///
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let ledger = MemoryLedger::new();
/// let key = IdempotencyKey::from_u128(1);
/// let first = Progress { attempts: 1, after_ok: false, settle: Settle::NOW };
/// let now = tokio::time::Instant::now();
/// let request =
///     ClaimRequest { key, fingerprint: PayloadDigest::from_u128(1), previous: None, first, now };
/// assert!(matches!(ledger.claim(request).await?.state, Claimed::Fresh(_)));
/// assert!(matches!(ledger.claim(request).await?.state, Claimed::InFlight(_)));
/// # Ok(()) }
/// ```
pub struct MemoryLedger {
    shards: Box<[Padded]>,
    fences: AtomicU64,
    ttl: Duration,
    lease: Duration,
    /// Records per shard at most.
    shard_cap: usize,
}

/// One shard on its own cache line, so two workers locking neighbouring
/// shards do not share one.
#[repr(align(128))]
struct Padded(Mutex<Shard>);

#[derive(Default)]
struct Shard {
    map: HashMap<u128, Entry, BuildHasherDefault<KeyHasher>>,
    /// Finished (completed or settled) records, oldest first, with the
    /// expiry they had when queued. An entry whose record has changed since
    /// is stale and skipped.
    finished: VecDeque<(Instant, u128)>,
}

struct Entry {
    fingerprint: PayloadDigest,
    state: State,
    attempts: u32,
    after_ok: bool,
    /// When the last attempt settles (`None`: never).
    settle_at: Option<Instant>,
}

enum State {
    /// Held under this fence; the hold started at `since`.
    Held {
        fence: Fence,
        since: Instant,
    },
    InDoubt,
    Settled {
        expires: Instant,
    },
    Done {
        value: Replay,
        expires: Instant,
    },
}

impl Entry {
    fn expires(&self) -> Option<Instant> {
        match self.state {
            State::Settled { expires } | State::Done { expires, .. } => Some(expires),
            State::Held { .. } | State::InDoubt => None,
        }
    }

    fn progress(&self, now: Instant) -> Progress {
        let settle = match self.settle_at {
            Some(at) => Settle::After(at.saturating_duration_since(now)),
            None => Settle::Never,
        };
        Progress { attempts: self.attempts, after_ok: self.after_ok, settle }
    }
}

impl Default for MemoryLedger {
    fn default() -> Self {
        Self::new()
    }
}

impl std::fmt::Debug for MemoryLedger {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MemoryLedger")
            .field("records", &self.len())
            .field("capacity", &self.capacity())
            .field("ttl", &self.ttl)
            .field("lease", &self.lease)
            .finish()
    }
}

impl MemoryLedger {
    /// The default record cap.
    pub const DEFAULT_CAPACITY: usize = 100_000;

    /// An empty ledger: records live 24 hours, keys are leased for 10
    /// minutes, at most [`DEFAULT_CAPACITY`](Self::DEFAULT_CAPACITY) records.
    pub fn new() -> Self {
        let shards = (0..SHARDS).map(|_| Padded(Mutex::default())).collect();
        Self {
            shards,
            fences: AtomicU64::new(0),
            ttl: Duration::from_secs(24 * 3600),
            lease: Duration::from_secs(600),
            shard_cap: Self::DEFAULT_CAPACITY.div_ceil(SHARDS),
        }
    }

    /// Sets how long completed and settled records are kept. Records in
    /// doubt never expire: forgetting one would let the next call dispatch
    /// without verifying.
    pub fn with_ttl(mut self, ttl: Duration) -> Self {
        self.ttl = ttl;
        self
    }

    /// Sets how long a call may hold a key (10 minutes by default): past it,
    /// the next call takes the key over in doubt. It must outlast every
    /// call's deadline ([`RetryPolicy::call_timeout`](crate::RetryPolicy::call_timeout)):
    /// the engine refuses calls whose deadline is longer.
    pub fn with_lease(mut self, lease: Duration) -> Self {
        self.lease = lease;
        self
    }

    /// Sets the record cap (rounded up to a multiple of the shard count).
    /// The oldest finished records are evicted first; records in doubt never.
    pub fn with_capacity(mut self, records: usize) -> Self {
        self.shard_cap = records.div_ceil(SHARDS).max(1);
        self
    }

    /// The record cap.
    pub fn capacity(&self) -> usize {
        self.shard_cap * SHARDS
    }

    /// How many keys are recorded (expired records not yet dropped included).
    pub fn len(&self) -> usize {
        self.shards.iter().map(|s| lock(&s.0).map.len()).sum()
    }

    /// Whether no key is recorded.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Drops every expired record now, rather than as calls come.
    pub fn purge_expired(&self) {
        let now = Instant::now();
        for shard in self.shards.iter() {
            lock(&shard.0).drop_expired(now);
        }
    }

    fn shard(&self, key: IdempotencyKey) -> MutexGuard<'_, Shard> {
        // The high bits: the map's hasher uses the low ones.
        let index = (key.as_u128() >> 64) as usize % SHARDS;
        lock(&self.shards[index].0)
    }

    fn fence(&self) -> Fence {
        Fence(self.fences.fetch_add(1, Ordering::Relaxed) + 1)
    }

    fn claim_now(&self, request: ClaimRequest, now: Instant) -> Result<Claim, LedgerError> {
        if let Some((previous, fingerprint)) = request.previous {
            let mut shard = self.shard(previous);
            shard.drop_expired(now);
            if shard.map.get(&previous.as_u128()).is_some_and(|e| e.fingerprint == fingerprint) {
                let state = self.take(&mut shard, previous, fingerprint, request.first, now)?;
                return Ok(Claim { key: previous, state });
            }
        }
        let mut shard = self.shard(request.key);
        shard.drop_expired(now);
        let state = self.take(&mut shard, request.key, request.fingerprint, request.first, now)?;
        Ok(Claim { key: request.key, state })
    }

    /// The claim of one key in its (locked) shard.
    fn take(
        &self,
        shard: &mut Shard,
        key: IdempotencyKey,
        fingerprint: PayloadDigest,
        first: Progress,
        now: Instant,
    ) -> Result<Claimed, LedgerError> {
        let k = key.as_u128();
        let Some(entry) = shard.map.get_mut(&k) else {
            if shard.map.len() >= self.shard_cap && !shard.evict_one() {
                return Err(LedgerError::Full(self.capacity()));
            }
            let fence = self.fence();
            let settle_at = settle_at(now, first.settle);
            let state = State::Held { fence, since: now };
            let (attempts, after_ok) = (first.attempts, first.after_ok);
            shard.map.insert(k, Entry { fingerprint, state, attempts, after_ok, settle_at });
            return Ok(Claimed::Fresh(fence));
        };
        if entry.fingerprint != fingerprint {
            return Ok(Claimed::Mismatch);
        }
        match &entry.state {
            State::Done { value, .. } => Ok(Claimed::Completed(share(value))),
            State::Held { since, .. } if now < later(*since, self.lease) => {
                Ok(Claimed::InFlight(later(*since, self.lease) - now))
            }
            // In doubt, settled with budget left, or held past the lease (the
            // holder may have dispatched): the taker verifies first.
            State::Held { .. } | State::InDoubt | State::Settled { .. } => {
                let fence = self.fence();
                entry.state = State::Held { fence, since: now };
                Ok(Claimed::Resume(fence, entry.progress(now)))
            }
        }
    }
}

impl Shard {
    /// Drops the expired records at the front of the finished queue.
    #[inline]
    fn drop_expired(&mut self, now: Instant) {
        while let Some(&(expires, key)) = self.finished.front() {
            if expires > now {
                return;
            }
            self.finished.pop_front();
            if self.map.get(&key).and_then(Entry::expires) == Some(expires) {
                self.map.remove(&key);
            }
        }
    }

    /// Evicts the oldest finished record; `false` if there is none.
    fn evict_one(&mut self) -> bool {
        while let Some((expires, key)) = self.finished.pop_front() {
            if self.map.get(&key).and_then(Entry::expires) == Some(expires) {
                self.map.remove(&key);
                return true;
            }
        }
        false
    }

    /// The entry of `key` if `fence` holds it.
    fn held(&mut self, key: IdempotencyKey, fence: Fence) -> Result<&mut Entry, LedgerError> {
        match self.map.get_mut(&key.as_u128()) {
            Some(entry) if matches!(entry.state, State::Held { fence: f, .. } if f == fence) => {
                Ok(entry)
            }
            _ => Err(LedgerError::Fenced(fence)),
        }
    }
}

impl Ledger for MemoryLedger {
    fn claim(&self, request: ClaimRequest) -> LedgerFuture<'_, Claim> {
        LedgerFuture::ready(self.claim_now(request, request.now))
    }

    fn dispatching(
        &self,
        key: IdempotencyKey,
        fence: Fence,
        progress: Progress,
    ) -> LedgerFuture<'_, ()> {
        let now = Instant::now();
        let mut shard = self.shard(key);
        LedgerFuture::ready(shard.held(key, fence).map(|entry| {
            entry.attempts = progress.attempts;
            entry.after_ok = progress.after_ok;
            entry.settle_at = settle_at(now, progress.settle);
        }))
    }

    fn finish<'a>(
        &'a self,
        key: IdempotencyKey,
        fence: Fence,
        end: End<'a>,
    ) -> LedgerFuture<'a, ()> {
        let mut shard = self.shard(key);
        let entry = match shard.held(key, fence) {
            Ok(entry) => entry,
            Err(e) => return LedgerFuture::ready(Err(e)),
        };
        // The claim's clock read stands in for "now": the record expires a
        // call's duration early rather than costing a second read.
        let State::Held { since, .. } = entry.state else { unreachable!("held() checked") };
        let expires = later(since, self.ttl);
        entry.state = match end {
            End::Completed(value) => State::Done { value: Replay::Local(value.local()), expires },
            End::Settled => State::Settled { expires },
            End::InDoubt => State::InDoubt,
        };
        if entry.expires().is_some() {
            shard.finished.push_back((expires, key.as_u128()));
        }
        LedgerFuture::ready(Ok(()))
    }

    fn abandon(&self, key: IdempotencyKey, fence: Fence) {
        if let Ok(entry) = self.shard(key).held(key, fence) {
            entry.state = State::InDoubt;
        }
    }

    fn lease(&self) -> Duration {
        self.lease
    }
}

fn share(value: &Replay) -> Replay {
    match value {
        Replay::Local(value) => Replay::Local(Arc::clone(value)),
        Replay::Encoded(bytes) => Replay::Encoded(bytes.clone()),
        Replay::Unrecorded => Replay::Unrecorded,
    }
}

fn settle_at(now: Instant, settle: Settle) -> Option<Instant> {
    match settle {
        Settle::After(d) => Some(later(now, d)),
        Settle::Never => None,
    }
}

fn lock(shard: &Mutex<Shard>) -> MutexGuard<'_, Shard> {
    // Every update is a single insert or assignment: a panic elsewhere
    // cannot leave an entry half-written.
    shard.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Keys are already uniform 128-bit hashes: hashing them again (SipHash)
/// was most of the ledger's cost per call. Their low 64 bits are the hash.
#[derive(Default)]
struct KeyHasher(u64);

impl Hasher for KeyHasher {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write(&mut self, bytes: &[u8]) {
        // Only reached for non-u128 input, which this map never hashes; fold
        // it in anyway rather than ignore it.
        for &b in bytes {
            self.0 = self.0.rotate_left(8) ^ u64::from(b);
        }
    }

    fn write_u128(&mut self, key: u128) {
        self.0 = key as u64;
    }
}
