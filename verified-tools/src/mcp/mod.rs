//! Serving a [`ToolSet`] over the Model Context Protocol (feature `mcp`),
//! with [rmcp](https://docs.rs/rmcp), the official Rust SDK: over stdio (what
//! desktop hosts launch) or streamable HTTP.
//!
//! `tools/list` lists every tool of the set with its `inputSchema`, its
//! `outputSchema` when the value type has one, and the annotations that
//! follow from its side-effect class ([`mcp_annotations`]). `tools/call`
//! answers with the [`ToolOutcome`] as `structuredContent` (and as JSON
//! text in `content`, for clients that read only text), and `isError: true`
//! for every outcome but a success: an effect in doubt is never shown as a
//! success. An unknown tool name is a protocol error (`-32602`), as MCP
//! asks; arguments that do not fit are a tool error the model can correct.
//!
//! # The identity of a call
//!
//! MCP puts no id on `tools/call`, and a client that times out re-sends
//! the call as a new JSON-RPC request (the Python SDK: `tools/call` id 4,
//! `notifications/cancelled` for 4, `tools/call` id 5). The server decides
//! which logical call a request is, first match wins:
//!
//! | the request carries | the call's identity | a repeat is |
//! |---|---|---|
//! | a tool that declares its effect identity (`key(order)`) | the business action, whoever asks | replayed, or verified first: never done twice |
//! | `idempotencyKey` in the params (SEP-3182) | that key, for this principal | the same call exactly when the key is the same; other arguments under it are refused |
//! | `_meta` [`TOOL_CALL_ID_META`] (`"verified-tools/tool_call_id"`) | that id, for this principal | likewise |
//! | nothing | the tool and its arguments, within this session, for one bucket (5 minutes, or the tool's `bucket`) | within the bucket: the same call (a cancel-and-re-send waits for the first and gets its outcome); later, or from another session: a new call |
//!
//! Two sessions never share a call unless a business key or an
//! idempotency key says so. A replayed outcome says it was replayed
//! (`proof: "ledger"` and an instruction saying how to do it again on
//! purpose: a new `idempotencyKey`), never a silent success. The server
//! advertises the key under the experimental capability
//! [`IDEMPOTENCY_CAPABILITY`] (rmcp's `tools` capability has no room for
//! SEP-3182's `tools.idempotency`).
//!
//! ```no_run
//! use verified_tools::mcp::McpServer;
//! use verified_tools::toolset::ToolSet;
//! # struct Crm;
//! # async fn run() -> std::io::Result<()> {
//! let tools = ToolSet::new(Crm) /* .with(create_customer_tool()) ... */;
//! // Over stdio, until the client closes it:
//! McpServer::new(tools).serve_stdio().await
//! # }
//! ```

use std::borrow::Cow;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use rmcp::model::{
    CallToolRequestParams, CallToolResponse, CallToolResult, ExperimentalCapabilities,
    Implementation, ListToolsResult, PaginatedRequestParams, RequestMetaObject, ServerCapabilities,
    ServerConfig, Tool,
};
use rmcp::service::RequestContext;
use rmcp::transport::StreamableHttpService;
use rmcp::transport::streamable_http_server::StreamableHttpServerConfig;
use rmcp::transport::streamable_http_server::session::local::LocalSessionManager;
use rmcp::{ErrorData, RoleServer, ServerHandler};
use serde_json::Value;

use crate::KeyScope;
#[cfg(doc)]
use crate::toolset::mcp_annotations;
use crate::toolset::{CHECK_TOOL, ToolOutcome, ToolSet};

pub use rmcp;
pub use wire::{
    DEFAULT_MAX_MESSAGE_BYTES, HttpResponse, HttpService, IDEMPOTENCY_KEY_META, serve_lines,
};

mod wire;

/// The `_meta` key of a `tools/call` request that carries the client's id
/// of the tool call: the identity of the logical call (its key scope).
pub const TOOL_CALL_ID_META: &str = "verified-tools/tool_call_id";

/// What the instructions add when the set lists [`CHECK_TOOL`].
pub const CHECK_INSTRUCTIONS: &str = "To learn what became of a call whose result was \
     `unknown`, `escalated` or `not_applied`, call `check_call` with its `key`: it does nothing \
     again.";

/// The experimental capability the server advertises for SEP-3182
/// idempotency keys on `tools/call`.
pub const IDEMPOTENCY_CAPABILITY: &str = "idempotency";

/// What the server tells the model about its tools (MCP's
/// `instructions`). It asks only for what a model can do: read the
/// outcome, and re-send the same call rather than a new one.
pub const INSTRUCTIONS: &str = "Every tool result has a `status`; anything but `success` comes \
     with an `instruction`: follow it. Never make a new call for a result whose status is \
     `unknown` or `escalated`: it may already have happened. If an answer was lost, send the \
     same call again, with the same arguments: the server recognises it, checks it first, and \
     never executes it twice. A result with `proof: \"ledger\"` was replayed: nothing was done \
     again.";

