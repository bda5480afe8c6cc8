//! Scenario tests of the engine against the scripted fake.

mod fake;

use std::sync::Arc;
use std::time::Duration;

use fake::{Attempt, Event, Fake, FakeError, Read};
use verified_tools::audit::{CallState, JsonLinesAudit, MemoryAudit};
use verified_tools::escalation::MemoryEscalations;
use verified_tools::ledger::Codec;
use verified_tools::ledger::MemoryLedger;
use verified_tools::{
    CallError, Cause, Context, IdempotencyKey, InFlight, Mode, Proof, RetryPolicy, SideEffect,
    ToolResult, ToolSpec, UnknownReason, Verdict, VerifyBudget, engine,
};

static HIGH: ToolSpec = ToolSpec::new("send_welcome", SideEffect::High).with_verifier();
static LOW: ToolSpec = ToolSpec::new("save_draft", SideEffect::Low);
static PAY: ToolSpec = ToolSpec::new("pay", SideEffect::Irreversible).with_verifier();
static CONFIRM: ToolSpec =
    ToolSpec::new("record", SideEffect::High).with_verifier().with_verify_response(true);
// Opted out: these tests are about an OK answer being believed.
static BELIEVE: ToolSpec =
    ToolSpec::new("send_welcome", SideEffect::High).with_verifier().with_verify_response(false);

type Out = ToolResult<u32, FakeError>;

async fn run(cx: &Context, spec: &'static ToolSpec, fake: &Fake) -> Out {
    engine::call(
        cx,
        spec,
        &(42u64,),
        &(42u64,),
        move |a| fake.send(a),
        Some(move |_| fake.check()),
        Codec::serde(),
    )
    .await
}

async fn run_unverified(cx: &Context, spec: &'static ToolSpec, fake: &Fake) -> Out {
    engine::call(
        cx,
        spec,
        &(42u64,),
        &(42u64,),
        move |a| fake.send(a),
        engine::no_verifier(),
        Codec::serde(),
    )
    .await
}

/// The policy of these tests: attempts time out after 100 ms, and the
/// service settles as soon as an attempt's deadline has passed; so the first
/// verifier read (after the 200 ms backoff) is believed. `timing.rs` tests
/// reads before the settle point.
fn policy(class: SideEffect) -> RetryPolicy {
    RetryPolicy::for_class(class)
        .with_attempt_timeout(Some(Duration::from_millis(100)))
        .with_settle(Some(Duration::ZERO))
}

fn cx() -> Context {
    Context::new("agent-1").map_policies(|class, _| policy(class))
}

#[tokio::test(start_paused = true)]
async fn ok_response_is_a_success_without_verifying() {
    let fake = Fake::new(&[Attempt::Ok], &[]);
    let r = run(&cx(), &BELIEVE, &fake).await;
    assert!(matches!(r, ToolResult::Success { value: 1, proof: Proof::Response, .. }), "{r:?}");
    assert_eq!(fake.reads(), 0);
}

#[tokio::test(start_paused = true)]
async fn timeout_after_apply_is_verified_not_retried() {
    let fake = Fake::new(&[Attempt::TimeoutApplied], &[]).ignoring_keys();
    let r = run(&cx(), &HIGH, &fake).await;
    assert!(matches!(r, ToolResult::Success { value: 1, proof: Proof::Verifier, .. }), "{r:?}");
    assert_eq!(fake.dispatches().len(), 1);
    assert_eq!(fake.applied(), 1);
}

#[tokio::test(start_paused = true)]
async fn confirmed_absent_is_retried_once_with_the_same_key() {
    let fake = Fake::new(&[Attempt::TimeoutLost, Attempt::Ok], &[]);
    let r = run(&cx(), &HIGH, &fake).await;
    assert!(matches!(r, ToolResult::Success { proof: Proof::Verifier, .. }), "{r:?}");
    let keys = fake.dispatches();
    assert_eq!(keys.len(), 2);
    assert_eq!(keys[0], keys[1]);
    assert_eq!(r.key(), Some(keys[0]));
    // The retry came right after an Absent read; its OK answer was read back.
    assert_eq!(
        fake.log()[1..],
        [Event::Read(Verdict::Absent), Event::Dispatch(keys[0]), Event::Read(Verdict::Holds(()))]
    );
}

#[tokio::test(start_paused = true)]
async fn budget_exhausted_with_the_effect_absent_is_not_applied() {
    let fake = Fake::new(&[Attempt::TimeoutLost, Attempt::TimeoutLost, Attempt::Ok], &[]);
    let r = run(&cx(), &HIGH, &fake).await;
    assert!(
        matches!(r, ToolResult::NotApplied { cause: Cause::Error(FakeError::Timeout), .. }),
        "{r:?}"
    );
    assert_eq!(fake.dispatches().len(), 2, "1 + retries(1) attempts");
    assert_eq!(fake.applied(), 0);
}

