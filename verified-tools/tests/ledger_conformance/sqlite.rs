//! The SQLite ledger on a real file: the suite with two handles on one file
//! (what two processes of a host see), then what only a file has: records
//! outlive the process, a store that cannot write fails closed and loses
//! nothing, and the engine on top of both.
//!
//! Two tests run this binary again as a child process (`child_process`
//! below): one to kill it with SIGKILL mid-run, one to run it with a file
//! size limit (`ulimit -f`), so that the kernel refuses its writes once the
//! write-ahead log reaches it, as a full disk does. The tests run as root
//! here, where file permissions stop nothing; a file size limit binds root
//! too, and fails the ledger's real writes, through its real code, with the
//! errors of a full disk.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::time::Duration;

use tokio::time::sleep;
use verified_tools::ledger::{
    Claim, ClaimRequest, Claimed, Codec, End, Fence, Ledger, LedgerError, LedgerFuture, Progress,
    RecordState, RecordView, Recorded, Replay, Resolution, Settle, SqliteLedger,
};
use verified_tools::{
    CallError, Context, IdempotencyKey, Proof, SideEffect, ToolResult, ToolSpec, engine,
};

use crate::suite::{Backend, Config, SLACK, fp, request};

// ---------------------------------------------------------------- the suite

/// A fresh file in the temp directory, deleted with its WAL and shared
/// memory files when dropped.
pub struct TempDb(PathBuf);

impl TempDb {
    pub fn new(tag: &str) -> Self {
        static N: AtomicU64 = AtomicU64::new(0);
        let n = N.fetch_add(1, Ordering::Relaxed);
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.subsec_nanos());
        let name = format!("verified-tools-{tag}-{}-{n}-{nanos}.db", std::process::id());
        Self(std::env::temp_dir().join(name))
    }

    pub fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for TempDb {
    fn drop(&mut self) {
        for suffix in ["", "-wal", "-shm", "-journal"] {
            let mut path = self.0.clone().into_os_string();
            path.push(suffix);
            let _ = std::fs::remove_file(path);
        }
    }
}

/// A handle that keeps its temporary file until the last handle is gone.
struct OnFile {
    ledger: SqliteLedger,
    _db: Arc<TempDb>,
}

impl Ledger for OnFile {
    fn claim(&self, request: ClaimRequest) -> LedgerFuture<'_, Claim> {
        self.ledger.claim(request)
    }

    fn dispatching(&self, key: IdempotencyKey, fence: Fence, p: Progress) -> LedgerFuture<'_, ()> {
        self.ledger.dispatching(key, fence, p)
    }

    fn finish<'a>(
        &'a self,
        key: IdempotencyKey,
        fence: Fence,
        end: End<'a>,
    ) -> LedgerFuture<'a, ()> {
        self.ledger.finish(key, fence, end)
    }

    fn abandon(&self, key: IdempotencyKey, fence: Fence) {
        self.ledger.abandon(key, fence)
    }

    fn lease(&self) -> Duration {
        self.ledger.lease()
    }

    fn hold(&self, key: IdempotencyKey, fence: Fence) -> LedgerFuture<'_, Option<Duration>> {
        self.ledger.hold(key, fence)
    }

    fn record(&self, key: IdempotencyKey) -> LedgerFuture<'_, Option<RecordView>> {
        self.ledger.record(key)
    }

    fn in_doubt(&self, limit: usize) -> LedgerFuture<'_, Vec<RecordView>> {
        self.ledger.in_doubt(limit)
    }

    fn resolve(
        &self,
        key: IdempotencyKey,
        resolution: Resolution,
    ) -> LedgerFuture<'_, Option<RecordState>> {
        self.ledger.resolve(key, resolution)
    }
}

struct Sqlite;

impl Backend for Sqlite {
    async fn open(&self, config: Config) -> (Arc<dyn Ledger>, Arc<dyn Ledger>) {
        let db = Arc::new(TempDb::new("suite"));
        // Two connections on one file: what two processes of the host see.
        let open = || -> Arc<dyn Ledger> {
            let ledger = SqliteLedger::open(db.path()).expect("the file opens");
            let ledger = ledger.with_lease(config.lease).with_ttl(config.ttl);
            Arc::new(OnFile { ledger, _db: Arc::clone(&db) })
        };
        (open(), open())
    }
}

