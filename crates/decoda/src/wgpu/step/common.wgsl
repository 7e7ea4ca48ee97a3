// decoda's device sampler: one decode step of the sampling contract (README, "The
// sampling contract") for B rows, each row sampled for a slot whose parameters, seed,
// step and history live on the device. The launcher records these passes, one file of
// step/ each, choosing which from the rows' parameters, never from the data (`Plan` in
// kernels.rs): all five when a row wants log-probabilities (or many draws); probe, scan
// and settle_finish (settle, a full-row draw by the same workgroup, finish) when none
// does; scan and settle_finish alone when no row has filters or a history to scatter.
// (settle_finish is settle then draw_finish on devices that do not fuse them, and there
// settle itself is settle_first then settle_rest but in a light call.)
//
//   probe  (1 x B)  per-call rows first scatter their history into their slot's bitmaps
//                   and counts; then a 1/16 sample of the row gives the threshold above
//                   which the scan keeps candidates, and the reference of the top-p mass
//   scan   (W x B)  read 1 of the row: z (bias, penalties from the slot's bitmaps and
//                   counts), max, argmax and non-finite counts, the Gumbel draw of rows
//                   without filters, the candidates, and the exact top-p mass of the row
//   settle (1 x B)  the row's status; applies top-k, top-p and min-p to the candidates
//                   by selections over them (no sort), draws, and computes processed
//                   log-probabilities (sorting only the listed top); a row
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
const IND_WORDS: u32 = 8u;  // ctr words of a lean call's tail grids, before the rows' counters
const ST: u32 = 72u;        // state words per row
const PW: u32 = 64u;        // partial words per (row, split)
const NTOP: u32 = 20u;      // most top log-probabilities a row may ask for
const LPW: u32 = 44u;       // log-probability words per row
const RESW: u32 = 46u;      // result words per row: status, count, then LPW
const SSW: u32 = 8u;        // slot state words
const SS_HIST: u32 = 5u;    // slot state word: the history's length (a head's DRY ring)
const DRY_CAP: u32 = 4096u; // most tokens a DRY window holds on the device (a power of two)
const NEG_INF_BITS: u32 = 0xff800000u;
const TWO_M40: f32 = 9.094947017729282e-13; // 2^-40
const TWO_M32: f32 = 2.3283064365386963e-10; // 2^-32
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
const S_NS: u32 = 11u;       // list path: the list's length (0: not settled on it)
const S_TAU_K: u32 = 12u;    // full-row path thresholds (`member`)
const S_TAU_MIN: u32 = 13u;
const S_P_CUT: u32 = 14u;
const S_TAU_Q: u32 = 15u;
const S_SUM: u32 = 16u;      // full-row path: top-p normaliser in 2^-40 units, as f32
const S_LSE: u32 = 17u;
const S_VMAX: u32 = 18u;     // the largest y kept (below ymax when XTC removed the top; +inf: ymax)
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
const S_TYP_C: u32 = 31u;    // typical-p: the scores' centre c
const S_TYP_D: u32 = 32u;    // its cut s* (+inf: no cut)
const S_TYP_M: u32 = 33u;    // the ymax its weights are taken against
const S_T_PREFIX: u32 = 34u; // its radix walk
const S_T_LEVEL: u32 = 35u;
const S_T_ABOVE_LO: u32 = 36u;
const S_T_ABOVE_HI: u32 = 37u;
const S_KHI: u32 = 38u;      // list path: the kept set is the candidates with keys in
const S_KLO: u32 = 39u;      //   S_KLO ..= S_KHI
const S_SD_R: u32 = 40u;     // top-n-σ's sums in the scan (N_SD): the reference R
const S_SD_E: u32 = 41u;     //   and the scale's exponent e (an i32: q in 2^(e-34) units)
const S_SD_WALK: u32 = 42u;  // 1: a value lay outside them (the SD phase sums; a test's view)
const S_TAIL: u32 = 43u;     // row j's word holds the j-th row on the full-row path (the tail's list)
const S_PHASE: u32 = 44u;    // full-row path: the row's next phase (step/walk.wgsl)
const S_XF: u32 = 45u;       //   1: XTC acts at this step
const S_TYP_PRE: u32 = 46u;  //   typical-p's centre (S_TYP_C) and mass from the scan: 1
const S_TYP_T: u32 = 47u;    //   that mass
const S_XBAR: u32 = 48u;     //   XTC's bar on w: threshold Σ w
const S_PB_LEVEL: u32 = 49u; // probe: the sample's pass (0, 1; PB_DONE: the row's state set)
const S_PB_B0: u32 = 50u;    //   level 0's bin
const S_PB_LEFT: u32 = 51u;  //   the keys still wanted inside it
const S_PB_MAX: u32 = 52u;   //   the sample's largest key (0: none)
const S_PB_MIN: u32 = 53u;   //   and least
const S_SD_N: u32 = 54u;     // top-n-σ's sums in the full-row path's SD phase: the finite
const S_SD_EW: u32 = 55u;    //   count (0: no such phase) and the range's exponent e (an i32)
const S_KP_SIZE: u32 = 56u;  // the kept phases (step/kept.wgsl): the set's size,
const S_KP_MLO: u32 = 57u;   //   its mass (2^-40 units against its top),
const S_KP_MHI: u32 = 58u;
const S_KP_M: u32 = 59u;     //   how many it lists,
const S_KP_PREFIX: u32 = 60u; //  the n-th largest key's digits so far,
const S_KP_REM: u32 = 61u;   //   its rank in the bin (then: its ties listed)
const S_KP_TIES: u32 = 62u;  //   and the bin's count (then: its ties)
const S_HAND: u32 = 63u;     // settle's hand-off to `settle_rest` (devices that split settle):
                             //   0 none, 1 the row's list decisions left to it, 2 the same
                             //   with XTC acting at this step;
