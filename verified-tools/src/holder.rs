//! "Am I still the holder?": what a tool asks right before it sends.
//!
//! A worker paused past its lease (a stopped process, a long GC pause, a
//! suspended host) may resume in the middle of an attempt, after another
//! call took its key over, verified `Absent` and made the effect. Whatever
//! it sends then is a second effect on a service that honours neither keys
//! nor deadlines (see the [ledger's docs](crate::ledger#what-fencing-does-not-stop-a-holder-paused-past-its-lease)).
//! A tool can ask, at the last moment before the request leaves, whether it
//! still holds the key. Two answers, by cost:
//!
//! | ask | cost | catches |
//! |---|---|---|
//! | [`Deadline::has_passed`](crate::Deadline::has_passed) on the attempt's deadline | one clock read, no round trip | every pause of the process (SIGSTOP, GC, swap): a lease outlasts every deadline of the call it holds for, so a key can be taken over only once the attempt's deadline has passed |
//! | [`Holder::ensure`] | one read of the ledger's store (none for the in-memory ledger: a shard lock) | also a host whose monotonic clock stood still while the store's ran on (a suspended VM or laptop) |
//!
//! Neither closes the window between the check and the send: a pause
//! there still sends. Only a check at the resource does (write
//! [`Holder::fence`] into the effect and let the store refuse a write under
//! an older fence, or use a unique constraint on the key), as Kleppmann's
//! fencing tokens require.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use crate::ledger::{Fence, Ledger, LedgerError};
use crate::{Classify, ErrorClass, IdempotencyKey};

/// The call's hold on its key in the ledger, as the tool sees it: a
/// parameter of type `Holder` in a `#[verified_tool]` fn is filled in by the
/// wrapper (like `IdempotencyKey` and `Deadline`), and
/// [`Attempt::holder`](crate::engine::Attempt::holder) carries it for tools
/// written by hand (for a [`ToolSpec`](crate::ToolSpec) made
/// [`with_holder`](crate::ToolSpec::with_holder)).
///
/// ```
/// use std::time::Duration;
/// use verified_tools::{verified_tool, Context, Deadline, Holder, HoldLost, ToolResult, Verdict};
///
/// #[derive(Debug, thiserror::Error)]
/// enum MailError {
///     #[error(transparent)]
///     Hold(#[from] HoldLost),
/// }
/// impl verified_tools::Classify for MailError {
///     fn classify(&self) -> verified_tools::ErrorClass {
///         match self { MailError::Hold(lost) => lost.classify() } // nothing was sent
///     }
/// }
///
/// async fn sent(_to: &String) -> Verdict<()> { Verdict::Holds(()) }
///
/// #[verified_tool(side_effect = "high", verify = sent)]
/// async fn send_mail(to: String, deadline: Deadline, holder: Holder) -> Result<(), MailError> {
///     // ... build the request ...
///     // Right before it leaves: still ours, for as long as the request may take?
///     holder.ensure(deadline.remaining()).await?;
///     // ... send it ...
///     Ok(())
/// }
///
/// # #[tokio::main(flavor = "current_thread")] async fn main() {
/// let cx = Context::new("mailer");
/// assert!(matches!(send_mail(&cx, "bob".into()).await, ToolResult::Success { .. }));
/// # }
/// ```
#[derive(Clone, Default)]
pub struct Holder {
    hold: Option<Hold>,
}

#[derive(Clone)]
struct Hold {
    ledger: Arc<dyn Ledger>,
    key: IdempotencyKey,
    fence: Fence,
}

impl Holder {
    /// A holder of no ledger record: the call has no ledger (or is a read),
    /// or a tool's body is run by hand. It never loses what it does not
    /// hold: [`ensure`](Self::ensure) answers `Ok`.
    pub const fn unrecorded() -> Self {
        Self { hold: None }
    }

    pub(crate) fn new(ledger: Arc<dyn Ledger>, key: IdempotencyKey, fence: Fence) -> Self {
        Self { hold: Some(Hold { ledger, key, fence }) }
    }

    /// The fence of the call's hold, issued by the ledger's store with the
    /// claim: strictly greater than every fence issued before. Written into
    /// the effect (a `fence` column the write checks), it lets the resource
    /// itself refuse a paused holder's late write. `None` when the call
    /// holds no ledger record.
    pub fn fence(&self) -> Option<Fence> {
        self.hold.as_ref().map(|hold| hold.fence)
    }

    /// How long this call still holds its key at least, by the store's
    /// clock: `Ok(None)` when another call took it over or the lease has
    /// ended. One read of the store ([`Ledger::hold`]); a holder of no
    /// record answers `Ok(Some(Duration::MAX))`.
    pub async fn lease_left(&self) -> Result<Option<Duration>, LedgerError> {
        match &self.hold {
            Some(hold) => hold.ledger.hold(hold.key, hold.fence).await,
            None => Ok(Some(Duration::MAX)),
        }
    }

    /// `Ok` when this call still holds its key for at least `needed` (pass
    /// what the request may take: the attempt's
    /// [`Deadline::remaining`](crate::Deadline::remaining)); otherwise the
    /// tool must not send, and returns the error, which says nothing was
    /// sent ([`ErrorClass::NotSent`]). A store that cannot answer is not
    /// taken for a yes (fail closed).
    pub async fn ensure(&self, needed: Duration) -> Result<(), HoldLost> {
        match self.lease_left().await {
            Ok(Some(left)) if left >= needed => Ok(()),
            Ok(Some(left)) => Err(HoldLost::Expiring { left, needed }),
            Ok(None) => Err(HoldLost::TakenOver),
            Err(source) => Err(HoldLost::Unreadable(source)),
        }
    }
}

impl fmt::Debug for Holder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.hold {
            Some(hold) => write!(f, "Holder({} under fence {})", hold.key, hold.fence),
            None => f.write_str("Holder(unrecorded)"),
        }
    }
}

/// Why a tool must not send: the call may no longer hold its key
/// ([`Holder::ensure`]). Nothing was sent, so it classifies as
/// [`ErrorClass::NotSent`]: the engine then writes through before any
/// retry, which a holder whose key was taken over cannot, and the call ends
/// in doubt (`Superseded`), never as "not applied".
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum HoldLost {
    /// Another call took the key over, or the lease ended.
    #[error("this call no longer holds its key: another call took it over, or its lease ended")]
    TakenOver,
    /// The hold ends sooner than the request may take.
    #[error(
        "this call holds its key for {left:?} more, less than the {needed:?} its request may take"
    )]
    Expiring {
        /// What is left of the lease.
        left: Duration,
        /// What the tool asked for.
        needed: Duration,
    },
    /// The ledger's store could not say.
    #[error("the ledger could not say whether this call still holds its key")]
    Unreadable(#[source] LedgerError),
}

impl Classify for HoldLost {
    fn classify(&self) -> ErrorClass {
        ErrorClass::NotSent
    }
}
