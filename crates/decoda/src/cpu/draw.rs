//! The Gumbel-max draw over a kept set, over a whole row, and the Philox limit.

use super::kernels;
use crate::error::RowError;
use crate::philox::{self, gumbel_bucket_bounds, gumbel_bucket_floors, GUMBEL_MAX_BOUND};
use crate::pipeline::{RowResult, Sample};

/// Candidate count below which the draw makes each Philox word on its own (the vector
/// lanes make 32 blocks at once).
const FEW_DRAWN: usize = 8;

/// Kept sets from this size are drawn in one pass over the row ([`wide_draw`]).
pub(super) const WIDE_DRAW: usize = 16_384;

/// [`draw`] of a kept set of at least [`WIDE_DRAW`] tokens of the row `z` at temperature
/// `t`, as [`gated_draw`] over the row: stages 6-8 keep every token whose `y` reaches
/// some value (`q` and the thresholds grow with `y`), so the set is the row's tokens with
/// `y` at least the smallest kept `y`. `None` for smaller sets, or when that smallest `y`
/// is `-inf`.
pub(super) fn wide_draw(
    z: &[f32],
    t: f32,
    cands: &[(u32, f32)],
    seed: u64,
    step: u64,
) -> Option<u32> {
    if cands.len() < WIDE_DRAW {
        return None;
    }
    let y_min = cands.iter().fold(f32::INFINITY, |m, c| m.min(c.1));
    let lead = leader(cands)?;
    if y_min == f32::NEG_INFINITY {
        return None;
    }
    match gated_draw(z, t, seed, step, y_min, Some(lead))? {
        Ok(sample) => Some(sample.token),
        Err(_) => None,
    }
}

/// The candidate with the largest `y`, ties to the smallest id (`None` for none).
fn leader(cands: &[(u32, f32)]) -> Option<(u32, f32)> {
    cands.iter().copied().reduce(|a, b| {
        if b.1 > a.1 || (b.1 == a.1 && b.0 < a.0) {
            b
        } else {
            a
        }
    })
}

/// The Gumbel-max draw over candidates `(i, y_i)`: the largest `y_i + g_i`, ties to the
/// smallest id. The leader (the largest `y`, its noise exact) rules out the tokens whose
/// largest possible noise cannot reach it (when the kept set's values span more than that
/// noise; otherwise every candidate is drawn from the list as it is). The others' Philox
/// words are made 32 tokens at a time in vector lanes ([`kernels::philox_listed`], one
/// block per token: a block that two tokens share is made twice). Each word's bucket
/// bounds its noise from both sides: the largest `y + floor` is at most the winner's
/// score, so only the tokens whose `y + bound` reaches it meet the exact comparison and
/// its logarithms. `live` and `words` are scratch.
pub(super) fn draw(
    cands: &[(u32, f32)],
    seed: u64,
    step: u64,
    live: &mut Vec<(u32, f32)>,
    words: &mut Vec<u32>,
) -> u32 {
    let (i0, y0) = leader(cands).expect("the kept set is never empty");
    let mut best = (i0, y0 + philox::gumbel(seed, step, i0));
    let ymin = cands.iter().fold(f32::INFINITY, |m, c| m.min(c.1));
    // the tokens whose largest possible noise can reach the leader (the leader itself
    // among them: its own challenge changes nothing)
    let list: &[(u32, f32)] = if ymin + GUMBEL_MAX_BOUND >= best.1 {
        cands
    } else {
        live.clear();
        live.extend(cands.iter().filter(|c| c.1 + GUMBEL_MAX_BOUND >= best.1));
        live
    };
    words.clear();
    words.resize(list.len(), 0);
    if list.len() < FEW_DRAWN {
        for (w, c) in words.iter_mut().zip(list) {
            *w = philox::token_bits(seed, step, c.0);
        }
    } else if dense(list) {
        // a long list, in id order, holding a quarter or more of the ids it spans (the
        // general path's wide kept sets): the words of whole chunks of 128 tokens, 32
        // blocks at a time, once per chunk that holds a candidate
        let key = philox::seed_key(seed);
        let mut out = [0u32; 128];
        let mut chunk = u32::MAX;
        for (w, c) in words.iter_mut().zip(list) {
            let ch = c.0 / 128;
            if ch != chunk {
                kernels::philox_x32(ch * 32, step, key, &mut out);
                chunk = ch;
            }
            *w = out[(c.0 % 128) as usize];
        }
    } else {
        let key = philox::seed_key(seed);
        let mut out = [0u32; 128];
        for (ws, cs) in words.chunks_mut(32).zip(list.chunks(32)) {
            // a short last chunk repeats its first block in the unused lanes
            let mut blocks = [cs[0].0 / 4; 32];
            for (b, c) in blocks.iter_mut().zip(cs) {
                *b = c.0 / 4;
            }
            kernels::philox_listed(&blocks, step, key, &mut out);
            for (j, (w, c)) in ws.iter_mut().zip(cs).enumerate() {
                *w = out[4 * j + (c.0 % 4) as usize];
            }
        }
    }
    let (floors, bounds) = (gumbel_bucket_floors(), gumbel_bucket_bounds());
    // the largest `y + floor`: at most the winner's score (the scores are never NaN: `>`
    // keeps the fold a plain max)
    let mut reach = best.1;
    for (c, &w) in list.iter().zip(words.iter()) {
        let r = c.1 + floors[(w >> 20) as usize];
        if r > reach {
            reach = r;
        }
    }
    for (&(i, y), &w) in list.iter().zip(words.iter()) {
        if y + bounds[(w >> 20) as usize] >= reach {
            challenge(&mut best, i, y, w, bounds);
        }
    }
    best.0
}

