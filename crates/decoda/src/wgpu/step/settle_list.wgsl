// ---------------------------------------------------------------------------------
// settle: status, filters on the candidates (or the full row), the draw.

// Candidate j of the row's list: (token, y). The list is in no order: the scan appends
// candidates as it finds them; every decision below is a key threshold found by
// selections over it, so a kept set is the candidates whose keys lie in a range [lo, hi].
fn entry(row: u32, j: u32) -> vec2<u32> {
    let b = cand(row) + 2u * j;
    return vec2<u32>(work[b], work[b + 1u]);
}

// A candidate's y as a comparison key.
fn ekey(en: vec2<u32>) -> u32 {
    return cmp_key(bitcast<f32>(en.y));
}

const KEY_MAX: u32 = 0xffffffffu;

// Whether candidate a comes before b: larger y first, then the smaller id.
fn before_entry(a: vec2<u32>, b: vec2<u32>) -> bool {
    let ka = ekey(a);
    let kb = ekey(b);
    return ka > kb || (ka == kb && a.x < b.x);
}

// Candidates among the first n whose y key is at least `key` (uniform).
fn count_at_least(lid: u32, row: u32, n: u32, key: u32) -> u32 {
    return count_range(lid, row, n, key, KEY_MAX);
}

// Candidates among the first n whose y key lies in [lo, hi] (uniform).
fn count_range(lid: u32, row: u32, n: u32, lo: u32, hi: u32) -> u32 {
    var c = 0u;
    for (var j = lid; j < n; j = j + WG) {
        let k = ekey(entry(row, j));
        if (k >= lo && k <= hi) {
            c = c + 1u;
        }
    }
    return wg_uniform(lid, wg_sum_u32(lid, c));
}

// ---------------------------------------------------------------------------------
// Selections over the list, in workgroup memory (`hk`): four levels of 8-bit digits,
// most significant first, 256 bins. Each level reads the list once into the bins; then
// 16 invocations add up 16 bins each and one walks those sums and the bins of the one
// it stops in, from the largest digit down (three barriers a level, where a scan over
// the workgroup takes sixteen). Nothing is sorted and nothing is left in global memory.

// Digit `level` of v, and whether v lies under the digits chosen so far.
fn digit8(v: u32, level: u32) -> u32 {
    return (v >> (24u - 8u * level)) & 0xffu;
}

fn under8(v: u32, level: u32, prefix: u32) -> bool {
    return level == 0u || (v >> (32u - 8u * level)) == prefix;
}

// The rank-th largest value (1-based; rank at most their count) over the candidates
// among the first n with keys in [lo, hi]: the value is the key, or with `by_id` the
// complement of the id (so the rank-th smallest id). Returns (value, its rank among
// its equals, their count), uniform.
fn list_select(lid: u32, row: u32, n: u32, lo: u32, hi: u32, rank: u32, by_id: bool)
    -> vec3<u32> {
    var prefix = 0u;
    var rem = rank;
    var ties = 0u;
    for (var level = 0u; level < 4u + opaque_zero(); level = level + 1u) {
        atomicStore(&hk[lid], 0u);
        workgroupBarrier();
        for (var j = lid; j < n; j = j + WG) {
            let en = entry(row, j);
            let k = ekey(en);
            if (k < lo || k > hi) {
                continue;
            }
            let v = select(k, ~en.x, by_id);
            if (under8(v, level, prefix)) {
                atomicAdd(&hk[digit8(v, level)], 1u);
            }
        }
        workgroupBarrier();
        let r = pick_count(lid, rem);
        prefix = (prefix << 8u) | r.x;
        rem = r.y;
        ties = r.z;
    }
    return vec3<u32>(prefix, rem, ties);
}

// The bin (of the 256 counts in `hk`) holding the rem-th largest value (rem at most
// their total), walking from the largest digit: (digit, rem's rank inside the bin, the
// bin's count), uniform.
fn pick_count(lid: u32, rem: u32) -> vec3<u32> {
    if (lid < 16u) {
        var c = 0u;
        for (var q = 0u; q < 16u + opaque_zero(); q = q + 1u) {
            c = c + atomicLoad(&hk[255u - 16u * lid - q]);
        }
        ra[lid] = c;
    }
    workgroupBarrier();
    if (lid == 0u) {
        var cum = 0u;
        var g = 0u;
        while (g < 15u && cum + ra[g] < rem) {
            cum = cum + ra[g];
            g = g + 1u;
        }
        for (var q = 0u; q < 16u + opaque_zero(); q = q + 1u) {
            let d = 255u - 16u * g - q;
            let c = atomicLoad(&hk[d]);
            if (cum + c >= rem) {
                wcut = vec4<u32>(d, rem - cum, c, 0u);
                break;
            }
            cum = cum + c;
        }
    }
    return workgroupUniformLoad(&wcut).xyz;
}

