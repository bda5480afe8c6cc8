//! The in-memory ledger: sharded, bounded, in this process only.

use std::collections::{HashMap, VecDeque};
use std::hash::{BuildHasherDefault, Hasher};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use tokio::time::Instant;

mod operator;
mod tombs;

use self::tombs::{Tomb, Tombs};
use super::record::{self, ClaimStep, Found, FoundState};

use super::{
    Claim, ClaimRequest, Claimed, End, Fence, Ledger, LedgerError, LedgerFuture, Progress,
    RecordState, RecordView, Replay, Resolution, Settle,
};
use crate::deadline::later;
use crate::{Clock, IdempotencyKey, PayloadDigest};

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

/// The per-shard bounds, resolved once per operation.
#[derive(Debug, Clone, Copy)]
struct Bounds {
    records: usize,
    doubt: usize,
    tombs: usize,
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
    /// Records in doubt, oldest first, with the stamp each got. An entry
    /// whose record no longer has that stamp (it was resumed) is stale.
    doubt: VecDeque<(u64, u128)>,
    /// Entries of `map` in doubt: they count against the doubt bound, the
    /// others against the record cap.
    doubts: usize,
    /// The last stamp given, in this shard.
    stamps: u64,
    tombs: Tombs,
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
    /// In doubt since the shard's stamp `stamp` (its doubt queue entry).
    InDoubt {
        stamp: u64,
    },
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
            State::Held { .. } | State::InDoubt { .. } => None,
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

