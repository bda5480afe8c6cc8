//! How one operation runs: a connection lent within the timeout, one
//! statement bounded by it, the schema checked when the ledger opens, and
//! a claim sent from its own task, whose hold is abandoned if the caller
//! stops waiting. Apart from the handle, which says which statement to run
//! and reads its answer.

use std::sync::Arc;
use std::sync::atomic::AtomicU32;
use std::time::Duration;

use tokio::runtime::Handle;
use tokio::sync::oneshot;
use tokio::time::Instant;
use tokio_postgres::error::SqlState;
use tokio_postgres::types::{ToSql, Type};
use tokio_postgres::{Client, Row};

use super::connection::{Lent, Source};
use super::failure::{Failure, broken, first, no_answer};
use super::sql::{self, SCHEMA_VERSION, Statements};
use crate::IdempotencyKey;
use crate::ledger::{Claim, ClaimRequest, Claimed, Fence, LedgerError};

pub(super) type Params<'a> = [(&'a (dyn ToSql + Sync), Type)];

pub(super) struct Inner {
    pub(super) source: Source,
    pub(super) timeout: Duration,
    pub(super) sql: Statements,
    pub(super) schema: String,
    pub(super) prefix: String,
    /// Finishes of this handle, to purge expired records every so often.
    pub(super) finishes: AtomicU32,
}

impl Inner {
    async fn lend(&self) -> Result<Lent, Failure> {
        match &self.source {
            Source::Own(own) => own.client().await.map(Lent::Shared),
            Source::Given(client) if client.is_closed() => {
                Err(Failure::Ledger(LedgerError::Unavailable(
                    "postgres: the connection of the client the ledger was given is closed".into(),
                )))
            }
            Source::Given(client) => Ok(Lent::Shared(Arc::clone(client))),
            Source::Pool(pool) => pool.get().await.map_err(|e| {
                Failure::Ledger(LedgerError::Unavailable(
                    format!("postgres: the pool lent no connection: {e}").into(),
                ))
            }),
        }
    }

    /// The next operation connects anew (the ledger's own connection only:
    /// a client or pool of the application is theirs to replace).
    pub(super) fn discard(&self, connection: Option<&Arc<Client>>) {
        if let (Source::Own(own), Some(client)) = (&self.source, connection) {
            own.discard(client);
        }
    }

    /// A connection for an operation that started at `started`.
    pub(super) async fn lend_by(&self, started: Instant) -> Result<Lent, Failure> {
        match tokio::time::timeout_at(started + self.timeout, self.lend()).await {
            Ok(lent) => lent,
            Err(_) => Err(Failure::Ledger(no_answer(self.timeout))),
        }
    }

    /// Runs one statement.
    async fn run(
        &self,
        patience: Duration,
        statement: &str,
        params: &Params<'_>,
    ) -> Result<Vec<Row>, Failure> {
        let started = Instant::now();
        let lent = self.lend_by(started).await?;
        self.run_on(lent.client(), lent.shared(), started, patience, statement, params).await
    }

    /// Runs one statement on `client` (the ledger's own `connection`, if it
    /// is that), for an operation that started at `started`. Past the
    /// timeout the connection is given up for the next operations, and the
    /// statement's answer is waited for until `patience` (at least the
    /// timeout) has passed.
    async fn run_on(
        &self,
        client: &Client,
        connection: Option<&Arc<Client>>,
        started: Instant,
        patience: Duration,
        statement: &str,
        params: &Params<'_>,
    ) -> Result<Vec<Row>, Failure> {
        let (soon, late) = (started + self.timeout, started + patience.max(self.timeout));
        let mut query = std::pin::pin!(client.query_typed(statement, params));
        let answer = match tokio::time::timeout_at(soon, &mut query).await {
            Ok(answer) => answer,
            Err(_) => {
                // A server that hangs, or a network that dropped the
                // connection without a word: the next operation connects
                // anew rather than queue behind this one.
                self.discard(connection);
                match tokio::time::timeout_at(late, &mut query).await {
                    Ok(answer) => answer,
                    Err(_) => return Err(Failure::Ledger(no_answer(late - started))),
                }
            }
        };
        answer.map_err(|error| {
            if broken(&error) || client.is_closed() {
                self.discard(connection);
            }
            Failure::Pg(error)
        })
    }

