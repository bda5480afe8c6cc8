//! `Classify` for the errors real clients return, against real peers:
//! reqwest against an HTTP server this test runs on loopback (scripted raw
//! responses, a socket that never answers, one that hangs up, a closed
//! port), and tokio-postgres against a real PostgreSQL (`VT_POSTGRES_URL`,
//! from `.ci/postgres.sh`) made to fail in each way the table names.

use test_support as support;

use std::net::SocketAddr;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use verified_tools::{Classify, ErrorClass};

/// A loopback port nothing listens on.
fn closed_port() -> u16 {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("a free loopback port");
    listener.local_addr().expect("a bound address").port()
}

// ---------------------------------------------------------------- HTTP

/// An HTTP/1.1 server that answers each request by its path:
/// `/status/CODE` that status (429 and 503 with `Retry-After`), `/bad-json`
/// a 200 whose JSON breaks off, `/redirect` a redirect to itself, `/hang`
/// nothing (the socket stays open), `/drop` a hang-up after reading the
/// request. Every answer closes its connection.
async fn http_server() -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("a loopback port");
    let addr = listener.local_addr().expect("a bound address");
    tokio::spawn(async move {
        while let Ok((socket, _)) = listener.accept().await {
            tokio::spawn(answer(socket));
        }
    });
    addr
}

async fn answer(mut socket: TcpStream) {
    let Some(path) = read_request(&mut socket).await else { return };
    let response = match path.as_str() {
        "/bad-json" => response(200, &[("Content-Type", "application/json")], "{\"id\": 4"),
        "/redirect" => response(302, &[("Location", "/redirect")], ""),
        "/hang" => {
            tokio::time::sleep(Duration::from_secs(60)).await;
            return;
        }
        "/drop" => return,
        path => match path.strip_prefix("/status/").and_then(|code| code.parse().ok()) {
            Some(code @ (429 | 503)) => response(code, &[("Retry-After", "1")], "{}"),
            Some(code) => response(code, &[], "{}"),
            None => response(404, &[], ""),
        },
    };
    let _ = socket.write_all(response.as_bytes()).await;
    let _ = socket.shutdown().await;
}

/// Reads one request (head and `Content-Length` body); its path.
async fn read_request(socket: &mut TcpStream) -> Option<String> {
    let mut data = Vec::new();
    let mut chunk = [0u8; 1024];
    let head_end = loop {
        if let Some(at) = data.windows(4).position(|w| w == b"\r\n\r\n") {
            break at + 4;
        }
        let n = socket.read(&mut chunk).await.ok()?;
        if n == 0 {
            return None;
        }
        data.extend_from_slice(&chunk[..n]);
    };
    let head = String::from_utf8_lossy(&data[..head_end]).into_owned();
    let length = head
        .lines()
        .filter_map(|line| line.split_once(':'))
        .find(|(name, _)| name.eq_ignore_ascii_case("content-length"))
        .and_then(|(_, value)| value.trim().parse::<usize>().ok())
        .unwrap_or(0);
    while data.len() < head_end + length {
        let n = socket.read(&mut chunk).await.ok()?;
        if n == 0 {
            return None;
        }
        data.extend_from_slice(&chunk[..n]);
    }
    head.split_whitespace().nth(1).map(str::to_owned)
}

fn response(status: u16, headers: &[(&str, &str)], body: &str) -> String {
    let mut text = format!("HTTP/1.1 {status} Scripted\r\nConnection: close\r\n");
    for (name, value) in headers {
        text.push_str(&format!("{name}: {value}\r\n"));
    }
    text.push_str(&format!("Content-Length: {}\r\n\r\n{body}", body.len()));
    text
}

fn client() -> reqwest::Client {
    reqwest::Client::builder()
        .no_proxy()
        .timeout(Duration::from_millis(500))
        .build()
        .expect("a reqwest client")
}

