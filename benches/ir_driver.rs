//! A driver for instruction counts under callgrind: runs one operation of
//! the success path N times (after an optional prefill of the ledger), so
//! that Ir per call is `(Ir(N = 11 000) − Ir(N = 1 000)) / 10 000`, start-up
//! cancelled out. Instruction counts repeat exactly whatever the machine's
//! load, unlike times.
//!
//! ```text
//! cargo bench -p verified-tools-benches --bench ir_driver --no-run
//! valgrind --tool=callgrind --callgrind-out-file=/dev/null target/release/deps/ir_driver-* <op> <N> [prefill]
//! ```
//!
//! Operations: `raw` (the tool alone), `rawkey_step`, `rawkey_bucket` (the
//! tool and one key derivation, durable or time-bucket scope: the floors),
//! `off` (engine, no ledger, durable scope), `step` (engine and the memory
//! ledger, durable scope), `default` (`Context::new`: the memory ledger and
//! the 5-minute bucket scope); `off_traced` and `default_traced`: the same
//! with a `tracing` subscriber installed (`tracing_subscriber::registry()`,
//! no layer: what any subscriber costs before it does anything);
//! `toolset`: `ToolSet::call` of the same tool made with
//! `#[verified_tool(schema)]`, JSON arguments and a tool-call id per call
//! (`Context::new`'s memory ledger), against its floor `toolset_floor`:
//! `DraftArgs::deserialize` of the same JSON `Value`, the tool, and one key
//! derivation in the tool-call scope; `pg_tx` and `pg_raw` (against the
//! PostgreSQL server of `VT_POSTGRES_URL`): a transactional call
//! (`PostgresLedger::transact` of one `INSERT`, a step key per call) and
//! the raw `BEGIN; INSERT; COMMIT` it wraps, each on a client of its own:
//! the client's instructions per call (the server's work is another
//! process's); `pg_pairs N`: N interleaved pairs of both. Each prints the
//! quantiles of its calls' times (meaningful natively, not under
//! callgrind).

use std::hint::black_box;
use std::sync::Arc;

use serde::Deserialize;
use verified_tools::ledger::MemoryLedger;
use verified_tools::toolset::Status;
use verified_tools::{Clock, Context, IdempotencyKey, KeyScope, SystemClock};
use verified_tools_benches::{DraftArgs, call, draft, draft_json, save_draft, tool_set};

fn main() {
    let mut args = std::env::args().skip(1).filter(|a| !a.starts_with("--"));
    let (Some(op), Some(n)) = (args.next(), args.next().and_then(|n| n.parse::<u64>().ok())) else {
        eprintln!(
            "usage: ir_driver <raw|rawkey_step|rawkey_bucket|off|step|default>[_traced]|toolset|toolset_floor|pg_tx|pg_raw|pg_pairs <N> [prefill]"
        );
        return;
    };
    match op.as_str() {
        "pg_tx" => return postgres(Pg::Tx, n),
        "pg_raw" => return postgres(Pg::Raw, n),
        "pg_pairs" => return postgres(Pg::Pairs, n),
        _ => {}
    }
    let prefill: u64 = args.next().and_then(|p| p.parse().ok()).unwrap_or(0);
    let op = match op.strip_suffix("_traced") {
        Some(untraced) => {
            use tracing_subscriber::util::SubscriberInitExt as _;
            tracing_subscriber::registry().init();
            untraced.to_owned()
        }
        None => op,
    };
    let rt = tokio::runtime::Builder::new_current_thread().enable_time().build().expect("runtime");
    let ledger = Arc::new(MemoryLedger::new());
    let cx = match op.as_str() {
        "default" => Context::new("bench-agent").with_ledger(ledger.clone()),
        "step" => Context::new("bench-agent").with_ledger(ledger.clone()),
        _ => Context::new("bench-agent").without_ledger().for_step("run-1", 1),
    };
    let (step, bucket) = (KeyScope::durable("run-1", 1), KeyScope::DEFAULT);
    // `step`: a step per call (one step with other arguments is a key
    // reused). The contexts are made before the loop, as many for N = 1 000
    // as for N = 11 000, so that making them cancels out of the difference.
    let steps: Vec<Context> = match op.as_str() {
        "step" => (0..n.max(11_000)).map(|i| cx.for_step("run-1", i)).collect(),
        _ => Vec::new(),
    };
    // `toolset`: the arguments and ids made before the loop, likewise.
    let json: Vec<(serde_json::Value, String, KeyScope)> = match op.as_str() {
        "toolset" | "toolset_floor" => (0..n.max(11_000))
            .map(|i| {
                let id = format!("call_{i}");
                (draft_json(i), id.clone(), KeyScope::tool_call(id))
            })
            .collect(),
        _ => Vec::new(),
    };
    let set = tool_set(Context::new("bench-agent").with_ledger(ledger.clone()));
    rt.block_on(async {
        for i in 0..prefill {
            assert!(call(&cx, u64::MAX - i).await.is_success());
        }
        for i in 0..n {
            let args = draft(i);
            match op.as_str() {
                "raw" => {
                    black_box(save_draft(&args).await.ok());
                }
                "rawkey_step" => {
                    black_box(
                        IdempotencyKey::derive("bench-agent", "save_draft", &args, &step, 0).ok(),
                    );
                    black_box(save_draft(&args).await.ok());
                }
                "rawkey_bucket" => {
                    let now = SystemClock.unix_ms();
                    black_box(
                        IdempotencyKey::derive("bench-agent", "save_draft", &args, &bucket, now)
                            .ok(),
                    );
                    black_box(save_draft(&args).await.ok());
                }
                "step" => assert!(call(&steps[i as usize], i).await.is_success()),
                "toolset" => {
                    let (args, id, _) = &json[i as usize];
                    let outcome = set.call("save_draft_json", args, id).await;
                    assert_eq!(outcome.status, Status::Success, "{outcome:?}");
                }
                "toolset_floor" => {
                    let (args, _, scope) = &json[i as usize];
                    let args = DraftArgs::deserialize(args).expect("the arguments");
                    black_box(
                        IdempotencyKey::derive("bench-agent", "save_draft_json", &args, scope, 0)
                            .ok(),
                    );
                    black_box(black_box(args.user) ^ args.seq);
                }
                _ => assert!(call(&cx, i).await.is_success()),
            }
        }
    });
}

