// ---------------------------------------------------------------------------------
// The full-row path over many workgroups (issue 56): the radix selects of a row its
// candidates cannot settle, in phases. Each phase is a wide `walk` over the row's pieces
// (as the scan cuts it: a workgroup per piece), which adds the piece's tokens into the
// row's histogram (integers: the same sums in any order and any split), then a `decide`
// by one workgroup per row over the histogram alone (O(bins)), which picks the bin and
// moves the row to its next phase. The phases, in the contract's order, each only for
// rows that use the stage: top-n-σ's sums when the scan could not make them (SD: a value
// of the row lay outside the probe's range), top-k's three levels of counts (K0-K2), typical-p's sums of
// K's weights when the scan did not make them (TS) and its band's three levels of masses
// by score (T0-T2; they stop early when the sum never exceeds p), top-p's three levels of masses
// (P0-P2; they stop early when the row's sum never reaches p), XTC's two reads (X0:
// the kept set's mass, X1: its top choices) and the kept distribution's (C0-C2, CT, CG:
// step/kept.wgsl). The host records as many phases as the
// call's rows could use (`Kernels::stages`); both dispatches take the grids settle
// counted (the rows on the full-row path, listed in S_TAIL), so a call with no such row
// runs them with no workgroup, and a row past its last phase leaves at once.

// The radix selects' digits: three levels of 11, 11 and 10 bits of an order key.
fn digit_shift(level: u32) -> u32 {
    if (level == 0u) {
        return 21u;
    }
    if (level == 1u) {
        return 10u;
    }
    return 0u;
}

fn digit_mask(level: u32) -> u32 {
    if (level == 2u) {
        return 0x3ffu;
    }
    return 0x7ffu;
}

fn digit_width(level: u32) -> u32 {
    if (level == 2u) {
        return 10u;
    }
    return 11u;
}

// A workgroup's counts by digit, in workgroup memory first (`hk`): zeroed, then (after
// the workgroup's adds) the bins that got any added into the row's histogram at `hb`.
// Call both from uniform control flow.
fn hk_zero(lid: u32) {
    for (var b = lid; b < BINS; b = b + WG) {
        atomicStore(&hk[b], 0u);
    }
    workgroupBarrier();
}

fn hk_flush(lid: u32, hb: u32) {
    workgroupBarrier();
    for (var b = lid; b < BINS; b = b + WG) {
        let c = atomicLoad(&hk[b]);
        if (c != 0u) {
            atomicAdd(&ctr[hb + b], c);
        }
    }
}

// Whether a key lies in the bin chosen by the previous levels.
fn in_prefix(key: u32, level: u32, prefix: u32) -> bool {
    if (level == 0u) {
        return true;
    }
    if (level == 1u) {
        return (key >> 21u) == prefix;
    }
    return (key >> 10u) == prefix;
}

// Reads (and clears) a level's counts in the row's radix histogram and finds the bin
// holding the rem-th largest key (rem at most their total): (bin, rem's rank inside the
// bin, the bin's count), uniform. Top-k's walk and the kept distribution's use it.
fn count_bin(lid: u32, row: u32, rem: u32) -> vec3<u32> {
    let hb = hbase(row);
    var cnts: array<u32, 8>;
    var mine = 0u;
    for (var j = 0u; j < 8u; j = j + 1u) {
        let b = BINS - 1u - (lid * 8u + j);
        let c = atomicLoad(&ctr[hb + b]);
        cnts[j] = c;
        mine = mine + c;
        if (c != 0u) {
            atomicStore(&ctr[hb + b], 0u);
        }
    }
    let incl = wg_scan64(lid, vec2<u32>(mine, 0u)).x;
    let before = incl - mine;
    if (lid == 0u) {
        wsum = vec3<u32>(0u, 0u, 0u);
    }
    workgroupBarrier();
    if (before < rem && rem <= incl) {
        var cum = before;
        for (var j = 0u; j < 8u; j = j + 1u) {
            if (rem <= cum + cnts[j]) {
                wsum = vec3<u32>(BINS - 1u - (lid * 8u + j), rem - cum, cnts[j]);
                break;
            }
            cum = cum + cnts[j];
        }
    }
    return workgroupUniformLoad(&wsum);
}

// Adds a token's mass `fx` (64-bit fixed point) to digit `d`'s bin of the row's mass
// histogram (low words at hb + BINS, high words at hb + 2 BINS, carried by hand).
fn add_mass(hb: u32, d: u32, fx: vec2<u32>) {
    let old = atomicAdd(&ctr[hb + BINS + d], fx.x);
    var add_hi = fx.y;
    if (old + fx.x < old) {
        add_hi = add_hi + 1u;
    }
    if (add_hi != 0u) {
        atomicAdd(&ctr[hb + 2u * BINS + d], add_hi);
    }
}

