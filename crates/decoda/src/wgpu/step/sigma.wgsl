// ---------------------------------------------------------------------------------
// Stage 5a, top-n-σ, on the device: the threshold `ymax - n σ` over a row's finite y.
// The sums are integers (fixed point), so they are the same in any order, for any split
// of the row and either reduction, and the variance's numerator n Σ q^2 - (Σ q)^2 is
// exact in 128-bit integers; the f32 steps after it leave the threshold within about
// 3e-7 (|ymax| + n σ) of the contract's f64 one (its tie band: 1e-6).
//
// The scan sums them (`N_SD`, issue 56: no walk of the row by one workgroup): against a
// reference R and a scale 2^e the probe takes from its sample (R = m0 + D, 2^e > 4 D,
// D the sample's range), q = floor(R 2^(36-e)) - floor(y 2^(36-e)) (below 2^37), exact
// for every y in [R - 2^e, R]. A row with a y outside (above R, or far below the sample's least)
// has its sums made after settle by the full-row path's SD phase over the row's pieces,
// with q against ymax and the row's own range (`sd_walk`, `sd_decide`).

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

// q^2 for q < 2^37 (two words), below 2^74: three words.
fn square37(q: vec2<u32>) -> vec3<u32> {
    let l = mul_wide(q.x, q.x);
    let m = mul_wide(q.x, 2u * q.y);
    return add96(vec3<u32>(l, 0u), vec3<u32>(0u, m.x, m.y + q.y * q.y));
}

// The sums of a row with a y outside the scan's (after settle: the full-row path's SD
// phase, over the row's pieces): with `d = ymax - y` (f32, 0 <= d <= D = ymax - ymin <
// 2^(e+1), ymin the smallest y: y never decreases as z grows, so it is `RN(min z / T)`)
// and `q = floor(d 2^(34-e))` (below 2^35), a piece's Σ q (below 2^54) and Σ q^2 (below
// 2^89), into the piece's partial words 17-22 (the scan's, which settle has read).
fn sd_walk(lid: u32, row: u32, slot: u32, sp: SlotP, piece: u32, start: u32, end: u32) {
    let t = sp.temperature;
    let ymax = sgetf(row, S_YMAX);
    let e = bitcast<i32>(sget(row, S_SD_EW));
    var s1 = vec3<u32>(0u, 0u, 0u);
    var s2 = vec3<u32>(0u, 0u, 0u);
    for (var i = start + lid; i < end; i = i + WG) {
        let z = z_of(slot, sp, i, load_x(row, i));
        if (is_neg_inf(z)) {
            continue;
        }
        let q = fixed_at(fp(ymax - div_rn_cold(z, t)), 34 - e);
        s1 = add96(s1, q);
        s2 = add96(s2, square37(q.xy));
    }
    let a = wg_sum96(lid, s2);
    let b = wg_sum96(lid, s1);
    if (lid == 0u) {
        sd_put(part(row, piece), a, b);
    }
}

// A piece's top-n-σ sums in its partial words 17-22 (Σ q^2, then Σ q): the scan's, or
// the SD phase's.
fn sd_put(pb: u32, q2: vec3<u32>, q1: vec3<u32>) {
    work[pb + 17u] = q2.x;
    work[pb + 18u] = q2.y;
    work[pb + 19u] = q2.z;
    work[pb + 20u] = q1.x;
    work[pb + 21u] = q1.y;
    work[pb + 22u] = q1.z;
}

fn sd_q2_at(pb: u32) -> vec3<u32> {
    return vec3<u32>(work[pb + 17u], work[pb + 18u], work[pb + 19u]);
}

fn sd_q1_at(pb: u32) -> vec3<u32> {
    return vec3<u32>(work[pb + 20u], work[pb + 21u], work[pb + 22u]);
}

// The SD phase's decision: `ymax - n σ` from the pieces' sums, σ = sqrt(n Σ q^2 -
// (Σ q)^2) / n 2^(e-34) (the scaling is exact, so no f32 overflows or underflows for any
// range), as the row's lower bound for the stages after it.
fn sd_decide(lid: u32, row: u32, sp: SlotP) {
    var s1 = vec3<u32>(0u, 0u, 0u);
    var s2 = vec3<u32>(0u, 0u, 0u);
    for (var s = lid; s < call.splits; s = s + WG) {
        let pb = part(row, s);
        s2 = add96(s2, sd_q2_at(pb));
        s1 = add96(s1, sd_q1_at(pb));
    }
    let a = wg_sum96(lid, s2);
    let b = wg_sum96(lid, s1);
    if (lid == 0u) {
        let e = bitcast<i32>(sget(row, S_SD_EW));
        ssetf(row, S_TAU_K, sd_threshold(sp, sgetf(row, S_YMAX), sget(row, S_SD_N), a, b, e - 34));
    }
}

