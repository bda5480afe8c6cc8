//! A byte sink in front of xxh3-128: writes land in a 256-byte stack buffer,
//! and an encoding that fits the buffer is hashed one-shot.
//!
//! The digest is exactly `xxh3_128` of all the bytes written, whatever the
//! write sizes; the buffer only saves the per-call cost of the streaming
//! hasher, which dominated key derivation (see BENCHMARKS.md). The streaming
//! state is built only when the buffer first overflows, and the sink is
//! never moved after construction (everything takes `&mut self`): a move
//! would copy its ~700 bytes.

use xxhash_rust::xxh3::{Xxh3Default, xxh3_128};

const BUF: usize = 256;

pub(crate) struct Sink {
    buf: [u8; BUF],
    /// Bytes used in `buf`; always `<= BUF`.
    len: usize,
    /// The streaming hasher, once the buffer has overflowed.
    stream: Option<Xxh3Default>,
}

impl Sink {
    #[inline(always)]
    pub(crate) fn new() -> Self {
        Sink { buf: [0; BUF], len: 0, stream: None }
    }

    /// Forgets everything written, for the next entry of a map.
    #[inline]
    pub(crate) fn reset(&mut self) {
        self.len = 0;
        self.stream = None;
    }

    /// Appends `bytes`.
    #[inline(always)]
    pub(crate) fn update(&mut self, bytes: &[u8]) {
        let (n, at) = (bytes.len(), self.len);
        if n <= BUF - at {
            copy_short(&mut self.buf[at..at + n], bytes);
            self.len = at + n;
        } else {
            self.spill(bytes);
        }
    }

    /// Appends one byte.
    #[inline(always)]
    pub(crate) fn byte(&mut self, b: u8) {
        let at = self.len;
        if at < BUF {
            self.buf[at] = b;
            self.len = at + 1;
        } else {
            self.spill(&[b]);
        }
    }

    /// Appends `tag ‖ bytes` for a fixed-width value. The tag and the value
    /// are stored straight into the buffer: assembling them in a temporary
    /// first and copying that costs a store-forwarding stall (a wide load of
    /// two narrower, just-written stores), ~10 cycles per value.
    #[inline(always)]
    pub(crate) fn tagged_fixed<const N: usize>(&mut self, tag: u8, bytes: [u8; N]) {
        let at = self.len;
        if N < BUF - at {
            self.buf[at] = tag;
            self.buf[at + 1..at + 1 + N].copy_from_slice(&bytes);
            self.len = at + 1 + N;
        } else {
            self.byte(tag);
            self.update(&bytes);
        }
    }

    /// Appends `tag ‖ LEB128(bytes.len()) ‖ bytes`: a tagged string or byte
    /// string. One bounds check and no call for the common short case.
    #[inline(always)]
    pub(crate) fn tagged_bytes(&mut self, tag: u8, bytes: &[u8]) {
        let (n, at) = (bytes.len(), self.len);
        if n < 0x80 && n + 2 <= BUF - at {
            self.buf[at] = tag;
            self.buf[at + 1] = n as u8;
            copy_short(&mut self.buf[at + 2..at + 2 + n], bytes);
            self.len = at + 2 + n;
        } else {
            self.tagged_bytes_long(tag, bytes);
        }
    }

    /// Appends `LEB128(bytes.len()) ‖ bytes` (no tag).
    #[inline(always)]
    pub(crate) fn len_bytes(&mut self, bytes: &[u8]) {
        let (n, at) = (bytes.len(), self.len);
        if n < 0x80 && n < BUF - at {
            self.buf[at] = n as u8;
            copy_short(&mut self.buf[at + 1..at + 1 + n], bytes);
            self.len = at + 1 + n;
        } else {
            self.varint(n as u64);
            self.update(bytes);
        }
    }

    /// Appends `v` as unsigned LEB128 (minimal: 1 to 10 bytes).
    #[inline]
    pub(crate) fn varint(&mut self, v: u64) {
        let (out, n) = leb128(v);
        self.update(&out[..n]);
    }

    #[inline(never)]
    fn tagged_bytes_long(&mut self, tag: u8, bytes: &[u8]) {
        self.byte(tag);
        self.varint(bytes.len() as u64);
        self.update(bytes);
    }

    #[cold]
    #[inline(never)]
    fn spill(&mut self, bytes: &[u8]) {
        let stream = self.stream.get_or_insert_with(Xxh3Default::new);
        stream.update(&self.buf[..self.len]);
        if bytes.len() >= BUF {
            stream.update(bytes);
            self.len = 0;
        } else {
            self.buf[..bytes.len()].copy_from_slice(bytes);
            self.len = bytes.len();
        }
    }

    /// Where the next byte lands in the buffer, while nothing has spilled
    /// to the streaming state.
    #[inline(always)]
    pub(crate) fn position(&self) -> Option<usize> {
        self.stream.is_none().then_some(self.len)
    }

