use verified_tools::{ErrorClass, verified_tool};

/// Serializes (it is in the key) but does not deserialize.
#[derive(Clone, serde::Serialize)]
pub struct Filter {
    pub tag: String,
}

#[verified_tool(side_effect = "low", json = true)]
async fn search(filter: Filter, limit: u32) -> Result<u32, ErrorClass> {
    let _ = filter;
    Ok(limit)
}

fn main() {}
