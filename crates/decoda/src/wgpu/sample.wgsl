// decoda's device sampler: the sampling contract (README, "The sampling contract") as
// WGSL compute shaders. The launcher (mod.rs) records the entry points below in a fixed
// order, the same for every call whatever the data:
//
//   touch -> stats -> decide_stats -> (hist_k -> decide_k) x3 -> (hist_p -> decide_p) x3
//         -> draw -> finish -> rank_topn -> finish_lp [-> draw_many] -> untouch
//
// The arithmetic that decides tokens (ln, exp, division, Philox) is in fmath.wgsl; the
// workgroup reductions in reduce_wg.wgsl or reduce_sg.wgsl, appended by the launcher.
//
// Row-parallel kernels run one workgroup per (split, row): a row is cut into `splits`
// chunks so that a small batch still fills the device. Per-row kernels (decide_*,
// finish*) run one workgroup per row. Values that cross kernels live in `state` (per
// row), `slots` (per row and split) and `hist` (per row, cleared by the decide kernel
// that reads it, so it is zero again for the next call).
//
// Selections are exact radix selects over the order-preserving 32-bit key of z (11, 11
// and 10 bits): top-k counts tokens, top-p sums their weights exp(y - ymax) in 64-bit
// fixed point (units of 2^-40, integer atomics), so the k-th value and the top-p cut
// are found in three passes each, without sorting and without retries.

const WG: u32 = 256u;
const BINS: u32 = 2048u;
const HW: u32 = 6144u;      // hist words per row: counts, mass lo, mass hi
const ST: u32 = 32u;        // state words per row
const SLOT: u32 = 52u;      // slot words per (row, split)
const NTOP: u32 = 20u;      // most top log-probabilities a row may ask for
const LPW: u32 = 44u;       // logprobs output words per row
const NEG_INF_BITS: u32 = 0xff800000u;
const DRAW_WG: u32 = 256u;  // invocations of a draw_many workgroup
// out_status codes
const OUT_NON_FINITE: u32 = 1u;
const OUT_NO_CANDIDATE: u32 = 2u;
const OUT_NO_WINNER: u32 = 3u;
const NO_TOKEN: u32 = 0xffffffffu;
const TWO_M40: f32 = 9.094947017729282e-13; // 2^-40

// state word offsets
const S_STATUS: u32 = 0u;   // 0 sample, 1 greedy, 2 non-finite, 3 no candidate, 4 no winner
const S_COUNT: u32 = 1u;
const S_ZMAX: u32 = 2u;
const S_YMAX: u32 = 3u;
const S_XMAX: u32 = 4u;
const S_TAU_MIN: u32 = 5u;
const S_K_ON: u32 = 6u;
const S_K_LEVEL: u32 = 7u;
const S_K_PREFIX: u32 = 8u;
const S_K_REM: u32 = 9u;
const S_TAU_K: u32 = 10u;
const S_P_ON: u32 = 11u;
const S_P_LEVEL: u32 = 12u;
const S_P_PREFIX: u32 = 13u;
const S_ABOVE_LO: u32 = 14u;
const S_ABOVE_HI: u32 = 15u;
const S_SUM: u32 = 16u;      // top-p normaliser, fixed-point units, as f32
const S_TARGET: u32 = 17u;   // p * S_SUM
const S_P_CUT: u32 = 18u;    // 1 when q >= tau_q filters
const S_TAU_Q: u32 = 19u;
const S_TOKEN: u32 = 20u;
const S_LSE: u32 = 21u;
const S_VMAX: u32 = 22u;

// row flags
const F_TOUCH: u32 = 1u;
const F_LOGPROBS: u32 = 2u;
const F_PROCESSED: u32 = 4u;
const F_TOP_P: u32 = 8u;
const F_TOP_K: u32 = 16u;

struct Call {
    rows: u32,
    vocab: u32,
    stride: u32,      // elements between rows
    dtype: u32,       // 0 f32, 1 f16, 2 bf16
    splits: u32,
    chunk: u32,       // elements per split, a multiple of 4
    base: u32,        // element offset of row 0
    bm_words: u32,    // bitmap words per row
    n_touches: u32,
    draws: u32,       // draw_many only
    draw_lanes: u32,  // draw_many: invocations sharing one draw (a power of two)
    zero: u32,        // always 0 (fp, in fmath.wgsl)
}

struct RowP {
    temperature: f32,
    top_k: u32,
    top_p: f32,
    ln_min_p: f32,
    rep: f32,
    freq: f32,
    pres: f32,
    flags: u32,
    seed_lo: u32,
    seed_hi: u32,
    step_lo: u32,
    step_hi: u32,
    touch_off: u32,
    touch_len: u32,
    n_lp: u32,
    pad: u32,
}

struct Touch {
    token: u32,
    row: u32,
    flags: u32,       // 1 bias, 2 seen (repetition)
    count: u32,       // occurrences in the output
    bias: f32,
    z: f32,           // written by `touch`
    pad0: u32,
    pad1: u32,
}

