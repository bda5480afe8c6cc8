//! The identity of a logical call: a tool that names its business action
//! (`key(order)`) is done once per action whoever asks, a tool without one
//! once per request identity, and the same identity with other arguments is
//! refused. Against a small payment service that honours idempotency keys or
//! ignores them. Tokio time is paused.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::json;
use verified_tools::ledger::{
    Claim, ClaimRequest, End, Fence, Ledger, LedgerError, LedgerFuture, MemoryLedger, Progress,
};
use verified_tools::toolset::{Status, ToolSet};
use verified_tools::{
    CallError, Classify, Context, ErrorClass, IdempotencyKey, Proof, ToolResult, UnknownReason,
    Verdict, verified_tool,
};

/// A payment service. With `honours_keys`, a request whose key it has seen
/// is answered from its first charge, as Stripe does.
#[derive(Default)]
pub struct Bank {
    honours_keys: bool,
    /// Every charge applied: (order, cents, key).
    charges: Mutex<Vec<(u64, u64, IdempotencyKey)>>,
    reminders: Mutex<Vec<String>>,
    /// The next charge is applied but its answer never comes.
    lose_next_answer: AtomicBool,
    /// The verifier cannot read the charges.
    blind: AtomicBool,
}

impl Bank {
    fn honouring_keys() -> Self {
        Self { honours_keys: true, ..Self::default() }
    }

    fn charges(&self) -> usize {
        self.charges.lock().unwrap().len()
    }
}

#[derive(Debug, thiserror::Error)]
#[error("the bank is unreachable")]
pub struct BankError;

impl Classify for BankError {
    fn classify(&self) -> ErrorClass {
        ErrorClass::Ambiguous
    }
}

/// Charges an order, once.
#[verified_tool(
    side_effect = "irreversible",
    verify = charged,
    skip(bank),
    key(order),
    timeout = "1s",
    settle = "1s",
    schema = true
)]
pub async fn charge(
    bank: &Bank,
    order: u64,
    cents: u64,
    key: IdempotencyKey,
) -> Result<u64, BankError> {
    let cents = {
        let mut charges = bank.charges.lock().unwrap();
        let seen = charges.iter().find(|(_, _, k)| bank.honours_keys && *k == key).map(|c| c.1);
        match seen {
            Some(cents) => cents,
            None => {
                charges.push((order, cents, key));
                cents
            }
        }
    };
    if bank.lose_next_answer.swap(false, Ordering::SeqCst) {
        std::future::pending::<()>().await;
    }
    Ok(cents)
}

/// Is the order charged?
async fn charged(bank: &Bank, order: &u64, _cents: &u64) -> Verdict<u64> {
    if bank.blind.load(Ordering::SeqCst) {
        return Verdict::Unknown;
    }
    let charges = bank.charges.lock().unwrap();
    charges.iter().find(|(o, _, _)| o == order).map(|c| c.1).into()
}

/// Reminds a customer: every request is a reminder of its own.
#[verified_tool(side_effect = "low", skip(bank), schema = true)]
pub async fn remind(bank: &Bank, customer: u64, text: &str) -> Result<usize, BankError> {
    let mut sent = bank.reminders.lock().unwrap();
    sent.push(format!("{customer}: {text}"));
    Ok(sent.len())
}

fn tools(bank: Bank) -> ToolSet<Bank> {
    ToolSet::new(bank).with(charge_tool()).with(remind_tool())
}

#[tokio::test(start_paused = true)]
async fn a_payment_asked_twice_with_two_tool_call_ids_is_charged_once() {
    for bank in [Bank::default(), Bank::honouring_keys()] {
        let honours = bank.honours_keys;
        let set = tools(bank);
        let args = json!({"order": 1001, "cents": 2500});
        let first = set.call("charge", &args, "call_A").await;
        // An irreversible tool's OK answer is read back before it is a success.
        assert_eq!((first.status, first.proof), (Status::Success, Some(Proof::Verifier)));
        // The model asks again, as a new tool call.
        let again = set.call("charge", &args, "call_B").await;
        assert_eq!(again.status, Status::Success, "{again:?}");
        assert_eq!(again.proof, Some(Proof::Ledger), "honours keys: {honours}");
        assert_eq!(again.key, first.key, "one business action, one key");
        assert!(again.instruction.as_deref().unwrap().starts_with("Replayed"), "{again:?}");
        assert_eq!(set.state().charges(), 1, "honours keys: {honours}");
    }
}

