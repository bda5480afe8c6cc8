//! Ground truth: what really happened in an episode, for the harness only.
//!
//! The agent gets an `Arc<SimServer>`, whose reads go through the lagging
//! replica; the harness keeps the [`Oracle`](super::Oracle) returned next to
//! it, whose [`truth`](super::Oracle::truth) snapshots the primary.

use super::faults::Op;
use super::world::{
    Customer, CustomerId, InvoiceRow, Message, MessageKind, Record, RecordId, RowId,
};

/// One effect: an operation on one target (a customer, row or record id;
/// for a send, the recipient).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Effect {
    /// The operation.
    pub op: Op,
    /// The target's id.
    pub target: u64,
}

/// How many times an effect was applied on the server.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct EffectCount {
    /// Applications, partial ones included. Replays of a known idempotency
    /// key and rejected calls are not applications.
    pub applied: u32,
    /// Of those, the ones that applied only part of a compound write.
    pub partial: u32,
}

impl EffectCount {
    /// Applications that wrote every effect of the operation.
    pub const fn full(self) -> u32 {
        self.applied - self.partial
    }
}

impl Effect {
    /// Whether each application creates a new object (a customer, a
    /// message, a record) rather than overwriting state.
    pub const fn creates(self) -> bool {
        matches!(self.op, Op::CreateCustomer | Op::SendWelcome | Op::CreateRecord)
    }

    /// Whether these counts make the effect a duplicate: a creation applied
    /// more than once (two customers, two mails, two records, partial ones
    /// included), or an update applied in full more than once. Completing a
    /// partial update with a second write is not a duplicate, nor is filling
    /// in a partially created record with
    /// [`update_record_fields`](super::SimServer::update_record_fields) (one
    /// creation, one full update); applying that update in full twice is.
    pub const fn is_duplicate(self, count: EffectCount) -> bool {
        if self.creates() { count.applied > 1 } else { count.full() > 1 }
    }
}

/// The faults that took effect in an episode (drawn faults that did not
/// apply to the call, e.g. a partial success on a send, are not counted).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct FaultCounts {
    /// Calls that timed out before the server received them (only with
    /// [`TimeoutKind::BeforeOrAfter`](super::TimeoutKind::BeforeOrAfter)).
    pub timeouts_before_applying: u32,
    /// Calls that timed out after the server handled them at once (applied
    /// them, or replayed, rejected or dropped them).
    pub timeouts_after_applying: u32,
    /// Calls that timed out because their request reaches the server late
    /// (counted when sent; the request lands later, see
    /// [`Oracle::final_truth`](super::Oracle::final_truth)).
    pub late_arrivals: u32,
    /// Requests a server that honours deadlines dropped because they reached
    /// it after their deadline (late arrivals, mostly).
    pub dropped_past_deadline: u32,
    /// Writes applied with a visibility lag.
    pub delayed: u32,
    /// Compound writes applied partially (partial successes and partial
    /// OKs).
    pub partial: u32,
    /// Of those, the partial OKs: applied in part, answered as if applied
    /// in full (the answer may still have been lost to a timeout).
    pub partial_ok: u32,
    /// Versioned writes whose target a concurrent writer bumped first.
    pub conflicts: u32,
}

/// A snapshot of the primary: the true state and the effect counts.
#[derive(Debug, Clone, Default)]
pub struct GroundTruth {
    pub(super) customers: Vec<Customer>,
    pub(super) outbox: Vec<Message>,
    pub(super) rows: Vec<InvoiceRow>,
    pub(super) records: Vec<Record>,
    pub(super) effects: Vec<(Effect, EffectCount)>,
    pub(super) faults: FaultCounts,
    pub(super) calls: [u32; Op::ALL.len()],
}

impl GroundTruth {
    /// The customer's true state.
    pub fn customer(&self, id: CustomerId) -> Option<Customer> {
        self.customers.iter().find(|c| c.id == id).copied()
    }

    /// Welcome messages really sent to the customer.
    pub fn welcome_messages(&self, to: CustomerId) -> u32 {
        self.outbox.iter().filter(|m| m.to == to && m.kind == MessageKind::Welcome).count() as u32
    }

    /// The whole outbox.
    pub fn outbox(&self) -> &[Message] {
        &self.outbox
    }

    /// The row's true state.
    pub fn invoice_row(&self, row: RowId) -> Option<InvoiceRow> {
        self.rows.iter().find(|r| r.row == row).copied()
    }

    /// The record's true state.
    pub fn record(&self, id: RecordId) -> Option<Record> {
        self.records.iter().find(|r| r.id == id).copied()
    }

    /// How many times the effect was applied.
    pub fn applied(&self, op: Op, target: u64) -> EffectCount {
        let effect = Effect { op, target };
        self.effects.iter().find(|(e, _)| *e == effect).map(|(_, c)| *c).unwrap_or_default()
    }

    /// Every effect applied at least once, with its counts.
    pub fn effects(&self) -> &[(Effect, EffectCount)] {
        &self.effects
    }

    /// The effects applied more than once; see [`Effect::is_duplicate`].
    pub fn duplicates(&self) -> impl Iterator<Item = (Effect, EffectCount)> + '_ {
        self.effects.iter().copied().filter(|(e, c)| e.is_duplicate(*c))
    }

    /// Whether any effect was applied more than once.
    pub fn has_duplicates(&self) -> bool {
        self.duplicates().next().is_some()
    }

    /// The faults that took effect.
    pub fn faults(&self) -> FaultCounts {
        self.faults
    }

    /// Calls the server received for `op` (replays and rejections included).
    pub fn calls(&self, op: Op) -> u32 {
        self.calls[op as usize]
    }
}
