//! The PostgreSQL ledger (feature `postgres`): records in a PostgreSQL
//! database, shared by every process and host that connects to it. How to
//! use it, its schema and what it guarantees are on [`PostgresLedger`]; the
//! statements and how their answers are read are in `sql.rs`, the schema
//! and its functions in `schema.sql`. This file is the handle; how it is
//! opened is in `builder.rs`, where its connections come from (a URL, a
//! client, a pool) in `connection.rs`, the bound on every operation and the
//! claim that a dropped caller abandons in `operations.rs`, and how a
//! failure is told in `failure.rs`.

mod builder;
mod connection;
mod failure;
mod operations;
mod sql;
mod transact;

pub use self::builder::PostgresLedgerBuilder;
pub use self::transact::{Tx, TxError, TxFuture, TxStage};

use std::fmt;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use tokio::runtime::Handle;
use tokio::sync::oneshot;
use tokio::time::Instant;
use tokio_postgres::types::{ToSql, Type};

use self::connection::Source;
use self::failure::{Failure, first, kept, no_answer};
use self::operations::{Answer, Inner, Params, abandon_later, held};
use self::sql::{PURGE_BATCH, PURGE_EVERY};
use super::{
    Claim, ClaimRequest, End, Fence, Ledger, LedgerError, LedgerFuture, Progress, RecordState,
    RecordView, Resolution,
};
use crate::IdempotencyKey;

