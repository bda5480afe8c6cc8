//! What a streamable HTTP endpoint needs beyond rmcp's service: who the
//! client is (bearer tokens, [`Authenticate`]), and how long and how many
//! ([`HttpLimits`]), with the accept loop that enforces the limits a tower
//! service cannot see (headers, idle connections, connection counts).

use std::collections::HashMap;
use std::fmt;
use std::future::Future;
use std::io;
use std::net::IpAddr;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use hyper::header::{self, HeaderValue};
use hyper::{Response, StatusCode};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::sync::Semaphore;

use super::wire::HttpResponse;

/// An authenticated client: the principal its calls are keyed for (two
/// principals never share a call), from an [`Authenticate`] on HTTP.
///
/// The handler finds it in the request's extensions (rmcp hands the
/// request's `http::request::Parts` to the handler in
/// `RequestContext::extensions`).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Principal(Arc<str>);

impl Principal {
    /// The principal named `name` (a user id, a client id: whatever the
    /// application's tokens name).
    pub fn new(name: impl Into<Arc<str>>) -> Self {
        Self(name.into())
    }

    /// Its name.
    pub fn as_str(&self) -> &str {
        &self.0
    }

    pub(crate) fn name(&self) -> &Arc<str> {
        &self.0
    }
}

impl fmt::Display for Principal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// Checks a bearer token (`Authorization: Bearer TOKEN`, RFC 6750): the
/// principal it stands for, or `None` to refuse the request (`401`).
///
/// A closure `Fn(&str) -> Option<Principal>` is one; so is a
/// [`BearerToken`]. It runs on every HTTP request, before anything else, so
/// it should answer from memory (a map of tokens, a signature check), not
/// from the network.
pub trait Authenticate: Send + Sync + 'static {
    /// The principal `token` stands for, if any.
    fn authenticate(&self, token: &str) -> Option<Principal>;
}

impl<F> Authenticate for F
where
    F: Fn(&str) -> Option<Principal> + Send + Sync + 'static,
{
    fn authenticate(&self, token: &str) -> Option<Principal> {
        self(token)
    }
}

/// One static token for one principal.
pub struct BearerToken {
    token: Box<[u8]>,
    principal: Principal,
}

impl BearerToken {
    /// Accepts `token` (and nothing else) as `principal`.
    ///
    /// # Panics
    ///
    /// When `token` is empty: an empty token would let anyone in who sends
    /// `Authorization: Bearer ` with nothing after it.
    pub fn new(token: impl Into<String>, principal: Principal) -> Self {
        let token = token.into().into_bytes().into_boxed_slice();
        assert!(!token.is_empty(), "a bearer token is not empty");
        Self { token, principal }
    }
}

impl fmt::Debug for BearerToken {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // Never the token itself: a Debug line ends up in logs.
        f.debug_struct("BearerToken").field("principal", &self.principal).finish_non_exhaustive()
    }
}

impl Authenticate for BearerToken {
    fn authenticate(&self, token: &str) -> Option<Principal> {
        constant_time_eq(token.as_bytes(), &self.token).then(|| self.principal.clone())
    }
}

/// Equality whose time does not tell how many leading bytes matched (it
/// still tells the length, which a token's format makes public anyway).
fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    if a.len() != b.len() {
        return false;
    }
    a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// Why a request's credentials do not do.
pub(crate) enum AuthError {
    /// No `Authorization: Bearer` header.
    Missing,
    /// A token the [`Authenticate`] refused, or a malformed header.
    Invalid,
}

/// The principal of a request's `Authorization` header.
pub(crate) fn authenticate(
    auth: &dyn Authenticate,
    headers: &hyper::HeaderMap,
) -> Result<Principal, AuthError> {
    let Some(value) = headers.get(header::AUTHORIZATION) else { return Err(AuthError::Missing) };
    let value = value.to_str().map_err(|_| AuthError::Invalid)?;
    let (scheme, token) = value.trim().split_once(' ').ok_or(AuthError::Invalid)?;
    // RFC 7235: the scheme is case-insensitive.
    if !scheme.eq_ignore_ascii_case("bearer") {
        return Err(AuthError::Missing);
    }
    let token = token.trim();
    if token.is_empty() {
        return Err(AuthError::Invalid);
    }
    auth.authenticate(token).ok_or(AuthError::Invalid)
}

