//! Tools defined while the program runs (`DynTool`): a tool whose name,
//! schema and class come from another server's listing, proxied through a
//! `ToolSet`, is listed, keyed, verified, replayed and checked as a
//! generated tool is. The upstream is a small fake payment service that
//! keeps what it applied by key; tokio time is paused.

use std::io;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};

use serde_json::{Value, json};
use verified_tools::engine::{self, Attempt};
use verified_tools::toolset::{
    DynTool, JsonObject, Status, ToolFuture, ToolOutcome, ToolSet, json_payload,
};
use verified_tools::{
    Classify, Context, EffectKind, ErrorClass, IdempotencyKey, Proof, SideEffect, Tool, ToolSpec,
    Verdict, intern, verified_tool,
};

/// The other server: applies a request once per key, and can lose the
/// answer to one it applied, or be unreadable.
#[derive(Default)]
struct Upstream {
    applied: Mutex<Vec<(String, IdempotencyKey, Value)>>,
    lose_next_answer: AtomicBool,
    blind: AtomicBool,
}

impl Upstream {
    fn applied(&self, tool: &str) -> usize {
        self.applied.lock().unwrap().iter().filter(|(t, ..)| t == tool).count()
    }
}

#[derive(Debug, thiserror::Error)]
#[error("the answer was lost")]
struct Lost;

impl Classify for Lost {
    fn classify(&self) -> ErrorClass {
        ErrorClass::Ambiguous
    }
}

/// An upstream tool as its listing describes it.
struct Proxied {
    spec: &'static ToolSpec,
    schema: JsonObject,
}

/// One call of it, run by the engine.
struct ProxiedCall<'a> {
    spec: &'static ToolSpec,
    upstream: &'a Upstream,
    arguments: &'a Value,
}

impl Tool for ProxiedCall<'_> {
    type Output = Value;
    type Error = Lost;

    fn spec(&self) -> &'static ToolSpec {
        self.spec
    }

    async fn dispatch(&mut self, attempt: Attempt) -> Result<Value, Lost> {
        let mut applied = self.upstream.applied.lock().unwrap();
        if !applied.iter().any(|(_, key, _)| *key == attempt.key) {
            applied.push((self.spec.name.to_owned(), attempt.key, self.arguments.clone()));
        }
        if self.upstream.lose_next_answer.swap(false, Ordering::SeqCst) {
            return Err(Lost);
        }
        Ok(json!({"done": self.arguments}))
    }

    async fn verify(&mut self, key: IdempotencyKey) -> Verdict<Value> {
        if self.upstream.blind.load(Ordering::SeqCst) {
            return Verdict::Unknown;
        }
        let applied = self.upstream.applied.lock().unwrap();
        match applied.iter().find(|(_, k, _)| *k == key) {
            Some((_, _, arguments)) => Verdict::Holds(json!({"done": arguments})),
            None => Verdict::Absent,
        }
    }
}

impl DynTool<Upstream> for Proxied {
    fn spec(&self) -> &'static ToolSpec {
        self.spec
    }

    fn input_schema(&self) -> JsonObject {
        self.schema.clone()
    }

    fn call<'a>(
        &'a self,
        cx: &'a Context,
        upstream: &'a Upstream,
        arguments: &'a Value,
    ) -> ToolFuture<'a> {
        Box::pin(async move {
            let payload = match json_payload(self.spec, arguments) {
                Ok(payload) => payload,
                Err(error) => return ToolOutcome::invalid_arguments(&error),
            };
            let call = ProxiedCall { spec: self.spec, upstream, arguments };
            ToolOutcome::from_result(engine::run(cx, call, &payload, arguments).await)
        })
    }
}

/// What an upstream's `tools/list` gave for two tools: a charge that names
/// its order (its effect identity) and a reminder whose every request is
/// one of its own.
fn listing() -> Value {
    json!([
        {"name": "charge", "description": "Charges an order.",
         "inputSchema": {"type": "object", "properties": {
             "order": {"type": "integer"}, "cents": {"type": "integer"}},
             "required": ["order", "cents"]}},
        {"name": "remind", "description": "Sends a reminder.",
         "inputSchema": {"type": "object", "properties": {"text": {"type": "string"}}}}
    ])
}

/// The descriptors a proxy makes of the listing, each time it reads it.
fn proxied(listing: &Value) -> Vec<Proxied> {
    listing
        .as_array()
        .unwrap()
        .iter()
        .map(|tool| {
            let name = intern::text(tool["name"].as_str().unwrap());
            let mut spec = ToolSpec::new(name, SideEffect::High)
                .with_verifier()
                .with_description(intern::text(tool["description"].as_str().unwrap()));
            if name == "charge" {
                spec = spec
                    .with_effect_key(intern::texts(&["order".to_owned()]))
                    .with_effect_kind(EffectKind::Additive);
            }
            let schema = tool["inputSchema"].as_object().unwrap().clone();
            Proxied { spec: intern::spec(spec), schema }
        })
        .collect()
}

