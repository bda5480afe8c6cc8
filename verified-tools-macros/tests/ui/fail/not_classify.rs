use verified_tools::verified_tool;

#[derive(Debug)]
pub struct MyError;

#[verified_tool(side_effect = "low")]
async fn save_draft(body: &str) -> Result<(), MyError> {
    let _ = body;
    Ok(())
}

fn main() {}
