//! How a completed call's value is kept in a store: serialized through serde
//! when its type allows, or not at all (the record then says "completed"
//! without a value, and a repeat obtains the value by verifying).

use std::fmt;
use std::marker::PhantomData;

use serde::Serialize;
use serde::de::DeserializeOwned;

/// How values of `T` are written to and read from a ledger's store.
///
/// The stored form is JSON (readable with `redis-cli` or `sqlite3`). Pick one
/// with [`Codec::serde`] or [`Codec::unrecorded`]; `#[verified_tool]` picks
/// `serde` by itself when the value type is `Serialize + DeserializeOwned`.
///
/// ```
/// use verified_tools::ledger::Codec;
///
/// let codec = Codec::<u32>::serde();
/// let bytes = codec.encode(&7).unwrap();
/// assert_eq!(codec.decode(&bytes), Some(7));
/// assert_eq!(Codec::<u32>::unrecorded().encode(&7), None);
/// ```
pub struct Codec<T> {
    encode: fn(&T) -> Option<Vec<u8>>,
    decode: fn(&[u8]) -> Option<T>,
}

impl<T> Clone for Codec<T> {
    fn clone(&self) -> Self {
        *self
    }
}

impl<T> Copy for Codec<T> {}

impl<T> fmt::Debug for Codec<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Codec")
    }
}

impl<T: Serialize + DeserializeOwned> Codec<T> {
    /// Values are stored as JSON.
    pub const fn serde() -> Self {
        Self {
            encode: |value| serde_json::to_vec(value).ok(),
            decode: |bytes| serde_json::from_slice(bytes).ok(),
        }
    }
}

impl<T> Codec<T> {
    /// Values are not stored: a repeat in another process verifies to get
    /// the value, and never dispatches again.
    pub const fn unrecorded() -> Self {
        Self { encode: |_| None, decode: |_| None }
    }

    /// The value's stored form, if it has one.
    pub fn encode(&self, value: &T) -> Option<Vec<u8>> {
        (self.encode)(value)
    }

    /// The value back from its stored form; `None` if it does not decode
    /// (written by another version of the tool, say).
    pub fn decode(&self, bytes: &[u8]) -> Option<T> {
        (self.decode)(bytes)
    }
}

/// Picks [`Codec::serde`] for a type that serializes and
/// [`Codec::unrecorded`] for any other, at compile time, by autoref
/// specialization: `(&CodecProbe::<T>::new()).codec()` with both
/// [`SerdeCodec`] and [`UnrecordedCodec`] in scope. This is what
/// `#[verified_tool]` generates.
///
/// ```
/// use verified_tools::ledger::{CodecProbe, SerdeCodec as _, UnrecordedCodec as _};
///
/// struct Handle; // no serde
/// assert!((&CodecProbe::<u32>::new()).codec().encode(&1).is_some());
/// assert!((&CodecProbe::<Handle>::new()).codec().encode(&Handle).is_none());
/// ```
pub struct CodecProbe<T>(PhantomData<fn() -> T>);

impl<T> CodecProbe<T> {
    /// A probe for `T`.
    pub const fn new() -> Self {
        Self(PhantomData)
    }
}

impl<T> Default for CodecProbe<T> {
    fn default() -> Self {
        Self::new()
    }
}

/// The serde arm of [`CodecProbe`].
pub trait SerdeCodec<T> {
    /// The codec of `T`.
    fn codec(&self) -> Codec<T>;
}

impl<T: Serialize + DeserializeOwned> SerdeCodec<T> for CodecProbe<T> {
    fn codec(&self) -> Codec<T> {
        Codec::serde()
    }
}

/// The fallback arm of [`CodecProbe`].
pub trait UnrecordedCodec<T> {
    /// The codec of `T`.
    fn codec(&self) -> Codec<T>;
}

impl<T> UnrecordedCodec<T> for &CodecProbe<T> {
    fn codec(&self) -> Codec<T> {
        Codec::unrecorded()
    }
}
