//! Human escalation: irreversible actions whose outcome was not proven.

use std::sync::{Mutex, PoisonError};

use serde::Serialize;

use crate::{IdempotencyKey, Verdict};

/// An irreversible call handed to a person.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Ticket {
    /// The call's key: the person checks the effect with it.
    pub key: IdempotencyKey,
    /// The tool.
    pub tool: &'static str,
    /// The agent.
    pub agent: String,
    /// The last verdict (`Absent`: a retry would be needed; `Unknown`).
    pub verdict: Verdict,
    /// What went wrong, in words.
    pub cause: String,
    /// The call's arguments as a JSON object, secrets redacted.
    pub args: Option<serde_json::Value>,
}

/// Where escalations go: a queue, a pager, a ticketing system.
pub trait Escalation: Send + Sync {
    /// Hands a call to a person. Must not block for long.
    fn escalate(&self, ticket: Ticket);
}

/// An in-memory escalation queue.
#[derive(Debug, Default)]
pub struct MemoryEscalations {
    tickets: Mutex<Vec<Ticket>>,
}

impl MemoryEscalations {
    /// An empty queue.
    pub fn new() -> Self {
        Self::default()
    }

    /// Takes the pending tickets out of the queue.
    pub fn take(&self) -> Vec<Ticket> {
        std::mem::take(&mut *self.tickets.lock().unwrap_or_else(PoisonError::into_inner))
    }
}

impl Escalation for MemoryEscalations {
    fn escalate(&self, ticket: Ticket) {
        self.tickets.lock().unwrap_or_else(PoisonError::into_inner).push(ticket);
    }
}
