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
//! cargo run --release --example agent --features openai -- --planner openai \
//!     --base-url http://localhost:11434/v1 --model qwen2.5:7b-instruct --levels medium
//!                                                       # a model plans, in each arm's tool layer
//! ```

use std::io::{IsTerminal, Write};
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use clap::Parser;
use clap::builder::{PossibleValuesParser, TypedValueParser};
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use verified_tools::sim::{FaultLevel, TaskKind};
use verified_tools_suite::experiment::Results;
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
pub struct Args {
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
    /// Methods, comma-separated (retry_only is the baseline of Cohen's h);
    /// all of them by default, and with `--planner openai` the paper's
    /// comparison, retry_only,verify_before_retry. The vbr_* arms run
    /// verify-before-retry against servers that break a promise: no key
    /// deduplication, no deadlines, or neither.
    #[arg(long, value_delimiter = ',', value_parser = names::<Method>(&METHODS))]
    methods: Option<Vec<Method>>,
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
    /// reads and latency per episode (140 columns); with `--planner openai`,
    /// each episode's tool calls and the model's final answer too.
    #[arg(long)]
    detail: bool,
    /// Write the cells as JSON to this path.
    #[arg(long)]
    json: Option<PathBuf>,
    /// Where to draw Figure 2 (SVG) [default: experiment/figure2.svg in the
    /// target directory this program was built in].
    #[arg(long)]
    svg: Option<PathBuf>,
    /// Worker threads (default: all cores; the results do not depend on
    /// it); with `--planner openai`, episodes at once, the requests in
    /// flight at the model server (default 1).
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
    /// Ollama, vLLM, llama.cpp; `OPENAI_API_KEY` is sent if set; needs the
    /// feature `openai`).
    #[arg(long, default_value = "scripted",
          value_parser = PossibleValuesParser::new(["scripted", "openai"]))]
    planner: String,
    #[command(flatten)]
    model: ModelArgs,
}

/// The options of `--planner openai`; refused with the scripted planner.
#[derive(Debug, clap::Args)]
struct ModelArgs {
    /// The API's base URL [default: http://localhost:11434/v1].
    #[arg(long)]
    base_url: Option<String>,
    /// The model's name, as the server knows it.
    #[arg(long, required_if_eq("planner", "openai"))]
    model: Option<String>,
    /// Seconds one request to the model may take [default: 300; 0: no limit].
    #[arg(long)]
    request_timeout: Option<f64>,
    /// Chat completions per episode at most [default: 24].
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..))]
    max_turns: Option<u32>,
    /// Sampling temperature [default: 0], or `server` for the server's own.
    #[arg(long)]
    temperature: Option<Temperature>,
    /// Re-issues of a tool call in doubt, with its id, before the model is
    /// shown the doubt [default: 1].
    #[arg(long)]
    reissues: Option<u32>,
    /// Re-sends of a request the model server failed (HTTP 408, 429, 5xx, a
    /// timeout, a broken answer) before the episode is recorded as failed
    /// [default: 4].
    #[arg(long)]
    retries: Option<u32>,
    /// Seconds before the first re-send; doubled each time, at most 60
    /// [default: 2].
    #[arg(long)]
    backoff: Option<f64>,
}

impl ModelArgs {
    /// The flag of each option given, for the scripted planner's refusal.
    fn given(&self) -> Vec<&'static str> {
        let ModelArgs {
            base_url,
            model,
            request_timeout,
            max_turns,
            temperature,
            reissues,
            retries,
            backoff,
        } = self;
        [
            (base_url.is_some(), "--base-url"),
            (model.is_some(), "--model"),
            (request_timeout.is_some(), "--request-timeout"),
            (max_turns.is_some(), "--max-turns"),
            (temperature.is_some(), "--temperature"),
            (reissues.is_some(), "--reissues"),
            (retries.is_some(), "--retries"),
            (backoff.is_some(), "--backoff"),
        ]
        .into_iter()
        .filter_map(|(given, flag)| given.then_some(flag))
        .collect()
    }
}

/// `--temperature`: a number, or the server's default.
#[cfg_attr(not(feature = "openai"), allow(dead_code))]
#[derive(Debug, Clone, Copy)]
struct Temperature(Option<f64>);

impl std::str::FromStr for Temperature {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        if s == "server" {
            return Ok(Self(None));
        }
        match s.parse::<f64>() {
            Ok(t) if (0.0..=2.0).contains(&t) => Ok(Self(Some(t))),
            _ => Err(format!("expected a number from 0 to 2, or `server`, not {s:?}")),
        }
    }
}

