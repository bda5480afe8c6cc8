//! `--ledger`: where the experiment's calls are recorded. The SQLite and
//! Redis stores are features of this package (`sqlite`, `redis`), off by
//! default so that the README's first command builds neither.

use std::str::FromStr;
use std::sync::Arc;

use verified_tools::ledger::Ledger;

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
        } else {
            Err(format!("unknown ledger {s:?}: expected memory, sqlite:PATH or redis://HOST:PORT/"))
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
            Self::Redis(url) => Ok(Some(Arc::new(super::redis::RealTime::connect(url)?))),
            #[cfg(not(feature = "sqlite"))]
            Self::Sqlite(path) => {
                Err(left_out("SQLite", "sqlite", format_args!("sqlite:{}", path.display())))
            }
            #[cfg(not(feature = "redis"))]
            Self::Redis(url) => Err(left_out("Redis", "redis", url)),
        }
    }
}

/// What `open` says of a store this build left out: the command that
/// brings it, with the user's own `--ledger`.
#[cfg(not(all(feature = "sqlite", feature = "redis")))]
fn left_out(store: &str, feature: &str, choice: impl std::fmt::Display) -> String {
    format!(
        "this build has no {store} ledger: run `cargo run --release --example agent \
         --features {feature} -- --ledger {choice}`"
    )
}
