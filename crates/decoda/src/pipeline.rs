//! The contract's semantics that every backend shares (docs/CONTRACT.md: inputs, pipeline, errors, log-probabilities): call
//! validation, stages 1-3 (bias and penalties) as a sparse list of changed logits, the
//! thresholds of the filters, and the shape of a row's result.
//!
//! Backends differ only in how they find the kept set and draw from it; every value
//! that decides a token is computed by the functions here or by [`crate::philox`].

use serde::Serialize;

use crate::error::{Error, Result, RowError};
use crate::params::Request;

/// One of the most likely tokens, with its log-probability.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct TopLogprob {
    /// Token id.
    pub token: u32,
    /// Natural log-probability.
    pub logprob: f32,
}

/// The log-probabilities reported for a drawn token (the contract's log-probabilities).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct TokenLogprobs {
    /// The chosen token's log-probability.
    pub logprob: f32,
    /// The chosen token's rank, 1 = most likely (ties: smaller id first).
    pub rank: u32,
    /// The `n` most likely tokens, most likely first (ties: smaller id first). Tokens with
    /// probability 0 (`-inf`) are not listed, so there may be fewer than `n`.
    pub top: Vec<TopLogprob>,
}

/// A token of the kept distribution and its probability after the whole pipeline.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct KeptToken {
    /// Token id.
    pub id: u32,
    /// Its probability over the kept set (`softmax(y)` over S; 1 for a greedy row's token).
    pub p: f32,
}

/// The kept set S a token was drawn from ([`crate::SamplingParams::kept`]).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Kept {
    /// How many tokens S holds (tokens of probability 0 included).
    pub size: u32,
    /// Its `n` most likely tokens, most likely first (ties: smaller id first).
    pub top: Vec<KeptToken>,
}

/// A drawn token.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Sample {
    /// The token id, always `< V`.
    pub token: u32,
    /// Log-probabilities, when the row asked for them.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub logprobs: Option<TokenLogprobs>,
    /// The kept distribution, when the row asked for it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub kept: Option<Kept>,
}

impl Sample {
    /// A token without log-probabilities or kept distribution.
    pub fn token(token: u32, logprobs: Option<TokenLogprobs>) -> Self {
        Self {
            token,
            logprobs,
            kept: None,
        }
    }
}

/// The result of one row: a token, or that row's error.
pub type RowResult = std::result::Result<Sample, RowError>;

/// Checks a whole call before any work: the number of rows, every parameter and every
/// history id. The first offending row and field are reported.
pub fn validate_call(rows: usize, vocab: usize, requests: &[Request]) -> Result<()> {
    if vocab == 0 {
        return Err(Error::Shape("the vocabulary size V must be >= 1".into()));
    }
    if vocab > u32::MAX as usize {
        return Err(Error::Shape(format!(
            "vocabulary size {vocab} does not fit token ids in u32"
        )));
    }
    if requests.len() != rows {
        return Err(Error::Shape(format!(
            "{} requests for {rows} rows of logits: give one request per row",
            requests.len()
        )));
    }
    for (row, r) in requests.iter().enumerate() {
        r.validate(row, vocab)?;
    }
    Ok(())
}

/// One row of a call that [`validate_call`] accepted, as a backend's inner path takes
/// it: the request, the step it is drawn at, and the row of the logits it reads. A
/// per-step view of a request (the draws of [`crate::Backend::sample_draws`]) borrows
/// the request and sets only its step, so its history is never copied.
///
/// Rows are made inside the crate, after validation. It dereferences to its
/// [`Request`] for the parameters, the seed and the history; its step is
/// [`Row::step`] (the request's `state.step` plus the view's offset), which is what
/// every backend draws with.
#[derive(Debug, Clone, Copy)]
pub struct Row<'a> {
    request: &'a Request,
    step: u64,
    logits_row: usize,
}

