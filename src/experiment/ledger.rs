//! `--ledger`: where the experiment's calls are recorded. The SQLite, Redis
//! and PostgreSQL stores are features of this package (`sqlite`, `redis`,
//! `postgres`), off by default so that the README's first command builds
//! none of them.

use std::str::FromStr;
use std::sync::Arc;

use verified_tools::ledger::Ledger;
#[cfg(feature = "postgres")]
use verified_tools::ledger::PostgresLedger;
#[cfg(feature = "redis")]
use verified_tools::ledger::RedisLedger;

#[cfg(any(feature = "redis", feature = "postgres"))]
use super::real_time::RealTime;

/// Where the experiment's calls are recorded.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum LedgerChoice {
    /// An in-memory ledger per episode (the default).
    #[default]
    Memory,
    /// One SQLite file for the whole run (`sqlite:PATH`).
    Sqlite(std::path::PathBuf),
    /// One Redis server for the whole run (`redis://HOST:PORT/`).
    Redis(String),
    /// One PostgreSQL database for the whole run
    /// (`postgres://USER@HOST:PORT/DB`).
    Postgres(String),
}

impl FromStr for LedgerChoice {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        if s == "memory" {
            Ok(Self::Memory)
        } else if let Some(path) = s.strip_prefix("sqlite:") {
            Ok(Self::Sqlite(path.into()))
        } else if s.starts_with("redis://") || s.starts_with("rediss://") {
            Ok(Self::Redis(s.to_owned()))
        } else if s.starts_with("postgres://") || s.starts_with("postgresql://") {
            Ok(Self::Postgres(s.to_owned()))
        } else {
            Err(format!(
                "unknown ledger {s:?}: expected memory, sqlite:PATH, redis://HOST:PORT/ or \
                 postgres://USER@HOST:PORT/DB"
            ))
        }
    }
}

impl LedgerChoice {
    /// A handle on the chosen store, for one worker thread; `None` for the
    /// in-memory default. Call it outside any runtime.
    pub fn open(&self) -> Result<Option<Arc<dyn Ledger>>, String> {
        match self {
            Self::Memory => Ok(None),
            #[cfg(feature = "sqlite")]
            Self::Sqlite(path) => {
                let ledger = verified_tools::ledger::SqliteLedger::open(path)
                    .map_err(|e| format!("{}: {e}", path.display()))?;
                Ok(Some(Arc::new(ledger)))
            }
            #[cfg(feature = "redis")]
            Self::Redis(url) => {
                let connect = |url: String| async move { RedisLedger::connect(&url).await };
                Ok(Some(Arc::new(RealTime::connect(url, connect)?)))
            }
            #[cfg(feature = "postgres")]
            Self::Postgres(url) => {
                let connect = |url: String| async move { PostgresLedger::connect(&url).await };
                Ok(Some(Arc::new(RealTime::connect(url, connect)?)))
            }
            #[cfg(not(feature = "sqlite"))]
            Self::Sqlite(path) => {
                Err(left_out("SQLite", "sqlite", format_args!("sqlite:{}", path.display())))
            }
            #[cfg(not(feature = "redis"))]
            Self::Redis(url) => Err(left_out("Redis", "redis", url)),
            #[cfg(not(feature = "postgres"))]
            Self::Postgres(url) => Err(left_out("PostgreSQL", "postgres", url)),
        }
    }
}

/// What `open` says of a store this build left out: the command that
/// brings it, with the user's own `--ledger`.
#[cfg(not(all(feature = "sqlite", feature = "redis", feature = "postgres")))]
fn left_out(store: &str, feature: &str, choice: impl std::fmt::Display) -> String {
    format!(
        "this build has no {store} ledger: run `cargo run --release --example agent \
         --features {feature} -- --ledger {choice}`"
    )
}
