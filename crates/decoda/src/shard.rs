//! Vocabulary-sharded sampling (docs/CONTRACT.md, "Sampling a vocabulary split across
//! shards"): each shard holds the logits of ids `offset .. offset + Vs` of a vocabulary
//! of V for B rows; a few rounds of small summaries, merged anywhere, pick the token the
//! unsharded call picks, with its log-probabilities.
//!
//! Exact because every decision is a comparison against a value one shard can compute
//! alone and the merge can combine without rounding: the noise is keyed by the global id;
//! bias, penalties and DRY touch each id where it lives (the history holds global ids);
//! greedy is the largest z (ties: the smallest id); top-k's threshold is the k-th largest
//! y of the shards' own k largest; min-p's comes from the largest y; the draw is the
//! largest `y + g` over the shards' winners (ties: the smallest id). Log-probabilities
//! add the shards' `Σ exp(v - vmax)` in f64 (another association than one row's sum:
//! the same values within the contract's `1e-5` between backends) and count the rank
//! across shards.
//!
//! The rounds (each O(B (k + n)) values a shard, never O(V)):
//! 1. [`round1`]: per row, the shard's largest z (and its smallest id), largest raw
//!    logit, non-finite counts, its `max(k, n)` largest y and z and n largest raw logits
//!    (ids global), and a digest of the row's request; [`plan`] merges them (refusing
//!    rows whose shards disagree on the request).
//! 2. [`round2`]: per row, the shard's best `y + g` over the kept set and its partial
//!    log-sum-exp; [`decide`] picks the token.
//! 3. [`round3`] (rows asking for log-probabilities): how many of the shard's tokens rank
//!    before the chosen one; [`finish`] assembles each row's result.
//!
//! [`sample_sharded`] runs the rounds in one process (the merge of every round over the
//! shards given), for tests and for callers that hold every shard; a distributed caller
//! exchanges the summaries (serde) over its own collectives.
//!
//! Stages that need a sum over the kept set to decide (top-p, typical-p, top-n-σ, XTC)
//! and the kept distribution are refused by name for now; nothing is approximate.

use std::borrow::Cow;

use rayon::prelude::*;
use serde::{Deserialize, Serialize};

use crate::error::{Error, Result, RowError};
use crate::params::{LogprobsMode, Request};
use crate::philox::{
    gumbel_bucket_bounds, gumbel_from_bits, philox4x32_10, seed_key, GUMBEL_MAX_BOUND,
};
use crate::pipeline::{
    is_greedy, logprob, min_p_threshold, rank_order, sparse_mods, z_lower_bound, RowResult, Sample,
    TokenLogprobs, TopLogprob,
};

/// One shard's logits: `rows` rows of `width` values, ids `offset .. offset + width`.
#[derive(Debug, Clone, Copy)]
pub struct ShardRows<'a> {
    /// Row-major `[rows, width]` logits.
    pub logits: &'a [f32],
    /// Ids this shard holds.
    pub width: usize,
    /// The first id it holds.
    pub offset: usize,
}

/// Round 1 of one row on one shard.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Round1 {
    /// A digest of the row's request and the vocabulary: every shard must hold the same.
    pub digest: u64,
    /// NaN or `+inf` logits (after the mask), and after bias and penalties.
    pub bad: (u64, u64),
    /// The largest z and the smallest id holding it (`u32::MAX`: none finite).
    pub zmax: (f32, u32),
    /// The largest raw (masked) logit.
    pub xmax: f32,
    /// The `max(k, n)` largest y in the contract's rank order (empty for greedy
    /// temperatures). The lists hold values other than NaN and `-inf` only, so they may
    /// be shorter than asked.
    pub top_y: Vec<(u32, f32)>,
    /// The `n` largest z (processed log-probabilities).
    pub top_z: Vec<(u32, f32)>,
    /// The `n` largest raw logits (raw log-probabilities).
    pub top_x: Vec<(u32, f32)>,
}

