//! The simulator's tools for a model, and an LLM planner that uses them.
//!
//! - [`tool_set`]: the [`ToolSet`] of the two tasks, which the MCP example
//!   serves and the planner hands to a model.
//! - [`run_episode`]: one episode of a task driven by a model behind an
//!   OpenAI-compatible chat-completions API (`POST {base_url}/chat/completions`
//!   with `tools`; a local Ollama, vLLM or llama.cpp server, or OpenAI
//!   itself through a TLS-terminating proxy), scored on the simulator's
//!   ground truth like the scripted agent's episodes.
//!
//! The model sees the tools as the tool set lists them and each call's
//! [`ToolOutcome`] as the `role: tool` message answering its
//! `tool_call_id`; the tool-call id is the identity of the logical call, so
//! a call the model (or a provider) repeats with the same id is replayed or
//! verified, never executed twice. A call that ends in doubt is re-issued
//! by the planner itself, with the same id, after a pause
//! ([`LlmConfig::reissues`]): a model cannot choose a tool-call id, so it is
//! only told not to repeat the call, and the re-issue verifies first.
//!
//! The HTTP client is a small HTTP/1.1 client over tokio, for `http://`
//! base URLs only: the local servers this is for speak plain HTTP, and a
//! full HTTP stack (hyper, rustls) would add a minute of compile time on two
//! cores to every build of the experiment.

use std::fmt;
use std::time::Duration;

use serde_json::{Value, json};
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use verified_tools::Context;
use verified_tools::sim::{SimConfig, SimServer, Task};
use verified_tools::toolset::{Status, ToolOutcome, ToolSet};

use crate::tools::{self, SimClient};

/// The nine tools of the two tasks (section 4.2) over one simulated server:
/// the six writes, the repair of a partial record and the two reads, each
/// listed with its JSON Schema, dispatched by name.
///
/// ```
/// use verified_tools::sim::{FaultProfile, SimConfig, SimServer};
/// use verified_tools_suite::llm::tool_set;
/// use verified_tools_suite::tools::SimClient;
///
/// # #[tokio::main(flavor = "current_thread")] async fn main() {
/// let (server, _oracle) = SimServer::new(SimConfig::new(42, FaultProfile::NONE));
/// let tools = tool_set(SimClient::new(server, true));
/// assert_eq!(tools.names().count(), 9);
/// assert_eq!(tools.openai_tools()[0]["function"]["name"], "create_customer");
/// # }
/// ```
pub fn tool_set(client: SimClient) -> ToolSet<SimClient> {
    ToolSet::new(client)
        .with(tools::create_customer_tool())
        .with(tools::set_customer_status_tool())
        .with(tools::send_welcome_tool())
        .with(tools::read_customer_tool())
        .with(tools::update_invoice_row_tool())
        .with(tools::create_record_tool())
        .with(tools::update_record_fields_tool())
        .with(tools::set_record_status_tool())
        .with(tools::read_record_tool())
}

/// How to reach the model and how long to let it work.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub struct LlmConfig {
    /// The API's base URL, up to the `/chat/completions` path:
    /// `http://localhost:11434/v1` (Ollama), `http://localhost:8000/v1`
    /// (vLLM), `http://localhost:8080/v1` (llama.cpp).
    pub base_url: String,
    /// The model's name, as the server knows it.
    pub model: String,
    /// Sent as `Authorization: Bearer ..` when set.
    pub api_key: Option<String>,
    /// Chat completions per episode at most; past it the episode ends
    /// without a claim of success.
    pub max_turns: u32,
    /// Sampling temperature (`None`: the server's default).
    pub temperature: Option<f64>,
    /// Limit of one HTTP exchange with the model (`None`: no limit).
    pub request_timeout: Option<Duration>,
    /// How many times a call that ended in doubt is re-issued, with its
    /// tool-call id, before its outcome goes to the model.
    pub reissues: u32,
    /// The pause before each re-issue: long enough for a lost request to
    /// land and a lagging replica to catch up.
    pub reissue_after: Duration,
}

impl LlmConfig {
    /// A model at `base_url`: 24 turns, temperature 0, 300 s per request,
    /// one re-issue of a call in doubt after 6 s.
    pub fn new(base_url: impl Into<String>, model: impl Into<String>) -> Self {
        Self {
            base_url: base_url.into(),
            model: model.into(),
            api_key: None,
            max_turns: 24,
            temperature: Some(0.0),
            request_timeout: Some(Duration::from_secs(300)),
            reissues: 1,
            reissue_after: Duration::from_secs(6),
        }
    }

