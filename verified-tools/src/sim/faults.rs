//! The fault modes, their probabilities per level (Table 1 of the paper),
//! their shapes (how late a late arrival lands, how long a replica lags),
//! and the per-call fault draw.
//!
//! # How faults are drawn
//!
//! Every write operation `op` of an episode with seed `s` numbers its calls
//! `n = 0, 1, 2, …` (per operation kind, not globally). The faults of call
//! `n` come from their own stream, [`Rng::stream`]`(s, [op, n])`, and are
//! always drawn in full and in the same order, whatever the outcome. So:
//!
//! - the faults of a call depend only on `(seed, op, n)`: a method that makes
//!   more verifier reads, or retries another operation, does not shift the
//!   faults of this one. Reads draw nothing;
//! - two methods running the same task face the same faults on the first
//!   attempt of every logical operation, and the same faults on their second
//!   attempt, whatever happened in between (each task uses each operation
//!   kind for one logical operation; `update_record_fields` only repairs a
//!   partial creation, and its calls have a stream of their own, so a repair
//!   shifts no other operation's faults);
//! - every mode is drawn independently with its own probability, so over
//!   many draws each mode occurs at its configured rate.
//!
//! The draws of a call, in order: timeout, reached-the-server, delayed
//! visibility, lag reads, lag time (the bulk), partial success, conflict;
//! then, appended when late arrivals and the lag tail were added (so the
//! seven earlier draws, and every fault they decide, are unchanged for the
//! same seed): late arrival, its delay, lag tail, its length; then,
//! appended with the partial-OK answer (issue 20), partial OK — so a
//! profile whose [`partial_ok`](FaultProfile::partial_ok) is 0, every
//! level's by default, draws every fault of every seed as before. The values of
//! the earlier draws are the same as before; what they *mean* changed in
//! one place: by default a drawn timeout is now the paper's timeout after
//! dispatch (the request reached the server), where it used to be lost
//! before the server half of the time. [`TimeoutKind::BeforeOrAfter`]
//! restores that reading; [`FaultProfile::legacy`] (with `applied_share:
//! 0.5`, no late arrivals, no lag tail) draws every fault of every seed as
//! the earlier simulator did. One difference remains there: a lag's read
//! count now ends at the replica's lag bound (5 s), where it used to last
//! until that many reads had been made, however late.
//!
//! # What a drawn fault does
//!
//! When several modes are drawn for one call, the server resolves them in
//! this order. A timeout lost *before* the server ([`Timeout::BeforeApplying`],
//! only with [`TimeoutKind::BeforeOrAfter`]): a drawn conflict still bumps the
//! target's version, nothing is applied, the call fails with `Timeout`
//! after `timeout_after`. A *late arrival* ([`Timeout::Late`]): the call
//! fails with `Timeout` after `timeout_after`, and the server receives the
//! request `delay` after it was sent — possibly after the client's retry —
//! and handles it then as below (or drops it, if it honours deadlines and
//! the request's deadline has passed). Otherwise the server handles the
//! request at once: a passed deadline (if honoured) drops it; a known
//! idempotency key replays the stored answer and applies nothing; a
//! conflict bumps the version of a versioned write's target, so the write is
//! rejected with `Conflict`; the write is applied, partially if a partial
//! success or a partial OK was drawn, hidden from reads if a lag was drawn;
//! finally a timeout after applying ([`Timeout::AfterApplying`]) replaces
//! the answer with `Timeout`. Conflicts apply to versioned writes only,
//! partial success and partial OK to compound writes only; a drawn mode
//! that does not apply is ignored.
//!
//! A partial write answers OK either way; what differs is the answer's
//! data. A *partial success* answers with what was written: a client that
//! reads its answer can see the missing field. A *partial OK* answers with
//! what a full write would have written (the paper's "HTTP 200 with partial
//! data", section 2.3, from a service that does not know it failed in
//! part): only a read of the state — a verifier — can tell. When both are
//! drawn, the answer is the partial OK's. A key replays the answer given.

use std::fmt;
use std::str::FromStr;
use std::time::Duration;

use super::rng::Rng;

/// A write operation of the simulated API; fault streams are keyed by it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Op {
    /// Create a customer.
    CreateCustomer = 0,
    /// Set a customer's status to ACTIVE with its `activated_at`
    /// (compound, versioned).
    SetCustomerStatus = 1,
    /// Send a welcome message to a customer.
    SendWelcome = 2,
    /// Write an invoice row's `invoice_id` and `amount` (compound).
    UpdateInvoiceRow = 3,
    /// Create a record with its required fields (compound).
    CreateRecord = 4,
    /// Set a record's status to RECORDED (versioned).
    SetRecordStatus = 5,
    /// Fill in a record's required fields `invoice_id` and `amount`
    /// (compound, versioned). Numbered after the others, so adding it left
    /// their fault streams unchanged.
    UpdateRecordFields = 6,
}

