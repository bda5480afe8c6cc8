//! What verification costs when nothing goes wrong (issue 5, item 1).
//!
//! One criterion group, so every ratio comes from the same run on the same
//! (noisy) machine. The work is a trivial async tool (`save_draft`, a Low
//! side-effect class, no verifier) called with a 5-field argument struct:
//!
//! - `raw`: the async fn alone: the physical floor;
//! - `raw_key`: the raw fn plus one key derivation (`IdempotencyKey::derive`,
//!   the same agent, action, scope and arguments the engine hashes): the floor
//!   of any keyed call;
//! - `backon`: the raw fn wrapped in `backon`'s `.retry(ExponentialBuilder::default())`,
//!   the peer a Rust user picks today;
//! - `wrapped/...`: `engine::call` (what `#[verified_tool]` expands to) with a
//!   durable key scope, ledger off or on (`fresh`: a new key every call, so
//!   claim + dispatch + record; `hit`: the same logical call repeated, so the
//!   recorded outcome is returned), and with the default per-attempt timeout
//!   (30 s, a tokio timer per attempt) or `attempt_timeout: None`.
//!
//! Criterion's async support is not enabled, so each sample runs its `iters`
//! calls inside one `block_on` of a current-thread runtime built once, outside
//! the timing: the figure is the per-call cost, not `block_on`'s.
//! Every variant hashes/sends a per-call sequence number, so the work is the
//! same and nothing can be hoisted out of the loop.

use std::hint::black_box;
use std::sync::Arc;
use std::time::{Duration, Instant};

use backon::{ExponentialBuilder, Retryable};
use criterion::{Criterion, criterion_group, criterion_main};
use tokio::runtime::Runtime;
use verified_tools::ledger::MemoryLedger;
use verified_tools::{
    Context, IdempotencyKey, KeyScope, Proof, RetryPolicy, SideEffect, ToolResult,
};
use verified_tools_benches::{call, draft, save_draft};

fn runtime() -> Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .expect("current-thread runtime")
}

/// No ledger (`Context::new` installs a `MemoryLedger`; the ledger variants
/// add one back), durable scope, default policies (30 s attempt timeout).
fn cx_default() -> Context {
    Context::new("bench-agent").without_ledger().for_step("run-1", 1)
}

/// The same with `attempt_timeout: None` for the Low class.
fn cx_no_timeout() -> Context {
    Context::new("bench-agent")
        .without_ledger()
        .with_policy(
            SideEffect::Low,
            RetryPolicy::for_class(SideEffect::Low).with_attempt_timeout(None),
        )
        .for_step("run-1", 1)
}

/// Runs `$body` (which may `.await`) `$iters` times inside one `block_on` and
/// returns the time the loop took.
macro_rules! timed {
    ($rt:expr, $iters:expr, |$i:ident| $body:expr) => {
        $rt.block_on(async {
            let start = Instant::now();
            for $i in 0..$iters {
                let _ = black_box($body);
            }
            start.elapsed()
        })
    };
}

fn success_path(c: &mut Criterion) {
    let rt = runtime();
    let mut g = c.benchmark_group("success_path");

    g.bench_function("raw", |b| {
        b.iter_custom(|iters| timed!(rt, iters, |i| save_draft(&draft(i)).await))
    });

    let scope = KeyScope::durable("run-1", 1);
    g.bench_function("raw_key", |b| {
        b.iter_custom(|iters| {
            timed!(rt, iters, |i| {
                let args = draft(i);
                let key = IdempotencyKey::derive("bench-agent", "save_draft", &args, &scope, 0);
                (key, save_draft(&args).await)
            })
        })
    });

    g.bench_function("backon", |b| {
        b.iter_custom(|iters| {
            timed!(rt, iters, |i| {
                let args = draft(i);
                (|| save_draft(&args)).retry(ExponentialBuilder::default()).await
            })
        })
    });

    for (name, cx) in [
        ("wrapped/ledger_off/timeout_default", cx_default()),
        ("wrapped/ledger_off/timeout_none", cx_no_timeout()),
    ] {
        g.bench_function(name, |b| {
            b.iter_custom(|iters| timed!(rt, iters, |i| call(&cx, i).await))
        });
    }

    // A fresh key per call: the ledger claims, records and keeps every call.
    // Each sample starts from an empty ledger (built and dropped untimed), so
    // memory stays bounded; the map's growth is part of the cost.
    for (name, base) in [
        ("wrapped/ledger_fresh/timeout_default", cx_default as fn() -> Context),
        ("wrapped/ledger_fresh/timeout_none", cx_no_timeout),
    ] {
        g.bench_function(name, |b| {
            b.iter_custom(|iters| {
                let cx = base().with_ledger(Arc::new(MemoryLedger::new()));
                let took = timed!(rt, iters, |i| call(&cx, i).await);
                drop(cx);
                took
            })
        });
    }

    // The replay path: the same logical call again returns the recorded value.
    let cx = cx_default().with_ledger(Arc::new(MemoryLedger::new()));
    let first = rt.block_on(call(&cx, 0));
    assert!(first.is_success(), "priming call failed: {first:?}");
    let again = rt.block_on(call(&cx, 0));
    assert!(matches!(again, ToolResult::Success { proof: Proof::Ledger, .. }), "{again:?}");
    g.bench_function("wrapped/ledger_hit", |b| {
        b.iter_custom(|iters| timed!(rt, iters, |_i| call(&cx, 0).await))
    });

    g.finish();
}

criterion_group! {
    name = benches;
    config = Criterion::default()
        .sample_size(30)
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(3));
    targets = success_path
}
criterion_main!(benches);
