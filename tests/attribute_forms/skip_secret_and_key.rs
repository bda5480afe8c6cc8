//! `skip` (client handles, not Serialize), `secret` (in the key, not in the
//! audit), the key parameter anywhere in the list, `mut` bindings, owned
//! parameters cloned per attempt.
use verified_tools::{Context, ErrorClass, IdempotencyKey, ToolResult, Verdict, verified_tool};

/// Not `Serialize`: must be skipped.
pub struct HttpClient;

#[verified_tool(side_effect = "high", verify = charged, skip(client, pool), secret(card))]
pub async fn charge(
    client: &HttpClient,
    key: IdempotencyKey,
    pool: std::sync::Arc<HttpClient>,
    mut amount_cents: u64,
    card: String,
    tags: Vec<String>,
) -> Result<u64, ErrorClass> {
    let _ = (client, key, pool, card, tags);
    amount_cents += 0;
    Ok(amount_cents)
}

async fn charged(
    _client: &HttpClient,
    _pool: &std::sync::Arc<HttpClient>,
    amount_cents: &u64,
    _card: &String,
    _tags: &Vec<String>,
) -> Verdict<u64> {
    Verdict::Holds(*amount_cents)
}

#[test]
fn compiles_and_runs() {
    let cx = Context::new("agent");
    let client = HttpClient;
    let _call = async {
        let r: ToolResult<u64, ErrorClass> =
            charge(&cx, &client, std::sync::Arc::new(HttpClient), 250, "4242".to_owned(), vec![])
                .await;
        r
    };
    let spec = charge_spec();
    let in_key: Vec<bool> = spec.params.iter().map(|p| p.in_key).collect();
    assert_eq!(in_key, [false, false, true, true, true]);
    assert!(spec.params[3].secret);
}
