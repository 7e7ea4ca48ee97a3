// decoda's device sampler: one decode step of the sampling contract (README, "The
// sampling contract") for B rows, each row sampled for a slot whose parameters, seed,
// step and history live on the device. The launcher records the same five dispatches
// whatever the data:
//
//   probe  (1 x B)  per-call rows first scatter their history into their slot's bitmaps
//                   and counts; then a 1/16 sample of the row gives the threshold above
//                   which the scan keeps candidates, and the reference of the top-p mass
//   scan   (W x B)  read 1 of the row: z (bias, penalties from the slot's bitmaps and
//                   counts), max, argmax and non-finite counts, the Gumbel draw of rows
//                   without filters, the candidates, and the exact top-p mass of the row
//   settle (1 x B)  the row's status; sorts the candidates and applies top-k, top-p and
//                   min-p to them, draws, and computes processed log-probabilities; a row
//                   whose candidates cannot settle it takes the exact full-row path here
//                   (radix selects over the whole row by this one workgroup)
//   lp     (W x B)  read 2, only for rows that need it: raw (or unfiltered) log-sum-exp,
//                   rank and top-n, and the draw of full-row-path rows
//   finish (1 x B)  results; with a head, advances the slot (step, count, presence,
//                   stop conditions); per-call rows clear their history again
//
// (`draw_many` may follow settle: many draws of the same rows at consecutive steps.)
// The arithmetic that decides tokens is in fmath.wgsl; the workgroup reductions in
// reduce_wg.wgsl or reduce_sg.wgsl, appended by the launcher.
//
// Candidates: the tokens whose y is at least a threshold kappa chosen from the sample
// (so that about 512, 1,024 for top-p alone, or twice top-k, tokens pass), or, for
// min-p, at least m0 + ln(min_p) with m0 the sample's max. The list is complete above
// its threshold, so top-k, top-p and min-p, whose kept sets are all tokens above a
// value of y, are exact on it whenever their boundary lies above the threshold;
// otherwise (or when more tokens pass than the list holds) the row takes the full-row
// path. Top-p masses are exp(y - R) in 96-bit fixed point (units of 2^-72) against a
// reference R = m0 + 20 taken from the sample: integer sums, so they do not depend on
// the order, the split of the row or the batch.

const WG: u32 = 256u;
const DRAW_WG: u32 = 256u;  // invocations of a draw_many workgroup
const BINS: u32 = 2048u;
const HW: u32 = 6144u;      // radix histogram words per row (full-row path)
const ST: u32 = 64u;        // state words per row
const PW: u32 = 64u;        // partial words per (row, split)
const NTOP: u32 = 20u;      // most top log-probabilities a row may ask for
const LPW: u32 = 44u;       // log-probability words per row
const RESW: u32 = 46u;      // result words per row: status, count, then LPW
const SSW: u32 = 8u;        // slot state words
const NEG_INF_BITS: u32 = 0xff800000u;
const TWO_M40: f32 = 9.094947017729282e-13; // 2^-40
const GUMBEL_MAX: f32 = 17.0;               // above every Gumbel value the noise can take
const R_HEADROOM: f32 = 20.0;               // R = m0 + 20: the top-p mass reference
const LIST_TARGET: u32 = 512u;              // candidates the threshold aims at

// out_res status codes
const OUT_NON_FINITE: u32 = 1u;
const OUT_NO_CANDIDATE: u32 = 2u;
const OUT_NO_WINNER: u32 = 3u;
const OUT_FINISHED: u32 = 4u;
const NO_TOKEN: u32 = 0xffffffffu;

// state word offsets (per row)
const S_STATUS: u32 = 0u;    // 0 sample, 1 greedy, 2 non-finite, 3 no candidate, 4 no winner, 5 finished slot
const S_COUNT: u32 = 1u;
const S_ZMAX: u32 = 2u;
const S_YMAX: u32 = 3u;
const S_XMAX: u32 = 4u;
const S_KAPPA: u32 = 5u;     // cmp_key of the candidate threshold on y (0: every token)
const S_GTHR: u32 = 6u;      // min-p gathering threshold on y (-inf: none)
const S_R: u32 = 7u;         // top-p mass reference (0 bits: none)
const S_NEED: u32 = 8u;      // N_* flags
const S_TOKEN: u32 = 9u;
const S_PATH: u32 = 10u;     // P_* : how the row is drawn
const S_NS: u32 = 11u;       // list path: kept tokens (a prefix of the sorted list)
const S_TAU_K: u32 = 12u;    // full-row path thresholds (`member`)
const S_TAU_MIN: u32 = 13u;
const S_P_CUT: u32 = 14u;
const S_TAU_Q: u32 = 15u;
const S_SUM: u32 = 16u;      // full-row path: top-p normaliser in 2^-40 units, as f32
const S_LSE: u32 = 17u;
const S_VMAX: u32 = 18u;
const S_LP: u32 = 19u;       // 1: the lp pass computes this row's log-probabilities
const S_LP_DONE: u32 = 20u;  // 1: settle wrote them
const S_K_LEVEL: u32 = 21u;  // full-row radix selects
const S_K_PREFIX: u32 = 22u;
const S_K_REM: u32 = 23u;
const S_P_LEVEL: u32 = 24u;
const S_P_PREFIX: u32 = 25u;
const S_ABOVE_LO: u32 = 26u;
const S_ABOVE_HI: u32 = 27u;
const S_TARGET: u32 = 28u;
const S_SLOT: u32 = 29u;
const S_M0: u32 = 30u;

// S_NEED flags
const N_LIST: u32 = 1u;
const N_SIGMA: u32 = 2u;

// S_PATH values
const P_DONE: u32 = 0u;      // token known after settle (greedy, unfiltered, list path)
const P_FULL: u32 = 1u;      // drawn over the whole row in lp, with `member`
const P_NONE: u32 = 2u;      // no token (row error)

// slot flags (SlotP.flags)
const F_TOUCH: u32 = 1u;
const F_LOGPROBS: u32 = 2u;
const F_PROCESSED: u32 = 4u;
const F_TOP_P: u32 = 8u;
const F_TOP_K: u32 = 16u;
const F_MIN_P: u32 = 32u;

// Call.mode bits
const M_HEAD: u32 = 1u;      // advance the slot state in finish
const M_SCATTER: u32 = 2u;   // per-call rows: scatter the history in probe, clear it in finish

struct Call {
    rows: u32,
    vocab: u32,
    stride: u32,      // elements between rows
    dtype: u32,       // 0 f32, 1 f16, 2 bf16
    base: u32,        // element offset of row 0
    splits: u32,      // workgroups per row in scan and lp
    chunk: u32,       // logits per split, a multiple of 4
    bm_words: u32,    // bitmap words per slot
    cap: u32,         // candidates per row (a power of two)
    mode: u32,        // M_* bits
    draws: u32,       // draw_many only
    draw_lanes: u32,  // draw_many: invocations sharing one draw (a power of two)
    part_base: u32,   // work offset of the (row, split) partials
    cand_base: u32,   // work offset of the candidate lists
    zero: u32,        // always 0 (fp, in fmath.wgsl)
    pad: u32,
}

