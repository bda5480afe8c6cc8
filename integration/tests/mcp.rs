//! The simulator's tools over MCP, tested with real clients:
//!
//! - rmcp's own client, in-process over a duplex pipe, on paused time;
//! - the official Python MCP SDK over stdio, against the built
//!   `mcp_server` binary of this package (`tests/mcp_client.py`), when `VT_MCP_PYTHON`
//!   names a python with the `mcp` package (`.ci/python-mcp.sh` makes one;
//!   under `CI=true` its absence fails the test).
//!
//! Both list the tools (names, schemas, annotations), make a call whose
//! answer the simulator loses (a late arrival: the client gets a structured
//! in-doubt result with the key), repeat a call with the same tool-call id
//! (replayed, not executed again), and repeat the call in doubt once its
//! late arrival has landed (verified, not executed again).

use test_support as support;

use std::path::PathBuf;
use std::process::Command;
use std::time::Duration;

use rmcp::ServiceExt as _;
use rmcp::model::{CallToolRequestParams, RequestMetaObject};
use serde_json::{Value, json};
use verified_tools::mcp::{McpServer, TOOL_CALL_ID_META};
use verified_tools::sim::{CustomerId, FaultDraw, FaultLevel, Op, SimConfig, SimServer, Timeout};
use verified_tools_suite::llm::tool_set;
use verified_tools_suite::tools::SimClient;

const LEVEL: FaultLevel = FaultLevel::Extreme;

/// The first seed at `LEVEL` whose first `create_customer` is a late
/// arrival landing 4 to 6 s after it was sent, without replica lag (so the
/// verifier, which gives up about 2 s after the call, cannot see it yet,
/// even on a loaded machine, and sees it once it landed), and whose second
/// `create_customer` has no fault.
fn in_doubt_seed() -> (u64, Duration) {
    let profile = LEVEL.profile();
    let window = Duration::from_secs(4)..=Duration::from_secs(6);
    (0..1_000_000)
        .find_map(|seed| {
            let first = profile.draw(seed, Op::CreateCustomer, 0);
            let second = profile.draw(seed, Op::CreateCustomer, 1);
            match (first.timeout, first.lag, second) {
                (Some(Timeout::Late(delay)), None, clean)
                    if window.contains(&delay) && clean == FaultDraw::default() =>
                {
                    Some((seed, delay))
                }
                _ => None,
            }
        })
        .expect("some seed loses the first answer")
}

fn with_id(name: &'static str, arguments: Value, id: &str) -> CallToolRequestParams {
    let Value::Object(arguments) = arguments else { unreachable!("an object") };
    let mut meta = serde_json::Map::new();
    meta.insert(TOOL_CALL_ID_META.to_owned(), id.into());
    let mut params = CallToolRequestParams::new(name).with_arguments(arguments);
    params.meta = Some(RequestMetaObject::from(meta));
    params
}

/// `mcp` served in this process over a pipe, with rmcp's client at the
/// other end, and the task that serves it (it ends when the client closes).
async fn in_process<S: Send + Sync + 'static>(
    mcp: McpServer<S>,
) -> (rmcp::service::RunningService<rmcp::RoleClient, ()>, tokio::task::JoinHandle<()>) {
    let (server_io, client_io) = tokio::io::duplex(1 << 16);
    let serving = tokio::spawn(async move {
        let running = mcp.serve(server_io).await.expect("handshake");
        let _ = running.waiting().await;
    });
    (().serve(client_io).await.expect("the client connects"), serving)
}

