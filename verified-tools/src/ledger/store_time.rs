//! How a duration is sent to a store: in whole µs, rounded up (a lease or
//! a settle time is never shortened), capped where every store's
//! arithmetic is still exact. One place for the Redis and PostgreSQL
//! ledgers, which send the same quantities.

use std::time::Duration;

use super::Settle;

/// Durations sent to a store are capped here (about 35 years): Redis's
/// scripts compute on doubles, exact below 2^53 µs, and PostgreSQL's
/// `timestamptz` arithmetic is far from its range.
pub(crate) const MAX_MICROS: u64 = 1 << 50;

/// `d` in µs, rounded up, capped at [`MAX_MICROS`].
pub(crate) fn micros(d: Duration) -> u64 {
    u64::try_from(d.as_nanos().div_ceil(1_000)).unwrap_or(u64::MAX).min(MAX_MICROS)
}

/// A settle time as the stores take it: µs from now, -1 for never.
pub(crate) fn settle_micros(settle: Settle) -> i64 {
    match settle {
        // MAX_MICROS fits an i64.
        Settle::After(d) => micros(d) as i64,
        Settle::Never => -1,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_round_up_and_are_capped() {
        assert_eq!(micros(Duration::from_nanos(1)), 1);
        assert_eq!(micros(Duration::from_micros(7)), 7);
        assert_eq!(micros(Duration::MAX), MAX_MICROS);
        assert_eq!(settle_micros(Settle::Never), -1);
        assert_eq!(settle_micros(Settle::NOW), 0);
    }
}