/// A ledger in a PostgreSQL database, shared by every process and host that
/// connects to it with the same schema and table prefix.
///
/// - Claims, write-throughs, finishes and abandons are each one call of a
///   server-side function (PL/pgSQL, installed with the schema), in one
///   round trip: a successful call costs two, its claim (which records the
///   first attempt) and its finish. Each is one transaction, and one that
///   writes a record holds its row lock (a new key: its primary key's
///   unique index): two calls never both hold a key.
/// - Fences come from one sequence (`vt_fence`), so they grow across all
///   keys, processes and hosts.
/// - Leases, settle times and expiries run on the database server's clock
///   (`clock_timestamp()`): hosts with skewed clocks agree. Durations cross
///   the wire, never instants.
/// - Completed and settled records expire after the TTL (24 h by default);
///   held and in-doubt records never expire.
/// - A completed call's value is kept as the bytes its
///   [`Codec`](super::Codec) writes (JSON); a value without one is recorded
///   as completed without value (a repeat verifies to get it).
/// - The operator's door is open: [`record`](Ledger::record),
///   [`in_doubt`](Ledger::in_doubt) and [`resolve`](Ledger::resolve).
///
/// ```no_run
/// use std::sync::Arc;
/// use std::time::Duration;
/// use verified_tools::Context;
/// use verified_tools::ledger::PostgresLedger;
///
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// // Creates the schema if it is missing (in `public`, tables `vt_*`).
/// let ledger = PostgresLedger::connect("postgres://billing@db.internal/billing")
///     .await?
///     .with_lease(Duration::from_secs(600))
///     .with_ttl(Duration::from_secs(24 * 3600));
/// let cx = Context::new("billing-agent").with_ledger(Arc::new(ledger));
///
/// // Elsewhere: a schema of its own, made by a migration beforehand.
/// let ledger = PostgresLedger::builder()
///     .with_schema("agents")
///     .with_prefix("billing_")
///     .with_schema_creation(false)
///     .connect("host=db.internal user=billing dbname=billing")
///     .await?;
/// # let _ = (cx, ledger); Ok(()) }
/// ```
///
/// # Connections
///
/// Three sources, chosen on the [builder](Self::builder):
///
/// - **A connection string** ([`connect`](PostgresLedgerBuilder::connect),
///   or [`connect_tls`](PostgresLedgerBuilder::connect_tls) with a TLS
///   connector such as `postgres-native-tls` or `tokio-postgres-rustls`):
///   the ledger opens one connection and shares it between all its
///   operations (tokio-postgres pipelines concurrent requests on it). An
///   operation whose connection breaks under it, or that gets no answer in
///   time, fails closed, and the next operation connects anew; a connection
///   found closed before an operation is replaced before anything is sent
///   on it.
/// - **A client you connected** ([`on_client`](PostgresLedgerBuilder::on_client)):
///   used as it is, concurrently. The ledger cannot reconnect it: once its
///   connection is gone, every operation fails with
///   [`LedgerError::Unavailable`]. Give a pool or a connection string where
///   that matters.
/// - **A pool** ([`on_pool`](PostgresLedgerBuilder::on_pool)): a function
///   that checks a connection out for one operation, and a function that
///   reaches the `tokio_postgres::Client` inside what it checked out. The
///   checked-out connection goes back to the pool when the operation ends.
///   No prepared statements are used, so any connection of the pool will
///   do, and the pool's own recycling replaces broken ones.
///
/// With [deadpool-postgres](https://docs.rs/deadpool-postgres) (whose
/// `tokio-postgres` must be this crate's, 0.7):
///
/// ```ignore
/// let pool: deadpool_postgres::Pool = config.create_pool(Some(Runtime::Tokio1), NoTls)?;
/// let ledger = PostgresLedger::builder()
///     .on_pool(
///         move || {
///             let pool = pool.clone();
///             async move { pool.get().await }
///         },
///         |object: &deadpool_postgres::Object| -> &tokio_postgres::Client { object },
///     )
///     .await?;
/// ```
///
/// With [bb8-postgres](https://docs.rs/bb8-postgres) (`get_owned`, so that
/// the checked-out connection does not borrow the pool):
///
/// ```ignore
/// type Manager = bb8_postgres::PostgresConnectionManager<tokio_postgres::NoTls>;
/// let pool: bb8::Pool<Manager> = bb8::Pool::builder().build(manager).await?;
/// let ledger = PostgresLedger::builder()
///     .on_pool(
///         move || {
///             let pool = pool.clone();
///             async move { pool.get_owned().await }
///         },
///         |conn: &bb8::PooledConnection<'static, Manager>| -> &tokio_postgres::Client { conn },
///     )
///     .await?;
/// ```
///
/// # The schema
///
/// One table of records, one sequence of fences, two partial indexes and
/// the functions the operations call, all named from the schema (`public`
/// by default, [`with_schema`](PostgresLedgerBuilder::with_schema)) and a
/// prefix (`vt_`, [`with_prefix`](PostgresLedgerBuilder::with_prefix)).
/// [`connect`](PostgresLedgerBuilder::connect) and the other constructors
/// create it if it is missing, in one transaction under an advisory lock, so
/// processes starting at once do not race; it needs the privilege to create
/// in the schema (and to create the schema, if it is missing). Where the
/// application's role may not create tables, create the schema beforehand,
/// from a migration, and turn that off
/// ([`with_schema_creation(false)`](PostgresLedgerBuilder::with_schema_creation)):
/// the role then needs `SELECT, INSERT, UPDATE, DELETE` on the table,
/// `USAGE` on the sequence and `EXECUTE` on the functions (granted to
/// `PUBLIC` by default). [`schema_sql`](PostgresLedgerBuilder::schema_sql)
/// gives the DDL for other names. For the defaults it is exactly this:
///
#[doc = concat!("```sql\n", include_str!("schema.sql"), "```")]
///
/// | column | meaning |
/// |---|---|
/// | `key` | the idempotency key, 16 bytes big-endian |
/// | `fingerprint` | the payload digest, 16 bytes big-endian |
/// | `state` | `held`, `in_doubt`, `settled`, `completed` |
/// | `fence` | the fence of the last claim (the holder's while `held`) |
/// | `lease_end` | when the hold ends (`held` only) |
/// | `attempts`, `after_ok` | [`Progress`], written through before every attempt |
/// | `settle_at` | when the last attempt settles; `NULL`: never |
/// | `value` | a completed call's value; `NULL`: not recorded |
/// | `expires_at` | when a `completed` or `settled` record expires; `NULL` otherwise |
///
/// The functions are the only writers, and keep the columns consistent with
/// the state; reading, the ledger checks them again (a record out of range
/// is [`LedgerError::Corrupt`]). There are no `CHECK` constraints:
/// PostgreSQL prepares them for every statement that writes, and seven of
/// them tripled the server's time for a claim's insert. A schema of
/// another version (`vt_schema_version()`) is refused; one whose table or
/// sequence was dropped is created again on the next opening (or refused,
/// without schema creation), its records gone.
///
/// # What the guarantees assume
///
/// - **Durable commits: `synchronous_commit = on`** (PostgreSQL's default),
///   and `fsync = on`. A commit is then on disk before the operation
///   returns, and a crash of the server loses no record a call was told
///   about. With `synchronous_commit = off`, the last commits before a crash
///   (up to three times `wal_writer_delay`) can be lost: a lost in-doubt
///   record, or a lost hold whose call was dispatching, lets the next call
///   with the key dispatch without verifying first.
/// - **The primary, not a replica.** Every operation writes. With
///   asynchronous replication, a failover to a replica that lags loses what
///   the primary had not sent; `synchronous_standby_names` with
///   `synchronous_commit = on` (or `remote_apply`) does not.
/// - **`READ COMMITTED`** (the default isolation) for the ledger's
///   sessions. Each operation is one statement, its own transaction; under
///   a stricter `default_transaction_isolation`, concurrent claims of one key
///   fail with serialization errors (the calls are refused) instead of
///   queueing on the row lock.
/// - **Not inside the application's transaction.** A client given to
///   [`on_client`](PostgresLedgerBuilder::on_client) must not be in an
///   explicit transaction when the ledger uses it: its records would commit
///   or roll back with the application's work, and its row locks would be
///   held as long.
///
/// # Time
///
/// Leases, settle times and expiries are measured by the database server's
/// clock only, read with `clock_timestamp()` in each operation. A clock
/// stepped forward ends holds early (the key is taken over in doubt, and the
/// old holder is fenced); a clock stepped back makes them last longer. The
/// ledger needs tokio's real time: its timeouts would fire at once on a
/// paused clock.
///
/// # Expiry
///
/// Completed and settled records expire after the TTL
/// ([`with_ttl`](Self::with_ttl)), counted from their finish. A claim treats
/// an expired record as absent: a new logical call replaces it. Expired
/// records are deleted lazily: every 32nd finish of a handle deletes up to
/// 64 of them in its own transaction (at no extra round trip), and
/// [`purge_expired`](Self::purge_expired) deletes all of them. Run it from a
/// scheduled job where finishes are rare and records many.
///
/// # Failures
///
/// Every operation is bounded by the timeout
/// ([`DEFAULT_TIMEOUT`](Self::DEFAULT_TIMEOUT),
/// [`with_timeout`](PostgresLedgerBuilder::with_timeout)), a reconnection
/// included. A database that is down, refuses the connection or the
/// statement, or does not answer in time gives [`LedgerError::Unavailable`],
/// and the engine refuses the call before it dispatches. A statement that
/// fails changes nothing (it is its own transaction). A claim that only
/// reads (a replay, a key in flight, another payload) writes nothing, so
/// replays go on while the database refuses writes.
///
/// A claim is sent from a task of its own, which waits for its answer up to
/// the lease. A caller that stops waiting (the timeout struck, its call's
/// deadline, or its task was cancelled) does not leave the key held by
/// nobody for a lease: if the claim lands and finds the caller gone, the task
/// abandons the hold at once, and the next call with the key verifies before
/// it dispatches. [`Ledger::abandon`], called from a destructor, does not
/// block: it spawns its write on the current tokio runtime. If that write is
/// lost (no runtime, the runtime shutting down, the database unreachable),
/// the lease ends the hold.
#[derive(Clone)]
pub struct PostgresLedger {
    inner: Arc<Inner>,
    lease: Duration,
    ttl: Duration,
}

