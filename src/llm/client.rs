//! The planner's client of a chat-completions API: reqwest, plus what a
//! model server needs of a client that runs for hours against it — a
//! failed request (an overloaded server's 503 or 429, a timeout, a broken
//! connection, an answer that is not a chat completion) is sent again after
//! a growing pause, and only a server that keeps failing ends the episode.

use std::time::Duration;

use serde_json::Value;

use super::{LlmConfig, LlmError};

/// The longest pause before a re-send, whatever the backoff or the server's
/// `Retry-After` asks: a run of many episodes must not stall for an hour on
/// a server's word.
pub const MAX_BACKOFF: Duration = Duration::from_secs(60);

/// Bytes of an error answer kept in [`LlmError::Status`].
const BODY_KEPT: usize = 2000;

/// A tool call as the model asked for it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Requested {
    pub(super) id: String,
    pub(super) name: String,
    pub(super) arguments: String,
}

/// One assistant message: its text and its tool calls.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Reply {
    pub(super) content: Option<String>,
    pub(super) calls: Vec<Requested>,
}

/// A client of one model server.
pub(super) struct ModelClient {
    http: reqwest::Client,
    url: reqwest::Url,
    api_key: Option<String>,
    retries: u32,
    backoff: Duration,
}

impl ModelClient {
    /// A client of `config.base_url`, refused unless it is an `http://` URL.
    pub(super) fn new(config: &LlmConfig) -> Result<Self, LlmError> {
        let bad = || LlmError::BaseUrl(config.base_url.clone());
        let base = reqwest::Url::parse(config.base_url.trim_end_matches('/')).map_err(|_| bad())?;
        // TLS would bring rustls and its crypto into every build of the
        // planner; the servers this is for (Ollama, vLLM, llama.cpp) speak
        // plain HTTP, and a TLS-terminating proxy covers the rest.
        if base.scheme() != "http" || !base.has_host() || !base.username().is_empty() {
            return Err(bad());
        }
        let url = format!("{}/chat/completions", base.as_str().trim_end_matches('/'));
        let url = reqwest::Url::parse(&url).map_err(|_| bad())?;
        let mut builder = reqwest::Client::builder();
        if let Some(limit) = config.request_timeout {
            builder = builder.timeout(limit);
        }
        let http = builder
            .build()
            .map_err(|e| LlmError::Io { url: url.to_string(), source: Box::new(e) })?;
        Ok(Self {
            http,
            url,
            api_key: config.api_key.clone(),
            retries: config.retries,
            backoff: config.backoff,
        })
    }

    /// Requests one chat completion, re-sending it while the server fails
    /// in a way a later request may not ([`LlmError::is_retryable`]) and
    /// re-sends are left; returns the reply and the re-sends it took.
    pub(super) async fn complete(&self, body: &Value, turn: u32) -> Result<(Reply, u32), LlmError> {
        let mut resent = 0;
        loop {
            let (error, retry_after) = match self.attempt(body).await {
                Ok(answer) => match parse_reply(&answer, turn) {
                    Ok(reply) => return Ok((reply, resent)),
                    Err(error) => (error, None),
                },
                Err(failure) => failure,
            };
            if !error.is_retryable() {
                return Err(error);
            }
            if resent == self.retries {
                return Err(LlmError::Exhausted { attempts: resent + 1, last: Box::new(error) });
            }
            tokio::time::sleep(backoff(self.backoff, resent, retry_after)).await;
            resent += 1;
        }
    }

    /// One exchange: the answer as JSON, or the error and the server's
    /// `Retry-After`, if it gave one in seconds.
    async fn attempt(&self, body: &Value) -> Result<Value, (LlmError, Option<Duration>)> {
        let url = self.url.to_string();
        let transport = |e: reqwest::Error| {
            if e.is_timeout() {
                LlmError::Timeout(url.clone())
            } else {
                LlmError::Io { url: url.clone(), source: Box::new(e) }
            }
        };
        let mut request = self.http.post(self.url.clone()).json(body);
        if let Some(key) = &self.api_key {
            request = request.bearer_auth(key);
        }
        let response = request.send().await.map_err(|e| (transport(e), None))?;
        let status = response.status();
        let retry_after = response
            .headers()
            .get(reqwest::header::RETRY_AFTER)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.trim().parse::<u64>().ok())
            .map(Duration::from_secs);
        let bytes = response.bytes().await.map_err(|e| (transport(e), None))?;
        if !status.is_success() {
            let text = String::from_utf8_lossy(&bytes);
            let mut cut = text.len().min(BODY_KEPT);
            while !text.is_char_boundary(cut) {
                cut -= 1;
            }
            let body = text[..cut].to_owned();
            return Err((LlmError::Status { status: status.as_u16(), body }, retry_after));
        }
        serde_json::from_slice(&bytes)
            .map_err(|e| (LlmError::Answer(format!("not JSON ({e})")), None))
    }
}

/// The pause before re-send `n` (from 0): `first` doubled each time, or the
/// server's `Retry-After` when it gave one; at most [`MAX_BACKOFF`].
pub(super) fn backoff(first: Duration, n: u32, retry_after: Option<Duration>) -> Duration {
    let doubled = first.saturating_mul(1u32.checked_shl(n.min(31)).unwrap_or(u32::MAX));
    retry_after.unwrap_or(doubled).min(MAX_BACKOFF)
}

