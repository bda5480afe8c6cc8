//! The ledger contract's cases come from the kit the crate exports
//! (`verified_tools::ledger::kit`, feature `ledger-kit`): the project's own
//! backends run them through the door a third party's would. What stays
//! here is the harness: one `#[test]` per case, and an invoice service for
//! the engine-level tests of a backend.

pub use verified_tools::ledger::kit::*;

/// One `#[test]` per suite test, for the backend `$make` builds (`None`:
/// its server is missing, see `support::missing`).
///
/// `operator = true` adds the cases of the operator's door. A backend that
/// implements `record`, `in_doubt` and `resolve` must list it; the in-memory
/// ledger does not implement them yet, and joins by writing
/// `conformance!(Some(Memory), paused = true, operator = true)`.
#[macro_export]
macro_rules! conformance {
    ($make:expr, paused = $paused:expr, operator = true) => {
        $crate::conformance!($make, paused = $paused);
        $crate::conformance!(@tests $make, $paused;
            a_record_in_doubt_is_listed_and_shown,
            the_listing_is_bounded_by_its_limit,
            a_held_record_is_neither_listed_nor_resolved,
            a_decision_never_overwrites_what_a_call_proved,
            resolving_applied_completes_the_call_without_a_value,
            resolving_not_applied_gives_the_call_its_whole_budget,
            a_hold_past_its_lease_is_in_doubt_and_its_holder_is_fenced_by_a_decision,
            resolved_records_expire_like_finished_ones,
            an_unknown_key_has_no_record_and_resolves_to_none,
        );
    };
    ($make:expr, paused = $paused:expr) => {
        $crate::conformance!(@tests $make, $paused;
            fresh_claim_then_in_flight,
            concurrent_claims_give_one_holder,
            completed_value_is_replayed_by_another_handle,
            unserializable_value_is_completed_without_value,
            another_payload_is_a_mismatch,
            takeover_after_the_lease_fences_the_old_holder,
            budget_and_settle_time_carry_across_handles,
            abandon_ends_the_hold_at_once,
            settled_records_resume_with_their_budget,
            completed_records_expire_in_doubt_never,
            previous_bucket_record_answers_the_claim,
            fences_grow_across_keys_and_handles,
            hold_answers_for_its_fence_only_while_it_holds,
            hold_ends_with_the_lease_and_stays_ended_after_a_takeover,
        );
    };
    (@tests $make:expr, $paused:expr; $($name:ident,)*) => {
        $(
            #[test]
            fn $name() {
                $crate::suite::run($make, $paused, $crate::suite::$name);
            }
        )*
    };
}

/// An invoice service for the engine-level tests of a backend: it counts
/// what it was sent, and its verifier sees exactly that (a `high` tool reads
/// its OK answer back).
#[derive(Default)]
pub struct Invoices {
    sent: std::sync::Mutex<std::collections::HashSet<u64>>,
    dispatched: std::sync::atomic::AtomicU32,
}

static SEND_INVOICE: verified_tools::ToolSpec =
    verified_tools::ToolSpec::new("send_invoice", verified_tools::SideEffect::High).with_verifier();

impl Invoices {
    /// Sends `invoice` through the engine in `cx`.
    pub async fn send(
        &self,
        cx: &verified_tools::Context,
        invoice: u64,
    ) -> verified_tools::ToolResult<u64, std::io::Error> {
        use std::sync::atomic::Ordering;
        verified_tools::engine::call(
            cx,
            &SEND_INVOICE,
            &(invoice,),
            &(invoice,),
            |_attempt| {
                self.dispatched.fetch_add(1, Ordering::SeqCst);
                self.sent.lock().unwrap().insert(invoice);
                async move { Ok(invoice) }
            },
            Some(|_key| async move {
                match self.sent.lock().unwrap().contains(&invoice) {
                    true => verified_tools::Verdict::Holds(invoice),
                    false => verified_tools::Verdict::Absent,
                }
            }),
            verified_tools::ledger::Codec::serde(),
        )
        .await
    }

    /// Attempts dispatched so far.
    pub fn dispatched(&self) -> u32 {
        self.dispatched.load(std::sync::atomic::Ordering::SeqCst)
    }
}
