// The products' inputs as single floats: for calls whose rows or widths are not whole
// vec4s (model/mod.rs picks this or mv_x4.wgsl per matrix).
@group(0) @binding(3) var<storage, read> src: array<f32>;

// Float i of src.
fn srcf(i: u32) -> f32 {
    return src[i];
}

// Inputs i .. i + 3 of the call row at `base`, as xin gives them.
fn xin4(sel: u32, base: u32, i: u32, n: u32) -> vec4<f32> {
    return xin4_floats(sel, base, i, n);
}
