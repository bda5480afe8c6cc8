use verified_tools::{ErrorClass, verified_tool};

#[verified_tool(side_effect = "low", timeout = "2sec", bucket = "5")]
async fn save_draft(body: &str) -> Result<(), ErrorClass> {
    let _ = body;
    Ok(())
}

fn main() {}
