//! Keys go over the wire and into ledgers: they must never change across
//! versions or platforms. Two checks: an independent re-encoding of the
//! documented format (so the format is what the docs say), and pinned hex
//! values (so nothing, not even the docs, drifts).

use std::collections::{BTreeMap, HashMap};
use std::time::Duration;

use serde::Serialize;
use verified_tools::key::{Effect, payload_digest};
use verified_tools::{IdempotencyKey, KeyScope};
use xxhash_rust::xxh3::xxh3_128;

/// Hand-written encoder of the documented format, independent of the
/// serializer under test.
///
/// Unsigned LEB128, shortest form: seven bits per byte, low group first,
/// continuation bit on every byte but the last.
fn len_(out: &mut Vec<u8>, n: usize) {
    let mut rest = n as u64;
    loop {
        let low = (rest & 0x7f) as u8;
        rest >>= 7;
        if rest == 0 {
            out.push(low);
            return;
        }
        out.push(low | 0x80);
    }
}

fn str_(out: &mut Vec<u8>, s: &str) {
    len_(out, s.len());
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
    let mut out = b"vtk2".to_vec();
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
    len_(&mut bytes, 2);
    let sum = xxh3_128(&entry_a).wrapping_add(xxh3_128(&entry_b));
    bytes.extend_from_slice(&sum.to_le_bytes());

    let btree: BTreeMap<&str, u8> = [("a", 1), ("b", 2)].into();
    let hash: HashMap<&str, u8> = [("b", 2), ("a", 1)].into();
    assert_eq!(payload_digest(&btree).unwrap().as_u128(), xxh3_128(&bytes));
    assert_eq!(payload_digest(&hash).unwrap(), payload_digest(&btree).unwrap());

    // 130 entries: the count takes two LEB128 bytes.
    let big: BTreeMap<u64, bool> = (0..130).map(|i| (i, i % 3 == 0)).collect();
    let mut sum = 0u128;
    for (k, v) in &big {
        let mut entry = Vec::new();
        int(&mut entry, *k as i64);
        entry.extend_from_slice(&[0x01, u8::from(*v)]);
        sum = sum.wrapping_add(xxh3_128(&entry));
    }
    let mut bytes = vec![0x10, 0x82, 0x01];
    bytes.extend_from_slice(&sum.to_le_bytes());
    assert_eq!(payload_digest(&big).unwrap().as_u128(), xxh3_128(&bytes));
}

#[test]
fn lengths_are_shortest_leb128() {
    // The helper itself, against bytes written out by hand.
    for (n, bytes) in [
        (0usize, &[0x00u8][..]),
        (5, &[0x05]),
        (127, &[0x7f]),
        (128, &[0x80, 0x01]),
        (200, &[0xc8, 0x01]),
        (300, &[0xac, 0x02]),
        (16_383, &[0xff, 0x7f]),
        (16_384, &[0x80, 0x80, 0x01]),
        (1 << 20, &[0x80, 0x80, 0x40]),
    ] {
        let mut out = Vec::new();
        len_(&mut out, n);
        assert_eq!(out, bytes, "len {n}");
    }
    // Strings and byte strings on both sides of the one-byte boundary and of
    // the hasher's 256-byte stack window.
    for n in [0, 1, 15, 16, 17, 127, 128, 129, 200, 253, 254, 255, 256, 300, 5000] {
        let text = "é".repeat(n / 2) + &"x".repeat(n % 2);
        assert_eq!(text.len(), n);
        let mut bytes = Vec::new();
        string(&mut bytes, &text);
        assert_eq!(payload_digest(&text).unwrap().as_u128(), xxh3_128(&bytes), "str of {n}");

        struct Raw<'a>(&'a [u8]);
        impl Serialize for Raw<'_> {
            fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
                s.serialize_bytes(self.0)
            }
        }
        let mut bytes = vec![0x08];
        len_(&mut bytes, n);
        bytes.extend_from_slice(text.as_bytes());
        let digest = payload_digest(&Raw(text.as_bytes())).unwrap();
        assert_eq!(digest.as_u128(), xxh3_128(&bytes), "bytes of {n}");
    }
}

