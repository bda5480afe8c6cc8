//! The SQL of the SQLite ledger: one function per operation, each a
//! `BEGIN IMMEDIATE` transaction. These notes are for its maintainers; how
//! to use the ledger is on [`SqliteLedger`](super::SqliteLedger). The
//! file's schema, and how a connection is opened on it, are in `schema.rs`;
//! how a record's row is read and its columns written, in `row.rs`; how a
//! failure is told, in `failure.rs`.
//!
//! # Operations
//!
//! Every operation is one `BEGIN IMMEDIATE` transaction: it takes SQLite's
//! write lock first (waiting for it up to the busy timeout), then reads the
//! clock, then reads and writes. The claim reads and claims in that one
//! transaction, and takes its fence from the counter row of `meta` in it, so
//! that fences grow across keys and processes. Writes of a holder carry its
//! fence in their `WHERE` clause: no row changed means the hold is gone
//! ([`LedgerError::Fenced`]), and the transaction changed nothing.
//!
//! Instants are milliseconds since the Unix epoch on the host's wall clock
//! (`SystemTime`, read in Rust after the lock is taken): durations cross the
//! boundary, instants stay in the file. Durations going in are rounded so
//! that a settle time is never early.

use std::sync::Mutex;
use std::time::Duration;

use rusqlite::{Connection, OptionalExtension, TransactionBehavior, params};

use super::failure::{Failure, corrupt};
use super::row::{
    Record, State, duration, fence_value, key_bytes, later, now_ms, progress_at, read, seen,
    settle_at,
};
use super::{
    Claim, ClaimRequest, Claimed, Fence, LedgerError, Progress, RecordState, RecordView, Replay,
    Resolution,
};
use super::{Undo, Waiter, lock};
use crate::ledger::record::{ClaimStep, Found, claim_step};
use crate::{IdempotencyKey, PayloadDigest};

/// Every this many finishes, a handle deletes expired records...
pub(super) const PURGE_EVERY: u32 = 32;

/// ...at most this many (twice what the finishes in between can create).
pub(super) const PURGE_BATCH: i64 = 64;

/// Records read per statement by the operator's listing ([`scan`]).
pub(super) const SCAN_CHUNK: usize = 512;

/// The next fence of the file.
pub(super) fn next_fence(conn: &Connection) -> Result<Fence, Failure> {
    let mut statement =
        conn.prepare_cached("UPDATE meta SET fence = fence + 1 WHERE id = 1 RETURNING fence")?;
    let fence: i64 = statement.query_row([], |r| r.get(0))?;
    u64::try_from(fence).map(Fence).map_err(|_| corrupt("the fence counter is negative"))
}

/// The claim of one key, inside the claim's transaction.
pub(super) fn take(
    conn: &Connection,
    key: IdempotencyKey,
    record: Option<Record>,
    fingerprint: PayloadDigest,
    first: Progress,
    now: i64,
    lease: Duration,
) -> Result<Claimed, Failure> {
    let lease_end = later(now, lease);
    let found = record.as_ref().map(|r| Found { fingerprint: r.fingerprint, state: r.found(now) });
    match (claim_step(found, fingerprint), record) {
        (ClaimStep::Mismatch, _) => Ok(Claimed::Mismatch),
        (ClaimStep::Wait(left), _) => Ok(Claimed::InFlight(left)),
        (ClaimStep::Replay, Some(record)) => {
            Ok(Claimed::Completed(record.value.map_or(Replay::Unrecorded, Replay::Encoded)))
        }
        (ClaimStep::TakeOver, Some(record)) => {
            let fence = next_fence(conn)?;
            let mut statement = conn.prepare_cached(
                "UPDATE records
                 SET state = 'held', fence = ?2, lease_end_ms = ?3, expires_at_ms = NULL
                 WHERE key = ?1",
            )?;
            statement.execute(params![key_bytes(key), fence_value(fence), lease_end])?;
            Ok(Claimed::Resume(fence, record.progress(now)))
        }
        (ClaimStep::Create, _) => {
            let fence = next_fence(conn)?;
            // Replaces an expired record, if there is one.
            let mut statement = conn.prepare_cached(
                "INSERT OR REPLACE INTO records
                     (key, fingerprint, state, fence, lease_end_ms, attempts, after_ok,
                      settle_at_ms, value, expires_at_ms)
                 VALUES (?1, ?2, 'held', ?3, ?4, ?5, ?6, ?7, NULL, NULL)",
            )?;
            statement.execute(params![
                key_bytes(key),
                fingerprint.as_u128().to_be_bytes(),
                fence_value(fence),
                lease_end,
                first.attempts,
                first.after_ok,
                settle_at(now, first.settle),
            ])?;
            Ok(Claimed::Fresh(fence))
        }
        // A step that does not fit the record (`found` describes it, so
        // never): refused, and nothing overwritten.
        (ClaimStep::Replay | ClaimStep::TakeOver, None) => {
            Err(corrupt("a record and its state disagree"))
        }
    }
}

