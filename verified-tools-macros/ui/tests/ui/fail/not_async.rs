use verified_tools::{ErrorClass, verified_tool};

#[verified_tool(side_effect = "low")]
fn save_draft(body: &str) -> Result<(), ErrorClass> {
    let _ = body;
    Ok(())
}

fn main() {}
