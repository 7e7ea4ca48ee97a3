// decoda's MoE dispatch on the device (README, "MoE dispatch"): a SwiGLU expert layer
// for x [N, D]. The launcher (moe.rs) records, in this order:
//
//   route      (N)            router logits -> k experts and weights per token (optional:
//                             the routing may come from the host)
//   count      (N*k / 256)    sorted calls: tokens per expert
//   place      (E)            sorted calls: the stable counting sort, one workgroup per
//                             expert walking the pairs in order; the plan (order, idx,
//                             inv_order, offsets) lands in `work`
//   act        (H, rows/4)     act[j] = silu(gate_e x_t) * up_e x_t for row j (expert
//                             e = idx[j], token t), weights dequantized in registers;
//                             a layer in parts (whole experts a buffer) runs act and
//                             down once per part, each for the rows of its experts
//   down       (D, rows/4)     out[j] = down_e act[j]
//   combine    (D/256, N)     y[n] = sum_s w[n, s] out[row of pair (n, s)], in slot order
//
// Every grid is sized by N, N*k, E, D and H: never by which experts were chosen, so the
// routing never goes back to the host. Unsorted calls skip count and place: row j is
// pair j.

struct Params {
    tokens: u32,
    top_k: u32,
    experts: u32,
    hidden: u32,        // D
    inter: u32,         // H
    sorted: u32,
    router: u32,        // 0 softmax-top-k, 1 softmax-top-k renormalised, 2 top-k-softmax
    separate: u32,      // gate and up in two matrices (else fused [E, 2H, D])
    dtype: u32,         // 0 f32, 1 bf16, 2 f16, 3 affine
    bits: u32,
    group: u32,
    zero: u32,          // always 0 (fp)
    // word offsets in `weights`: gate (or fused), up, down; each with scales and biases
    gate_w: u32,
    gate_s: u32,
    gate_b: u32,
    up_w: u32,
    up_s: u32,
    up_b: u32,
    down_w: u32,
    down_s: u32,
    down_b: u32,
    // word offsets in `work`
    w_idx_in: u32,      // routing: expert ids [N*k]
    w_wt: u32,          // routing: weights [N*k]
    w_order: u32,       // plan: order [N*k]
    w_idx: u32,         // plan: idx [N*k]
    w_inv: u32,         // plan: inv_order [N*k]
    w_off: u32,         // plan: offsets [E + 1]
    w_act: u32,         // act [rows, H]
    w_out: u32,         // out [rows, D]
    e_lo: u32,          // the experts of this dispatch's weights (a layer in parts)
    e_hi: u32,
    pad2: u32,
}

@group(0) @binding(0) var<uniform> prm: Params;
@group(0) @binding(1) var<storage, read> weights: array<u32>;
@group(0) @binding(2) var<storage, read> xs: array<f32>;
@group(0) @binding(3) var<storage, read> router_logits: array<f32>;
@group(0) @binding(4) var<storage, read_write> work: array<u32>;
@group(0) @binding(5) var<storage, read_write> counts: array<atomic<u32>>;
@group(0) @binding(6) var<storage, read_write> ys: array<f32>;

var<workgroup> scan: array<u32, 256>;

fn opaque_zero() -> u32 {
    return prm.zero;
}

// ---------------------------------------------------------------------------------
// Routing (the same arithmetic as moe::route_with on the CPU).

