//! Streaming loops of the fast CPU path, written so the compiler vectorises them, and
//! compiled three times (AVX-512, AVX2+FMA, baseline) with a run-time choice.
//!
//! None of these loops decides a token on its own: they find maxima, skip blocks that
//! hold no candidate, and approximate the top-p normaliser; every value that decides a
//! token is recomputed exactly by [`crate::pipeline`] functions.
//!
//! This file holds the shared constants, the run-time choice of level and the public
//! entry points; `portable` the loops the compiler vectorises; `avx512`, `avx2` and
//! `sse2` the explicit kernels of each level; `tests` their checks against plain loops.

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
/// bits). With `FMA`, fused multiply-adds (`a.mul_add(b, c)`), only inside code compiled
/// with FMA enabled.
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

/// `2^(j/8)` for `j = 0..8`, rounded to f32: the table of the AVX2 `2^w`.
#[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
const EXP2_TABLE: [f32; 8] = [
    1.0,
    1.090_507_7,
    1.189_207_1,
    1.296_839_6,
    std::f32::consts::SQRT_2,
    1.542_210_8,
    1.681_792_9,
    1.834_008_1,
];
/// `a 2^(j/32)` for `j = 0..32` with `a = 0.24265245296912802`, rounded to f32: the
/// table of the AVX-512 `2^w`, whose terms are `2^n A[j] ((r + B)^2 + C)` for
/// `w = n + j/32 + r` rounded down (`0 <= r < 1/32`; [`EXP2_SQ_B`], [`EXP2_SQ_C`]). Fitted by
/// `scripts/fit_exp2_poly.py` to the whole term as the kernel makes it, the table entry
/// and the f32 roundings included: within 2.17e-7 of `2^w`.
#[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
const EXP2_SQ_TABLE: [f32; 32] = [
    0.242_652_45,
    0.247_965_84,
    0.253_395_6,
    0.258_944_24,
    0.264_614_37,
    0.270_408_7,
    0.276_329_85,
    0.282_380_7,
    0.288_564_03,
    0.294_882_74,
    0.301_339_83,
    0.307_938_34,
    0.314_681_3,
    0.321_571_92,
    0.328_613_43,
    0.335_809_14,
    0.343_162_4,
    0.350_676_66,
    0.358_355_5,
    0.366_202_44,
    0.374_221_24,
    0.382_415_62,
    0.390_789_42,
    0.399_346_6,
    0.408_091_16,
    0.417_027_18,
    0.426_158_9,
    0.435_490_55,
    0.445_026_55,
    0.454_771_37,
    0.464_729_58,
    0.474_905_82,
];
/// `B` of [`EXP2_SQ_TABLE`]'s terms.
#[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
const EXP2_SQ_B: f32 = 1.428_223_3;
/// `C` of [`EXP2_SQ_TABLE`]'s terms.
#[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
const EXP2_SQ_C: f32 = 2.081_298_8;
/// `2^r ≈ 1 + r (Q0 + r (Q1 + r Q2))` for `|r| <= 1/16` (`[Q2, Q1, Q0]`; fitted to the
/// relative error by `scripts/fit_exp2_poly.py`, below 3e-8 with these f32 values): the
/// polynomial of the AVX2 `2^w`.
#[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
const EXP2_Q8: [f32; 3] = [0.055_496_834, 0.240_257_62, 0.693_147_24];
/// `2^r ≈ 1 + r (Q0 + r Q1)` for `|r| <= 1/16` (`[Q1, Q0]`; fitted as [`EXP2_Q8`], below
/// 3.5e-6): the AVX2 `2^w` of [`Terms::Coarse`], one multiply-add shorter.
#[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
const EXP2_Q8_COARSE: [f32; 2] = [0.240_226_3, 0.693_308_9];
/// 1.5 * 2^18: adding it to `|w| < 2^17`, rounding down, rounds `w` down to a multiple of
/// 1/32 and leaves `floor(32 w)` in the low mantissa bits (its low 5 bits index
/// [`EXP2_SQ_TABLE`]).
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
/// polynomial `EXP2_P5` (fitted by `scripts/fit_exp2_poly.py`) for `2^f`, and `2^n` built
/// in the exponent bits.
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

