//! Decode shapes: what users run, through every entry point a backend has.
//!
//! Batches of B = 1, 2, 3, 8 and 64 rows at the vocabulary sizes of real models
//! ([`DECODE_VOCABS`]), f32, f16 and bf16, logits whose winners can be anywhere in the
//! row ([`Style`]), every parameter mix ([`MIXES`]), through [`Backend::sample`] and
//! [`Backend::sample_draws`] with 1 and 3 draws ([`Entry`]), each compared with the
//! reference sampler — on a fresh backend, and on a long-lived one that has just served a
//! larger and then a smaller call (so every buffer-growth path runs). [`decode_shapes`]
//! is the suite; the pieces are public so that device-specific entry points (the wgpu
//! device API, the CLI) are checked against the same cases.

use crate::backend::Backend;
use crate::logits::{DType, Logits};
use crate::params::{LogprobsMode, Request, SamplingParams};
use crate::pipeline::RowResult;
use crate::reference::{reference_row, TieReport};

use super::{classify, Rng, Verdict};

/// Vocabulary sizes of real models (Llama 2, Phi-3, GPT-2, Mixtral/Qwen-MoE variants,
/// Llama 3, Qwen 2/3, GPT-4o-style tokenizers, Gemma 3).
pub const DECODE_VOCABS: &[usize] = &[
    32000, 32064, 50257, 65536, 128256, 131072, 151936, 152064, 200064, 262144,
];
/// Batch sizes of decode steps.
pub const DECODE_BATCHES: &[usize] = &[1, 2, 3, 8, 64];
/// The three element types.
pub const DTYPES: &[DType] = &[DType::F32, DType::F16, DType::Bf16];

/// A generic entry point of [`Backend`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Entry {
    /// [`Backend::sample`].
    Sample,
    /// [`Backend::sample_draws`] with this many draws.
    Draws(usize),
}

/// Every generic entry point the suite runs.
pub const ENTRIES: &[Entry] = &[Entry::Sample, Entry::Draws(1), Entry::Draws(3)];

impl Entry {
    /// Steps (draws) per row it returns.
    pub fn steps(self) -> usize {
        match self {
            Entry::Sample => 1,
            Entry::Draws(n) => n,
        }
    }
}

/// How a row's logits are made. Every style places its winners at random ids.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Style {
    /// Normal, standard deviation 3.
    Normal,
    /// Normal, standard deviation 20 (a few tokens dominate).
    WideNormal,
    /// Zipf-like over a random permutation of the ids.
    Zipf,
    /// Six distinct values: ties everywhere.
    CoarseTies,
    /// Half the ids `-inf` (a banned or masked vocabulary), the rest normal.
    HalfNegInf,
    /// Normal noise and a few large values at random ids, one of them the last id.
    Spike,
    /// Every logit equal.
    Flat,
    /// Normal with one NaN: the row's error, the other rows unaffected.
    NonFinite,
}

/// Every style.
pub const STYLES: &[Style] = &[
    Style::Normal,
    Style::WideNormal,
    Style::Zipf,
    Style::CoarseTies,
    Style::HalfNegInf,
    Style::Spike,
    Style::Flat,
    Style::NonFinite,
];

