//! Runtime behaviour of the code `#[verified_tool]` generates, against a small
//! fake service with injected faults. Tokio time is paused: timeouts and
//! backoff run instantly and deterministically.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use verified_tools::audit::{CallState, MemoryAudit};
use verified_tools::{
    Cause, Classify, Context, Deadline, ErrorClass, IdempotencyKey, Mode, Proof, SideEffect,
    TokioClock, ToolResult, UnknownReason, Verdict, verified_tool,
};

/// What the fake does on one dispatch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Fault {
    /// Applies the effect and answers.
    None,
    /// Applies the effect, then never answers (the response is lost).
    TimeoutAfterApply,
    /// Never reaches the server and never answers.
    TimeoutBeforeApply,
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum SvcError {
    Invalid,
}

impl std::fmt::Display for SvcError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("invalid request")
    }
}

impl Classify for SvcError {
    fn classify(&self) -> ErrorClass {
        ErrorClass::Definitive
    }
}

/// A fake service that honours idempotency keys and records every dispatch.
#[derive(Default)]
struct Service {
    faults: Mutex<VecDeque<Fault>>,
    /// The key of every dispatch, in order.
    dispatches: Mutex<Vec<IdempotencyKey>>,
    /// Applied effects: (key, customer).
    applied: Mutex<Vec<(IdempotencyKey, u64)>>,
    verifier_reads: AtomicU32,
}

impl Service {
    fn with_faults(faults: &[Fault]) -> Self {
        Self { faults: Mutex::new(faults.iter().copied().collect()), ..Self::default() }
    }

    async fn activate(&self, key: IdempotencyKey, customer: u64) -> Result<u64, SvcError> {
        self.dispatches.lock().unwrap().push(key);
        let fault = self.faults.lock().unwrap().pop_front().unwrap_or(Fault::None);
        if fault == Fault::TimeoutBeforeApply {
            std::future::pending::<()>().await;
        }
        {
            let mut applied = self.applied.lock().unwrap();
            if !applied.iter().any(|(k, _)| *k == key) {
                applied.push((key, customer));
            }
        }
        if fault == Fault::TimeoutAfterApply {
            std::future::pending::<()>().await;
        }
        Ok(customer)
    }

    fn is_applied(&self, customer: u64) -> Verdict<u64> {
        self.verifier_reads.fetch_add(1, Ordering::SeqCst);
        let applied = self.applied.lock().unwrap();
        if applied.iter().any(|(_, c)| *c == customer) {
            Verdict::Holds(customer)
        } else {
            Verdict::Absent
        }
    }

    fn dispatch_keys(&self) -> Vec<IdempotencyKey> {
        self.dispatches.lock().unwrap().clone()
    }

    fn effects(&self) -> usize {
        self.applied.lock().unwrap().len()
    }
}

/// Activates a customer (the paper's `activate_customer`).
#[verified_tool(side_effect = "high", verify = is_active, skip(svc), timeout = "2s")]
async fn activate(svc: &Service, customer: u64, key: IdempotencyKey) -> Result<u64, SvcError> {
    svc.activate(key, customer).await
}

async fn is_active(svc: &Service, customer: &u64) -> Verdict<u64> {
    svc.is_applied(*customer)
}

/// Same as `activate`, opted out of reading its verifier after an `Ok`
/// answer: the test of an answer believed.
#[verified_tool(
    side_effect = "high",
    verify = is_active,
    skip(svc),
    timeout = "2s",
    verify_response = false
)]
async fn activate_believed(
    svc: &Service,
    customer: u64,
    key: IdempotencyKey,
) -> Result<u64, SvcError> {
    svc.activate(key, customer).await
}

#[verified_tool(side_effect = "high", verify = is_active, skip(svc), timeout = "2s", retries = 3)]
async fn activate_3(svc: &Service, customer: u64, key: IdempotencyKey) -> Result<u64, SvcError> {
    svc.activate(key, customer).await
}

/// Same as `activate`, verified by asking the service about the request's
/// key (`verify_key = true`: the verifier gets the key as its last argument).
#[verified_tool(side_effect = "high", verify = applied_by_key, verify_key = true, skip(svc))]
async fn activate_by_key(
    svc: &Service,
    customer: u64,
    key: IdempotencyKey,
) -> Result<u64, SvcError> {
    svc.activate(key, customer).await
}