impl Op {
    /// All operations, in their numeric order.
    pub const ALL: [Op; 7] = [
        Op::CreateCustomer,
        Op::SetCustomerStatus,
        Op::SendWelcome,
        Op::UpdateInvoiceRow,
        Op::CreateRecord,
        Op::SetRecordStatus,
        Op::UpdateRecordFields,
    ];

    /// Whether the operation writes several effects at once and can
    /// therefore succeed partially.
    pub const fn is_compound(self) -> bool {
        matches!(
            self,
            Op::SetCustomerStatus
                | Op::UpdateInvoiceRow
                | Op::CreateRecord
                | Op::UpdateRecordFields
        )
    }

    /// Whether the operation carries an expected version and can therefore
    /// hit a stale conflict.
    pub const fn is_versioned(self) -> bool {
        matches!(self, Op::SetCustomerStatus | Op::SetRecordStatus | Op::UpdateRecordFields)
    }

    /// The operation's snake_case name.
    pub const fn name(self) -> &'static str {
        match self {
            Op::CreateCustomer => "create_customer",
            Op::SetCustomerStatus => "set_customer_status",
            Op::SendWelcome => "send_welcome",
            Op::UpdateInvoiceRow => "update_invoice_row",
            Op::CreateRecord => "create_record",
            Op::SetRecordStatus => "set_record_status",
            Op::UpdateRecordFields => "update_record_fields",
        }
    }
}

impl fmt::Display for Op {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// A fault level: Table 1 of the paper, plus an `extreme` level of ours.
///
/// ```
/// use verified_tools::sim::FaultLevel;
///
/// let level: FaultLevel = "medium".parse().unwrap();
/// assert_eq!(level.profile().timeout, 0.20);
/// assert_eq!(level.to_string(), "medium");
/// assert!("severe".parse::<FaultLevel>().is_err());
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum FaultLevel {
    /// timeout 0.05, delayed visibility 0.05, partial 0.03, conflict 0.02.
    Low,
    /// timeout 0.20, delayed visibility 0.15, partial 0.10, conflict 0.05.
    Medium,
    /// timeout 0.35, delayed visibility 0.25, partial 0.15, conflict 0.10.
    High,
    /// Ours: timeout 0.50, delayed visibility 0.40, partial 0.25, conflict 0.20.
    Extreme,
}

impl FaultLevel {
    /// All levels, mildest first.
    pub const ALL: [FaultLevel; 4] =
        [FaultLevel::Low, FaultLevel::Medium, FaultLevel::High, FaultLevel::Extreme];

    /// The level's probabilities with the default shapes
    /// ([`FaultProfile::NONE`]: timeouts after dispatch, late arrivals, the
    /// lag's bulk and heavy tail).
    pub const fn profile(self) -> FaultProfile {
        let (timeout, delayed_visibility, partial_success, conflict) = match self {
            FaultLevel::Low => (0.05, 0.05, 0.03, 0.02),
            FaultLevel::Medium => (0.20, 0.15, 0.10, 0.05),
            FaultLevel::High => (0.35, 0.25, 0.15, 0.10),
            FaultLevel::Extreme => (0.50, 0.40, 0.25, 0.20),
        };
        FaultProfile {
            timeout,
            delayed_visibility,
            partial_success,
            conflict,
            ..FaultProfile::NONE
        }
    }

    /// The level's partial-OK rate: Table 1's partial-success rate of the
    /// level, drawn a second time and independently (low 0.03, medium 0.10,
    /// high 0.15, extreme 0.25). The paper gives failure mode 3 one rate and
    /// says it "may return HTTP 200 with partial data, or may surface no
    /// error at all"; [`profile`](Self::profile) models the first reading
    /// (the answer shows the partial data), the partial-OK world adds the
    /// second at the same rate, so it has both.
    pub const fn partial_ok_rate(self) -> f64 {
        self.profile().partial_success
    }

    /// The level's [`profile`](Self::profile) with partial-OK answers at
    /// [`partial_ok_rate`](Self::partial_ok_rate): every earlier fault of
    /// every seed where it was, plus compound writes applied in part that
    /// answer as if they had been applied in full.
    ///
    /// ```
    /// use verified_tools::sim::FaultLevel;
    ///
    /// let p = FaultLevel::High.partial_ok_profile();
    /// assert_eq!((p.partial_success, p.partial_ok), (0.15, 0.15));
    /// assert_eq!(FaultLevel::High.profile().partial_ok, 0.0);
    /// ```
    pub const fn partial_ok_profile(self) -> FaultProfile {
        self.profile().with_partial_ok(self.partial_ok_rate())
    }

    /// The level's lowercase name.
    pub const fn name(self) -> &'static str {
        match self {
            FaultLevel::Low => "low",
            FaultLevel::Medium => "medium",
            FaultLevel::High => "high",
            FaultLevel::Extreme => "extreme",
        }
    }
}

