//! Serving a [`ToolSet`] over the Model Context Protocol (feature `mcp`),
//! with [rmcp](https://docs.rs/rmcp), the official Rust SDK: over stdio (what
//! desktop hosts launch) or streamable HTTP.
//!
//! `tools/list` lists every tool of the set with its `inputSchema`, its
//! `outputSchema` when the value type has one, and the annotations that
//! follow from its side-effect class, effect kind and effect identity
//! ([`mcp_annotations`]). `tools/call`
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
//! | nothing | the tool and its arguments, within this session, for one bucket (5 minutes, or the tool's `bucket`) | within the bucket: the same call (a cancel-and-re-send waits for an attempt still out and gets its outcome, or checks first: see [long calls](#long-calls-progress-and-cancellation)); later, or from another session: a new call |
//!
//! An identity in `_meta` that is not a non-empty string of at most 255
//! bytes is refused (`-32602`), not ignored: keyed by the window instead, a
//! repeat after it would be done again.
//!
//! Two sessions never share a call unless a business key or an
//! idempotency key says so. A replayed outcome says it was replayed
//! (`proof: "ledger"` and an instruction saying how to do it again on
//! purpose: a new `idempotencyKey`), never a silent success. The server
//! advertises the key under the experimental capability
//! [`IDEMPOTENCY_CAPABILITY`] (rmcp's `tools` capability has no room for
//! SEP-3182's `tools.idempotency`).
//!
//! # Long calls: progress and cancellation
//!
//! A `tools/call` whose `_meta` has a `progressToken` gets
//! `notifications/progress` (strictly increasing `progress`, no `total`)
//! each time the call waits, with a `message` in plain words: "attempt 1
//! timed out (no answer within 5000 ms); checking whether it took effect
//! before retrying", "attempt 1 is not visible yet; waiting for its settle
//! margin ...", "another request of this same call is in flight; waiting
//! for its outcome ...", "retrying: attempt 2 sent". All of them are
//! written before the answer, none after.
//!
//! `notifications/cancelled` is the engine's cancellation, taken where no
//! attempt is out: an attempt already sent runs to its answer (and its
//! verifier reads, which send nothing), then the call is dropped at the
//! point it would send the next attempt. Nothing is sent under the key
//! after a cancel; the key stays in doubt (not lost), and the next call
//! with it, such as the SDK's re-send, checks before it sends, or waits
//! for the attempt still out and gets its outcome. Without a ledger a
//! cancelled call runs to its end (nothing would keep its doubt).
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
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{SystemTime, UNIX_EPOCH};

use rmcp::model::{
    CallToolRequestParams, CallToolResponse, CallToolResult, ExperimentalCapabilities,
    Implementation, InitializeRequestParams, InitializeResult, ListToolsResult,
    PaginatedRequestParams, RequestMetaObject, ServerCapabilities, ServerConfig, Tool,
};
use rmcp::service::RequestContext;
use rmcp::{ErrorData, RoleServer, ServerHandler};
use serde_json::Value;

use crate::toolset::{CHECK_TOOL, ToolSet};
#[cfg(doc)]
use crate::toolset::{ToolOutcome, mcp_annotations};

pub use http::{Authenticate, BearerToken, HttpLimits, Principal};
pub use rmcp;
pub use wire::{
    DEFAULT_MAX_MESSAGE_BYTES, HttpResponse, HttpService, IDEMPOTENCY_KEY_META, serve_lines,
};

mod call;
mod http;
mod long_call;
mod serve;
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
    /// The authenticated principal an HTTP session was opened by: its
    /// first call binds it, and a request of another principal in the same
    /// session is refused (a session id is no credential).
    bound: Arc<OnceLock<Principal>>,
    http: HttpSettings,
}

/// What the streamable HTTP endpoint checks, beyond rmcp's defaults.
#[derive(Clone)]
struct HttpSettings {
    allowed_origins: Arc<[String]>,
    allowed_hosts: Option<Arc<[String]>>,
    auth: Option<Arc<dyn Authenticate>>,
    limits: HttpLimits,
}

impl Default for HttpSettings {
    fn default() -> Self {
        Self {
            allowed_origins: DEFAULT_ALLOWED_ORIGINS.iter().map(|&o| o.to_owned()).collect(),
            allowed_hosts: None,
            auth: None,
            limits: HttpLimits::default(),
        }
    }
}

/// The origins a streamable HTTP server accepts unless told otherwise
/// ([`McpServer::with_allowed_origins`]): pages served from this machine,
/// on any port. A request without `Origin` (not from a browser) is always
/// accepted; `Origin: null` (a sandboxed page, a file) matches none of
/// these.
pub const DEFAULT_ALLOWED_ORIGINS: [&str; 3] =
    ["http://localhost:*", "http://127.0.0.1:*", "http://[::1]:*"];

