//! Stages 1-3 without DRY's lengths: logit bias, the repetition penalty and the
//! frequency/presence penalties, as a sparse list of the tokens they touch ([`Touch`]) in
//! id order; every other token keeps `z = x`. DRY's penalties (`dry.rs`) are merged into
//! the same list.

use crate::params::Request;

use super::dry::dry_penalties;

/// How stages 1-3 touch one token of a row: its bias, whether it is in the history (the
/// repetition penalty), and how often it occurs in the output (frequency/presence).
#[derive(Debug, Default, Clone, Copy, PartialEq)]
pub struct Touch {
    /// The token's logit bias, if any.
    pub bias: Option<f32>,
    /// In prompt or output, with a repetition penalty other than 1.
    pub seen: bool,
    /// Occurrences in the output, with a frequency or presence penalty other than 0.
    pub count: u32,
    /// The DRY penalty subtracted last ([`dry_penalties`]); `0` for none.
    pub dry: f32,
}

impl Touch {
    /// The token's `z` from its logit `x`: bias, repetition, frequency/presence, in order.
    pub fn apply(&self, x: f32, p: &crate::params::SamplingParams) -> f32 {
        let mut z = x;
        if let Some(b) = self.bias {
            z += b;
        }
        if self.seen {
            let r = p.repetition_penalty;
            z = if z > 0.0 { z / r } else { z * r };
        }
        if self.count > 0 {
            z = z - p.frequency_penalty * self.count as f32 - p.presence_penalty;
        }
        // -inf stays -inf (an infinite penalty makes no NaN of a banned token)
        if self.dry != 0.0 && z != f32::NEG_INFINITY {
            z -= self.dry;
        }
        z
    }
}

/// The distinct ids of a history in increasing order, with their output counts: the
/// bookkeeping of stages 2-3, kept per thread.
///
/// A history of 64 ids or more goes through two bit sets over the vocabulary, zero
/// between calls: one bit per id and one per 64-bit word of those that holds any. Marking
/// is one write per id, and the ids come back in order by walking only the marked words
/// (the summary is 32 words at a vocabulary of 131,072), each cleared as it is read; the
/// counts sit in an array over the vocabulary, cleared the same way. On 256 ids (the
/// `full` benchmark's history) this measured half the time of sorting them. A shorter
/// history (or one with an id past `2^24`, the largest row) is sorted as plain integers
/// (`id << 1`, plus 1 for an output occurrence, so a run of one id gives its count).
#[derive(Default)]
struct History {
    bits: Vec<u64>,
    summary: Vec<u64>,
    counts: Vec<u32>,
    keys: Vec<u64>,
}

impl History {
    /// Calls `each(id, count)` for every distinct id of `prompt` and `output` in
    /// increasing order, `count` its occurrences in `output` when `counted` (else 0).
    fn distinct(
        &mut self,
        prompt: &[u32],
        output: &[u32],
        counted: bool,
        mut each: impl FnMut(u32, u32),
    ) {
        let all = || prompt.iter().chain(output);
        let top = all().copied().max().unwrap_or(0);
        if prompt.len() + output.len() < 64 || top >= 1 << 24 {
            let keys = &mut self.keys;
            keys.clear();
            keys.extend(prompt.iter().map(|&t| u64::from(t) << 1));
            keys.extend(output.iter().map(|&t| u64::from(t) << 1 | 1));
            keys.sort_unstable();
            for run in keys.chunk_by(|a, b| a >> 1 == b >> 1) {
                let count = run.iter().map(|k| (k & 1) as u32).sum();
                each((run[0] >> 1) as u32, if counted { count } else { 0 });
            }
            return;
        }
        let v = top as usize + 1;
        if self.bits.len() < v.div_ceil(64) {
            self.bits.resize(v.div_ceil(64), 0);
            self.summary.resize(v.div_ceil(4096), 0);
        }
        if counted && self.counts.len() < v {
            self.counts.resize(v, 0);
        }
        for &t in all() {
            let t = t as usize;
            self.bits[t / 64] |= 1 << (t % 64);
            self.summary[t / 4096] |= 1 << (t / 64 % 64);
        }
        if counted {
            for &t in output {
                self.counts[t as usize] += 1;
            }
        }
        for (si, s) in self.summary[..v.div_ceil(4096)].iter_mut().enumerate() {
            let mut words = std::mem::take(s);
            while words != 0 {
                let wi = 64 * si + words.trailing_zeros() as usize;
                words &= words - 1;
                let mut bits = std::mem::take(&mut self.bits[wi]);
                while bits != 0 {
                    let id = 64 * wi + bits.trailing_zeros() as usize;
                    bits &= bits - 1;
                    let count = if counted {
                        std::mem::take(&mut self.counts[id])
                    } else {
                        0
                    };
                    each(id as u32, count);
                }
            }
        }
    }
}

