//! `classify = path`: the errors of a type that implements neither
//! `Classify` nor anything of this crate (another crate's error, such as
//! `anyhow::Error` or `reqwest::Error`) are classified by a function; the
//! entry point still returns the tool's own error type.
use verified_tools::{ArgsError, Context, ErrorClass, ToolResult, Verdict, verified_tool};

/// Stands for an error of another crate: `Display`, no `Classify`.
#[derive(Debug)]
pub struct ForeignError {
    pub status: u16,
}

impl std::fmt::Display for ForeignError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "status {}", self.status)
    }
}

fn classify_http(error: &ForeignError) -> ErrorClass {
    match error.status {
        400..=499 => ErrorClass::Definitive,
        _ => ErrorClass::Ambiguous,
    }
}

/// Any error type whose text is all there is: ambiguous.
fn always_ambiguous<E>(_: &E) -> ErrorClass {
    ErrorClass::Ambiguous
}

#[verified_tool(side_effect = "high", verify = posted, classify = classify_http, json = true)]
pub async fn post(id: u64) -> Result<u64, ForeignError> {
    Ok(id)
}

async fn posted(id: &u64) -> Verdict<u64> {
    Verdict::Holds(*id)
}

#[verified_tool(side_effect = "low", classify = always_ambiguous)]
pub async fn boxed(text: &str) -> Result<usize, Box<dyn std::error::Error + Send + Sync>> {
    Ok(text.len())
}

pub struct Client;

impl Client {
    #[verified_tool(side_effect = "none", classify = self::classify_http)]
    pub async fn get(&self, id: u64) -> Result<u64, ForeignError> {
        Ok(id)
    }
}

#[test]
fn compiles_and_runs() {
    let cx = Context::new("agent");
    let _calls = async move {
        let a: ToolResult<u64, ForeignError> = post(&cx, 1).await;
        let b: Result<ToolResult<u64, ForeignError>, ArgsError> =
            post_json(&cx, &serde_json::json!({"id": 1})).await;
        let c: ToolResult<usize, Box<dyn std::error::Error + Send + Sync>> = boxed(&cx, "x").await;
        let d: ToolResult<u64, ForeignError> = Client.get(&cx, 1).await;
        (a, b, c, d)
    };
}
