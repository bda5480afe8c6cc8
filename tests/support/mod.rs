//! What the integration tests share: finding the real servers they need.
//!
//! A test that needs a server (Redis, the Python MCP SDK) asks here. Under
//! `CI=true` (set by `.ci/run`, which installs and starts every server) a
//! missing server fails the test; on a newcomer's machine the test prints one
//! line saying what is missing and how to get it, and passes without running.
#![allow(dead_code)]

pub mod redis;

/// Whether this run is CI, where every server must be present.
pub fn in_ci() -> bool {
    std::env::var("CI").is_ok_and(|v| v == "true" || v == "1")
}

/// A server the test needs is missing: fail under CI, else say so in one
/// line and let the test return early.
pub fn missing(what: &str, how: &str) {
    assert!(!in_ci(), "{what} is required under CI=true but is missing: {how}");
    eprintln!("skipped: needs {what} ({how})");
}
