//! A ReAct-style agent: observe → the planner chooses the next tool call →
//! act through the wrapped tool → observe its [`ToolResult`].
//!
//! The [`Planner`] trait is where an LLM would sit; [`TaskPlanner`] is the
//! deterministic planner of the two tasks. Each tool call is one logical
//! call, keyed by (run id, step). The two ways a call can end without its
//! effect are handled differently, as the library asks:
//!
//! - `NotApplied` (and `Failed`): the effect is known absent — the verifier's
//!   `Absent` was read after the last attempt had settled, so nothing sent
//!   under the key can still land — and the key's budget is spent. Doing it
//!   after all is a *new* logical call: the planner re-plans the step (a new
//!   step, so a new key), which is also what repairs a partial write on a
//!   server that replays keys.
//! - `Unknown`: the effect is in doubt (an attempt may still land, or a
//!   replica may still hide it). A new call could duplicate it, so the
//!   planner never makes one. It [re-issues](Action::Reissue) the *same*
//!   logical call — same step, same key — after a pause: the engine then
//!   verifies before anything else, waits for the settle point the ledger
//!   kept, and either proves the effect (`Success`), settles its absence
//!   (`NotApplied`, and the planner may re-plan), or stays in doubt. At most
//!   `reissues` times per call; still in doubt, the agent stops and reports
//!   failure, leaving the key in the trace for a person or a later run. A
//!   call that ended `Unknown` because its retries ran out *without* a
//!   verifier read (the retry-only arm) is not re-issued: the engine would
//!   send nothing and learn nothing.
//! - `Escalated` and `Refused` end the episode.

use std::future::Future;
use std::time::Duration;

use verified_tools::sim::{
    ActivateCustomer, Customer, CustomerStatus, InvoiceRow, Message, Record, RecordInvoice,
    RecordStatus, SimError, Task,
};
use verified_tools::{Cause, Context, ToolResult, UnknownReason};

use crate::tools::{self, SimClient};

/// One tool call the planner can choose, with its arguments.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ToolCall {
    /// `create_customer`.
    CreateCustomer(ActivateCustomer),
    /// `set_customer_status` (ACTIVE) at this expected version.
    SetCustomerStatus(ActivateCustomer, u64),
    /// `send_welcome`.
    SendWelcome(ActivateCustomer),
    /// `read_customer`, an observation.
    ReadCustomer(ActivateCustomer),
    /// `update_invoice_row`.
    UpdateInvoiceRow(RecordInvoice),
    /// `create_record`.
    CreateRecord(RecordInvoice),
    /// `set_record_status` (RECORDED) at this expected version.
    SetRecordStatus(RecordInvoice, u64),
    /// `update_record_fields` at this expected version: fills in the
    /// fields of a record created without them.
    UpdateRecordFields(RecordInvoice, u64),
    /// `read_record`, an observation.
    ReadRecord(RecordInvoice),
}

/// What a successful call returned.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Value {
    /// A customer.
    Customer(Customer),
    /// A customer read (absent if not visible).
    MaybeCustomer(Option<Customer>),
    /// A sent message.
    Message(Message),
    /// An invoice row.
    Row(InvoiceRow),
    /// A record.
    Record(Record),
    /// A record read (absent if not visible).
    MaybeRecord(Option<Record>),
}

/// What the agent observed of one call: its [`ToolResult`], flattened.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// The effect is proven.
    Success(Value),
    /// The verifier confirmed the effect absent (or incomplete); `conflict`
    /// when the last attempt was rejected for a stale version.
    NotApplied {
        /// Whether a concurrent writer got in the way.
        conflict: bool,
    },
    /// A definitive error: nothing was applied.
    Failed(SimError),
    /// In doubt: never re-planned as a new call; re-issued as the same call
    /// (same key) at most, which verifies first.
    Unknown(UnknownReason),
    /// Handed to a person.
    Escalated,
    /// Refused before dispatch.
    Refused,
}

impl Outcome {
    fn of<T>(result: ToolResult<T, SimError>, value: impl FnOnce(T) -> Value) -> Self {
        match result {
            ToolResult::Success { value: v, .. } => Outcome::Success(value(v)),
            ToolResult::NotApplied { cause, .. } => Outcome::NotApplied {
                conflict: matches!(cause, Cause::Error(SimError::Conflict { .. })),
            },
            ToolResult::Failed { error, .. } => Outcome::Failed(error),
            ToolResult::Unknown { reason, .. } => Outcome::Unknown(reason),
            ToolResult::Escalated { .. } => Outcome::Escalated,
            ToolResult::Refused(_) => Outcome::Refused,
        }
    }

