//! # verified-tools
//!
//! Safe tool calls for LLM agents when the tools are not atomic.
//!
//! A real tool call can time out after the server applied it, show the old
//! state to the next read, apply half of a compound write while answering OK,
//! or be rejected because someone changed the record. An agent that retries
//! on every error then sends two welcome mails or books two payments.
//!
//! Write the tool as a plain `async fn` and put [`#[verified_tool]`](verified_tool)
//! on it. Every call of it then
//!
//! 1. derives one deterministic [`IdempotencyKey`] per logical call and sends
//!    it with every attempt, so a server that honours keys drops duplicates;
//! 2. gives each attempt a [`Deadline`] the tool can forward, so a server that
//!    honours deadlines drops a request that arrives too late;
//! 3. after an ambiguous failure, asks a read-only postcondition verifier:
//!    [`Verdict::Holds`], [`Verdict::Absent`] or [`Verdict::Unknown`];
//! 4. retries only on an `Absent` read after the last attempt has *settled*
//!    (its deadline plus the tool's settle margin): before then the request
//!    may still land, or a replica may still hide it;
//! 5. records the call in a [ledger], so a repeat, a second worker or
//!    a restarted process verifies before it dispatches, and a completed call
//!    is replayed, not run again;
//! 6. returns a typed [`ToolResult`]: `Success` only when the response or the
//!    verifier proved it, `Unknown` (with the key) when in doubt, and
//!    `Escalated` to a person for an irreversible action in doubt.
//!
//! ```
//! use std::collections::HashMap;
//! use std::sync::Mutex;
//! use verified_tools::{
//!     verified_tool, Classify, Context, Deadline, ErrorClass, IdempotencyKey, ToolResult, Verdict,
//! };
//!
//! /// A payment service that honours keys (an in-memory stand-in).
//! #[derive(Default)]
//! pub struct Bank(Mutex<HashMap<u64, (IdempotencyKey, u64)>>);
//!
//! #[derive(Debug)]
//! pub enum BankError { Declined, Timeout }
//!
//! impl std::fmt::Display for BankError {
//!     fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
//!         f.write_str(match self { BankError::Declined => "declined", BankError::Timeout => "timed out" })
//!     }
//! }
//!
//! impl Classify for BankError {
//!     fn classify(&self) -> ErrorClass {
//!         match self {
//!             BankError::Declined => ErrorClass::Definitive,
//!             BankError::Timeout => ErrorClass::Ambiguous,
//!         }
//!     }
//! }
//!
//! /// Charges an order, once.
//! #[verified_tool(side_effect = "irreversible", verify = charged, skip(bank), timeout = "2s", settle = "3s")]
//! pub async fn charge(
//!     bank: &Bank,
//!     order: u64,
//!     cents: u64,
//!     key: IdempotencyKey,
//!     deadline: Deadline,
//! ) -> Result<u64, BankError> {
//!     // A real client sends `key` as `Idempotency-Key` and `deadline` as a timeout.
//!     let _ = deadline;
//!     bank.0.lock().unwrap().entry(order).or_insert((key, cents));
//!     Ok(cents)
//! }
//!
//! /// The postcondition, read from the bank: is the order charged?
//! async fn charged(bank: &Bank, order: &u64, _cents: &u64) -> Verdict<u64> {
//!     bank.0.lock().unwrap().get(order).map(|(_, cents)| *cents).into()
//! }
//!
//! # #[tokio::main(flavor = "current_thread", start_paused = true)] async fn main() {
//! let bank = Bank::default();
//! // The tool-call id the model gave is the identity of the logical call.
//! let cx = Context::new("billing-agent").for_tool_call("call_8Hq2");
//! match charge(&cx, &bank, 17, 2500).await {
//!     ToolResult::Success { value, proof, .. } => println!("charged {value} ({proof:?})"),
//!     ToolResult::Unknown { key, .. } | ToolResult::Escalated { key, .. } => {
//!         println!("in doubt: do not charge again; check with key {key}")
//!     }
//!     other => println!("not charged: {other:?}"),
//! }
//! // The same tool call again (a retrying client, a restarted worker):
//! // replayed from the ledger, not charged twice.
//! assert!(charge(&cx, &bank, 17, 2500).await.is_success());
//! assert_eq!(bank.0.lock().unwrap().len(), 1);
//! # }
//! ```
//!
//! A `high` or `irreversible` tool without a verifier does not compile. The
//! attribute's options are documented on [`verified_tool`]; the engine it
//! expands to is [`engine::call`], usable by hand.
//!
//! **Runtime.** Calls run on Tokio, with its time driver enabled (timeouts,
//! backoff and deadlines are Tokio timers; tests can pause time).
//!
//! # What the guarantees assume
//!
//! The verifier must check the action's whole postcondition (not mere
//! existence) and read state that is current once the settle margin has
//! passed. An `Ok` answer is not the effect: a compound write applied in
//! part may answer OK, with data that looks complete, so a `high` or
//! `irreversible` tool reads its verifier after an `Ok` answer too, by
//! default ([`RetryPolicy::verify_response`]). Then, whatever the failures:
//!
//! | the service | duplicate effects | a `Success` that did not happen |
//! |---|---|---|
//! | honours idempotency keys and deadlines (the tool forwards [`Deadline`]) | none | never |
//! | honours keys only | none from retries; a call reported `NotApplied` may still land late, so doing it again under a *new* key can duplicate | never |
//! | honours deadlines only | none, if the verifier reads `Absent` only when nothing of the effect is there (a retry repeats whatever part of a partial write was applied) | never |
//! | honours neither | when a request lands later than its deadline + settle margin | never |
//! | any, with no settle margin set (the default) | none from retries: `Absent` is never believed after an ambiguous failure, and such a call ends `Unknown` | never |
//!
//! "Never" holds for a tool that verifies its `Ok` answers. One that
//! believes them — a `none` or `low` tool, or any tool with
//! `verify_response = false` — reports `Success` for whatever answered OK,
//! a partial write included.
//!
//! Measured on the bundled simulator and written out with the commands in the
//! repository's `EXPERIMENT.md`, with `Ok` answers verified and believed
//! (`--believe-ok`), and with partial writes that answer as if complete
//! (`--faults partial-ok`); the boundary cases are tests
//! (`verified-tools/tests/timing.rs`).
//!
//! # Where calls are recorded
//!
//! | ledger | feature | scope | survives |
//! |---|---|---|---|
//! | [`MemoryLedger`](ledger::MemoryLedger) (the default of [`Context::new`]) | | one process | nothing |
//! | `SqliteLedger` | `sqlite` | the processes of one host | `kill -9`, restarts |
//! | `RedisLedger` | `redis` | processes and hosts | restarts of workers; of Redis, per its persistence |
//! | `PostgresLedger` | `postgres` | processes and hosts | restarts of workers; of PostgreSQL, with durable commits |
//!
//! When the ledger's store cannot be reached, calls are refused before
//! anything is dispatched ([`CallError::Ledger`]).
//!
//! # Handing the tools to a model
//!
//! `#[verified_tool(schema = true)]` (feature `schema`) also generates the
//! JSON Schema of a tool's arguments and a `<name>_tool()` descriptor;
//! `toolset::ToolSet` lists such tools for OpenAI, Anthropic and MCP and
//! dispatches a model's call by name, keyed by its `tool_call_id`, with an
//! outcome the model can read ([`toolset::ToolOutcome`]). Feature `mcp`
//! serves a tool set over the Model Context Protocol (`mcp`, with rmcp).
//!
//! # Seeing what happened
//!
//! Feature `tracing` (on by default) gives every call a span by the
//! OpenTelemetry GenAI conventions, `execute_tool {tool}`; an
//! [`audit`] sink gets every transition as one JSON object.
#![warn(missing_docs)]
// A few links point at items behind features (`ledger::kit`,
// `toolset::mcp_annotations`, `PostgresLedger::transact`). With every feature
// on (docs.rs, and CI's `cargo doc --all-features`) each must resolve; with
// fewer, the links to what is left out are let go rather than warned about.
#![cfg_attr(
    not(all(feature = "ledger-kit", feature = "schema", feature = "postgres")),
    allow(rustdoc::broken_intra_doc_links)
)]

