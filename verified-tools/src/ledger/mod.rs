//! The call ledger: one record per idempotency key, so that a repeated
//! logical call returns the recorded outcome instead of executing again, a
//! call in doubt is verified before anything is dispatched under its key, and
//! two calls with the same key never run at once.
//!
//! This module is the contract every backend implements, in whatever store
//! it keeps its records: [`MemoryLedger`] (the default, in the process),
//! `SqliteLedger` (feature `sqlite`: one host, durable), `RedisLedger`
//! (feature `redis`: shared by processes and hosts) and `PostgresLedger`
//! (feature `postgres`: shared by processes and hosts, in a PostgreSQL
//! database). The engine talks to the contract only.
//!
//! # A record
//!
//! | field | meaning |
//! |---|---|
//! | fingerprint | the payload's digest: the same key with another payload is refused |
//! | state | held (by a fence, until a lease ends), in doubt, settled, completed |
//! | attempts | attempts dispatched under the key by every call together |
//! | after OK | the last attempt answered OK but the verifier did not confirm it |
//! | settle time | when the last attempt can no longer apply or stay hidden (store clock) |
//! | value | a completed call's value, serialized, when it serializes |
//!
//! A backend of one's own runs the contract's cases of [`kit`] (feature
//! `ledger-kit`), the same ones the project's backends run, and may decide
//! its claims with [`record::claim_step`], the claim rules as one pure
//! function (the memory and SQLite ledgers do).
//!
//! # The rules a backend keeps
//!
//! 1. **Claims are atomic.** [`Ledger::claim`] reads and claims in one step
//!    (a Redis script, an SQLite transaction, a shard lock): two calls can
//!    never both hold a key.
//! 2. **Fencing.** Every claim gets a [`Fence`] from the store, strictly
//!    greater than every fence issued before by that store. Every write of the
//!    holder carries it, and a write whose fence is not the key's current one
//!    fails with [`LedgerError::Fenced`]: a holder presumed dead cannot
//!    overwrite its successor.
//! 3. **Leases on the store's clock.** A hold ends after [`Ledger::lease`],
//!    measured by the store (Redis `TIME`, SQLite's clock), so that hosts with
//!    skewed clocks agree. A key held past its lease is taken over *in doubt*:
//!    the next call verifies before it dispatches.
//! 4. **Durations, not instants, cross the boundary.** The settle time is
//!    sent as "settled after this long" and returned as "settles in this
//!    long", each converted by the store against its own clock.
//! 5. **Nothing in doubt is forgotten.** Completed and settled records expire
//!    after a TTL; records in doubt never expire. A cap never drops a record
//!    in doubt silently, nor turns the repeat of a completed call into a
//!    blind dispatch: a backend bounded in memory may compact such a record
//!    to what a repeat must know (its key and fingerprint: verify before
//!    dispatching), and documents the hard bound past which it forgets
//!    ([`MemoryLedger`]).
//! 6. **Answers can be lost; every operation is safe to send again.** A
//!    store across a network may run an operation and lose its answer (a
//!    connection reset, a timeout, a restart). A backend retries such
//!    transient failures itself, with backoff, within its own bound (and the
//!    engine drops a claim or a write-through at the call's deadline), so
//!    each operation
//!    must mean the same sent twice: a claim sent again is answered with the
//!    hold it took (a backend recognises its own claim, e.g. by a token kept
//!    in the record), never "in flight" on it; a write-through sent again
//!    writes the same attempt; a finish that landed is answered done, not
//!    fenced. Only then does it fail closed ([`LedgerError::Unavailable`]).
//!
//! # Attempts that never left
//!
//! A record counts the attempts that *may* have gone out: an attempt is
//! counted when it is announced, by the claim (the first one,
//! [`ClaimRequest::first`]) or by [`Ledger::dispatching`], before it goes out.
//! The engine dispatches an attempt only once its announcement answered
//! `Ok`: a caller that got an error, or no answer, did not send it. So the
//! count is one too high exactly when an announcement landed and its answer
//! was lost, and the backend, which saw its own operation fail, knows when
//! that may be:
//!
//! - a claim whose caller never got its answer is undone: a fresh hold is
//!   removed (as if never claimed: its first attempt never left), a hold
//!   taken over goes back in doubt as it was;
//! - an attempt whose write-through never reached its caller is taken back
//!   (the record counts one less), if the record is still that hold's and
//!   the write is its last.
//!
//! That undoing is itself an operation on the store, done in the background
//! and retried for a while. If it never lands (the store stays away, the
//! process ends), the record keeps the attempt: conservative, for the next
//! call verifies before it dispatches and has one attempt less, but never
//! sends twice. A call whose every attempt provably never left is thus
//! dispatched by a repeat, within the key's budget, as soon as the store
//! answers again; it is never told the budget is spent by attempts that were
//! only announced. A ledger in the process (or one whose operations are
//! transactions that a dropped caller rolls back) has no lost answers and
//! nothing to undo.
//!
//! # What fencing does not stop: a holder paused past its lease
//!
//! A worker paused past its lease (a stopped process, a long GC pause, a
//! swapped-out host) may have an attempt already handed to its client when
//! it stops. Its successor takes the key over in doubt, verifies, reads
//! `Absent` (the attempt has not arrived) and dispatches. When the paused
//! worker resumes, the ledger fences every write it makes (its outcome is
//! never recorded, and the engine reports it in doubt, `Superseded`, never
//! `NotApplied`), but the request its client already held still goes out:
//!
//! - to a service that honours idempotency keys it carries the same key as
//!   the successor's, and is deduplicated;
//! - to a service that honours deadlines it arrives after its deadline (the
//!   lease outlasts every call's deadline) and is dropped;
//! - to a service that honours neither it is a second effect. Only a check
//!   at the resource stops it: write the call's key (or a fence) into the
//!   effect and let the store refuse a second one (a unique constraint on
//!   the key column, a conditional update), as Kleppmann's fencing tokens
//!   require: a token protects only what checks it.
//!
//! What the engine offers every tool is to ask, right before the request
//! leaves, whether it still holds the key ([`Holder`](crate::Holder)): the
//! attempt's deadline for free (a lease outlasts every deadline of its
//! call, so a key is taken over only once the deadline has passed), or
//! [`Ledger::hold`], one read of the store, which also sees a host whose
//! clock stood still. A pause after the question still sends; a pause
//! before it no longer does (`integration/tests/processes.rs`: a worker
//! stopped with SIGSTOP with a request in hand sends a second effect
//! without the question, none with it).
//!
//! # Fail closed
//!
//! When the store cannot be reached, [`Ledger::claim`] returns an error and
//! the call is refused before anything is dispatched
//! ([`CallError::Ledger`](crate::CallError::Ledger)).

