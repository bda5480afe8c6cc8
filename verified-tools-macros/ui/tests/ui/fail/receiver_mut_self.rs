use verified_tools::{ErrorClass, verified_tool};

pub struct Counter(u64);

impl Counter {
    #[verified_tool(side_effect = "low")]
    async fn bump(&mut self, by: u64) -> Result<u64, ErrorClass> {
        self.0 += by;
        Ok(self.0)
    }
}

fn main() {}
