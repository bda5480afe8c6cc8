//! The memory ledger's own invariants, step by step.

use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use super::shard::{Bounds, Entry, Shard, State};
use super::tombs::Tomb;
use super::{COMPACTED_DOUBT, COMPLETED, MemoryLedger, SHARDS, STALE_SLACK};
use crate::ledger::{ClaimRequest, Claimed, End, Fence, Ledger, Progress, Replay, Settle};
use crate::{IdempotencyKey, PayloadDigest};

/// Key `n` of shard 7 (the shard is picked by the high 64 bits).
fn key(n: u64) -> IdempotencyKey {
    IdempotencyKey::from_u128((7u128 << 64) | u128::from(n + 1))
}

fn request(key: IdempotencyKey, now: Instant) -> ClaimRequest {
    let first = Progress { attempts: 1, after_ok: false, settle: Settle::NOW };
    ClaimRequest { key, fingerprint: PayloadDigest::from_u128(1), previous: None, first, now }
}

struct Value;

impl super::super::Recorded for Value {
    fn local(&self) -> Arc<dyn std::any::Any + Send + Sync> {
        Arc::new(())
    }

    fn encode(&self) -> Option<Vec<u8>> {
        None
    }
}

/// What every operation must leave true of a shard.
fn check(shard: &Shard, bounds: Bounds) {
    let in_doubt = shard.map.values().filter(|e| matches!(e.state, State::InDoubt { .. }));
    assert_eq!(shard.doubts, in_doubt.count(), "the doubt count is the map's");
    assert!(shard.doubts <= bounds.doubt, "records in doubt past their bound");
    let held = shard.map.values().filter(|e| matches!(e.state, State::Held { .. })).count();
    assert!(shard.live() <= bounds.records.max(held), "records past the cap, not all held");
    // A resume leaves a stale entry; a push compacts the queue past twice
    // the live ones, so its length is bounded by the bound's.
    assert!(shard.doubt.len() <= 2 * (bounds.doubt + 1) + STALE_SLACK, "stale entries pile up");
    let tombs = &shard.tombs;
    assert!(tombs.map.len() <= bounds.tombs, "tombstones past their bound");
    let doubt_tombs = tombs.map.values().filter(|t| t.stamp != COMPLETED).count();
    assert_eq!(tombs.doubts, doubt_tombs, "the doubt tombstone count is the map's");
    assert_eq!(
        tombs.done.len(),
        tombs.map.len() - tombs.doubts,
        "one queue entry per completed tombstone"
    );
    assert!(tombs.doubt.len() <= 2 * bounds.tombs + STALE_SLACK, "stale entries pile up");
    for (&k, tomb) in &tombs.map {
        assert!(!shard.map.keys().any(|&r| r as u64 == k), "a key both recorded and buried");
        if tomb.stamp != COMPLETED {
            assert!(tombs.doubt.contains(&(tomb.stamp, k)), "a doubt tombstone out of its queue");
        }
    }
    for (&k, entry) in &shard.map {
        if let State::InDoubt { stamp } = entry.state {
            assert!(shard.doubt.contains(&(stamp, k)), "a record in doubt out of its queue");
        }
    }
}

#[tokio::test(start_paused = true)]
async fn every_operation_keeps_the_counts_queues_and_bounds_of_its_shard() {
    // 2 records, 2 in doubt and 5 tombstones per shard; 12 keys of one
    // shard, driven at random (a fixed seed) through every transition.
    let ledger = MemoryLedger::new()
        .with_capacity(2 * SHARDS)
        .with_doubt_capacity(2 * SHARDS)
        .with_tombstones(5 * SHARDS)
        .with_ttl(Duration::from_secs(50))
        .with_lease(Duration::from_secs(20));
    let bounds = ledger.bounds();
    let mut held: Vec<(IdempotencyKey, Fence)> = Vec::new();
    let (mut unrecorded, mut compacted) = (0, 0);
    let mut seed = 0x2545_f491_4f6c_dd1d_u64;
    let mut next = |n: u64| {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        seed % n
    };
    for _ in 0..20_000 {
        match next(10) {
            0..=3 => {
                let k = key(next(12));
                let state = ledger.claim(request(k, Instant::now())).await.map(|c| c.state);
                unrecorded +=
                    u32::from(matches!(state, Ok(Claimed::Completed(Replay::Unrecorded))));
                compacted += u32::from(matches!(state, Ok(Claimed::Resume(_, COMPACTED_DOUBT))));
                if let Ok(Claimed::Fresh(f) | Claimed::Resume(f, _)) = state {
                    held.retain(|(h, _)| *h != k);
                    held.push((k, f));
                }
            }
            4..=8 if !held.is_empty() => {
                let (k, f) = held.swap_remove(next(held.len() as u64) as usize);
                let end = match next(4) {
                    0 => End::Completed(&Value),
                    1 => End::Settled,
                    2 => End::InDoubt,
                    _ => {
                        ledger.abandon(k, f);
                        check(&ledger.shard(k), bounds);
                        continue;
                    }
                };
                // Every hold in `held` is its key's current one.
                ledger.finish(k, f, end).await.expect("the hold is ours");
            }
            _ => tokio::time::advance(Duration::from_secs(next(10))).await,
        }
        check(&ledger.shard(key(0)), bounds);
    }
    // The walk went through every path: both kinds of tombstone
    // answered a claim, and the hard bound was reached.
    assert!(unrecorded > 0 && compacted > 0 && ledger.forgotten() > 0);
}

#[test]
fn a_tombstone_is_small() {
    // What the docs' memory figures are made of.
    assert_eq!(std::mem::size_of::<(u64, Tomb)>(), 24);
    assert_eq!(std::mem::size_of::<(Instant, u64)>(), 24);
    assert_eq!(std::mem::size_of::<(u64, u64)>(), 16);
    println!("record: {} bytes + its queue entries", std::mem::size_of::<(u128, Entry)>());
}
