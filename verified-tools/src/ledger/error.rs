//! [`StoreError`]: what a ledger's store said when it failed, with the
//! client library's own error kept beneath it.

use std::error::Error;
use std::fmt;
use std::sync::Arc;

/// Why a ledger's store failed: the payload of [`LedgerError::Unavailable`]
/// and [`LedgerError::Corrupt`].
///
/// It holds a message, which is what it displays, and, when the failure came
/// from the store's client library, that library's error as its
/// [`source`](Error::source), so that a caller can downcast it and read what
/// only the library knows (a PostgreSQL SQLSTATE, a Redis error kind, an
/// SQLite result code):
///
/// ```
/// use std::error::Error as _;
/// use verified_tools::ledger::{LedgerError, StoreError};
///
/// let io = std::io::Error::new(std::io::ErrorKind::TimedOut, "no answer");
/// let error = LedgerError::Unavailable(StoreError::with_source("my store: no answer", io));
/// let kept = error.source().and_then(|s| s.source()).unwrap();
/// assert_eq!(kept.downcast_ref::<std::io::Error>().unwrap().kind(), std::io::ErrorKind::TimedOut);
/// ```
///
/// A backend's own message usually already names the library's error (it
/// reads as before the source was kept), so a report that walks the
/// [`source`](Error::source) chain may show that text twice.
///
/// The source is shared ([`Arc`]), so a `StoreError` is [`Clone`] as
/// [`LedgerError`] is. Two `StoreError`s are equal when their messages are:
/// the sources, which need not be comparable, are not compared.
///
/// [`LedgerError::Unavailable`]: super::LedgerError::Unavailable
/// [`LedgerError::Corrupt`]: super::LedgerError::Corrupt
/// [`LedgerError`]: super::LedgerError
#[derive(Clone)]
pub struct StoreError {
    message: String,
    source: Option<Arc<dyn Error + Send + Sync + 'static>>,
}

impl StoreError {
    /// A failure described by `message` alone, with no error beneath it
    /// (the same as `StoreError::from(message)`).
    pub fn new(message: impl Into<String>) -> Self {
        StoreError { message: message.into(), source: None }
    }

    /// A failure described by `message` that keeps `source`, the error it
    /// came from, as its [`source`](Error::source).
    pub fn with_source<E>(message: impl Into<String>, source: E) -> Self
    where
        E: Error + Send + Sync + 'static,
    {
        StoreError { message: message.into(), source: Some(Arc::new(source)) }
    }

    /// What it displays: the message, without the source's own.
    pub fn message(&self) -> &str {
        &self.message
    }

    /// The same failure, its message preceded by `prefix` (a file's path).
    #[cfg(any(feature = "sqlite", test))]
    pub(crate) fn prefixed(self, prefix: impl fmt::Display) -> Self {
        StoreError { message: format!("{prefix}: {}", self.message), source: self.source }
    }
}

impl fmt::Display for StoreError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

impl fmt::Debug for StoreError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut debug = f.debug_struct("StoreError");
        debug.field("message", &self.message);
        if let Some(source) = &self.source {
            debug.field("source", source);
        }
        debug.finish()
    }
}

impl Error for StoreError {
    fn source(&self) -> Option<&(dyn Error + 'static)> {
        self.source.as_deref().map(|source| source as &(dyn Error + 'static))
    }
}

/// Equal when the messages are; the sources are not compared.
impl PartialEq for StoreError {
    fn eq(&self, other: &Self) -> bool {
        self.message == other.message
    }
}

impl Eq for StoreError {}

impl From<String> for StoreError {
    fn from(message: String) -> Self {
        StoreError::new(message)
    }
}

impl From<&str> for StoreError {
    fn from(message: &str) -> Self {
        StoreError::new(message)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn displays_its_message_and_keeps_its_source() {
        let io = std::io::Error::new(std::io::ErrorKind::ConnectionReset, "reset");
        let error = StoreError::with_source("store: reset", io);
        assert_eq!(error.to_string(), "store: reset");
        let source = error.source().expect("a source");
        let io = source.downcast_ref::<std::io::Error>().expect("the io::Error itself");
        assert_eq!(io.kind(), std::io::ErrorKind::ConnectionReset);
        // A clone shares it.
        assert!(error.clone().source().is_some_and(|s| s.is::<std::io::Error>()));
        let prefixed = error.prefixed("/tmp/ledger");
        assert_eq!(prefixed.message(), "/tmp/ledger: store: reset");
        assert!(prefixed.source().is_some());
    }

    #[test]
    fn compares_by_message() {
        let io = std::io::Error::other("x");
        assert_eq!(StoreError::with_source("m", io), StoreError::from("m"));
        assert_ne!(StoreError::from("m"), StoreError::from(String::from("n")));
        assert!(StoreError::new("m").source().is_none());
    }
}
