//! The file of the SQLite ledger: its schema, the tag and version that say
//! it holds one, and the opening of a connection that makes sure it does.
//! Apart from the operations because it runs once, when a handle opens:
//! nothing here is on the path of a call.
//!
//! # The file
//!
//! One table of records and one row of meta data, tagged with
//! `PRAGMA application_id` (so that another application's database is
//! refused, not written into) and versioned with `PRAGMA user_version`
//! ([`SCHEMA_VERSION`]). [`SqliteLedger::open`](super::SqliteLedger::open)
//! creates the schema in an empty file and refuses a version it does not
//! know.
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

use std::path::Path;
use std::time::Duration;

use rusqlite::{Connection, TransactionBehavior};

use super::failure::{Failure, is_busy};
#[cfg(doc)]
use super::sql::scan;
use crate::ledger::LedgerError;
#[cfg(doc)]
use crate::ledger::Progress;

/// The version of the schema this build writes and reads.
pub(super) const SCHEMA_VERSION: i64 = 1;

/// `PRAGMA application_id` of a ledger file: "vtlg".
pub(super) const APPLICATION_ID: i64 = 0x7674_6c67;

/// How long an operation waits for another connection's write lock.
pub(super) const DEFAULT_BUSY_TIMEOUT: Duration = Duration::from_secs(5);

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
