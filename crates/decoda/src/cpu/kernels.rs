//! Streaming loops of the fast CPU path, written so the compiler vectorises them, and
//! compiled three times (AVX-512, AVX2+FMA, baseline) with a run-time choice.
//!
//! None of these loops decides a token on its own: they find maxima, skip blocks that
//! hold no candidate, and approximate the top-p normaliser; every value that decides a
//! token is recomputed exactly by [`crate::pipeline`] functions.

const LANES: usize = 16;
/// Lanes of the reductions: four independent 16-wide chains.
const WIDE: usize = 64;

/// `a b + c`, fused with `FMA` (only inside FMA-enabled code: a `mul_add` without the
/// instruction is a slow library call).
#[inline(always)]
fn fma<const FMA: bool>(a: f32, b: f32, c: f32) -> f32 {
    if FMA {
        a.mul_add(b, c)
    } else {
        a * b + c
    }
}

/// `exp(x)` for `x` in `[-87, 87]` (clamped there; NaN gives `exp(-87)`), relative error
/// below 3e-7: the bulk term of a top-p normaliser, as plain arithmetic that vectorises (a
/// degree-6 polynomial, and the power of two built by one shift of the rounding constant's
/// bits). With `FMA`, fused multiply-adds (see [`fma`]).
#[inline(always)]
pub fn exp_bulk<const FMA: bool>(x: f32) -> f32 {
    const LOG2E: f32 = std::f32::consts::LOG2_E;
    const LN2_HI: f32 = 0.693_145_75;
    const LN2_LO: f32 = 1.428_606_8e-6;
    // 1.5 * 2^23 + 127: adding it rounds to an integer n and leaves n + 127 in the low bits
    const MAGIC: f32 = 12_583_039.0;
    // not `clamp`: NaN must come out as -87, not propagate
    #[allow(clippy::manual_clamp)]
    let xc = x.max(-87.0).min(87.0);
    let tm = fma::<FMA>(xc, LOG2E, MAGIC);
    let n = tm - MAGIC;
    let r = fma::<FMA>(-n, LN2_LO, fma::<FMA>(-n, LN2_HI, xc));
    let mut p = 1.0 / 720.0;
    p = fma::<FMA>(p, r, 1.0 / 120.0);
    p = fma::<FMA>(p, r, 1.0 / 24.0);
    p = fma::<FMA>(p, r, 1.0 / 6.0);
    p = fma::<FMA>(p, r, 0.5);
    p = fma::<FMA>(p, r, 1.0);
    p = fma::<FMA>(p, r, 1.0);
    // the low 9 bits of tm's pattern are n + 127, the biased exponent of 2^n
    p * f32::from_bits(tm.to_bits() << 23)
}

/// `2^(j/32)` for `j = 0..32`, rounded to f32: the table of the AVX-512 `2^w`.
#[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
const EXP2_TABLE: [f32; 32] = [
    1.0,
    1.021_897_2,
    1.044_273_7,
    1.067_140_5,
    1.090_507_7,
    1.114_386_8,
    1.138_788_6,
    1.163_724_9,
    1.189_207_1,
    1.215_247_4,
    1.241_857_8,
    1.269_051,
    1.296_839_6,
    1.325_236_7,
    1.354_255_6,
    1.383_91,
    std::f32::consts::SQRT_2,
    1.445_180_8,
    1.476_826_2,
    1.509_164_5,
    1.542_210_8,
    1.575_980_9,
    1.610_490_3,
    1.645_755_5,
    1.681_792_9,
    1.718_619_3,
    1.756_252_2,
    1.794_709_1,
    1.834_008_1,
    1.874_167_7,
    1.915_206_6,
    1.957_144_1,
];
/// `2^r ≈ 1 + r (C1 + C2 r)` for `|r| <= 1/64`: the quadratic through the three Chebyshev
/// nodes, relative error below 6e-8.
#[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
const EXP2_C1: f32 = 0.693_157_3;
#[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
const EXP2_C2: f32 = 0.240_228_27;
/// `2^r ≈ 1 + r (Q0 + r (Q1 + r Q2))` for `|r| <= 1/16` (`[Q2, Q1, Q0]`; fitted to the
/// relative error by `scripts/fit_exp2_poly.py`, below 3e-8 with these f32 values): the
/// polynomial of the AVX2 `2^w`.
#[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
const EXP2_Q8: [f32; 3] = [0.055_496_834, 0.240_257_62, 0.693_147_24];
/// `2^r ≈ 1 + r (Q0 + r Q1)` for `|r| <= 1/16` (`[Q1, Q0]`; fitted as [`EXP2_Q8`], below
/// 3.5e-6): the AVX2 `2^w` of [`Terms::Coarse`], one multiply-add shorter.
#[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
const EXP2_Q8_COARSE: [f32; 2] = [0.240_226_3, 0.693_308_9];
/// 1.5 * 2^18: adding it to `|w| < 2^17` rounds `w` to a multiple of 1/32 and leaves
/// `round(32 w)` in the low mantissa bits (its low 5 bits index [`EXP2_TABLE`]).
#[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
const MAGIC32: f32 = 393_216.0;

/// `2^r ≈ 1 + r (P0 + r (P1 + r (P2 + r (P3 + r P4))))` for `|r| <= 1/2` (`[P4, .., P0]`;
/// fitted to the relative error by `scripts/fit_exp2_poly.py`, below 1.9e-7 evaluated with
/// unfused f32 multiplies and adds): the polynomial of the baseline `2^w`. (`P0` is the
/// fit's, three f32 ulps below `ln 2`.)
#[allow(clippy::approx_constant)]
const EXP2_P5: [f32; 5] = [
    0.001_326_542_1,
    0.009_671_512,
    0.055_507_313,
    0.240_222_42,
    0.693_147,
];
/// `2^r ≈ 1 + r (P0 + r (P1 + r (P2 + r P3)))` for `|r| <= 1/2` (`[P3, .., P0]`; fitted as
/// [`EXP2_P5`], below 3e-6 evaluated the same way): the baseline `2^w` of
/// [`Terms::Coarse`], one multiply and one add shorter.
#[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
const EXP2_P4_COARSE: [f32; 4] = [0.009_582_902, 0.055_906_42, 0.240_240_98, 0.693_124_2];

/// `2^w` within 2.5e-7 (relative), for the top-p normaliser, as plain arithmetic that
/// vectorises (the baseline variants; the AVX-512 and AVX2 ones use a table, see
/// [`exp2_sum_collect`]): `w = n + f` with `n` an integer and `|f| <= 1/2`, the degree-5
/// polynomial [`EXP2_P5`] for `2^f`, and `2^n` built in the exponent bits.
/// Below -126 it gives `2^-126` (so `-inf` adds nothing that matters), at 128 and above
/// `+inf`, and NaN for NaN, so a non-finite input shows in the sum.
#[inline(always)]
pub fn exp2_est<const FMA: bool>(w: f32) -> f32 {
    // 1.5 * 2^23 + 127: adding it rounds to an integer n and leaves n + 127 in the low bits
    const MAGIC: f32 = 12_583_039.0;
    // not `clamp`: NaN must stay NaN
    #[allow(clippy::manual_clamp)]
    let w = if w < -126.0 {
        -126.0
    } else if w > 128.0 {
        128.0
    } else {
        w
    };
    let tm = w + MAGIC;
    let f = w - (tm - MAGIC);
    let mut p = EXP2_P5[0];
    for c in &EXP2_P5[1..] {
        p = fma::<FMA>(p, f, *c);
    }
    p = fma::<FMA>(p, f, 1.0);
    // the low 9 bits of tm's pattern are n + 127, the biased exponent of 2^n (255: +inf)
    p * f32::from_bits(tm.to_bits() << 23)
}

mod body {
    use super::{exp2_est, exp_bulk, fma, LANES, WIDE};

    #[inline(always)]
    pub fn max_nonfinite(z: &[f32]) -> (f32, u64) {
        let mut m = [f32::NEG_INFINITY; WIDE];
        let mut bad = [0u32; WIDE];
        let chunks = z.chunks_exact(WIDE);
        let rem = chunks.remainder();
        for c in chunks {
            for j in 0..WIDE {
                let x = c[j];
                m[j] = if x > m[j] { x } else { m[j] };
                bad[j] += u32::from(x.is_nan() || x == f32::INFINITY);
            }
        }
        let mut mm = f32::NEG_INFINITY;
        let mut nb = 0u64;
        for j in 0..WIDE {
            mm = if m[j] > mm { m[j] } else { mm };
            nb += u64::from(bad[j]);
        }
        for &x in rem {
            mm = if x > mm { x } else { mm };
            nb += u64::from(x.is_nan() || x == f32::INFINITY);
        }
        (mm, nb)
    }

    #[inline(always)]
    pub fn max(z: &[f32]) -> f32 {
        let mut m = [f32::NEG_INFINITY; WIDE];
        let chunks = z.chunks_exact(WIDE);
        let rem = chunks.remainder();
        for c in chunks {
            for j in 0..WIDE {
                m[j] = if c[j] > m[j] { c[j] } else { m[j] };
            }
        }
        let mut mm = rem
            .iter()
            .copied()
            .fold(f32::NEG_INFINITY, |a, b| if b > a { b } else { a });
        for v in m {
            mm = if v > mm { v } else { mm };
        }
        mm
    }

    #[inline(always)]
    pub fn min(z: &[f32]) -> f32 {
        let mut m = [f32::INFINITY; WIDE];
        let chunks = z.chunks_exact(WIDE);
        let rem = chunks.remainder();
        for c in chunks {
            for j in 0..WIDE {
                m[j] = if c[j] < m[j] { c[j] } else { m[j] };
            }
        }
        let mut mm = rem
            .iter()
            .copied()
            .fold(f32::INFINITY, |a, b| if b < a { b } else { a });
        for v in m {
            mm = if v < mm { v } else { mm };
        }
        mm
    }

    #[inline(always)]
    pub fn first_eq(z: &[f32], v: f32) -> Option<usize> {
        let chunks = z.chunks_exact(WIDE);
        let rem_start = z.len() - chunks.remainder().len();
        for (ci, c) in chunks.enumerate() {
            let mut any = false;
            for &x in c {
                any |= x == v;
            }
            if any {
                return c.iter().position(|&x| x == v).map(|j| ci * WIDE + j);
            }
        }
        z[rem_start..]
            .iter()
            .position(|&x| x == v)
            .map(|j| rem_start + j)
    }

    // on x86-64 only the tests use it: every level there has its own kernel
    #[cfg_attr(target_arch = "x86_64", allow(dead_code))]
    #[inline(always)]
    pub fn collect_ge(z: &[f32], base: u32, thr: f32, out: &mut Vec<(u32, f32)>) {
        let chunks = z.chunks_exact(LANES);
        let rem_start = z.len() - chunks.remainder().len();
        for (ci, c) in chunks.enumerate() {
            let mut any = false;
            for &x in c {
                any |= x >= thr;
            }
            if any {
                // branch-free compaction of the hits of this block
                let mut hits = [(0u32, 0f32); LANES];
                let mut n = 0;
                for (j, &x) in c.iter().enumerate() {
                    hits[n] = (base + (ci * LANES + j) as u32, x);
                    n += usize::from(x >= thr);
                }
                out.extend_from_slice(&hits[..n]);
            }
        }
        for (j, &x) in z[rem_start..].iter().enumerate() {
            if x >= thr {
                out.push((base + (rem_start + j) as u32, x));
            }
        }
    }

    #[inline(always)]
    pub fn exp_sum<const FMA: bool>(z: &[f32], zmax: f32, scale: f32) -> f64 {
        const W: usize = 2 * LANES;
        let mut acc = [0f32; W];
        let chunks = z.chunks_exact(W);
        let rem = chunks.remainder();
        let mut total = 0f64;
        for (ci, c) in chunks.enumerate() {
            for j in 0..W {
                acc[j] += exp_bulk::<FMA>((c[j] - zmax) * scale);
            }
            if ci % 32 == 31 {
                total += acc.iter().map(|&a| f64::from(a)).sum::<f64>();
                acc = [0f32; W];
            }
        }
        total += acc.iter().map(|&a| f64::from(a)).sum::<f64>();
        total
            + rem
                .iter()
                .map(|&x| f64::from(exp_bulk::<FMA>((x - zmax) * scale)))
                .sum::<f64>()
    }

    /// Σ `exp2_est(z c1 + c0)` with f32 partial sums (32 terms per lane at most) added in
    /// f64 (on x86-64 only the tests use it: every level there has its own kernel).
    #[cfg_attr(target_arch = "x86_64", allow(dead_code))]
    #[inline(always)]
    pub fn exp2_sum<const FMA: bool>(z: &[f32], c1: f32, c0: f32) -> f64 {
        const W: usize = 2 * LANES;
        let mut total = 0f64;
        for block in z.chunks(32 * W) {
            let mut acc = [0f32; W];
            let chunks = block.chunks_exact(W);
            let rem = chunks.remainder();
            for c in chunks {
                for j in 0..W {
                    acc[j] += exp2_est::<FMA>(fma::<FMA>(c[j], c1, c0));
                }
            }
            // one term per lane: as exact as the full chunks, and no f32 overflow
            for (a, &x) in acc.iter_mut().zip(rem) {
                *a += exp2_est::<FMA>(fma::<FMA>(x, c1, c0));
            }
            total += acc.iter().map(|&a| f64::from(a)).sum::<f64>();
        }
        total
    }

    /// `w[i] = exp_bulk((z[i] - zmax) scale)`.
    #[inline(always)]
    pub fn exp_into<const FMA: bool>(z: &[f32], zmax: f32, scale: f32, w: &mut [f32]) {
        for (wi, &zi) in w.iter_mut().zip(z) {
            *wi = exp_bulk::<FMA>((zi - zmax) * scale);
        }
    }

    /// See [`super::mass_by_y`].
    #[inline(always)]
    pub fn mass_by_y<const FMA: bool>(
        z: &[f32],
        t: f32,
        ymax: f32,
        scale: f32,
        bucket: &mut [u16],
        mass: &mut [[f64; 2]],
    ) {
        const N: usize = 256;
        let last = (mass.len() - 1) as f32;
        // floor(-d scale) within [0, last]: -inf (a banned token) lands in the last bucket
        let index = |d: f32| {
            #[allow(clippy::manual_clamp)]
            let k = (-d * scale).max(0.0).min(last);
            // SAFETY: `k` lies in [0, last] (a NaN would have become 0), so it converts.
            unsafe { k.to_int_unchecked::<i32>() as u16 }
        };
        let n = z.len().min(bucket.len());
        // per block: weights and buckets in vector lanes, then the adds one by one (in
        // separate loops, so neither waits on the other)
        let mut w = [0f32; N];
        let (zc, bc) = (z[..n].chunks_exact(N), bucket[..n].chunks_exact_mut(N));
        let rem = n - zc.remainder().len();
        for (c, out) in zc.zip(bc) {
            for j in 0..N {
                let d = c[j] / t - ymax;
                w[j] = exp_bulk::<FMA>(d);
                out[j] = index(d);
            }
            // two interleaved sums per bucket, so neighbours in a bucket do not wait
            for j in 0..N {
                mass[usize::from(out[j])][j & 1] += f64::from(w[j]);
            }
        }
        for i in rem..n {
            let d = z[i] / t - ymax;
            let b = index(d);
            bucket[i] = b;
            mass[usize::from(b)][0] += f64::from(exp_bulk::<FMA>(d));
        }
    }

    #[inline(always)]
    pub fn collect_buckets(bucket: &[u16], first: u16, last: u16, out: &mut Vec<u32>) {
        const N: usize = 64;
        let span = last.wrapping_sub(first);
        let hits = |i0: usize, chunk: &[u16], out: &mut Vec<u32>| {
            for (j, &b) in chunk.iter().enumerate() {
                if b.wrapping_sub(first) <= span {
                    out.push((i0 + j) as u32);
                }
            }
        };
        let chunks = bucket.chunks_exact(N);
        let rem = chunks.remainder();
        for (c, chunk) in chunks.enumerate() {
            // a chunk judged in vector lanes, its hits found by groups of 16
            let mut any = [[0u16; 16]; N / 16];
            for k in 0..N / 16 {
                for j in 0..16 {
                    any[k][j] = u16::from(chunk[k * 16 + j].wrapping_sub(first) <= span);
                }
            }
            for k in 0..N / 16 {
                if any[k].iter().fold(0, |a, &h| a | h) != 0 {
                    hits(c * N + k * 16, &chunk[k * 16..k * 16 + 16], out);
                }
            }
        }
        hits(bucket.len() - rem.len(), rem, out);
    }

    /// `v[i] = fmath::exp(v[i] - shift)`.
    #[inline(always)]
    pub fn exp_shifted(v: &mut [f32], shift: f32) {
        for x in v {
            *x = crate::fmath::exp(*x - shift);
        }
    }

    /// Σ `w[i]` over `z[i] >= thr`, in sixteen f32 chains added in f64.
    #[inline(always)]
    pub fn mass_ge(z: &[f32], w: &[f32], thr: f32) -> f64 {
        let mut acc = [0f32; LANES];
        let n = z.len().min(w.len());
        let (zc, wc) = (z[..n].chunks_exact(LANES), w[..n].chunks_exact(LANES));
        let rem = n - zc.remainder().len();
        for (c, d) in zc.zip(wc) {
            for j in 0..LANES {
                // a bit mask, not a branch, so the loop vectorises
                let keep = 0u32.wrapping_sub(u32::from(c[j] >= thr));
                acc[j] += f32::from_bits(d[j].to_bits() & keep);
            }
        }
        let mut total: f64 = acc.iter().map(|&a| f64::from(a)).sum();
        for (&zi, &wi) in z[rem..n].iter().zip(&w[rem..n]) {
            if zi >= thr {
                total += f64::from(wi);
            }
        }
        total
    }

    #[inline(always)]
    pub fn count_rank(z: &[f32], v: f32, idx: usize) -> u64 {
        // number of values > v, plus values == v at a smaller index
        let mut gt = [0u32; LANES];
        let chunks = z.chunks_exact(LANES);
        let rem_start = z.len() - chunks.remainder().len();
        for c in chunks {
            for j in 0..LANES {
                gt[j] += u32::from(c[j] > v);
            }
        }
        let mut n: u64 = gt.iter().map(|&g| u64::from(g)).sum();
        n += z[rem_start..].iter().filter(|&&x| x > v).count() as u64;
        n + z[..idx].iter().filter(|&&x| x == v).count() as u64
    }

    /// `a · b` with `a`'s elements widened to f32 by `wide`, in eight 16-wide f32 chains
    /// (the order of the sum depends only on the length).
    #[inline(always)]
    fn dot<T: Copy>(a: &[T], b: &[f32], wide: impl Fn(T) -> f32) -> f32 {
        const W: usize = 128;
        let mut acc = [0f32; W];
        let ca = a.chunks_exact(W);
        let cb = b.chunks_exact(W);
        let (ra, rb) = (ca.remainder(), cb.remainder());
        for (x, y) in ca.zip(cb) {
            for j in 0..W {
                acc[j] += wide(x[j]) * y[j];
            }
        }
        let mut tail = 0f32;
        for (x, y) in ra.iter().zip(rb) {
            tail += wide(*x) * y;
        }
        reduce128(&acc) + tail
    }

    /// `y = W x` for a row-major `W [y.len(), x.len()]`.
    #[inline(always)]
    fn matvec<T: Copy>(w: &[T], x: &[f32], y: &mut [f32], wide: impl Fn(T) -> f32 + Copy) {
        let n = x.len();
        for (r, yr) in y.iter_mut().enumerate() {
            *yr = dot(&w[r * n..(r + 1) * n], x, wide);
        }
    }

    #[inline(always)]
    fn bf16_bits_to_f32(b: u16) -> f32 {
        f32::from_bits(u32::from(b) << 16)
    }

    #[inline(always)]
    pub fn philox_x32(first_block: u32, step: u64, key: [u32; 2], out: &mut [u32; 128]) {
        let blocks = std::array::from_fn(|j| first_block.wrapping_add(j as u32));
        philox_listed(&blocks, step, key, out)
    }

    #[inline(always)]
    pub fn philox_listed(blocks: &[u32; 32], step: u64, key: [u32; 2], out: &mut [u32; 128]) {
        use crate::philox::{PHILOX_M0, PHILOX_M1};
        const L: usize = 32;
        let row = super::RowKeys::new(step, key);
        let hi = |p: u64| (p >> 32) as u32;
        let (mut c0, mut c1, mut c2, mut c3) = ([0u32; L], [0u32; L], [0u32; L], [0u32; L]);
        // rounds 1-3 from the row's constants, as the vector variants make them
        for j in 0..L {
            // round 1: words 0 and 1 are the row's
            let p0 = u64::from(PHILOX_M0) * u64::from(blocks[j]);
            // round 2: word 0's product is the row's
            let p1 = u64::from(PHILOX_M1) * u64::from(hi(p0) ^ row.keys[0][1]);
            let (w0, w1, w2) = (hi(p1) ^ row.r2_w0, p1 as u32, p0 as u32 ^ row.r2_w2);
            // round 3: word 3 was the row's
            let p0 = u64::from(PHILOX_M0) * u64::from(w0);
            let p1 = u64::from(PHILOX_M1) * u64::from(w2);
            c0[j] = hi(p1) ^ w1 ^ row.keys[2][0];
            c1[j] = p1 as u32;
            c2[j] = hi(p0) ^ row.r3_w2;
            c3[j] = p0 as u32;
        }
        for [k0, k1] in row.keys.into_iter().skip(3) {
            for j in 0..L {
                let p0 = u64::from(PHILOX_M0) * u64::from(c0[j]);
                let p1 = u64::from(PHILOX_M1) * u64::from(c2[j]);
                let n0 = ((p1 >> 32) as u32) ^ c1[j] ^ k0;
                let n2 = ((p0 >> 32) as u32) ^ c3[j] ^ k1;
                c1[j] = p1 as u32;
                c3[j] = p0 as u32;
                c0[j] = n0;
                c2[j] = n2;
            }
        }
        for j in 0..L {
            out[4 * j] = c0[j];
            out[4 * j + 1] = c1[j];
            out[4 * j + 2] = c2[j];
            out[4 * j + 3] = c3[j];
        }
    }

    /// At least the largest of a chunk's words, from their top 15 bits: a signed 16-bit
    /// max, which SSE2 has (it has no 32-bit one).
    #[inline(always)]
    pub fn word_max_top15(words: &[u32; 128]) -> u32 {
        let top = words.iter().fold(0i16, |a, &w| a.max((w >> 17) as i16));
        (top as u32) << 17 | 0x1_FFFF
    }

    /// Whether a chunk whose largest value is `zmax` can reach the threshold of the
    /// word `w` ([`super::gumbel_reach`]'s test): with `w` the largest word of the chunk,
    /// false only when no token of it can.
    #[inline(always)]
    pub fn reaches(zmax: f32, w: u32, c0: f32, c1: f32) -> bool {
        zmax >= crate::philox::gumbel_reach_threshold(w, c0, c1)
    }

    /// [`super::gumbel_reach`] of a chunk of at most 128 tokens.
    pub fn gumbel_reach(z: &[f32], words: &[u32; 128], c0: f32, c1: f32) -> u128 {
        // a byte per token, in a loop the compiler vectorises, then eight bytes to eight
        // bits by one multiply (byte i's bit lands at bit 56 + i)
        let mut keep = [0u8; 128];
        for ((k, &zj), &x) in keep.iter_mut().zip(z).zip(words) {
            *k = u8::from(zj >= crate::philox::gumbel_reach_threshold(x, c0, c1));
        }
        let mut m = 0u128;
        for (i, b) in keep.chunks_exact(8).enumerate() {
            let v = u64::from_le_bytes(b.try_into().expect("8 bytes"));
            m |= u128::from(v.wrapping_mul(0x0102_0408_1020_4080) >> 56) << (8 * i);
        }
        m
    }

    #[inline(always)]
    pub fn chunk_max(c: &[f32]) -> (f32, bool) {
        let mut m = [f32::NEG_INFINITY; 16];
        let mut sum = [0f32; 16];
        let chunks = c.chunks_exact(16);
        let rem = chunks.remainder();
        for v in chunks {
            for j in 0..16 {
                m[j] = if v[j] > m[j] { v[j] } else { m[j] };
                sum[j] += v[j];
            }
        }
        let mut mm = f32::NEG_INFINITY;
        let mut s = 0f32;
        for j in 0..16 {
            mm = if m[j] > mm { m[j] } else { mm };
            s += sum[j];
        }
        for &x in rem {
            mm = if x > mm { x } else { mm };
            s += x;
        }
        // a NaN or an infinity makes the sum NaN or infinite (as may an overflow)
        (mm, !s.is_finite())
    }

    /// Sum of 128 lanes by halving (vertical vector adds, then a short tree).
    #[inline(always)]
    fn reduce128(acc: &[f32; 128]) -> f32 {
        let mut v = [0f32; 16];
        for c in acc.chunks_exact(16) {
            for j in 0..16 {
                v[j] += c[j];
            }
        }
        let mut w = 16;
        while w > 1 {
            w /= 2;
            for j in 0..w {
                v[j] += v[j + w];
            }
        }
        v[0]
    }

    #[inline(always)]
    pub fn matvec_f32(w: &[f32], x: &[f32], y: &mut [f32]) {
        matvec(w, x, y, |v| v);
    }

    #[inline(always)]
    pub fn matvec_bf16(w: &[u16], x: &[f32], y: &mut [f32]) {
        matvec(w, x, y, bf16_bits_to_f32);
    }

    #[inline(always)]
    pub fn widen_bf16(src: &[u16], dst: &mut [f32]) {
        for (d, &s) in dst.iter_mut().zip(src) {
            *d = bf16_bits_to_f32(s);
        }
    }

    /// IEEE half to f32, exactly, without branches (vectorises): the exponent is rebiased
    /// by a multiplication by 2^112 (which also normalises subnormals); infinities and
    /// NaN are rebuilt on their bits.
    #[inline(always)]
    fn f16_bits_to_f32(h: u16) -> f32 {
        let h = u32::from(h);
        let em = h & 0x7fff;
        let scaled = f32::from_bits(em << 13) * f32::from_bits(0x7780_0000);
        let special = f32::from_bits((em << 13) | 0x7f80_0000);
        let v = if em >= 0x7c00 { special } else { scaled };
        f32::from_bits(v.to_bits() | ((h & 0x8000) << 16))
    }

    #[inline(always)]
    pub fn matvec_f16(w: &[u16], x: &[f32], y: &mut [f32]) {
        matvec(w, x, y, f16_bits_to_f32);
    }

    #[inline(always)]
    pub fn widen_f16(src: &[u16], dst: &mut [f32]) {
        for (d, &s) in dst.iter_mut().zip(src) {
            *d = f16_bits_to_f32(s);
        }
    }

