// ---------------------------------------------------------------------------------
// Stage 6a, typical-p, on the device, after top-k. Over K (finite y >= S_TAU_K), with
// w = exp(y - ymax), q = w / Σ w and d = ymax - y, a token's score |-ln q - H| equals
// |y - c| for c = ymax - Σ w d / Σ w, the q-weighted mean of y (-ln q = ln Σ w + d, so
// H = ln Σ w + Σ q d). The sums are integers (fixed point: the same in any order, for
// any split): the scan's, when K is every finite y (`Typ.pre`: Σ exp(y - R) and
// Σ exp(y - R) (m0 - y) against the probe's R and m0), else one read of K. Three radix
// levels then walk the scores upward, top-p's levels on the complement of the score's
// key, to the first token whose mass sum exceeds p Σ w (strictly): its score s* bounds
// the set (`typ_in`: |y - c| <= s*, ties kept); the last level also finds the largest y
// left, the ymax of every later stage.
//
// The walk runs over the row, in the full-row path's phases (step/walk.wgsl: a wide
// `typ_walk` per level into the row's histogram, then `typ_decide`), or over the
// candidate list (the list path, in `settle_list`: `typical_row` by the settling
// workgroup): there it holds when the list holds K, or when the cut it finds
// lies below every score a token off the list can have (those have y under the list's
// threshold, so a score above c - that threshold): then the band is on the list too.

// What the scan's sums give typical-p: the centre and K's mass (2^-40 units against
// ymax, as f32) when `pre`.
struct Typ {
    pre: bool,
    c: f32,
    total: f32,
}

// Typical-p's sums from the scan (`d`: Σ exp(y - R) (m0 - y), signed, in 2^-72 units;
// `w`: Σ exp(y - R)), for a row that asked for them (N_TYP: K is every finite y), when
// no y passed R.
fn typ_pre(row: u32, over: u32, ymax: f32, w: vec3<u32>, d: vec3<u32>) -> Typ {
    var r: Typ;
    r.pre = over == 0u;
    r.c = 0.0;
    r.total = 0.0;
    if (r.pre) {
        let m0 = sgetf(row, S_M0);
        let wf = val96(w);
        var df = 0.0;
        if ((d.z & 0x80000000u) != 0u) {
            df = -val96(sub96(vec3<u32>(0u, 0u, 0u), d));
        } else {
            df = val96(d);
        }
        r.c = m0 - div_rn_cold(df, wf);
        r.total = mass_at_ymax(row, w, ymax);
    }
    return r;
}

// One token's term of the scan's signed sum: exp(y - R) (m0 - y) in 2^-72 units, two's
// complement (|term| <= 20 for y <= R = m0 + 20).
fn typ_term(y: f32, r_ref: f32, m0: f32) -> vec3<u32> {
    let v = exp_f32(y - r_ref) * (m0 - y);
    if (v < 0.0) {
        return sub96(vec3<u32>(0u, 0u, 0u), fixed72(-v));
    }
    return fixed72(v);
}

// A token's score on the device: |y - c|, +inf for a weight that is 0 or subnormal
// (q = 0: the contract's +inf score).
fn typ_score(y: f32, ym: f32, c: f32) -> f32 {
    let w = exp_f32(y - ym);
    if ((bitcast<u32>(w) & 0x7f800000u) == 0u) {
        return bitcast<f32>(0x7f800000u);
    }
    return abs(y - c);
}

// Whether a y of K stays after typical-p (always, for rows without its cut).
fn typ_in(row: u32, y: f32) -> bool {
    let cut = sgetf(row, S_TYP_D);
    if (bitcast<u32>(cut) == 0x7f800000u) {
        return true;
    }
    return cmp_key(typ_score(y, sgetf(row, S_TYP_M), sgetf(row, S_TYP_C))) <= cmp_key(cut);
}

