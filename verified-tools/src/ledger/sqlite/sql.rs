//! The SQL of the SQLite ledger: the file's schema and one function per
//! operation, each a `BEGIN IMMEDIATE` transaction. These notes are for its
//! maintainers; how to use the ledger is on [`SqliteLedger`](super::SqliteLedger).
//!
//! # The file
//!
//! One table of records and one row of meta data, tagged with
//! `PRAGMA application_id` (so that another application's database is
//! refused, not written into) and versioned with `PRAGMA user_version`
//! ([`SCHEMA_VERSION`]). [`SqliteLedger::open`](super::SqliteLedger::open) creates the schema in an
//! empty file and refuses a version it does not know.
//!
//! | column | meaning |
//! |---|---|
//! | `key` | the idempotency key, 16 bytes big-endian (the primary key: `WITHOUT ROWID`) |
//! | `fingerprint` | the payload digest, 16 bytes big-endian |
//! | `state` | `held`, `in_doubt`, `settled`, `completed` |
//! | `fence` | the fence of the last claim (the holder's while `held`) |
//! | `lease_end_ms` | when the hold ends (`held` only) |
//! | `attempts`, `after_ok` | [`Progress`], written through before every attempt |
//! | `settle_at_ms` | when the last attempt settles; `NULL`: never |
//! | `value` | a completed call's value ([`Recorded::encode`](crate::ledger::Recorded::encode)); `NULL`: unrecorded |
//! | `expires_at_ms` | when a `completed` or `settled` record expires; `NULL` otherwise |
//!
//! `CHECK` constraints tie the columns to the state, so a bug that would
//! write an inconsistent record fails its transaction instead.
//!
//! No index serves the operator's listing of records in doubt
//! ([`scan`]): to find the holds past their lease (the calls of a process
//! that crashed), an index would have to hold every held record, and each
//! claim would add an entry and each finish remove it. Measured with
//! `benches/sqlite_ledger.rs` (`synchronous = NORMAL`, four alternating runs
//! on a loaded 2-core machine), that took the ledger from 0.62 to 0.52 of
//! its floor: every call would pay for a command an operator runs now and
//! then. The listing walks the table by key instead, a chunk at a time.
//! Finished records expire after the TTL, so the table holds about a TTL's
//! worth of calls.
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

use std::path::Path;
use std::sync::Mutex;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use rusqlite::{Connection, ErrorCode, OptionalExtension, TransactionBehavior, params};

use super::{
    Claim, ClaimRequest, Claimed, Fence, LedgerError, Progress, RecordState, RecordView, Replay,
    Resolution, Settle, StoreError,
};
use super::{Undo, Waiter, lock};
use crate::ledger::record::{ClaimStep, Found, FoundState, claim_step};
use crate::{IdempotencyKey, PayloadDigest};

/// The version of the schema this build writes and reads.
pub(super) const SCHEMA_VERSION: i64 = 1;

/// `PRAGMA application_id` of a ledger file: "vtlg".
pub(super) const APPLICATION_ID: i64 = 0x7674_6c67;

/// How long an operation waits for another connection's write lock.
pub(super) const DEFAULT_BUSY_TIMEOUT: Duration = Duration::from_secs(5);

/// Every this many finishes, a handle deletes expired records...
pub(super) const PURGE_EVERY: u32 = 32;

/// ...at most this many (twice what the finishes in between can create).
pub(super) const PURGE_BATCH: i64 = 64;

pub(super) const SCHEMA: &str = "
CREATE TABLE meta (
    id INTEGER PRIMARY KEY CHECK (id = 1),
    fence INTEGER NOT NULL
) STRICT;
INSERT INTO meta (id, fence) VALUES (1, 0);
CREATE TABLE records (
    key BLOB PRIMARY KEY NOT NULL CHECK (length(key) = 16),
    fingerprint BLOB NOT NULL CHECK (length(fingerprint) = 16),
    state TEXT NOT NULL CHECK (state IN ('held', 'in_doubt', 'settled', 'completed')),
    fence INTEGER NOT NULL,
    lease_end_ms INTEGER CHECK ((state = 'held') = (lease_end_ms IS NOT NULL)),
    attempts INTEGER NOT NULL CHECK (attempts >= 0),
    after_ok INTEGER NOT NULL CHECK (after_ok IN (0, 1)),
    settle_at_ms INTEGER,
    value BLOB CHECK (value IS NULL OR state = 'completed'),
    expires_at_ms INTEGER
        CHECK ((state IN ('completed', 'settled')) = (expires_at_ms IS NOT NULL))
) STRICT, WITHOUT ROWID;
CREATE INDEX records_expiry ON records (expires_at_ms) WHERE expires_at_ms IS NOT NULL;
";

/// Records read per statement by the operator's listing ([`scan`]).
pub(super) const SCAN_CHUNK: usize = 512;

/// Opens the connection and makes sure the file holds a ledger.
///
/// Several processes opening a new file at once race to switch it to WAL
/// and to create the schema; SQLite answers some of those races with
/// "database is locked" at once, without its busy handler. Such an open is
/// tried again, within the busy timeout.
pub(super) fn connect(path: &Path) -> Result<Connection, Failure> {
    let started = std::time::Instant::now();
    loop {
        match connect_once(path) {
            Err(Failure::Sql(e)) if is_busy(&e) && started.elapsed() < DEFAULT_BUSY_TIMEOUT => {
                std::thread::sleep(Duration::from_millis(5));
            }
            other => return other,
        }
    }
}

pub(super) fn is_busy(error: &rusqlite::Error) -> bool {
    matches!(
        error.sqlite_error_code(),
        Some(rusqlite::ErrorCode::DatabaseBusy | rusqlite::ErrorCode::DatabaseLocked)
    )
}

