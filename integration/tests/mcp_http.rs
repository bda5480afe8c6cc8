//! The streamable HTTP endpoint as a hostile network sees it, in-process:
//! `McpServer::serve_http` on a loopback port, driven with raw HTTP/1.1
//! over TCP (what a browser page, a stranger or a slow client sends).
//!
//! - **Origin**: a browser origin other than this machine's (`evil.example`,
//!   `null`) is refused with `403`, before a session exists; a request
//!   without `Origin` (not from a browser) is served; an allow-list
//!   replaces the default.
//! - **Authentication**: without a bearer token, or with a wrong one, `401`
//!   with a `WWW-Authenticate: Bearer` challenge; the token's principal
//!   keys the calls (two principals never share an idempotency key), and a
//!   session serves the principal that opened it alone.
//! - **Timeouts and caps**: a hundred connections that send part of a
//!   request line and then nothing are all closed within the header
//!   timeout; a body that stops coming gets `408`; connections past a cap
//!   are closed at once; requests past the concurrency cap get `503`.

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::TcpStream;
use verified_tools::mcp::{BearerToken, HttpLimits, McpServer, Principal};
use verified_tools::sim::{FaultProfile, SimConfig, SimServer};
use verified_tools_suite::llm::tool_set;
use verified_tools_suite::tools::SimClient;

/// How long any answer may take on a loaded machine (only bounds a hang).
const ANSWER: Duration = Duration::from_secs(60);

type Server = McpServer<SimClient>;

/// The simulator's tools without faults.
fn server() -> Server {
    let (sim, _oracle) = SimServer::new(SimConfig::new(1, FaultProfile::NONE));
    McpServer::new(tool_set(SimClient::new(sim, true)))
}

/// Serves `server` on a free loopback port.
async fn serve(server: Server) -> SocketAddr {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(server.serve_http(listener));
    addr
}

/// An HTTP answer.
#[derive(Debug)]
struct Reply {
    status: u16,
    headers: Vec<(String, String)>,
    body: String,
}

impl Reply {
    fn header(&self, name: &str) -> Option<&str> {
        self.headers.iter().find(|(n, _)| n.eq_ignore_ascii_case(name)).map(|(_, v)| v.as_str())
    }

    /// The JSON-RPC message of the body: plain JSON, or the `data:` of an
    /// SSE event that carries one.
    fn message(&self) -> Value {
        if let Ok(value) = serde_json::from_str(&self.body) {
            return value;
        }
        self.body
            .lines()
            .filter_map(|line| line.strip_prefix("data:"))
            .filter_map(|data| serde_json::from_str::<Value>(data.trim()).ok())
            .find(|message| message.get("id").is_some())
            .unwrap_or_else(|| panic!("no JSON-RPC message in {self:?}"))
    }
}

/// Decodes a `Transfer-Encoding: chunked` body.
fn dechunk(mut raw: &[u8]) -> Vec<u8> {
    let mut body = Vec::new();
    loop {
        let Some(end) = raw.windows(2).position(|w| w == b"\r\n") else { return body };
        let size = std::str::from_utf8(&raw[..end]).unwrap();
        let size = usize::from_str_radix(size.split(';').next().unwrap().trim(), 16).unwrap();
        raw = &raw[end + 2..];
        if size == 0 || raw.len() < size {
            return body;
        }
        body.extend_from_slice(&raw[..size]);
        raw = raw.get(size + 2..).unwrap_or_default();
    }
}

/// Sends one request (on a connection of its own, closed after it) and
/// reads the whole answer.
async fn send(addr: SocketAddr, request: String) -> Reply {
    try_send(addr, request).await.expect("an answer, not a closed connection")
}

/// [`send`], or `None` when the server closes the connection without a
/// word.
async fn try_send(addr: SocketAddr, request: String) -> Option<Reply> {
    let mut stream = TcpStream::connect(addr).await.unwrap();
    // A connection closed at once may refuse the write, or take it.
    if stream.write_all(request.as_bytes()).await.is_err() {
        return None;
    }
    let mut raw = Vec::new();
    let read = tokio::time::timeout(ANSWER, stream.read_to_end(&mut raw))
        .await
        .expect("an answer in time");
    if read.is_err() && raw.is_empty() {
        return None;
    }
    let split = raw.windows(4).position(|w| w == b"\r\n\r\n")?;
    let head = String::from_utf8(raw[..split].to_vec()).unwrap();
    let mut lines = head.split("\r\n");
    let status = lines.next().unwrap().split(' ').nth(1).unwrap().parse().unwrap();
    let headers: Vec<(String, String)> = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(n, v)| (n.trim().to_owned(), v.trim().to_owned()))
        .collect();
    let chunked = headers.iter().any(|(n, v)| {
        n.eq_ignore_ascii_case("transfer-encoding") && v.eq_ignore_ascii_case("chunked")
    });
    let rest = &raw[split + 4..];
    let body = if chunked { dechunk(rest) } else { rest.to_vec() };
    Some(Reply { status, headers, body: String::from_utf8_lossy(&body).into_owned() })
}