    pub(super) async fn query(
        &self,
        statement: &str,
        params: &Params<'_>,
    ) -> Result<Vec<Row>, LedgerError> {
        self.run(self.timeout, statement, params).await.map_err(Failure::into_ledger)
    }

    /// Checks the schema's version, creating the schema first if it is
    /// missing and that is allowed.
    pub(super) async fn ensure_schema(&self, create: bool) -> Result<(), LedgerError> {
        let missing = |failure: &Failure| {
            failure.is(&SqlState::UNDEFINED_FUNCTION) || failure.is(&SqlState::INVALID_SCHEMA_NAME)
        };
        // `None`: the functions are there, their table or sequence is not.
        let incomplete = match self.schema_version().await {
            // An older version is upgraded in place (the script is
            // idempotent, and only adds), when the ledger may create it.
            Ok(Some(version)) if version < SCHEMA_VERSION && create => true,
            Ok(Some(version)) => return self.known(version),
            Ok(None) => true,
            Err(failure) if missing(&failure) => false,
            Err(failure) => return Err(failure.into_ledger()),
        };
        if !create {
            let what = if incomplete { "an incomplete" } else { "no" };
            return Err(LedgerError::Unavailable(
                format!(
                    "postgres: {what} ledger schema in \"{}\" with the prefix \"{}\": create it \
                 (PostgresLedgerBuilder::schema_sql) or let the ledger create it",
                    self.schema, self.prefix
                )
                .into(),
            ));
        }
        let ddl = sql::schema_sql(&self.schema, &self.prefix);
        // Creating waits for the advisory lock of another process creating
        // it: longer than one operation.
        let patience = self.timeout.max(Duration::from_secs(30));
        let created = async {
            let lent = self.lend().await?;
            // One simple-query message: one implicit transaction, rolled
            // back whole if any statement fails.
            let created = lent.client().batch_execute(&ddl).await.map_err(Failure::Pg);
            if created.is_err() {
                self.discard(lent.shared());
            }
            created
        };
        match tokio::time::timeout(patience, created).await {
            Ok(created) => created.map_err(Failure::into_ledger)?,
            Err(_) => return Err(no_answer(patience)),
        }
        match self.schema_version().await.map_err(Failure::into_ledger)? {
            Some(version) => self.known(version),
            None => Err(LedgerError::Unavailable(
                format!(
                    "postgres: the ledger schema in \"{}\" with the prefix \"{}\" is still \
                 incomplete after creating it",
                    self.schema, self.prefix
                )
                .into(),
            )),
        }
    }

    async fn schema_version(&self) -> Result<Option<i32>, Failure> {
        let rows = self.run(self.timeout, &self.sql.version, &[]).await?;
        first(&rows, "vt_schema_version()").map_err(Failure::Ledger)
    }

    fn known(&self, version: i32) -> Result<(), LedgerError> {
        if version == SCHEMA_VERSION {
            return Ok(());
        }
        let upgrade = match version < SCHEMA_VERSION {
            true => ": run PostgresLedgerBuilder::schema_sql again (it upgrades in place)",
            false => "",
        };
        Err(LedgerError::Unavailable(format!(
            "postgres: the ledger schema in \"{}\" with the prefix \"{}\" is version {version}; \
             this build knows version {SCHEMA_VERSION}{upgrade}",
            self.schema, self.prefix
        ).into()))
    }

