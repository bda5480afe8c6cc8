//! Idempotency keys: one deterministic 128-bit key per logical call.
//!
//! A key is derived once, before the first attempt, and every attempt of that
//! logical call carries the same key, so a server that honours keys applies the
//! effect at most once whatever the retries do. The derivation is part of our
//! wire format: golden vectors in `tests/key_golden.rs` pin it across versions
//! and platforms.
//!
//! # Format (version 2)
//!
//! The key is xxh3-128 of one byte string, written in a single streaming pass
//! (no intermediate buffer beyond a 256-byte stack window):
//!
//! ```text
//! prefix  = "vtk2" ‖ str(agent) ‖ str(action)
//! str(s)  = len(s) as unsigned LEB128, shortest form ‖ UTF-8 bytes of s
//! bucket  = 0x00 ‖ bucket width in ms as u64 LE ‖ bucket index as u64 LE
//!
//! key     = xxh3_128( prefix ‖ bucket ‖ encoding(payload) )                     (time bucket)
//!         | xxh3_128( prefix ‖ 0x05 ‖ str(session) ‖ bucket ‖ encoding(payload) ) (session window)
//!         | xxh3_128( prefix ‖ 0x01 ‖ str(run) ‖ step as u64 LE )                  (durable identity)
//!         | xxh3_128( prefix ‖ 0x03 ‖ str(tool call id) )                          (tool call)
//!         | xxh3_128( prefix ‖ 0x04 ‖ encoding(effect identity) )                  (declared effect identity)
//! fingerprint = the key itself                                  (time bucket, session window)
//!             | xxh3_128( prefix ‖ 0x02 ‖ encoding(payload) )   (every other identity)
//! ```
//!
//! A request identity (run step, tool-call id, explicit key) or a declared
//! effect identity names the call by itself: its key does not commit to the
//! arguments, and the fingerprint the ledger keeps does, so the same
//! identity with other arguments is refused as a key reuse. (Version 1,
//! `"vtk1"`, hashed the payload into every key.)
//!
//! (LEB128: seven bits per byte, low group first, the high bit set on every
//! byte but the last; a length below 128 is one byte.)
//!
//! `encoding(payload)` is the self-delimiting, type-tagged, little-endian
//! encoding of the key-relevant arguments that the [`payload`] module
//! documents, produced by a `serde::Serializer` that streams into the hasher.
//! An explicit key ([`KeyScope::Explicit`]) is used as given, with the
//! fingerprint above.

pub(crate) mod number;
pub mod payload;
mod sink;

