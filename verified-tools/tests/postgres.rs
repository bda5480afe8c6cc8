//! The engine against a real PostgreSQL (issue 9): the late-arrival cases
//! that `tests/timing.rs` models under paused time
//! (`case1_*`), made real, with tools written as a user writes them: a
//! `#[verified_tool]` async fn on tokio-postgres and a read-only verifier
//! that runs a `SELECT`.
//!
//! The fault is PostgreSQL's own. A dropped tokio-postgres future cancels
//! nothing on the server: the statement runs on and commits after the
//! engine gave the attempt up, and until that commit the row is invisible
//! to every other session, the verifier's included. So a verifier read
//! between the attempt's deadline and the commit says `Absent`, truthfully
//! and too early. The payments table has no unique constraint on the
//! payment (a server that ignores keys): whatever the engine sends twice is
//! booked twice, and the tests count rows.
//!
//! The server is `VT_POSTGRES_URL` (`.ci/postgres.sh` starts one); without
//! it each test says so in one line and passes, under `CI=true` it fails.

use test_support as support;

use std::collections::HashMap;
use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::{Semaphore, SemaphorePermit};
use tokio::task::JoinHandle;
use tokio_postgres::{Client, NoTls};
use verified_tools::escalation::MemoryEscalations;
use verified_tools::{
    Cause, Classify, Context, Deadline, ErrorClass, Proof, RetryPolicy, SideEffect, ToolResult,
    UnknownReason, Verdict, verified_tool,
};

/// Payments booked at once in the slow-commit tests: each attempt holds a
/// connection of its own for as long as its statement runs.
const AT_ONCE: i64 = 10;
const CENTS: i32 = 2500;

/// The test server allows 50 connections. Each test takes, before it starts,
/// as many as it will ever hold at once, so tests running in parallel stay
/// within 40: a refused connection would be a `NotSent` attempt, which the
/// engine retries, and the test would no longer test what it says.
static CONNECTIONS: Semaphore = Semaphore::const_new(40);

// ---------------------------------------------------------------- the server

/// How the server is slow.
#[derive(Debug, Clone, Copy)]
enum Slow {
    /// Never.
    Not,
    /// Every commit takes this long: a deferred constraint trigger, run by
    /// the `COMMIT` (here the implicit one of an autocommit `INSERT`).
    Commit(Duration),
    /// The first `INSERT` of each payment takes this long, its later ones
    /// are quick: a row trigger, run inside the statement. It counts arrivals
    /// with a sequence per payment, which no rollback undoes, so the first
    /// attempt's cancellation does not make its retry slow too.
    FirstInsert(Duration),
}

/// One test's payments table on the real server, and what the test counts
/// about the tool's attempts.
struct Payments {
    url: String,
    /// The test's own connection: setup, the verifier's reads, the counts.
    /// Only quick statements run on it (a connection runs one statement at
    /// a time, and tokio-postgres queues the rest), so no read waits behind
    /// a slow commit.
    admin: Client,
    table: String,
    insert: String,
    find: String,
    /// The connection tasks the attempts opened: each ends once the server
    /// has answered everything sent on it (see [`Payments::settled`]).
    connections: Mutex<Vec<JoinHandle<()>>>,
    dispatches: Mutex<HashMap<i64, u32>>,
    absent_reads: Mutex<HashMap<i64, u32>>,
    _slots: SemaphorePermit<'static>,
}