struct SlotP {
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
    n_lp: u32,
    bias_off: u32,    // lists offset of (token, bias bits) pairs, sorted by token
    bias_len: u32,
    stop_off: u32,    // lists offset of stop token ids
    stop_len: u32,
    hist_off: u32,    // lists offset of the history to scatter: token | 1 << 31 for outputs
    hist_len: u32,
    max_lo: u32,      // max_tokens (0xffffffff both: none)
    max_hi: u32,
    pen_slot: u32,    // which penalty area (per-call rows with a history get their own)
}

@group(0) @binding(0) var<uniform> call: Call;
@group(0) @binding(1) var<storage, read> logits: array<u32>;
@group(0) @binding(2) var<storage, read> sparams: array<SlotP>;
@group(0) @binding(3) var<storage, read_write> sstate: array<u32>;
@group(0) @binding(4) var<storage, read> rmap: array<u32>;
@group(0) @binding(5) var<storage, read_write> pen: array<atomic<u32>>;
@group(0) @binding(6) var<storage, read> lists: array<u32>;
@group(0) @binding(7) var<storage, read_write> work: array<u32>;
@group(0) @binding(8) var<storage, read_write> ctr: array<atomic<u32>>;
@group(0) @binding(9) var<storage, read_write> out_tokens: array<u32>;
@group(0) @binding(10) var<storage, read_write> out_res: array<u32>;

var<workgroup> ra: array<u32, 256>;
var<workgroup> rb: array<u32, 256>;
var<workgroup> wtot: vec2<u32>;
var<workgroup> wflag: u32;
var<workgroup> wsum: vec3<u32>;
var<workgroup> hk: array<atomic<u32>, 2048>;

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

// Words of one slot's penalty area: seen bitmap, bias bitmap, output counts.
fn pen_base(pen_slot: u32) -> u32 {
    return pen_slot * (2u * call.bm_words + call.vocab);
}

// The bias of token i from the slot's sorted (token, bias) list.
fn bias_of(sp: SlotP, i: u32) -> f32 {
    var lo = 0u;
    var hi = sp.bias_len;
    loop {
        if (lo >= hi) {
            break;
        }
        let mid = (lo + hi) / 2u;
        let t = lists[sp.bias_off + 2u * mid];
        if (t == i) {
            return bitcast<f32>(lists[sp.bias_off + 2u * mid + 1u]);
        }
        if (t < i) {
            lo = mid + 1u;
        } else {
            hi = mid;
        }
    }
    return 0.0;
}

// z of token i (stages 1-3): the logit with its bias, repetition, frequency and presence
// penalties, read from the slot's bitmaps and counts.
fn z_of(slot: u32, sp: SlotP, i: u32, x: f32) -> f32 {
    if ((sp.flags & F_TOUCH) == 0u) {
        return x;
    }
    let pb = pen_base(sparams[slot].pen_slot);
    let w = i >> 5u;
    let bit = 1u << (i & 31u);
    let seen = (atomicLoad(&pen[pb + w]) & bit) != 0u;
    let biased = (atomicLoad(&pen[pb + call.bm_words + w]) & bit) != 0u;
    if (!seen && !biased) {
        return x;
    }
    var z = x;
    if (biased) {
        let b = bias_of(sp, i);
        if (is_neg_inf(b)) {
            z = neg_inf();
        } else if (!is_neg_inf(x)) {
            z = x + b;
        }
    }
    // -inf stays -inf through the penalties (and is kept out of the arithmetic)
    if (seen && !is_neg_inf(z)) {
        if (z > 0.0) {
            z = div_rn(z, sp.rep);
        } else {
            z = z * sp.rep;
        }
        let c = atomicLoad(&pen[pb + 2u * call.bm_words + i]);
        if (c > 0u) {
            z = fp(z - fp(sp.freq * f32(c))) - sp.pres;
        }
    }
    return z;
}

fn sget(row: u32, w: u32) -> u32 {
    return work[row * ST + w];
}

fn sgetf(row: u32, w: u32) -> f32 {
    return bitcast<f32>(work[row * ST + w]);
}

fn sset(row: u32, w: u32, v: u32) {
    work[row * ST + w] = v;
}

fn ssetf(row: u32, w: u32, v: f32) {
    work[row * ST + w] = bitcast<u32>(v);
}

fn part(row: u32, split: u32) -> u32 {
    return call.part_base + (row * call.splits + split) * PW;
}

fn cand(row: u32) -> u32 {
    return call.cand_base + row * call.cap * 2u;
}

