//! One `tools/call` in flight, as a host sees it: `notifications/progress`
//! while the engine waits, and `notifications/cancelled` as the engine's own
//! cancellation (the call dropped, its key left in doubt), taken only where
//! nothing is out.
//!
//! Both ride on the per-request [`Context`], so the engine is untouched: an
//! audit sink that turns the engine's transitions into plain-words progress
//! (and passes every event on to the set's own sink), and a ledger that
//! forwards to the set's ledger, reports a wait on another call holding the
//! key, and, once the client cancelled, parks the call at the next point
//! where it would announce an attempt. A parked call is dropped: its hold is
//! abandoned and the record stays in doubt, with the settle point of the
//! last attempt that went out, so the next call with the key verifies before
//! it sends anything.

use std::future::Future;
use std::pin::{Pin, pin};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::task::Poll;
use std::time::Duration;

use rmcp::RoleServer;
use rmcp::model::{ProgressNotificationParam, ProgressToken};
use rmcp::service::{Peer, RequestContext};
use tokio::sync::mpsc;

use crate::audit::{AuditEvent, AuditSink, CallState};
use crate::ledger::{
    Claim, ClaimRequest, Claimed, End, Fence, Ledger, LedgerFuture, Progress, RecordState,
    RecordView, Resolution,
};
use crate::{Context, ErrorClass, IdempotencyKey, ToolSpec, Verdict};

type Boxed = Pin<Box<dyn Future<Output = ()> + Send>>;

/// What watches one call: where its progress goes, and whether the client
/// cancelled it.
pub(super) struct LongCall {
    peer: Peer<RoleServer>,
    token: Option<ProgressToken>,
    cancelled: Boxed,
    messages: mpsc::UnboundedReceiver<String>,
    /// `None` without a ledger: nothing would keep the doubt of a dropped
    /// call, so a cancelled call runs to its end.
    gate: Option<Arc<Gate>>,
}

/// Shared by the watcher and the call's ledger.
#[derive(Default)]
struct Gate {
    /// The client cancelled: announce no further attempt.
    closed: AtomicBool,
    /// The call reached the closed gate and waits there for good.
    parked: AtomicBool,
    /// Attempts the record counts so far: a write-through with more
    /// announces a new attempt.
    attempts: AtomicU32,
}

impl LongCall {
    /// Watches a call made with `cx` for the request of `context`: the
    /// context to make the call with, and its watcher.
    pub(super) fn watch(
        cx: Context,
        spec: Option<&'static ToolSpec>,
        context: &RequestContext<RoleServer>,
    ) -> (Context, Self) {
        let token = context.meta.get_progress_token();
        let (tx, messages) = mpsc::unbounded_channel();
        let mut cx = cx;
        if token.is_some() {
            let verifier = spec.is_some_and(|s| s.has_verifier);
            let sink = Progressing { inner: cx.audit.clone(), tx: tx.clone(), verifier };
            cx = cx.with_audit(Arc::new(sink));
        }
        let mut gate = None;
        if let Some(inner) = cx.ledger.clone() {
            let shared = Arc::new(Gate::default());
            cx = cx.with_ledger(Arc::new(Gated { inner, gate: Arc::clone(&shared), tx }));
            gate = Some(shared);
        }
        let cancelled = Box::pin(context.ct.clone().cancelled_owned());
        (cx, Self { peer: context.peer.clone(), token, cancelled, messages, gate })
    }