/// A row of `v` logits in `style`.
pub fn styled_logits(rng: &mut Rng, v: usize, style: Style) -> Vec<f32> {
    match style {
        Style::Normal => (0..v).map(|_| 3.0 * rng.normal()).collect(),
        Style::WideNormal => (0..v).map(|_| 20.0 * rng.normal()).collect(),
        Style::Zipf => {
            let s = 1.0 + 1.5 * rng.unit();
            super::zipf_logits(rng, v, s)
        }
        Style::CoarseTies => (0..v).map(|_| (rng.below(6) as f32) * 0.5).collect(),
        Style::HalfNegInf => {
            let mut x: Vec<f32> = (0..v).map(|_| 3.0 * rng.normal()).collect();
            for _ in 0..v / 2 {
                x[rng.below(v as u64) as usize] = f32::NEG_INFINITY;
            }
            x[rng.below(v as u64) as usize] = 2.0;
            x
        }
        Style::Spike => {
            let mut x: Vec<f32> = (0..v).map(|_| rng.normal()).collect();
            for _ in 0..3 {
                x[rng.below(v as u64) as usize] = 12.0 + 4.0 * rng.unit();
            }
            x[v - 1] = 12.0 + 4.0 * rng.unit();
            x
        }
        Style::Flat => vec![1.5; v],
        Style::NonFinite => {
            let mut x: Vec<f32> = (0..v).map(|_| 3.0 * rng.normal()).collect();
            x[rng.below(v as u64) as usize] = f32::NAN;
            x
        }
    }
}

/// Names of the parameter mixes [`mixed_request`] makes.
pub const MIXES: &[&str] = &[
    "greedy",
    "temperature",
    "top_k_1",
    "top_k_50",
    "top_p_0.9",
    "top_k_50_top_p_0.9",
    "min_p_0.05",
    "full",
    "penalties_bias",
    "logprobs_raw",
    "logprobs_processed",
    "temperature_floor",
    "min_p_1",
    "long_history",
    "dry",
    "top_n_sigma",
    "xtc",
    "typical_p",
];

