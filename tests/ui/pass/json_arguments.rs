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

fn main() {
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
}
