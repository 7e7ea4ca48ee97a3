// The model's matrix products (every projection, the router, the dense MLPs, the LM
// head): dst[r][out_off + o] (=|+=) W[o] . src[r], or for SwiGLU
// silu(W[o] . src[r]) * W[rows + o] . src[r]. The launcher (model/plan.rs) prefixes
// `DTYPE`, `BITS` and `GROUP` (one module per weight format: no format branch in the
// loop) and the `Op` block (op.wgsl), and appends the inputs' loads (mv_x4.wgsl or
// mv_x1.wgsl).
//
// A workgroup of 256 invocations computes 4 output rows, a team of 64 per row. Each
// invocation streams its share of the weight row as vec4<u32> loads (4 f32, 8 16-bit
// values, 32 4-bit or 16 8-bit codes each): chunks lane, lane + 64, ... of the row, and
// multiplies each chunk with up to 8 rows of the call held in registers, so the weights
// are read once per 8 rows. The 64 partial sums of a row are added once at the end, by
// a fixed tree. A row's result depends only on its weights and its input: the same bits
// whatever the call's other rows (prefill or decode, alone or in a batch).
//
// Rows are padded to whole vec4<u32> (upload, weights.rs); inputs past `in_w` count as
// zero. A chunk's arithmetic is chunk.wgsl's, shared with the MoE layer.
//
// `mv_norm` and `mv_swiglu_norm` take the RMS norm before the product into it: each
// workgroup computes a call row's 1 / rms as the `rms` kernel does (64 lanes, the same
// strided sum and tree), and reads its inputs as fp(x * inv) * w, `rms`'s output bits;
// workgroup 0 also writes the normed rows to `normed` (binding 6) for the ops after it
// (the MoE layer's experts read them after the router).

const TEAM: u32 = 64u;
const OUT_PER_WG: u32 = 4u;
const CHUNK: u32 = 8u;

@group(0) @binding(0) var<uniform> op: Op;
@group(0) @binding(1) var<storage, read> wts: array<vec4<u32>>;
// the norm's weights (at word aux_off), for the _norm entry points
@group(0) @binding(2) var<storage, read> aux: array<u32>;
// (binding 3, `src`, the call's inputs: declared with `srcf` and `xin4` by mv_x1.wgsl
// or mv_x4.wgsl)
@group(0) @binding(4) var<storage, read_write> dst: array<f32>;
// q, k and v in one product (`kind` 3): rows past q's go to k_out, then v into the
// layer's value cache at the row's slot and position (the row map in ctl)
@group(0) @binding(5) var<storage, read_write> ctl: array<u32>;
@group(0) @binding(6) var<storage, read_write> k_out: array<f32>;
@group(0) @binding(7) var<storage, read_write> v_cache: array<f32>;

// (partial sums: `red` of tile.wgsl, [team lane][call row of the chunk])
// SwiGLU: each output's gate values while the up values are reduced
var<workgroup> gates: array<f32, 32>;
// the _norm entry points: 1 / rms of each call row of the chunk
var<workgroup> invs: array<f32, 8>;

// `sel` of the inputs that are not normed
const RAW: u32 = 0xffffffffu;

fn fp(x: f32) -> f32 {
    return bitcast<f32>(bitcast<u32>(x) ^ op.zero);
}

fn fp4(x: vec4<f32>) -> vec4<f32> {
    return bitcast<vec4<f32>>(bitcast<vec4<u32>>(x) ^ vec4<u32>(op.zero));
}

// Word `i` of the weights buffer.
fn word(i: u32) -> u32 {
    return wts[i >> 2u][i & 3u];
}

// (tile.wgsl's accessors)
fn wword(i: u32) -> u32 {
    return word(i);
}

fn wvec(i: u32) -> vec4<u32> {
    return wts[i];
}

fn wgroup() -> u32 {
    return GROUP;
}

// Input i of the call row at `base` of src (0 past its `n` inputs), normed as the `rms`
// kernel writes it unless `sel` is RAW (else the row's index in the chunk).
fn xin(sel: u32, base: u32, i: u32, n: u32) -> f32 {
    let k = min(i, n - 1u);
    let v = srcf(base + k);
    // (no branch: `sel` is RAW in every call of the entry points that do not norm, so
    // the normed value folds away there, and is always taken in those that do)
    let normed = fp(v * invs[min(sel, 7u)]) * bitcast<f32>(aux[op.aux_off + k]);
    return select(0.0, select(normed, v, sel == RAW), i < n);
}

