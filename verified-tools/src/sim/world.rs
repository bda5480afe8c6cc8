//! The simulated world's entities, and how a delayed write hides behind the
//! state it replaced.
//!
//! # Delayed visibility
//!
//! Writes go to a primary and are always applied there at once: later
//! writes, version checks and the [ground truth](super::GroundTruth) see
//! them. A write drawn with a [`Lag`] is invisible to *reads* of its entity
//! (the verifiers' and the agent's) for `lag.reads` reads **and** until
//! `lag.time` of virtual time has passed since the write, whichever ends
//! later — but never longer than `lag.bound` after the write, when the lag
//! has a bound ([`FaultProfile::lag_bound`](super::FaultProfile::lag_bound):
//! 5 s by default, whatever the reads). The lag times have a bulk and a
//! heavy tail (see [`faults`](super::faults)). A late arrival's lag counts
//! from when it was applied, not from when it was sent.
//! Until then a read returns the entity as it was before the write:
//! absent for a creation, the old status and version for an update, one
//! message fewer for a send. By default this is silent, as on a real
//! eventually consistent replica, so a naive verifier reports `Absent`
//! (a false negative); with [`StaleReads::Flagged`](super::StaleReads) the
//! read fails with [`SimError::StaleRead`](super::SimError) instead.
//! A write without lag makes the earlier writes of its entity visible too
//! (replicas apply writes in order); each message of the outbox lags on its
//! own. Every read of an entity (or of a customer's messages) counts as one
//! read against each of its hidden writes.

use tokio::time::Instant;

use super::faults::Lag;
use crate::IdempotencyKey;
use crate::deadline::later;

macro_rules! id_type {
    ($(#[$doc:meta])* $name:ident) => {
        $(#[$doc])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
        #[derive(serde::Serialize, serde::Deserialize)]
        #[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
        pub struct $name(pub u64);
    };
}

id_type!(
    /// A customer's id, chosen by the caller (the task's natural key).
    CustomerId
);
id_type!(
    /// An invoice row's id in the invoice table.
    RowId
);
id_type!(
    /// A record's id, chosen by the caller.
    RecordId
);
id_type!(
    /// An invoice number, as written into rows and records.
    InvoiceId
);
id_type!(
    /// A message's position in the outbox.
    MessageId
);

/// A customer's status.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum CustomerStatus {
    /// Created, not yet activated.
    Pending,
    /// Activated.
    Active,
}

/// A customer as stored.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct Customer {
    /// Its id.
    pub id: CustomerId,
    /// Its status.
    pub status: CustomerStatus,
    /// When it was activated, in virtual ms since the server started.
    pub activated_at: Option<u64>,
    /// Bumped by every write; versioned writes must name the current one.
    pub version: u64,
}

/// The kind of an outbox message.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum MessageKind {
    /// The welcome message of `activate_customer`.
    Welcome,
}

/// A message in the outbox. Every accepted send adds one: sending twice
/// mails the customer twice.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct Message {
    /// Its position in the outbox.
    pub id: MessageId,
    /// Its recipient.
    pub to: CustomerId,
    /// Its kind.
    pub kind: MessageKind,
    /// The idempotency key the send carried, if any.
    pub key: Option<IdempotencyKey>,
}

/// A row of the invoice table.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct InvoiceRow {
    /// Its id.
    pub row: RowId,
    /// The invoice written into it.
    pub invoice_id: Option<InvoiceId>,
    /// The amount in cents written into it.
    pub amount: Option<u64>,
    /// Bumped by every write.
    pub version: u64,
}

/// A record's status.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum RecordStatus {
    /// Created, not yet recorded.
    Draft,
    /// Recorded.
    Recorded,
}

/// A record (a book-keeping entry for an invoice).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct Record {
    /// Its id.
    pub id: RecordId,
    /// Its status.
    pub status: RecordStatus,
    /// Required field: the invoice it records.
    pub invoice_id: Option<InvoiceId>,
    /// Required field: the amount in cents.
    pub amount: Option<u64>,
    /// Bumped by every write; versioned writes must name the current one.
    pub version: u64,
}