impl fmt::Display for FaultLevel {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// Error of parsing a [`FaultLevel`].
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown fault level {0:?}: expected low, medium, high or extreme")]
pub struct ParseFaultLevelError(String);

impl FromStr for FaultLevel {
    type Err = ParseFaultLevelError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        FaultLevel::ALL
            .into_iter()
            .find(|l| l.name().eq_ignore_ascii_case(s.trim()))
            .ok_or_else(|| ParseFaultLevelError(s.to_owned()))
    }
}

/// What the server did with a request whose answer the client never got.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub enum TimeoutKind {
    /// The paper's *timeout after dispatch* (section 2.3): the request
    /// reached the server, which applies it at once or — a late arrival,
    /// with probability [`late_arrival`](FaultProfile::late_arrival) — later;
    /// the answer is lost either way.
    #[default]
    AfterDispatch,
    /// The simulator's earlier reading: a share `applied_share` of the
    /// timed-out requests reached the server (then as for
    /// [`AfterDispatch`](Self::AfterDispatch)), the rest were lost before it
    /// and applied nothing.
    BeforeOrAfter {
        /// Share of timeouts whose request reached the server.
        applied_share: f64,
    },
}

/// The longest draw of an uncapped [`Pareto`]: an hour, only so that
/// instants stay finite (the tail beyond it has probability
/// `(scale / 1 h)^alpha`, below 3·10⁻⁵ for the defaults).
pub const UNCAPPED: Duration = Duration::from_secs(3600);

/// A Pareto distribution of durations, the classic heavy tail: at least
/// `scale`, exceeding `d ≥ scale` with probability `(scale / d)^alpha`, so
/// a few draws are many times the typical one. Capped at `cap` when set
/// (draws beyond it are the cap: a bounded tail), else at [`UNCAPPED`].
/// Draws are rounded to the millisecond. Unlike the integer draws of
/// [`Rng`], they go through the platform's `powf`, whose last bit may differ
/// between platforms: a draw can then differ by 1 ms, in the rare case that
/// bit crosses a rounding boundary.
///
/// ```
/// use std::time::Duration;
/// use verified_tools::sim::Pareto;
///
/// let p = Pareto::new(Duration::from_millis(100), 1.0, Some(Duration::from_secs(60)));
/// assert_eq!(p.at(0.0), Duration::from_millis(100)); // the minimum
/// assert_eq!(p.at(0.5), Duration::from_millis(200)); // the median: scale · 2^(1/alpha)
/// assert_eq!(p.at(0.99), Duration::from_secs(10)); // 1% exceed 100 × scale
/// assert_eq!(p.at(0.9999), Duration::from_secs(60)); // capped
/// assert!((p.exceeds(Duration::from_secs(1)) - 0.1).abs() < 1e-12);
/// ```
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Pareto {
    /// The minimum, and the scale of the tail.
    pub scale: Duration,
    /// The tail index: smaller is heavier (at or below 1 the mean is
    /// infinite). Values that are not positive count as 1.
    pub alpha: f64,
    /// The largest draw; `None`: unbounded (up to [`UNCAPPED`]).
    pub cap: Option<Duration>,
}

impl Pareto {
    /// A Pareto distribution with this scale, tail index and cap.
    pub const fn new(scale: Duration, alpha: f64, cap: Option<Duration>) -> Self {
        Self { scale, alpha, cap }
    }

    fn alpha(&self) -> f64 {
        if self.alpha > 0.0 { self.alpha } else { 1.0 }
    }

    /// The largest value a draw can take.
    pub fn max(&self) -> Duration {
        self.cap.unwrap_or(UNCAPPED)
    }

    /// The draw for a uniform `u` in `[0, 1)` (inverse transform).
    pub fn at(&self, u: f64) -> Duration {
        let tail = (1.0 - u.clamp(0.0, 1.0)).max(f64::MIN_POSITIVE);
        let ms = self.scale.as_secs_f64() * 1000.0 * tail.powf(-1.0 / self.alpha());
        let max = self.max();
        if ms.is_finite() && ms < max.as_secs_f64() * 1000.0 {
            Duration::from_millis(ms.round() as u64).min(max)
        } else {
            max
        }
    }

    /// The probability that an uncapped draw exceeds `d`.
    pub fn exceeds(&self, d: Duration) -> f64 {
        if d <= self.scale {
            return 1.0;
        }
        (self.scale.as_secs_f64() / d.as_secs_f64()).powf(self.alpha())
    }
}

