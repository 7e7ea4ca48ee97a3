//! The fast CPU sampler: O(V) streaming passes, no sort of the vocabulary, noise only for
//! tokens that can still win, rows in parallel with rayon.
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

pub mod kernels;
pub mod model;

use std::cell::RefCell;
use std::cmp::Ordering::Less;

use rayon::prelude::*;

use crate::backend::Backend;
use crate::error::{Error, Result, RowError};
use crate::logits::{Logits, LogitsData};
use crate::params::{LogprobsMode, Request};
use crate::philox::{self, gumbel_bucket_bounds, gumbel_bucket_floors, GUMBEL_MAX_BOUND};
use crate::pipeline::{self as pl, RowResult, Sample, TokenLogprobs};
use kernels::Terms;

/// Candidate count below which the draw makes each Philox word on its own (the vector
/// lanes make 32 blocks at once).
const FEW_DRAWN: usize = 8;

/// Size of the samples that estimate gathering thresholds.
const SAMPLE: usize = 1024;

/// Block size of the streaming passes (fits in L1 with room to spare).
const BLOCK: usize = 4096;

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

    fn sample(&self, logits: &Logits<'_>, requests: &[Request]) -> Result<Vec<RowResult>> {
        pl::validate_call(logits.rows(), logits.vocab(), requests)?;
        let one = |r: usize, req: &Request| match logits.data() {
            LogitsData::F32(_) => {
                let x = logits.row_f32(r).expect("f32 batch");
                with_scratch(|s| sample_row(x, req, s))
            }
            _ => with_scratch(|s| {
                let mut conv = std::mem::take(&mut s.conv);
                logits.row_to_f32(r, &mut conv);
                let out = sample_row(&conv, req, s);
                s.conv = conv;
                out
            }),
        };
        if requests.len() == 1 {
            // One row runs on one thread anyway: skip the hand-off to the pool.
            return Ok(vec![one(0, &requests[0])]);
        }
        Ok(self.run(|| {
            requests
                .par_iter()
                .enumerate()
                .with_min_len(1)
                .map(|(r, req)| one(r, req))
                .collect()
        }))
    }
}

/// Per-thread buffers, reused across rows and calls.
#[derive(Default)]
struct Scratch {
    conv: Vec<f32>,
    z: Vec<f32>,
    y: Vec<f32>,
    cands: Vec<(u32, f32)>,
    tmp: Vec<(u32, f32)>,
    tmp2: Vec<(u32, f32)>,
    q: Vec<f32>,
    walk: Vec<f32>,
    words: Vec<u32>,
    ids: Vec<u32>,
    buckets: Vec<u16>,
    skip: Skip,
}

thread_local! {
    static SCRATCH: RefCell<Scratch> = RefCell::new(Scratch::default());
}

fn with_scratch<T>(f: impl FnOnce(&mut Scratch) -> T) -> T {
    SCRATCH.with(|s| f(&mut s.borrow_mut()))
}

/// Samples one row of f32 logits on the fast path (exposed for the benchmarks).
pub fn sample_row_f32(x: &[f32], req: &Request) -> RowResult {
    with_scratch(|s| sample_row(x, req, s))
}