// The _norm entry points: invs[j] for the chunk's call rows j < nr (team t: rows t and
// t + 4), each as `rms` computes it (the same strided sums and the same tree, both rows'
// sums in one pass of reduce_red8's levels); workgroup 0 writes the normed rows to
// `normed`.
fn norm_rows(r0: u32, nr: u32, team: u32, lane: u32, lid: u32, first: bool) {
    var ss = vec2<f32>(0.0);
    for (var k = 0u; k < 2u; k = k + 1u) {
        let j = team + 4u * k;
        if (j < nr) {
            let xb = (op.src_row0 + r0 + j) * op.src_w;
            var s = 0.0;
            for (var i = lane; i < op.in_w; i = i + TEAM) {
                let x = srcf(xb + i);
                s = s + x * x;
            }
            ss[k] = s;
        }
    }
    red[lid * 8u] = ss.x;
    red[lid * 8u + 1u] = ss.y;
    reduce_red8_from(TEAM / 2u, lane, lid, 2u);
    if (lane < 2u) {
        let j = team + 4u * lane;
        if (j < nr) {
            invs[j] = 1.0 / sqrt(red[team * TEAM * 8u + lane] / f32(op.in_w) + op.eps);
        }
    }
    workgroupBarrier();
    // (q, k and v write k_out: their normed input is not needed after them)
    if (first && op.kind != 3u) {
        for (var j = 0u; j < nr; j = j + 1u) {
            let xb = (op.src_row0 + r0 + j) * op.src_w;
            let nb = (op.dst_row0 + r0 + j) * op.in_w;
            for (var i = lid; i < op.in_w; i = i + 256u) {
                k_out[nb + i] = xin(j, xb, i, op.in_w);
            }
        }
    }
}

// This invocation's share of W[row] . src[r0 + j] for j < nr, into red[lid][j] (the
// inputs normed when `norm`). The 8 sums are named registers (no array indexed at run
// time: see chunk.wgsl).
fn stream_row(row: u32, valid: bool, r0: u32, nr: u32, lane: u32, lid: u32, norm: bool) {
    var acc = V8(vec4<f32>(0.0), vec4<f32>(0.0));
    if (valid) {
        let chunks = op.row_words / 4u;
        let base = (op.w_off + row * op.row_words) / 4u;
        let gpr = op.in_w / GROUP;
        let x0 = (op.src_row0 + r0) * op.src_w;
        for (var c = lane; c < chunks; c = c + TEAM) {
            let i0 = c * per_chunk();
            var sc = 0.0;
            var bi = 0.0;
            if (DTYPE == 3u) {
                let g = row * gpr + i0 / GROUP;
                sc = bitcast<f32>(word(op.s_off + g));
                bi = bitcast<f32>(word(op.b_off + g));
            }
            let d = rows_dot(wts[base + c], i0, sc, bi, op.in_w, RAW, norm, x0, op.src_w, nr);
            acc = v8_add(acc, d);
        }
    }
    put_red8(lid, acc);
}

fn silu(g: f32) -> f32 {
    return g / (1.0 + exp(-g));
}

fn mv_body(wid: vec3<u32>, nwg: vec3<u32>, lid: u32, pair: bool, norm: bool) {
    let team = lid / TEAM;
    let lane = lid % TEAM;
    let o = (wid.x + wid.y * nwg.x) * OUT_PER_WG + team;
    let valid = o < op.out_w;
    let head = team * TEAM * CHUNK;
    for (var r0 = 0u; r0 < op.rows; r0 = r0 + CHUNK) {
        let nr = min(CHUNK, op.rows - r0);
        if (norm) {
            norm_rows(r0, nr, team, lane, lid, wid.x == 0u && wid.y == 0u);
        }
        stream_row(o, valid, r0, nr, lane, lid, norm);
        reduce_red8(lane, lid, nr);
        if (pair) {
            if (lane < nr) {
                gates[team * CHUNK + lane] = red[head + lane];
            }
            workgroupBarrier();
            stream_row(o + op.out_w, valid, r0, nr, lane, lid, norm);
            reduce_red8(lane, lid, nr);
        }
        if (valid && lane < nr) {
            var v = red[head + lane];
            if (pair) {
                v = silu(gates[team * CHUNK + lane]) * v;
            }
            put(r0 + lane, o, v);
        }
        workgroupBarrier();
    }
}

// Output o of call row r (of the op's rows): written, added (`kind` 1), or for q, k and
// v (`kind` 3) sent where the row of the stacked matrix says.
fn put(row: u32, o: u32, v: f32) {
    let r = op.dst_row0 + row;
    let at = r * op.dst_w + op.out_off + o;
    if (op.kind == 1u) {
        dst[at] = dst[at] + v;
    } else if (op.kind == 3u) {
        let g = op.out_off + o;
        let qw = op.heads * op.head_dim;
        let kvw = op.kv_heads * op.head_dim;
        if (g < qw) {
            dst[r * qw + g] = v;
        } else if (g < qw + kvw) {
            k_out[r * kvw + g - qw] = v;
        } else {
            let slot = ctl[op.map_off + 4u * r];
            let pos = ctl[slot] + ctl[op.map_off + 4u * r + 1u];
            v_cache[(slot * op.max_pos + pos) * kvw + g - qw - kvw] = v;
        }
    } else {
        dst[at] = v;
    }
}