crate::conformance!(Some(Sqlite), paused = false, operator = true);

// ---------------------------------------------------------------- helpers

/// Keys of these tests (each test has its own file: they never meet).
fn k(n: u64) -> IdempotencyKey {
    IdempotencyKey::from_u128((0x5eed_u128 << 64) | u128::from(n))
}

/// A value that serializes as JSON.
struct Value(u64);

impl Recorded for Value {
    fn local(&self) -> Arc<dyn std::any::Any + Send + Sync> {
        Arc::new(self.0)
    }

    fn encode(&self) -> Option<Vec<u8>> {
        Some(serde_json::to_vec(&self.0).expect("u64 serializes"))
    }
}

async fn state(ledger: &dyn Ledger, key: IdempotencyKey, n: u128) -> Claimed {
    ledger.claim(request(key, fp(n))).await.expect("the store answers").state
}

async fn fresh(ledger: &dyn Ledger, key: IdempotencyKey, n: u128) -> Fence {
    match state(ledger, key, n).await {
        Claimed::Fresh(fence) => fence,
        other => panic!("expected a fresh claim of {key}, got {other:?}"),
    }
}

/// The value a completed key replays.
fn replayed(claimed: &Claimed) -> Option<u64> {
    match claimed {
        Claimed::Completed(Replay::Encoded(bytes)) => serde_json::from_slice(bytes).ok(),
        _ => None,
    }
}

fn unavailable(result: &Result<impl std::fmt::Debug, LedgerError>) -> bool {
    matches!(result, Err(LedgerError::Unavailable(_)))
}

/// Another connection on the file, as another process has.
fn raw(db: &TempDb) -> rusqlite::Connection {
    let conn = rusqlite::Connection::open(db.path()).expect("the file opens");
    conn.busy_timeout(Duration::from_secs(5)).expect("a busy timeout");
    conn
}

fn count(conn: &rusqlite::Connection) -> i64 {
    conn.query_row("SELECT count(*) FROM records", [], |r| r.get(0)).expect("records count")
}

static SEND: ToolSpec = ToolSpec::new("send_invoice", SideEffect::High).with_verifier();

/// One logical call through the engine (its key is that of step 1 of
/// `run-1`, whatever the context's ledger): the dispatches are counted.
async fn send_invoice(
    ledger: Arc<dyn Ledger>,
    sent: &AtomicU32,
) -> ToolResult<u64, std::io::Error> {
    let cx = Context::new("billing").with_ledger(ledger).for_step("run-1", 1);
    engine::call(
        &cx,
        &SEND,
        &("acme", 250u32),
        &("acme", 250u32),
        |_attempt| {
            sent.fetch_add(1, Ordering::SeqCst);
            async { Ok(4242u64) }
        },
        engine::no_verifier(),
        Codec::serde(),
    )
    .await
}

// ---------------------------------------------------------------- the file

#[tokio::test]
async fn records_survive_closing_and_reopening_the_file() {
    let db = TempDb::new("reopen");
    let lease = Duration::from_secs(2);
    let settle = Duration::from_secs(30);
    let (done, doubt, held) = (k(1), k(2), k(3));
    let last = {
        let ledger = SqliteLedger::open(db.path()).unwrap().with_lease(lease);
        let fence = fresh(&ledger, done, 1).await;
        ledger.finish(done, fence, End::Completed(&Value(41))).await.unwrap();
        let fence = fresh(&ledger, doubt, 2).await;
        let second = Progress { attempts: 2, after_ok: true, settle: Settle::After(settle) };
        ledger.dispatching(doubt, fence, second).await.unwrap();
        ledger.finish(doubt, fence, End::InDoubt).await.unwrap();
        // This process ends holding a key: its hold is in the file too.
        fresh(&ledger, held, 3).await
    };
    let ledger = SqliteLedger::open(db.path()).unwrap().with_lease(lease);
    assert_eq!(replayed(&state(&ledger, done, 1).await), Some(41), "the value is replayed");
    match state(&ledger, doubt, 2).await {
        Claimed::Resume(fence, progress) => {
            assert!(fence > last, "the fence counter is in the file: {fence} > {last}");
            assert_eq!((progress.attempts, progress.after_ok), (2, true));
            let Settle::After(left) = progress.settle else { panic!("a settle time was kept") };
            assert!(left <= settle && left > settle - Duration::from_secs(5), "{left:?}");
        }
        other => panic!("the call in doubt is still in doubt, got {other:?}"),
    }
    match state(&ledger, held, 3).await {
        Claimed::InFlight(left) => assert!(left <= lease, "{left:?}"),
        other => panic!("the hold outlives its process until its lease ends, got {other:?}"),
    }
    sleep(lease + SLACK).await;
    match state(&ledger, held, 3).await {
        Claimed::Resume(_, progress) => assert_eq!(progress.attempts, 1),
        other => panic!("past its lease the hold is taken over in doubt, got {other:?}"),
    }
}