/// The fault probabilities per write call and their shapes.
///
/// ```
/// use std::time::Duration;
/// use verified_tools::sim::{FaultLevel, FaultProfile, TimeoutKind};
///
/// let p = FaultLevel::High.profile();
/// assert_eq!((p.timeout, p.conflict), (0.35, 0.10));
/// assert_eq!(p.timeout_kind, TimeoutKind::AfterDispatch); // the paper's
/// assert_eq!(p.lag_bound(), Some(Duration::from_secs(5)));
/// // The simulator's earlier split: half the timeouts lost before the server.
/// let split = p.with_timeout_applied_share(0.5);
/// assert_eq!(split.timeout_kind, TimeoutKind::BeforeOrAfter { applied_share: 0.5 });
/// assert_eq!(FaultProfile::NONE.timeout, 0.0);
/// assert_eq!(p.timeout_after, Duration::from_secs(1));
/// ```
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct FaultProfile {
    /// Probability that the answer is lost and the call times out.
    pub timeout: f64,
    /// Probability that a write stays invisible to reads for a while.
    pub delayed_visibility: f64,
    /// Probability that a compound write applies only part of its effects
    /// (and still answers OK, with the partial data: the answer shows what
    /// is missing).
    pub partial_success: f64,
    /// Probability that a concurrent writer bumps the version of the target
    /// of a versioned write just before it, so the write is rejected.
    pub conflict: f64,
    /// Probability that a compound write applies only part of its effects
    /// and answers OK with the data a full write would have given (a
    /// *partial OK*: nothing in the answer shows what is missing). Drawn
    /// independently of [`partial_success`](Self::partial_success), after
    /// every other draw. 0 in every [`FaultLevel::profile`]; see
    /// [`FaultLevel::partial_ok_profile`].
    pub partial_ok: f64,
    /// What the server did with a timed-out request.
    pub timeout_kind: TimeoutKind,
    /// Share of the timed-out requests that reached the server which it
    /// receives late (a late arrival: held up in the network or a queue),
    /// rather than at once.
    pub late_arrival: f64,
    /// How late a late arrival is received, counted from when it was sent.
    pub late_delay: Pareto,
    /// Virtual time a timed-out call waits before it fails.
    pub timeout_after: Duration,
    /// A delayed write stays invisible for `1..=lag_reads` reads of its
    /// entity (`0`: no read-count lag) …
    pub lag_reads: u32,
    /// … and until `1..=lag_time` ms of virtual time have passed since the
    /// write (zero: no time lag) — the bulk of the lags. It is visible once
    /// both have passed, and in any case once [`lag_bound`](Self::lag_bound)
    /// has passed, if there is one.
    pub lag_time: Duration,
    /// Share of the delayed writes whose lag time is drawn from the heavy
    /// tail [`lag_tail_time`](Self::lag_tail_time) instead of the bulk.
    pub lag_tail: f64,
    /// The lag times of the tail.
    pub lag_tail_time: Pareto,
}

impl FaultProfile {
    /// No faults at all, with the default shapes:
    ///
    /// - timeouts after dispatch; half of them late arrivals, received after
    ///   a Pareto delay (scale 100 ms, α = 1, unbounded: median 200 ms, 10%
    ///   after 1 s, 1% after 10 s); 1 s timeouts;
    /// - lag of 1..=2 reads and 1..=1000 ms (uniform), one lag in ten from a
    ///   Pareto tail instead (scale 1 s, α = 1.5, bounded at 5 s: 8.9% of
    ///   the tail would exceed 5 s and is cut to it); every delayed write is
    ///   visible 5 s after it was applied at the latest.
    pub const NONE: FaultProfile = FaultProfile {
        timeout: 0.0,
        delayed_visibility: 0.0,
        partial_success: 0.0,
        conflict: 0.0,
        partial_ok: 0.0,
        timeout_kind: TimeoutKind::AfterDispatch,
        late_arrival: 0.5,
        late_delay: Pareto::new(Duration::from_millis(100), 1.0, None),
        timeout_after: Duration::from_secs(1),
        lag_reads: 2,
        lag_time: Duration::from_millis(1000),
        lag_tail: 0.1,
        lag_tail_time: Pareto::new(Duration::from_secs(1), 1.5, Some(Duration::from_secs(5))),
    };

    /// Sets the probability of a partial OK (see [`partial_ok`](Self::partial_ok)).
    pub const fn with_partial_ok(mut self, p: f64) -> Self {
        self.partial_ok = p;
        self
    }

    /// Sets what a timed-out request did on the server.
    pub const fn with_timeout_kind(mut self, kind: TimeoutKind) -> Self {
        self.timeout_kind = kind;
        self
    }

    /// The simulator's earlier timeouts: a share `share` of them reached the
    /// server, the rest were lost before it
    /// ([`TimeoutKind::BeforeOrAfter`]).
    pub const fn with_timeout_applied_share(self, share: f64) -> Self {
        self.with_timeout_kind(TimeoutKind::BeforeOrAfter { applied_share: share })
    }

    /// Sets the share of late arrivals among the timed-out requests that
    /// reached the server, and their delay.
    pub const fn with_late_arrival(mut self, share: f64, delay: Pareto) -> Self {
        self.late_arrival = share;
        self.late_delay = delay;
        self
    }

    /// Sets how long a timed-out call waits.
    pub const fn with_timeout_after(mut self, after: Duration) -> Self {
        self.timeout_after = after;
        self
    }