/// A claim's transaction. `cancel` says whether its caller is gone.
pub(super) fn claim(
    conn: &mut Connection,
    request: ClaimRequest,
    lease: Duration,
    cancel: &Mutex<Waiter>,
) -> Result<Claim, Failure> {
    let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
    let now = now_ms();
    let mut found = None;
    if let Some((previous, fingerprint)) = request.previous
        && let Some(record) = read(&tx, previous, now)?
        && record.fingerprint == fingerprint
    {
        let state = take(&tx, previous, Some(record), fingerprint, request.first, now, lease)?;
        found = Some(Claim { key: previous, state });
    }
    let claim = match found {
        Some(claim) => claim,
        None => {
            let record = read(&tx, request.key, now)?;
            let (key, fingerprint) = (request.key, request.fingerprint);
            Claim { key, state: take(&tx, key, record, fingerprint, request.first, now, lease)? }
        }
    };
    let (fence, fresh) = match claim.state {
        Claimed::Fresh(fence) => (fence, true),
        Claimed::Resume(fence, _) => (fence, false),
        // Nothing was written.
        _ => return Ok(claim),
    };
    let undo = Undo::Release { key: claim.key, fence, fresh };
    if let Some(undo) = commit_for(tx, cancel, undo, "claim")? {
        undo.apply(conn)?;
    }
    Ok(claim)
}

/// Commits an operation's transaction for a caller that may be gone: rolled
/// back if it is gone already; to be undone at once (`Some`) if it went
/// while the commit ran; else left for the caller's guard to undo, should
/// the caller go before it receives the answer.
fn commit_for(
    tx: rusqlite::Transaction<'_>,
    cancel: &Mutex<Waiter>,
    undo: Undo,
    what: &str,
) -> Result<Option<Undo>, Failure> {
    if matches!(*lock(cancel), Waiter::Cancelled) {
        // The caller is gone: nobody would learn what this wrote.
        drop(tx);
        return Err(Failure::Ledger(LedgerError::Unavailable(
            format!("the {what} was cancelled").into(),
        )));
    }
    tx.commit()?;
    let mut waiter = lock(cancel);
    if matches!(*waiter, Waiter::Cancelled) {
        return Ok(Some(undo));
    }
    *waiter = Waiter::Answered(undo);
    Ok(None)
}

impl Undo {
    /// Undoes what an operation wrote for a caller that never got its
    /// answer.
    pub(super) fn apply(self, conn: &Connection) -> Result<(), Failure> {
        match self {
            Undo::Release { key, fence, fresh } => release(conn, key, fence, fresh),
            Undo::Withdraw { key, fence, attempt } => withdraw(conn, key, fence, attempt),
        }
    }
}

/// Undoes a claim whose caller never learnt it held the key: a fresh hold is
/// deleted (its first attempt never went out: the key is as if never
/// claimed), a hold taken over goes back in doubt with its progress.
pub(super) fn release(
    conn: &Connection,
    key: IdempotencyKey,
    fence: Fence,
    fresh: bool,
) -> Result<(), Failure> {
    if !fresh {
        return abandon(conn, key, fence);
    }
    conn.prepare_cached("DELETE FROM records WHERE key = ?1 AND state = 'held' AND fence = ?2")?
        .execute(params![key_bytes(key), fence_value(fence)])?;
    Ok(())
}

/// Takes back attempt `attempt`, announced by a write-through whose caller
/// never got the answer (so it did not dispatch it), while the record is
/// still that hold's and counts that attempt.
pub(super) fn withdraw(
    conn: &Connection,
    key: IdempotencyKey,
    fence: Fence,
    attempt: u32,
) -> Result<(), Failure> {
    conn.prepare_cached(
        "UPDATE records SET attempts = attempts - 1
         WHERE key = ?1 AND fence = ?2 AND attempts = ?3 AND attempts > 0",
    )?
    .execute(params![key_bytes(key), fence_value(fence), attempt])?;
    Ok(())
}

