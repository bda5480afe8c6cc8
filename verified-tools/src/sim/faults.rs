//! The four fault modes, their probabilities per level (Table 1 of the
//! paper), and the per-call fault draw.
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
//! When several modes are drawn for one call, the server resolves them in
//! this order: a conflict first (the concurrent writer bumps the target's
//! version, whatever then happens to our call); a timeout before applying
//! (nothing applied, `Timeout` after `timeout_after`); otherwise the write is
//! applied against the bumped version (so a drawn conflict rejects it with
//! `Conflict`), partially if a partial success was drawn, hidden from reads
//! if a lag was drawn; finally a timeout after applying replaces the answer
//! with `Timeout`. Conflicts apply to versioned writes only, partial success
//! to compound writes only; a drawn mode that does not apply is ignored. A
//! replay of a known idempotency key only draws its timeout.

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

    /// The level's probabilities with the default timeout split and lag.
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

/// The fault probabilities per write call and their shapes.
///
/// ```
/// use std::time::Duration;
/// use verified_tools::sim::{FaultLevel, FaultProfile};
///
/// let p = FaultLevel::High.profile().with_timeout_applied_share(0.8);
/// assert_eq!((p.timeout, p.conflict), (0.35, 0.10));
/// assert_eq!(FaultProfile::NONE.timeout, 0.0);
/// assert_eq!(p.timeout_after, Duration::from_secs(1));
/// ```
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct FaultProfile {
    /// Probability that the response is lost and the call times out.
    pub timeout: f64,
    /// Probability that a write stays invisible to reads for a while.
    pub delayed_visibility: f64,
    /// Probability that a compound write applies only part of its effects
    /// (and still answers OK, with the partial data).
    pub partial_success: f64,
    /// Probability that a concurrent writer bumps the version of the target
    /// of a versioned write just before it, so the write is rejected.
    pub conflict: f64,
    /// Share of timeouts where the server applied the effect before the
    /// response was lost; the rest timed out before the server applied it.
    pub timeout_applied_share: f64,
    /// Virtual time a timed-out call waits before it fails.
    pub timeout_after: Duration,
    /// A delayed write stays invisible for `1..=lag_reads` reads of its
    /// entity (`0`: no read-count lag) …
    pub lag_reads: u32,
    /// … and until `1..=lag_time` ms of virtual time have passed since the
    /// write (zero: no time lag). It is visible once both have passed.
    pub lag_time: Duration,
}

impl FaultProfile {
    /// No faults at all, with the default shapes: half of the timeouts
    /// applied, 1 s timeouts, lag of 1..=2 reads and 1..=1000 ms.
    pub const NONE: FaultProfile = FaultProfile {
        timeout: 0.0,
        delayed_visibility: 0.0,
        partial_success: 0.0,
        conflict: 0.0,
        timeout_applied_share: 0.5,
        timeout_after: Duration::from_secs(1),
        lag_reads: 2,
        lag_time: Duration::from_millis(1000),
    };

    /// Sets the share of timeouts that applied the effect first.
    pub const fn with_timeout_applied_share(mut self, share: f64) -> Self {
        self.timeout_applied_share = share;
        self
    }

    /// Sets how long a timed-out call waits.
    pub const fn with_timeout_after(mut self, after: Duration) -> Self {
        self.timeout_after = after;
        self
    }

    /// Sets the maximal visibility lag, in reads and in virtual time.
    pub const fn with_lag(mut self, reads: u32, time: Duration) -> Self {
        self.lag_reads = reads;
        self.lag_time = time;
        self
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
        // Every value is drawn, in this order, whatever the outcomes.
        let timeout = rng.chance(self.timeout);
        let applied = rng.chance(self.timeout_applied_share);
        let delayed = rng.chance(self.delayed_visibility);
        let reads = rng.one_to(u64::from(self.lag_reads)) as u32;
        let ms = rng.one_to(self.lag_time.as_millis() as u64);
        let partial = rng.chance(self.partial_success);
        let conflict = rng.chance(self.conflict);
        FaultDraw {
            timeout: timeout.then_some(if applied {
                Timeout::AfterApplying
            } else {
                Timeout::BeforeApplying
            }),
            lag: delayed.then_some(Lag { reads, time: Duration::from_millis(ms) }),
            partial,
            conflict,
        }
    }
}