    /// `x` reordered to match 16 packed words read side by side: with `P = 32 / BITS`
    /// codes per word, block `k` of `16 P` inputs is laid out as `xp[k][s][l] =
    /// x[16 P k + P l + s]` (code `s` of word `l`); a last partial block keeps the same
    /// layout for the words it has.
    #[inline(always)]
    fn permute_x<const BITS: u32>(x: &[f32], xp: &mut Vec<f32>) {
        let per = (32 / BITS) as usize;
        let words = x.len() / per;
        xp.clear();
        xp.resize(x.len(), 0.0);
        for k0 in (0..words).step_by(16) {
            let lanes = (words - k0).min(16);
            for s in 0..per {
                for l in 0..lanes {
                    xp[k0 * per + s * lanes + l] = x[(k0 + l) * per + s];
                }
            }
        }
    }

    /// `Σ_i w_i x_i` over one packed row (`w = scale * q + bias` per group, rounded after
    /// the product and after the sum), `xp` from [`permute_x`]: 16 words side by side, the
    /// codes of each taken out by shifts (vectorises across the words).
    #[inline(always)]
    fn qdot<const BITS: u32>(
        group: usize,
        row: &[u32],
        scales: &[f32],
        biases: &[f32],
        xp: &[f32],
    ) -> f32 {
        let per = (32 / BITS) as usize;
        let mask = (1u32 << BITS) - 1;
        let mut acc = [0f32; 16];
        let words = row.len();
        let mut k0 = 0;
        let mut head = 0f32;
        #[cfg(target_arch = "x86_64")]
        if super::level() == super::Level::Avx512 && group.is_power_of_two() {
            let blocks = words / 16;
            // SAFETY: `level()` detected AVX-512 F; the row holds `blocks * 16` words and
            // `xp` their permuted inputs; scales and biases cover the row's groups.
            head = unsafe {
                super::simd512::qdot_blocks(BITS, group, row, blocks, scales, biases, xp)
            };
            k0 = blocks * 16;
        }
        while k0 < words {
            let lanes = (words - k0).min(16);
            let mut w = [0u32; 16];
            let mut sc = [0f32; 16];
            let mut bi = [0f32; 16];
            for l in 0..lanes {
                w[l] = row[k0 + l];
                let g = (k0 + l) * per / group;
                sc[l] = scales[g];
                bi[l] = biases[g];
            }
            let xb = &xp[k0 * per..k0 * per + lanes * per];
            for s in 0..per {
                let xs = &xb[s * lanes..s * lanes + lanes];
                if lanes == 16 {
                    for l in 0..16 {
                        let q = ((w[l] >> (BITS as usize * s)) & mask) as f32;
                        acc[l] += (sc[l] * q + bi[l]) * xs[l];
                    }
                } else {
                    for l in 0..lanes {
                        let q = ((w[l] >> (BITS as usize * s)) & mask) as f32;
                        acc[l] += (sc[l] * q + bi[l]) * xs[l];
                    }
                }
            }
            k0 += lanes;
        }
        let mut n = 16;
        while n > 1 {
            n /= 2;
            for j in 0..n {
                acc[j] += acc[j + n];
            }
        }
        head + acc[0]
    }

    #[inline(always)]
    fn matmul_q<const BITS: u32>(
        group: usize,
        inf: usize,
        packed: &[u32],
        scales: &[f32],
        biases: &[f32],
        lhs: &[f32],
        dst: &mut [f32],
    ) {
        let m = lhs.len() / inf;
        if m == 0 {
            return;
        }
        let of = dst.len() / m;
        let rw = inf / (32 / BITS) as usize;
        let rg = inf / group;
        // every row of lhs permuted once; each weight row is then a dot with each
        let mut xps = Vec::with_capacity(m * inf);
        let mut one = Vec::new();
        for t in 0..m {
            permute_x::<BITS>(&lhs[t * inf..(t + 1) * inf], &mut one);
            xps.extend_from_slice(&one);
        }
        for o in 0..of {
            let row = &packed[o * rw..(o + 1) * rw];
            let (sc, bi) = (&scales[o * rg..(o + 1) * rg], &biases[o * rg..(o + 1) * rg]);
            for t in 0..m {
                dst[t * of + o] = qdot::<BITS>(group, row, sc, bi, &xps[t * inf..(t + 1) * inf]);
            }
        }
    }

    /// `dst [m, out] = lhs [m, in] · W^T` for affine-quantized `W [out, in]`: each group
    /// of 16 codes is dequantized once in registers and applied to every row of `lhs`.
    #[inline(always)]
    #[allow(clippy::too_many_arguments)]
    pub fn matmul_affine(
        bits: u32,
        group: usize,
        inf: usize,
        packed: &[u32],
        scales: &[f32],
        biases: &[f32],
        lhs: &[f32],
        dst: &mut [f32],
    ) {
        if bits == 4 {
            matmul_q::<4>(group, inf, packed, scales, biases, lhs, dst);
        } else {
            matmul_q::<8>(group, inf, packed, scales, biases, lhs, dst);
        }
    }
}

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Level {
    Avx512,
    Avx2,
    Base,
}

/// The instruction set the kernels use: the best this CPU has, or a lower one named by
/// the environment variable `DECODA_ISA` (`avx2` or `baseline`; read once), so that every
/// variant can be tested and timed on one machine.
fn level() -> Level {
    use std::sync::OnceLock;
    static L: OnceLock<Level> = OnceLock::new();
    *L.get_or_init(|| {
        let best = detected();
        match std::env::var("DECODA_ISA").as_deref() {
            Ok("baseline") => Level::Base,
            Ok("avx2") if best == Level::Avx512 => Level::Avx2,
            _ => best,
        }
    })
}

/// The best instruction set of this CPU that the kernels have a variant for.
fn detected() -> Level {
    #[cfg(target_arch = "x86_64")]
    {
        if std::is_x86_feature_detected!("avx512f")
            && std::is_x86_feature_detected!("avx512bw")
            && std::is_x86_feature_detected!("avx512dq")
            && std::is_x86_feature_detected!("avx512vl")
            && std::is_x86_feature_detected!("fma")
        {
            return Level::Avx512;
        }
        if std::is_x86_feature_detected!("avx2") && std::is_x86_feature_detected!("fma") {
            return Level::Avx2;
        }
    }
    Level::Base
}

/// The instruction set the kernels run with on this machine.
pub fn isa() -> &'static str {
    match level() {
        Level::Avx512 => "avx512",
        Level::Avx2 => "avx2",
        Level::Base => "baseline",
    }
}

