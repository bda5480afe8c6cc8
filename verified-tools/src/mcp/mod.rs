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
//! A client that gives each tool call an id sends it in the request's
//! `_meta` under [`TOOL_CALL_ID_META`] (`"verified-tools/tool_call_id"`):
//! the same id is the same logical call, so re-sending a call whose answer
//! was lost replays or verifies it, and never executes it twice. Without an
//! id, calls are keyed by the set's context: by default, the same tool with
//! the same arguments within the same five-minute bucket is the same call.
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

use rmcp::model::{
    CallToolRequestParams, CallToolResponse, CallToolResult, Implementation, ListToolsResult,
    PaginatedRequestParams, ServerCapabilities, ServerConfig, Tool,
};
use rmcp::service::RequestContext;
use rmcp::transport::StreamableHttpService;
use rmcp::transport::streamable_http_server::StreamableHttpServerConfig;
use rmcp::transport::streamable_http_server::session::local::LocalSessionManager;
use rmcp::{ErrorData, RoleServer, ServerHandler, ServiceExt as _};
use serde_json::Value;

#[cfg(doc)]
use crate::toolset::mcp_annotations;
use crate::toolset::{ToolOutcome, ToolSet};

pub use rmcp;

/// The `_meta` key of a `tools/call` request that carries the client's id
/// of the tool call: the identity of the logical call (its key scope).
pub const TOOL_CALL_ID_META: &str = "verified-tools/tool_call_id";

/// What the server tells the model about its tools (MCP's
/// `instructions`).
pub const INSTRUCTIONS: &str = "Every tool result has a `status`; anything but `success` comes \
     with an `instruction`: follow it. Never make a new call for a result whose status is \
     `unknown` or `escalated`: it may already have happened. To re-send the same call (after a \
     lost answer), give it the same `_meta` \"verified-tools/tool_call_id\": it is checked \
     first, never executed twice.";

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
}

impl<S> Clone for McpServer<S> {
    fn clone(&self) -> Self {
        Self {
            set: Arc::clone(&self.set),
            info: self.info.clone(),
            instructions: self.instructions.clone(),
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
        Self {
            set,
            info: Implementation::new("verified-tools", env!("CARGO_PKG_VERSION")),
            instructions: Cow::Borrowed(INSTRUCTIONS),
        }
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
    /// error.
    pub async fn call(&self, request: CallToolRequestParams) -> Result<CallToolResult, ErrorData> {
        let name = request.name.as_ref();
        if self.set.get(name).is_none() {
            let outcome = ToolOutcome::no_such_tool(name, self.set.names());
            let message = format!(
                "{}. {}",
                outcome.error.as_deref().unwrap_or_default(),
                outcome.instruction.as_deref().unwrap_or_default()
            );
            return Err(ErrorData::invalid_params(message, Some(to_json(&outcome))));
        }
        let arguments = Value::Object(request.arguments.clone().unwrap_or_default());
        let id = request
            .meta
            .as_ref()
            .and_then(|meta| meta.get(TOOL_CALL_ID_META))
            .and_then(Value::as_str)
            .filter(|id| !id.is_empty());
        let outcome = match id {
            Some(id) => self.set.call(name, &arguments, id).await,
            None => self.set.call_in(self.set.context(), name, &arguments).await,
        };
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
        let running = self.serve(rmcp::transport::stdio()).await.map_err(std::io::Error::other)?;
        running.waiting().await.map_err(std::io::Error::other)?;
        Ok(())
    }

    /// The streamable HTTP endpoint as a tower service (one session per
    /// client, kept in memory), to mount under a path of an axum or hyper
    /// server. Accepts `localhost` hosts only (DNS rebinding protection); see
    /// rmcp's `StreamableHttpServerConfig`.
    pub fn http_service(self) -> StreamableHttpService<Self, LocalSessionManager> {
        StreamableHttpService::new(
            move || Ok(self.clone()),
            Arc::new(LocalSessionManager::default()),
            StreamableHttpServerConfig::default(),
        )
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

fn to_json(outcome: &ToolOutcome) -> Value {
    serde_json::to_value(outcome).expect("an outcome is JSON")
}

impl<S: Send + Sync + 'static> ServerHandler for McpServer<S> {
    fn get_info(&self) -> ServerConfig {
        ServerConfig::new(ServerCapabilities::builder().enable_tools().build())
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
        _context: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, ErrorData> {
        self.call(request).await.map(CallToolResponse::from)
    }
}
