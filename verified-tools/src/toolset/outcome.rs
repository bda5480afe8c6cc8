//! The outcome of a tool call as a model (or an MCP client) reads it.

use std::fmt::{self, Display};

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::{
    ArgsError, CallError, Cause, Classify, IdempotencyKey, Proof, ToolResult, UnknownReason,
};

/// How a tool call ended, in the words of [`ToolOutcome::status`].
///
/// The first six are [`ToolResult`]'s variants (and its
/// [`label`](ToolResult::label)); the last two are a call that never
/// reached a tool.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Status {
    /// The effect is proven (by the answer, the verifier or the ledger).
    Success,
    /// The tool answered with a definitive error: nothing happened.
    Failed,
    /// The effect is known not to have happened; this call is closed.
    NotApplied,
    /// The effect is in doubt: it may or may not have happened.
    Unknown,
    /// In doubt, and handed to a person (an irreversible action).
    Escalated,
    /// Refused before anything was dispatched.
    Refused,
    /// The arguments did not fit the tool's parameters; nothing was done.
    InvalidArguments,
    /// No tool of that name; nothing was done.
    NoSuchTool,
}

impl Status {
    /// The snake_case name, as serialized.
    pub const fn as_str(self) -> &'static str {
        match self {
            Status::Success => "success",
            Status::Failed => "failed",
            Status::NotApplied => "not_applied",
            Status::Unknown => "unknown",
            Status::Escalated => "escalated",
            Status::Refused => "refused",
            Status::InvalidArguments => "invalid_arguments",
            Status::NoSuchTool => "no_such_tool",
        }
    }

    /// Every status, in declaration order.
    pub const ALL: [Status; 8] = [
        Status::Success,
        Status::Failed,
        Status::NotApplied,
        Status::Unknown,
        Status::Escalated,
        Status::Refused,
        Status::InvalidArguments,
        Status::NoSuchTool,
    ];
}

impl Display for Status {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The outcome of one tool call, serialized for the model that asked for it
/// (the `content` of a `role: tool` message, an MCP `structuredContent`).
///
/// Everything but a success carries an `instruction` in plain words: above
/// all, an effect in doubt must not be asked for again as a new call.
///
/// ```
/// use verified_tools::toolset::{Status, ToolOutcome};
/// use verified_tools::{Cause, IdempotencyKey, ToolResult, UnknownReason};
/// use std::time::Duration;
///
/// let key = IdempotencyKey::from_u128(0xfeed);
/// let lost: ToolResult<u64, std::io::Error> = ToolResult::Unknown {
///     reason: UnknownReason::VerifierInconclusive,
///     cause: Cause::TimedOut(Duration::from_millis(500)),
///     key,
/// };
/// let outcome = ToolOutcome::from_result(lost);
/// assert_eq!(outcome.status, Status::Unknown);
/// let json = serde_json::to_value(&outcome)?;
/// assert_eq!(json["status"], "unknown");
/// assert_eq!(json["reason"], "verifier_inconclusive");
/// assert_eq!(json["key"], "0000000000000000000000000000feed");
/// assert_eq!(json["error"], "no answer within 500ms");
/// assert!(json["instruction"].as_str().unwrap().starts_with("Do not repeat this call"));
/// # Ok::<(), serde_json::Error>(())
/// ```
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct ToolOutcome {
    /// How the call ended.
    pub status: Status,
    /// The tool's value (`success` only): what it answered, or what the
    /// verifier observed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub value: Option<Value>,
    /// How the success was established (`success` only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub proof: Option<Proof>,
    /// The call's idempotency key: what the effect can be checked with later.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub key: Option<IdempotencyKey>,
    /// Why the call stayed in doubt (`unknown` and `escalated`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<UnknownReason>,
    /// What went wrong: the tool's error, the last failure, the argument
    /// error.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// What to do next, in plain words (everything but `success`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub instruction: Option<String>,
}

impl ToolOutcome {
    fn new(status: Status) -> Self {
        Self {
            status,
            value: None,
            proof: None,
            key: None,
            reason: None,
            error: None,
            instruction: None,
        }
    }

    /// Whether the effect is proven.
    pub fn is_success(&self) -> bool {
        self.status == Status::Success
    }