fn sample_row(x: &[f32], req: &Request, s: &mut Scratch) -> RowResult {
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
        if let Some(out) = draw_whole_row(x, t, req.state.seed, req.state.step) {
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
    req: &Request,
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
    req: &Request,
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
    let token = if unfiltered {
        // `z` is finite and not greedy here, so the one-pass draw gives a token
        match draw_whole_row(z, t, req.state.seed, req.state.step) {
            Some(Ok(sample)) => sample.token,
            Some(Err(e)) => {
                s.cands = cands;
                return Err(e);
            }
            None => kernels::first_eq(z, zmax).expect("max exists") as u32,
        }
    } else {
        let (st, seed) = (req.state.step, req.state.seed);
        // (a kept set whose values are not all `z`'s is not the row's tokens above a value)
        let wide = (!matches!(ready, Ready::TopK(false)))
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
    s.cands = cands;
    Ok(Sample {
        token,
        logprobs: lp,
    })
}

/// The [`SAMPLE`] values that thresholds are estimated from: runs of 16 neighbours, evenly
/// spread (one or two cache lines each). `z` holds at least `SAMPLE` values.
fn sample_runs(z: &[f32]) -> impl Iterator<Item = &[f32]> {
    let gap = z.len() / (SAMPLE / 16);
    (0..SAMPLE / 16).map(move |c| &z[c * gap..c * gap + 16])
}

/// The `r` (at most 32) largest sampled values of `z` (the runs of [`sample_runs`]) that
/// `keep` accepts, in decreasing order at the front of `top` (`-inf` after them), and how
/// many were found (at most `r`): one pass that inserts into the short list, skipping the
/// runs with nothing to insert (few inserts after the first runs). A NaN that `keep`
/// accepts is taken as larger than everything.
fn sampled_largest(z: &[f32], r: usize, keep: impl Fn(f32) -> bool, top: &mut [f32; 32]) -> usize {
    let mut found = 0;
    for run in sample_runs(z) {
        let low = top[r - 1];
        if !run
            .iter()
            .fold(false, |a, &x| a | (((x > low) | x.is_nan()) & keep(x)))
        {
            continue;
        }
        for &x in run {
            if (x > top[r - 1] || x.is_nan()) && keep(x) {
                found = (found + 1).min(r);
                let mut j = r - 1;
                // smaller or unordered: a NaN moves up to the front
                while j > 0 && matches!(top[j - 1].partial_cmp(&x), Some(Less) | None) {
                    top[j] = top[j - 1];
                    j -= 1;
                }
                top[j] = x;
            }
        }
    }
    found
}

/// A threshold in z-space that about `want` values of `z` reach, estimated from a sample
/// of [`SAMPLE`] values (evenly spread runs of 16), and the sample's max (both `-inf` when
/// the sample cannot tell; the max is NaN or `+inf` when the sample holds one). Only a
/// starting point: callers check that it kept what they need and fall back to `-inf`.
fn sampled_threshold(z: &[f32], want: usize, tmp: &mut Vec<(u32, f32)>) -> (f32, f32) {
    let none = (f32::NEG_INFINITY, f32::NEG_INFINITY);
    let v = z.len();
    if v < 8192 || want * 4 >= v {
        return none;
    }
    let runs = sample_runs(z);
    let r = (want * SAMPLE).div_ceil(v) + 1;
    if r >= SAMPLE {
        return none;
    }
    if r <= 32 {
        let mut top = [f32::NEG_INFINITY; 32];
        sampled_largest(z, r, |_| true, &mut top);
        return (top[r - 1], top[0]);
    }
    tmp.clear();
    tmp.extend(runs.flatten().map(|&zi| (0u32, zi)));
    let desc = |a: &(u32, f32), b: &(u32, f32)| b.1.total_cmp(&a.1);
    let (above, at, _) = tmp.select_nth_unstable_by(r - 1, desc);
    let max = above
        .iter()
        .map(|c| c.1)
        .fold(at.1, |m, v| if v.total_cmp(&m).is_gt() { v } else { m });
    (at.1, max)
}

/// Gathers into `out` every `(i, y_i)` with `y_i >= τ`, `τ` the k-th largest `y = z / t`
/// (ties kept): stage 6. `tmp` is scratch.
/// With `seen`, the first pass also finds the max of `z` and whether it holds NaN or
/// `+inf` (then `out` is meaningless).
/// With `skip`, the tokens whose bit is set there are left out (as if absent from `z`);
/// the caller keeps more than `k` others.
fn select_top(
    z: &[f32],
    k: usize,
    t: f32,
    out: &mut Vec<(u32, f32)>,
    tmp: &mut Vec<(u32, f32)>,
    seen: Option<&mut (f32, bool)>,
    skip: Option<&Skip>,
) {
    // The skipped tokens that lie above the start do not count: the sample allows for
    // them. The list is cut back only past twice the count asked for, so a start where
    // the sample meant it never costs a selection before the end.
    let mut want = 4 * k + 64;
    let mut start = sampled_threshold(z, want, tmp).0;
    if let Some(skip) = skip {
        let above = skip.ids.iter().filter(|&&i| z[i as usize] >= start).count();
        if above > 0 {
            want += above;
            start = sampled_threshold(z, want, tmp).0;
        }
    }
    if !gather_top(z, (k, 2 * want), t, start, out, seen, skip) {
        gather_top(z, (k, 2 * want), t, f32::NEG_INFINITY, out, None, skip);
    }
    out.sort_unstable_by_key(|c| c.0);
}

/// A set of token ids, listed and as a bit set over the row (bit `i % 64` of word
/// `i / 64`). The bit set is kept between rows and only the words of the last set's ids
/// are cleared, not the whole row's.
#[derive(Default)]
struct Skip {
    bits: Vec<u64>,
    ids: Vec<u32>,
}

impl Skip {
    /// The set of `ids` (sorted or not, each `< v`) for a row of `v` tokens.
    fn fill(&mut self, v: usize, ids: impl Iterator<Item = u32>) {
        for &i in &self.ids {
            self.bits[i as usize / 64] = 0;
        }
        self.ids.clear();
        self.ids.extend(ids);
        if self.bits.len() < v.div_ceil(64) {
            self.bits.resize(v.div_ceil(64), 0);
        }
        for &i in &self.ids {
            self.bits[i as usize / 64] |= 1 << (i % 64);
        }
    }

    fn has(&self, i: u32) -> bool {
        self.bits[i as usize / 64] >> (i % 64) & 1 != 0
    }
}

/// One gathering pass from threshold `start` for top-`k`, the list cut back to about `k`
/// tokens (by the k-th largest so far) whenever it grows past `cap`; false when `start`
/// proved too high. With `seen`, the same pass also finds the max of `z` and whether it
/// holds NaN or `+inf` (then the result is meaningless and only `seen` counts).
fn gather_top(
    z: &[f32],
    (k, cap): (usize, usize),
    t: f32,
    start: f32,
    out: &mut Vec<(u32, f32)>,
    mut seen: Option<&mut (f32, bool)>,
    skip: Option<&Skip>,
) -> bool {
    let mut thr = start;
    out.clear();
    let shrink = |out: &mut Vec<(u32, f32)>| -> f32 {
        let (_, kth, _) = out.select_nth_unstable_by(k - 1, |a, b| b.1.total_cmp(&a.1));
        let zl = pl::z_lower_bound(kth.1 / t, t);
        out.retain(|c| c.1 >= zl);
        zl
    };
    for (b, block) in z.chunks(BLOCK).enumerate() {
        let before = out.len();
        match seen.as_deref_mut() {
            Some((m, bad)) => {
                let (bm, bb) = kernels::collect_ge_max(block, (b * BLOCK) as u32, thr, out);
                *m = m.max(bm);
                *bad |= bb;
            }
            None => kernels::collect_ge(block, (b * BLOCK) as u32, thr, out),
        }
        if let Some(skip) = skip {
            let mut w = before;
            for r in before..out.len() {
                if !skip.has(out[r].0) {
                    out[w] = out[r];
                    w += 1;
                }
            }
            out.truncate(w);
        }
        if out.len() > cap {
            thr = thr.max(shrink(out));
        }
    }
    if seen.is_some_and(|s| s.1) {
        return false;
    }
    if out.len() < k {
        return false;
    }
    let (_, kth, _) = out.select_nth_unstable_by(k - 1, |a, b| b.1.total_cmp(&a.1));
    let tau = kth.1 / t;
    if pl::z_lower_bound(tau, t) < start {
        return false;
    }
    out.retain_mut(|c| {
        c.1 /= t;
        c.1 >= tau
    });
    true
}

/// Scratch of [`top_p_candidates`]: two f32 buffers and a candidate list.
type TopPBufs<'a> = (&'a mut Vec<f32>, &'a mut Vec<f32>, &'a mut Vec<(u32, f32)>);

/// How many candidates the first top-p gathering pass aims for: 512 up to `p = 0.9`, and
/// 1,024 above, where nuclei of many hundreds of tokens are common (on the benchmark's
/// Zipf rows of V = 131,072, most rows at `p = 0.95`): a longer first list costs a few
/// more candidates, a retry costs another pass over the row.
fn first_top_p_list(p: f32) -> usize {
    if p > 0.9 {
        1024
    } else {
        512
    }
}

/// What the top-p gathering pass found.
enum TopPScan {
    /// The normaliser's sum is not finite: the row holds NaN or `+inf`, or values so far
    /// above the reference that `2^w` overflows (only possible with an estimated one).
    NonFinite,
    /// The max of `z`, and stage 7's `(normaliser, τp)` with its kept set left in `out` as
    /// `(i, y_i)` when the gathered tokens hold the nucleus, else `None`.
    Done(f32, Option<(f64, f32)>),
    /// With [`Terms::Coarse`]: the cut lies too close to `p` for the coarse terms of the
    /// tokens outside the list to tell; [`top_p_scan`] scans again with precise ones.
    Unsure,
}

/// [`top_p_candidates`] with [`Terms::Coarse`], and again with [`Terms::Precise`] when
/// the coarse terms leave the cut unsure.
fn top_p_scan(
    z: &[f32],
    (m_ref, zthr): (f32, f32),
    (t, p): (f32, f32),
    out: &mut Vec<(u32, f32)>,
    (q, walk, kept): TopPBufs<'_>,
) -> TopPScan {
    let bufs = (&mut *q, &mut *walk, &mut *kept);
    match top_p_candidates(z, m_ref, zthr, t, p, out, bufs, Terms::Coarse) {
        TopPScan::Unsure => {
            top_p_candidates(z, m_ref, zthr, t, p, out, (q, walk, kept), Terms::Precise)
        }
        scan => scan,
    }
}

/// Top-p without top-k: one pass over `z` accumulates the normaliser against the
/// reference `m_ref` (the max, or an estimate of it no larger) while gathering every token
/// with `z >= zthr` (`zthr <= m_ref`, so the max is gathered); then stage 7 runs on the
/// candidates, after gathering again from lower thresholds when they miss part of the
/// nucleus. The candidates get the contract's weights; the other tokens' share of the
/// normaliser comes from the pass's `terms`. With coarse terms, that share is known within
/// `Terms::error` of it: when the cut is not clear of `p` by as much,
/// [`TopPScan::Unsure`].
#[allow(clippy::too_many_arguments)]
fn top_p_candidates(
    z: &[f32],
    m_ref: f32,
    mut zthr: f32,
    t: f32,
    p: f32,
    out: &mut Vec<(u32, f32)>,
    (q, walk, kept): TopPBufs<'_>,
    terms: Terms,
) -> TopPScan {
    // terms 2^(z c1 + c0) = exp((z - m_ref) / T)
    let c1 = (std::f64::consts::LOG2_E / f64::from(t)) as f32;
    let c0 = (-f64::from(m_ref) * f64::from(c1)) as f32;
    out.clear();
    let mut bulk = 0f64;
    for (b, block) in z.chunks(BLOCK).enumerate() {
        bulk += kernels::exp2_sum_collect(block, (c1, c0), terms, (b * BLOCK) as u32, zthr, out);
        if out.len() > TOP_P_CAP {
            let (_, mid, _) = out.select_nth_unstable_by(TOP_P_CAP / 2, |a, b| b.1.total_cmp(&a.1));
            zthr = mid.1;
            out.retain(|c| c.1 >= zthr);
        }
    }
    if !bulk.is_finite() {
        return TopPScan::NonFinite;
    }
    q.clear();
    q.extend(out.iter().map(|c| c.1));
    let zmax = kernels::max(q);
    if pl::is_greedy(t, zmax) {
        return TopPScan::Done(zmax, None);
    }
    let ymax = zmax / t;
    // the bulk's terms against the max: exp((z - zmax) / T)
    let to_max = (-(f64::from(zmax) * f64::from(c1) + f64::from(c0))).exp2();
    let floor = pl::z_lower_bound(ymax - 16.0, t);
    // how far coarse terms may put the rest's weight from precise ones (relative; 0 when
    // this CPU's kernels make them alike)
    let rest_error = if terms.error() > Terms::Precise.error() {
        (terms.error() + Terms::Precise.error()) * 1.01
    } else {
        0.0
    };
    let mut tries = 0;
    loop {
        // The candidates' share of the bulk, computed the same way, so it cancels (`q`
        // holds the candidates' z).
        let have = kernels::exp2_sum(q, (c1, c0), terms);
        let rest = (bulk - have).max(0.0) * to_max;
        let have = have * to_max;
        // Many more candidates than the nucleus needs: first try the fewest top ones that
        // surely hold it (the others join the approximate rest).
        if let Some(zb) = nucleus_bound(q, walk, zmax, t, p, rest) {
            kept.clear();
            let mut dropped = 0f64;
            for (c, &w) in out.iter().zip(walk.iter()) {
                if c.1 >= zb {
                    kept.push(*c);
                } else {
                    dropped += f64::from(w);
                }
            }
            if kept.len() < out.len() {
                let bufs = (&mut *q, &mut *walk);
                let approx = (rest + dropped, rest * rest_error);
                match nucleus(kept, ymax, t, p, approx, bufs, Walk::Peel) {
                    Nucleus::Cut(cut) => {
                        std::mem::swap(out, kept);
                        return TopPScan::Done(zmax, Some(cut));
                    }
                    Nucleus::Unsure => return TopPScan::Unsure,
                    Nucleus::Short => {}
                }
                q.clear();
                q.extend(out.iter().map(|c| c.1));
            }
        }
        // The candidates are every token with z >= zthr, so they hold the nucleus when the
        // walk over them reaches p strictly above their smallest q.
        let all_gathered = out.len() == z.len();
        let walk_from = if all_gathered {
            Walk::AllGathered
        } else {
            Walk::Top
        };
        match nucleus(
            out,
            ymax,
            t,
            p,
            (rest, rest * rest_error),
            (q, walk),
            walk_from,
        ) {
            Nucleus::Cut(cut) => return TopPScan::Done(zmax, Some(cut)),
            Nucleus::Unsure => return TopPScan::Unsure,
            Nucleus::Short => {}
        }
        if zthr <= floor || tries == 3 {
            return TopPScan::Done(zmax, None);
        }
        // Too few: gather again from a lower threshold (the bulk sum stays valid), where
        // a sample says the nucleus ends, with a margin that grows with each try; a
        // nucleus wider than any retry's list takes the whole row at once.
        tries += 1;
        let guess = sampled_retry(z, (zmax, zthr, t), (p, have), out.len(), tries, walk);
        zthr = match guess {
            Some((m, _)) if m > TOP_P_WIDE => return TopPScan::Done(zmax, None),
            Some((_, zt)) if tries < 3 && zt < zthr => floor.max(zt),
            // the sample can take no more: the whole row
            Some(_) if tries < 3 => return TopPScan::Done(zmax, None),
            // nothing sampled below the list (a sampled threshold cannot go lower), or a
            // third try
            _ => floor,
        };
        out.clear();
        for (b, block) in z.chunks(BLOCK).enumerate() {
            kernels::collect_ge(block, (b * BLOCK) as u32, zthr, out);
            if out.len() > TOP_P_CAP {
                return TopPScan::Done(zmax, None);
            }
        }
        q.clear();
        q.extend(out.iter().map(|c| c.1));
    }
}

/// The longest candidate list [`top_p_candidates`] keeps.
const TOP_P_CAP: usize = 8192;
/// A nucleus that a sample puts past this many tokens (three quarters of [`TOP_P_CAP`])
/// takes the whole row ([`sample_wide`]) at once, without a retry.
const TOP_P_WIDE: usize = TOP_P_CAP / 4 * 3;

/// Where a sample of `z` (the runs of [`sampled_threshold`]) says the nucleus ends below
/// the gathering threshold `zthr`: the `n` tokens with `z >= zthr` were gathered, with
/// weight `have` (`exp((z - zmax) / t)`), and the nucleus holds the share `p` of the
/// whole weight. The sampled tokens below `zthr` stand for the weight below, `V /
/// SAMPLE` tokens each; the share is taken of `have` and that estimate (a ratio, so the
/// sample's misses largely cancel), and the fewest largest sampled tokens that reach it
/// estimate the nucleus at `m` tokens (the sampled token that crosses counted whole, so
/// `m` leans high). Returns `m` and a threshold (a sampled value) that gathers about 1.5
/// times as many for the first `retry` (at least 1,024) and three times after (at least
/// 4,096), within 7/8 of [`TOP_P_CAP`]. `None` when the sample cannot tell (a short row,
/// nothing sampled below `zthr`). Only a guess: a wrong one costs time (another retry, or
/// the whole row), not tokens.
fn sampled_retry(
    z: &[f32],
    (zmax, zthr, t): (f32, f32, f32),
    (p, have): (f32, f64),
    n: usize,
    retry: usize,
    tmp: &mut Vec<f32>,
) -> Option<(usize, f32)> {
    let v = z.len();
    if v < 8192 {
        return None;
    }
    let mut sample = [0f32; SAMPLE];
    for (c, run) in sample_runs(z).enumerate() {
        sample[16 * c..16 * c + 16].copy_from_slice(run);
    }
    let mut w = [0f32; SAMPLE];
    kernels::exp_into(&sample, zmax, 1.0 / t, &mut w);
    let below: f64 = sample
        .iter()
        .zip(&w)
        .map(|(&zi, &wi)| if zi < zthr { f64::from(wi) } else { 0.0 })
        .sum();
    let per = v as f64 / SAMPLE as f64;
    let need = (f64::from(p) * (have + per * below) - have) / per;
    let guess = |r: usize| {
        let m = n + (r as f64 * per) as usize;
        let want = if retry <= 1 {
            (m + m / 2).max(1024)
        } else {
            (3 * m).max(4096)
        };
        let want = want.min(TOP_P_CAP - TOP_P_CAP / 8);
        (
            m,
            (want.saturating_sub(n) as f64 / per).ceil().max(1.0) as usize,
        )
    };
    // the sampled tokens (largest first) whose weight reaches `need`
    let reach = |w: &[f32]| {
        let mut held = 0f64;
        w.iter()
            .position(|&wi| {
                held += f64::from(wi);
                held >= need
            })
            .map(|r| r + 1)
    };
    // Mostly the largest few sampled values below `zthr` reach `need`, and the threshold
    // is among the 32 largest (no NaN here: the row was checked).
    const FEW: usize = 32;
    let mut top = [f32::NEG_INFINITY; FEW];
    let len = sampled_largest(z, FEW, |x| x < zthr, &mut top);
    if len == 0 {
        return None;
    }
    let mut wt = [0f32; FEW];
    kernels::exp_into(&top[..len], zmax, 1.0 / t, &mut wt[..len]);
    if let Some((m, taken)) = reach(&wt[..len]).map(guess) {
        if taken <= len {
            return Some((m, top[taken - 1]));
        }
    }
    // Otherwise all of them, sorted.
    tmp.clear();
    tmp.extend(sample.iter().copied().filter(|&zi| zi < zthr));
    tmp.sort_unstable_by(|a, b| b.total_cmp(a));
    let w = &mut w[..tmp.len()];
    kernels::exp_into(tmp, zmax, 1.0 / t, w);
    let (m, taken) = guess(reach(w).unwrap_or(tmp.len()));
    Some((m, tmp[taken.min(tmp.len()) - 1]))
}

/// A threshold `zb` such that the candidates with `z >= zb` surely hold stage 7's nucleus,
/// found by bisection on their approximate weights (left in `w`), or `None` when no
/// threshold above the smallest candidate is sure (or there are few candidates).
/// `zs` holds the candidates' `z`; `rest` is the weight of all other tokens.
fn nucleus_bound(
    zs: &[f32],
    w: &mut Vec<f32>,
    zmax: f32,
    t: f32,
    p: f32,
    rest: f64,
) -> Option<f32> {
    if zs.len() <= 64 {
        return None;
    }
    w.clear();
    w.resize(zs.len(), 0.0);
    kernels::exp_into(zs, zmax, 1.0 / t, w);
    let total = kernels::mass_ge(zs, w, f32::NEG_INFINITY);
    // generous against the 3e-7 weights and the f32 partial sums
    let target = f64::from(p) * (rest + total) * (1.0 + 1e-3);
    if total < target {
        return None;
    }
    let (mut lo, mut hi) = (kernels::min(zs), zmax);
    if kernels::mass_ge(zs, w, hi) >= target {
        return Some(hi);
    }
    // mass(lo) >= target > mass(hi); a dozen halvings leave few candidates between them
    for _ in 0..12 {
        let mid = lo + (hi - lo) * 0.5;
        if mid <= lo || mid >= hi {
            break;
        }
        if kernels::mass_ge(zs, w, mid) >= target {
            lo = mid;
        } else {
            hi = mid;
        }
    }
    Some(lo)
}

/// What [`nucleus`] found.
enum Nucleus {
    /// The normaliser and `τp`; the kept `(i, y_i)` are left in the list.
    Cut((f64, f32)),
    /// The list does not hold the nucleus (or is empty).
    Short,
    /// The cut is not clear of `p` by the rest's error.
    Unsure,
}

/// Relative error of the normaliser below which [`nucleus`] need not check its cut: with
/// the precise weights' 2.7e-7 and the walk's 1e-7 it stays within the contract's `1e-6`
/// top-p tie.
const FREE_ERROR: f64 = 4e-7;

/// Stage 7 over gathered `(i, z_i)` (every token with `z` at or above some threshold),
/// given the approximate weight of all other tokens and a bound on its error (`approx`):
/// on success `out` holds the kept `(i, y_i)` and the normaliser and `τp` are returned.
/// When that error could move the normaliser by more than [`FREE_ERROR`], the cut must
/// stay clear of `p` under any normaliser within it, else [`Nucleus::Unsure`].
fn nucleus(
    out: &mut Vec<(u32, f32)>,
    ymax: f32,
    t: f32,
    p: f32,
    (approx, approx_error): (f64, f64),
    (q, walk): (&mut Vec<f32>, &mut Vec<f32>),
    from: Walk,
) -> Nucleus {
    let all_gathered = from == Walk::AllGathered;
    if out.is_empty() {
        return Nucleus::Short;
    }
    q.clear();
    q.extend(out.iter_mut().map(|c| {
        c.1 /= t;
        c.1
    }));
    let sum = top_p_probs(q, ymax, approx);
    // Candidates whose probabilities add up to less than `p` cannot hold the nucleus: the
    // walk would sort every one of them to reach its end. Their share of the normaliser is
    // `(sum - approx) / sum`, and each probability is its weight's share rounded to f32
    // (within 2^-24 of it), so the walk's sum of them (in f64) stays within 1e-7 of that
    // share and surely ends short where the share is `SHORT` short of `p`.
    // (less what the rest's error may take away)
    const SHORT: f64 = 1e-6;
    let shift = approx_error / sum;
    if !all_gathered && (sum - approx) / sum < f64::from(p) - SHORT - shift {
        return Nucleus::Short;
    }
    let smallest = q.iter().copied().fold(f32::INFINITY, f32::min);
    walk.clear();
    walk.extend_from_slice(q);
    let peeled = if from == Walk::Peel {
        top_p_peel(walk, p)
    } else {
        None
    };
    let tau_p = peeled.unwrap_or_else(|| top_p_walk(walk, p));
    if !(all_gathered || tau_p > smallest) {
        return Nucleus::Short;
    }
    if shift > FREE_ERROR && !clear_cut(q, tau_p, p, shift) {
        return Nucleus::Unsure;
    }
    keep_from(out, q, tau_p);
    Nucleus::Cut((sum, tau_p))
}

/// Whether the walk's cut at `τp` over the probabilities `q` stays where it is when every
/// probability is divided by any factor within `1 ± shift` (the normaliser's error): the
/// sum of the fewest largest values that reach `p` must reach it by that much, and the sum
/// without the last of them must stay short by that much (the sums recomputed in another
/// order, hence a margin of 1e-9 beyond).
fn clear_cut(q: &[f32], tau: f32, p: f32, shift: f64) -> bool {
    const SURE: f64 = 1e-9;
    if tau.is_nan() || tau <= 0.0 || shift >= 0.5 {
        return false;
    }
    let p64 = f64::from(p);
    let tau64 = f64::from(tau);
    // the values above τp, then as many at τp as it takes
    let above = q
        .iter()
        .filter(|&&v| v > tau)
        .fold(0f64, |s, &v| s + f64::from(v));
    let k = ((p64 - above) / tau64).ceil().max(1.0);
    let reach = above + k * tau64;
    let short = reach - tau64;
    reach / (1.0 + shift) >= p64 + SURE && short / (1.0 - shift) < p64 - SURE
}

/// Which end [`nucleus`] walks its candidates from.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Walk {
    /// From the largest ([`top_p_walk`]): a list that may hold far more than the nucleus.
    Top,
    /// As `Top`, over a list that holds every token of the row.
    AllGathered,
    /// From the smallest ([`top_p_peel`]), falling back to `Top`: a list that a
    /// bisection cut to little more than the nucleus.
    Peel,
}