/// A tool's write: `POST` a small JSON body, then `error_for_status`.
async fn post(url: String) -> Result<reqwest::Response, reqwest::Error> {
    client()
        .post(url)
        .header("Content-Type", "application/json")
        .body(r#"{"amount": 5}"#)
        .send()
        .await?
        .error_for_status()
}

async fn status_error(addr: SocketAddr, code: u16) -> reqwest::Error {
    let error = post(format!("http://{addr}/status/{code}")).await.expect_err("an error status");
    assert!(error.is_status(), "{code}: {error:?}");
    assert_eq!(error.status().map(|s| s.as_u16()), Some(code));
    error
}

#[tokio::test]
async fn http_409_and_412_are_conflicts() {
    let addr = http_server().await;
    for code in [409, 412] {
        assert_eq!(status_error(addr, code).await.classify(), ErrorClass::Conflict, "{code}");
    }
}

#[tokio::test]
async fn http_422_and_other_client_errors_are_definitive() {
    let addr = http_server().await;
    for code in [400, 401, 403, 404, 422] {
        assert_eq!(status_error(addr, code).await.classify(), ErrorClass::Definitive, "{code}");
    }
}

#[tokio::test]
async fn http_429_with_retry_after_was_refused_at_the_door() {
    let addr = http_server().await;
    assert_eq!(status_error(addr, 429).await.classify(), ErrorClass::NotSent);
}

#[tokio::test]
async fn http_408_500_and_503_with_retry_after_are_ambiguous() {
    let addr = http_server().await;
    for code in [408, 500, 502, 503, 504] {
        assert_eq!(status_error(addr, code).await.classify(), ErrorClass::Ambiguous, "{code}");
    }
}

#[tokio::test]
async fn http_200_with_a_body_that_does_not_decode_is_ambiguous() {
    let addr = http_server().await;
    let response = post(format!("http://{addr}/bad-json")).await.expect("a 200");
    let error = response.json::<serde_json::Value>().await.expect_err("broken JSON");
    assert!(error.is_decode(), "{error:?}");
    assert_eq!(error.classify(), ErrorClass::Ambiguous);
}

#[tokio::test]
async fn http_no_answer_within_the_timeout_is_ambiguous() {
    let addr = http_server().await;
    let error = post(format!("http://{addr}/hang")).await.expect_err("a timeout");
    assert!(error.is_timeout() && !error.is_connect(), "{error:?}");
    assert_eq!(error.classify(), ErrorClass::Ambiguous);
}

#[tokio::test]
async fn http_hang_up_after_reading_the_request_is_ambiguous() {
    let addr = http_server().await;
    let error = post(format!("http://{addr}/drop")).await.expect_err("a hang-up");
    assert!(error.is_request() && !error.is_connect() && !error.is_timeout(), "{error:?}");
    assert_eq!(error.classify(), ErrorClass::Ambiguous);
}

#[tokio::test]
async fn http_redirect_loop_is_ambiguous() {
    let addr = http_server().await;
    let error = post(format!("http://{addr}/redirect")).await.expect_err("too many redirects");
    assert!(error.is_redirect(), "{error:?}");
    assert_eq!(error.classify(), ErrorClass::Ambiguous);
}

#[tokio::test]
async fn http_connection_refused_is_not_sent() {
    let port = closed_port();
    let error = post(format!("http://127.0.0.1:{port}/orders")).await.expect_err("refused");
    assert!(error.is_connect(), "{error:?}");
    assert_eq!(error.classify(), ErrorClass::NotSent);
    // reqwest's own text names the URL only; the cause says what happened.
    let text = error.describe();
    assert!(text.len() > error.to_string().len() && text.contains("onnect"), "{text}");
}

#[tokio::test]
async fn http_request_that_cannot_be_built_is_definitive() {
    let error = post("ftp://127.0.0.1/orders".to_owned()).await.expect_err("a bad scheme");
    assert!(error.is_builder(), "{error:?}");
    assert_eq!(error.classify(), ErrorClass::Definitive);
    let error = client()
        .post("http://127.0.0.1/orders")
        .header("X-Note", "two\nlines")
        .send()
        .await
        .expect_err("a bad header");
    assert!(error.is_builder(), "{error:?}");
    assert_eq!(error.classify(), ErrorClass::Definitive);
}

// ---------------------------------------------------------------- PostgreSQL

use tokio_postgres::{Client, NoTls};

async fn connect(url: &str) -> Client {
    let (client, connection) = tokio_postgres::connect(url, NoTls).await.expect("PostgreSQL");
    tokio::spawn(async move {
        let _ = connection.await;
    });
    client
}

/// A table of this test's own, `(id int primary key, v int)` with rows
/// `rows`, dropped again when the test ends.
struct Table<'c> {
    client: &'c Client,
    name: String,
}

