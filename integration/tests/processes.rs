//! The ledger across OS processes (issue 8): several worker processes
//! (`src/bin/ledger_worker.rs`) make the same logical calls through one
//! SQLite file, one Redis server or one PostgreSQL database, a worker is
//! `kill -9`ed between its dispatch and its record, Redis goes away mid-run,
//! a private PostgreSQL server is stopped and started again mid-run. The
//! effects are lines in a file this test owns (or rows of a table, SQLite
//! or PostgreSQL): each must be there exactly once.
//!
//! PostgreSQL is the run's (`VT_POSTGRES_URL`, `.ci/postgres.sh`); each
//! test keeps its ledger and effects tables in a schema of its own,
//! `vt_proc_<unix time>_<pid>_<test>`, dropped when the test ends (and by a
//! later run, after an hour, if the test was killed).

use test_support as support;

use std::collections::HashMap;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::Once;
use std::time::{Duration, Instant};

use support::postgres::PostgresServer;
use support::redis::RedisServer;
use tokio_postgres::{Client, NoTls};

const WORKER: &str = env!("CARGO_BIN_EXE_ledger_worker");

/// A scratch directory of one test.
struct Scratch(PathBuf);

impl Scratch {
    fn new(name: &str) -> Self {
        let dir = std::env::temp_dir().join(format!("vt-processes-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("a scratch directory");
        Self(dir)
    }

    fn path(&self, file: &str) -> PathBuf {
        self.0.join(file)
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// A ledger the tests run against: what `--ledger` names, the worker's
/// other arguments for it, and what must live as long as the test.
struct Store {
    /// `sqlite`, `redis` or `postgres`: for messages and file names.
    name: &'static str,
    ledger: String,
    args: Vec<String>,
    _redis: Option<RedisServer>,
    /// The test's own PostgreSQL schema (for the ledger and for effects).
    pg: Option<PgSchema>,
}

impl std::fmt::Display for Store {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} ({})", self.name, self.ledger)
    }
}

/// The stores to run against: a fresh SQLite file always, the run's Redis
/// when there is one (`None` from `RedisServer::shared` says why not), the
/// run's PostgreSQL when there is one (`support::postgres::url`), in a
/// schema of `test`'s own.
fn stores(scratch: &Scratch, test: &str) -> Vec<Store> {
    let sqlite = format!("sqlite:{}", scratch.path("ledger.db").display());
    let mut stores =
        vec![Store { name: "sqlite", ledger: sqlite, args: vec![], _redis: None, pg: None }];
    if let Some(redis) = RedisServer::shared() {
        // A database of its own per test binary run: keys never meet.
        let ledger = redis.url.clone();
        stores.push(Store { name: "redis", ledger, args: vec![], _redis: Some(redis), pg: None });
    }
    if let Some(schema) = PgSchema::new(test) {
        let args = vec!["--pg-schema".to_owned(), schema.name.clone()];
        let ledger = schema.url.clone();
        stores.push(Store { name: "postgres", ledger, args, _redis: None, pg: Some(schema) });
    }
    stores
}

fn worker(store: &Store, effects: &Path, run: &str, extra: &[&str]) -> Command {
    let mut cmd = worker_on(&store.ledger, effects, run, extra);
    cmd.args(&store.args);
    cmd
}

fn worker_on(ledger: &str, effects: &Path, run: &str, extra: &[&str]) -> Command {
    let mut cmd = Command::new(WORKER);
    cmd.args(["--ledger", ledger, "--run", run, "--effects"]).arg(effects).args(extra);
    cmd.stdout(Stdio::piped()).stderr(Stdio::piped());
    cmd
}

/// A schema of one test's own in the run's PostgreSQL: the workers' ledger
/// tables and effects tables. Dropped when the test ends.
struct PgSchema {
    url: String,
    name: String,
}

impl PgSchema {
    /// `None` (after `support::missing`) when the run has no PostgreSQL.
    fn new(test: &str) -> Option<Self> {
        let url = support::postgres::url()?;
        static JANITOR: Once = Once::new();
        JANITOR.call_once(|| drop_stale_schemas(&url));
        let name = format!("vt_proc_{}_{}_{test}", unix_secs(), std::process::id());
        Some(Self { url, name })
    }

    /// The rows of `key` in an effects table: (pid, fence) each.
    fn rows(&self, table: &str, key: &str) -> Vec<(u32, i64)> {
        let sql = format!("SELECT pid, fence FROM \"{}\".{table} WHERE key = $1", self.name);
        let rows = postgres(&self.url, async |db| db.query(&sql, &[&key]).await)
            .unwrap_or_else(|e| panic!("{sql}: {e}"));
        let pid = |pid: i64| u32::try_from(pid).expect("a pid");
        rows.iter().map(|row| (pid(row.get(0)), row.get(1))).collect()
    }
}

impl Drop for PgSchema {
    fn drop(&mut self) {
        let sql = format!("DROP SCHEMA IF EXISTS \"{}\" CASCADE", self.name);
        let _ = postgres(&self.url, async |db| db.batch_execute(&sql).await);
    }
}

/// Runs `f` on a session of the test's own with the server at `url`.
fn postgres<T>(url: &str, f: impl AsyncFnOnce(&Client) -> T) -> T {
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("a runtime");
    rt.block_on(async {
        let (client, connection) = tokio_postgres::connect(url, NoTls).await.expect("postgres");
        tokio::spawn(connection);
        f(&client).await
    })
}

fn unix_secs() -> u64 {
    std::time::SystemTime::UNIX_EPOCH.elapsed().map_or(0, |d| d.as_secs())
}

/// Drops the schemas of this test's runs more than an hour old (a run
/// killed before its tests' schemas were dropped).
fn drop_stale_schemas(url: &str) {
    postgres(url, async |db| {
        let like = "SELECT nspname::text FROM pg_namespace WHERE nspname LIKE 'vt\\_proc\\_%'";
        for row in db.query(like, &[]).await.unwrap_or_default() {
            let name: String = row.get(0);
            let started = name.split('_').nth(2).and_then(|secs| secs.parse::<u64>().ok());
            if started.is_some_and(|secs| secs + 3600 < unix_secs()) {
                let drop = format!("DROP SCHEMA IF EXISTS \"{name}\" CASCADE");
                let _ = db.batch_execute(&drop).await;
            }
        }
    });
}

fn finish(child: Child) -> Vec<String> {
    let Output { status, stdout, stderr } = child.wait_with_output().expect("the worker ends");
    let stdout = String::from_utf8_lossy(&stdout).into_owned();
    assert!(
        status.success(),
        "worker failed: {status}\n{stdout}\n{}",
        String::from_utf8_lossy(&stderr)
    );
    stdout.lines().map(str::to_owned).collect()
}

/// How many times each key's effect was applied.
fn effects(path: &Path) -> HashMap<String, usize> {
    let mut seen = HashMap::new();
    for line in std::fs::read_to_string(path).unwrap_or_default().lines() {
        let key = line.split_whitespace().next().expect("KEY PID").to_owned();
        *seen.entry(key).or_insert(0) += 1;
    }
    seen
}

/// The pid that sent each key's effect.
fn senders(path: &Path) -> HashMap<String, u32> {
    let mut senders = HashMap::new();
    for line in std::fs::read_to_string(path).unwrap_or_default().lines() {
        let mut fields = line.split_whitespace();
        let (key, pid) = (fields.next().expect("KEY"), fields.next().expect("PID"));
        senders.insert(key.to_owned(), pid.parse().expect("a pid"));
    }
    senders
}

/// The run id of one test against one store: a store may be shared.
fn run_id(test: &str) -> String {
    format!(
        "{test}-{}-{}",
        std::process::id(),
        std::time::SystemTime::UNIX_EPOCH.elapsed().map_or(0, |d| d.as_nanos())
    )
}

#[test]
fn eight_processes_making_the_same_calls_dispatch_each_effect_once() {
    let scratch = Scratch::new("eight");
    for store in stores(&scratch, "eight") {
        let effects_file = scratch.path(&format!("effects-{}.log", store.name));
        let run = run_id("eight");
        let workers: Vec<Child> = (0..8)
            .map(|_| {
                worker(&store, &effects_file, &run, &["--from", "0", "--to", "40"])
                    .spawn()
                    .expect("spawn")
            })
            .collect();
        // Each worker's lines, with its pid (the effects file names the pid
        // that sent each effect).
        let lines: Vec<(u32, Vec<String>)> =
            workers.into_iter().map(|child| (child.id(), finish(child))).collect();
        let applied = effects(&effects_file);
        assert_eq!(applied.len(), 40, "{store}: every logical call happened");
        assert!(
            applied.values().all(|&n| n == 1),
            "{store}: an effect was applied twice: {applied:?}"
        );
        let senders = senders(&effects_file);
        // The calls that sent their effect, and the others, by proof.
        let (mut sent, mut others): (HashMap<String, usize>, HashMap<String, usize>) =
            Default::default();
        for (pid, lines) in &lines {
            for line in lines {
                let fields: Vec<&str> = line.split_whitespace().collect();
                assert_eq!(fields.get(2), Some(&"success"), "{store}: {line}");
                let by_this_call = senders.get(fields[1]) == Some(pid);
                let outcomes = if by_this_call { &mut sent } else { &mut others };
                *outcomes.entry(fields.get(3).unwrap_or(&"").to_string()).or_insert(0) += 1;
            }
        }
        // 320 calls: 40 sent, each OK answer read back (a high tool's
        // default); the rest replayed from the ledger (or, rarely, proven by
        // the verifier after taking over an abandoned key).
        let sent: Vec<_> = sent.into_iter().collect();
        assert_eq!(sent, [("Verifier".to_owned(), 40)], "{store}");
        assert!(
            others.keys().all(|proof| proof == "Ledger" || proof == "Verifier"),
            "{store}: {others:?}"
        );
        assert_eq!(others.values().sum::<usize>(), 280, "{store}: {others:?}");
    }
}

/// Starts a worker that dispatches call 0 and hangs before recording it,
/// waits for its "dispatched" line, and kills it with SIGKILL.
fn kill_after_dispatch(store: &Store, effects: &Path, run: &str, extra: &[&str]) {
    let mut args = vec!["--from", "0", "--to", "1", "--crash-after-dispatch"];
    args.extend_from_slice(extra);
    let mut child = worker(store, effects, run, &args).spawn().expect("spawn");
    let stdout = child.stdout.take().expect("piped");
    let mut first = String::new();
    BufReader::new(stdout).read_line(&mut first).expect("a line");
    assert!(first.starts_with("dispatched "), "{first}");
    child.kill().expect("SIGKILL"); // std sends SIGKILL: no destructor runs
    child.wait().expect("reaped");
}

/// The workers' lease in the kill test, and how long after a kill it has
/// surely ended (the worker claimed just before it said "dispatched").
const LEASE: [&str; 2] = ["--lease-ms", "1500"];
const LEASE_ENDS: std::time::Duration = std::time::Duration::from_millis(1700);

#[test]
fn a_worker_killed_between_dispatch_and_record_is_verified_not_resent() {
    let scratch = Scratch::new("kill");
    for store in stores(&scratch, "kill") {
        let effects_file = scratch.path(&format!("effects-{}.log", store.name));
        let run = run_id("kill");
        kill_after_dispatch(&store, &effects_file, &run, &LEASE);
        // The dead worker's key is held until its lease ends (a kill leaves
        // no time to abandon it); then the restarted worker takes it over in
        // doubt, verifies, and finds it applied.
        std::thread::sleep(LEASE_ENDS);
        let args = ["--from", "0", "--to", "1", LEASE[0], LEASE[1]];
        let again = worker(&store, &effects_file, &run, &args).spawn().expect("spawn");
        let lines = finish(again);
        assert!(lines[0].ends_with("success Verifier"), "{store}: {lines:?}");
        assert_eq!(effects(&effects_file).values().sum::<usize>(), 1, "{store}: not sent again");

        // Irreversible, and the verifier cannot tell: a person is asked.
        let run = run_id("kill-blind");
        let blind = ["--class", "irreversible", "--verifier", "blind", LEASE[0], LEASE[1]];
        kill_after_dispatch(&store, &effects_file, &run, &blind);
        std::thread::sleep(LEASE_ENDS);
        let mut args = vec!["--from", "0", "--to", "1"];
        args.extend_from_slice(&blind);
        let lines = finish(worker(&store, &effects_file, &run, &args).spawn().expect("spawn"));
        assert!(lines[0].ends_with("escalated"), "{store}: {lines:?}");
        assert_eq!(effects(&effects_file).values().sum::<usize>(), 2, "{store}: one per run");
    }
}

#[test]
fn a_redis_outage_refuses_calls_dispatches_nothing_and_loses_nothing() {
    let Some(mut redis) = RedisServer::private() else { return };
    let scratch = Scratch::new("outage");
    let effects_file = scratch.path("effects.log");
    let run = run_id("outage");
    let args = ["--from", "0", "--to", "30", "--pause-ms", "100"];
    let mut child = worker_on(&redis.url, &effects_file, &run, &args).spawn().expect("spawn");
    let mut lines = BufReader::new(child.stdout.take().expect("piped")).lines();
    let mut seen = Vec::new();
    while seen.len() < 5 {
        seen.push(lines.next().expect("a line").expect("utf-8"));
    }
    redis.stop();
    while seen.len() < 12 {
        seen.push(lines.next().expect("a line").expect("utf-8"));
    }
    redis.restart();
    seen.extend(lines.map(|l| l.expect("utf-8")));
    assert!(child.wait().expect("the worker ends").success());
    let refused: Vec<&String> = seen.iter().filter(|l| l.contains(" refused ")).collect();
    assert!(!refused.is_empty(), "calls made while Redis was down are refused: {seen:#?}");
    assert!(refused.iter().all(|l| l.contains("ledger")), "typed as ledger errors: {refused:#?}");
    let applied = effects(&effects_file);
    for line in &refused {
        let key = line.split_whitespace().nth(1).unwrap_or("");
        assert!(!applied.contains_key(key), "a refused call dispatched: {line}");
    }
    // Everything again, after the outage: what completed replays, what was
    // refused goes out now, once.
    let again = finish(
        worker_on(&redis.url, &effects_file, &run, &["--from", "0", "--to", "30"])
            .spawn()
            .expect("spawn"),
    );
    assert!(again.iter().all(|l| l.contains(" success ")), "{again:#?}");
    let applied = effects(&effects_file);
    assert_eq!(applied.len(), 30);
    assert!(applied.values().all(|&n| n == 1), "{applied:?}");
}

/// Whether the process is stopped (state `T` in `/proc/PID/stat`).
fn stopped(pid: u32) -> bool {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    // The state follows the command name, which is in parentheses.
    stat.rsplit(')').next().is_some_and(|rest| rest.trim_start().starts_with('T'))
}

fn signal(pid: u32, name: &str) {
    let status = Command::new("kill").args([name, &pid.to_string()]).status().expect("kill runs");
    assert!(status.success(), "kill {name} {pid}");
}

/// Worker P claims call 0 and stops itself (SIGSTOP) with the request in
/// hand; worker Q waits for P's lease to end, takes the key over, verifies
/// `Absent` and sends; then P is continued. What P does then is what its
/// arguments say; what it reports is never "not applied": Q may have made
/// the effect (it did). `store` is the ledger, `effects` says where both
/// write their effect, `pause` how P pauses and what it asks. Answers the
/// key, P's outcome line and P's pid.
fn paused_past_the_lease(
    store: &Store,
    effects_file: &Path,
    effects: &[&str],
    pause: &[&str],
) -> (String, String, u32) {
    let run = run_id("pause");
    let mut p_args = vec!["--from", "0", "--to", "1", "--lease-ms", "1000"];
    p_args.extend_from_slice(effects);
    p_args.extend_from_slice(pause);
    let mut p = worker(store, effects_file, &run, &p_args).spawn().expect("spawn P");
    let mut p_lines = BufReader::new(p.stdout.take().expect("piped")).lines();
    let first = p_lines.next().expect("P's first line").expect("utf-8");
    let key = first.strip_prefix("stopping ").unwrap_or_else(|| panic!("{first}")).to_owned();
    // Readiness, not a fixed wait: P is stopped when /proc says so.
    let since = std::time::Instant::now();
    while !stopped(p.id()) {
        assert!(since.elapsed() < std::time::Duration::from_secs(60), "P never stopped");
        std::thread::yield_now();
    }
    // Q's lease (and so its call's deadline) outlasts P's: it waits for
    // P's hold to end, however slow the machine. It writes as P would.
    let mut q_args = vec!["--from", "0", "--to", "1", "--lease-ms", "20000"];
    q_args.extend_from_slice(effects);
    let q = finish(worker(store, effects_file, &run, &q_args).spawn().expect("spawn Q"));
    assert!(q[0].contains(" success "), "{store}: Q took the key over and sent: {q:?}");
    signal(p.id(), "-CONT");
    let outcome = p_lines.next().expect("P's outcome").expect("utf-8");
    let p_pid = p.id();
    assert!(p.wait().expect("P ends").success());
    assert!(
        outcome.contains(" unknown") || outcome.contains(" success "),
        "{store}: P must not say the effect did not happen: {outcome}"
    );
    (key, outcome, p_pid)
}

/// Issue 20, case 2: a worker paused past its lease with a request in hand.
/// Fencing stops it from recording, not from sending: without a check (the
/// control) its late write is a second effect; asking right before it sends
/// (the attempt's deadline, free; or the ledger's `Holder`, one read) it
/// sends nothing. Either way it never reports the effect as not applied.
#[test]
fn a_worker_paused_past_its_lease_asks_before_it_sends_and_never_says_not_applied() {
    let scratch = Scratch::new("pause");
    for store in stores(&scratch, "pause") {
        for check in ["none", "deadline", "holder"] {
            let effects_file = scratch.path(&format!("effects-{check}-{}.log", store.name));
            let pause = ["--stop-before-send", "--check", check];
            let (key, outcome, _) = paused_past_the_lease(&store, &effects_file, &[], &pause);
            let sent = effects(&effects_file).get(&key).copied().unwrap_or(0);
            println!("{store}, --check {check}: {sent} effect(s); P: {outcome}");
            let expected = if check == "none" { 2 } else { 1 };
            assert_eq!(
                sent, expected,
                "{store}, --check {check}: effects of the key; P: {outcome}"
            );
        }
    }
}

/// The rows of `key` in an effects database: (pid, fence) each.
fn rows(db: &Path, table: &str, key: &str) -> Vec<(u32, i64)> {
    let conn = rusqlite::Connection::open(db).expect("the effects database");
    let mut statement =
        conn.prepare(&format!("SELECT pid, fence FROM {table} WHERE key = ?1")).expect("a query");
    statement
        .query_map([key], |r| Ok((r.get(0)?, r.get(1)?)))
        .expect("rows")
        .collect::<Result<_, _>>()
        .expect("rows")
}

/// The window no question closes: P asks whether it still holds the key (it
/// does), then stops before its write; Q takes the key over, verifies
/// `Absent` and writes; P resumes and writes. A plain `INSERT` is a second
/// row (the control). Written under the call's fence (`Holder::fence`) with
/// the database checking it, P's late write is refused: one row, Q's. With
/// every ledger, the rows in an SQLite file and, when the run has one, in
/// PostgreSQL (`--effects-pg`, in the test's schema).
#[test]
fn a_late_write_after_the_question_is_refused_by_a_fence_at_the_resource() {
    let scratch = Scratch::new("fence");
    let stores = stores(&scratch, "fence");
    let pg = stores.iter().find_map(|store| store.pg.as_ref());
    for store in &stores {
        for target in ["sqlite", "postgres"] {
            let pg = match (target, pg) {
                ("postgres", None) => continue,
                (_, pg) => pg,
            };
            for (write, table) in [("plain", "effects"), ("fenced", "fenced_effects")] {
                let db = scratch.path(&format!("effects-{write}-{}.db", store.name));
                let mut effects = vec!["--write", write];
                match pg {
                    Some(pg) if target == "postgres" => {
                        effects.extend(["--effects-pg", &pg.url, "--pg-schema", &pg.name]);
                    }
                    _ => effects.push("--effects-db"),
                }
                let pause = ["--check", "holder", "--stop-after-check"];
                let (key, outcome, p) = paused_past_the_lease(store, &db, &effects, &pause);
                let rows = match pg {
                    Some(pg) if target == "postgres" => pg.rows(table, &key),
                    _ => rows(&db, table, &key),
                };
                let at = format!("{store}, effects in {target}, --write {write}");
                println!("{at}: rows {rows:?}; P: {outcome}");
                match write {
                    "plain" => assert_eq!(rows.len(), 2, "{at}: the control writes twice"),
                    _ => {
                        assert_eq!(rows.len(), 1, "{at}: one row per key");
                        let (pid, fence) = rows[0];
                        assert!(fence > 0, "{at}: written under a fence: {rows:?}");
                        assert_ne!(pid, p, "{at}: the row is Q's, P's late write refused");
                        assert!(
                            outcome.contains(" unknown"),
                            "{at}: P's refused write is not a success of P's: {outcome}"
                        );
                    }
                }
            }
        }
    }
}

/// Lines a worker prints, read on a thread of their own: `(worker, line)`.
fn read_lines(
    index: usize,
    child: &mut Child,
    to: std::sync::mpsc::Sender<(usize, String)>,
) -> std::thread::JoinHandle<()> {
    let stdout = child.stdout.take().expect("piped");
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines() {
            let Ok(line) = line else { return };
            if to.send((index, line)).is_err() {
                return;
            }
        }
    })
}

