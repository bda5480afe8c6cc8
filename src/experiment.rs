//! The experiment of sections 5 and 6: the same agent under each method,
//! over tasks × fault levels × N seeded episodes, scored on ground truth.
//!
//! Episode `i` of every cell runs with seed `base + i`, so every method of a
//! (task, level) faces the same fault stream. Each episode runs on a
//! current-thread tokio runtime with paused time: backoff, timeouts and
//! verifier intervals cost virtual time only. Episodes are spread over
//! threads; every statistic is an integer sum, so the totals do not depend
//! on which thread ran which episode.

use std::fmt;
use std::str::FromStr;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use verified_tools::sim::{
    FaultLevel, FaultProfile, SimConfig, SimServer, Task, TaskKind, episode_seed,
};
use verified_tools::{Context, Mode, TokioClock, VerifyBudget};

use crate::agent::{self, AgentReport, TaskPlanner};
use crate::tools::SimClient;

/// How the agent handles ambiguous tool results: the paper's arms and our
/// ablations.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Method {
    /// The paper's baseline: blind retry (budget 1), no verification, no
    /// idempotency key sent.
    RetryOnly,
    /// Verify after an ambiguous failure or a compound write, never retry
    /// (and never re-plan: "reports failure without retrying").
    VerifyOnly,
    /// Verify before any retry, keys sent to a server that honours them.
    VerifyBeforeRetry,
    /// Ablation: blind retry with keys sent, no verification.
    KeysOnly,
    /// Ablation: verify-before-retry against a server that ignores keys.
    VbrNoServerKeys,
}

impl Method {
    /// Every method, baseline first.
    pub const ALL: [Method; 5] = [
        Method::RetryOnly,
        Method::VerifyOnly,
        Method::VerifyBeforeRetry,
        Method::KeysOnly,
        Method::VbrNoServerKeys,
    ];

    /// The method the others are compared against (Cohen's h).
    pub const BASELINE: Method = Method::RetryOnly;

    /// The snake_case name, as printed and parsed.
    pub const fn name(self) -> &'static str {
        match self {
            Method::RetryOnly => "retry_only",
            Method::VerifyOnly => "verify_only",
            Method::VerifyBeforeRetry => "verify_before_retry",
            Method::KeysOnly => "keys_only",
            Method::VbrNoServerKeys => "vbr_no_server_keys",
        }
    }

    /// The engine mode.
    pub const fn mode(self) -> Mode {
        match self {
            Method::RetryOnly | Method::KeysOnly => Mode::RetryOnly,
            Method::VerifyOnly => Mode::VerifyOnly,
            Method::VerifyBeforeRetry | Method::VbrNoServerKeys => Mode::VerifyBeforeRetry,
        }
    }

    /// Whether the agent sends its idempotency keys.
    pub const fn forwards_keys(self) -> bool {
        !matches!(self, Method::RetryOnly)
    }

    /// Whether the server deduplicates keys.
    pub const fn server_honours_keys(self) -> bool {
        !matches!(self, Method::VbrNoServerKeys)
    }

    /// Re-plans per step allowed (verify-only never tries again).
    pub const fn replans(self, default: u32) -> u32 {
        if matches!(self, Method::VerifyOnly) { 0 } else { default }
    }
}

impl fmt::Display for Method {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for Method {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let names: Vec<_> = Method::ALL.iter().map(|m| m.name()).collect();
        Method::ALL
            .into_iter()
            .find(|m| m.name() == s.trim())
            .ok_or_else(|| format!("unknown method {s:?}: expected one of {}", names.join(", ")))
    }
}

/// Knobs shared by every method, so they compare on equal terms.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Settings {
    /// The verifier's read budget. The default believes `Absent` only after
    /// 4 consecutive reads 400 ms apart: longer than the simulated replica's
    /// worst lag (2 reads and 1 s), so a delayed write is never mistaken for
    /// a missing one (section 4.3, implication 3).
    pub verify: VerifyBudget,
    /// Virtual time every answered server call takes.
    pub latency: Duration,
    /// Re-plans of a step after `NotApplied`/`Failed`.
    pub replans: u32,
}

impl Default for Settings {
    fn default() -> Self {
        Self {
            verify: VerifyBudget::new(6, Duration::from_millis(400)).with_absent_reads(4),
            latency: Duration::from_millis(20),
            replans: 2,
        }
    }
}

/// One episode to run.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct EpisodeSpec {
    /// The task and its arguments.
    pub task: Task,
    /// The faults.
    pub profile: FaultProfile,
    /// The fault seed.
    pub seed: u64,
    /// The method.
    pub method: Method,
    /// The shared knobs.
    pub settings: Settings,
}