impl PostgresLedger {
    /// The default schema of the ledger's table, sequence and functions.
    pub const DEFAULT_SCHEMA: &'static str = sql::DEFAULT_SCHEMA;
    /// The default prefix of their names.
    pub const DEFAULT_PREFIX: &'static str = sql::DEFAULT_PREFIX;
    /// The default bound on each operation, a reconnection included.
    pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(2);

    /// Connects to the database at `url` (a URL or `key=value` pairs, as
    /// tokio-postgres reads them; no TLS: see
    /// [`connect_tls`](PostgresLedgerBuilder::connect_tls)), creating the
    /// schema if it is missing, with the default names and
    /// [timeout](Self::DEFAULT_TIMEOUT). Records live 24 hours, keys are
    /// leased for 10 minutes.
    ///
    /// Fails with [`LedgerError::Unavailable`] if the server cannot be
    /// reached or the schema cannot be created. Afterwards, the connection
    /// is re-established by itself.
    pub async fn connect(url: &str) -> Result<Self, LedgerError> {
        Self::builder().connect(url).await
    }

    /// Like [`connect`](Self::connect), with another bound on each
    /// operation (a reconnection included): long enough for the server's
    /// commit under load, short enough that calls are refused promptly when
    /// the database is down.
    pub async fn connect_with_timeout(url: &str, timeout: Duration) -> Result<Self, LedgerError> {
        Self::builder().with_timeout(timeout).connect(url).await
    }

