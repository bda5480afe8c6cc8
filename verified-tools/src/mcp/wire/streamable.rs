//! The wire on streamable HTTP: a tower service in front of rmcp's, which
//! collects a JSON POST body within the limit and runs the same decision
//! on it.

use std::convert::Infallible;
use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use http_body_util::combinators::BoxBody;
use http_body_util::{BodyExt as _, Full};
use hyper::body::{Body, Buf as _, Bytes};
use hyper::header::{self, HeaderValue};
use hyper::{Method, Request, Response, StatusCode};
use rmcp::ServerHandler;
use rmcp::transport::StreamableHttpService;
use rmcp::transport::streamable_http_server::SessionManager;
use rmcp::transport::streamable_http_server::session::local::LocalSessionManager;
use serde_json::Value;
use tokio::sync::Semaphore;

use super::{Answer, Inspected, WireError, inspect, log, too_large};
#[cfg(doc)]
use crate::mcp::http::Principal;
use crate::mcp::http::{Authenticate, HttpLimits, authenticate, unauthorized};

// ---------------------------------------------------------------------------
// Streamable HTTP.

/// A response of [`HttpService`]: rmcp's own response type.
pub type HttpResponse = Response<BoxBody<Bytes, Infallible>>;

/// rmcp's streamable HTTP endpoint ([`StreamableHttpService`]) with every
/// POST body read by the wire first (see the module's documentation): a
/// tower service, to serve with hyper (`hyper_util`'s
/// `TowerToHyperService`) or mount in axum (`Router::route_service`, or
/// `nest_service`).
///
/// A POST whose `Content-Type` is JSON is collected up to the limit (`413
/// Payload Too Large` past it, with a JSON-RPC error) and inspected: a
/// message that passes goes on to rmcp as one buffered body (rewritten when
/// its `idempotencyKey` was copied into `_meta`); one that does not is
/// answered here with `application/json`: `200 OK` for a request refused
/// for its params (`-32602`, or a tool result for a duplicate argument),
/// `400 Bad Request` for what is not JSON-RPC 2.0 and for notifications.
/// Every other request (GET, DELETE, another content type) goes to rmcp
/// untouched.
///
/// The trade-offs: a POST body is buffered before rmcp sees it (rmcp
/// buffers it too, so the memory of one request is at most twice the
/// limit); and a message this service answers itself skips rmcp's header
/// checks other than `Host` and `Origin` (`Accept`, the session id, the
/// protocol version header), since no handler runs for it. The `Host` and
/// `Origin` checks (DNS rebinding protection) still come first: the
/// request's headers are shown to rmcp, without a body and under a method
/// it serves none of, and its refusal (`403`, `400`) is returned as is.
///
/// With an [`Authenticate`] ([`with_authenticator`](Self::with_authenticator)),
/// every request must carry `Authorization: Bearer TOKEN`, checked before
/// anything else (`401` and a `WWW-Authenticate: Bearer` challenge
/// otherwise, RFC 6750 §3); the [`Principal`] it yields goes into the
/// request's extensions, where the handler finds it. Past
/// [`HttpLimits::max_concurrent_requests`] a request is refused with `503`;
/// a JSON POST body that takes longer than
/// [`HttpLimits::body_read_timeout`] with `408`.
pub struct HttpService<S, M = LocalSessionManager> {
    inner: StreamableHttpService<S, M>,
    limit: usize,
    auth: Option<Arc<dyn Authenticate>>,
    body_timeout: Duration,
    requests: Arc<Semaphore>,
}

impl<S, M> Clone for HttpService<S, M> {
    fn clone(&self) -> Self {
        Self {
            inner: self.inner.clone(),
            limit: self.limit,
            auth: self.auth.clone(),
            body_timeout: self.body_timeout,
            requests: Arc::clone(&self.requests),
        }
    }
}

impl<S, M> fmt::Debug for HttpService<S, M> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("HttpService")
            .field("limit", &self.limit)
            .field("authenticates", &self.auth.is_some())
            .field("body_timeout", &self.body_timeout)
            .finish_non_exhaustive()
    }
}

