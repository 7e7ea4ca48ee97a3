//! The kept distribution ([`crate::SamplingParams::kept`]): the kept set's size and
//! its `n` most likely tokens with their probabilities.

use super::logprobs::top_in_order;
use super::result::{Kept, KeptToken};

/// The kept distribution of a set `(id, y)`: its size and its `n` most likely tokens
/// (ties: smaller id first) with `softmax(y)` over the set, in f64 rounded to f32.
pub fn kept_of(set: &[(u32, f32)], n: u32) -> Kept {
    let vmax = set.iter().map(|c| c.1).fold(f32::NEG_INFINITY, f32::max);
    let sum: f64 = set.iter().map(|c| f64::from(c.1 - vmax).exp()).sum();
    let sorted = top_in_order(set.to_vec(), n);
    Kept {
        size: set.len() as u32,
        top: sorted
            .iter()
            .take(n as usize)
            .map(|&(id, y)| KeptToken {
                id,
                p: (f64::from(y - vmax).exp() / sum) as f32,
            })
            .collect(),
    }
}