    /// The outcome of a call that reached its tool. `E`'s `Display` is what
    /// the model reads of an error; the value is serialized with serde.
    pub fn from_result<T: Serialize, E: Classify>(result: ToolResult<T, E>) -> Self {
        match result {
            ToolResult::Success { value, proof, key } => {
                let mut out = Self::new(Status::Success);
                match serde_json::to_value(&value) {
                    Ok(value) => out.value = Some(value),
                    Err(e) => out.error = Some(format!("the value could not be serialized: {e}")),
                }
                if proof == Proof::Ledger {
                    // A replay says so: a model (or a person) that meant to do
                    // it again must not read it as done twice.
                    out.instruction = Some(
                        "Replayed: this same call was made before and its recorded outcome is \
                         returned; nothing was done again. To do it again on purpose, make a \
                         new call with a new request identity (a new tool call id; over MCP, a \
                         new `idempotencyKey`); a tool that names its action by its arguments \
                         does each action once."
                            .to_owned(),
                    );
                }
                out.proof = Some(proof);
                out.key = Some(key);
                out
            }
            ToolResult::Failed { error, key } => {
                let mut out = Self::new(Status::Failed);
                out.key = Some(key);
                out.error = Some(error.describe());
                out.instruction = Some(
                    "The tool refused this call and nothing was changed. Do not repeat it \
                     unchanged: fix the cause first."
                        .to_owned(),
                );
                out
            }
            ToolResult::NotApplied { cause, key } => {
                let mut out = Self::new(Status::NotApplied);
                out.key = Some(key);
                out.instruction = Some(not_applied_instruction(&cause).to_owned());
                out.error = Some(cause_text(&cause));
                out
            }
            ToolResult::Unknown { reason, cause, key } => {
                let mut out = Self::new(Status::Unknown);
                out.key = Some(key);
                out.reason = Some(reason);
                out.error = Some(cause_text(&cause));
                out.instruction = Some(format!(
                    "Do not repeat this call: it may already have happened, and a new call \
                     could do it twice. It can be checked later with key {key} (repeating \
                     this same tool call, with the same tool call id, checks first)."
                ));
                out
            }
            ToolResult::Escalated { reason, cause, key, .. } => {
                let mut out = Self::new(Status::Escalated);
                out.key = Some(key);
                out.reason = Some(reason);
                out.error = Some(cause_text(&cause));
                out.instruction = Some(format!(
                    "Do not repeat this call: it may already have happened, and a person has \
                     been asked to check. Tell the user it awaits review (key {key})."
                ));
                out
            }
            ToolResult::Refused(error) => {
                let mut out = Self::new(Status::Refused);
                out.key = error.key();
                out.instruction = Some(refusal_instruction(&error).to_owned());
                out.error = Some(error.to_string());
                out
            }
        }
    }

    /// The outcome of a call whose arguments did not fit.
    pub fn invalid_arguments(error: &ArgsError) -> Self {
        let mut out = Self::new(Status::InvalidArguments);
        out.error = Some(error.message.clone());
        out.instruction =
            Some("Nothing was done. Correct the arguments and call the tool again.".to_owned());
        out
    }

    /// The outcome of a call of a tool that does not exist.
    pub fn no_such_tool<'a>(name: &str, known: impl IntoIterator<Item = &'a str>) -> Self {
        let mut out = Self::new(Status::NoSuchTool);
        let names: Vec<String> = known.into_iter().map(|n| format!("`{n}`")).collect();
        out.error = Some(format!("there is no tool named `{name}`"));
        out.instruction = Some(if names.is_empty() {
            "Nothing was done. No tools are available.".to_owned()
        } else {
            format!("Nothing was done. The tools are: {}.", names.join(", "))
        });
        out
    }
}

/// The last failure, in words.
fn cause_text<E: Classify>(cause: &Cause<E>) -> String {
    match cause {
        Cause::Error(e) => e.describe(),
        Cause::TimedOut(after) => format!("no answer within {after:?}"),
        Cause::DeadlineReached(call) => {
            format!("no answer before the call's deadline ({call:?}) passed")
        }
        Cause::Unconfirmed => {
            "the tool answered OK, but its effect could not be confirmed".to_owned()
        }
        Cause::Interrupted => {
            "an earlier call with this key was interrupted before its effect was proven".to_owned()
        }
        Cause::NeverSent => "nothing was ever sent under this key".to_owned(),
    }
}

/// What to do after `NotApplied`, by what the call knows. Only a failure
/// that proves nothing left the client, or a conflict the service answered,
/// makes a new call safe at once; after a timeout or an ambiguous error the
/// verifier's settled `Absent` is as good as the settle margin, and a
/// service that ignores deadlines may still apply the first request late: a
/// new call could then do it twice, where repeating this same call checks
/// first and never sends it again under its key.
fn not_applied_instruction<E: Classify>(cause: &Cause<E>) -> &'static str {
    match cause {
        Cause::NeverSent => {
            "Nothing was ever sent under this key. If it is still needed, make the call again: \
             it checks first, then sends it once."
        }
        Cause::Error(e) if e.classify() == crate::ErrorClass::NotSent => {
            "Nothing was sent, and this call is closed. If it is still needed, make a new call."
        }
        Cause::Error(e) if e.classify() == crate::ErrorClass::Conflict => {
            "This did not happen: the record changed since it was read. Read the current state \
             first, then make a new call if it is still needed."
        }
        _ => {
            "This was not found once the last attempt had settled, and this call is closed. Do \
             not make a new call for it: if the service applies requests late, the first one \
             may still land. To learn the final state, repeat this same call later (the same \
             tool call id): it checks first and never sends it again."
        }
    }
}

