//! Reading the verifier: until the effect is shown, or shown absent once the
//! last attempt has settled, or the reads run out.

use std::panic::AssertUnwindSafe;

use super::decide::Event;
use super::outcome::Detail;
use super::{Call, Out, catch_unwind};
use crate::audit::CallState;
use crate::clock;
use crate::ledger::Progress;
use crate::tool::Tool;
use crate::{Cause, Verdict};

impl<'a, X: Tool> Call<'a, X> {
    /// Reads the verifier until the effect is shown, or shown absent after
    /// the last attempt settled, or the reads run out.
    pub(super) async fn verify(&mut self, after: Event) -> Event {
        if after == Event::Answered {
            // An OK answer the verifier must confirm: the service may still
            // hide it for the settle margin. Nothing more goes out under the
            // key (a takeover must know).
            let now = self.timeline.at(self.now());
            self.timeline.dispatched(now);
            self.cause = Some(Cause::Unconfirmed);
            if let Some(hold) = &self.hold {
                let progress = Progress {
                    attempts: self.facts.attempts,
                    after_ok: true,
                    settle: self.timeline.settle(now),
                };
                if let Err(error) = hold.ledger.dispatching(hold.key, hold.fence, progress).await {
                    return self.halted(error);
                }
            }
        }
        if after == Event::Unrecorded {
            // A check with no record (no ledger, or a tolerated outage):
            // when the call's attempts went out is unknown, and one may be
            // out now. Any of them settles by the time one sent now would;
            // an `Absent` before then says nothing.
            let now = self.timeline.at(self.now());
            self.timeline.dispatched(self.timeline.attempt(now));
        }
        // An early `Absent` of an earlier round said nothing of the attempts
        // sent since.
        self.absent_seen = false;
        let budget = self.policy.base.verify;
        for read in 0..budget.reads.max(1) {
            if read > 0 {
                clock::sleep(self.cx.clock(), budget.interval).await;
            }
            if let Some(event) = self.read().await {
                return event;
            }
        }
        // The reads ran out before the last attempt settled: wait for it and
        // read once more, if the call's deadline comes later.
        if let Some(at) = self.timeline.settles_in_time()
            && self.timeline.at(self.now()) < at
        {
            self.cx.clock().sleep_until(self.timeline.instant(at).into_std()).await;
            if let Some(event) = self.read().await {
                return event;
            }
        }
        Event::Inconclusive { absent_seen: self.absent_seen }
    }

    /// One verifier read: an event if it settles the question.
    async fn read(&mut self) -> Option<Event> {
        // The read saw the state as of when it started: that is the time to
        // hold against the settle point.
        let started = self.timeline.at(self.now());
        let verdict = self.read_verifier().await;
        let settled = self.timeline.settled(started);
        self.note(CallState::PendingVisibility, Detail::Read(verdict.kind(), settled));
        match verdict {
            Verdict::Holds(value) => {
                self.value = Some(value);
                Some(Event::Holds)
            }
            Verdict::Absent if settled => Some(Event::Absent),
            Verdict::Absent => {
                self.absent_seen = true;
                None
            }
            Verdict::Unknown => None,
        }
    }

    /// One verifier read: a panic, a timeout or a failed read is `Unknown`.
    async fn read_verifier(&mut self) -> Verdict<Out<X>> {
        let key = self.key();
        if !self.tool.verifies() {
            return Verdict::Unknown;
        }
        let limit = self.policy.attempt_timeout;
        let (tool, clock) = (&mut self.tool, self.cx.clock());
        let Ok(read) = std::panic::catch_unwind(AssertUnwindSafe(move || {
            let tool = tool;
            tool.verify(key)
        })) else {
            return Verdict::Unknown;
        };
        let guarded = catch_unwind(read);
        // Bounded by the attempt timeout; without one, by the call deadline.
        let verdict = match limit {
            Some(limit) => {
                let at = crate::deadline::later_std(clock.now(), limit);
                clock::within(clock, at, guarded).await.and_then(Result::ok)
            }
            None => guarded.await.ok(),
        };
        verdict.unwrap_or(Verdict::Unknown)
    }
}
