//! serde_json's numbers when any crate in the build turns on its
//! `arbitrary_precision` feature.
//!
//! A feature of a dependency is unified across the build, so one crate can
//! change how every `serde_json::Number` serializes: with the feature, a
//! number is a struct named [`TOKEN`] with one field of that name holding
//! its text; without it, a `u64`, an `i64` or an `f64`. A key must not
//! depend on which crates a user happens to link, so the text is read back
//! into the value serde_json's parser would have produced without the
//! feature, and encoded as that, unless the feature keeps more than an
//! `f64` could: then the exact decimal is encoded, so that two values the
//! tool can tell apart never share a key.
//!
//! One difference stays: serde_json without its `float_roundtrip` feature
//! may read a long decimal as a neighbouring `f64`, which then hashes as
//! that `f64` (or as the integer it equals) where the exact text would not.

use serde::ser::{self, Impossible, Serializer};

use super::payload::{KeyError, PayloadHasher};

/// The struct and field name serde_json gives a number's text (and the
/// key its parser hands a visitor).
pub(crate) const TOKEN: &str = "$serde_json::private::Number";

/// Encodes a number's text by its exact value, as the tool that receives
/// it sees it: an integer (up to `u128`, or down to `i128::MIN`) as that
/// integer; a number whose text is an `f64`'s shortest decimal (what
/// serde_json without the feature would hand over) as that `f64`; any other
/// as its exact decimal, so that two numbers that round to one `f64` are
/// still two.
fn encode(hasher: &mut PayloadHasher, text: &str) -> Result<(), KeyError> {
    let Some(exact) = Decimal::parse(text) else {
        return Err(ser::Error::custom(format_args!("`{text}` is not a JSON number")));
    };
    match exact.integer() {
        Some(Ok(natural)) => return hasher.serialize_u128(natural),
        Some(Err(negative)) => return hasher.serialize_i128(negative),
        None => {}
    }
    if let Ok(float) = text.parse::<f64>()
        && float.is_finite()
        && Decimal::parse(&format!("{float:e}")).as_ref() == Some(&exact)
    {
        return hasher.serialize_f64(float);
    }
    hasher.decimal(exact.negative, &exact.digits, exact.exponent);
    Ok(())
}

/// A JSON number's exact value: `±digits × 10^exponent`, with no leading
/// or trailing zero in `digits` (empty for zero, which is never negative).
#[derive(Debug, PartialEq, Eq)]
struct Decimal {
    negative: bool,
    digits: String,
    exponent: i64,
}

impl Decimal {
    /// The value of a number in JSON's grammar (and Rust's `{:e}`), or
    /// `None` for anything else.
    fn parse(text: &str) -> Option<Self> {
        let (negative, rest) = match text.strip_prefix('-') {
            Some(rest) => (true, rest),
            None => (false, text),
        };
        let (mantissa, exponent) = match rest.split_once(['e', 'E']) {
            Some((mantissa, exponent)) => (mantissa, exponent.parse::<i64>().ok()?),
            None => (rest, 0),
        };
        let (whole, fraction) = mantissa.split_once('.').unwrap_or((mantissa, ""));
        let digits = |s: &str| s.bytes().all(|b| b.is_ascii_digit());
        if whole.is_empty() || !digits(whole) || !digits(fraction) || mantissa.ends_with('.') {
            return None;
        }
        let all = format!("{whole}{fraction}");
        let significant = all.trim_start_matches('0');
        let trimmed = significant.trim_end_matches('0');
        let shift = i64::try_from(fraction.len()).ok()?;
        let dropped = i64::try_from(significant.len() - trimmed.len()).ok()?;
        if trimmed.is_empty() {
            return Some(Self { negative: false, digits: String::new(), exponent: 0 });
        }
        let exponent = exponent.checked_sub(shift)?.checked_add(dropped)?;
        Some(Self { negative, digits: trimmed.to_owned(), exponent })
    }

    /// The value as an integer, if it is one that fits: `Ok` for zero and
    /// above, `Err` below.
    fn integer(&self) -> Option<Result<u128, i128>> {
        let exponent = u32::try_from(self.exponent).ok()?;
        let mut value =
            if self.digits.is_empty() { 0 } else { self.digits.parse::<u128>().ok()? };
        value = value.checked_mul(10u128.checked_pow(exponent)?)?;
        match self.negative {
            false => Some(Ok(value)),
            true => Some(Err(0i128.checked_sub_unsigned(value)?)),
        }
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
            "0.1",
            "-2.5e-300",
            "1e40",
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

    fn digest(text: &'static str) -> u128 {
        payload_digest(&AsArbitraryPrecision(text)).unwrap().as_u128()
    }

    #[test]
    fn two_values_that_round_to_one_f64_keep_two_keys() {
        let pairs = [
            ("1.000000000000000001", "1"),
            ("18446744073709551617", "18446744073709551616"),
            ("-9223372036854775809", "-9223372036854775808"),
            ("0.123456789012345679", "0.12345678901234568"),
            ("0.1000000000000000055511151231257827", "0.1"),
        ];
        for (one, other) in pairs {
            assert_ne!(digest(one), digest(other), "{one} and {other}");
        }
    }

    #[test]
    fn one_value_spelled_differently_has_one_key() {
        let spellings: [&[&'static str]; 4] = [
            &["1.50", "1.5", "15e-1", "0.15E1", "0.0015e+3"],
            &["100", "1e2", "1.00e2", "100.0", "10000e-2"],
            &["1.000000000000000001", "1000000000000000001e-18", "0.1000000000000000001e1"],
            &["0", "-0", "0.000", "0e7", "-0.0e-3"],
        ];
        for texts in spellings {
            for text in &texts[1..] {
                assert_eq!(digest(texts[0]), digest(text), "{} and {text}", texts[0]);
            }
        }
    }

    #[test]
    fn an_exact_decimal_is_encoded_as_documented() {
        // 13 ‖ str(digits) ‖ negative ‖ i64 exponent, in the hasher's
        // xxh3-128 with no framing around a lone payload.
        let mut bytes = vec![0x13, 19];
        bytes.extend_from_slice(b"1000000000000000001");
        bytes.push(1);
        bytes.extend_from_slice(&(-18i64).to_le_bytes());
        assert_eq!(digest("-1.000000000000000001"), xxhash_rust::xxh3::xxh3_128(&bytes));
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
        for text in ["1x", "", "-", "1.", ".5", "1e", "--1", "1e99999999999999999999"] {
            assert!(payload_digest(&AsArbitraryPrecision(text)).is_err(), "{text}");
        }
    }
}