/// What round 1 decided for a row (every rank merges the same summaries to the same
/// plan, so plans are not exchanged).
#[derive(Debug, Clone, PartialEq)]
pub enum Plan {
    /// The row failed (the same error the unsharded call gives).
    Failed(RowError),
    /// Greedy: the token, with the largest z.
    Greedy {
        /// The token.
        token: u32,
        /// Its z.
        zmax: f32,
        /// The largest raw logit.
        xmax: f32,
    },
    /// A draw over the kept set: the tokens of finite `y >= floor`.
    Draw {
        /// The largest y.
        ymax: f32,
        /// The kept set's floor (top-k's and min-p's thresholds together).
        floor: f32,
        /// The largest raw logit.
        xmax: f32,
    },
}

/// Round 2 of one row on one shard.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Round2 {
    /// The shard's best `(y + g, id, y, raw logit)` over its kept tokens (draws).
    pub best: Option<(f32, u32, f32, f32)>,
    /// The greedy token's raw logit, from the shard holding it.
    pub greedy_x: Option<f32>,
    /// `Σ exp(v - vmax)` over the shard's tokens (f64) for the row's log-probabilities.
    pub lse_part: f64,
}

/// What round 2 decided for a row.
#[derive(Debug, Clone, PartialEq)]
pub struct Decision {
    /// The token, or the row's error.
    pub token: std::result::Result<u32, RowError>,
    /// The token's value in the log-probabilities' terms (raw logit, y or z).
    pub value: f32,
    /// The log-sum-exp of the row's log-probabilities.
    pub lse: f64,
}

/// Round 3 of one row on one shard: its tokens ranked before the chosen one.
pub type Round3 = u64;

/// FNV-1a of the request as JSON and the vocabulary.
pub(crate) fn digest(req: &Request, vocab: usize) -> u64 {
    let bytes = serde_json::to_vec(req).unwrap_or_default();
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in bytes.iter().chain(&(vocab as u64).to_le_bytes()) {
        h ^= u64::from(*b);
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    h
}

/// The first stage a sharded call does not run, by its field name.
fn refused(req: &Request) -> Option<&'static str> {
    let p = &req.params;
    if p.top_p < 1.0 {
        Some("top_p")
    } else if p.typical_p < 1.0 {
        Some("typical_p")
    } else if p.top_n_sigma > 0.0 {
        Some("top_n_sigma")
    } else if p.xtc_probability > 0.0 && p.xtc_threshold <= 0.5 {
        Some("xtc_probability")
    } else if p.kept.is_some() {
        Some("kept")
    } else {
        None
    }
}

/// Checks a shard's requests: one a row, each valid for V and run sharded, and the
/// shard's ids `offset .. offset + width` within V (every backend's door).
pub(crate) fn check_rows(
    width: usize,
    offset: usize,
    vocab: usize,
    reqs: &[Request],
) -> Result<()> {
    if width == 0 || offset + width > vocab {
        return Err(Error::Shape(format!(
            "a shard of ids {offset} .. {} in a vocabulary of {vocab}",
            offset + width
        )));
    }
    for (row, r) in reqs.iter().enumerate() {
        r.validate(row, vocab)?;
        if let Some(field) = refused(r) {
            return Err(Error::InvalidParameter {
                row,
                field,
                value: "set".into(),
                expected: "off in a sharded call (this stage is not sharded yet)",
            });
        }
    }
    Ok(())
}

/// Checks that the merged plans (and decisions) a later round takes are one a row
/// (every backend's rounds 2 and 3).
pub(crate) fn check_merged(
    reqs: &[Request],
    plans: &[Plan],
    decisions: Option<&[Decision]>,
) -> Result<()> {
    let d = decisions.map_or(reqs.len(), <[Decision]>::len);
    if plans.len() != reqs.len() || d != reqs.len() {
        return Err(Error::Shape(format!(
            "{} plans and {d} decisions for {} rows",
            plans.len(),
            reqs.len()
        )));
    }
    Ok(())
}