    /// Sets the API key.
    #[must_use]
    pub fn with_api_key(mut self, key: impl Into<String>) -> Self {
        self.api_key = Some(key.into());
        self
    }

    /// Sets the turn budget.
    #[must_use]
    pub fn with_max_turns(mut self, turns: u32) -> Self {
        self.max_turns = turns;
        self
    }

    /// Sets the limit of one HTTP exchange.
    #[must_use]
    pub fn with_request_timeout(mut self, timeout: Option<Duration>) -> Self {
        self.request_timeout = timeout;
        self
    }

    /// Sets the re-issues of a call in doubt.
    #[must_use]
    pub fn with_reissues(mut self, times: u32, after: Duration) -> Self {
        self.reissues = times;
        self.reissue_after = after;
        self
    }
}

/// One tool call the model made, as the planner handled it.
#[derive(Debug, Clone, PartialEq)]
pub struct CallRecord {
    /// The tool-call id (the provider's, or `call_<turn>_<n>` when it gave
    /// none).
    pub id: String,
    /// The tool's name, as the model wrote it.
    pub name: String,
    /// The arguments, as the model wrote them.
    pub arguments: String,
    /// The outcome the model was given.
    pub outcome: ToolOutcome,
    /// Re-issues of the call after it ended in doubt.
    pub reissued: u32,
}

/// What one LLM-driven episode did, scored on ground truth.
#[derive(Debug, Clone, PartialEq)]
pub struct LlmEpisode {
    /// The model's final answer started with `SUCCESS`.
    pub claimed_success: bool,
    /// The task's postcondition holds in the ground truth.
    pub success: bool,
    /// Some effect was applied more than once.
    pub duplicate: bool,
    /// Chat completions requested.
    pub turns: u32,
    /// Every tool call, in order.
    pub calls: Vec<CallRecord>,
    /// Tool dispatches that reached the simulated server (all attempts).
    pub dispatches: u32,
    /// The model's final answer (`None` if the turns ran out).
    pub final_message: Option<String>,
}

impl fmt::Display for LlmEpisode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "claimed {}, truth {}, duplicate {}, {} turns, {} tool calls ({} dispatched)",
            self.claimed_success,
            self.success,
            self.duplicate,
            self.turns,
            self.calls.len(),
            self.dispatches
        )?;
        for call in &self.calls {
            write!(
                f,
                "\n  {} {}({}) -> {}",
                call.id, call.name, call.arguments, call.outcome.status
            )?;
            if call.reissued > 0 {
                write!(f, " after {} re-issue(s)", call.reissued)?;
            }
        }
        Ok(())
    }
}

/// Why an episode could not be run.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum LlmError {
    /// The base URL is not an `http://host[:port][/path]` URL.
    #[error(
        "cannot use base URL {0:?}: expected http://host[:port][/path] (https is not supported: use a local server, or a TLS-terminating proxy)"
    )]
    BaseUrl(String),
    /// The server could not be reached, or the exchange broke off.
    #[error("the model server at {url}: {source}")]
    Io {
        /// The URL requested.
        url: String,
        /// The I/O error.
        source: std::io::Error,
    },
    /// No answer within [`LlmConfig::request_timeout`].
    #[error("the model server at {0} did not answer in time")]
    Timeout(String),
    /// The server answered with an error status.
    #[error("the model server answered HTTP {status}: {body}")]
    Status {
        /// The HTTP status.
        status: u16,
        /// The answer's body (cut at 2,000 bytes).
        body: String,
    },
    /// The answer is not a chat completion.
    #[error("the model server's answer is not a chat completion: {0}")]
    Answer(String),
}

/// The system prompt: how to read tool results.
pub const SYSTEM_PROMPT: &str = "You are an operations agent for a CRM and a billing system. \
Use the tools to complete the task. Every tool result is JSON with a `status`. On `success`, \
`value` holds the record as it is now: use its `version` for the next write that asks for \
one. Any other status comes with an `instruction`: follow it. Never call a tool again for a \
result whose status is `unknown` or `escalated`: it may already have happened. When the task \
is complete, or cannot be completed, answer without calling a tool, starting with SUCCESS or \
FAILURE.";

