//! The experiment, end to end: determinism across thread counts and runs,
//! the guarantees of verify-before-retry (and where they stop: servers that
//! ignore keys and deadlines), the baseline's growth of duplicates under the
//! paper's timeouts, the JSON's fixed fields, single episodes whose counts
//! are computed by hand, and what a verified OK answer buys where partial
//! writes answer as if complete.

use std::sync::Arc;
use std::time::Duration;

use verified_tools::sim::{
    FaultLevel, FaultProfile, InvoiceId, Op, Record, RecordId, SimConfig, SimError, SimServer,
    Task, TaskKind, Timeout,
};
use verified_tools::{
    Context, Deadline, IdempotencyKey, TokioClock, ToolResult, UnknownReason, Verdict,
    verified_tool,
};
use verified_tools_suite::agent::{self, Outcome, ToolCall};
use verified_tools_suite::experiment::{
    self, Config, Episode, EpisodeSpec, FaultModel, LedgerChoice, Method, Results, Settings,
};
use verified_tools_suite::report;
use verified_tools_suite::tools::SimClient;

fn grid(episodes: u64, methods: &[Method], threads: usize) -> Results {
    let config = Config { episodes, methods: methods.to_vec(), threads, ..Config::default() };
    experiment::run(&config, &|_| {}).expect("the in-memory ledger opens")
}

fn cell(
    results: &Results,
    task: TaskKind,
    level: FaultLevel,
    method: Method,
) -> experiment::CellStats {
    let found =
        results.cells.iter().find(|c| c.task == task && c.level == level && c.method == method);
    found.expect("the cell was run").stats
}

#[test]
fn results_do_not_depend_on_the_thread_count() {
    // 70 episodes: two chunks per cell, the second one short.
    let one = grid(70, &Method::ALL, 1);
    let three = grid(70, &Method::ALL, 3);
    assert_eq!(one.cells, three.cells);
    assert_eq!(report::table(&one), report::table(&three));
    assert_eq!(report::json(&one), report::json(&three));
    assert!(one.cells.iter().all(|c| c.stats.episodes == 70));
}

#[test]
fn the_same_seed_gives_the_same_episode_twice() {
    let settings = Settings::default();
    for seed in 42..92 {
        for method in [Method::VerifyBeforeRetry, Method::VbrNeither, Method::RetryOnly] {
            let task = TaskKind::ALL[seed as usize % 2].instance(seed);
            let profile = FaultLevel::Extreme.profile();
            let spec = EpisodeSpec { task, profile, seed, method, settings };
            let run =
                || experiment::paused_runtime().block_on(experiment::episode_traced(&spec, None));
            let (a, b) = (run(), run());
            assert_eq!(a, b, "{seed} {method}");
        }
    }
}

#[test]
fn verify_before_retry_with_keys_never_duplicates_nor_lies() {
    // Keys and deadlines honoured: the library's guarantee.
    let results = grid(1_000, &[Method::VerifyBeforeRetry], 2);
    assert_eq!(results.cells.len(), 2 * 4);
    for cell in &results.cells {
        let s = cell.stats;
        let at = format!("{} {}", cell.task, cell.level);
        assert_eq!(s.episodes, 1_000, "{at}");
        assert_eq!(s.duplicates, 0, "{at}");
        assert_eq!(s.false_successes, 0, "{at}");
        // It does the work too: success is reported exactly when it is true.
        assert_eq!(s.claimed, s.successes, "{at}");
        // Both tasks alike: record_invoice repairs a partial record
        // (update_record_fields) instead of giving up, so it is not capped.
        assert!(s.successes >= 900, "{at}: {}", s.successes);
        if cell.level <= FaultLevel::Medium {
            assert!(s.successes >= 990, "{at}: {}", s.successes);
        }
    }
}