const S_H_N: u32 = 64u;      //   the list's length,
const S_H_YMAX: u32 = 65u;   //   ymax,
const S_H_S96: u32 = 66u;    //   the scan's Σ exp(y - R) (66-68),
const S_H_TYP: u32 = 69u;    //   typical-p's centre and mass from the scan (`Typ`: 69-71)

// S_NEED flags
const N_LIST: u32 = 1u;
const N_SIGMA: u32 = 2u;     // the scan sums Σ exp(y - R) (top-p's mass; typical-p's Σ w)
const N_TYP: u32 = 4u;       // and Σ exp(y - R) (m0 - y) (typical-p's centre: K is every y)
const N_SD: u32 = 8u;        // the scan sums top-n-σ's Σ q and Σ q^2 (step/sigma.wgsl)

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
const F_DRY: u32 = 64u;      // stage 3a: the probe computes the slot's DRY area
const F_TOP_N_SIGMA: u32 = 128u;   // stage 5a (top-n-σ): the full-row path (step/sigma.wgsl)
const F_XTC: u32 = 256u;     // stage 8a (XTC) is on (`xtc_fires` says whether it acts)
const F_TYPICAL: u32 = 512u; // stage 6a (typical-p): on the list or the row (step/typical.wgsl)
const F_KEPT: u32 = 1024u;   // the kept distribution is written (step/kept.wgsl)
// the stages that cut the set on every step (XTC only when its coin fires)
const F_SET_FILTERS: u32 = F_TOP_K | F_TOP_P | F_MIN_P | F_TOP_N_SIGMA | F_TYPICAL;

// Call.mode bits
const M_HEAD: u32 = 1u;      // advance the slot state in finish
const M_SCATTER: u32 = 2u;   // per-call rows: scatter the history in probe, clear it in finish
const M_LIGHT: u32 = 4u;     // no probe ran: no row has filters, so scan needs no row state
const M_MASK: u32 = 8u;      // a token mask is bound: a clear bit reads as -inf
const M_SLOT_MASK: u32 = 16u; // with M_MASK: masks by the row's slot (a head's fixed masks)
const M_LEAN: u32 = 32u;     // lean plan: full-row-path rows are drawn in lp and finished in finish
const M_VERIFY: u32 = 64u;   // a head's verify position: a row whose result is not its drafted
                             // token (lists[verify + row]) halts its slot for the verify
