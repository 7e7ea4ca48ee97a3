use super::{
    consecutive_products, m0_times, push_hits, RowKeys, EXP2_Q8, EXP2_Q8_COARSE, EXP2_TABLE,
};
use std::arch::x86_64::*;

/// [`super::avx512::philox_x32`] with AVX2: eight chains of 4 blocks, made three,
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
            let blocks = _mm256_add_epi64(_mm256_set1_epi64x(b), _mm256_setr_epi64x(0, 1, 2, 3));
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
pub unsafe fn philox_listed(blocks: &[u32; 32], step: u64, key: [u32; 2], out: &mut [u32; 128]) {
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
// `avx512::philox_rounds`). Words 0-3 end in registers `(b, c, d, a)`.
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
unsafe fn two_chains(first: usize, p0: &[__m256i; 8], row: &Row, out: &mut [u32; 128]) -> __m256i {
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
    let entry = |j: usize| (EXP2_TABLE[j].to_bits() as i32).wrapping_sub((j as i32) << 20);
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
    let [c1q, c0q] = [EXP2_Q8_COARSE[0] / 64.0, EXP2_Q8_COARSE[1] / 8.0].map(|c| _mm256_set1_ps(c));
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
    let any_ge = |a: __m256, b: __m256| _mm256_movemask_ps(_mm256_cmp_ps::<_CMP_GE_OQ>(a, b)) != 0;
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