// Radix histogram words of a row (full-row path), in `ctr` after the counters.
fn hbase(row: u32) -> u32 {
    return 2u * call.rows + row * HW;
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

fn add96(a: vec3<u32>, b: vec3<u32>) -> vec3<u32> {
    let lo = add64(vec2<u32>(a.x, 0u), vec2<u32>(b.x, 0u));
    let hi = add64(vec2<u32>(a.y, a.z), vec2<u32>(b.y, b.z));
    return vec3<u32>(lo.x, add64(hi, vec2<u32>(lo.y, 0u)));
}

fn sub96(a: vec3<u32>, b: vec3<u32>) -> vec3<u32> {
    let lo = sub64(vec2<u32>(a.x, 0u), vec2<u32>(b.x, 0u));
    // lo.y is 0 or 0xffffffff (a borrow)
    var hi = sub64(vec2<u32>(a.y, a.z), vec2<u32>(b.y, b.z));
    if (lo.y != 0u) {
        hi = sub64(hi, vec2<u32>(1u, 0u));
    }
    return vec3<u32>(lo.x, hi);
}

fn val96(a: vec3<u32>) -> f32 {
    return fp(fp(f32(a.z) * 18446744073709551616.0) + fp(f32(a.y) * 4294967296.0)) + f32(a.x);
}

// a > b
fn gt96(a: vec3<u32>, b: vec3<u32>) -> bool {
    if (a.z != b.z) {
        return a.z > b.z;
    }
    if (a.y != b.y) {
        return a.y > b.y;
    }
    return a.x > b.x;
}

// A weight in [0, 1] in 64-bit fixed point, units of 2^-40 (truncated).
fn fixed40(e: f32) -> vec2<u32> {
    let f = e * 256.0;
    let hi = u32(f);
    return vec2<u32>(u32((f - f32(hi)) * 4294967296.0), hi);
}

// A weight in [0, 1] in 96-bit fixed point, units of 2^-72 (truncated), from its bits.
fn fixed72(e: f32) -> vec3<u32> {
    let b = bitcast<u32>(e);
    let ex = (b >> 23u) & 0xffu;
    if (ex == 0u || (b & 0x80000000u) != 0u) {
        return vec3<u32>(0u, 0u, 0u);
    }
    let m = (b & 0x7fffffu) | 0x800000u;
    // e * 2^72 = m * 2^(ex - 127 - 23 + 72)
    let s = i32(ex) - 78;
    if (s <= -24) {
        return vec3<u32>(0u, 0u, 0u);
    }
    if (s < 0) {
        return vec3<u32>(m >> u32(-s), 0u, 0u);
    }
    let us = u32(s);
    if (us < 32u) {
        var hi = 0u;
        if (us > 0u) {
            hi = m >> (32u - us);
        }
        return vec3<u32>(m << us, hi, 0u);
    }
    let t = us - 32u;
    var hi2 = 0u;
    if (t > 0u) {
        hi2 = m >> (32u - t);
    }
    return vec3<u32>(0u, m << t, hi2);
}

// ---------------------------------------------------------------------------------
// Workgroup helpers (call from uniform control flow).

// `on` of invocation 0, known to the whole workgroup as a uniform value: lets a
// workgroup skip a kernel's work (barriers included) for a row that has nothing to do.
fn wg_flag(lid: u32, on: bool) -> bool {
    if (lid == 0u) {
        wflag = select(0u, 1u, on);
    }
    return workgroupUniformLoad(&wflag) != 0u;
}

// `v` of invocation 0 as a uniform value.
fn wg_uniform(lid: u32, v: u32) -> u32 {
    if (lid == 0u) {
        wflag = v;
    }
    return workgroupUniformLoad(&wflag);
}

// wg_argmax, wg_sum_max, wg_sum_u32 and wg_sum64 come from reduce_wg.wgsl
// (workgroup memory) or reduce_sg.wgsl (subgroup operations), appended by the launcher.

fn wg_sum96(lid: u32, v: vec3<u32>) -> vec3<u32> {
    let a = wg_sum64(lid, vec2<u32>(v.x, 0u));
    let b = wg_sum64(lid, vec2<u32>(v.y, v.z));
    return vec3<u32>(a.x, add64(b, vec2<u32>(a.y, 0u)));
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

// Philox word of token i of a slot at a step (stream 0).
fn noise_word(i: u32, seed: vec2<u32>, step_lo: u32, step_hi: u32) -> u32 {
    let w = philox(vec4<u32>(i / 4u, step_lo, step_hi, 0u), seed);
    return w[i % 4u];
}

// An upper bound of the Gumbel noise of word x, from the exponent of 1 - u alone:
// -ln(-ln u) <= -ln(1 - u) <= (24 - floor(log2 n)) ln 2 where 1 - u = n 2^-24; with a
// margin for the rounding of the computed noise.
fn gumbel_bound(x: u32) -> f32 {
    let n = 16777215u - 2u * (x >> 9u);
    let lg = 31u - countLeadingZeros(n);
    return f32(24u - lg) * 0.6931472 + 0.01;
}

// The slot's step as two words.
fn step_of(slot: u32) -> vec2<u32> {
    return vec2<u32>(sstate[slot * SSW], sstate[slot * SSW + 1u]);
}

// Whether the row's temperature makes it greedy before the data is seen (T < 1e-5).
fn cold(sp: SlotP) -> bool {
    return sp.temperature < 1e-5;
}

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

// A head's leave: zeroes the penalty area of slot rmap[0] (grid: its words / 256).
@compute @workgroup_size(256)
fn wipe(@builtin(workgroup_id) wid: vec3<u32>, lanes: Lanes) {
    let lid = lanes.lid;
    lanes_init(lanes);
    let slot = rmap[0];
    let n = 2u * call.bm_words + call.vocab;
    let w = (wid.x + wid.y * 65535u) * WG + lid;
    if (w < n) {
        atomicStore(&pen[pen_base(sparams[slot].pen_slot) + w], 0u);
    }
}

// ---------------------------------------------------------------------------------
// probe: the candidate threshold and the top-p reference from a sample of the row.

// cmp_key of y for token i, or 0 when the token is no candidate (NaN, +inf, -inf).
fn sample_key(row: u32, slot: u32, sp: SlotP, i: u32) -> u32 {
    let x = load_x(row, i);
    if (is_bad(x)) {
        return 0u;
    }
    let z = z_of(slot, sp, i, x);
    if (is_bad(z) || is_neg_inf(z)) {
        return 0u;
    }
    return cmp_key(div_rn(z, sp.temperature));
}

// The sample: runs of 16 logits every 256 (coalesced, 1/16 of the row).
fn sample_index(u: u32) -> u32 {
    return (u / 16u) * 256u + (u % 16u);
}

@compute @workgroup_size(256)
fn probe(@builtin(workgroup_id) wid: vec3<u32>, lanes: Lanes) {
    let lid = lanes.lid;
    lanes_init(lanes);
    let row = wid.x;
    let slot = rmap[row];
    let sp = sparams[slot];
    if ((call.mode & M_SCATTER) != 0u) {
        scatter(slot, sp, lid, false);
        storageBarrier();
    }
    if (lid == 0u) {
        atomicStore(&ctr[2u * row], 0u);
        atomicStore(&ctr[2u * row + 1u], 0u);
    }
    let filt = (sp.flags & (F_TOP_K | F_TOP_P | F_MIN_P)) != 0u && !cold(sp);
    let sigma = filt && (sp.flags & F_TOP_P) != 0u && (sp.flags & F_TOP_K) == 0u;
    var kappa = 0u;
    var m0k = 0u;
    if (wg_flag(lid, filt)) {
        for (var b = lid; b < BINS; b = b + WG) {
            atomicStore(&hk[b], 0u);
        }
        workgroupBarrier();
        let ns = ((call.vocab + 255u) / 256u) * 16u;
        var mk = 0u;
        var cnt = 0u;
        for (var u = lid; u < ns; u = u + WG) {
            let i = sample_index(u);
            if (i >= call.vocab) {
                continue;
            }
            let k = sample_key(row, slot, sp, i);
            if (k != 0u) {
                mk = max(mk, k);
                cnt = cnt + 1u;
                atomicAdd(&hk[k >> 21u], 1u);
            }
        }
        workgroupBarrier();
        let mx = wg_sum_max(lid, cnt, mk);
        m0k = mx.y;
        var goal_n = LIST_TARGET;
        if ((sp.flags & F_TOP_K) != 0u) {
            goal_n = max(goal_n, 2u * min(sp.top_k, call.cap));
        }
        // top-p alone: nuclei of several hundred tokens are common (p 0.9 on a 131k
        // vocabulary), and a row whose nucleus the list misses takes the full-row path,
        // which the whole batch waits for (on an H200: top-p 0.9 at B = 32, 1.5 ms with
        // 512 candidates, 0.37 ms with 1,024)
        if (sigma) {
            goal_n = max(goal_n, min(2u * LIST_TARGET, call.cap / 2u));
        }
        let r = (goal_n + 15u) / 16u;
        // rows the list holds whole, or too few valid samples: every token is a candidate
        let whole = wg_flag(lid, call.vocab <= call.cap || mx.x <= r);
        if (!whole) {
            // level 0: the 11-bit bin holding the r-th largest sampled key
            let b0 = pick_bin(lid, r);
            let left = workgroupUniformLoad(&wtot).y;
            for (var b = lid; b < BINS; b = b + WG) {
                atomicStore(&hk[b], 0u);
            }
            workgroupBarrier();
            for (var u = lid; u < ns; u = u + WG) {
                let i = sample_index(u);
                if (i >= call.vocab) {
                    continue;
                }
                let k = sample_key(row, slot, sp, i);
                if (k != 0u && (k >> 21u) == b0) {
                    atomicAdd(&hk[(k >> 10u) & 0x7ffu], 1u);
                }
            }
            workgroupBarrier();
            let b1 = pick_bin(lid, left);
            kappa = (b0 << 21u) | (b1 << 10u);
        }
    }
    if (lid == 0u) {
        var need = 0u;
        if (filt) {
            need = need | N_LIST;
        }
        sset(row, S_KAPPA, kappa);
        let m0 = from_key(m0k);
        var r_ref = neg_inf();
        var gthr = neg_inf();
        if (m0k != 0u && !not_finite(m0)) {
            if (sigma) {
                need = need | N_SIGMA;
                r_ref = m0 + R_HEADROOM;
            }
            if ((sp.flags & F_MIN_P) != 0u) {
                gthr = m0 + sp.ln_min_p;
            }
        }
        sset(row, S_NEED, need);
        ssetf(row, S_R, r_ref);
        ssetf(row, S_GTHR, gthr);
        ssetf(row, S_M0, m0);
        sset(row, S_SLOT, slot);
    }
}

// The bin (of hk, counted from the top) where the cumulative count reaches `want`;
// leaves in wtot.y how many are still wanted inside that bin. Uniform result.
fn pick_bin(lid: u32, want: u32) -> u32 {
    var cnts: array<u32, 8>;
    var mine = 0u;
    for (var j = 0u; j < 8u; j = j + 1u) {
        let c = atomicLoad(&hk[BINS - 1u - (lid * 8u + j)]);
        cnts[j] = c;
        mine = mine + c;
    }
    let incl = wg_scan64(lid, vec2<u32>(mine, 0u)).x;
    let before = incl - mine;
    if (before < want && want <= incl) {
        var cum = before;
        for (var j = 0u; j < 8u; j = j + 1u) {
            if (want <= cum + cnts[j]) {
                wflag = BINS - 1u - (lid * 8u + j);
                wtot = vec2<u32>(0u, want - cum);
                break;
            }
            cum = cum + cnts[j];
        }
    }
    return workgroupUniformLoad(&wflag);
}

// ---------------------------------------------------------------------------------
// scan: read 1.

@compute @workgroup_size(256)
fn scan(@builtin(workgroup_id) wid: vec3<u32>, lanes: Lanes) {
    let lid = lanes.lid;
    lanes_init(lanes);
    let split = wid.x;
    let row = wid.y;
    let slot = rmap[row];
    let sp = sparams[slot];
    let t = sp.temperature;
    let isc = cold(sp);
    let need = sget(row, S_NEED);
    let kappa = sget(row, S_KAPPA);
    let gkey = cmp_key(sgetf(row, S_GTHR));
    let minp = (sp.flags & F_MIN_P) != 0u && !is_neg_inf(sgetf(row, S_GTHR));
    let r_ref = sgetf(row, S_R);
    let rkey = cmp_key(r_ref);
    let unf = !isc && (sp.flags & (F_TOP_K | F_TOP_P | F_MIN_P)) == 0u;
    let stp = step_of(slot);
    let seed = vec2<u32>(sp.seed_lo, sp.seed_hi);
    let lst = cand(row);
    var zk = 0u;
    var zi = NO_TOKEN;
    var xk = 0u;
    var bad_x = 0u;
    var bad_z = 0u;
    var bk = 0u;
    var bi = NO_TOKEN;
    var sig = vec3<u32>(0u, 0u, 0u);
    var over = 0u;
    let start = split * call.chunk;
    let end = min(call.vocab, start + call.chunk);
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
            if (is_bad(x)) {
                bad_x = bad_x + 1u;
            } else {
                xk = max(xk, key_of(x));
            }
            let z = z_of(slot, sp, i, x);
            if (is_bad(z)) {
                bad_z = bad_z + 1u;
                continue;
            }
            let kz = cmp_key(z);
            if (kz > zk || (kz == zk && i < zi)) {
                zk = kz;
                zi = i;
            }
            if (is_neg_inf(z) || isc) {
                continue;
            }
            let y = div_rn(z, t);
            let yk = cmp_key(y);
            if ((need & N_LIST) != 0u && (yk >= kappa || (minp && yk >= gkey))) {
                let at = atomicAdd(&ctr[2u * row], 1u);
                if (at < call.cap) {
                    work[lst + 2u * at] = i;
                    work[lst + 2u * at + 1u] = bitcast<u32>(y);
                }
            }
            if ((need & N_SIGMA) != 0u) {
                if (yk > rkey) {
                    over = 1u;
                } else {
                    sig = add96(sig, fixed72(exp_f32(y - r_ref)));
                }
            }
            if (unf) {
                // tokens that cannot beat this invocation's best skip the noise
                if (bi != NO_TOKEN && cmp_key(y + GUMBEL_MAX) < bk) {
                    continue;
                }
                if (!have) {
                    words = philox(vec4<u32>(g, stp.x, stp.y, 0u), seed);
                    have = true;
                }
                let w = words[j];
                if (bi != NO_TOKEN && cmp_key(y + gumbel_bound(w)) < bk) {
                    continue;
                }
                let sk = cmp_key(y + gumbel(w));
                if (sk > bk || (sk == bk && i < bi)) {
                    bk = sk;
                    bi = i;
                }
            }
        }
    }
    let a = wg_sum_max(lid, bad_x, xk);
    let bz = wg_sum_u32(lid, bad_z);
    let zm = wg_argmax(lid, zk, zi);
    let dr = wg_argmax(lid, bk, bi);
    let s96 = wg_sum96(lid, sig);
    let ov = wg_sum_u32(lid, over);
    if (lid == 0u) {
        let pb = part(row, split);
        work[pb + 0u] = a.x;
        work[pb + 1u] = bz;
        work[pb + 2u] = a.y;
        work[pb + 3u] = zm.x;
        work[pb + 4u] = zm.y;
        work[pb + 5u] = dr.x;
        work[pb + 6u] = dr.y;
        work[pb + 7u] = s96.x;
        work[pb + 8u] = s96.y;
        work[pb + 9u] = s96.z;
        work[pb + 10u] = ov;
    }
}