impl Payments {
    /// A table `vt_pg_<test>_<pid>` for payments `0..payments`, slow as
    /// said, holding up to `connections` connections of the server's.
    async fn new(url: &str, test: &str, payments: i64, slow: Slow, connections: u32) -> Self {
        let slots = CONNECTIONS.acquire_many(connections).await.expect("never closed");
        let (admin, connection) = tokio_postgres::connect(url, NoTls).await.expect("PostgreSQL");
        tokio::spawn(connection);
        let table = format!("vt_pg_{test}_{}", std::process::id());
        let mut setup = format!(
            "DROP TABLE IF EXISTS {table};
             CREATE TABLE {table} (
                 id bigserial PRIMARY KEY, payment bigint NOT NULL, cents int NOT NULL
             );"
        );
        match slow {
            Slow::Not => {}
            Slow::Commit(wait) => setup.push_str(&format!(
                "CREATE OR REPLACE FUNCTION {table}_slow() RETURNS trigger LANGUAGE plpgsql AS $$
                 BEGIN PERFORM pg_sleep({secs}); RETURN NULL; END $$;
                 CREATE CONSTRAINT TRIGGER slow AFTER INSERT ON {table}
                     DEFERRABLE INITIALLY DEFERRED FOR EACH ROW EXECUTE FUNCTION {table}_slow();",
                secs = wait.as_secs_f64()
            )),
            Slow::FirstInsert(wait) => {
                setup.push_str(&format!(
                    "CREATE OR REPLACE FUNCTION {table}_slow() RETURNS trigger LANGUAGE plpgsql AS $$
                     BEGIN
                         IF nextval(format('{table}_arrivals_%s', NEW.payment)::regclass) = 1 THEN
                             PERFORM pg_sleep({secs});
                         END IF;
                         RETURN NULL;
                     END $$;
                     CREATE TRIGGER slow AFTER INSERT ON {table}
                         FOR EACH ROW EXECUTE FUNCTION {table}_slow();",
                    secs = wait.as_secs_f64()
                ));
                for payment in 0..payments {
                    // Owned by the table: dropped with it.
                    setup.push_str(&format!(
                        "CREATE SEQUENCE {table}_arrivals_{payment} OWNED BY {table}.payment;"
                    ));
                }
            }
        }
        admin.batch_execute(&setup).await.expect("the payments table");
        Self {
            url: url.to_owned(),
            admin,
            insert: format!("INSERT INTO {table} (payment, cents) VALUES ($1, $2) RETURNING id"),
            find: format!("SELECT id FROM {table} WHERE payment = $1 AND cents = $2 LIMIT 1"),
            table,
            connections: Mutex::default(),
            dispatches: Mutex::default(),
            absent_reads: Mutex::default(),
            _slots: slots,
        }
    }

    /// An attempt's own connection, counted as one dispatch of `payment`.
    async fn connect(&self, payment: i64) -> Result<Client, tokio_postgres::Error> {
        *self.dispatches.lock().unwrap().entry(payment).or_default() += 1;
        let (client, connection) = tokio_postgres::connect(&self.url, NoTls).await?;
        let task = tokio::spawn(async move {
            let _ = connection.await;
        });
        self.connections.lock().unwrap().push(task);
        Ok(client)
    }

    /// Waits until the server has answered every statement the attempts
    /// sent, those of abandoned attempts included: the engine dropping an
    /// attempt drops its client, but tokio-postgres' connection reads the
    /// answers still owed and only then closes. The real event that every
    /// late commit has landed (or rolled back), with no guessed sleep.
    async fn settled(&self) {
        let tasks = std::mem::take(&mut *self.connections.lock().unwrap());
        for task in tasks {
            task.await.expect("a connection task");
        }
    }

    fn dispatches(&self, payment: i64) -> u32 {
        self.dispatches.lock().unwrap().get(&payment).copied().unwrap_or(0)
    }

    fn absent_reads(&self, payment: i64) -> u32 {
        self.absent_reads.lock().unwrap().get(&payment).copied().unwrap_or(0)
    }

    /// Rows per payment, as committed now.
    async fn rows(&self) -> HashMap<i64, i64> {
        let query = format!("SELECT payment, count(*) FROM {} GROUP BY payment", self.table);
        let rows = self.admin.query(&query, &[]).await.expect("the count");
        rows.iter().map(|row| (row.get(0), row.get(1))).collect()
    }

    /// The row id of `payment`'s one row.
    async fn id(&self, payment: i64) -> i64 {
        let query = format!("SELECT id FROM {} WHERE payment = $1", self.table);
        self.admin.query_one(&query, &[&payment]).await.expect("one row").get(0)
    }

    async fn drop_table(self) {
        let table = &self.table;
        let _ = self
            .admin
            .batch_execute(&format!(
                "DROP TABLE IF EXISTS {table}; DROP FUNCTION IF EXISTS {table}_slow()"
            ))
            .await;
    }
}

// ---------------------------------------------------------------- the tools

/// Books a payment: a plain `INSERT` on a connection of the attempt's own.
/// Dropped at the deadline, the statement runs on and commits regardless.
async fn insert(db: &Payments, payment: i64, cents: i32) -> Result<i64, tokio_postgres::Error> {
    let client = db.connect(payment).await?;
    let row = client.query_one(&db.insert, &[&payment, &cents]).await?;
    Ok(row.get(0))
}