    /// Drives `call` to its outcome, sending its progress as it goes (every
    /// notification written before the outcome is returned, none after);
    /// `None` when the client cancelled and the call was dropped at a point
    /// where no attempt was out.
    pub(super) async fn drive<F: Future>(mut self, call: F) -> Option<F::Output> {
        let mut call = pin!(call);
        let mut sending: Option<Boxed> = None;
        let mut sent = 0u32;
        let mut last = None;
        let mut cancelled = false;
        let output = std::future::poll_fn(|task| {
            if !cancelled && self.cancelled.as_mut().poll(task).is_ready() {
                cancelled = true;
                if let Some(gate) = &self.gate {
                    gate.closed.store(true, Ordering::SeqCst);
                }
            }
            if let Poll::Ready(output) = call.as_mut().poll(task) {
                return Poll::Ready(Some(output));
            }
            if cancelled && self.gate.as_ref().is_some_and(|g| g.parked.load(Ordering::SeqCst)) {
                return Poll::Ready(None);
            }
            // One notification on the wire at a time, in order.
            loop {
                if let Some(send) = &mut sending {
                    if send.as_mut().poll(task).is_pending() {
                        break;
                    }
                    sending = None;
                }
                let Poll::Ready(Some(message)) = self.messages.poll_recv(task) else { break };
                if let Some(send) = self.progress(&mut sent, &mut last, message, cancelled) {
                    sending = Some(send);
                }
            }
            Poll::Pending
        })
        .await;
        if output.is_some() && !cancelled {
            // What the call reported on its way out goes before its answer.
            if let Some(send) = sending {
                send.await;
            }
            while let Ok(message) = self.messages.try_recv() {
                if let Some(send) = self.progress(&mut sent, &mut last, message, false) {
                    send.await;
                }
            }
        }
        output
    }

    /// The notification for `message`: none without a token, after a
    /// cancel, or when it says again what the last one said.
    fn progress(
        &self,
        sent: &mut u32,
        last: &mut Option<String>,
        message: String,
        cancelled: bool,
    ) -> Option<Boxed> {
        let token = self.token.clone().filter(|_| !cancelled)?;
        if last.as_ref() == Some(&message) {
            return None;
        }
        *last = Some(message.clone());
        *sent += 1;
        let params = ProgressNotificationParam::new(token, f64::from(*sent)).with_message(message);
        let peer = self.peer.clone();
        Some(Box::pin(async move {
            // A client gone is the transport's to report, not the call's.
            let _ = peer.notify_progress(params).await;
        }))
    }
}

/// The audit sink of a call whose client asked for progress: every event
/// goes on to the set's sink, and each that means waiting is said in
/// words.
struct Progressing {
    inner: Option<Arc<dyn AuditSink>>,
    tx: mpsc::UnboundedSender<String>,
    verifier: bool,
}

impl AuditSink for Progressing {
    fn record(&self, event: &AuditEvent<'_>) {
        if let Some(inner) = &self.inner {
            inner.record(event);
        }
        if let Some(message) = message(event, self.verifier) {
            let _ = self.tx.send(message);
        }
    }
}

/// What a transition means to someone waiting for the call, if anything:
/// the start and the end need no words (the answer follows).
pub(super) fn message(e: &AuditEvent<'_>, verifier: bool) -> Option<String> {
    let n = e.attempt;
    match e.state {
        CallState::Dispatched if n > 1 => Some(format!("retrying: attempt {n} sent")),
        CallState::PendingVisibility => match (e.verdict, e.error_class) {
            (Some(verdict), _) => Some(read(n, verdict, e.settled == Some(true))),
            (None, Some(class)) => Some(failed(n, class, e.error.unwrap_or("no answer"), verifier)),
            (None, None) => e.error.map(str::to_owned),
        },
        _ => None,
    }
}

fn failed(n: u32, class: ErrorClass, error: &str, verifier: bool) -> String {
    let what = match error.starts_with("no answer") {
        true => format!("attempt {n} timed out ({error})"),
        false => format!("attempt {n} failed ({error})"),
    };
    match (class, verifier) {
        (ErrorClass::NotSent, _) => format!("{what}; it was not sent"),
        (_, true) => format!("{what}; checking whether it took effect before retrying"),
        (_, false) => format!("{what}; whether it took effect is unknown"),
    }
}

fn read(n: u32, verdict: Verdict<()>, settled: bool) -> String {
    match (verdict, settled) {
        (Verdict::Holds(()), _) => format!("the check shows attempt {n} took effect"),
        (Verdict::Absent, true) => {
            format!("the check shows attempt {n} did not take effect, and it can no longer")
        }
        (Verdict::Absent, false) => format!(
            "attempt {n} is not visible yet; waiting for its settle margin before believing \
             it did not take effect"
        ),
        (Verdict::Unknown, _) => {
            format!("the check could not tell whether attempt {n} took effect; checking again")
        }
    }
}

