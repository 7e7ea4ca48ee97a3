//! Philox4x32-10 and the contract's uniform and Gumbel transforms (the contract's randomness).
//!
//! The generator is counter-based: the noise of token `i` at `step` with `seed` is computed
//! directly, so a backend evaluates it only for the tokens that survive the filters.

/// First round multiplier.
pub const PHILOX_M0: u32 = 0xD251_1F53;
/// Second round multiplier.
pub const PHILOX_M1: u32 = 0xCD9E_8D57;
/// First key bump (golden ratio).
pub const PHILOX_W0: u32 = 0x9E37_79B9;
/// Second key bump (sqrt(3) - 1).
pub const PHILOX_W1: u32 = 0xBB67_AE85;

/// Philox4x32 with ten rounds on `counter` under `key`.
#[inline]
pub fn philox4x32_10(counter: [u32; 4], key: [u32; 2]) -> [u32; 4] {
    let [mut c0, mut c1, mut c2, mut c3] = counter;
    let [mut k0, mut k1] = key;
    for round in 0..10 {
        if round > 0 {
            k0 = k0.wrapping_add(PHILOX_W0);
            k1 = k1.wrapping_add(PHILOX_W1);
        }
        let p0 = u64::from(PHILOX_M0) * u64::from(c0);
        let p1 = u64::from(PHILOX_M1) * u64::from(c2);
        let (hi0, lo0) = ((p0 >> 32) as u32, p0 as u32);
        let (hi1, lo1) = ((p1 >> 32) as u32, p1 as u32);
        c0 = hi1 ^ c1 ^ k0;
        c1 = lo1;
        c2 = hi0 ^ c3 ^ k1;
        c3 = lo0;
    }
    [c0, c1, c2, c3]
}

/// The key of a seed: `(seed & 0xffffffff, seed >> 32)`.
#[inline]
pub fn seed_key(seed: u64) -> [u32; 2] {
    [seed as u32, (seed >> 32) as u32]
}

/// The counter of the block holding token `i` at `step` on the sampling stream (stream 0).
#[inline]
pub fn token_counter(i: u32, step: u64) -> [u32; 4] {
    [i / 4, step as u32, (step >> 32) as u32, 0]
}

/// The 32 random bits of token `i` at `step` with `seed`.
#[inline]
pub fn token_bits(seed: u64, step: u64, i: u32) -> u32 {
    philox4x32_10(token_counter(i, step), seed_key(seed))[(i % 4) as usize]
}

/// `u = (2 * (x >> 9) + 1) * 2^-24`: exact in f32, in `[2^-24, 1 - 2^-24]`.
#[inline]
pub fn uniform(x: u32) -> f32 {
    ((2 * (x >> 9) + 1) as f32) * (1.0 / 16_777_216.0)
}

/// `g = -ln(-ln(u))` in f32, with [`crate::fmath::ln`] (the same algorithm as the device
/// shaders, so backends agree bit for bit wherever their arithmetic rounds correctly).
#[inline]
pub fn gumbel_from_bits(x: u32) -> f32 {
    -crate::fmath::ln(-crate::fmath::ln(uniform(x)))
}

/// The Gumbel noise `g_i` of token `i` at `step` with `seed`.
#[inline]
pub fn gumbel(seed: u64, step: u64, i: u32) -> f32 {
    gumbel_from_bits(token_bits(seed, step, i))
}

/// An upper bound of every Gumbel value the contract can produce (the largest is
/// `-ln(-ln(1 - 2^-24)) ~= 16.64`), with room for a `ln` that is off by a few ulp.
pub const GUMBEL_MAX_BOUND: f32 = 17.0;

/// Upper bounds of `g` by the top 12 bits of the random word: `GUMBEL_BUCKET_BOUND[x >> 20]`
/// is at least the Gumbel value of every `x` in that bucket. Lets a sampler skip the two
/// logarithms for a token that cannot win.
pub fn gumbel_bucket_bounds() -> &'static [f32; 4096] {
    static TABLE: std::sync::OnceLock<Box<[f32; 4096]>> = std::sync::OnceLock::new();
    TABLE.get_or_init(|| {
        let mut t = Box::new([0f32; 4096]);
        for (b, slot) in t.iter_mut().enumerate() {
            // Largest x in bucket b, hence the largest u and g.
            let x_hi = ((b as u32) << 20) | 0x000F_FFFF;
            let u = (2.0 * f64::from(x_hi >> 9) + 1.0) / 16_777_216.0;
            let g = -(-(u.ln())).ln();
            *slot = (g + 1e-3) as f32;
        }
        t
    })
}

