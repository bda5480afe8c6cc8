//! Raw identifiers (`r#type`) as parameters, in the key, the audit, the
//! verifier call, the Send assertion and the JSON entry point.
use verified_tools::{Context, ErrorClass, ToolResult, Verdict, verified_tool};

#[verified_tool(side_effect = "high", verify = check, secret(r#ref), send = true, json = true)]
pub async fn label(r#type: String, r#ref: u32) -> Result<u32, ErrorClass> {
    Ok(r#type.len() as u32 + r#ref)
}

// A verifier takes each parameter by shared reference, so a `String`
// parameter is read as `&String` (clippy would ask for `&str`).
#[allow(clippy::ptr_arg)]
async fn check(r#type: &String, r#ref: &u32) -> Verdict<u32> {
    Verdict::Holds(r#type.len() as u32 + *r#ref)
}

#[test]
fn compiles_and_runs() {
    let cx = Context::new("agent");
    let _future = async move {
        let result: ToolResult<u32, ErrorClass> = label(&cx, "invoice".to_owned(), 3).await;
        result
    };
    let cx = Context::new("agent");
    let _json = async move {
        let args = serde_json::json!({"type": "invoice", "ref": 3});
        label_json(&cx, &args).await
    };
    // Descriptors show the name an LLM-facing layer would use.
    assert_eq!(label_spec().params[0].name, "type");
}
