//! Figure 2 (`report::svg`): one legend in the summary table's words, a
//! panel per task for success, duplicates and false successes, and its
//! default place under the target directory the program was built in.

use std::path::Path;

use verified_tools_suite::experiment::{self, Config, Method, Results};
use verified_tools_suite::report;

fn grid(episodes: u64, methods: &[Method]) -> Results {
    let config = Config { episodes, methods: methods.to_vec(), threads: 1, ..Config::default() };
    experiment::run(&config, &|_| {}).expect("the in-memory ledger opens")
}

/// The figure's texts, in order, trimmed.
fn texts(results: &Results) -> Vec<String> {
    let path = std::env::temp_dir().join(format!(
        "figure2-{}-{}.svg",
        std::process::id(),
        results.config.methods.len()
    ));
    report::svg(results, &path).expect("the figure draws");
    let svg = std::fs::read_to_string(&path).expect("the figure was written");
    let _ = std::fs::remove_file(&path);
    svg.split("<text")
        .skip(1)
        .filter_map(|t| t.split_once('>').and_then(|(_, rest)| rest.split_once("</text>")))
        .map(|(text, _)| text.trim().to_owned())
        .collect()
}

/// The method column of the summary table: the text before the rates of
/// each row under a `method` header.
fn table_methods(summary: &str) -> Vec<String> {
    let mut rows = Vec::new();
    let mut in_rows = false;
    for line in summary.lines() {
        if line.starts_with("method ") {
            in_rows = true;
        } else if line.trim().is_empty() {
            in_rows = false;
        } else if in_rows {
            let (name, _) = line.split_at(32.min(line.len()));
            rows.push(name.trim().to_owned());
        }
    }
    rows
}

#[test]
fn the_legend_names_each_method_as_the_table_does() {
    let results = grid(4, &Method::ALL);
    let texts = texts(&results);
    let count = |s: &str| texts.iter().filter(|t| *t == s).count();
    let table = table_methods(&report::summary(&results));
    // Every method the table names, once per task.
    assert_eq!(table.len(), 2 * Method::ALL.len(), "{table:?}");
    for name in &table {
        assert_eq!(count(name), 1, "the table's {name:?} in the legend, once: {texts:?}");
    }
    // No command-line identifier anywhere in the figure.
    for method in Method::ALL {
        assert!(texts.iter().all(|t| !t.contains(method.name())), "{}", method.name());
    }
}

#[test]
fn the_figure_has_success_duplicate_and_false_success_panels() {
    let methods = [Method::RetryOnly, Method::VerifyBeforeRetry];
    let results = grid(25, &methods);
    let texts = texts(&results);
    let count = |s: &str| texts.iter().filter(|t| *t == s).count();
    for task in ["activate_customer", "record_invoice"] {
        for panel in ["task success", "duplicate actions", "false successes"] {
            assert_eq!(count(&format!("{task}: {panel}")), 1, "{task}: {panel}");
        }
    }
    // Both axes described in every panel; every level labelled per panel.
    assert_eq!(count("fault level"), 6);
    assert_eq!(count("postcondition holds (%)"), 2);
    assert_eq!(count("episodes with a duplicate (%)"), 2);
    assert_eq!(count("claimed done, truth disagrees (%)"), 2);
    for level in ["low", "medium", "high", "extreme"] {
        assert_eq!(count(level), 6, "{level}");
    }
    // A 0% bar is labelled "0", beside the 6 panels' "0" ticks: verify
    // before retry never duplicates nor claims falsely (16 bars), and the
    // baseline's cells at 0% are labelled too.
    let rates: Vec<_> = results.cells.iter().map(|c| report::Rates::of(&results, c)).collect();
    let zeros = rates
        .iter()
        .map(|r| [r.success, r.duplicates, r.false_success].iter().filter(|&&p| p == 0.0).count())
        .sum::<usize>();
    let vbr = results.cells.iter().filter(|c| c.method == Method::VerifyBeforeRetry);
    assert!(vbr.clone().all(|c| c.stats.duplicates == 0 && c.stats.false_successes == 0));
    assert!(zeros >= 16);
    assert_eq!(count("0"), zeros + 6);
    assert!(texts.iter().any(|t| t.contains("25 episodes per cell")));
    // Success panels end at 100%; the duplicate and false-success panels at
    // the highest of their interval bounds, rounded up to 10%.
    let highest =
        rates.iter().map(|r| r.duplicates_ci.hi.max(r.false_success_ci.hi)).fold(0.0, f64::max);
    let top = ((100.0 * highest / 10.0).ceil() * 10.0) as u32;
    assert!((50..100).contains(&top), "{highest}");
    let on_success_axis = if top.is_multiple_of(20) { 2 } else { 0 };
    assert_eq!((count("100"), count(&top.to_string())), (2, 4 + on_success_axis), "top {top}");
}

#[test]
fn the_figure_goes_to_the_target_directory_the_program_was_built_in() {
    let at = |exe: &str| report::default_figure_path(Path::new(exe));
    let expected = Path::new("/build/out/experiment/figure2.svg");
    assert_eq!(at("/build/out/release/examples/agent"), expected);
    assert_eq!(at("/build/out/debug/examples/agent-0123abcd"), expected);
    // Not a cargo example: the target directory cargo would use.
    let target = std::env::var_os("CARGO_TARGET_DIR").unwrap_or_else(|| "target".into());
    let fallback = Path::new(&target).join("experiment").join("figure2.svg");
    assert_eq!(at("/usr/local/bin/agent"), fallback);
}
