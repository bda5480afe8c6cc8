//! The experiment's grid with every call recorded in one shared store (the
//! `--ledger` option of `cargo run --release --example agent --features
//! sqlite,redis`): a real SQLite file, and a real Redis server.

use test_support as support;

use verified_tools::sim::FaultLevel;
use verified_tools_suite::experiment::{self, Config, LedgerChoice, Method};

/// The grid, with every call recorded in one shared store instead of a
/// memory ledger per episode: the same outcomes, cell by cell (the store is
/// only where the records live). SQLite always; Redis when there is one.
#[test]
fn a_shared_store_ledger_gives_the_grid_a_memory_ledger_gives() {
    let config = Config {
        episodes: 12,
        levels: vec![FaultLevel::High],
        methods: vec![Method::RetryOnly, Method::VerifyBeforeRetry, Method::VbrNeither],
        ..Config::default()
    };
    let memory = experiment::run(&config, &|_| {}).expect("memory");
    let dir = std::env::temp_dir().join(format!("vt-experiment-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let mut stores = vec![LedgerChoice::Sqlite(dir.join("ledger.db"))];
    let redis = support::redis::RedisServer::shared();
    if let Some(redis) = &redis {
        stores.push(LedgerChoice::Redis(redis.url.clone()));
    }
    for ledger in stores {
        let shared = Config { ledger: ledger.clone(), ..config.clone() };
        let results = experiment::run(&shared, &|_| {}).expect("the store opens");
        for (a, b) in memory.cells.iter().zip(&results.cells) {
            assert_eq!(
                (a.stats.successes, a.stats.duplicates, a.stats.false_successes),
                (b.stats.successes, b.stats.duplicates, b.stats.false_successes),
                "{ledger:?}: {:?} {:?}",
                a.task,
                a.method
            );
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
}
