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

/// Steps per unit of `a` in [`gumbel_word_gate`]'s table.
const GATE_STEPS: f32 = 64.0;

/// The smallest random word whose Gumbel value can reach `a`, by the bounds of
/// [`gumbel_bucket_bounds`]: every word below it has `bound < a`, so a token whose scaled
/// logit `y` is at least `a` below the leader cannot win with such a word. `None` when no
/// word reaches `a`. One table lookup, no logarithm: the draw over a whole row compares
/// each word of a chunk against the gate of the chunk's largest `y`.
#[inline]
pub fn gumbel_word_gate(a: f32) -> Option<u32> {
    let &(a0, ref table) = gate_table();
    // NaN and everything below the smallest bound: every word
    if a.is_nan() || a <= a0 {
        return Some(0);
    }
    // the cell's lower end is <= a, so its gate admits every word that reaches a
    let k = ((a - a0) * GATE_STEPS) as usize;
    match table.get(k) {
        Some(&b) if b < 4096 => Some(u32::from(b) << 20),
        _ => None,
    }
}

/// `(a0, gates)`: `gates[k]` is the first bucket whose bound reaches `a0 + k / GATE_STEPS`
/// (4096 when none does); `a0` is the smallest bound.
fn gate_table() -> &'static (f32, Box<[u16]>) {
    static TABLE: std::sync::OnceLock<(f32, Box<[u16]>)> = std::sync::OnceLock::new();
    TABLE.get_or_init(|| {
        let bounds = gumbel_bucket_bounds();
        let a0 = bounds[0];
        let cells = ((bounds[4095] - a0) * GATE_STEPS) as usize + 2;
        let gates = (0..cells)
            .map(|k| {
                let lo = a0 + k as f32 / GATE_STEPS;
                bounds.partition_point(|&b| b < lo) as u16
            })
            .collect();
        (a0, gates)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn word_gate_admits_every_word_whose_bound_reaches() {
        let bounds = gumbel_bucket_bounds();
        let mut a = -4.0f32;
        while a < 18.0 {
            let gate = gumbel_word_gate(a);
            for b in 0..4096u32 {
                let x = b << 20;
                if bounds[b as usize] >= a {
                    let g = gate.unwrap_or_else(|| panic!("a = {a}: bucket {b} reaches it"));
                    assert!(x >= g, "a = {a}: bucket {b} reaches it, gate {g:#x}");
                }
            }
            // and it is loose by at most one table step
            if let Some(g) = gate {
                assert!(
                    bounds[(g >> 20) as usize] >= a - 1.0 / GATE_STEPS - 1e-4,
                    "a = {a}"
                );
            }
            a += 0.003_7;
        }
        assert_eq!(gumbel_word_gate(f32::NAN), Some(0));
        assert_eq!(gumbel_word_gate(f32::NEG_INFINITY), Some(0));
        assert_eq!(gumbel_word_gate(f32::INFINITY), None);
        assert_eq!(gumbel_word_gate(GUMBEL_MAX_BOUND), None);
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
        let t = gumbel_bucket_bounds();
        for x in (0..=u32::MAX)
            .step_by(65_537)
            .chain([u32::MAX, 0, 0xFFF0_0000])
        {
            assert!(gumbel_from_bits(x) <= t[(x >> 20) as usize], "x = {x:#x}");
        }
    }
}
