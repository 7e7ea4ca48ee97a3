// The MoE layer's input rows and activations as single floats: for layers whose hidden
// or intermediate width is not a whole number of vec4s (moe.rs picks this or
// moe_x4.wgsl per layer).
@group(0) @binding(2) var<storage, read> xs: array<f32>;
@group(0) @binding(7) var<storage, read_write> acts: array<f32>;

// Float i of the input.
fn xs_f(i: u32) -> f32 {
    return xs[i];
}

// Float i of the activations.
fn acts_f(i: u32) -> f32 {
    return acts[i];
}

// Activations at .. at + n - 1 = v's first n values (n <= 4).
fn put_act4(at: u32, v: vec4<f32>, n: u32) {
    for (var i = 0u; i < n; i = i + 1u) {
        acts[at + i] = v[i];
    }
}

// Inputs i .. i + 3 of the row at `base`, as xin gives them.
fn xin4(sel: u32, base: u32, i: u32, n: u32) -> vec4<f32> {
    return xin4_floats(sel, base, i, n);
}
