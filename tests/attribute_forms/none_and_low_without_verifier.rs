//! "none" and "low" tools compile without a verifier; a key parameter is optional.
use verified_tools::{Context, ErrorClass, IdempotencyKey, ToolResult, verified_tool};

/// A read.
#[verified_tool(side_effect = "none")]
pub async fn search(query: &str) -> Result<Vec<String>, ErrorClass> {
    Ok(vec![query.to_owned()])
}

/// A draft: cheap to repeat, keyed.
#[verified_tool(side_effect = "low")]
pub async fn save_draft(body: String, key: IdempotencyKey) -> Result<u32, std::io::Error> {
    let _ = (body, key);
    Ok(1)
}

/// No parameters at all.
#[verified_tool(side_effect = "none")]
async fn ping() -> Result<(), ErrorClass> {
    Ok(())
}

#[test]
fn compiles_and_runs() {
    let cx = Context::new("agent");
    let _calls = async {
        let found: ToolResult<Vec<String>, ErrorClass> = search(&cx, "rust").await;
        let saved: ToolResult<u32, std::io::Error> = save_draft(&cx, "hello".to_owned()).await;
        let pong: ToolResult<(), ErrorClass> = ping(&cx).await;
        (found, saved, pong)
    };
    assert!(!search_spec().has_verifier);
    assert_eq!(save_draft_spec().params.len(), 1);
    assert!(ping_spec().params.is_empty());
}