/// The set's ledger, seen by one call: it reports waits on the key, and
/// once the gate is closed it parks the call before any new attempt.
struct Gated {
    inner: Arc<dyn Ledger>,
    gate: Arc<Gate>,
    tx: mpsc::UnboundedSender<String>,
}

impl Gated {
    /// Never answers: the watcher drops the call here.
    fn park<T>(&self) -> LedgerFuture<'_, T> {
        LedgerFuture::boxed(async {
            self.gate.parked.store(true, Ordering::SeqCst);
            std::future::pending().await
        })
    }

    fn closed(&self) -> bool {
        self.gate.closed.load(Ordering::SeqCst)
    }

    fn say(&self, message: &str) {
        let _ = self.tx.send(message.to_owned());
    }
}

impl Ledger for Gated {
    fn claim(&self, request: ClaimRequest) -> LedgerFuture<'_, Claim> {
        if self.closed() {
            return self.park();
        }
        LedgerFuture::boxed(async move {
            let claim = self.inner.claim(request).await?;
            match &claim.state {
                Claimed::Fresh(fence) => {
                    // The first attempt goes out right after a fresh claim,
                    // with no write-through of its own: a cancel that came
                    // during the claim stops it here, announced and unsent
                    // (the record counts it: conservative).
                    if self.closed() {
                        self.inner.abandon(claim.key, *fence);
                        self.gate.parked.store(true, Ordering::SeqCst);
                        return std::future::pending().await;
                    }
                    self.gate.attempts.store(request.first.attempts, Ordering::SeqCst);
                }
                Claimed::Resume(_, progress) => {
                    self.gate.attempts.store(progress.attempts, Ordering::SeqCst);
                    self.say(
                        "an earlier request of this call did not finish; checking whether it \
                         took effect before sending anything",
                    );
                }
                Claimed::InFlight(_) => self.say(
                    "another request of this same call is in flight; waiting for its outcome \
                     rather than sending it twice",
                ),
                Claimed::Completed(_) | Claimed::Mismatch => {}
            }
            Ok(claim)
        })
    }

    fn dispatching(
        &self,
        key: IdempotencyKey,
        fence: Fence,
        progress: Progress,
    ) -> LedgerFuture<'_, ()> {
        // Only a write that announces a new attempt is gated: the one after
        // an OK answer announces none, and must land (nothing may be sent
        // under the key after it).
        let announces = progress.attempts > self.gate.attempts.load(Ordering::SeqCst);
        if announces && self.closed() {
            return self.park();
        }
        LedgerFuture::boxed(async move {
            self.inner.dispatching(key, fence, progress).await?;
            self.gate.attempts.fetch_max(progress.attempts, Ordering::SeqCst);
            Ok(())
        })
    }

    fn finish<'a>(
        &'a self,
        key: IdempotencyKey,
        fence: Fence,
        end: End<'a>,
    ) -> LedgerFuture<'a, ()> {
        self.inner.finish(key, fence, end)
    }

    fn abandon(&self, key: IdempotencyKey, fence: Fence) {
        self.inner.abandon(key, fence);
    }

    fn lease(&self) -> Duration {
        self.inner.lease()
    }

    fn hold(&self, key: IdempotencyKey, fence: Fence) -> LedgerFuture<'_, Option<Duration>> {
        self.inner.hold(key, fence)
    }

    fn record(&self, key: IdempotencyKey) -> LedgerFuture<'_, Option<RecordView>> {
        self.inner.record(key)
    }

    fn in_doubt(&self, limit: usize) -> LedgerFuture<'_, Vec<RecordView>> {
        self.inner.in_doubt(limit)
    }

    fn resolve(
        &self,
        key: IdempotencyKey,
        resolution: Resolution,
    ) -> LedgerFuture<'_, Option<RecordState>> {
        self.inner.resolve(key, resolution)
    }
}