/// A request for a row of `v` logits with parameter mix `mix` (an index into [`MIXES`]),
/// a random seed and a random step (sometimes above 2^32).
pub fn mixed_request(rng: &mut Rng, v: usize, mix: usize) -> Request {
    let id = |rng: &mut Rng| rng.below(v as u64) as u32;
    let base = SamplingParams::default();
    let mut history = 0;
    let params = match MIXES[mix % MIXES.len()] {
        "greedy" => SamplingParams::greedy(),
        "temperature" => SamplingParams {
            temperature: [1.0, 0.7, 1.3][rng.below(3) as usize],
            ..base
        },
        "top_k_1" => SamplingParams {
            top_k: 1,
            temperature: 0.7,
            ..base
        },
        "top_k_50" => SamplingParams { top_k: 50, ..base },
        "top_p_0.9" => SamplingParams { top_p: 0.9, ..base },
        "top_k_50_top_p_0.9" => SamplingParams {
            top_k: 50,
            top_p: 0.9,
            temperature: 0.8,
            ..base
        },
        "min_p_0.05" => SamplingParams {
            min_p: 0.05,
            ..base
        },
        "full" => {
            history = 40;
            SamplingParams {
                temperature: 1.3,
                top_k: 40,
                top_p: 0.95,
                min_p: 0.02,
                repetition_penalty: 1.2,
                frequency_penalty: 0.3,
                presence_penalty: 0.2,
                ..base
            }
        }
        "penalties_bias" => {
            history = 20;
            let mut p = SamplingParams {
                repetition_penalty: 1.3,
                frequency_penalty: 0.5,
                presence_penalty: -0.4,
                ..base
            };
            for b in [f32::NEG_INFINITY, 5.0, -3.0, 8.0] {
                p.logit_bias.insert(id(rng), b);
            }
            p
        }
        "logprobs_raw" => SamplingParams {
            top_p: 0.9,
            logprobs: Some(5),
            logprobs_mode: LogprobsMode::Raw,
            ..base
        },
        "logprobs_processed" => SamplingParams {
            top_k: 10,
            logprobs: Some(20),
            logprobs_mode: LogprobsMode::Processed,
            ..base
        },
        "temperature_floor" => SamplingParams {
            temperature: 1e-6,
            top_p: 0.5,
            ..base
        },
        "min_p_1" => SamplingParams {
            min_p: 1.0,
            top_k: v as u32,
            ..base
        },
        "dry" => SamplingParams {
            dry_multiplier: 2.0,
            dry_allowed_length: 1,
            dry_penalty_last_n: [64, 1000, 4096][rng.below(3) as usize],
            dry_sequence_breakers: vec![vec![id(rng)]],
            top_k: [0, 40][rng.below(2) as usize],
            ..base
        },
        "top_n_sigma" => {
            history = 20;
            SamplingParams {
                top_n_sigma: [0.5, 1.0, 3.0][rng.below(3) as usize],
                top_k: [0, 40][rng.below(2) as usize],
                top_p: [1.0, 0.9][rng.below(2) as usize],
                repetition_penalty: 1.1,
                logprobs: [None, Some(2)][rng.below(2) as usize],
                logprobs_mode: LogprobsMode::Processed,
                ..base
            }
        }
        "xtc" => SamplingParams {
            xtc_probability: [0.5, 1.0][rng.below(2) as usize],
            xtc_threshold: [0.01, 0.1, 0.3][rng.below(3) as usize],
            top_k: [0, 40][rng.below(2) as usize],
            top_p: [1.0, 0.9][rng.below(2) as usize],
            min_p: [0.0, 0.05][rng.below(2) as usize],
            logprobs: [None, Some(3)][rng.below(2) as usize],
            logprobs_mode: LogprobsMode::Processed,
            ..base
        },
        "typical_p" => {
            history = 20;
            SamplingParams {
                typical_p: [0.5, 0.9, 0.95][rng.below(3) as usize],
                top_k: [0, 40][rng.below(2) as usize],
                top_p: [1.0, 0.9][rng.below(2) as usize],
                repetition_penalty: 1.1,
                logprobs: [None, Some(2)][rng.below(2) as usize],
                logprobs_mode: LogprobsMode::Processed,
                ..base
            }
        }
        _ => {
            history = 3000;
            SamplingParams {
                repetition_penalty: 1.1,
                frequency_penalty: 0.2,
                presence_penalty: 0.1,
                top_p: 0.95,
                ..base
            }
        }
    };
    let mut req = Request::new(params, rng.next_u64());
    req.state.step = if rng.below(4) == 0 {
        (1u64 << 32) - 1 - rng.below(3)
    } else {
        rng.below(100_000)
    };
    for _ in 0..history {
        req.state.prompt.push(id(rng));
        req.state.output.push(id(rng));
    }
    if req.params.dry_on() {
        // a phrase repeated with random tokens between (so DRY finds repeats), ending
        // inside a repeat
        let phrase: Vec<u32> = (0..2 + rng.below(8)).map(|_| id(rng)).collect();
        let len = 200 + rng.below(1800) as usize;
        while req.state.output.len() < len {
            if rng.below(3) == 0 {
                req.state.output.push(id(rng));
            }
            req.state.output.extend(&phrase);
        }
        req.state.output.extend(&phrase[..phrase.len() / 2]);
    }
    req
}

/// A batch of logits in one element type, with the values as the backend sees them
/// (rounded to the type) for the reference.
#[derive(Debug, Clone)]
pub struct Batch {
    /// Element type of the logits.
    pub dtype: DType,
    /// Vocabulary size.
    pub vocab: usize,
    /// Each row's values, widened exactly to f32.
    pub rows: Vec<Vec<f32>>,
    /// Each row's request.
    pub requests: Vec<Request>,
    f32s: Vec<f32>,
    f16s: Vec<half::f16>,
    bf16s: Vec<half::bf16>,
}

