//! The simulated server: the async API of the two tasks, with the faults
//! injected inside each write.
//!
//! Every write runs in one synchronous critical section (let the late
//! arrivals that are due land, draw the faults, handle the request now or
//! keep it for its late arrival, record the key and the counts), then
//! awaits the virtual time the answer takes: `timeout_after` for a timeout,
//! `latency` otherwise (no await at all when it is zero). The mutex is never
//! held across an await. Late arrivals need no task of their own: each is
//! kept with the instant it reaches the server, and whatever touches the
//! state next (a write, a read, the [`Oracle`]) first lets every arrival due
//! by then land, in the order they arrive — so they land at their instant,
//! deterministically, on tokio's paused clock. Reads draw no faults; they
//! only see the replica lag of earlier writes (see [`world`](super::world)).

use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use tokio::time::{Instant, sleep, sleep_until};

use super::error::SimError;
#[cfg(doc)]
use super::faults::FaultProfile;
use super::faults::{FaultDraw, Lag, Op, Timeout};
use super::truth::{Effect, GroundTruth};
use super::world::{
    Customer, CustomerId, CustomerStatus, Hidden, InvoiceId, InvoiceRow, Message, MessageId,
    MessageKind, Record, RecordId, RecordStatus, RowId, Sent, create, find, millis_since, read,
    visible_messages,
};
use crate::deadline::later;
use crate::{Deadline, IdempotencyKey};

mod config;
mod state;

pub use config::{BASE_SEED, SimConfig, StaleReads, episode_seed};
use state::{Deferred, KeyEntry, Pending, Replied, Request, State};

/// How the current write is to be applied.
struct Apply {
    /// Apply part of the effects only.
    partial: bool,
    /// Answer as if every effect had been applied (a partial OK).
    claims_full: bool,
    lag: Option<Lag>,
    now: Instant,
    at_ms: u64,
}

impl Apply {
    /// The answer to a write that stored `written`: `written` itself, or
    /// for a partial OK what the full write would have stored (`full`).
    fn answer<T>(&self, written: T, full: impl FnOnce(T) -> T) -> T {
        if self.claims_full { full(written) } else { written }
    }
}

fn check_version(expected: u64, actual: u64) -> Result<(), SimError> {
    if expected == actual { Ok(()) } else { Err(SimError::Conflict { expected, actual }) }
}

/// The simulated server of one episode. Share it with the agent as an
/// `Arc<SimServer>`; keep the [`Oracle`] for the harness.
///
/// Every write takes an optional idempotency key and an optional
/// [`Deadline`]. While [`honour_keys`](SimConfig::honour_keys) is on, the
/// server remembers the key of every applied write: a repeated key applies
/// nothing and answers what the first application answered (even if that
/// answer was lost to a timeout), like Stripe; the same key on another
/// operation or target fails with [`SimError::KeyReuse`]. Rejected and
/// dropped calls (conflict, not found, timeout before applying, past the
/// deadline) store no key. While [`honour_deadlines`](SimConfig::honour_deadlines)
/// is on, a request the server receives after its deadline is dropped: a
/// late arrival silently (its client has timed out), any other with
/// [`SimError::DeadlineExceeded`].
///
/// ```
/// use verified_tools::sim::{CustomerId, CustomerStatus, FaultProfile, SimConfig, SimServer};
///
/// # #[tokio::main(flavor = "current_thread", start_paused = true)] async fn main() {
/// let (server, oracle) = SimServer::new(SimConfig::new(42, FaultProfile::NONE));
/// let c = server.create_customer(CustomerId(1), None, None).await.unwrap();
/// let c = server
///     .set_customer_status(c.id, CustomerStatus::Active, c.version, None, None)
///     .await
///     .unwrap();
/// server.send_welcome(c.id, None, None).await.unwrap();
/// assert_eq!(server.count_messages(c.id).await, Ok(1));
/// assert!(oracle.truth().customer(c.id).unwrap().activated_at.is_some());
/// # }
/// ```
#[derive(Debug)]
pub struct SimServer {
    config: SimConfig,
    start: Instant,
    state: Mutex<State>,
}

/// The harness's handle on a [`SimServer`]: ground truth the agent never gets.
#[derive(Debug, Clone)]
pub struct Oracle(Arc<SimServer>);

impl Oracle {
    /// A snapshot of the primary now: true state, effect and fault counts.
    /// Late arrivals still on their way are not in it.
    pub fn truth(&self) -> GroundTruth {
        let st = self.0.state(Instant::now());
        GroundTruth {
            customers: st.customers.iter().map(|s| s.current).collect(),
            outbox: st.outbox.iter().map(|s| s.message).collect(),
            rows: st.rows.iter().map(|s| s.current).collect(),
            records: st.records.iter().map(|s| s.current).collect(),
            effects: st.effects.clone(),
            faults: st.faults,
            calls: st.calls,
        }
    }

