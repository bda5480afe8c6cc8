//! The call ledger: one record per key, so a repeated logical call returns
//! the recorded outcome instead of executing again.

use std::any::Any;
use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use tokio::time::Instant;

use crate::{IdempotencyKey, PayloadDigest};

/// A recorded success value, type-erased (the engine downcasts it back).
pub type Stored = Arc<dyn Any + Send + Sync>;

/// Proof of holding a key. [`Ledger::finish`] is ignored unless it comes
/// with the key's current hold, so a call presumed dead whose key was taken
/// over cannot overwrite its successor's record when it wakes up.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Hold(pub u64);

/// What calls in doubt left behind under a key.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Doubt {
    /// Attempts dispatched under the key so far, by every call together: the
    /// retry budget is per logical call, not per invocation.
    pub attempts: u32,
    /// The last attempt answered OK but the verifier did not confirm it: the
    /// server has recorded the key, so nothing is dispatched under it again.
    pub after_ok: bool,
}

/// What [`Ledger::begin`] found for a key.
#[derive(Debug)]
pub enum Begin {
    /// No record: the caller now holds the key.
    Claimed(Hold),
    /// Earlier calls with this key dispatched without proving the effect
    /// (they ended in doubt or known absent, were dropped, or held the key
    /// past its lease). The caller now holds the key; the engine verifies
    /// before it dispatches (when the tool has a verifier and the mode
    /// verifies) and uses only the rest of the key's budget.
    Resume(Hold, Doubt),
    /// A call with this key succeeded; this is its value.
    Completed(Stored),
    /// Another call holds the key right now.
    InFlight,
    /// The key is recorded with a different payload fingerprint.
    Mismatch,
}

/// How a call that held a key ended.
#[derive(Debug)]
pub enum Finish {
    /// The effect happened: keep the value for replays.
    Completed(Stored),
    /// Nothing was dispatched under the key, by any call: forget it.
    Released,
    /// Attempts went out and the effect is known not to have happened
    /// (a definitive error, or verified absent): kept for the TTL, so a
    /// repeat uses only the rest of the key's budget.
    Settled(Doubt),
    /// Attempts went out and the effect is in doubt (unknown, escalated,
    /// cancelled): kept until a call proves it, so the next call with this
    /// key verifies first.
    InDoubt(Doubt),
}

/// A ledger backend failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct LedgerError(pub String);

/// Storage of call records, keyed by idempotency key.
///
/// The methods are synchronous on purpose: the engine calls [`finish`] from a
/// drop guard when a call's future is cancelled, and no lock may be held
/// across an await. A networked backend keeps a local write-through view or
/// blocks briefly; durable backends are future work.
///
/// [`finish`]: Ledger::finish
pub trait Ledger: Send + Sync {
    /// Looks the key up and, when free (or in doubt), claims it for the caller.
    fn begin(&self, key: IdempotencyKey, fingerprint: PayloadDigest) -> Result<Begin, LedgerError>;

    /// Records, before an attempt goes out, what the holder has done so far,
    /// so that a call taking the key over after the lease inherits it.
    /// Returns `false` when the hold is stale (the key was taken over): the
    /// caller must then not dispatch.
    fn dispatching(&self, key: IdempotencyKey, hold: Hold, doubt: Doubt) -> bool;

    /// Records how the call that holds `key` under `hold` ended and releases
    /// the key. A stale hold (the key was taken over) changes nothing.
    fn finish(&self, key: IdempotencyKey, hold: Hold, finish: Finish);
}

enum State {
    /// Held by a call; the doubt earlier calls left, for a takeover.
    Held(Hold, Doubt),
    InDoubt(Doubt),
    Settled(Doubt),
    Done(Stored),
}

struct Entry {
    fingerprint: PayloadDigest,
    state: State,
    /// When the key was claimed (for the lease) or finished (for the TTL).
    since: Instant,
}

struct Records {
    map: HashMap<u128, Entry, BuildHasherDefault<KeyHasher>>,
    next_hold: u64,
    /// Size of the map after the last sweep of expired records.
    swept_at: usize,
}

impl Records {
    fn hold(&mut self) -> Hold {
        self.next_hold += 1;
        Hold(self.next_hold)
    }
}

/// The in-memory ledger: a mutex-guarded map, never held across an await.
///
/// Completed and settled records (a success to replay; a failure whose
/// budget a repeat must not renew) are kept for a TTL (24 h, as Stripe keeps
/// keys) and swept as the map grows. Records in doubt are kept until a call
/// proves the effect: only genuinely unknown outcomes stay.
///
/// ```
/// use verified_tools::ledger::{Begin, Finish, Ledger, MemoryLedger};
/// use verified_tools::{IdempotencyKey, key::payload_digest};
/// use std::sync::Arc;
///
/// let ledger = MemoryLedger::new();
/// let key = IdempotencyKey::from_u128(1);
/// let fp = payload_digest(&42)?;
/// let Begin::Claimed(hold) = ledger.begin(key, fp)? else { panic!() };
/// assert!(matches!(ledger.begin(key, fp)?, Begin::InFlight));
/// ledger.finish(key, hold, Finish::Completed(Arc::new(7u32)));
/// let Begin::Completed(v) = ledger.begin(key, fp)? else { panic!() };
/// assert_eq!(v.downcast_ref::<u32>(), Some(&7));
/// assert!(matches!(ledger.begin(key, payload_digest(&43)?)?, Begin::Mismatch));
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub struct MemoryLedger {
    records: Mutex<Records>,
    ttl: Duration,
    lease: Duration,
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
            .field("ttl", &self.ttl)
            .field("lease", &self.lease)
            .finish()
    }
}

