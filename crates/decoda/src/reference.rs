//! The reference sampler: the contract written for clarity, used as the oracle in tests.
//!
//! It materialises every stage, sorts where the contract speaks of order, and sums the
//! top-p walk in f64. It is slow on purpose; use [`crate::CpuSampler`] for work.

use crate::backend::Backend;
use crate::error::{Result, RowError};
use crate::logits::Logits;
use crate::params::{LogprobsMode, Request};
use crate::pipeline::{self as pl, Row, RowResult, Sample};

/// How close a row's decision came to a floating-point tie (the contract's "same result" rule).
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct TieReport {
    /// Gap between the winner's and the runner-up's `s`, in ulps of the winner (`u32::MAX`
    /// when there was no runner-up or the draw was greedy).
    pub s_gap_ulps: u32,
    /// Smallest distance of a top-p cumulative sum to `p` around the decision
    /// (`inf` when top-p was off).
    pub top_p_margin: f64,
    /// Smallest distance of a finite `y` to the top-n-σ threshold `τ`, relative to
    /// `|ymax| + n σ` (`inf` when top-n-σ was off).
    pub sigma_margin: f64,
    /// Smallest distance of a kept token's XTC probability `q` to the threshold (`inf`
    /// when XTC did not act).
    pub xtc_margin: f64,
    /// Smallest distance of a typical-p score to the cut `s*`, relative to
    /// `1 + |y| + |ymax|`, over the tokens whose `y` differs from every `y` scoring `s*`
    /// (`inf` when typical-p was off or cut nothing).
    pub typical_margin: f64,
}

impl TieReport {
    /// Whether a different token on another backend is allowed by the contract's "same result" rule.
    pub fn is_tie(&self) -> bool {
        self.s_gap_ulps <= 4 || self.is_set_tie()
    }

    /// Whether the kept set may differ by a token on another backend: a top-p or
    /// typical-p cumulative sum came within `1e-6` of `p`
    /// ([`TieReport::is_top_p_tie`]), a finite `y` within `1e-6 (|ymax| + n σ)` of
    /// the top-n-σ threshold (the device's f32 threshold lies within that of the f64
    /// one), an XTC probability within `1e-6` of its threshold (the device's
    /// fixed-point sums put `q` within about `4e-7`), or a typical-p score within
    /// `1e-5 (1 + |y| + |ymax|)` of the cut (the device scores `|y - c|` in f32).
    pub fn is_set_tie(&self) -> bool {
        self.is_top_p_tie()
            || self.sigma_margin <= 1e-6
            || self.xtc_margin <= 1e-6
            || self.typical_margin <= 1e-5
    }

    /// Whether a top-p cumulative sum came within `1e-6` of `p`: the kept set may then
    /// differ by a token on another backend.
    pub fn is_top_p_tie(&self) -> bool {
        self.top_p_margin <= 1e-6
    }
}

/// The reference sampler.
#[derive(Debug, Clone, Copy, Default)]
pub struct ReferenceSampler;

impl Backend for ReferenceSampler {
    fn name(&self) -> String {
        "reference".into()
    }

    fn sample_rows(&self, logits: &Logits<'_>, rows: &[Row<'_>]) -> Result<Vec<RowResult>> {
        let mut x = Vec::new();
        Ok(rows
            .iter()
            .map(|row| {
                logits.row_to_f32(row.logits_row(), &mut x);
                reference_row_at(&x, row).0
            })
            .collect())
    }
}

fn ulps_between(a: f32, b: f32) -> u32 {
    if !a.is_finite() || !b.is_finite() {
        return if a == b { 0 } else { u32::MAX };
    }
    let key = |v: f32| {
        let bits = v.to_bits() as i32;
        if bits < 0 {
            i64::from(i32::MIN) - i64::from(bits)
        } else {
            i64::from(bits)
        }
    };
    (key(a) - key(b)).unsigned_abs().min(u64::from(u32::MAX)) as u32
}

/// Samples one row (already widened to f32) straight from the contract, and reports how
/// close the decision was to a floating-point tie.
pub fn reference_row(x: &[f32], req: &Request) -> (RowResult, TieReport) {
    reference_row_at(x, &Row::of(req))
}