/// The `401` of RFC 6750 §3: a challenge, with `error="invalid_token"`
/// when a token was sent and refused (none when none was sent).
pub(crate) fn unauthorized(error: &AuthError) -> HttpResponse {
    use http_body_util::{BodyExt as _, Full};
    let (challenge, message) = match error {
        AuthError::Missing => {
            (r#"Bearer realm="mcp""#, "Unauthorized: send `Authorization: Bearer <token>`")
        }
        AuthError::Invalid => (
            r#"Bearer realm="mcp", error="invalid_token", error_description="the token is not accepted""#,
            "Unauthorized: the bearer token is not accepted",
        ),
    };
    let body = serde_json::json!({
        "jsonrpc": "2.0",
        "id": null,
        "error": {"code": -32001, "message": message}
    });
    Response::builder()
        .status(StatusCode::UNAUTHORIZED)
        .header(header::WWW_AUTHENTICATE, HeaderValue::from_static(challenge))
        .header(header::CONTENT_TYPE, "application/json")
        .body(Full::new(hyper::body::Bytes::from(body.to_string())).boxed())
        .expect("a valid response")
}

/// How long a streamable HTTP server waits, and how much it takes on at
/// once ([`McpServer::with_http_limits`](super::McpServer::with_http_limits)).
///
/// | limit | default | past it |
/// |---|---|---|
/// | [`header_read_timeout`](Self::header_read_timeout) | 10 s | the connection is closed |
/// | [`body_read_timeout`](Self::body_read_timeout) | 30 s | `408 Request Timeout`, and the connection is closed |
/// | [`idle_timeout`](Self::idle_timeout) | 60 s | the connection is closed |
/// | [`max_connections`](Self::max_connections) | 512 | a new connection is closed at once |
/// | [`max_connections_per_peer`](Self::max_connections_per_peer) | 64 | likewise |
/// | [`max_concurrent_requests`](Self::max_concurrent_requests) | 128 | `503 Service Unavailable`, `Retry-After: 1` |
/// | concurrent requests per connection | 1 | (HTTP/1.1: hyper answers pipelined requests one after another) |
///
/// The header timeout runs from the moment the server waits for a
/// request's head (a new connection, or the end of the previous answer on
/// a kept-alive one: hyper starts it there) until the head has arrived, so
/// it also closes a kept-alive connection left unused that long. The idle
/// timeout closes a connection on which no byte has moved either way for
/// that long, also in the middle of an answer: a client that stopped
/// reading. rmcp's SSE streams send a keep-alive comment every 15 s, well
/// within it. A request counts toward the concurrency cap until its answer
/// has been sent in full, SSE streams included.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct HttpLimits {
    /// The longest wait for a request's head.
    pub header_read_timeout: Duration,
    /// The longest wait for a POST body, from its head.
    pub body_read_timeout: Duration,
    /// The longest a connection stays open with no bytes moving.
    pub idle_timeout: Duration,
    /// Open connections at most.
    pub max_connections: usize,
    /// Open connections from one IP address at most.
    pub max_connections_per_peer: usize,
    /// Requests being answered at once at most, over all connections.
    pub max_concurrent_requests: usize,
}

impl Default for HttpLimits {
    fn default() -> Self {
        Self {
            header_read_timeout: Duration::from_secs(10),
            body_read_timeout: Duration::from_secs(30),
            idle_timeout: Duration::from_secs(60),
            max_connections: 512,
            max_connections_per_peer: 64,
            max_concurrent_requests: 128,
        }
    }
}

impl HttpLimits {
    /// Sets the header read timeout.
    #[must_use]
    pub fn with_header_read_timeout(mut self, timeout: Duration) -> Self {
        self.header_read_timeout = timeout;
        self
    }

    /// Sets the body read timeout.
    #[must_use]
    pub fn with_body_read_timeout(mut self, timeout: Duration) -> Self {
        self.body_read_timeout = timeout;
        self
    }

    /// Sets the idle timeout.
    #[must_use]
    pub fn with_idle_timeout(mut self, timeout: Duration) -> Self {
        self.idle_timeout = timeout;
        self
    }