const M_HALTS: u32 = 128u;   // a verify position after the first: halted slots do not step
const SS_HALT: u32 = 6u;     // slot-state word: halted in the current verify (M_VERIFY)

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
    mask_base: u32,   // word offset of row 0's mask in masks (M_MASK)
    mask_stride: u32, // words between rows' masks
    kept_base: u32,   // out_res word offset of row 0's kept area (F_KEPT rows)
    sample_chunk: u32, // logits per piece of the probe's `sample` (a multiple of 256)
    verify: u32,      // M_VERIFY: word offset in lists of row 0's drafted token
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
    dry_allowed: u32, // DRY: allowed length
    dry_n: u32,       // DRY: window (0xffffffff: the whole history)
    dry_tab_off: u32, // lists offset of the penalties (f32 bits) by excess e
    dry_tab_len: u32, // entries of that table (e past the last takes the last)
    dry_brk_off: u32, // lists offset of the breakers: (length, ids...) each
    dry_brk_len: u32, // words of the breakers
    top_n_sigma: f32, // stage 5a's n (F_TOP_N_SIGMA)
    xtc_p: f32,       // stage 8a's probability (F_XTC)
    xtc_thr: f32,     // stage 8a's threshold (F_XTC)
    typical_p: f32,   // stage 6a's p (F_TYPICAL)
    n_kept: u32,      // tokens the kept distribution lists (F_KEPT)
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
@group(0) @binding(11) var<storage, read> masks: array<u32>;

var<workgroup> ra: array<u32, 256>;
var<workgroup> rb: array<u32, 256>;
// the partials of reduce_wg.wgsl's reductions and of wg_scan64: one a group of 16
// invocations. Written only after the writer's first barrier, which every invocation
// reaches after its last read of the previous partials (the reductions end without a
// barrier): a new writer must keep to that.
var<workgroup> rqa: array<u32, 16>;
var<workgroup> rqb: array<u32, 16>;
// the third word of wg_sum96's values (rc) and partials (rqc), kept as ra/rb and rqa/rqb
var<workgroup> rc: array<u32, 256>;
var<workgroup> rqc: array<u32, 16>;
// wg_uniform3's value
var<workgroup> wuni3: vec3<u32>;
var<workgroup> wtot: vec2<u32>;
var<workgroup> wflag: u32;
var<workgroup> wsum: vec3<u32>;
// the probe's radix bins; settle's selections over the list (bins, then the sorted top
// as (id, y) pairs: `list_top`, `sort_top`)
var<workgroup> hk: array<atomic<u32>, 2048>;
var<workgroup> wcnt: atomic<u32>;
var<workgroup> wcut: vec4<u32>;

fn opaque_zero() -> u32 {
    return call.zero;
}

// ---------------------------------------------------------------------------------
// Keys, loads, small helpers.



fn from_key(k: u32) -> f32 {
    if ((k & 0x80000000u) != 0u) {
        return bitcast<f32>(k & 0x7fffffffu);
    }
    return bitcast<f32>(~k);
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
    if ((call.mode & M_MASK) != 0u) {
        // stage 0: a disallowed token is -inf for every stage (its value is not read)
        var mr = row;
        if ((call.mode & M_SLOT_MASK) != 0u) {
            mr = rmap[row];
        }
        let m = masks[call.mask_base + mr * call.mask_stride + (i >> 5u)];
        if (((m >> (i & 31u)) & 1u) == 0u) {
            return bitcast<f32>(0xff800000u);
        }
    }
    let e = call.base + row * call.stride + i;
    // one load for every element type (the word of an f32, or the word holding a 16-bit
    // value): lavapipe runs both sides of a branch, and each side's load would be a
    // gather of its own, lane by lane
    let w = logits[select(e >> 1u, e, call.dtype == 0u)];
    let h = (w >> ((e & 1u) * 16u)) & 0xffffu;
    if (call.dtype == 0u) {
        return bitcast<f32>(w);
    }
    if (call.dtype == 1u) {
        return f16_to_f32(h);
    }
    return bitcast<f32>(h << 16u);
}