/// How long the restart test waits for lines it expects: generous, for a
/// loaded machine (a call while the server is down fails within the
/// ledger's 2 s timeout; a call after waits up to its lease for a key held
/// across the outage).
const PATIENCE: Duration = Duration::from_secs(90);

/// A private PostgreSQL server stopped and started again while three
/// workers make the same 60 calls through it, for each way it stops
/// (`pg_ctl stop -m fast`: sessions ended, a checkpoint; `-m immediate`: a
/// crash of the server, recovered from its WAL at the start). Calls made
/// while it is down are refused (typed as the ledger's), and none dispatched
/// by the worker that refused it; none is reported a success without its
/// effect; no effect is sent twice; the ledger connects again by itself:
/// calls succeed after the restart. A last worker then makes every call
/// again: all succeed, each effect exactly once (what completed replays or
/// is verified, what was refused goes out now): nothing lost.
#[test]
fn a_postgres_restart_mid_run_sends_nothing_twice_and_no_success_is_false() {
    let Some(mut server) = PostgresServer::private() else { return };
    let scratch = Scratch::new("pg-restart");
    for mode in ["fast", "immediate"] {
        restart_mid_run(&mut server, &scratch, mode);
    }
}

/// The calls each worker of the restart test makes, and the workers.
const CALLS: usize = 60;
const WORKERS: usize = 3;

