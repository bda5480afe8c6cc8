//! The payload hasher: a `serde::Serializer` that streams a canonical encoding
//! of the key-relevant arguments into xxh3-128, with no heap buffer (a
//! 256-byte stack window in front of the hasher).
//!
//! # Encoding (version 1)
//!
//! Every value starts with a one-byte tag and is self-delimiting, so the
//! concatenation of values is unambiguous (no encoding is a prefix of
//! another): `("ab", "c")` and `("a", "bc")` encode differently by
//! construction. Fixed-width numbers are little-endian.
//!
//! Below, `len(n)` is `n` as unsigned LEB128 in its shortest form (seven bits
//! per byte, low group first, high bit set on every byte but the last: 0–127
//! is one byte, 128 is `80 01`), and `str(s)` is `len(s.len()) ‖ UTF-8 bytes
//! of s`, with no tag.
//!
//! | value | bytes |
//! |---|---|
//! | bool | `01` ‖ 0 or 1 |
//! | integer that fits i64 (any width, signed or not) | `02` ‖ i64 |
//! | other integer that fits i128 (u64 above i64::MAX included) | `03` ‖ i128 |
//! | u128 above i128::MAX | `04` ‖ u128 |
//! | f32, f64 with an integral value (`-0.0` included) | as the integer it equals |
//! | other f32, f64 (f32 widened; every NaN → the canonical NaN) | `05` ‖ f64 bits |
//! | char | `06` ‖ u32 |
//! | str | `07` ‖ str(s) |
//! | bytes | `08` ‖ len(n) ‖ bytes |
//! | None / Some(v) | `09` / `0A` ‖ v |
//! | unit, unit struct | `0B` |
//! | unit variant | `0C` ‖ str(variant) |
//! | newtype struct | the inner value (transparent, as in JSON) |
//! | newtype variant | `0D` ‖ str(variant) ‖ value |
//! | seq, tuple, tuple struct | `0E` ‖ values ‖ `FF` |
//! | tuple variant | `0F` ‖ str(variant) ‖ `0E` ‖ values ‖ `FF` |
//! | map | `10` ‖ len(entries) ‖ Σ xxh3_128(key ‖ value) over entries (wrapping u128, LE) |
//! | struct | `11` ‖ (`07` ‖ str(field) ‖ value)* ‖ `FF` |
//! | struct variant | `12` ‖ str(variant) ‖ (`07` ‖ str(field) ‖ value)* ‖ `FF` |
//! | exact decimal (below) | `13` ‖ str(digits) ‖ 0 or 1 (negative) ‖ i64 exponent |
//!
//! A field name is tagged like a string value, so it can never be read as
//! the `FF` that ends the struct. Integers stay fixed-width: writing them is
//! one store, and the few bytes a varint would save do not change the cost of
//! hashing a small payload (xxh3 works in 16- and 32-byte rounds).
//!
//! Maps hash each entry on its own and add the digests, so a `HashMap` gives
//! the same key whatever its iteration order (and the same as a `BTreeMap`
//! with the same entries). Sets serialize as sequences: use `BTreeSet`, not
//! `HashSet`, in key-relevant arguments. Struct and type names are not part of
//! the encoding, so renaming a type keeps its keys; field and variant names
//! are, as in JSON.
//!
//! A `serde_json::Number` encodes as the integer or float it is, whether or
//! not a crate in the build turns on serde_json's `arbitrary_precision`
//! (which makes a number serialize as a private struct holding its text):
//! the text is read back as serde_json without the feature would read it. A
//! number the feature keeps more exactly than an integer or an `f64` can
//! (`1.000000000000000001`) is its exact decimal: `digits × 10^exponent`,
//! `digits` with no leading or trailing zero.

use serde::Serialize;
use serde::ser;

use super::number;
use super::sink::Sink;

