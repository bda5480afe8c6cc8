use verified_tools::{ErrorClass, verified_tool};

// No `Display`: its text would go to the audit trail and to the model.
#[derive(Debug)]
pub struct Opaque;

fn classify(_: &Opaque) -> ErrorClass {
    ErrorClass::Ambiguous
}

#[verified_tool(side_effect = "low", classify = classify)]
async fn fetch(id: u64) -> Result<u64, Opaque> {
    Ok(id)
}

fn main() {}