#[test]
fn floats_chars_and_options_match_the_documented_encoding() {
    let payload = (
        (1.5f64, -0.0f64, 0.0f32, -f64::NAN, -2.25f32),
        'é',
        Some(false),
        None::<u8>,
        (),
        u64::MAX,
    );
    let mut bytes = vec![0x0E, 0x0E];
    // f32 widened, every NaN as the canonical one; -0.0 and 0.0 are
    // integral, so they are the integer 0.
    let float = |bytes: &mut Vec<u8>, f: f64| {
        bytes.push(0x05);
        bytes.extend_from_slice(&f.to_bits().to_le_bytes());
    };
    float(&mut bytes, 1.5);
    int(&mut bytes, 0);
    int(&mut bytes, 0);
    float(&mut bytes, f64::NAN);
    float(&mut bytes, -2.25);
    bytes.push(0xFF);
    bytes.push(0x06);
    bytes.extend_from_slice(&0xE9u32.to_le_bytes());
    bytes.extend_from_slice(&[0x0A, 0x01, 0x00, 0x09, 0x0B]);
    // u64 above i64::MAX: the i128 form.
    bytes.push(0x03);
    bytes.extend_from_slice(&u128::from(u64::MAX).to_le_bytes());
    bytes.push(0xFF);
    assert_eq!(payload_digest(&payload).unwrap().as_u128(), xxh3_128(&bytes));
}

#[test]
fn a_number_is_hashed_by_its_value_whatever_its_type_or_spelling() {
    let same = |a: u128, b: u128, what: &str| assert_eq!(a, b, "{what}");
    let digest = |p: &dyn erased_digest::Payload| p.digest();
    let json = |text: &str| serde_json::from_str::<serde_json::Value>(text).unwrap();
    same(digest(&1000u16), digest(&1000.0f64), "1000 and 1000.0");
    same(digest(&json("1001")), digest(&json("1001.0")), "JSON 1001 and 1001.0");
    same(digest(&json("1e3")), digest(&1000i64), "JSON 1e3 and 1000");
    same(digest(&json("-0")), digest(&0u8), "JSON -0 and 0");
    same(digest(&-7.0f32), digest(&-7i8), "-7.0f32 and -7");
    same(digest(&(2f64.powi(64))), digest(&(1u128 << 64)), "2^64 as a float and an integer");
    same(digest(&(-(2f64.powi(127)))), digest(&i128::MIN), "-2^127");
    same(digest(&(2f64.powi(127))), digest(&(1u128 << 127)), "2^127");
    // Not integral, or beyond every integer type: a float.
    let mut float = vec![0x05];
    float.extend_from_slice(&2f64.powi(128).to_bits().to_le_bytes());
    same(digest(&2f64.powi(128)), xxh3_128(&float), "2^128 stays a float");
    assert_ne!(digest(&1.5f64), digest(&1u8));
    assert_ne!(digest(&json("1001.5")), digest(&json("1001")));
    assert_ne!(digest(&f64::INFINITY), digest(&u128::MAX));
}

/// `payload_digest` for numbers of different types in one test.
mod erased_digest {
    pub trait Payload {
        fn digest(&self) -> u128;
    }

    impl<T: serde::Serialize> Payload for T {
        fn digest(&self) -> u128 {
            verified_tools::key::payload_digest(self).unwrap().as_u128()
        }
    }
}

#[derive(Serialize)]
enum Command {
    Stop,
    Move(i32),
    Pair(u8, bool),
    Rename { from: String },
}

#[test]
fn enum_variants_match_the_documented_encoding() {
    let mut stop = vec![0x0C];
    str_(&mut stop, "Stop");
    assert_eq!(payload_digest(&Command::Stop).unwrap().as_u128(), xxh3_128(&stop));

    let mut mv = vec![0x0D];
    str_(&mut mv, "Move");
    int(&mut mv, -3);
    assert_eq!(payload_digest(&Command::Move(-3)).unwrap().as_u128(), xxh3_128(&mv));

    let mut pair = vec![0x0F];
    str_(&mut pair, "Pair");
    pair.push(0x0E);
    int(&mut pair, 9);
    pair.extend_from_slice(&[0x01, 0x01, 0xFF]);
    assert_eq!(payload_digest(&Command::Pair(9, true)).unwrap().as_u128(), xxh3_128(&pair));

    let long = "n".repeat(130);
    let mut rename = vec![0x12];
    str_(&mut rename, "Rename");
    string(&mut rename, "from");
    string(&mut rename, &long);
    rename.push(0xFF);
    let digest = payload_digest(&Command::Rename { from: long }).unwrap();
    assert_eq!(digest.as_u128(), xxh3_128(&rename));
}

/// A struct whose field name is longer than 127 bytes (two length bytes).
struct LongField(u8);

