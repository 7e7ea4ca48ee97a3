// decoda's MoE dispatch on the device (README, "MoE dispatch"): a SwiGLU expert layer
// for x [N, D]. The launcher (moe.rs) records, in this order:
//
//   route      (N)            router logits -> k experts and weights per token, one
//                             workgroup a token (optional: the routing may come from
//                             the host)
//   count      (N*k / 256)    sorted calls: tokens per expert
//   place      (E)            sorted calls: the stable counting sort, one workgroup per
//                             expert walking the pairs in order; the plan (order, idx,
//                             inv_order, offsets, and the tiles of 32 rows of an expert
//                             the tiled products take) lands in `work`
//   act        (H/4 * rows)   act[j] = silu(gate_e x_t) * up_e x_t for row j (expert
//                             e = idx[j], token t), weights dequantized in registers;
//                             a layer in parts (whole experts a buffer) runs act and
//                             down once per part, each for the rows of its experts
//   down       (D/4 * rows)   out[j] = down_e act[j]
//   combine    (D/256, N)     y[n] = sum_s w[n, s] out[row of pair (n, s)], in slot order
//                             (y += with `accumulate`: a residual stream)
//   down_combine (D/4 * N)    down and combine in one dispatch, for a layer in one part
//   act_tiled, down_tiled     sorted calls: act and down as tiles of 32 rows of one
//                             expert by 8 weight rows (tile.wgsl), then combine: an
//                             expert's weights read once per 32 of its rows; the same
//                             bits as act and down
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
    group: u32,         // (the products take the module's GROUP)
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
    w_act: u32,         // act [rows, H] (in `acts`)
    w_out: u32,         // out [rows, D]
    e_lo: u32,          // the experts of this dispatch's weights (a layer in parts)
    e_hi: u32,
    accumulate: u32,    // y += the combination (a residual stream) instead of y =
    w_tb: u32,          // plan: the first tile of each expert [E + 1]
    w_tiles: u32,       // plan: the tiles, (first row, expert << 8 | rows) each
}

@group(0) @binding(0) var<uniform> prm: Params;
@group(0) @binding(1) var<storage, read> weights: array<vec4<u32>>;
// (binding 2, `xs`, the layer's input rows, and binding 7, `acts`, the experts'
// activations between the gate/up and the down products: declared with `xs_f`, `acts_f`,
// `put_act4` and `xin4` by moe_x1.wgsl or moe_x4.wgsl)
@group(0) @binding(3) var<storage, read> router_logits: array<f32>;
@group(0) @binding(4) var<storage, read_write> work: array<u32>;
@group(0) @binding(5) var<storage, read_write> counts: array<atomic<u32>>;
@group(0) @binding(6) var<storage, read_write> ys: array<f32>;

// `place`: which of a chunk's 256 pairs go to the workgroup's expert, a bit each
var<workgroup> mask: array<atomic<u32>, 8>;
// `place`: the expert's first pair, first tile and pairs
var<workgroup> place_at: vec3<u32>;

fn opaque_zero() -> u32 {
    return prm.zero;
}

// ---------------------------------------------------------------------------------
// Routing (the same arithmetic as moe::route_with on the CPU, bit for bit): one
// workgroup per token, its invocations over the experts. The softmax's sum is taken in
// expert order by one invocation (as the CPU sums), each probability is computed by the
// invocation that holds its expert, and the k choices are the first k in the order
// largest value, then smallest id: by rank (route_ranked) when every expert has an
// invocation, else k argmax rounds over the workgroup (each below the previous choice).

const RT: u32 = 256u;

var<workgroup> rt_key: array<u32, 256>;
var<workgroup> rt_idx: array<u32, 256>;
var<workgroup> rt_val: array<f32, 256>;
var<workgroup> rt_m: f32;
var<workgroup> rt_sum: f32;

