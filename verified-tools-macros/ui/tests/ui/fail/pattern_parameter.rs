use verified_tools::{ErrorClass, verified_tool};

#[verified_tool(side_effect = "none")]
async fn add((a, b): (u64, u64)) -> Result<u64, ErrorClass> {
    Ok(a + b)
}

fn main() {}