async fn applied_by_key(svc: &Service, _customer: &u64, key: IdempotencyKey) -> Verdict<u64> {
    svc.verifier_reads.fetch_add(1, Ordering::SeqCst);
    let applied = svc.applied.lock().unwrap();
    applied.iter().find(|(k, _)| *k == key).map(|(_, c)| *c).into()
}

/// Same as `activate`, with a secret token and a label in the key.
#[verified_tool(
    side_effect = "high",
    verify = is_active_with_token,
    skip(svc),
    secret(token),
    timeout = "2s",
    bucket = "5m",
    name = "activate_with_token",
    verify_response = true,
    json = true
)]
async fn activate_secret(
    svc: &Service,
    customer: u64,
    token: &str,
    label: String,
    key: IdempotencyKey,
) -> Result<u64, SvcError> {
    assert!(!token.is_empty() && !label.is_empty());
    svc.activate(key, customer).await
}

async fn is_active_with_token(
    svc: &Service,
    customer: &u64,
    _token: &str,
    _label: &String,
) -> Verdict<u64> {
    svc.is_applied(*customer)
}

/// A low-risk tool: no verifier, retried with the key.
#[verified_tool(side_effect = "low", skip(svc), timeout = "1s")]
async fn draft(svc: &Service, customer: u64, key: IdempotencyKey) -> Result<u64, SvcError> {
    svc.activate(key, customer).await
}

/// A read: no key parameter, no verifier.
#[verified_tool(side_effect = "none", skip(svc), timeout = "1s", retries = 2)]
async fn count(svc: &Service, customer: u64) -> Result<u64, SvcError> {
    if customer == 0 {
        return Err(SvcError::Invalid);
    }
    Ok(svc.effects() as u64)
}

/// A tool written as a method, with a verifier method and a fallible read.
struct Crm {
    svc: Service,
    fail_reads: AtomicU32,
}

impl Crm {
    #[verified_tool(
        side_effect = "irreversible",
        verify = check,
        timeout = "2s",
        retries = 1,
        send = true,
        json = true
    )]
    async fn close_account(&self, customer: u64, key: IdempotencyKey) -> Result<u64, SvcError> {
        self.svc.activate(key, customer).await
    }

    /// A failed read is `Unknown`: the engine reads again before deciding.
    async fn check(&self, customer: &u64) -> Result<Verdict<u64>, SvcError> {
        if self.fail_reads.load(Ordering::SeqCst) > 0 {
            self.fail_reads.fetch_sub(1, Ordering::SeqCst);
            return Err(SvcError::Invalid);
        }
        Ok(self.svc.is_applied(*customer))
    }
}

/// The fake settles at once: a request it did not apply by the attempt's
/// deadline never will be, and its reads are never stale.
fn context() -> Context {
    Context::new("agent-1")
        .with_clock(Arc::new(TokioClock::starting_at(1_700_000_000_000)))
        .map_policies(|_, policy| policy.with_settle(Some(Duration::ZERO)))
}

#[tokio::test(start_paused = true)]
async fn timeout_after_apply_is_verified_not_retried() {
    let svc = Service::with_faults(&[Fault::TimeoutAfterApply]);
    let result = activate(&context(), &svc, 7).await;
    assert!(
        matches!(result, ToolResult::Success { value: 7, proof: Proof::Verifier, .. }),
        "{result:?}"
    );
    assert_eq!(svc.dispatch_keys().len(), 1, "the verifier saw the effect: no second dispatch");
    assert_eq!(svc.effects(), 1);
    assert!(svc.verifier_reads.load(Ordering::SeqCst) >= 1);
}

#[tokio::test(start_paused = true)]
async fn absent_retries_once_with_the_same_key() {
    let svc = Service::with_faults(&[Fault::TimeoutBeforeApply]);
    let result = activate(&context(), &svc, 7).await;
    // The retry's OK answer is read back (a high tool's default).
    assert!(
        matches!(result, ToolResult::Success { value: 7, proof: Proof::Verifier, .. }),
        "{result:?}"
    );
    let keys = svc.dispatch_keys();
    assert_eq!(keys.len(), 2, "one retry after the verifier said Absent");
    assert_eq!(keys[0], keys[1], "both attempts carry the same key");
    assert_eq!(Some(keys[0]), result.key());
    assert_eq!(svc.effects(), 1);
    assert_eq!(svc.verifier_reads.load(Ordering::SeqCst), 2, "Absent, then the OK's");
}

