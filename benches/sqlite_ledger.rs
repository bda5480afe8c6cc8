//! The SQLite ledger against its floor.
//!
//! - `sqlite_ledger/<sync>/ledger`: one successful call's ledger work through
//!   `SqliteLedger`: `claim` of a fresh key (one transaction: read, fence,
//!   insert) then `finish` with a completed value (one transaction: fenced
//!   update).
//! - `sqlite_ledger/<sync>/floor`: the same number of transactions doing the
//!   least a store must: one `INSERT` of the key, one `UPDATE` with the value,
//!   each `BEGIN IMMEDIATE ... COMMIT`, on the same file, with the same
//!   pragmas, on a connection behind a mutex, each on `spawn_blocking` (the
//!   ledger's threading).
//!
//! - `sqlite_ledger/<sync>/hold`: `Ledger::hold` of a held key (one read,
//!   no write lock): what a tool pays to ask whether it still holds its key.
//!
//! `<sync>` is `full` (the default, `synchronous = FULL`: an fsync per
//! commit) and `normal` (`synchronous = NORMAL`: no fsync per commit in WAL
//! mode, which shows the ledger's own cost). Calls run one after another on a
//! current-thread runtime.
//!
//! At the end the run prints calls/s of both and their ratio, measured in
//! alternating rounds of 500 calls on a fresh file (so that the load of a
//! shared machine weighs on both alike). `cargo bench --bench sqlite_ledger`.

use std::hint::black_box;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use criterion::{Criterion, Throughput, criterion_group};
use rusqlite::{Connection, TransactionBehavior, params};
use tokio::runtime::Runtime;
use verified_tools::ledger::{
    ClaimRequest, Claimed, End, Ledger, Progress, Recorded, Settle, SqliteLedger,
};
use verified_tools::{IdempotencyKey, PayloadDigest};

struct Value(u64);

impl Recorded for Value {
    fn local(&self) -> Arc<dyn std::any::Any + Send + Sync> {
        Arc::new(self.0)
    }

    fn encode(&self) -> Option<Vec<u8>> {
        serde_json::to_vec(&self.0).ok()
    }
}

/// A bench file, deleted with its WAL when dropped.
struct File(PathBuf);

impl File {
    fn new(tag: &str) -> Self {
        let name = format!("verified-tools-bench-{tag}-{}.db", std::process::id());
        let file = Self(std::env::temp_dir().join(name));
        file.remove();
        file
    }

    fn remove(&self) {
        for suffix in ["", "-wal", "-shm"] {
            let mut path = self.0.clone().into_os_string();
            path.push(suffix);
            let _ = std::fs::remove_file(path);
        }
    }
}

impl Drop for File {
    fn drop(&mut self) {
        self.remove();
    }
}

/// The floor's connection: the ledger's pragmas, behind a mutex.
fn floor_connection(path: &Path, full: bool) -> Arc<Mutex<Connection>> {
    let conn = Connection::open(path).unwrap();
    conn.busy_timeout(Duration::from_secs(5)).unwrap();
    let mode: String =
        conn.pragma_update_and_check(None, "journal_mode", "WAL", |r| r.get(0)).unwrap();
    assert_eq!(mode, "wal");
    conn.pragma_update(None, "synchronous", if full { "FULL" } else { "NORMAL" }).unwrap();
    conn.execute_batch(
        "CREATE TABLE IF NOT EXISTS floor (key BLOB PRIMARY KEY, value BLOB) STRICT, WITHOUT ROWID",
    )
    .unwrap();
    Arc::new(Mutex::new(conn))
}

/// One transaction of the floor, on the blocking pool.
async fn floor_tx(conn: &Arc<Mutex<Connection>>, sql: &'static str, key: [u8; 16], value: Vec<u8>) {
    let conn = Arc::clone(conn);
    tokio::task::spawn_blocking(move || {
        let mut conn = conn.lock().unwrap();
        let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate).unwrap();
        let changed = tx.prepare_cached(sql).unwrap().execute(params![key, value]).unwrap();
        assert_eq!(changed, 1);
        tx.commit().unwrap();
    })
    .await
    .unwrap();
}

fn request(n: u64) -> ClaimRequest {
    ClaimRequest {
        key: IdempotencyKey::from_u128(u128::from(n)),
        fingerprint: PayloadDigest::from_u128(1),
        previous: None,
        first: Progress { attempts: 1, after_ok: false, settle: Settle::NOW },
        now: tokio::time::Instant::now(),
    }
}

fn runtime() -> Runtime {
    tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap()
}

/// A ledger and the floor's connection on one fresh file.
struct Setup {
    _file: File,
    ledger: SqliteLedger,
    conn: Arc<Mutex<Connection>>,
    next: u64,
}