/// A worker's line, with when it came: before the stop (0), while the
/// server was down (1), after it was started again (2).
type Seen = Vec<(usize, String, u8)>;

fn restart_mid_run(server: &mut PostgresServer, scratch: &Scratch, mode: &str) {
    let effects_file = scratch.path(&format!("effects-{mode}.log"));
    let run = run_id("pg-restart");
    let ledger = server.url.clone();
    let to = CALLS.to_string();
    let (seen, pids) = across_a_restart(server, mode, &|| {
        worker_on(&ledger, &effects_file, &run, &["--from", "0", "--to", &to, "--pause-ms", "100"])
    });
    let applied = effects(&effects_file);
    let senders = senders(&effects_file);
    let outcome = |line: &str| line.split_whitespace().nth(2).unwrap_or("").to_owned();
    let key = |line: &str| line.split_whitespace().nth(1).unwrap_or("").to_owned();
    let mut counts: HashMap<(String, u8), usize> = HashMap::new();
    for (index, line, phase) in &seen {
        *counts.entry((outcome(line), *phase)).or_insert(0) += 1;
        match outcome(line).as_str() {
            "success" => assert!(
                applied.contains_key(&key(line)),
                "-m {mode}: worker {index} reported a success with no effect: {line}"
            ),
            "refused" => {
                assert!(line.contains("ledger"), "-m {mode}: typed as a ledger error: {line}");
                assert_ne!(
                    senders.get(&key(line)),
                    Some(&pids[*index]),
                    "-m {mode}: worker {index} refused a call it dispatched: {line}"
                );
            }
            "unknown" => {}
            _ => panic!("-m {mode}: worker {index}: not a success, refusal or unknown: {line}"),
        }
    }
    let mut counts: Vec<_> = counts.into_iter().collect();
    counts.sort();
    println!("postgres restart -m {mode}: (outcome, phase) counts {counts:?}");
    println!("postgres restart -m {mode}: {} effects before the last pass", applied.len());
    assert_eq!(seen.len(), CALLS * WORKERS, "-m {mode}: every call said something: {seen:#?}");
    assert!(applied.values().all(|&n| n == 1), "-m {mode}: an effect twice: {applied:?}");
    let after = |outcome: &str| counts.iter().any(|((o, phase), _)| o == outcome && *phase == 2);
    assert!(after("success"), "-m {mode}: calls succeed after the restart: {seen:#?}");
    // Everything again: no call lost, none twice.
    let mut again = worker_on(&ledger, &effects_file, &run, &["--from", "0", "--to", &to]);
    let again = finish(again.spawn().expect("spawn"));
    assert!(again.iter().all(|line| line.contains(" success ")), "-m {mode}: {again:#?}");
    let applied = effects(&effects_file);
    assert_eq!(applied.len(), CALLS, "-m {mode}: every call's effect, the server back");
    assert!(applied.values().all(|&n| n == 1), "-m {mode}: an effect twice: {applied:?}");
    println!(
        "postgres restart -m {mode}: the last pass {} successes, {} effects",
        again.len(),
        applied.len()
    );
}