#[tokio::test(start_paused = true)]
async fn retries_follow_the_policy() {
    let cx = cx().with_policy(SideEffect::High, policy(SideEffect::High).with_retries(3));
    let fake = Fake::new(&[Attempt::TimeoutLost; 3], &[]);
    let r = run(&cx, &HIGH, &fake).await;
    assert!(r.is_success(), "{r:?}");
    assert_eq!(fake.dispatches().len(), 4);
}

#[tokio::test(start_paused = true)]
async fn verifier_unknown_for_the_whole_budget_is_unknown() {
    let fake = Fake::new(&[Attempt::TimeoutApplied], &[Read::Unknown; 10]);
    let r = run(&cx(), &HIGH, &fake).await;
    assert!(
        matches!(r, ToolResult::Unknown { reason: UnknownReason::VerifierInconclusive, .. }),
        "{r:?}"
    );
    assert_eq!(fake.reads(), VerifyBudget::DEFAULT.reads as usize);
    assert_eq!(fake.dispatches().len(), 1, "never a retry without Absent");
}

#[tokio::test(start_paused = true)]
async fn delayed_visibility_resolves_within_the_read_budget() {
    let fake = Fake::new(&[Attempt::TimeoutApplied], &[Read::Unknown, Read::Unknown]);
    let r = run(&cx(), &HIGH, &fake).await;
    assert!(matches!(r, ToolResult::Success { proof: Proof::Verifier, .. }), "{r:?}");
    assert_eq!(fake.reads(), 3);
}

#[tokio::test(start_paused = true)]
async fn a_panicking_verifier_counts_as_unknown() {
    let fake = Fake::new(&[Attempt::TimeoutApplied], &[Read::Panic, Read::Panic, Read::Panic]);
    let r = run(&cx(), &HIGH, &fake).await;
    assert!(matches!(r, ToolResult::Unknown { .. }), "{r:?}");
    assert_eq!(fake.dispatches().len(), 1);
}

#[tokio::test(start_paused = true)]
async fn definitive_errors_fail_at_once() {
    let fake = Fake::new(&[Attempt::Definitive], &[]);
    let r = run(&cx(), &HIGH, &fake).await;
    assert!(matches!(r, ToolResult::Failed { error: FakeError::Invalid, .. }), "{r:?}");
    assert_eq!(fake.log().len(), 1, "no verifier read, no retry");
}

#[tokio::test(start_paused = true)]
async fn conflicts_are_rechecked_before_a_retry() {
    let fake = Fake::new(&[Attempt::Conflict, Attempt::Ok], &[]);
    let r = run(&cx(), &HIGH, &fake).await;
    assert!(r.is_success(), "{r:?}");
    let log = fake.log();
    assert!(
        matches!(
            log[..],
            [
                Event::Dispatch(_),
                Event::Read(Verdict::Absent),
                Event::Dispatch(_),
                Event::Read(Verdict::Holds(()))
            ]
        ),
        "{log:?}"
    );
}

#[tokio::test(start_paused = true)]
async fn attempt_timeout_is_ambiguous() {
    let fake = Fake::new(&[Attempt::Hang], &[]);
    let started = tokio::time::Instant::now();
    let r = run(&cx(), &HIGH, &fake).await;
    // Nothing was applied, so after the timeout the verifier says Absent and
    // the retry goes through.
    assert!(r.is_success(), "{r:?}");
    assert_eq!(fake.dispatches().len(), 2);
    assert!(started.elapsed() >= Duration::from_millis(100));

    let fake = Fake::new(&[Attempt::Hang], &[Read::Unknown; 3]);
    let r = run(&cx(), &HIGH, &fake).await;
    assert!(matches!(r, ToolResult::Unknown { cause: Cause::TimedOut(_), .. }), "{r:?}");
}

#[tokio::test(start_paused = true)]
async fn retry_only_duplicates_where_verification_does_not() {
    let schedule = [Attempt::TimeoutApplied, Attempt::Ok];
    let baseline = Fake::new(&schedule, &[]).ignoring_keys();
    let r = run(&cx().with_mode(Mode::RetryOnly), &HIGH, &baseline).await;
    assert!(r.is_success());
    assert_eq!(baseline.applied(), 2, "the blind retry applied the effect twice");
    assert_eq!(baseline.reads(), 0);

    let verified = Fake::new(&schedule, &[]).ignoring_keys();
    let r = run(&cx(), &HIGH, &verified).await;
    assert!(r.is_success());
    assert_eq!(verified.applied(), 1);
}

#[tokio::test(start_paused = true)]
async fn retry_only_without_success_is_unknown_not_failure() {
    let fake = Fake::new(&[Attempt::TimeoutApplied, Attempt::TimeoutApplied], &[]);
    let r = run(&cx().with_mode(Mode::RetryOnly), &HIGH, &fake).await;
    assert!(
        matches!(r, ToolResult::Unknown { reason: UnknownReason::RetriesExhausted, .. }),
        "{r:?}"
    );
    assert_eq!(fake.applied(), 1, "the key deduplicated the blind retry");
}