/// `inner` behind the wire, refusing bodies over `limit` bytes (use the
/// `max_request_body_bytes` of `inner`'s config, as [`HttpService::new`]
/// does, so that the two limits agree).
pub(super) fn http_layer<S, M>(
    inner: StreamableHttpService<S, M>,
    limit: usize,
) -> HttpService<S, M> {
    let limits = HttpLimits::default();
    HttpService {
        inner,
        limit,
        auth: None,
        body_timeout: limits.body_read_timeout,
        requests: Arc::new(Semaphore::new(limits.max_concurrent_requests)),
    }
}

impl<S, M> HttpService<S, M>
where
    S: ServerHandler + Send + 'static,
    M: SessionManager,
{
    /// `inner` behind the wire, with the body limit of `inner`'s config
    /// (`max_request_body_bytes`, 4 MiB by default).
    pub fn new(inner: StreamableHttpService<S, M>) -> Self {
        let limit = inner.config.max_request_body_bytes;
        http_layer(inner, limit)
    }

    /// The rmcp service behind the wire.
    pub fn inner(&self) -> &StreamableHttpService<S, M> {
        &self.inner
    }

    /// Requires a bearer token on every request, checked by `auth`.
    #[must_use]
    pub fn with_authenticator(mut self, auth: Arc<dyn Authenticate>) -> Self {
        self.auth = Some(auth);
        self
    }

    /// Applies the body read timeout and the cap on concurrent requests of
    /// `limits` (the rest are the accept loop's: see
    /// [`McpServer::serve_http`](crate::mcp::McpServer::serve_http)).
    #[must_use]
    pub fn with_limits(mut self, limits: &HttpLimits) -> Self {
        self.body_timeout = limits.body_read_timeout;
        self.requests = Arc::new(Semaphore::new(limits.max_concurrent_requests));
        self
    }

    /// Answers one HTTP request.
    pub async fn handle<B>(&self, mut request: Request<B>) -> HttpResponse
    where
        B: Body + Send + 'static,
        B::Data: Send,
        B::Error: fmt::Display,
    {
        // Who asks comes first: an unauthenticated client learns nothing
        // else about the server, not even its Host and Origin rules.
        if let Some(auth) = &self.auth {
            match authenticate(auth.as_ref(), request.headers()) {
                Ok(principal) => {
                    request.extensions_mut().insert(principal);
                }
                Err(e) => return unauthorized(&e),
            }
        }
        let Ok(permit) = Arc::clone(&self.requests).try_acquire_owned() else {
            return busy();
        };
        let response = self.answer(request).await;
        // The slot is held until the answer has been sent in full: an SSE
        // answer is where a tool call does its work.
        let (parts, body) = response.into_parts();
        Response::from_parts(parts, Guarded { body, _permit: permit }.boxed())
    }

    async fn answer<B>(&self, request: Request<B>) -> HttpResponse
    where
        B: Body + Send + 'static,
        B::Data: Send,
        B::Error: fmt::Display,
    {
        if request.method() != Method::POST || !is_json(request.headers()) {
            return self.inner.handle(request).await;
        }
        let (mut parts, body) = request.into_parts();
        let collected = tokio::time::timeout(self.body_timeout, collect(body, self.limit)).await;
        let inspected = match collected {
            Ok(Collected::Whole(bytes)) => inspect(&bytes, self.limit),
            Ok(Collected::TooLarge(prefix)) => too_large(&prefix, self.limit),
            Ok(Collected::Failed(e)) => {
                return plain(
                    StatusCode::INTERNAL_SERVER_ERROR,
                    format!("Failed to read request body: {e}"),
                );
            }
            Err(_) => {
                let mut response = plain(
                    StatusCode::REQUEST_TIMEOUT,
                    format!(
                        "Request Timeout: the body did not arrive within {:?}",
                        self.body_timeout
                    ),
                );
                // The rest of the body may still be on its way: the
                // connection cannot carry another request.
                response
                    .headers_mut()
                    .insert(header::CONNECTION, HeaderValue::from_static("close"));
                return response;
            }
        };
        let answer = match inspected {
            Inspected::Forward(message) => {
                if parts.headers.contains_key(header::CONTENT_LENGTH) {
                    parts.headers.insert(header::CONTENT_LENGTH, HeaderValue::from(message.len()));
                }
                let request = Request::from_parts(parts, Full::new(Bytes::from(message)));
                return self.inner.handle(request).await;
            }
            Inspected::Answer(answer) => answer,
        };
        if let Some(refused) = self.refusal(&parts).await {
            return refused;
        }
        log(&answer);
        let status = http_status(&answer);
        let body = answer.reply.unwrap_or_else(|| answer.problem.reply(&Value::Null));
        Response::builder()
            .status(status)
            .header(header::CONTENT_TYPE, "application/json")
            .body(Full::new(Bytes::from(body)).boxed())
            .expect("a valid response")
    }

    /// rmcp's own refusal of the request's `Host` or `Origin`, if any: it
    /// checks them before it looks at the method, and answers a method it
    /// does not serve with `405` and nothing else.
    async fn refusal(&self, parts: &hyper::http::request::Parts) -> Option<HttpResponse> {
        let mut probe = Request::new(Full::<Bytes>::default());
        *probe.method_mut() = Method::PATCH;
        probe.uri_mut().clone_from(&parts.uri);
        probe.headers_mut().clone_from(&parts.headers);
        let response = self.inner.handle(probe).await;
        (response.status() != StatusCode::METHOD_NOT_ALLOWED).then_some(response)
    }
}

