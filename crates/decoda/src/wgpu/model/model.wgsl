// The model's ops on the device (crate::model::qwen3_moe::Ops; the launcher is model.rs).
// Each dispatch runs over the rows of one call. A row's slot, its offset in its segment,
// where its token comes from and whether it ends its segment are in `ctl` (the row map,
// written when the batch changes); each slot's position (tokens in its cache) is in
// `ctl[0 .. slots]`, advanced on the device at the end of the call, so a decode step
// needs nothing from the host.
//
//   embed      (rows)              x[r] = embedding row of token aux[src(r)] (of this part)
//   rms        (rows * groups)     dst[r] = src[r] * w / sqrt(mean(src[r]^2) + eps), per group
//   (the matrix products are mv.wgsl: one module per weight format)
//   norm_rope  (rows * heads)      per head: q (dst, in place) and k (src) normed and rotated,
//                                  k and v (scr) into the cache
//   attend_part (chunks reached, heads, rows)  per chunk of 64 positions up to the call's
//                                  furthest row and query head: max score, sum of exp,
//                                  weighted values
//   attend_merge (rows * heads)    a[r][h] = softmax(q . k_t * scale) . v_t over t <= pos(r),
//                                  from the chunks
//   add        (rows * width / 256) dst += src
//   advance    (1)                 pos[slot] += the segment's rows
//
// Matrices are read in their own format and dequantized in registers: f32 words, two
// 16-bit values per word (rows padded to whole words), or MLX affine words (`32 / bits`
// codes from the low bits up, `w = scale * q + bias` per group of the row).

// (the `Op` block is op.wgsl, prefixed by the launcher)

// flags word of a row: bit 0 = the row ends its segment
const ROW_LAST: u32 = 1u;
const WG: u32 = 64u;

@group(0) @binding(0) var<uniform> op: Op;
@group(0) @binding(1) var<storage, read> wts: array<u32>;
@group(0) @binding(2) var<storage, read> aux: array<u32>;
@group(0) @binding(3) var<storage, read> src: array<f32>;
@group(0) @binding(4) var<storage, read_write> dst: array<f32>;
@group(0) @binding(5) var<storage, read_write> ctl: array<u32>;
@group(0) @binding(6) var<storage, read_write> kc: array<f32>;
@group(0) @binding(7) var<storage, read_write> vc: array<f32>;
@group(0) @binding(8) var<storage, read_write> scr: array<f32>;

var<workgroup> red1: array<f32, 64>;

fn opaque_zero() -> u32 {
    return op.zero;
}

fn row_slot(r: u32) -> u32 {
    return ctl[op.map_off + 4u * r];
}

fn row_pos(r: u32) -> u32 {
    return ctl[row_slot(r)] + ctl[op.map_off + 4u * r + 1u];
}

fn flat_id(wid: vec3<u32>, nwg: vec3<u32>) -> u32 {
    return wid.x + wid.y * nwg.x;
}

fn half_bits(h: u32) -> f32 {
    if (op.dtype == 1u) {
        return bitcast<f32>(h << 16u);
    }
    return f16_of(h);
}

// Element i of matrix row `row`.
fn elem(row: u32, i: u32) -> f32 {
    let base = op.w_off + row * op.row_words;
    if (op.dtype == 0u) {
        return bitcast<f32>(wts[base + i]);
    }
    if (op.dtype <= 2u) {
        let word = wts[base + i / 2u];
        return half_bits((word >> (16u * (i & 1u))) & 0xffffu);
    }
    let per = 32u / op.bits;
    let word = wts[base + i / per];
    let q = f32((word >> (op.bits * (i % per))) & ((1u << op.bits) - 1u));
    let g = row * (op.in_w / op.group) + i / op.group;
    return fp(bitcast<f32>(wts[op.s_off + g]) * q) + bitcast<f32>(wts[op.b_off + g]);
}

// ---------------------------------------------------------------------------------

@compute @workgroup_size(64)
fn embed(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
         @builtin(local_invocation_index) lid: u32) {
    let r = flat_id(wid, nwg);
    if (r >= op.rows) {
        return;
    }
    let tok = aux[ctl[op.map_off + 4u * r + 2u]];
    // an embedding in parts: this dispatch holds tokens out_off .. out_off + out_w
    if (tok < op.out_off || tok - op.out_off >= op.out_w) {
        return;
    }
    for (var i = lid; i < op.in_w; i = i + WG) {
        dst[r * op.dst_w + i] = elem(tok - op.out_off, i);
    }
}