#[tokio::test(start_paused = true)]
async fn a_service_that_honours_keys_dedupes_what_the_ledger_no_longer_knows() {
    // Two processes with ledgers of their own (or one that forgot): the key
    // the service receives is the same, so it charges once.
    let bank = Bank::honouring_keys();
    let a = Context::new("billing").for_tool_call("call_A");
    let b = Context::new("billing").for_tool_call("call_B");
    let first = charge(&a, &bank, 1001, 2500).await;
    let second = charge(&b, &bank, 1001, 2500).await;
    assert!(first.is_success() && second.is_success(), "{first:?} {second:?}");
    assert_eq!(first.key(), second.key());
    assert_eq!(bank.charges(), 1);
    // The same without keys honoured: the ledger was the only guard, and
    // there were two ledgers.
    let blind = Bank::default();
    assert!(charge(&Context::new("billing"), &blind, 1001, 2500).await.is_success());
    assert!(charge(&Context::new("billing"), &blind, 1001, 2500).await.is_success());
    assert_eq!(blind.charges(), 2, "the control: keys not honoured, ledgers not shared");
}

#[tokio::test(start_paused = true)]
async fn a_business_action_is_replayed_a_day_later_by_another_context_sharing_the_ledger() {
    let ledger: Arc<MemoryLedger> = Arc::new(MemoryLedger::new());
    let bank = Bank::default();
    let morning = Context::new("billing").with_ledger(ledger.clone()).for_step("run-1", 4);
    assert!(charge(&morning, &bank, 7, 100).await.is_success());
    tokio::time::advance(Duration::from_secs(23 * 3600)).await;
    let evening = Context::new("billing").with_ledger(ledger).for_tool_call("call_late");
    let replay = charge(&evening, &bank, 7, 100).await;
    assert!(matches!(replay, ToolResult::Success { proof: Proof::Ledger, .. }), "{replay:?}");
    assert_eq!(bank.charges(), 1);
}

#[tokio::test(start_paused = true)]
async fn the_same_order_with_another_amount_is_refused_not_charged() {
    let set = tools(Bank::default());
    let first = set.call("charge", &json!({"order": 7, "cents": 100}), "call_A").await;
    assert_eq!(first.status, Status::Success);
    let other = set.call("charge", &json!({"order": 7, "cents": 99_999}), "call_B").await;
    assert_eq!(other.status, Status::Refused, "{other:?}");
    assert!(other.error.as_deref().unwrap().contains("different payload"), "{other:?}");
    assert_eq!(set.state().charges(), 1);
}

#[tokio::test(start_paused = true)]
async fn a_reminder_asked_twice_with_two_tool_call_ids_is_sent_twice() {
    let set = tools(Bank::default());
    let args = json!({"customer": 5, "text": "your invoice is due"});
    assert_eq!(set.call("remind", &args, "call_1").await.status, Status::Success);
    assert_eq!(set.call("remind", &args, "call_2").await.status, Status::Success);
    // The same request again is the same reminder.
    let again = set.call("remind", &args, "call_2").await;
    assert_eq!(again.proof, Some(Proof::Ledger));
    assert_eq!(set.state().reminders.lock().unwrap().len(), 2);
}

#[tokio::test(start_paused = true)]
async fn the_same_tool_call_id_with_other_arguments_is_refused() {
    let set = tools(Bank::default());
    let first = set.call("remind", &json!({"customer": 5, "text": "a"}), "call_X").await;
    assert_eq!(first.status, Status::Success);
    let other = set.call("remind", &json!({"customer": 5, "text": "b"}), "call_X").await;
    assert_eq!(other.status, Status::Refused, "{other:?}");
    assert_eq!(other.key, first.key);
    let instruction = other.instruction.as_deref().unwrap();
    assert!(instruction.contains("already used with other arguments"), "{instruction}");
    assert_eq!(set.state().reminders.lock().unwrap().as_slice(), ["5: a"]);
    // So does a run step.
    let cx = Context::new("agent").for_step("run-1", 1);
    let bank = Bank::default();
    assert!(remind(&cx, &bank, 1, "a").await.is_success());
    let reused = remind(&cx, &bank, 1, "b").await;
    assert!(matches!(reused, ToolResult::Refused(CallError::KeyReuse { .. })), "{reused:?}");
}

