// A shard's summaries for vocabulary-sharded sampling (crate::shard, docs/CONTRACT.md
// "Sampling a vocabulary split across shards"), from logits already on the device.
//
// Every entry point runs over a grid of (chunk, row): workgroup (c, r) covers the shard's
// tokens c * CHUNK .. (c + 1) * CHUNK of row r, each invocation PER of them, and writes
// what it found into its own words of `parts` (a partial per workgroup, merged on the host
// in chunk order) or adds into the row's histograms and gather lists. Nothing here
// decides a token on its own: the host merges, as crate::shard does for host shards.
//
// Arithmetic follows fmath.wgsl's rules: z is the CPU's `Touch::apply` with every step
// rounded on its own (`fp`), y is `div_rn(z, t)`, the noise is `gumbel` of the Philox word
// of the global id; special values are tested on bits, and values are compared through
// keys (`key_of`: the total order of `f32::total_cmp`; `cmp_key`: -0 equal to +0, as
// float comparisons have it).

struct ShardCall {
    rows: u32,
    width: u32,     // ids this shard holds
    offset: u32,    // the first of them
    stride: u32,    // elements between rows of the logits
    base: u32,      // elements before the first row
    chunks: u32,    // workgroups per row
    zero: u32,      // 0, read at run time (fmath.wgsl's opaque_zero)
    dtype: u32,     // the logits' element type: 0 f32, 1 f16, 2 bf16
}

// One row's parameters (layout checked against `ShardRowP` by a test).
struct RowP {
    flags: u32,     // RF_* below
    t: f32,         // temperature
    seed_lo: u32,
    seed_hi: u32,
    step_lo: u32,
    step_hi: u32,
    touch_off: u32, // the row's sorted touch records in `touches` (5 words each)
    touch_len: u32,
    mask_off: u32,  // the mask word of the shard's first id, in `masks`
    rep: f32,       // repetition penalty
    freq: f32,      // frequency penalty
    pres: f32,      // presence penalty
    kind: u32,      // round 2 and 3: K_* below
    token: u32,     // round 2: the greedy token; round 3: the chosen one
    floor: f32,     // the kept set's floor on y (draws)
    vmax: f32,      // round 2: the log-sum-exp's maximum; round 3: the chosen value
    thr_z: u32,     // gather: the key of z at and above which a token is gathered
    thr_x: u32,     // the same for the raw logit
    gz_off: u32,    // gather: the row's first (id, z) pair in `gath`
    gx_off: u32,    // its first (id, x) pair
}

const RF_MASK: u32 = 1u;
const RF_TOUCH: u32 = 2u;
const RF_HIST_Z: u32 = 4u;   // round 1: z's histogram and gather
const RF_HIST_X: u32 = 8u;   // the raw logit's
const RF_LSE: u32 = 16u;     // round 2: the partial log-sum-exp

const K_NONE: u32 = 0u;      // failed row: nothing to do
const K_RAW: u32 = 1u;       // round 2: a greedy row; round 3: rank among raw logits
const K_Z: u32 = 2u;         // round 2: greedy with processed lse; round 3: among z
const K_DRAW: u32 = 3u;      // round 2: a draw; round 3: among the kept y
const K_DRAW_RAW: u32 = 4u;  // round 2: a draw whose lse is over raw logits

const WGS: u32 = 256u;
const PER: u32 = 16u;
const CHUNK: u32 = 4096u;    // WGS * PER
const PW: u32 = 8u;          // partial words per (row, chunk)
const BINS: u32 = 2048u;     // histogram bins: a key's top 11 bits
const NONE: u32 = 0xffffffffu;
const NEG_INF_BITS: u32 = 0xff800000u;

