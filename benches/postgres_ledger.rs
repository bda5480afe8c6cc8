//! What the PostgreSQL ledger costs over the round trips it cannot avoid.
//!
//! Against the server of `VT_POSTGRES_URL` (skipped, with a printed line,
//! when it is unset; `eval "$(bash .ci/postgres.sh)"` starts one, with
//! `fsync = off`: run it against a server configured as in production for
//! figures that include the commit's flush). One criterion group, so the
//! ratio comes from one run on one machine:
//!
//! - `claim_finish`: a successful call's ledger traffic through
//!   [`PostgresLedger`]: a fresh key claimed (the first attempt written with
//!   it), then finished completed with a small JSON value. Two round trips,
//!   two transactions.
//! - `floor`: the same two round trips, raw, on the same connection type (a
//!   `tokio_postgres::Client`, statements sent as the ledger sends its own,
//!   with `query_typed`: one round trip each): `INSERT` of the key into a
//!   plain table, then `UPDATE` of its value, each its own transaction,
//!   each awaited before the next, as the engine awaits the claim before it
//!   dispatches and the finish after.
//! - `engine_call`: a whole successful `engine::call` of a trivial tool with
//!   the PostgreSQL ledger (key derivation, claim, dispatch, finish).
//!
//! It then prints the ratio `claim_finish / floor`: of the means over every
//! timed iteration of this run, and of the medians of interleaved pairs
//! (robust to a machine whose load drifts); and the transactions the server
//! committed per successful engine call (`pg_stat_database.xact_commit`
//! before and after a batch of calls): each ledger operation is one
//! statement, so these are its round trips. Everything it creates is in a
//! schema of its own, dropped at the end.

use std::cell::Cell;
use std::hint::black_box;
use std::io;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use criterion::Criterion;
use tokio::runtime::Runtime;
use tokio_postgres::types::Type;
use tokio_postgres::{Client, NoTls};
use verified_tools::ledger::{
    ClaimRequest, Claimed, Codec, End, Ledger, PostgresLedger, Progress, Recorded, Settle,
};
use verified_tools::{
    Context, IdempotencyKey, PayloadDigest, RetryPolicy, SideEffect, ToolResult, ToolSpec, engine,
};

static SAVE_DRAFT: ToolSpec = ToolSpec::new("save_draft", SideEffect::Low);

/// Interleaved pairs of the paired ratio.
const PAIRS: u64 = 2_000;

/// Engine calls whose commits are counted.
const COUNTED_CALLS: u64 = 1_000;

/// A mean over the timed iterations of one benchmark.
#[derive(Default)]
struct Mean {
    total: Cell<Duration>,
    iters: Cell<u64>,
}

impl Mean {
    fn add(&self, elapsed: Duration, iters: u64) {
        self.total.set(self.total.get() + elapsed);
        self.iters.set(self.iters.get() + iters);
    }

    fn get(&self) -> Duration {
        self.total.get() / u32::try_from(self.iters.get().max(1)).unwrap_or(u32::MAX)
    }
}

struct Json(u64);

impl Recorded for Json {
    fn local(&self) -> Arc<dyn std::any::Any + Send + Sync> {
        Arc::new(self.0)
    }

    fn encode(&self) -> Option<Vec<u8>> {
        serde_json::to_vec(&self.0).ok()
    }
}

/// The floor's table and its two statements.
struct Raw {
    client: Client,
    insert: String,
    update: String,
}