impl<S> Clone for McpServer<S> {
    /// A handle on the same session.
    fn clone(&self) -> Self {
        Self {
            set: Arc::clone(&self.set),
            info: self.info.clone(),
            instructions: self.instructions.clone(),
            session: Arc::clone(&self.session),
            principal: Arc::clone(&self.principal),
            bound: Arc::clone(&self.bound),
            http: self.http.clone(),
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
            bound: Arc::default(),
            http: HttpSettings::default(),
        }
    }

    /// A server of the same set in a session of its own: what each HTTP
    /// session gets (stdio serves one session per process).
    #[must_use]
    pub fn new_session(&self) -> Self {
        Self { session: new_session(), bound: Arc::default(), ..self.clone() }
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

    /// Sets the browser origins the streamable HTTP endpoint accepts
    /// (DNS rebinding and cross-site protection, which MCP requires of
    /// it), in place of [`DEFAULT_ALLOWED_ORIGINS`]: `scheme://host:port`,
    /// `scheme://host:*` for any port, or `null`. A request whose `Origin`
    /// is not listed is refused with `403 Forbidden`; a request without
    /// `Origin` is accepted (non-browser clients send none). An empty list
    /// refuses every request that has an `Origin`.
    #[must_use]
    pub fn with_allowed_origins(
        mut self,
        origins: impl IntoIterator<Item = impl Into<String>>,
    ) -> Self {
        self.http.allowed_origins = origins.into_iter().map(Into::into).collect();
        self
    }

    /// Sets the `Host` values the streamable HTTP endpoint accepts (`host`
    /// or `host:port`), in place of rmcp's loopback names (`localhost`,
    /// `127.0.0.1`, `::1`): a server reached under another name must list
    /// it. Others are refused with `403 Forbidden`.
    #[must_use]
    pub fn with_allowed_hosts(
        mut self,
        hosts: impl IntoIterator<Item = impl Into<String>>,
    ) -> Self {
        self.http.allowed_hosts = Some(hosts.into_iter().map(Into::into).collect());
        self
    }

    /// Requires a bearer token on every streamable HTTP request, checked by
    /// `auth` (a [`BearerToken`], or a closure `Fn(&str) ->
    /// Option<Principal>`) before anything else: `401 Unauthorized` with a
    /// `WWW-Authenticate: Bearer` challenge when it is missing or refused.
    /// The [`Principal`] it yields is the principal of the request's calls
    /// (in place of [`with_principal`](Self::with_principal)'s), and the
    /// HTTP session is bound to it: a request of another principal under
    /// the same session id is refused. Stdio needs none: whoever launched
    /// the process is its client.
    #[must_use]
    pub fn with_authenticator(mut self, auth: impl Authenticate) -> Self {
        self.http.auth = Some(Arc::new(auth));
        self
    }

    /// Sets the streamable HTTP endpoint's timeouts and caps (see
    /// [`HttpLimits`] for the defaults).
    #[must_use]
    pub fn with_http_limits(mut self, limits: HttpLimits) -> Self {
        self.http.limits = limits;
        self
    }

    /// Whether HTTP requests must be authenticated.
    pub fn authenticates(&self) -> bool {
        self.http.auth.is_some()
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
        self.call_as(request, meta, &self.principal, None).await
    }
}

/// The principal of a server that authenticates no one.
pub const ANONYMOUS: &str = "anonymous";

/// A session identity no other server process or session has had: the
/// process, a counter and the clock (keys derived within it land in a
/// ledger that may outlive the process).
fn new_session() -> Arc<str> {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let n = NEXT.fetch_add(1, Ordering::Relaxed);
    let nanos = SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_nanos());
    Arc::from(format!("mcp-{:x}-{nanos:x}-{n}", std::process::id()))
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

    async fn initialize(
        &self,
        request: InitializeRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<InitializeResult, ErrorData> {
        // The session is bound to whoever opens it, before another
        // principal could learn its id and call first.
        self.principal_of(&context)?;
        context.peer.set_peer_info(request.clone());
        self.negotiate_initialize(&request)
    }

    async fn list_tools(
        &self,
        _request: Option<PaginatedRequestParams>,
        context: RequestContext<RoleServer>,
    ) -> Result<ListToolsResult, ErrorData> {
        self.principal_of(&context)?;
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
        let principal = self.principal_of(&context)?;
        // rmcp moves the params' `_meta` into the request context.
        self.call_as(request, &context.meta, &principal, Some(&context))
            .await
            .map(CallToolResponse::from)
    }
}
