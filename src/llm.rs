//! The simulator's tools for a model, and an LLM planner that uses them.
//!
//! - [`tool_set`]: the [`ToolSet`] of the two tasks, which the MCP example
//!   serves and the planner hands to a model.
//! - `run_episode` (feature `openai`): one episode of a task driven by a model behind an
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
//! The episode runs under one of the experiment's [methods](Method): the
//! arms differ in the tool layer — the engine's mode, whether keys are
//! sent, what the simulated server honours, the settle margin — exactly as
//! in the scripted planner's grid ([`EpisodeSpec::context`]); the model
//! plans in every arm alike. `run_grid` runs tasks × levels × methods ×
//! episodes and scores them into the scripted grid's [`Results`], so the
//! table, the JSON and the figure are drawn from them alike.
//!
//! The model server is reached with reqwest (feature `openai`, off by
//! default: it brings 53 crates — hyper, tower, url and ICU's IDNA tables —
//! that the README's first command does not need). A request the server fails — an HTTP 408, 429 or 5xx, a
//! timeout, a broken connection, an answer that is not a chat completion —
//! is sent again after a pause that doubles ([`LlmConfig::backoff`]); when
//! the re-sends run out the episode fails ([`LlmError::Exhausted`]) and a
//! grid records it and goes on.

use std::fmt;
use std::time::Duration;

use verified_tools::toolset::{Status, ToolOutcome, ToolSet};

use crate::experiment::{EpisodeSpec, Shared};
#[cfg(doc)]
use crate::experiment::{Method, Results};
use crate::tools::{self, SimClient};

#[cfg(feature = "openai")]
mod client;
#[cfg(feature = "openai")]
mod episode;
#[cfg(feature = "openai")]
mod grid;

#[cfg(feature = "openai")]
pub use client::MAX_BACKOFF;
#[cfg(feature = "openai")]
pub use episode::run_episode;
#[cfg(feature = "openai")]
pub use grid::{EpisodeReport, LlmResults, run_grid};

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

/// How to reach the model, how long to let it work, and how to treat a
/// server that fails.
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
    /// How many times a request the server failed is sent again before the
    /// episode fails.
    pub retries: u32,
    /// The pause before the first re-send; it doubles with each, up to
    /// `MAX_BACKOFF`, 60 s (a server's `Retry-After`
    /// in seconds replaces it).
    pub backoff: Duration,
    /// How many times a call that ended in doubt is re-issued, with its
    /// tool-call id, before its outcome goes to the model.
    pub reissues: u32,
    /// The pause before each re-issue: long enough for a lost request to
    /// land and a lagging replica to catch up.
    pub reissue_after: Duration,
}