const BOOL: u8 = 0x01;
const INT: u8 = 0x02;
const I128: u8 = 0x03;
const U128: u8 = 0x04;
const FLOAT: u8 = 0x05;
const CHAR: u8 = 0x06;
const STR: u8 = 0x07;
const BYTES: u8 = 0x08;
const NONE: u8 = 0x09;
const SOME: u8 = 0x0A;
const UNIT: u8 = 0x0B;
const UNIT_VARIANT: u8 = 0x0C;
const NEWTYPE_VARIANT: u8 = 0x0D;
const SEQ: u8 = 0x0E;
const TUPLE_VARIANT: u8 = 0x0F;
const MAP: u8 = 0x10;
const STRUCT: u8 = 0x11;
const STRUCT_VARIANT: u8 = 0x12;
const DECIMAL: u8 = 0x13;
const END: u8 = 0xFF;

/// The xxh3-128 digest of a payload's canonical encoding.
///
/// Also used as the ledger's payload fingerprint, so that an explicit key
/// reused with other arguments is caught.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct PayloadDigest(u128);

impl PayloadDigest {
    /// The raw digest.
    pub const fn as_u128(self) -> u128 {
        self.0
    }

    /// A digest read back from storage.
    pub const fn from_u128(value: u128) -> Self {
        Self(value)
    }
}

/// A payload could not be encoded for its idempotency key.
///
/// Raised by the argument's own `Serialize` impl (serde's `custom` errors)
/// before anything is dispatched.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("the payload cannot be serialized for its idempotency key: {0}")]
pub struct KeyError(String);

impl ser::Error for KeyError {
    fn custom<T: std::fmt::Display>(msg: T) -> Self {
        KeyError(msg.to_string())
    }
}

/// Streams `payload` through the canonical encoding into xxh3-128.
///
/// ```
/// use verified_tools::key::payload_digest;
///
/// let a = payload_digest(&("ab", "c"))?;
/// let b = payload_digest(&("a", "bc"))?;
/// assert_ne!(a, b);
/// // Integers are hashed by value, whatever their Rust type.
/// assert_eq!(payload_digest(&7u8)?, payload_digest(&7i64)?);
/// # Ok::<(), verified_tools::KeyError>(())
/// ```
#[inline]
pub fn payload_digest<P: Serialize + ?Sized>(payload: &P) -> Result<PayloadDigest, KeyError> {
    let mut h = PayloadHasher::new();
    h.encode(payload)?;
    Ok(PayloadDigest(h.digest128()))
}

/// The serializer: the encoding's bytes go straight into a [`Sink`].
///
/// Built in place and only ever borrowed: moving it would copy the sink.
pub(crate) struct PayloadHasher(Sink);

impl PayloadHasher {
    #[inline(always)]
    pub(crate) fn new() -> Self {
        PayloadHasher(Sink::new())
    }

    /// The sink, for the framing that precedes the payload.
    #[inline(always)]
    pub(crate) fn sink(&mut self) -> &mut Sink {
        &mut self.0
    }

    /// Appends the encoding of `payload`.
    #[inline(always)]
    pub(crate) fn encode<P: Serialize + ?Sized>(&mut self, payload: &P) -> Result<(), KeyError> {
        payload.serialize(self)
    }

    /// xxh3-128 of everything written.
    #[inline(always)]
    pub(crate) fn digest128(&mut self) -> u128 {
        self.0.digest128()
    }

    #[inline(always)]
    fn tag(&mut self, tag: u8) {
        self.0.byte(tag);
    }

    /// A tag and a fixed-width value, in one write.
    #[inline(always)]
    fn tagged<const N: usize>(&mut self, tag: u8, bytes: [u8; N]) {
        self.0.tagged_fixed(tag, bytes);
    }

    /// `tag ‖ str(name)`, for variant names.
    #[inline(always)]
    fn named(&mut self, tag: u8, name: &str) {
        self.0.tagged_bytes(tag, name.as_bytes());
    }