// An invocation's eight bins of the mass histogram, largest digit first, and their sum.
struct Masses {
    m: array<vec2<u32>, 8>,
    mine: vec2<u32>,
}

// Reads (and clears, for their next use) this invocation's eight bins of the row's mass
// histogram: bins BINS - 1 - (8 lid + j).
fn take_masses(lid: u32, hb: u32) -> Masses {
    var r: Masses;
    r.mine = vec2<u32>(0u, 0u);
    for (var j = 0u; j < 8u; j = j + 1u) {
        let b = BINS - 1u - (lid * 8u + j);
        let lo = atomicLoad(&ctr[hb + BINS + b]);
        let hi = atomicLoad(&ctr[hb + 2u * BINS + b]);
        r.m[j] = vec2<u32>(lo, hi);
        r.mine = add64(r.mine, r.m[j]);
        if ((lo | hi) != 0u) {
            atomicStore(&ctr[hb + BINS + b], 0u);
            atomicStore(&ctr[hb + 2u * BINS + b], 0u);
        }
    }
    return r;
}

const PH_SD: u32 = 0u;   // top-n-σ's sums (rows whose values lay outside the scan's)
const PH_K0: u32 = 1u;
const PH_TS: u32 = 4u;   // typical-p's sums (rows whose scan did not make them)
const PH_T0: u32 = 5u;   // typical-p's walk, three levels
const PH_P0: u32 = 8u;
const PH_X0: u32 = 11u;
const PH_X1: u32 = 12u;
const PH_C0: u32 = 13u;  // the kept distribution (step/kept.wgsl): three levels of counts,
const PH_C1: u32 = 14u;
const PH_C2: u32 = 15u;
const PH_CT: u32 = 16u;  //   the n-th key's ties by piece when only some are listed,
const PH_CG: u32 = 17u;  //   and the gather
const PH_DONE: u32 = 18u;

// The first phase at or after `first` that the row's stages use.
fn next_phase(row: u32, sp: SlotP, first: u32) -> u32 {
    var ph = first;
    if (ph == PH_SD && ((sp.flags & F_TOP_N_SIGMA) == 0u || sget(row, S_SD_N) == 0u)) {
        ph = PH_K0;
    }
    if (ph >= PH_K0 && ph < PH_TS && (sp.flags & F_TOP_K) == 0u) {
        ph = PH_TS;
    }
    if (ph == PH_TS && sget(row, S_TYP_PRE) != 0u) {
        ph = PH_T0;
    }
    if (ph >= PH_TS && ph < PH_P0
        && ((sp.flags & F_TYPICAL) == 0u || sget(row, S_T_LEVEL) == 0u)) {
        ph = PH_P0;
    }
    if (ph >= PH_P0 && ph < PH_X0 && ((sp.flags & F_TOP_P) == 0u || sget(row, S_P_LEVEL) == 0u)) {
        ph = PH_X0;
    }
    if (ph >= PH_X0 && ph < PH_C0 && sget(row, S_XF) == 0u) {
        ph = PH_C0;
    }
    if (ph >= PH_C0 && ph < PH_DONE && (sp.flags & F_KEPT) == 0u) {
        ph = PH_DONE;
    }
    return ph;
}

// What settle leaves a row on the full-row path (after top-n-σ's threshold, in S_TAU_K
// already): the selects' starting state and its first phase. `xf`: XTC acts at this
// step; `typ`: typical-p's centre and mass from the scan, when it made them.
fn full_setup(lid: u32, row: u32, sp: SlotP, xf: bool, typ: Typ) {
    if (lid == 0u) {
        sset(row, S_K_PREFIX, 0u);
        sset(row, S_K_REM, sp.top_k);
        sset(row, S_P_PREFIX, 0u);
        sset(row, S_P_LEVEL, 1u);
        sset(row, S_ABOVE_LO, 0u);
        sset(row, S_ABOVE_HI, 0u);
        sset(row, S_XF, select(0u, 1u, xf));
        typ_setup(row, sgetf(row, S_YMAX), typ);
        sset(row, S_PHASE, next_phase(row, sp, PH_SD));
    }
}

