//! Audit: every state transition of a call as one structured event, in one
//! schema (snake_case names, durations in milliseconds).
//!
//! | `state` | when | fields it adds |
//! |---|---|---|
//! | `planned` | the key is derived | `args` (secrets redacted) |
//! | `dispatched` | an attempt goes out | `attempt`, `deadline_ms` |
//! | `pending_visibility` | an attempt did not prove the effect; and each verifier read | `error_class`, `error` (the attempt), or `verdict`, `settled` (a read) |
//! | `verified_success` `verified_failure` `unknown` `escalated` `refused` | the call ends: exactly one of these per call | `outcome`, `proof`, `reason`, `error` |
//!
//! Every event has `at_unix_ms`, `agent`, `tool`, `key` (once derived),
//! `call` (the identity the key was derived from: `{"tool_call_id": ..}`,
//! `{"run": .., "step": ..}`, `{"bucket_ms": ..}` or `{"explicit_key": true}`),
//! `state`, `attempt` and `elapsed_ms`. Fields that do not apply are left out.
//! `tests/audit_schema.rs` pins the schema with a golden file.

use std::fmt;
use std::fs::File;
use std::io::{self, BufWriter, Write};
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{self, Receiver, SyncSender};
use std::sync::{Mutex, PoisonError};
use std::thread::JoinHandle;

use serde::{Serialize, Serializer};
use serde_json::value::RawValue;

use crate::{ErrorClass, IdempotencyKey, KeyScope, Proof, UnknownReason, Verdict};

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
    /// The outcome is not proven; the verifier is reading the state.
    PendingVisibility,
    /// The effect is proven (by the response, the verifier or the ledger).
    VerifiedSuccess,
    /// The effect is known not to have happened (failed, or not applied).
    VerifiedFailure,
    /// The call ended in doubt.
    Unknown,
    /// Handed to a person.
    Escalated,
    /// Refused before any dispatch (bad arguments or payload, key reuse, in
    /// progress, ledger unavailable).
    Refused,
}

impl CallState {
    /// Whether the call ends with this state.
    pub const fn is_terminal(self) -> bool {
        !matches!(self, Self::Planned | Self::Dispatched | Self::PendingVisibility)
    }
}

/// The identity a call's key was derived from, as the audit shows it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CallIdentity<'a> {
    /// An LLM provider's tool-call id.
    ToolCall(&'a str),
    /// A durable run and step.
    Step {
        /// The run.
        run: &'a str,
        /// The step.
        step: u64,
    },
    /// A time bucket of this width, in ms.
    Bucket(u64),
    /// A time bucket of this width (ms) within one session or principal.
    Window {
        /// The session or principal.
        within: &'a str,
        /// The bucket width, in ms.
        width_ms: u64,
    },
    /// A key the caller chose.
    Explicit,
}

impl<'a> CallIdentity<'a> {
    pub(crate) fn of(scope: &'a KeyScope) -> Self {
        match scope {
            KeyScope::ToolCall(id) => Self::ToolCall(id),
            KeyScope::Durable { run, step } => Self::Step { run, step: *step },
            KeyScope::TimeBucket(width) => Self::Bucket(width.as_millis() as u64),
            KeyScope::Explicit(_) => Self::Explicit,
            KeyScope::Window { within, width } => {
                Self::Window { within, width_ms: width.as_millis() as u64 }
            }
        }
    }
}

impl Serialize for CallIdentity<'_> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeMap;
        let mut map = s.serialize_map(None)?;
        match *self {
            Self::ToolCall(id) => map.serialize_entry("tool_call_id", id)?,
            Self::Step { run, step } => {
                map.serialize_entry("run", run)?;
                map.serialize_entry("step", &step)?;
            }
            Self::Bucket(ms) => map.serialize_entry("bucket_ms", &ms)?,
            Self::Window { within, width_ms } => {
                map.serialize_entry("session", within)?;
                map.serialize_entry("bucket_ms", &width_ms)?;
            }
            Self::Explicit => map.serialize_entry("explicit_key", &true)?,
        }
        map.end()
    }
}