#[tokio::test(start_paused = true)]
async fn the_retry_budget_is_the_attribute_s() {
    // Default class budget (high: 1 retry): two dispatches, then NotApplied.
    let svc = Service::with_faults(&[Fault::TimeoutBeforeApply; 8]);
    let result = activate(&context(), &svc, 7).await;
    assert!(matches!(result, ToolResult::NotApplied { .. }), "{result:?}");
    assert_eq!(svc.dispatch_keys().len(), 2);

    // `retries = 3`: four dispatches, all with one key.
    let svc = Service::with_faults(&[Fault::TimeoutBeforeApply; 8]);
    let result = activate_3(&context(), &svc, 7).await;
    assert!(matches!(result, ToolResult::NotApplied { .. }), "{result:?}");
    let keys = svc.dispatch_keys();
    assert_eq!(keys.len(), 4);
    assert!(keys.iter().all(|k| *k == keys[0]));
    assert_eq!(activate_3_spec().retries, Some(3));
}

#[tokio::test(start_paused = true)]
async fn skipped_parameters_do_not_change_the_key_others_do() {
    let cx = context();
    let (a, b) = (Service::default(), Service::default());
    let key = |r: ToolResult<u64, SvcError>| r.key().expect("a key");
    let with_a = key(activate(&cx, &a, 7).await);
    let with_b = key(activate(&cx, &b, 7).await);
    assert_eq!(with_a, with_b, "`svc` is skipped: another client, same key");
    let other_customer = key(activate(&cx, &a, 8).await);
    assert_ne!(with_a, other_customer, "`customer` is in the key");

    // A secret parameter is in the key, and so is every owned parameter.
    let s = Service::default();
    let base = key(activate_secret(&cx, &s, 7, "token-1", "x".to_owned()).await);
    assert_eq!(base, key(activate_secret(&cx, &s, 7, "token-1", "x".to_owned()).await));
    assert_ne!(base, key(activate_secret(&cx, &s, 7, "token-2", "x".to_owned()).await));
    assert_ne!(base, key(activate_secret(&cx, &s, 7, "token-1", "y".to_owned()).await));

    // The key is the engine's: derived from the action name and the payload
    // tuple of the key-relevant parameters, in declaration order.
    let expected = IdempotencyKey::derive(
        "agent-1",
        "activate",
        &(&7u64,),
        &verified_tools::KeyScope::DEFAULT,
        cx.clock().unix_ms(),
    )
    .expect("serializable");
    assert_eq!(with_a, expected);
}