@group(0) @binding(0) var<uniform> call: Call;
@group(0) @binding(1) var<storage, read> logits: array<u32>;
@group(0) @binding(2) var<storage, read> rows: array<RowP>;
@group(0) @binding(3) var<storage, read_write> touches: array<Touch>;
@group(0) @binding(4) var<storage, read_write> state: array<u32>;
@group(0) @binding(5) var<storage, read_write> slots: array<u32>;
@group(0) @binding(6) var<storage, read_write> hist: array<atomic<u32>>;
@group(0) @binding(7) var<storage, read_write> bitmap: array<atomic<u32>>;
@group(0) @binding(8) var<storage, read_write> out_tokens: array<u32>;
@group(0) @binding(9) var<storage, read_write> out_status: array<u32>;
@group(0) @binding(10) var<storage, read_write> out_lp: array<u32>;

var<workgroup> ra: array<u32, 256>;
var<workgroup> rb: array<u32, 256>;
var<workgroup> wtot: vec2<u32>;
var<workgroup> wflag: u32;
var<workgroup> hk: array<atomic<u32>, 2048>;
var<workgroup> hm_lo: array<atomic<u32>, 2048>;

fn opaque_zero() -> u32 {
    return call.zero;
}

// ---------------------------------------------------------------------------------
// Keys, loads, small helpers.

// Order-preserving key: a < b (floats, no NaN) iff key(a) < key(b).
fn key_of(v: f32) -> u32 {
    let b = bitcast<u32>(v);
    if ((b & 0x80000000u) != 0u) {
        return ~b;
    }
    return b | 0x80000000u;
}

// The key of a value for comparisons: as key_of, but -0 and +0 compare equal, as floats
// do. Comparing keys keeps -inf out of float comparisons (fast math may assume it away).
fn cmp_key(v: f32) -> u32 {
    if (bitcast<u32>(v) == 0x80000000u) {
        return 0x80000000u;
    }
    return key_of(v);
}

fn from_key(k: u32) -> f32 {
    if ((k & 0x80000000u) != 0u) {
        return bitcast<f32>(k & 0x7fffffffu);
    }
    return bitcast<f32>(~k);
}

// NaN or +inf.
fn is_bad(v: f32) -> bool {
    let b = bitcast<u32>(v) & 0x7fffffffu;
    return b > 0x7f800000u || bitcast<u32>(v) == 0x7f800000u;
}

fn is_neg_inf(v: f32) -> bool {
    return bitcast<u32>(v) == NEG_INF_BITS;
}

fn not_finite(v: f32) -> bool {
    return (bitcast<u32>(v) & 0x7f800000u) == 0x7f800000u;
}

fn neg_inf() -> f32 {
    return bitcast<f32>(NEG_INF_BITS);
}

// exp(a - b) for a finite b; 0 when a is -inf (kept out of the arithmetic).
fn exp_diff(a: f32, b: f32) -> f32 {
    if (is_neg_inf(a)) {
        return 0.0;
    }
    return exp_f32(a - b);
}

fn f16_to_f32(h: u32) -> f32 {
    let s = (h & 0x8000u) << 16u;
    let e = (h >> 10u) & 0x1fu;
    let m = h & 0x3ffu;
    if (e == 31u) {
        return bitcast<f32>(s | 0x7f800000u | (m << 13u));
    }
    if (e == 0u) {
        let v = f32(m) * 5.9604645e-8;
        if (s != 0u) {
            return -v;
        }
        return v;
    }
    return bitcast<f32>(s | ((e + 112u) << 23u) | (m << 13u));
}

fn load_x(row: u32, i: u32) -> f32 {
    let e = call.base + row * call.stride + i;
    if (call.dtype == 0u) {
        return bitcast<f32>(logits[e]);
    }
    let w = logits[e >> 1u];
    let h = (w >> ((e & 1u) * 16u)) & 0xffffu;
    if (call.dtype == 1u) {
        return f16_to_f32(h);
    }
    return bitcast<f32>(h << 16u);
}

// z of token i (stages 1-3): x, or the value `touch` computed for a touched token.
fn z_from(row: u32, i: u32, x: f32, rp: RowP) -> f32 {
    if ((rp.flags & F_TOUCH) == 0u) {
        return x;
    }
    let w = atomicLoad(&bitmap[row * call.bm_words + (i >> 5u)]);
    if ((w & (1u << (i & 31u))) == 0u) {
        return x;
    }
    var lo = rp.touch_off;
    var hi = rp.touch_off + rp.touch_len;
    loop {
        if (lo >= hi) {
            break;
        }
        let mid = (lo + hi) / 2u;
        let t = touches[mid].token;
        if (t == i) {
            return touches[mid].z;
        }
        if (t < i) {
            lo = mid + 1u;
        } else {
            hi = mid;
        }
    }
    return x;
}

fn sget(row: u32, w: u32) -> u32 {
    return state[row * ST + w];
}

fn sgetf(row: u32, w: u32) -> f32 {
    return bitcast<f32>(state[row * ST + w]);
}

fn sset(row: u32, w: u32, v: u32) {
    state[row * ST + w] = v;
}

fn ssetf(row: u32, w: u32, v: f32) {
    state[row * ST + w] = bitcast<u32>(v);
}

fn slot_base(row: u32, split: u32) -> u32 {
    return (row * call.splits + split) * SLOT;
}

fn add64(a: vec2<u32>, b: vec2<u32>) -> vec2<u32> {
    let lo = a.x + b.x;
    var carry = 0u;
    if (lo < a.x) {
        carry = 1u;
    }
    return vec2<u32>(lo, a.y + b.y + carry);
}

