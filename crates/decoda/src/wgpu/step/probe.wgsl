// ---------------------------------------------------------------------------------
// probe: the candidate threshold and the top-p reference from a sample of the row.

// cmp_key of y for token i, or 0 when the token is no candidate (NaN, +inf, -inf).
fn sample_key(row: u32, slot: u32, sp: SlotP, i: u32) -> u32 {
    let x = load_x(row, i);
    if (is_bad(x)) {
        return 0u;
    }
    let z = z_of(slot, sp, i, x);
    if (is_bad(z) || is_neg_inf(z)) {
        return 0u;
    }
    return cmp_key(div_rn(z, sp.temperature));
}

// The sample: runs of 16 logits every 256 (coalesced, 1/16 of the row).
fn sample_index(u: u32) -> u32 {
    return (u / 16u) * 256u + (u % 16u);
}

@compute @workgroup_size(256)
fn probe(@builtin(workgroup_id) wid: vec3<u32>, lanes: Lanes) {
    let lid = lanes.lid;
    lanes_init(lanes);
    let row = wid.x;
    let slot = rmap[row];
    let sp = sparams[slot];
    if ((call.mode & M_SCATTER) != 0u) {
        scatter(slot, sp, lid, false);
        storageBarrier();
    }
    if (wg_flag(lid, (sp.flags & F_DRY) != 0u)) {
        dry_prepare(lid, slot, sp);
        storageBarrier();
    }
    if (lid == 0u) {
        atomicStore(&ctr[cbase(row)], 0u);
        atomicStore(&ctr[cbase(row) + 1u], 0u);
        if (row == 0u) {
            // the grids of a lean call's tail: no row on the full-row path yet
            atomicStore(&ctr[0], call.splits);
            atomicStore(&ctr[1], 0u);
            atomicStore(&ctr[2], 1u);
            atomicStore(&ctr[3], 0u);
            atomicStore(&ctr[4], 1u);
            atomicStore(&ctr[5], 1u);
        }
    }
    // every filtered row gets a list (top-n-σ's set, every y above its threshold, is
    // settled on it when it holds the set); rows with no filter but XTC (its coin
    // fired) or the kept distribution too: the scan's mass of every finite y and the
    // list's top decide them (`settle_whole`)
    let others = (sp.flags & F_SET_FILTERS) != 0u;
    let alone = !others && ((sp.flags & F_KEPT) != 0u || xtc_fires(slot, sp));
    let filt = (others || alone) && !cold(sp);
    // typical-p over every finite y (no top-k or top-n-σ before it): the scan sums its
    // centre and mass, and its band is settled on the list when the list proves it
    let typ = filt && (sp.flags & F_TYPICAL) != 0u
        && (sp.flags & (F_TOP_K | F_TOP_N_SIGMA)) == 0u;
    let sigma = filt
        && (((sp.flags & F_TOP_P) != 0u && (sp.flags & F_TOP_K) == 0u) || typ || alone);
    var kappa = 0u;
    var m0k = 0u;
    var lowk = 0u;
    if (wg_flag(lid, filt)) {
        for (var b = lid; b < BINS; b = b + WG) {
            atomicStore(&hk[b], 0u);
        }
        workgroupBarrier();
        let ns = ((call.vocab + 255u) / 256u) * 16u;
        var mk = 0u;
        var lk = 0xffffffffu;
        var cnt = 0u;
        for (var u = lid; u < ns; u = u + WG) {
            let i = sample_index(u);
            if (i >= call.vocab) {
                continue;
            }
            let k = sample_key(row, slot, sp, i);
            if (k != 0u) {
                mk = max(mk, k);
                lk = min(lk, k);
                cnt = cnt + 1u;
                atomicAdd(&hk[k >> 21u], 1u);
            }
        }
        workgroupBarrier();
        let mx = wg_sum_max(lid, cnt, mk);
        m0k = mx.y;
        // top-n-σ: the sample's least y, for the scale of the scan's sums
        if (wg_flag(lid, (sp.flags & F_TOP_N_SIGMA) != 0u)) {
            lowk = ~wg_sum_max(lid, 0u, ~lk).y;
        }
        var goal_n = LIST_TARGET;
        if ((sp.flags & F_TOP_K) != 0u) {
            goal_n = max(goal_n, 2u * min(sp.top_k, call.cap));
        }
        // top-p alone: nuclei of several hundred tokens are common (p 0.9 on a 131k
        // vocabulary), and a row whose nucleus the list misses takes the full-row path,
        // which the whole batch waits for (on an H200: top-p 0.9 at B = 32, 1.5 ms with
        // 512 candidates, 0.37 ms with 1,024)
        if (sigma) {
            goal_n = max(goal_n, min(2u * LIST_TARGET, call.cap / 2u));
        }
        // typical-p's band lies around the q-weighted mean of y, below the top: the list
        // must reach down to it (bands of 500 to 2,100 tokens at p 0.95, T 0.8 on the
        // benchmark's Zipf rows of 151,936)
        if (typ) {
            goal_n = max(goal_n, call.cap / 2u);
        }
        // the kept distribution's n most likely, and their ties
        if ((sp.flags & F_KEPT) != 0u) {
            goal_n = max(goal_n, min(2u * sp.n_kept, call.cap / 2u));
        }
        let r = (goal_n + 15u) / 16u;
        // rows the list holds whole, or too few valid samples: every token is a candidate
        let whole = wg_flag(lid, call.vocab <= call.cap || mx.x <= r);
        if (!whole) {
            // level 0: the 11-bit bin holding the r-th largest sampled key
            let b0 = pick_bin(lid, r);
            let left = workgroupUniformLoad(&wtot).y;
            for (var b = lid; b < BINS; b = b + WG) {
                atomicStore(&hk[b], 0u);
            }
            workgroupBarrier();
            for (var u = lid; u < ns; u = u + WG) {
                let i = sample_index(u);
                if (i >= call.vocab) {
                    continue;
                }
                let k = sample_key(row, slot, sp, i);
                if (k != 0u && (k >> 21u) == b0) {
                    atomicAdd(&hk[(k >> 10u) & 0x7ffu], 1u);
                }
            }
            workgroupBarrier();
            let b1 = pick_bin(lid, left);
            kappa = (b0 << 21u) | (b1 << 10u);
        }
    }
    if (lid == 0u) {
        var need = 0u;
        if (filt) {
            need = need | N_LIST;
        }
        sset(row, S_KAPPA, kappa);
        let m0 = from_key(m0k);
        var r_ref = neg_inf();
        var gthr = neg_inf();
        if (m0k != 0u && !not_finite(m0)) {
            if (sigma) {
                need = need | N_SIGMA;
                r_ref = m0 + R_HEADROOM;
            }
            if (typ) {
                need = need | N_TYP;
            }
            // top-n-σ's sums in the scan: R = m0 + D and 2^e > 4 D (D the sample's
            // range) hold every y in [m0 - 3 D, m0 + D]; a row with a y outside is
            // walked by settle (rare: the sample is a sixteenth of the row)
            if (filt && (sp.flags & F_TOP_N_SIGMA) != 0u && lowk != 0u) {
                let d = fp(m0 - from_key(lowk));
                let d4 = fp(4.0 * d);
                let ex = i32((bitcast<u32>(d4) >> 23u) & 0xffu) - 127;
                let r = fp(m0 + d);
                if (d > 0.0 && !not_finite(d4) && !not_finite(r) && ex >= -90 && ex <= 125) {
                    need = need | N_SD;
                    ssetf(row, S_SD_R, r);
                    sset(row, S_SD_E, bitcast<u32>(ex + 1));
                }
            }
            if ((sp.flags & F_MIN_P) != 0u) {
                gthr = m0 + sp.ln_min_p;
            }
        }
        sset(row, S_NEED, need);
        ssetf(row, S_R, r_ref);
        ssetf(row, S_GTHR, gthr);
        ssetf(row, S_M0, m0);
        sset(row, S_SLOT, slot);
    }
}

// The bin (of hk, counted from the top) where the cumulative count reaches `want`;
// leaves in wtot.y how many are still wanted inside that bin. Uniform result.
fn pick_bin(lid: u32, want: u32) -> u32 {
    var cnts: array<u32, 8>;
    var mine = 0u;
    for (var j = 0u; j < 8u; j = j + 1u) {
        let c = atomicLoad(&hk[BINS - 1u - (lid * 8u + j)]);
        cnts[j] = c;
        mine = mine + c;
    }
    let incl = wg_scan64(lid, vec2<u32>(mine, 0u)).x;
    let before = incl - mine;
    if (before < want && want <= incl) {
        var cum = before;
        for (var j = 0u; j < 8u; j = j + 1u) {
            if (want <= cum + cnts[j]) {
                wflag = BINS - 1u - (lid * 8u + j);
                wtot = vec2<u32>(0u, want - cum);
                break;
            }
            cum = cum + cnts[j];
        }
    }
    return workgroupUniformLoad(&wflag);
}