/// What one episode did, scored on ground truth.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Episode {
    /// The task's postcondition holds on the true state.
    pub success: bool,
    /// The agent reported success.
    pub claimed: bool,
    /// Some effect was applied more than once.
    pub duplicate: bool,
    /// Tool dispatches (attempts, observation reads included).
    pub tool_calls: u32,
    /// Verifier reads.
    pub verifier_calls: u32,
    /// Virtual time the episode took, in ms.
    pub virtual_ms: u64,
}

/// Runs one episode on the current (paused-time) runtime.
pub async fn episode(spec: &EpisodeSpec) -> Episode {
    episode_traced(spec).await.0
}

/// [`episode`], with the agent's report (its calls and outcomes).
pub async fn episode_traced(spec: &EpisodeSpec) -> (Episode, AgentReport) {
    let method = spec.method;
    let config = SimConfig::new(spec.seed, spec.profile)
        .with_honour_keys(method.server_honours_keys())
        .with_latency(spec.settings.latency);
    let (server, oracle) = SimServer::new(config);
    let client = SimClient::new(server, method.forwards_keys());
    let cx = Context::new("example-agent")
        .with_mode(method.mode())
        .map_policies(|_, p| p.with_verify(spec.settings.verify))
        .with_clock(Arc::new(TokioClock::starting_at(0)));
    let mut planner = TaskPlanner::new(spec.task, method.replans(spec.settings.replans));
    let start = tokio::time::Instant::now();
    let run = format!("episode-{}", spec.seed);
    let report = agent::run(&cx, &client, &run, &mut planner).await;
    let truth = oracle.truth();
    let episode = Episode {
        success: spec.task.holds(&truth),
        claimed: report.claimed_success,
        duplicate: truth.has_duplicates(),
        tool_calls: client.calls(),
        verifier_calls: client.verifier_reads(),
        virtual_ms: start.elapsed().as_millis() as u64,
    };
    (episode, report)
}

/// A current-thread runtime with paused time, as every episode needs.
pub fn paused_runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .start_paused(true)
        .build()
        .expect("a current-thread runtime builds")
}

/// Runs one episode on a fresh paused runtime.
pub fn run_episode(spec: &EpisodeSpec) -> Episode {
    paused_runtime().block_on(episode(spec))
}

/// Totals of one cell (task × level × method).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct CellStats {
    /// Episodes run.
    pub episodes: u64,
    /// Episodes whose postcondition holds.
    pub successes: u64,
    /// Episodes with any effect applied more than once.
    pub duplicates: u64,
    /// Episodes the agent reported as successful.
    pub claimed: u64,
    /// Episodes reported successful whose postcondition does not hold.
    pub false_successes: u64,
    /// Tool dispatches, summed.
    pub tool_calls: u64,
    /// Verifier reads, summed.
    pub verifier_calls: u64,
    /// Virtual ms, summed.
    pub virtual_ms: u64,
}

impl CellStats {
    /// Adds one episode.
    pub fn add(&mut self, e: &Episode) {
        self.episodes += 1;
        self.successes += u64::from(e.success);
        self.duplicates += u64::from(e.duplicate);
        self.claimed += u64::from(e.claimed);
        self.false_successes += u64::from(e.claimed && !e.success);
        self.tool_calls += u64::from(e.tool_calls);
        self.verifier_calls += u64::from(e.verifier_calls);
        self.virtual_ms += e.virtual_ms;
    }

    /// Adds another cell's totals.
    pub fn merge(&mut self, o: &CellStats) {
        self.episodes += o.episodes;
        self.successes += o.successes;
        self.duplicates += o.duplicates;
        self.claimed += o.claimed;
        self.false_successes += o.false_successes;
        self.tool_calls += o.tool_calls;
        self.verifier_calls += o.verifier_calls;
        self.virtual_ms += o.virtual_ms;
    }

    /// `x / episodes` (0 for an empty cell).
    pub fn per_episode(&self, x: u64) -> f64 {
        if self.episodes == 0 { 0.0 } else { x as f64 / self.episodes as f64 }
    }
}

/// The grid to run.
#[derive(Debug, Clone, PartialEq)]
pub struct Config {
    /// Episodes per cell.
    pub episodes: u64,
    /// Base seed; episode `i` uses `seed + i`.
    pub seed: u64,
    /// Tasks, in table order.
    pub tasks: Vec<TaskKind>,
    /// Levels, in table order.
    pub levels: Vec<FaultLevel>,
    /// Methods, in table order.
    pub methods: Vec<Method>,
    /// Worker threads (at least 1).
    pub threads: usize,
    /// Shared knobs.
    pub settings: Settings,
}

