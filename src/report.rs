//! The experiment's outputs: the paper-style table, the JSON cells and the
//! paper's Figure 2 as SVG.

use std::fmt::Write as _;
use std::path::Path;

use plotters::prelude::*;
use plotters::style::text_anchor::{HPos, Pos, VPos};
use serde_json::{Value, json};
use verified_tools::sim::stats::{Interval, cohens_h, wilson95};

use verified_tools::sim::FaultLevel;

use crate::experiment::{Cell, Results};

/// The proportions of one cell, with their intervals and effect sizes.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Rates {
    /// Task success rate.
    pub success: f64,
    /// Its 95% Wilson interval.
    pub success_ci: Interval,
    /// Duplicate-action rate.
    pub duplicates: f64,
    /// Its 95% Wilson interval.
    pub duplicates_ci: Interval,
    /// False-success rate (claimed, not true), over all episodes.
    pub false_success: f64,
    /// Its 95% Wilson interval.
    pub false_success_ci: Interval,
    /// Cohen's h of the success rate against the baseline cell.
    pub h_success: Option<f64>,
    /// Cohen's h of the duplicate rate against the baseline cell.
    pub h_duplicates: Option<f64>,
}

impl Rates {
    /// The rates of `cell`, compared with its baseline in `results`.
    pub fn of(results: &Results, cell: &Cell) -> Self {
        let s = &cell.stats;
        let rate = |k| s.per_episode(k);
        let base = results.baseline(cell).map(|b| b.stats);
        let base_rate = |k: u64| base.map(|b| b.per_episode(k));
        let (success, duplicates) = (rate(s.successes), rate(s.duplicates));
        Rates {
            success,
            success_ci: wilson95(s.successes, s.episodes),
            duplicates,
            duplicates_ci: wilson95(s.duplicates, s.episodes),
            false_success: rate(s.false_successes),
            false_success_ci: wilson95(s.false_successes, s.episodes),
            h_success: base.and_then(|b| base_rate(b.successes)).map(|p| cohens_h(success, p)),
            h_duplicates: base
                .and_then(|b| base_rate(b.duplicates))
                .map(|p| cohens_h(duplicates, p)),
        }
    }
}

fn pct(p: f64) -> String {
    format!("{:.1}", 100.0 * p)
}

fn ci(i: Interval) -> String {
    format!("[{:>5}, {:>5}]", pct(i.lo), pct(i.hi))
}

fn h(x: Option<f64>) -> String {
    x.map_or_else(|| "-".to_owned(), |x| format!("{x:+.2}"))
}

/// The summary: per task, one line per method with success, duplicate and
/// false-success rates at each level; fits 100 columns.
pub fn summary(results: &Results) -> String {
    const METHOD: usize = 32;
    let mut out = String::new();
    let levels = &results.config.levels;
    let group = levels.len() * 5;
    let mut tasks = Vec::new();
    for cell in &results.cells {
        if !tasks.contains(&cell.task) {
            tasks.push(cell.task);
        }
    }
    let short = |level: FaultLevel| match level {
        FaultLevel::Medium => "med",
        FaultLevel::Extreme => "extr",
        other => other.name(),
    };
    let level_names: String = levels.iter().map(|&l| format!("{:>5}", short(l))).collect();
    for task in tasks {
        let _ = writeln!(
            out,
            "{:<METHOD$}{:>group$}  {:>group$}  {:>group$}",
            task.name(),
            "success %",
            "duplicates %",
            "false succ. %",
        );
        let _ = writeln!(out, "{:<METHOD$}{level_names}  {level_names}  {level_names}", "method");
        let mut methods = Vec::new();
        for cell in results.cells.iter().filter(|c| c.task == task) {
            if !methods.contains(&cell.method) {
                methods.push(cell.method);
            }
        }
        for method in methods {
            let mut cols = [String::new(), String::new(), String::new()];
            for &level in levels {
                let cell = results
                    .cells
                    .iter()
                    .find(|c| c.task == task && c.level == level && c.method == method);
                let r = cell.map(|c| Rates::of(results, c));
                for (col, rate) in cols.iter_mut().zip([
                    r.map(|r| r.success),
                    r.map(|r| r.duplicates),
                    r.map(|r| r.false_success),
                ]) {
                    let _ = write!(col, "{:>5}", rate.map_or_else(|| "-".into(), short_pct));
                }
            }
            let _ =
                writeln!(out, "{:<METHOD$}{}  {}  {}", method.label(), cols[0], cols[1], cols[2]);
        }
        out.push('\n');
    }
    out.push_str(
        "verify+retry: verify before retry against a server that honours no deadlines, no keys, or\n\
         neither of them; no margin: without a settle margin (the library's default).\n",
    );
    out
}