impl Serialize for LongField {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeStruct;
        const NAME: &str = "a_field_name_that_is_longer_than_one_hundred_and_twenty_seven_bytes_\
                            so_that_its_length_takes_two_leb128_bytes_in_the_key_encoding";
        let mut st = s.serialize_struct("LongField", 1)?;
        st.serialize_field(NAME, &self.0)?;
        st.end()
    }
}

#[test]
fn long_field_names_take_a_multi_byte_length() {
    let name = "a_field_name_that_is_longer_than_one_hundred_and_twenty_seven_bytes_\
                so_that_its_length_takes_two_leb128_bytes_in_the_key_encoding";
    assert!(name.len() > 127);
    let mut bytes = vec![0x11];
    string(&mut bytes, name);
    int(&mut bytes, 5);
    bytes.push(0xFF);
    assert_eq!(payload_digest(&LongField(5)).unwrap().as_u128(), xxh3_128(&bytes));
}

#[test]
fn key_matches_the_documented_framing() {
    // encoding((42u64,)) = seq start, int 42, seq end.
    let mut payload = vec![0x0E];
    int(&mut payload, 42);
    payload.push(0xFF);

    // A run step names the request: the key commits to it alone.
    let scope = KeyScope::durable("run-1", 3);
    let mut scope_bytes = vec![0x01];
    str_(&mut scope_bytes, "run-1");
    scope_bytes.extend_from_slice(&3u64.to_le_bytes());
    let expected = xxh3_128(&key_bytes("agent-a", "send_welcome", &scope_bytes, &[]));
    let key = IdempotencyKey::derive("agent-a", "send_welcome", &(42u64,), &scope, 0).unwrap();
    assert_eq!(key.as_u128(), expected);
    let other = IdempotencyKey::derive("agent-a", "send_welcome", &(43u64,), &scope, 0).unwrap();
    assert_eq!(other, key, "the same step with other arguments has the same key");

    let bucket = KeyScope::TimeBucket(Duration::from_secs(300));
    let mut bucket_bytes = vec![0x00];
    bucket_bytes.extend_from_slice(&300_000u64.to_le_bytes());
    bucket_bytes.extend_from_slice(&(1_700_000_123_456u64 / 300_000).to_le_bytes());
    let expected = xxh3_128(&key_bytes("agent-a", "send_welcome", &bucket_bytes, &payload));
    let key =
        IdempotencyKey::derive("agent-a", "send_welcome", &(42u64,), &bucket, 1_700_000_123_456)
            .unwrap();
    assert_eq!(key.as_u128(), expected);

    // A session window: 0x05 ‖ str(session) ‖ the bucket ‖ the payload.
    let window = KeyScope::window("mcp-s1", Duration::from_secs(300));
    let mut window_bytes = vec![0x05];
    str_(&mut window_bytes, "mcp-s1");
    window_bytes.extend_from_slice(&bucket_bytes);
    let expected = xxh3_128(&key_bytes("agent-a", "send_welcome", &window_bytes, &payload));
    let key =
        IdempotencyKey::derive("agent-a", "send_welcome", &(42u64,), &window, 1_700_000_123_456)
            .unwrap();
    assert_eq!(key.as_u128(), expected);

    // An LLM provider's tool-call id: 0x03 ‖ str(id), without the payload.
    let call = KeyScope::tool_call("call_9xq2");
    let mut call_bytes = vec![0x03];
    str_(&mut call_bytes, "call_9xq2");
    let expected = xxh3_128(&key_bytes("agent-a", "send_welcome", &call_bytes, &[]));
    let key = IdempotencyKey::derive("agent-a", "send_welcome", &(42u64,), &call, 0).unwrap();
    assert_eq!(key.as_u128(), expected);

    // A declared effect identity: 0x04 ‖ encoding(identity), whatever the scope.
    let effect = Effect { identity: &(42u64,), args: &(42u64, "hello") };
    let expected = xxh3_128(&key_bytes("agent-a", "send_welcome", &[0x04], &payload));
    for scope in [&call, &bucket, &window, &KeyScope::durable("run-2", 9)] {
        let key = IdempotencyKey::derive("agent-a", "send_welcome", &effect, scope, 7).unwrap();
        assert_eq!(key.as_u128(), expected, "{scope:?}");
    }

    // A payload longer than the hasher's stack window takes the streaming path.
    let long = "x".repeat(1000);
    let mut long_payload = vec![0x0E];
    string(&mut long_payload, &long);
    long_payload.push(0xFF);
    let expected = xxh3_128(&key_bytes("agent-a", "send_welcome", &bucket_bytes, &long_payload));
    let key =
        IdempotencyKey::derive("agent-a", "send_welcome", &(&long,), &bucket, 1_700_000_123_456)
            .unwrap();
    assert_eq!(key.as_u128(), expected);

    // Agent, action and run longer than 127 bytes: two-byte lengths.
    let (agent, action, run) = ("a".repeat(128), "b".repeat(200), "r".repeat(300));
    let scope = KeyScope::durable(run.as_str(), u64::MAX);
    let mut scope_bytes = vec![0x01];
    str_(&mut scope_bytes, &run);
    scope_bytes.extend_from_slice(&u64::MAX.to_le_bytes());
    let expected = xxh3_128(&key_bytes(&agent, &action, &scope_bytes, &[]));
    let key = IdempotencyKey::derive(&agent, &action, &(42u64,), &scope, 0).unwrap();
    assert_eq!(key.as_u128(), expected);
}

