// ---------------------------------------------------------------------------------
// DRY (stage 3a) on the device: the row's window of history, its repeat limit from the
// sequence breakers, each distance's repeat length, and the penalised tokens, computed
// by the probe's workgroup before anything reads z. A head reads the window from the
// slot's ring of its last DRY_CAP tokens (advanced by finish), a per-call row from its
// history list. The result is a bitmap of penalised tokens with a rank prefix per word,
// and per rank the token's longest repeat: z_of finds a token's penalty with two word
// reads and a popcount, in the slot's table (the host computes multiplier * base^e in
// f64 once per e, so no device arithmetic decides a penalty).
//
// The slot's DRY area (`dry_base`): bits [0, bm), rank prefixes [bm, 2 bm), longest
// repeat by rank [2 bm, 2 bm + CAP), repeat length by distance [.. + CAP), the ring
// [.. + CAP).

// The DRY area of the penalty area at `pb`.
fn dry_base(pb: u32) -> u32 {
    return pb + 2u * call.bm_words + call.vocab;
}

// The history's length: a head slot's (all it ever held), or a per-call row's.
fn dry_hist_len(slot: u32, sp: SlotP) -> u32 {
    if ((call.mode & M_HEAD) != 0u) {
        return sstate[slot * SSW + SS_HIST];
    }
    return sp.hist_len;
}

// DRY's window over a history of `len` tokens: its last `dry_penalty_last_n`.
fn dry_window(sp: SlotP, len: u32) -> u32 {
    if (sp.dry_n == 0xffffffffu) {
        return len;
    }
    return min(len, sp.dry_n);
}

// The token `i` back from the end of a history of `len` tokens (0: the last one).
fn dry_at(sp: SlotP, db: u32, len: u32, i: u32) -> u32 {
    if ((call.mode & M_HEAD) != 0u) {
        let ring = db + 2u * call.bm_words + 2u * DRY_CAP;
        return atomicLoad(&pen[ring + ((len - 1u - i) & (DRY_CAP - 1u))]);
    }
    return lists[sp.hist_off + len - 1u - i] & 0x7fffffffu;
}

// Whether token t is a one-token sequence breaker (never penalised).
fn dry_breaks_alone(sp: SlotP, t: u32) -> bool {
    var off = 0u;
    loop {
        if (off >= sp.dry_brk_len) {
            break;
        }
        let bl = lists[sp.dry_brk_off + off];
        if (bl == 1u && lists[sp.dry_brk_off + off + 1u] == t) {
            return true;
        }
        off = off + 1u + bl;
    }
    return false;
}

// The longest breaker whose first token is `i` back and whose others follow it, as its
// length less one, or 0xffffffff when none ends there.
fn dry_breaker_at(sp: SlotP, db: u32, len: u32, i: u32) -> u32 {
    let head = dry_at(sp, db, len, i);
    var longest = 0xffffffffu;
    var off = 0u;
    loop {
        if (off >= sp.dry_brk_len) {
            break;
        }
        let bl = lists[sp.dry_brk_off + off];
        let tail = bl - 1u;
        if (lists[sp.dry_brk_off + off + 1u] == head && tail <= i
            && (longest == 0xffffffffu || tail > longest)) {
            var ok = true;
            for (var o = 0u; o < tail; o = o + 1u) {
                if (lists[sp.dry_brk_off + off + 2u + o] != dry_at(sp, db, len, i - o - 1u)) {
                    ok = false;
                    break;
                }
            }
            if (ok) {
                longest = tail;
            }
        }
        off = off + 1u + bl;
    }
    return longest;
}