// A bin's 96-bit mass (`add_mass96`).
fn bin_mass(d: u32) -> vec3<u32> {
    return vec3<u32>(atomicLoad(&hk[d]), atomicLoad(&hk[256u + d]), atomicLoad(&hk[512u + d]));
}

// The bin (of the 256 masses in `hk`) where the running mass from the largest digit,
// after `above`, first reaches `goal` (invocation 0's; with `own`, first set to p of
// the bins' total): (digit, the mass before it), or NO_TOKEN when the total never
// does; uniform.
fn pick_mass(lid: u32, above: vec3<u32>, goal: ptr<function, f32>, own: bool, p: f32)
    -> vec4<u32> {
    if (lid < 16u) {
        var m = vec3<u32>(0u, 0u, 0u);
        for (var q = 0u; q < 16u + opaque_zero(); q = q + 1u) {
            m = add96(m, bin_mass(255u - 16u * lid - q));
        }
        ra[lid] = m.x;
        ra[16u + lid] = m.y;
        ra[32u + lid] = m.z;
    }
    workgroupBarrier();
    if (lid == 0u) {
        wcut = vec4<u32>(NO_TOKEN, 0u, 0u, 0u);
        if (own) {
            var t = vec3<u32>(0u, 0u, 0u);
            for (var g = 0u; g < 16u + opaque_zero(); g = g + 1u) {
                t = add96(t, vec3<u32>(ra[g], ra[16u + g], ra[32u + g]));
            }
            *goal = p * val96(t);
        }
        var cum = above;
        var g = 0u;
        loop {
            let nxt = add96(cum, vec3<u32>(ra[g], ra[16u + g], ra[32u + g]));
            if (val96(nxt) >= *goal) {
                break;
            }
            cum = nxt;
            g = g + 1u;
            if (g == 16u) {
                break;
            }
        }
        if (g < 16u) {
            for (var q = 0u; q < 16u + opaque_zero(); q = q + 1u) {
                let d = 255u - 16u * g - q;
                let nxt = add96(cum, bin_mass(d));
                if (val96(nxt) >= *goal) {
                    wcut = vec4<u32>(d, cum);
                    break;
                }
                cum = nxt;
            }
        }
    }
    return workgroupUniformLoad(&wcut);
}

// Adds a 96-bit mass to bin d of the workgroup's mass histogram (words d, 256 + d,
// 512 + d of `hk`, carried by hand: the sum is exact, in any order).
fn add_mass96(d: u32, e: vec3<u32>) {
    let o0 = atomicAdd(&hk[d], e.x);
    let c1 = select(0u, 1u, o0 + e.x < o0);
    let a1 = e.y + c1;
    var c2 = select(0u, 1u, a1 < c1);
    if (a1 != 0u) {
        let o1 = atomicAdd(&hk[256u + d], a1);
        if (o1 + a1 < o1) {
            c2 = c2 + 1u;
        }
    }
    let a2 = e.z + c2;
    if (a2 != 0u) {
        atomicAdd(&hk[512u + d], a2);
    }
}