/// A holder's write-through before an attempt.
pub(super) fn dispatching(
    conn: &mut Connection,
    key: IdempotencyKey,
    fence: Fence,
    progress: Progress,
    cancel: &Mutex<Waiter>,
) -> Result<(), Failure> {
    let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
    let now = now_ms();
    let changed = tx
        .prepare_cached(
            "UPDATE records SET attempts = ?3, after_ok = ?4, settle_at_ms = ?5
             WHERE key = ?1 AND state = 'held' AND fence = ?2",
        )?
        .execute(params![
            key_bytes(key),
            fence_value(fence),
            progress.attempts,
            progress.after_ok,
            settle_at(now, progress.settle),
        ])?;
    if changed == 0 {
        return Err(Failure::Ledger(LedgerError::Fenced(fence)));
    }
    let undo = Undo::Withdraw { key, fence, attempt: progress.attempts };
    if let Some(undo) = commit_for(tx, cancel, undo, "write-through")? {
        undo.apply(conn)?;
    }
    Ok(())
}

/// How a holder's call ended: `value` is the encoded value of a completion.
#[derive(Debug)]
pub(super) enum Ending {
    Completed(Option<Vec<u8>>),
    Settled,
    InDoubt,
}

pub(super) fn finish(
    conn: &mut Connection,
    key: IdempotencyKey,
    fence: Fence,
    ending: &Ending,
    ttl: Duration,
    purge_too: bool,
) -> Result<(), Failure> {
    let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
    let now = now_ms();
    let expires = later(now, ttl);
    let (state, value, expires) = match ending {
        Ending::Completed(value) => ("completed", value.as_deref(), Some(expires)),
        Ending::Settled => ("settled", None, Some(expires)),
        Ending::InDoubt => ("in_doubt", None, None),
    };
    let changed = tx
        .prepare_cached(
            "UPDATE records
             SET state = ?3, value = ?4, expires_at_ms = ?5, lease_end_ms = NULL
             WHERE key = ?1 AND state = 'held' AND fence = ?2",
        )?
        .execute(params![key_bytes(key), fence_value(fence), state, value, expires])?;
    if changed == 0 {
        return Err(Failure::Ledger(LedgerError::Fenced(fence)));
    }
    if purge_too {
        purge(&tx, now, PURGE_BATCH)?;
    }
    tx.commit()?;
    Ok(())
}

/// Ends the hold of `fence` on `key`, in doubt; nothing if it is not held.
pub(super) fn abandon(conn: &Connection, key: IdempotencyKey, fence: Fence) -> Result<(), Failure> {
    conn.prepare_cached(
        "UPDATE records SET state = 'in_doubt', lease_end_ms = NULL
         WHERE key = ?1 AND state = 'held' AND fence = ?2",
    )?
    .execute(params![key_bytes(key), fence_value(fence)])?;
    Ok(())
}

/// Deletes up to `limit` expired records, the oldest first.
pub(super) fn purge(conn: &Connection, now: i64, limit: i64) -> Result<usize, Failure> {
    let purged = conn
        .prepare_cached(
            "DELETE FROM records WHERE key IN (
                 SELECT key FROM records WHERE expires_at_ms <= ?1
                 ORDER BY expires_at_ms LIMIT ?2)",
        )?
        .execute(params![now, limit])?;
    Ok(purged)
}

/// How long `fence` still holds `key`: one indexed read, without the
/// write lock; none once the hold was taken over or its lease has ended.
pub(super) fn hold(
    conn: &Connection,
    key: IdempotencyKey,
    fence: Fence,
) -> Result<Option<Duration>, Failure> {
    let now = now_ms();
    let mut statement = conn.prepare_cached(
        "SELECT lease_end_ms FROM records WHERE key = ?1 AND state = 'held' AND fence = ?2",
    )?;
    let end = statement
        .query_row(params![key_bytes(key), fence_value(fence)], |r| r.get::<_, Option<i64>>(0))
        .optional()?
        .flatten();
    Ok(end.filter(|end| *end > now).map(|end| duration(end - now)))
}

// ---------------------------------------------------------------- the operator's door

