//! The context every wrapped call receives.

use std::sync::Arc;
use std::time::Duration;

use crate::audit::AuditSink;
use crate::clock::{Clock, SystemClock};
use crate::escalation::Escalation;
use crate::ledger::{Ledger, MemoryLedger};
use crate::{IdempotencyKey, KeyScope, Mode, RetryPolicy, SideEffect, ToolSpec};

/// What a call does when the ledger's store cannot be reached.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum LedgerOutage {
    /// Refuse the call before anything is dispatched
    /// ([`CallError::Ledger`](crate::CallError::Ledger)). The default.
    #[default]
    Refuse,
    /// Let `none` and `low` tools proceed unrecorded (no replay, no
    /// in-flight check); `high` and `irreversible` tools are still refused.
    ProceedLowRisk,
}

/// What a call does when another call holds its key.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum InFlight {
    /// Poll the ledger every `poll` until the other call ends, for at most
    /// `max`; then refuse with [`CallError::InProgress`](crate::CallError::InProgress).
    Wait {
        /// Poll interval.
        poll: Duration,
        /// Longest wait.
        max: Duration,
    },
    /// Refuse at once with `CallError::InProgress`.
    Return,
}

/// The context of wrapped calls: who calls, how, and where records go.
///
/// Cheap to clone (reference counts only); pass `&Context` to every call.
///
/// One receiver convention: `with_*` methods configure, taking and returning
/// the context by value (chain them where it is built); `for_*` methods
/// derive a per-call copy from `&self` (the key scope of one run step, tool
/// call or explicit key), leaving the shared context in place.
///
/// ```
/// use std::sync::Arc;
/// use verified_tools::{Context, Mode, RetryPolicy, SideEffect};
/// use verified_tools::ledger::MemoryLedger;
///
/// let cx = Context::new("support-agent")
///     .with_ledger(Arc::new(MemoryLedger::new()))
///     .with_policy(SideEffect::High, RetryPolicy::for_class(SideEffect::High).with_retries(2));
/// let step = cx.for_step("conversation-17", 4);
/// assert_eq!(step.agent(), "support-agent");
/// assert_eq!(step.mode(), Mode::VerifyBeforeRetry);
/// ```
#[derive(Clone)]
pub struct Context {
    agent: Arc<str>,
    mode: Mode,
    policies: [RetryPolicy; 4],
    scope: Option<KeyScope>,
    in_flight: InFlight,
    ledger_outage: LedgerOutage,
    /// Calls made with this context only check ([`Context::for_check`]).
    check: bool,
    /// The recorded key a check is of, when deriving it again could give
    /// another ([`Context::checking`]).
    checked_key: Option<IdempotencyKey>,
    clock: Arc<dyn Clock>,
    pub(crate) ledger: Option<Arc<dyn Ledger>>,
    /// The in-memory ledger [`Context::new`] made, while it is the ledger:
    /// [`with_clock`](Context::with_clock) puts it on the new clock.
    own_memory: Option<Arc<MemoryLedger>>,
    pub(crate) audit: Option<Arc<dyn AuditSink>>,
    pub(crate) escalation: Option<Arc<dyn Escalation>>,
}

impl Context {
    /// A context for `agent`, with the default policies, the wall clock, an
    /// in-memory ledger (so a repeated or resumed call verifies before it
    /// dispatches, and explicit keys are checked) and no audit or escalation.
    pub fn new(agent: impl Into<Arc<str>>) -> Self {
        let memory = Arc::new(MemoryLedger::new());
        Self {
            agent: agent.into(),
            mode: Mode::default(),
            policies: SideEffect::ALL.map(RetryPolicy::for_class),
            scope: None,
            in_flight: InFlight::Wait {
                poll: Duration::from_millis(50),
                max: Duration::from_secs(30),
            },
            ledger_outage: LedgerOutage::Refuse,
            check: false,
            checked_key: None,
            clock: Arc::new(SystemClock),
            ledger: Some(memory.clone()),
            own_memory: Some(memory),
            audit: None,
            escalation: None,
        }
    }

    /// The agent id.
    pub fn agent(&self) -> &str {
        &self.agent
    }

    /// The mode of ambiguity handling.
    pub fn mode(&self) -> Mode {
        self.mode
    }

    /// The clock.
    pub fn clock(&self) -> &dyn Clock {
        &*self.clock
    }

