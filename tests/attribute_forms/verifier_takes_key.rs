//! A verifier that takes the call's key as its last parameter needs no
//! option: its parameters say it (`verify_key = true` is still accepted).
//! Boolean options are bare flags (`verify_response`, like tracing's `err`).
use verified_tools::{Context, ErrorClass, IdempotencyKey, ToolResult, Verdict, verified_tool};

#[verified_tool(side_effect = "high", verify = check_sent, verify_response)]
pub async fn send(to: u64, key: IdempotencyKey) -> Result<u64, ErrorClass> {
    let _ = key;
    Ok(to)
}

async fn check_sent(to: &u64, key: IdempotencyKey) -> Verdict<u64> {
    // The key the call was made with reaches the verifier.
    if key.to_string().is_empty() { Verdict::Absent } else { Verdict::Holds(*to) }
}

#[verified_tool(side_effect = "high", verify = check_sent, verify_key = true)]
pub async fn send_as_before(to: u64) -> Result<u64, ErrorClass> {
    Ok(to)
}

#[tokio::test(flavor = "current_thread")]
async fn compiles_and_runs() {
    assert_eq!(send_spec().verify_response, Some(true), "a bare flag is true");
    let cx = Context::new("mailer");
    let result = send(&cx, 7).await;
    assert!(
        matches!(
            result,
            ToolResult::Success { value: 7, proof: verified_tools::Proof::Verifier, .. }
        ),
        "the OK answer was read back by the verifier: {result:?}"
    );
    assert!(send_as_before(&cx, 8).await.is_success());
}
