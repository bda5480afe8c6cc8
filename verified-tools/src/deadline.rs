//! Deadlines: of each attempt (handed to the tool, to forward to a server
//! that honours deadlines), of the whole call (every call ends by then), and
//! the settle point after which a verifier's `Absent` can be believed.
//!
//! ```text
//! attempt n:  start ──────────── deadline ── settle margin ──┐ settle point
//!                      (the server may apply it until here)  │ (Absent believed from here)
//! call:       start ──────────────────────────────────────────────────── call deadline
//! ```

use std::fmt;
use std::time::Duration;

use tokio::time::Instant;

use crate::ledger::Settle;

#[cfg(feature = "reqwest")]
mod reqwest;
#[cfg(feature = "reqwest")]
pub use self::reqwest::DeadlineExt;

/// The HTTP request header [`Deadline::http_header`] forwards the time left
/// in: `Connect-Timeout-Ms`, milliseconds as a positive integer of at most
/// ten digits (lowercase here, as HTTP/2 sends header names).
///
/// No standard HTTP header carries a client's deadline: the IETF drafts
/// of a `Timeout` and a `Request-Timeout` header (2010–2011, in seconds,
/// for long polling) expired, and gRPC's `grpc-timeout` ([`Deadline::grpc_timeout`]) belongs
/// to gRPC. The Connect protocol's header is the published convention
/// for plain HTTP/1.1 and HTTP/2 requests, with the meaning a deadline
/// needs (the server stops working on the request when it runs out;
/// connect-go and connect-es servers honour it as they are) and the
/// precision attempts need (milliseconds, where a header in seconds
/// would round a 1.5 s attempt to 1 s or 2 s). A service that reads
/// another name (Envoy's `x-envoy-upstream-rq-timeout-ms`, its own
/// `X-Timeout-Ms`) takes the same value: `DeadlineExt::with_deadline_as`
/// (feature `reqwest`), or `(name, deadline.http_timeout())`.
pub const TIMEOUT_HEADER: &str = "connect-timeout-ms";

/// The deadline of one attempt: the tool may forward it to a server that
/// honours deadlines (a gRPC deadline, an HTTP header, PostgreSQL's
/// `statement_timeout`), so that the server drops the request rather than
/// apply it late. Declare a parameter of this type on a `#[verified_tool]`
/// fn to receive it, as for the key.
///
/// ```
/// use std::time::Duration;
/// use verified_tools::Deadline;
///
/// # #[tokio::main(flavor = "current_thread", start_paused = true)] async fn main() {
/// let deadline = Deadline::after(Duration::from_millis(1500));
/// assert_eq!(deadline.remaining(), Duration::from_millis(1500));
/// assert_eq!(deadline.grpc_timeout().to_string(), "1500m");
/// tokio::time::sleep(Duration::from_secs(2)).await;
/// assert!(deadline.has_passed());
/// assert_eq!(deadline.remaining(), Duration::ZERO);
/// # }
/// ```
#[derive(Clone, Copy)]
pub struct Deadline {
    /// A start and an offset from it: the engine hands a deadline to every
    /// attempt without doing `Instant` arithmetic until someone asks.
    base: Instant,
    offset: Duration,
}

impl Deadline {
    /// The deadline at `instant` (tokio time).
    pub const fn at(instant: Instant) -> Self {
        Self { base: instant, offset: Duration::ZERO }
    }

    /// The deadline `timeout` from now (saturating far in the future).
    pub fn after(timeout: Duration) -> Self {
        Self { base: Instant::now(), offset: timeout }
    }

    /// The deadline `offset` after `base`.
    pub(crate) const fn from(base: Instant, offset: Duration) -> Self {
        Self { base, offset }
    }

    /// The instant.
    pub fn instant(self) -> Instant {
        later(self.base, self.offset)
    }

    /// Time left, zero once passed, on tokio's clock (the system's outside
    /// a tokio runtime; see [`Clock`](crate::Clock) for a context on another).
    pub fn remaining(self) -> Duration {
        self.offset.saturating_sub(Instant::now().saturating_duration_since(self.base))
    }

    /// Whether it has passed.
    pub fn has_passed(self) -> bool {
        self.remaining().is_zero()
    }

    /// The time left in the format of gRPC's `grpc-timeout` header
    /// (milliseconds, `"1500m"`; at least 1 ms).
    pub fn grpc_timeout(self) -> GrpcTimeout {
        GrpcTimeout(self.remaining().as_millis().clamp(1, 99_999_999) as u64)
    }

    /// The time left as an HTTP request header: [`TIMEOUT_HEADER`]
    /// (`connect-timeout-ms`) and [`http_timeout`](Self::http_timeout), for
    /// any HTTP client. With reqwest (feature `reqwest`),
    /// `DeadlineExt::with_deadline` sets it and the request's own timeout.
    ///
    /// ```
    /// use std::time::Duration;
    /// use verified_tools::Deadline;
    ///
    /// # #[tokio::main(flavor = "current_thread", start_paused = true)] async fn main() {
    /// let deadline = Deadline::after(Duration::from_millis(1500));
    /// let (name, value) = deadline.http_header();
    /// assert_eq!((name, value.to_string().as_str()), ("connect-timeout-ms", "1500"));
    /// // Any client: `request.header(name, value.as_millis())`.
    /// assert_eq!(value.as_duration(), Duration::from_millis(1500));
    /// # }
    /// ```
    pub fn http_header(self) -> (&'static str, HttpTimeout) {
        (TIMEOUT_HEADER, self.http_timeout())
    }

