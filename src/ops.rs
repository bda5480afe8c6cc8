//! The operator's door to a ledger: list the calls in doubt, show one, and
//! resolve one by a person's recorded decision. `examples/ledger.rs` is its
//! command line; this module is the logic, so that it is tested as it runs.
//!
//! A call that ends `Unknown` leaves its record in doubt, and a record in
//! doubt never expires: every repeat of the call verifies first, and when
//! the verifier cannot see the state, the call stays in doubt for ever. A
//! person who has looked at the real state (the service's console, its
//! support) records what they found:
//!
//! - *applied*: the record becomes completed without a value. A repeat of the
//!   call never dispatches again; it obtains the value by verifying (and ends
//!   `Unknown` with [`UnknownReason::ValueNotRecorded`](verified_tools::UnknownReason::ValueNotRecorded)
//!   while the verifier cannot see it);
//! - *not applied*: the record is settled with its attempts cleared. A repeat
//!   verifies, believes an `Absent` at once (nothing can still land), and
//!   dispatches with the key's whole budget.
//!
//! Only a record in doubt is changed (a hold past its lease counts: its
//! holder is presumed dead); a held, settled or completed one is refused, so
//! a decision never overwrites what a call proved. Each decision is one JSON
//! line (`at`, `key`, `by`, `decision`, `note`, `state_before`), appended to
//! an audit file and printed.
//!
//! ```no_run
//! use verified_tools_suite::ops::{self, Command, Options};
//!
//! # fn main() -> Result<(), verified_tools_suite::ops::OpsError> {
//! let options = Options::new("sqlite:/var/lib/agent/ledger.db".parse()?).with_json(true);
//! ops::run(&options, &Command::List { limit: 20 }, &mut std::io::stdout())?;
//! # Ok(()) }
//! ```

use std::fmt;
use std::fs::{File, OpenOptions};
use std::io::{self, Write};
use std::path::{Path, PathBuf};
use std::str::FromStr;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use verified_tools::IdempotencyKey;
use verified_tools::ledger::{Ledger, LedgerError, RecordState, RecordView, Resolution, Settle};

/// Where the records are: `sqlite:PATH` or `redis://HOST:PORT/`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Store {
    /// An SQLite file (`sqlite:PATH`; feature `sqlite`).
    Sqlite(PathBuf),
    /// A Redis server (`redis://…` or `rediss://…`; feature `redis`).
    Redis(String),
}

impl FromStr for Store {
    type Err = OpsError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        if let Some(path) = s.strip_prefix("sqlite:").filter(|path| !path.is_empty()) {
            Ok(Self::Sqlite(path.into()))
        } else if s.starts_with("redis://") || s.starts_with("rediss://") {
            Ok(Self::Redis(s.to_owned()))
        } else {
            Err(OpsError::UnknownLedger(s.to_owned()))
        }
    }
}

impl fmt::Display for Store {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Sqlite(path) => write!(f, "sqlite:{}", path.display()),
            Self::Redis(url) => f.write_str(url),
        }
    }
}

/// How to reach the store, and how to print.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Options {
    /// Where the records are.
    pub store: Store,
    /// Redis: the prefix of the ledger's keys (`None`: the ledger's default,
    /// `vt:`). It must be the one the agents use.
    pub prefix: Option<String>,
    /// How long a resolved record is kept, like a finished one (`None`: the
    /// ledger's default, 24 hours).
    pub ttl: Option<Duration>,
    /// JSON lines instead of text.
    pub json: bool,
}

impl Options {
    /// The store's defaults, printed as text.
    pub fn new(store: Store) -> Self {
        Self { store, prefix: None, ttl: None, json: false }
    }

    /// Sets the Redis prefix (see [`prefix`](Self::prefix)).
    pub fn with_prefix(mut self, prefix: Option<String>) -> Self {
        self.prefix = prefix;
        self
    }

