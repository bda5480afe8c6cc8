use verified_tools::{ErrorClass, verified_tool};

/// Deserializes, but has no JSON Schema.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct Filter {
    pub status: String,
}

#[verified_tool(side_effect = "none", schema = true)]
async fn search(filter: Filter, limit: u32) -> Result<u32, ErrorClass> {
    let _ = filter;
    Ok(limit)
}

fn main() {}
