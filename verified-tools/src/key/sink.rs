//! A byte sink in front of xxh3-128: small writes land in a stack buffer, and
//! an encoding that fits the buffer is hashed one-shot.
//!
//! The digest is exactly `xxh3_128` of all the bytes written, whatever the
//! write sizes; the buffer only saves the per-call cost of the streaming
//! hasher, which dominated key derivation (see BENCHMARKS.md).

use xxhash_rust::xxh3::{Xxh3Default, xxh3_128};

const BUF: usize = 256;

pub(crate) struct Sink {
    buf: [u8; BUF],
    len: usize,
    /// Set once the buffer has been flushed into `stream`.
    spilled: bool,
    stream: Xxh3Default,
}

impl Sink {
    #[inline]
    pub(crate) fn new() -> Self {
        Sink { buf: [0; BUF], len: 0, spilled: false, stream: Xxh3Default::new() }
    }

    #[inline(always)]
    pub(crate) fn update(&mut self, bytes: &[u8]) {
        let (n, at) = (bytes.len(), self.len);
        if n <= 16 && at + 16 <= BUF {
            // Tags, lengths and short names: two overlapping fixed-size
            // copies instead of a variable-length memcpy call.
            let buf = &mut self.buf;
            if n >= 8 {
                buf[at..at + 8].copy_from_slice(&bytes[..8]);
                buf[at + n - 8..at + n].copy_from_slice(&bytes[n - 8..]);
            } else if n >= 4 {
                buf[at..at + 4].copy_from_slice(&bytes[..4]);
                buf[at + n - 4..at + n].copy_from_slice(&bytes[n - 4..]);
            } else {
                for (i, &b) in bytes.iter().enumerate() {
                    buf[at + i] = b;
                }
            }
            self.len = at + n;
        } else if n <= BUF - at {
            self.buf[at..at + n].copy_from_slice(bytes);
            self.len = at + n;
        } else {
            self.spill(bytes);
        }
    }

    #[cold]
    #[inline(never)]
    fn spill(&mut self, bytes: &[u8]) {
        self.spilled = true;
        self.stream.update(&self.buf[..self.len]);
        self.len = 0;
        if bytes.len() >= BUF {
            self.stream.update(bytes);
        } else {
            self.buf[..bytes.len()].copy_from_slice(bytes);
            self.len = bytes.len();
        }
    }

    #[inline]
    pub(crate) fn digest128(mut self) -> u128 {
        if self.spilled {
            self.stream.update(&self.buf[..self.len]);
            self.stream.digest128()
        } else {
            xxh3_128(&self.buf[..self.len])
        }
    }
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
                    sink.update(part);
                }
                assert_eq!(
                    sink.digest128(),
                    xxh3_128(&data[..total]),
                    "chunk {chunk} total {total}"
                );
            }
        }
    }
}