#[tokio::test(start_paused = true)]
async fn secret_parameters_never_reach_the_audit() {
    let audit = Arc::new(MemoryAudit::new());
    let cx = context().with_audit(audit.clone());
    let svc = Service::with_faults(&[Fault::TimeoutAfterApply]);
    let result = activate_secret(&cx, &svc, 7, "s3cr3t-t0ken", "vip".to_owned()).await;
    assert!(result.is_success(), "{result:?}");
    let events = audit.events();
    assert!(events.len() >= 3);
    assert!(events.iter().all(|e| e.tool == "activate_with_token"));
    for event in &events {
        assert!(!event.args.as_deref().unwrap_or("").contains("s3cr3t"), "{event:?}");
    }
    let planned = events.iter().find(|e| e.state == CallState::Planned).expect("a Planned event");
    assert_eq!(
        planned.args.as_deref(),
        Some(r#"{"customer":7,"token":"<redacted>","label":"vip"}"#)
    );
}

#[tokio::test(start_paused = true)]
async fn verify_response_confirms_an_ok() {
    // verify_response = true: an Ok answer is confirmed by a verifier read.
    let svc = Service::default();
    let result = activate_secret(&context(), &svc, 7, "t", "l".to_owned()).await;
    assert!(result.is_success());
    assert_eq!(svc.verifier_reads.load(Ordering::SeqCst), 1);
    // Left out, a high tool confirms it too (the class default).
    let svc = Service::default();
    let result = activate(&context(), &svc, 7).await;
    assert!(matches!(result, ToolResult::Success { proof: Proof::Verifier, .. }), "{result:?}");
    assert_eq!(svc.verifier_reads.load(Ordering::SeqCst), 1);
    // verify_response = false: an Ok answer is believed.
    let svc = Service::default();
    let result = activate_believed(&context(), &svc, 7).await;
    assert!(matches!(result, ToolResult::Success { proof: Proof::Response, .. }), "{result:?}");
    assert_eq!(svc.verifier_reads.load(Ordering::SeqCst), 0);
}

#[tokio::test(start_paused = true)]
async fn low_and_none_tools_retry_without_a_verifier() {
    // Low: the lost response is retried with the same key; the fake dedupes.
    let svc = Service::with_faults(&[Fault::TimeoutAfterApply]);
    let result = draft(&context(), &svc, 3).await;
    assert!(
        matches!(result, ToolResult::Success { value: 3, proof: Proof::Response, .. }),
        "{result:?}"
    );
    let keys = svc.dispatch_keys();
    assert_eq!(keys.len(), 2);
    assert_eq!(keys[0], keys[1]);
    assert_eq!(svc.effects(), 1, "the key deduplicated the retry");

    // None: a definitive error is returned as is, without retry.
    let result = count(&context(), &svc, 0).await;
    assert!(matches!(result, ToolResult::Failed { error: SvcError::Invalid, .. }), "{result:?}");
    let result = count(&context(), &svc, 1).await;
    assert!(matches!(result, ToolResult::Success { value: 1, .. }), "{result:?}");
}

#[tokio::test(start_paused = true)]
async fn methods_call_the_verifier_with_self_and_read_errors_are_unknown() {
    let crm = Crm {
        svc: Service::with_faults(&[Fault::TimeoutAfterApply]),
        fail_reads: AtomicU32::new(1),
    };
    // `send = true`: the future can be spawned.
    let crm = Arc::new(crm);
    let task = tokio::spawn({
        let crm = crm.clone();
        async move { crm.close_account(&context(), 11).await }
    });
    let result = task.await.expect("no panic");
    assert!(
        matches!(result, ToolResult::Success { value: 11, proof: Proof::Verifier, .. }),
        "{result:?}"
    );
    assert_eq!(crm.svc.dispatch_keys().len(), 1);
    assert_eq!(crm.fail_reads.load(Ordering::SeqCst), 0, "the failed read was retried");
    assert_eq!(Crm::close_account_spec().side_effect, SideEffect::Irreversible);
}

#[test]
fn the_descriptor_lists_the_tool() {
    let spec = activate_secret_spec();
    assert_eq!(spec.name, "activate_with_token");
    assert_eq!(spec.description, "Same as `activate`, with a secret token and a label in the key.");
    assert_eq!(spec.side_effect, SideEffect::High);
    assert!(spec.has_verifier);
    assert_eq!(spec.retries, None);
    assert_eq!(spec.timeout, Some(Duration::from_secs(2)));
    assert_eq!(spec.bucket, Some(Duration::from_secs(300)));
    assert_eq!(spec.verify_response, Some(true));
    let params: Vec<_> = spec.params.iter().map(|p| (p.name, p.ty, p.in_key, p.secret)).collect();
    assert_eq!(
        params,
        [
            ("svc", "&Service", false, false),
            ("customer", "u64", true, false),
            ("token", "&str", true, true),
            ("label", "String", true, false),
        ]
    );

    let spec = count_spec();
    assert_eq!(
        (spec.name, spec.side_effect, spec.has_verifier),
        ("count", SideEffect::None, false)
    );
    assert_eq!(spec.retries, Some(2));
    assert_eq!(spec.timeout, Some(Duration::from_secs(1)));
    assert_eq!(spec.description, "A read: no key parameter, no verifier.");

    // Descriptors are const: a registry can be a static.
    static REGISTRY: [&verified_tools::ToolSpec; 3] = [activate_spec(), draft_spec(), count_spec()];
    let names: Vec<_> = REGISTRY.iter().map(|s| s.name).collect();
    assert_eq!(names, ["activate", "draft", "count"]);
}

#[tokio::test(start_paused = true)]
async fn verify_key_hands_the_call_s_key_to_the_verifier() {
    // Applied, answer lost: the verifier finds the request by its key.
    let svc = Service::with_faults(&[Fault::TimeoutAfterApply]);
    let result = activate_by_key(&context(), &svc, 7).await;
    assert!(matches!(result, ToolResult::Success { value: 7, proof: Proof::Verifier, .. }));
    assert_eq!(svc.dispatch_keys().len(), 1);

    // Lost before applying: no request with that key, so one retry, same key,
    // whose OK answer the verifier finds by that key too.
    let svc = Service::with_faults(&[Fault::TimeoutBeforeApply]);
    let result = activate_by_key(&context(), &svc, 7).await;
    assert!(matches!(result, ToolResult::Success { value: 7, proof: Proof::Verifier, .. }));
    let keys = svc.dispatch_keys();
    assert_eq!(keys.len(), 2);
    assert_eq!(keys[0], keys[1]);
    assert_eq!(svc.verifier_reads.load(Ordering::SeqCst), 2, "Absent, then the OK's");
}

#[tokio::test(start_paused = true)]
async fn json_arguments_call_the_same_logical_call() {
    use serde_json::json;
    let cx = context().without_ledger();
    let svc = Service::with_faults(&[]);
    let typed = activate_secret(&cx, &svc, 7, "t0ken", "vip".to_owned()).await;
    let args = json!({"customer": 7, "token": "t0ken", "label": "vip"});
    let from_json = activate_secret_json(&cx, &svc, &args).await.expect("valid arguments");
    assert!(from_json.is_success(), "{from_json:?}");
    // The same arguments are the same logical call, whichever way they came.
    assert_eq!(from_json.key(), typed.key());
    assert_eq!(svc.dispatch_keys().len(), 2);

    let missing = activate_secret_json(&cx, &svc, &json!({"customer": 7, "token": "x"})).await;
    let err = missing.expect_err("label is missing");
    assert_eq!(err.tool, "activate_with_token");
    assert!(err.message.contains("label"), "{err}");
    let unknown = json!({"customer": 7, "token": "x", "label": "y", "extra": 1});
    let err = activate_secret_json(&cx, &svc, &unknown).await.expect_err("unknown field");
    assert!(err.message.contains("extra"), "{err}");
    assert_eq!(err.message.split('`').nth(1), Some("extra"));
    let ill_typed = json!({"customer": "seven", "token": "x", "label": "y"});
    let err = activate_secret_json(&cx, &svc, &ill_typed).await.expect_err("ill-typed");
    assert!(err.message.starts_with("field `customer`"), "{err}");
    let missing = activate_secret_json(&cx, &svc, &json!({"customer": 7, "token": "x"})).await;
    assert_eq!(missing.expect_err("no label").message, "missing field `label`");
    // A secret's value never appears in an error (it is logged, or shown to
    // the model).
    let secret = json!({"customer": 7, "token": 918273, "label": "y"});
    let err = activate_secret_json(&cx, &svc, &secret).await.expect_err("token is a string");
    assert!(!err.to_string().contains("918273"), "{err}");
    assert!(err.message.contains("secret field `token`"), "{err}");
    assert_eq!(svc.dispatch_keys().len(), 2, "bad arguments dispatch nothing");

    // Methods get one too.
    let crm = Crm { svc: Service::with_faults(&[]), fail_reads: AtomicU32::new(0) };
    let closed = crm.close_account_json(&cx, &json!({"customer": 9})).await.expect("valid");
    assert!(matches!(closed, ToolResult::Success { value: 9, .. }), "{closed:?}");
}

/// Issue 9, case 4: an irreversible tool whose answer was lost after it
/// applied, in the retry-only baseline mode: never dispatched again, handed
/// to a person.
#[tokio::test(start_paused = true)]
async fn retry_only_never_resends_an_irreversible_tool_in_doubt() {
    let crm = Crm {
        svc: Service::with_faults(&[Fault::TimeoutAfterApply]),
        fail_reads: AtomicU32::new(0),
    };
    let cx = context().with_mode(Mode::RetryOnly);
    let result = crm.close_account(&cx, 11).await;
    assert!(matches!(result, ToolResult::Escalated { .. }), "{result:?}");
    assert_eq!(crm.svc.dispatch_keys().len(), 1);
    assert_eq!(crm.svc.verifier_reads.load(Ordering::SeqCst), 0, "retry-only never reads");
}

/// Issue 9, case 7: `json = true` with a raw-identifier parameter.
#[verified_tool(side_effect = "low", json = true)]
async fn tag(r#type: &str, r#ref: u32, key: IdempotencyKey) -> Result<String, SvcError> {
    let _ = key;
    Ok(format!("{type}-{ref}", type = r#type, ref = r#ref))
}

#[tokio::test(start_paused = true)]
async fn raw_identifiers_are_json_fields_by_their_plain_name() {
    let cx = context().for_step("run", 1).without_ledger();
    let typed = tag(&cx, "invoice", 3).await;
    let from_json = tag_json(&cx, &serde_json::json!({"type": "invoice", "ref": 3})).await;
    let from_json = from_json.expect("`type` and `ref` are the JSON fields");
    assert!(matches!(&from_json, ToolResult::Success { value, .. } if value == "invoice-3"));
    assert_eq!(from_json.key(), typed.key());
}

/// A `Deadline` parameter receives each attempt's deadline: the attribute's
/// timeout from the attempt's start.
#[verified_tool(side_effect = "low", timeout = "1500ms", retries = 1, skip(seen))]
async fn upload(
    seen: &Mutex<Vec<Duration>>,
    part: u32,
    deadline: Deadline,
) -> Result<u32, SvcError> {
    seen.lock().unwrap().push(deadline.remaining());
    if seen.lock().unwrap().len() == 1 {
        std::future::pending::<()>().await; // the first attempt hangs
    }
    Ok(part)
}

#[tokio::test(start_paused = true)]
async fn each_attempt_receives_its_own_deadline() {
    let seen = Mutex::new(Vec::new());
    let result = upload(&context(), &seen, 4).await;
    assert!(matches!(result, ToolResult::Success { value: 4, .. }), "{result:?}");
    let seen = seen.into_inner().unwrap();
    assert_eq!(seen, [Duration::from_millis(1500), Duration::from_millis(1500)]);
}

/// Stands for another crate's error (`reqwest::Error`, `anyhow::Error`): it
/// has `Display`, and no `Classify` impl (none could be written for a
/// foreign type).
#[derive(Debug, Clone, PartialEq, Eq)]
struct HttpError {
    status: u16,
}

impl std::fmt::Display for HttpError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "HTTP {}", self.status)
    }
}

