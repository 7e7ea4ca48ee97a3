//! The general path: rows that use a stage the streaming path does not (top-n-σ,
//! typical-p, XTC) or ask for their kept distribution. The row's candidates are kept as
//! one `(id, y)` list that each stage shrinks with the shared [`crate::pipeline`]
//! functions; only typical-p and top-p sort it (typical-p by score, top-p by
//! probability), and only the candidates that survived the thresholds before them.

use crate::error::RowError;
use crate::params::LogprobsMode;
use crate::pipeline::{self as pl, Row, RowResult, Sample};

use super::draw::draw;
use super::logprobs::{full_logprobs, subset_logprobs};
use super::{kernels, Scratch};

/// Whether a row takes the general path (XTC only when its coin fires at the row's
/// step: otherwise the stage does nothing and the streaming path draws the row).
pub(super) fn wanted(row: &Row<'_>) -> bool {
    let p = &row.params;
    p.top_n_sigma > 0.0 || p.typical_p < 1.0 || row.xtc_acts() || p.kept.is_some()
}

/// One row of f32 logits (its token mask already applied) through the whole contract.
pub(super) fn sample_general(x: &[f32], row: &Row<'_>, s: &mut Scratch) -> RowResult {
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
    let mut z = x.to_vec();
    for &(t, zt) in &mods {
        z[t as usize] = zt;
    }
    let zmax = if mods.is_empty() {
        xmax
    } else {
        kernels::max(&z)
    };
    if zmax == f32::NEG_INFINITY {
        return Err(RowError::NoCandidate);
    }
    let t = p.temperature;
    if pl::is_greedy(t, zmax) {
        let token = z.iter().position(|&v| v == zmax).expect("max exists") as u32;
        let logprobs = p.logprobs.map(|n| match p.logprobs_mode {
            LogprobsMode::Raw => full_logprobs(x, token, n, s),
            LogprobsMode::Processed => full_logprobs(&z, token, n, s),
        });
        let kept = p.kept.map(|n| pl::kept_of(&[(token, 0.0)], n));
        return Ok(Sample {
            token,
            logprobs,
            kept,
        });
    }
    // stage 5 on the finite tokens; -inf ones are out of every set from here
    let y: Vec<f32> = z.iter().map(|&v| v / t).collect();
    let ymax = zmax / t;
    let mut lo = f64::NEG_INFINITY;
    if p.top_n_sigma > 0.0 {
        lo = pl::top_n_sigma_threshold(&y, ymax, p.top_n_sigma);
    }
    let k = p.top_k as usize;
    let mut cands: Vec<(u32, f32)> = Vec::new();
    if k > 0 && k < y.len() {
        // the k-th largest of the whole row (-inf included), by selection
        let mut sel = y.clone();
        let (_, kth, _) = sel.select_nth_unstable_by(k - 1, |a, b| b.total_cmp(a));
        lo = lo.max(f64::from(*kth));
    }
    cands.extend(
        y.iter()
            .enumerate()
            .filter(|(_, &v)| v > f32::NEG_INFINITY && f64::from(v) >= lo)
            .map(|(i, &v)| (i as u32, v)),
    );
    if p.typical_p < 1.0 {
        typical(&mut cands, p.typical_p);
    }
    if p.top_p < 1.0 {
        let (w, sum) = weights(&cands);
        let q: Vec<f32> = w.iter().map(|&e| pl::prob(e, sum)).collect();
        let mut desc = q.clone();
        desc.sort_by(|a, b| b.total_cmp(a));
        let (tau, _) = pl::top_p_cut(desc, p.top_p);
        let mut i = 0;
        cands.retain(|_| {
            i += 1;
            q[i - 1] >= tau
        });
    }
    if p.min_p > 0.0 {
        let tau = pl::min_p_threshold(top(&cands), p.min_p);
        cands.retain(|c| c.1 >= tau);
    }
    if cands.len() >= 2 && row.xtc_acts() {
        let (w, sum) = weights(&cands);
        let set = cands
            .iter()
            .zip(&w)
            .map(|(c, &e)| (c.1, pl::prob64(e, sum)));
        if let Some(low) = pl::xtc_cut(set, p.xtc_threshold) {
            cands.retain(|c| c.1 <= low);
        }
    }
    // stage 9: the CPU's Gumbel draw over the candidate list (vector Philox, bounds)
    if cands.is_empty() {
        return Err(RowError::NoWinner);
    }
    let token = draw(
        &cands,
        row.state.seed,
        row.step(),
        &mut s.tmp2,
        &mut s.words,
    );
    let logprobs = p.logprobs.map(|n| match p.logprobs_mode {
        LogprobsMode::Raw => full_logprobs(x, token, n, s),
        LogprobsMode::Processed => subset_logprobs(&cands, token, n, &mut s.tmp),
    });
    let kept = p.kept.map(|n| pl::kept_of(&cands, n));
    Ok(Sample {
        token,
        logprobs,
        kept,
    })
}

/// Stage 6a on the candidates: the shared walk ([`pl::typical_cut`]) over the tokens
/// whose score is at most a bound `B`, sorted, instead of over all of them. Every token
/// left out scores above `B` (a score `|-ln q - H|` above `B >= H` means `-ln q > H + B`),
/// so if the walk's mass exceeds `p` among them its cut is the whole set's; otherwise
/// the bound doubles (at last: every token).
fn typical(cands: &mut Vec<(u32, f32)>, p: f32) {
    let (w, sum) = weights(cands);
    let q: Vec<f64> = w.iter().map(|&e| pl::prob64(e, sum)).collect();
    let h = pl::entropy(&q);
    let scores: Vec<f64> = q.iter().map(|&v| pl::typical_score(v, h)).collect();
    let mut bound = h + 8.0;
    let cut = loop {
        let mut near: Vec<(f64, f64)> = scores
            .iter()
            .zip(&q)
            .filter(|(s, _)| **s <= bound)
            .map(|(&s, &v)| (s, v))
            .collect();
        near.sort_by(|a, b| a.0.total_cmp(&b.0));
        let all = near.len() == q.len();
        match pl::typical_walk(near, p).0 {
            Some(s) => break s,
            None if all || bound.is_infinite() => break f64::INFINITY,
            None => {
                bound = if bound > 1e3 {
                    f64::INFINITY
                } else {
                    2.0 * bound
                }
            }
        }
    };
    let mut i = 0;
    cands.retain(|_| {
        i += 1;
        scores[i - 1] <= cut
    });
}

/// The candidates' top-p weights against their largest value, and their sum in f64.
fn weights(cands: &[(u32, f32)]) -> (Vec<f32>, f64) {
    let m = top(cands);
    let w: Vec<f32> = cands.iter().map(|c| pl::weight(c.1, m)).collect();
    let sum = w.iter().map(|&e| f64::from(e)).sum();
    (w, sum)
}

/// The largest value of a candidate list.
fn top(c: &[(u32, f32)]) -> f32 {
    c.iter().fold(f32::NEG_INFINITY, |a, c| a.max(c.1))
}
