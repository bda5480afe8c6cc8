//! Transactional tools: a tool whose effect is rows in the ledger's own
//! database runs each attempt in one transaction that also completes its
//! ledger record, so the effect and the record commit together or not at
//! all ([`PostgresLedger::transact`]).
//!
//! Why it is exactly once, for the maintainers. The engine claims nothing
//! for such a tool ([`Tool::commits_record`]): each attempt's transaction
//! opens with the schema's `tx_open`, which takes the key's advisory locks
//! (held until the transaction ends) and then reads the record, and closes
//! with `tx_complete`, which writes the record completed, so the effect and
//! the record commit together or neither does. Nothing is written before:
//! a rolled-back or crashed attempt leaves no claim to wait out. A second
//! call with the key waits for the first's locks, then finds the record
//! completed; the verifier takes the same lock, so what it reads is final
//! (an uncommitted record is invisible; only the lock waits for it). The
//! body's statements follow the opening message without waiting for its
//! answer (they run inside the transaction it began); `COMMIT` goes out
//! only once that answer said the key is free, and in the same message as
//! the completion. A holder paused with its transaction open keeps the locks
//! until the server ends its session (`idle_in_transaction_session_timeout`,
//! the attempt's deadline), which rolls it back.

use std::fmt;
use std::future::Future;
use std::ops::Deref;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context as TaskContext, Poll, Waker};

use serde::Serialize;
use serde::de::DeserializeOwned;
use tokio_postgres::{Client, SimpleQueryMessage, SimpleQueryRow};

mod error;

pub use self::error::{TxError, TxStage};

use super::{PostgresLedger, sql};
use crate::engine::{self, Attempt};
use crate::key::{Payload, PayloadDigest};
use crate::ledger::{ClaimRequest, Codec};
use crate::tool::Tool;
use crate::{Classify, Context, IdempotencyKey, ToolResult, ToolSpec, Verdict};

/// The body of a transactional tool: one attempt's statements, on the
/// transaction the engine opened ([`PostgresLedger::transact`]).
pub type TxFuture<'t, T, E> = Pin<Box<dyn Future<Output = Result<T, E>> + Send + 't>>;

/// The connection of one attempt, inside the transaction that will also
/// complete the call's record. It dereferences to the
/// [`Client`]: run statements on it as on any
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
    /// engine derives the key and writes nothing itself; each attempt is
    /// one transaction:
    ///
    /// 1. `BEGIN`; `statement_timeout` and `idle_in_transaction_session_timeout`
    ///    set to the attempt's deadline; the key's advisory lock taken and
    ///    its record read: one message, which `body`'s first statement
    ///    follows at once. A key completed earlier rolls the attempt back
    ///    and the record's value is read ([`TxError::Completed`]: a repeat
    ///    succeeds with [`Proof::Verifier`](crate::Proof::Verifier), its
    ///    body's statements rolled back); a key recorded with another
    ///    payload fails it ([`TxError::KeyReuse`]);
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
            // With this ledger the engine derives what the claim needs (the
            // previous time bucket's key, too); it writes nothing to it.
            let cx = cx.clone().with_ledger(Arc::new(self.clone()));
            let tool = Transactional { ledger: self, client, spec, body, record: None, wait_ms: 0 };
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
    /// The key the last opening found the call's record under: the call's,
    /// or the previous time bucket's.
    record: Option<IdempotencyKey>,
    /// The last attempt's deadline, in ms: the longest the verifier waits
    /// for a transaction still holding the key's lock.
    wait_ms: u128,
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
        let Some(claim) = attempt.claim else { return Err(TxError::NoClaim) };
        let timeout = attempt.deadline.remaining().as_millis().clamp(1, i32::MAX as u128);
        self.wait_ms = timeout;
        let open = Sql::open(self.ledger, &claim, timeout);
        let mut guard = Open { client: self.client, open: true };
        // The opening goes out now and the body's statements right behind
        // it, in one round trip: they run inside the transaction it begins,
        // and nothing commits before its answer has said the key is this
        // call's (else the whole transaction rolls back).
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
        // The opening's answer is read while the body runs: tokio-postgres
        // holds back every later answer on the connection (the body's) until
        // an earlier one is read, and the opening's can come in parts (before
        // and after it waits for the key's lock). Awaited only after the
        // body, it hung the call holding the key's lock.
        let mut opened = early;
        let mut body = std::pin::pin!((self.body)(&tx));
        let body = std::future::poll_fn(|cx| {
            if opened.is_none()
                && let Poll::Ready(answer) = opening.as_mut().poll(cx)
            {
                opened = Some(answer);
            }
            body.as_mut().poll(cx)
        })
        .await;
        let opened = match opened {
            Some(answer) => answer,
            None => opening.await,
        };
        let opened = match opened {
            Ok(messages) => Opened::of(&messages, &claim),
            Err(source) => {
                // The body's failure, if any, is this one's consequence.
                guard.rollback().await;
                let error = TxError::Postgres { stage: TxStage::Open, source };
                return Err(self.closed(TxStage::Open, error));
            }
        };
        let (key, fingerprint) = match opened {
            Opened::Free { key, fingerprint } => (key, fingerprint),
            other => {
                if let Opened::Completed { key } = other {
                    self.record = Some(key);
                }
                guard.rollback().await;
                return Err(other.error());
            }
        };
        self.record = Some(key);
        let value = match body {
            Ok(value) => value,
            Err(error) => {
                guard.rollback().await;
                return Err(self.closed(TxStage::Body, TxError::Body(error)));
            }
        };
        let encoded = Codec::<T>::serde().encode(&value).unwrap_or_default();
        let commit = Sql::commit(self.ledger, key, fingerprint, attempt.number, &encoded);
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
        read(self.ledger, self.record.unwrap_or(key), self.wait_ms).await
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

