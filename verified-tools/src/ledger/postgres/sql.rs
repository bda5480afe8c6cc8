//! The SQL of the PostgreSQL ledger: the schema (`schema.sql`, written for
//! the default names and renamed for others), the one statement each
//! operation sends, and how their answers are read. These notes are for its
//! maintainers; how to use the ledger is on
//! [`PostgresLedger`](super::PostgresLedger).
//!
//! Every operation is one call of a server-side function (PL/pgSQL, in
//! `schema.sql`), sent with `query_typed`: parse, bind, describe, execute
//! and sync in one message, so one round trip and no prepared statement
//! (which a pool's connections would each have to prepare). The functions
//! cache their own plans in each session.

use std::time::Duration;

use crate::IdempotencyKey;
use crate::ledger::{
    Claim, ClaimRequest, Claimed, Fence, LedgerError, Progress, RecordState, RecordView, Replay,
    Settle, store_time,
};

/// The version of the schema this build creates and reads
/// (`vt_schema_version()`).
pub(super) const SCHEMA_VERSION: i32 = 2;

/// The schema for the default names.
pub(super) const SCHEMA: &str = include_str!("schema.sql");

/// The default names, as `schema.sql` spells them.
pub(super) const DEFAULT_SCHEMA: &str = "public";
pub(super) const DEFAULT_PREFIX: &str = "vt_";

/// The longest suffix the schema appends to the prefix (`schema_version`):
/// PostgreSQL truncates identifiers past 63 bytes, which could make two of
/// them one.
const LONGEST_SUFFIX: usize = "schema_version".len();

/// Every this many finishes, a handle deletes expired records...
pub(super) const PURGE_EVERY: u32 = 32;

/// ...at most this many (twice what the finishes in between can create).
pub(super) const PURGE_BATCH: i32 = 64;

/// Checks a schema or prefix: letters, digits and `_` only, so that the
/// names are quoted as they are (case kept) and fit in the functions'
/// bodies; short enough that no name is truncated.
pub(super) fn check_names(schema: &str, prefix: &str) -> Result<(), LedgerError> {
    let plain = |name: &str| name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_');
    if schema.is_empty() || schema.len() > 63 || !plain(schema) {
        return Err(LedgerError::Unavailable(
            format!(
                "postgres: the schema name {schema:?} is not 1 to 63 letters, digits or underscores"
            )
            .into(),
        ));
    }
    if prefix.len() + LONGEST_SUFFIX > 63 || !plain(prefix) {
        return Err(LedgerError::Unavailable(format!(
            "postgres: the table prefix {prefix:?} is not up to {} letters, digits or underscores",
            63 - LONGEST_SUFFIX
        ).into()));
    }
    Ok(())
}

/// The schema's DDL for these names (checked by [`check_names`]).
pub(super) fn schema_sql(schema: &str, prefix: &str) -> String {
    // `schema.sql` quotes every name it creates, and nothing else: each
    // quoted identifier is renamed once, by itself, so that a schema named
    // like the prefix (or the reverse) is not renamed twice.
    let mut out = String::with_capacity(SCHEMA.len() + 1024);
    let mut rest = SCHEMA;
    while let Some(open) = rest.find('"') {
        out.push_str(&rest[..=open]);
        rest = &rest[open + 1..];
        let close = rest.find('"').unwrap_or(rest.len());
        let name = &rest[..close];
        match name.strip_prefix(DEFAULT_PREFIX) {
            _ if name == DEFAULT_SCHEMA => out.push_str(schema),
            Some(suffix) => {
                out.push_str(prefix);
                out.push_str(suffix);
            }
            None => out.push_str(name),
        }
        out.push('"');
        rest = rest.get(close + 1..).unwrap_or("");
    }
    out.push_str(rest);
    out
}

/// The statement of each operation, for one schema and prefix.
#[derive(Debug)]
pub(super) struct Statements {
    pub(super) claim: String,
    pub(super) dispatching: String,
    pub(super) finish: String,
    pub(super) abandon: String,
    pub(super) record: String,
    pub(super) hold: String,
    pub(super) in_doubt: String,
    pub(super) resolve: String,
    pub(super) purge: String,
    pub(super) version: String,
}