/// Checks the call: [`check_rows`], and the logits `[rows, width]`.
fn check(shard: &ShardRows<'_>, vocab: usize, reqs: &[Request]) -> Result<()> {
    check_rows(shard.width, shard.offset, vocab, reqs)?;
    if shard.logits.len() != reqs.len() * shard.width {
        return Err(Error::Shape(format!(
            "{} logits for {} rows of {} ids",
            shard.logits.len(),
            reqs.len(),
            shard.width
        )));
    }
    Ok(())
}

/// A row's masked raw logits and its z (bias, penalties and DRY applied to the shard's
/// own ids), borrowed from the logits where the row has no mask or no touched id here.
fn row_values<'a>(x: &'a [f32], offset: usize, req: &Request) -> (Cow<'a, [f32]>, Cow<'a, [f32]>) {
    let masked: Cow<'a, [f32]> = match &req.allowed {
        None => Cow::Borrowed(x),
        Some(m) => Cow::Owned(
            x.iter()
                .enumerate()
                .map(|(j, &v)| {
                    let i = offset + j;
                    if m[i / 32] >> (i % 32) & 1 == 1 {
                        v
                    } else {
                        f32::NEG_INFINITY
                    }
                })
                .collect(),
        ),
    };
    let end = offset + x.len();
    let own = |t: u32| (t as usize) >= offset && (t as usize) < end;
    let mods: Vec<(u32, f32)> = sparse_mods(
        |t| {
            if own(t) {
                masked[t as usize - offset]
            } else {
                0.0
            }
        },
        req,
    )
    .into_iter()
    .filter(|&(t, _)| own(t))
    .collect();
    if mods.is_empty() {
        let z = masked.clone();
        return (masked, z);
    }
    let mut z = masked.to_vec();
    for (t, zt) in mods {
        z[t as usize - offset] = zt;
    }
    (masked, Cow::Owned(z))
}

fn bad(v: &[f32]) -> u64 {
    crate::pipeline::count_non_finite(v)
}

/// Whether a value enters the top lists: neither NaN (its row fails) nor `-inf` (it
/// never counts: a list shorter than asked means the rest are `-inf`).
pub(crate) fn listed(v: f32) -> bool {
    !v.is_nan() && v != f32::NEG_INFINITY
}

/// The `n` first of `cands` in the contract's rank order.
pub(crate) fn ranked(mut cands: Vec<(u32, f32)>, n: usize) -> Vec<(u32, f32)> {
    cands.sort_by(rank_order);
    cands.truncate(n);
    cands
}

/// The `n` largest listed `(global id, value)` pairs in the contract's rank order, in one
/// pass that keeps at most `4 n` candidates (a value below the n-th kept one cannot
/// enter; ids ascend, so an equal value ranks after the kept ones).
fn top(values: impl Iterator<Item = f32>, offset: usize, n: usize) -> Vec<(u32, f32)> {
    if n == 0 {
        return Vec::new();
    }
    let mut buf: Vec<(u32, f32)> = Vec::with_capacity(4 * n + 1);
    let mut floor = f32::NEG_INFINITY;
    let mut full = false;
    for (j, v) in values.enumerate() {
        if !listed(v) || (full && v.total_cmp(&floor) != std::cmp::Ordering::Greater) {
            continue;
        }
        buf.push(((offset + j) as u32, v));
        if buf.len() > 4 * n {
            buf.select_nth_unstable_by(n - 1, rank_order);
            buf.truncate(n);
            floor = buf.iter().map(|c| c.1).fold(f32::INFINITY, f32::min);
            full = true;
        }
    }
    ranked(buf, n)
}

fn lp_count(req: &Request) -> usize {
    req.params.logprobs.map_or(0, |n| n as usize)
}

