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

use std::time::Duration;

use super::rng::Rng;

mod level;
mod op;
mod pareto;
#[cfg(test)]
mod tests;

pub use level::{FaultLevel, ParseFaultLevelError};
pub use op::Op;
pub use pareto::{Pareto, UNCAPPED};

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