impl Default for FaultProfile {
    fn default() -> Self {
        Self::NONE
    }
}

/// Which side of the server's apply a timeout fell on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Timeout {
    /// The request was lost before the server applied it: no effect.
    BeforeApplying,
    /// The server applied the effect, then the response was lost.
    AfterApplying,
}

/// How long a delayed write stays invisible to reads of its entity.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Lag {
    /// Reads that still see the previous state.
    pub reads: u32,
    /// Virtual time after the write during which reads see the previous state.
    pub time: Duration,
}

/// The faults drawn for one write call; see [`FaultProfile::draw`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct FaultDraw {
    /// The response is lost, after or before the server applied the effect.
    pub timeout: Option<Timeout>,
    /// The write is applied but stays invisible to reads for this lag.
    pub lag: Option<Lag>,
    /// A compound write applies part of its effects.
    pub partial: bool,
    /// A concurrent writer bumps the target's version first.
    pub conflict: bool,
}

#[cfg(test)]
mod tests {
    use super::*;

    const DRAWS: u32 = 10_000;

    /// Counts each mode over `DRAWS` draws of every operation (70,000 draws).
    fn frequencies(p: &FaultProfile, seed: u64) -> [f64; 6] {
        let mut c = [0u32; 6];
        for op in Op::ALL {
            for n in 0..DRAWS {
                let d = p.draw(seed, op, n);
                c[0] += u32::from(d.timeout.is_some());
                c[1] += u32::from(d.timeout == Some(Timeout::AfterApplying));
                c[2] += u32::from(d.lag.is_some());
                c[3] += u32::from(d.partial);
                c[4] += u32::from(d.conflict);
                c[5] += 1;
            }
        }
        let total = f64::from(c[5]);
        [c[0], c[1], c[2], c[3], c[4], c[5]].map(|x| f64::from(x) / total)
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
        for level in FaultLevel::ALL {
            let p = level.profile();
            let f = frequencies(&p, 42);
            // 70,000 draws: a standard error of at most 0.0019; allow ~5 of them.
            let close = |got: f64, want: f64| (got - want).abs() < 0.01;
            assert!(close(f[0], p.timeout), "{level} timeout {}", f[0]);
            assert!(close(f[1], p.timeout * 0.5), "{level} applied timeouts {}", f[1]);
            assert!(close(f[2], p.delayed_visibility), "{level} delayed {}", f[2]);
            assert!(close(f[3], p.partial_success), "{level} partial {}", f[3]);
            assert!(close(f[4], p.conflict), "{level} conflict {}", f[4]);
        }
    }

    #[test]
    fn both_timeout_variants_occur_in_the_configured_split() {
        let p = FaultLevel::Medium.profile().with_timeout_applied_share(0.25);
        let (mut before, mut after) = (0u32, 0u32);
        for n in 0..DRAWS {
            match p.draw(7, Op::SendWelcome, n).timeout {
                Some(Timeout::BeforeApplying) => before += 1,
                Some(Timeout::AfterApplying) => after += 1,
                None => {}
            }
        }
        let share = f64::from(after) / f64::from(before + after);
        assert!(before > 0 && after > 0);
        assert!((share - 0.25).abs() < 0.04, "{share}");
    }

    #[test]
    fn lags_cover_their_ranges() {
        let p = FaultProfile { delayed_visibility: 1.0, ..FaultProfile::NONE }
            .with_lag(3, Duration::from_millis(10));
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