impl Statements {
    pub(super) fn new(schema: &str, prefix: &str) -> Self {
        let call = |function: &str, params: usize| {
            let params: Vec<String> = (1..=params).map(|n| format!("${n}")).collect();
            format!("SELECT * FROM \"{schema}\".\"{prefix}{function}\"({})", params.join(", "))
        };
        Self {
            claim: call("claim", 8),
            dispatching: call("dispatching", 5),
            finish: call("finish", 6),
            abandon: call("abandon", 2),
            record: call("record", 1),
            // A read of the table, not a function of the schema: no
            // migration for it, and no row lock taken.
            hold: format!(
                "SELECT greatest(0, (extract(epoch FROM lease_end - clock_timestamp()) \
                 * 1000000)::bigint) FROM \"{schema}\".\"{prefix}records\" \
                 WHERE key = $1 AND fence = $2 AND state = 'held' \
                 AND lease_end > clock_timestamp()"
            ),
            in_doubt: call("in_doubt", 1),
            resolve: call("resolve", 3),
            purge: call("purge", 1),
            version: call("schema_version", 0),
        }
    }
}

// ---------------------------------------------------------------- arguments

pub(super) fn key_bytes(key: IdempotencyKey) -> [u8; 16] {
    key.as_u128().to_be_bytes()
}

/// A duration in µs as the functions take it (`bigint`): rounded up and
/// capped as [`store_time::micros`] does, which fits an `i64`.
pub(super) fn micros(d: Duration) -> i64 {
    store_time::micros(d) as i64
}

pub(super) fn fence_arg(fence: Fence) -> i64 {
    // Fences come from a bigint sequence: every one issued fits.
    i64::try_from(fence.0).unwrap_or(i64::MAX)
}

// ---------------------------------------------------------------- answers

fn corrupt(what: &str) -> LedgerError {
    LedgerError::Corrupt(format!("postgres: {what}").into())
}

/// The answer of `claim()`, as its columns hold it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(super) struct ClaimRow {
    pub(super) kind: Option<i32>,
    pub(super) which: Option<i32>,
    pub(super) fence: Option<i64>,
    pub(super) attempts: Option<i64>,
    pub(super) after_ok: Option<bool>,
    pub(super) left_us: Option<i64>,
    pub(super) value: Option<Vec<u8>>,
}

impl ClaimRow {
    pub(super) fn read(row: &tokio_postgres::Row) -> Result<Self, LedgerError> {
        let bad = |e: tokio_postgres::Error| corrupt(&format!("a claim's answer: {e}"));
        Ok(Self {
            kind: row.try_get(0).map_err(bad)?,
            which: row.try_get(1).map_err(bad)?,
            fence: row.try_get(2).map_err(bad)?,
            attempts: row.try_get(3).map_err(bad)?,
            after_ok: row.try_get(4).map_err(bad)?,
            left_us: row.try_get(5).map_err(bad)?,
            value: row.try_get(6).map_err(bad)?,
        })
    }
}

fn fence(value: Option<i64>) -> Option<Fence> {
    value.and_then(|n| u64::try_from(n).ok()).filter(|&n| n > 0).map(Fence)
}

/// Settles in `us` µs; negative: never.
fn settle(us: i64) -> Settle {
    match u64::try_from(us) {
        Ok(us) => Settle::After(Duration::from_micros(us)),
        Err(_) => Settle::Never,
    }
}

fn attempts(value: Option<i64>) -> Option<u32> {
    value.and_then(|n| u32::try_from(n).ok())
}

