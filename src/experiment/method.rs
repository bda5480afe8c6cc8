//! The experiment's arms ([`Method`]) and fault models ([`FaultModel`]):
//! what the scripted planner's grid and the model planner share.

use std::fmt;
use std::str::FromStr;

use verified_tools::Mode;
use verified_tools::sim::{FaultLevel, FaultProfile};

/// How the agent handles ambiguous tool results, and against which server:
/// the paper's arms and our ablations.
///
/// The servers differ in two promises: deduplicating idempotency keys, and
/// honouring deadlines (dropping a request that reaches them after its
/// deadline, so that nothing lands after the settle point). Every agent
/// forwards each attempt's deadline; every agent that verifies uses the
/// settle margin the service documents for a deadline-honouring server
/// ([`settle_margin`](crate::tools::settle_margin)) — on a server that ignores deadlines that promise is
/// broken, which is what the `vbr_no_deadlines` and `vbr_neither` arms
/// measure — except `vbr_neither_unsettled`, which keeps the library's
/// default (no margin: an `Absent` after an ambiguous failure is never
/// believed).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Method {
    /// The paper's baseline: blind retry (budget 1), no verification, no
    /// idempotency key sent.
    RetryOnly,
    /// Verify after an ambiguous failure or an OK answer, never retry (and
    /// never re-plan: "reports failure without retrying").
    VerifyOnly,
    /// Verify before any retry, keys sent to a server that honours keys and
    /// deadlines.
    VerifyBeforeRetry,
    /// Ablation: blind retry with keys sent, no verification.
    KeysOnly,
    /// Verify-before-retry against a server that honours keys but ignores
    /// deadlines.
    VbrNoDeadlines,
    /// Verify-before-retry against a server that ignores keys but honours
    /// deadlines.
    VbrNoServerKeys,
    /// Verify-before-retry against a server that ignores keys and deadlines.
    VbrNeither,
    /// As [`VbrNeither`](Self::VbrNeither), with the library's default of no
    /// settle margin: the agent does not rely on a promise the server
    /// does not make.
    VbrNeitherUnsettled,
}

impl Method {
    /// Every method, baseline first.
    pub const ALL: [Method; 8] = [
        Method::RetryOnly,
        Method::VerifyOnly,
        Method::VerifyBeforeRetry,
        Method::KeysOnly,
        Method::VbrNoDeadlines,
        Method::VbrNoServerKeys,
        Method::VbrNeither,
        Method::VbrNeitherUnsettled,
    ];

    /// The method the others are compared against (Cohen's h).
    pub const BASELINE: Method = Method::RetryOnly;

    /// The snake_case name, as printed and parsed.
    pub const fn name(self) -> &'static str {
        match self {
            Method::RetryOnly => "retry_only",
            Method::VerifyOnly => "verify_only",
            Method::VerifyBeforeRetry => "verify_before_retry",
            Method::KeysOnly => "keys_only",
            Method::VbrNoDeadlines => "vbr_no_deadlines",
            Method::VbrNoServerKeys => "vbr_no_server_keys",
            Method::VbrNeither => "vbr_neither",
            Method::VbrNeitherUnsettled => "vbr_neither_unsettled",
        }
    }

    /// The method in plain words, as the summary table shows it.
    pub const fn label(self) -> &'static str {
        match self {
            Method::RetryOnly => "retry blindly (baseline)",
            Method::VerifyOnly => "verify, never retry",
            Method::VerifyBeforeRetry => "verify before retry",
            Method::KeysOnly => "retry blindly, with keys",
            Method::VbrNoDeadlines => "verify+retry, no deadlines",
            Method::VbrNoServerKeys => "verify+retry, no keys",
            Method::VbrNeither => "verify+retry, neither",
            Method::VbrNeitherUnsettled => "verify+retry, neither, no margin",
        }
    }

    /// The engine mode.
    pub const fn mode(self) -> Mode {
        match self {
            Method::RetryOnly | Method::KeysOnly => Mode::RetryOnly,
            Method::VerifyOnly => Mode::VerifyOnly,
            Method::VerifyBeforeRetry
            | Method::VbrNoDeadlines
            | Method::VbrNoServerKeys
            | Method::VbrNeither
            | Method::VbrNeitherUnsettled => Mode::VerifyBeforeRetry,
        }
    }

    /// Whether the agent sends its idempotency keys.
    pub const fn forwards_keys(self) -> bool {
        !matches!(self, Method::RetryOnly)
    }

    /// Whether the server deduplicates keys.
    pub const fn server_honours_keys(self) -> bool {
        !matches!(self, Method::VbrNoServerKeys | Method::VbrNeither | Method::VbrNeitherUnsettled)
    }

    /// Whether the server drops requests that reach it after their deadline.
    pub const fn server_honours_deadlines(self) -> bool {
        !matches!(self, Method::VbrNoDeadlines | Method::VbrNeither | Method::VbrNeitherUnsettled)
    }

    /// Whether the agent sets the settle margin a deadline-honouring server
    /// documents (all but `vbr_neither_unsettled`).
    pub const fn uses_settle_margin(self) -> bool {
        !matches!(self, Method::VbrNeitherUnsettled)
    }

    /// Re-plans per step allowed (verify-only never tries again).
    pub const fn replans(self, default: u32) -> u32 {
        if matches!(self, Method::VerifyOnly) { 0 } else { default }
    }
}

