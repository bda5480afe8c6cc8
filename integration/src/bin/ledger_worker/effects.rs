//! Where the worker's effect lands: a line in a file (the default), or a
//! row in an SQLite table (`--effects-db`), written plainly or with the
//! call's fence checked by the database itself (`--write fenced`).

use std::io::Write as _;
use std::path::PathBuf;
use std::time::Duration;

use rusqlite::{Connection, OptionalExtension, params};
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

/// The effect store.
#[derive(Debug, Clone)]
pub enum Store {
    File(PathBuf),
    Db(PathBuf, Write),
}

/// The plain table: any number of rows per key.
pub const PLAIN: &str = "effects";
/// The fenced table: one row per key, the newest holder's.
pub const FENCED: &str = "fenced_effects";

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

impl Store {
    /// Applies the effect of `key` under `fence`; a fenced write the
    /// database refused (a later holder wrote) is a definitive error: this
    /// write did not apply.
    pub fn write(&self, key: IdempotencyKey, fence: Option<Fence>) -> Result<(), ErrorClass> {
        let pid = std::process::id();
        match self {
            Store::File(path) => {
                let mut file = std::fs::OpenOptions::new()
                    .create(true)
                    .append(true)
                    .open(path)
                    .map_err(|_| ErrorClass::NotSent)?;
                let line = format!("{key} {pid}\n");
                file.write_all(line.as_bytes()).map_err(|_| ErrorClass::Ambiguous)
            }
            Store::Db(path, how) => {
                let conn = connect(path).map_err(|_| ErrorClass::NotSent)?;
                let fence = i64::try_from(fence.map_or(0, |f| f.0)).unwrap_or(i64::MAX);
                let key = key.to_string();
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
                }
                .map_err(|_| ErrorClass::Ambiguous)?;
                if changed == 0 { Err(ErrorClass::Definitive) } else { Ok(()) }
            }
        }
    }

    /// The postcondition: is there an effect of `key`?
    pub fn holds(&self, key: IdempotencyKey) -> Verdict<()> {
        let key = key.to_string();
        match self {
            Store::File(path) => match std::fs::read_to_string(path) {
                Ok(text) => text.lines().any(|l| l.starts_with(&key)).then_some(()).into(),
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => Verdict::Absent,
                Err(_) => Verdict::Unknown,
            },
            Store::Db(path, how) => {
                let table = if *how == Write::Fenced { FENCED } else { PLAIN };
                let found = connect(path).and_then(|conn| {
                    conn.query_row(
                        &format!("SELECT 1 FROM {table} WHERE key = ?1 LIMIT 1"),
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
        }
    }
}
