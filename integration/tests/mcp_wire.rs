//! The wire below rmcp, over stdio-style lines, in-process: the simulator's
//! tools served by `verified_tools::mcp::serve_lines` over duplex pipes,
//! driven with raw lines (what a host writes on the server's stdin). Every
//! request gets its answer, in order, and the server keeps serving after
//! each bad line; notifications are never answered.

use std::time::Duration;

use serde_json::{Value, json};
use tokio::io::{AsyncBufReadExt as _, AsyncWriteExt as _, BufReader, DuplexStream, Lines};
use verified_tools::mcp::rmcp::service::QuitReason;
use verified_tools::mcp::{IDEMPOTENCY_KEY_META, McpServer, serve_lines};
use verified_tools::sim::{FaultDraw, FaultLevel, Op, SimConfig, SimServer};
use verified_tools_suite::llm::tool_set;
use verified_tools_suite::tools::SimClient;

/// The line limit of the served wire: small, so that a line over it is
/// cheap to send.
const LIMIT: usize = 64 * 1024;

/// How long any one answer may take (the machine may be loaded; on paused
/// time this only bounds a hang).
const ANSWER: Duration = Duration::from_secs(30);

/// The first seed whose first two `create_customer` calls meet no fault.
fn clean_seed() -> u64 {
    let profile = FaultLevel::Low.profile();
    (0..1_000_000)
        .find(|&seed| {
            (0..2).all(|n| profile.draw(seed, Op::CreateCustomer, n) == FaultDraw::default())
        })
        .expect("some seed is clean")
}

struct Host {
    input: DuplexStream,
    output: Lines<BufReader<DuplexStream>>,
}

impl Host {
    async fn send(&mut self, line: &str) {
        self.send_bytes(format!("{line}\n").as_bytes()).await;
    }

    async fn send_bytes(&mut self, bytes: &[u8]) {
        tokio::time::timeout(ANSWER, self.input.write_all(bytes))
            .await
            .expect("the server reads its input")
            .expect("the input is open");
    }

    async fn answer(&mut self) -> Value {
        let line = tokio::time::timeout(ANSWER, self.output.next_line())
            .await
            .expect("an answer in time")
            .expect("the output is readable")
            .expect("an answer, not the end of the output");
        serde_json::from_str(&line).unwrap_or_else(|e| panic!("{e}: {line}"))
    }

    /// Sends `line` and reads the next answer, which must be to `id`.
    async fn ask(&mut self, line: &str, id: Value) -> Value {
        self.send(line).await;
        let answer = self.answer().await;
        assert_eq!(answer["jsonrpc"], "2.0", "{answer}");
        assert_eq!(answer["id"], id, "{line}\n-> {answer}");
        answer
    }

    /// The server still answers: a `ping` with `id` gets its empty result.
    async fn ping(&mut self, id: u64) {
        let pong = self
            .ask(&json!({"jsonrpc": "2.0", "id": id, "method": "ping"}).to_string(), json!(id))
            .await;
        assert_eq!(pong["result"], json!({}), "{pong}");
    }
}

fn code(answer: &Value) -> i64 {
    answer["error"]["code"].as_i64().unwrap_or_else(|| panic!("an error: {answer}"))
}

