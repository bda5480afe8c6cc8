use verified_tools::{ErrorClass, verified_tool};

#[verified_tool(side_effect = "low", secret(password))]
async fn login(user: &str, token: &str) -> Result<(), ErrorClass> {
    let _ = (user, token);
    Ok(())
}

fn main() {}