    /// Whether the step may be re-planned as a new logical call: the effect
    /// is known not to have happened (completely).
    pub fn may_replan(&self) -> bool {
        matches!(self, Outcome::NotApplied { .. } | Outcome::Failed(_))
    }

    /// Whether re-issuing the same logical call later can resolve the
    /// doubt: it is `Unknown`, and not because retries ran out with no
    /// verifier read (then the engine would neither send nor look).
    pub fn may_reissue(&self) -> bool {
        matches!(self, Outcome::Unknown(reason) if *reason != UnknownReason::RetriesExhausted)
    }
}

/// What the planner sees before choosing.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Observation {
    /// The episode begins.
    Start,
    /// The last call and its outcome.
    Result(ToolCall, Outcome),
}

/// The planner's choice.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Action {
    /// Make this call next: a new logical call, with a new key.
    Call(ToolCall),
    /// Re-issue the last call — the same logical call, with its key — after
    /// this pause: the answer to `Unknown`.
    Reissue {
        /// How long to wait first (virtual time in the simulator).
        after: Duration,
    },
    /// Stop and report whether the task succeeded.
    Finish {
        /// The agent's claim.
        success: bool,
    },
}

/// Chooses the next action from the last observation. An LLM-backed planner
/// implements this with a model call; hence the future.
pub trait Planner {
    /// The next action.
    fn next(&mut self, observation: &Observation) -> impl Future<Output = Action> + Send;
}

/// One step of the agent's trace.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Step {
    /// The call made.
    pub call: ToolCall,
    /// What came back.
    pub outcome: Outcome,
    /// The step whose key the call carried: its own for a new call, the
    /// re-issued call's for a re-issue.
    pub key_step: u64,
    /// Whether it re-issued the call before it.
    pub reissue: bool,
}

/// What the agent did and what it claims.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AgentReport {
    /// "I succeeded": every step of the task ended in a proven success.
    pub claimed_success: bool,
    /// Every call, in order.
    pub trace: Vec<Step>,
}

/// A runaway planner stops here.
const MAX_STEPS: u64 = 32;

/// Runs the loop until the planner finishes. Call `i` of the episode is
/// keyed by `(run, i)`; a re-issue is keyed as the call it re-issues.
pub async fn run<P: Planner>(
    cx: &Context,
    client: &SimClient,
    run: &str,
    planner: &mut P,
) -> AgentReport {
    let mut trace: Vec<Step> = Vec::new();
    let mut observation = Observation::Start;
    for step in 0..MAX_STEPS {
        let (call, key_step, reissue) = match planner.next(&observation).await {
            Action::Call(call) => (call, step, false),
            Action::Reissue { after } => match trace.last() {
                Some(last) => {
                    tokio::time::sleep(after).await;
                    (last.call, last.key_step, true)
                }
                // Nothing to re-issue: a planner bug; stop honestly.
                None => break,
            },
            Action::Finish { success } => return AgentReport { claimed_success: success, trace },
        };
        let outcome = act(&cx.for_step(run, key_step), client, call).await;
        trace.push(Step { call, outcome, key_step, reissue });
        observation = Observation::Result(call, outcome);
    }
    AgentReport { claimed_success: false, trace }
}

/// Executes one call through its wrapped tool.
pub async fn act(cx: &Context, client: &SimClient, call: ToolCall) -> Outcome {
    use ToolCall as C;
    match call {
        C::CreateCustomer(t) => {
            Outcome::of(tools::create_customer(cx, client, t.customer).await, Value::Customer)
        }
        C::SetCustomerStatus(t, v) => Outcome::of(
            tools::set_customer_status(cx, client, t.customer, v).await,
            Value::Customer,
        ),
        C::SendWelcome(t) => {
            Outcome::of(tools::send_welcome(cx, client, t.customer).await, Value::Message)
        }
        C::ReadCustomer(t) => {
            Outcome::of(tools::read_customer(cx, client, t.customer).await, Value::MaybeCustomer)
        }
        C::UpdateInvoiceRow(t) => Outcome::of(
            tools::update_invoice_row(cx, client, t.row, t.invoice_id, t.amount).await,
            Value::Row,
        ),
        C::CreateRecord(t) => Outcome::of(
            tools::create_record(cx, client, t.record, t.invoice_id, t.amount).await,
            Value::Record,
        ),
        C::SetRecordStatus(t, v) => Outcome::of(
            tools::set_record_status(cx, client, t.record, t.invoice_id, t.amount, v).await,
            Value::Record,
        ),
        C::UpdateRecordFields(t, v) => Outcome::of(
            tools::update_record_fields(cx, client, t.record, t.invoice_id, t.amount, v).await,
            Value::Record,
        ),
        C::ReadRecord(t) => {
            Outcome::of(tools::read_record(cx, client, t.record).await, Value::MaybeRecord)
        }
    }
}