/// A POST of `message` to `/mcp` with `headers` (each `Name: value`).
fn post(addr: SocketAddr, message: &Value, headers: &[String]) -> String {
    let body = message.to_string();
    let mut request = format!(
        "POST /mcp HTTP/1.1\r\nHost: 127.0.0.1:{}\r\nContent-Type: application/json\r\n\
         Accept: application/json, text/event-stream\r\nContent-Length: {}\r\n\
         Connection: close\r\n",
        addr.port(),
        body.len()
    );
    for header in headers {
        request.push_str(header);
        request.push_str("\r\n");
    }
    request.push_str("\r\n");
    request.push_str(&body);
    request
}

fn initialize() -> Value {
    json!({
        "jsonrpc": "2.0", "id": 1, "method": "initialize",
        "params": {
            "protocolVersion": "2025-06-18",
            "capabilities": {},
            "clientInfo": {"name": "raw", "version": "0"}
        }
    })
}

/// A client of one session: the headers it sends on every request.
struct Session {
    addr: SocketAddr,
    headers: Vec<String>,
}

impl Session {
    /// Opens a session with `headers` (its credentials).
    async fn open(addr: SocketAddr, headers: &[&str]) -> Self {
        let mut headers: Vec<String> = headers.iter().map(|&h| h.to_owned()).collect();
        let reply = send(addr, post(addr, &initialize(), &headers)).await;
        assert_eq!(reply.status, 200, "{reply:?}");
        let id = reply.header("mcp-session-id").expect("a session id").to_owned();
        headers.push(format!("Mcp-Session-Id: {id}"));
        headers.push("MCP-Protocol-Version: 2025-06-18".to_owned());
        let initialized = json!({"jsonrpc": "2.0", "method": "notifications/initialized"});
        let reply = send(addr, post(addr, &initialized, &headers)).await;
        assert_eq!(reply.status, 202, "{reply:?}");
        Self { addr, headers }
    }

    /// The same session under other credentials.
    fn as_other(&self, credentials: &str) -> Self {
        let mut headers = self.headers.clone();
        headers.retain(|h| !h.starts_with("Authorization"));
        headers.push(credentials.to_owned());
        Self { addr: self.addr, headers }
    }

    /// `tools/call` of `name` with `arguments` under `idempotencyKey`: the
    /// JSON-RPC answer.
    async fn call(&self, name: &str, arguments: Value, key: &str) -> Value {
        let call = json!({
            "jsonrpc": "2.0", "id": 2, "method": "tools/call",
            "params": {"name": name, "arguments": arguments, "idempotencyKey": key}
        });
        let reply = send(self.addr, post(self.addr, &call, &self.headers)).await;
        assert_eq!(reply.status, 200, "{reply:?}");
        reply.message()
    }
}

