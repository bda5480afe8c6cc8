//! A store's ledger seen from the experiment's paused-time runtimes (the
//! Redis and PostgreSQL ledgers of `--ledger`).

use std::sync::Arc;
use std::time::Duration;

use verified_tools::IdempotencyKey;
use verified_tools::ledger::{
    Claim, ClaimRequest, End, Fence, Ledger, LedgerError, LedgerFuture, Progress, Recorded,
    StoreError,
};

/// A store's ledger seen from the experiment's paused-time runtimes. Paused
/// time jumps to the next timer whenever the runtime waits, so a network
/// round trip would look like an endless wait (and the store's own timeouts
/// would fire at once). Each operation runs instead on a real-time runtime of
/// its own (where the connection's task lives too), from a blocking thread:
/// tokio does not advance a paused clock while blocking work runs.
pub(super) struct RealTime<L> {
    ledger: Arc<L>,
    rt: Arc<tokio::runtime::Runtime>,
}

impl<L: Ledger + 'static> RealTime<L> {
    /// Connects with `connect(url)` on a real-time runtime of its own.
    pub(super) fn connect<F>(url: &str, connect: impl FnOnce(String) -> F) -> Result<Self, String>
    where
        F: std::future::Future<Output = Result<L, LedgerError>>,
    {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .map_err(|e| format!("a runtime for {url}: {e}"))?;
        let ledger = rt.block_on(connect(url.to_owned())).map_err(|e| format!("{url}: {e}"))?;
        Ok(Self { ledger: Arc::new(ledger), rt: Arc::new(rt) })
    }

    /// Runs `op` on the real-time runtime, from a blocking thread.
    fn run<T, F>(&self, op: impl FnOnce(Arc<L>) -> F + Send + 'static) -> LedgerFuture<'_, T>
    where
        T: Send + 'static,
        F: std::future::Future<Output = Result<T, LedgerError>>,
    {
        let (ledger, rt) = (Arc::clone(&self.ledger), Arc::clone(&self.rt));
        LedgerFuture::boxed(async move {
            tokio::task::spawn_blocking(move || rt.block_on(op(ledger))).await.unwrap_or_else(|e| {
                Err(LedgerError::Unavailable(StoreError::with_source(e.to_string(), e)))
            })
        })
    }
}

/// A completed value, materialized so that it can cross to another thread.
struct Owned {
    local: Arc<dyn std::any::Any + Send + Sync>,
    encoded: Option<Vec<u8>>,
}

impl Recorded for Owned {
    fn local(&self) -> Arc<dyn std::any::Any + Send + Sync> {
        Arc::clone(&self.local)
    }

    fn encode(&self) -> Option<Vec<u8>> {
        self.encoded.clone()
    }
}

impl<L: Ledger + 'static> Ledger for RealTime<L> {
    fn claim(&self, request: ClaimRequest) -> LedgerFuture<'_, Claim> {
        self.run(move |l| async move { l.claim(request).await })
    }

    fn dispatching(
        &self,
        key: IdempotencyKey,
        fence: Fence,
        progress: Progress,
    ) -> LedgerFuture<'_, ()> {
        self.run(move |l| async move { l.dispatching(key, fence, progress).await })
    }

    fn finish<'a>(
        &'a self,
        key: IdempotencyKey,
        fence: Fence,
        end: End<'a>,
    ) -> LedgerFuture<'a, ()> {
        let owned = match &end {
            End::Completed(value) => Some(Owned { local: value.local(), encoded: value.encode() }),
            End::Settled | End::InDoubt => None,
        };
        let settled = matches!(end, End::Settled);
        self.run(move |l| async move {
            let end = match &owned {
                Some(value) => End::Completed(value),
                None if settled => End::Settled,
                None => End::InDoubt,
            };
            l.finish(key, fence, end).await
        })
    }

    fn abandon(&self, key: IdempotencyKey, fence: Fence) {
        // The stores' `abandon` spawns onto the runtime it is called on.
        let _guard = self.rt.enter();
        self.ledger.abandon(key, fence);
    }

    fn lease(&self) -> Duration {
        self.ledger.lease()
    }

    fn hold(&self, key: IdempotencyKey, fence: Fence) -> LedgerFuture<'_, Option<Duration>> {
        self.run(move |l| async move { l.hold(key, fence).await })
    }
}