fn sub64(a: vec2<u32>, b: vec2<u32>) -> vec2<u32> {
    var borrow = 0u;
    if (a.x < b.x) {
        borrow = 1u;
    }
    return vec2<u32>(a.x - b.x, a.y - b.y - borrow);
}

fn val64(a: vec2<u32>) -> f32 {
    return f32(a.y) * 4294967296.0 + f32(a.x);
}

// ---------------------------------------------------------------------------------
// Workgroup reductions (call from uniform control flow).

// `on` of invocation 0, known to the whole workgroup as a uniform value: lets a
// workgroup skip a kernel's work (barriers included) for a row that has nothing to do.
fn wg_flag(lid: u32, on: bool) -> bool {
    if (lid == 0u) {
        wflag = select(0u, 1u, on);
    }
    return workgroupUniformLoad(&wflag) != 0u;
}

// wg_argmax, wg_sum_max, wg_sum_u32 and wg_sum64 come from reduce_wg.wgsl
// (workgroup memory) or reduce_sg.wgsl (subgroup operations), appended by the launcher.

// A weight in [0, 1] in 64-bit fixed point, units of 2^-40 (truncated): sums of these
// are exact integers, so they do not depend on the order of summation (the batch, the
// split of a row between workgroups).
fn fixed40(e: f32) -> vec2<u32> {
    let f = e * 256.0;
    let hi = u32(f);
    return vec2<u32>(u32((f - f32(hi)) * 4294967296.0), hi);
}

// Inclusive prefix sum over the workgroup, in thread order; also leaves the total in wtot.
fn wg_scan64(lid: u32, v: vec2<u32>) -> vec2<u32> {
    ra[lid] = v.x;
    rb[lid] = v.y;
    workgroupBarrier();
    for (var s = 1u; s < WG; s = s << 1u) {
        var cur = vec2<u32>(ra[lid], rb[lid]);
        if (lid >= s) {
            cur = add64(cur, vec2<u32>(ra[lid - s], rb[lid - s]));
        }
        workgroupBarrier();
        ra[lid] = cur.x;
        rb[lid] = cur.y;
        workgroupBarrier();
    }
    let r = vec2<u32>(ra[lid], rb[lid]);
    if (lid == WG - 1u) {
        wtot = r;
    }
    workgroupBarrier();
    return r;
}

// ---------------------------------------------------------------------------------
// Stages 1-3 of touched tokens; bitmap bookkeeping.

@compute @workgroup_size(64)
fn touch(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let t = gid.x + gid.y * nwg.x * 64u;
    if (t >= call.n_touches) {
        return;
    }
    let tc = touches[t];
    let rp = rows[tc.row];
    let x = load_x(tc.row, tc.token);
    var z = x;
    if ((tc.flags & 1u) != 0u) {
        if (is_neg_inf(tc.bias)) {
            z = neg_inf();
        } else if (!is_neg_inf(x)) {
            z = x + tc.bias;
        }
    }
    // -inf stays -inf through the penalties (and is kept out of the arithmetic)
    if (!is_neg_inf(z)) {
        if ((tc.flags & 2u) != 0u) {
            if (z > 0.0) {
                z = div_rn(z, rp.rep);
            } else {
                z = z * rp.rep;
            }
        }
        if (tc.count > 0u) {
            z = fp(z - fp(rp.freq * f32(tc.count))) - rp.pres;
        }
    }
    touches[t].z = z;
    atomicOr(&bitmap[tc.row * call.bm_words + (tc.token >> 5u)], 1u << (tc.token & 31u));
}

@compute @workgroup_size(64)
fn untouch(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let t = gid.x + gid.y * nwg.x * 64u;
    if (t >= call.n_touches) {
        return;
    }
    let tc = touches[t];
    atomicStore(&bitmap[tc.row * call.bm_words + (tc.token >> 5u)], 0u);
}

// ---------------------------------------------------------------------------------
// Pass 1: max of z and of x, non-finite counts.

@compute @workgroup_size(256)
fn stats(@builtin(workgroup_id) wid: vec3<u32>, lanes: Lanes) {
    let lid = lanes.lid;
    lanes_init(lanes);
    let split = wid.x;
    let row = wid.y;
    let rp = rows[row];
    let start = split * call.chunk;
    let end = min(call.vocab, start + call.chunk);
    var zk = 0u;
    var xk = 0u;
    var bad_x = 0u;
    var bad_z = 0u;
    for (var i = start + lid; i < end; i = i + WG) {
        let x = load_x(row, i);
        let z = z_from(row, i, x, rp);
        if (is_bad(x)) {
            bad_x = bad_x + 1u;
        } else {
            xk = max(xk, key_of(x));
        }
        if (is_bad(z)) {
            bad_z = bad_z + 1u;
        } else {
            zk = max(zk, key_of(z));
        }
    }
    let a = wg_sum_max(lid, bad_x, xk);
    let b = wg_sum_max(lid, bad_z, zk);
    if (lid == 0u) {
        let sb = slot_base(row, split);
        slots[sb + 0u] = b.y;
        slots[sb + 1u] = a.y;
        slots[sb + 2u] = a.x;
        slots[sb + 3u] = b.x;
    }
}