@compute @workgroup_size(64)
fn route(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let n = gid.x + gid.y * nwg.x * 64u;
    if (n >= prm.tokens) {
        return;
    }
    let e_n = prm.experts;
    let base = n * e_n;
    var m = router_logits[base];
    for (var e = 1u; e < e_n; e = e + 1u) {
        m = max(m, router_logits[base + e]);
    }
    let k = prm.top_k;
    let ob = n * k;
    if (prm.router == 2u) {
        // top-k of the logits, then a softmax over them
        var prev_v = 0.0;
        var prev_i = 0u;
        var sum = 0.0;
        for (var s = 0u; s < k; s = s + 1u) {
            var bv = 0.0;
            var bi = 0xffffffffu;
            for (var e = 0u; e < e_n; e = e + 1u) {
                let v = router_logits[base + e];
                // below the previous pick in (value desc, id asc) order
                let after = s == 0u || v < prev_v || (v == prev_v && e > prev_i);
                if (after && (bi == 0xffffffffu || v > bv)) {
                    bv = v;
                    bi = e;
                }
            }
            prev_v = bv;
            prev_i = bi;
            work[prm.w_idx_in + ob + s] = bi;
            let ev = exp_f32(bv - router_logits[base + work[prm.w_idx_in + ob]]);
            work[prm.w_wt + ob + s] = bitcast<u32>(ev);
            sum = sum + ev;
        }
        for (var s = 0u; s < k; s = s + 1u) {
            let ev = bitcast<f32>(work[prm.w_wt + ob + s]);
            work[prm.w_wt + ob + s] = bitcast<u32>(div_rn(ev, sum));
        }
        return;
    }
    var sum = 0.0;
    for (var e = 0u; e < e_n; e = e + 1u) {
        sum = sum + exp_f32(router_logits[base + e] - m);
    }
    var prev_p = 0.0;
    var prev_i = 0u;
    var norm = 0.0;
    for (var s = 0u; s < k; s = s + 1u) {
        var bp = 0.0;
        var bi = 0xffffffffu;
        for (var e = 0u; e < e_n; e = e + 1u) {
            let p = div_rn(exp_f32(router_logits[base + e] - m), sum);
            let after = s == 0u || p < prev_p || (p == prev_p && e > prev_i);
            if (after && (bi == 0xffffffffu || p > bp)) {
                bp = p;
                bi = e;
            }
        }
        prev_p = bp;
        prev_i = bi;
        work[prm.w_idx_in + ob + s] = bi;
        work[prm.w_wt + ob + s] = bitcast<u32>(bp);
        norm = norm + bp;
    }
    if (prm.router == 1u) {
        for (var s = 0u; s < k; s = s + 1u) {
            let p = bitcast<f32>(work[prm.w_wt + ob + s]);
            work[prm.w_wt + ob + s] = bitcast<u32>(div_rn(p, norm));
        }
    }
}

// ---------------------------------------------------------------------------------
// The plan of a sorted call: a stable counting sort by expert.

@compute @workgroup_size(256)
fn count(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let p = gid.x + gid.y * nwg.x * 256u;
    if (p >= prm.tokens * prm.top_k) {
        return;
    }
    atomicAdd(&counts[work[prm.w_idx_in + p]], 1u);
}

// Workgroup e places expert e's pairs, in pair order, from offset sum(counts[0..e]).
@compute @workgroup_size(256)
fn place(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let e = wid.x + wid.y * 65535u;
    if (e >= prm.experts) {
        return;
    }
    var off = 0u;
    for (var f = 0u; f < e; f = f + 1u) {
        off = off + atomicLoad(&counts[f]);
    }
    if (lid == 0u) {
        work[prm.w_off + e] = off;
        if (e + 1u == prm.experts) {
            work[prm.w_off + prm.experts] = off + atomicLoad(&counts[e]);
        }
    }
    let rows = prm.tokens * prm.top_k;
    var base = off;
    for (var t0 = 0u; t0 < rows; t0 = t0 + 256u) {
        let p = t0 + lid;
        var mine = 0u;
        if (p < rows && work[prm.w_idx_in + p] == e) {
            mine = 1u;
        }
        // inclusive scan of `mine` over the tile
        scan[lid] = mine;
        workgroupBarrier();
        for (var s = 1u; s < 256u; s = s << 1u) {
            var v = scan[lid];
            if (lid >= s) {
                v = v + scan[lid - s];
            }
            workgroupBarrier();
            scan[lid] = v;
            workgroupBarrier();
        }
        if (mine == 1u) {
            let at = base + scan[lid] - 1u;
            work[prm.w_order + at] = p;
            work[prm.w_idx + at] = e;
            work[prm.w_inv + p] = at;
        }
        let tile = scan[255];
        workgroupBarrier();
        base = base + tile;
    }
}

