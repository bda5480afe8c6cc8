//! A ReAct-style agent: observe → the planner chooses the next tool call →
//! act through the wrapped tool → observe its [`ToolResult`].
//!
//! The [`Planner`] trait is where an LLM would sit; [`TaskPlanner`] is the
//! deterministic planner of the two tasks. Each tool call is one logical
//! call, keyed by (run id, step): re-planning a step after `NotApplied` or
//! `Failed` is a *new* call with a new key, which is what repairs a partial
//! write on a server that replays keys. `Unknown` and `Escalated` are never
//! re-issued: the effect may have happened.

use std::future::Future;

use verified_tools::sim::{
    ActivateCustomer, Customer, CustomerStatus, InvoiceRow, Message, Record, RecordInvoice,
    RecordStatus, SimError, Task,
};
use verified_tools::{Cause, Context, ToolResult};

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
    /// In doubt: must not be re-issued blindly.
    Unknown,
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
            ToolResult::Unknown { .. } => Outcome::Unknown,
            ToolResult::Escalated { .. } => Outcome::Escalated,
            ToolResult::Refused(_) => Outcome::Refused,
        }
    }

    /// Whether the step may be re-planned as a new logical call: the effect
    /// is known not to have happened (completely).
    pub fn may_replan(&self) -> bool {
        matches!(self, Outcome::NotApplied { .. } | Outcome::Failed(_))
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
    /// Make this call next.
    Call(ToolCall),
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
/// keyed by `(run, i)`.
pub async fn run<P: Planner>(
    cx: &Context,
    client: &SimClient,
    run: &str,
    planner: &mut P,
) -> AgentReport {
    let mut trace = Vec::new();
    let mut observation = Observation::Start;
    for step in 0..MAX_STEPS {
        let call = match planner.next(&observation).await {
            Action::Call(call) => call,
            Action::Finish { success } => return AgentReport { claimed_success: success, trace },
        };
        let outcome = act(&cx.for_step(run, step), client, call).await;
        trace.push(Step { call, outcome });
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
/// ended `NotApplied`/`Failed` is re-planned (after a fresh read when it
/// needs the current version) at most `replans` times; anything in doubt
/// ends the episode with an honest failure.
#[derive(Debug, Clone)]
pub struct TaskPlanner {
    task: Task,
    replans: u32,
    left: u32,
}

impl TaskPlanner {
    /// A planner for `task` that re-plans each step at most `replans` times.
    pub fn new(task: Task, replans: u32) -> Self {
        Self { task, replans, left: replans }
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
            // version first. After a verifier's Absent the replica has caught
            // up (the verify budget outlasts its lag), so the read is fresh.
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
            // Unknown, Escalated, Refused, or a read that saw nothing.
            _ => GIVE_UP,
        }
    }
}

impl Planner for TaskPlanner {
    fn next(&mut self, observation: &Observation) -> impl Future<Output = Action> + Send {
        std::future::ready(self.decide(observation))
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

    #[test]
    fn doubt_is_never_reissued() {
        let t = invoice();
        let mut p = TaskPlanner::new(Task::RecordInvoice(t), 2);
        assert_eq!(p.decide(&Observation::Start), Action::Call(ToolCall::UpdateInvoiceRow(t)));
        for doubt in [Outcome::Unknown, Outcome::Escalated, Outcome::Refused] {
            let next = decide(&mut p, ToolCall::UpdateInvoiceRow(t), doubt);
            assert_eq!(next, Action::Finish { success: false });
        }
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