#[tokio::test(start_paused = true)]
async fn rmcp_client_lists_calls_and_replays() {
    let (seed, late) = in_doubt_seed();
    let (server, oracle) = SimServer::new(SimConfig::new(seed, LEVEL.profile()));
    let mcp = McpServer::new(tool_set(SimClient::new(server, true)));
    let handle = mcp.clone();
    let dispatches = move || handle.tool_set().state().calls();
    let (client, serving) = in_process(mcp).await;

    // tools/list.
    let tools = client.list_all_tools().await.expect("tools/list");
    let names: Vec<&str> = tools.iter().map(|t| t.name.as_ref()).collect();
    assert_eq!(
        names,
        [
            "create_customer",
            "set_customer_status",
            "send_welcome",
            "read_customer",
            "update_invoice_row",
            "create_record",
            "update_record_fields",
            "set_record_status",
            "read_record"
        ]
    );
    let create = &tools[0];
    assert_eq!(create.description.as_deref(), Some("Creates the customer (status PENDING)."));
    assert_eq!(create.input_schema["required"], json!(["customer"]));
    assert_eq!(create.input_schema["properties"]["customer"]["type"], "integer");
    let hints = create.annotations.as_ref().expect("annotations");
    assert_eq!(
        (
            hints.read_only_hint,
            hints.destructive_hint,
            hints.idempotent_hint,
            hints.open_world_hint
        ),
        // MCP's definitions: `effect = "additive"` is not destructive, and
        // `key(customer)` makes it idempotent.
        (Some(false), Some(false), Some(true), Some(true))
    );
    let status = tools[1].annotations.as_ref().expect("annotations");
    // `effect = "overwrite"`: destructive (the old value is gone), and
    // idempotent (the same value written again changes nothing more).
    assert_eq!((status.destructive_hint, status.idempotent_hint), (Some(true), Some(true)));
    let read = tools[3].annotations.as_ref().expect("annotations");
    assert_eq!((read.read_only_hint, read.destructive_hint), (Some(true), None));
    let output = create.output_schema.as_ref().expect("Customer has a schema");
    assert_eq!(
        output["properties"]["value"]["properties"]["status"]["oneOf"][1]["const"],
        "ACTIVE"
    );

    // The simulator loses the first answer: in doubt, with the key.
    let lost = client
        .call_tool(with_id("create_customer", json!({"customer": 1001}), "call-doubt"))
        .await
        .expect("tools/call");
    assert_eq!(lost.is_error, Some(true));
    let doubt = lost.structured_content.clone().expect("structured");
    assert_eq!(doubt["status"], "unknown", "{doubt}");
    let key = doubt["key"].as_str().expect("a key").to_owned();
    assert!(doubt["instruction"].as_str().unwrap().contains(&key));
    assert_eq!(dispatches(), 1);
    assert!(oracle.truth().customer(CustomerId(1001)).is_none(), "still on its way");

    // A clean call (its OK answer read back, as for every high tool), and
    // the same tool call again: replayed, not executed.
    let first = client
        .call_tool(with_id("create_customer", json!({"customer": 1002}), "call-clean"))
        .await
        .expect("tools/call");
    let first = first.structured_content.expect("structured");
    assert_eq!((&first["status"], &first["proof"]), (&json!("success"), &json!("verifier")));
    let again = client
        .call_tool(with_id("create_customer", json!({"customer": 1002}), "call-clean"))
        .await
        .expect("tools/call");
    assert_eq!(again.is_error, Some(false));
    let again = again.structured_content.expect("structured");
    assert_eq!(again["proof"], "ledger");
    assert_eq!((&again["key"], &again["value"]), (&first["key"], &first["value"]));
    assert_eq!(dispatches(), 2);

    // Without an id the call is keyed by its arguments and time bucket.
    let plain = CallToolRequestParams::new("read_customer")
        .with_arguments(json!({"customer": 1002}).as_object().unwrap().clone());
    let seen = client.call_tool(plain).await.expect("tools/call");
    assert_eq!(seen.structured_content.expect("structured")["value"]["id"], 1002);

    // Bad arguments are a tool error; an unknown tool a protocol error.
    let bad = client
        .call_tool(with_id("create_customer", json!({"customer": "x"}), "call-bad"))
        .await
        .expect("tools/call");
    assert_eq!(bad.is_error, Some(true));
    assert_eq!(bad.structured_content.expect("structured")["status"], "invalid_arguments");
    let unknown = client.call_tool(CallToolRequestParams::new("create_client")).await;
    let error = format!("{:?}", unknown.expect_err("a protocol error"));
    assert!(error.contains("-32602") || error.contains("InvalidParams"), "{error}");
    assert!(error.contains("there is no tool named `create_client`"), "{error}");

    // Once the late arrival has landed, the call in doubt repeated with its
    // id is verified, not executed again.
    tokio::time::sleep(late).await;
    let resolved = client
        .call_tool(with_id("create_customer", json!({"customer": 1001}), "call-doubt"))
        .await
        .expect("tools/call");
    assert_eq!(resolved.is_error, Some(false));
    let resolved = resolved.structured_content.expect("structured");
    assert_eq!((&resolved["proof"], &resolved["key"]), (&json!("verifier"), &json!(key)));
    assert_eq!(dispatches(), 3, "the read, and nothing more");
    let truth = oracle.truth();
    assert_eq!(truth.applied(Op::CreateCustomer, 1001).applied, 1);
    assert_eq!(truth.applied(Op::CreateCustomer, 1002).applied, 1);

    client.cancel().await.expect("the client closes");
    serving.await.expect("the server ends");
}

/// A tool defined at run time (as a gateway would, from another server's
/// `tools/list`): a counter that adds what it is asked to, once per key.
mod run_time {
    use std::sync::Mutex;

    use serde_json::{Value, json};
    use verified_tools::engine::{self, Attempt};
    use verified_tools::toolset::{DynTool, JsonObject, ToolFuture, ToolOutcome, json_payload};
    use verified_tools::{Context, IdempotencyKey, SideEffect, Tool, ToolSpec, Verdict};