/// `τp` of [`top_p_walk`] found from the other end, for a list whose nucleus is nearly
/// all of it: the smallest values are taken off one by one (split off in growing pieces
/// and sorted, as the walk does from the top) until the mass left would fall below `p`;
/// the value that would take it there is the m-th largest, `τp`. The mass left is the
/// list's sum (in f64) less the values taken off, within far less than `1e-9` of the
/// walk's own sum of the values that stay (the same values, added in another order), so
/// when the mass stays `1e-9` clear of `p` on both sides of that value, the walk would
/// stop at it too. `None` (`q` reordered) when it comes closer, or when the whole list
/// does not clear `p`: the caller walks from the top.
fn top_p_peel(q: &mut [f32], p: f32) -> Option<f32> {
    const SURE: f64 = 1e-9;
    // probabilities: finite and not negative, so their bits order them
    let asc = |v: &f32| v.to_bits();
    let p64 = f64::from(p);
    let mut left = q.iter().fold(0f64, |s, &v| s + f64::from(v));
    if left < p64 + SURE {
        return None;
    }
    visit_in_order(q, 8, asc, |v| {
        let next = left - f64::from(v);
        if next < p64 {
            return Some((left - p64 >= SURE && p64 - next >= SURE).then_some(v));
        }
        left = next;
        None
    })
    .flatten()
}