// The workgroup's largest (key, then smallest id); every invocation gets it.
fn rt_argmax(lid: u32, key: u32, idx: u32) -> vec2<u32> {
    rt_key[lid] = key;
    rt_idx[lid] = idx;
    workgroupBarrier();
    for (var s = RT / 2u; s > 0u; s = s >> 1u) {
        if (lid < s) {
            let ok = rt_key[lid + s];
            let oi = rt_idx[lid + s];
            if (ok > rt_key[lid] || (ok == rt_key[lid] && oi < rt_idx[lid])) {
                rt_key[lid] = ok;
                rt_idx[lid] = oi;
            }
        }
        workgroupBarrier();
    }
    let r = vec2<u32>(rt_key[0], rt_idx[0]);
    workgroupBarrier();
    return r;
}

// An order-preserving key of a finite f32 (larger value, larger key).
fn rt_order(v: f32) -> u32 {
    let b = bitcast<u32>(v);
    return select(b | 0x80000000u, ~b, (b & 0x80000000u) != 0u);
}

// Expert e's routing value: its probability (softmax routers) or its logit (top-k then
// softmax).
fn rt_value(base: u32, e: u32) -> f32 {
    let v = router_logits[base + e];
    if (prm.router == 2u) {
        return v;
    }
    return div_rn(exp_f32(v - rt_m), rt_sum);
}

// The choices of a token's router when every expert has an invocation (E <= RT): each
// expert's rank in the order of the k argmax rounds (larger value first, then smaller
// id) is the count of experts before it, read from workgroup memory; ranks below k are
// the choices in that order, the same as the rounds' (which `route` runs for larger E)
// with one barrier instead of k trees. Each choice's invocation writes it and its value.
fn route_ranked(lid: u32, base: u32, e_n: u32, k: u32, ob: u32) {
    var key = 0u;
    if (lid < e_n) {
        key = rt_order(rt_value(base, lid));
    }
    rt_key[lid] = key;
    workgroupBarrier();
    if (lid < e_n) {
        var rank = 0u;
        for (var e = 0u; e < e_n; e = e + 1u) {
            let o = rt_key[e];
            if (o > key || (o == key && e < lid)) {
                rank = rank + 1u;
            }
        }
        if (rank < k) {
            let v = rt_value(base, lid);
            rt_val[rank] = v;
            work[prm.w_idx_in + ob + rank] = lid;
            work[prm.w_wt + ob + rank] = bitcast<u32>(v);
        }
    }
    workgroupBarrier();
}

// Choice s's value (probability or logit): from workgroup memory when the k choices fit
// it, else from where the choice was written.
fn chosen(ob: u32, k: u32, s: u32) -> f32 {
    if (k <= RT) {
        return rt_val[s];
    }
    return bitcast<f32>(work[prm.w_wt + ob + s]);
}

// The choices' weights from their values (invocation 0, after the choices): softmax
// probabilities as they are (router 0), renormalised over the choices (1), or a
// softmax over the chosen logits from the first choice (2), each sum in choice order.
fn route_weights(ob: u32, k: u32) {
    if (prm.router == 1u) {
        var norm = 0.0;
        for (var s = 0u; s < k; s = s + 1u) {
            norm = norm + chosen(ob, k, s);
        }
        for (var s = 0u; s < k; s = s + 1u) {
            work[prm.w_wt + ob + s] = bitcast<u32>(div_rn(chosen(ob, k, s), norm));
        }
    } else if (prm.router == 2u) {
        let top = chosen(ob, k, 0u);
        var sum = 0.0;
        for (var s = 0u; s < k; s = s + 1u) {
            sum = sum + exp_f32(chosen(ob, k, s) - top);
        }
        for (var s = 0u; s < k; s = s + 1u) {
            work[prm.w_wt + ob + s] = bitcast<u32>(div_rn(exp_f32(chosen(ob, k, s) - top), sum));
        }
    }
}

