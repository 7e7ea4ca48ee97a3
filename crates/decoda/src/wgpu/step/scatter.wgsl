// ---------------------------------------------------------------------------------
// Slot bookkeeping: scatter a history into a slot's bitmaps and counts, and clear it.

// Sets (or, with `clear`, zeroes) the slot's bits and counts for its history
// lists[hist_off..] (token | 1 << 31 for an output token: seen and counted; else only
// seen) and its bias list (the bias bitmap).
fn scatter(slot: u32, sp: SlotP, lid: u32, clear: bool) {
    let pb = pen_base(sparams[slot].pen_slot);
    let bm = call.bm_words;
    for (var e = lid; e < sp.hist_len; e = e + WG) {
        let v = lists[sp.hist_off + e];
        let t = v & 0x7fffffffu;
        if (clear) {
            atomicStore(&pen[pb + (t >> 5u)], 0u);
            atomicStore(&pen[pb + 2u * bm + t], 0u);
        } else {
            atomicOr(&pen[pb + (t >> 5u)], 1u << (t & 31u));
            if ((v >> 31u) != 0u) {
                atomicAdd(&pen[pb + 2u * bm + t], 1u);
            }
        }
    }
    for (var e = lid; e < sp.bias_len; e = e + WG) {
        let t = lists[sp.bias_off + 2u * e];
        if (clear) {
            atomicStore(&pen[pb + bm + (t >> 5u)], 0u);
        } else {
            atomicOr(&pen[pb + bm + (t >> 5u)], 1u << (t & 31u));
        }
    }
}

// A head's join: workgroup w scatters the history of slot rmap[w].
@compute @workgroup_size(256)
fn join(@builtin(workgroup_id) wid: vec3<u32>, lanes: Lanes) {
    let lid = lanes.lid;
    lanes_init(lanes);
    let slot = rmap[wid.x];
    scatter(slot, sparams[slot], lid, false);
}

// A head's leave: zeroes the penalty area of slot rmap[0], its DRY area and ring
// included (grid: its words / 256).
@compute @workgroup_size(256)
fn wipe(@builtin(workgroup_id) wid: vec3<u32>, lanes: Lanes) {
    let lid = lanes.lid;
    lanes_init(lanes);
    let slot = rmap[0];
    let n = 4u * call.bm_words + call.vocab + 3u * DRY_CAP;
    let w = (wid.x + wid.y * 65535u) * WG + lid;
    if (w < n) {
        atomicStore(&pen[pen_base(sparams[slot].pen_slot) + w], 0u);
    }
}

