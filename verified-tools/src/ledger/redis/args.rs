//! The arguments the scripts are sent: durations in the units and range
//! their arithmetic takes, fingerprints, fences, tokens, and the `SCAN`
//! pattern of the ledger's keys. Apart so that how a value crosses the wire
//! is written once, next to its bounds.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use crate::PayloadDigest;
use crate::ledger::Fence;
use crate::ledger::store_time::MAX_MICROS;

/// A fresh random token: a claim's, a write-through's or a decision's, so
/// that the store recognises it when it is sent again.
pub(super) fn token() -> String {
    use std::hash::{BuildHasher, RandomState};
    // RandomState's keys are random per process; the counter makes every
    // token of the process differ.
    static NEXT: AtomicU64 = AtomicU64::new(0);
    RandomState::new().hash_one(NEXT.fetch_add(1, Ordering::Relaxed)).to_string()
}

/// A duration in ms, rounded up, capped as
/// [`store_time::micros`](crate::ledger::store_time::micros) is.
pub(super) fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_nanos().div_ceil(1_000_000)).unwrap_or(u64::MAX).min(MAX_MICROS / 1_000)
}

pub(super) fn fingerprint_hex(fingerprint: PayloadDigest) -> String {
    format!("{:032x}", fingerprint.as_u128())
}

pub(super) fn fence_arg(fence: Fence) -> String {
    fence.0.to_string()
}

/// `SCAN`'s pattern matching the keys that start with `prefix`, its glob
/// characters escaped.
pub(super) fn glob_prefix(prefix: &str) -> String {
    let mut pattern = String::with_capacity(prefix.len() + 4);
    for c in prefix.chars() {
        if matches!(c, '*' | '?' | '[' | ']' | '\\') {
            pattern.push('\\');
        }
        pattern.push(c);
    }
    pattern.push_str("k:*");
    pattern
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn milliseconds_round_up_and_are_capped() {
        assert_eq!(millis(Duration::from_micros(1_001)), 2);
        assert_eq!(millis(Duration::MAX), MAX_MICROS / 1_000);
    }

    #[test]
    fn glob_characters_of_a_prefix_are_matched_literally() {
        assert_eq!(glob_prefix("vt:"), "vt:k:*");
        assert_eq!(glob_prefix(r"a*b?[c]\"), r"a\*b\?\[c\]\\k:*");
    }
}