/// 503: the gateway refused it, the service never saw it; 5xx after
/// dispatch: maybe applied; anything else: rejected.
fn classify_http(error: &HttpError) -> ErrorClass {
    match error.status {
        503 => ErrorClass::NotSent,
        500..=599 => ErrorClass::Ambiguous,
        _ => ErrorClass::Definitive,
    }
}

/// An HTTP API: each dispatch answers the next queued status (then 200),
/// the verifier answers `verdict` until a post has answered 200, and the
/// post's value after it (what the 200 did).
struct Api {
    statuses: Mutex<VecDeque<u16>>,
    dispatches: AtomicU32,
    reads: AtomicU32,
    verdict: Verdict<u64>,
    posted: Mutex<Option<u64>>,
}

impl Api {
    fn new(statuses: &[u16], verdict: Verdict<u64>) -> Self {
        Self {
            statuses: Mutex::new(statuses.iter().copied().collect()),
            dispatches: AtomicU32::new(0),
            reads: AtomicU32::new(0),
            verdict,
            posted: Mutex::new(None),
        }
    }
}

#[verified_tool(
    side_effect = "high",
    verify = api_posted,
    classify = classify_http,
    skip(api),
    retries = 2
)]
async fn post(api: &Api, id: u64) -> Result<u64, HttpError> {
    api.dispatches.fetch_add(1, Ordering::SeqCst);
    match api.statuses.lock().unwrap().pop_front() {
        Some(status) => Err(HttpError { status }),
        None => {
            *api.posted.lock().unwrap() = Some(id);
            Ok(id)
        }
    }
}

