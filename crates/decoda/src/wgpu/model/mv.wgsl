// The model's matrix products (every projection, the router, the dense MLPs, the LM
// head): dst[r][out_off + o] (=|+=) W[o] . src[r], or for SwiGLU
// silu(W[o] . src[r]) * W[rows + o] . src[r]. The launcher (model/plan.rs) prefixes
// `DTYPE` and `BITS` (one module per weight format: no format branch in the loop) and
// the `Op` block (op.wgsl).
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
// zero. Affine weights: each chunk lies in one group (groups hold 32, 64 or 128 inputs;
// a chunk 32 or 16), so a chunk adds scale * sum(q x) + bias * sum(x).

const TEAM: u32 = 64u;
const OUT_PER_WG: u32 = 4u;
const CHUNK: u32 = 8u;

@group(0) @binding(0) var<uniform> op: Op;
@group(0) @binding(1) var<storage, read> wts: array<vec4<u32>>;
@group(0) @binding(3) var<storage, read> src: array<f32>;
@group(0) @binding(4) var<storage, read_write> dst: array<f32>;
// q, k and v in one product (`kind` 3): rows past q's go to k_out, then v_out
@group(0) @binding(6) var<storage, read_write> k_out: array<f32>;
@group(0) @binding(7) var<storage, read_write> v_out: array<f32>;

// partial sums: [team lane][call row of the chunk]
var<workgroup> red: array<f32, 2048>;
// SwiGLU: each output's gate values while the up values are reduced
var<workgroup> gates: array<f32, 32>;

// Word `i` of the weights buffer.
fn word(i: u32) -> u32 {
    return wts[i >> 2u][i & 3u];
}

// Inputs per vec4<u32> of weights.
fn per_chunk() -> u32 {
    if (DTYPE == 0u) {
        return 4u;
    }
    if (DTYPE <= 2u) {
        return 8u;
    }
    return 128u / BITS;
}

// Input i of call row r (0 past the row's inputs).
fn xin(r: u32, i: u32) -> f32 {
    let v = src[(op.src_row0 + r) * op.src_w + min(i, op.in_w - 1u)];
    return select(0.0, v, i < op.in_w);
}

