use verified_tools::{ErrorClass, verified_tool};

pub struct Crm;

#[verified_tool(side_effect = "low", skip(crn))]
async fn activate(crm: &Crm, customer_id: u64) -> Result<(), ErrorClass> {
    let _ = (crm, customer_id);
    Ok(())
}

fn main() {}
