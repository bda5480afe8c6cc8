use std::rc::Rc;
use verified_tools::{ErrorClass, verified_tool};

#[verified_tool(side_effect = "none", send = true)]
async fn count(n: u64) -> Result<u64, ErrorClass> {
    let shared = Rc::new(n);
    tokio::task::yield_now().await;
    Ok(*shared)
}

fn main() {}