#[test]
#[cfg(unix)]
fn records_survive_the_process_being_killed() {
    let db = TempDb::new("killed");
    drop(SqliteLedger::open(db.path()).unwrap());
    let mut child = Guard(child("killed", db.path(), None).stdout(Stdio::piped()).spawn().unwrap());
    let stdout = child.0.stdout.take().unwrap();
    let ready = BufReader::new(stdout).lines().map_while(Result::ok).any(|line| line == "READY");
    assert!(ready, "the child wrote its records");
    child.0.kill().unwrap(); // SIGKILL: no destructor, no checkpoint, no close.
    child.0.wait().unwrap();

    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    rt.block_on(async {
        let ledger = SqliteLedger::open(db.path()).unwrap();
        assert_eq!(replayed(&state(&ledger, k(1), 1).await), Some(7));
        match state(&ledger, k(2), 2).await {
            Claimed::Resume(_, progress) => assert_eq!(progress.attempts, 3),
            other => panic!("the call in doubt is still in doubt, got {other:?}"),
        }
        assert!(matches!(state(&ledger, k(3), 3).await, Claimed::InFlight(_)), "still held");
    });
}

async fn child_killed(path: &Path) {
    let ledger = SqliteLedger::open(path).unwrap();
    let fence = fresh(&ledger, k(1), 1).await;
    ledger.finish(k(1), fence, End::Completed(&Value(7))).await.unwrap();
    let fence = fresh(&ledger, k(2), 2).await;
    let third = Progress { attempts: 3, after_ok: false, settle: Settle::NOW };
    ledger.dispatching(k(2), fence, third).await.unwrap();
    ledger.finish(k(2), fence, End::InDoubt).await.unwrap();
    fresh(&ledger, k(3), 3).await;
    println!("READY");
    // Killed here (a parent that failed first kills it when its guard drops).
    std::thread::sleep(Duration::from_secs(60));
}

// ---------------------------------------------------------------- a full disk

#[test]
#[cfg(unix)]
fn a_full_disk_fails_closed_and_loses_nothing() {
    let db = TempDb::new("full");
    drop(SqliteLedger::open(db.path()).unwrap());
    // 256 blocks of 512 bytes (dash; 1 KiB in bash): the schema and the
    // WAL's shared memory fit, a few dozen transactions do not.
    let output = child("disk_full", db.path(), Some(256)).output().unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "the child failed ({:?}):\n{stdout}\n{}",
        output.status,
        String::from_utf8_lossy(&output.stderr)
    );
    let done: Vec<u64> =
        stdout.lines().filter_map(|l| l.strip_prefix("DONE ")?.parse().ok()).collect();
    let failed = stdout.lines().find_map(|l| l.strip_prefix("FAILED ")).expect("a write failed");
    let (n, op) = failed.split_once(' ').expect("FAILED n op");
    let n: u64 = n.parse().unwrap();
    assert!(!done.is_empty() && n == done.len() as u64, "{stdout}");
    assert!(stdout.contains("ENGINE_REFUSED"), "{stdout}");

    // Space again: every call the child finished is there, the one it was
    // writing is as it was before the failed transaction, and writes work.
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    rt.block_on(async {
        let ledger = SqliteLedger::open(db.path()).unwrap();
        for &d in &done {
            assert_eq!(replayed(&state(&ledger, k(d), 1).await), Some(d), "call {d} replays");
        }
        match (op, state(&ledger, k(n), 1).await) {
            // The claim was rolled back: nothing half-written.
            ("claim", Claimed::Fresh(fence)) => {
                ledger.finish(k(n), fence, End::Completed(&Value(n))).await.unwrap()
            }
            // The claim had committed: the key is held (then in doubt).
            ("finish", Claimed::InFlight(_)) => {}
            (op, other) => panic!("after a failed {op}: {other:?}"),
        }
        let fence = fresh(&ledger, k(1000), 1).await;
        ledger.finish(k(1000), fence, End::Completed(&Value(1000))).await.unwrap();
        assert_eq!(replayed(&state(&ledger, k(1000), 1).await), Some(1000));
        // The engine's call, refused by the child, goes through now.
        let sent = AtomicU32::new(0);
        let result = send_invoice(Arc::new(ledger), &sent).await;
        assert!(matches!(result, ToolResult::Success { value: 4242, proof: Proof::Response, .. }));
        assert_eq!(sent.load(Ordering::SeqCst), 1);
    });
}

