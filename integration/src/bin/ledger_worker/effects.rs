//! Where the worker's effect lands: a line in a file (the default), or a
//! row in a table, of an SQLite file (`--effects-db`) or of a PostgreSQL
//! database (`--effects-pg URL`), written as `--write` says.
//!
//! Each table store has both tables: `effects` (any number of rows per
//! key) and `fenced_effects` (one row per key). A [`Write`] mode picks the
//! table and the statement; each store turns the mode into its own SQL
//! ([`Store::write`] matches on it), so a new mode is a variant of
//! [`Write`] and an arm per table store (the file store has no modes).

use std::io::Write as _;
use std::path::PathBuf;
use std::time::Duration;

use rusqlite::{Connection, OptionalExtension, params};
use tokio_postgres::{Client, NoTls};
use verified_tools::ledger::Fence;
use verified_tools::{ErrorClass, IdempotencyKey, Verdict};

/// How a row is written.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Write {
    /// `INSERT`, nothing checked: a late write is a second row.
    Plain,
    /// One row per key, and a write under an older fence than the row's is
    /// refused by the database (`ON CONFLICT .. WHERE fence < excluded.fence`).
    Fenced,
}

impl Write {
    pub fn parse(name: &str) -> Result<Self, String> {
        match name {
            "plain" => Ok(Write::Plain),
            "fenced" => Ok(Write::Fenced),
            other => Err(format!("--write {other}: plain or fenced")),
        }
    }

    /// The table this mode writes (and the postcondition reads).
    pub fn table(self) -> &'static str {
        match self {
            Write::Plain => PLAIN,
            Write::Fenced => FENCED,
        }
    }
}

/// The effect store.
#[derive(Debug, Clone)]
pub enum Store {
    File(PathBuf),
    Sqlite(PathBuf, Write),
    Postgres(Postgres, Write),
}

/// The plain table: any number of rows per key.
pub const PLAIN: &str = "effects";
/// The fenced table: one row per key, the newest holder's.
pub const FENCED: &str = "fenced_effects";

/// A fence as the tables keep it (`0`: written without one).
fn fence_column(fence: Option<Fence>) -> i64 {
    i64::try_from(fence.map_or(0, |f| f.0)).unwrap_or(i64::MAX)
}

fn connect(path: &PathBuf) -> Result<Connection, rusqlite::Error> {
    let conn = Connection::open(path)?;
    conn.busy_timeout(Duration::from_secs(30))?;
    conn.execute_batch(
        "CREATE TABLE IF NOT EXISTS effects (key TEXT NOT NULL, pid INTEGER NOT NULL,
             fence INTEGER NOT NULL);
         CREATE TABLE IF NOT EXISTS fenced_effects (key TEXT PRIMARY KEY, pid INTEGER NOT NULL,
             fence INTEGER NOT NULL);",
    )?;
    Ok(conn)
}

/// The effects tables in a PostgreSQL database, in schema `schema`.
///
/// Each operation runs on a session and a thread of its own, and the caller
/// waits for it as for an SQLite statement: a write, once begun, runs to its
/// answer. An async write on the worker's runtime would not: a worker
/// continued after a pause finds its attempt's timeout expired, and the
/// engine drops the tool's future at its first `await`, the write unsent.
/// The late write the fence must refuse would never reach the database.
#[derive(Debug, Clone)]
pub struct Postgres {
    url: String,
    schema: String,
}

/// Where a PostgreSQL operation failed.
enum Failed {
    /// No session: nothing was sent.
    Connect,
    /// Sent, and no answer: a write may have committed.
    Statement,
}