/// Visits the values of `q` in the increasing order of `key`, sorting only as far as the
/// visit goes: pieces of `first` values, then twice as many each time, are split off with
/// a selection and sorted. Returns the first answer of `visit` (`q` reordered).
fn visit_in_order<K: Ord, R>(
    q: &mut [f32],
    first: usize,
    key: impl Fn(&f32) -> K + Copy,
    mut visit: impl FnMut(f32) -> Option<R>,
) -> Option<R> {
    let (mut start, mut piece) = (0, first.max(1));
    while start < q.len() {
        let end = (start + piece).min(q.len());
        if end < q.len() {
            q[start..].select_nth_unstable_by_key(end - start - 1, key);
        }
        q[start..end].sort_unstable_by_key(key);
        if let Some(answer) = q[start..end].iter().find_map(|&v| visit(v)) {
            return Some(answer);
        }
        start = end;
        piece *= 2;
    }
    None
}

/// Stage 7's probabilities in place: `q` holds the candidates' `y` and becomes their
/// `pl::prob(pl::weight(y, ymax), sum)` (the weights in vector lanes, bit for bit),
/// with `sum` (returned) = `approx` + their weights added in order in f64.
fn top_p_probs(q: &mut [f32], ymax: f32, approx: f64) -> f64 {
    kernels::exp_shifted(q, ymax);
    let sum = approx + q.iter().fold(0f64, |s, &w| s + f64::from(w));
    probs_of(q, sum);
    sum
}

/// Weights `w` in place to their probabilities `pl::prob(w, sum)`.
fn probs_of(w: &mut [f32], sum: f64) {
    for wi in w.iter_mut() {
        *wi = pl::prob(*wi, sum);
    }
}

/// Keeps the candidates whose `q` (same order) is at least `tau`, in order, in place and
/// without a branch (the kept tokens may lie anywhere in the list).
fn keep_from(cands: &mut Vec<(u32, f32)>, q: &[f32], tau: f32) {
    let c = cands.as_mut_slice();
    let mut n = 0;
    for (j, &qj) in q.iter().enumerate().take(c.len()) {
        c[n] = c[j];
        n += usize::from(qj >= tau);
    }
    cands.truncate(n);
}

/// `τp` of [`pl::top_p_cut`] over the values of `q` (probabilities: finite and not
/// negative, so their bit patterns order them; reordered in place). Short lists are
/// sorted whole; longer ones piece by piece, sorting only the prefix of the decreasing
/// order that the walk reaches: growing pieces are split off with a selection, sorted, and
/// walked. Lists longer than [`PRUNED_WALK`] first try [`pruned_walk`].
fn top_p_walk(q: &mut [f32], p: f32) -> f32 {
    let desc = |v: &f32| std::cmp::Reverse(v.to_bits());
    if q.len() > PRUNED_WALK {
        if let Some(tau) = pruned_walk(q, p) {
            return tau;
        }
    }
    let mut walk = pl::TopPWalk::new(p);
    let first = if q.len() <= 256 { q.len() } else { 64 };
    let tau = visit_in_order(q, first, desc, |v| walk.step(v));
    tau.unwrap_or_else(|| walk.end())
}

/// Length from which [`top_p_walk`] first looks for the values it can leave out.
const PRUNED_WALK: usize = 4096;

/// [`top_p_walk`] of a long list. The values' mass by ranges of their bits (the exponent
/// and four mantissa bits, in f64; two interleaved histograms) finds the range where the
/// walk reaches `p`; only that range's values are sorted and walked, from the mass of the
/// ranges above it. Those sums differ from the walk's own (the same values added one by
/// one in decreasing order, in f64) by a few units of 2^-53 per value, far below `1e-9`:
/// when the mass above stays `1e-9` short of `p` and the walk never comes within `1e-9`
/// of it, every partial sum falls on the same side of `p` as the walk's, so `τp` is the
/// same. Otherwise every value from that range up is sorted and walked from zero, which is
/// the walk itself. `None` (`q` reordered) when even the whole mass stays short of `p`.
fn pruned_walk(q: &mut [f32], p: f32) -> Option<f32> {
    const SHIFT: u32 = 19;
    const BUCKETS: usize = 2048;
    const SURE: f64 = 1e-9;
    let bucket = |v: f32| ((v.to_bits() >> SHIFT) as usize).min(BUCKETS - 1);
    // on the stack (32 KiB): a sampling call allocates nothing
    let mut mass = [[0f64; 2]; BUCKETS];
    let mut pairs = q.chunks_exact(2);
    for pair in &mut pairs {
        mass[bucket(pair[0])][0] += f64::from(pair[0]);
        mass[bucket(pair[1])][1] += f64::from(pair[1]);
    }
    for &v in pairs.remainder() {
        mass[bucket(v)][0] += f64::from(v);
    }
    let p64 = f64::from(p);
    let (mut above, mut acc) = (0f64, 0f64);
    let edge = (0..BUCKETS).rev().find(|&b| {
        above = acc;
        acc += mass[b][0] + mass[b][1];
        acc >= p64 + SURE
    })?;
    // the values of the range `edge` (or, for the exact walk, of every range from it up)
    // to the front of `q`, sorted in decreasing order
    let front = |q: &mut [f32], top: usize| {
        let (lo, hi) = (edge, top);
        let mut n = 0;
        for i in 0..q.len() {
            if (lo..=hi).contains(&bucket(q[i])) {
                q.swap(n, i);
                n += 1;
            }
        }
        q[..n].sort_unstable_by_key(|v| std::cmp::Reverse(v.to_bits()));
        n
    };
    if above < p64 - SURE {
        let n = front(q, edge);
        let mut walk = pl::TopPWalk::after(p, above);
        if let Some(tau) = q[..n].iter().find_map(|&v| walk.step(v)) {
            if walk.margin() >= SURE {
                return Some(tau);
            }
        }
    }
    let n = front(q, BUCKETS - 1);
    let mut walk = pl::TopPWalk::new(p);
    q[..n].iter().find_map(|&v| walk.step(v))
}

/// Buckets of [`wide_top_p`], and how many there are per unit of `y`: 2,048 cover the 32
/// below the max; lower values share the last one.
const WIDE_BUCKETS: usize = 2048;
const WIDE_SCALE: f32 = 64.0;
/// Most tokens [`wide_top_p`] weighs exactly and sorts; more (a flat row) take the exact
/// walk over the whole row.
const WIDE_EDGE: usize = 8192;

/// Stages 7-9 and logprobs of a top-p row without top-k whose nucleus is too wide for
/// the candidate lists, over the processed logits `z` (max `zmax`): the kept set from
/// [`wide_top_p`] and min-p is every token at or above some `y`, drawn in one gated pass
/// over the row. `None` when [`wide_top_p`] cannot tell.
fn sample_wide(
    x: &[f32],
    z: &[f32],
    zmax: f32,
    req: &Request,
    s: &mut Scratch,
) -> Option<RowResult> {
    let p = &req.params;
    let t = p.temperature;
    let ymax = zmax / t;
    let y_cut = wide_top_p(z, t, ymax, p.top_p, s)?;
    let y_min = y_cut.max(pl::min_p_threshold(ymax, p.min_p));
    let lead = kernels::first_eq(z, zmax)? as u32;
    let (seed, step) = (req.state.seed, req.state.step);
    let token = match gated_draw(z, t, seed, step, y_min, Some((lead, ymax)))? {
        Ok(sample) => sample.token,
        Err(e) => return Some(Err(e)),
    };
    let lp = p.logprobs.map(|n| match p.logprobs_mode {
        LogprobsMode::Raw => full_logprobs(x, token, n, s),
        LogprobsMode::Processed => {
            let mut kept = std::mem::take(&mut s.cands);
            gather_y_at_least(z, t, y_min, &mut kept);
            let out = subset_logprobs(&kept, token, n, &mut s.tmp);
            s.cands = kept;
            out
        }
    });
    Some(Ok(Sample {
        token,
        logprobs: lp,
    }))
}

/// Every `(i, y_i)` of the row `z` at temperature `t` with `y_i = z_i / t >= y_min`, in
/// id order, into `out` (cleared first): gathered in unscaled space from
/// [`pl::z_lower_bound`], so only those tokens are divided.
fn gather_y_at_least(z: &[f32], t: f32, y_min: f32, out: &mut Vec<(u32, f32)>) {
    out.clear();
    let zl = pl::z_lower_bound(y_min, t);
    for (b, block) in z.chunks(BLOCK).enumerate() {
        kernels::collect_ge(block, (b * BLOCK) as u32, zl, out);
    }
    for c in out.iter_mut() {
        c.1 /= t;
    }
    out.retain(|c| c.1 >= y_min);
}