async fn child_disk_full(path: &Path) {
    let ledger = Arc::new(SqliteLedger::open(path).unwrap());
    let mut failure = None;
    for n in 0..10_000 {
        let fence = match ledger.claim(request(k(n), fp(1))).await {
            Ok(Claim { state: Claimed::Fresh(fence), .. }) => fence,
            Ok(other) => panic!("a fresh key, got {other:?}"),
            Err(error) => {
                failure = Some((n, "claim", error));
                break;
            }
        };
        match ledger.finish(k(n), fence, End::Completed(&Value(n))).await {
            Ok(()) => println!("DONE {n}"),
            Err(error) => {
                failure = Some((n, "finish", error));
                break;
            }
        }
    }
    let (n, op, error) = failure.expect("the file size limit stops the writes");
    assert!(matches!(error, LedgerError::Unavailable(_)), "{error:?}");
    eprintln!("the {op} of call {n} failed: {error}");
    println!("FAILED {n} {op}");
    // Still full: writes keep failing, typed; replays only read, and go on.
    let next = ledger.claim(request(k(n + 1), fp(1))).await;
    assert!(unavailable(&next), "{next:?}");
    if n > 0 {
        assert_eq!(replayed(&state(&*ledger, k(0), 1).await), Some(0));
    }
    // Through the engine: refused before anything is dispatched.
    let sent = AtomicU32::new(0);
    match send_invoice(ledger, &sent).await {
        ToolResult::Refused(CallError::Ledger { source: LedgerError::Unavailable(_), .. }) => {}
        other => panic!("a call is refused while the store cannot write, got {other:?}"),
    }
    assert_eq!(sent.load(Ordering::SeqCst), 0, "nothing was dispatched");
    println!("ENGINE_REFUSED");
}

// ---------------------------------------------------------------- the engine

#[tokio::test]
async fn the_engine_replays_a_completed_call_from_another_process() {
    let db = TempDb::new("engine");
    let sent = AtomicU32::new(0);
    let first = send_invoice(Arc::new(SqliteLedger::open(db.path()).unwrap()), &sent).await;
    assert!(matches!(first, ToolResult::Success { value: 4242, proof: Proof::Response, .. }));
    assert_eq!(sent.load(Ordering::SeqCst), 1);
    // Another process: another connection on the file.
    let again = send_invoice(Arc::new(SqliteLedger::open(db.path()).unwrap()), &sent).await;
    assert!(
        matches!(again, ToolResult::Success { value: 4242, proof: Proof::Ledger, .. }),
        "{again:?}"
    );
    assert_eq!(sent.load(Ordering::SeqCst), 1, "the repeat did not dispatch");
}

