use verified_tools::{ErrorClass, verified_tool};

// Four mistakes, four messages; callers still type-check against the stub.
#[verified_tool(side_effect = "irreversable", retries = "2", timeout = "2sec", skip(clinet))]
pub async fn refund(client: &str, order: u64) -> Result<u64, ErrorClass> {
    let _ = client;
    Ok(order)
}

fn main() {
    let cx = verified_tools::Context::new("agent");
    let _call = refund(&cx, "c", 1);
    let _spec = refund_spec();
}
