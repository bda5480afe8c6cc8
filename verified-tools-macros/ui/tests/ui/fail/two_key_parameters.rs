use verified_tools::{ErrorClass, IdempotencyKey, verified_tool};

#[verified_tool(side_effect = "low")]
async fn save_draft(
    body: &str,
    key: IdempotencyKey,
    again: IdempotencyKey,
) -> Result<(), ErrorClass> {
    let _ = (body, key, again);
    Ok(())
}

fn main() {}