// Token i's y when it is in K (finite, its cmp_key at least `kk`), else -inf.
fn y_in_k(row: u32, slot: u32, sp: SlotP, i: u32, kk: u32) -> f32 {
    let z = z_of(slot, sp, i, load_x(row, i));
    if (is_neg_inf(z)) {
        return z;
    }
    let y = div_rn_cold(z, sp.temperature);
    if (cmp_key(y) < kk) {
        return neg_inf();
    }
    return y;
}

// Candidate i's y when it is in K (its key at least kk), else -inf. The candidates
// walked are K's own or, with the scan's sums, any finite y.
fn typ_y(row: u32, i: u32, kk: u32) -> f32 {
    let y = bitcast<f32>(entry(row, i).y);
    if (cmp_key(y) < kk) {
        return neg_inf();
    }
    return y;
}

// Typical-p's cut over K for a sampling row (ymax finite) on the list path, walking
// its `n` candidates (K is those with keys at least `kk`) by the settling workgroup;
// returns the largest y left.
fn typical_row(lid: u32, row: u32, sp: SlotP, ymax: f32, n: u32, kk: u32, pre: Typ) -> f32 {
    let hb = hbase(row);
    var c = pre.c;
    var total = pre.total;
    if (!pre.pre) {
        var sw = vec2<u32>(0u, 0u);
        var swd = vec2<u32>(0u, 0u);
        for (var i = lid; i < n; i = i + WG) {
            let y = typ_y(row, i, kk);
            if (is_neg_inf(y)) {
                continue;
            }
            let tw = typ_terms(y, ymax);
            sw = add64(sw, tw.xy);
            swd = add64(swd, tw.zw);
        }
        total = val64(wg_sum64(lid, sw));
        c = typ_centre(ymax, total, wg_sum64(lid, swd));
    }
    let goal = sp.typical_p * total;
    if (lid == 0u) {
        typ_walk_start(row, c, ymax);
    }
    storageBarrier();
    // the largest y left, as a cmp_key: found in the last level's pass
    var ymk = 0u;
    for (var level = 0u; level < 3u; level = level + 1u) {
        if (!wg_flag(lid, sget(row, S_T_LEVEL) != 0u)) {
            break;
        }
        let prefix = sget(row, S_T_PREFIX);
        // last level: the largest y scoring below the bin (kept whatever its digit)
        var below = 0u;
        for (var i = lid; i < n; i = i + WG) {
            let y = typ_y(row, i, kk);
            if (!is_neg_inf(y)) {
                below = max(below, typ_add(hb, y, ymax, c, level, prefix));
            }
        }
        storageBarrier();
        let k = typ_level(lid, row, level, prefix, goal, below);
        if (level == 2u) {
            ymk = k;
        }
    }
    if (wg_flag(lid, bitcast<u32>(sgetf(row, S_TYP_D)) == 0x7f800000u)) {
        return ymax;
    }
    // the ymax of top-p, min-p, XTC and the log-probabilities from here on
    return from_key(ymk);
}

// A y of K into level `level` of typical-p's walk (the row's histogram at `hb`): its
// mass by score key (smaller scores first: the complement of the score's key) under
// the prefix, and at the last level its key's maximum per digit in top-k's count bins
// (zero between uses). Returns the y's cmp_key when it scores below the last level's
// bin (kept whatever its digit), else 0.
fn typ_add(hb: u32, y: f32, ymax: f32, c: f32, level: u32, prefix: u32) -> u32 {
    let key = ~key_of(typ_score(y, ymax, c));
    var below = 0u;
    if (level == 2u && (key >> 10u) > prefix) {
        below = cmp_key(y);
    }
    if (!in_prefix(key, level, prefix)) {
        return below;
    }
    if (level == 2u) {
        atomicMax(&ctr[hb + (key & 0x3ffu)], cmp_key(y));
    }
    let fx = fixed40(exp_f32(y - ymax));
    if ((fx.x | fx.y) != 0u) {
        add_mass(hb, (key >> digit_shift(level)) & digit_mask(level), fx);
    }
    return below;
}

