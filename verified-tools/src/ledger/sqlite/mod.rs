//! The SQLite ledger (feature `sqlite`): the embedded, durable ledger of one
//! host. How to use it and what it guarantees is on [`SqliteLedger`]; the
//! file's schema and how it is opened are in `schema.rs`, its transactions
//! in `sql.rs`, a record's row in `row.rs`, and how a failure is told in
//! `failure.rs`. This file is the handle: its connection, the blocking pool
//! it runs on, and the claim that a dropped caller rolls back or abandons.

mod failure;
mod row;
mod schema;
mod sql;

use self::failure::{Failure, is_busy};
use self::row::now_ms;
use self::schema::{DEFAULT_BUSY_TIMEOUT, connect};
use self::sql::{
    Ending, PURGE_EVERY, abandon, claim, dispatching, finish, hold, purge, record, resolve, scan,
};

use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use rusqlite::{Connection, TransactionBehavior};
use tokio::runtime::Handle;

use super::{
    Claim, ClaimRequest, Claimed, End, Fence, Ledger, LedgerError, LedgerFuture, Progress,
    RecordState, RecordView, Recorded, Replay, Resolution, StoreError,
};
use crate::IdempotencyKey;

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
/// An operation that finds the write lock taken waits for it up to the busy
/// timeout (SQLite's busy handler); a `SQLITE_BUSY` that comes back anyway
/// (the handler gave up, or SQLite answered at once: another process
/// recovering the write-ahead log, a checkpoint) is tried again after a
/// pause that doubles from 5 ms up to 100 ms, until the operation has taken
/// twice the busy timeout, or its caller is gone (the engine drops a claim or
/// a write-through at the call's deadline). A transaction that failed
/// changed nothing, so trying it again is safe.
///
/// Any other SQLite failure (the file cannot be opened or written, the disk
/// is full, the file is corrupt), or the write lock still taken at the end,
/// is returned as [`LedgerError::Unavailable`] or [`LedgerError::Corrupt`],
/// never as a panic: the engine then refuses the call before anything is
/// dispatched. A claim that only reads (a completed call's replay, a key in
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
/// back, or, if it had committed, undone: a fresh hold is deleted, a hold
/// taken over goes back in doubt. The key is not left held for a lease by a
/// call that never learnt it held it, and no attempt is counted that never
/// went out. A write-through dropped so is rolled back, or its attempt
/// taken back (the caller did not dispatch it). [`Ledger::abandon`], called
/// from a destructor, must not block: it queues its short write on the
/// blocking pool and returns (in the caller's thread outside a runtime). If
/// that write is lost (the runtime shuts down, the process is killed), the
/// lease ends the hold.
///
/// # The operator's door
///
/// [`record`](Ledger::record), [`in_doubt`](Ledger::in_doubt) and
/// [`resolve`](Ledger::resolve) are implemented (the `ledger` example of the
/// repository is their command line):
///
/// - A hold past its lease is shown and listed *in doubt*: its holder is
///   presumed dead, and the next call would take the key over to verify, as
///   it does a record in doubt. Its holder's process may be alive, though,
///   only slow: resolve such a record when you know its process is gone.
/// - `record` and `in_doubt` only read, without the write lock.
/// - `in_doubt` is an operator's tool, not for the hot path: it walks the
///   table by key, 512 records per statement, until it has `limit` records
///   in doubt or reaches the end; no index serves it, since one that found
///   the holds past their lease would cost every call an entry. The table
///   holds about a TTL's worth of finished calls (plus those in doubt): at a
///   few calls a second, a walk of hundreds of thousands of records, well
///   under a second. The handle's connection is free between two
///   statements, so the agents' calls on the same handle go on meanwhile.
///   The walk is not one snapshot: a record that changes during it may be
///   missed; list again.
/// - `resolve` is one `BEGIN IMMEDIATE` transaction that changes the record
///   only when it is in doubt: [`Resolution::Applied`] makes it completed
///   without a value (a repeat verifies to obtain the value and never
///   dispatches), [`Resolution::NotApplied`] settled now with no attempt
///   counted (a repeat verifies, then has the key's whole budget); either
///   expires after the TTL, like a finish. It takes a new fence from the
///   counter, so a holder presumed dead that wakes up is fenced
///   ([`LedgerError::Fenced`]): its outcome never overwrites a person's
///   decision.
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

    /// Sets how long an operation waits for another process's write lock at a
    /// time (5 seconds by default); it tries again until it has taken twice
    /// that, then fails with [`LedgerError::Unavailable`] (see
    /// [Failures](Self#failures)). The engine bounds a claim by its call's
    /// deadline as well.
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

    /// Runs `op` with the connection, on the blocking pool, trying it again
    /// while the store is busy.
    fn run<T: Send + 'static>(
        &self,
        op: impl FnMut(&mut Connection) -> Result<T, Failure> + Send + 'static,
    ) -> LedgerFuture<'static, T> {
        let (shared, budget) = (Arc::clone(&self.shared), self.retry_for());
        LedgerFuture::boxed(blocking(move || shared.retrying(budget, None, op)))
    }

    /// How long one operation may take, trying again while the store is
    /// busy.
    fn retry_for(&self) -> Duration {
        self.busy_timeout.saturating_mul(2)
    }

    /// Runs `op` for a caller that may go before it gets the answer: what
    /// `op` committed is then undone ([`Undo`]), in the blocking pool.
    fn guarded<T: Send + 'static>(
        &self,
        op: impl FnMut(&mut Connection, &Mutex<Waiter>) -> Result<T, Failure> + Send + 'static,
    ) -> LedgerFuture<'static, T> {
        let waiter = Arc::new(Mutex::new(Waiter::Waiting));
        let pending = Pending { waiter: Arc::clone(&waiter), shared: Arc::clone(&self.shared) };
        let (shared, budget) = (Arc::clone(&self.shared), self.retry_for());
        let mut op = op;
        LedgerFuture::boxed(async move {
            let result =
                blocking(move || shared.retrying(budget, Some(&waiter), |conn| op(conn, &waiter)))
                    .await;
            *lock(&pending.waiter) = Waiter::Received;
            result
        })
    }
}

