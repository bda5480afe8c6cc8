//! The in-memory ledger: sharded, bounded, in this process only.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use tokio::time::Instant;

mod claim;
mod operator;
mod shard;
mod tombs;

use self::shard::{Bounds, Entry, Padded, Shard, State, lock};

use super::{
    Claim, ClaimRequest, End, Fence, Ledger, LedgerFuture, Progress, RecordState, RecordView,
    Replay, Resolution, Settle,
};
#[cfg(doc)]
use super::{Claimed, LedgerError};
use crate::deadline::later;
use crate::{Clock, IdempotencyKey};

const SHARDS: usize = 64;

/// Tombstones per record of the cap unless set otherwise.
const TOMBSTONES_PER_RECORD: usize = 4;

/// Tombstones per shard at least unless set otherwise (4,096 in all, about
/// 300 KB): a small record cap still recognises repeats thousands of calls
/// later.
const MIN_SHARD_TOMBSTONES: usize = 64;

/// The stamp of a completed call's tombstone; one in doubt carries the stamp
/// of its queue entry instead.
const COMPLETED: u64 = u64::MAX;

/// Stale entries a doubt queue keeps beyond twice its live ones before it is
/// compacted: enough that compaction is rare, amortized O(1) per entry.
const STALE_SLACK: usize = 16;

/// What a claim of a key whose doubt was compacted resumes with: nothing is
/// known but "it may have happened", so the most conservative progress. No
/// attempt left, after an OK answer (nothing is dispatched again under the
/// key), never settled (an `Absent` read is not believed).
const COMPACTED_DOUBT: Progress =
    Progress { attempts: u32::MAX, after_ok: true, settle: Settle::Never };

/// The default ledger: records in this process, sharded so that workers do
/// not contend on one lock, bounded in memory.
///
/// # Three bounds
///
/// Keys are uniform hashes spread over 64 shards; each shard keeps 1/64 of
/// each bound.
///
/// - **Held and finished records**: [`capacity`](Self::capacity)
///   ([`DEFAULT_CAPACITY`](Self::DEFAULT_CAPACITY) by default). Completed and
///   settled records live for a TTL (24 h, as Stripe keeps keys). They sit in
///   a per-shard queue in the order they finished; expired ones are dropped
///   from its front as calls come, and when a shard reaches its share of the
///   cap the oldest finished record is evicted early. Held keys are never
///   evicted: a claim of a new key fails with [`LedgerError::Full`] (the call
///   is refused before it dispatches) only when its shard's share is all
///   held, i.e. by calls in flight, which the caller's concurrency bounds.
/// - **Records in doubt**: [`doubt_capacity`](Self::doubt_capacity) (the
///   record cap by default). They never expire. When a shard holds more than
///   its share, the oldest is compacted into a tombstone: never dropped, and
///   never a reason to refuse a call.
/// - **Tombstones**: [`tombstone_capacity`](Self::tombstone_capacity) (4 ×
///   the record cap by default, at least 4,096;
///   [`with_tombstones`](Self::with_tombstones)).
///
/// # Tombstones
///
/// A tombstone keeps what a repeat must know of a record the bounds pushed
/// out, in 16 bytes: the low 64 bits of its key and of its payload
/// fingerprint.
///
/// - A **completed** record evicted early by the cap (not one whose TTL
///   passed) leaves a tombstone that expires when the record would have. A
///   repeat of the key with the same fingerprint is answered
///   [`Claimed::Completed`]`(`[`Replay::Unrecorded`]`)`: the engine obtains
///   the value by verifying, and never dispatches again; with another
///   fingerprint, [`Claimed::Mismatch`]. A settled record leaves none: its
///   effect is known absent, so forgetting it only renews its budget.
/// - A record **in doubt** compacted leaves a tombstone that never expires.
///   A repeat of the key is answered [`Claimed::Resume`] with the most
///   conservative progress (`attempts: u32::MAX`, `after_ok: true`,
///   [`Settle::Never`]): the engine verifies first, dispatches nothing more
///   under the key, and does not believe an `Absent` read. The key becomes a
///   full held record again.
///
/// The horizon: a repeat of a completed call is recognised until its shard
/// has taken its share of capacity + tombstone capacity later calls (about
/// that many calls in all, keys being uniform), or for the TTL, whichever
/// is shorter; less the in-doubt tombstones its shard keeps. When the
/// tombstones overflow, the oldest completed tombstones go first, and only
/// then the oldest in doubt: that is the hard bound. A call in doubt is
/// forgotten only once its shard's share of doubt capacity + tombstone
/// capacity later calls ended in doubt with no completed tombstone left to
/// drop ([`forgotten`](Self::forgotten) counts them, and a `tracing` warning
/// tells of the 1st, 2nd, 4th, 8th, ... in a shard).
///
/// Why compact rather than refuse: the memory ledger's guarantees end with
/// the process anyway, and 16 bytes keep the knowledge that matters, "verify
/// before dispatching", at a fraction of a record's memory. Refusing every
/// new call once 100,000 calls are in doubt would turn a bounded fault into
/// an outage.
///
/// A false positive needs a new key whose low 64 bits equal a tombstone's in
/// its shard: at most 2<sup>-64</sup> per tombstone per claim (below
/// 2<sup>-51</sup> at the default bound). It costs a verification instead of
/// a dispatch, or, should the fingerprints differ, a refusal as key reuse.
///
/// Memory, measured with the bounds full (hash tables and queues with their
/// growth slack included): 64 bytes per completed tombstone, 53 per
/// tombstone in doubt, so about 26 MB for the default 400,000 tombstones of
/// 100,000 records, reached only after as many evictions. The 100,000
/// records themselves take about 19 MB (190 bytes each, a small value's
/// allocation included).
///
/// # Time
///
/// Time is tokio's ([`tokio::time::Instant`]), or the clock given to
/// [`with_clock`](Self::with_clock); a claim uses the caller's reading of it
/// ([`ClaimRequest::now`], the context's clock), so a call reads the clock
/// once. Leases and TTLs follow paused time in tests. A record or tombstone expires when it
/// reaches the front of its queue past its TTL: one queued behind a record
/// that finished later but was claimed earlier lives up to that call's
/// duration longer.
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
    /// Held and finished records per shard at most.
    shard_cap: usize,
    /// Records in doubt per shard before the oldest is compacted (`None`:
    /// `shard_cap`, following [`MemoryLedger::with_capacity`]).
    shard_doubt: Option<usize>,
    /// Tombstones per shard at most (`None`: `TOMBSTONES_PER_RECORD` ×
    /// `shard_cap`, at least `MIN_SHARD_TOMBSTONES`).
    shard_tombs: Option<usize>,
    /// Where its own reads of the time come from (`None`: tokio's); a claim
    /// brings the caller's.
    clock: Option<Arc<dyn Clock>>,
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
            .field("doubt_capacity", &self.doubt_capacity())
            .field("tombstones", &self.tombstones())
            .field("tombstone_capacity", &self.tombstone_capacity())
            .field("ttl", &self.ttl)
            .field("lease", &self.lease)
            .finish()
    }
}

