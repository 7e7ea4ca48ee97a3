//! The per-call sampler ([`CpuSampler`]) and the stages of a row on the fast path.
//!
//! How a row is drawn:
//! 1. one pass finds `max(z)` and counts non-finite logits (bias and penalties touch only
//!    a few tokens, applied on a copy when present);
//! 2. the kept set is found among a small candidate list gathered by a skipping pass:
//!    top-k by adaptive-threshold selection; top-p (without top-k) by one pass that also
//!    accumulates the normaliser; min-p by its threshold; no filter by the Gumbel bound.
//!    Without bias or penalties, top-k and top-p rows skip step 1: the gathering pass finds
//!    the max and the non-finite logits itself (top-p accumulates `exp` against the max of
//!    a small sample, so a NaN or `+inf` shows in the sum and sends the row to step 1);
//! 3. each candidate is divided by the temperature exactly, the filters are applied with
//!    the shared [`crate::pipeline`] functions, and the Gumbel draw skips every token
//!    whose best possible noise cannot reach the current leader.

use rayon::prelude::*;

use super::draw::{draw, draw_whole_row, wide_draw};
use super::general;
use super::kernels;
use super::logprobs::{full_logprobs, subset_logprobs};
use super::scratch::{with_scratch, Scratch};
use super::select::{gather_y_at_least, sampled_threshold, select_top};
use super::top_p::{
    first_top_p_list, keep_from, sample_wide, top_p_probs, top_p_scan, top_p_walk, TopPScan,
};
use crate::backend::Backend;
use crate::error::{Error, Result, RowError};
use crate::logits::{Logits, LogitsData};
use crate::params::{LogprobsMode, Request};
use crate::pipeline::{self as pl, Row, RowResult, Sample};

/// The fast CPU sampler.
#[derive(Debug)]
pub struct CpuSampler {
    pool: Option<rayon::ThreadPool>,
    threads: usize,
}

impl Default for CpuSampler {
    fn default() -> Self {
        Self::new()
    }
}

impl CpuSampler {
    /// A sampler on rayon's global pool (one thread per core).
    pub fn new() -> Self {
        Self {
            pool: None,
            threads: rayon::current_num_threads(),
        }
    }

    /// A sampler with its own pool of `threads` threads (rows are spread over them).
    pub fn with_threads(threads: usize) -> Result<Self> {
        if threads == 0 {
            return Err(Error::Shape("threads must be >= 1".into()));
        }
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(threads)
            .build()
            .map_err(|e| Error::Shape(format!("cannot build a thread pool: {e}")))?;
        Ok(Self {
            pool: Some(pool),
            threads,
        })
    }

    /// Number of threads rows are spread over.
    pub fn threads(&self) -> usize {
        self.threads
    }

    fn run<T: Send>(&self, f: impl FnOnce() -> T + Send) -> T {
        match &self.pool {
            Some(p) => p.install(f),
            None => f(),
        }
    }
}

impl Backend for CpuSampler {
    fn name(&self) -> String {
        "cpu".into()
    }

    fn masks_rows(&self) -> bool {
        true
    }

    fn sample_rows(&self, logits: &Logits<'_>, rows: &[Row<'_>]) -> Result<Vec<RowResult>> {
        // each row's token mask is applied here, on its thread, to its own copy of the
        // row (see `Backend::masks_rows`)
        let one = |row: &Row<'_>| match (logits.data(), row.allowed.as_deref()) {
            (LogitsData::F32(_), None) => {
                let x = logits.row_f32(row.logits_row()).expect("f32 batch");
                with_scratch(|s| sample_row(x, row, s))
            }
            (_, mask) => with_scratch(|s| {
                let mut conv = std::mem::take(&mut s.conv);
                logits.row_to_f32(row.logits_row(), &mut conv);
                if let Some(m) = mask {
                    kernels::mask_in_place(&mut conv, m);
                }
                let out = sample_row(&conv, row, s);
                s.conv = conv;
                out
            }),
        };
        if rows.len() == 1 {
            // One row runs on one thread anyway: skip the hand-off to the pool.
            return Ok(vec![one(&rows[0])]);
        }
        Ok(self.run(|| rows.par_iter().with_min_len(1).map(one).collect()))
    }
}

/// Samples one row of f32 logits on the fast path (exposed for the benchmarks).
pub fn sample_row_f32(x: &[f32], req: &Request) -> RowResult {
    match req.allowed.as_deref() {
        None => with_scratch(|s| sample_row(x, &Row::of(req), s)),
        Some(m) => {
            let mut copy = x.to_vec();
            kernels::mask_in_place(&mut copy, m);
            with_scratch(|s| sample_row(&copy, &Row::of(req), s))
        }
    }
}

