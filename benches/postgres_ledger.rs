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
//! (robust to a machine whose load drifts); the throughput of [`TASKS`]
//! concurrent tasks, each looping on claim + finish of fresh keys, against
//! the same tasks looping on the raw pair (rounds in rotating order, one
//! ratio of totals), each side on one connection its tasks share (the
//! ledger's own, opened by `connect(url)` as a user would; the floor's one
//! `Client`, which tokio-postgres pipelines alike); what [`Ledger::hold`]
//! costs against a raw `SELECT` of one row by its primary key (medians of
//! interleaved rounds); and the transactions the server committed per
//! successful engine call (`pg_stat_database.xact_commit` before and after a
//! batch of calls): each ledger operation is one statement, so these are its
//! round trips. Beside the ledger and the floor, the pairs, the throughput
//! and the hold also time the ledger's own statements sent raw on the
//! floor's client (the functions' calls with the arguments the ledger
//! sends): what the server costs, without the ledger's client-side code.
//! And a transactional tool's call (`PostgresLedger::transact`: one
//! transaction that opens the record, runs an `INSERT` and completes the
//! record) against the raw transaction it wraps (`BEGIN`, `INSERT`,
//! `COMMIT`, as tokio-postgres' `Transaction` sends them), each on a client
//! of its own: medians of interleaved pairs, medians of the same calls
//! made in alternating blocks of each side back to back, then the throughput of
//! [`TASKS`] tasks per side, each task on a client of its own (a
//! transaction holds its connection), in rotating rounds. It runs first,
//! before the ledger's sections have filled the tables autovacuum then
//! works on.
//! Everything it creates is in a schema of its own, dropped at the end.

use std::cell::Cell;
use std::hint::black_box;
use std::io;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use criterion::Criterion;
use tokio::runtime::Runtime;
use tokio_postgres::types::{ToSql, Type};
use tokio_postgres::{Client, NoTls};
use verified_tools::ledger::{
    ClaimRequest, Claimed, Codec, End, Ledger, PostgresLedger, Progress, Recorded, Settle, TxError,
};
use verified_tools::{
    Context, IdempotencyKey, PayloadDigest, RetryPolicy, SideEffect, ToolResult, ToolSpec, engine,
};

static SAVE_DRAFT: ToolSpec = ToolSpec::new("save_draft", SideEffect::Low);

/// Interleaved pairs of the paired ratio.
const PAIRS: u64 = 2_000;

/// Engine calls whose commits are counted.
const COUNTED_CALLS: u64 = 1_000;

/// Concurrent tasks of the throughput comparison.
const TASKS: u64 = 8;

/// Rounds of the throughput comparison: each runs the ledger, the floor
/// and the ledger's statements sent raw once (each round in another
/// order), for [`ROUND`] each.
const ROUNDS: u32 = 6;

/// Blocks per side of the transactional comparison's back-to-back form.
const BLOCKS: u64 = 10;

/// How long each side of one throughput round runs.
const ROUND: Duration = Duration::from_secs(2);

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

/// The floor's table and its statements.
struct Raw {
    client: Client,
    insert: String,
    update: String,
    select: String,
    /// The ledger's own statements (`sql.rs`), for [`functions`].
    claim: String,
    finish: String,
    hold: String,
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
    let raw = Arc::new(rt.block_on(raw_table(&url, &schema)));

    let next = Arc::new(AtomicU64::new(0));
    transactional(&rt, &ledger, &url, &schema, &next);

