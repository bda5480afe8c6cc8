//! Methods with `&self`: a bare verifier name calls `Self::check(self, ..)`;
//! a longer path is called with `self` first; associated fns without a
//! receiver name the verifier with `Self::`.
use verified_tools::{Context, ErrorClass, IdempotencyKey, ToolResult, Verdict, verified_tool};

pub struct Mailer {
    sent: std::sync::Mutex<Vec<String>>,
}

impl Mailer {
    /// Sends one welcome mail.
    #[verified_tool(side_effect = "high", verify = was_sent)]
    pub async fn send_welcome(&self, to: &str, key: IdempotencyKey) -> Result<(), ErrorClass> {
        let _ = key;
        self.sent.lock().unwrap().push(to.to_owned());
        Ok(())
    }

    async fn was_sent(&self, to: &str) -> Verdict<()> {
        self.sent.lock().unwrap().iter().any(|m| m == to).then_some(()).into()
    }

    /// Verified by a free function that takes the receiver first.
    #[verified_tool(side_effect = "irreversible", verify = checks::refunded)]
    pub async fn refund(&self, order: u64) -> Result<u64, ErrorClass> {
        Ok(order)
    }

    /// An associated fn without receiver.
    #[verified_tool(side_effect = "high", verify = Self::exists)]
    pub async fn create(id: u64) -> Result<u64, ErrorClass> {
        Ok(id)
    }

    async fn exists(id: &u64) -> Verdict<u64> {
        Verdict::Holds(*id)
    }
}

mod checks {
    use verified_tools::Verdict;

    pub async fn refunded(_mailer: &super::Mailer, order: &u64) -> Verdict<u64> {
        Verdict::Holds(*order)
    }
}

#[test]
fn compiles_and_runs() {
    let cx = Context::new("agent");
    let mailer = Mailer { sent: Default::default() };
    let _calls = async {
        let sent: ToolResult<(), ErrorClass> = mailer.send_welcome(&cx, "ann@example.com").await;
        let refunded: ToolResult<u64, ErrorClass> = mailer.refund(&cx, 7).await;
        let created: ToolResult<u64, ErrorClass> = Mailer::create(&cx, 1).await;
        (sent, refunded, created)
    };
    assert!(Mailer::send_welcome_spec().has_verifier);
    assert_eq!(Mailer::refund_spec().name, "refund");
    assert_eq!(Mailer::create_spec().params[0].name, "id");
}