// Stage 3a's penalised tokens for the row's slot (call from uniform control flow, by the
// whole workgroup).
fn dry_prepare(lid: u32, slot: u32, sp: SlotP) {
    let db = dry_base(pen_base(sp.pen_slot));
    let bm = call.bm_words;
    for (var w = lid; w < bm; w = w + WG) {
        atomicStore(&pen[db + w], 0u);
    }
    let len = wg_uniform(lid, dry_hist_len(slot, sp));
    let n = dry_window(sp, len);
    let a = sp.dry_allowed;
    storageBarrier();
    if (!wg_flag(lid, n > a && n <= DRY_CAP)) {
        return;
    }
    // the limit: from the nearest breaker (the smallest distance where one ends)
    var lim = n;
    for (var c = 0u; c < n; c = c + WG) {
        let i = c + lid;
        var hit = 0u;
        var code = 0xffffffffu;
        if (i < n) {
            let tail = dry_breaker_at(sp, db, len, i);
            if (tail != 0xffffffffu) {
                hit = 1u;
                code = (i << 5u) | tail;
            }
        }
        let best = wg_argmax(lid, hit, code);
        lim = (best.y >> 5u) - (best.y & 31u);
        if (wg_flag(lid, best.x != 0u)) {
            break;
        }
        lim = n;
    }
    if (!wg_flag(lid, lim >= a)) {
        return;
    }
    // each distance's repeat length (capped at the limit), and the tokens that would
    // extend a repeat of at least `a`
    let zk = db + 2u * bm + DRY_CAP;
    for (var k = lid + 1u; k < n; k = k + WG) {
        var m = 0u;
        loop {
            if (m + k >= n || m >= lim) {
                break;
            }
            if (dry_at(sp, db, len, m) != dry_at(sp, db, len, m + k)) {
                break;
            }
            m = m + 1u;
        }
        atomicStore(&pen[zk + k], m);
        if (m >= a) {
            let t = dry_at(sp, db, len, k - 1u);
            if (!dry_breaks_alone(sp, t)) {
                atomicOr(&pen[db + (t >> 5u)], 1u << (t & 31u));
            }
        }
    }
    storageBarrier();
    // rank prefixes: each invocation a run of words
    let per = (bm + WG - 1u) / WG;
    let w0 = min(bm, lid * per);
    let w1 = min(bm, w0 + per);
    var s = 0u;
    for (var w = w0; w < w1; w = w + 1u) {
        s = s + countOneBits(atomicLoad(&pen[db + w]));
    }
    let incl = wg_scan64(lid, vec2<u32>(s, 0u)).x;
    let total = wtot.x;
    var run = incl - s;
    for (var w = w0; w < w1; w = w + 1u) {
        atomicStore(&pen[db + bm + w], run);
        run = run + countOneBits(atomicLoad(&pen[db + w]));
    }
    let el = db + 2u * bm;
    for (var r = lid; r < total; r = r + WG) {
        atomicStore(&pen[el + r], 0u);
    }
    storageBarrier();
    for (var k = lid + 1u; k < n; k = k + WG) {
        let m = atomicLoad(&pen[zk + k]);
        if (m >= a) {
            let t = dry_at(sp, db, len, k - 1u);
            let word = atomicLoad(&pen[db + (t >> 5u)]);
            let bit = 1u << (t & 31u);
            if ((word & bit) != 0u) {
                let r = atomicLoad(&pen[db + bm + (t >> 5u)]) + countOneBits(word & (bit - 1u));
                atomicMax(&pen[el + r], m);
            }
        }
    }
}

// The DRY penalty of token i (word w, bit `bit`) from the slot's DRY area at db: 0 when
// it is not penalised.
fn dry_of(sp: SlotP, db: u32, w: u32, bit: u32) -> f32 {
    let word = atomicLoad(&pen[db + w]);
    if ((word & bit) == 0u) {
        return 0.0;
    }
    let bm = call.bm_words;
    let r = atomicLoad(&pen[db + bm + w]) + countOneBits(word & (bit - 1u));
    let m = atomicLoad(&pen[db + 2u * bm + r]);
    let e = min(m - sp.dry_allowed, sp.dry_tab_len - 1u);
    return bitcast<f32>(lists[sp.dry_tab_off + e]);
}

// A per-call row's finish: zeroes what its DRY pass wrote (the bitmap, the rank prefixes,
// the longest repeats and the repeat lengths), so the penalty buffer is all zeros
// between calls: the next call may lay its areas out for another vocabulary, where these
// words fall in another row's bitmaps or counts.
fn dry_clear(lid: u32, sp: SlotP) {
    let db = dry_base(pen_base(sp.pen_slot));
    let bm = call.bm_words;
    let n = min(dry_window(sp, sp.hist_len), DRY_CAP);
    for (var w = lid; w < 2u * bm; w = w + WG) {
        atomicStore(&pen[db + w], 0u);
    }
    for (var k = lid; k < n; k = k + WG) {
        atomicStore(&pen[db + 2u * bm + k], 0u);
        atomicStore(&pen[db + 2u * bm + DRY_CAP + k], 0u);
    }
}

// A head's finish: the drawn token joins the slot's ring.
fn dry_push(slot: u32, sp: SlotP, token: u32) {
    let db = dry_base(pen_base(sp.pen_slot));
    let len = sstate[slot * SSW + SS_HIST];
    atomicStore(&pen[db + 2u * call.bm_words + 2u * DRY_CAP + (len & (DRY_CAP - 1u))], token);
    sstate[slot * SSW + SS_HIST] = len + 1u;
}