fn sample_row(x: &[f32], req: &Row<'_>, s: &mut Scratch) -> RowResult {
    if general::wanted(req, x.len()) {
        return general::sample_general(x, req, s);
    }
    let mods = pl::sparse_mods(|t| x[t as usize], req);
    let (t, k) = (req.params.temperature, req.params.top_k as usize);
    if mods.is_empty() && k > 0 && k < x.len() && !pl::is_greedy(t, 0.0) {
        // Top-k on the logits as given: the max pass also gathers the candidates.
        let mut seen = (f32::NEG_INFINITY, false);
        select_top(x, k, t, &mut s.cands, &mut s.tmp, Some(&mut seen), None);
        let (xmax, bad) = seen;
        if bad {
            let count = kernels::max_nonfinite(x).1;
            return Err(RowError::NonFiniteLogits { count });
        }
        // greedy after all (max / T overflows) or nothing to draw: the general path
        let ready = if xmax > f32::NEG_INFINITY && !pl::is_greedy(t, xmax) {
            Ready::TopK(true)
        } else {
            Ready::Nothing
        };
        return sample_z(x, x, xmax, req, s, ready);
    }
    let p = &req.params;
    if mods.is_empty() && (k == 0 || k >= x.len()) && p.top_p < 1.0 && !pl::is_greedy(t, 0.0) {
        // Top-p on the logits as given: one pass accumulates the normaliser against the
        // max of a sample and gathers the candidates; NaN or +inf shows in the sum.
        let (zthr, m_est) = sampled_threshold(x, first_top_p_list(p.top_p), &mut s.tmp);
        if m_est.is_finite() {
            let bufs = (&mut s.q, &mut s.walk, &mut s.tmp2);
            if let TopPScan::Done(xmax, cut) =
                top_p_scan(x, (m_est, zthr), (t, p.top_p), &mut s.cands, bufs)
            {
                if !pl::is_greedy(t, xmax) {
                    let ready = cut.map_or(Ready::WholeRow, Ready::TopP);
                    return sample_z(x, x, xmax, req, s, ready);
                }
            }
        }
    }
    if !mods.is_empty() && k > 0 && k + mods.len() < x.len() && !pl::is_greedy(t, 0.0) {
        if let Some(out) = top_k_with_mods(x, &mods, req, s) {
            return out;
        }
    }
    // No filter, no change, no logprobs (the OpenAI default): the row in one pass.
    if mods.is_empty()
        && (k == 0 || k >= x.len())
        && p.top_p >= 1.0
        && p.min_p <= 0.0
        && p.logprobs.is_none()
        && !pl::is_greedy(t, 0.0)
    {
        if let Some(out) = draw_whole_row(x, t, req.state.seed, req.step()) {
            return out;
        }
    }
    // greedy: the max of what is drawn from and its first index in one pass
    let greedy = t < crate::params::GREEDY_TEMPERATURE;
    let mut first = None;
    let (xmax, bad) = if mods.is_empty() && greedy {
        let (m, at, flagged) = kernels::argmax_nonfinite(x);
        first = Some(at as u32);
        // a flagged row is counted for its error
        let bad = if flagged {
            kernels::max_nonfinite(x).1
        } else {
            0
        };
        (m, bad)
    } else {
        kernels::max_nonfinite(x)
    };
    if bad > 0 {
        return Err(RowError::NonFiniteLogits { count: bad });
    }
    let mut zbuf = std::mem::take(&mut s.z);
    let (z, zmax): (&[f32], f32) = if mods.is_empty() {
        (x, xmax)
    } else {
        let bad = mods
            .iter()
            .filter(|m| m.1.is_nan() || m.1 == f32::INFINITY)
            .count() as u64;
        if bad > 0 {
            s.z = zbuf;
            return Err(RowError::NonFiniteLogits { count: bad });
        }
        zbuf.clear();
        zbuf.extend_from_slice(x);
        for &(t, zt) in &mods {
            zbuf[t as usize] = zt;
        }
        let m = if greedy {
            // finite: the row and the changes were checked
            let (m, at, _) = kernels::argmax_nonfinite(&zbuf);
            first = Some(at as u32);
            m
        } else {
            kernels::max(&zbuf)
        };
        (&zbuf, m)
    };
    let out = sample_z(
        x,
        z,
        zmax,
        req,
        s,
        first.map_or(Ready::Nothing, Ready::Argmax),
    );
    s.z = zbuf;
    out
}

