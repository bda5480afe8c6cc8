//! A `Holder` parameter receives the call's hold on its ledger record (like
//! the key and the deadline, it is not an argument of the entry point), and
//! the descriptor says the tool asks for it.
use std::sync::Mutex;
use verified_tools::ledger::Fence;
use verified_tools::{
    Context, Deadline, ErrorClass, HoldLost, Holder, ToolResult, Verdict, verified_tool,
};

#[verified_tool(side_effect = "high", verify = check, skip(seen))]
pub async fn send(
    to: u64,
    deadline: Deadline,
    holder: Holder,
    seen: &Mutex<Option<Fence>>,
) -> Result<u64, ErrorClass> {
    holder.ensure(deadline.remaining()).await.map_err(|lost: HoldLost| {
        use verified_tools::Classify as _;
        lost.classify()
    })?;
    *seen.lock().unwrap() = holder.fence();
    Ok(to)
}

async fn check(to: &u64, _seen: &Mutex<Option<Fence>>) -> Verdict<u64> {
    Verdict::Holds(*to)
}

#[tokio::test(flavor = "current_thread")]
async fn compiles_and_runs() {
    let spec = send_spec();
    assert!(spec.holder, "a fn with a Holder parameter asks for it");
    assert_eq!(spec.params.len(), 2, "the holder is not a parameter: {:?}", spec.params);
    let cx = Context::new("mailer");
    let seen = Mutex::new(None);
    let result = send(&cx, 7, &seen).await;
    assert!(matches!(result, ToolResult::Success { value: 7, .. }), "{result:?}");
    assert!(seen.lock().unwrap().is_some(), "the attempt carried the hold's fence");
}
