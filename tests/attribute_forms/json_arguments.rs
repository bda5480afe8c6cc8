//! `json = true`: `<name>_json` takes the key-relevant arguments from JSON
//! (`&str` as a string, `&[T]` as an array, `&T` as a `T`), the skipped ones
//! as Rust values.
use verified_tools::{ArgsError, Context, ErrorClass, ToolResult, verified_tool};

pub struct Mailer;

#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Attachment {
    pub name: String,
}

#[verified_tool(side_effect = "low", skip(mailer), json = true)]
pub async fn send_mail(
    mailer: &Mailer,
    to: &str,
    cc: &[String],
    attachment: &Attachment,
    urgent: bool,
) -> Result<usize, ErrorClass> {
    let _ = (mailer, attachment, urgent);
    Ok(to.len() + cc.len())
}

/// A parameter named like the tool, and an optional borrowed one.
#[verified_tool(side_effect = "low", json = true)]
pub async fn refund(refund: u64, memo: Option<&str>) -> Result<u64, ErrorClass> {
    Ok(refund + memo.map_or(0, |m| m.len() as u64))
}

#[test]
fn compiles_and_runs() {
    let cx = Context::new("agent");
    let args = serde_json::json!({
        "to": "bob@example.com",
        "cc": ["eve@example.com"],
        "attachment": {"name": "invoice.pdf"},
        "urgent": false,
    });
    let _future = async move {
        let result: Result<ToolResult<usize, ErrorClass>, ArgsError> =
            send_mail_json(&cx, &Mailer, &args).await;
        result
    };
    let cx = Context::new("agent");
    let _refund = async move {
        let args = serde_json::json!({"refund": 5});
        let result: Result<ToolResult<u64, ErrorClass>, ArgsError> = refund_json(&cx, &args).await;
        result
    };
}