/// One state transition of one call. Borrowed: a sink that keeps it makes
/// its own copy ([`AuditRecord`], or bytes).
#[derive(Debug, Clone, Copy, Serialize)]
pub struct AuditEvent<'a> {
    /// Wall (or virtual) time of the event, ms since the Unix epoch.
    pub at_unix_ms: u64,
    /// The agent.
    pub agent: &'a str,
    /// The tool.
    pub tool: &'static str,
    /// The call's key (none if the payload could not be serialized).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub key: Option<IdempotencyKey>,
    /// The request identity: which request of the conversation asked.
    pub call: CallIdentity<'a>,
    /// The tool's declared effect identity (`#[verified_tool(key(..))]`):
    /// the parameters the key was derived from instead of the request
    /// identity. Left out when the tool declares none.
    #[serde(skip_serializing_if = "<[_]>::is_empty")]
    pub effect_key: &'static [&'static str],
    /// The state entered.
    pub state: CallState,
    /// Attempts dispatched under the key so far.
    pub attempt: u32,
    /// Time since the call started, in ms (tokio time, so paused in tests).
    pub elapsed_ms: u64,
    /// `dispatched`: the attempt's time limit, in ms.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub deadline_ms: Option<u64>,
    /// A verifier read: what it said.
    #[serde(skip_serializing_if = "Option::is_none", serialize_with = "verdict_name")]
    pub verdict: Option<Verdict>,
    /// A verifier read: whether the last attempt had settled, so that an
    /// `absent` is believed.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub settled: Option<bool>,
    /// The class of the error that led here.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error_class: Option<ErrorClass>,
    /// The error's text (its `Display`), or what went wrong in words.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<&'a str>,
    /// Terminal: the outcome (`success`, `failed`, `not_applied`, `unknown`,
    /// `escalated`, `refused`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub outcome: Option<&'static str>,
    /// Terminal success: how it was proven.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub proof: Option<Proof>,
    /// Terminal `unknown` or `escalated`: why it stayed in doubt.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reason: Option<UnknownReason>,
    /// `planned`: the arguments, secrets redacted.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub args: Option<&'a RawValue>,
}

fn verdict_name<S: Serializer>(verdict: &Option<Verdict>, s: S) -> Result<S::Ok, S::Error> {
    match verdict {
        Some(v) => s.serialize_str(match v {
            Verdict::Holds(()) => "holds",
            Verdict::Absent => "absent",
            Verdict::Unknown => "unknown",
        }),
        None => s.serialize_none(),
    }
}

/// Receives audit events. Called synchronously from the engine, never while
/// a lock of the engine is held; must not block (hand the event to another
/// thread, as [`JsonLinesAudit`] does).
pub trait AuditSink: Send + Sync {
    /// Records one event.
    fn record(&self, event: &AuditEvent<'_>);
}

/// An owned copy of an [`AuditEvent`], as [`MemoryAudit`] keeps it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AuditRecord {
    /// The event as one JSON object, the schema above.
    pub json: String,
    /// See [`AuditEvent::key`].
    pub key: Option<IdempotencyKey>,
    /// See [`AuditEvent::tool`].
    pub tool: &'static str,
    /// See [`AuditEvent::state`].
    pub state: CallState,
    /// See [`AuditEvent::attempt`].
    pub attempt: u32,
    /// See [`AuditEvent::args`], as JSON text.
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
            json: serde_json::to_string(e).unwrap_or_default(),
            key: e.key,
            tool: e.tool,
            state: e.state,
            attempt: e.attempt,
            args: e.args.map(|a| a.get().to_owned()),
        };
        self.events.lock().unwrap_or_else(PoisonError::into_inner).push(record);
    }
}

