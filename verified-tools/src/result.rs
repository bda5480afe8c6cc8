//! The typed outcome of one logical call.

use std::fmt;
use std::time::Duration;

use crate::{IdempotencyKey, Verdict};

/// How a success was established.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Proof {
    /// The tool answered `Ok`, and the answer was believed without a
    /// verifier read: a `none` or `low` tool, a tool without a verifier, one
    /// that opted out of
    /// [`verify_response`](crate::RetryPolicy::verify_response), or any tool
    /// in [`Mode::RetryOnly`](crate::Mode::RetryOnly).
    Response,
    /// The verifier saw the postcondition hold: after a lost or ambiguous
    /// response, or after an `Ok` answer that it confirmed (the default for
    /// `high` and `irreversible` tools, see
    /// [`RetryPolicy::verify_response`](crate::RetryPolicy::verify_response)).
    /// The value is the verifier's.
    Verifier,
    /// An earlier call with the same key succeeded; its recorded outcome was
    /// returned and nothing was executed.
    Ledger,
}

/// Why the effect is in doubt, or why it is known to be missing.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Cause<E> {
    /// The tool returned this ambiguous or conflicting error.
    Error(E),
    /// An attempt (or a verifier read) ran past the per-attempt timeout.
    TimedOut(Duration),
    /// The call's deadline (its `call_timeout`, here) came before the last
    /// attempt answered: that attempt had what was left of the call, which
    /// may have been far less than the per-attempt timeout.
    DeadlineReached(Duration),
    /// The tool answered `Ok`, but the verifier (asked to confirm responses,
    /// see [`RetryPolicy::verify_response`](crate::RetryPolicy::verify_response))
    /// found the postcondition missing or could not see it: a partial success
    /// that answered OK, or a replica that stayed stale. Never retried under
    /// the same key, which the server would answer as before: completing it is
    /// a new logical call.
    Unconfirmed,
    /// Earlier calls with this key dispatched without proving the effect
    /// (they ended in doubt or known absent, were cancelled, or were taken
    /// over after their lease); this call checked the state before acting.
    Interrupted,
    /// No attempt under this key ever left: its record was made by a check
    /// ([`Context::for_check`](crate::Context::for_check)), or a person
    /// resolved it as not applied, which clears its attempts. This call
    /// checked the state before acting.
    NeverSent,
}

impl<E> Cause<E> {
    /// The same cause with its error mapped.
    pub fn map_err<F>(self, f: impl FnOnce(E) -> F) -> Cause<F> {
        match self {
            Cause::Error(e) => Cause::Error(f(e)),
            Cause::TimedOut(d) => Cause::TimedOut(d),
            Cause::DeadlineReached(d) => Cause::DeadlineReached(d),
            Cause::Unconfirmed => Cause::Unconfirmed,
            Cause::Interrupted => Cause::Interrupted,
            Cause::NeverSent => Cause::NeverSent,
        }
    }
}

/// Why a call ended [`Unknown`](ToolResult::Unknown).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum UnknownReason {
    /// Retries ran out, or the last one failed definitively, and nothing
    /// verified the earlier attempts (retry-only mode, or a tool without
    /// verifier): one of them may have applied. A check of such a tool's
    /// call ends so too: it has nothing to verify with.
    RetriesExhausted,
    /// The call held its key past the ledger's lease and another call took
    /// it over: that call now owns the outcome. Nothing more was dispatched.
    Superseded,
    /// The verifier answered `Unknown` (or failed) for its whole read budget.
    VerifierInconclusive,
    /// The verifier read `Absent`, but before the last attempt had settled
    /// (its deadline plus the settle margin, see
    /// [`RetryPolicy::settle`](crate::RetryPolicy::settle)): the attempt may
    /// still land, or be hidden by a lagging replica. A later call with the
    /// same key verifies again, and believes `Absent` once settled.
    Unsettled,
    /// The call's deadline struck with the effect in doubt.
    DeadlineExceeded,
    /// The ledger's store failed mid-call: nothing more was dispatched.
    LedgerUnavailable,
    /// An earlier call with this key completed, its value was not kept
    /// (it does not serialize), and the verifier could not show it.
    /// Nothing was dispatched.
    ValueNotRecorded,
}

