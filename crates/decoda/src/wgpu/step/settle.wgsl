// ---------------------------------------------------------------------------------
// settle: one workgroup per row after the scan. The row's status and ymax from the
// scan's partials (`settle_head`), top-n-σ's threshold (step/sigma.wgsl), then the
// candidate list's decisions (`settle_list`, `settle_whole`), or, for a row its
// candidates cannot settle, the start of the full-row path (step/walk.wgsl), whose
// phases run after it over many workgroups; the draw then runs in lp with `member`.

@compute @workgroup_size(256)
fn settle(@builtin(workgroup_id) wid: vec3<u32>, lanes: Lanes) {
    let lid = lanes.lid;
    lanes_init(lanes);
    settle_row(lid, wid.x, false);
}

// settle in two dispatches (devices that do not fuse settle_finish: a software adapter
// builds each half far faster than the whole): `settle_first`, which leaves a row's
// candidate-list decisions (`settle_list`) to `settle_rest` through the row's state
// (S_HAND), then `settle_rest`. The same functions in the same order: the same bits.
@compute @workgroup_size(256)
fn settle_first(@builtin(workgroup_id) wid: vec3<u32>, lanes: Lanes) {
    let lid = lanes.lid;
    lanes_init(lanes);
    settle_row(lid, wid.x, true);
}

@compute @workgroup_size(256)
fn settle_rest(@builtin(workgroup_id) wid: vec3<u32>, lanes: Lanes) {
    let lid = lanes.lid;
    lanes_init(lanes);
    let row = wid.x;
    let hand = wg_uniform(lid, sget(row, S_HAND));
    if (hand == 0u) {
        return;
    }
    let slot = rmap[row];
    let sp = sparams[slot];
    let xf = hand == 2u;
    let typ = Typ(sget(row, S_H_TYP) != 0u, sgetf(row, S_H_TYP + 1u), sgetf(row, S_H_TYP + 2u));
    let s96 = vec3<u32>(sget(row, S_H_S96), sget(row, S_H_S96 + 1u), sget(row, S_H_S96 + 2u));
    lout = ListOut(0u, 0u, 0u, 0u, 0u, 0u, 0.0, 0.0, 0.0);
    let n_all = wg_uniform(lid, sget(row, S_H_N));
    let done = settle_list(lid, row, slot, sp, n_all, sgetf(row, S_H_YMAX), s96, xf, typ);
    settle_tail(lid, row, sp, xf, typ, done, W_NONE);
    settle_lp(lid, row, sp);
}

// A call without log-probabilities or draws (`Plan::Lean` in kernels.rs): settle, and
// for a row its candidates settle the kept distribution and finish, in one dispatch; a
// row on the full-row path is drawn by lp's workgroups and finished by finish.
@compute @workgroup_size(256)
fn settle_finish(@builtin(workgroup_id) wid: vec3<u32>, lanes: Lanes) {
    let lid = lanes.lid;
    lanes_init(lanes);
    let row = wid.x;
    settle_row(lid, row, false);
    storageBarrier();
    draw_finish_row(lid, row);
}

// settle_finish after `settle`, as a dispatch of its own (devices that do not fuse them:
// a software adapter builds the two halves far faster than the whole).
@compute @workgroup_size(256)
fn draw_finish(@builtin(workgroup_id) wid: vec3<u32>, lanes: Lanes) {
    let lid = lanes.lid;
    lanes_init(lanes);
    draw_finish_row(lid, wid.x);
}

// The kept distribution and finish of a row its candidates settled, after settle_row
// (a lean call: `M_LEAN`). A row on the full-row path is left to lp, whose workgroups
// draw it over the row's splits, and to finish.
fn draw_finish_row(lid: u32, row: u32) {
    if (wg_flag(lid, sget(row, S_PATH) == P_FULL)) {
        return;
    }
    kept_greedy(lid, row);
    finish_row(lid, row);
}

// What every row's settle starts with, from the scan's partials (words 0-6): the
// non-finite counts, the largest z and the draw's winner, reduced over the splits; the
// row's status (`st`, uniform), ymax, and its state for the stages after it (token and
// path already set for a row no filter touches: `filt` false).
struct Head {
    st: u32,
    ymax: f32,
    // the scan's draw winner (`NO_TOKEN`: none)
    drawn: u32,
}