/// Reads a claim's answer. Anything unexpected is corrupt, never guessed at.
pub(super) fn claimed(row: ClaimRow, request: &ClaimRequest) -> Result<Claim, LedgerError> {
    let bad = || corrupt(&format!("unexpected claim answer {row:?}"));
    let key = match (row.which, request.previous) {
        (Some(0), _) => request.key,
        (Some(1), Some((previous, _))) => previous,
        _ => return Err(bad()),
    };
    let state = match row.kind {
        Some(1) => Claimed::Fresh(fence(row.fence).ok_or_else(bad)?),
        Some(2) => {
            let progress = Progress {
                attempts: attempts(row.attempts).ok_or_else(bad)?,
                after_ok: row.after_ok.ok_or_else(bad)?,
                settle: settle(row.left_us.ok_or_else(bad)?),
            };
            Claimed::Resume(fence(row.fence).ok_or_else(bad)?, progress)
        }
        Some(3) => Claimed::Completed(match &row.value {
            Some(bytes) => Replay::Encoded(bytes.clone()),
            None => Replay::Unrecorded,
        }),
        Some(4) => {
            let left = row.left_us.ok_or_else(bad)?;
            Claimed::InFlight(Duration::from_micros(left.max(0).unsigned_abs()))
        }
        Some(5) => Claimed::Mismatch,
        _ => return Err(bad()),
    };
    Ok(Claim { key, state })
}

pub(super) fn record_state(text: &str) -> Result<RecordState, LedgerError> {
    Ok(match text {
        "held" => RecordState::Held,
        "in_doubt" => RecordState::InDoubt,
        "settled" => RecordState::Settled,
        "completed" => RecordState::Completed,
        other => return Err(corrupt(&format!("a record has the unknown state {other:?}"))),
    })
}

/// Reads a record's view: its progress, and its key from `key` or the row.
pub(super) fn view(
    key: IdempotencyKey,
    state: RecordState,
    attempts_value: Option<i64>,
    after_ok: Option<bool>,
    settle_us: Option<i64>,
) -> Result<RecordView, LedgerError> {
    let bad = || corrupt("a record's progress is missing or out of range");
    let progress = Progress {
        attempts: attempts(attempts_value).ok_or_else(bad)?,
        after_ok: after_ok.ok_or_else(bad)?,
        settle: settle(settle_us.ok_or_else(bad)?),
    };
    Ok(RecordView { key, state, progress })
}