macro_rules! dispatch {
    ($(#[$doc:meta])* pub fn $name:ident($($arg:ident : $ty:ty),*) -> $ret:ty;) => {
        $(#[$doc])*
        #[allow(clippy::too_many_arguments)]
        pub fn $name($($arg: $ty),*) -> $ret {
            #[cfg(target_arch = "x86_64")]
            {
                #[target_feature(enable = "avx512f,avx512bw,avx512dq,avx512vl,avx2,fma")]
                #[allow(clippy::too_many_arguments)]
                unsafe fn wide($($arg: $ty),*) -> $ret {
                    body::$name($($arg),*)
                }
                #[target_feature(enable = "avx2,fma")]
                #[allow(clippy::too_many_arguments)]
                unsafe fn avx2($($arg: $ty),*) -> $ret {
                    body::$name($($arg),*)
                }
                match level() {
                    // SAFETY: `level()` detected AVX-512 F/BW/DQ/VL and FMA on this CPU.
                    Level::Avx512 => return unsafe { wide($($arg),*) },
                    // SAFETY: `level()` detected AVX2 and FMA on this CPU.
                    Level::Avx2 => return unsafe { avx2($($arg),*) },
                    Level::Base => {}
                }
            }
            body::$name($($arg),*)
        }
    };
}

/// The maximum of `z` and the number of NaN or `+inf` values (the max is meaningless
/// when that number is not 0).
pub fn max_nonfinite(z: &[f32]) -> (f32, u64) {
    #[cfg(target_arch = "x86_64")]
    {
        #[target_feature(enable = "avx512f,avx512bw,avx512dq,avx512vl,avx2,fma")]
        unsafe fn wide(z: &[f32]) -> (f32, u64) {
            body::max_nonfinite(z)
        }
        #[target_feature(enable = "avx2,fma")]
        unsafe fn avx2(z: &[f32]) -> (f32, u64) {
            body::max_nonfinite(z)
        }
        match level() {
            // SAFETY: `level()` detected AVX-512 F/BW/DQ/VL and FMA on this CPU.
            Level::Avx512 => unsafe { wide(z) },
            // SAFETY: `level()` detected AVX2 and FMA on this CPU.
            Level::Avx2 => unsafe { avx2(z) },
            // SAFETY: SSE2 is part of x86-64.
            Level::Base => unsafe { sse2::max_nonfinite(z) },
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    body::max_nonfinite(z)
}
dispatch! {
    /// The maximum of `z`: the streaming pass that defines the benchmarks' memory floor.
    pub fn max(z: &[f32]) -> f32;
}
/// The maximum of `z`, the first index that holds it, and whether `z` holds a NaN or
/// `+inf` (the other two are meaningless then): a greedy draw's token. With AVX2 or
/// AVX-512 one pass (each lane keeps its first maximum and where it was, the lanes are
/// joined at the end); otherwise the max pass and a search for its first index. For an
/// empty `z`: `(-inf, usize::MAX, false)`.
pub fn argmax_nonfinite(z: &[f32]) -> (f32, usize, bool) {
    #[cfg(target_arch = "x86_64")]
    match level() {
        _ if z.len() < 64 => {}
        // SAFETY: `level()` detected AVX-512 F on this CPU.
        Level::Avx512 => return unsafe { simd512::argmax_nonfinite(z) },
        // SAFETY: `level()` detected AVX2 and FMA on this CPU.
        Level::Avx2 => return unsafe { simd::argmax_nonfinite(z) },
        Level::Base => {}
    }
    let (m, bad) = max_nonfinite(z);
    (m, first_eq(z, m).unwrap_or(usize::MAX), bad > 0)
}

/// The scalar end of the vector [`argmax_nonfinite`] variants: the values from `from`
/// on folded into the vector part's `(max, first index, flagged)` (a later index needs
/// a larger value; the vector part covered at least one block, so its index is real).
#[cfg(target_arch = "x86_64")]
#[inline(always)]
fn finish_argmax(
    z: &[f32],
    from: usize,
    (mut m, mut at, mut bad): (f32, usize, bool),
) -> (f32, usize, bool) {
    for (j, &x) in z.iter().enumerate().skip(from) {
        if x > m {
            (m, at) = (x, j);
        }
        bad |= x.is_nan() || x == f32::INFINITY;
    }
    (m, at, bad)
}
dispatch! {
    /// The minimum of `z` (NaN values are skipped).
    pub fn min(z: &[f32]) -> f32;
}
/// The first index holding `v`, if any.
pub fn first_eq(z: &[f32], v: f32) -> Option<usize> {
    #[cfg(target_arch = "x86_64")]
    if level() != Level::Base {
        // SAFETY: `level()` detected AVX2 (and FMA) on this CPU.
        return unsafe { simd::first_eq(z, v) };
    }
    body::first_eq(z, v)
}

/// Appends `(base + i, z[i])` for every `z[i] >= thr` (NaN never), in index order,
/// skipping 64-wide blocks with none.
pub fn collect_ge(z: &[f32], base: u32, thr: f32, out: &mut Vec<(u32, f32)>) {
    #[cfg(target_arch = "x86_64")]
    match level() {
        // SAFETY: `level()` detected AVX2 (and FMA) on this CPU.
        Level::Avx512 | Level::Avx2 => unsafe { simd::collect_ge(z, base, thr, out) },
        // SAFETY: SSE2 is part of x86-64.
        Level::Base => unsafe { sse2::collect_ge(z, base, thr, out) },
    }
    #[cfg(not(target_arch = "x86_64"))]
    body::collect_ge(z, base, thr, out)
}

/// [`collect_ge`] and the maximum of `z` with whether it holds a NaN or `+inf` (the
/// maximum and what was appended are meaningless then: a variant may gather a NaN):
/// one pass on x86-64, two passes elsewhere.
pub fn collect_ge_max(z: &[f32], base: u32, thr: f32, out: &mut Vec<(u32, f32)>) -> (f32, bool) {
    #[cfg(target_arch = "x86_64")]
    match level() {
        // SAFETY: `level()` detected AVX-512 F on this CPU.
        Level::Avx512 => unsafe { simd512::collect_ge_max(z, base, thr, out) },
        // SAFETY: `level()` detected AVX2 and FMA on this CPU.
        Level::Avx2 => unsafe { simd::collect_ge_max(z, base, thr, out) },
        // SAFETY: SSE2 is part of x86-64.
        Level::Base => unsafe { sse2::collect_ge_max(z, base, thr, out) },
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        let (m, bad) = max_nonfinite(z);
        collect_ge(z, base, thr, out);
        (m, bad > 0)
    }
}

/// Appends `(base + j, z[j])` for `j = at + b`, every bit `b` set in `hits`, in order.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
fn push_hits(mut hits: u64, at: usize, base: u32, z: &[f32], out: &mut Vec<(u32, f32)>) {
    if hits == 0 {
        return;
    }
    let n = hits.count_ones() as usize;
    out.reserve(n);
    let len = out.len();
    let spare = &mut out.spare_capacity_mut()[..n];
    for slot in spare {
        let j = at + hits.trailing_zeros() as usize;
        slot.write((base + j as u32, z[j]));
        hits &= hits - 1;
    }
    // SAFETY: the `n` slots after `len` were written just above.
    unsafe { out.set_len(len + n) };
}

/// How many values the AVX-512 gathering pass ([`collect_ge_max`]) covers before it turns
/// its hit masks into pushes: the vector loop runs that long without a call or a branch
/// it may mispredict, the masks (64 bits per 64 values) wait on the stack.
#[cfg(target_arch = "x86_64")]
const SEGMENT: usize = 4096;

/// The loop of the one-pass [`collect_ge_max`] variants: `block(state, at)` takes the 64
/// values at `at` (keeping its running max and NaN check in `state`) and returns their
/// hit mask (bit `j` for `z[at + j] >= thr`). The masks of up to 64 blocks are kept on the
/// stack and turned into pushes after them, so no call sits inside the vector loop (a call
/// would force the vector registers out to memory). The state starts as `fresh` at each
/// such segment and is handed to `fold` at its end, before the pushes: its registers live
/// only inside the vector loop (kept across the pushes' calls, a running max was held on
/// the stack, a store and a load in its chain at every block). The row's lines are asked
/// for [`PREFETCH_AHEAD`] values ahead. Returns where the full blocks end.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
fn staged_hits<S: Copy>(
    z: &[f32],
    base: u32,
    out: &mut Vec<(u32, f32)>,
    fresh: S,
    mut block: impl FnMut(&mut S, usize) -> u64,
    mut fold: impl FnMut(S),
) -> usize {
    let n = z.len();
    let mut i = 0;
    let mut masks = [0u64; 64];
    while i + 64 <= n {
        let blocks = ((n - i) / 64).min(64);
        let mut state = fresh;
        for (b, mask) in masks[..blocks].iter_mut().enumerate() {
            prefetch_lines(z, i + 64 * b + PREFETCH_AHEAD, 64);
            *mask = block(&mut state, i + 64 * b);
        }
        fold(state);
        for (b, &mask) in masks[..blocks].iter().enumerate() {
            push_hits(mask, i + 64 * b, base, z, out);
        }
        i += 64 * blocks;
    }
    i
}

/// The end of the one-pass [`collect_ge_max`] variants: the values from `from` on, one at
/// a time, folded into the blocks' max `mx` and NaN flag `bad`, hits appended.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
fn finish_ge_max(
    z: &[f32],
    from: usize,
    (base, thr): (u32, f32),
    out: &mut Vec<(u32, f32)>,
    (mut mx, mut bad): (f32, bool),
) -> (f32, bool) {
    for (j, &x) in z.iter().enumerate().skip(from) {
        bad |= x.is_nan();
        mx = if x > mx { x } else { mx };
        if x >= thr {
            out.push((base + j as u32, x));
        }
    }
    (mx, bad || mx == f32::INFINITY)
}

/// What the Philox variants need of a row, made once: each round's key pair, and the
/// words of rounds 1-3 that are the same for every block of the row. A sampling-stream
/// counter is `[block, step_lo, step_hi, 0]`, so only word 0 differs between blocks:
/// round 1's product of word 2 and round 2's of word 0 are the row's, and so are the
/// words they make (`crate::philox::philox4x32_10` is what is computed; only where a
/// value is the same for every block is it computed once).
#[derive(Clone, Copy)]
pub(crate) struct RowKeys {
    /// Each round's `(k0, k1)`.
    keys: [[u32; 2]; 10],
    /// Round 2's word 0 XOR-ed into round 2's new word 0: `lo(M1 step_hi) ^ k0[1]`.
    r2_w0: u32,
    /// Round 2's XOR into its new word 2: `hi(M0 a) ^ k1[1]`, `a` round 1's word 0.
    r2_w2: u32,
    /// Round 3's XOR into its new word 2: `lo(M0 a) ^ k1[2]`.
    r3_w2: u32,
}

impl RowKeys {
    /// The constants of sampling-stream counters at `step` under `key`.
    pub fn new(step: u64, key: [u32; 2]) -> Self {
        use crate::philox::{PHILOX_M0, PHILOX_M1, PHILOX_W0, PHILOX_W1};
        let mut keys = [[0u32; 2]; 10];
        let [mut k0, mut k1] = key;
        for (round, k) in keys.iter_mut().enumerate() {
            if round > 0 {
                k0 = k0.wrapping_add(PHILOX_W0);
                k1 = k1.wrapping_add(PHILOX_W1);
            }
            *k = [k0, k1];
        }
        let (s_lo, s_hi) = (step as u32, (step >> 32) as u32);
        // round 1: words 0 and 1 come from word 2 (`step_hi`), the same for every block
        let p1 = u64::from(PHILOX_M1) * u64::from(s_hi);
        let a = (p1 >> 32) as u32 ^ s_lo ^ keys[0][0];
        let b = p1 as u32;
        // round 2: the product of word 0 (`a`) is the row's; its low half is round 2's
        // word 3, which round 3 XORs into its word 2
        let pa = u64::from(PHILOX_M0) * u64::from(a);
        Self {
            keys,
            r2_w0: b ^ keys[1][0],
            r2_w2: (pa >> 32) as u32 ^ keys[1][1],
            r3_w2: pa as u32 ^ keys[2][1],
        }
    }
}

/// Round 1's product `M0 * first_block` when the `count` consecutive blocks from
/// `first_block` do not wrap past `2^32 - 1`: then their products are this plus `M0`
/// times the offsets `0..count`, a 64-bit add each instead of a multiply. `None` when
/// they wrap (the vector variants multiply then).
#[cfg(target_arch = "x86_64")]
#[inline(always)]
fn consecutive_products(first_block: u32, count: u32) -> Option<u64> {
    (first_block <= u32::MAX - (count - 1))
        .then(|| u64::from(crate::philox::PHILOX_M0) * u64::from(first_block))
}

/// `M0 * j` for the offset `j` of a block from the first of a call's (see
/// [`consecutive_products`]).
#[cfg(target_arch = "x86_64")]
#[inline(always)]
const fn m0_times(j: u64) -> i64 {
    (crate::philox::PHILOX_M0 as u64 * j) as i64
}

/// AVX-512 loops that fuse several passes: [`collect_ge_max`] and [`exp2_sum_collect`]
/// (compares give bit masks directly).
#[cfg(target_arch = "x86_64")]
mod simd512 {
    use super::{consecutive_products, m0_times, push_hits, RowKeys};
    use super::{EXP2_C1, EXP2_C2, EXP2_TABLE, MAGIC32};
    use std::arch::x86_64::*;

    /// Pushes the hits of `masks` (bit `b` of `masks[v]` for `z[at + 64 v + b]`) as
    /// [`super::push_hits`] does: eight masks judged at once in a vector register, so a
    /// segment without hits costs a test per eight masks, not a loop over them.
    #[inline]
    #[target_feature(enable = "avx512f")]
    fn push_masks(masks: &[u64], at: usize, base: u32, z: &[f32], out: &mut Vec<(u32, f32)>) {
        let eights = masks.chunks_exact(8);
        let rest = eights.remainder();
        for (c, eight) in eights.enumerate() {
            // SAFETY: the chunk holds eight u64, 64 bytes.
            let v = unsafe { _mm512_loadu_si512(eight.as_ptr().cast()) };
            let mut nonzero = _mm512_test_epi64_mask(v, v);
            while nonzero != 0 {
                let b = nonzero.trailing_zeros() as usize;
                super::push_hits(eight[b], at + 64 * (8 * c + b), base, z, out);
                nonzero &= nonzero - 1;
            }
        }
        let first = masks.len() - rest.len();
        for (b, &hits) in rest.iter().enumerate() {
            super::push_hits(hits, at + 64 * (first + b), base, z, out);
        }
    }

    /// Round 1's products `M0 * block` of the `8 N` consecutive blocks from
    /// `first_block`, block `8 h + j` in lane `j` of register `h`
    /// ([`consecutive_products`]).
    #[inline]
    #[target_feature(enable = "avx512f")]
    unsafe fn first_products<const N: usize>(first_block: u32) -> [__m512i; N] {
        // (loops over the registers: `array::from_fn` can be left as a call)
        let mut p = [_mm512_setzero_si512(); N];
        if let Some(first) = consecutive_products(first_block, 8 * N as u32) {
            let base = _mm512_set1_epi64(first as i64);
            for (h, ph) in p.iter_mut().enumerate() {
                let b = 8 * h as u64;
                let offs = _mm512_setr_epi64(
                    m0_times(b),
                    m0_times(b + 1),
                    m0_times(b + 2),
                    m0_times(b + 3),
                    m0_times(b + 4),
                    m0_times(b + 5),
                    m0_times(b + 6),
                    m0_times(b + 7),
                );
                *ph = _mm512_add_epi64(base, offs);
            }
        } else {
            let lanes = _mm512_setr_epi64(0, 1, 2, 3, 4, 5, 6, 7);
            let m0v = _mm512_set1_epi64(i64::from(crate::philox::PHILOX_M0));
            for (h, ph) in p.iter_mut().enumerate() {
                let b = _mm512_add_epi64(
                    _mm512_set1_epi64(i64::from(first_block.wrapping_add(8 * h as u32))),
                    lanes,
                );
                *ph = _mm512_mul_epu32(b, m0v);
            }
        }
        p
    }

    /// Philox4x32-10 of 32 consecutive blocks: block `j` of chain `h` (8 blocks each, four
    /// independent chains so that the multiplies' latency overlaps) in 64-bit lane `j` of
    /// four registers, one per word. Each word sits in the low half of its lane: the
    /// 32x32-bit multiply reads only that half, so the product's high half is a shift
    /// away and what the XORs leave above a word never matters. Then words 0-3 of each
    /// block are interleaved so that `out[4 j + w]` is word `w` of block `first_block + j`.
    ///
    /// # Safety
    /// AVX-512 F must be present.
    #[target_feature(enable = "avx512f")]
    pub unsafe fn philox_x32(first_block: u32, step: u64, key: [u32; 2], out: &mut [u32; 128]) {
        philox_row(first_block, &RowKeys::new(step, key), out);
    }

    /// [`philox_x32`] with the row's constants made beforehand.
    ///
    /// # Safety
    /// AVX-512 F must be present.
    #[inline]
    #[target_feature(enable = "avx512f")]
    pub unsafe fn philox_row(first_block: u32, row: &RowKeys, out: &mut [u32; 128]) {
        store_pairs(&philox_rounds(first_products::<4>(first_block), row), out);
    }

    /// [`super::philox_listed`] with AVX-512: the blocks in four chains of 8 as in
    /// [`philox_x32`].
    ///
    /// # Safety
    /// AVX-512 F must be present.
    #[target_feature(enable = "avx512f")]
    pub unsafe fn philox_listed(
        blocks: &[u32; 32],
        step: u64,
        key: [u32; 2],
        out: &mut [u32; 128],
    ) {
        let p = blocks.as_ptr().cast::<__m256i>();
        let m0 = _mm512_set1_epi64(i64::from(crate::philox::PHILOX_M0));
        // SAFETY: chain h reads blocks 8 h .. 8 h + 8 of the 32.
        let p0 = std::array::from_fn(|h| unsafe {
            _mm512_mul_epu32(_mm512_cvtepu32_epi64(_mm256_loadu_si256(p.add(h))), m0)
        });
        store_pairs(&philox_rounds(p0, &RowKeys::new(step, key)), out);
    }

    /// One of rounds 4-9 of [`rounds_of`]'s chains, with the round keys `k(round, _)`:
    /// chain `h`'s words 0-3 in `$w0[h]`-`$w3[h]` before, in `$w1[h]`, `$w2[h]`,
    /// `$w3[h]`, `$w0[h]` after (each product written over the word it multiplied, each
    /// new XOR over the word it XORs in: the next round names them one place on, so no
    /// register is copied). Six instructions a chain in inline assembly, the chains one
    /// after another in the order written (round 10 is written the same way): from
    /// intrinsics the compiler's scheduler may string each chain's ten rounds together,
    /// and six chains' rounds then wait on each other's latency instead of running side
    /// by side (on a Zen 5, a loop making only the lane maxima of a row's words took 26
    /// µs so, against 15.5-15.9 µs for the same intrinsics in a crate of their own).
    macro_rules! later_round {
        ($round:literal, $k:ident, $m0:ident, $m1:ident, $w0:ident, $w1:ident, $w2:ident, $w3:ident) => {{
            let (kk0, kk1) = ($k($round, 0), $k($round, 1));
            for h in 0..$w0.len() {
                // SAFETY: register operands only (no memory, stack or flags); the
                // function this expands in enables AVX-512 F. (Where the expansion
                // already sits in an `unsafe` block, this one is redundant.)
                #[allow(unused_unsafe)]
                unsafe {
                    std::arch::asm!(
                        "vpmuludq {w0}, {w0}, {m0}",
                        "vpmuludq {w2}, {w2}, {m1}",
                        "vpsrlq {t}, {w2}, 32",
                        "vpternlogq {w1}, {t}, {k0}, 0x96",
                        "vpsrlq {t}, {w0}, 32",
                        "vpternlogq {w3}, {t}, {k1}, 0x96",
                        w0 = inout(zmm_reg) $w0[h],
                        w1 = inout(zmm_reg) $w1[h],
                        w2 = inout(zmm_reg) $w2[h],
                        w3 = inout(zmm_reg) $w3[h],
                        m0 = in(zmm_reg) $m0,
                        m1 = in(zmm_reg) $m1,
                        k0 = in(zmm_reg) kk0,
                        k1 = in(zmm_reg) kk1,
                        t = out(zmm_reg) _,
                        options(nomem, nostack, preserves_flags),
                    )
                }
            }
        }};
    }

    /// The body of [`philox_rounds`] for `$n` chains of 8 blocks (a literal), for the
    /// gated loop to have it inline: written out (as a loop the compiler keeps rounds
    /// 4-10 rolled, and the loop's exit and the copies it makes at each turn cost more
    /// than the code's size), the function is past what the compiler inlines on its own,
    /// and a call per chunk returns the registers through memory. `$p0` is round 1's
    /// products `[__m512i; $n]` ([`first_products`]); an expression of type
    /// `[[__m512i; 2]; $n]`, chain `h`'s words as [`Pairs`] holds them. AVX-512 F must be
    /// enabled where it is used.
    macro_rules! rounds_of {
        ($n:literal, $p0:expr, $row:expr) => {{
            use crate::philox::{PHILOX_M0, PHILOX_M1};
            let (p0, row): ([__m512i; $n], &RowKeys) = ($p0, $row);
            let m0 = _mm512_set1_epi64(i64::from(PHILOX_M0));
            let m1 = _mm512_set1_epi64(i64::from(PHILOX_M1));
            let k = |r: usize, w: usize| _mm512_set1_epi64(i64::from(row.keys[r][w]));
            let kc = |x: u32| _mm512_set1_epi64(i64::from(x));
            // round 1: word 2 is `hi(M0 block) ^ k1` (word 3 was 0), word 3 the product;
            // words 0 and 1 are the row's
            let zero = _mm512_setzero_si512();
            let (mut c0, mut c1, mut c2, mut c3) = ([zero; $n], [zero; $n], [zero; $n], p0);
            for h in 0..$n {
                c2[h] = _mm512_xor_si512(_mm512_srli_epi64::<32>(p0[h]), k(0, 1));
            }
            // round 2: word 0's product is the row's, so new word 2 is old word 3 XOR a
            // constant and new word 3 is a constant
            for h in 0..$n {
                let p1 = _mm512_mul_epu32(c2[h], m1);
                c0[h] = _mm512_xor_si512(_mm512_srli_epi64::<32>(p1), kc(row.r2_w0));
                c1[h] = p1;
                c2[h] = _mm512_xor_si512(c3[h], kc(row.r2_w2));
            }
            // round 3: word 3 was the row's constant, folded into the XOR of word 2
            for h in 0..$n {
                let p0 = _mm512_mul_epu32(c0[h], m0);
                let p1 = _mm512_mul_epu32(c2[h], m1);
                c0[h] =
                    _mm512_ternarylogic_epi64::<0x96>(_mm512_srli_epi64::<32>(p1), c1[h], k(2, 0));
                c2[h] = _mm512_xor_si512(_mm512_srli_epi64::<32>(p0), kc(row.r3_w2));
                c1[h] = p1;
                c3[h] = p0;
            }
            later_round!(3, k, m0, m1, c0, c1, c2, c3);
            later_round!(4, k, m0, m1, c1, c2, c3, c0);
            later_round!(5, k, m0, m1, c2, c3, c0, c1);
            later_round!(6, k, m0, m1, c3, c0, c1, c2);
            later_round!(7, k, m0, m1, c0, c1, c2, c3);
            later_round!(8, k, m0, m1, c1, c2, c3, c0);
            // words 0-3 are now in c2, c3, c0, c1
            // round 10 leaves each pair of words in one 64-bit lane: the product's high
            // half XORed in place with the other word and the key, both moved up (a
            // shift each, where the high half moved down and the pairing would cost a
            // shift and a permute)
            let kh = |w: usize| _mm512_set1_epi64(i64::from(row.keys[9][w]) << 32);
            let (kh0, kh1) = (kh(0), kh(1));
            let mut pairs = [[zero; 2]; $n];
            for h in 0..$n {
                // words 0-3 in c2, c3, c0, c1: the pairs come out in c0 and c2
                // SAFETY: as in `later_round`.
                #[allow(unused_unsafe)]
                unsafe {
                    std::arch::asm!(
                        "vpmuludq {w0}, {w0}, {m0}",
                        "vpmuludq {w2}, {w2}, {m1}",
                        "vpsllq {t}, {w1}, 32",
                        "vpternlogq {w2}, {t}, {k0}, 0x96",
                        "vpsllq {t}, {w3}, 32",
                        "vpternlogq {w0}, {t}, {k1}, 0x96",
                        w0 = inout(zmm_reg) c2[h],
                        w1 = in(zmm_reg) c3[h],
                        w2 = inout(zmm_reg) c0[h],
                        w3 = in(zmm_reg) c1[h],
                        m0 = in(zmm_reg) m0,
                        m1 = in(zmm_reg) m1,
                        k0 = in(zmm_reg) kh0,
                        k1 = in(zmm_reg) kh1,
                        t = out(zmm_reg) _,
                        options(nomem, nostack, preserves_flags),
                    )
                }
                pairs[h] = [c0[h], c2[h]];
            }
            pairs
        }};
    }

    /// The ten rounds of four chains from round 1's products `M0 * block` (`p0`, one
    /// block per 64-bit lane): chain `h`'s words in [`Pairs`].
    ///
    /// # Safety
    /// AVX-512 F must be present.
    #[inline]
    #[target_feature(enable = "avx512f")]
    unsafe fn philox_rounds(p0: [__m512i; 4], row: &RowKeys) -> Pairs {
        rounds_of!(4, p0, row)
    }

    /// The words of the three chunks from block `first_block` into `out`, made as
    /// [`gated_chunks`] makes them: two groups of six chains.
    ///
    /// # Safety
    /// AVX-512 F must be present.
    #[target_feature(enable = "avx512f")]
    pub unsafe fn philox_three(first_block: u32, row: &RowKeys, out: &mut [[u32; 128]; 3]) {
        let a = rounds_of!(6, first_products::<6>(first_block), row);
        store_pairs(&[a[0], a[1], a[2], a[3]], &mut out[0]);
        let b = rounds_of!(6, first_products::<6>(first_block.wrapping_add(48)), row);
        store_pairs(&[a[4], a[5], b[0], b[1]], &mut out[1]);
        store_pairs(&[b[2], b[3], b[4], b[5]], &mut out[2]);
    }

    /// The words of one call of [`philox_rounds`] in pairs, as they stay in registers:
    /// in 64-bit lane `j` of `pairs[h][0]` words 1 and 0 of chain `h`'s block `j` (low and
    /// high half: the product's halves), of `pairs[h][1]` words 3 and 2. 32-bit lane `d`
    /// of each register holds a token `t` with `t mod 32` one of [`word_lane`]`(d)`.
    type Pairs = [[__m512i; 2]; 4];

    /// The residues mod 32 of the tokens in 32-bit lane `d` of [`Pairs`] (and of the
    /// values' lanes of [`lane_max`]): `2d + 1` and `2d + 3` for even `d`, `2d - 2` and
    /// `2d` for odd `d`.
    #[cfg_attr(not(test), allow(dead_code))]
    pub const fn word_lane(d: usize) -> [usize; 2] {
        let first = if d & 1 == 0 { 2 * d + 1 } else { 2 * d - 2 };
        [first, first + 2]
    }

    /// Chain `h`'s words of [`Pairs`] in token order: the chunk's tokens `32 h .. 32 h + 16`
    /// and `32 h + 16 .. 32 h + 32`.
    ///
    /// # Safety
    /// AVX-512 F must be present.
    #[inline]
    #[target_feature(enable = "avx512f")]
    unsafe fn chain_in_order([x01, x23]: [__m512i; 2]) -> [__m512i; 2] {
        // block j's words 0-3 at 4 j: x01's lanes 2 j + 1 and 2 j, then x23's (index 16 +)
        let ilo = _mm512_setr_epi32(1, 0, 17, 16, 3, 2, 19, 18, 5, 4, 21, 20, 7, 6, 23, 22);
        let ihi = _mm512_add_epi32(ilo, _mm512_set1_epi32(8));
        [
            _mm512_permutex2var_epi32(x01, ilo, x23),
            _mm512_permutex2var_epi32(x01, ihi, x23),
        ]
    }

    /// Chains' words already in token order ([`chain_in_order`]) into `out`.
    ///
    /// # Safety
    /// AVX-512 F must be present.
    #[inline]
    #[target_feature(enable = "avx512f")]
    unsafe fn store_ordered(ordered: &[[__m512i; 2]; 4], out: &mut [u32; 128]) {
        for (h, [lo, hi]) in ordered.iter().enumerate() {
            let p = out.as_mut_ptr().add(32 * h).cast::<__m512i>();
            // SAFETY: chain `h` writes words 32 h .. 32 h + 32 of the 128.
            _mm512_storeu_si512(p, *lo);
            _mm512_storeu_si512(p.add(1), *hi);
        }
    }

    /// The words of [`Pairs`] into `out` in block order: chain `h`'s blocks at
    /// `32 h ..`.
    ///
    /// # Safety
    /// AVX-512 F must be present.
    #[inline]
    #[target_feature(enable = "avx512f")]
    unsafe fn store_pairs(pairs: &Pairs, out: &mut [u32; 128]) {
        let mut ordered = [[_mm512_setzero_si512(); 2]; 4];
        for (o, p) in ordered.iter_mut().zip(pairs) {
            *o = chain_in_order(*p);
        }
        store_ordered(&ordered, out);
    }

    /// [`super::gumbel_reach`] of a chunk whose words are still in [`Pairs`]: each
    /// chain's words put in token order, their thresholds against the chunk's values in
    /// the same lanes (the threshold as [`reach_thresholds`] rounds it, which is the
    /// scalar test's); the words go to `out` only when some token reaches. A partial
    /// chunk (the row's last) goes through `out` and the dispatched test.
    ///
    /// # Safety
    /// AVX-512 F must be present.
    #[inline]
    #[target_feature(enable = "avx512f")]
    unsafe fn pairs_reach(
        pairs: &Pairs,
        z: &[f32],
        out: &mut [u32; 128],
        c0: f32,
        c1: f32,
    ) -> u128 {
        let Ok(full) = <&[f32; 128]>::try_from(z) else {
            store_pairs(pairs, out);
            return super::gumbel_reach(z, out, c0, c1);
        };
        let (vc0, vc1) = (_mm512_set1_ps(c0), _mm512_set1_ps(c1));
        let zp = full.as_ptr();
        let mut ordered = [[_mm512_setzero_si512(); 2]; 4];
        let mut mask = 0u128;
        for (h, (pair, o)) in pairs.iter().zip(&mut ordered).enumerate() {
            *o = chain_in_order(*pair);
            // SAFETY: tokens 32 h .. 32 h + 32 are inside the chunk of 128.
            let (zl, zh) = (
                _mm512_loadu_ps(zp.add(32 * h)),
                _mm512_loadu_ps(zp.add(32 * h + 16)),
            );
            let ml = _mm512_cmp_ps_mask::<_CMP_GE_OQ>(zl, reach_thresholds(o[0], vc0, vc1));
            let mh = _mm512_cmp_ps_mask::<_CMP_GE_OQ>(zh, reach_thresholds(o[1], vc0, vc1));
            mask |= (u128::from(ml) | u128::from(mh) << 16) << (32 * h);
        }
        if mask != 0 {
            store_ordered(&ordered, out);
        }
        mask
    }

    /// The words of 32 consecutive blocks in token order and their [`pairs_max`], as the
    /// gated loop makes them (for the tests).
    ///
    /// # Safety
    /// AVX-512 F must be present.
    #[cfg(test)]
    #[target_feature(enable = "avx512f")]
    pub unsafe fn words_and_top(
        first_block: u32,
        step: u64,
        key: [u32; 2],
    ) -> ([u32; 16], [u32; 128]) {
        let pairs = philox_rounds(first_products::<4>(first_block), &RowKeys::new(step, key));
        let mut out = [0u32; 128];
        store_pairs(&pairs, &mut out);
        // SAFETY: sixteen 32-bit lanes are 64 bytes, as is the array.
        (
            std::mem::transmute::<__m512i, [u32; 16]>(pairs_max(&pairs)),
            out,
        )
    }

    /// The lane-wise (unsigned) max of [`Pairs`]: 32-bit lane `d` is the largest word of
    /// the chunk's tokens whose residues mod 32 are [`word_lane`]`(d)`.
    ///
    /// # Safety
    /// AVX-512 F must be present.
    #[inline]
    #[target_feature(enable = "avx512f")]
    unsafe fn pairs_max(p: &Pairs) -> __m512i {
        let m = |h: usize| _mm512_max_epu32(p[h][0], p[h][1]);
        _mm512_max_epu32(_mm512_max_epu32(m(0), m(1)), _mm512_max_epu32(m(2), m(3)))
    }

    /// The chunk's largest values in the lanes of [`pairs_max`]: lane `d` over the
    /// tokens whose residues mod 32 are [`word_lane`]`(d)`; and whether the chunk may hold
    /// a NaN or an infinity.
    ///
    /// # Safety
    /// AVX-512 F and DQ must be present.
    #[inline]
    #[target_feature(enable = "avx512f,avx512dq")]
    pub unsafe fn lane_max(c: &[f32; 128]) -> (__m512, bool) {
        let (m, sum) = lane_max_sum(c);
        (m, _mm512_fpclass_ps_mask::<0x99>(sum) != 0)
    }

    /// [`lane_max`] with the chunk's sum in lanes for the NaN check: NaN or infinite
    /// when the chunk holds a NaN or an infinity (or when the sum overflows), so several
    /// chunks' sums added make one check.
    ///
    /// # Safety
    /// AVX-512 F must be present.
    #[inline]
    #[target_feature(enable = "avx512f")]
    unsafe fn lane_max_sum(c: &[f32; 128]) -> (__m512, __m512) {
        let p = c.as_ptr();
        // SAFETY: the chunk holds 128 values, eight registers' worth.
        let l = |k: usize| _mm512_loadu_ps(p.add(16 * k));
        let v = [l(0), l(1), l(2), l(3), l(4), l(5), l(6), l(7)];
        // lane l of `even`: the tokens t with t mod 32 = l; of `odd`: t mod 32 = 16 + l
        let even = _mm512_max_ps(_mm512_max_ps(v[0], v[2]), _mm512_max_ps(v[4], v[6]));
        let odd = _mm512_max_ps(_mm512_max_ps(v[1], v[3]), _mm512_max_ps(v[5], v[7]));
        // the two residues of each lane, `even` and `odd` read as one table of 32
        let i1 = _mm512_setr_epi32(1, 0, 5, 4, 9, 8, 13, 12, 17, 16, 21, 20, 25, 24, 29, 28);
        let i2 = _mm512_add_epi32(i1, _mm512_set1_epi32(2));
        let m = _mm512_max_ps(
            _mm512_permutex2var_ps(even, i1, odd),
            _mm512_permutex2var_ps(even, i2, odd),
        );
        // a NaN or an infinity makes the sum NaN or infinite (as may an overflow)
        let sum = _mm512_add_ps(
            _mm512_add_ps(_mm512_add_ps(v[0], v[1]), _mm512_add_ps(v[2], v[3])),
            _mm512_add_ps(_mm512_add_ps(v[4], v[5]), _mm512_add_ps(v[6], v[7])),
        );
        (m, sum)
    }

    /// [`crate::philox::gumbel_reach_threshold`] of sixteen words.
    #[inline]
    #[target_feature(enable = "avx512f")]
    unsafe fn reach_thresholds(w: __m512i, c0: __m512, c1: __m512) -> __m512 {
        let q = _mm512_srli_epi32::<9>(w);
        let d = _mm512_sub_epi32(_mm512_set1_epi32((1 << 24) - 1), _mm512_add_epi32(q, q));
        let chord = _mm512_cvtepi32_ps(_mm512_castps_si512(_mm512_cvtepi32_ps(d)));
        _mm512_add_ps(_mm512_mul_ps(c1, chord), c0)
    }

    /// Whether some lane of a chunk's values' maxima `m` ([`lane_max`]) reaches the
    /// threshold of the same lane of its words' maxima `top` ([`pairs_max`]).
    ///
    /// # Safety
    /// AVX-512 F must be present.
    #[inline]
    #[target_feature(enable = "avx512f")]
    unsafe fn lanes_reach(m: __m512, top: __m512i, c0: f32, c1: f32) -> bool {
        let thr = reach_thresholds(top, _mm512_set1_ps(c0), _mm512_set1_ps(c1));
        _mm512_cmp_ps_mask::<_CMP_GE_OQ>(m, thr) != 0
    }

    /// One chunk of [`gated_chunks`]'s triples once its four chains' words are made:
    /// judged lane by lane against the thresholds of its words' maxima (the leader
    /// read again, a chunk before may have moved it), then token by token from the
    /// registers; visited when a token may reach.
    ///
    /// # Safety
    /// AVX-512 F must be present.
    #[inline(always)]
    #[allow(clippy::too_many_arguments)]
    unsafe fn judge_chunk(
        pairs: &Pairs,
        m: __m512,
        chunk: &[f32],
        c: usize,
        reach: &impl Fn() -> (f32, f32),
        visit: &mut impl FnMut(usize, u128, &[u32; 128]),
        out: &mut [u32; 128],
    ) {
        let (c0, c1) = reach();
        if !lanes_reach(m, pairs_max(pairs), c0, c1) {
            return;
        }
        let mask = pairs_reach(pairs, chunk, out, c0, c1);
        if mask != 0 {
            visit(c, mask, out);
        }
    }

    /// [`super::gated_chunks`] with AVX-512, three chunks at a time: their values'
    /// lane maxima ([`lane_max`]) first, then their words as two groups of six chains
    /// (the first chunk and half of the second, then the rest: six independent chains
    /// keep the multiply pipes busy where four wait on a round's latency), each chunk
    /// judged as soon as its four chains are made ([`judge_chunk`]). When not all three
    /// could be lifted even by the largest words, the ones that could go one at a time
    /// with four chains and the others are skipped before any word is made (a row with
    /// a wide spread of logits makes few words). The last one to five chunks go one at a
    /// time, as with four chains.
    ///
    /// # Safety
    /// AVX-512 F and DQ must be present.
    #[target_feature(enable = "avx512f,avx512dq")]
    pub unsafe fn gated_chunks(
        z: &[f32],
        step: u64,
        key: [u32; 2],
        reach: impl Fn() -> (f32, f32),
        mut visit: impl FnMut(usize, u128, &[u32; 128]),
    ) -> Option<f32> {
        let row = RowKeys::new(step, key);
        let mut rowmax = _mm512_set1_ps(f32::NEG_INFINITY);
        let mut out = [0u32; 128];
        let triples = z.len() / 384;
        for t in 0..triples {
            let at = 384 * t;
            super::prefetch_lines(z, at + super::PREFETCH_AHEAD, 384);
            let chunk = |k: usize| -> &[f32; 128] {
                // (cannot fail: 384 t + 384 <= z.len())
                <&[f32; 128]>::try_from(&z[at + 128 * k..at + 128 * k + 128]).unwrap()
            };
            // SAFETY: AVX-512 F and DQ are present (this function's contract).
            let v = [
                lane_max_sum(chunk(0)),
                lane_max_sum(chunk(1)),
                lane_max_sum(chunk(2)),
            ];
            // one NaN check for the three; a flag may be an overflowing sum of finite
            // values: count to be sure
            let sum = _mm512_add_ps(_mm512_add_ps(v[0].1, v[1].1), v[2].1);
            if _mm512_fpclass_ps_mask::<0x99>(sum) != 0
                && (0..3).any(|k| super::count_nonfinite(chunk(k)) > 0)
            {
                return None;
            }
            rowmax = _mm512_max_ps(rowmax, _mm512_max_ps(_mm512_max_ps(v[0].0, v[1].0), v[2].0));
            let (c0, c1) = reach();
            // the threshold of the largest word there is, the same in every lane
            let top = _mm512_set1_ps(crate::philox::gumbel_reach_threshold(u32::MAX, c0, c1));
            let lifts = |k: usize| _mm512_cmp_ps_mask::<_CMP_GE_OQ>(v[k].0, top) != 0;
            let b = (96 * t) as u32;
            let c = 3 * t;
            if !(lifts(0) && lifts(1) && lifts(2)) {
                // (rows with a wide spread of logits, where most chunks are skipped) the
                // chunks that may lift, one at a time with four chains
                for k in (0..3).filter(|&k| lifts(k)) {
                    let bk = b.wrapping_add(32 * k as u32);
                    let pairs = rounds_of!(4, first_products::<4>(bk), &row);
                    judge_chunk(
                        &pairs,
                        v[k].0,
                        chunk(k),
                        c + k,
                        &reach,
                        &mut visit,
                        &mut out,
                    );
                }
                continue;
            }
            let first = rounds_of!(6, first_products::<6>(b), &row);
            let p0 = [first[0], first[1], first[2], first[3]];
            judge_chunk(&p0, v[0].0, chunk(0), c, &reach, &mut visit, &mut out);
            let second = rounds_of!(6, first_products::<6>(b.wrapping_add(48)), &row);
            let p1 = [first[4], first[5], second[0], second[1]];
            judge_chunk(&p1, v[1].0, chunk(1), c + 1, &reach, &mut visit, &mut out);
            let p2 = [second[2], second[3], second[4], second[5]];
            judge_chunk(&p2, v[2].0, chunk(2), c + 2, &reach, &mut visit, &mut out);
        }
        let done = 3 * triples;
        let bad = super::gated_chunks_with(
            &z[384 * triples..],
            &reach,
            |c, m, w| visit(done + c, m, w),
            |c| {
                // SAFETY: as above.
                let (m, bad) =
                    super::chunk_values(c, |f| unsafe { lane_max(f) }, |m| _mm512_set1_ps(m));
                rowmax = _mm512_max_ps(rowmax, m);
                (m, bad)
            },
            |b, _| {
                let b = b.wrapping_add(32 * done as u32);
                // SAFETY: as above.
                let pairs = unsafe { rounds_of!(4, first_products::<4>(b), &row) };
                // SAFETY: as above.
                (unsafe { pairs_max(&pairs) }, pairs)
            },
            // SAFETY: as above.
            |m, top, c0, c1| unsafe { lanes_reach(m, top, c0, c1) },
            // SAFETY: as above.
            |pairs, chunk, out, c0, c1| unsafe { pairs_reach(&pairs, chunk, out, c0, c1) },
            _mm512_set1_epi32(-1),
        );
        (!bad).then(|| _mm512_reduce_max_ps(rowmax))
    }

    /// The full 16-word blocks of an affine row's dot product (see `body::qdot`): the
    /// 16 words of a block side by side in one register, each code taken out by a shift
    /// and a mask, dequantized (`scale * q + bias`, two roundings) and multiplied into
    /// `xp`. Returns the sum over the first `blocks * 16` words.
    ///
    /// # Safety
    /// AVX-512 F must be present; `row` must hold `blocks * 16` words, `xp` the permuted
    /// inputs of those words, and `scales`/`biases` every group they reach.
    #[target_feature(enable = "avx512f")]
    pub unsafe fn qdot_blocks(
        bits: u32,
        group: usize,
        row: &[u32],
        blocks: usize,
        scales: &[f32],
        biases: &[f32],
        xp: &[f32],
    ) -> f32 {
        let per = (32 / bits) as usize;
        let mask = _mm512_set1_epi32(((1u32 << bits) - 1) as i32);
        let gshift = _mm512_set1_epi32(group.trailing_zeros() as i32);
        let lane_in = _mm512_mullo_epi32(
            _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15),
            _mm512_set1_epi32(per as i32),
        );
        let mut acc = _mm512_setzero_ps();
        assert!(row.len() >= blocks * 16 && xp.len() >= blocks * 16 * per);
        for k in 0..blocks {
            let k0 = k * 16;
            // SAFETY: k0 + 16 <= row.len() (asserted above).
            let w = _mm512_loadu_si512(row.as_ptr().add(k0).cast());
            let g = _mm512_srlv_epi32(
                _mm512_add_epi32(_mm512_set1_epi32((k0 * per) as i32), lane_in),
                gshift,
            );
            // SAFETY: every lane's group lies in the row's groups (the caller's promise).
            let sc = _mm512_i32gather_ps::<4>(g, scales.as_ptr());
            let bi = _mm512_i32gather_ps::<4>(g, biases.as_ptr());
            let xb = xp.as_ptr().add(k0 * per);
            for sh in 0..per {
                let q = _mm512_and_si512(
                    _mm512_srlv_epi32(w, _mm512_set1_epi32((bits as usize * sh) as i32)),
                    mask,
                );
                let wv = _mm512_add_ps(_mm512_mul_ps(sc, _mm512_cvtepi32_ps(q)), bi);
                // SAFETY: k0 * per + sh * 16 + 16 <= xp.len() (asserted above).
                acc = _mm512_fmadd_ps(wv, _mm512_loadu_ps(xb.add(sh * 16)), acc);
            }
        }
        _mm512_reduce_add_ps(acc)
    }

    /// [`super::argmax_nonfinite`] with AVX-512: four chains of 16 lanes, each lane's max
    /// (`vmaxps`) and the block of 64 where it first rose (a compare and a masked move),
    /// NaN or `+inf` found by a compare "not less than `+inf`"; then the lanes holding
    /// the row's max give their lowest index.
    ///
    /// # Safety
    /// AVX-512 F must be present; `z` must hold 64 values or more.
    #[target_feature(enable = "avx512f")]
    pub unsafe fn argmax_nonfinite(z: &[f32]) -> (f32, usize, bool) {
        let p = z.as_ptr();
        let full = z.len() / 64 * 64;
        let inf = _mm512_set1_ps(f32::INFINITY);
        let mut m = [_mm512_set1_ps(f32::NEG_INFINITY); 4];
        let mut at = [_mm512_setzero_si512(); 4];
        let mut bad: __mmask16 = 0;
        let mut block = _mm512_setzero_si512();
        let one = _mm512_set1_epi32(1);
        for i in (0..full).step_by(64) {
            for (k, (mk, ak)) in m.iter_mut().zip(&mut at).enumerate() {
                // SAFETY: i + 64 <= full <= z.len(): the 16 values read are inside z.
                let x = unsafe { _mm512_loadu_ps(p.add(i + 16 * k)) };
                let up = _mm512_cmp_ps_mask::<_CMP_GT_OQ>(x, *mk);
                *mk = _mm512_max_ps(x, *mk);
                *ak = _mm512_mask_mov_epi32(*ak, up, block);
                bad |= _mm512_cmp_ps_mask::<_CMP_NLT_UQ>(x, inf);
            }
            block = _mm512_add_epi32(block, one);
        }
        let top = _mm512_reduce_max_ps(_mm512_max_ps(
            _mm512_max_ps(m[0], m[1]),
            _mm512_max_ps(m[2], m[3]),
        ));
        // index 64 block + 16 k + lane of the lanes that hold `top`, the others past all
        let lane = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
        let mut first = _mm512_set1_epi32(-1);
        for (k, (mk, ak)) in m.iter().zip(&at).enumerate() {
            let holds = _mm512_cmp_ps_mask::<_CMP_EQ_OQ>(*mk, _mm512_set1_ps(top));
            let idx = _mm512_add_epi32(
                _mm512_slli_epi32::<6>(*ak),
                _mm512_add_epi32(lane, _mm512_set1_epi32(16 * k as i32)),
            );
            first = _mm512_mask_min_epu32(first, holds, first, idx);
        }
        let at = _mm512_reduce_min_epu32(first) as usize;
        super::finish_argmax(z, full, (top, at, bad != 0))
    }

    /// [`super::collect_ge_max`] with AVX-512: per 16 values one max and one compare. The
    /// compare is "not less than" (`_CMP_NLT_UQ`), true for NaN as well, so a NaN is
    /// gathered like a hit and found among the gathered tokens afterwards (a row holds
    /// few hits, and a separate NaN compare per 16 values cost a quarter of the pass);
    /// a `+inf` shows in the max. The hit masks go from the mask registers to the stack
    /// and become pushes after each segment (see [`push_masks`]).
    ///
    /// # Safety
    /// AVX-512 F must be present.
    #[target_feature(enable = "avx512f")]
    pub unsafe fn collect_ge_max(
        z: &[f32],
        base: u32,
        thr: f32,
        out: &mut Vec<(u32, f32)>,
    ) -> (f32, bool) {
        let before = out.len();
        let t = _mm512_set1_ps(thr);
        let mut m = [_mm512_set1_ps(f32::NEG_INFINITY); 4];
        let p = z.as_ptr();
        let full = z.len() / 64 * 64;
        let mut masks = [0u64; super::SEGMENT / 64];
        let mut at = 0;
        while at < full {
            let end = (at + super::SEGMENT).min(full);
            for (g, mask) in masks[..(end - at) / 64].iter_mut().enumerate() {
                let i = at + 64 * g;
                super::prefetch_lines(z, i + super::PREFETCH_AHEAD, 64);
                let mut k = [0u16; 4];
                for (j, (mj, kj)) in m.iter_mut().zip(&mut k).enumerate() {
                    // SAFETY: i + 64 <= full <= z.len(): the load of 16 values is inside z.
                    let x = unsafe { _mm512_loadu_ps(p.add(i + 16 * j)) };
                    // NaN lanes keep the old max (the second operand); they are hits
                    *mj = _mm512_max_ps(x, *mj);
                    *kj = _mm512_cmp_ps_mask::<_CMP_NLT_UQ>(x, t);
                }
                *mask = k
                    .iter()
                    .enumerate()
                    .fold(0, |h, (j, &kj)| h | u64::from(kj) << (16 * j));
            }
            push_masks(&masks[..(end - at) / 64], at, base, z, out);
            at = end;
        }
        let vm = _mm512_max_ps(_mm512_max_ps(m[0], m[1]), _mm512_max_ps(m[2], m[3]));
        let mx = _mm512_reduce_max_ps(vm);
        let nan = out[before..].iter().any(|c| c.1.is_nan());
        super::finish_ge_max(z, full, (base, thr), out, (mx, nan))
    }

    /// [`super::exp2_sum_collect`] (`COLLECT`) or [`super::exp2_sum`] (`!COLLECT`).
    ///
    /// # Safety
    /// AVX-512 F/BW/DQ/VL and FMA must be present.
    #[target_feature(enable = "avx512f,avx512bw,avx512dq,avx512vl,avx2,fma")]
    pub unsafe fn exp2_sum_collect<const COLLECT: bool>(
        z: &[f32],
        c1: f32,
        c0: f32,
        base: u32,
        thr: f32,
        out: &mut Vec<(u32, f32)>,
    ) -> f64 {
        // SAFETY: the table holds 32 f32, two loads of 16.
        let (tlo, thi) = unsafe {
            (
                _mm512_loadu_ps(EXP2_TABLE.as_ptr()),
                _mm512_loadu_ps(EXP2_TABLE.as_ptr().add(16)),
            )
        };
        let (vc1, vc0, vthr) = (_mm512_set1_ps(c1), _mm512_set1_ps(c0), _mm512_set1_ps(thr));
        let (a1, a2) = (_mm512_set1_ps(EXP2_C1), _mm512_set1_ps(EXP2_C2));
        let (one, magic) = (_mm512_set1_ps(1.0), _mm512_set1_ps(MAGIC32));
        // 2^w = 2^k 2^r with k = w rounded to a multiple of 1/32 (k = n + j/32) and
        // |r| <= 1/64; `vreduceps` gives r (and 0 for ±inf, so -inf adds 0 and +inf gives
        // +inf), `k + MAGIC32` puts j in the index bits, `vscalefps` multiplies by 2^n.
        let term = |x: __m512| {
            let w = _mm512_fmadd_ps(x, vc1, vc0);
            let r = _mm512_reduce_ps::<{ 5 << 4 }>(w);
            let k = _mm512_sub_ps(w, r);
            let t = _mm512_permutex2var_ps(tlo, _mm512_castps_si512(_mm512_add_ps(k, magic)), thi);
            let p = _mm512_fmadd_ps(_mm512_fmadd_ps(a2, r, a1), r, one);
            (_mm512_scalef_ps(t, k), p)
        };
        let mut total = _mm512_setzero_pd();
        let flush = |total: __m512d, s: __m512| {
            let lo = _mm512_cvtps_pd(_mm512_castps512_ps256(s));
            let hi = _mm512_cvtps_pd(_mm256_castpd_ps(_mm512_extractf64x4_pd::<1>(
                _mm512_castps_pd(s),
            )));
            _mm512_add_pd(total, _mm512_add_pd(lo, hi))
        };
        let n = z.len();
        let p = z.as_ptr();
        let mut i = 0;
        // Groups of 1024 values: four chains of 16 terms per lane, then added in f64. The
        // hit masks (16 bits per vector, stored straight from the mask registers: a move
        // through the general registers would take the vector ports' slots) stay on the
        // stack, four to a block of 64 values (little-endian: the block's mask), and
        // become pushes after the vector loop, the blocks with hits found eight at a time
        // ([`push_masks`]: a branch per block with a hit would be mispredicted at random).
        let mut masks = [0u64; 16];
        while i + 64 <= n {
            let groups = ((n - i) / 64).min(16);
            let mut acc = [_mm512_setzero_ps(); 4];
            for (g, mask) in masks[..groups].iter_mut().enumerate() {
                let at = i + 64 * g;
                super::prefetch_lines(z, at + super::PREFETCH_AHEAD, 64);
                let quarters = (mask as *mut u64).cast::<u16>();
                for (j, a) in acc.iter_mut().enumerate() {
                    // SAFETY: at + 64 <= n: the loads of 16 values are inside z.
                    let x = unsafe { _mm512_loadu_ps(p.add(at + 16 * j)) };
                    if COLLECT {
                        let m = _mm512_cmp_ps_mask::<_CMP_GE_OQ>(x, vthr);
                        // SAFETY: quarter j < 4 of the block's u64, which x86-64
                        // (little-endian) reads as bits 16 j to 16 j + 15.
                        unsafe { quarters.add(j).write(m) };
                    }
                    let (s, q) = term(x);
                    *a = _mm512_fmadd_ps(s, q, *a);
                }
            }
            let s = _mm512_add_ps(_mm512_add_ps(acc[0], acc[1]), _mm512_add_ps(acc[2], acc[3]));
            total = flush(total, s);
            if COLLECT {
                push_masks(&masks[..groups], i, base, z, out);
            }
            i += 64 * groups;
        }
        // The rest, 16 at a time; missing lanes read as -inf and add 0.
        let mut acc = _mm512_setzero_ps();
        while i < n {
            let len = (n - i).min(16);
            let lanes: __mmask16 = if len == 16 { 0xffff } else { (1u16 << len) - 1 };
            // SAFETY: the masked load reads only lanes i .. i + len, inside z.
            let x =
                unsafe { _mm512_mask_loadu_ps(_mm512_set1_ps(f32::NEG_INFINITY), lanes, p.add(i)) };
            if COLLECT {
                let hits = _mm512_mask_cmp_ps_mask::<_CMP_GE_OQ>(lanes, x, vthr);
                push_hits(u64::from(hits), i, base, z, out);
            }
            let (s, q) = term(x);
            acc = _mm512_fmadd_ps(s, q, acc);
            i += len;
        }
        total = flush(total, acc);
        _mm512_reduce_add_pd(total)
    }
}

/// Explicit AVX2 versions of the searches whose early exits defeat auto-vectorisation
/// (a compare per value and a branch per block, with a bit mask of the hits).
#[cfg(target_arch = "x86_64")]
mod simd {
    use super::{
        consecutive_products, m0_times, push_hits, RowKeys, EXP2_Q8, EXP2_Q8_COARSE, EXP2_TABLE,
    };
    use std::arch::x86_64::*;

    /// [`super::simd512::philox_x32`] with AVX2: eight chains of 4 blocks, made three,
    /// three and two at a time ([`three_chains`], [`two_chains`]).
    ///
    /// # Safety
    /// AVX2 must be present.
    #[target_feature(enable = "avx2")]
    pub unsafe fn philox_x32(first_block: u32, step: u64, key: [u32; 2], out: &mut [u32; 128]) {
        philox_top(first_block, &row_keys(step, key), out);
    }

    /// What the AVX2 Philox needs of a row, made once: each round's key pair broadcast to
    /// every 64-bit lane (the assembly reads them from memory) and the row's constants of
    /// rounds 1-3 ([`RowKeys`]).
    pub struct Row {
        keys: [[__m256i; 2]; 10],
        /// The row's XORs of rounds 2-3 ([`RowKeys`]) broadcast, in the order the assembly
        /// reads them: round 2's into words 0 and 2, round 3's into word 2.
        first: [__m256i; 3],
    }

    /// The [`Row`] of sampling-stream counters at `step` under `key`.
    ///
    /// # Safety
    /// AVX2 must be present.
    #[inline]
    #[target_feature(enable = "avx2")]
    pub unsafe fn row_keys(step: u64, key: [u32; 2]) -> Row {
        let consts = RowKeys::new(step, key);
        let keys = consts.keys.map(|[k0, k1]| {
            [
                _mm256_set1_epi64x(i64::from(k0)),
                _mm256_set1_epi64x(i64::from(k1)),
            ]
        });
        let first =
            [consts.r2_w0, consts.r2_w2, consts.r3_w2].map(|x| _mm256_set1_epi64x(i64::from(x)));
        Row { keys, first }
    }

    /// [`philox_x32`] with the row's constants made beforehand ([`row_keys`]); returns the
    /// words' lane-wise max: lane `l < 4` over the tokens `16 c + l` and `16 c + l + 4`, lane
    /// `l >= 4` over `16 c + l + 4` and `16 c + l + 8`, of every chain `c`.
    ///
    /// # Safety
    /// AVX2 must be present.
    #[inline]
    #[target_feature(enable = "avx2")]
    pub unsafe fn philox_top(first_block: u32, row: &Row, out: &mut [u32; 128]) -> __m256i {
        philox_top_inlined(first_block, row, out)
    }

    /// [`philox_top`] inlined into its caller, which must enable AVX2: intrinsics only,
    /// without target features or closures, so that the gated loop keeps the chunk in
    /// registers (a call would send the products and the loop's registers through
    /// memory).
    ///
    /// # Safety
    /// AVX2 must be present.
    #[inline(always)]
    unsafe fn philox_top_inlined(first_block: u32, row: &Row, out: &mut [u32; 128]) -> __m256i {
        // round 1's products `M0 * block` ([`consecutive_products`])
        let mut p0 = [_mm256_setzero_si256(); 8];
        if let Some(first) = consecutive_products(first_block, 32) {
            let base = _mm256_set1_epi64x(first as i64);
            for (c, p) in p0.iter_mut().enumerate() {
                let b = 4 * c as u64;
                let offs = _mm256_setr_epi64x(
                    m0_times(b),
                    m0_times(b + 1),
                    m0_times(b + 2),
                    m0_times(b + 3),
                );
                *p = _mm256_add_epi64(base, offs);
            }
        } else {
            let m0v = _mm256_set1_epi64x(i64::from(crate::philox::PHILOX_M0));
            for (c, p) in p0.iter_mut().enumerate() {
                let b = i64::from(first_block.wrapping_add(4 * c as u32));
                let blocks =
                    _mm256_add_epi64(_mm256_set1_epi64x(b), _mm256_setr_epi64x(0, 1, 2, 3));
                *p = _mm256_mul_epu32(blocks, m0v);
            }
        }
        philox_lanes(&p0, row, out)
    }

    /// [`super::philox_listed`] with AVX2: the blocks in eight chains of 4 as in
    /// [`philox_x32`].
    ///
    /// # Safety
    /// AVX2 must be present.
    #[target_feature(enable = "avx2")]
    pub unsafe fn philox_listed(
        blocks: &[u32; 32],
        step: u64,
        key: [u32; 2],
        out: &mut [u32; 128],
    ) {
        let p = blocks.as_ptr().cast::<__m128i>();
        let m0 = _mm256_set1_epi64x(i64::from(crate::philox::PHILOX_M0));
        // SAFETY: chain c reads blocks 4 c .. 4 c + 4 of the 32.
        let p0 = std::array::from_fn(|c| unsafe {
            _mm256_mul_epu32(_mm256_cvtepu32_epi64(_mm_loadu_si128(p.add(c))), m0)
        });
        philox_lanes(&p0, &row_keys(step, key), out);
    }

    /// The eight chains whose round-1 products `M0 * block` (one block per 64-bit lane)
    /// are `p0`, made three, three and two at a time; their words go into `out` (chain
    /// `c`'s blocks at `16 c ..`) and their lane-wise max is returned.
    ///
    /// # Safety
    /// AVX2 must be present.
    #[inline(always)]
    unsafe fn philox_lanes(p0: &[__m256i; 8], row: &Row, out: &mut [u32; 128]) -> __m256i {
        let mut top = three_chains(0, p0, row, out);
        top = _mm256_max_epu32(top, three_chains(3, p0, row, out));
        _mm256_max_epu32(top, two_chains(6, p0, row, out))
    }

    /// The chunk's largest values in lanes that cover those of [`philox_top`]: lane `l`
    /// over the tokens `l`, `l + 4` (mod 8) of the chunk, which hold every token of the
    /// words' lane `l` and of lane `l ^ 4`; and whether the chunk may hold a NaN or an
    /// infinity.
    ///
    /// # Safety
    /// AVX2 must be present.
    #[inline]
    #[target_feature(enable = "avx2")]
    pub unsafe fn lane_max(c: &[f32; 128]) -> (__m256, bool) {
        let p = c.as_ptr();
        // SAFETY: the chunk holds 128 values, sixteen registers' worth.
        let l = |k: usize| _mm256_loadu_ps(p.add(8 * k));
        let (mut m, mut s) = (l(0), l(0));
        let (mut m1, mut s1) = (l(1), l(1));
        for k in (2..16).step_by(2) {
            let (a, b) = (l(k), l(k + 1));
            m = _mm256_max_ps(m, a);
            m1 = _mm256_max_ps(m1, b);
            s = _mm256_add_ps(s, a);
            s1 = _mm256_add_ps(s1, b);
        }
        // lane l: tokens l (mod 8); then with the other half, l and l + 4
        let m = _mm256_max_ps(m, m1);
        let m = _mm256_max_ps(m, _mm256_permute2f128_ps::<0x01>(m, m));
        // a NaN or an infinity makes the sum NaN or infinite (as may an overflow): its
        // lanes minus themselves are then NaN, which a self-compare finds
        let s = _mm256_add_ps(s, s1);
        let d = _mm256_sub_ps(s, s);
        let bad = _mm256_movemask_ps(_mm256_cmp_ps::<_CMP_UNORD_Q>(d, d)) != 0;
        (m, bad)
    }

    /// [`crate::philox::gumbel_reach_threshold`] of eight words.
    #[inline(always)]
    unsafe fn reach_thresholds(w: __m256i, c0: __m256, c1: __m256) -> __m256 {
        let q = _mm256_srli_epi32::<9>(w);
        let d = _mm256_sub_epi32(_mm256_set1_epi32((1 << 24) - 1), _mm256_add_epi32(q, q));
        let chord = _mm256_cvtepi32_ps(_mm256_castps_si256(_mm256_cvtepi32_ps(d)));
        _mm256_add_ps(_mm256_mul_ps(c1, chord), c0)
    }

    /// [`super::gated_chunks`] with AVX2: each chunk judged lane by lane, its values'
    /// maxima ([`lane_max`]) against the thresholds of its words' ([`philox_top`]).
    ///
    /// # Safety
    /// AVX2 and FMA must be present.
    #[target_feature(enable = "avx2,fma")]
    pub unsafe fn gated_chunks(
        z: &[f32],
        step: u64,
        key: [u32; 2],
        reach: impl Fn() -> (f32, f32),
        visit: impl FnMut(usize, u128, &[u32; 128]),
    ) -> Option<f32> {
        let row = row_keys(step, key);
        let mut rowmax = _mm256_set1_ps(f32::NEG_INFINITY);
        let bad = super::gated_chunks_with(
            z,
            reach,
            visit,
            |c| {
                // SAFETY: AVX2 is present (this function's contract).
                let (m, bad) =
                    super::chunk_values(c, |f| unsafe { lane_max(f) }, |m| _mm256_set1_ps(m));
                rowmax = _mm256_max_ps(rowmax, m);
                (m, bad)
            },
            // SAFETY: as above.
            |b, out| (unsafe { philox_top_inlined(b, &row, out) }, ()),
            |m, top, c0, c1| {
                let thr = reach_thresholds(top, _mm256_set1_ps(c0), _mm256_set1_ps(c1));
                _mm256_movemask_ps(_mm256_cmp_ps::<_CMP_GE_OQ>(m, thr)) != 0
            },
            |(), chunk, out, c0, c1| super::gumbel_reach(chunk, out, c0, c1),
            _mm256_set1_epi32(-1),
        );
        (!bad).then(|| hmax(rowmax))
    }

    /// The largest lane of `m` (NaN lanes passed over where `max` passes them).
    #[inline]
    #[target_feature(enable = "avx2")]
    fn hmax(m: __m256) -> f32 {
        let m = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps::<1>(m));
        let m = _mm_max_ps(m, _mm_movehl_ps(m, m));
        _mm_cvtss_f32(_mm_max_ss(m, _mm_movehdup_ps(m)))
    }

    /// Chain `c`'s words after the last round into `out` in block order; returns their
    /// lane-wise (unsigned) max.
    ///
    /// # Safety
    /// AVX2 must be present; `c < 8`.
    #[inline(always)]
    unsafe fn chain_finish(x: [__m256i; 4], c: usize, out: &mut [u32; 128]) -> __m256i {
        // lane j of x01: words 0 and 1 of block j side by side; of x23: words 2 and 3
        let x01 = _mm256_blend_epi32::<0xAA>(x[0], _mm256_slli_epi64::<32>(x[1]));
        let x23 = _mm256_blend_epi32::<0xAA>(x[2], _mm256_slli_epi64::<32>(x[3]));
        let lo = _mm256_unpacklo_epi64(x01, x23); // blocks 0 | 2
        let hi = _mm256_unpackhi_epi64(x01, x23); // blocks 1 | 3
        let p = out.as_mut_ptr().add(16 * c).cast::<__m128i>();
        // SAFETY: chain `c` < 8 writes words 16 c .. 16 c + 16 of the 128, a block (four
        // words) per store.
        _mm_storeu_si128(p, _mm256_castsi256_si128(lo));
        _mm_storeu_si128(p.add(1), _mm256_castsi256_si128(hi));
        _mm_storeu_si128(p.add(2), _mm256_extracti128_si256::<1>(lo));
        _mm_storeu_si128(p.add(3), _mm256_extracti128_si256::<1>(hi));
        _mm256_max_epu32(lo, hi)
    }

    // One Philox round of one chain in assembly (see [`three_chains`]): its words in
    // registers `ymm{a}`-`ymm{d}`, its keys at byte offset `k` of `{k}`.
    #[rustfmt::skip]
    macro_rules! round {
        ($a:literal, $b:literal, $c:literal, $d:literal, $k:literal) => {
            concat!(
                "vpmuludq ymm", $a, ", ymm", $a, ", ymm12\n",
                "vpmuludq ymm", $c, ", ymm", $c, ", ymm13\n",
                "vpxor ymm", $b, ", ymm", $b, ", ymmword ptr [{k} + ", $k, "]\n",
                "vpxor ymm", $d, ", ymm", $d, ", ymmword ptr [{k} + ", $k, " + 32]\n",
                "vpsrlq ymm14, ymm", $c, ", 32\n",
                "vpsrlq ymm15, ymm", $a, ", 32\n",
                "vpxor ymm", $b, ", ymm", $b, ", ymm14\n",
                "vpxor ymm", $d, ", ymm", $d, ", ymm15\n",
            )
        };
    }

    // Rounds 1-3 of one chain in assembly, from round 1's products `M0 * block` in
    // `ymm{a}`, with the round keys at `{k}` and the row's constants at `{c}` ([`Row`]'s
    // `first`: only what differs between blocks is computed, the same steps as
    // `simd512::philox_rounds`). Words 0-3 end in registers `(b, c, d, a)`.
    #[rustfmt::skip]
    macro_rules! first_round {
        ($a:literal, $b:literal, $c:literal, $d:literal) => {
            concat!(
                // round 1: word 2 is hi(M0 block) ^ k1 (word 3 was 0), word 3 the product
                // (in a); words 0 and 1 are the row's
                "vpsrlq ymm", $c, ", ymm", $a, ", 32\n",
                "vpxor ymm", $c, ", ymm", $c, ", ymmword ptr [{k} + 32]\n",
            )
        };
    }
    #[rustfmt::skip]
    macro_rules! second_round {
        ($a:literal, $b:literal, $c:literal, $d:literal) => {
            concat!(
                // round 2: word 0's product is the row's; word 1 (in b) = lo(M1 w2), word 0
                // (in d) = hi(M1 w2) ^ const, word 2 (in c) = old word 3 ^ const
                "vpmuludq ymm", $b, ", ymm", $c, ", ymm13\n",
                "vpsrlq ymm", $d, ", ymm", $b, ", 32\n",
                "vpxor ymm", $d, ", ymm", $d, ", ymmword ptr [{c}]\n",
                "vpxor ymm", $c, ", ymm", $a, ", ymmword ptr [{c} + 32]\n",
            )
        };
    }
    #[rustfmt::skip]
    macro_rules! third_round {
        ($a:literal, $b:literal, $c:literal, $d:literal) => {
            concat!(
                // round 3: word 3 was the row's, folded into the XOR of word 2; words end
                // in (b, c, d, a)
                "vpmuludq ymm", $a, ", ymm", $d, ", ymm12\n",
                "vpmuludq ymm", $c, ", ymm", $c, ", ymm13\n",
                "vpsrlq ymm14, ymm", $c, ", 32\n",
                "vpxor ymm", $b, ", ymm", $b, ", ymm14\n",
                "vpxor ymm", $b, ", ymm", $b, ", ymmword ptr [{k} + 128]\n",
                "vpsrlq ymm", $d, ", ymm", $a, ", 32\n",
                "vpxor ymm", $d, ", ymm", $d, ", ymmword ptr [{c} + 64]\n",
            )
        };
    }

    // The ten rounds, in assembly, of the chains whose round-1 products are in the first
    // register of each chain given (`"ymm0" => r0, ...`, the variables updated in place;
    // each chain's four registers `(a b c d)` listed after them), the chains interleaved
    // round by round: rounds 1-3 from the row's constants, then the general rounds, a
    // chain's registers turning by one a round, the keys of round r (from 0) at byte
    // offset 64 r. Words 0-3 end in `(a, b, c, d)`.
    #[rustfmt::skip]
    macro_rules! philox_rounds {
        (
            $keys:expr, $first:expr;
            $($reg:tt => $var:ident),*;
            $(($a:literal $b:literal $c:literal $d:literal)),*
        ) => {
            std::arch::asm!(
                concat!(
                    $(first_round!($a, $b, $c, $d),)*
                    $(second_round!($a, $b, $c, $d),)*
                    $(third_round!($a, $b, $c, $d),)*
                    $(round!($b, $c, $d, $a, 192),)*
                    $(round!($c, $d, $a, $b, 256),)*
                    $(round!($d, $a, $b, $c, 320),)*
                    $(round!($a, $b, $c, $d, 384),)*
                    $(round!($b, $c, $d, $a, 448),)*
                    $(round!($c, $d, $a, $b, 512),)*
                    $(round!($d, $a, $b, $c, 576),)*
                ),
                k = in(reg) $keys.as_ptr(),
                c = in(reg) $first.as_ptr(),
                $(inout($reg) $var,)*
                in("ymm12") _mm256_set1_epi64x(i64::from(crate::philox::PHILOX_M0)),
                in("ymm13") _mm256_set1_epi64x(i64::from(crate::philox::PHILOX_M1)),
                out("ymm14") _,
                out("ymm15") _,
                options(pure, readonly, nostack, preserves_flags),
            )
        };
    }

    /// Chains `first .. first + 3` (4 blocks each) of [`philox_x32`] from their round-1
    /// products `p0`, the ten rounds written out in assembly: the twelve words in
    /// registers `ymm0`-`ymm11`, the multipliers in `ymm12` and `ymm13`, two temporaries,
    /// and each round's keys (and the row's constants of rounds 1-3) read from the row's
    /// by the `vpxor` that uses them. The compiler's own allocation of three chains
    /// keeps the keys in registers and spills words to the stack instead (slower than two
    /// chains); with nothing spilled, three chains in flight cover the
    /// multiply-shift-xor latency that two leave exposed. Their words go into `out`; returns
    /// their lane-wise (unsigned) max.
    ///
    /// A round of chain `(a, b, c, d)` (the registers of words 0-3) leaves its words in
    /// `(b, c, d, a)`: `a = lo(M0 a)`, `c = lo(M1 c)` (the multiplies read the low halves
    /// only, so the high halves' leftovers do not matter), `b ^= k0 ^ hi(M1 c)`, `d ^= k1
    /// ^ hi(M0 a)`. Rounds 1-3 (from the row's constants) leave the words in `(b, c, d, a)`
    /// and the seven general rounds turn them on to `(a, b, c, d)`.
    ///
    /// # Safety
    /// AVX2 must be present; `first + 3 <= 8`.
    #[inline]
    #[target_feature(enable = "avx2")]
    unsafe fn three_chains(
        first: usize,
        p0: &[__m256i; 8],
        row: &Row,
        out: &mut [u32; 128],
    ) -> __m256i {
        let z = _mm256_setzero_si256();
        let (mut r0, mut r4, mut r8) = (p0[first], p0[first + 1], p0[first + 2]);
        let (mut r1, mut r2, mut r3, mut r5, mut r6, mut r7, mut r9, mut r10, mut r11) =
            (z, z, z, z, z, z, z, z, z);
        // SAFETY: registers only, and reads of the 640 bytes of the row's keys and the 96
        // of its constants; AVX2 is present (this function's contract).
        philox_rounds!(
            row.keys, row.first;
            "ymm0" => r0, "ymm1" => r1, "ymm2" => r2, "ymm3" => r3,
            "ymm4" => r4, "ymm5" => r5, "ymm6" => r6, "ymm7" => r7,
            "ymm8" => r8, "ymm9" => r9, "ymm10" => r10, "ymm11" => r11;
            (0 1 2 3), (4 5 6 7), (8 9 10 11)
        );
        let mut top = chain_finish([r0, r1, r2, r3], first, out);
        top = _mm256_max_epu32(top, chain_finish([r4, r5, r6, r7], first + 1, out));
        _mm256_max_epu32(top, chain_finish([r8, r9, r10, r11], first + 2, out))
    }

    /// [`three_chains`] for two chains, `first .. first + 2` (registers `ymm0`-`ymm7`).
    ///
    /// # Safety
    /// AVX2 must be present; `first + 2 <= 8`.
    #[inline]
    #[target_feature(enable = "avx2")]
    unsafe fn two_chains(
        first: usize,
        p0: &[__m256i; 8],
        row: &Row,
        out: &mut [u32; 128],
    ) -> __m256i {
        let z = _mm256_setzero_si256();
        let (mut r0, mut r4) = (p0[first], p0[first + 1]);
        let (mut r1, mut r2, mut r3, mut r5, mut r6, mut r7) = (z, z, z, z, z, z);
        // SAFETY: as in `three_chains`.
        philox_rounds!(
            row.keys, row.first;
            "ymm0" => r0, "ymm1" => r1, "ymm2" => r2, "ymm3" => r3,
            "ymm4" => r4, "ymm5" => r5, "ymm6" => r6, "ymm7" => r7;
            (0 1 2 3), (4 5 6 7)
        );
        let top = chain_finish([r0, r1, r2, r3], first, out);
        _mm256_max_epu32(top, chain_finish([r4, r5, r6, r7], first + 1, out))
    }

    /// [`super::exp2_sum_collect`] (`COLLECT`) or [`super::exp2_sum`] (`!COLLECT`) with
    /// AVX2. In units of 1/8, `v = 8 w` is raised to at least `-1008` as in
    /// [`super::exp2_est`] (`-inf` adds `2^-126`) and rounded to an integer `k = 8 n + j`;
    /// then `2^w = 2^n 2^(j/8) 2^(r/8)` with `r = v - k`: `2^(j/8)` from an eight-entry
    /// table in one register (`vpermd`), `2^n` added to its exponent bits by adding `k <<
    /// 20` (each entry is stored less `j << 20`, the part of that shift that lands in its
    /// mantissa), and `2^(r/8) = 1 + r q(r)` with `q` of degree 2 (relative error below
    /// 2.5e-7 in all). Groups of 512 values: two chains of f32 partial sums (32 terms per
    /// lane at most), added in f64.
    ///
    /// No upper clamp and no check per term: each block keeps the max of its raw values
    /// (`max(x, top)` passes NaN over; one operation per vector, beside the terms' chain
    /// rather than on it), and the overflow is decided once from the max of the blocks:
    /// `+inf` joins the sum when `v` of that max reaches 1024 (`v` is monotone in `x`, so
    /// below that no `k` passes 1024, the last before a term's exponent bits wrap). A NaN
    /// or `+inf` value makes its own term NaN (`r = v - k` is NaN), so the sum is NaN.
    ///
    /// The hits: a block of 64 values is looked at again, with exact compares, only when
    /// its max reaches `thr` (no value `>= thr` can be missed: the max is of the values
    /// themselves, NaN, which never is, left out), and its hits are pushed after the
    /// group's vector loop (a call inside the loop would force the accumulators out to
    /// memory), the flagged blocks taken from a bit mask.
    ///
    /// # Safety
    /// AVX2 and FMA must be present.
    ///
    /// `COARSE`: `q` of degree 1 ([`EXP2_Q8_COARSE`], relative error below 3.5e-6).
    #[target_feature(enable = "avx2,fma")]
    pub unsafe fn exp2_sum_collect<const COLLECT: bool, const COARSE: bool>(
        z: &[f32],
        c1: f32,
        c0: f32,
        base: u32,
        thr: f32,
        out: &mut Vec<(u32, f32)>,
    ) -> f64 {
        // k << 20 = n << 23 + j << 20 (mod 2^32)
        let entry = |j: usize| (EXP2_TABLE[4 * j].to_bits() as i32).wrapping_sub((j as i32) << 20);
        let table = _mm256_setr_epi32(
            entry(0),
            entry(1),
            entry(2),
            entry(3),
            entry(4),
            entry(5),
            entry(6),
            entry(7),
        );
        let (vc1, vc0) = (_mm256_set1_ps(8.0 * c1), _mm256_set1_ps(8.0 * c0));
        let lo = _mm256_set1_ps(-1008.0);
        // q(r) = (2^(r/8) - 1) / r
        let [q2, q1, q0] =
            [EXP2_Q8[0] / 512.0, EXP2_Q8[1] / 64.0, EXP2_Q8[2] / 8.0].map(|c| _mm256_set1_ps(c));
        let [c1q, c0q] =
            [EXP2_Q8_COARSE[0] / 64.0, EXP2_Q8_COARSE[1] / 8.0].map(|c| _mm256_set1_ps(c));
        let one = _mm256_set1_ps(1.0);
        // (r, k)
        let index = |x: __m256, top: &mut __m256| {
            *top = _mm256_max_ps(x, *top);
            let v = _mm256_fmadd_ps(x, vc1, vc0);
            // max returns its second operand when one is NaN: NaN stays
            let v = _mm256_max_ps(lo, v);
            let k = _mm256_round_ps::<{ _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC }>(v);
            (_mm256_sub_ps(v, k), _mm256_cvtps_epi32(k))
        };
        // a >= b in some lane
        let any_ge =
            |a: __m256, b: __m256| _mm256_movemask_ps(_mm256_cmp_ps::<_CMP_GE_OQ>(a, b)) != 0;
        let term = |(r, bits): (__m256, __m256i), acc: __m256| {
            let s = _mm256_add_epi32(
                _mm256_permutevar8x32_epi32(table, bits),
                _mm256_slli_epi32::<20>(bits),
            );
            let q = if COARSE {
                _mm256_fmadd_ps(c1q, r, c0q)
            } else {
                _mm256_fmadd_ps(_mm256_fmadd_ps(q2, r, q1), r, q0)
            };
            let p = _mm256_fmadd_ps(q, r, one);
            _mm256_fmadd_ps(_mm256_castsi256_ps(s), p, acc)
        };
        let vthr = _mm256_set1_ps(thr);
        let limit = _mm256_set1_ps(1024.0);
        let mut over = _mm256_set1_ps(f32::NEG_INFINITY);
        // a group's f32 sums join the f64 lanes of `total` (no reduction across lanes until
        // the end: it would put a chain of scalar additions after every group)
        let flush = |total: [__m256d; 2], a: [__m256; 2]| {
            let s = _mm256_add_ps(a[0], a[1]);
            [
                _mm256_add_pd(total[0], _mm256_cvtps_pd(_mm256_castps256_ps128(s))),
                _mm256_add_pd(total[1], _mm256_cvtps_pd(_mm256_extractf128_ps::<1>(s))),
            ]
        };
        let n = z.len();
        let p = z.as_ptr();
        let mut total = [_mm256_setzero_pd(); 2];
        let mut i = 0;
        while i + 64 <= n {
            let blocks = ((n - i) / 64).min(8);
            let (mut a0, mut a1) = (_mm256_setzero_ps(), _mm256_setzero_ps());
            // bit b: block b may hold a hit
            let mut flagged = 0u32;
            for b in 0..blocks {
                let at = i + 64 * b;
                super::prefetch_lines(z, at + super::PREFETCH_AHEAD, 64);
                let mut top = _mm256_set1_ps(f32::NEG_INFINITY);
                for s in 0..4 {
                    // SAFETY: at + 64 <= n: the loads of 8 values are inside z.
                    let (i0, i1) = (
                        index(_mm256_loadu_ps(p.add(at + 16 * s)), &mut top),
                        index(_mm256_loadu_ps(p.add(at + 16 * s + 8)), &mut top),
                    );
                    a0 = term(i0, a0);
                    a1 = term(i1, a1);
                }
                over = _mm256_max_ps(top, over);
                if COLLECT {
                    flagged |= u32::from(any_ge(top, vthr)) << b;
                }
            }
            total = flush(total, [a0, a1]);
            while COLLECT && flagged != 0 {
                let at = i + 64 * flagged.trailing_zeros() as usize;
                flagged &= flagged - 1;
                // SAFETY: at + 64 <= n.
                let hits = mask64::<_CMP_GE_OQ>(p.add(at), vthr);
                push_hits(hits, at, base, z, out);
            }
            i += 64 * blocks;
        }
        // the rest, 8 at a time; missing lanes read as -inf (each adds 2^-126, as -inf does)
        let mut acc = [_mm256_setzero_ps(); 2];
        while i < n {
            let len = (n - i).min(8);
            let mut v = [f32::NEG_INFINITY; 8];
            v[..len].copy_from_slice(&z[i..i + len]);
            let x = _mm256_loadu_ps(v.as_ptr());
            if COLLECT {
                let ge = _mm256_cmp_ps::<_CMP_GE_OQ>(x, vthr);
                // the padding lanes are not hits, even against a threshold of -inf
                let lanes = (1u64 << len) - 1;
                push_hits(
                    u64::from(_mm256_movemask_ps(ge) as u8) & lanes,
                    i,
                    base,
                    z,
                    out,
                );
            }
            let ix = index(x, &mut over);
            acc[0] = term(ix, acc[0]);
            i += len;
        }
        let [d0, d1] = flush(total, acc);
        let d = _mm256_add_pd(d0, d1);
        let total = super::sse2::sum_pd(_mm_add_pd(
            _mm256_castpd256_pd128(d),
            _mm256_extractf128_pd::<1>(d),
        ));
        if any_ge(_mm256_fmadd_ps(over, vc1, vc0), limit) {
            // NaN + inf stays NaN
            total + f64::INFINITY
        } else {
            total
        }
    }

    /// [`super::argmax_nonfinite`] with AVX2: four chains of 8 lanes, each lane's max
    /// (`vmaxps`) and the block of 32 where it first rose (a compare and a blend), NaN or
    /// `+inf` found by a compare "not less than `+inf`"; then the lanes holding the
    /// row's max give their lowest index.
    ///
    /// # Safety
    /// AVX2 must be present; `z` must hold 32 values or more.
    #[target_feature(enable = "avx2")]
    pub unsafe fn argmax_nonfinite(z: &[f32]) -> (f32, usize, bool) {
        let p = z.as_ptr();
        let full = z.len() / 32 * 32;
        let inf = _mm256_set1_ps(f32::INFINITY);
        let mut m = [_mm256_set1_ps(f32::NEG_INFINITY); 4];
        let mut at = [_mm256_setzero_ps(); 4];
        let mut bad = _mm256_setzero_ps();
        let mut block = _mm256_setzero_si256();
        let one = _mm256_set1_epi32(1);
        for i in (0..full).step_by(32) {
            let b = _mm256_castsi256_ps(block);
            for (k, (mk, ak)) in m.iter_mut().zip(&mut at).enumerate() {
                // SAFETY: i + 32 <= full <= z.len(): the 8 values read are inside z.
                let x = unsafe { _mm256_loadu_ps(p.add(i + 8 * k)) };
                let up = _mm256_cmp_ps::<_CMP_GT_OQ>(x, *mk);
                *mk = _mm256_max_ps(x, *mk);
                // the block numbers ride in float registers as bit patterns
                *ak = _mm256_blendv_ps(*ak, b, up);
                bad = _mm256_or_ps(bad, _mm256_cmp_ps::<_CMP_NLT_UQ>(x, inf));
            }
            block = _mm256_add_epi32(block, one);
        }
        let top = hmax(_mm256_max_ps(
            _mm256_max_ps(m[0], m[1]),
            _mm256_max_ps(m[2], m[3]),
        ));
        let lane = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
        let mut first = _mm256_set1_epi32(-1);
        for (k, (mk, ak)) in m.iter().zip(&at).enumerate() {
            let holds = _mm256_castps_si256(_mm256_cmp_ps::<_CMP_EQ_OQ>(*mk, _mm256_set1_ps(top)));
            let idx = _mm256_add_epi32(
                _mm256_slli_epi32::<5>(_mm256_castps_si256(*ak)),
                _mm256_add_epi32(lane, _mm256_set1_epi32(8 * k as i32)),
            );
            // the lanes that do not hold `top` give an index past all
            let idx = _mm256_or_si256(idx, _mm256_andnot_si256(holds, _mm256_set1_epi32(-1)));
            first = _mm256_min_epu32(first, idx);
        }
        let mut lanes = [0u32; 8];
        // SAFETY: eight u32 are 32 bytes, one register.
        unsafe { _mm256_storeu_si256(lanes.as_mut_ptr().cast(), first) };
        let at = lanes.iter().copied().min().unwrap_or(u32::MAX) as usize;
        super::finish_argmax(z, full, (top, at, _mm256_movemask_ps(bad) != 0))
    }

    /// [`super::collect_ge_max`] with AVX2: one pass (the max in four chains, a block of
    /// 64 values skipped with one mask when none reaches `thr`). The compare is "not less
    /// than", which is also true for NaN: a NaN is gathered as a hit and found among the
    /// few hits afterwards, instead of by a second compare per value.
    ///
    /// # Safety
    /// AVX2 must be present.
    #[target_feature(enable = "avx2,fma")]
    pub unsafe fn collect_ge_max(
        z: &[f32],
        base: u32,
        thr: f32,
        out: &mut Vec<(u32, f32)>,
    ) -> (f32, bool) {
        let before = out.len();
        let t = _mm256_set1_ps(thr);
        let lowest = _mm256_set1_ps(f32::NEG_INFINITY);
        let mut vm = lowest;
        let p = z.as_ptr();
        let fresh = [lowest; 4];
        let end = super::staged_hits(
            z,
            base,
            out,
            fresh,
            |m, at| {
                // SAFETY: `staged_hits` passes blocks with at + 64 <= z.len(): the 8 loads
                // of 8 values are inside z.
                let mut c = [_mm256_setzero_ps(); 4];
                for k in 0..8 {
                    let x = unsafe { _mm256_loadu_ps(p.add(at + 8 * k)) };
                    // NaN lanes keep the old max (the second operand); they are hits
                    m[k % 4] = _mm256_max_ps(x, m[k % 4]);
                    c[k % 4] = _mm256_or_ps(c[k % 4], _mm256_cmp_ps::<_CMP_NLT_UQ>(x, t));
                }
                let any = _mm256_or_ps(_mm256_or_ps(c[0], c[1]), _mm256_or_ps(c[2], c[3]));
                if _mm256_movemask_ps(any) == 0 {
                    return 0;
                }
                // SAFETY: as above.
                unsafe { hit_mask(p.add(at), t) }
            },
            |m| {
                let m = _mm256_max_ps(_mm256_max_ps(m[0], m[1]), _mm256_max_ps(m[2], m[3]));
                vm = _mm256_max_ps(m, vm);
            },
        );
        let mx = hmax(vm);
        let nan = out[before..].iter().any(|c| c.1.is_nan());
        super::finish_ge_max(z, end, (base, thr), out, (mx, nan))
    }

    /// [`super::gumbel_reach`] of a full chunk: the chord of each word made in the lanes
    /// (shift, subtract, two conversions), the threshold by a product and a sum as the
    /// scalar test rounds them.
    ///
    /// # Safety
    /// AVX2 must be present.
    #[target_feature(enable = "avx2")]
    pub unsafe fn gumbel_reach(z: &[f32; 128], words: &[u32; 128], c0: f32, c1: f32) -> u128 {
        let (vc0, vc1) = (_mm256_set1_ps(c0), _mm256_set1_ps(c1));
        let (zp, wp) = (z.as_ptr(), words.as_ptr().cast::<__m256i>());
        let mut half = [0u64; 2];
        for (h, m) in half.iter_mut().enumerate() {
            for k in 0..8 {
                let at = 8 * h + k;
                // SAFETY: `at` < 16: the 8 words and 8 values read are inside the chunk.
                let (w, zz) = unsafe {
                    (
                        _mm256_loadu_si256(wp.add(at)),
                        _mm256_loadu_ps(zp.add(8 * at)),
                    )
                };
                let thr = reach_thresholds(w, vc0, vc1);
                let keep = _mm256_cmp_ps::<_CMP_GE_OQ>(zz, thr);
                *m |= u64::from(_mm256_movemask_ps(keep) as u8) << (8 * k);
            }
        }
        u128::from(half[0]) | u128::from(half[1]) << 64
    }

    /// The hit mask of [`collect_ge_max`]'s block of 64 values at `p` (bit `j` for
    /// `!(p[j] < t)`), made again from memory: out of line, so that the loop keeps no
    /// compare in a register for the rare block that has a hit.
    ///
    /// # Safety
    /// AVX2 must be present and `p.add(64)` within the slice `p` points into.
    #[cold]
    #[inline(never)]
    #[target_feature(enable = "avx2")]
    unsafe fn hit_mask(p: *const f32, t: __m256) -> u64 {
        mask64::<_CMP_NLT_UQ>(p, t)
    }

    /// Mask (bit j = value j) of `z[i..i+64] >= thr`, or `== v` with `EQ`.
    ///
    /// # Safety
    /// AVX2 must be present and `p.add(i + 64)` within the slice `p` points into.
    #[inline(always)]
    unsafe fn mask64<const OP: i32>(p: *const f32, t: __m256) -> u64 {
        let c = |k: usize| _mm256_cmp_ps::<OP>(_mm256_loadu_ps(p.add(8 * k)), t);
        let (c0, c1, c2, c3) = (c(0), c(1), c(2), c(3));
        let (c4, c5, c6, c7) = (c(4), c(5), c(6), c(7));
        let any = _mm256_or_ps(
            _mm256_or_ps(_mm256_or_ps(c0, c1), _mm256_or_ps(c2, c3)),
            _mm256_or_ps(_mm256_or_ps(c4, c5), _mm256_or_ps(c6, c7)),
        );
        if _mm256_movemask_ps(any) == 0 {
            return 0;
        }
        let mut m = 0u64;
        for (k, ck) in [c0, c1, c2, c3, c4, c5, c6, c7].into_iter().enumerate() {
            m |= u64::from(_mm256_movemask_ps(ck) as u8) << (8 * k);
        }
        m
    }

    /// # Safety
    /// AVX2 must be present.
    #[target_feature(enable = "avx2,fma")]
    pub unsafe fn collect_ge(z: &[f32], base: u32, thr: f32, out: &mut Vec<(u32, f32)>) {
        let t = _mm256_set1_ps(thr);
        let n = z.len();
        let mut i = 0;
        while i + 64 <= n {
            // SAFETY: i + 64 <= n: the 64 values read are inside z.
            let hits = unsafe { mask64::<_CMP_GE_OQ>(z.as_ptr().add(i), t) };
            push_hits(hits, i, base, z, out);
            i += 64;
        }
        for (j, &x) in z.iter().enumerate().skip(i) {
            if x >= thr {
                out.push((base + j as u32, x));
            }
        }
    }

    /// # Safety
    /// AVX2 must be present.
    #[target_feature(enable = "avx2,fma")]
    pub unsafe fn first_eq(z: &[f32], v: f32) -> Option<usize> {
        let t = _mm256_set1_ps(v);
        let n = z.len();
        let mut i = 0;
        while i + 64 <= n {
            // SAFETY: i + 64 <= n: the 64 values read are inside z.
            let m = unsafe { mask64::<_CMP_EQ_OQ>(z.as_ptr().add(i), t) };
            if m != 0 {
                return Some(i + m.trailing_zeros() as usize);
            }
            i += 64;
        }
        z[i..].iter().position(|&x| x == v).map(|j| i + j)
    }
}

/// The passes over the whole row with the SSE2 every x86-64 CPU has (the `baseline`
/// level), where the compiler's own vectorisation of the generic loops falls short: the
/// top-p normaliser (it kept 32 lanes of sums and its constants in the 16 registers only
/// by moving them around, and could not fuse the gather), and the max with its non-finite
/// check and the gathering by threshold (a count per lane, and a compare per value, where
/// a block's max decides).
#[cfg(target_arch = "x86_64")]
mod sse2 {
    use super::{finish_ge_max, push_hits, staged_hits, EXP2_P4_COARSE, EXP2_P5};
    use std::arch::x86_64::*;

    /// The 16 vectors of the 64 values at `at`.
    ///
    /// # Safety
    /// `at + 64 <= z.len()`.
    #[inline]
    #[target_feature(enable = "sse2")]
    unsafe fn load64(z: &[f32], at: usize) -> [__m128; 16] {
        // SAFETY: the caller keeps the 64 values read inside z.
        std::array::from_fn(|k| unsafe { _mm_loadu_ps(z.as_ptr().add(at + 4 * k)) })
    }

    /// The lane-wise max of `v`, NaN ignored: four chains from `-inf` with the value as
    /// `maxps`'s first operand (it returns the second when one is NaN), so no chain ever
    /// holds NaN.
    #[inline]
    #[target_feature(enable = "sse2")]
    fn max64(v: &[__m128; 16]) -> __m128 {
        let mut c = [_mm_set1_ps(f32::NEG_INFINITY); 4];
        for (k, x) in v.iter().enumerate() {
            c[k % 4] = _mm_max_ps(*x, c[k % 4]);
        }
        _mm_max_ps(_mm_max_ps(c[0], c[1]), _mm_max_ps(c[2], c[3]))
    }

    /// Lanes where some value of `v` is NaN (unordered compares of pairs).
    #[inline]
    #[target_feature(enable = "sse2")]
    fn nan64(v: &[__m128; 16]) -> __m128 {
        let u: [__m128; 8] = std::array::from_fn(|k| _mm_cmpunord_ps(v[k], v[k + 8]));
        _mm_or_ps(
            _mm_or_ps(_mm_or_ps(u[0], u[1]), _mm_or_ps(u[2], u[3])),
            _mm_or_ps(_mm_or_ps(u[4], u[5]), _mm_or_ps(u[6], u[7])),
        )
    }

    /// Bit `j` set for value `j` of `v` at or above `t` (NaN never).
    #[inline]
    #[target_feature(enable = "sse2")]
    fn mask_ge(v: &[__m128; 16], t: __m128) -> u64 {
        let mut m = 0;
        for (k, x) in v.iter().enumerate() {
            m |= (_mm_movemask_ps(_mm_cmpge_ps(*x, t)) as u64) << (4 * k);
        }
        m
    }

    /// The largest lane of `m`.
    #[inline]
    #[target_feature(enable = "sse2")]
    fn hmax(m: __m128) -> f32 {
        let m = _mm_max_ps(m, _mm_movehl_ps(m, m));
        _mm_cvtss_f32(_mm_max_ss(m, _mm_shuffle_ps::<1>(m, m)))
    }

    /// [`super::max_nonfinite`] with SSE2: the max in four chains and NaN by unordered
    /// compares; the values are counted again, one by one, only when a NaN or `+inf` shows.
    #[target_feature(enable = "sse2")]
    pub fn max_nonfinite(z: &[f32]) -> (f32, u64) {
        let mut m = [_mm_set1_ps(f32::NEG_INFINITY); 4];
        let mut nan = _mm_setzero_ps();
        let mut i = 0;
        while i + 64 <= z.len() {
            // SAFETY: i + 64 <= z.len().
            let v = unsafe { load64(z, i) };
            for (k, x) in v.iter().enumerate() {
                m[k % 4] = _mm_max_ps(*x, m[k % 4]);
            }
            nan = _mm_or_ps(nan, nan64(&v));
            i += 64;
        }
        let mut mx = hmax(_mm_max_ps(_mm_max_ps(m[0], m[1]), _mm_max_ps(m[2], m[3])));
        let mut bad = _mm_movemask_ps(nan) != 0;
        for &x in &z[i..] {
            mx = if x > mx { x } else { mx };
            bad |= x.is_nan();
        }
        let count = if bad || mx == f32::INFINITY {
            z.iter()
                .filter(|x| x.is_nan() || **x == f32::INFINITY)
                .count() as u64
        } else {
            0
        };
        (mx, count)
    }

    /// [`super::collect_ge_max`] with SSE2: one pass; each block of 64 values gives its
    /// max (NaN ignored), which feeds the row's max and decides whether the block's hits
    /// are looked for.
    #[target_feature(enable = "sse2")]
    pub fn collect_ge_max(
        z: &[f32],
        base: u32,
        thr: f32,
        out: &mut Vec<(u32, f32)>,
    ) -> (f32, bool) {
        let t = _mm_set1_ps(thr);
        let fresh = (_mm_set1_ps(f32::NEG_INFINITY), _mm_setzero_ps());
        let (mut m, mut nan) = fresh;
        let end = staged_hits(
            z,
            base,
            out,
            fresh,
            |(m, nan), at| {
                // SAFETY: `staged_hits` passes blocks with at + 64 <= z.len().
                let v = unsafe { load64(z, at) };
                let bm = max64(&v);
                *m = _mm_max_ps(bm, *m);
                *nan = _mm_or_ps(*nan, nan64(&v));
                if _mm_movemask_ps(_mm_cmpge_ps(bm, t)) != 0 {
                    mask_ge(&v, t)
                } else {
                    0
                }
            },
            |(sm, snan)| {
                m = _mm_max_ps(sm, m);
                nan = _mm_or_ps(snan, nan);
            },
        );
        finish_ge_max(
            z,
            end,
            (base, thr),
            out,
            (hmax(m), _mm_movemask_ps(nan) != 0),
        )
    }

    /// [`super::collect_ge`] with SSE2: a block of 64 values is compared value by value
    /// only when its max reaches `thr`.
    #[target_feature(enable = "sse2")]
    pub fn collect_ge(z: &[f32], base: u32, thr: f32, out: &mut Vec<(u32, f32)>) {
        let t = _mm_set1_ps(thr);
        let block = |_: &mut (), at| {
            // SAFETY: `staged_hits` passes blocks with at + 64 <= z.len().
            let v = unsafe { load64(z, at) };
            if _mm_movemask_ps(_mm_cmpge_ps(max64(&v), t)) != 0 {
                mask_ge(&v, t)
            } else {
                0
            }
        };
        let end = staged_hits(z, base, out, (), block, |()| {});
        for (j, &x) in z.iter().enumerate().skip(end) {
            if x >= thr {
                out.push((base + j as u32, x));
            }
        }
    }

    /// [`super::exp2_sum_collect`] (`COLLECT`) or [`super::exp2_sum`] (`!COLLECT`) with
    /// SSE2: every term is [`super::exp2_est`]`::<false>(z c1 + c0)` bit for bit (the same
    /// unfused multiplies and adds; `maxps`/`minps` with the value second keep NaN as the
    /// scalar comparisons do). Groups of 256 values: two chains of f32 partial sums (32
    /// terms per lane at most), added in f64. The hits: each block of 64 values keeps its
    /// max (`maxps` with the new value first, so a NaN leaves it alone), and only a block
    /// whose max reaches `thr` is read again with exact compares, after the group's loop.
    ///
    /// `COARSE`: the polynomial [`EXP2_P4_COARSE`] (relative error below 3e-6), not
    /// `exp2_est`'s.
    #[target_feature(enable = "sse2")]
    pub fn exp2_sum_collect<const COLLECT: bool, const COARSE: bool>(
        z: &[f32],
        c1: f32,
        c0: f32,
        base: u32,
        thr: f32,
        out: &mut Vec<(u32, f32)>,
    ) -> f64 {
        // 1.5 * 2^23 + 127, as in `exp2_est`
        let magic = _mm_set1_ps(12_583_039.0);
        let (vc1, vc0) = (_mm_set1_ps(c1), _mm_set1_ps(c0));
        let (lo, hi) = (_mm_set1_ps(-126.0), _mm_set1_ps(128.0));
        let p = EXP2_P5.map(|c| _mm_set1_ps(c));
        let p4 = EXP2_P4_COARSE.map(|c| _mm_set1_ps(c));
        let p: &[__m128] = if COARSE { &p4 } else { &p };
        let one = _mm_set1_ps(1.0);
        let term = |x: __m128, acc: __m128| {
            let w = _mm_add_ps(_mm_mul_ps(x, vc1), vc0);
            let w = _mm_min_ps(hi, _mm_max_ps(lo, w));
            let tm = _mm_add_ps(w, magic);
            let f = _mm_sub_ps(w, _mm_sub_ps(tm, magic));
            let mut q = p[0];
            for c in &p[1..] {
                q = _mm_add_ps(_mm_mul_ps(q, f), *c);
            }
            q = _mm_add_ps(_mm_mul_ps(q, f), one);
            let scale = _mm_castsi128_ps(_mm_slli_epi32::<23>(_mm_castps_si128(tm)));
            _mm_add_ps(acc, _mm_mul_ps(q, scale))
        };
        let vthr = _mm_set1_ps(thr);
        // into the two f64 lanes of `total` (added across only at the end)
        let flush = |total: __m128d, a: __m128| {
            let lo = _mm_cvtps_pd(a);
            let hi = _mm_cvtps_pd(_mm_movehl_ps(a, a));
            _mm_add_pd(total, _mm_add_pd(lo, hi))
        };
        let n = z.len();
        let ptr = z.as_ptr();
        let mut total = _mm_setzero_pd();
        let mut i = 0;
        let mut flagged = [false; 4];
        while i + 64 <= n {
            let blocks = ((n - i) / 64).min(4);
            let (mut a0, mut a1) = (_mm_setzero_ps(), _mm_setzero_ps());
            for (b, reach) in flagged[..blocks].iter_mut().enumerate() {
                let at = i + 64 * b;
                super::prefetch_lines(z, at + super::PREFETCH_AHEAD, 64);
                let mut top = _mm_set1_ps(f32::NEG_INFINITY);
                for s in 0..8 {
                    // SAFETY: at + 64 <= n: the loads of 4 values are inside z.
                    let (x0, x1) = unsafe {
                        (
                            _mm_loadu_ps(ptr.add(at + 8 * s)),
                            _mm_loadu_ps(ptr.add(at + 8 * s + 4)),
                        )
                    };
                    if COLLECT {
                        top = _mm_max_ps(x1, _mm_max_ps(x0, top));
                    }
                    a0 = term(x0, a0);
                    a1 = term(x1, a1);
                }
                if COLLECT {
                    // NaN thr: no lane compares >= it, as no value is >= NaN
                    *reach = _mm_movemask_ps(_mm_cmpge_ps(top, vthr)) != 0;
                }
            }
            total = flush(total, _mm_add_ps(a0, a1));
            if COLLECT {
                for (b, _) in flagged[..blocks].iter().enumerate().filter(|f| *f.1) {
                    let at = i + 64 * b;
                    // SAFETY: at + 64 <= n.
                    let hits = mask_ge(&unsafe { load64(z, at) }, vthr);
                    push_hits(hits, at, base, z, out);
                }
            }
            i += 64 * blocks;
        }
        // the rest, 4 at a time into four sums in turn (at most 4 terms per lane);
        // missing lanes read as -inf (each adds 2^-126, as -inf does)
        let mut acc = [_mm_setzero_ps(); 4];
        let mut k = 0;
        while i < n {
            let len = (n - i).min(4);
            let mut v = [f32::NEG_INFINITY; 4];
            v[..len].copy_from_slice(&z[i..i + len]);
            // SAFETY: `v` holds 4 values.
            let x = unsafe { _mm_loadu_ps(v.as_ptr()) };
            if COLLECT {
                let ge = _mm_movemask_ps(_mm_cmpge_ps(x, vthr)) as u64;
                // the padding lanes are not hits, even against a threshold of -inf
                push_hits(ge & ((1u64 << len) - 1), i, base, z, out);
            }
            acc[k % 4] = term(x, acc[k % 4]);
            k += 1;
            i += len;
        }
        sum_pd(acc.into_iter().fold(total, flush))
    }

    /// The sum of the two lanes of `d`.
    #[inline]
    #[target_feature(enable = "sse2")]
    pub(super) fn sum_pd(d: __m128d) -> f64 {
        _mm_cvtsd_f64(_mm_add_sd(d, _mm_unpackhi_pd(d, d)))
    }
}
/// `sum(exp((z - zmax) * scale))` in f32 lanes gathered in f64 (approximate: each term
/// within a few 1e-7 of the exact value).
pub fn exp_sum(z: &[f32], zmax: f32, scale: f32) -> f64 {
    #[cfg(target_arch = "x86_64")]
    {
        #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma")]
        unsafe fn wide(z: &[f32], zmax: f32, scale: f32) -> f64 {
            body::exp_sum::<true>(z, zmax, scale)
        }
        #[target_feature(enable = "avx2,fma")]
        unsafe fn avx2(z: &[f32], zmax: f32, scale: f32) -> f64 {
            body::exp_sum::<true>(z, zmax, scale)
        }
        match level() {
            // SAFETY: `level()` detected AVX-512 F/BW/DQ/VL and FMA on this CPU.
            Level::Avx512 => return unsafe { wide(z, zmax, scale) },
            // SAFETY: `level()` detected AVX2 and FMA on this CPU.
            Level::Avx2 => return unsafe { avx2(z, zmax, scale) },
            Level::Base => {}
        }
    }
    body::exp_sum::<false>(z, zmax, scale)
}
/// How [`exp2_sum_collect`] and [`exp2_sum`] make their terms `2^w`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Terms {
    /// Each term within 2.5e-7 (relative) of `2^w`.
    Precise,
    /// Each term within [`Terms::error`]: with AVX2 and the baseline kernels a polynomial
    /// one degree lower (within 4e-6): one multiply-add less per 8 values, or one multiply
    /// and one add per 4; the AVX-512 kernels (and other architectures) make their
    /// precise terms.
    Coarse,
}

impl Terms {
    /// A bound on each term's relative distance to `2^w`, with this CPU's kernels.
    pub fn error(self) -> f64 {
        #[cfg(target_arch = "x86_64")]
        if self == Terms::Coarse && matches!(level(), Level::Avx2 | Level::Base) {
            return 4e-6;
        }
        2.5e-7
    }
}

/// Σ over `z` of `2^(z c1 + c0)` (each term within 2.5e-7, or [`Terms::error`]: a table and
/// a polynomial with AVX-512 and AVX2, [`exp2_est`] otherwise, with SSE2 on x86-64; f32
/// partial sums added in f64), and every
/// `(base + j, z[j])` with `z[j] >= thr` appended to `out` in index order: the top-p
/// normaliser and its candidates in one pass over the row. With `c1 = log2(e) / T`
/// and `c0 = -c1 m` the terms are `exp((z - m) / T)` for any reference `m`. The sum is NaN
/// or `+inf` when `z` holds a NaN or `+inf`, or a value far above `m`.
pub fn exp2_sum_collect(
    z: &[f32],
    (c1, c0): (f32, f32),
    terms: Terms,
    base: u32,
    thr: f32,
    out: &mut Vec<(u32, f32)>,
) -> f64 {
    #[cfg(target_arch = "x86_64")]
    match (level(), terms) {
        // SAFETY: `level()` detected AVX-512 F/BW/DQ/VL and FMA on this CPU.
        (Level::Avx512, _) => unsafe {
            simd512::exp2_sum_collect::<true>(z, c1, c0, base, thr, out)
        },
        // SAFETY: `level()` detected AVX2 and FMA on this CPU.
        (Level::Avx2, Terms::Precise) => unsafe {
            simd::exp2_sum_collect::<true, false>(z, c1, c0, base, thr, out)
        },
        // SAFETY: as above.
        (Level::Avx2, Terms::Coarse) => unsafe {
            simd::exp2_sum_collect::<true, true>(z, c1, c0, base, thr, out)
        },
        // SAFETY: SSE2 is part of x86-64.
        (Level::Base, Terms::Precise) => unsafe {
            sse2::exp2_sum_collect::<true, false>(z, c1, c0, base, thr, out)
        },
        // SAFETY: as above.
        (Level::Base, Terms::Coarse) => unsafe {
            sse2::exp2_sum_collect::<true, true>(z, c1, c0, base, thr, out)
        },
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        let _ = terms;
        body::collect_ge(z, base, thr, out);
        body::exp2_sum::<false>(z, c1, c0)
    }
}

/// The sum of [`exp2_sum_collect`] alone: with the same terms, so the two cancel exactly
/// where they cover the same values (up to the order of the additions).
pub fn exp2_sum(z: &[f32], (c1, c0): (f32, f32), terms: Terms) -> f64 {
    let none = &mut Vec::new();
    #[cfg(target_arch = "x86_64")]
    match (level(), terms) {
        // SAFETY: `level()` detected AVX-512 F/BW/DQ/VL and FMA on this CPU.
        (Level::Avx512, _) => unsafe {
            simd512::exp2_sum_collect::<false>(z, c1, c0, 0, 0.0, none)
        },
        // SAFETY: `level()` detected AVX2 and FMA on this CPU.
        (Level::Avx2, Terms::Precise) => unsafe {
            simd::exp2_sum_collect::<false, false>(z, c1, c0, 0, 0.0, none)
        },
        // SAFETY: as above.
        (Level::Avx2, Terms::Coarse) => unsafe {
            simd::exp2_sum_collect::<false, true>(z, c1, c0, 0, 0.0, none)
        },
        // SAFETY: SSE2 is part of x86-64.
        (Level::Base, Terms::Precise) => unsafe {
            sse2::exp2_sum_collect::<false, false>(z, c1, c0, 0, 0.0, none)
        },
        // SAFETY: as above.
        (Level::Base, Terms::Coarse) => unsafe {
            sse2::exp2_sum_collect::<false, true>(z, c1, c0, 0, 0.0, none)
        },
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        let _ = (terms, none);
        body::exp2_sum::<false>(z, c1, c0)
    }
}

/// `w[i] = exp((z[i] - zmax) scale)` for every `i` (within 3e-7, relative; `w` as long as
/// `z`): the candidates' approximate top-p weights.
pub fn exp_into(z: &[f32], zmax: f32, scale: f32, w: &mut [f32]) {
    #[cfg(target_arch = "x86_64")]
    {
        #[target_feature(enable = "avx512f,avx512bw,avx512dq,avx512vl,avx2,fma")]
        unsafe fn wide(z: &[f32], zmax: f32, scale: f32, w: &mut [f32]) {
            body::exp_into::<true>(z, zmax, scale, w)
        }
        #[target_feature(enable = "avx2,fma")]
        unsafe fn avx2(z: &[f32], zmax: f32, scale: f32, w: &mut [f32]) {
            body::exp_into::<true>(z, zmax, scale, w)
        }
        match level() {
            // SAFETY: `level()` detected AVX-512 F/BW/DQ/VL and FMA on this CPU.
            Level::Avx512 => return unsafe { wide(z, zmax, scale, w) },
            // SAFETY: `level()` detected AVX2 and FMA on this CPU.
            Level::Avx2 => return unsafe { avx2(z, zmax, scale, w) },
            Level::Base => {}
        }
    }
    body::exp_into::<false>(z, zmax, scale, w)
}

/// Top-p mass by buckets of `y`: for every `i`, `y = z[i] / t` (an IEEE division, as
/// stage 5), `d = y - ymax`, bucket `b = min(floor(-d scale), mass.len() - 1)` (so larger
/// `y` never lands in a later bucket) written to `bucket[i]`, and `exp(d)` within 3e-7
/// ([`exp_bulk`]) added in f64 to `mass[b]` (two interleaved sums per bucket). `ymax` must
/// be the largest `y` and `z` free of NaN and `+inf`; `bucket` as long as `z`.
pub fn mass_by_y(
    z: &[f32],
    t: f32,
    ymax: f32,
    scale: f32,
    bucket: &mut [u16],
    mass: &mut [[f64; 2]],
) {
    #[cfg(target_arch = "x86_64")]
    {
        #[target_feature(enable = "avx512f,avx512bw,avx512dq,avx512vl,avx2,fma")]
        unsafe fn wide(z: &[f32], t: f32, ymax: f32, s: f32, b: &mut [u16], m: &mut [[f64; 2]]) {
            body::mass_by_y::<true>(z, t, ymax, s, b, m)
        }
        #[target_feature(enable = "avx2,fma")]
        unsafe fn avx2(z: &[f32], t: f32, ymax: f32, s: f32, b: &mut [u16], m: &mut [[f64; 2]]) {
            body::mass_by_y::<true>(z, t, ymax, s, b, m)
        }
        match level() {
            // SAFETY: `level()` detected AVX-512 F/BW/DQ/VL and FMA on this CPU.
            Level::Avx512 => return unsafe { wide(z, t, ymax, scale, bucket, mass) },
            // SAFETY: `level()` detected AVX2 and FMA on this CPU.
            Level::Avx2 => return unsafe { avx2(z, t, ymax, scale, bucket, mass) },
            Level::Base => {}
        }
    }
    body::mass_by_y::<false>(z, t, ymax, scale, bucket, mass)
}

dispatch! {
    /// Appends to `out`, in order, every `i` with `first <= bucket[i] <= last` (`first <= last`).
    pub fn collect_buckets(bucket: &[u16], first: u16, last: u16, out: &mut Vec<u32>) -> ();
}

dispatch! {
    /// `v[i] = fmath::exp(v[i] - shift)` for every `i`: the top-p weights `exp(y - ymax)`
    /// of the contract, bit for bit (each vector lane runs [`crate::fmath::exp`]'s
    /// operations).
    pub fn exp_shifted(v: &mut [f32], shift: f32) -> ();
}

dispatch! {
    /// Σ `w[i]` over the `i` with `z[i] >= thr` (f32 partial sums added in f64).
    pub fn mass_ge(z: &[f32], w: &[f32], thr: f32) -> f64;
}

dispatch! {
    /// How many values are ordered before `z[idx] == v` (greater, or equal at a smaller index).
    pub fn count_rank(z: &[f32], v: f32, idx: usize) -> u64;
}

dispatch! {
    /// `y = W x` for a row-major `W [y.len(), x.len()]` of f32.
    pub fn matvec_f32(w: &[f32], x: &[f32], y: &mut [f32]) -> ();
}
dispatch! {
    /// `y = W x` for a row-major `W [y.len(), x.len()]` of bf16 bit patterns, in f32.
    pub fn matvec_bf16(w: &[u16], x: &[f32], y: &mut [f32]) -> ();
}
dispatch! {
    /// Widens bf16 bit patterns to f32 (exact).
    pub fn widen_bf16(src: &[u16], dst: &mut [f32]) -> ();
}
dispatch! {
    /// `y = W x` for a row-major f16 `W [y.len(), x.len()]` (bit patterns, widened exactly).
    pub fn matvec_f16(w: &[u16], x: &[f32], y: &mut [f32]) -> ();
}
dispatch! {
    /// Widens f16 bit patterns to f32 (exact).
    pub fn widen_f16(src: &[u16], dst: &mut [f32]) -> ();
}
dispatch! {
    /// `dst [m, out] = lhs [m, in] · W^T` for an affine-quantized `W [out, in]`,
    /// dequantized in registers, 16 codes at a time for every row of `lhs`.
    pub fn matmul_affine(bits: u32, group: usize, inf: usize, packed: &[u32], scales: &[f32], biases: &[f32], lhs: &[f32], dst: &mut [f32]) -> ();
}

/// Philox4x32-10 of 32 consecutive sampling-stream blocks `first_block ..
/// first_block + 32` at `step`: `out[4 * j + w]` is word `w` of block `first_block + j`,
/// the bits of token `4 * (first_block + j) + w`. The blocks run side by side in vector
/// lanes, one block per 64-bit lane (AVX-512: four chains of 8; AVX2: eight chains of 4;
/// baseline: 32-bit lanes as the compiler vectorises them).
pub fn philox_x32(first_block: u32, step: u64, key: [u32; 2], out: &mut [u32; 128]) {
    #[cfg(target_arch = "x86_64")]
    match level() {
        // SAFETY: `level()` detected AVX-512 F on this CPU.
        Level::Avx512 => {
            unsafe { simd512::philox_x32(first_block, step, key, out) };
            return;
        }
        // SAFETY: `level()` detected AVX2 on this CPU.
        Level::Avx2 => {
            unsafe { simd::philox_x32(first_block, step, key, out) };
            return;
        }
        Level::Base => {}
    }
    body::philox_x32(first_block, step, key, out)
}

/// Philox4x32-10 of 32 sampling-stream blocks at `step`, any blocks in any order (a
/// block may repeat): `out[4 * j + w]` is word `w` of block `blocks[j]`, the bits of token
/// `4 * blocks[j] + w`. The lanes of [`philox_x32`], the counters loaded instead of
/// counted: the words of scattered tokens (a draw's candidates) at the cost per block of
/// a whole row's.
pub fn philox_listed(blocks: &[u32; 32], step: u64, key: [u32; 2], out: &mut [u32; 128]) {
    #[cfg(target_arch = "x86_64")]
    match level() {
        // SAFETY: `level()` detected AVX-512 F on this CPU.
        Level::Avx512 => {
            unsafe { simd512::philox_listed(blocks, step, key, out) };
            return;
        }
        // SAFETY: `level()` detected AVX2 on this CPU.
        Level::Avx2 => {
            unsafe { simd::philox_listed(blocks, step, key, out) };
            return;
        }
        Level::Base => {}
    }
    body::philox_listed(blocks, step, key, out)
}

/// The Philox words of every token of a row of `v` at `step` under `key`, a chunk of 128
/// at a time as [`gated_chunks`] makes them (the round keys once per row; with AVX-512
/// three chunks at a time in two groups of six chains): `f(c, words)`
/// with `words[i]` the bits of token `128 c + i` ([`philox_x32`] of blocks `32 c ..`; the
/// last chunk's words past `v` are made too).
pub fn philox_chunks(v: usize, step: u64, key: [u32; 2], mut f: impl FnMut(usize, &[u32; 128])) {
    // `make(first_block, words)` for each chunk in turn
    fn each(
        v: usize,
        mut f: impl FnMut(usize, &[u32; 128]),
        mut make: impl FnMut(u32, &mut [u32; 128]),
    ) {
        let mut words = [0u32; 128];
        for c in 0..v.div_ceil(128) {
            make((32 * c) as u32, &mut words);
            f(c, &words);
        }
    }
    #[cfg(target_arch = "x86_64")]
    if level() == Level::Avx512 {
        // three chunks at a time, six chains a group, as the AVX-512 gated draw
        let row = RowKeys::new(step, key);
        let triples = v / 384;
        let mut words = [[0u32; 128]; 3];
        for t in 0..triples {
            // SAFETY: `level()` detected AVX-512 F on this CPU.
            unsafe { simd512::philox_three((96 * t) as u32, &row, &mut words) };
            for (k, w) in words.iter().enumerate() {
                f(3 * t + k, w);
            }
        }
        let done = 3 * triples;
        return each(
            v - 128 * done,
            |c, w| f(done + c, w),
            |b, out| {
                let b = b.wrapping_add(32 * done as u32);
                // SAFETY: as above.
                unsafe { simd512::philox_row(b, &row, out) }
            },
        );
    }
    #[cfg(target_arch = "x86_64")]
    if level() == Level::Avx2 {
        // SAFETY: `level()` detected AVX2 on this CPU.
        let row = unsafe { simd::row_keys(step, key) };
        // SAFETY: as above.
        return each(v, f, |b, out| unsafe {
            simd::philox_top(b, &row, out);
        });
    }
    each(v, f, |b, out| philox_x32(b, step, key, out))
}

/// The vector side of the one-pass whole-row draw: for each chunk of 128 values of `z`
/// in order, its largest values (taken one chunk ahead, the row prefetched further
/// ahead) are held against the leader's reach constants `reach()` (see
/// [`crate::philox::gumbel_reach_consts`]): a chunk that even the largest word cannot
/// lift is skipped before its Philox words at `step` under `key` are made; otherwise the
/// words are made and the chunk is judged again by its largest words, then token by token
/// ([`gumbel_reach`]), and `visit(chunk, mask, words)` gets the chunks where some token
/// may reach the leader (bit `j` of `mask` for token `128 chunk + j`). `None` at the first
/// chunk that holds a NaN or `+inf` (the caller counts them in the whole row); otherwise
/// the row's largest value. What a chunk's largest values are (the whole chunk's, or
/// lanes that match the words') is the variant's choice: a test that passes whenever a
/// token of the chunk passes its own.
pub fn gated_chunks(
    z: &[f32],
    step: u64,
    key: [u32; 2],
    reach: impl Fn() -> (f32, f32),
    visit: impl FnMut(usize, u128, &[u32; 128]),
) -> Option<f32> {
    #[cfg(target_arch = "x86_64")]
    match level() {
        // SAFETY: `level()` detected AVX-512 F and DQ on this CPU.
        Level::Avx512 => return unsafe { simd512::gated_chunks(z, step, key, reach, visit) },
        // SAFETY: `level()` detected AVX2 and FMA on this CPU.
        Level::Avx2 => return unsafe { simd::gated_chunks(z, step, key, reach, visit) },
        Level::Base => {}
    }
    gated_chunks_scalar(z, reach, visit, body::chunk_max, |b, out| {
        body::philox_x32(b, step, key, out);
        body::word_max_top15(out)
    })
}

/// Mask (bit `j` for `z[j]`, `j < z.len() <= 128`) of the tokens of a chunk whose word
/// `words[j]` could lift them to a leader:
/// `z[j] >= gumbel_reach_threshold(words[j], c0, c1)`, with the constants of
/// [`crate::philox::gumbel_reach_consts`] (see [`crate::philox::gumbel_reach_threshold`]).
/// Every instruction set computes the same mask; no bit at or past `z.len()`.
pub fn gumbel_reach(z: &[f32], words: &[u32; 128], c0: f32, c1: f32) -> u128 {
    #[cfg(target_arch = "x86_64")]
    if let (Ok(full), true) = (<&[f32; 128]>::try_from(z), level() != Level::Base) {
        // SAFETY: `level()` detected AVX2 on this CPU.
        return unsafe { simd::gumbel_reach(full, words, c0, c1) };
    }
    body::gumbel_reach(&z[..z.len().min(128)], words, c0, c1)
}

/// [`gated_chunks`] judging each chunk by its largest value and its largest word (or a
/// bound of it), over a variant's chunk max and Philox (`philox(first_block, out)` makes
/// the words and returns the bound).
#[inline(always)]
fn gated_chunks_scalar(
    z: &[f32],
    reach: impl Fn() -> (f32, f32),
    visit: impl FnMut(usize, u128, &[u32; 128]),
    chunk_max: impl Fn(&[f32]) -> (f32, bool),
    philox: impl Fn(u32, &mut [u32; 128]) -> u32,
) -> Option<f32> {
    let mut rowmax = f32::NEG_INFINITY;
    let bad = gated_chunks_with(
        z,
        reach,
        visit,
        |c| {
            let (m, bad) = chunk_max(c);
            rowmax = if m > rowmax { m } else { rowmax };
            (m, bad)
        },
        |b, out| (philox(b, out), ()),
        body::reaches,
        |(), chunk, out, c0, c1| gumbel_reach(chunk, out, c0, c1),
        u32::MAX,
    );
    (!bad).then_some(rowmax)
}

/// The loop of [`gated_chunks`] over a variant's parts: `values(chunk)` the chunk's
/// largest values (and whether it may hold a NaN or `+inf`), `words(first_block, out)`
/// its Philox words and their largest, the words either in `out` already or held in
/// the second part of the answer, `reaches(values, words, c0, c1)` the test of a chunk's
/// largest values against its largest words' thresholds, `tokens(held, chunk, out, c0,
/// c1)` (only for a chunk that passes) the [`gumbel_reach`] mask of its tokens, with the
/// words in `out` whenever the mask is not 0, `all` the largest words there can be.
/// True at a chunk with a NaN or `+inf`.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
fn gated_chunks_with<V: Copy, W: Copy, H>(
    z: &[f32],
    reach: impl Fn() -> (f32, f32),
    mut visit: impl FnMut(usize, u128, &[u32; 128]),
    mut values: impl FnMut(&[f32]) -> (V, bool),
    words: impl Fn(u32, &mut [u32; 128]) -> (W, H),
    reaches: impl Fn(V, W, f32, f32) -> bool,
    tokens: impl Fn(H, &[f32], &mut [u32; 128], f32, f32) -> u128,
    all: W,
) -> bool {
    let mut out = [0u32; 128];
    let mut next = values(&z[..z.len().min(128)]);
    for (c, chunk) in z.chunks(128).enumerate() {
        // this chunk's values were taken one step ahead and the next one's are taken now:
        // their loads and reduction overlap this chunk's Philox instead of delaying it
        let (v, flagged) = next;
        if let Some(after) = z.get((c + 1) * 128..) {
            prefetch_lines(z, c * 128 + PREFETCH_AHEAD, 128);
            next = values(&after[..after.len().min(128)]);
        }
        // a flag may be an overflowing sum of finite values: count to be sure
        if flagged && count_nonfinite(chunk) > 0 {
            return true;
        }
        let (c0, c1) = reach();
        // not even the largest word lifts the chunk: its words are not needed
        if !reaches(v, all, c0, c1) {
            continue;
        }
        let (w, held) = words((c * 32) as u32, &mut out);
        if !reaches(v, w, c0, c1) {
            continue;
        }
        let m = tokens(held, chunk, &mut out, c0, c1);
        if m != 0 {
            visit(c, m, &out);
        }
    }
    false
}

/// A chunk's largest values for the vector gated loops: `full(chunk)` for a chunk of 128,
/// else (the row's last, partial chunk) its max in every lane (`splat`), which covers any
/// token.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
fn chunk_values<V>(
    c: &[f32],
    full: impl FnOnce(&[f32; 128]) -> (V, bool),
    splat: impl FnOnce(f32) -> V,
) -> (V, bool) {
    match <&[f32; 128]>::try_from(c) {
        Ok(f) => full(f),
        Err(_) => {
            let (m, bad) = partial_chunk_max(c);
            (splat(m), bad)
        }
    }
}

/// [`body::chunk_max`] of the row's last, partial chunk, kept out of the gated loops: in
/// line it makes the loop's closure too big to inline, and the loop then pays a call per
/// chunk.
#[cfg(target_arch = "x86_64")]
#[cold]
#[inline(never)]
fn partial_chunk_max(c: &[f32]) -> (f32, bool) {
    body::chunk_max(c)
}

/// How many of `z` are NaN or `+inf`.
fn count_nonfinite(z: &[f32]) -> usize {
    z.iter()
        .filter(|v| v.is_nan() || **v == f32::INFINITY)
        .count()
}

/// How far ahead, in values (8 KiB), the passes that work on every value of a row (the
/// top-p normaliser, the plain-temperature draw, the one-pass gathering of
/// [`staged_hits`]) ask the cache for the row's lines. The
/// rows of a large batch come from memory, not from the caches, and the hardware
/// prefetcher alone leaves such a pass waiting on its loads instead of overlapping them
/// with its arithmetic.
const PREFETCH_AHEAD: usize = 2048;

/// Asks the cache for every line of `z[at .. at + len]` (`len` a multiple of 16: one
/// request per 64 bytes). Lines past the end of `z` may be asked for too: no bounds check
/// sits beside the vector loops that call this.
#[inline(always)]
fn prefetch_lines(z: &[f32], at: usize, len: usize) {
    #[cfg(target_arch = "x86_64")]
    for line in (0..len).step_by(16) {
        use std::arch::x86_64::{_mm_prefetch, _MM_HINT_T0};
        let addr = z.as_ptr().wrapping_add(at + line);
        // SAFETY: a prefetch only hints the cache: it never faults, even for an address
        // past the end of `z` (made with `wrapping_add` and never read from); SSE, which
        // has the instruction, is part of x86-64.
        unsafe { _mm_prefetch::<_MM_HINT_T0>(addr.cast::<i8>()) };
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = (z, at, len);
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Deterministic test values with NaN, infinities, repeats and signed zeros mixed in.
    fn values(n: usize, seed: u64) -> Vec<f32> {
        let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
        (0..n)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                match x % 23 {
                    // both signs: x86's default NaN has the sign bit set
                    0 if x & 64 == 0 => f32::NAN,
                    0 => -f32::NAN,
                    1 => f32::INFINITY,
                    2 => f32::NEG_INFINITY,
                    3 => -0.0,
                    4 => 1.5,
                    _ => ((x >> 20) % 2000) as f32 / 100.0 - 10.0,
                }
            })
            .collect()
    }

    /// The gathering by threshold, the max with its non-finite count and the search for
    /// a value (dispatched, and the SSE2 and generic variants) against plain loops.
    #[test]
    fn searches_match_the_plain_loops() {
        type Gather = fn(&[f32], u32, f32, &mut Vec<(u32, f32)>);
        type Max = fn(&[f32]) -> (f32, u64);
        let mut variants: Vec<(&str, Gather, Max)> = vec![
            ("dispatched", collect_ge, max_nonfinite),
            ("generic", body::collect_ge, body::max_nonfinite),
        ];
        #[cfg(target_arch = "x86_64")]
        variants.push((
            "sse2",
            // SAFETY: SSE2 is part of x86-64.
            |z, b, t, o| unsafe { sse2::collect_ge(z, b, t, o) },
            // SAFETY: as above.
            |z| unsafe { sse2::max_nonfinite(z) },
        ));
        for n in [0, 1, 7, 63, 64, 65, 130, 1000, 4099] {
            let z = values(n, n as u64 + 3);
            for &(name, gather, max_nf) in &variants {
                for thr in [f32::NEG_INFINITY, -10.0, 0.0, 1.5, 9.5, f32::INFINITY] {
                    let mut fast = Vec::new();
                    gather(&z, 7, thr, &mut fast);
                    let want: Vec<(u32, f32)> = z
                        .iter()
                        .enumerate()
                        .filter(|(_, &x)| x >= thr)
                        .map(|(i, &x)| (7 + i as u32, x))
                        .collect();
                    assert_eq!(fast.len(), want.len(), "{name} n={n} thr={thr}");
                    for (a, b) in fast.iter().zip(&want) {
                        assert!(
                            a.0 == b.0 && a.1.to_bits() == b.1.to_bits(),
                            "{name} n={n} thr={thr}"
                        );
                    }
                }
                // NaN ignored by the max; NaN and +inf counted; with and without them
                let finite: Vec<f32> = z
                    .iter()
                    .map(|&x| if x.is_finite() { x } else { -3.0 })
                    .collect();
                for row in [&z, &finite] {
                    let want_max = row
                        .iter()
                        .fold(f32::NEG_INFINITY, |m, &x| if x > m { x } else { m });
                    let want_bad = row
                        .iter()
                        .filter(|x| x.is_nan() || **x == f32::INFINITY)
                        .count();
                    let (m, bad) = max_nf(row);
                    assert_eq!(bad, want_bad as u64, "{name} n={n}");
                    assert_eq!(m.to_bits(), want_max.to_bits(), "{name} n={n}");
                }
            }
            for v in [
                1.5f32,
                0.0,
                f32::INFINITY,
                f32::NEG_INFINITY,
                123.0,
                f32::NAN,
            ] {
                let want = z.iter().position(|&x| x == v);
                assert_eq!(first_eq(&z, v), want, "n={n} v={v}");
            }
        }
    }

    #[test]
    fn exp2_est_is_accurate_and_keeps_non_finite_visible() {
        let mut worst = [0f64; 2];
        let mut w = -126.0f32;
        while w < 127.0 {
            for (k, v) in [exp2_est::<false>(w), exp2_est::<true>(w)]
                .into_iter()
                .enumerate()
            {
                let want = f64::from(w).exp2();
                worst[k] = worst[k].max((f64::from(v) - want).abs() / want);
            }
            w += 0.000_913;
        }
        assert!(
            worst[0] < 2.5e-7 && worst[1] < 2.5e-7,
            "worst relative errors {worst:?}"
        );
        for f in [exp2_est::<false>, exp2_est::<true>] {
            assert!(f(f32::NEG_INFINITY) <= 2f32.powi(-126));
            assert!(f(-1e30) <= 2f32.powi(-126));
            assert!(!f(f32::INFINITY).is_finite());
            assert!(!f(128.5).is_finite());
            assert!(f(f32::NAN).is_nan());
        }
    }

    /// The one-pass greedy max (every variant this CPU runs) against plain loops: the
    /// same max, the first index that holds it (ties between lanes and chunks, signed
    /// zeros, rows of `-inf`), NaN or `+inf` flagged wherever it sits, partial tails.
    #[test]
    fn argmax_nonfinite_matches_the_plain_loops() {
        type Pass = fn(&[f32]) -> (f32, usize, bool);
        let mut variants: Vec<(&str, Pass)> = vec![("dispatched", argmax_nonfinite)];
        #[cfg(target_arch = "x86_64")]
        if detected() == Level::Avx512 {
            variants.push(("avx512", |z| {
                if z.len() < 64 {
                    return argmax_nonfinite(z);
                }
                // SAFETY: `detected()` found AVX-512 F; 64 values or more.
                unsafe { simd512::argmax_nonfinite(z) }
            }));
        }
        #[cfg(target_arch = "x86_64")]
        if detected() != Level::Base {
            variants.push(("avx2", |z| {
                if z.len() < 32 {
                    return argmax_nonfinite(z);
                }
                // SAFETY: `detected()` found AVX2; 32 values or more.
                unsafe { simd::argmax_nonfinite(z) }
            }));
        }
        let check = |z: &[f32], what: &str| {
            let bad = z.iter().any(|v| v.is_nan() || *v == f32::INFINITY);
            let max = z.iter().copied().fold(f32::NEG_INFINITY, f32::max);
            let first = z.iter().position(|&v| v == max).unwrap_or(usize::MAX);
            for (name, f) in &variants {
                let (m, at, flagged) = f(z);
                assert_eq!(flagged, bad, "{name} {what}");
                if !bad {
                    assert!(m == max && at == first, "{name} {what}: {m} at {at}");
                }
            }
        };
        for n in [0, 1, 7, 31, 32, 33, 63, 64, 65, 130, 1000, 4099, 131_072] {
            for seed in [1u64, 2, 3] {
                let mut z = values(n, n as u64 + seed);
                check(&z, &format!("n={n} seed={seed}"));
                z.iter_mut()
                    .filter(|v| v.is_nan() || **v == f32::INFINITY)
                    .for_each(|v| *v = 3.5);
                check(&z, &format!("finite n={n} seed={seed}"));
                // coarse values: the max held many times, in many lanes and chunks
                let coarse: Vec<f32> = z.iter().map(|v| (v.abs() % 4.0).floor()).collect();
                check(&coarse, &format!("coarse n={n} seed={seed}"));
            }
            check(&vec![f32::NEG_INFINITY; n], &format!("-inf n={n}"));
            // signed zeros: the first zero of either sign
            let zeros: Vec<f32> = (0..n)
                .map(|i| if i % 3 == 0 { 0.0 } else { -0.0 })
                .collect();
            check(&zeros, &format!("zeros n={n}"));
            if n > 0 {
                // one winner, or one NaN / +inf, at every tenth position and the last
                for at in (0..n).step_by(n.div_ceil(10)).chain([n - 1]) {
                    let mut z = vec![-1.0f32; n];
                    z[at] = 2.0;
                    check(&z, &format!("n={n} winner at {at}"));
                    for v in [f32::NAN, -f32::NAN, f32::INFINITY] {
                        z[at] = v;
                        check(&z, &format!("n={n} {v} at {at}"));
                    }
                }
            }
        }
    }

    /// The fused gather-and-max pass (every variant this CPU runs) against plain loops:
    /// the same hits in order, the same max, and NaN or `+inf` flagged.
    #[test]
    fn collect_ge_max_matches_the_plain_loops() {
        type Pass = fn(&[f32], u32, f32, &mut Vec<(u32, f32)>) -> (f32, bool);
        let mut variants: Vec<(&str, Pass)> = vec![("dispatched", collect_ge_max)];
        #[cfg(target_arch = "x86_64")]
        if matches!(detected(), Level::Avx512 | Level::Avx2) {
            // SAFETY: `detected()` found AVX2 and FMA (implied by its AVX-512 level).
            variants.push(("avx2", |z, b, t, o| unsafe {
                simd::collect_ge_max(z, b, t, o)
            }));
        }
        // SAFETY: SSE2 is part of x86-64.
        #[cfg(target_arch = "x86_64")]
        variants.push(("sse2", |z, b, t, o| unsafe {
            sse2::collect_ge_max(z, b, t, o)
        }));
        for n in [0, 1, 7, 63, 64, 65, 130, 1000, 4099] {
            for seed in [1u64, 2, 3] {
                let mut z = values(n, n as u64 + seed);
                if seed == 1 {
                    // finite only
                    z.iter_mut()
                        .filter(|v| v.is_nan() || **v == f32::INFINITY)
                        .for_each(|v| *v = 3.5);
                }
                let bad = z.iter().any(|v| v.is_nan() || *v == f32::INFINITY);
                let want_max = z.iter().copied().fold(f32::NEG_INFINITY, f32::max);
                for thr in [f32::NEG_INFINITY, -10.0, 0.0, 9.5, f32::INFINITY] {
                    let want: Vec<(u32, f32)> = z
                        .iter()
                        .enumerate()
                        .filter(|(_, &x)| x >= thr)
                        .map(|(i, &x)| (3 + i as u32, x))
                        .collect();
                    for (name, f) in &variants {
                        let mut got = Vec::new();
                        let (m, flagged) = f(&z, 3, thr, &mut got);
                        assert_eq!(flagged, bad, "{name} n={n} seed={seed}");
                        if bad {
                            continue;
                        }
                        assert_eq!(m, want_max, "{name} n={n} seed={seed}");
                        assert_eq!(got.len(), want.len(), "{name} n={n} thr={thr}");
                        for (a, b) in got.iter().zip(&want) {
                            assert!(a.0 == b.0 && a.1.to_bits() == b.1.to_bits(), "{name}");
                        }
                    }
                }
            }
        }
        // past one staged segment of 4096 values: the max, a NaN or `+inf` in a later
        // segment, or only in the first one, are each found (the segments' states folded)
        for at in [5, 4100, 8191, 8700, 9000] {
            let n = 9001;
            let mut z: Vec<f32> = (0..n).map(|i| (i % 97) as f32 * 0.01).collect();
            z[at] = 7.25;
            for (name, f) in &variants {
                let mut got = Vec::new();
                let (m, flagged) = f(&z, 0, 5.0, &mut got);
                assert_eq!((m, flagged), (7.25, false), "{name} at={at}");
                assert_eq!(got, vec![(at as u32, 7.25)], "{name} at={at}");
                for bad in [f32::NAN, -f32::NAN, f32::INFINITY] {
                    let mut zb = z.clone();
                    zb[at] = bad;
                    assert!(f(&zb, 0, 5.0, &mut Vec::new()).1, "{name} at={at} {bad}");
                }
            }
        }
    }

    /// Each term of the normaliser within 2.5e-7 of `2^w` (coarse ones within
    /// [`Terms::error`], and the AVX2 and SSE2 ones within 4e-6 and no closer than 1e-6
    /// somewhere),
    /// one value at a time (the padding lanes add `2^-126` each, nothing at these
    /// magnitudes) and sixteen at a time: the dispatched variant, the AVX2 one wherever
    /// the CPU runs it, the SSE2 one and the generic loop.
    #[test]
    fn exp2_sum_terms_are_accurate() {
        type Sum = fn(&[f32]) -> f64;
        let mut variants: Vec<(&str, Sum, f64)> = vec![
            (
                "dispatched",
                |z| exp2_sum(z, (1.0, 0.0), Terms::Precise),
                2.5e-7,
            ),
            (
                "dispatched coarse",
                |z| exp2_sum(z, (1.0, 0.0), Terms::Coarse),
                Terms::Coarse.error(),
            ),
        ];
        #[cfg(target_arch = "x86_64")]
        if matches!(detected(), Level::Avx512 | Level::Avx2) {
            variants.push((
                "avx2",
                |z| {
                    // SAFETY: `detected()` found AVX2 and FMA (implied by its AVX-512 level).
                    unsafe {
                        simd::exp2_sum_collect::<false, false>(z, 1.0, 0.0, 0, 0.0, &mut Vec::new())
                    }
                },
                2.5e-7,
            ));
            variants.push((
                "avx2 coarse",
                |z| {
                    // SAFETY: as above.
                    unsafe {
                        simd::exp2_sum_collect::<false, true>(z, 1.0, 0.0, 0, 0.0, &mut Vec::new())
                    }
                },
                4e-6,
            ));
        }
        #[cfg(target_arch = "x86_64")]
        variants.push((
            "sse2",
            |z| {
                // SAFETY: SSE2 is part of x86-64.
                unsafe {
                    sse2::exp2_sum_collect::<false, false>(z, 1.0, 0.0, 0, 0.0, &mut Vec::new())
                }
            },
            2.5e-7,
        ));
        #[cfg(target_arch = "x86_64")]
        variants.push((
            "sse2 coarse",
            |z| {
                // SAFETY: SSE2 is part of x86-64.
                unsafe {
                    sse2::exp2_sum_collect::<false, true>(z, 1.0, 0.0, 0, 0.0, &mut Vec::new())
                }
            },
            4e-6,
        ));
        variants.push(("generic", |z| body::exp2_sum::<false>(z, 1.0, 0.0), 2.5e-7));
        for (name, f, bound) in variants {
            let mut worst = 0f64;
            let mut w = -100.0f32;
            while w < 127.0 {
                let want = f64::from(w).exp2();
                let one = f(&[w]);
                let many = f(&[w; 16]) / 16.0;
                worst = worst.max((one - want).abs() / want);
                worst = worst.max((many - want).abs() / want);
                w += 0.000_913;
            }
            assert!(worst < bound, "{name}: worst relative error {worst}");
            if name.ends_with(" coarse") {
                // coarse indeed: a bound that could not fail would test nothing
                assert!(worst > 1e-6, "{name}: worst relative error {worst}");
            }
            assert!(!f(&[128.5]).is_finite(), "{name}");
            assert!(!f(&[1.0, f32::INFINITY]).is_finite(), "{name}");
            assert!(f(&[f32::NAN]).is_nan(), "{name}");
            assert!(f(&[f32::NEG_INFINITY; 3]) < 1e-36, "{name}");
        }
    }

    /// The SSE2 normaliser's terms are `exp2_est::<false>(z c1 + c0)` bit for bit: one
    /// value is one term in lane 0 and `2^-126` (the `-inf` padding) in the other three,
    /// added in f64 as `(t + s) + (s + s)`; across the range, the clamps and NaN.
    #[cfg(target_arch = "x86_64")]
    #[test]
    fn sse2_terms_are_exp2_est_bit_for_bit() {
        let (c1, c0) = (1.3f32, -0.7f32);
        let s = 2f64.powi(-126);
        // SAFETY: SSE2 is part of x86-64.
        let sum = |x: f32| unsafe {
            sse2::exp2_sum_collect::<false, false>(&[x], c1, c0, 0, 0.0, &mut Vec::new())
        };
        let want = |x: f32| (f64::from(exp2_est::<false>(x * c1 + c0)) + s) + (s + s);
        let mut x = -120.0f32;
        let mut checked = 0;
        while x < 100.0 {
            assert_eq!(sum(x).to_bits(), want(x).to_bits(), "x = {x}");
            x += 0.001_37;
            checked += 1;
        }
        assert!(checked > 100_000);
        for x in [f32::NEG_INFINITY, -1e30, 1e30, f32::INFINITY, f32::NAN] {
            let (got, want) = (sum(x), want(x));
            assert!(
                got == want || (got.is_nan() && want.is_nan()),
                "x = {x}: {got} {want}"
            );
        }
    }

    /// The fused normaliser-and-gather pass (dispatched, the AVX2 variant where the CPU
    /// has it, the SSE2 one on x86-64) against plain loops: the same hits in order
    /// (thresholds equal to values of the row included), the sum within 1e-6 of the f64
    /// one and equal to the sum-only pass, `-inf` adding nothing, NaN, `+inf` and values
    /// far above the reference making the sum non-finite.
    #[test]
    fn exp2_sum_collect_matches_the_plain_loops() {
        type Collect = fn(&[f32], f32, f32, u32, f32, &mut Vec<(u32, f32)>) -> f64;
        type Sum = fn(&[f32], f32, f32) -> f64;
        let mut variants: Vec<(&str, Collect, Sum)> = vec![
            (
                "dispatched",
                |z, c1, c0, base, thr, out| {
                    exp2_sum_collect(z, (c1, c0), Terms::Precise, base, thr, out)
                },
                |z, c1, c0| exp2_sum(z, (c1, c0), Terms::Precise),
            ),
            (
                "dispatched coarse",
                |z, c1, c0, base, thr, out| {
                    exp2_sum_collect(z, (c1, c0), Terms::Coarse, base, thr, out)
                },
                |z, c1, c0| exp2_sum(z, (c1, c0), Terms::Coarse),
            ),
        ];
        // the gathering pass and the sum-only pass of the kernel in module `$m`
        #[cfg(target_arch = "x86_64")]
        macro_rules! kernel {
            ($name:literal, $m:ident $(, $coarse:literal)?) => {
                (
                    $name,
                    // SAFETY: pushed only where this CPU runs module `$m`'s instructions
                    // (AVX2 as detected; SSE2 is part of x86-64).
                    |z, c1, c0, base, thr, out| unsafe {
                        $m::exp2_sum_collect::<true $(, $coarse)?>(z, c1, c0, base, thr, out)
                    },
                    // SAFETY: as above.
                    |z, c1, c0| unsafe {
                        $m::exp2_sum_collect::<false $(, $coarse)?>(
                            z, c1, c0, 0, 0.0, &mut Vec::new()
                        )
                    },
                )
            };
        }
        #[cfg(target_arch = "x86_64")]
        if matches!(detected(), Level::Avx512 | Level::Avx2) {
            variants.push(kernel!("avx2", simd, false));
            variants.push(kernel!("avx2 coarse", simd, true));
        }
        #[cfg(target_arch = "x86_64")]
        variants.push(kernel!("sse2", sse2, false));
        #[cfg(target_arch = "x86_64")]
        variants.push(kernel!("sse2 coarse", sse2, true));
        let (c1, c0) = (1.7f32, -3.1f32);
        for &(name, collect, sum_only) in &variants {
            for n in [0, 1, 15, 16, 17, 63, 64, 65, 1000, 1023, 1024, 1025, 4099] {
                let z: Vec<f32> = values(n, n as u64 + 11)
                    .into_iter()
                    .map(|x| {
                        if x.is_nan() || x == f32::INFINITY {
                            -2.5
                        } else {
                            x
                        }
                    })
                    .collect();
                let want_sum: f64 = z
                    .iter()
                    .map(|&x| (f64::from(x) * f64::from(c1) + f64::from(c0)).exp2())
                    .sum();
                let thresholds = [f32::NEG_INFINITY, -2.5, 0.0, 1.5, 7.77, 9.5, f32::INFINITY];
                for thr in thresholds {
                    let mut hits = vec![(0, 0.0)];
                    let sum = collect(&z, c1, c0, 5, thr, &mut hits);
                    let want: Vec<(u32, f32)> = std::iter::once((0, 0.0))
                        .chain(
                            z.iter()
                                .enumerate()
                                .filter(|(_, &x)| x >= thr)
                                .map(|(i, &x)| (5 + i as u32, x)),
                        )
                        .collect();
                    assert_eq!(hits, want, "{name}: n={n} thr={thr}");
                    // the exp's 2.5e-7 (coarse: 4e-6) plus a few roundings of the f32 sum
                    // (the baseline variant adds in a different order than the vector
                    // ones)
                    let within = if name.ends_with("coarse") { 5e-6 } else { 1e-6 };
                    assert!(
                        (sum - want_sum).abs() <= within * want_sum,
                        "{name}: n={n}: {sum} vs {want_sum}"
                    );
                    assert_eq!(sum, sum_only(&z, c1, c0), "{name}: n={n}");
                }
                let bad = [
                    (f32::NAN, n / 2),
                    (f32::INFINITY, n.saturating_sub(1)),
                    (1e30, n / 3),
                    // 2^w overflows without the value reaching 2^31 in units of 1/8
                    (300.0, n / 4),
                ];
                for (bad, at) in bad {
                    if n == 0 {
                        continue;
                    }
                    let mut z = z.clone();
                    z[at] = bad;
                    let mut hits = Vec::new();
                    let sum = collect(&z, c1, c0, 0, 0.0, &mut hits);
                    assert!(!sum.is_finite(), "{name}: n={n} {bad}");
                    assert!(!sum_only(&z, c1, c0).is_finite(), "{name}: n={n} {bad}");
                    let want = z.iter().filter(|&&x| x >= 0.0).count();
                    assert_eq!(hits.len(), want, "{name}: n={n} {bad}");
                }
            }
        }
        // a NaN after a block's only hit, in the same lane of a later vector or nearby,
        // leaves the hit found
        for (name, collect, _) in &variants {
            for d in [1, 4, 8, 16, 32, 60] {
                let mut z = vec![-1.0f32; 128];
                z[3] = 2.0;
                z[3 + d] = f32::NAN;
                let mut hits = Vec::new();
                assert!(
                    collect(&z, c1, c0, 0, 0.0, &mut hits).is_nan(),
                    "{name}: d={d}"
                );
                assert_eq!(hits, [(3, 2.0)], "{name}: d={d}");
            }
        }
        // the generic loop (with and without FMA) agrees with the dispatched one
        let z: Vec<f32> = (0..3000).map(|i| (i % 97) as f32 * 0.3 - 20.0).collect();
        let fast = exp2_sum(&z, (c1, c0), Terms::Precise);
        for plain in [
            body::exp2_sum::<false>(&z, c1, c0),
            body::exp2_sum::<true>(&z, c1, c0),
        ] {
            assert!((plain - fast).abs() <= 3e-7 * fast, "{plain} vs {fast}");
        }
    }

    #[test]
    fn candidate_weight_helpers_match_the_plain_loops() {
        for n in [0, 1, 17, 64, 100, 1000, 1025] {
            let z: Vec<f32> = values(n, n as u64 + 5)
                .into_iter()
                .map(|x| if x.is_finite() { x } else { 0.25 })
                .collect();
            let zmax = z.iter().copied().fold(f32::NEG_INFINITY, f32::max);
            let want_min = z.iter().copied().fold(f32::INFINITY, f32::min);
            assert_eq!(min(&z), want_min, "n={n}");
            let mut w = vec![0f32; n];
            exp_into(&z, zmax, 0.8, &mut w);
            for (&wi, &zi) in w.iter().zip(&z) {
                let want = f64::from((zi - zmax) * 0.8).exp();
                assert!(
                    (f64::from(wi) - want).abs() <= 3e-7 * want,
                    "{zi}: {wi} vs {want}"
                );
            }
            for thr in [f32::NEG_INFINITY, -3.0, 0.25, 9.0, f32::INFINITY] {
                let want: f64 = z
                    .iter()
                    .zip(&w)
                    .filter(|(&zi, _)| zi >= thr)
                    .map(|(_, &wi)| f64::from(wi))
                    .sum();
                let got = mass_ge(&z, &w, thr);
                assert!(
                    (got - want).abs() <= 1e-6 * want.max(1e-30),
                    "n={n} thr={thr}"
                );
            }
        }
    }

    type Philox = fn(u32, u64, [u32; 2], &mut [u32; 128]);

    /// Every variant this CPU can run, whatever `DECODA_ISA` says.
    fn philox_variants() -> Vec<(&'static str, Philox)> {
        let mut v: Vec<(&'static str, Philox)> =
            vec![("baseline", body::philox_x32), ("dispatched", philox_x32)];
        #[cfg(target_arch = "x86_64")]
        {
            if detected() == Level::Avx512 {
                // SAFETY: `detected()` found AVX-512 F.
                v.push(("avx512", |f, s, k, o| unsafe {
                    simd512::philox_x32(f, s, k, o)
                }));
            }
            if detected() != Level::Base {
                // SAFETY: `detected()` found AVX2.
                v.push(("avx2", |f, s, k, o| unsafe { simd::philox_x32(f, s, k, o) }));
            }
        }
        v
    }

    /// The chunks of a row: one per 128 tokens (the last one partial), each the words of
    /// the scalar generator for its blocks.
    #[test]
    fn philox_chunks_are_the_rows_words() {
        let (seed, step) = (77u64, 5u64);
        let key = crate::philox::seed_key(seed);
        for v in [1, 127, 128, 129, 1000, 4096] {
            let mut seen = Vec::new();
            philox_chunks(v, step, key, |c, words| {
                for (j, &w) in words.iter().enumerate() {
                    let t = (128 * c + j) as u32;
                    assert_eq!(
                        w,
                        crate::philox::token_bits(seed, step, t),
                        "v {v} token {t}"
                    );
                }
                seen.push(c);
            });
            assert_eq!(seen, (0..v.div_ceil(128)).collect::<Vec<_>>(), "v {v}");
        }
    }

    type Listed = fn(&[u32; 32], u64, [u32; 2], &mut [u32; 128]);

    fn philox_listed_variants() -> Vec<(&'static str, Listed)> {
        let mut v: Vec<(&'static str, Listed)> = vec![
            ("baseline", body::philox_listed),
            ("dispatched", philox_listed),
        ];
        #[cfg(target_arch = "x86_64")]
        {
            if detected() == Level::Avx512 {
                // SAFETY: `detected()` found AVX-512 F.
                v.push(("avx512", |b, s, k, o| unsafe {
                    simd512::philox_listed(b, s, k, o)
                }));
            }
            if detected() != Level::Base {
                // SAFETY: `detected()` found AVX2.
                v.push(("avx2", |b, s, k, o| unsafe {
                    simd::philox_listed(b, s, k, o)
                }));
            }
        }
        v
    }

    /// Listed blocks (scattered, repeated, out of order, at both ends of the counter
    /// range) get the scalar generator's words, in every variant.
    #[test]
    fn philox_listed_matches_the_scalar_generator() {
        let mut rng = 0x9e37_79b9_7f4a_7c15u64;
        let mut next = || {
            rng ^= rng << 13;
            rng ^= rng >> 7;
            rng ^= rng << 17;
            rng
        };
        for (name, f) in philox_listed_variants() {
            for (seed, step) in [(0u64, 0u64), (42, 7), (u64::MAX, u64::MAX), (9, 1 << 40)] {
                let key = crate::philox::seed_key(seed);
                for case in 0..8 {
                    let blocks: [u32; 32] = std::array::from_fn(|j| match (case, j % 4) {
                        (0, _) => j as u32,
                        (1, _) => 7,
                        (2, 0) => u32::MAX - j as u32,
                        (3, _) => (31 - j) as u32 * 1000,
                        _ => (next() >> 32) as u32 % (1 << 16),
                    });
                    let mut out = [0u32; 128];
                    f(&blocks, step, key, &mut out);
                    for (j, &b) in blocks.iter().enumerate() {
                        let want = crate::philox::philox4x32_10(
                            [b, step as u32, (step >> 32) as u32, 0],
                            key,
                        );
                        assert_eq!(
                            &out[4 * j..4 * j + 4],
                            &want[..],
                            "{name}: seed {seed} step {step} case {case} lane {j} block {b}"
                        );
                    }
                }
            }
        }
    }

    #[test]
    fn philox_x32_matches_the_scalar_generator() {
        for (name, f) in philox_variants() {
            for (seed, step, first) in [
                (0u64, 0u64, 0u32),
                (42, 7, 16),
                (u64::MAX, u64::MAX, 1 << 28),
                (0x1234_5678_9abc_def0, 3, 5),
                // blocks wrap past u32::MAX within one call
                (9, 1 << 40, u32::MAX - 5),
                // the last call whose blocks reach u32::MAX without wrapping, and the first
                // that wraps (AVX-512 adds round 1's products for the one, multiplies for
                // the other)
                (5, 1 << 33, u32::MAX - 31),
                (5, 1 << 33, u32::MAX - 30),
            ] {
                let key = crate::philox::seed_key(seed);
                let mut out = [0u32; 128];
                f(first, step, key, &mut out);
                for j in 0..32u32 {
                    let b = first.wrapping_add(j);
                    let want =
                        crate::philox::philox4x32_10([b, step as u32, (step >> 32) as u32, 0], key);
                    assert_eq!(
                        &out[4 * j as usize..4 * j as usize + 4],
                        &want[..],
                        "{name}: seed {seed} step {step} block {b}"
                    );
                    if b < u32::MAX / 4 {
                        assert_eq!(
                            out[4 * j as usize + 2],
                            crate::philox::token_bits(seed, step, 4 * b + 2)
                        );
                    }
                }
            }
        }
    }

    /// The lanes of the AVX-512 chunk: the words' maxima of `pairs_max` and the values'
    /// maxima of `lane_max` hold exactly the tokens `word_lane` names, the pairs put in
    /// token order are the row's words, and the lanes name every residue mod 32 once.
    #[cfg(target_arch = "x86_64")]
    #[test]
    fn avx512_lanes_hold_the_tokens_they_name() {
        if detected() != Level::Avx512 {
            return;
        }
        let mut residues: Vec<usize> = (0..16).flat_map(simd512::word_lane).collect();
        residues.sort_unstable();
        assert_eq!(residues, (0..32).collect::<Vec<_>>());
        let tokens = |d: usize| -> Vec<usize> {
            (0..4)
                .flat_map(|h| simd512::word_lane(d).map(|r| 32 * h + r))
                .collect()
        };
        for (seed, step, first) in [(3u64, 0u64, 0u32), (99, 7, 64), (u64::MAX, 1 << 35, 4096)] {
            let key = crate::philox::seed_key(seed);
            // SAFETY: AVX-512 F was detected.
            let (top, out) = unsafe { simd512::words_and_top(first, step, key) };
            for (j, &w) in out.iter().enumerate() {
                let t = 4 * first + j as u32;
                assert_eq!(
                    w,
                    crate::philox::token_bits(seed, step, t),
                    "seed {seed} token {t}"
                );
            }
            for (d, &t) in top.iter().enumerate() {
                let want = tokens(d).iter().map(|&j| out[j]).max().expect("tokens");
                assert_eq!(t, want, "seed {seed} lane {d}");
            }
        }
        for seed in 0..20u64 {
            let z: Vec<f32> = values(128, seed + 50)
                .into_iter()
                .map(|v| if v.is_finite() { v } else { 1.0 })
                .collect();
            let full = <&[f32; 128]>::try_from(&z[..]).expect("a chunk");
            // SAFETY: AVX-512 F and DQ were detected.
            let (m, flagged) = unsafe { simd512::lane_max(full) };
            assert!(!flagged, "seed {seed}");
            // SAFETY: sixteen f32 lanes are 64 bytes, as is the array.
            let m: [f32; 16] = unsafe { std::mem::transmute(m) };
            for (d, &md) in m.iter().enumerate() {
                let want = tokens(d)
                    .into_iter()
                    .map(|j| z[j])
                    .fold(f32::NEG_INFINITY, f32::max);
                assert_eq!(md, want, "seed {seed} lane {d}");
            }
        }
    }

    /// The lanes of the AVX2 chunk: the words' maxima of `philox_top` and the values'
    /// maxima of `lane_max` hold exactly the tokens their docs name, and the values' lanes
    /// cover the words' (what the lane test needs).
    #[cfg(target_arch = "x86_64")]
    #[test]
    fn avx2_lanes_hold_the_tokens_they_name() {
        if detected() == Level::Base {
            return;
        }
        let lanes = |v: std::arch::x86_64::__m256i| -> [u32; 8] {
            // SAFETY: a register of eight 32-bit lanes is 32 bytes, as is the array.
            unsafe { std::mem::transmute(v) }
        };
        // the tokens of the words' lane l: l, l + 4 (l < 4) or l + 4, l + 8, in every
        // chain of 16
        let word_lane = |l: usize| -> Vec<usize> {
            let r = if l < 4 { [l, l + 4] } else { [l + 4, l + 8] };
            (0..8).flat_map(|c| r.map(|r| 16 * c + r)).collect()
        };
        for (seed, first) in [(3u64, 0u32), (99, 64), (u64::MAX, 4096)] {
            let key = crate::philox::seed_key(seed);
            let mut out = [0u32; 128];
            // SAFETY: AVX2 was detected.
            let top = lanes(unsafe { simd::philox_top(first, &simd::row_keys(11, key), &mut out) });
            for (l, &t) in top.iter().enumerate() {
                let want = word_lane(l).iter().map(|&j| out[j]).max().expect("tokens");
                assert_eq!(t, want, "seed {seed} lane {l}");
            }
        }
        for seed in 0..20u64 {
            let z: Vec<f32> = values(128, seed + 50)
                .into_iter()
                .map(|v| if v.is_finite() { v } else { 1.0 })
                .collect();
            let full = <&[f32; 128]>::try_from(&z[..]).expect("a chunk");
            // SAFETY: AVX2 was detected.
            let (m, flagged) = unsafe { simd::lane_max(full) };
            assert!(!flagged, "seed {seed}");
            // SAFETY: eight f32 lanes are 32 bytes, as is the array.
            let m: [f32; 8] = unsafe { std::mem::transmute(m) };
            for (l, &ml) in m.iter().enumerate() {
                let want = (0..128)
                    .filter(|j| j % 4 == l % 4)
                    .map(|j| z[j])
                    .fold(f32::NEG_INFINITY, f32::max);
                assert_eq!(ml, want, "seed {seed} lane {l}");
                for j in word_lane(l) {
                    assert!(j % 4 == l % 4, "lane {l} token {j}");
                }
            }
        }
    }

    #[test]
    fn chunk_max_matches_every_variant() {
        for n in [0usize, 1, 127, 128] {
            for seed in 0..40u64 {
                let z = values(n, seed + 3);
                let bad = z.iter().any(|v| v.is_nan() || *v == f32::INFINITY);
                let want = z.iter().fold(f32::NEG_INFINITY, |a, &b| a.max(b));
                let mut got = vec![("baseline", body::chunk_max(&z))];
                #[cfg(target_arch = "x86_64")]
                if let (Level::Avx512, Ok(full)) = (detected(), <&[f32; 128]>::try_from(&z[..])) {
                    // SAFETY: `detected()` found AVX-512 F and DQ.
                    let (m, flagged) = unsafe { simd512::lane_max(full) };
                    // SAFETY: sixteen f32 lanes are 64 bytes, as is the array.
                    let m: [f32; 16] = unsafe { std::mem::transmute(m) };
                    let m = m.iter().fold(f32::NEG_INFINITY, |a, &b| a.max(b));
                    got.push(("avx512 lanes", (m, flagged)));
                }
                #[cfg(target_arch = "x86_64")]
                if let (Level::Avx512 | Level::Avx2, Ok(full)) =
                    (detected(), <&[f32; 128]>::try_from(&z[..]))
                {
                    // SAFETY: `detected()` found AVX2 (implied by its AVX-512 level too).
                    let (m, flagged) = unsafe { simd::lane_max(full) };
                    // SAFETY: eight f32 lanes are 32 bytes, as is the array.
                    let m: [f32; 8] = unsafe { std::mem::transmute(m) };
                    let m = m.iter().fold(f32::NEG_INFINITY, |a, &b| a.max(b));
                    got.push(("avx2 lanes", (m, flagged)));
                }
                for (name, (m, flagged)) in got {
                    // a NaN or +inf must be flagged (a flag without one is allowed)
                    assert!(flagged || !bad, "{name} n={n} seed={seed}");
                    if !flagged {
                        assert_eq!(m, want, "{name} n={n} seed={seed}");
                    }
                    assert_eq!(count_nonfinite(&z) > 0, bad);
                }
            }
        }
    }

    /// The per-token reach test: every variant gives the generic code's mask bit for bit
    /// (full chunks, partial ones, `-inf` logits, leaders high and low, the pass-all
    /// constants).
    #[test]
    fn gumbel_reach_variants_agree() {
        let mut rng = crate::conformance::Rng::new(17);
        let key = crate::philox::seed_key(5);
        for case in 0..200u32 {
            let n = [128usize, 128, 77, 1][case as usize % 4];
            let mut words = [0u32; 128];
            philox_x32(case * 32, 3, key, &mut words);
            let z: Vec<f32> = (0..n)
                .map(|_| match rng.below(20) {
                    0 => f32::NEG_INFINITY,
                    _ => (rng.below(4000) as f32 - 2000.0) / 100.0,
                })
                .collect();
            let t = [0.05f32, 0.8, 1.0, 3.0][case as usize % 4];
            let floor = [-20.0f32, 0.0, 7.5, 25.0, f32::NEG_INFINITY][case as usize % 5];
            let (c0, c1) = crate::philox::gumbel_reach_consts(t, floor);
            let want = body::gumbel_reach(&z, &words, c0, c1);
            assert_eq!(gumbel_reach(&z, &words, c0, c1), want, "case {case}");
            #[cfg(target_arch = "x86_64")]
            if let (true, Ok(full)) = (detected() != Level::Base, <&[f32; 128]>::try_from(&z[..])) {
                // SAFETY: `detected()` found AVX2.
                let got = unsafe { simd::gumbel_reach(full, &words, c0, c1) };
                assert_eq!(got, want, "avx2 case {case}");
            }
            // the generic mask is the scalar test's, token by token
            for (j, &zj) in z.iter().enumerate() {
                let pass = zj >= crate::philox::gumbel_reach_threshold(words[j], c0, c1);
                assert_eq!(want >> j & 1 == 1, pass, "case {case} token {j}");
            }
        }
    }

    /// `gated_chunks` on every variant: a row far below the leader but for one token set
    /// exactly at its own threshold, at every position of the row in turn (each lane of
    /// each chunk, the partial last chunk): that token and no other is visited, with its
    /// words, and the row's max comes back; a NaN stops the row; the pass-all constants
    /// visit every finite token and no `-inf` one.
    #[test]
    fn gated_chunks_visits_every_token_that_passes() {
        type Gated = fn(&[f32], u64, [u32; 2], (f32, f32), &mut Vec<(u32, u32)>) -> Option<f32>;
        fn run(
            f: impl FnOnce(
                &[f32],
                &dyn Fn() -> (f32, f32),
                &mut dyn FnMut(usize, u128, &[u32; 128]),
            ) -> Option<f32>,
            z: &[f32],
            consts: (f32, f32),
            out: &mut Vec<(u32, u32)>,
        ) -> Option<f32> {
            f(z, &|| consts, &mut |c, mut m, words| {
                while m != 0 {
                    let j = m.trailing_zeros() as usize;
                    m &= m - 1;
                    out.push(((128 * c + j) as u32, words[j]));
                }
            })
        }
        let mut variants: Vec<(&str, Gated)> = vec![
            ("dispatched", |z, s, k, r, o| {
                run(|z, r, v| gated_chunks(z, s, k, r, v), z, r, o)
            }),
            ("generic", |z, s, k, r, o| {
                run(
                    |z, r, v| {
                        gated_chunks_scalar(z, r, v, body::chunk_max, |b, out| {
                            body::philox_x32(b, s, k, out);
                            body::word_max_top15(out)
                        })
                    },
                    z,
                    r,
                    o,
                )
            }),
        ];
        #[cfg(target_arch = "x86_64")]
        if detected() == Level::Avx512 {
            variants.push(("avx512", |z, s, k, r, o| {
                // SAFETY: `detected()` found AVX-512 F and DQ.
                run(
                    |z, r, v| unsafe { simd512::gated_chunks(z, s, k, r, v) },
                    z,
                    r,
                    o,
                )
            }));
        }
        #[cfg(target_arch = "x86_64")]
        if detected() != Level::Base {
            variants.push(("avx2", |z, s, k, r, o| {
                // SAFETY: `detected()` found AVX2 and FMA.
                run(
                    |z, r, v| unsafe { simd::gated_chunks(z, s, k, r, v) },
                    z,
                    r,
                    o,
                )
            }));
        }
        let (seed, step) = (0xfeed_u64, 9u64);
        let key = crate::philox::seed_key(seed);
        let consts = crate::philox::gumbel_reach_consts(1.0, 10.0);
        let thr = |i: usize| {
            let w = crate::philox::token_bits(seed, step, i as u32);
            (
                crate::philox::gumbel_reach_threshold(w, consts.0, consts.1),
                w,
            )
        };
        // 1,330 values: three triples of chunks (AVX-512 takes three at a time), a full
        // chunk and a partial one after them
        for (name, f) in &variants {
            let n = 1330;
            // every chunk could be lifted by its largest words (each value at the
            // threshold of the largest word there is), so triples are made whole; the
            // tokens that pass are exactly those the scalar test passes, winners set at
            // their own thresholds across the row among them
            let lift = crate::philox::gumbel_reach_threshold(u32::MAX, consts.0, consts.1);
            let mut z = vec![lift; n];
            for p in (0..n)
                .step_by(37)
                .chain([383, 384, 767, 1151, 1152, 1279, 1280, 1329])
            {
                z[p] = thr(p).0;
            }
            let want: Vec<(u32, u32)> = (0..n)
                .filter(|&i| z[i] >= thr(i).0)
                .map(|i| (i as u32, thr(i).1))
                .collect();
            assert!(want.len() >= 40, "{name}: {} winners", want.len());
            let mut seen = Vec::new();
            f(&z, step, key, consts, &mut seen);
            assert_eq!(seen, want, "{name}: whole triples");
        }
        for (name, f) in &variants {
            for n in [300, 1330] {
                for p in 0..n {
                    let mut z = vec![-50.0f32; n];
                    let w = crate::philox::token_bits(seed, step, p as u32);
                    z[p] = crate::philox::gumbel_reach_threshold(w, consts.0, consts.1);
                    let mut seen = Vec::new();
                    let max = f(&z, step, key, consts, &mut seen);
                    assert_eq!(seen, vec![(p as u32, w)], "{name}: token {p}");
                    assert_eq!(max, Some(z[p]), "{name}: token {p}");
                    // just below its threshold it is not visited
                    z[p] = z[p].next_down();
                    seen.clear();
                    f(&z, step, key, consts, &mut seen);
                    assert!(seen.is_empty(), "{name}: token {p} below");
                }
                let mut z: Vec<f32> = (0..n).map(|i| (i % 7) as f32).collect();
                z[5] = f32::NEG_INFINITY;
                z[200] = f32::NEG_INFINITY;
                let mut seen = Vec::new();
                let max = f(&z, step, key, (f32::MIN, 0.0), &mut seen);
                assert_eq!(max, Some(6.0), "{name}");
                let want: Vec<u32> = (0..n as u32).filter(|&i| i != 5 && i != 200).collect();
                assert_eq!(seen.iter().map(|s| s.0).collect::<Vec<_>>(), want, "{name}");
                for at in [150, n - 1, n / 2] {
                    let mut zb = z.clone();
                    zb[at] = f32::NAN;
                    assert_eq!(
                        f(&zb, step, key, consts, &mut Vec::new()),
                        None,
                        "{name} {at}"
                    );
                }
            }
        }
    }

    /// `exp_shifted` on every instruction set gives the contract's top-p weight
    /// (`pipeline::weight`, i.e. `fmath::exp(y - ymax)`) bit for bit: one in 509 of all
    /// bit patterns (NaN, infinities, subnormals, both signs) under shifts that move the
    /// difference across the cut-offs, odd lengths for the vector tails.
    #[test]
    fn exp_shifted_is_the_contract_weight() {
        let run = |stride: u64| {
            let v: Vec<f32> = (0..=u64::from(u32::MAX))
                .step_by(stride as usize)
                .map(|b| f32::from_bits(b as u32))
                .chain([0.0, -0.0, -87.336_54, -87.336_55, 88.0, 88.000_01, 1e-45])
                .collect();
            for shift in [0.0f32, 1.5, -3.25, 40.0, f32::INFINITY] {
                let want: Vec<u32> = v
                    .iter()
                    .map(|&y| crate::pipeline::weight(y, shift).to_bits())
                    .collect();
                for (name, f) in [
                    ("dispatched", exp_shifted as fn(&mut [f32], f32)),
                    ("baseline", body::exp_shifted),
                ] {
                    for len in [v.len(), 13] {
                        let mut got = v[..len].to_vec();
                        f(&mut got, shift);
                        for (j, g) in got.iter().enumerate() {
                            assert_eq!(
                                g.to_bits(),
                                want[j],
                                "{name}: y {:#x} shift {shift}",
                                v[j].to_bits()
                            );
                        }
                    }
                }
            }
        };
        run(509);
    }

    /// [`exp_shifted_is_the_contract_weight`] over every f32 bit pattern (a minute or
    /// more): `cargo test --release -p decoda --lib -- --ignored every_bit_pattern`.
    #[test]
    #[ignore = "exhaustive: about a minute per instruction set"]
    fn exp_shifted_is_the_contract_weight_for_every_bit_pattern() {
        for shift in [0.0f32, 1.5] {
            let mut got = vec![0f32; 1 << 20];
            for start in (0..=u64::from(u32::MAX)).step_by(1 << 20) {
                for (j, g) in got.iter_mut().enumerate() {
                    *g = f32::from_bits((start + j as u64) as u32);
                }
                exp_shifted(&mut got, shift);
                for (j, g) in got.iter().enumerate() {
                    let y = f32::from_bits((start + j as u64) as u32);
                    let want = crate::pipeline::weight(y, shift);
                    assert_eq!(
                        g.to_bits(),
                        want.to_bits(),
                        "y {:#x} shift {shift}",
                        y.to_bits()
                    );
                }
            }
        }
    }

    /// The bucket masses: every value in its bucket (`floor((ymax - z / t) scale)`, the
    /// last one for everything lower, `-inf` included), each bucket's mass within 3e-7 of
    /// the exact sum of `exp(y - ymax)`; and the gathering of a range of buckets, against
    /// filters written out (ranges at the ends, single buckets, lengths off the chunk size).
    #[test]
    fn bucket_masses_and_gathering() {
        let mut rng = crate::conformance::Rng::new(0x3c6e_f372_fe94_f82b);
        for (v, t) in [
            (131_072usize, 0.8f32),
            (1000, 1.0),
            (70_001, 2.5),
            (37, 0.3),
        ] {
            let mut z = crate::conformance::zipf_logits(&mut rng, v.max(2), 1.1);
            z.truncate(v);
            z[v / 3] = f32::NEG_INFINITY;
            let ymax = z.iter().map(|&zi| zi / t).fold(f32::NEG_INFINITY, f32::max);
            let mut bucket = vec![0u16; v];
            let mut mass = vec![[0f64; 2]; 2048];
            mass_by_y(&z, t, ymax, 64.0, &mut bucket, &mut mass);
            let mut want = vec![0f64; 2048];
            for (i, &zi) in z.iter().enumerate() {
                let d = zi / t - ymax;
                let b = (-d * 64.0).clamp(0.0, 2047.0) as u16;
                assert_eq!(bucket[i], b, "v {v}, i {i}, z {zi}");
                want[b as usize] += f64::from(d.max(-87.0)).exp();
            }
            for (b, m) in mass.iter().enumerate() {
                let got = m[0] + m[1];
                assert!(
                    (got - want[b]).abs() <= 3e-7 * want[b],
                    "v {v}, bucket {b}: {got} vs {}",
                    want[b]
                );
            }
            for (first, last) in [
                (0u16, 0u16),
                (0, 2047),
                (700, 701),
                (2047, 2047),
                (900, 990),
            ] {
                let mut got = Vec::new();
                collect_buckets(&bucket, first, last, &mut got);
                let want: Vec<u32> = (0..v as u32)
                    .filter(|&i| (first..=last).contains(&bucket[i as usize]))
                    .collect();
                assert_eq!(got, want, "v {v}, buckets {first}..={last}");
            }
        }
    }

    #[test]
    fn exp_bulk_is_accurate() {
        let mut x = -87.0f32;
        while x < 87.0 {
            for got in [exp_bulk::<false>(x), exp_bulk::<true>(x)] {
                let want = f64::from(x).exp();
                assert!(
                    ((f64::from(got) - want) / want).abs() < 3e-7,
                    "x={x}: {got} vs {want}"
                );
            }
            x += 0.0113;
        }
        assert!(exp_bulk::<false>(f32::NEG_INFINITY) < 1e-37);
        assert!(exp_bulk::<true>(f32::NAN) < 1e-37);
        assert_eq!(exp_bulk::<false>(0.0), 1.0);
    }

    #[test]
    fn exp_sum_is_accurate_on_every_level() {
        let z: Vec<f32> = (0..5000)
            .map(|i| -((i * 37 % 1009) as f32) / 40.0)
            .collect();
        let exact: f64 = z.iter().map(|&x| (f64::from(x) * 1.25).exp()).sum();
        let got = exp_sum(&z, 0.0, 1.25);
        assert!(
            ((got - exact) / exact).abs() < 5e-7,
            "{got} vs {exact} ({})",
            isa()
        );
        let base = body::exp_sum::<false>(&z, 0.0, 1.25);
        assert!(((base - exact) / exact).abs() < 5e-7, "{base} vs {exact}");
    }

    #[test]
    fn kernels_agree_with_scalar() {
        let z: Vec<f32> = (0..1000)
            .map(|i| ((i * 7919) % 1000) as f32 * 0.01 - 3.0)
            .collect();
        let (m, bad) = max_nonfinite(&z);
        assert_eq!(m, z.iter().copied().fold(f32::NEG_INFINITY, f32::max));
        assert_eq!(max(&z), m);
        assert_eq!(bad, 0);
        let mut w = z.clone();
        w[3] = f32::NAN;
        w[999] = f32::INFINITY;
        assert_eq!(max_nonfinite(&w).1, 2);
        let mut out = Vec::new();
        collect_ge(&z, 10, 6.0, &mut out);
        let want: Vec<(u32, f32)> = z
            .iter()
            .enumerate()
            .filter(|(_, &v)| v >= 6.0)
            .map(|(i, &v)| (i as u32 + 10, v))
            .collect();
        assert_eq!(out, want);
        let s = exp_sum(&z, m, 1.0);
        let s_ref: f64 = z.iter().map(|&v| f64::from(v - m).exp()).sum();
        assert!((s - s_ref).abs() / s_ref < 1e-6);
        let v = z[500];
        let r = count_rank(&z, v, 500);
        let r_ref = z
            .iter()
            .enumerate()
            .filter(|&(i, &x)| x > v || (x == v && i < 500))
            .count();
        assert_eq!(r as usize, r_ref);
    }
}