@compute @workgroup_size(256)
fn decide_stats(@builtin(workgroup_id) wid: vec3<u32>, lanes: Lanes) {
    let lid = lanes.lid;
    lanes_init(lanes);
    let row = wid.x;
    var zk = 0u;
    var xk = 0u;
    var bad_x = 0u;
    var bad_z = 0u;
    for (var s = lid; s < call.splits; s = s + WG) {
        let sb = slot_base(row, s);
        zk = max(zk, slots[sb + 0u]);
        xk = max(xk, slots[sb + 1u]);
        bad_x = bad_x + slots[sb + 2u];
        bad_z = bad_z + slots[sb + 3u];
    }
    let a = wg_sum_max(lid, bad_x, xk);
    let b = wg_sum_max(lid, bad_z, zk);
    if (lid == 0u) {
        let rp = rows[row];
        var status = 0u;
        var count = 0u;
        let zmax = from_key(b.y);
        let t = rp.temperature;
        var ymax = neg_inf();
        if (a.x > 0u) {
            status = 2u;
            count = a.x;
        } else if (b.x > 0u) {
            status = 2u;
            count = b.x;
        } else if (b.y <= key_of(neg_inf())) {
            status = 3u;
        } else if (t < 1e-5) {
            status = 1u;
        } else {
            ymax = div_rn(zmax, t);
            if (not_finite(ymax)) {
                status = 1u;
            }
        }
        sset(row, S_STATUS, status);
        sset(row, S_COUNT, count);
        ssetf(row, S_ZMAX, zmax);
        ssetf(row, S_YMAX, ymax);
        ssetf(row, S_XMAX, from_key(a.y));
        // ymax + ln(min_p), -inf when min-p is off (or the row does not sample)
        var tau_min = neg_inf();
        if (!is_neg_inf(rp.ln_min_p) && !is_neg_inf(ymax)) {
            tau_min = ymax + rp.ln_min_p;
        }
        ssetf(row, S_TAU_MIN, tau_min);
        let sampling = status == 0u;
        sset(row, S_K_ON, select(0u, 1u, sampling && (rp.flags & F_TOP_K) != 0u));
        sset(row, S_K_LEVEL, 0u);
        sset(row, S_K_PREFIX, 0u);
        sset(row, S_K_REM, rp.top_k);
        ssetf(row, S_TAU_K, neg_inf());
        sset(row, S_P_ON, select(0u, 1u, sampling && (rp.flags & F_TOP_P) != 0u));
        sset(row, S_P_LEVEL, 0u);
        sset(row, S_P_PREFIX, 0u);
        sset(row, S_ABOVE_LO, 0u);
        sset(row, S_ABOVE_HI, 0u);
        sset(row, S_P_CUT, 0u);
        ssetf(row, S_TAU_Q, -1.0);
        sset(row, S_TOKEN, 0u);
    }
}

// ---------------------------------------------------------------------------------
// Top-k: radix select of the k-th largest z (counting duplicates).

fn digit_shift(level: u32) -> u32 {
    if (level == 0u) {
        return 21u;
    }
    if (level == 1u) {
        return 10u;
    }
    return 0u;
}

fn digit_mask(level: u32) -> u32 {
    if (level == 2u) {
        return 0x3ffu;
    }
    return 0x7ffu;
}

fn digit_width(level: u32) -> u32 {
    if (level == 2u) {
        return 10u;
    }
    return 11u;
}

// Whether a key lies in the bin chosen by the previous levels.
fn in_prefix(key: u32, level: u32, prefix: u32) -> bool {
    if (level == 0u) {
        return true;
    }
    if (level == 1u) {
        return (key >> 21u) == prefix;
    }
    return (key >> 10u) == prefix;
}

@compute @workgroup_size(256)
fn hist_k(@builtin(workgroup_id) wid: vec3<u32>, lanes: Lanes) {
    let lid = lanes.lid;
    lanes_init(lanes);
    let split = wid.x;
    let row = wid.y;
    let on = sget(row, S_K_ON) != 0u;
    if (!wg_flag(lid, on)) {
        return;
    }
    for (var b = lid; b < BINS; b = b + WG) {
        atomicStore(&hk[b], 0u);
    }
    workgroupBarrier();
    let level = sget(row, S_K_LEVEL);
    let prefix = sget(row, S_K_PREFIX);
    let rp = rows[row];
    let sh = digit_shift(level);
    let mask = digit_mask(level);
    let start = split * call.chunk;
    var end = min(call.vocab, start + call.chunk);
    if (!on) {
        end = start;
    }
    for (var i = start + lid; i < end; i = i + WG) {
        let z = z_from(row, i, load_x(row, i), rp);
        let key = key_of(z);
        if (in_prefix(key, level, prefix)) {
            atomicAdd(&hk[(key >> sh) & mask], 1u);
        }
    }
    workgroupBarrier();
    let hb = row * HW;
    for (var b = lid; b < BINS; b = b + WG) {
        let c = atomicLoad(&hk[b]);
        if (c != 0u) {
            atomicAdd(&hist[hb + b], c);
        }
    }
}

