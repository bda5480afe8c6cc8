use verified_tools::{ErrorClass, Verdict, verified_tool};

#[verified_tool(side_effect = "high", verify = check_sent)]
async fn send_welcome(to: &str) -> Result<u64, ErrorClass> {
    let _ = to;
    Ok(1)
}

// Observes a String where the tool returns a u64.
async fn check_sent(to: &str) -> Verdict<String> {
    Verdict::Holds(to.to_owned())
}

fn main() {}