fn top_k_of(req: &Request, vocab: usize) -> usize {
    let k = req.params.top_k as usize;
    if k > 0 && k < vocab {
        k
    } else {
        0
    }
}

/// How many entries round 1 lists for a row: `(top_y, top_z, top_x)`.
pub(crate) fn list_sizes(req: &Request, vocab: usize) -> (usize, usize, usize) {
    let n = lp_count(req);
    let m_y = if req.params.temperature < crate::params::GREEDY_TEMPERATURE {
        0
    } else {
        top_k_of(req, vocab).max(n)
    };
    if req.params.logprobs_mode == LogprobsMode::Raw {
        (m_y, 0, n)
    } else {
        (m_y, n, 0)
    }
}

/// `f` of every row in order: the rows in parallel when there are several (one row runs
/// on the calling thread, without a hand-off to the pool).
fn by_row<T: Send>(rows: usize, f: impl Fn(usize) -> T + Sync + Send) -> Vec<T> {
    if rows < 2 {
        (0..rows).map(f).collect()
    } else {
        (0..rows).into_par_iter().map(f).collect()
    }
}

/// Round 1 on one shard: a summary per row.
pub fn round1(shard: &ShardRows<'_>, vocab: usize, reqs: &[Request]) -> Result<Vec<Round1>> {
    check(shard, vocab, reqs)?;
    // (in series: the same loop as a function of its own, or in a closure handed to the
    // pool, measured 50% slower at B = 1 on this code's benchmark)
    Ok(reqs
        .iter()
        .enumerate()
        .map(|(r, req)| {
            let x = &shard.logits[r * shard.width..(r + 1) * shard.width];
            let (masked, z) = row_values(x, shard.offset, req);
            let mut zmax = (f32::NEG_INFINITY, u32::MAX);
            for (j, &v) in z.iter().enumerate() {
                if v > zmax.0 {
                    zmax = (v, (shard.offset + j) as u32);
                }
            }
            let xmax = masked.iter().copied().fold(f32::NEG_INFINITY, f32::max);
            let (m_y, n_z, n_x) = list_sizes(req, vocab);
            let t = req.params.temperature;
            Round1 {
                digest: digest(req, vocab),
                bad: (bad(&masked), bad(&z)),
                zmax,
                xmax,
                top_y: top(z.iter().map(|&v| v / t), shard.offset, m_y),
                top_z: top(z.iter().copied(), shard.offset, n_z),
                top_x: top(masked.iter().copied(), shard.offset, n_x),
            }
        })
        .collect())
}

/// The per-shard summaries of row `r` (`rounds[s][r]`).
fn of_row<T>(rounds: &[Vec<T>], r: usize) -> impl Iterator<Item = &T> {
    rounds.iter().map(move |s| &s[r])
}