// ---------------------------------------------------------------------------------
// settle: status, filters on the candidates (or the full row), the draw.

// Candidate j of the row's list: (token, y).
fn entry(row: u32, j: u32) -> vec2<u32> {
    let b = cand(row) + 2u * j;
    return vec2<u32>(work[b], work[b + 1u]);
}

// Whether candidate a comes before b: larger y first, then the smaller id.
fn before_entry(a: vec2<u32>, b: vec2<u32>) -> bool {
    let ka = cmp_key(bitcast<f32>(a.y));
    let kb = cmp_key(bitcast<f32>(b.y));
    return ka > kb || (ka == kb && a.x < b.x);
}

// Sorts the first n candidates of the row (bitonic, in place; n <= cap, uniform).
fn sort_list(lid: u32, row: u32, n: u32) {
    var np = 1u;
    while (np < n) {
        np = np << 1u;
    }
    let b = cand(row);
    // padding sorts last: id NO_TOKEN, y -inf
    for (var j = n + lid; j < np; j = j + WG) {
        work[b + 2u * j] = NO_TOKEN;
        work[b + 2u * j + 1u] = NEG_INF_BITS;
    }
    storageBarrier();
    for (var k = 2u; k <= np; k = k << 1u) {
        for (var jj = k >> 1u; jj > 0u; jj = jj >> 1u) {
            for (var t = lid; t < np; t = t + WG) {
                let l = t ^ jj;
                if (l > t) {
                    let a = entry(row, t);
                    let c = entry(row, l);
                    let first = (t & k) == 0u;
                    if (first == before_entry(c, a)) {
                        work[b + 2u * t] = c.x;
                        work[b + 2u * t + 1u] = c.y;
                        work[b + 2u * l] = a.x;
                        work[b + 2u * l + 1u] = a.y;
                    }
                }
            }
            storageBarrier();
        }
    }
}