// Top-p's cut on the list: over the candidates with keys in [lo, hi], walked by
// decreasing y, the key of the first whose running mass (fixed72 of exp(y - r_ref),
// summed exactly) reaches p of `total`, or with `own` of their own total (the first
// level's bins add up to it): (1, key), or (0, 0) when the sum never does. Ties of y
// fall together, so a radix walk over keys by mass finds the same key as a sorted walk.
fn list_mass_cut(lid: u32, row: u32, n: u32, lo: u32, hi: u32, r_ref: f32, p: f32,
                 total: vec3<u32>, own: bool) -> vec2<u32> {
    var goal = p * val96(total);
    var prefix = 0u;
    var above = vec3<u32>(0u, 0u, 0u);
    for (var level = 0u; level < 4u + opaque_zero(); level = level + 1u) {
        atomicStore(&hk[lid], 0u);
        atomicStore(&hk[256u + lid], 0u);
        atomicStore(&hk[512u + lid], 0u);
        workgroupBarrier();
        for (var j = lid; j < n; j = j + WG) {
            let en = entry(row, j);
            let k = ekey(en);
            if (k < lo || k > hi || !under8(k, level, prefix)) {
                continue;
            }
            let e = fixed72(exp_f32(bitcast<f32>(en.y) - r_ref));
            if ((e.x | e.y | e.z) != 0u) {
                add_mass96(digit8(k, level), e);
            }
        }
        workgroupBarrier();
        let r = pick_mass(lid, above, &goal, own && level == 0u, p);
        if (r.x == NO_TOKEN) {
            // (only at level 0: a chosen bin's mass reaches the goal at every level)
            return vec2<u32>(0u, 0u);
        }
        prefix = (prefix << 8u) | r.x;
        above = r.yzw;
    }
    return vec2<u32>(1u, prefix);
}

// A pair of the sorted top (`list_top`, in `hk`).
fn top_at(j: u32) -> vec2<u32> {
    return vec2<u32>(atomicLoad(&hk[2u * j]), atomicLoad(&hk[2u * j + 1u]));
}

fn top_put(j: u32, v: vec2<u32>) {
    atomicStore(&hk[2u * j], v.x);
    atomicStore(&hk[2u * j + 1u], v.y);
}

// Sorts the m (id, y) pairs in `hk` (m <= 1,024): larger y first, then the smaller id
// (bitonic, in workgroup memory).
fn sort_top(lid: u32, m: u32) {
    var np = 1u;
    while (np < m) {
        np = np << 1u;
    }
    // padding sorts last: id NO_TOKEN, y -inf
    for (var j = m + lid; j < np; j = j + WG) {
        top_put(j, vec2<u32>(NO_TOKEN, NEG_INF_BITS));
    }
    workgroupBarrier();
    for (var k = 2u; k <= np; k = k << 1u) {
        for (var jj = k >> 1u; jj > 0u; jj = jj >> 1u) {
            for (var t = lid; t < np; t = t + WG) {
                let l = t ^ jj;
                if (l > t) {
                    let a = top_at(t);
                    let c = top_at(l);
                    if (((t & k) == 0u) == before_entry(c, a)) {
                        top_put(t, c);
                        top_put(l, a);
                    }
                }
            }
            workgroupBarrier();
        }
    }
}

// The m most likely candidates (1 <= m <= 1,024) of the `avail` among the first n with
// keys in [lo, hi], in order, as (id, y) pairs in `hk` (`top_at`): the m-th largest key
// by a selection (and, when some of its ties are left out, the smallest ids among them
// by a second: the same code, run again), one read gathering them, and a sort of those
// m alone.
fn list_top(lid: u32, row: u32, n: u32, lo: u32, hi: u32, avail: u32, m: u32) {
    var kc = lo;
    var idc = NO_TOKEN;
    var by_id = false;
    var go = m < avail;
    var slo = lo;
    var shi = hi;
    var rank = m;
    loop {
        if (!go) {
            break;
        }
        let s = list_select(lid, row, n, slo, shi, rank, by_id);
        go = false;
        if (by_id) {
            idc = ~s.x;
        } else {
            kc = s.x;
            if (s.y < s.z) {
                by_id = true;
                slo = kc;
                shi = kc;
                rank = s.y;
                go = true;
            }
        }
    }
    if (lid == 0u) {
        atomicStore(&wcnt, 0u);
    }
    workgroupBarrier();
    for (var j = lid; j < n; j = j + WG) {
        let en = entry(row, j);
        let k = ekey(en);
        if (k >= kc && k <= hi && (k > kc || en.x <= idc)) {
            top_put(atomicAdd(&wcnt, 1u), en);
        }
    }
    workgroupBarrier();
    sort_top(lid, m);
}

// What a settled row lists, written by `list_out` (one place, so a device builds one
// copy of the selections): its set is the `avail` candidates of the list's n with keys
// in [lo, hi]; the top m_lp processed log-probabilities (against `vtop` and the set's
// log-sum-exp `lse`) and the kept distribution's m_k tokens (mass `ktotal` against
// `vtop`, in 2^-40 units), both in the same order.
struct ListOut {
    n: u32,
    lo: u32,
    hi: u32,
    avail: u32,
    m_lp: u32,
    m_k: u32,
    vtop: f32,
    lse: f32,
    ktotal: f32,
}

