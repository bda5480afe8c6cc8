//! The paper's experiment in one command: the same agent under each method,
//! against the fault-injecting simulator, scored on ground truth.
//!
//! ```text
//! cargo run --release --example agent                       # the README's grid, 2000 episodes per cell
//! cargo run --release --example agent -- --episodes 25      # the paper's size
//! cargo run --release --example agent -- --detail --json out.json
//! cargo run --release --example agent --features redis -- --episodes 20 --ledger redis://127.0.0.1:6379/
//! cargo run --release --example agent -- --legacy-faults    # the earlier simulator
//! cargo run --release --example agent -- --faults partial-ok # + partial writes that answer as if complete
//! cargo run --release --example agent -- --faults partial-ok --believe-ok   # the control: OK answers believed
//! cargo run --release --example agent -- --planner openai --base-url http://localhost:11434/v1 \
//!     --model qwen2.5:7b-instruct --levels medium       # a model plans, over the tool set
//! ```

use std::io::IsTerminal;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Instant;

use clap::Parser;
use clap::builder::{PossibleValuesParser, TypedValueParser};
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use verified_tools::sim::{FaultLevel, TaskKind};
use verified_tools_suite::experiment::{self, Config, FaultModel, LedgerChoice, Method};
use verified_tools_suite::report;

const METHODS: [&str; 8] = [
    "retry_only",
    "verify_only",
    "verify_before_retry",
    "keys_only",
    "vbr_no_deadlines",
    "vbr_no_server_keys",
    "vbr_neither",
    "vbr_neither_unsettled",
];
const LEVELS: [&str; 4] = ["low", "medium", "high", "extreme"];
const TASKS: [&str; 2] = ["activate_customer", "record_invoice"];
const FAULTS: [&str; 2] = ["table1", "partial-ok"];

/// A comma-separated list of known names, parsed into `T`.
fn names<T>(known: &'static [&'static str]) -> impl TypedValueParser<Value = T>
where
    T: std::str::FromStr<Err: Into<Box<dyn std::error::Error + Send + Sync>>>
        + Clone
        + Send
        + Sync
        + 'static,
{
    PossibleValuesParser::new(known).try_map(|name| name.parse::<T>())
}

