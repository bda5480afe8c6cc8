//! The engine's rules, as one pure function: what happened → what next.
//!
//! The async loop in `engine/mod.rs` carries the decisions out (dispatches,
//! reads the verifier, waits, talks to the ledger); every *choice* is made
//! here, so the whole table can be tested exhaustively (see the tests at the
//! bottom) and each rule is written once.

use crate::{ErrorClass, Mode, SideEffect, UnknownReason};

/// What does not change during a call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Rules {
    pub(crate) class: SideEffect,
    pub(crate) mode: Mode,
    pub(crate) verifier: bool,
    /// Retries after the first attempt, per key.
    pub(crate) retries: u32,
    pub(crate) verify_response: bool,
    /// A check ([`Context::for_check`](crate::Context::for_check)): learn
    /// what became of the call, never dispatch.
    pub(crate) check: bool,
}

/// What the call knows so far.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(crate) struct Facts {
    /// Attempts dispatched under the key, by earlier calls too.
    pub(crate) attempts: u32,
    /// An attempt may have applied the effect and nothing has settled it
    /// since: `NotApplied` would be a lie.
    pub(crate) in_doubt: bool,
    /// An attempt answered OK but its postcondition was not confirmed: the
    /// server has recorded the key, so nothing more goes out under it.
    pub(crate) after_ok: bool,
    /// The call took the key over from earlier calls (in doubt, cancelled,
    /// or past their lease) that sent something, rather than claiming it
    /// fresh; a record under which nothing was ever sent is not one.
    pub(crate) resumed: bool,
    /// The ledger says an earlier call completed but kept no value: the
    /// verifier can give it; nothing may be dispatched.
    pub(crate) completed: bool,
}

/// What just happened.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Event {
    /// The key is ours, fresh: the ledger has no record of it.
    Claimed,
    /// No record could be read (no ledger, or a low-risk call going on
    /// while it is unreachable): nothing is known of earlier calls.
    Unrecorded,
    /// The key is ours, taken over from earlier calls.
    Resumed,
    /// The key completed in an earlier call whose value cannot be replayed.
    Unreplayable,
    /// The attempt answered `Ok`.
    Answered,
    /// The attempt failed with an error of this class.
    Failed(ErrorClass),
    /// The attempt ran past its deadline.
    TimedOut,
    /// The verifier saw the postcondition hold.
    Holds,
    /// The verifier read `Absent` after the last attempt settled.
    Absent,
    /// No believable verdict: the reads were `Unknown`, or `Absent` before
    /// the settle point (`absent_seen`).
    Inconclusive {
        /// Whether some read said `Absent`, too early to be believed.
        absent_seen: bool,
    },
    /// The call cannot go on: the ledger refused or lost a write-through.
    Halted(UnknownReason),
    /// The ledger replayed the outcome of an earlier call that succeeded.
    Replayed,
    /// The tool panicked during an attempt.
    Panicked,
    /// The call's deadline struck at this stage.
    Expired(Stage),
}

/// Where the call is, for what its deadline striking means.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Stage {
    /// Deriving the key: nothing claimed.
    Deriving,
    /// Claiming the key: the ledger has not answered.
    Claiming,
    /// Another call holds the key.
    Waiting,
    /// Between attempts and reads: nothing is out.
    Running,
    /// An attempt is out: its effect is in doubt until it answers.
    Attempting,
}

/// Why a call is refused before it could act.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Refusal {
    /// The ledger did not answer the claim within the call's deadline.
    LedgerSilent,
    /// Another call held the key for the whole of the call's deadline.
    InProgress,
}

