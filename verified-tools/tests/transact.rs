//! Transactional tools against a real PostgreSQL (issue 17, item 2):
//! `PostgresLedger::transact` runs each attempt in one transaction that
//! also completes the call's record. The payments table has no unique
//! constraint (a store that ignores keys): a second row for a payment is a
//! duplicate the engine let through, and the tests count rows.
//!
//! The server is `VT_POSTGRES_URL` (`.ci/postgres.sh` starts one); without
//! it each test says so in one line and passes, under `CI=true` it fails.

use test_support as support;

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use support::lossy::LossyProxy;
use tokio_postgres::{Client, Config, NoTls};
use verified_tools::ledger::{Ledger, PostgresLedger, RecordState, Tx, TxError};
use verified_tools::{
    Backoff, Classify, Context, ErrorClass, Proof, SideEffect, ToolResult, ToolSpec, verified_tool,
};

static PAY: ToolSpec = ToolSpec::new("pay", SideEffect::High);
/// With a budget that rides over the lossy link's lost answers.
static PAY_PATIENTLY: ToolSpec = ToolSpec::new("pay", SideEffect::High).with_retries(6);

type Paid = ToolResult<i64, TxError<BodyError>>;

/// The body's error: the database's, or the test's own refusal.
#[derive(Debug)]
enum BodyError {
    Db(tokio_postgres::Error),
    Refused,
}

impl std::fmt::Display for BodyError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            BodyError::Db(e) => write!(f, "{}", e.describe()),
            BodyError::Refused => f.write_str("the card was declined"),
        }
    }
}

impl Classify for BodyError {
    fn classify(&self) -> ErrorClass {
        match self {
            BodyError::Db(e) => e.classify(),
            BodyError::Refused => ErrorClass::Definitive,
        }
    }
}

impl From<tokio_postgres::Error> for BodyError {
    fn from(e: tokio_postgres::Error) -> Self {
        BodyError::Db(e)
    }
}

/// A test's payments table and ledger (a prefix of its own), on the run's
/// server.
struct Shop {
    url: String,
    admin: Client,
    table: String,
    ledger: PostgresLedger,
}

impl Shop {
    async fn open(test: &str) -> Option<Self> {
        let url = support::postgres::url()?;
        let admin = connect(&url).await;
        let table = format!("vt_tx_{test}_{}", std::process::id());
        admin
            .batch_execute(&format!(
                "DROP TABLE IF EXISTS {table};
                 CREATE TABLE {table} (id bigserial PRIMARY KEY, payment bigint NOT NULL, cents int NOT NULL);"
            ))
            .await
            .expect("the payments table");
        let ledger = PostgresLedger::builder()
            .with_prefix(format!("vt_tx_{test}_{}_", std::process::id()))
            .connect(&url)
            .await
            .expect("the ledger")
            .with_lease(Duration::from_secs(600));
        Some(Self { url, admin, table, ledger })
    }

    /// Rows per payment.
    async fn rows(&self, payment: i64) -> i64 {
        let query = format!("SELECT count(*) FROM {} WHERE payment = $1", self.table);
        self.admin.query_one(&query, &[&payment]).await.expect("a count").get(0)
    }

    async fn id(&self, payment: i64) -> Option<i64> {
        let query = format!("SELECT id FROM {} WHERE payment = $1", self.table);
        self.admin.query_opt(&query, &[&payment]).await.expect("a read").map(|row| row.get(0))
    }

    /// Pays through `client`: one row, its id the value.
    async fn pay(
        &self,
        cx: &Context,
        spec: &'static ToolSpec,
        client: &mut Client,
        payment: i64,
        body_runs: &AtomicU32,
    ) -> Paid {
        let insert =
            format!("INSERT INTO {} (payment, cents) VALUES ($1, 1250) RETURNING id", self.table);
        let insert = insert.as_str();
        self.ledger
            .transact(cx, spec, client, &payment, &payment, |tx| {
                body_runs.fetch_add(1, Ordering::Relaxed);
                Box::pin(async move {
                    let row = tx.query_one(insert, &[&payment]).await?;
                    Ok(row.get(0))
                })
            })
            .await
    }
}

