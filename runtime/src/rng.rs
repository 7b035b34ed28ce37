//! Counter-based random numbers (Philox4x32-10, Salmon et al., "Parallel random numbers: as easy
//! as 1, 2, 3", SC'11). Counter-based so that any (stream, index) draw is reproducible without
//! replaying earlier draws: a resumed run, another rank or a GPU kernel gets the same numbers.

const M0: u32 = 0xD251_1F53;
const M1: u32 = 0xCD9E_8D57;
const W0: u32 = 0x9E37_79B9;
const W1: u32 = 0xBB67_AE85;

/// Philox4x32-10 applied to one 128-bit counter under a 64-bit key.
pub fn philox4x32(counter: [u32; 4], key: [u32; 2]) -> [u32; 4] {
    let (mut c, mut k) = (counter, key);
    for _ in 0..10 {
        let p0 = u64::from(M0) * u64::from(c[0]);
        let p1 = u64::from(M1) * u64::from(c[2]);
        let (hi0, lo0) = ((p0 >> 32) as u32, p0 as u32);
        let (hi1, lo1) = ((p1 >> 32) as u32, p1 as u32);
        c = [hi1 ^ c[1] ^ k[0], lo1, hi0 ^ c[3] ^ k[1], lo0];
        k = [k[0].wrapping_add(W0), k[1].wrapping_add(W1)];
    }
    c
}

/// [`philox4x32`] on the eight consecutive counters `(block + j, stream)`, `j < 8`, written in
/// element order: `out[4·j + w]` is word `w` of counter `j`. Lanes are independent, so the
/// compiler vectorises the rounds (32×32→64-bit multiplies); the words equal eight scalar calls.
#[inline(always)]
pub(crate) fn philox4x32_x8(block: u64, stream: u64, key: [u32; 2], out: &mut [u32; 32]) {
    let (mut c0, mut c1) = ([0u32; 8], [0u32; 8]);
    let c2 = [stream as u32; 8];
    let c3 = [(stream >> 32) as u32; 8];
    let (mut c2, mut c3) = (c2, c3);
    for j in 0..8 {
        let b = block.wrapping_add(j as u64);
        c0[j] = b as u32;
        c1[j] = (b >> 32) as u32;
    }
    let mut k = key;
    for _ in 0..10 {
        for j in 0..8 {
            let p0 = u64::from(M0) * u64::from(c0[j]);
            let p1 = u64::from(M1) * u64::from(c2[j]);
            let n0 = ((p1 >> 32) as u32) ^ c1[j] ^ k[0];
            let n2 = ((p0 >> 32) as u32) ^ c3[j] ^ k[1];
            c0[j] = n0;
            c1[j] = p1 as u32;
            c2[j] = n2;
            c3[j] = p0 as u32;
        }
        k = [k[0].wrapping_add(W0), k[1].wrapping_add(W1)];
    }
    for j in 0..8 {
        out[4 * j] = c0[j];
        out[4 * j + 1] = c1[j];
        out[4 * j + 2] = c2[j];
        out[4 * j + 3] = c3[j];
    }
}

/// A sequential stream of random numbers: key = seed, counter = (index, stream).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rng {
    key: [u32; 2],
    stream: u64,
    index: u64,
    buf: [u32; 4],
    used: usize,
}

impl Rng {
    /// Stream `stream` of seed `seed`. Different streams are independent sequences.
    pub fn new(seed: u64, stream: u64) -> Rng {
        Rng {
            key: [seed as u32, (seed >> 32) as u32],
            stream,
            index: 0,
            buf: [0; 4],
            used: 4,
        }
    }

    /// The next uniformly distributed `u32`.
    pub fn next_u32(&mut self) -> u32 {
        if self.used == 4 {
            let ctr = [
                self.index as u32,
                (self.index >> 32) as u32,
                self.stream as u32,
                (self.stream >> 32) as u32,
            ];
            self.buf = philox4x32(ctr, self.key);
            self.index += 1;
            self.used = 0;
        }
        let v = self.buf[self.used];
        self.used += 1;
        v
    }

    /// The next `u64` (two `u32` draws).
    pub fn next_u64(&mut self) -> u64 {
        (u64::from(self.next_u32()) << 32) | u64::from(self.next_u32())
    }

    /// Uniform in [0, 1) with 53 random bits.
    pub fn uniform(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 * (1.0 / (1u64 << 53) as f64)
    }

    /// Uniform integer in `0..n` (`n > 0`), without modulo bias (Lemire's method).
    pub fn below(&mut self, n: u64) -> u64 {
        assert!(n > 0, "Rng::below(0)");
        loop {
            let m = u128::from(self.next_u64()) * u128::from(n);
            let lo = m as u64;
            if lo >= n.wrapping_neg() % n {
                return (m >> 64) as u64;
            }
        }
    }