/// A percentage in at most 4 characters: `100`, `99.8`, `0`.
fn short_pct(p: f64) -> String {
    let x = 100.0 * p;
    if x >= 99.95 {
        "100".to_owned()
    } else if x <= 0.0 {
        "0".to_owned()
    } else {
        format!("{x:.1}")
    }
}

/// The paper-style table: one line per cell.
pub fn table(results: &Results) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "{:<17} {:<7} {:<21} {:>6} {:<14} {:>5} {:<14} {:>6} {:>6} {:>6} {:>6} {:>6} {:>6} {:>8}",
        "task",
        "level",
        "method",
        "succ%",
        "95% CI",
        "dup%",
        "95% CI",
        "h(s)",
        "h(d)",
        "false%",
        "doubt%",
        "calls",
        "verif",
        "latency",
    );
    let mut last = None;
    for cell in &results.cells {
        if last.is_some_and(|l| l != (cell.task, cell.level)) {
            out.push('\n');
        }
        last = Some((cell.task, cell.level));
        let r = Rates::of(results, cell);
        let s = &cell.stats;
        let _ = writeln!(
            out,
            "{:<17} {:<7} {:<21} {:>6} {:<14} {:>5} {:<14} {:>6} {:>6} {:>6} {:>6} {:>6.2} {:>6.2} {:>7.2}s",
            cell.task.name(),
            cell.level.name(),
            cell.method.name(),
            pct(r.success),
            ci(r.success_ci),
            pct(r.duplicates),
            ci(r.duplicates_ci),
            h(r.h_success),
            h(r.h_duplicates),
            pct(r.false_success),
            pct(s.per_episode(s.in_doubt)),
            s.per_episode(s.tool_calls),
            s.per_episode(s.verifier_calls),
            s.per_episode(s.virtual_ms) / 1000.0,
        );
    }
    let c = &results.config;
    let _ = writeln!(
        out,
        "\n{} episodes per cell, seeds {}..={}. succ: postcondition holds on the ground truth \
         (once late arrivals have landed); dup: some effect applied more than once;\nfalse: the \
         agent reported success and the truth disagrees; doubt: the agent stopped on a call in \
         doubt (Unknown); h: Cohen's h against retry_only;\ncalls, verif, latency: per episode \
         (virtual time).",
        c.episodes,
        c.seed,
        c.seed + c.episodes.saturating_sub(1),
    );
    out
}

/// The JSON document: `{"config": {..}, "cells": [{"task", "level",
/// "method", "episodes", "successes", "duplicates", "false_successes", ..}]}`.
/// The counts' field names are stable.
pub fn json(results: &Results) -> Value {
    let pair = |i: Interval| json!([i.lo, i.hi]);
    let cells: Vec<Value> = results
        .cells
        .iter()
        .map(|cell| {
            let s = &cell.stats;
            let r = Rates::of(results, cell);
            json!({
                "task": cell.task.name(),
                "level": cell.level.name(),
                "method": cell.method.name(),
                "episodes": s.episodes,
                "successes": s.successes,
                "duplicates": s.duplicates,
                "false_successes": s.false_successes,
                "in_doubt": s.in_doubt,
                "claimed_successes": s.claimed,
                "tool_calls": s.tool_calls,
                "verifier_calls": s.verifier_calls,
                "virtual_ms": s.virtual_ms,
                "success_rate": r.success,
                "success_ci95": pair(r.success_ci),
                "duplicate_rate": r.duplicates,
                "duplicate_ci95": pair(r.duplicates_ci),
                "false_success_rate": r.false_success,
                "cohens_h_success": r.h_success,
                "cohens_h_duplicates": r.h_duplicates,
                "tool_calls_per_episode": s.per_episode(s.tool_calls),
                "verifier_calls_per_episode": s.per_episode(s.verifier_calls),
                "virtual_ms_per_episode": s.per_episode(s.virtual_ms),
            })
        })
        .collect();
    let c = &results.config;
    let name = |x: &dyn ToString| x.to_string();
    json!({
        "config": {
            "episodes": c.episodes,
            "seed": c.seed,
            "tasks": c.tasks.iter().map(|t| name(t)).collect::<Vec<_>>(),
            "levels": c.levels.iter().map(|l| name(l)).collect::<Vec<_>>(),
            "methods": c.methods.iter().map(|m| name(m)).collect::<Vec<_>>(),
            "legacy_faults": c.settings.legacy_faults,
            "faults": c.settings.faults.name(),
            "believe_ok": c.settings.believe_ok,
        },
        "cells": cells,
    })
}

/// One colour per method, in [`Method::ALL`](crate::experiment::Method::ALL) order.
const COLOURS: [RGBColor; 8] = [
    RGBColor(214, 39, 40),
    RGBColor(255, 127, 14),
    RGBColor(44, 160, 44),
    RGBColor(148, 103, 189),
    RGBColor(31, 119, 180),
    RGBColor(140, 86, 75),
    RGBColor(227, 119, 194),
    RGBColor(127, 127, 127),
];

