//! Transactional tools: a tool whose effect is rows in the ledger's own
//! database runs each attempt in one transaction that also completes its
//! ledger record, so the effect and the record commit together or not at
//! all ([`PostgresLedger::transact`]).
//!
//! Why it is exactly once, for the maintainers. The transaction's first
//! statement locks the call's record row, and only while this call still
//! holds the key under its fence and attempt number; its last marks the
//! record completed. The body's statements follow the opening message
//! without waiting for its answer (they run inside the transaction it
//! began); `COMMIT` goes out only once that answer said "held", and in the
//! same message as the completion, so a transaction that may still commit
//! always holds the row lock. The verifier reads the record with
//! `FOR SHARE`, which waits for such a transaction: what it reads is final.
//! A holder paused past its lease cannot commit either: the call that takes
//! the key over changes the fence (waiting for the lock, which the server
//! frees once the paused session has idled past its attempt's deadline),
//! and the paused transaction's completion then matches no row.

use std::fmt;
use std::future::Future;
use std::ops::Deref;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context as TaskContext, Poll, Waker};

use serde::Serialize;
use serde::de::DeserializeOwned;
use tokio_postgres::types::Type;
use tokio_postgres::{Client, SimpleQueryMessage};

mod error;

pub use self::error::{TxError, TxStage};

use super::{PostgresLedger, first, sql};
use crate::engine::{self, Attempt};
use crate::key::Payload;
use crate::ledger::{Codec, Fence};
use crate::tool::Tool;
use crate::{Classify, Context, IdempotencyKey, ToolResult, ToolSpec, Verdict};

/// The body of a transactional tool: one attempt's statements, on the
/// transaction the engine opened ([`PostgresLedger::transact`]).
pub type TxFuture<'t, T, E> = Pin<Box<dyn Future<Output = Result<T, E>> + Send + 't>>;

/// The connection of one attempt, inside the transaction that will also
/// complete the call's record. It dereferences to the
/// [`Client`](tokio_postgres::Client): run statements on it as on any
/// client (`&*tx` where a [`GenericClient`](tokio_postgres::GenericClient)
/// is wanted).
///
/// Do not `COMMIT` or `ROLLBACK` on it: the engine ends the transaction.
/// Touch only this database in the body: what it does elsewhere (a mail, an
/// HTTP call) is not rolled back with it, and is not verified; make that a
/// tool of its own, called after this one succeeded.
pub struct Tx<'c> {
    client: &'c Client,
    key: IdempotencyKey,
    attempt: u32,
}

impl Tx<'_> {
    /// The call's idempotency key (the same on every attempt).
    pub fn key(&self) -> IdempotencyKey {
        self.key
    }

    /// 1 for the call's first attempt.
    pub fn attempt(&self) -> u32 {
        self.attempt
    }
}

impl Deref for Tx<'_> {
    type Target = Client;

    fn deref(&self) -> &Client {
        self.client
    }
}

impl fmt::Debug for Tx<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Tx").field("key", &self.key).field("attempt", &self.attempt).finish()
    }
}

