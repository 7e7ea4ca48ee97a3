// ---------------------------------------------------------------------------------
// Many draws of one row: tokens at steps step .. step + draws - 1 from the same kept set
// (the filters do not depend on the step), after settle. `draw_lanes` invocations share
// one draw; a workgroup holds DRAW_WG / draw_lanes draws of one row. List-path rows draw
// over their kept candidates (keys in S_KLO ..= S_KHI), the others over the row. The tokens go to
// out_res[call.rows * RESW + row * draws + d]; a draw that finds no winner writes
// NO_TOKEN, which the launcher reports as a row error.

@compute @workgroup_size(256)
fn draw_many(@builtin(workgroup_id) wid: vec3<u32>, lanes: Lanes) {
    let lid = lanes.lid;
    lanes_init(lanes);
    let per = call.draw_lanes;
    let lane = lid % per;
    let d = wid.x * (DRAW_WG / per) + lid / per;
    let row = wid.y;
    let slot = rmap[row];
    let sp = sparams[slot];
    let status = sget(row, S_STATUS);
    let path = sget(row, S_PATH);
    let ns = sget(row, S_NS);
    let klo = sget(row, S_KLO);
    let khi = sget(row, S_KHI);
    let stp = step_of(slot);
    var step_lo = stp.x + d;
    var step_hi = stp.y;
    if (step_lo < d) {
        step_hi = step_hi + 1u;
    }
    let seed = vec2<u32>(sp.seed_lo, sp.seed_hi);
    let t = sp.temperature;
    var best_k = 0u;
    var best_i = NO_TOKEN;
    let list = status == 0u && path == P_DONE && ns > 0u;
    var n = 0u;
    if (d < call.draws && status == 0u) {
        if (list) {
            n = ns;
        } else {
            n = (call.vocab + 3u) / 4u;
        }
    }
    for (var g = lane; g < n; g = g + per) {
        if (list) {
            let en = entry(row, g);
            let ek = ekey(en);
            if (ek < klo || ek > khi) {
                continue;
            }
            let k = cmp_key(bitcast<f32>(en.y) + gumbel(noise_word(en.x, seed, step_lo, step_hi)));
            if (k > best_k || (k == best_k && en.x < best_i)) {
                best_k = k;
                best_i = en.x;
            }
            continue;
        }
        var words = vec4<u32>(0u, 0u, 0u, 0u);
        var have = false;
        for (var j = 0u; j < 4u; j = j + 1u) {
            let i = g * 4u + j;
            if (i >= call.vocab) {
                break;
            }
            let mb = member(row, z_of(slot, sp, i, load_x(row, i)), t);
            if (!mb.inside) {
                continue;
            }
            if (!have) {
                words = philox_cold(vec4<u32>(g, step_lo, step_hi, 0u), seed);
                have = true;
            }
            let k = cmp_key(mb.y + gumbel(words[j]));
            if (k > best_k || (k == best_k && i < best_i)) {
                best_k = k;
                best_i = i;
            }
        }
    }
    // argmax within each run of `per` invocations (ties to the smaller id)
    ra[lid] = best_k;
    rb[lid] = best_i;
    workgroupBarrier();
    for (var w = per >> 1u; w > 0u; w = w >> 1u) {
        if (lane < w) {
            let ok = ra[lid + w];
            let oi = rb[lid + w];
            if (ok > ra[lid] || (ok == ra[lid] && oi < rb[lid])) {
                ra[lid] = ok;
                rb[lid] = oi;
            }
        }
        workgroupBarrier();
    }
    if (lane == 0u && d < call.draws) {
        var token = rb[lid];
        if (status == 1u) {
            token = sget(row, S_TOKEN);
        } else if (status >= 2u) {
            token = 0u;
        }
        out_res[call.rows * RESW + row * call.draws + d] = token;
    }
}