    /// Sets the bulk of the visibility lag, in reads and in virtual time.
    pub const fn with_lag(mut self, reads: u32, time: Duration) -> Self {
        self.lag_reads = reads;
        self.lag_time = time;
        self
    }

    /// Sets the share of lags drawn from the heavy tail, and the tail.
    pub const fn with_lag_tail(mut self, share: f64, tail: Pareto) -> Self {
        self.lag_tail = share;
        self.lag_tail_time = tail;
        self
    }

    /// The simulator as it was before late arrivals and the lag tail: half
    /// the timeouts lost before the server, none received late, every lag
    /// from the bulk. Draws every fault of every seed as that simulator did
    /// (a lag's read count now ends at the lag bound, see the
    /// [module docs](self)).
    pub const fn legacy(self) -> Self {
        let mut p = self.with_timeout_applied_share(0.5);
        p.late_arrival = 0.0;
        p.lag_tail = 0.0;
        p
    }

    /// The latest a delayed write becomes visible after it was applied,
    /// whatever its reads: the replica is never further behind. The tail's
    /// cap (or the bulk's `lag_time`, if larger). `None` when the tail is
    /// unbounded: then a delayed write stays hidden for its reads and its
    /// time, however long that is.
    pub const fn lag_bound(&self) -> Option<Duration> {
        match self.lag_tail_time.cap {
            Some(cap) if cap.as_nanos() >= self.lag_time.as_nanos() => Some(cap),
            Some(_) => Some(self.lag_time),
            None => None,
        }
    }

    /// Draws the faults of call `n` of `op` in the episode seeded `seed`;
    /// see the [module docs](self) for why it is keyed this way.
    ///
    /// ```
    /// use verified_tools::sim::{FaultLevel, Op};
    ///
    /// let p = FaultLevel::High.profile();
    /// assert_eq!(p.draw(42, Op::SendWelcome, 0), p.draw(42, Op::SendWelcome, 0));
    /// ```
    pub fn draw(&self, seed: u64, op: Op, n: u32) -> FaultDraw {
        let mut rng = Rng::stream(seed, &[op as u64, u64::from(n)]);
        let reached_share = match self.timeout_kind {
            TimeoutKind::AfterDispatch => 1.0,
            TimeoutKind::BeforeOrAfter { applied_share } => applied_share,
        };
        // Every value is drawn, in this order, whatever the outcomes.
        let timeout = rng.chance(self.timeout);
        let reached = rng.chance(reached_share);
        let delayed = rng.chance(self.delayed_visibility);
        let reads = rng.one_to(u64::from(self.lag_reads)) as u32;
        let ms = rng.one_to(self.lag_time.as_millis() as u64);
        let partial = rng.chance(self.partial_success);
        let conflict = rng.chance(self.conflict);
        // Appended after the seven above, so that they did not move.
        let late = rng.chance(self.late_arrival);
        let late_u = rng.next_f64();
        let tail = rng.chance(self.lag_tail);
        let tail_u = rng.next_f64();
        // Appended after the eleven above (issue 20).
        let partial_ok = rng.chance(self.partial_ok);
        let timeout = timeout.then_some(match (reached, late) {
            (false, _) => Timeout::BeforeApplying,
            (true, false) => Timeout::AfterApplying,
            (true, true) => Timeout::Late(self.late_delay.at(late_u)),
        });
        let time = if tail { self.lag_tail_time.at(tail_u) } else { Duration::from_millis(ms) };
        let bound = self.lag_bound();
        let time = bound.map_or(time, |b| time.min(b));
        let lag = delayed.then_some(Lag { reads, time, bound });
        FaultDraw { timeout, lag, partial, conflict, partial_ok }
    }
}

impl Default for FaultProfile {
    fn default() -> Self {
        Self::NONE
    }
}

/// What became of a request whose answer was lost.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Timeout {
    /// The request was lost before the server: no effect (only with
    /// [`TimeoutKind::BeforeOrAfter`]).
    BeforeApplying,
    /// The server handled the request at once (applied it, or replayed or
    /// rejected it), then the answer was lost.
    AfterApplying,
    /// A late arrival: the server receives the request this long after it
    /// was sent, and handles it then; the answer never comes.
    Late(Duration),
}

/// How long a delayed write stays invisible to reads of its entity.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Lag {
    /// Reads that still see the previous state …
    pub reads: u32,
    /// … and virtual time after the write during which reads see it.
    pub time: Duration,
    /// Visible this long after the write at the latest, whatever the reads
    /// ([`FaultProfile::lag_bound`]); `None`: no bound.
    pub bound: Option<Duration>,
}

/// The faults drawn for one write call; see [`FaultProfile::draw`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct FaultDraw {
    /// The answer is lost; what became of the request.
    pub timeout: Option<Timeout>,
    /// The write is applied but stays invisible to reads for this lag.
    pub lag: Option<Lag>,
    /// A compound write applies part of its effects.
    pub partial: bool,
    /// A concurrent writer bumps the target's version first.
    pub conflict: bool,
    /// A compound write applies part of its effects and answers as if it
    /// had applied them all.
    pub partial_ok: bool,
}