#[test]
fn the_guarantee_does_not_extend_to_servers_that_ignore_keys_and_deadlines() {
    let methods = [
        Method::VbrNoDeadlines,
        Method::VbrNoServerKeys,
        Method::VbrNeither,
        Method::VbrNeitherUnsettled,
    ];
    let config = Config {
        episodes: 1_000,
        levels: vec![FaultLevel::High, FaultLevel::Extreme],
        methods: methods.to_vec(),
        threads: 2,
        ..Config::default()
    };
    let results = experiment::run(&config, &|_| {}).expect("the in-memory ledger opens");
    let total = |task, method| {
        config
            .levels
            .iter()
            .map(|&l| cell(&results, task, l, method))
            .fold((0, 0, 0), |(d, f, s), c| {
                (d + c.duplicates, f + c.false_successes, s + c.successes)
            })
    };
    let activate = TaskKind::ActivateCustomer;
    let record = TaskKind::RecordInvoice;
    // Neither keys nor deadlines, and a settle margin the server does not
    // keep: a late request lands after the retry (or after the call ended
    // NotApplied and was re-planned), a second effect. Some of those land
    // after the agent claimed success: false successes too.
    let (dup, lies, _) = total(activate, Method::VbrNeither);
    assert!(dup > 0 && lies > 0, "activate_customer, neither: {dup} duplicates, {lies} lies");
    assert!(total(record, Method::VbrNeither).0 > 0);
    // Deadlines honoured, keys not: nothing lands after the settle point,
    // so activate_customer (no compound creation) does not duplicate ...
    assert_eq!(total(activate, Method::VbrNoServerKeys).0, 0);
    // ... but a partially applied create_record whose answer was lost is
    // "not completely" there (Absent), and its retry under a key the
    // server ignores creates the record again: section 4.5's window.
    assert!(total(record, Method::VbrNoServerKeys).0 > 0);
    // Keys honoured, deadlines not: none measured (a duplicate needs two
    // late arrivals in a row past the settle point).
    for task in TaskKind::ALL {
        assert_eq!(total(task, Method::VbrNoDeadlines).0, 0, "{task}");
    }
    // Never a success reported that the truth denies, wherever the server
    // keeps its deadlines.
    for method in [Method::VbrNoServerKeys, Method::VbrNoDeadlines] {
        for task in TaskKind::ALL {
            assert_eq!(total(task, method).1, 0, "{task} {method}");
        }
    }
    // The library's default on the worst server: no margin, so no Absent is
    // believed after an ambiguous failure: no duplicate, no lie — the cost
    // is success (calls left in doubt).
    for task in TaskKind::ALL {
        let (dup, lies, ok) = total(task, Method::VbrNeitherUnsettled);
        assert_eq!((dup, lies), (0, 0), "{task}");
        assert!(ok < total(task, Method::VbrNeither).2, "{task}: doubt costs success");
        let doubt: u64 = config
            .levels
            .iter()
            .map(|&l| cell(&results, task, l, Method::VbrNeitherUnsettled).in_doubt)
            .sum();
        assert!(doubt > 300, "{task}: {doubt}");
    }
}

#[test]
fn the_baseline_duplicates_more_as_faults_worsen() {
    let results = grid(1000, &[Method::RetryOnly, Method::KeysOnly], 2);
    let legacy = {
        let mut config = Config {
            episodes: 1000,
            methods: vec![Method::RetryOnly],
            threads: 2,
            ..Config::default()
        };
        config.settings.legacy_faults = true;
        experiment::run(&config, &|_| {}).expect("the in-memory ledger opens")
    };
    for task in TaskKind::ALL {
        let dup = |level, method| cell(&results, task, level, method).duplicates;
        let rates: Vec<u64> = FaultLevel::ALL.iter().map(|&l| dup(l, Method::RetryOnly)).collect();
        assert!(rates.windows(2).all(|w| w[0] < w[1]), "{task}: {rates:?}");
        assert!(rates[0] >= 70, "{task}: duplicates even at low faults: {rates:?}");
        // The paper's timeouts (every request reached the server) duplicate
        // far more than the earlier split, where half never did.
        for (i, &level) in FaultLevel::ALL.iter().enumerate() {
            let before = cell(&legacy, task, level, Method::RetryOnly).duplicates;
            assert!(rates[i] * 10 >= before * 15, "{task} {level}: {} vs {before}", rates[i]);
        }
        // The same blind retries with keys sent: the server drops every duplicate.
        assert!(FaultLevel::ALL.iter().all(|&l| dup(l, Method::KeysOnly) == 0), "{task}");
    }
}

