// The MoE layer's input rows and activations as vec4s, for layers whose hidden and
// intermediate widths are whole numbers of vec4s (every real model's: moe.rs picks this
// or moe_x1.wgsl per layer): the experts' products load a chunk's inputs four at a time
// (a 4-bit chunk's 32 inputs in 8 loads), and the gate/up products write their outputs
// four at a time. The input buffer holds at least n x D floats, so every vec4 of a row
// lies inside it; the activations' rows start at multiples of 4 (`w_act` is 0).
@group(0) @binding(2) var<storage, read> xs: array<vec4<f32>>;
@group(0) @binding(7) var<storage, read_write> acts: array<vec4<f32>>;

// Float i of the input.
fn xs_f(i: u32) -> f32 {
    return xs[i >> 2u][i & 3u];
}

// Float i of the activations.
fn acts_f(i: u32) -> f32 {
    return acts[i >> 2u][i & 3u];
}

// Activations at .. at + 3 = v (`at` a multiple of 4; n is 4 when H is whole vec4s).
fn put_act4(at: u32, v: vec4<f32>, n: u32) {
    acts[at >> 2u] = v;
}

// Inputs i .. i + 3 (i a multiple of 4) of the row at `base` (a multiple of 4), as xin
// gives them, in one load: from the input rows (`sel` 0) or the activations (1).
fn xin4(sel: u32, base: u32, i: u32, n: u32) -> vec4<f32> {
    let k = min(i, n - 4u);
    var v: vec4<f32>;
    if (sel == 0u) {
        v = xs[(base + k) >> 2u];
    } else {
        v = acts[(base + k) >> 2u];
    }
    return select(vec4<f32>(0.0), v, i < n);
}
