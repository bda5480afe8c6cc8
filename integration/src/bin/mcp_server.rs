//! The simulator's CRM and invoice tools as an MCP server, with their faults.
//!
//! ```text
//! cargo run -p integration --bin mcp_server                         # stdio, medium faults, seed 42
//! cargo run -p integration --bin mcp_server -- --level extreme --seed 7
//! cargo run -p integration --bin mcp_server -- --http 127.0.0.1:8080 # streamable HTTP at /mcp
//! ```
//!
//! Every tool is a `#[verified_tool]` of the root package's `src/tools.rs`, listed through
//! `verified_tools_suite::llm::tool_set` and served by
//! `verified_tools::mcp::McpServer`. The simulated server loses answers
//! (timeouts after dispatch, late arrivals), hides writes behind a lagging
//! replica, applies compound writes in part and rejects stale versions, at
//! the rates of the paper's Table 1; a call whose answer is lost comes back
//! `isError: true` with status `unknown` and its key, never as a success.
//! Re-send a call with the same `_meta` `"verified-tools/tool_call_id"` and
//! it is replayed or verified, never executed twice.
//!
//! Runs on the wall clock: a lost answer takes the simulator's timeout
//! (1 s) plus the verifier's reads. Logs go to stderr; stdout is the MCP
//! channel.

use std::process::ExitCode;
use std::time::Duration;

use clap::Parser;
use verified_tools::Context;
use verified_tools::mcp::McpServer;
use verified_tools::sim::{FaultLevel, FaultProfile, SimConfig, SimServer};
use verified_tools_suite::llm::tool_set;
use verified_tools_suite::tools::{SimClient, settle_margin};

/// Serves the simulator's tools over MCP.
#[derive(Debug, Parser)]
#[command(about)]
struct Args {
    /// Fault level: none, low, medium, high or extreme.
    #[arg(long, default_value = "medium")]
    level: String,
    /// The simulator's seed: the faults of the n-th call of each operation
    /// follow from it, so a run is repeatable call by call.
    #[arg(long, default_value_t = verified_tools::sim::BASE_SEED)]
    seed: u64,
    /// Serve streamable HTTP on this address instead of stdio.
    #[arg(long)]
    http: Option<std::net::SocketAddr>,
    /// Latency of every answered call, in milliseconds.
    #[arg(long, default_value_t = 0)]
    latency_ms: u64,
    /// Believe a verifier's `Absent` once the simulator's settle bound has
    /// passed (the experiment's setting): a lost answer is then resolved by
    /// waiting, which takes the attempt's 30 s deadline plus the bound.
    /// Without it (the library's default) such a call ends `unknown`.
    #[arg(long)]
    settle: bool,
}

fn main() -> ExitCode {
    let args = Args::parse();
    let profile = match args.level.as_str() {
        "none" => FaultProfile::NONE,
        level => match level.parse::<FaultLevel>() {
            Ok(level) => level.profile(),
            Err(e) => {
                eprintln!("error: {e}");
                return ExitCode::FAILURE;
            }
        },
    };
    let config =
        SimConfig::new(args.seed, profile).with_latency(Duration::from_millis(args.latency_ms));
    let runtime = match tokio::runtime::Builder::new_multi_thread().enable_all().build() {
        Ok(runtime) => runtime,
        Err(e) => {
            eprintln!("error: cannot start the runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    let served = runtime.block_on(async {
        // The simulator keeps its clock from the runtime it starts in.
        let (server, _oracle) = SimServer::new(config);
        let mut context = Context::new("mcp-server");
        if args.settle {
            let margin = settle_margin(&config);
            context = context.map_policies(|_, policy| policy.with_settle(margin));
        }
        // `check_call {key}`: the model's way out of doubt.
        let tools =
            tool_set(SimClient::new(server, true)).with_context(context).with_checks(10_000);
        let count = tools.names().count();
        let mcp = McpServer::new(tools).with_name("verified-tools-sim", env!("CARGO_PKG_VERSION"));
        match args.http {
            Some(addr) => {
                let listener = tokio::net::TcpListener::bind(addr).await?;
                eprintln!(
                    "mcp_server: {count} tools over streamable HTTP at http://{}/mcp \
                     (faults: {}, seed {})",
                    listener.local_addr()?,
                    args.level,
                    args.seed
                );
                mcp.serve_http(listener).await
            }
            None => {
                eprintln!(
                    "mcp_server: {count} tools over stdio (faults: {}, seed {})",
                    args.level, args.seed
                );
                mcp.serve_stdio().await
            }
        }
    });
    match served {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}
