use verified_tools::{ErrorClass, verified_tool};

#[verified_tool(side_effect = "low", effect = "overwrites")]
async fn set_status(to: &str) -> Result<(), ErrorClass> {
    let _ = to;
    Ok(())
}

fn main() {}
