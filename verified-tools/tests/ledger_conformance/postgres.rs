//! The PostgreSQL ledger against a real server (`VT_POSTGRES_URL`, which
//! `.ci/postgres.sh` starts): the suite with two handles on their own
//! connections (what two processes see), each test in tables of its own,
//! plus what only a database across the network has: the schema (created at
//! once by racing processes, or beforehand by a migration), a dropped
//! connection, a server that does not answer, a pool that lends nothing,
//! and the operator's door.
//!
//! Every table of a run is in one schema, `vt_test_<unix time>_<pid>`, so
//! that runs never see each other's rows; a run drops the schemas of runs
//! more than an hour old. A restart of the server mid-run is not tested
//! here: the cluster of `.ci/postgres.sh` belongs to the whole CI run.
//! Its effect on the ledger, a connection that dies under it, is tested with
//! `pg_terminate_backend` on the ledger's own session.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, Once, OnceLock};
use std::time::{Duration, Instant};

use tokio::time::sleep;
use tokio_postgres::{Client, NoTls};
use verified_tools::ledger::{
    ClaimRequest, Claimed, End, Fence, Ledger, LedgerError, PostgresLedger, PostgresLedgerBuilder,
    Progress, RecordState, Recorded, Replay, Resolution, Settle,
};
use verified_tools::{CallError, Context, IdempotencyKey, Proof, ToolResult};

use crate::suite::{self, Backend, Config, SLACK, fp, request};

/// How long an operation may take to fail closed: the ledger bounds each
/// by its timeout (2 s by default); the rest is a busy machine's slack.
const FAILS_WITHIN: Duration = Duration::from_secs(6);

/// How long a test waits for something the server does in the background.
const PATIENCE: Duration = Duration::from_secs(20);

// ---------------------------------------------------------------- the suite

struct Postgres {
    url: String,
}

impl Backend for Postgres {
    async fn open(&self, config: Config) -> (Arc<dyn Ledger>, Arc<dyn Ledger>) {
        let names = names();
        let open = || async {
            let ledger = names.clone().connect(&self.url).await.expect("postgres answers");
            Arc::new(ledger.with_lease(config.lease).with_ttl(config.ttl)) as Arc<dyn Ledger>
        };
        (open().await, open().await)
    }
}

crate::conformance!(server().map(|url| Postgres { url }), paused = false, operator = true);

// ---------------------------------------------------------------- helpers

/// The run's server, its stale test schemas dropped once; `None` (and one
/// line on stderr, or a failure under CI) when there is none.
fn server() -> Option<String> {
    let url = crate::support::postgres::url()?;
    static JANITOR: Once = Once::new();
    JANITOR.call_once(|| {
        // A thread of its own: the caller may be on a runtime already.
        let url = url.clone();
        let janitor = std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
            rt.block_on(drop_stale_schemas(&url));
        });
        let _ = janitor.join();
    });
    Some(url)
}

/// The schema of this run's tables.
fn run_schema() -> &'static str {
    static SCHEMA: OnceLock<String> = OnceLock::new();
    SCHEMA.get_or_init(|| format!("vt_test_{}_{}", unix_secs(), std::process::id()))
}

fn unix_secs() -> u64 {
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH);
    now.map_or(0, |d| d.as_secs())
}

/// Drops the test schemas of runs more than an hour old (a run still going
/// that long is not this one's to keep).
async fn drop_stale_schemas(url: &str) {
    let Ok(admin) = try_admin(url).await else { return };
    let Ok(rows) = admin
        .query("SELECT nspname::text FROM pg_namespace WHERE nspname LIKE 'vt\\_test\\_%'", &[])
        .await
    else {
        return;
    };
    for row in rows {
        let name: String = row.get(0);
        let started = name.split('_').nth(2).and_then(|secs| secs.parse::<u64>().ok());
        if started.is_some_and(|secs| secs + 3600 < unix_secs()) {
            let _ = admin.batch_execute(&format!("DROP SCHEMA IF EXISTS \"{name}\" CASCADE")).await;
        }
    }
}

/// Names no other test (nor another run) uses: the run's schema, a prefix
/// of the test's own.
fn names() -> PostgresLedgerBuilder {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let n = NEXT.fetch_add(1, Ordering::Relaxed);
    PostgresLedger::builder().with_schema(run_schema()).with_prefix(format!("t{n}_"))
}

async fn try_admin(url: &str) -> Result<Client, tokio_postgres::Error> {
    let (client, connection) = tokio_postgres::connect(url, NoTls).await?;
    tokio::spawn(connection);
    Ok(client)
}

/// A session of the test's own, as an operator or another program has.
async fn admin(url: &str) -> Client {
    try_admin(url).await.expect("postgres answers")
}

/// The qualified name of a ledger's table.
fn table(ledger: &PostgresLedger) -> String {
    format!("\"{}\".\"{}records\"", ledger.schema(), ledger.prefix())
}

