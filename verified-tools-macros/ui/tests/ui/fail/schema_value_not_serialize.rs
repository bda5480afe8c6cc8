use verified_tools::{ErrorClass, verified_tool};

/// What the tool answers: the model cannot be shown it.
#[derive(Debug, Clone)]
pub struct Handle(pub u64);

#[verified_tool(side_effect = "low", schema = true)]
async fn open(path: String) -> Result<Handle, ErrorClass> {
    Ok(Handle(path.len() as u64))
}

fn main() {}
