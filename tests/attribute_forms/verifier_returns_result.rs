//! A verifier may return `Result<Verdict<T>, E>`: a failed read is Unknown.
use verified_tools::{Classify, Context, ErrorClass, ToolResult, Verdict, verified_tool};

#[derive(Debug)]
pub enum DbError {
    Down,
}

impl std::fmt::Display for DbError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("the service failed")
    }
}

impl Classify for DbError {
    fn classify(&self) -> ErrorClass {
        ErrorClass::Ambiguous
    }
}

#[verified_tool(side_effect = "irreversible", verify = read_row)]
pub async fn delete_row(table: &str, id: u64) -> Result<(), DbError> {
    let _ = (table, id);
    Err(DbError::Down)
}

async fn read_row(_table: &str, _id: &u64) -> Result<Verdict<()>, DbError> {
    Err(DbError::Down)
}

#[tokio::test(start_paused = true)]
async fn a_failed_read_leaves_an_irreversible_call_in_doubt() {
    let cx = Context::new("agent");
    let result = delete_row(&cx, "rows", 1).await;
    // The answer was lost and the verifier could not read: escalated, not
    // retried, not reported as a success or as not applied.
    assert!(matches!(result, ToolResult::Escalated { .. }), "{result:?}");
    assert_eq!(delete_row_spec().name, "delete_row");
}
