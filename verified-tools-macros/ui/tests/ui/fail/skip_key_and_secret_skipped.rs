use verified_tools::{ErrorClass, IdempotencyKey, verified_tool};

pub struct Crm;

#[verified_tool(side_effect = "low", skip(crm, key), secret(crm))]
async fn activate(crm: &Crm, key: IdempotencyKey) -> Result<(), ErrorClass> {
    let _ = (crm, key);
    Ok(())
}

fn main() {}