impl<B, S, M> tower_service::Service<Request<B>> for HttpService<S, M>
where
    B: Body + Send + 'static,
    B::Data: Send,
    B::Error: fmt::Display,
    S: ServerHandler + Send + 'static,
    M: SessionManager,
{
    type Response = HttpResponse;
    type Error = Infallible;
    type Future = Pin<Box<dyn Future<Output = Result<HttpResponse, Infallible>> + Send>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: Request<B>) -> Self::Future {
        let service = self.clone();
        Box::pin(async move { Ok(service.handle(request).await) })
    }
}

fn http_status(answer: &Answer) -> StatusCode {
    match answer.problem {
        WireError::TooLarge { .. } => StatusCode::PAYLOAD_TOO_LARGE,
        _ if answer.reply.is_none() => StatusCode::BAD_REQUEST,
        WireError::InvalidParams(_) | WireError::DuplicateArgument { .. } => StatusCode::OK,
        _ => StatusCode::BAD_REQUEST,
    }
}

fn is_json(headers: &hyper::HeaderMap) -> bool {
    headers.get(header::CONTENT_TYPE).and_then(|value| value.to_str().ok()).is_some_and(|value| {
        let essence = value.split_once(';').map_or(value, |(essence, _)| essence);
        essence.trim().eq_ignore_ascii_case("application/json")
    })
}

/// The answer past the cap on concurrent requests.
fn busy() -> HttpResponse {
    let mut response = plain(
        StatusCode::SERVICE_UNAVAILABLE,
        "Service Unavailable: too many requests at once; try again".to_owned(),
    );
    response.headers_mut().insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
    response
}

/// A response body that holds a slot of the concurrency cap until it is
/// dropped (sent in full, or abandoned with its connection).
struct Guarded {
    body: BoxBody<Bytes, Infallible>,
    _permit: tokio::sync::OwnedSemaphorePermit,
}

impl Body for Guarded {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<hyper::body::Frame<Bytes>, Infallible>>> {
        Pin::new(&mut self.body).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> hyper::body::SizeHint {
        self.body.size_hint()
    }
}

fn plain(status: StatusCode, text: String) -> HttpResponse {
    Response::builder()
        .status(status)
        .body(Full::new(Bytes::from(text)).boxed())
        .expect("a valid response")
}

enum Collected {
    Whole(Vec<u8>),
    /// The body is over the limit: its first `limit` bytes (the rest is not
    /// read).
    TooLarge(Vec<u8>),
    Failed(String),
}

async fn collect<B>(body: B, limit: usize) -> Collected
where
    B: Body,
    B::Error: fmt::Display,
{
    let mut body = std::pin::pin!(body);
    let mut bytes = Vec::new();
    while let Some(frame) = body.frame().await {
        let frame = match frame {
            Ok(frame) => frame,
            Err(e) => return Collected::Failed(e.to_string()),
        };
        let Ok(mut data) = frame.into_data() else { continue };
        let room = limit - bytes.len();
        let over = data.remaining() > room;
        while data.has_remaining() && bytes.len() < limit {
            let chunk = data.chunk();
            let take = chunk.len().min(limit - bytes.len());
            bytes.extend_from_slice(&chunk[..take]);
            data.advance(take);
        }
        if over {
            return Collected::TooLarge(bytes);
        }
    }
    Collected::Whole(bytes)
}