/// The record of `key`, as an operator sees it; none when absent or expired.
/// One statement: a consistent read, without the write lock.
pub(super) fn record(
    conn: &Connection,
    key: IdempotencyKey,
) -> Result<Option<RecordView>, Failure> {
    let now = now_ms();
    Ok(read(conn, key, now)?.map(|record| record.view(key, now)))
}

/// The records in doubt (holds past their lease included) among the
/// [`SCAN_CHUNK`] records that follow `after` in key order, and the last key
/// read: `None` once the table's end is reached.
///
/// One statement over a range of the primary key: short, whatever the size
/// of the table, so that the handle's connection is free again for the
/// agents' calls between two chunks. The chunks are not one snapshot: a
/// record that changes during the walk may be missed, or seen in its new
/// state.
pub(super) fn scan(
    conn: &Connection,
    after: Option<IdempotencyKey>,
) -> Result<(Vec<RecordView>, Option<IdempotencyKey>), Failure> {
    let now = now_ms();
    let mut statement = conn.prepare_cached(
        "SELECT key, state, lease_end_ms, attempts, after_ok, settle_at_ms FROM records
         WHERE key > ?1 ORDER BY key LIMIT ?2",
    )?;
    // Keys are compared as bytes: the empty blob is before every key.
    let from = after.map_or(Vec::new(), |key| key_bytes(key).to_vec());
    let chunk = i64::try_from(SCAN_CHUNK).unwrap_or(i64::MAX);
    let mut rows = statement.query(params![from, chunk])?;
    let (mut views, mut read, mut last) = (Vec::new(), 0, None);
    while let Some(row) = rows.next()? {
        read += 1;
        let key: [u8; 16] = row
            .get::<_, Vec<u8>>(0)?
            .as_slice()
            .try_into()
            .map_err(|_| corrupt("a key is not 16 bytes"))?;
        let key = IdempotencyKey::from_u128(u128::from_be_bytes(key));
        last = Some(key);
        let state = row.get::<_, String>(1)?;
        let state = State::parse(&state).ok_or_else(|| corrupt("a record has an unknown state"))?;
        let lease_end = row.get::<_, Option<i64>>(2)?;
        if seen(state, lease_end, now) != RecordState::InDoubt {
            continue;
        }
        let progress = progress_at(row.get(3)?, row.get(4)?, row.get(5)?, now);
        views.push(RecordView { key, state: RecordState::InDoubt, progress });
    }
    Ok((views, if read < SCAN_CHUNK { None } else { last }))
}

/// A person's decision about the call in doubt under `key`, in one
/// `BEGIN IMMEDIATE` transaction; answers the state the record was in (a
/// hold past its lease is in doubt). Only a record in doubt changes.
///
/// The resolved record gets a new fence from the counter, as a claim does:
/// the record's fence is always that of its last writer, and a holder
/// presumed dead that wakes up after the decision is fenced (its writes
/// require `state = 'held'` and its own fence), so it cannot overwrite the
/// decision with its own outcome.
pub(super) fn resolve(
    conn: &mut Connection,
    key: IdempotencyKey,
    resolution: Resolution,
    ttl: Duration,
) -> Result<Option<RecordState>, Failure> {
    let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
    let now = now_ms();
    let Some(record) = read(&tx, key, now)? else { return Ok(None) };
    let before = record.view(key, now).state;
    if before != RecordState::InDoubt {
        // Nothing written: the transaction rolls back when dropped.
        return Ok(Some(before));
    }
    let fence = next_fence(&tx)?;
    let expires = later(now, ttl);
    match resolution {
        // What a completion whose value does not serialize leaves: a repeat
        // verifies to obtain the value, and never dispatches.
        Resolution::Applied => tx
            .prepare_cached(
                "UPDATE records
                 SET state = 'completed', fence = ?2, lease_end_ms = NULL, value = NULL,
                     expires_at_ms = ?3
                 WHERE key = ?1",
            )?
            .execute(params![key_bytes(key), fence_value(fence), expires])?,
        // Settled now, with no attempt counted: a repeat believes the
        // verifier's `Absent` at once and has the key's whole budget.
        Resolution::NotApplied => tx
            .prepare_cached(
                "UPDATE records
                 SET state = 'settled', fence = ?2, lease_end_ms = NULL, attempts = 0,
                     after_ok = 0, settle_at_ms = ?3, expires_at_ms = ?4
                 WHERE key = ?1",
            )?
            .execute(params![key_bytes(key), fence_value(fence), now, expires])?,
    };
    tx.commit()?;
    Ok(Some(before))
}
