//! The simulated API's error and what it says about the effect.

use crate::{Classify, ErrorClass};

/// An error answered by the simulated server.
///
/// ```
/// use verified_tools::{Classify, ErrorClass};
/// use verified_tools::sim::SimError;
///
/// assert_eq!(SimError::Timeout.classify(), ErrorClass::Ambiguous);
/// assert_eq!(SimError::Conflict { expected: 1, actual: 2 }.classify(), ErrorClass::Conflict);
/// assert_eq!(SimError::NotFound.classify(), ErrorClass::Definitive);
/// assert_eq!(SimError::DeadlineExceeded.classify(), ErrorClass::Definitive);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, thiserror::Error)]
pub enum SimError {
    /// No response in time: the effect may or may not have been applied.
    #[error("timed out waiting for the server")]
    Timeout,
    /// The expected version is stale: the target changed since it was read.
    #[error("version conflict: expected version {expected}, the record is at {actual}")]
    Conflict {
        /// The version the caller expected.
        expected: u64,
        /// The version the target is at.
        actual: u64,
    },
    /// The target does not exist; nothing was applied.
    #[error("not found")]
    NotFound,
    /// The idempotency key was already used for another operation or
    /// target; nothing was applied.
    #[error("idempotency key reused for a different request")]
    KeyReuse,
    /// A read was served by a replica known to lag behind (only with
    /// [`StaleReads::Flagged`](super::StaleReads::Flagged)).
    #[error("replica is behind; read may be stale")]
    StaleRead,
    /// The request reached a server that honours deadlines after its
    /// deadline had passed: dropped, nothing was applied. (A late arrival
    /// dropped this way is never answered: its client already timed out.)
    #[error("deadline exceeded before the server received the request; nothing was applied")]
    DeadlineExceeded,
}

impl Classify for SimError {
    fn classify(&self) -> ErrorClass {
        match self {
            SimError::Timeout | SimError::StaleRead => ErrorClass::Ambiguous,
            SimError::Conflict { .. } => ErrorClass::Conflict,
            SimError::NotFound | SimError::KeyReuse | SimError::DeadlineExceeded => {
                ErrorClass::Definitive
            }
        }
    }
}
