// ---------------------------------------------------------------------------------
// lp: read 2 (rows with raw or unfiltered log-probabilities, and full-row draws).

// Stage-10 membership and y of token i of a sampling row (the full-row path's filters,
// or none; S_VMAX is XTC's upper bound, `typ_in` typical-p's band).
struct Member {
    inside: bool,
    y: f32,
}

fn member(row: u32, z: f32, t: f32) -> Member {
    if (is_neg_inf(z)) {
        return Member(false, neg_inf());
    }
    let y = div_rn_cold(z, t);
    let yk = cmp_key(y);
    if (yk < cmp_key(sgetf(row, S_TAU_K)) || yk < cmp_key(sgetf(row, S_TAU_MIN))
        || yk > cmp_key(sgetf(row, S_VMAX)) || !typ_in(row, y)) {
        return Member(false, y);
    }
    if (sget(row, S_P_CUT) != 0u) {
        let q = div_rn_cold(exp_f32(y - sgetf(row, S_YMAX)), sgetf(row, S_SUM) * TWO_M40);
        if (cmp_key(q) < cmp_key(sgetf(row, S_TAU_Q))) {
            return Member(false, y);
        }
    }
    return Member(true, y);
}

// The value log-probabilities are taken of (-inf outside the kept set).
fn lp_value(row: u32, slot: u32, sp: SlotP, i: u32, status: u32) -> f32 {
    let x = load_x(row, i);
    if ((sp.flags & F_PROCESSED) == 0u) {
        return x;
    }
    let z = z_of(slot, sp, i, x);
    if (status == 1u) {
        return z;
    }
    let mb = member(row, z, sp.temperature);
    if (!mb.inside) {
        return neg_inf();
    }
    return mb.y;
}

fn vmax_of(row: u32, sp: SlotP, status: u32) -> f32 {
    if ((sp.flags & F_PROCESSED) == 0u) {
        return sgetf(row, S_XMAX);
    }
    if (status == 1u) {
        return sgetf(row, S_ZMAX);
    }
    return set_top(row);
}

// The largest y of a sampling row's kept set: ymax, or below it when XTC removed its
// top choices.
fn set_top(row: u32) -> f32 {
    let top = sgetf(row, S_VMAX);
    let ymax = sgetf(row, S_YMAX);
    return select(ymax, top, cmp_key(top) < cmp_key(ymax));
}

fn before_in_rank(v: f32, i: u32, w: f32, j: u32) -> bool {
    return v > w || (v == w && i < j);
}

// The full-row draw over tokens 4g .. min(4g + 4, end) of a row on the full-row path
// (its kept set: `member`): `best` (key, id) updated, ties to the smaller id. Philox runs
// once for the group, and only when one of its tokens is kept.
fn draw_group(row: u32, slot: u32, sp: SlotP, g: u32, end: u32, stp: vec2<u32>,
              best: vec2<u32>) -> vec2<u32> {
    var b = best;
    var words = vec4<u32>(0u, 0u, 0u, 0u);
    var have = false;
    for (var j = 0u; j < 4u; j = j + 1u) {
        let i = g * 4u + j;
        if (i >= end) {
            break;
        }
        let mb = member(row, z_of(slot, sp, i, load_x(row, i)), sp.temperature);
        if (mb.inside) {
            if (!have) {
                words = philox_cold(vec4<u32>(g, stp.x, stp.y, 0u), vec2<u32>(sp.seed_lo, sp.seed_hi));
                have = true;
            }
            let sk = cmp_key(mb.y + gumbel(words[j]));
            if (sk > b.x || (sk == b.x && i < b.y)) {
                b = vec2<u32>(sk, i);
            }
        }
    }
    return b;
}

@compute @workgroup_size(256)
fn lp(@builtin(workgroup_id) wid: vec3<u32>, lanes: Lanes) {
    let lid = lanes.lid;
    lanes_init(lanes);
    let split = wid.x;
    let row = tail_row(wid.y, (call.mode & M_LEAN) != 0u);
    if (!wg_flag(lid, sget(row, S_LP) != 0u)) {
        return;
    }
    let slot = rmap[row];
    let sp = sparams[slot];
    let status = sget(row, S_STATUS);
    let full = sget(row, S_PATH) == P_FULL;
    let want_lp = (sp.flags & F_LOGPROBS) != 0u;
    let token = sget(row, S_TOKEN);
    let vmax = vmax_of(row, sp, status);
    var vc = 0.0;
    if (want_lp && !full) {
        vc = lp_value(row, slot, sp, token, status);
    }
    let n = min(sp.n_lp, NTOP);
    let stp = step_of(slot);
    var tv: array<f32, 20>;
    var ti: array<u32, 20>;
    var cnt = 0u;
    var before = 0u;
    var acc = vec2<u32>(0u, 0u);
    let start = split * call.chunk;
    let end = min(call.vocab, start + call.chunk);
    let g0 = start / 4u;
    let g1 = (end + 3u) / 4u;
    var best = vec2<u32>(0u, NO_TOKEN);
    for (var g = g0 + lid; g < g1; g = g + WG) {
        if (full) {
            best = draw_group(row, slot, sp, g, end, stp, best);
        }
        if (!want_lp) {
            continue;
        }
        for (var j = 0u; j < 4u; j = j + 1u) {
            let i = g * 4u + j;
            if (i >= end) {
                break;
            }
            let v = lp_value(row, slot, sp, i, status);
            if (is_neg_inf(v)) {
                continue;
            }
            acc = add64(acc, fixed40(exp_f32(v - vmax)));
            if (!full && before_in_rank(v, i, vc, token)) {
                before = before + 1u;
            }
            if (n == 0u) {
                continue;
            }
            if (cnt == n && !before_in_rank(v, i, tv[n - 1u], ti[n - 1u])) {
                continue;
            }
            var p = min(cnt, n - 1u);
            loop {
                if (p == 0u || !before_in_rank(v, i, tv[p - 1u], ti[p - 1u])) {
                    break;
                }
                tv[p] = tv[p - 1u];
                ti[p] = ti[p - 1u];
                p = p - 1u;
            }
            tv[p] = v;
            ti[p] = i;
            cnt = min(cnt + 1u, n);
        }
    }
    let dr = wg_argmax(lid, best.x, best.y);
    let lse = wg_sum64(lid, acc);
    let total_before = wg_sum_u32(lid, before);
    let pb = part(row, split);
    var h = 0u;
    // (a row drawn here without log-probabilities lists nothing: finish reads no list)
    for (var r = 0u; r < select(0u, NTOP, want_lp); r = r + 1u) {
        var k = 0u;
        var idx = 0xffffffffu;
        if (h < cnt) {
            k = key_of(tv[h]);
            idx = ti[h];
        }
        let w = wg_argmax(lid, k, idx);
        if (h < cnt && w.x == k && w.y == idx) {
            h = h + 1u;
        }
        if (lid == 0u) {
            work[pb + 24u + 2u * r] = w.x;
            work[pb + 25u + 2u * r] = w.y;
        }
    }
    if (lid == 0u) {
        work[pb + 16u] = lse.x;
        work[pb + 17u] = lse.y;
        work[pb + 18u] = total_before;
        work[pb + 19u] = dr.x;
        work[pb + 20u] = dr.y;
    }
}