fn settle_head(lid: u32, row: u32, slot: u32, sp: SlotP, filt: bool) -> Head {
    let t = sp.temperature;
    var bad_x = 0u;
    var bad_z = 0u;
    var xk = 0u;
    var zk = 0u;
    var zi = NO_TOKEN;
    var bk = 0u;
    var bi = NO_TOKEN;
    for (var s = lid; s < call.splits; s = s + WG) {
        let pb = part(row, s);
        bad_x = bad_x + work[pb];
        bad_z = bad_z + work[pb + 1u];
        xk = max(xk, work[pb + 2u]);
        let k = work[pb + 3u];
        let i = work[pb + 4u];
        if (k > zk || (k == zk && i < zi)) {
            zk = k;
            zi = i;
        }
        let dk = work[pb + 5u];
        let di = work[pb + 6u];
        if (dk > bk || (dk == bk && di < bi)) {
            bk = dk;
            bi = di;
        }
    }
    let a = wg_sum_max(lid, bad_x, xk);
    let bz = wg_sum_u32(lid, bad_z);
    let zm = wg_argmax(lid, zk, zi);
    let dr = wg_argmax(lid, bk, bi);
    // (a slot halted earlier in a verify does not step either: M_HALTS)
    let halted = (call.mode & M_HALTS) != 0u && sstate[slot * SSW + SS_HALT] != 0u;
    let fin = (call.mode & M_HEAD) != 0u && (sstate[slot * SSW + 4u] != 0u || halted);
    let zmax = from_key(zm.x);
    var status = 0u;
    var count = 0u;
    var ymax = neg_inf();
    if (fin) {
        status = 5u;
    } else if (a.x > 0u) {
        status = 2u;
        count = a.x;
    } else if (bz > 0u) {
        status = 2u;
        count = bz;
    } else if (zm.x <= key_of(neg_inf())) {
        status = 3u;
    } else if (cold(sp)) {
        status = 1u;
    } else {
        ymax = div_rn_cold(zmax, t);
        if (not_finite(ymax)) {
            status = 1u;
            ymax = neg_inf();
        }
    }
    if (lid == 0u) {
        sset(row, S_STATUS, status);
        sset(row, S_COUNT, count);
        ssetf(row, S_ZMAX, zmax);
        ssetf(row, S_YMAX, ymax);
        ssetf(row, S_XMAX, from_key(a.y));
        ssetf(row, S_TAU_K, neg_inf());
        ssetf(row, S_VMAX, bitcast<f32>(0x7f800000u));
        ssetf(row, S_TYP_D, bitcast<f32>(0x7f800000u));
        var tau_min = neg_inf();
        if ((sp.flags & F_MIN_P) != 0u && !is_neg_inf(ymax)) {
            tau_min = ymax + sp.ln_min_p;
        }
        ssetf(row, S_TAU_MIN, tau_min);
        sset(row, S_P_CUT, 0u);
        ssetf(row, S_TAU_Q, -1.0);
        ssetf(row, S_SUM, 0.0);
        sset(row, S_NS, 0u);
        sset(row, S_KLO, 0u);
        sset(row, S_KHI, 0u);
        sset(row, S_LP_DONE, 0u);
        sset(row, S_PATH, P_NONE);
        sset(row, S_TOKEN, 0u);
        sset(row, S_SD_WALK, 0u);
        sset(row, S_PHASE, PH_DONE);
        sset(row, S_HAND, 0u);
        if (status == 1u) {
            sset(row, S_TOKEN, zm.y);
            sset(row, S_PATH, P_DONE);
        } else if (status == 0u && !filt) {
            if (dr.y == NO_TOKEN) {
                sset(row, S_STATUS, 4u);
            } else {
                sset(row, S_TOKEN, dr.y);
                sset(row, S_PATH, P_DONE);
            }
        }
    }
    return Head(wg_uniform(lid, status), ymax, dr.y);
}