impl Postgres {
    /// Connects to `url` (a URL or `key=value` pairs) and creates the schema
    /// and both tables if they are missing: under a transaction-scoped
    /// advisory lock, as workers starting at once race to create them.
    pub fn open(url: &str, schema: &str) -> Result<Self, String> {
        if schema.is_empty() || !schema.chars().all(|c| c.is_ascii_alphanumeric() || c == '_') {
            return Err(format!("--pg-schema {schema}: letters, digits and _"));
        }
        let store = Self { url: url.to_owned(), schema: schema.to_owned() };
        let tables = format!(
            "BEGIN;
             SELECT pg_advisory_xact_lock(7217002);
             CREATE SCHEMA IF NOT EXISTS \"{schema}\";
             CREATE TABLE IF NOT EXISTS \"{schema}\".effects (key TEXT NOT NULL,
                 pid BIGINT NOT NULL, fence BIGINT NOT NULL);
             CREATE TABLE IF NOT EXISTS \"{schema}\".fenced_effects (key TEXT PRIMARY KEY,
                 pid BIGINT NOT NULL, fence BIGINT NOT NULL);
             COMMIT;"
        );
        match store.session(async |db| db.batch_execute(&tables).await) {
            Ok(()) => Ok(store),
            Err(Failed::Connect) => Err(format!("--effects-pg {url}: no connection")),
            Err(Failed::Statement) => Err(format!("--effects-pg {url}: the tables not created")),
        }
    }

    /// Runs `f` on a session of its own, on a thread of its own (with a
    /// runtime of its own), and waits for its end.
    fn session<T: Send>(
        &self,
        f: impl AsyncFnOnce(&Client) -> Result<T, tokio_postgres::Error> + Send,
    ) -> Result<T, Failed> {
        std::thread::scope(|scope| {
            let job = scope.spawn(|| {
                let rt = tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                    .map_err(|_| Failed::Connect)?;
                rt.block_on(async {
                    let (client, connection) = tokio_postgres::connect(&self.url, NoTls)
                        .await
                        .map_err(|_| Failed::Connect)?;
                    tokio::spawn(connection);
                    f(&client).await.map_err(|_| Failed::Statement)
                })
            });
            job.join().unwrap_or(Err(Failed::Statement))
        })
    }

    fn write(&self, how: Write, key: &str, fence: i64) -> Result<u64, ErrorClass> {
        let (s, pid) = (&self.schema, i64::from(std::process::id()));
        let statement = match how {
            Write::Plain => {
                format!("INSERT INTO \"{s}\".effects (key, pid, fence) VALUES ($1, $2, $3)")
            }
            Write::Fenced => format!(
                "INSERT INTO \"{s}\".fenced_effects AS row (key, pid, fence) VALUES ($1, $2, $3)
                 ON CONFLICT (key) DO UPDATE SET pid = excluded.pid, fence = excluded.fence
                 WHERE row.fence < excluded.fence"
            ),
        };
        let written =
            self.session(async |db| db.execute(statement.as_str(), &[&key, &pid, &fence]).await);
        written.map_err(|failed| match failed {
            Failed::Connect => ErrorClass::NotSent,
            Failed::Statement => ErrorClass::Ambiguous,
        })
    }

    fn holds(&self, how: Write, key: &str) -> Verdict<()> {
        let statement =
            format!("SELECT 1 FROM \"{}\".{} WHERE key = $1 LIMIT 1", self.schema, how.table());
        match self.session(async |db| db.query_opt(statement.as_str(), &[&key]).await) {
            Ok(found) => found.map(|_| ()).into(),
            Err(_) => Verdict::Unknown,
        }
    }
}

impl Store {
    /// Applies the effect of `key` under `fence`; a fenced write the
    /// database refused (a later holder wrote) is a definitive error: this
    /// write did not apply.
    pub async fn write(&self, key: IdempotencyKey, fence: Option<Fence>) -> Result<(), ErrorClass> {
        let pid = std::process::id();
        let changed = match self {
            Store::File(path) => {
                let mut file = std::fs::OpenOptions::new()
                    .create(true)
                    .append(true)
                    .open(path)
                    .map_err(|_| ErrorClass::NotSent)?;
                let line = format!("{key} {pid}\n");
                return file.write_all(line.as_bytes()).map_err(|_| ErrorClass::Ambiguous);
            }
            Store::Sqlite(path, how) => {
                let conn = connect(path).map_err(|_| ErrorClass::NotSent)?;
                let (key, fence) = (key.to_string(), fence_column(fence));
                let changed = match how {
                    Write::Plain => conn.execute(
                        "INSERT INTO effects (key, pid, fence) VALUES (?1, ?2, ?3)",
                        params![key, pid, fence],
                    ),
                    Write::Fenced => conn.execute(
                        "INSERT INTO fenced_effects (key, pid, fence) VALUES (?1, ?2, ?3)
                         ON CONFLICT (key) DO UPDATE SET pid = excluded.pid, fence = excluded.fence
                         WHERE fenced_effects.fence < excluded.fence",
                        params![key, pid, fence],
                    ),
                };
                changed.map_err(|_| ErrorClass::Ambiguous)? as u64
            }
            Store::Postgres(db, how) => db.write(*how, &key.to_string(), fence_column(fence))?,
        };
        if changed == 0 { Err(ErrorClass::Definitive) } else { Ok(()) }
    }

    /// The postcondition: is there an effect of `key`?
    pub async fn holds(&self, key: IdempotencyKey) -> Verdict<()> {
        let key = key.to_string();
        match self {
            Store::File(path) => match std::fs::read_to_string(path) {
                Ok(text) => text.lines().any(|l| l.starts_with(&key)).then_some(()).into(),
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => Verdict::Absent,
                Err(_) => Verdict::Unknown,
            },
            Store::Sqlite(path, how) => {
                let found = connect(path).and_then(|conn| {
                    conn.query_row(
                        &format!("SELECT 1 FROM {} WHERE key = ?1 LIMIT 1", how.table()),
                        [key],
                        |_| Ok(()),
                    )
                    .optional()
                });
                match found {
                    Ok(found) => found.into(),
                    Err(_) => Verdict::Unknown,
                }
            }
            Store::Postgres(db, how) => db.holds(*how, &key),
        }
    }
}
