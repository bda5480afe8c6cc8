//! A tiny fake service with scripted faults, shared by the engine tests.
#![allow(dead_code)]

use std::collections::{HashSet, VecDeque};
use std::sync::{Mutex, MutexGuard};
use std::time::Duration;

use verified_tools::engine;
use verified_tools::{Classify, ErrorClass, IdempotencyKey, Verdict};

/// What one attempt does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Attempt {
    /// Applies and answers OK.
    Ok,
    /// Applies, then the answer is lost (timeout after dispatch).
    TimeoutApplied,
    /// Times out before reaching the server.
    TimeoutLost,
    /// Refused: validation error.
    Definitive,
    /// Refused: the record changed since we read it.
    Conflict,
    /// Applies only half of the effect and answers OK.
    PartialOk,
    /// Never answers.
    Hang,
}

/// What one verifier read returns.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Read {
    /// The real state.
    Truth,
    /// A stale replica: the state before any effect.
    Stale,
    /// Inconclusive.
    Unknown,
    /// The verifier panics.
    Panic,
}

/// What the fake saw, in order.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Event {
    Dispatch(IdempotencyKey),
    Read(Verdict),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FakeError {
    Timeout,
    Invalid,
    Conflict,
}

impl std::fmt::Display for FakeError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            FakeError::Timeout => "the service timed out",
            FakeError::Invalid => "422 invalid request: customer 42 is closed",
            FakeError::Conflict => "409 conflict: the record changed",
        })
    }
}

impl Classify for FakeError {
    fn classify(&self) -> ErrorClass {
        match self {
            FakeError::Timeout => ErrorClass::Ambiguous,
            FakeError::Invalid => ErrorClass::Definitive,
            FakeError::Conflict => ErrorClass::Conflict,
        }
    }
}

#[derive(Default)]
struct Inner {
    attempts: VecDeque<Attempt>,
    reads: VecDeque<Read>,
    /// Complete effects applied (the ground truth).
    applied: u32,
    /// Half-applied effects.
    partial: bool,
    keys: HashSet<IdempotencyKey>,
    ignore_keys: bool,
    log: Vec<Event>,
}

/// The fake service.
#[derive(Default)]
pub struct Fake(Mutex<Inner>);

impl Fake {
    pub fn new(attempts: &[Attempt], reads: &[Read]) -> Self {
        let fake = Fake::default();
        {
            let mut inner = fake.lock();
            inner.attempts = attempts.iter().copied().collect();
            inner.reads = reads.iter().copied().collect();
        }
        fake
    }

    pub fn ignoring_keys(self) -> Self {
        self.lock().ignore_keys = true;
        self
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        self.0.lock().unwrap()
    }

    /// Times the effect was applied in full.
    pub fn applied(&self) -> u32 {
        self.lock().applied
    }

    pub fn log(&self) -> Vec<Event> {
        self.lock().log.clone()
    }

    pub fn dispatches(&self) -> Vec<IdempotencyKey> {
        self.log()
            .into_iter()
            .filter_map(|e| match e {
                Event::Dispatch(k) => Some(k),
                Event::Read(_) => None,
            })
            .collect()
    }

    pub fn reads(&self) -> usize {
        self.log().iter().filter(|e| matches!(e, Event::Read(_))).count()
    }

    /// The postcondition: the effect is applied in full.
    pub fn holds(&self) -> bool {
        self.lock().applied > 0
    }

    /// One attempt of the write.
    pub async fn send(&self, attempt: engine::Attempt) -> Result<u32, FakeError> {
        let key = attempt.key;
        let step = {
            let mut inner = self.lock();
            inner.log.push(Event::Dispatch(key));
            inner.attempts.pop_front().unwrap_or(Attempt::Ok)
        };
        // A little virtual latency, so timeouts and backoff interleave.
        tokio::time::sleep(Duration::from_millis(10)).await;
        if step == Attempt::Hang {
            return std::future::pending().await;
        }
        let mut inner = self.lock();
        let fresh = inner.ignore_keys || !inner.keys.contains(&key);
        match step {
            Attempt::Ok | Attempt::TimeoutApplied => {
                if fresh {
                    inner.applied += 1;
                    inner.keys.insert(key);
                }
                if step == Attempt::Ok { Ok(inner.applied) } else { Err(FakeError::Timeout) }
            }
            Attempt::PartialOk => {
                inner.partial = true;
                Ok(inner.applied)
            }
            Attempt::TimeoutLost => Err(FakeError::Timeout),
            Attempt::Definitive => Err(FakeError::Invalid),
            Attempt::Conflict => Err(FakeError::Conflict),
            Attempt::Hang => unreachable!("handled above"),
        }
    }

    /// One verifier read.
    pub async fn check(&self) -> Verdict<u32> {
        let read = {
            let mut inner = self.lock();
            inner.reads.pop_front().unwrap_or(Read::Truth)
        };
        tokio::time::sleep(Duration::from_millis(5)).await;
        let verdict = match read {
            Read::Truth => {
                let applied = self.lock().applied;
                if applied > 0 { Verdict::Holds(applied) } else { Verdict::Absent }
            }
            Read::Stale => Verdict::Absent,
            Read::Unknown => Verdict::Unknown,
            Read::Panic => {
                self.lock().log.push(Event::Read(Verdict::Unknown));
                panic!("verifier bug")
            }
        };
        self.lock().log.push(Event::Read(verdict.kind()));
        verdict
    }
}