impl<'a> Row<'a> {
    /// Row `i` of a validated call reads logits row `i` at its request's own step.
    pub(crate) fn each(requests: &'a [Request]) -> Vec<Row<'a>> {
        requests
            .iter()
            .enumerate()
            .map(|(i, request)| Row {
                request,
                step: request.state.step,
                logits_row: i,
            })
            .collect()
    }

    /// One validated request at its own step, reading logits row 0.
    pub(crate) fn of(request: &'a Request) -> Row<'a> {
        Row {
            request,
            step: request.state.step,
            logits_row: 0,
        }
    }

    /// The same row `offset` steps on.
    pub(crate) fn at_step(self, offset: u64) -> Row<'a> {
        Row {
            step: self.step.wrapping_add(offset),
            ..self
        }
    }

    /// The same request and step reading logits row `logits_row`.
    pub(crate) fn reading(self, logits_row: usize) -> Row<'a> {
        Row { logits_row, ..self }
    }

    /// The request (parameters, seed, history).
    pub fn request(&self) -> &'a Request {
        self.request
    }

    /// The step this row is drawn at.
    pub fn step(&self) -> u64 {
        self.step
    }

    /// The row of the call's logits this row reads.
    pub fn logits_row(&self) -> usize {
        self.logits_row
    }

    /// Whether XTC (stage 8a) can remove tokens from this row at its step: it is on and
    /// its coin fires. When it does not, the stage does nothing, so the row is drawn
    /// as if it were off.
    pub fn xtc_acts(&self) -> bool {
        xtc_fires(&self.request.params, self.request.state.seed, self.step)
    }

    /// [`Request::beyond_device`].
    pub fn beyond_device(&self) -> Option<&'static str> {
        self.request.beyond_device()
    }
}

impl std::ops::Deref for Row<'_> {
    type Target = Request;
    fn deref(&self) -> &Request {
        self.request
    }
}

/// [`validate_call`], then the call's rows (row `i` reads logits row `i`).
pub(crate) fn validated_rows<'a>(
    rows: usize,
    vocab: usize,
    requests: &'a [Request],
) -> Result<Vec<Row<'a>>> {
    validate_call(rows, vocab, requests)?;
    Ok(Row::each(requests))
}

