// One vec4<u32> of a weight row in its format, against a row of inputs: the inner step
// of the matrix products (model/mv.wgsl) and the MoE layer's (moe.wgsl). The launcher
// prefixes `DTYPE` (0 f32, 1 bf16, 2 f16, 3 affine), `BITS` (affine codes) and `GROUP`
// (inputs per affine group), so there is no format branch and no division by a run-time
// group size; the including module defines
// `xin4(sel, base, i, n) -> vec4<f32>`, inputs i .. i + 3 (i a multiple of 4) of the row
// at `base`, each 0 past its `n` inputs.
// Affine chunks lie in one group (groups hold 32, 64 or 128 inputs, a chunk 32 or 16):
// scale * sum(q x) + bias * sum(x).

// Inputs per vec4<u32> of weights.
fn per_chunk() -> u32 {
    if (DTYPE == 0u) {
        return 4u;
    }
    if (DTYPE <= 2u) {
        return 8u;
    }
    return 128u / BITS;
}

// A chunk's inputs (at most 32) as eight vec4s, v0 holding inputs 0 .. 3 and so on:
// named fields, never an array indexed at run time, so every value stays in a register
// (a private array indexed in a loop can live in slow local memory on a GPU, and its
// loads then run one after another; issue 55's H200 profile).
struct XChunk {
    v0: vec4<f32>,
    v1: vec4<f32>,
    v2: vec4<f32>,
    v3: vec4<f32>,
    v4: vec4<f32>,
    v5: vec4<f32>,
    v6: vec4<f32>,
    v7: vec4<f32>,
}

// Inputs i .. i + 3 of the row at `base` one float at a time, through the including
// module's `xin(sel, base, i, n) -> f32` (the scalar-load modules' xin4).
fn xin4_floats(sel: u32, base: u32, i: u32, n: u32) -> vec4<f32> {
    return vec4<f32>(xin(sel, base, i, n), xin(sel, base, i + 1u, n), xin(sel, base, i + 2u, n),
                     xin(sel, base, i + 3u, n));
}

// Inputs i .. i + 3 of the row at `base` (the including module's xin4).
fn x4(sel: u32, base: u32, i: u32, n: u32) -> vec4<f32> {
    return xin4(sel, base, i, n);
}

// A chunk's inputs, i0 .. i0 + per_chunk() of the row at `base` (0 past its `n`), read
// once: the tiled products (tile.wgsl) use them against several weight rows. Every load
// is issued before any is used.
fn chunk_x(sel: u32, base: u32, i0: u32, n: u32) -> XChunk {
    let pc = per_chunk();
    let z = vec4<f32>(0.0);
    var c = XChunk(z, z, z, z, z, z, z, z);
    c.v0 = x4(sel, base, i0, n);
    if (pc > 4u) {
        c.v1 = x4(sel, base, i0 + 4u, n);
    }
    if (pc > 8u) {
        c.v2 = x4(sel, base, i0 + 8u, n);
        c.v3 = x4(sel, base, i0 + 12u, n);
    }
    if (pc > 16u) {
        c.v4 = x4(sel, base, i0 + 16u, n);
        c.v5 = x4(sel, base, i0 + 20u, n);
        c.v6 = x4(sel, base, i0 + 24u, n);
        c.v7 = x4(sel, base, i0 + 28u, n);
    }
    return c;
}

// s + the four values, in order.
fn sum4(s: f32, v: vec4<f32>) -> f32 {
    return s + v.x + v.y + v.z + v.w;
}

// An affine chunk's sum(x), in input order (0 for the other formats, which need none).
fn chunk_sum(xv: XChunk) -> f32 {
    var sx = 0.0;
    if (DTYPE == 3u) {
        sx = sum4(sum4(sum4(sum4(sx, xv.v0), xv.v1), xv.v2), xv.v3);
        if (BITS == 4u) {
            sx = sum4(sum4(sum4(sum4(sx, xv.v4), xv.v5), xv.v6), xv.v7);
        }
    }
    return sx;
}

// Four codes (each below 2^23) as floats, exactly, without an integer-to-float
// conversion: the code set into the mantissa of 2^23 is the float 2^23 + q, and taking
// 2^23 away is exact (Sterbenz). A conversion issues at an eighth of a multiply-add's
// rate on NVIDIA's SMs (16 against 128 a clock; CUDA's table of instruction throughput),
// an OR and a subtraction at full rate: the affine formats' inner step spends most of
// its issue slots on turning codes into floats.
fn codes_f32(q: vec4<u32>) -> vec4<f32> {
    return bitcast<vec4<f32>>(q | vec4<u32>(0x4b000000u)) - vec4<f32>(8388608.0);
}