// One piece of one listed row's walk in its current phase.
@compute @workgroup_size(256)
fn walk(@builtin(workgroup_id) wid: vec3<u32>, lanes: Lanes) {
    let lid = lanes.lid;
    lanes_init(lanes);
    let row = tail_row(wid.y, true);
    let ph = wg_uniform(lid, sget(row, S_PHASE));
    if (ph == PH_DONE) {
        return;
    }
    let slot = rmap[row];
    let sp = sparams[slot];
    let t = sp.temperature;
    let hb = hbase(row);
    let start = wid.x * call.chunk;
    let end = min(call.vocab, start + call.chunk);
    if (ph == PH_SD) {
        // top-n-σ's sums over the piece (step/sigma.wgsl)
        sd_walk(lid, row, slot, sp, wid.x, start, end);
        return;
    }
    if (ph >= PH_C0) {
        // the kept distribution (step/kept.wgsl)
        kept_walk(lid, row, slot, sp, wid.x, start, end, ph);
        return;
    }
    if (ph >= PH_TS && ph < PH_P0) {
        // typical-p: its sums (TS), or a level of its walk
        typ_walk(lid, row, slot, sp, start, end, select(ph - PH_T0, 3u, ph == PH_TS));
        return;
    }
    // top-k's levels (K0-K2: counts of z's keys under the prefix, in workgroup memory
    // first), top-p's (P0-P2: masses against ymax by digit of the key, over K and
    // typical-p's band), XTC's kept mass (X0: into count bins 0 and 1, 2^-40 units) and
    // its top choices (X1: w at least the bar, their count and the smallest y's key, into
    // count bins 0 and 1): one loop over the piece with one z_of and one member, each of
    // them code a compiler inlines at every call
    let topk = ph < PH_TS;
    let topp = !topk && ph < PH_X0;
    var level = 0u;
    var prefix = 0u;
    if (topk) {
        level = ph - PH_K0;
        prefix = sget(row, S_K_PREFIX);
        hk_zero(lid);
    } else if (topp) {
        level = ph - PH_P0;
        prefix = sget(row, S_P_PREFIX);
    }
    let sh = digit_shift(level);
    let mask = digit_mask(level);
    let ym = sgetf(row, S_YMAX);
    let tau_k = sgetf(row, S_TAU_K);
    let bar = sgetf(row, S_XBAR);
    var acc = vec2<u32>(0u, 0u);
    var c = 0u;
    var low = 0u;
    for (var i = start + lid; i < end; i = i + WG) {
        let z = z_of(slot, sp, i, load_x(row, i));
        if (topk) {
            let key = key_of(z);
            if (in_prefix(key, level, prefix)) {
                atomicAdd(&hk[(key >> sh) & mask], 1u);
            }
            continue;
        }
        if (topp) {
            if (is_neg_inf(z)) {
                continue;
            }
            let key = key_of(z);
            if (!in_prefix(key, level, prefix)) {
                continue;
            }
            let y = div_rn_cold(z, t);
            if (cmp_key(y) < cmp_key(tau_k) || !typ_in(row, y)) {
                continue;
            }
            let fx = fixed40(exp_f32(y - ym));
            if ((fx.x | fx.y) == 0u) {
                continue;
            }
            add_mass(hb, (key >> sh) & mask, fx);
            continue;
        }
        let mb = member(row, z, t);
        if (!mb.inside) {
            continue;
        }
        let w = exp_f32(mb.y - ym);
        if (ph == PH_X0) {
            acc = add64(acc, fixed40(w));
        } else if (w >= bar) {
            c = c + 1u;
            low = max(low, ~cmp_key(mb.y));
        }
    }
    if (topk) {
        hk_flush(lid, hb);
        return;
    }
    if (topp) {
        return;
    }
    if (ph == PH_X0) {
        let s = wg_sum64(lid, acc);
        if (lid == 0u && (s.x | s.y) != 0u) {
            add_mass(hb, 0u, s);
        }
        return;
    }
    let top = wg_sum_max(lid, c, low);
    if (lid == 0u && top.x != 0u) {
        atomicAdd(&ctr[hb], top.x);
        atomicMax(&ctr[hb + 1u], top.y);
    }
}

