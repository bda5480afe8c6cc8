//! timeout, bucket, name, retries, verify_response, send.
use verified_tools::{Context, ErrorClass, IdempotencyKey, ToolResult, Verdict, verified_tool};

#[verified_tool(
    side_effect = "high",
    verify = check,
    retries = 3,
    timeout = "250ms",
    bucket = "1h",
    name = "crm.activate",
    verify_response = true,
    send = true,
)]
pub async fn activate(id: u64, key: IdempotencyKey) -> Result<u64, ErrorClass> {
    let _ = key;
    Ok(id)
}

async fn check(id: &u64) -> Verdict<u64> {
    Verdict::Holds(*id)
}

#[verified_tool(side_effect = "low", timeout = "3m", send = false, verify_response = false, verify = check)]
async fn other(id: u64) -> Result<u64, ErrorClass> {
    Ok(id)
}

fn assert_send<F: Send>(_: F) {}

#[test]
fn compiles_and_runs() {
    let cx = Context::new("agent");
    assert_send(async move {
        let r: ToolResult<u64, ErrorClass> = activate(&cx, 1).await;
        r
    });
    let spec = activate_spec();
    assert_eq!(spec.name, "crm.activate");
    assert_eq!(spec.retries, Some(3));
    assert_eq!(spec.timeout, Some(std::time::Duration::from_millis(250)));
    assert_eq!(spec.bucket, Some(std::time::Duration::from_secs(3600)));
    assert_eq!(spec.verify_response, Some(true));
    assert_eq!(other_spec().timeout, Some(std::time::Duration::from_secs(180)));
    let _ = other;
}
