//! How a [`PostgresLedger`] is opened: the names of its schema, the bound
//! on each operation, whether it creates the schema, and where its
//! connections come from. Apart from the handle because it runs once, when
//! the ledger opens: nothing here is on the path of an operation.

use std::fmt;
use std::future::Future;
use std::sync::atomic::AtomicU32;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio_postgres::tls::{MakeTlsConnect, TlsConnect};
use tokio_postgres::{Client, Config, NoTls, Socket};

use super::connection::{BoxFuture, FnPool, Own, Source};
use super::failure::kept;
use super::operations::Inner;
use super::sql::{self, Statements};
use super::{LedgerError, PostgresLedger};

/// How a [`PostgresLedger`] is opened: the names of its schema, the bound
/// on each operation, whether it creates the schema, and where its
/// connections come from (the method that ends the chain).
///
/// ```no_run
/// use std::time::Duration;
/// use verified_tools::ledger::PostgresLedger;
///
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let (client, connection) =
///     tokio_postgres::connect("postgres://agent@localhost/app", tokio_postgres::NoTls).await?;
/// tokio::spawn(connection);
/// let ledger = PostgresLedger::builder()
///     .with_schema("ledger")
///     .with_timeout(Duration::from_secs(5))
///     .on_client(client)
///     .await?;
/// # let _ = ledger; Ok(()) }
/// ```
#[derive(Debug, Clone)]
pub struct PostgresLedgerBuilder {
    schema: String,
    prefix: String,
    timeout: Duration,
    create: bool,
}

impl Default for PostgresLedgerBuilder {
    fn default() -> Self {
        Self {
            schema: PostgresLedger::DEFAULT_SCHEMA.to_owned(),
            prefix: PostgresLedger::DEFAULT_PREFIX.to_owned(),
            timeout: PostgresLedger::DEFAULT_TIMEOUT,
            create: true,
        }
    }
}

impl PostgresLedgerBuilder {
    /// Sets the PostgreSQL schema the ledger's table, sequence and functions
    /// are in (`public` by default): letters, digits and `_`, case kept.
    pub fn with_schema(mut self, schema: impl Into<String>) -> Self {
        self.schema = schema.into();
        self
    }

    /// Sets the prefix of the ledger's names in its schema (`vt_` by
    /// default): ledgers with different prefixes in one database are
    /// separate, each with its own fence sequence. Letters, digits and `_`,
    /// up to 49 of them. Every process sharing the records must use the
    /// same schema and prefix.
    pub fn with_prefix(mut self, prefix: impl Into<String>) -> Self {
        self.prefix = prefix.into();
        self
    }