/// Runs [`WORKERS`] workers made by `worker`, stops the server (`-m mode`)
/// after about three calls each, starts it again once every worker has had
/// two calls refused or failed while it was down, and collects every line
/// until the workers end (all must exit 0). Answers the lines, with their
/// phase, and the workers' pids.
fn across_a_restart(
    server: &mut PostgresServer,
    mode: &str,
    worker: &dyn Fn() -> Command,
) -> (Seen, Vec<u32>) {
    let (sender, lines) = std::sync::mpsc::channel();
    let mut workers = Vec::new();
    let mut readers = Vec::new();
    for index in 0..WORKERS {
        let mut child = worker().spawn().expect("spawn");
        readers.push(read_lines(index, &mut child, sender.clone()));
        workers.push(child);
    }
    drop(sender);
    let mut seen: Seen = Vec::new();
    let next =
        |phase: u8, seen: &mut Seen, workers: &mut Vec<Child>| match lines.recv_timeout(PATIENCE) {
            Ok((index, line)) => seen.push((index, line, phase)),
            Err(_) => gave_up(workers, &format!("-m {mode}: no worker's line for {PATIENCE:?}")),
        };
    // Three calls each, about, before the stop.
    while seen.len() < 3 * WORKERS {
        next(0, &mut seen, &mut workers);
    }
    server.stop(mode);
    // Down until every worker has had two calls refused (or failed, its
    // connection gone): each saw the outage, and failed to connect again.
    let down = |seen: &Seen, index: usize| {
        let by = |(i, line, phase): &&(usize, String, u8)| {
            *i == index && *phase == 1 && !line.contains(" success ")
        };
        seen.iter().filter(by).count()
    };
    let since = Instant::now();
    while !(0..WORKERS).all(|index| down(&seen, index) >= 2) {
        if since.elapsed() >= PATIENCE {
            gave_up(&mut workers, &format!("-m {mode}: not every worker refused: {seen:#?}"));
        }
        next(1, &mut seen, &mut workers);
    }
    server.start();
    while let Ok((index, line)) = lines.recv_timeout(PATIENCE) {
        seen.push((index, line, 2));
    }
    let pids: Vec<u32> = workers.iter().map(Child::id).collect();
    for child in workers {
        assert!(child.wait_with_output().expect("the worker ends").status.success());
    }
    for reader in readers {
        reader.join().expect("the reader ends");
    }
    (seen, pids)
}

