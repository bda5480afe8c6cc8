//! What the benchmarks share: the tool they all call (`save_draft`, a Low
//! side-effect class, no verifier, with a 5-field argument struct) and one
//! wrapped call of it. The benches themselves are this package's `[[bench]]`
//! targets (see `Cargo.toml` and BENCHMARKS.md).

use std::hint::black_box;
use std::io;

use serde::{Deserialize, Serialize};
use verified_tools::ledger::Codec;
use verified_tools::toolset::ToolSet;
use verified_tools::{Context, SideEffect, ToolResult, ToolSpec, engine, verified_tool};

/// The descriptor of the benches' tool.
pub static SAVE_DRAFT: ToolSpec = ToolSpec::new("save_draft", SideEffect::Low);

/// The tool's arguments: ids, a short string, an amount, a bool.
#[derive(Serialize)]
pub struct Draft<'a> {
    /// A user id.
    pub user: u64,
    /// The per-call sequence number: every call is another logical call.
    pub seq: u64,
    /// A short string.
    pub title: &'a str,
    /// An amount.
    pub amount: u32,
    /// A flag.
    pub urgent: bool,
}

/// The arguments of call `seq`.
pub fn draft(seq: u64) -> Draft<'static> {
    Draft { user: 42, seq, title: "quarterly report", amount: 1250, urgent: false }
}

/// The tool itself: trivial work, ready on the first poll.
pub async fn save_draft(args: &Draft<'_>) -> Result<u64, io::Error> {
    Ok(black_box(args.user) ^ args.seq)
}

/// One logical call of the tool through the engine (what `#[verified_tool]`
/// expands to), with the context's ledger and scope.
pub async fn call(cx: &Context, seq: u64) -> ToolResult<u64, io::Error> {
    let args = draft(seq);
    let dispatch = |_attempt| save_draft(&args);
    engine::call(cx, &SAVE_DRAFT, &args, &args, dispatch, engine::no_verifier(), Codec::serde())
        .await
}

/// The tool's arguments as a model sends them: owned, read from JSON.
#[derive(Serialize, Deserialize)]
pub struct DraftArgs {
    /// A user id.
    pub user: u64,
    /// The per-call sequence number.
    pub seq: u64,
    /// A short string.
    pub title: String,
    /// An amount.
    pub amount: u32,
    /// A flag.
    pub urgent: bool,
}

/// The JSON arguments of call `seq`, as a model writes them.
pub fn draft_json(seq: u64) -> serde_json::Value {
    serde_json::json!({
        "user": 42, "seq": seq, "title": "quarterly report", "amount": 1250, "urgent": false
    })
}

/// The same tool as a model calls it: listed in a [`ToolSet`], its
/// arguments read from JSON by `save_draft_json_json`.
#[verified_tool(side_effect = "low", schema)]
pub async fn save_draft_json(
    user: u64,
    seq: u64,
    title: String,
    amount: u32,
    urgent: bool,
) -> Result<u64, io::Error> {
    let _ = (title, amount, urgent);
    Ok(black_box(user) ^ seq)
}

/// A tool set of that one tool, with `cx` as its context.
pub fn tool_set(cx: Context) -> ToolSet<()> {
    ToolSet::new(()).with_context(cx).with(save_draft_json_tool())
}