/// Width of one legend entry: the longest label, "verify+retry, neither,
/// no margin", at 16 px.
const LEGEND_SLOT: u32 = 320;

/// Legend entries per row.
const LEGEND_PER_ROW: usize = 4;

/// Height of one legend row.
const LEGEND_ROW: u32 = 28;

/// What a panel plots of each cell.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Panel {
    Success,
    Duplicates,
    FalseSuccesses,
}

impl Panel {
    const ALL: [Panel; 3] = [Panel::Success, Panel::Duplicates, Panel::FalseSuccesses];

    /// The rate and its interval.
    fn of(self, r: &Rates) -> (f64, Interval) {
        match self {
            Panel::Success => (r.success, r.success_ci),
            Panel::Duplicates => (r.duplicates, r.duplicates_ci),
            Panel::FalseSuccesses => (r.false_success, r.false_success_ci),
        }
    }

    /// The panel's title after the task, and its axis, in the summary
    /// table's words.
    fn words(self) -> (&'static str, &'static str) {
        match self {
            Panel::Success => ("task success", "postcondition holds (%)"),
            Panel::Duplicates => ("duplicate actions", "episodes with a duplicate (%)"),
            Panel::FalseSuccesses => ("false successes", "claimed done, truth disagrees (%)"),
        }
    }
}

/// The default place of Figure 2 for the program at `exe`: beside the
/// other outputs of the target directory it was built in
/// (`<target>/<profile>/examples/agent` draws `<target>/experiment/figure2.svg`),
/// wherever `CARGO_TARGET_DIR` put it; for a program that is not a cargo
/// example, `$CARGO_TARGET_DIR/experiment/` or `./target/experiment/`.
pub fn default_figure_path(exe: &Path) -> std::path::PathBuf {
    let built_in = exe
        .parent()
        .filter(|dir| dir.file_name().is_some_and(|n| n == "examples"))
        .and_then(Path::parent)
        .and_then(Path::parent);
    let target = match built_in {
        Some(target) => target.to_path_buf(),
        None => std::env::var_os("CARGO_TARGET_DIR").map_or_else(|| "target".into(), Into::into),
    };
    target.join("experiment").join("figure2.svg")
}

/// Draws Figure 2: per task, success, duplicate and false-success rates
/// (bars, with their 95% Wilson intervals as whiskers) per level and
/// method, the methods named as the summary table names them
/// ([`Method::label`](crate::experiment::Method::label)); a 0% bar is
/// labelled "0" so that a method that never duplicates is visibly there.
/// The duplicate and false-success panels' axis ends at the highest of
/// their interval bounds (rounded up to 10%), the success panels' at 100%.
pub fn svg(results: &Results, path: &Path) -> Result<(), Box<dyn std::error::Error>> {
    let c = &results.config;
    let rows = c.tasks.len().max(1) as u32;
    let legend_rows = c.methods.len().div_ceil(LEGEND_PER_ROW).max(1) as u32;
    let width = (LEGEND_SLOT * LEGEND_PER_ROW as u32 + 40).max(1800);
    let legend_height = LEGEND_ROW * legend_rows + 12;
    let root = SVGBackend::new(path, (width, 40 + legend_height + 420 * rows)).into_drawing_area();
    root.fill(&WHITE)?;
    let title = format!(
        "Success, duplicate actions and false successes per fault level and method ({} \
         episodes per cell; whiskers: 95% Wilson interval)",
        c.episodes
    );
    let root = root.titled(&title, ("sans-serif", 20))?;
    let (legend, root) = root.split_vertically(legend_height);
    draw_legend(&legend, &c.methods)?;
    // Duplicates and false successes stay low: their panels share an axis
    // that ends at the highest interval bound, rounded up to 10%, instead
    // of at 100%.
    let highest = results
        .cells
        .iter()
        .map(|cell| Rates::of(results, cell))
        .map(|r| r.duplicates_ci.hi.max(r.false_success_ci.hi))
        .fold(0.0, f64::max);
    let low_top = ((100.0 * highest / 10.0).ceil() * 10.0).clamp(10.0, 100.0);
    let panels = root.split_evenly((rows as usize, Panel::ALL.len()));
    for (i, area) in panels.iter().enumerate() {
        let Some(&task) = c.tasks.get(i / Panel::ALL.len()) else { break };
        let panel = Panel::ALL[i % Panel::ALL.len()];
        let top = if panel == Panel::Success { 100.0 } else { low_top };
        draw_panel(results, area, task, panel, top)?;
    }
    root.present()?;
    Ok(())
}

