//! Key derivation cost (issue 5, item 2).
//!
//! Our streaming `payload_digest` (a serde Serializer writing straight into
//! xxh3-128) against the naive ways: `serde_json::to_vec` + `xxh3_128`, and
//! SHA-256 of the same JSON. Three argument sets: small (5 fields), medium (a
//! Vec of 100 small items), large (1 MiB of bytes), the large one both through
//! serde's bytes path (a newtype calling `serialize_bytes`, as `serde_bytes`
//! does) and as a plain `Vec<u8>` (a seq of 1 Mi `u8`s, to show that cost);
//! plus raw `xxh3_128` over the same 1 MiB, the floor.
//!
//! Throughput: for small and medium the byte count is the length of the
//! payload's JSON (the same for every method, so the bytes/s compare); for the
//! large payloads it is the 1 MiB of payload bytes.

use std::hint::black_box;
use std::time::Duration;

use criterion::{
    BenchmarkGroup, Criterion, Throughput, criterion_group, criterion_main, measurement::WallTime,
};
use serde::{Serialize, Serializer};
use sha2::{Digest, Sha256};
use verified_tools::key::payload_digest;
use xxhash_rust::xxh3::xxh3_128;

/// Small: ids, a short string, an amount, a bool.
#[derive(Serialize)]
struct Small {
    user: u64,
    order: u64,
    note: String,
    amount_cents: i64,
    express: bool,
}

#[derive(Serialize)]
struct Item {
    sku: u32,
    qty: u16,
    price_cents: i64,
}

/// Medium: a struct with a Vec of 100 small items.
#[derive(Serialize)]
struct Medium {
    order: u64,
    items: Vec<Item>,
}

/// A byte payload that goes through serde's bytes path (like `serde_bytes`).
struct Bytes(Vec<u8>);

impl Serialize for Bytes {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_bytes(&self.0)
    }
}

const MIB: usize = 1 << 20;

fn small() -> Small {
    Small {
        user: 42,
        order: 1_000_017,
        note: "leave at door".into(),
        amount_cents: 12_999,
        express: true,
    }
}

fn medium() -> Medium {
    let items = (0..100)
        .map(|i| Item { sku: 10_000 + i, qty: (i % 7) as u16 + 1, price_cents: 199 * i64::from(i) })
        .collect();
    Medium { order: 1_000_017, items }
}

fn large_bytes() -> Vec<u8> {
    // Deterministic, not all zeros.
    (0..MIB).map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8).collect()
}

/// The three key-derivation methods over one payload.
fn methods<P: Serialize>(g: &mut BenchmarkGroup<'_, WallTime>, payload: &P) {
    g.bench_function("streaming", |b| b.iter(|| payload_digest(black_box(payload)).unwrap()));
    g.bench_function("json_xxh3", |b| {
        b.iter(|| xxh3_128(&serde_json::to_vec(black_box(payload)).unwrap()))
    });
    g.bench_function("json_sha256", |b| {
        b.iter(|| Sha256::digest(serde_json::to_vec(black_box(payload)).unwrap()))
    });
}

fn json_len<P: Serialize>(payload: &P) -> u64 {
    serde_json::to_vec(payload).unwrap().len() as u64
}

fn keys(c: &mut Criterion) {
    let payload = small();
    let mut g = c.benchmark_group("keys/small");
    g.throughput(Throughput::Bytes(json_len(&payload)));
    methods(&mut g, &payload);
    g.finish();

    let payload = medium();
    let mut g = c.benchmark_group("keys/medium");
    g.throughput(Throughput::Bytes(json_len(&payload)));
    methods(&mut g, &payload);
    g.finish();

    let bytes = large_bytes();
    let mut g = c.benchmark_group("keys/large_1MiB");
    g.throughput(Throughput::Bytes(MIB as u64));
    g.bench_function("raw_xxh3", |b| b.iter(|| xxh3_128(black_box(&bytes))));
    let payload = Bytes(bytes);
    methods(&mut g, &payload);
    g.finish();

    // A plain Vec<u8> is a seq of u8 in serde: one tagged integer per byte.
    // Slow by nature, so fewer samples.
    let payload = payload.0;
    let mut g = c.benchmark_group("keys/large_1MiB_vec_u8");
    g.throughput(Throughput::Bytes(MIB as u64));
    g.sample_size(10);
    methods(&mut g, &payload);
    g.finish();
}

criterion_group! {
    name = benches;
    config = Criterion::default()
        .sample_size(30)
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(3));
    targets = keys
}
criterion_main!(benches);