/// Books a payment. The settle margin covers the slowest commit.
#[verified_tool(side_effect = "high", verify = booked, skip(db), timeout = "1s", settle = "1s")]
async fn book(db: &Payments, payment: i64, cents: i32) -> Result<i64, tokio_postgres::Error> {
    insert(db, payment, cents).await
}

/// Books a payment, declaring no settle margin: the context's, if any.
#[verified_tool(side_effect = "high", verify = booked, skip(db), timeout = "1s")]
async fn book_undeclared(
    db: &Payments,
    payment: i64,
    cents: i32,
) -> Result<i64, tokio_postgres::Error> {
    insert(db, payment, cents).await
}

/// Books a payment with the attempt's deadline forwarded as
/// `statement_timeout`, so PostgreSQL cancels the `INSERT` at it: a server
/// that honours deadlines. The connection is the attempt's alone, so a
/// session setting is the attempt's. The margin covers what the server's
/// clock runs behind the client's (the round trips between reading the
/// deadline and the statement's start).
///
/// The `INSERT` commits by itself, as in [`insert`]: that is what lands
/// late. Inside `BEGIN … COMMIT` an abandoned attempt never commits (its
/// dropped future never sends the `COMMIT`, and tokio-postgres rolls the
/// transaction back); there the late arrival is a `COMMIT` already sent,
/// which `statement_timeout` does not bound (the timeout is disarmed before
/// the commit runs its deferred triggers or waits for a synchronous
/// replica): only the settle margin covers that.
#[verified_tool(side_effect = "high", verify = booked, skip(db), timeout = "1s", settle = "200ms")]
async fn book_by_deadline(
    db: &Payments,
    payment: i64,
    cents: i32,
    deadline: Deadline,
) -> Result<i64, tokio_postgres::Error> {
    let client = db.connect(payment).await?;
    // 0 would mean "no limit": at least 1 ms.
    let limit = deadline.remaining().as_millis().max(1);
    client.batch_execute(&format!("SET statement_timeout = {limit}")).await?;
    let row = client.query_one(&db.insert, &[&payment, &cents]).await?;
    Ok(row.get(0))
}

/// Read-only: is `payment` booked, for these cents? Its row id.
async fn booked(
    db: &Payments,
    payment: &i64,
    cents: &i32,
) -> Result<Verdict<i64>, tokio_postgres::Error> {
    let found = db.admin.query_opt(&db.find, &[payment, cents]).await?;
    // Counted for the tests: the reads the engine must not believe.
    if found.is_none() {
        *db.absent_reads.lock().unwrap().entry(*payment).or_default() += 1;
    }
    Ok(found.map(|row| row.get(0)).into())
}

/// Runs `call` for payments `0..payments` at once, each in a task of its own
/// (an agent serving as many conversations); the results in payment order.
async fn all_at_once<F, Fut, T>(payments: i64, call: F) -> Vec<T>
where
    F: Fn(i64) -> Fut,
    Fut: Future<Output = T> + Send + 'static,
    T: Send + 'static,
{
    let tasks: Vec<_> = (0..payments).map(|payment| tokio::spawn(call(payment))).collect();
    let mut results = Vec::with_capacity(tasks.len());
    for task in tasks {
        results.push(task.await.expect("a call panicked"));
    }
    results
}

type Booked = ToolResult<i64, tokio_postgres::Error>;

// ---------------------------------------------------------------- slow commits

/// The case: a commit that takes 1.5 s behind a 1 s attempt
/// timeout, on a server that ignores keys. The verifier reads `Absent`
/// while the first transaction is still committing; with a settle margin
/// that covers the commit that read is not believed, the engine reads on
/// until the commit shows, and nothing is booked twice.
#[tokio::test]
async fn a_slow_commit_is_seen_once_settled_not_booked_twice() {
    let Some(url) = support::postgres::url() else { return };
    let commit = Slow::Commit(Duration::from_millis(1500));
    let db = Arc::new(Payments::new(&url, "slow_commit", AT_ONCE, commit, 11).await);
    let cx = Context::new("billing-agent");
    let results: Vec<Booked> = all_at_once(AT_ONCE, |payment| {
        let (db, cx) = (Arc::clone(&db), cx.for_tool_call(format!("call_{payment}")));
        async move { book(&cx, &db, payment, CENTS).await }
    })
    .await;
    db.settled().await;
    let rows = db.rows().await;
    for (payment, result) in (0..AT_ONCE).zip(&results) {
        assert_eq!(rows.get(&payment), Some(&1), "payment {payment}: {result:?}");
        assert_eq!(db.dispatches(payment), 1, "payment {payment}: {result:?}");
        // The attempt timed out: only the verifier can have proven it, and
        // what it observed is the row that committed.
        let ToolResult::Success { value, proof: Proof::Verifier, .. } = result else {
            panic!("payment {payment}: {result:?}");
        };
        assert_eq!(*value, db.id(payment).await, "payment {payment}");
        // The read that the old behaviour believed was made, and not believed.
        assert!(db.absent_reads(payment) >= 1, "payment {payment}: read only after the commit");
    }
    Arc::into_inner(db).expect("the calls are done").drop_table().await;
}