    /// What the upstream applied, by key.
    #[derive(Default)]
    pub struct Counter(pub Mutex<Vec<(IdempotencyKey, i64)>>);

    pub struct Add(pub &'static ToolSpec, pub JsonObject);

    struct Adding<'a>(&'static ToolSpec, &'a Counter, i64);

    impl Tool for Adding<'_> {
        type Output = i64;
        type Error = std::io::Error;
        fn spec(&self) -> &'static ToolSpec {
            self.0
        }
        async fn dispatch(&mut self, attempt: Attempt) -> Result<i64, std::io::Error> {
            let mut applied = self.1.0.lock().unwrap();
            applied.push((attempt.key, self.2));
            Ok(applied.iter().map(|(_, n)| n).sum())
        }
        async fn verify(&mut self, key: IdempotencyKey) -> Verdict<i64> {
            let applied = self.1.0.lock().unwrap();
            match applied.iter().any(|(k, _)| *k == key) {
                true => Verdict::Holds(applied.iter().map(|(_, n)| n).sum()),
                false => Verdict::Absent,
            }
        }
    }

    impl DynTool<Counter> for Add {
        fn spec(&self) -> &'static ToolSpec {
            self.0
        }
        fn input_schema(&self) -> JsonObject {
            self.1.clone()
        }
        fn call<'a>(&'a self, cx: &'a Context, up: &'a Counter, args: &'a Value) -> ToolFuture<'a> {
            Box::pin(async move {
                let payload = match json_payload(self.0, args) {
                    Ok(payload) => payload,
                    Err(error) => return ToolOutcome::invalid_arguments(&error),
                };
                let n = args["n"].as_i64().unwrap_or(0);
                ToolOutcome::from_result(
                    engine::run(cx, Adding(self.0, up, n), &payload, args).await,
                )
            })
        }
    }

    pub fn add_tool() -> Add {
        static ADD: ToolSpec = ToolSpec::new("add", SideEffect::High)
            .with_verifier()
            .with_description("Adds n to the counter.");
        let schema = json!({"type": "object", "properties": {"n": {"type": "integer"}}});
        Add(&ADD, schema.as_object().unwrap().clone())
    }
}

#[tokio::test(start_paused = true)]
async fn rmcp_client_lists_and_calls_a_tool_defined_at_run_time() {
    let set = verified_tools::toolset::ToolSet::new(run_time::Counter::default())
        .with_dyn(run_time::add_tool());
    let mcp = McpServer::new(set);
    let handle = mcp.clone();
    let (client, serving) = in_process(mcp).await;

    let tools = client.list_all_tools().await.expect("tools/list");
    assert_eq!(tools.len(), 1);
    assert_eq!(
        (tools[0].name.as_ref(), tools[0].description.as_deref()),
        ("add", Some("Adds n to the counter."))
    );
    assert_eq!(tools[0].input_schema["properties"]["n"]["type"], "integer");
    let hints = tools[0].annotations.as_ref().expect("annotations");
    assert_eq!((hints.read_only_hint, hints.destructive_hint), (Some(false), Some(true)));

    let first =
        client.call_tool(with_id("add", json!({"n": 5}), "call-1")).await.expect("tools/call");
    let first = first.structured_content.expect("structured");
    assert_eq!((&first["status"], &first["value"]), (&json!("success"), &json!(5)));
    let again =
        client.call_tool(with_id("add", json!({"n": 5}), "call-1")).await.expect("tools/call");
    let again = again.structured_content.expect("structured");
    assert_eq!((&again["proof"], &again["key"]), (&json!("ledger"), &first["key"]));
    assert_eq!(handle.tool_set().state().0.lock().unwrap().len(), 1, "replayed, not added again");

    client.cancel().await.expect("the client closes");
    serving.await.expect("the server ends");
}

/// The python of `VT_MCP_PYTHON` and the built server, or `None` (after
/// saying what is missing; a failure under `CI=true`).
fn python_and_server() -> Option<(std::ffi::OsString, PathBuf)> {
    let Some(python) = std::env::var_os("VT_MCP_PYTHON") else {
        support::missing(
            "the Python MCP SDK",
            "run `export VT_MCP_PYTHON=$(bash .ci/python-mcp.sh)` (a venv with `mcp`), \
             as `.ci/run` does",
        );
        return None;
    };
    Some((python, PathBuf::from(env!("CARGO_BIN_EXE_mcp_server"))))
}

