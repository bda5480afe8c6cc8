//! The experiment, end to end: determinism across thread counts, the
//! guarantees of verify-before-retry, the baseline's growth of duplicates,
//! the JSON's fixed fields, and single episodes whose counts are computed by
//! hand.

use std::time::Duration;

use verified_tools::sim::{FaultLevel, FaultProfile, Op, TaskKind};
use verified_tools_suite::agent::ToolCall;
use verified_tools_suite::experiment::{self, Config, Episode, EpisodeSpec, Method, Settings};
use verified_tools_suite::report;

fn grid(episodes: u64, methods: &[Method], threads: usize) -> experiment::Results {
    let config = Config { episodes, methods: methods.to_vec(), threads, ..Config::default() };
    experiment::run(&config, &|_| {})
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
fn verify_before_retry_with_keys_never_duplicates_nor_lies() {
    let results = grid(500, &[Method::VerifyBeforeRetry], 2);
    assert_eq!(results.cells.len(), 2 * 4);
    for cell in &results.cells {
        let s = cell.stats;
        let at = format!("{} {}", cell.task, cell.level);
        assert_eq!(s.episodes, 500, "{at}");
        assert_eq!(s.duplicates, 0, "{at}");
        assert_eq!(s.false_successes, 0, "{at}");
        // It does the work too: success is reported exactly when it is true.
        assert_eq!(s.claimed, s.successes, "{at}");
        // Both tasks alike: record_invoice repairs a partial record
        // (update_record_fields) instead of giving up, so it is not capped.
        assert!(s.successes >= 425, "{at}: {}", s.successes);
        if cell.level <= FaultLevel::Medium {
            assert!(s.successes >= 495, "{at}: {}", s.successes);
        }
    }
}

#[test]
fn the_baseline_duplicates_more_as_faults_worsen() {
    let results = grid(1000, &[Method::RetryOnly, Method::KeysOnly], 2);
    for task in TaskKind::ALL {
        let dup = |level, method| {
            let cell = results
                .cells
                .iter()
                .find(|c| c.task == task && c.level == level && c.method == method);
            cell.expect("the cell was run").stats.duplicates
        };
        let rates: Vec<u64> = FaultLevel::ALL.iter().map(|&l| dup(l, Method::RetryOnly)).collect();
        assert!(rates.windows(2).all(|w| w[0] < w[1]), "{task}: {rates:?}");
        assert!(rates[0] >= 20, "{task}: duplicates even at low faults: {rates:?}");
        // The same blind retries with keys sent: the server drops every duplicate.
        assert!(FaultLevel::ALL.iter().all(|&l| dup(l, Method::KeysOnly) == 0), "{task}");
    }
}

#[test]
fn json_has_the_fixed_fields_and_counts_match_the_table() {
    let results = grid(30, &Method::ALL, 2);
    let doc = report::json(&results);
    let cells = doc["cells"].as_array().expect("cells is an array");
    assert_eq!(cells.len(), 2 * 4 * 5);
    let table = report::table(&results);
    for (json, cell) in cells.iter().zip(&results.cells) {
        let count = |f: &str| json[f].as_u64().unwrap_or_else(|| panic!("{f} missing in {json}"));
        assert_eq!(json["task"], cell.task.name());
        assert_eq!(json["level"], cell.level.name());
        assert_eq!(json["method"], cell.method.name());
        let (n, ok, dup) = (count("episodes"), count("successes"), count("duplicates"));
        let (lies, claimed) = (count("false_successes"), count("claimed_successes"));
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
        // dup lo hi h(s) h(d) false calls verif latency.
        let line = line.replace(['[', ']', ','], " ");
        let w: Vec<_> = line.split_whitespace().collect();
        assert_eq!(w[3], pct(ok), "{line}");
        assert_eq!(w[6], pct(dup), "{line}");
        assert_eq!(w[11], pct(lies), "{line}");
    }
    assert!(cells.iter().any(|c| c["duplicates"].as_u64() > Some(0)));
}

/// One episode with hand-chosen faults, no latency, seed 42.
fn one(task: TaskKind, profile: FaultProfile, method: Method) -> Episode {
    let settings = Settings { latency: Duration::ZERO, ..Settings::default() };
    let spec = EpisodeSpec { task: task.instance(42), profile, seed: 42, method, settings };
    experiment::run_episode(&spec)
}

/// Every write is applied, then its response is lost after 1 s.
fn lost_responses() -> FaultProfile {
    FaultProfile { timeout: 1.0, ..FaultProfile::NONE }.with_timeout_applied_share(1.0)
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

    // Verify-before-retry: update_invoice_row answers OK; contradicting an
    // OK takes the whole read budget: 6 reads 400 ms apart say Absent (5
    // waits, 2000 ms): NotApplied, not retried under the same key (the
    // server would replay its OK). Re-planned twice as new calls, each
    // partial again: 3 dispatches, 3 × 6 reads, 3 × 2000 ms; then the agent
    // gives up. The row was written partially
    // three times: no full write twice, no duplicate.
    let e = one(TaskKind::RecordInvoice, partial_writes(), Method::VerifyBeforeRetry);
    assert_eq!((e.success, e.claimed, e.duplicate), (false, false, false));
    assert_eq!((e.tool_calls, e.verifier_calls, e.virtual_ms), (3, 18, 6000));
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
    let (e, report) = experiment::paused_runtime().block_on(experiment::episode_traced(&spec));
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
    // create: OK but partial: only the whole budget contradicts an OK, 6
    //   reads 400 ms apart say Absent (5 waits, 2000 ms): NotApplied, not
    //   retried under its key. 1 dispatch, 6 reads. Re-plan 1 of 2:
    // read_record: the record without fields, version 1 (1 call, 0 reads);
    // fill at version 1, a new call and key: OK, the first read Holds:
    //   1 dispatch, 1 read; the record is at version 2;
    // recorded at version 2: not compound, OK believed: 1 dispatch.
    // Total 5 calls, 1 + 6 + 1 = 8 reads, 2000 ms; one creation (partial)
    // and one full fill: no duplicate; the postcondition holds.
    assert_eq!(trace, ["row", "create", "read", "fill", "recorded"]);
    assert_eq!((e.success, e.claimed, e.duplicate), (true, true, false));
    assert_eq!((e.tool_calls, e.verifier_calls, e.virtual_ms), (5, 8, 2000));

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
    // row 1 call, 1 read; create 1 call, 6 reads, 2000 ms → re-plan 1: read
    // (1 call) → fill at v1: OK but partial, 6 reads Absent, 2000 ms →
    // re-plan 2: read (1 call) sees the invoice id at v2 → fill at v2: OK,
    // 1 read Holds (v3) → recorded at v3, 1 call. Total 7 calls,
    // 1 + 6 + 6 + 1 = 14 reads, 4000 ms. The fill applied twice, once in
    // full: no duplicate.
    assert_eq!(trace, ["row", "create", "read", "fill", "read", "fill", "recorded"]);
    assert_eq!((e.success, e.claimed, e.duplicate), (true, true, false));
    assert_eq!((e.tool_calls, e.verifier_calls, e.virtual_ms), (7, 14, 4000));

    // With one re-plan per step the second partial ends the episode: row,
    // create, read, fill; then the agent reports failure, honestly.
    let settings = Settings { latency: Duration::ZERO, replans: 1, ..Settings::default() };
    let task = TaskKind::RecordInvoice.instance(seed);
    let spec = EpisodeSpec { task, profile: p, seed, method: Method::VerifyBeforeRetry, settings };
    let e = experiment::run_episode(&spec);
    assert_eq!((e.success, e.claimed, e.duplicate), (false, false, false));
    assert_eq!((e.tool_calls, e.verifier_calls, e.virtual_ms), (4, 13, 4000));
}

#[test]
fn the_figure_has_one_legend_titles_and_axes() {
    let methods = [Method::RetryOnly, Method::VerifyBeforeRetry];
    let results = grid(25, &methods, 1);
    let path = std::env::temp_dir().join(format!("figure2-{}.svg", std::process::id()));
    report::svg(&results, &path).expect("the figure draws");
    let svg = std::fs::read_to_string(&path).expect("the figure was written");
    let _ = std::fs::remove_file(&path);
    let texts: Vec<&str> = svg
        .split("<text")
        .skip(1)
        .filter_map(|t| t.split_once('>').and_then(|(_, rest)| rest.split_once("</text>")))
        .map(|(text, _)| text.trim())
        .collect();
    let count = |s: &str| texts.iter().filter(|&&t| t == s).count();
    // One shared legend: each method named once, the others not at all.
    assert_eq!((count("retry_only"), count("verify_before_retry")), (1, 1), "{texts:?}");
    assert_eq!(count("verify_only") + count("keys_only") + count("vbr_no_server_keys"), 0);
    for task in ["activate_customer", "record_invoice"] {
        assert_eq!(count(&format!("{task}: task success")), 1);
        assert_eq!(count(&format!("{task}: duplicate actions")), 1);
    }
    // Both axes described in every panel; every level labelled per panel.
    assert_eq!(count("fault level"), 4);
    assert_eq!(count("postcondition holds (%)") + count("episodes with a duplicate (%)"), 4);
    for level in ["low", "medium", "high", "extreme"] {
        assert_eq!(count(level), 4, "{level}");
    }
    // verify_before_retry never duplicates: its 8 0% bars are labelled "0",
    // next to the 4 panels' "0" ticks (retry_only duplicates in every cell).
    assert_eq!(count("0"), 8 + 4);
    assert!(texts.iter().any(|t| t.contains("25 episodes per cell")));
    // Success panels end at 100%; the duplicate panels at the highest
    // interval bound rounded up to 10% (retry_only, 6/25: 43.4% → 50%).
    assert_eq!((count("100"), count("50")), (2, 2));
}
