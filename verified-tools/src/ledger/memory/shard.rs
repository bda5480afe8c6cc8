//! A shard of the memory ledger: its records, the queues that say which go
//! first when a bound is reached, its counts, and the hasher of its maps.
//! Apart from the handle because a shard keeps its own invariants under its
//! own lock: the handle picks the shard and says what a call did; the shard
//! keeps itself within its bounds.

use std::collections::{HashMap, VecDeque};
use std::hash::{BuildHasherDefault, Hasher};
use std::sync::{Mutex, MutexGuard, PoisonError};

use tokio::time::Instant;

use super::STALE_SLACK;
use super::tombs::{Tombs, low};
use crate::ledger::{Fence, LedgerError, Progress, Replay, Settle};
use crate::{IdempotencyKey, PayloadDigest};

/// The per-shard bounds, resolved once per operation.
#[derive(Debug, Clone, Copy)]
pub(super) struct Bounds {
    pub(super) records: usize,
    pub(super) doubt: usize,
    pub(super) tombs: usize,
}

/// One shard on its own cache line, so two workers locking neighbouring
/// shards do not share one.
#[repr(align(128))]
pub(super) struct Padded(pub(super) Mutex<Shard>);

#[derive(Default)]
pub(super) struct Shard {
    pub(super) map: HashMap<u128, Entry, BuildHasherDefault<KeyHasher>>,
    /// Finished (completed or settled) records, oldest first, with the
    /// expiry they had when queued. An entry whose record has changed since
    /// is stale and skipped.
    pub(super) finished: VecDeque<(Instant, u128)>,
    /// Records in doubt, oldest first, with the stamp each got. An entry
    /// whose record no longer has that stamp (it was resumed) is stale.
    pub(super) doubt: VecDeque<(u64, u128)>,
    /// Entries of `map` in doubt: they count against the doubt bound, the
    /// others against the record cap.
    pub(super) doubts: usize,
    /// The last stamp given, in this shard.
    stamps: u64,
    pub(super) tombs: Tombs,
}

pub(super) struct Entry {
    pub(super) fingerprint: PayloadDigest,
    pub(super) state: State,
    pub(super) attempts: u32,
    pub(super) after_ok: bool,
    /// When the last attempt settles (`None`: never).
    pub(super) settle_at: Option<Instant>,
}

pub(super) enum State {
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

    pub(super) fn progress(&self, now: Instant) -> Progress {
        let settle = match self.settle_at {
            Some(at) => Settle::After(at.saturating_duration_since(now)),
            None => Settle::Never,
        };
        Progress { attempts: self.attempts, after_ok: self.after_ok, settle }
    }
}

impl Shard {
    /// Drops the expired records and tombstones at the front of their
    /// queues.
    #[inline]
    pub(super) fn drop_expired(&mut self, now: Instant) {
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
    pub(super) fn live(&self) -> usize {
        self.map.len() - self.doubts
    }

    /// Evicts the oldest finished records until `incoming` more fit under
    /// the cap; `false` if the rest are held.
    pub(super) fn make_room(&mut self, incoming: usize, bounds: Bounds) -> bool {
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
    pub(super) fn doubt(&mut self, key: u128, bounds: Bounds) {
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
    pub(super) fn held(
        &mut self,
        key: IdempotencyKey,
        fence: Fence,
    ) -> Result<&mut Entry, LedgerError> {
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

pub(super) fn lock(shard: &Mutex<Shard>) -> MutexGuard<'_, Shard> {
    // Every update leaves the shard consistent at each step a panic could
    // interrupt (an insert, a removal, an assignment, a count after it).
    shard.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Keys are already uniform 128-bit hashes: hashing them again (SipHash)
/// was most of the ledger's cost per call. Their low 64 bits are the hash.
#[derive(Default)]
pub(super) struct KeyHasher(u64);

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