/// A number of seconds, refused unless finite and not negative.
#[cfg_attr(not(feature = "openai"), allow(dead_code))]
fn seconds(flag: &str, value: f64) -> Result<Duration, String> {
    Duration::try_from_secs_f64(value).map_err(|_| format!("{flag} {value}: expected seconds >= 0"))
}

fn main() -> ExitCode {
    let args = Args::parse();
    if args.planner == "openai" {
        return llm_main(args, &mut std::io::stdout());
    }
    let given = args.model.given();
    if !given.is_empty() {
        eprintln!(
            "error: {}: options of `--planner openai`, not of the scripted planner",
            given.join(", ")
        );
        return ExitCode::FAILURE;
    }
    let mut config = Config {
        episodes: args.episodes.unwrap_or(2000),
        seed: args.seed,
        tasks: args.tasks.clone(),
        levels: args.levels.clone(),
        methods: args.methods.clone().unwrap_or_else(|| Method::ALL.to_vec()),
        ledger: args.ledger.clone(),
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
        "{} episodes ({} per cell, seeds {}..) in {:.2} s on {} threads; {}.",
        config.total_episodes(),
        config.episodes,
        config.seed,
        started.elapsed().as_secs_f64(),
        config.threads,
        conditions(&config),
    );
    println!(
        "A duplicate: an effect applied twice. A false success: the agent said done, and the\n\
         ground truth disagrees. The README's and EXPERIMENT.md's tables are this output;\n\
         --detail adds intervals, effect sizes, calls and latency."
    );
    write_outputs(&args, &results, report::json(&results), &mut std::io::stdout())
}

/// The faults, how OK answers are taken, and where calls are recorded.
fn conditions(config: &Config) -> String {
    format!(
        "faults {}{}, OK answers {}; calls recorded in {}",
        config.settings.faults,
        if config.settings.legacy_faults { " (legacy timeouts)" } else { "" },
        if config.settings.believe_ok { "believed" } else { "verified (class default)" },
        match &config.ledger {
            LedgerChoice::Memory => "memory".to_owned(),
            LedgerChoice::Sqlite(path) => path.display().to_string(),
            LedgerChoice::Redis(url) | LedgerChoice::Postgres(url) => url.clone(),
        }
    )
}

/// `--json` if asked, and Figure 2 where asked or beside the target
/// directory's other outputs.
fn write_outputs(
    args: &Args,
    results: &Results,
    json: serde_json::Value,
    out: &mut dyn Write,
) -> ExitCode {
    if let Some(path) = &args.json {
        let text = serde_json::to_string_pretty(&json).unwrap_or_default() + "\n";
        if let Err(e) = std::fs::write(path, text) {
            eprintln!("error: cannot write {}: {e}", path.display());
            return ExitCode::FAILURE;
        }
        let _ = writeln!(out, "JSON written to {}", path.display());
    }
    let svg = args.svg.clone().unwrap_or_else(|| match std::env::current_exe() {
        Ok(exe) => report::default_figure_path(&exe),
        Err(_) => report::default_figure_path(std::path::Path::new("")),
    });
    if let Some(dir) = svg.parent().filter(|d| !d.as_os_str().is_empty())
        && let Err(e) = std::fs::create_dir_all(dir)
    {
        eprintln!("error: cannot create {}: {e}", dir.display());
        return ExitCode::FAILURE;
    }
    if let Err(e) = report::svg(results, &svg) {
        eprintln!("error: cannot draw {}: {e}", svg.display());
        return ExitCode::FAILURE;
    }
    let _ = writeln!(out, "Figure 2 written to {}", svg.display());
    ExitCode::SUCCESS
}

/// `--planner openai` in a build without the feature: say which command
/// brings it.
#[cfg(not(feature = "openai"))]
pub fn llm_main(_: Args, _: &mut dyn Write) -> ExitCode {
    eprintln!(
        "error: this build has no model client: run `cargo run --release --example agent \
         --features openai -- --planner openai --model NAME ..`"
    );
    ExitCode::FAILURE
}