#[tokio::test]
async fn a_locked_store_fails_closed_then_comes_back() {
    let db = TempDb::new("locked");
    let ledger = Arc::new(
        SqliteLedger::open(db.path())
            .unwrap()
            .with_busy_timeout(Duration::from_millis(100))
            .unwrap(),
    );
    let fence = fresh(&*ledger, k(1), 1).await;
    // Another process takes the write lock and hangs.
    let other = raw(&db);
    other.execute_batch("BEGIN IMMEDIATE").unwrap();
    let second = Progress { attempts: 2, after_ok: false, settle: Settle::NOW };
    assert!(unavailable(&ledger.claim(request(k(2), fp(2))).await));
    assert!(unavailable(&ledger.dispatching(k(1), fence, second).await));
    assert!(unavailable(&ledger.finish(k(1), fence, End::Settled).await));
    let sent = AtomicU32::new(0);
    match send_invoice(Arc::clone(&ledger) as Arc<dyn Ledger>, &sent).await {
        ToolResult::Refused(CallError::Ledger { source: LedgerError::Unavailable(_), .. }) => {}
        other => panic!("refused while the store is locked, got {other:?}"),
    }
    assert_eq!(sent.load(Ordering::SeqCst), 0, "nothing was dispatched");
    other.execute_batch("COMMIT").unwrap();
    // Back: the hold is intact, and the failed writes changed nothing.
    ledger.dispatching(k(1), fence, second).await.unwrap();
    ledger.finish(k(1), fence, End::Settled).await.unwrap();
    match state(&*ledger, k(1), 1).await {
        Claimed::Resume(_, progress) => assert_eq!(progress.attempts, 2),
        other => panic!("settled, with its attempts, got {other:?}"),
    }
    assert!(
        matches!(state(&*ledger, k(2), 2).await, Claimed::Fresh(_)),
        "the failed claim left nothing"
    );
    let result = send_invoice(ledger, &sent).await;
    assert!(matches!(result, ToolResult::Success { proof: Proof::Response, .. }), "{result:?}");
    assert_eq!(sent.load(Ordering::SeqCst), 1);
}

#[tokio::test]
async fn a_claim_given_up_while_it_waits_holds_nothing() {
    let db = TempDb::new("given-up");
    let ledger =
        SqliteLedger::open(db.path()).unwrap().with_busy_timeout(Duration::from_secs(5)).unwrap();
    let other = raw(&db);
    other.execute_batch("BEGIN IMMEDIATE").unwrap();
    // The call's deadline strikes while its claim waits for the lock.
    let waited =
        tokio::time::timeout(Duration::from_millis(100), ledger.claim(request(k(1), fp(1))));
    assert!(waited.await.is_err(), "the claim waits for the lock");
    other.execute_batch("COMMIT").unwrap();
    // The claim's transaction got the lock after its caller was gone: it
    // rolled back, instead of holding the key for a lease nobody knows of.
    assert!(matches!(state(&ledger, k(1), 1).await, Claimed::Fresh(_)));
}

#[tokio::test]
async fn a_lock_held_past_the_busy_timeout_is_waited_out() {
    let db = TempDb::new("busy");
    let busy = Duration::from_millis(1500);
    let ledger = SqliteLedger::open(db.path()).unwrap().with_busy_timeout(busy).unwrap();
    let other = raw(&db);
    other.execute_batch("BEGIN IMMEDIATE").unwrap();
    let claiming = ledger.claim(request(k(1), fp(1)));
    let release = async {
        // Past the busy timeout, well within twice it.
        sleep(busy + Duration::from_millis(300)).await;
        other.execute_batch("COMMIT").unwrap();
    };
    let (claim, ()) = tokio::join!(claiming, release);
    match claim {
        Ok(Claim { state: Claimed::Fresh(_), .. }) => {}
        other => panic!("the claim waits the lock out, got {other:?}"),
    }
}

#[tokio::test]
async fn a_write_through_given_up_while_it_waits_counts_no_attempt() {
    let db = TempDb::new("given-up-write");
    let ledger = SqliteLedger::open(db.path()).unwrap();
    let fence = fresh(&ledger, k(1), 1).await;
    let other = raw(&db);
    other.execute_batch("BEGIN IMMEDIATE").unwrap();
    // The call's deadline strikes while its write-through waits: the
    // attempt is not dispatched, so it must not be counted.
    let second = Progress { attempts: 2, after_ok: false, settle: Settle::NOW };
    let waited =
        tokio::time::timeout(Duration::from_millis(100), ledger.dispatching(k(1), fence, second));
    assert!(waited.await.is_err(), "the write-through waits for the lock");
    other.execute_batch("COMMIT").unwrap();
    ledger.finish(k(1), fence, End::InDoubt).await.unwrap();
    match state(&ledger, k(1), 1).await {
        Claimed::Resume(_, progress) => assert_eq!(progress.attempts, 1),
        other => panic!("in doubt, got {other:?}"),
    }
}