mod codec;
mod error;
#[cfg(feature = "ledger-kit")]
pub mod kit;
mod memory;
#[cfg(feature = "postgres")]
mod postgres;
pub mod record;
#[cfg(feature = "redis")]
mod redis;
#[cfg(feature = "sqlite")]
mod sqlite;
#[cfg(any(feature = "redis", feature = "postgres"))]
mod store_time;

use std::any::Any;
use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context as TaskContext, Poll};
use std::time::Duration;

use crate::{IdempotencyKey, PayloadDigest};

pub use codec::{Codec, CodecProbe, SerdeCodec, UnrecordedCodec};
pub use error::StoreError;
pub use memory::MemoryLedger;
#[cfg(feature = "postgres")]
pub use postgres::{PostgresLedger, PostgresLedgerBuilder, Tx, TxError, TxFuture, TxStage};
#[cfg(feature = "redis")]
pub use redis::RedisLedger;
#[cfg(feature = "sqlite")]
pub use sqlite::SqliteLedger;

/// A fencing token, issued by the store with each claim. Strictly greater
/// than every fence the same store issued before, for any key.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Fence(pub u64);

impl fmt::Display for Fence {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}

/// When the last attempt under a key has settled: when it can no longer be
/// applied late nor stay hidden from the verifier. Before then a verifier's
/// `Absent` proves nothing.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Settle {
    /// After this long (from the moment the value was computed).
    After(Duration),
    /// Never: the service gives no bound (no settle margin is configured).
    Never,
}

impl Settle {
    /// Settled already.
    pub const NOW: Settle = Settle::After(Duration::ZERO);
}

/// What the calls that held a key have done so far, written through before
/// every attempt so that a call taking the key over inherits it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Progress {
    /// Attempts dispatched under the key by every call together, this one
    /// included: the retry budget is per logical call, not per invocation.
    /// In a record, the attempts that may have gone out: announced, and not
    /// taken back (see [attempts that never left](self#attempts-that-never-left)).
    pub attempts: u32,
    /// The last attempt answered OK but the verifier did not confirm it: the
    /// server has recorded the key, so nothing is dispatched under it again.
    pub after_ok: bool,
    /// When the last attempt settles.
    pub settle: Settle,
}

