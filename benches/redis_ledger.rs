//! What the Redis ledger costs over the round trips it cannot avoid.
//!
//! Against the server of `VT_REDIS_URL` (skipped, with a printed line, when
//! it is unset; `.ci/run` shows how to start one: AOF, `appendfsync always`,
//! so every write waits for an fsync, as in production). One criterion group,
//! so the ratio comes from one run on one machine:
//!
//! - `claim_finish`: a successful call's ledger traffic through
//!   [`RedisLedger`]: a fresh key claimed (the first attempt written with it),
//!   then finished completed with a small JSON value. Two round trips.
//! - `floor`: the same two round trips, raw, on the same connection type (a
//!   `redis` `ConnectionManager`): `SET key v NX PX ttl`, then
//!   `SET key v2 XX PX ttl`, each awaited before the next, as the engine
//!   awaits the claim before it dispatches and the finish after.
//! - `engine_call`: a whole successful `engine::call` of a trivial tool with
//!   the Redis ledger (key derivation, claim, dispatch, finish).
//!
//! It then prints the ratio `claim_finish / floor`: of the means over every
//! timed iteration of this run, and of the medians of interleaved pairs
//! (robust to a machine whose load drifts); the throughput of [`TASKS`]
//! concurrent tasks, each looping on claim + finish of fresh keys, against
//! the same tasks looping on the raw pair (alternating rounds, one ratio);
//! what [`Ledger::hold`] costs against a raw `HGET` of the same record
//! (medians of interleaved pairs); and the commands Redis ran per successful
//! engine call (`INFO commandstats` before and after a batch of calls):
//! `evalsha` is the round trips, the others ran inside the scripts, each
//! with Redis's own time per call (`usec_per_call`).

use std::cell::Cell;
use std::hint::black_box;
use std::io;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use criterion::Criterion;
use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use tokio::runtime::Runtime;
use verified_tools::ledger::{
    ClaimRequest, Claimed, Codec, End, Ledger, Progress, Recorded, RedisLedger, Settle,
};
use verified_tools::{
    Context, IdempotencyKey, PayloadDigest, RetryPolicy, SideEffect, ToolResult, ToolSpec, engine,
};

static SAVE_DRAFT: ToolSpec = ToolSpec::new("save_draft", SideEffect::Low);

/// Records and raw keys expire after this: the bench leaves nothing behind.
const TTL: Duration = Duration::from_secs(60);

/// Interleaved pairs of the paired ratio.
const PAIRS: u64 = 2_000;

/// Engine calls whose Redis commands are counted.
const COUNTED_CALLS: u64 = 1_000;

/// Concurrent tasks of the throughput comparison.
const TASKS: u64 = 8;

/// Rounds of the throughput comparison: each runs the ledger and the floor
/// once (alternately first), for [`ROUND`] each.
const ROUNDS: u32 = 6;

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

