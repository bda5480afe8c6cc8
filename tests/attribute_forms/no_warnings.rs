//! Generated code adds no warning to a crate that denies them all: one-line
//! bodies (whose braces `unused_braces` would flag as a block's tail), a
//! method, a generic fn, `json`, `schema`, the key and deadline parameters,
//! `mut` parameters, `send`, `classify`, `?` and `return` in a body.
#![deny(warnings)]

use verified_tools::{
    Classify, Context, Deadline, ErrorClass, IdempotencyKey, ToolResult, Verdict, verified_tool,
};

#[derive(Debug)]
pub struct ApiError;

impl std::fmt::Display for ApiError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("api error")
    }
}

impl Classify for ApiError {
    fn classify(&self) -> ErrorClass {
        ErrorClass::Ambiguous
    }
}

#[verified_tool(side_effect = "none")]
async fn ping(n: u32) -> Result<u32, ApiError> {
    Ok(n)
}

#[verified_tool(side_effect = "low")]
async fn unit() -> Result<(), ApiError> {
    Ok(())
}

#[verified_tool(side_effect = "low")]
async fn keyed(n: u32, key: IdempotencyKey, deadline: Deadline) -> Result<String, ApiError> {
    Ok(format!("{n}{key}{deadline:?}"))
}

#[verified_tool(side_effect = "low")]
async fn owned(mut text: String, list: Vec<u8>) -> Result<usize, ApiError> {
    text.push('!');
    Ok(text.len() + list.len())
}

#[verified_tool(side_effect = "high", verify = pinged)]
async fn checked(n: u32) -> Result<u32, ApiError> {
    Ok(n)
}

async fn pinged(n: &u32) -> Verdict<u32> {
    Verdict::Holds(*n)
}

#[verified_tool(side_effect = "high", verify = by_key, verify_key = true)]
async fn checked_by_key(n: u32) -> Result<u32, ApiError> {
    Ok(n)
}

async fn by_key(n: &u32, key: IdempotencyKey) -> Verdict<u32> {
    let _ = key;
    Verdict::Holds(*n)
}

#[verified_tool(side_effect = "low", json = true, secret(token))]
async fn json(text: &str, token: &str, n: Option<u32>) -> Result<usize, ApiError> {
    Ok(text.len() + token.len() + n.unwrap_or(0) as usize)
}

/// Reads one number.
#[verified_tool(side_effect = "none", schema = true, params(n = "A number."))]
async fn listed(n: u32) -> Result<u32, ApiError> {
    Ok(n)
}

#[verified_tool(side_effect = "none", send = true)]
async fn sent(n: u32) -> Result<u32, ApiError> {
    Ok(n)
}

#[verified_tool(side_effect = "none")]
async fn parsed(text: &str) -> Result<u32, ApiError> {
    let n = text.parse::<u32>().map_err(|_| ApiError)?;
    Ok(n)
}

#[verified_tool(side_effect = "high", verify = always)]
async fn no_parameters() -> Result<(), ApiError> {
    Ok(())
}

async fn always() -> Verdict<()> {
    Verdict::Holds(())
}

/// `note` is only part of the key (and the audit): not "unused".
#[verified_tool(side_effect = "low")]
async fn key_only(order: u64, note: String, tag: &str) -> Result<u64, ApiError> {
    Ok(order)
}

#[verified_tool(side_effect = "none")]
async fn early(n: u32) -> Result<u32, ApiError> {
    if n == 0 {
        return Err(ApiError);
    }
    Ok(n)
}

/// Another crate's error: `Display`, no `Classify`.
#[derive(Debug)]
pub struct ForeignError;

impl std::fmt::Display for ForeignError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("foreign")
    }
}

fn classify_foreign(_: &ForeignError) -> ErrorClass {
    ErrorClass::Ambiguous
}

#[verified_tool(side_effect = "high", verify = pinged, classify = classify_foreign, json = true)]
async fn foreign(n: u32) -> Result<u32, ForeignError> {
    Ok(n)
}

#[verified_tool(side_effect = "high", verify = stored)]
async fn generic<V: serde::Serialize + Clone + Send + Sync + 'static>(
    value: V,
) -> Result<V, ApiError> {
    Ok(value)
}

async fn stored<V: Clone>(value: &V) -> Verdict<V> {
    Verdict::Holds(value.clone())
}

pub struct Svc;

impl Svc {
    #[verified_tool(side_effect = "high", verify = is_up)]
    async fn method(&self, n: u32) -> Result<u32, ApiError> {
        Ok(n)
    }

    async fn is_up(&self, n: &u32) -> Verdict<u32> {
        Verdict::Holds(*n)
    }

    #[verified_tool(side_effect = "none", json = true, schema = true)]
    async fn listed_method(&self, n: u32) -> Result<u32, ApiError> {
        Ok(n)
    }
}

#[test]
fn compiles_and_runs() {
    let cx = Context::new("agent");
    let _calls = async move {
        let args = serde_json::json!({"text": "a", "token": "t"});
        let svc = Svc;
        let r: ToolResult<u32, ApiError> = ping(&cx, 1).await;
        let _ = r;
        let _ = unit(&cx).await;
        let _ = keyed(&cx, 1).await;
        let _ = owned(&cx, String::new(), vec![1]).await;
        let _ = checked(&cx, 1).await;
        let _ = checked_by_key(&cx, 1).await;
        let _ = json(&cx, "a", "b", None).await;
        let _ = json_json(&cx, &args).await;
        let _ = listed(&cx, 1).await;
        let _ = sent(&cx, 1).await;
        let _ = parsed(&cx, "1").await;
        let _ = early(&cx, 1).await;
        let _ = no_parameters(&cx).await;
        let _ = key_only(&cx, 1, String::new(), "t").await;
        let _ = foreign(&cx, 1).await;
        let _ = foreign_json(&cx, &args).await;
        let _ = generic(&cx, 1u8).await;
        let _ = svc.method(&cx, 1).await;
        let _ = svc.listed_method(&cx, 1).await;
    };
    let _ = verified_tools::toolset::ToolSet::new(Svc)
        .with(listed_tool())
        .with(Svc::listed_method_tool());
}
