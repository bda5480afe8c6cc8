//! The experiment of sections 5 and 6: the same agent under each method,
//! over tasks × fault levels × N seeded episodes, scored on ground truth.
//!
//! Episode `i` of every cell runs with seed `base + i`, so every method of a
//! (task, level) faces the same fault stream. Each episode runs on a
//! current-thread tokio runtime with paused time: backoff, timeouts and
//! verifier intervals cost virtual time only. Episodes are spread over
//! threads; every statistic is an integer sum, so the totals do not depend
//! on which thread ran which episode.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use verified_tools::ledger::Ledger;
use verified_tools::sim::{
    FaultLevel, FaultProfile, SimConfig, SimServer, Task, TaskKind, episode_seed,
};
use verified_tools::{Context, TokioClock, VerifyBudget};

use crate::agent::{self, AgentReport, Outcome, TaskPlanner};
use crate::tools::{SimClient, settle_margin};

mod ledger;
mod method;
#[cfg(any(feature = "redis", feature = "postgres"))]
mod real_time;

pub use ledger::LedgerChoice;
pub use method::{FaultModel, Method};

/// Knobs shared by every method, so they compare on equal terms.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Settings {
    /// The verifier's read budget per verification round: 6 reads 400 ms
    /// apart. A `Holds` ends the round; an `Absent` is believed only after
    /// the settle point (the engine waits for it and reads once more), so
    /// the budget only decides how soon an effect is seen, never whether
    /// a missing one is believed missing.
    pub verify: VerifyBudget,
    /// Virtual time every answered server call takes.
    pub latency: Duration,
    /// Re-plans of a step after `NotApplied`/`Failed`.
    pub replans: u32,
    /// The deadline of each attempt, forwarded to the server: 1 s, the
    /// simulator's `timeout_after`, so the client gives up when it tells
    /// the server to.
    pub attempt_timeout: Duration,
    /// Re-issues of a call that ended `Unknown` (as the same logical call).
    pub reissues: u32,
    /// The pause before a re-issue: 30 s, by when all but 0.3% of late
    /// arrivals have landed (their delay exceeds 30 s with probability
    /// 0.1 s / 30 s) — what matters on a server that ignores deadlines,
    /// where the effect of a call in doubt may still appear.
    pub reissue_after: Duration,
    /// Run the simulator as it was before late arrivals and the lag tail
    /// ([`FaultProfile::legacy`]): timeouts split before/after applying.
    pub legacy_faults: bool,
    /// Which faults are drawn: Table 1's, or Table 1's plus partial OKs.
    pub faults: FaultModel,
    /// Believe every OK answer: `verify_response` off for every tool (the
    /// control). Off (the default), every tool keeps its class default:
    /// the experiment's writes are all `high`, so each verifies an OK
    /// answer with one read before it reports `Success`.
    pub believe_ok: bool,
}

impl Default for Settings {
    fn default() -> Self {
        Self {
            verify: VerifyBudget::new(6, Duration::from_millis(400)),
            latency: Duration::from_millis(20),
            replans: 2,
            attempt_timeout: Duration::from_secs(1),
            reissues: 1,
            reissue_after: Duration::from_secs(30),
            legacy_faults: false,
            faults: FaultModel::Table1,
            believe_ok: false,
        }
    }
}