/// Appends to `out` the tokens a row's stages 1-3 touch, sorted by id, one entry each
/// (`out` is a buffer the caller may reuse between calls). The history's distinct ids
/// come in id order from a bit set over the vocabulary (see `History`) or, for a short
/// history, from sorting it; the bias map, already in id order, is merged in.
pub fn touches_into(req: &Request, out: &mut Vec<(u32, Touch)>) {
    let p = &req.params;
    let s = &req.state;
    if !p.modifies_logits(s) {
        return;
    }
    thread_local! {
        // kept between calls so that a row does not allocate
        static HISTORY: std::cell::RefCell<History> = std::cell::RefCell::new(History::default());
    }
    let seen = p.repetition_penalty != 1.0;
    let counted = p.frequency_penalty != 0.0 || p.presence_penalty != 0.0;
    let start = out.len();
    let prompt: &[u32] = if seen { &s.prompt } else { &[] };
    let output: &[u32] = if seen || counted { &s.output } else { &[] };
    HISTORY.with_borrow_mut(|h| {
        h.distinct(prompt, output, counted, |id, count| {
            let touch = Touch {
                bias: None,
                seen,
                count,
                dry: 0.0,
            };
            out.push((id, touch));
        })
    });
    if p.dry_on() {
        let dry = dry_penalties(p, &s.prompt, &s.output);
        merge_touches(out, start, dry, |touch, pen| touch.dry = pen);
    }
    merge_touches(
        out,
        start,
        p.logit_bias.iter().map(|(&t, &b)| (t, b)),
        |touch, b| touch.bias = Some(b),
    );
}

/// Merges `items` (in id order) into the sorted touches `out[start..]`: a token already
/// there gets `set` on its entry, another a new entry; the list stays sorted by id.
fn merge_touches<V>(
    out: &mut Vec<(u32, Touch)>,
    start: usize,
    items: impl IntoIterator<Item = (u32, V)>,
    set: impl Fn(&mut Touch, V),
) {
    let before = out.len();
    for (t, v) in items {
        match out[start..before].binary_search_by_key(&t, |e| e.0) {
            Ok(i) => set(&mut out[start + i].1, v),
            Err(_) => {
                let mut touch = Touch::default();
                set(&mut touch, v);
                out.push((t, touch));
            }
        }
    }
    if out.len() > before && before > start {
        out[start..].sort_unstable_by_key(|e| e.0);
    }
}

/// Stages 1-3 of the pipeline (bias, repetition, frequency/presence) as the sorted list of
/// `(token, z)` for the tokens whose logit they touch; every other token keeps `z = x`.
/// `x(t)` reads the row's logit of token `t`.
pub fn sparse_mods(x: impl Fn(u32) -> f32, req: &Request) -> Vec<(u32, f32)> {
    let mut touched = Vec::new();
    touches_into(req, &mut touched);
    touched
        .into_iter()
        .map(|(t, touch)| (t, touch.apply(x(t), &req.params)))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The merge of sorted ids against the plain definition (every entry of the bias map,
    /// every history id when repetition applies, every output id counted when frequency
    /// or presence apply, merged per token), on random histories: short ones with many
    /// repeats (sorted), and long ones (the bit sets) over vocabularies from 40 ids to
    /// past the bit sets' limit, one call after another so that each finds what the last
    /// left.
    #[test]
    fn touches_match_the_plain_definition() {
        use crate::params::{Request, SamplingParams};
        use std::collections::BTreeMap;
        let mut state = 0x9e37_79b9_u64;
        let mut next = |n: u64| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state % n
        };
        for case in 0..3000 {
            let long = case % 3 == 0;
            let mut params = SamplingParams {
                repetition_penalty: [1.0, 1.3][next(2) as usize],
                frequency_penalty: [0.0, 0.5][next(2) as usize],
                presence_penalty: [0.0, -0.25][next(2) as usize],
                ..SamplingParams::default()
            };
            let vocab = if long {
                [40, 5000, 300_000, (1 << 24) + 9][next(4) as usize]
            } else {
                1 + next(40)
            };
            let len = if long { 300 } else { 12 };
            for _ in 0..next(4) {
                params
                    .logit_bias
                    .insert(next(vocab) as u32, next(9) as f32 - 4.0);
            }
            let mut req = Request::new(params, 1);
            req.state.prompt = (0..next(len)).map(|_| next(vocab) as u32).collect();
            req.state.output = (0..next(len)).map(|_| next(vocab) as u32).collect();
            let p = &req.params;
            let mut want: BTreeMap<u32, Touch> = BTreeMap::new();
            if p.modifies_logits(&req.state) {
                for (&t, &b) in &p.logit_bias {
                    want.entry(t).or_default().bias = Some(b);
                }
                if p.repetition_penalty != 1.0 {
                    for &t in req.state.prompt.iter().chain(&req.state.output) {
                        want.entry(t).or_default().seen = true;
                    }
                }
                if p.frequency_penalty != 0.0 || p.presence_penalty != 0.0 {
                    for &t in &req.state.output {
                        want.entry(t).or_default().count += 1;
                    }
                }
            }
            let mut got = vec![(u32::MAX, Touch::default())];
            touches_into(&req, &mut got);
            let want: Vec<(u32, Touch)> = std::iter::once((u32::MAX, Touch::default()))
                .chain(want)
                .collect();
            assert_eq!(got, want, "case {case}: {req:?}");
        }
    }
}