// Candidates among the first n whose y key is at least `key` (uniform).
fn count_at_least(lid: u32, row: u32, n: u32, key: u32) -> u32 {
    var c = 0u;
    for (var j = lid; j < n; j = j + WG) {
        if (cmp_key(bitcast<f32>(entry(row, j).y)) >= key) {
            c = c + 1u;
        }
    }
    return wg_uniform(lid, wg_sum_u32(lid, c));
}

// Inclusive prefix sum of 96-bit values in thread order; the total in the .w of the
// returned pair's second member is not kept: callers add up tiles themselves.
fn wg_scan96(lid: u32, v: vec3<u32>) -> vec3<u32> {
    let lo = wg_scan64(lid, vec2<u32>(v.x, 0u));
    let hi = wg_scan64(lid, vec2<u32>(v.y, v.z));
    return vec3<u32>(lo.x, add64(hi, vec2<u32>(lo.y, 0u)));
}

// The list path of a filtered row: true when the candidates settle it (then the token is
// in S_TOKEN, and the kept set is the first S_NS candidates).
fn settle_list(lid: u32, row: u32, slot: u32, sp: SlotP, n: u32, ymax: f32, s96: vec3<u32>) -> bool {
    sort_list(lid, row, n);
    let tk = wg_flag(lid, (sp.flags & F_TOP_K) != 0u);
    let tp = wg_flag(lid, (sp.flags & F_TOP_P) != 0u);
    let mp = wg_flag(lid, (sp.flags & F_MIN_P) != 0u);
    let top_k = wg_uniform(lid, sp.top_k);
    let kappa = wg_uniform(lid, sget(row, S_KAPPA));
    let complete = kappa == 0u;
    // top-k: the k-th largest y, if the list holds k tokens
    var n_k = n;
    var k_ok = false;
    if (tk && top_k <= n) {
        let tau = wg_uniform(lid, cmp_key(bitcast<f32>(entry(row, top_k - 1u).y)));
        n_k = count_at_least(lid, row, n, tau);
        k_ok = true;
    }
    // min-p: y >= ymax + ln(min_p); the list holds every y >= m0 + ln(min_p) <= that
    var n_m = n;
    var m_ok = false;
    if (mp) {
        n_m = count_at_least(lid, row, n, wg_uniform(lid, cmp_key(ymax + sp.ln_min_p)));
        m_ok = !is_neg_inf(sgetf(row, S_GTHR));
    }
    // top-p over K: walk the candidates in order until their mass reaches p of K's
    var n_p = n_k;
    var p_ok = false;
    var p_covers = false;
    if (tp && (!tk || k_ok)) {
        var r_ref = sgetf(row, S_R);
        var total = s96;
        if (tk) {
            // K lies in the list: its mass, against ymax
            r_ref = ymax;
            var part_sum = vec3<u32>(0u, 0u, 0u);
            for (var j = lid; j < n_k; j = j + WG) {
                part_sum = add96(part_sum, fixed72(exp_f32(bitcast<f32>(entry(row, j).y) - r_ref)));
            }
            total = wg_sum96(lid, part_sum);
        }
        let goal = sp.top_p * val96(total);
        var above = vec3<u32>(0u, 0u, 0u);
        var m = NO_TOKEN;
        for (var tile = 0u; tile < n_k; tile = tile + WG) {
            let j = tile + lid;
            var e = vec3<u32>(0u, 0u, 0u);
            if (j < n_k) {
                e = fixed72(exp_f32(bitcast<f32>(entry(row, j).y) - r_ref));
            }
            let incl = wg_scan96(lid, e);
            if (lid == 0u) {
                wflag = NO_TOKEN;
            }
            if (lid == WG - 1u) {
                wsum = incl;
            }
            workgroupBarrier();
            let reach = val96(add96(above, incl)) >= goal;
            let reach_before = val96(add96(above, sub96(incl, e))) >= goal;
            if (j < n_k && reach && !reach_before) {
                wflag = j;
            }
            m = workgroupUniformLoad(&wflag);
            if (m != NO_TOKEN) {
                break;
            }
            above = add96(above, wsum);
            workgroupBarrier();
        }
        if (m != NO_TOKEN) {
            let em = fixed72(exp_f32(bitcast<f32>(entry(row, m).y) - r_ref));
            var c = 0u;
            for (var j = lid; j < n_k; j = j + WG) {
                let e = fixed72(exp_f32(bitcast<f32>(entry(row, j).y) - r_ref));
                if (!gt96(em, e)) {
                    c = c + 1u;
                }
            }
            n_p = wg_uniform(lid, wg_sum_u32(lid, c));
            if (tk || complete) {
                p_ok = true;
            } else {
                // every token left out has y below the threshold: its mass is at most
                // that of the largest y under it, which must be below the cut's
                let eb = fixed72(exp_f32(from_key(kappa - 1u) - r_ref));
                p_ok = gt96(em, eb);
            }
            p_covers = p_ok;
        } else if (tk || complete) {
            // the sum never reaches p (rounding): every token of K stays
            p_ok = true;
            n_p = n_k;
        }
    }
    let covered = (tk && k_ok) || p_covers || (mp && m_ok) || complete;
    let valid = wg_flag(lid, (!tp || p_ok) && covered);
    if (!valid) {
        return false;
    }
    let n_s = min(min(n_k, n_p), n_m);
    // the draw: Gumbel-max over the kept prefix
    let stp = step_of(slot);
    let seed = vec2<u32>(sp.seed_lo, sp.seed_hi);
    var bk = 0u;
    var bi = NO_TOKEN;
    for (var j = lid; j < n_s; j = j + WG) {
        let en = entry(row, j);
        let sk = cmp_key(bitcast<f32>(en.y) + gumbel(noise_word(en.x, seed, stp.x, stp.y)));
        if (sk > bk || (sk == bk && en.x < bi)) {
            bk = sk;
            bi = en.x;
        }
    }
    let w = wg_argmax(lid, bk, bi);
    // processed log-probabilities over the kept set (the list holds all of it)
    let lp_on = (sp.flags & F_LOGPROBS) != 0u && (sp.flags & F_PROCESSED) != 0u;
    var lse = 0.0;
    var pos = NO_TOKEN;
    if (wg_flag(lid, lp_on)) {
        var acc = vec2<u32>(0u, 0u);
        var at = NO_TOKEN;
        for (var j = lid; j < n_s; j = j + WG) {
            let en = entry(row, j);
            acc = add64(acc, fixed40(exp_diff(bitcast<f32>(en.y), ymax)));
            if (en.x == w.y) {
                at = j;
            }
        }
        let total = val64(wg_sum64(lid, acc)) * TWO_M40;
        lse = ln_f32(max(total, 1.0));
        pos = wg_argmax(lid, 0u, at).y;
    }
    if (lid == 0u) {
        sset(row, S_NS, n_s);
        if (w.y == NO_TOKEN) {
            sset(row, S_STATUS, 4u);
            sset(row, S_PATH, P_NONE);
        } else {
            sset(row, S_TOKEN, w.y);
            sset(row, S_PATH, P_DONE);
        }
        if (lp_on && w.y != NO_TOKEN) {
            let ob = row * RESW + 2u;
            let n = min(min(sp.n_lp, NTOP), n_s);
            for (var j = 0u; j < n; j = j + 1u) {
                let en = entry(row, j);
                out_res[ob + 3u + 2u * j] = en.x;
                out_res[ob + 4u + 2u * j] = bitcast<u32>(fp(bitcast<f32>(en.y) - ymax) - lse);
            }
            let yc = bitcast<f32>(entry(row, pos).y);
            out_res[ob] = bitcast<u32>(fp(yc - ymax) - lse);
            out_res[ob + 1u] = pos + 1u;
            out_res[ob + 2u] = n;
            sset(row, S_LP_DONE, 1u);
        }
    }
    return true;
}

