//! The LLM planner (`verified_tools_suite::llm`) against a chat-completions
//! server in the test: a tokio `TcpListener` that answers each `POST
//! /v1/chat/completions` as the test's script says — a message, an HTTP
//! error, a broken answer, or no answer at all — and keeps every request,
//! so the test sees exactly what the model was sent. No model is needed.
//!
//! The script makes the mistakes models make (malformed tool arguments, an
//! unknown tool name, a repeated `tool_call_id`, a text answer with no tool
//! call) and the failures model servers have (503s, hangs, answers that are
//! not chat completions); `the_agent_runs_every_method_against_a_server_that_fails_every_third_request`
//! runs the example's `--planner openai` itself against one.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::{Value, json};
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::TcpListener;
use verified_tools::Proof;
use verified_tools::sim::{FaultDraw, FaultLevel, FaultProfile, Op, Task, TaskKind, Timeout};
use verified_tools::toolset::Status;
use verified_tools_suite::experiment::{Config, EpisodeSpec, Method, Settings};
use verified_tools_suite::llm::{LlmConfig, LlmError, SYSTEM_PROMPT, run_episode, run_grid};

#[allow(dead_code)]
#[path = "../examples/agent.rs"]
mod agent_example;

/// What the server does with one request.
#[derive(Debug, Clone)]
enum Reply {
    /// An HTTP status and a JSON body.
    Json(u16, Value),
    /// An HTTP status, a header and a text body.
    Raw(u16, &'static str, String),
    /// Reads the request and never answers (the connection stays open).
    Hang,
}

/// Serves each request with `behaviour(n, request)`, `n` counting requests
/// from 0 across connections, one request per connection, and keeps the
/// requests' bodies. Every other answer is sent chunked, as some servers do.
async fn serve(
    behaviour: impl Fn(usize, &Value) -> Reply + Send + Sync + 'static,
) -> (String, Arc<Mutex<Vec<Value>>>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("a free port");
    let url = format!("http://{}/v1", listener.local_addr().unwrap());
    let seen = Arc::new(Mutex::new(Vec::new()));
    let requests = Arc::clone(&seen);
    let behaviour = Arc::new(behaviour);
    let count = Arc::new(AtomicUsize::new(0));
    tokio::spawn(async move {
        loop {
            let Ok((mut stream, _)) = listener.accept().await else { return };
            let (requests, behaviour, count) =
                (Arc::clone(&requests), Arc::clone(&behaviour), Arc::clone(&count));
            tokio::spawn(async move {
                let Some(request) = read_request(&mut stream).await else { return };
                let n = count.fetch_add(1, Ordering::SeqCst);
                let reply = behaviour(n, &request);
                requests.lock().unwrap().push(request);
                let (status, header, body) = match reply {
                    Reply::Json(status, body) => (status, "", body.to_string()),
                    Reply::Raw(status, header, body) => (status, header, body),
                    Reply::Hang => return std::future::pending::<()>().await,
                };
                let (framing, payload) = if n % 2 == 1 {
                    let (a, b) = body.split_at(body.len() / 2);
                    let chunks =
                        format!("{:x}\r\n{a}\r\n{:x}\r\n{b}\r\n0\r\n\r\n", a.len(), b.len());
                    ("Transfer-Encoding: chunked".to_owned(), chunks)
                } else {
                    (format!("Content-Length: {}", body.len()), body)
                };
                let head = format!(
                    "HTTP/1.1 {status} X\r\n{framing}\r\n{header}Connection: close\r\n\r\n"
                );
                let _ = stream.write_all(head.as_bytes()).await;
                let _ = stream.write_all(payload.as_bytes()).await;
                let _ = stream.shutdown().await;
            });
        }
    });
    (url, seen)
}

/// Serves `replies` in order; past their end, an HTTP 400 (never re-sent)
/// that says so.
async fn scripted(replies: Vec<Reply>) -> (String, Arc<Mutex<Vec<Value>>>) {
    serve(move |n, _| {
        replies.get(n).cloned().unwrap_or(Reply::Json(400, json!({"error": "the script ended"})))
    })
    .await
}

/// The JSON body of one request (headers, then `Content-Length` bytes);
/// `None` if the client closed the connection before sending one.
async fn read_request(stream: &mut tokio::net::TcpStream) -> Option<Value> {
    let mut raw = Vec::new();
    let mut buf = [0u8; 4096];
    loop {
        let n = stream.read(&mut buf).await.ok()?;
        if n == 0 {
            return None;
        }
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
            return Some(serde_json::from_slice(&raw[end + 4..end + 4 + length]).expect("JSON"));
        }
    }
}