/// Keys of these tests (each test has its own tables: they never meet).
fn k(n: u64) -> IdempotencyKey {
    IdempotencyKey::from_u128((0x9a5_u128 << 64) | u128::from(n))
}

fn key_bytes(key: IdempotencyKey) -> Vec<u8> {
    key.as_u128().to_be_bytes().to_vec()
}

struct Value(u64);

impl Recorded for Value {
    fn local(&self) -> Arc<dyn std::any::Any + Send + Sync> {
        Arc::new(self.0)
    }

    fn encode(&self) -> Option<Vec<u8>> {
        Some(serde_json::to_vec(&self.0).expect("u64 serializes"))
    }
}

async fn state(ledger: &dyn Ledger, key: IdempotencyKey) -> Claimed {
    ledger.claim(request(key, fp(1))).await.expect("the store answers").state
}

async fn fresh(ledger: &dyn Ledger, key: IdempotencyKey) -> Fence {
    match state(ledger, key).await {
        Claimed::Fresh(fence) => fence,
        other => panic!("expected a fresh claim of {key}, got {other:?}"),
    }
}

async fn left_in_doubt(ledger: &dyn Ledger, key: IdempotencyKey) -> Fence {
    let fence = fresh(ledger, key).await;
    ledger.finish(key, fence, End::InDoubt).await.expect("the holder finishes");
    fence
}

fn replayed(claimed: &Claimed) -> Option<u64> {
    match claimed {
        Claimed::Completed(Replay::Encoded(bytes)) => serde_json::from_slice(bytes).ok(),
        _ => None,
    }
}

fn unavailable<T: std::fmt::Debug>(result: &Result<T, LedgerError>) -> bool {
    matches!(result, Err(LedgerError::Unavailable(_)))
}

async fn count(admin: &Client, ledger: &PostgresLedger) -> i64 {
    let rows = admin.query(&format!("SELECT count(*) FROM {}", table(ledger)), &[]).await;
    rows.expect("the table is there")[0].get(0)
}

/// Holds the row lock of `key`'s record in an open transaction of `admin`,
/// as a long transaction of another program would.
async fn lock_row(admin: &Client, ledger: &PostgresLedger, key: IdempotencyKey) {
    admin.batch_execute("BEGIN").await.unwrap();
    let locked = admin
        .query(
            &format!("SELECT 1 FROM {} WHERE key = $1 FOR UPDATE", table(ledger)),
            &[&key_bytes(key)],
        )
        .await
        .unwrap();
    assert_eq!(locked.len(), 1, "the record is there to lock");
}

/// The server process of the ledger's session that waits for a row lock.
async fn waiting_backend(admin: &Client, ledger: &PostgresLedger) -> i32 {
    let pattern = format!("%\"{}claim\"%", like(ledger.prefix()));
    let started = Instant::now();
    loop {
        // `admin` is inside the transaction that holds the lock, and a
        // transaction sees `pg_stat_activity` as it was on its first read:
        // without this, a claim that began to wait after that read is
        // never seen (a loaded machine: 1 run in 8 waited the whole 20 s).
        admin.batch_execute("SELECT pg_stat_clear_snapshot()").await.unwrap();
        let rows = admin
            .query(
                "SELECT pid FROM pg_stat_activity
                 WHERE wait_event_type = 'Lock' AND query LIKE $1 AND pid <> pg_backend_pid()",
                &[&pattern],
            )
            .await
            .unwrap();
        if let Some(row) = rows.first() {
            return row.get(0);
        }
        assert!(started.elapsed() < PATIENCE, "the ledger's claim never waited for the lock");
        sleep(Duration::from_millis(20)).await;
    }
}

/// `name` as a `LIKE` pattern matches it: its `_` (a wildcard there)
/// escaped, so that test `t1_` does not match the sessions of `t10_`..`t19_`.
fn like(name: &str) -> String {
    name.replace('_', "\\_")
}

/// Ends the server sessions whose last statement called this ledger's
/// functions, other than `admin`'s own; answers how many.
async fn terminate_sessions(admin: &Client, ledger: &PostgresLedger) -> i64 {
    let pattern = format!("%\"{}\".\"{}%", like(ledger.schema()), like(ledger.prefix()));
    let rows = admin
        .query(
            "SELECT count(*) FILTER (WHERE pg_terminate_backend(pid)) FROM pg_stat_activity
             WHERE query LIKE $1 AND pid <> pg_backend_pid()",
            &[&pattern],
        )
        .await
        .unwrap();
    rows[0].get(0)
}

/// Claims until `key` is taken over in doubt (a hold being abandoned in
/// the background), or fails after [`PATIENCE`].
async fn resumed_soon(ledger: &dyn Ledger, key: IdempotencyKey) -> (Fence, Progress) {
    let started = Instant::now();
    loop {
        match state(ledger, key).await {
            Claimed::Resume(fence, progress) => return (fence, progress),
            Claimed::InFlight(_) if started.elapsed() < PATIENCE => {
                sleep(Duration::from_millis(20)).await;
            }
            other => panic!("the key was to be resumed in doubt, got {other:?}"),
        }
    }
}

