//! The operator's door of the memory ledger: reading a record, listing the
//! records in doubt, recording a person's decision. Not the hot path: a
//! listing locks the shards one by one.

use tokio::time::Instant;

use super::{COMPACTED_DOUBT, COMPLETED, Entry, MemoryLedger, Shard, State};
use crate::IdempotencyKey;
use crate::deadline::later;
use crate::ledger::{Progress, RecordState, RecordView, Replay, Resolution, Settle};

impl MemoryLedger {
    /// The view of `key`'s record in its (locked) shard; a key held past
    /// its lease shows as in doubt (the next claim takes it over so).
    fn view(&self, shard: &Shard, key: IdempotencyKey, now: Instant) -> Option<RecordView> {
        let k = key.as_u128();
        if let Some(entry) = shard.map.get(&k) {
            let state = self.state_of(entry, now);
            return Some(RecordView { key, state, progress: entry.progress(now) });
        }
        let tomb = shard.tombs.get(k as u64)?;
        Some(match tomb.stamp {
            COMPLETED => RecordView { key, state: RecordState::Completed, progress: UNKNOWN },
            _ => RecordView { key, state: RecordState::InDoubt, progress: COMPACTED_DOUBT },
        })
    }

    fn state_of(&self, entry: &Entry, now: Instant) -> RecordState {
        match entry.state {
            State::Held { since, .. } if now < later(since, self.lease) => RecordState::Held,
            State::Held { .. } | State::InDoubt { .. } => RecordState::InDoubt,
            State::Settled { .. } => RecordState::Settled,
            State::Done { .. } => RecordState::Completed,
        }
    }

    pub(super) fn record_now(&self, key: IdempotencyKey) -> Option<RecordView> {
        let now = self.now();
        let mut shard = self.shard(key);
        shard.drop_expired(now);
        self.view(&shard, key, now)
    }

    pub(super) fn in_doubt_now(&self, limit: usize) -> Vec<RecordView> {
        let now = self.now();
        let mut out = Vec::new();
        for padded in self.shards.iter() {
            let shard = super::lock(&padded.0);
            let entries = shard.map.iter().filter_map(|(&k, entry)| {
                let state = self.state_of(entry, now);
                let key = IdempotencyKey::from_u128(k);
                (state == RecordState::InDoubt).then(|| RecordView {
                    key,
                    state,
                    progress: entry.progress(now),
                })
            });
            out.extend(entries.take(limit - out.len()));
            if out.len() == limit {
                break;
            }
            // Compacted doubt keeps only the key's low 64 bits: it cannot be
            // listed by key, only found by its claim (and counted).
        }
        out
    }

    pub(super) fn resolve_now(
        &self,
        key: IdempotencyKey,
        resolution: Resolution,
    ) -> Option<RecordState> {
        let now = self.now();
        let bounds = self.bounds();
        let mut shard = self.shard(key);
        shard.drop_expired(now);
        let found = self.view(&shard, key, now)?.state;
        if found != RecordState::InDoubt {
            return Some(found);
        }
        let k = key.as_u128();
        let expires = later(now, self.ttl);
        let Some(entry) = shard.map.get_mut(&k) else {
            // Compacted doubt: the decision is kept as compactly.
            let fingerprint = shard.tombs.get(k as u64).map(|t| t.fingerprint).unwrap_or_default();
            shard.tombs.exhume(k as u64);
            if resolution == Resolution::Applied {
                shard.tombs.bury_completed(k as u64, fingerprint, expires, bounds.tombs);
            }
            return Some(found);
        };
        let was_doubt = matches!(entry.state, State::InDoubt { .. });
        // A holder presumed dead finds its hold gone: its `finish` is fenced.
        entry.state = match resolution {
            Resolution::Applied => State::Done { value: Replay::Unrecorded, expires },
            Resolution::NotApplied => {
                entry.attempts = 0;
                entry.after_ok = false;
                entry.settle_at = Some(now);
                State::Settled { expires }
            }
        };
        if was_doubt {
            shard.doubts -= 1;
        }
        shard.finished.push_back((expires, k));
        // Out of doubt, the record counts against the cap again: the oldest
        // finished records make room, as after a `finish`.
        shard.make_room(0, bounds);
        Some(found)
    }
}

/// What a completed tombstone can say of its progress: nothing.
const UNKNOWN: Progress = Progress { attempts: 0, after_ok: false, settle: Settle::NOW };