// A y of K's terms of the sums over K (2^-40 units): w = exp(y - ymax), and w d with
// d = ymax - y.
fn typ_terms(y: f32, ymax: f32) -> vec4<u32> {
    let w = exp_f32(y - ymax);
    return vec4<u32>(fixed40(w), fixed40(w * (ymax - y)));
}

// The scores' centre c = ymax - Σ w d / Σ w from K's mass `total` (Σ w, as f32) and
// Σ w d.
fn typ_centre(ymax: f32, total: f32, swd: vec2<u32>) -> f32 {
    return ymax - div_rn_cold(val64(swd), total);
}

// One level of typical-p's walk, decided from the row's mass histogram (by score key,
// smaller scores first; cleared as read) against `goal`: the bin where the sum first
// exceeds it (strictly), or no cut (S_T_LEVEL 0) when it never does; at the last level
// the cut s* (S_TYP_D) and the largest y left, as a cmp_key: the largest of `below` (y
// scoring below the cut's bin) and of the per-digit maxima in top-k's count bins at or
// above the cut's digit (cleared too). Call from uniform control flow.
fn typ_level(lid: u32, row: u32, level: u32, prefix: u32, goal: f32, below: u32) -> u32 {
    let hb = hbase(row);
    let mb = take_masses(lid, hb);
    let incl = wg_scan64(lid, mb.mine);
    let above = vec2<u32>(sget(row, S_T_ABOVE_LO), sget(row, S_T_ABOVE_HI));
    // the walk stops at the first token whose sum exceeds the goal (strictly)
    let cut = mass_cut(lid, mb, incl, above, goal, true);
    if (cut.here) {
        let np = (prefix << digit_width(level)) | cut.bin;
        sset(row, S_T_PREFIX, np);
        sset(row, S_T_ABOVE_LO, cut.cum.x);
        sset(row, S_T_ABOVE_HI, cut.cum.y);
        if (level == 2u) {
            ssetf(row, S_TYP_D, from_key(~np));
        }
    }
    if (lid == WG - 1u && !cut.reached) {
        // the sum never exceeds p: every token of K stays
        sset(row, S_T_LEVEL, 0u);
    }
    storageBarrier();
    var ymk = 0u;
    if (level == 2u) {
        // the largest y left: below the cut's bin, or in a digit at or above the
        // cut's (smaller scores); the bins are cleared for their next use
        let cut_digit = sget(row, S_T_PREFIX) & 0x3ffu;
        var mk = below;
        for (var b = lid; b < 1024u; b = b + WG) {
            let v = atomicLoad(&ctr[hb + b]);
            if (v != 0u) {
                if (b >= cut_digit) {
                    mk = max(mk, v);
                }
                atomicStore(&ctr[hb + b], 0u);
            }
        }
        ymk = wg_sum_max(lid, 0u, mk).y;
        storageBarrier();
    }
    return ymk;
}

// Stage 6a's start on the full-row path (`full_setup`): the centre and mass from the
// scan when it made them (else the TS phase sums them), the walk's state.
fn typ_setup(row: u32, ymax: f32, typ: Typ) {
    ssetf(row, S_TYP_T, typ.total);
    sset(row, S_TYP_PRE, select(0u, 1u, typ.pre));
    typ_walk_start(row, typ.c, ymax);
}

// The state a walk of the scores starts from, on either path: the centre `c`, the ymax
// its weights are taken against, no cut yet, the radix walk at its first level.
fn typ_walk_start(row: u32, c: f32, ymax: f32) {
    ssetf(row, S_TYP_C, c);
    ssetf(row, S_TYP_M, ymax);
    ssetf(row, S_TYP_D, bitcast<f32>(0x7f800000u));
    sset(row, S_T_PREFIX, 0u);
    sset(row, S_T_LEVEL, 1u);
    sset(row, S_T_ABOVE_LO, 0u);
    sset(row, S_T_ABOVE_HI, 0u);
}