    /// Sets the cap on open connections.
    #[must_use]
    pub fn with_max_connections(mut self, max: usize) -> Self {
        self.max_connections = max;
        self
    }

    /// Sets the cap on open connections from one IP address.
    #[must_use]
    pub fn with_max_connections_per_peer(mut self, max: usize) -> Self {
        self.max_connections_per_peer = max;
        self
    }

    /// Sets the cap on requests answered at once.
    #[must_use]
    pub fn with_max_concurrent_requests(mut self, max: usize) -> Self {
        self.max_concurrent_requests = max;
        self
    }
}

/// The open connections, in all and per peer.
struct Connections {
    all: Arc<Semaphore>,
    per_peer: Mutex<HashMap<IpAddr, usize>>,
    max_per_peer: usize,
}

/// One admitted connection: its slots, given back on drop.
struct Admitted {
    _slot: tokio::sync::OwnedSemaphorePermit,
    peer: IpAddr,
    connections: Arc<Connections>,
}

impl Drop for Admitted {
    fn drop(&mut self) {
        let mut per_peer = self.connections.per_peer.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(n) = per_peer.get_mut(&self.peer) {
            *n -= 1;
            if *n == 0 {
                per_peer.remove(&self.peer);
            }
        }
    }
}

impl Connections {
    fn new(limits: &HttpLimits) -> Arc<Self> {
        Arc::new(Self {
            all: Arc::new(Semaphore::new(limits.max_connections)),
            per_peer: Mutex::new(HashMap::new()),
            max_per_peer: limits.max_connections_per_peer,
        })
    }

    /// A slot for a connection from `peer`, if both caps leave one.
    fn admit(self: &Arc<Self>, peer: IpAddr) -> Option<Admitted> {
        let slot = Arc::clone(&self.all).try_acquire_owned().ok()?;
        let mut per_peer = self.per_peer.lock().unwrap_or_else(|e| e.into_inner());
        let n = per_peer.entry(peer).or_insert(0);
        if *n >= self.max_per_peer {
            if *n == 0 {
                per_peer.remove(&peer);
            }
            return None;
        }
        *n += 1;
        Some(Admitted { _slot: slot, peer, connections: Arc::clone(self) })
    }
}

/// A stream that notes when a byte last moved, either way: what the idle
/// timeout watches.
pub(crate) struct Tracked<T> {
    inner: T,
    activity: Arc<Activity>,
}

/// When a connection last moved a byte.
pub(crate) struct Activity {
    start: Instant,
    /// Milliseconds from `start`.
    last: AtomicU64,
}

impl Activity {
    fn touch(&self) {
        let now = u64::try_from(self.start.elapsed().as_millis()).unwrap_or(u64::MAX);
        self.last.store(now, Ordering::Relaxed);
    }

    /// Resolves once no byte has moved for `idle`.
    pub(crate) async fn idle_for(&self, idle: Duration) {
        loop {
            let last = Duration::from_millis(self.last.load(Ordering::Relaxed));
            let quiet = self.start.elapsed().saturating_sub(last);
            if quiet >= idle {
                return;
            }
            tokio::time::sleep(idle - quiet).await;
        }
    }
}

impl<T> Tracked<T> {
    pub(crate) fn new(inner: T) -> (Self, Arc<Activity>) {
        let activity = Arc::new(Activity { start: Instant::now(), last: AtomicU64::new(0) });
        (Self { inner, activity: Arc::clone(&activity) }, activity)
    }
}

impl<T: AsyncRead + Unpin> AsyncRead for Tracked<T> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let before = buf.filled().len();
        let polled = Pin::new(&mut self.inner).poll_read(cx, buf);
        if buf.filled().len() > before {
            self.activity.touch();
        }
        polled
    }
}

impl<T: AsyncWrite + Unpin> AsyncWrite for Tracked<T> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let polled = Pin::new(&mut self.inner).poll_write(cx, buf);
        if matches!(polled, Poll::Ready(Ok(n)) if n > 0) {
            self.activity.touch();
        }
        polled
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