/// Runs the grid tasks × fault levels × methods × episodes against the
/// fault-injecting simulator and prints, per task, success, duplicate and
/// false-success rates.
#[derive(Debug, Parser)]
#[command(version, about)]
struct Args {
    /// Episodes per cell: the README's tables use 2000, the default (the
    /// paper ran 25); with `--planner openai`, 1 by default.
    #[arg(long, value_parser = clap::value_parser!(u64).range(1..))]
    episodes: Option<u64>,
    /// Base seed: episode i runs with seed + i, the same for every method.
    #[arg(long, default_value_t = verified_tools::sim::BASE_SEED)]
    seed: u64,
    /// Fault levels, comma-separated (Table 1 of the paper, and ours).
    #[arg(long, value_delimiter = ',', value_parser = names::<FaultLevel>(&LEVELS),
          default_value = "low,medium,high,extreme")]
    levels: Vec<FaultLevel>,
    /// Methods, comma-separated (retry_only is the baseline of Cohen's h).
    /// The vbr_* arms run verify-before-retry against servers that break a
    /// promise: no key deduplication, no deadlines, or neither.
    #[arg(long, value_delimiter = ',', value_parser = names::<Method>(&METHODS),
          default_value = "retry_only,verify_only,verify_before_retry,keys_only,vbr_no_deadlines,\
                           vbr_no_server_keys,vbr_neither,vbr_neither_unsettled")]
    methods: Vec<Method>,
    /// Tasks, comma-separated.
    #[arg(long, value_delimiter = ',', value_parser = names::<TaskKind>(&TASKS),
          default_value = "activate_customer,record_invoice")]
    tasks: Vec<TaskKind>,
    /// Where calls are recorded: memory (a ledger per episode), sqlite:PATH,
    /// redis://HOST:PORT/ or postgres://USER@HOST:PORT/DB (one ledger for
    /// the whole run; these need the features `sqlite`, `redis` and
    /// `postgres`: `--features sqlite,redis,postgres`).
    #[arg(long, default_value = "memory")]
    ledger: LedgerChoice,
    /// Print the full table: confidence intervals, Cohen's h, calls, verifier
    /// reads and virtual latency per episode (140 columns).
    #[arg(long)]
    detail: bool,
    /// Write the cells as JSON to this path.
    #[arg(long)]
    json: Option<PathBuf>,
    /// Where to draw Figure 2 (SVG).
    #[arg(long, default_value = "target/experiment/figure2.svg")]
    svg: PathBuf,
    /// Worker threads (default: all cores). The results do not depend on it.
    #[arg(long, value_parser = clap::value_parser!(u64).range(1..))]
    threads: Option<u64>,
    /// Run the simulator as it was before late arrivals: timeouts split
    /// before/after the server applied the request, no late arrivals, no
    /// heavy lag tail (the earlier grid's faults, with today's agent).
    #[arg(long)]
    legacy_faults: bool,
    /// Which faults: `table1` (Table 1's four; a partial success answers OK
    /// with what it wrote) or `partial-ok` (those, plus compound writes
    /// applied in part that answer as if applied in full, independently at
    /// the level's partial rate: 3/10/15/25%).
    #[arg(long, default_value = "table1", value_parser = names::<FaultModel>(&FAULTS))]
    faults: FaultModel,
    /// Believe OK answers: every tool's `verify_response` off (the control).
    /// By default each tool keeps its class's: the writes here are `high`,
    /// so each verifies an OK answer before it reports success.
    #[arg(long)]
    believe_ok: bool,
    /// Who plans: `scripted` (the experiment's deterministic planner) or
    /// `openai` (a model behind an OpenAI-compatible chat-completions API:
    /// Ollama, vLLM, llama.cpp; `OPENAI_API_KEY` is sent if set).
    #[arg(long, default_value = "scripted",
          value_parser = PossibleValuesParser::new(["scripted", "openai"]))]
    planner: String,
    /// With `--planner openai`: the API's base URL.
    #[arg(long, default_value = "http://localhost:11434/v1")]
    base_url: String,
    /// With `--planner openai`: the model's name.
    #[arg(long, required_if_eq("planner", "openai"))]
    model: Option<String>,
}