// ---------------------------------------------------------------------------------

fn reduce1(lid: u32) -> f32 {
    workgroupBarrier();
    for (var s = 32u; s > 0u; s = s >> 1u) {
        if (lid < s) {
            red1[lid] = red1[lid] + red1[lid + s];
        }
        workgroupBarrier();
    }
    let v = red1[0];
    workgroupBarrier();
    return v;
}

// The RMS scale 1 / sqrt(mean(x^2) + eps) of the `w` values at `at` of dst (`buf` 0) or
// src (1): one strided sum and one tree, for `rms` and `norm_rope` alike, so a value is
// the same bits whichever kernel normed it.
fn norm_inv(buf: u32, at: u32, w: u32, lid: u32) -> f32 {
    var ss = 0.0;
    for (var i = lid; i < w; i = i + WG) {
        var x: f32;
        if (buf == 0u) {
            x = dst[at + i];
        } else {
            x = src[at + i];
        }
        ss = ss + x * x;
    }
    red1[lid] = ss;
    let total = reduce1(lid);
    return 1.0 / sqrt(total / f32(w) + op.eps);
}

@compute @workgroup_size(64)
fn rms(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
       @builtin(local_invocation_index) lid: u32) {
    let id = flat_id(wid, nwg);
    let r = id / op.groups;
    let g = id % op.groups;
    if (r >= op.rows) {
        return;
    }
    let w = op.in_w;
    let s0 = (op.src_row0 + r) * op.src_w + g * w;
    let d0 = (op.dst_row0 + r) * op.dst_w + g * w;
    let inv = norm_inv(select(1u, 0u, op.inplace != 0u), s0, w, lid);
    for (var i = lid; i < w; i = i + WG) {
        var x: f32;
        if (op.inplace != 0u) {
            x = dst[s0 + i];
        } else {
            x = src[s0 + i];
        }
        dst[d0 + i] = fp(x * inv) * bitcast<f32>(aux[op.aux_off + i]);
    }
}

// ---------------------------------------------------------------------------------

// Element j and j + head_dim / 2 of the head at `at` of dst (`buf` 0) or src (1), normed
// (scale `inv`, weights at word `nw` of wts) when `normed`, and rotated by the RoPE
// table's row at cos0 / sin0: norm_rope's and the fused attend_part's one formula, so
// a value is the same bits whichever kernel made it.
fn rope_pair(buf: u32, at: u32, j: u32, half: u32, inv: f32, normed: bool, nw: u32,
             cos0: u32, sin0: u32) -> vec2<f32> {
    var x0: f32;
    var x1: f32;
    if (buf == 0u) {
        x0 = dst[at + j];
        x1 = dst[at + j + half];
    } else {
        x0 = src[at + j];
        x1 = src[at + j + half];
    }
    if (normed) {
        x0 = fp(x0 * inv) * bitcast<f32>(wts[nw + j]);
        x1 = fp(x1 * inv) * bitcast<f32>(wts[nw + j + half]);
    }
    let c = bitcast<f32>(aux[cos0 + j]);
    let s = bitcast<f32>(aux[sin0 + j]);
    return vec2<f32>(fp(x0 * c) - fp(x1 * s), fp(x1 * c) + fp(x0 * s));
}