    /// The time left in whole milliseconds, rounded down (the server gives
    /// up no later than the client), at least 1 ms (a passed deadline still
    /// reads as one the server must drop at once, not as "no limit"), at
    /// most ten digits (about 115 days).
    pub fn http_timeout(self) -> HttpTimeout {
        HttpTimeout(self.remaining().as_millis().clamp(1, 9_999_999_999) as u64)
    }
}

impl PartialEq for Deadline {
    fn eq(&self, other: &Self) -> bool {
        self.instant() == other.instant()
    }
}

impl Eq for Deadline {}

impl PartialOrd for Deadline {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for Deadline {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        self.instant().cmp(&other.instant())
    }
}

impl std::hash::Hash for Deadline {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        self.instant().hash(state);
    }
}

impl fmt::Debug for Deadline {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("Deadline").field(&self.instant()).finish()
    }
}

/// A `grpc-timeout` header value; see [`Deadline::grpc_timeout`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GrpcTimeout(u64);

impl fmt::Display for GrpcTimeout {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}m", self.0)
    }
}

/// A `connect-timeout-ms` header value, in milliseconds; see
/// [`Deadline::http_header`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct HttpTimeout(u64);

impl HttpTimeout {
    /// The milliseconds, as the header's value.
    pub const fn as_millis(self) -> u64 {
        self.0
    }

    /// The same time as a `Duration`: what a client's own timeout should
    /// be, so that it gives up when it told the server to.
    pub const fn as_duration(self) -> Duration {
        Duration::from_millis(self.0)
    }
}

impl fmt::Display for HttpTimeout {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)
    }
}

/// The time of one logical call: its deadline, its attempts' deadlines and
/// the settle point of its last attempt, as offsets from the call's start
/// (`Duration` arithmetic: the success path does no `Instant` arithmetic).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Timeline {
    start: Instant,
    /// The call ends by then.
    call: Duration,
    attempt_timeout: Option<Duration>,
    margin: Option<Duration>,
    /// When the last attempt has settled; `None`: never (no margin).
    settles_at: Option<Duration>,
}

impl Timeline {
    pub(crate) fn new(
        start: Instant,
        call_timeout: Duration,
        attempt_timeout: Option<Duration>,
        margin: Option<Duration>,
    ) -> Self {
        let settles_at = Some(Duration::ZERO);
        Self { start, call: call_timeout, attempt_timeout, margin, settles_at }
    }

    /// The offset of `now` from the call's start.
    pub(crate) fn at(&self, now: Instant) -> Duration {
        now.saturating_duration_since(self.start)
    }

    /// The instant `offset` after the call's start.
    pub(crate) fn instant(&self, offset: Duration) -> Instant {
        later(self.start, offset)
    }

    /// The deadline `offset` after the call's start, for an attempt.
    pub(crate) fn deadline(&self, offset: Duration) -> Deadline {
        Deadline::from(self.start, offset)
    }

    /// The call's deadline.
    pub(crate) fn call_deadline(&self) -> Instant {
        self.instant(self.call)
    }

    /// The deadline of an attempt sent at `at`: its timeout, within the call's.
    /// Whether an attempt sent at `at` has less than its own timeout, for
    /// the call's deadline comes first.
    pub(crate) fn cut_by_call(&self, at: Duration) -> bool {
        self.attempt_timeout.is_none_or(|timeout| at.saturating_add(timeout) > self.call)
    }

    pub(crate) fn attempt(&self, at: Duration) -> Duration {
        match self.attempt_timeout {
            Some(timeout) => at.saturating_add(timeout).min(self.call),
            None => self.call,
        }
    }

    /// An attempt with this deadline went out (or the tool answered OK at
    /// `at`, unconfirmed): it settles `margin` later.
    pub(crate) fn dispatched(&mut self, at: Duration) {
        self.settles_at = self.margin.map(|m| at.saturating_add(m));
    }

    /// A call took the key over at `at`: its earlier attempts settle as the
    /// ledger said.
    pub(crate) fn resumed(&mut self, at: Duration, settle: Settle) {
        self.settles_at = match settle {
            Settle::After(d) => Some(at.saturating_add(d)),
            Settle::Never => None,
        };
    }

    /// When the last attempt settles, if ever, and before the call's deadline.
    pub(crate) fn settles_in_time(&self) -> Option<Duration> {
        self.settles_at.filter(|at| *at < self.call)
    }

    /// Whether an `Absent` read at `at` can be believed.
    pub(crate) fn settled(&self, at: Duration) -> bool {
        self.settles_at.is_some_and(|settles| at >= settles)
    }

    /// The settle point as the ledger stores it, counted from `at`.
    pub(crate) fn settle(&self, at: Duration) -> Settle {
        match self.settles_at {
            Some(settles) => Settle::After(settles.saturating_sub(at)),
            None => Settle::Never,
        }
    }
}

/// A century: how far ahead a deadline saturates.
const CENTURY: Duration = Duration::from_secs(100 * 365 * 24 * 3600);

/// `at + d`, saturating about a century ahead instead of overflowing.
pub(crate) fn later(at: Instant, d: Duration) -> Instant {
    Instant::from_std(later_std(at.into_std(), d))
}

/// [`later`] on the standard library's `Instant` (a [`Clock`](crate::Clock)'s).
pub(crate) fn later_std(at: std::time::Instant, d: Duration) -> std::time::Instant {
    at.checked_add(d.min(CENTURY)).unwrap_or(at)
}