/// Merges round 1 (`r1[shard][row]`): each row's plan. Shards that disagree on a row's
/// request (parameters, seed, step, history) are an error naming the row.
pub fn plan(r1: &[Vec<Round1>], vocab: usize, reqs: &[Request]) -> Result<Vec<Plan>> {
    if r1.is_empty() || r1.iter().any(|s| s.len() != reqs.len()) {
        return Err(Error::Shape(format!(
            "round 1 of {} shards for {} rows: every shard summarises every row",
            r1.len(),
            reqs.len()
        )));
    }
    reqs.iter()
        .enumerate()
        .map(|(r, req)| {
            let want = digest(req, vocab);
            if let Some(s) = of_row(r1, r).position(|x| x.digest != want) {
                return Err(Error::InvalidParameter {
                    row: r,
                    field: "request",
                    value: format!("shard {s}'s digest differs"),
                    expected: "the same parameters, seed, step and history on every shard",
                });
            }
            let (bx, bz) = of_row(r1, r).fold((0, 0), |a, x| (a.0 + x.bad.0, a.1 + x.bad.1));
            if bx > 0 {
                return Ok(Plan::Failed(RowError::NonFiniteLogits { count: bx }));
            }
            if bz > 0 {
                return Ok(Plan::Failed(RowError::NonFiniteLogits { count: bz }));
            }
            let zmax = of_row(r1, r).fold((f32::NEG_INFINITY, u32::MAX), |a, x| {
                if x.zmax.0 > a.0 || (x.zmax.0 == a.0 && x.zmax.1 < a.1) {
                    x.zmax
                } else {
                    a
                }
            });
            let xmax = of_row(r1, r)
                .map(|x| x.xmax)
                .fold(f32::NEG_INFINITY, f32::max);
            if zmax.0 == f32::NEG_INFINITY {
                return Ok(Plan::Failed(RowError::NoCandidate));
            }
            let t = req.params.temperature;
            if is_greedy(t, zmax.0) {
                return Ok(Plan::Greedy {
                    token: zmax.1,
                    zmax: zmax.0,
                    xmax,
                });
            }
            let ymax = zmax.0 / t;
            let k = top_k_of(req, vocab);
            let tau_k = if k > 0 {
                let mut ys: Vec<f32> = of_row(r1, r)
                    .flat_map(|x| x.top_y.iter().map(|c| c.1))
                    .collect();
                ys.sort_by(|a, b| b.total_cmp(a));
                ys.get(k - 1).copied().unwrap_or(f32::NEG_INFINITY)
            } else {
                f32::NEG_INFINITY
            };
            // top-k keeps the largest y: min-p's threshold is from it
            let tau_p = min_p_threshold(ymax, req.params.min_p);
            Ok(Plan::Draw {
                ymax,
                floor: tau_k.max(tau_p),
                xmax,
            })
        })
        .collect()
}

/// The shard's best `(y + g, id, y, _)` over its kept tokens (`y = z / t`, finite and
/// at least `floor`), ties to the smaller id; the noise of global id `offset + j`. In
/// one pass: a z below `floor`'s bound in unscaled space (`z_lower_bound`) is not
/// divided; a token more than the largest noise below the best score so far makes no
/// Philox word; the others' words (one block for four ids) bound their noise from
/// above, and only a token whose `y` plus that bound reaches the best score pays for the
/// exact noise. Same result as drawing every kept token.
fn draw(
    z: &[f32],
    t: f32,
    floor: f32,
    offset: usize,
    seed: u64,
    step: u64,
) -> Option<(f32, u32, f32, f32)> {
    let zl = z_lower_bound(floor, t);
    let key = seed_key(seed);
    let bounds = gumbel_bucket_bounds();
    let mut best: Option<(f32, u32, f32)> = None;
    let mut block = (u32::MAX, [0u32; 4]);
    for (j, &zj) in z.iter().enumerate() {
        if zj < zl {
            continue;
        }
        let y = zj / t;
        if !(y > f32::NEG_INFINITY && y >= floor) {
            continue;
        }
        // no noise reaches GUMBEL_MAX_BOUND: such a token needs no Philox word
        if best.is_some_and(|b| y + GUMBEL_MAX_BOUND <= b.0) {
            continue;
        }
        let id = (offset + j) as u32;
        if block.0 != id / 4 {
            let counter = [id / 4, step as u32, (step >> 32) as u32, 0];
            block = (id / 4, philox4x32_10(counter, key));
        }
        let w = block.1[(id % 4) as usize];
        // y + bound >= y + g after rounding too: a token whose bound is below the best
        // score cannot reach it (ids ascend: a tie keeps the best)
        if best.is_some_and(|b| y + bounds[(w >> 20) as usize] <= b.0) {
            continue;
        }
        let s = y + gumbel_from_bits(w);
        if best.is_none_or(|b| s > b.0) {
            best = Some((s, id, y));
        }
    }
    best.map(|b| (b.0, b.1, b.2, 0.0))
}

