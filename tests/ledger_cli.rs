//! The operator's command (`examples/ledger.rs`, whose logic is
//! `verified_tools_suite::ops`) against ledgers the engine wrote: a call
//! that ended in doubt is listed, resolved by a person's decision, and what
//! a repeat of the call then does.
//!
//! The SQLite tests need the feature `sqlite` and the Redis one `redis`
//! (`cargo test --test ledger_cli --features sqlite,redis`); without them,
//! what is left checks that the command names the feature it misses.

use std::path::{Path, PathBuf};

use verified_tools_suite::ops::{self, Command, OpsError, Options, Store};

#[cfg(feature = "redis")]
use test_support as support;

/// A fresh path in the temp directory; the file and its WAL are deleted when
/// dropped.
#[cfg_attr(not(any(feature = "sqlite", feature = "redis")), allow(dead_code))]
struct TempPath(PathBuf);

#[cfg_attr(not(any(feature = "sqlite", feature = "redis")), allow(dead_code))]
impl TempPath {
    fn new(tag: &str) -> Self {
        use std::sync::atomic::{AtomicU32, Ordering};
        static N: AtomicU32 = AtomicU32::new(0);
        let n = N.fetch_add(1, Ordering::Relaxed);
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.subsec_nanos());
        let name = format!("vt-ledger-cli-{tag}-{}-{n}-{nanos}", std::process::id());
        Self(std::env::temp_dir().join(name))
    }

    fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for TempPath {
    fn drop(&mut self) {
        for suffix in ["", "-wal", "-shm"] {
            let mut path = self.0.clone().into_os_string();
            path.push(suffix);
            let _ = std::fs::remove_file(path);
        }
    }
}

/// Runs one command; answers what it printed.
fn run(options: &Options, command: Command) -> Result<String, OpsError> {
    let mut out = Vec::new();
    ops::run(options, &command, &mut out)?;
    Ok(String::from_utf8(out).expect("the output is UTF-8"))
}

#[cfg_attr(not(any(feature = "sqlite", feature = "redis")), allow(dead_code))]
fn json_lines(text: &str) -> Vec<serde_json::Value> {
    text.lines().map(|line| serde_json::from_str(line).expect("a JSON line")).collect()
}

#[test]
fn a_ledger_is_named_sqlite_path_or_a_redis_url_and_nothing_else() {
    assert_eq!("sqlite:/tmp/l.db".parse::<Store>().ok(), Some(Store::Sqlite("/tmp/l.db".into())));
    let url = "redis://127.0.0.1:6379/";
    assert_eq!(url.parse::<Store>().ok(), Some(Store::Redis(url.into())));
    for bad in ["memory", "sqlite:", "/tmp/l.db", "postgres://db/"] {
        let error = bad.parse::<Store>().expect_err(bad).to_string();
        assert!(error.contains("expected sqlite:PATH or redis://HOST:PORT/"), "{error}");
    }
    let memory = "memory".parse::<Store>().expect_err("memory").to_string();
    assert!(memory.contains("in-memory ledger lives in its process"), "{memory}");
}

#[test]
fn a_key_that_is_not_32_lowercase_hex_digits_is_a_clear_error() {
    // What the command line parses KEY with.
    let upper = "0123456789ABCDEF0123456789ABCDEF";
    for bad in ["", "xyz", "0123", upper, "0123456789abcdef0123456789abcdef0"] {
        let error = bad.parse::<verified_tools::IdempotencyKey>().expect_err(bad).to_string();
        assert!(error.contains("32 lowercase hex digits"), "{error}");
    }
    let good = "0123456789abcdef0123456789abcdef".parse::<verified_tools::IdempotencyKey>();
    assert_eq!(good.map(|key| key.to_string()).ok().as_deref(), Some(&upper.to_lowercase()[..]));
}

#[cfg(not(feature = "sqlite"))]
#[test]
fn without_the_sqlite_feature_the_command_names_it() {
    let options = Options::new(Store::Sqlite("/tmp/ledger.db".into()));
    match run(&options, Command::List { limit: 10 }) {
        Err(error @ OpsError::FeatureMissing { feature: "sqlite", .. }) => {
            let message = error.to_string();
            assert!(message.contains("--features sqlite -- --ledger sqlite:/tmp/ledger.db"));
        }
        other => panic!("a typed error naming the feature, got {other:?}"),
    }
}