/// Fewest records before the map is swept of expired ones.
const SWEEP_FLOOR: usize = 1024;

impl MemoryLedger {
    /// An empty ledger whose completed records live 24 hours, as Stripe
    /// keeps keys, and whose keys are leased for 10 minutes.
    pub fn new() -> Self {
        Self::with_ttl(Duration::from_secs(24 * 3600))
    }

    /// An empty ledger whose completed and settled records are forgotten
    /// `ttl` after they were written (tokio time); a call with that key then
    /// starts afresh, as it would on a server that forgot the key. Records
    /// in doubt never expire: forgetting one would let the next call
    /// dispatch without verifying.
    pub fn with_ttl(ttl: Duration) -> Self {
        let records = Records { map: HashMap::default(), next_hold: 0, swept_at: 0 };
        Self { records: Mutex::new(records), ttl, lease: Duration::from_secs(600) }
    }

    /// Sets how long a call may hold a key (10 minutes by default). A key
    /// held longer is presumed abandoned (its holder hung or leaked): the
    /// next call takes it over in doubt, so it verifies before it dispatches,
    /// and the old holder's late `finish` is ignored. Set it above the
    /// longest a call can take (attempts × timeout + waits).
    pub fn with_lease(mut self, lease: Duration) -> Self {
        self.lease = lease;
        self
    }

    /// The lease of a held key.
    pub fn lease(&self) -> Duration {
        self.lease
    }

    /// How many keys are recorded.
    pub fn len(&self) -> usize {
        self.lock().map.len()
    }

    /// Whether no key is recorded.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Forgets the completed records older than the TTL now, rather than at
    /// the next sweep. Lookups already ignore them.
    pub fn purge_expired(&self) {
        let now = Instant::now();
        let mut records = self.lock();
        records.map.retain(|_, e| !self.expired(e, now));
        records.swept_at = records.map.len();
    }

    fn expired(&self, entry: &Entry, now: Instant) -> bool {
        matches!(entry.state, State::Done(_) | State::Settled(_))
            && now.duration_since(entry.since) >= self.ttl
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Records> {
        // A panic elsewhere cannot leave an entry half-written: every update
        // is a single insert or assignment.
        self.records.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

impl Ledger for MemoryLedger {
    fn begin(&self, key: IdempotencyKey, fingerprint: PayloadDigest) -> Result<Begin, LedgerError> {
        let now = Instant::now();
        let mut records = self.lock();
        // Amortised sweep: the map may at most double between two sweeps.
        if records.map.len() >= (2 * records.swept_at).max(SWEEP_FLOOR) {
            records.map.retain(|_, e| !self.expired(e, now));
            records.swept_at = records.map.len();
        }
        let hold = records.hold();
        let held = |doubt| Entry { fingerprint, state: State::Held(hold, doubt), since: now };
        let Some(entry) = records.map.get_mut(&key.as_u128()) else {
            records.map.insert(key.as_u128(), held(Doubt::default()));
            return Ok(Begin::Claimed(hold));
        };
        if self.expired(entry, now) {
            *entry = held(Doubt::default());
            return Ok(Begin::Claimed(hold));
        }
        if entry.fingerprint != fingerprint {
            return Ok(Begin::Mismatch);
        }
        Ok(match entry.state {
            State::Held(_, _) if now.duration_since(entry.since) < self.lease => Begin::InFlight,
            State::Done(ref value) => Begin::Completed(Arc::clone(value)),
            // In doubt, or held past the lease: the holder may have
            // dispatched, so the taker verifies first.
            State::Held(_, doubt) | State::InDoubt(doubt) | State::Settled(doubt) => {
                *entry = held(doubt);
                Begin::Resume(hold, doubt)
            }
        })
    }

    fn dispatching(&self, key: IdempotencyKey, hold: Hold, doubt: Doubt) -> bool {
        let mut records = self.lock();
        match records.map.get_mut(&key.as_u128()) {
            Some(Entry { state: State::Held(current, recorded), .. }) if *current == hold => {
                *recorded = doubt;
                true
            }
            _ => false,
        }
    }

    fn finish(&self, key: IdempotencyKey, hold: Hold, finish: Finish) {
        let mut records = self.lock();
        let Some(entry) = records.map.get_mut(&key.as_u128()) else { return };
        if !matches!(entry.state, State::Held(current, _) if current == hold) {
            return;
        }
        entry.since = Instant::now();
        match finish {
            Finish::Released => {
                records.map.remove(&key.as_u128());
            }
            Finish::Completed(value) => entry.state = State::Done(value),
            Finish::InDoubt(doubt) => entry.state = State::InDoubt(doubt),
            Finish::Settled(doubt) => entry.state = State::Settled(doubt),
        }
    }
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