/// Stage 7 of a nucleus too wide for candidate lists (top-p without top-k over the whole
/// row `z` at temperature `t`, `ymax` its largest `y`): the smallest kept `y`, or `None`
/// when this way cannot tell (the exact walk over the whole row then runs).
///
/// One pass adds the weights by buckets of `y` ([`kernels::mass_by_y`]: 1/64 wide, each
/// weight within 3e-7); the buckets' mass from the top finds the one where the walk
/// reaches `p`, and only its tokens and those of the next bucket below that holds any get
/// the contract's weights, sorted and walked from the mass above. The normaliser and the
/// mass above are the approximate weights' sums: with every weight within `e = 5.4e-7` of
/// the contract's (3e-7, and 2 ulp of `fmath::exp`), a cumulative sum `C = S / (S + R)`
/// moves by at most `C (1 - C) 2e <= e / 2`, and the f32 rounding of each `q` adds below
/// 6e-8: within 3.3e-7 of the reference's sums, inside the contract's top-p tie (`1e-6`),
/// so the kept set can differ from the reference's only on such a tie. Weights grow with
/// `y` (`fmath::exp` is monotone, checked over every f32), so the kept set is every token
/// at or above the returned `y`: the tokens of higher buckets all reach `τp`, and those of
/// lower ones stay below the smallest weighed one, which must fall short of `τp`.
fn wide_top_p(z: &[f32], t: f32, ymax: f32, p: f32, s: &mut Scratch) -> Option<f32> {
    // every entry is written by the pass: grown once, never cleared
    if s.buckets.len() < z.len() {
        s.buckets.resize(z.len(), 0);
    }
    let bucket = &mut s.buckets[..z.len()];
    // on the stack (32 KiB): a sampling call allocates nothing
    let mut mass = [[0f64; 2]; WIDE_BUCKETS];
    kernels::mass_by_y(z, t, ymax, WIDE_SCALE, bucket, &mut mass);
    let in_bucket = |b: usize| mass[b][0] + mass[b][1];
    let total: f64 = (0..WIDE_BUCKETS).map(in_bucket).sum();
    if !(total > 0.0 && total.is_finite()) {
        return None;
    }
    let p64 = f64::from(p);
    let mut above = 0f64;
    let edge = (0..WIDE_BUCKETS).find(|&b| {
        let reached = (above + in_bucket(b)) / total >= p64;
        if !reached {
            above += in_bucket(b);
        }
        reached
    })?;
    let below = (edge + 1..WIDE_BUCKETS).find(|&b| in_bucket(b) > 0.0)?;
    let ids = &mut s.ids;
    ids.clear();
    kernels::collect_buckets(bucket, edge as u16, below as u16, ids);
    if ids.len() > WIDE_EDGE {
        return None;
    }
    // (i, y) of those tokens, their q, and the q in decreasing order
    let list = &mut s.tmp;
    list.clear();
    list.extend(ids.iter().map(|&i| (i, z[i as usize] / t)));
    let q = &mut s.q;
    q.clear();
    q.extend(list.iter().map(|c| c.1));
    kernels::exp_shifted(q, ymax);
    probs_of(q, total);
    let walk = &mut s.walk;
    walk.clear();
    walk.extend_from_slice(q);
    walk.sort_unstable_by_key(|v| std::cmp::Reverse(v.to_bits()));
    let mut cum = pl::TopPWalk::after(p, above / total);
    let tau = walk.iter().find_map(|&v| cum.step(v))?;
    if walk.last().is_some_and(|&smallest| smallest >= tau) {
        return None;
    }
    let y_cut = list
        .iter()
        .zip(q.iter())
        .filter(|(_, &qi)| qi >= tau)
        .fold(f32::INFINITY, |m, (c, _)| m.min(c.1));
    Some(y_cut)
}

/// Kept sets from this size are drawn in one pass over the row ([`wide_draw`]).
const WIDE_DRAW: usize = 16_384;

/// [`draw`] of a kept set of at least [`WIDE_DRAW`] tokens of the row `z` at temperature
/// `t`, as [`gated_draw`] over the row: stages 6-8 keep every token whose `y` reaches
/// some value (`q` and the thresholds grow with `y`), so the set is the row's tokens with
/// `y` at least the smallest kept `y`. `None` for smaller sets, or when that smallest `y`
/// is `-inf`.
fn wide_draw(z: &[f32], t: f32, cands: &[(u32, f32)], seed: u64, step: u64) -> Option<u32> {
    if cands.len() < WIDE_DRAW {
        return None;
    }
    let y_min = cands.iter().fold(f32::INFINITY, |m, c| m.min(c.1));
    let lead = leader(cands)?;
    if y_min == f32::NEG_INFINITY {
        return None;
    }
    match gated_draw(z, t, seed, step, y_min, Some(lead))? {
        Ok(sample) => Some(sample.token),
        Err(_) => None,
    }
}

/// The candidate with the largest `y`, ties to the smallest id (`None` for none).
fn leader(cands: &[(u32, f32)]) -> Option<(u32, f32)> {
    cands.iter().copied().reduce(|a, b| {
        if b.1 > a.1 || (b.1 == a.1 && b.0 < a.0) {
            b
        } else {
            a
        }
    })
}

/// The Gumbel-max draw over candidates `(i, y_i)`: the largest `y_i + g_i`, ties to the
/// smallest id. The leader (the largest `y`, its noise exact) rules out the tokens whose
/// largest possible noise cannot reach it (when the kept set's values span more than that
/// noise; otherwise every candidate is drawn from the list as it is). The others' Philox
/// words are made 32 tokens at a time in vector lanes ([`kernels::philox_listed`], one
/// block per token: a block that two tokens share is made twice). Each word's bucket
/// bounds its noise from both sides: the largest `y + floor` is at most the winner's
/// score, so only the tokens whose `y + bound` reaches it meet the exact comparison and
/// its logarithms. `live` and `words` are scratch.
fn draw(
    cands: &[(u32, f32)],
    seed: u64,
    step: u64,
    live: &mut Vec<(u32, f32)>,
    words: &mut Vec<u32>,
) -> u32 {
    let (i0, y0) = leader(cands).expect("the kept set is never empty");
    let mut best = (i0, y0 + philox::gumbel(seed, step, i0));
    let ymin = cands.iter().fold(f32::INFINITY, |m, c| m.min(c.1));
    // the tokens whose largest possible noise can reach the leader (the leader itself
    // among them: its own challenge changes nothing)
    let list: &[(u32, f32)] = if ymin + GUMBEL_MAX_BOUND >= best.1 {
        cands
    } else {
        live.clear();
        live.extend(cands.iter().filter(|c| c.1 + GUMBEL_MAX_BOUND >= best.1));
        live
    };
    words.clear();
    words.resize(list.len(), 0);
    if list.len() < FEW_DRAWN {
        for (w, c) in words.iter_mut().zip(list) {
            *w = philox::token_bits(seed, step, c.0);
        }
    } else {
        let key = philox::seed_key(seed);
        let mut out = [0u32; 128];
        for (ws, cs) in words.chunks_mut(32).zip(list.chunks(32)) {
            // a short last chunk repeats its first block in the unused lanes
            let mut blocks = [cs[0].0 / 4; 32];
            for (b, c) in blocks.iter_mut().zip(cs) {
                *b = c.0 / 4;
            }
            kernels::philox_listed(&blocks, step, key, &mut out);
            for (j, (w, c)) in ws.iter_mut().zip(cs).enumerate() {
                *w = out[4 * j + (c.0 % 4) as usize];
            }
        }
    }
    let (floors, bounds) = (gumbel_bucket_floors(), gumbel_bucket_bounds());
    // the largest `y + floor`: at most the winner's score (the scores are never NaN: `>`
    // keeps the fold a plain max)
    let mut reach = best.1;
    for (c, &w) in list.iter().zip(words.iter()) {
        let r = c.1 + floors[(w >> 20) as usize];
        if r > reach {
            reach = r;
        }
    }
    for (&(i, y), &w) in list.iter().zip(words.iter()) {
        if y + bounds[(w >> 20) as usize] >= reach {
            challenge(&mut best, i, y, w, bounds);
        }
    }
    best.0
}

/// The exact step of a Gumbel-max draw: token `i` with scaled logit `y` and Philox word
/// `bits` replaces the leader `best` when `y + g` is larger, or equal at a smaller id.
/// Words whose largest possible noise cannot reach the leader skip the logarithms.
#[inline]
fn challenge(best: &mut (u32, f32), i: u32, y: f32, bits: u32, bounds: &[f32; 4096]) {
    if y + bounds[(bits >> 20) as usize] < best.1 {
        return;
    }
    let s = y + philox::gumbel_from_bits(bits);
    if s > best.1 || (s == best.1 && i < best.0) {
        *best = (i, s);
    }
}

/// Tokens per chunk of [`draw_whole_row`]: the words of 32 Philox blocks.
const CHUNK: usize = 128;

/// Tokens at the head of the row whose max seeds the one-pass draw's leader.
const SEED_SPAN: usize = 8192;

/// [`draw`] over the whole row (no filter), in one pass over chunks of [`CHUNK`] tokens
/// read ahead of use, so the reading overlaps the Philox arithmetic. A token can only
/// change the leader when its logit reaches a threshold that falls as its word rises
/// ([`philox::gumbel_reach_consts`]: a bound on the noise per word, no logarithm), so a
/// chunk whose largest values stay below the threshold of the largest word is skipped
/// before its Philox words are made; otherwise the words are made 32 blocks at a time in
/// vector lanes, the chunk is judged by its largest words, then each token by its own,
/// and only the few tokens that pass meet the exact comparison of [`draw`]. Same token
/// as drawing every one. `Err` for NaN or `+inf` in the row, or no finite value; `None`
/// when the row is greedy after all (`max / T` overflows).
fn draw_whole_row(x: &[f32], t: f32, seed: u64, step: u64) -> Option<RowResult> {
    gated_draw(x, t, seed, step, f32::NEG_INFINITY, None)
}

