use verified_tools::{ErrorClass, Verdict, verified_tool};

#[verified_tool(side_effect = "high", verify = check_sent)]
async fn send_welcome(to: &str) -> Result<(), ErrorClass> {
    let _ = to;
    Ok(())
}

// Not `async`: the wrapper awaits the verifier's read.
fn check_sent(to: &str) -> Verdict<()> {
    let _ = to;
    Verdict::Absent
}

fn main() {}