#[test]
fn json_has_the_fixed_fields_and_counts_match_the_table() {
    let results = grid(30, &Method::ALL, 2);
    let doc = report::json(&results);
    let cells = doc["cells"].as_array().expect("cells is an array");
    assert_eq!(cells.len(), 2 * 4 * Method::ALL.len());
    let table = report::table(&results);
    for (json, cell) in cells.iter().zip(&results.cells) {
        let count = |f: &str| json[f].as_u64().unwrap_or_else(|| panic!("{f} missing in {json}"));
        assert_eq!(json["task"], cell.task.name());
        assert_eq!(json["level"], cell.level.name());
        assert_eq!(json["method"], cell.method.name());
        let (n, ok, dup) = (count("episodes"), count("successes"), count("duplicates"));
        let (lies, claimed) = (count("false_successes"), count("claimed_successes"));
        assert_eq!(count("in_doubt"), cell.stats.in_doubt);
        assert_eq!(n, 30);
        assert!(ok <= n && dup <= n && claimed <= n);
        assert!(lies <= claimed && claimed - lies <= ok, "{json}");
        assert_eq!(
            (ok, dup, lies),
            (cell.stats.successes, cell.stats.duplicates, cell.stats.false_successes)
        );
        // The table's line for this cell shows the same proportions.
        let line = table
            .lines()
            .find(|l| {
                let w: Vec<_> = l.split_whitespace().collect();
                w.len() > 3 && w[..3] == [cell.task.name(), cell.level.name(), cell.method.name()]
            })
            .expect("a table line per cell");
        let pct = |k: u64| format!("{:.1}", 100.0 * k as f64 / n as f64);
        // Columns without the interval brackets: task level method succ lo hi
        // dup lo hi h(s) h(d) false doubt calls verif latency.
        let line = line.replace(['[', ']', ','], " ");
        let w: Vec<_> = line.split_whitespace().collect();
        assert_eq!(w[3], pct(ok), "{line}");
        assert_eq!(w[6], pct(dup), "{line}");
        assert_eq!(w[11], pct(lies), "{line}");
        assert_eq!(w[12], pct(cell.stats.in_doubt), "{line}");
    }
    assert!(cells.iter().any(|c| c["duplicates"].as_u64() > Some(0)));
}

/// One episode with hand-chosen faults, no latency, seed 42.
fn one(task: TaskKind, profile: FaultProfile, method: Method) -> Episode {
    let settings = Settings { latency: Duration::ZERO, ..Settings::default() };
    let spec = EpisodeSpec { task: task.instance(42), profile, seed: 42, method, settings };
    experiment::run_episode(&spec)
}

/// Every write is applied at once, then its response is lost after 1 s.
fn lost_responses() -> FaultProfile {
    let p = FaultProfile { timeout: 1.0, ..FaultProfile::NONE };
    p.with_late_arrival(0.0, p.late_delay)
}

/// Every compound write applies part of its effects and answers OK.
fn partial_writes() -> FaultProfile {
    FaultProfile { partial_success: 1.0, ..FaultProfile::NONE }
}

#[test]
fn hand_computed_baseline_with_lost_responses() {
    // create_customer: applied, lost (1 s); backoff 100..=200 ms; retried
    // without key: applied again, lost (1 s). Retries exhausted → Unknown →
    // the agent gives up. Two customers were created: a duplicate.
    let e = one(TaskKind::ActivateCustomer, lost_responses(), Method::RetryOnly);
    assert_eq!((e.success, e.claimed, e.duplicate), (false, false, true));
    assert_eq!((e.tool_calls, e.verifier_calls), (2, 0));
    assert!((2100..=2200).contains(&e.virtual_ms), "{e:?}");
}

#[test]
fn hand_computed_verify_before_retry_with_lost_responses() {
    // Each of the three writes: applied, lost (1 s); backoff 100..=200 ms;
    // one verifier read sees it (no lag drawn) → Success, no retry.
    let e = one(TaskKind::ActivateCustomer, lost_responses(), Method::VerifyBeforeRetry);
    assert_eq!((e.success, e.claimed, e.duplicate), (true, true, false));
    assert_eq!((e.tool_calls, e.verifier_calls), (3, 3));
    assert!((3300..=3600).contains(&e.virtual_ms), "{e:?}");
}

