//! The memory ledger's tombstones: what its bounds pushed out, compacted
//! to what a repeat must know (a completed call, or a call in doubt).

use std::collections::{HashMap, VecDeque};
use std::hash::BuildHasherDefault;

use tokio::time::Instant;

use super::shard::KeyHasher;
use super::{COMPLETED, STALE_SLACK};
use crate::PayloadDigest;

/// Records the bounds pushed out, compacted to what a repeat must know.
#[derive(Default)]
pub(super) struct Tombs {
    /// By the key's low 64 bits, which are the hash (`KeyHasher`).
    pub(super) map: HashMap<u64, Tomb, BuildHasherDefault<KeyHasher>>,
    /// Completed tombstones, oldest first, with their expiry: nothing but
    /// this queue removes one, so every entry is live.
    pub(super) done: VecDeque<(Instant, u64)>,
    /// In-doubt tombstones, oldest first, with their stamp; stale once the
    /// key was claimed again.
    pub(super) doubt: VecDeque<(u64, u64)>,
    /// Entries of `map` in doubt.
    pub(super) doubts: usize,
    /// In-doubt tombstones dropped at the hard bound.
    pub(super) forgotten: u64,
}

/// What a tombstone keeps of a fingerprint.
pub(super) fn low(fingerprint: PayloadDigest) -> u64 {
    fingerprint.as_u128() as u64
}

#[derive(Debug, Clone, Copy)]
pub(super) struct Tomb {
    /// The payload fingerprint's low 64 bits.
    pub(super) fingerprint: u64,
    /// [`COMPLETED`], or the stamp of the in-doubt queue's entry.
    pub(super) stamp: u64,
}

impl Tombs {
    #[inline]
    pub(super) fn get(&self, key: u64) -> Option<Tomb> {
        self.map.get(&key).copied()
    }

    /// Drops the expired completed tombstones at the front of their queue
    /// (in-doubt ones never expire).
    #[inline]
    pub(super) fn drop_expired(&mut self, now: Instant) {
        while let Some(&(expires, key)) = self.done.front() {
            if expires > now {
                return;
            }
            self.done.pop_front();
            self.remove_completed(key);
        }
    }

    pub(super) fn remove_completed(&mut self, key: u64) -> bool {
        let completed = self.map.get(&key).is_some_and(|t| t.stamp == COMPLETED);
        if completed {
            self.map.remove(&key);
        }
        completed
    }

    pub(super) fn bury_completed(
        &mut self,
        key: u64,
        fingerprint: u64,
        expires: Instant,
        cap: usize,
    ) {
        self.make_room(cap);
        self.insert(key, Tomb { fingerprint, stamp: COMPLETED });
        self.done.push_back((expires, key));
    }

    pub(super) fn bury_in_doubt(&mut self, key: u64, fingerprint: u64, stamp: u64, cap: usize) {
        self.make_room(cap);
        self.insert(key, Tomb { fingerprint, stamp });
        self.doubts += 1;
        self.doubt.push_back((stamp, key));
        if self.doubt.len() > 2 * self.doubts + STALE_SLACK {
            self.doubt.retain(|&(stamp, key)| self.map.get(&key).is_some_and(|t| t.stamp == stamp));
        }
    }

    pub(super) fn insert(&mut self, key: u64, tomb: Tomb) {
        // Two keys of a shard share their low 64 bits with odds of 2^-64:
        // the later replaces the earlier, and the counts stay true.
        if let Some(old) = self.map.insert(key, tomb)
            && old.stamp != COMPLETED
        {
            self.doubts -= 1;
        }
    }

    /// The in-doubt tombstone of `key` becomes a record again (its queue
    /// entry is now stale).
    pub(super) fn exhume(&mut self, key: u64) {
        if self.map.remove(&key).is_some_and(|t| t.stamp != COMPLETED) {
            self.doubts -= 1;
        }
    }

    /// Drops the oldest tombstones until one more fits under `cap`: the
    /// completed ones first, as the contract lets those be forgotten (their
    /// TTL does), never a call in doubt; then, the hard bound, the oldest in
    /// doubt.
    pub(super) fn make_room(&mut self, cap: usize) {
        while self.map.len() >= cap {
            if !self.drop_oldest() {
                return;
            }
        }
    }

    pub(super) fn drop_oldest(&mut self) -> bool {
        while let Some((_, key)) = self.done.pop_front() {
            if self.remove_completed(key) {
                return true;
            }
        }
        while let Some((stamp, key)) = self.doubt.pop_front() {
            if self.map.get(&key).is_some_and(|t| t.stamp == stamp) {
                self.map.remove(&key);
                self.doubts -= 1;
                self.forgotten += 1;
                #[cfg(feature = "tracing")]
                if self.forgotten.is_power_of_two() {
                    tracing::warn!(
                        forgotten = self.forgotten,
                        "the memory ledger's tombstones overflowed: a call in doubt was \
                         forgotten, and a repeat of it would dispatch without verifying"
                    );
                }
                return true;
            }
        }
        false
    }
}
