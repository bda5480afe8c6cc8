//! Heap allocations of a wrapped call's success path (issue 5).
//!
//! A counting global allocator, in its own test binary. Counting is per
//! thread and only while enabled, around the measured calls alone, so the
//! counts are exact even though the test harness runs tests on several
//! threads: each test drives its calls on a current-thread runtime built
//! before counting starts, so every allocation of the calls happens on the
//! test's own thread.
//!
//! Asserts that `engine::call` (Low class, durable scope set up beforehand,
//! ledger and audit off) makes zero allocations per call after warm-up, with
//! `attempt_timeout: None` and with the default 30 s timeout; prints (and
//! bounds) what the in-memory ledger and the memory audit sink add.
//!
//! Run with `-- --nocapture` to see the counts; set `ALLOC_BACKTRACE=1` to
//! print a backtrace at every counted allocation.

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::io;
use std::sync::Arc;

use serde::Serialize;
use std::task::Poll;
use tokio::runtime::Runtime;
use verified_tools::audit::MemoryAudit;

use verified_tools::ledger::{Codec, MemoryLedger};
use verified_tools::{Context, Proof, RetryPolicy, SideEffect, ToolResult, ToolSpec, engine};

struct Counting;

thread_local! {
    static COUNTING: Cell<bool> = const { Cell::new(false) };
    static ALLOCS: Cell<u64> = const { Cell::new(0) };
    static BACKTRACE: Cell<bool> = const { Cell::new(false) };
    static IN_HOOK: Cell<bool> = const { Cell::new(false) };
}

impl Counting {
    fn note(&self) {
        // `try_with`: thread-locals may be gone while a thread shuts down.
        let on = COUNTING.try_with(Cell::get).unwrap_or(false);
        if !on || IN_HOOK.try_with(Cell::get).unwrap_or(true) {
            return;
        }
        ALLOCS.with(|n| n.set(n.get() + 1));
        if BACKTRACE.with(Cell::get) {
            IN_HOOK.with(|h| h.set(true));
            eprintln!("counted allocation:\n{}", std::backtrace::Backtrace::force_capture());
            IN_HOOK.with(|h| h.set(false));
        }
    }
}

