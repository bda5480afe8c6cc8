//! The LLM planner (`verified_tools_suite::llm`) against a scripted
//! chat-completions server in the test: a tokio `TcpListener` that answers
//! each `POST /v1/chat/completions` with the next scripted message and keeps
//! every request, so the test sees exactly what the model was sent. No
//! model is needed.
//!
//! The script makes the mistakes models make: malformed tool arguments
//! (the model gets the argument error and tries again), an unknown tool
//! name, a repeated `tool_call_id` (replayed, not executed again); and a
//! call whose answer the simulator loses, which the planner re-issues with
//! the same id.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::{Value, json};
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::TcpListener;
use verified_tools::Proof;
use verified_tools::sim::{
    FaultDraw, FaultLevel, FaultProfile, Op, SimConfig, Task, TaskKind, Timeout,
};
use verified_tools::toolset::Status;
use verified_tools_suite::llm::{LlmConfig, LlmError, SYSTEM_PROMPT, run_episode};

/// A scripted answer: the HTTP status and the JSON body.
type Reply = (u16, Value);

/// Serves `replies` in order, one per connection, and keeps the requests'
/// bodies. Every other answer is sent chunked, as some servers do.
async fn scripted(replies: Vec<Reply>) -> (String, Arc<Mutex<Vec<Value>>>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("a free port");
    let url = format!("http://{}/v1", listener.local_addr().unwrap());
    let seen = Arc::new(Mutex::new(Vec::new()));
    let requests = Arc::clone(&seen);
    tokio::spawn(async move {
        for (n, (status, body)) in replies.into_iter().enumerate() {
            let Ok((mut stream, _)) = listener.accept().await else { return };
            let request = read_request(&mut stream).await;
            requests.lock().unwrap().push(request);
            let body = body.to_string();
            let head = if n % 2 == 1 {
                format!(
                    "HTTP/1.1 {status} X\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n"
                )
            } else {
                format!(
                    "HTTP/1.1 {status} X\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
                    body.len()
                )
            };
            let payload = if n % 2 == 1 {
                let (a, b) = body.split_at(body.len() / 2);
                format!("{:x}\r\n{a}\r\n{:x}\r\n{b}\r\n0\r\n\r\n", a.len(), b.len())
            } else {
                body
            };
            let _ = stream.write_all(head.as_bytes()).await;
            let _ = stream.write_all(payload.as_bytes()).await;
            let _ = stream.shutdown().await;
        }
    });
    (url, seen)
}

/// The JSON body of one request (headers, then `Content-Length` bytes).
async fn read_request(stream: &mut tokio::net::TcpStream) -> Value {
    let mut raw = Vec::new();
    let mut buf = [0u8; 4096];
    loop {
        let n = stream.read(&mut buf).await.expect("a request");
        raw.extend_from_slice(&buf[..n]);
        if let Some(end) = raw.windows(4).position(|w| w == b"\r\n\r\n") {
            let head = String::from_utf8_lossy(&raw[..end]).to_ascii_lowercase();
            assert!(head.starts_with("post /v1/chat/completions http/1.1"), "{head}");
            let length: usize = head
                .lines()
                .find_map(|l| l.strip_prefix("content-length:"))
                .and_then(|v| v.trim().parse().ok())
                .expect("a Content-Length");
            while raw.len() < end + 4 + length {
                let n = stream.read(&mut buf).await.expect("the body");
                assert!(n > 0, "the body ended early");
                raw.extend_from_slice(&buf[..n]);
            }
            return serde_json::from_slice(&raw[end + 4..end + 4 + length]).expect("JSON");
        }
        assert!(n > 0, "the request ended early");
    }
}

/// The model asks for one tool call.
fn call(id: &str, name: &str, arguments: &str) -> Reply {
    let message = json!({
        "role": "assistant",
        "content": null,
        "tool_calls": [{"id": id, "type": "function", "function": {"name": name, "arguments": arguments}}]
    });
    (200, json!({"choices": [{"index": 0, "message": message, "finish_reason": "tool_calls"}]}))
}

/// The model answers.
fn answer(text: &str) -> Reply {
    let message = json!({"role": "assistant", "content": text});
    (200, json!({"choices": [{"index": 0, "message": message, "finish_reason": "stop"}]}))
}

