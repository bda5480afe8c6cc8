//! Idempotency keys: one deterministic 128-bit key per logical call.
//!
//! A key is derived once, before the first attempt, and every attempt of that
//! logical call carries the same key, so a server that honours keys applies the
//! effect at most once whatever the retries do. The derivation is part of our
//! wire format: golden vectors in `tests/key_golden.rs` pin it across versions
//! and platforms.
//!
//! # Format (version 1)
//!
//! The key is xxh3-128 of one byte string, written in a single streaming pass
//! (no intermediate buffer beyond a 256-byte stack window):
//!
//! ```text
//! key     = xxh3_128( "vtk1" ‖ str(agent) ‖ str(action) ‖ scope ‖ encoding(payload) )
//! str(s)  = len(s) as unsigned LEB128, shortest form ‖ UTF-8 bytes of s
//! scope   = 0x00 ‖ bucket width in ms as u64 LE ‖ bucket index as u64 LE     (time bucket)
//!         | 0x01 ‖ str(run) ‖ step as u64 LE                                 (durable identity)
//!         | 0x03 ‖ str(tool call id)                                         (tool call)
//! ```
//!
//! (LEB128: seven bits per byte, low group first, the high bit set on every
//! byte but the last; a length below 128 is one byte.)
//!
//! `encoding(payload)` is the self-delimiting, type-tagged, little-endian
//! encoding of the key-relevant arguments that the [`payload`] module
//! documents, produced by a `serde::Serializer` that streams into the hasher.
//! An explicit key ([`KeyScope::Explicit`]) is used as given; the payload
//! fingerprint the ledger keeps with it is then xxh3-128 of
//! `"vtk1" ‖ str(agent) ‖ str(action) ‖ 0x02 ‖ encoding(payload)`.

pub mod payload;
mod sink;

use std::fmt;
use std::str::FromStr;
use std::time::Duration;

use serde::Serialize;

use payload::PayloadHasher;

pub use payload::{KeyError, PayloadDigest, payload_digest};

/// A deterministic 128-bit idempotency key, shown as 32 lowercase hex digits.
///
/// ```
/// use verified_tools::{IdempotencyKey, KeyScope};
///
/// let scope = KeyScope::durable("run-7", 3);
/// let a = IdempotencyKey::derive("agent-1", "send_welcome", &(42u64, "hi"), &scope, 0)?;
/// let b = IdempotencyKey::derive("agent-1", "send_welcome", &(42u64, "hi"), &scope, 0)?;
/// assert_eq!(a, b);
/// assert_eq!(a.to_string().len(), 32);
/// assert_eq!(a.to_string().parse::<IdempotencyKey>().unwrap(), a);
/// # Ok::<(), verified_tools::KeyError>(())
/// ```
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct IdempotencyKey(u128);

impl IdempotencyKey {
    /// Wraps a raw 128-bit value (for keys read back from storage or a header).
    pub const fn from_u128(value: u128) -> Self {
        Self(value)
    }

    /// The raw 128-bit value.
    pub const fn as_u128(self) -> u128 {
        self.0
    }

    /// Derives the key of one logical call.
    ///
    /// `unix_ms` is the current time in milliseconds since the Unix epoch; it
    /// only matters for [`KeyScope::TimeBucket`]. Fails only when the payload
    /// cannot be serialized, before anything is dispatched.
    pub fn derive<P: Serialize + ?Sized>(
        agent: &str,
        action: &str,
        payload: &P,
        scope: &KeyScope,
        unix_ms: u64,
    ) -> Result<Self, KeyError> {
        Self::derive_call(agent, action, payload, scope, unix_ms, false).map(|derived| derived.key)
    }

