//! The SQLite ledger (feature `sqlite`): the embedded, durable ledger of one
//! host. How to use it and what it guarantees is on [`SqliteLedger`]; these
//! notes are for its maintainers.
//!
//! # The file
//!
//! One table of records and one row of meta data, tagged with
//! `PRAGMA application_id` (so that another application's database is
//! refused, not written into) and versioned with `PRAGMA user_version`
//! ([`SCHEMA_VERSION`]). [`SqliteLedger::open`] creates the schema in an
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
//! | `value` | a completed call's value ([`Recorded::encode`]); `NULL`: unrecorded |
//! | `expires_at_ms` | when a `completed` or `settled` record expires; `NULL` otherwise |
//!
//! `CHECK` constraints tie the columns to the state, so a bug that would
//! write an inconsistent record fails its transaction instead.
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

use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use rusqlite::{Connection, ErrorCode, OptionalExtension, TransactionBehavior, params};
use tokio::runtime::Handle;

use super::{
    Claim, ClaimRequest, Claimed, End, Fence, Ledger, LedgerError, LedgerFuture, Progress,
    Recorded, Replay, Settle,
};
use crate::{IdempotencyKey, PayloadDigest};

/// The version of the schema this build writes and reads.
const SCHEMA_VERSION: i64 = 1;

/// `PRAGMA application_id` of a ledger file: "vtlg".
const APPLICATION_ID: i64 = 0x7674_6c67;

/// How long an operation waits for another connection's write lock.
const DEFAULT_BUSY_TIMEOUT: Duration = Duration::from_secs(5);

/// Every this many finishes, a handle deletes expired records...
const PURGE_EVERY: u32 = 32;

/// ...at most this many (twice what the finishes in between can create).
const PURGE_BATCH: i64 = 64;

const SCHEMA: &str = "
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

