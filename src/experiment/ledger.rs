//! `--ledger`: where the experiment's calls are recorded. The SQLite, Redis
//! and PostgreSQL stores are features of this package (`sqlite`, `redis`,
//! `postgres`), off by default so that the README's first command builds
//! none of them.

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
            Self::Redis(url) => Ok(Some(Arc::new(super::redis::RealTime::connect(url)?))),
            #[cfg(feature = "postgres")]
            Self::Postgres(url) => Ok(Some(Arc::new(postgres::RealTime::connect(url)?))),
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

/// The experiment's PostgreSQL ledger (feature `postgres`).
#[cfg(feature = "postgres")]
mod postgres {
    use std::sync::Arc;
    use std::time::Duration;

    use verified_tools::IdempotencyKey;
    use verified_tools::ledger::{
        Claim, ClaimRequest, End, Fence, Ledger, LedgerError, LedgerFuture, PostgresLedger,
        Progress, Recorded,
    };

    /// A PostgreSQL ledger seen from the experiment's paused-time runtimes,
    /// as `super::redis::RealTime` is for Redis: paused time would fire the
    /// ledger's timeouts at once, so each operation runs on a real-time
    /// runtime of its own (where the connection's task lives too), from a
    /// blocking thread, while which tokio does not advance a paused clock.
    pub(super) struct RealTime {
        ledger: Arc<PostgresLedger>,
        rt: Arc<tokio::runtime::Runtime>,
    }

    impl RealTime {
        pub(super) fn connect(url: &str) -> Result<Self, String> {
            let rt = tokio::runtime::Builder::new_multi_thread()
                .worker_threads(1)
                .enable_all()
                .build()
                .map_err(|e| format!("a runtime for PostgreSQL: {e}"))?;
            let ledger =
                rt.block_on(PostgresLedger::connect(url)).map_err(|e| format!("{url}: {e}"))?;
            Ok(Self { ledger: Arc::new(ledger), rt: Arc::new(rt) })
        }

        fn run<T, F>(
            &self,
            op: impl FnOnce(Arc<PostgresLedger>) -> F + Send + 'static,
        ) -> LedgerFuture<'_, T>
        where
            T: Send + 'static,
            F: std::future::Future<Output = Result<T, LedgerError>>,
        {
            let (ledger, rt) = (Arc::clone(&self.ledger), Arc::clone(&self.rt));
            LedgerFuture::boxed(async move {
                tokio::task::spawn_blocking(move || rt.block_on(op(ledger)))
                    .await
                    .unwrap_or_else(|e| Err(LedgerError::Unavailable(e.to_string())))
            })
        }
    }

    /// A completed value, materialized so that it can cross to another thread.
    struct Owned {
        local: Arc<dyn std::any::Any + Send + Sync>,
        encoded: Option<Vec<u8>>,
    }

    impl Recorded for Owned {
        fn local(&self) -> Arc<dyn std::any::Any + Send + Sync> {
            Arc::clone(&self.local)
        }

        fn encode(&self) -> Option<Vec<u8>> {
            self.encoded.clone()
        }
    }

    impl Ledger for RealTime {
        fn claim(&self, request: ClaimRequest) -> LedgerFuture<'_, Claim> {
            self.run(move |l| async move { l.claim(request).await })
        }

        fn dispatching(
            &self,
            key: IdempotencyKey,
            fence: Fence,
            progress: Progress,
        ) -> LedgerFuture<'_, ()> {
            self.run(move |l| async move { l.dispatching(key, fence, progress).await })
        }

        fn finish<'a>(
            &'a self,
            key: IdempotencyKey,
            fence: Fence,
            end: End<'a>,
        ) -> LedgerFuture<'a, ()> {
            let owned = match &end {
                End::Completed(value) => {
                    Some(Owned { local: value.local(), encoded: value.encode() })
                }
                End::Settled | End::InDoubt => None,
            };
            let settled = matches!(end, End::Settled);
            self.run(move |l| async move {
                let end = match &owned {
                    Some(value) => End::Completed(value),
                    None if settled => End::Settled,
                    None => End::InDoubt,
                };
                l.finish(key, fence, end).await
            })
        }

        fn abandon(&self, key: IdempotencyKey, fence: Fence) {
            // PostgresLedger::abandon spawns onto the runtime it is called on.
            let _guard = self.rt.enter();
            self.ledger.abandon(key, fence);
        }

        fn lease(&self) -> Duration {
            self.ledger.lease()
        }
    }
}