@compute @workgroup_size(256)
fn route(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let n = wid.x + wid.y * 65535u;
    if (n >= prm.tokens) {
        return;
    }
    let e_n = prm.experts;
    let base = n * e_n;
    // the row's largest logit
    var m = router_logits[base];
    for (var e = lid; e < e_n; e = e + RT) {
        m = max(m, router_logits[base + e]);
    }
    rt_val[lid] = m;
    workgroupBarrier();
    for (var s = RT / 2u; s > 0u; s = s >> 1u) {
        if (lid < s) {
            rt_val[lid] = max(rt_val[lid], rt_val[lid + s]);
        }
        workgroupBarrier();
    }
    if (lid == 0u) {
        rt_m = rt_val[0];
        rt_sum = 0.0;
    }
    workgroupBarrier();
    if (prm.router != 2u) {
        // the softmax's sum in expert order: the exponentials a tile at a time, added
        // by one invocation
        for (var t0 = 0u; t0 < e_n; t0 = t0 + RT) {
            let e = t0 + lid;
            if (e < e_n) {
                rt_val[lid] = exp_f32(router_logits[base + e] - rt_m);
            }
            workgroupBarrier();
            if (lid == 0u) {
                var sum = rt_sum;
                for (var i = 0u; i < min(RT, e_n - t0); i = i + 1u) {
                    sum = sum + rt_val[i];
                }
                rt_sum = sum;
            }
            workgroupBarrier();
        }
    }
    let k = prm.top_k;
    let ob = n * k;
    if (e_n <= RT) {
        route_ranked(lid, base, e_n, k, ob);
    } else {
        route_rounds(lid, base, e_n, k, ob);
    }
    if (lid == 0u) {
        route_weights(ob, k);
    }
}