/// [`draw_whole_row`] over the tokens with `x / t >= y_min` only (every token for
/// `-inf`), the leader started at `lead` (a token of that set, with its `y`) when given,
/// else at the first max of the row's head. A kept set that is every token at or above
/// some `y` is drawn so in one pass over the row, at the cost of a plain-temperature draw,
/// instead of token by token.
fn gated_draw(
    x: &[f32],
    t: f32,
    seed: u64,
    step: u64,
    y_min: f32,
    lead: Option<(u32, f32)>,
) -> Option<RowResult> {
    let bounds = gumbel_bucket_bounds();
    let key = philox::seed_key(seed);
    let mut best = (u32::MAX, f32::NEG_INFINITY);
    if let Some((i0, y0)) = lead {
        best = (i0, y0 + philox::gumbel(seed, step, i0));
    } else {
        // The leader starts as the first max of the row's head (its max and first index
        // from one pass; drawn again in its chunk, which changes nothing), so the
        // thresholds are tight from the first chunk on.
        let head = &x[..x.len().min(SEED_SPAN)];
        let (hmax, i0, hbad) = kernels::argmax_nonfinite(head);
        if !hbad && hmax > f32::NEG_INFINITY {
            if !(hmax / t).is_finite() {
                return None;
            }
            let i0 = i0 as u32;
            best = (i0, hmax / t + philox::gumbel(seed, step, i0));
        }
    }
    // the leader and its thresholds' constants, renewed when it changes
    let leader = std::cell::Cell::new((best, philox::gumbel_reach_consts(t, best.1)));
    let visit = |c: usize, mut m: u128, words: &[u32; CHUNK]| {
        let old = leader.get().0;
        let mut b = old;
        while m != 0 {
            let j = m.trailing_zeros() as usize;
            m &= m - 1;
            let z = x[c * CHUNK + j];
            let y = z / t;
            if z != f32::NEG_INFINITY && y >= y_min {
                challenge(&mut b, (c * CHUNK + j) as u32, y, words[j], bounds);
            }
        }
        if b != old {
            leader.set((b, philox::gumbel_reach_consts(t, b.1)));
        }
    };
    let row = kernels::gated_chunks(x, step, key, || leader.get().1, visit);
    let best = leader.get().0;
    let Some(xmax) = row else {
        let count = kernels::max_nonfinite(x).1;
        return Some(Err(RowError::NonFiniteLogits { count }));
    };
    if xmax > f32::NEG_INFINITY && !(xmax / t).is_finite() {
        return None;
    }
    if best.0 == u32::MAX {
        return Some(Err(RowError::NoCandidate));
    }
    Some(Ok(Sample {
        token: best.0,
        logprobs: None,
    }))
}

/// The Philox limit of a draw over a whole row of `v` tokens: every token's Philox word
/// at `step` under `seed`, made as the draw makes them (32 blocks side by side in vector
/// lanes, with AVX-512 three chunks of 128 at a time in two groups of six chains, the
/// round keys once per row, [`kernels::philox_chunks`]), and nothing else: each
/// chunk's words are handed to [`std::hint::black_box`] (so none of them can be left
/// unmade) and one of them is folded into the result. A draw that needs every word cannot
/// do less; the benchmarks time the `temp` configuration against it.
pub fn philox_row_words(v: usize, seed: u64, step: u64) -> u32 {
    let key = philox::seed_key(seed);
    let mut acc = 0u32;
    kernels::philox_chunks(v, step, key, |c, words| {
        acc ^= std::hint::black_box(words)[c % CHUNK];
    });
    acc
}

/// Log-probabilities of `log_softmax(values)` over the whole row, without sorting it.
fn full_logprobs(values: &[f32], token: u32, n: u32, s: &mut Scratch) -> TokenLogprobs {
    let vmax = kernels::max(values);
    let lse = kernels::exp_sum(values, vmax, 1.0).ln();
    let chosen = (token, values[token as usize]);
    let rank = 1 + kernels::count_rank(values, chosen.1, token as usize) as u32;
    let mut top = std::mem::take(&mut s.tmp);
    top.clear();
    if n > 0 {
        let mut scratch = std::mem::take(&mut s.tmp2);
        select_top(
            values,
            (n as usize).min(values.len()),
            1.0,
            &mut top,
            &mut scratch,
            None,
            None,
        );
        s.tmp2 = scratch;
        top.sort_by(pl::rank_order);
    }
    let out = pl::assemble_logprobs(chosen, rank, &top, n, vmax, lse);
    s.tmp = top;
    out
}

/// Log-probabilities of `log_softmax` over the kept set.
fn subset_logprobs(
    set: &[(u32, f32)],
    token: u32,
    n: u32,
    tmp: &mut Vec<(u32, f32)>,
) -> TokenLogprobs {
    let vmax = set.iter().map(|c| c.1).fold(f32::NEG_INFINITY, f32::max);
    let lse = pl::log_sum_exp(set.iter().map(|c| c.1), vmax);
    tmp.clear();
    tmp.extend_from_slice(set);
    tmp.sort_by(pl::rank_order);
    let chosen = *set
        .iter()
        .find(|c| c.0 == token)
        .expect("chosen token is kept");
    let rank = pl::rank_of(chosen, set.iter().copied());
    pl::assemble_logprobs(chosen, rank, tmp, n, vmax, lse)
}

#[cfg(test)]
mod tests {
    use super::{draw, draw_whole_row, top_p_peel, top_p_walk, wide_draw, WIDE_DRAW};
    use crate::philox;
    use crate::pipeline as pl;

    /// The whole-row draw (gates, skipped chunks, vector Philox) against every token's
    /// exact noise: the same token on rows with winners anywhere, plateaus of ties, a few
    /// spikes far above the rest (most chunks skipped), lengths off the chunk size.
    #[test]
    fn whole_row_draw_matches_every_token_drawn() {
        let mut rng = crate::conformance::Rng::new(0x9e37_79b9_7f4a_7c15u64);
        let mut next = move || rng.next_u64();
        for case in 0..300u64 {
            let v = [1usize, 5, 127, 128, 129, 1000, 4099, 32000, 65536][case as usize % 9];
            let style = case % 4;
            let z: Vec<f32> = (0..v)
                .map(|_| {
                    let u = (next() >> 40) as f32 / (1u64 << 24) as f32;
                    match style {
                        0 => 12.0 * u,
                        1 => (8.0 * u).floor(),
                        2 if next() % 500 == 0 => 40.0 + u,
                        2 => u,
                        _ => -30.0 * u * u,
                    }
                })
                .collect();
            let t = [0.05f32, 0.7, 1.0, 3.0][(case / 4) as usize % 4];
            let (seed, step) = (next(), next() % 1000);
            let mut want = (0u32, f32::NEG_INFINITY);
            for (i, &zi) in z.iter().enumerate() {
                let s = zi / t + philox::gumbel(seed, step, i as u32);
                if s > want.1 {
                    want = (i as u32, s);
                }
            }
            let one_pass = match draw_whole_row(&z, t, seed, step) {
                Some(Ok(s)) => s.token,
                other => panic!("case {case}: {other:?}"),
            };
            assert_eq!(
                one_pass, want.0,
                "one pass, case {case}: v {v} style {style} t {t}"
            );
        }
    }

    /// Plain temperature rows through the one-pass draw against the reference: NaN and
    /// `+inf` anywhere (counted), `-inf` tokens, rows of only `-inf`, `max / T` overflow
    /// (greedy), sums that overflow without any non-finite value, lengths off the chunk.
    #[test]
    fn one_pass_draw_edge_rows_match_the_reference() {
        use crate::params::{Request, SamplingParams};
        let mut rng = crate::conformance::Rng::new(0x51_7cc1_b727_220au64);
        let mut next = move || rng.next_u64();
        for case in 0..400u64 {
            let v = [1usize, 7, 128, 130, 300, 1024, 5000][case as usize % 7];
            let mut z: Vec<f32> = (0..v)
                .map(|_| (next() % 2000) as f32 / 100.0 - 10.0)
                .collect();
            let at = (next() % v as u64) as usize;
            match case % 8 {
                0 => z[at] = f32::NAN,
                1 => z[at] = f32::INFINITY,
                2 => z.iter_mut().for_each(|v| *v = f32::NEG_INFINITY),
                3 => z.iter_mut().step_by(3).for_each(|v| *v = f32::NEG_INFINITY),
                4 => z[at] = 3.0e38,
                5 => z.iter_mut().for_each(|v| *v = 3.0e38 * v.signum()),
                6 => {
                    z[at] = f32::NAN;
                    let b = (next() % v as u64) as usize;
                    z[b] = f32::INFINITY;
                }
                _ => {}
            }
            let t = [1e-3f32, 0.7, 1.0, 2.5][(case / 8) as usize % 4];
            let req = Request::new(
                SamplingParams {
                    temperature: t,
                    ..Default::default()
                },
                next(),
            );
            let want = crate::reference::reference_row(&z, &req).0;
            let got = super::sample_row_f32(&z, &req);
            assert_eq!(got, want, "case {case}: v {v} t {t}");
        }
    }

    /// Kept sets of tens of thousands of tokens (top-p 0.95-0.99 on flat rows, a small
    /// min-p, a large top-k, with and without penalties): the pruned walk, the row's draw
    /// above the smallest kept `y` and the token-by-token draw of a changed top-k all
    /// match the reference, with logprobs.
    #[test]
    fn wide_kept_sets_match_the_reference() {
        use crate::params::{Request, SamplingParams};
        let mut rng = crate::conformance::Rng::new(0x9e37_79b9_7f4a_7c15u64);
        let mut next = move || rng.next_u64();
        for case in 0..24u64 {
            let v = [65536usize, 131072, 40000][case as usize % 3];
            // flat rows: a gentle slope plus noise, many near-equal values
            let z: Vec<f32> = (0..v)
                .map(|_| {
                    let u = (next() >> 40) as f32 / (1u64 << 24) as f32;
                    -2.0 * u.ln().max(-20.0).abs().sqrt() + [0.0, 0.5][(next() % 2) as usize]
                })
                .collect();
            let mut params = SamplingParams {
                temperature: [1.0f32, 2.0, 0.7][(case % 3) as usize],
                ..Default::default()
            };
            match case % 4 {
                0 => params.top_p = [0.99, 0.95][(case / 4) as usize % 2],
                1 => params.min_p = 1e-4,
                2 => params.top_k = 20_000,
                _ => {
                    params.top_k = 20_000;
                    params.top_p = 0.97;
                    params.repetition_penalty = 1.3;
                }
            }
            params.logprobs = (case % 2 == 0).then_some(3);
            let mut req = Request::new(params, next());
            req.state.step = next() % 1000;
            req.state.output = (0..64).map(|_| (next() % v as u64) as u32).collect();
            let want = crate::reference::reference_row(&z, &req).0;
            let got = super::sample_row_f32(&z, &req);
            assert_eq!(got, want, "case {case}: v {v}");
        }
    }