impl Setup {
    fn new(tag: &str, full: bool) -> Self {
        let file = File::new(tag);
        let ledger = SqliteLedger::open(&file.0).unwrap().with_power_loss_durability(full).unwrap();
        let conn = floor_connection(&file.0, full);
        Self { _file: file, ledger, conn, next: 0 }
    }

    /// `n` successful calls' ledger work through the ledger.
    async fn ledger(&mut self, n: u64) -> Duration {
        let start = Instant::now();
        for _ in 0..n {
            self.next += 1;
            let request = request(self.next);
            let claim = self.ledger.claim(request).await.unwrap();
            let Claimed::Fresh(fence) = claim.state else { panic!("{claim:?}") };
            let end = End::Completed(&Value(self.next));
            self.ledger.finish(request.key, fence, end).await.unwrap();
        }
        start.elapsed()
    }

    /// `n` times "am I still the holder?" (`Ledger::hold`) of one held key:
    /// what a tool pays to ask right before it sends.
    async fn hold(&mut self, n: u64) -> Duration {
        self.next += 1;
        let request = request(self.next);
        let claim = self.ledger.claim(request).await.unwrap();
        let Claimed::Fresh(fence) = claim.state else { panic!("{claim:?}") };
        let start = Instant::now();
        for _ in 0..n {
            assert!(self.ledger.hold(request.key, fence).await.unwrap().is_some());
        }
        let spent = start.elapsed();
        self.ledger.finish(request.key, fence, End::Settled).await.unwrap();
        spent
    }

    /// `n` times the floor: an INSERT and an UPDATE, in two transactions.
    async fn floor(&mut self, n: u64) -> Duration {
        let start = Instant::now();
        for _ in 0..n {
            self.next += 1;
            let key = u128::from(self.next).to_be_bytes();
            let value = serde_json::to_vec(&self.next).unwrap();
            let insert = "INSERT INTO floor (key, value) VALUES (?1, ?2)";
            floor_tx(&self.conn, insert, key, Vec::new()).await;
            floor_tx(&self.conn, "UPDATE floor SET value = ?2 WHERE key = ?1", key, value).await;
        }
        black_box(start.elapsed())
    }
}

fn sync_name(full: bool) -> &'static str {
    if full { "full" } else { "normal" }
}

fn bench_sync(c: &mut Criterion, full: bool) {
    let sync = sync_name(full);
    let rt = runtime();
    let mut setup = Setup::new(sync, full);
    let mut g = c.benchmark_group(format!("sqlite_ledger/{sync}"));
    g.throughput(Throughput::Elements(1));
    g.sample_size(10);
    g.warm_up_time(Duration::from_secs(1));
    g.measurement_time(Duration::from_secs(if full { 10 } else { 5 }));
    g.bench_function("ledger", |b| b.iter_custom(|iters| rt.block_on(setup.ledger(iters))));
    g.bench_function("floor", |b| b.iter_custom(|iters| rt.block_on(setup.floor(iters))));
    g.bench_function("hold", |b| b.iter_custom(|iters| rt.block_on(setup.hold(iters))));
    g.finish();
}

/// The ratio, measured apart from criterion: rounds of the ledger and the
/// floor alternate on one fresh file, so that a change in the machine's load
/// weighs on both alike.
fn ratio(full: bool) {
    const ROUNDS: u32 = 10;
    const CALLS: u64 = 500;
    let rt = runtime();
    let mut setup = Setup::new(&format!("ratio-{}", sync_name(full)), full);
    rt.block_on(async {
        setup.ledger(CALLS).await;
        setup.floor(CALLS).await;
        let (mut ledger, mut floor) = (Duration::ZERO, Duration::ZERO);
        for _ in 0..ROUNDS {
            ledger += setup.ledger(CALLS).await;
            floor += setup.floor(CALLS).await;
        }
        let calls = (u64::from(ROUNDS) * CALLS) as f64;
        let (ledger, floor) = (calls / ledger.as_secs_f64(), calls / floor.as_secs_f64());
        println!(
            "  synchronous={:<6} ledger {ledger:>7.0} calls/s  floor {floor:>7.0} calls/s  \
             ledger/floor {:.2}",
            sync_name(full),
            ledger / floor
        );
    });
}

fn benches(c: &mut Criterion) {
    bench_sync(c, true);
    bench_sync(c, false);
}

criterion_group!(sqlite_ledger, benches);

fn main() {
    sqlite_ledger();
    Criterion::default().configure_from_args().final_summary();
    if std::env::args().any(|a| a == "--list" || a == "--test") {
        return;
    }
    println!(
        "\nsqlite_ledger: successful calls (claim + finish of a fresh key), alternating rounds"
    );
    ratio(true);
    ratio(false);
}
