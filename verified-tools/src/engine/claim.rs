//! The call's hold on its key: claiming it (a repeat replays, a call in
//! doubt is verified first, a call in flight is waited for), and the guard
//! that abandons it if the call is dropped.

use std::any::Any;
use std::sync::Arc;
use std::time::Duration;

use crate::clock;

use super::decide::Event;
use super::decide::Stage;
use super::{Call, Fail, Out};
use crate::context::LedgerOutage;
use crate::key::Derived;
use crate::ledger::{
    ClaimRequest, Claimed, Codec, End, Fence, Ledger, LedgerError, Progress, Recorded, Replay,
    Settle,
};
use crate::tool::Tool;
use crate::{CallError, Cause, IdempotencyKey, SideEffect, ToolResult};

/// A held ledger key. Dropped while armed (the call's future was cancelled,
/// or unwound), it abandons the hold: the record stays in doubt, so the next
/// call with the key verifies before it dispatches.
pub(super) struct Hold<'a> {
    pub(super) ledger: &'a dyn Ledger,
    pub(super) key: IdempotencyKey,
    pub(super) fence: Fence,
}

impl Hold<'_> {
    pub(super) async fn close(self, end: End<'_>) -> Result<(), LedgerError> {
        // Still armed while the store answers: cancelled mid-way, the drop
        // abandons the hold (a no-op if the end was written).
        let result = self.ledger.finish(self.key, self.fence, end).await;
        std::mem::forget(self);
        result
    }
}

impl Drop for Hold<'_> {
    fn drop(&mut self) {
        self.ledger.abandon(self.key, self.fence);
    }
}

/// A success's value, offered to the ledger.
pub(super) struct Value<'v, T> {
    pub(super) value: &'v T,
    pub(super) codec: Codec<T>,
}

impl<T: Clone + Send + Sync + 'static> Recorded for Value<'_, T> {
    fn local(&self) -> Arc<dyn Any + Send + Sync> {
        Arc::new(self.value.clone())
    }

    fn encode(&self) -> Option<Vec<u8>> {
        self.codec.encode(self.value)
    }
}

impl<'a, X: Tool> Call<'a, X> {
    /// Claims the key in the ledger: a repeat returns the recorded outcome, a
    /// call in doubt is verified first, a call in flight is waited for.
    pub(super) async fn claim(
        &mut self,
        ledger: &'a dyn Ledger,
        derived: Derived,
    ) -> Result<Event, ToolResult<Out<X>, Fail<X>>> {
        let (cx, tool) = (self.cx, self.spec.name);
        let lease = ledger.lease();
        if lease < self.policy.call_timeout {
            let call_timeout = self.policy.call_timeout;
            return Err(ToolResult::Refused(CallError::LeaseTooShort {
                tool,
                lease,
                call_timeout,
            }));
        }
        self.stage = Stage::Claiming;
        let mut request = self.request(derived);
        // The wait is measured on the clock, not summed from the polls: a
        // 1 ms poll sleeps longer than 1 ms in real time.
        let mut waiting_since = None;
        loop {
            let claim = ledger.claim(request);
            // A store's answer may take time; one computed at once does not.
            let waited = !claim.is_ready();
            let claim = match claim.await {
                Ok(claim) => claim,
                Err(_) if self.outage_tolerated() => {
                    self.first_at = None;
                    return Ok(Event::Unrecorded);
                }
                Err(source) => {
                    let key = derived.key;
                    return Err(ToolResult::Refused(CallError::Ledger { tool, key, source }));
                }
            };
            let key = claim.key;
            self.key = Some(key);
            match claim.state {
                Claimed::Fresh(fence) => {
                    self.hold = Some(Hold { ledger, key, fence });
                    self.first_recorded = true;
                    // The record counts the first attempt from `first_at`:
                    // if the store took that attempt's whole time to answer,
                    // it goes from now, written through with its own settle
                    // point (the clock is read only after a store's answer,
                    // not after one computed at once).
                    if waited && let Some(at) = self.first_at {
                        let now = self.timeline.at(self.now());
                        if self.timeline.attempt(at) <= now {
                            self.first_at = None;
                            self.first_recorded = false;
                        }
                    }
                    return Ok(Event::Claimed);
                }
                Claimed::Resume(fence, progress) => {
                    self.hold = Some(Hold { ledger, key, fence });
                    // The first attempt, if this call makes it, follows a
                    // verification: its time is read then.
                    self.first_at = None;
                    // The budget is per logical call: earlier attempts count.
                    self.facts.attempts = progress.attempts;
                    self.facts.after_ok = progress.after_ok;
                    let at = self.timeline.at(self.now());
                    self.timeline.resumed(at, progress.settle);
                    // Say only what the record shows: a record whose
                    // attempts are none (made by a check, or resolved not
                    // applied by a person) was never sent.
                    let cause = match progress {
                        Progress { after_ok: true, .. } => Cause::Unconfirmed,
                        Progress { attempts: 0, .. } => Cause::NeverSent,
                        _ => Cause::Interrupted,
                    };
                    self.cause = Some(cause);
                    return Ok(Event::Resumed);
                }
                Claimed::Completed(replay) => {
                    let value = match replay {
                        Replay::Local(value) => value.downcast_ref::<Out<X>>().cloned(),
                        Replay::Encoded(bytes) => self.tool.codec().decode(&bytes),
                        Replay::Unrecorded => None,
                    };
                    return Ok(match value {
                        Some(value) => {
                            self.value = Some(value);
                            Event::Replayed
                        }
                        None => Event::Unreplayable,
                    });
                }
                Claimed::Mismatch => {
                    return Err(ToolResult::Refused(CallError::KeyReuse { tool, key }));
                }
                Claimed::InFlight(lease_left) => {
                    let since = *waiting_since.get_or_insert(request.now);
                    let waited = self.now().saturating_duration_since(since);
                    match cx.in_flight() {
                        crate::InFlight::Wait { poll, max } if waited < max => {
                            self.stage = Stage::Waiting;
                            let step = poll.min(max - waited).min(lease_left);
                            clock::sleep(cx.clock(), step.max(Duration::from_millis(1))).await;
                            self.stage = Stage::Claiming;
                            // Claimed now, the first attempt counts from now.
                            request.now = self.now();
                            let at = self.timeline.at(request.now);
                            request.first = self.first_progress(at);
                            self.first_at = Some(at);
                        }
                        _ => return Err(ToolResult::Refused(CallError::InProgress { tool, key })),
                    }
                }
            }
        }
    }

    /// The claim of this call's key, its first attempt recorded with it.
    pub(super) fn request(&self, derived: Derived) -> ClaimRequest {
        ClaimRequest {
            key: derived.key,
            fingerprint: derived.fingerprint,
            previous: derived.previous,
            first: self.first_progress(Duration::ZERO),
            now: self.started,
        }
    }

    /// The first attempt as a claim records it, were it sent at `at`.
    fn first_progress(&self, at: Duration) -> Progress {
        // A check dispatches nothing: a record it creates says so.
        if self.rules.check {
            return Progress { attempts: 0, after_ok: false, settle: Settle::NOW };
        }
        let mut first = self.timeline;
        first.dispatched(first.attempt(at));
        Progress { attempts: 1, after_ok: false, settle: first.settle(at) }
    }

    /// Whether a low-risk call may go on while the ledger is unreachable.
    fn outage_tolerated(&self) -> bool {
        self.cx.ledger_outage() == LedgerOutage::ProceedLowRisk
            && self.spec.side_effect <= SideEffect::Low
    }
}