/// A claim request: the key, its payload fingerprint, and what the first
/// attempt will be if the key is free.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ClaimRequest {
    /// The key of the call.
    pub key: IdempotencyKey,
    /// The payload's fingerprint (a derived key is its own).
    pub fingerprint: PayloadDigest,
    /// Another key under which the same logical call may already be
    /// recorded, with its fingerprint: the previous time bucket's key (see
    /// [`KeyScope::TimeBucket`](crate::KeyScope::TimeBucket)). When a live
    /// record exists under it, the claim answers for that key instead.
    pub previous: Option<(IdempotencyKey, PayloadDigest)>,
    /// What a fresh claim records as already dispatching (the first attempt
    /// goes out right after the claim): one round trip instead of two.
    pub first: Progress,
    /// The caller's clock (its context's [`Clock`](crate::Clock), tokio's by
    /// default), read just before the claim. A ledger in this process, whose
    /// clock it is, may use it rather than read the clock again; a store
    /// keeps to its own clock.
    pub now: tokio::time::Instant,
}

/// What [`Ledger::claim`] found, and for which key.
#[derive(Debug)]
pub struct Claim {
    /// The key the answer is for: [`ClaimRequest::key`], or the previous
    /// bucket's key when the call was found recorded under it.
    pub key: IdempotencyKey,
    /// The answer.
    pub state: Claimed,
}

/// The answer to a claim.
#[derive(Debug)]
pub enum Claimed {
    /// No live record: the caller holds the key, and the first attempt is
    /// recorded as dispatching ([`ClaimRequest::first`]).
    Fresh(Fence),
    /// Earlier calls dispatched under this key without proving the effect
    /// (they ended in doubt or known absent, were dropped, or held the key
    /// past its lease). The caller now holds the key; it verifies before it
    /// dispatches and has only the rest of the key's budget.
    Resume(Fence, Progress),
    /// A call with this key succeeded.
    Completed(Replay),
    /// Another call holds the key; its lease ends in this long at most.
    InFlight(Duration),
    /// The key is recorded with another payload fingerprint.
    Mismatch,
}

/// A completed call's value, as the ledger kept it.
pub enum Replay {
    /// Kept in this process, as the value itself.
    Local(Arc<dyn Any + Send + Sync>),
    /// Kept serialized (see [`Codec`]).
    Encoded(Vec<u8>),
    /// The value does not serialize: the call is known complete, and a
    /// repeat obtains the value by verifying. It never dispatches again.
    Unrecorded,
}

impl fmt::Debug for Replay {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Replay::Local(_) => f.write_str("Local(..)"),
            Replay::Encoded(bytes) => write!(f, "Encoded({} bytes)", bytes.len()),
            Replay::Unrecorded => f.write_str("Unrecorded"),
        }
    }
}

/// A completed call's value, offered to the ledger in the form it keeps.
pub trait Recorded: Send + Sync {
    /// The value, shared, for a ledger in this process.
    fn local(&self) -> Arc<dyn Any + Send + Sync>;
    /// The value serialized, for a ledger in a store; `None` when the value
    /// does not serialize (the record then says completed, without value).
    fn encode(&self) -> Option<Vec<u8>>;
}

/// How a call that held a key ended.
pub enum End<'a> {
    /// The effect happened: keep the value for replays, for the TTL.
    Completed(&'a dyn Recorded),
    /// Attempts went out and the effect is known not to have happened (a
    /// definitive error, or a trusted `Absent`): kept for the TTL, so a
    /// repeat uses only the rest of the key's budget.
    Settled,
    /// The effect is in doubt: kept until a call proves it, so the next
    /// call with this key verifies first.
    InDoubt,
}

impl fmt::Debug for End<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            End::Completed(_) => "Completed",
            End::Settled => "Settled",
            End::InDoubt => "InDoubt",
        })
    }
}

/// A ledger operation failed. The engine refuses a call whose claim fails
/// and stops dispatching when a write-through fails.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum LedgerError {
    /// The store could not be reached or did not answer. The
    /// [`StoreError`] keeps the store client's own error, if any, as its
    /// source (reached by this error's [`source`](std::error::Error::source)).
    #[error("the ledger's store is unavailable: {0}")]
    Unavailable(#[source] StoreError),
    /// The hold's fence is no longer the key's: another call took the key
    /// over after the lease ended.
    #[error("the hold on this key was taken over by a later call (fence {0})")]
    Fenced(Fence),
    /// The ledger is at its record cap and every record is in doubt or held.
    #[error("the ledger is full: {0} records, none of them evictable")]
    Full(usize),
    /// A record could not be read back. The [`StoreError`] keeps the error
    /// beneath, if any, as its source.
    #[error("a ledger record is corrupt: {0}")]
    Corrupt(#[source] StoreError),
    /// The backend does not offer this operation (an operator's listing or
    /// resolution on a ledger that cannot enumerate its records).
    #[error("this ledger does not support {0}")]
    Unsupported(&'static str),
}

/// Where a record stands, as an operator sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum RecordState {
    /// A call holds the key now (until its lease ends).
    Held,
    /// The effect is in doubt: the next call with the key verifies first.
    InDoubt,
    /// Attempts went out and the effect is known not to have happened.
    Settled,
    /// The effect happened.
    Completed,
}

impl RecordState {
    /// The snake_case name (`held`, `in_doubt`, `settled`, `completed`).
    pub const fn as_str(self) -> &'static str {
        match self {
            RecordState::Held => "held",
            RecordState::InDoubt => "in_doubt",
            RecordState::Settled => "settled",
            RecordState::Completed => "completed",
        }
    }
}