/// One legend for every panel, in rows above them (no legend box covers a
/// bar), each method in the summary table's words.
fn draw_legend(
    area: &DrawingArea<SVGBackend<'_>, plotters::coord::Shift>,
    methods: &[crate::experiment::Method],
) -> Result<(), Box<dyn std::error::Error>> {
    let (w, _) = area.dim_in_pixel();
    let slot = LEGEND_SLOT as i32;
    let per_row = methods.len().min(LEGEND_PER_ROW) as i32;
    let left = (w as i32 - slot * per_row).max(0) / 2;
    for (i, &method) in methods.iter().enumerate() {
        let x = left + slot * (i % LEGEND_PER_ROW) as i32;
        let y = 6 + (LEGEND_ROW as usize * (i / LEGEND_PER_ROW)) as i32;
        let colour = colour_of(method);
        area.draw(&Rectangle::new([(x, y + 4), (x + 16, y + 20)], colour.filled()))?;
        let style =
            ("sans-serif", 16).into_font().color(&BLACK).pos(Pos::new(HPos::Left, VPos::Center));
        area.draw(&Text::new(method.label(), (x + 24, y + 12), style))?;
    }
    Ok(())
}

fn colour_of(method: crate::experiment::Method) -> RGBColor {
    COLOURS[crate::experiment::Method::ALL.iter().position(|&x| x == method).unwrap_or(0)]
}

fn draw_panel(
    results: &Results,
    area: &DrawingArea<SVGBackend<'_>, plotters::coord::Shift>,
    task: verified_tools::sim::TaskKind,
    panel: Panel,
    top: f64,
) -> Result<(), Box<dyn std::error::Error>> {
    let c = &results.config;
    let levels = c.levels.len() as f64;
    let (what, y_desc) = panel.words();
    let title = format!("{task}: {what}");
    let mut chart = ChartBuilder::on(area)
        .caption(title, ("sans-serif", 18))
        .margin(12)
        .x_label_area_size(45)
        .y_label_area_size(60)
        .build_cartesian_2d(0.0..levels, 0.0..top)?;
    let level_at = |x: &f64| {
        let i = x.floor() as usize;
        let centred = (x - x.floor() - 0.5).abs() < 1e-6;
        c.levels.get(i).filter(|_| centred).map_or_else(String::new, |l| l.to_string())
    };
    chart
        .configure_mesh()
        .disable_x_mesh()
        .x_labels(2 * c.levels.len() + 1)
        .x_label_formatter(&level_at)
        .y_labels(6)
        .y_label_formatter(&|y| format!("{y:.0}"))
        .light_line_style(TRANSPARENT)
        .bold_line_style(BLACK.mix(0.12))
        .label_style(("sans-serif", 14))
        .axis_desc_style(("sans-serif", 14))
        .x_desc("fault level")
        .y_desc(y_desc)
        .draw()?;
    let width = 0.8 / c.methods.len().max(1) as f64;
    for (m, &method) in c.methods.iter().enumerate() {
        let colour = colour_of(method);
        let bars: Vec<_> = results
            .cells
            .iter()
            .filter(|cell| cell.task == task && cell.method == method)
            .filter_map(|cell| {
                let l = c.levels.iter().position(|&l| l == cell.level)? as f64;
                let (p, ci) = panel.of(&Rates::of(results, cell));
                Some((l + 0.1 + m as f64 * width, 100.0 * p, ci))
            })
            .collect();
        chart.draw_series(
            bars.iter().map(|&(x, y, _)| {
                Rectangle::new([(x, 0.0), (x + width * 0.9, y)], colour.filled())
            }),
        )?;
        chart.draw_series(bars.iter().map(|&(x, _, ci)| {
            let mid = x + width * 0.45;
            PathElement::new(vec![(mid, 100.0 * ci.lo), (mid, 100.0 * ci.hi)], BLACK)
        }))?;
        // A 0% bar: a stroke of its colour on the axis, and "0" left of its
        // whisker.
        let zero =
            ("sans-serif", 13).into_font().color(&colour).pos(Pos::new(HPos::Right, VPos::Bottom));
        for &(x, _, _) in bars.iter().filter(|&&(_, y, _)| y == 0.0) {
            let stroke = colour.stroke_width(3);
            chart
                .draw_series([PathElement::new(vec![(x, 0.0), (x + width * 0.9, 0.0)], stroke)])?;
            let above = top / 120.0;
            chart.draw_series([Text::new("0", (x + width * 0.38, above), zero.clone())])?;
        }
    }
    Ok(())
}

/// Writes the JSON document to `path`.
pub fn write_json(results: &Results, path: &Path) -> std::io::Result<()> {
    let text = serde_json::to_string_pretty(&json(results)).map_err(std::io::Error::other)?;
    std::fs::write(path, text + "\n")
}