// ---------------------------------------------------------------------------
// Origin.

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_foreign_browser_origin_is_refused_with_403() {
    let addr = serve(server()).await;
    for origin in ["http://evil.example", "null", "https://localhost.evil.example:443"] {
        let reply = send(addr, post(addr, &initialize(), &[format!("Origin: {origin}")])).await;
        assert_eq!(reply.status, 403, "{origin}: {reply:?}");
        assert!(reply.header("mcp-session-id").is_none(), "{origin}: no session");
    }
    // Refused also where the wire answers itself (a body that is not
    // JSON-RPC): the check comes first.
    let garbage = post(addr, &json!("garbage"), &["Origin: http://evil.example".to_owned()]);
    assert_eq!(send(addr, garbage).await.status, 403);
    // Pages of this machine, and clients that send no Origin, are served.
    for origin in [
        Some("http://localhost:6274".to_owned()),
        Some(format!("http://127.0.0.1:{}", addr.port())),
        Some("http://[::1]:8080".to_owned()),
        None,
    ] {
        let headers: Vec<String> = origin.iter().map(|o| format!("Origin: {o}")).collect();
        let reply = send(addr, post(addr, &initialize(), &headers)).await;
        assert_eq!(reply.status, 200, "{origin:?}: {reply:?}");
        assert!(reply.header("mcp-session-id").is_some(), "{origin:?}: a session");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_allow_list_replaces_the_default_origins() {
    let addr = serve(server().with_allowed_origins(["https://app.example"])).await;
    let with = |origin: &str| post(addr, &initialize(), &[format!("Origin: {origin}")]);
    assert_eq!(send(addr, with("https://app.example")).await.status, 200);
    assert_eq!(send(addr, with("http://localhost:6274")).await.status, 403);
    // An empty list: no browser at all.
    let addr = serve(server().with_allowed_origins(Vec::<String>::new())).await;
    assert_eq!(send(addr, post(addr, &initialize(), &[])).await.status, 200);
    let local = post(addr, &initialize(), &["Origin: http://localhost:1".to_owned()]);
    assert_eq!(send(addr, local).await.status, 403);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_host_check_stays() {
    let addr = serve(server()).await;
    let request = post(addr, &initialize(), &[])
        .replace(&format!("Host: 127.0.0.1:{}", addr.port()), "Host: evil.example");
    assert_eq!(send(addr, request).await.status, 403);
}

// ---------------------------------------------------------------------------
// Authentication.

/// Two principals, each with a token.
fn two_principals(token: &str) -> Option<Principal> {
    match token {
        "alice-token" => Some(Principal::new("alice")),
        "bob-token" => Some(Principal::new("bob")),
        _ => None,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_missing_or_wrong_token_gets_401_with_a_bearer_challenge() {
    let addr = serve(server().with_authenticator(two_principals)).await;
    let reply = send(addr, post(addr, &initialize(), &[])).await;
    assert_eq!(reply.status, 401, "{reply:?}");
    assert_eq!(reply.header("www-authenticate"), Some(r#"Bearer realm="mcp""#));
    assert!(reply.header("mcp-session-id").is_none());
    for wrong in ["Authorization: Bearer mallory", "Authorization: Bearer ", "Authorization: x"] {
        let reply = send(addr, post(addr, &initialize(), &[wrong.to_owned()])).await;
        assert_eq!(reply.status, 401, "{wrong}: {reply:?}");
        let challenge = reply.header("www-authenticate").unwrap_or_default();
        assert!(challenge.starts_with("Bearer"), "{wrong}: {challenge}");
    }
    let wrong =
        send(addr, post(addr, &initialize(), &["Authorization: Bearer m".to_owned()])).await;
    assert!(wrong.header("www-authenticate").unwrap().contains(r#"error="invalid_token""#));
    // Before anything else: a foreign Host or Origin learns only that.
    let evil = post(addr, &initialize(), &["Origin: http://evil.example".to_owned()]);
    assert_eq!(send(addr, evil).await.status, 401);
    // GET and DELETE too.
    let get = format!(
        "GET /mcp HTTP/1.1\r\nHost: 127.0.0.1:{}\r\nAccept: text/event-stream\r\n\
         Connection: close\r\n\r\n",
        addr.port()
    );
    assert_eq!(send(addr, get).await.status, 401);
    let good = send(addr, post(addr, &initialize(), &["Authorization: Bearer alice-token".into()]));
    assert_eq!(good.await.status, 200);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_static_token_admits_its_bearer() {
    let token = BearerToken::new("s3cret", Principal::new("ops"));
    let addr = serve(server().with_authenticator(token)).await;
    let session = Session::open(addr, &["Authorization: Bearer s3cret"]).await;
    let answer = session.call("create_customer", json!({"customer": 7}), "k").await;
    assert_eq!(answer["result"]["structuredContent"]["status"], "success", "{answer}");
    let wrong = post(addr, &initialize(), &["Authorization: Bearer s3cre".to_owned()]);
    assert_eq!(send(addr, wrong).await.status, 401);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_token_names_the_principal_its_calls_are_keyed_for() {
    let addr = serve(server().with_authenticator(two_principals)).await;
    let alice = Session::open(addr, &["Authorization: Bearer alice-token"]).await;
    let bob = Session::open(addr, &["Authorization: Bearer bob-token"]).await;
    let first = alice.call("create_customer", json!({"customer": 1}), "key-1").await;
    let first = &first["result"]["structuredContent"];
    assert_eq!((&first["status"], &first["proof"]), (&json!("success"), &json!("verifier")));
    // The same key from alice: the same call, replayed.
    let again = alice.call("create_customer", json!({"customer": 1}), "key-1").await;
    assert_eq!(again["result"]["structuredContent"]["proof"], "ledger", "{again}");
    // The same key from bob, with other arguments: bob's own call (were
    // the key shared, other arguments under it would be refused).
    let theirs = bob.call("create_customer", json!({"customer": 2}), "key-1").await;
    let theirs = &theirs["result"]["structuredContent"];
    assert_eq!((&theirs["status"], &theirs["proof"]), (&json!("success"), &json!("verifier")));
    assert_ne!(theirs["key"], first["key"]);
    // Bob under alice's session id: refused, whatever he calls.
    let hijack = alice.as_other("Authorization: Bearer bob-token");
    let refused = hijack.call("create_customer", json!({"customer": 1}), "key-1").await;
    assert_eq!(refused["error"]["code"], -32600, "{refused}");
    assert!(refused["error"]["message"].as_str().unwrap().contains("another principal"));
}

// ---------------------------------------------------------------------------
// Timeouts and caps.

/// Waits until the server closes `stream` (the read sees its end, or a
/// reset), and says how long that took.
async fn closed(mut stream: TcpStream, since: Instant) -> Duration {
    let mut buf = [0u8; 1024];
    loop {
        match tokio::time::timeout(ANSWER, stream.read(&mut buf)).await {
            Ok(Ok(0) | Err(_)) => return since.elapsed(),
            Ok(Ok(_)) => {}
            Err(_) => panic!("the server kept the connection open for {ANSWER:?}"),
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hundred_trickling_connections_are_closed_within_the_header_timeout() {
    let timeout = Duration::from_secs(1);
    let limits =
        HttpLimits::default().with_header_read_timeout(timeout).with_max_connections_per_peer(200);
    let addr = serve(server().with_http_limits(limits)).await;
    let mut streams = Vec::new();
    for _ in 0..100 {
        let mut stream = TcpStream::connect(addr).await.unwrap();
        // Part of a request line, then nothing.
        stream.write_all(b"POST /mc").await.unwrap();
        streams.push((stream, Instant::now()));
    }
    let waits = streams.into_iter().map(|(stream, since)| tokio::spawn(closed(stream, since)));
    let mut longest = Duration::ZERO;
    for wait in waits {
        longest = longest.max(wait.await.unwrap());
    }
    // A wide margin: a loaded machine runs the timers late, never early.
    assert!(longest < timeout + Duration::from_secs(10), "the last closed after {longest:?}");
    // The server still serves.
    assert_eq!(send(addr, post(addr, &initialize(), &[])).await.status, 200);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_body_that_stops_coming_gets_408() {
    let limits = HttpLimits::default().with_body_read_timeout(Duration::from_millis(500));
    let addr = serve(server().with_http_limits(limits)).await;
    let mut stream = TcpStream::connect(addr).await.unwrap();
    let head = format!(
        "POST /mcp HTTP/1.1\r\nHost: 127.0.0.1:{}\r\nContent-Type: application/json\r\n\
         Accept: application/json, text/event-stream\r\nContent-Length: 100\r\n\r\n{{\"jsonrpc\"",
        addr.port()
    );
    stream.write_all(head.as_bytes()).await.unwrap();
    let mut raw = Vec::new();
    tokio::time::timeout(ANSWER, stream.read_to_end(&mut raw)).await.unwrap().unwrap();
    let raw = String::from_utf8_lossy(&raw);
    assert!(raw.starts_with("HTTP/1.1 408"), "{raw}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idle_connection_is_closed() {
    let limits = HttpLimits::default()
        .with_idle_timeout(Duration::from_millis(500))
        .with_header_read_timeout(Duration::from_secs(600));
    let addr = serve(server().with_http_limits(limits)).await;
    // Measured from before the connection exists: the server's idle timer
    // starts when it accepts, which can come before `connect` returns here.
    let started = Instant::now();
    let stream = TcpStream::connect(addr).await.unwrap();
    let took = closed(stream, started).await;
    assert!(took >= Duration::from_millis(500), "closed early: {took:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connections_past_a_cap_are_closed_at_once() {
    let limits = HttpLimits::default().with_max_connections_per_peer(4);
    let addr = serve(server().with_http_limits(limits)).await;
    let mut kept = Vec::new();
    for _ in 0..4 {
        kept.push(TcpStream::connect(addr).await.unwrap());
    }
    // The server admits connections in the order it accepts them: the
    // fifth is over the cap once the first four are in.
    let mut over = None;
    for _ in 0..100 {
        let stream = TcpStream::connect(addr).await.unwrap();
        let mut probe = [0u8; 1];
        // Closed at once: its read ends quickly. One admitted (the first
        // four not all accepted yet) stays open: try again.
        match tokio::time::timeout(Duration::from_millis(500), stream.peek(&mut probe)).await {
            Ok(_) => {
                over = Some(stream);
                break;
            }
            Err(_) => kept.push(stream),
        }
    }
    assert!(over.is_some(), "a connection over the cap is closed");
    drop(kept);
    // Slots come back as connections close.
    let start = Instant::now();
    loop {
        let reply = try_send(addr, post(addr, &initialize(), &[])).await;
        if reply.as_ref().is_some_and(|r| r.status == 200) {
            break;
        }
        assert!(start.elapsed() < ANSWER, "{reply:?}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requests_past_the_concurrency_cap_get_503() {
    let limits = HttpLimits::default().with_max_concurrent_requests(1);
    let addr = serve(server().with_http_limits(limits)).await;
    // A request whose body has not all come holds the one slot.
    let head = format!(
        "POST /mcp HTTP/1.1\r\nHost: 127.0.0.1:{}\r\nContent-Type: application/json\r\n\
         Accept: application/json, text/event-stream\r\nContent-Length: 100\r\n\r\n{{",
        addr.port()
    );
    let hold = || async {
        let mut holder = TcpStream::connect(addr).await.unwrap();
        holder.write_all(head.as_bytes()).await.unwrap();
        holder
    };
    let mut holder = hold().await;
    // The holder's head reaches the service at some point: until then a
    // request may still be served; once it has, every other one gets 503.
    // On a loaded machine a probe may hold the slot when the holder's head
    // arrives, and the holder is the one refused: it then holds nothing,
    // and a new holder takes its place.
    let start = Instant::now();
    let busy = loop {
        let reply = send(addr, post(addr, &initialize(), &[])).await;
        if reply.status == 503 {
            break reply;
        }
        assert!(start.elapsed() < ANSWER, "{reply:?}");
        let mut answered = [0u8; 1];
        if holder.try_read(&mut answered).is_ok() {
            holder = hold().await;
        }
    };
    assert_eq!(busy.header("retry-after"), Some("1"));
    drop(holder);
}

// ---------------------------------------------------------------------------
// The simulator's binary.

/// `mcp_server` with `args` and `env`, until it has printed its URL (or
/// ended): its stderr so far, and the process.
fn mcp_server(args: &[&str], env: &[(&str, &str)]) -> (String, std::process::Child) {
    use std::io::BufRead as _;
    let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_mcp_server"))
        .args(args)
        .env_remove("VT_MCP_TOKEN")
        .envs(env.iter().copied())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("the server starts");
    let mut stderr = std::io::BufReader::new(child.stderr.take().expect("piped"));
    let mut log = String::new();
    loop {
        let mut line = String::new();
        if stderr.read_line(&mut line).expect("the server's stderr") == 0 {
            break;
        }
        log.push_str(&line);
        if line.contains("http://") {
            // Drained from here on, so that the server never writes to a
            // closed pipe.
            std::thread::spawn(move || std::io::copy(&mut stderr, &mut std::io::sink()));
            break;
        }
    }
    (log, child)
}

fn stop(mut child: std::process::Child) {
    let _ = child.kill();
    let _ = child.wait();
}

#[test]
fn the_binary_refuses_a_public_address_without_authentication() {
    let (log, mut child) = mcp_server(&["--level", "none", "--http", "0.0.0.0:0"], &[]);
    let status = child.wait().unwrap();
    assert!(!status.success(), "{log}");
    assert!(log.contains("refusing to serve 0.0.0.0:0 without authentication"), "{log}");
    // Said out loud, it serves, and says so.
    let args = ["--level", "none", "--http", "0.0.0.0:0", "--allow-unauthenticated"];
    let (log, child) = mcp_server(&args, &[]);
    assert!(log.contains("WARNING: no authentication on 0.0.0.0:0"), "{log}");
    assert!(log.contains("http://"), "{log}");
    stop(child);
    // With a token it serves without a word of warning.
    let (log, child) =
        mcp_server(&["--level", "none", "--http", "0.0.0.0:0"], &[("VT_MCP_TOKEN", "t0ken")]);
    assert!(log.contains("bearer token of VT_MCP_TOKEN") && log.contains("http://"), "{log}");
    stop(child);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_binary_asks_for_the_token_of_its_environment() {
    let args = ["--level", "none", "--http", "127.0.0.1:0"];
    let (log, child) = mcp_server(&args, &[("VT_MCP_TOKEN", "t0ken")]);
    let url = log.split_whitespace().find(|w| w.starts_with("http://")).expect("a URL");
    let addr: SocketAddr =
        url.trim_start_matches("http://").trim_end_matches("/mcp").parse().unwrap();
    assert_eq!(send(addr, post(addr, &initialize(), &[])).await.status, 401);
    let good = post(addr, &initialize(), &["Authorization: Bearer t0ken".to_owned()]);
    assert_eq!(send(addr, good).await.status, 200);
    stop(child);
}