    /// The other ways to open a ledger: other names, another timeout, a
    /// schema made beforehand, the application's client or pool.
    pub fn builder() -> PostgresLedgerBuilder {
        PostgresLedgerBuilder::default()
    }

    /// Sets how long a call may hold a key (10 minutes by default), on the
    /// database's clock: past it, the next call takes the key over in doubt.
    /// It must outlast every call's deadline
    /// ([`RetryPolicy::call_timeout`](crate::RetryPolicy::call_timeout)): the
    /// engine refuses calls whose deadline is longer. Each claim records the
    /// end of its own hold, so processes with different leases agree.
    pub fn with_lease(mut self, lease: Duration) -> Self {
        self.lease = lease;
        self
    }

    /// Sets how long completed and settled records are kept (24 hours by
    /// default). Records in doubt never expire: forgetting one would let the
    /// next call dispatch without verifying.
    pub fn with_ttl(mut self, ttl: Duration) -> Self {
        self.ttl = ttl;
        self
    }

    /// The PostgreSQL schema the ledger is in.
    pub fn schema(&self) -> &str {
        &self.inner.schema
    }

    /// The prefix of the ledger's names in its schema.
    pub fn prefix(&self) -> &str {
        &self.inner.prefix
    }

    /// How long completed and settled records are kept.
    pub fn ttl(&self) -> Duration {
        self.ttl
    }

    /// The bound on each operation.
    pub fn timeout(&self) -> Duration {
        self.inner.timeout
    }

    /// Deletes every expired record now, rather than a few every so often;
    /// answers how many. In batches of 10 000, one transaction each.
    pub fn purge_expired(&self) -> LedgerFuture<'_, usize> {
        LedgerFuture::boxed(async move {
            const BATCH: i32 = 10_000;
            let mut purged = 0;
            loop {
                let rows = self.inner.query(&self.inner.sql.purge, &[(&BATCH, Type::INT4)]).await?;
                let n: i64 = first(&rows, "purge")?;
                purged += usize::try_from(n).unwrap_or(0);
                if n < i64::from(BATCH) {
                    return Ok(purged);
                }
            }
        })
    }
}