// ---------------------------------------------------------------------------------
// The full-row path: exact radix selects over the whole row, by one workgroup (the old
// multi-pass algorithm: top-k's k-th value by counts, then top-p's cut by masses in
// 2^-40 units against ymax, three 11/11/10-bit levels each). The draw then runs in lp
// with `member`.

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

fn full_row(lid: u32, row: u32, slot: u32, sp: SlotP, ymax: f32) {
    let t = sp.temperature;
    let hb = hbase(row);
    if (lid == 0u) {
        sset(row, S_K_PREFIX, 0u);
        sset(row, S_K_REM, sp.top_k);
        sset(row, S_P_PREFIX, 0u);
        sset(row, S_P_LEVEL, 1u);
        sset(row, S_ABOVE_LO, 0u);
        sset(row, S_ABOVE_HI, 0u);
    }
    storageBarrier();
    if (wg_flag(lid, (sp.flags & F_TOP_K) != 0u)) {
        for (var level = 0u; level < 3u; level = level + 1u) {
            let prefix = sget(row, S_K_PREFIX);
            let sh = digit_shift(level);
            let mask = digit_mask(level);
            for (var i = lid; i < call.vocab; i = i + WG) {
                let key = key_of(z_of(slot, sp, i, load_x(row, i)));
                if (in_prefix(key, level, prefix)) {
                    atomicAdd(&ctr[hb + ((key >> sh) & mask)], 1u);
                }
            }
            storageBarrier();
            var cnts: array<u32, 8>;
            var mine = 0u;
            for (var j = 0u; j < 8u; j = j + 1u) {
                let b = BINS - 1u - (lid * 8u + j);
                let c = atomicLoad(&ctr[hb + b]);
                cnts[j] = c;
                mine = mine + c;
                if (c != 0u) {
                    atomicStore(&ctr[hb + b], 0u);
                }
            }
            let incl = wg_scan64(lid, vec2<u32>(mine, 0u)).x;
            let before = incl - mine;
            let rem = sget(row, S_K_REM);
            if (before < rem && rem <= incl) {
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
                if (level == 2u) {
                    ssetf(row, S_TAU_K, div_rn(from_key(np), t));
                }
            }
            storageBarrier();
        }
    }
    if (wg_flag(lid, (sp.flags & F_TOP_P) != 0u)) {
        let tau_k = sgetf(row, S_TAU_K);
        var sum_f = 0.0;
        var goal = 0.0;
        for (var level = 0u; level < 3u; level = level + 1u) {
            if (!wg_flag(lid, sget(row, S_P_LEVEL) != 0u)) {
                break;
            }
            let prefix = sget(row, S_P_PREFIX);
            let sh = digit_shift(level);
            let mask = digit_mask(level);
            for (var i = lid; i < call.vocab; i = i + WG) {
                let z = z_of(slot, sp, i, load_x(row, i));
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
                let fx = fixed40(exp_f32(y - ymax));
                if ((fx.x | fx.y) == 0u) {
                    continue;
                }
                let d = (key >> sh) & mask;
                let old = atomicAdd(&ctr[hb + BINS + d], fx.x);
                var add_hi = fx.y;
                if (old + fx.x < old) {
                    add_hi = add_hi + 1u;
                }
                if (add_hi != 0u) {
                    atomicAdd(&ctr[hb + 2u * BINS + d], add_hi);
                }
            }
            storageBarrier();
            var m: array<vec2<u32>, 8>;
            var mine = vec2<u32>(0u, 0u);
            for (var j = 0u; j < 8u; j = j + 1u) {
                let b = BINS - 1u - (lid * 8u + j);
                let lo = atomicLoad(&ctr[hb + BINS + b]);
                let hi = atomicLoad(&ctr[hb + 2u * BINS + b]);
                m[j] = vec2<u32>(lo, hi);
                mine = add64(mine, m[j]);
                if ((lo | hi) != 0u) {
                    atomicStore(&ctr[hb + BINS + b], 0u);
                    atomicStore(&ctr[hb + 2u * BINS + b], 0u);
                }
            }
            let incl = wg_scan64(lid, mine);
            let total = wtot;
            if (level == 0u) {
                sum_f = val64(total);
                goal = sp.top_p * sum_f;
            }
            let above = vec2<u32>(sget(row, S_ABOVE_LO), sget(row, S_ABOVE_HI));
            let before = sub64(incl, mine);
            let reach_incl = val64(add64(above, incl)) >= goal;
            let reach_before = val64(add64(above, before)) >= goal;
            if (reach_incl && !reach_before) {
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
                if (level == 2u) {
                    let theta = from_key(np);
                    let e = exp_f32(div_rn(theta, t) - ymax);
                    ssetf(row, S_SUM, sum_f);
                    ssetf(row, S_TAU_Q, div_rn(e, sum_f * TWO_M40));
                    sset(row, S_P_CUT, 1u);
                }
            }
            if (lid == WG - 1u && !reach_incl) {
                // the sum never reaches p (rounding): every token of K stays
                sset(row, S_P_LEVEL, 0u);
            }
            storageBarrier();
        }
    }
}

