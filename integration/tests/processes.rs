//! The ledger across OS processes (issue 8): several worker processes
//! (`src/bin/ledger_worker.rs`) make the same logical calls through one
//! SQLite file or one Redis server, a worker is `kill -9`ed between its
//! dispatch and its record, Redis goes away mid-run. The effects are lines in
//! a file this test owns: each must be there exactly once.

#[path = "../../verified-tools/tests/support/mod.rs"]
mod support;

use std::collections::HashMap;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};

use support::redis::RedisServer;

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

/// The stores to run against: a fresh SQLite file always, the run's Redis
/// when there is one (`None` from `RedisServer::shared` says why not).
fn stores(scratch: &Scratch) -> Vec<(String, Option<RedisServer>)> {
    let mut stores = vec![(format!("sqlite:{}", scratch.path("ledger.db").display()), None)];
    if let Some(redis) = RedisServer::shared() {
        // A database of its own per test binary run: keys never meet.
        stores.push((redis.url.clone(), Some(redis)));
    }
    stores
}

fn worker(ledger: &str, effects: &Path, run: &str, extra: &[&str]) -> Command {
    let mut cmd = Command::new(WORKER);
    cmd.args(["--ledger", ledger, "--run", run, "--effects"]).arg(effects).args(extra);
    cmd.stdout(Stdio::piped()).stderr(Stdio::piped());
    cmd
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
    for (ledger, _server) in stores(&scratch) {
        let effects_file = scratch.path(&format!("effects-{}.log", ledger.len()));
        let run = run_id("eight");
        let workers: Vec<Child> = (0..8)
            .map(|_| {
                worker(&ledger, &effects_file, &run, &["--from", "0", "--to", "40"])
                    .spawn()
                    .expect("spawn")
            })
            .collect();
        // Each worker's lines, with its pid (the effects file names the pid
        // that sent each effect).
        let lines: Vec<(u32, Vec<String>)> =
            workers.into_iter().map(|child| (child.id(), finish(child))).collect();
        let applied = effects(&effects_file);
        assert_eq!(applied.len(), 40, "{ledger}: every logical call happened");
        assert!(
            applied.values().all(|&n| n == 1),
            "{ledger}: an effect was applied twice: {applied:?}"
        );
        let senders = senders(&effects_file);
        // The calls that sent their effect, and the others, by proof.
        let (mut sent, mut others): (HashMap<String, usize>, HashMap<String, usize>) =
            Default::default();
        for (pid, lines) in &lines {
            for line in lines {
                let fields: Vec<&str> = line.split_whitespace().collect();
                assert_eq!(fields.get(2), Some(&"success"), "{ledger}: {line}");
                let by_this_call = senders.get(fields[1]) == Some(pid);
                let outcomes = if by_this_call { &mut sent } else { &mut others };
                *outcomes.entry(fields.get(3).unwrap_or(&"").to_string()).or_insert(0) += 1;
            }
        }
        // 320 calls: 40 sent, each OK answer read back (a high tool's
        // default); the rest replayed from the ledger (or, rarely, proven by
        // the verifier after taking over an abandoned key).
        let sent: Vec<_> = sent.into_iter().collect();
        assert_eq!(sent, [("Verifier".to_owned(), 40)], "{ledger}");
        assert!(
            others.keys().all(|proof| proof == "Ledger" || proof == "Verifier"),
            "{ledger}: {others:?}"
        );
        assert_eq!(others.values().sum::<usize>(), 280, "{ledger}: {others:?}");
    }
}

/// Starts a worker that dispatches call 0 and hangs before recording it,
/// waits for its "dispatched" line, and kills it with SIGKILL.
fn kill_after_dispatch(ledger: &str, effects: &Path, run: &str, extra: &[&str]) {
    let mut args = vec!["--from", "0", "--to", "1", "--crash-after-dispatch"];
    args.extend_from_slice(extra);
    let mut child = worker(ledger, effects, run, &args).spawn().expect("spawn");
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
    for (ledger, _server) in stores(&scratch) {
        let effects_file = scratch.path(&format!("effects-{}.log", ledger.len()));
        let run = run_id("kill");
        kill_after_dispatch(&ledger, &effects_file, &run, &LEASE);
        // The dead worker's key is held until its lease ends (a kill leaves
        // no time to abandon it); then the restarted worker takes it over in
        // doubt, verifies, and finds it applied.
        std::thread::sleep(LEASE_ENDS);
        let args = ["--from", "0", "--to", "1", LEASE[0], LEASE[1]];
        let again = worker(&ledger, &effects_file, &run, &args).spawn().expect("spawn");
        let lines = finish(again);
        assert!(lines[0].ends_with("success Verifier"), "{ledger}: {lines:?}");
        assert_eq!(effects(&effects_file).values().sum::<usize>(), 1, "{ledger}: not sent again");

        // Irreversible, and the verifier cannot tell: a person is asked.
        let run = run_id("kill-blind");
        let blind = ["--class", "irreversible", "--verifier", "blind", LEASE[0], LEASE[1]];
        kill_after_dispatch(&ledger, &effects_file, &run, &blind);
        std::thread::sleep(LEASE_ENDS);
        let mut args = vec!["--from", "0", "--to", "1"];
        args.extend_from_slice(&blind);
        let lines = finish(worker(&ledger, &effects_file, &run, &args).spawn().expect("spawn"));
        assert!(lines[0].ends_with("escalated"), "{ledger}: {lines:?}");
        assert_eq!(effects(&effects_file).values().sum::<usize>(), 2, "{ledger}: one per run");
    }
}

