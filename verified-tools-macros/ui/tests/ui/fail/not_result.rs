use verified_tools::{ErrorClass, verified_tool};

#[verified_tool(side_effect = "low")]
async fn save_draft(body: &str) -> Option<u32> {
    let _ = body;
    Some(1)
}

#[verified_tool(side_effect = "none")]
async fn ping() {}

fn main() {
    let _ = ErrorClass::Definitive;
}