static PAY: verified_tools::ToolSpec =
    verified_tools::ToolSpec::new("pay", verified_tools::SideEffect::High);

/// Which side of [`postgres`] runs.
#[derive(Clone, Copy, PartialEq)]
enum Pg {
    /// Transactional calls only.
    Tx,
    /// Raw transactions only.
    Raw,
    /// Both, interleaved, each on a client of its own; quantiles printed.
    Pairs,
}

/// `n` transactional calls, raw transactions, or pairs of both, each an
/// `INSERT` into a table of a scratch schema, dropped at the end.
fn postgres(which: Pg, n: u64) {
    use tokio_postgres::NoTls;
    use verified_tools::ledger::{PostgresLedger, TxError};
    let Ok(url) = std::env::var("VT_POSTGRES_URL") else {
        eprintln!("ir_driver pg_*: set VT_POSTGRES_URL (`eval \"$(bash .ci/postgres.sh)\"`)");
        return;
    };
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime");
    rt.block_on(async {
        let schema = format!("vt_ir_{}", std::process::id());
        let ledger =
            PostgresLedger::builder().with_schema(&schema).connect(&url).await.expect("postgres");
        let connect = || async {
            let (client, connection) =
                tokio_postgres::connect(&url, NoTls).await.expect("postgres");
            tokio::spawn(connection);
            client
        };
        let (mut ours, mut theirs) = (connect().await, connect().await);
        let table = format!("\"{schema}\".payments");
        ours.batch_execute(&format!("CREATE TABLE {table} (id bigserial PRIMARY KEY, n bigint)"))
            .await
            .expect("the table");
        let insert = format!("INSERT INTO {table} (n) VALUES ($1)");
        let insert = insert.as_str();
        let cx = Context::new("bench-agent");
        let mut times = [Vec::new(), Vec::new()];
        let rounds = if which == Pg::Pairs { 2 * n } else { n };
        for i in 0..rounds {
            let tx = match which {
                Pg::Pairs => i % 2 == 0,
                side => side == Pg::Tx,
            };
            let started = std::time::Instant::now();
            let value = i64::try_from(i).unwrap_or(i64::MAX);
            if tx {
                let cx = cx.for_step("pay", i);
                let paid: verified_tools::ToolResult<(), TxError<tokio_postgres::Error>> = ledger
                    .transact(&cx, &PAY, &mut ours, &i, &i, |tx| {
                        Box::pin(async move {
                            tx.execute(insert, &[&value]).await?;
                            Ok(())
                        })
                    })
                    .await;
                assert!(paid.is_success(), "{paid:?}");
            } else {
                let t = theirs.transaction().await.expect("BEGIN");
                t.execute(insert, &[&value]).await.expect("INSERT");
                t.commit().await.expect("COMMIT");
            }
            times[usize::from(!tx)].push(started.elapsed());
        }
        for (name, t) in ["transactional", "raw"].iter().zip(&mut times) {
            if !t.is_empty() {
                t.sort();
                let q = |p: usize| t[(t.len() - 1) * p / 100];
                println!("{name}: p10 {:?} p50 {:?} p90 {:?} p99 {:?}", q(10), q(50), q(90), q(99));
            }
        }
        ours.batch_execute(&format!("DROP SCHEMA \"{schema}\" CASCADE")).await.expect("drop");
    });
}