#[cfg(test)]
mod tests {
    use super::*;

    const DRAWS: u32 = 10_000;

    /// Shares of each outcome over `DRAWS` draws of every operation (70,000
    /// draws): timeout, applied at once, late, lost before, lag, partial,
    /// conflict, partial OK.
    fn frequencies(p: &FaultProfile, seed: u64) -> [f64; 8] {
        let mut c = [0u32; 8];
        for op in Op::ALL {
            for n in 0..DRAWS {
                let d = p.draw(seed, op, n);
                c[0] += u32::from(d.timeout.is_some());
                c[1] += u32::from(d.timeout == Some(Timeout::AfterApplying));
                c[2] += u32::from(matches!(d.timeout, Some(Timeout::Late(_))));
                c[3] += u32::from(d.timeout == Some(Timeout::BeforeApplying));
                c[4] += u32::from(d.lag.is_some());
                c[5] += u32::from(d.partial);
                c[6] += u32::from(d.conflict);
                c[7] += u32::from(d.partial_ok);
            }
        }
        let total = f64::from(DRAWS) * Op::ALL.len() as f64;
        c.map(|x| f64::from(x) / total)
    }

    #[test]
    fn table_1_probabilities() {
        let t = |l: FaultLevel| {
            let p = l.profile();
            (p.timeout, p.delayed_visibility, p.partial_success, p.conflict)
        };
        assert_eq!(t(FaultLevel::Low), (0.05, 0.05, 0.03, 0.02));
        assert_eq!(t(FaultLevel::Medium), (0.20, 0.15, 0.10, 0.05));
        assert_eq!(t(FaultLevel::High), (0.35, 0.25, 0.15, 0.10));
        assert_eq!(t(FaultLevel::Extreme), (0.50, 0.40, 0.25, 0.20));
    }

    #[test]
    fn each_mode_occurs_at_its_configured_rate() {
        let profiles = FaultLevel::ALL.map(|l| (l, l.profile(), 0.0));
        let partial_ok = FaultLevel::ALL.map(|l| (l, l.partial_ok_profile(), l.partial_ok_rate()));
        for (level, p, want_partial_ok) in profiles.into_iter().chain(partial_ok) {
            let f = frequencies(&p, 42);
            // 70,000 draws: a standard error of at most 0.0019; allow ~5 of them.
            let close = |got: f64, want: f64| (got - want).abs() < 0.01;
            assert!(close(f[0], p.timeout), "{level} timeout {}", f[0]);
            // After dispatch: every timed-out request reached the server,
            // half of them late.
            assert_eq!(f[3], 0.0, "{level}: none lost before the server");
            assert!(close(f[1], p.timeout * 0.5), "{level} applied at once {}", f[1]);
            assert!(close(f[2], p.timeout * 0.5), "{level} late arrivals {}", f[2]);
            assert!(close(f[4], p.delayed_visibility), "{level} delayed {}", f[4]);
            assert!(close(f[5], p.partial_success), "{level} partial {}", f[5]);
            assert!(close(f[6], p.conflict), "{level} conflict {}", f[6]);
            assert!(close(f[7], want_partial_ok), "{level} partial OK {}", f[7]);
            assert_eq!(want_partial_ok == 0.0, f[7] == 0.0, "{level}");
        }
    }

    #[test]
    fn partial_ok_rates_are_table_1_s_partial_rates() {
        let rates = FaultLevel::ALL.map(FaultLevel::partial_ok_rate);
        assert_eq!(rates, [0.03, 0.10, 0.15, 0.25]);
        for level in FaultLevel::ALL {
            let p = level.partial_ok_profile();
            assert_eq!(p, level.profile().with_partial_ok(level.partial_ok_rate()));
            assert_eq!(level.profile().partial_ok, 0.0);
        }
        assert_eq!(FaultProfile::NONE.partial_ok, 0.0);
    }

    #[test]
    fn the_partial_ok_draw_left_every_earlier_fault_where_it_was() {
        let (mut both, mut partial, mut partial_ok, mut n_all) = (0u32, 0u32, 0u32, 0u32);
        for level in FaultLevel::ALL {
            for (old, new) in [
                (level.profile(), level.partial_ok_profile()),
                (level.profile().legacy(), level.partial_ok_profile().legacy()),
            ] {
                for op in Op::ALL {
                    for n in 0..2_000 {
                        let (a, b) = (old.draw(42, op, n), new.draw(42, op, n));
                        assert!(!a.partial_ok, "{level} {op} {n}");
                        assert_eq!(FaultDraw { partial_ok: false, ..b }, a, "{level} {op} {n}");
                        if level == FaultLevel::Extreme {
                            n_all += 1;
                            partial += u32::from(b.partial);
                            partial_ok += u32::from(b.partial_ok);
                            both += u32::from(b.partial && b.partial_ok);
                        }
                    }
                }
            }
        }
        // Drawn independently of the partial success: both together at the
        // product of their rates (0.25², 1,750 of 28,000 expected).
        let share = |k: u32| f64::from(k) / f64::from(n_all);
        assert!((share(partial) - 0.25).abs() < 0.015, "{}", share(partial));
        assert!((share(partial_ok) - 0.25).abs() < 0.015, "{}", share(partial_ok));
        assert!((share(both) - 0.0625).abs() < 0.01, "{}", share(both));
    }