/// The record, once no transaction that may commit holds it (the key's
/// advisory lock taken, and let go, first): completed (the effect committed
/// with it), or not there (no attempt committed, and none can now: each
/// takes the lock before it reads the record).
async fn read<T: Serialize + DeserializeOwned>(
    ledger: &PostgresLedger,
    key: IdempotencyKey,
    wait_ms: u128,
) -> Verdict<T> {
    // One implicit transaction (no `BEGIN`: an error, or an answer never
    // awaited, leaves the shared connection outside any transaction). Its
    // reads see what committed before each began, whatever the
    // connection's default isolation.
    let statement = format!(
        "SET TRANSACTION ISOLATION LEVEL READ COMMITTED; SET LOCAL lock_timeout = {}; \
         SELECT pg_advisory_xact_lock({}); \
         SELECT state, encode(value, 'hex') FROM {} WHERE key = {}",
        wait_ms.max(1),
        lock_id(key),
        Sql::records(ledger),
        key_literal(key),
    );
    let Some(messages) = ask(ledger, &statement, wait_ms).await else {
        return Verdict::Unknown;
    };
    let Some(row) = rows(&messages).last() else {
        return Verdict::Absent;
    };
    if row.get(0) != Some("completed") {
        // Held by a call outside any transaction, or in doubt: not this
        // tool's effect, which commits only as completed.
        return Verdict::Absent;
    }
    match row.get(1).and_then(unhex).and_then(|bytes| Codec::<T>::serde().decode(&bytes)) {
        Some(value) => Verdict::Holds(value),
        None => Verdict::Unknown,
    }
}

/// `statement`'s answer on one of the ledger's connections, waited for as
/// long as the lock it may wait for, and the ledger's timeout beside.
async fn ask(
    ledger: &PostgresLedger,
    statement: &str,
    wait_ms: u128,
) -> Option<Vec<SimpleQueryMessage>> {
    let inner = &ledger.inner;
    let started = tokio::time::Instant::now();
    let lent = inner.lend_by(started).await.ok()?;
    let wait = std::time::Duration::from_millis(u64::try_from(wait_ms).unwrap_or(u64::MAX));
    let answer = lent.client().simple_query(statement);
    match tokio::time::timeout_at(started + inner.timeout.saturating_add(wait), answer).await {
        Ok(Ok(messages)) => Some(messages),
        Ok(Err(_)) | Err(_) => {
            // Its connection may be broken, or still busy with this: the
            // next operation connects anew (the ledger's own only).
            inner.discard(lent.shared());
            None
        }
    }
}

/// The rows of a simple query's answer.
fn rows(messages: &[SimpleQueryMessage]) -> impl Iterator<Item = &SimpleQueryRow> {
    messages.iter().filter_map(|message| match message {
        SimpleQueryMessage::Row(row) => Some(row),
        _ => None,
    })
}

/// What the opening found, inside the attempt's transaction.
#[derive(Debug, PartialEq, Eq)]
enum Opened {
    /// The key is free for this attempt: its record, once it commits, is
    /// under `key` (the call's, or the previous time bucket's).
    Free { key: IdempotencyKey, fingerprint: PayloadDigest },
    /// A call with the key completed.
    Completed { key: IdempotencyKey },
    /// Another call holds it: one outside any transaction, live.
    InFlight,
    /// The key is recorded with another payload.
    KeyReuse,
    /// An answer the opening does not give.
    Unexpected,
}

