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

// acc + the word's two 16-bit values (low half first) times a and b.
fn half_word(acc: f32, w: u32, a: f32, b: f32) -> f32 {
    var lo: f32;
    var hi: f32;
    if (DTYPE == 1u) {
        lo = bitcast<f32>(w << 16u);
        hi = bitcast<f32>(w & 0xffff0000u);
    } else {
        lo = f16_of(w & 0xffffu);
        hi = f16_of(w >> 16u);
    }
    let s = acc + lo * a;
    return s + hi * b;
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

// qx + the word's eight 4-bit codes (low bits first) times a, then b.
fn q4_word(qx: f32, w: u32, a: vec4<f32>, b: vec4<f32>) -> f32 {
    let lo = codes_f32((vec4<u32>(w) >> vec4<u32>(0u, 4u, 8u, 12u)) & vec4<u32>(15u));
    let hi = codes_f32((vec4<u32>(w) >> vec4<u32>(16u, 20u, 24u, 28u)) & vec4<u32>(15u));
    var s = qx;
    s = s + lo.x * a.x;
    s = s + lo.y * a.y;
    s = s + lo.z * a.z;
    s = s + lo.w * a.w;
    s = s + hi.x * b.x;
    s = s + hi.y * b.y;
    s = s + hi.z * b.z;
    s = s + hi.w * b.w;
    return s;
}

// qx + the word's four 8-bit codes (low bits first) times a.
fn q8_word(qx: f32, w: u32, a: vec4<f32>) -> f32 {
    let q = codes_f32((vec4<u32>(w) >> vec4<u32>(0u, 8u, 16u, 24u)) & vec4<u32>(255u));
    var s = qx;
    s = s + q.x * a.x;
    s = s + q.y * a.y;
    s = s + q.z * a.z;
    s = s + q.w * a.w;
    return s;
}

// Chunk `w` of a weight row against its inputs `xv` (`sx` their chunk_sum): every
// product's one definition, so the matrix-vector and the tiled kernels give the same
// bits. Each sum runs in input order: f32 and 16-bit weights w * x, affine codes
// scale * sum(q x) + bias * sum(x).
fn chunk_dot_x(w: vec4<u32>, xv: XChunk, sx: f32, sc: f32, bi: f32) -> f32 {
    if (DTYPE == 0u) {
        var acc = 0.0;
        acc = acc + bitcast<f32>(w.x) * xv.v0.x;
        acc = acc + bitcast<f32>(w.y) * xv.v0.y;
        acc = acc + bitcast<f32>(w.z) * xv.v0.z;
        acc = acc + bitcast<f32>(w.w) * xv.v0.w;
        return acc;
    }
    if (DTYPE <= 2u) {
        var acc = half_word(0.0, w.x, xv.v0.x, xv.v0.y);
        acc = half_word(acc, w.y, xv.v0.z, xv.v0.w);
        acc = half_word(acc, w.z, xv.v1.x, xv.v1.y);
        return half_word(acc, w.w, xv.v1.z, xv.v1.w);
    }
    // affine: codes from the low bits up
    var qx = 0.0;
    if (BITS == 4u) {
        qx = q4_word(qx, w.x, xv.v0, xv.v1);
        qx = q4_word(qx, w.y, xv.v2, xv.v3);
        qx = q4_word(qx, w.z, xv.v4, xv.v5);
        qx = q4_word(qx, w.w, xv.v6, xv.v7);
    } else {
        qx = q8_word(qx, w.x, xv.v0);
        qx = q8_word(qx, w.y, xv.v1);
        qx = q8_word(qx, w.z, xv.v2);
        qx = q8_word(qx, w.w, xv.v3);
    }
    return sc * qx + bi * sx;
}

// Chunk `w` of a weight row (its first input `i0`) against the inputs at `base`.
fn chunk_dot(w: vec4<u32>, i0: u32, sel: u32, base: u32, n: u32, sc: f32, bi: f32) -> f32 {
    let xv = chunk_x(sel, base, i0, n);
    return chunk_dot_x(w, xv, chunk_sum(xv), sc, bi);
}