// `ymax - n σ` from a row's sums (`n` finite y, at most 2^22; `a` = Σ q^2, `b` = Σ q,
// with q ≈ (ref - y) 2^-unit below 2^37): σ = sqrt(n a - b^2) / n 2^unit.
fn sd_threshold(sp: SlotP, ymax: f32, n: u32, a: vec3<u32>, b: vec3<u32>, unit: i32) -> f32 {
    // n Σ q^2 and (Σ q)^2 (Σ q below 2^59: two words), each below 2^118
    let na = add128(
        add128(vec4<u32>(mul_wide(a.x, n), 0u, 0u), vec4<u32>(0u, mul_wide(a.y, n), 0u)),
        vec4<u32>(0u, 0u, mul_wide(a.z, n)),
    );
    let cross = vec4<u32>(0u, mul_wide(b.x, b.y), 0u);
    let bb = add128(
        add128(vec4<u32>(mul_wide(b.x, b.x), 0u, 0u), add128(cross, cross)),
        vec4<u32>(0u, 0u, mul_wide(b.y, b.y)),
    );
    let sigma = fp(fp(sqrt(val128(sub128(na, bb))) / f32(n)) * pow2(unit));
    return fp(ymax - fp(sp.top_n_sigma * sigma));
}

// floor(v 2^s) modulo 2^64 (two's complement, low word first) for a finite v: the
// difference of two such values is exact whenever the true one lies in [0, 2^64).
fn floor_fixed64(v: f32, s: i32) -> vec2<u32> {
    let b = bitcast<u32>(v);
    let ex = (b >> 23u) & 0xffu;
    var m = b & 0x7fffffu;
    var e2 = i32(ex) - 150;
    if (ex == 0u) {
        e2 = -149;
    } else {
        m = m | 0x800000u;
    }
    // |v| 2^s = m 2^sh: its floor (r) and whether anything was cut (cut)
    let sh = e2 + s;
    var r = vec2<u32>(0u, 0u);
    var cut = false;
    if (sh >= 64) {
        r = vec2<u32>(0u, 0u);
    } else if (sh >= 32) {
        r = vec2<u32>(0u, m << u32(sh - 32));
    } else if (sh > 0) {
        r = vec2<u32>(m << u32(sh), m >> u32(32 - sh));
    } else if (sh == 0) {
        r = vec2<u32>(m, 0u);
    } else if (sh > -32) {
        r = vec2<u32>(m >> u32(-sh), 0u);
        cut = (m & ((1u << u32(-sh)) - 1u)) != 0u;
    } else {
        cut = m != 0u;
    }
    if ((b & 0x80000000u) == 0u) {
        return r;
    }
    // floor(-x) = -ceil(x)
    if (cut) {
        r = add64(r, vec2<u32>(1u, 0u));
    }
    return sub64(vec2<u32>(0u, 0u), r);
}

// The scan's top-n-σ reference and scale for a row that sums them (`N_SD`).
struct Sd {
    on: bool,
    r: f32,
    e: i32,
    // floor(r 2^(36-e)) mod 2^64
    rq: vec2<u32>,
    // 2^e: y with r - y above it are outside the sums
    span: f32,
}

fn sd_of(row: u32, need: u32) -> Sd {
    var d: Sd;
    d.on = (need & N_SD) != 0u;
    d.r = sgetf(row, S_SD_R);
    d.e = bitcast<i32>(sget(row, S_SD_E));
    d.rq = vec2<u32>(0u, 0u);
    d.span = 0.0;
    if (d.on) {
        d.rq = floor_fixed64(d.r, 36 - d.e);
        d.span = pow2(d.e);
    }
    return d;
}

// A token's term of the scan's top-n-σ sums and whether it lies outside them: (q, out),
// q below 2^37 (r - y at most 2^e (1 + 2^-24)).
fn sd_q(d: Sd, y: f32) -> vec3<u32> {
    if (cmp_key(y) > cmp_key(d.r) || !(fp(d.r - y) <= d.span)) {
        return vec3<u32>(0u, 0u, 1u);
    }
    let q = sub64(d.rq, floor_fixed64(y, 36 - d.e));
    return vec3<u32>(q, 0u);
}