    /// `str(key) ‖ value`, one field of a struct. Tagged, so that a name can
    /// never be read as the END byte; tag, length and a short name are one
    /// write.
    #[inline(always)]
    fn field<T: Serialize + ?Sized>(&mut self, key: &str, value: &T) -> Result<(), KeyError> {
        self.0.tagged_bytes(STR, key.as_bytes());
        value.serialize(self)
    }

    /// An exact decimal `±digits × 10^exponent` (see [`number`]).
    pub(super) fn decimal(&mut self, negative: bool, digits: &str, exponent: i64) {
        self.0.tagged_bytes(DECIMAL, digits.as_bytes());
        self.0.byte(negative.into());
        self.0.update(&exponent.to_le_bytes());
    }

    #[inline(always)]
    fn int(&mut self, v: i128) {
        match i64::try_from(v) {
            Ok(small) => self.tagged(INT, small.to_le_bytes()),
            Err(_) => self.tagged(I128, v.to_le_bytes()),
        }
    }
}

impl<'a> ser::Serializer for &'a mut PayloadHasher {
    type Ok = ();
    type Error = KeyError;
    type SerializeSeq = Self;
    type SerializeTuple = Self;
    type SerializeTupleStruct = Self;
    type SerializeTupleVariant = Self;
    type SerializeMap = MapHasher<'a>;
    type SerializeStruct = StructHasher<'a>;
    type SerializeStructVariant = Self;