// Row j's expert and token.
fn row_expert(j: u32) -> u32 {
    if (prm.sorted != 0u) {
        return work[prm.w_idx + j];
    }
    return work[prm.w_idx_in + j];
}

fn row_token(j: u32) -> u32 {
    if (prm.sorted != 0u) {
        return work[prm.w_order + j] / prm.top_k;
    }
    return j / prm.top_k;
}

// ---------------------------------------------------------------------------------
// Weights in their own format, dequantized in registers.

// Weight (row o, input i) of a matrix [E, out, in] starting at word `w`, for expert e:
// element index `(e * out + o) * in + i`.
fn weight(w: u32, s: u32, b: u32, rows_per_expert: u32, inf: u32, e: u32, o: u32, i: u32) -> f32 {
    let r = e * rows_per_expert + o;
    let el = r * inf + i;
    if (prm.dtype == 0u) {
        return bitcast<f32>(weights[w + el]);
    }
    if (prm.dtype == 1u || prm.dtype == 2u) {
        let word = weights[w + (el >> 1u)];
        let h = (word >> ((el & 1u) * 16u)) & 0xffffu;
        if (prm.dtype == 1u) {
            return bitcast<f32>(h << 16u);
        }
        return f16_bits(h);
    }
    let per = 32u / prm.bits;
    let rw = inf / per;
    let word = weights[w + r * rw + i / per];
    let code = (word >> (prm.bits * (i % per))) & ((1u << prm.bits) - 1u);
    let g = r * (inf / prm.group) + i / prm.group;
    let sc = bitcast<f32>(weights[s + g]);
    let bi = bitcast<f32>(weights[b + g]);
    return fp(sc * f32(code)) + bi;
}

fn f16_bits(h: u32) -> f32 {
    let sgn = (h & 0x8000u) << 16u;
    let e = (h >> 10u) & 0x1fu;
    let m = h & 0x3ffu;
    if (e == 31u) {
        return bitcast<f32>(sgn | 0x7f800000u | (m << 13u));
    }
    if (e == 0u) {
        let v = f32(m) * 5.9604645e-8;
        return bitcast<f32>(bitcast<u32>(v) | sgn);
    }
    return bitcast<f32>(sgn | ((e + 112u) << 23u) | (m << 13u));
}

fn silu(g: f32) -> f32 {
    return g / (1.0 + exp_f32(-g));
}

// ---------------------------------------------------------------------------------
// The grouped products: a workgroup of 64 invocations computes one output of up to 4
// consecutive rows, the invocations splitting the weight row (consecutive words, so a
// GPU reads each row in whole lines) and summing in a fixed tree. A row's result depends
// only on its expert and token, so both branches give the same bits. (Sorted rows of one
// expert share the weight row through the cache.)

var<workgroup> red_g: array<f32, 64>;
var<workgroup> red_u: array<f32, 64>;
var<workgroup> w_expert: u32;

// Row j's expert among this dispatch's weights: a layer in parts (whole experts a
// buffer) runs the products once per part, each for the rows whose expert it holds;
// NO_EXPERT for the others. Uniform across the workgroup (one value for all of it).
const NO_EXPERT: u32 = 0xffffffffu;
fn part_expert(j: u32, lid: u32) -> u32 {
    if (lid == 0u) {
        w_expert = row_expert(j);
    }
    let e = workgroupUniformLoad(&w_expert);
    if (e < prm.e_lo || e >= prm.e_hi) {
        return NO_EXPERT;
    }
    return e - prm.e_lo;
}

// Input i of a row: x (src 0) or the activations in `work` (src 1).
fn xin(src: u32, base: u32, i: u32) -> f32 {
    if (src == 0u) {
        return xs[base + i];
    }
    return bitcast<f32>(work[base + i]);
}

