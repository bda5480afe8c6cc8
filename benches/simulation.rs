//! Simulation throughput (issue 5, item 4): episodes per second of the
//! experiment grid (`examples/agent.rs`), one worker thread against all cores.
//!
//! Each iteration runs the whole default grid (2 tasks × 4 levels × 8 methods)
//! at 50 episodes per cell, 3,200 episodes, on paused tokio time; criterion
//! reports elements/s, i.e. episodes/s.

use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use verified_tools_suite::experiment::{Config, run};

fn simulation(c: &mut Criterion) {
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    let mut group = c.benchmark_group("simulation");
    for threads in [1, cores] {
        let config = Config { episodes: 50, threads, ..Config::default() };
        group.throughput(Throughput::Elements(config.total_episodes()));
        group.bench_function(format!("grid_threads_{threads}"), |b| {
            b.iter(|| run(&config, &|_| {}).expect("the in-memory ledger opens"));
        });
    }
    group.finish();
}

criterion_group! {
    name = benches;
    config = Criterion::default().sample_size(10);
    targets = simulation
}
criterion_main!(benches);
