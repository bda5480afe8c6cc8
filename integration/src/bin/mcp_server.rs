//! The simulator's CRM and invoice tools as an MCP server, with their faults.
//!
//! ```text
//! cargo run -p integration --bin mcp_server                         # stdio, medium faults, seed 42
//! cargo run -p integration --bin mcp_server -- --level extreme --seed 7
//! cargo run -p integration --bin mcp_server -- --http 127.0.0.1:8080 # streamable HTTP at /mcp
//! VT_MCP_TOKEN=s3cret cargo run -p integration --bin mcp_server -- --http 0.0.0.0:8080 \
//!     --allowed-host mcp.example:8080                                 # bearer token required
//! cargo run -p integration --bin mcp_server -- --conformance --http 127.0.0.1:8080
//!                                         # the MCP conformance suite's fixture (.ci/conformance.sh)
//! ```
//!
//! Over HTTP, a client must send `Authorization: Bearer $VT_MCP_TOKEN` when
//! that variable is set (its calls are keyed for the principal `token`);
//! without it, the server authenticates no one, which it accepts on a
//! loopback address only, unless `--allow-unauthenticated` says so. Browser
//! origins other than this machine's are refused (`--allowed-origin` adds
//! others), and so are `Host` names other than loopback ones
//! (`--allowed-host`).
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
use verified_tools::mcp::rmcp::ServiceExt as _;
use verified_tools::mcp::{BearerToken, McpServer, Principal};

#[path = "../conformance.rs"]
mod conformance;
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
    /// Serve HTTP on a non-loopback address without authentication
    /// (`VT_MCP_TOKEN` unset): anyone who reaches the port can call the
    /// tools.
    #[arg(long)]
    allow_unauthenticated: bool,
    /// A browser origin to accept over HTTP (`http://host:port`,
    /// `https://host:*`, `null`), in place of this machine's; repeatable.
    #[arg(long = "allowed-origin", value_name = "ORIGIN")]
    allowed_origins: Vec<String>,
    /// A `Host` to accept over HTTP (`host` or `host:port`), in place of the
    /// loopback names; repeatable.
    #[arg(long = "allowed-host", value_name = "HOST")]
    allowed_hosts: Vec<String>,
    /// Serve the fixture tools of the official MCP conformance suite
    /// (`@modelcontextprotocol/conformance server --url`) instead of the
    /// simulator's.
    #[arg(long)]
    conformance: bool,
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

/// The variable that holds the bearer token HTTP clients must send: read
/// from the environment, since a command line is visible to every user of
/// the machine (`ps`).
const TOKEN_VAR: &str = "VT_MCP_TOKEN";

fn main() -> ExitCode {
    let args = Args::parse();
    let token = std::env::var(TOKEN_VAR).ok().filter(|t| !t.is_empty());
    if let Some(addr) = args.http {
        match (&token, addr.ip().is_loopback(), args.allow_unauthenticated) {
            (Some(_), _, _) => {
                eprintln!(
                    "mcp_server: HTTP clients authenticate with the bearer token of {TOKEN_VAR}"
                )
            }
            (None, true, _) => eprintln!(
                "mcp_server: no authentication ({TOKEN_VAR} unset): only this machine can reach {addr}"
            ),
            (None, false, true) => eprintln!(
                "mcp_server: WARNING: no authentication on {addr} (--allow-unauthenticated): \
                 anyone who reaches it can call the tools"
            ),
            (None, false, false) => {
                eprintln!(
                    "error: refusing to serve {addr} without authentication: set {TOKEN_VAR} \
                     (clients send `Authorization: Bearer <token>`), bind a loopback address, \
                     or pass --allow-unauthenticated"
                );
                return ExitCode::FAILURE;
            }
        }
    }
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
    if args.conformance {
        return report(runtime.block_on(serve_conformance(args, token)));
    }
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
        let mut mcp =
            McpServer::new(tools).with_name("verified-tools-sim", env!("CARGO_PKG_VERSION"));
        if let Some(token) = token {
            mcp = mcp.with_authenticator(BearerToken::new(token, Principal::new("token")));
        }
        if !args.allowed_origins.is_empty() {
            mcp = mcp.with_allowed_origins(args.allowed_origins);
        }
        if !args.allowed_hosts.is_empty() {
            mcp = mcp.with_allowed_hosts(args.allowed_hosts);
        }
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
    report(served)
}

fn report(served: std::io::Result<()>) -> ExitCode {
    match served {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}

/// The conformance suite's fixture, over HTTP or stdio.
async fn serve_conformance(args: Args, token: Option<String>) -> std::io::Result<()> {
    let mut mcp = McpServer::new(conformance::fixture_tools())
        .with_name("verified-tools-conformance", env!("CARGO_PKG_VERSION"));
    if let Some(token) = token {
        mcp = mcp.with_authenticator(BearerToken::new(token, Principal::new("token")));
    }
    let fixture = conformance::Conformance::new(mcp.clone());
    match args.http {
        Some(addr) => {
            let listener = tokio::net::TcpListener::bind(addr).await?;
            eprintln!(
                "mcp_server: the conformance fixture over streamable HTTP at http://{}/mcp",
                listener.local_addr()?
            );
            mcp.serve_http_of(listener, move || fixture.new_session()).await
        }
        None => {
            eprintln!("mcp_server: the conformance fixture over stdio");
            let running = fixture
                .serve((tokio::io::stdin(), tokio::io::stdout()))
                .await
                .map_err(std::io::Error::other)?;
            running.waiting().await.map(drop).map_err(std::io::Error::other)
        }
    }
}