/// The tool message answering `id` in a request, parsed.
fn tool_result(request: &Value, id: &str) -> Value {
    let message = request["messages"]
        .as_array()
        .unwrap()
        .iter()
        .rev()
        .find(|m| m["role"] == "tool" && m["tool_call_id"] == id)
        .unwrap_or_else(|| panic!("no tool message for {id}"));
    serde_json::from_str(message["content"].as_str().unwrap()).unwrap()
}

fn config(url: &str) -> LlmConfig {
    LlmConfig::new(url, "test-model").with_request_timeout(Some(Duration::from_secs(10)))
}

#[tokio::test]
async fn the_model_recovers_from_its_mistakes_and_nothing_runs_twice() {
    let seed = 42;
    let task = TaskKind::ActivateCustomer.instance(seed);
    let Task::ActivateCustomer(t) = task else { unreachable!() };
    let c = t.customer.0;
    let args = format!("{{\"customer\": {c}}}");
    let (url, requests) = scripted(vec![
        call("call_1", "create_customer", &format!("{{\"customer\": \"{c}\"}}")),
        call("call_2", "create_customer", &format!("{{\"customer\": {c}")),
        call("call_3", "create_client", &args),
        call("call_4", "create_customer", &args),
        call("call_4", "create_customer", &args),
        call(
            "call_6",
            "set_customer_status",
            &format!("{{\"customer\": {c}, \"expected_version\": 1}}"),
        ),
        call("call_7", "send_welcome", &args),
        answer("SUCCESS: the customer is active and welcomed."),
    ])
    .await;
    let sim = SimConfig::new(seed, FaultProfile::NONE);
    let episode = run_episode(&config(&url), task, sim).await.expect("an episode");

    assert!(episode.claimed_success && episode.success && !episode.duplicate, "{episode}");
    assert_eq!(episode.turns, 8);
    assert_eq!(episode.calls.len(), 7);
    // Three dispatches: create, activate, welcome. The bad calls and the
    // repeated id dispatched nothing.
    assert_eq!(episode.dispatches, 3, "{episode}");

    let requests = requests.lock().unwrap();
    assert_eq!(requests.len(), 8);
    for request in requests.iter() {
        assert_eq!(request["model"], "test-model");
        assert_eq!(request["tools"].as_array().unwrap().len(), 9);
        assert_eq!(request["tools"][0]["function"]["name"], "create_customer");
        assert_eq!(request["messages"][0]["content"], SYSTEM_PROMPT);
    }
    assert!(requests[0]["messages"][1]["content"].as_str().unwrap().contains(&c.to_string()));
    // Malformed arguments: the model is told which field, and how.
    let bad = tool_result(&requests[1], "call_1");
    assert_eq!(bad["status"], "invalid_arguments");
    assert_eq!(bad["error"], "field `customer`: expected a non-negative integer, got a string");
    let broken = tool_result(&requests[2], "call_2");
    assert_eq!(broken["status"], "invalid_arguments");
    assert!(broken["error"].as_str().unwrap().starts_with("the arguments are not valid JSON"));
    // An unknown tool: the model is given the names.
    let unknown = tool_result(&requests[3], "call_3");
    assert_eq!(unknown["status"], "no_such_tool");
    assert!(unknown["instruction"].as_str().unwrap().contains("`create_customer`"));
    // The call (its OK answer read back, as for every high tool), then the
    // same tool-call id again: replayed, same key.
    let created = tool_result(&requests[4], "call_4");
    assert_eq!((&created["status"], &created["proof"]), (&json!("success"), &json!("verifier")));
    let replayed = tool_result(&requests[5], "call_4");
    assert_eq!(replayed["proof"], "ledger");
    assert_eq!(replayed["key"], created["key"]);
    assert_eq!(episode.calls[4].outcome.proof, Some(Proof::Ledger));
    // The assistant's tool calls are sent back before their results.
    let history = requests[1]["messages"].as_array().unwrap();
    assert_eq!(history[2]["role"], "assistant");
    assert_eq!(history[2]["tool_calls"][0]["id"], "call_1");
    assert_eq!(history[3]["tool_call_id"], "call_1");
}