/// Round 2 on one shard, from the plans.
pub fn round2(
    shard: &ShardRows<'_>,
    vocab: usize,
    reqs: &[Request],
    plans: &[Plan],
) -> Result<Vec<Round2>> {
    check(shard, vocab, reqs)?;
    check_merged(reqs, plans, None)?;
    Ok(by_row(reqs.len(), |r| {
        let (req, plan) = (&reqs[r], &plans[r]);
        let x = &shard.logits[r * shard.width..(r + 1) * shard.width];
        let mut out = Round2::default();
        if matches!(plan, Plan::Failed(_)) {
            return out;
        }
        let (masked, z) = row_values(x, shard.offset, req);
        let raw = req.params.logprobs_mode == LogprobsMode::Raw;
        let wants_lp = req.params.logprobs.is_some();
        match *plan {
            Plan::Greedy { token, zmax, xmax } => {
                let t = token as usize;
                if t >= shard.offset && t < shard.offset + shard.width {
                    out.greedy_x = Some(masked[t - shard.offset]);
                }
                if wants_lp {
                    out.lse_part = if raw {
                        masked.iter().map(|&v| f64::from(v - xmax).exp()).sum()
                    } else {
                        z.iter().map(|&v| f64::from(v - zmax).exp()).sum()
                    };
                }
            }
            Plan::Draw { ymax, floor, xmax } => {
                let t = req.params.temperature;
                let kept = |y: f32| y > f32::NEG_INFINITY && y >= floor;
                out.best = draw(&z, t, floor, shard.offset, req.state.seed, req.state.step);
                if wants_lp {
                    out.lse_part = if raw {
                        masked.iter().map(|&v| f64::from(v - xmax).exp()).sum()
                    } else {
                        let zl = z_lower_bound(floor, t);
                        z.iter()
                            .filter(|&&zj| zj >= zl)
                            .map(|&zj| zj / t)
                            .filter(|&y| kept(y))
                            .map(|y| f64::from(y - ymax).exp())
                            .sum()
                    };
                }
                if let Some(b) = out.best.as_mut() {
                    b.3 = masked[b.1 as usize - shard.offset];
                }
            }
            Plan::Failed(_) => {}
        }
        out
    }))
}

/// Merges round 2 (`r2[shard][row]`): each row's token (or error) and its value.
pub fn decide(r2: &[Vec<Round2>], plans: &[Plan], reqs: &[Request]) -> Vec<Decision> {
    plans
        .iter()
        .zip(reqs)
        .enumerate()
        .map(|(r, (plan, req))| {
            let lse = of_row(r2, r).map(|x| x.lse_part).sum::<f64>().ln();
            let raw = req.params.logprobs_mode == LogprobsMode::Raw;
            match plan {
                Plan::Failed(e) => Decision {
                    token: Err(*e),
                    value: 0.0,
                    lse,
                },
                Plan::Greedy { token, zmax, .. } => Decision {
                    token: Ok(*token),
                    value: if raw {
                        of_row(r2, r).find_map(|x| x.greedy_x).unwrap_or(*zmax)
                    } else {
                        *zmax
                    },
                    lse,
                },
                Plan::Draw { .. } => {
                    let best = of_row(r2, r).filter_map(|x| x.best).fold(
                        None::<(f32, u32, f32, f32)>,
                        |a, b| match a {
                            Some(a) if a.0 > b.0 || (a.0 == b.0 && a.1 < b.1) => Some(a),
                            _ => Some(b),
                        },
                    );
                    match best {
                        None => Decision {
                            token: Err(RowError::NoWinner),
                            value: 0.0,
                            lse,
                        },
                        Some((_, id, y, x)) => Decision {
                            token: Ok(id),
                            value: if raw { x } else { y },
                            lse,
                        },
                    }
                }
            }
        })
        .collect()
}