@compute @workgroup_size(256)
fn decide_k(@builtin(workgroup_id) wid: vec3<u32>, lanes: Lanes) {
    let lid = lanes.lid;
    lanes_init(lanes);
    let row = wid.x;
    if (!wg_flag(lid, sget(row, S_K_ON) != 0u)) {
        return;
    }
    let hb = row * HW;
    var cnts: array<u32, 8>;
    var mine = 0u;
    for (var j = 0u; j < 8u; j = j + 1u) {
        let b = BINS - 1u - (lid * 8u + j);
        let c = atomicLoad(&hist[hb + b]);
        cnts[j] = c;
        mine = mine + c;
        if (c != 0u) {
            atomicStore(&hist[hb + b], 0u);
        }
    }
    let incl = wg_scan64(lid, vec2<u32>(mine, 0u)).x;
    let before = incl - mine;
    let on = sget(row, S_K_ON) != 0u;
    let rem = sget(row, S_K_REM);
    if (on && before < rem && rem <= incl) {
        let level = sget(row, S_K_LEVEL);
        let prefix = sget(row, S_K_PREFIX);
        var cum = before;
        var bin = 0u;
        var left = rem;
        for (var j = 0u; j < 8u; j = j + 1u) {
            if (rem <= cum + cnts[j]) {
                bin = BINS - 1u - (lid * 8u + j);
                left = rem - cum;
                break;
            }
            cum = cum + cnts[j];
        }
        let np = (prefix << digit_width(level)) | bin;
        sset(row, S_K_PREFIX, np);
        sset(row, S_K_REM, left);
        sset(row, S_K_LEVEL, level + 1u);
        if (level == 2u) {
            ssetf(row, S_TAU_K, div_rn(from_key(np), rows[row].temperature));
        }
    }
}

// ---------------------------------------------------------------------------------
// Top-p: radix select of the cut over K, by the mass exp(y - ymax) in 2^-40 units.

@compute @workgroup_size(256)
fn hist_p(@builtin(workgroup_id) wid: vec3<u32>, lanes: Lanes) {
    let lid = lanes.lid;
    lanes_init(lanes);
    let split = wid.x;
    let row = wid.y;
    let on = sget(row, S_P_ON) != 0u;
    if (!wg_flag(lid, on)) {
        return;
    }
    for (var b = lid; b < BINS; b = b + WG) {
        atomicStore(&hm_lo[b], 0u);
    }
    workgroupBarrier();
    let level = sget(row, S_P_LEVEL);
    let prefix = sget(row, S_P_PREFIX);
    let tau_k = sgetf(row, S_TAU_K);
    let ymax = sgetf(row, S_YMAX);
    let rp = rows[row];
    let t = rp.temperature;
    let sh = digit_shift(level);
    let mask = digit_mask(level);
    let start = split * call.chunk;
    var end = min(call.vocab, start + call.chunk);
    if (!on) {
        end = start;
    }
    let hb = row * HW;
    for (var i = start + lid; i < end; i = i + WG) {
        let z = z_from(row, i, load_x(row, i), rp);
        if (is_neg_inf(z)) {
            continue;
        }
        let key = key_of(z);
        if (!in_prefix(key, level, prefix)) {
            continue;
        }
        let y = div_rn(z, t);
        if (cmp_key(y) < cmp_key(tau_k)) {
            continue;
        }
        let e = exp_f32(y - ymax);
        if (e == 0.0) {
            continue;
        }
        // the low words add up in workgroup memory; high words and carries go straight
        // to the row's histogram (integer sums: the order does not matter)
        let fx = fixed40(e);
        let lo = fx.x;
        let d = (key >> sh) & mask;
        let old = atomicAdd(&hm_lo[d], lo);
        var add_hi = fx.y;
        if (old + lo < old) {
            add_hi = add_hi + 1u;
        }
        if (add_hi != 0u) {
            atomicAdd(&hist[hb + 2u * BINS + d], add_hi);
        }
    }
    workgroupBarrier();
    for (var b = lid; b < BINS; b = b + WG) {
        let lo = atomicLoad(&hm_lo[b]);
        if (lo != 0u) {
            let old = atomicAdd(&hist[hb + BINS + b], lo);
            if (old + lo < old) {
                atomicAdd(&hist[hb + 2u * BINS + b], 1u);
            }
        }
    }
}