// SAFETY: forwards every call to the system allocator unchanged.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        self.note();
        // SAFETY: same contract as ours.
        unsafe { System.alloc(layout) }
    }
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        self.note();
        // SAFETY: same contract as ours.
        unsafe { System.alloc_zeroed(layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        self.note();
        // SAFETY: same contract as ours.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: same contract as ours.
        unsafe { System.dealloc(ptr, layout) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

/// Allocations (alloc, alloc_zeroed and realloc) made on this thread by `f`.
fn count<R>(f: impl FnOnce() -> R) -> (R, u64) {
    BACKTRACE.with(|b| b.set(std::env::var_os("ALLOC_BACKTRACE").is_some()));
    ALLOCS.with(|n| n.set(0));
    COUNTING.with(|c| c.set(true));
    let out = f();
    COUNTING.with(|c| c.set(false));
    (out, ALLOCS.with(Cell::get))
}

static SAVE_DRAFT: ToolSpec = ToolSpec::new("save_draft", SideEffect::Low);

#[derive(Serialize)]
struct Draft<'a> {
    user: u64,
    seq: u64,
    title: &'a str,
    amount: u32,
    urgent: bool,
}

async fn save_draft(args: &Draft<'_>) -> Result<u64, io::Error> {
    Ok(args.user ^ args.seq)
}

async fn call(cx: &Context, seq: u64) -> ToolResult<u64, io::Error> {
    let args = Draft { user: 42, seq, title: "quarterly report", amount: 1250, urgent: false };
    let dispatch = |_attempt| save_draft(&args);
    engine::call(cx, &SAVE_DRAFT, &args, &args, dispatch, engine::no_verifier(), Codec::serde())
        .await
}

const WARM_UP: u64 = 100;
const CALLS: u64 = 1000;

fn runtime() -> Runtime {
    tokio::runtime::Builder::new_current_thread().enable_time().build().expect("runtime")
}

fn no_timeout(cx: Context) -> Context {
    cx.with_policy(
        SideEffect::Low,
        RetryPolicy::for_class(SideEffect::Low).with_attempt_timeout(None),
    )
}

/// Allocations per call over `CALLS` calls after `WARM_UP` calls, all on a
/// current-thread runtime. `same_key`: every call repeats the same logical
/// call (seq 0); otherwise every call has a fresh key.
fn allocs_per_call(cx: &Context, same_key: bool, expect: Proof) -> f64 {
    allocs_per_call_after(cx, same_key, expect, WARM_UP)
}

/// The same after `warm_up` calls.
fn allocs_per_call_after(cx: &Context, same_key: bool, expect: Proof, warm_up: u64) -> f64 {
    let rt = runtime();
    let seq = |i: u64| if same_key { 0 } else { i };
    rt.block_on(async {
        for i in 0..warm_up {
            let r = call(cx, seq(i)).await;
            assert!(r.is_success(), "{r:?}");
        }
        let (proofs, allocs) = count(|| {
            // A fresh future per measured region, polled to completion here.
            futures_block(async {
                let mut ok = 0;
                for i in warm_up..warm_up + CALLS {
                    if let ToolResult::Success { proof, .. } = call(cx, seq(i)).await {
                        ok += u64::from(proof == expect);
                    }
                }
                ok
            })
        });
        assert_eq!(proofs, CALLS, "every measured call must succeed with proof {expect:?}");
        allocs as f64 / CALLS as f64
    })
}

/// Polls a future that never pends (every call here completes on its first
/// poll) to completion on this thread, without the runtime's machinery, so
/// that only the calls themselves are counted. The runtime's context (time
/// driver handle) stays entered, because we run inside its `block_on`.
fn futures_block<F: std::future::Future>(fut: F) -> F::Output {
    let mut fut = std::pin::pin!(fut);
    let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
    match fut.as_mut().poll(&mut cx) {
        std::task::Poll::Ready(out) => out,
        std::task::Poll::Pending => panic!("a measured call pended; the success path must not"),
    }
}

#[test]
fn success_path_without_timeout_does_not_allocate() {
    let cx = no_timeout(Context::new("agent").without_ledger()).for_step("run-1", 1);
    let per_call = allocs_per_call(&cx, false, Proof::Response);
    println!("success path, ledger+audit off, attempt_timeout None: {per_call} allocations/call");
    assert_eq!(per_call, 0.0);
}

#[test]
fn success_path_with_default_timeout_does_not_allocate() {
    let cx = Context::new("agent").without_ledger().for_step("run-1", 1);
    let per_call = allocs_per_call(&cx, false, Proof::Response);
    println!("success path, ledger+audit off, default 30 s timeout: {per_call} allocations/call");
    assert_eq!(per_call, 0.0, "the tokio timer of the attempt timeout allocated");
}

#[test]
fn ledger_allocations_per_call() {
    // The default scope (a time bucket): its key commits to the arguments,
    // so each `seq` is a fresh key. (A run step names one request: other
    // arguments under it are refused as a key reuse.)
    let fresh = no_timeout(Context::new("agent")).with_ledger(Arc::new(MemoryLedger::new()));
    // Past the first growth of its 64 shards (maps and expiry queues): the
    // steady state of a long-running ledger.
    let per_fresh = allocs_per_call_after(&fresh, false, Proof::Response, 20_000);
    let hit = no_timeout(Context::new("agent"))
        .with_ledger(Arc::new(MemoryLedger::new()))
        .for_step("run-1", 1);
    let per_hit = allocs_per_call(&hit, true, Proof::Ledger);
    println!("ledger on, fresh key per call: {per_fresh} allocations/call");
    println!("ledger on, replay (hit) path: {per_hit} allocations/call");
    // Fresh: the recorded value's Arc, plus the shards' amortized growth.
    assert!(per_fresh <= 1.1, "ledger (fresh key) allocates {per_fresh}/call");
    assert_eq!(per_hit, 0.0, "ledger hit path allocates {per_hit}/call");
}

#[test]
fn audit_allocations_per_call() {
    let audit = Arc::new(MemoryAudit::new());
    let cx = no_timeout(Context::new("agent").without_ledger())
        .with_audit(audit.clone())
        .for_step("run-1", 1);
    let per_call = allocs_per_call(&cx, false, Proof::Response);
    println!(
        "MemoryAudit on: {per_call} allocations/call ({} events recorded)",
        audit.events().len()
    );
    // Per call: the args as JSON (engine), then 3 events (planned,
    // dispatched, verified_success), each kept as a JSON string (grown once
    // or twice while written), the planned one also its args; plus the
    // Vec's amortized growth. The audit is opt-in, off the success path.
    assert!(per_call <= 10.1, "MemoryAudit allocates {per_call}/call");
}

/// Pends once, waking itself at once: what a real I/O call does, without
/// any runtime machinery of its own (tokio's `yield_now` defers its waker in
/// a list that grows now and then, which is the runtime's allocation, not
/// the engine's).
struct PendOnce(bool);

impl std::future::Future for PendOnce {
    type Output = ();

    fn poll(mut self: std::pin::Pin<&mut Self>, cx: &mut std::task::Context<'_>) -> Poll<()> {
        if std::mem::replace(&mut self.0, true) {
            Poll::Ready(())
        } else {
            cx.waker().wake_by_ref();
            Poll::Pending
        }
    }
}

/// A tool that is not ready at once: with the default timeout the attempt's
/// tokio timer (and the call's deadline) are really registered in the time
/// driver, so this shows whether that allocates.
async fn pending_call(cx: &Context, seq: u64) -> ToolResult<u64, io::Error> {
    let args = Draft { user: 42, seq, title: "quarterly report", amount: 1250, urgent: false };
    let dispatch = |_attempt| async {
        PendOnce(false).await;
        save_draft(&args).await
    };
    engine::call(cx, &SAVE_DRAFT, &args, &args, dispatch, engine::no_verifier(), Codec::serde())
        .await
}

/// Allocations per call of `pending_call`, counted inside the runtime's
/// `block_on` (the runtime's own work between polls included).
fn pending_allocs_per_call(cx: &Context) -> f64 {
    let rt = runtime();
    rt.block_on(async {
        for i in 0..WARM_UP {
            assert!(pending_call(cx, i).await.is_success());
        }
        BACKTRACE.with(|b| b.set(std::env::var_os("ALLOC_BACKTRACE").is_some()));
        ALLOCS.with(|n| n.set(0));
        COUNTING.with(|c| c.set(true));
        let mut ok = 0;
        for i in WARM_UP..WARM_UP + CALLS {
            ok += u64::from(pending_call(cx, i).await.is_success());
        }
        COUNTING.with(|c| c.set(false));
        assert_eq!(ok, CALLS);
        ALLOCS.with(Cell::get) as f64 / CALLS as f64
    })
}

#[test]
fn registered_attempt_timer_does_not_allocate() {
    let none = pending_allocs_per_call(
        &no_timeout(Context::new("agent").without_ledger()).for_step("run-1", 1),
    );
    let default =
        pending_allocs_per_call(&Context::new("agent").without_ledger().for_step("run-1", 1));
    println!(
        "pending attempt: {none} allocations/call without timeout, {default} with the 30 s timer"
    );
    assert_eq!(none, 0.0);
    assert_eq!(default, 0.0, "registering the attempt's tokio timer allocated");
}