/// What the server needs to know of a stored entity.
pub(super) trait Entity: Copy {
    type Id: PartialEq + Copy;
    fn id(&self) -> Self::Id;
    fn version(&self) -> u64;
    fn with_version(self, version: u64) -> Self;
}

macro_rules! entity {
    ($t:ty, $id:ty, $field:ident) => {
        impl Entity for $t {
            type Id = $id;
            fn id(&self) -> $id {
                self.$field
            }
            fn version(&self) -> u64 {
                self.version
            }
            fn with_version(self, version: u64) -> Self {
                Self { version, ..self }
            }
        }
    };
}
entity!(Customer, CustomerId, id);
entity!(InvoiceRow, RowId, row);
entity!(Record, RecordId, id);

/// The slot of entity `id`.
pub(super) fn find<T: Entity>(slots: &mut [Slot<T>], id: T::Id) -> Option<&mut Slot<T>> {
    slots.iter_mut().find(|s| s.current.id() == id)
}

/// Stores `value` at version 1, or, if its id exists, replaces it with the
/// next version (a duplicate creation: latest wins). Returns what was stored.
pub(super) fn create<T: Entity>(
    slots: &mut Vec<Slot<T>>,
    value: T,
    lag: Option<Lag>,
    now: Instant,
) -> T {
    match find(slots, value.id()) {
        Some(s) => {
            let v = value.with_version(s.current.version() + 1);
            s.write(v, lag, now);
            v
        }
        None => {
            let v = value.with_version(1);
            slots.push(Slot::created(v, lag, now));
            v
        }
    }
}

/// A read of entity `id` through the replica: the value seen, and whether
/// it was stale.
pub(super) fn read<T: Entity>(slots: &mut [Slot<T>], id: T::Id, now: Instant) -> (Option<T>, bool) {
    match find(slots, id) {
        Some(s) => {
            let seen = s.read(now);
            (seen.value, seen.stale)
        }
        None => (None, false),
    }
}

/// Until when a write is hidden from reads.
#[derive(Debug, Clone, Copy)]
pub(super) struct Hidden {
    reads_left: u32,
    until: Instant,
    /// Visible from here whatever the reads; `None`: no bound.
    cap: Option<Instant>,
}

impl Hidden {
    pub(super) fn new(lag: Lag, now: Instant) -> Self {
        Self {
            reads_left: lag.reads,
            until: later(now, lag.time),
            cap: lag.bound.map(|b| later(now, b)),
        }
    }

    fn merge(self, other: Hidden) -> Hidden {
        Hidden {
            reads_left: self.reads_left.max(other.reads_left),
            until: self.until.max(other.until),
            cap: self.cap.zip(other.cap).map(|(a, b)| a.max(b)),
        }
    }

    /// Counts one read; whether that read still sees the old state.
    pub(super) fn read(&mut self, now: Instant) -> bool {
        let bounded = self.cap.is_some_and(|cap| now >= cap);
        if bounded || (self.reads_left == 0 && now >= self.until) {
            return false;
        }
        self.reads_left = self.reads_left.saturating_sub(1);
        true
    }
}

/// One entity: its true state and, while a delayed write is hidden, the
/// state reads still see.
#[derive(Debug, Clone, Copy)]
pub(super) struct Slot<T> {
    pub(super) current: T,
    hidden: Option<(Option<T>, Hidden)>,
}

/// What a read saw.
pub(super) struct Seen<T> {
    pub(super) value: Option<T>,
    pub(super) stale: bool,
}

impl<T: Copy> Slot<T> {
    /// A slot created by a write with this lag.
    pub(super) fn created(value: T, lag: Option<Lag>, now: Instant) -> Self {
        Self { current: value, hidden: lag.map(|l| (None, Hidden::new(l, now))) }
    }

    /// Writes `value`; with a lag, reads keep seeing the oldest state not
    /// yet visible.
    pub(super) fn write(&mut self, value: T, lag: Option<Lag>, now: Instant) {
        let before = self.current;
        self.current = value;
        self.hidden = lag.map(|l| {
            let h = Hidden::new(l, now);
            match self.hidden {
                Some((prev, old)) => (prev, old.merge(h)),
                None => (Some(before), h),
            }
        });
    }