/// The model asks for one tool call.
fn call(id: &str, name: &str, arguments: &str) -> Reply {
    let message = json!({
        "role": "assistant",
        "content": null,
        "tool_calls": [{"id": id, "type": "function", "function": {"name": name, "arguments": arguments}}]
    });
    Reply::Json(
        200,
        json!({"choices": [{"index": 0, "message": message, "finish_reason": "tool_calls"}]}),
    )
}

/// The model answers.
fn answer(text: &str) -> Reply {
    let message = json!({"role": "assistant", "content": text});
    Reply::Json(
        200,
        json!({"choices": [{"index": 0, "message": message, "finish_reason": "stop"}]}),
    )
}

/// The server is overloaded.
fn unavailable() -> Reply {
    Reply::Json(503, json!({"error": "loading model"}))
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

/// A model at `url`, with a request limit that only bounds a hang.
fn config(url: &str) -> LlmConfig {
    LlmConfig::new(url, "test-model").with_request_timeout(Some(Duration::from_secs(30)))
}

/// An episode of `task` with `seed`, `profile`'s faults, under `method`.
fn spec(task: TaskKind, seed: u64, profile: FaultProfile, method: Method) -> EpisodeSpec {
    EpisodeSpec { task: task.instance(seed), profile, seed, method, settings: Settings::default() }
}

#[tokio::test]
async fn the_model_recovers_from_its_mistakes_and_nothing_runs_twice() {
    let seed = 42;
    let spec =
        spec(TaskKind::ActivateCustomer, seed, FaultProfile::NONE, Method::VerifyBeforeRetry);
    let Task::ActivateCustomer(t) = spec.task else { unreachable!() };
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
    let episode = run_episode(&config(&url), &spec, None).await.expect("an episode");

    assert!(episode.claimed_success && episode.success && !episode.duplicate, "{episode}");
    assert_eq!((episode.turns, episode.resent), (8, 0));
    assert_eq!(episode.calls.len(), 7);
    // Three dispatches: create, activate, welcome. The bad calls and the
    // repeated id dispatched nothing.
    assert_eq!(episode.dispatches, 3, "{episode}");
    assert!(episode.detail().ends_with("answer: SUCCESS: the customer is active and welcomed."));

    let requests = requests.lock().unwrap();
    assert_eq!(requests.len(), 8);
    for request in requests.iter() {
        assert_eq!(request["model"], "test-model");
        assert_eq!(request["temperature"], 0.0);
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

/// The arm's tool layer decides what a lost answer becomes: with no settle
/// margin the engine leaves the call `Unknown` and the planner re-issues it
/// with its id (verified, not sent again); the retry-only arm sends it
/// again, blindly, and the late first attempt lands too.
#[tokio::test(start_paused = true)]
async fn a_call_in_doubt_is_handled_by_the_arm_s_tool_layer() {
    let seed = in_doubt_seed();
    let profile = FaultLevel::Extreme.profile();
    let unsettled = spec(TaskKind::ActivateCustomer, seed, profile, Method::VbrNeitherUnsettled);
    let Task::ActivateCustomer(t) = unsettled.task else { unreachable!() };
    let args = format!("{{\"customer\": {}}}", t.customer.0);
    let (url, requests) =
        scripted(vec![call("call_a", "create_customer", &args), answer("FAILURE: stopping here.")])
            .await;
    // No request timer: on paused time it would fire while the socket waits.
    let config = LlmConfig::new(&url, "test-model")
        .with_request_timeout(None)
        .with_reissues(1, Duration::from_secs(6));
    let episode = run_episode(&config, &unsettled, None).await.expect("an episode");

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
    let episode = run_episode(&config, &unsettled, None).await.expect("an episode");
    assert_eq!(episode.calls[0].outcome.status, Status::Unknown);
    let shown = tool_result(&requests.lock().unwrap()[1], "call_a");
    assert_eq!(shown["status"], "unknown");
    assert!(shown["instruction"].as_str().unwrap().starts_with("Do not repeat this call"));

    // Retry-only: the attempt that timed out is sent again without a key
    // or a look, and its answer believed (the late first one reaches the
    // server after its deadline, which this server honours: dropped).
    let blind = spec(TaskKind::ActivateCustomer, seed, profile, Method::RetryOnly);
    let (url, _) =
        scripted(vec![call("call_a", "create_customer", &args), answer("FAILURE")]).await;
    let config = LlmConfig::new(&url, "m")
        .with_request_timeout(None)
        .with_reissues(1, Duration::from_secs(6));
    let episode = run_episode(&config, &blind, None).await.expect("an episode");
    assert_eq!(episode.calls[0].reissued, 0, "{episode}");
    assert_eq!(episode.verifier_reads, 0);
    assert_eq!(episode.dispatches, 2, "{episode}");
    assert_eq!(episode.calls[0].outcome.proof, Some(Proof::Response), "{episode}");
}

#[tokio::test(start_paused = true)]
async fn server_errors_are_sent_again_after_a_doubling_pause() {
    let spec = spec(TaskKind::RecordInvoice, 1, FaultProfile::NONE, Method::VerifyBeforeRetry);
    let config = |url: &str| {
        LlmConfig::new(url, "m").with_request_timeout(None).with_retries(3, Duration::from_secs(2))
    };
    // Two 503s, the second with a Retry-After, then an answer: 2 s, then
    // the server's 7 s.
    let (url, requests) = scripted(vec![
        unavailable(),
        Reply::Raw(503, "Retry-After: 7\r\n", "busy".into()),
        answer("FAILURE: nothing to do."),
    ])
    .await;
    let started = tokio::time::Instant::now();
    let episode = run_episode(&config(&url), &spec, None).await.expect("an episode");
    let waited = started.elapsed();
    assert_eq!((episode.turns, episode.resent, requests.lock().unwrap().len()), (1, 2, 3));
    assert!(waited >= Duration::from_secs(9) && waited < Duration::from_secs(10), "{waited:?}");

    // A server that keeps failing: four requests (2 + 4 + 8 s apart), then
    // the last error, and how many were sent.
    let (url, requests) = scripted(vec![unavailable(); 4]).await;
    let started = tokio::time::Instant::now();
    match run_episode(&config(&url), &spec, None).await {
        Err(LlmError::Exhausted { attempts: 4, last }) => {
            assert!(
                matches!(*last, LlmError::Status { status: 503, ref body } if body.contains("loading model"))
            );
        }
        other => panic!("expected 4 attempts ending in a 503, got {other:?}"),
    }
    let waited = started.elapsed();
    assert!(waited >= Duration::from_secs(14) && waited < Duration::from_secs(15), "{waited:?}");
    assert_eq!(requests.lock().unwrap().len(), 4);

    // A refusal a re-send would not change: at once.
    let (url, requests) = scripted(vec![Reply::Json(404, json!({"error": "no such model"}))]).await;
    let error = run_episode(&config(&url), &spec, None).await.expect_err("a 404");
    assert!(matches!(error, LlmError::Status { status: 404, .. }), "{error}");
    assert_eq!(requests.lock().unwrap().len(), 1);

    let https = LlmConfig::new("https://api.example.com/v1", "m");
    assert!(matches!(run_episode(&https, &spec, None).await, Err(LlmError::BaseUrl(_))));
}

#[tokio::test]
async fn a_request_that_hangs_times_out_and_is_sent_again() {
    let spec = spec(TaskKind::RecordInvoice, 1, FaultProfile::NONE, Method::VerifyBeforeRetry);
    // 2 s: the margin of the answer that follows the hang, on a loaded
    // machine (it is local, and takes milliseconds).
    let (url, requests) = scripted(vec![Reply::Hang, answer("FAILURE: gave up.")]).await;
    let config = LlmConfig::new(&url, "m")
        .with_request_timeout(Some(Duration::from_secs(2)))
        .with_retries(1, Duration::from_millis(10));
    let episode = run_episode(&config, &spec, None).await.expect("an episode");
    assert_eq!((episode.resent, requests.lock().unwrap().len()), (1, 2));
    assert_eq!(episode.final_message.as_deref(), Some("FAILURE: gave up."));

    // Hangs every time: the timeout is the last error. Nothing needs to
    // answer in time here, so the limit can be short.
    let (url, requests) = scripted(vec![Reply::Hang, Reply::Hang]).await;
    let config = LlmConfig::new(&url, "m")
        .with_request_timeout(Some(Duration::from_millis(300)))
        .with_retries(1, Duration::from_millis(10));
    match run_episode(&config, &spec, None).await {
        Err(LlmError::Exhausted { attempts: 2, last }) => {
            assert!(matches!(*last, LlmError::Timeout(_)), "{last}");
        }
        other => panic!("expected two timeouts, got {other:?}"),
    }
    assert_eq!(requests.lock().unwrap().len(), 2);
}

#[tokio::test(start_paused = true)]
async fn a_broken_answer_is_asked_again_and_never_shown_to_the_model() {
    let spec = spec(TaskKind::RecordInvoice, 1, FaultProfile::NONE, Method::VerifyBeforeRetry);
    let nameless = json!({"choices": [{"message": {"role": "assistant", "tool_calls": [
        {"id": "call_1", "type": "function", "function": {"arguments": "{}"}}
    ]}}]});
    let (url, requests) = scripted(vec![
        Reply::Json(200, nameless),
        Reply::Json(200, json!({"object": "list"})),
        Reply::Raw(200, "", "<html>502 Bad Gateway</html>".into()),
        call("call_2", "read_record", "{\"record\": 1}"),
        answer("FAILURE"),
    ])
    .await;
    let config = LlmConfig::new(&url, "m")
        .with_request_timeout(None)
        .with_retries(3, Duration::from_secs(1));
    let episode = run_episode(&config, &spec, None).await.expect("an episode");
    assert_eq!((episode.turns, episode.resent, episode.calls.len()), (2, 3, 1), "{episode}");
    let requests = requests.lock().unwrap();
    // The same conversation four times: nothing of the broken answers in it.
    for again in &requests[1..4] {
        assert_eq!(again["messages"], requests[0]["messages"]);
    }
    assert_eq!(requests[0]["messages"].as_array().unwrap().len(), 2);
    assert_eq!(tool_result(&requests[4], "call_2")["status"], "success");
}

#[tokio::test]
async fn a_text_answer_with_no_tool_call_ends_the_episode_and_is_kept() {
    let spec = spec(TaskKind::ActivateCustomer, 7, FaultProfile::NONE, Method::VerifyBeforeRetry);
    let (url, requests) =
        scripted(vec![answer("I have created the customer and welcomed them.")]).await;
    let episode = run_episode(&config(&url), &spec, None).await.expect("an episode");
    // Claimed nothing (no SUCCESS), did nothing: the answer is what tells.
    assert!(!episode.claimed_success && !episode.success, "{episode}");
    assert_eq!((episode.turns, episode.calls.len(), episode.dispatches), (1, 0, 0));
    let said = "I have created the customer and welcomed them.";
    assert_eq!(episode.final_message.as_deref(), Some(said));
    assert_eq!(episode.detail(), format!("\n  answer: {said}"));
    assert_eq!(requests.lock().unwrap().len(), 1);

    // The turn budget ends an episode that never answers, without a claim;
    // reads are not recorded in the ledger: the same read id reads again.
    let (url, _) = scripted(vec![call("r1", "read_record", "{\"record\": 1}"); 3]).await;
    let invoice = EpisodeSpec { task: TaskKind::RecordInvoice.instance(1), ..spec };
    let episode =
        run_episode(&config(&url).with_max_turns(3), &invoice, None).await.expect("an episode");
    assert_eq!((episode.turns, episode.final_message.as_deref()), (3, None));
    assert!(!episode.claimed_success && !episode.success);
    assert_eq!(episode.dispatches, 3);
    assert!(episode.calls.iter().all(|c| c.outcome.proof == Some(Proof::Response)));
    assert!(episode.detail().ends_with("answer: none (the turns ran out)"));
}

/// A model of one plan for any task: a read, then an honest failure.
fn reader(request: &Value) -> Reply {
    let answered = request["messages"].as_array().unwrap().iter().any(|m| m["role"] == "tool");
    if answered {
        answer("FAILURE: I only looked.")
    } else {
        call("", "read_record", "{\"record\": 1}")
    }
}

#[test]
fn a_grid_records_an_episode_the_server_failed_and_goes_on() {
    let server = tokio::runtime::Runtime::new().unwrap();
    // The first episode's two requests fail; everything after answers.
    let (url, _) =
        server.block_on(serve(|n, request| if n < 2 { unavailable() } else { reader(request) }));
    let llm = config(&url).with_retries(1, Duration::from_millis(10));
    let grid = Config {
        episodes: 1,
        tasks: vec![TaskKind::ActivateCustomer],
        levels: vec![FaultLevel::Low],
        methods: vec![Method::RetryOnly, Method::VerifyBeforeRetry],
        threads: 1,
        ..Config::default()
    };
    let mut told = Vec::new();
    let run = run_grid(&llm, &grid, &mut |e| told.push((e.method, e.result.is_ok())))
        .expect("the run completes");
    assert_eq!(told, [(Method::RetryOnly, false), (Method::VerifyBeforeRetry, true)]);
    assert_eq!(run.failed.len(), 1);
    let (_, _, method, _, error) = &run.failed[0];
    assert_eq!(*method, Method::RetryOnly);
    assert!(error.contains("HTTP 503") && error.contains("gave up after 2 requests"), "{error}");
    let episodes: Vec<_> = run.results.cells.iter().map(|c| (c.method, c.stats.episodes)).collect();
    assert_eq!(episodes, [(Method::RetryOnly, 0), (Method::VerifyBeforeRetry, 1)]);
    assert_eq!((run.episodes(), run.total().claimed), (2, 0));
}

#[test]
fn a_grid_with_threads_runs_episodes_at_once_and_scores_them_all() {
    let server = tokio::runtime::Runtime::new().unwrap();
    let (url, requests) = server.block_on(serve(|_, request| reader(request)));
    let grid = Config {
        episodes: 3,
        tasks: vec![TaskKind::RecordInvoice],
        levels: vec![FaultLevel::Medium],
        methods: vec![Method::KeysOnly, Method::VerifyOnly],
        threads: 4,
        ..Config::default()
    };
    let mut seeds = Vec::new();
    let run = run_grid(&config(&url), &grid, &mut |e| seeds.push((e.method, e.seed)))
        .expect("the run completes");
    seeds.sort();
    let first = verified_tools::sim::BASE_SEED;
    let mut expected: Vec<_> = [Method::KeysOnly, Method::VerifyOnly]
        .into_iter()
        .flat_map(|m| (first..first + 3).map(move |seed| (m, seed)))
        .collect();
    expected.sort();
    assert_eq!(seeds, expected);
    assert!(run.failed.is_empty());
    assert!(run.results.cells.iter().all(|c| c.stats.episodes == 3));
    assert_eq!(requests.lock().unwrap().len(), 12);
}

#[test]
fn the_agent_runs_every_method_against_a_server_that_fails_every_third_request() {
    let server = tokio::runtime::Runtime::new().unwrap();
    let failed = Arc::new(AtomicUsize::new(0));
    let counted = Arc::clone(&failed);
    let (url, requests) = server.block_on(serve(move |n, request| {
        if n % 3 == 2 {
            counted.fetch_add(1, Ordering::SeqCst);
            unavailable()
        } else {
            reader(request)
        }
    }));
    let dir = std::env::temp_dir().join(format!("vt-llm-planner-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let (json_path, svg_path) = (dir.join("cells.json"), dir.join("figure.svg"));
    let methods = [Method::RetryOnly, Method::VerifyBeforeRetry, Method::VbrNeither];
    let names: Vec<_> = methods.iter().map(|m| m.name()).collect();
    let args = <agent_example::Args as clap::Parser>::try_parse_from([
        "agent",
        "--planner",
        "openai",
        "--model",
        "scripted",
        "--base-url",
        &url,
        "--methods",
        &names.join(","),
        "--tasks",
        "activate_customer",
        "--levels",
        "low,high",
        "--episodes",
        "2",
        "--backoff",
        "0.01",
        "--request-timeout",
        "30",
        "--detail",
        "--json",
        json_path.to_str().unwrap(),
        "--svg",
        svg_path.to_str().unwrap(),
    ])
    .expect("the options parse");
    let mut out = Vec::new();
    let code = agent_example::llm_main(args, &mut out);
    let out = String::from_utf8(out).unwrap();
    assert_eq!(code, std::process::ExitCode::SUCCESS, "{out}");

    // 12 episodes of two turns each; every third request failed, and was
    // sent again.
    let resent = failed.load(Ordering::SeqCst);
    assert_eq!(requests.lock().unwrap().len(), 24 + resent);
    assert_eq!(resent, (24 + resent) / 3);
    let tally = format!(
        "12 finished: 0 succeeded, 0 claimed success (0 falsely), 0 with a duplicate effect; \
         0 failed (the model server kept failing); {resent} requests re-sent."
    );
    assert!(out.contains(&tally), "{out}");
    for method in methods {
        let lines = out.lines().filter(|l| l.contains(&format!(" {} seed ", method.label())));
        assert_eq!(lines.count(), 4, "{method}: {out}");
    }
    // --detail: each episode's calls and the model's final answer.
    assert_eq!(out.matches("\n  answer: FAILURE: I only looked.").count(), 12, "{out}");
    // The JSON and the figure, from the same cells.
    let doc: Value = serde_json::from_str(&std::fs::read_to_string(&json_path).unwrap()).unwrap();
    assert_eq!(doc["cells"].as_array().unwrap().len(), 6);
    assert!(doc["cells"].as_array().unwrap().iter().all(|c| c["episodes"] == 2));
    assert_eq!(doc["planner"]["requests_resent"], resent);
    assert_eq!(doc["planner"]["episodes_failed"], json!([]));
    let svg = std::fs::read_to_string(&svg_path).unwrap();
    for method in methods {
        assert!(svg.contains(method.label()) && !svg.contains(method.name()), "{method}");
    }
    let _ = std::fs::remove_dir_all(&dir);
}