#[tokio::test(start_paused = true)]
async fn verify_only_never_retries() {
    let fake = Fake::new(&[Attempt::TimeoutLost], &[]);
    let r = run(&cx().with_mode(Mode::VerifyOnly), &HIGH, &fake).await;
    assert!(matches!(r, ToolResult::NotApplied { .. }), "{r:?}");
    assert_eq!(fake.dispatches().len(), 1);
}

#[tokio::test(start_paused = true)]
async fn low_tools_without_verifier_retry_with_their_key() {
    let fake = Fake::new(&[Attempt::TimeoutApplied, Attempt::Ok], &[]);
    let r = run_unverified(&cx(), &LOW, &fake).await;
    assert!(r.is_success(), "{r:?}");
    let keys = fake.dispatches();
    assert_eq!(keys.len(), 2);
    assert_eq!(keys[0], keys[1]);
    assert_eq!(fake.applied(), 1, "the server dropped the duplicate by key");
}

#[tokio::test(start_paused = true)]
async fn irreversible_doubt_is_escalated_with_a_ticket() {
    let queue = Arc::new(MemoryEscalations::new());
    let cx = cx().with_escalation(queue.clone());
    let fake = Fake::new(&[Attempt::TimeoutLost], &[Read::Unknown; 4]);
    let r = run(&cx, &PAY, &fake).await;
    let ToolResult::Escalated { verdict: Verdict::Unknown, key, .. } = r else { panic!("{r:?}") };
    assert_eq!(fake.dispatches().len(), 1, "irreversible: no retry by default");
    let tickets = queue.take();
    assert_eq!(tickets.len(), 1);
    assert_eq!(tickets[0].key, key);
    assert_eq!(tickets[0].tool, "pay");
    assert_eq!(tickets[0].args, Some(serde_json::json!([42])), "a JSON value, not a string");
}

#[tokio::test(start_paused = true)]
async fn irreversible_known_absent_is_not_applied_and_nobody_is_paged() {
    let queue = Arc::new(MemoryEscalations::new());
    let cx = cx().with_escalation(queue.clone());
    let fake = Fake::new(&[Attempt::TimeoutLost], &[]);
    let r = run(&cx, &PAY, &fake).await;
    assert!(matches!(r, ToolResult::NotApplied { cause: Cause::Error(FakeError::Timeout), .. }));
    assert_eq!(fake.dispatches().len(), 1, "irreversible: no retry by default");
    assert!(queue.take().is_empty(), "escalation is for doubt, and this is settled");
}

#[tokio::test(start_paused = true)]
async fn partial_success_that_answers_ok_is_caught_when_responses_are_verified() {
    let fake = Fake::new(&[Attempt::PartialOk, Attempt::Ok], &[]);
    let r = run(&cx(), &CONFIRM, &fake).await;
    // Not a success, and not retried under the same key (the server would
    // replay its OK): completing it is a new logical call.
    assert!(matches!(r, ToolResult::NotApplied { cause: Cause::Unconfirmed, .. }), "{r:?}");
    assert_eq!(fake.dispatches().len(), 1);
    assert!(!fake.holds());

    // An OK the verifier cannot see within its budget is not a success either.
    let fake = Fake::new(&[Attempt::Ok], &[Read::Unknown; 3]);
    let r = run(&cx(), &CONFIRM, &fake).await;
    assert!(matches!(r, ToolResult::Unknown { cause: Cause::Unconfirmed, .. }), "{r:?}");

    // A confirmed OK is proven by the verifier.
    let fake = Fake::new(&[Attempt::Ok], &[]);
    let r = run(&cx(), &CONFIRM, &fake).await;
    assert!(matches!(r, ToolResult::Success { proof: Proof::Verifier, .. }), "{r:?}");

    // Without confirmation (opted out) the partial OK is taken at its word.
    let fake = Fake::new(&[Attempt::PartialOk], &[]);
    let r = run(&cx(), &BELIEVE, &fake).await;
    assert!(r.is_success());
    assert!(!fake.holds());
}

#[tokio::test(start_paused = true)]
async fn unserializable_payload_is_refused_before_dispatch() {
    struct Socket;
    impl serde::Serialize for Socket {
        fn serialize<S: serde::Serializer>(&self, _: S) -> Result<S::Ok, S::Error> {
            Err(serde::ser::Error::custom("sockets have no key"))
        }
    }
    let fake = Fake::new(&[], &[]);
    let r: Out = engine::call(
        &cx(),
        &HIGH,
        &Socket,
        &(),
        |a| fake.send(a),
        Some(|_| fake.check()),
        Codec::serde(),
    )
    .await;
    let ToolResult::Refused(CallError::Payload { tool: "send_welcome", .. }) = &r else {
        panic!("{r:?}")
    };
    assert!(r.key().is_none());
    assert!(fake.log().is_empty());
}