/// What to do next.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Next {
    /// Send an attempt (after the backoff, when it follows a failure).
    Dispatch,
    /// Read the verifier.
    Verify,
    /// The effect happened; how it was shown depends on the event.
    Succeed,
    /// A definitive error: the effect did not happen.
    Fail,
    /// The effect is known not to have happened (settled), and no attempt
    /// is left or allowed.
    NotApplied,
    /// In doubt, and nothing more can be done: `Unknown`, or `Escalated`
    /// for an irreversible tool.
    Unresolved(UnknownReason),
    /// Leave the record in doubt and let the tool's panic go on.
    Unwind,
    /// Refused before acting: nothing was sent by this call.
    Refused(Refusal),
}

impl Rules {
    /// The one decision function. `facts` is updated with what the event
    /// teaches (doubt raised or settled).
    pub(crate) fn next(&self, facts: &mut Facts, event: Event) -> Next {
        let next = self.call(facts, event);
        if !self.check {
            return next;
        }
        // A check reads and records; wherever a call would send, it stops
        // with what it knows.
        // Without a record, what was sent under the key is unknown: only
        // the verifier can settle it. A ledger that has none (`Claimed`)
        // knows: every attempt is recorded before it goes out. The one
        // exception, a low-risk call sent while the ledger was unreachable,
        // is what `LedgerOutage::ProceedLowRisk` accepts.
        if event == Event::Unrecorded {
            facts.in_doubt = true;
        }
        // With no verifier to read, a check of a call in doubt ends as a
        // call whose attempts nothing verified.
        let unverified = match self.verifies() {
            true => UnknownReason::VerifierInconclusive,
            false => UnknownReason::RetriesExhausted,
        };
        match (event, next) {
            (Event::Claimed | Event::Unrecorded, _) if self.verifies() => Next::Verify,
            (Event::Claimed | Event::Unrecorded, _) => Next::Unresolved(unverified),
            (_, Next::Dispatch) if facts.in_doubt => Next::Unresolved(unverified),
            (_, Next::Dispatch) => Next::NotApplied,
            (_, next) => next,
        }
    }

    /// The decision of a call that may dispatch.
    fn call(&self, facts: &mut Facts, event: Event) -> Next {
        match event {
            Event::Claimed | Event::Unrecorded => Next::Dispatch,
            Event::Resumed => {
                // Attempts that never left (a check's record, or one a
                // person resolved not applied) leave nothing to keep with
                // whoever was told of it: once verified, it is as fresh.
                facts.resumed = facts.attempts > 0;
                facts.in_doubt = true;
                self.in_doubt(facts)
            }
            Event::Unreplayable => {
                facts.completed = true;
                if self.verifies() {
                    Next::Verify
                } else {
                    Next::Unresolved(UnknownReason::ValueNotRecorded)
                }
            }
            Event::Answered if self.verify_response && self.verifies() => {
                facts.after_ok = true;
                facts.in_doubt = true;
                Next::Verify
            }
            Event::Answered => Next::Succeed,
            // This attempt did not apply; an earlier one sent blindly still
            // may have, so the call cannot say the effect did not happen.
            Event::Failed(ErrorClass::Definitive) if facts.in_doubt => {
                Next::Unresolved(UnknownReason::RetriesExhausted)
            }
            Event::Failed(ErrorClass::Definitive) => Next::Fail,
            // Nothing left the client: this attempt cannot have applied; an
            // earlier one still may have, and is dealt with as such.
            Event::Failed(ErrorClass::NotSent) if facts.in_doubt => self.in_doubt(facts),
            Event::Failed(ErrorClass::NotSent) => {
                if self.mode != Mode::VerifyOnly && self.budget_left(facts) {
                    Next::Dispatch
                } else {
                    Next::NotApplied
                }
            }
            Event::Failed(ErrorClass::Ambiguous | ErrorClass::Conflict) | Event::TimedOut => {
                facts.in_doubt = true;
                self.in_doubt(facts)
            }
            Event::Holds => {
                facts.in_doubt = false;
                Next::Succeed
            }
            Event::Absent if facts.completed => {
                // The ledger says it completed; the verifier cannot see it.
                Next::Unresolved(UnknownReason::ValueNotRecorded)
            }
            Event::Absent => {
                facts.in_doubt = false;
                // After an OK answer the server has recorded the key: a retry
                // under it would replay the incomplete answer (or, ignoring
                // keys, apply the effect again). Completing it is a new call.
                let replayable = !facts.after_ok;
                // An irreversible call that a later call found in doubt stays
                // with whoever was told of it: a repeat never re-sends it.
                let resumed_irreversible = facts.resumed && self.class == SideEffect::Irreversible;
                if self.mode == Mode::VerifyBeforeRetry
                    && replayable
                    && !resumed_irreversible
                    && self.budget_left(facts)
                {
                    Next::Dispatch
                } else {
                    Next::NotApplied
                }
            }
            Event::Inconclusive { .. } if facts.completed => {
                Next::Unresolved(UnknownReason::ValueNotRecorded)
            }
            Event::Inconclusive { absent_seen: true } => Next::Unresolved(UnknownReason::Unsettled),
            Event::Inconclusive { absent_seen: false } => {
                Next::Unresolved(UnknownReason::VerifierInconclusive)
            }
            Event::Halted(reason) => {
                facts.in_doubt = true;
                Next::Unresolved(reason)
            }
            Event::Replayed => Next::Succeed,
            // The tool stopped mid-attempt: what it sent is unknown.
            Event::Panicked => {
                facts.in_doubt = true;
                Next::Unwind
            }
            Event::Expired(Stage::Deriving | Stage::Claiming) => {
                Next::Refused(Refusal::LedgerSilent)
            }
            Event::Expired(Stage::Waiting) => Next::Refused(Refusal::InProgress),
            Event::Expired(Stage::Attempting) => {
                facts.in_doubt = true;
                Next::Unresolved(UnknownReason::DeadlineExceeded)
            }
            Event::Expired(Stage::Running) if facts.in_doubt => {
                Next::Unresolved(UnknownReason::DeadlineExceeded)
            }
            // The ledger says it completed: never "not applied".
            Event::Expired(Stage::Running) if facts.completed => {
                Next::Unresolved(UnknownReason::ValueNotRecorded)
            }
            Event::Expired(Stage::Running) => Next::NotApplied,
        }
    }

