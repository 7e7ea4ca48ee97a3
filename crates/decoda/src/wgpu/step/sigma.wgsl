// ---------------------------------------------------------------------------------
// Stage 5a, top-n-σ, on the device: the threshold `ymax - n σ` over a row's finite y,
// by the full-row path's workgroup in one read of the row (after the scan's count and
// minimum). The sums are integers (fixed point scaled to the row's range), so they are
// the same in any order, for any split of the row and either reduction, and the
// variance's numerator n Σ q^2 - (Σ q)^2 is exact in 128-bit integers; the f32 steps
// after it leave the threshold within about 3e-7 (|ymax| + n σ) of the contract's f64
// one (its tie band: 1e-6).

// 2^e for -126 <= e <= 127.
fn pow2(e: i32) -> f32 {
    return bitcast<f32>(u32(e + 127) << 23u);
}

// a * b as (low word, high word).
fn mul_wide(a: u32, b: u32) -> vec2<u32> {
    let m = mulhilo(a, b);
    return vec2<u32>(m.y, m.x);
}

// 128-bit integers, four words least significant first, modulo 2^128.
fn add128(a: vec4<u32>, b: vec4<u32>) -> vec4<u32> {
    let lo = a.x + b.x;
    let c0 = select(0u, 1u, lo < a.x);
    let m1 = a.y + b.y;
    let w1 = m1 + c0;
    let c1 = select(0u, 1u, m1 < a.y) + select(0u, 1u, w1 < m1);
    let m2 = a.z + b.z;
    let w2 = m2 + c1;
    let c2 = select(0u, 1u, m2 < a.z) + select(0u, 1u, w2 < m2);
    return vec4<u32>(lo, w1, w2, a.w + b.w + c2);
}

fn sub128(a: vec4<u32>, b: vec4<u32>) -> vec4<u32> {
    return add128(a, add128(~b, vec4<u32>(1u, 0u, 0u, 0u)));
}

fn val128(a: vec4<u32>) -> f32 {
    let hi = fp(fp(f32(a.w) * 79228162514264337593543950336.0) + fp(f32(a.z) * 18446744073709551616.0));
    return fp(fp(hi + fp(f32(a.y) * 4294967296.0)) + f32(a.x));
}

// q^2 for q < 2^35 (two words), below 2^70: three words.
fn square35(q: vec2<u32>) -> vec3<u32> {
    let l = mul_wide(q.x, q.x);
    let m = mul_wide(q.x, 2u * q.y);
    return add96(vec3<u32>(l, 0u), vec3<u32>(0u, m.x, m.y + q.y * q.y));
}

// The top-n-σ threshold of a sampling row (ymax finite): `ymax - n σ`, σ the population
// standard deviation of the row's `n` finite y, the smallest `ymin` (from the scan: y
// never decreases as z grows, so it is `RN(min z / T)`). With `d = ymax - y` (f32,
// 0 <= d <= D = ymax - ymin < 2^(e+1)) and `q = floor(d 2^(34-e))` (below 2^35), one
// read sums Σ q (below 2^54) and Σ q^2 (below 2^89); then
// σ = sqrt(n Σ q^2 - (Σ q)^2) / n 2^(e-34) (the scaling is exact, so no f32 overflows
// or underflows for any range). A range below 2^-90 counts as σ = 0. Every invocation
// gets the threshold; call from uniform control flow.
fn sigma_threshold(lid: u32, row: u32, slot: u32, sp: SlotP, ymax: f32, n: u32,
                   ymin: f32) -> f32 {
    let t = sp.temperature;
    let range = fp(ymax - ymin);
    let e = i32((bitcast<u32>(range) >> 23u) & 0xffu) - 127;
    if (n <= 1u || e < -90) {
        return ymax;
    }
    var s1 = vec3<u32>(0u, 0u, 0u);
    var s2 = vec3<u32>(0u, 0u, 0u);
    for (var i = lid; i < call.vocab; i = i + WG) {
        let z = z_of(slot, sp, i, load_x(row, i));
        if (is_neg_inf(z)) {
            continue;
        }
        let q = fixed_at(fp(ymax - div_rn_cold(z, t)), 34 - e);
        s1 = add96(s1, q);
        s2 = add96(s2, square35(q.xy));
    }
    let a = wg_sum96(lid, s2);
    let b = wg_sum96(lid, s1);
    // n Σ q^2 and (Σ q)^2 (Σ q below 2^54: two words), each below 2^108
    let na = add128(
        add128(vec4<u32>(mul_wide(a.x, n), 0u, 0u), vec4<u32>(0u, mul_wide(a.y, n), 0u)),
        vec4<u32>(0u, 0u, mul_wide(a.z, n)),
    );
    let cross = vec4<u32>(0u, mul_wide(b.x, b.y), 0u);
    let bb = add128(
        add128(vec4<u32>(mul_wide(b.x, b.x), 0u, 0u), add128(cross, cross)),
        vec4<u32>(0u, 0u, mul_wide(b.y, b.y)),
    );
    let sigma = fp(fp(sqrt(val128(sub128(na, bb))) / f32(n)) * pow2(e - 34));
    return fp(ymax - fp(sp.top_n_sigma * sigma));
}