impl Default for Config {
    /// The paper's size: 25 episodes, seed 42, every task, level and method,
    /// all cores.
    fn default() -> Self {
        Self {
            episodes: 25,
            seed: verified_tools::sim::BASE_SEED,
            tasks: TaskKind::ALL.to_vec(),
            levels: FaultLevel::ALL.to_vec(),
            methods: Method::ALL.to_vec(),
            threads: std::thread::available_parallelism().map_or(1, |n| n.get()),
            settings: Settings::default(),
        }
    }
}

impl Config {
    /// Episodes in the whole grid.
    pub fn total_episodes(&self) -> u64 {
        (self.tasks.len() * self.levels.len() * self.methods.len()) as u64 * self.episodes
    }
}

/// One cell of the grid with its totals.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Cell {
    /// The task.
    pub task: TaskKind,
    /// The fault level.
    pub level: FaultLevel,
    /// The method.
    pub method: Method,
    /// Its totals.
    pub stats: CellStats,
}

/// The whole grid's results, cells in task, level, method order.
#[derive(Debug, Clone, PartialEq)]
pub struct Results {
    /// What was run.
    pub config: Config,
    /// The cells.
    pub cells: Vec<Cell>,
}

impl Results {
    /// The baseline cell of the same task and level, if it was run.
    pub fn baseline(&self, cell: &Cell) -> Option<&Cell> {
        self.cells
            .iter()
            .find(|c| c.task == cell.task && c.level == cell.level && c.method == Method::BASELINE)
    }
}

/// Episodes per unit of work handed to a thread.
const CHUNK: u64 = 64;

/// Runs the grid; `progress` is told how many episodes each finished chunk
/// held.
pub fn run(config: &Config, progress: &(dyn Fn(u64) + Sync)) -> Results {
    let mut cells = Vec::new();
    for &task in &config.tasks {
        for &level in &config.levels {
            for &method in &config.methods {
                cells.push(Cell { task, level, method, stats: CellStats::default() });
            }
        }
    }
    let chunks = config.episodes.div_ceil(CHUNK);
    let jobs = cells.len() * chunks as usize;
    let next = AtomicUsize::new(0);
    let worker = || {
        let rt = paused_runtime();
        let mut local = vec![CellStats::default(); cells.len()];
        loop {
            let job = next.fetch_add(1, Ordering::Relaxed);
            if job >= jobs {
                return local;
            }
            let (ci, chunk) = (job / chunks as usize, job as u64 % chunks);
            let cell = &cells[ci];
            let range = chunk * CHUNK..((chunk + 1) * CHUNK).min(config.episodes);
            let n = range.end - range.start;
            for i in range {
                let seed = episode_seed(config.seed, i);
                let spec = EpisodeSpec {
                    task: cell.task.instance(seed),
                    profile: cell.level.profile(),
                    seed,
                    method: cell.method,
                    settings: config.settings,
                };
                local[ci].add(&rt.block_on(episode(&spec)));
            }
            progress(n);
        }
    };
    let threads = config.threads.clamp(1, jobs.max(1));
    let locals: Vec<Vec<CellStats>> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..threads).map(|_| s.spawn(worker)).collect();
        handles.into_iter().map(|h| h.join().expect("an experiment worker panicked")).collect()
    });
    for local in &locals {
        for (cell, stats) in cells.iter_mut().zip(local) {
            cell.stats.merge(stats);
        }
    }
    Results { config: config.clone(), cells }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn methods_parse_and_differ_only_where_intended() {
        for m in Method::ALL {
            assert_eq!(m.name().parse::<Method>(), Ok(m));
        }
        assert!("retry".parse::<Method>().is_err());
        // The baseline alone sends no key; the ablation alone talks to a
        // server that ignores them; verify-only alone never re-plans.
        let keyless: Vec<_> = Method::ALL.into_iter().filter(|m| !m.forwards_keys()).collect();
        assert_eq!(keyless, [Method::RetryOnly]);
        assert!(!Method::VbrNoServerKeys.server_honours_keys());
        assert_eq!(Method::VerifyOnly.replans(2), 0);
        assert_eq!(Method::KeysOnly.mode(), Mode::RetryOnly);
    }

    #[test]
    fn cell_stats_add_up() {
        let mut s = CellStats::default();
        let e = Episode { claimed: true, tool_calls: 3, virtual_ms: 10, ..Episode::default() };
        s.add(&e);
        s.add(&Episode { success: true, claimed: true, duplicate: true, ..e });
        assert_eq!((s.episodes, s.successes, s.duplicates, s.false_successes), (2, 1, 1, 1));
        assert_eq!((s.tool_calls, s.virtual_ms, s.per_episode(s.tool_calls)), (6, 20, 3.0));
    }
}
