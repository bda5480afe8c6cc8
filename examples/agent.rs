//! The paper's experiment in one command: the same agent under each method,
//! against the fault-injecting simulator, scored on ground truth.
//!
//! ```text
//! cargo run --release --example agent                     # 25 episodes per cell
//! cargo run --release --example agent -- --episodes 2000 --json out.json --svg fig2.svg
//! ```

use std::io::IsTerminal;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Instant;

use clap::Parser;
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use verified_tools::sim::{FaultLevel, TaskKind};
use verified_tools_suite::experiment::{self, Config, Method};
use verified_tools_suite::report;

/// Runs the grid tasks × fault levels × methods × episodes and prints the
/// paper-style table.
#[derive(Debug, Parser)]
#[command(version, about)]
struct Args {
    /// Episodes per cell (the paper ran 25).
    #[arg(long, default_value_t = 25)]
    episodes: u64,
    /// Base seed: episode i runs with seed + i, the same for every method.
    #[arg(long, default_value_t = verified_tools::sim::BASE_SEED)]
    seed: u64,
    /// Fault levels, comma-separated.
    #[arg(long, value_delimiter = ',', default_value = "low,medium,high,extreme")]
    levels: Vec<FaultLevel>,
    /// Methods, comma-separated (retry_only is the baseline of Cohen's h).
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "retry_only,verify_only,verify_before_retry,keys_only,vbr_no_server_keys"
    )]
    methods: Vec<Method>,
    /// Tasks, comma-separated.
    #[arg(long, value_delimiter = ',', default_value = "activate_customer,record_invoice")]
    tasks: Vec<TaskKind>,
    /// Write the cells as JSON to this path.
    #[arg(long)]
    json: Option<PathBuf>,
    /// Draw Figure 2 as SVG to this path.
    #[arg(long)]
    svg: Option<PathBuf>,
    /// Worker threads (default: all cores). The results do not depend on it.
    #[arg(long)]
    threads: Option<usize>,
}

fn main() -> ExitCode {
    let args = Args::parse();
    let mut config = Config {
        episodes: args.episodes,
        seed: args.seed,
        tasks: args.tasks,
        levels: args.levels,
        methods: args.methods,
        ..Config::default()
    };
    if let Some(threads) = args.threads {
        config.threads = threads.max(1);
    }

    let bar = ProgressBar::new(config.total_episodes());
    if std::io::stderr().is_terminal() {
        bar.set_style(
            ProgressStyle::with_template("{bar:40} {pos}/{len} episodes, {per_sec}, eta {eta}")
                .unwrap_or_else(|_| ProgressStyle::default_bar()),
        );
    } else {
        bar.set_draw_target(ProgressDrawTarget::hidden());
    }
    let started = Instant::now();
    let results = experiment::run(&config, &|n| bar.inc(n));
    bar.finish_and_clear();

    print!("{}", report::table(&results));
    println!(
        "{} episodes in {:.2} s wall time on {} threads.",
        config.total_episodes(),
        started.elapsed().as_secs_f64(),
        config.threads
    );
    if let Some(path) = &args.json {
        if let Err(e) = report::write_json(&results, path) {
            eprintln!("error: cannot write {}: {e}", path.display());
            return ExitCode::FAILURE;
        }
        println!("JSON written to {}", path.display());
    }
    if let Some(path) = &args.svg {
        if let Err(e) = report::svg(&results, path) {
            eprintln!("error: cannot draw {}: {e}", path.display());
            return ExitCode::FAILURE;
        }
        println!("Figure 2 written to {}", path.display());
    }
    ExitCode::SUCCESS
}
