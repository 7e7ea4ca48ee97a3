//! Log-probabilities of the drawn token and the top `n`, over the row or the kept set.

use super::kernels;
use super::scratch::Scratch;
use super::select::select_top;
use crate::pipeline::{self as pl, TokenLogprobs};

/// Log-probabilities of `log_softmax(values)` over the whole row, without sorting it.
pub(super) fn full_logprobs(values: &[f32], token: u32, n: u32, s: &mut Scratch) -> TokenLogprobs {
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
pub(super) fn subset_logprobs(
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