async fn api_posted(api: &Api, _id: &u64) -> Verdict<u64> {
    api.reads.fetch_add(1, Ordering::SeqCst);
    match *api.posted.lock().unwrap() {
        Some(id) => Verdict::Holds(id),
        None => api.verdict,
    }
}

#[tokio::test(start_paused = true)]
async fn classify_fn_drives_the_engine_for_an_error_without_classify() {
    // NotSent: retried at once, never verified; the one read is the OK's
    // (a high tool's default).
    let api = Api::new(&[503, 503], Verdict::Absent);
    let result = post(&context(), &api, 1).await;
    assert!(
        matches!(result, ToolResult::Success { value: 1, proof: Proof::Verifier, .. }),
        "{result:?}"
    );
    assert_eq!(api.dispatches.load(Ordering::SeqCst), 3);
    assert_eq!(api.reads.load(Ordering::SeqCst), 1);

    // Ambiguous: the verifier decides, nothing is sent again.
    let api = Api::new(&[500], Verdict::Holds(2));
    let result = post(&context(), &api, 2).await;
    assert!(matches!(result, ToolResult::Success { value: 2, proof: Proof::Verifier, .. }));
    assert_eq!(api.dispatches.load(Ordering::SeqCst), 1);
    assert_eq!(api.reads.load(Ordering::SeqCst), 1);

    // Definitive: failed, with the tool's own error type (not `Classified`).
    let api = Api::new(&[404], Verdict::Absent);
    let result: ToolResult<u64, HttpError> = post(&context(), &api, 3).await;
    assert!(matches!(result, ToolResult::Failed { error: HttpError { status: 404 }, .. }));
    assert_eq!(api.dispatches.load(Ordering::SeqCst), 1);
    assert_eq!(api.reads.load(Ordering::SeqCst), 0);

    // In doubt: the cause is the tool's error too.
    let api = Api::new(&[502], Verdict::Unknown);
    let result = post(&context(), &api, 4).await;
    assert!(
        matches!(
            &result,
            ToolResult::Unknown {
                reason: UnknownReason::VerifierInconclusive,
                cause: Cause::Error(HttpError { status: 502 }),
                ..
            }
        ),
        "{result:?}"
    );
    assert_eq!(api.dispatches.load(Ordering::SeqCst), 1);
}

