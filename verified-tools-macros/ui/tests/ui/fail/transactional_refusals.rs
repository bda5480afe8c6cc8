use verified_tools::{Deadline, ErrorClass, Verdict, verified_tool};

async fn booked(order: &u64) -> Verdict<()> {
    let _ = order;
    Verdict::Unknown
}

// Every refusal at once: a verifier, a settle margin, JSON, a deadline.
#[verified_tool(side_effect = "high", transactional, verify = booked, settle = "1s", json)]
async fn book(tx: &Tx<'_>, order: u64, deadline: Deadline) -> Result<(), ErrorClass> {
    let _ = (tx, order, deadline);
    Ok(())
}

#[verified_tool(side_effect = "none", transactional)]
async fn read(tx: &Tx<'_>, order: u64) -> Result<(), ErrorClass> {
    let _ = (tx, order);
    Ok(())
}

// `verified_tools::ledger::Tx` (feature `postgres`, which this package does
// not build): the rules read the type's name only.
struct Tx<'a>(std::marker::PhantomData<&'a ()>);

fn main() {}