/// Round 3 on one shard (rows with log-probabilities; 0 for the others): its tokens
/// ranked before each row's chosen one.
pub fn round3(
    shard: &ShardRows<'_>,
    vocab: usize,
    reqs: &[Request],
    plans: &[Plan],
    decisions: &[Decision],
) -> Result<Vec<Round3>> {
    check(shard, vocab, reqs)?;
    check_merged(reqs, plans, Some(decisions))?;
    Ok(by_row(reqs.len(), |r| {
        let (req, plan, d) = (&reqs[r], &plans[r], &decisions[r]);
        let Ok(token) = d.token else { return 0 };
        if req.params.logprobs.is_none() {
            return 0;
        }
        let x = &shard.logits[r * shard.width..(r + 1) * shard.width];
        let (masked, z) = row_values(x, shard.offset, req);
        let chosen = (token, d.value);
        let before = |v: &mut dyn Iterator<Item = (u32, f32)>| {
            v.filter(|c| rank_order(c, &chosen) == std::cmp::Ordering::Less)
                .count() as u64
        };
        let ids = |j: usize| (shard.offset + j) as u32;
        match (req.params.logprobs_mode, plan) {
            (LogprobsMode::Raw, _) => {
                before(&mut masked.iter().enumerate().map(|(j, &v)| (ids(j), v)))
            }
            (LogprobsMode::Processed, Plan::Greedy { .. }) => {
                before(&mut z.iter().enumerate().map(|(j, &v)| (ids(j), v)))
            }
            (LogprobsMode::Processed, Plan::Draw { floor, .. }) => {
                let t = req.params.temperature;
                before(&mut z.iter().enumerate().filter_map(|(j, &v)| {
                    let y = v / t;
                    (y > f32::NEG_INFINITY && y >= *floor).then_some((ids(j), y))
                }))
            }
            (_, Plan::Failed(_)) => 0,
        }
    }))
}

/// Merges round 3 (`r3[shard][row]`, empty when no row asked for log-probabilities)
/// with the earlier rounds: each row's result, as the unsharded call returns it.
pub fn finish(
    r1: &[Vec<Round1>],
    r3: &[Vec<Round3>],
    plans: &[Plan],
    decisions: &[Decision],
    reqs: &[Request],
) -> Vec<RowResult> {
    decisions
        .iter()
        .zip(plans.iter().zip(reqs))
        .enumerate()
        .map(|(r, (d, (plan, req)))| {
            let token = d.token?;
            let logprobs = req.params.logprobs.map(|n| {
                let (vmax, cands): (f32, Vec<(u32, f32)>) = match (req.params.logprobs_mode, plan) {
                    (LogprobsMode::Raw, Plan::Greedy { xmax, .. })
                    | (LogprobsMode::Raw, Plan::Draw { xmax, .. }) => {
                        (*xmax, of_row(r1, r).flat_map(|x| x.top_x.clone()).collect())
                    }
                    (LogprobsMode::Processed, Plan::Greedy { zmax, .. }) => {
                        (*zmax, of_row(r1, r).flat_map(|x| x.top_z.clone()).collect())
                    }
                    (LogprobsMode::Processed, Plan::Draw { ymax, floor, .. }) => (
                        *ymax,
                        of_row(r1, r)
                            .flat_map(|x| x.top_y.clone())
                            .filter(|c| c.1 > f32::NEG_INFINITY && c.1 >= *floor)
                            .collect(),
                    ),
                    (_, Plan::Failed(_)) => (0.0, Vec::new()),
                };
                let mut cands = cands;
                cands.sort_by(rank_order);
                let rank = 1 + r3.iter().map(|s| s[r]).sum::<u64>() as u32;
                TokenLogprobs {
                    logprob: logprob(d.value, vmax, d.lse),
                    rank,
                    top: cands
                        .iter()
                        .filter(|c| c.1 > f32::NEG_INFINITY)
                        .take(n as usize)
                        .map(|&(token, v)| TopLogprob {
                            token,
                            logprob: logprob(v, vmax, d.lse),
                        })
                        .collect(),
                }
            });
            Ok(Sample {
                token,
                logprobs,
                kept: None,
            })
        })
        .collect()
}