impl fmt::Display for Method {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for Method {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let names: Vec<_> = Method::ALL.iter().map(|m| m.name()).collect();
        Method::ALL
            .into_iter()
            .find(|m| m.name() == s.trim())
            .ok_or_else(|| format!("unknown method {s:?}: expected one of {}", names.join(", ")))
    }
}

/// Which faults the simulator draws: Table 1's, or Table 1's plus partial
/// OKs (compound writes applied in part that answer as if applied in full,
/// [`FaultLevel::partial_ok_profile`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum FaultModel {
    /// Table 1's four faults ([`FaultLevel::profile`]): a partial success
    /// answers OK with what it wrote.
    #[default]
    Table1,
    /// Table 1's four faults and, independently and at the level's partial
    /// rate, the partial OK ([`FaultLevel::partial_ok_profile`]). Every
    /// Table 1 fault of every seed is where it was.
    PartialOk,
}

impl FaultModel {
    /// Both models, the default first.
    pub const ALL: [FaultModel; 2] = [FaultModel::Table1, FaultModel::PartialOk];

    /// The name, as printed and parsed.
    pub const fn name(self) -> &'static str {
        match self {
            FaultModel::Table1 => "table1",
            FaultModel::PartialOk => "partial-ok",
        }
    }

    /// The profile of a level under this model.
    pub const fn profile(self, level: FaultLevel) -> FaultProfile {
        match self {
            FaultModel::Table1 => level.profile(),
            FaultModel::PartialOk => level.partial_ok_profile(),
        }
    }
}

impl fmt::Display for FaultModel {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for FaultModel {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        FaultModel::ALL
            .into_iter()
            .find(|m| m.name() == s.trim())
            .ok_or_else(|| format!("unknown fault model {s:?}: expected table1 or partial-ok"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn methods_parse_and_differ_only_where_intended() {
        for m in Method::ALL {
            assert_eq!(m.name().parse::<Method>(), Ok(m));
        }
        assert!("retry".parse::<Method>().is_err());
        // The baseline alone sends no key; the ablations alone talk to
        // servers that break a promise; verify-only alone never re-plans.
        let keyless: Vec<_> = Method::ALL.into_iter().filter(|m| !m.forwards_keys()).collect();
        assert_eq!(keyless, [Method::RetryOnly]);
        let servers: Vec<_> = Method::ALL
            .into_iter()
            .map(|m| (m.server_honours_keys(), m.server_honours_deadlines()))
            .collect();
        use Method as M;
        assert_eq!(servers[M::VerifyBeforeRetry as usize], (true, true));
        assert_eq!(servers[M::VbrNoDeadlines as usize], (true, false));
        assert_eq!(servers[M::VbrNoServerKeys as usize], (false, true));
        assert_eq!(servers[M::VbrNeither as usize], (false, false));
        assert_eq!(servers[M::VbrNeitherUnsettled as usize], (false, false));
        assert_eq!(servers.iter().filter(|s| **s == (true, true)).count(), 4);
        let unsettled: Vec<_> =
            Method::ALL.into_iter().filter(|m| !m.uses_settle_margin()).collect();
        assert_eq!(unsettled, [M::VbrNeitherUnsettled]);
        assert_eq!(Method::VerifyOnly.replans(2), 0);
        assert_eq!(Method::KeysOnly.mode(), Mode::RetryOnly);
    }
}
