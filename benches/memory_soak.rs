//! The default context over a long run (issue 8): millions of unique calls
//! through `Context::new` (the in-memory ledger, bounded by its cap), with
//! per-call latency percentiles and the process's memory; then throughput
//! with 1 task and with 64 tasks on a 2-worker runtime, sharing one context.
//!
//! ```text
//! cargo bench --bench memory_soak                 # 5,000,000 calls
//! VT_SOAK_CALLS=1000000 cargo bench --bench memory_soak
//! ```
//!
//! Not a criterion bench: the figures are a latency distribution and a
//! memory curve, not a mean. Latency is measured per call with
//! `Instant::now()` around it (about 20 ns of its own).

use std::sync::Arc;
use std::time::{Duration, Instant};

use verified_tools::Context;
use verified_tools::ledger::MemoryLedger;
use verified_tools_benches::call;

/// Latencies in log-spaced buckets (16 per power of two), so 5 M calls take
/// a few kilobytes rather than 40 MB that would blur the memory figures.
struct Histogram {
    buckets: Vec<u64>,
    max: Duration,
    count: u64,
}

impl Histogram {
    const SUB: u32 = 16;

    fn new() -> Self {
        Self { buckets: vec![0; 64 * Self::SUB as usize], max: Duration::ZERO, count: 0 }
    }

    fn record(&mut self, d: Duration) {
        let ns = d.as_nanos().max(1) as u64;
        let exp = 63 - ns.leading_zeros();
        let frac = if exp >= 4 { (ns >> (exp - 4)) & 0xf } else { 0 };
        self.buckets[(exp * Self::SUB) as usize + frac as usize] += 1;
        self.max = self.max.max(d);
        self.count += 1;
    }

    /// The upper bound of the bucket holding quantile `q`.
    fn quantile(&self, q: f64) -> Duration {
        let target = (q * self.count as f64).ceil() as u64;
        let mut seen = 0;
        for (i, n) in self.buckets.iter().enumerate() {
            seen += n;
            if seen >= target.max(1) {
                let (exp, frac) = (i as u32 / Self::SUB, i as u64 % u64::from(Self::SUB));
                let base = 1u64 << exp;
                let upper = if exp >= 4 { base + ((frac + 1) << (exp - 4)) } else { base * 2 };
                return Duration::from_nanos(upper);
            }
        }
        self.max
    }
}

/// Resident and peak resident memory of this process, in MiB.
fn rss_mib() -> (f64, f64) {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    let field = |name: &str| {
        status
            .lines()
            .find(|l| l.starts_with(name))
            .and_then(|l| l.split_whitespace().nth(1))
            .and_then(|kb| kb.parse::<f64>().ok())
            .map_or(f64::NAN, |kb| kb / 1024.0)
    };
    (field("VmRSS:"), field("VmHWM:"))
}

fn soak(calls: u64) {
    let rt = tokio::runtime::Builder::new_current_thread().enable_time().build().expect("runtime");
    let ledger = Arc::new(MemoryLedger::new());
    let cx = Context::new("bench-agent").with_ledger(ledger.clone());
    let (rss0, _) = rss_mib();
    println!(
        "soak: {calls} unique calls through Context::new (memory ledger, cap {}), current-thread",
        ledger.capacity()
    );
    println!(
        "{:>10} {:>9} {:>9} {:>10} {:>10} {:>9} {:>9}",
        "calls", "records", "p50", "p99.9", "max", "rss MiB", "peak MiB"
    );
    let rows = 5;
    let per_row = calls / rows;
    let started = Instant::now();
    rt.block_on(async {
        let mut seq = 0;
        for _ in 0..rows {
            let mut h = Histogram::new();
            for _ in 0..per_row {
                let t = Instant::now();
                let r = call(&cx, seq).await;
                h.record(t.elapsed());
                assert!(r.is_success(), "{r:?}");
                seq += 1;
            }
            let (rss, peak) = rss_mib();
            println!(
                "{seq:>10} {:>9} {:>9.2?} {:>10.2?} {:>10.2?} {:>9.1} {:>9.1}",
                ledger.len(),
                h.quantile(0.5),
                h.quantile(0.999),
                h.max,
                rss - rss0,
                peak - rss0
            );
        }
    });
    let took = started.elapsed();
    println!(
        "{calls} calls in {:.2} s: {:.0} ns/call on average (latency timing included)\n",
        took.as_secs_f64(),
        took.as_nanos() as f64 / calls as f64
    );
}

/// Calls per second with `tasks` tasks sharing one default context on a
/// 2-worker runtime, each making `per_task` calls with unique keys.
fn throughput(tasks: u64, per_task: u64) -> f64 {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_time()
        .build()
        .expect("runtime");
    let cx = Arc::new(Context::new("bench-agent"));
    rt.block_on(async {
        let started = Instant::now();
        let handles: Vec<_> = (0..tasks)
            .map(|t| {
                let cx = Arc::clone(&cx);
                tokio::spawn(async move {
                    for i in 0..per_task {
                        let r = call(&cx, t * per_task + i).await;
                        assert!(r.is_success());
                    }
                })
            })
            .collect();
        for h in handles {
            h.await.expect("task");
        }
        (tasks * per_task) as f64 / started.elapsed().as_secs_f64()
    })
}

fn main() {
    // `cargo bench` passes `--bench`; `cargo test --benches` runs this too:
    // keep that run short.
    let quick =
        std::env::args().any(|a| a == "--test") || std::env::var_os("VT_SOAK_QUICK").is_some();
    let calls = std::env::var("VT_SOAK_CALLS")
        .ok()
        .and_then(|n| n.parse().ok())
        .unwrap_or(if quick { 50_000 } else { 5_000_000 });
    soak(calls);
    let total = if quick { 64_000 } else { 1_280_000 };
    let one = throughput(1, total);
    let many = throughput(64, total / 64);
    println!("throughput on 2 workers, one shared Context::new, {total} unique calls:");
    println!("  1 task:   {one:>12.0} calls/s");
    println!("  64 tasks: {many:>12.0} calls/s ({:.2}x)", many / one);
}