impl Drop for Shop {
    fn drop(&mut self) {
        // Best effort: the prefix and table carry the pid, a rerun drops them.
        let (table, prefix) = (self.table.clone(), self.ledger.prefix().to_owned());
        let url = self.url.clone();
        let _ = std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build();
            if let Ok(runtime) = runtime {
                runtime.block_on(async move {
                    if let Ok((client, connection)) = tokio_postgres::connect(&url, NoTls).await {
                        tokio::spawn(connection);
                        let _ = client
                            .batch_execute(&format!(
                                "DROP TABLE IF EXISTS {table}; \
                                 DROP TABLE IF EXISTS public.{prefix}records CASCADE;"
                            ))
                            .await;
                    }
                });
            }
        })
        .join();
    }
}

async fn connect(url: &str) -> Client {
    let (client, connection) = tokio_postgres::connect(url, NoTls).await.expect("PostgreSQL");
    tokio::spawn(connection);
    client
}

#[tokio::test]
async fn a_call_commits_its_row_and_its_record_together_and_a_repeat_replays() {
    let Some(shop) = Shop::open("once").await else { return };
    let mut client = connect(&shop.url).await;
    let cx = Context::new("billing").for_step("order-1", 1);
    let runs = AtomicU32::new(0);
    let first = shop.pay(&cx, &PAY, &mut client, 1, &runs).await;
    let ToolResult::Success { value, proof: Proof::Response, key } = first else {
        panic!("{first:?}")
    };
    assert_eq!(shop.rows(1).await, 1);
    assert_eq!(Some(value), shop.id(1).await, "the value is the row's");
    let record = shop.ledger.record(key).await.expect("readable").expect("recorded");
    assert_eq!(record.state, RecordState::Completed, "committed with the row");

    // The same logical call again (another process would do the same):
    // its attempt finds the record completed and rolls back, and the
    // record's value is read.
    let again = shop.pay(&cx, &PAY, &mut client, 1, &runs).await;
    assert!(
        matches!(again, ToolResult::Success { value: v, proof: Proof::Verifier, .. } if v == value),
        "{again:?}"
    );
    assert_eq!(shop.rows(1).await, 1, "the repeat's statements rolled back");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_same_call_from_eight_connections_at_once_commits_one_row() {
    let Some(shop) = Shop::open("racing").await else { return };
    let shop = Arc::new(shop);
    let runs = Arc::new(AtomicU32::new(0));
    let start = Arc::new(tokio::sync::Barrier::new(8));
    let mut calls = tokio::task::JoinSet::new();
    for _ in 0..8 {
        let (shop, runs, start) = (Arc::clone(&shop), Arc::clone(&runs), Arc::clone(&start));
        calls.spawn(async move {
            let mut client = connect(&shop.url).await;
            let cx = Context::new("billing").for_step("order-race", 1);
            start.wait().await;
            shop.pay(&cx, &PAY, &mut client, 7, &runs).await
        });
    }
    let results = calls.join_all().await;
    // Each waited for the holder's locks, then found the record completed.
    assert_eq!(shop.rows(7).await, 1, "{results:?}");
    let id = shop.id(7).await;
    for result in &results {
        assert!(
            matches!(result, ToolResult::Success { value, .. } if Some(*value) == id),
            "every call is told the one payment: {result:?}"
        );
    }
    let by_commit =
        results.iter().filter(|r| matches!(r, ToolResult::Success { proof: Proof::Response, .. }));
    assert_eq!(by_commit.count(), 1, "one call committed it: {results:?}");
}

#[tokio::test]
async fn a_failed_body_rolls_its_rows_back_and_the_call_says_so() {
    let Some(shop) = Shop::open("refused").await else { return };
    let mut client = connect(&shop.url).await;
    let insert = format!("INSERT INTO {} (payment, cents) VALUES (2, 1250)", shop.table);
    let insert = insert.as_str();
    let cx = Context::new("billing").for_step("order-2", 1);
    let result: Paid = shop
        .ledger
        .transact(&cx, &PAY, &mut client, &2_i64, &2_i64, |tx| {
            Box::pin(async move {
                tx.execute(insert, &[]).await?;
                // Written, then refused: the row must not stay.
                Err(BodyError::Refused)
            })
        })
        .await;
    assert!(
        matches!(result, ToolResult::Failed { error: TxError::Body(BodyError::Refused), .. }),
        "{result:?}"
    );
    assert_eq!(shop.rows(2).await, 0, "rolled back");
    // The claim rolled back with the rest: nothing recorded, the key free.
    let record = shop.ledger.record(result.key().expect("a key")).await.expect("readable");
    assert_eq!(record.map(|r| r.state), None);
    // The connection is usable again, outside any transaction.
    let state: String = client
        .query_one("SELECT current_setting('transaction_isolation')", &[])
        .await
        .expect("the client still works")
        .get(0);
    assert!(!state.is_empty());
    assert!(
        client.batch_execute("COMMIT").await.is_ok(),
        "no transaction left open (COMMIT outside one only warns)"
    );
}

#[tokio::test]
async fn a_serialization_failure_rolls_back_and_is_retried_within_the_budget() {
    let Some(shop) = Shop::open("serial").await else { return };
    let mut client = connect(&shop.url).await;
    let insert =
        format!("INSERT INTO {} (payment, cents) VALUES (3, 1250) RETURNING id", shop.table);
    let insert = insert.as_str();
    let cx = Context::new("billing").for_step("order-3", 1);
    let runs = AtomicU32::new(0);
    let result: Paid = shop
        .ledger
        .transact(&cx, &PAY, &mut client, &3_i64, &3_i64, |tx| {
            let run = runs.fetch_add(1, Ordering::Relaxed);
            Box::pin(async move {
                let row = tx.query_one(insert, &[]).await?;
                if run == 0 {
                    // As PostgreSQL says it under SERIALIZABLE, after the write.
                    tx.batch_execute(
                        "DO $$ BEGIN RAISE EXCEPTION 'could not serialize access' \
                         USING ERRCODE = '40001'; END $$",
                    )
                    .await?;
                }
                Ok(row.get(0))
            })
        })
        .await;
    assert!(matches!(result, ToolResult::Success { proof: Proof::Response, .. }), "{result:?}");
    assert_eq!(runs.load(Ordering::Relaxed), 2, "one retry");
    assert_eq!(shop.rows(3).await, 1, "the first attempt's row rolled back");
}

#[tokio::test]
async fn a_body_past_its_attempt_deadline_is_rolled_back_by_the_server_and_retried() {
    let Some(shop) = Shop::open("slow").await else { return };
    let mut client = connect(&shop.url).await;
    let cx =
        Context::new("billing").for_step("order-4", 1).map_policies(|class, policy| match class {
            SideEffect::High => policy.with_attempt_timeout(Some(Duration::from_millis(800))),
            _ => policy,
        });
    let insert =
        format!("INSERT INTO {} (payment, cents) VALUES (4, 1250) RETURNING id", shop.table);
    let insert = insert.as_str();
    let runs = AtomicU32::new(0);
    let result: Paid = shop
        .ledger
        .transact(&cx, &PAY, &mut client, &4_i64, &4_i64, |tx| {
            let run = runs.fetch_add(1, Ordering::Relaxed);
            Box::pin(async move {
                let row = tx.query_one(insert, &[]).await?;
                if run == 0 {
                    // Written, then stuck in the server past the attempt's
                    // deadline: statement_timeout cancels it.
                    tx.batch_execute("SELECT pg_sleep(30)").await?;
                }
                Ok(row.get(0))
            })
        })
        .await;
    assert!(matches!(result, ToolResult::Success { .. }), "{result:?}");
    assert_eq!(runs.load(Ordering::Relaxed), 2);
    assert_eq!(shop.rows(4).await, 1, "the stuck attempt's row rolled back");
}

/// Through a proxy that loses a fifth of PostgreSQL's answers to the
/// tool's connection (closing it, or holding the answer past the attempt's
/// deadline), `COMMIT`'s among them: every payment is made at most once,
/// each success is a row with its id, every call that did not succeed made
/// no row, and lost `COMMIT` answers are settled by reading the record.
#[tokio::test]
async fn through_a_link_that_loses_answers_every_payment_is_made_once_and_told_truly() {
    const PAYMENTS: i64 = 120;
    let Some(shop) = Shop::open("lossy").await else { return };
    let config: Config = shop.url.parse().expect("VT_POSTGRES_URL parses");
    let upstream = config.get_ports().first().copied().unwrap_or(5432);
    let proxy = LossyProxy::start(upstream, 0.2, 0.3, 0x5EED_0017).await;
    let mut through = Config::new();
    through.host("127.0.0.1").port(proxy.port).user(config.get_user().unwrap_or("postgres"));
    if let Some(db) = config.get_dbname() {
        through.dbname(db);
    }
    if let Some(password) = config.get_password() {
        through.password(password);
    }
    let cx = Context::new("billing").map_policies(|class, policy| match class {
        // Short attempts, so that a held answer times out; short waits
        // between them; calls long enough for every retry.
        SideEffect::High => policy
            .with_attempt_timeout(Some(Duration::from_millis(300)))
            .with_backoff(Backoff::new(Duration::from_millis(20), 2, Duration::from_millis(200)))
            .with_call_timeout(Duration::from_secs(60)),
        _ => policy,
    });
    let (shop, through) = (Arc::new(shop), Arc::new(through));
    let runs = Arc::new(AtomicU32::new(0));
    let mut calls = tokio::task::JoinSet::new();
    let at_once = Arc::new(tokio::sync::Semaphore::new(6));
    proxy.arm();
    for payment in 0..PAYMENTS {
        let cx = cx.for_step("lossy", payment as u64);
        let (shop, through, runs) = (Arc::clone(&shop), Arc::clone(&through), Arc::clone(&runs));
        let permit = Arc::clone(&at_once).acquire_owned().await.expect("never closed");
        calls.spawn(async move {
            let _permit = permit;
            // A connection per call, as a pool lends one; a broken one is
            // replaced for the same call's re-issue.
            let mut outcome = None;
            for _ in 0..8 {
                let Ok((mut client, connection)) = through.connect(NoTls).await else { continue };
                tokio::spawn(connection);
                let result = shop.pay(&cx, &PAY_PATIENTLY, &mut client, payment, &runs).await;
                // A closed connection ends the call (`Failed`, rolled back);
                // the same call again, on a new one, carries on.
                let again = matches!(
                    &result,
                    ToolResult::Failed { error: TxError::Closed { .. }, .. }
                        | ToolResult::Refused(_)
                );
                outcome = Some(result);
                if !again {
                    break;
                }
            }
            (payment, outcome.expect("a connection in eight tries"))
        });
    }
    let mut results: Vec<(i64, Paid)> = calls.join_all().await;
    results.sort_by_key(|(payment, _)| *payment);
    proxy.disarm();
    let (mut by_response, mut by_verifier, mut not_applied) = (0, 0, 0);
    for (payment, result) in &results {
        let payment = *payment;
        let rows = shop.rows(payment).await;
        assert!(rows <= 1, "payment {payment} made {rows} times: {result:?}");
        match result {
            ToolResult::Success { value, proof, .. } => {
                assert_eq!(rows, 1, "payment {payment}: {result:?}");
                assert_eq!(Some(*value), shop.id(payment).await, "payment {payment}");
                match proof {
                    Proof::Response => by_response += 1,
                    _ => by_verifier += 1,
                }
            }
            ToolResult::NotApplied { .. } | ToolResult::Failed { .. } => {
                assert_eq!(rows, 0, "payment {payment} said not applied: {result:?}");
                not_applied += 1;
            }
            other => panic!("payment {payment}: in doubt after a locking read? {other:?}"),
        }
    }
    eprintln!(
        "{PAYMENTS} payments: {by_response} by the commit's answer, {by_verifier} by the record \
         after a lost answer, {not_applied} not applied; proxy: {}",
        proxy.report()
    );
    assert!(by_verifier > 0, "no COMMIT answer was lost: the test proves nothing");
    assert!(by_response > 0);
}

/// Books a payment, once per payment: the attribute's form of
/// `PostgresLedger::transact`.
#[verified_tool(side_effect = "high", transactional, key(payment), skip(table))]
async fn book(tx: &Tx<'_>, table: &str, payment: i64) -> Result<i64, tokio_postgres::Error> {
    let insert = format!("INSERT INTO {table} (payment, cents) VALUES ($1, 1250) RETURNING id");
    Ok(tx.query_one(&insert, &[&payment]).await?.get(0))
}

#[tokio::test]
async fn the_attribute_form_commits_once_per_payment_whoever_asks() {
    let Some(shop) = Shop::open("attribute").await else { return };
    let mut client = connect(&shop.url).await;
    let cx = Context::new("billing");
    let first = book(&cx, &shop.ledger, &mut client, &shop.table, 5).await;
    let ToolResult::Success { value, proof: Proof::Response, .. } = first else {
        panic!("{first:?}")
    };
    // Another step, another tool call id: `key(payment)` names the action.
    let again = book(&cx.for_tool_call("call_2"), &shop.ledger, &mut client, &shop.table, 5).await;
    assert!(
        matches!(again, ToolResult::Success { value: v, proof: Proof::Verifier, .. } if v == value),
        "{again:?}"
    );
    assert_eq!(shop.rows(5).await, 1);
    assert_eq!(book_spec().name, "book");
}

/// A link that hands the server's answers to the client a byte at a time,
/// as a slow or congested network can: the opening's answer then arrives
/// in as many parts as it has messages.
async fn trickling(upstream: u16) -> u16 {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("a port");
    let port = listener.local_addr().expect("bound").port();
    tokio::spawn(async move {
        while let Ok((client, _)) = listener.accept().await {
            let Ok(server) = tokio::net::TcpStream::connect(("127.0.0.1", upstream)).await else {
                return;
            };
            let _ = (client.set_nodelay(true), server.set_nodelay(true));
            let (mut client_read, mut client_write) = client.into_split();
            let (mut server_read, mut server_write) = server.into_split();
            tokio::spawn(async move {
                let _ = tokio::io::copy(&mut client_read, &mut server_write).await;
            });
            tokio::spawn(async move {
                use tokio::io::{AsyncReadExt, AsyncWriteExt};
                let mut buffer = [0u8; 4096];
                while let Ok(n @ 1..) = server_read.read(&mut buffer).await {
                    for byte in &buffer[..n] {
                        if client_write.write_all(std::slice::from_ref(byte)).await.is_err() {
                            return;
                        }
                        tokio::time::sleep(Duration::from_micros(100)).await;
                    }
                }
            });
        }
    });
    port
}

/// The opening's answer, in parts, with the body's statement queued behind
/// it: the call reads the parts as they come. (tokio-postgres holds back
/// every later answer on a connection until an earlier one is read: a call
/// that awaited the opening only after its body hung there, holding the
/// key's lock, as one worker of `processes.rs` did once.)
#[tokio::test]
async fn an_opening_answered_in_parts_does_not_hold_the_bodys_answer_back() {
    let Some(shop) = Shop::open("trickle").await else { return };
    let config: Config = shop.url.parse().expect("VT_POSTGRES_URL parses");
    let upstream = config.get_ports().first().copied().unwrap_or(5432);
    let mut through = Config::new();
    through.host("127.0.0.1").port(trickling(upstream).await);
    through.user(config.get_user().unwrap_or("postgres"));
    if let Some(db) = config.get_dbname() {
        through.dbname(db);
    }
    if let Some(password) = config.get_password() {
        through.password(password);
    }
    let (mut client, connection) = through.connect(NoTls).await.expect("through the link");
    tokio::spawn(connection);
    let cx = Context::new("billing").for_step("order-trickle", 1);
    let runs = AtomicU32::new(0);
    let paid =
        tokio::time::timeout(Duration::from_secs(30), shop.pay(&cx, &PAY, &mut client, 21, &runs))
            .await
            .expect("the call ends");
    assert!(matches!(paid, ToolResult::Success { proof: Proof::Response, .. }), "{paid:?}");
    assert_eq!(shop.rows(21).await, 1);
}

/// The transactional tool's record is in its own database: a context
/// without a ledger of its own makes the call as any other.
#[tokio::test]
async fn a_context_without_a_ledger_still_commits_the_record_with_the_row() {
    let Some(shop) = Shop::open("noledger").await else { return };
    let mut client = connect(&shop.url).await;
    let cx = Context::new("billing").without_ledger().for_step("order-nl", 1);
    let runs = AtomicU32::new(0);
    let paid = shop.pay(&cx, &PAY, &mut client, 31, &runs).await;
    let ToolResult::Success { key, .. } = paid else { panic!("{paid:?}") };
    assert_eq!(shop.rows(31).await, 1);
    let record = shop.ledger.record(key).await.expect("readable").expect("recorded");
    assert_eq!(record.state, RecordState::Completed);
}