impl PostgresLedger {
    /// Runs one logical call of a transactional tool: `body` writes the
    /// effect on `client` (a connection to this ledger's database, for this
    /// call alone: a plain client, or a pool's connection, which
    /// dereferences to one: `&mut conn`), and each attempt
    /// is one transaction that also completes the call's record. The effect
    /// and the record commit together: a duplicate is impossible, even for a
    /// holder paused past its lease, and a lost `COMMIT` answer is settled
    /// by reading the record (no verifier to write).
    ///
    /// The call runs through the engine with this ledger, whatever the
    /// context's is: the record must live in the effect's database. The
    /// engine claims the key first (a repeat replays the recorded value);
    /// then, per attempt:
    ///
    /// 1. `BEGIN`; `statement_timeout` and `idle_in_transaction_session_timeout`
    ///    set to the attempt's deadline; the record's row locked, if this
    ///    call still holds the key (else [`TxError::NotHeld`], rolled back):
    ///    one message, which `body`'s first statement follows at once;
    /// 2. `body` (its error rolls the transaction back: [`TxError::Body`],
    ///    retried within the budget when its class says the attempt may
    ///    succeed again: serialization failures and deadlocks, lost answers);
    /// 3. the record completed with the value, and `COMMIT`, in one message.
    ///
    /// `client` must be outside any transaction: the call's `COMMIT` would
    /// commit one the caller had begun.
    ///
    /// The value is recorded as JSON, for replays. `payload` is what the key
    /// is derived from, `audit_args` what the audit shows, as for
    /// [`engine::call`].
    ///
    /// ```no_run
    /// use verified_tools::ledger::{PostgresLedger, TxError};
    /// use verified_tools::{Context, SideEffect, ToolResult, ToolSpec};
    ///
    /// static PAY: ToolSpec = ToolSpec::new("pay", SideEffect::High);
    ///
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let url = "postgres://app@localhost/shop";
    /// let ledger = PostgresLedger::connect(url).await?;
    /// let (mut client, connection) = tokio_postgres::connect(url, tokio_postgres::NoTls).await?;
    /// tokio::spawn(connection);
    /// let cx = Context::new("billing");
    /// let (order, cents) = (42_i64, 1250_i32);
    /// let paid: ToolResult<i64, TxError<tokio_postgres::Error>> = ledger
    ///     .transact(&cx, &PAY, &mut client, &(order, cents), &(order, cents), |tx| {
    ///         Box::pin(async move {
    ///             let row = tx
    ///                 .query_one(
    ///                     "INSERT INTO payments (order_id, cents) VALUES ($1, $2) RETURNING id",
    ///                     &[&order, &cents],
    ///                 )
    ///                 .await?;
    ///             Ok(row.get(0))
    ///         })
    ///     })
    ///     .await;
    /// # let _ = paid;
    /// # Ok(()) }
    /// ```
    pub fn transact<'a, 'c, T, E, P, A, F>(
        &'a self,
        cx: &'a Context,
        spec: &'static ToolSpec,
        client: &'c mut Client,
        payload: &'a P,
        audit_args: &'a A,
        body: F,
    ) -> Pin<Box<dyn Future<Output = ToolResult<T, TxError<E>>> + Send + 'a>>
    where
        'c: 'a,
        T: Serialize + DeserializeOwned + Clone + Send + Sync + 'static,
        E: Classify + Send + 'a,
        P: Payload + Sync + ?Sized,
        A: Serialize + Sync + ?Sized,
        // `Tx<'c>`, not `Tx<'t>`: the body may borrow what outlives the call.
        F: for<'t> FnMut(&'t Tx<'c>) -> TxFuture<'t, T, E> + Send + 'a,
    {
        // Boxed, and so checked `Send` here, once: callers that spawn the
        // call would otherwise meet rustc's "`Send` is not general enough"
        // on the body's higher-ranked lifetime.
        let body: Box<Body<'a, 'c, T, E>> = Box::new(body);
        Box::pin(async move {
            // Its claims need not wait for the WAL flush: a claim lost in a
            // crash of the server held a key for a call that had committed
            // nothing (the call's commit, durable, would have flushed the
            // claim before it), and the key is simply free again.
            let ledger = PostgresLedger { unflushed_claims: true, ..self.clone() };
            let cx = cx.clone().with_ledger(Arc::new(ledger));
            let tool = Transactional { ledger: self, client, spec, body };
            engine::run(&cx, tool, payload, audit_args).await
        })
    }
}

/// A body, as a trait object: its higher-ranked lifetime stays inside the
/// type, out of the `Tool` impl's bounds (which rustc cannot prove `Send`
/// for every lifetime of an async block).
type Body<'a, 'c, T, E> = dyn for<'t> FnMut(&'t Tx<'c>) -> TxFuture<'t, T, E> + Send + 'a;

/// The [`Tool`] one transactional call is.
struct Transactional<'l, 'a, 'c, T, E> {
    ledger: &'l PostgresLedger,
    client: &'c Client,
    spec: &'static ToolSpec,
    body: Box<Body<'a, 'c, T, E>>,
}