@group(0) @binding(0) var<uniform> call: ShardCall;
@group(0) @binding(1) var<storage, read> logits: array<u32>;
@group(0) @binding(2) var<storage, read> rowp: array<RowP>;
@group(0) @binding(3) var<storage, read> touches: array<u32>;
@group(0) @binding(4) var<storage, read> masks: array<u32>;
@group(0) @binding(5) var<storage, read_write> parts: array<u32>;
@group(0) @binding(6) var<storage, read_write> hist: array<atomic<u32>>;
@group(0) @binding(7) var<storage, read_write> counts: array<atomic<u32>>;
@group(0) @binding(8) var<storage, read_write> gath: array<u32>;

var<workgroup> wa: array<u32, 256>;
var<workgroup> wb: array<u32, 256>;
var<workgroup> wc: array<u32, 256>;
var<workgroup> wd: array<u32, 256>;
var<workgroup> wh: array<atomic<u32>, 2048>;

fn opaque_zero() -> u32 {
    return call.zero;
}



fn is_nan(v: f32) -> bool {
    return (bitcast<u32>(v) & 0x7fffffffu) > 0x7f800000u;
}



// A value that enters the top lists and histograms: neither NaN nor -inf.
fn listed(v: f32) -> bool {
    return !is_nan(v) && !is_neg_inf(v);
}

// The masked raw logit of the shard's token j (global id call.offset + j).
fn x_of(row: u32, rp: RowP, j: u32) -> f32 {
    if ((rp.flags & RF_MASK) != 0u) {
        let id = call.offset + j;
        let w = masks[rp.mask_off + (id >> 5u) - (call.offset >> 5u)];
        if (((w >> (id & 31u)) & 1u) == 0u) {
            return bitcast<f32>(NEG_INF_BITS);
        }
    }
    let e = call.base + row * call.stride + j;
    // one load for every element type (an f32's word, or the word holding a 16-bit value)
    let w = logits[select(e >> 1u, e, call.dtype == 0u)];
    let h = (w >> ((e & 1u) * 16u)) & 0xffffu;
    if (call.dtype == 0u) {
        return bitcast<f32>(w);
    }
    if (call.dtype == 1u) {
        return f16_of(h);
    }
    return bitcast<f32>(h << 16u);
}

// z of global id `id` from its masked logit: the CPU's `Touch::apply` (bias, repetition,
// frequency and presence, DRY, in that order) when the row's sorted touch records
// (id, flags: 1 bias 2 seen, bias bits, output count, DRY bits) hold it.
fn z_of(rp: RowP, id: u32, x: f32) -> f32 {
    if ((rp.flags & RF_TOUCH) == 0u || is_nan(x)) {
        return x;
    }
    var lo = 0u;
    var hi = rp.touch_len;
    var at = NONE;
    loop {
        if (lo >= hi) {
            break;
        }
        let mid = (lo + hi) / 2u;
        let t = touches[rp.touch_off + 5u * mid];
        if (t == id) {
            at = rp.touch_off + 5u * mid;
            break;
        }
        if (t < id) {
            lo = mid + 1u;
        } else {
            hi = mid;
        }
    }
    if (at == NONE) {
        return x;
    }
    let tf = touches[at + 1u];
    if (bitcast<u32>(x) == 0x7f800000u) {
        // +inf stays +inf through every step but a -inf bias, which makes NaN (as the
        // CPU's arithmetic does; the row fails either way)
        if ((tf & 1u) != 0u && is_neg_inf(bitcast<f32>(touches[at + 2u]))) {
            return bitcast<f32>(0x7fc00000u);
        }
        return x;
    }
    var z = x;
    if ((tf & 1u) != 0u) {
        let b = bitcast<f32>(touches[at + 2u]);
        if (is_neg_inf(b)) {
            z = bitcast<f32>(NEG_INF_BITS);
        } else if (!is_neg_inf(z)) {
            z = fp(z + b);
        }
        if (is_bad(z)) {
            return z;
        }
    }
    // -inf stays -inf through the penalties (and is kept out of the arithmetic)
    if ((tf & 2u) != 0u && !is_neg_inf(z)) {
        if (cmp_key(z) > cmp_key(0.0)) {
            z = div_rn(z, rp.rep);
        } else {
            z = fp(z * rp.rep);
        }
    }
    let c = touches[at + 3u];
    if (c > 0u && !is_neg_inf(z)) {
        z = fp(fp(z - fp(rp.freq * f32(c))) - rp.pres);
    }
    let dry = bitcast<f32>(touches[at + 4u]);
    if (bitcast<u32>(dry) != 0u && !is_neg_inf(z)) {
        z = fp(z - dry);
    }
    return z;
}