    /// Sets the TTL of resolved records (see [`ttl`](Self::ttl)).
    pub fn with_ttl(mut self, ttl: Option<Duration>) -> Self {
        self.ttl = ttl;
        self
    }

    /// Prints JSON lines, or text.
    pub fn with_json(mut self, json: bool) -> Self {
        self.json = json;
        self
    }
}

/// What to do.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Command {
    /// Lists up to `limit` records in doubt.
    List {
        /// At most this many.
        limit: usize,
    },
    /// Shows the record of one key.
    Show {
        /// The key a call's outcome gave.
        key: IdempotencyKey,
    },
    /// Resolves the record in doubt of one key.
    Resolve(Decision),
}

/// A person's decision about one call in doubt.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Decision {
    /// The call's key.
    pub key: IdempotencyKey,
    /// What the person found in the real state.
    pub resolution: Resolution,
    /// Who decided (recorded in the audit line; not empty).
    pub by: String,
    /// Why, or what was looked at.
    pub note: Option<String>,
    /// The file the audit line is appended to, besides the output.
    pub audit: Option<PathBuf>,
}

/// Why an operator's command failed (the command line exits with 1).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum OpsError {
    /// `--ledger` names no store this command knows.
    #[error(
        "unknown ledger {0:?}: expected sqlite:PATH or redis://HOST:PORT/ (an in-memory ledger \
         lives in its process: nothing outside it can read its records)"
    )]
    UnknownLedger(String),
    /// This build left the store's feature out.
    #[error(
        "this build has no {store} ledger: run `cargo run --example ledger --features {feature} \
         -- --ledger {ledger} ...`"
    )]
    FeatureMissing {
        /// The store's name.
        store: &'static str,
        /// The cargo feature that brings it.
        feature: &'static str,
        /// The `--ledger` given.
        ledger: Store,
    },
    /// No SQLite file at the path: opening would create an empty ledger
    /// and show nothing, which a wrong path must not look like.
    #[error("no ledger file at {}: check the path the agents use", .0.display())]
    NoLedgerFile(PathBuf),
    /// The ledger could not be opened or failed.
    #[error("the ledger failed: {0}")]
    Ledger(#[from] LedgerError),
    /// The key has no record: it never ran, or its record expired.
    #[error("no record of key {0}: no call with it ran, or its record expired")]
    NoRecord(IdempotencyKey),
    /// Only a record in doubt is resolved.
    #[error("{}", refusal(.key, .state))]
    NotInDoubt {
        /// The key.
        key: IdempotencyKey,
        /// Where its record stands.
        state: RecordState,
    },
    /// `--by` was empty.
    #[error("--by must name the person who decides: the decision is audited")]
    Anonymous,
    /// The decision is in the ledger, but its audit line could not be
    /// written: the line is here, to be kept by hand.
    #[error("the decision is recorded in the ledger, but not in {}: {error}; its audit line: {line}", .path.display())]
    Audit {
        /// The audit file.
        path: PathBuf,
        /// Why.
        error: io::Error,
        /// The line that was not written.
        line: String,
    },
    /// The audit file cannot be opened: nothing was decided.
    #[error("cannot open the audit file {}: {error} (nothing was changed)", .path.display())]
    AuditFile {
        /// The audit file.
        path: PathBuf,
        /// Why.
        error: io::Error,
    },
    /// The output could not be written.
    #[error("cannot write the output: {0}")]
    Output(#[from] io::Error),
}

fn refusal(key: &IdempotencyKey, state: &RecordState) -> String {
    let why = match state {
        RecordState::Held => {
            "a call holds it now (its lease has not ended): wait for it to end, or for its lease \
             to run out"
        }
        RecordState::Settled => {
            "it is settled: the effect is known not to have happened, and a repeat of the call \
             verifies first"
        }
        RecordState::Completed => "it is completed: a call proved the effect, or it was resolved",
        RecordState::InDoubt => "it is in doubt",
    };
    format!("refused: the record of key {key} is not in doubt: {why}")
}

/// Opens the store and runs `command`, writing its lines to `out`. Blocks:
/// it runs its own runtime (call it outside any).
pub fn run(options: &Options, command: &Command, out: &mut dyn Write) -> Result<(), OpsError> {
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
    runtime.block_on(async {
        let ledger = open(options).await?;
        execute(&*ledger, command, options.json, out).await
    })
}

/// A handle on the store.
async fn open(options: &Options) -> Result<Box<dyn Ledger>, OpsError> {
    match &options.store {
        #[cfg(feature = "sqlite")]
        Store::Sqlite(path) => {
            if !path.is_file() {
                return Err(OpsError::NoLedgerFile(path.clone()));
            }
            let mut ledger = verified_tools::ledger::SqliteLedger::open(path)?;
            if let Some(ttl) = options.ttl {
                ledger = ledger.with_ttl(ttl);
            }
            Ok(Box::new(ledger))
        }
        #[cfg(feature = "redis")]
        Store::Redis(url) => {
            let mut ledger = verified_tools::ledger::RedisLedger::connect(url).await?;
            if let Some(prefix) = &options.prefix {
                ledger = ledger.with_prefix(prefix);
            }
            if let Some(ttl) = options.ttl {
                ledger = ledger.with_ttl(ttl);
            }
            Ok(Box::new(ledger))
        }
        #[cfg(not(feature = "sqlite"))]
        store @ Store::Sqlite(_) => Err(OpsError::FeatureMissing {
            store: "SQLite",
            feature: "sqlite",
            ledger: store.clone(),
        }),
        #[cfg(not(feature = "redis"))]
        store @ Store::Redis(_) => Err(OpsError::FeatureMissing {
            store: "Redis",
            feature: "redis",
            ledger: store.clone(),
        }),
    }
}

/// Runs `command` on `ledger`, writing its lines to `out`: text, or JSON
/// lines with `json`. A decision's audit line is JSON either way.
pub async fn execute(
    ledger: &dyn Ledger,
    command: &Command,
    json: bool,
    out: &mut dyn Write,
) -> Result<(), OpsError> {
    match command {
        Command::List { limit } => {
            // One more than asked, to say whether there are more.
            let mut views = ledger.in_doubt(limit.saturating_add(1)).await?;
            let more = views.len() > *limit;
            views.truncate(*limit);
            for view in &views {
                writeln!(out, "{}", line(view, json))?;
            }
            if !json && views.is_empty() {
                writeln!(out, "no call is in doubt")?;
            }
            if !json && more {
                writeln!(out, "more calls are in doubt: list them with a larger --limit")?;
            }
            Ok(())
        }
        Command::Show { key } => {
            let view = ledger.record(*key).await?.ok_or(OpsError::NoRecord(*key))?;
            writeln!(out, "{}", line(&view, json))?;
            Ok(())
        }
        Command::Resolve(decision) => resolve(ledger, decision, out).await,
    }
}

async fn resolve(
    ledger: &dyn Ledger,
    decision: &Decision,
    out: &mut dyn Write,
) -> Result<(), OpsError> {
    if decision.by.trim().is_empty() {
        return Err(OpsError::Anonymous);
    }
    // Opened before deciding: a decision that cannot be audited is not made.
    let mut audit = decision.audit.as_deref().map(append).transpose()?;
    let key = decision.key;
    let before = match ledger.resolve(key, decision.resolution).await? {
        Some(RecordState::InDoubt) => RecordState::InDoubt,
        Some(state) => return Err(OpsError::NotInDoubt { key, state }),
        None => return Err(OpsError::NoRecord(key)),
    };
    let line = serde_json::json!({
        "at": rfc3339(SystemTime::now()),
        "key": key,
        "by": decision.by,
        "decision": match decision.resolution {
            Resolution::Applied => "applied",
            Resolution::NotApplied => "not_applied",
        },
        "note": decision.note,
        "state_before": before.as_str(),
    })
    .to_string();
    if let (Some(file), Some(path)) = (audit.as_mut(), &decision.audit) {
        // On disk before it is reported, as the decision is in the ledger.
        let written = writeln!(file, "{line}").and_then(|()| file.sync_data());
        if let Err(error) = written {
            return Err(OpsError::Audit { path: path.clone(), error, line });
        }
    }
    writeln!(out, "{line}")?;
    Ok(())
}

/// The audit file, opened to append (created if missing).
fn append(path: &Path) -> Result<File, OpsError> {
    OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)
        .map_err(|error| OpsError::AuditFile { path: path.to_path_buf(), error })
}

