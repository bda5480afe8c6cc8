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
    /// A call with this key completed before: the attempt rolled back, and
    /// the recorded value is read (the engine verifies: a replay).
    Completed,
    /// Another call holds the key, outside any transaction (not a
    /// transactional tool's: its lease has not ended): rolled back.
    InFlight,
    /// The key is recorded with another payload: rolled back. A new call
    /// needs a new key.
    KeyReuse,
    /// The attempt came without a claim to make: the engine ran the tool
    /// without this ledger, or for a `none` tool (which records nothing).
    NoClaim,
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
                format!("{}: {}", stage.doing(), super::super::failure::describe(source))
            }
            TxError::Closed { stage, error } => format!(
                "the connection closed while {}, before COMMIT: rolled back; call again with a \
                 live connection ({error})",
                stage.doing()
            ),
            TxError::Completed => {
                "a call with this key completed before: rolled back, its record is read".into()
            }
            TxError::InFlight => {
                "another call holds the key outside a transaction: rolled back".into()
            }
            TxError::KeyReuse => "the key is recorded with another payload: rolled back; a new \
                                  call needs a new key"
                .into(),
            TxError::NoClaim => "the attempt came with no claim to make; a transactional tool \
                                 runs with its ledger (PostgresLedger::transact) and a side \
                                 effect other than none"
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
            TxError::Closed { .. }
            | TxError::Completed
            | TxError::InFlight
            | TxError::KeyReuse
            | TxError::NoClaim => None,
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
/// | `Completed` | `Conflict` | the effect holds: the verifier reads the record's value |
/// | `InFlight`, `KeyReuse`, `NoClaim` | `Definitive` | rolled back, and another attempt would find the same |
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
            TxError::Completed => ErrorClass::Conflict,
            TxError::Closed { .. } | TxError::InFlight | TxError::KeyReuse | TxError::NoClaim => {
                ErrorClass::Definitive
            }
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
        assert_eq!(TxError::<std::io::Error>::Completed.classify(), ErrorClass::Conflict);
        assert_eq!(TxError::<std::io::Error>::NoClaim.classify(), ErrorClass::Definitive);
    }
}
