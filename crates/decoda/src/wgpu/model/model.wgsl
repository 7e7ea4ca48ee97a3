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
//   attend     (rows * heads)      a[r][h] = softmax(q . k_t * scale) . v_t over t <= pos(r)
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

// One head of one row (rows x (heads + kv_heads) workgroups): a query head's values
// (dst) normed with the q norm (when `kind` bit 0) and rotated in place; a key/value
// head's key (src) normed with the k norm (bit 1) and rotated into the cache, its value
// (scr) copied into the cache. Norm weights in `wts` at words `s_off` (q) and `b_off`
// (k), the RoPE table in `aux` at `aux_off`.
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
            var x0 = dst[at + j];
            var x1 = dst[at + j + half];
            if (normed) {
                x0 = fp(x0 * inv) * bitcast<f32>(wts[op.s_off + j]);
                x1 = fp(x1 * inv) * bitcast<f32>(wts[op.s_off + j + half]);
            }
            let c = bitcast<f32>(aux[cos0 + j]);
            let s = bitcast<f32>(aux[sin0 + j]);
            dst[at + j] = fp(x0 * c) - fp(x1 * s);
            dst[at + j + half] = fp(x1 * c) + fp(x0 * s);
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
        var x0 = src[at + j];
        var x1 = src[at + j + half];
        if (normed) {
            x0 = fp(x0 * inv) * bitcast<f32>(wts[op.b_off + j]);
            x1 = fp(x1 * inv) * bitcast<f32>(wts[op.b_off + j + half]);
        }
        let c = bitcast<f32>(aux[cos0 + j]);
        let s = bitcast<f32>(aux[sin0 + j]);
        kc[cbase + j] = fp(x0 * c) - fp(x1 * s);
        kc[cbase + j + half] = fp(x1 * c) + fp(x0 * s);
    }
    for (var j = lid; j < hd; j = j + WG) {
        vc[cbase + j] = scr[at + j];
    }
}

// ---------------------------------------------------------------------------------

@compute @workgroup_size(64)
fn attend(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
          @builtin(local_invocation_index) lid: u32) {
    let id = flat_id(wid, nwg);
    let r = id / op.heads;
    let h = id % op.heads;
    if (r >= op.rows) {
        return;
    }
    let hd = op.head_dim;
    let kvw = op.kv_heads * hd;
    let g = h / (op.heads / op.kv_heads);
    let p = row_pos(r);
    let slot = row_slot(r);
    let q0 = r * op.heads * hd + h * hd;
    let s0 = id * op.max_pos;
    let c0 = slot * op.max_pos * kvw + g * hd;
    var m = -3.0e38;
    for (var t = lid; t <= p; t = t + WG) {
        var s = 0.0;
        for (var d = 0u; d < hd; d = d + 1u) {
            s = s + src[q0 + d] * kc[c0 + t * kvw + d];
        }
        s = s * op.eps;
        scr[s0 + t] = s;
        m = max(m, s);
    }
    red1[lid] = m;
    workgroupBarrier();
    for (var st = 32u; st > 0u; st = st >> 1u) {
        if (lid < st) {
            red1[lid] = max(red1[lid], red1[lid + st]);
        }
        workgroupBarrier();
    }
    let mx = red1[0];
    workgroupBarrier();
    var sum = 0.0;
    for (var t = lid; t <= p; t = t + WG) {
        let e = exp_f32(scr[s0 + t] - mx);
        scr[s0 + t] = e;
        sum = sum + e;
    }
    red1[lid] = sum;
    let total = reduce1(lid);
    storageBarrier();
    workgroupBarrier();
    for (var d = lid; d < hd; d = d + WG) {
        var acc = 0.0;
        for (var t = 0u; t <= p; t = t + 1u) {
            acc = acc + scr[s0 + t] * vc[c0 + t * kvw + d];
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
