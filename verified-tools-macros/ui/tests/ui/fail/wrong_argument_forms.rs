use verified_tools::{ErrorClass, verified_tool};

#[verified_tool(side_effect = high, verify, send = yes, name = "")]
async fn save_draft(body: &str) -> Result<(), ErrorClass> {
    let _ = body;
    Ok(())
}

fn main() {}
