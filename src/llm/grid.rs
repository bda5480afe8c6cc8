//! Many episodes with a model planning: the scripted grid's tasks × levels
//! × methods × episodes, scored into its [`Results`], with the episodes the
//! model server failed counted apart.

use std::sync::Arc;

use verified_tools::sim::{FaultLevel, TaskKind};

use super::{LlmConfig, LlmEpisode, LlmError, run_episode};
use crate::experiment::{Cell, CellStats, Config, Method, Results, Shared};

/// One episode of a model run, as it ended.
#[derive(Debug)]
pub struct EpisodeReport {
    /// The task.
    pub task: TaskKind,
    /// The fault level.
    pub level: FaultLevel,
    /// The method (the tool layer the model planned over).
    pub method: Method,
    /// The fault seed.
    pub seed: u64,
    /// The episode, or why the model server could not finish it.
    pub result: Result<LlmEpisode, LlmError>,
}

/// A model run's results.
#[derive(Debug, Clone, PartialEq)]
pub struct LlmResults {
    /// The episodes the model finished, scored per cell as the scripted
    /// grid's are.
    pub results: Results,
    /// The episodes the model server failed: task, level, method, seed and
    /// the error, in the order they ended. They are in no cell: the model
    /// was not heard to the end, so nothing can be said of its claim.
    pub failed: Vec<(TaskKind, FaultLevel, Method, u64, String)>,
    /// Requests sent again after the model server failed them, over every
    /// episode.
    pub resent: u64,
}

impl LlmResults {
    /// Episodes run, failed ones included.
    pub fn episodes(&self) -> u64 {
        self.results.cells.iter().map(|c| c.stats.episodes).sum::<u64>() + self.failed.len() as u64
    }

    /// The totals of every finished episode.
    pub fn total(&self) -> CellStats {
        let mut total = CellStats::default();
        for cell in &self.results.cells {
            total.merge(&cell.stats);
        }
        total
    }
}

/// Runs `config`'s grid with the model at `llm`: episode `i` of every cell
/// with seed `seed + i`, the methods of one seed one after another, at most
/// `config.threads` episodes at once (the requests in flight at the model
/// server). `on_episode` is told of each episode as it ends, in that order.
/// An episode the model server fails is recorded and the run goes on.
///
/// # Errors
///
/// When the ledger cannot be opened, the runtime cannot start or the base
/// URL is not `http://` (before any episode runs).
pub fn run_grid(
    llm: &LlmConfig,
    config: &Config,
    on_episode: &mut dyn FnMut(&EpisodeReport),
) -> Result<LlmResults, String> {
    super::client::ModelClient::new(llm).map_err(|e| e.to_string())?;
    let ledger = config.ledger.open()?;
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| format!("cannot start the runtime: {e}"))?;
    let mut cells = Vec::new();
    for &task in &config.tasks {
        for &level in &config.levels {
            for &method in &config.methods {
                cells.push(Cell { task, level, method, stats: CellStats::default() });
            }
        }
    }
    let mut order = Vec::new();
    for (t, _) in config.tasks.iter().enumerate() {
        for (l, _) in config.levels.iter().enumerate() {
            for i in 0..config.episodes {
                for (m, _) in config.methods.iter().enumerate() {
                    order.push(((t * config.levels.len() + l) * config.methods.len() + m, i));
                }
            }
        }
    }
    let run_id = Shared::fresh_run_id();
    let llm = Arc::new(llm.clone());
    let mut failed = Vec::new();
    let mut resent = 0;
    runtime.block_on(async {
        let mut running = tokio::task::JoinSet::new();
        let mut next = order.into_iter();
        let mut ended = |cells: &mut Vec<Cell>, (ci, seed, result)| {
            let cell: &mut Cell = &mut cells[ci];
            let report = EpisodeReport {
                task: cell.task,
                level: cell.level,
                method: cell.method,
                seed,
                result,
            };
            on_episode(&report);
            match &report.result {
                Ok(episode) => {
                    cell.stats.add(&episode.scored());
                    resent += u64::from(episode.resent);
                }
                Err(e) => failed.push((cell.task, cell.level, cell.method, seed, e.to_string())),
            }
        };
        loop {
            while running.len() < config.threads.max(1) {
                let Some((ci, i)) = next.next() else { break };
                let cell = cells[ci];
                let (spec, shared) = config.episode(&cell, i, ledger.as_ref(), &run_id);
                let llm = Arc::clone(&llm);
                running.spawn(async move {
                    (ci, spec.seed, run_episode(&llm, &spec, shared.as_ref()).await)
                });
            }
            match running.join_next().await {
                Some(Ok(done)) => ended(&mut cells, done),
                Some(Err(e)) => std::panic::resume_unwind(e.into_panic()),
                None => break,
            }
        }
    });
    Ok(LlmResults { results: Results { config: config.clone(), cells }, failed, resent })
}