/// The control: the same calls, with `Absent` believed at once (a settle
/// margin of zero, the old behaviour). The retry goes out while the first
/// transaction is still committing, and both commit. The attribute refuses
/// `settle = "0ms"` at compile time, so the zero comes from the context's
/// policy, which a tool that declares no margin of its own takes.
#[tokio::test]
async fn control_believing_absent_at_once_books_a_slow_commit_twice() {
    let Some(url) = support::postgres::url() else { return };
    let commit = Slow::Commit(Duration::from_millis(1500));
    // Two attempts per payment can be running at once.
    let db = Arc::new(Payments::new(&url, "control", AT_ONCE, commit, 21).await);
    let at_once = RetryPolicy::for_class(SideEffect::High).with_settle(Some(Duration::ZERO));
    let cx = Context::new("billing-agent").with_policy(SideEffect::High, at_once);
    let results: Vec<Booked> = all_at_once(AT_ONCE, |payment| {
        let (db, cx) = (Arc::clone(&db), cx.for_tool_call(format!("call_{payment}")));
        async move { book_undeclared(&cx, &db, payment, CENTS).await }
    })
    .await;
    db.settled().await;
    let rows = db.rows().await;
    let twice = (0..AT_ONCE).filter(|p| rows.get(p) == Some(&2)).count();
    assert!(twice >= 1, "the harness must be able to see a duplicate: {rows:?} {results:?}");
    for (payment, result) in (0..AT_ONCE).zip(&results) {
        let booked = rows.get(&payment).copied().unwrap_or(0);
        assert_eq!(booked, i64::from(db.dispatches(payment)), "payment {payment}: {result:?}");
        // Each call still reports one proven success: the duplicate is
        // invisible to the caller.
        assert!(
            matches!(result, ToolResult::Success { proof: Proof::Verifier, .. }),
            "payment {payment}: {result:?}"
        );
    }
    Arc::into_inner(db).expect("the calls are done").drop_table().await;
}

/// The default: no settle margin anywhere. An `Absent` after an ambiguous
/// failure is never believed, so there is no retry; the commit outlasts the
/// verifier's reads (three, 250 ms apart: a 1.5 s commit would be seen by
/// the third and proven), and each call ends `Unknown`, `Unsettled`, with
/// its key. The same call re-issued after the commit proves it without
/// booking again.
#[tokio::test]
async fn without_a_settle_margin_absent_is_not_believed_and_the_call_is_unknown() {
    let Some(url) = support::postgres::url() else { return };
    let commit = Slow::Commit(Duration::from_millis(2500));
    let db = Arc::new(Payments::new(&url, "unsettled", AT_ONCE, commit, 11).await);
    let cx = Context::new("billing-agent");
    let call = |payment: i64| cx.for_tool_call(format!("call_{payment}"));
    let results: Vec<Booked> = all_at_once(AT_ONCE, |payment| {
        let (db, cx) = (Arc::clone(&db), call(payment));
        async move { book_undeclared(&cx, &db, payment, CENTS).await }
    })
    .await;
    for (payment, result) in (0..AT_ONCE).zip(&results) {
        assert!(
            matches!(
                result,
                ToolResult::Unknown {
                    reason: UnknownReason::Unsettled,
                    cause: Cause::TimedOut(_),
                    ..
                }
            ),
            "payment {payment}: {result:?}"
        );
        assert_eq!(db.dispatches(payment), 1, "payment {payment}: no retry");
    }
    db.settled().await;
    let rows = db.rows().await;
    for payment in 0..AT_ONCE {
        assert_eq!(rows.get(&payment), Some(&1), "payment {payment}");
        // The key the `Unknown` gave is the way back: the same tool call,
        // now in doubt in the ledger, verifies before it dispatches.
        let again = book_undeclared(&call(payment), &db, payment, CENTS).await;
        assert!(
            matches!(again, ToolResult::Success { proof: Proof::Verifier, .. }),
            "payment {payment}: {again:?}"
        );
        assert_eq!(again.key(), results[payment as usize].key());
        assert_eq!(db.dispatches(payment), 1, "payment {payment}: verified, not re-sent");
    }
    Arc::into_inner(db).expect("the calls are done").drop_table().await;
}