@compute @workgroup_size(256)
fn settle(@builtin(workgroup_id) wid: vec3<u32>, lanes: Lanes) {
    let lid = lanes.lid;
    lanes_init(lanes);
    let row = wid.x;
    let slot = rmap[row];
    let sp = sparams[slot];
    let t = sp.temperature;
    var bad_x = 0u;
    var bad_z = 0u;
    var xk = 0u;
    var zk = 0u;
    var zi = NO_TOKEN;
    var bk = 0u;
    var bi = NO_TOKEN;
    var sig = vec3<u32>(0u, 0u, 0u);
    var ov = 0u;
    for (var s = lid; s < call.splits; s = s + WG) {
        let pb = part(row, s);
        bad_x = bad_x + work[pb];
        bad_z = bad_z + work[pb + 1u];
        xk = max(xk, work[pb + 2u]);
        let k = work[pb + 3u];
        let i = work[pb + 4u];
        if (k > zk || (k == zk && i < zi)) {
            zk = k;
            zi = i;
        }
        let dk = work[pb + 5u];
        let di = work[pb + 6u];
        if (dk > bk || (dk == bk && di < bi)) {
            bk = dk;
            bi = di;
        }
        sig = add96(sig, vec3<u32>(work[pb + 7u], work[pb + 8u], work[pb + 9u]));
        ov = ov + work[pb + 10u];
    }
    let a = wg_sum_max(lid, bad_x, xk);
    let bz = wg_sum_u32(lid, bad_z);
    let zm = wg_argmax(lid, zk, zi);
    let dr = wg_argmax(lid, bk, bi);
    let s96 = wg_sum96(lid, sig);
    let ovt = wg_sum_u32(lid, ov);
    let fin = (call.mode & M_HEAD) != 0u && sstate[slot * SSW + 4u] != 0u;
    let zmax = from_key(zm.x);
    var status = 0u;
    var count = 0u;
    var ymax = neg_inf();
    if (fin) {
        status = 5u;
    } else if (a.x > 0u) {
        status = 2u;
        count = a.x;
    } else if (bz > 0u) {
        status = 2u;
        count = bz;
    } else if (zm.x <= key_of(neg_inf())) {
        status = 3u;
    } else if (cold(sp)) {
        status = 1u;
    } else {
        ymax = div_rn(zmax, t);
        if (not_finite(ymax)) {
            status = 1u;
            ymax = neg_inf();
        }
    }
    let st = wg_uniform(lid, status);
    let filt = (sp.flags & (F_TOP_K | F_TOP_P | F_MIN_P)) != 0u;
    if (lid == 0u) {
        sset(row, S_STATUS, status);
        sset(row, S_COUNT, count);
        ssetf(row, S_ZMAX, zmax);
        ssetf(row, S_YMAX, ymax);
        ssetf(row, S_XMAX, from_key(a.y));
        ssetf(row, S_TAU_K, neg_inf());
        var tau_min = neg_inf();
        if ((sp.flags & F_MIN_P) != 0u && !is_neg_inf(ymax)) {
            tau_min = ymax + sp.ln_min_p;
        }
        ssetf(row, S_TAU_MIN, tau_min);
        sset(row, S_P_CUT, 0u);
        ssetf(row, S_TAU_Q, -1.0);
        ssetf(row, S_SUM, 0.0);
        sset(row, S_NS, 0u);
        sset(row, S_LP_DONE, 0u);
        sset(row, S_PATH, P_NONE);
        sset(row, S_TOKEN, 0u);
        if (status == 1u) {
            sset(row, S_TOKEN, zm.y);
            sset(row, S_PATH, P_DONE);
        } else if (status == 0u && !filt) {
            if (dr.y == NO_TOKEN) {
                sset(row, S_STATUS, 4u);
            } else {
                sset(row, S_TOKEN, dr.y);
                sset(row, S_PATH, P_DONE);
            }
        }
    }
    storageBarrier();
    if (wg_flag(lid, st == 0u && filt)) {
        let n_all = wg_uniform(lid, atomicLoad(&ctr[2u * row]));
        let need = sget(row, S_NEED);
        let p_alone = (sp.flags & F_TOP_P) != 0u && (sp.flags & F_TOP_K) == 0u;
        let ok_list = wg_flag(
            lid,
            (need & N_LIST) != 0u && n_all <= call.cap && ovt == 0u
                && !(p_alone && (need & N_SIGMA) == 0u)
        );
        var done = false;
        if (ok_list) {
            done = settle_list(lid, row, slot, sp, n_all, ymax, s96);
        }
        if (!wg_flag(lid, done)) {
            full_row(lid, row, slot, sp, ymax);
            if (lid == 0u) {
                sset(row, S_PATH, P_FULL);
            }
        }
    }
    storageBarrier();
    if (lid == 0u) {
        let s2 = sget(row, S_STATUS);
        let want = (sp.flags & F_LOGPROBS) != 0u && s2 <= 1u && sget(row, S_LP_DONE) == 0u;
        sset(row, S_LP, select(0u, 1u, want || sget(row, S_PATH) == P_FULL));
    }
}

// ---------------------------------------------------------------------------------
// lp: read 2 (rows with raw or unfiltered log-probabilities, and full-row draws).

// Stage-10 membership and y of token i of a sampling row (the full-row path's filters,
// or none).
struct Member {
    inside: bool,
    y: f32,
}

fn member(row: u32, z: f32, t: f32) -> Member {
    if (is_neg_inf(z)) {
        return Member(false, neg_inf());
    }
    let y = div_rn(z, t);
    let yk = cmp_key(y);
    if (yk < cmp_key(sgetf(row, S_TAU_K)) || yk < cmp_key(sgetf(row, S_TAU_MIN))) {
        return Member(false, y);
    }
    if (sget(row, S_P_CUT) != 0u) {
        let q = div_rn(exp_f32(y - sgetf(row, S_YMAX)), sgetf(row, S_SUM) * TWO_M40);
        if (cmp_key(q) < cmp_key(sgetf(row, S_TAU_Q))) {
            return Member(false, y);
        }
    }
    return Member(true, y);
}

// The value log-probabilities are taken of (-inf outside the kept set).
fn lp_value(row: u32, slot: u32, sp: SlotP, i: u32, status: u32) -> f32 {
    let x = load_x(row, i);
    if ((sp.flags & F_PROCESSED) == 0u) {
        return x;
    }
    let z = z_of(slot, sp, i, x);
    if (status == 1u) {
        return z;
    }
    let mb = member(row, z, sp.temperature);
    if (!mb.inside) {
        return neg_inf();
    }
    return mb.y;
}

fn vmax_of(row: u32, sp: SlotP, status: u32) -> f32 {
    if ((sp.flags & F_PROCESSED) == 0u) {
        return sgetf(row, S_XMAX);
    }
    if (status == 1u) {
        return sgetf(row, S_ZMAX);
    }
    return sgetf(row, S_YMAX);
}

fn before_in_rank(v: f32, i: u32, w: f32, j: u32) -> bool {
    return v > w || (v == w && i < j);
}

@compute @workgroup_size(256)
fn lp(@builtin(workgroup_id) wid: vec3<u32>, lanes: Lanes) {
    let lid = lanes.lid;
    lanes_init(lanes);
    let split = wid.x;
    let row = wid.y;
    if (!wg_flag(lid, sget(row, S_LP) != 0u)) {
        return;
    }
    let slot = rmap[row];
    let sp = sparams[slot];
    let t = sp.temperature;
    let status = sget(row, S_STATUS);
    let full = sget(row, S_PATH) == P_FULL;
    let want_lp = (sp.flags & F_LOGPROBS) != 0u;
    let token = sget(row, S_TOKEN);
    let vmax = vmax_of(row, sp, status);
    var vc = 0.0;
    if (want_lp && !full) {
        vc = lp_value(row, slot, sp, token, status);
    }
    let n = min(sp.n_lp, NTOP);
    let stp = step_of(slot);
    let seed = vec2<u32>(sp.seed_lo, sp.seed_hi);
    var tv: array<f32, 20>;
    var ti: array<u32, 20>;
    var cnt = 0u;
    var before = 0u;
    var acc = vec2<u32>(0u, 0u);
    var bk = 0u;
    var bi = NO_TOKEN;
    let start = split * call.chunk;
    let end = min(call.vocab, start + call.chunk);
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
            if (full) {
                let mb = member(row, z_of(slot, sp, i, load_x(row, i)), t);
                if (mb.inside) {
                    if (!have) {
                        words = philox(vec4<u32>(g, stp.x, stp.y, 0u), seed);
                        have = true;
                    }
                    let sk = cmp_key(mb.y + gumbel(words[j]));
                    if (sk > bk || (sk == bk && i < bi)) {
                        bk = sk;
                        bi = i;
                    }
                }
            }
            if (!want_lp) {
                continue;
            }
            let v = lp_value(row, slot, sp, i, status);
            if (is_neg_inf(v)) {
                continue;
            }
            acc = add64(acc, fixed40(exp_f32(v - vmax)));
            if (!full && before_in_rank(v, i, vc, token)) {
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
    }
    let dr = wg_argmax(lid, bk, bi);
    let lse = wg_sum64(lid, acc);
    let total_before = wg_sum_u32(lid, before);
    let pb = part(row, split);
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
            work[pb + 24u + 2u * r] = w.x;
            work[pb + 25u + 2u * r] = w.y;
        }
    }
    if (lid == 0u) {
        work[pb + 16u] = lse.x;
        work[pb + 17u] = lse.y;
        work[pb + 18u] = total_before;
        work[pb + 19u] = dr.x;
        work[pb + 20u] = dr.y;
    }
}

