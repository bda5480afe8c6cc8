//! What the runtime's integration tests share: finding the real servers they
//! need. Under `CI=true` (set by `.ci/run`, which installs and starts every
//! server) a missing server fails the test; on a newcomer's machine the test
//! says in one line what is missing and how to get it, and passes without
//! running.

pub mod postgres;

/// Whether this run is CI, where every server must be present.
pub fn in_ci() -> bool {
    std::env::var("CI").is_ok_and(|v| v == "true" || v == "1")
}

/// A server the test needs is missing: fail under CI, else let the test
/// return early (the caller says what is missing, once per test binary).
pub fn missing(what: &str, how: &str) {
    assert!(!in_ci(), "{what} is required under CI=true but is missing: {how}");
}