// ---------------------------------------------------------------- expiry

#[tokio::test]
async fn expired_records_are_purged_records_in_doubt_never() {
    let db = TempDb::new("purge");
    // Long enough that no record expires before the test means it to, even
    // with a build beside it (82 transactions first, without an fsync each).
    let ttl = Duration::from_secs(4);
    let ledger = SqliteLedger::open(db.path())
        .unwrap()
        .with_ttl(ttl)
        .with_power_loss_durability(false)
        .unwrap();
    let conn = raw(&db);
    let doubt = fresh(&ledger, k(9000), 1).await;
    ledger.finish(k(9000), doubt, End::InDoubt).await.unwrap();
    fresh(&ledger, k(9001), 1).await; // held
    // Finishes 2..=41 of this handle (the 33rd purges: nothing expired yet).
    for n in 0..40 {
        let fence = fresh(&ledger, k(n), 1).await;
        ledger.finish(k(n), fence, End::Completed(&Value(n))).await.unwrap();
    }
    assert_eq!(count(&conn), 42);
    sleep(ttl + SLACK).await;
    // Finishes 42..=64: no purge; the 65th purges the 40 expired ones.
    for n in 100..123 {
        let fence = fresh(&ledger, k(n), 1).await;
        ledger.finish(k(n), fence, End::Settled).await.unwrap();
    }
    assert_eq!(count(&conn), 65, "expired records wait for the next purge");
    let fence = fresh(&ledger, k(200), 1).await;
    ledger.finish(k(200), fence, End::Settled).await.unwrap();
    assert_eq!(count(&conn), 26, "the periodic purge deleted the 40 expired records");
    sleep(ttl + SLACK).await;
    assert_eq!(ledger.purge_expired().await, Ok(24));
    assert_eq!(count(&conn), 2, "the records in doubt and held stay");
    assert!(matches!(state(&ledger, k(9000), 1).await, Claimed::Resume(..)));
}

// ---------------------------------------------------------------- the operator's listing

#[tokio::test]
async fn the_listing_walks_the_whole_table_a_chunk_at_a_time() {
    let db = TempDb::new("walk");
    // Thousands of transactions: no fsync each, the file is thrown away.
    let ledger = SqliteLedger::open(db.path()).unwrap().with_power_loss_durability(false).unwrap();
    // Past two chunks of 512, with records in doubt on both sides of each
    // boundary (keys are walked in their order: n's).
    let doubt = [0, 511, 512, 513, 1023, 1024, 1199];
    for n in 0..1200 {
        let fence = fresh(&ledger, k(n), 1).await;
        let end = if doubt.contains(&n) { End::InDoubt } else { End::Settled };
        ledger.finish(k(n), fence, end).await.unwrap();
    }
    let mut listed: Vec<_> = ledger.in_doubt(100).await.unwrap().iter().map(|v| v.key).collect();
    listed.sort();
    assert_eq!(listed, doubt.map(k));
    let three = ledger.in_doubt(3).await.unwrap();
    assert_eq!(three.iter().map(|v| v.key).collect::<Vec<_>>(), [k(0), k(511), k(512)]);
}

// ---------------------------------------------------------------- bad files

#[tokio::test]
async fn files_that_are_not_ledgers_are_refused_typed() {
    let missing = std::env::temp_dir().join("verified-tools-no-such-dir/ledger.db");
    assert!(matches!(SqliteLedger::open(missing), Err(LedgerError::Unavailable(_))));

    let garbage = TempDb::new("garbage");
    std::fs::write(garbage.path(), vec![0x5a; 4096]).unwrap();
    let opened = SqliteLedger::open(garbage.path());
    assert!(matches!(opened, Err(LedgerError::Corrupt(_))), "{opened:?}");

    let foreign = TempDb::new("foreign");
    raw(&foreign).execute_batch("CREATE TABLE invoices (id INTEGER)").unwrap();
    let opened = SqliteLedger::open(foreign.path());
    assert!(
        matches!(&opened, Err(LedgerError::Unavailable(m)) if m.message().contains("another application"))
    );

    // A record that cannot be read back.
    let db = TempDb::new("bad-record");
    let ledger = SqliteLedger::open(db.path()).unwrap();
    let fence = fresh(&ledger, k(1), 1).await;
    ledger.finish(k(1), fence, End::InDoubt).await.unwrap();
    let conn = raw(&db);
    conn.execute_batch(
        "PRAGMA ignore_check_constraints = ON; UPDATE records SET attempts = 1 << 40",
    )
    .unwrap();
    let claimed = ledger.claim(request(k(1), fp(1))).await;
    assert!(matches!(claimed, Err(LedgerError::Corrupt(_))), "{claimed:?}");
}