impl<T, E> Tool for Transactional<'_, '_, '_, T, E>
where
    T: Serialize + DeserializeOwned + Clone + Send + Sync + 'static,
    E: Classify,
{
    type Output = T;
    type Error = TxError<E>;

    fn spec(&self) -> &'static ToolSpec {
        self.spec
    }

    async fn dispatch(&mut self, attempt: Attempt) -> Result<T, TxError<E>> {
        let Some(fence) = attempt.holder.fence() else { return Err(TxError::NoHold) };
        let sql = Sql::of(self.ledger, attempt.key, fence, attempt.number);
        let timeout = attempt.deadline.remaining().as_millis().clamp(1, i32::MAX as u128);
        let open = sql.open(timeout);
        let mut guard = Open { client: self.client, open: true };
        // The opening goes out now and the body's statements right behind
        // it, in one round trip: they run inside the transaction it begins,
        // and nothing commits before its answer has said this call holds
        // the key (else the whole transaction rolls back).
        let mut opening = std::pin::pin!(self.client.simple_query(&open));
        let early = match opening.as_mut().poll(&mut TaskContext::from_waker(Waker::noop())) {
            Poll::Ready(Err(source)) => {
                // Refused before it left: no transaction to end.
                guard.open = false;
                let error = TxError::Postgres { stage: TxStage::Open, source };
                return Err(self.closed(TxStage::Open, error));
            }
            Poll::Ready(answer) => Some(answer),
            Poll::Pending => None,
        };
        let tx = Tx { client: self.client, key: attempt.key, attempt: attempt.number };
        let body = (self.body)(&tx).await;
        let opened = match early {
            Some(answer) => answer,
            None => opening.await,
        };
        let held = match opened {
            Ok(messages) => messages.iter().any(|m| matches!(m, SimpleQueryMessage::Row(_))),
            Err(source) => {
                // The body's failure, if any, is this one's consequence.
                guard.rollback().await;
                let error = TxError::Postgres { stage: TxStage::Open, source };
                return Err(self.closed(TxStage::Open, error));
            }
        };
        if !held {
            guard.rollback().await;
            return Err(TxError::NotHeld);
        }
        let value = match body {
            Ok(value) => value,
            Err(error) => {
                guard.rollback().await;
                return Err(self.closed(TxStage::Body, TxError::Body(error)));
            }
        };
        let encoded = Codec::<T>::serde().encode(&value).unwrap_or_default();
        let commit = sql.commit(&encoded, self.ledger.ttl);
        match self.client.batch_execute(&commit).await {
            Ok(()) => {
                guard.open = false;
                Ok(value)
            }
            Err(source) => {
                if source.as_db_error().is_some() {
                    guard.rollback().await;
                }
                Err(TxError::Postgres { stage: TxStage::Commit, source })
            }
        }
    }

    fn verifies(&self) -> bool {
        true
    }

    async fn verify(&mut self, key: IdempotencyKey) -> Verdict<T> {
        read(self.ledger, key).await
    }

    fn codec(&self) -> Codec<T> {
        Codec::serde()
    }

    fn commits_record(&self) -> bool {
        true
    }
}

impl<T, E> Transactional<'_, '_, '_, T, E> {
    /// `error`, or [`TxError::Closed`] when the client's connection is
    /// gone: retrying on it would only fail again.
    fn closed(&self, stage: TxStage, error: TxError<E>) -> TxError<E>
    where
        E: Classify,
    {
        match self.client.is_closed() {
            true => TxError::Closed { stage, error: error.describe() },
            false => error,
        }
    }
}

