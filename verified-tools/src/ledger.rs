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

/// What [`Ledger::begin`] found for a key.
pub enum Begin {
    /// No record: the caller now holds the key.
    Claimed,
    /// An earlier call with this key ended in doubt, or was dropped after it
    /// dispatched. The caller now holds the key and must verify before it
    /// dispatches.
    Resume,
    /// A call with this key succeeded; this is its value.
    Completed(Stored),
    /// Another call holds the key right now.
    InFlight,
    /// The key is recorded with a different payload fingerprint.
    Mismatch,
}

/// How a call that held a key ended.
pub enum Finish {
    /// The effect happened: keep the value for replays.
    Completed(Stored),
    /// The effect did not happen: forget the key.
    Released,
    /// The effect is in doubt: the next call with this key must verify first.
    Ambiguous,
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

    /// Records how the call that holds `key` ended and releases it.
    fn finish(&self, key: IdempotencyKey, finish: Finish);
}

enum State {
    Held,
    InDoubt,
    Done(Stored),
}

struct Entry {
    fingerprint: PayloadDigest,
    state: State,
    /// When the call that holds or held the key started.
    since: Instant,
}

/// The in-memory ledger: a mutex-guarded map, never held across an await.
///
/// ```
/// use verified_tools::ledger::{Begin, Finish, Ledger, MemoryLedger};
/// use verified_tools::{IdempotencyKey, key::payload_digest};
/// use std::sync::Arc;
///
/// let ledger = MemoryLedger::new();
/// let key = IdempotencyKey::from_u128(1);
/// let fp = payload_digest(&42)?;
/// assert!(matches!(ledger.begin(key, fp)?, Begin::Claimed));
/// assert!(matches!(ledger.begin(key, fp)?, Begin::InFlight));
/// ledger.finish(key, Finish::Completed(Arc::new(7u32)));
/// let Begin::Completed(v) = ledger.begin(key, fp)? else { panic!() };
/// assert_eq!(v.downcast_ref::<u32>(), Some(&7));
/// assert!(matches!(ledger.begin(key, payload_digest(&43)?)?, Begin::Mismatch));
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub struct MemoryLedger {
    entries: Mutex<HashMap<u128, Entry, BuildHasherDefault<KeyHasher>>>,
    ttl: Duration,
    lease: Duration,
}

impl Default for MemoryLedger {
    fn default() -> Self {
        Self::new()
    }
}

impl MemoryLedger {
    /// An empty ledger whose records live 24 hours, as Stripe keeps keys.
    pub fn new() -> Self {
        Self::with_ttl(Duration::from_secs(24 * 3600))
    }

    /// An empty ledger whose finished records are forgotten after `ttl`
    /// (tokio time). Held keys never expire: their call is still running, or
    /// its drop guard will finish them.
    pub fn with_ttl(ttl: Duration) -> Self {
        Self { entries: Mutex::default(), ttl, lease: Duration::from_secs(600) }
    }

    /// Sets how long a call may hold a key (10 minutes by default). A key
    /// held longer is presumed abandoned (its holder hung or leaked): the
    /// next call takes it over in doubt, so it verifies before it dispatches.
    /// Set it above the longest a call can take (attempts × timeout + waits).
    pub fn with_lease(mut self, lease: Duration) -> Self {
        self.lease = lease;
        self
    }

    /// Forgets the finished records older than the TTL. Lookups already
    /// ignore them; this frees their memory.
    pub fn purge_expired(&self) {
        let now = Instant::now();
        self.lock().retain(|_, e| !self.expired(e, now));
    }

    fn expired(&self, entry: &Entry, now: Instant) -> bool {
        !matches!(entry.state, State::Held) && now.duration_since(entry.since) >= self.ttl
    }

    /// How many keys are recorded.
    pub fn len(&self) -> usize {
        self.lock().len()
    }

    /// Whether no key is recorded.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    fn lock(
        &self,
    ) -> std::sync::MutexGuard<'_, HashMap<u128, Entry, BuildHasherDefault<KeyHasher>>> {
        // A panic elsewhere cannot leave an entry half-written: every update
        // is a single insert or assignment.
        self.entries.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

impl Ledger for MemoryLedger {
    fn begin(&self, key: IdempotencyKey, fingerprint: PayloadDigest) -> Result<Begin, LedgerError> {
        let now = Instant::now();
        let mut map = self.lock();
        let fresh = Entry { fingerprint, state: State::Held, since: now };
        let entry = match map.get_mut(&key.as_u128()) {
            Some(entry) if !self.expired(entry, now) => entry,
            _ => {
                map.insert(key.as_u128(), fresh);
                return Ok(Begin::Claimed);
            }
        };
        if entry.fingerprint != fingerprint {
            return Ok(Begin::Mismatch);
        }
        Ok(match &entry.state {
            State::Held if now.duration_since(entry.since) < self.lease => Begin::InFlight,
            State::Held => {
                entry.since = now;
                Begin::Resume
            }
            State::Done(value) => Begin::Completed(Arc::clone(value)),
            State::InDoubt => {
                entry.state = State::Held;
                entry.since = now;
                Begin::Resume
            }
        })
    }

    fn finish(&self, key: IdempotencyKey, finish: Finish) {
        let mut map = self.lock();
        match finish {
            Finish::Released => {
                map.remove(&key.as_u128());
            }
            Finish::Completed(value) => {
                if let Some(entry) = map.get_mut(&key.as_u128()) {
                    entry.state = State::Done(value);
                }
            }
            Finish::Ambiguous => {
                if let Some(entry) = map.get_mut(&key.as_u128()) {
                    entry.state = State::InDoubt;
                }
            }
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