    /// A read through the replica.
    pub(super) fn read(&mut self, now: Instant) -> Seen<T> {
        if let Some((prev, hidden)) = &mut self.hidden {
            if hidden.read(now) {
                return Seen { value: *prev, stale: true };
            }
            self.hidden = None;
        }
        Seen { value: Some(self.current), stale: false }
    }
}

/// A message and, while its send is hidden, until when.
#[derive(Debug, Clone, Copy)]
pub(super) struct Sent {
    pub(super) message: Message,
    pub(super) hidden: Option<Hidden>,
}

/// Calls `f` on every message to `to` visible through the replica; whether
/// a hidden one was skipped.
pub(super) fn visible_messages(
    outbox: &mut [Sent],
    to: CustomerId,
    now: Instant,
    mut f: impl FnMut(&Message),
) -> bool {
    let mut stale = false;
    for sent in outbox.iter_mut().filter(|s| s.message.to == to) {
        if let Some(h) = &mut sent.hidden {
            if h.read(now) {
                stale = true;
                continue;
            }
            sent.hidden = None;
        }
        f(&sent.message);
    }
    stale
}

/// Virtual milliseconds between two instants.
pub(super) fn millis_since(start: Instant, now: Instant) -> u64 {
    now.saturating_duration_since(start).as_millis().min(u128::from(u64::MAX)) as u64
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn lag(reads: u32, ms: u64) -> Option<Lag> {
        Some(Lag { reads, time: Duration::from_millis(ms), bound: None })
    }

    #[test]
    fn the_bound_ends_a_lag_whatever_the_reads() {
        let now = Instant::now();
        let bounded = Some(Lag {
            reads: 50,
            time: Duration::from_millis(100),
            bound: Some(Duration::from_millis(500)),
        });
        let mut s = Slot::created(7u32, bounded, now);
        assert_eq!(s.read(now + Duration::from_millis(499)).value, None);
        assert_eq!(s.read(now + Duration::from_millis(500)).value, Some(7));
        // Without a bound the 48 reads left still hide it, however late.
        let mut s = Slot::created(7u32, lag(50, 100), now);
        assert_eq!(s.read(now + Duration::from_secs(3600)).value, None);
        // Stacked writes: the later bound holds.
        let mut s = Slot::created(1u32, None, now);
        s.write(2, bounded, now);
        let second = bounded.map(|l| Lag { bound: Some(Duration::from_millis(900)), ..l });
        s.write(3, second, now);
        assert_eq!(s.read(now + Duration::from_millis(800)).value, Some(1));
        assert_eq!(s.read(now + Duration::from_millis(900)).value, Some(3));
    }

    #[test]
    fn a_delayed_creation_is_absent_for_its_reads_then_visible() {
        let now = Instant::now();
        let mut s = Slot::created(7u32, lag(2, 0), now);
        assert_eq!(s.read(now).value, None);
        assert!(s.read(now).stale);
        let seen = s.read(now);
        assert_eq!((seen.value, seen.stale), (Some(7), false));
        assert_eq!(s.read(now).value, Some(7));
    }

    #[test]
    fn a_delayed_update_shows_the_old_state_until_reads_and_time_pass() {
        let now = Instant::now();
        let mut s = Slot::created(1u32, None, now);
        s.write(2, lag(1, 100), now);
        assert_eq!(s.read(now).value, Some(1)); // the read budget
        assert_eq!(s.read(now + Duration::from_millis(99)).value, Some(1)); // the time
        assert_eq!(s.read(now + Duration::from_millis(100)).value, Some(2));
    }

    #[test]
    fn stacked_delays_hide_the_oldest_state_and_a_plain_write_reveals_all() {
        let now = Instant::now();
        let mut s = Slot::created(1u32, None, now);
        s.write(2, lag(1, 0), now);
        s.write(3, lag(2, 0), now);
        assert_eq!(s.read(now).value, Some(1));
        assert_eq!(s.read(now).value, Some(1));
        assert_eq!(s.read(now).value, Some(3));
        s.write(4, lag(5, 0), now);
        s.write(5, None, now);
        assert_eq!(s.read(now).value, Some(5));
    }
}