// Weight row i of the tile at output o0: outputs o0 .. o0 + 7, or (SwiGLU) the gate rows
// of outputs o0 .. o0 + 3 then their up rows.
fn mm_row(o0: u32, i: u32, pair: bool, gpr: u32) -> WRow {
    var row = min(o0 + i, op.out_w - 1u);
    if (pair) {
        row = min(o0 + i % 4u, op.out_w - 1u) + select(0u, op.out_w, i >= 4u);
    }
    return wrow(op.w_off, op.s_off, op.b_off, row, op.row_words, gpr);
}

// The tiled products (tile.wgsl) for calls of many rows (prefill): workgroup (u, t) of
// ceil(out_w / 8) x ceil(rows / 32) (SwiGLU: 4 outputs' gate and up rows a tile)
// computes outputs 8u .. of call rows 32t .., each in the order `mv` sums it (the same
// bits). The inputs are not normed here: a norm before a tiled product runs as `rms`.
fn mm_body(wid: vec3<u32>, nwg: vec3<u32>, lid: u32, pair: bool) {
    let per = select(8u, 4u, pair);
    let tiles_o = (op.out_w + per - 1u) / per;
    let flat = wid.x + wid.y * nwg.x;
    let o0 = (flat % tiles_o) * per;
    let r0 = (flat / tiles_o) * 32u;
    if (r0 >= op.rows) {
        return;
    }
    let gpr = op.in_w / GROUP;
    let t = TileW(mm_row(o0, 0u, pair, gpr), mm_row(o0, 1u, pair, gpr),
                  mm_row(o0, 2u, pair, gpr), mm_row(o0, 3u, pair, gpr),
                  mm_row(o0, 4u, pair, gpr), mm_row(o0, 5u, pair, gpr),
                  mm_row(o0, 6u, pair, gpr), mm_row(o0, 7u, pair, gpr));
    let r = r0 + lid / 8u;
    let live = r < op.rows;
    let xb = (op.src_row0 + min(r, op.rows - 1u)) * op.src_w;
    tile_products(t, op.row_words / 4u, op.in_w, RAW, xb, lid, live);
    let i = lid / 32u;
    let rr = r0 + lid % 32u;
    if (i < per && o0 + i < op.out_w && rr < op.rows) {
        var v = tile_out[lid];
        if (pair) {
            v = silu(v) * tile_out[lid + 128u];
        }
        put(rr, o0 + i, v);
    }
}

@compute @workgroup_size(256)
fn mv(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
      lanes: Lanes) {
    mv_body(wid, nwg, lane_id(lanes), false, false);
}

@compute @workgroup_size(256)
fn mv_swiglu(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
             lanes: Lanes) {
    mv_body(wid, nwg, lane_id(lanes), true, false);
}

@compute @workgroup_size(256)
fn mv_norm(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
           lanes: Lanes) {
    mv_body(wid, nwg, lane_id(lanes), false, true);
}

@compute @workgroup_size(256)
fn mv_swiglu_norm(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
                  lanes: Lanes) {
    mv_body(wid, nwg, lane_id(lanes), true, true);
}

@compute @workgroup_size(256)
fn mm(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
      lanes: Lanes) {
    mm_body(wid, nwg, lane_id(lanes), false);
}

@compute @workgroup_size(256)
fn mm_swiglu(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
             lanes: Lanes) {
    mm_body(wid, nwg, lane_id(lanes), true);
}

// The LM head's shape (matrices of many rows, no norm, written as they are): 32 output
// rows a workgroup (wide_products, tile.wgsl), for each chunk of 8 call rows; the same
// order, so the same bits, as `mv`.
@compute @workgroup_size(256)
fn mv_wide(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
           lanes: Lanes) {
    let lid = lane_id(lanes);
    let o0 = (wid.x + wid.y * nwg.x) * 32u;
    if (o0 >= op.out_w) {
        return;
    }
    let o = min(o0 + lid / 8u, op.out_w - 1u);
    let gpr = op.in_w / GROUP;
    let t = wrow(op.w_off, op.s_off, op.b_off, o, op.row_words, gpr);
    for (var r0 = 0u; r0 < op.rows; r0 = r0 + CHUNK) {
        let nr = min(CHUNK, op.rows - r0);
        wide_products(t, op.row_words / 4u, op.in_w, RAW, (op.src_row0 + r0) * op.src_w, op.src_w,
                      nr, lid, true);
        // output o0 + lid / 8's call row lid % 8
        let oo = o0 + lid / 8u;
        let j = lid % 8u;
        if (oo < op.out_w && j < nr) {
            put(r0 + j, oo, tile_out[lid]);
        }
        workgroupBarrier();
    }
}
