// ---------------------------------------------------------------------------------
// probe: the candidate threshold and the top-p reference from a sample of the row, in
// three kinds of dispatch: `probe` (one workgroup a row: what the row needs first),
// then twice `sample` (the row's pieces, as the scan's: counts into the row's histogram)
// and `pick` (one workgroup a row, over the histogram alone). No workgroup reads a
// row's whole sample (issue 56: it was one workgroup's, 84-100 µs of a B = 1 call on an
// H200).

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

// The probe's words of a row's (zero between uses) histogram area: the sample's keys by
// digit in the count bins, its count, largest key and complemented least key in the
// first mass bins (`S_PB_LEVEL`: which pass of the sample the row is at).
const PB_CNT: u32 = 2048u;  // BINS: mass bin 0
const PB_MAX: u32 = 2049u;
const PB_MIN: u32 = 2050u;
const PB_DONE: u32 = 2u;

// Whether a row's probe samples it, and what its list and sums serve.
struct Wants {
    // every filtered row gets a list (top-n-σ's set, every y above its threshold, is
    // settled on it when it holds the set); rows with no filter but XTC (its coin fired)
    // or the kept distribution too: the scan's mass of every finite y and the list's
    // top decide them (`settle_whole`)
    filt: bool,
    // typical-p over every finite y (no top-k or top-n-σ before it): the scan sums its
    // centre and mass, and its band is settled on the list when the list proves it
    typ: bool,
    // the scan sums the row's mass (top-p alone, typical-p over every y, or no filter)
    sigma: bool,
    // the list's size aimed at, in sampled tokens (a sixteenth of the row's)
    r: u32,
}

fn wants(slot: u32, sp: SlotP) -> Wants {
    var w: Wants;
    let others = (sp.flags & F_SET_FILTERS) != 0u;
    let alone = !others && ((sp.flags & F_KEPT) != 0u || xtc_fires(slot, sp));
    w.filt = (others || alone) && !cold(sp);
    w.typ = w.filt && (sp.flags & F_TYPICAL) != 0u
        && (sp.flags & (F_TOP_K | F_TOP_N_SIGMA)) == 0u;
    w.sigma = w.filt
        && (((sp.flags & F_TOP_P) != 0u && (sp.flags & F_TOP_K) == 0u) || w.typ || alone);
    var goal_n = LIST_TARGET;
    if ((sp.flags & F_TOP_K) != 0u) {
        goal_n = max(goal_n, 2u * min(sp.top_k, call.cap));
    }
    // top-p alone: nuclei of several hundred tokens are common (p 0.9 on a 131k
    // vocabulary), and a row whose nucleus the list misses takes the full-row path
    // (on an H200: top-p 0.9 at B = 32, 1.5 ms with 512 candidates, 0.37 ms with 1,024)
    if (w.sigma) {
        goal_n = max(goal_n, min(2u * LIST_TARGET, call.cap / 2u));
    }
    // typical-p's band lies around the q-weighted mean of y, below the top: the list
    // must reach down to it (bands of 500 to 2,100 tokens at p 0.95, T 0.8 on the
    // benchmark's Zipf rows of 151,936)
    if (w.typ) {
        goal_n = max(goal_n, call.cap / 2u);
    }
    // the kept distribution's n most likely, and their ties
    if ((sp.flags & F_KEPT) != 0u) {
        goal_n = max(goal_n, min(2u * sp.n_kept, call.cap / 2u));
    }
    w.r = (goal_n + 15u) / 16u;
    return w;
}

// probe, first of its three dispatches, one workgroup per row: the history scattered,
// DRY's area, the row's counters and the tail's grids reset, and a row that samples
// nothing given its final state (the others' comes from `pick`).
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
    if ((sp.flags & F_DRY) != 0u) {
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
        let w = wants(slot, sp);
        sset(row, S_PB_LEVEL, select(PB_DONE, 0u, w.filt));
        if (!w.filt) {
            probe_out(row, slot, sp, w, 0u, 0u, 0u);
        }
    }
}

// sample, second and fourth: piece `wid.x` of the row's sample (runs of 16 logits every
// 256 in the piece's `call.sample_chunk` logits) counted into the row's histogram by
// digit: the top 11 bits of the keys (level 0), or the next 11 of the keys in bin
// S_PB_B0 (level 1). Integer counts, a maximum and a minimum: the same whatever the
// pieces.
@compute @workgroup_size(256)
fn sample(@builtin(workgroup_id) wid: vec3<u32>, lanes: Lanes) {
    let lid = lanes.lid;
    lanes_init(lanes);
    let row = wid.y;
    let level = wg_uniform(lid, sget(row, S_PB_LEVEL));
    if (level == PB_DONE) {
        return;
    }
    let slot = rmap[row];
    let sp = sparams[slot];
    let hb = hbase(row);
    let b0 = sget(row, S_PB_B0);
    hk_zero(lid);
    let start = wid.x * call.sample_chunk;
    let end = min(call.vocab, start + call.sample_chunk);
    // the runs of 16 that start in the piece (sample_chunk is a multiple of 256)
    let ns = ((end - min(start, end) + 255u) / 256u) * 16u;
    var mk = 0u;
    var lk = 0xffffffffu;
    var cnt = 0u;
    for (var u = lid; u < ns; u = u + WG) {
        let i = start + sample_index(u);
        if (i >= end) {
            continue;
        }
        let k = sample_key(row, slot, sp, i);
        if (k == 0u) {
            continue;
        }
        if (level == 0u) {
            mk = max(mk, k);
            lk = min(lk, k);
            cnt = cnt + 1u;
            atomicAdd(&hk[k >> 21u], 1u);
        } else if ((k >> 21u) == b0) {
            atomicAdd(&hk[(k >> 10u) & 0x7ffu], 1u);
        }
    }
    hk_flush(lid, hb);
    if (level == 0u) {
        let mx = wg_sum_max(lid, cnt, mk);
        let mn = wg_sum_max(lid, 0u, ~lk).y;
        if (lid == 0u && mx.x != 0u) {
            atomicAdd(&ctr[hb + PB_CNT], mx.x);
            atomicMax(&ctr[hb + PB_MAX], mx.y);
            atomicMax(&ctr[hb + PB_MIN], mn);
        }
    }
}

