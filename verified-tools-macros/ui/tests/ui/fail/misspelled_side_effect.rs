use verified_tools::{ErrorClass, verified_tool};

#[verified_tool(side_effect = "hihg")]
async fn send_welcome(to: &str) -> Result<(), ErrorClass> {
    let _ = to;
    Ok(())
}

fn main() {}