/// What to do after a refusal, by its kind.
fn refusal_instruction(error: &CallError) -> &'static str {
    match error {
        CallError::InProgress { .. } => {
            "Nothing was done: the same call is still running. Do not make a new call; wait \
             for it, or check later with the key."
        }
        CallError::KeyReuse { .. } => {
            "Nothing was done: this call's identity (its tool call id, idempotency key, or the \
             arguments that name its action) was already used with other arguments. A new \
             action needs a new tool call; the same action must be asked with the same \
             arguments."
        }
        _ => "Nothing was done: the call could not be recorded safely. Try again later.",
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use serde_json::json;

    use super::*;
    use crate::{Classified, ErrorClass, Verdict};

    const KEY: IdempotencyKey = IdempotencyKey::from_u128(1);

    fn json_of(result: ToolResult<Value, Classified<&'static str>>) -> Value {
        serde_json::to_value(ToolOutcome::from_result(result)).unwrap()
    }

    #[test]
    fn every_result_serializes_for_the_model() {
        let ok = json_of(ToolResult::Success {
            value: json!({"id": 7}),
            proof: Proof::Ledger,
            key: KEY,
        });
        let replayed = ok["instruction"].as_str().unwrap_or_default().to_owned();
        assert!(replayed.starts_with("Replayed: "), "a replay says so: {ok}");
        assert_eq!(
            ok,
            json!({"status": "success", "value": {"id": 7}, "proof": "ledger",
                   "key": "00000000000000000000000000000001", "instruction": replayed})
        );
        let fresh = json_of(ToolResult::Success {
            value: json!({"id": 7}),
            proof: Proof::Response,
            key: KEY,
        });
        assert!(fresh.get("instruction").is_none(), "{fresh}");
        let failed = json_of(ToolResult::Failed {
            error: Classified::new("not found", ErrorClass::Definitive),
            key: KEY,
        });
        assert_eq!(failed["status"], "failed");
        assert_eq!(failed["error"], "not found");
        assert!(failed.get("value").is_none());
        let missing = json_of(ToolResult::NotApplied {
            cause: Cause::Error(Classified::new("version conflict", ErrorClass::Conflict)),
            key: KEY,
        });
        assert_eq!(missing["status"], "not_applied");
        assert!(missing["instruction"].as_str().unwrap().contains("make a new call"));
        // After a timeout the first attempt may still land: never "a new call".
        let late = json_of(ToolResult::NotApplied {
            cause: Cause::TimedOut(Duration::from_secs(2)),
            key: KEY,
        });
        let text = late["instruction"].as_str().unwrap();
        assert!(text.contains("Do not make a new call"), "{text}");
        assert!(text.contains("repeat this same call"), "{text}");

        let doubt = json_of(ToolResult::Unknown {
            reason: UnknownReason::Unsettled,
            cause: Cause::TimedOut(Duration::from_secs(1)),
            key: KEY,
        });
        assert_eq!(doubt["reason"], "unsettled");
        assert_eq!(doubt["error"], "no answer within 1s");
        let text = doubt["instruction"].as_str().unwrap();
        assert!(text.starts_with("Do not repeat this call"), "{text}");
        assert!(text.contains("00000000000000000000000000000001"), "{text}");
        let escalated = json_of(ToolResult::Escalated {
            reason: UnknownReason::VerifierInconclusive,
            verdict: Verdict::Unknown,
            cause: Cause::Unconfirmed,
            key: KEY,
        });
        assert_eq!(escalated["status"], "escalated");
        assert_eq!(escalated["reason"], "verifier_inconclusive");
        assert!(escalated["instruction"].as_str().unwrap().contains("a person"));
        let refused = json_of(ToolResult::Refused(CallError::InProgress { tool: "t", key: KEY }));
        assert_eq!(refused["status"], "refused");
        assert_eq!(refused["key"], "00000000000000000000000000000001");
        assert!(refused["instruction"].as_str().unwrap().contains("still running"));
    }

    #[test]
    fn outcomes_read_back() {
        let outcome = ToolOutcome::no_such_tool("nope", ["a", "b"]);
        let back: ToolOutcome =
            serde_json::from_value(serde_json::to_value(&outcome).unwrap()).unwrap();
        assert_eq!(back, outcome);
        assert_eq!(back.instruction.as_deref(), Some("Nothing was done. The tools are: `a`, `b`."));
        let args = ToolOutcome::invalid_arguments(&ArgsError::new("t", "missing field `x`"));
        assert_eq!(args.status, Status::InvalidArguments);
        assert_eq!(args.error.as_deref(), Some("missing field `x`"));
        assert!(!args.is_success());
        for status in Status::ALL {
            assert_eq!(serde_json::to_value(status).unwrap(), status.as_str());
        }
    }
}