@compute @workgroup_size(256)
fn decide_p(@builtin(workgroup_id) wid: vec3<u32>, lanes: Lanes) {
    let lid = lanes.lid;
    lanes_init(lanes);
    let row = wid.x;
    if (!wg_flag(lid, sget(row, S_P_ON) != 0u)) {
        return;
    }
    let hb = row * HW;
    var m: array<vec2<u32>, 8>;
    var mine = vec2<u32>(0u, 0u);
    for (var j = 0u; j < 8u; j = j + 1u) {
        let b = BINS - 1u - (lid * 8u + j);
        let lo = atomicLoad(&hist[hb + BINS + b]);
        let hi = atomicLoad(&hist[hb + 2u * BINS + b]);
        m[j] = vec2<u32>(lo, hi);
        mine = add64(mine, m[j]);
        if ((lo | hi) != 0u) {
            atomicStore(&hist[hb + BINS + b], 0u);
            atomicStore(&hist[hb + 2u * BINS + b], 0u);
        }
    }
    let incl = wg_scan64(lid, mine);
    let total = wtot;
    let on = sget(row, S_P_ON) != 0u;
    let level = sget(row, S_P_LEVEL);
    var sum_f = sgetf(row, S_SUM);
    var goal = sgetf(row, S_TARGET);
    if (level == 0u) {
        sum_f = val64(total);
        goal = rows[row].top_p * sum_f;
    }
    let above = vec2<u32>(sget(row, S_ABOVE_LO), sget(row, S_ABOVE_HI));
    let before = sub64(incl, mine);
    let reach_incl = val64(add64(above, incl)) >= goal;
    let reach_before = val64(add64(above, before)) >= goal;
    if (on && reach_incl && !reach_before) {
        let prefix = sget(row, S_P_PREFIX);
        var cum = add64(above, before);
        var bin = 0u;
        for (var j = 0u; j < 8u; j = j + 1u) {
            let nxt = add64(cum, m[j]);
            if (val64(nxt) >= goal) {
                bin = BINS - 1u - (lid * 8u + j);
                break;
            }
            cum = nxt;
        }
        let np = (prefix << digit_width(level)) | bin;
        sset(row, S_P_PREFIX, np);
        sset(row, S_ABOVE_LO, cum.x);
        sset(row, S_ABOVE_HI, cum.y);
        sset(row, S_P_LEVEL, level + 1u);
        if (level == 0u) {
            ssetf(row, S_SUM, sum_f);
            ssetf(row, S_TARGET, goal);
        }
        if (level == 2u) {
            let t = rows[row].temperature;
            let theta = from_key(np);
            let e = exp_f32(div_rn(theta, t) - sgetf(row, S_YMAX));
            let s_norm = sum_f * TWO_M40;
            ssetf(row, S_TAU_Q, div_rn(e, s_norm));
            sset(row, S_P_CUT, 1u);
        }
    }
    if (on && lid == WG - 1u && !reach_incl) {
        // The sum never reaches p (rounding): every token of K stays.
        sset(row, S_P_ON, 0u);
    }
}

// ---------------------------------------------------------------------------------
// The draw: Gumbel-max over the kept set (or the greedy argmax), and the log-sum-exp.

// Stage-10 membership and y of token i of a sampling row.
struct Member {
    inside: bool,
    y: f32,
}

fn member(z: f32, t: f32, tau_k: f32, tau_min: f32, cut: bool, tau_q: f32, ymax: f32, s_norm: f32) -> Member {
    if (is_neg_inf(z)) {
        return Member(false, neg_inf());
    }
    let y = div_rn(z, t);
    if (cmp_key(y) < cmp_key(tau_k) || cmp_key(y) < cmp_key(tau_min)) {
        return Member(false, y);
    }
    if (cut) {
        let q = div_rn(exp_f32(y - ymax), s_norm);
        if (cmp_key(q) < cmp_key(tau_q)) {
            return Member(false, y);
        }
    }
    return Member(true, y);
}

@compute @workgroup_size(256)
fn draw(@builtin(workgroup_id) wid: vec3<u32>, lanes: Lanes) {
    let lid = lanes.lid;
    lanes_init(lanes);
    let split = wid.x;
    let row = wid.y;
    let rp = rows[row];
    let status = sget(row, S_STATUS);
    let t = rp.temperature;
    let zmax = sgetf(row, S_ZMAX);
    let ymax = sgetf(row, S_YMAX);
    let xmax = sgetf(row, S_XMAX);
    let tau_k = sgetf(row, S_TAU_K);
    let tau_min = sgetf(row, S_TAU_MIN);
    let cut = sget(row, S_P_CUT) != 0u;
    let tau_q = sgetf(row, S_TAU_Q);
    let s_norm = sgetf(row, S_SUM) * TWO_M40;
    let want_lp = (rp.flags & F_LOGPROBS) != 0u;
    let processed = (rp.flags & F_PROCESSED) != 0u;
    let key = vec2<u32>(rp.seed_lo, rp.seed_hi);
    let start = split * call.chunk;
    var end = min(call.vocab, start + call.chunk);
    if (status >= 2u) {
        end = start;
    }
    var best_k = 0u;
    var best_i = 0xffffffffu;
    var acc = vec2<u32>(0u, 0u);
    if (status == 1u) {
        let zmax_key = key_of(zmax);
        for (var i = start + lid; i < end; i = i + WG) {
            let x = load_x(row, i);
            let z = z_from(row, i, x, rp);
            if (best_i == 0xffffffffu && key_of(z) == zmax_key) {
                best_k = 1u;
                best_i = i;
            }
            if (want_lp) {
                if (processed) {
                    acc = add64(acc, fixed40(exp_diff(z, zmax)));
                } else {
                    acc = add64(acc, fixed40(exp_diff(x, xmax)));
                }
            }
        }
    } else {
        // groups of four tokens share one Philox block
        let g0 = start / 4u;
        let g1 = (end + 3u) / 4u;
        for (var g = g0 + lid; g < g1; g = g + WG) {
            var words = vec4<u32>(0u, 0u, 0u, 0u);
            var have = false;
            for (var j = 0u; j < 4u; j = j + 1u) {
                let i = g * 4u + j;
                if (i >= end) {
                    break;
                }
                let x = load_x(row, i);
                let z = z_from(row, i, x, rp);
                let mb = member(z, t, tau_k, tau_min, cut, tau_q, ymax, s_norm);
                if (want_lp && !processed) {
                    acc = add64(acc, fixed40(exp_diff(x, xmax)));
                }
                if (!mb.inside) {
                    continue;
                }
                if (want_lp && processed) {
                    acc = add64(acc, fixed40(exp_f32(mb.y - ymax)));
                }
                if (!have) {
                    words = philox(vec4<u32>(g, rp.step_lo, rp.step_hi, 0u), key);
                    have = true;
                }
                let s = mb.y + gumbel(words[j]);
                let k = cmp_key(s);
                if (k > best_k || (k == best_k && i < best_i)) {
                    best_k = k;
                    best_i = i;
                }
            }
        }
    }
    let r = wg_argmax(lid, best_k, best_i);
    let lse_part = wg_sum64(lid, acc);
    if (lid == 0u) {
        let sb = slot_base(row, split);
        slots[sb + 4u] = r.x;
        slots[sb + 5u] = r.y;
        slots[sb + 48u] = lse_part.x;
        slots[sb + 49u] = lse_part.y;
    }
}