/// Fails the test with `what` and each worker's exit and stderr (a worker
/// that never wrote a line said why there), the workers killed first.
fn gave_up(workers: &mut Vec<Child>, what: &str) -> ! {
    let mut report = String::new();
    for (index, mut child) in workers.drain(..).enumerate() {
        let exited = child.try_wait().ok().flatten();
        let _ = child.kill();
        let stderr = child.wait_with_output().map(|o| o.stderr).unwrap_or_default();
        let stderr = String::from_utf8_lossy(&stderr);
        report.push_str(&format!("\nworker {index}: exited {exited:?}, stderr: {stderr}"));
    }
    panic!("{what}{report}");
}

/// Issue 17, item 4: transactional workers across a PostgreSQL restart (the
/// ledger and the rows on the one server). Three workers make the same 60
/// calls of a transactional tool while the server is stopped (`-m fast`,
/// then `-m immediate`: a crash) and started again: no key gets a second
/// row, every success has its row, and a last pass makes every call: each
/// row once, nothing lost. A transaction cut by the stop rolled back whole,
/// its record with it.
#[test]
fn transactional_workers_across_a_postgres_restart_insert_each_row_once() {
    let Some(mut server) = PostgresServer::private() else { return };
    let scratch = Scratch::new("pg-restart-tx");
    for mode in ["fast", "immediate"] {
        let pg = PgSchema {
            url: server.url.clone(),
            name: format!("vt_proc_{}_{}_restart_tx_{mode}", unix_secs(), std::process::id()),
        };
        let effects_file = scratch.path(&format!("effects-tx-{mode}.log"));
        let run = run_id("pg-restart-tx");
        let to = CALLS.to_string();
        let args = [
            "--from",
            "0",
            "--to",
            &to,
            "--pause-ms",
            "100",
            "--write",
            "transactional",
            "--effects-pg",
            &pg.url,
            "--pg-schema",
            &pg.name,
        ];
        let worker = || worker_on(&pg.url, &effects_file, &run, &args);
        let (seen, _) = across_a_restart(&mut server, mode, &worker);
        let mut outcomes: HashMap<(String, u8), usize> = HashMap::new();
        for (index, line, phase) in &seen {
            let fields: Vec<&str> = line.split_whitespace().collect();
            // "STEP KEY OUTCOME ..", or "STEP refused no connection: .."
            let outcome = match fields.get(1) {
                Some(&"refused") => "refused",
                _ => fields.get(2).copied().unwrap_or(""),
            };
            *outcomes.entry((outcome.to_owned(), *phase)).or_insert(0) += 1;
            if outcome == "success" {
                let rows = pg.rows("effects", fields[1]);
                assert_eq!(rows.len(), 1, "-m {mode}: worker {index}: {line}: rows {rows:?}");
            }
        }
        let mut outcomes: Vec<_> = outcomes.into_iter().collect();
        outcomes.sort();
        println!("postgres restart -m {mode}, transactional: (outcome, phase) {outcomes:?}");
        assert_eq!(seen.len(), CALLS * WORKERS, "-m {mode}: every call said something");
        let after = outcomes.iter().any(|((o, phase), _)| o == "success" && *phase == 2);
        assert!(after, "-m {mode}: calls succeed after the restart: {seen:#?}");
        let rows_per_key = format!(
            "SELECT count(*) FROM \"{}\".effects GROUP BY key HAVING count(*) > 1",
            pg.name
        );
        let twice = postgres(&pg.url, async |db| db.query(&rows_per_key, &[]).await)
            .expect("the effects table");
        assert!(twice.is_empty(), "-m {mode}: {} keys with a second row", twice.len());
        // Everything again: no call lost, none twice.
        let again = finish(worker().spawn().expect("spawn"));
        assert_eq!(again.len(), CALLS, "-m {mode}: {again:#?}");
        for line in &again {
            assert!(line.contains(" success "), "-m {mode}: {line}");
            let key = line.split_whitespace().nth(1).expect("a key");
            assert_eq!(pg.rows("effects", key).len(), 1, "-m {mode}: {line}");
        }
        println!("postgres restart -m {mode}, transactional: the last pass {} successes", CALLS);
    }
}