/// One record as a line: text, or a JSON object.
fn line(view: &RecordView, json: bool) -> String {
    let progress = view.progress;
    if json {
        let settles_in_ms = match progress.settle {
            Settle::After(left) => Some(u64::try_from(left.as_millis()).unwrap_or(u64::MAX)),
            Settle::Never => None,
        };
        return serde_json::json!({
            "key": view.key,
            "state": view.state.as_str(),
            "attempts": progress.attempts,
            "after_ok": progress.after_ok,
            "settles_in_ms": settles_in_ms,
        })
        .to_string();
    }
    let settles = match progress.settle {
        Settle::After(Duration::ZERO) => "settled".to_owned(),
        Settle::After(left) => format!("settles in {}", human(left)),
        Settle::Never => "never settles".to_owned(),
    };
    format!(
        "{}  {:<9}  attempts {}  after_ok {}  {settles}",
        view.key,
        view.state.as_str(),
        progress.attempts,
        if progress.after_ok { "yes" } else { "no" },
    )
}

/// A duration for a person: `850ms`, `29.8s`, `4m 05s`, `3h 20m`.
fn human(d: Duration) -> String {
    let secs = d.as_secs();
    if secs == 0 {
        format!("{}ms", d.as_millis())
    } else if secs < 60 {
        format!("{:.1}s", d.as_secs_f64())
    } else if secs < 3600 {
        format!("{}m {:02}s", secs / 60, secs % 60)
    } else {
        format!("{}h {:02}m", secs / 3600, secs % 3600 / 60)
    }
}