// The choices as k argmax rounds over the workgroup (E > RT), each below the previous
// choice in the order (larger value, then smaller id); invocation 0 writes them.
fn route_rounds(lid: u32, base: u32, e_n: u32, k: u32, ob: u32) {
    // (in the CPU's total order: -0 below +0)
    var prev_k = 0u;
    var prev_i = 0u;
    for (var s = 0u; s < k; s = s + 1u) {
        var bk = 0u;
        var bi = 0xffffffffu;
        for (var e = lid; e < e_n; e = e + RT) {
            let key = rt_order(rt_value(base, e));
            let after = s == 0u || key < prev_k || (key == prev_k && e > prev_i);
            if (after && (bi == 0xffffffffu || key > bk)) {
                bk = key;
                bi = e;
            }
        }
        let best = rt_argmax(lid, select(0u, bk, bi != 0xffffffffu), bi);
        prev_k = best.x;
        prev_i = best.y;
        if (lid == 0u) {
            let v = rt_value(base, prev_i);
            if (s < RT) {
                rt_val[s] = v;
            }
            work[prm.w_idx_in + ob + s] = prev_i;
            work[prm.w_wt + ob + s] = bitcast<u32>(v);
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
    // the experts before e: their pairs and tiles, summed by one invocation (software
    // adapters run an atomic once per invocation that executes it), which writes the
    // plan's offsets
    if (lid == 0u) {
        var off = 0u;
        var tb = 0u;
        for (var f = 0u; f < e; f = f + 1u) {
            let cf = atomicLoad(&counts[f]);
            off = off + cf;
            tb = tb + (cf + 31u) / 32u;
        }
        let cnt = atomicLoad(&counts[e]);
        work[prm.w_off + e] = off;
        work[prm.w_tb + e] = tb;
        if (e + 1u == prm.experts) {
            work[prm.w_off + prm.experts] = off + cnt;
            work[prm.w_tb + prm.experts] = tb + (cnt + 31u) / 32u;
        }
        place_at = vec3<u32>(off, tb, cnt);
    }
    let pl = workgroupUniformLoad(&place_at);
    let off = pl.x;
    let tb = pl.y;
    let cnt = pl.z;
    let tiles = (cnt + 31u) / 32u;
    // the tiled products' table: tile i of expert e holds its rows 32i .. (at most 32)
    for (var i = lid; i < tiles; i = i + 256u) {
        work[prm.w_tiles + 2u * (tb + i)] = off + 32u * i;
        work[prm.w_tiles + 2u * (tb + i) + 1u] = (e << 8u) | min(32u, cnt - 32u * i);
    }
    // the pairs 256 at a time: a pair's place is `base` plus the expert's pairs before
    // it in the chunk, counted from a bit mask of the chunk (3 barriers a chunk: software
    // adapters pay for each barrier in every invocation)
    let rows = prm.tokens * prm.top_k;
    var base = off;
    for (var t0 = 0u; t0 < rows; t0 = t0 + 256u) {
        if (lid < 8u) {
            atomicStore(&mask[lid], 0u);
        }
        workgroupBarrier();
        let p = t0 + lid;
        let mine = p < rows && work[prm.w_idx_in + p] == e;
        let w = lid / 32u;
        let bit = 1u << (lid % 32u);
        if (mine) {
            atomicOr(&mask[w], bit);
        }
        workgroupBarrier();
        var before = 0u;
        var tile = 0u;
        for (var i = 0u; i < 8u; i = i + 1u) {
            let c = countOneBits(atomicLoad(&mask[i]));
            tile = tile + c;
            before = before + select(0u, c, i < w);
        }
        if (mine) {
            let at = base + before + countOneBits(atomicLoad(&mask[w]) & (bit - 1u));
            work[prm.w_order + at] = p;
            work[prm.w_idx + at] = e;
            work[prm.w_inv + p] = at;
        }
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
// The grouped products, weights in their own format (`DTYPE` and `BITS`, prefixed by the
// launcher: one module per format, no format branch in the loop), dequantized in
// registers. A workgroup of 256 invocations computes 4 outputs of one row (a token and
// one of its experts), a team of 64 per output: each invocation streams its share of
// the expert's weight row as vec4<u32> loads (chunks lane, lane + 64, ...), and the 64
// partial sums are added once at the end by a fixed tree. A row's result depends only
// on its expert and token, so both branches give the same bits. Rows are padded to
// whole vec4s on upload (moe.rs); a chunk's arithmetic is chunk.wgsl's.

fn silu(g: f32) -> f32 {
    return g / (1.0 + exp_f32(-g));
}

const TEAM: u32 = 64u;

var<workgroup> red_g: array<f32, 256>;
var<workgroup> red_u: array<f32, 256>;
var<workgroup> w_expert: u32;

// Row j's expert among this dispatch's weights: a layer in parts (whole experts a
// buffer) runs the products once per part, each for the rows whose expert it holds;
// NO_EXPERT for the others. Uniform across the workgroup (one value for all of it).
const NO_EXPERT: u32 = 0xffffffffu;
fn part_expert(j: u32, lid: u32) -> u32 {
    if (lid == 0u) {
        w_expert = row_expert(j);
    }
    return local_expert(workgroupUniformLoad(&w_expert));
}

// Expert e among this dispatch's weights, or NO_EXPERT when another part holds it.
fn local_expert(e: u32) -> u32 {
    if (e < prm.e_lo || e >= prm.e_hi) {
        return NO_EXPERT;
    }
    return e - prm.e_lo;
}

// Word `i` of the weights.
fn wword(i: u32) -> u32 {
    return weights[i >> 2u][i & 3u];
}

// (tile.wgsl's accessors)
fn wvec(i: u32) -> vec4<u32> {
    return weights[i];
}

fn wgroup() -> u32 {
    return GROUP;
}

// Words of one weight row of `inf` inputs on the device (whole vec4s).
fn row_words(inf: u32) -> u32 {
    if (DTYPE == 0u) {
        return (inf + 3u) / 4u * 4u;
    }
    if (DTYPE <= 2u) {
        return ((inf + 1u) / 2u + 3u) / 4u * 4u;
    }
    return inf * BITS / 32u;
}

// Input i of a row (0 past its `n` inputs): x (src 0) or the activations in `acts` (1).
fn xin(sel: u32, base: u32, i: u32, n: u32) -> f32 {
    let at = base + min(i, n - 1u);
    var v: f32;
    if (sel == 0u) {
        v = xs_f(at);
    } else {
        v = acts_f(at);
    }
    return select(0.0, v, i < n);
}

// This invocation's share of W[r] . input, for row r of a matrix of `inf` inputs at
// word `w` (scales at `s`, biases at `b`).
fn stream(w: u32, s: u32, b: u32, r: u32, inf: u32, src: u32, xb: u32, lane: u32) -> f32 {
    let rw = row_words(inf);
    let base = (w + r * rw) / 4u;
    let gpr = inf / GROUP;
    var acc = 0.0;
    for (var c = lane; c < rw / 4u; c = c + TEAM) {
        let i0 = c * per_chunk();
        var sc = 0.0;
        var bi = 0.0;
        if (DTYPE == 3u) {
            let g = r * gpr + i0 / GROUP;
            sc = bitcast<f32>(wword(s + g));
            bi = bitcast<f32>(wword(b + g));
        }
        acc = acc + chunk_dot(weights[base + c], i0, src, xb, inf, sc, bi);
    }
    return acc;
}

// Sums each team's 64 values of red_g (and red_u) into its first: the tree's levels in
// workgroup memory down to `tree_floor`, the rest as a butterfly in registers
// (team_wg.wgsl or team_sg.wgsl, appended by the launcher: the same bits).
fn reduce_teams(lane: u32, lid: u32) {
    workgroupBarrier();
    if (serial_tree()) {
        // (tile.wgsl's reduce_red8_from: the same adds, in series)
        if (lane == 0u) {
            for (var s = TEAM / 2u; s > 0u; s = s >> 1u) {
                for (var l = 0u; l < s; l = l + 1u) {
                    red_g[lid + l] = red_g[lid + l] + red_g[lid + l + s];
                    red_u[lid + l] = red_u[lid + l] + red_u[lid + l + s];
                }
            }
        }
        workgroupBarrier();
        return;
    }
    var st = TEAM / 2u;
    for (; st > 0u && st >= tree_floor(); st = st >> 1u) {
        if (lane < st) {
            red_g[lid] = red_g[lid] + red_g[lid + st];
            red_u[lid] = red_u[lid] + red_u[lid + st];
        }
        workgroupBarrier();
    }
    if (st > 0u) {
        let g = butterfly(red_g[lid], st);
        let u = butterfly(red_u[lid], st);
        workgroupBarrier();
        if (lane == 0u) {
            red_g[lid] = g;
            red_u[lid] = u;
        }
        workgroupBarrier();
    }
}

// Workgroup (o4, j) of ceil(width / 4) x rows, flattened over the grid: its row j, the
// row's expert among this dispatch's weights (NO_EXPERT: none to compute here), and this
// invocation's output o (4 a workgroup, a team of TEAM each) and lane in its team.
struct Cell {
    j: u32,
    e: u32,
    o: u32,
    lane: u32,
}

fn cell(wid: vec3<u32>, nwg: vec3<u32>, lid: u32, width: u32) -> Cell {
    let quads = (width + 3u) / 4u;
    let flat = wid.x + wid.y * nwg.x;
    let j = flat / quads;
    var e = NO_EXPERT;
    if (j < prm.tokens * prm.top_k) {
        e = part_expert(j, lid);
    }
    return Cell(j, e, (flat % quads) * 4u + lid / TEAM, lid % TEAM);
}

// act: ceil(H / 4) x rows workgroups; act[j][o] = silu(gate_e[o] . x_t) * up_e[o] . x_t
@compute @workgroup_size(256)
fn act(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
       lanes: Lanes) {
    let lid = lane_id(lanes);
    let h = prm.inter;
    let d = prm.hidden;
    let c = cell(wid, nwg, lid, h);
    if (c.e == NO_EXPERT) {
        return;
    }
    let e = c.e;
    let o = c.o;
    let lane = c.lane;
    let xb = row_token(c.j) * d;
    var g = 0.0;
    var u = 0.0;
    if (o < h) {
        // gate (k = 0) then up (k = 1): separate matrices, or one with up's rows after
        // gate's; one copy of the product in a loop (a smaller kernel, the same sums)
        let sep = prm.separate != 0u;
        for (var k = 0u; k < 2u; k = k + 1u) {
            let up = k == 1u && sep;
            let row = select(e * 2u * h + k * h + o, e * h + o, sep);
            let v = stream(select(prm.gate_w, prm.up_w, up), select(prm.gate_s, prm.up_s, up),
                           select(prm.gate_b, prm.up_b, up), row, d, 0u, xb, lane);
            if (k == 0u) {
                g = v;
            } else {
                u = v;
            }
        }
    }
    red_g[lid] = g;
    red_u[lid] = u;
    reduce_teams(lane, lid);
    // the workgroup's 4 outputs (teams 0 .. 3, their sums at lane 0) in one write
    if (lid == 0u) {
        let v = vec4<f32>(silu(red_g[0u]) * red_u[0u], silu(red_g[TEAM]) * red_u[TEAM],
                          silu(red_g[2u * TEAM]) * red_u[2u * TEAM],
                          silu(red_g[3u * TEAM]) * red_u[3u * TEAM]);
        put_act4(prm.w_act + c.j * h + o, v, min(4u, h - o));
    }
}

// down: ceil(D / 4) x rows workgroups; out[j][o] = down_e[o] . act[j]
@compute @workgroup_size(256)
fn down(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        lanes: Lanes) {
    let lid = lane_id(lanes);
    let h = prm.inter;
    let d = prm.hidden;
    let c = cell(wid, nwg, lid, d);
    if (c.e == NO_EXPERT) {
        return;
    }
    var v = 0.0;
    if (c.o < d) {
        v = stream(prm.down_w, prm.down_s, prm.down_b, c.e * d + c.o, h, 1u, prm.w_act + c.j * h,
                   c.lane);
    }
    red_g[lid] = v;
    red_u[lid] = 0.0;
    reduce_teams(c.lane, lid);
    if (c.lane == 0u && c.o < d) {
        work[prm.w_out + c.j * d + c.o] = bitcast<u32>(red_g[lid]);
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
    if (prm.accumulate != 0u) {
        ys[n * d + o] = ys[n * d + o] + y;
    } else {
        ys[n * d + o] = y;
    }
}

// down and combine in one dispatch (a layer in one part): ceil(D / 4) x N workgroups,
// workgroup (o4, n) computing outputs o of token n: each of its k rows' down product
// (the same stream and tree as `down`), then y = sum_s w[n, s] out_s in slot order (as
// `combine`): the same bits as the two dispatches.
@compute @workgroup_size(256)
fn down_combine(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
                lanes: Lanes) {
    let lid = lane_id(lanes);
    let h = prm.inter;
    let d = prm.hidden;
    let quads = (d + 3u) / 4u;
    let flat = wid.x + wid.y * nwg.x;
    let n = flat / quads;
    let o4 = flat % quads;
    if (n >= prm.tokens) {
        return;
    }
    let team = lid / TEAM;
    let lane = lid % TEAM;
    let o = o4 * 4u + team;
    var y = 0.0;
    // the token's choices 8 at a time: their rows and experts looked up at once, their
    // products streamed together (no barrier between them), one reduction for all
    for (var s0 = 0u; s0 < prm.top_k; s0 = s0 + 8u) {
        let nv = min(8u, prm.top_k - s0);
        if (lid < nv) {
            let p = n * prm.top_k + s0 + lid;
            var j = p;
            if (prm.sorted != 0u) {
                j = work[prm.w_inv + p];
            }
            dc_j[lid] = j;
            dc_e[lid] = local_expert(row_expert(j));
            dc_w[lid] = bitcast<f32>(work[prm.w_wt + p]);
        }
        workgroupBarrier();
        // (a loop over the choices, not eight inlined copies of the product: the same
        // sums, a smaller kernel; see tile.wgsl's rows_dot)
        var parts = V8(vec4<f32>(0.0), vec4<f32>(0.0));
        for (var s = 0u; s < nv; s = s + 1u) {
            parts = v8_set(parts, s, down_part(s, nv, o, lane));
        }
        put_red8(lid, parts);
        reduce_red8(lane, lid, nv);
        for (var s = 0u; s < nv; s = s + 1u) {
            y = y + fp(dc_w[s] * red[team * TEAM * 8u + s]);
        }
        workgroupBarrier();
    }
    if (lane == 0u && o < d) {
        if (prm.accumulate != 0u) {
            ys[n * d + o] = ys[n * d + o] + y;
        } else {
            ys[n * d + o] = y;
        }
    }
}

// down_combine's rows, experts (among this dispatch's weights, or NO_EXPERT) and
// weights of the token's choices s0 .. s0 + 7
var<workgroup> dc_j: array<u32, 8>;
var<workgroup> dc_e: array<u32, 8>;
var<workgroup> dc_w: array<f32, 8>;

// This invocation's share of choice s0 + s's down product for output o (0 for s past
// the nv looked up, or an expert not in this dispatch's weights).
fn down_part(s: u32, nv: u32, o: u32, lane: u32) -> f32 {
    let e = dc_e[s];
    if (s >= nv || o >= prm.hidden || e == NO_EXPERT) {
        return 0.0;
    }
    let j = dc_j[s];
    return stream(prm.down_w, prm.down_s, prm.down_b, e * prm.hidden + o, prm.inter, 1u,
                  prm.w_act + j * prm.inter, lane);
}

// ---------------------------------------------------------------------------------
// Sorted calls: the grouped products as tiles (tile.wgsl) of 32 rows of one expert (the
// plan's rows offsets[e] .., in order) by 8 weight rows, so an expert's weights are read
// once per 32 of its rows rather than once per row. Each output's sum has the order of
// `act` and `down` (the same bits). The grid holds the most tiles any routing of the
// call's rows among this part's experts makes ((rows + 31 min(experts, rows)) / 32,
// moe.rs's `max_tiles`); a workgroup past the routing's tiles returns.

var<workgroup> tile_at: vec3<u32>;

// Tile `t` of this dispatch's experts: (its expert among the part's, its first row in the
// plan, its rows), or NO_EXPERT first; from the table `place` wrote (three reads).
// Uniform across the workgroup.
fn tile_rows(t: u32, lid: u32) -> vec3<u32> {
    if (lid == 0u) {
        var at = vec3<u32>(NO_EXPERT, 0u, 0u);
        let g = work[prm.w_tb + prm.e_lo] + t;
        if (g < work[prm.w_tb + prm.e_hi]) {
            let info = work[prm.w_tiles + 2u * g + 1u];
            at = vec3<u32>((info >> 8u) - prm.e_lo, work[prm.w_tiles + 2u * g], info & 0xffu);
        }
        tile_at = at;
    }
    return workgroupUniformLoad(&tile_at);
}

// Expert e's gate row (or `up` row) of output 4q + i (the last output past H).
fn act_row(e: u32, q: u32, i: u32, up: bool, rw: u32, gpr: u32) -> WRow {
    let h = prm.inter;
    let o = min(q * 4u + i, h - 1u);
    if (prm.separate != 0u) {
        if (up) {
            return wrow(prm.up_w, prm.up_s, prm.up_b, e * h + o, rw, gpr);
        }
        return wrow(prm.gate_w, prm.gate_s, prm.gate_b, e * h + o, rw, gpr);
    }
    return wrow(prm.gate_w, prm.gate_s, prm.gate_b, e * 2u * h + o + select(0u, h, up), rw, gpr);
}

// act_tiled: ceil(H / 4) x tiles workgroups; 4 outputs' gate rows and up rows a tile,
// act[j][o] = silu(gate_e[o] . x_t) * up_e[o] . x_t
@compute @workgroup_size(256)
fn act_tiled(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
             lanes: Lanes) {
    let lid = lane_id(lanes);
    let h = prm.inter;
    let d = prm.hidden;
    let quads = (h + 3u) / 4u;
    let flat = wid.x + wid.y * nwg.x;
    let q = flat % quads;
    let at = tile_rows(flat / quads, lid);
    if (at.x == NO_EXPERT) {
        return;
    }
    let e = at.x;
    let rw = row_words(d);
    let gpr = d / GROUP;
    let t = TileW(act_row(e, q, 0u, false, rw, gpr), act_row(e, q, 1u, false, rw, gpr),
                  act_row(e, q, 2u, false, rw, gpr), act_row(e, q, 3u, false, rw, gpr),
                  act_row(e, q, 0u, true, rw, gpr), act_row(e, q, 1u, true, rw, gpr),
                  act_row(e, q, 2u, true, rw, gpr), act_row(e, q, 3u, true, rw, gpr));
    let r = lid / 8u;
    let live = r < at.z;
    var xb = 0u;
    if (live) {
        xb = row_token(at.y + r) * d;
    }
    tile_products(t, rw / 4u, d, 0u, xb, lid, live);
    // call row r's 4 outputs (gate i at tile_out[i * 32 + r], up i at [(4 + i) * 32 + r])
    // in one write
    if (lid < 32u && lid < at.z) {
        let r = lid;
        let o = q * 4u;
        let v = vec4<f32>(silu(tile_out[r]) * tile_out[128u + r],
                          silu(tile_out[32u + r]) * tile_out[160u + r],
                          silu(tile_out[64u + r]) * tile_out[192u + r],
                          silu(tile_out[96u + r]) * tile_out[224u + r]);
        put_act4(prm.w_act + (at.y + r) * h + o, v, min(4u, h - o));
    }
}

// Expert e's down row of output 8q + i (the last output past D).
fn down_row(e: u32, q: u32, i: u32, rw: u32, gpr: u32) -> WRow {
    let d = prm.hidden;
    return wrow(prm.down_w, prm.down_s, prm.down_b, e * d + min(q * 8u + i, d - 1u), rw, gpr);
}

// down_tiled: ceil(D / 8) x tiles workgroups; out[j][o] = down_e[o] . act[j] for 8
// outputs a tile (then `combine`)
@compute @workgroup_size(256)
fn down_tiled(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
              lanes: Lanes) {
    let lid = lane_id(lanes);
    let h = prm.inter;
    let d = prm.hidden;
    let octs = (d + 7u) / 8u;
    let flat = wid.x + wid.y * nwg.x;
    let q = flat % octs;
    let at = tile_rows(flat / octs, lid);
    if (at.x == NO_EXPERT) {
        return;
    }
    let rw = row_words(h);
    let gpr = h / GROUP;
    let t = TileW(down_row(at.x, q, 0u, rw, gpr), down_row(at.x, q, 1u, rw, gpr),
                  down_row(at.x, q, 2u, rw, gpr), down_row(at.x, q, 3u, rw, gpr),
                  down_row(at.x, q, 4u, rw, gpr), down_row(at.x, q, 5u, rw, gpr),
                  down_row(at.x, q, 6u, rw, gpr), down_row(at.x, q, 7u, rw, gpr));
    let row = lid / 8u;
    tile_products(t, rw / 4u, h, 1u, prm.w_act + (at.y + row) * h, lid, row < at.z);
    let i = lid / 32u;
    let r = lid % 32u;
    let o = q * 8u + i;
    if (o < d && r < at.z) {
        work[prm.w_out + (at.y + r) * d + o] = bitcast<u32>(tile_out[i * 32u + r]);
    }
}