/// Issue 17, item 4: the pause that fencing at the ledger cannot stop, for a
/// tool whose effect is a row in the ledger's own database. P stops past
/// its lease with its `INSERT` handed to tokio-postgres (inside its
/// transaction); Q takes the key over and inserts; P is continued. As a
/// plain tool (the control) P's late row is a second one; as a
/// transactional tool (`PostgresLedger::transact`) P's transaction cannot
/// commit (the server ended its idle session at the attempt's deadline,
/// rolling its transaction back, and only then did Q's get the key's
/// locks and commit): one row.
#[test]
fn a_paused_transactional_worker_cannot_commit_a_second_row() {
    let scratch = Scratch::new("transactional");
    for store in stores(&scratch, "transactional") {
        let Some(pg) = store.pg.as_ref() else { continue };
        for (write, pause, expected) in [
            ("plain", &["--stop-before-send", "--check", "none"][..], 2),
            ("transactional", &["--stop-before-send"][..], 1),
        ] {
            let effects = ["--write", write, "--effects-pg", &pg.url, "--pg-schema", &pg.name];
            let file = scratch.path(&format!("effects-{write}.log"));
            let (key, outcome, p) = paused_past_the_lease(&store, &file, &effects, pause);
            let rows = pg.rows("effects", &key);
            let at = format!("{store}, --write {write}");
            println!("{at}: rows {rows:?}; P: {outcome}");
            assert_eq!(rows.len(), expected, "{at}: rows of the paused key; P: {outcome}");
            if write == "transactional" {
                assert_ne!(rows[0].0, p, "{at}: the row is Q's; P's transaction rolled back");
            }
        }
    }
}

