// The products' inputs as vec4s, for matrices whose input width and call rows are whole
// vec4s (every real model's: model/mod.rs picks this or mv_x1.wgsl per matrix): a chunk's
// inputs load four at a time (a 4-bit chunk's 32 inputs in 8 loads, not 32), and no
// unaligned path sits beside the vector one. Inputs i .. i + 3 of a row lie in one vec4
// (i a multiple of 4); past the row's n inputs all four are 0, as xin gives them.
@group(0) @binding(3) var<storage, read> src: array<vec4<f32>>;

// Float i of src.
fn srcf(i: u32) -> f32 {
    return src[i >> 2u][i & 3u];
}

// Inputs i .. i + 3 of the call row at `base` (a multiple of 4), normed as the `rms`
// kernel writes them unless `sel` is RAW: xin's four values in one load.
fn xin4(sel: u32, base: u32, i: u32, n: u32) -> vec4<f32> {
    let k = min(i, n - 4u);
    let v = src[(base + k) >> 2u];
    let a = op.aux_off + k;
    let w = vec4<f32>(bitcast<f32>(aux[a]), bitcast<f32>(aux[a + 1u]), bitcast<f32>(aux[a + 2u]),
                      bitcast<f32>(aux[a + 3u]));
    // (as xin: `sel` is RAW in every call of the entry points that do not norm)
    let normed = fp4(v * invs[min(sel, 7u)]) * w;
    return select(vec4<f32>(0.0), select(normed, v, sel == RAW), i < n);
}