/// Pinned values. If one of these changes, every key already sent to a
/// server or stored in a ledger changes meaning: bump the format version
/// ("vtk2") instead of editing the value.
#[test]
fn golden_vectors() {
    let durable = KeyScope::durable("run-1", 3);
    let bucket = KeyScope::TimeBucket(Duration::from_secs(300));
    let invoice = Invoice { invoice_id: 7, amount_cents: -1250, currency: "EUR", memo: Some("q3") };
    let map: BTreeMap<&str, Vec<u8>> = [("b", vec![2, 3]), ("a", vec![1])].into();
    let long = "z".repeat(300);
    let derive = |agent: &str, action: &str, payload: &dyn erased::Payload, scope: &KeyScope| {
        payload.derive(agent, action, scope, 1_700_000_123_456).to_string()
    };
    let window = KeyScope::window("mcp-session-1", Duration::from_secs(300));
    let effect = Effect { identity: &(42u64,), args: &(42u64, 2500u64) };
    // The payload encodings through a bucket (its key commits to the
    // payload); each request identity, and an effect identity, once.
    let actual = [
        derive("agent-a", "send_welcome", &(42u64,), &durable),
        derive("agent-a", "send_welcome", &(42u64,), &bucket),
        derive("agent-a", "record_invoice", &invoice, &bucket),
        derive("", "", &(), &bucket),
        derive("agent-a", "x", &("ab", "c"), &bucket),
        derive("agent-a", "tag", &map, &bucket),
        derive("agent-a", "note", &(long.as_str(), 1.5f64, 'é'), &bucket),
        derive("agent-a", "command", &Command::Rename { from: "old".into() }, &bucket),
        derive("agent-a", "send_welcome", &(42u64,), &KeyScope::tool_call("toolu_01A")),
        derive("agent-a", "send_welcome", &(42u64,), &window),
        derive("agent-a", "charge", &effect, &KeyScope::tool_call("toolu_01A")),
    ];
    if std::env::var_os("VT_PRINT_GOLDEN").is_some() {
        println!("{actual:#?}");
    }
    assert_eq!(actual, GOLDEN);
}

/// `derive` for payloads of different types in one array.
mod erased {
    use verified_tools::{IdempotencyKey, KeyScope};

    pub trait Payload {
        fn derive(&self, agent: &str, action: &str, scope: &KeyScope, ms: u64) -> IdempotencyKey;
    }

    impl<T: verified_tools::key::Payload> Payload for T {
        fn derive(&self, agent: &str, action: &str, scope: &KeyScope, ms: u64) -> IdempotencyKey {
            IdempotencyKey::derive(agent, action, self, scope, ms).unwrap()
        }
    }
}

const GOLDEN: [&str; 11] = [
    "ff7cbce4b5541c17836f22602f6d4d94",
    "da248053afa43a8349079e330c2bad35",
    "fa870fc4f12178953dc7bea3c2192238",
    "6ad96f78c4e485ccf6aa58ebcfa32f75",
    "ac11ebb798672d8807285fe73f329d4a",
    "4a8d9f2f423e90307e9133a619e16bf7",
    "cbe048be1c0c312da75540ed37467c66",
    "7803a1dc0074c8688053b6f711f40271",
    "d82b78fc737d127f99cb5939f9a6010c",
    "3899341bcf48976ae9fd74d617485f13",
    "4b620f86319caf2c330e7cf7710a7462",
];

/// The default scope decides every macro tool's keys: it must not drift.
#[test]
fn default_scope_is_pinned() {
    assert_eq!(KeyScope::DEFAULT, KeyScope::TimeBucket(Duration::from_secs(300)));
}

#[test]
fn framing_separates_adjacent_strings() {
    let scope = KeyScope::TimeBucket(Duration::from_secs(60));
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
