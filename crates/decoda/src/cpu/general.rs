//! The general path: rows that use a stage the streaming path does not (top-n-σ,
//! typical-p, XTC without a kept list: see [`wanted`]) or ask for their kept
//! distribution. The row's candidates are kept as
//! one `(id, y)` list that each stage shrinks with the shared [`crate::pipeline`]
//! functions; only typical-p and top-p sort it (typical-p by score, top-p by
//! probability), and only the candidates that survived the thresholds before them.

use crate::error::RowError;
use crate::params::LogprobsMode;
use crate::pipeline::{self as pl, Row, RowResult, Sample};

use super::draw::draw;
use super::kernels;
use super::logprobs::{full_logprobs, subset_logprobs};
use super::scratch::Scratch;

/// Whether a row takes the general path. XTC does when its coin fires at the row's step
/// and no top-k or min-p (without top-p) leaves the streaming path an explicit list of
/// the kept set for [`xtc_list`]; otherwise the stage does nothing and the streaming
/// path draws the row. So does the kept distribution without such a list (the streaming
/// path takes it from its list).
pub(super) fn wanted(row: &Row<'_>, vocab: usize) -> bool {
    let p = &row.params;
    let listed = (p.top_k > 0 && (p.top_k as usize) < vocab) || (p.min_p > 0.0 && p.top_p >= 1.0);
    p.top_n_sigma > 0.0 || p.typical_p < 1.0 || ((row.xtc_acts() || p.kept.is_some()) && !listed)
}

/// Stage 8a over a kept list (its coin fired): the top choices' cut with the kept set's
/// weights (in `w`) summed in f64 in the list's order; true when it removed tokens.
pub(super) fn xtc_list(cands: &mut Vec<(u32, f32)>, threshold: f32, w: &mut Vec<f32>) -> bool {
    if cands.len() < 2 {
        return false;
    }
    let sum = weights(cands, w);
    let set = cands
        .iter()
        .zip(w.iter())
        .map(|(c, &e)| (c.1, pl::prob64(e, sum)));
    match pl::xtc_cut(set, threshold) {
        Some(low) => {
            cands.retain(|c| c.1 <= low);
            true
        }
        None => false,
    }
}

/// The general path's buffers, kept in the thread's [`Scratch`] between rows and calls
/// (a row of V = 151,936 fills megabytes of them: fresh ones each call cost their page
/// faults, about as much as the stages).
#[derive(Default)]
pub(super) struct Bufs {
    z: Vec<f32>,
    y: Vec<f32>,
    cands: Vec<(u32, f32)>,
    w: Vec<f32>,
    q32: Vec<f32>,
    q: Vec<f64>,
    lnq: Vec<f64>,
    walk: Vec<(f64, f64)>,
}

/// One row of f32 logits (its token mask already applied) through the whole contract.
pub(super) fn sample_general(x: &[f32], row: &Row<'_>, s: &mut Scratch) -> RowResult {
    let mut b = std::mem::take(&mut s.general);
    let out = general_row(x, row, s, &mut b);
    s.general = b;
    out
}

