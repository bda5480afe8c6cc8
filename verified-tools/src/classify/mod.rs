//! Error classification: did the effect maybe happen?
//!
//! The [`Classify`] implementations here cover the standard library's and
//! tokio's errors; features `reqwest` and `tokio-postgres` add the errors of
//! those clients (`reqwest.rs`, `postgres.rs`), on top of two tables any
//! client can use: [`ErrorClass::from_http_status`] and
//! [`ErrorClass::from_sqlstate`].

use std::io;

#[cfg(feature = "tokio-postgres")]
mod postgres;
#[cfg(feature = "reqwest")]
mod reqwest;

/// What a tool error says about the effect.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ErrorClass {
    /// The effect did not happen and retrying will not help (validation
    /// error, 4xx): the call fails.
    Definitive,
    /// The request never left the client (connection refused, DNS failure,
    /// TLS or protocol handshake lost): this attempt cannot have applied, so
    /// it is retried within the budget without reading the verifier.
    NotSent,
    /// The effect may or may not have happened (timeout, reset, 5xx after
    /// dispatch): only a verifier can tell.
    Ambiguous,
    /// Our write was rejected because the record changed since we read it.
    /// Someone else may have done what we wanted: re-checked before any retry.
    Conflict,
}

impl ErrorClass {
    /// What an HTTP error status proves about the effect, for any HTTP
    /// client (`impl Classify for reqwest::Error` uses it for status errors).
    ///
    /// The asymmetry behind the table: calling an applied request
    /// [`NotSent`](ErrorClass::NotSent) or [`Definitive`](ErrorClass::Definitive)
    /// risks a duplicate or a false failure, calling an unapplied one
    /// [`Ambiguous`](ErrorClass::Ambiguous) costs one verifier read. So a
    /// status is read as "not applied" only where HTTP's semantics say the
    /// request was refused before it was processed.
    ///
    /// | status | class | why |
    /// | --- | --- | --- |
    /// | 409 Conflict | `Conflict` | the resource's state forbids it: someone (maybe our own earlier attempt) changed it; re-check |
    /// | 412 Precondition Failed | `Conflict` | an `If-Match` version was stale: the record changed since it was read |
    /// | 421 Misdirected Request | `NotSent` | RFC 9110 §15.5.20 lets a client retry it, even a non-idempotent one: not processed |
    /// | 425 Too Early | `NotSent` | RFC 8470: the server refused to process it (replayable early data) |
    /// | 429 Too Many Requests | `NotSent` | rate limiters refuse at the door, before any handler; an API that applies a request and then answers 429 needs its own `classify = fn` |
    /// | 408 Request Timeout | `Ambiguous` | by the RFC the request never arrived whole, but proxies and frameworks send it for a handler that ran too long |
    /// | other 4xx | `Definitive` | the request itself was refused (invalid, unauthorized, not found): the same request fails again |
    /// | 5xx | `Ambiguous` | the server (or a gateway in front of it) failed while handling it: 500 after a partial write, 502/504 after the upstream got it, 503 from a proxy whose upstream reset after the request was forwarded |
    /// | anything else | `Ambiguous` | not an error status: nothing is proven |
    ///
    /// `Retry-After` (429, 503) changes when to retry, not what happened:
    /// the class ignores it, and the retry policy's backoff spaces attempts.
    ///
    /// ```
    /// use verified_tools::ErrorClass;
    ///
    /// assert_eq!(ErrorClass::from_http_status(412), ErrorClass::Conflict);
    /// assert_eq!(ErrorClass::from_http_status(429), ErrorClass::NotSent);
    /// assert_eq!(ErrorClass::from_http_status(422), ErrorClass::Definitive);
    /// assert_eq!(ErrorClass::from_http_status(503), ErrorClass::Ambiguous);
    /// ```
    pub const fn from_http_status(status: u16) -> ErrorClass {
        match status {
            409 | 412 => ErrorClass::Conflict,
            421 | 425 | 429 => ErrorClass::NotSent,
            408 => ErrorClass::Ambiguous,
            400..=499 => ErrorClass::Definitive,
            _ => ErrorClass::Ambiguous,
        }
    }

