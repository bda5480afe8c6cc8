//! Audit: every state transition of a call as a structured event.

use std::fs::File;
use std::io::{self, BufWriter, Write};
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, PoisonError};
use std::time::Duration;

use serde::Serialize;
use serde_json::value::RawValue;

use crate::{ErrorClass, IdempotencyKey, Verdict};

/// The states of a call, as the engine moves through them.
///
/// `Planned → Dispatched → (PendingVisibility → Dispatched)* →` one of the
/// terminal states. `Refused` ends a call that never dispatched.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum CallState {
    /// Key derived, nothing sent yet.
    Planned,
    /// An attempt was sent.
    Dispatched,
    /// The outcome is ambiguous; the verifier is reading the state.
    PendingVisibility,
    /// The effect is proven (by the response, the verifier or the ledger).
    VerifiedSuccess,
    /// The effect is known not to have happened.
    VerifiedFailure,
    /// The budget ran out in doubt.
    Unknown,
    /// Handed to a person.
    Escalated,
    /// Refused before any dispatch (bad payload, key reuse, in progress).
    Refused,
}

/// One state transition of one call.
#[derive(Debug, Clone, Copy, Serialize)]
pub struct AuditEvent<'a> {
    /// The call's key (none if the payload could not be serialized).
    pub key: Option<IdempotencyKey>,
    /// The tool.
    pub tool: &'static str,
    /// The agent.
    pub agent: &'a str,
    /// Dispatches so far in this call.
    pub attempt: u32,
    /// The state entered.
    pub state: CallState,
    /// The verifier's answer, on `PendingVisibility` events that read it.
    pub verdict: Option<Verdict>,
    /// The class of the error that led here, if any.
    pub error: Option<ErrorClass>,
    /// A short detail: the outcome label or the reason.
    pub detail: Option<&'static str>,
    /// Time since the call started (tokio time, so paused in tests).
    pub elapsed: Duration,
    /// Wall (or virtual) time of the event, ms since the Unix epoch.
    pub at_unix_ms: u64,
    /// The arguments as JSON, secrets redacted; only on `Planned`.
    pub args: Option<&'a RawValue>,
}

/// Receives audit events. Called synchronously from the engine, never while
/// a lock of the engine is held; must not block for long.
pub trait AuditSink: Send + Sync {
    /// Records one event.
    fn record(&self, event: &AuditEvent<'_>);
}

/// An owned copy of an [`AuditEvent`], as [`MemoryAudit`] keeps it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AuditRecord {
    /// See [`AuditEvent::key`].
    pub key: Option<IdempotencyKey>,
    /// See [`AuditEvent::tool`].
    pub tool: &'static str,
    /// See [`AuditEvent::agent`].
    pub agent: String,
    /// See [`AuditEvent::attempt`].
    pub attempt: u32,
    /// See [`AuditEvent::state`].
    pub state: CallState,
    /// See [`AuditEvent::verdict`].
    pub verdict: Option<Verdict>,
    /// See [`AuditEvent::error`].
    pub error: Option<ErrorClass>,
    /// See [`AuditEvent::detail`].
    pub detail: Option<&'static str>,
    /// See [`AuditEvent::elapsed`].
    pub elapsed: Duration,
    /// See [`AuditEvent::args`].
    pub args: Option<String>,
}

/// Keeps events in memory, for tests and small tools.
#[derive(Debug, Default)]
pub struct MemoryAudit {
    events: Mutex<Vec<AuditRecord>>,
}

impl MemoryAudit {
    /// An empty sink.
    pub fn new() -> Self {
        Self::default()
    }

    /// A copy of the events recorded so far.
    pub fn events(&self) -> Vec<AuditRecord> {
        self.events.lock().unwrap_or_else(PoisonError::into_inner).clone()
    }

    /// The states recorded so far, in order.
    pub fn states(&self) -> Vec<CallState> {
        self.events().into_iter().map(|e| e.state).collect()
    }
}

impl AuditSink for MemoryAudit {
    fn record(&self, e: &AuditEvent<'_>) {
        let record = AuditRecord {
            key: e.key,
            tool: e.tool,
            agent: e.agent.to_owned(),
            attempt: e.attempt,
            state: e.state,
            verdict: e.verdict,
            error: e.error,
            detail: e.detail,
            elapsed: e.elapsed,
            args: e.args.map(|a| a.get().to_owned()),
        };
        self.events.lock().unwrap_or_else(PoisonError::into_inner).push(record);
    }
}

/// Appends events to a file, one JSON object per line, flushed per event so
/// a crash loses at most the event being written.
///
/// Write errors never reach the call: they are counted in
/// [`write_errors`](JsonLinesAudit::write_errors).
#[derive(Debug)]
pub struct JsonLinesAudit<W: Write + Send = BufWriter<File>> {
    out: Mutex<W>,
    errors: AtomicU64,
}

impl JsonLinesAudit {
    /// Opens (or creates) `path` for appending.
    pub fn append(path: impl AsRef<Path>) -> io::Result<Self> {
        let file = File::options().create(true).append(true).open(path)?;
        Ok(Self::new(BufWriter::new(file)))
    }
}

impl<W: Write + Send> JsonLinesAudit<W> {
    /// Writes to any writer.
    pub fn new(out: W) -> Self {
        Self { out: Mutex::new(out), errors: AtomicU64::new(0) }
    }

    /// How many events could not be written.
    pub fn write_errors(&self) -> u64 {
        self.errors.load(Ordering::Relaxed)
    }

    /// The writer back.
    pub fn into_inner(self) -> W {
        self.out.into_inner().unwrap_or_else(PoisonError::into_inner)
    }
}

impl<W: Write + Send> AuditSink for JsonLinesAudit<W> {
    fn record(&self, event: &AuditEvent<'_>) {
        let mut out = self.out.lock().unwrap_or_else(PoisonError::into_inner);
        let written = serde_json::to_writer(&mut *out, event)
            .map_err(io::Error::from)
            .and_then(|()| out.write_all(b"\n"))
            .and_then(|()| out.flush());
        if written.is_err() {
            self.errors.fetch_add(1, Ordering::Relaxed);
        }
    }
}
