use verified_tools::{ErrorClass, IdempotencyKey, verified_tool};

pub struct Crm;

#[verified_tool(
    side_effect = "low",
    skip(crm),
    schema = true,
    params(
        customr = "The id.",
        crm = "The client.",
        key = "The key.",
        note = "",
        customer = "a",
        customer = "b"
    )
)]
async fn tag(crm: &Crm, customer: u64, note: &str, key: IdempotencyKey) -> Result<(), ErrorClass> {
    let _ = (crm, customer, note, key);
    Ok(())
}

#[verified_tool(side_effect = "low", params(customer = "The id."))]
async fn untag(customer: u64) -> Result<(), ErrorClass> {
    let _ = customer;
    Ok(())
}

#[verified_tool(side_effect = "low", schema = true, json = false, name = "drafts.save")]
async fn save(text: String) -> Result<(), ErrorClass> {
    let _ = text;
    Ok(())
}

#[verified_tool(side_effect = "low", skip(conn), schema = true, params(a))]
async fn store(conn: &Conn<'_>, value: u64) -> Result<(), ErrorClass> {
    let _ = (conn, value);
    Ok(())
}

pub struct Conn<'a>(&'a str);

fn main() {}
