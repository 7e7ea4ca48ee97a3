// ---------------------------------------------------------------------------------
// The kept distribution (`kept = n`, F_KEPT): the kept set's size and its n most likely
// tokens (larger y first, then the smaller id) with softmax(y) over the set, written to
// the row's kept area of out_res (size, listed, then (id, p bits) pairs). A list-path
// row writes it in settle (`list_out`: the set is the candidates in a range of keys,
// its top found by selections and sorted alone in workgroup memory: `list_top`);
// a greedy row's set is its token at 1; a full-row-path row's is found by that path's
// last phases, over the row's pieces (issue 56: it was one workgroup's walk of the row,
// in finish): one read for the set's size and mass (fixed point, 2^-40 units) and a
// first radix level of counts; when the set holds more than n, two more levels find the
// n-th largest y (and when only some of its ties are listed, one read counts each
// piece's); one read gathers the tokens above it and the ties listed (those with the
// smallest ids) into the row's kept area, and the row's workgroup sorts those at most
// 1,024 entries in workgroup memory (`sort_top`) and writes their probabilities.

const KEPTN: u32 = 1024u;   // most tokens a kept distribution lists
const KEPTW: u32 = 2050u;   // kept words per row: size, listed, then KEPTN (id, p) pairs

fn kept_area(row: u32) -> u32 {
    return call.kept_base + row * KEPTW;
}

// Token i's y when it is in the kept set, else -inf.
fn kept_y(row: u32, slot: u32, sp: SlotP, i: u32) -> f32 {
    let mb = member(row, z_of(slot, sp, i, load_x(row, i)), sp.temperature);
    if (!mb.inside) {
        return neg_inf();
    }
    return mb.y;
}

// The kept distribution of a row settled greedily (status 1): its token alone.
fn kept_single(row: u32, sp: SlotP) {
    let kb = kept_area(row);
    out_res[kb] = 1u;
    out_res[kb + 1u] = min(sp.n_kept, 1u);
    out_res[kb + 2u] = sget(row, S_TOKEN);
    out_res[kb + 3u] = bitcast<u32>(1.0);
}

// A greedy row's kept distribution (status 1), at finish: every other row's is written
// by settle (the list path) or by the full-row path's phases (`kept_walk`, `kept_decide`).
fn kept_greedy(lid: u32, row: u32) {
    let sp = sparams[rmap[row]];
    if (lid == 0u && (sp.flags & F_KEPT) != 0u && sget(row, S_STATUS) == 1u) {
        kept_single(row, sp);
    }
}

// A piece of a kept phase of the full-row path (after XTC's: the set is final).
// C0-C2: the set's keys (cmp_key of y) counted by digit under the prefix, in workgroup
// memory first, and at C0 the set's size and mass against its top (2^-40 units) into
// the mass histogram's bins 1 (low word) and 0; CT: the piece's ties at the n-th key,
// into its partial word 24; CG: the tokens above that key (and its ties when every one
// is listed) into the row's kept area at a counter (count bin 0), and, when only some
// ties are listed, the piece's ties in id order after the pieces' before it, each
// invocation over its own stretch after a scan of their counts.
// Every pass over tokens is one loop with one `kept_y` (the token's filters and its y,
// the largest code of the phases): sweep 0 over the piece's tokens WG apart, then for
// CG's ties sweep 1 counting them over the invocation's stretch and sweep 2 writing them.
// A compiler inlines each call, so one site is a third of the code five sites were.
fn kept_walk(lid: u32, row: u32, slot: u32, sp: SlotP, piece: u32, start: u32, end: u32,
             ph: u32) {
    let hb = hbase(row);
    let kb = kept_area(row);
    let counting = ph <= PH_C2;
    // C0-C2's digit (a level of 0 past them: unused)
    let level = select(0u, ph - PH_C0, counting);
    let sh = digit_shift(level);
    let mask = digit_mask(level);
    // C0-C2: the previous levels' digits; CT and CG: the n-th key
    let kk = sget(row, S_KP_PREFIX);
    let vmax = set_top(row);
    var left = 0u;
    var all_ties = true;
    if (counting) {
        hk_zero(lid);
    } else {
        left = wg_uniform(lid, sget(row, S_KP_REM));
        all_ties = wg_flag(lid, left == sget(row, S_KP_TIES));
    }
    let m = sget(row, S_KP_M);
    let per = (end - start + WG - 1u) / WG;
    let i0 = min(end, start + lid * per);
    let i1 = min(end, i0 + per);
    var cnt = 0u;
    var acc = vec2<u32>(0u, 0u);
    var c = 0u;
    var at = 0u;
    var b0 = 0u;
    var first = start + lid;
    var step = WG;
    var last = end;
    var sweep = 0u;
    loop {
        for (var i = first; i < last && (sweep != 2u || at < left); i = i + step) {
            let y = kept_y(row, slot, sp, i);
            if (is_neg_inf(y)) {
                continue;
            }
            let key = cmp_key(y);
            if (sweep != 0u || ph == PH_CT) {
                // a tie at the n-th key: counted (CT, sweep 1) or written (sweep 2)
                if (key == kk) {
                    if (sweep == 2u) {
                        let j = m - left + at;
                        out_res[kb + 2u + 2u * j] = i;
                        out_res[kb + 3u + 2u * j] = bitcast<u32>(y);
                        at = at + 1u;
                    } else {
                        c = c + 1u;
                    }
                }
            } else if (counting) {
                if (in_prefix(key, level, kk)) {
                    if (level == 0u) {
                        cnt = cnt + 1u;
                        acc = add64(acc, fixed40(exp_f32(y - vmax)));
                    }
                    atomicAdd(&hk[(key >> sh) & mask], 1u);
                }
            } else if (key > kk || (key == kk && all_ties)) {
                let at_g = atomicAdd(&ctr[hb], 1u);
                out_res[kb + 2u + 2u * at_g] = i;
                out_res[kb + 3u + 2u * at_g] = bitcast<u32>(y);
            }
        }
        if (sweep == 1u) {
            // the ties with the smallest ids go first: this invocation's after the
            // pieces' before it and the invocations' before it
            at = b0 + wg_scan64(lid, vec2<u32>(c, 0u)).x - c;
            sweep = 2u;
            first = i0;
            continue;
        }
        if (sweep == 2u) {
            return;
        }
        if (counting) {
            hk_flush(lid, hb);
            if (level == 0u) {
                let s = wg_sum64(lid, acc);
                let n = wg_sum_u32(lid, cnt);
                if (lid == 0u && n != 0u) {
                    atomicAdd(&ctr[hb + BINS + 1u], n);
                    add_mass(hb, 0u, s);
                }
            }
            return;
        }
        if (ph == PH_CT) {
            let n = wg_sum_u32(lid, c);
            if (lid == 0u) {
                work[part(row, piece) + 24u] = n;
            }
            return;
        }
        if (all_ties) {
            return;
        }
        // the `left` ties with the smallest ids go after the m - left tokens above kk
        var before = 0u;
        for (var s = lid; s < piece; s = s + WG) {
            before = before + work[part(row, s) + 24u];
        }
        b0 = wg_sum_u32(lid, before);
        if (!wg_flag(lid, b0 < left)) {
            return;
        }
        sweep = 1u;
        first = i0;
        step = 1u;
        last = i1;
        c = 0u;
    }
}