/// The record, once no transaction that may commit holds it: completed
/// (the effect committed with it), or not (it did not, and cannot now).
async fn read<T: Serialize + DeserializeOwned>(
    ledger: &PostgresLedger,
    key: IdempotencyKey,
) -> Verdict<T> {
    let statement = format!(
        "SELECT state = 'completed', value FROM {} WHERE key = $1 FOR SHARE",
        Sql::records(ledger)
    );
    let key = sql::key_bytes(key);
    let key: &[u8] = &key;
    let rows = match ledger.inner.query(&statement, &[(&key, Type::BYTEA)]).await {
        Ok(rows) => rows,
        Err(_) => return Verdict::Unknown,
    };
    let Ok(completed) = first::<bool>(&rows, "the record") else {
        // No record: it expired, or was never there. Not proof of anything.
        return Verdict::Unknown;
    };
    if !completed {
        return Verdict::Absent;
    }
    let value: Option<Vec<u8>> = rows[0].try_get(1).ok().flatten();
    match value.and_then(|bytes| Codec::<T>::serde().decode(&bytes)) {
        Some(value) => Verdict::Holds(value),
        None => Verdict::Unknown,
    }
}

/// The statements of one attempt, literals inlined: each is one
/// simple-query message (which carries no parameters), and every value in
/// them is a number or hex the ledger wrote.
struct Sql {
    /// The ledger's table, quoted.
    records: String,
    /// The record's row, as long as this attempt holds it.
    row: String,
}

impl Sql {
    fn of(ledger: &PostgresLedger, key: IdempotencyKey, fence: Fence, number: u32) -> Self {
        let records = Self::records(ledger);
        let row = format!(
            "key = decode('{}', 'hex') AND fence = {} AND attempts = {number} AND state = 'held'",
            hex(&sql::key_bytes(key)),
            sql::fence_arg(fence),
        );
        Self { records, row }
    }

    fn records(ledger: &PostgresLedger) -> String {
        let (schema, prefix) = (&ledger.inner.schema, &ledger.inner.prefix);
        format!("\"{schema}\".\"{prefix}records\"")
    }

    /// `BEGIN`, the attempt's deadline as the server's timeouts, and the
    /// record's row locked (one row when this attempt holds it, none else).
    fn open(&self, timeout_ms: u128) -> String {
        format!(
            "BEGIN; SET LOCAL statement_timeout = {timeout_ms}; \
             SET LOCAL idle_in_transaction_session_timeout = {timeout_ms}; \
             SELECT 1 FROM {} WHERE {} FOR UPDATE",
            self.records, self.row
        )
    }

    /// The record completed with `value`, then `COMMIT`. When the row is
    /// not this attempt's any more (it cannot be while the lock holds: a
    /// guard, not a path) the division fails the transaction, the rest of
    /// the message is skipped, and no `COMMIT` runs.
    fn commit(&self, value: &[u8], ttl: std::time::Duration) -> String {
        format!(
            "WITH done AS (UPDATE {} SET state = 'completed', value = decode('{}', 'hex'), \
             lease_end = NULL, expires_at = clock_timestamp() + {} * interval '1 microsecond' \
             WHERE {} RETURNING 1) SELECT 1 / count(*)::int FROM done; COMMIT",
            self.records,
            hex(value),
            sql::micros(ttl),
            self.row
        )
    }
}

fn hex(bytes: &[u8]) -> String {
    use std::fmt::Write as _;
    let mut out = String::with_capacity(bytes.len() * 2);
    for byte in bytes {
        let _ = write!(out, "{byte:02x}");
    }
    out
}

/// An open transaction on the caller's client. Dropped open (the attempt's
/// deadline struck, or the call was cancelled), it queues a `ROLLBACK`
/// behind whatever the connection is still sending, so the connection goes
/// back to its owner outside any transaction.
struct Open<'c> {
    client: &'c Client,
    open: bool,
}

impl Open<'_> {
    async fn rollback(&mut self) {
        self.open = false;
        // A connection that cannot take it is closed: the server rolls back.
        let _ = self.client.batch_execute("ROLLBACK").await;
    }
}

impl Drop for Open<'_> {
    fn drop(&mut self) {
        if self.open {
            // tokio-postgres queues a request on its first poll; the answer
            // is not awaited.
            let mut rollback = std::pin::pin!(self.client.batch_execute("ROLLBACK"));
            let _ = rollback.as_mut().poll(&mut TaskContext::from_waker(Waker::noop()));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_are_sent_as_hex() {
        assert_eq!(hex(&[0x00, 0x0f, 0xa5, 0xff]), "000fa5ff");
    }
}