/// The embedded, durable ledger of one host: its records live in one SQLite
/// file, shared by every process of the host that opens it.
///
/// A path is all it needs: [`open`](Self::open) creates the file and its
/// schema if they are missing.
///
/// ```
/// use std::sync::Arc;
/// use verified_tools::ledger::{ClaimRequest, Claimed, End, Ledger, Progress, Settle, SqliteLedger};
/// use verified_tools::{Context, IdempotencyKey, PayloadDigest};
///
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// # let dir = std::env::temp_dir().join(format!("vt-sqlite-doc-{}", std::process::id()));
/// # std::fs::create_dir_all(&dir)?;
/// let path = dir.join("ledger.db");
/// let ledger = SqliteLedger::open(&path)?;
///
/// // What the engine does with it: claim a key, record how the call ended.
/// let key = IdempotencyKey::from_u128(1);
/// let first = Progress { attempts: 1, after_ok: false, settle: Settle::NOW };
/// let now = tokio::time::Instant::now();
/// let request =
///     ClaimRequest { key, fingerprint: PayloadDigest::from_u128(1), previous: None, first, now };
/// let Claimed::Fresh(fence) = ledger.claim(request).await?.state else { unreachable!() };
/// ledger.finish(key, fence, End::InDoubt).await?;
///
/// // Another process (here: another handle) sees the record: the call is
/// // resumed in doubt, with the attempt it made.
/// let other = SqliteLedger::open(&path)?;
/// let Claimed::Resume(_, progress) = other.claim(request).await?.state else { unreachable!() };
/// assert_eq!(progress.attempts, 1);
///
/// // Wrapped calls use it through their context.
/// let cx = Context::new("agent").with_ledger(Arc::new(other));
/// # drop((cx, ledger)); std::fs::remove_dir_all(&dir)?;
/// # Ok(()) }
/// ```
///
/// # One host
///
/// The processes that open the same path share the records. A claim is
/// atomic across them: it is one `BEGIN IMMEDIATE` transaction, under
/// SQLite's write lock. Fences come from one counter in the file, incremented
/// in the claim's transaction, so they grow across keys and processes. A
/// process waits up to 5 seconds for another's write lock
/// ([`with_busy_timeout`](Self::with_busy_timeout)), then the operation
/// fails.
///
/// The file must be on a local file system. SQLite's locks, and the shared
/// memory of its write-ahead log, do not work over a network file system
/// (NFS, SMB): two hosts could both claim a key. That is not supported; use
/// `RedisLedger` to share records between hosts.
///
/// # Durability
///
/// The file is in WAL mode, with `PRAGMA synchronous = FULL` by default:
/// every transaction (a claim, a write-through before an attempt, a finish)
/// is on disk, `fsync`ed, before the operation returns. A record survives the
/// process being killed and a power loss or crash of the host: after a
/// reboot, a call in doubt is still in doubt, and its next call verifies
/// before it dispatches. It costs one `fsync` per transaction, two per call
/// that succeeds at once (the claim and the finish).
///
/// [`with_power_loss_durability(false)`](Self::with_power_loss_durability)
/// sets `synchronous = NORMAL`: a transaction is then in the operating
/// system's cache when it returns, and on disk at the next checkpoint. It
/// survives the process being killed (`kill -9`, an abort, the OOM killer),
/// but a power loss or a crash of the host may roll back the last
/// transactions. A claim lost that way lets the next call dispatch without
/// verifying: the duplicate the ledger exists to prevent. That is why it is
/// not the default.
///
/// # Leases and time
///
/// Leases, settle times and expiries are instants on the host's wall clock,
/// which every process of the host shares, read inside each transaction. The
/// engine only sends and receives durations. The wall clock is not tokio's:
/// paused time in tests does not move it. A clock stepped forward ends holds
/// early (the key is taken over in doubt, and the old holder is fenced); a
/// clock stepped back makes them last longer.
///
/// # Expiry
///
/// Completed and settled records expire after the TTL
/// ([`with_ttl`](Self::with_ttl), 24 hours by default), counted from their
/// finish; records in doubt and held keys never expire. A claim treats an
/// expired record as absent: a new logical call starts afresh, and replaces
/// it. Expired records are deleted lazily: every 32nd finish of a handle
/// deletes up to 64 of them in its own transaction (so the file does not
/// grow forever, at no extra `fsync`), and
/// [`purge_expired`](Self::purge_expired) deletes all of them at once.
///
/// # Failures
///
/// Any SQLite failure (the file cannot be opened or written, the disk is
/// full, the write lock stays taken past the busy timeout, the file is
/// corrupt) is returned as [`LedgerError::Unavailable`] or
/// [`LedgerError::Corrupt`], never as a panic: the engine then refuses the
/// call before anything is dispatched. A transaction that fails changes
/// nothing. A claim that only reads (a completed call's replay, a key in
/// flight) writes nothing, so replays go on while the disk is full.
///
/// # Threads and cancellation
///
/// SQLite is blocking: each operation runs on tokio's blocking thread pool
/// (`spawn_blocking`), holding the handle's connection, which a mutex
/// guards: one transaction of a process at a time, as SQLite allows one
/// writer at a time anyway, and without the sleeps of SQLite's busy handler
/// between connections of one process. Outside a tokio runtime, operations
/// run in the caller's thread.
///
/// A claim whose future is dropped before it answers (its call's deadline
/// struck while it waited for the lock, or its task was cancelled) is rolled
/// back, or, if it had committed, abandoned: the key is not left held for a
/// lease by a call that never learnt it held it. [`Ledger::abandon`], called
/// from a destructor, must not block: it queues its short write on the
/// blocking pool and returns (in the caller's thread outside a runtime). If
/// that write is lost (the runtime shuts down, the process is killed), the
/// lease ends the hold.
pub struct SqliteLedger {
    shared: Arc<Shared>,
    lease: Duration,
    ttl: Duration,
    power_loss_durable: bool,
    busy_timeout: Duration,
}

/// What the operations running on the blocking pool share with the handle.
struct Shared {
    conn: Mutex<Connection>,
    path: PathBuf,
    /// Finishes of this handle, to purge expired records every so often.
    finishes: AtomicU32,
}

impl fmt::Debug for SqliteLedger {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SqliteLedger")
            .field("path", &self.shared.path)
            .field("lease", &self.lease)
            .field("ttl", &self.ttl)
            .field("power_loss_durable", &self.power_loss_durable)
            .field("busy_timeout", &self.busy_timeout)
            .finish()
    }
}