/// The deterministic planner of both tasks: the steps in order; a step that
/// ended `NotApplied`/`Failed` is re-planned as a new call (after a fresh
/// read when it needs the current version) at most `replans` times; a call
/// that ended `Unknown` is re-issued as the same call, after `reissue_after`,
/// at most `reissues` times (see the [module docs](self)); anything still in
/// doubt ends the episode with an honest failure.
#[derive(Debug, Clone)]
pub struct TaskPlanner {
    task: Task,
    replans: u32,
    left: u32,
    reissues: u32,
    reissued: u32,
    reissue_after: Duration,
}

impl TaskPlanner {
    /// A planner for `task` that re-plans each step at most `replans` times
    /// and does not re-issue calls in doubt.
    pub fn new(task: Task, replans: u32) -> Self {
        Self {
            task,
            replans,
            left: replans,
            reissues: 0,
            reissued: 0,
            reissue_after: Duration::ZERO,
        }
    }

    /// Re-issues a call that ended `Unknown` at most `times` times, each
    /// after `after`.
    pub fn with_reissues(mut self, times: u32, after: Duration) -> Self {
        self.reissues = times;
        self.reissue_after = after;
        self
    }

    /// Spends one re-plan of the current step on `call`, or gives up.
    fn replan(&mut self, call: ToolCall) -> Action {
        if self.left == 0 {
            return Action::Finish { success: false };
        }
        self.left -= 1;
        Action::Call(call)
    }

    /// Moves on to the next step of the task.
    fn advance(&mut self, call: ToolCall) -> Action {
        self.left = self.replans;
        Action::Call(call)
    }

    /// Re-issues the call in doubt, or gives up.
    fn reissue(&mut self) -> Action {
        if self.reissued == self.reissues {
            return Action::Finish { success: false };
        }
        self.reissued += 1;
        Action::Reissue { after: self.reissue_after }
    }

    /// The next action; a new call starts a new re-issue count.
    fn choose(&mut self, observation: &Observation) -> Action {
        let action = self.decide(observation);
        if matches!(action, Action::Call(_)) {
            self.reissued = 0;
        }
        action
    }

