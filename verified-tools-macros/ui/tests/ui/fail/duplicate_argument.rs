use verified_tools::{ErrorClass, verified_tool};

#[verified_tool(side_effect = "low", retries = 2, retries = 3)]
async fn save_draft(body: &str) -> Result<(), ErrorClass> {
    let _ = body;
    Ok(())
}

fn main() {}
