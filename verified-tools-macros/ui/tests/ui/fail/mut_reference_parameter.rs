use verified_tools::{ErrorClass, verified_tool};

#[verified_tool(side_effect = "low", skip(log))]
async fn append(log: &mut Vec<String>, line: String) -> Result<(), ErrorClass> {
    log.push(line);
    Ok(())
}

fn main() {}