impl MemoryLedger {
    /// The default record cap.
    pub const DEFAULT_CAPACITY: usize = 100_000;

    /// An empty ledger: records live 24 hours, keys are leased for 10
    /// minutes, at most [`DEFAULT_CAPACITY`](Self::DEFAULT_CAPACITY) held and
    /// finished records, as many in doubt, and 4 times as many tombstones.
    pub fn new() -> Self {
        let shards = (0..SHARDS).map(|_| Padded(Mutex::default())).collect();
        Self {
            shards,
            fences: AtomicU64::new(0),
            ttl: Duration::from_secs(24 * 3600),
            lease: Duration::from_secs(600),
            shard_cap: Self::DEFAULT_CAPACITY.div_ceil(SHARDS),
            shard_doubt: None,
            shard_tombs: None,
            clock: None,
        }
    }

    /// Reads the time from `clock` (tokio's by default): give it the clock
    /// of the contexts that use it ([`Context::with_clock`](crate::Context::with_clock))
    /// when that clock is not tokio's, so that leases, settle points and
    /// expiries are all on one clock.
    pub fn with_clock(mut self, clock: Arc<dyn Clock>) -> Self {
        self.clock = Some(clock);
        self
    }

    /// Now, on the ledger's clock.
    fn now(&self) -> Instant {
        match &self.clock {
            Some(clock) => Instant::from_std(clock.now()),
            None => Instant::now(),
        }
    }

    /// Sets how long completed and settled records, and the tombstones of
    /// completed ones, are kept. Records in doubt never expire: forgetting
    /// one would let the next call dispatch without verifying.
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

    /// Sets the cap on held and finished records (rounded up to a multiple
    /// of the shard count). The oldest finished records are evicted first,
    /// completed ones leaving a tombstone; held ones never. Unless set on
    /// their own, the doubt bound follows it, and the tombstone bound is 4
    /// times it (at least 4,096).
    pub fn with_capacity(mut self, records: usize) -> Self {
        self.shard_cap = records.div_ceil(SHARDS).max(1);
        self
    }

    /// Sets how many records in doubt are kept in full (rounded up to a
    /// multiple of the shard count; the record cap by default). Past it, the
    /// oldest in doubt is compacted into a tombstone.
    pub fn with_doubt_capacity(mut self, records: usize) -> Self {
        self.shard_doubt = Some(records.div_ceil(SHARDS).max(1));
        self
    }

