//! `--write transactional`: the effect row and the call's ledger record
//! commit in one PostgreSQL transaction (`PostgresLedger::transact`). The
//! row goes to the plain `effects` table (no unique constraint): a second
//! row for a key would be a duplicate the transaction let through.
//!
//! With `--stop-before-send` the body hands its `INSERT` to tokio-postgres
//! (one poll: queued for the connection, not yet sent) and then stops the
//! process: a worker paused with a write in flight, inside its transaction.
//! With `--crash-after-dispatch` it prints `dispatched KEY` once the row is
//! written (not committed) and hangs, for the test to `kill -9` it.

use std::future::Future;
use std::task::{Context as TaskContext, Waker};

use tokio_postgres::{Client, NoTls};
use verified_tools::ledger::{PostgresLedger, TxError};
use verified_tools::{Context, ToolResult, ToolSpec};

/// A connection for the calls: the last one while it lives.
pub struct Connection {
    url: String,
    client: Option<Client>,
}

impl Connection {
    pub fn new(url: &str) -> Self {
        Self { url: url.to_owned(), client: None }
    }

    /// The live connection, or a new one: tried for up to 2 s, as a pool
    /// waits for a connection (a server restarting takes that long).
    async fn client(&mut self) -> Result<&mut Client, tokio_postgres::Error> {
        if self.client.as_ref().is_none_or(Client::is_closed) {
            let until = tokio::time::Instant::now() + std::time::Duration::from_secs(2);
            let (client, connection) = loop {
                match tokio_postgres::connect(&self.url, NoTls).await {
                    Ok(connected) => break connected,
                    Err(_) if tokio::time::Instant::now() < until => {
                        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
                    }
                    Err(e) => return Err(e),
                }
            };
            tokio::spawn(connection);
            self.client = Some(client);
        }
        Ok(self.client.as_mut().expect("just connected"))
    }
}

pub type Sent = ToolResult<(), TxError<tokio_postgres::Error>>;

/// One logical call: the welcome of `step`, as one row in `schema.effects`.
pub async fn send(
    ledger: &PostgresLedger,
    cx: &Context,
    spec: &'static ToolSpec,
    connection: &mut Connection,
    schema: &str,
    step: u64,
    mode: crate::Mode,
) -> Result<Sent, tokio_postgres::Error> {
    let crate::Mode { stop, crash, .. } = mode;
    let insert = format!("INSERT INTO \"{schema}\".effects (key, pid, fence) VALUES ($1, $2, 0)");
    let insert = insert.as_str();
    let pid = i64::from(std::process::id());
    let client = connection.client().await?;
    let sent = ledger
        .transact(cx, spec, client, &("welcome", step), &(), |tx| {
            Box::pin(async move {
                let key = tx.key().to_string();
                let params: [&(dyn tokio_postgres::types::ToSql + Sync); 2] = [&key, &pid];
                let mut write = std::pin::pin!(tx.execute(insert, &params));
                if stop {
                    // Queued on its first poll; then the process stops.
                    let _ = write.as_mut().poll(&mut TaskContext::from_waker(Waker::noop()));
                    crate::stop_here(tx.key());
                }
                write.await?;
                if crash {
                    // Written, not committed: killed here, it rolls back.
                    println!("dispatched {}", tx.key());
                    let _ = std::io::Write::flush(&mut std::io::stdout());
                    std::future::pending::<()>().await;
                }
                Ok(())
            })
        })
        .await;
    Ok(sent)
}