/// Eight workers making the same 40 calls of a transactional tool on one
/// PostgreSQL database (the ledger and the rows in it): each row inserted
/// once, every call a success, each row's sender told so by its commit.
#[test]
fn eight_processes_making_the_same_transactional_calls_insert_each_row_once() {
    let scratch = Scratch::new("eight_tx");
    for store in stores(&scratch, "eight_tx") {
        let Some(pg) = store.pg.as_ref() else { continue };
        let run = run_id("eight_tx");
        let file = scratch.path("effects-tx.log");
        let args =
            ["--from", "0", "--to", "40", "--write", "transactional", "--effects-pg", &pg.url];
        let workers: Vec<Child> = (0..8)
            .map(|_| {
                let mut args = args.to_vec();
                args.extend(["--pg-schema", &pg.name]);
                worker(&store, &file, &run, &args).spawn().expect("spawn")
            })
            .collect();
        let lines: Vec<(u32, Vec<String>)> =
            workers.into_iter().map(|child| (child.id(), finish(child))).collect();
        let mut proofs: HashMap<String, usize> = HashMap::new();
        let mut keys = std::collections::HashSet::new();
        for (pid, lines) in &lines {
            for line in lines {
                let fields: Vec<&str> = line.split_whitespace().collect();
                assert_eq!(fields.get(2), Some(&"success"), "{store}: {line}");
                let key = fields[1];
                keys.insert(key.to_owned());
                let rows = pg.rows("effects", key);
                assert_eq!(rows.len(), 1, "{store}: rows of {key}: {rows:?}");
                let proof = fields.get(3).copied().unwrap_or("");
                if rows[0].0 == *pid {
                    assert_eq!(proof, "Response", "{store}: the sender knows by its commit");
                }
                *proofs.entry(proof.to_owned()).or_insert(0) += 1;
            }
        }
        assert_eq!(keys.len(), 40, "{store}: every logical call happened");
        assert_eq!(proofs.get("Response"), Some(&40), "{store}: one commit per row: {proofs:?}");
        assert_eq!(proofs.values().sum::<usize>(), 320, "{store}: {proofs:?}");
    }
}

