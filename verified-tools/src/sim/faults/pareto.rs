//! The heavy-tailed distribution of late arrivals' delays and of the lag's
//! tail. Apart because it is plain arithmetic over a uniform draw, with no
//! notion of a fault.

use std::time::Duration;

#[cfg(doc)]
use crate::sim::rng::Rng;

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
