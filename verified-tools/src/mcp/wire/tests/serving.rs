//! The line reader, `serve_lines` and `HttpService`, driven end to end.

use http_body_util::{BodyExt as _, Full};
use hyper::body::Bytes;
use hyper::header::{self, HeaderValue};
use hyper::{Request, StatusCode};
use rmcp::ServerHandler;
use rmcp::service::QuitReason;

use super::*;
use crate::mcp::wire::streamable::http_layer;
use crate::mcp::wire::{HttpResponse, HttpService};

/// A handler whose one tool answers with the `_meta` it was given (rmcp
/// hands it over in the context, not in the params).
#[derive(Clone)]
struct EchoMeta;

impl ServerHandler for EchoMeta {
    fn get_info(&self) -> ServerConfig {
        ServerConfig::new(ServerCapabilities::builder().enable_tools().build())
    }

    async fn call_tool(
        &self,
        _request: CallToolRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, ErrorData> {
        let meta = serde_json::to_value(&context.meta).unwrap();
        Ok(CallToolResponse::from(CallToolResult::structured(json!({ "meta": meta }))))
    }
}

const INITIALIZE: &str = r#"{"jsonrpc":"2.0","id":0,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"wire-test","version":"0"}}}"#;
const INITIALIZED: &str = r#"{"jsonrpc":"2.0","method":"notifications/initialized"}"#;

async fn next_line(
    lines: &mut tokio::io::Lines<tokio::io::BufReader<tokio::io::DuplexStream>>,
) -> Value {
    let line = tokio::time::timeout(Duration::from_secs(30), lines.next_line())
        .await
        .expect("an answer within 30 s")
        .expect("readable")
        .expect("a line");
    serde_json::from_str(&line).expect("JSON")
}

#[tokio::test]
async fn serve_lines_delivers_the_idempotency_key_to_the_handler() {
    let (mut client, server_input) = tokio::io::duplex(1 << 16);
    let (server_output, client_output) = tokio::io::duplex(1 << 16);
    let serving = tokio::spawn(serve_lines(EchoMeta, server_input, server_output, LIMIT));
    let mut lines = tokio::io::BufReader::new(client_output).lines();
    client.write_all(format!("{INITIALIZE}\n{INITIALIZED}\n").as_bytes()).await.unwrap();
    assert_eq!(next_line(&mut lines).await["id"], 0);
    let call = r#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"echo","arguments":{},"idempotencyKey":"order-7","_meta":{"other":true}}}"#;
    client.write_all(format!("{call}\n").as_bytes()).await.unwrap();
    let answer = next_line(&mut lines).await;
    assert_eq!(answer["id"], 1, "{answer}");
    assert_eq!(
        answer["result"]["structuredContent"]["meta"],
        json!({ "other": true, IDEMPOTENCY_KEY_META: "order-7" })
    );
    drop(client);
    let reason = serving.await.unwrap().expect("served");
    assert!(matches!(reason, QuitReason::Closed), "{reason:?}");
    assert!(lines.next_line().await.unwrap().is_none(), "the output is closed");
}

#[tokio::test]
async fn serve_lines_fails_when_the_input_ends_before_the_handshake() {
    let (client, server_input) = tokio::io::duplex(64);
    let (server_output, _client_output) = tokio::io::duplex(64);
    let serving = tokio::spawn(serve_lines(EchoMeta, server_input, server_output, LIMIT));
    drop(client);
    let served = tokio::time::timeout(Duration::from_secs(30), serving).await.unwrap();
    assert!(served.unwrap().is_err());
}

// Streamable HTTP.

fn http(limit: usize) -> HttpService<McpServer<()>> {
    http_layer(McpServer::new(ToolSet::new(())).http_service().inner().clone(), limit)
}

fn post(content_type: &str, body: &str) -> Request<Full<Bytes>> {
    Request::post("http://localhost/mcp")
        .header(header::HOST, "localhost")
        .header(header::CONTENT_TYPE, content_type)
        .header(header::ACCEPT, "application/json, text/event-stream")
        .body(Full::new(Bytes::from(body.to_owned())))
        .unwrap()
}

fn request(body: &str) -> Request<Full<Bytes>> {
    post("application/json", body)
}

async fn json_of(response: HttpResponse) -> (StatusCode, Value) {
    let status = response.status();
    assert_eq!(response.headers()[header::CONTENT_TYPE], "application/json");
    let body = response.into_body().collect().await.unwrap().to_bytes();
    (status, serde_json::from_slice(&body).expect("a JSON body"))
}

#[tokio::test]
async fn http_answers_what_is_not_json_rpc_with_a_json_rpc_error() {
    let service = http(LIMIT);
    let (status, body) = json_of(service.handle(request("garbage")).await).await;
    assert_eq!(
        (status, &body["error"]["code"], &body["id"]),
        (StatusCode::BAD_REQUEST, &json!(-32700), &Value::Null)
    );
    let (status, body) =
        json_of(service.handle(request(r#"{"jsonrpc":"1.0","id":3,"method":"ping"}"#)).await).await;
    assert_eq!(
        (status, &body["error"]["code"], &body["id"]),
        (StatusCode::BAD_REQUEST, &json!(-32600), &json!(3))
    );
    // A notification has no id to answer; the body says why anyway.
    let (status, body) = json_of(
        service.handle(request(r#"{"jsonrpc":"1.0","method":"notifications/initialized"}"#)).await,
    )
    .await;
    assert_eq!(
        (status, &body["error"]["code"], &body["id"]),
        (StatusCode::BAD_REQUEST, &json!(-32600), &Value::Null)
    );
    // Invalid params of a request are a JSON-RPC answer, not an HTTP error.
    let conflict = format!(
        r#"{{"jsonrpc":"2.0","id":"c","method":"tools/call","params":{{"name":"t","idempotencyKey":"a","_meta":{{"{IDEMPOTENCY_KEY_META}":"b"}}}}}}"#
    );
    let (status, body) = json_of(service.handle(request(&conflict)).await).await;
    assert_eq!(
        (status, &body["error"]["code"], &body["id"]),
        (StatusCode::OK, &json!(-32602), &json!("c"))
    );
    let duplicate = r#"{"jsonrpc":"2.0","id":4,"method":"tools/call","params":{"name":"t","arguments":{"a":1,"a":2}}}"#;
    let (status, body) = json_of(service.handle(request(duplicate)).await).await;
    assert_eq!((status, &body["result"]["isError"]), (StatusCode::OK, &json!(true)));
}

#[tokio::test]
async fn http_refuses_a_body_over_the_limit_with_413() {
    let service = http(64);
    let body = format!(
        r#"{{"jsonrpc":"2.0","id":5,"method":"ping","params":{{"p":"{}"}}}}"#,
        "x".repeat(100)
    );
    let (status, body) = json_of(service.handle(request(&body)).await).await;
    assert_eq!(status, StatusCode::PAYLOAD_TOO_LARGE);
    assert_eq!((&body["id"], &body["error"]["data"]), (&json!(5), &json!({ "maxBytes": 64 })));
}

#[tokio::test]
async fn http_forwards_good_messages_and_leaves_the_rest_to_rmcp() {
    let service = http(LIMIT);
    let response = service.handle(request(INITIALIZE)).await;
    assert_eq!(response.status(), StatusCode::OK);
    assert!(response.headers().contains_key("mcp-session-id"), "{response:?}");
    // Not JSON, not POST: rmcp's own answers, untouched.
    let text = post("text/plain", "garbage");
    assert_eq!(service.handle(text).await.status(), StatusCode::UNSUPPORTED_MEDIA_TYPE);
    let get = Request::get("http://localhost/mcp")
        .header(header::HOST, "localhost")
        .body(Full::<Bytes>::default())
        .unwrap();
    let direct = Request::get("http://localhost/mcp")
        .header(header::HOST, "localhost")
        .body(Full::<Bytes>::default())
        .unwrap();
    assert_eq!(service.handle(get).await.status(), service.inner().handle(direct).await.status());
}

#[tokio::test]
async fn http_keeps_rmcps_host_check_ahead_of_its_own_answers() {
    let service = http(LIMIT);
    let mut evil = request("garbage");
    evil.headers_mut().insert(header::HOST, HeaderValue::from_static("evil.example"));
    *evil.uri_mut() = "http://evil.example/mcp".parse().unwrap();
    assert_eq!(service.handle(evil).await.status(), StatusCode::FORBIDDEN);
}

#[tokio::test]
async fn http_service_is_a_tower_service() {
    let mut service = http(LIMIT);
    let response = tower_service::Service::call(&mut service, request("garbage")).await.unwrap();
    assert_eq!(response.status(), StatusCode::BAD_REQUEST);
}