impl<'c> Table<'c> {
    async fn new(client: &'c Client, test: &str, rows: &[i32]) -> Self {
        let name = format!("vt_classify_{test}_{}", std::process::id());
        client
            .batch_execute(&format!(
                "DROP TABLE IF EXISTS {name}; CREATE TABLE {name} (id int PRIMARY KEY, v int NOT NULL DEFAULT 0)"
            ))
            .await
            .expect("a table");
        for id in rows {
            client.execute(&format!("INSERT INTO {name} (id) VALUES ($1)"), &[id]).await.unwrap();
        }
        Self { client, name }
    }

    async fn count(&self) -> i64 {
        self.client
            .query_one(&format!("SELECT count(*) FROM {}", self.name), &[])
            .await
            .unwrap()
            .get(0)
    }

    async fn drop(self) {
        let _ = self.client.batch_execute(&format!("DROP TABLE IF EXISTS {}", self.name)).await;
    }
}

fn code(error: &tokio_postgres::Error) -> &str {
    error.code().map(|c| c.code()).unwrap_or("none")
}

#[tokio::test]
async fn pg_unique_violation_is_a_conflict() {
    let Some(url) = support::postgres::url() else { return };
    let client = connect(&url).await;
    let table = Table::new(&client, "unique", &[1]).await;
    let error = client
        .execute(&format!("INSERT INTO {} (id) VALUES (1)", table.name), &[])
        .await
        .expect_err("a duplicate key");
    assert_eq!(code(&error), "23505", "{error:?}");
    assert_eq!(error.classify(), ErrorClass::Conflict);
    // What the audit trail and the model read: the server's words, not
    // tokio-postgres's bare "db error".
    let text = error.describe();
    assert!(text.starts_with("db error: ") && text.contains("duplicate key value"), "{text}");
    table.drop().await;
}

#[tokio::test]
async fn pg_serialization_failure_rolled_back_is_not_sent() {
    let Some(url) = support::postgres::url() else { return };
    let (first, second) = (connect(&url).await, connect(&url).await);
    let table = Table::new(&first, "serialization", &[1]).await;
    let name = &table.name;
    // Both SERIALIZABLE: the first reads, the second updates and commits,
    // the first's update of the same row can no longer be serialized.
    first
        .batch_execute(&format!("BEGIN ISOLATION LEVEL SERIALIZABLE; SELECT v FROM {name}"))
        .await
        .unwrap();
    second
        .batch_execute(&format!(
            "BEGIN ISOLATION LEVEL SERIALIZABLE; UPDATE {name} SET v = v + 10 WHERE id = 1; COMMIT"
        ))
        .await
        .unwrap();
    let error = first
        .execute(&format!("UPDATE {name} SET v = v + 1 WHERE id = 1"), &[])
        .await
        .expect_err("a serialization failure");
    assert_eq!(code(&error), "40001", "{error:?}");
    assert_eq!(error.classify(), ErrorClass::NotSent);
    first.batch_execute("ROLLBACK").await.unwrap();
    // Nothing of the failed transaction remains.
    let v: i32 =
        first.query_one(&format!("SELECT v FROM {name} WHERE id = 1"), &[]).await.unwrap().get(0);
    assert_eq!(v, 10);
    table.drop().await;
}