#[test]
fn hand_computed_partial_writes() {
    // Baseline: the three writes answer OK (two of them partial): it claims
    // success, the row has no amount and the record no fields. 0 ms.
    let e = one(TaskKind::RecordInvoice, partial_writes(), Method::RetryOnly);
    assert_eq!((e.success, e.claimed, e.duplicate), (false, true, false));
    assert_eq!((e.tool_calls, e.verifier_calls, e.virtual_ms), (3, 0, 0));

    // Verify-before-retry: update_invoice_row answers OK; an OK is
    // contradicted only by an Absent read after the settle point, the
    // answer + 5 s (the lag bound; no latency here): 6 reads 400 ms apart
    // say Absent too early (0..=2000 ms), the engine waits until 5000 ms
    // and reads once more: Absent, believed: NotApplied, not retried under
    // the same key (the server would replay its OK). Re-planned twice as
    // new calls, each partial again: 3 dispatches, 3 × 7 reads, 3 × 5000
    // ms; then the agent gives up. The row was written partially three
    // times: no full write twice, no duplicate.
    let e = one(TaskKind::RecordInvoice, partial_writes(), Method::VerifyBeforeRetry);
    assert_eq!((e.success, e.claimed, e.duplicate, e.in_doubt), (false, false, false, false));
    assert_eq!((e.tool_calls, e.verifier_calls, e.virtual_ms), (3, 21, 15_000));
}

/// Only partial successes, each compound write drawn partial or not by its
/// own stream: the first seed whose draws match `partial` (call 0 of the
/// row, call 0 of the creation, calls 0.. of the repair).
fn seed_with_partials(row: bool, create: bool, repairs: &[bool]) -> (u64, FaultProfile) {
    let p = FaultProfile { partial_success: 0.5, ..FaultProfile::NONE };
    let seed = (0..100_000)
        .find(|&s| {
            p.draw(s, Op::UpdateInvoiceRow, 0).partial == row
                && p.draw(s, Op::CreateRecord, 0).partial == create
                && repairs
                    .iter()
                    .enumerate()
                    .all(|(n, &want)| p.draw(s, Op::UpdateRecordFields, n as u32).partial == want)
        })
        .expect("a seed with these draws");
    (seed, p)
}

fn traced(seed: u64, profile: FaultProfile, method: Method) -> (Episode, Vec<&'static str>) {
    let settings = Settings { latency: Duration::ZERO, ..Settings::default() };
    let task = TaskKind::RecordInvoice.instance(seed);
    let spec = EpisodeSpec { task, profile, seed, method, settings };
    let (e, report) =
        experiment::paused_runtime().block_on(experiment::episode_traced(&spec, None));
    let names = report
        .trace
        .iter()
        .map(|step| match step.call {
            ToolCall::UpdateInvoiceRow(_) => "row",
            ToolCall::CreateRecord(_) => "create",
            ToolCall::ReadRecord(_) => "read",
            ToolCall::UpdateRecordFields(..) => "fill",
            ToolCall::SetRecordStatus(..) => "recorded",
            _ => "other",
        })
        .collect();
    (e, names)
}

#[test]
fn hand_computed_repair_of_a_partial_record() {
    // The row is written in full, the record created without its fields,
    // the repair applies in full.
    let (seed, p) = seed_with_partials(false, true, &[false]);
    let (e, trace) = traced(seed, p, Method::VerifyBeforeRetry);
    // row: OK, verify_response: the first read Holds (0 ms). 1 dispatch, 1 read.
    // create: OK but partial: an OK is contradicted only after the settle
    //   point (answer + 5 s): 6 reads 400 ms apart, then one at 5000 ms, all
    //   Absent: NotApplied, not retried under its key. 1 dispatch, 7 reads.
    //   Re-plan 1 of 2:
    // read_record: the record without fields, version 1 (1 call, 0 reads);
    // fill at version 1, a new call and key: OK, the first read Holds:
    //   1 dispatch, 1 read; the record is at version 2;
    // recorded at version 2: OK, verified like every high tool's OK (the
    //   class default): the first read Holds. 1 dispatch, 1 read.
    // Total 5 calls, 1 + 7 + 1 + 1 = 10 reads, 5000 ms; one creation
    // (partial) and one full fill: no duplicate; the postcondition holds.
    assert_eq!(trace, ["row", "create", "read", "fill", "recorded"]);
    assert_eq!((e.success, e.claimed, e.duplicate), (true, true, false));
    assert_eq!((e.tool_calls, e.verifier_calls, e.virtual_ms), (5, 10, 5000));

    // The baseline on the same draws believes every OK: 3 calls, no reads,
    // 0 ms, and claims a success the record (no fields) does not have.
    let (e, trace) = traced(seed, p, Method::RetryOnly);
    assert_eq!(trace, ["row", "create", "recorded"]);
    assert_eq!((e.success, e.claimed, e.duplicate), (false, true, false));
    assert_eq!((e.tool_calls, e.verifier_calls, e.virtual_ms), (3, 0, 0));
}

