use verified_tools::verified_tool;

#[derive(Debug)]
pub struct MyError;

#[verified_tool(side_effect = "low")]
async fn save_draft(body: &str) -> Result<(), MyError> {
    let _ = body;
    Ok(())
}

impl std::fmt::Display for MyError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("my error")
    }
}

// Listed for a model, with a verifier: still one error, on the error type.
#[verified_tool(side_effect = "high", verify = saved, schema = true)]
async fn save_listed(body: String) -> Result<(), MyError> {
    let _ = body;
    Ok(())
}

async fn saved(_body: &String) -> verified_tools::Verdict<()> {
    verified_tools::Verdict::Holds(())
}

fn main() {}
