use verified_tools::{ErrorClass, IdempotencyKey, verified_tool};

#[verified_tool(side_effect = "low", verify_key = true)]
async fn save_draft(text: &str, key: IdempotencyKey) -> Result<(), ErrorClass> {
    let _ = (text, key);
    Ok(())
}

fn main() {}