    fn claim_now(&self, request: ClaimRequest, now: Instant) -> Result<Claim, LedgerError> {
        if let Some((previous, fingerprint)) = request.previous {
            let mut shard = self.shard(previous);
            shard.drop_expired(now);
            let p = previous.as_u128();
            let recorded = match shard.map.get(&p) {
                Some(entry) => entry.fingerprint == fingerprint,
                // A record the bounds compacted answers for its key as well.
                None => {
                    shard.tombs.get(p as u64).is_some_and(|t| t.fingerprint == low(fingerprint))
                }
            };
            if recorded {
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
        let entry = shard.map.get_mut(&k);
        let found = entry
            .as_deref()
            .map(|e| Found { fingerprint: e.fingerprint, state: self.found_state(&e.state, now) });
        match (record::claim_step(found, fingerprint), entry) {
            (ClaimStep::Mismatch, _) => Ok(Claimed::Mismatch),
            (ClaimStep::Wait(left), _) => Ok(Claimed::InFlight(left)),
            (ClaimStep::Replay, Some(Entry { state: State::Done { value, .. }, .. })) => {
                Ok(Claimed::Completed(share(value)))
            }
            (ClaimStep::TakeOver, Some(entry)) => {
                let was_in_doubt = matches!(entry.state, State::InDoubt { .. });
                let fence = self.fence();
                entry.state = State::Held { fence, since: now };
                let progress = entry.progress(now);
                if was_in_doubt {
                    // Held, it counts against the record cap again.
                    shard.doubts -= 1;
                    shard.make_room(0, self.bounds());
                }
                Ok(Claimed::Resume(fence, progress))
            }
            (ClaimStep::Create, _) => {
                let bounds = self.bounds();
                // One lookup decides whether the key is new or was pushed out.
                if let Some(tomb) = shard.tombs.get(k as u64) {
                    return Ok(self.exhume(shard, k, fingerprint, tomb, now, bounds));
                }
                if !shard.make_room(1, bounds) {
                    return Err(LedgerError::Full(self.capacity()));
                }
                let fence = self.fence();
                let settle_at = settle_at(now, first.settle);
                let state = State::Held { fence, since: now };
                let (attempts, after_ok) = (first.attempts, first.after_ok);
                shard.map.insert(k, Entry { fingerprint, state, attempts, after_ok, settle_at });
                Ok(Claimed::Fresh(fence))
            }
            // A step that does not fit the entry (`found` describes it, so
            // never): refused, and nothing overwritten.
            (ClaimStep::Replay | ClaimStep::TakeOver, _) => Err(LedgerError::Corrupt(
                super::StoreError::new("memory: a record and its state disagree"),
            )),
        }
    }

    /// A record's state as the contract's claim rules read it.
    fn found_state(&self, state: &State, now: Instant) -> FoundState {
        match state {
            State::Held { since, .. } => FoundState::Held {
                lease_left: later(*since, self.lease).saturating_duration_since(now),
            },
            State::InDoubt { .. } => FoundState::InDoubt,
            State::Settled { .. } => FoundState::Settled,
            State::Done { .. } => FoundState::Completed,
        }
    }

    /// The claim of a key found only as a tombstone.
    fn exhume(
        &self,
        shard: &mut Shard,
        k: u128,
        fingerprint: PayloadDigest,
        tomb: Tomb,
        now: Instant,
        bounds: Bounds,
    ) -> Claimed {
        if tomb.fingerprint != low(fingerprint) {
            return Claimed::Mismatch;
        }
        if tomb.stamp == COMPLETED {
            return Claimed::Completed(Replay::Unrecorded);
        }
        shard.tombs.exhume(k as u64);
        let fence = self.fence();
        let state = State::Held { fence, since: now };
        let Progress { attempts, after_ok, .. } = COMPACTED_DOUBT;
        shard.map.insert(k, Entry { fingerprint, state, attempts, after_ok, settle_at: None });
        // A shard all held takes it over its cap rather than refuse a call
        // known in doubt: held records are bounded by the calls in flight.
        shard.make_room(0, bounds);
        Claimed::Resume(fence, COMPACTED_DOUBT)
    }
}

impl Shard {
    /// Drops the expired records and tombstones at the front of their
    /// queues.
    #[inline]
    fn drop_expired(&mut self, now: Instant) {
        while let Some(&(expires, key)) = self.finished.front() {
            if expires > now {
                break;
            }
            self.finished.pop_front();
            if self.map.get(&key).and_then(Entry::expires) == Some(expires) {
                self.map.remove(&key);
            }
        }
        self.tombs.drop_expired(now);
    }

    /// Held and finished records: those the record cap counts.
    fn live(&self) -> usize {
        self.map.len() - self.doubts
    }

    /// Evicts the oldest finished records until `incoming` more fit under
    /// the cap; `false` if the rest are held.
    fn make_room(&mut self, incoming: usize, bounds: Bounds) -> bool {
        while self.live() + incoming > bounds.records {
            if !self.evict_one(bounds) {
                return false;
            }
        }
        true
    }

    /// Evicts the oldest finished record, a completed one into a tombstone;
    /// `false` if there is none.
    fn evict_one(&mut self, bounds: Bounds) -> bool {
        while let Some((expires, key)) = self.finished.pop_front() {
            if self.map.get(&key).and_then(Entry::expires) != Some(expires) {
                continue;
            }
            if let Some(Entry { state: State::Done { .. }, fingerprint, .. }) =
                self.map.remove(&key)
            {
                self.tombs.bury_completed(key as u64, low(fingerprint), expires, bounds.tombs);
            }
            return true;
        }
        false
    }

    /// The held record of `key` is now in doubt; past the doubt bound, the
    /// oldest in doubt is compacted.
    fn doubt(&mut self, key: u128, bounds: Bounds) {
        self.stamps += 1;
        let stamp = self.stamps;
        let Some(entry) = self.map.get_mut(&key) else { return };
        entry.state = State::InDoubt { stamp };
        self.doubts += 1;
        self.doubt.push_back((stamp, key));
        if self.doubt.len() > 2 * self.doubts + STALE_SLACK {
            self.doubt.retain(|&(stamp, key)| in_doubt(self.map.get(&key), stamp));
        }
        if self.doubts > bounds.doubt {
            self.compact_oldest_doubt(bounds);
        }
    }

    /// Compacts the oldest record in doubt into a tombstone.
    fn compact_oldest_doubt(&mut self, bounds: Bounds) {
        while let Some((stamp, key)) = self.doubt.pop_front() {
            if !in_doubt(self.map.get(&key), stamp) {
                continue;
            }
            if let Some(entry) = self.map.remove(&key) {
                self.doubts -= 1;
                self.tombs.bury_in_doubt(key as u64, low(entry.fingerprint), stamp, bounds.tombs);
            }
            return;
        }
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

fn in_doubt(entry: Option<&Entry>, stamp: u64) -> bool {
    matches!(entry, Some(Entry { state: State::InDoubt { stamp: s }, .. }) if *s == stamp)
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

/// What a tombstone keeps of a fingerprint.
fn low(fingerprint: PayloadDigest) -> u64 {
    fingerprint.as_u128() as u64
}

fn lock(shard: &Mutex<Shard>) -> MutexGuard<'_, Shard> {
    // Every update leaves the shard consistent at each step a panic could
    // interrupt (an insert, a removal, an assignment, a count after it).
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
        // Only reached for input other than u128 and u64, which these maps
        // never hash; fold it in anyway rather than ignore it.
        for &b in bytes {
            self.0 = self.0.rotate_left(8) ^ u64::from(b);
        }
    }

    fn write_u128(&mut self, key: u128) {
        self.0 = key as u64;
    }

    fn write_u64(&mut self, key: u64) {
        // A tombstone's key: the low 64 bits of a key.
        self.0 = key;
    }
}

#[cfg(test)]
mod tests;
