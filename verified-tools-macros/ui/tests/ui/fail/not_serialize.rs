use verified_tools::{ErrorClass, verified_tool};

/// A client handle: not Serialize, and not skipped.
pub struct Crm;

#[verified_tool(side_effect = "low")]
async fn activate(crm: &Crm, customer_id: u64) -> Result<(), ErrorClass> {
    let _ = (crm, customer_id);
    Ok(())
}

fn main() {}