#[cfg(not(feature = "redis"))]
#[test]
fn without_the_redis_feature_the_command_names_it() {
    let options = Options::new(Store::Redis("redis://127.0.0.1:6379/".into()));
    match run(&options, Command::List { limit: 10 }) {
        Err(error @ OpsError::FeatureMissing { feature: "redis", .. }) => {
            assert!(error.to_string().contains("--features redis"), "{error}");
        }
        other => panic!("a typed error naming the feature, got {other:?}"),
    }
}

// ---------------------------------------------------------------- the engine's calls

#[cfg(any(feature = "sqlite", feature = "redis"))]
mod calls {
    use std::io;
    use std::sync::Arc;
    use std::sync::Mutex;
    use std::sync::atomic::{AtomicU32, Ordering};

    use verified_tools::ledger::{Codec, Ledger};
    use verified_tools::{Context, SideEffect, ToolResult, ToolSpec, Verdict, engine};

    pub static CHARGE: ToolSpec = ToolSpec::new("charge_card", SideEffect::High).with_verifier();

    /// The payment service as the agent sees it: whether an answer is lost,
    /// and what its verifier can see (a charge that answered is visible).
    pub struct Service {
        pub dispatched: AtomicU32,
        pub verified: AtomicU32,
        pub answer_lost: Mutex<bool>,
        pub visible: Mutex<Verdict<u64>>,
    }

    impl Service {
        /// Its answers are lost and its state cannot be read: every call
        /// ends in doubt.
        pub fn unreachable() -> Self {
            Self {
                dispatched: AtomicU32::new(0),
                verified: AtomicU32::new(0),
                answer_lost: Mutex::new(true),
                visible: Mutex::new(Verdict::Unknown),
            }
        }

        pub fn dispatched(&self) -> u32 {
            self.dispatched.load(Ordering::SeqCst)
        }

        pub fn verified(&self) -> u32 {
            self.verified.load(Ordering::SeqCst)
        }

        pub fn set(&self, answer_lost: bool, visible: Verdict<u64>) {
            *self.answer_lost.lock().unwrap() = answer_lost;
            *self.visible.lock().unwrap() = visible;
        }
    }

    /// One logical call: the charge of step 3 of run 7 (the same key every
    /// time, whichever process makes it).
    pub async fn charge(
        cx: &Context,
        ledger: Arc<dyn Ledger>,
        service: &Service,
    ) -> ToolResult<u64, io::Error> {
        let cx = cx.clone().with_ledger(ledger).for_step("run-7", 3);
        engine::call(
            &cx,
            &CHARGE,
            &("acme", 4200u32),
            &("acme", 4200u32),
            |_attempt| {
                service.dispatched.fetch_add(1, Ordering::SeqCst);
                let lost = *service.answer_lost.lock().unwrap();
                if !lost {
                    *service.visible.lock().unwrap() = Verdict::Holds(4242);
                }
                async move { if lost { Err(io::ErrorKind::TimedOut.into()) } else { Ok(4242u64) } }
            },
            Some(|_key| {
                service.verified.fetch_add(1, Ordering::SeqCst);
                let visible = *service.visible.lock().unwrap();
                async move { visible }
            }),
            Codec::serde(),
        )
        .await
    }
}

// ---------------------------------------------------------------- SQLite

#[cfg(feature = "sqlite")]
mod sqlite {
    use std::sync::Arc;

    use verified_tools::ledger::{
        ClaimRequest, Claimed, Ledger, RecordState, Resolution, Settle, SqliteLedger,
    };
    use verified_tools::{
        Context, IdempotencyKey, PayloadDigest, Proof, RetryPolicy, SideEffect, ToolResult,
        UnknownReason, Verdict,
    };

    use verified_tools_suite::ops::Decision;

    use super::calls::{Service, charge};
    use super::*;

    /// The agent's runtime: paused time, so that the verifier's waits cost
    /// nothing (the ledger's blocking work holds the clock while it runs).
    fn runtime() -> tokio::runtime::Runtime {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .start_paused(true)
            .build()
            .expect("a runtime")
    }

    fn ledger(db: &TempPath) -> Arc<dyn Ledger> {
        Arc::new(SqliteLedger::open(db.path()).expect("the file opens"))
    }

    fn options(db: &TempPath) -> Options {
        Options::new(Store::Sqlite(db.path().to_path_buf()))
    }

    fn decision(key: IdempotencyKey, resolution: Resolution, audit: &TempPath) -> Command {
        Command::Resolve(Decision {
            key,
            resolution,
            by: "alice".into(),
            note: Some("seen in the payment console".into()),
            audit: Some(audit.path().to_path_buf()),
        })
    }