#[tokio::test(start_paused = true)]
async fn a_settled_absent_never_tells_the_model_to_make_a_new_call() {
    // A lost answer on a service that applies requests late: the verifier
    // reads `Absent` once the settle margin passed, the call ends
    // not_applied, and the outcome says to repeat the same call, which
    // checks first, never "make a new call".
    #[derive(Default)]
    struct Late(Mutex<HashMap<u64, u64>>);
    #[verified_tool(side_effect = "irreversible", verify = landed, skip(svc), timeout = "1s",
                    settle = "1s", retries = 0, schema = true)]
    async fn pay(svc: &Late, order: u64) -> Result<u64, BankError> {
        let _ = (svc, order);
        std::future::pending().await
    }
    async fn landed(svc: &Late, order: &u64) -> Verdict<u64> {
        svc.0.lock().unwrap().get(order).copied().into()
    }
    let set = ToolSet::new(Late::default()).with(pay_tool());
    let outcome = set.call("pay", &json!({"order": 9}), "call_1").await;
    assert_eq!(outcome.status, Status::NotApplied, "{outcome:?}");
    let instruction = outcome.instruction.as_deref().unwrap();
    assert!(!instruction.contains("needed, make a new call"), "{instruction}");
    assert!(instruction.contains("Do not make a new call"), "{instruction}");
    assert!(instruction.contains("repeat this same call"), "{instruction}");
}

/// A memory ledger whose holds are all taken over before they finish: what a
/// worker paused past its lease finds when it resumes.
struct TakenOver(MemoryLedger);

impl Ledger for TakenOver {
    fn claim(&self, request: ClaimRequest) -> LedgerFuture<'_, Claim> {
        self.0.claim(request)
    }
    fn dispatching(&self, key: IdempotencyKey, fence: Fence, p: Progress) -> LedgerFuture<'_, ()> {
        self.0.dispatching(key, fence, p)
    }
    fn finish<'a>(&'a self, _: IdempotencyKey, fence: Fence, _: End<'a>) -> LedgerFuture<'a, ()> {
        LedgerFuture::ready(Err(LedgerError::Fenced(fence)))
    }
    fn abandon(&self, key: IdempotencyKey, fence: Fence) {
        self.0.abandon(key, fence)
    }
    fn lease(&self) -> Duration {
        self.0.lease()
    }
}

#[tokio::test(start_paused = true)]
async fn a_holder_whose_hold_was_taken_over_never_reports_not_applied() {
    let cx = Context::new("billing").with_ledger(Arc::new(TakenOver(MemoryLedger::new())));
    // An irreversible call whose answer is lost and whose verifier reads
    // `Absent` after settling would end `NotApplied`; its hold was taken
    // over meanwhile, so the successor may have charged: in doubt.
    #[derive(Default)]
    struct Nothing;
    #[verified_tool(side_effect = "irreversible", verify = never_there, skip(svc), timeout = "1s",
                    settle = "1s", retries = 0)]
    async fn pay_once(svc: &Nothing, order: u64) -> Result<u64, BankError> {
        let _ = (svc, order);
        std::future::pending().await
    }
    async fn never_there(_: &Nothing, _: &u64) -> Verdict<u64> {
        Verdict::Absent
    }
    let result = pay_once(&cx, &Nothing, 3).await;
    assert!(
        matches!(result, ToolResult::Unknown { reason: UnknownReason::Superseded, .. }),
        "{result:?}"
    );
    // The control: with a ledger that keeps the hold, the same call is
    // `NotApplied`.
    let kept = pay_once(&Context::new("billing"), &Nothing, 3).await;
    assert!(matches!(kept, ToolResult::NotApplied { .. }), "{kept:?}");
}