/// Whether [`draw`] makes a list's words by whole chunks of the row: at least
/// [`DENSE_DRAWN`] candidates in increasing id order, one for every four or fewer ids of
/// the span they cover (a block per chunk of 128 ids then costs less than a block per
/// candidate).
fn dense(list: &[(u32, f32)]) -> bool {
    let (Some(first), Some(last)) = (list.first(), list.last()) else {
        return false;
    };
    list.len() >= DENSE_DRAWN
        && 4 * list.len() as u64 > u64::from(last.0.saturating_sub(first.0))
        && list.windows(2).all(|p| p[0].0 < p[1].0)
}

/// Candidates from which [`draw`] may make words by chunks of the row ([`dense`]).
pub(super) const DENSE_DRAWN: usize = 1024;

/// The exact step of a Gumbel-max draw: token `i` with scaled logit `y` and Philox word
/// `bits` replaces the leader `best` when `y + g` is larger, or equal at a smaller id.
/// Words whose largest possible noise cannot reach the leader skip the logarithms.
#[inline]
fn challenge(best: &mut (u32, f32), i: u32, y: f32, bits: u32, bounds: &[f32; 4096]) {
    if y + bounds[(bits >> 20) as usize] < best.1 {
        return;
    }
    let s = y + philox::gumbel_from_bits(bits);
    if s > best.1 || (s == best.1 && i < best.0) {
        *best = (i, s);
    }
}

/// Tokens per chunk of [`draw_whole_row`]: the words of 32 Philox blocks.
const CHUNK: usize = 128;

/// Tokens at the head of the row whose max seeds the one-pass draw's leader.
const SEED_SPAN: usize = 8192;

/// [`draw`] over the whole row (no filter), in one pass over chunks of [`CHUNK`] tokens
/// read ahead of use, so the reading overlaps the Philox arithmetic. A token can only
/// change the leader when its logit reaches a threshold that falls as its word rises
/// ([`philox::gumbel_reach_consts`]: a bound on the noise per word, no logarithm), so a
/// chunk whose largest values stay below the threshold of the largest word is skipped
/// before its Philox words are made; otherwise the words are made 32 blocks at a time in
/// vector lanes, the chunk is judged by its largest words, then each token by its own,
/// and only the few tokens that pass meet the exact comparison of [`draw`]. Same token
/// as drawing every one. `Err` for NaN or `+inf` in the row, or no finite value; `None`
/// when the row is greedy after all (`max / T` overflows).
pub(super) fn draw_whole_row(x: &[f32], t: f32, seed: u64, step: u64) -> Option<RowResult> {
    gated_draw(x, t, seed, step, f32::NEG_INFINITY, None)
}