/// Where the contract's stages leave a row: the greedy token (stage 4) with the row's
/// z, or y and the kept set S after stage 8a.
enum Processed {
    Greedy { token: u32, z: Vec<f32> },
    Kept { y: Vec<f32>, keep: Vec<bool> },
}

/// Stages 1 to 8a of a (masked) row, recording how close each decision was to a tie.
fn process(
    x: &[f32],
    req: &Row<'_>,
    tie: &mut TieReport,
) -> std::result::Result<Processed, RowError> {
    let p = &req.params;
    let v = x.len();
    // Section 5: non-finite logits.
    let bad = pl::count_non_finite(x);
    if bad > 0 {
        return Err(RowError::NonFiniteLogits { count: bad });
    }
    // Stages 1-3.
    let mut z = x.to_vec();
    for (t, zt) in pl::sparse_mods(|t| x[t as usize], req) {
        z[t as usize] = zt;
    }
    let bad = pl::count_non_finite(&z);
    if bad > 0 {
        return Err(RowError::NonFiniteLogits { count: bad });
    }
    let zmax = z.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    if zmax == f32::NEG_INFINITY {
        return Err(RowError::NoCandidate);
    }

    // Stage 4 (and the temperature floor / overflow of stage 5): greedy.
    let t = p.temperature;
    if pl::is_greedy(t, zmax) {
        let token = z.iter().position(|&zi| zi == zmax).expect("max exists") as u32;
        return Ok(Processed::Greedy { token, z });
    }

    // Stage 5: temperature.
    let y: Vec<f32> = z.iter().map(|&zi| zi / t).collect();
    let ymax = zmax / t;
    // S never holds a token at -inf.
    let mut keep: Vec<bool> = y.iter().map(|&a| a > f32::NEG_INFINITY).collect();

    // Stage 5a: top-n-sigma.
    if p.top_n_sigma > 0.0 {
        let tau = pl::top_n_sigma::apply(&y, ymax, p.top_n_sigma, &mut keep);
        tie.sigma_margin = pl::top_n_sigma::margin(&y, ymax, tau);
    }
    // Stage 6: top-k.
    let k = p.top_k as usize;
    if k > 0 && k < v {
        pl::top_k::apply(&y, k, &mut keep);
    }
    // Stage 6a: typical-p over K.
    if p.typical_p < 1.0 {
        let (m, s) = pl::typical::apply(&y, p.typical_p, &mut keep);
        tie.top_p_margin = tie.top_p_margin.min(m);
        tie.typical_margin = s;
    }
    // From here on, ymax is the largest kept value (typical-p may have removed the top).
    let ymax = pl::weights::kept_max(&y, &keep);
    // Stage 7: top-p.
    if p.top_p < 1.0 {
        let m = pl::top_p::apply(&y, ymax, p.top_p, &mut keep);
        tie.top_p_margin = tie.top_p_margin.min(m);
    }
    // Stage 8: min-p.
    pl::min_p::apply(&y, ymax, p.min_p, &mut keep);
    // Stage 8a: XTC.
    if pl::xtc_fires(p, req.state.seed, req.step()) {
        tie.xtc_margin = pl::xtc::apply(&y, p.xtc_threshold, &mut keep);
    }
    Ok(Processed::Kept { y, keep })
}

/// The processed distribution of a row (every stage through 8a applied, at the
/// request's step): the tokens of S in id order with `softmax(y)` over S in f64, or the
/// greedy token at probability 1. What speculative decoding's rejection verification
/// calls q (docs/CONTRACT.md).
pub fn processed_distribution(
    x: &[f32],
    req: &Request,
) -> std::result::Result<Vec<(u32, f64)>, RowError> {
    let row = Row::of(req);
    let x = &*row.mask_row(x);
    let mut tie = TieReport::default();
    Ok(match process(x, &row, &mut tie)? {
        Processed::Greedy { token, .. } => vec![(token, 1.0)],
        Processed::Kept { y, keep } => {
            let ymax = pl::weights::kept_max(&y, &keep);
            let w: Vec<(u32, f64)> = (0..y.len())
                .filter(|&i| keep[i])
                .map(|i| (i as u32, f64::from(y[i] - ymax).exp()))
                .collect();
            let sum: f64 = w.iter().map(|p| p.1).sum();
            w.into_iter().map(|(i, p)| (i, p / sum)).collect()
        }
    })
}