    #[inline]
    fn serialize_bool(self, v: bool) -> Result<(), KeyError> {
        self.tagged(BOOL, [v as u8]);
        Ok(())
    }
    #[inline]
    fn serialize_i8(self, v: i8) -> Result<(), KeyError> {
        self.serialize_i64(v.into())
    }
    #[inline]
    fn serialize_i16(self, v: i16) -> Result<(), KeyError> {
        self.serialize_i64(v.into())
    }
    #[inline]
    fn serialize_i32(self, v: i32) -> Result<(), KeyError> {
        self.serialize_i64(v.into())
    }
    #[inline]
    fn serialize_i64(self, v: i64) -> Result<(), KeyError> {
        self.tagged(INT, v.to_le_bytes());
        Ok(())
    }
    #[inline]
    fn serialize_i128(self, v: i128) -> Result<(), KeyError> {
        self.int(v);
        Ok(())
    }
    #[inline]
    fn serialize_u8(self, v: u8) -> Result<(), KeyError> {
        self.serialize_i64(v.into())
    }
    #[inline]
    fn serialize_u16(self, v: u16) -> Result<(), KeyError> {
        self.serialize_i64(v.into())
    }
    #[inline]
    fn serialize_u32(self, v: u32) -> Result<(), KeyError> {
        self.serialize_i64(v.into())
    }
    #[inline]
    fn serialize_u64(self, v: u64) -> Result<(), KeyError> {
        self.int(v.into());
        Ok(())
    }
    #[inline]
    fn serialize_u128(self, v: u128) -> Result<(), KeyError> {
        match i128::try_from(v) {
            Ok(small) => self.int(small),
            Err(_) => self.tagged(U128, v.to_le_bytes()),
        }
        Ok(())
    }
    #[inline]
    fn serialize_f32(self, v: f32) -> Result<(), KeyError> {
        self.serialize_f64(v.into())
    }
    #[inline]
    fn serialize_f64(self, v: f64) -> Result<(), KeyError> {
        // A number is hashed by its value: JSON's `1000`, `1000.0` and `1e3`
        // are one number, and a model that asks again may write any of them.
        // `-0.0` is integral too, so it is the integer 0. The upper bound,
        // 2^128, is excluded: `as u128` would saturate it to u128::MAX.
        if v.fract() == 0.0 && (i128::MIN as f64..u128::MAX as f64).contains(&v) {
            return if v < 0.0 {
                self.serialize_i128(v as i128)
            } else {
                self.serialize_u128(v as u128)
            };
        }
        let canonical = if v.is_nan() { f64::NAN } else { v };
        self.tagged(FLOAT, canonical.to_bits().to_le_bytes());
        Ok(())
    }
    #[inline]
    fn serialize_char(self, v: char) -> Result<(), KeyError> {
        self.tagged(CHAR, u32::from(v).to_le_bytes());
        Ok(())
    }
    #[inline(always)]
    fn serialize_str(self, v: &str) -> Result<(), KeyError> {
        self.0.tagged_bytes(STR, v.as_bytes());
        Ok(())
    }
    #[inline]
    fn serialize_bytes(self, v: &[u8]) -> Result<(), KeyError> {
        self.0.tagged_bytes(BYTES, v);
        Ok(())
    }
    #[inline]
    fn serialize_none(self) -> Result<(), KeyError> {
        self.tag(NONE);
        Ok(())
    }
    #[inline]
    fn serialize_some<T: Serialize + ?Sized>(self, value: &T) -> Result<(), KeyError> {
        self.tag(SOME);
        value.serialize(self)
    }
    #[inline]
    fn serialize_unit(self) -> Result<(), KeyError> {
        self.tag(UNIT);
        Ok(())
    }
    #[inline]
    fn serialize_unit_struct(self, _name: &'static str) -> Result<(), KeyError> {
        self.serialize_unit()
    }
    #[inline]
    fn serialize_unit_variant(
        self,
        _name: &'static str,
        _index: u32,
        variant: &'static str,
    ) -> Result<(), KeyError> {
        self.named(UNIT_VARIANT, variant);
        Ok(())
    }
    #[inline]
    fn serialize_newtype_struct<T: Serialize + ?Sized>(
        self,
        _name: &'static str,
        value: &T,
    ) -> Result<(), KeyError> {
        value.serialize(self)
    }
    #[inline]
    fn serialize_newtype_variant<T: Serialize + ?Sized>(
        self,
        _name: &'static str,
        _index: u32,
        variant: &'static str,
        value: &T,
    ) -> Result<(), KeyError> {
        self.named(NEWTYPE_VARIANT, variant);
        value.serialize(self)
    }
    #[inline]
    fn serialize_seq(self, _len: Option<usize>) -> Result<Self, KeyError> {
        // The terminator, not a length, delimits a sequence, so sequences of
        // unknown length encode like the others.
        self.tag(SEQ);
        Ok(self)
    }
    #[inline]
    fn serialize_tuple(self, len: usize) -> Result<Self, KeyError> {
        self.serialize_seq(Some(len))
    }
    #[inline]
    fn serialize_tuple_struct(self, _name: &'static str, len: usize) -> Result<Self, KeyError> {
        self.serialize_seq(Some(len))
    }
    #[inline]
    fn serialize_tuple_variant(
        self,
        _name: &'static str,
        _index: u32,
        variant: &'static str,
        _len: usize,
    ) -> Result<Self, KeyError> {
        self.named(TUPLE_VARIANT, variant);
        self.tag(SEQ);
        Ok(self)
    }
    #[inline]
    fn serialize_map(self, _len: Option<usize>) -> Result<MapHasher<'a>, KeyError> {
        Ok(MapHasher { outer: self, entry: PayloadHasher::new(), open: false, sum: 0, count: 0 })
    }
    #[inline]
    fn serialize_struct(
        self,
        name: &'static str,
        _len: usize,
    ) -> Result<StructHasher<'a>, KeyError> {
        // `name` is a constant at every derived call site, where the test is
        // a length comparison (+3–4 Ir a derived struct's key: BENCHMARKS.md,
        // "Stop 29").
        let number = name == number::TOKEN;
        if !number {
            self.tag(STRUCT);
        }
        Ok(StructHasher { outer: self, number })
    }
    #[inline]
    fn serialize_struct_variant(
        self,
        _name: &'static str,
        _index: u32,
        variant: &'static str,
        _len: usize,
    ) -> Result<Self, KeyError> {
        self.named(STRUCT_VARIANT, variant);
        Ok(self)
    }
    #[inline]
    fn is_human_readable(&self) -> bool {
        // Types such as IP addresses then serialize as their text form, which
        // is stable across serde versions.
        true
    }
}

