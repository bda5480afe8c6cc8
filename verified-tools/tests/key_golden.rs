//! Keys go over the wire and into ledgers: they must never change across
//! versions or platforms. Two checks: an independent re-encoding of the
//! documented format (so the format is what the docs say), and pinned hex
//! values (so nothing, not even the docs, drifts).

use std::collections::{BTreeMap, HashMap};
use std::time::Duration;

use serde::Serialize;
use verified_tools::key::payload_digest;
use verified_tools::{IdempotencyKey, KeyScope};
use xxhash_rust::xxh3::xxh3_128;

/// Hand-written encoder of the documented format, independent of the
/// serializer under test.
fn str_(out: &mut Vec<u8>, s: &str) {
    out.extend_from_slice(&(s.len() as u64).to_le_bytes());
    out.extend_from_slice(s.as_bytes());
}

fn int(out: &mut Vec<u8>, v: i64) {
    out.push(0x02);
    out.extend_from_slice(&v.to_le_bytes());
}

fn string(out: &mut Vec<u8>, s: &str) {
    out.push(0x07);
    str_(out, s);
}

fn key_bytes(agent: &str, action: &str, scope: &[u8], payload: &[u8]) -> Vec<u8> {
    let mut out = b"vtk1".to_vec();
    str_(&mut out, agent);
    str_(&mut out, action);
    out.extend_from_slice(scope);
    out.extend_from_slice(payload);
    out
}

#[derive(Serialize)]
struct Invoice<'a> {
    invoice_id: u64,
    amount_cents: i64,
    currency: &'a str,
    memo: Option<&'a str>,
}

#[test]
fn tuple_of_int_and_str_matches_the_documented_encoding() {
    let mut bytes = vec![0x0E];
    int(&mut bytes, 42);
    string(&mut bytes, "welcome");
    bytes.push(0xFF);
    let expected = xxh3_128(&bytes);
    assert_eq!(payload_digest(&(42u64, "welcome")).unwrap().as_u128(), expected);
}

#[test]
fn struct_matches_the_documented_encoding() {
    let invoice = Invoice { invoice_id: 7, amount_cents: -1250, currency: "EUR", memo: None };
    let mut bytes = vec![0x11];
    string(&mut bytes, "invoice_id");
    int(&mut bytes, 7);
    string(&mut bytes, "amount_cents");
    int(&mut bytes, -1250);
    string(&mut bytes, "currency");
    string(&mut bytes, "EUR");
    string(&mut bytes, "memo");
    bytes.push(0x09);
    bytes.push(0xFF);
    assert_eq!(payload_digest(&invoice).unwrap().as_u128(), xxh3_128(&bytes));
}

#[test]
fn map_is_the_sum_of_its_entry_digests() {
    let mut entry_a = Vec::new();
    string(&mut entry_a, "a");
    int(&mut entry_a, 1);
    let mut entry_b = Vec::new();
    string(&mut entry_b, "b");
    int(&mut entry_b, 2);
    let mut bytes = vec![0x10];
    bytes.extend_from_slice(&2u64.to_le_bytes());
    let sum = xxh3_128(&entry_a).wrapping_add(xxh3_128(&entry_b));
    bytes.extend_from_slice(&sum.to_le_bytes());

    let btree: BTreeMap<&str, u8> = [("a", 1), ("b", 2)].into();
    let hash: HashMap<&str, u8> = [("b", 2), ("a", 1)].into();
    assert_eq!(payload_digest(&btree).unwrap().as_u128(), xxh3_128(&bytes));
    assert_eq!(payload_digest(&hash).unwrap(), payload_digest(&btree).unwrap());
}

#[test]
fn key_matches_the_documented_framing() {
    // encoding((42u64,)) = seq start, int 42, seq end.
    let mut payload = vec![0x0E];
    int(&mut payload, 42);
    payload.push(0xFF);

    let scope = KeyScope::durable("run-1", 3);
    let mut scope_bytes = vec![0x01];
    str_(&mut scope_bytes, "run-1");
    scope_bytes.extend_from_slice(&3u64.to_le_bytes());
    let expected = xxh3_128(&key_bytes("agent-a", "send_welcome", &scope_bytes, &payload));
    let key = IdempotencyKey::derive("agent-a", "send_welcome", &(42u64,), &scope, 0).unwrap();
    assert_eq!(key.as_u128(), expected);

    let bucket = KeyScope::TimeBucket(Duration::from_secs(300));
    let mut bucket_bytes = vec![0x00];
    bucket_bytes.extend_from_slice(&300_000u64.to_le_bytes());
    bucket_bytes.extend_from_slice(&(1_700_000_123_456u64 / 300_000).to_le_bytes());
    let expected = xxh3_128(&key_bytes("agent-a", "send_welcome", &bucket_bytes, &payload));
    let key =
        IdempotencyKey::derive("agent-a", "send_welcome", &(42u64,), &bucket, 1_700_000_123_456)
            .unwrap();
    assert_eq!(key.as_u128(), expected);

    // A payload longer than the hasher's stack window takes the streaming path.
    let long = "x".repeat(1000);
    let mut long_payload = vec![0x0E];
    string(&mut long_payload, &long);
    long_payload.push(0xFF);
    let expected = xxh3_128(&key_bytes("agent-a", "send_welcome", &scope_bytes, &long_payload));
    let key = IdempotencyKey::derive("agent-a", "send_welcome", &(&long,), &scope, 0).unwrap();
    assert_eq!(key.as_u128(), expected);
}

