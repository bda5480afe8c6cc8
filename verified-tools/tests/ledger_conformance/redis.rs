//! The Redis ledger against a real server: the suite on the run's shared
//! server (each test in a namespace of its own, through two connections: two
//! processes), plus what only a store across the network has (an outage).

use std::io;
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use verified_tools::ledger::{Claimed, Codec, End, Ledger, LedgerError, RedisLedger, Replay};
use verified_tools::{
    CallError, Context, Proof, SideEffect, ToolResult, ToolSpec, Verdict, engine,
};

use crate::suite::{self, Backend, Config};
use crate::support::redis::RedisServer;

/// How long a claim may take to fail while Redis is down: the ledger bounds
/// an operation by twice its one-second timeout.
const FAILS_WITHIN: Duration = Duration::from_secs(4);

struct Redis {
    server: RedisServer,
}

impl Backend for Redis {
    async fn open(&self, config: Config) -> (Arc<dyn Ledger>, Arc<dyn Ledger>) {
        let prefix = unique_prefix();
        let open = || async {
            let ledger = RedisLedger::connect(&self.server.url).await.expect("redis answers");
            let ledger = ledger.with_prefix(&prefix).with_lease(config.lease).with_ttl(config.ttl);
            Arc::new(ledger) as Arc<dyn Ledger>
        };
        (open().await, open().await)
    }
}

crate::conformance!(
    RedisServer::shared().map(|server| Redis { server }),
    paused = false,
    operator = true
);

/// A namespace no other test (nor an earlier run on the same server) uses.
pub fn unique_prefix() -> String {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    let n = NEXT.fetch_add(1, Ordering::Relaxed);
    format!("vt-test:{}:{nanos}:{n}:", std::process::id())
}

fn value(n: u32) -> impl verified_tools::ledger::Recorded {
    struct Json(u32);
    impl verified_tools::ledger::Recorded for Json {
        fn local(&self) -> Arc<dyn std::any::Any + Send + Sync> {
            Arc::new(self.0)
        }
        fn encode(&self) -> Option<Vec<u8>> {
            serde_json::to_vec(&self.0).ok()
        }
    }
    Json(n)
}

#[tokio::test]
async fn an_outage_fails_claims_fast_and_the_aof_keeps_the_records() {
    let Some(mut server) = RedisServer::private() else { return };
    let ledger = RedisLedger::connect(&server.url).await.expect("redis answers");
    let ledger = ledger.with_prefix(unique_prefix());
    let k = suite::key(1);
    let Claimed::Fresh(fence) = ledger.claim(suite::request(k, suite::fp(1))).await.unwrap().state
    else {
        panic!("a fresh key")
    };
    ledger.finish(k, fence, End::Completed(&value(41))).await.unwrap();

    server.stop();
    // Twice: once on the connection found broken, once reconnecting.
    for _ in 0..2 {
        let started = Instant::now();
        let claim = ledger.claim(suite::request(k, suite::fp(1))).await;
        assert!(matches!(claim, Err(LedgerError::Unavailable(_))), "{claim:?}");
        assert!(started.elapsed() < FAILS_WITHIN, "failed after {:?}", started.elapsed());
    }
    // A write-through of a holder fails too, rather than hang.
    let progress = suite::first(verified_tools::ledger::Settle::NOW);
    let write = ledger.dispatching(k, fence, progress).await;
    assert!(matches!(write, Err(LedgerError::Unavailable(_))), "{write:?}");

    server.restart();
    // The same handle reconnects by itself; the record came back from the
    // AOF, and replays.
    match ledger.claim(suite::request(k, suite::fp(1))).await.expect("redis is back").state {
        Claimed::Completed(Replay::Encoded(bytes)) => assert_eq!(bytes, b"41"),
        other => panic!("the completed record survives the restart, got {other:?}"),
    }
    // And the fence counter did too: fences still grow.
    let Claimed::Fresh(next) =
        ledger.claim(suite::request(suite::key(2), suite::fp(2))).await.unwrap().state
    else {
        panic!("a fresh key")
    };
    assert!(next > fence, "fence {next} after {fence}");
}

#[tokio::test]
async fn a_record_in_doubt_survives_a_crash_and_is_taken_over() {
    let Some(mut server) = RedisServer::private() else { return };
    let lease = Duration::from_millis(300);
    let ledger = RedisLedger::connect(&server.url).await.expect("redis answers");
    let ledger = ledger.with_prefix(unique_prefix()).with_lease(lease);
    let k = suite::key(3);
    // A holder dispatches, and Redis is killed under it.
    let Claimed::Fresh(old) = ledger.claim(suite::request(k, suite::fp(3))).await.unwrap().state
    else {
        panic!("a fresh key")
    };
    server.stop();
    tokio::time::sleep(lease).await;
    server.restart();
    let (new, progress) = match ledger.claim(suite::request(k, suite::fp(3))).await.unwrap().state {
        Claimed::Resume(new, progress) => (new, progress),
        other => panic!("a hold past its lease is resumed in doubt, got {other:?}"),
    };
    assert!(new > old);
    assert_eq!(progress.attempts, 1, "the first attempt was written with the claim");
    let end = ledger.finish(k, old, End::Settled).await;
    assert_eq!(end, Err(LedgerError::Fenced(old)), "the old holder is fenced");
}