/// The first pause before a busy operation is tried again; each later one
/// doubles, up to [`MAX_BUSY_PAUSE`].
const FIRST_BUSY_PAUSE: Duration = Duration::from_millis(5);

/// The longest pause between two tries of a busy operation.
const MAX_BUSY_PAUSE: Duration = Duration::from_millis(100);

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

    /// Runs `op` until it is not busy, within `budget`, or until the caller
    /// behind `cancel` is gone. The connection is free between two tries,
    /// for the handle's other operations.
    fn retrying<T>(
        &self,
        budget: Duration,
        cancel: Option<&Mutex<Waiter>>,
        mut op: impl FnMut(&mut Connection) -> Result<T, Failure>,
    ) -> Result<T, LedgerError> {
        let started = std::time::Instant::now();
        let mut pause = FIRST_BUSY_PAUSE;
        loop {
            let failure = {
                let mut conn = self.conn.lock().unwrap_or_else(PoisonError::into_inner);
                match op(&mut conn) {
                    Err(Failure::Sql(error)) if is_busy(&error) => Failure::Sql(error),
                    other => return other.map_err(|failure| failure.at(&self.path)),
                }
            };
            let left = budget.saturating_sub(started.elapsed());
            let gone = cancel.is_some_and(|c| matches!(*lock(c), Waiter::Cancelled));
            if left.is_zero() || gone {
                return Err(failure.at(&self.path));
            }
            std::thread::sleep(pause.min(left));
            pause = (pause * 2).min(MAX_BUSY_PAUSE);
        }
    }
}

/// Runs `task` on the blocking pool of the current runtime, or here when
/// there is none (no runtime thread to keep free).
async fn blocking<T: Send + 'static>(
    task: impl FnOnce() -> Result<T, LedgerError> + Send + 'static,
) -> Result<T, LedgerError> {
    match Handle::try_current() {
        Ok(handle) => handle.spawn_blocking(task).await.unwrap_or_else(|error| {
            let message = format!("the ledger's SQLite thread failed: {error}");
            Err(LedgerError::Unavailable(StoreError::with_source(message, error)))
        }),
        Err(_) => task(),
    }
}

// ---------------------------------------------------------------- the trait

