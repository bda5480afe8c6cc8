//! One verified tool, one call: `cargo run --example quickstart`.
//!
//! The mail service is a stand-in in memory; a real tool sends `key` as an
//! `Idempotency-Key` header (see `examples/backend.rs`).

use std::sync::Mutex;

use verified_tools::verified_tool;
use verified_tools::{Classify, Context, ErrorClass, IdempotencyKey, ToolResult, Verdict};

/// A mail service: whom it welcomed, under which key.
#[derive(Default)]
pub struct Mailer(Mutex<Vec<(String, IdempotencyKey)>>);

impl Mailer {
    /// How many mails went out.
    pub fn sent(&self) -> usize {
        self.0.lock().unwrap().len()
    }
}

/// The service did not answer: the mail may or may not have gone out.
#[derive(Debug, thiserror::Error)]
#[error("the mail service timed out")]
pub struct Timeout;

impl Classify for Timeout {
    fn classify(&self) -> ErrorClass {
        ErrorClass::Ambiguous
    }
}

/// Sends the welcome mail, once per address: `key(to)` names the action.
#[verified_tool(side_effect = "high", verify = welcomed, skip(mailer), key(to))]
pub async fn send_welcome(
    mailer: &Mailer,
    to: &str,
    key: IdempotencyKey,
) -> Result<usize, Timeout> {
    let mut sent = mailer.0.lock().unwrap();
    sent.push((to.to_owned(), key));
    Ok(sent.len())
}

/// Read-only, the postcondition: has `to` been welcomed?
async fn welcomed(mailer: &Mailer, to: &str) -> Verdict<usize> {
    let sent = mailer.0.lock().unwrap();
    sent.iter().position(|(address, _)| address == to).map(|i| i + 1).into()
}

/// The call, then the same call again (a model that asks twice).
pub async fn run(mailer: &Mailer) -> [ToolResult<usize, Timeout>; 2] {
    let cx = Context::new("quickstart");
    let first = send_welcome(&cx, mailer, "ada@example.com").await;
    let again = send_welcome(&cx, mailer, "ada@example.com").await;
    [first, again]
}

#[tokio::main(flavor = "current_thread")]
async fn main() {
    let mailer = Mailer::default();
    for result in run(&mailer).await {
        match result {
            ToolResult::Success { value, proof, key } => {
                println!("sent (#{value}, {proof:?}, key {key})")
            }
            other => println!("not proven: {other:?}"),
        }
    }
    println!("mails sent: {}", mailer.sent());
}