    /// Sets how many tombstones are kept (rounded up to a multiple of the
    /// shard count, at least one per shard; 4 times the record cap by
    /// default, at least 4,096). Past it, the oldest completed tombstone
    /// goes, or if none is left, the oldest in doubt: see the
    /// [type docs](Self) for the horizon this gives and the memory it takes.
    pub fn with_tombstones(mut self, tombstones: usize) -> Self {
        self.shard_tombs = Some(tombstones.div_ceil(SHARDS).max(1));
        self
    }

    /// The cap on held and finished records.
    pub fn capacity(&self) -> usize {
        self.shard_cap * SHARDS
    }

    /// How many records in doubt are kept in full before the oldest is
    /// compacted into a tombstone.
    pub fn doubt_capacity(&self) -> usize {
        self.bounds().doubt * SHARDS
    }

    /// The bound on tombstones.
    pub fn tombstone_capacity(&self) -> usize {
        self.bounds().tombs * SHARDS
    }

    /// How many keys are recorded in full: held, finished (expired records
    /// not yet dropped included) and in doubt. At most
    /// [`capacity`](Self::capacity) + [`doubt_capacity`](Self::doubt_capacity),
    /// plus the keys resumed from doubt while their shard was all held.
    /// Tombstones are counted by [`tombstones`](Self::tombstones).
    pub fn len(&self) -> usize {
        self.shards.iter().map(|s| lock(&s.0).map.len()).sum()
    }

    /// Whether no key is recorded in full (tombstones aside).
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// How many tombstones are kept (expired ones not yet dropped included):
    /// at most [`tombstone_capacity`](Self::tombstone_capacity).
    pub fn tombstones(&self) -> usize {
        self.shards.iter().map(|s| lock(&s.0).tombs.map.len()).sum()
    }

    /// How many calls in doubt this ledger has forgotten at the hard bound:
    /// their tombstones were the oldest when the tombstones overflowed and
    /// no completed one was left to drop. A repeat of such a call is a fresh
    /// call. Zero until about doubt capacity + tombstone capacity calls are
    /// in doubt at once.
    pub fn forgotten(&self) -> u64 {
        self.shards.iter().map(|s| lock(&s.0).tombs.forgotten).sum()
    }

    /// Drops every expired record and tombstone now, rather than as calls
    /// come.
    pub fn purge_expired(&self) {
        let now = self.now();
        for shard in self.shards.iter() {
            lock(&shard.0).drop_expired(now);
        }
    }

    fn bounds(&self) -> Bounds {
        let records = self.shard_cap;
        Bounds {
            records,
            doubt: self.shard_doubt.unwrap_or(records),
            tombs: self.shard_tombs.unwrap_or_else(|| {
                records.saturating_mul(TOMBSTONES_PER_RECORD).max(MIN_SHARD_TOMBSTONES)
            }),
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
        let now = self.now();
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
            End::InDoubt => {
                shard.doubt(key.as_u128(), self.bounds());
                return LedgerFuture::ready(Ok(()));
            }
        };
        shard.finished.push_back((expires, key.as_u128()));
        // Keys resumed from doubt while the shard was all held took it over
        // its cap: the excess goes as their holds end.
        shard.make_room(0, self.bounds());
        LedgerFuture::ready(Ok(()))
    }

    fn abandon(&self, key: IdempotencyKey, fence: Fence) {
        let mut shard = self.shard(key);
        if shard.held(key, fence).is_ok() {
            shard.doubt(key.as_u128(), self.bounds());
        }
    }

    fn lease(&self) -> Duration {
        self.lease
    }

    fn hold(&self, key: IdempotencyKey, fence: Fence) -> LedgerFuture<'_, Option<Duration>> {
        let now = self.now();
        let mut shard = self.shard(key);
        let left = match shard.held(key, fence) {
            Ok(Entry { state: State::Held { since, .. }, .. }) => {
                self.lease.checked_sub(now.saturating_duration_since(*since))
            }
            _ => None,
        };
        LedgerFuture::ready(Ok(left.filter(|left| !left.is_zero())))
    }

    fn record(&self, key: IdempotencyKey) -> LedgerFuture<'_, Option<RecordView>> {
        LedgerFuture::ready(Ok(self.record_now(key)))
    }

    /// Compacted doubt (past the doubt bound) keeps only the low half of its
    /// key and is not listed: its claim still finds it.
    fn in_doubt(&self, limit: usize) -> LedgerFuture<'_, Vec<RecordView>> {
        LedgerFuture::ready(Ok(self.in_doubt_now(limit)))
    }

    fn resolve(
        &self,
        key: IdempotencyKey,
        resolution: Resolution,
    ) -> LedgerFuture<'_, Option<RecordState>> {
        LedgerFuture::ready(Ok(self.resolve_now(key, resolution)))
    }
}

fn settle_at(now: Instant, settle: Settle) -> Option<Instant> {
    match settle {
        Settle::After(d) => Some(later(now, d)),
        Settle::Never => None,
    }
}

#[cfg(test)]
mod tests;
