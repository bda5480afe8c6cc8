//! Generic tools keep their generics and where clause.
use serde::Serialize;
use verified_tools::{Classify, Context, ErrorClass, ToolResult, Verdict, verified_tool};

#[verified_tool(side_effect = "high", verify = stored)]
pub async fn store<V, E>(id: u64, value: V) -> Result<V, E>
where
    V: Serialize + Clone + Send + Sync + 'static,
    E: Classify,
{
    let _ = id;
    Ok(value)
}

async fn stored<V: Clone>(_id: &u64, value: &V) -> Verdict<V> {
    Verdict::Holds(value.clone())
}

#[verified_tool(side_effect = "none")]
async fn echo<'a>(text: &'a str, times: usize) -> Result<String, ErrorClass> {
    Ok(text.repeat(times))
}

#[test]
fn compiles_and_runs() {
    let cx = Context::new("agent");
    let _calls = async {
        let r: ToolResult<String, ErrorClass> = store(&cx, 1, "v".to_owned()).await;
        let e: ToolResult<String, ErrorClass> = echo(&cx, "ab", 2).await;
        (r, e)
    };
    assert_eq!(store_spec().params[1].ty, "V");
}