fn y_of(rp: RowP, z: f32) -> f32 {
    return div_rn(z, rp.t);
}

fn part_at(row: u32, chunk: u32) -> u32 {
    return (row * call.chunks + chunk) * PW;
}

fn end_of(chunk: u32) -> u32 {
    return min((chunk + 1u) * CHUNK, call.width);
}

// (a.value, a.id) ahead of (b.value, b.id) for a largest-first choice whose ties go to
// the smaller id (values compared as floats: -0 equals +0); NONE ids are never ahead.
fn ahead(av: f32, ai: u32, bv: f32, bi: u32) -> bool {
    if (ai == NONE) {
        return false;
    }
    if (bi == NONE) {
        return true;
    }
    let ka = cmp_key(av);
    let kb = cmp_key(bv);
    return ka > kb || (ka == kb && ai < bi);
}

// Adds this workgroup's histogram of keys into the row's (2,048 bins at `at`).
fn flush_hist(lid: u32, at: u32) {
    workgroupBarrier();
    for (var b = lid; b < BINS; b = b + WGS) {
        let n = atomicLoad(&wh[b]);
        if (n != 0u) {
            atomicAdd(&hist[at + b], n);
        }
        atomicStore(&wh[b], 0u);
    }
    workgroupBarrier();
}

// Round 1: non-finite counts, the largest z with its smallest id, the largest raw logit
// (parts: bad x, bad z, zmax bits, its id, xmax bits), and the histograms of z's and
// the raw logit's keys for the rows that list them.
@compute @workgroup_size(256)
fn r1(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let row = wid.y;
    let chunk = wid.x;
    let rp = rowp[row];
    let end = end_of(chunk);
    for (var b = lid; b < BINS; b = b + WGS) {
        atomicStore(&wh[b], 0u);
    }
    workgroupBarrier();
    var bx = 0u;
    var bz = 0u;
    var zm = bitcast<f32>(NEG_INF_BITS);
    var zi = NONE;
    var xm = bitcast<f32>(NEG_INF_BITS);
    let hz = (rp.flags & RF_HIST_Z) != 0u;
    for (var j = chunk * CHUNK + lid; j < end; j = j + WGS) {
        let x = x_of(row, rp, j);
        let id = call.offset + j;
        let z = z_of(rp, id, x);
        if (is_bad(x)) {
            bx = bx + 1u;
        }
        // f32::max's: NaN left out, +inf kept
        if (!is_nan(x) && cmp_key(x) > cmp_key(xm)) {
            xm = x;
        }
        if (is_bad(z)) {
            bz = bz + 1u;
        }
        // ids ascend within an invocation: a tie keeps the first
        if (!is_nan(z) && !is_neg_inf(z) && (zi == NONE || cmp_key(z) > cmp_key(zm))) {
            zm = z;
            zi = id;
        }
        if (hz && listed(z)) {
            atomicAdd(&wh[key_of(z) >> 21u], 1u);
        }
    }
    // a tree over the workgroup: sums, the largest z (ties: smaller id), the largest x
    wa[lid] = bx;
    wb[lid] = bz;
    wc[lid] = bitcast<u32>(zm);
    wd[lid] = zi;
    workgroupBarrier();
    for (var s = WGS / 2u; s > 0u; s = s / 2u) {
        if (lid < s) {
            wa[lid] = wa[lid] + wa[lid + s];
            wb[lid] = wb[lid] + wb[lid + s];
            if (ahead(bitcast<f32>(wc[lid + s]), wd[lid + s], bitcast<f32>(wc[lid]), wd[lid])) {
                wc[lid] = wc[lid + s];
                wd[lid] = wd[lid + s];
            }
        }
        workgroupBarrier();
    }
    let p = part_at(row, chunk);
    if (lid == 0u) {
        parts[p] = wa[0];
        parts[p + 1u] = wb[0];
        parts[p + 2u] = wc[0];
        parts[p + 3u] = wd[0];
    }
    workgroupBarrier();
    wa[lid] = cmp_key(xm);
    workgroupBarrier();
    for (var s = WGS / 2u; s > 0u; s = s / 2u) {
        if (lid < s) {
            wa[lid] = max(wa[lid], wa[lid + s]);
        }
        workgroupBarrier();
    }
    if (lid == 0u) {
        // the largest key's value (a -0 and a +0 compare equal: either is the max)
        parts[p + 4u] = wa[0];
    }
    if (hz) {
        flush_hist(lid, row * 2u * BINS);
    }
    if ((rp.flags & RF_HIST_X) != 0u) {
        for (var j = chunk * CHUNK + lid; j < end; j = j + WGS) {
            let x = x_of(row, rp, j);
            if (listed(x)) {
                atomicAdd(&wh[key_of(x) >> 21u], 1u);
            }
        }
        flush_hist(lid, row * 2u * BINS + BINS);
    }
}