#[tokio::test(start_paused = true)]
async fn a_call_in_doubt_is_checked_by_key_and_nothing_is_sent_again() {
    let set = tools(Bank::default()).with_checks(100);
    let listed = set.openai_tools();
    let names: Vec<&str> = listed
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["function"]["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["charge", "remind", "check_call"]);
    let bank = set.state();
    bank.lose_next_answer.store(true, Ordering::SeqCst);
    bank.blind.store(true, Ordering::SeqCst);
    let lost = set.call("charge", &json!({"order": 1, "cents": 500}), "call_A").await;
    assert_eq!(lost.status, Status::Escalated, "{lost:?}");
    let key = lost.key.unwrap();
    assert_eq!(set.pending_checks(), 1);
    // Still unreadable: still in doubt, and nothing was sent.
    let check = json!({"key": key.to_string()});
    let still = set.call("check_call", &check, "call_B").await;
    assert_eq!(still.status, Status::Escalated, "{still:?}");
    // Readable: the truth, recorded; the call is closed.
    bank.blind.store(false, Ordering::SeqCst);
    // As a model writes it: the arguments as text.
    let truth = set.call_text("check_call", &check.to_string(), "call_C").await;
    assert_eq!((truth.status, truth.proof), (Status::Success, Some(Proof::Verifier)), "{truth:?}");
    assert_eq!(truth.key, Some(key));
    assert_eq!(bank.charges(), 1);
    assert_eq!(set.pending_checks(), 0);
    // The same action asked again is replayed from what the check recorded.
    let again = set.call("charge", &json!({"order": 1, "cents": 500}), "call_D").await;
    assert_eq!(again.proof, Some(Proof::Ledger), "{again:?}");
    assert_eq!(bank.charges(), 1);
    // A key the set does not keep is an argument error, not a call.
    let unknown = set.call("check_call", &json!({"key": "0".repeat(32)}), "call_E").await;
    assert_eq!(unknown.status, Status::InvalidArguments, "{unknown:?}");
    let bad = set.call("check_call", &json!({"key": "nope"}), "call_F").await;
    assert_eq!(bad.status, Status::InvalidArguments, "{bad:?}");
}

#[tokio::test(start_paused = true)]
async fn a_check_never_sends_even_when_the_effect_is_absent() {
    // The charge never reached the bank (lost on the way, not applied): the
    // call ends in doubt (nothing settles without a margin); a check reads
    // `Absent` once settled and closes it as not applied, sending nothing.
    #[derive(Default)]
    struct Lossy(Mutex<Vec<u64>>);
    #[verified_tool(side_effect = "high", verify = paid, skip(svc), timeout = "1s",
                    settle = "1s", schema = true)]
    async fn pay(svc: &Lossy, order: u64) -> Result<u64, BankError> {
        let _ = order;
        svc.0.lock().unwrap().push(order);
        Err(BankError)
    }
    async fn paid(_: &Lossy, _: &u64) -> Verdict<u64> {
        Verdict::Unknown
    }
    let set = ToolSet::new(Lossy::default()).with(pay_tool()).with_checks(10);
    let lost = set.call("pay", &json!({"order": 4}), "call_1").await;
    assert_eq!(lost.status, Status::Unknown, "{lost:?}");
    let sent = set.state().0.lock().unwrap().len();
    let done = set.reconcile().await;
    assert_eq!((done.checked, done.in_doubt), (1, 1), "{done:?}");
    assert_eq!(set.state().0.lock().unwrap().len(), sent, "a check sends nothing");
}

#[tokio::test(start_paused = true)]
async fn the_reconciler_closes_what_it_can_prove_and_keeps_the_rest() {
    let set = tools(Bank::default()).with_checks(100);
    let bank = set.state();
    bank.blind.store(true, Ordering::SeqCst);
    for order in [1, 2, 3] {
        bank.lose_next_answer.store(true, Ordering::SeqCst);
        let lost = set.call("charge", &json!({"order": order, "cents": 5}), "c").await;
        assert_eq!(lost.status, Status::Escalated, "{lost:?}");
    }
    // `c` was the tool-call id of all three: a model reusing an id. The
    // business key kept them three actions, and three calls in doubt.
    assert_eq!(set.pending_checks(), 3);
    let blind = set.reconcile().await;
    assert_eq!((blind.checked, blind.in_doubt), (3, 3));
    bank.blind.store(false, Ordering::SeqCst);
    let seen = set.reconcile().await;
    assert_eq!((seen.checked, seen.applied, seen.in_doubt), (3, 3, 0), "{seen:?}");
    assert_eq!(set.pending_checks(), 0);
    assert_eq!(bank.charges(), 3);
}

