//! A `Deadline` parameter receives the attempt's deadline (like the key, it
//! is not an argument of the entry point); `settle` and `call_timeout` set
//! the settle margin and the call's deadline.
use std::time::Duration;
use verified_tools::{
    Context, Deadline, ErrorClass, IdempotencyKey, ToolResult, Verdict, verified_tool,
};

#[verified_tool(
    side_effect = "irreversible",
    verify = check,
    timeout = "1500ms",
    settle = "2s",
    call_timeout = "1m"
)]
pub async fn charge(
    order: u64,
    deadline: Deadline,
    key: IdempotencyKey,
) -> Result<u64, ErrorClass> {
    // Forward both: `grpc-timeout: 1500m`, `Idempotency-Key: ...`.
    let _ = (deadline.grpc_timeout().to_string(), key.to_string());
    Ok(order)
}

async fn check(order: &u64) -> Verdict<u64> {
    Verdict::Holds(*order)
}

#[test]
fn compiles_and_runs() {
    let spec = charge_spec();
    assert_eq!(spec.settle, Some(Duration::from_secs(2)));
    assert_eq!(spec.call_timeout, Some(Duration::from_secs(60)));
    assert_eq!(spec.timeout, Some(Duration::from_millis(1500)));
    assert_eq!(spec.params.len(), 1, "neither the deadline nor the key is a parameter");
    let cx = Context::new("billing");
    let _future = async move {
        let result: ToolResult<u64, ErrorClass> = charge(&cx, 7).await;
        result
    };
}