    /// The wide nucleus from bucket masses against the reference's stage 7 over the whole
    /// row (every weight the contract's, summed in order): the same smallest kept `y` except
    /// where the reference's cumulative sum comes within `1e-6` of `p` (a tie the contract
    /// allows), on Zipf rows of several slopes and temperatures, rows with banned tokens
    /// and rows of coarse, tied values; most of them must take this way.
    /// The smallest `y` of the reference's top-p kept set over the whole row, and the
    /// reference walk's distance to `p` (for its ties).
    fn reference_top_p_edge(y: &[f32], ymax: f32, p: f32) -> (f32, f64) {
        let mut keep = vec![true; y.len()];
        let margin = crate::reference::stage_top_p(y, ymax, p, &mut keep);
        let edge = y
            .iter()
            .zip(&keep)
            .filter(|(_, &k)| k)
            .fold(f32::INFINITY, |m, (&yi, _)| m.min(yi));
        (edge, margin)
    }

    #[test]
    fn wide_nucleus_matches_the_exact_walk() {
        let mut rng = crate::conformance::Rng::new(0x5851_f42d_4c95_7f2d);
        let (mut taken, mut ties, mut cases) = (0, 0, 0);
        for case in 0..48usize {
            let v = [131_072usize, 32_000, 151_936][case % 3];
            let mut z = crate::conformance::zipf_logits(&mut rng, v, [1.1, 0.9, 1.3][case / 3 % 3]);
            if case % 5 == 1 {
                for i in (0..v).step_by(37) {
                    z[i] = f32::NEG_INFINITY;
                }
            }
            if case % 4 == 2 {
                for zi in &mut z {
                    *zi = (*zi * 8.0).round() / 8.0;
                }
            }
            for (p, t) in [(0.99f32, 0.8f32), (0.95, 1.0), (0.999, 1.3), (0.9, 2.0)] {
                cases += 1;
                let y: Vec<f32> = z.iter().map(|&zi| zi / t).collect();
                let ymax = y.iter().copied().fold(f32::NEG_INFINITY, f32::max);
                let (want, margin) = reference_top_p_edge(&y, ymax, p);
                let mut s = super::Scratch::default();
                let Some(got) = super::wide_top_p(&z, t, ymax, p, &mut s) else {
                    continue;
                };
                taken += 1;
                if got != want {
                    assert!(
                        margin <= 1e-6,
                        "case {case}, p {p}, T {t}: y {got} vs {want}, margin {margin}"
                    );
                    ties += 1;
                }
            }
        }
        assert!(
            taken * 4 >= cases * 3,
            "{taken} of {cases} rows took the bucket way"
        );
        assert!(ties * 20 <= taken, "{ties} ties in {taken} rows");
    }

    /// The sample's guess of the nucleus ([`super::sampled_retry`]) on Zipf rows of three
    /// vocabularies, slopes and temperatures, nuclei from about 500 to 60,000 tokens:
    /// within a factor of 1.5 of the reference's count on nine rows in ten, and its
    /// threshold gathers the whole nucleus (or a list at the cap) on 19 rows in 20 (a
    /// guess far off sends rows down a slower route, never to a different token).
    #[test]
    fn sampled_retry_guesses_the_nucleus() {
        let mut rng = crate::conformance::Rng::new(0x9e37_79b9_7f4a_7c15);
        let (mut close, mut held, mut rows) = (0, 0, 0);
        for case in 0..27usize {
            let v = [131_072usize, 32_000, 151_936][case % 3];
            let slope = [1.1f32, 0.9, 1.3][case / 3 % 3];
            let t = [0.8f32, 1.0, 0.6][case / 9];
            let z = crate::conformance::zipf_logits(&mut rng, v, slope);
            let zmax = z.iter().copied().fold(f32::NEG_INFINITY, f32::max);
            let (zthr, _) = super::sampled_threshold(&z, 512, &mut Vec::new());
            let weight = |zi: f32| f64::from(((zi - zmax) / t).exp());
            let have: f64 = z
                .iter()
                .filter(|&&zi| zi >= zthr)
                .map(|&zi| weight(zi))
                .sum();
            let n = z.iter().filter(|&&zi| zi >= zthr).count();
            let y: Vec<f32> = z.iter().map(|&zi| zi / t).collect();
            let ymax = zmax / t;
            for p in [0.95f32, 0.97, 0.98, 0.99] {
                let mut keep = vec![true; v];
                crate::reference::stage_top_p(&y, ymax, p, &mut keep);
                let truth = keep.iter().filter(|&&k| k).count();
                if truth <= n {
                    continue;
                }
                let mut tmp = Vec::new();
                let (m, zt) = super::sampled_retry(&z, (zmax, zthr, t), (p, have), n, 1, &mut tmp)
                    .expect("a long row with tokens below the threshold");
                rows += 1;
                close += usize::from(m * 3 >= truth * 2 && m * 2 <= truth * 3);
                let gathered = z.iter().filter(|&&zi| zi >= zt).count();
                if m > super::TOP_P_WIDE {
                    // the whole row at once: right when no list of the cap would do
                    held += usize::from(truth > super::TOP_P_CAP / 2);
                } else {
                    held += usize::from(gathered >= truth);
                }
            }
        }
        assert!(rows >= 60, "{rows} rows");
        assert!(
            held * 20 >= rows * 19,
            "the first retry holds the nucleus on {held} of {rows} rows"
        );
        assert!(
            close * 10 >= rows * 9,
            "{close} of {rows} guesses within 1.5x"
        );
    }

    /// Top-k with penalties where the history holds the row's largest tokens (all of the
    /// top k, some of them, none), so the gathering that skips changed tokens must reach
    /// below them or fall back to a full pass: the same token as the reference.
    #[test]
    fn top_k_with_history_at_the_top_matches_the_reference() {
        use crate::params::{Request, SamplingParams};
        let mut rng = crate::conformance::Rng::new(0x2545_f491_4f6c_dd1du64);
        let mut next = move || rng.next_u64();
        for case in 0..60u64 {
            let v = [9000usize, 32000, 65536][case as usize % 3];
            let z: Vec<f32> = (0..v)
                .map(|_| {
                    let u = (next() >> 40) as f32 / (1u64 << 24) as f32;
                    -8.0 * u.ln().max(-20.0).abs().sqrt()
                })
                .collect();
            let mut order: Vec<u32> = (0..v as u32).collect();
            order.sort_by(|&a, &b| z[b as usize].total_cmp(&z[a as usize]));
            let k = [1u32, 5, 50, 300][(case / 3) as usize % 4];
            let history: Vec<u32> = match case % 5 {
                // the top 2k and then some
                0 => order[..2 * k as usize + 40].to_vec(),
                // every other one of the top
                1 => order[..4 * k as usize].iter().step_by(2).copied().collect(),
                // the top k exactly
                2 => order[..k as usize].to_vec(),
                // far below the top
                3 => order[v - 200..].to_vec(),
                _ => (0..256).map(|_| (next() % v as u64) as u32).collect(),
            };
            let mut req = Request::new(
                SamplingParams {
                    temperature: [0.3f32, 0.8, 1.5][(case % 3) as usize],
                    top_k: k,
                    top_p: [1.0f32, 0.9][(case / 2) as usize % 2],
                    repetition_penalty: [1.1f32, 0.8][(case / 5) as usize % 2],
                    frequency_penalty: 0.3,
                    presence_penalty: -0.2,
                    ..Default::default()
                },
                next(),
            );
            req.state.step = next() % 1000;
            req.state.output = history;
            let want = crate::reference::reference_row(&z, &req).0;
            let got = super::sample_row_f32(&z, &req);
            assert_eq!(got, want, "case {case}: v {v} k {k}");
        }
    }

    /// Long lists take the pruned walk: the same `τp` as the sorted walk, for ties,
    /// smooth and steep distributions, and values of `p` placed exactly on a partial sum
    /// (where only the exact walk can decide).
    #[test]
    fn pruned_walk_matches_the_sorted_walk() {
        let mut rng = crate::conformance::Rng::new(0x0bad_cafe_1234_5677u64);
        let mut next = move || rng.next_u64();
        for case in 0..30 {
            let n = [4_097usize, 20_001, 131_072][case % 3];
            let mut q: Vec<f32> = (0..n)
                .map(|i| match case / 3 % 5 {
                    // multiples of 2^-22 that sum to less than 1: every partial sum is
                    // exact, so `p` on one leaves no margin and the exact walk decides
                    4 => ((next() >> 40) % 30 + 1) as f32 / (1u32 << 22) as f32,
                    // repeats: ties everywhere
                    0 => ((next() >> 40) % 50) as f32 + 1.0,
                    // a Zipf-like fall
                    1 => 1.0 / (1.0 + (next() >> 44) as f32),
                    // steep: a few carry almost everything
                    2 => (-(((next() >> 40) % 4000) as f32) / 100.0).exp(),
                    _ => (i % 7) as f32 + ((next() >> 52) as f32) * 1e-3,
                })
                .collect();
            if case / 3 % 5 != 4 {
                let total: f64 = q.iter().map(|&v| f64::from(v)).sum();
                for v in q.iter_mut() {
                    *v = (f64::from(*v) / total) as f32;
                }
            }
            let mut sorted = q.clone();
            sorted.sort_unstable_by(|a, b| b.total_cmp(a));
            // p on partial sums of the sorted values, as f32 (just below, on, above)
            let mut cum = 0f64;
            let at: Vec<f32> = sorted
                .iter()
                .map(|&v| {
                    cum += f64::from(v);
                    cum as f32
                })
                .collect();
            let mut ps = vec![0.05f32, 0.5, 0.9, 0.95, 0.99, 0.999, 1.0];
            for k in [n / 50, n / 3, n - n / 20] {
                ps.extend([at[k].next_down(), at[k], at[k].next_up()].map(|p| p.min(1.0)));
            }
            for p in ps {
                let (want, _) = pl::top_p_cut(sorted.iter().copied(), p);
                let mut work = q.clone();
                assert_eq!(
                    top_p_walk(&mut work, p).to_bits(),
                    want.to_bits(),
                    "case {case}: n={n} p={p}"
                );
            }
        }
    }