    /// The effect may have happened: look if we can, retry blindly only
    /// where a duplicate is harmless or the mode is the retry-only baseline.
    fn in_doubt(&self, facts: &Facts) -> Next {
        if self.verifies() {
            return Next::Verify;
        }
        let blind_retry = self.mode != Mode::VerifyOnly
            && self.class != SideEffect::Irreversible
            && !facts.after_ok
            && self.budget_left(facts);
        if blind_retry { Next::Dispatch } else { Next::Unresolved(UnknownReason::RetriesExhausted) }
    }

    fn verifies(&self) -> bool {
        self.verifier && self.mode != Mode::RetryOnly
    }

    /// Whether another attempt is within the key's budget of `1 + retries`.
    pub(crate) fn budget_left(&self, facts: &Facts) -> bool {
        facts.attempts <= self.retries
    }
}

/// Whether to wait the backoff before `next`: after an attempt that failed
/// or timed out, before the next attempt or verifier read.
pub(crate) fn backs_off(event: Event, next: Next) -> bool {
    matches!(event, Event::Failed(_) | Event::TimedOut)
        && matches!(next, Next::Dispatch | Next::Verify)
}

/// Whether an unresolved call goes to a person: an irreversible one, unless
/// another call took its key over (that call owns the outcome now).
pub(crate) fn escalates(class: SideEffect, reason: UnknownReason) -> bool {
    class == SideEffect::Irreversible && reason != UnknownReason::Superseded
}

#[cfg(test)]
mod tests {
    use super::*;

    const CLASSES: [SideEffect; 4] = SideEffect::ALL;
    const MODES: [Mode; 3] = [Mode::VerifyBeforeRetry, Mode::RetryOnly, Mode::VerifyOnly];