/// A server that honours deadlines: the tool forwards the attempt's
/// `Deadline` as `statement_timeout`, and PostgreSQL cancels the slow first
/// attempt at it; without that, the first attempt would commit half a
/// second after its deadline, after the retry (a duplicate, as in the
/// control). Whether the client's timer or the server's cancellation
/// answers first is a race of a millisecond: on the timer, the verifier
/// reads `Absent` until the settle point and the engine then believes it; on
/// the cancellation (57014, rolled back: `NotSent`), the engine retries
/// without a read. Either way that `Absent` is true, and each payment is
/// booked once, by its second dispatch, which is quick.
#[tokio::test]
async fn a_server_honouring_the_deadline_cancels_the_late_attempt_and_the_retry_books_once() {
    let Some(url) = support::postgres::url() else { return };
    let first = Slow::FirstInsert(Duration::from_millis(1500));
    // An abandoned attempt's connection may not be closed yet when its retry
    // connects.
    let db = Arc::new(Payments::new(&url, "deadline", AT_ONCE, first, 21).await);
    let cx = Context::new("billing-agent");
    let results: Vec<Booked> = all_at_once(AT_ONCE, |payment| {
        let (db, cx) = (Arc::clone(&db), cx.for_tool_call(format!("call_{payment}")));
        async move { book_by_deadline(&cx, &db, payment, CENTS).await }
    })
    .await;
    db.settled().await;
    let rows = db.rows().await;
    for (payment, result) in (0..AT_ONCE).zip(&results) {
        assert_eq!(rows.get(&payment), Some(&1), "payment {payment}: {result:?}");
        assert_eq!(db.dispatches(payment), 2, "payment {payment}: {result:?}");
        // The second attempt answered (and its OK was read back, a high
        // tool's default); without the cancellation the first would have
        // committed after it, as in the control.
        let ToolResult::Success { value, proof: Proof::Verifier, .. } = result else {
            panic!("payment {payment}: {result:?}");
        };
        assert_eq!(*value, db.id(payment).await, "payment {payment}");
    }
    Arc::into_inner(db).expect("the calls are done").drop_table().await;
}

// ---------------------------------------------------------------- lost messages

/// What the link between the tool and the server does to one request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Fate {
    /// Executed, committed and answered.
    Delivered,
    /// Executed and committed; the answer never comes back.
    AnswerLost,
    /// Never reaches the server.
    RequestLost,
}

/// The losses, fixed: every run loses the same requests and answers. Each
/// payment's first and second request are drawn from a xorshift64 stream.
fn schedule(payments: i64) -> Vec<[Fate; 2]> {
    let mut x: u64 = 0x9E37_79B9_7F4A_7C15;
    let mut draw = move || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        match x % 100 {
            0..30 => Fate::AnswerLost,
            30..45 => Fate::RequestLost,
            _ => Fate::Delivered,
        }
    };
    (0..payments).map(|_| [draw(), draw()]).collect()
}

/// A proxy in front of PostgreSQL that loses requests and answers by the
/// schedule, over a small pool of clients (quick autocommit statements
/// share a connection well).
struct Link {
    db: Payments,
    pool: Vec<Client>,
    fates: Vec<[Fate; 2]>,
    /// The verifier's reads of this payment tell nothing (its replica is
    /// down): that call stays in doubt.
    unreadable: i64,
}

impl Link {
    async fn new(url: &str, test: &str, payments: i64) -> Self {
        const POOL: u32 = 4;
        let db = Payments::new(url, test, payments, Slow::Not, POOL + 1).await;
        let mut pool = Vec::new();
        for _ in 0..POOL {
            let (client, connection) = tokio_postgres::connect(url, NoTls).await.expect("pool");
            tokio::spawn(connection);
            pool.push(client);
        }
        let fates = schedule(payments);
        let unreadable = fates.iter().position(|f| f[0] == Fate::AnswerLost).expect("a loss");
        Self { db, pool, fates, unreadable: unreadable as i64 }
    }