fn general_row(x: &[f32], row: &Row<'_>, s: &mut Scratch, b: &mut Bufs) -> RowResult {
    let p = &row.params;
    let (xmax, bad) = kernels::max_nonfinite(x);
    if bad > 0 {
        return Err(RowError::NonFiniteLogits { count: bad });
    }
    // stages 1-3a on a copy of the touched tokens
    let mods = pl::sparse_mods(|t| x[t as usize], row);
    let bad = mods
        .iter()
        .filter(|m| m.1.is_nan() || m.1 == f32::INFINITY)
        .count() as u64;
    if bad > 0 {
        return Err(RowError::NonFiniteLogits { count: bad });
    }
    let z = &mut b.z;
    z.clear();
    z.extend_from_slice(x);
    for &(t, zt) in &mods {
        z[t as usize] = zt;
    }
    let zmax = if mods.is_empty() {
        xmax
    } else {
        kernels::max(z)
    };
    if zmax == f32::NEG_INFINITY {
        return Err(RowError::NoCandidate);
    }
    let t = p.temperature;
    if pl::is_greedy(t, zmax) {
        let token = z.iter().position(|&v| v == zmax).expect("max exists") as u32;
        let logprobs = p.logprobs.map(|n| match p.logprobs_mode {
            LogprobsMode::Raw => full_logprobs(x, token, n, s),
            LogprobsMode::Processed => full_logprobs(z, token, n, s),
        });
        let kept = p.kept.map(|n| pl::kept_of(&[(token, 0.0)], n));
        return Ok(Sample {
            token,
            logprobs,
            kept,
        });
    }
    // stage 5 on the finite tokens; -inf ones are out of every set from here
    let y = &mut b.y;
    y.clear();
    y.extend(z.iter().map(|&v| v / t));
    let ymax = zmax / t;
    let mut lo = f64::NEG_INFINITY;
    if p.top_n_sigma > 0.0 {
        lo = sigma_threshold(y, ymax, p.top_n_sigma);
    }
    let k = p.top_k as usize;
    if k > 0 && k < y.len() {
        // the k-th largest of the whole row (-inf included), by selection
        let sel = &mut b.w;
        sel.clear();
        sel.extend_from_slice(y);
        let (_, kth, _) = sel.select_nth_unstable_by(k - 1, |a, b| b.total_cmp(a));
        lo = lo.max(f64::from(*kth));
    }
    let cands = &mut b.cands;
    cands.clear();
    cands.extend(
        y.iter()
            .enumerate()
            .filter(|(_, &v)| v > f32::NEG_INFINITY && f64::from(v) >= lo)
            .map(|(i, &v)| (i as u32, v)),
    );
    if p.typical_p < 1.0 {
        typical(
            cands,
            p.typical_p,
            &mut b.w,
            &mut b.q,
            &mut b.lnq,
            &mut b.walk,
        );
    }
    if p.top_p < 1.0 {
        let sum = weights(cands, &mut b.w);
        let q = &mut b.q32;
        q.clear();
        q.extend(b.w.iter().map(|&e| pl::prob(e, sum)));
        let desc = &mut b.w;
        desc.clear();
        desc.extend_from_slice(q);
        desc.sort_unstable_by(|a, b| b.total_cmp(a));
        let (tau, _) = pl::top_p_cut(desc.iter().copied(), p.top_p);
        let mut i = 0;
        cands.retain(|_| {
            i += 1;
            q[i - 1] >= tau
        });
    }
    if p.min_p > 0.0 {
        let tau = pl::min_p_threshold(top(cands), p.min_p);
        cands.retain(|c| c.1 >= tau);
    }
    if row.xtc_acts() {
        xtc_list(cands, p.xtc_threshold, &mut b.w);
    }
    // stage 9: the CPU's Gumbel draw over the candidate list (vector Philox, bounds)
    if cands.is_empty() {
        return Err(RowError::NoWinner);
    }
    let token = draw(cands, row.state.seed, row.step(), &mut s.tmp2, &mut s.words);
    let logprobs = p.logprobs.map(|n| match p.logprobs_mode {
        LogprobsMode::Raw => full_logprobs(x, token, n, s),
        LogprobsMode::Processed => subset_logprobs(cands, token, n, &mut s.tmp),
    });
    let kept = p.kept.map(|n| pl::kept_of(cands, n));
    Ok(Sample {
        token,
        logprobs,
        kept,
    })
}

/// Stage 5a's threshold over the row's `y`, deciding the same set as
/// [`pl::top_n_sigma_threshold`] (whose two sums run in one sequential chain each, as the
/// contract's f64 reference does), faster: the sums in eight interleaved chains (vector
/// lanes). Sums of `N` terms in two orders differ by at most `γ_N Σ|terms|`
/// (`γ_N < 2e-9` for the 2^24 tokens a row may have; `mean |y| <= |μ| + σ`), which moves
/// the threshold by less than `1e-8 (|ymax| + n σ + |μ| + σ)`; the sets `y >= τ` then
/// differ only if some finite `y` lies that close to `τ`. So when one lies within 10
/// times that, the sequential sums decide.
pub(super) fn sigma_threshold(y: &[f32], ymax: f32, n: f32) -> f64 {
    const L: usize = 8;
    let count = y.iter().filter(|&&v| v > f32::NEG_INFINITY).count();
    if count == 0 {
        return f64::NEG_INFINITY;
    }
    let nf = count as f64;
    // -inf adds 0 (a select, so the lanes stay branch-free)
    let lane = |v: f32, at: f64| {
        if v > f32::NEG_INFINITY {
            f64::from(v) - at
        } else {
            0.0
        }
    };
    let chunks = y.chunks_exact(L);
    let rest = chunks.remainder();
    let mut sum = [0f64; L];
    for c in chunks.clone() {
        for j in 0..L {
            sum[j] += lane(c[j], 0.0);
        }
    }
    let mean = (sum.iter().sum::<f64>() + rest.iter().map(|&v| lane(v, 0.0)).sum::<f64>()) / nf;
    let mut sq = [0f64; L];
    for c in chunks {
        for j in 0..L {
            let d = lane(c[j], mean);
            sq[j] += d * d;
        }
    }
    let rest_sq: f64 = rest.iter().map(|&v| lane(v, mean) * lane(v, mean)).sum();
    let sigma = ((sq.iter().sum::<f64>() + rest_sq) / nf).sqrt();
    let n_sigma = f64::from(n) * sigma;
    let tau = f64::from(ymax) - n_sigma;
    let near = 1e-7 * (f64::from(ymax).abs() + n_sigma + mean.abs() + sigma);
    // the band as f32 bounds a little wider (so the count is one vector pass)
    let (lo, hi) = (
        ((tau - near) as f32).next_down(),
        ((tau + near) as f32).next_up(),
    );
    let in_band = y.iter().filter(|&&v| v >= lo && v <= hi).count();
    if in_band > 0 {
        return pl::top_n_sigma_threshold(y, ymax, n);
    }
    tau
}