    fn events() -> Vec<Event> {
        let mut all = vec![
            Event::Claimed,
            Event::Unrecorded,
            Event::Resumed,
            Event::Unreplayable,
            Event::Answered,
            Event::TimedOut,
            Event::Holds,
            Event::Absent,
            Event::Inconclusive { absent_seen: false },
            Event::Inconclusive { absent_seen: true },
            Event::Halted(UnknownReason::Superseded),
            Event::Halted(UnknownReason::LedgerUnavailable),
            Event::Replayed,
            Event::Panicked,
        ];
        for stage in
            [Stage::Deriving, Stage::Claiming, Stage::Waiting, Stage::Running, Stage::Attempting]
        {
            all.push(Event::Expired(stage));
        }
        for class in [
            ErrorClass::Definitive,
            ErrorClass::NotSent,
            ErrorClass::Ambiguous,
            ErrorClass::Conflict,
        ] {
            all.push(Event::Failed(class));
        }
        all
    }

    /// Every combination of rules, facts and event.
    fn table() -> Vec<(Rules, Facts, Event, Facts, Next)> {
        let mut rows = Vec::new();
        for class in CLASSES {
            for mode in MODES {
                for verifier in [false, true] {
                    for retries in 0..3 {
                        for (verify_response, check) in
                            [(false, false), (true, false), (false, true), (true, true)]
                        {
                            let rules =
                                Rules { class, mode, verifier, retries, verify_response, check };
                            for bits in 0..16u8 {
                                for attempts in 0..4 {
                                    let facts = Facts {
                                        attempts,
                                        in_doubt: bits & 1 != 0,
                                        after_ok: bits & 2 != 0,
                                        resumed: bits & 4 != 0,
                                        completed: bits & 8 != 0,
                                    };
                                    for event in events() {
                                        let mut after = facts;
                                        let next = rules.next(&mut after, event);
                                        rows.push((rules, facts, event, after, next));
                                    }
                                }
                            }
                        }
                    }
                }
            }
        }
        rows
    }

    #[test]
    fn a_check_never_dispatches_and_succeeds_only_by_the_verifier() {
        for (rules, facts, event, after, next) in table() {
            if !rules.check {
                continue;
            }
            assert_ne!(next, Next::Dispatch, "{rules:?} {facts:?} {event:?}");
            if next == Next::NotApplied {
                assert!(!after.in_doubt, "{rules:?} {facts:?} {event:?}");
            }
            if matches!(event, Event::Claimed | Event::Unrecorded) {
                assert!(matches!(next, Next::Verify | Next::Unresolved(_)), "{rules:?}");
            }
            // Without a record the check knows nothing of what was sent.
            if event == Event::Unrecorded {
                assert!(after.in_doubt, "{rules:?} {facts:?}");
            }
            // Only a verifier can be inconclusive (and only a verifier's
            // events follow a read).
            let read = matches!(event, Event::Holds | Event::Absent | Event::Inconclusive { .. });
            if (!rules.verifier || rules.mode == Mode::RetryOnly) && !read {
                let blamed = Next::Unresolved(UnknownReason::VerifierInconclusive);
                assert_ne!(next, blamed, "{rules:?} {facts:?} {event:?}");
            }
        }
    }

    #[test]
    fn what_the_ledger_says_completed_is_never_not_applied_nor_failed() {
        for (rules, facts, event, _, next) in table() {
            // What can follow an unreplayable completion: reads and the end.
            let after_completion = matches!(
                event,
                Event::Holds
                    | Event::Absent
                    | Event::Inconclusive { .. }
                    | Event::Halted(_)
                    | Event::Expired(_)
            );
            if facts.completed && after_completion {
                assert!(
                    !matches!(next, Next::NotApplied | Next::Fail | Next::Dispatch),
                    "{rules:?} {facts:?} {event:?} {next:?}"
                );
            }
        }
    }