#[tokio::test]
async fn a_settled_record_taken_over_loses_its_expiry() {
    // A settled record expires after the TTL; once a call resumes it, it is
    // held, then in doubt: it must not expire any more.
    let Some(server) = RedisServer::shared() else { return };
    // Long enough that the resume below comes before it on a loaded machine;
    // the check after it only gains from waiting longer.
    let ttl = Duration::from_secs(2);
    let ledger = RedisLedger::connect(&server.url).await.expect("redis answers");
    let ledger = ledger.with_prefix(unique_prefix()).with_ttl(ttl);
    let k = suite::key(4);
    let Claimed::Fresh(fence) = ledger.claim(suite::request(k, suite::fp(4))).await.unwrap().state
    else {
        panic!("a fresh key")
    };
    ledger.finish(k, fence, End::Settled).await.unwrap();
    let Claimed::Resume(fence, _) =
        ledger.claim(suite::request(k, suite::fp(4))).await.unwrap().state
    else {
        panic!("a settled key is resumed")
    };
    ledger.finish(k, fence, End::InDoubt).await.unwrap();
    tokio::time::sleep(ttl + Duration::from_secs(1)).await;
    match ledger.claim(suite::request(k, suite::fp(4))).await.unwrap().state {
        Claimed::Resume(_, progress) => assert_eq!(progress.attempts, 1),
        other => panic!("the record in doubt is still there, got {other:?}"),
    }
}

#[tokio::test]
async fn records_of_the_earlier_field_layout_are_still_read() {
    // Records in doubt never expire, so a ledger upgraded in place meets
    // records written before the claim's token and its kind shared one field
    // (`c` and `w`).
    let Some(server) = RedisServer::shared() else { return };
    let prefix = unique_prefix();
    let ledger = RedisLedger::connect(&server.url).await.expect("redis answers");
    let ledger = ledger.with_prefix(&prefix);
    let client = redis::Client::open(server.url.as_str()).expect("a Redis URL");
    let mut conn = client.get_multiplexed_async_connection().await.expect("redis answers");
    let far = (i64::MAX / 4).to_string();
    let cases: [(u64, &[&str]); 3] = [
        (30, &["s", "d", "n", "3", "l", "1", "a", "2", "o", "1", "c", "7", "w", "f"]),
        (31, &["s", "h", "n", "4", "l", &far, "a", "1", "o", "0", "c", "8", "w", "f"]),
        (32, &["s", "c", "n", "5", "l", "1", "a", "1", "o", "0", "c", "9", "w", "r", "v", "41"]),
    ];
    for (n, fields) in cases {
        let (k, fp) = (suite::key(n), suite::fp(u128::from(n)));
        let mut hset = redis::cmd("HSET");
        hset.arg(format!("{prefix}k:{}", k.to_hex()))
            .arg("f")
            .arg(format!("{:032x}", fp.as_u128()));
        for field in fields {
            hset.arg(*field);
        }
        let _: i64 = hset.query_async(&mut conn).await.expect("redis answers");
    }
    let claim = |n: u64| ledger.claim(suite::request(suite::key(n), suite::fp(u128::from(n))));
    match claim(30).await.expect("redis answers").state {
        Claimed::Resume(_, progress) => {
            assert_eq!((progress.attempts, progress.after_ok), (2, true), "{progress:?}")
        }
        other => panic!("an old record in doubt is taken over, got {other:?}"),
    }
    // Another process's live hold is not mistaken for this claim's own.
    assert!(matches!(claim(31).await.expect("redis answers").state, Claimed::InFlight(_)));
    match claim(32).await.expect("redis answers").state {
        Claimed::Completed(Replay::Encoded(value)) => assert_eq!(value, b"41"),
        other => panic!("an old completed record replays, got {other:?}"),
    }
}

static SEND: ToolSpec = ToolSpec::new("send_invoice", SideEffect::High).with_verifier();

