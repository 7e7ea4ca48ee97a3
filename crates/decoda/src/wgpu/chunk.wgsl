// One vec4<u32> of a weight row in its format, against a row of inputs: the inner step
// of the matrix products (model/mv.wgsl) and the MoE layer's (moe.wgsl). The launcher
// prefixes `DTYPE` (0 f32, 1 bf16, 2 f16, 3 affine) and `BITS` (affine codes), so there
// is no format branch at run time; the including module defines
// `xin(sel, base, i, n) -> f32`, input i of the row at `base` (0 past its `n` inputs).
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

// Chunk `w` of a weight row (its first input `i0`) against the inputs at `base`.
fn chunk_dot(w: vec4<u32>, i0: u32, sel: u32, base: u32, n: u32, sc: f32, bi: f32) -> f32 {
    var acc = 0.0;
    if (DTYPE == 0u) {
        for (var k = 0u; k < 4u; k = k + 1u) {
            acc = acc + bitcast<f32>(w[k]) * xin(sel, base, i0 + k, n);
        }
        return acc;
    }
    if (DTYPE <= 2u) {
        for (var k = 0u; k < 4u; k = k + 1u) {
            let i = i0 + 2u * k;
            var lo: f32;
            var hi: f32;
            if (DTYPE == 1u) {
                lo = bitcast<f32>(w[k] << 16u);
                hi = bitcast<f32>(w[k] & 0xffff0000u);
            } else {
                lo = f16_of(w[k] & 0xffffu);
                hi = f16_of(w[k] >> 16u);
            }
            acc = acc + lo * xin(sel, base, i, n);
            acc = acc + hi * xin(sel, base, i + 1u, n);
        }
        return acc;
    }
    // affine: codes from the low bits up
    let per = 32u / BITS;
    let mask = (1u << BITS) - 1u;
    var qx = 0.0;
    var sx = 0.0;
    for (var k = 0u; k < 4u; k = k + 1u) {
        for (var j = 0u; j < per; j = j + 1u) {
            let x = xin(sel, base, i0 + k * per + j, n);
            qx = qx + f32((w[k] >> (BITS * j)) & mask) * x;
            sx = sx + x;
        }
    }
    return sc * qx + bi * sx;
}