// ---------------------------------------------------------------------------------
// finish: results, and the slot's state advanced.

@compute @workgroup_size(256)
fn finish(@builtin(workgroup_id) wid: vec3<u32>, lanes: Lanes) {
    let lid = lanes.lid;
    lanes_init(lanes);
    let row = wid.x;
    let slot = rmap[row];
    let sp = sparams[slot];
    let lp_pass = wg_flag(lid, sget(row, S_LP) != 0u);
    var status = sget(row, S_STATUS);
    let full = sget(row, S_PATH) == P_FULL;
    var token = sget(row, S_TOKEN);
    if (lp_pass) {
        // the full-row draw and the log-sum-exp from lp's partials
        var bk = 0u;
        var bi = NO_TOKEN;
        var lse = vec2<u32>(0u, 0u);
        var before = 0u;
        for (var s = lid; s < call.splits; s = s + WG) {
            let pb = part(row, s);
            lse = add64(lse, vec2<u32>(work[pb + 16u], work[pb + 17u]));
            before = before + work[pb + 18u];
            let k = work[pb + 19u];
            let i = work[pb + 20u];
            if (k > bk || (k == bk && i < bi)) {
                bk = k;
                bi = i;
            }
        }
        let dr = wg_argmax(lid, bk, bi);
        let total = val64(wg_sum64(lid, lse)) * TWO_M40;
        var rank = wg_sum_u32(lid, before) + 1u;
        if (full) {
            token = dr.y;
            if (token == NO_TOKEN) {
                // the kept set is never empty, so this is a defect: a row error
                status = 4u;
                token = 0u;
            }
        }
        let want_lp = (sp.flags & F_LOGPROBS) != 0u && status <= 1u;
        if (wg_flag(lid, want_lp && full)) {
            // the rank of a token drawn over the whole row: one more pass
            let vc = lp_value(row, slot, sp, token, status);
            var b = 0u;
            for (var i = lid; i < call.vocab; i = i + WG) {
                let v = lp_value(row, slot, sp, i, status);
                if (!is_neg_inf(v) && before_in_rank(v, i, vc, token)) {
                    b = b + 1u;
                }
            }
            rank = wg_sum_u32(lid, b) + 1u;
        }
        if (wg_flag(lid, want_lp)) {
            let vmax = vmax_of(row, sp, status);
            let lse_v = ln_f32(max(total, 1.0));
            let n = min(sp.n_lp, NTOP);
            let ob = row * RESW + 2u;
            var h = 0u;
            var listed = 0u;
            for (var r = 0u; r < NTOP; r = r + 1u) {
                var k = 0u;
                var idx = 0xffffffffu;
                if (lid < call.splits && h < NTOP) {
                    let pb = part(row, lid);
                    k = work[pb + 24u + 2u * h];
                    idx = work[pb + 25u + 2u * h];
                }
                let w = wg_argmax(lid, k, idx);
                if (lid < call.splits && w.x != 0u && w.x == k && w.y == idx) {
                    h = h + 1u;
                }
                if (lid == 0u && r < n && w.x != 0u) {
                    out_res[ob + 3u + 2u * listed] = w.y;
                    out_res[ob + 4u + 2u * listed] = bitcast<u32>(fp(from_key(w.x) - vmax) - lse_v);
                    listed = listed + 1u;
                }
            }
            if (lid == 0u) {
                let vc = lp_value(row, slot, sp, token, status);
                out_res[ob] = bitcast<u32>(fp(vc - vmax) - lse_v);
                out_res[ob + 1u] = rank;
                out_res[ob + 2u] = listed;
            }
        }
    }
    if (lid == 0u) {
        var code = 0u;
        var word = 0u;
        if (status == 2u) {
            code = OUT_NON_FINITE;
            word = sget(row, S_COUNT);
        } else if (status == 3u) {
            code = OUT_NO_CANDIDATE;
        } else if (status == 4u) {
            code = OUT_NO_WINNER;
        } else if (status == 5u) {
            code = OUT_FINISHED;
            word = sstate[slot * SSW + 4u];
        }
        if (code != 0u) {
            token = 0u;
        }
        sset(row, S_TOKEN, token);
        sset(row, S_STATUS, status);
        out_tokens[row] = token;
        if (code == 0u && (call.mode & M_HEAD) != 0u) {
            // the slot moves on: step, the token's count and presence, stop conditions
            let sb = slot * SSW;
            let lo = sstate[sb] + 1u;
            sstate[sb] = lo;
            if (lo == 0u) {
                sstate[sb + 1u] = sstate[sb + 1u] + 1u;
            }
            let glo = sstate[sb + 2u] + 1u;
            sstate[sb + 2u] = glo;
            var ghi = sstate[sb + 3u];
            if (glo == 0u) {
                ghi = ghi + 1u;
                sstate[sb + 3u] = ghi;
            }
            let pb = pen_base(sparams[slot].pen_slot);
            atomicOr(&pen[pb + (token >> 5u)], 1u << (token & 31u));
            atomicAdd(&pen[pb + 2u * call.bm_words + token], 1u);
            var reason = 0u;
            for (var s = 0u; s < sp.stop_len; s = s + 1u) {
                if (lists[sp.stop_off + s] == token) {
                    reason = 1u;
                }
            }
            if (reason == 0u && (ghi > sp.max_hi || (ghi == sp.max_hi && glo >= sp.max_lo))) {
                reason = 2u;
            }
            sstate[sb + 4u] = reason;
            word = reason;
        }
        out_res[row * RESW] = code;
        out_res[row * RESW + 1u] = word;
    }
    if ((call.mode & M_SCATTER) != 0u) {
        storageBarrier();
        scatter(slot, sp, lid, true);
    }
}

// ---------------------------------------------------------------------------------
// Many draws of one row: tokens at steps step .. step + draws - 1 from the same kept set
// (the filters do not depend on the step), after settle. `draw_lanes` invocations share
// one draw; a workgroup holds DRAW_WG / draw_lanes draws of one row. List-path rows draw
// over their kept candidates, the others over the row. The tokens go to
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
                words = philox(vec4<u32>(g, step_lo, step_hi, 0u), seed);
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
