//! The example agent of `verified-tools` and the experiment that reproduces
//! the paper's evaluation (sections 4.2–6) on the bundled simulator.
//!
//! - [`tools`]: the six write tools of the two tasks, the repair of a partial
//!   record (`update_record_fields`) and two reads, each a
//!   plain async fn under `#[verified_tool]`, with full-postcondition
//!   verifiers;
//! - [`agent`]: a ReAct-style loop over a [`Planner`](agent::Planner), with
//!   a deterministic planner per task that re-plans a `NotApplied` step as a
//!   new call and re-issues an `Unknown` one as the same call (same key);
//! - [`experiment`]: methods, the grid of episodes, scored on ground truth;
//! - [`report`]: the table, the JSON cells and Figure 2 as SVG;
//! - [`ops`]: the operator's door to a ledger (`examples/ledger.rs`): list
//!   the calls in doubt, show one, resolve one by a person's audited decision.
//!
//! `cargo run --release --example agent` runs the whole grid. One episode:
//!
//! ```
//! use verified_tools::sim::{FaultLevel, TaskKind};
//! use verified_tools_suite::experiment::{EpisodeSpec, Method, Settings, run_episode};
//!
//! let seed = 42;
//! let spec = EpisodeSpec {
//!     task: TaskKind::ActivateCustomer.instance(seed),
//!     profile: FaultLevel::Extreme.profile(),
//!     seed,
//!     method: Method::VerifyBeforeRetry,
//!     settings: Settings::default(),
//! };
//! let episode = run_episode(&spec);
//! // Whatever the faults did, the agent never claims a success the ground
//! // truth denies, and no effect is applied twice.
//! assert!(!episode.claimed || episode.success);
//! assert!(!episode.duplicate);
//! ```
#![warn(missing_docs)]

pub mod agent;
pub mod experiment;
pub mod llm;
pub mod ops;
pub mod report;
pub mod tools;
