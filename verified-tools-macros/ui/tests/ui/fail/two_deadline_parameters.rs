use verified_tools::{Deadline, ErrorClass, verified_tool};

#[verified_tool(side_effect = "low")]
async fn upload(name: u32, first: Deadline, second: Deadline) -> Result<u32, ErrorClass> {
    let _ = (first, second);
    Ok(name)
}

fn main() {}