impl fmt::Debug for PostgresLedger {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let source = match self.inner.source {
            Source::Own(_) => "connection string",
            Source::Given(_) => "client",
            Source::Pool(_) => "pool",
        };
        f.debug_struct("PostgresLedger")
            .field("schema", &self.inner.schema)
            .field("prefix", &self.inner.prefix)
            .field("source", &source)
            .field("lease", &self.lease)
            .field("ttl", &self.ttl)
            .field("timeout", &self.inner.timeout)
            .finish()
    }
}

impl Ledger for PostgresLedger {
    fn claim(&self, request: ClaimRequest) -> LedgerFuture<'_, Claim> {
        let (inner, lease) = (Arc::clone(&self.inner), self.lease);
        LedgerFuture::boxed(async move {
            let Ok(runtime) = Handle::try_current() else {
                return Err(LedgerError::Unavailable(
                    "postgres: the ledger runs on a tokio runtime, and there is none".into(),
                ));
            };
            let started = Instant::now();
            let lent = inner.lend_by(started).await.map_err(Failure::into_ledger)?;
            // What the caller gives up if no answer comes in time, so that
            // the next operation does not queue behind this one.
            let connection = lent.shared().cloned();
            let (send, receive) = oneshot::channel();
            let mut answer = Answer { answer: Some(receive), inner: Arc::clone(&inner) };
            let task = Arc::clone(&inner);
            runtime.spawn(async move {
                let claimed = task.claim(lent, started, request, lease).await;
                if let Err(Ok(claim)) = send.send(claimed)
                    && let Some(fence) = held(&claim)
                {
                    let _ = task.abandon(claim.key, fence).await;
                }
            });
            let receiving = answer.answer.as_mut().expect("the answer is taken once");
            match tokio::time::timeout_at(started + inner.timeout, receiving).await {
                Ok(received) => {
                    answer.answer = None;
                    received.unwrap_or_else(|_| {
                        Err(LedgerError::Unavailable("postgres: the claim's task failed".into()))
                    })
                }
                Err(_) => {
                    inner.discard(connection.as_ref());
                    // `answer` is dropped: a late hold is abandoned.
                    Err(no_answer(inner.timeout))
                }
            }
        })
    }

    fn dispatching(
        &self,
        key: IdempotencyKey,
        fence: Fence,
        progress: Progress,
    ) -> LedgerFuture<'_, ()> {
        LedgerFuture::boxed(async move {
            let key = sql::key_bytes(key);
            let key: &[u8] = &key;
            let (fence_value, attempts) = (sql::fence_arg(fence), i64::from(progress.attempts));
            let settle = crate::ledger::store_time::settle_micros(progress.settle);
            let params: [(&(dyn ToSql + Sync), Type); 5] = [
                (&key, Type::BYTEA),
                (&fence_value, Type::INT8),
                (&attempts, Type::INT8),
                (&progress.after_ok, Type::BOOL),
                (&settle, Type::INT8),
            ];
            self.inner.fenced(&self.inner.sql.dispatching, &params, fence).await
        })
    }

    fn finish<'a>(
        &'a self,
        key: IdempotencyKey,
        fence: Fence,
        end: End<'a>,
    ) -> LedgerFuture<'a, ()> {
        // Encoded at once: the future owns what it sends.
        let (state, value) = match end {
            End::Completed(value) => ("completed", value.encode()),
            End::Settled => ("settled", None),
            End::InDoubt => ("in_doubt", None),
        };
        let purge = match self.inner.finishes.fetch_add(1, Ordering::Relaxed) {
            n if n.is_multiple_of(PURGE_EVERY) => PURGE_BATCH,
            _ => 0,
        };
        LedgerFuture::boxed(async move {
            let key = sql::key_bytes(key);
            let key: &[u8] = &key;
            let (fence_value, ttl) = (sql::fence_arg(fence), sql::micros(self.ttl));
            let params: [(&(dyn ToSql + Sync), Type); 6] = [
                (&key, Type::BYTEA),
                (&fence_value, Type::INT8),
                (&state, Type::TEXT),
                (&value, Type::BYTEA),
                (&ttl, Type::INT8),
                (&purge, Type::INT4),
            ];
            self.inner.fenced(&self.inner.sql.finish, &params, fence).await
        })
    }

    fn abandon(&self, key: IdempotencyKey, fence: Fence) {
        abandon_later(&self.inner, key, fence);
    }

    fn lease(&self) -> Duration {
        self.lease
    }

    fn hold(&self, key: IdempotencyKey, fence: Fence) -> LedgerFuture<'_, Option<Duration>> {
        LedgerFuture::boxed(async move {
            let bytes = sql::key_bytes(key);
            let bytes: &[u8] = &bytes;
            let fence = sql::fence_arg(fence);
            let params: &Params<'_> = &[(&bytes, Type::BYTEA), (&fence, Type::INT8)];
            let rows = self.inner.query(&self.inner.sql.hold, params).await?;
            let Some(row) = rows.first() else { return Ok(None) };
            let left: i64 =
                row.try_get(0).map_err(|e| LedgerError::Corrupt(kept("postgres: a hold: ", e)))?;
            Ok(Some(Duration::from_micros(u64::try_from(left).unwrap_or(0))))
        })
    }

    fn record(&self, key: IdempotencyKey) -> LedgerFuture<'_, Option<RecordView>> {
        LedgerFuture::boxed(async move {
            let bytes = sql::key_bytes(key);
            let bytes: &[u8] = &bytes;
            let rows = self.inner.query(&self.inner.sql.record, &[(&bytes, Type::BYTEA)]).await?;
            let row = rows.first().ok_or_else(|| {
                LedgerError::Corrupt("postgres: reading a record answered no row".into())
            })?;
            let get =
                |e: tokio_postgres::Error| LedgerError::Corrupt(kept("postgres: a record: ", e));
            let Some(state) = row.try_get::<_, Option<String>>(0).map_err(get)? else {
                return Ok(None);
            };
            let view = sql::view(
                key,
                sql::record_state(&state)?,
                row.try_get(1).map_err(get)?,
                row.try_get(2).map_err(get)?,
                row.try_get(3).map_err(get)?,
            )?;
            Ok(Some(view))
        })
    }

    fn in_doubt(&self, limit: usize) -> LedgerFuture<'_, Vec<RecordView>> {
        LedgerFuture::boxed(async move {
            let limit = i32::try_from(limit).unwrap_or(i32::MAX);
            let rows = self.inner.query(&self.inner.sql.in_doubt, &[(&limit, Type::INT4)]).await?;
            let get = |e: tokio_postgres::Error| {
                LedgerError::Corrupt(kept("postgres: a record in doubt: ", e))
            };
            rows.iter()
                .map(|row| {
                    let key = sql::key_of(row.try_get::<_, &[u8]>(0).map_err(get)?)?;
                    sql::view(
                        key,
                        RecordState::InDoubt,
                        row.try_get(1).map_err(get)?,
                        row.try_get(2).map_err(get)?,
                        row.try_get(3).map_err(get)?,
                    )
                })
                .collect()
        })
    }

    fn resolve(
        &self,
        key: IdempotencyKey,
        resolution: Resolution,
    ) -> LedgerFuture<'_, Option<RecordState>> {
        LedgerFuture::boxed(async move {
            let key = sql::key_bytes(key);
            let key: &[u8] = &key;
            let applied = resolution == Resolution::Applied;
            let ttl = sql::micros(self.ttl);
            let params: [(&(dyn ToSql + Sync), Type); 3] =
                [(&key, Type::BYTEA), (&applied, Type::BOOL), (&ttl, Type::INT8)];
            let rows = self.inner.query(&self.inner.sql.resolve, &params).await?;
            first::<Option<String>>(&rows, "a resolution")?
                .map(|state| sql::record_state(&state))
                .transpose()
        })
    }
}
