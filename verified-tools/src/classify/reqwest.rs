//! `reqwest::Error` (feature `reqwest`): what an HTTP client's failure
//! proves about the request's effect.

use super::{Classify, ErrorClass};

/// What reqwest's error proves, by the stage where the request failed.
///
/// | error | class | why |
/// | --- | --- | --- |
/// | [`is_builder`](::reqwest::Error::is_builder): bad URL, header, scheme | `Definitive` | the request was never built, so never sent, and the same arguments fail again |
/// | [`is_connect`](::reqwest::Error::is_connect) (and [`is_dns`](::reqwest::Error::is_dns)): DNS failure, connection refused, TLS handshake or proxy tunnel failed, connect timeout | `NotSent` | the connection was never established, so no byte of the request left the client |
/// | [`is_status`](::reqwest::Error::is_status), from `error_for_status` | by the status | [`ErrorClass::from_http_status`]: 409 and 412 `Conflict`, 421, 425, 429 `NotSent`, 408 and 5xx `Ambiguous`, other 4xx `Definitive` |
/// | [`is_timeout`](::reqwest::Error::is_timeout) (not while connecting) | `Ambiguous` | the request may have arrived and been applied; the answer is what was late |
/// | [`is_body`](::reqwest::Error::is_body), [`is_decode`](::reqwest::Error::is_decode): the answer broke off or is not the JSON expected | `Ambiguous` | the server answered, so it processed the request: a `200` with a body we cannot read is most likely a success |
/// | [`is_redirect`](::reqwest::Error::is_redirect): too many redirects, or a policy refused one | `Ambiguous` | the first hop answered with a redirect, which may follow a write (`303 See Other` after a `POST`) |
/// | [`is_request`](::reqwest::Error::is_request), other: the connection reset or closed after the request was written, an HTTP/2 stream reset | `Ambiguous` | a server that reads a request, applies it and dies before answering looks exactly like this |
/// | [`is_upgrade`](::reqwest::Error::is_upgrade), anything else | `Ambiguous` | reqwest cannot tell, so neither can we |
///
/// A request that hyper wrote to a pooled connection the server had
/// already closed is retried by hyper itself when it can prove the request
/// was not sent; when it cannot, the error is a request error, `Ambiguous`.
///
/// A status error keeps the status only, not the headers: `Retry-After`
/// cannot be read here, and the retry policy's backoff decides the wait. A
/// tool that reads a status itself (without `error_for_status`) can use
/// [`ErrorClass::from_http_status`] directly.
///
/// `Display` of a request error is "error sending request for url (…)":
/// the cause (connection refused, reset) is in `source()`.
///
/// ```no_run
/// use verified_tools::{Classify, ErrorClass};
///
/// # async fn run(client: reqwest::Client) {
/// let error = client.post("http://127.0.0.1:1/orders").send().await.unwrap_err();
/// assert_eq!(error.classify(), ErrorClass::NotSent); // connection refused
/// # }
/// ```
impl Classify for ::reqwest::Error {
    /// The class by the table above: the checks run from the earliest stage
    /// (building, connecting) to the latest, so a connect timeout is
    /// `NotSent`, not the `Ambiguous` of a timeout.
    fn classify(&self) -> ErrorClass {
        if self.is_builder() {
            ErrorClass::Definitive
        } else if self.is_connect() || self.is_dns() {
            ErrorClass::NotSent
        } else if let Some(status) = self.status() {
            ErrorClass::from_http_status(status.as_u16())
        } else {
            // Timeouts, body and decode errors, redirects, resets after the
            // request was written: all after the request may have arrived.
            ErrorClass::Ambiguous
        }
    }

    /// The text with its causes: `Display` alone leaves them out.
    fn describe(&self) -> String {
        super::with_sources(self)
    }
}
