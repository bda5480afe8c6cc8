//! The in-memory ledger (issue 5, item 3).
//!
//! - `ledger/hit`: a repeated logical call returns the recorded outcome,
//!   single-threaded: through `engine::call` (key derivation + ledger lookup +
//!   downcast and clone of the value), and `MemoryLedger::begin` alone.
//! - `ledger/contention`: 64 tasks making 16 calls each on 4 keys, sharing one
//!   `MemoryLedger` (one mutex), on a current-thread runtime and on a
//!   multi-thread runtime with 2 workers. Each iteration starts from an empty
//!   ledger, so per key one call claims, dispatches and records, the others
//!   replay; a call that finds its key held by a racing call is refused at
//!   once (`InFlight::Return`) instead of sleeping 50 ms. `spawn_only` runs the
//!   same tasks calling the raw fn, to separate task spawning from the ledger.
//!   Throughput is in calls.

use std::hint::black_box;
use std::io;
use std::sync::Arc;
use std::time::{Duration, Instant};

use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use tokio::runtime::Runtime;
use verified_tools::key::payload_digest;
use verified_tools::ledger::{
    ClaimRequest, Claimed, Codec, End, Ledger, MemoryLedger, Progress, Settle,
};
use verified_tools::{
    Context, IdempotencyKey, InFlight, Proof, RetryPolicy, SideEffect, ToolResult, ToolSpec, engine,
};

static SAVE_DRAFT: ToolSpec = ToolSpec::new("save_draft", SideEffect::Low);

const TASKS: u64 = 64;
const CALLS_PER_TASK: u64 = 16;
const KEYS: u64 = 4;

async fn save_draft(args: &(u64, &str)) -> Result<u64, io::Error> {
    Ok(black_box(args.0) + 1)
}

async fn call(cx: &Context, key: u64) -> ToolResult<u64, io::Error> {
    let args = (key, "quarterly report");
    let dispatch = |_attempt| save_draft(&args);
    engine::call(cx, &SAVE_DRAFT, &args, &args, dispatch, engine::no_verifier(), Codec::serde())
        .await
}

fn context(ledger: Arc<MemoryLedger>) -> Context {
    Context::new("bench-agent")
        .with_policy(
            SideEffect::Low,
            RetryPolicy::for_class(SideEffect::Low).with_attempt_timeout(None),
        )
        .with_in_flight(InFlight::Return)
        .with_ledger(ledger)
        .for_step("run-1", 1)
}

fn current_thread() -> Runtime {
    tokio::runtime::Builder::new_current_thread().enable_time().build().expect("runtime")
}

fn multi_thread() -> Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_time()
        .build()
        .expect("runtime")
}

fn hit(c: &mut Criterion) {
    let rt = current_thread();
    let cx = context(Arc::new(MemoryLedger::new()));
    let first = rt.block_on(call(&cx, 0));
    assert!(first.is_success(), "priming call failed: {first:?}");
    let again = rt.block_on(call(&cx, 0));
    assert!(matches!(again, ToolResult::Success { proof: Proof::Ledger, .. }), "{again:?}");

    let mut g = c.benchmark_group("ledger/hit");
    g.bench_function("engine_call", |b| {
        b.iter_custom(|iters| {
            rt.block_on(async {
                let start = Instant::now();
                for _ in 0..iters {
                    let _ = black_box(call(&cx, black_box(0)).await);
                }
                start.elapsed()
            })
        })
    });

    let ledger = MemoryLedger::new();
    let key = IdempotencyKey::from_u128(7);
    let fingerprint = payload_digest(&7u64).unwrap();
    let first = Progress { attempts: 1, after_ok: false, settle: Settle::NOW };
    let now = tokio::time::Instant::now();
    let request = ClaimRequest { key, fingerprint, previous: None, first, now };
    rt.block_on(async {
        let Ok(Claimed::Fresh(fence)) = ledger.claim(request).await.map(|c| c.state) else {
            unreachable!("a fresh key")
        };
        let value = Recorded8;
        ledger.finish(key, fence, End::Completed(&value)).await.expect("recorded");
    });
    // "Am I still the holder?" of a held key: a shard lock and a lookup.
    let held = ClaimRequest { key: IdempotencyKey::from_u128(u128::MAX), ..request };
    let fence = match rt.block_on(ledger.claim(held)).map(|c| c.state) {
        Ok(Claimed::Fresh(fence)) => fence,
        _ => unreachable!(),
    };
    g.bench_function("memory_ledger_hold", |b| {
        b.iter_custom(|iters| {
            rt.block_on(async {
                let start = Instant::now();
                for _ in 0..iters {
                    black_box(ledger.hold(black_box(held.key), fence).await.expect("answered"));
                }
                start.elapsed()
            })
        })
    });
    g.bench_function("memory_ledger_claim", |b| {
        b.iter_custom(|iters| {
            rt.block_on(async {
                let start = Instant::now();
                for _ in 0..iters {
                    match ledger.claim(black_box(request)).await.map(|c| c.state) {
                        Ok(Claimed::Completed(_)) => {}
                        _ => unreachable!(),
                    }
                }
                start.elapsed()
            })
        })
    });
    g.finish();
}