/// A transactional worker `kill -9`ed after its `INSERT`, before its
/// commit: the transaction dies with its connection, its claim with it, and
/// the restarted worker (with nothing to wait out) inserts the row itself,
/// once.
#[test]
fn a_transactional_worker_killed_before_its_commit_leaves_no_row_and_is_redone_once() {
    let scratch = Scratch::new("kill_tx");
    for store in stores(&scratch, "kill_tx") {
        let Some(pg) = store.pg.as_ref() else { continue };
        let run = run_id("kill_tx");
        let file = scratch.path("effects-kill-tx.log");
        let tx = ["--write", "transactional", "--effects-pg", &pg.url, "--pg-schema", &pg.name];
        let mut extra = LEASE.to_vec();
        extra.extend(tx);
        kill_after_dispatch(&store, &file, &run, &extra);
        let mut args = vec!["--from", "0", "--to", "1"];
        args.extend(&extra);
        let again = worker(&store, &file, &run, &args).spawn().expect("spawn");
        let pid = again.id();
        let lines = finish(again);
        assert!(lines[0].ends_with("success Response"), "{store}: {lines:?}");
        let key = lines[0].split_whitespace().nth(1).expect("a key");
        let rows = pg.rows("effects", key);
        assert_eq!(rows.len(), 1, "{store}: {rows:?}");
        assert_eq!(rows[0].0, pid, "{store}: the killed worker's row rolled back");
    }
}
