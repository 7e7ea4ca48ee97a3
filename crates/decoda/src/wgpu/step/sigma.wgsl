// ---------------------------------------------------------------------------------
// Stage 5a, top-n-σ, on the device: the threshold `ymax - n σ` over a row's finite y,
// by the full-row path's workgroup in two reads of the row (after the scan's count and
// minimum). The sums are integers (fixed point scaled to the row's range), so they are
// the same in any order, for any split of the row and either reduction; the f32 steps
// around them leave the threshold within about 3e-7 (|ymax| + n σ) of the contract's
// f64 one (its tie band: 1e-6).

// 2^e for -126 <= e <= 127.
fn pow2(e: i32) -> f32 {
    return bitcast<f32>(u32(e + 127) << 23u);
}

// The top-n-σ threshold of a sampling row (ymax finite): `ymax - n σ`, σ the population
// standard deviation of the row's `n` finite y, the smallest `ymin` (from the scan: y
// never decreases as z grows, so it is `RN(min z / T)`). With `d = ymax - y` (f32,
// 0 <= d <= D = ymax - ymin < 2^(e+1)), two reads of the row:
//   Σ floor(d 2^(34-e)) (each below 2^35), so the mean d̄ = Σ / n 2^(e-34);
//   Σ floor(((d - d̄) 2^(34-e))^2), so σ = sqrt(Σ / n) 2^(e-34)
// (the scaling is exact, so no f32 overflows or underflows for any range). A range
// below 2^-90 counts as σ = 0. Every invocation gets the threshold; call from uniform
// control flow.
fn sigma_threshold(lid: u32, row: u32, slot: u32, sp: SlotP, ymax: f32, n: u32,
                   ymin: f32) -> f32 {
    let t = sp.temperature;
    let range = fp(ymax - ymin);
    let e = i32((bitcast<u32>(range) >> 23u) & 0xffu) - 127;
    if (n <= 1u || e < -90) {
        return ymax;
    }
    let s1 = 34 - e;
    var acc = vec3<u32>(0u, 0u, 0u);
    for (var i = lid; i < call.vocab; i = i + WG) {
        let z = z_of(slot, sp, i, load_x(row, i));
        if (is_neg_inf(z)) {
            continue;
        }
        acc = add96(acc, fixed_at(fp(ymax - div_rn(z, t)), s1));
    }
    let nf = f32(n);
    let dbar = fp(fp(val96(wg_sum96(lid, acc)) / nf) * pow2(e - 34));
    // (d - d̄) scaled by 2^(34-e) (exactly: a power of two) is below 2^35, its square
    // below 2^70, whatever the row's range
    let up = pow2(34 - e);
    acc = vec3<u32>(0u, 0u, 0u);
    for (var i = lid; i < call.vocab; i = i + WG) {
        let z = z_of(slot, sp, i, load_x(row, i));
        if (is_neg_inf(z)) {
            continue;
        }
        let g = fp(fp(fp(ymax - div_rn(z, t)) - dbar) * up);
        acc = add96(acc, fixed_at(fp(g * g), 0));
    }
    let sigma = fp(sqrt(fp(val96(wg_sum96(lid, acc)) / nf)) * pow2(e - 34));
    return fp(ymax - fp(sp.top_n_sigma * sigma));
}