/// The format version, first in every hashed string: a change of what a key
/// commits to is a new version, so that a key persisted by one build never
/// means another call to the next. Version 2 derives request and effect
/// identities without the payload (version 1 hashed it into every key).
///
/// Within version 2, an integral float came to hash as the integer it
/// equals (`2.0` as `2`). No key came to mean another call (the key of
/// `{"n": 2}` means the same number still), so the version stayed: a new
/// version would have made every record unreachable, and a step completed
/// before the upgrade would run again after it. For a payload with an
/// integral float, recorded before that upgrade: a key that commits to the
/// payload (a time bucket, an MCP session window, an effect identity) is no
/// longer derived, so a retry across the upgrade is another call; a key
/// that does not (a step, a tool-call id, an explicit key) is found with
/// another payload fingerprint and refused as reused
/// ([`CallError::KeyReuse`](crate::CallError::KeyReuse)), never replayed
/// nor sent again, until a person resolves the record.
const FORMAT: &[u8] = b"vtk2";

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
    pub fn derive<P: Payload + ?Sized>(
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
    /// One rule decides what the key commits to: the *identity* of the
    /// call. A declared effect identity ([`Effect`]) or a request identity
    /// (a tool-call id, a run step, an explicit key) names the call by
    /// itself, so the key is derived from it alone and the fingerprint from
    /// the whole payload: the same identity with other arguments is then a
    /// mismatch the ledger refuses, not a new call. A time bucket names
    /// nothing, so its key commits to the payload and is its own
    /// fingerprint.
    #[inline]
    pub(crate) fn derive_call<P: Payload + ?Sized>(
        agent: &str,
        action: &str,
        payload: &P,
        scope: &KeyScope,
        unix_ms: u64,
        with_previous: bool,
    ) -> Result<Derived, KeyError> {
        let args = payload.args();
        if let Some(effect) = payload.effect() {
            let key = Self::hash(agent, action, |h| {
                h.sink().byte(0x04);
                h.encode(effect)
            })?;
            let fingerprint = fingerprint(agent, action, args)?;
            return Ok(Derived { key: Self(key), fingerprint, previous: None });
        }
        // Built in place and only borrowed from here on: moving the hasher
        // would copy its stack window.
        let mut h = PayloadHasher::new();
        let sink = h.sink();
        sink.update(FORMAT);
        sink.len_bytes(agent.as_bytes());
        sink.len_bytes(action.as_bytes());
        let width = match scope {
            KeyScope::Explicit(key) => {
                let fingerprint = fingerprint(agent, action, args)?;
                return Ok(Derived { key: *key, fingerprint, previous: None });
            }
            KeyScope::Durable { run, step } => {
                sink.byte(0x01);
                sink.len_bytes(run.as_bytes());
                sink.update(&step.to_le_bytes());
                let key = Self(h.digest128());
                let fingerprint = fingerprint(agent, action, args)?;
                return Ok(Derived { key, fingerprint, previous: None });
            }
            KeyScope::ToolCall(id) => {
                sink.byte(0x03);
                sink.len_bytes(id.as_bytes());
                let key = Self(h.digest128());
                let fingerprint = fingerprint(agent, action, args)?;
                return Ok(Derived { key, fingerprint, previous: None });
            }
            KeyScope::TimeBucket(width) => *width,
            KeyScope::Window { within, width } => {
                sink.byte(0x05);
                sink.len_bytes(within.as_bytes());
                *width
            }
        };
        // A zero width would divide by zero; treat it as 1 ms buckets.
        let width_ms = (width.as_millis() as u64).max(1);
        let sink = h.sink();
        sink.tagged_fixed(0x00, width_ms.to_le_bytes());
        let index = unix_ms / width_ms;
        let mut previous_bucket = None;
        if let Some(before) = index.checked_sub(1).filter(|_| with_previous) {
            previous_bucket = Some((sink.position(), before));
        }
        sink.update(&index.to_le_bytes());
        h.encode(args)?;
        let key = h.digest128();
        let previous = match previous_bucket {
            Some((at, before)) => {
                let patched =
                    at.and_then(|at| h.sink().digest128_patched(at, before.to_le_bytes()));
                // Spilled past the stack window: derive it again.
                let k = match patched {
                    Some(k) => k,
                    None => {
                        let earlier = before.saturating_mul(width_ms);
                        Self::derive_call(agent, action, args, scope, earlier, false)?.key.0
                    }
                };
                Some((Self(k), PayloadDigest::from_u128(k)))
            }
            None => None,
        };
        Ok(Derived { key: Self(key), fingerprint: PayloadDigest::from_u128(key), previous })
    }

    /// xxh3-128 of `"vtk2" ‖ str(agent) ‖ str(action) ‖ rest`.
    #[inline]
    fn hash(
        agent: &str,
        action: &str,
        rest: impl FnOnce(&mut PayloadHasher) -> Result<(), KeyError>,
    ) -> Result<u128, KeyError> {
        let mut h = PayloadHasher::new();
        let sink = h.sink();
        sink.update(FORMAT);
        sink.len_bytes(agent.as_bytes());
        sink.len_bytes(action.as_bytes());
        rest(&mut h)?;
        Ok(h.digest128())
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

/// The fingerprint of a payload whose key does not commit to it:
/// `"vtk2" ‖ str(agent) ‖ str(action) ‖ 0x02 ‖ encoding(payload)`. It
/// commits to agent and action as well, so another tool reusing the key is
/// a mismatch, not a replay.
fn fingerprint<A: Serialize + ?Sized>(
    agent: &str,
    action: &str,
    args: &A,
) -> Result<PayloadDigest, KeyError> {
    IdempotencyKey::hash(agent, action, |h| {
        h.sink().byte(0x02);
        h.encode(args)
    })
    .map(PayloadDigest::from_u128)
}

/// What a call's key is derived from: its key-relevant arguments and, when
/// the tool declares one, its *effect identity* (the arguments that name
/// the business action, `#[verified_tool(key(order))]`).
///
/// Every `Serialize` type is a payload without an effect identity (the key
/// then follows the call's [`KeyScope`]); [`Effect`] is one with.
pub trait Payload {
    /// The effect identity's type.
    type Effect: Serialize + ?Sized;
    /// The arguments' type.
    type Args: Serialize + ?Sized;
    /// The arguments that name the business action, if the tool declares them.
    fn effect(&self) -> Option<&Self::Effect>;
    /// Every key-relevant argument: what the payload fingerprint commits to.
    fn args(&self) -> &Self::Args;
}

impl<T: Serialize + ?Sized> Payload for T {
    type Effect = ();
    type Args = T;
    #[inline(always)]
    fn effect(&self) -> Option<&()> {
        None
    }
    #[inline(always)]
    fn args(&self) -> &T {
        self
    }
}

/// A payload with an effect identity: the key is derived from `identity`
/// alone (with agent and action), whatever the call's [`KeyScope`], so every
/// request for the same business action (a new tool-call id, another MCP
/// session, another process, a day later) meets the same key; the
/// fingerprint commits to `args`, so the same action with other arguments
/// (another amount for the same order) is refused as a key reuse.
///
/// ```text
/// key         = xxh3_128( "vtk2" ‖ str(agent) ‖ str(action) ‖ 0x04 ‖ encoding(identity) )
/// fingerprint = xxh3_128( "vtk2" ‖ str(agent) ‖ str(action) ‖ 0x02 ‖ encoding(args) )
/// ```
///
/// ```
/// use verified_tools::key::Effect;
/// use verified_tools::{IdempotencyKey, KeyScope};
///
/// let charge = |order: u64, cents: u64, call: &str| {
///     let payload = Effect { identity: &(order,), args: &(order, cents) };
///     IdempotencyKey::derive("billing", "charge", &payload, &KeyScope::tool_call(call), 0)
/// };
/// // Two tool calls asking for the same charge: one key.
/// assert_eq!(charge(1001, 2500, "call_A")?, charge(1001, 2500, "call_B")?);
/// assert_ne!(charge(1001, 2500, "call_A")?, charge(1002, 2500, "call_A")?);
/// # Ok::<(), verified_tools::KeyError>(())
/// ```
#[derive(Debug, Clone, Copy)]
pub struct Effect<'a, K: ?Sized, A: ?Sized> {
    /// The arguments that name the business action.
    pub identity: &'a K,
    /// Every key-relevant argument.
    pub args: &'a A,
}

impl<K: Serialize + ?Sized, A: Serialize + ?Sized> Payload for Effect<'_, K, A> {
    type Effect = K;
    type Args = A;
    #[inline(always)]
    fn effect(&self) -> Option<&K> {
        Some(self.identity)
    }
    #[inline(always)]
    fn args(&self) -> &A {
        self.args
    }
}