    /// Late arrivals still on their way to the server.
    pub fn in_flight(&self) -> usize {
        self.0.state(Instant::now()).pending.len()
    }

    /// When the last late arrival on its way reaches the server, if any.
    pub fn quiet_at(&self) -> Option<Instant> {
        self.0.state(Instant::now()).pending.iter().map(|p| p.at).max()
    }

    /// The truth once every late arrival has landed: waits (tokio time)
    /// until then, then snapshots. What an episode finally did, including a
    /// duplicate that lands after the agent has stopped.
    pub async fn final_truth(&self) -> GroundTruth {
        while let Some(at) = self.quiet_at() {
            sleep_until(at).await;
        }
        self.truth()
    }

    /// The server's configuration.
    pub fn config(&self) -> &SimConfig {
        &self.0.config
    }

    /// Scripts the faults of call `n` (0 for the first) of `op`: that call
    /// meets `draw` instead of what the profile draws for it, so a test
    /// says which fault it means rather than searching for a seed that
    /// happens to draw it. Calls are counted per operation from the
    /// server's start, as for [`FaultProfile::draw`] (a replayed key counts
    /// too). The draw is taken as is, also where the profile would not
    /// draw it (a late arrival past [`SimConfig::settle_bound`], a lag
    /// without a bound). Scripting a call again replaces its draw.
    ///
    /// ```
    /// use verified_tools::sim::{
    ///     CustomerId, FaultDraw, FaultProfile, Op, SimConfig, SimError, SimServer, Timeout,
    /// };
    ///
    /// # #[tokio::main(flavor = "current_thread", start_paused = true)] async fn main() {
    /// let (server, oracle) = SimServer::new(SimConfig::new(42, FaultProfile::NONE));
    /// // The first welcome is applied, then its answer is lost.
    /// let lost = FaultDraw { timeout: Some(Timeout::AfterApplying), ..FaultDraw::default() };
    /// oracle.script(Op::SendWelcome, 0, lost);
    /// let c = server.create_customer(CustomerId(1), None, None).await.unwrap();
    /// assert_eq!(server.send_welcome(c.id, None, None).await, Err(SimError::Timeout));
    /// assert_eq!(oracle.truth().welcome_messages(c.id), 1);
    /// // The second is not scripted: the profile's draw (none here).
    /// assert!(server.send_welcome(c.id, None, None).await.is_ok());
    /// # }
    /// ```
    pub fn script(&self, op: Op, n: u32, draw: FaultDraw) -> &Self {
        let mut st = self.0.state(Instant::now());
        st.script.retain(|(o, m, _)| (*o, *m) != (op, n));
        st.script.push((op, n, draw));
        self
    }
}

impl SimServer {
    /// A fresh, empty server; the clock starts now (tokio time).
    pub fn new(config: SimConfig) -> (Arc<SimServer>, Oracle) {
        let server = Arc::new(SimServer { config, start: Instant::now(), state: Mutex::default() });
        (Arc::clone(&server), Oracle(server))
    }

    /// The server's configuration.
    pub fn config(&self) -> &SimConfig {
        &self.config
    }

