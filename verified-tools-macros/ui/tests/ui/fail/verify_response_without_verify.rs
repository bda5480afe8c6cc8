use verified_tools::{ErrorClass, verified_tool};

#[verified_tool(side_effect = "low", verify_response = true)]
async fn save_draft(body: &str) -> Result<(), ErrorClass> {
    let _ = body;
    Ok(())
}

fn main() {}
