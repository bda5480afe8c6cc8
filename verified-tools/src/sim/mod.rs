//! A fault-injecting simulator of the paper's tool environment (section 5.1),
//! with exact ground truth, and the statistics of its experiment.
//!
//! - [`SimServer`]: the async API of the two tasks ([`world`] entities:
//!   customers, an outbox, invoice rows, records), honouring idempotency keys
//!   and deadlines unless switched off, and failing the four non-atomic ways
//!   of section 2.3 at the rates of a [`FaultLevel`] (Table 1): timeout
//!   after dispatch (the server received the request and applies it at once
//!   or, a *late arrival*, later — possibly after the client's retry;
//!   the earlier before-or-after split is an option, [`TimeoutKind`]),
//!   delayed visibility (a replica lag with a bulk and a bounded heavy
//!   tail), partial success, stale conflict; and, off by default, the
//!   partial OK: a compound write applied in part that answers as if it had
//!   been applied in full ([`FaultLevel::partial_ok_profile`]), which only
//!   a verifier read can tell from a success. See [`faults`] for how faults
//!   are drawn so that every method faces the same ones, and [`world`] for
//!   what a stale read returns. [`SimConfig::settle_bound`] says what the
//!   server guarantees a verifier: how long after a deadline an effect can
//!   still appear.
//! - [`Oracle::truth`]: the true state and how often each effect was
//!   applied, for the harness only ([`Oracle::final_truth`] once the late
//!   arrivals have landed); [`Task::holds`] evaluates the postconditions of
//!   section 4.3 on it. [`Oracle::script`] sets the faults of given calls,
//!   for a test that means one fault rather than a seed that draws it.
//! - [`stats`]: Wilson intervals and Cohen's h.
//!
//! Everything runs on tokio time, so a paused current-thread runtime runs an
//! episode in microseconds of wall time, deterministically.
//!
//! ```
//! use verified_tools::sim::{
//!     episode_seed, CustomerStatus, FaultLevel, SimConfig, SimServer, TaskKind, Task, BASE_SEED,
//! };
//!
//! # #[tokio::main(flavor = "current_thread", start_paused = true)] async fn main() {
//! let seed = episode_seed(BASE_SEED, 0);
//! let Task::ActivateCustomer(task) = TaskKind::ActivateCustomer.instance(seed) else { unreachable!() };
//! let (server, oracle) = SimServer::new(SimConfig::new(seed, FaultLevel::Low.profile()));
//!
//! // A naive agent: no keys, no retries, no checks.
//! if let Ok(c) = server.create_customer(task.customer, None, None).await {
//!     let _ = server.set_customer_status(c.id, CustomerStatus::Active, c.version, None, None).await;
//!     let _ = server.send_welcome(c.id, None, None).await;
//! }
//!
//! // Late arrivals may still land: the final truth waits for them.
//! let truth = oracle.final_truth().await;
//! println!("success: {}, duplicates: {}", task.holds(&truth), truth.has_duplicates());
//! # }
//! ```

mod error;
pub mod faults;
pub mod rng;
mod server;
pub mod stats;
mod tasks;
mod truth;
pub mod world;

pub use error::SimError;
pub use faults::{
    FaultDraw, FaultLevel, FaultProfile, Lag, Op, Pareto, ParseFaultLevelError, Timeout,
    TimeoutKind, UNCAPPED,
};
pub use server::{BASE_SEED, Oracle, SimConfig, SimServer, StaleReads, episode_seed};
pub use tasks::{ActivateCustomer, ParseTaskError, RecordInvoice, Task, TaskKind};
pub use truth::{Effect, EffectCount, FaultCounts, GroundTruth};
pub use world::{
    Customer, CustomerId, CustomerStatus, InvoiceId, InvoiceRow, Message, MessageId, MessageKind,
    Record, RecordId, RecordStatus, RowId,
};
