use verified_tools::{ErrorClass, verified_tool};

#[derive(Debug)]
pub struct ForeignError;

impl std::fmt::Display for ForeignError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("foreign")
    }
}

// Takes the error by value: a classifier takes `&E`.
fn by_value(_: ForeignError) -> ErrorClass {
    ErrorClass::Ambiguous
}

#[verified_tool(side_effect = "low", classify = by_value)]
async fn first(id: u64) -> Result<u64, ForeignError> {
    Ok(id)
}

// Returns something else than an `ErrorClass`.
fn retryable(_: &ForeignError) -> bool {
    true
}

#[verified_tool(side_effect = "low", classify = retryable)]
async fn second(id: u64) -> Result<u64, ForeignError> {
    Ok(id)
}

fn main() {}