    /// What a PostgreSQL error code (SQLSTATE, five characters) proves about
    /// the effect, for any client that reports it (`impl Classify for
    /// tokio_postgres::Error` uses it for server errors).
    ///
    /// A statement that fails with an `ERROR` aborts its transaction: in
    /// autocommit nothing of it is committed, and inside `BEGIN … COMMIT` the
    /// transaction can no longer commit. So most codes are "not applied",
    /// and the table only decides whether a retry can help:
    ///
    /// | SQLSTATE | class | why |
    /// | --- | --- | --- |
    /// | `23505` unique_violation, `23P01` exclusion_violation | `Conflict` | the row (or the booked range) is already there: someone else's write, or ours from an earlier attempt whose answer was lost; re-check |
    /// | `40001` serialization_failure, `40P01` deadlock_detected, `40000` transaction_rollback | `NotSent` | rolled back by the server, and PostgreSQL's documentation asks the client to retry (see below) |
    /// | `40003` statement_completion_unknown | `Ambiguous` | the server itself does not know |
    /// | `57014` query_canceled (`statement_timeout`, a cancel request) | `NotSent` | the statement was aborted; the timeout is disarmed before `COMMIT` runs and a cancel during the commit's replication wait is only a `WARNING` (the commit succeeds), so this `ERROR` never follows a commit |
    /// | `55P03` lock_not_available (`lock_timeout`, `NOWAIT`) | `NotSent` | aborted while waiting for a lock; the holder may be gone next time |
    /// | `25006` read_only_sql_transaction | `NotSent` | a write sent to a standby (a failover in progress): refused, and a retry may reach the new primary |
    /// | `25P03` idle_in_transaction_session_timeout, `57P05` idle_session_timeout | `NotSent` | the session timed out while idle: its open transaction was rolled back and the statement that followed was never read |
    /// | `53300` too_many_connections, `57P03` cannot_connect_now | `NotSent` | refused when connecting: no statement ran |
    /// | `53000`, `53100` disk_full, `53200` out_of_memory | `NotSent` | the statement was aborted for want of a resource that may be free again |
    /// | `72000` snapshot_too_old | `NotSent` | aborted; a new snapshot will do |
    /// | `57P01` admin_shutdown, `57P02` crash_shutdown | `Ambiguous` | the session was ended under the statement, possibly right after its `COMMIT` was durable but before the answer left |
    /// | class `08` connection exception | `Ambiguous` | the connection broke: the statement may have completed |
    /// | classes `57` (other), `58` system error, `XX` internal error, `HV` foreign data wrapper | `Ambiguous` | the server failed, or another server was written to: nothing is proven |
    /// | `40002`, classes `22` data, `23` integrity (other), `42` syntax and permissions, `0A`, `21`, `25`, `28`, `3D`, `3F`, `53400`, `54`, `55`, `P0` (`RAISE`), and every other error class | `Definitive` | the statement is wrong for this data or this database: the same statement fails again |
    /// | `00`, `01`, `02` (not errors), malformed codes | `Ambiguous` | nothing is proven |
    ///
    /// Why a rolled-back transaction is [`NotSent`](ErrorClass::NotSent)
    /// and not [`Definitive`](ErrorClass::Definitive) or
    /// [`Ambiguous`](ErrorClass::Ambiguous): the engine reads `NotSent` as
    /// "this attempt cannot have applied; retry it within the budget without
    /// a verifier read", which is exactly what a serialization failure or a
    /// deadlock proves. The server ran the statement and then undid it
    /// atomically, so for the effect it is as if it had never been sent;
    /// `Definitive` would fail a call that a retry usually completes, and
    /// `Ambiguous` would spend a read to learn what the server already said.
    /// An earlier attempt that is still in doubt is not forgotten: the
    /// engine verifies before a `NotSent` retry in that case.
    ///
    /// A client that sees the error's severity should treat a `FATAL` or
    /// `PANIC` as [`Ambiguous`](ErrorClass::Ambiguous) unless the code is one
    /// of the connect-time or idle-timeout codes above: a session that ends
    /// after a `COMMIT` completed can report the end instead of the commit.
    /// `impl Classify for tokio_postgres::Error` does.
    ///
    /// ```
    /// use verified_tools::ErrorClass;
    ///
    /// assert_eq!(ErrorClass::from_sqlstate("23505"), ErrorClass::Conflict);
    /// assert_eq!(ErrorClass::from_sqlstate("40001"), ErrorClass::NotSent);
    /// assert_eq!(ErrorClass::from_sqlstate("42601"), ErrorClass::Definitive);
    /// assert_eq!(ErrorClass::from_sqlstate("57P01"), ErrorClass::Ambiguous);
    /// ```
    pub fn from_sqlstate(code: &str) -> ErrorClass {
        if code.len() != 5 || !code.bytes().all(|b| b.is_ascii_alphanumeric()) {
            return ErrorClass::Ambiguous;
        }
        match code {
            "23505" | "23P01" => return ErrorClass::Conflict,
            "40000" | "40001" | "40P01" | "57014" | "55P03" | "25006" | "25P03" | "57P05"
            | "53000" | "53100" | "53200" | "53300" | "57P03" | "72000" => {
                return ErrorClass::NotSent;
            }
            "40003" | "57P01" | "57P02" => return ErrorClass::Ambiguous,
            "40002" => return ErrorClass::Definitive,
            _ => {}
        }
        match &code[..2] {
            "00" | "01" | "02" | "08" | "40" | "57" | "58" | "XX" | "HV" => ErrorClass::Ambiguous,
            _ => ErrorClass::Definitive,
        }
    }
}

