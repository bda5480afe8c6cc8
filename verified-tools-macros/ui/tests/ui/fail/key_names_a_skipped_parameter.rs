use verified_tools::{ErrorClass, verified_tool};

pub struct Bank;

#[verified_tool(side_effect = "low", skip(bank), key(bank))]
async fn charge(bank: &Bank, order: u64) -> Result<(), ErrorClass> {
    let _ = (bank, order);
    Ok(())
}

fn main() {}