/// The loops written for the compiler to vectorise: the dispatchers below compile them
/// once per level (AVX-512, AVX2+FMA, baseline), and alone on other architectures.
mod portable;

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
                    portable::$name($($arg),*)
                }
                #[target_feature(enable = "avx2,fma")]
                #[allow(clippy::too_many_arguments)]
                unsafe fn avx2($($arg: $ty),*) -> $ret {
                    portable::$name($($arg),*)
                }
                match level() {
                    // SAFETY: `level()` detected AVX-512 F/BW/DQ/VL and FMA on this CPU.
                    Level::Avx512 => return unsafe { wide($($arg),*) },
                    // SAFETY: `level()` detected AVX2 and FMA on this CPU.
                    Level::Avx2 => return unsafe { avx2($($arg),*) },
                    Level::Base => {}
                }
            }
            portable::$name($($arg),*)
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
            portable::max_nonfinite(z)
        }
        #[target_feature(enable = "avx2,fma")]
        unsafe fn avx2(z: &[f32]) -> (f32, u64) {
            portable::max_nonfinite(z)
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
    portable::max_nonfinite(z)
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
        Level::Avx512 => return unsafe { avx512::argmax_nonfinite(z) },
        // SAFETY: `level()` detected AVX2 and FMA on this CPU.
        Level::Avx2 => return unsafe { avx2::argmax_nonfinite(z) },
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
        return unsafe { avx2::first_eq(z, v) };
    }
    portable::first_eq(z, v)
}

/// Appends `(base + i, z[i])` for every `z[i] >= thr` (NaN never), in index order,
/// skipping 64-wide blocks with none.
pub fn collect_ge(z: &[f32], base: u32, thr: f32, out: &mut Vec<(u32, f32)>) {
    #[cfg(target_arch = "x86_64")]
    match level() {
        // SAFETY: `level()` detected AVX2 (and FMA) on this CPU.
        Level::Avx512 | Level::Avx2 => unsafe { avx2::collect_ge(z, base, thr, out) },
        // SAFETY: SSE2 is part of x86-64.
        Level::Base => unsafe { sse2::collect_ge(z, base, thr, out) },
    }
    #[cfg(not(target_arch = "x86_64"))]
    portable::collect_ge(z, base, thr, out)
}

