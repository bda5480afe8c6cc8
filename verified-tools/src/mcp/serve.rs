//! The transports a server is served over: stdio, and streamable HTTP as
//! a tower service or on a listener. Apart because none of them changes
//! what a call does, only how its messages travel.

use std::sync::Arc;

use rmcp::ServerHandler;
use rmcp::transport::StreamableHttpService;
use rmcp::transport::streamable_http_server::StreamableHttpServerConfig;
use rmcp::transport::streamable_http_server::session::local::LocalSessionManager;

#[cfg(doc)]
use super::{DEFAULT_ALLOWED_ORIGINS, HttpLimits};
use super::{DEFAULT_MAX_MESSAGE_BYTES, HttpService, McpServer, http, serve_lines};

impl<S: Send + Sync + 'static> McpServer<S> {
    /// Serves one client over this process's stdin and stdout, until the
    /// client closes them.
    ///
    /// # Errors
    ///
    /// When the MCP handshake fails, or the serving task panics.
    pub async fn serve_stdio(self) -> std::io::Result<()> {
        // Through the wire layer: every line gets an answer, and a
        // SEP-3182 `idempotencyKey` reaches the handler.
        let (input, output) = (tokio::io::stdin(), tokio::io::stdout());
        serve_lines(self, input, output, DEFAULT_MAX_MESSAGE_BYTES).await.map(drop)
    }

    /// The streamable HTTP endpoint as a tower service (one session per
    /// client, kept in memory), to mount under a path of an axum or hyper
    /// server: rmcp's service behind the wire layer ([`HttpService`]: every
    /// POST answered, SEP-3182 keys delivered), with this server's
    /// authentication, body timeout and cap on concurrent requests. Accepts
    /// the `Host`s of [`with_allowed_hosts`](Self::with_allowed_hosts)
    /// (loopback names by default) and the `Origin`s of
    /// [`with_allowed_origins`](Self::with_allowed_origins)
    /// ([`DEFAULT_ALLOWED_ORIGINS`]), `403` otherwise. The header and idle
    /// timeouts and the connection caps are the accept loop's: mounted in
    /// another server, set them there.
    pub fn http_service(self) -> HttpService<Self, LocalSessionManager> {
        // rmcp asks the factory once per session (at `initialize`): each
        // HTTP session gets a session identity of its own.
        let server = self.clone();
        self.http_service_of(move || server.new_session())
    }

    /// [`http_service`](Self::http_service) for another handler (one that
    /// wraps this server, adding what a tool set does not do), made by
    /// `factory` once per session, under this server's HTTP settings:
    /// origins, hosts, authentication, limits.
    pub fn http_service_of<H, F>(&self, factory: F) -> HttpService<H, LocalSessionManager>
    where
        H: ServerHandler + Send + 'static,
        F: Fn() -> H + Send + Sync + 'static,
    {
        let http = self.http.clone();
        let mut config = StreamableHttpServerConfig::default()
            .with_allowed_origins(http.allowed_origins.iter().cloned())
            // An empty list means "no browser origin", not "no check".
            .enforce_origin_validation();
        if let Some(hosts) = &http.allowed_hosts {
            config = config.with_allowed_hosts(hosts.iter().cloned());
        }
        let service = HttpService::new(StreamableHttpService::new(
            move || Ok(factory()),
            Arc::new(LocalSessionManager::default()),
            config,
        ))
        .with_limits(&http.limits);
        match http.auth {
            Some(auth) => service.with_authenticator(auth),
            None => service,
        }
    }

    /// Serves streamable HTTP on `listener` (HTTP/1.1, every path; clients
    /// conventionally use `http://HOST:PORT/mcp`), until the task is
    /// dropped, under this server's [`HttpLimits`]: a connection over a
    /// cap is closed at once, one whose request head is late or that
    /// stays idle past its timeout is closed.
    ///
    /// # Errors
    ///
    /// When accepting a connection fails for a reason other than the
    /// process's or the system's file limit (those are waited out).
    pub async fn serve_http(self, listener: tokio::net::TcpListener) -> std::io::Result<()> {
        let limits = self.http.limits;
        http::serve(listener, self.http_service(), limits).await
    }

    /// [`serve_http`](Self::serve_http) for another handler, as
    /// [`http_service_of`](Self::http_service_of) makes it.
    ///
    /// # Errors
    ///
    /// As [`serve_http`](Self::serve_http).
    pub async fn serve_http_of<H, F>(
        &self,
        listener: tokio::net::TcpListener,
        factory: F,
    ) -> std::io::Result<()>
    where
        H: ServerHandler + Send + 'static,
        F: Fn() -> H + Send + Sync + 'static,
    {
        http::serve(listener, self.http_service_of(factory), self.http.limits).await
    }
}