// The 16-bit value in the low (`hi` false) or high half of w, as f32 (exact).
fn half_f32(w: u32, hi: bool) -> f32 {
    if (DTYPE == 1u) {
        return bitcast<f32>(select(w << 16u, w & 0xffff0000u, hi));
    }
    return f16_of(select(w & 0xffffu, w >> 16u, hi));
}

// The eight 4-bit codes of w (low bits first) as floats: the first four, then the last.
fn q4_lo(w: u32) -> vec4<f32> {
    return codes_f32((vec4<u32>(w) >> vec4<u32>(0u, 4u, 8u, 12u)) & vec4<u32>(15u));
}

fn q4_hi(w: u32) -> vec4<f32> {
    return codes_f32((vec4<u32>(w) >> vec4<u32>(16u, 20u, 24u, 28u)) & vec4<u32>(15u));
}

// The four 8-bit codes of w (low bits first) as floats.
fn q8_of(w: u32) -> vec4<f32> {
    return codes_f32((vec4<u32>(w) >> vec4<u32>(0u, 8u, 16u, 24u)) & vec4<u32>(255u));
}

// A weight chunk's values as floats in input order (XChunk's layout, v0 first): f32 or
// 16-bit weights, or affine codes (their scale and bias apply in chunk_dot_q). Exact, so
// a chunk unpacked once serves every call row it meets.
fn chunk_w(w: vec4<u32>) -> XChunk {
    let z = vec4<f32>(0.0);
    var c = XChunk(z, z, z, z, z, z, z, z);
    if (DTYPE == 0u) {
        c.v0 = bitcast<vec4<f32>>(w);
    } else if (DTYPE <= 2u) {
        c.v0 = vec4<f32>(half_f32(w.x, false), half_f32(w.x, true), half_f32(w.y, false),
                         half_f32(w.y, true));
        c.v1 = vec4<f32>(half_f32(w.z, false), half_f32(w.z, true), half_f32(w.w, false),
                         half_f32(w.w, true));
    } else if (BITS == 4u) {
        c.v0 = q4_lo(w.x);
        c.v1 = q4_hi(w.x);
        c.v2 = q4_lo(w.y);
        c.v3 = q4_hi(w.y);
        c.v4 = q4_lo(w.z);
        c.v5 = q4_hi(w.z);
        c.v6 = q4_lo(w.w);
        c.v7 = q4_hi(w.w);
    } else {
        c.v0 = q8_of(w.x);
        c.v1 = q8_of(w.y);
        c.v2 = q8_of(w.z);
        c.v3 = q8_of(w.w);
    }
    return c;
}

// s + the four products q * x, in order.
fn dot_seq(s: f32, q: vec4<f32>, x: vec4<f32>) -> f32 {
    var r = s;
    r = r + q.x * x.x;
    r = r + q.y * x.y;
    r = r + q.z * x.z;
    r = r + q.w * x.w;
    return r;
}

// A chunk's weights `q` (chunk_w's floats, or the same floats staged by a tile) against
// its inputs `xv` (`sx` their chunk_sum): every product's one definition, so the
// matrix-vector and the tiled kernels give the same bits. Each sum runs in input order:
// f32 and 16-bit weights w * x, affine codes scale * sum(q x) + bias * sum(x).
fn chunk_dot_q(q: XChunk, xv: XChunk, sx: f32, sc: f32, bi: f32) -> f32 {
    var s = dot_seq(0.0, q.v0, xv.v0);
    if (DTYPE == 0u) {
        return s;
    }
    s = dot_seq(s, q.v1, xv.v1);
    if (DTYPE <= 2u) {
        return s;
    }
    s = dot_seq(s, q.v2, xv.v2);
    s = dot_seq(s, q.v3, xv.v3);
    if (BITS == 4u) {
        s = dot_seq(s, q.v4, xv.v4);
        s = dot_seq(s, q.v5, xv.v5);
        s = dot_seq(s, q.v6, xv.v6);
        s = dot_seq(s, q.v7, xv.v7);
    }
    return sc * s + bi * sx;
}

// Chunk `w` of a weight row against its inputs `xv` (`sx` their chunk_sum).
fn chunk_dot_x(w: vec4<u32>, xv: XChunk, sx: f32, sc: f32, bi: f32) -> f32 {
    return chunk_dot_q(chunk_w(w), xv, sx, sc, bi);
}

// Chunk `w` of a weight row (its first input `i0`) against the inputs at `base`.
fn chunk_dot(w: vec4<u32>, i0: u32, sel: u32, base: u32, n: u32, sc: f32, bi: f32) -> f32 {
    let xv = chunk_x(sel, base, i0, n);
    return chunk_dot_x(w, xv, chunk_sum(xv), sc, bi);
}