#[tokio::test(start_paused = true)]
async fn json_refusals_are_recorded_in_the_audit() {
    use serde_json::json;
    let audit = Arc::new(MemoryAudit::new());
    let cx = context().with_audit(audit.clone());
    let svc = Service::with_faults(&[]);
    let refusals = [
        json!({"customer": "seven", "token": "x", "label": "y"}),
        json!({"customer": 7, "token": "x"}),
        json!({"customer": 7, "token": "x", "label": "y", "extra": 1}),
        json!([7]),
        json!({"customer": 7, "token": 918273, "label": "y"}),
    ];
    for (i, arguments) in refusals.iter().enumerate() {
        let error = activate_secret_json(&cx, &svc, arguments).await.expect_err("refused");
        let events = audit.events();
        assert_eq!(events.len(), i + 1, "one event per refusal: {events:?}");
        let event = &events[i];
        assert_eq!(event.state, CallState::Refused);
        assert_eq!(event.tool, "activate_with_token");
        assert_eq!(event.key, None, "refused before a key was derived");
        assert_eq!(event.attempt, 0);
        let recorded: serde_json::Value = serde_json::from_str(&event.json).expect("JSON");
        assert_eq!(recorded["state"], "refused");
        assert_eq!(recorded["outcome"], "refused");
        assert_eq!(recorded["error"], error.to_string().as_str());
        assert!(recorded.get("key").is_none(), "{recorded}");
        assert!(!event.json.contains("918273"), "a secret's value is never recorded");
    }
    assert_eq!(svc.dispatch_keys().len(), 0, "nothing dispatched");

    // A valid call records its own events, not a refusal.
    let result =
        activate_secret_json(&cx, &svc, &json!({"customer": 7, "token": "x", "label": "y"}))
            .await
            .expect("valid arguments");
    assert!(result.is_success(), "{result:?}");
    let states = audit.states();
    assert_eq!(states.iter().filter(|s| **s == CallState::Refused).count(), refusals.len());
    assert_eq!(states.last(), Some(&CallState::VerifiedSuccess));
}