// pick, third and fifth, one workgroup per row: the bin of the row's sample histogram
// holding the r-th largest key (level 0; then the bin inside it, level 1: the candidate
// threshold), or every token a candidate (a row the list holds whole, or too few valid
// samples); then the row's final state.
@compute @workgroup_size(256)
fn pick(@builtin(workgroup_id) wid: vec3<u32>, lanes: Lanes) {
    let lid = lanes.lid;
    lanes_init(lanes);
    let row = wid.x;
    let level = wg_uniform(lid, sget(row, S_PB_LEVEL));
    if (level == PB_DONE) {
        return;
    }
    let slot = rmap[row];
    let sp = sparams[slot];
    let hb = hbase(row);
    let w = wants(slot, sp);
    // the sample's histogram into workgroup memory (the bins cleared for their next use)
    for (var b = lid; b < BINS; b = b + WG) {
        let c = atomicLoad(&ctr[hb + b]);
        atomicStore(&hk[b], c);
        if (c != 0u) {
            atomicStore(&ctr[hb + b], 0u);
        }
    }
    workgroupBarrier();
    var cnt = 0u;
    if (level == 0u) {
        cnt = wg_uniform(lid, atomicLoad(&ctr[hb + PB_CNT]));
        if (lid == 0u) {
            sset(row, S_PB_MAX, atomicLoad(&ctr[hb + PB_MAX]));
            sset(row, S_PB_MIN, ~atomicLoad(&ctr[hb + PB_MIN]));
        }
    }
    storageBarrier();
    if (level == 0u && lid == 0u) {
        atomicStore(&ctr[hb + PB_CNT], 0u);
        atomicStore(&ctr[hb + PB_MAX], 0u);
        atomicStore(&ctr[hb + PB_MIN], 0u);
    }
    if (level == 0u) {
        // rows the list holds whole, or too few valid samples: every token a candidate
        if (wg_flag(lid, call.vocab <= call.cap || cnt <= w.r)) {
            if (lid == 0u) {
                probe_out(row, slot, sp, w, 0u, sget(row, S_PB_MAX), sget(row, S_PB_MIN));
                sset(row, S_PB_LEVEL, PB_DONE);
            }
            return;
        }
        // the 11-bit bin holding the r-th largest sampled key
        let b0 = pick_bin(lid, w.r);
        let left = workgroupUniformLoad(&wtot).y;
        if (lid == 0u) {
            sset(row, S_PB_B0, b0);
            sset(row, S_PB_LEFT, left);
            sset(row, S_PB_LEVEL, 1u);
        }
        return;
    }
    let b0 = sget(row, S_PB_B0);
    let b1 = pick_bin(lid, sget(row, S_PB_LEFT));
    if (lid == 0u) {
        let kappa = (b0 << 21u) | (b1 << 10u);
        probe_out(row, slot, sp, w, kappa, sget(row, S_PB_MAX), sget(row, S_PB_MIN));
        sset(row, S_PB_LEVEL, PB_DONE);
    }
}

// A row's state after its probe: the candidate threshold `kappa`, and from the sample's
// largest and least keys (0: none) what the scan sums.
fn probe_out(row: u32, slot: u32, sp: SlotP, w: Wants, kappa: u32, m0k: u32, lowk: u32) {
    var need = 0u;
    if (w.filt) {
        need = need | N_LIST;
    }
    sset(row, S_KAPPA, kappa);
    let m0 = from_key(m0k);
    var r_ref = neg_inf();
    var gthr = neg_inf();
    if (m0k != 0u && !not_finite(m0)) {
        if (w.sigma) {
            need = need | N_SIGMA;
            r_ref = m0 + R_HEADROOM;
        }
        if (w.typ) {
            need = need | N_TYP;
        }
        // top-n-σ's sums in the scan: R = m0 + D and 2^e > 4 D (D the sample's range)
        // hold every y in [m0 - 3 D, m0 + D]; a row with a y outside (rare: the sample
        // is a sixteenth of the row) takes the full-row path, whose first phase sums it
        if (w.filt && (sp.flags & F_TOP_N_SIGMA) != 0u && lowk != 0u) {
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