/// [`draw_whole_row`] over the tokens with `x / t >= y_min` only (every token for
/// `-inf`), the leader started at `lead` (a token of that set, with its `y`) when given,
/// else at the first max of the row's head. A kept set that is every token at or above
/// some `y` is drawn so in one pass over the row, at the cost of a plain-temperature draw,
/// instead of token by token.
pub(super) fn gated_draw(
    x: &[f32],
    t: f32,
    seed: u64,
    step: u64,
    y_min: f32,
    lead: Option<(u32, f32)>,
) -> Option<RowResult> {
    let bounds = gumbel_bucket_bounds();
    let key = philox::seed_key(seed);
    let mut best = (u32::MAX, f32::NEG_INFINITY);
    if let Some((i0, y0)) = lead {
        best = (i0, y0 + philox::gumbel(seed, step, i0));
    } else {
        // The leader starts as the first max of the row's head (its max and first index
        // from one pass; drawn again in its chunk, which changes nothing), so the
        // thresholds are tight from the first chunk on.
        let head = &x[..x.len().min(SEED_SPAN)];
        let (hmax, i0, hbad) = kernels::argmax_nonfinite(head);
        if !hbad && hmax > f32::NEG_INFINITY {
            if !(hmax / t).is_finite() {
                return None;
            }
            let i0 = i0 as u32;
            best = (i0, hmax / t + philox::gumbel(seed, step, i0));
        }
    }
    // the leader and its thresholds' constants, renewed when it changes
    let leader = std::cell::Cell::new((best, philox::gumbel_reach_consts(t, best.1)));
    let visit = |c: usize, mut m: u128, words: &[u32; CHUNK]| {
        let old = leader.get().0;
        let mut b = old;
        while m != 0 {
            let j = m.trailing_zeros() as usize;
            m &= m - 1;
            let z = x[c * CHUNK + j];
            let y = z / t;
            if z != f32::NEG_INFINITY && y >= y_min {
                challenge(&mut b, (c * CHUNK + j) as u32, y, words[j], bounds);
            }
        }
        if b != old {
            leader.set((b, philox::gumbel_reach_consts(t, b.1)));
        }
    };
    let row = kernels::gated_chunks(x, step, key, || leader.get().1, visit);
    let best = leader.get().0;
    let Some(xmax) = row else {
        let count = kernels::max_nonfinite(x).1;
        return Some(Err(RowError::NonFiniteLogits { count }));
    };
    if xmax > f32::NEG_INFINITY && !(xmax / t).is_finite() {
        return None;
    }
    if best.0 == u32::MAX {
        return Some(Err(RowError::NoCandidate));
    }
    Some(Ok(Sample {
        token: best.0,
        logprobs: None,
        kept: None,
    }))
}

/// The Philox limit of a draw over a whole row of `v` tokens: every token's Philox word
/// at `step` under `seed`, made as the draw makes them (32 blocks side by side in vector
/// lanes, with AVX-512 three chunks of 128 at a time in two groups of six chains, the
/// round keys once per row, [`kernels::philox_chunks`]), and nothing else: each
/// chunk's words are handed to [`std::hint::black_box`] (so none of them can be left
/// unmade) and one of them is folded into the result. A draw that needs every word cannot
/// do less; the benchmarks time the `temp` configuration against it.
pub fn philox_row_words(v: usize, seed: u64, step: u64) -> u32 {
    let key = philox::seed_key(seed);
    let mut acc = 0u32;
    kernels::philox_chunks(v, step, key, |c, words| {
        acc ^= std::hint::black_box(words)[c % CHUNK];
    });
    acc
}
