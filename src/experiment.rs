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

use verified_tools::ledger::Ledger;
use verified_tools::sim::{
    FaultLevel, FaultProfile, SimConfig, SimServer, Task, TaskKind, episode_seed,
};
use verified_tools::{Context, Mode, TokioClock, VerifyBudget};

use crate::agent::{self, AgentReport, Outcome, TaskPlanner};
use crate::tools::{SimClient, settle_margin};

mod ledger;
#[cfg(any(feature = "redis", feature = "postgres"))]
mod real_time;

pub use ledger::LedgerChoice;

/// How the agent handles ambiguous tool results, and against which server:
/// the paper's arms and our ablations.
///
/// The servers differ in two promises: deduplicating idempotency keys, and
/// honouring deadlines (dropping a request that reaches them after its
/// deadline, so that nothing lands after the settle point). Every agent
/// forwards each attempt's deadline; every agent that verifies uses the
/// settle margin the service documents for a deadline-honouring server
/// ([`settle_margin`]) — on a server that ignores deadlines that promise is
/// broken, which is what the `vbr_no_deadlines` and `vbr_neither` arms
/// measure — except `vbr_neither_unsettled`, which keeps the library's
/// default (no margin: an `Absent` after an ambiguous failure is never
/// believed).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Method {
    /// The paper's baseline: blind retry (budget 1), no verification, no
    /// idempotency key sent.
    RetryOnly,
    /// Verify after an ambiguous failure or an OK answer, never retry (and
    /// never re-plan: "reports failure without retrying").
    VerifyOnly,
    /// Verify before any retry, keys sent to a server that honours keys and
    /// deadlines.
    VerifyBeforeRetry,
    /// Ablation: blind retry with keys sent, no verification.
    KeysOnly,
    /// Verify-before-retry against a server that honours keys but ignores
    /// deadlines.
    VbrNoDeadlines,
    /// Verify-before-retry against a server that ignores keys but honours
    /// deadlines.
    VbrNoServerKeys,
    /// Verify-before-retry against a server that ignores keys and deadlines.
    VbrNeither,
    /// As [`VbrNeither`](Self::VbrNeither), with the library's default of no
    /// settle margin: the agent does not rely on a promise the server
    /// does not make.
    VbrNeitherUnsettled,
}

impl Method {
    /// Every method, baseline first.
    pub const ALL: [Method; 8] = [
        Method::RetryOnly,
        Method::VerifyOnly,
        Method::VerifyBeforeRetry,
        Method::KeysOnly,
        Method::VbrNoDeadlines,
        Method::VbrNoServerKeys,
        Method::VbrNeither,
        Method::VbrNeitherUnsettled,
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
            Method::VbrNoDeadlines => "vbr_no_deadlines",
            Method::VbrNoServerKeys => "vbr_no_server_keys",
            Method::VbrNeither => "vbr_neither",
            Method::VbrNeitherUnsettled => "vbr_neither_unsettled",
        }
    }

    /// The method in plain words, as the summary table shows it.
    pub const fn label(self) -> &'static str {
        match self {
            Method::RetryOnly => "retry blindly (baseline)",
            Method::VerifyOnly => "verify, never retry",
            Method::VerifyBeforeRetry => "verify before retry",
            Method::KeysOnly => "retry blindly, with keys",
            Method::VbrNoDeadlines => "verify+retry, no deadlines",
            Method::VbrNoServerKeys => "verify+retry, no keys",
            Method::VbrNeither => "verify+retry, neither",
            Method::VbrNeitherUnsettled => "verify+retry, neither, no margin",
        }
    }

    /// The engine mode.
    pub const fn mode(self) -> Mode {
        match self {
            Method::RetryOnly | Method::KeysOnly => Mode::RetryOnly,
            Method::VerifyOnly => Mode::VerifyOnly,
            Method::VerifyBeforeRetry
            | Method::VbrNoDeadlines
            | Method::VbrNoServerKeys
            | Method::VbrNeither
            | Method::VbrNeitherUnsettled => Mode::VerifyBeforeRetry,
        }
    }

    /// Whether the agent sends its idempotency keys.
    pub const fn forwards_keys(self) -> bool {
        !matches!(self, Method::RetryOnly)
    }

    /// Whether the server deduplicates keys.
    pub const fn server_honours_keys(self) -> bool {
        !matches!(self, Method::VbrNoServerKeys | Method::VbrNeither | Method::VbrNeitherUnsettled)
    }

    /// Whether the server drops requests that reach it after their deadline.
    pub const fn server_honours_deadlines(self) -> bool {
        !matches!(self, Method::VbrNoDeadlines | Method::VbrNeither | Method::VbrNeitherUnsettled)
    }

    /// Whether the agent sets the settle margin a deadline-honouring server
    /// documents (all but `vbr_neither_unsettled`).
    pub const fn uses_settle_margin(self) -> bool {
        !matches!(self, Method::VbrNeitherUnsettled)
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

/// Which faults the simulator draws: Table 1's, or Table 1's plus partial
/// OKs (compound writes applied in part that answer as if applied in full,
/// [`FaultLevel::partial_ok_profile`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum FaultModel {
    /// Table 1's four faults ([`FaultLevel::profile`]): a partial success
    /// answers OK with what it wrote.
    #[default]
    Table1,
    /// Table 1's four faults and, independently and at the level's partial
    /// rate, the partial OK ([`FaultLevel::partial_ok_profile`]). Every
    /// Table 1 fault of every seed is where it was.
    PartialOk,
}

