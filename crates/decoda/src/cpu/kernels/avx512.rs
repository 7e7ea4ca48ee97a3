use super::{consecutive_products, m0_times, push_hits, RowKeys};
use super::{EXP2_SQ_B, EXP2_SQ_C, EXP2_SQ_TABLE, MAGIC32};
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
pub unsafe fn philox_listed(blocks: &[u32; 32], step: u64, key: [u32; 2], out: &mut [u32; 128]) {
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
unsafe fn pairs_reach(pairs: &Pairs, z: &[f32], out: &mut [u32; 128], c0: f32, c1: f32) -> u128 {
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
pub unsafe fn words_and_top(first_block: u32, step: u64, key: [u32; 2]) -> ([u32; 16], [u32; 128]) {
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

/// The full 16-word blocks of an affine row's dot product (see `portable::qdot`): the
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
            _mm512_loadu_ps(EXP2_SQ_TABLE.as_ptr()),
            _mm512_loadu_ps(EXP2_SQ_TABLE.as_ptr().add(16)),
        )
    };
    let (vc1, vc0, vthr) = (_mm512_set1_ps(c1), _mm512_set1_ps(c0), _mm512_set1_ps(thr));
    let (b, c, magic) = (
        _mm512_set1_ps(EXP2_SQ_B),
        _mm512_set1_ps(EXP2_SQ_C),
        _mm512_set1_ps(MAGIC32),
    );
    // 2^w = 2^n 2^(j/32) 2^r with w rounded down to a multiple of 1/32 (n + j/32) and
    // 0 <= r < 1/32, each part from w itself in one operation, all rounding down:
    // `vreduceps` gives r (and 0 for ±inf, so -inf adds 0 and +inf gives +inf),
    // `w + MAGIC32` puts j in the index bits, and `vscalefps` multiplies by 2^floor(w)
    // = 2^n. The quadratic in r is a ((r + B)^2 + C) with `a` in the table: an add and
    // a multiply-add, neither of which overwrites what is used again.
    const DOWN: i32 = _MM_FROUND_TO_NEG_INF | _MM_FROUND_NO_EXC;
    let term = |x: __m512| {
        let w = _mm512_fmadd_ps(x, vc1, vc0);
        let r = _mm512_reduce_ps::<{ 5 << 4 | 1 }>(w);
        let j = _mm512_castps_si512(_mm512_add_round_ps::<DOWN>(w, magic));
        let t = _mm512_permutex2var_ps(tlo, j, thi);
        let u = _mm512_add_ps(r, b);
        let p = _mm512_fmadd_ps(u, u, c);
        (_mm512_scalef_ps(t, w), p)
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
        let x = unsafe { _mm512_mask_loadu_ps(_mm512_set1_ps(f32::NEG_INFINITY), lanes, p.add(i)) };
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