#[tokio::test(start_paused = true)]
async fn stdio_answers_every_line_and_keeps_serving() {
    let (server, _oracle) = SimServer::new(SimConfig::new(clean_seed(), FaultLevel::Low.profile()));
    let mcp = McpServer::new(tool_set(SimClient::new(server, true)));
    let (input, server_input) = tokio::io::duplex(1 << 16);
    let (server_output, output) = tokio::io::duplex(1 << 16);
    let serving = tokio::spawn(serve_lines(mcp, server_input, server_output, LIMIT));
    let mut host = Host { input, output: BufReader::new(output).lines() };

    // The handshake, as any host does it.
    let initialize = json!({
        "jsonrpc": "2.0",
        "id": 1,
        "method": "initialize",
        "params": {
            "protocolVersion": "2025-06-18",
            "capabilities": {},
            "clientInfo": {"name": "mcp_wire", "version": "0"}
        }
    });
    let initialized = host.ask(&initialize.to_string(), json!(1)).await;
    assert_eq!(initialized["result"]["serverInfo"]["name"], "verified-tools", "{initialized}");
    host.send(r#"{"jsonrpc":"2.0","method":"notifications/initialized"}"#).await;

    // Not JSON: a parse error, id null.
    let garbage = host.ask("garbage", Value::Null).await;
    assert_eq!(code(&garbage), -32700);

    // JSON-RPC 1.0: an invalid request, with its id.
    let old = host.ask(r#"{"jsonrpc":"1.0","id":3,"method":"ping"}"#, json!(3)).await;
    assert_eq!(code(&old), -32600);
    assert!(old["error"]["message"].as_str().unwrap().contains("jsonrpc"), "{old}");

    // 129 levels deep: refused with the limit, id null (a bare array has
    // none); a request nested too deep in its params, with its id.
    let deep = format!("{}{}", "[".repeat(129), "]".repeat(129));
    let refused = host.ask(&deep, Value::Null).await;
    assert_eq!((code(&refused), &refused["error"]["data"]), (-32600, &json!({"maxDepth": 127})));
    let deep_params = format!(
        r#"{{"jsonrpc":"2.0","id":4,"method":"tools/call","params":{{"name":"read_customer","arguments":{{"customer":{}{}}}}}}}"#,
        "[".repeat(200),
        "]".repeat(200)
    );
    assert_eq!(code(&host.ask(&deep_params, json!(4)).await), -32600);

    // A malformed notification is not answered: the next answer is the
    // ping's.
    host.send(r#"{"jsonrpc":"1.0","method":"notifications/initialized"}"#).await;
    host.ping(40).await;

    // A line over the limit: refused with the id its start shows, and the
    // rest of it skipped up to its newline.
    let long = format!(
        r#"{{"jsonrpc":"2.0","id":5,"method":"tools/call","params":{{"name":"read_customer","arguments":{{"note":"{}"}}}}}}"#,
        "x".repeat(LIMIT * 3)
    );
    let too_long = host.ask(&long, json!(5)).await;
    assert_eq!(
        (code(&too_long), &too_long["error"]["data"]),
        (-32600, &json!({"maxBytes": LIMIT}))
    );
    host.ping(50).await;

    // SEP-3182: a tools/call with an idempotencyKey is delivered, and
    // answered as a tool result.
    let call = json!({
        "jsonrpc": "2.0",
        "id": 6,
        "method": "tools/call",
        "params": {
            "name": "create_customer",
            "arguments": {"customer": 2001},
            "idempotencyKey": "order-2001"
        }
    });
    let created = host.ask(&call.to_string(), json!(6)).await;
    assert!(created.get("error").is_none(), "{created}");
    assert_eq!(created["result"]["structuredContent"]["status"], "success", "{created}");

    // The same key in `_meta` as well: no conflict; another key: -32602.
    let mut agreeing = call.clone();
    agreeing["id"] = json!(7);
    agreeing["params"]["_meta"] = json!({IDEMPOTENCY_KEY_META: "order-2001"});
    let again = host.ask(&agreeing.to_string(), json!(7)).await;
    assert!(again.get("result").is_some(), "{again}");
    let mut disagreeing = call.clone();
    disagreeing["id"] = json!(8);
    disagreeing["params"]["_meta"] = json!({IDEMPOTENCY_KEY_META: "order-9"});
    let conflict = host.ask(&disagreeing.to_string(), json!(8)).await;
    assert_eq!(code(&conflict), -32602);
    assert!(conflict["error"]["message"].as_str().unwrap().contains("disagree"), "{conflict}");
    let mut empty = call.clone();
    empty["id"] = json!(9);
    empty["params"]["idempotencyKey"] = json!("");
    let empty = host.ask(&empty.to_string(), json!(9)).await;
    assert_eq!(code(&empty), -32602);
    assert!(empty["error"]["message"].as_str().unwrap().contains("idempotencyKey"), "{empty}");

    // A field given twice: a tool result the model can correct.
    let twice = host
        .ask(
            r#"{"jsonrpc":"2.0","id":10,"method":"tools/call","params":{"name":"create_customer","arguments":{"customer":2002,"customer":2003}}}"#,
            json!(10),
        )
        .await;
    assert_eq!(twice["result"]["isError"], true, "{twice}");
    let outcome = &twice["result"]["structuredContent"];
    assert_eq!(outcome["status"], "invalid_arguments");
    assert_eq!(outcome["error"], "field `customer` is given twice");
    assert_eq!(twice["result"]["content"][0]["text"], outcome.to_string());
    // Anywhere else: an invalid request naming the key.
    let meta_twice = host
        .ask(
            r#"{"jsonrpc":"2.0","id":11,"method":"ping","params":{"_meta":{"a":1,"a":2}}}"#,
            json!(11),
        )
        .await;
    assert_eq!(
        (code(&meta_twice), &meta_twice["error"]["data"]),
        (-32600, &json!({"path": "params._meta.a"}))
    );

    // Blank lines are skipped; CRLF line endings are read.
    host.send_bytes(b"\n\r\n").await;
    let crlf = r#"{"jsonrpc":"2.0","id":12,"method":"ping"}"#;
    host.send_bytes(format!("{crlf}\r\n").as_bytes()).await;
    assert_eq!(host.answer().await, json!({"jsonrpc": "2.0", "id": 12, "result": {}}));

    // And a valid ping at the end.
    host.ping(13).await;

    // The host closes the server's input: rmcp ends, and so does the output.
    drop(host.input);
    let reason = tokio::time::timeout(ANSWER, serving)
        .await
        .expect("the server ends")
        .expect("no panic")
        .expect("served");
    assert!(matches!(reason, QuitReason::Closed), "{reason:?}");
    assert!(host.output.next_line().await.expect("readable").is_none(), "no more output");
}