/// The recorded value of the claim bench.
struct Recorded8;

impl verified_tools::ledger::Recorded for Recorded8 {
    fn local(&self) -> Arc<dyn std::any::Any + Send + Sync> {
        Arc::new(8u64)
    }

    fn encode(&self) -> Option<Vec<u8>> {
        Some(b"8".to_vec())
    }
}

/// One batch: `TASKS` tasks × `CALLS_PER_TASK` calls, on `KEYS` keys; returns
/// the time from the first spawn to the last join.
fn batch(rt: &Runtime, through_ledger: bool) -> Duration {
    let cx = Arc::new(context(Arc::new(MemoryLedger::new())));
    rt.block_on(async {
        let start = Instant::now();
        let tasks: Vec<_> = (0..TASKS)
            .map(|t| {
                let cx = Arc::clone(&cx);
                tokio::spawn(async move {
                    for _ in 0..CALLS_PER_TASK {
                        if through_ledger {
                            let _ = black_box(call(&cx, t % KEYS).await);
                        } else {
                            black_box(save_draft(&(t % KEYS, "quarterly report")).await.ok());
                        }
                        // Let other tasks interleave, as real tools would.
                        tokio::task::yield_now().await;
                    }
                })
            })
            .collect();
        for task in tasks {
            task.await.expect("task");
        }
        start.elapsed()
    })
}

/// How the calls of one batch ended: (dispatched, replayed from the ledger,
/// refused because a racing call held the key). Printed, not timed.
fn outcomes(rt: &Runtime) -> [u64; 3] {
    let cx = Arc::new(context(Arc::new(MemoryLedger::new())));
    rt.block_on(async {
        let tasks: Vec<_> = (0..TASKS)
            .map(|t| {
                let cx = Arc::clone(&cx);
                tokio::spawn(async move {
                    let mut seen = [0u64; 3];
                    for _ in 0..CALLS_PER_TASK {
                        match call(&cx, t % KEYS).await {
                            ToolResult::Success { proof: Proof::Ledger, .. } => seen[1] += 1,
                            ToolResult::Success { .. } => seen[0] += 1,
                            _ => seen[2] += 1,
                        }
                        tokio::task::yield_now().await;
                    }
                    seen
                })
            })
            .collect();
        let mut total = [0u64; 3];
        for task in tasks {
            let seen = task.await.expect("task");
            for (sum, n) in total.iter_mut().zip(seen) {
                *sum += n;
            }
        }
        total
    })
}

fn contention(c: &mut Criterion) {
    for (name, rt) in [("current_thread", current_thread()), ("multi_thread_2", multi_thread())] {
        let [dispatched, replayed, refused] = outcomes(&rt);
        eprintln!(
            "{name}: one batch: {dispatched} dispatched, {replayed} replayed, {refused} refused in flight"
        );
    }
    let mut g = c.benchmark_group("ledger/contention");
    g.throughput(Throughput::Elements(TASKS * CALLS_PER_TASK));
    for (name, rt) in [("current_thread", current_thread()), ("multi_thread_2", multi_thread())] {
        g.bench_function(format!("{name}/ledger"), |b| {
            b.iter_custom(|iters| (0..iters).map(|_| batch(&rt, true)).sum())
        });
        g.bench_function(format!("{name}/spawn_only"), |b| {
            b.iter_custom(|iters| (0..iters).map(|_| batch(&rt, false)).sum())
        });
    }
    g.finish();
}

criterion_group! {
    name = benches;
    config = Criterion::default()
        .sample_size(30)
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(3));
    targets = hit, contention
}
criterion_main!(benches);