/// `--planner openai`: each task × level × episode × method, with the model
/// planning over the method's tool layer; one line per episode, then the
/// table, the tally (episodes the model server failed included) and the
/// outputs, as for the scripted planner.
#[cfg(feature = "openai")]
pub fn llm_main(args: Args, out: &mut dyn Write) -> ExitCode {
    use verified_tools_suite::llm::{LlmConfig, run_grid};
    let llm = match llm_config(&args.model) {
        Ok(llm) => llm,
        Err(e) => {
            eprintln!("error: {e}");
            return ExitCode::FAILURE;
        }
    };
    let config = Config {
        episodes: args.episodes.unwrap_or(1),
        seed: args.seed,
        tasks: args.tasks.clone(),
        levels: args.levels.clone(),
        methods: args
            .methods
            .clone()
            .unwrap_or_else(|| vec![Method::RetryOnly, Method::VerifyBeforeRetry]),
        ledger: args.ledger.clone(),
        threads: args.threads.map_or(1, |t| usize::try_from(t).unwrap_or(usize::MAX)),
        settings: experiment::Settings {
            faults: args.faults,
            legacy_faults: args.legacy_faults,
            believe_ok: args.believe_ok,
            ..experiment::Settings::default()
        },
    };
    let started = Instant::now();
    let detail = args.detail;
    let run = run_grid(&llm, &config, &mut |e| {
        let what = format!("{} {} {} seed {}", e.task, e.level, e.method.label(), e.seed);
        let _ = match &e.result {
            Ok(episode) if detail => writeln!(out, "{what}: {episode}{}", episode.detail()),
            Ok(episode) => writeln!(out, "{what}: {episode}"),
            Err(error) => writeln!(out, "{what}: FAILED, {error}"),
        };
    });
    let run = match run {
        Ok(run) => run,
        Err(e) => {
            eprintln!("error: {e}");
            return ExitCode::FAILURE;
        }
    };
    let _ = writeln!(out);
    if args.detail {
        let _ = write!(out, "{}", report::table(&run.results));
    } else {
        let _ = write!(out, "{}", report::summary(&run.results));
    }
    let t = run.total();
    let LlmConfig { model, .. } = &llm;
    let _ = writeln!(
        out,
        "{} episodes with {model} in {:.1} s, {} at once; {}.\n{} finished: {} succeeded, {} \
         claimed success ({} falsely), {} with a duplicate effect; {} failed (the model server \
         kept failing); {} requests re-sent.",
        run.episodes(),
        started.elapsed().as_secs_f64(),
        config.threads,
        conditions(&config),
        t.episodes,
        t.successes,
        t.claimed,
        t.false_successes,
        t.duplicates,
        run.failed.len(),
        run.resent,
    );
    for (task, level, method, seed, error) in &run.failed {
        let _ = writeln!(out, "  failed: {task} {level} {} seed {seed}: {error}", method.label());
    }
    let _ = writeln!(
        out,
        "Rates are over the finished episodes; latency is wall time, the model's included."
    );
    let mut json = report::json(&run.results);
    json["planner"] = serde_json::json!({
        "model": model,
        "base_url": llm.base_url,
        "episodes_failed": run.failed.iter().map(|(task, level, method, seed, error)| {
            serde_json::json!({"task": task.name(), "level": level.name(),
                               "method": method.name(), "seed": seed, "error": error})
        }).collect::<Vec<_>>(),
        "requests_resent": run.resent,
    });
    let written = write_outputs(&args, &run.results, json, out);
    if t.episodes == 0 {
        eprintln!("error: the model server failed every episode");
        return ExitCode::FAILURE;
    }
    written
}

/// The model's configuration from the options, with their defaults.
#[cfg(feature = "openai")]
fn llm_config(m: &ModelArgs) -> Result<verified_tools_suite::llm::LlmConfig, String> {
    use verified_tools_suite::llm::LlmConfig;
    let model = m.model.as_deref().ok_or("`--planner openai` needs `--model NAME`")?;
    let base_url = m.base_url.as_deref().unwrap_or("http://localhost:11434/v1");
    let mut llm = LlmConfig::new(base_url, model);
    if let Ok(key) = std::env::var("OPENAI_API_KEY") {
        llm = llm.with_api_key(key);
    }
    if let Some(limit) = m.request_timeout {
        let limit = seconds("--request-timeout", limit)?;
        llm = llm.with_request_timeout((!limit.is_zero()).then_some(limit));
    }
    if let Some(turns) = m.max_turns {
        llm = llm.with_max_turns(turns);
    }
    if let Some(Temperature(t)) = m.temperature {
        llm = llm.with_temperature(t);
    }
    if let Some(times) = m.reissues {
        let after = llm.reissue_after;
        llm = llm.with_reissues(times, after);
    }
    let backoff = m.backoff.map(|b| seconds("--backoff", b)).transpose()?;
    let (retries, backoff) = (m.retries.unwrap_or(llm.retries), backoff.unwrap_or(llm.backoff));
    Ok(llm.with_retries(retries, backoff))
}