/// Top-k with sparse changes (penalties, bias) without a modified copy of the row: the
/// `k` largest unchanged tokens (the changed ones skipped while gathering) hold every
/// unchanged token of the changed row's top k (its k-th largest is at least theirs), so
/// stage 6 runs over those and the changed tokens' new values. `None` sends the row to
/// the general path: a NaN or `+inf` in the row or among the changed values (it counts
/// them), a row with nothing finite, or one drawn greedily after all.
fn top_k_with_mods(
    x: &[f32],
    mods: &[(u32, f32)],
    req: &Row<'_>,
    s: &mut Scratch,
) -> Option<RowResult> {
    let (t, k) = (req.params.temperature, req.params.top_k as usize);
    if mods.iter().any(|m| m.1.is_nan() || m.1 == f32::INFINITY) {
        return None;
    }
    let mut seen = (f32::NEG_INFINITY, false);
    s.skip.fill(x.len(), mods.iter().map(|m| m.0));
    select_top(
        x,
        k,
        t,
        &mut s.cands,
        &mut s.tmp,
        Some(&mut seen),
        Some(&s.skip),
    );
    if seen.1 {
        return None;
    }
    // (i, z_i) of the unchanged candidates, then of every changed token
    let list = &mut s.tmp2;
    list.clear();
    list.extend(s.cands.iter().map(|&(i, _)| (i, x[i as usize])));
    list.extend_from_slice(mods);
    let zmax = list.iter().fold(f32::NEG_INFINITY, |a, c| a.max(c.1));
    if zmax == f32::NEG_INFINITY || pl::is_greedy(t, zmax) {
        return None;
    }
    // stage 6: every token whose y reaches the k-th largest y
    for c in list.iter_mut() {
        c.1 /= t;
    }
    // A changed token below every unchanged candidate is not among the k largest (the
    // unchanged ones are at least k values above it): the selection runs without it.
    let unchanged = s.cands.len();
    if unchanged >= k {
        let floor = list[..unchanged]
            .iter()
            .fold(f32::INFINITY, |a, c| a.min(c.1));
        list.retain(|c| c.1 >= floor);
    }
    let tmp = &mut s.tmp;
    tmp.clear();
    tmp.extend_from_slice(list);
    let (_, kth, _) = tmp.select_nth_unstable_by(k - 1, |a, b| b.1.total_cmp(&a.1));
    let tau = kth.1;
    s.cands.clear();
    s.cands.extend(list.iter().filter(|c| c.1 >= tau));
    s.cands.sort_unstable_by_key(|c| c.0);
    Some(sample_z(x, x, zmax, req, s, Ready::TopK(false)))
}

/// What a one-pass route already left in `Scratch::cands` for [`sample_z`].
#[derive(Clone, Copy)]
enum Ready {
    /// Nothing: `sample_z` does every stage.
    Nothing,
    /// Nothing but the first index of the max (a greedy draw's token), found with it.
    Argmax(u32),
    /// Stage 6's kept set as `(i, y_i)` in id order; `true` when it was selected from `z`
    /// itself (every token of `z` whose `y` reaches the k-th largest), `false` when some
    /// of its values are not `z`'s (changed tokens given with `z` unchanged).
    TopK(bool),
    /// Stage 7's kept set as `(i, y_i)`, with its normaliser and `τp`.
    TopP((f64, f32)),
    /// Nothing, but stage 7 (top-p without top-k) found its nucleus too wide for a
    /// candidate list: it takes the whole row.
    WholeRow,
}