    async fn insert(&self, payment: i64, cents: i32) -> Result<i64, LinkError> {
        let sent = {
            let mut dispatches = self.db.dispatches.lock().unwrap();
            let sent = dispatches.entry(payment).or_default();
            *sent += 1;
            *sent as usize
        };
        let fate = self.fates[payment as usize][sent - 1];
        if fate == Fate::RequestLost {
            return Err(LinkError::NoAnswer);
        }
        let client = &self.pool[payment as usize % self.pool.len()];
        let row = client.query_one(&self.db.insert, &[&payment, &cents]).await?;
        match fate {
            Fate::AnswerLost => Err(LinkError::NoAnswer),
            _ => Ok(row.get(0)),
        }
    }

    /// How `payment` should end, given `retries`: the fate of the request
    /// that landed (`Delivered` or `AnswerLost`), or `None` when every
    /// request the budget allows was lost.
    fn expected(&self, payment: i64, retries: usize) -> Option<Fate> {
        self.fates[payment as usize][..=retries].iter().copied().find(|f| *f != Fate::RequestLost)
    }
}

/// A lost request and a lost answer look the same to the tool.
#[derive(Debug)]
enum LinkError {
    NoAnswer,
    Db(tokio_postgres::Error),
}

impl std::fmt::Display for LinkError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            LinkError::NoAnswer => f.write_str("no answer from the payment database"),
            LinkError::Db(e) => std::fmt::Display::fmt(e, f),
        }
    }
}

impl Classify for LinkError {
    fn classify(&self) -> ErrorClass {
        match self {
            LinkError::NoAnswer => ErrorClass::Ambiguous,
            LinkError::Db(e) => e.classify(),
        }
    }

    fn describe(&self) -> String {
        match self {
            LinkError::NoAnswer => self.to_string(),
            LinkError::Db(e) => e.describe(),
        }
    }
}

impl From<tokio_postgres::Error> for LinkError {
    fn from(e: tokio_postgres::Error) -> Self {
        LinkError::Db(e)
    }
}

/// Charges a payment, irreversibly: never re-sent in doubt.
#[verified_tool(
    side_effect = "irreversible",
    verify = charged,
    skip(link),
    timeout = "1s",
    settle = "200ms"
)]
async fn charge(link: &Link, payment: i64, cents: i32) -> Result<i64, LinkError> {
    link.insert(payment, cents).await
}

/// The same, with one retry allowed once a settled `Absent` shows the first
/// request never landed.
#[verified_tool(
    side_effect = "irreversible",
    verify = charged,
    skip(link),
    timeout = "1s",
    settle = "200ms",
    retries = 1
)]
async fn charge_retrying(link: &Link, payment: i64, cents: i32) -> Result<i64, LinkError> {
    link.insert(payment, cents).await
}

/// Read-only: is `payment` charged? Of the unreadable payment: cannot tell.
async fn charged(
    link: &Link,
    payment: &i64,
    cents: &i32,
) -> Result<Verdict<i64>, tokio_postgres::Error> {
    if *payment == link.unreadable {
        return Ok(Verdict::Unknown);
    }
    booked(&link.db, payment, cents).await
}

type Charged = ToolResult<i64, LinkError>;