// A kept phase's decision, and the row's next phase (set here: the kept phases skip by
// what they find). C0: the set's size and mass, how many it lists (m, at most n), and
// when it lists fewer than it holds the bin of the m-th largest key; C1, C2: the next
// levels' bins (then CT when only some of the key's ties are listed, else CG); CG: the
// gathered m tokens sorted in workgroup memory (larger y first, then the smaller id)
// and written with their probabilities.
fn kept_decide(lid: u32, row: u32, sp: SlotP, ph: u32) {
    let hb = hbase(row);
    let kb = kept_area(row);
    var next = PH_DONE;
    if (ph == PH_C0) {
        let c3 = wg_uniform3(lid, vec3<u32>(atomicLoad(&ctr[hb + BINS + 1u]),
                                            atomicLoad(&ctr[hb + BINS]),
                                            atomicLoad(&ctr[hb + 2u * BINS])));
        let size = c3.x;
        let lo = c3.y;
        let hi = c3.z;
        let m = min(sp.n_kept, size);
        if (lid == 0u) {
            atomicStore(&ctr[hb + BINS + 1u], 0u);
            atomicStore(&ctr[hb + BINS], 0u);
            atomicStore(&ctr[hb + 2u * BINS], 0u);
            sset(row, S_KP_SIZE, size);
            sset(row, S_KP_MLO, lo);
            sset(row, S_KP_MHI, hi);
            sset(row, S_KP_M, m);
            sset(row, S_KP_PREFIX, 0u);
            sset(row, S_KP_REM, 0u);
            sset(row, S_KP_TIES, 0u);
        }
        if (m == 0u || m == size) {
            // every member listed (key 0 and up, all its ties), or none: the level-0
            // counts are cleared unread
            for (var b = lid; b < BINS; b = b + WG) {
                atomicStore(&ctr[hb + b], 0u);
            }
            if (m == 0u) {
                if (lid == 0u) {
                    out_res[kb] = size;
                    out_res[kb + 1u] = 0u;
                }
            } else {
                next = PH_CG;
            }
        } else {
            let b = count_bin(lid, row, m);
            if (lid == 0u) {
                sset(row, S_KP_PREFIX, b.x);
                sset(row, S_KP_REM, b.y);
                sset(row, S_KP_TIES, b.z);
            }
            next = PH_C1;
        }
    } else if (ph <= PH_C2) {
        let level = ph - PH_C0;
        let b = count_bin(lid, row, sget(row, S_KP_REM));
        if (lid == 0u) {
            sset(row, S_KP_PREFIX, (sget(row, S_KP_PREFIX) << digit_width(level)) | b.x);
            sset(row, S_KP_REM, b.y);
            sset(row, S_KP_TIES, b.z);
        }
        next = ph + 1u;
        if (ph == PH_C2) {
            next = select(PH_CT, PH_CG, b.y == b.z);
        }
    } else if (ph == PH_CT) {
        next = PH_CG;
    } else {
        let m = wg_uniform(lid, sget(row, S_KP_M));
        for (var j = lid; j < m; j = j + WG) {
            top_put(j, vec2<u32>(out_res[kb + 2u + 2u * j], out_res[kb + 3u + 2u * j]));
        }
        workgroupBarrier();
        sort_top(lid, m);
        let total = val64(vec2<u32>(sget(row, S_KP_MLO), sget(row, S_KP_MHI)));
        let vmax = set_top(row);
        for (var j = lid; j < m; j = j + WG) {
            let en = top_at(j);
            out_res[kb + 2u + 2u * j] = en.x;
            let w = exp_f32(bitcast<f32>(en.y) - vmax);
            out_res[kb + 3u + 2u * j] = bitcast<u32>(div_rn_cold(w, total * TWO_M40));
        }
        if (lid == 0u) {
            out_res[kb] = sget(row, S_KP_SIZE);
            out_res[kb + 1u] = m;
            atomicStore(&ctr[hb], 0u);
        }
    }
    storageBarrier();
    if (lid == 0u) {
        sset(row, S_PHASE, next);
    }
}
