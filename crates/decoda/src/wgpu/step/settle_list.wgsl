// ---------------------------------------------------------------------------------
// settle: status, filters on the candidates (or the full row), the draw.

// Candidate j of the row's list: (token, y).
fn entry(row: u32, j: u32) -> vec2<u32> {
    let b = cand(row) + 2u * j;
    return vec2<u32>(work[b], work[b + 1u]);
}

// Whether candidate a comes before b: larger y first, then the smaller id.
fn before_entry(a: vec2<u32>, b: vec2<u32>) -> bool {
    let ka = cmp_key(bitcast<f32>(a.y));
    let kb = cmp_key(bitcast<f32>(b.y));
    return ka > kb || (ka == kb && a.x < b.x);
}

// Sorts the first n candidates of the row (bitonic, in place; n <= cap, uniform).
fn sort_list(lid: u32, row: u32, n: u32) {
    var np = 1u;
    while (np < n) {
        np = np << 1u;
    }
    let b = cand(row);
    // padding sorts last: id NO_TOKEN, y -inf
    for (var j = n + lid; j < np; j = j + WG) {
        work[b + 2u * j] = NO_TOKEN;
        work[b + 2u * j + 1u] = NEG_INF_BITS;
    }
    storageBarrier();
    for (var k = 2u; k <= np; k = k << 1u) {
        for (var jj = k >> 1u; jj > 0u; jj = jj >> 1u) {
            for (var t = lid; t < np; t = t + WG) {
                let l = t ^ jj;
                if (l > t) {
                    let a = entry(row, t);
                    let c = entry(row, l);
                    let first = (t & k) == 0u;
                    if (first == before_entry(c, a)) {
                        work[b + 2u * t] = c.x;
                        work[b + 2u * t + 1u] = c.y;
                        work[b + 2u * l] = a.x;
                        work[b + 2u * l + 1u] = a.y;
                    }
                }
            }
            storageBarrier();
        }
    }
}

// Candidates among the first n whose y key is at least `key` (uniform).
fn count_at_least(lid: u32, row: u32, n: u32, key: u32) -> u32 {
    var c = 0u;
    for (var j = lid; j < n; j = j + WG) {
        if (cmp_key(bitcast<f32>(entry(row, j).y)) >= key) {
            c = c + 1u;
        }
    }
    return wg_uniform(lid, wg_sum_u32(lid, c));
}

// Inclusive prefix sum of 96-bit values in thread order; the total in the .w of the
// returned pair's second member is not kept: callers add up tiles themselves.
fn wg_scan96(lid: u32, v: vec3<u32>) -> vec3<u32> {
    let lo = wg_scan64(lid, vec2<u32>(v.x, 0u));
    let hi = wg_scan64(lid, vec2<u32>(v.y, v.z));
    return vec3<u32>(lo.x, add64(hi, vec2<u32>(lo.y, 0u)));
}