/// Every round over `shards` in this process: the shards must cover `0 .. vocab` once
/// (any order, uneven widths). Returns each row's result, as the unsharded call
/// ([`crate::Backend::sample`]) returns it.
pub fn sample_sharded(
    shards: &[ShardRows<'_>],
    vocab: usize,
    reqs: &[Request],
) -> Result<Vec<RowResult>> {
    let mut spans: Vec<(usize, usize)> = shards.iter().map(|s| (s.offset, s.width)).collect();
    spans.sort_unstable();
    let mut at = 0;
    for &(o, w) in &spans {
        if o > at {
            return Err(Error::Shape(format!(
                "ids {at} .. {o} are in no shard: every id of 0 .. {vocab} must be in one"
            )));
        }
        if o < at {
            return Err(Error::Shape(format!(
                "ids {o} .. {at} are in two shards: every id of 0 .. {vocab} must be in one"
            )));
        }
        at = o + w;
    }
    if at != vocab {
        return Err(Error::Shape(format!(
            "the shards cover 0 .. {at} of a vocabulary of {vocab}"
        )));
    }
    let r1: Vec<Vec<Round1>> = shards
        .iter()
        .map(|s| round1(s, vocab, reqs))
        .collect::<Result<_>>()?;
    let plans = plan(&r1, vocab, reqs)?;
    let r2: Vec<Vec<Round2>> = shards
        .iter()
        .map(|s| round2(s, vocab, reqs, &plans))
        .collect::<Result<_>>()?;
    let decisions = decide(&r2, &plans, reqs);
    let r3: Vec<Vec<Round3>> = if reqs.iter().any(|q| q.params.logprobs.is_some()) {
        shards
            .iter()
            .map(|s| round3(s, vocab, reqs, &plans, &decisions))
            .collect::<Result<_>>()?
    } else {
        Vec::new()
    };
    let r3 = if r3.is_empty() {
        vec![vec![0; reqs.len()]]
    } else {
        r3
    };
    Ok(finish(&r1, &r3, &plans, &decisions, reqs))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The gated draw against drawing every kept token: random rows (ties, `-inf`, wide
    /// and narrow spreads), temperatures, floors and offsets.
    #[test]
    fn gated_draw_is_drawing_every_kept_token() {
        let mut state = 0x2545_f491_4f6c_dd1d_u64;
        let mut next = move || {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state
        };
        for case in 0..400 {
            let n = 1 + (next() % 3000) as usize;
            let spread = [0.5f32, 6.0, 40.0][case % 3];
            let z: Vec<f32> = (0..n)
                .map(|i| match next() % 13 {
                    0 => f32::NEG_INFINITY,
                    1 => (i % 4) as f32, // ties
                    _ => (next() % 1_000_000) as f32 / 1e6 * spread - spread / 2.0,
                })
                .collect();
            let t = [0.3f32, 1.0, 1.7, 7.0][case % 4];
            let floor = if case % 5 == 0 {
                f32::NEG_INFINITY
            } else {
                ((next() % 1000) as f32 / 1000.0 - 0.5) * spread / t
            };
            let offset = (next() % 200_000) as usize;
            let (seed, step) = (next(), next() % 1000);
            let mut want: Option<(f32, u32, f32, f32)> = None;
            for (j, &zj) in z.iter().enumerate() {
                let y = zj / t;
                if !(y > f32::NEG_INFINITY && y >= floor) {
                    continue;
                }
                let id = (offset + j) as u32;
                let s = y + crate::philox::gumbel(seed, step, id);
                if want.is_none_or(|b| s > b.0) {
                    want = Some((s, id, y, 0.0));
                }
            }
            assert_eq!(draw(&z, t, floor, offset, seed, step), want, "case {case}");
        }
    }
}