/// Whether `rows` read the logits in order, row `i` from logits row `i`, one each.
pub(crate) fn reads_in_order(rows: &[Row<'_>], logits_rows: usize) -> bool {
    rows.len() == logits_rows && rows.iter().enumerate().all(|(i, r)| r.logits_row == i)
}

/// Counts the NaN and `+inf` values of a row.
pub fn count_non_finite(x: &[f32]) -> u64 {
    x.iter()
        .filter(|v| v.is_nan() || **v == f32::INFINITY)
        .count() as u64
}

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

/// Stage 3a, DRY, as the sorted list of `(token, penalty)` it subtracts: llama.cpp's DRY
/// sampler (docs/CONTRACT.md) over the last `dry_penalty_last_n` tokens of the row's
/// history (prompt, then output). Empty when DRY is off or finds no repeat to extend.
///
/// Repeat lengths come from the Z-algorithm run backwards over the window (linear in its
/// length), clamped by the last sequence breaker; the reference computes them by their
/// definition instead.
pub fn dry_penalties(
    p: &crate::params::SamplingParams,
    prompt: &[u32],
    output: &[u32],
) -> Vec<(u32, f32)> {
    if !p.dry_on() {
        return Vec::new();
    }
    let len = prompt.len() + output.len();
    let n = p.dry_window(len);
    let allowed = p.dry_allowed_length as usize;
    if n <= allowed {
        return Vec::new();
    }
    // rat(i): the i-th token from the end of the history (0 = the last one)
    let rat = |i: usize| {
        let at = len - 1 - i;
        if at < prompt.len() {
            prompt[at]
        } else {
            output[at - prompt.len()]
        }
    };
    let rep_limit = dry_repeat_limit(p, n, &rat);
    if rep_limit < allowed {
        return Vec::new();
    }
    // z[k]: how many tokens before distance k match the last ones (the suffix ending
    // k tokens back that equals a suffix of the history), clamped to the limit
    let mut z = vec![0usize; n];
    let (mut lt, mut rt) = (0usize, 0usize);
    for k in 1..n {
        if k > rt {
            let mut m = 0;
            while m + k < n && rat(m) == rat(m + k) {
                m += 1;
            }
            z[k] = m.min(rep_limit);
            if m > 0 {
                lt = k;
                rt = k + m - 1;
            }
        } else {
            let pair = k - lt;
            let right = rt - k + 1;
            if z[pair] < right {
                z[k] = z[pair].min(rep_limit);
            } else {
                let mut i = rt + 1;
                while i < n && rat(i) == rat(i - k) {
                    i += 1;
                }
                z[k] = (i - k).min(rep_limit);
                lt = k;
                rt = i - 1;
            }
        }
    }
    // the token after each repeat would extend it: its longest such repeat
    let mut longest: Vec<(u32, usize)> = (1..n)
        .filter(|&k| z[k] >= allowed)
        .map(|k| (rat(k - 1), z[k]))
        .collect();
    longest.sort_unstable_by(|a, b| a.0.cmp(&b.0).then(b.1.cmp(&a.1)));
    longest.dedup_by_key(|e| e.0);
    longest
        .into_iter()
        .filter(|&(t, _)| {
            !p.dry_sequence_breakers
                .iter()
                .any(|b| b.len() == 1 && b[0] == t)
        })
        .map(|(t, m)| (t, dry_penalty(p, m - allowed)))
        .collect()
}

/// DRY's limit on a repeat's length: the distance from the end of the window's last
/// sequence breaker (the longest breaker ending there), or the window's length.
pub(crate) fn dry_repeat_limit(
    p: &crate::params::SamplingParams,
    n: usize,
    rat: &impl Fn(usize) -> u32,
) -> usize {
    for i in 0..n {
        let head = rat(i);
        let mut longest: Option<usize> = None;
        for b in &p.dry_sequence_breakers {
            let tail = b.len() - 1;
            if b[0] != head || tail > i || longest.is_some_and(|l| tail <= l) {
                continue;
            }
            if (0..tail).all(|o| b[1 + o] == rat(i - o - 1)) {
                longest = Some(tail);
            }
        }
        if let Some(l) = longest {
            return i - l;
        }
    }
    n
}

/// The largest exponent DRY's penalty takes, `floor(88.7228391 / ln(base))` when
/// `base > 1.000001` (and that is at least 1); `None`: no cap.
pub fn dry_max_exponent(p: &crate::params::SamplingParams) -> Option<u64> {
    if p.dry_base > 1.000_001 {
        let max_exp = (88.722_839_1_f64 / f64::from(p.dry_base).ln()) as u64;
        (max_exp > 0).then_some(max_exp)
    } else {
        None
    }
}

/// DRY's penalty for a repeat `excess` tokens past the allowed length:
/// `multiplier * base^e` with `e = min(excess, floor(88.7228391 / ln(base)))` (no clamp
/// when `base <= 1.000001`), the power by repeated squaring in f64, rounded once to f32.
pub fn dry_penalty(p: &crate::params::SamplingParams, excess: usize) -> f32 {
    let base = f64::from(p.dry_base);
    let mut e = excess as u64;
    if let Some(max_exp) = dry_max_exponent(p) {
        e = e.min(max_exp);
    }
    let (mut acc, mut sq) = (1.0f64, base);
    while e > 0 {
        if e & 1 == 1 {
            acc *= sq;
        }
        sq *= sq;
        e >>= 1;
    }
    (f64::from(p.dry_multiplier) * acc) as f32
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

/// Whether a row is drawn greedily: `T < 1e-5`, or `zmax / T` is not finite.
pub fn is_greedy(temperature: f32, zmax: f32) -> bool {
    temperature < crate::params::GREEDY_TEMPERATURE || !(zmax / temperature).is_finite()
}

/// A value `zl` such that every `z < zl` has `fl(z / t) < tau` (round to nearest): the
/// bound below which a token cannot pass a threshold `tau` in temperature-scaled space.
/// Lets a backend select in unscaled space and divide only the few tokens near the top.
pub fn z_lower_bound(tau: f32, t: f32) -> f32 {
    if tau == f32::NEG_INFINITY {
        return f32::NEG_INFINITY;
    }
    let m = f64::from(tau) * f64::from(t); // exact: 24 + 24 bits
    let margin = m.abs() * 2f64.powi(-21) + f64::from(t) * 2f64.powi(-148);
    let zl = m - margin;
    let mut f = zl as f32;
    if f64::from(f) > zl {
        f = f.next_down();
    }
    f
}

/// The min-p threshold in scaled space: `ymax + ln(min_p)` (`-inf` when `min_p = 0`).
pub fn min_p_threshold(ymax: f32, min_p: f32) -> f32 {
    if min_p > 0.0 {
        ymax + min_p.ln()
    } else {
        f32::NEG_INFINITY
    }
}

/// The unnormalised top-p weight of a token: `exp(y - ymax)` in f32, with
/// [`crate::fmath::exp`] (the algorithm the device shaders use too).
#[inline]
pub fn weight(y: f32, ymax: f32) -> f32 {
    crate::fmath::exp(y - ymax)
}

/// The top-p probability of a token of weight `e` under total weight `sum`.
#[inline]
pub fn prob(e: f32, sum: f64) -> f32 {
    (f64::from(e) / sum) as f32
}

/// The walk of stage 7: `q` sorted in decreasing order; returns `τp`, the q of the m-th
/// token where m is the fewest tokens whose q sum (in f64) reaches `p`, together with the
/// distance of the cumulative sum to `p` at the decision (for counting floating-point
/// ties). If the sum never reaches `p` (rounding), every token is kept.
pub fn top_p_cut(q_desc: impl IntoIterator<Item = f32>, p: f32) -> (f32, f64) {
    let mut walk = TopPWalk::new(p);
    for q in q_desc {
        if let Some(tau) = walk.step(q) {
            return (tau, walk.margin());
        }
    }
    (walk.end(), walk.margin())
}

/// The walk of [`top_p_cut`] one value at a time, for callers that sort `q` piece by piece.
#[derive(Clone, Copy, Debug)]
pub struct TopPWalk {
    p64: f64,
    cum: f64,
    last: f32,
    margin: f64,
}

impl TopPWalk {
    /// A walk towards `p`.
    pub fn new(p: f32) -> Self {
        Self {
            p64: f64::from(p),
            cum: 0.0,
            last: f32::NEG_INFINITY,
            margin: f64::INFINITY,
        }
    }

    /// A walk towards `p` that has already added values of total `mass` (less than `p`)
    /// without walking them one by one.
    pub fn after(p: f32, mass: f64) -> Self {
        let mut walk = Self::new(p);
        walk.cum = mass;
        walk.margin = (mass - walk.p64).abs();
        walk
    }

    /// Adds the next value (in decreasing order); `Some(τp)` when the sum reaches `p`.
    #[inline]
    pub fn step(&mut self, q: f32) -> Option<f32> {
        let before = self.cum;
        self.cum += f64::from(q);
        self.last = q;
        self.margin = self
            .margin
            .min((self.cum - self.p64).abs())
            .min((before - self.p64).abs());
        (self.cum >= self.p64).then_some(q)
    }

    /// `τp` when every value was added without reaching `p`: keep everything.
    pub fn end(&self) -> f32 {
        self.last.min(0.0)
    }

    /// Smallest distance of the cumulative sum to `p` seen so far.
    pub fn margin(&self) -> f64 {
        self.margin
    }
}

/// Stage 5a, top-n-σ: the threshold `ymax - n * σ` (f64) over the finite values `ys`,
/// `σ` their population standard deviation (mean, then mean squared deviation, in f64).
pub fn top_n_sigma_threshold(ys: &[f32], ymax: f32, n: f32) -> f64 {
    let finite = || {
        ys.iter()
            .filter(|y| **y > f32::NEG_INFINITY)
            .map(|&y| f64::from(y))
    };
    // the count and the sum in one pass (the sum's additions in id order, as two passes)
    let (count, sum) = finite().fold((0usize, 0.0f64), |(c, s), y| (c + 1, s + y));
    if count == 0 {
        return f64::NEG_INFINITY;
    }
    let mean = sum / count as f64;
    let var = finite().map(|y| (y - mean) * (y - mean)).sum::<f64>() / count as f64;
    f64::from(ymax) - f64::from(n) * var.sqrt()
}

/// A candidate's probability over a set of total weight `sum`: `weight / sum` in f64
/// (the probabilities of stages 6a and 8a and of the kept distribution's walks).
#[inline]
pub fn prob64(w: f32, sum: f64) -> f64 {
    f64::from(w) / sum
}

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

/// The kept distribution of a set `(id, y)`: its size and its `n` most likely tokens
/// (ties: smaller id first) with `softmax(y)` over the set, in f64 rounded to f32.
pub fn kept_of(set: &[(u32, f32)], n: u32) -> Kept {
    let vmax = set.iter().map(|c| c.1).fold(f32::NEG_INFINITY, f32::max);
    let sum: f64 = set.iter().map(|c| f64::from(c.1 - vmax).exp()).sum();
    let mut sorted = set.to_vec();
    // the n first under a total order: selected, then only they are sorted
    let n_top = (n as usize).min(sorted.len());
    if n_top == 0 {
        sorted.clear();
    } else if n_top < sorted.len() {
        sorted.select_nth_unstable_by(n_top - 1, rank_order);
        sorted.truncate(n_top);
    }
    sorted.sort_by(rank_order);
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

/// The rank of `chosen` among `(id, value)` pairs: 1 + the number ordered before it.
pub fn rank_of(chosen: (u32, f32), all: impl IntoIterator<Item = (u32, f32)>) -> u32 {
    1 + all
        .into_iter()
        .filter(|c| rank_order(c, &chosen) == std::cmp::Ordering::Less)
        .count() as u32
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

    #[test]
    fn z_lower_bound_is_safe_and_tight() {
        let mut state = 0x1234_5678_u64;
        let mut next = || {
            state = state
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            (state >> 33) as u32
        };
        for _ in 0..20000 {
            let t = [0.3f32, 0.7, 1.0, 1.3, 2.0, 1e-4, 77.0][next() as usize % 7];
            let z = (next() as f32 / u32::MAX as f32 - 0.5) * 200.0;
            let tau = z / t;
            let zl = z_lower_bound(tau, t);
            assert!(zl <= z, "bound above a passing value");
            // just below the bound nothing passes
            let below = zl.next_down();
            assert!(below / t < tau, "z={z} t={t}");
            // and the bound is close (within a few ulps relative)
            assert!((z - zl).abs() <= z.abs() * 1e-5 + 1e-30);
        }
    }

    #[test]
    fn top_p_walk() {
        let (tau, _) = top_p_cut([0.5, 0.3, 0.2], 0.8);
        assert_eq!(tau, 0.3);
        let (tau, _) = top_p_cut([0.5, 0.3, 0.2], 0.81);
        assert_eq!(tau, 0.2);
        let (tau, _) = top_p_cut([0.5, 0.3, 0.2], 0.5);
        assert_eq!(tau, 0.5);
    }
}