// The list path of a filtered row: true when the candidates settle it (then the token is
// in S_TOKEN, and the kept set is candidates S_J0 .. S_NS: past typical-p's excluded top
// and XTC's top choices when `xf`, its coin fired; rows whose XTC is on never reach
// `draw_many`).
fn settle_list(lid: u32, row: u32, slot: u32, sp: SlotP, n: u32, ymax: f32, s96: vec3<u32>,
               xf: bool, typ: Typ) -> bool {
    sort_list(lid, row, n);
    let tk = wg_flag(lid, (sp.flags & F_TOP_K) != 0u);
    let tp = wg_flag(lid, (sp.flags & F_TOP_P) != 0u);
    let mp = wg_flag(lid, (sp.flags & F_MIN_P) != 0u);
    let top_k = wg_uniform(lid, sp.top_k);
    let kappa = wg_uniform(lid, sget(row, S_KAPPA));
    let complete = kappa == 0u;
    // top-n-σ: every y at or above its threshold (S_TAU_K, from settle_row), the first
    // n_sig candidates; the list holds them all when the threshold is at or above kappa
    let sg = wg_flag(lid, (sp.flags & F_TOP_N_SIGMA) != 0u);
    var n_sig = n;
    var sig_ok = false;
    if (sg) {
        let ks = wg_uniform(lid, cmp_key(sgetf(row, S_TAU_K)));
        n_sig = count_at_least(lid, row, n, ks);
        sig_ok = complete || ks >= kappa;
    }
    // top-k over those: the k-th largest y, if the list holds k of them (or all of K0,
    // when it holds fewer)
    var n_k = n_sig;
    var k_ok = false;
    if (tk && top_k <= n_sig) {
        let tau = wg_uniform(lid, cmp_key(bitcast<f32>(entry(row, top_k - 1u).y)));
        n_k = count_at_least(lid, row, n, tau);
        k_ok = true;
    } else if (tk && sig_ok) {
        k_ok = true;
    }
    // K (after top-n-σ and top-k) lies in the list
    var k_in = (tk && k_ok) || sig_ok;
    // stage 6a, typical-p: its band is candidates ja..n_k, topped by `ym`, when the
    // list holds K (its sums from the list) or, with the scan's sums (K is every finite
    // y), when the cut the walk finds proves the band lies in the list
    var ja = 0u;
    var ym = ymax;
    if (wg_flag(lid, (sp.flags & F_TYPICAL) != 0u)) {
        let whole = k_in || complete;
        if (!wg_flag(lid, whole || typ.pre)) {
            return false;
        }
        var pre = typ;
        if (whole) {
            pre.pre = false;
        }
        ym = typical_row(lid, row, slot, sp, ymax, n_k, pre);
        let cut = sgetf(row, S_TYP_D);
        if (!whole) {
            // a token off the list has y <= yb (under every gathering threshold), so a
            // score of at least c - yb (rounded down by no more than the score is)
            var lk = kappa;
            if (mp && !is_neg_inf(sgetf(row, S_GTHR))) {
                lk = min(lk, cmp_key(sgetf(row, S_GTHR)));
            }
            let yb = from_key(lk - 1u);
            let c = sgetf(row, S_TYP_C);
            let proven = bitcast<u32>(cut) != 0x7f800000u && yb < c
                && cmp_key(cut) < cmp_key(c - yb);
            if (!wg_flag(lid, proven)) {
                return false;
            }
        }
        if (wg_flag(lid, bitcast<u32>(cut) != 0x7f800000u)) {
            // the band: a run of the list (|y - c| grows away from c both ways)
            var cnt = 0u;
            var last = 0u;
            for (var j = lid; j < n_k; j = j + WG) {
                if (typ_in(row, bitcast<f32>(entry(row, j).y))) {
                    cnt = cnt + 1u;
                    last = max(last, j);
                }
            }
            let band = wg_sum_max(lid, cnt, last);
            n_k = band.y + 1u;
            ja = n_k - band.x;
            ym = bitcast<f32>(wg_uniform(lid, entry(row, ja).y));
        }
        k_in = true;
    }
    // min-p: y >= ymax + ln(min_p); the list holds every y >= m0 + ln(min_p) <= that
    var n_m = n;
    var m_ok = false;
    if (mp) {
        n_m = count_at_least(lid, row, n, wg_uniform(lid, cmp_key(ym + sp.ln_min_p)));
        m_ok = !is_neg_inf(sgetf(row, S_GTHR));
    }
    // top-p over K: walk the candidates in order until their mass reaches p of K's
    var n_p = n_k;
    var p_ok = false;
    var p_covers = false;
    if (tp && (k_in || (!tk && !sg))) {
        var r_ref = sgetf(row, S_R);
        var total = s96;
        if (k_in) {
            // K lies in the list: its mass, against ymax
            r_ref = ym;
            var part_sum = vec3<u32>(0u, 0u, 0u);
            for (var j = ja + lid; j < n_k; j = j + WG) {
                part_sum = add96(part_sum, fixed72(exp_f32(bitcast<f32>(entry(row, j).y) - r_ref)));
            }
            total = wg_sum96(lid, part_sum);
        }
        let goal = sp.top_p * val96(total);
        var above = vec3<u32>(0u, 0u, 0u);
        var m = NO_TOKEN;
        for (var tile = ja; tile < n_k; tile = tile + WG) {
            let j = tile + lid;
            var e = vec3<u32>(0u, 0u, 0u);
            if (j < n_k) {
                e = fixed72(exp_f32(bitcast<f32>(entry(row, j).y) - r_ref));
            }
            let incl = wg_scan96(lid, e);
            if (lid == 0u) {
                wflag = NO_TOKEN;
            }
            if (lid == WG - 1u) {
                wsum = incl;
            }
            workgroupBarrier();
            let reach = val96(add96(above, incl)) >= goal;
            let reach_before = val96(add96(above, sub96(incl, e))) >= goal;
            if (j < n_k && reach && !reach_before) {
                wflag = j;
            }
            m = workgroupUniformLoad(&wflag);
            if (m != NO_TOKEN) {
                break;
            }
            above = add96(above, wsum);
            workgroupBarrier();
        }
        if (m != NO_TOKEN) {
            let em = fixed72(exp_f32(bitcast<f32>(entry(row, m).y) - r_ref));
            var c = 0u;
            for (var j = ja + lid; j < n_k; j = j + WG) {
                let e = fixed72(exp_f32(bitcast<f32>(entry(row, j).y) - r_ref));
                if (!gt96(em, e)) {
                    c = c + 1u;
                }
            }
            n_p = ja + wg_uniform(lid, wg_sum_u32(lid, c));
            if (k_in || complete) {
                p_ok = true;
            } else {
                // every token left out has y below the threshold: its mass is at most
                // that of the largest y under it, which must be below the cut's
                let eb = fixed72(exp_f32(from_key(kappa - 1u) - r_ref));
                p_ok = gt96(em, eb);
            }
            p_covers = p_ok;
        } else if (k_in || complete) {
            // the sum never reaches p (rounding): every token of K stays
            p_ok = true;
            n_p = n_k;
        }
    }
    let covered = k_in || p_covers || (mp && m_ok) || complete;
    let valid = wg_flag(lid, (!tp || p_ok) && covered);
    if (!valid) {
        return false;
    }
    let n_s = min(min(n_k, n_p), n_m);
    // stage 8a, XTC: the kept set is the list's first n_s, so its top choices (q >= the
    // threshold) come first; with two or more, the tokens above the least likely one
    // leave (its ties stay): the set becomes candidates j0..n_s, topped by `vtop`
    var j0 = ja;
    var vtop = ym;
    if (wg_flag(lid, xf && n_s >= ja + 2u)) {
        var part_sum = vec3<u32>(0u, 0u, 0u);
        for (var j = ja + lid; j < n_s; j = j + WG) {
            part_sum = add96(part_sum, fixed72(exp_f32(bitcast<f32>(entry(row, j).y) - ym)));
        }
        let bar = sp.xtc_thr * (val96(wg_sum96(lid, part_sum)) * TWO_M40 * TWO_M32);
        var c = 0u;
        var last = 0u;
        for (var j = ja + lid; j < n_s; j = j + WG) {
            if (exp_f32(bitcast<f32>(entry(row, j).y) - ym) >= bar) {
                c = c + 1u;
                last = max(last, j);
            }
        }
        let top = wg_sum_max(lid, c, last);
        if (wg_flag(lid, top.x >= 2u)) {
            // the least likely top choice is the last in the list's order
            let low = wg_uniform(lid, entry(row, top.y).y);
            vtop = bitcast<f32>(low);
            j0 = count_at_least(lid, row, n_s, cmp_key(vtop) + 1u);
        }
    }
    // the draw: Gumbel-max over the kept candidates
    let stp = step_of(slot);
    let seed = vec2<u32>(sp.seed_lo, sp.seed_hi);
    var bk = 0u;
    var bi = NO_TOKEN;
    for (var j = j0 + lid; j < n_s; j = j + WG) {
        let en = entry(row, j);
        let sk = cmp_key(bitcast<f32>(en.y) + gumbel(noise_word(en.x, seed, stp.x, stp.y)));
        if (sk > bk || (sk == bk && en.x < bi)) {
            bk = sk;
            bi = en.x;
        }
    }
    let w = wg_argmax(lid, bk, bi);
    // processed log-probabilities over the kept set (the list holds all of it)
    let lp_on = (sp.flags & F_LOGPROBS) != 0u && (sp.flags & F_PROCESSED) != 0u;
    var lse = 0.0;
    var pos = NO_TOKEN;
    if (wg_flag(lid, lp_on)) {
        var acc = vec2<u32>(0u, 0u);
        var at = NO_TOKEN;
        for (var j = j0 + lid; j < n_s; j = j + WG) {
            let en = entry(row, j);
            acc = add64(acc, fixed40(exp_diff(bitcast<f32>(en.y), vtop)));
            if (en.x == w.y) {
                at = j;
            }
        }
        let total = val64(wg_sum64(lid, acc)) * TWO_M40;
        lse = ln_f32(max(total, 1.0));
        pos = wg_argmax(lid, 0u, at).y;
    }
    if (wg_flag(lid, (sp.flags & F_KEPT) != 0u && w.y != NO_TOKEN)) {
        var acc = vec2<u32>(0u, 0u);
        for (var j = j0 + lid; j < n_s; j = j + WG) {
            acc = add64(acc, fixed40(exp_diff(bitcast<f32>(entry(row, j).y), vtop)));
        }
        kept_list(lid, row, sp, j0, n_s, vtop, val64(wg_sum64(lid, acc)));
    }
    if (lid == 0u) {
        sset(row, S_NS, n_s);
        sset(row, S_J0, j0);
        if (w.y == NO_TOKEN) {
            sset(row, S_STATUS, 4u);
            sset(row, S_PATH, P_NONE);
        } else {
            sset(row, S_TOKEN, w.y);
            sset(row, S_PATH, P_DONE);
        }
        if (lp_on && w.y != NO_TOKEN) {
            let ob = row * RESW + 2u;
            let n = min(min(sp.n_lp, NTOP), n_s - j0);
            for (var j = 0u; j < n; j = j + 1u) {
                let en = entry(row, j0 + j);
                out_res[ob + 3u + 2u * j] = en.x;
                out_res[ob + 4u + 2u * j] = bitcast<u32>(fp(bitcast<f32>(en.y) - vtop) - lse);
            }
            let yc = bitcast<f32>(entry(row, pos).y);
            out_res[ob] = bitcast<u32>(fp(yc - vtop) - lse);
            out_res[ob + 1u] = pos - j0 + 1u;
            out_res[ob + 2u] = n;
            sset(row, S_LP_DONE, 1u);
        }
    }
    return true;
}


