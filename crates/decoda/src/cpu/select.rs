//! Thresholds from a sample of the row, and the gathering passes of top-k and min-p.

use std::cmp::Ordering::Less;

use super::kernels;
use super::settings::{BLOCK, SAMPLE};
use crate::pipeline as pl;

/// The [`SAMPLE`] values that thresholds are estimated from: runs of 16 neighbours, evenly
/// spread (one or two cache lines each). `z` holds at least `SAMPLE` values.
pub(super) fn sample_runs(z: &[f32]) -> impl Iterator<Item = &[f32]> {
    let gap = z.len() / (SAMPLE / 16);
    (0..SAMPLE / 16).map(move |c| &z[c * gap..c * gap + 16])
}

/// The `r` (at most 32) largest sampled values of `z` (the runs of [`sample_runs`]) that
/// `keep` accepts, in decreasing order at the front of `top` (`-inf` after them), and how
/// many were found (at most `r`): one pass that inserts into the short list, skipping the
/// runs with nothing to insert (few inserts after the first runs). A NaN that `keep`
/// accepts is taken as larger than everything.
pub(super) fn sampled_largest(
    z: &[f32],
    r: usize,
    keep: impl Fn(f32) -> bool,
    top: &mut [f32; 32],
) -> usize {
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
pub(super) fn sampled_threshold(z: &[f32], want: usize, tmp: &mut Vec<(u32, f32)>) -> (f32, f32) {
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
pub(super) fn select_top(
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
pub(super) struct Skip {
    bits: Vec<u64>,
    ids: Vec<u32>,
}

impl Skip {
    /// The set of `ids` (sorted or not, each `< v`) for a row of `v` tokens.
    pub(super) fn fill(&mut self, v: usize, ids: impl Iterator<Item = u32>) {
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

/// Every `(i, y_i)` of the row `z` at temperature `t` with `y_i = z_i / t >= y_min`, in
/// id order, into `out` (cleared first): gathered in unscaled space from
/// [`pl::z_lower_bound`], so only those tokens are divided.
pub(super) fn gather_y_at_least(z: &[f32], t: f32, y_min: f32, out: &mut Vec<(u32, f32)>) {
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
