//! The decision, message by message, and (in `serving`) the two transports
//! around it.

use std::time::Duration;

use rmcp::model::{
    CallToolRequestParams, CallToolResponse, CallToolResult, ServerCapabilities, ServerConfig,
};
use rmcp::service::RequestContext;
use rmcp::transport::streamable_http_server::StreamableHttpServerConfig;
use rmcp::{ErrorData, RoleServer};
use tokio::io::{AsyncBufReadExt as _, AsyncWriteExt as _};

use super::*;
use crate::mcp::McpServer;
use crate::toolset::ToolSet;

const LIMIT: usize = 1 << 16;

/// The reply of an answered message, parsed; panics on anything else.
fn reply(inspected: &Inspected) -> Value {
    match inspected {
        Inspected::Answer(Answer { reply: Some(reply), .. }) => {
            serde_json::from_slice(reply).expect("a reply is JSON")
        }
        other => panic!("expected a reply, got {other:?}"),
    }
}

/// The code and id of an error reply.
fn error(line: &str) -> (i64, Value) {
    let reply = reply(&inspect(line.as_bytes(), LIMIT));
    assert_eq!(reply["jsonrpc"], "2.0", "{reply}");
    let code = reply["error"]["code"].as_i64().unwrap_or_else(|| panic!("an error: {reply}"));
    (code, reply["id"].clone())
}

fn message(line: &str) -> String {
    let reply = reply(&inspect(line.as_bytes(), LIMIT));
    reply["error"]["message"].as_str().expect("a message").to_owned()
}

fn dropped(line: &[u8]) -> bool {
    matches!(inspect(line, LIMIT), Inspected::Answer(Answer { reply: None, .. }))
}

fn forwarded(line: &[u8]) -> Value {
    match inspect(line, LIMIT) {
        Inspected::Forward(bytes) => serde_json::from_slice(&bytes).expect("forwarded JSON"),
        other => panic!("expected to forward {}, got {other:?}", String::from_utf8_lossy(line)),
    }
}

fn nested(depth: usize) -> String {
    format!("{}{}", "[".repeat(depth), "]".repeat(depth))
}

#[test]
fn what_is_not_json_is_a_parse_error_with_a_null_id() {
    for line in [
        &b"garbage"[..],
        b"{\"jsonrpc\":\"2.0\",\"id\":1,",
        b"{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"ping\"} trailing",
        b"\xff\xfe{}",
        b"{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"p\xffng\"}",
        b"",
        b"  \r\n",
    ] {
        let inspected = inspect(line, LIMIT);
        let reply = reply(&inspected);
        assert_eq!(reply["error"]["code"], -32700, "{}: {reply}", String::from_utf8_lossy(line));
        assert_eq!(reply["id"], Value::Null);
        assert!(reply["error"]["message"].as_str().unwrap().starts_with("Parse error: "));
    }
}

