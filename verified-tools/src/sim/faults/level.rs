//! The named fault levels (Table 1 of the paper) and their parse. Apart
//! from the profile because a level is only a name for a set of rates:
//! what a fault does, and how it is drawn, is the profile's.

use std::fmt;
use std::str::FromStr;

use super::FaultProfile;

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