/// Stage 6a on the candidates. Each token's `ln q` is taken once, for the entropy and
/// for its score ([`pl::entropy_of`], [`pl::typical_score_of`]: the same bits as
/// [`pl::entropy`] and [`pl::typical_score`]), and the walk's cut is found by selection
/// ([`typical_select`]) instead of a sort of every score.
fn typical(
    cands: &mut Vec<(u32, f32)>,
    p: f32,
    w: &mut Vec<f32>,
    q: &mut Vec<f64>,
    lnq: &mut Vec<f64>,
    walk: &mut Vec<(f64, f64)>,
) {
    let sum = weights(cands, w);
    q.clear();
    q.extend(w.iter().map(|&e| pl::prob64(e, sum)));
    lnq.clear();
    lnq.extend(q.iter().map(|&v| v.ln()));
    let h = pl::entropy_of(q.iter().copied().zip(lnq.iter().copied()));
    let score = |i: usize| pl::typical_score_of(q[i], lnq[i], h);
    // tokens of q = 0 score +inf and add nothing to the walk: they are kept only when
    // the walk never exceeds p, which the cut's +inf says
    walk.clear();
    walk.extend(
        (0..q.len())
            .filter(|&i| q[i] > 0.0)
            .map(|i| (score(i), q[i])),
    );
    let cut = typical_select(walk, p);
    let mut i = 0;
    cands.retain(|_| {
        i += 1;
        score(i - 1) <= cut
    });
}

/// The score at which stage 6a's walk (by increasing score) first has a `q` sum above
/// `p`, or `+inf` when it never does, found by selection: each round splits the
/// remaining scores at their median, and the walk goes on in the lower half when that
/// half's mass takes the sum above `p`, else in the upper half with that mass added.
/// Expected time linear in the number of tokens; only the last 256 or fewer are sorted.
/// The sums group the additions differently from a sequential walk, which moves a
/// result only when the walk passes within about `1e-12` of `p` (a tie by the
/// contract: the reference counts its walk's distance to `p`).
pub(super) fn typical_select(walk: &mut [(f64, f64)], p: f32) -> f64 {
    let p = f64::from(p);
    let by_score = |a: &(f64, f64), b: &(f64, f64)| a.0.total_cmp(&b.0);
    let (mut lo, mut hi, mut cum) = (0usize, walk.len(), 0.0f64);
    let mut cut_off = false;
    while hi - lo > 256 {
        let part = &mut walk[lo..hi];
        let mid = part.len() / 2;
        part.select_nth_unstable_by(mid, by_score);
        let lower: f64 = part[..mid].iter().map(|e| e.1).sum();
        if cum + lower > p {
            hi = lo + mid;
            cut_off = true;
        } else {
            cum += lower;
            lo += mid;
        }
    }
    let part = &mut walk[lo..hi];
    part.sort_unstable_by(by_score);
    for &(score, v) in part.iter() {
        cum += v;
        if cum > p {
            return score;
        }
    }
    // the halves' sums said the walk exceeds p in this part and a sequential sum came
    // out just below (rounding): the part's last score
    match part.last() {
        Some(e) if cut_off => e.0,
        _ => f64::INFINITY,
    }
}

/// The candidates' top-p weights against their largest value (into `w`), and their
/// sum in f64.
fn weights(cands: &[(u32, f32)], w: &mut Vec<f32>) -> f64 {
    let m = top(cands);
    w.clear();
    w.extend(cands.iter().map(|c| c.1));
    // pl::weight of each, in vector lanes (the same bits)
    kernels::exp_shifted(w, m);
    w.iter().map(|&e| f64::from(e)).sum()
}

/// The largest value of a candidate list.
fn top(c: &[(u32, f32)]) -> f32 {
    c.iter().fold(f32::NEG_INFINITY, |a, c| a.max(c.1))
}
