use verified_tools::{ErrorClass, verified_tool};

#[verified_tool(side_effect = "irreversible", retries = 0)]
async fn refund(order: u64) -> Result<(), ErrorClass> {
    let _ = order;
    Ok(())
}

fn main() {}
