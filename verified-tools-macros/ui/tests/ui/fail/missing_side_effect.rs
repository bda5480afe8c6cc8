use verified_tools::{ErrorClass, verified_tool};

#[verified_tool(retries = 1)]
async fn save_draft(body: &str) -> Result<(), ErrorClass> {
    let _ = body;
    Ok(())
}

fn main() {}