#[tokio::test(start_paused = true)]
async fn ledger_replays_a_completed_call() {
    let cx = cx().with_ledger(Arc::new(MemoryLedger::new())).for_step("run", 1);
    let fake = Fake::new(&[Attempt::Ok], &[]);
    let first = run(&cx, &HIGH, &fake).await;
    let second = run(&cx, &HIGH, &fake).await;
    assert!(
        matches!(second, ToolResult::Success { value: 1, proof: Proof::Ledger, .. }),
        "{second:?}"
    );
    assert_eq!(first.key(), second.key());
    assert_eq!(fake.dispatches().len(), 1);
    // Another step is another logical call.
    let third = run(&cx.for_step("run", 2), &HIGH, &fake).await;
    assert!(matches!(third, ToolResult::Success { proof: Proof::Verifier, .. }), "{third:?}");
}

#[tokio::test(start_paused = true)]
async fn explicit_key_reused_with_another_payload_is_rejected_by_name() {
    let key = IdempotencyKey::from_u128(0xabc);
    let cx = cx().with_ledger(Arc::new(MemoryLedger::new())).for_key(key);
    let fake = Fake::new(&[], &[]);
    assert!(run(&cx, &HIGH, &fake).await.is_success());
    let r: Out = engine::call(
        &cx,
        &HIGH,
        &(43u64,),
        &(),
        |a| fake.send(a),
        Some(|_| fake.check()),
        Codec::serde(),
    )
    .await;
    let ToolResult::Refused(err @ CallError::KeyReuse { .. }) = &r else { panic!("{r:?}") };
    assert!(err.to_string().contains(&key.to_string()), "{err}");
    assert_eq!(fake.dispatches().len(), 1);
}

#[tokio::test(start_paused = true)]
async fn in_flight_duplicates_wait_or_are_refused() {
    let ledger = Arc::new(MemoryLedger::new());
    let fake = Fake::new(&[], &[]);
    let cx = cx().with_ledger(ledger).for_step("run", 1);
    let refuse = cx.clone().with_in_flight(InFlight::Return);
    let (a, b) = tokio::join!(run(&cx, &HIGH, &fake), run(&refuse, &HIGH, &fake));
    assert!(a.is_success());
    assert!(matches!(b, ToolResult::Refused(CallError::InProgress { .. })), "{b:?}");

    let fake = Fake::new(&[], &[]);
    let cx = cx.for_step("run", 2);
    let (a, b) = tokio::join!(run(&cx, &HIGH, &fake), run(&cx, &HIGH, &fake));
    assert!(matches!(a, ToolResult::Success { proof: Proof::Verifier, .. }), "{a:?}");
    assert!(matches!(b, ToolResult::Success { proof: Proof::Ledger, .. }), "{b:?}");
    assert_eq!(fake.dispatches().len(), 1);
}

#[tokio::test(start_paused = true)]
async fn a_cancelled_call_is_verified_before_the_next_dispatch() {
    let cx = cx().with_ledger(Arc::new(MemoryLedger::new())).for_step("run", 1);
    let fake = Fake::new(&[Attempt::Hang], &[]);
    // Drop the call while its attempt hangs (the effect was not applied).
    let cancelled = tokio::time::timeout(Duration::from_millis(50), run(&cx, &HIGH, &fake)).await;
    assert!(cancelled.is_err());
    let r = run(&cx, &HIGH, &fake).await;
    assert!(r.is_success(), "{r:?}");
    // The second call read the state before dispatching: first before the
    // dropped attempt's deadline (not believed), then after it; then it read
    // its OK answer back.
    let log = fake.log();
    assert_eq!(
        log[1..],
        [
            Event::Read(Verdict::Absent),
            Event::Read(Verdict::Absent),
            Event::Dispatch(log_key(&log)),
            Event::Read(Verdict::Holds(()))
        ],
        "{log:?}"
    );

    // Same, but the lost attempt had applied the effect: no new dispatch.
    let cx = cx.for_step("run", 2);
    let fake = Fake::new(&[Attempt::TimeoutApplied], &[Read::Unknown; 3]);
    let first = run(&cx, &HIGH, &fake).await;
    assert!(matches!(first, ToolResult::Unknown { .. }));
    let second = run(&cx, &HIGH, &fake).await;
    assert!(matches!(second, ToolResult::Success { proof: Proof::Verifier, .. }), "{second:?}");
    assert_eq!(fake.dispatches().len(), 1);
}