impl SqliteLedger {
    /// Opens the ledger in the file at `path`, creating the file and its
    /// schema if they are missing: WAL mode, `synchronous = FULL`, a busy
    /// timeout of 5 seconds; records live 24 hours, keys are leased for 10
    /// minutes.
    ///
    /// Fails with [`LedgerError::Unavailable`] when the file cannot be
    /// opened or written, is another application's database or has a newer
    /// schema, and with [`LedgerError::Corrupt`] when it is not a database.
    ///
    /// It blocks while it reads the file (and waits for another process's
    /// lock, if one is writing): open the ledger when the program starts,
    /// or on `spawn_blocking`, rather than on a runtime thread mid-run.
    pub fn open(path: impl AsRef<Path>) -> Result<Self, LedgerError> {
        let path = path.as_ref().to_path_buf();
        let conn = connect(&path).map_err(|failure| failure.at(&path))?;
        Ok(Self {
            shared: Arc::new(Shared { conn: Mutex::new(conn), path, finishes: AtomicU32::new(0) }),
            lease: Duration::from_secs(600),
            ttl: Duration::from_secs(24 * 3600),
            power_loss_durable: true,
            busy_timeout: DEFAULT_BUSY_TIMEOUT,
        })
    }

    /// Sets how long completed and settled records are kept (24 hours by
    /// default). Records in doubt never expire: forgetting one would let the
    /// next call dispatch without verifying.
    pub fn with_ttl(mut self, ttl: Duration) -> Self {
        self.ttl = ttl;
        self
    }

    /// Sets how long a call may hold a key (10 minutes by default): past it,
    /// the next call takes the key over in doubt. It must outlast every
    /// call's deadline ([`RetryPolicy::call_timeout`](crate::RetryPolicy::call_timeout)):
    /// the engine refuses calls whose deadline is longer. Each claim records
    /// the end of its own hold, so processes with different leases agree.
    pub fn with_lease(mut self, lease: Duration) -> Self {
        self.lease = lease;
        self
    }

    /// Whether every transaction is on disk before it returns, so that
    /// records survive a power loss or a crash of the host: `true` (the
    /// default) is `PRAGMA synchronous = FULL`; `false` is `NORMAL`, which
    /// survives the process being killed but may lose the last transactions
    /// to a power loss. See [Durability](Self#durability).
    pub fn with_power_loss_durability(mut self, durable: bool) -> Result<Self, LedgerError> {
        let level = if durable { "FULL" } else { "NORMAL" };
        self.shared.with(|conn| Ok(conn.pragma_update(None, "synchronous", level)?))?;
        self.power_loss_durable = durable;
        Ok(self)
    }

    /// Sets how long an operation waits for another process's write lock
    /// before it fails with [`LedgerError::Unavailable`] (5 seconds by
    /// default). The engine bounds a claim by its call's deadline as well.
    pub fn with_busy_timeout(mut self, timeout: Duration) -> Result<Self, LedgerError> {
        self.shared.with(|conn| Ok(conn.busy_timeout(timeout)?))?;
        self.busy_timeout = timeout;
        Ok(self)
    }

    /// The file the records are in.
    pub fn path(&self) -> &Path {
        &self.shared.path
    }

    /// Deletes every expired record now, rather than a few every so often;
    /// answers how many.
    pub fn purge_expired(&self) -> LedgerFuture<'_, usize> {
        self.run(|conn| {
            let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
            let purged = purge(&tx, now_ms(), i64::MAX)?;
            tx.commit()?;
            Ok(purged)
        })
    }

    /// Runs `op` with the connection, on the blocking pool.
    fn run<T: Send + 'static>(
        &self,
        op: impl FnOnce(&mut Connection) -> Result<T, Failure> + Send + 'static,
    ) -> LedgerFuture<'static, T> {
        let shared = Arc::clone(&self.shared);
        LedgerFuture::boxed(blocking(move || shared.with(op)))
    }
}

impl Shared {
    fn with<T>(
        &self,
        op: impl FnOnce(&mut Connection) -> Result<T, Failure>,
    ) -> Result<T, LedgerError> {
        // A panic while the lock was held cannot have left a transaction
        // open: rusqlite rolls it back when it is dropped.
        let mut conn = self.conn.lock().unwrap_or_else(PoisonError::into_inner);
        op(&mut conn).map_err(|failure| failure.at(&self.path))
    }
}