/// An MCP server over a [`ToolSet`]: an rmcp [`ServerHandler`].
///
/// Serve it with [`serve_stdio`](Self::serve_stdio),
/// [`serve_http`](Self::serve_http), [`http_service`](Self::http_service)
/// (a tower service to mount in an axum or hyper server), or any rmcp
/// transport (`rmcp::ServiceExt::serve`).
pub struct McpServer<S> {
    set: Arc<ToolSet<S>>,
    info: Implementation,
    instructions: Cow<'static, str>,
    /// This server's session: calls without an id are keyed within it.
    session: Arc<str>,
    /// Who the client is: calls with an id are keyed for it.
    principal: Arc<str>,
}

impl<S> Clone for McpServer<S> {
    /// A handle on the same session.
    fn clone(&self) -> Self {
        Self {
            set: Arc::clone(&self.set),
            info: self.info.clone(),
            instructions: self.instructions.clone(),
            session: Arc::clone(&self.session),
            principal: Arc::clone(&self.principal),
        }
    }
}

impl<S> std::fmt::Debug for McpServer<S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("McpServer")
            .field("set", &self.set)
            .field("name", &self.info.name)
            .finish_non_exhaustive()
    }
}

impl<S: Send + Sync + 'static> McpServer<S> {
    /// A server of `set`, named `verified-tools`.
    pub fn new(set: ToolSet<S>) -> Self {
        Self::shared(Arc::new(set))
    }

    /// A server of a set shared with other servers (stdio and HTTP at once,
    /// or one per HTTP session).
    pub fn shared(set: Arc<ToolSet<S>>) -> Self {
        let instructions = match set.lists(CHECK_TOOL) {
            true => Cow::Owned(format!("{INSTRUCTIONS} {CHECK_INSTRUCTIONS}")),
            false => Cow::Borrowed(INSTRUCTIONS),
        };
        Self {
            set,
            info: Implementation::new("verified-tools", env!("CARGO_PKG_VERSION")),
            instructions,
            session: new_session(),
            principal: Arc::from(ANONYMOUS),
        }
    }

    /// A server of the same set in a session of its own: what each HTTP
    /// session gets (stdio serves one session per process).
    #[must_use]
    pub fn new_session(&self) -> Self {
        Self { session: new_session(), ..self.clone() }
    }

    /// The session calls without an id are keyed within.
    pub fn session(&self) -> &str {
        &self.session
    }

    /// Sets who the client is (an authenticated principal): calls with an
    /// `idempotencyKey` or a tool-call id are keyed for it, so two
    /// principals never share a call. [`ANONYMOUS`] by default.
    #[must_use]
    pub fn with_principal(mut self, principal: impl Into<Arc<str>>) -> Self {
        self.principal = principal.into();
        self
    }

    /// Sets the name and version the server gives in `initialize`.
    #[must_use]
    pub fn with_name(mut self, name: impl Into<String>, version: impl Into<String>) -> Self {
        self.info = Implementation::new(name, version);
        self
    }

    /// Replaces the [`INSTRUCTIONS`] given to the model.
    #[must_use]
    pub fn with_instructions(mut self, instructions: impl Into<String>) -> Self {
        self.instructions = Cow::Owned(instructions.into());
        self
    }

    /// The tool set.
    pub fn tool_set(&self) -> &ToolSet<S> {
        &self.set
    }

    /// The tools, as `tools/list` answers them.
    pub fn tools(&self) -> Vec<Tool> {
        let Value::Array(tools) = self.set.mcp_tools() else { return Vec::new() };
        tools
            .into_iter()
            .map(|tool| serde_json::from_value(tool).expect("an MCP tool is an rmcp `Tool`"))
            .collect()
    }

    /// Answers one `tools/call`: the outcome as `structuredContent` and as
    /// text, `isError` unless it is a success; an unknown tool is a protocol
    /// error. The call's identity is read from `request.meta` (see [the
    /// module docs](self#the-identity-of-a-call)); [`ServerHandler::call_tool`]
    /// reads it where rmcp delivers it, the request context.
    pub async fn call(&self, request: CallToolRequestParams) -> Result<CallToolResult, ErrorData> {
        let meta = request.meta.clone().unwrap_or_default();
        self.call_with(request, &meta).await
    }

    async fn call_with(
        &self,
        request: CallToolRequestParams,
        meta: &RequestMetaObject,
    ) -> Result<CallToolResult, ErrorData> {
        let name = request.name.as_ref();
        if !self.set.lists(name) {
            let outcome = ToolOutcome::no_such_tool(name, self.set.names());
            let message = format!(
                "{}. {}",
                outcome.error.as_deref().unwrap_or_default(),
                outcome.instruction.as_deref().unwrap_or_default()
            );
            return Err(ErrorData::invalid_params(message, Some(to_json(&outcome))));
        }
        let window = self.set.get(name).and_then(|t| t.spec().bucket);
        let scope = scope(
            meta_str(meta, IDEMPOTENCY_KEY_META),
            meta_str(meta, TOOL_CALL_ID_META),
            &self.principal,
            &self.session,
            window.unwrap_or(DEFAULT_WINDOW),
        );
        let arguments = Value::Object(request.arguments.unwrap_or_default());
        let cx = self.set.context().clone().with_scope(scope);
        let outcome = self.set.call_in(&cx, name, &arguments).await;
        let structured = to_json(&outcome);
        Ok(if outcome.is_success() {
            CallToolResult::structured(structured)
        } else {
            CallToolResult::structured_error(structured)
        })
    }

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
    /// POST answered, SEP-3182 keys delivered). Accepts `localhost` hosts
    /// only (DNS rebinding protection); see rmcp's
    /// `StreamableHttpServerConfig`.
    pub fn http_service(self) -> HttpService<Self, LocalSessionManager> {
        // rmcp asks the factory once per session (at `initialize`): each
        // HTTP session gets a session identity of its own.
        HttpService::new(StreamableHttpService::new(
            move || Ok(self.new_session()),
            Arc::new(LocalSessionManager::default()),
            StreamableHttpServerConfig::default(),
        ))
    }

    /// Serves streamable HTTP on `listener` (HTTP/1.1, every path; clients
    /// conventionally use `http://HOST:PORT/mcp`), until the task is
    /// dropped.
    ///
    /// # Errors
    ///
    /// When accepting a connection fails.
    pub async fn serve_http(self, listener: tokio::net::TcpListener) -> std::io::Result<()> {
        let service = self.http_service();
        loop {
            let (stream, _) = listener.accept().await?;
            let service = hyper_util::service::TowerToHyperService::new(service.clone());
            tokio::spawn(async move {
                // A client that goes away mid-request is its own business.
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(hyper_util::rt::TokioIo::new(stream), service)
                    .await;
            });
        }
    }
}

