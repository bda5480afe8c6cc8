use verified_tools::{ErrorClass, IdempotencyKey, Verdict, verified_tool};

// The verifier takes the key, but the attribute says it does not.
#[verified_tool(side_effect = "high", verify = check_sent, verify_key = false)]
async fn send(to: &str, key: IdempotencyKey) -> Result<(), ErrorClass> {
    let _ = (to, key);
    Ok(())
}

async fn check_sent(to: &str, key: IdempotencyKey) -> Verdict<()> {
    let _ = (to, key);
    Verdict::Absent
}

fn main() {}
