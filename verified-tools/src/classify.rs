//! Error classification: did the effect maybe happen?

use std::io;

/// What a tool error says about the effect.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ErrorClass {
    /// The effect did not happen and retrying will not help (validation
    /// error, refused before dispatch, 4xx): the call fails.
    Definitive,
    /// The effect may or may not have happened (timeout, reset, 5xx after
    /// dispatch): only a verifier can tell.
    Ambiguous,
    /// Our write was rejected because the record changed since we read it.
    /// Someone else may have done what we wanted: re-checked before any retry.
    Conflict,
}

/// Implemented by a tool's error type to say what each error means for the
/// effect. When unsure, say [`ErrorClass::Ambiguous`]: an error after dispatch
/// is never "did not happen".
///
/// ```
/// use verified_tools::{Classify, ErrorClass};
///
/// enum CrmError { Invalid, Timeout, VersionMismatch }
///
/// impl Classify for CrmError {
///     fn classify(&self) -> ErrorClass {
///         match self {
///             CrmError::Invalid => ErrorClass::Definitive,
///             CrmError::Timeout => ErrorClass::Ambiguous,
///             CrmError::VersionMismatch => ErrorClass::Conflict,
///         }
///     }
/// }
/// assert_eq!(CrmError::Timeout.classify(), ErrorClass::Ambiguous);
/// ```
pub trait Classify {
    /// The class of this error.
    fn classify(&self) -> ErrorClass;
}

impl Classify for io::Error {
    /// Errors that can only arise before anything reached the server are
    /// definitive; everything else, including `Other`, is ambiguous.
    fn classify(&self) -> ErrorClass {
        use io::ErrorKind::*;
        match self.kind() {
            NotFound | PermissionDenied | ConnectionRefused | AddrInUse | AddrNotAvailable
            | InvalidInput | Unsupported | NotConnected | OutOfMemory => ErrorClass::Definitive,
            _ => ErrorClass::Ambiguous,
        }
    }
}

impl Classify for tokio::time::error::Elapsed {
    /// A timeout says nothing about the effect.
    fn classify(&self) -> ErrorClass {
        ErrorClass::Ambiguous
    }
}

impl Classify for ErrorClass {
    fn classify(&self) -> ErrorClass {
        *self
    }
}

impl<E: Classify + ?Sized> Classify for Box<E> {
    fn classify(&self) -> ErrorClass {
        (**self).classify()
    }
}