// An IEEE half's bits as f32, exactly (written out: unpack2x16float needs a capability
// some backends lack).
fn f16_of(h: u32) -> f32 {
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

// Chunk `w` of a weight row (its first input `i0`) against call row r.
fn chunk_dot(w: vec4<u32>, i0: u32, r: u32, sc: f32, bi: f32) -> f32 {
    var acc = 0.0;
    if (DTYPE == 0u) {
        for (var k = 0u; k < 4u; k = k + 1u) {
            acc = acc + bitcast<f32>(w[k]) * xin(r, i0 + k);
        }
        return acc;
    }
    if (DTYPE == 1u) {
        for (var k = 0u; k < 4u; k = k + 1u) {
            let i = i0 + 2u * k;
            acc = acc + bitcast<f32>(w[k] << 16u) * xin(r, i);
            acc = acc + bitcast<f32>(w[k] & 0xffff0000u) * xin(r, i + 1u);
        }
        return acc;
    }
    if (DTYPE == 2u) {
        for (var k = 0u; k < 4u; k = k + 1u) {
            let i = i0 + 2u * k;
            acc = acc + f16_of(w[k] & 0xffffu) * xin(r, i);
            acc = acc + f16_of(w[k] >> 16u) * xin(r, i + 1u);
        }
        return acc;
    }
    // affine: codes from the low bits up
    let per = 32u / BITS;
    let mask = (1u << BITS) - 1u;
    var qx = 0.0;
    var sx = 0.0;
    for (var k = 0u; k < 4u; k = k + 1u) {
        for (var j = 0u; j < per; j = j + 1u) {
            let x = xin(r, i0 + k * per + j);
            qx = qx + f32((w[k] >> (BITS * j)) & mask) * x;
            sx = sx + x;
        }
    }
    return sc * qx + bi * sx;
}

// This invocation's share of W[row] . src[r0 + j] for j < nr, into red[lid][j].
fn stream_row(row: u32, valid: bool, r0: u32, nr: u32, lane: u32, lid: u32) {
    var acc: array<f32, 8>;
    for (var j = 0u; j < CHUNK; j = j + 1u) {
        acc[j] = 0.0;
    }
    if (valid) {
        let chunks = op.row_words / 4u;
        let base = (op.w_off + row * op.row_words) / 4u;
        let gpr = op.in_w / op.group;
        for (var c = lane; c < chunks; c = c + TEAM) {
            let w = wts[base + c];
            let i0 = c * per_chunk();
            var sc = 0.0;
            var bi = 0.0;
            if (DTYPE == 3u) {
                let g = row * gpr + i0 / op.group;
                sc = bitcast<f32>(word(op.s_off + g));
                bi = bitcast<f32>(word(op.b_off + g));
            }
            for (var j = 0u; j < CHUNK; j = j + 1u) {
                if (j < nr) {
                    acc[j] = acc[j] + chunk_dot(w, i0, r0 + j, sc, bi);
                }
            }
        }
    }
    for (var j = 0u; j < CHUNK; j = j + 1u) {
        red[lid * CHUNK + j] = acc[j];
    }
}

// Sums each team's 64 partial sums (of every call row of the chunk) into its lane 0.
fn reduce_teams(lane: u32, lid: u32) {
    workgroupBarrier();
    for (var s = TEAM / 2u; s > 0u; s = s >> 1u) {
        if (lane < s) {
            for (var j = 0u; j < CHUNK; j = j + 1u) {
                red[lid * CHUNK + j] = red[lid * CHUNK + j] + red[(lid + s) * CHUNK + j];
            }
        }
        workgroupBarrier();
    }
}

fn silu(g: f32) -> f32 {
    return g / (1.0 + exp(-g));
}

fn mv_body(wid: vec3<u32>, nwg: vec3<u32>, lid: u32, pair: bool) {
    let team = lid / TEAM;
    let lane = lid % TEAM;
    let o = (wid.x + wid.y * nwg.x) * OUT_PER_WG + team;
    let valid = o < op.out_w;
    let head = team * TEAM * CHUNK;
    for (var r0 = 0u; r0 < op.rows; r0 = r0 + CHUNK) {
        let nr = min(CHUNK, op.rows - r0);
        stream_row(o, valid, r0, nr, lane, lid);
        reduce_teams(lane, lid);
        if (pair) {
            if (lane < nr) {
                gates[team * CHUNK + lane] = red[head + lane];
            }
            workgroupBarrier();
            stream_row(o + op.out_w, valid, r0, nr, lane, lid);
            reduce_teams(lane, lid);
        }
        if (valid && lane < nr) {
            let r = op.dst_row0 + r0 + lane;
            let at = r * op.dst_w + op.out_off + o;
            let v = red[head + lane];
            if (pair) {
                dst[at] = silu(gates[team * CHUNK + lane]) * v;
            } else if (op.kind == 1u) {
                dst[at] = dst[at] + v;
            } else if (op.kind == 3u) {
                // q, k and v: the row of the stacked matrix says which
                let g = op.out_off + o;
                let qw = op.heads * op.head_dim;
                let kvw = op.kv_heads * op.head_dim;
                if (g < qw) {
                    dst[r * qw + g] = v;
                } else if (g < qw + kvw) {
                    k_out[r * kvw + g - qw] = v;
                } else {
                    v_out[r * kvw + g - qw - kvw] = v;
                }
            } else {
                dst[at] = v;
            }
        }
        workgroupBarrier();
    }
}

@compute @workgroup_size(256)
fn mv(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
      @builtin(local_invocation_index) lid: u32) {
    mv_body(wid, nwg, lid, false);
}

@compute @workgroup_size(256)
fn mv_swiglu(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
             @builtin(local_invocation_index) lid: u32) {
    mv_body(wid, nwg, lid, true);
}