/// A generated tool, to list beside the proxied ones.
#[verified_tool(side_effect = "none", skip(upstream), schema = true)]
pub async fn ping(upstream: &Upstream) -> Result<u32, io::Error> {
    let _ = upstream;
    Ok(1)
}

fn set() -> ToolSet<Upstream> {
    let set =
        ToolSet::new(Upstream::default()).with_context(Context::new("proxy")).with(ping_tool());
    proxied(&listing()).into_iter().fold(set, ToolSet::with_dyn)
}

#[test]
fn a_run_time_tool_is_listed_as_its_upstream_describes_it() {
    let set = set();
    let upstream = listing();
    assert_eq!(set.names().collect::<Vec<_>>(), ["ping", "charge", "remind"]);

    let mcp = set.mcp_tools();
    let charge = &mcp[1];
    assert_eq!(charge["name"], "charge");
    assert_eq!(charge["description"], upstream[0]["description"]);
    assert_eq!(charge["inputSchema"], upstream[0]["inputSchema"]);
    // An additive action named by its order: a repeat does nothing more.
    assert_eq!(charge["annotations"]["idempotentHint"], true);
    assert_eq!(charge["annotations"]["destructiveHint"], false);
    // A reminder named by nothing: a repeat under a new id is a new one.
    assert_eq!(mcp[2]["annotations"]["idempotentHint"], false);
    assert!(charge.get("outputSchema").is_none());

    assert_eq!(set.openai_tools()[2]["function"]["parameters"], upstream[1]["inputSchema"]);
    assert_eq!(set.anthropic_tools()[1]["input_schema"], upstream[0]["inputSchema"]);
    assert_eq!(set.get("remind").map(|t| t.spec().side_effect), Some(SideEffect::High));
}

#[test]
fn a_listing_read_again_keeps_one_descriptor_per_tool() {
    let first = proxied(&listing());
    // A proxy reads the listing again each time the upstream says it
    // changed: what did not change is the descriptor kept before.
    for _ in 0..100 {
        let again = proxied(&listing());
        for (a, b) in first.iter().zip(&again) {
            assert!(std::ptr::eq(a.spec, b.spec), "{} kept twice", a.spec.name);
        }
    }
    // A tool whose description changed gets a descriptor of its own; the
    // other keeps the one it had.
    let mut changed = listing();
    changed[0]["description"] = json!("Charges an order, in cents.");
    let changed = proxied(&changed);
    assert!(!std::ptr::eq(changed[0].spec, first[0].spec));
    assert_eq!(changed[0].spec.description, "Charges an order, in cents.");
    assert_eq!(first[0].spec.description, "Charges an order.");
    assert!(std::ptr::eq(changed[1].spec, first[1].spec));
    assert_eq!(changed[0].spec.effect_key, ["order"]);
}