/// The `rusqlite::Error` beneath a ledger error, reached by `source()`.
fn sqlite_source(error: &LedgerError) -> &rusqlite::Error {
    let store = std::error::Error::source(error).expect("the StoreError");
    let sqlite = store.source().expect("SQLite's error, kept");
    sqlite.downcast_ref::<rusqlite::Error>().expect("a rusqlite::Error")
}

#[tokio::test]
async fn failures_keep_sqlites_error_as_their_source() {
    use rusqlite::ErrorCode;

    let missing = std::env::temp_dir().join("verified-tools-no-such-dir/ledger.db");
    let error = SqliteLedger::open(&missing).expect_err("no such directory");
    assert!(matches!(error, LedgerError::Unavailable(_)), "{error:?}");
    assert_eq!(sqlite_source(&error).sqlite_error_code(), Some(ErrorCode::CannotOpen));
    // The message reads as before: the path, then SQLite's words.
    let prefix = format!("the ledger's store is unavailable: {}: ", missing.display());
    assert!(error.to_string().starts_with(&prefix), "{error}");

    let garbage = TempDb::new("garbage-source");
    std::fs::write(garbage.path(), vec![0x5a; 4096]).unwrap();
    let error = SqliteLedger::open(garbage.path()).expect_err("not a database");
    assert!(matches!(error, LedgerError::Corrupt(_)), "{error:?}");
    assert_eq!(sqlite_source(&error).sqlite_error_code(), Some(ErrorCode::NotADatabase));

    // A refusal of the ledger's own has no error beneath it.
    let foreign = TempDb::new("foreign-source");
    raw(&foreign).execute_batch("CREATE TABLE invoices (id INTEGER)").unwrap();
    let error = SqliteLedger::open(foreign.path()).expect_err("another application's");
    let store = std::error::Error::source(&error).expect("the StoreError");
    assert!(store.source().is_none(), "{error:?}");
}

// ---------------------------------------------------------------- child processes

const CHILD: &str = "VERIFIED_TOOLS_SQLITE_CHILD";

/// This binary again, running `child_process` in `mode` on `path`, under a
/// file size limit of `blocks` if set (SIGXFSZ ignored: writes past it fail
/// with EFBIG instead of killing the process).
fn child(mode: &str, path: &Path, blocks: Option<u32>) -> Command {
    let limit = blocks.map_or(String::new(), |b| format!("ulimit -f {b} && "));
    let mut command = Command::new("/bin/sh");
    command
        .arg("-c")
        .arg(format!("trap '' XFSZ && {limit}exec \"$0\" \"$@\""))
        .arg(std::env::current_exe().expect("this test binary"))
        .args(["sqlite::child_process", "--exact", "--ignored", "--nocapture"])
        .args(["--test-threads=1"])
        .env(CHILD, format!("{mode}:{}", path.display()));
    command
}

/// Kills the child if the test fails before it does.
struct Guard(Child);

impl Drop for Guard {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// The body of the child processes above; does nothing when run by hand.
#[test]
#[ignore = "run as a child process by the tests that kill it or fill its disk"]
fn child_process() {
    let Ok(task) = std::env::var(CHILD) else { return };
    let (mode, path) = task.split_once(':').expect("mode:path");
    let path = PathBuf::from(path);
    // libtest wrote "test ... " without a newline: the markers get lines of their own.
    println!();
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    match mode {
        "killed" => rt.block_on(child_killed(&path)),
        "disk_full" => rt.block_on(child_disk_full(&path)),
        _ => panic!("unknown child mode {mode}"),
    }
}
