//! Reading Redis's replies into the contract's types: a claim, records, a
//! hold, a resolution, a `SCAN` page, a fenced write. Apart because a reply
//! is untrusted: anything but the shapes the scripts answer is corrupt,
//! never guessed at, and that is tested here without a server.

use std::time::Duration;

use redis::Value;

use crate::IdempotencyKey;
use crate::ledger::{
    Claim, ClaimRequest, Claimed, Fence, LedgerError, Progress, RecordState, RecordView, Replay,
    Settle,
};

fn corrupt(what: &str, reply: &Value) -> LedgerError {
    LedgerError::Corrupt(format!("redis: unexpected {what} reply {reply:?}").into())
}

/// Reads a claim script's reply.
pub(super) fn claimed(reply: &Value, request: &ClaimRequest) -> Result<Claim, LedgerError> {
    let bad = || corrupt("claim", reply);
    let Value::Array(items) = reply else { return Err(bad()) };
    let int = |i: usize| match items.get(i) {
        Some(Value::Int(n)) => Ok(*n),
        _ => Err(bad()),
    };
    let fence = |i: usize| int(i).and_then(|n| u64::try_from(n).map(Fence).map_err(|_| bad()));
    let key = match (int(1)?, request.previous) {
        (0, _) => request.key,
        (1, Some((previous, _))) => previous,
        _ => return Err(bad()),
    };
    let state = match int(0)? {
        1 => Claimed::Fresh(fence(2)?),
        2 => {
            let attempts = u32::try_from(int(3)?).map_err(|_| bad())?;
            let settle = match int(5)? {
                left if left >= 0 => Settle::After(Duration::from_micros(left.unsigned_abs())),
                _ => Settle::Never,
            };
            Claimed::Resume(fence(2)?, Progress { attempts, after_ok: int(4)? != 0, settle })
        }
        3 => Claimed::Completed(match (int(2)?, items.get(3)) {
            (0, None) => Replay::Unrecorded,
            (1, Some(Value::BulkString(bytes))) => Replay::Encoded(bytes.clone()),
            _ => return Err(bad()),
        }),
        4 => Claimed::InFlight(Duration::from_micros(int(2)?.max(0).unsigned_abs())),
        5 => Claimed::Mismatch,
        _ => return Err(bad()),
    };
    Ok(Claim { key, state })
}

/// Reads a `READ` script's reply: the time, then five fields per key.
pub(super) fn read_views(
    reply: &Value,
    keys: &[IdempotencyKey],
) -> Result<Vec<Option<RecordView>>, LedgerError> {
    views_of(reply, keys).ok_or_else(|| corrupt("read", reply))
}

fn views_of(reply: &Value, keys: &[IdempotencyKey]) -> Option<Vec<Option<RecordView>>> {
    let Value::Array(items) = reply else { return None };
    let (Value::Int(now), fields) = items.split_first()? else { return None };
    if fields.len() != 5 * keys.len() {
        return None;
    }
    let mut views = Vec::with_capacity(keys.len());
    for (&key, f) in keys.iter().zip(fields.chunks_exact(5)) {
        let Some(state) = text(&f[0])? else {
            // Expired or deleted since it was found.
            views.push(None);
            continue;
        };
        let state = match state {
            // A hold past its lease is in doubt: the next claim takes it
            // over to verify first, as it does a record in doubt.
            "h" if number(&f[1])?.is_some_and(|end| *now < end) => RecordState::Held,
            "h" | "d" => RecordState::InDoubt,
            "s" => RecordState::Settled,
            "c" => RecordState::Completed,
            _ => return None,
        };
        let attempts = u32::try_from(number(&f[2])??).ok()?;
        let after_ok = text(&f[3])? == Some("1");
        let settle = match number(&f[4])? {
            Some(at) => {
                Settle::After(Duration::from_micros(at.saturating_sub(*now).max(0).unsigned_abs()))
            }
            None => Settle::Never,
        };
        let progress = Progress { attempts, after_ok, settle };
        views.push(Some(RecordView { key, state, progress }));
    }
    Some(views)
}

