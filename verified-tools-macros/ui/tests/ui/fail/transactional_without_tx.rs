use verified_tools::{ErrorClass, verified_tool};

#[verified_tool(side_effect = "high", transactional)]
async fn pay(order: u64) -> Result<(), ErrorClass> {
    let _ = order;
    Ok(())
}

fn main() {}
