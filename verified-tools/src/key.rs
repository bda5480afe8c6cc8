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
        Self::derive_with_fingerprint(agent, action, payload, scope, unix_ms).map(|(key, _)| key)
    }

    /// The key and the payload fingerprint the ledger keeps with it.
    ///
    /// A derived key already commits to the payload, so it is its own
    /// fingerprint; an explicit key does not, so its payload is hashed.
    #[inline]
    pub(crate) fn derive_with_fingerprint<P: Serialize + ?Sized>(
        agent: &str,
        action: &str,
        payload: &P,
        scope: &KeyScope,
        unix_ms: u64,
    ) -> Result<(Self, PayloadDigest), KeyError> {
        // Built in place and only borrowed from here on: moving the hasher
        // would copy its stack window.
        let mut h = PayloadHasher::new();
        let sink = h.sink();
        sink.update(b"vtk1");
        sink.len_bytes(agent.as_bytes());
        sink.len_bytes(action.as_bytes());
        match scope {
            KeyScope::Explicit(key) => {
                // The explicit key commits to nothing, so the fingerprint must
                // commit to everything: agent, action and payload. Another
                // tool reusing the key is then a mismatch, not a replay.
                sink.byte(0x02);
                h.encode(payload)?;
                return Ok((*key, PayloadDigest::from_u128(h.digest128())));
            }
            KeyScope::TimeBucket(width) => {
                // A zero width would divide by zero; treat it as 1 ms buckets.
                let width_ms = (width.as_millis() as u64).max(1);
                sink.tagged_fixed(0x00, width_ms.to_le_bytes());
                sink.update(&(unix_ms / width_ms).to_le_bytes());
            }
            KeyScope::Durable { run, step } => {
                sink.byte(0x01);
                sink.len_bytes(run.as_bytes());
                sink.update(&step.to_le_bytes());
            }
        }
        h.encode(payload)?;
        let key = h.digest128();
        Ok((Self(key), PayloadDigest::from_u128(key)))
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

/// What, besides agent, action and payload, separates one logical call from
/// another with the same arguments.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum KeyScope {
    /// Calls in the same time bucket of this width are the same logical call
    /// (the paper's `timestamp_bucket`). The bucket is read once per logical
    /// call, so retries that cross a bucket edge keep their key.
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
}

impl KeyScope {
    /// The default scope: five-minute time buckets.
    pub const DEFAULT: KeyScope = KeyScope::TimeBucket(Duration::from_secs(300));

    /// A durable identity scope.
    pub fn durable(run: impl Into<String>, step: u64) -> Self {
        KeyScope::Durable { run: run.into(), step }
    }
}