/// A hash field as text: `Some(None)` when absent, `None` when not text.
fn text(value: &Value) -> Option<Option<&str>> {
    match value {
        Value::BulkString(bytes) => std::str::from_utf8(bytes).ok().map(Some),
        Value::Nil => Some(None),
        _ => None,
    }
}

/// A hash field as an integer: `Some(None)` when absent, `None` when not one.
fn number(value: &Value) -> Option<Option<i64>> {
    match text(value)? {
        Some(t) => t.parse().ok().map(Some),
        None => Some(None),
    }
}

/// Reads a `HOLD` script's reply: the lease left (µs), or -1 when the fence
/// does not hold the key.
pub(super) fn held(reply: &Value) -> Result<Option<Duration>, LedgerError> {
    match reply {
        Value::Int(-1) => Ok(None),
        Value::Int(left) if *left > 0 => Ok(Some(Duration::from_micros(left.unsigned_abs()))),
        other => Err(corrupt("hold", other)),
    }
}

/// Reads a `RESOLVE` script's reply: the state before, by its letter.
pub(super) fn resolved(reply: &Value) -> Result<Option<RecordState>, LedgerError> {
    let letter = match reply {
        Value::Int(0) => return Ok(None),
        Value::BulkString(bytes) => bytes.as_slice(),
        Value::SimpleString(text) => text.as_bytes(),
        _ => return Err(corrupt("resolve", reply)),
    };
    Ok(Some(match letter {
        b"h" => RecordState::Held,
        b"d" => RecordState::InDoubt,
        b"s" => RecordState::Settled,
        b"c" => RecordState::Completed,
        _ => return Err(corrupt("resolve", reply)),
    }))
}

/// Reads a `SCAN` reply: the next cursor (0: done) and the keys found.
pub(super) fn scanned(reply: &Value) -> Result<(u64, Vec<&[u8]>), LedgerError> {
    let bad = || corrupt("scan", reply);
    let Value::Array(items) = reply else { return Err(bad()) };
    let [Value::BulkString(cursor), Value::Array(names)] = items.as_slice() else {
        return Err(bad());
    };
    let cursor = std::str::from_utf8(cursor).ok().and_then(|c| c.parse().ok()).ok_or_else(bad)?;
    let names = names
        .iter()
        .map(|name| match name {
            Value::BulkString(bytes) => Ok(bytes.as_slice()),
            _ => Err(bad()),
        })
        .collect::<Result<_, _>>()?;
    Ok((cursor, names))
}

