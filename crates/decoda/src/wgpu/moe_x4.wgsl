// The MoE layer's input rows as vec4s, for layers whose hidden width is a whole number
// of vec4s (every real model's: moe.rs picks this or moe_x1.wgsl per layer): the
// experts' gate and up products load a chunk's inputs four at a time (a 4-bit chunk's 32
// inputs in 8 loads). The input buffer holds at least n x D floats, so every vec4 of a
// row lies inside it. The down products read the activations from `work` (`sel` 1) one
// float at a time.
@group(0) @binding(2) var<storage, read> xs: array<vec4<f32>>;

// Float i of the input.
fn xs_f(i: u32) -> f32 {
    return xs[i >> 2u][i & 3u];
}

// Inputs i .. i + 3 (i a multiple of 4) of the row at `base` (a multiple of 4 for the
// input rows), as xin gives them: one load from the input rows.
fn xin4(sel: u32, base: u32, i: u32, n: u32) -> vec4<f32> {
    if (sel == 0u) {
        let k = min(i, n - 4u);
        return select(vec4<f32>(0.0), xs[(base + k) >> 2u], i < n);
    }
    return vec4<f32>(xin(sel, base, i, n), xin(sel, base, i + 1u, n), xin(sel, base, i + 2u, n),
                     xin(sel, base, i + 3u, n));
}