#[test]
fn hand_computed_partial_repair_is_repaired_again_within_the_budget() {
    // As above, but repair 0 is itself partial (the invoice id, no amount).
    let (seed, p) = seed_with_partials(false, true, &[true, false]);
    let (e, trace) = traced(seed, p, Method::VerifyBeforeRetry);
    // row 1 call, 1 read; create 1 call, 7 reads, 5000 ms → re-plan 1: read
    // (1 call) → fill at v1: OK but partial, 7 reads Absent, 5000 ms →
    // re-plan 2: read (1 call) sees the invoice id at v2 → fill at v2: OK,
    // 1 read Holds (v3) → recorded at v3, 1 call, 1 read Holds. Total 7
    // calls, 1 + 7 + 7 + 1 + 1 = 17 reads, 10000 ms. The fill applied
    // twice, once in full: no duplicate.
    assert_eq!(trace, ["row", "create", "read", "fill", "read", "fill", "recorded"]);
    assert_eq!((e.success, e.claimed, e.duplicate), (true, true, false));
    assert_eq!((e.tool_calls, e.verifier_calls, e.virtual_ms), (7, 17, 10_000));

    // With one re-plan per step the second partial ends the episode: row,
    // create, read, fill; then the agent reports failure, honestly.
    let settings = Settings { latency: Duration::ZERO, replans: 1, ..Settings::default() };
    let task = TaskKind::RecordInvoice.instance(seed);
    let spec = EpisodeSpec { task, profile: p, seed, method: Method::VerifyBeforeRetry, settings };
    let e = experiment::run_episode(&spec);
    assert_eq!((e.success, e.claimed, e.duplicate), (false, false, false));
    assert_eq!((e.tool_calls, e.verifier_calls, e.virtual_ms), (4, 15, 10_000));
}

/// Only timeouts, half of them late arrivals; a seed whose first
/// `create_customer` is a late arrival received `delay` after it was sent,
/// between 6.5 s and 25 s, and whose other writes are answered.
fn late_creation() -> (u64, FaultProfile, Duration) {
    let p = FaultProfile { timeout: 0.5, ..FaultProfile::NONE };
    let delay = |s: u64| match p.draw(s, Op::CreateCustomer, 0).timeout {
        Some(Timeout::Late(d))
            if d > Duration::from_millis(6_500) && d < Duration::from_secs(25) =>
        {
            Some(d)
        }
        _ => None,
    };
    let seed = (0..1_000_000)
        .find(|&s| {
            delay(s).is_some()
                && [(Op::CreateCustomer, 1), (Op::SetCustomerStatus, 0), (Op::SendWelcome, 0)]
                    .iter()
                    .all(|&(op, n)| p.draw(s, op, n).timeout.is_none())
        })
        .expect("a seed with these draws");
    (seed, p, delay(seed).unwrap())
}