impl FaultModel {
    /// Both models, the default first.
    pub const ALL: [FaultModel; 2] = [FaultModel::Table1, FaultModel::PartialOk];

    /// The name, as printed and parsed.
    pub const fn name(self) -> &'static str {
        match self {
            FaultModel::Table1 => "table1",
            FaultModel::PartialOk => "partial-ok",
        }
    }

    /// The profile of a level under this model.
    pub const fn profile(self, level: FaultLevel) -> FaultProfile {
        match self {
            FaultModel::Table1 => level.profile(),
            FaultModel::PartialOk => level.partial_ok_profile(),
        }
    }
}

impl fmt::Display for FaultModel {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for FaultModel {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        FaultModel::ALL
            .into_iter()
            .find(|m| m.name() == s.trim())
            .ok_or_else(|| format!("unknown fault model {s:?}: expected table1 or partial-ok"))
    }
}

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
    let settle = spec.settle_margin();
    // Every episode has a world of its own: in a shared store its calls are
    // those of an agent of its own, so that a declared effect identity
    // (`key(customer)`) never meets another world's customer of that id.
    let (agent, run) = match shared {
        Some(shared) => {
            let run = format!("{}-{}-{method}-{}", shared.run, spec.task.kind().name(), spec.seed);
            (format!("example-agent/{run}"), run)
        }
        None => ("example-agent".to_owned(), format!("episode-{}", spec.seed)),
    };
    let cx = Context::new(agent)
        .with_mode(method.mode())
        .map_policies(|_, p| {
            let verify_response = p.verify_response && !settings.believe_ok;
            p.with_verify(settings.verify)
                .with_attempt_timeout(Some(settings.attempt_timeout))
                .with_settle(settle)
                .with_verify_response(verify_response)
        })
        .with_clock(Arc::new(TokioClock::starting_at(0)));
    let cx = match shared {
        Some(shared) => cx.with_ledger(Arc::clone(&shared.ledger)),
        None => cx,
    };
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
    let run_id = format!(
        "run-{}-{}",
        std::process::id(),
        std::time::SystemTime::UNIX_EPOCH.elapsed().map_or(0, |d| d.as_millis())
    );
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
                let seed = episode_seed(config.seed, i);
                let spec = EpisodeSpec {
                    task: cell.task.instance(seed),
                    profile: config.settings.profile(cell.level),
                    seed,
                    method: cell.method,
                    settings: config.settings,
                };
                let shared = ledger.as_ref().map(|ledger| Shared {
                    ledger: Arc::clone(ledger),
                    run: format!("{run_id}-{}", cell.level),
                });
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
    fn methods_parse_and_differ_only_where_intended() {
        for m in Method::ALL {
            assert_eq!(m.name().parse::<Method>(), Ok(m));
        }
        assert!("retry".parse::<Method>().is_err());
        // The baseline alone sends no key; the ablations alone talk to
        // servers that break a promise; verify-only alone never re-plans.
        let keyless: Vec<_> = Method::ALL.into_iter().filter(|m| !m.forwards_keys()).collect();
        assert_eq!(keyless, [Method::RetryOnly]);
        let servers: Vec<_> = Method::ALL
            .into_iter()
            .map(|m| (m.server_honours_keys(), m.server_honours_deadlines()))
            .collect();
        use Method as M;
        assert_eq!(servers[M::VerifyBeforeRetry as usize], (true, true));
        assert_eq!(servers[M::VbrNoDeadlines as usize], (true, false));
        assert_eq!(servers[M::VbrNoServerKeys as usize], (false, true));
        assert_eq!(servers[M::VbrNeither as usize], (false, false));
        assert_eq!(servers[M::VbrNeitherUnsettled as usize], (false, false));
        assert_eq!(servers.iter().filter(|s| **s == (true, true)).count(), 4);
        let unsettled: Vec<_> =
            Method::ALL.into_iter().filter(|m| !m.uses_settle_margin()).collect();
        assert_eq!(unsettled, [M::VbrNeitherUnsettled]);
        assert_eq!(Method::VerifyOnly.replans(2), 0);
        assert_eq!(Method::KeysOnly.mode(), Mode::RetryOnly);
    }

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
