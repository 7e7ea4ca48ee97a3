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

/// `v[i] = -inf` for every token `i` whose bit `i % 32` of `mask[i / 32]` is clear.
#[inline(always)]
pub fn mask_in_place(v: &mut [f32], mask: &[u32]) {
    for (x, &word) in v.chunks_mut(32).zip(mask) {
        match word {
            u32::MAX => {}
            0 => x.fill(f32::NEG_INFINITY),
            _ if x.len() == 32 => {
                for (j, e) in x.iter_mut().enumerate() {
                    // a bit mask, not a branch, so the loop vectorises
                    let off = 0u32.wrapping_sub((word >> j) & 1 ^ 1);
                    *e = f32::from_bits((e.to_bits() & !off) | (f32::NEG_INFINITY.to_bits() & off));
                }
            }
            _ => {
                for (j, e) in x.iter_mut().enumerate() {
                    if (word >> j) & 1 == 0 {
                        *e = f32::NEG_INFINITY;
                    }
                }
            }
        }
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
    count_where(z, |x| x > v) + count_where(&z[..idx], |x| x == v)
}

/// How many values of `z` pass `f`: sums of 0/1 over contiguous values, which the
/// compiler turns into vector compares and adds (u32 sums over spans of 2^16, so they
/// cannot overflow).
#[inline(always)]
fn count_where(z: &[f32], f: impl Fn(f32) -> bool) -> u64 {
    z.chunks(1 << 16)
        .map(|c| u64::from(c.iter().map(|&x| u32::from(f(x))).sum::<u32>()))
        .sum()
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
        head = unsafe { super::avx512::qdot_blocks(BITS, group, row, blocks, scales, biases, xp) };
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