/// The *request identity* of a call: what, besides agent, action and
/// payload, says which request of the conversation this is, when the tool
/// declares no effect identity ([`Effect`], `#[verified_tool(key(..))]`).
///
/// Two identities answer "is this the same call?":
///
/// - the **effect identity** names the business action (the order a payment
///   is for, the customer a welcome mail goes to): every request for it
///   meets the same key, so it is done once whoever asks and however often.
///   Declare it on tools whose effect must happen once per business object:
///   a payment (`key(order)`), a welcome mail (`key(customer)`);
/// - the **request identity** (this type) names one request: a provider's
///   tool-call id, a durable run step, a key the caller chose. Use it alone
///   for tools whose repeats are legitimate (a reminder: each request is a
///   new reminder): a repeat is a new effect exactly when its request
///   identity is new.
///
/// | the caller has | scope | a repeat with the same arguments is | the same identity with other arguments |
/// |---|---|---|---|
/// | an LLM provider's tool-call id | [`ToolCall`](KeyScope::ToolCall) (`Context::for_tool_call`) | the same call only with the same id | refused: [`CallError::KeyReuse`](crate::CallError::KeyReuse) |
/// | a durable run id and step number | [`Durable`](KeyScope::Durable) (`Context::for_step`) | the same call only at the same step | refused |
/// | its own key for the action | [`Explicit`](KeyScope::Explicit) (`Context::for_key`) | the same call only with the same key | refused |
/// | a session, and nothing per request | [`Window`](KeyScope::Window) | the same call within about one window of that session | another call |
/// | nothing | [`TimeBucket`](KeyScope::TimeBucket) (the default, 5 min) | the same call within about one bucket | another call |
///
/// The first three name the request, so the key is derived from them alone
/// and the arguments go into the fingerprint the ledger checks. A time
/// bucket is a guess at what "the same call" means: calls more than two
/// widths apart are always different calls, so a retry ten minutes later is
/// a second effect. Prefer an identity the caller already has, and declare
/// an effect identity on tools that must never repeat.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
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
    /// A time bucket within one session or principal (`within`): two
    /// sessions never share a call, and within one, calls with the same
    /// arguments less than one `width` apart are the same call (a client's
    /// cancel-and-re-send after a timeout). What an MCP server uses for a
    /// `tools/call` that carries no id.
    Window {
        /// The session or principal.
        within: String,
        /// The bucket width.
        width: Duration,
    },
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

    /// A time bucket of `width` within the session or principal `within`.
    pub fn window(within: impl Into<String>, width: Duration) -> Self {
        KeyScope::Window { within: within.into(), width }
    }

    /// Whether the scope names the request by itself (so the key does not
    /// commit to the arguments, and the ledger checks them by fingerprint).
    pub fn names_the_request(&self) -> bool {
        matches!(self, KeyScope::Durable { .. } | KeyScope::Explicit(_) | KeyScope::ToolCall(_))
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