/// The principal of a server that authenticates no one.
pub const ANONYMOUS: &str = "anonymous";

/// The window of a call without an id, when the tool sets no `bucket`.
const DEFAULT_WINDOW: Duration = Duration::from_secs(300);

/// The key scope of one `tools/call`: the client's idempotency key, else
/// its tool-call id (both for the principal), else the session's window.
/// A tool's declared effect identity overrides all three in the engine.
fn scope(
    idempotency_key: Option<&str>,
    tool_call_id: Option<&str>,
    principal: &str,
    session: &str,
    window: Duration,
) -> KeyScope {
    match (idempotency_key, tool_call_id) {
        (Some(key), _) => KeyScope::ToolCall(format!("{principal}/idempotency-key/{key}")),
        (None, Some(id)) => KeyScope::ToolCall(format!("{principal}/tool-call/{id}")),
        (None, None) => KeyScope::window(session, window),
    }
}

fn meta_str<'m>(meta: &'m RequestMetaObject, key: &str) -> Option<&'m str> {
    meta.get(key).and_then(Value::as_str).filter(|s| !s.is_empty())
}

/// A session identity no other server process or session has had: the
/// process, a counter and the clock (keys derived within it land in a
/// ledger that may outlive the process).
fn new_session() -> Arc<str> {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let n = NEXT.fetch_add(1, Ordering::Relaxed);
    let nanos = SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_nanos());
    Arc::from(format!("mcp-{:x}-{nanos:x}-{n}", std::process::id()))
}

fn to_json(outcome: &ToolOutcome) -> Value {
    serde_json::to_value(outcome).expect("an outcome is JSON")
}

impl<S: Send + Sync + 'static> ServerHandler for McpServer<S> {
    fn get_info(&self) -> ServerConfig {
        let mut experimental = ExperimentalCapabilities::new();
        experimental.insert(IDEMPOTENCY_CAPABILITY.to_owned(), serde_json::Map::new());
        let capabilities = ServerCapabilities::builder()
            .enable_tools()
            .enable_experimental_with(experimental)
            .build();
        ServerConfig::new(capabilities)
            .with_server_info(self.info.clone())
            .with_instructions(self.instructions.clone())
    }

    async fn list_tools(
        &self,
        _request: Option<PaginatedRequestParams>,
        _context: RequestContext<RoleServer>,
    ) -> Result<ListToolsResult, ErrorData> {
        Ok(ListToolsResult::with_all_items(self.tools()))
    }

    fn get_tool(&self, name: &str) -> Option<Tool> {
        self.tools().into_iter().find(|t| t.name == name)
    }

    async fn call_tool(
        &self,
        request: CallToolRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, ErrorData> {
        // rmcp moves the params' `_meta` into the request context.
        self.call_with(request, &context.meta).await.map(CallToolResponse::from)
    }
}
