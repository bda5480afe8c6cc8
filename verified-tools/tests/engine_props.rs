//! Property tests: the engine against random fault schedules on the fake.

mod fake;

use fake::{Attempt, Event, Fake, Read};
use proptest::prelude::*;
use proptest::strategy::ValueTree;
use verified_tools::ledger::Codec;
use verified_tools::{
    Context, Mode, Proof, RetryPolicy, SideEffect, ToolResult, ToolSpec, Verdict, engine,
};

static HIGH: ToolSpec = ToolSpec::new("send_welcome", SideEffect::High).with_verifier();

fn attempt() -> impl Strategy<Value = Attempt> {
    prop_oneof![
        3 => Just(Attempt::Ok),
        2 => Just(Attempt::TimeoutApplied),
        2 => Just(Attempt::TimeoutLost),
        1 => Just(Attempt::Definitive),
        1 => Just(Attempt::Conflict),
        1 => Just(Attempt::Hang),
    ]
}

fn read(stale: bool) -> BoxedStrategy<Read> {
    if stale {
        prop_oneof![Just(Read::Truth), Just(Read::Stale), Just(Read::Unknown), Just(Read::Panic)]
            .boxed()
    } else {
        prop_oneof![3 => Just(Read::Truth), 1 => Just(Read::Unknown), 1 => Just(Read::Panic)]
            .boxed()
    }
}

fn mode() -> impl Strategy<Value = Mode> {
    prop_oneof![Just(Mode::VerifyBeforeRetry), Just(Mode::RetryOnly), Just(Mode::VerifyOnly)]
}

#[derive(Debug, Clone)]
struct Case {
    attempts: Vec<Attempt>,
    reads: Vec<Read>,
    mode: Mode,
    retries: u32,
    ignore_keys: bool,
    stale_reads: bool,
}

fn case() -> impl Strategy<Value = Case> {
    (any::<bool>(), any::<bool>(), mode(), 0u32..4).prop_flat_map(
        |(stale_reads, ignore_keys, mode, retries)| {
            (
                prop::collection::vec(attempt(), 0..6),
                prop::collection::vec(read(stale_reads), 0..12),
            )
                .prop_map(move |(attempts, reads)| Case {
                    attempts,
                    reads,
                    mode,
                    retries,
                    ignore_keys,
                    stale_reads,
                })
        },
    )
}

fn run(case: &Case) -> (ToolResult<u32, fake::FakeError>, Fake) {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .start_paused(true)
        .build()
        .unwrap();
    let fake = Fake::new(&case.attempts, &case.reads);
    let fake = if case.ignore_keys { fake.ignoring_keys() } else { fake };
    let policy = RetryPolicy::for_class(SideEffect::High).with_retries(case.retries);
    let cx = Context::new("prop").with_mode(case.mode).with_policy(SideEffect::High, policy);
    let result = rt.block_on(engine::call(
        &cx,
        &HIGH,
        &(7u64,),
        &(),
        |a| fake.send(a),
        Some(|_| fake.check()),
        Codec::serde(),
    ));
    (result, fake)
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]

    #[test]
    fn engine_invariants(case in case()) {
        let (result, fake) = run(&case);
        let log = fake.log();
        let keys = fake.dispatches();

        // Success is never claimed unless the effect really happened, except
        // when the tool's own OK said so.
        if let ToolResult::Success { proof, .. } = &result {
            prop_assert!(fake.holds() || *proof == Proof::Response, "{result:?} {log:?}");
            if *proof == Proof::Verifier {
                prop_assert!(fake.holds());
            }
        }
        // At most 1 + budget attempts, all with one key, the result's key.
        prop_assert!(keys.len() as u32 <= 1 + case.retries, "{log:?}");
        prop_assert!(keys.windows(2).all(|w| w[0] == w[1]));
        if let Some(first) = keys.first() {
            prop_assert_eq!(result.key(), Some(*first));
        }
        // Never a dispatch after Holds.
        if let Some(holds) = log.iter().position(|e| *e == Event::Read(Verdict::Holds(()))) {
            prop_assert!(!log[holds..].iter().any(|e| matches!(e, Event::Dispatch(_))), "{log:?}");
        }
        match case.mode {
            // Every retry comes right after a verifier's Absent.
            Mode::VerifyBeforeRetry => {
                for (i, e) in log.iter().enumerate().skip(1) {
                    if matches!(e, Event::Dispatch(_)) {
                        prop_assert_eq!(log[i - 1], Event::Read(Verdict::Absent), "{:?}", log);
                    }
                }
                // With keys honoured, or with a verifier that never reads a
                // stale replica, the effect is never applied twice.
                if !case.ignore_keys || !case.stale_reads {
                    prop_assert!(fake.applied() <= 1, "{log:?}");
                }
            }
            Mode::VerifyOnly => prop_assert!(keys.len() <= 1),
            Mode::RetryOnly => prop_assert_eq!(fake.reads(), 0),
        }
        if !case.ignore_keys {
            prop_assert!(fake.applied() <= 1, "keys deduplicate in every mode");
        }
    }
}

