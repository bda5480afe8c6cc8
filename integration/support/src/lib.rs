//! What every package's test suites share: finding (or starting) the real
//! servers they need (Redis, PostgreSQL), and a TCP proxy that loses
//! answers ([`lossy`]). Under `CI=true` (set by
//! `.ci/run`, which installs and starts every server) a missing server fails
//! the test; on a newcomer's machine the test says in one line what is
//! missing and how to get it, and passes without running.
//!
//! Every package's tests use it as a dev-dependency (`use test_support as
//! support;`).

use std::io::Write;
use std::sync::Mutex;

pub mod lossy;
pub mod postgres;
pub mod redis;

/// Whether this run is CI, where every server must be present.
pub fn in_ci() -> bool {
    std::env::var("CI").is_ok_and(|v| v == "true" || v == "1")
}

/// A server the test needs is missing: fail under CI, else say so in one
/// line and let the test return early.
///
/// The test harness keeps what tests print to itself unless one fails, so
/// the line goes to the real stderr, once per missing server for all the
/// tests of the binary that skip.
pub fn missing(what: &str, how: &str) {
    assert!(!in_ci(), "{what} is required under CI=true but is missing: {how}");
    static SAID: Mutex<Vec<String>> = Mutex::new(Vec::new());
    let mut said = SAID.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
    if !said.iter().any(|w| w == what) {
        said.push(what.to_owned());
        let _ = writeln!(std::io::stderr(), "skipped: needs {what} ({how})");
    }
}