impl Batch {
    /// Rows (f32 values) and requests, stored as `dtype`.
    pub fn new(cases: Vec<(Vec<f32>, Request)>, dtype: DType) -> Self {
        let vocab = cases.first().map_or(0, |c| c.0.len());
        let (mut f32s, mut f16s, mut bf16s) = (Vec::new(), Vec::new(), Vec::new());
        let mut rows = Vec::with_capacity(cases.len());
        let mut requests = Vec::with_capacity(cases.len());
        for (x, req) in cases {
            let wide: Vec<f32> = match dtype {
                DType::F32 => x,
                DType::F16 => x.iter().map(|&a| half::f16::from_f32(a).to_f32()).collect(),
                DType::Bf16 => x
                    .iter()
                    .map(|&a| half::bf16::from_f32(a).to_f32())
                    .collect(),
            };
            match dtype {
                DType::F32 => f32s.extend_from_slice(&wide),
                DType::F16 => f16s.extend(wide.iter().map(|&a| half::f16::from_f32(a))),
                DType::Bf16 => bf16s.extend(wide.iter().map(|&a| half::bf16::from_f32(a))),
            }
            rows.push(wide);
            requests.push(req);
        }
        Self {
            dtype,
            vocab,
            rows,
            requests,
            f32s,
            f16s,
            bf16s,
        }
    }

    /// The batch as [`Logits`].
    pub fn logits(&self) -> Logits<'_> {
        let (b, v) = (self.rows.len(), self.vocab);
        match self.dtype {
            DType::F32 => Logits::f32(&self.f32s, b, v),
            DType::F16 => Logits::f16(&self.f16s, b, v),
            DType::Bf16 => Logits::bf16(&self.bf16s, b, v),
        }
        .expect("a batch's shape is consistent")
    }

    /// The reference's result and tie report for every row at every step of `entry`:
    /// `[row][draw]`.
    pub fn expected(&self, entry: Entry) -> Vec<Vec<(RowResult, TieReport)>> {
        use rayon::prelude::*;
        // the reference is the slow side of every check: its rows on every core
        self.rows
            .par_iter()
            .zip(&self.requests)
            .map(|(x, req)| {
                (0..entry.steps())
                    .map(|d| {
                        let mut r = req.clone();
                        r.state.step = r.state.step.wrapping_add(d as u64);
                        reference_row(x, &r)
                    })
                    .collect()
            })
            .collect()
    }
}

/// `b` rows of `v` logits: row `r` gets style and parameter mix by rotation from `salt`
/// (so a batch of 64 holds every style and every mix), with random data.
pub fn decode_batch(rng: &mut Rng, v: usize, b: usize, salt: usize) -> Vec<(Vec<f32>, Request)> {
    (0..b)
        .map(|r| {
            let style = STYLES[(r * 3 + salt) % STYLES.len()];
            let x = styled_logits(rng, v, style);
            (x, mixed_request(rng, v, r + salt))
        })
        .collect()
}

/// Runs `entry` on `backend`: `[row][draw]`.
pub fn run_entry(
    backend: &dyn Backend,
    batch: &Batch,
    entry: Entry,
) -> Result<Vec<Vec<RowResult>>, String> {
    let l = batch.logits();
    match entry {
        Entry::Sample => Ok(backend
            .sample(&l, &batch.requests)
            .map_err(|e| e.to_string())?
            .into_iter()
            .map(|r| vec![r])
            .collect()),
        Entry::Draws(n) => backend
            .sample_draws(&l, &batch.requests, n)
            .map_err(|e| e.to_string()),
    }
}

/// Counts of a run of the suite.
#[derive(Debug, Default, Clone, Copy)]
pub struct Tally {
    /// Backend calls made.
    pub calls: usize,
    /// Row results (rows times draws) compared.
    pub results: usize,
    /// Identical to the reference.
    pub same: usize,
    /// Different on a floating-point tie the contract allows.
    pub allowed_ties: usize,
}

