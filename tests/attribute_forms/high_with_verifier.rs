//! A high-risk tool with a verifier, a key parameter and a skipped client.
use verified_tools::{
    Classify, Context, ErrorClass, IdempotencyKey, ToolResult, Verdict, verified_tool,
};

pub struct Crm;

#[derive(Debug, Clone, PartialEq)]
pub struct Customer {
    pub id: u64,
}

#[derive(Debug)]
pub struct CrmError;

impl std::fmt::Display for CrmError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("the service failed")
    }
}

impl Classify for CrmError {
    fn classify(&self) -> ErrorClass {
        ErrorClass::Ambiguous
    }
}

/// Activates a customer.
#[verified_tool(side_effect = "high", verify = check_activated, skip(crm))]
pub async fn activate_customer(
    crm: &Crm,
    customer_id: u64,
    key: IdempotencyKey,
) -> Result<Customer, CrmError> {
    let _ = (crm, key);
    Ok(Customer { id: customer_id })
}

async fn check_activated(_crm: &Crm, customer_id: &u64) -> Verdict<Customer> {
    Verdict::Holds(Customer { id: *customer_id })
}

#[test]
fn compiles_and_runs() {
    let cx = Context::new("agent");
    let _future = async move {
        let result: ToolResult<Customer, CrmError> = activate_customer(&cx, &Crm, 17).await;
        result
    };
    let spec = activate_customer_spec();
    assert!(spec.has_verifier);
}