/// Lower bounds of `g` by the top 12 bits of the random word: `GUMBEL_BUCKET_FLOOR[x >> 20]`
/// is at most the Gumbel value of every `x` in that bucket (the counterpart of
/// [`gumbel_bucket_bounds`]). The largest `y + floor` of a draw's candidates is at most
/// the winner's score, so a candidate whose `y + bound` stays below it cannot win.
pub fn gumbel_bucket_floors() -> &'static [f32; 4096] {
    static TABLE: std::sync::OnceLock<Box<[f32; 4096]>> = std::sync::OnceLock::new();
    TABLE.get_or_init(|| {
        let mut t = Box::new([0f32; 4096]);
        for (b, slot) in t.iter_mut().enumerate() {
            // Smallest x in bucket b, hence the smallest u and g.
            let x_lo = (b as u32) << 20;
            let u = (2.0 * f64::from(x_lo >> 9) + 1.0) / 16_777_216.0;
            let g = -(-(u.ln())).ln();
            *slot = (g - 1e-3) as f32;
        }
        t
    })
}

/// The chord of `log2` under the Gumbel value of word `x`, as the bits of a float: with
/// `D = 2^24 - 2 (x >> 9) - 1` (so `1 - u = D 2^-24`, exactly), the bits of `D as f32`
/// read as an integer and converted, `(e + 127 + m - 1) 2^23` for `D = 2^e m`. `log2 D`
/// is concave, so `chord 2^-23 - 127 <= log2 D` (by at most 0.09), and with
/// `g = -ln(-ln u) <= -ln(1 - u) = ln 2 (24 - log2 D)` the noise of `x` is at most
/// `ln 2 (151 - chord 2^-23)`: a bound per word, tighter than a table's for the large
/// words that pass a chunk's gate. Plain integer and float conversions, so vector lanes
/// compute it bit for bit (see [`gumbel_reach_consts`]).
#[inline(always)]
pub fn gumbel_reach_chord(x: u32) -> f32 {
    let d = (1i32 << 24) - 1 - 2 * (x >> 9) as i32;
    (d as f32).to_bits() as i32 as f32
}

/// The threshold of word `x` in the per-token reach test with constants `(c0, c1)` of
/// [`gumbel_reach_consts`]: `c1 * gumbel_reach_chord(x) + c0`, the product and the sum
/// rounded in f32 in that order (vector lanes compute it the same way). It falls as `x`
/// rises, so the threshold of a chunk's largest word is at most every other word's.
#[inline(always)]
pub fn gumbel_reach_threshold(x: u32, c0: f32, c1: f32) -> f32 {
    c1 * gumbel_reach_chord(x) + c0
}