impl LlmConfig {
    /// A model at `base_url`: 24 turns, temperature 0, 300 s per request
    /// (a CPU server can take minutes over a first turn), 4 re-sends of a
    /// failed request after 2, 4, 8, 16 s, one re-issue of a call in doubt
    /// after 6 s.
    pub fn new(base_url: impl Into<String>, model: impl Into<String>) -> Self {
        Self {
            base_url: base_url.into(),
            model: model.into(),
            api_key: None,
            max_turns: 24,
            temperature: Some(0.0),
            request_timeout: Some(Duration::from_secs(300)),
            retries: 4,
            backoff: Duration::from_secs(2),
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

    /// Sets the sampling temperature (`None`: the server's default).
    #[must_use]
    pub fn with_temperature(mut self, temperature: Option<f64>) -> Self {
        self.temperature = temperature;
        self
    }

    /// Sets the limit of one HTTP exchange.
    #[must_use]
    pub fn with_request_timeout(mut self, timeout: Option<Duration>) -> Self {
        self.request_timeout = timeout;
        self
    }

    /// Sets the re-sends of a failed request and the first pause.
    #[must_use]
    pub fn with_retries(mut self, times: u32, backoff: Duration) -> Self {
        self.retries = times;
        self.backoff = backoff;
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
    /// Requests sent again after the model server failed them.
    pub resent: u32,
    /// Every tool call, in order.
    pub calls: Vec<CallRecord>,
    /// Tool dispatches that reached the simulated server (all attempts).
    pub dispatches: u32,
    /// Verifier reads.
    pub verifier_reads: u32,
    /// Time the episode took, in ms, the model's included (tokio time:
    /// virtual on a paused runtime).
    pub elapsed_ms: u64,
    /// The model's final answer (`None` if the turns ran out).
    pub final_message: Option<String>,
}

impl LlmEpisode {
    /// The episode as the experiment scores it: the model's claim, the
    /// ground truth, and whether it stopped on a call in doubt.
    pub fn scored(&self) -> crate::experiment::Episode {
        let in_doubt = self.calls.last().is_some_and(|c| c.outcome.status == Status::Unknown);
        crate::experiment::Episode {
            success: self.success,
            claimed: self.claimed_success,
            duplicate: self.duplicate,
            in_doubt: in_doubt && !self.claimed_success,
            tool_calls: self.dispatches,
            verifier_calls: self.verifier_reads,
            virtual_ms: self.elapsed_ms,
        }
    }

    /// Every call with its outcome, then the model's final answer: what
    /// tells a false claim from nonsense.
    pub fn detail(&self) -> String {
        use fmt::Write as _;
        let mut out = String::new();
        for call in &self.calls {
            let _ = write!(
                out,
                "\n  {} {}({}) -> {}",
                call.id, call.name, call.arguments, call.outcome.status
            );
            if call.reissued > 0 {
                let _ = write!(out, " after {} re-issue(s)", call.reissued);
            }
        }
        match &self.final_message {
            Some(answer) => {
                let _ = write!(out, "\n  answer: {}", answer.trim().replace('\n', "\n          "));
            }
            None => out.push_str("\n  answer: none (the turns ran out)"),
        }
        out
    }
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
        if self.resent > 0 {
            write!(f, ", {} request(s) re-sent", self.resent)?;
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
        /// The client's error.
        source: Box<dyn std::error::Error + Send + Sync>,
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
    /// The answer is not a chat completion, or names a tool call the
    /// planner cannot read.
    #[error("the model server's answer is not a chat completion: {0}")]
    Answer(String),
    /// The server kept failing: the last error, after this many requests.
    #[error("{last} (gave up after {})", requests(*attempts))]
    Exhausted {
        /// Requests sent, the first included.
        attempts: u32,
        /// The last one's error.
        last: Box<LlmError>,
    },
}

impl LlmError {
    /// Whether the same request may succeed later: a timeout, a broken
    /// connection, a broken answer, HTTP 408, 429 or 5xx. A 4xx otherwise
    /// (a wrong model name, a refused key, a request too large) would be
    /// refused again.
    pub fn is_retryable(&self) -> bool {
        match self {
            LlmError::Io { .. } | LlmError::Timeout(_) | LlmError::Answer(_) => true,
            LlmError::Status { status, .. } => matches!(status, 408 | 429 | 500..=599),
            LlmError::BaseUrl(_) | LlmError::Exhausted { .. } => false,
        }
    }
}

/// `1 request`, `2 requests`.
fn requests(n: u32) -> String {
    if n == 1 { "1 request".to_owned() } else { format!("{n} requests") }
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
pub fn task_prompt(task: &verified_tools::sim::Task) -> String {
    use verified_tools::sim::Task;
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

/// The tool set of one episode under `spec`'s method: a simulated server
/// that honours what the method's server honours, keys sent if the method
/// sends them, and the method's context ([`EpisodeSpec::context`]).
pub fn episode_tools(
    spec: &EpisodeSpec,
    shared: Option<&Shared>,
) -> (ToolSet<SimClient>, verified_tools::sim::Oracle) {
    let (server, oracle) = verified_tools::sim::SimServer::new(spec.server());
    let client = SimClient::new(server, spec.method.forwards_keys());
    let (agent, _) = spec.identity("llm-agent", shared);
    (tool_set(client).with_context(spec.context(agent, shared)), oracle)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_server_side_failures_are_retried() {
        let status = |status| LlmError::Status { status, body: String::new() };
        for retryable in [status(503), status(500), status(429), status(408)] {
            assert!(retryable.is_retryable(), "{retryable}");
        }
        for refused in [status(400), status(401), status(404), LlmError::BaseUrl("x".into())] {
            assert!(!refused.is_retryable(), "{refused}");
        }
        assert!(LlmError::Timeout("u".into()).is_retryable());
        let exhausted = LlmError::Exhausted { attempts: 3, last: Box::new(status(503)) };
        assert!(!exhausted.is_retryable());
        assert!(exhausted.to_string().ends_with("(gave up after 3 requests)"), "{exhausted}");
        let once = LlmError::Exhausted { attempts: 1, last: Box::new(status(503)) };
        assert!(once.to_string().ends_with("(gave up after 1 request)"), "{once}");
    }
}