/// Runs `tests/mcp_client.py` with `args` and checks its summary.
fn run_python_client(python: &std::ffi::OsStr, args: &[&std::ffi::OsStr], late: Duration) {
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/mcp_client.py");
    let output = Command::new(python)
        .arg(script)
        .args(args)
        .args(["--late-ms", &late.as_millis().to_string()])
        .output()
        .unwrap_or_else(|e| panic!("cannot run {}: {e}", PathBuf::from(python).display()));
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "mcp_client.py failed:\n{stdout}\n{stderr}");
    let summary: Value =
        serde_json::from_str(stdout.lines().last().unwrap_or_default()).expect("a JSON summary");
    assert_eq!(summary["ok"], true);
    assert_eq!(summary["in_doubt"]["structuredContent"]["status"], "unknown");
    assert_eq!(summary["in_doubt"]["isError"], true);
    assert_eq!(summary["replay"]["proof"], "ledger");
    assert_eq!(summary["resolved"]["proof"], "verifier");
    assert_eq!(summary["resolved"]["key"], summary["in_doubt"]["structuredContent"]["key"]);
}

#[test]
fn python_sdk_client_over_stdio() {
    let Some((python, server)) = python_and_server() else { return };
    let (seed, late) = in_doubt_seed();
    let seed = seed.to_string();
    let args: Vec<&std::ffi::OsStr> = vec![
        "--server".as_ref(),
        server.as_os_str(),
        "--level".as_ref(),
        LEVEL.name().as_ref(),
        "--seed".as_ref(),
        seed.as_ref(),
    ];
    run_python_client(&python, &args, late);
}

/// The server, until dropped.
struct Child(std::process::Child);

impl Drop for Child {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[test]
fn python_sdk_client_over_streamable_http() {
    let Some((python, server)) = python_and_server() else { return };
    let (seed, late) = in_doubt_seed();
    let seed = seed.to_string();
    let (_child, url) = http_server(&server, &["--level", LEVEL.name(), "--seed", &seed]);
    let args: Vec<&std::ffi::OsStr> =
        vec!["--url".as_ref(), url.as_ref(), "--seed".as_ref(), seed.as_ref()];
    run_python_client(&python, &args, late);
}

/// Runs `tests/mcp_identity.py` with `args`: the SDK's cancel-and-re-send,
/// ids in `_meta`, SEP-3182 keys, deliberate repeats, business keys, and
/// (over HTTP) a second session.
fn run_python_identity(python: &std::ffi::OsStr, args: &[&std::ffi::OsStr]) -> Value {
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/mcp_identity.py");
    let output = Command::new(python)
        .arg(script)
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("cannot run {}: {e}", PathBuf::from(python).display()));
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "mcp_identity.py failed:\n{stdout}\n{stderr}");
    let summary: Value =
        serde_json::from_str(stdout.lines().last().unwrap_or_default()).expect("a JSON summary");
    assert_eq!(summary["ok"], true);
    assert_eq!(summary["resent_after_timeout"]["proof"], "ledger");
    assert_eq!(summary["idempotency_key"]["proof"], "ledger");
    summary
}

/// The server over streamable HTTP on a free port, and its URL.
fn http_server(server: &std::path::Path, args: &[&str]) -> (Child, String) {
    use std::io::BufRead as _;
    let mut child = Child(
        Command::new(server)
            .args(["--http", "127.0.0.1:0"])
            .args(args)
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .expect("the server starts"),
    );
    // "mcp_server: 10 tools over streamable HTTP at http://127.0.0.1:PORT/mcp (..)"
    let stderr = child.0.stderr.take().expect("piped");
    let mut stderr = std::io::BufReader::new(stderr);
    // Lines before it say how the server authenticates.
    let mut line = String::new();
    while !line.contains("http://") {
        line.clear();
        let read = stderr.read_line(&mut line).expect("the server's stderr");
        assert!(read > 0, "the server ended before it gave its URL");
    }
    // The rest is drained, so that the server never writes to a closed pipe.
    std::thread::spawn(move || std::io::copy(&mut stderr, &mut std::io::sink()));
    let url = line
        .split_whitespace()
        .find(|w| w.starts_with("http://"))
        .unwrap_or_else(|| panic!("no URL in {line:?}"))
        .to_owned();
    (child, url)
}

#[test]
fn python_sdk_identity_over_stdio() {
    let Some((python, server)) = python_and_server() else { return };
    let summary = run_python_identity(&python, &["--server".as_ref(), server.as_os_str()]);
    assert_eq!(summary["transport"], "stdio");
}

#[test]
fn python_sdk_identity_over_streamable_http() {
    let Some((python, server)) = python_and_server() else { return };
    let (_child, url) = http_server(&server, &["--level", "none", "--latency-ms", "800"]);
    let summary = run_python_identity(&python, &["--url".as_ref(), url.as_ref()]);
    assert_eq!(summary["second_session"], true);
}
