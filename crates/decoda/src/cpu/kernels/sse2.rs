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
pub fn collect_ge_max(z: &[f32], base: u32, thr: f32, out: &mut Vec<(u32, f32)>) -> (f32, bool) {
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