pub(super) fn connect_once(path: &Path) -> Result<Connection, Failure> {
    let mut conn = Connection::open(path)?;
    conn.busy_timeout(DEFAULT_BUSY_TIMEOUT)?;
    // Persistent in the file: every connection is in WAL mode after this.
    // Reading the mode takes no lock; switching it does, so switch only once.
    let current: String = conn.pragma_query_value(None, "journal_mode", |r| r.get(0))?;
    let mode = if current.eq_ignore_ascii_case("wal") {
        current
    } else {
        conn.pragma_update_and_check(None, "journal_mode", "WAL", |r| r.get(0))?
    };
    if !mode.eq_ignore_ascii_case("wal") {
        return Err(Failure::Ledger(LedgerError::Unavailable(
            format!("the file cannot be put in WAL mode (journal mode {mode})").into(),
        )));
    }
    conn.pragma_update(None, "synchronous", "FULL")?;
    let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
    let application: i64 = tx.pragma_query_value(None, "application_id", |r| r.get(0))?;
    let version: i64 = tx.pragma_query_value(None, "user_version", |r| r.get(0))?;
    match (application, version) {
        (0, 0) => {
            let tables: i64 =
                tx.query_row("SELECT count(*) FROM sqlite_schema", [], |r| r.get(0))?;
            if tables > 0 {
                return Err(unusable("it is another application's database"));
            }
            tx.execute_batch(SCHEMA)?;
            tx.pragma_update(None, "application_id", APPLICATION_ID)?;
            tx.pragma_update(None, "user_version", SCHEMA_VERSION)?;
        }
        (APPLICATION_ID, SCHEMA_VERSION) => {}
        (APPLICATION_ID, version) => {
            return Err(unusable(&format!(
                "its schema is version {version}, this build knows version {SCHEMA_VERSION}"
            )));
        }
        _ => return Err(unusable("it is another application's database")),
    }
    tx.commit()?;
    Ok(conn)
}

pub(super) fn unusable(why: &str) -> Failure {
    Failure::Ledger(LedgerError::Unavailable(
        format!("not a usable verified-tools ledger: {why}").into(),
    ))
}

/// Why an operation failed, before the file's path is added.
pub(super) enum Failure {
    Sql(rusqlite::Error),
    Ledger(LedgerError),
}

impl From<rusqlite::Error> for Failure {
    fn from(error: rusqlite::Error) -> Self {
        Failure::Sql(error)
    }
}

impl Failure {
    /// The [`LedgerError`], its message preceded by the file's path; an
    /// SQLite error is kept as its source.
    pub(super) fn at(self, path: &Path) -> LedgerError {
        let path = path.display();
        match self {
            Failure::Ledger(LedgerError::Unavailable(why)) => {
                LedgerError::Unavailable(why.prefixed(path))
            }
            Failure::Ledger(LedgerError::Corrupt(why)) => LedgerError::Corrupt(why.prefixed(path)),
            Failure::Ledger(other) => other,
            Failure::Sql(error) => {
                let corrupt = match &error {
                    rusqlite::Error::SqliteFailure(e, _) => {
                        matches!(e.code, ErrorCode::DatabaseCorrupt | ErrorCode::NotADatabase)
                    }
                    rusqlite::Error::FromSqlConversionFailure(..)
                    | rusqlite::Error::IntegralValueOutOfRange(..)
                    | rusqlite::Error::InvalidColumnType(..) => true,
                    _ => false,
                };
                let kept = StoreError::with_source(format!("{path}: {error}"), error);
                if corrupt { LedgerError::Corrupt(kept) } else { LedgerError::Unavailable(kept) }
            }
        }
    }
}

pub(super) fn corrupt(why: &str) -> Failure {
    Failure::Ledger(LedgerError::Corrupt(why.into()))
}

// ---------------------------------------------------------------- records

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum State {
    Held,
    InDoubt,
    Settled,
    Completed,
}

impl State {
    fn parse(text: &str) -> Option<Self> {
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
    fingerprint: PayloadDigest,
    state: State,
    lease_end: Option<i64>,
    attempts: u32,
    after_ok: bool,
    settle_at: Option<i64>,
    value: Option<Vec<u8>>,
    expires_at: Option<i64>,
}

impl Record {
    /// The record as an operator sees it.
    fn view(&self, key: IdempotencyKey, now: i64) -> RecordView {
        let state = seen(self.state, self.lease_end, now);
        RecordView { key, state, progress: self.progress(now) }
    }

    /// The record as the contract's claim rules read it at `now`.
    fn found(&self, now: i64) -> FoundState {
        match self.state {
            State::Held => FoundState::Held {
                lease_left: duration(self.lease_end.unwrap_or(now).saturating_sub(now)),
            },
            State::InDoubt => FoundState::InDoubt,
            State::Settled => FoundState::Settled,
            State::Completed => FoundState::Completed,
        }
    }

    fn progress(&self, now: i64) -> Progress {
        progress_at(self.attempts, self.after_ok, self.settle_at, now)
    }
}

/// A state as an operator sees it: a hold past its lease is in doubt (the
/// next claim takes it over to verify first, as it does a record in doubt).
fn seen(state: State, lease_end: Option<i64>, now: i64) -> RecordState {
    match state {
        State::Held if lease_end.is_some_and(|end| now < end) => RecordState::Held,
        State::Held | State::InDoubt => RecordState::InDoubt,
        State::Settled => RecordState::Settled,
        State::Completed => RecordState::Completed,
    }
}

fn progress_at(attempts: u32, after_ok: bool, settle_at: Option<i64>, now: i64) -> Progress {
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