#[tokio::test(start_paused = true)]
async fn audit_records_every_transition_and_args_once() {
    let audit = Arc::new(MemoryAudit::new());
    let cx = cx().with_audit(audit.clone());
    let fake = Fake::new(&[Attempt::TimeoutLost, Attempt::Ok], &[]);
    let r = run(&cx, &HIGH, &fake).await;
    assert!(r.is_success());
    use CallState::*;
    assert_eq!(
        audit.states(),
        [
            Planned,
            Dispatched,
            PendingVisibility,
            PendingVisibility,
            Dispatched,
            PendingVisibility,
            VerifiedSuccess
        ]
    );
    let events = audit.events();
    assert_eq!(events[0].args.as_deref(), Some("[42]"));
    assert!(events[1..].iter().all(|e| e.args.is_none()));
    assert_eq!(events[4].attempt, 2);
    assert!(events.iter().all(|e| e.key == r.key() && e.tool == "send_welcome"));
    let json: Vec<serde_json::Value> =
        events.iter().map(|e| serde_json::from_str(&e.json).unwrap()).collect();
    assert_eq!(json[2]["error"], "the service timed out", "the error's own text");
    assert_eq!(json[2]["error_class"], "ambiguous");
    assert_eq!(json[3]["verdict"], "absent");
    assert_eq!(json[3]["settled"], true);
    // The OK answer of the retry, read back.
    assert_eq!(json[5]["verdict"], "holds");
    assert_eq!(json[5]["settled"], true);
    assert_eq!(json[6]["outcome"], "success");
    assert_eq!(json[6]["proof"], "verifier");
    assert!(json[6]["elapsed_ms"].as_u64().unwrap() > 0);
}

#[tokio::test(start_paused = true)]
async fn a_definitive_failure_has_one_terminal_event_with_its_text() {
    let audit = Arc::new(MemoryAudit::new());
    let cx = cx().with_audit(audit.clone());
    let fake = Fake::new(&[Attempt::Definitive], &[]);
    assert!(matches!(run(&cx, &HIGH, &fake).await, ToolResult::Failed { .. }));
    let events = audit.events();
    let terminal: Vec<_> = events.iter().filter(|e| e.state.is_terminal()).collect();
    assert_eq!(terminal.len(), 1, "{events:#?}");
    let json: serde_json::Value = serde_json::from_str(&terminal[0].json).unwrap();
    assert_eq!(json["state"], "verified_failure");
    assert_eq!(json["outcome"], "failed");
    assert_eq!(json["error"], "422 invalid request: customer 42 is closed");
}

/// A `Write` shared with the test, to read what the sink's thread wrote.
#[derive(Clone, Default)]
struct Shared(Arc<std::sync::Mutex<Vec<u8>>>);

