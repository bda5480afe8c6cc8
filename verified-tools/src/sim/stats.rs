//! Proportions with their 95% Wilson score interval, and Cohen's h.

/// The two-sided 95% normal quantile.
pub const Z95: f64 = 1.959964;

/// A confidence interval for a proportion.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Interval {
    /// Lower bound.
    pub lo: f64,
    /// Upper bound.
    pub hi: f64,
}

/// The Wilson score interval for `k` successes out of `n` trials at normal
/// quantile `z` (Wilson, 1927). `[0, 1]` when `n == 0`.
///
/// ```text
/// centre = (p̂ + z²/2n) / (1 + z²/n)
/// half   = z / (1 + z²/n) · √( p̂(1−p̂)/n + z²/4n² )
/// ```
///
/// ```
/// use verified_tools::sim::stats::{wilson, Z95};
///
/// let ci = wilson(20, 25, Z95);
/// assert!((ci.lo - 0.6087).abs() < 1e-4 && (ci.hi - 0.9114).abs() < 1e-4);
/// ```
pub fn wilson(k: u64, n: u64, z: f64) -> Interval {
    if n == 0 {
        return Interval { lo: 0.0, hi: 1.0 };
    }
    let n = n as f64;
    let p = k as f64 / n;
    let z2 = z * z;
    let denom = 1.0 + z2 / n;
    let centre = (p + z2 / (2.0 * n)) / denom;
    let half = z / denom * (p * (1.0 - p) / n + z2 / (4.0 * n * n)).sqrt();
    Interval { lo: (centre - half).max(0.0), hi: (centre + half).min(1.0) }
}

/// The 95% Wilson score interval: [`wilson`] with [`Z95`].
pub fn wilson95(k: u64, n: u64) -> Interval {
    wilson(k, n, Z95)
}

/// Cohen's h, the effect size between two proportions:
/// `2·asin(√p1) − 2·asin(√p2)`. Positive when `p1 > p2`; 0.2, 0.5 and 0.8
/// are the conventional small, medium and large effects.
///
/// ```
/// use verified_tools::sim::stats::cohens_h;
/// assert!((cohens_h(0.72, 0.20) - 1.0991).abs() < 1e-4);
/// assert_eq!(cohens_h(0.5, 0.5), 0.0);
/// ```
pub fn cohens_h(p1: f64, p2: f64) -> f64 {
    let phi = |p: f64| 2.0 * p.clamp(0.0, 1.0).sqrt().asin();
    phi(p1) - phi(p2)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The interval in its other textbook form,
    /// `(k + z²/2 ± z·√(k(n−k)/n + z²/4)) / (n + z²)`, written out separately.
    fn wilson_counts_form(k: f64, n: f64, z: f64) -> (f64, f64) {
        let centre = k + z * z / 2.0;
        let spread = z * (k * (n - k) / n + z * z / 4.0).sqrt();
        ((centre - spread) / (n + z * z), (centre + spread) / (n + z * z))
    }

    fn close(a: f64, b: f64, tol: f64) -> bool {
        (a - b).abs() < tol
    }

    #[test]
    fn wilson_matches_hand_computed_values() {
        // 20/25: p = 0.8, z² = 3.841459, z²/n = 0.1536584,
        // centre = 0.8768292 / 1.1536584 = 0.7600440,
        // half = 1.959964 / 1.1536584 · √(0.0064 + 0.0015366) = 0.1513536.
        let ci = wilson95(20, 25);
        assert!(close(ci.lo, 0.608_690, 1e-6) && close(ci.hi, 0.911_394, 1e-6), "{ci:?}");
        // 0/25: lo = 0, hi = z²/(n + z²) = 3.841459 / 28.841459 = 0.133192.
        let ci = wilson95(0, 25);
        assert_eq!(ci.lo, 0.0);
        assert!(close(ci.hi, 0.133_192, 1e-6), "{ci:?}");
        // 25/25: lo = n/(n + z²) = 25 / 28.841459 = 0.866808, hi = 1.
        let ci = wilson95(25, 25);
        assert!(close(ci.lo, 0.866_808, 1e-6), "{ci:?}");
        assert_eq!(ci.hi, 1.0);
        // n = 0 says nothing.
        assert_eq!(wilson95(0, 0), Interval { lo: 0.0, hi: 1.0 });
    }

    #[test]
    fn wilson_agrees_with_its_counts_form() {
        for (k, n) in [(0, 1), (1, 2), (18, 25), (11, 25), (5, 25), (999, 1000), (3, 10_000)] {
            let ci = wilson95(k, n);
            let (lo, hi) = wilson_counts_form(k as f64, n as f64, Z95);
            assert!(
                close(ci.lo, lo.max(0.0), 1e-12) && close(ci.hi, hi.min(1.0), 1e-12),
                "{k}/{n}"
            );
            let p = k as f64 / n as f64;
            assert!(ci.lo <= p && p <= ci.hi);
        }
    }

    #[test]
    fn wilson_matches_a_published_value() {
        // Newcombe (1998), Table I, example (a): 81/263, Wilson score 0.2553–0.3662.
        let ci = wilson95(81, 263);
        assert!(close(ci.lo, 0.2553, 5e-5) && close(ci.hi, 0.3662, 5e-5), "{ci:?}");
    }

    #[test]
    fn cohens_h_matches_hand_computed_values() {
        // asin(√0.72) = asin(0.8485281) = 1.0131975; asin(√0.2) = asin(0.4472136) = 0.4636476;
        // h = 2 · (1.0131975 − 0.4636476) = 1.0990998.
        assert!(close(cohens_h(0.72, 0.20), 1.099_100, 1e-5));
        assert!(close(cohens_h(0.20, 0.72), -1.099_100, 1e-5));
        // 1 vs 0: 2·(π/2) − 0 = π.
        assert!(close(cohens_h(1.0, 0.0), std::f64::consts::PI, 1e-12));
        // 0.2 vs 0: 2·asin(√0.2) = 0.927295.
        assert!(close(cohens_h(0.2, 0.0), 0.927_295, 1e-6));
    }
}
