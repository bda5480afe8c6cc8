//! Retry budget, backoff, per-attempt timeout and verification budget.

use std::time::Duration;

use crate::{IdempotencyKey, SideEffect};

/// How the engine treats an ambiguous failure. The two non-default modes are
/// the paper's comparison arms, so experiments compare on equal terms.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, Hash, Default, serde::Serialize, serde::Deserialize,
)]
#[serde(rename_all = "snake_case")]
pub enum Mode {
    /// Verify the postcondition before any retry; retry only on `Absent`.
    #[default]
    VerifyBeforeRetry,
    /// The baseline: retry blindly after an ambiguous failure, never verify.
    RetryOnly,
    /// Verify after an ambiguous failure, never retry.
    VerifyOnly,
}

/// The retry and verification budget of one logical call.
///
/// ```
/// use std::time::Duration;
/// use verified_tools::{RetryPolicy, SideEffect};
///
/// let policy = RetryPolicy::for_class(SideEffect::High)
///     .with_retries(2)
///     .with_attempt_timeout(Some(Duration::from_secs(2)));
/// assert_eq!(policy.retries, 2);
/// // Deterministic jitter: the same key and attempt give the same delay.
/// let key = verified_tools::IdempotencyKey::from_u128(7);
/// assert_eq!(policy.backoff.delay(1, key), policy.backoff.delay(1, key));
/// assert!(policy.backoff.delay(1, key) <= policy.backoff.initial);
/// ```
#[derive(Debug, Clone, Copy, PartialEq)]
#[non_exhaustive]
pub struct RetryPolicy {
    /// Retries after the first attempt (the paper's `N`, 1 by default).
    pub retries: u32,
    /// Wait before verifying (and, in retry-only mode, before retrying).
    pub backoff: Backoff,
    /// Limit of one attempt; past it the attempt counts as ambiguous.
    /// Also bounds each verifier read.
    pub attempt_timeout: Option<Duration>,
    /// Verifier reads allowed for delayed visibility.
    pub verify: VerifyBudget,
    /// Verify even after the tool answered `Ok`, to catch partial success that
    /// answers OK: the call then succeeds only on `Holds`, and ends
    /// `NotApplied` (or `Unknown`) with [`Cause::Unconfirmed`](crate::Cause::Unconfirmed)
    /// otherwise. Costs at least one verifier read on the success path.
    pub verify_response: bool,
}

impl RetryPolicy {
    /// The built-in default of a side-effect class.
    ///
    /// `None` and `Low` retry twice and once; `High` retries once, as in the
    /// paper; `Irreversible` never retries by itself (an unresolved call is
    /// escalated to a person).
    pub const fn for_class(class: SideEffect) -> Self {
        let retries = match class {
            SideEffect::None => 2,
            SideEffect::Low | SideEffect::High => 1,
            SideEffect::Irreversible => 0,
        };
        Self {
            retries,
            backoff: Backoff::DEFAULT,
            attempt_timeout: Some(Duration::from_secs(30)),
            verify: VerifyBudget::DEFAULT,
            verify_response: false,
        }
    }

    /// Sets the retry budget.
    pub const fn with_retries(mut self, retries: u32) -> Self {
        self.retries = retries;
        self
    }

    /// Sets the backoff.
    pub const fn with_backoff(mut self, backoff: Backoff) -> Self {
        self.backoff = backoff;
        self
    }

    /// Sets the per-attempt timeout (`None`: no limit).
    pub const fn with_attempt_timeout(mut self, timeout: Option<Duration>) -> Self {
        self.attempt_timeout = timeout;
        self
    }

    /// Sets the verification budget.
    pub const fn with_verify(mut self, verify: VerifyBudget) -> Self {
        self.verify = verify;
        self
    }

    /// Verify after `Ok` responses too.
    pub const fn with_verify_response(mut self, on: bool) -> Self {
        self.verify_response = on;
        self
    }
}

/// Exponential backoff with deterministic jitter.
///
/// The n-th wait is `min(max, initial × factorⁿ⁻¹)`, less a jitter share drawn
/// from a hash of (seed, key, n): different calls spread out, and the same
/// call under the same seed always waits the same, so tests and simulations
/// replay exactly.
#[derive(Debug, Clone, Copy, PartialEq)]
#[non_exhaustive]
pub struct Backoff {
    /// First wait.
    pub initial: Duration,
    /// Growth per attempt.
    pub factor: u32,
    /// Upper bound of one wait.
    pub max: Duration,
    /// Share of the wait that jitter may remove, in `[0, 1]`.
    pub jitter: f64,
    /// Seed of the jitter.
    pub seed: u64,
}