/// The task as the model is given it.
pub fn task_prompt(task: &Task) -> String {
    match task {
        Task::ActivateCustomer(t) => format!(
            "Task activate_customer: create customer {}, set it ACTIVE (at its current \
             version), then send it exactly one welcome message.",
            t.customer.0
        ),
        Task::RecordInvoice(t) => format!(
            "Task record_invoice: write invoice {} with amount {} (in cents) into invoice row \
             {}; create record {} with the same invoice and amount; then set the record \
             RECORDED (at its current version).",
            t.invoice_id.0, t.amount, t.row.0, t.record.0
        ),
    }
}

/// Runs one episode of `task` against a simulated server configured as
/// `sim`, with the model at `config`: the conversation goes on until the
/// model answers without a tool call or the turns run out; then the ground
/// truth is read (after letting late arrivals land, for at most 30 s).
///
/// # Errors
///
/// When the model server cannot be reached or answers something that is
/// not a chat completion. A model that misuses the tools is not an error:
/// its mistakes are outcomes it is shown.
pub async fn run_episode(
    config: &LlmConfig,
    task: Task,
    sim: SimConfig,
) -> Result<LlmEpisode, LlmError> {
    let endpoint = Endpoint::parse(&config.base_url)?;
    let (server, oracle) = SimServer::new(sim);
    let tools = tool_set(SimClient::new(server, true)).with_context(Context::new("llm-agent"));
    let listed = tools.openai_tools();
    let mut messages = vec![
        json!({"role": "system", "content": SYSTEM_PROMPT}),
        json!({"role": "user", "content": task_prompt(&task)}),
    ];
    let mut calls = Vec::new();
    let mut turns = 0;
    let mut final_message = None;
    while turns < config.max_turns {
        turns += 1;
        let mut request = json!({
            "model": config.model,
            "messages": messages,
            "tools": listed,
            "tool_choice": "auto",
        });
        if let Some(t) = config.temperature {
            request["temperature"] = json!(t);
        }
        let answer = endpoint.post(config, "/chat/completions", &request).await?;
        let message = answer
            .pointer("/choices/0/message")
            .cloned()
            .ok_or_else(|| LlmError::Answer(format!("no choices[0].message in {answer}")))?;
        let content = message.get("content").and_then(Value::as_str).map(str::to_owned);
        let requested = tool_calls(&message, turns);
        if requested.is_empty() {
            final_message = Some(content.unwrap_or_default());
            break;
        }
        messages.push(json!({
            "role": "assistant",
            "content": content,
            "tool_calls": requested.iter().map(|c| json!({
                "id": c.id,
                "type": "function",
                "function": {"name": c.name, "arguments": c.arguments},
            })).collect::<Vec<_>>(),
        }));
        for call in requested {
            let record = dispatch(config, &tools, call).await;
            let content = serde_json::to_string(&record.outcome)
                .unwrap_or_else(|e| format!("{{\"status\":\"failed\",\"error\":\"{e}\"}}"));
            messages.push(json!({"role": "tool", "tool_call_id": record.id, "content": content}));
            calls.push(record);
        }
    }
    let truth = match tokio::time::timeout(Duration::from_secs(30), oracle.final_truth()).await {
        Ok(truth) => truth,
        Err(_) => oracle.truth(),
    };
    let claimed_success = final_message
        .as_deref()
        .is_some_and(|m| m.trim_start().to_ascii_uppercase().starts_with("SUCCESS"));
    Ok(LlmEpisode {
        claimed_success,
        success: task.holds(&truth),
        duplicate: truth.has_duplicates(),
        turns,
        calls,
        dispatches: tools.state().calls(),
        final_message,
    })
}

/// A tool call as the model asked for it.
struct Requested {
    id: String,
    name: String,
    arguments: String,
}

/// The tool calls of an assistant message. Arguments given as an object
/// (some servers do) are written back as JSON text; a call without an id
/// gets `call_<turn>_<n>`.
fn tool_calls(message: &Value, turn: u32) -> Vec<Requested> {
    let Some(calls) = message.get("tool_calls").and_then(Value::as_array) else {
        return Vec::new();
    };
    calls
        .iter()
        .enumerate()
        .map(|(n, call)| {
            let id = call
                .get("id")
                .and_then(Value::as_str)
                .filter(|id| !id.is_empty())
                .map_or_else(|| format!("call_{turn}_{n}"), str::to_owned);
            let function = call.get("function").unwrap_or(&Value::Null);
            let name = function.get("name").and_then(Value::as_str).unwrap_or_default().to_owned();
            let arguments = match function.get("arguments") {
                Some(Value::String(text)) => text.clone(),
                Some(Value::Null) | None => String::new(),
                Some(other) => other.to_string(),
            };
            Requested { id, name, arguments }
        })
        .collect()
}

