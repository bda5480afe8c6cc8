//! serde_json's numbers when any crate in the build turns on its
//! `arbitrary_precision` feature.
//!
//! A feature of a dependency is unified across the build, so one crate can
//! change how every `serde_json::Number` serializes: with the feature, a
//! number is a struct named [`TOKEN`] with one field of that name holding
//! its text; without it, a `u64`, an `i64` or an `f64`. A key must not
//! depend on which crates a user happens to link, so the text is read back
//! into the value serde_json's parser would have produced without the
//! feature, and encoded as that.

use serde::ser::{self, Impossible, Serializer};

use super::payload::{KeyError, PayloadHasher};

/// The struct and field name serde_json gives a number's text.
pub(super) const TOKEN: &str = "$serde_json::private::Number";

/// Encodes a number's text as serde_json without `arbitrary_precision`
/// would hand it over: an integer that fits `u64` (or a negative one that
/// fits `i64`) as that integer, anything else (`1.0`, `1e3`, `-0`, an integer
/// too large) as the nearest `f64`.
fn encode(hasher: &mut PayloadHasher, text: &str) -> Result<(), KeyError> {
    if !text.contains(['.', 'e', 'E']) {
        if text.starts_with('-') {
            // serde_json reads `-0` as the float -0.0, not the integer 0.
            if let Ok(negative @ ..0) = text.parse::<i64>() {
                return hasher.serialize_i64(negative);
            }
        } else if let Ok(natural) = text.parse::<u64>() {
            return hasher.serialize_u64(natural);
        }
    }
    match text.parse::<f64>() {
        Ok(float) if float.is_finite() => hasher.serialize_f64(float),
        _ => Err(ser::Error::custom(format_args!("`{text}` is not a JSON number"))),
    }
}

/// The serializer of a number's text: a string, and nothing else.
pub(super) struct NumberText<'a>(pub(super) &'a mut PayloadHasher);

/// Every method but `serialize_str` refuses: serde_json writes the text of
/// a number as a string, so anything else is a struct that only borrowed
/// the name.
macro_rules! not_text {
    ($($method:ident($($arg:ty),*) -> $ok:ty;)*) => {$(
        fn $method(self, $(_: $arg),*) -> Result<$ok, KeyError> {
            Err(ser::Error::custom(concat!(
                "a field named `", "$serde_json::private::Number", "` holds no number text"
            )))
        }
    )*};
}

type No = Impossible<(), KeyError>;

impl Serializer for NumberText<'_> {
    type Ok = ();
    type Error = KeyError;
    type SerializeSeq = No;
    type SerializeTuple = No;
    type SerializeTupleStruct = No;
    type SerializeTupleVariant = No;
    type SerializeMap = No;
    type SerializeStruct = No;
    type SerializeStructVariant = No;

    fn serialize_str(self, text: &str) -> Result<(), KeyError> {
        encode(self.0, text)
    }

    not_text! {
        serialize_bool(bool) -> ();
        serialize_i8(i8) -> ();
        serialize_i16(i16) -> ();
        serialize_i32(i32) -> ();
        serialize_i64(i64) -> ();
        serialize_u8(u8) -> ();
        serialize_u16(u16) -> ();
        serialize_u32(u32) -> ();
        serialize_u64(u64) -> ();
        serialize_f32(f32) -> ();
        serialize_f64(f64) -> ();
        serialize_char(char) -> ();
        serialize_bytes(&[u8]) -> ();
        serialize_none() -> ();
        serialize_unit() -> ();
        serialize_unit_struct(&'static str) -> ();
        serialize_unit_variant(&'static str, u32, &'static str) -> ();
        serialize_seq(Option<usize>) -> No;
        serialize_tuple(usize) -> No;
        serialize_tuple_struct(&'static str, usize) -> No;
        serialize_tuple_variant(&'static str, u32, &'static str, usize) -> No;
        serialize_map(Option<usize>) -> No;
        serialize_struct(&'static str, usize) -> No;
        serialize_struct_variant(&'static str, u32, &'static str, usize) -> No;
    }

    fn serialize_some<T: ser::Serialize + ?Sized>(self, _: &T) -> Result<(), KeyError> {
        self.serialize_unit()
    }
    fn serialize_newtype_struct<T: ser::Serialize + ?Sized>(
        self,
        _: &'static str,
        _: &T,
    ) -> Result<(), KeyError> {
        self.serialize_unit()
    }
    fn serialize_newtype_variant<T: ser::Serialize + ?Sized>(
        self,
        _: &'static str,
        _: u32,
        _: &'static str,
        _: &T,
    ) -> Result<(), KeyError> {
        self.serialize_unit()
    }
}

#[cfg(test)]
mod tests {
    use serde::ser::{SerializeStruct, Serializer};
    use serde_json::Value;

    use super::TOKEN;
    use crate::key::payload::{KeyError, payload_digest};

    /// What serde_json hands a serializer for a number when it is built
    /// with `arbitrary_precision` (this build is not: serde_json's own
    /// `Number` is the reference below).
    struct AsArbitraryPrecision(&'static str);

    impl serde::Serialize for AsArbitraryPrecision {
        fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
            let mut number = s.serialize_struct(TOKEN, 1)?;
            number.serialize_field(TOKEN, self.0)?;
            number.end()
        }
    }

    #[test]
    fn a_number_has_one_key_whether_or_not_serde_json_keeps_its_text() {
        let texts = [
            "0",
            "7",
            "-5",
            "-0",
            "1.0",
            "1.5",
            "1e3",
            "-2.5E-3",
            "9223372036854775807",
            "9223372036854775808",
            "18446744073709551615",
            "18446744073709551616",
            "-9223372036854775808",
            "-9223372036854775809",
        ];
        for text in texts {
            let parsed: Value = serde_json::from_str(text).unwrap();
            assert_eq!(
                payload_digest(&AsArbitraryPrecision(text)).unwrap(),
                payload_digest(&parsed).unwrap(),
                "{text}"
            );
        }
    }

    #[test]
    fn a_struct_that_only_borrows_the_name_is_an_error() {
        struct Impostor;
        impl serde::Serialize for Impostor {
            fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
                let mut number = s.serialize_struct(TOKEN, 1)?;
                number.serialize_field(TOKEN, &5u8)?;
                number.end()
            }
        }
        let error: KeyError = payload_digest(&Impostor).unwrap_err();
        assert!(error.to_string().contains("holds no number text"), "{error}");
        assert!(payload_digest(&AsArbitraryPrecision("1x")).is_err());
    }
}