/// One record, as [`Ledger::record`] and [`Ledger::in_doubt`] show it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RecordView {
    /// The call's key.
    pub key: IdempotencyKey,
    /// Where it stands.
    pub state: RecordState,
    /// What the calls that held it did so far (the settle time as "settles
    /// in this long", from the store's clock).
    pub progress: Progress,
}

/// A person's decision about a call in doubt ([`Ledger::resolve`]), after
/// looking at the real state.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Resolution {
    /// The effect happened: the record becomes completed (without a value:
    /// a repeat obtains it by verifying, and never dispatches again).
    Applied,
    /// The effect did not happen and nothing of it can still land: the
    /// record is settled with its attempts cleared, so a repeat verifies
    /// first and then has the key's whole budget.
    NotApplied,
}

/// The future of a ledger operation: ready at once for a ledger in the
/// process (no allocation on the success path), boxed for a store.
#[must_use = "a ledger operation does nothing until awaited"]
pub struct LedgerFuture<'a, T>(Inner<'a, T>);

enum Inner<'a, T> {
    Ready(Option<Result<T, LedgerError>>),
    Boxed(Pin<Box<dyn Future<Output = Result<T, LedgerError>> + Send + 'a>>),
}

impl<'a, T> LedgerFuture<'a, T> {
    /// An answer already computed.
    pub fn ready(result: Result<T, LedgerError>) -> Self {
        Self(Inner::Ready(Some(result)))
    }

    /// An answer still to come from a store.
    pub fn boxed(future: impl Future<Output = Result<T, LedgerError>> + Send + 'a) -> Self {
        Self(Inner::Boxed(Box::pin(future)))
    }

    /// Whether the answer was computed at once: awaiting it takes no time.
    pub(crate) fn is_ready(&self) -> bool {
        matches!(self.0, Inner::Ready(_))
    }
}

// Neither variant is structurally pinned: the boxed future is pinned on the
// heap, the ready value is only moved out.
impl<T> Unpin for LedgerFuture<'_, T> {}

impl<T> Future for LedgerFuture<'_, T> {
    type Output = Result<T, LedgerError>;

    fn poll(self: Pin<&mut Self>, cx: &mut TaskContext<'_>) -> Poll<Self::Output> {
        match &mut self.get_mut().0 {
            Inner::Ready(result) => Poll::Ready(
                result
                    .take()
                    .unwrap_or_else(|| Err(LedgerError::Corrupt("polled after completion".into()))),
            ),
            Inner::Boxed(future) => future.as_mut().poll(cx),
        }
    }
}

impl<T> fmt::Debug for LedgerFuture<'_, T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self.0 {
            Inner::Ready(_) => "LedgerFuture::Ready",
            Inner::Boxed(_) => "LedgerFuture::Boxed",
        })
    }
}

/// Storage of call records, keyed by idempotency key. See the [module
/// docs](self) for the rules every backend keeps; `tests/ledger_conformance/`
/// checks them against each backend.
pub trait Ledger: Send + Sync {
    /// Looks the key up (and [`ClaimRequest::previous`]) and, when free or
    /// in doubt, claims it for the caller, atomically.
    fn claim(&self, request: ClaimRequest) -> LedgerFuture<'_, Claim>;

    /// Records, before an attempt goes out, what the holder has done so far:
    /// `progress.attempts` is the number of the attempt about to go out, so
    /// that the same write sent again is harmless. Fails with
    /// [`LedgerError::Fenced`] when the hold was taken over.
    ///
    /// The caller dispatches the attempt only when this answers `Ok`: after
    /// any error (or when it drops the future first) it does not, and the
    /// backend may take the attempt back (see [attempts that never
    /// left](self#attempts-that-never-left)). To try again, the caller writes
    /// through again before it dispatches.
    fn dispatching(
        &self,
        key: IdempotencyKey,
        fence: Fence,
        progress: Progress,
    ) -> LedgerFuture<'_, ()>;

