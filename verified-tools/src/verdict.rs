//! The tri-valued answer of a postcondition verifier.

use std::fmt;

/// What a read-only postcondition verifier observed in the real state.
///
/// `Holds` carries the observed value, so a call whose response was lost but
/// whose effect is confirmed still returns a typed value. `Verdict<()>` (the
/// default) is what audit events record.
///
/// ```
/// use verified_tools::Verdict;
///
/// let seen: Verdict<u32> = Verdict::Holds(7);
/// assert_eq!(seen.kind(), Verdict::Holds(()));
/// assert_eq!(Verdict::<u32>::from(None), Verdict::Absent);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
pub enum Verdict<T = ()> {
    /// The postcondition holds; here is what was observed.
    Holds(T),
    /// The postcondition does not hold in the state read: the effect did not
    /// happen (or not completely). The engine believes it only when read
    /// after the last attempt has settled (its deadline plus the settle
    /// margin): before then the request may still land, or a replica may
    /// still hide it. A believed `Absent` is retried under the same key,
    /// which a server that honours keys deduplicates; on one that does not,
    /// return `Absent` only when *nothing* of the effect is there, and
    /// `Unknown` for a partial state.
    Absent,
    /// The state is inconclusive (stale replica, read error, verifier fault).
    Unknown,
}

impl<T> Verdict<T> {
    /// The verdict without its value.
    pub fn kind(&self) -> Verdict {
        match self {
            Verdict::Holds(_) => Verdict::Holds(()),
            Verdict::Absent => Verdict::Absent,
            Verdict::Unknown => Verdict::Unknown,
        }
    }

    /// Maps the observed value.
    pub fn map<U>(self, f: impl FnOnce(T) -> U) -> Verdict<U> {
        match self {
            Verdict::Holds(v) => Verdict::Holds(f(v)),
            Verdict::Absent => Verdict::Absent,
            Verdict::Unknown => Verdict::Unknown,
        }
    }

    /// Whether the postcondition holds.
    pub fn holds(&self) -> bool {
        matches!(self, Verdict::Holds(_))
    }
}

impl<T> From<Option<T>> for Verdict<T> {
    /// `Some` is `Holds`, `None` is `Absent`: for a verifier that has read
    /// authoritative state.
    fn from(value: Option<T>) -> Self {
        value.map_or(Verdict::Absent, Verdict::Holds)
    }
}

impl fmt::Display for Verdict<()> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Verdict::Holds(()) => "holds",
            Verdict::Absent => "absent",
            Verdict::Unknown => "unknown",
        })
    }
}

/// What a verifier function may return: a [`Verdict`], or a `Result` whose
/// error counts as [`Verdict::Unknown`] (a failed read proves nothing).
///
/// ```
/// use verified_tools::{IntoVerdict, Verdict};
///
/// let failed_read: Result<Verdict<u8>, std::io::Error> = Err(std::io::ErrorKind::TimedOut.into());
/// assert_eq!(failed_read.into_verdict(), Verdict::Unknown);
/// ```
pub trait IntoVerdict<T> {
    /// Converts into a verdict.
    fn into_verdict(self) -> Verdict<T>;
}

impl<T> IntoVerdict<T> for Verdict<T> {
    fn into_verdict(self) -> Verdict<T> {
        self
    }
}

impl<T, E> IntoVerdict<T> for Result<Verdict<T>, E> {
    fn into_verdict(self) -> Verdict<T> {
        self.unwrap_or(Verdict::Unknown)
    }
}