// settle_whole's outcomes: not settled (the full-row path), settled (the token in
// S_TOKEN), or only the draw left (over the row, below S_VMAX).
const W_NONE: u32 = 0u;
const W_DONE: u32 = 1u;
const W_DRAW: u32 = 2u;

// A row whose only filter is XTC (its coin fired) or the kept distribution: the set is
// every finite y, its mass the scan's (`s96`, against R) and its size `n_fin`; the
// sorted list holds the top. XTC's top choices (w >= threshold Σ w) are a prefix of the
// list when the largest y off it is no top choice; with two or more, S_VMAX bounds the
// set and the draw over the row is left (W_DRAW: one read); with fewer the set is
// every finite y and the scan's winner `won` is the token. The kept distribution is its
// first n entries (their ties too: the list holds every y at or above its threshold).
fn settle_whole(lid: u32, row: u32, sp: SlotP, n: u32, ymax: f32, s96: vec3<u32>,
                n_fin: u32, xf: bool, won: u32) -> u32 {
    sort_list(lid, row, n);
    let kappa = wg_uniform(lid, sget(row, S_KAPPA));
    let total = mass_at_ymax(row, s96, ymax);
    // the largest y off the list (none when the list holds the row)
    var yb = neg_inf();
    if (kappa != 0u) {
        yb = from_key(kappa - 1u);
    }
    if (wg_flag(lid, xf && n_fin >= 2u)) {
        let bar = sp.xtc_thr * (total * TWO_M40);
        if (!wg_flag(lid, exp_f32(yb - ymax) < bar)) {
            return W_NONE;
        }
        var c = 0u;
        var last = 0u;
        for (var j = lid; j < n; j = j + WG) {
            if (exp_f32(bitcast<f32>(entry(row, j).y) - ymax) >= bar) {
                c = c + 1u;
                last = max(last, j);
            }
        }
        let top = wg_sum_max(lid, c, last);
        if (wg_flag(lid, top.x >= 2u)) {
            if ((sp.flags & F_KEPT) == 0u && lid == 0u) {
                ssetf(row, S_VMAX, bitcast<f32>(entry(row, top.y).y));
            }
            // (with the kept distribution too: the full-row path's `kept_row`)
            return select(W_DRAW, W_NONE, (sp.flags & F_KEPT) != 0u);
        }
    }
    if ((sp.flags & F_KEPT) != 0u) {
        let m = min(wg_uniform(lid, sp.n_kept), n_fin);
        if (!wg_flag(lid, m <= n)) {
            return W_NONE;
        }
        kept_list(lid, row, sp, 0u, n_fin, ymax, total);
    }
    if (lid == 0u) {
        if (won == NO_TOKEN) {
            sset(row, S_STATUS, 4u);
            sset(row, S_PATH, P_NONE);
        } else {
            sset(row, S_TOKEN, won);
            sset(row, S_PATH, P_DONE);
        }
    }
    return W_DONE;
}