/// Appends events to a file, one JSON object per line, written and flushed
/// by a thread of its own: the calling thread only serializes the event and
/// hands the line over.
///
/// Nothing is lost on a clean shutdown: [`flush`](Self::flush) waits until
/// every line handed over is written, and dropping the sink does too. If the
/// writer falls more than 65,536 lines behind, callers wait for it rather
/// than drop lines. Write errors never reach the call: they are counted in
/// [`write_errors`](Self::write_errors).
///
/// ```
/// use verified_tools::audit::JsonLinesAudit;
///
/// let path = std::env::temp_dir().join(format!("vt-audit-doc-{}.jsonl", std::process::id()));
/// let audit = JsonLinesAudit::append(&path)?;
/// // ... Context::new("agent").with_audit(Arc::new(audit)) ...
/// audit.flush()?;
/// # std::fs::remove_file(&path).ok();
/// # Ok::<(), std::io::Error>(())
/// ```
pub struct JsonLinesAudit {
    /// `None` once dropped: closing the channel ends the writer.
    lines: Option<SyncSender<Line>>,
    writer: Option<JoinHandle<()>>,
    errors: std::sync::Arc<AtomicU64>,
}

enum Line {
    Event(Vec<u8>),
    /// Answered once every line before it is written and flushed.
    Flush(mpsc::Sender<io::Result<()>>),
}

impl fmt::Debug for JsonLinesAudit {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("JsonLinesAudit").field("write_errors", &self.write_errors()).finish()
    }
}

impl JsonLinesAudit {
    /// Opens (or creates) `path` for appending.
    pub fn append(path: impl AsRef<Path>) -> io::Result<Self> {
        let file = File::options().create(true).append(true).open(path)?;
        Ok(Self::new(BufWriter::new(file)))
    }

    /// Writes to any writer, from a thread of its own.
    pub fn new<W: Write + Send + 'static>(out: W) -> Self {
        let (tx, rx) = mpsc::sync_channel(65_536);
        let errors = std::sync::Arc::new(AtomicU64::new(0));
        let counted = std::sync::Arc::clone(&errors);
        let writer = std::thread::Builder::new()
            .name("vt-audit-writer".into())
            .spawn(move || write_lines(out, rx, &counted))
            .ok();
        if writer.is_none() {
            errors.fetch_add(1, Ordering::Relaxed);
        }
        Self { lines: Some(tx), writer, errors }
    }

    /// How many events could not be written.
    pub fn write_errors(&self) -> u64 {
        self.errors.load(Ordering::Relaxed)
    }

    /// Waits until every event recorded so far is written and flushed.
    pub fn flush(&self) -> io::Result<()> {
        let (tx, rx) = mpsc::channel();
        let stopped = || io::Error::other("the audit writer has stopped");
        let lines = self.lines.as_ref().ok_or_else(stopped)?;
        lines.send(Line::Flush(tx)).map_err(|_| stopped())?;
        rx.recv().map_err(|_| stopped())?
    }
}

fn write_lines<W: Write>(mut out: W, lines: Receiver<Line>, errors: &AtomicU64) {
    while let Ok(first) = lines.recv() {
        // Write what is queued, then flush once: a burst costs one flush,
        // and a crash loses at most what was still queued.
        let mut next = Some(first);
        while let Some(line) = next.take() {
            match line {
                Line::Event(bytes) => {
                    if out.write_all(&bytes).is_err() {
                        errors.fetch_add(1, Ordering::Relaxed);
                    }
                }
                Line::Flush(done) => {
                    let _ = done.send(out.flush());
                }
            }
            next = lines.try_recv().ok();
        }
        if out.flush().is_err() {
            errors.fetch_add(1, Ordering::Relaxed);
        }
    }
}

impl AuditSink for JsonLinesAudit {
    fn record(&self, event: &AuditEvent<'_>) {
        let mut bytes = match serde_json::to_vec(event) {
            Ok(bytes) => bytes,
            Err(_) => {
                self.errors.fetch_add(1, Ordering::Relaxed);
                return;
            }
        };
        bytes.push(b'\n');
        let sent = self.lines.as_ref().is_some_and(|lines| lines.send(Line::Event(bytes)).is_ok());
        if !sent {
            self.errors.fetch_add(1, Ordering::Relaxed);
        }
    }
}

impl Drop for JsonLinesAudit {
    fn drop(&mut self) {
        // Closing the channel ends the writer once it has written the rest.
        self.lines.take();
        if let Some(writer) = self.writer.take() {
            let _ = writer.join();
        }
    }
}