    let mut c = Criterion::default().configure_from_args();
    let (ledger_mean, floor_mean) = (Mean::default(), Mean::default());
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
    throughput(&rt, &ledger, &raw, &next);
    hold(&rt, &*ledger, &raw, &fresh);
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
        select: format!("SELECT state FROM {table} WHERE key = $1"),
        claim: format!("SELECT * FROM \"{schema}\".\"vt_claim\"($1, $2, $3, $4, $5, $6, $7, $8)"),
        finish: format!("SELECT * FROM \"{schema}\".\"vt_finish\"($1, $2, $3, $4, $5, $6)"),
        hold: format!(
            "SELECT greatest(0, (extract(epoch FROM lease_end - clock_timestamp()) * 1000000)::bigint) \
             FROM \"{schema}\".\"vt_records\" WHERE key = $1 AND fence = $2 AND state = 'held' \
             AND lease_end > clock_timestamp()"
        ),
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
/// one claim+finish, one floor and one of the ledger's own two statements
/// sent raw on the floor's client (`SELECT * FROM vt_claim(..)`, then
/// `vt_finish(..)`, with the arguments the ledger sends: what the server
/// costs without the ledger's client-side code), in rotating order,
/// [`PAIRS`] times; the medians of each.
fn paired(rt: &Runtime, ledger: &dyn Ledger, raw: &Raw, fresh: &dyn Fn() -> u64) {
    let (mut ours, mut floor, mut direct) = (Vec::new(), Vec::new(), Vec::new());
    rt.block_on(async {
        for i in 0..PAIRS {
            for which in 0..3 {
                let start = Instant::now();
                match (i + which) % 3 {
                    0 => {
                        claim_finish(ledger, fresh()).await;
                        ours.push(start.elapsed());
                    }
                    1 => {
                        insert_update(raw, fresh()).await;
                        floor.push(start.elapsed());
                    }
                    _ => {
                        // Purging as often as the ledger's finishes do.
                        functions(raw, fresh(), i % 32 == 0).await;
                        direct.push(start.elapsed());
                    }
                }
            }
        }
    });
    let (ours, floor, direct) = (median(ours), median(floor), median(direct));
    println!(
        "postgres_ledger: medians of {PAIRS} interleaved pairs: claim+finish {ours:?}, \
         floor {floor:?}, ratio {:.2}; the ledger's two statements sent raw {direct:?}, \
         {:.2} the floor",
        ours.as_secs_f64() / floor.as_secs_f64(),
        direct.as_secs_f64() / floor.as_secs_f64()
    );
}

/// The ledger's claim and finish as statements sent raw on the floor's
/// client: the functions' own cost, without the ledger's code around them.
async fn functions(raw: &Raw, n: u64, purge: bool) {
    let request = request(n);
    let key = request.key.as_u128().to_be_bytes().to_vec();
    let fingerprint = request.fingerprint.as_u128().to_be_bytes().to_vec();
    let none: Option<&[u8]> = None;
    let (lease, attempts, after_ok, settle) = (600_000_000i64, 1i64, false, 2_000_000i64);
    let claimed = raw
        .client
        .query_typed(
            &raw.claim,
            &[
                (&key, Type::BYTEA),
                (&fingerprint, Type::BYTEA),
                (&none, Type::BYTEA),
                (&none, Type::BYTEA),
                (&lease, Type::INT8),
                (&attempts, Type::INT8),
                (&after_ok, Type::BOOL),
                (&settle, Type::INT8),
            ],
        )
        .await
        .expect("postgres answers");
    let fence: i64 = claimed[0].get(2);
    let value = serde_json::to_vec(&n).expect("u64 serializes");
    let (state, ttl, purge) = ("completed", 86_400_000_000i64, if purge { 64i32 } else { 0 });
    let finished = raw
        .client
        .query_typed(
            &raw.finish,
            &[
                (&key, Type::BYTEA),
                (&fence, Type::INT8),
                (&state, Type::TEXT),
                (&value, Type::BYTEA),
                (&ttl, Type::INT8),
                (&purge, Type::INT4),
            ],
        )
        .await
        .expect("postgres answers");
    assert!(finished[0].get::<_, bool>(0), "the fence holds");
}

/// Pairs per second of [`TASKS`] tasks sharing one connection (the
/// ledger's own, or the floor's `Client`; tokio-postgres pipelines the
/// requests of both), each looping for [`ROUND`]: the ledger's claim +
/// finish, the raw `INSERT` + `UPDATE`, and the ledger's two statements
/// sent raw on the floor's client, in [`ROUNDS`] rounds (each in another
/// order); the ratios of the totals.
fn throughput(rt: &Runtime, ledger: &Arc<PostgresLedger>, raw: &Arc<Raw>, next: &Arc<AtomicU64>) {
    let run = |side: u32| {
        rt.block_on(async {
            let deadline = Instant::now() + ROUND;
            let tasks: Vec<_> = (0..TASKS)
                .map(|_| {
                    let (ledger, raw, next) =
                        (Arc::clone(ledger), Arc::clone(raw), Arc::clone(next));
                    tokio::spawn(async move {
                        let mut done = 0u64;
                        while Instant::now() < deadline {
                            let n = next.fetch_add(1, Ordering::Relaxed);
                            match side {
                                0 => claim_finish(&*ledger, n).await,
                                1 => insert_update(&raw, n).await,
                                _ => functions(&raw, n, n % 32 == 0).await,
                            }
                            done += 1;
                        }
                        done
                    })
                })
                .collect();
            let mut done = 0;
            for task in tasks {
                done += task.await.expect("a throughput task");
            }
            done
        })
    };
    let mut totals = [0u64; 3];
    for round in 0..ROUNDS {
        for which in 0..3 {
            let side = (round + which) % 3;
            totals[side as usize] += run(side);
        }
    }
    let per_second = |pairs: u64| pairs as f64 / (ROUND * ROUNDS).as_secs_f64();
    let [ours, floor, direct] = totals.map(per_second);
    println!(
        "postgres_ledger: throughput of {TASKS} tasks on one shared connection ({ROUNDS} \
         rounds of {ROUND:?}): claim+finish {ours:.0}/s, floor {floor:.0}/s, ratio {:.2}; \
         the ledger's two statements sent raw {direct:.0}/s, {:.2} the floor",
        ours / floor,
        direct / floor
    );
}

/// What asking [`Ledger::hold`] costs against a raw round trip reading a
/// row of the floor's table by its primary key (`SELECT`), and the
/// ledger's own `hold` statement sent raw on the floor's client: medians of
/// [`PAIRS`] interleaved rounds on a held key, in rotating order.
fn hold(rt: &Runtime, ledger: &dyn Ledger, raw: &Raw, fresh: &dyn Fn() -> u64) {
    let raw_key = request(fresh()).key.as_u128().to_be_bytes().to_vec();
    let request = request(fresh());
    let key = request.key.as_u128().to_be_bytes().to_vec();
    let (ours, floor, direct) = rt.block_on(async {
        let Claimed::Fresh(fence) = ledger.claim(request).await.expect("postgres answers").state
        else {
            panic!("a fresh key")
        };
        let fence_value = i64::try_from(fence.0).expect("a fence fits");
        let inserted = raw.client.query_typed(&raw.insert, &[(&raw_key, Type::BYTEA)]).await;
        inserted.expect("a fresh raw key");
        let (mut ours, mut floor, mut direct) = (Vec::new(), Vec::new(), Vec::new());
        for i in 0..PAIRS {
            for which in 0..3 {
                let start = Instant::now();
                match (i + which) % 3 {
                    0 => {
                        let left = ledger.hold(request.key, fence).await.expect("postgres answers");
                        ours.push(start.elapsed());
                        assert!(left.is_some(), "the key is held");
                    }
                    1 => {
                        let params: &[(&(dyn ToSql + Sync), Type)] = &[(&raw_key, Type::BYTEA)];
                        let rows = raw.client.query_typed(&raw.select, params).await;
                        floor.push(start.elapsed());
                        assert_eq!(rows.expect("postgres answers").len(), 1, "the row is there");
                    }
                    _ => {
                        let params: &[(&(dyn ToSql + Sync), Type)] =
                            &[(&key, Type::BYTEA), (&fence_value, Type::INT8)];
                        let rows = raw.client.query_typed(&raw.hold, params).await;
                        direct.push(start.elapsed());
                        assert_eq!(rows.expect("postgres answers").len(), 1, "the key is held");
                    }
                }
            }
        }
        ledger.finish(request.key, fence, End::Settled).await.expect("postgres answers");
        (ours, floor, direct)
    });
    let (ours, floor, direct) = (median(ours), median(floor), median(direct));
    println!(
        "postgres_ledger: medians of {PAIRS} interleaved rounds: hold {ours:?}, raw SELECT \
         {floor:?}, ratio {:.2}; the hold's statement sent raw {direct:?}, {:.2} the SELECT",
        ours.as_secs_f64() / floor.as_secs_f64(),
        direct.as_secs_f64() / floor.as_secs_f64()
    );
}

static PAY: ToolSpec = ToolSpec::new("pay", SideEffect::High);

type Paid = ToolResult<(), TxError<tokio_postgres::Error>>;

/// A transactional call against the raw transaction it wraps: [`PAIRS`]
/// interleaved pairs, each side on a client of its own; then [`TASKS`]
/// tasks per side, each on a client of its own, [`ROUNDS`] rounds of
/// [`ROUND`] in rotating order.
fn transactional(
    rt: &Runtime,
    ledger: &Arc<PostgresLedger>,
    url: &str,
    schema: &str,
    next: &Arc<AtomicU64>,
) {
    let table: Arc<str> = format!("\"{schema}\".payments").into();
    let (mut ours_client, mut theirs) = rt.block_on(async {
        let (ours, theirs) = (connect(url).await, connect(url).await);
        let create = format!("CREATE TABLE {table} (id bigserial PRIMARY KEY, n bigint NOT NULL)");
        ours.batch_execute(&create).await.expect("the payments table");
        (ours, theirs)
    });
    let cx = Context::new("bench-agent");
    // One call per entry of `order` (`true`: the transactional call), timed;
    // the medians of each side.
    let mut medians = |order: &mut dyn Iterator<Item = bool>| {
        let (mut with_tool, mut raw) = (Vec::new(), Vec::new());
        rt.block_on(async {
            for tool in order {
                let n = next.fetch_add(1, Ordering::Relaxed);
                let start = Instant::now();
                if tool {
                    pay(ledger, &cx, &mut ours_client, &table, n).await;
                    with_tool.push(start.elapsed());
                } else {
                    pay_raw(&mut theirs, &table, n).await;
                    raw.push(start.elapsed());
                }
            }
        });
        (median(with_tool), median(raw))
    };
    let (ours, floor) = medians(&mut (0..PAIRS).flat_map(|i| [i % 2 == 0, i % 2 != 0]));
    println!(
        "postgres_ledger: medians of {PAIRS} interleaved pairs: a transactional call {ours:?}, \
         raw BEGIN + INSERT + COMMIT {floor:?}, ratio {:.2}",
        ours.as_secs_f64() / floor.as_secs_f64()
    );
    // Interleaving flatters the raw side on this VM (each raw transaction
    // right after a call on another connection ran about twice as fast as
    // back to back): blocks of each side back to back, alternating.
    let blocks =
        (0..BLOCKS * 2).flat_map(|b| std::iter::repeat_n(b % 2 == 0, (PAIRS / BLOCKS) as usize));
    let (ours, floor) = medians(&mut blocks.into_iter());
    println!(
        "postgres_ledger: medians of {PAIRS} calls per side in {BLOCKS} alternating blocks: a \
         transactional call {ours:?}, raw BEGIN + INSERT + COMMIT {floor:?}, ratio {:.2}",
        ours.as_secs_f64() / floor.as_secs_f64()
    );

    let run = |tool: bool| {
        rt.block_on(async {
            let deadline = Instant::now() + ROUND;
            let mut tasks = Vec::new();
            for _ in 0..TASKS {
                let mut client = connect(url).await;
                let (ledger, cx, table, next) =
                    (Arc::clone(ledger), cx.clone(), Arc::clone(&table), Arc::clone(next));
                tasks.push(tokio::spawn(async move {
                    let mut done = 0u64;
                    while Instant::now() < deadline {
                        let n = next.fetch_add(1, Ordering::Relaxed);
                        if tool {
                            pay(&ledger, &cx, &mut client, &table, n).await;
                        } else {
                            pay_raw(&mut client, &table, n).await;
                        }
                        done += 1;
                    }
                    done
                }));
            }
            let mut done = 0;
            for task in tasks {
                done += task.await.expect("a throughput task");
            }
            done
        })
    };
    let mut totals = [0u64; 2];
    for round in 0..ROUNDS {
        for which in 0..2 {
            let tool = (round + which) % 2 == 0;
            totals[usize::from(!tool)] += run(tool);
        }
    }
    let per_second = |calls: u64| calls as f64 / (ROUND * ROUNDS).as_secs_f64();
    let [ours, floor] = totals.map(per_second);
    println!(
        "postgres_ledger: throughput of {TASKS} tasks, a client each ({ROUNDS} rounds of \
         {ROUND:?}): transactional calls {ours:.0}/s, raw BEGIN + INSERT + COMMIT {floor:.0}/s, \
         ratio {:.2}",
        ours / floor
    );
}

/// One transactional payment of `n`: its row and its record in one
/// transaction.
async fn pay(ledger: &PostgresLedger, cx: &Context, client: &mut Client, table: &str, n: u64) {
    let insert = format!("INSERT INTO {table} (n) VALUES ($1)");
    let insert = insert.as_str();
    let value = i64::try_from(n).unwrap_or(i64::MAX);
    let cx = cx.for_step("pay", n);
    let paid: Paid = ledger
        .transact(&cx, &PAY, client, &n, &n, |tx| {
            Box::pin(async move {
                tx.execute(insert, &[&value]).await?;
                Ok(())
            })
        })
        .await;
    assert!(paid.is_success(), "{paid:?}");
}

/// The same payment as a user writes it without the ledger.
async fn pay_raw(client: &mut Client, table: &str, n: u64) {
    let insert = format!("INSERT INTO {table} (n) VALUES ($1)");
    let value = i64::try_from(n).unwrap_or(i64::MAX);
    let tx = client.transaction().await.expect("BEGIN");
    tx.execute(insert.as_str(), &[&value]).await.expect("INSERT");
    tx.commit().await.expect("COMMIT");
}

async fn connect(url: &str) -> Client {
    let (client, connection) = tokio_postgres::connect(url, NoTls).await.expect("postgres answers");
    tokio::spawn(connection);
    client
}

fn median(mut v: Vec<Duration>) -> Duration {
    v.sort();
    v[v.len() / 2]
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
