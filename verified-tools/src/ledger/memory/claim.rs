//! The claim of a key in the memory ledger: the contract's claim rules
//! applied in a locked shard, to a record or to a tombstone. Apart from the
//! handle because it is the path every call takes first, and the one where
//! a key pushed out by the bounds comes back.

use std::sync::Arc;

use tokio::time::Instant;

use super::shard::{Bounds, Entry, Shard, State};
use super::tombs::{Tomb, low};
use super::{COMPACTED_DOUBT, COMPLETED, MemoryLedger, settle_at};
use crate::deadline::later;
use crate::ledger::record::{self, ClaimStep, Found, FoundState};
use crate::ledger::{Claim, ClaimRequest, Claimed, LedgerError, Progress, Replay, StoreError};
use crate::{IdempotencyKey, PayloadDigest};

impl MemoryLedger {
    pub(super) fn claim_now(
        &self,
        request: ClaimRequest,
        now: Instant,
    ) -> Result<Claim, LedgerError> {
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
                StoreError::new("memory: a record and its state disagree"),
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

fn share(value: &Replay) -> Replay {
    match value {
        Replay::Local(value) => Replay::Local(Arc::clone(value)),
        Replay::Encoded(bytes) => Replay::Encoded(bytes.clone()),
        Replay::Unrecorded => Replay::Unrecorded,
    }
}