/// Pinned values. If one of these changes, every key already sent to a
/// server or stored in a ledger changes meaning: bump the format version
/// ("vtk1") instead of editing the value.
#[test]
fn golden_vectors() {
    let durable = KeyScope::durable("run-1", 3);
    let bucket = KeyScope::TimeBucket(Duration::from_secs(300));
    let invoice = Invoice { invoice_id: 7, amount_cents: -1250, currency: "EUR", memo: Some("q3") };
    let cases: [(IdempotencyKey, &str); 5] = [
        (
            IdempotencyKey::derive("agent-a", "send_welcome", &(42u64,), &durable, 0).unwrap(),
            GOLDEN[0],
        ),
        (
            IdempotencyKey::derive(
                "agent-a",
                "send_welcome",
                &(42u64,),
                &bucket,
                1_700_000_123_456,
            )
            .unwrap(),
            GOLDEN[1],
        ),
        (
            IdempotencyKey::derive("agent-a", "record_invoice", &invoice, &durable, 0).unwrap(),
            GOLDEN[2],
        ),
        (IdempotencyKey::derive("", "", &(), &durable, 0).unwrap(), GOLDEN[3]),
        (IdempotencyKey::derive("agent-a", "x", &("ab", "c"), &durable, 0).unwrap(), GOLDEN[4]),
    ];
    for (i, (key, golden)) in cases.iter().enumerate() {
        assert_eq!(key.to_string(), *golden, "golden vector {i}");
    }
}

const GOLDEN: [&str; 5] = [
    "ad2098a5b21578aca3491116db125fcc",
    "ea824c898158b8c5ea89578b73076098",
    "e07676b26a110c02fd6611b0c6d10ad9",
    "f83d21ca1aae2de3e977c0a24a4a9bc7",
    "31a9ca8312255b41047a1ab47b676916",
];

/// The default scope decides every macro tool's keys: it must not drift.
#[test]
fn default_scope_is_pinned() {
    assert_eq!(KeyScope::DEFAULT, KeyScope::TimeBucket(Duration::from_secs(300)));
}

#[test]
fn framing_separates_adjacent_strings() {
    let scope = KeyScope::durable("r", 0);
    let a = IdempotencyKey::derive("agent", "act", &("ab", "c"), &scope, 0).unwrap();
    let b = IdempotencyKey::derive("agent", "act", &("a", "bc"), &scope, 0).unwrap();
    assert_ne!(a, b);
    // Agent and action are framed too.
    let c = IdempotencyKey::derive("agenta", "ct", &("ab", "c"), &scope, 0).unwrap();
    assert_ne!(a, c);
}

#[test]
fn time_bucket_groups_calls_and_explicit_keys_pass_through() {
    let bucket = KeyScope::TimeBucket(Duration::from_secs(60));
    let at = |ms| IdempotencyKey::derive("a", "b", &1u8, &bucket, ms).unwrap();
    assert_eq!(at(60_000), at(119_999));
    assert_ne!(at(119_999), at(120_000));
    let explicit = IdempotencyKey::from_u128(0xfeed);
    let key = IdempotencyKey::derive("a", "b", &1u8, &KeyScope::Explicit(explicit), 5).unwrap();
    assert_eq!(key, explicit);
}

#[test]
fn hex_round_trips_and_rejects_bad_text() {
    let key = IdempotencyKey::from_u128(0x0123_4567_89ab_cdef_0011_2233_4455_6677);
    assert_eq!(key.to_string(), "0123456789abcdef0011223344556677");
    assert_eq!(key.to_string().parse::<IdempotencyKey>().unwrap(), key);
    assert!("0123456789ABCDEF0011223344556677".parse::<IdempotencyKey>().is_err());
    assert!("+123456789abcdef0011223344556677".parse::<IdempotencyKey>().is_err());
    assert!("123".parse::<IdempotencyKey>().is_err());
    let json = serde_json::to_string(&key).unwrap();
    assert_eq!(json, "\"0123456789abcdef0011223344556677\"");
    assert_eq!(serde_json::from_str::<IdempotencyKey>(&json).unwrap(), key);
}

#[test]
fn a_failing_serialize_impl_is_an_error_not_a_panic() {
    struct Broken;
    impl Serialize for Broken {
        fn serialize<S: serde::Serializer>(&self, _: S) -> Result<S::Ok, S::Error> {
            Err(serde::ser::Error::custom("cannot encode a socket"))
        }
    }
    let err = payload_digest(&(1u8, Broken)).unwrap_err();
    assert!(err.to_string().contains("cannot encode a socket"), "{err}");
}
