//! Side-effect classes: how dangerous a tool's effect is, and so how the
//! engine may retry it.

use std::fmt;
use std::str::FromStr;

/// How dangerous a tool's effect is. The class picks the default
/// [`RetryPolicy`](crate::RetryPolicy) and whether a verifier is required.
///
/// | class | examples | without a verifier | on an unresolved ambiguity |
/// |---|---|---|---|
/// | `None` | search, read, compute | retries freely | `Unknown` |
/// | `Low` | draft, temp file | retries with the key | `Unknown` |
/// | `High` | send mail, change a price | refused at compile time | `Unknown` |
/// | `Irreversible` | pay, refund, delete, deploy | refused at compile time | `Escalated` to a person |
///
/// ```
/// use verified_tools::SideEffect;
///
/// let class: SideEffect = "irreversible".parse()?;
/// assert_eq!(class, SideEffect::Irreversible);
/// assert!(class.requires_verifier());
/// assert_eq!(class.to_string(), "irreversible");
/// assert!("hihg".parse::<SideEffect>().is_err());
/// # Ok::<(), verified_tools::ParseSideEffectError>(())
/// ```
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, serde::Serialize, serde::Deserialize,
)]
#[serde(rename_all = "lowercase")]
pub enum SideEffect {
    /// Read-only: no effect on the world.
    None,
    /// An effect that is cheap to repeat or undo.
    Low,
    /// An effect that must happen once (a message, an order).
    High,
    /// An effect that cannot be undone (a payment, a deletion).
    Irreversible,
}

impl SideEffect {
    /// All classes, in increasing order of danger.
    pub const ALL: [SideEffect; 4] = [Self::None, Self::Low, Self::High, Self::Irreversible];

    /// The lowercase name used in `#[verified_tool(side_effect = "...")]`.
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::None => "none",
            Self::Low => "low",
            Self::High => "high",
            Self::Irreversible => "irreversible",
        }
    }

    /// Whether a tool of this class must declare a postcondition verifier.
    pub const fn requires_verifier(self) -> bool {
        matches!(self, Self::High | Self::Irreversible)
    }

    pub(crate) const fn index(self) -> usize {
        self as usize
    }
}

impl fmt::Display for SideEffect {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Error of parsing a [`SideEffect`]: names the valid classes.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "unknown side effect {got:?}: expected one of \"none\", \"low\", \"high\", \"irreversible\""
)]
pub struct ParseSideEffectError {
    got: String,
}

impl FromStr for SideEffect {
    type Err = ParseSideEffectError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Self::ALL
            .into_iter()
            .find(|class| class.as_str() == s)
            .ok_or_else(|| ParseSideEffectError { got: s.to_owned() })
    }
}
