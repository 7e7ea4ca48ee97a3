//! Log-probabilities: raw (`log_softmax` of the logits) or processed (over the kept
//! set), the chosen token's rank and the `n` most likely, ties by smaller id.

use super::result::{TokenLogprobs, TopLogprob};

/// The log-sum-exp of `v - vmax` over `v`, in f64.
pub fn log_sum_exp(values: impl IntoIterator<Item = f32>, vmax: f32) -> f64 {
    let s: f64 = values.into_iter().map(|v| f64::from(v - vmax).exp()).sum();
    s.ln()
}

/// A log-probability: `(v - vmax) - lse`.
#[inline]
pub fn logprob(v: f32, vmax: f32, lse: f64) -> f32 {
    (f64::from(v - vmax) - lse) as f32
}

/// Orders by value descending, then id ascending (the contract's order for ranks and top-n).
#[inline]
pub fn rank_order(a: &(u32, f32), b: &(u32, f32)) -> std::cmp::Ordering {
    b.1.total_cmp(&a.1).then(a.0.cmp(&b.0))
}

/// Builds the reported log-probabilities from: the chosen token and its value, its rank,
/// and the top candidates `(id, value)` already ordered by [`rank_order`] (at least `n` of
/// them when that many have finite values). Values become log-probabilities through
/// `vmax` and `lse`.
pub fn assemble_logprobs(
    chosen: (u32, f32),
    rank: u32,
    top_sorted: &[(u32, f32)],
    n: u32,
    vmax: f32,
    lse: f64,
) -> TokenLogprobs {
    TokenLogprobs {
        logprob: logprob(chosen.1, vmax, lse),
        rank,
        top: top_sorted
            .iter()
            .filter(|(_, v)| *v > f32::NEG_INFINITY)
            .take(n as usize)
            .map(|&(token, v)| TopLogprob {
                token,
                logprob: logprob(v, vmax, lse),
            })
            .collect(),
    }
}

/// The `n` first of `pairs` under [`rank_order`] (a total order: ties by id), in that
/// order: selected, then only they sorted.
pub(crate) fn top_in_order(mut pairs: Vec<(u32, f32)>, n: u32) -> Vec<(u32, f32)> {
    let n_top = (n as usize).min(pairs.len());
    if n_top == 0 {
        pairs.clear();
    } else if n_top < pairs.len() {
        pairs.select_nth_unstable_by(n_top - 1, rank_order);
        pairs.truncate(n_top);
    }
    pairs.sort_by(rank_order);
    pairs
}

/// The rank of `chosen` among `(id, value)` pairs: 1 + the number ordered before it.
pub fn rank_of(chosen: (u32, f32), all: impl IntoIterator<Item = (u32, f32)>) -> u32 {
    1 + all
        .into_iter()
        .filter(|c| rank_order(c, &chosen) == std::cmp::Ordering::Less)
        .count() as u32
}

/// Log-probabilities of `log_softmax(values)` over the whole row.
pub(crate) fn full(values: &[f32], token: u32, n: u32) -> TokenLogprobs {
    let all: Vec<(u32, f32)> = values
        .iter()
        .enumerate()
        .map(|(i, &v)| (i as u32, v))
        .collect();
    subset(&all, token, n)
}

/// Log-probabilities of `log_softmax` over the listed `(id, value)` pairs.
pub(crate) fn subset(set: &[(u32, f32)], token: u32, n: u32) -> TokenLogprobs {
    let vmax = set.iter().map(|c| c.1).fold(f32::NEG_INFINITY, f32::max);
    let lse = log_sum_exp(set.iter().map(|c| c.1), vmax);
    // the n first under the order (a total one: ties by id) of the values
    // `assemble_logprobs` lists (above -inf, not NaN), selected, then only they sorted
    let sorted = top_in_order(
        set.iter()
            .copied()
            .filter(|c| c.1 > f32::NEG_INFINITY)
            .collect(),
        n,
    );
    let chosen = *set
        .iter()
        .find(|c| c.0 == token)
        .expect("chosen token is in the set");
    let rank = rank_of(chosen, set.iter().copied());
    assemble_logprobs(chosen, rank, &sorted, n, vmax, lse)
}