/// Reads a fenced write's reply: 1 done, 0 fenced.
pub(super) fn fenced(what: &str, reply: &Value, fence: Fence) -> Result<(), LedgerError> {
    match reply {
        Value::Int(1) => Ok(()),
        Value::Int(0) => Err(LedgerError::Fenced(fence)),
        other => Err(corrupt(what, other)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::PayloadDigest;

    #[test]
    fn claim_replies_are_read_for_the_right_key() {
        let key = IdempotencyKey::from_u128(1);
        let previous = IdempotencyKey::from_u128(2);
        let first = Progress { attempts: 1, after_ok: false, settle: Settle::NOW };
        let request = ClaimRequest {
            key,
            fingerprint: PayloadDigest::from_u128(1),
            previous: Some((previous, PayloadDigest::from_u128(2))),
            first,
            now: tokio::time::Instant::now(),
        };
        let reply = |items: Vec<Value>| Value::Array(items);
        let claim = claimed(&reply(vec![Value::Int(1), Value::Int(0), Value::Int(9)]), &request)
            .expect("a fresh claim");
        assert_eq!(claim.key, key);
        assert!(matches!(claim.state, Claimed::Fresh(Fence(9))));
        let resume = [2, 1, 10, 3, 1, -1].map(Value::Int).to_vec();
        let claim = claimed(&reply(resume), &request).expect("a resumed claim");
        assert_eq!(claim.key, previous);
        let Claimed::Resume(Fence(10), progress) = claim.state else { panic!("{claim:?}") };
        assert_eq!(progress, Progress { attempts: 3, after_ok: true, settle: Settle::Never });
        let done =
            vec![Value::Int(3), Value::Int(0), Value::Int(1), Value::BulkString(b"7".into())];
        let claim = claimed(&reply(done), &request).expect("a completed claim");
        assert!(matches!(claim.state, Claimed::Completed(Replay::Encoded(ref b)) if b == b"7"));
        let unrecorded =
            claimed(&reply(vec![Value::Int(3), Value::Int(0), Value::Int(0)]), &request);
        assert!(matches!(unrecorded.map(|c| c.state), Ok(Claimed::Completed(Replay::Unrecorded))));
        let flight =
            claimed(&reply(vec![Value::Int(4), Value::Int(0), Value::Int(1500)]), &request);
        assert!(
            matches!(flight.map(|c| c.state), Ok(Claimed::InFlight(d)) if d == Duration::from_micros(1500))
        );
        // Anything else is corrupt, never guessed at.
        let alone = ClaimRequest { previous: None, ..request };
        assert!(matches!(
            claimed(&reply(vec![Value::Int(5), Value::Int(1)]), &alone),
            Err(LedgerError::Corrupt(_))
        ));
        assert!(matches!(claimed(&Value::Nil, &request), Err(LedgerError::Corrupt(_))));
        let unknown = claimed(&reply(vec![Value::Int(9), Value::Int(0)]), &request);
        assert!(matches!(unknown, Err(LedgerError::Corrupt(_))));
    }

    #[test]
    fn operator_replies_are_read_and_anything_else_is_corrupt() {
        let bulk = |s: &str| Value::BulkString(s.as_bytes().to_vec());
        let (a, b) = (IdempotencyKey::from_u128(1), IdempotencyKey::from_u128(2));
        // A hold past its lease (at 1000, now 5000) is in doubt; a record
        // gone since it was found is none.
        let reply = Value::Array(vec![
            Value::Int(5_000),
            bulk("h"),
            bulk("1000"),
            bulk("2"),
            bulk("1"),
            bulk("7000"),
            Value::Nil,
            Value::Nil,
            Value::Nil,
            Value::Nil,
            Value::Nil,
        ]);
        let views = read_views(&reply, &[a, b]).expect("a read reply");
        let settle = Settle::After(Duration::from_micros(2_000));
        let progress = Progress { attempts: 2, after_ok: true, settle };
        assert_eq!(
            views,
            [Some(RecordView { key: a, state: RecordState::InDoubt, progress }), None]
        );
        assert!(matches!(read_views(&reply, &[a]), Err(LedgerError::Corrupt(_))));
        assert_eq!(held(&Value::Int(-1)), Ok(None));
        assert_eq!(held(&Value::Int(1_500)), Ok(Some(Duration::from_micros(1_500))));
        assert!(matches!(held(&Value::Int(0)), Err(LedgerError::Corrupt(_))));
        assert!(matches!(held(&bulk("1")), Err(LedgerError::Corrupt(_))));
        assert_eq!(resolved(&Value::Int(0)), Ok(None));
        assert_eq!(resolved(&bulk("h")), Ok(Some(RecordState::Held)));
        assert_eq!(resolved(&bulk("d")), Ok(Some(RecordState::InDoubt)));
        assert!(matches!(resolved(&bulk("x")), Err(LedgerError::Corrupt(_))));
        let scan = Value::Array(vec![bulk("17"), Value::Array(vec![bulk("vt:k:00")])]);
        assert_eq!(scanned(&scan).expect("a scan reply"), (17, vec![&b"vt:k:00"[..]]));
    }
}