#[tokio::test(start_paused = true)]
async fn the_same_action_under_new_tool_call_ids_is_done_once() {
    let set = set();
    let args = json!({"order": 1001, "cents": 2500});

    let first = set.call("charge", &args, "call_A").await;
    assert_eq!(first.status, Status::Success, "{first:?}");
    assert_eq!(first.value, Some(json!({"done": args})));
    // The model asks again, with a new tool-call id and the members in
    // another order: the same action, replayed.
    let again = set.call_text("charge", r#"{"cents": 2500, "order": 1001}"#, "call_B").await;
    assert_eq!(again.status, Status::Success, "{again:?}");
    assert_eq!(again.proof, Some(Proof::Ledger));
    assert_eq!(again.key, first.key);
    // The same order with another amount is refused, not charged.
    let other = set.call("charge", &json!({"order": 1001, "cents": 9900}), "call_C").await;
    assert_eq!(other.status, Status::Refused, "{other:?}");
    assert_eq!(set.state().applied("charge"), 1);

    // Another order is another action.
    let next = set.call("charge", &json!({"order": 1002, "cents": 2500}), "call_D").await;
    assert_eq!(next.status, Status::Success, "{next:?}");
    assert_ne!(next.key, first.key);
    assert_eq!(set.state().applied("charge"), 2);
}

#[tokio::test(start_paused = true)]
async fn a_tool_without_an_effect_identity_is_keyed_by_its_request() {
    let set = set();
    let args = json!({"text": "pay the invoice"});
    let first = set.call("remind", &args, "call_A").await;
    assert_eq!(first.status, Status::Success, "{first:?}");
    let replayed = set.call("remind", &args, "call_A").await;
    assert_eq!(replayed.proof, Some(Proof::Ledger));
    assert_eq!(set.state().applied("remind"), 1);
    // A new request for a reminder is a new reminder.
    let second = set.call("remind", &args, "call_B").await;
    assert_eq!(second.status, Status::Success, "{second:?}");
    assert_ne!(second.key, first.key);
    assert_eq!(set.state().applied("remind"), 2);
}

#[tokio::test(start_paused = true)]
async fn a_lost_answer_is_verified_not_sent_again() {
    let set = set();
    set.state().lose_next_answer.store(true, Ordering::SeqCst);
    let outcome = set.call("charge", &json!({"order": 7, "cents": 100}), "call_A").await;
    assert_eq!(outcome.status, Status::Success, "{outcome:?}");
    assert_eq!(outcome.proof, Some(Proof::Verifier));
    assert_eq!(set.state().applied("charge"), 1);
}

#[tokio::test(start_paused = true)]
async fn a_call_in_doubt_is_checked_through_the_same_trait() {
    let set = set().with_checks(8);
    set.state().lose_next_answer.store(true, Ordering::SeqCst);
    set.state().blind.store(true, Ordering::SeqCst);
    let outcome = set.call("charge", &json!({"order": 8, "cents": 100}), "call_A").await;
    assert_eq!(outcome.status, Status::Unknown, "{outcome:?}");
    assert_eq!(set.pending_checks(), 1);

    set.state().blind.store(false, Ordering::SeqCst);
    let done = set.reconcile().await;
    assert_eq!((done.checked, done.applied), (1, 1), "{done:?}");
    assert_eq!(set.pending_checks(), 0);
    assert_eq!(set.state().applied("charge"), 1);
}

#[tokio::test(start_paused = true)]
async fn arguments_that_name_no_action_are_refused_before_anything_is_sent() {
    let set = set();
    let refused = |outcome: ToolOutcome, says: &str| {
        assert_eq!(outcome.status, Status::InvalidArguments, "{outcome:?}");
        let error = outcome.error.unwrap_or_default();
        assert!(error.contains(says), "{error:?} should say {says:?}");
    };
    refused(set.call("charge", &json!({"cents": 100}), "c1").await, "missing field `order`");
    refused(
        set.call("charge", &json!({"order": null, "cents": 1}), "c2").await,
        "missing field `order`",
    );
    refused(set.call("charge", &json!([1001, 2500]), "c3").await, "must be a JSON object");
    let mut deep = json!(1);
    for _ in 0..200 {
        deep = json!([deep]);
    }
    refused(
        set.call("remind", &json!({"text": deep}), "c4").await,
        "field `text`: nested deeper than 128",
    );
    assert!(set.state().applied.lock().unwrap().is_empty());
}

/// The same action declared natively: `key(order)` over a `u64`.
mod native {
    use super::*;

    #[derive(Default)]
    pub struct Bank {
        pub charged: Mutex<Vec<u64>>,
    }

    /// Charges an order.
    #[verified_tool(side_effect = "high", verify = charged, skip(bank), key(order), schema = true)]
    pub async fn charge(bank: &Bank, order: u64, cents: u64) -> Result<u64, Lost> {
        bank.charged.lock().unwrap().push(order);
        Ok(cents)
    }

    async fn charged(bank: &Bank, order: &u64, cents: &u64) -> Verdict<u64> {
        bank.charged.lock().unwrap().contains(order).then_some(*cents).into()
    }
}

#[tokio::test(start_paused = true)]
async fn a_proxied_action_and_the_same_action_declared_natively_share_a_key() {
    let cx = Context::new("proxy");
    let native =
        ToolSet::new(native::Bank::default()).with_context(cx.clone()).with(native::charge_tool());
    let proxy = set().with_context(cx);
    let args = json!({"order": 1001, "cents": 2500});
    let by_hand = native.call("charge", &args, "call_A").await;
    assert_eq!(by_hand.status, Status::Success, "{by_hand:?}");
    // Through the proxy, in the same ledger: the same key, so not done again.
    let proxied = proxy.call("charge", &args, "call_B").await;
    assert_eq!(proxied.key, by_hand.key);
    assert_eq!(proxied.status, Status::Refused, "{proxied:?}");
    assert_eq!(proxy.state().applied("charge"), 0);
}

#[tokio::test(start_paused = true)]
async fn one_shared_tool_serves_every_set_it_is_added_to() {
    let shared: Vec<std::sync::Arc<dyn DynTool<Upstream>>> =
        proxied(&listing()).into_iter().map(|t| std::sync::Arc::new(t) as _).collect();
    // Two sets over one ledger, as a proxy rebuilds its set when the
    // upstream's listing changes: the same action is still one call.
    let cx = Context::new("proxy");
    let build = || {
        shared
            .iter()
            .cloned()
            .fold(ToolSet::new(Upstream::default()).with_context(cx.clone()), ToolSet::with_dyn)
    };
    let (before, after) = (build(), build());
    let args = json!({"order": 42, "cents": 100});
    assert_eq!(before.call("charge", &args, "call_A").await.status, Status::Success);
    let again = after.call("charge", &args, "call_B").await;
    assert_eq!(again.proof, Some(Proof::Ledger), "{again:?}");
    assert_eq!(after.names().collect::<Vec<_>>(), ["charge", "remind"]);
}