    /// The state, after every late arrival due by `now` has landed.
    fn state(&self, now: Instant) -> MutexGuard<'_, State> {
        let mut st = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        while let Some(i) = st
            .pending
            .iter()
            .enumerate()
            .filter(|(_, p)| p.at <= now)
            .min_by_key(|(_, p)| (p.at, p.seq))
            .map(|(i, _)| i)
        {
            let p = st.pending.swap_remove(i);
            let _ = self.handle(&mut st, &p.request, p.at, p.apply);
        }
        st
    }

    /// The server handles a request it receives at `now`: a passed deadline
    /// drops it, a known key replays, a drawn conflict bumps the target,
    /// then the write is applied and booked.
    fn handle<R: Replied>(
        &self,
        st: &mut State,
        req: &Request,
        now: Instant,
        apply: impl FnOnce(&mut State, &Apply) -> Result<R, SimError>,
    ) -> Result<R, SimError> {
        if req.deadline.is_some_and(|deadline| now > deadline) {
            st.faults.dropped_past_deadline += 1;
            return Err(SimError::DeadlineExceeded);
        }
        let effect = Effect { op: req.op, target: req.target };
        if let Some(k) = req.key
            && let Some(entry) = st.keys.iter().find(|e| e.key == k).copied()
        {
            return R::unwrap(entry.reply)
                .filter(|_| entry.effect == effect)
                .ok_or(SimError::KeyReuse);
        }
        if req.draw.conflict && req.op.is_versioned() && st.bump(req.op, req.target, now) {
            st.faults.conflicts += 1;
        }
        let compound = req.op.is_compound();
        let a = Apply {
            partial: (req.draw.partial || req.draw.partial_ok) && compound,
            claims_full: req.draw.partial_ok && compound,
            lag: req.draw.lag,
            now,
            at_ms: millis_since(self.start, now),
        };
        let result = apply(st, &a);
        if let Ok(reply) = &result {
            st.count(effect, a.partial);
            st.faults.partial += u32::from(a.partial);
            st.faults.partial_ok += u32::from(a.claims_full);
            st.faults.delayed += u32::from(a.lag.is_some());
            if let Some(key) = req.key {
                st.keys.push(KeyEntry { key, effect, reply: reply.wrap() });
            }
        }
        result
    }

    /// One write: faults, then the request handled now or sent on its late
    /// way. Returns the answer and the virtual time it takes.
    fn write<R: Replied>(
        &self,
        op: Op,
        target: u64,
        key: Option<IdempotencyKey>,
        deadline: Option<Deadline>,
        apply: impl FnOnce(&mut State, &Apply) -> Result<R, SimError> + Send + 'static,
    ) -> (Result<R, SimError>, Duration) {
        let cfg = &self.config;
        let now = Instant::now();
        let mut st = self.state(now);
        let n = st.calls[op as usize];
        st.calls[op as usize] += 1;
        let scripted = st.script.iter().find(|(o, m, _)| (*o, *m) == (op, n));
        let draw = match scripted {
            Some(&(.., draw)) => draw,
            None => cfg.profile.draw(cfg.seed, op, n),
        };
        let req = Request {
            op,
            target,
            key: key.filter(|_| cfg.honour_keys),
            deadline: deadline.filter(|_| cfg.honour_deadlines).map(Deadline::instant),
            draw,
        };
        let lost = || (Err(SimError::Timeout), cfg.profile.timeout_after);
        match draw.timeout {
            None => (self.handle(&mut st, &req, now, apply), cfg.latency),
            Some(Timeout::AfterApplying) => {
                st.faults.timeouts_after_applying += 1;
                let _ = self.handle(&mut st, &req, now, apply);
                lost()
            }
            Some(Timeout::BeforeApplying) => {
                st.faults.timeouts_before_applying += 1;
                // The concurrent writer still gets in first (a replayed key
                // draws nothing but its timeout).
                let known = req.key.is_some_and(|k| st.keys.iter().any(|e| e.key == k));
                if !known && draw.conflict && op.is_versioned() && st.bump(op, target, now) {
                    st.faults.conflicts += 1;
                }
                lost()
            }
            Some(Timeout::Late(delay)) => {
                st.faults.late_arrivals += 1;
                let seq = st.sent;
                st.sent += 1;
                let apply: Deferred = Box::new(move |st, a| apply(st, a).map(Replied::wrap));
                st.pending.push(Pending { at: later(now, delay), seq, request: req, apply });
                lost()
            }
        }
    }

    async fn answer<R>(
        &self,
        (result, delay): (Result<R, SimError>, Duration),
    ) -> Result<R, SimError> {
        if !delay.is_zero() {
            sleep(delay).await;
        }
        result
    }

    /// Creates customer `id` (status PENDING, version 1). Creating an
    /// existing id creates a duplicate, which replaces it (latest wins, next
    /// version).
    pub async fn create_customer(
        &self,
        id: CustomerId,
        key: Option<IdempotencyKey>,
        deadline: Option<Deadline>,
    ) -> Result<Customer, SimError> {
        let out = self.write(Op::CreateCustomer, id.0, key, deadline, move |st, a| {
            let c =
                Customer { id, status: CustomerStatus::Pending, activated_at: None, version: 0 };
            Ok(create(&mut st.customers, c, a.lag, a.now))
        });
        self.answer(out).await
    }

    /// Sets the customer's status if it is at `expected_version`; ACTIVE
    /// also sets `activated_at` to now. A partial success sets the status
    /// without `activated_at` and answers OK with what it wrote; a partial
    /// OK writes the same and answers with `activated_at` set, as a full
    /// write would.
    pub async fn set_customer_status(
        &self,
        id: CustomerId,
        status: CustomerStatus,
        expected_version: u64,
        key: Option<IdempotencyKey>,
        deadline: Option<Deadline>,
    ) -> Result<Customer, SimError> {
        let out = self.write(Op::SetCustomerStatus, id.0, key, deadline, move |st, a| {
            let s = find(&mut st.customers, id).ok_or(SimError::NotFound)?;
            let old = s.current;
            check_version(expected_version, old.version)?;
            let activated_at = match status {
                CustomerStatus::Active if a.partial => old.activated_at,
                CustomerStatus::Active => Some(a.at_ms),
                CustomerStatus::Pending => None,
            };
            let new = Customer { status, activated_at, version: old.version + 1, ..old };
            s.write(new, a.lag, a.now);
            Ok(a.answer(new, |c| match status {
                CustomerStatus::Active => Customer { activated_at: Some(a.at_ms), ..c },
                CustomerStatus::Pending => c,
            }))
        });
        self.answer(out).await
    }

    /// Sends a welcome message to an existing customer. Every accepted send
    /// adds a message to the outbox.
    pub async fn send_welcome(
        &self,
        to: CustomerId,
        key: Option<IdempotencyKey>,
        deadline: Option<Deadline>,
    ) -> Result<Message, SimError> {
        let out = self.write(Op::SendWelcome, to.0, key, deadline, move |st, a| {
            find(&mut st.customers, to).ok_or(SimError::NotFound)?;
            let id = MessageId(st.outbox.len() as u64);
            let message = Message { id, to, kind: MessageKind::Welcome, key };
            st.outbox.push(Sent { message, hidden: a.lag.map(|l| Hidden::new(l, a.now)) });
            Ok(message)
        });
        self.answer(out).await
    }

    /// Writes `invoice_id` and `amount` into the row, creating it if needed.
    /// A partial success writes the invoice id but not the amount and
    /// answers OK with what it wrote; a partial OK writes the same and
    /// answers with the amount.
    pub async fn update_invoice_row(
        &self,
        row: RowId,
        invoice_id: InvoiceId,
        amount: u64,
        key: Option<IdempotencyKey>,
        deadline: Option<Deadline>,
    ) -> Result<InvoiceRow, SimError> {
        let out = self.write(Op::UpdateInvoiceRow, row.0, key, deadline, move |st, a| {
            let old = find(&mut st.rows, row).and_then(|s| s.current.amount);
            let full = Some(amount);
            let amount = if a.partial { old } else { full };
            let r = InvoiceRow { row, invoice_id: Some(invoice_id), amount, version: 0 };
            let written = create(&mut st.rows, r, a.lag, a.now);
            Ok(a.answer(written, |r| InvoiceRow { amount: full, ..r }))
        });
        self.answer(out).await
    }

    /// Creates record `id` (status DRAFT) with its required fields. A
    /// partial success creates it without them and answers OK with what it
    /// created; a partial OK creates the same and answers with the fields.
    /// Creating an existing id creates a duplicate, which replaces it
    /// (latest wins).
    pub async fn create_record(
        &self,
        id: RecordId,
        invoice_id: InvoiceId,
        amount: u64,
        key: Option<IdempotencyKey>,
        deadline: Option<Deadline>,
    ) -> Result<Record, SimError> {
        let out = self.write(Op::CreateRecord, id.0, key, deadline, move |st, a| {
            let full = (Some(invoice_id), Some(amount));
            let (invoice_id, amount) = if a.partial { (None, None) } else { full };
            let r = Record { id, status: RecordStatus::Draft, invoice_id, amount, version: 0 };
            let written = create(&mut st.records, r, a.lag, a.now);
            Ok(a.answer(written, |r| Record { invoice_id: full.0, amount: full.1, ..r }))
        });
        self.answer(out).await
    }

    /// Sets the record's status if it is at `expected_version`.
    pub async fn set_record_status(
        &self,
        id: RecordId,
        status: RecordStatus,
        expected_version: u64,
        key: Option<IdempotencyKey>,
        deadline: Option<Deadline>,
    ) -> Result<Record, SimError> {
        let out = self.write(Op::SetRecordStatus, id.0, key, deadline, move |st, a| {
            let s = find(&mut st.records, id).ok_or(SimError::NotFound)?;
            check_version(expected_version, s.current.version)?;
            let new = Record { status, version: s.current.version + 1, ..s.current };
            s.write(new, a.lag, a.now);
            Ok(new)
        });
        self.answer(out).await
    }

    /// Fills in the record's required fields if it is at
    /// `expected_version`: the repair of a partial
    /// [`create_record`](Self::create_record), and the only way to complete
    /// a record without creating it again.
    ///
    /// A keyed, compound, versioned write with the same faults as the
    /// others, drawn from a stream of its own ([`Op::UpdateRecordFields`]):
    /// a stale conflict rejects it, a partial success writes the invoice id
    /// but not the amount (keeping the old one) and answers OK (a partial OK:
    /// with the amount, as if written), a lag hides it from reads, a timeout
    /// loses the answer of a request the server applied at once or receives
    /// late, or, with the earlier split, lost before it
    /// ([`TimeoutKind`](super::faults::TimeoutKind)).
    /// Status is untouched. In the [ground truth](super::GroundTruth) it is
    /// an update: filling in a partial record is not a duplicate (the
    /// record was created once), applying the full update twice is.
    ///
    /// ```
    /// use verified_tools::sim::{FaultProfile, InvoiceId, RecordId, SimConfig, SimServer};
    ///
    /// # #[tokio::main(flavor = "current_thread", start_paused = true)] async fn main() {
    /// let partial = FaultProfile { partial_success: 1.0, ..FaultProfile::NONE };
    /// let (server, _) = SimServer::new(SimConfig::new(42, partial));
    /// let r = server.create_record(RecordId(5), InvoiceId(77), 990, None, None).await.unwrap();
    /// assert_eq!((r.invoice_id, r.amount), (None, None)); // answered OK, without its fields
    ///
    /// let (server, oracle) = SimServer::new(SimConfig::new(42, FaultProfile::NONE));
    /// let r = server.create_record(RecordId(5), InvoiceId(77), 990, None, None).await.unwrap();
    /// let r = server.update_record_fields(r.id, InvoiceId(77), 990, r.version, None, None).await.unwrap();
    /// assert_eq!((r.invoice_id, r.amount, r.version), (Some(InvoiceId(77)), Some(990), 2));
    /// assert!(!oracle.truth().has_duplicates());
    /// # }
    /// ```
    pub async fn update_record_fields(
        &self,
        id: RecordId,
        invoice_id: InvoiceId,
        amount: u64,
        expected_version: u64,
        key: Option<IdempotencyKey>,
        deadline: Option<Deadline>,
    ) -> Result<Record, SimError> {
        let out = self.write(Op::UpdateRecordFields, id.0, key, deadline, move |st, a| {
            let s = find(&mut st.records, id).ok_or(SimError::NotFound)?;
            let old = s.current;
            check_version(expected_version, old.version)?;
            let full = Some(amount);
            let amount = if a.partial { old.amount } else { full };
            let new =
                Record { invoice_id: Some(invoice_id), amount, version: old.version + 1, ..old };
            s.write(new, a.lag, a.now);
            Ok(a.answer(new, |r| Record { amount: full, ..r }))
        });
        self.answer(out).await
    }

    async fn read<T>(
        &self,
        f: impl FnOnce(&mut State, Instant) -> (T, bool),
    ) -> Result<T, SimError> {
        let now = Instant::now();
        let (value, stale) = f(&mut self.state(now), now);
        let flagged = stale && self.config.stale_reads == StaleReads::Flagged;
        self.answer((
            if flagged { Err(SimError::StaleRead) } else { Ok(value) },
            self.config.latency,
        ))
        .await
    }

    /// Reads the customer through the replica.
    pub async fn get_customer(&self, id: CustomerId) -> Result<Option<Customer>, SimError> {
        self.read(|st, now| read(&mut st.customers, id, now)).await
    }

    /// Counts the welcome messages to the customer through the replica.
    pub async fn count_messages(&self, to: CustomerId) -> Result<u32, SimError> {
        self.read(|st, now| {
            let mut n = 0;
            let stale = visible_messages(&mut st.outbox, to, now, |m| {
                n += u32::from(m.kind == MessageKind::Welcome)
            });
            (n, stale)
        })
        .await
    }

    /// Lists the messages to the customer through the replica.
    pub async fn messages(&self, to: CustomerId) -> Result<Vec<Message>, SimError> {
        self.read(|st, now| {
            let mut out = Vec::new();
            let stale = visible_messages(&mut st.outbox, to, now, |m| out.push(*m));
            (out, stale)
        })
        .await
    }

    /// Reads the invoice row through the replica.
    pub async fn get_invoice_row(&self, row: RowId) -> Result<Option<InvoiceRow>, SimError> {
        self.read(|st, now| read(&mut st.rows, row, now)).await
    }

    /// Reads the record through the replica.
    pub async fn get_record(&self, id: RecordId) -> Result<Option<Record>, SimError> {
        self.read(|st, now| read(&mut st.records, id, now)).await
    }
}
