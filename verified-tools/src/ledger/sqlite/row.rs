//! A record's row in the file of the SQLite ledger: how it is read and
//! what it means, and how keys, fingerprints, instants and fences are
//! written in its columns. Apart from the operations so that each of them
//! reads as its statements, and one place says what the columns hold.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use rusqlite::{Connection, OptionalExtension};

use super::failure::{Failure, corrupt};
use crate::ledger::record::FoundState;
use crate::ledger::{Fence, Progress, RecordState, RecordView, Settle};
use crate::{IdempotencyKey, PayloadDigest};

// ---------------------------------------------------------------- records

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum State {
    Held,
    InDoubt,
    Settled,
    Completed,
}

impl State {
    pub(super) fn parse(text: &str) -> Option<Self> {
        Some(match text {
            "held" => State::Held,
            "in_doubt" => State::InDoubt,
            "settled" => State::Settled,
            "completed" => State::Completed,
            _ => return None,
        })
    }
}

/// A record as a claim reads it.
pub(super) struct Record {
    pub(super) fingerprint: PayloadDigest,
    state: State,
    lease_end: Option<i64>,
    attempts: u32,
    after_ok: bool,
    settle_at: Option<i64>,
    pub(super) value: Option<Vec<u8>>,
    expires_at: Option<i64>,
}

impl Record {
    /// The record as an operator sees it.
    pub(super) fn view(&self, key: IdempotencyKey, now: i64) -> RecordView {
        let state = seen(self.state, self.lease_end, now);
        RecordView { key, state, progress: self.progress(now) }
    }

    /// The record as the contract's claim rules read it at `now`.
    pub(super) fn found(&self, now: i64) -> FoundState {
        match self.state {
            State::Held => FoundState::Held {
                lease_left: duration(self.lease_end.unwrap_or(now).saturating_sub(now)),
            },
            State::InDoubt => FoundState::InDoubt,
            State::Settled => FoundState::Settled,
            State::Completed => FoundState::Completed,
        }
    }

    pub(super) fn progress(&self, now: i64) -> Progress {
        progress_at(self.attempts, self.after_ok, self.settle_at, now)
    }
}

/// A state as an operator sees it: a hold past its lease is in doubt (the
/// next claim takes it over to verify first, as it does a record in doubt).
pub(super) fn seen(state: State, lease_end: Option<i64>, now: i64) -> RecordState {
    match state {
        State::Held if lease_end.is_some_and(|end| now < end) => RecordState::Held,
        State::Held | State::InDoubt => RecordState::InDoubt,
        State::Settled => RecordState::Settled,
        State::Completed => RecordState::Completed,
    }
}

pub(super) fn progress_at(
    attempts: u32,
    after_ok: bool,
    settle_at: Option<i64>,
    now: i64,
) -> Progress {
    let settle = match settle_at {
        Some(at) => Settle::After(duration(at.saturating_sub(now))),
        None => Settle::Never,
    };
    Progress { attempts, after_ok, settle }
}

pub(super) fn key_bytes(key: IdempotencyKey) -> [u8; 16] {
    key.as_u128().to_be_bytes()
}

pub(super) fn digest(bytes: &[u8]) -> Result<PayloadDigest, Failure> {
    let bytes: [u8; 16] = bytes.try_into().map_err(|_| corrupt("a fingerprint is not 16 bytes"))?;
    Ok(PayloadDigest::from_u128(u128::from_be_bytes(bytes)))
}

/// The live record of `key`: an expired one is absent.
pub(super) fn read(
    conn: &Connection,
    key: IdempotencyKey,
    now: i64,
) -> Result<Option<Record>, Failure> {
    let mut statement = conn.prepare_cached(
        "SELECT fingerprint, state, lease_end_ms, attempts, after_ok, settle_at_ms, value,
                expires_at_ms
         FROM records WHERE key = ?1",
    )?;
    let row = statement
        .query_row([key_bytes(key)], |r| {
            Ok((
                r.get::<_, Vec<u8>>(0)?,
                r.get::<_, String>(1)?,
                r.get::<_, Option<i64>>(2)?,
                r.get::<_, u32>(3)?,
                r.get::<_, bool>(4)?,
                r.get::<_, Option<i64>>(5)?,
                r.get::<_, Option<Vec<u8>>>(6)?,
                r.get::<_, Option<i64>>(7)?,
            ))
        })
        .optional()?;
    let Some((fingerprint, state, lease_end, attempts, after_ok, settle_at, value, expires_at)) =
        row
    else {
        return Ok(None);
    };
    let record = Record {
        fingerprint: digest(&fingerprint)?,
        state: State::parse(&state).ok_or_else(|| corrupt("a record has an unknown state"))?,
        lease_end,
        attempts,
        after_ok,
        settle_at,
        value,
        expires_at,
    };
    Ok(record.expires_at.is_none_or(|at| at > now).then_some(record))
}

// ---------------------------------------------------------------- time

/// Now, on the host's wall clock: milliseconds since the Unix epoch.
pub(super) fn now_ms() -> i64 {
    let since = SystemTime::now().duration_since(UNIX_EPOCH).unwrap_or_default();
    i64::try_from(since.as_millis()).unwrap_or(i64::MAX)
}

/// `now` plus `d`, rounded down to the millisecond (a lease or TTL a little
/// short rather than long), saturating.
pub(super) fn later(now: i64, d: Duration) -> i64 {
    now.saturating_add(i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
}

/// When an attempt settles: `now` plus `d` rounded up (never early).
pub(super) fn settle_at(now: i64, settle: Settle) -> Option<i64> {
    match settle {
        Settle::After(d) => {
            let ms = d.as_nanos().div_ceil(1_000_000);
            Some(now.saturating_add(i64::try_from(ms).unwrap_or(i64::MAX)))
        }
        Settle::Never => None,
    }
}

pub(super) fn duration(ms: i64) -> Duration {
    Duration::from_millis(u64::try_from(ms).unwrap_or(0))
}

pub(super) fn fence_value(fence: Fence) -> i64 {
    // Fences come from an i64 counter: they always fit.
    i64::try_from(fence.0).unwrap_or(i64::MAX)
}
