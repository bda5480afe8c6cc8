//! A worker process for `tests/processes.rs` and the README's two-worker
//! demo: makes logical calls of a "send mail" tool through a shared ledger,
//! each effect one line appended to a file the test owns, and prints one
//! line per call.
//!
//! ```text
//! ledger_worker --ledger sqlite:/tmp/l.db|redis://127.0.0.1:6379/|postgres://U@H:P/DB
//!               --effects FILE --run RUN --from 0 --to 50 [--class high|irreversible]
//!               [--verifier by_key|blind] [--crash-after-dispatch]
//!               [--lease-ms 3000] [--pause-ms 0]
//!               [--stop-before-send | --stop-after-check] [--check none|deadline|holder]
//!               [--effects-db | --effects-pg URL] [--write plain|fenced|transactional]
//!               [--pg-schema SCHEMA]
//! ```
//!
//! Call `i` is keyed by `(RUN, i)`. The tool appends `KEY PID` to the effects
//! file (one `write` in append mode: atomic for lines this short). The
//! `by_key` verifier looks its key up in that file (a read-your-writes read);
//! `blind` always answers `Unknown`. With `--crash-after-dispatch` the worker
//! prints `dispatched KEY` after the first effect and hangs, for the test to
//! `kill -9` it before it records the outcome. With `--stop-before-send` the
//! tool prints `stopping KEY` and stops its own process (SIGSTOP) before it
//! writes, as a worker paused with a request in hand; once continued
//! (SIGCONT), it asks whether it still holds the key as `--check` says
//! (`deadline`: the attempt's deadline has not passed; `holder`: the ledger
//! says so) and writes only then; `none` writes blindly. With
//! `--stop-after-check` it asks first, then stops, then writes: the window
//! no question closes. With `--effects-db` the effect is a row in an SQLite
//! file instead (`effects.rs`): `--write plain` inserts it, `--write fenced`
//! writes it under the call's fence, and the database refuses a write under
//! an older fence than the row's. With `--effects-pg URL` the rows are in
//! a PostgreSQL database instead (the same two tables, the same two modes),
//! and a third mode: `--write transactional` inserts the plain row in one
//! transaction with the call's ledger record (`transactional.rs`; the
//! ledger must be on the same database).
//!
//! A PostgreSQL ledger is named by a URL (`postgres://`, `postgresql://`,
//! as `VT_POSTGRES_URL` has it) or by `postgres:` and tokio-postgres's
//! `key=value` pairs (`postgres:host=127.0.0.1 port=5432 user=postgres`).
//! Its tables, and the effects tables of `--effects-pg`, are in schema
//! `--pg-schema` (`public` by default), created if missing: a test keeps its
//! runs apart with a schema of its own.

use std::io::Write as _;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

#[path = "ledger_worker/effects.rs"]
mod effects;
#[path = "ledger_worker/transactional.rs"]
mod transactional;

use effects::{Store, Write};
use verified_tools::engine::{self, Attempt};
use verified_tools::ledger::{Codec, Ledger, PostgresLedger, RedisLedger, SqliteLedger};
use verified_tools::{
    Context, ErrorClass, IdempotencyKey, InFlight, RetryPolicy, SideEffect, ToolResult, ToolSpec,
    Verdict,
};

static SEND_HIGH: ToolSpec = ToolSpec::new("send_mail", SideEffect::High).with_verifier();
static SEND_IRREVERSIBLE: ToolSpec =
    ToolSpec::new("send_mail", SideEffect::Irreversible).with_verifier();
static SEND_ASKING: ToolSpec = SEND_HIGH.with_holder();

/// What the tool asks before it writes, after a stop.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Check {
    None,
    Deadline,
    Holder,
}

struct Args {
    ledger: String,
    effects: PathBuf,
    run: String,
    from: u64,
    to: u64,
    irreversible: bool,
    blind: bool,
    crash: bool,
    lease: Duration,
    pause: Duration,
    stop: bool,
    stop_late: bool,
    check: Check,
    db: bool,
    pg_effects: Option<String>,
    pg_schema: String,
    write: Write,
    /// `--write transactional`: the row and the record in one transaction.
    transactional: bool,
}