// This invocation's share of W[e][o] . x: inputs lid, lid + 64, ... (affine: words).
fn row_dot(w: u32, s: u32, b: u32, rows_per_expert: u32, inf: u32, e: u32, o: u32,
           src: u32, xbase: u32, lid: u32) -> f32 {
    var acc = 0.0;
    if (prm.dtype == 3u) {
        let per = 32u / prm.bits;
        let rw = inf / per;
        let mask = (1u << prm.bits) - 1u;
        let gpr = inf / prm.group;
        let r = e * rows_per_expert + o;
        for (var wi = lid; wi < rw; wi = wi + 64u) {
            let word = weights[w + r * rw + wi];
            let i0 = wi * per;
            let g = r * gpr + i0 / prm.group;
            let sc = bitcast<f32>(weights[s + g]);
            let bi = bitcast<f32>(weights[b + g]);
            for (var q = 0u; q < per; q = q + 1u) {
                let wv = fp(sc * f32((word >> (prm.bits * q)) & mask)) + bi;
                acc = acc + wv * xin(src, xbase, i0 + q);
            }
        }
    } else {
        for (var i = lid; i < inf; i = i + 64u) {
            acc = acc + weight(w, s, b, rows_per_expert, inf, e, o, i) * xin(src, xbase, i);
        }
    }
    return acc;
}

// Sums red_g (and red_u) over the workgroup into element 0.
fn reduce_pair(lid: u32) {
    workgroupBarrier();
    for (var st = 32u; st > 0u; st = st >> 1u) {
        if (lid < st) {
            red_g[lid] = red_g[lid] + red_g[lid + st];
            red_u[lid] = red_u[lid] + red_u[lid + st];
        }
        workgroupBarrier();
    }
}

@compute @workgroup_size(64)
fn act(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let o = wid.x;
    let rows = prm.tokens * prm.top_k;
    let d = prm.hidden;
    let h = prm.inter;
    for (var rr = 0u; rr < 4u; rr = rr + 1u) {
        let j = wid.y * 4u + rr;
        if (j >= rows) {
            break;
        }
        let e = part_expert(j, lid);
        if (e == NO_EXPERT) {
            continue;
        }
        let xb = row_token(j) * d;
        if (prm.separate != 0u) {
            red_g[lid] = row_dot(prm.gate_w, prm.gate_s, prm.gate_b, h, d, e, o, 0u, xb, lid);
            red_u[lid] = row_dot(prm.up_w, prm.up_s, prm.up_b, h, d, e, o, 0u, xb, lid);
        } else {
            red_g[lid] = row_dot(prm.gate_w, prm.gate_s, prm.gate_b, 2u * h, d, e, o, 0u, xb, lid);
            red_u[lid] = row_dot(prm.gate_w, prm.gate_s, prm.gate_b, 2u * h, d, e, h + o, 0u, xb, lid);
        }
        reduce_pair(lid);
        if (lid == 0u) {
            work[prm.w_act + j * h + o] = bitcast<u32>(silu(red_g[0]) * red_u[0]);
        }
        workgroupBarrier();
    }
}

@compute @workgroup_size(64)
fn down(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let o = wid.x;
    let rows = prm.tokens * prm.top_k;
    let d = prm.hidden;
    let h = prm.inter;
    for (var rr = 0u; rr < 4u; rr = rr + 1u) {
        let j = wid.y * 4u + rr;
        if (j >= rows) {
            break;
        }
        let e = part_expert(j, lid);
        if (e == NO_EXPERT) {
            continue;
        }
        red_g[lid] = row_dot(prm.down_w, prm.down_s, prm.down_b, d, h, e, o, 1u, prm.w_act + j * h, lid);
        red_u[lid] = 0.0;
        reduce_pair(lid);
        if (lid == 0u) {
            work[prm.w_out + j * d + o] = bitcast<u32>(red_g[0]);
        }
        workgroupBarrier();
    }
}

@compute @workgroup_size(256)
fn combine(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let o = wid.x * 256u + lid;
    let n = wid.y;
    let d = prm.hidden;
    if (o >= d || n >= prm.tokens) {
        return;
    }
    var y = 0.0;
    for (var s = 0u; s < prm.top_k; s = s + 1u) {
        let p = n * prm.top_k + s;
        var j = p;
        if (prm.sorted != 0u) {
            j = work[prm.w_inv + p];
        }
        let w = bitcast<f32>(work[prm.w_wt + p]);
        y = y + fp(w * bitcast<f32>(work[prm.w_out + j * d + o]));
    }
    ys[n * d + o] = y;
}