// One head of one row (rows x (heads + kv_heads) workgroups): a query head's values
// (dst) normed with the q norm (when `kind` bit 0) and rotated in place; a key/value
// head's key (src) normed with the k norm (bit 1) and rotated into the cache (the value
// went into the cache from the q/k/v product). Norm weights in `wts` at words `s_off`
// (q) and `b_off` (k), the RoPE table in `aux` at `aux_off`. A decode step runs this in
// attend_part instead (`kind` bit 2 there).
@compute @workgroup_size(64)
fn norm_rope(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
             @builtin(local_invocation_index) lid: u32) {
    let id = flat_id(wid, nwg);
    let heads = op.heads + op.kv_heads;
    let r = id / heads;
    let h = id % heads;
    if (r >= op.rows) {
        return;
    }
    let hd = op.head_dim;
    let half = hd / 2u;
    let p = row_pos(r);
    let slot = row_slot(r);
    let cos0 = op.aux_off + p * half;
    let sin0 = op.aux_off + op.max_pos * half + p * half;
    let kvw = op.kv_heads * hd;
    if (h < op.heads) {
        let at = r * op.heads * hd + h * hd;
        var inv = 1.0;
        let normed = (op.kind & 1u) != 0u;
        if (normed) {
            inv = norm_inv(0u, at, hd, lid);
        }
        for (var j = lid; j < half; j = j + WG) {
            let v = rope_pair(0u, at, j, half, inv, normed, op.s_off, cos0, sin0);
            dst[at + j] = v.x;
            dst[at + j + half] = v.y;
        }
        return;
    }
    let g = h - op.heads;
    let at = r * kvw + g * hd;
    let cbase = (slot * op.max_pos + p) * kvw + g * hd;
    var inv = 1.0;
    let normed = (op.kind & 2u) != 0u;
    if (normed) {
        inv = norm_inv(1u, at, hd, lid);
    }
    for (var j = lid; j < half; j = j + WG) {
        let v = rope_pair(1u, at, j, half, inv, normed, op.b_off, cos0, sin0);
        kc[cbase + j] = v.x;
        kc[cbase + j + half] = v.y;
    }
}

// ---------------------------------------------------------------------------------

// Decode attention split over the cache (flash decoding): `attend_part` gives each
// (row, query head, chunk of CH positions) a workgroup, which scores the chunk's keys
// against its head (the query heads of a key/value group read the same chunk, as
// neighbouring workgroups: through the cache) and leaves the chunk's max score m, its
// sum of exp(s - m) and the values weighted by those, in `scr`; `attend_merge` (a workgroup per
// row and query head) weighs the chunks by exp(m_c - M) in chunk order. Chunks start at
// position 0 whatever the call, so a row's output depends only on its query, its cache
// and its position: the same bits from a one-position step and from a prompt run in one
// forward. With one chunk (positions up to CH) the sums are the single walk's, in the
// same order.
const CH: u32 = 64u;

// scr's words for one (row, query head, chunk): m, l, then head_dim weighted values
fn part_at(r: u32, h: u32, c: u32) -> u32 {
    return ((r * op.heads + h) * op.groups + c) * (op.head_dim + 2u);
}

fn reduce_max(lid: u32) -> f32 {
    workgroupBarrier();
    for (var s = 32u; s > 0u; s = s >> 1u) {
        if (lid < s) {
            red1[lid] = max(red1[lid], red1[lid + s]);
        }
        workgroupBarrier();
    }
    let v = red1[0];
    workgroupBarrier();
    return v;
}

var<workgroup> ew: array<f32, 64>;
// attend_part: the row's position, as a uniform value; q normed and rotated (fused)
var<workgroup> wpos: u32;
var<workgroup> qs: array<f32, 256>;
// attend_part in a decode step: the row's own key, normed and rotated
var<workgroup> ks: array<f32, 256>;

