//! What a claim does with the record it finds: the contract's claim rules
//! as one pure function, [`claim_step`], shared by the backends whose logic
//! is Rust (the memory and SQLite ledgers) and offered to a backend of one's
//! own. A backend reads the key's live record (an expired one is none),
//! describes it as [`Found`], asks `claim_step`, and carries the step out in
//! the same atomic step as the read: a new fence and hold for
//! [`Create`](ClaimStep::Create) and [`TakeOver`](ClaimStep::TakeOver),
//! nothing written otherwise. (The Redis and PostgreSQL ledgers run the same
//! rules inside the store, in Lua and SQL.)
//!
//! ```
//! use std::time::Duration;
//! use verified_tools::PayloadDigest;
//! use verified_tools::ledger::record::{claim_step, ClaimStep, Found, FoundState};
//!
//! let fp = PayloadDigest::from_u128(7);
//! assert_eq!(claim_step(None, fp), ClaimStep::Create);
//! let held = Found { fingerprint: fp, state: FoundState::Held { lease_left: Duration::from_secs(3) } };
//! assert_eq!(claim_step(Some(held), fp), ClaimStep::Wait(Duration::from_secs(3)));
//! // Past its lease, the holder may have dispatched: taken over, verified first.
//! let lapsed = Found { fingerprint: fp, state: FoundState::Held { lease_left: Duration::ZERO } };
//! assert_eq!(claim_step(Some(lapsed), fp), ClaimStep::TakeOver);
//! assert_eq!(claim_step(Some(held), PayloadDigest::from_u128(8)), ClaimStep::Mismatch);
//! ```

use std::time::Duration;

use crate::PayloadDigest;

/// A live record as a claim finds it, read on the store's clock.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Found {
    /// The fingerprint of the payload it was made for.
    pub fingerprint: PayloadDigest,
    /// Its state.
    pub state: FoundState,
}

/// The state of a [`Found`] record.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FoundState {
    /// Held by a call, with this much of its lease left (zero: the lease is
    /// over, and the holder may have dispatched before it stopped).
    Held {
        /// Time left on the lease, on the store's clock.
        lease_left: Duration,
    },
    /// A call ended without knowing whether its effect happened.
    InDoubt,
    /// A call ended with its attempts settled and not applied, budget left.
    Settled,
    /// A call succeeded: its value (if it was kept) answers every repeat.
    Completed,
}

/// What a claim does; each step is one answer of
/// [`Ledger::claim`](super::Ledger::claim).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ClaimStep {
    /// No live record: write a hold with a new fence, the first attempt
    /// recorded ([`Claimed::Fresh`](super::Claimed::Fresh)).
    Create,
    /// A record of another payload: refused, nothing written
    /// ([`Claimed::Mismatch`](super::Claimed::Mismatch)).
    Mismatch,
    /// Completed: answer with its value, nothing written
    /// ([`Claimed::Completed`](super::Claimed::Completed)).
    Replay,
    /// Held by a live holder for this long still: nothing written
    /// ([`Claimed::InFlight`](super::Claimed::InFlight)).
    Wait(Duration),
    /// In doubt, settled, or held past its lease: take the hold with a new
    /// fence and hand its progress over, so the taker verifies before it
    /// dispatches ([`Claimed::Resume`](super::Claimed::Resume)).
    TakeOver,
}

/// The claim of a key whose live record is `found` (`None`: no record, or
/// an expired one), for a call whose payload has `fingerprint`.
pub fn claim_step(found: Option<Found>, fingerprint: PayloadDigest) -> ClaimStep {
    let Some(found) = found else { return ClaimStep::Create };
    if found.fingerprint != fingerprint {
        return ClaimStep::Mismatch;
    }
    match found.state {
        FoundState::Completed => ClaimStep::Replay,
        FoundState::Held { lease_left } if !lease_left.is_zero() => ClaimStep::Wait(lease_left),
        FoundState::Held { .. } | FoundState::InDoubt | FoundState::Settled => ClaimStep::TakeOver,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every state with the same and another payload, against the
    /// contract's rules as the module docs state them.
    #[test]
    fn every_found_record_gets_the_step_the_contract_names() {
        let (fp, other) = (PayloadDigest::from_u128(1), PayloadDigest::from_u128(2));
        let left = Duration::from_millis(1500);
        let cases = [
            (FoundState::Held { lease_left: left }, ClaimStep::Wait(left)),
            (FoundState::Held { lease_left: Duration::ZERO }, ClaimStep::TakeOver),
            (FoundState::InDoubt, ClaimStep::TakeOver),
            (FoundState::Settled, ClaimStep::TakeOver),
            (FoundState::Completed, ClaimStep::Replay),
        ];
        for (state, step) in cases {
            assert_eq!(claim_step(Some(Found { fingerprint: fp, state }), fp), step, "{state:?}");
            let mismatch = claim_step(Some(Found { fingerprint: other, state }), fp);
            assert_eq!(mismatch, ClaimStep::Mismatch, "{state:?}");
        }
        assert_eq!(claim_step(None, fp), ClaimStep::Create);
    }
}