/// Compares `got` (`[row][draw]`) with `want`; `Err` names the first differences with
/// their shape, entry, row, style of parameters and what differed.
pub fn check(
    label: &str,
    batch: &Batch,
    got: &[Vec<RowResult>],
    want: &[Vec<(RowResult, TieReport)>],
    tally: &mut Tally,
) -> Result<(), String> {
    tally.calls += 1;
    let mut bad = Vec::new();
    if got.len() != want.len() {
        return Err(format!(
            "{label}: {} rows back, {} sent",
            got.len(),
            want.len()
        ));
    }
    for (r, (g, w)) in got.iter().zip(want).enumerate() {
        if g.len() != w.len() {
            bad.push(format!(
                "row {r}: {} draws back, {} asked",
                g.len(),
                w.len()
            ));
            continue;
        }
        for (d, (gr, (wr, tie))) in g.iter().zip(w).enumerate() {
            tally.results += 1;
            if let Ok(s) = gr {
                if s.token as usize >= batch.vocab {
                    bad.push(format!("row {r} draw {d}: token {} >= V", s.token));
                    continue;
                }
            }
            match classify(gr, wr, tie) {
                Verdict::Same { .. } => tally.same += 1,
                Verdict::AllowedTie => tally.allowed_ties += 1,
                Verdict::Mismatch => {
                    if bad.len() < 6 {
                        let req = &batch.requests[r];
                        bad.push(format!(
                            "row {r} draw {d}: got {gr:?}, reference {wr:?} (tie {tie:?}; params \
                             {:?}; seed {} step {}; {} history tokens)",
                            req.params,
                            req.state.seed,
                            req.state.step,
                            req.state.prompt.len() + req.state.output.len()
                        ));
                    } else {
                        bad.push(String::new());
                    }
                }
            }
        }
    }
    if bad.is_empty() {
        Ok(())
    } else {
        let n = bad.len();
        bad.retain(|m| !m.is_empty());
        Err(format!(
            "{label}: {n} results differ from the reference:\n  {}",
            bad.join("\n  ")
        ))
    }
}

/// Makes a backend: a fresh one on every call.
pub type Factory<'a> = &'a dyn Fn() -> Result<Box<dyn Backend>, String>;

/// The suite: every `vocabs` x `batches` shape through `entries` (with `full`, every
/// entry; else one per shape, rotating so that each entry meets every vocabulary), each
/// on one long-lived backend that first served the largest case (the most bytes of
/// logits) and, before each case, a small call; and on a fresh backend from `make` for
/// the first batch size of each vocabulary (every case with `full`). Without `full` the
/// largest batch runs at every other vocabulary (the largest included). The tests pass
/// [`super::full_tier`]. Element types rotate over the vocabularies and batch sizes, so
/// that each entry meets every type. A case's rows come from its own seed (`seed`, its
/// vocabulary and batch), the same for each entry. `progress` is told each case as it
/// passes.
pub fn decode_shapes(
    make: Factory<'_>,
    vocabs: &[usize],
    batches: &[usize],
    entries: &[Entry],
    seed: u64,
    full: bool,
    progress: impl FnMut(&str),
) -> Result<Tally, String> {
    decode_shapes_part(make, vocabs, batches, entries, seed, full, (0, 1), progress)
}