#[test]
fn hand_computed_a_late_creation_against_each_server() {
    let (seed, profile, delay) = late_creation();
    let settings = Settings { latency: Duration::ZERO, ..Settings::default() };
    let task = TaskKind::ActivateCustomer.instance(seed);
    let run = |method| {
        let spec = EpisodeSpec { task, profile, seed, method, settings };
        assert_eq!(
            spec.settle_margin(),
            (method != Method::VbrNeitherUnsettled).then_some(Duration::from_secs(5))
        );
        experiment::paused_runtime().block_on(experiment::episode_traced(&spec, None))
    };
    // With a settle margin (5 s: the lag bound, no latency here). The first
    // attempt (deadline 1 s) times out at 1 s; 100..=200 ms of backoff; 6
    // reads 400 ms apart say Absent before the settle point (1 s + 5 s);
    // the engine waits for it, reads Absent once more and believes it: the
    // retry, under the same key, goes out at 6000 ms and is answered OK,
    // and its first read Holds. Then set_customer_status and send_welcome:
    // OK, and each first read Holds (every high tool verifies an OK).
    // 4 dispatches, 7 + 1 + 1 + 1 reads, 6000 ms, success claimed.
    for method in [
        Method::VerifyBeforeRetry,
        Method::VbrNoDeadlines,
        Method::VbrNoServerKeys,
        Method::VbrNeither,
    ] {
        let (e, report) = run(method);
        assert_eq!((e.tool_calls, e.verifier_calls, e.virtual_ms), (4, 10, 6_000), "{method}");
        assert!(e.claimed && !e.in_doubt, "{method}");
        assert_eq!(report.trace[0].outcome, {
            let Outcome::Success(v) = report.trace[0].outcome else { panic!("{method}") };
            Outcome::Success(v)
        });
        // The first request lands `delay` after it was sent, after the retry:
        // a server that honours deadlines drops it (past its 1 s deadline);
        // one that honours keys replays it; one that does neither creates
        // the customer a second time, which replaces the activated one with
        // a PENDING one: a duplicate, and the success claimed is false.
        let duplicate = method == Method::VbrNeither;
        assert_eq!((e.duplicate, e.success), (duplicate, !duplicate), "{method} {delay:?}");
    }
    // The library's default, no margin, on the worst server: the Absent
    // reads are never believed, the call ends Unknown (Unsettled) after its
    // 6 reads; the planner re-issues the same call (same key) 30 s later;
    // the engine verifies first: the late creation has landed (no lag
    // drawn), Holds, nothing sent again; then the two OKs, each confirmed
    // by its first read. 3 dispatches, 6 + 1 + 1 + 1 reads, 1000 + backoff
    // + 2000 + 30000 ms.
    let (e, report) = run(Method::VbrNeitherUnsettled);
    let first = &report.trace[0];
    assert_eq!(first.outcome, Outcome::Unknown(UnknownReason::Unsettled));
    let again = &report.trace[1];
    assert!(again.reissue && again.key_step == first.key_step && again.call == first.call);
    assert!(matches!(again.outcome, Outcome::Success(_)));
    assert_eq!(report.trace.len(), 4);
    assert_eq!((e.success, e.claimed, e.duplicate, e.in_doubt), (true, true, false, false));
    assert_eq!((e.tool_calls, e.verifier_calls), (3, 9));
    assert!((33_100..=33_200).contains(&e.virtual_ms), "{e:?}");
}

// ------------------------------------------------ partial OKs (issue 20)

/// A context with the library's default policies, on tokio's clock.
fn default_context() -> Context {
    Context::new("agent").with_clock(Arc::new(TokioClock::starting_at(0)))
}

/// Each compound write of the experiment's tools, called once through
/// `agent::act` with a context from `cx`, against a server whose every
/// compound write is a partial OK (its target created first where it needs
/// one, without faults: creating a customer is not compound); with whether
/// the write's own postcondition holds afterwards on the ground truth.
fn compound_writes_under_partial_oks(cx: impl Fn() -> Context) -> Vec<(ToolCall, Outcome, bool)> {
    let Task::ActivateCustomer(a) = TaskKind::ActivateCustomer.instance(42) else { unreachable!() };
    let Task::RecordInvoice(r) = TaskKind::RecordInvoice.instance(42) else { unreachable!() };
    experiment::paused_runtime().block_on(async {
        let mut out = Vec::new();
        for n in 0..4 {
            let cfg = SimConfig::new(42, FaultProfile::NONE.with_partial_ok(1.0));
            let (server, oracle) = SimServer::new(cfg);
            let call = match n {
                0 => {
                    let c = server.create_customer(a.customer, None, None).await.unwrap();
                    ToolCall::SetCustomerStatus(a, c.version)
                }
                1 => ToolCall::UpdateInvoiceRow(r),
                2 => ToolCall::CreateRecord(r),
                _ => {
                    let created =
                        server.create_record(r.record, r.invoice_id, r.amount, None, None);
                    ToolCall::UpdateRecordFields(r, created.await.unwrap().version)
                }
            };
            let client = SimClient::new(server, true);
            let outcome = agent::act(&cx().for_step("run", n), &client, call).await;
            let truth = oracle.truth();
            let holds = match call {
                ToolCall::SetCustomerStatus(..) => {
                    truth.customer(a.customer).is_some_and(|c| c.activated_at.is_some())
                }
                ToolCall::UpdateInvoiceRow(_) => {
                    truth.invoice_row(r.row).is_some_and(|row| row.amount == Some(r.amount))
                }
                _ => truth.record(r.record).is_some_and(|rec| rec.amount == Some(r.amount)),
            };
            out.push((call, outcome, holds));
        }
        out
    })
}