#[tokio::test]
async fn pg_deadlock_victim_is_not_sent() {
    let Some(url) = support::postgres::url() else { return };
    let (first, second) = (connect(&url).await, connect(&url).await);
    let table = Table::new(&first, "deadlock", &[1, 2]).await;
    let name = &table.name;
    let update = |id: i32| format!("UPDATE {name} SET v = v + 1 WHERE id = {id}");
    first.batch_execute(&format!("BEGIN; {}", update(1))).await.unwrap();
    second.batch_execute(&format!("BEGIN; {}", update(2))).await.unwrap();
    // Each now waits for the row the other holds.
    let (first_waits, second_waits) = (update(2), update(1));
    let (a, b) = tokio::join!(first.execute(&first_waits, &[]), async {
        tokio::time::sleep(Duration::from_millis(200)).await;
        second.execute(&second_waits, &[]).await
    });
    let errors: Vec<_> = [&a, &b].into_iter().filter_map(|r| r.as_ref().err()).collect();
    assert_eq!(errors.len(), 1, "one victim: {a:?} {b:?}");
    assert_eq!(code(errors[0]), "40P01", "{:?}", errors[0]);
    assert_eq!(errors[0].classify(), ErrorClass::NotSent);
    first.batch_execute("ROLLBACK").await.unwrap();
    second.batch_execute("ROLLBACK").await.unwrap();
    table.drop().await;
}

#[tokio::test]
async fn pg_syntax_error_is_definitive() {
    let Some(url) = support::postgres::url() else { return };
    let client = connect(&url).await;
    let error = client.execute("INSRT INTO nowhere VALUES (1)", &[]).await.expect_err("syntax");
    assert_eq!(code(&error), "42601", "{error:?}");
    assert_eq!(error.classify(), ErrorClass::Definitive);
}

#[tokio::test]
async fn pg_statement_timeout_cancel_is_not_sent() {
    let Some(url) = support::postgres::url() else { return };
    let client = connect(&url).await;
    let table = Table::new(&client, "timeout", &[]).await;
    client.batch_execute("SET statement_timeout = '200ms'").await.unwrap();
    let error = client
        .execute(&format!("INSERT INTO {} (id) SELECT 1 FROM pg_sleep(10)", table.name), &[])
        .await
        .expect_err("canceled");
    assert_eq!(code(&error), "57014", "{error:?}");
    assert_eq!(error.classify(), ErrorClass::NotSent);
    client.batch_execute("RESET statement_timeout").await.unwrap();
    assert_eq!(table.count().await, 0, "the canceled insert committed nothing");
    table.drop().await;
}

#[tokio::test]
async fn pg_lock_timeout_is_not_sent() {
    let Some(url) = support::postgres::url() else { return };
    let (first, second) = (connect(&url).await, connect(&url).await);
    let table = Table::new(&first, "lock", &[1]).await;
    let name = &table.name;
    second.batch_execute(&format!("BEGIN; SELECT v FROM {name} FOR UPDATE")).await.unwrap();
    first.batch_execute("SET lock_timeout = '200ms'").await.unwrap();
    let error = first
        .execute(&format!("UPDATE {name} SET v = 1 WHERE id = 1"), &[])
        .await
        .expect_err("a lock timeout");
    assert_eq!(code(&error), "55P03", "{error:?}");
    assert_eq!(error.classify(), ErrorClass::NotSent);
    second.batch_execute("ROLLBACK").await.unwrap();
    table.drop().await;
}