/// The first seed at `extreme` whose first `create_customer` is a late
/// arrival landing 3 to 5 s after it was sent, without replica lag.
fn in_doubt_seed() -> u64 {
    let profile = FaultLevel::Extreme.profile();
    (0..1_000_000)
        .find(|&seed| {
            let first = profile.draw(seed, Op::CreateCustomer, 0);
            let late = Duration::from_secs(3)..=Duration::from_secs(5);
            matches!(first.timeout, Some(Timeout::Late(d)) if late.contains(&d))
                && first.lag.is_none()
                && profile.draw(seed, Op::CreateCustomer, 1) == FaultDraw::default()
        })
        .expect("some seed loses the first answer")
}

#[tokio::test(start_paused = true)]
async fn a_call_in_doubt_is_reissued_with_its_id_and_verified() {
    let seed = in_doubt_seed();
    let task = TaskKind::ActivateCustomer.instance(seed);
    let Task::ActivateCustomer(t) = task else { unreachable!() };
    let args = format!("{{\"customer\": {}}}", t.customer.0);
    let (url, requests) =
        scripted(vec![call("call_a", "create_customer", &args), answer("FAILURE: stopping here.")])
            .await;
    // No request timer: on paused time it would fire while the socket waits.
    let config = LlmConfig::new(&url, "test-model")
        .with_request_timeout(None)
        .with_reissues(1, Duration::from_secs(6));
    let sim = SimConfig::new(seed, FaultLevel::Extreme.profile());
    let episode = run_episode(&config, task, sim).await.expect("an episode");

    let record = &episode.calls[0];
    assert_eq!(record.reissued, 1, "{episode}");
    assert_eq!(record.outcome.status, Status::Success);
    assert_eq!(record.outcome.proof, Some(Proof::Verifier), "verified, not executed again");
    assert_eq!(episode.dispatches, 1);
    assert!(!episode.claimed_success && !episode.duplicate);
    let shown = tool_result(&requests.lock().unwrap()[1], "call_a");
    assert_eq!(shown["proof"], "verifier");

    // Without re-issues the model is shown the doubt, with the key.
    let (url, requests) =
        scripted(vec![call("call_a", "create_customer", &args), answer("FAILURE")]).await;
    let config =
        LlmConfig::new(&url, "m").with_request_timeout(None).with_reissues(0, Duration::ZERO);
    let episode = run_episode(&config, task, sim).await.expect("an episode");
    assert_eq!(episode.calls[0].outcome.status, Status::Unknown);
    let shown = tool_result(&requests.lock().unwrap()[1], "call_a");
    assert_eq!(shown["status"], "unknown");
    assert!(shown["instruction"].as_str().unwrap().starts_with("Do not repeat this call"));
}

#[tokio::test]
async fn server_errors_are_errors() {
    let task = TaskKind::RecordInvoice.instance(1);
    let sim = SimConfig::new(1, FaultProfile::NONE);
    let (url, _) = scripted(vec![(503, json!({"error": "loading model"}))]).await;
    match run_episode(&config(&url), task, sim).await {
        Err(LlmError::Status { status: 503, body }) => assert!(body.contains("loading model")),
        other => panic!("expected HTTP 503, got {other:?}"),
    }
    let (url, _) = scripted(vec![(200, json!({"object": "list"}))]).await;
    assert!(matches!(run_episode(&config(&url), task, sim).await, Err(LlmError::Answer(_))));
    let https = LlmConfig::new("https://api.example.com/v1", "m");
    assert!(matches!(run_episode(&https, task, sim).await, Err(LlmError::BaseUrl(_))));
    // The turn budget ends an episode that never answers, without a claim.
    let (url, _) = scripted(vec![call("r1", "read_record", "{\"record\": 1}"); 3]).await;
    let episode =
        run_episode(&config(&url).with_max_turns(3), task, sim).await.expect("an episode");
    assert_eq!((episode.turns, episode.final_message.as_deref()), (3, None));
    assert!(!episode.claimed_success && !episode.success);
    // Reads are not recorded in the ledger: the same read id reads again.
    assert_eq!(episode.dispatches, 3);
    assert!(episode.calls.iter().all(|c| c.outcome.proof == Some(Proof::Response)));
}