fn main() {
    let Ok(url) = std::env::var("VT_POSTGRES_URL") else {
        println!(
            "skipped: the postgres_ledger bench needs a PostgreSQL server in VT_POSTGRES_URL \
             (`eval \"$(bash .ci/postgres.sh)\"` starts one)"
        );
        return;
    };
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime");
    let schema = format!("vt_bench_{}", std::process::id());
    let ledger = rt
        .block_on(PostgresLedger::builder().with_schema(&schema).connect(&url))
        .expect("postgres answers");
    let ledger = Arc::new(ledger);
    let raw = rt.block_on(raw_table(&url, &schema));

    let mut c = Criterion::default().configure_from_args();
    let (ledger_mean, floor_mean) = (Mean::default(), Mean::default());
    let next = AtomicU64::new(0);
    let fresh = || next.fetch_add(1, Ordering::Relaxed);
    {
        let mut g = c.benchmark_group("postgres_ledger");
        g.bench_function("claim_finish", |b| {
            b.iter_custom(|iters| {
                let elapsed = rt.block_on(async {
                    let start = Instant::now();
                    for _ in 0..iters {
                        claim_finish(&*ledger, fresh()).await;
                    }
                    start.elapsed()
                });
                ledger_mean.add(elapsed, iters);
                elapsed
            })
        });
        g.bench_function("floor", |b| {
            b.iter_custom(|iters| {
                let elapsed = rt.block_on(async {
                    let start = Instant::now();
                    for _ in 0..iters {
                        insert_update(&raw, fresh()).await;
                    }
                    start.elapsed()
                });
                floor_mean.add(elapsed, iters);
                elapsed
            })
        });
        let cx = context(&ledger);
        g.bench_function("engine_call", |b| {
            b.iter_custom(|iters| {
                rt.block_on(async {
                    let start = Instant::now();
                    for _ in 0..iters {
                        let result = call(&cx, fresh()).await;
                        assert!(result.is_success(), "{result:?}");
                    }
                    start.elapsed()
                })
            })
        });
        g.finish();
    }
    c.final_summary();

    let (ledger_mean, floor_mean) = (ledger_mean.get(), floor_mean.get());
    println!(
        "postgres_ledger: means over criterion's iterations: claim+finish {ledger_mean:?}, \
         floor (INSERT + UPDATE) {floor_mean:?}, ratio {:.2}",
        ledger_mean.as_secs_f64() / floor_mean.as_secs_f64()
    );
    paired(&rt, &*ledger, &raw, &fresh);
    round_trips(&rt, &raw.client, &context(&ledger), &fresh);
    let dropped =
        rt.block_on(raw.client.batch_execute(&format!("DROP SCHEMA \"{schema}\" CASCADE")));
    dropped.expect("the bench's schema is dropped");
}

/// The floor's connection (as the ledger's: tokio-postgres, no TLS) and a
/// table with the ledger's key type, in the bench's schema.
async fn raw_table(url: &str, schema: &str) -> Raw {
    let (client, connection) = tokio_postgres::connect(url, NoTls).await.expect("postgres answers");
    tokio::spawn(connection);
    let table = format!("\"{schema}\".raw");
    client
        .batch_execute(&format!(
            "CREATE TABLE {table} (key bytea PRIMARY KEY, value bytea, state text NOT NULL)"
        ))
        .await
        .expect("the floor's table");
    Raw {
        client,
        insert: format!("INSERT INTO {table} (key, state) VALUES ($1, 'held')"),
        update: format!("UPDATE {table} SET value = $2, state = 'completed' WHERE key = $1"),
    }
}

fn request(n: u64) -> ClaimRequest {
    // Keys as the engine derives them: 128 uniform bits.
    let key = IdempotencyKey::from_u128(
        u128::from(n).wrapping_mul(0x9e37_79b9_7f4a_7c15_f39c_c060_5ced_c835),
    );
    let first =
        Progress { attempts: 1, after_ok: false, settle: Settle::After(Duration::from_secs(2)) };
    ClaimRequest {
        key,
        fingerprint: PayloadDigest::from_u128(u128::from(n)),
        previous: None,
        first,
        now: tokio::time::Instant::now(),
    }
}

async fn claim_finish(ledger: &dyn Ledger, n: u64) {
    let request = request(n);
    let Claimed::Fresh(fence) = ledger.claim(request).await.expect("postgres answers").state else {
        panic!("a fresh key")
    };
    ledger.finish(request.key, fence, End::Completed(&Json(n))).await.expect("postgres answers");
}