@compute @workgroup_size(256)
fn finish(@builtin(workgroup_id) wid: vec3<u32>, lanes: Lanes) {
    let lid = lanes.lid;
    lanes_init(lanes);
    let row = wid.x;
    var bk = 0u;
    var bi = 0xffffffffu;
    var lse = vec2<u32>(0u, 0u);
    for (var s = lid; s < call.splits; s = s + WG) {
        let sb = slot_base(row, s);
        let k = slots[sb + 4u];
        let i = slots[sb + 5u];
        if (k > bk || (k == bk && i < bi)) {
            bk = k;
            bi = i;
        }
        lse = add64(lse, vec2<u32>(slots[sb + 48u], slots[sb + 49u]));
    }
    let r = wg_argmax(lid, bk, bi);
    let total = val64(wg_sum64(lid, lse)) * TWO_M40;
    if (lid == 0u) {
        let status = sget(row, S_STATUS);
        let rp = rows[row];
        var token = 0u;
        var code = 0u;
        var count = 0u;
        if (status == 2u) {
            code = OUT_NON_FINITE;
            count = sget(row, S_COUNT);
        } else if (status == 3u) {
            code = OUT_NO_CANDIDATE;
        } else if (r.y >= call.vocab) {
            // the kept set is never empty, so this is a defect: a row error, not a token
            code = OUT_NO_WINNER;
            sset(row, S_STATUS, 4u);
        } else {
            token = r.y;
        }
        out_tokens[row] = token;
        out_status[row * 2u] = code;
        out_status[row * 2u + 1u] = count;
        sset(row, S_TOKEN, token);
        ssetf(row, S_LSE, ln_f32(max(total, 1.0)));
        var vmax = sgetf(row, S_XMAX);
        if ((rp.flags & F_PROCESSED) != 0u) {
            if (status == 1u) {
                vmax = sgetf(row, S_ZMAX);
            } else {
                vmax = sgetf(row, S_YMAX);
            }
        }
        ssetf(row, S_VMAX, vmax);
    }
}

// ---------------------------------------------------------------------------------
// Log-probabilities: rank of the chosen token and the n most likely tokens.

// The value log-probabilities are taken of (-inf outside the set).
fn lp_value(row: u32, i: u32, rp: RowP, status: u32) -> f32 {
    let x = load_x(row, i);
    if ((rp.flags & F_PROCESSED) == 0u) {
        return x;
    }
    let z = z_from(row, i, x, rp);
    if (status == 1u) {
        return z;
    }
    let mb = member(
        z,
        rp.temperature,
        sgetf(row, S_TAU_K),
        sgetf(row, S_TAU_MIN),
        sget(row, S_P_CUT) != 0u,
        sgetf(row, S_TAU_Q),
        sgetf(row, S_YMAX),
        sgetf(row, S_SUM) * TWO_M40
    );
    if (!mb.inside) {
        return neg_inf();
    }
    return mb.y;
}

fn before_in_rank(v: f32, i: u32, w: f32, j: u32) -> bool {
    return v > w || (v == w && i < j);
}

@compute @workgroup_size(256)
fn rank_topn(@builtin(workgroup_id) wid: vec3<u32>, lanes: Lanes) {
    let lid = lanes.lid;
    lanes_init(lanes);
    let split = wid.x;
    let row = wid.y;
    let rp = rows[row];
    let status = sget(row, S_STATUS);
    let act = (rp.flags & F_LOGPROBS) != 0u && status <= 1u;
    if (!wg_flag(lid, act)) {
        return;
    }
    let n = min(rp.n_lp, NTOP);
    let token = sget(row, S_TOKEN);
    let start = split * call.chunk;
    var end = min(call.vocab, start + call.chunk);
    if (!act) {
        end = start;
    }
    var vc = 0.0;
    if (act) {
        vc = lp_value(row, token, rp, status);
    }
    var tv: array<f32, 20>;
    var ti: array<u32, 20>;
    var cnt = 0u;
    var before = 0u;
    for (var i = start + lid; i < end; i = i + WG) {
        let v = lp_value(row, i, rp, status);
        if (is_neg_inf(v)) {
            continue;
        }
        if (before_in_rank(v, i, vc, token)) {
            before = before + 1u;
        }
        if (n == 0u) {
            continue;
        }
        if (cnt == n && !before_in_rank(v, i, tv[n - 1u], ti[n - 1u])) {
            continue;
        }
        var p = min(cnt, n - 1u);
        loop {
            if (p == 0u || !before_in_rank(v, i, tv[p - 1u], ti[p - 1u])) {
                break;
            }
            tv[p] = tv[p - 1u];
            ti[p] = ti[p - 1u];
            p = p - 1u;
        }
        tv[p] = v;
        ti[p] = i;
        cnt = min(cnt + 1u, n);
    }
    let total_before = wg_sum_u32(lid, before);
    let sb = slot_base(row, split);
    var h = 0u;
    for (var r = 0u; r < NTOP; r = r + 1u) {
        var k = 0u;
        var idx = 0xffffffffu;
        if (h < cnt) {
            k = key_of(tv[h]);
            idx = ti[h];
        }
        let w = wg_argmax(lid, k, idx);
        if (h < cnt && w.x == k && w.y == idx) {
            h = h + 1u;
        }
        if (lid == 0u) {
            slots[sb + 8u + 2u * r] = w.x;
            slots[sb + 9u + 2u * r] = w.y;
        }
    }
    if (lid == 0u) {
        slots[sb + 7u] = total_before;
    }
}