    /// xxh3-128 of everything written with the 8 bytes at `at` (a
    /// [`position`](Self::position)) replaced: a second key that differs
    /// from the first in one field, for the cost of one more one-shot hash.
    #[inline]
    pub(crate) fn digest128_patched(&mut self, at: usize, bytes: [u8; 8]) -> Option<u128> {
        if self.stream.is_some() || at + 8 > self.len {
            return None;
        }
        let saved: [u8; 8] = self.buf[at..at + 8].try_into().ok()?;
        self.buf[at..at + 8].copy_from_slice(&bytes);
        let digest = xxh3_128(&self.buf[..self.len]);
        self.buf[at..at + 8].copy_from_slice(&saved);
        Some(digest)
    }

    /// xxh3-128 of everything written. Call it once: it feeds the buffer to
    /// the streaming state, if any.
    #[inline(always)]
    pub(crate) fn digest128(&mut self) -> u128 {
        match &mut self.stream {
            None => xxh3_128(&self.buf[..self.len]),
            Some(stream) => {
                stream.update(&self.buf[..self.len]);
                stream.digest128()
            }
        }
    }
}

/// `dst.copy_from_slice(src)` that copies up to 16 bytes as two overlapping
/// fixed-size moves instead of a variable-length `memcpy` call.
#[inline(always)]
fn copy_short(dst: &mut [u8], src: &[u8]) {
    let n = src.len();
    if (8..=16).contains(&n) {
        dst[..8].copy_from_slice(&src[..8]);
        dst[n - 8..].copy_from_slice(&src[n - 8..]);
    } else if (4..8).contains(&n) {
        dst[..4].copy_from_slice(&src[..4]);
        dst[n - 4..].copy_from_slice(&src[n - 4..]);
    } else if n < 4 {
        for (d, s) in dst.iter_mut().zip(src) {
            *d = *s;
        }
    } else {
        dst.copy_from_slice(src);
    }
}

/// Unsigned LEB128: seven bits per byte, low group first, the high bit set on
/// every byte but the last. Returns the bytes and how many are used.
#[inline(always)]
pub(crate) fn leb128(mut v: u64) -> ([u8; 10], usize) {
    let mut out = [0u8; 10];
    let mut n = 0;
    while v >= 0x80 {
        out[n] = (v as u8) | 0x80;
        v >>= 7;
        n += 1;
    }
    out[n] = v as u8;
    (out, n + 1)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn digest_is_xxh3_of_the_concatenation_for_any_write_sizes() {
        let data: Vec<u8> = (0..5000u32).map(|i| (i * 31 % 251) as u8).collect();
        for chunk in [1, 3, 4, 7, 8, 9, 16, 17, 100, 255, 256, 257, 1000] {
            for total in [0, 1, 15, 16, 240, 255, 256, 257, 511, 4999] {
                let mut sink = Sink::new();
                for part in data[..total].chunks(chunk) {
                    if part.len() == 1 {
                        sink.byte(part[0]);
                    } else {
                        sink.update(part);
                    }
                }
                assert_eq!(
                    sink.digest128(),
                    xxh3_128(&data[..total]),
                    "chunk {chunk} total {total}"
                );
            }
        }
    }

    #[test]
    fn tagged_and_length_prefixed_writes_match_their_definition() {
        let data: Vec<u8> = (0..600u32).map(|i| (i * 7 % 253) as u8).collect();
        for prefix in [0, 1, 100, 200, 250, 254, 255, 256, 300] {
            for n in [0, 1, 3, 4, 8, 16, 17, 127, 128, 200, 300, 600] {
                let mut expected = data[..prefix.min(600)].to_vec();
                let mut sink = Sink::new();
                sink.update(&expected);
                sink.tagged_bytes(0x07, &data[..n]);
                sink.len_bytes(&data[..n]);
                let (len, used) = leb128(n as u64);
                expected.push(0x07);
                expected.extend_from_slice(&len[..used]);
                expected.extend_from_slice(&data[..n]);
                expected.extend_from_slice(&len[..used]);
                expected.extend_from_slice(&data[..n]);
                assert_eq!(sink.digest128(), xxh3_128(&expected), "prefix {prefix} n {n}");
            }
        }
    }

    #[test]
    fn leb128_is_minimal_little_endian_base_128() {
        let cases: [(u64, &[u8]); 7] = [
            (0, &[0x00]),
            (1, &[0x01]),
            (127, &[0x7f]),
            (128, &[0x80, 0x01]),
            (300, &[0xac, 0x02]),
            (16_384, &[0x80, 0x80, 0x01]),
            (u64::MAX, &[0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01]),
        ];
        for (v, bytes) in cases {
            let (out, n) = leb128(v);
            assert_eq!(&out[..n], bytes, "{v}");
        }
    }
}
