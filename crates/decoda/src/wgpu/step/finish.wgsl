// ---------------------------------------------------------------------------------
// finish: results, and the slot's state advanced.

@compute @workgroup_size(256)
fn finish(@builtin(workgroup_id) wid: vec3<u32>, lanes: Lanes) {
    let lid = lanes.lid;
    lanes_init(lanes);
    // (a lean call's rows on the full-row path: settle_finish, or draw_finish, finished
    // every other row)
    let row = tail_row(wid.x, (call.mode & M_LEAN) != 0u);
    kept_greedy(lid, row);
    finish_row(lid, row);
}

// finish of one row by this workgroup.
fn finish_row(lid: u32, row: u32) {
    let slot = rmap[row];
    let sp = sparams[slot];
    let lp_pass = wg_flag(lid, sget(row, S_LP) != 0u);
    var status = sget(row, S_STATUS);
    let full = sget(row, S_PATH) == P_FULL;
    var token = sget(row, S_TOKEN);
    if (lp_pass) {
        // the full-row draw and the log-sum-exp from lp's partials
        var bk = 0u;
        var bi = NO_TOKEN;
        var lse = vec2<u32>(0u, 0u);
        var before = 0u;
        for (var s = lid; s < call.splits; s = s + WG) {
            let pb = part(row, s);
            lse = add64(lse, vec2<u32>(work[pb + 16u], work[pb + 17u]));
            before = before + work[pb + 18u];
            let k = work[pb + 19u];
            let i = work[pb + 20u];
            if (k > bk || (k == bk && i < bi)) {
                bk = k;
                bi = i;
            }
        }
        let dr = wg_argmax(lid, bk, bi);
        let total = val64(wg_sum64(lid, lse)) * TWO_M40;
        var rank = wg_sum_u32(lid, before) + 1u;
        if (full) {
            token = dr.y;
            if (token == NO_TOKEN) {
                // the kept set is never empty, so this is a defect: a row error
                status = 4u;
                token = 0u;
            }
        }
        let want_lp = wg_flag(lid, (sp.flags & F_LOGPROBS) != 0u && status <= 1u);
        // the token's value; and the rank of a token drawn over the whole row: one more
        // pass. One loop and one lp_value for both (a compiler inlines each call): the
        // token's first, then this invocation's tokens of the row.
        let rank_pass = wg_flag(lid, want_lp && full);
        var vc = 0.0;
        var b = 0u;
        if (want_lp) {
            var i = token;
            var first = true;
            loop {
                let v = lp_value(row, slot, sp, i, status);
                if (first) {
                    vc = v;
                    if (!rank_pass) {
                        break;
                    }
                    first = false;
                    i = lid;
                } else {
                    if (!is_neg_inf(v) && before_in_rank(v, i, vc, token)) {
                        b = b + 1u;
                    }
                    i = i + WG;
                }
                if (i >= call.vocab) {
                    break;
                }
            }
        }
        if (rank_pass) {
            rank = wg_sum_u32(lid, b) + 1u;
        }
        if (want_lp) {
            let vmax = vmax_of(row, sp, status);
            let lse_v = ln_f32(max(total, 1.0));
            let n = min(sp.n_lp, NTOP);
            let ob = row * RESW + 2u;
            var h = 0u;
            var listed = 0u;
            for (var r = 0u; r < NTOP; r = r + 1u) {
                var k = 0u;
                var idx = 0xffffffffu;
                if (lid < call.splits && h < NTOP) {
                    let pb = part(row, lid);
                    k = work[pb + 24u + 2u * h];
                    idx = work[pb + 25u + 2u * h];
                }
                let w = wg_argmax(lid, k, idx);
                if (lid < call.splits && w.x != 0u && w.x == k && w.y == idx) {
                    h = h + 1u;
                }
                if (lid == 0u && r < n && w.x != 0u) {
                    out_res[ob + 3u + 2u * listed] = w.y;
                    out_res[ob + 4u + 2u * listed] = bitcast<u32>(fp(from_key(w.x) - vmax) - lse_v);
                    listed = listed + 1u;
                }
            }
            if (lid == 0u) {
                out_res[ob] = bitcast<u32>(fp(vc - vmax) - lse_v);
                out_res[ob + 1u] = rank;
                out_res[ob + 2u] = listed;
            }
        }
    }
    finish_out(lid, row, slot, status, token);
    if ((call.mode & M_SCATTER) != 0u) {
        storageBarrier();
        scatter(slot, sp, lid, true);
        if ((sp.flags & F_DRY) != 0u) {
            dry_clear(lid, sp);
        }
    }
}

// A row's results from its status and token (`finish_row`'s last part, and all of it
// on a light call): the outcome's code, the token, and in a head the slot moved on.
fn finish_out(lid: u32, row: u32, slot: u32, status: u32, tok: u32) {
    let sp = sparams[slot];
    var token = tok;
    if (lid == 0u) {
        var code = 0u;
        var word = 0u;
        if (status == 2u) {
            code = OUT_NON_FINITE;
            word = sget(row, S_COUNT);
        } else if (status == 3u) {
            code = OUT_NO_CANDIDATE;
        } else if (status == 4u) {
            code = OUT_NO_WINNER;
        } else if (status == 5u) {
            code = OUT_FINISHED;
            word = sstate[slot * SSW + 4u];
        }
        if (code != 0u) {
            token = 0u;
        }
        sset(row, S_TOKEN, token);
        sset(row, S_STATUS, status);
        out_tokens[row] = token;
        if (code == 0u && (call.mode & M_HEAD) != 0u) {
            // the slot moves on: step, the token's count and presence, stop conditions
            let sb = slot * SSW;
            let lo = sstate[sb] + 1u;
            sstate[sb] = lo;
            if (lo == 0u) {
                sstate[sb + 1u] = sstate[sb + 1u] + 1u;
            }
            let glo = sstate[sb + 2u] + 1u;
            sstate[sb + 2u] = glo;
            var ghi = sstate[sb + 3u];
            if (glo == 0u) {
                ghi = ghi + 1u;
                sstate[sb + 3u] = ghi;
            }
            let pb = pen_base(sparams[slot].pen_slot);
            atomicOr(&pen[pb + (token >> 5u)], 1u << (token & 31u));
            atomicAdd(&pen[pb + 2u * call.bm_words + token], 1u);
            dry_push(slot, sp, token);
            var reason = 0u;
            for (var s = 0u; s < sp.stop_len; s = s + 1u) {
                if (lists[sp.stop_off + s] == token) {
                    reason = 1u;
                }
            }
            if (reason == 0u && (ghi > sp.max_hi || (ghi == sp.max_hi && glo >= sp.max_lo))) {
                reason = 2u;
            }
            sstate[sb + 4u] = reason;
            word = reason;
        }
        if ((call.mode & (M_HEAD | M_VERIFY)) == (M_HEAD | M_VERIFY)) {
            // a verify position: the slot goes on to the next only when it drew its
            // drafted token, failed nothing and has not finished (the bonus position's
            // drafted token is NO_TOKEN: nothing follows it)
            let agrees = code == 0u && word == 0u && token == lists[call.verify + row];
            sstate[slot * SSW + SS_HALT] = select(1u, 0u, agrees);
        }
        out_res[row * RESW] = code;
        out_res[row * RESW + 1u] = word;
    }
}
