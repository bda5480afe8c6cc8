//! The two tasks of section 4.2 and their postconditions (section 4.3),
//! evaluated on the ground truth.

use std::fmt;
use std::str::FromStr;

use super::rng::Rng;
use super::truth::GroundTruth;
use super::world::{CustomerId, CustomerStatus, InvoiceId, RecordId, RecordStatus, RowId};

/// `activate_customer`: create the customer, set it ACTIVE, send exactly
/// one welcome message.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct ActivateCustomer {
    /// The customer to create and activate.
    pub customer: CustomerId,
}

impl ActivateCustomer {
    /// customer exists ∧ status = ACTIVE ∧ activated_at ≠ null ∧ exactly one
    /// welcome message.
    pub fn holds(&self, truth: &GroundTruth) -> bool {
        truth
            .customer(self.customer)
            .is_some_and(|c| c.status == CustomerStatus::Active && c.activated_at.is_some())
            && truth.welcome_messages(self.customer) == 1
    }
}

/// `record_invoice`: write the invoice row, create the record, set it
/// RECORDED.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct RecordInvoice {
    /// The row to write.
    pub row: RowId,
    /// The invoice to write into the row and the record.
    pub invoice_id: InvoiceId,
    /// The amount in cents.
    pub amount: u64,
    /// The record to create.
    pub record: RecordId,
}

impl RecordInvoice {
    /// row exists ∧ row.invoice_id = a.invoice_id ∧ row.amount = a.amount ∧
    /// record exists ∧ record.status = RECORDED ∧ its required fields equal
    /// the invoice id and amount.
    pub fn holds(&self, truth: &GroundTruth) -> bool {
        let fields = (Some(self.invoice_id), Some(self.amount));
        let row = truth.invoice_row(self.row).is_some_and(|r| (r.invoice_id, r.amount) == fields);
        let record = truth.record(self.record).is_some_and(|r| {
            r.status == RecordStatus::Recorded && (r.invoice_id, r.amount) == fields
        });
        row && record
    }
}

/// Which task an episode runs.
///
/// ```
/// use verified_tools::sim::{Task, TaskKind};
///
/// let kind: TaskKind = "record_invoice".parse().unwrap();
/// assert_eq!(kind.to_string(), "record_invoice");
/// let Task::RecordInvoice(t) = kind.instance(42) else { unreachable!() };
/// assert_eq!(kind.instance(42), Task::RecordInvoice(t));
/// assert!((100..=100_000).contains(&t.amount));
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum TaskKind {
    /// See [`ActivateCustomer`].
    ActivateCustomer,
    /// See [`RecordInvoice`].
    RecordInvoice,
}

impl TaskKind {
    /// Both tasks.
    pub const ALL: [TaskKind; 2] = [TaskKind::ActivateCustomer, TaskKind::RecordInvoice];

    /// The task's snake_case name, as in the paper.
    pub const fn name(self) -> &'static str {
        match self {
            TaskKind::ActivateCustomer => "activate_customer",
            TaskKind::RecordInvoice => "record_invoice",
        }
    }

    /// The task's arguments for an episode seed: ids and amount drawn from
    /// a stream of their own, so they do not touch the fault draws.
    pub fn instance(self, seed: u64) -> Task {
        let mut rng = Rng::stream(seed, &[u64::MAX, self as u64]);
        let id = 1 + rng.below(1_000_000);
        match self {
            TaskKind::ActivateCustomer => {
                Task::ActivateCustomer(ActivateCustomer { customer: CustomerId(id) })
            }
            TaskKind::RecordInvoice => Task::RecordInvoice(RecordInvoice {
                row: RowId(id),
                invoice_id: InvoiceId(10_000 + rng.below(90_000)),
                amount: 100 + rng.below(99_901),
                record: RecordId(id),
            }),
        }
    }
}

impl fmt::Display for TaskKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// Error of parsing a [`TaskKind`].
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown task {0:?}: expected activate_customer or record_invoice")]
pub struct ParseTaskError(String);

impl FromStr for TaskKind {
    type Err = ParseTaskError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        TaskKind::ALL
            .into_iter()
            .find(|t| t.name() == s.trim())
            .ok_or_else(|| ParseTaskError(s.to_owned()))
    }
}

/// One task with its arguments.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Task {
    /// An `activate_customer` task.
    ActivateCustomer(ActivateCustomer),
    /// A `record_invoice` task.
    RecordInvoice(RecordInvoice),
}

impl Task {
    /// Which task this is.
    pub const fn kind(&self) -> TaskKind {
        match self {
            Task::ActivateCustomer(_) => TaskKind::ActivateCustomer,
            Task::RecordInvoice(_) => TaskKind::RecordInvoice,
        }
    }

    /// Whether the task's postcondition holds in the ground truth.
    pub fn holds(&self, truth: &GroundTruth) -> bool {
        match self {
            Task::ActivateCustomer(t) => t.holds(truth),
            Task::RecordInvoice(t) => t.holds(truth),
        }
    }
}