/// A mail service: while `lossy` a mail is sent and its answer never comes;
/// while `blind` the verifier cannot read what was sent.
#[derive(Default)]
pub struct Post {
    sent: Mutex<Vec<String>>,
    lossy: AtomicBool,
    blind: AtomicBool,
}

/// Sends a mail.
#[verified_tool(side_effect = "high", verify = delivered, skip(post), timeout = "1s",
                schema = true)]
pub async fn mail(post: &Post, to: String) -> Result<usize, BankError> {
    let n = {
        let mut sent = post.sent.lock().unwrap();
        sent.push(to);
        sent.len()
    };
    if post.lossy.load(Ordering::SeqCst) {
        std::future::pending::<()>().await;
    }
    Ok(n)
}

async fn delivered(post: &Post, to: &String) -> Verdict<usize> {
    if post.blind.load(Ordering::SeqCst) {
        return Verdict::Unknown;
    }
    let sent = post.sent.lock().unwrap();
    sent.iter().position(|t| t == to).map(|i| i + 1).into()
}

/// A mail in doubt, made in `cx` through `set`: its key.
async fn mail_in_doubt(set: &ToolSet<Post>, cx: &Context) -> IdempotencyKey {
    let post = set.state();
    post.lossy.store(true, Ordering::SeqCst);
    post.blind.store(true, Ordering::SeqCst);
    let lost = set.call_in(cx, "mail", &json!({"to": "bob@example.com"})).await;
    assert_eq!(lost.status, Status::Unknown, "{lost:?}");
    post.lossy.store(false, Ordering::SeqCst);
    post.blind.store(false, Ordering::SeqCst);
    lost.key.unwrap()
}

#[tokio::test(start_paused = true)]
async fn a_time_bucketed_call_checked_an_hour_later_is_checked_under_its_own_key() {
    let ledger = Arc::new(MemoryLedger::new());
    let clock = Arc::new(verified_tools::TokioClock::starting_at(1_700_000_000_000));
    // No scope: the default five-minute buckets, on tokio's paused clock.
    let cx = Context::new("agent").with_clock(clock).with_ledger(ledger.clone());
    let set =
        ToolSet::new(Post::default()).with_context(cx.clone()).with(mail_tool()).with_checks(8);
    let key = mail_in_doubt(&set, &cx).await;
    tokio::time::advance(Duration::from_secs(3600)).await;
    // Derived again an hour later, the key would be another call's.
    let checked = set.check(key).await.expect("the set keeps the call");
    assert_eq!((checked.status, checked.key), (Status::Success, Some(key)), "{checked:?}");
    assert!(ledger.in_doubt(10).await.unwrap().is_empty(), "the call's own record is settled");
    assert_eq!(set.state().sent.lock().unwrap().len(), 1, "a check sends nothing");
}

#[tokio::test(start_paused = true)]
async fn a_call_made_in_another_context_is_checked_in_that_context() {
    let set = ToolSet::new(Post::default()).with(mail_tool()).with_checks(8);
    // Another agent, another ledger: another key than the set's own context gives.
    let ledger = Arc::new(MemoryLedger::new());
    let cx = Context::new("billing-agent").with_ledger(ledger.clone()).for_tool_call("call_1");
    let key = mail_in_doubt(&set, &cx).await;
    let checked = set.check(key).await.expect("the set keeps the call");
    assert_eq!((checked.status, checked.key), (Status::Success, Some(key)), "{checked:?}");
    assert!(ledger.in_doubt(10).await.unwrap().is_empty(), "its record, in its ledger");
}