#[tokio::test]
async fn the_engine_refuses_calls_while_redis_is_down() {
    let Some(mut server) = RedisServer::private() else { return };
    let ledger = RedisLedger::connect(&server.url).await.expect("redis answers");
    let cx = Context::new("agent").with_ledger(Arc::new(ledger.with_prefix(unique_prefix())));
    let invoices = suite::Invoices::default();
    let call = |invoice: u64| invoices.send(&cx, invoice);
    // With Redis up, a call runs once and is then replayed from the ledger.
    assert!(matches!(call(1).await, ToolResult::Success { value: 1, .. }));
    assert!(matches!(call(1).await, ToolResult::Success { value: 1, .. }));
    assert_eq!(invoices.dispatched(), 1);

    server.stop();
    let started = Instant::now();
    match call(2).await {
        ToolResult::Refused(CallError::Ledger { source: LedgerError::Unavailable(_), .. }) => {}
        other => panic!("a call is refused while the ledger is down, got {other:?}"),
    }
    assert!(started.elapsed() < FAILS_WITHIN, "refused after {:?}", started.elapsed());
    assert_eq!(invoices.dispatched(), 1, "nothing was dispatched");

    server.restart();
    assert!(matches!(call(2).await, ToolResult::Success { value: 2, .. }));
    assert_eq!(invoices.dispatched(), 2);
}

// ---------------------------------------------------------------- restarts

/// A server whose restarts answer `LOADING` for about 1.5 s (1 500 keys in
/// the AOF's base, 1 ms each), as one with a large data set does.
fn slow_to_load() -> Option<RedisServer> {
    let server = RedisServer::private()?;
    server.fill(1_500);
    Some(server)
}

const LOAD_SLOWLY: [&str; 2] = ["--key-load-delay", "1000"];

/// Long enough to ride over a restart that loads for 1.5 s on a loaded
/// machine.
const RIDE_OVER: Duration = Duration::from_secs(20);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_claim_rides_over_a_restart_refused_then_loading() {
    let Some(mut server) = slow_to_load() else { return };
    let ledger = RedisLedger::connect(&server.url).await.expect("redis answers");
    let ledger = Arc::new(ledger.with_prefix(unique_prefix()).with_retry_for(RIDE_OVER));
    let k = suite::key(20);
    server.stop();
    let claiming = {
        let ledger = Arc::clone(&ledger);
        tokio::spawn(async move { ledger.claim(suite::request(k, suite::fp(20))).await })
    };
    // The claim meets a refused connection first, then `LOADING`.
    tokio::time::sleep(Duration::from_millis(300)).await;
    server.restart_with(&LOAD_SLOWLY);
    let started = Instant::now();
    let loading = loop {
        let answer = server.try_command("PING").unwrap_or_default();
        if answer.starts_with("-LOADING") || started.elapsed() > Duration::from_secs(5) {
            break answer;
        }
        std::thread::sleep(Duration::from_millis(10));
    };
    assert!(loading.starts_with("-LOADING"), "the restarted server loads: {loading}");
    match claiming.await.expect("no panic") {
        Ok(claim) => assert!(matches!(claim.state, Claimed::Fresh(_)), "{claim:?}"),
        Err(error) => panic!("the claim did not ride over the restart: {error}"),
    }
}

#[tokio::test]
async fn a_call_rides_over_a_restart_mid_call() {
    let Some(server) = slow_to_load() else { return };
    let ledger = RedisLedger::connect(&server.url).await.expect("redis answers");
    let ledger = ledger.with_prefix(unique_prefix()).with_retry_for(RIDE_OVER);
    let cx = Context::new("agent")
        .with_ledger(Arc::new(ledger))
        .with_in_flight(verified_tools::InFlight::Return);
    let server = std::sync::Mutex::new(server);
    let dispatched = AtomicU32::new(0);
    let call = || {
        engine::call(
            &cx,
            &SEND,
            &(7u64,),
            &(7u64,),
            |_attempt| {
                // Redis crashes while the attempt is out, and comes back
                // loading: the call's finish meets it refused, then loading.
                if dispatched.fetch_add(1, Ordering::SeqCst) == 0 {
                    let mut server = server.lock().unwrap();
                    server.stop();
                    server.restart_with(&LOAD_SLOWLY);
                }
                async { Ok::<u64, io::Error>(7) }
            },
            // The postcondition: the payment was sent (a high tool reads
            // its OK answer back, through the restart too).
            Some(|_key| async {
                match dispatched.load(Ordering::SeqCst) {
                    0 => Verdict::Absent,
                    _ => Verdict::Holds(7),
                }
            }),
            Codec::serde(),
        )
    };
    let first = call().await;
    assert!(
        matches!(first, ToolResult::Success { value: 7, proof: Proof::Verifier, .. }),
        "{first:?}"
    );
    // The finish landed: a repeat replays, nothing is sent again.
    let again = call().await;
    assert!(
        matches!(again, ToolResult::Success { value: 7, proof: Proof::Ledger, .. }),
        "{again:?}"
    );
    assert_eq!(dispatched.load(Ordering::SeqCst), 1);
}