    #[test]
    fn the_before_or_after_split_occurs_as_configured() {
        let p = FaultLevel::Medium.profile().with_timeout_applied_share(0.25);
        let (mut before, mut reached, mut late) = (0u32, 0u32, 0u32);
        for n in 0..DRAWS {
            match p.draw(7, Op::SendWelcome, n).timeout {
                Some(Timeout::BeforeApplying) => before += 1,
                Some(Timeout::AfterApplying) => reached += 1,
                Some(Timeout::Late(_)) => {
                    reached += 1;
                    late += 1;
                }
                None => {}
            }
        }
        let share = f64::from(reached) / f64::from(before + reached);
        assert!(before > 0 && reached > 0);
        assert!((share - 0.25).abs() < 0.04, "{share}");
        // Late arrivals are a share of the requests that reached the server.
        let late_share = f64::from(late) / f64::from(reached);
        assert!((late_share - 0.5).abs() < 0.08, "{late_share}");
    }

    /// The draw as it was before late arrivals and the lag tail were
    /// appended, written out again: the seven draws it made, in its order.
    fn draw_before_issue_9(
        p: &FaultProfile,
        applied_share: f64,
        s: u64,
        op: Op,
        n: u32,
    ) -> FaultDraw {
        let mut rng = Rng::stream(s, &[op as u64, u64::from(n)]);
        let timeout = rng.chance(p.timeout);
        let applied = rng.chance(applied_share);
        let delayed = rng.chance(p.delayed_visibility);
        let reads = rng.one_to(u64::from(p.lag_reads)) as u32;
        let ms = rng.one_to(p.lag_time.as_millis() as u64);
        let partial = rng.chance(p.partial_success);
        let conflict = rng.chance(p.conflict);
        FaultDraw {
            timeout: timeout.then_some(if applied {
                Timeout::AfterApplying
            } else {
                Timeout::BeforeApplying
            }),
            lag: delayed.then_some(Lag {
                reads,
                time: Duration::from_millis(ms),
                bound: p.lag_bound(),
            }),
            partial,
            conflict,
            partial_ok: false,
        }
    }

    #[test]
    fn the_appended_draws_left_every_earlier_fault_where_it_was() {
        for level in FaultLevel::ALL {
            let paper = level.profile();
            let legacy = paper.legacy();
            for op in Op::ALL {
                for n in 0..2_000 {
                    let old = draw_before_issue_9(&paper, 0.5, 42, op, n);
                    // The legacy profile faces every call exactly as before.
                    assert_eq!(legacy.draw(42, op, n), old, "{level} {op} {n}");
                    // The default one on the same calls: the same timeouts
                    // (now all after dispatch), lags, partials, conflicts.
                    let new = paper.draw(42, op, n);
                    assert_eq!(new.timeout.is_some(), old.timeout.is_some());
                    assert_ne!(new.timeout, Some(Timeout::BeforeApplying));
                    assert_eq!((new.partial, new.conflict), (old.partial, old.conflict));
                    assert_eq!(new.lag.map(|l| l.reads), old.lag.map(|l| l.reads));
                }
            }
        }
    }

    #[test]
    fn late_arrivals_have_their_heavy_tailed_delay() {
        let p = FaultProfile { timeout: 1.0, ..FaultProfile::NONE };
        let delays: Vec<Duration> = (0..DRAWS)
            .filter_map(|n| match p.draw(3, Op::SendWelcome, n).timeout {
                Some(Timeout::Late(d)) => Some(d),
                _ => None,
            })
            .collect();
        let share = delays.len() as f64 / f64::from(DRAWS);
        assert!((share - 0.5).abs() < 0.02, "{share}");
        let over = |ms| delays.iter().filter(|d| **d > Duration::from_millis(ms)).count() as f64;
        let n = delays.len() as f64;
        assert!(delays.iter().all(|d| *d >= Duration::from_millis(100)));
        // P(> 1 s) = 0.1, P(> 10 s) = 0.01: the tail reaches 100 × the minimum.
        assert!((over(1_000) / n - 0.1).abs() < 0.015, "{}", over(1_000) / n);
        assert!((over(10_000) / n - 0.01).abs() < 0.005, "{}", over(10_000) / n);
        assert!(delays.iter().any(|d| *d > Duration::from_secs(60)), "unbounded by default");
    }

