// Philox's 32 x 32 -> 64-bit product, (high word, low word), in one 64-bit multiply:
// on devices with 64-bit integers (wgpu's SHADER_INT64). The same bits as mulhi32.wgsl,
// which `philox_matches_the_cpu` (tests/suite/wgpu_fmath.rs) checks against the CPU's
// Philox, word for word, and `variants_give_the_same_bits` (tests/suite/wgpu_sampler.rs)
// on the same rows.
fn mulhilo(a: u32, b: u32) -> vec2<u32> {
    let p = u64(a) * u64(b);
    return vec2<u32>(u32(p >> 32u), u32(p));
}
