//! The tools of the two tasks (section 4.2), written as plain async fns over
//! the simulated server and wrapped by `#[verified_tool]`.
//!
//! Every write has a read-only verifier that checks the action's **full**
//! postcondition (section 4.3), never mere existence: a partial success that
//! answered OK must read as [`Verdict::Absent`]. Every write is `high`, so
//! it also verifies an OK answer before it reports success (the class
//! default, [`RetryPolicy::verify_response`](verified_tools::RetryPolicy::verify_response)):
//! the compound ones (`set_customer_status`, `update_invoice_row`,
//! `create_record`, and `update_record_fields`, the repair of a partial
//! `create_record`) may answer OK having applied only part of the write,
//! with data that looks complete (the simulator's partial OK). None sets
//! `verify_response` itself, so that the experiment's control
//! ([`Settings::believe_ok`](crate::experiment::Settings::believe_ok)) can
//! turn it off through the context's policies: an attribute would override
//! them.
//!
//! Every write forwards its idempotency key (unless the client was built
//! not to, as the paper's baseline) and its attempt's [`Deadline`] to the
//! server. A server that honours deadlines applies a request by its
//! deadline or never; its replica shows every applied write within the lag
//! bound. Verifiers read through that replica, so a verifier's `Absent` is
//! only worth believing once both have passed: [`settle_margin`] is the
//! margin that follows from what the simulator guarantees, and the
//! experiment sets it as the tools' [`RetryPolicy::settle`](verified_tools::RetryPolicy::settle)
//! (through the context's policies rather than the `settle = ".."`
//! attribute, so that one arm can run without a margin, the library's
//! default).

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use verified_tools::sim::{
    Customer, CustomerId, CustomerStatus, InvoiceId, InvoiceRow, Message, MessageKind, Record,
    RecordId, RecordStatus, RowId, SimConfig, SimError, SimServer,
};
use verified_tools::{Deadline, IdempotencyKey, Verdict, verified_tool};

/// The settle margin for tools of a server configured as `config`: how long
/// after an attempt's deadline (or after an OK answer) a verifier's `Absent`
/// can be believed. It is what the server guarantees
/// ([`SimConfig::settle_bound`]: with deadlines honoured, the replica's lag
/// bound, 5 s by default) plus the time one read takes (the engine looks at
/// the clock when a read has *answered*, and the read saw the state when it
/// started). `None` where the server gives no bound: then the engine never
/// believes an `Absent` after an ambiguous failure.
///
/// ```
/// use std::time::Duration;
/// use verified_tools::sim::{FaultLevel, SimConfig};
/// use verified_tools_suite::tools::settle_margin;
///
/// let cfg = SimConfig::new(42, FaultLevel::High.profile()).with_latency(Duration::from_millis(20));
/// assert_eq!(settle_margin(&cfg), Some(Duration::from_millis(5_020)));
/// assert_eq!(settle_margin(&cfg.with_honour_deadlines(false)), None);
/// ```
pub fn settle_margin(config: &SimConfig) -> Option<Duration> {
    config.settle_bound().map(|bound| bound + config.latency)
}

/// The agent's handle on the server. It is `skip`ped from every key: it is
/// the connection, not the action.
#[derive(Debug)]
pub struct SimClient {
    server: Arc<SimServer>,
    forward_keys: bool,
    calls: AtomicU32,
    verifier_reads: AtomicU32,
}

impl SimClient {
    /// A client of `server`; `forward_keys` says whether writes carry their
    /// idempotency key to the server (the paper's baseline sends none).
    pub fn new(server: Arc<SimServer>, forward_keys: bool) -> Self {
        Self { server, forward_keys, calls: AtomicU32::new(0), verifier_reads: AtomicU32::new(0) }
    }

    /// Tool dispatches so far (every attempt of every tool, reads included;
    /// verifier reads excluded).
    pub fn calls(&self) -> u32 {
        self.calls.load(Ordering::Relaxed)
    }

    /// Verifier reads so far.
    pub fn verifier_reads(&self) -> u32 {
        self.verifier_reads.load(Ordering::Relaxed)
    }

    /// Counts one dispatch and returns the key to send, if any.
    fn dispatch(&self, key: IdempotencyKey) -> Option<IdempotencyKey> {
        self.calls.fetch_add(1, Ordering::Relaxed);
        self.forward_keys.then_some(key)
    }

    /// Counts one verifier read and returns the server to read from.
    fn verifier(&self) -> &SimServer {
        self.verifier_reads.fetch_add(1, Ordering::Relaxed);
        &self.server
    }
}

