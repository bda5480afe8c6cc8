//! A small seeded PRNG: SplitMix64, written out so that every platform and
//! every version draws the same numbers from the same seed.
//!
//! SplitMix64 (Steele, Lea and Flood, 2014) has a 64-bit state, passes
//! BigCrush, and costs an add and a few multiply-xorshifts per draw. Its
//! output function doubles as a strong 64-bit mixer ([`mix`]), which the
//! simulator uses to derive an independent stream per `(seed, op, call)`.

/// The golden-ratio increment of SplitMix64.
const GAMMA: u64 = 0x9e37_79b9_7f4a_7c15;

/// The SplitMix64 output function: a bijective 64-bit mixer.
///
/// Nearby inputs give unrelated outputs, so `mix(42)` and `mix(43)` share
/// nothing.
///
/// ```
/// use verified_tools::sim::rng::mix;
/// assert_eq!(mix(0), 0);
/// assert_ne!(mix(42) ^ mix(43), 1);
/// ```
pub const fn mix(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// A deterministic SplitMix64 generator.
///
/// ```
/// use verified_tools::sim::rng::Rng;
///
/// let mut a = Rng::new(42);
/// let mut b = Rng::new(42);
/// assert_eq!(a.next_u64(), b.next_u64());
/// assert!(a.below(6) < 6);
/// assert!(!a.chance(0.0) && a.chance(1.0));
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rng {
    state: u64,
}

impl Rng {
    /// A generator seeded with `seed`.
    pub const fn new(seed: u64) -> Self {
        Self { state: seed }
    }

    /// A generator for one independent stream of a seed, e.g. one
    /// `(operation, call index)` of an episode: the words are folded into the
    /// seed through [`mix`], so different words give unrelated streams.
    ///
    /// ```
    /// use verified_tools::sim::rng::Rng;
    /// let mut a = Rng::stream(42, &[1, 0]);
    /// let mut b = Rng::stream(42, &[0, 1]);
    /// assert_ne!(a.next_u64(), b.next_u64());
    /// ```
    pub const fn stream(seed: u64, words: &[u64]) -> Self {
        let mut state = mix(seed ^ GAMMA);
        let mut i = 0;
        while i < words.len() {
            state = mix(state.wrapping_add(GAMMA) ^ words[i]);
            i += 1;
        }
        Self { state }
    }

    /// The next 64 random bits.
    pub const fn next_u64(&mut self) -> u64 {
        self.state = self.state.wrapping_add(GAMMA);
        mix(self.state)
    }

    /// A uniform float in `[0, 1)` with 53 random bits.
    pub const fn next_f64(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 * (1.0 / (1u64 << 53) as f64)
    }

    /// `true` with probability `p`: never for `p <= 0`, always for `p >= 1`.
    /// Always consumes one draw, so the stream does not depend on `p`.
    pub fn chance(&mut self, p: f64) -> bool {
        self.next_f64() < p
    }

    /// A uniform integer in `0..n` (Lemire's unbiased multiply-shift);
    /// `0` when `n == 0`.
    pub fn below(&mut self, n: u64) -> u64 {
        if n == 0 {
            return 0;
        }
        let mut m = u128::from(self.next_u64()) * u128::from(n);
        if (m as u64) < n {
            let threshold = n.wrapping_neg() % n;
            while (m as u64) < threshold {
                m = u128::from(self.next_u64()) * u128::from(n);
            }
        }
        (m >> 64) as u64
    }

    /// A uniform integer in `1..=k`; `0` when `k == 0`.
    pub fn one_to(&mut self, k: u64) -> u64 {
        if k == 0 { 0 } else { 1 + self.below(k) }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn matches_the_splitmix64_reference_vectors() {
        // From the reference implementation (Vigna, splitmix64.c), seed 1234567.
        let mut r = Rng::new(1_234_567);
        let expected = [
            6_457_827_717_110_365_317,
            3_203_168_211_198_807_973,
            9_817_491_932_198_370_423,
            4_593_380_528_125_082_431,
            16_408_922_859_458_223_821,
        ];
        for e in expected {
            assert_eq!(r.next_u64(), e);
        }
    }

    #[test]
    fn below_is_in_range_and_roughly_uniform() {
        let mut r = Rng::new(7);
        let mut counts = [0u32; 6];
        for _ in 0..60_000 {
            counts[r.below(6) as usize] += 1;
        }
        for c in counts {
            assert!((9_500..=10_500).contains(&c), "{counts:?}");
        }
        assert_eq!(r.below(0), 0);
        assert_eq!(r.below(1), 0);
    }

    #[test]
    fn one_to_covers_its_range() {
        let mut r = Rng::new(9);
        let mut seen = [false; 4];
        for _ in 0..1_000 {
            let v = r.one_to(3);
            assert!((1..=3).contains(&v));
            seen[v as usize] = true;
        }
        assert_eq!(seen, [false, true, true, true]);
        assert_eq!(r.one_to(0), 0);
    }

    #[test]
    fn chance_matches_its_probability() {
        let mut r = Rng::new(11);
        let hits = (0..100_000).filter(|_| r.chance(0.3)).count();
        assert!((29_000..=31_000).contains(&hits), "{hits}");
        assert!((0..1000).all(|_| !r.chance(0.0)));
        assert!((0..1000).all(|_| r.chance(1.0)));
    }

    #[test]
    fn f64_is_in_the_unit_interval() {
        let mut r = Rng::new(3);
        assert!((0..10_000).map(|_| r.next_f64()).all(|x| (0.0..1.0).contains(&x)));
    }

    #[test]
    fn streams_are_deterministic_and_distinct() {
        assert_eq!(Rng::stream(42, &[3, 1]), Rng::stream(42, &[3, 1]));
        assert_ne!(Rng::stream(42, &[3, 1]), Rng::stream(43, &[3, 1]));
        assert_ne!(Rng::stream(42, &[3, 1]), Rng::stream(42, &[3, 2]));
    }
}
