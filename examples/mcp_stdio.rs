//! One's own verified tools as an MCP server over stdio, what desktop hosts
//! and agent frameworks launch.
//!
//! ```text
//! cargo build --example mcp_stdio --features examples
//! ```
//!
//! Then give the host the binary, e.g. in Claude Desktop's
//! `claude_desktop_config.json`:
//!
//! ```json
//! {"mcpServers": {"helpdesk": {"command": "/path/to/target/debug/examples/mcp_stdio"}}}
//! ```
//!
//! `tools/list` lists `open_ticket`, `find_tickets` and `check_call`, with
//! their schemas and the annotations of their side-effect classes. A
//! `tools/call` answers with the outcome as `structuredContent`; anything
//! but a success is `isError: true` with an instruction for the model. A
//! ticket asked for twice (the same customer and title, whatever the
//! request) is opened once: the second call is replayed (`proof: "ledger"`).

use std::sync::Mutex;

use serde::Serialize;
use verified_tools::mcp::McpServer;
use verified_tools::toolset::ToolSet;
use verified_tools::{Classify, ErrorClass, Verdict, verified_tool};

/// A support ticket.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, schemars::JsonSchema)]
pub struct Ticket {
    /// Its number.
    pub id: u64,
    /// The customer it is for.
    pub customer: u64,
    /// What it is about.
    pub title: String,
}

/// The helpdesk the tools work on (here in memory; a real one is a client
/// of the helpdesk's API, as in `examples/backend.rs`).
#[derive(Default)]
pub struct Helpdesk {
    tickets: Mutex<Vec<Ticket>>,
}

/// What the helpdesk refuses.
#[derive(Debug, thiserror::Error)]
pub enum HelpdeskError {
    /// A ticket without a title.
    #[error("a ticket needs a title")]
    NoTitle,
}

impl Classify for HelpdeskError {
    fn classify(&self) -> ErrorClass {
        // Refused before anything was done: the same call fails again.
        ErrorClass::Definitive
    }
}

/// Opens a support ticket for a customer. Asking again for the same
/// customer and title does not open a second one.
#[verified_tool(
    side_effect = "high",
    verify = ticket_open,
    skip(desk),
    key(customer, title),
    schema = true,
    params(customer = "The customer's id.", title = "What the ticket is about, in a line.")
)]
pub async fn open_ticket(
    desk: &Helpdesk,
    customer: u64,
    title: &str,
) -> Result<Ticket, HelpdeskError> {
    if title.trim().is_empty() {
        return Err(HelpdeskError::NoTitle);
    }
    let mut tickets = desk.tickets.lock().unwrap();
    let ticket = Ticket { id: tickets.len() as u64 + 1, customer, title: title.to_owned() };
    tickets.push(ticket.clone());
    Ok(ticket)
}

/// Read-only: the ticket for this customer and title, if there is one.
async fn ticket_open(desk: &Helpdesk, customer: &u64, title: &str) -> Verdict<Ticket> {
    let tickets = desk.tickets.lock().unwrap();
    tickets.iter().find(|t| t.customer == *customer && t.title == title).cloned().into()
}

/// Lists a customer's tickets.
#[verified_tool(
    side_effect = "none",
    skip(desk),
    schema = true,
    params(customer = "The customer's id.")
)]
pub async fn find_tickets(desk: &Helpdesk, customer: u64) -> Result<Vec<Ticket>, HelpdeskError> {
    let tickets = desk.tickets.lock().unwrap();
    Ok(tickets.iter().filter(|t| t.customer == customer).cloned().collect())
}

/// The server: the tools over one helpdesk, with `check_call`.
pub fn server(desk: Helpdesk) -> McpServer<Helpdesk> {
    let tools =
        ToolSet::new(desk).with(open_ticket_tool()).with(find_tickets_tool()).with_checks(1000);
    McpServer::new(tools).with_name("helpdesk", env!("CARGO_PKG_VERSION"))
}

#[tokio::main]
async fn main() -> std::io::Result<()> {
    // stdout is the MCP channel: anything else goes to stderr.
    eprintln!("helpdesk: MCP over stdio; close stdin to stop");
    server(Helpdesk::default()).serve_stdio().await
}