/// Accepts connections on `listener` and serves each with `service` under
/// `limits`, until the task is dropped.
pub(crate) async fn serve<S, M>(
    listener: tokio::net::TcpListener,
    service: super::HttpService<S, M>,
    limits: HttpLimits,
) -> io::Result<()>
where
    S: rmcp::ServerHandler + Send + 'static,
    M: rmcp::transport::streamable_http_server::SessionManager,
{
    let connections = Connections::new(&limits);
    loop {
        let (stream, peer) = match listener.accept().await {
            Ok(accepted) => accepted,
            // Out of file descriptors: connections close and free some; a
            // server that stopped here would stop for good.
            Err(e) if matches!(e.raw_os_error(), Some(23 | 24)) => {
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
            Err(e) => return Err(e),
        };
        // Over a cap: dropping the stream closes it, before any byte is
        // read.
        let Some(admitted) = connections.admit(peer.ip()) else { continue };
        tokio::spawn(serve_connection(stream, service.clone(), limits, admitted));
    }
}

/// Serves one accepted connection with `service` under `limits`, until
/// it ends, its idle timeout passes, or the header timeout closes it.
fn serve_connection<S>(
    stream: tokio::net::TcpStream,
    service: S,
    limits: HttpLimits,
    admitted: Admitted,
) -> impl Future<Output = ()> + Send
where
    S: tower_service::Service<
            hyper::Request<hyper::body::Incoming>,
            Response = HttpResponse,
            Error = std::convert::Infallible,
        > + Clone
        + Send
        + 'static,
    S::Future: Send + 'static,
{
    let (stream, activity) = Tracked::new(stream);
    async move {
        let _admitted = admitted;
        let service = hyper_util::service::TowerToHyperService::new(service);
        let connection = hyper::server::conn::http1::Builder::new()
            .timer(hyper_util::rt::TokioTimer::new())
            .header_read_timeout(limits.header_read_timeout)
            .serve_connection(hyper_util::rt::TokioIo::new(stream), service);
        // Dropping the connection closes the socket: the idle timeout needs
        // no cooperation from hyper.
        tokio::select! {
            // A client that goes away mid-request is its own business.
            _ = connection => {}
            () = activity.idle_for(limits.idle_timeout) => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_static_token_admits_itself_alone() {
        let token = BearerToken::new("s3cret", Principal::new("alice"));
        assert_eq!(token.authenticate("s3cret"), Some(Principal::new("alice")));
        assert_eq!(token.authenticate("s3cre"), None);
        assert_eq!(token.authenticate("s3cret!"), None);
        assert_eq!(token.authenticate(""), None);
        assert!(!format!("{token:?}").contains("s3cret"));
    }

    #[test]
    fn the_authorization_header_is_read_as_rfc_6750_says() {
        let token = BearerToken::new("t", Principal::new("p"));
        let headers = |value: Option<&'static str>| {
            let mut map = hyper::HeaderMap::new();
            if let Some(value) = value {
                map.insert(header::AUTHORIZATION, HeaderValue::from_static(value));
            }
            map
        };
        let check = |value| authenticate(&token, &headers(value));
        assert!(matches!(check(None), Err(AuthError::Missing)));
        assert!(matches!(check(Some("Basic dDp0")), Err(AuthError::Missing)));
        assert!(matches!(check(Some("Bearer u")), Err(AuthError::Invalid)));
        assert!(matches!(check(Some("Bearer ")), Err(AuthError::Invalid)));
        assert!(matches!(check(Some("bearer t")), Ok(p) if p.as_str() == "p"));
    }

    #[test]
    fn connection_caps_hold_in_all_and_per_peer() {
        let limits = HttpLimits::default().with_max_connections(3).with_max_connections_per_peer(2);
        let connections = Connections::new(&limits);
        let a: IpAddr = "127.0.0.1".parse().unwrap();
        let b: IpAddr = "127.0.0.2".parse().unwrap();
        let a1 = connections.admit(a).expect("a first");
        let _a2 = connections.admit(a).expect("a second");
        assert!(connections.admit(a).is_none(), "a third from one peer");
        let _b1 = connections.admit(b).expect("another peer");
        assert!(connections.admit(b).is_none(), "over the cap in all");
        drop(a1);
        assert!(connections.admit(a).is_some(), "a slot given back");
    }
}