    /// The default policy of a side-effect class.
    pub fn policy(&self, class: SideEffect) -> RetryPolicy {
        self.policies[class.index()]
    }

    pub(crate) fn policy_ref(&self, class: SideEffect) -> &RetryPolicy {
        &self.policies[class.index()]
    }

    /// The policy of one tool: its class's default, overridden by what the
    /// tool's attribute set.
    pub fn policy_for(&self, spec: &ToolSpec) -> RetryPolicy {
        let mut policy = self.policy(spec.side_effect);
        let o = Overrides::of(spec, &policy);
        policy.retries = o.retries;
        policy.attempt_timeout = o.attempt_timeout;
        policy.call_timeout = o.call_timeout;
        policy.settle = o.settle;
        policy.verify_response = o.verify_response;
        policy
    }

    /// What a call does when the ledger's store cannot be reached.
    pub fn ledger_outage(&self) -> LedgerOutage {
        self.ledger_outage
    }

    /// The key scope of one tool: the context's, else the tool's time bucket,
    /// else [`KeyScope::DEFAULT`].
    pub(crate) fn scope_for<'a>(
        &'a self,
        spec: &ToolSpec,
        bucket: &'a mut KeyScope,
    ) -> &'a KeyScope {
        match (&self.scope, spec.bucket) {
            (Some(scope), _) => scope,
            (None, Some(width)) => {
                *bucket = KeyScope::TimeBucket(width);
                bucket
            }
            (None, None) => &KeyScope::DEFAULT,
        }
    }

    /// The key scope set on the context, if any.
    pub(crate) fn scope(&self) -> Option<&KeyScope> {
        self.scope.as_ref()
    }

    /// What a call does when its key is in flight.
    pub fn in_flight(&self) -> InFlight {
        self.in_flight
    }

    /// Sets the mode (the paper's comparison arms).
    pub fn with_mode(mut self, mode: Mode) -> Self {
        self.mode = mode;
        self
    }

    /// Sets the default policy of one class.
    pub fn with_policy(mut self, class: SideEffect, policy: RetryPolicy) -> Self {
        self.policies[class.index()] = policy;
        self
    }

    /// Rewrites the default policy of every class.
    pub fn map_policies(mut self, f: impl Fn(SideEffect, RetryPolicy) -> RetryPolicy) -> Self {
        for class in SideEffect::ALL {
            self.policies[class.index()] = f(class, self.policies[class.index()]);
        }
        self
    }

    /// Sets the key scope of every call made with this context.
    pub fn with_scope(mut self, scope: KeyScope) -> Self {
        self.scope = Some(scope);
        self
    }

    /// A copy whose calls are keyed by a durable identity (run id + step)
    /// instead of time.
    pub fn for_step(&self, run: impl Into<String>, step: u64) -> Self {
        self.clone().with_scope(KeyScope::durable(run, step))
    }

    /// A copy whose calls all use this explicit key: make one per logical
    /// call. With a ledger, reusing it for another tool or other arguments is
    /// refused with [`CallError::KeyReuse`](crate::CallError::KeyReuse).
    pub fn for_key(&self, key: crate::IdempotencyKey) -> Self {
        self.clone().with_scope(KeyScope::Explicit(key))
    }

    /// A copy whose calls are keyed by the tool-call id an LLM provider gave
    /// (`call_…`, `toolu_…`): a re-issue of the same tool call is the same
    /// logical call, and a second call the model asked for is a new one.
    pub fn for_tool_call(&self, id: impl Into<String>) -> Self {
        self.clone().with_scope(KeyScope::ToolCall(id.into()))
    }

    /// A copy whose calls only *check* what became of the logical call they
    /// name, and dispatch nothing: a call completed is replayed, a call in
    /// doubt is verified (`Holds` closes it as a success, recorded in the
    /// ledger; a settled `Absent` closes it as `NotApplied`), and where a
    /// call would send an attempt, a check stops with what it knows. The way
    /// out of doubt for a model (`ToolSet::with_checks`) and a reconciler.
    ///
    /// ```
    /// use verified_tools::Context;
    ///
    /// let cx = Context::new("agent").for_tool_call("call_1");
    /// assert!(cx.for_check().is_check() && !cx.is_check());
    /// ```
    pub fn for_check(&self) -> Self {
        Self { check: true, ..self.clone() }
    }

    /// Whether calls made with this context only check.
    pub fn is_check(&self) -> bool {
        self.check
    }

    /// A check of the call recorded under `key`, made with the context that
    /// call was made with. A time-scoped call's key commits to the bucket
    /// its call was made in, so deriving it again later would name another
    /// call: such a check claims `key` itself.
    #[cfg(feature = "schema")]
    pub(crate) fn checking(&self, key: IdempotencyKey) -> Self {
        Self { check: true, checked_key: Some(key), ..self.clone() }
    }

    /// The recorded key a check is of ([`checking`](Self::checking)).
    pub(crate) fn checked_key(&self) -> Option<IdempotencyKey> {
        self.checked_key
    }

    /// Sets what a call does when its key is in flight.
    pub fn with_in_flight(mut self, in_flight: InFlight) -> Self {
        self.in_flight = in_flight;
        self
    }

    /// Sets what a call does when the ledger's store cannot be reached
    /// (refuse, by default).
    pub fn with_ledger_outage(mut self, outage: LedgerOutage) -> Self {
        self.ledger_outage = outage;
        self
    }

    /// Sets the clock: the wall clock of key buckets and audit timestamps,
    /// and the monotonic clock the engine measures its deadlines, backoff,
    /// settle points and waits on ([`Clock`]). A clock of another
    /// executor's timers runs calls without a tokio runtime.
    ///
    /// The in-memory ledger [`new`](Self::new) made moves to the clock too,
    /// while it records nothing and no other context shares it (as right
    /// after `new`); a ledger given with [`with_ledger`](Self::with_ledger),
    /// or one in use, keeps its own: give a [`MemoryLedger`] the same clock
    /// with [`MemoryLedger::with_clock`] when it is not tokio's.
    pub fn with_clock(mut self, clock: Arc<dyn Clock>) -> Self {
        if let Some(memory) = &self.own_memory
            // This context's two handles, and nothing recorded in it.
            && Arc::strong_count(memory) == 2
            && memory.is_empty()
            && memory.tombstones() == 0
        {
            let memory = Arc::new(MemoryLedger::new().with_clock(Arc::clone(&clock)));
            self.ledger = Some(memory.clone());
            self.own_memory = Some(memory);
        }
        self.clock = clock;
        self
    }

    /// Records calls in this ledger instead of the default in-memory one
    /// (share one ledger between contexts that must see each other's calls).
    pub fn with_ledger(mut self, ledger: Arc<dyn Ledger>) -> Self {
        self.ledger = Some(ledger);
        self.own_memory = None;
        self
    }

    /// Records nothing: no replay of completed calls, no in-flight or key
    /// reuse checks, no verify-first after a cancelled call. The success path
    /// then allocates nothing.
    pub fn without_ledger(mut self) -> Self {
        self.ledger = None;
        self.own_memory = None;
        self
    }

    /// Sends state transitions to an audit sink.
    pub fn with_audit(mut self, audit: Arc<dyn AuditSink>) -> Self {
        self.audit = Some(audit);
        self
    }

    /// Sends escalations to a handler.
    pub fn with_escalation(mut self, escalation: Arc<dyn Escalation>) -> Self {
        self.escalation = Some(escalation);
        self
    }
}

impl std::fmt::Debug for Context {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Context")
            .field("agent", &self.agent)
            .field("mode", &self.mode)
            .field("scope", &self.scope)
            .field("ledger", &self.ledger.is_some())
            .field("audit", &self.audit.is_some())
            .field("escalation", &self.escalation.is_some())
            .finish_non_exhaustive()
    }
}

/// The tool attribute's overrides of a class policy. One rule for
/// [`Context::policy_for`] and the engine (which keeps the class policy by
/// reference).
pub(crate) struct Overrides {
    pub(crate) retries: u32,
    pub(crate) attempt_timeout: Option<Duration>,
    pub(crate) call_timeout: Duration,
    pub(crate) settle: Option<Duration>,
    pub(crate) verify_response: bool,
}

impl Overrides {
    pub(crate) fn of(spec: &ToolSpec, base: &RetryPolicy) -> Self {
        Self {
            retries: spec.retries.unwrap_or(base.retries),
            attempt_timeout: spec.timeout.or(base.attempt_timeout),
            call_timeout: spec.call_timeout.unwrap_or(base.call_timeout),
            settle: spec.settle.or(base.settle),
            verify_response: spec.verify_response.unwrap_or(base.verify_response),
        }
    }
}
