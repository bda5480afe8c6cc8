use verified_tools::{ErrorClass, IdempotencyKey, Verdict, verified_tool};

// `verify_key = true`, but the verifier does not take the key.
#[verified_tool(side_effect = "high", verify = check_sent, verify_key = true)]
async fn send(to: &str, key: IdempotencyKey) -> Result<(), ErrorClass> {
    let _ = (to, key);
    Ok(())
}

async fn check_sent(to: &str) -> Verdict<()> {
    let _ = to;
    Verdict::Absent
}

fn main() {}