/// Stages 4-9 and logprobs on the processed logits `z` (max `zmax`), from what `ready`
/// says is done.
fn sample_z(
    x: &[f32],
    z: &[f32],
    zmax: f32,
    req: &Row<'_>,
    s: &mut Scratch,
    ready: Ready,
) -> RowResult {
    let p = &req.params;
    let v = z.len();
    if zmax == f32::NEG_INFINITY {
        return Err(RowError::NoCandidate);
    }
    let t = p.temperature;
    if pl::is_greedy(t, zmax) {
        let token = match ready {
            Ready::Argmax(i) => i,
            _ => kernels::first_eq(z, zmax).expect("max exists") as u32,
        };
        let lp = p.logprobs.map(|n| match p.logprobs_mode {
            LogprobsMode::Raw => full_logprobs(x, token, n, s),
            LogprobsMode::Processed => full_logprobs(z, token, n, s),
        });
        return Ok(Sample {
            token,
            logprobs: lp,
            kept: p.kept.map(|n| pl::kept_of(&[(token, 0.0)], n)),
        });
    }
    let ymax = zmax / t;
    let k = p.top_k as usize;
    let top_k = k > 0 && k < v;
    let top_p = p.top_p < 1.0;
    let tau_m = pl::min_p_threshold(ymax, p.min_p);
    let mut cands = std::mem::take(&mut s.cands);
    if matches!(ready, Ready::Nothing | Ready::Argmax(_) | Ready::WholeRow) {
        cands.clear();
    }
    // Some when stage 7 was already done while gathering (`cands` holds its kept set).
    let mut cut: Option<(f64, f32)> = None;
    let mut unfiltered = false;
    if let Ready::TopP(c) = ready {
        cut = Some(c);
    } else if matches!(ready, Ready::TopK(_)) {
        // stage 6 was done while finding the max
    } else if top_k {
        select_top(z, k, t, &mut cands, &mut s.tmp, None, None);
    } else if top_p {
        if !matches!(ready, Ready::WholeRow) {
            let floor = pl::z_lower_bound(ymax - 16.0, t);
            let want = first_top_p_list(p.top_p);
            let zthr = floor.max(sampled_threshold(z, want, &mut s.tmp).0);
            let bufs = (&mut s.q, &mut s.walk, &mut s.tmp2);
            cut = match top_p_scan(z, (zmax, zthr), (t, p.top_p), &mut cands, bufs) {
                TopPScan::Done(_, cut) => cut,
                // not with the exact max as reference and no NaN or +inf in the row
                TopPScan::NonFinite | TopPScan::Unsure => None,
            };
        }
        if cut.is_none() {
            // The nucleus is too wide for the candidate list: by the mass of the row's
            // buckets, else the whole row.
            s.cands = cands;
            if let Some(out) = sample_wide(x, z, zmax, req, s) {
                return out;
            }
            cands = std::mem::take(&mut s.cands);
            cands.clear();
            cands.extend(z.iter().enumerate().map(|(i, &zi)| (i as u32, zi / t)));
        }
    } else {
        if tau_m > f32::NEG_INFINITY {
            gather_y_at_least(z, t, tau_m, &mut cands);
        } else {
            // No filter: drawn straight from the row, without a candidate list.
            unfiltered = true;
        }
    }

    // Stage 7 on the candidates (which hold K, or a superset of P when top-k is off).
    if top_p && cut.is_none() {
        let q = &mut s.q;
        q.clear();
        q.extend(cands.iter().map(|c| c.1));
        top_p_probs(q, ymax, 0.0);
        let walk = &mut s.walk;
        walk.clear();
        walk.extend_from_slice(q);
        let tau_p = top_p_walk(walk, p.top_p);
        keep_from(&mut cands, q, tau_p);
    }
    // Stage 8.
    if tau_m > f32::NEG_INFINITY {
        cands.retain(|c| c.1 >= tau_m);
    }
    // Stage 8a, XTC, when its coin fired: the list holds the kept set here (top-k or
    // min-p without top-p; `general::wanted` sends the other rows to the general path)
    let xtc_cut =
        !unfiltered && req.xtc_acts() && general::xtc_list(&mut cands, p.xtc_threshold, &mut s.q);
    let token = if unfiltered {
        // `z` is finite and not greedy here, so the one-pass draw gives a token
        match draw_whole_row(z, t, req.state.seed, req.step()) {
            Some(Ok(sample)) => sample.token,
            Some(Err(e)) => {
                s.cands = cands;
                return Err(e);
            }
            None => kernels::first_eq(z, zmax).expect("max exists") as u32,
        }
    } else {
        let (st, seed) = (req.step(), req.state.seed);
        // (a kept set whose values are not all `z`'s, or whose top XTC removed, is not the
        // row's tokens above a value)
        let wide = (!matches!(ready, Ready::TopK(false)) && !xtc_cut)
            .then(|| wide_draw(z, t, &cands, seed, st))
            .flatten();
        wide.unwrap_or_else(|| draw(&cands, seed, st, &mut s.tmp, &mut s.words))
    };
    let lp = p.logprobs.map(|n| match p.logprobs_mode {
        LogprobsMode::Raw => full_logprobs(x, token, n, s),
        LogprobsMode::Processed if unfiltered => {
            let mut y = std::mem::take(&mut s.y);
            y.clear();
            y.extend(z.iter().map(|&zi| zi / t));
            let out = full_logprobs(&y, token, n, s);
            s.y = y;
            out
        }
        LogprobsMode::Processed => subset_logprobs(&cands, token, n, &mut s.tmp),
    });
    // the kept distribution from the list, which holds the kept set when a row asking for
    // it comes here (`general::wanted`)
    let kept = p.kept.map(|n| pl::kept_of(&cands, n));
    s.cands = cands;
    Ok(Sample {
        token,
        logprobs: lp,
        kept,
    })
}