/// `t` in RFC 3339, UTC, to the millisecond: `2025-01-31T09:05:00.250Z`.
fn rfc3339(t: SystemTime) -> String {
    let since = t.duration_since(UNIX_EPOCH).unwrap_or_default();
    let secs = i64::try_from(since.as_secs()).unwrap_or(i64::MAX);
    let (days, rest) = (secs.div_euclid(86_400), secs.rem_euclid(86_400));
    let (year, month, day) = civil(days);
    format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}.{:03}Z",
        rest / 3600,
        rest % 3600 / 60,
        rest % 60,
        since.subsec_millis()
    )
}

/// The Gregorian date of a day counted from 1970-01-01 (Howard Hinnant's
/// `civil_from_days`).
fn civil(days: i64) -> (i64, i64, i64) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    (year, month, day)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn instants_are_written_in_rfc_3339_utc() {
        let at = |secs: u64, ms: u64| {
            rfc3339(UNIX_EPOCH + Duration::from_secs(secs) + Duration::from_millis(ms))
        };
        assert_eq!(at(0, 0), "1970-01-01T00:00:00.000Z");
        assert_eq!(at(951_782_400, 5), "2000-02-29T00:00:00.005Z");
        assert_eq!(at(1_735_689_599, 999), "2024-12-31T23:59:59.999Z");
        assert_eq!(at(4_107_542_400, 0), "2100-03-01T00:00:00.000Z");
    }

    #[test]
    fn durations_are_written_for_a_person() {
        assert_eq!(human(Duration::from_millis(850)), "850ms");
        assert_eq!(human(Duration::from_millis(29_840)), "29.8s");
        assert_eq!(human(Duration::from_secs(245)), "4m 05s");
        assert_eq!(human(Duration::from_secs(12_000)), "3h 20m");
    }
}