    #[test]
    fn an_irreversible_call_in_doubt_is_never_dispatched_again() {
        for (rules, facts, event, _, next) in table() {
            if rules.class != SideEffect::Irreversible || next != Next::Dispatch {
                continue;
            }
            // Only a fresh claim, an attempt that never left, or a settled
            // Absent in the call that sent it may dispatch.
            let allowed = matches!(event, Event::Claimed | Event::Unrecorded)
                || (event == Event::Failed(ErrorClass::NotSent) && !facts.in_doubt)
                || (event == Event::Absent && !facts.resumed && !facts.completed);
            assert!(allowed, "{rules:?} {facts:?} {event:?}");
        }
    }

    #[test]
    fn nothing_is_dispatched_beyond_the_budget_nor_after_holds() {
        for (rules, facts, event, _, next) in table() {
            if next != Next::Dispatch || matches!(event, Event::Claimed | Event::Unrecorded) {
                continue;
            }
            assert!(facts.attempts <= rules.retries, "{rules:?} {facts:?} {event:?}");
            assert_ne!(event, Event::Holds);
            assert!(!facts.completed || event != Event::Absent, "completed calls never re-send");
        }
    }

    #[test]
    fn a_retry_in_doubt_needs_a_settled_absent_unless_blind_retries_are_allowed() {
        for (rules, facts, event, _, next) in table() {
            if next != Next::Dispatch {
                continue;
            }
            let doubt_event = matches!(
                event,
                Event::TimedOut
                    | Event::Resumed
                    | Event::Failed(ErrorClass::Ambiguous | ErrorClass::Conflict)
            ) || (event == Event::Failed(ErrorClass::NotSent) && facts.in_doubt);
            if doubt_event {
                // Blind: only where no verifier is used, never irreversible,
                // never in verify-only mode, never after an OK answer.
                assert!(!rules.verifier || rules.mode == Mode::RetryOnly, "{rules:?} {event:?}");
                assert_ne!(rules.class, SideEffect::Irreversible);
                assert_ne!(rules.mode, Mode::VerifyOnly);
                assert!(!facts.after_ok);
            }
        }
    }

    #[test]
    fn success_only_from_an_answer_or_the_verifier() {
        for (rules, _, event, _, next) in table() {
            if next == Next::Succeed {
                assert!(
                    matches!(event, Event::Answered | Event::Holds | Event::Replayed),
                    "{rules:?} {event:?}"
                );
            }
        }
    }

    #[test]
    fn not_applied_only_when_nothing_is_in_doubt() {
        for (rules, facts, event, after, next) in table() {
            if next == Next::NotApplied {
                assert!(!after.in_doubt, "{rules:?} {facts:?} {event:?}");
                assert!(
                    matches!(
                        event,
                        Event::Absent
                            | Event::Failed(ErrorClass::NotSent)
                            | Event::Expired(Stage::Running)
                    ),
                    "{rules:?} {facts:?} {event:?}"
                );
            }
        }
    }

    #[test]
    fn failed_only_when_nothing_is_in_doubt() {
        for (rules, facts, event, _, next) in table() {
            if next == Next::Fail {
                assert!(!facts.in_doubt, "{rules:?} {facts:?} {event:?}");
                assert_eq!(event, Event::Failed(ErrorClass::Definitive));
            }
        }
    }

    #[test]
    fn verify_only_and_retry_only_keep_to_their_arm() {
        for (rules, _, event, _, next) in table() {
            if rules.mode == Mode::VerifyOnly && next == Next::Dispatch {
                assert!(matches!(event, Event::Claimed | Event::Unrecorded), "{rules:?}");
            }
            if rules.mode == Mode::RetryOnly {
                assert_ne!(next, Next::Verify, "{rules:?} {event:?}")
            }
        }
    }

