//! The in-memory ledger: on paused time, plus what only it has (a cap).

use std::sync::Arc;

use verified_tools::ledger::{Claimed, End, Ledger, LedgerError, MemoryLedger};

use crate::suite::{self, Backend, Config};

struct Memory;

impl Backend for Memory {
    async fn open(&self, config: Config) -> (Arc<dyn Ledger>, Arc<dyn Ledger>) {
        let ledger: Arc<dyn Ledger> =
            Arc::new(MemoryLedger::new().with_lease(config.lease).with_ttl(config.ttl));
        (Arc::clone(&ledger), ledger)
    }
}

crate::conformance!(Some(Memory), paused = true, operator = true);

/// Keys of one shard (the shard is picked by the high 64 bits).
fn same_shard(n: u64) -> verified_tools::IdempotencyKey {
    verified_tools::IdempotencyKey::from_u128((7u128 << 64) | u128::from(n) << 6)
}

#[tokio::test(start_paused = true)]
async fn the_cap_evicts_the_oldest_finished_record_never_a_held_one() {
    // 64 shards: a cap of 128 is 2 records per shard.
    let ledger = MemoryLedger::new().with_capacity(128);
    assert_eq!(ledger.capacity(), 128);
    let claim = |n| ledger.claim(suite::request(same_shard(n), suite::fp(1)));
    // Two completed records fill the shard; a third call evicts the oldest.
    for n in 0..2 {
        let Claimed::Fresh(fence) = claim(n).await.unwrap().state else { panic!() };
        ledger.finish(same_shard(n), fence, End::Settled).await.unwrap();
    }
    let Claimed::Fresh(third) = claim(2).await.unwrap().state else { panic!("evicts one") };
    assert!(matches!(claim(0).await.unwrap().state, Claimed::Fresh(_)), "the oldest went first");
    // Now the shard holds two keys that are held: nothing may be evicted.
    assert!(matches!(claim(1).await, Err(LedgerError::Full(128))), "{:?}", claim(1).await);
    ledger.finish(same_shard(2), third, End::InDoubt).await.unwrap();
    // Doubt has its own bound, not the record cap: a new key still goes.
    assert!(matches!(claim(3).await.unwrap().state, Claimed::Fresh(_)), "doubt is bounded apart");
}