// settle of one row by this workgroup; with `split`, a row the candidate list can settle
// is left to `settle_rest` (its decisions and all after them) through the row's state.
fn settle_row(lid: u32, row: u32, split: bool) {
    let slot = rmap[row];
    let sp = sparams[slot];
    let t = sp.temperature;
    // stage 8a acts at this step: the row is filtered even with no other filter
    let xf = xtc_fires(slot, sp);
    // (a row asking for its kept distribution is filtered too: with no other filter
    // `settle_whole` takes it from the list, else the full-row path's kept phases)
    let filt = (sp.flags & (F_SET_FILTERS | F_KEPT)) != 0u || xf;
    let h = settle_head(lid, row, slot, sp, filt);
    let st = h.st;
    let ymax = h.ymax;
    storageBarrier();
    lout = ListOut(0u, 0u, 0u, 0u, 0u, 0u, 0.0, 0.0, 0.0);
    if (wg_flag(lid, st == 0u && filt)) {
        // the partials' sums for the filters (words 7-16)
        var sig = vec3<u32>(0u, 0u, 0u);
        var ov = 0u;
        var n_fin = 0u;
        var kz_not_min = 0u;
        var tsum = vec3<u32>(0u, 0u, 0u);
        var n_y = 0u;
        // without a probe (M_LIGHT: no row of the call asked for one) no list was built,
        // whatever an earlier call left in the row's state
        let need = select(sget(row, S_NEED), 0u, (call.mode & M_LIGHT) != 0u);
        // top-n-σ's sums (words 17-23, N_SD)
        let sd = (need & N_SD) != 0u;
        var sd1 = vec3<u32>(0u, 0u, 0u);
        var sd2 = vec3<u32>(0u, 0u, 0u);
        var sd_out = 0u;
        for (var s = lid; s < call.splits; s = s + WG) {
            let pb = part(row, s);
            sig = add96(sig, vec3<u32>(work[pb + 7u], work[pb + 8u], work[pb + 9u]));
            ov = ov + work[pb + 10u];
            n_fin = n_fin + work[pb + 11u];
            kz_not_min = max(kz_not_min, work[pb + 12u]);
            tsum = add96(tsum, vec3<u32>(work[pb + 13u], work[pb + 14u], work[pb + 15u]));
            n_y = n_y + work[pb + 16u];
            if (sd) {
                sd2 = add96(sd2, sd_q2_at(pb));
                sd1 = add96(sd1, sd_q1_at(pb));
                sd_out = sd_out | work[pb + 23u];
            }
        }
        let s96 = wg_sum96(lid, sig);
        let ovt = wg_sum_u32(lid, ov);
        // top-n-σ's threshold left to the full-row path
        var sd_later = false;
        if ((sp.flags & F_TOP_N_SIGMA) != 0u) {
            // stage 5a: a lower bound on y for every stage after it, on the list
            // (settle_list) or the whole row (`member`), from the finite count and the
            // smallest z of the row (words 11-12 are written for its rows only)
            let fm = wg_sum_max(lid, n_fin, kz_not_min);
            var tau_s = ymax;
            var walk = true;
            if (wg_flag(lid, sd)) {
                // the scan's sums, when every finite y was in their range
                let a = wg_sum96(lid, sd2);
                let b = wg_sum96(lid, sd1);
                walk = wg_sum_u32(lid, sd_out) != 0u;
                if (!walk && fm.x > 1u) {
                    tau_s = sd_threshold(sp, ymax, fm.x, a, b, bitcast<i32>(sget(row, S_SD_E)) - 36);
                }
            }
            // a y outside the scan's sums: the full-row path sums the row over its
            // pieces first (phase SD, step/walk.wgsl), with q against ymax and the row's
            // own range; a single finite y or a range under 2^-90 leaves σ = 0
            var sd_n = 0u;
            var sd_e = 0;
            if (walk) {
                let ymin = div_rn_cold(from_key(~fm.y), t);
                sd_e = i32((bitcast<u32>(fp(ymax - ymin)) >> 23u) & 0xffu) - 127;
                if (fm.x > 1u && sd_e >= -90) {
                    sd_n = fm.x;
                }
            }
            sd_later = sd_n != 0u;
            if (lid == 0u) {
                ssetf(row, S_TAU_K, tau_s);
                sset(row, S_SD_WALK, select(0u, 1u, walk));
                sset(row, S_SD_N, sd_n);
                sset(row, S_SD_EW, bitcast<u32>(sd_e));
            }
            storageBarrier();
        }
        let n_all = wg_uniform(lid, atomicLoad(&ctr[cbase(row)]));
        // typical-p's centre and mass from the scan's sums, when it made them
        var typ = Typ(false, 0.0, 0.0);
        if (wg_flag(lid, (need & N_TYP) != 0u)) {
            typ = typ_pre(row, ovt, ymax, s96, wg_sum96(lid, tsum));
        }
        let p_alone = (sp.flags & F_TOP_P) != 0u && (sp.flags & F_TOP_K) == 0u;
        let ok_list = wg_flag(
            lid,
            (need & N_LIST) != 0u && n_all <= call.cap && ovt == 0u
                && !(p_alone && (need & N_SIGMA) == 0u) && !sd_later
        );
        // no filter but XTC (its coin fired) or the kept distribution: the set is every
        // finite y (less XTC's top choices), so the scan's mass and winner and the
        // list's top settle it, or leave only the draw over the row
        let others = (sp.flags & F_SET_FILTERS) != 0u;
        var whole = W_NONE;
        if (wg_flag(lid, !others && ok_list && (need & N_SIGMA) != 0u)) {
            whole = settle_whole(lid, row, sp, n_all, ymax, s96, wg_sum_u32(lid, n_y), xf,
                                 h.drawn);
        }
        var done = whole == W_DONE;
        if (wg_flag(lid, ok_list && others)) {
            if (split) {
                // the list's decisions and what follows them: settle_rest's
                if (lid == 0u) {
                    sset(row, S_HAND, select(1u, 2u, xf));
                    sset(row, S_H_N, n_all);
                    ssetf(row, S_H_YMAX, ymax);
                    sset(row, S_H_S96, s96.x);
                    sset(row, S_H_S96 + 1u, s96.y);
                    sset(row, S_H_S96 + 2u, s96.z);
                    sset(row, S_H_TYP, select(0u, 1u, typ.pre));
                    ssetf(row, S_H_TYP + 1u, typ.c);
                    ssetf(row, S_H_TYP + 2u, typ.total);
                }
                return;
            }
            done = settle_list(lid, row, slot, sp, n_all, ymax, s96, xf, typ);
        }
        settle_tail(lid, row, sp, xf, typ, done, whole);
    }
    settle_lp(lid, row, sp);
}

