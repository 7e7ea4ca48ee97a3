// An IEEE half's bits as f32, exactly (written out: unpack2x16float needs a capability
// some backends lack). Shared by the model's, the matrix products' and the MoE modules.
fn f16_of(h: u32) -> f32 {
    let sgn = (h & 0x8000u) << 16u;
    let e = (h >> 10u) & 0x1fu;
    let m = h & 0x3ffu;
    if (e == 31u) {
        return bitcast<f32>(sgn | 0x7f800000u | (m << 13u));
    }
    if (e == 0u) {
        let v = f32(m) * 5.9604645e-8;
        return bitcast<f32>(bitcast<u32>(v) | sgn);
    }
    return bitcast<f32>(sgn | ((e + 112u) << 23u) | (m << 13u));
}
