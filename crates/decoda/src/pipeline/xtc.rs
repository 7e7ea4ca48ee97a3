//! Stage 8a, XTC (exclude top choices): on a coin of its own, remove every token of
//! probability at least the threshold but the least likely of them.

use super::weights::{kept_max, prob64, weight};

/// Stage 8a's coin for a row at a step: `u` (as the draw's) from Philox word 0 of
/// counter `(0, step & 0xffffffff, step >> 32, 1)`, stream 1.
pub fn xtc_coin(seed: u64, step: u64) -> f32 {
    let c = [0, step as u32, (step >> 32) as u32, 1];
    crate::philox::uniform(crate::philox::philox4x32_10(c, crate::philox::seed_key(seed))[0])
}

/// Whether XTC removes anything from a row at this step: it is on
/// ([`crate::SamplingParams::xtc_on`]) and its coin is at most `xtc_probability`.
pub fn xtc_fires(p: &crate::params::SamplingParams, seed: u64, step: u64) -> bool {
    p.xtc_on() && xtc_coin(seed, step) <= p.xtc_probability
}

/// Stage 8a over the kept set `(y, q)` (q in f64 over the set): with at least two
/// tokens of `q >= threshold`, the smallest `y` among them; tokens above it are removed
/// (so the least likely top choice stays, with its ties). `None` when nothing is removed.
pub fn xtc_cut(set: impl Iterator<Item = (f32, f64)>, threshold: f32) -> Option<f32> {
    let t = f64::from(threshold);
    let (mut count, mut low) = (0usize, f32::INFINITY);
    for (y, q) in set {
        if q >= t {
            count += 1;
            low = low.min(y);
        }
    }
    (count >= 2).then_some(low)
}

/// Stage 8a over the kept tokens (its coin already came up); returns the smallest
/// distance of a kept token's `q` to the threshold (`inf` for a set of one).
pub(crate) fn apply(y: &[f32], threshold: f32, keep: &mut [bool]) -> f64 {
    let ids: Vec<usize> = (0..y.len()).filter(|&i| keep[i]).collect();
    if ids.len() < 2 {
        return f64::INFINITY;
    }
    let ymax = kept_max(y, keep);
    let sum: f64 = ids.iter().map(|&i| f64::from(weight(y[i], ymax))).sum();
    let q = |i: usize| prob64(weight(y[i], ymax), sum);
    let margin = ids
        .iter()
        .map(|&i| (q(i) - f64::from(threshold)).abs())
        .fold(f64::INFINITY, f64::min);
    if let Some(low) = xtc_cut(ids.iter().map(|&i| (y[i], q(i))), threshold) {
        for &i in &ids {
            keep[i] = y[i] <= low;
        }
    }
    margin
}