// After a filtered row's list decisions (`done`: settled by them; `whole`: what
// settle_whole left): what a settled row lists, or the full-row path's setup.
fn settle_tail(lid: u32, row: u32, sp: SlotP, xf: bool, typ: Typ, done: bool, whole: u32) {
    // what a settled row lists: its top log-probabilities and kept tokens
    list_out(lid, row);
    // (W_DRAW: only the draw over the row below XTC's bound, S_VMAX, is left)
    if (!wg_flag(lid, done || whole == W_DRAW)) {
        full_setup(lid, row, sp, xf, typ);
    }
    if (lid == 0u && !done) {
        sset(row, S_PATH, P_FULL);
        // into the grids and list of what follows settle: the full-row path's
        // phases (step/walk.wgsl), and in a lean call lp's draw and finish
        let at = atomicAdd(&ctr[1], 1u);
        atomicAdd(&ctr[3], 1u);
        sset(at, S_TAIL, row);
    }
}

// settle's last word of a row: whether the lp pass computes its log-probabilities.
fn settle_lp(lid: u32, row: u32, sp: SlotP) {
    storageBarrier();
    if (lid == 0u) {
        let s2 = sget(row, S_STATUS);
        let want = (sp.flags & F_LOGPROBS) != 0u && s2 <= 1u && sget(row, S_LP_DONE) == 0u;
        sset(row, S_LP, select(0u, 1u, want || sget(row, S_PATH) == P_FULL));
    }
}

// ---------------------------------------------------------------------------------
// The light plan (`Plan::Light` in kernels.rs: no row of the call has a filter, the kept
// distribution, log-probabilities, DRY, a history to scatter or many draws): settle is
// its head alone and finish its results alone, entry points of their own, so a device
// builds and runs far less code for the commonest calls (greedy and temperature rows).
// A row the host should not have sent here is a row error (status 4), never a token.

// settle of one row of a light call.
fn settle_light_row(lid: u32, row: u32) {
    let slot = rmap[row];
    let sp = sparams[slot];
    let h = settle_head(lid, row, slot, sp, false);
    let always = (sp.flags & (F_LOGPROBS | F_DRY)) != 0u || (call.mode & M_SCATTER) != 0u;
    let warm = (sp.flags & (F_SET_FILTERS | F_KEPT | F_XTC)) != 0u && h.st == 0u;
    if (lid == 0u) {
        if ((always && h.st <= 1u) || warm) {
            sset(row, S_STATUS, 4u);
        }
        sset(row, S_LP, 0u);
    }
}

@compute @workgroup_size(256)
fn settle_light(@builtin(workgroup_id) wid: vec3<u32>, lanes: Lanes) {
    let lid = lanes.lid;
    lanes_init(lanes);
    settle_light_row(lid, wid.x);
}

// finish of one row of a light call: a greedy row's kept distribution (its token
// alone: a row whose temperature samples and asks for one is not light), the results.
fn finish_light_row(lid: u32, row: u32) {
    let slot = rmap[row];
    let sp = sparams[slot];
    let status = sget(row, S_STATUS);
    if (lid == 0u && (sp.flags & F_KEPT) != 0u && status == 1u) {
        kept_single(row, sp);
    }
    finish_out(lid, row, slot, status, sget(row, S_TOKEN));
}

@compute @workgroup_size(256)
fn draw_finish_light(@builtin(workgroup_id) wid: vec3<u32>, lanes: Lanes) {
    let lid = lanes.lid;
    lanes_init(lanes);
    finish_light_row(lid, wid.x);
}

@compute @workgroup_size(256)
fn settle_finish_light(@builtin(workgroup_id) wid: vec3<u32>, lanes: Lanes) {
    let lid = lanes.lid;
    lanes_init(lanes);
    let row = wid.x;
    settle_light_row(lid, row);
    storageBarrier();
    finish_light_row(lid, row);
}