pub mod audit;
mod classify;
mod clock;
mod context;
pub mod deadline;
pub mod engine;
pub mod escalation;
mod holder;
pub mod intern;
pub mod key;
pub mod ledger;
#[cfg(feature = "mcp")]
pub mod mcp;
mod policy;
mod result;
mod side_effect;
#[cfg(feature = "sim")]
pub mod sim;
mod spec;
mod telemetry;
mod tool;
pub mod toolset;
mod verdict;

pub use classify::{Classified, Classify, ErrorClass};
pub use clock::{Clock, Sleep, SystemClock, TokioClock};
pub use context::{Context, InFlight, LedgerOutage};
pub use deadline::Deadline;
pub use escalation::Escalation;
pub use holder::{HoldLost, Holder};
pub use key::{IdempotencyKey, KeyError, KeyScope, ParseKeyError, PayloadDigest};
pub use policy::{Backoff, Mode, RetryPolicy, VerifyBudget};
pub use result::{ArgsError, CallError, Cause, Proof, ToolResult, UnknownReason};
pub use side_effect::{ParseSideEffectError, SideEffect};
pub use spec::{EffectKind, Param, ToolSpec};
pub use tool::Tool;
pub use verdict::{IntoVerdict, Verdict};
#[doc = include_str!("attribute.md")]
pub use verified_tools_macros::verified_tool;

/// What the code generated by `#[verified_tool]` refers to. Not public API.
#[doc(hidden)]
#[path = "private.rs"]
pub mod __private;