/// Creates the customer (status PENDING).
#[verified_tool(
    side_effect = "high",
    effect = "additive",
    verify = customer_exists,
    skip(client),
    key(customer),
    schema = true,
    params(customer = "The customer's id.")
)]
pub async fn create_customer(
    client: &SimClient,
    customer: CustomerId,
    key: IdempotencyKey,
    deadline: Deadline,
) -> Result<Customer, SimError> {
    client.server.create_customer(customer, client.dispatch(key), Some(deadline)).await
}

/// Creation's postcondition: the customer exists (in any status: a later
/// activation does not undo the creation).
async fn customer_exists(
    client: &SimClient,
    customer: &CustomerId,
) -> Result<Verdict<Customer>, SimError> {
    Ok(client.verifier().get_customer(*customer).await?.into())
}

/// Activates the customer, if it is still at `expected_version`.
#[verified_tool(
    side_effect = "high",
    effect = "overwrite",
    verify = customer_active,
    skip(client),
    schema = true,
    params(customer = "The customer's id.", expected_version = "The customer's current `version`, as last read or returned: the write is refused if it changed.")
)]
pub async fn set_customer_status(
    client: &SimClient,
    customer: CustomerId,
    expected_version: u64,
    key: IdempotencyKey,
    deadline: Deadline,
) -> Result<Customer, SimError> {
    let status = CustomerStatus::Active;
    client
        .server
        .set_customer_status(
            customer,
            status,
            expected_version,
            client.dispatch(key),
            Some(deadline),
        )
        .await
}

/// status = ACTIVE ∧ activated_at ≠ null. A partial success (ACTIVE without
/// `activated_at`) is `Absent`.
async fn customer_active(
    client: &SimClient,
    customer: &CustomerId,
    _expected_version: &u64,
) -> Result<Verdict<Customer>, SimError> {
    let seen = client.verifier().get_customer(*customer).await?;
    let done = |c: &Customer| c.status == CustomerStatus::Active && c.activated_at.is_some();
    Ok(seen.filter(done).into())
}

/// Sends the customer's welcome message.
#[verified_tool(
    side_effect = "high",
    effect = "additive",
    verify = exactly_one_welcome,
    skip(client),
    key(customer),
    schema = true,
    params(customer = "The customer's id.")
)]
pub async fn send_welcome(
    client: &SimClient,
    customer: CustomerId,
    key: IdempotencyKey,
    deadline: Deadline,
) -> Result<Message, SimError> {
    client.server.send_welcome(customer, client.dispatch(key), Some(deadline)).await
}

/// Exactly one welcome message exists. None is `Absent`. More than one
/// violates the postcondition in a way no retry can repair, and a `Holds`
/// would be a lie: `Unknown`, so the call never reports success and the
/// agent never sends again.
async fn exactly_one_welcome(
    client: &SimClient,
    customer: &CustomerId,
) -> Result<Verdict<Message>, SimError> {
    let seen = client.verifier().messages(*customer).await?;
    let mut welcomes = seen.into_iter().filter(|m| m.kind == MessageKind::Welcome);
    Ok(match (welcomes.next(), welcomes.next()) {
        (None, _) => Verdict::Absent,
        (Some(m), None) => Verdict::Holds(m),
        (Some(_), Some(_)) => Verdict::Unknown,
    })
}

/// Writes the invoice id and amount into the row.
#[verified_tool(
    side_effect = "high",
    effect = "overwrite",
    verify = row_written,
    skip(client),
    schema = true,
    params(row = "The invoice row's id.", invoice_id = "The invoice number.", amount = "The amount in cents.")
)]
pub async fn update_invoice_row(
    client: &SimClient,
    row: RowId,
    invoice_id: InvoiceId,
    amount: u64,
    key: IdempotencyKey,
    deadline: Deadline,
) -> Result<InvoiceRow, SimError> {
    client
        .server
        .update_invoice_row(row, invoice_id, amount, client.dispatch(key), Some(deadline))
        .await
}

/// row.exists ∧ row.invoice_id = a.invoice_id ∧ row.amount = a.amount: a
/// row with the invoice id but without the amount is `Absent`.
async fn row_written(
    client: &SimClient,
    row: &RowId,
    invoice_id: &InvoiceId,
    amount: &u64,
) -> Result<Verdict<InvoiceRow>, SimError> {
    let seen = client.verifier().get_invoice_row(*row).await?;
    Ok(seen.filter(|r| r.invoice_id == Some(*invoice_id) && r.amount == Some(*amount)).into())
}