@compute @workgroup_size(256)
fn finish_lp(@builtin(workgroup_id) wid: vec3<u32>, lanes: Lanes) {
    let lid = lanes.lid;
    lanes_init(lanes);
    let row = wid.x;
    let rp = rows[row];
    let status = sget(row, S_STATUS);
    let act = (rp.flags & F_LOGPROBS) != 0u && status <= 1u;
    if (!wg_flag(lid, act)) {
        return;
    }
    let n = min(rp.n_lp, NTOP);
    var before = 0u;
    for (var s = lid; s < call.splits; s = s + WG) {
        before = before + slots[slot_base(row, s) + 7u];
    }
    let rank = wg_sum_u32(lid, before) + 1u;
    let vmax = sgetf(row, S_VMAX);
    let lse = sgetf(row, S_LSE);
    let ob = row * LPW;
    var h = 0u;
    var listed = 0u;
    for (var r = 0u; r < NTOP; r = r + 1u) {
        var k = 0u;
        var idx = 0xffffffffu;
        if (lid < call.splits && h < NTOP) {
            let sb = slot_base(row, lid);
            k = slots[sb + 8u + 2u * h];
            idx = slots[sb + 9u + 2u * h];
        }
        let w = wg_argmax(lid, k, idx);
        if (lid < call.splits && w.x != 0u && w.x == k && w.y == idx) {
            h = h + 1u;
        }
        if (lid == 0u && act && r < n && w.x != 0u) {
            out_lp[ob + 3u + 2u * listed] = w.y;
            out_lp[ob + 4u + 2u * listed] = bitcast<u32>(fp(from_key(w.x) - vmax) - lse);
            listed = listed + 1u;
        }
    }
    if (lid == 0u && act) {
        let token = sget(row, S_TOKEN);
        let vc = lp_value(row, token, rp, status);
        out_lp[ob] = bitcast<u32>(fp(vc - vmax) - lse);
        out_lp[ob + 1u] = rank;
        out_lp[ob + 2u] = listed;
    }
}

// ---------------------------------------------------------------------------------
// Many draws of one row: tokens at steps step .. step + draws - 1 from the same kept set
// (the filters do not depend on the step). `draw_lanes` invocations share one draw, each
// taking every draw_lanes-th group of four tokens, so that no invocation loops over a
// whole large row; a workgroup holds DRAW_WG / draw_lanes draws of one row. The tokens
// go to out_lp[row * draws + d] (this mode reports no log-probabilities); a draw that
// finds no winner writes NO_TOKEN, which the launcher reports as a row error.

@compute @workgroup_size(256)
fn draw_many(@builtin(workgroup_id) wid: vec3<u32>, lanes: Lanes) {
    let lid = lanes.lid;
    lanes_init(lanes);
    let per = call.draw_lanes;
    let lane = lid % per;
    let d = wid.x * (DRAW_WG / per) + lid / per;
    let row = wid.y;
    let status = sget(row, S_STATUS);
    let rp = rows[row];
    let step_lo = rp.step_lo + d;
    var step_hi = rp.step_hi;
    if (step_lo < d) {
        step_hi = step_hi + 1u;
    }
    let key = vec2<u32>(rp.seed_lo, rp.seed_hi);
    let t = rp.temperature;
    let ymax = sgetf(row, S_YMAX);
    let tau_k = sgetf(row, S_TAU_K);
    let tau_min = sgetf(row, S_TAU_MIN);
    let cut = sget(row, S_P_CUT) != 0u;
    let tau_q = sgetf(row, S_TAU_Q);
    let s_norm = sgetf(row, S_SUM) * TWO_M40;
    var best_k = 0u;
    var best_i = NO_TOKEN;
    var groups = (call.vocab + 3u) / 4u;
    if (d >= call.draws || status != 0u) {
        groups = 0u;
    }
    for (var g = lane; g < groups; g = g + per) {
        var words = vec4<u32>(0u, 0u, 0u, 0u);
        var have = false;
        for (var j = 0u; j < 4u; j = j + 1u) {
            let i = g * 4u + j;
            if (i >= call.vocab) {
                break;
            }
            let z = z_from(row, i, load_x(row, i), rp);
            let mb = member(z, t, tau_k, tau_min, cut, tau_q, ymax, s_norm);
            if (!mb.inside) {
                continue;
            }
            if (!have) {
                words = philox(vec4<u32>(g, step_lo, step_hi, 0u), key);
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
        out_lp[row * call.draws + d] = token;
    }
}