macro_rules! seq_like {
    ($($trait:ident :: $method:ident),*) => {$(
        impl ser::$trait for &mut PayloadHasher {
            type Ok = ();
            type Error = KeyError;
            #[inline]
            fn $method<T: Serialize + ?Sized>(&mut self, value: &T) -> Result<(), KeyError> {
                value.serialize(&mut **self)
            }
            #[inline]
            fn end(self) -> Result<(), KeyError> {
                self.tag(END);
                Ok(())
            }
        }
    )*};
}
seq_like!(
    SerializeSeq::serialize_element,
    SerializeTuple::serialize_element,
    SerializeTupleStruct::serialize_field,
    SerializeTupleVariant::serialize_field
);

impl ser::SerializeStructVariant for &mut PayloadHasher {
    type Ok = ();
    type Error = KeyError;
    // Always: the field name is then a constant at its call site in the
    // derived impl, and tag, length and name become a few stores.
    #[inline(always)]
    fn serialize_field<T: Serialize + ?Sized>(
        &mut self,
        key: &'static str,
        value: &T,
    ) -> Result<(), KeyError> {
        self.field(key, value)
    }
    #[inline]
    fn end(self) -> Result<(), KeyError> {
        self.tag(END);
        Ok(())
    }
}

/// A struct being encoded; `number` when it is serde_json's
/// `arbitrary_precision` form of a number (see [`number`]), which encodes
/// as the number it holds, with no struct around it.
#[doc(hidden)]
pub struct StructHasher<'a> {
    outer: &'a mut PayloadHasher,
    number: bool,
}

impl ser::SerializeStruct for StructHasher<'_> {
    type Ok = ();
    type Error = KeyError;
    #[inline(always)]
    fn serialize_field<T: Serialize + ?Sized>(
        &mut self,
        key: &'static str,
        value: &T,
    ) -> Result<(), KeyError> {
        if self.number {
            value.serialize(number::NumberText(self.outer))
        } else {
            self.outer.field(key, value)
        }
    }
    #[inline]
    fn end(self) -> Result<(), KeyError> {
        if !self.number {
            self.outer.tag(END);
        }
        Ok(())
    }
}

/// Hashes each map entry on its own so that entry order does not matter.
#[doc(hidden)]
pub struct MapHasher<'a> {
    outer: &'a mut PayloadHasher,
    /// The current entry's hasher, reused (not moved) for every entry.
    entry: PayloadHasher,
    /// A key has been written and its value not yet.
    open: bool,
    sum: u128,
    count: u64,
}

impl ser::SerializeMap for MapHasher<'_> {
    type Ok = ();
    type Error = KeyError;

    #[inline]
    fn serialize_key<T: Serialize + ?Sized>(&mut self, key: &T) -> Result<(), KeyError> {
        if self.open {
            return Err(ser::Error::custom("map key serialized without a value"));
        }
        self.entry.0.reset();
        self.open = true;
        key.serialize(&mut self.entry)
    }

    #[inline]
    fn serialize_value<T: Serialize + ?Sized>(&mut self, value: &T) -> Result<(), KeyError> {
        if !self.open {
            return Err(ser::Error::custom("map value serialized before its key"));
        }
        value.serialize(&mut self.entry)?;
        self.open = false;
        self.sum = self.sum.wrapping_add(self.entry.digest128());
        self.count += 1;
        Ok(())
    }

    #[inline]
    fn end(self) -> Result<(), KeyError> {
        if self.open {
            return Err(ser::Error::custom("map key serialized without a value"));
        }
        let sink = self.outer.sink();
        sink.byte(MAP);
        sink.varint(self.count);
        sink.update(&self.sum.to_le_bytes());
        Ok(())
    }
}
