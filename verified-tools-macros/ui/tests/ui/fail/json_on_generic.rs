use verified_tools::{ErrorClass, verified_tool};

#[verified_tool(side_effect = "low", json = true)]
async fn store<T: serde::Serialize + Clone>(value: T) -> Result<(), ErrorClass> {
    let _ = value;
    Ok(())
}

fn main() {}