#[tokio::test(start_paused = true)]
async fn a_call_closed_by_a_check_and_in_doubt_again_is_checked_once() {
    // Never answers; its verifier reads `Absent` once it can read at all.
    #[derive(Default)]
    struct Void(AtomicBool);
    #[verified_tool(side_effect = "high", verify = arrived, skip(svc), timeout = "1s",
                    settle = "1s", schema = true)]
    async fn ping(svc: &Void, n: u64) -> Result<u64, BankError> {
        let _ = (svc, n);
        std::future::pending().await
    }
    async fn arrived(svc: &Void, _: &u64) -> Verdict<u64> {
        match svc.0.load(Ordering::SeqCst) {
            true => Verdict::Absent,
            false => Verdict::Unknown,
        }
    }
    let set = ToolSet::new(Void::default()).with(ping_tool()).with_checks(8);
    let args = json!({"n": 1});
    let lost = set.call("ping", &args, "call_1").await;
    assert_eq!(lost.status, Status::Unknown, "{lost:?}");
    set.state().0.store(true, Ordering::SeqCst);
    tokio::time::advance(Duration::from_secs(600)).await;
    let closed = set.check(lost.key.unwrap()).await.unwrap();
    assert_eq!(closed.status, Status::NotApplied, "{closed:?}");
    set.state().0.store(false, Ordering::SeqCst);
    // The model makes the same call again: in doubt again, under the same key.
    let again = set.call("ping", &args, "call_1").await;
    assert_eq!((again.status, again.key), (Status::Unknown, lost.key), "{again:?}");
    let done = set.reconcile().await;
    assert_eq!((done.checked, done.in_doubt), (1, 1), "{done:?}");
}

#[tokio::test(start_paused = true)]
async fn a_call_failed_by_a_repeat_and_in_doubt_again_is_checked_once_per_pass() {
    // Hangs while `hang`, refuses for good while `fail`; its verifier reads
    // `Absent` unless `blind`.
    #[derive(Default)]
    struct Svc {
        hang: AtomicBool,
        fail: AtomicBool,
        blind: AtomicBool,
    }
    #[derive(Debug, thiserror::Error)]
    #[error("refused")]
    struct Refused;
    impl Classify for Refused {
        fn classify(&self) -> ErrorClass {
            ErrorClass::Definitive
        }
    }
    #[verified_tool(side_effect = "high", verify = seen, skip(svc), timeout = "1s",
                    settle = "1s", schema = true)]
    async fn op(svc: &Svc, n: u64) -> Result<u64, Refused> {
        if svc.hang.load(Ordering::SeqCst) {
            std::future::pending::<()>().await;
        }
        match svc.fail.load(Ordering::SeqCst) {
            true => Err(Refused),
            false => Ok(n),
        }
    }
    async fn seen(svc: &Svc, _: &u64) -> Verdict<u64> {
        match svc.blind.load(Ordering::SeqCst) {
            true => Verdict::Unknown,
            false => Verdict::Absent,
        }
    }
    let set = ToolSet::new(Svc::default()).with(op_tool()).with_checks(8);
    let svc = set.state();
    svc.hang.store(true, Ordering::SeqCst);
    svc.blind.store(true, Ordering::SeqCst);
    let x = set.call("op", &json!({"n": 1}), "x").await;
    let k = set.call("op", &json!({"n": 2}), "k").await;
    assert_eq!((x.status, k.status), (Status::Unknown, Status::Unknown));
    // The model repeats k: seen absent, sent again, refused for good.
    tokio::time::advance(Duration::from_secs(600)).await;
    svc.hang.store(false, Ordering::SeqCst);
    svc.blind.store(false, Ordering::SeqCst);
    svc.fail.store(true, Ordering::SeqCst);
    let failed = set.call("op", &json!({"n": 2}), "k").await;
    assert_eq!(failed.status, Status::Failed, "{failed:?}");
    // Once more: the verifier cannot tell, and k is in doubt again.
    svc.blind.store(true, Ordering::SeqCst);
    let again = set.call("op", &json!({"n": 2}), "k").await;
    assert_eq!((again.status, again.key), (Status::Unknown, k.key), "{again:?}");
    assert_eq!(set.pending_checks(), 2);
    let done = set.reconcile().await;
    assert_eq!((done.checked, done.in_doubt), (2, 2), "two calls, each checked once: {done:?}");
}