#[test]
fn what_is_not_json_rpc_2_is_an_invalid_request_with_its_id() {
    let table: &[(&str, Value)] = &[
        (r#"{"jsonrpc":"1.0","id":3,"method":"ping"}"#, json!(3)),
        (r#"{"id":"a","method":"ping"}"#, json!("a")),
        (r#"{"jsonrpc":2.0,"id":4,"method":"ping"}"#, json!(4)),
        (r#"{"jsonrpc":"2.0","id":5}"#, json!(5)),
        (r#"{"jsonrpc":"2.0","id":6,"method":7}"#, json!(6)),
        (r#"{"jsonrpc":"2.0","id":7,"method":"ping","params":"x"}"#, json!(7)),
        (r#"{"jsonrpc":"2.0","id":8,"method":"ping","result":{}}"#, json!(8)),
        (r#"{"jsonrpc":"2.0","id":1.0,"method":"ping","params":1}"#, json!(1.0)),
        // An id that cannot be one is answered as unreadable.
        (r#"{"jsonrpc":"2.0","id":{"a":1},"method":"ping"}"#, Value::Null),
        (r#"{"jsonrpc":"2.0","id":null,"method":"ping"}"#, Value::Null),
        (r#"{"jsonrpc":"2.0","id":1.5,"method":"ping"}"#, Value::Null),
        (r#"{"jsonrpc":"2.0","id":true,"method":"ping"}"#, Value::Null),
        // Not an object at all.
        (r#"[{"jsonrpc":"2.0","id":1,"method":"ping"}]"#, Value::Null),
        ("[]", Value::Null),
        ("42", Value::Null),
        ("null", Value::Null),
        (r#""ping""#, Value::Null),
        (r#"{}"#, Value::Null),
        // JSON-RPC's own example: no id, but no string method either.
        (r#"{"jsonrpc":"2.0","method":1,"params":"bar"}"#, Value::Null),
    ];
    for (line, id) in table {
        assert_eq!(error(line), (-32600, id.clone()), "{line}");
    }
    assert_eq!(
        message(r#"{"jsonrpc":"1.0","id":3,"method":"ping"}"#),
        r#"Invalid request: `jsonrpc` must be "2.0", not "1.0""#
    );
    assert_eq!(
        message(r#"{"id":3,"method":"ping"}"#),
        r#"Invalid request: `jsonrpc` is missing: it must be "2.0""#
    );
    assert_eq!(message(r#"{"jsonrpc":"2.0","id":5}"#), "Invalid request: `method` is missing");
    assert!(message("[]").contains("batch"));
}

#[test]
fn malformed_notifications_and_responses_are_dropped() {
    for line in [
        r#"{"jsonrpc":"1.0","method":"notifications/initialized"}"#,
        r#"{"method":"notifications/initialized"}"#,
        r#"{"jsonrpc":"2.0","method":"notifications/cancelled","params":"x"}"#,
        r#"{"jsonrpc":"1.0","id":1,"result":{}}"#,
        r#"{"jsonrpc":"2.0","id":[1],"result":{}}"#,
        r#"{"jsonrpc":"2.0","method":"notifications/initialized","a":1,"a":2}"#,
        r#"{"jsonrpc":"2.0","id":1,"result":{"a":1,"a":2}}"#,
    ] {
        assert!(dropped(line.as_bytes()), "{line}: {:?}", inspect(line.as_bytes(), LIMIT));
    }
}

#[test]
fn good_messages_are_forwarded_as_they_came() {
    for line in [
        r#"{"jsonrpc":"2.0","id":1,"method":"ping"}"#,
        r#"{"jsonrpc":"2.0","id":"x","method":"tools/list","params":{}}"#,
        r#"{"jsonrpc":"2.0","method":"notifications/initialized"}"#,
        r#"{"jsonrpc":"2.0","id":1,"result":{}}"#,
        r#"{"jsonrpc":"2.0","id":1,"error":{"code":-1,"message":"no"}}"#,
        r#"{"jsonrpc":"2.0","id":2,"method":"tools/call","params":{"name":"t","arguments":{"n":1.5e300,"big":18446744073709551615}}}"#,
        // rmcp answers an unknown method itself (-32601), with the id.
        r#"{"jsonrpc":"2.0","id":3,"method":"no/such/method","params":{"x":1}}"#,
    ] {
        assert_eq!(inspect(line.as_bytes(), LIMIT), Inspected::Forward(line.as_bytes().to_vec()));
    }
}

#[test]
fn line_endings_and_a_byte_order_mark_are_stripped() {
    let ping = br#"{"jsonrpc":"2.0","id":1,"method":"ping"}"#;
    for line in [
        [&ping[..], b"\n"].concat(),
        [&ping[..], b"\r\n"].concat(),
        [&b"\xEF\xBB\xBF"[..], ping, b"\r\n"].concat(),
    ] {
        assert_eq!(inspect(&line, LIMIT), Inspected::Forward(ping.to_vec()));
    }
}

#[test]
fn nesting_deeper_than_serde_json_reads_is_refused_with_the_id() {
    // 127 levels in all (the message, `params`, then 125 arrays) pass.
    let deepest = format!(
        r#"{{"jsonrpc":"2.0","id":4,"method":"tools/call","params":{{"name":"t","arguments":{{"a":{}}}}}}}"#,
        nested(MAX_DEPTH - 3)
    );
    assert!(matches!(inspect(deepest.as_bytes(), LIMIT), Inspected::Forward(_)));
    let deeper = format!(
        r#"{{"jsonrpc":"2.0","id":4,"method":"tools/call","params":{{"name":"t","arguments":{{"a":{}}}}}}}"#,
        nested(MAX_DEPTH - 2)
    );
    let refused = reply(&inspect(deeper.as_bytes(), LIMIT));
    assert_eq!(refused["id"], 4);
    assert_eq!(refused["error"]["code"], -32600);
    assert_eq!(refused["error"]["data"], json!({ "maxDepth": 127 }));
    assert!(refused["error"]["message"].as_str().unwrap().contains("127 levels"), "{refused}");
    for depth in [128, 129, 100_000] {
        assert_eq!(error(&nested(depth)), (-32600, Value::Null), "{depth}");
    }
    // A notification cannot be told from a request whose id comes later.
    let notification = format!(r#"{{"jsonrpc":"2.0","method":"x","params":{}}}"#, nested(200));
    assert_eq!(error(&notification), (-32600, Value::Null));
    // A response is never answered.
    let response = format!(r#"{{"jsonrpc":"2.0","id":9,"result":{}}}"#, nested(200));
    assert!(dropped(response.as_bytes()));
}

#[test]
fn a_message_over_the_limit_is_refused_with_the_id_its_start_shows() {
    let limit = 64;
    let sized = |len: usize, id: &str| {
        let head = format!(r#"{{"jsonrpc":"2.0","id":{id},"method":"ping","params":{{"p":""#);
        let padding = "x".repeat(len - head.len() - 3);
        let line = format!("{head}{padding}\"}}}}");
        assert_eq!(line.len(), len);
        line
    };
    let at = sized(limit, "1");
    assert!(matches!(inspect(at.as_bytes(), limit), Inspected::Forward(_)));
    assert!(matches!(inspect(format!("{at}\r\n").as_bytes(), limit), Inspected::Forward(_)));
    let over = reply(&inspect(sized(limit + 1, "\"r-1\"").as_bytes(), limit));
    assert_eq!(over["id"], "r-1");
    assert_eq!(over["error"]["code"], -32600);
    assert_eq!(over["error"]["data"], json!({ "maxBytes": 64 }));
    assert_eq!(
        over["error"]["message"],
        "Invalid request: the message is longer than the limit of 64 bytes"
    );
    // The reader hands over only the start of a longer line.
    let start = br#"{"jsonrpc":"2.0","id":12,"method":"tools/call","params":{"name":"t","argu"#;
    assert_eq!(reply(&too_large(start, limit))["id"], 12);
    assert_eq!(reply(&too_large(br#"{"jsonrpc":"2.0","params":{"#, limit))["id"], Value::Null);
    assert_eq!(reply(&too_large(b"\x00garbage", limit))["id"], Value::Null);
    let Inspected::Answer(answer) = too_large(br#"{"jsonrpc":"2.0","id":3,"result":{"#, limit)
    else {
        panic!("refused")
    };
    assert_eq!(answer, Answer { problem: WireError::TooLarge { limit }, reply: None });
}

#[test]
fn an_idempotency_key_is_copied_into_meta() {
    let line = r#"{"jsonrpc":"2.0","id":5,"method":"tools/call","params":{"name":"pay","arguments":{"amount":3},"idempotencyKey":"order-7","_meta":{"progressToken":1}}}"#;
    let rewritten = forwarded(line.as_bytes());
    assert_eq!(
        rewritten["params"]["_meta"],
        json!({ "progressToken": 1, IDEMPOTENCY_KEY_META: "order-7" })
    );
    assert_eq!(rewritten["params"]["arguments"], json!({ "amount": 3 }));
    assert_eq!(rewritten["id"], 5);

    // Without `_meta`, or with `_meta: null`, one is made.
    for meta in ["", r#","_meta":null"#] {
        let line = format!(
            r#"{{"jsonrpc":"2.0","id":5,"method":"tools/call","params":{{"name":"pay","idempotencyKey":"k"{meta}}}}}"#
        );
        assert_eq!(
            forwarded(line.as_bytes())["params"]["_meta"],
            json!({ IDEMPOTENCY_KEY_META: "k" })
        );
    }
    // The same key in both places is no conflict: as it came.
    let both = format!(
        r#"{{"jsonrpc":"2.0","id":5,"method":"tools/call","params":{{"name":"pay","idempotencyKey":"k","_meta":{{"{IDEMPOTENCY_KEY_META}":"k"}}}}}}"#
    );
    assert_eq!(inspect(both.as_bytes(), LIMIT), Inspected::Forward(both.into_bytes()));
    // 255 bytes is the longest key.
    let longest = format!(
        r#"{{"jsonrpc":"2.0","id":5,"method":"tools/call","params":{{"name":"pay","idempotencyKey":"{}"}}}}"#,
        "k".repeat(MAX_IDEMPOTENCY_KEY_BYTES)
    );
    assert!(matches!(inspect(longest.as_bytes(), LIMIT), Inspected::Forward(_)));
    // Other methods are none of the wire's business.
    let other = r#"{"jsonrpc":"2.0","id":5,"method":"tools/list","params":{"idempotencyKey":7}}"#;
    assert_eq!(inspect(other.as_bytes(), LIMIT), Inspected::Forward(other.as_bytes().to_vec()));
}

#[test]
fn a_bad_idempotency_key_or_tools_call_is_invalid_params_with_the_id() {
    let call = |params: &str| {
        format!(r#"{{"jsonrpc":"2.0","id":"c-1","method":"tools/call","params":{params}}}"#)
    };
    let long = format!(r#"{{"name":"pay","idempotencyKey":"{}"}}"#, "k".repeat(256));
    let conflict = format!(
        r#"{{"name":"pay","idempotencyKey":"a","_meta":{{"{IDEMPOTENCY_KEY_META}":"b"}}}}"#
    );
    let not_a_string =
        format!(r#"{{"name":"pay","idempotencyKey":"a","_meta":{{"{IDEMPOTENCY_KEY_META}":1}}}}"#);
    let table: &[(&str, &str)] = &[
        (r#"{"name":"pay","idempotencyKey":""}"#, "`params.idempotencyKey` must not be empty"),
        (
            r#"{"name":"pay","idempotencyKey":7}"#,
            "`params.idempotencyKey` must be a non-empty string, not a number",
        ),
        (
            r#"{"name":"pay","idempotencyKey":null}"#,
            "`params.idempotencyKey` must be a non-empty string, not null",
        ),
        (&long, "`params.idempotencyKey` is 256 bytes long, over the limit of 255"),
        (
            &conflict,
            r#"`params.idempotencyKey` ("a") and `params._meta["verified-tools/idempotency_key"]` ("b") disagree"#,
        ),
        (
            &not_a_string,
            r#"`params.idempotencyKey` ("a") and `params._meta["verified-tools/idempotency_key"]` (1) disagree"#,
        ),
        (
            r#"{"name":"pay","idempotencyKey":"a","_meta":[]}"#,
            "`params._meta` must be an object, not an array",
        ),
        (r#"{"arguments":{}}"#, "`params.name` (the tool's name) is missing"),
        (r#"{"name":3}"#, "`params.name` must be the tool's name, a string, not a number"),
        (
            r#"{"name":"pay","arguments":"{\"a\":1}"}"#,
            "`params.arguments` must be an object, not a string",
        ),
        ("[]", "`params` of `tools/call` must be an object with the tool's `name`"),
    ];
    for (params, why) in table {
        let line = call(params);
        assert_eq!(error(&line), (-32602, json!("c-1")), "{line}");
        assert_eq!(message(&line), format!("Invalid params: {why}"));
    }
    let missing = r#"{"jsonrpc":"2.0","id":2,"method":"tools/call"}"#;
    assert_eq!(error(missing), (-32602, json!(2)));
}

#[test]
fn what_rmcp_cannot_read_is_answered_with_the_id() {
    // Params rmcp's own types refuse: it would answer with an id of null.
    for line in [
        r#"{"jsonrpc":"2.0","id":9,"method":"tools/list","params":[1]}"#,
        r#"{"jsonrpc":"2.0","id":9,"method":"ping","params":{"_meta":5}}"#,
    ] {
        assert_eq!(error(line), (-32602, json!(9)), "{line}");
        assert!(message(line).starts_with("Invalid params: the params of "), "{line}");
    }
}

#[test]
fn a_duplicate_argument_is_a_tool_result_the_model_can_correct() {
    let line = r#"{"jsonrpc":"2.0","id":7,"method":"tools/call","params":{"name":"pay","arguments":{"amount":1,"to":"bob","amount":2}}}"#;
    let inspected = inspect(line.as_bytes(), LIMIT);
    let Inspected::Answer(Answer { problem, .. }) = &inspected else { panic!("answered") };
    assert_eq!(
        problem,
        &WireError::DuplicateArgument { tool: "pay".into(), field: "amount".into() }
    );
    let outcome = serde_json::to_value(ToolOutcome::invalid_arguments(&ArgsError::new(
        "pay",
        "field `amount` is given twice",
    )))
    .unwrap();
    assert_eq!(
        reply(&inspected),
        json!({
            "jsonrpc": "2.0",
            "id": 7,
            "result": {
                "content": [{ "type": "text", "text": outcome.to_string() }],
                "structuredContent": outcome,
                "isError": true,
            },
        })
    );
    assert_eq!(outcome["status"], "invalid_arguments");
    // rmcp's client reads it as a tool result.
    let result: CallToolResult =
        serde_json::from_value(reply(&inspected)["result"].clone()).unwrap();
    assert_eq!(result.is_error, Some(true));

    let deep = r#"{"jsonrpc":"2.0","id":8,"method":"tools/call","params":{"name":"pay","arguments":{"to":{"address":{"city":"A","city":"B"}},"items":[{"sku":1,"sku":2}]}}}"#;
    let text =
        reply(&inspect(deep.as_bytes(), LIMIT))["result"]["structuredContent"]["error"].clone();
    assert_eq!(text, "field `to.address.city` is given twice");
    let items = r#"{"jsonrpc":"2.0","id":8,"method":"tools/call","params":{"name":"pay","arguments":{"items":[{"sku":1},{"sku":1,"sku":2}]}}}"#;
    let text =
        reply(&inspect(items.as_bytes(), LIMIT))["result"]["structuredContent"]["error"].clone();
    assert_eq!(text, "field `items[1].sku` is given twice");
}

#[test]
fn a_duplicate_key_elsewhere_is_an_invalid_request_naming_its_path() {
    let table: &[(&str, Value, &str)] = &[
        (r#"{"jsonrpc":"2.0","id":1,"method":"ping","method":"tools/list"}"#, json!(1), "method"),
        (r#"{"jsonrpc":"2.0","id":1,"id":2,"method":"ping"}"#, Value::Null, "id"),
        (
            r#"{"jsonrpc":"2.0","id":3,"method":"tools/call","params":{"name":"a","name":"b"}}"#,
            json!(3),
            "params.name",
        ),
        (
            r#"{"jsonrpc":"2.0","id":3,"method":"tools/call","params":{"name":"a","arguments":{},"arguments":{}}}"#,
            json!(3),
            "params.arguments",
        ),
        (
            r#"{"jsonrpc":"2.0","id":3,"method":"tools/call","params":{"name":"a","_meta":{"k":1,"k":2}}}"#,
            json!(3),
            "params._meta.k",
        ),
        (
            r#"{"jsonrpc":"2.0","id":3,"method":"tools/call","params":{"name":"a","_meta":{"verified-tools/x":1,"verified-tools/x":2}}}"#,
            json!(3),
            r#"params._meta["verified-tools/x"]"#,
        ),
        (
            r#"{"jsonrpc":"2.0","id":4,"method":"x/y","params":{"arguments":{"a":1,"a":2}}}"#,
            json!(4),
            "params.arguments.a",
        ),
        (
            r#"{"jsonrpc":"2.0","id":5,"method":"ping","params":{"l":[0,{"":1,"":2}]}}"#,
            json!(5),
            r#"params.l[1][""]"#,
        ),
    ];
    for (line, id, path) in table {
        let reply = reply(&inspect(line.as_bytes(), LIMIT));
        assert_eq!((reply["error"]["code"].as_i64(), &reply["id"]), (Some(-32600), id), "{line}");
        assert_eq!(reply["error"]["data"], json!({ "path": path }), "{line}");
        assert_eq!(
            reply["error"]["message"],
            format!("Invalid request: the key `{path}` is given twice")
        );
    }
    // The envelope is checked first.
    assert_eq!(error(r#"{"jsonrpc":"1.0","id":1,"method":"ping","method":"x"}"#).0, -32600);
    assert!(
        message(r#"{"jsonrpc":"1.0","id":1,"method":"ping","method":"x"}"#).contains("jsonrpc")
    );
}

#[test]
fn parse_message_builds_what_serde_json_builds() {
    let text = r#"{"a":[1,-2,3.5,1e300,18446744073709551615,-9223372036854775808,true,false,null],"b":{"c":"\u00e9\n\"","d":{}},"":[]}"#;
    assert_eq!(parse_message(text.as_bytes()), Ok(serde_json::from_str::<Value>(text).unwrap()));
    assert_eq!(
        parse_message(br#"{"a":{"b":[{"c":1,"c":1}]}}"#),
        Err(WireError::DuplicateKey(JsonPath(vec![
            Segment::Key("a".into()),
            Segment::Key("b".into()),
            Segment::Index(0),
            Segment::Key("c".into()),
        ])))
    );
    assert_eq!(parse_message(nested(128).as_bytes()), Err(WireError::TooDeep));
    assert!(parse_message(nested(127).as_bytes()).is_ok());
    assert!(matches!(parse_message(b"{} {}"), Err(WireError::Parse(_))));
}

#[cfg(feature = "tracing")]
#[test]
fn the_log_goes_to_stderr_unless_a_subscriber_listens() {
    assert!(!has_subscriber());
    tracing::subscriber::with_default(tracing_subscriber::registry(), || {
        assert!(has_subscriber());
    });
}

#[test]
fn the_default_limit_is_rmcps_http_limit() {
    assert_eq!(
        DEFAULT_MAX_MESSAGE_BYTES,
        StreamableHttpServerConfig::default().max_request_body_bytes
    );
}

mod serving;