/// Dispatches one call by name with its id; re-issues it, same id, while
/// it stays in doubt and re-issues are left.
async fn dispatch(config: &LlmConfig, tools: &ToolSet<SimClient>, call: Requested) -> CallRecord {
    let mut outcome = tools.call_text(&call.name, &call.arguments, &call.id).await;
    let mut reissued = 0;
    while outcome.status == Status::Unknown && reissued < config.reissues {
        tokio::time::sleep(config.reissue_after).await;
        reissued += 1;
        outcome = tools.call_text(&call.name, &call.arguments, &call.id).await;
    }
    CallRecord { id: call.id, name: call.name, arguments: call.arguments, outcome, reissued }
}

/// An `http://host:port/prefix` base URL.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Endpoint {
    /// `host:port`, to connect to and to send as `Host`.
    authority: String,
    /// The path before `/chat/completions`, without a trailing `/`.
    prefix: String,
}

impl Endpoint {
    fn parse(base_url: &str) -> Result<Self, LlmError> {
        let bad = || LlmError::BaseUrl(base_url.to_owned());
        let rest = base_url.strip_prefix("http://").ok_or_else(bad)?;
        let (authority, path) = rest.split_at(rest.find('/').unwrap_or(rest.len()));
        if authority.is_empty() || authority.contains('@') {
            return Err(bad());
        }
        let has_port = match authority.rfind(']') {
            Some(end) => authority[end..].contains(':'),
            None => authority.contains(':'),
        };
        let authority = if has_port { authority.to_owned() } else { format!("{authority}:80") };
        Ok(Self { authority, prefix: path.trim_end_matches('/').to_owned() })
    }

    /// POSTs `body` as JSON to `prefix + path` and reads the JSON answer.
    async fn post(&self, config: &LlmConfig, path: &str, body: &Value) -> Result<Value, LlmError> {
        let url = format!("http://{}{}{path}", self.authority, self.prefix);
        let exchange = self.exchange(config, path, body);
        let (status, body) = match config.request_timeout {
            Some(limit) => tokio::time::timeout(limit, exchange)
                .await
                .map_err(|_| LlmError::Timeout(url.clone()))?,
            None => exchange.await,
        }
        .map_err(|source| LlmError::Io { url, source })?;
        if !(200..300).contains(&status) {
            let mut text = String::from_utf8_lossy(&body).into_owned();
            let mut cut = text.len().min(2000);
            while !text.is_char_boundary(cut) {
                cut -= 1;
            }
            text.truncate(cut);
            return Err(LlmError::Status { status, body: text });
        }
        serde_json::from_slice(&body).map_err(|e| LlmError::Answer(e.to_string()))
    }

    /// One HTTP/1.1 exchange on a new connection (`Connection: close`).
    async fn exchange(
        &self,
        config: &LlmConfig,
        path: &str,
        body: &Value,
    ) -> std::io::Result<(u16, Vec<u8>)> {
        let body = serde_json::to_vec(body).map_err(std::io::Error::other)?;
        let mut head = format!(
            "POST {}{path} HTTP/1.1\r\nHost: {}\r\nContent-Type: application/json\r\n\
             Accept: application/json\r\nContent-Length: {}\r\nConnection: close\r\n",
            self.prefix,
            self.authority,
            body.len()
        );
        if let Some(key) = &config.api_key {
            head.push_str(&format!("Authorization: Bearer {key}\r\n"));
        }
        head.push_str("\r\n");
        let mut stream = tokio::net::TcpStream::connect(&self.authority).await?;
        stream.write_all(head.as_bytes()).await?;
        stream.write_all(&body).await?;
        stream.flush().await?;
        let mut raw = Vec::new();
        stream.read_to_end(&mut raw).await?;
        parse_response(&raw)
    }
}