async fn insert_update(raw: &Raw, n: u64) {
    let key = request(n).key.as_u128().to_be_bytes().to_vec();
    let value = serde_json::to_vec(&n).expect("u64 serializes");
    let inserted = raw.client.query_typed(&raw.insert, &[(&key, Type::BYTEA)]).await;
    black_box(inserted.expect("a fresh raw key"));
    let updated =
        raw.client.query_typed(&raw.update, &[(&key, Type::BYTEA), (&value, Type::BYTEA)]).await;
    black_box(updated.expect("postgres answers"));
}

fn context(ledger: &Arc<PostgresLedger>) -> Context {
    Context::new("bench-agent")
        .with_policy(
            SideEffect::Low,
            RetryPolicy::for_class(SideEffect::Low).with_attempt_timeout(None),
        )
        .with_ledger(Arc::clone(ledger) as Arc<dyn Ledger>)
}

async fn call(cx: &Context, n: u64) -> ToolResult<u64, io::Error> {
    let args = (n, "quarterly report");
    // A step of its own: a durable step's key is the same whatever the
    // arguments, and other arguments under it are refused as key reuse.
    engine::call(
        &cx.for_step("run-1", n),
        &SAVE_DRAFT,
        &args,
        &args,
        |_attempt| async move { Ok(black_box(n) + 1) },
        engine::no_verifier(),
        Codec::serde(),
    )
    .await
}

/// The ratio again, robust to a machine whose load drifts during the run:
/// one claim+finish and one floor, alternately first, [`PAIRS`] times; the
/// medians of each.
fn paired(rt: &Runtime, ledger: &dyn Ledger, raw: &Raw, fresh: &dyn Fn() -> u64) {
    let (mut ours, mut floor) = (Vec::new(), Vec::new());
    rt.block_on(async {
        for i in 0..PAIRS {
            for ledger_first in [i % 2 == 0, i % 2 != 0] {
                let start = Instant::now();
                if ledger_first {
                    claim_finish(ledger, fresh()).await;
                    ours.push(start.elapsed());
                } else {
                    insert_update(raw, fresh()).await;
                    floor.push(start.elapsed());
                }
            }
        }
    });
    let median = |v: &mut Vec<Duration>| {
        v.sort();
        v[v.len() / 2]
    };
    let (ours, floor) = (median(&mut ours), median(&mut floor));
    println!(
        "postgres_ledger: medians of {PAIRS} interleaved pairs: claim+finish {ours:?}, \
         floor {floor:?}, ratio {:.2}",
        ours.as_secs_f64() / floor.as_secs_f64()
    );
}

/// Counts the transactions the server commits per successful engine call.
/// Other sessions of the database are counted too: run the bench on a
/// server nothing else uses.
fn round_trips(rt: &Runtime, admin: &Client, cx: &Context, fresh: &dyn Fn() -> u64) {
    let before = rt.block_on(commits(admin));
    rt.block_on(async {
        for _ in 0..COUNTED_CALLS {
            let result = call(cx, fresh()).await;
            assert!(result.is_success(), "{result:?}");
        }
    });
    let after = rt.block_on(commits(admin));
    // The two reads of the counter are transactions of their own.
    let per_call = (after - before - 1) as f64 / COUNTED_CALLS as f64;
    println!(
        "postgres_ledger: per successful engine call ({COUNTED_CALLS} calls): {per_call:.2} \
         transactions committed, one statement each (pg_stat_database.xact_commit)"
    );
}

/// The database's committed transactions, once every session has reported
/// its own (a busy backend reports at most once a second; one gone idle,
/// within PostgreSQL's idle interval of 10 seconds).
async fn commits(admin: &Client) -> i64 {
    tokio::time::sleep(Duration::from_secs(11)).await;
    admin.batch_execute("SELECT pg_stat_clear_snapshot()").await.expect("postgres answers");
    let row = admin
        .query_one(
            "SELECT xact_commit FROM pg_stat_database WHERE datname = current_database()",
            &[],
        )
        .await
        .expect("postgres answers");
    row.get(0)
}