fn args() -> Result<Args, String> {
    let mut a = Args {
        ledger: String::new(),
        effects: PathBuf::new(),
        run: "run".into(),
        from: 0,
        to: 1,
        irreversible: false,
        blind: false,
        crash: false,
        lease: Duration::from_secs(3),
        pause: Duration::ZERO,
        stop: false,
        stop_late: false,
        check: Check::None,
        db: false,
        pg_effects: None,
        pg_schema: PostgresLedger::DEFAULT_SCHEMA.to_owned(),
        write: Write::Plain,
        transactional: false,
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let mut value = || it.next().ok_or(format!("{flag} needs a value"));
        let ms = |v: String| v.parse().map(Duration::from_millis).map_err(|e| format!("{e}"));
        match flag.as_str() {
            "--ledger" => a.ledger = value()?,
            "--effects" => a.effects = value()?.into(),
            "--run" => a.run = value()?,
            "--from" => a.from = value()?.parse().map_err(|e| format!("--from: {e}"))?,
            "--to" => a.to = value()?.parse().map_err(|e| format!("--to: {e}"))?,
            "--class" => a.irreversible = value()? == "irreversible",
            "--verifier" => a.blind = value()? == "blind",
            "--crash-after-dispatch" => a.crash = true,
            "--lease-ms" => a.lease = ms(value()?)?,
            "--pause-ms" => a.pause = ms(value()?)?,
            "--stop-before-send" => a.stop = true,
            "--stop-after-check" => a.stop_late = true,
            "--effects-db" => a.db = true,
            "--effects-pg" => a.pg_effects = Some(value()?),
            "--pg-schema" => a.pg_schema = value()?,
            "--write" => match value()?.as_str() {
                "transactional" => a.transactional = true,
                other => a.write = Write::parse(other)?,
            },
            "--check" => {
                a.check = match value()?.as_str() {
                    "none" => Check::None,
                    "deadline" => Check::Deadline,
                    "holder" => Check::Holder,
                    other => return Err(format!("--check {other}: none, deadline or holder")),
                }
            }
            other => return Err(format!("unknown flag {other}")),
        }
    }
    Ok(a)
}

async fn open(spec: &str, lease: Duration, schema: &str) -> Result<Arc<dyn Ledger>, String> {
    if let Some(path) = spec.strip_prefix("sqlite:") {
        let ledger = SqliteLedger::open(path).map_err(|e| e.to_string())?.with_lease(lease);
        return Ok(Arc::new(ledger));
    }
    if spec.starts_with("redis://") {
        let ledger = RedisLedger::connect(spec).await.map_err(|e| e.to_string())?;
        return Ok(Arc::new(ledger.with_lease(lease)));
    }
    let postgres = if spec.starts_with("postgres://") || spec.starts_with("postgresql://") {
        Some(spec)
    } else {
        spec.strip_prefix("postgres:")
    };
    if let Some(url) = postgres {
        let builder = PostgresLedger::builder().with_schema(schema);
        let ledger = builder.connect(url).await.map_err(|e| e.to_string())?;
        return Ok(Arc::new(ledger.with_lease(lease)));
    }
    Err(format!(
        "--ledger {spec}: expected sqlite:PATH, redis://HOST:PORT/, postgres://USER@HOST:PORT/DB \
         or postgres:KEY=VALUE .."
    ))
}

/// What the tool does besides writing its effect.
#[derive(Debug, Clone, Copy)]
struct Mode {
    crash: bool,
    stop: bool,
    stop_late: bool,
    check: Check,
}

/// Stops this process (SIGSTOP), for the test to continue it (SIGCONT):
/// a worker paused at a point the test knows.
pub(crate) fn stop_here(key: IdempotencyKey) -> bool {
    println!("stopping {key}");
    let _ = std::io::stdout().flush();
    let pid = std::process::id().to_string();
    let stopped = std::process::Command::new("kill").args(["-STOP", &pid]).status();
    stopped.is_ok_and(|status| status.success())
}

/// "Am I still the holder?", as `--check` says.
async fn still_holds(attempt: &Attempt, check: Check) -> bool {
    match check {
        Check::None => true,
        Check::Deadline => !attempt.deadline.has_passed(),
        Check::Holder => attempt.holder.ensure(attempt.deadline.remaining()).await.is_ok(),
    }
}

/// One effect, in the store.
async fn send(store: &Store, attempt: Attempt, mode: Mode) -> Result<(), ErrorClass> {
    // Paused with the request in hand (before the question, or between it
    // and the write), the process stops itself, so the test knows where.
    if mode.stop && !stop_here(attempt.key) {
        return Err(ErrorClass::NotSent);
    }
    if !still_holds(&attempt, mode.check).await {
        return Err(ErrorClass::NotSent);
    }
    if mode.stop_late && !stop_here(attempt.key) {
        return Err(ErrorClass::NotSent);
    }
    store.write(attempt.key, attempt.holder.fence()).await?;
    if mode.crash {
        println!("dispatched {}", attempt.key);
        let _ = std::io::stdout().flush();
        std::future::pending::<()>().await;
    }
    Ok(())
}