impl Settings {
    /// The fault profile of a level under these settings.
    pub fn profile(&self, level: FaultLevel) -> FaultProfile {
        let profile = self.faults.profile(level);
        if self.legacy_faults { profile.legacy() } else { profile }
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

impl EpisodeSpec {
    /// The server this episode runs against.
    pub fn server(&self) -> SimConfig {
        SimConfig::new(self.seed, self.profile)
            .with_honour_keys(self.method.server_honours_keys())
            .with_honour_deadlines(self.method.server_honours_deadlines())
            .with_latency(self.settings.latency)
    }

    /// The settle margin the agent sets: what the service documents for a
    /// deadline-honouring server, whether or not this one keeps it; `None`
    /// for the arm that keeps the library's default.
    pub fn settle_margin(&self) -> Option<Duration> {
        let documented = self.server().with_honour_deadlines(true);
        settle_margin(&documented).filter(|_| self.method.uses_settle_margin())
    }
}

impl EpisodeSpec {
    /// The agent's name and the run id its calls are keyed under, for an
    /// agent called `agent`.
    pub fn identity(&self, agent: &str, shared: Option<&Shared>) -> (String, String) {
        // Every episode has a world of its own: in a shared store its calls
        // are those of an agent of its own, so that a declared effect
        // identity (`key(customer)`) never meets another world's customer of
        // that id.
        match shared {
            Some(shared) => {
                let (task, method, seed) = (self.task.kind().name(), self.method, self.seed);
                let run = format!("{}-{task}-{method}-{seed}", shared.run);
                (format!("{agent}/{run}"), run)
            }
            None => (agent.to_owned(), format!("episode-{}", self.seed)),
        }
    }

    /// The agent's context under this episode's method: its engine mode,
    /// and every tool's policy with the shared knobs (verifier budget,
    /// attempt timeout, settle margin, `verify_response` unless OK answers
    /// are believed), on a tokio clock; its calls recorded in `shared`'s
    /// ledger if given. The scripted planner and the model planner run
    /// their tools under this one context, so that their arms differ in
    /// the tool layer only.
    pub fn context(&self, agent: impl Into<Arc<str>>, shared: Option<&Shared>) -> Context {
        let settings = self.settings;
        let settle = self.settle_margin();
        let cx = Context::new(agent)
            .with_mode(self.method.mode())
            .map_policies(|_, p| {
                let verify_response = p.verify_response && !settings.believe_ok;
                p.with_verify(settings.verify)
                    .with_attempt_timeout(Some(settings.attempt_timeout))
                    .with_settle(settle)
                    .with_verify_response(verify_response)
            })
            .with_clock(Arc::new(TokioClock::starting_at(0)));
        match shared {
            Some(shared) => cx.with_ledger(Arc::clone(&shared.ledger)),
            None => cx,
        }
    }
}

/// What one episode did, scored on the ground truth once every late
/// arrival has landed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Episode {
    /// The task's postcondition holds on the final true state.
    pub success: bool,
    /// The agent reported success.
    pub claimed: bool,
    /// Some effect was applied more than once.
    pub duplicate: bool,
    /// The agent stopped on a call still in doubt (`Unknown`).
    pub in_doubt: bool,
    /// Tool dispatches (attempts, observation reads included).
    pub tool_calls: u32,
    /// Verifier reads.
    pub verifier_calls: u32,
    /// Virtual time the agent took, in ms (late arrivals that land after it
    /// stopped are not counted).
    pub virtual_ms: u64,
}

/// Runs one episode on the current (paused-time) runtime, its calls
/// recorded in an in-memory ledger of its own.
pub async fn episode(spec: &EpisodeSpec) -> Episode {
    episode_traced(spec, None).await.0
}

/// [`episode`], with the agent's report (its calls and outcomes); its calls
/// are recorded in `shared` if given (under run ids of their own), else in an
/// in-memory ledger of the episode's own.
pub async fn episode_traced(spec: &EpisodeSpec, shared: Option<&Shared>) -> (Episode, AgentReport) {
    let method = spec.method;
    let settings = spec.settings;
    let (server, oracle) = SimServer::new(spec.server());
    let client = SimClient::new(server, method.forwards_keys());
    let (agent, run) = spec.identity("example-agent", shared);
    let cx = spec.context(agent, shared);
    let mut planner = TaskPlanner::new(spec.task, method.replans(settings.replans))
        .with_reissues(settings.reissues, settings.reissue_after);
    let start = tokio::time::Instant::now();
    let report = agent::run(&cx, &client, &run, &mut planner).await;
    let virtual_ms = start.elapsed().as_millis() as u64;
    let truth = oracle.final_truth().await;
    let in_doubt = report.trace.last().is_some_and(|s| matches!(s.outcome, Outcome::Unknown(_)));
    let episode = Episode {
        success: spec.task.holds(&truth),
        claimed: report.claimed_success,
        duplicate: truth.has_duplicates(),
        in_doubt: in_doubt && !report.claimed_success,
        tool_calls: client.calls(),
        verifier_calls: client.verifier_reads(),
        virtual_ms,
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
    /// Episodes that stopped on a call still in doubt.
    pub in_doubt: u64,
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
        self.in_doubt += u64::from(e.in_doubt);
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
        self.in_doubt += o.in_doubt;
        self.tool_calls += o.tool_calls;
        self.verifier_calls += o.verifier_calls;
        self.virtual_ms += o.virtual_ms;
    }

    /// `x / episodes` (0 for an empty cell).
    pub fn per_episode(&self, x: u64) -> f64 {
        if self.episodes == 0 { 0.0 } else { x as f64 / self.episodes as f64 }
    }
}

/// A ledger shared by every episode of a run, with the run's id (so that
/// two runs, or two processes, never share a key by accident; the episode
/// adds its task, method and seed).
#[derive(Clone)]
pub struct Shared {
    /// The ledger.
    pub ledger: Arc<dyn Ledger>,
    /// This run's id.
    pub run: String,
}

impl Shared {
    /// A run id no other run of this host has used: the process id and the
    /// time in ms.
    pub fn fresh_run_id() -> String {
        format!(
            "run-{}-{}",
            std::process::id(),
            std::time::SystemTime::UNIX_EPOCH.elapsed().map_or(0, |d| d.as_millis())
        )
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
    /// Where calls are recorded.
    pub ledger: LedgerChoice,
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
            ledger: LedgerChoice::Memory,
        }
    }
}

