//! What the server keeps between calls: the entities, the keys with the
//! answers they replay, the late arrivals on their way, the counts. Apart
//! so that the server reads as its write path and its API, not its
//! bookkeeping.

use tokio::time::Instant;

use super::Apply;
#[cfg(doc)]
use super::Oracle;
use crate::IdempotencyKey;
use crate::sim::error::SimError;
use crate::sim::faults::{FaultDraw, Op};
use crate::sim::truth::{Effect, EffectCount, FaultCounts};
use crate::sim::world::{
    Customer, CustomerId, InvoiceRow, Message, Record, RecordId, Sent, Slot, find,
};

/// The stored answer of a keyed write, replayed for a repeated key.
#[derive(Debug, Clone, Copy)]
pub(super) enum Reply {
    Customer(Customer),
    Message(Message),
    Row(InvoiceRow),
    Record(Record),
}

pub(super) trait Replied: Copy {
    fn wrap(self) -> Reply;
    fn unwrap(reply: Reply) -> Option<Self>;
}

macro_rules! replied {
    ($t:ty, $v:ident) => {
        impl Replied for $t {
            fn wrap(self) -> Reply {
                Reply::$v(self)
            }
            fn unwrap(reply: Reply) -> Option<Self> {
                if let Reply::$v(x) = reply { Some(x) } else { None }
            }
        }
    };
}
impl Replied for Reply {
    fn wrap(self) -> Reply {
        self
    }
    fn unwrap(reply: Reply) -> Option<Self> {
        Some(reply)
    }
}

replied!(Customer, Customer);
replied!(Message, Message);
replied!(InvoiceRow, Row);
replied!(Record, Record);

#[derive(Debug, Clone, Copy)]
pub(super) struct KeyEntry {
    pub(super) key: IdempotencyKey,
    pub(super) effect: Effect,
    pub(super) reply: Reply,
}

/// A write request as the server receives it.
#[derive(Debug, Clone, Copy)]
pub(super) struct Request {
    pub(super) op: Op,
    pub(super) target: u64,
    /// The key, if the server honours keys.
    pub(super) key: Option<IdempotencyKey>,
    /// The deadline, if the server honours deadlines.
    pub(super) deadline: Option<Instant>,
    pub(super) draw: FaultDraw,
}

/// The write of a late arrival, applied when it lands.
pub(super) type Deferred = Box<dyn FnOnce(&mut State, &Apply) -> Result<Reply, SimError> + Send>;

/// A late arrival on its way to the server.
pub(super) struct Pending {
    pub(super) at: Instant,
    pub(super) seq: u64,
    pub(super) request: Request,
    pub(super) apply: Deferred,
}

impl std::fmt::Debug for Pending {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Pending")
            .field("at", &self.at)
            .field("seq", &self.seq)
            .field("request", &self.request)
            .finish_non_exhaustive()
    }
}

#[derive(Debug, Default)]
pub(super) struct State {
    pub(super) customers: Vec<Slot<Customer>>,
    pub(super) outbox: Vec<Sent>,
    pub(super) rows: Vec<Slot<InvoiceRow>>,
    pub(super) records: Vec<Slot<Record>>,
    pub(super) keys: Vec<KeyEntry>,
    pub(super) effects: Vec<(Effect, EffectCount)>,
    pub(super) faults: FaultCounts,
    pub(super) calls: [u32; Op::ALL.len()],
    pub(super) pending: Vec<Pending>,
    pub(super) sent: u64,
    /// The draws the harness set for given calls ([`Oracle::script`]).
    pub(super) script: Vec<(Op, u32, FaultDraw)>,
}

impl State {
    /// A concurrent writer touches the target of a versioned write; whether
    /// there was a target to touch.
    pub(super) fn bump(&mut self, op: Op, target: u64, now: Instant) -> bool {
        match op {
            Op::SetCustomerStatus => find(&mut self.customers, CustomerId(target))
                .map(|s| {
                    s.write(Customer { version: s.current.version + 1, ..s.current }, None, now)
                })
                .is_some(),
            Op::SetRecordStatus | Op::UpdateRecordFields => {
                find(&mut self.records, RecordId(target))
                    .map(|s| {
                        s.write(Record { version: s.current.version + 1, ..s.current }, None, now)
                    })
                    .is_some()
            }
            _ => false,
        }
    }

    pub(super) fn count(&mut self, effect: Effect, partial: bool) {
        let i = match self.effects.iter().position(|(e, _)| *e == effect) {
            Some(i) => i,
            None => {
                self.effects.push((effect, EffectCount::default()));
                self.effects.len() - 1
            }
        };
        let c = &mut self.effects[i].1;
        c.applied += 1;
        c.partial += u32::from(partial);
    }
}