static PAY: ToolSpec = ToolSpec::new("pay", SideEffect::Irreversible).with_verifier();
static CONFIRM: ToolSpec =
    ToolSpec::new("record", SideEffect::High).with_verifier().with_verify_response(true);

/// Two calls of the same logical call on one ledger; the first may be
/// cancelled at a random virtual time.
#[derive(Debug, Clone)]
struct Repeat {
    case: Case,
    spec: u8,
    cancel_after_ms: Option<u64>,
}

fn repeat() -> impl Strategy<Value = Repeat> {
    (case(), 0u8..3, prop::option::of(0u64..3_000))
        .prop_map(|(case, spec, cancel_after_ms)| Repeat { case, spec, cancel_after_ms })
}

fn run_twice(r: &Repeat) -> (Vec<ToolResult<u32, fake::FakeError>>, Fake) {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .start_paused(true)
        .build()
        .unwrap();
    let case = &r.case;
    let fake = Fake::new(&case.attempts, &case.reads);
    let fake = if case.ignore_keys { fake.ignoring_keys() } else { fake };
    let spec: &'static ToolSpec = match r.spec {
        0 => &HIGH,
        1 => &PAY,
        _ => &CONFIRM,
    };
    let policy = RetryPolicy::for_class(spec.side_effect).with_retries(case.retries);
    let cx = Context::new("prop")
        .with_mode(case.mode)
        .with_policy(spec.side_effect, policy)
        .for_step("run", 1);
    let call = || {
        engine::call(
            &cx,
            spec,
            &(7u64,),
            &(),
            |a| fake.send(a),
            Some(|_| fake.check()),
            Codec::serde(),
        )
    };
    let results = rt.block_on(async {
        let mut results = Vec::new();
        match r.cancel_after_ms {
            Some(ms) => {
                let limit = std::time::Duration::from_millis(ms);
                if let Ok(result) = tokio::time::timeout(limit, call()).await {
                    results.push(result);
                }
            }
            None => results.push(call().await),
        }
        results.push(call().await);
        results
    });
    (results, fake)
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]

    /// The invariants hold per logical call (per key), across a repeat and a
    /// cancellation, not only within one invocation.
    #[test]
    fn invariants_hold_across_repeats_and_cancellation(r in repeat()) {
        let (results, fake) = run_twice(&r);
        let log = fake.log();
        let keys = fake.dispatches();
        let case = &r.case;
        prop_assert!(keys.len() as u32 <= 1 + case.retries, "{r:?} {log:?}");
        prop_assert!(keys.windows(2).all(|w| w[0] == w[1]));
        if let Some(holds) = log.iter().position(|e| *e == Event::Read(Verdict::Holds(()))) {
            prop_assert!(!log[holds..].iter().any(|e| matches!(e, Event::Dispatch(_))), "{log:?}");
        }
        for result in &results {
            if let ToolResult::Success { proof, .. } = result {
                prop_assert!(fake.holds() || *proof == Proof::Response, "{result:?} {log:?}");
            }
        }
        match case.mode {
            Mode::VerifyBeforeRetry => {
                for (i, e) in log.iter().enumerate().skip(1) {
                    if matches!(e, Event::Dispatch(_)) {
                        prop_assert_eq!(log[i - 1], Event::Read(Verdict::Absent), "{:?}", log);
                    }
                }
            }
            Mode::RetryOnly => prop_assert_eq!(fake.reads(), 0, "{:?}", log),
            Mode::VerifyOnly => prop_assert!(keys.len() <= 1),
        }
        // Irreversible: once an attempt went out, no other follows by itself.
        if r.spec == 1 && case.retries == 0 {
            prop_assert!(keys.len() <= 1, "{r:?} {log:?}");
        }
    }
}

/// Retry-only without server keys really duplicates on some schedules, where
/// verify-before-retry does not: the comparison the paper makes.
#[test]
fn only_retry_only_duplicates_over_many_schedules() {
    let mut runner = proptest::test_runner::TestRunner::deterministic();
    let schedules = prop::collection::vec(attempt(), 1..4);
    let (mut blind, mut verified) = (0, 0);
    for _ in 0..300 {
        let attempts = schedules.new_tree(&mut runner).unwrap().current();
        let base = Case {
            attempts,
            reads: vec![],
            mode: Mode::RetryOnly,
            retries: 1,
            ignore_keys: true,
            stale_reads: false,
        };
        blind += u32::from(run(&base).1.applied() > 1);
        let vbr = Case { mode: Mode::VerifyBeforeRetry, ..base };
        verified += u32::from(run(&vbr).1.applied() > 1);
    }
    assert!(blind > 20, "retry-only duplicated in {blind} of 300 schedules");
    assert_eq!(verified, 0);
}