// ---------------------------------------------------------------- the schema

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn processes_starting_at_once_create_the_schema_once() {
    let Some(url) = server() else { return };
    let names = names();
    let openings: Vec<_> = (0..6)
        .map(|_| {
            let (names, url) = (names.clone(), url.clone());
            tokio::spawn(async move { names.connect(&url).await })
        })
        .collect();
    let mut ledgers = Vec::new();
    for opening in openings {
        ledgers.push(opening.await.unwrap().expect("every process opens the ledger"));
    }
    let admin = admin(&url).await;
    let functions: i64 = admin
        .query_one(
            "SELECT count(*) FROM pg_proc
             WHERE pronamespace = to_regnamespace($1) AND starts_with(proname, $2)",
            &[&ledgers[0].schema(), &ledgers[0].prefix()],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(
        functions, 11,
        "claim, dispatching, finish, abandon, purge, record, in_doubt, resolve, tx_open, \
         tx_complete, version"
    );
    // They are one ledger: a key claimed by one is in flight for the others.
    fresh(&ledgers[0], k(1)).await;
    for ledger in &ledgers[1..] {
        assert!(matches!(state(ledger, k(1)).await, Claimed::InFlight(_)));
    }
    // Opening again, the schema there, creates nothing and needs no right to.
    let again = names.with_schema_creation(false).connect(&url).await.expect("the schema is there");
    assert!(matches!(state(&again, k(1)).await, Claimed::InFlight(_)));
}

#[tokio::test]
async fn a_schema_made_by_a_migration_is_used_and_its_version_checked() {
    let Some(url) = server() else { return };
    let admin = admin(&url).await;
    let names = names();
    // Without the schema, and told not to create it: refused, saying how.
    let refused = names.clone().with_schema_creation(false).connect(&url).await;
    match &refused {
        Err(LedgerError::Unavailable(why)) => {
            assert!(why.message().contains("schema_sql"), "{why}")
        }
        other => panic!("a missing schema is refused, got {other:?}"),
    }
    // The migration: the DDL as the docs give it, run twice (idempotent).
    let ddl = names.schema_sql().unwrap();
    admin.batch_execute(&ddl).await.expect("the DDL runs");
    admin.batch_execute(&ddl).await.expect("the DDL runs again");
    let ledger = names.clone().with_schema_creation(false).connect(&url).await.unwrap();
    let fence = fresh(&ledger, k(1)).await;
    ledger.finish(k(1), fence, End::Completed(&Value(5))).await.unwrap();
    assert_eq!(replayed(&state(&ledger, k(1)).await), Some(5));
    // A table dropped by hand: refused without schema creation, made again
    // with it (a handle open meanwhile fails closed).
    admin.batch_execute(&format!("DROP TABLE {}", table(&ledger))).await.unwrap();
    assert!(unavailable(&ledger.claim(request(k(1), fp(1))).await));
    match names.clone().with_schema_creation(false).connect(&url).await {
        Err(LedgerError::Unavailable(why)) => {
            assert!(why.message().contains("incomplete"), "{why}")
        }
        other => panic!("an incomplete schema is refused, got {other:?}"),
    }
    let again = names.clone().connect(&url).await.expect("the table is made again");
    fresh(&again, k(1)).await;
    // A schema of version 1 (before transactional tools): refused without
    // schema creation, saying how to upgrade; upgraded in place with it.
    let (schema, prefix) = (ledger.schema(), ledger.prefix());
    let version = |n: u32| {
        format!(
            "CREATE OR REPLACE FUNCTION \"{schema}\".\"{prefix}schema_version\"() RETURNS integer
             LANGUAGE sql IMMUTABLE AS $$ SELECT {n} $$"
        )
    };
    let tx_open = format!("\"{schema}\".\"{prefix}tx_open\"");
    admin
        .batch_execute(&format!(
            "DROP FUNCTION {tx_open}; DROP FUNCTION \"{schema}\".\"{prefix}tx_complete\"; {}",
            version(1)
        ))
        .await
        .unwrap();
    match names.clone().with_schema_creation(false).connect(&url).await {
        Err(LedgerError::Unavailable(why)) => {
            assert!(why.message().contains("version 1") && why.message().contains("upgrades"))
        }
        other => panic!("an older schema is refused without creation, got {other:?}"),
    }
    let upgraded = names.clone().connect(&url).await.expect("version 1 is upgraded");
    let found: Option<String> = admin
        .query_one(&format!("SELECT to_regproc('{tx_open}')::text"), &[])
        .await
        .unwrap()
        .get(0);
    assert!(found.is_some(), "the upgrade added the transactional functions");
    // `again` still holds k(1): the upgrade kept the records.
    assert!(matches!(state(&upgraded, k(1)).await, Claimed::InFlight(_)));
    // A schema of a later version is not written into.
    admin.batch_execute(&version(3)).await.unwrap();
    match names.connect(&url).await {
        Err(LedgerError::Unavailable(why)) => assert!(why.message().contains("version 3"), "{why}"),
        other => panic!("a newer schema is refused, got {other:?}"),
    }
}

#[tokio::test]
async fn bad_names_and_unreachable_servers_fail_closed_at_once() {
    // No server needed: nothing here reaches one.
    let bad = PostgresLedger::builder().with_prefix("vt\"; DROP TABLE x; --");
    match bad.connect("postgres://postgres@127.0.0.1:1/postgres").await {
        Err(LedgerError::Unavailable(why)) => assert!(why.message().contains("prefix"), "{why}"),
        other => panic!("a prefix that cannot be quoted is refused, got {other:?}"),
    }
    let bad = PostgresLedger::builder().with_schema("");
    assert!(unavailable(&bad.schema_sql()));
    let garbled = PostgresLedger::connect("postgres://[::1").await;
    assert!(unavailable(&garbled), "{garbled:?}");
    let started = Instant::now();
    let closed = PostgresLedger::connect("postgres://postgres@127.0.0.1:1/postgres").await;
    assert!(unavailable(&closed), "{closed:?}");
    assert!(started.elapsed() < FAILS_WITHIN, "failed after {:?}", started.elapsed());
}

// ---------------------------------------------------------------- records

#[tokio::test]
async fn records_are_seen_by_a_later_handle_and_fences_keep_growing() {
    let Some(url) = server() else { return };
    let names = names();
    let lease = Duration::from_secs(2);
    let settle = Duration::from_secs(30);
    let (done, doubt, held) = (k(1), k(2), k(3));
    let last = {
        let ledger = names.clone().connect(&url).await.unwrap().with_lease(lease);
        let fence = fresh(&ledger, done).await;
        ledger.finish(done, fence, End::Completed(&Value(41))).await.unwrap();
        let fence = fresh(&ledger, doubt).await;
        let second = Progress { attempts: 2, after_ok: true, settle: Settle::After(settle) };
        ledger.dispatching(doubt, fence, second).await.unwrap();
        ledger.finish(doubt, fence, End::InDoubt).await.unwrap();
        // This process ends holding a key: its hold is in the table too.
        fresh(&ledger, held).await
    };
    let ledger = names.connect(&url).await.unwrap().with_lease(lease);
    assert_eq!(replayed(&state(&ledger, done).await), Some(41), "the value is replayed");
    match state(&ledger, doubt).await {
        Claimed::Resume(fence, progress) => {
            assert!(fence > last, "the fence sequence is the database's: {fence} > {last}");
            assert_eq!((progress.attempts, progress.after_ok), (2, true));
            let Settle::After(left) = progress.settle else { panic!("a settle time was kept") };
            assert!(left <= settle && left > settle - Duration::from_secs(10), "{left:?}");
        }
        other => panic!("the call in doubt is still in doubt, got {other:?}"),
    }
    match state(&ledger, held).await {
        Claimed::InFlight(left) => assert!(left <= lease, "{left:?}"),
        other => panic!("the hold outlives its process until its lease ends, got {other:?}"),
    }
    sleep(lease + SLACK).await;
    match state(&ledger, held).await {
        Claimed::Resume(_, progress) => assert_eq!(progress.attempts, 1),
        other => panic!("past its lease the hold is taken over in doubt, got {other:?}"),
    }
}

#[tokio::test]
async fn expired_records_are_purged_records_in_doubt_never() {
    let Some(url) = server() else { return };
    let admin = admin(&url).await;
    // Long enough that no record expires before the test means it to.
    let ttl = Duration::from_secs(2);
    let ledger = names().connect(&url).await.unwrap().with_ttl(ttl);
    left_in_doubt(&ledger, k(9000)).await;
    fresh(&ledger, k(9001)).await; // held
    // Finishes 2..=41 of this handle (the 33rd purges: nothing expired yet).
    for n in 0..40 {
        let fence = fresh(&ledger, k(n)).await;
        ledger.finish(k(n), fence, End::Completed(&Value(n))).await.unwrap();
    }
    assert_eq!(count(&admin, &ledger).await, 42);
    sleep(ttl + SLACK).await;
    // Expired, they are absent to a claim at once.
    assert_eq!(ledger.record(k(0)).await, Ok(None));
    // Finishes 42..=64: no purge; the 65th purges the 40 expired ones.
    for n in 100..123 {
        let fence = fresh(&ledger, k(n)).await;
        ledger.finish(k(n), fence, End::Settled).await.unwrap();
    }
    assert_eq!(count(&admin, &ledger).await, 65, "expired records wait for the next purge");
    let fence = fresh(&ledger, k(200)).await;
    ledger.finish(k(200), fence, End::Settled).await.unwrap();
    assert_eq!(count(&admin, &ledger).await, 26, "the periodic purge deleted the 40 expired");
    sleep(ttl + SLACK).await;
    assert_eq!(ledger.purge_expired().await, Ok(24));
    assert_eq!(count(&admin, &ledger).await, 2, "the records in doubt and held stay");
    assert!(matches!(state(&ledger, k(9000)).await, Claimed::Resume(..)));
}

// ---------------------------------------------------------------- connections

#[tokio::test]
async fn a_dropped_connection_fails_closed_then_reconnects() {
    let Some(url) = server() else { return };
    let admin = admin(&url).await;
    // The claim waits for the lock as long as the test looks for it: with
    // the default bound (2 s) it gave up before a loaded machine saw it wait.
    let ledger = names().with_timeout(PATIENCE).connect(&url).await.unwrap();
    let key = k(1);
    left_in_doubt(&ledger, key).await;

    // Mid-statement: the claim waits for a row lock when its session dies.
    lock_row(&admin, &ledger, key).await;
    let claim = tokio::spawn({
        let ledger = ledger.clone();
        async move { ledger.claim(request(key, fp(1))).await }
    });
    let pid = waiting_backend(&admin, &ledger).await;
    let started = Instant::now();
    admin.query("SELECT pg_terminate_backend($1)", &[&pid]).await.unwrap();
    let claim = claim.await.unwrap();
    assert!(unavailable(&claim), "the claim in flight fails closed: {claim:?}");
    assert!(started.elapsed() < FAILS_WITHIN, "failed after {:?}", started.elapsed());
    admin.batch_execute("ROLLBACK").await.unwrap();
    // The next operation connects anew; the claim that died rolled back.
    let (fence, progress) = match state(&ledger, key).await {
        Claimed::Resume(fence, progress) => (fence, progress),
        other => panic!("the record in doubt is intact, got {other:?}"),
    };
    assert_eq!(progress.attempts, 1);

    // Idle: the session dies between two operations. The next one fails
    // closed if the client had not noticed yet (else it reconnects first),
    // and the one after reconnects; the hold is intact throughout.
    assert_eq!(terminate_sessions(&admin, &ledger).await, 1);
    let second = Progress { attempts: 2, after_ok: false, settle: Settle::NOW };
    let write = ledger.dispatching(key, fence, second).await;
    if write.is_err() {
        assert!(unavailable(&write), "{write:?}");
        ledger.dispatching(key, fence, second).await.expect("reconnected");
    }
    ledger.finish(key, fence, End::InDoubt).await.expect("the holder finishes");
    match state(&ledger, key).await {
        Claimed::Resume(_, progress) => assert_eq!(progress.attempts, 2),
        other => panic!("in doubt with both attempts, got {other:?}"),
    }
}

#[tokio::test]
async fn a_server_that_does_not_answer_fails_closed_and_the_late_claim_holds_nothing() {
    let Some(url) = server() else { return };
    let admin = admin(&url).await;
    let timeout = Duration::from_millis(500);
    let names = names().with_timeout(timeout);
    let ledger = names.clone().connect(&url).await.unwrap();
    let other = names.connect(&url).await.unwrap();
    let (key, elsewhere) = (k(1), k(2));
    left_in_doubt(&ledger, key).await;
    let held = fresh(&ledger, elsewhere).await;

    lock_row(&admin, &ledger, key).await;
    let started = Instant::now();
    let claim = ledger.claim(request(key, fp(1))).await;
    match &claim {
        Err(LedgerError::Unavailable(why)) => assert!(why.message().contains("no answer"), "{why}"),
        other => panic!("a claim that gets no answer fails closed, got {other:?}"),
    }
    assert!(started.elapsed() < FAILS_WITHIN, "failed after {:?}", started.elapsed());
    // The handle does not queue behind the stuck statement: its next
    // operation runs on a new connection, at once.
    let second = Progress { attempts: 2, after_ok: false, settle: Settle::NOW };
    ledger.dispatching(elsewhere, held, second).await.expect("a new connection answers");
    // The statement lands once the lock is released, and finds its caller
    // gone: the hold is abandoned, not kept for the lease (10 minutes).
    admin.batch_execute("ROLLBACK").await.unwrap();
    let (_, progress) = resumed_soon(&other, key).await;
    assert_eq!(progress.attempts, 1);
}

#[tokio::test]
async fn a_claim_given_up_while_it_waits_holds_nothing() {
    let Some(url) = server() else { return };
    let admin = admin(&url).await;
    let names = names();
    let ledger = names.clone().connect(&url).await.unwrap();
    let other = names.connect(&url).await.unwrap();
    let key = k(1);
    left_in_doubt(&ledger, key).await;
    lock_row(&admin, &ledger, key).await;
    // The call's deadline strikes while its claim waits for the lock.
    let waited =
        tokio::time::timeout(Duration::from_millis(200), ledger.claim(request(key, fp(1))));
    assert!(waited.await.is_err(), "the claim waits for the lock");
    admin.batch_execute("COMMIT").await.unwrap();
    // The claim got the lock after its caller was gone: it took the key
    // over, and gave it up at once.
    let (_, progress) = resumed_soon(&other, key).await;
    assert_eq!(progress.attempts, 1);
}

#[tokio::test]
async fn a_client_of_the_application_is_shared_and_fails_closed_once_gone() {
    let Some(url) = server() else { return };
    let admin = admin(&url).await;
    let ledger = names().on_client(try_admin(&url).await.unwrap()).await.unwrap();
    // Concurrent claims of one key, pipelined on the one connection.
    let claims: Vec<_> = (0..16)
        .map(|_| {
            let ledger = ledger.clone();
            tokio::spawn(async move { ledger.claim(request(k(1), fp(1))).await })
        })
        .collect();
    let mut holders = 0;
    for claim in claims {
        match claim.await.unwrap().expect("the store answers").state {
            Claimed::Fresh(_) => holders += 1,
            Claimed::InFlight(_) => {}
            other => panic!("a concurrent claim got {other:?}"),
        }
    }
    assert_eq!(holders, 1);
    // The application's connection dies: the ledger cannot reconnect it.
    assert_eq!(terminate_sessions(&admin, &ledger).await, 1);
    for _ in 0..2 {
        let started = Instant::now();
        let claim = ledger.claim(request(k(2), fp(1))).await;
        assert!(unavailable(&claim), "{claim:?}");
        assert!(started.elapsed() < FAILS_WITHIN);
    }
}

/// A pool as small as can be: connections kept in a vector, one lent per
/// checkout and handed back when the checkout is dropped; `down` makes it
/// lend nothing, as a pool does while the database is unreachable.
#[derive(Clone)]
struct TinyPool {
    url: String,
    idle: Arc<Mutex<Vec<Client>>>,
    down: Arc<AtomicBool>,
}

struct Checkout {
    client: Option<Client>,
    idle: Arc<Mutex<Vec<Client>>>,
}

impl Drop for Checkout {
    fn drop(&mut self) {
        if let Some(client) = self.client.take() {
            self.idle.lock().unwrap().push(client);
        }
    }
}

impl TinyPool {
    async fn get(self) -> Result<Checkout, String> {
        if self.down.load(Ordering::SeqCst) {
            return Err("the database is down".into());
        }
        let idle = self.idle.lock().unwrap().pop();
        let client = match idle {
            Some(client) => client,
            None => try_admin(&self.url).await.map_err(|e| e.to_string())?,
        };
        Ok(Checkout { client: Some(client), idle: self.idle })
    }
}

#[tokio::test]
async fn the_engine_on_a_pool_replays_and_refuses_calls_while_it_lends_nothing() {
    let Some(url) = server() else { return };
    let pool = TinyPool { url: url.clone(), idle: Arc::default(), down: Arc::default() };
    let ledger = names()
        .on_pool(
            {
                let pool = pool.clone();
                move || pool.clone().get()
            },
            |checkout: &Checkout| -> &Client { checkout.client.as_ref().expect("lent") },
        )
        .await
        .expect("the pool lends a connection");
    // Concurrent claims on several of the pool's connections: one holder.
    let claims: Vec<_> = (0..8)
        .map(|_| {
            let ledger = ledger.clone();
            tokio::spawn(async move { ledger.claim(request(k(1), fp(1))).await })
        })
        .collect();
    let mut holders = 0;
    for claim in claims {
        holders += usize::from(matches!(claim.await.unwrap().unwrap().state, Claimed::Fresh(_)));
    }
    assert_eq!(holders, 1);

    let cx = Context::new("billing").with_ledger(Arc::new(ledger));
    let invoices = suite::Invoices::default();
    let call = |invoice: u64| invoices.send(&cx, invoice);
    assert!(matches!(call(1).await, ToolResult::Success { value: 1, .. }));
    match call(1).await {
        ToolResult::Success { value: 1, proof: Proof::Ledger, .. } => {}
        other => panic!("the repeat is replayed from the ledger, got {other:?}"),
    }
    assert_eq!(invoices.dispatched(), 1);

    pool.down.store(true, Ordering::SeqCst);
    let started = Instant::now();
    match call(2).await {
        ToolResult::Refused(CallError::Ledger { source: LedgerError::Unavailable(_), .. }) => {}
        other => panic!("a call is refused while the pool lends nothing, got {other:?}"),
    }
    assert!(started.elapsed() < FAILS_WITHIN, "refused after {:?}", started.elapsed());
    assert_eq!(invoices.dispatched(), 1, "nothing was dispatched");

    pool.down.store(false, Ordering::SeqCst);
    assert!(matches!(call(2).await, ToolResult::Success { value: 2, .. }));
    assert_eq!(invoices.dispatched(), 2);
}

/// The `tokio_postgres::Error` beneath a ledger error, reached by `source()`.
fn pg_source(error: &LedgerError) -> &tokio_postgres::Error {
    let store = std::error::Error::source(error).expect("the StoreError");
    let pg = store.source().expect("tokio-postgres' error, kept");
    pg.downcast_ref::<tokio_postgres::Error>().expect("a tokio_postgres::Error")
}

/// `url` naming the database `dbname` instead of its own.
fn with_dbname(url: &str, dbname: &str) -> String {
    for scheme in ["postgres://", "postgresql://"] {
        if let Some(rest) = url.strip_prefix(scheme) {
            let (rest, query) = rest.split_once('?').map_or((rest, ""), |(r, q)| (r, q));
            let authority = rest.split_once('/').map_or(rest, |(a, _)| a);
            let query = if query.is_empty() { String::new() } else { format!("?{query}") };
            return format!("{scheme}{authority}/{dbname}{query}");
        }
    }
    format!("{url} dbname={dbname}")
}

#[tokio::test]
async fn failures_keep_tokio_postgres_error_as_their_source() {
    // Refused before any server is asked: tokio-postgres reads no port.
    let error = names().connect("postgres://localhost:no-port/db").await.expect_err("a bad URL");
    assert!(matches!(error, LedgerError::Unavailable(_)), "{error:?}");
    let pg = pg_source(&error);
    assert!(pg.as_db_error().is_none(), "{pg:?}");
    assert!(error.to_string().starts_with("the ledger's store is unavailable: postgres: "));

    // The server's refusal, SQLSTATE and all: a database that does not exist.
    let Some(url) = server() else { return };
    let nowhere = with_dbname(&url, "vt_no_such_database");
    let error = names().connect(&nowhere).await.expect_err("no such database");
    assert!(matches!(error, LedgerError::Unavailable(_)), "{error:?}");
    let pg = pg_source(&error);
    assert_eq!(pg.code(), Some(&tokio_postgres::error::SqlState::INVALID_CATALOG_NAME), "{pg:?}");
    assert!(error.to_string().contains("3D000"), "{error}");
}

// ---------------------------------------------------------------- the operator's door

#[tokio::test]
async fn an_operator_sees_records_in_doubt_and_held_ones_as_they_are() {
    let Some(url) = server() else { return };
    let lease = Duration::from_millis(600);
    let names = names();
    let ledger = names.clone().connect(&url).await.unwrap().with_lease(lease);
    let operator = names.connect(&url).await.unwrap();
    let (doubt, done, settled, held, lapsed) = (k(1), k(2), k(3), k(4), k(5));
    let settle = Settle::After(Duration::from_secs(30));
    let fence =
        fresh_with(&ledger, ClaimRequest { first: suite::first(settle), ..request(doubt, fp(1)) })
            .await;
    let second = Progress { attempts: 2, after_ok: true, settle };
    ledger.dispatching(doubt, fence, second).await.unwrap();
    ledger.finish(doubt, fence, End::InDoubt).await.unwrap();
    let fence = fresh(&ledger, done).await;
    ledger.finish(done, fence, End::Completed(&Value(1))).await.unwrap();
    let fence = fresh(&ledger, settled).await;
    ledger.finish(settled, fence, End::Settled).await.unwrap();
    fresh(&ledger, lapsed).await;
    sleep(lease + SLACK).await;
    fresh(&ledger, held).await;

    let mut listed = operator.in_doubt(100).await.unwrap();
    listed.sort_by_key(|view| view.key);
    let keys: Vec<_> = listed.iter().map(|view| (view.key, view.state)).collect();
    assert_eq!(keys, [(doubt, RecordState::InDoubt), (lapsed, RecordState::InDoubt)]);
    let view = listed[0];
    assert_eq!((view.progress.attempts, view.progress.after_ok), (2, true));
    let Settle::After(left) = view.progress.settle else { panic!("a settle time was kept") };
    assert!(left <= Duration::from_secs(30) && left > Duration::from_secs(20), "{left:?}");
    assert_eq!(operator.in_doubt(1).await.unwrap().len(), 1, "the limit binds");
    assert!(operator.in_doubt(0).await.unwrap().is_empty());

    let shown = |key| {
        let operator = &operator;
        async move { operator.record(key).await.unwrap().map(|view| view.state) }
    };
    assert_eq!(shown(doubt).await, Some(RecordState::InDoubt));
    assert_eq!(shown(done).await, Some(RecordState::Completed));
    assert_eq!(shown(settled).await, Some(RecordState::Settled));
    assert_eq!(shown(held).await, Some(RecordState::Held));
    assert_eq!(shown(lapsed).await, Some(RecordState::InDoubt), "past its lease");
    assert_eq!(shown(k(99)).await, None);
    // Looking changed nothing: the next call still verifies first.
    let (_, progress) = match state(&ledger, doubt).await {
        Claimed::Resume(fence, progress) => (fence, progress),
        other => panic!("still in doubt, got {other:?}"),
    };
    assert_eq!(progress.attempts, 2);
}

async fn fresh_with(ledger: &dyn Ledger, request: ClaimRequest) -> Fence {
    match ledger.claim(request).await.expect("the store answers").state {
        Claimed::Fresh(fence) => fence,
        other => panic!("expected a fresh claim, got {other:?}"),
    }
}

#[tokio::test]
async fn a_decision_changes_only_a_record_in_doubt_and_fences_its_holder() {
    let Some(url) = server() else { return };
    let lease = Duration::from_millis(600);
    let names = names();
    let ledger = names.clone().connect(&url).await.unwrap().with_lease(lease);
    let operator = names.connect(&url).await.unwrap();
    let (applied, not_applied, held, done, lapsed) = (k(1), k(2), k(3), k(4), k(5));
    left_in_doubt(&ledger, applied).await;
    left_in_doubt(&ledger, not_applied).await;
    let old = fresh(&ledger, lapsed).await;
    sleep(lease + SLACK).await;
    let holder = fresh(&ledger, held).await;
    let fence = fresh(&ledger, done).await;
    ledger.finish(done, fence, End::Completed(&Value(4))).await.unwrap();

    let resolve = |key, resolution| {
        let operator = &operator;
        async move { operator.resolve(key, resolution).await.expect("the store resolves") }
    };
    // What a call proved, or holds, is left as it is.
    assert_eq!(resolve(held, Resolution::NotApplied).await, Some(RecordState::Held));
    assert_eq!(resolve(done, Resolution::NotApplied).await, Some(RecordState::Completed));
    assert_eq!(resolve(k(99), Resolution::Applied).await, None);
    assert_eq!(operator.record(k(99)).await, Ok(None), "resolving created nothing");
    ledger.finish(held, holder, End::Completed(&Value(8))).await.expect("the holder still holds");
    assert_eq!(replayed(&state(&ledger, done).await), Some(4));

    // Applied: completed without a value; a repeat verifies, never dispatches.
    assert_eq!(resolve(applied, Resolution::Applied).await, Some(RecordState::InDoubt));
    assert!(matches!(state(&ledger, applied).await, Claimed::Completed(Replay::Unrecorded)));
    assert_eq!(resolve(applied, Resolution::NotApplied).await, Some(RecordState::Completed));
    // Not applied: settled now, with the key's whole budget.
    assert_eq!(resolve(not_applied, Resolution::NotApplied).await, Some(RecordState::InDoubt));
    let settled_now = Progress { attempts: 0, after_ok: false, settle: Settle::NOW };
    let view = operator.record(not_applied).await.unwrap().expect("a record");
    assert_eq!((view.state, view.progress), (RecordState::Settled, settled_now));
    match state(&ledger, not_applied).await {
        Claimed::Resume(_, progress) => assert_eq!(progress, settled_now),
        other => panic!("resumed with every attempt, got {other:?}"),
    }

    // A holder presumed dead (past its lease) wakes up after the decision:
    // none of its writes lands over it.
    assert_eq!(resolve(lapsed, Resolution::NotApplied).await, Some(RecordState::InDoubt));
    let late = Progress { attempts: 2, after_ok: false, settle: Settle::NOW };
    assert_eq!(ledger.dispatching(lapsed, old, late).await, Err(LedgerError::Fenced(old)));
    let end = End::Completed(&Value(9));
    assert_eq!(ledger.finish(lapsed, old, end).await, Err(LedgerError::Fenced(old)));
    match state(&operator, lapsed).await {
        Claimed::Resume(new, progress) => {
            assert!(new > old, "fence {new} after {old}");
            assert_eq!(progress.attempts, 0, "the decision stands");
        }
        other => panic!("the decided record is resumed, got {other:?}"),
    }
}

#[tokio::test]
async fn decided_records_expire_like_finished_ones() {
    let Some(url) = server() else { return };
    let ttl = Duration::from_millis(1500);
    let ledger = names().connect(&url).await.unwrap().with_ttl(ttl);
    let (applied, not_applied, doubt) = (k(1), k(2), k(3));
    for key in [applied, not_applied, doubt] {
        left_in_doubt(&ledger, key).await;
    }
    assert_eq!(ledger.resolve(applied, Resolution::Applied).await, Ok(Some(RecordState::InDoubt)));
    let decided = ledger.resolve(not_applied, Resolution::NotApplied).await;
    assert_eq!(decided, Ok(Some(RecordState::InDoubt)));
    sleep(ttl + SLACK).await;
    assert_eq!(ledger.record(applied).await, Ok(None));
    assert_eq!(ledger.record(not_applied).await, Ok(None));
    fresh(&ledger, applied).await;
    fresh(&ledger, not_applied).await;
    let listed = ledger.in_doubt(10).await.unwrap();
    assert_eq!(listed.iter().map(|view| view.key).collect::<Vec<_>>(), [doubt]);
}