/// The postcondition, read from the store by the call's key.
async fn sent(store: &Store, key: IdempotencyKey, blind: bool) -> Verdict<()> {
    if blind {
        return Verdict::Unknown;
    }
    store.holds(key).await
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> std::process::ExitCode {
    let args = match args() {
        Ok(args) => args,
        Err(e) => {
            eprintln!("ledger_worker: {e}");
            return std::process::ExitCode::from(2);
        }
    };
    let ledger = match open(&args.ledger, args.lease, &args.pg_schema).await {
        Ok(ledger) => ledger,
        Err(e) => {
            eprintln!("ledger_worker: {e}");
            return std::process::ExitCode::from(3);
        }
    };
    // The call's deadline stays within the lease; the effect file settles at once.
    let policy = |class| {
        RetryPolicy::for_class(class)
            .with_attempt_timeout(Some(Duration::from_millis(500)))
            .with_call_timeout(args.lease)
            .with_settle(Some(Duration::ZERO))
    };
    let cx = Context::new("mailer")
        .with_ledger(ledger)
        .map_policies(|class, _| policy(class))
        .with_in_flight(InFlight::Wait { poll: Duration::from_millis(20), max: args.lease * 3 });
    // A fenced write and the holder's question need the call's hold.
    let asks = args.check == Check::Holder || args.write == Write::Fenced;
    let spec = match (args.irreversible, asks) {
        (true, _) => &SEND_IRREVERSIBLE,
        (false, true) => &SEND_ASKING,
        (false, false) => &SEND_HIGH,
    };
    let mode =
        Mode { crash: args.crash, stop: args.stop, stop_late: args.stop_late, check: args.check };
    let store = match (&args.pg_effects, args.db) {
        (Some(url), _) => match effects::Postgres::open(url, &args.pg_schema) {
            Ok(db) => Store::Postgres(db, args.write),
            Err(e) => {
                eprintln!("ledger_worker: {e}");
                return std::process::ExitCode::from(3);
            }
        },
        (None, true) => Store::Sqlite(args.effects.clone(), args.write),
        (None, false) => Store::File(args.effects.clone()),
    };
    let mut tx = None;
    if args.transactional {
        let url = args.pg_effects.as_deref().unwrap_or_default();
        let ledger = PostgresLedger::builder().with_schema(&args.pg_schema).connect(url).await;
        match ledger {
            Ok(ledger) if args.ledger.contains(url) => {
                tx = Some((ledger.with_lease(args.lease), transactional::Connection::new(url)));
            }
            _ => {
                eprintln!(
                    "ledger_worker: --write transactional needs --effects-pg URL and a \
                     --ledger on the same database"
                );
                return std::process::ExitCode::from(2);
            }
        }
    }
    for step in args.from..args.to {
        let cx = cx.for_step(args.run.as_str(), step);
        if let Some((ledger, connection)) = &mut tx {
            let sent = transactional::send(
                ledger,
                &cx,
                &SEND_HIGH,
                connection,
                &args.pg_schema,
                step,
                mode,
            )
            .await;
            let outcome = match &sent {
                Ok(ToolResult::Success { proof, .. }) => format!("success {proof:?}"),
                Ok(ToolResult::Refused(e)) => format!("refused {e}"),
                Ok(other) => other.label().to_owned(),
                Err(e) => format!("refused no connection: {e}"),
            };
            let key = sent.as_ref().ok().and_then(ToolResult::key);
            println!("{step} {} {outcome}", key.map_or_else(String::new, |k| k.to_string()));
            let _ = std::io::stdout().flush();
            continue;
        }
        let result: ToolResult<(), ErrorClass> = engine::call(
            &cx,
            spec,
            &("welcome", step),
            &(),
            |attempt| send(&store, attempt, mode),
            Some(|key| sent(&store, key, args.blind)),
            Codec::serde(),
        )
        .await;
        let outcome = match &result {
            ToolResult::Success { proof, .. } => format!("success {proof:?}"),
            ToolResult::Refused(e) => format!("refused {e}"),
            other => other.label().to_owned(),
        };
        println!("{step} {} {outcome}", result.key().map_or_else(String::new, |k| k.to_string()));
        let _ = std::io::stdout().flush();
        if !args.pause.is_zero() {
            tokio::time::sleep(args.pause).await;
        }
    }
    std::process::ExitCode::SUCCESS
}
