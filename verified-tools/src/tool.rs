//! The [`Tool`] trait: the one seam between a tool and the engine.
//!
//! The engine runs any `Tool` ([`engine::run`](crate::engine::run)): what
//! `#[verified_tool]` generates, what [`engine::call`](crate::engine::call)
//! builds from two closures, and a tool defined at run time, such as one
//! proxied to another MCP server, whose name, class and verifier are known
//! only once the program runs. Everything the engine needs of a tool is
//! here: its descriptor, one attempt, one read of its postcondition, and how
//! its value is kept in a ledger.

use std::future::Future;

use crate::engine::Attempt;
use crate::ledger::Codec;
use crate::{Classify, IdempotencyKey, ToolSpec, Verdict};

/// A tool the engine can call: dispatch one attempt, verify the
/// postcondition, describe itself.
///
/// The engine calls [`dispatch`](Self::dispatch) once per attempt, with the
/// call's key (the same on every attempt) and the attempt's deadline, and
/// [`verify`](Self::verify) (which must only read) after an ambiguous
/// failure, and after an `Ok` answer when the policy says so. The futures
/// they return are `Send` when the implementation's are: the engine's call
/// is then `Send` too.
///
/// ```
/// use std::io;
/// use verified_tools::engine::{self, Attempt};
/// use verified_tools::{intern, Context, IdempotencyKey, SideEffect, Tool, ToolResult, ToolSpec, Verdict};
///
/// /// A tool whose descriptor is made at run time (a proxied tool, say).
/// struct Remote {
///     spec: &'static ToolSpec,
///     sent: Vec<IdempotencyKey>,
/// }
///
/// impl Tool for Remote {
///     type Output = u32;
///     type Error = io::Error;
///
///     fn spec(&self) -> &'static ToolSpec {
///         self.spec
///     }
///
///     async fn dispatch(&mut self, attempt: Attempt) -> Result<u32, io::Error> {
///         self.sent.push(attempt.key); // the key goes with every attempt
///         Err(io::ErrorKind::TimedOut.into()) // ... and the answer was lost
///     }
///
///     async fn verify(&mut self, key: IdempotencyKey) -> Verdict<u32> {
///         if self.sent.contains(&key) { Verdict::Holds(7) } else { Verdict::Absent }
///     }
/// }
///
/// # #[tokio::main(flavor = "current_thread", start_paused = true)] async fn main() {
/// // Kept once per content (`intern`), as the engine wants it for `'static`.
/// let spec = intern::spec(ToolSpec::new("remote_send", SideEffect::High).with_verifier());
/// let mut tool = Remote { spec, sent: Vec::new() };
/// let cx = Context::new("gateway");
/// let result = engine::run(&cx, &mut tool, &("bob",), &("bob",)).await;
/// // The answer was lost; the verifier saw the effect: no second attempt.
/// assert!(matches!(result, ToolResult::Success { value: 7, .. }));
/// assert_eq!(tool.sent.len(), 1);
/// # }
/// ```
pub trait Tool {
    /// The value of a success.
    type Output: Clone + Send + Sync + 'static;
    /// The error of a failed attempt; its class says what the failure
    /// proves about the effect.
    type Error: Classify;

    /// The tool's descriptor: name, side-effect class, policy overrides.
    fn spec(&self) -> &'static ToolSpec;

    /// One attempt, with the call's key and the attempt's deadline (forward
    /// both to the service).
    fn dispatch(
        &mut self,
        attempt: Attempt,
    ) -> impl Future<Output = Result<Self::Output, Self::Error>>;

    /// Whether [`verify`](Self::verify) reads the postcondition: by default,
    /// what the descriptor says ([`ToolSpec::has_verifier`]).
    fn verifies(&self) -> bool {
        self.spec().has_verifier
    }

    /// One read of the postcondition, against the real state, read-only:
    /// `Holds(value)`, `Absent`, or `Unknown` when it cannot tell. It gets
    /// the key too, for services that answer "what became of the request
    /// with this key". By default: `Unknown`.
    fn verify(&mut self, key: IdempotencyKey) -> impl Future<Output = Verdict<Self::Output>> {
        let _ = key;
        std::future::ready(Verdict::Unknown)
    }

    /// How a success's value is kept by a ledger outside the process
    /// ([`Codec::serde`] for a value that serializes). By default it is not
    /// kept: a repeat of a completed call obtains it by verifying, and never
    /// dispatches again.
    fn codec(&self) -> Codec<Self::Output> {
        Codec::unrecorded()
    }

    /// Whether an attempt claims and commits the call's ledger record
    /// itself, in one transaction with its effect (a transactional tool:
    /// `PostgresLedger::transact`, feature `postgres`). The engine then
    /// claims nothing: it derives the key and hands every attempt the claim
    /// to make in its transaction ([`Attempt::claim`]), takes an `Ok` answer
    /// as the proof (the record committed with the effect), believes the
    /// verifier's `Absent` at once (a commit is visible when it answers) and
    /// writes nothing to the ledger. By default: `false`.
    fn commits_record(&self) -> bool {
        false
    }
}

impl<X: Tool + ?Sized> Tool for &mut X {
    type Output = X::Output;
    type Error = X::Error;

    fn spec(&self) -> &'static ToolSpec {
        (**self).spec()
    }

    fn dispatch(
        &mut self,
        attempt: Attempt,
    ) -> impl Future<Output = Result<Self::Output, Self::Error>> {
        (**self).dispatch(attempt)
    }

    fn verifies(&self) -> bool {
        (**self).verifies()
    }

    fn verify(&mut self, key: IdempotencyKey) -> impl Future<Output = Verdict<Self::Output>> {
        (**self).verify(key)
    }

    fn codec(&self) -> Codec<Self::Output> {
        (**self).codec()
    }

    fn commits_record(&self) -> bool {
        (**self).commits_record()
    }
}