impl Config {
    /// Episode `i` of `cell`: what it runs, and the run's shared ledger (if
    /// any) under the run's id and the cell's level. The same for the
    /// scripted planner and the model's.
    pub fn episode(
        &self,
        cell: &Cell,
        i: u64,
        ledger: Option<&Arc<dyn Ledger>>,
        run_id: &str,
    ) -> (EpisodeSpec, Option<Shared>) {
        let seed = episode_seed(self.seed, i);
        let spec = EpisodeSpec {
            task: cell.task.instance(seed),
            profile: self.settings.profile(cell.level),
            seed,
            method: cell.method,
            settings: self.settings,
        };
        let shared = ledger.map(|ledger| Shared {
            ledger: Arc::clone(ledger),
            run: format!("{run_id}-{}", cell.level),
        });
        (spec, shared)
    }

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
/// held. Fails only when the configured ledger cannot be opened.
pub fn run(config: &Config, progress: &(dyn Fn(u64) + Sync)) -> Result<Results, String> {
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
    let run_id = Shared::fresh_run_id();
    let worker = || -> Result<Vec<CellStats>, String> {
        let rt = paused_runtime();
        // A handle per worker: a store's connection lives on its runtime.
        let ledger = config.ledger.open()?;
        let mut local = vec![CellStats::default(); cells.len()];
        loop {
            let job = next.fetch_add(1, Ordering::Relaxed);
            if job >= jobs {
                return Ok(local);
            }
            let (ci, chunk) = (job / chunks as usize, job as u64 % chunks);
            let cell = &cells[ci];
            let range = chunk * CHUNK..((chunk + 1) * CHUNK).min(config.episodes);
            let n = range.end - range.start;
            for i in range {
                let (spec, shared) = config.episode(cell, i, ledger.as_ref(), &run_id);
                local[ci].add(&rt.block_on(episode_traced(&spec, shared.as_ref())).0);
            }
            progress(n);
        }
    };
    let threads = config.threads.clamp(1, jobs.max(1));
    let locals: Vec<Vec<CellStats>> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..threads).map(|_| s.spawn(worker)).collect();
        handles
            .into_iter()
            .map(|h| h.join().expect("an experiment worker panicked"))
            .collect::<Result<_, String>>()
    })?;
    for local in &locals {
        for (cell, stats) in cells.iter_mut().zip(local) {
            cell.stats.merge(stats);
        }
    }
    Ok(Results { config: config.clone(), cells })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cell_stats_add_up() {
        let mut s = CellStats::default();
        let e = Episode { claimed: true, tool_calls: 3, virtual_ms: 10, ..Episode::default() };
        s.add(&e);
        s.add(&Episode { success: true, claimed: true, duplicate: true, ..e });
        s.add(&Episode { in_doubt: true, ..Episode::default() });
        assert_eq!((s.episodes, s.successes, s.duplicates, s.false_successes), (3, 1, 1, 1));
        assert_eq!((s.claimed, s.in_doubt), (2, 1));
        let mut t = CellStats::default();
        t.merge(&s);
        t.merge(&s);
        assert_eq!((t.episodes, t.in_doubt, t.tool_calls), (6, 2, 12));
        assert_eq!((s.tool_calls, s.virtual_ms, s.per_episode(s.tool_calls)), (6, 20, 2.0));
    }
}