/// The outcome of one logical call of a verified tool.
///
/// It says success only when the tool answered `Ok` or the verifier saw the
/// postcondition hold; everything else keeps the key, so the caller can check
/// later instead of re-issuing.
///
/// ```
/// use verified_tools::{IdempotencyKey, Proof, ToolResult};
///
/// let key = IdempotencyKey::from_u128(1);
/// let r: ToolResult<u32, String> = ToolResult::Success { value: 7, proof: Proof::Verifier, key };
/// assert!(r.is_success());
/// assert_eq!(r.key(), Some(key));
/// assert_eq!(r.into_result().ok(), Some(7));
/// ```
#[derive(Debug, Clone, PartialEq)]
#[must_use = "a tool result may be Unknown or Escalated: look at it"]
pub enum ToolResult<T, E> {
    /// The effect happened.
    Success {
        /// The response's value, or what the verifier observed.
        value: T,
        /// How it was established.
        proof: Proof,
        /// The call's key.
        key: IdempotencyKey,
    },
    /// The tool answered with a definitive error: the effect did not happen.
    Failed {
        /// The tool's error.
        error: E,
        /// The call's key.
        key: IdempotencyKey,
    },
    /// The effect is known not to have happened: the verifier read `Absent`
    /// after the last attempt had settled (or no attempt left the client),
    /// and no retry was left or allowed. The key's budget is spent: doing it
    /// after all is a new logical call, the caller's decision.
    NotApplied {
        /// What went wrong.
        cause: Cause<E>,
        /// The call's key.
        key: IdempotencyKey,
    },
    /// The effect is in doubt and nothing more could be done. Do not make a
    /// new call for it: re-issue the *same* logical call (same key) later,
    /// which verifies first, or check with this key.
    Unknown {
        /// Why it stayed ambiguous.
        reason: UnknownReason,
        /// The last failure.
        cause: Cause<E>,
        /// The call's key.
        key: IdempotencyKey,
    },
    /// An irreversible action whose outcome was not proven was handed to a
    /// person (see [`Escalation`](crate::Escalation)).
    Escalated {
        /// Why it stayed in doubt.
        reason: UnknownReason,
        /// The last verdict: `Absent` read too early to be believed, or
        /// `Unknown`.
        verdict: Verdict,
        /// The last failure.
        cause: Cause<E>,
        /// The call's key.
        key: IdempotencyKey,
    },
    /// Nothing was dispatched: the call was refused before its first attempt.
    Refused(CallError),
}

impl<T, E> ToolResult<T, E> {
    /// Whether the effect is proven.
    pub fn is_success(&self) -> bool {
        matches!(self, ToolResult::Success { .. })
    }

    /// The call's key (none when the call was refused before a key existed).
    pub fn key(&self) -> Option<IdempotencyKey> {
        match self {
            ToolResult::Success { key, .. }
            | ToolResult::Failed { key, .. }
            | ToolResult::NotApplied { key, .. }
            | ToolResult::Unknown { key, .. }
            | ToolResult::Escalated { key, .. } => Some(*key),
            ToolResult::Refused(e) => e.key(),
        }
    }

    /// The proven value, or the whole result back.
    pub fn into_result(self) -> Result<T, ToolResult<T, E>> {
        match self {
            ToolResult::Success { value, .. } => Ok(value),
            other => Err(other),
        }
    }

    /// The same outcome with the tool's error mapped (in `Failed` and in
    /// every [`Cause`]).
    pub fn map_err<F>(self, f: impl FnMut(E) -> F) -> ToolResult<T, F> {
        let mut f = f;
        match self {
            ToolResult::Success { value, proof, key } => ToolResult::Success { value, proof, key },
            ToolResult::Failed { error, key } => ToolResult::Failed { error: f(error), key },
            ToolResult::NotApplied { cause, key } => {
                ToolResult::NotApplied { cause: cause.map_err(f), key }
            }
            ToolResult::Unknown { reason, cause, key } => {
                ToolResult::Unknown { reason, cause: cause.map_err(f), key }
            }
            ToolResult::Escalated { reason, verdict, cause, key } => {
                ToolResult::Escalated { reason, verdict, cause: cause.map_err(f), key }
            }
            ToolResult::Refused(error) => ToolResult::Refused(error),
        }
    }

    /// A short name of the variant, as audit and logs print it.
    pub fn label(&self) -> &'static str {
        match self {
            ToolResult::Success { .. } => "success",
            ToolResult::Failed { .. } => "failed",
            ToolResult::NotApplied { .. } => "not_applied",
            ToolResult::Unknown { .. } => "unknown",
            ToolResult::Escalated { .. } => "escalated",
            ToolResult::Refused(_) => "refused",
        }
    }
}