    /// Top-p over rows whose tokens outside the candidate list hold much of the mass, with
    /// `p` on a cumulative sum of the sorted probabilities and between two: with coarse
    /// terms the cut either stays clear of `p` by the rest's error or is deferred
    /// ([`TopPScan::Unsure`]), and [`top_p_scan`] keeps the reference's set but on the
    /// contract's ties. Where this CPU's coarse terms are its precise ones, nothing is
    /// deferred.
    #[test]
    fn coarse_normaliser_defers_unclear_cuts() {
        use super::{
            first_top_p_list, sampled_threshold, top_p_candidates, top_p_scan, Scratch, Terms,
            TopPScan,
        };
        let mut rng = crate::conformance::Rng::new(0x9e37_79b9_7f4a_7c15);
        let (mut unsure, mut clear, mut ties, mut done) = (0, 0, 0, 0);
        for case in 0..12usize {
            let v = [32_000usize, 131_072][case % 2];
            let z = crate::conformance::zipf_logits(&mut rng, v, [0.9, 1.0, 1.1][case / 2 % 3]);
            let t = [1.0f32, 1.6][case / 6];
            let y: Vec<f32> = z.iter().map(|&zi| zi / t).collect();
            let (zmax, ymax) = (
                z.iter().copied().fold(f32::NEG_INFINITY, f32::max),
                y.iter().copied().fold(f32::NEG_INFINITY, f32::max),
            );
            let sum: f64 = y.iter().map(|&yi| f64::from(pl::weight(yi, ymax))).sum();
            let mut q: Vec<f32> = y
                .iter()
                .map(|&yi| pl::prob(pl::weight(yi, ymax), sum))
                .collect();
            q.sort_by(|a, b| b.total_cmp(a));
            let mut cum = 0f64;
            let cums: Vec<f64> = q
                .iter()
                .map(|&qi| {
                    cum += f64::from(qi);
                    cum
                })
                .collect();
            for k in [30usize, 100, 300] {
                // on a sum, between two, and 1.5e-6 to either side of one: outside the
                // contract's tie, inside the coarse terms' reach
                for (p, on_sum) in [
                    (cums[k] as f32, true),
                    (((cums[k] + cums[k + 1]) / 2.0) as f32, false),
                    ((cums[k] + 1.5e-6) as f32, false),
                    ((cums[k] - 1.5e-6) as f32, false),
                ] {
                    let (want, margin) = reference_top_p_edge(&y, ymax, p);
                    let mut s = Scratch::default();
                    let zthr = sampled_threshold(&z, first_top_p_list(p), &mut s.tmp).0;
                    let bufs = (&mut s.q, &mut s.walk, &mut s.tmp2);
                    let scan =
                        top_p_candidates(&z, zmax, zthr, t, p, &mut s.cands, bufs, Terms::Coarse);
                    match scan {
                        TopPScan::Unsure => unsure += 1,
                        TopPScan::Done(_, Some(_)) => clear += 1,
                        _ => {}
                    }
                    let bufs = (&mut s.q, &mut s.walk, &mut s.tmp2);
                    let scan = top_p_scan(&z, (zmax, zthr), (t, p), &mut s.cands, bufs);
                    if let TopPScan::Done(_, Some(_)) = scan {
                        done += 1;
                        let got = s.cands.iter().fold(f32::INFINITY, |m, c| m.min(c.1));
                        if got != want {
                            // only on a sum: between two, the walk is well clear of `p`
                            assert!(
                                on_sum && margin <= 1e-6,
                                "case {case}, k {k}, p {p}: y {got} vs {want}, margin {margin}"
                            );
                            ties += 1;
                        }
                    }
                }
            }
        }
        assert!(
            done >= 96,
            "{done} of 144 cuts found on the candidate lists"
        );
        assert!(ties * 2 <= done, "{ties} ties in {done}");
        if Terms::Coarse.error() > Terms::Precise.error() {
            assert!(unsure > 0 && clear > 0, "{unsure} deferred, {clear} clear");
        } else {
            assert_eq!(unsure, 0);
        }
    }

    /// The walk from the smallest values gives the walk's `τp` whenever it answers, and
    /// answers on lists that hold little more than the nucleus (as a bisection leaves
    /// them), ties and all; `p` on a partial sum leaves no margin, and it declines.
    #[test]
    fn peeled_walk_matches_the_sorted_walk() {
        let mut rng = crate::conformance::Rng::new(0x005e_ed0f_9ee1_u64);
        let mut next = move || rng.next_u64();
        let (mut answered, mut declined) = (0, 0);
        for case in 0..40 {
            let n = [9usize, 101, 300, 2_000][case % 4];
            let mut q: Vec<f32> = (0..n)
                .map(|_| match case / 4 % 4 {
                    // repeats: ties everywhere
                    0 => ((next() >> 40) % 20) as f32 + 1.0,
                    // a Zipf-like fall
                    1 => 1.0 / (1.0 + (next() >> 54) as f32),
                    // steep
                    2 => (-(((next() >> 40) % 2000) as f32) / 300.0).exp(),
                    _ => 1.0 + ((next() >> 52) as f32) * 1e-4,
                })
                .collect();
            // the list's share of the row: p and a little more (the rest lies elsewhere)
            let share = [0.9001f64, 0.905, 0.93, 0.99][case / 16 % 4];
            let total: f64 = q.iter().map(|&v| f64::from(v)).sum();
            for v in q.iter_mut() {
                *v = (f64::from(*v) * share / total) as f32;
            }
            let mut sorted = q.clone();
            sorted.sort_unstable_by(|a, b| b.total_cmp(a));
            let mut ps = vec![0.5f32, 0.8, 0.9, 0.899, share as f32];
            // p on a partial sum near the list's end: no margin
            let mut cum = 0f64;
            for &v in &sorted[..n - n / 10 - 1] {
                cum += f64::from(v);
            }
            ps.push(cum as f32);
            for p in ps {
                let (want, _) = pl::top_p_cut(sorted.iter().copied(), p);
                let mut work = q.clone();
                match top_p_peel(&mut work, p) {
                    Some(tau) => {
                        answered += 1;
                        assert_eq!(tau.to_bits(), want.to_bits(), "case {case}: n={n} p={p}");
                    }
                    None => declined += 1,
                }
                // the list as the walk from the top then finds it (reordered)
                assert_eq!(top_p_walk(&mut work, p).to_bits(), want.to_bits());
            }
        }
        assert!(answered > 150, "answered {answered}");
        assert!(declined > 0, "declined {declined}");
    }

    /// A kept set that is every token of the row at or above some `y` (ties at the edge,
    /// sets of 16k to the whole row) draws the same token in one pass over the row as
    /// token by token, over many seeds and steps.
    #[test]
    fn row_draw_above_a_value_matches_the_token_draw() {
        let mut rng = crate::conformance::Rng::new(0x005e_ed0f_da7a_u64);
        let mut next = move || rng.next_u64();
        let (mut live, mut words) = (Vec::new(), Vec::new());
        for case in 0..12 {
            let v = [20_000usize, 70_000, 131_072][case % 3];
            let t = [1.0f32, 0.7, 2.5][case / 3 % 3];
            // coarse values: many tokens share the edge value
            let z: Vec<f32> = (0..v)
                .map(|_| -(((next() >> 40) % 400) as f32) * 0.02)
                .collect();
            let mut ys: Vec<f32> = z.iter().map(|&zi| zi / t).collect();
            ys.sort_unstable_by(|a, b| b.total_cmp(a));
            for rank in [WIDE_DRAW, (v / 2).max(WIDE_DRAW + 1), v - 1] {
                let y_min = ys[rank.min(v - 1)];
                let cands: Vec<(u32, f32)> = z
                    .iter()
                    .enumerate()
                    .map(|(i, &zi)| (i as u32, zi / t))
                    .filter(|c| c.1 >= y_min)
                    .collect();
                for _ in 0..40 {
                    let (seed, step) = (next(), next() % 100_000);
                    let want = draw(&cands, seed, step, &mut live, &mut words);
                    assert_eq!(
                        wide_draw(&z, t, &cands, seed, step),
                        Some(want),
                        "case {case}: v {v} t {t} y_min {y_min} seed {seed} step {step}"
                    );
                }
            }
        }
    }

    #[test]
    fn partial_walk_matches_the_sorted_walk() {
        let mut x = 0x1234_5678_9abc_def1u64;
        for case in 0..400 {
            let n = 1 + case * 7 % 3000;
            let mut q: Vec<f32> = (0..n)
                .map(|_| {
                    x ^= x << 13;
                    x ^= x >> 7;
                    x ^= x << 17;
                    // repeats on purpose: ties at the cut
                    ((x >> 40) % 50) as f32 + 1.0
                })
                .collect();
            let total: f32 = q.iter().sum();
            for v in q.iter_mut() {
                *v /= total;
            }
            for p in [0.05f32, 0.5, 0.9, 0.999, 1.0] {
                let mut sorted = q.clone();
                sorted.sort_unstable_by(|a, b| b.total_cmp(a));
                let (want, _) = pl::top_p_cut(sorted.iter().copied(), p);
                let mut work = q.clone();
                assert_eq!(
                    top_p_walk(&mut work, p).to_bits(),
                    want.to_bits(),
                    "n={n} p={p}"
                );
            }
        }
    }
}
