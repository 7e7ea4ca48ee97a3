// ---------------------------------------------------------------------------------
// scan: read 1.

// A bound on z below which no token of a filtered row can be a candidate: y = RN(z / t)
// never decreases as z grows (t > 0), so a z at or below a value whose own y is under
// `thr` (a cmp_key threshold on y) gives a y under it too. The value is a few ulps under
// thr * t, certified with the exact division; 0 (no token skips) when that fails.
fn z_floor(thr: u32, t: f32) -> u32 {
    if (thr <= key_of(neg_inf())) {
        return 0u;
    }
    let c = from_key(thr) * t;
    if (not_finite(c)) {
        return 0u;
    }
    let ck = cmp_key(c);
    if (ck < key_of(neg_inf()) + 8u) {
        return 0u;
    }
    let zk = ck - 4u;
    if (cmp_key(div_rn(from_key(zk), t)) < thr) {
        return zk;
    }
    return 0u;
}

// A key under which a y adds nothing to the top-p mass Σ fixed72(exp_f32(y - R)): for
// y < c, fp(y - R) <= fp(c - R) <= -51 (rounding is monotone), where exp_f32's scale
// 2^n has n <= -74 and its polynomial stays under 1.42, so the value lies under 2^-72
// and fixed72 truncates it to 0. 0 (no token skips) when R is not finite or c - R
// does not reach -51.
fn mass_floor(r: f32) -> u32 {
    let c = fp(r - 52.0);
    if (!(fp(c - r) <= -51.0)) {
        return 0u;
    }
    return cmp_key(c);
}

// What the scan keeps of token i's z (neither NaN nor +inf), in both of its loops: the
// row's largest z (the smallest id among equal ones) and, for a finite z, the count and
// the smallest key (top-n-σ's first read). Returns z's key.
fn see_z(i: u32, z: f32, zk: ptr<function, u32>, zi: ptr<function, u32>,
         n_fin: ptr<function, u32>, kz_min: ptr<function, u32>) -> u32 {
    let kz = cmp_key(z);
    if (kz > *zk || (kz == *zk && i < *zi)) {
        *zk = kz;
        *zi = i;
    }
    if (!is_neg_inf(z)) {
        *n_fin = *n_fin + 1u;
        *kz_min = min(*kz_min, kz);
    }
    return kz;
}

@compute @workgroup_size(256)
fn scan(@builtin(workgroup_id) wid: vec3<u32>, lanes: Lanes) {
    let lid = lanes.lid;
    lanes_init(lanes);
    scan_split(lid, wid.x, wid.y, false);
}

// The scan of a light call (`Plan::Light`: no row has a filter, so none needs a list or
// sums): the same code with `light` a constant, which drops their parts at compile time
// (a smaller kernel: lavapipe pays for a kernel's code, and a GPU for its registers).
@compute @workgroup_size(256)
fn scan_light(@builtin(workgroup_id) wid: vec3<u32>, lanes: Lanes) {
    let lid = lanes.lid;
    lanes_init(lanes);
    scan_split(lid, wid.x, wid.y, true);
}

