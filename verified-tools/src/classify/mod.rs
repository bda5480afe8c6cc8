//! Error classification: did the effect maybe happen?

use std::io;

/// What a tool error says about the effect.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ErrorClass {
    /// The effect did not happen and retrying will not help (validation
    /// error, 4xx): the call fails.
    Definitive,
    /// The request never left the client (connection refused, DNS failure,
    /// TLS or protocol handshake lost): this attempt cannot have applied, so
    /// it is retried within the budget without reading the verifier.
    NotSent,
    /// The effect may or may not have happened (timeout, reset, 5xx after
    /// dispatch): only a verifier can tell.
    Ambiguous,
    /// Our write was rejected because the record changed since we read it.
    /// Someone else may have done what we wanted: re-checked before any retry.
    Conflict,
}

impl std::fmt::Display for ErrorClass {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            ErrorClass::Definitive => "definitive",
            ErrorClass::NotSent => "not sent",
            ErrorClass::Ambiguous => "ambiguous",
            ErrorClass::Conflict => "conflict",
        })
    }
}

/// Implemented by a tool's error type to say what each error means for the
/// effect. When unsure, say [`ErrorClass::Ambiguous`]: an error after dispatch
/// is never "did not happen".
///
/// The error's `Display` text goes to the audit trail and, through a tool
/// set, to the model. For an error type of another crate (`anyhow::Error`,
/// `reqwest::Error`), name a function instead: `#[verified_tool(classify =
/// my_fn)]`, or return [`Classified`] by hand.
///
/// ```
/// use verified_tools::{Classify, ErrorClass};
///
/// #[derive(Debug)]
/// enum CrmError { Invalid, Timeout, VersionMismatch }
///
/// impl std::fmt::Display for CrmError {
///     fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
///         write!(f, "{self:?}")
///     }
/// }
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
#[diagnostic::on_unimplemented(
    message = "`{Self}` does not say what its errors mean for the effect: implement `verified_tools::Classify` for it",
    label = "the tool's error type must implement `Classify` (and `Display`)",
    note = "for an error type of another crate, write `#[verified_tool(classify = my_fn)]` with `fn my_fn(error: &{Self}) -> ErrorClass`"
)]
pub trait Classify: std::fmt::Display {
    /// The class of this error.
    fn classify(&self) -> ErrorClass;
}

impl Classify for io::Error {
    /// A connection that was never made is [`NotSent`](ErrorClass::NotSent);
    /// errors no retry can mend are definitive; everything else, including
    /// `Other`, is ambiguous.
    fn classify(&self) -> ErrorClass {
        use io::ErrorKind::*;
        match self.kind() {
            ConnectionRefused | AddrInUse | AddrNotAvailable | NotConnected => ErrorClass::NotSent,
            NotFound | PermissionDenied | InvalidInput | Unsupported | OutOfMemory => {
                ErrorClass::Definitive
            }
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

/// Any error with its class attached: for error types you cannot implement
/// [`Classify`] for (`anyhow::Error`, another crate's error), without a
/// newtype of your own. `#[verified_tool(classify = path)]` wraps a tool's
/// errors in it for you; by hand, return `Result<T, Classified<E>>`.
///
/// ```
/// use verified_tools::{Classified, Classify, ErrorClass};
///
/// let e = Classified::new(std::fmt::Error, ErrorClass::Ambiguous);
/// assert_eq!(e.classify(), ErrorClass::Ambiguous);
/// assert_eq!(e.to_string(), std::fmt::Error.to_string());
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Classified<E> {
    /// The error.
    pub error: E,
    /// What it says about the effect.
    pub class: ErrorClass,
}

impl<E> Classified<E> {
    /// `error`, of class `class`.
    pub const fn new(error: E, class: ErrorClass) -> Self {
        Self { error, class }
    }

    /// The error back.
    pub fn into_inner(self) -> E {
        self.error
    }
}

impl<E: std::fmt::Display> Classify for Classified<E> {
    fn classify(&self) -> ErrorClass {
        self.class
    }
}

impl<E: std::fmt::Display> std::fmt::Display for Classified<E> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.error.fmt(f)
    }
}

impl<E: std::error::Error + 'static> std::error::Error for Classified<E> {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        Some(&self.error)
    }
}