impl std::io::Write for Shared {
    fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(bytes);
        Ok(bytes.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

#[tokio::test(start_paused = true)]
async fn json_lines_audit_writes_one_object_per_event_off_the_calling_thread() {
    let out = Shared::default();
    let sink = Arc::new(JsonLinesAudit::new(out.clone()));
    let cx = cx().with_audit(sink.clone());
    let fake = Fake::new(&[Attempt::TimeoutApplied], &[]);
    let r = run(&cx, &HIGH, &fake).await;
    sink.flush().unwrap();
    let text = String::from_utf8(out.0.lock().unwrap().clone()).unwrap();
    let lines: Vec<serde_json::Value> =
        text.lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    assert_eq!(lines.len(), 5);
    assert_eq!(lines[0]["state"], "planned");
    assert_eq!(lines[0]["args"], serde_json::json!([42]));
    assert_eq!(lines[3]["verdict"], "holds");
    assert_eq!(lines[4]["state"], "verified_success");
    assert_eq!(lines[4]["key"], r.key().unwrap().to_string());
    assert_eq!(sink.write_errors(), 0);
}

#[test]
fn json_lines_audit_loses_no_line_on_a_clean_shutdown() {
    let out = Shared::default();
    let sink = JsonLinesAudit::new(out.clone());
    let rt = tokio::runtime::Builder::new_current_thread().enable_time().start_paused(true).build();
    let sink = Arc::new(sink);
    rt.unwrap().block_on(async {
        let cx = cx().with_audit(sink.clone());
        for step in 0..200 {
            let fake = Fake::new(&[], &[]);
            assert!(run(&cx.for_step("run", step), &HIGH, &fake).await.is_success());
        }
    });
    // Dropping the last handle writes what is queued before it returns.
    drop(Arc::into_inner(sink).expect("sole owner"));
    let lines = String::from_utf8(out.0.lock().unwrap().clone()).unwrap().lines().count();
    assert_eq!(
        lines,
        200 * 4,
        "planned, dispatched, pending_visibility, verified_success per call"
    );
}

#[tokio::test(start_paused = true)]
async fn reads_are_never_replayed_from_the_ledger() {
    static READ: ToolSpec = ToolSpec::new("get_customer", SideEffect::None);
    let cx = cx().with_ledger(Arc::new(MemoryLedger::new())).for_step("run", 1);
    let fake = Fake::new(&[], &[]);
    let first = run_unverified(&cx, &READ, &fake).await;
    let second = run_unverified(&cx, &READ, &fake).await;
    assert!(matches!(first, ToolResult::Success { value: 1, proof: Proof::Response, .. }));
    assert!(matches!(second, ToolResult::Success { proof: Proof::Response, .. }), "{second:?}");
    assert_eq!(fake.dispatches().len(), 2);
}

#[tokio::test(start_paused = true)]
async fn ledger_records_expire_after_their_ttl() {
    let ledger = Arc::new(MemoryLedger::new().with_ttl(Duration::from_secs(60)));
    let cx = cx().with_ledger(ledger.clone()).for_step("run", 1);
    let fake = Fake::new(&[], &[]);
    assert!(run(&cx, &HIGH, &fake).await.is_success());
    tokio::time::advance(Duration::from_secs(59)).await;
    assert!(matches!(
        run(&cx, &HIGH, &fake).await,
        ToolResult::Success { proof: Proof::Ledger, .. }
    ));
    tokio::time::advance(Duration::from_secs(2)).await;
    ledger.purge_expired();
    assert!(ledger.is_empty());
    assert!(matches!(
        run(&cx, &HIGH, &fake).await,
        ToolResult::Success { proof: Proof::Verifier, .. }
    ));
    assert_eq!(fake.dispatches().len(), 2);
}

#[tokio::test(start_paused = true)]
async fn an_explicit_key_reused_by_another_tool_is_refused_not_replayed() {
    static OTHER: ToolSpec = ToolSpec::new("cancel", SideEffect::High).with_verifier();
    let cx = cx().with_ledger(Arc::new(MemoryLedger::new())).for_key(IdempotencyKey::from_u128(9));
    let fake = Fake::new(&[], &[]);
    assert!(run(&cx, &HIGH, &fake).await.is_success());
    let r = run(&cx, &OTHER, &fake).await;
    assert!(matches!(r, ToolResult::Refused(CallError::KeyReuse { tool: "cancel", .. })), "{r:?}");
    assert_eq!(fake.dispatches().len(), 1);
}

#[tokio::test(start_paused = true)]
async fn a_repeat_of_an_escalated_irreversible_call_never_dispatches_again() {
    let cx = cx().with_ledger(Arc::new(MemoryLedger::new())).for_step("run", 1);
    let fake = Fake::new(&[Attempt::TimeoutLost], &[Read::Unknown; 4]);
    assert!(matches!(run(&cx, &PAY, &fake).await, ToolResult::Escalated { .. }));
    // The state now reads Absent, settled: the repeat reports it, and sends
    // nothing (a person was told of the call; the caller decides).
    let r = run(&cx, &PAY, &fake).await;
    assert!(matches!(r, ToolResult::NotApplied { cause: Cause::Interrupted, .. }), "{r:?}");
    assert_eq!(fake.dispatches().len(), 1);
}

#[tokio::test(start_paused = true)]
async fn verify_only_never_retries_tools_without_a_verifier() {
    let fake = Fake::new(&[Attempt::TimeoutLost], &[]);
    let r = run_unverified(&cx().with_mode(Mode::VerifyOnly), &LOW, &fake).await;
    assert!(matches!(r, ToolResult::Unknown { reason: UnknownReason::RetriesExhausted, .. }));
    assert_eq!(fake.dispatches().len(), 1);
}

#[tokio::test(start_paused = true)]
async fn a_stale_read_before_the_settle_point_does_not_outweigh_an_ok_answer() {
    // The write answered OK; the first read hits a stale replica within the
    // settle margin, the next one sees the effect.
    let settling = policy(SideEffect::High).with_settle(Some(Duration::from_millis(300)));
    let cx = cx().with_policy(SideEffect::High, settling);
    let fake = Fake::new(&[Attempt::Ok], &[Read::Stale]);
    let r = run(&cx, &CONFIRM, &fake).await;
    assert!(matches!(r, ToolResult::Success { proof: Proof::Verifier, .. }), "{r:?}");
    assert_eq!(fake.dispatches().len(), 1);
}

fn log_key(log: &[Event]) -> IdempotencyKey {
    match log[0] {
        Event::Dispatch(key) => key,
        Event::Read(_) => panic!("the log starts with a dispatch: {log:?}"),
    }
}

/// Polls `call` until the fake has seen `dispatches` attempts, then leaks it:
/// the process died holding the key, and no drop guard ran.
async fn crash_after<F: std::future::Future>(call: F, fake: &Fake, dispatches: usize) {
    let mut call = Box::pin(call);
    while fake.dispatches().len() < dispatches {
        let polled = tokio::time::timeout(Duration::from_millis(1), call.as_mut()).await;
        assert!(polled.is_err(), "the call ended before it could crash");
    }
    std::mem::forget(call);
}

#[tokio::test(start_paused = true)]
async fn a_key_held_by_a_crashed_call_is_taken_over_in_doubt_after_its_lease() {
    let ledger = Arc::new(MemoryLedger::new().with_lease(Duration::from_secs(60)));
    let short = policy(SideEffect::High).with_call_timeout(Duration::from_secs(30));
    let cx = cx()
        .with_ledger(ledger)
        .with_policy(SideEffect::High, short)
        .for_step("run", 1)
        .with_in_flight(InFlight::Return);
    let fake = Fake::new(&[Attempt::Hang], &[]);
    crash_after(run(&cx, &HIGH, &fake), &fake, 1).await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    let early = run(&cx, &HIGH, &fake).await;
    assert!(matches!(early, ToolResult::Refused(CallError::InProgress { .. })), "{early:?}");
    // Past the lease: taken over, verified first (Absent), then dispatched,
    // and its OK answer read back.
    tokio::time::sleep(Duration::from_secs(60)).await;
    let late = run(&cx, &HIGH, &fake).await;
    assert!(late.is_success(), "{late:?}");
    let log = fake.log();
    assert!(
        matches!(
            log[1..],
            [Event::Read(Verdict::Absent), Event::Dispatch(_), Event::Read(Verdict::Holds(()))]
        ),
        "{log:?}"
    );
}

#[tokio::test(start_paused = true)]
async fn a_lease_shorter_than_the_call_deadline_is_refused_before_dispatch() {
    let ledger = Arc::new(MemoryLedger::new().with_lease(Duration::from_secs(60)));
    let cx = cx().with_ledger(ledger).for_step("run", 1);
    let fake = Fake::new(&[], &[]);
    let r = run(&cx, &HIGH, &fake).await;
    let ToolResult::Refused(CallError::LeaseTooShort { lease, call_timeout, .. }) = r else {
        panic!("{r:?}")
    };
    assert_eq!((lease, call_timeout), (Duration::from_secs(60), Duration::from_secs(120)));
    assert!(fake.log().is_empty());
}

#[tokio::test(start_paused = true)]
async fn context_new_records_calls_in_a_ledger_by_default() {
    let cx = cx().for_step("run", 1);
    let fake = Fake::new(&[], &[]);
    assert!(run(&cx, &HIGH, &fake).await.is_success());
    let again = run(&cx, &HIGH, &fake).await;
    assert!(matches!(again, ToolResult::Success { proof: Proof::Ledger, .. }), "{again:?}");
    assert_eq!(fake.dispatches().len(), 1);
    // Opting out executes again.
    let bare = cx.clone().without_ledger();
    assert!(run(&bare, &HIGH, &fake).await.is_success());
    assert_eq!(fake.dispatches().len(), 2);
}

#[tokio::test(start_paused = true)]
async fn the_retry_budget_is_per_logical_call_not_per_invocation() {
    let cx = cx().for_step("run", 1);
    // Lost, Absent, retried, lost again, then the verifier sees nothing
    // for its whole budget: Unknown after two attempts.
    let reads = [Read::Truth, Read::Unknown, Read::Unknown, Read::Unknown];
    let fake = Fake::new(&[Attempt::TimeoutLost, Attempt::TimeoutLost], &reads);
    assert!(matches!(run(&cx, &HIGH, &fake).await, ToolResult::Unknown { .. }));
    assert_eq!(fake.dispatches().len(), 2);
    // A repeat verifies (Absent now) but has no attempt left for this key.
    let r = run(&cx, &HIGH, &fake).await;
    assert!(matches!(r, ToolResult::NotApplied { cause: Cause::Interrupted, .. }), "{r:?}");
    assert_eq!(fake.dispatches().len(), 2);
}

#[tokio::test(start_paused = true)]
async fn a_contradicted_ok_is_never_dispatched_again_under_its_key() {
    let cx = cx().for_step("run", 1);
    let fake = Fake::new(&[Attempt::PartialOk, Attempt::Ok], &[]);
    let first = run(&cx, &CONFIRM, &fake).await;
    assert!(matches!(first, ToolResult::NotApplied { cause: Cause::Unconfirmed, .. }));
    let again = run(&cx, &CONFIRM, &fake).await;
    assert!(matches!(again, ToolResult::NotApplied { cause: Cause::Unconfirmed, .. }), "{again:?}");
    assert_eq!(fake.dispatches().len(), 1, "the server would only replay its OK");
    // A new logical call completes it.
    assert!(run(&cx.for_step("run", 2), &CONFIRM, &fake).await.is_success());
}

#[tokio::test(start_paused = true)]
async fn resuming_without_a_verifier_never_redispatches_an_irreversible_call() {
    static PAY_BLIND: ToolSpec = ToolSpec::new("pay_blind", SideEffect::Irreversible);
    let cx = cx().for_step("run", 1);
    let fake = Fake::new(&[Attempt::TimeoutLost], &[]);
    let first = run_unverified(&cx, &PAY_BLIND, &fake).await;
    assert!(matches!(first, ToolResult::Escalated { .. }), "{first:?}");
    let again = run_unverified(&cx, &PAY_BLIND, &fake).await;
    assert!(matches!(again, ToolResult::Escalated { cause: Cause::Interrupted, .. }), "{again:?}");
    assert_eq!(fake.dispatches().len(), 1);
}

#[tokio::test(start_paused = true)]
async fn retry_only_resumes_without_reading_the_verifier() {
    let cx = cx().with_mode(Mode::RetryOnly).for_step("run", 1);
    let fake = Fake::new(&[Attempt::TimeoutLost, Attempt::TimeoutLost], &[]);
    assert!(matches!(run(&cx, &HIGH, &fake).await, ToolResult::Unknown { .. }));
    let again = run(&cx, &HIGH, &fake).await;
    assert!(matches!(again, ToolResult::Unknown { cause: Cause::Interrupted, .. }), "{again:?}");
    assert_eq!(fake.reads(), 0);
    assert_eq!(fake.dispatches().len(), 2);
}

#[tokio::test(start_paused = true)]
async fn a_takeover_inherits_the_attempts_of_the_call_it_replaces() {
    let ledger = Arc::new(MemoryLedger::new().with_lease(Duration::from_secs(60)));
    let policy =
        policy(SideEffect::High).with_retries(2).with_call_timeout(Duration::from_secs(30));
    let cx = cx().with_ledger(ledger).with_policy(SideEffect::High, policy).for_step("run", 1);
    // Two attempts lost (each verified Absent); the process dies during the third.
    let fake = Fake::new(&[Attempt::TimeoutLost, Attempt::TimeoutLost, Attempt::Hang], &[]);
    crash_after(run(&cx, &HIGH, &fake), &fake, 3).await;
    tokio::time::sleep(Duration::from_secs(61)).await;
    let taken_over = run(&cx, &HIGH, &fake).await;
    // The taker verified (Absent) and found the key's budget spent.
    assert!(
        matches!(taken_over, ToolResult::NotApplied { cause: Cause::Interrupted, .. }),
        "{taken_over:?}"
    );
    assert_eq!(fake.dispatches().len(), 3, "1 + retries under one key, not per call");
}

#[tokio::test(start_paused = true)]
async fn settled_failures_expire_with_the_ttl() {
    let ledger = Arc::new(MemoryLedger::new().with_ttl(Duration::from_secs(60)));
    let policy = policy(SideEffect::High).with_retries(0);
    let cx = cx().with_ledger(ledger).with_policy(SideEffect::High, policy).for_step("run", 1);
    let fake = Fake::new(&[Attempt::Definitive], &[]);
    assert!(matches!(run(&cx, &HIGH, &fake).await, ToolResult::Failed { .. }));
    // Within the TTL the key's budget is spent: verified, not re-sent.
    assert!(matches!(run(&cx, &HIGH, &fake).await, ToolResult::NotApplied { .. }));
    assert_eq!(fake.dispatches().len(), 1);
    // After it, the key starts afresh, as on a server that forgot it.
    tokio::time::advance(Duration::from_secs(61)).await;
    assert!(run(&cx, &HIGH, &fake).await.is_success());
    assert_eq!(fake.dispatches().len(), 2);
}

#[tokio::test(start_paused = true)]
async fn a_panicking_audit_sink_cannot_unrecord_a_success() {
    struct Exploding;
    impl verified_tools::audit::AuditSink for Exploding {
        fn record(&self, event: &verified_tools::audit::AuditEvent<'_>) {
            assert!(event.state != CallState::VerifiedSuccess, "audit sink bug");
        }
    }
    let cx = cx().for_step("run", 1);
    let fake = Arc::new(Fake::new(&[], &[]));
    let (cx2, fake2) = (cx.clone().with_audit(Arc::new(Exploding)), Arc::clone(&fake));
    let crashed = tokio::spawn(async move { run(&cx2, &HIGH, &fake2).await }).await;
    assert!(crashed.unwrap_err().is_panic());
    let again = run(&cx, &HIGH, &fake).await;
    assert!(matches!(again, ToolResult::Success { proof: Proof::Ledger, .. }), "{again:?}");
    assert_eq!(fake.dispatches().len(), 1);
}

/// An attempt that the call's deadline cut short says so, rather than
/// naming the few milliseconds it was left as its timeout.
#[tokio::test(start_paused = true)]
async fn an_attempt_cut_short_by_the_call_deadline_names_the_deadline() {
    static SPEC: ToolSpec = ToolSpec::new("slow", SideEffect::High)
        .with_verifier()
        .with_retries(3)
        .with_timeout(Duration::from_secs(1))
        .with_call_timeout(Duration::from_millis(1_500))
        .with_settle(Duration::ZERO);
    let cx = Context::new("agent").without_ledger();
    let result: ToolResult<u32, std::io::Error> = verified_tools::engine::call(
        &cx,
        &SPEC,
        &(1u8,),
        &(1u8,),
        |_| std::future::pending(),
        Some(|_| async { verified_tools::Verdict::Absent }),
        Codec::serde(),
    )
    .await;
    match result {
        ToolResult::Unknown { cause: verified_tools::Cause::DeadlineReached(call), .. } => {
            assert_eq!(call, Duration::from_millis(1_500))
        }
        other => panic!("{other:?}"),
    }
}