var<private> lout: ListOut;

fn list_out(lid: u32, row: u32) {
    let o = lout;
    let m = wg_uniform(lid, max(o.m_lp, o.m_k));
    if (m == 0u) {
        return;
    }
    list_top(lid, row, o.n, o.lo, o.hi, o.avail, m);
    if (lid == 0u) {
        let ob = row * RESW + 2u;
        for (var j = 0u; j < o.m_lp; j = j + 1u) {
            let en = top_at(j);
            out_res[ob + 3u + 2u * j] = en.x;
            out_res[ob + 4u + 2u * j] = bitcast<u32>(fp(bitcast<f32>(en.y) - o.vtop) - o.lse);
        }
    }
    let kb = kept_area(row);
    for (var j = lid; j < o.m_k; j = j + WG) {
        let en = top_at(j);
        out_res[kb + 2u + 2u * j] = en.x;
        let w = exp_diff(bitcast<f32>(en.y), o.vtop);
        out_res[kb + 3u + 2u * j] = bitcast<u32>(div_rn_cold(w, o.ktotal * TWO_M40));
    }
    workgroupBarrier();
}

// The list path of a filtered row: true when the candidates settle it (then the token is
// in S_TOKEN, and the kept set is the candidates with keys in S_KLO ..= S_KHI: past
// typical-p's excluded top and XTC's top choices when `xf`, its coin fired; rows whose
// XTC is on never reach `draw_many`).
fn settle_list(lid: u32, row: u32, slot: u32, sp: SlotP, n: u32, ymax: f32, s96: vec3<u32>,
               xf: bool, typ: Typ) -> bool {
    let tk = (sp.flags & F_TOP_K) != 0u;
    let tp = (sp.flags & F_TOP_P) != 0u;
    let mp = (sp.flags & F_MIN_P) != 0u;
    let top_k = sp.top_k;
    let kappa = wg_uniform(lid, sget(row, S_KAPPA));
    let complete = kappa == 0u;
    // K (after top-n-σ and top-k) is the candidates with keys >= lo, when the list
    // holds it
    var lo = 0u;
    var hi = KEY_MAX;
    // top-n-σ: every y at or above its threshold (S_TAU_K, from settle_row); the list
    // holds them all when the threshold is at or above kappa
    let sg = (sp.flags & F_TOP_N_SIGMA) != 0u;
    var n_sig = n;
    var sig_ok = false;
    if (sg) {
        let ks = wg_uniform(lid, cmp_key(sgetf(row, S_TAU_K)));
        n_sig = count_at_least(lid, row, n, ks);
        sig_ok = complete || ks >= kappa;
        lo = ks;
    }
    // top-k over those: the k-th largest y, if the list holds k of them (or all of K0,
    // when it holds fewer)
    var k_ok = false;
    if (tk && top_k <= n_sig) {
        lo = list_select(lid, row, n, 0u, KEY_MAX, top_k, false).x;
        k_ok = true;
    } else if (tk && sig_ok) {
        k_ok = true;
    }
    // K (after top-n-σ and top-k) lies in the list
    var k_in = (tk && k_ok) || sig_ok;
    // stage 6a, typical-p: its band is the candidates of K it keeps, topped by `ym`,
    // when the list holds K (its sums from the list) or, with the scan's sums (K is
    // every finite y), when the cut the walk finds proves the band lies in the list
    var ym = ymax;
    if ((sp.flags & F_TYPICAL) != 0u) {
        let whole = k_in || complete;
        if (!wg_flag(lid, whole || typ.pre)) {
            return false;
        }
        var pre = typ;
        if (whole) {
            pre.pre = false;
        }
        ym = typical_row(lid, row, sp, ymax, n, lo, pre);
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
            // the band: a run of K in y's order (|y - c| grows away from c both ways),
            // so a range of keys
            var low = 0u;
            var top = 0u;
            for (var j = lid; j < n; j = j + WG) {
                let en = entry(row, j);
                let k = ekey(en);
                if (k >= lo && typ_in(row, bitcast<f32>(en.y))) {
                    low = max(low, ~k);
                    top = max(top, k);
                }
            }
            lo = ~wg_uniform(lid, wg_sum_max(lid, 0u, low).y);
            hi = wg_uniform(lid, wg_sum_max(lid, 0u, top).y);
            ym = from_key(hi);
        }
        k_in = true;
    }
    // min-p: y >= ymax + ln(min_p); the list holds every y >= m0 + ln(min_p) <= that
    var lo_m = 0u;
    var m_ok = false;
    if (mp) {
        lo_m = wg_uniform(lid, cmp_key(ym + sp.ln_min_p));
        m_ok = !is_neg_inf(sgetf(row, S_GTHR));
    }
    // top-p over K: the cut where the mass walked by decreasing y reaches p of K's
    var lo_p = 0u;
    var p_ok = false;
    var p_covers = false;
    if (tp && (k_in || (!tk && !sg))) {
        // K lies in the list: its mass against ymax (the walk's own total), else the
        // scan's, against R
        let r_ref = select(sgetf(row, S_R), ym, k_in);
        let cut = list_mass_cut(lid, row, n, lo, hi, r_ref, sp.top_p, s96, k_in);
        if (cut.x != 0u) {
            // every candidate whose mass is at least the cut's stays (ties kept)
            let em = fixed72(exp_f32(from_key(cut.y) - r_ref));
            var low = 0u;
            for (var j = lid; j < n; j = j + WG) {
                let en = entry(row, j);
                let k = ekey(en);
                if (k >= lo && k <= hi
                    && !gt96(em, fixed72(exp_f32(bitcast<f32>(en.y) - r_ref)))) {
                    low = max(low, ~k);
                }
            }
            lo_p = ~wg_uniform(lid, wg_sum_max(lid, 0u, low).y);
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
        }
    }
    let covered = k_in || p_covers || (mp && m_ok) || complete;
    let valid = wg_flag(lid, (!tp || p_ok) && covered);
    if (!valid) {
        return false;
    }
    lo = max(lo, max(lo_p, lo_m));
    var size = count_range(lid, row, n, lo, hi);
    // stage 8a, XTC: over the kept set, its top choices (q >= the threshold); with two
    // or more, the tokens above the least likely one leave (its ties stay): the set's
    // top becomes that one's y, `vtop`
    var vtop = ym;
    if (wg_flag(lid, xf && size >= 2u)) {
        var part_sum = vec3<u32>(0u, 0u, 0u);
        for (var j = lid; j < n; j = j + WG) {
            let en = entry(row, j);
            let k = ekey(en);
            if (k >= lo && k <= hi) {
                part_sum = add96(part_sum, fixed72(exp_f32(bitcast<f32>(en.y) - ym)));
            }
        }
        let bar = sp.xtc_thr * (val96(wg_sum96(lid, part_sum)) * TWO_M40 * TWO_M32);
        var c = 0u;
        var low = 0u;
        for (var j = lid; j < n; j = j + WG) {
            let en = entry(row, j);
            let k = ekey(en);
            if (k >= lo && k <= hi && exp_f32(bitcast<f32>(en.y) - ym) >= bar) {
                c = c + 1u;
                low = max(low, ~k);
            }
        }
        let top = wg_sum_max(lid, c, low);
        if (wg_flag(lid, top.x >= 2u)) {
            // the least likely top choice: the smallest key among them
            hi = ~wg_uniform(lid, top.y);
            vtop = from_key(hi);
            size = count_range(lid, row, n, lo, hi);
        }
    }
    // the draw: Gumbel-max over the kept candidates
    let stp = step_of(slot);
    let seed = vec2<u32>(sp.seed_lo, sp.seed_hi);
    var bk = 0u;
    var bi = NO_TOKEN;
    for (var j = lid; j < n; j = j + WG) {
        let en = entry(row, j);
        let k = ekey(en);
        if (k < lo || k > hi) {
            continue;
        }
        let sk = cmp_key(bitcast<f32>(en.y) + gumbel(noise_word(en.x, seed, stp.x, stp.y)));
        if (sk > bk || (sk == bk && en.x < bi)) {
            bk = sk;
            bi = en.x;
        }
    }
    let w = wg_argmax(lid, bk, bi);
    // processed log-probabilities over the kept set (the list holds all of it): the
    // log-sum-exp, the chosen token's rank, the n most likely in order (`list_out`); the
    // kept distribution's size (its tokens: `list_out`)
    let lp_on = (sp.flags & F_LOGPROBS) != 0u && (sp.flags & F_PROCESSED) != 0u;
    let kept_on = (sp.flags & F_KEPT) != 0u;
    if (wg_flag(lid, (lp_on || kept_on) && w.y != NO_TOKEN)) {
        var acc = vec2<u32>(0u, 0u);
        var wb = 0u;
        for (var j = lid; j < n; j = j + WG) {
            let en = entry(row, j);
            let k = ekey(en);
            if (k >= lo && k <= hi) {
                acc = add64(acc, fixed40(exp_diff(bitcast<f32>(en.y), vtop)));
                if (en.x == w.y) {
                    wb = en.y;
                }
            }
        }
        let mass = val64(wg_sum64(lid, acc));
        let lse = ln_f32(max(mass * TWO_M40, 1.0));
        // the chosen token's y (its bits: one invocation holds it, the others 0)
        let yw = bitcast<f32>(wg_uniform(lid, wg_sum_max(lid, 0u, wb).y));
        let kw = cmp_key(yw);
        // the candidates before the chosen one: larger y, or its y and a smaller id
        var ahead = 0u;
        for (var j = lid; j < n; j = j + WG) {
            let en = entry(row, j);
            let k = ekey(en);
            if (k <= hi && (k > kw || (k == kw && en.x < w.y))) {
                ahead = ahead + 1u;
            }
        }
        let rank = wg_sum_u32(lid, ahead) + 1u;
        let m_lp = select(0u, min(min(sp.n_lp, NTOP), size), lp_on);
        let m_k = select(0u, min(sp.n_kept, size), kept_on);
        if (lid == 0u) {
            if (lp_on) {
                let ob = row * RESW + 2u;
                out_res[ob] = bitcast<u32>(fp(yw - vtop) - lse);
                out_res[ob + 1u] = rank;
                out_res[ob + 2u] = m_lp;
                sset(row, S_LP_DONE, 1u);
            }
            if (kept_on) {
                let kb = kept_area(row);
                out_res[kb] = size;
                out_res[kb + 1u] = m_k;
            }
        }
        // (every invocation: `list_out` reads it)
        lout = ListOut(n, lo, hi, size, m_lp, m_k, vtop, lse, mass);
    }
    if (lid == 0u) {
        sset(row, S_NS, n);
        sset(row, S_KLO, lo);
        sset(row, S_KHI, hi);
        if (w.y == NO_TOKEN) {
            sset(row, S_STATUS, 4u);
            sset(row, S_PATH, P_NONE);
        } else {
            sset(row, S_TOKEN, w.y);
            sset(row, S_PATH, P_DONE);
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
// list holds its top. XTC's top choices (w >= threshold Σ w) are all on the list when
// the largest y off it is no top choice; with two or more, S_VMAX bounds the set and
// the draw over the row is left (W_DRAW: one read); with fewer the set is every finite
// y and the scan's winner `won` is the token. The kept distribution is its n most
// likely, on the list (their ties too: the list holds every y at or above its threshold).
fn settle_whole(lid: u32, row: u32, sp: SlotP, n: u32, ymax: f32, s96: vec3<u32>,
                n_fin: u32, xf: bool, won: u32) -> u32 {
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
        var low = 0u;
        for (var j = lid; j < n; j = j + WG) {
            let en = entry(row, j);
            if (exp_f32(bitcast<f32>(en.y) - ymax) >= bar) {
                c = c + 1u;
                low = max(low, ~ekey(en));
            }
        }
        let top = wg_sum_max(lid, c, low);
        if (wg_flag(lid, top.x >= 2u)) {
            if ((sp.flags & F_KEPT) == 0u && lid == 0u) {
                // the least likely top choice: the smallest key among them
                ssetf(row, S_VMAX, from_key(~top.y));
            }
            // (with the kept distribution too: the full-row path's kept phases)
            return select(W_DRAW, W_NONE, (sp.flags & F_KEPT) != 0u);
        }
    }
    if ((sp.flags & F_KEPT) != 0u) {
        let m = min(sp.n_kept, n_fin);
        if (!wg_flag(lid, m <= n)) {
            return W_NONE;
        }
        if (lid == 0u) {
            let kb = kept_area(row);
            out_res[kb] = n_fin;
            out_res[kb + 1u] = m;
        }
        lout = ListOut(n, 0u, KEY_MAX, n, 0u, m, ymax, 0.0, total);
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
