use verified_tools::{ErrorClass, Verdict, verified_tool};

#[verified_tool(side_effect = "high", verify = check_sent)]
async fn send_welcome(to: &str, times: u32) -> Result<(), ErrorClass> {
    let _ = (to, times);
    Ok(())
}

async fn check_sent(to: &str) -> Verdict<()> {
    let _ = to;
    Verdict::Absent
}

fn main() {}