#[test]
fn a_high_tool_never_reports_a_partial_ok_as_success_by_default() {
    // The library's default policies: a high tool verifies an OK answer.
    // The verifier reads the missing field (Absent, 3 reads 250 ms apart);
    // with no settle margin (the default) an Absent after an OK is never
    // believed either: the call ends Unknown (Unsettled), not Success.
    for (call, outcome, holds) in compound_writes_under_partial_oks(default_context) {
        assert!(!holds, "{call:?}: a partial write");
        assert_eq!(outcome, Outcome::Unknown(UnknownReason::Unsettled), "{call:?}");
    }
    // With a settle margin (the experiment's 5 s), the Absent read after it
    // is believed: NotApplied, so the planner may repair it as a new call.
    let settled = || {
        let margin = Some(Duration::from_secs(5));
        default_context().map_policies(move |_, p| p.with_settle(margin))
    };
    for (call, outcome, holds) in compound_writes_under_partial_oks(settled) {
        assert!(!holds, "{call:?}");
        assert_eq!(outcome, Outcome::NotApplied { conflict: false }, "{call:?}");
    }
    // The control: `verify_response` off, the OK answer is believed, and
    // every partial write is reported a success.
    let believing = || default_context().map_policies(|_, p| p.with_verify_response(false));
    for (call, outcome, holds) in compound_writes_under_partial_oks(believing) {
        assert!(!holds, "{call:?}");
        assert!(matches!(outcome, Outcome::Success(_)), "{call:?}: {outcome:?}");
    }
}

/// `create_record` as `src/tools.rs` writes it, with its class default.
#[verified_tool(side_effect = "high", verify = record_filled, skip(server), key(record))]
async fn create_record(
    server: &SimServer,
    record: RecordId,
    invoice_id: InvoiceId,
    amount: u64,
    key: IdempotencyKey,
    deadline: Deadline,
) -> Result<Record, SimError> {
    server.create_record(record, invoice_id, amount, Some(key), Some(deadline)).await
}

/// The same tool, opted out: `verify_response = false`.
#[verified_tool(
    side_effect = "high",
    verify = record_filled,
    skip(server),
    key(record),
    verify_response = false
)]
async fn create_record_believing_ok(
    server: &SimServer,
    record: RecordId,
    invoice_id: InvoiceId,
    amount: u64,
    key: IdempotencyKey,
    deadline: Deadline,
) -> Result<Record, SimError> {
    server.create_record(record, invoice_id, amount, Some(key), Some(deadline)).await
}

async fn record_filled(
    server: &SimServer,
    record: &RecordId,
    invoice_id: &InvoiceId,
    amount: &u64,
) -> Result<Verdict<Record>, SimError> {
    let seen = server.get_record(*record).await?;
    Ok(seen.filter(|r| r.invoice_id == Some(*invoice_id) && r.amount == Some(*amount)).into())
}

#[test]
fn the_attribute_s_verify_response_false_is_the_opt_out() {
    experiment::paused_runtime().block_on(async {
        let (id, invoice, amount) = (RecordId(5), InvoiceId(77), 990);
        let partial_oks = FaultProfile::NONE.with_partial_ok(1.0);
        // The class default: the OK answer is read back, and is not believed.
        let (server, oracle) = SimServer::new(SimConfig::new(42, partial_oks));
        let r = create_record(&default_context(), &server, id, invoice, amount).await;
        assert!(matches!(r, ToolResult::Unknown { reason: UnknownReason::Unsettled, .. }), "{r:?}");
        assert_eq!(oracle.truth().record(id).map(|r| r.amount), Some(None));
        // Opted out: the same partial OK is a Success whose value says the
        // fields were written, and the ground truth says they were not.
        let (server, oracle) = SimServer::new(SimConfig::new(42, partial_oks));
        let r = create_record_believing_ok(&default_context(), &server, id, invoice, amount).await;
        let ToolResult::Success { value, .. } = r else { panic!("{r:?}") };
        assert_eq!((value.invoice_id, value.amount), (Some(invoice), Some(amount)));
        assert_eq!(oracle.truth().record(id).map(|r| r.amount), Some(None));
    });
}

