//! The audit trail's schema, pinned: a scripted set of calls (a verified
//! retry, an escalation, a definitive failure, a refusal) and every line
//! they write, against `tests/golden/audit.jsonl`. A change to the schema
//! shows up here as a diff to review; regenerate with `VT_UPDATE_GOLDEN=1`.

mod fake;

use std::sync::Arc;
use std::time::Duration;

use fake::{Attempt, Fake, Read};
use verified_tools::audit::MemoryAudit;
use verified_tools::ledger::Codec;
use verified_tools::{
    Context, IdempotencyKey, RetryPolicy, SideEffect, TokioClock, ToolSpec, engine,
};

static SEND: ToolSpec = ToolSpec::new("send_welcome", SideEffect::High).with_verifier();
static PAY: ToolSpec = ToolSpec::new("pay", SideEffect::Irreversible).with_verifier();

#[derive(serde::Serialize)]
struct Args<'a> {
    customer: u64,
    token: &'a str,
}

async fn call(cx: &Context, spec: &'static ToolSpec, fake: &Fake) {
    let _ = engine::call(
        cx,
        spec,
        &(42u64, "t0k3n"),
        &Args { customer: 42, token: "<redacted>" },
        |a| fake.send(a),
        Some(|_| fake.check()),
        Codec::serde(),
    )
    .await;
}

#[test]
fn the_audit_schema_is_pinned() {
    let audit = Arc::new(MemoryAudit::new());
    let rt = tokio::runtime::Builder::new_current_thread().enable_time().start_paused(true).build();
    rt.unwrap().block_on(async {
        let policy = |class| {
            RetryPolicy::for_class(class)
                .with_attempt_timeout(Some(Duration::from_millis(100)))
                .with_settle(Some(Duration::ZERO))
        };
        let cx = Context::new("support-agent")
            .with_clock(Arc::new(TokioClock::starting_at(1_760_000_000_000)))
            .map_policies(|class, _| policy(class))
            .with_audit(audit.clone());
        // A lost attempt, verified absent once settled, retried.
        let fake = Fake::new(&[Attempt::TimeoutLost, Attempt::Ok], &[]);
        call(&cx.for_step("conversation-7", 1), &SEND, &fake).await;
        // An irreversible call the verifier cannot see: escalated.
        let fake = Fake::new(&[Attempt::TimeoutApplied], &[Read::Unknown; 4]);
        call(&cx.for_tool_call("call_Zx81"), &PAY, &fake).await;
        // A definitive error.
        let fake = Fake::new(&[Attempt::Definitive], &[]);
        call(&cx.for_step("conversation-7", 2), &SEND, &fake).await;
        // An explicit key reused for another tool: refused.
        let key = cx.for_key(IdempotencyKey::from_u128(0xfeed));
        let fake = Fake::new(&[], &[]);
        call(&key, &SEND, &fake).await;
        call(&key, &PAY, &fake).await;
    });
    let actual: String = audit.events().iter().map(|e| format!("{}\n", e.json)).collect();
    let golden = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/golden/audit.jsonl");
    if std::env::var_os("VT_UPDATE_GOLDEN").is_some() {
        std::fs::write(golden, &actual).expect("golden written");
    }
    let expected = std::fs::read_to_string(golden).expect("the golden file");
    assert_eq!(actual, expected, "the audit schema changed: review, then VT_UPDATE_GOLDEN=1");
}