fn main() {
    let Ok(url) = std::env::var("VT_REDIS_URL") else {
        println!(
            "skipped: the redis_ledger bench needs a Redis server in VT_REDIS_URL \
             (e.g. redis-server --port 6379 --appendonly yes --appendfsync always, \
             then VT_REDIS_URL=redis://127.0.0.1:6379/)"
        );
        return;
    };
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime");
    let prefix = format!("vt-bench:{}:", std::process::id());
    let ledger = rt.block_on(RedisLedger::connect(&url)).expect("redis answers");
    let ledger = Arc::new(ledger.with_prefix(prefix.clone()).with_ttl(TTL));
    let raw = rt.block_on(raw_connection(&url));

    let mut c = Criterion::default().configure_from_args();
    let (ledger_mean, floor_mean) = (Mean::default(), Mean::default());
    let next = Arc::new(AtomicU64::new(0));
    let fresh = || next.fetch_add(1, Ordering::Relaxed);
    {
        let mut g = c.benchmark_group("redis_ledger");
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
                let mut conn = raw.clone();
                let elapsed = rt.block_on(async {
                    let start = Instant::now();
                    for _ in 0..iters {
                        set_nx_set_xx(&mut conn, &prefix, fresh()).await;
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
        "redis_ledger: means over criterion's iterations: claim+finish {ledger_mean:?}, \
         floor (2 raw SETs) {floor_mean:?}, ratio {:.2}",
        ledger_mean.as_secs_f64() / floor_mean.as_secs_f64()
    );
    paired(&rt, &*ledger, &raw, &prefix, &fresh);
    throughput(&rt, &ledger, &raw, &prefix, &next);
    hold(&rt, &*ledger, &raw, &prefix, &fresh);
    round_trips(&rt, &raw, &context(&ledger), &fresh);
}

async fn raw_connection(url: &str) -> ConnectionManager {
    // The ledger's own settings, so both sides use one connection type alike.
    let config = ConnectionManagerConfig::new()
        .set_connection_timeout(Some(RedisLedger::DEFAULT_TIMEOUT))
        .set_response_timeout(Some(RedisLedger::DEFAULT_TIMEOUT))
        .set_number_of_retries(1);
    let client = redis::Client::open(url).expect("a Redis URL");
    ConnectionManager::new_with_config(client, config).await.expect("redis answers")
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
    let Claimed::Fresh(fence) = ledger.claim(request).await.expect("redis answers").state else {
        panic!("a fresh key")
    };
    ledger.finish(request.key, fence, End::Completed(&Json(n))).await.expect("redis answers");
}

async fn set_nx_set_xx(conn: &mut ConnectionManager, prefix: &str, n: u64) {
    let key = format!("{prefix}raw:{:032x}", request(n).key.as_u128());
    let ttl = TTL.as_millis().to_string();
    let set = |value: &str, mode: &str| {
        let mut cmd = redis::cmd("SET");
        cmd.arg(&key).arg(value).arg(mode).arg("PX").arg(&ttl);
        cmd
    };
    let first: redis::Value = set("h", "NX").query_async(conn).await.expect("redis answers");
    assert_eq!(first, redis::Value::Okay, "a fresh raw key");
    let second: redis::Value =
        set(&n.to_string(), "XX").query_async(conn).await.expect("redis answers");
    black_box(second);
}

fn context(ledger: &Arc<RedisLedger>) -> Context {
    Context::new("bench-agent")
        .with_policy(
            SideEffect::Low,
            RetryPolicy::for_class(SideEffect::Low).with_attempt_timeout(None),
        )
        .with_ledger(Arc::clone(ledger) as Arc<dyn Ledger>)
}

async fn call(cx: &Context, n: u64) -> ToolResult<u64, io::Error> {
    let args = (n, "quarterly report");
    // A step of its own per call: a step's key does not depend on the
    // arguments, so one step with other arguments would be a key reused.
    let cx = cx.for_step("run-1", n);
    engine::call(
        &cx,
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
fn paired(
    rt: &Runtime,
    ledger: &dyn Ledger,
    raw: &ConnectionManager,
    prefix: &str,
    fresh: &dyn Fn() -> u64,
) {
    let mut conn = raw.clone();
    let (mut ours, mut floor) = (Vec::new(), Vec::new());
    rt.block_on(async {
        for i in 0..PAIRS {
            for ledger_first in [i % 2 == 0, i % 2 != 0] {
                let start = Instant::now();
                if ledger_first {
                    claim_finish(ledger, fresh()).await;
                    ours.push(start.elapsed());
                } else {
                    set_nx_set_xx(&mut conn, prefix, fresh()).await;
                    floor.push(start.elapsed());
                }
            }
        }
    });
    let (ours, floor) = (median(ours), median(floor));
    println!(
        "redis_ledger: medians of {PAIRS} interleaved pairs: claim+finish {ours:?}, \
         floor {floor:?}, ratio {:.2}",
        ours.as_secs_f64() / floor.as_secs_f64()
    );
}

/// Pairs per second of [`TASKS`] tasks sharing one connection (the
/// ledger's or the raw one, each multiplexed), each looping for [`ROUND`]:
/// the ledger's claim + finish, then the raw `SET NX PX` + `SET XX PX`, in
/// [`ROUNDS`] alternating rounds; the ratio of the totals.
fn throughput(
    rt: &Runtime,
    ledger: &Arc<RedisLedger>,
    raw: &ConnectionManager,
    prefix: &str,
    next: &Arc<AtomicU64>,
) {
    let run = |use_ledger: bool| {
        rt.block_on(async {
            let deadline = Instant::now() + ROUND;
            let tasks: Vec<_> = (0..TASKS)
                .map(|_| {
                    let (ledger, mut conn) = (Arc::clone(ledger), raw.clone());
                    let (prefix, next) = (prefix.to_owned(), Arc::clone(next));
                    tokio::spawn(async move {
                        let mut done = 0u64;
                        while Instant::now() < deadline {
                            let n = next.fetch_add(1, Ordering::Relaxed);
                            if use_ledger {
                                claim_finish(&*ledger, n).await;
                            } else {
                                set_nx_set_xx(&mut conn, &prefix, n).await;
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
    let (mut ours, mut floor) = (0u64, 0u64);
    for round in 0..ROUNDS {
        for use_ledger in [round % 2 == 0, round % 2 != 0] {
            let done = run(use_ledger);
            if use_ledger { ours += done } else { floor += done }
        }
    }
    let per_second = |pairs: u64| pairs as f64 / (ROUND * ROUNDS).as_secs_f64();
    let (ours, floor) = (per_second(ours), per_second(floor));
    println!(
        "redis_ledger: throughput of {TASKS} tasks ({ROUNDS} alternating rounds of {ROUND:?}): \
         claim+finish {ours:.0}/s, floor {floor:.0}/s, ratio {:.2}",
        ours / floor
    );
}

/// What asking [`Ledger::hold`] costs against a raw round trip reading the
/// same record (`HGET`): medians of [`PAIRS`] interleaved pairs on a held key.
fn hold(
    rt: &Runtime,
    ledger: &dyn Ledger,
    raw: &ConnectionManager,
    prefix: &str,
    fresh: &dyn Fn() -> u64,
) {
    let mut conn = raw.clone();
    let request = request(fresh());
    let (ours, floor) = rt.block_on(async {
        let Claimed::Fresh(fence) = ledger.claim(request).await.expect("redis answers").state
        else {
            panic!("a fresh key")
        };
        let record = format!("{prefix}k:{}", request.key.to_hex());
        let mut hget = redis::cmd("HGET");
        hget.arg(&record).arg("n");
        let (mut ours, mut floor) = (Vec::new(), Vec::new());
        for i in 0..PAIRS {
            for ledger_first in [i % 2 == 0, i % 2 != 0] {
                let start = Instant::now();
                if ledger_first {
                    let left = ledger.hold(request.key, fence).await.expect("redis answers");
                    ours.push(start.elapsed());
                    assert!(left.is_some(), "the key is held");
                } else {
                    let value: redis::Value =
                        hget.query_async(&mut conn).await.expect("redis answers");
                    floor.push(start.elapsed());
                    assert_ne!(value, redis::Value::Nil, "the record is there");
                }
            }
        }
        ledger.finish(request.key, fence, End::Settled).await.expect("redis answers");
        (ours, floor)
    });
    let (ours, floor) = (median(ours), median(floor));
    println!(
        "redis_ledger: medians of {PAIRS} interleaved pairs: hold {ours:?}, raw HGET {floor:?}, \
         ratio {:.2}",
        ours.as_secs_f64() / floor.as_secs_f64()
    );
}

fn median(mut v: Vec<Duration>) -> Duration {
    v.sort();
    v[v.len() / 2]
}

/// Counts the commands Redis runs per successful engine call.
fn round_trips(rt: &Runtime, raw: &ConnectionManager, cx: &Context, fresh: &dyn Fn() -> u64) {
    let mut conn = raw.clone();
    let before = rt.block_on(commandstats(&mut conn));
    rt.block_on(async {
        for _ in 0..COUNTED_CALLS {
            let result = call(cx, fresh()).await;
            assert!(result.is_success(), "{result:?}");
        }
    });
    let after = rt.block_on(commandstats(&mut conn));
    // Per command: how many per engine call, and Redis's time per run of it
    // (a script's includes the commands it ran).
    let mut per_call: Vec<(String, f64, f64)> = after
        .iter()
        .filter(|(name, ..)| name != "info")
        .map(|(name, calls, usec)| {
            let (was_calls, was_usec) =
                before.iter().find(|(n, ..)| n == name).map_or((0, 0), |(_, c, u)| (*c, *u));
            let runs = calls - was_calls;
            let usec = (usec - was_usec) as f64 / runs.max(1) as f64;
            (name.clone(), runs as f64 / COUNTED_CALLS as f64, usec)
        })
        .filter(|(_, per, _)| *per > 0.0)
        .collect();
    per_call.sort_by(|a, b| a.0.cmp(&b.0));
    let shown: Vec<String> = per_call
        .iter()
        .map(|(name, per, usec)| format!("{name} {per:.2} ({usec:.1} µs)"))
        .collect();
    let evalsha = per_call.iter().find(|(n, ..)| n == "evalsha").map_or(0.0, |(_, p, _)| *p);
    println!(
        "redis_ledger: per successful engine call ({COUNTED_CALLS} calls): {evalsha:.2} round trips \
         (evalsha); Redis commands run (each with Redis's time per run): {}",
        shown.join(", ")
    );
}

/// `INFO commandstats` as (command, calls, µs spent in it). Other clients of
/// the server are counted too: run the bench on a server nothing else uses.
async fn commandstats(conn: &mut ConnectionManager) -> Vec<(String, u64, u64)> {
    let info: String =
        redis::cmd("INFO").arg("commandstats").query_async(conn).await.expect("redis answers");
    info.lines()
        .filter_map(|line| {
            let (name, rest) = line.strip_prefix("cmdstat_")?.split_once(':')?;
            let field = |key: &str| rest.split(',').find_map(|kv| kv.strip_prefix(key));
            Some((name.to_owned(), field("calls=")?.parse().ok()?, field("usec=")?.parse().ok()?))
        })
        .collect()
}