    pub(super) async fn claim(
        &self,
        lent: Lent,
        started: Instant,
        request: ClaimRequest,
        lease: Duration,
    ) -> Result<Claim, LedgerError> {
        let key = sql::key_bytes(request.key);
        let fingerprint = request.fingerprint.as_u128().to_be_bytes();
        let previous = request
            .previous
            .map(|(key, fingerprint)| (sql::key_bytes(key), fingerprint.as_u128().to_be_bytes()));
        let (key, fingerprint): (&[u8], &[u8]) = (&key, &fingerprint);
        let previous_key: Option<&[u8]> = previous.as_ref().map(|(key, _)| &key[..]);
        let previous_fingerprint: Option<&[u8]> = previous.as_ref().map(|(_, fp)| &fp[..]);
        let progress = request.first;
        let (lease_us, attempts) = (sql::micros(lease), i64::from(progress.attempts));
        let settle = crate::ledger::store_time::settle_micros(progress.settle);
        let params: [(&(dyn ToSql + Sync), Type); 8] = [
            (&key, Type::BYTEA),
            (&fingerprint, Type::BYTEA),
            (&previous_key, Type::BYTEA),
            (&previous_fingerprint, Type::BYTEA),
            (&lease_us, Type::INT8),
            (&attempts, Type::INT8),
            (&progress.after_ok, Type::BOOL),
            (&settle, Type::INT8),
        ];
        let statement = &self.sql.claim;
        // A claim that lands after its lease holds nothing any more: no
        // need to wait for it longer.
        let rows = self
            .run_on(lent.client(), lent.shared(), started, lease, statement, &params)
            .await
            .map_err(Failure::into_ledger)?;
        let row = rows
            .first()
            .ok_or_else(|| LedgerError::Corrupt("postgres: a claim answered no row".into()))?;
        sql::claimed(sql::ClaimRow::read(row)?, &request)
    }

    /// A holder's write: `Ok` when it landed, [`LedgerError::Fenced`] when
    /// the fence no longer holds the key.
    pub(super) async fn fenced(
        &self,
        statement: &str,
        params: &Params<'_>,
        fence: Fence,
    ) -> Result<(), LedgerError> {
        let rows = self.query(statement, params).await?;
        match first::<bool>(&rows, "a fenced write")? {
            true => Ok(()),
            false => Err(LedgerError::Fenced(fence)),
        }
    }

    pub(super) async fn abandon(
        &self,
        key: IdempotencyKey,
        fence: Fence,
    ) -> Result<(), LedgerError> {
        let key = sql::key_bytes(key);
        let (key, fence_value): (&[u8], i64) = (&key, sql::fence_arg(fence));
        let params: [(&(dyn ToSql + Sync), Type); 2] =
            [(&key, Type::BYTEA), (&fence_value, Type::INT8)];
        // Not held by this fence any more: nothing to end.
        match self.fenced(&self.sql.abandon, &params, fence).await {
            Ok(()) | Err(LedgerError::Fenced(_)) => Ok(()),
            Err(error) => Err(error),
        }
    }
}

/// Abandons a hold without blocking: on the current runtime, or not at all
/// (the lease ends the hold).
pub(super) fn abandon_later(inner: &Arc<Inner>, key: IdempotencyKey, fence: Fence) {
    let Ok(runtime) = Handle::try_current() else { return };
    let inner = Arc::clone(inner);
    runtime.spawn(async move {
        let _ = inner.abandon(key, fence).await;
    });
}

pub(super) fn held(claim: &Claim) -> Option<Fence> {
    match claim.state {
        Claimed::Fresh(fence) | Claimed::Resume(fence, _) => Some(fence),
        _ => None,
    }
}

/// The caller's end of a claim sent from its own task. Dropped before the
/// answer was taken (the caller gave up), it abandons the hold the answer
/// brings, whether it came already or comes later.
pub(super) struct Answer {
    pub(super) answer: Option<oneshot::Receiver<Result<Claim, LedgerError>>>,
    pub(super) inner: Arc<Inner>,
}

impl Drop for Answer {
    fn drop(&mut self) {
        let Some(mut answer) = self.answer.take() else { return };
        // From now on the task sees the caller gone, and abandons itself.
        answer.close();
        if let Ok(Ok(claim)) = answer.try_recv()
            && let Some(fence) = held(&claim)
        {
            abandon_later(&self.inner, claim.key, fence);
        }
    }
}
