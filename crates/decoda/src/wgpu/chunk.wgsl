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

// A chunk's inputs, i0 .. i0 + per_chunk() of the row at `base` (0 past its `n`), read
// once: the tiled products (tile.wgsl) use them against several weight rows.
fn chunk_x(sel: u32, base: u32, i0: u32, n: u32) -> array<f32, 32> {
    var xv: array<f32, 32>;
    for (var k = 0u; k < per_chunk(); k = k + 1u) {
        xv[k] = xin(sel, base, i0 + k, n);
    }
    return xv;
}

// An affine chunk's sum(x), in input order (0 for the other formats, which need none).
fn chunk_sum(xv: array<f32, 32>) -> f32 {
    var sx = 0.0;
    if (DTYPE == 3u) {
        for (var k = 0u; k < per_chunk(); k = k + 1u) {
            sx = sx + xv[k];
        }
    }
    return sx;
}

// Chunk `w` of a weight row against its inputs `xv` (`sx` their chunk_sum): every
// product's one definition, so the matrix-vector and the tiled kernels give the same bits.
fn chunk_dot_x(w: vec4<u32>, xv: array<f32, 32>, sx: f32, sc: f32, bi: f32) -> f32 {
    var acc = 0.0;
    if (DTYPE == 0u) {
        for (var k = 0u; k < 4u; k = k + 1u) {
            acc = acc + bitcast<f32>(w[k]) * xv[k];
        }
        return acc;
    }
    if (DTYPE <= 2u) {
        for (var k = 0u; k < 4u; k = k + 1u) {
            var lo: f32;
            var hi: f32;
            if (DTYPE == 1u) {
                lo = bitcast<f32>(w[k] << 16u);
                hi = bitcast<f32>(w[k] & 0xffff0000u);
            } else {
                lo = f16_of(w[k] & 0xffffu);
                hi = f16_of(w[k] >> 16u);
            }
            acc = acc + lo * xv[2u * k];
            acc = acc + hi * xv[2u * k + 1u];
        }
        return acc;
    }
    // affine: codes from the low bits up
    let per = 32u / BITS;
    let mask = (1u << BITS) - 1u;
    var qx = 0.0;
    for (var k = 0u; k < 4u; k = k + 1u) {
        for (var j = 0u; j < per; j = j + 1u) {
            qx = qx + f32((w[k] >> (BITS * j)) & mask) * xv[k * per + j];
        }
    }
    return sc * qx + bi * sx;
}

// Chunk `w` of a weight row (its first input `i0`) against the inputs at `base`.
fn chunk_dot(w: vec4<u32>, i0: u32, sel: u32, base: u32, n: u32, sc: f32, bi: f32) -> f32 {
    let xv = chunk_x(sel, base, i0, n);
    return chunk_dot_x(w, xv, chunk_sum(xv), sc, bi);
}