// Words of one slot's penalty area: seen bitmap, bias bitmap, output counts, then the
// DRY area (dry.wgsl).
fn pen_base(pen_slot: u32) -> u32 {
    return pen_slot * (4u * call.bm_words + call.vocab + 3u * DRY_CAP);
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

// z of token i (stages 1-3a): the logit with its bias, repetition, frequency and presence
// penalties, read from the slot's bitmaps and counts, and its DRY penalty.
fn z_of(slot: u32, sp: SlotP, i: u32, x: f32) -> f32 {
    if ((sp.flags & F_TOUCH) == 0u) {
        return x;
    }
    let pb = pen_base(sparams[slot].pen_slot);
    let w = i >> 5u;
    let bit = 1u << (i & 31u);
    let seen = (atomicLoad(&pen[pb + w]) & bit) != 0u;
    let biased = (atomicLoad(&pen[pb + call.bm_words + w]) & bit) != 0u;
    var dry = 0.0;
    if ((sp.flags & F_DRY) != 0u) {
        dry = dry_of(sp, dry_base(pb), w, bit);
    }
    if (!seen && !biased && dry == 0.0) {
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
    if (dry != 0.0 && !is_neg_inf(z)) {
        z = z - dry;
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
    return IND_WORDS + 2u * call.rows + row * HW;
}

// A row's two counters in ctr (the candidates listed, then a spare one), after the grids
// of a lean call's tail: ctr[0..3] lp's (splits, rows on the full-row path, 1), ctr[3..6]
// finish's (those rows, 1, 1), set by the probe and counted by settle. (Where the
// counters and histograms lie follows the call's rows; the grids never move.)
fn cbase(row: u32) -> u32 {
    return IND_WORDS + 2u * row;
}

// The row a workgroup after settle works on: the `j`-th on the full-row path (`listed`:
// settle lists them in row j's state word S_TAIL), or row `j` itself.
fn tail_row(j: u32, listed: bool) -> u32 {
    if (listed) {
        return sget(j, S_TAIL);
    }
    return j;
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

// The scan's mass Σ exp(y - R) (96-bit, 2^-72 units, against the row's S_R) as
// Σ exp(y - ymax) in 2^-40 units, as f32 (ymax <= R).
fn mass_at_ymax(row: u32, s96: vec3<u32>, ymax: f32) -> f32 {
    return val96(s96) * TWO_M32 * exp_f32(sgetf(row, S_R) - ymax);
}

// A weight in [0, 1] in 64-bit fixed point, units of 2^-40 (truncated).
fn fixed40(e: f32) -> vec2<u32> {
    let f = e * 256.0;
    let hi = u32(f);
    return vec2<u32>(u32((f - f32(hi)) * 4294967296.0), hi);
}

// floor(v * 2^s) for a finite v >= 0, as a 96-bit integer (0 for a subnormal v);
// v * 2^s must lie below 2^96.
fn fixed_at(v: f32, s: i32) -> vec3<u32> {
    let b = bitcast<u32>(v);
    let ex = (b >> 23u) & 0xffu;
    if (ex == 0u || (b & 0x80000000u) != 0u) {
        return vec3<u32>(0u, 0u, 0u);
    }
    let m = (b & 0x7fffffu) | 0x800000u;
    // v * 2^s = m * 2^(ex - 150 + s)
    let sh = i32(ex) - 150 + s;
    if (sh <= -24) {
        return vec3<u32>(0u, 0u, 0u);
    }
    if (sh < 0) {
        return vec3<u32>(m >> u32(-sh), 0u, 0u);
    }
    let us = u32(sh);
    if (us < 32u) {
        var up = 0u;
        if (us > 0u) {
            up = m >> (32u - us);
        }
        return vec3<u32>(m << us, up, 0u);
    }
    if (us < 64u) {
        let u2 = us - 32u;
        var up = 0u;
        if (u2 > 0u) {
            up = m >> (32u - u2);
        }
        return vec3<u32>(0u, m << u2, up);
    }
    return vec3<u32>(0u, 0u, m << (us - 64u));
}

// A weight in [0, 1] in 96-bit fixed point, units of 2^-72 (truncated), from its bits.
fn fixed72(e: f32) -> vec3<u32> {
    return fixed_at(e, 72);
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

// The three words of `v` of invocation 0 as uniform values, behind one pair of barriers
// (three wg_uniform calls take three pairs).
fn wg_uniform3(lid: u32, v: vec3<u32>) -> vec3<u32> {
    if (lid == 0u) {
        wuni3 = v;
    }
    return workgroupUniformLoad(&wuni3);
}

// A value that every invocation computes from uniform data alone (the slot's parameters
// in `sparams`, the call's uniform block) is uniform already: it needs no wg_flag or
// wg_uniform, whose barriers lavapipe pays for in compile time and in every workgroup.

// wg_argmax, wg_sum_max, wg_sum_u32, wg_sum64 and wg_sum96 come from reduce_wg.wgsl
// (workgroup memory) or reduce_sg.wgsl (subgroup operations), appended by the launcher.

// The first level of the 64-bit sums (wg_scan64, and reduce_wg.wgsl's wg_sum64): each
// invocation's v in ra/rb, then, after a barrier, 16 invocations' sums of a group of 16
// each in rqa/rqb, after a second barrier (ra/rb still hold the values).
fn wg_group_sums64(lid: u32, v: vec2<u32>) {
    ra[lid] = v.x;
    rb[lid] = v.y;
    workgroupBarrier();
    if (lid < 16u) {
        let base = lid * 16u;
        var t = vec2<u32>(ra[base], rb[base]);
        for (var q = 1u; q < 16u + opaque_zero(); q = q + 1u) {
            t = add64(t, vec2<u32>(ra[base + q], rb[base + q]));
        }
        rqa[lid] = t.x;
        rqb[lid] = t.y;
    }
    workgroupBarrier();
}

// Inclusive prefix sum over the workgroup, in thread order; also leaves the total in wtot.
// Three barriers: the groups' sums (wg_group_sums64), then every invocation adds the
// groups before its own and its own group's values up to itself (sums mod 2^64 in any
// order are the same sum).
fn wg_scan64(lid: u32, v: vec2<u32>) -> vec2<u32> {
    wg_group_sums64(lid, v);
    let g = lid / 16u;
    var r = vec2<u32>(0u, 0u);
    for (var q = 0u; q < g; q = q + 1u) {
        r = add64(r, vec2<u32>(rqa[q], rqb[q]));
    }
    for (var q = g * 16u; q <= lid; q = q + 1u) {
        r = add64(r, vec2<u32>(ra[q], rb[q]));
    }
    if (lid == WG - 1u) {
        wtot = r;
    }
    workgroupBarrier();
    return r;
}

// Philox word of token i of a slot at a step (stream 0).
fn noise_word(i: u32, seed: vec2<u32>, step_lo: u32, step_hi: u32) -> u32 {
    let w = philox_cold(vec4<u32>(i / 4u, step_lo, step_hi, 0u), seed);
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

// Whether stage 8a, XTC, acts on the slot's row at its step: it is on and its coin, the
// uniform of Philox word 0 at counter (0, step, 1) (stream 1), is at most its probability.
fn xtc_fires(slot: u32, sp: SlotP) -> bool {
    if ((sp.flags & F_XTC) == 0u) {
        return false;
    }
    let stp = step_of(slot);
    let w = philox_cold(vec4<u32>(0u, stp.x, stp.y, 1u), vec2<u32>(sp.seed_lo, sp.seed_hi));
    let u = f32(2u * (w.x >> 9u) + 1u) * (1.0 / 16777216.0);
    return u <= sp.xtc_p;
}

// Whether the row's temperature makes it greedy before the data is seen (T < 1e-5).
fn cold(sp: SlotP) -> bool {
    return sp.temperature < 1e-5;
}

