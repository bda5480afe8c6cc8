//! Forwarding a [`Deadline`] with reqwest (feature `reqwest`): the header
//! for the server and the request's own timeout, from one reading of the
//! clock.

use super::{Deadline, TIMEOUT_HEADER};

/// Forwards an attempt's [`Deadline`] on a reqwest request: the time left
/// as [`TIMEOUT_HEADER`] (`connect-timeout-ms`), so that a server that
/// honours deadlines drops the request rather than apply it after the
/// client gave up, and as the request's own
/// [`timeout`](::reqwest::RequestBuilder::timeout), so that the client gives
/// up when it told the server to (a timed-out attempt is
/// [`Ambiguous`](crate::ErrorClass::Ambiguous): the verifier is asked).
///
/// Both are the same whole milliseconds, read once: a header and a timeout
/// read at two instants would disagree by the time between them.
///
/// ```
/// use std::time::Duration;
/// use verified_tools::Deadline;
/// use verified_tools::deadline::DeadlineExt;
///
/// # #[tokio::main(flavor = "current_thread", start_paused = true)] async fn main() {
/// let client = reqwest::Client::new();
/// let deadline = Deadline::after(Duration::from_millis(1500));
/// let request = client
///     .post("http://127.0.0.1:8080/charges")
///     .header("Idempotency-Key", "0123456789abcdef0123456789abcdef")
///     .with_deadline(deadline)
///     .build()
///     .unwrap();
/// assert_eq!(request.headers()["connect-timeout-ms"], "1500");
/// assert_eq!(request.timeout(), Some(&Duration::from_millis(1500)));
///
/// // A service that reads another header.
/// let request = client
///     .post("http://127.0.0.1:8080/charges")
///     .with_deadline_as("x-timeout-ms", deadline)
///     .build()
///     .unwrap();
/// assert_eq!(request.headers()["x-timeout-ms"], "1500");
/// # }
/// ```
pub trait DeadlineExt: Sized + sealed::Sealed {
    /// Sets [`TIMEOUT_HEADER`] and the request's timeout to the time left
    /// before `deadline` ([`Deadline::http_timeout`]: whole milliseconds,
    /// at least 1).
    #[must_use]
    fn with_deadline(self, deadline: Deadline) -> Self;

    /// [`with_deadline`](Self::with_deadline) with the time left in the
    /// header `header` instead. A name that is not a valid header name
    /// makes the request fail when sent, as a builder error
    /// ([`Definitive`](crate::ErrorClass::Definitive): nothing was sent).
    #[must_use]
    fn with_deadline_as(self, header: &str, deadline: Deadline) -> Self;
}

impl DeadlineExt for ::reqwest::RequestBuilder {
    fn with_deadline(self, deadline: Deadline) -> Self {
        self.with_deadline_as(TIMEOUT_HEADER, deadline)
    }

    fn with_deadline_as(self, header: &str, deadline: Deadline) -> Self {
        let left = deadline.http_timeout();
        self.header(header, left.as_millis()).timeout(left.as_duration())
    }
}

/// Implemented for reqwest's builder only, so that methods can be added.
mod sealed {
    pub trait Sealed {}
    impl Sealed for ::reqwest::RequestBuilder {}
}