    /// The key of one logical call, its payload fingerprint, and, for a
    /// time-bucketed scope, the key the same call had in the previous bucket
    /// (so a re-issue across a bucket edge is still found in the ledger).
    ///
    /// A derived key already commits to the payload, so it is its own
    /// fingerprint; an explicit key does not, so its payload is hashed.
    #[inline]
    pub(crate) fn derive_call<P: Serialize + ?Sized>(
        agent: &str,
        action: &str,
        payload: &P,
        scope: &KeyScope,
        unix_ms: u64,
        with_previous: bool,
    ) -> Result<Derived, KeyError> {
        // Built in place and only borrowed from here on: moving the hasher
        // would copy its stack window.
        let mut h = PayloadHasher::new();
        let sink = h.sink();
        sink.update(b"vtk1");
        sink.len_bytes(agent.as_bytes());
        sink.len_bytes(action.as_bytes());
        let mut previous_bucket = None;
        match scope {
            KeyScope::Explicit(key) => {
                // The explicit key commits to nothing, so the fingerprint must
                // commit to everything: agent, action and payload. Another
                // tool reusing the key is then a mismatch, not a replay.
                sink.byte(0x02);
                h.encode(payload)?;
                let fingerprint = PayloadDigest::from_u128(h.digest128());
                return Ok(Derived { key: *key, fingerprint, previous: None });
            }
            KeyScope::TimeBucket(width) => {
                // A zero width would divide by zero; treat it as 1 ms buckets.
                let width_ms = (width.as_millis() as u64).max(1);
                sink.tagged_fixed(0x00, width_ms.to_le_bytes());
                let index = unix_ms / width_ms;
                if let Some(before) = index.checked_sub(1).filter(|_| with_previous) {
                    previous_bucket = Some((sink.position(), before));
                }
                sink.update(&index.to_le_bytes());
            }
            KeyScope::Durable { run, step } => {
                sink.byte(0x01);
                sink.len_bytes(run.as_bytes());
                sink.update(&step.to_le_bytes());
            }
            KeyScope::ToolCall(id) => {
                sink.byte(0x03);
                sink.len_bytes(id.as_bytes());
            }
        }
        h.encode(payload)?;
        let key = h.digest128();
        let previous = match (previous_bucket, scope) {
            (Some((at, before)), KeyScope::TimeBucket(width)) => {
                let patched =
                    at.and_then(|at| h.sink().digest128_patched(at, before.to_le_bytes()));
                // Spilled past the stack window: derive it again.
                let width_ms = (width.as_millis() as u64).max(1);
                let again = || {
                    let earlier = before.saturating_mul(width_ms);
                    Self::derive(agent, action, payload, scope, earlier).map(|k| k.0)
                };
                let k = match patched {
                    Some(k) => k,
                    None => again()?,
                };
                Some((Self(k), PayloadDigest::from_u128(k)))
            }
            _ => None,
        };
        Ok(Derived { key: Self(key), fingerprint: PayloadDigest::from_u128(key), previous })
    }

    /// The key as 32 lowercase hex digits, without allocating.
    pub fn to_hex(self) -> KeyHex {
        const DIGITS: &[u8; 16] = b"0123456789abcdef";
        let mut out = [0u8; 32];
        for (i, byte) in self.0.to_be_bytes().iter().enumerate() {
            out[2 * i] = DIGITS[(byte >> 4) as usize];
            out[2 * i + 1] = DIGITS[(byte & 0xf) as usize];
        }
        KeyHex(out)
    }
}

/// A key rendered as hex on the stack; see [`IdempotencyKey::to_hex`].
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct KeyHex([u8; 32]);

impl KeyHex {
    /// The 32 hex digits.
    pub fn as_str(&self) -> &str {
        // Only ASCII hex digits are ever written into the array.
        std::str::from_utf8(&self.0).unwrap_or_default()
    }
}

impl fmt::Display for KeyHex {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl fmt::Debug for KeyHex {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "KeyHex({})", self.as_str())
    }
}

impl fmt::Display for IdempotencyKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.to_hex().as_str())
    }
}

impl fmt::Debug for IdempotencyKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "IdempotencyKey({self})")
    }
}

/// Error of parsing an [`IdempotencyKey`] from text.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("an idempotency key is 32 lowercase hex digits, got {got:?}")]
pub struct ParseKeyError {
    got: String,
}

impl FromStr for IdempotencyKey {
    type Err = ParseKeyError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let valid = s.len() == 32 && s.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'));
        match u128::from_str_radix(s, 16) {
            Ok(v) if valid => Ok(Self(v)),
            _ => Err(ParseKeyError { got: s.to_owned() }),
        }
    }
}

impl Serialize for IdempotencyKey {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(self.to_hex().as_str())
    }
}

impl<'de> serde::Deserialize<'de> for IdempotencyKey {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = <std::borrow::Cow<'de, str>>::deserialize(d)?;
        s.parse().map_err(serde::de::Error::custom)
    }
}