    /// Sets the bound on each operation, a reconnection included
    /// ([`PostgresLedger::DEFAULT_TIMEOUT`] by default): long enough for the
    /// server's commit under load, short enough that calls are refused
    /// promptly when the database is down.
    pub fn with_timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        self
    }

    /// Whether opening creates the schema when it is missing (`true`, the
    /// default). With `false`, a missing schema fails the opening with
    /// [`LedgerError::Unavailable`]: create it beforehand from
    /// [`schema_sql`](Self::schema_sql).
    pub fn with_schema_creation(mut self, create: bool) -> Self {
        self.create = create;
        self
    }

    /// The DDL of the schema for these names, for a migration: what the
    /// ledger runs when it creates the schema. One transaction: run it as
    /// one script (`psql -1 -f`). Fails when a name is not allowed.
    ///
    /// The script is idempotent and upgrades an older version in place:
    /// version 2 added the functions of transactional tools (`tx_open`,
    /// `tx_complete`). A ledger that may create the schema upgrades it when
    /// it opens; one that may not refuses an older version, and says so.
    pub fn schema_sql(&self) -> Result<String, LedgerError> {
        sql::check_names(&self.schema, &self.prefix)?;
        Ok(sql::schema_sql(&self.schema, &self.prefix))
    }

    /// Opens the ledger on a connection of its own to `url`, without TLS: a
    /// URL (`postgres://user:password@host:port/dbname`) or `key=value`
    /// pairs, as tokio-postgres reads them. Fails with
    /// [`LedgerError::Unavailable`] when the server cannot be reached or the
    /// schema cannot be created or is of another version.
    pub async fn connect(self, url: &str) -> Result<PostgresLedger, LedgerError> {
        self.connect_tls(url, NoTls).await
    }

    /// Like [`connect`](Self::connect), through `tls` (a tokio-postgres TLS
    /// connector), for this connection and every reconnection.
    pub async fn connect_tls<T>(self, url: &str, tls: T) -> Result<PostgresLedger, LedgerError>
    where
        T: MakeTlsConnect<Socket> + Clone + Send + Sync + 'static,
        T::Stream: Send + 'static,
        T::TlsConnect: Send,
        <T::TlsConnect as TlsConnect<Socket>>::Future: Send,
    {
        let mut config: Config =
            url.parse().map_err(|e| LedgerError::Unavailable(kept("postgres: ", e)))?;
        if config.get_connect_timeout().is_none() {
            config.connect_timeout(self.timeout);
        }
        if config.get_application_name().is_none() {
            // So that an operator can tell the ledger's sessions apart.
            config.application_name("verified-tools ledger");
        }
        let connect = move || -> BoxFuture<'static, Result<Client, tokio_postgres::Error>> {
            let (config, tls) = (config.clone(), tls.clone());
            Box::pin(async move {
                let (client, connection) = config.connect(tls).await?;
                // It ends when the server closes the connection or the
                // client is dropped; its error is what the next request
                // on the client fails with.
                tokio::spawn(connection);
                Ok(client)
            })
        };
        let own = Own {
            connect: Box::new(connect),
            current: Mutex::new(None),
            connecting: tokio::sync::Mutex::new(()),
        };
        self.open(Source::Own(own)).await
    }

    /// Opens the ledger on `client`, connected by the application (its
    /// connection task running), and shared by the ledger's operations.
    /// The ledger cannot reconnect it: see [Connections](PostgresLedger#connections).
    pub async fn on_client(self, client: Client) -> Result<PostgresLedger, LedgerError> {
        self.open(Source::Given(Arc::new(client))).await
    }

    /// Opens the ledger on a pool: `get` checks out a connection for one
    /// operation (a `deadpool_postgres::Object`, a `bb8::PooledConnection`,
    /// anything that hands its connection back when dropped) and `client`
    /// reaches the `tokio_postgres::Client` in it. See
    /// [Connections](PostgresLedger#connections) for deadpool and bb8.
    pub async fn on_pool<F, Fut, C, E>(
        self,
        get: F,
        client: fn(&C) -> &Client,
    ) -> Result<PostgresLedger, LedgerError>
    where
        F: Fn() -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<C, E>> + Send + 'static,
        C: Send + 'static,
        E: fmt::Display,
    {
        self.open(Source::Pool(Box::new(FnPool { get, client }))).await
    }

    async fn open(self, source: Source) -> Result<PostgresLedger, LedgerError> {
        sql::check_names(&self.schema, &self.prefix)?;
        let inner = Inner {
            sql: Statements::new(&self.schema, &self.prefix),
            source,
            timeout: self.timeout,
            schema: self.schema,
            prefix: self.prefix,
            finishes: AtomicU32::new(0),
        };
        inner.ensure_schema(self.create).await?;
        Ok(PostgresLedger {
            inner: Arc::new(inner),
            lease: Duration::from_secs(600),
            ttl: Duration::from_secs(24 * 3600),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_documented_schema_is_the_one_created() {
        let builder = PostgresLedger::builder();
        assert_eq!(builder.schema_sql().unwrap(), sql::SCHEMA);
        let other = builder.with_schema("ops").with_prefix("agent_");
        assert!(other.schema_sql().unwrap().contains("\"ops\".\"agent_claim\""));
        assert!(other.with_prefix("no-dash").schema_sql().is_err());
    }
}