// Round 1's lists: every token whose z (raw logit) has a key at or above the row's
// threshold, as (global id, value bits) pairs in the row's gather area, in any order.
@compute @workgroup_size(256)
fn r1_gather(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let row = wid.y;
    let chunk = wid.x;
    let rp = rowp[row];
    let end = end_of(chunk);
    let hz = (rp.flags & RF_HIST_Z) != 0u;
    let hx = (rp.flags & RF_HIST_X) != 0u;
    if (!hz && !hx) {
        return;
    }
    for (var j = chunk * CHUNK + lid; j < end; j = j + WGS) {
        let x = x_of(row, rp, j);
        let id = call.offset + j;
        if (hz) {
            let z = z_of(rp, id, x);
            if (listed(z) && key_of(z) >= rp.thr_z) {
                let at = atomicAdd(&counts[2u * row], 1u);
                gath[rp.gz_off + 2u * at] = id;
                gath[rp.gz_off + 2u * at + 1u] = bitcast<u32>(z);
            }
        }
        if (hx && listed(x) && key_of(x) >= rp.thr_x) {
            let at = atomicAdd(&counts[2u * row + 1u], 1u);
            gath[rp.gx_off + 2u * at] = id;
            gath[rp.gx_off + 2u * at + 1u] = bitcast<u32>(x);
        }
    }
}