/// A derived key with what the ledger needs to look it up.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Derived {
    pub(crate) key: IdempotencyKey,
    pub(crate) fingerprint: PayloadDigest,
    /// The same call's key in the previous time bucket.
    pub(crate) previous: Option<(IdempotencyKey, PayloadDigest)>,
}

/// What, besides agent, action and payload, separates one logical call from
/// another with the same arguments.
///
/// Which to use:
///
/// | the caller has | scope | a repeat with the same arguments is |
/// |---|---|---|
/// | an LLM provider's tool-call id | [`ToolCall`](KeyScope::ToolCall) (`Context::for_tool_call`) | the same call only with the same id |
/// | a durable run id and step number | [`Durable`](KeyScope::Durable) (`Context::for_step`) | the same call only at the same step |
/// | its own key for the action | [`Explicit`](KeyScope::Explicit) (`Context::for_key`) | the same call only with the same key |
/// | nothing | [`TimeBucket`](KeyScope::TimeBucket) (the default, 5 min) | the same call within about one bucket |
///
/// A time bucket is a guess at what "the same call" means; prefer an
/// identity the caller already has.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum KeyScope {
    /// Calls in the same time bucket of this width are the same logical call
    /// (the paper's `timestamp_bucket`). The bucket is read once per logical
    /// call, so retries that cross a bucket edge keep their key; and a call
    /// whose key in the *previous* bucket is still recorded in the ledger is
    /// that call (a re-issue across a bucket edge verifies first, or replays).
    /// So calls less than one width apart are always the same call, calls two
    /// widths apart never are.
    TimeBucket(Duration),
    /// A durable identity given by the caller, as Temporal does with run id +
    /// activity id: the same run and step are the same logical call, whenever
    /// they happen. Prefer this when the caller has one.
    Durable {
        /// The run (workflow, conversation, episode) identifier.
        run: String,
        /// The step within the run.
        step: u64,
    },
    /// A key chosen by the caller. The ledger rejects its reuse with a
    /// different payload.
    Explicit(IdempotencyKey),
    /// The id an LLM provider gave the tool call (`call_…`, `toolu_…`): the
    /// model's own identity of one logical call. A model that asks twice for
    /// the same thing makes two calls, with two ids; a re-issue of one call
    /// (after a crash, a dropped connection) keeps its id.
    ToolCall(String),
}

impl KeyScope {
    /// The default scope: five-minute time buckets.
    pub const DEFAULT: KeyScope = KeyScope::TimeBucket(Duration::from_secs(300));

    /// A durable identity scope.
    pub fn durable(run: impl Into<String>, step: u64) -> Self {
        KeyScope::Durable { run: run.into(), step }
    }

    /// A tool-call id scope.
    pub fn tool_call(id: impl Into<String>) -> Self {
        KeyScope::ToolCall(id.into())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use erased::Payload as _;

    /// The previous bucket's key, patched into the stack window or derived
    /// again when the encoding spilled out of it, is the key a call made
    /// during the previous bucket had.
    #[test]
    fn the_previous_bucket_key_is_the_key_of_the_previous_bucket() {
        let width = Duration::from_secs(300);
        let scope = KeyScope::TimeBucket(width);
        let now = 1_700_000_123_456u64;
        let long = "p".repeat(600);
        let payloads: [&dyn erased::Payload; 2] = [&(42u64, "short"), &(long.as_str(),)];
        for payload in payloads {
            let derived = payload.call("agent-a", "send", &scope, now);
            let earlier = payload.call("agent-a", "send", &scope, now - 300_000).key;
            assert_eq!(derived.previous, Some((earlier, PayloadDigest::from_u128(earlier.0))));
            assert_ne!(derived.key, earlier);
        }
        // The first bucket has none; neither has another scope.
        let first = (1u8,).call("a", "b", &scope, 5);
        assert_eq!(first.previous, None);
        let durable = (1u8,).call("a", "b", &KeyScope::durable("r", 1), now);
        assert_eq!(durable.previous, None);
    }

    mod erased {
        use super::*;

        pub(super) trait Payload {
            fn call(&self, agent: &str, action: &str, scope: &KeyScope, ms: u64) -> Derived;
        }

        impl<T: Serialize> Payload for T {
            fn call(&self, agent: &str, action: &str, scope: &KeyScope, ms: u64) -> Derived {
                IdempotencyKey::derive_call(agent, action, self, scope, ms, true).unwrap()
            }
        }
    }
}