    /// Records how the call that holds `key` under `fence` ended and ends
    /// the hold. Fails with [`LedgerError::Fenced`] (changing nothing) when
    /// the hold was taken over.
    fn finish<'a>(
        &'a self,
        key: IdempotencyKey,
        fence: Fence,
        end: End<'a>,
    ) -> LedgerFuture<'a, ()>;

    /// The holder's call was dropped (cancelled, or its task panicked): end
    /// the hold now, leaving the record in doubt, so that the next call with
    /// the key verifies before it dispatches without waiting for the lease.
    /// Called from a destructor: must not block. A store may do it in the
    /// background; if that is lost, the lease ends the hold.
    fn abandon(&self, key: IdempotencyKey, fence: Fence);

    /// How long a hold lasts before the key is taken over in doubt.
    fn lease(&self) -> Duration;

    /// Whether `fence` still holds `key`: `Some(lease left)`, measured on
    /// the store's clock, or `None` when another call took the key over or
    /// the lease has ended (a later claim may take the key over at any
    /// moment). One read, nothing written; a tool asks it right before it
    /// sends, through [`Holder`](crate::Holder) (see [what fencing does not
    /// stop](self#what-fencing-does-not-stop-a-holder-paused-past-its-lease)).
    /// Backends that cannot answer it answer [`LedgerError::Unsupported`].
    fn hold(&self, key: IdempotencyKey, fence: Fence) -> LedgerFuture<'_, Option<Duration>> {
        let _ = (key, fence);
        LedgerFuture::ready(Err(LedgerError::Unsupported("checking a hold")))
    }

    /// The record of `key`, if there is one: for an operator ("show").
    /// Backends that cannot read a record by itself answer
    /// [`LedgerError::Unsupported`].
    fn record(&self, key: IdempotencyKey) -> LedgerFuture<'_, Option<RecordView>> {
        let _ = key;
        LedgerFuture::ready(Err(LedgerError::Unsupported("reading a record")))
    }

    /// Up to `limit` records in doubt (not held), for an operator or a
    /// reconciler; in no particular order.
    fn in_doubt(&self, limit: usize) -> LedgerFuture<'_, Vec<RecordView>> {
        let _ = limit;
        LedgerFuture::ready(Err(LedgerError::Unsupported("listing records in doubt")))
    }

    /// Records a person's decision about the call in doubt under `key`, and
    /// answers the state the record was in. Only a record in doubt is
    /// changed: a held, settled or completed one (or none, `Ok(None)`) is
    /// left as it is, so a decision never overwrites what a call proved.
    fn resolve(
        &self,
        key: IdempotencyKey,
        resolution: Resolution,
    ) -> LedgerFuture<'_, Option<RecordState>> {
        let _ = (key, resolution);
        LedgerFuture::ready(Err(LedgerError::Unsupported("resolving a record")))
    }
}

impl<L: Ledger + ?Sized> Ledger for Arc<L> {
    fn claim(&self, request: ClaimRequest) -> LedgerFuture<'_, Claim> {
        (**self).claim(request)
    }

    fn dispatching(
        &self,
        key: IdempotencyKey,
        fence: Fence,
        progress: Progress,
    ) -> LedgerFuture<'_, ()> {
        (**self).dispatching(key, fence, progress)
    }

    fn finish<'a>(
        &'a self,
        key: IdempotencyKey,
        fence: Fence,
        end: End<'a>,
    ) -> LedgerFuture<'a, ()> {
        (**self).finish(key, fence, end)
    }

    fn abandon(&self, key: IdempotencyKey, fence: Fence) {
        (**self).abandon(key, fence)
    }

    fn lease(&self) -> Duration {
        (**self).lease()
    }

    fn hold(&self, key: IdempotencyKey, fence: Fence) -> LedgerFuture<'_, Option<Duration>> {
        (**self).hold(key, fence)
    }

    fn record(&self, key: IdempotencyKey) -> LedgerFuture<'_, Option<RecordView>> {
        (**self).record(key)
    }

    fn in_doubt(&self, limit: usize) -> LedgerFuture<'_, Vec<RecordView>> {
        (**self).in_doubt(limit)
    }

    fn resolve(
        &self,
        key: IdempotencyKey,
        resolution: Resolution,
    ) -> LedgerFuture<'_, Option<RecordState>> {
        (**self).resolve(key, resolution)
    }
}