#[tokio::test]
async fn pg_connection_killed_mid_query_is_ambiguous() {
    let Some(url) = support::postgres::url() else { return };
    let (victim, killer) = (connect(&url).await, connect(&url).await);
    let table = Table::new(&killer, "killed", &[]).await;
    let pid: i32 = victim.query_one("SELECT pg_backend_pid()", &[]).await.unwrap().get(0);
    let insert = format!("INSERT INTO {} (id) SELECT 1 FROM pg_sleep(30)", table.name);
    let kill = async {
        // Wait until the victim's statement is running, then end its session.
        for _ in 0..200 {
            let running: bool = killer
                .query_one(
                    "SELECT count(*) > 0 FROM pg_stat_activity \
                     WHERE pid = $1 AND state = 'active' AND query LIKE 'INSERT%'",
                    &[&pid],
                )
                .await
                .unwrap()
                .get(0);
            if running {
                break;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let killed: bool =
            killer.query_one("SELECT pg_terminate_backend($1)", &[&pid]).await.unwrap().get(0);
        assert!(killed);
    };
    let (result, ()) = tokio::join!(victim.execute(&insert, &[]), kill);
    let error = result.expect_err("the session was ended");
    // PostgreSQL says why (57P01 admin_shutdown, FATAL) when it can; a
    // connection that just breaks is an I/O error or "closed". All three
    // are what a lost COMMIT answer looks like.
    assert!(matches!(code(&error), "57P01" | "none"), "unexpected server error: {error:?}");
    assert_eq!(error.classify(), ErrorClass::Ambiguous, "{error:?}");
    // The next request on the dead client: "connection closed", which
    // tokio-postgres also returns for an answer that never came.
    for _ in 0..100 {
        if victim.is_closed() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let error = victim.execute("SELECT 1", &[]).await.expect_err("closed");
    assert!(error.is_closed(), "{error:?}");
    assert_eq!(error.classify(), ErrorClass::Ambiguous);
    table.drop().await;
}

#[tokio::test]
async fn pg_result_that_cannot_be_read_after_the_write_ran_is_ambiguous() {
    let Some(url) = support::postgres::url() else { return };
    let client = connect(&url).await;
    let table = Table::new(&client, "rowcount", &[]).await;
    // `query_one` of a statement that returns two rows: an error, after the
    // insert committed both.
    let error = client
        .query_one(&format!("INSERT INTO {} (id) VALUES (1), (2) RETURNING id", table.name), &[])
        .await
        .expect_err("two rows");
    assert!(error.code().is_none(), "{error:?}");
    assert_eq!(error.classify(), ErrorClass::Ambiguous);
    assert_eq!(table.count().await, 2, "the write happened");
    // A column of the wrong type: also read after the statement ran.
    let row = client.query_one("SELECT 1::int4", &[]).await.unwrap();
    let error = row.try_get::<_, String>(0).expect_err("not text");
    assert_eq!(error.classify(), ErrorClass::Ambiguous);
    table.drop().await;
}

#[tokio::test]
async fn pg_wrong_parameter_count_is_never_sent_and_definitive() {
    let Some(url) = support::postgres::url() else { return };
    let client = connect(&url).await;
    let error = client.execute("SELECT $1::int4", &[]).await.expect_err("a missing parameter");
    assert!(error.code().is_none(), "{error:?}");
    assert_eq!(error.classify(), ErrorClass::Definitive, "{error}");
}

#[tokio::test]
async fn pg_connection_refused_is_not_sent() {
    // No server needed: nothing listens on the port.
    let port = closed_port();
    let config = format!("host=127.0.0.1 port={port} user=postgres connect_timeout=5");
    let error = tokio_postgres::connect(&config, NoTls).await.map(|_| ()).expect_err("refused");
    assert_eq!(error.classify(), ErrorClass::NotSent, "{error:?}");
    let error = "port=notanumber".parse::<tokio_postgres::Config>().expect_err("bad settings");
    assert_eq!(error.classify(), ErrorClass::Definitive, "{error:?}");
}
