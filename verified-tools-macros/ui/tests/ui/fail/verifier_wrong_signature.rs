use verified_tools::{ErrorClass, Verdict, verified_tool};

#[verified_tool(side_effect = "high", verify = check_sent)]
async fn send_welcome(to: &str, times: u32) -> Result<(), ErrorClass> {
    let _ = (to, times);
    Ok(())
}

// Takes `times` by value: the verifier gets every parameter by reference.
async fn check_sent(to: &str, times: u32) -> Verdict<()> {
    let _ = (to, times);
    Verdict::Absent
}

fn main() {}