/// A call that did not prove its effect, as an error: so that
/// `result.into_result()?` works in a function returning
/// `Result<_, Box<dyn Error>>` or `anyhow::Result<_>` (the `?` operator
/// cannot be applied to a `ToolResult` itself: `Try` is unstable).
///
/// ```
/// use verified_tools::{IdempotencyKey, ToolResult, UnknownReason, Cause};
///
/// fn charge() -> Result<u32, Box<dyn std::error::Error>> {
///     let key = IdempotencyKey::from_u128(7);
///     let result: ToolResult<u32, std::io::Error> =
///         ToolResult::Unknown { reason: UnknownReason::Unsettled, cause: Cause::Interrupted, key };
///     Ok(result.into_result()?)
/// }
/// let error = charge().unwrap_err().to_string();
/// assert!(error.starts_with("the call is in doubt (unsettled)"), "{error}");
/// assert!(error.contains("00000000000000000000000000000007"), "{error}");
/// ```
impl<T, E: fmt::Display> fmt::Display for ToolResult<T, E> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ToolResult::Success { proof, key, .. } => {
                write!(f, "the call succeeded (proven by {proof:?}), key {key}")
            }
            ToolResult::Failed { error, key } => write!(f, "the call failed: {error} (key {key})"),
            ToolResult::NotApplied { key, .. } => {
                write!(f, "the call's effect is known not to have happened (key {key})")
            }
            ToolResult::Unknown { reason, key, .. } => write!(
                f,
                "the call is in doubt ({}): do not repeat it as a new call; check with key {key}",
                reason_name(*reason)
            ),
            ToolResult::Escalated { reason, key, .. } => write!(
                f,
                "the call is in doubt ({}) and was handed to a person; key {key}",
                reason_name(*reason)
            ),
            ToolResult::Refused(error) => write!(f, "the call was refused: {error}"),
        }
    }
}

impl<T: fmt::Debug, E: fmt::Display + fmt::Debug> std::error::Error for ToolResult<T, E> {}

fn reason_name(reason: UnknownReason) -> &'static str {
    match reason {
        UnknownReason::RetriesExhausted => "retries exhausted",
        UnknownReason::Superseded => "superseded",
        UnknownReason::VerifierInconclusive => "verifier inconclusive",
        UnknownReason::Unsettled => "unsettled",
        UnknownReason::DeadlineExceeded => "deadline exceeded",
        UnknownReason::LedgerUnavailable => "ledger unavailable",
        UnknownReason::ValueNotRecorded => "value not recorded",
    }
}

/// Why a call was refused before anything was dispatched.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum CallError {
    /// The key-relevant arguments could not be serialized.
    #[error("tool `{tool}`: {source}")]
    Payload {
        /// The tool.
        tool: &'static str,
        /// The serializer's error.
        source: crate::KeyError,
    },
    /// An explicit key was reused with a different payload.
    #[error(
        "tool `{tool}`: idempotency key {key} was already used with a different payload; \
         use a new key for a new call"
    )]
    KeyReuse {
        /// The tool.
        tool: &'static str,
        /// The reused key.
        key: IdempotencyKey,
    },
    /// A call with this key is running and the context says not to wait.
    #[error("tool `{tool}`: a call with idempotency key {key} is already in progress")]
    InProgress {
        /// The tool.
        tool: &'static str,
        /// The key in flight.
        key: IdempotencyKey,
    },
    /// The ledger could not claim the key (its store is unreachable, or
    /// full of records in doubt): refused, fail closed.
    #[error("tool `{tool}`: ledger error for key {key}: {source}")]
    Ledger {
        /// The tool.
        tool: &'static str,
        /// The key.
        key: IdempotencyKey,
        /// The ledger's error.
        source: crate::ledger::LedgerError,
    },
    /// The ledger's lease is shorter than the call's deadline: a call still
    /// running could see its key taken over.
    #[error(
        "tool `{tool}`: the ledger's lease ({lease:?}) is shorter than the call's deadline \
         ({call_timeout:?}); lengthen the lease or shorten `call_timeout`"
    )]
    LeaseTooShort {
        /// The tool.
        tool: &'static str,
        /// The ledger's lease.
        lease: Duration,
        /// The call's deadline.
        call_timeout: Duration,
    },
}

impl CallError {
    /// The key concerned, if one was derived.
    pub fn key(&self) -> Option<IdempotencyKey> {
        match self {
            CallError::Payload { .. } | CallError::LeaseTooShort { .. } => None,
            CallError::KeyReuse { key, .. }
            | CallError::InProgress { key, .. }
            | CallError::Ledger { key, .. } => Some(*key),
        }
    }
}

/// The JSON arguments of a tool call (`<tool>_json`, from
/// `#[verified_tool(json = true)]`) did not fit its parameters. Nothing was
/// dispatched.
///
/// ```
/// use verified_tools::ArgsError;
///
/// let err = ArgsError::new("send", "missing field `to`");
/// assert_eq!(err.to_string(), "tool `send`: invalid arguments: missing field `to`");
/// ```
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("tool `{tool}`: invalid arguments: {message}")]
pub struct ArgsError {
    /// The tool.
    pub tool: &'static str,
    /// What was wrong, as serde said it.
    pub message: String,
}

impl ArgsError {
    /// An error of `tool`'s arguments.
    pub fn new(tool: &'static str, message: impl std::fmt::Display) -> Self {
        Self { tool, message: message.to_string() }
    }
}