/// Where the caller of a claim or a write-through is: still waiting, gone,
/// answered (with what to undo, should it go before it receives the
/// answer), or with the answer.
#[derive(Debug, Clone, Copy)]
pub(super) enum Waiter {
    Waiting,
    Cancelled,
    Answered(Undo),
    Received,
}

/// What a committed operation wrote that its caller must learn of, or have
/// undone.
#[derive(Debug, Clone, Copy)]
pub(super) enum Undo {
    /// A claim's hold: released (see [`sql::release`]).
    Release { key: IdempotencyKey, fence: Fence, fresh: bool },
    /// A write-through's attempt: taken back (see [`sql::withdraw`]).
    Withdraw { key: IdempotencyKey, fence: Fence, attempt: u32 },
}

pub(super) fn lock(waiter: &Mutex<Waiter>) -> MutexGuard<'_, Waiter> {
    waiter.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Dropped before the answer was received, it tells the operation's
/// transaction to roll back, or undoes what it committed.
struct Pending {
    waiter: Arc<Mutex<Waiter>>,
    shared: Arc<Shared>,
}

impl Drop for Pending {
    fn drop(&mut self) {
        let mut waiter = lock(&self.waiter);
        match *waiter {
            Waiter::Waiting => *waiter = Waiter::Cancelled,
            Waiter::Answered(undo) => {
                *waiter = Waiter::Received;
                drop(waiter);
                later(&self.shared, move |conn| undo.apply(conn));
            }
            Waiter::Cancelled | Waiter::Received => {}
        }
    }
}

/// Runs a short write without blocking a runtime thread (from a
/// destructor). Lost, the record stays conservative: the lease ends a hold,
/// an attempt stays counted.
fn later(
    shared: &Arc<Shared>,
    op: impl FnOnce(&Connection) -> Result<(), Failure> + Send + 'static,
) {
    let shared = Arc::clone(shared);
    let task = move || {
        let _ = shared.with(|conn| op(conn));
    };
    match Handle::try_current() {
        Ok(handle) => drop(handle.spawn_blocking(task)),
        Err(_) => task(),
    }
}

impl Ledger for SqliteLedger {
    fn claim(&self, request: ClaimRequest) -> LedgerFuture<'_, Claim> {
        let lease = self.lease;
        self.guarded(move |conn, waiter| claim(conn, request, lease, waiter))
    }

    fn dispatching(
        &self,
        key: IdempotencyKey,
        fence: Fence,
        progress: Progress,
    ) -> LedgerFuture<'_, ()> {
        self.guarded(move |conn, waiter| dispatching(conn, key, fence, progress, waiter))
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
        self.run(move |conn| finish(conn, key, fence, &ending, ttl, purge_too))
    }

    fn abandon(&self, key: IdempotencyKey, fence: Fence) {
        later(&self.shared, move |conn| abandon(conn, key, fence));
    }

    fn lease(&self) -> Duration {
        self.lease
    }

    fn hold(&self, key: IdempotencyKey, fence: Fence) -> LedgerFuture<'_, Option<Duration>> {
        self.run(move |conn| hold(conn, key, fence))
    }

    fn record(&self, key: IdempotencyKey) -> LedgerFuture<'_, Option<RecordView>> {
        self.run(move |conn| record(conn, key))
    }

    fn in_doubt(&self, limit: usize) -> LedgerFuture<'_, Vec<RecordView>> {
        let (shared, budget) = (Arc::clone(&self.shared), self.retry_for());
        LedgerFuture::boxed(async move {
            let (mut found, mut after) = (Vec::new(), None);
            while found.len() < limit {
                let shared = Arc::clone(&shared);
                let (views, last) =
                    blocking(move || shared.retrying(budget, None, |conn| scan(conn, after)))
                        .await?;
                found.extend(views.into_iter().take(limit - found.len()));
                match last {
                    Some(key) => after = Some(key),
                    None => break,
                }
            }
            Ok(found)
        })
    }

    fn resolve(
        &self,
        key: IdempotencyKey,
        resolution: Resolution,
    ) -> LedgerFuture<'_, Option<RecordState>> {
        let ttl = self.ttl;
        self.run(move |conn| resolve(conn, key, resolution, ttl))
    }
}