    #[test]
    fn lags_have_a_bulk_and_a_bounded_heavy_tail() {
        let p = FaultProfile { delayed_visibility: 1.0, ..FaultProfile::NONE };
        let lags: Vec<Lag> =
            (0..DRAWS).map(|n| p.draw(5, Op::CreateRecord, n).lag.unwrap()).collect();
        let bulk = Duration::from_secs(1);
        let n = lags.len() as f64;
        let beyond = |d: Duration| lags.iter().filter(|l| l.time > d).count() as f64 / n;
        // One lag in ten comes from the tail (Pareto from 1 s): none of the
        // bulk exceeds 1 s, 0.1 · 2^-1.5 = 3.5% exceed 2 s, 0.1 · 4^-1.5 =
        // 1.25% exceed 4 s, and 0.1 · 5^-1.5 = 0.9% sit at the 5 s bound.
        assert!((beyond(bulk) - 0.1).abs() < 0.015, "{}", beyond(bulk));
        assert!((beyond(2 * bulk) - 0.035).abs() < 0.01, "{}", beyond(2 * bulk));
        assert!((beyond(4 * bulk) - 0.0125).abs() < 0.006, "{}", beyond(4 * bulk));
        let at_bound = lags.iter().filter(|l| l.time == 5 * bulk).count() as f64 / n;
        assert!(at_bound > 0.004 && at_bound < 0.015, "{at_bound}");
        assert!(lags.iter().all(|l| l.time <= 5 * bulk && l.bound == Some(5 * bulk)));
        // Unbounded when the tail has no cap.
        let open = p.with_lag_tail(0.5, Pareto::new(bulk, 1.5, None));
        assert_eq!(open.lag_bound(), None);
        let far = (0..DRAWS).filter_map(|n| open.draw(5, Op::CreateRecord, n).lag);
        assert!(far.filter(|l| l.time > 30 * bulk).count() > 10);
    }

    #[test]
    fn lags_cover_their_ranges() {
        let p = FaultProfile { delayed_visibility: 1.0, ..FaultProfile::NONE }
            .with_lag(3, Duration::from_millis(10))
            .with_lag_tail(0.0, FaultProfile::NONE.lag_tail_time);
        // The tail's cap bounds the replica even when no lag is drawn from it.
        assert_eq!(p.lag_bound(), Some(Duration::from_secs(5)));
        let mut reads = [0u32; 4];
        let mut ms = [0u32; 11];
        for n in 0..DRAWS {
            let lag = p.draw(1, Op::CreateRecord, n).lag.unwrap();
            reads[lag.reads as usize] += 1;
            ms[lag.time.as_millis() as usize] += 1;
        }
        assert_eq!(reads[0], 0);
        assert!(reads[1..].iter().all(|&c| c > 3_000), "{reads:?}");
        assert_eq!(ms[0], 0);
        assert!(ms[1..].iter().all(|&c| c > 800), "{ms:?}");
    }

    #[test]
    fn pareto_draws_follow_their_survival_function() {
        let p = Pareto::new(Duration::from_millis(100), 1.0, Some(Duration::from_secs(60)));
        let mut rng = Rng::new(9);
        let draws: Vec<Duration> = (0..100_000).map(|_| p.at(rng.next_f64())).collect();
        for ms in [200u64, 1_000, 5_000] {
            let d = Duration::from_millis(ms);
            let got = draws.iter().filter(|x| **x > d).count() as f64 / draws.len() as f64;
            assert!((got - p.exceeds(d)).abs() < 0.005, "{ms}: {got}");
        }
        assert!(draws.iter().all(|d| *d >= p.scale && *d <= p.max()));
        assert_eq!(p.at(1.0), Duration::from_secs(60));
        assert_eq!(Pareto { alpha: f64::NAN, ..p }.at(0.5), Duration::from_millis(200));
        assert_eq!(Pareto::new(Duration::from_secs(1), 2.0, None).max(), UNCAPPED);
    }

    #[test]
    fn no_faults_without_probability() {
        for op in Op::ALL {
            for n in 0..1_000 {
                assert_eq!(FaultProfile::NONE.draw(42, op, n), FaultDraw::default());
            }
        }
    }

    #[test]
    fn draws_depend_on_seed_op_and_call_only() {
        let p = FaultLevel::Extreme.profile();
        let stream = |seed, op| (0..64).map(|n| p.draw(seed, op, n)).collect::<Vec<_>>();
        assert_eq!(stream(42, Op::SendWelcome), stream(42, Op::SendWelcome));
        assert_ne!(stream(42, Op::SendWelcome), stream(43, Op::SendWelcome));
        assert_ne!(stream(42, Op::SendWelcome), stream(42, Op::CreateRecord));
    }

    #[test]
    fn levels_parse_and_print() {
        for level in FaultLevel::ALL {
            assert_eq!(level.to_string().parse::<FaultLevel>(), Ok(level));
        }
        assert_eq!(" HIGH ".parse::<FaultLevel>(), Ok(FaultLevel::High));
        assert!("".parse::<FaultLevel>().is_err());
    }
}