    /// Standard normal (Box–Muller; one of the pair is used, so draws stay position-independent).
    pub fn normal(&mut self) -> f64 {
        let u1 = 1.0 - self.uniform(); // (0, 1]: ln is finite
        let u2 = self.uniform();
        (-2.0 * u1.ln()).sqrt() * (2.0 * std::f64::consts::PI * u2).cos()
    }

    /// Fisher–Yates shuffle of `items`.
    pub fn shuffle<T>(&mut self, items: &mut [T]) {
        for i in (1..items.len()).rev() {
            let j = self.below(i as u64 + 1) as usize;
            items.swap(i, j);
        }
    }

    /// Where this stream is: enough to resume it exactly (see [`Rng::restore`]).
    pub fn state(&self) -> RngState {
        RngState {
            key: self.key,
            stream: self.stream,
            index: self.index,
            used: self.used as u32,
        }
    }

    /// A stream continued from a saved [`RngState`].
    pub fn restore(s: RngState) -> Rng {
        let mut r = Rng {
            key: s.key,
            stream: s.stream,
            index: s.index,
            buf: [0; 4],
            used: 4,
        };
        if s.used < 4 {
            // Refill the block the saved stream was consuming.
            r.index = s.index.saturating_sub(1);
            r.used = 4;
            r.next_u32();
            r.used = s.used as usize;
        }
        r
    }
}

/// A saved [`Rng`] position.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct RngState {
    /// The seed, as Philox's key.
    pub key: [u32; 2],
    /// The stream number.
    pub stream: u64,
    /// Blocks generated so far.
    pub index: u64,
    /// Words of the current block already used (4 = none left).
    pub used: u32,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn philox_x8_equals_eight_scalar_calls() {
        let mut out = [0u32; 32];
        for (block, stream) in [
            (0u64, 0u64),
            (7, 3),
            ((1 << 32) - 3, 1 << 40),
            (u64::MAX - 2, 5),
        ] {
            let key = [0x1234_5678, 0x9abc_def0];
            philox4x32_x8(block, stream, key, &mut out);
            for j in 0..8u64 {
                let b = block.wrapping_add(j);
                let want = philox4x32(
                    [
                        b as u32,
                        (b >> 32) as u32,
                        stream as u32,
                        (stream >> 32) as u32,
                    ],
                    key,
                );
                assert_eq!(&out[4 * j as usize..4 * j as usize + 4], &want[..]);
            }
        }
    }

    #[test]
    fn philox_matches_the_random123_known_answers() {
        // Known-answer vectors of Random123 (kat_vectors, philox4x32_10).
        assert_eq!(
            philox4x32([0, 0, 0, 0], [0, 0]),
            [0x6627_e8d5, 0xe169_c58d, 0xbc57_ac4c, 0x9b00_dbd8]
        );
        assert_eq!(
            philox4x32([u32::MAX; 4], [u32::MAX; 2]),
            [0x408f_276d, 0x41c8_3b0e, 0xa20b_c7c6, 0x6d54_51fd]
        );
        assert_eq!(
            philox4x32(
                [0x243f_6a88, 0x85a3_08d3, 0x1319_8a2e, 0x0370_7344],
                [0xa409_3822, 0x299f_31d0]
            ),
            [0xd16c_fe09, 0x94fd_cceb, 0x5001_e420, 0x2412_6ea1]
        );
    }

    #[test]
    fn saved_state_resumes_the_same_sequence() {
        let mut a = Rng::new(42, 7);
        for _ in 0..5 {
            a.next_u32();
        }
        let mut b = Rng::restore(a.state());
        let xs: Vec<u32> = (0..9).map(|_| a.next_u32()).collect();
        let ys: Vec<u32> = (0..9).map(|_| b.next_u32()).collect();
        assert_eq!(xs, ys);
    }

    #[test]
    fn below_and_normal_look_right() {
        let mut r = Rng::new(1, 0);
        let mut counts = [0u32; 3];
        for _ in 0..30_000 {
            counts[r.below(3) as usize] += 1;
        }
        assert!(
            counts.iter().all(|&c| (9_500..10_500).contains(&c)),
            "{counts:?}"
        );
        let xs: Vec<f64> = (0..20_000).map(|_| r.normal()).collect();
        let mean = xs.iter().sum::<f64>() / xs.len() as f64;
        let var = xs.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / xs.len() as f64;
        assert!(
            mean.abs() < 0.03 && (var - 1.0).abs() < 0.05,
            "{mean} {var}"
        );
    }
}