fn main() -> ExitCode {
    let args = Args::parse();
    if args.planner == "openai" {
        return llm_main(&args);
    }
    let mut config = Config {
        episodes: args.episodes.unwrap_or(2000),
        seed: args.seed,
        tasks: args.tasks,
        levels: args.levels,
        methods: args.methods,
        ledger: args.ledger,
        ..Config::default()
    };
    if let Some(threads) = args.threads {
        config.threads = usize::try_from(threads).unwrap_or(usize::MAX);
    }
    config.settings.legacy_faults = args.legacy_faults;
    config.settings.faults = args.faults;
    config.settings.believe_ok = args.believe_ok;

    let bar = ProgressBar::new(config.total_episodes());
    if std::io::stderr().is_terminal() {
        bar.set_style(
            ProgressStyle::with_template("{bar:40} {human_pos}/{human_len} episodes, eta {eta}")
                .unwrap_or_else(|_| ProgressStyle::default_bar()),
        );
    } else {
        bar.set_draw_target(ProgressDrawTarget::hidden());
    }
    let started = Instant::now();
    let results = match experiment::run(&config, &|n| bar.inc(n)) {
        Ok(results) => results,
        Err(e) => {
            bar.finish_and_clear();
            eprintln!("error: cannot open the ledger: {e}");
            return ExitCode::FAILURE;
        }
    };
    bar.finish_and_clear();

    if args.detail {
        print!("{}", report::table(&results));
    } else {
        print!("{}", report::summary(&results));
    }
    println!(
        "{} episodes ({} per cell, seeds {}..) in {:.2} s on {} threads; faults {}{}, OK answers \
         {}; calls recorded in {}.",
        config.total_episodes(),
        config.episodes,
        config.seed,
        started.elapsed().as_secs_f64(),
        config.threads,
        config.settings.faults,
        if config.settings.legacy_faults { " (legacy timeouts)" } else { "" },
        if config.settings.believe_ok { "believed" } else { "verified (class default)" },
        match &config.ledger {
            LedgerChoice::Memory => "memory".to_owned(),
            LedgerChoice::Sqlite(path) => path.display().to_string(),
            LedgerChoice::Redis(url) | LedgerChoice::Postgres(url) => url.clone(),
        }
    );
    println!(
        "A duplicate: an effect applied twice. A false success: the agent said done, and the\n\
         ground truth disagrees. The README's and EXPERIMENT.md's tables are this output;\n\
         --detail adds intervals, effect sizes, calls and latency."
    );
    if let Some(path) = &args.json {
        if let Err(e) = report::write_json(&results, path) {
            eprintln!("error: cannot write {}: {e}", path.display());
            return ExitCode::FAILURE;
        }
        println!("JSON written to {}", path.display());
    }
    if let Some(dir) = args.svg.parent().filter(|d| !d.as_os_str().is_empty())
        && let Err(e) = std::fs::create_dir_all(dir)
    {
        eprintln!("error: cannot create {}: {e}", dir.display());
        return ExitCode::FAILURE;
    }
    if let Err(e) = report::svg(&results, &args.svg) {
        eprintln!("error: cannot draw {}: {e}", args.svg.display());
        return ExitCode::FAILURE;
    }
    println!("Figure 2 written to {}", args.svg.display());
    ExitCode::SUCCESS
}

/// `--planner openai`: each task × level × episode once, with the model
/// planning through the tool set; one line per episode and a total, scored
/// on ground truth.
fn llm_main(args: &Args) -> ExitCode {
    use verified_tools::sim::{SimConfig, episode_seed};
    use verified_tools_suite::llm::{LlmConfig, run_episode};
    let Some(model) = &args.model else {
        eprintln!("error: `--planner openai` needs `--model NAME`");
        return ExitCode::FAILURE;
    };
    if args.believe_ok {
        // The model's tool set runs under the library's default policies.
        eprintln!("error: `--believe-ok` is for the scripted planner's grid");
        return ExitCode::FAILURE;
    }
    let settings = experiment::Settings {
        faults: args.faults,
        legacy_faults: args.legacy_faults,
        ..experiment::Settings::default()
    };
    let mut config = LlmConfig::new(&args.base_url, model);
    if let Ok(key) = std::env::var("OPENAI_API_KEY") {
        config = config.with_api_key(key);
    }
    let runtime = match tokio::runtime::Runtime::new() {
        Ok(runtime) => runtime,
        Err(e) => {
            eprintln!("error: cannot start the runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    let [mut episodes, mut succeeded, mut claimed, mut false_claims, mut duplicated] = [0u32; 5];
    for &task in &args.tasks {
        for &level in &args.levels {
            for i in 0..args.episodes.unwrap_or(1) {
                let seed = episode_seed(args.seed, i);
                let sim = SimConfig::new(seed, settings.profile(level));
                match runtime.block_on(run_episode(&config, task.instance(seed), sim)) {
                    Ok(episode) => {
                        println!("{task} {level} seed {seed}: {episode}");
                        episodes += 1;
                        succeeded += u32::from(episode.success);
                        claimed += u32::from(episode.claimed_success);
                        false_claims += u32::from(episode.claimed_success && !episode.success);
                        duplicated += u32::from(episode.duplicate);
                    }
                    Err(e) => {
                        eprintln!("error: {e}");
                        return ExitCode::FAILURE;
                    }
                }
            }
        }
    }
    println!(
        "{episodes} episodes with {model}: {succeeded} succeeded, {claimed} claimed success \
         ({false_claims} falsely), {duplicated} with a duplicate effect"
    );
    ExitCode::SUCCESS
}
