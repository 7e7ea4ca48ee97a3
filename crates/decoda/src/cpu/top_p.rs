//! Stage 7 without top-k: the pass that sums the normaliser and gathers the candidates,
//! the cut and its walks, and nuclei too wide for a candidate list.

use super::draw::gated_draw;
use super::kernels::{self, Terms};
use super::logprobs::{full_logprobs, subset_logprobs};
use super::scratch::Scratch;
use super::select::{gather_y_at_least, sample_runs, sampled_largest};
use super::settings::{BLOCK, SAMPLE};
use crate::params::LogprobsMode;
use crate::pipeline::{self as pl, Row, RowResult, Sample};

/// Scratch of [`top_p_candidates`]: two f32 buffers and a candidate list.
type TopPBufs<'a> = (&'a mut Vec<f32>, &'a mut Vec<f32>, &'a mut Vec<(u32, f32)>);

/// How many candidates the first top-p gathering pass aims for: 512 up to `p = 0.9`, and
/// 1,024 above, where nuclei of many hundreds of tokens are common (on the benchmark's
/// Zipf rows of V = 131,072, most rows at `p = 0.95`): a longer first list costs a few
/// more candidates, a retry costs another pass over the row.
pub(super) fn first_top_p_list(p: f32) -> usize {
    if p > 0.9 {
        1024
    } else {
        512
    }
}

/// What the top-p gathering pass found.
pub(super) enum TopPScan {
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
pub(super) fn top_p_scan(
    z: &[f32],
    (m_ref, zthr): (f32, f32),
    (t, p): (f32, f32),
    out: &mut Vec<(u32, f32)>,
    (q, walk, kept): TopPBufs<'_>,
) -> TopPScan {
    let bufs = (&mut *q, &mut *walk, &mut *kept);
    let coarse = (Terms::Coarse, rest_error(Terms::Coarse.error()));
    match top_p_candidates(z, m_ref, zthr, t, p, out, bufs, coarse) {
        TopPScan::Unsure => {
            let precise = (Terms::Precise, rest_error(Terms::Precise.error()));
            top_p_candidates(z, m_ref, zthr, t, p, out, (q, walk, kept), precise)
        }
        scan => scan,
    }
}

/// How far the weight of many tokens made with terms each within `error` of `2^w` may be
/// from the same made with the contract's (relative): 0 when they are the precise terms.
pub(super) fn rest_error(error: f64) -> f64 {
    if error > Terms::Precise.error() {
        (error + Terms::Precise.error()) * 1.01
    } else {
        0.0
    }
}

/// Top-p without top-k: one pass over `z` accumulates the normaliser against the
/// reference `m_ref` (the max, or an estimate of it no larger) while gathering every token
/// with `z >= zthr` (`zthr <= m_ref`, so the max is gathered); then stage 7 runs on the
/// candidates, after gathering again from lower thresholds when they miss part of the
/// nucleus. The candidates get the contract's weights; the other tokens' share of the
/// normaliser comes from the pass's `terms`, known within `rest_error` of it (relative: at
/// least [`rest_error`] of `terms`' error; a test passes larger bounds): when the cut is
/// not clear of `p` by as much, [`TopPScan::Unsure`].
#[allow(clippy::too_many_arguments)]
pub(super) fn top_p_candidates(
    z: &[f32],
    m_ref: f32,
    mut zthr: f32,
    t: f32,
    p: f32,
    out: &mut Vec<(u32, f32)>,
    (q, walk, kept): TopPBufs<'_>,
    (terms, rest_error): (Terms, f64),
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
pub(super) const TOP_P_CAP: usize = 8192;
/// A nucleus that a sample puts past this many tokens (three quarters of [`TOP_P_CAP`])
/// takes the whole row ([`sample_wide`]) at once, without a retry.
pub(super) const TOP_P_WIDE: usize = TOP_P_CAP / 4 * 3;

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
pub(super) fn sampled_retry(
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
pub(super) fn top_p_peel(q: &mut [f32], p: f32) -> Option<f32> {
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
pub(super) fn top_p_probs(q: &mut [f32], ymax: f32, approx: f64) -> f64 {
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
pub(super) fn keep_from(cands: &mut Vec<(u32, f32)>, q: &[f32], tau: f32) {
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
pub(super) fn top_p_walk(q: &mut [f32], p: f32) -> f32 {
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
pub(super) fn sample_wide(
    x: &[f32],
    z: &[f32],
    zmax: f32,
    req: &Row<'_>,
    s: &mut Scratch,
) -> Option<RowResult> {
    let p = &req.params;
    let t = p.temperature;
    let ymax = zmax / t;
    let y_cut = wide_top_p(z, t, ymax, p.top_p, s)?;
    let y_min = y_cut.max(pl::min_p_threshold(ymax, p.min_p));
    let lead = kernels::first_eq(z, zmax)? as u32;
    let (seed, step) = (req.state.seed, req.step());
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
        kept: None,
    }))
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
pub(super) fn wide_top_p(z: &[f32], t: f32, ymax: f32, p: f32, s: &mut Scratch) -> Option<f32> {
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