/// The assistant message of a chat completion. A tool call the planner
/// cannot even name — `tool_calls` that is not a list, an entry without a
/// `function.name`, arguments that are neither text nor an object — is a
/// broken answer, sent again like a server error: the model cannot be shown
/// an outcome for a call it cannot be told it made. Arguments given as an
/// object (some servers do) are written back as JSON text; a call without
/// an id gets `call_<turn>_<n>`. Arguments that are not valid JSON are the
/// model's mistake, not the server's: the tool set answers them, naming the
/// field, and the model tries again.
pub(super) fn parse_reply(answer: &Value, turn: u32) -> Result<Reply, LlmError> {
    let broken = |what: &str| LlmError::Answer(format!("{what} in {}", cut(answer)));
    let message =
        answer.pointer("/choices/0/message").ok_or_else(|| broken("no choices[0].message"))?;
    let content = match message.get("content") {
        Some(Value::String(text)) => Some(text.clone()),
        Some(Value::Null) | None => None,
        Some(_) => return Err(broken("a message content that is not text")),
    };
    let calls = match message.get("tool_calls") {
        None | Some(Value::Null) => Vec::new(),
        Some(Value::Array(calls)) => calls
            .iter()
            .enumerate()
            .map(|(n, call)| {
                requested(call, turn, n).ok_or_else(|| broken("a malformed tool call"))
            })
            .collect::<Result<_, _>>()?,
        Some(_) => return Err(broken("tool_calls that is not a list")),
    };
    Ok(Reply { content, calls })
}

fn requested(call: &Value, turn: u32, n: usize) -> Option<Requested> {
    let id = match call.get("id") {
        Some(Value::String(id)) if !id.is_empty() => id.clone(),
        Some(Value::String(_) | Value::Null) | None => format!("call_{turn}_{n}"),
        Some(_) => return None,
    };
    let function = call.get("function")?;
    let name = function.get("name")?.as_str()?.to_owned();
    let arguments = match function.get("arguments") {
        Some(Value::String(text)) => text.clone(),
        Some(Value::Null) | None => String::new(),
        Some(object @ Value::Object(_)) => object.to_string(),
        Some(_) => return None,
    };
    Some(Requested { id, name, arguments })
}

/// An answer, cut for an error message.
fn cut(answer: &Value) -> String {
    let text = answer.to_string();
    match text.char_indices().nth(300) {
        Some((at, _)) => format!("{}...", &text[..at]),
        None => text,
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn tool_calls_take_any_argument_form() {
        let answer = |calls: Value| json!({"choices": [{"message": {"tool_calls": calls}}]});
        let reply = parse_reply(
            &answer(json!([
                {"id": "a", "function": {"name": "x", "arguments": "{\"n\":1}"}},
                {"function": {"name": "y", "arguments": {"n": 2}}},
                {"id": "", "function": {"name": "z"}},
            ])),
            3,
        )
        .unwrap();
        let seen: Vec<(&str, &str, &str)> = reply
            .calls
            .iter()
            .map(|c| (c.id.as_str(), c.name.as_str(), c.arguments.as_str()))
            .collect();
        assert_eq!(
            seen,
            [("a", "x", "{\"n\":1}"), ("call_3_1", "y", "{\"n\":2}"), ("call_3_2", "z", "")]
        );
        let text = json!({"choices": [{"message": {"content": "SUCCESS"}}]});
        let reply = parse_reply(&text, 1).unwrap();
        assert_eq!((reply.content.as_deref(), reply.calls.len()), (Some("SUCCESS"), 0));
    }

    #[test]
    fn a_tool_call_without_a_name_is_a_broken_answer() {
        let answer = |calls: Value| json!({"choices": [{"message": {"tool_calls": calls}}]});
        for broken in [
            json!("create_customer"),
            json!([{"id": "a"}]),
            json!([{"id": "a", "function": {"arguments": "{}"}}]),
            json!([{"id": "a", "function": {"name": 7}}]),
            json!([{"id": "a", "function": {"name": "x", "arguments": [1]}}]),
            json!([{"id": 5, "function": {"name": "x"}}]),
        ] {
            let error = parse_reply(&answer(broken.clone()), 1).unwrap_err();
            assert!(matches!(error, LlmError::Answer(_)), "{broken}");
            assert!(error.is_retryable(), "{broken}");
        }
        assert!(matches!(parse_reply(&json!({"object": "list"}), 1), Err(LlmError::Answer(_))));
    }

    #[test]
    fn backoff_doubles_honours_retry_after_and_is_capped() {
        let s = Duration::from_secs;
        let waits: Vec<_> = (0..4).map(|n| backoff(s(2), n, None)).collect();
        assert_eq!(waits, [s(2), s(4), s(8), s(16)]);
        assert_eq!(backoff(s(2), 40, None), MAX_BACKOFF);
        assert_eq!(backoff(s(2), 0, Some(s(7))), s(7));
        assert_eq!(backoff(s(2), 0, Some(s(3600))), MAX_BACKOFF);
    }

    #[test]
    fn only_http_base_urls() {
        for good in ["http://localhost:11434/v1/", "http://10.0.0.1", "http://[::1]:8080/v1"] {
            let client = ModelClient::new(&LlmConfig::new(good, "m")).unwrap();
            assert!(client.url.path().ends_with("/chat/completions"), "{good}");
            assert!(!client.url.path().contains("//"), "{}", client.url);
        }
        for bad in ["https://api.openai.com/v1", "localhost:8080", "http://", "http://u:p@h/"] {
            let error = ModelClient::new(&LlmConfig::new(bad, "m")).err();
            assert!(matches!(error, Some(LlmError::BaseUrl(_))), "{bad}");
        }
    }
}