    /// The key of a call that ended in doubt, as its outcome reports it.
    fn in_doubt(result: &ToolResult<u64, std::io::Error>) -> IdempotencyKey {
        match result {
            ToolResult::Unknown { reason: UnknownReason::VerifierInconclusive, key, .. } => *key,
            other => panic!("the call ends in doubt, got {other:?}"),
        }
    }

    #[test]
    fn a_call_in_doubt_resolved_applied_is_never_dispatched_again() {
        let (db, audit) = (TempPath::new("applied"), TempPath::new("applied-audit"));
        let rt = runtime();
        let cx = Context::new("billing");
        let service = Service::unreachable();
        let first = rt.block_on(charge(&cx, ledger(&db), &service));
        let key = in_doubt(&first);
        assert_eq!(service.dispatched(), 1);

        // The operator lists the calls in doubt, in text and as JSON.
        let list = run(&options(&db), Command::List { limit: 10 }).unwrap();
        assert_eq!(list.lines().count(), 1, "{list}");
        assert!(
            list.starts_with(&format!("{key}  in_doubt   attempts 1  after_ok no  ")),
            "{list}"
        );
        assert!(list.trim_end().ends_with("never settles"), "no settle margin: {list}");
        let json = options(&db).with_json(true);
        let rows = json_lines(&run(&json, Command::List { limit: 10 }).unwrap());
        assert_eq!(rows.len(), 1);
        assert_eq!(rows[0]["key"], key.to_string());
        assert_eq!(rows[0]["state"], "in_doubt");
        assert_eq!(rows[0]["attempts"], 1);
        assert_eq!(rows[0]["after_ok"], false);
        assert!(rows[0]["settles_in_ms"].is_null());
        assert_eq!(run(&options(&db), Command::Show { key }).unwrap(), list);

        // A person checked the payment console: it went through.
        let said = run(&options(&db), decision(key, Resolution::Applied, &audit)).unwrap();
        let logged = std::fs::read_to_string(audit.path()).unwrap();
        assert_eq!(said, logged, "the decision is printed and appended alike");
        let line = &json_lines(&logged)[0];
        assert_eq!(line["key"], key.to_string());
        assert_eq!(line["by"], "alice");
        assert_eq!(line["decision"], "applied");
        assert_eq!(line["note"], "seen in the payment console");
        assert_eq!(line["state_before"], "in_doubt");
        let at = line["at"].as_str().unwrap();
        assert!(at.len() == 24 && at.starts_with("20") && at.ends_with('Z'), "{at}");
        assert_eq!(
            run(&options(&db), Command::List { limit: 10 }).unwrap(),
            "no call is in doubt\n"
        );
        let shown = run(&options(&db), Command::Show { key }).unwrap();
        assert!(shown.starts_with(&format!("{key}  completed")), "{shown}");

        // The agent repeats the call. It is completed, without a value:
        // nothing is dispatched, and while the verifier still cannot see the
        // state, the call says so rather than make one up.
        let verified = service.verified();
        let again = rt.block_on(charge(&cx, ledger(&db), &service));
        assert!(
            matches!(again, ToolResult::Unknown { reason: UnknownReason::ValueNotRecorded, key: k, .. } if k == key),
            "{again:?}"
        );
        assert!(service.verified() > verified, "it tried to obtain the value by verifying");
        // Once the service shows the charge, the repeat returns it. The
        // ledger's record (the person's decision) is what proves the effect;
        // the verifier only supplied the value.
        service.set(true, Verdict::Holds(4242));
        let seen = rt.block_on(charge(&cx, ledger(&db), &service));
        assert!(
            matches!(seen, ToolResult::Success { value: 4242, proof: Proof::Ledger, key: k } if k == key),
            "{seen:?}"
        );
        assert_eq!(service.dispatched(), 1, "never dispatched again");

        // Decided once: a second decision is refused, and not audited.
        let twice = run(&options(&db), decision(key, Resolution::NotApplied, &audit));
        match twice {
            Err(error @ OpsError::NotInDoubt { state: RecordState::Completed, .. }) => {
                assert!(error.to_string().starts_with("refused: the record of key"), "{error}");
            }
            other => panic!("a completed record is not resolved again, got {other:?}"),
        }
        assert_eq!(std::fs::read_to_string(audit.path()).unwrap(), logged);
    }