// grid: (chunks, heads, rows): the chunks the call's longest row reaches (at most
// op.groups, the cache's, which lays out the partials), so a step launches no
// workgroup for the cache's unreached chunks; op.scale: the score scale, op.eps the
// norms' epsilon
@compute @workgroup_size(64)
fn attend_part(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let c = wid.x;
    let h = wid.y;
    let r = wid.z;
    if (r >= op.rows) {
        return;
    }
    if (lid == 0u) {
        wpos = row_pos(r);
    }
    let p = workgroupUniformLoad(&wpos);
    let t0 = c * CH;
    if (t0 > p) {
        return;
    }
    let hd = op.head_dim;
    let half = hd / 2u;
    let kvw = op.kv_heads * hd;
    let n = min(CH, p + 1u - t0);
    let t = t0 + lid;
    let valid = lid < n;
    let slot = row_slot(r);
    let per = op.heads / op.kv_heads;
    let g = h / per;
    let c0 = slot * op.max_pos * kvw + g * hd;
    // a decode step (`kind` bit 2): q and this row's key normed and rotated here, as
    // norm_rope would (src holds q, dst k). The chunk holding the row's position scores
    // that key from workgroup memory; the group's first head also puts it into the cache
    // (for the steps after this one: no workgroup here reads another's write)
    let fused = (op.kind & 4u) != 0u;
    let own = fused && c == p / CH;
    let cos0 = op.aux_off + p * half;
    let sin0 = op.aux_off + op.max_pos * half + p * half;
    if (own) {
        let at = r * kvw + g * hd;
        let cb = (slot * op.max_pos + p) * kvw + g * hd;
        let normed = (op.kind & 2u) != 0u;
        var inv = 1.0;
        if (normed) {
            inv = norm_inv(0u, at, hd, lid);
        }
        for (var j = lid; j < half; j = j + WG) {
            let v = rope_pair(0u, at, j, half, inv, normed, op.b_off, cos0, sin0);
            ks[j] = v.x;
            ks[j + half] = v.y;
            if (h % per == 0u) {
                kc[cb + j] = v.x;
                kc[cb + j + half] = v.y;
            }
        }
        workgroupBarrier();
    }
    let q0 = r * op.heads * hd + h * hd;
    if (fused) {
        let normed = (op.kind & 1u) != 0u;
        var inv = 1.0;
        if (normed) {
            inv = norm_inv(1u, q0, hd, lid);
        }
        for (var j = lid; j < half; j = j + WG) {
            let v = rope_pair(1u, q0, j, half, inv, normed, op.s_off, cos0, sin0);
            qs[j] = v.x;
            qs[j + half] = v.y;
        }
        workgroupBarrier();
    }
    var s = -3.0e38;
    if (valid) {
        let mine = own && t == p;
        var acc = 0.0;
        for (var d = 0u; d < hd; d = d + 1u) {
            var q: f32;
            var k: f32;
            if (fused) {
                q = qs[d];
            } else {
                q = src[q0 + d];
            }
            if (mine) {
                k = ks[d];
            } else {
                k = kc[c0 + t * kvw + d];
            }
            acc = acc + q * k;
        }
        s = acc * op.scale;
    }
    red1[lid] = s;
    let m = reduce_max(lid);
    var e = 0.0;
    if (valid) {
        e = exp_f32(s - m);
    }
    ew[lid] = e;
    red1[lid] = e;
    let l = reduce1(lid);
    let at = part_at(r, h, c);
    if (lid == 0u) {
        scr[at] = m;
        scr[at + 1u] = l;
    }
    for (var d = lid; d < hd; d = d + WG) {
        var o = 0.0;
        for (var j = 0u; j < n; j = j + 1u) {
            o = o + ew[j] * vc[c0 + (t0 + j) * kvw + d];
        }
        scr[at + 2u + d] = o;
    }
}

// grid: rows * heads
@compute @workgroup_size(64)
fn attend_merge(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
                @builtin(local_invocation_index) lid: u32) {
    let id = flat_id(wid, nwg);
    let r = id / op.heads;
    let h = id % op.heads;
    if (r >= op.rows) {
        return;
    }
    let hd = op.head_dim;
    let chunks = row_pos(r) / CH + 1u;
    var mx = -3.0e38;
    for (var c = 0u; c < chunks; c = c + 1u) {
        mx = max(mx, scr[part_at(r, h, c)]);
    }
    var total = 0.0;
    for (var c = 0u; c < chunks; c = c + 1u) {
        let at = part_at(r, h, c);
        total = total + scr[at + 1u] * exp_f32(scr[at] - mx);
    }
    let q0 = r * op.heads * hd + h * hd;
    for (var d = lid; d < hd; d = d + WG) {
        var acc = 0.0;
        for (var c = 0u; c < chunks; c = c + 1u) {
            let at = part_at(r, h, c);
            acc = acc + scr[at + 2u + d] * exp_f32(scr[at] - mx);
        }
        dst[q0 + d] = acc / total;
    }
}

// ---------------------------------------------------------------------------------

@compute @workgroup_size(256)
fn add(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
       @builtin(local_invocation_index) lid: u32) {
    let i = flat_id(wid, nwg) * 256u + lid;
    if (i < op.rows * op.dst_w) {
        dst[i] = dst[i] + src[i];
    }
}

@compute @workgroup_size(64)
fn advance(@builtin(local_invocation_index) lid: u32) {
    for (var r = lid; r < op.rows; r = r + WG) {
        if ((ctl[op.map_off + 4u * r + 3u] & ROW_LAST) != 0u) {
            let slot = ctl[op.map_off + 4u * r];
            ctl[slot] = ctl[slot] + ctl[op.map_off + 4u * r + 1u] + 1u;
        }
    }
}