impl Opened {
    /// The opening's row: the last of its answer (kind, which key).
    fn of(messages: &[SimpleQueryMessage], claim: &ClaimRequest) -> Self {
        let Some(row) = rows(messages).last() else { return Opened::Unexpected };
        let int = |i: usize| row.get(i).and_then(|text| text.parse::<i64>().ok());
        let (key, fingerprint) = match (int(1), claim.previous) {
            (Some(1), Some(previous)) => previous,
            _ => (claim.key, claim.fingerprint),
        };
        match int(0) {
            Some(1) => Opened::Free { key, fingerprint },
            Some(3) => Opened::Completed { key },
            Some(4) => Opened::InFlight,
            Some(5) => Opened::KeyReuse,
            _ => Opened::Unexpected,
        }
    }

    /// The attempt's error, when the key is not free for it.
    fn error<E>(self) -> TxError<E> {
        match self {
            Opened::Completed { .. } => TxError::Completed,
            Opened::InFlight => TxError::InFlight,
            Opened::KeyReuse => TxError::KeyReuse,
            Opened::Free { .. } | Opened::Unexpected => TxError::NoClaim,
        }
    }
}

/// The messages of one attempt, literals inlined: each is one simple-query
/// message (which carries no parameters), and every value in them is a
/// number or hex the ledger wrote. The work is in the schema's functions,
/// whose plans each session keeps.
struct Sql;

impl Sql {
    fn records(ledger: &PostgresLedger) -> String {
        let (schema, prefix) = (&ledger.inner.schema, &ledger.inner.prefix);
        format!("\"{schema}\".\"{prefix}records\"")
    }

    /// `BEGIN`, the attempt's deadline as the server's timeouts (before the
    /// locks, which they bound), and the opening: its row is the answer's
    /// last.
    fn open(ledger: &PostgresLedger, claim: &ClaimRequest, timeout_ms: u128) -> String {
        let (schema, prefix) = (&ledger.inner.schema, &ledger.inner.prefix);
        let (previous, previous_lock) = match claim.previous {
            Some((key, digest)) => (
                format!("{}, {}", key_literal(key), digest_literal(digest)),
                lock_id(key).to_string(),
            ),
            None => ("NULL, NULL".to_owned(), "NULL".to_owned()),
        };
        format!(
            "BEGIN; SET LOCAL statement_timeout = {timeout_ms}; \
             SET LOCAL idle_in_transaction_session_timeout = {timeout_ms}; \
             SELECT o_kind, o_which FROM \"{schema}\".\"{prefix}tx_open\"\
             ({}, {}, {previous}, {}, {previous_lock})",
            key_literal(claim.key),
            digest_literal(claim.fingerprint),
            lock_id(claim.key),
        )
    }

    /// The record completed with `value`, then `COMMIT`. The completion
    /// fails the transaction when the record was completed meanwhile (a
    /// guard: the locks prevent it), and the rest of the message, `COMMIT`
    /// with it, is skipped.
    fn commit(
        ledger: &PostgresLedger,
        key: IdempotencyKey,
        fingerprint: PayloadDigest,
        attempts: u32,
        value: &[u8],
    ) -> String {
        let (schema, prefix) = (&ledger.inner.schema, &ledger.inner.prefix);
        format!(
            "SELECT \"{schema}\".\"{prefix}tx_complete\"({}, {}, {attempts}, \
             decode('{}', 'hex'), {}); COMMIT",
            key_literal(key),
            digest_literal(fingerprint),
            hex(value),
            sql::micros(ledger.ttl),
        )
    }
}

fn digest_literal(digest: PayloadDigest) -> String {
    format!("decode('{}', 'hex')", hex(&digest.as_u128().to_be_bytes()))
}

/// The key as a `bytea` literal.
fn key_literal(key: IdempotencyKey) -> String {
    format!("decode('{}', 'hex')", hex(&sql::key_bytes(key)))
}

/// The key's advisory lock: its first 8 bytes. Another key sharing them
/// (one chance in 2^64) only waits for it.
fn lock_id(key: IdempotencyKey) -> i64 {
    let bytes = sql::key_bytes(key);
    i64::from_be_bytes([
        bytes[0], bytes[1], bytes[2], bytes[3], bytes[4], bytes[5], bytes[6], bytes[7],
    ])
}

fn unhex(text: &str) -> Option<Vec<u8>> {
    if !text.len().is_multiple_of(2) {
        return None;
    }
    (0..text.len()).step_by(2).map(|i| u8::from_str_radix(text.get(i..i + 2)?, 16).ok()).collect()
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
        assert_eq!(unhex("000fa5ff"), Some(vec![0x00, 0x0f, 0xa5, 0xff]));
        assert_eq!(unhex("0g"), None);
        assert_eq!(unhex("abc"), None);
    }
}