    #[test]
    fn a_call_in_doubt_resolved_not_applied_is_dispatched_with_its_whole_budget() {
        let (db, audit) = (TempPath::new("not-applied"), TempPath::new("not-applied-audit"));
        let rt = runtime();
        // No retry: one attempt per key. The first call spends it.
        let policy = RetryPolicy::for_class(SideEffect::High).with_retries(0);
        let cx = Context::new("billing").with_policy(SideEffect::High, policy);
        let service = Service::unreachable();
        let key = in_doubt(&rt.block_on(charge(&cx, ledger(&db), &service)));

        // The service shows no charge, but without a settle margin an
        // `Absent` proves nothing: the repeat stays in doubt, dispatching
        // nothing. Only a person can close it.
        service.set(false, Verdict::Absent);
        let stuck = rt.block_on(charge(&cx, ledger(&db), &service));
        assert!(
            matches!(stuck, ToolResult::Unknown { reason: UnknownReason::Unsettled, .. }),
            "{stuck:?}"
        );
        assert_eq!(service.dispatched(), 1);

        std::fs::write(audit.path(), "{\"an\":\"earlier line\"}\n").unwrap();
        let said = run(&options(&db), decision(key, Resolution::NotApplied, &audit)).unwrap();
        assert_eq!(json_lines(&said)[0]["decision"], "not_applied");
        let logged = std::fs::read_to_string(audit.path()).unwrap();
        assert_eq!(logged.lines().count(), 2, "appended: {logged}");
        assert_eq!(logged.lines().nth(1), said.lines().next());
        let shown = run(&options(&db).with_json(true), Command::Show { key }).unwrap();
        let record = &json_lines(&shown)[0];
        assert_eq!((&record["state"], &record["attempts"]), (&"settled".into(), &0.into()));
        assert_eq!(record["settles_in_ms"], 0);

        // The repeat believes the `Absent` at once and has its attempt again,
        // whose OK answer it reads back (a high tool's default).
        let done = rt.block_on(charge(&cx, ledger(&db), &service));
        assert!(
            matches!(done, ToolResult::Success { value: 4242, proof: Proof::Verifier, key: k } if k == key),
            "{done:?}"
        );
        assert_eq!(service.dispatched(), 2);
    }

    #[test]
    fn what_is_not_in_doubt_is_refused_and_nothing_changes() {
        let (db, audit) = (TempPath::new("refused"), TempPath::new("refused-audit"));
        let rt = runtime();
        let cx = Context::new("billing");
        let service = Service::unreachable();
        let doubt = in_doubt(&rt.block_on(charge(&cx, ledger(&db), &service)));
        // Another call holds a key right now.
        let held = IdempotencyKey::from_u128(0xfeed);
        let holder = SqliteLedger::open(db.path()).unwrap();
        let request = ClaimRequest {
            key: held,
            fingerprint: PayloadDigest::from_u128(1),
            previous: None,
            first: verified_tools::ledger::Progress {
                attempts: 1,
                after_ok: false,
                settle: Settle::NOW,
            },
            now: tokio::time::Instant::now(),
        };
        let claimed = rt.block_on(holder.claim(request)).unwrap().state;
        assert!(matches!(claimed, Claimed::Fresh(_)), "{claimed:?}");

        let list = run(&options(&db), Command::List { limit: 10 }).unwrap();
        assert!(list.starts_with(&doubt.to_string()) && list.lines().count() == 1, "{list}");
        match run(&options(&db), decision(held, Resolution::Applied, &audit)) {
            Err(error @ OpsError::NotInDoubt { state: RecordState::Held, .. }) => {
                assert!(error.to_string().contains("a call holds it now"), "{error}");
            }
            other => panic!("a held record is refused, got {other:?}"),
        }
        let unknown = IdempotencyKey::from_u128(0xdead);
        assert!(matches!(
            run(&options(&db), decision(unknown, Resolution::Applied, &audit)),
            Err(OpsError::NoRecord(k)) if k == unknown
        ));
        assert!(matches!(
            run(&options(&db), Command::Show { key: unknown }),
            Err(OpsError::NoRecord(_))
        ));
        // No name, or an audit file that cannot be written: nothing decided.
        let anonymous = Command::Resolve(Decision {
            key: doubt,
            resolution: Resolution::Applied,
            by: "  ".into(),
            note: None,
            audit: None,
        });
        assert!(matches!(run(&options(&db), anonymous), Err(OpsError::Anonymous)));
        let nowhere = Command::Resolve(Decision {
            key: doubt,
            resolution: Resolution::Applied,
            by: "alice".into(),
            note: None,
            audit: Some(std::env::temp_dir().join("vt-no-such-dir/audit.jsonl")),
        });
        let failed = run(&options(&db), nowhere);
        assert!(matches!(failed, Err(OpsError::AuditFile { .. })), "{failed:?}");
        assert_eq!(run(&options(&db), Command::List { limit: 10 }).unwrap(), list, "unchanged");
        assert!(std::fs::read_to_string(audit.path()).unwrap_or_default().is_empty());

        // The listing says when it was cut short.
        let more = run(&options(&db), Command::List { limit: 0 }).unwrap();
        assert!(more.contains("more calls are in doubt"), "{more}");

        // A wrong path is not a new, empty ledger.
        let missing = TempPath::new("missing");
        let wrong = run(&options(&missing), Command::List { limit: 10 });
        assert!(matches!(wrong, Err(OpsError::NoLedgerFile(_))), "{wrong:?}");
        assert!(!missing.path().exists(), "no file was created");
    }
}