    #[test]
    fn doubt_is_remembered_until_the_verifier_settles_it() {
        for (rules, facts, event, after, _) in table() {
            match event {
                Event::TimedOut
                | Event::Resumed
                | Event::Halted(_)
                | Event::Panicked
                | Event::Expired(Stage::Attempting) => assert!(after.in_doubt),
                Event::Failed(ErrorClass::Ambiguous | ErrorClass::Conflict) => {
                    assert!(after.in_doubt)
                }
                Event::Holds => assert!(!after.in_doubt),
                Event::Absent if !facts.completed => assert!(!after.in_doubt),
                Event::Unrecorded if rules.check => assert!(after.in_doubt),
                _ if event != Event::Answered => {
                    assert_eq!(after.in_doubt, facts.in_doubt, "{rules:?} {event:?}")
                }
                _ => {}
            }
        }
    }

    #[test]
    fn a_deadline_with_an_attempt_out_is_never_not_applied_nor_a_refusal() {
        for (rules, facts, event, after, next) in table() {
            match event {
                Event::Expired(Stage::Attempting) => {
                    assert_eq!(next, Next::Unresolved(UnknownReason::DeadlineExceeded));
                    assert!(after.in_doubt);
                }
                Event::Expired(Stage::Running) => {
                    let expected = match (facts.in_doubt, facts.completed) {
                        (true, _) => Next::Unresolved(UnknownReason::DeadlineExceeded),
                        (false, true) => Next::Unresolved(UnknownReason::ValueNotRecorded),
                        (false, false) => Next::NotApplied,
                    };
                    assert_eq!(next, expected, "{rules:?} {facts:?}");
                }
                Event::Expired(_) => assert!(matches!(next, Next::Refused(_)), "{rules:?}"),
                _ => assert!(!matches!(next, Next::Refused(_)), "{rules:?} {event:?}"),
            }
        }
    }

    #[test]
    fn a_panic_always_unwinds_in_doubt_and_nothing_else_does() {
        for (rules, _, event, after, next) in table() {
            assert_eq!(event == Event::Panicked, next == Next::Unwind, "{rules:?} {event:?}");
            if next == Next::Unwind {
                assert!(after.in_doubt);
            }
        }
    }

    #[test]
    fn an_irreversible_record_nothing_was_sent_under_is_verified_then_sent() {
        let rules = Rules {
            class: SideEffect::Irreversible,
            mode: Mode::VerifyBeforeRetry,
            verifier: true,
            retries: 0,
            verify_response: false,
            check: false,
        };
        let mut never = Facts::default();
        assert_eq!(rules.next(&mut never, Event::Resumed), Next::Verify);
        assert_eq!(rules.next(&mut never, Event::Absent), Next::Dispatch);
        // The control: one attempt went out under it; it stays with whoever
        // was told of it.
        let mut sent = Facts { attempts: 1, ..Facts::default() };
        assert_eq!(rules.next(&mut sent, Event::Resumed), Next::Verify);
        assert_eq!(rules.next(&mut sent, Event::Absent), Next::NotApplied);
    }

    #[test]
    fn the_paper_s_algorithm_is_one_path_through_the_table() {
        let rules = Rules {
            class: SideEffect::High,
            mode: Mode::VerifyBeforeRetry,
            verifier: true,
            retries: 1,
            verify_response: false,
            check: false,
        };
        let mut facts = Facts { attempts: 1, ..Facts::default() };
        assert_eq!(rules.next(&mut facts, Event::TimedOut), Next::Verify);
        assert_eq!(rules.next(&mut facts, Event::Absent), Next::Dispatch);
        facts.attempts = 2;
        assert_eq!(rules.next(&mut facts, Event::TimedOut), Next::Verify);
        assert_eq!(rules.next(&mut facts, Event::Absent), Next::NotApplied);
        let mut facts = Facts { attempts: 1, ..Facts::default() };
        assert_eq!(rules.next(&mut facts, Event::TimedOut), Next::Verify);
        assert_eq!(
            rules.next(&mut facts, Event::Inconclusive { absent_seen: true }),
            Next::Unresolved(UnknownReason::Unsettled)
        );
    }
}