/// Constants `(c0, c1)` of the per-token reach test of a draw at temperature `t` against
/// the leader's score `floor`: a token with logit `z` and word `x` can reach `floor`
/// (`z / t + g(x) >= floor`, as the exact comparison rounds it) only if
/// `z >= gumbel_reach_threshold(x, c0, c1)`. `c0 + c1 chord = t (floor - slack - bound(x))`
/// with the bound of [`gumbel_reach_chord`] and a slack of `1e-3 + 1e-5 |floor|` for the
/// roundings of `z / t`, of the sum, of the `ln`s and of the test itself. Where the test
/// cannot be made safely in f32 (no leader yet, or a temperature so small or large that a
/// constant leaves the normal range) the constants are `(f32::MIN, 0)`: every finite logit
/// passes.
pub fn gumbel_reach_consts(t: f32, floor: f32) -> (f32, f32) {
    let (t, floor) = (f64::from(t), f64::from(floor));
    let slack = 1e-3 + 1e-5 * floor.abs();
    let c0 = (t * (floor - slack - 151.0 * std::f64::consts::LN_2)) as f32;
    let c1 = (t * std::f64::consts::LN_2 / f64::from(1u32 << 23)) as f32;
    // `c1 chord` is at most `t ln2 151` (~105 t): with `c0` finite and `c1` normal every
    // rounding stays relative
    if c0.is_finite() && c1.is_normal() && (c1 * 1.3e9).is_finite() {
        (c0, c1)
    } else {
        (f32::MIN, 0.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The reach test never drops a token whose exact score (`z / t + g`, rounded as the
    /// draw rounds it) reaches the leader, and keeps none whose noise bound falls short by
    /// more than the chord's gap and the slack: logits placed around the exact crossing
    /// (ulps and small steps either side), for low, middle and extreme words, leaders and
    /// temperatures across their ranges.
    #[test]
    fn reach_test_is_safe_and_tight() {
        let mut words = vec![0u32, 1 << 9, 1 << 31, 0xC000_0000, u32::MAX - 512, u32::MAX];
        words.extend((0..64u32).map(|k| token_bits(7, 3, k)));
        words.extend((0..24u32).map(|k| u32::MAX - (1u32 << (k + 8))));
        for t in [1e-5f32, 0.05, 0.8, 1.0, 3.0, 100.0] {
            for floor in [-1e4f32, -30.0, -1.0, 0.0, 0.5, 17.66, 1e3, 1e6] {
                let (c0, c1) = gumbel_reach_consts(t, floor);
                assert!(c1 > 0.0, "t {t} floor {floor}");
                for &x in &words {
                    let g = gumbel_from_bits(x);
                    let thr = gumbel_reach_threshold(x, c0, c1);
                    let cross = t * (floor - g);
                    let mut z = cross;
                    for _ in 0..64 {
                        z = z.next_down();
                    }
                    let scale = cross.abs().max(t);
                    let mut probes: Vec<f32> = (0..128)
                        .scan(z, |z, _| {
                            *z = z.next_up();
                            Some(*z)
                        })
                        .collect();
                    probes.extend(
                        [-0.3f32, -0.05, -0.01, 0.01, 0.05, 0.3].map(|d| cross + d * scale),
                    );
                    for z in probes {
                        let s = z / t + g;
                        if s >= floor {
                            assert!(
                                z >= thr,
                                "t {t} floor {floor} word {x:#x} z {z}: reaches, dropped"
                            );
                        }
                        if z >= thr {
                            // kept: its bound -ln(1 - u) (the chord is off by <= 0.09 bits)
                            // comes within the slack of the leader
                            let u = f64::from(uniform(x));
                            let bound = -(1.0 - u).ln() + 0.065;
                            let slack = 2e-3 + 2e-5 * f64::from(floor).abs();
                            assert!(
                                f64::from(z) / f64::from(t) + bound >= f64::from(floor) - slack,
                                "t {t} floor {floor} word {x:#x} z {z}: kept, far below"
                            );
                        }
                    }
                }
            }
        }
        // no leader: every finite logit passes
        let (c0, c1) = gumbel_reach_consts(1.0, f32::NEG_INFINITY);
        assert_eq!((c0, c1), (f32::MIN, 0.0));
        assert!(f32::MIN >= gumbel_reach_threshold(0, c0, c1));
        assert!(f32::NEG_INFINITY < gumbel_reach_threshold(u32::MAX, c0, c1));
    }

    #[test]
    fn known_answers() {
        assert_eq!(
            philox4x32_10([0; 4], [0; 2]),
            [0x6627e8d5, 0xe169c58d, 0xbc57ac4c, 0x9b00dbd8]
        );
        assert_eq!(
            philox4x32_10([u32::MAX; 4], [u32::MAX; 2]),
            [0x408f276d, 0x41c83b0e, 0xa20bc7c6, 0x6d5451fd]
        );
        assert_eq!(
            philox4x32_10(
                [0x243f6a88, 0x85a308d3, 0x13198a2e, 0x03707344],
                [0xa4093822, 0x299f31d0]
            ),
            [0xd16cfe09, 0x94fdcceb, 0x5001e420, 0x24126ea1]
        );
    }

    #[test]
    fn counter_layout() {
        let seed = 0x0123_4567_89ab_cdef_u64;
        let step = 0x0000_0005_0000_0007_u64;
        let block = philox4x32_10([2, 7, 5, 0], [0x89ab_cdef, 0x0123_4567]);
        for (w, &expected) in block.iter().enumerate() {
            assert_eq!(token_bits(seed, step, 8 + w as u32), expected);
        }
    }

    #[test]
    fn uniform_extremes() {
        assert_eq!(uniform(0), 2f32.powi(-24));
        assert_eq!(uniform(u32::MAX), 1.0 - 2f32.powi(-24));
        assert!(uniform(u32::MAX) < 1.0);
        assert_eq!(uniform(1 << 31), 0.5 + 2f32.powi(-24));
    }

    #[test]
    fn gumbel_extremes() {
        let lo = gumbel_from_bits(0);
        let hi = gumbel_from_bits(u32::MAX);
        // -ln(-ln(2^-24)) and -ln(-ln(1 - 2^-24)), computed in f64.
        let lo64 = -(-(2f64.powi(-24)).ln()).ln();
        let hi64 = -(-(1.0 - 2f64.powi(-24)).ln()).ln();
        assert!((f64::from(lo) - lo64).abs() < 1e-5, "{lo} vs {lo64}");
        assert!((f64::from(hi) - hi64).abs() < 1e-3, "{hi} vs {hi64}");
        assert!(hi.is_finite() && lo.is_finite());
        assert!(hi < GUMBEL_MAX_BOUND);
    }

    #[test]
    fn bucket_bounds_bound() {
        let (lo, hi) = (gumbel_bucket_floors(), gumbel_bucket_bounds());
        // every bucket's first and last word, and words spread over the range
        let ends = (0..4096u32).flat_map(|b| [b << 20, b << 20 | 0xF_FFFF]);
        for x in (0..=u32::MAX).step_by(65_537).chain(ends) {
            let (g, b) = (gumbel_from_bits(x), (x >> 20) as usize);
            assert!(
                lo[b] <= g && g <= hi[b],
                "x = {x:#x}: {} <= {g} <= {}",
                lo[b],
                hi[b]
            );
        }
        // tight enough to leave few candidates to the exact comparison: away from both
        // ends of the range (where g moves fast with u) a bucket spans little noise
        for b in 16..4000 {
            assert!(hi[b] - lo[b] < 0.02, "bucket {b}: {} .. {}", lo[b], hi[b]);
        }
    }
}