/// [`collect_ge`] and the maximum of `z` with whether it holds a NaN or `+inf` (the
/// maximum and what was appended are meaningless then: a variant may gather a NaN):
/// one pass on x86-64, two passes elsewhere.
pub fn collect_ge_max(z: &[f32], base: u32, thr: f32, out: &mut Vec<(u32, f32)>) -> (f32, bool) {
    #[cfg(target_arch = "x86_64")]
    match level() {
        // SAFETY: `level()` detected AVX-512 F on this CPU.
        Level::Avx512 => unsafe { avx512::collect_ge_max(z, base, thr, out) },
        // SAFETY: `level()` detected AVX2 and FMA on this CPU.
        Level::Avx2 => unsafe { avx2::collect_ge_max(z, base, thr, out) },
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

/// AVX-512 loops that fuse several passes ([`collect_ge_max`], [`exp2_sum_collect`]:
/// compares give bit masks directly), and the Philox words and the gated draw.
#[cfg(target_arch = "x86_64")]
mod avx512;

/// Explicit AVX2+FMA loops: the searches whose early exits defeat auto-vectorisation (a
/// compare per value and a branch per block, with a bit mask of the hits), the Philox
/// words and the gated draw, and the top-p normaliser with its gathering.
#[cfg(target_arch = "x86_64")]
mod avx2;

/// The passes over the whole row with the SSE2 every x86-64 CPU has (the `baseline`
/// level), where the compiler's own vectorisation of the generic loops falls short: the
/// top-p normaliser (it kept 32 lanes of sums and its constants in the 16 registers only
/// by moving them around, and could not fuse the gather), and the max with its non-finite
/// check and the gathering by threshold (a count per lane, and a compare per value, where
/// a block's max decides).
#[cfg(target_arch = "x86_64")]
mod sse2;

/// `sum(exp((z - zmax) * scale))` in f32 lanes gathered in f64 (approximate: each term
/// within a few 1e-7 of the exact value).
pub fn exp_sum(z: &[f32], zmax: f32, scale: f32) -> f64 {
    #[cfg(target_arch = "x86_64")]
    {
        #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma")]
        unsafe fn wide(z: &[f32], zmax: f32, scale: f32) -> f64 {
            portable::exp_sum::<true>(z, zmax, scale)
        }
        #[target_feature(enable = "avx2,fma")]
        unsafe fn avx2(z: &[f32], zmax: f32, scale: f32) -> f64 {
            portable::exp_sum::<true>(z, zmax, scale)
        }
        match level() {
            // SAFETY: `level()` detected AVX-512 F/BW/DQ/VL and FMA on this CPU.
            Level::Avx512 => return unsafe { wide(z, zmax, scale) },
            // SAFETY: `level()` detected AVX2 and FMA on this CPU.
            Level::Avx2 => return unsafe { avx2(z, zmax, scale) },
            Level::Base => {}
        }
    }
    portable::exp_sum::<false>(z, zmax, scale)
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
    c: (f32, f32),
    terms: Terms,
    base: u32,
    thr: f32,
    out: &mut Vec<(u32, f32)>,
) -> f64 {
    exp2_terms::<true>(z, c, terms, base, thr, out)
}

/// The sum of [`exp2_sum_collect`] alone: with the same terms, so the two cancel exactly
/// where they cover the same values (up to the order of the additions).
pub fn exp2_sum(z: &[f32], c: (f32, f32), terms: Terms) -> f64 {
    exp2_terms::<false>(z, c, terms, 0, 0.0, &mut Vec::new())
}

/// [`exp2_sum_collect`] (`COLLECT`) or [`exp2_sum`] on this CPU's kernels.
fn exp2_terms<const COLLECT: bool>(
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
            avx512::exp2_sum_collect::<COLLECT>(z, c1, c0, base, thr, out)
        },
        // SAFETY: `level()` detected AVX2 and FMA on this CPU.
        (Level::Avx2, Terms::Precise) => unsafe {
            avx2::exp2_sum_collect::<COLLECT, false>(z, c1, c0, base, thr, out)
        },
        // SAFETY: as above.
        (Level::Avx2, Terms::Coarse) => unsafe {
            avx2::exp2_sum_collect::<COLLECT, true>(z, c1, c0, base, thr, out)
        },
        // SAFETY: SSE2 is part of x86-64.
        (Level::Base, Terms::Precise) => unsafe {
            sse2::exp2_sum_collect::<COLLECT, false>(z, c1, c0, base, thr, out)
        },
        // SAFETY: as above.
        (Level::Base, Terms::Coarse) => unsafe {
            sse2::exp2_sum_collect::<COLLECT, true>(z, c1, c0, base, thr, out)
        },
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        let _ = terms;
        if COLLECT {
            portable::collect_ge(z, base, thr, out);
        }
        portable::exp2_sum::<false>(z, c1, c0)
    }
}