/// Runs `task` on the blocking pool of the current runtime, or here when
/// there is none (no runtime thread to keep free).
async fn blocking<T: Send + 'static>(
    task: impl FnOnce() -> Result<T, LedgerError> + Send + 'static,
) -> Result<T, LedgerError> {
    match Handle::try_current() {
        Ok(handle) => handle.spawn_blocking(task).await.unwrap_or_else(|error| {
            Err(LedgerError::Unavailable(format!("the ledger's SQLite thread failed: {error}")))
        }),
        Err(_) => task(),
    }
}

/// Opens the connection and makes sure the file holds a ledger.
///
/// Several processes opening a new file at once race to switch it to WAL
/// and to create the schema; SQLite answers some of those races with
/// "database is locked" at once, without its busy handler. Such an open is
/// tried again, within the busy timeout.
fn connect(path: &Path) -> Result<Connection, Failure> {
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

fn is_busy(error: &rusqlite::Error) -> bool {
    matches!(
        error.sqlite_error_code(),
        Some(rusqlite::ErrorCode::DatabaseBusy | rusqlite::ErrorCode::DatabaseLocked)
    )
}

fn connect_once(path: &Path) -> Result<Connection, Failure> {
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
        return Err(Failure::Ledger(LedgerError::Unavailable(format!(
            "the file cannot be put in WAL mode (journal mode {mode})"
        ))));
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

fn unusable(why: &str) -> Failure {
    Failure::Ledger(LedgerError::Unavailable(format!("not a usable verified-tools ledger: {why}")))
}

/// Why an operation failed, before the file's path is added.
enum Failure {
    Sql(rusqlite::Error),
    Ledger(LedgerError),
}

impl From<rusqlite::Error> for Failure {
    fn from(error: rusqlite::Error) -> Self {
        Failure::Sql(error)
    }
}

impl Failure {
    fn at(self, path: &Path) -> LedgerError {
        let error = match self {
            Failure::Ledger(LedgerError::Unavailable(why)) => why,
            Failure::Ledger(LedgerError::Corrupt(why)) => {
                return LedgerError::Corrupt(format!("{}: {why}", path.display()));
            }
            Failure::Ledger(other) => return other,
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
                if corrupt {
                    return LedgerError::Corrupt(format!("{}: {error}", path.display()));
                }
                error.to_string()
            }
        };
        LedgerError::Unavailable(format!("{}: {error}", path.display()))
    }
}

fn corrupt(why: &str) -> Failure {
    Failure::Ledger(LedgerError::Corrupt(why.to_owned()))
}

// ---------------------------------------------------------------- records

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
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
struct Record {
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
    fn progress(&self, now: i64) -> Progress {
        let settle = match self.settle_at {
            Some(at) => Settle::After(duration(at.saturating_sub(now))),
            None => Settle::Never,
        };
        Progress { attempts: self.attempts, after_ok: self.after_ok, settle }
    }
}

fn key_bytes(key: IdempotencyKey) -> [u8; 16] {
    key.as_u128().to_be_bytes()
}

fn digest(bytes: &[u8]) -> Result<PayloadDigest, Failure> {
    let bytes: [u8; 16] = bytes.try_into().map_err(|_| corrupt("a fingerprint is not 16 bytes"))?;
    Ok(PayloadDigest::from_u128(u128::from_be_bytes(bytes)))
}

/// The live record of `key`: an expired one is absent.
fn read(conn: &Connection, key: IdempotencyKey, now: i64) -> Result<Option<Record>, Failure> {
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
fn next_fence(conn: &Connection) -> Result<Fence, Failure> {
    let mut statement =
        conn.prepare_cached("UPDATE meta SET fence = fence + 1 WHERE id = 1 RETURNING fence")?;
    let fence: i64 = statement.query_row([], |r| r.get(0))?;
    u64::try_from(fence).map(Fence).map_err(|_| corrupt("the fence counter is negative"))
}

/// The claim of one key, inside the claim's transaction.
fn take(
    conn: &Connection,
    key: IdempotencyKey,
    record: Option<Record>,
    fingerprint: PayloadDigest,
    first: Progress,
    now: i64,
    lease: Duration,
) -> Result<Claimed, Failure> {
    let lease_end = later(now, lease);
    let Some(record) = record else {
        let fence = next_fence(conn)?;
        // Replaces an expired record, if there is one.
        let mut statement = conn.prepare_cached(
            "INSERT OR REPLACE INTO records
                 (key, fingerprint, state, fence, lease_end_ms, attempts, after_ok, settle_at_ms,
                  value, expires_at_ms)
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
        return Ok(Claimed::Fresh(fence));
    };
    if record.fingerprint != fingerprint {
        return Ok(Claimed::Mismatch);
    }
    match record.state {
        State::Completed => {
            Ok(Claimed::Completed(record.value.map_or(Replay::Unrecorded, Replay::Encoded)))
        }
        State::Held if record.lease_end.is_some_and(|end| now < end) => {
            Ok(Claimed::InFlight(duration(record.lease_end.unwrap_or(now) - now)))
        }
        // In doubt, settled with budget left, or held past the lease (the
        // holder may have dispatched): the taker verifies first.
        State::Held | State::InDoubt | State::Settled => {
            let fence = next_fence(conn)?;
            let mut statement = conn.prepare_cached(
                "UPDATE records
                 SET state = 'held', fence = ?2, lease_end_ms = ?3, expires_at_ms = NULL
                 WHERE key = ?1",
            )?;
            statement.execute(params![key_bytes(key), fence_value(fence), lease_end])?;
            Ok(Claimed::Resume(fence, record.progress(now)))
        }
    }
}

/// A claim's transaction. `cancel` says whether its caller is gone.
fn claim(
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
    let fence = match claim.state {
        Claimed::Fresh(fence) | Claimed::Resume(fence, _) => fence,
        // Nothing was written.
        _ => return Ok(claim),
    };
    if matches!(*lock(cancel), Waiter::Cancelled) {
        // The caller is gone: nobody would learn it holds the key.
        drop(tx);
        return Err(Failure::Ledger(LedgerError::Unavailable("the claim was cancelled".into())));
    }
    tx.commit()?;
    let mut waiter = lock(cancel);
    if matches!(*waiter, Waiter::Cancelled) {
        drop(waiter);
        abandon(conn, claim.key, fence)?;
    } else {
        *waiter = Waiter::Answered(claim.key, fence);
    }
    Ok(claim)
}

/// A holder's write-through before an attempt.
fn dispatching(
    conn: &mut Connection,
    key: IdempotencyKey,
    fence: Fence,
    progress: Progress,
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
    tx.commit()?;
    Ok(())
}

/// How a holder's call ended: `value` is the encoded value of a completion.
#[derive(Debug)]
enum Ending {
    Completed(Option<Vec<u8>>),
    Settled,
    InDoubt,
}

fn finish(
    conn: &mut Connection,
    key: IdempotencyKey,
    fence: Fence,
    ending: Ending,
    ttl: Duration,
    purge_too: bool,
) -> Result<(), Failure> {
    let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
    let now = now_ms();
    let expires = later(now, ttl);
    let (state, value, expires) = match ending {
        Ending::Completed(value) => ("completed", value, Some(expires)),
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
fn abandon(conn: &Connection, key: IdempotencyKey, fence: Fence) -> Result<(), Failure> {
    conn.prepare_cached(
        "UPDATE records SET state = 'in_doubt', lease_end_ms = NULL
         WHERE key = ?1 AND state = 'held' AND fence = ?2",
    )?
    .execute(params![key_bytes(key), fence_value(fence)])?;
    Ok(())
}

/// Deletes up to `limit` expired records, the oldest first.
fn purge(conn: &Connection, now: i64, limit: i64) -> Result<usize, Failure> {
    let purged = conn
        .prepare_cached(
            "DELETE FROM records WHERE key IN (
                 SELECT key FROM records WHERE expires_at_ms <= ?1
                 ORDER BY expires_at_ms LIMIT ?2)",
        )?
        .execute(params![now, limit])?;
    Ok(purged)
}

// ---------------------------------------------------------------- time

/// Now, on the host's wall clock: milliseconds since the Unix epoch.
fn now_ms() -> i64 {
    let since = SystemTime::now().duration_since(UNIX_EPOCH).unwrap_or_default();
    i64::try_from(since.as_millis()).unwrap_or(i64::MAX)
}

/// `now` plus `d`, rounded down to the millisecond (a lease or TTL a little
/// short rather than long), saturating.
fn later(now: i64, d: Duration) -> i64 {
    now.saturating_add(i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
}

/// When an attempt settles: `now` plus `d` rounded up (never early).
fn settle_at(now: i64, settle: Settle) -> Option<i64> {
    match settle {
        Settle::After(d) => {
            let ms = d.as_nanos().div_ceil(1_000_000);
            Some(now.saturating_add(i64::try_from(ms).unwrap_or(i64::MAX)))
        }
        Settle::Never => None,
    }
}

fn duration(ms: i64) -> Duration {
    Duration::from_millis(u64::try_from(ms).unwrap_or(0))
}

fn fence_value(fence: Fence) -> i64 {
    // Fences come from an i64 counter: they always fit.
    i64::try_from(fence.0).unwrap_or(i64::MAX)
}

// ---------------------------------------------------------------- the trait

/// Where a claim's caller is: still waiting, gone, or answered with a hold.
#[derive(Debug, Clone, Copy)]
enum Waiter {
    Waiting,
    Cancelled,
    Answered(IdempotencyKey, Fence),
    Received,
}

fn lock(waiter: &Mutex<Waiter>) -> MutexGuard<'_, Waiter> {
    waiter.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Dropped before the claim's answer was received, it tells the claim's
/// transaction to roll back, or abandons the hold it answered with.
struct Pending {
    waiter: Arc<Mutex<Waiter>>,
    shared: Arc<Shared>,
}

impl Drop for Pending {
    fn drop(&mut self) {
        let mut waiter = lock(&self.waiter);
        match *waiter {
            Waiter::Waiting => *waiter = Waiter::Cancelled,
            Waiter::Answered(key, fence) => {
                *waiter = Waiter::Received;
                drop(waiter);
                abandon_later(&self.shared, key, fence);
            }
            Waiter::Cancelled | Waiter::Received => {}
        }
    }
}

/// Abandons a hold without blocking a runtime thread.
fn abandon_later(shared: &Arc<Shared>, key: IdempotencyKey, fence: Fence) {
    let shared = Arc::clone(shared);
    let task = move || {
        // Lost, the lease ends the hold.
        let _ = shared.with(|conn| abandon(conn, key, fence));
    };
    match Handle::try_current() {
        Ok(handle) => drop(handle.spawn_blocking(task)),
        Err(_) => task(),
    }
}

impl Ledger for SqliteLedger {
    fn claim(&self, request: ClaimRequest) -> LedgerFuture<'_, Claim> {
        let lease = self.lease;
        let waiter = Arc::new(Mutex::new(Waiter::Waiting));
        let pending = Pending { waiter: Arc::clone(&waiter), shared: Arc::clone(&self.shared) };
        let shared = Arc::clone(&self.shared);
        LedgerFuture::boxed(async move {
            let result =
                blocking(move || shared.with(|conn| claim(conn, request, lease, &waiter))).await;
            *lock(&pending.waiter) = Waiter::Received;
            result
        })
    }

    fn dispatching(
        &self,
        key: IdempotencyKey,
        fence: Fence,
        progress: Progress,
    ) -> LedgerFuture<'_, ()> {
        self.run(move |conn| dispatching(conn, key, fence, progress))
    }

    fn finish<'a>(
        &'a self,
        key: IdempotencyKey,
        fence: Fence,
        end: End<'a>,
    ) -> LedgerFuture<'a, ()> {
        let ending = match end {
            End::Completed(value) => Ending::Completed(Recorded::encode(value)),
            End::Settled => Ending::Settled,
            End::InDoubt => Ending::InDoubt,
        };
        let ttl = self.ttl;
        let purge_too =
            self.shared.finishes.fetch_add(1, Ordering::Relaxed).is_multiple_of(PURGE_EVERY);
        self.run(move |conn| finish(conn, key, fence, ending, ttl, purge_too))
    }

    fn abandon(&self, key: IdempotencyKey, fence: Fence) {
        abandon_later(&self.shared, key, fence);
    }

    fn lease(&self) -> Duration {
        self.lease
    }
}