impl Backoff {
    /// 200 ms, doubling, at most 5 s, up to half of it jittered.
    pub const DEFAULT: Backoff = Backoff {
        initial: Duration::from_millis(200),
        factor: 2,
        max: Duration::from_secs(5),
        jitter: 0.5,
        seed: 0,
    };

    /// A backoff with these bounds and the default jitter.
    pub const fn new(initial: Duration, factor: u32, max: Duration) -> Self {
        Self { initial, factor, max, jitter: 0.5, seed: 0 }
    }

    /// Sets the jitter share and seed.
    pub const fn with_jitter(mut self, jitter: f64, seed: u64) -> Self {
        self.jitter = jitter;
        self.seed = seed;
        self
    }

    /// The wait before attempt `attempt + 1` (attempts count from 1).
    pub fn delay(&self, attempt: u32, key: IdempotencyKey) -> Duration {
        let growth = self.factor.max(1).saturating_pow(attempt.saturating_sub(1));
        let base = self.initial.saturating_mul(growth).min(self.max);
        let k = key.as_u128();
        let draw = splitmix64(self.seed ^ (k as u64) ^ ((k >> 64) as u64) ^ u64::from(attempt));
        // 53 random bits → a uniform fraction in [0, 1).
        let unit = (draw >> 11) as f64 / (1u64 << 53) as f64;
        base.mul_f64(1.0 - self.jitter.clamp(0.0, 1.0) * unit)
    }
}

/// How long the engine keeps reading the verifier for delayed visibility
/// before it accepts `Unknown`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct VerifyBudget {
    /// Verifier reads at most, per verification round.
    pub reads: u32,
    /// Wait between two reads.
    pub interval: Duration,
    /// Consecutive `Absent` reads needed before `Absent` is believed: more
    /// than one guards retries against stale replicas on servers that ignore
    /// keys.
    pub absent_reads: u32,
}

impl VerifyBudget {
    /// Three reads, 250 ms apart; one `Absent` is believed.
    pub const DEFAULT: VerifyBudget =
        VerifyBudget { reads: 3, interval: Duration::from_millis(250), absent_reads: 1 };

    /// A budget of `reads` reads `interval` apart.
    pub const fn new(reads: u32, interval: Duration) -> Self {
        Self { reads, interval, absent_reads: 1 }
    }

    /// Sets the number of reads.
    pub const fn with_reads(mut self, reads: u32) -> Self {
        self.reads = reads;
        self
    }

    /// Sets the wait between two reads.
    pub const fn with_interval(mut self, interval: Duration) -> Self {
        self.interval = interval;
        self
    }

    /// Sets how many consecutive `Absent` reads are believed (at most
    /// `reads`; more could never be met).
    pub const fn with_absent_reads(mut self, absent_reads: u32) -> Self {
        self.absent_reads = absent_reads;
        self
    }
}

fn splitmix64(mut x: u64) -> u64 {
    x = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
    x = (x ^ (x >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    x ^ (x >> 31)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_grows_then_caps_without_jitter() {
        let b = Backoff::new(Duration::from_millis(100), 3, Duration::from_millis(500))
            .with_jitter(0.0, 0);
        let key = IdempotencyKey::from_u128(1);
        let waits: Vec<_> = (1..=4).map(|n| b.delay(n, key).as_millis()).collect();
        assert_eq!(waits, [100, 300, 500, 500]);
    }

    #[test]
    fn jitter_stays_in_bounds_and_depends_on_seed() {
        let key = IdempotencyKey::from_u128(99);
        let a = Backoff::DEFAULT.with_jitter(0.5, 1);
        let b = Backoff::DEFAULT.with_jitter(0.5, 2);
        for n in 1..10 {
            let d = a.delay(n, key);
            let base = Backoff::DEFAULT.with_jitter(0.0, 0).delay(n, key);
            assert!(d <= base && d >= base / 2, "attempt {n}: {d:?} vs {base:?}");
        }
        let differs = (1..10).any(|n| a.delay(n, key) != b.delay(n, key));
        assert!(differs, "seed must change the jitter");
    }

    #[test]
    fn class_defaults_follow_the_paper() {
        assert_eq!(RetryPolicy::for_class(SideEffect::High).retries, 1);
        assert_eq!(RetryPolicy::for_class(SideEffect::Irreversible).retries, 0);
    }
}