impl std::fmt::Display for ErrorClass {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            ErrorClass::Definitive => "definitive",
            ErrorClass::NotSent => "not sent",
            ErrorClass::Ambiguous => "ambiguous",
            ErrorClass::Conflict => "conflict",
        })
    }
}

/// Implemented by a tool's error type to say what each error means for the
/// effect. When unsure, say [`ErrorClass::Ambiguous`]: an error after dispatch
/// is never "did not happen".
///
/// The error's `Display` text goes to the audit trail and, through a tool
/// set, to the model. `reqwest::Error` and `tokio_postgres::Error` implement
/// it behind features `reqwest` and `tokio-postgres`. For an error type of
/// another crate (`anyhow::Error`), name a function instead:
/// `#[verified_tool(classify = my_fn)]`, or return [`Classified`] by hand.
///
/// ```
/// use verified_tools::{Classify, ErrorClass};
///
/// #[derive(Debug)]
/// enum CrmError { Invalid, Timeout, VersionMismatch }
///
/// impl std::fmt::Display for CrmError {
///     fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
///         write!(f, "{self:?}")
///     }
/// }
///
/// impl Classify for CrmError {
///     fn classify(&self) -> ErrorClass {
///         match self {
///             CrmError::Invalid => ErrorClass::Definitive,
///             CrmError::Timeout => ErrorClass::Ambiguous,
///             CrmError::VersionMismatch => ErrorClass::Conflict,
///         }
///     }
/// }
/// assert_eq!(CrmError::Timeout.classify(), ErrorClass::Ambiguous);
/// ```
#[diagnostic::on_unimplemented(
    message = "`{Self}` does not say what its errors mean for the effect: implement `verified_tools::Classify` for it",
    label = "the tool's error type must implement `Classify` (and `Display`)",
    note = "for an error type of another crate, write `#[verified_tool(classify = my_fn)]` with `fn my_fn(error: &{Self}) -> ErrorClass`"
)]
pub trait Classify: std::fmt::Display {
    /// The class of this error.
    fn classify(&self) -> ErrorClass;

    /// The error in words, for the audit trail, the call's span and the
    /// model's outcome: by default its `Display` text in the alternate form
    /// (`{:#}`, which for `anyhow::Error` lists the causes). The impls for
    /// `reqwest` and `tokio-postgres`, whose `Display` leaves the cause out
    /// (`"db error"`), append their `source()` chain.
    fn describe(&self) -> String {
        format!("{self:#}")
    }
}