pub(super) fn key_of(bytes: &[u8]) -> Result<IdempotencyKey, LedgerError> {
    let bytes: [u8; 16] = bytes.try_into().map_err(|_| corrupt("a key is not 16 bytes"))?;
    Ok(IdempotencyKey::from_u128(u128::from_be_bytes(bytes)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::PayloadDigest;

    #[test]
    fn durations_round_up_and_are_capped() {
        assert_eq!(micros(Duration::MAX), store_time::MAX_MICROS as i64);
        assert_eq!(settle(-1), Settle::Never);
        assert_eq!(settle(0), Settle::NOW);
    }

    #[test]
    fn names_are_checked_and_the_schema_renamed_throughout() {
        assert!(check_names("public", "vt_").is_ok());
        assert!(check_names("Billing_2", "").is_ok());
        for (schema, prefix) in [("", "vt_"), ("a\"b", "vt_"), ("public", "x;"), ("s", "é")] {
            assert!(check_names(schema, prefix).is_err(), "{schema:?} {prefix:?}");
        }
        assert!(check_names("public", &"p".repeat(63 - LONGEST_SUFFIX)).is_ok());
        assert!(check_names("public", &"p".repeat(64 - LONGEST_SUFFIX)).is_err());
        assert_eq!(schema_sql(DEFAULT_SCHEMA, DEFAULT_PREFIX), SCHEMA);
        // A schema named like the prefix is renamed once.
        let crossed = schema_sql("vt_x", "public");
        assert!(crossed.contains("\"vt_x\".\"publicrecords\""), "{crossed}");
        let renamed = schema_sql("billing", "ledger_");
        assert!(!renamed.contains("\"public\"") && !renamed.contains("\"vt_"), "{renamed}");
        assert!(renamed.contains("\"billing\".\"ledger_records\""));
        assert!(renamed.contains("nextval('\"billing\".\"ledger_fence\"')"));
        assert!(renamed.contains("CREATE INDEX IF NOT EXISTS \"ledger_records_expiry\""));
        let statements = Statements::new("billing", "ledger_");
        assert_eq!(statements.abandon, "SELECT * FROM \"billing\".\"ledger_abandon\"($1, $2)");
        assert_eq!(statements.version, "SELECT * FROM \"billing\".\"ledger_schema_version\"()");
        // Every function the statements call is in the schema.
        for statement in [&statements.claim, &statements.finish, &statements.resolve] {
            let name = statement.split('(').next().unwrap().trim_start_matches("SELECT * FROM ");
            assert!(renamed.contains(&format!("FUNCTION {name}(")), "{name}");
        }
    }

    #[test]
    fn claim_answers_are_read_for_the_right_key() {
        let key = IdempotencyKey::from_u128(1);
        let previous = IdempotencyKey::from_u128(2);
        let request = ClaimRequest {
            key,
            fingerprint: PayloadDigest::from_u128(1),
            previous: Some((previous, PayloadDigest::from_u128(2))),
            first: Progress { attempts: 1, after_ok: false, settle: Settle::NOW },
            now: tokio::time::Instant::now(),
        };
        let row =
            |kind, which| ClaimRow { kind: Some(kind), which: Some(which), ..ClaimRow::default() };
        let fresh = claimed(ClaimRow { fence: Some(9), ..row(1, 0) }, &request).unwrap();
        assert_eq!(fresh.key, key);
        assert!(matches!(fresh.state, Claimed::Fresh(Fence(9))));
        let resume = ClaimRow {
            fence: Some(10),
            attempts: Some(3),
            after_ok: Some(true),
            left_us: Some(-1),
            ..row(2, 1)
        };
        let resumed = claimed(resume.clone(), &request).unwrap();
        assert_eq!(resumed.key, previous);
        let Claimed::Resume(Fence(10), progress) = resumed.state else { panic!("{resumed:?}") };
        assert_eq!(progress, Progress { attempts: 3, after_ok: true, settle: Settle::Never });
        let done = claimed(ClaimRow { value: Some(b"7".to_vec()), ..row(3, 0) }, &request);
        assert!(
            matches!(done.unwrap().state, Claimed::Completed(Replay::Encoded(ref b)) if b == b"7")
        );
        let unrecorded = claimed(row(3, 0), &request).unwrap();
        assert!(matches!(unrecorded.state, Claimed::Completed(Replay::Unrecorded)));
        let flight = claimed(ClaimRow { left_us: Some(1500), ..row(4, 0) }, &request).unwrap();
        assert!(matches!(flight.state, Claimed::InFlight(d) if d == Duration::from_micros(1500)));
        assert!(matches!(claimed(row(5, 0), &request).unwrap().state, Claimed::Mismatch));
        // Anything else is corrupt, never guessed at.
        let alone = ClaimRequest { previous: None, ..request };
        for (bad, request) in [
            (row(5, 1), &alone),
            (row(1, 0), &request),
            (ClaimRow { fence: Some(0), ..row(1, 0) }, &request),
            (ClaimRow { attempts: Some(1 << 40), ..resume.clone() }, &request),
            (ClaimRow { after_ok: None, ..resume }, &request),
            (row(9, 0), &request),
            (ClaimRow::default(), &request),
        ] {
            let answer = claimed(bad.clone(), request);
            assert!(matches!(answer, Err(LedgerError::Corrupt(_))), "{bad:?}: {answer:?}");
        }
    }

    #[test]
    fn views_and_keys_are_read_or_corrupt() {
        assert_eq!(record_state("in_doubt").unwrap(), RecordState::InDoubt);
        assert!(matches!(record_state("lost"), Err(LedgerError::Corrupt(_))));
        let key = IdempotencyKey::from_u128(0x0102);
        assert_eq!(key_of(&key_bytes(key)).unwrap(), key);
        assert!(key_of(&[1, 2, 3]).is_err());
        let view = view(key, RecordState::Settled, Some(0), Some(false), Some(0)).unwrap();
        assert_eq!(view.progress, Progress { attempts: 0, after_ok: false, settle: Settle::NOW });
        assert!(super::view(key, RecordState::Held, None, Some(false), Some(0)).is_err());
    }
}