/// Splits an HTTP/1.1 response into its status and body (by
/// `Content-Length`, chunked, or up to the end).
fn parse_response(raw: &[u8]) -> std::io::Result<(u16, Vec<u8>)> {
    let invalid =
        |what: &str| std::io::Error::new(std::io::ErrorKind::InvalidData, what.to_owned());
    let end = raw
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .ok_or_else(|| invalid("no end of the HTTP header"))?;
    let head = std::str::from_utf8(&raw[..end]).map_err(|_| invalid("a header is not UTF-8"))?;
    let body = &raw[end + 4..];
    let mut lines = head.split("\r\n");
    let status = lines
        .next()
        .and_then(|line| line.split_whitespace().nth(1))
        .and_then(|code| code.parse::<u16>().ok())
        .ok_or_else(|| invalid("no HTTP status"))?;
    let mut length = None;
    let mut chunked = false;
    for line in lines {
        let Some((name, value)) = line.split_once(':') else { continue };
        let value = value.trim();
        if name.eq_ignore_ascii_case("content-length") {
            length = value.parse::<usize>().ok();
        } else if name.eq_ignore_ascii_case("transfer-encoding") {
            chunked = value.to_ascii_lowercase().contains("chunked");
        }
    }
    if chunked {
        return Ok((status, dechunk(body).ok_or_else(|| invalid("a malformed chunked body"))?));
    }
    match length {
        Some(n) if n <= body.len() => Ok((status, body[..n].to_vec())),
        Some(_) => Err(invalid("the body is shorter than its Content-Length")),
        None => Ok((status, body.to_vec())),
    }
}

/// The body of a chunked transfer.
fn dechunk(mut body: &[u8]) -> Option<Vec<u8>> {
    let mut out = Vec::new();
    loop {
        let line_end = body.windows(2).position(|w| w == b"\r\n")?;
        let size_text = std::str::from_utf8(&body[..line_end]).ok()?;
        let size = usize::from_str_radix(size_text.split(';').next()?.trim(), 16).ok()?;
        body = &body[line_end + 2..];
        if size == 0 {
            return Some(out);
        }
        out.extend_from_slice(body.get(..size)?);
        body = body.get(size + 2..)?;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn base_urls() {
        let e = Endpoint::parse("http://localhost:11434/v1/").unwrap();
        assert_eq!((e.authority.as_str(), e.prefix.as_str()), ("localhost:11434", "/v1"));
        let e = Endpoint::parse("http://10.0.0.1").unwrap();
        assert_eq!((e.authority.as_str(), e.prefix.as_str()), ("10.0.0.1:80", ""));
        let e = Endpoint::parse("http://[::1]:8080/v1").unwrap();
        assert_eq!(e.authority, "[::1]:8080");
        assert_eq!(Endpoint::parse("http://[::1]/v1").unwrap().authority, "[::1]:80");
        for bad in ["https://api.openai.com/v1", "localhost:8080", "http://", "http://u:p@h/"] {
            assert!(matches!(Endpoint::parse(bad), Err(LlmError::BaseUrl(_))), "{bad}");
        }
    }

    #[test]
    fn responses_by_length_chunks_or_end() {
        let raw = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\n{}trailing";
        assert_eq!(parse_response(raw).unwrap(), (200, b"{}".to_vec()));
        let raw = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n3\r\n{\"a\r\n4;x=y\r\n\":1}\r\n0\r\n\r\n";
        assert_eq!(parse_response(raw).unwrap(), (200, b"{\"a\":1}".to_vec()));
        let raw = b"HTTP/1.0 503 Service Unavailable\r\n\r\nbusy";
        assert_eq!(parse_response(raw).unwrap(), (503, b"busy".to_vec()));
        assert!(parse_response(b"HTTP/1.1 200 OK\r\nContent-Length: 9\r\n\r\n{}").is_err());
        assert!(parse_response(b"garbage").is_err());
    }

    #[test]
    fn tool_calls_take_any_argument_form() {
        let message = json!({"tool_calls": [
            {"id": "a", "function": {"name": "x", "arguments": "{\"n\":1}"}},
            {"function": {"name": "y", "arguments": {"n": 2}}},
            {"id": "", "function": {"name": "z"}},
        ]});
        let calls = tool_calls(&message, 3);
        let seen: Vec<(&str, &str, &str)> =
            calls.iter().map(|c| (c.id.as_str(), c.name.as_str(), c.arguments.as_str())).collect();
        assert_eq!(
            seen,
            [("a", "x", "{\"n\":1}"), ("call_3_1", "y", "{\"n\":2}"), ("call_3_2", "z", "")]
        );
        assert!(tool_calls(&json!({"content": "SUCCESS"}), 1).is_empty());
    }
}