/// `w[i] = exp((z[i] - zmax) scale)` for every `i` (within 3e-7, relative; `w` as long as
/// `z`): the candidates' approximate top-p weights.
pub fn exp_into(z: &[f32], zmax: f32, scale: f32, w: &mut [f32]) {
    #[cfg(target_arch = "x86_64")]
    {
        #[target_feature(enable = "avx512f,avx512bw,avx512dq,avx512vl,avx2,fma")]
        unsafe fn wide(z: &[f32], zmax: f32, scale: f32, w: &mut [f32]) {
            portable::exp_into::<true>(z, zmax, scale, w)
        }
        #[target_feature(enable = "avx2,fma")]
        unsafe fn avx2(z: &[f32], zmax: f32, scale: f32, w: &mut [f32]) {
            portable::exp_into::<true>(z, zmax, scale, w)
        }
        match level() {
            // SAFETY: `level()` detected AVX-512 F/BW/DQ/VL and FMA on this CPU.
            Level::Avx512 => return unsafe { wide(z, zmax, scale, w) },
            // SAFETY: `level()` detected AVX2 and FMA on this CPU.
            Level::Avx2 => return unsafe { avx2(z, zmax, scale, w) },
            Level::Base => {}
        }
    }
    portable::exp_into::<false>(z, zmax, scale, w)
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
            portable::mass_by_y::<true>(z, t, ymax, s, b, m)
        }
        #[target_feature(enable = "avx2,fma")]
        unsafe fn avx2(z: &[f32], t: f32, ymax: f32, s: f32, b: &mut [u16], m: &mut [[f64; 2]]) {
            portable::mass_by_y::<true>(z, t, ymax, s, b, m)
        }
        match level() {
            // SAFETY: `level()` detected AVX-512 F/BW/DQ/VL and FMA on this CPU.
            Level::Avx512 => return unsafe { wide(z, t, ymax, scale, bucket, mass) },
            // SAFETY: `level()` detected AVX2 and FMA on this CPU.
            Level::Avx2 => return unsafe { avx2(z, t, ymax, scale, bucket, mass) },
            Level::Base => {}
        }
    }
    portable::mass_by_y::<false>(z, t, ymax, scale, bucket, mass)
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
    /// Stage 0 in place: `v[i] = -inf` for every token `i` the row's mask disallows
    /// (bit `i % 32` of `mask[i / 32]` clear; `mask` at least `ceil(len / 32)` words).
    pub fn mask_in_place(v: &mut [f32], mask: &[u32]) -> ();
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
            unsafe { avx512::philox_x32(first_block, step, key, out) };
            return;
        }
        // SAFETY: `level()` detected AVX2 on this CPU.
        Level::Avx2 => {
            unsafe { avx2::philox_x32(first_block, step, key, out) };
            return;
        }
        Level::Base => {}
    }
    portable::philox_x32(first_block, step, key, out)
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
            unsafe { avx512::philox_listed(blocks, step, key, out) };
            return;
        }
        // SAFETY: `level()` detected AVX2 on this CPU.
        Level::Avx2 => {
            unsafe { avx2::philox_listed(blocks, step, key, out) };
            return;
        }
        Level::Base => {}
    }
    portable::philox_listed(blocks, step, key, out)
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
            unsafe { avx512::philox_three((96 * t) as u32, &row, &mut words) };
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
                unsafe { avx512::philox_row(b, &row, out) }
            },
        );
    }
    #[cfg(target_arch = "x86_64")]
    if level() == Level::Avx2 {
        // SAFETY: `level()` detected AVX2 on this CPU.
        let row = unsafe { avx2::row_keys(step, key) };
        // SAFETY: as above.
        return each(v, f, |b, out| unsafe {
            avx2::philox_top(b, &row, out);
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
        Level::Avx512 => return unsafe { avx512::gated_chunks(z, step, key, reach, visit) },
        // SAFETY: `level()` detected AVX2 and FMA on this CPU.
        Level::Avx2 => return unsafe { avx2::gated_chunks(z, step, key, reach, visit) },
        Level::Base => {}
    }
    gated_chunks_scalar(z, reach, visit, portable::chunk_max, |b, out| {
        portable::philox_x32(b, step, key, out);
        portable::word_max_top15(out)
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
        return unsafe { avx2::gumbel_reach(full, words, c0, c1) };
    }
    portable::gumbel_reach(&z[..z.len().min(128)], words, c0, c1)
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
        portable::reaches,
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

/// [`portable::chunk_max`] of the row's last, partial chunk, kept out of the gated loops: in
/// line it makes the loop's closure too big to inline, and the loop then pays a call per
/// chunk.
#[cfg(target_arch = "x86_64")]
#[cold]
#[inline(never)]
fn partial_chunk_max(c: &[f32]) -> (f32, bool) {
    portable::chunk_max(c)
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
mod tests;
