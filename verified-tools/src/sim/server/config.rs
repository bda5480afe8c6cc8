//! What an episode's server is set up with: its seed, its faults, which
//! of a client's safeguards it honours. Apart because a harness reads and
//! builds it without touching the server.

use std::time::Duration;

#[cfg(doc)]
use crate::sim::error::SimError;
use crate::sim::faults::FaultProfile;

/// The paper's base seed; episode `i` runs with seed `BASE_SEED + i`.
pub const BASE_SEED: u64 = 42;

/// The seed of episode `episode` of a run seeded `base` (`base + episode`),
/// the same for every method.
///
/// ```
/// use verified_tools::sim::{episode_seed, BASE_SEED};
/// assert_eq!(episode_seed(BASE_SEED, 3), 45);
/// ```
pub const fn episode_seed(base: u64, episode: u64) -> u64 {
    base.wrapping_add(episode)
}

/// Whether a read that sees a lagging replica says so.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum StaleReads {
    /// The read returns the old state as if it were current (the paper's
    /// setting: naive verifiers then report false negatives).
    #[default]
    Silent,
    /// The read fails with [`SimError::StaleRead`] (a verifier turns that
    /// into `Unknown`).
    Flagged,
}

/// The configuration of one simulated episode.
///
/// ```
/// use std::time::Duration;
/// use verified_tools::sim::{FaultLevel, SimConfig, StaleReads};
///
/// let cfg = SimConfig::new(42, FaultLevel::Medium.profile())
///     .with_honour_keys(false)
///     .with_honour_deadlines(false)
///     .with_latency(Duration::from_millis(20))
///     .with_stale_reads(StaleReads::Flagged);
/// assert!(!cfg.honour_keys && !cfg.honour_deadlines);
/// // Ignoring deadlines, with late arrivals of unbounded delay, the server
/// // promises no settle bound.
/// assert_eq!(cfg.settle_bound(), None);
/// assert_eq!(cfg.with_honour_deadlines(true).settle_bound(), Some(Duration::from_secs(5)));
/// ```
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SimConfig {
    /// The episode's seed; see [`episode_seed`].
    pub seed: u64,
    /// The fault probabilities.
    pub profile: FaultProfile,
    /// Whether the server deduplicates idempotency keys (default `true`).
    pub honour_keys: bool,
    /// Whether the server drops a request it receives after the request's
    /// deadline (default `true`), like a gRPC server or PostgreSQL's
    /// `statement_timeout`. Off, a late arrival is applied however late.
    pub honour_deadlines: bool,
    /// What a stale read does (default [`StaleReads::Silent`]).
    pub stale_reads: StaleReads,
    /// Virtual time every answered call takes (default zero).
    pub latency: Duration,
}

impl SimConfig {
    /// A server seeded `seed` with these faults, honouring keys and
    /// deadlines, silent stale reads, no latency.
    pub const fn new(seed: u64, profile: FaultProfile) -> Self {
        Self {
            seed,
            profile,
            honour_keys: true,
            honour_deadlines: true,
            stale_reads: StaleReads::Silent,
            latency: Duration::ZERO,
        }
    }

    /// Switches idempotency-key support on or off.
    pub const fn with_honour_keys(mut self, honour: bool) -> Self {
        self.honour_keys = honour;
        self
    }

    /// Switches deadline support on or off.
    pub const fn with_honour_deadlines(mut self, honour: bool) -> Self {
        self.honour_deadlines = honour;
        self
    }

    /// Sets what a stale read does.
    pub const fn with_stale_reads(mut self, stale_reads: StaleReads) -> Self {
        self.stale_reads = stale_reads;
        self
    }

    /// Sets the virtual latency of every answered call.
    pub const fn with_latency(mut self, latency: Duration) -> Self {
        self.latency = latency;
        self
    }

    /// What this server guarantees a client that wants to believe a
    /// verifier's `Absent`: how long after a request's deadline (or after
    /// the answer to it) its effect may still be applied or still be hidden
    /// from reads. A read that *starts* that long after shows every effect
    /// the request will ever have; a client's settle margin
    /// ([`RetryPolicy::settle`](crate::RetryPolicy::settle)) is this plus the
    /// time one of its reads takes (the engine looks at the clock when the
    /// read has answered).
    ///
    /// - Honouring deadlines, every request carrying one is applied by its
    ///   deadline or never, and visible [`lag_bound`](FaultProfile::lag_bound)
    ///   after it was applied: the lag bound.
    /// - Ignoring deadlines (or for a request without one), a late arrival
    ///   lands up to the late delay's cap after it was sent: that cap plus
    ///   the lag bound, if the delay is capped.
    ///
    /// `None`: no bound (an uncapped late delay on a server that ignores
    /// deadlines, or an unbounded lag tail).
    pub fn settle_bound(&self) -> Option<Duration> {
        let lag = self.profile.lag_bound()?;
        if self.honour_deadlines {
            return Some(lag);
        }
        let late = if self.profile.timeout > 0.0 && self.profile.late_arrival > 0.0 {
            self.profile.late_delay.cap?
        } else {
            Duration::ZERO
        };
        Some(late + lag)
    }
}
