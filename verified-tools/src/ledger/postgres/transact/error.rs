//! What a transactional attempt's failure says, and proves.

use std::fmt;

use crate::{Classify, ErrorClass};

/// Where a transactional attempt's statement failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum TxStage {
    /// `BEGIN`, the attempt's timeouts and the lock on the call's record.
    Open,
    /// The tool's body.
    Body,
    /// Completing the record and `COMMIT`, sent as one message.
    Commit,
}

/// Why an attempt of a transactional tool failed. Every variant but a
/// [`Commit`](TxStage::Commit) that lost its answer says the transaction
/// rolled back: nothing the body wrote is kept.
#[derive(Debug)]
#[non_exhaustive]
pub enum TxError<E> {
    /// The body returned an error; its transaction rolled back.
    Body(E),
    /// A statement of the engine's own failed (or its answer was lost).
    Postgres {
        /// Which one.
        stage: TxStage,
        /// tokio-postgres' error.
        source: tokio_postgres::Error,
    },
    /// The client's connection closed before `COMMIT` went out: rolled
    /// back, and no later attempt can run on this client. Call again with a
    /// live connection (the same call: its key, and its budget, carry on).
    Closed {
        /// Where the attempt was.
        stage: TxStage,
        /// The error that showed it, in words.
        error: String,
    },
    /// The call no longer holds its key under this attempt (another call
    /// took it over after the lease): rolled back before the body ran.
    NotHeld,
    /// The attempt came without a hold on a ledger record: the call's
    /// ledger refused it (a low-risk tool allowed to run without a ledger).
    NoHold,
}

impl TxStage {
    fn doing(self) -> &'static str {
        match self {
            TxStage::Open => "opening the tool's transaction",
            TxStage::Body => "running the tool's body",
            TxStage::Commit => "committing the tool's transaction",
        }
    }
}

impl<E> TxError<E> {
    /// The text of the engine's own failures (the body's error has its own).
    fn engine_text(&self) -> String {
        match self {
            TxError::Body(_) => String::new(),
            TxError::Postgres { stage, source } => {
                format!("{}: {}", stage.doing(), super::super::describe(source))
            }
            TxError::Closed { stage, error } => format!(
                "the connection closed while {}, before COMMIT: rolled back; call again with a \
                 live connection ({error})",
                stage.doing()
            ),
            TxError::NotHeld => {
                "the call no longer holds its key (taken over after its lease): rolled back".into()
            }
            TxError::NoHold => "the attempt holds no ledger record; a transactional tool runs \
                                only with its ledger (PostgresLedger::transact)"
                .into(),
        }
    }
}

impl<E: fmt::Display> fmt::Display for TxError<E> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            TxError::Body(error) => write!(f, "the tool's transaction rolled back: {error}"),
            other => f.write_str(&other.engine_text()),
        }
    }
}

impl<E: std::error::Error + 'static> std::error::Error for TxError<E> {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            TxError::Body(error) => Some(error),
            TxError::Postgres { source, .. } => Some(source),
            TxError::Closed { .. } | TxError::NotHeld | TxError::NoHold => None,
        }
    }
}

/// What a failed attempt proves: it rolled back, unless `COMMIT` went out
/// and its answer never came.
///
/// | error | class | why |
/// | --- | --- | --- |
/// | `Body(e)` | `e`'s class, with `Ambiguous` read as `NotSent` | rolled back: a lost answer inside the transaction cannot have committed |
/// | `Postgres { Open, .. }` | `Definitive` for a server's refusal of the ledger's statements (its schema), else `NotSent` | nothing was written |
/// | `Postgres { Commit, .. }`, a server error | `NotSent` | the message stops at the error: no `COMMIT` ran (a failed `COMMIT` rolls back) |
/// | `Postgres { Commit, .. }`, the answer lost | `Ambiguous` | `COMMIT` may have committed: the verifier reads the record |
/// | `Closed { .. }` | `Definitive` | rolled back, and the same client cannot do better |
/// | `NotHeld` | `Conflict` | another call holds the key: re-checked before anything else |
/// | `NoHold` | `Definitive` | no attempt can run without a hold |
impl<E: Classify> Classify for TxError<E> {
    fn classify(&self) -> ErrorClass {
        match self {
            TxError::Body(error) => match error.classify() {
                ErrorClass::Ambiguous => ErrorClass::NotSent,
                class => class,
            },
            TxError::Postgres { stage, source } => match (stage, source.as_db_error()) {
                (TxStage::Commit, None) => ErrorClass::Ambiguous,
                (TxStage::Open, Some(_)) => match source.classify() {
                    ErrorClass::Definitive => ErrorClass::Definitive,
                    _ => ErrorClass::NotSent,
                },
                _ => ErrorClass::NotSent,
            },
            TxError::NotHeld => ErrorClass::Conflict,
            TxError::Closed { .. } | TxError::NoHold => ErrorClass::Definitive,
        }
    }

    fn describe(&self) -> String {
        match self {
            TxError::Body(error) => {
                format!("the tool's transaction rolled back: {}", error.describe())
            }
            other => other.engine_text(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_lost_commit_answer_is_in_doubt() {
        let body: TxError<std::io::Error> = TxError::Body(std::io::ErrorKind::TimedOut.into());
        assert_eq!(body.classify(), ErrorClass::NotSent, "rolled back");
        let closed: TxError<std::io::Error> =
            TxError::Closed { stage: TxStage::Body, error: "connection closed".into() };
        assert_eq!(closed.classify(), ErrorClass::Definitive, "this client cannot do better");
        assert_eq!(TxError::<std::io::Error>::NotHeld.classify(), ErrorClass::Conflict);
        assert_eq!(TxError::<std::io::Error>::NoHold.classify(), ErrorClass::Definitive);
    }
}