/// `error`'s text followed by each of its causes', `": "`-separated.
#[cfg(any(feature = "reqwest", feature = "tokio-postgres"))]
pub(crate) fn with_sources(error: &(dyn std::error::Error + 'static)) -> String {
    let mut text = error.to_string();
    let mut next = error.source();
    while let Some(cause) = next {
        let part = cause.to_string();
        // Some errors repeat their cause in their own text.
        if !text.ends_with(&part) {
            text.push_str(": ");
            text.push_str(&part);
        }
        next = cause.source();
    }
    text
}

impl Classify for io::Error {
    /// A connection that was never made is [`NotSent`](ErrorClass::NotSent);
    /// errors no retry can mend are definitive; everything else, including
    /// `Other`, is ambiguous.
    fn classify(&self) -> ErrorClass {
        use io::ErrorKind::*;
        match self.kind() {
            ConnectionRefused | AddrInUse | AddrNotAvailable | NotConnected => ErrorClass::NotSent,
            NotFound | PermissionDenied | InvalidInput | Unsupported | OutOfMemory => {
                ErrorClass::Definitive
            }
            _ => ErrorClass::Ambiguous,
        }
    }
}

impl Classify for tokio::time::error::Elapsed {
    /// A timeout says nothing about the effect.
    fn classify(&self) -> ErrorClass {
        ErrorClass::Ambiguous
    }
}

impl Classify for ErrorClass {
    fn classify(&self) -> ErrorClass {
        *self
    }
}

impl<E: Classify + ?Sized> Classify for Box<E> {
    fn classify(&self) -> ErrorClass {
        (**self).classify()
    }

    fn describe(&self) -> String {
        (**self).describe()
    }
}

/// Any error with its class attached: for error types you cannot implement
/// [`Classify`] for (`anyhow::Error`, another crate's error), without a
/// newtype of your own. `#[verified_tool(classify = path)]` wraps a tool's
/// errors in it for you; by hand, return `Result<T, Classified<E>>`.
///
/// ```
/// use verified_tools::{Classified, Classify, ErrorClass};
///
/// let e = Classified::new(std::fmt::Error, ErrorClass::Ambiguous);
/// assert_eq!(e.classify(), ErrorClass::Ambiguous);
/// assert_eq!(e.to_string(), std::fmt::Error.to_string());
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Classified<E> {
    /// The error.
    pub error: E,
    /// What it says about the effect.
    pub class: ErrorClass,
}

impl<E> Classified<E> {
    /// `error`, of class `class`.
    pub const fn new(error: E, class: ErrorClass) -> Self {
        Self { error, class }
    }

    /// The error back.
    pub fn into_inner(self) -> E {
        self.error
    }
}

impl<E: std::fmt::Display> Classify for Classified<E> {
    fn classify(&self) -> ErrorClass {
        self.class
    }
}

impl<E: std::fmt::Display> std::fmt::Display for Classified<E> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.error.fmt(f)
    }
}

impl<E: std::error::Error + 'static> std::error::Error for Classified<E> {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        Some(&self.error)
    }
}

#[cfg(test)]
mod tests {
    use super::ErrorClass::{self, *};

    #[test]
    fn http_statuses_are_read_as_the_table_says() {
        for status in 100..=999u16 {
            let expected = match status {
                409 | 412 => Conflict,
                421 | 425 | 429 => NotSent,
                408 => Ambiguous,
                400..=499 => Definitive,
                _ => Ambiguous,
            };
            assert_eq!(ErrorClass::from_http_status(status), expected, "{status}");
        }
        // Only a status that refuses the request at the door says "not sent".
        for status in [500, 501, 502, 503, 504, 200, 302] {
            assert_eq!(ErrorClass::from_http_status(status), Ambiguous, "{status}");
        }
    }

    #[test]
    fn sqlstates_are_read_as_the_table_says() {
        let table = [
            ("23505", Conflict),
            ("23P01", Conflict),
            ("40001", NotSent),
            ("40P01", NotSent),
            ("40000", NotSent),
            ("40003", Ambiguous),
            ("40002", Definitive),
            ("57014", NotSent),
            ("55P03", NotSent),
            ("25006", NotSent),
            ("25P03", NotSent),
            ("57P05", NotSent),
            ("53300", NotSent),
            ("57P03", NotSent),
            ("53100", NotSent),
            ("53200", NotSent),
            ("72000", NotSent),
            ("53400", Definitive),
            ("57P01", Ambiguous),
            ("57P02", Ambiguous),
            ("57000", Ambiguous),
            ("57P04", Ambiguous),
            ("08006", Ambiguous),
            ("08P01", Ambiguous),
            ("58030", Ambiguous),
            ("XX000", Ambiguous),
            ("HV00N", Ambiguous),
            ("23502", Definitive),
            ("23503", Definitive),
            ("23514", Definitive),
            ("22P02", Definitive),
            ("22001", Definitive),
            ("42601", Definitive),
            ("42501", Definitive),
            ("42P01", Definitive),
            ("0A000", Definitive),
            ("25P02", Definitive),
            ("28P01", Definitive),
            ("3D000", Definitive),
            ("55006", Definitive),
            ("P0001", Definitive),
            ("00000", Ambiguous),
            ("01000", Ambiguous),
            ("02000", Ambiguous),
            ("", Ambiguous),
            ("4000", Ambiguous),
            ("400011", Ambiguous),
            ("40-01", Ambiguous),
            ("é0001", Ambiguous),
        ];
        for (code, class) in table {
            assert_eq!(ErrorClass::from_sqlstate(code), class, "{code:?}");
        }
    }
}
