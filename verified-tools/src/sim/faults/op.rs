//! The write operations of the simulated API. Apart because they are more
//! than the fault model's key: the server, the ground truth and the
//! harness name them too.

use std::fmt;

/// A write operation of the simulated API; fault streams are keyed by it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Op {
    /// Create a customer.
    CreateCustomer = 0,
    /// Set a customer's status to ACTIVE with its `activated_at`
    /// (compound, versioned).
    SetCustomerStatus = 1,
    /// Send a welcome message to a customer.
    SendWelcome = 2,
    /// Write an invoice row's `invoice_id` and `amount` (compound).
    UpdateInvoiceRow = 3,
    /// Create a record with its required fields (compound).
    CreateRecord = 4,
    /// Set a record's status to RECORDED (versioned).
    SetRecordStatus = 5,
    /// Fill in a record's required fields `invoice_id` and `amount`
    /// (compound, versioned). Numbered after the others, so adding it left
    /// their fault streams unchanged.
    UpdateRecordFields = 6,
}

impl Op {
    /// All operations, in their numeric order.
    pub const ALL: [Op; 7] = [
        Op::CreateCustomer,
        Op::SetCustomerStatus,
        Op::SendWelcome,
        Op::UpdateInvoiceRow,
        Op::CreateRecord,
        Op::SetRecordStatus,
        Op::UpdateRecordFields,
    ];

    /// Whether the operation writes several effects at once and can
    /// therefore succeed partially.
    pub const fn is_compound(self) -> bool {
        matches!(
            self,
            Op::SetCustomerStatus
                | Op::UpdateInvoiceRow
                | Op::CreateRecord
                | Op::UpdateRecordFields
        )
    }

    /// Whether the operation carries an expected version and can therefore
    /// hit a stale conflict.
    pub const fn is_versioned(self) -> bool {
        matches!(self, Op::SetCustomerStatus | Op::SetRecordStatus | Op::UpdateRecordFields)
    }

    /// The operation's snake_case name.
    pub const fn name(self) -> &'static str {
        match self {
            Op::CreateCustomer => "create_customer",
            Op::SetCustomerStatus => "set_customer_status",
            Op::SendWelcome => "send_welcome",
            Op::UpdateInvoiceRow => "update_invoice_row",
            Op::CreateRecord => "create_record",
            Op::SetRecordStatus => "set_record_status",
            Op::UpdateRecordFields => "update_record_fields",
        }
    }
}

impl fmt::Display for Op {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}