// One split of one row; `light`: a light call's (a constant at each call site).
fn scan_split(lid: u32, split: u32, row: u32, light: bool) {
    let slot = rmap[row];
    let sp = sparams[slot];
    let t = sp.temperature;
    let isc = cold(sp);
    // without a probe (M_LIGHT: no row of the call has filters) the row needs no list
    // and no top-p mass, whatever an earlier call left in its state
    var need = 0u;
    if (!light && (call.mode & M_LIGHT) == 0u) {
        need = sget(row, S_NEED);
    }
    let kappa = sget(row, S_KAPPA);
    let gkey = cmp_key(sgetf(row, S_GTHR));
    let minp = (sp.flags & F_MIN_P) != 0u && !is_neg_inf(sgetf(row, S_GTHR));
    let r_ref = sgetf(row, S_R);
    let rkey = cmp_key(r_ref);
    // the draw over the whole row happens here only for rows without a set filter (settle
    // reads it for those alone): top-n-σ and typical-p rows make no noise in the scan
    let unf = !isc && (sp.flags & F_SET_FILTERS) == 0u;
    let stp = step_of(slot);
    let seed = vec2<u32>(sp.seed_lo, sp.seed_hi);
    let lst = cand(row);
    // filtered rows need y only where it may reach a candidate threshold or add to the
    // top-p mass: below zlo (a cmp_key of z) the division is skipped (issue 56: top-p
    // alone divided every token). Rows whose sums need every y (typical-p's centre,
    // top-n-σ's) and rows that draw here (no set filter: their count of finite y and
    // their noise) skip nothing.
    var zlo = 0u;
    let sums = (need & N_SIGMA) != 0u;
    if (((need & N_LIST) != 0u || sums) && (need & (N_TYP | N_SD)) == 0u && !isc && !unf) {
        var thr = 0xffffffffu;
        if ((need & N_LIST) != 0u) {
            thr = kappa;
            if (minp) {
                thr = min(thr, gkey);
            }
        }
        if (sums) {
            thr = min(thr, mass_floor(r_ref));
        }
        zlo = z_floor(thr, t);
    }
    // rows whose y serves the draw alone (no list, no sums): a token whose logit cannot
    // reach this invocation's best score whatever its word's noise (the reach test, from
    // the word alone) costs no division and no logarithm (issue 56's gated Gumbel)
    let draw_only = unf && (need & (N_LIST | N_SIGMA)) == 0u;
    var reach = vec2<f32>(-3.4028235e38, 0.0);
    var reach_bk = 0u;
    var zk = 0u;
    var zi = NO_TOKEN;
    var xk = 0u;
    var bad_x = 0u;
    var bad_z = 0u;
    var bk = 0u;
    var bi = NO_TOKEN;
    var sig = vec3<u32>(0u, 0u, 0u);
    var over = 0u;
    // top-n-σ rows: the finite z's count and smallest key (its threshold's first read)
    var n_fin = 0u;
    var kz_min = 0xffffffffu;
    // typical-p rows whose K is every finite y: Σ exp(y - R) (m0 - y), signed
    let typ = (need & N_TYP) != 0u;
    let m0 = sgetf(row, S_M0);
    var tsum = vec3<u32>(0u, 0u, 0u);
    // top-n-σ rows: Σ q and Σ q^2 of every finite y (step/sigma.wgsl), and whether a y
    // fell outside their range
    let sd = sd_of(row, need);
    var sd1 = vec3<u32>(0u, 0u, 0u);
    var sd2 = vec3<u32>(0u, 0u, 0u);
    var sd_out = 0u;
    // rows summing their mass: how many y are finite (the kept set's size, `settle_whole`)
    var n_y = 0u;
    let start = split * call.chunk;
    let end = min(call.vocab, start + call.chunk);
    let g0 = start / 4u;
    let g1 = (end + 3u) / 4u;
    // a row without penalties, bias or DRY leaves z = x (z_of's work is skipped)
    let touch = select(0u, 0xfu, (sp.flags & F_TOUCH) != 0u);
    // A greedy row with z = x needs only the counts, the largest x and z, and (for
    // top-n-σ's flag) the finite count and the smallest z: a loop of its own, not the
    // general one below with its later steps skipped, because lavapipe runs each step's
    // body once a pass, masked, even where no token needs it (examples/branch_cost). A
    // row takes one of the two loops (its bounds say which); the other runs no pass
    // (lavapipe: one pass masked, not one a group).
    let plain = isc && touch == 0u;
    for (var g = select(g1, g0 + lid, plain); g < g1; g = g + WG) {
        let n = min(4u, end - g * 4u);
        for (var j = 0u; j < n; j = j + 1u) {
            let i = g * 4u + j;
            let x = load_x(row, i);
            if (is_bad(x)) {
                bad_x = bad_x + 1u;
                bad_z = bad_z + 1u;
                continue;
            }
            xk = max(xk, key_of(x));
            see_z(i, x, &zk, &zi, &n_fin, &kz_min);
        }
    }
    for (var g = select(g0 + lid, g1, plain); g < g1; g = g + WG) {
        // A group of four tokens in three steps: x, then z for the tokens whose row has
        // penalties, bias or DRY, then y and what needs it for the tokens that can
        // matter. Each later step loops over the tokens it concerns (bit masks), so
        // where every branch is run (lavapipe runs both sides of a branch, masked) a
        // group pays for one pass of a step, or as many as its busiest lane has tokens
        // there, not four (a loop whose mask empties stops; its body still runs once,
        // masked, when no lane enters it: examples/branch_cost). Every token gets the
        // values one pass in token order gives it; sums are integers, maxima and
        // argmaxima order-free, and the list's order is its atomics' in either form.
        // a new best since the reach constants were made: remake them (a loop run at most
        // once, which lavapipe, as an `if`, runs masked when no lane needs it)
        for (var stale = draw_only && bi != NO_TOKEN && bk != reach_bk; stale; stale = false) {
            reach = reach_consts(t, from_key(bk));
            reach_bk = bk;
        }
        var zs = vec4<f32>(0.0, 0.0, 0.0, 0.0);
        // (g < g1, so the group holds at least one token of the chunk)
        let n = min(4u, end - g * 4u);
        for (var j = 0u; j < n; j = j + 1u) {
            let x = load_x(row, g * 4u + j);
            if (is_bad(x)) {
                bad_x = bad_x + 1u;
            } else {
                xk = max(xk, key_of(x));
            }
            zs[j] = x;
        }
        var zt = touch & ((1u << n) - 1u);
        loop {
            if (zt == 0u) {
                break;
            }
            let j = firstTrailingBit(zt);
            zt = zt & (zt - 1u);
            zs[j] = z_of(slot, sp, g * 4u + j, zs[j]);
        }
        // the group's Philox words, for rows that draw here (before y: the reach test
        // needs them)
        var words = vec4<u32>(0u, 0u, 0u, 0u);
        for (var draws = unf; draws; draws = false) {
            words = philox(vec4<u32>(g, stp.x, stp.y, 0u), seed);
        }
        var live = 0u;
        for (var j = 0u; j < n; j = j + 1u) {
            let i = g * 4u + j;
            let z = zs[j];
            if (is_bad(z)) {
                bad_z = bad_z + 1u;
                continue;
            }
            let kz = see_z(i, z, &zk, &zi, &n_fin, &kz_min);
            if (is_neg_inf(z) || isc || kz <= zlo) {
                continue;
            }
            if (draw_only && z < reach.y * reach_chord(words[j]) + reach.x) {
                continue;
            }
            live = live | (1u << j);
        }
        loop {
            if (live == 0u) {
                break;
            }
            let j = firstTrailingBit(live);
            live = live & (live - 1u);
            let i = g * 4u + j;
            let y = div_rn(zs[j], t);
            let yk = cmp_key(y);
            if ((need & N_LIST) != 0u && (yk >= kappa || (minp && yk >= gkey))) {
                let at = atomicAdd(&ctr[cbase(row)], 1u);
                if (at < call.cap) {
                    work[lst + 2u * at] = i;
                    work[lst + 2u * at + 1u] = bitcast<u32>(y);
                }
            }
            if ((need & N_SIGMA) != 0u) {
                if (yk > rkey) {
                    over = 1u;
                } else {
                    n_y = n_y + select(0u, 1u, !is_neg_inf(y));
                    sig = add96(sig, fixed72(exp_f32(y - r_ref)));
                    if (typ) {
                        tsum = add96(tsum, typ_term(y, r_ref, m0));
                    }
                }
            }
            if (sd.on) {
                let q = sd_q(sd, y);
                sd_out = sd_out | q.z;
                sd1 = add96(sd1, vec3<u32>(q.xy, 0u));
                sd2 = add96(sd2, square37(q.xy));
            }
            if (unf) {
                // tokens that cannot beat this invocation's best skip the logarithms
                let w = words[j];
                if (bi != NO_TOKEN && cmp_key(y + gumbel_bound(w)) < bk) {
                    continue;
                }
                let sk = cmp_key(y + gumbel(w));
                if (sk > bk || (sk == bk && i < bi)) {
                    bk = sk;
                    bi = i;
                }
            }
        }
    }
    let a = wg_sum_max(lid, bad_x, xk);
    let bz = wg_sum_u32(lid, bad_z);
    let zm = wg_argmax(lid, zk, zi);
    let dr = wg_argmax(lid, bk, bi);
    // (a light call's rows have no sums: their words stay 0)
    var s96 = vec3<u32>(0u, 0u, 0u);
    var ov = 0u;
    var ny = 0u;
    var ts = vec3<u32>(0u, 0u, 0u);
    var fm = vec2<u32>(0u, 0u);
    if (!light) {
        s96 = wg_sum96(lid, sig);
        ov = wg_sum_u32(lid, over);
        if (wg_flag(lid, (need & N_SIGMA) != 0u)) {
            ny = wg_sum_u32(lid, n_y);
        }
        if (wg_flag(lid, typ)) {
            ts = wg_sum96(lid, tsum);
        }
        if ((sp.flags & F_TOP_N_SIGMA) != 0u) {
            fm = wg_sum_max(lid, n_fin, ~kz_min);
        }
        if (wg_flag(lid, sd.on)) {
            let a = wg_sum96(lid, sd2);
            let b = wg_sum96(lid, sd1);
            let o = wg_sum_u32(lid, sd_out);
            if (lid == 0u) {
                let pb = part(row, split);
                sd_put(pb, a, b);
                work[pb + 23u] = o;
            }
        }
    }
    if (lid == 0u) {
        let pb = part(row, split);
        work[pb + 0u] = a.x;
        work[pb + 1u] = bz;
        work[pb + 2u] = a.y;
        work[pb + 3u] = zm.x;
        work[pb + 4u] = zm.y;
        work[pb + 5u] = dr.x;
        work[pb + 6u] = dr.y;
        work[pb + 7u] = s96.x;
        work[pb + 8u] = s96.y;
        work[pb + 9u] = s96.z;
        work[pb + 10u] = ov;
        work[pb + 11u] = fm.x;
        work[pb + 12u] = fm.y;
        work[pb + 13u] = ts.x;
        work[pb + 14u] = ts.y;
        work[pb + 15u] = ts.z;
        work[pb + 16u] = ny;
    }
}

