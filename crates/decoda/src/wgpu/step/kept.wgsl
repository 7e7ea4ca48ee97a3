// ---------------------------------------------------------------------------------
// The kept distribution (`kept = n`, F_KEPT): the kept set's size and its n most likely
// tokens (larger y first, then the smaller id) with softmax(y) over the set, written to
// the row's kept area of out_res (size, listed, then (id, p bits) pairs). A list-path
// row writes it in settle (`list_out`: the set is the candidates in a range of keys,
// its top found by selections and sorted alone in workgroup memory: `list_top`);
// a greedy row's set is its token at 1; a full-row-path row's is found here, by the
// row's workgroup after the draw and before finish moves the slot on (`kept_row`): one
// read for the set's size and mass (fixed point, 2^-40 units) and a first radix level
// of counts; when the set holds more than n, two more levels find the n-th largest y;
// one read gathers the tokens above it (and its ties when all of them are listed, or
// one ordered walk of the row for the ties with the smallest ids) into workgroup memory,
// and a bitonic sort of those at most 1,024 entries there orders them (`sort_top`).

const KEPTN: u32 = 1024u;   // most tokens a kept distribution lists
const KEPTW: u32 = 2050u;   // kept words per row: size, listed, then KEPTN (id, p) pairs

fn kept_area(row: u32) -> u32 {
    return call.kept_base + row * KEPTW;
}

// Counts of the kept set's keys (cmp_key of y) in digit `level`'s bins, for keys under
// `prefix`, in the row's radix histogram; returns (size, mass lo, mass hi) at level 0.
fn kept_counts(lid: u32, row: u32, slot: u32, sp: SlotP, level: u32, prefix: u32,
               vmax: f32) -> vec3<u32> {
    let hb = hbase(row);
    let sh = digit_shift(level);
    let mask = digit_mask(level);
    var cnt = 0u;
    var acc = vec2<u32>(0u, 0u);
    for (var i = lid; i < call.vocab; i = i + WG) {
        let y = kept_y(row, slot, sp, i);
        if (is_neg_inf(y)) {
            continue;
        }
        let key = cmp_key(y);
        if (!in_prefix(key, level, prefix)) {
            continue;
        }
        if (level == 0u) {
            cnt = cnt + 1u;
            acc = add64(acc, fixed40(exp_f32(y - vmax)));
        }
        atomicAdd(&ctr[hb + ((key >> sh) & mask)], 1u);
    }
    let s = wg_sum64(lid, acc);
    let c = wg_sum_u32(lid, cnt);
    storageBarrier();
    return vec3<u32>(wg_uniform(lid, c), s);
}

// Token i's y when it is in the kept set, else -inf.
fn kept_y(row: u32, slot: u32, sp: SlotP, i: u32) -> f32 {
    let mb = member(row, z_of(slot, sp, i, load_x(row, i)), sp.temperature);
    if (!mb.inside) {
        return neg_inf();
    }
    return mb.y;
}

// The kept distribution of a row at the end of its step (before finish), for rows the
// list path did not settle.
// The kept distribution of a row settled greedily (status 1): its token alone.
fn kept_single(row: u32, sp: SlotP) {
    let kb = kept_area(row);
    out_res[kb] = 1u;
    out_res[kb + 1u] = min(sp.n_kept, 1u);
    out_res[kb + 2u] = sget(row, S_TOKEN);
    out_res[kb + 3u] = bitcast<u32>(1.0);
}

fn kept_row(lid: u32, row: u32) {
    let slot = rmap[row];
    let sp = sparams[slot];
    if (!wg_flag(lid, (sp.flags & F_KEPT) != 0u)) {
        return;
    }
    let status = sget(row, S_STATUS);
    let kb = kept_area(row);
    if (!wg_flag(lid, status == 0u && sget(row, S_PATH) == P_FULL)) {
        // list-path rows have theirs (settle); a row error has none
        if (lid == 0u && status == 1u) {
            kept_single(row, sp);
        }
        return;
    }
    let hb = hbase(row);
    let vmax = set_top(row);
    // read 1: the set's size and mass; level 0's counts
    let sm = kept_counts(lid, row, slot, sp, 0u, 0u, vmax);
    let size = sm.x;
    let total = val64(sm.yz);
    let m = min(wg_uniform(lid, sp.n_kept), size);
    // the m-th largest key (0: every member is listed), and how many of its ties go
    var kk = 0u;
    var left = 0u;
    var ties = 0u;
    if (m < size && m > 0u) {
        var prefix = 0u;
        var rem = m;
        for (var level = 0u; level < 3u; level = level + 1u) {
            if (level > 0u) {
                kept_counts(lid, row, slot, sp, level, prefix, vmax);
            }
            let b = count_bin(lid, row, rem);
            prefix = (prefix << digit_width(level)) | b.x;
            rem = b.y;
            ties = b.z;
        }
        kk = prefix;
        left = rem;
    }
    if (m == 0u) {
        // nothing listed: the level-0 counts are cleared unread
        for (var b = lid; b < BINS; b = b + WG) {
            atomicStore(&ctr[hb + b], 0u);
        }
    } else if (m == size) {
        count_bin(lid, row, 1u);
    }
    storageBarrier();
    // the tokens above kk, and kk's ties when every one of them is listed, in any order
    let all_ties = left == ties;
    if (m > 0u) {
        if (lid == 0u) {
            atomicStore(&wcnt, 0u);
        }
        workgroupBarrier();
        for (var i = lid; i < call.vocab; i = i + WG) {
            let y = kept_y(row, slot, sp, i);
            if (is_neg_inf(y)) {
                continue;
            }
            let key = cmp_key(y);
            if (key > kk || (key == kk && all_ties)) {
                top_put(atomicAdd(&wcnt, 1u), vec2<u32>(i, bitcast<u32>(y)));
            }
        }
        let above = workgroupUniformLoad(&wcnt);
        if (!all_ties) {
            // the `left` ties with the smallest ids: each invocation walks its own
            // stretch of the row, after the ties of the stretches before it
            let per = (call.vocab + WG - 1u) / WG;
            let i0 = min(call.vocab, lid * per);
            let i1 = min(call.vocab, i0 + per);
            var c = 0u;
            for (var i = i0; i < i1; i = i + 1u) {
                let y = kept_y(row, slot, sp, i);
                if (!is_neg_inf(y) && cmp_key(y) == kk) {
                    c = c + 1u;
                }
            }
            var at = wg_scan64(lid, vec2<u32>(c, 0u)).x - c;
            for (var i = i0; i < i1 && at < left; i = i + 1u) {
                let y = kept_y(row, slot, sp, i);
                if (!is_neg_inf(y) && cmp_key(y) == kk) {
                    top_put(above + at, vec2<u32>(i, bitcast<u32>(y)));
                    at = at + 1u;
                }
            }
        }
        workgroupBarrier();
        sort_top(lid, m);
        for (var j = lid; j < m; j = j + WG) {
            let en = top_at(j);
            out_res[kb + 2u + 2u * j] = en.x;
            let w = exp_f32(bitcast<f32>(en.y) - vmax);
            out_res[kb + 3u + 2u * j] = bitcast<u32>(div_rn_cold(w, total * TWO_M40));
        }
    }
    if (lid == 0u) {
        out_res[kb] = size;
        out_res[kb + 1u] = m;
    }
    storageBarrier();
}