/// [`decode_shapes`]' cases in `parts.1` parts of about the same work, and only part
/// `parts.0` of them: the cases ranked by their logits' bytes (largest first), every
/// `parts.1`-th from rank `parts.0`. Each part runs as the whole suite does, on its own
/// long-lived backend that first served the part's largest case; a case's rows, entry
/// and element type are those it has in the whole suite, so the parts together run
/// exactly its cases. A test harness runs the parts side by side (`parts` = (0, 1) is
/// the whole suite).
#[allow(clippy::too_many_arguments)]
pub fn decode_shapes_part(
    make: Factory<'_>,
    vocabs: &[usize],
    batches: &[usize],
    entries: &[Entry],
    seed: u64,
    full: bool,
    parts: (usize, usize),
    mut progress: impl FnMut(&str),
) -> Result<Tally, String> {
    let (part, of) = parts;
    if of == 0 || part >= of {
        return Err(format!("part {part} of {of}: no such part"));
    }
    let mut rng = Rng::new(seed);
    let mut tally = Tally::default();
    let long = make()?;
    // the cells this tier runs: (vocabulary, batch, entry) indices
    let bmax = batches.iter().copied().max().unwrap_or(1);
    let mut cells = Vec::new();
    for vi in 0..vocabs.len() {
        for (bi, &b) in batches.iter().enumerate() {
            // quick tier: the largest batch at every other vocabulary, the largest
            // vocabulary included
            if !full && b == bmax && b > 1 && (vocabs.len() - 1 - vi) % 2 == 1 {
                continue;
            }
            for ei in 0..entries.len() {
                // quick tier: one entry per cell, rotating, so that every entry meets
                // every vocabulary and most batch sizes; the full tier runs them all
                if !full && entries.len() > 1 && ei != (vi + bi) % entries.len() {
                    continue;
                }
                cells.push((vi, bi, ei));
            }
        }
    }
    // quick tier: entry (vi + bi) % 3 and type (2 vi + bi) % 3, so an entry's type
    // changes with the vocabulary (vi + e); the full tier gives every entry of a shape
    // the same type and each batch size another
    let dtype_of = |vi: usize, bi: usize| DTYPES[(2 * vi + bi) % DTYPES.len()];
    // a case's size: the bytes of its logits, then the logits, then the draws
    let size = |&(vi, bi, ei): &(usize, usize, usize)| {
        let n = vocabs[vi] * batches[bi];
        (n * dtype_of(vi, bi).size(), n, entries[ei].steps())
    };
    // this part's cases: every `of`-th by size from rank `part`, in the suite's order
    if of > 1 {
        let mut ranked: Vec<usize> = (0..cells.len()).collect();
        ranked.sort_by_key(|&k| std::cmp::Reverse(size(&cells[k])));
        let mut keep = vec![false; cells.len()];
        for &k in ranked.iter().skip(part).step_by(of) {
            keep[k] = true;
        }
        let mut k = 0;
        cells.retain(|_| {
            k += 1;
            keep[k - 1]
        });
    }
    // The largest call first, so that every later case runs on a long-lived backend
    // whose buffers a larger call grew: the case of the most bytes of logits (then the
    // most logits, then the most draws) moves to the front, its entry and type
    // unchanged, and is checked like the rest.
    if let Some(k) = (0..cells.len()).max_by_key(|&k| size(&cells[k])) {
        let c = cells.remove(k);
        cells.insert(0, c);
    }
    let small = Batch::new(decode_batch(&mut rng, 17, 2, 7), DType::Bf16);
    for (n, &(vi, bi, ei)) in cells.iter().enumerate() {
        let (v, b, entry) = (vocabs[vi], batches[bi], entries[ei]);
        let salt = vi * 5 + bi;
        let mut cell_rng =
            Rng::new(seed ^ (((vi as u64) << 32) | bi as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15));
        let dtype = dtype_of(vi, bi);
        let batch = Batch::new(decode_batch(&mut cell_rng, v, b, salt), dtype);
        let want = batch.expected(entry);
        let label = format!("V={v} B={b} {dtype} {entry:?}");
        // a fresh object for the first cell of each vocabulary (every cell in the full
        // tier); the long-lived one serves every cell
        if bi == 0 || full {
            let fresh = make()?;
            let got = run_entry(fresh.as_ref(), &batch, entry)?;
            check(&format!("{label} (fresh)"), &batch, &got, &want, &mut tally)?;
        }
        run_entry(long.as_ref(), &small, Entry::Sample)?;
        let got = run_entry(long.as_ref(), &batch, entry)?;
        let after = if n == 0 {
            "(the largest case, after a smaller call)"
        } else {
            "(long-lived: after the largest case and a smaller call)"
        };
        check(&format!("{label} {after}"), &batch, &got, &want, &mut tally)?;
        progress(&label);
    }
    Ok(tally)
}