/// Runs `payments` charges through the lossy link, and checks each against
/// the schedule: no payment charged twice, a call that lost its answer
/// proven by the verifier (and one answered too: an irreversible tool reads
/// its OK answer back by default), one that lost its request (every one of them,
/// within the retry budget) `NotApplied`, and a person asked only about the
/// one call nothing could settle.
async fn charge_through_a_lossy_link<F, Fut>(
    url: &str,
    test: &str,
    payments: i64,
    retries: usize,
    call: F,
) where
    F: Fn(Context, Arc<Link>, i64) -> Fut,
    Fut: Future<Output = Charged> + Send + 'static,
{
    let link = Arc::new(Link::new(url, test, payments).await);
    let tickets = Arc::new(MemoryEscalations::new());
    let cx = Context::new("billing-agent").with_escalation(tickets.clone());
    let results: Vec<Charged> = all_at_once(payments, |payment| {
        call(cx.for_tool_call(format!("call_{payment}")), Arc::clone(&link), payment)
    })
    .await;
    let rows = link.db.rows().await;
    let mut seen = HashMap::<&str, u32>::new();
    for (payment, result) in (0..payments).zip(&results) {
        let booked = rows.get(&payment).copied().unwrap_or(0);
        assert!(booked <= 1, "payment {payment} charged {booked} times: {result:?}");
        let fates = link.fates[payment as usize];
        let sent = link.db.dispatches(payment) as usize;
        assert!((1..=retries + 1).contains(&sent), "payment {payment} {fates:?}: sent {sent}");
        if payment == link.unreadable {
            // Answer lost, verifier blind: in doubt, so a person is asked.
            assert!(
                matches!(
                    result,
                    ToolResult::Escalated {
                        reason: UnknownReason::VerifierInconclusive,
                        verdict: Verdict::Unknown,
                        ..
                    }
                ),
                "payment {payment}: {result:?}"
            );
            assert_eq!(booked, 1, "the person will find it charged");
            assert_eq!(sent, 1, "an irreversible call in doubt is never re-sent");
            continue;
        }
        match (link.expected(payment, retries), result) {
            (
                Some(Fate::Delivered | Fate::AnswerLost),
                ToolResult::Success { value, proof: Proof::Verifier, .. },
            ) => {
                assert_eq!(booked, 1, "payment {payment}");
                assert_eq!(*value, link.db.id(payment).await, "payment {payment}");
            }
            (None, ToolResult::NotApplied { cause: Cause::Error(LinkError::NoAnswer), .. }) => {
                assert_eq!(booked, 0, "payment {payment}: known not to have happened");
            }
            (expected, result) => {
                panic!("payment {payment} {fates:?}: expected {expected:?}, got {result:?}")
            }
        }
        *seen.entry(result.label()).or_default() += 1;
        // Re-sent only after a lost request, and then within the budget.
        let resent = retries > 0 && fates[0] == Fate::RequestLost;
        assert_eq!(sent, if resent { 2 } else { 1 }, "payment {payment} {fates:?}");
    }
    let tickets = tickets.take();
    assert_eq!(tickets.len(), 1, "{tickets:?}");
    assert_eq!(tickets[0].verdict, Verdict::Unknown, "{tickets:?}");
    assert_eq!(Some(tickets[0].key), results[link.unreadable as usize].key());
    // The fixed schedule exercises every path.
    assert!(seen.get("success").is_some_and(|n| *n > 0), "{seen:?}");
    assert!(seen.get("not_applied").is_some_and(|n| *n > 0), "{seen:?}");
    let answers_lost = (0..payments)
        .filter(|p| link.expected(*p, retries) == Some(Fate::AnswerLost) && *p != link.unreadable)
        .count();
    assert!(answers_lost > 0, "the schedule loses no answer");
    let link = Arc::into_inner(link).expect("the calls are done");
    link.db.drop_table().await;
}

/// Escalation is for doubt. Through a link that loses 30 % of the answers
/// (after the commit) and 15 % of the requests (before the server), an
/// irreversible tool with its default budget (no retry): a lost answer is
/// proven by the verifier, a lost request is known not to have happened
/// once its attempt has settled, and ends `NotApplied` for the caller to
/// decide. Neither is handed to a person: `Absent` after the settle point
/// is not doubt. The engine's rule (`engine/decide.rs`): a settled `Absent`
/// in the call that sent the request may re-dispatch only within the retry
/// budget, which is 0 for an irreversible tool unless it declares one.
#[tokio::test]
async fn escalation_is_for_doubt_a_lost_request_of_an_irreversible_tool_is_not_applied() {
    let Some(url) = support::postgres::url() else { return };
    charge_through_a_lossy_link(&url, "irreversible", 300, 0, |cx, link, payment| async move {
        charge(&cx, &link, payment, CENTS).await
    })
    .await;
}

/// The same link, the tool declaring `retries = 1`: the settled `Absent`
/// of a lost request is retried under the same key (the call that sent it
/// knows it never landed), and only a second lost request ends
/// `NotApplied`.
#[tokio::test]
async fn an_irreversible_tool_with_a_retry_budget_resends_a_settled_absent_once() {
    let Some(url) = support::postgres::url() else { return };
    let test = "irreversible_retry";
    charge_through_a_lossy_link(&url, test, 300, 1, |cx, link, payment| async move {
        charge_retrying(&cx, &link, payment, CENTS).await
    })
    .await;
}
