//! Stage 6a, typical-p: keep the tokens whose `-ln q` lies nearest the entropy, walked
//! by score until their mass exceeds `p`.

use super::weights::{kept_max, prob64, weight};

/// Stage 6a, typical-p, over candidates of probabilities `q` (f64, summing to 1): the
/// entropy `H = -Σ q ln q` (a token of `q = 0` adds nothing) and the largest score kept,
/// `s*`. A token's score is `|-ln q - H|` ([`typical_score`]); walking by increasing
/// score, `m` is the fewest tokens whose `q` sum (f64) exceeds `p`, and `s*` the m-th
/// score; `+inf` (keep all) if the sum never exceeds `p`. Also returns the walk's
/// smallest distance to `p` (for counting ties).
pub fn typical_cut(q: &[f64], p: f32) -> (f64, f64, f64) {
    let h = entropy(q);
    let mut order: Vec<(f64, f64)> = q.iter().map(|&v| (typical_score(v, h), v)).collect();
    order.sort_by(|a, b| a.0.total_cmp(&b.0));
    let (cut, margin) = typical_walk(order, p);
    (h, cut.unwrap_or(f64::INFINITY), margin)
}

/// `H = -Σ q ln q` in f64 (a token of `q = 0` adds nothing): typical-p's entropy.
pub fn entropy(q: &[f64]) -> f64 {
    entropy_of(q.iter().map(|&v| (v, v.ln())))
}

/// [`entropy`] from each token's `(q, ln q)` (`ln q` taken once, for the scores too):
/// the same additions in the same order, so the same bits.
pub fn entropy_of(q_ln: impl Iterator<Item = (f64, f64)>) -> f64 {
    -q_ln.filter(|e| e.0 > 0.0).map(|(v, l)| v * l).sum::<f64>()
}

/// The walk of stage 6a over `(score, q)` pairs in increasing score: the score of the
/// token at which the `q` sum (f64) first exceeds `p` (`None` if it never does), and
/// the walk's smallest distance to `p`.
pub fn typical_walk(by_score: impl IntoIterator<Item = (f64, f64)>, p: f32) -> (Option<f64>, f64) {
    let p = f64::from(p);
    let (mut cum, mut margin) = (0.0f64, f64::INFINITY);
    for (score, v) in by_score {
        let before = cum;
        cum += v;
        margin = margin.min((cum - p).abs()).min((before - p).abs());
        if cum > p {
            return (Some(score), margin);
        }
    }
    (None, margin)
}

/// A token's typical-p score, `|-ln q - H|` (`+inf` for `q = 0`).
#[inline]
pub fn typical_score(q: f64, h: f64) -> f64 {
    typical_score_of(q, q.ln(), h)
}

/// [`typical_score`] from `q` and its `ln q` taken before.
#[inline]
pub fn typical_score_of(q: f64, ln_q: f64, h: f64) -> f64 {
    if q > 0.0 {
        (-ln_q - h).abs()
    } else {
        f64::INFINITY
    }
}

/// Stage 6a over the kept tokens: keeps those whose typical score is at most the cut's;
/// returns the walk's distance to `p` and the scores' distance to the cut
/// ([`TieReport::typical_margin`]).
pub(crate) fn apply(y: &[f32], p: f32, keep: &mut [bool]) -> (f64, f64) {
    let ids: Vec<usize> = (0..y.len()).filter(|&i| keep[i]).collect();
    let ymax = kept_max(y, keep);
    let w: Vec<f32> = ids.iter().map(|&i| weight(y[i], ymax)).collect();
    let sum: f64 = w.iter().map(|&e| f64::from(e)).sum();
    let q: Vec<f64> = w.iter().map(|&e| prob64(e, sum)).collect();
    let (h, cut, margin) = typical_cut(&q, p);
    let scores: Vec<f64> = q.iter().map(|&qi| typical_score(qi, h)).collect();
    for (&i, &s) in ids.iter().zip(&scores) {
        keep[i] = s <= cut;
    }
    let mut score_margin = f64::INFINITY;
    if cut.is_finite() {
        // the y values scored at the cut, sorted for a binary search (a row of many ties
        // at the cut made a linear search quadratic): -0 as +0 and no NaN, so a hit is
        // exactly an `==` match
        let unsigned = |v: f32| if v == 0.0 { 0.0 } else { v };
        let mut at_cut: Vec<f32> = ids
            .iter()
            .zip(&scores)
            .filter(|(&i, &s)| s == cut && !y[i].is_nan())
            .map(|(&i, _)| unsigned(y[i]))
            .collect();
        at_cut.sort_unstable_by(f32::total_cmp);
        let top = f64::from(ymax).abs();
        for (&i, &s) in ids.iter().zip(&scores) {
            let tied = at_cut
                .binary_search_by(|v| v.total_cmp(&unsigned(y[i])))
                .is_ok();
            if s.is_finite() && !tied {
                let scale = 1.0 + f64::from(y[i]).abs() + top;
                score_margin = score_margin.min((s - cut).abs() / scale);
            }
        }
    }
    (margin, score_margin)
}