/// Creates the record (status DRAFT) with its required fields.
#[verified_tool(
    side_effect = "high",
    effect = "additive",
    verify = record_created,
    skip(client),
    key(record),
    schema = true,
    params(record = "The record's id.", invoice_id = "The invoice number.", amount = "The amount in cents.")
)]
pub async fn create_record(
    client: &SimClient,
    record: RecordId,
    invoice_id: InvoiceId,
    amount: u64,
    key: IdempotencyKey,
    deadline: Deadline,
) -> Result<Record, SimError> {
    client
        .server
        .create_record(record, invoice_id, amount, client.dispatch(key), Some(deadline))
        .await
}

/// The record exists with both required fields (in any status).
async fn record_created(
    client: &SimClient,
    record: &RecordId,
    invoice_id: &InvoiceId,
    amount: &u64,
) -> Result<Verdict<Record>, SimError> {
    let seen = client.verifier().get_record(*record).await?;
    Ok(seen.filter(|r| has_fields(r, *invoice_id, *amount)).into())
}

/// Fills in the record's required fields, if it is still at
/// `expected_version`: the repair of a record created without them (a
/// partial `create_record`), as a new logical call with its own key.
#[verified_tool(
    side_effect = "high",
    effect = "overwrite",
    verify = record_fields_filled,
    skip(client),
    schema = true,
    params(record = "The record's id.", invoice_id = "The invoice number.", amount = "The amount in cents.", expected_version = "The record's current `version`, as last read or returned: the write is refused if it changed.")
)]
pub async fn update_record_fields(
    client: &SimClient,
    record: RecordId,
    invoice_id: InvoiceId,
    amount: u64,
    expected_version: u64,
    key: IdempotencyKey,
    deadline: Deadline,
) -> Result<Record, SimError> {
    client
        .server
        .update_record_fields(
            record,
            invoice_id,
            amount,
            expected_version,
            client.dispatch(key),
            Some(deadline),
        )
        .await
}

/// record.invoice_id = a.invoice_id ∧ record.amount = a.amount (in any
/// status): a record with the invoice id but without the amount, the
/// update's partial success, is `Absent`.
async fn record_fields_filled(
    client: &SimClient,
    record: &RecordId,
    invoice_id: &InvoiceId,
    amount: &u64,
    _expected_version: &u64,
) -> Result<Verdict<Record>, SimError> {
    let seen = client.verifier().get_record(*record).await?;
    Ok(seen.filter(|r| has_fields(r, *invoice_id, *amount)).into())
}

/// Sets the record RECORDED, if it is still at `expected_version`.
#[verified_tool(
    side_effect = "high",
    effect = "overwrite",
    verify = record_recorded,
    skip(client),
    schema = true,
    params(
        record = "The record's id.",
        invoice_id = "The record's invoice number (checked, not written).",
        amount = "The record's amount in cents (checked, not written).",
        expected_version = "The record's current `version`, as last read or returned: the write is refused if it changed."
    )
)]
pub async fn set_record_status(
    client: &SimClient,
    record: RecordId,
    invoice_id: InvoiceId,
    amount: u64,
    expected_version: u64,
    key: IdempotencyKey,
    deadline: Deadline,
) -> Result<Record, SimError> {
    let _ = (invoice_id, amount); // in the signature for the verifier only
    let status = RecordStatus::Recorded;
    client
        .server
        .set_record_status(record, status, expected_version, client.dispatch(key), Some(deadline))
        .await
}

/// status = RECORDED with the invoice's id and amount. The fields are
/// arguments of the tool only so that this check is complete.
async fn record_recorded(
    client: &SimClient,
    record: &RecordId,
    invoice_id: &InvoiceId,
    amount: &u64,
    _expected_version: &u64,
) -> Result<Verdict<Record>, SimError> {
    let seen = client.verifier().get_record(*record).await?;
    let done =
        |r: &Record| r.status == RecordStatus::Recorded && has_fields(r, *invoice_id, *amount);
    Ok(seen.filter(done).into())
}

fn has_fields(r: &Record, invoice_id: InvoiceId, amount: u64) -> bool {
    r.invoice_id == Some(invoice_id) && r.amount == Some(amount)
}

/// Reads the customer (the agent's observation before re-planning a step).
#[verified_tool(
    side_effect = "none",
    skip(client),
    schema = true,
    params(customer = "The customer's id.")
)]
pub async fn read_customer(
    client: &SimClient,
    customer: CustomerId,
) -> Result<Option<Customer>, SimError> {
    client.calls.fetch_add(1, Ordering::Relaxed);
    client.server.get_customer(customer).await
}

/// Reads the record (the agent's observation before re-planning a step).
#[verified_tool(
    side_effect = "none",
    skip(client),
    schema = true,
    params(record = "The record's id.")
)]
pub async fn read_record(client: &SimClient, record: RecordId) -> Result<Option<Record>, SimError> {
    client.calls.fetch_add(1, Ordering::Relaxed);
    client.server.get_record(record).await
}