#[test]
fn a_redis_outage_refuses_calls_dispatches_nothing_and_loses_nothing() {
    let Some(mut redis) = RedisServer::private() else { return };
    let scratch = Scratch::new("outage");
    let effects_file = scratch.path("effects.log");
    let run = run_id("outage");
    let args = ["--from", "0", "--to", "30", "--pause-ms", "100"];
    let mut child = worker(&redis.url, &effects_file, &run, &args).spawn().expect("spawn");
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
        worker(&redis.url, &effects_file, &run, &["--from", "0", "--to", "30"])
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
/// the effect (it did). `store` says where both write their effect, `pause`
/// how P pauses and what it asks. Answers the key and P's outcome line.
fn paused_past_the_lease(
    ledger: &str,
    effects_file: &Path,
    store: &[&str],
    pause: &[&str],
) -> (String, String) {
    let run = run_id("pause");
    let mut p_args = vec!["--from", "0", "--to", "1", "--lease-ms", "1000"];
    p_args.extend_from_slice(store);
    p_args.extend_from_slice(pause);
    let mut p = worker(ledger, effects_file, &run, &p_args).spawn().expect("spawn P");
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
    q_args.extend_from_slice(store);
    let q = finish(worker(ledger, effects_file, &run, &q_args).spawn().expect("spawn Q"));
    assert!(q[0].contains(" success "), "{ledger}: Q took the key over and sent: {q:?}");
    signal(p.id(), "-CONT");
    let outcome = p_lines.next().expect("P's outcome").expect("utf-8");
    assert!(p.wait().expect("P ends").success());
    assert!(
        outcome.contains(" unknown") || outcome.contains(" success "),
        "{ledger}: P must not say the effect did not happen: {outcome}"
    );
    (key, outcome)
}

/// Issue 20, case 2: a worker paused past its lease with a request in hand.
/// Fencing stops it from recording, not from sending: without a check (the
/// control) its late write is a second effect; asking right before it sends
/// (the attempt's deadline, free; or the ledger's `Holder`, one read) it
/// sends nothing. Either way it never reports the effect as not applied.
#[test]
fn a_worker_paused_past_its_lease_asks_before_it_sends_and_never_says_not_applied() {
    let scratch = Scratch::new("pause");
    for (ledger, _server) in stores(&scratch) {
        for check in ["none", "deadline", "holder"] {
            let effects_file = scratch.path(&format!("effects-{check}-{}.log", ledger.len()));
            let pause = ["--stop-before-send", "--check", check];
            let (key, outcome) = paused_past_the_lease(&ledger, &effects_file, &[], &pause);
            let sent = effects(&effects_file).get(&key).copied().unwrap_or(0);
            println!("{ledger}, --check {check}: {sent} effect(s); P: {outcome}");
            let expected = if check == "none" { 2 } else { 1 };
            assert_eq!(
                sent, expected,
                "{ledger}, --check {check}: effects of the key; P: {outcome}"
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
/// the database checking it, P's late write is refused: one row, Q's.
#[test]
fn a_late_write_after_the_question_is_refused_by_a_fence_at_the_resource() {
    let scratch = Scratch::new("fence");
    for (ledger, _server) in stores(&scratch) {
        for (write, table) in [("plain", "effects"), ("fenced", "fenced_effects")] {
            let db = scratch.path(&format!("effects-{write}-{}.db", ledger.len()));
            let store = ["--effects-db", "--write", write];
            let pause = ["--check", "holder", "--stop-after-check"];
            let (key, outcome) = paused_past_the_lease(&ledger, &db, &store, &pause);
            let rows = rows(&db, table, &key);
            println!("{ledger}, --write {write}: rows {rows:?}; P: {outcome}");
            match write {
                "plain" => assert_eq!(rows.len(), 2, "{ledger}: the control writes twice"),
                _ => {
                    assert_eq!(rows.len(), 1, "{ledger}: one row per key");
                    let (_, fence) = rows[0];
                    assert!(fence > 0, "{ledger}: written under a fence: {rows:?}");
                    assert!(
                        outcome.contains(" unknown"),
                        "{ledger}: P's refused write is not a success of P's: {outcome}"
                    );
                }
            }
        }
    }
}
