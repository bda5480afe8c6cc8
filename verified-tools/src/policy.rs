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
    /// Limit of one attempt; past it the attempt counts as ambiguous. The
    /// attempt's deadline is handed to the tool (a [`Deadline`](crate::Deadline)
    /// parameter) to forward to a server that honours deadlines. Also bounds
    /// each verifier read. `None`: only the call's deadline bounds it.
    pub attempt_timeout: Option<Duration>,
    /// Limit of the whole logical call: attempts, verifier reads, waits and
    /// backoff together. Whatever the tool and the verifier do, the call ends
    /// by then (`Unknown` with [`UnknownReason::DeadlineExceeded`](crate::UnknownReason::DeadlineExceeded)
    /// if anything was dispatched). It must not exceed the ledger's lease.
    pub call_timeout: Duration,
    /// The settle margin: how long after an attempt's deadline (or after an
    /// `Ok` answer the verifier did not confirm) the service may still apply
    /// that attempt, or still hide its effect from the verifier (a request
    /// delayed in the network, a commit still running, a lagging replica).
    ///
    /// A verifier's `Absent` is believed, for a retry or for
    /// [`NotApplied`](crate::ToolResult::NotApplied), only when read after
    /// that point; the engine waits for it while the call's deadline allows.
    /// `None` (the default): the service gives no bound, so `Absent` is never
    /// believed after an ambiguous failure and such a call ends `Unknown`
    /// (`Escalated` if irreversible) with its key. Set it to the service's
    /// worst case: replica lag plus the time a request may travel or queue.
    pub settle: Option<Duration>,
    /// Verifier reads allowed for delayed visibility.
    pub verify: VerifyBudget,
    /// Verify even after the tool answered `Ok`: the call then succeeds only
    /// on `Holds`, and ends `NotApplied` (or `Unknown`) with
    /// [`Cause::Unconfirmed`](crate::Cause::Unconfirmed) otherwise. A
    /// response is not the effect: a compound write applied in part may
    /// answer OK, with data that looks complete (the paper's failure mode
    /// 3), and only a read of the state tells.
    ///
    /// On by default for [`High`](SideEffect::High) and
    /// [`Irreversible`](SideEffect::Irreversible), which must have a
    /// verifier anyway; off for [`None`](SideEffect::None) and
    /// [`Low`](SideEffect::Low). Without a verifier it does nothing. A tool
    /// opts out with `verify_response = false` (or
    /// [`ToolSpec::with_verify_response`](crate::ToolSpec::with_verify_response)),
    /// when its answer is the effect (the service's own read after its
    /// write) or an extra read costs more than a false `Success`.
    ///
    /// Its cost is one verifier read per `Ok` answer on the success path;
    /// more while a lagging replica hides the effect; and when the reads of
    /// [`verify`](Self::verify) run out before it shows, the wait for the
    /// settle point — or, with no [`settle`](Self::settle) margin, a call
    /// that ends `Unknown` (`Escalated` if irreversible) instead of
    /// `Success`: a verifier that reads a lagging replica needs a margin
    /// (or more reads) to confirm an OK answer. Measured in the
    /// repository's `EXPERIMENT.md` (issue 20): with it, verify-before-retry
    /// reported no false success in 80,000 episodes of the simulator whose
    /// partial writes answer as if complete; with it off, 5.1% (low faults)
    /// to 52.8% (extreme) of those episodes ended in a false success.
    pub verify_response: bool,
}

impl RetryPolicy {
    /// The built-in default of a side-effect class.
    ///
    /// `None` and `Low` retry twice and once; `High` retries once, as in the
    /// paper; `Irreversible` never retries by itself (an unresolved call is
    /// escalated to a person). `High` and `Irreversible` verify an `Ok`
    /// answer before they report `Success` ([`verify_response`](Self::verify_response)).
    ///
    /// ```
    /// use verified_tools::{RetryPolicy, SideEffect};
    ///
    /// let verifies_ok = SideEffect::ALL.map(|c| RetryPolicy::for_class(c).verify_response);
    /// assert_eq!(verifies_ok, [false, false, true, true]); // none, low, high, irreversible
    /// ```
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
            call_timeout: Duration::from_secs(120),
            settle: None,
            verify: VerifyBudget::DEFAULT,
            verify_response: matches!(class, SideEffect::High | SideEffect::Irreversible),
        }
    }

    /// Sets the deadline of the whole logical call.
    pub const fn with_call_timeout(mut self, timeout: Duration) -> Self {
        self.call_timeout = timeout;
        self
    }

    /// Sets the settle margin (see [`settle`](Self::settle)).
    pub const fn with_settle(mut self, settle: Option<Duration>) -> Self {
        self.settle = settle;
        self
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

    /// Verify after `Ok` responses too (see [`verify_response`](Self::verify_response)).
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
    /// Share of the wait that jitter may remove, in `[0, 1]`; values outside
    /// are clamped, NaN counts as 0.
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
        let jitter = if self.jitter.is_nan() { 0.0 } else { self.jitter.clamp(0.0, 1.0) };
        base.mul_f64(1.0 - jitter * unit)
    }
}

/// How often the engine reads the verifier after an ambiguous failure.
///
/// A `Holds` ends the call at once. An `Absent` is believed only once the
/// last attempt has settled (see [`RetryPolicy::settle`]): when the reads run
/// out before that point, the engine waits for it and reads once more, if
/// the call's deadline allows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct VerifyBudget {
    /// Verifier reads at most, per verification round.
    pub reads: u32,
    /// Wait between two reads.
    pub interval: Duration,
}

impl VerifyBudget {
    /// Three reads, 250 ms apart.
    pub const DEFAULT: VerifyBudget =
        VerifyBudget { reads: 3, interval: Duration::from_millis(250) };

    /// A budget of `reads` reads (at least one) `interval` apart.
    pub const fn new(reads: u32, interval: Duration) -> Self {
        Self { reads, interval }
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
    fn nan_or_out_of_range_jitter_never_panics() {
        let key = IdempotencyKey::from_u128(3);
        for jitter in [f64::NAN, f64::INFINITY, f64::NEG_INFINITY, -1.0, 7.0] {
            let b = Backoff::DEFAULT.with_jitter(jitter, 1);
            let d = b.delay(1, key);
            assert!(d <= Backoff::DEFAULT.initial, "{jitter}: {d:?}");
        }
        assert_eq!(
            Backoff::DEFAULT.with_jitter(f64::NAN, 1).delay(1, key),
            Backoff::DEFAULT.initial
        );
    }

    #[test]
    fn class_defaults_follow_the_paper() {
        assert_eq!(RetryPolicy::for_class(SideEffect::High).retries, 1);
        assert_eq!(RetryPolicy::for_class(SideEffect::Irreversible).retries, 0);
    }

    #[test]
    fn the_classes_that_must_verify_verify_ok_answers_too() {
        for class in SideEffect::ALL {
            let must_verify = matches!(class, SideEffect::High | SideEffect::Irreversible);
            assert_eq!(RetryPolicy::for_class(class).verify_response, must_verify, "{class:?}");
        }
    }
}