/// [`reference_row`] for a row of a validated call, at that row's step.
fn reference_row_at(x: &[f32], req: &Row<'_>) -> (RowResult, TieReport) {
    // Stage 0: the token mask (a disallowed token's logit is -inf).
    let x = &*req.mask_row(x);
    let p = &req.params;
    let v = x.len();
    let mut tie = TieReport {
        s_gap_ulps: u32::MAX,
        top_p_margin: f64::INFINITY,
        sigma_margin: f64::INFINITY,
        xtc_margin: f64::INFINITY,
        typical_margin: f64::INFINITY,
    };
    let (y, keep) = match process(x, req, &mut tie) {
        Err(e) => return (Err(e), tie),
        Ok(Processed::Greedy { token, z }) => {
            let lp = p.logprobs.map(|n| match p.logprobs_mode {
                LogprobsMode::Raw => pl::logprobs::full(x, token, n),
                LogprobsMode::Processed => pl::logprobs::full(&z, token, n),
            });
            let kept = p.kept.map(|n| pl::kept_of(&[(token, 0.0)], n));
            return (
                Ok(Sample {
                    token,
                    logprobs: lp,
                    kept,
                }),
                tie,
            );
        }
        Ok(Processed::Kept { y, keep }) => (y, keep),
    };

    // Stage 10: the Gumbel draw over S.
    let (token, s_best, runner_up) =
        pl::draw::apply(&y, &keep, req.state.seed, req.step()).expect("S contains the maximum");
    if runner_up > f32::NEG_INFINITY {
        tie.s_gap_ulps = ulps_between(s_best, runner_up);
    }

    let set: Vec<(u32, f32)> = (0..v)
        .filter(|&i| keep[i])
        .map(|i| (i as u32, y[i]))
        .collect();
    let lp = p.logprobs.map(|n| match p.logprobs_mode {
        LogprobsMode::Raw => pl::logprobs::full(x, token, n),
        LogprobsMode::Processed => pl::logprobs::subset(&set, token, n),
    });
    let kept = p.kept.map(|n| pl::kept_of(&set, n));
    (
        Ok(Sample {
            token,
            logprobs: lp,
            kept,
        }),
        tie,
    )
}

/// One stage of [`explain_row`]: the distribution after the stage.
#[derive(Debug, Clone, PartialEq)]
pub struct StageView {
    /// The stage's name.
    pub name: &'static str,
    /// What the stage did, in words.
    pub note: String,
    /// Probabilities over the kept tokens after the stage, most likely first.
    pub probs: Vec<(u32, f64)>,
    /// Tokens the stage removed.
    pub removed: usize,
    /// Entropy of the kept distribution, in bits.
    pub entropy_bits: f64,
}

/// The pipeline of one row stage by stage (for `decoda explain`), with the drawn token.
#[derive(Debug, Clone, PartialEq)]
pub struct Explanation {
    /// The stages in order.
    pub stages: Vec<StageView>,
    /// The result of the row.
    pub result: RowResult,
}

fn view(name: &'static str, note: String, vals: &[f32], keep: &[bool], before: usize) -> StageView {
    let vmax = (0..vals.len())
        .filter(|&i| keep[i])
        .map(|i| vals[i])
        .fold(f32::NEG_INFINITY, f32::max);
    let mut probs: Vec<(u32, f64)> = (0..vals.len())
        .filter(|&i| keep[i])
        .map(|i| (i as u32, f64::from(vals[i] - vmax).exp()))
        .collect();
    let sum: f64 = probs.iter().map(|p| p.1).sum();
    for p in probs.iter_mut() {
        p.1 /= sum;
    }
    probs.retain(|p| p.1 > 0.0);
    probs.sort_by(|a, b| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0)));
    let entropy_bits = -probs.iter().map(|p| p.1 * p.1.log2()).sum::<f64>();
    let kept = keep.iter().filter(|&&k| k).count();
    StageView {
        name,
        note,
        probs,
        removed: before - kept,
        entropy_bits,
    }
}