// Round 2: a draw row's best `y + g` over its kept tokens (y > -inf, y >= floor), with
// that token's id, y and raw logit (parts 0-3), the partial `Σ exp(v - vmax)` in f32
// (part 4), and a greedy row's raw logit of its token in the chunk holding it (part 5).
@compute @workgroup_size(256)
fn r2(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let row = wid.y;
    let chunk = wid.x;
    let rp = rowp[row];
    let end = end_of(chunk);
    let p = part_at(row, chunk);
    if (rp.kind == K_NONE) {
        if (lid == 0u) {
            parts[p + 1u] = NONE;
            parts[p + 4u] = 0u;
        }
        return;
    }
    let draw = rp.kind == K_DRAW || rp.kind == K_DRAW_RAW;
    let lse = (rp.flags & RF_LSE) != 0u;
    let seed = vec2<u32>(rp.seed_lo, rp.seed_hi);
    var bs = 0.0;
    var bi = NONE;
    var by = 0.0;
    var bxv = 0.0;
    var sum = 0.0;
    for (var j = chunk * CHUNK + lid; j < end; j = j + WGS) {
        let x = x_of(row, rp, j);
        let id = call.offset + j;
        if (!draw) {
            if (id == rp.token) {
                parts[p + 5u] = bitcast<u32>(x);
            }
            if (lse) {
                var v = x;
                if (rp.kind == K_Z) {
                    v = z_of(rp, id, x);
                }
                if (!is_neg_inf(v)) {
                    sum = fp(sum + exp_f32(fp(v - rp.vmax)));
                }
            }
            continue;
        }
        let z = z_of(rp, id, x);
        let y = y_of(rp, z);
        let kept = !is_neg_inf(y) && cmp_key(y) >= cmp_key(rp.floor);
        if (kept) {
            let w = philox(vec4<u32>(id / 4u, rp.step_lo, rp.step_hi, 0u), seed)[id % 4u];
            let s = fp(y + gumbel(w));
            // ids ascend within an invocation: a tie keeps the first
            if (bi == NONE || cmp_key(s) > cmp_key(bs)) {
                bs = s;
                bi = id;
                by = y;
                bxv = x;
            }
        }
        if (lse) {
            if (rp.kind == K_DRAW_RAW) {
                if (!is_neg_inf(x)) {
                    sum = fp(sum + exp_f32(fp(x - rp.vmax)));
                }
            } else if (kept) {
                sum = fp(sum + exp_f32(fp(y - rp.vmax)));
            }
        }
    }
    wa[lid] = bitcast<u32>(bs);
    wb[lid] = bi;
    wc[lid] = bitcast<u32>(sum);
    wd[lid] = lid;
    workgroupBarrier();
    for (var s = WGS / 2u; s > 0u; s = s / 2u) {
        if (lid < s) {
            if (ahead(bitcast<f32>(wa[lid + s]), wb[lid + s], bitcast<f32>(wa[lid]), wb[lid])) {
                wa[lid] = wa[lid + s];
                wb[lid] = wb[lid + s];
                wd[lid] = wd[lid + s];
            }
            wc[lid] = bitcast<u32>(fp(bitcast<f32>(wc[lid]) + bitcast<f32>(wc[lid + s])));
        }
        workgroupBarrier();
    }
    // the winning invocation writes its token's y and raw logit
    if (bi != NONE && wb[0] == bi && wd[0] == lid) {
        parts[p + 2u] = bitcast<u32>(by);
        parts[p + 3u] = bitcast<u32>(bxv);
    }
    if (lid == 0u) {
        parts[p] = wa[0];
        parts[p + 1u] = wb[0];
        parts[p + 4u] = wc[0];
    }
}

// Round 3: how many of the chunk's tokens rank before the chosen (value, id) in the
// contract's rank order (values by `total_cmp`, ties by id): among raw logits, z, or the
// kept y (part 0).
@compute @workgroup_size(256)
fn r3(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let row = wid.y;
    let chunk = wid.x;
    let rp = rowp[row];
    let end = end_of(chunk);
    var n = 0u;
    if (rp.kind != K_NONE) {
        let ck = key_of(rp.vmax);
        for (var j = chunk * CHUNK + lid; j < end; j = j + WGS) {
            let x = x_of(row, rp, j);
            let id = call.offset + j;
            var v = x;
            var counted = true;
            if (rp.kind == K_Z) {
                v = z_of(rp, id, x);
            } else if (rp.kind == K_DRAW) {
                v = y_of(rp, z_of(rp, id, x));
                counted = !is_neg_inf(v) && cmp_key(v) >= cmp_key(rp.floor);
            }
            let k = key_of(v);
            if (counted && (k > ck || (k == ck && id < rp.token))) {
                n = n + 1u;
            }
        }
    }
    wa[lid] = n;
    workgroupBarrier();
    for (var s = WGS / 2u; s > 0u; s = s / 2u) {
        if (lid < s) {
            wa[lid] = wa[lid] + wa[lid + s];
        }
        workgroupBarrier();
    }
    if (lid == 0u) {
        parts[part_at(row, chunk)] = wa[0];
    }
}
