//! The operator's command over a ledger: list the calls in doubt, show one,
//! resolve one by a person's recorded decision (the logic is
//! `verified_tools_suite::ops`).
//!
//! ```text
//! cargo run --example ledger --features sqlite -- --ledger sqlite:PATH list [--limit N]
//! cargo run --example ledger --features sqlite -- --ledger sqlite:PATH show KEY
//! cargo run --example ledger --features sqlite -- --ledger sqlite:PATH \
//!     resolve KEY --applied|--not-applied --by NAME [--note TEXT] [--audit FILE]
//! cargo run --example ledger --features redis -- --ledger redis://127.0.0.1:6379/ [--prefix vt:] list
//! ```
//!
//! `--json` prints JSON lines. A decision is printed as one JSON line and
//! appended to `--audit FILE`. Anything refused (a record not in doubt, a
//! key without record) exits with 1, a malformed command line with 2.

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::{Parser, Subcommand};
use verified_tools::IdempotencyKey;
use verified_tools::ledger::Resolution;
use verified_tools_suite::ops::{self, Command, Decision, Options, Store};

/// Lists, shows and resolves the calls in doubt of a ledger.
#[derive(Debug, Parser)]
#[command(version, about)]
struct Args {
    /// Where the records are: sqlite:PATH (feature `sqlite`) or
    /// redis://HOST:PORT/ (feature `redis`).
    #[arg(long)]
    ledger: Store,
    /// Redis: the prefix of the ledger's keys, as the agents set it (`vt:`
    /// by default).
    #[arg(long)]
    prefix: Option<String>,
    /// Print JSON lines.
    #[arg(long, global = true)]
    json: bool,
    #[command(subcommand)]
    command: Cmd,
}

#[derive(Debug, Subcommand)]
enum Cmd {
    /// Lists the calls in doubt (holds past their lease included).
    List {
        /// At most this many.
        #[arg(long, default_value_t = 100)]
        limit: usize,
    },
    /// Shows the record of one key.
    Show {
        /// The key the call's outcome gave: 32 lowercase hex digits.
        key: IdempotencyKey,
    },
    /// Records a person's decision about a call in doubt.
    Resolve {
        /// The key the call's outcome gave: 32 lowercase hex digits.
        key: IdempotencyKey,
        #[command(flatten)]
        decided: Decided,
        /// Who decides (recorded in the audit line).
        #[arg(long)]
        by: String,
        /// Why, or what was looked at.
        #[arg(long)]
        note: Option<String>,
        /// Append the decision's JSON line to this file too.
        #[arg(long)]
        audit: Option<PathBuf>,
        /// How long the resolved record is kept, in seconds (the ledger's
        /// TTL, 24 hours by default).
        #[arg(long, value_name = "SECONDS")]
        ttl: Option<u64>,
    },
}

/// What the person found: exactly one.
#[derive(Debug, clap::Args)]
#[group(required = true, multiple = false)]
struct Decided {
    /// The effect happened: a repeat of the call never dispatches again.
    #[arg(long)]
    applied: bool,
    /// The effect did not happen and cannot still land: a repeat verifies,
    /// then has the key's whole budget.
    #[arg(long)]
    not_applied: bool,
}

fn main() -> ExitCode {
    let args = Args::parse();
    let mut options = Options::new(args.ledger).with_prefix(args.prefix).with_json(args.json);
    let command = match args.command {
        Cmd::List { limit } => Command::List { limit },
        Cmd::Show { key } => Command::Show { key },
        Cmd::Resolve { key, decided, by, note, audit, ttl } => {
            options = options.with_ttl(ttl.map(Duration::from_secs));
            let resolution =
                if decided.applied { Resolution::Applied } else { Resolution::NotApplied };
            Command::Resolve(Decision { key, resolution, by, note, audit })
        }
    };
    match ops::run(&options, &command, &mut std::io::stdout().lock()) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}