// ---------------------------------------------------------------- Redis

#[cfg(feature = "redis")]
mod redis {
    use std::sync::Arc;
    use std::time::Duration;

    use verified_tools::ledger::{Ledger, RedisLedger, Resolution};
    use verified_tools::{
        Backoff, Context, Proof, ToolResult, UnknownReason, Verdict, VerifyBudget,
    };

    use verified_tools_suite::ops::Decision;

    use super::calls::{Service, charge};
    use super::support::redis::RedisServer;
    use super::*;

    #[test]
    fn a_redis_ledger_is_listed_and_resolved_the_same_way() {
        let Some(server) = RedisServer::private() else { return };
        let audit = TempPath::new("redis-audit");
        // Redis needs real time: quick verifier reads keep the call short.
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        let cx = Context::new("billing").map_policies(|_, policy| {
            let backoff = Backoff::new(Duration::from_millis(5), 2, Duration::from_millis(20));
            policy.with_backoff(backoff).with_verify(VerifyBudget::new(2, Duration::from_millis(5)))
        });
        let ledger: Arc<dyn Ledger> = Arc::new(rt.block_on(async {
            let ledger = RedisLedger::connect(&server.url).await.expect("redis answers");
            ledger.with_prefix("billing:")
        }));
        let service = Service::unreachable();
        let key = match rt.block_on(charge(&cx, Arc::clone(&ledger), &service)) {
            ToolResult::Unknown { reason: UnknownReason::VerifierInconclusive, key, .. } => key,
            other => panic!("the call ends in doubt, got {other:?}"),
        };

        let options =
            Options::new(Store::Redis(server.url.clone())).with_prefix(Some("billing:".into()));
        let list = run(&options, Command::List { limit: 10 }).unwrap();
        assert!(list.starts_with(&format!("{key}  in_doubt   attempts 1")), "{list}");
        // The agents' prefix is the one to give: another namespace is empty.
        let elsewhere = Options::new(Store::Redis(server.url.clone()));
        assert_eq!(run(&elsewhere, Command::List { limit: 10 }).unwrap(), "no call is in doubt\n");

        let decision = Command::Resolve(Decision {
            key,
            resolution: Resolution::Applied,
            by: "bob".into(),
            note: None,
            audit: Some(audit.path().to_path_buf()),
        });
        let said = run(&options, decision.clone()).unwrap();
        assert_eq!(json_lines(&said)[0]["note"], serde_json::Value::Null);
        assert_eq!(std::fs::read_to_string(audit.path()).unwrap(), said);
        assert!(matches!(run(&options, decision), Err(OpsError::NotInDoubt { .. })));

        let verified = service.verified();
        let again = rt.block_on(charge(&cx, Arc::clone(&ledger), &service));
        assert!(
            matches!(again, ToolResult::Unknown { reason: UnknownReason::ValueNotRecorded, .. }),
            "{again:?}"
        );
        assert!(service.verified() > verified, "it tried to obtain the value by verifying");
        service.set(true, Verdict::Holds(4242));
        let seen = rt.block_on(charge(&cx, ledger, &service));
        assert!(
            matches!(seen, ToolResult::Success { value: 4242, proof: Proof::Ledger, .. }),
            "{seen:?}"
        );
        assert_eq!(service.dispatched(), 1, "never dispatched again");
    }
}
