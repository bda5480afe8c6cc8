//! What the ledger does when Redis does not answer: an operation is sent
//! again after a transient failure, within a budget, and what an
//! unanswered operation may have written is undone in the background.
//! Apart because every operation goes through it, whatever it sends.

use std::future::Future;
use std::time::Duration;

use redis::aio::ConnectionManager;
use redis::{ErrorKind, RedisError, ScriptInvocation, ServerErrorKind, Value};
use tokio::time::{Instant, sleep, timeout_at};

use super::RedisLedger;
use crate::ledger::{LedgerError, StoreError};

/// The first pause before an operation is sent again after a transient
/// failure; each later one doubles, up to [`MAX_BACKOFF`].
const FIRST_BACKOFF: Duration = Duration::from_millis(10);

/// The longest pause between two tries of one operation.
const MAX_BACKOFF: Duration = Duration::from_millis(250);

/// How long the undoing of an unanswered claim or write-through is retried
/// in the background: a store that comes back within it gets the record
/// right; later, the record stays conservative.
pub(super) const UNDO_FOR: Duration = Duration::from_secs(30);

/// Runs a script, retrying transient failures within `budget`.
pub(super) async fn run(
    conn: &ConnectionManager,
    budget: Duration,
    invocation: &ScriptInvocation<'_>,
) -> Result<Value, LedgerError> {
    retrying(budget, || {
        let mut conn = conn.clone();
        async move { invocation.invoke_async::<Value>(&mut conn).await }
    })
    .await
}

/// Tries `op` until it answers, within `budget`: a transient failure (what a
/// restart or a failover looks like, see [`transient`]) is tried again after
/// a pause that doubles; any other error, or the budget spent, fails.
///
/// Every operation of this ledger is safe to send again after its answer was
/// lost (see [Failures](RedisLedger#failures)): that is what makes a retry
/// on a connection that broke after the server ran the script harmless.
pub(super) async fn retrying<F, Fut>(budget: Duration, mut op: F) -> Result<Value, LedgerError>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<Value, RedisError>>,
{
    let deadline = Instant::now() + budget;
    let mut pause = FIRST_BACKOFF;
    let mut last = None;
    loop {
        let error = match timeout_at(deadline, op()).await {
            Err(_) => return Err(no_answer(budget, last.take())),
            Ok(Ok(value)) => return Ok(value),
            Ok(Err(error)) if transient(&error) => error,
            Ok(Err(error)) => return Err(unavailable(error)),
        };
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(unavailable(error));
        }
        last = Some(error);
        sleep(pause.min(left)).await;
        pause = (pause * 2).min(MAX_BACKOFF);
    }
}

/// Whether an error is what a restart, a failover or a lossy network looks
/// like, and goes away by itself: the connection reset, refused or closed,
/// an I/O error or an answer that timed out (the connection manager
/// re-establishes the connection), or Redis saying it cannot serve yet.
/// `BUSY` is not among them: it is a script that runs too long, not a store
/// coming back.
fn transient(error: &RedisError) -> bool {
    error.is_io_error()
        || error.is_connection_dropped()
        || error.is_connection_refusal()
        || error.is_timeout()
        || matches!(
            error.kind(),
            ErrorKind::Server(
                ServerErrorKind::BusyLoading
                    | ServerErrorKind::TryAgain
                    | ServerErrorKind::MasterDown
                    | ServerErrorKind::ReadOnly
                    | ServerErrorKind::ClusterDown
            )
        )
}

/// Undoes, when dropped armed, what an operation may have written for a
/// caller that never got its answer (see [`RELEASE`](super::scripts::RELEASE),
/// [`WITHDRAW`](super::scripts::WITHDRAW)).
pub(super) struct Unanswered<'a> {
    pub(super) ledger: &'a RedisLedger,
    pub(super) which: usize,
    pub(super) keys: Vec<String>,
    pub(super) args: Vec<String>,
    pub(super) armed: bool,
}

impl Unanswered<'_> {
    /// The caller has the answer: nothing to undo.
    pub(super) fn answered(mut self) {
        self.armed = false;
    }
}

impl Drop for Unanswered<'_> {
    fn drop(&mut self) {
        if self.armed {
            let (keys, args) = (std::mem::take(&mut self.keys), std::mem::take(&mut self.args));
            self.ledger.spawn(self.which, keys, args);
        }
    }
}

pub(super) fn bound(timeout: Duration) -> Duration {
    timeout.saturating_mul(2)
}

/// Redis failed: the [`RedisError`] is kept as the error's source.
pub(super) fn unavailable(error: RedisError) -> LedgerError {
    LedgerError::Unavailable(StoreError::with_source(format!("redis: {error}"), error))
}

/// No answer within `after`: the last transient failure, if any, is kept as
/// the error's source.
pub(super) fn no_answer(after: Duration, last: Option<RedisError>) -> LedgerError {
    LedgerError::Unavailable(match last {
        Some(error) => StoreError::with_source(
            format!("redis: {error} (still failing after {after:?})"),
            error,
        ),
        None => format!("redis: no answer within {after:?}").into(),
    })
}