// A piece of the TS phase (K's Σ w and Σ w d, 2^-40 units, into mass bins 0 and 1), or
// of level `level` of the walk (masses by score key under the prefix; at the last level
// the per-digit maxima of y and the largest y scoring below the bin, into count bin
// 1024), over tokens start .. end of the row.
fn typ_walk(lid: u32, row: u32, slot: u32, sp: SlotP, start: u32, end: u32, level: u32) {
    let hb = hbase(row);
    let kk = cmp_key(sgetf(row, S_TAU_K));
    let ymax = sgetf(row, S_TYP_M);
    let c = sgetf(row, S_TYP_C);
    let prefix = sget(row, S_T_PREFIX);
    let ts = level == 3u;
    var sw = vec2<u32>(0u, 0u);
    var swd = vec2<u32>(0u, 0u);
    var below = 0u;
    // (one loop and one y_in_k for both: a compiler inlines each call)
    for (var i = start + lid; i < end; i = i + WG) {
        let y = y_in_k(row, slot, sp, i, kk);
        if (is_neg_inf(y)) {
            continue;
        }
        if (ts) {
            let tw = typ_terms(y, ymax);
            sw = add64(sw, tw.xy);
            swd = add64(swd, tw.zw);
        } else {
            below = max(below, typ_add(hb, y, ymax, c, level, prefix));
        }
    }
    if (ts) {
        let a = wg_sum64(lid, sw);
        let b = wg_sum64(lid, swd);
        if (lid == 0u) {
            add_mass(hb, 0u, a);
            add_mass(hb, 1u, b);
        }
        return;
    }
    if (level == 2u) {
        let bl = wg_sum_max(lid, 0u, below).y;
        if (lid == 0u && bl != 0u) {
            atomicMax(&ctr[hb + 1024u], bl);
        }
    }
}

// The decision after a piece-wise TS phase (`level` 3: the centre and mass) or walk
// level; at the last level with a cut, the ymax of every later stage (S_YMAX, min-p's
// threshold).
fn typ_decide(lid: u32, row: u32, sp: SlotP, level: u32) {
    let hb = hbase(row);
    let ymax = sgetf(row, S_TYP_M);
    if (level == 3u) {
        let mb = take_masses(lid, hb);
        // (bins 0 and 1 are the last invocation's last two)
        let last = lid == WG - 1u;
        let sw = wg_sum64(lid, select(vec2<u32>(0u, 0u), mb.m[7], last));
        let swd = wg_sum64(lid, select(vec2<u32>(0u, 0u), mb.m[6], last));
        let total = val64(sw);
        if (lid == 0u) {
            ssetf(row, S_TYP_T, total);
            ssetf(row, S_TYP_C, typ_centre(ymax, total, swd));
        }
        return;
    }
    let goal = sp.typical_p * sgetf(row, S_TYP_T);
    var below = 0u;
    if (level == 2u) {
        below = wg_uniform(lid, atomicLoad(&ctr[hb + 1024u]));
        storageBarrier();
        if (lid == 0u) {
            atomicStore(&ctr[hb + 1024u], 0u);
        }
    }
    let ymk = typ_level(lid, row, level, sget(row, S_T_PREFIX), goal, below);
    if (level == 2u && lid == 0u && bitcast<u32>(sgetf(row, S_TYP_D)) != 0x7f800000u) {
        // the ymax of top-p, min-p, XTC and the log-probabilities from here on
        let ym = from_key(ymk);
        ssetf(row, S_YMAX, ym);
        if ((sp.flags & F_MIN_P) != 0u) {
            ssetf(row, S_TAU_MIN, ym + sp.ln_min_p);
        }
    }
}
