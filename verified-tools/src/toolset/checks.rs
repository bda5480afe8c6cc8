//! The way out of doubt in a tool set: the calls it made that did not
//! succeed, kept by key with their arguments, so that a model (`check_call`)
//! or a reconciler can learn what became of them without doing anything.

use std::collections::{HashMap, VecDeque};
use std::sync::{Mutex, MutexGuard, PoisonError};

use serde_json::{Map, Value, json};

use super::{Status, ToolOutcome};
use crate::{Context, IdempotencyKey};

/// The name of the check tool a set lists with [`ToolSet::with_checks`](super::ToolSet::with_checks).
pub const CHECK_TOOL: &str = "check_call";

/// What the check tool says of itself to the model.
pub(super) const CHECK_DESCRIPTION: &str = "Checks what became of an earlier call of this tool \
     set whose result was `unknown`, `escalated` or `not_applied`, by its `key`, without doing \
     anything again: it reads the real state and returns the current truth (`success` when the \
     effect happened). Use it instead of making the call again.";

/// The arguments' schema of the check tool.
pub(super) fn check_schema() -> Map<String, Value> {
    let schema = json!({
        "type": "object",
        "properties": {
            "key": {
                "type": "string",
                "description": "The `key` of the earlier call's result: 32 lowercase hex digits.",
                "pattern": "^[0-9a-f]{32}$"
            }
        },
        "required": ["key"],
        "additionalProperties": false
    });
    match schema {
        Value::Object(object) => object,
        _ => Map::new(),
    }
}

/// A call to check again: which tool, with which arguments, in the context
/// it was made in (its agent, scope and ledger name its key).
#[derive(Debug, Clone)]
pub(super) struct Pending {
    pub(super) tool: &'static str,
    pub(super) arguments: Value,
    pub(super) context: Context,
}

/// The calls not known to have succeeded, oldest first, at most `cap`: past
/// it the oldest is forgotten by the set (its ledger record stays, and an
/// operator can still list it).
#[derive(Debug)]
pub(super) struct Pendings {
    inner: Mutex<Inner>,
    cap: usize,
}

#[derive(Debug, Default)]
struct Inner {
    calls: HashMap<IdempotencyKey, Pending>,
    order: VecDeque<IdempotencyKey>,
}

impl Inner {
    /// Removes a call from both the map and the order, so that `order`
    /// holds each live key once: a key left behind there would be checked
    /// twice per pass once the call is noted again, and would take a live
    /// call's place at the cap.
    fn forget(&mut self, key: IdempotencyKey) {
        if self.calls.remove(&key).is_some() {
            self.order.retain(|k| *k != key);
        }
    }
}

impl Pendings {
    pub(super) fn new(cap: usize) -> Self {
        Self { inner: Mutex::default(), cap: cap.max(1) }
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        // Every update is one insert or removal: nothing half-written.
        self.inner.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Notes how a call ended: kept while its effect is not proven (nor
    /// refused by the tool), dropped once it is.
    pub(super) fn note(&self, outcome: &ToolOutcome, pending: impl FnOnce() -> Pending) {
        let Some(key) = outcome.key else { return };
        let mut inner = self.lock();
        match outcome.status {
            Status::Unknown | Status::Escalated | Status::NotApplied => {
                if inner.calls.insert(key, pending()).is_none() {
                    inner.order.push_back(key);
                }
                while inner.calls.len() > self.cap {
                    let Some(oldest) = inner.order.pop_front() else { break };
                    inner.calls.remove(&oldest);
                }
            }
            Status::Success | Status::Failed => inner.forget(key),
            Status::Refused | Status::InvalidArguments | Status::NoSuchTool => {}
        }
    }

    /// Forgets a call whose check settled it (a repeat of it that ends in
    /// doubt again is noted anew, once).
    pub(super) fn close(&self, key: IdempotencyKey) {
        self.lock().forget(key);
    }

    pub(super) fn get(&self, key: IdempotencyKey) -> Option<Pending> {
        self.lock().calls.get(&key).cloned()
    }

    /// The keys to check, oldest first.
    pub(super) fn keys(&self) -> Vec<IdempotencyKey> {
        self.lock().order.iter().copied().collect()
    }

    pub(super) fn len(&self) -> usize {
        self.lock().calls.len()
    }
}

/// What one pass of [`ToolSet::reconcile`](super::ToolSet::reconcile) did.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub struct Reconciled {
    /// Calls checked.
    pub checked: usize,
    /// Calls whose effect is now proven (`success`).
    pub applied: usize,
    /// Calls now known not to have happened (`not_applied`, `failed`).
    pub not_applied: usize,
    /// Calls still in doubt, to check again later.
    pub in_doubt: usize,
}