/// Runs the contract on one row stage by stage, keeping the distribution after each one.
pub fn explain_row(x: &[f32], req: &Request) -> Explanation {
    let p = &req.params;
    let v = x.len();
    let result = reference_row(x, req).0;
    let mut stages = Vec::new();
    let x = &*req.mask_row(x);
    if pl::count_non_finite(x) > 0 {
        return Explanation { stages, result };
    }
    let allowed: Vec<bool> = (0..v).map(|i| req.allows(i)).collect();
    let (name, note) = match &req.allowed {
        Some(_) => {
            let n = allowed.iter().filter(|&&a| a).count();
            (
                "mask",
                format!("softmax of the logits, {n} of {v} tokens allowed by the mask"),
            )
        }
        None => ("input", "softmax of the logits as given".into()),
    };
    stages.push(view(name, note, x, &allowed, v));
    let mut z = x.to_vec();
    let mods = pl::sparse_mods(|t| x[t as usize], req);
    let touched = mods.len();
    for (t, zt) in mods {
        z[t as usize] = zt;
    }
    let finite: Vec<bool> = z.iter().map(|&a| a > f32::NEG_INFINITY).collect();
    stages.push(view(
        "bias+penalties",
        format!("{touched} logits changed by bias, repetition, frequency, presence and DRY"),
        &z,
        &finite,
        v,
    ));
    let zmax = z.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    if zmax == f32::NEG_INFINITY || pl::is_greedy(p.temperature, zmax) {
        return Explanation { stages, result };
    }
    let t = p.temperature;
    let y: Vec<f32> = z.iter().map(|&a| a / t).collect();
    let ymax = zmax / t;
    let mut keep = finite.clone();
    let mut before = keep.iter().filter(|&&k| k).count();
    stages.push(view(
        "temperature",
        format!("logits divided by T = {t}"),
        &y,
        &keep,
        before,
    ));
    if p.top_n_sigma > 0.0 {
        let tau = pl::top_n_sigma::apply(&y, ymax, p.top_n_sigma, &mut keep);
        stages.push(view(
            "top-n-sigma",
            format!(
                "kept y within {} standard deviations of the top (y >= {tau:.4})",
                p.top_n_sigma
            ),
            &y,
            &keep,
            before,
        ));
        before = keep.iter().filter(|&&k| k).count();
    }
    let k = p.top_k as usize;
    if k > 0 && k < v {
        let tau = pl::top_k::apply(&y, k, &mut keep);
        stages.push(view(
            "top-k",
            format!("kept the {k} most likely (ties kept), threshold {tau:.4}"),
            &y,
            &keep,
            before,
        ));
        before = keep.iter().filter(|&&k| k).count();
    }
    if p.typical_p < 1.0 {
        let _ = pl::typical::apply(&y, p.typical_p, &mut keep);
        stages.push(view(
            "typical-p",
            format!(
                "kept the tokens nearest the entropy, mass > {}",
                p.typical_p
            ),
            &y,
            &keep,
            before,
        ));
        before = keep.iter().filter(|&&k| k).count();
    }
    let ymax = pl::weights::kept_max(&y, &keep);
    if p.top_p < 1.0 {
        pl::top_p::apply(&y, ymax, p.top_p, &mut keep);
        stages.push(view(
            "top-p",
            format!("kept the nucleus of mass {}", p.top_p),
            &y,
            &keep,
            before,
        ));
        before = keep.iter().filter(|&&k| k).count();
    }
    if p.min_p > 0.0 {
        pl::min_p::apply(&y, ymax, p.min_p, &mut keep);
        stages.push(view(
            "min-p",
            format!("kept tokens with p >= {} * max p", p.min_p),
            &y,
            &keep,
            before,
        ));
        before = keep.iter().filter(|&&k| k).count();
    }
    if p.xtc_on() {
        let coin = pl::xtc_coin(req.state.seed, req.state.step);
        let fires = coin <= p.xtc_probability;
        if fires {
            pl::xtc::apply(&y, p.xtc_threshold, &mut keep);
        }
        stages.push(view(
            "xtc",
            format!(
                "coin {coin:.4} {} {}: {}",
                if fires { "<=" } else { ">" },
                p.xtc_probability,
                if fires {
                    format!(
                        "top choices (p >= {}) but the last removed",
                        p.xtc_threshold
                    )
                } else {
                    "nothing removed".into()
                }
            ),
            &y,
            &keep,
            before,
        ));
    }
    Explanation { stages, result }
}