    fn decide(&mut self, observation: &Observation) -> Action {
        use {Outcome as O, ToolCall as C, Value as V};
        const GIVE_UP: Action = Action::Finish { success: false };
        let (call, outcome) = match (*observation, self.task) {
            (Observation::Start, Task::ActivateCustomer(t)) => {
                return self.advance(C::CreateCustomer(t));
            }
            (Observation::Start, Task::RecordInvoice(t)) => {
                return self.advance(C::UpdateInvoiceRow(t));
            }
            (Observation::Result(call, outcome), _) => (call, outcome),
        };
        match (call, outcome) {
            // activate_customer: create → activate → welcome.
            (C::CreateCustomer(t), O::Success(V::Customer(c))) => {
                self.advance(C::SetCustomerStatus(t, c.version))
            }
            (C::SetCustomerStatus(t, _), O::Success(_)) => self.advance(C::SendWelcome(t)),
            (C::SendWelcome(_), O::Success(_)) => Action::Finish { success: true },
            // A stale version or a partial activation: read the current
            // version first. NotApplied means the verifier's Absent was read
            // after the settle point, which covers the replica's lag bound,
            // so the read is fresh.
            (C::SetCustomerStatus(t, _), o) if o.may_replan() => self.replan(C::ReadCustomer(t)),
            (C::ReadCustomer(t), O::Success(V::MaybeCustomer(Some(c)))) => {
                if c.status == CustomerStatus::Active && c.activated_at.is_some() {
                    self.advance(C::SendWelcome(t))
                } else {
                    Action::Call(C::SetCustomerStatus(t, c.version))
                }
            }
            (C::CreateCustomer(_) | C::SendWelcome(_), o) if o.may_replan() => self.replan(call),

            // record_invoice: row → record → RECORDED.
            (C::UpdateInvoiceRow(t), O::Success(_)) => self.advance(C::CreateRecord(t)),
            (C::CreateRecord(t), O::Success(V::Record(r))) => {
                self.advance(C::SetRecordStatus(t, r.version))
            }
            // A repaired record: its version is the one the verifier (or the
            // answer) saw with the fields filled in.
            (C::UpdateRecordFields(t, _), O::Success(V::Record(r))) => {
                self.advance(C::SetRecordStatus(t, r.version))
            }
            (C::SetRecordStatus(_, _), O::Success(_)) => Action::Finish { success: true },
            (C::UpdateInvoiceRow(t), o) if o.may_replan() => self.replan(C::UpdateInvoiceRow(t)),
            (C::CreateRecord(t) | C::SetRecordStatus(t, _) | C::UpdateRecordFields(t, _), o)
                if o.may_replan() =>
            {
                self.replan(C::ReadRecord(t))
            }
            (C::ReadRecord(t), O::Success(V::MaybeRecord(seen))) => match seen {
                // Nothing was created: creating it is safe.
                None => Action::Call(C::CreateRecord(t)),
                // A partial creation (or a partial repair): fill in the
                // fields as a new logical call. Creating it again would be a
                // second creation, a duplicate.
                Some(r) if r.invoice_id != Some(t.invoice_id) || r.amount != Some(t.amount) => {
                    Action::Call(C::UpdateRecordFields(t, r.version))
                }
                Some(r) if r.status == RecordStatus::Recorded => Action::Finish { success: true },
                Some(r) => Action::Call(C::SetRecordStatus(t, r.version)),
            },
            // In doubt: the same logical call again, later; never a new one.
            (_, o) if o.may_reissue() => self.reissue(),
            // Still in doubt, Escalated, Refused, or a read that saw nothing.
            _ => GIVE_UP,
        }
    }
}