// One listed row's decision after its walk: the bin, and the row's next phase.
@compute @workgroup_size(256)
fn decide(@builtin(workgroup_id) wid: vec3<u32>, lanes: Lanes) {
    let lid = lanes.lid;
    lanes_init(lanes);
    let row = tail_row(wid.x, true);
    let ph = wg_uniform(lid, sget(row, S_PHASE));
    if (ph == PH_DONE) {
        return;
    }
    let slot = rmap[row];
    let sp = sparams[slot];
    let t = sp.temperature;
    let hb = hbase(row);
    if (ph >= PH_C0) {
        // (sets the row's next phase itself)
        kept_decide(lid, row, sp, ph);
        return;
    }
    if (ph == PH_SD) {
        // stage 5a's threshold from the pieces' sums
        sd_decide(lid, row, sp);
    } else if (ph < PH_TS) {
        let level = ph - PH_K0;
        let prefix = sget(row, S_K_PREFIX);
        let bin = count_bin(lid, row, sget(row, S_K_REM));
        if (lid == 0u) {
            let np = (prefix << digit_width(level)) | bin.x;
            sset(row, S_K_PREFIX, np);
            sset(row, S_K_REM, bin.y);
            if (level == 2u) {
                // the k-th largest y of the row, or top-n-σ's bound when higher (both
                // keep every y above a value: the set is their intersection)
                let tau_k = div_rn_cold(from_key(np), t);
                let tau_s = sgetf(row, S_TAU_K);
                ssetf(row, S_TAU_K, select(tau_k, tau_s, cmp_key(tau_s) > cmp_key(tau_k)));
            }
        }
    } else if (ph < PH_P0) {
        // stage 6a: typical-p's sums or a level of its band (at the last, the largest
        // y left: the ymax from here on)
        typ_decide(lid, row, sp, select(ph - PH_T0, 3u, ph == PH_TS));
    } else if (ph < PH_X0) {
        p_decide(lid, row, sp, ph - PH_P0);
    } else if (ph == PH_X0) {
        let m = take_masses(lid, hb);
        // (the mass sits in bin 0: the invocation holding bins BINS - 8 .. BINS - 1)
        let acc = wg_sum64(lid, m.mine);
        if (lid == 0u) {
            ssetf(row, S_XBAR, sp.xtc_thr * (val64(acc) * TWO_M40));
        }
    } else {
        if (lid == 0u) {
            let c = atomicLoad(&ctr[hb]);
            let low = atomicLoad(&ctr[hb + 1u]);
            atomicStore(&ctr[hb], 0u);
            atomicStore(&ctr[hb + 1u], 0u);
            if (c >= 2u) {
                ssetf(row, S_VMAX, from_key(~low));
            }
        }
    }
    storageBarrier();
    if (lid == 0u) {
        sset(row, S_PHASE, next_phase(row, sp, ph + 1u));
    }
}

// Top-p's decision at `level` from the row's mass histogram: the bin where the sum from
// the top first reaches p Σ (Σ the whole set's, kept in S_SUM from level 0), and at the
// last level the cut's q; a row whose sum never reaches p (rounding) keeps all of K.
fn p_decide(lid: u32, row: u32, sp: SlotP, level: u32) {
    let hb = hbase(row);
    let prefix = sget(row, S_P_PREFIX);
    let mb = take_masses(lid, hb);
    let incl = wg_scan64(lid, mb.mine);
    let total = wtot;
    var sum_f = sgetf(row, S_SUM);
    if (level == 0u) {
        sum_f = val64(total);
    }
    let goal = sp.top_p * sum_f;
    let above = vec2<u32>(sget(row, S_ABOVE_LO), sget(row, S_ABOVE_HI));
    let cut = mass_cut(lid, mb, incl, above, goal, false);
    if (lid == 0u) {
        ssetf(row, S_SUM, sum_f);
    }
    if (cut.here) {
        let np = (prefix << digit_width(level)) | cut.bin;
        sset(row, S_P_PREFIX, np);
        sset(row, S_ABOVE_LO, cut.cum.x);
        sset(row, S_ABOVE_HI, cut.cum.y);
        if (level == 2u) {
            let theta = from_key(np);
            let e = exp_f32(div_rn_cold(theta, sp.temperature) - sgetf(row, S_YMAX));
            ssetf(row, S_TAU_Q, div_rn_cold(e, sum_f * TWO_M40));
            sset(row, S_P_CUT, 1u);
        }
    }
    if (lid == WG - 1u && !cut.reached) {
        // the sum never reaches p (rounding): every token of K stays
        sset(row, S_P_LEVEL, 0u);
    }
}

// Where a radix level's masses (an invocation's eight bins `mb`, their inclusive scan
// `incl` from the top, `above` the mass of the bins before the level's) first reach
// `goal` (`strict`: exceed it): `here` for the invocation holding that bin, with the
// bin and the mass above it; `reached`: whether the level's whole mass does.
struct MassCut {
    here: bool,
    bin: u32,
    cum: vec2<u32>,
    reached: bool,
}

fn reaches(v: vec2<u32>, goal: f32, strict: bool) -> bool {
    return select(val64(v) >= goal, val64(v) > goal, strict);
}

fn mass_cut(lid: u32, mb: Masses, incl: vec2<u32>, above: vec2<u32>, goal: f32,
            strict: bool) -> MassCut {
    var r: MassCut;
    r.cum = add64(above, sub64(incl, mb.mine));
    r.reached = reaches(add64(above, incl), goal, strict);
    r.here = r.reached && !reaches(r.cum, goal, strict);
    r.bin = 0u;
    if (r.here) {
        for (var j = 0u; j < 8u; j = j + 1u) {
            let nxt = add64(r.cum, mb.m[j]);
            if (reaches(nxt, goal, strict)) {
                r.bin = BINS - 1u - (lid * 8u + j);
                break;
            }
            r.cum = nxt;
        }
    }
    return r;
}