#[test]
fn verified_ok_answers_keep_every_success_true_where_partial_writes_answer_ok() {
    let methods = [
        Method::VerifyOnly,
        Method::VerifyBeforeRetry,
        Method::VbrNoDeadlines,
        Method::VbrNoServerKeys,
        Method::VbrNeitherUnsettled,
    ];
    let run = |faults, believe_ok| {
        let mut config = Config {
            episodes: 300,
            levels: vec![FaultLevel::Medium, FaultLevel::Extreme],
            methods: methods.to_vec(),
            threads: 2,
            ..Config::default()
        };
        config.settings.faults = faults;
        config.settings.believe_ok = believe_ok;
        experiment::run(&config, &|_| {}).expect("the in-memory ledger opens")
    };
    for faults in FaultModel::ALL {
        // Every OK answer verified (the tools' class default): on every
        // server that keeps its deadlines or is given no margin, no success
        // is claimed that the ground truth denies.
        let verified = run(faults, false);
        for cell in &verified.cells {
            let (s, at) =
                (cell.stats, format!("{faults} {} {} {}", cell.task, cell.level, cell.method));
            assert_eq!((s.false_successes, s.claimed), (0, s.successes), "{at}");
        }
        // The control: OK answers believed. Both worlds' partial writes
        // answer OK (Table 1's with what they wrote, the partial OKs as if
        // complete), and every cell claims successes that did not happen.
        let believed = run(faults, true);
        for cell in &believed.cells {
            let (s, at) =
                (cell.stats, format!("{faults} {} {} {}", cell.task, cell.level, cell.method));
            assert!(s.false_successes >= 10, "{at}: {}", s.false_successes);
        }
    }
}

#[test]
fn the_partial_ok_world_adds_faults_and_moves_none() {
    // The same seeds: the baseline (which verifies nothing) meets every
    // Table 1 fault where it was, so its duplicates and doubt do not drop,
    // and the added partial writes can only make it claim more falsely.
    let mut config =
        Config { episodes: 300, methods: vec![Method::RetryOnly], threads: 2, ..Config::default() };
    let table1 = experiment::run(&config, &|_| {}).expect("opens");
    config.settings.faults = FaultModel::PartialOk;
    let partial_ok = experiment::run(&config, &|_| {}).expect("opens");
    for (a, b) in table1.cells.iter().zip(&partial_ok.cells) {
        let at = format!("{} {}", a.task, a.level);
        assert_eq!(a.stats.in_doubt, b.stats.in_doubt, "{at}");
        assert!(b.stats.false_successes >= a.stats.false_successes, "{at}");
        assert!(b.stats.successes <= a.stats.successes, "{at}");
    }
    let doc = report::json(&partial_ok);
    assert_eq!(
        (doc["config"]["faults"].as_str(), doc["config"]["believe_ok"].as_bool()),
        (Some("partial-ok"), Some(false))
    );
    assert_eq!("partial-ok".parse::<FaultModel>(), Ok(FaultModel::PartialOk));
    assert!("partial_ok".parse::<FaultModel>().is_err());
}

/// `--ledger sqlite:PATH` and `--ledger redis://..` need the package's
/// features of those names; without them the choice parses (so `--help` and
/// the error name it) and opening it says which feature to add. The grid on
/// a shared store is `integration/tests/shared_ledger.rs`.
#[test]
fn a_store_left_out_of_the_build_says_which_feature_brings_it() {
    let dir = std::env::temp_dir().join(format!("vt-experiment-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let sqlite: LedgerChoice = format!("sqlite:{}", dir.join("l.db").display()).parse().unwrap();
    let opened = sqlite.open();
    if cfg!(feature = "sqlite") {
        assert!(opened.expect("a SQLite file opens").is_some());
    } else {
        let e = opened.err().expect("no SQLite in this build");
        assert!(e.contains("--features sqlite"), "{e}");
    }
    if !cfg!(feature = "redis") {
        let redis: LedgerChoice = "redis://127.0.0.1:1/".parse().unwrap();
        let e = redis.open().err().expect("no Redis client in this build");
        assert!(e.contains("--features redis"), "{e}");
    }
    let _ = std::fs::remove_dir_all(&dir);
}