impl Planner for TaskPlanner {
    fn next(&mut self, observation: &Observation) -> impl Future<Output = Action> + Send {
        std::future::ready(self.choose(observation))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use verified_tools::sim::{RecordId, TaskKind};

    fn invoice() -> RecordInvoice {
        let Task::RecordInvoice(t) = TaskKind::RecordInvoice.instance(42) else { unreachable!() };
        t
    }

    fn decide(p: &mut TaskPlanner, call: ToolCall, outcome: Outcome) -> Action {
        p.decide(&Observation::Result(call, outcome))
    }

    fn choose(p: &mut TaskPlanner, call: ToolCall, outcome: Outcome) -> Action {
        p.choose(&Observation::Result(call, outcome))
    }

    #[test]
    fn doubt_is_never_replanned_as_a_new_call() {
        let t = invoice();
        let mut p = TaskPlanner::new(Task::RecordInvoice(t), 2);
        assert_eq!(p.decide(&Observation::Start), Action::Call(ToolCall::UpdateInvoiceRow(t)));
        let unsettled = Outcome::Unknown(UnknownReason::Unsettled);
        for doubt in [unsettled, Outcome::Escalated, Outcome::Refused] {
            let next = decide(&mut p, ToolCall::UpdateInvoiceRow(t), doubt);
            assert_eq!(next, Action::Finish { success: false }, "{doubt:?}");
        }
    }

    #[test]
    fn unknown_is_reissued_as_the_same_call_within_its_budget() {
        let t = invoice();
        let after = Duration::from_secs(30);
        let mut p = TaskPlanner::new(Task::RecordInvoice(t), 2).with_reissues(1, after);
        let row = ToolCall::UpdateInvoiceRow(t);
        let unsettled = Outcome::Unknown(UnknownReason::Unsettled);
        assert_eq!(choose(&mut p, row, unsettled), Action::Reissue { after });
        // Still in doubt after the re-issue: stop, never a new call.
        assert_eq!(choose(&mut p, row, unsettled), Action::Finish { success: false });

        // A re-issue that settles the absence may be re-planned as a new call,
        // and the next call in doubt gets its own re-issue.
        let mut p = TaskPlanner::new(Task::RecordInvoice(t), 2).with_reissues(1, after);
        let inconclusive = Outcome::Unknown(UnknownReason::VerifierInconclusive);
        assert_eq!(choose(&mut p, row, inconclusive), Action::Reissue { after });
        let missing = Outcome::NotApplied { conflict: false };
        assert_eq!(choose(&mut p, row, missing), Action::Call(row));
        assert_eq!(choose(&mut p, row, inconclusive), Action::Reissue { after });
        // Proven on re-issue: the task goes on.
        let done = Outcome::Success(Value::Row(InvoiceRow {
            row: t.row,
            invoice_id: Some(t.invoice_id),
            amount: Some(t.amount),
            version: 1,
        }));
        assert_eq!(choose(&mut p, row, done), Action::Call(ToolCall::CreateRecord(t)));

        // Retries that ran out with no verifier read: nothing to learn later.
        let mut p = TaskPlanner::new(Task::RecordInvoice(t), 2).with_reissues(1, after);
        let blind = Outcome::Unknown(UnknownReason::RetriesExhausted);
        assert!(!blind.may_reissue());
        assert_eq!(choose(&mut p, row, blind), Action::Finish { success: false });
    }

    #[test]
    fn not_applied_is_replanned_within_the_budget() {
        let t = invoice();
        let mut p = TaskPlanner::new(Task::RecordInvoice(t), 2);
        let call = ToolCall::UpdateInvoiceRow(t);
        let missing = Outcome::NotApplied { conflict: false };
        assert_eq!(decide(&mut p, call, missing), Action::Call(call));
        assert_eq!(decide(&mut p, call, Outcome::Failed(SimError::NotFound)), Action::Call(call));
        assert_eq!(decide(&mut p, call, missing), Action::Finish { success: false });
    }

    #[test]
    fn a_partial_record_is_repaired_not_created_twice() {
        let t = invoice();
        let mut p = TaskPlanner::new(Task::RecordInvoice(t), 2);
        let create = ToolCall::CreateRecord(t);
        let read = ToolCall::ReadRecord(t);
        let missing = Outcome::NotApplied { conflict: false };
        assert_eq!(decide(&mut p, create, missing), Action::Call(read));
        // Nothing there: creating is safe.
        let nothing = Outcome::Success(Value::MaybeRecord(None));
        assert_eq!(decide(&mut p, read, nothing), Action::Call(create));
        // A record without its fields: a second creation would duplicate
        // it; its fields are filled in at the version read instead.
        let partial = Record {
            id: RecordId(t.record.0),
            status: RecordStatus::Draft,
            invoice_id: None,
            amount: None,
            version: 1,
        };
        let seen = Outcome::Success(Value::MaybeRecord(Some(partial)));
        let repair = ToolCall::UpdateRecordFields(t, 1);
        assert_eq!(decide(&mut p, read, seen), Action::Call(repair));
        // A repair that is itself partial is re-planned (read, repair) within
        // the step's budget; the create spent one re-plan, this the second.
        assert_eq!(decide(&mut p, repair, missing), Action::Call(read));
        let half = Record { invoice_id: Some(t.invoice_id), version: 2, ..partial };
        let seen = Outcome::Success(Value::MaybeRecord(Some(half)));
        let repair = ToolCall::UpdateRecordFields(t, 2);
        assert_eq!(decide(&mut p, read, seen), Action::Call(repair));
        let done = Record { amount: Some(t.amount), version: 3, ..half };
        let next = decide(&mut p, repair, Outcome::Success(Value::Record(done)));
        assert_eq!(next, Action::Call(ToolCall::SetRecordStatus(t, 3)));
        // The budget is spent: a third failed repair gives up.
        let mut p = TaskPlanner::new(Task::RecordInvoice(t), 1);
        assert_eq!(decide(&mut p, create, missing), Action::Call(read));
        let seen = Outcome::Success(Value::MaybeRecord(Some(partial)));
        assert_eq!(decide(&mut p, read, seen), Action::Call(ToolCall::UpdateRecordFields(t, 1)));
        let failed = decide(&mut p, ToolCall::UpdateRecordFields(t, 1), missing);
        assert_eq!(failed, Action::Finish { success: false });
    }
}
