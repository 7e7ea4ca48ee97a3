//! The backend-generic conformance suite: every check of the contract, written once and
//! run against every [`Backend`] (the CPU samplers and the wgpu sampler in `cargo test`,
//! and any backend through `decoda selftest`).
//!
//! Each check returns `Err(message)` on failure. [`conformance_suite!`](crate::conformance_suite)
//! turns the list into `#[test]` functions for one backend.

use crate::backend::Backend;
use crate::error::{Error, RowError};
use crate::logits::Logits;
use crate::params::{LogprobsMode, Request, SamplingParams};
use crate::pipeline::RowResult;
use crate::reference::{reference_row, TieReport};

#[cfg(feature = "wgpu")]
pub mod gpu;
pub mod head;
pub mod model;
pub mod moe;
pub mod shapes;
pub mod speculate;
pub mod stages;
pub mod stress;
pub mod synthetic;
pub mod tiny;
pub mod verify;
pub mod workload;

pub use stages::{
    kept_distribution, later_parameters_name_field_value_row, later_stages_match_reference,
    stage_dry, stage_top_n_sigma, stage_typical_p, stage_xtc,
};
pub use verify::verify_coupled_is_plain_decoding;

/// Whether the deeper test tier runs (`DECODA_TESTS=full`; docs/TESTING.md): long
/// property runs, the large parity runs, fresh objects for every cell of a sweep. The
/// quick tier (`cargo test` alone) runs every check on every backend, with less
/// repetition.
pub fn full_tier() -> bool {
    std::env::var("DECODA_TESTS").is_ok_and(|v| v == "full")
}

/// A check of the suite.
pub type Check = fn(&dyn Backend) -> Result<(), String>;

/// Every check, by name.
pub const CHECKS: &[(&str, Check)] = &[
    ("greedy_ties_to_smallest_id", greedy_ties_to_smallest_id),
    ("stage_bias", stage_bias),
    ("stage_token_mask", stage_token_mask),
    ("stage_repetition", stage_repetition),
    ("stage_frequency_presence", stage_frequency_presence),
    (
        "sentinels_leave_result_unchanged",
        sentinels_leave_result_unchanged,
    ),
    ("top_k_keeps_ties", top_k_keeps_ties),
    ("top_p_keeps_ties", top_p_keeps_ties),
    ("min_p_one_keeps_only_the_max", min_p_one_keeps_only_the_max),
    ("temperature_floor", temperature_floor),
    ("vocab_of_one", vocab_of_one),
    ("row_errors_stay_in_their_row", row_errors_stay_in_their_row),
    (
        "invalid_parameters_name_field_value_row",
        invalid_parameters_name_field_value_row,
    ),
    ("history_and_shape_errors", history_and_shape_errors),
    ("logprobs_raw_and_processed", logprobs_raw_and_processed),
    ("half_precision_inputs", half_precision_inputs),
    ("batch_invariance", batch_invariance),
    (
        "matches_reference_random_rows",
        matches_reference_random_rows,
    ),
    ("distribution_chi_square", distribution_chi_square),
    ("draws_match_single_steps", draws_match_single_steps),
    ("stage_dry", stage_dry),
    ("stage_top_n_sigma", stage_top_n_sigma),
    ("stage_typical_p", stage_typical_p),
    ("stage_xtc", stage_xtc),
    ("kept_distribution", kept_distribution),
    ("later_stages_match_reference", later_stages_match_reference),
    (
        "later_parameters_name_field_value_row",
        later_parameters_name_field_value_row,
    ),
    (
        "verify_coupled_is_plain_decoding",
        verify_coupled_is_plain_decoding,
    ),
];

/// Outcome of [`run_all`].
#[derive(Debug, Default)]
pub struct Report {
    /// Checks that passed.
    pub passed: usize,
    /// Failed checks with their messages.
    pub failed: Vec<(String, String)>,
}

/// Runs every check against `backend`, calling `progress(name, result)` after each.
pub fn run_all(
    backend: &dyn Backend,
    mut progress: impl FnMut(&str, &Result<(), String>),
) -> Report {
    let mut report = Report::default();
    for (name, check) in CHECKS {
        let r = check(backend);
        progress(name, &r);
        match r {
            Ok(()) => report.passed += 1,
            Err(e) => report.failed.push((name.to_string(), e)),
        }
    }
    report
}

/// Generates one `#[test]` per conformance check for the backend built by `$make`, an
/// expression of type `Option<B>` (`None` skips, e.g. when no GPU is present).
#[macro_export]
macro_rules! conformance_suite {
    ($make:expr) => {
        $crate::conformance_suite!(@each $make;
            greedy_ties_to_smallest_id, stage_bias, stage_token_mask, stage_repetition,
            stage_frequency_presence,
            sentinels_leave_result_unchanged, top_k_keeps_ties, top_p_keeps_ties,
            min_p_one_keeps_only_the_max, temperature_floor, vocab_of_one,
            row_errors_stay_in_their_row, invalid_parameters_name_field_value_row,
            history_and_shape_errors, logprobs_raw_and_processed, half_precision_inputs,
            batch_invariance, matches_reference_random_rows, distribution_chi_square,
            draws_match_single_steps, stage_dry, stage_top_n_sigma, stage_typical_p, stage_xtc,
            kept_distribution, later_stages_match_reference,
            later_parameters_name_field_value_row, verify_coupled_is_plain_decoding);
    };
    (@each $make:expr; $($name:ident),* $(,)?) => {
        $(
            #[test]
            fn $name() {
                match $make {
                    Some(backend) => {
                        if let Err(e) = $crate::testing::$name(&backend) {
                            panic!("{}: {e}", stringify!($name));
                        }
                    }
                    None => eprintln!("{}: skipped, backend not available", stringify!($name)),
                }
            }
        )*
    };
}

/// A small deterministic generator (SplitMix64) for test data.
#[derive(Debug, Clone)]
pub struct Rng(u64);

impl Rng {
    /// A generator from a seed.
    pub fn new(seed: u64) -> Self {
        Self(seed)
    }
    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
    /// Uniform in `[0, 1)`.
    pub fn unit(&mut self) -> f32 {
        (self.next_u64() >> 40) as f32 / (1u64 << 24) as f32
    }
    /// Uniform integer in `0..n`.
    pub fn below(&mut self, n: u64) -> u64 {
        self.next_u64() % n.max(1)
    }
    /// Standard normal (Box-Muller).
    pub fn normal(&mut self) -> f32 {
        let u = (self.unit() + 1e-7).min(1.0);
        let v = self.unit();
        (-2.0 * u.ln()).sqrt() * (std::f32::consts::TAU * v).cos()
    }
}

/// Zipf-like logits of an LLM: `-s ln(rank)` over a random permutation plus small noise,
/// scaled to typical logit magnitudes.
pub fn zipf_logits(rng: &mut Rng, vocab: usize, s: f32) -> Vec<f32> {
    let mut perm: Vec<usize> = (0..vocab).collect();
    for i in (1..vocab).rev() {
        perm.swap(i, rng.below(i as u64 + 1) as usize);
    }
    let mut out = vec![0f32; vocab];
    for (rank, &i) in perm.iter().enumerate() {
        out[i] = 12.0 - s * ((rank + 1) as f32).ln() + 0.3 * rng.normal();
    }
    out
}

/// A random row and random (valid) parameters, exercising every stage, sentinel and tie
/// that the contract defines. Used by parity tests between backends.
pub fn random_case(rng: &mut Rng, vocab: usize) -> (Vec<f32>, Request) {
    let style = rng.below(4);
    let mut x: Vec<f32> = match style {
        0 => {
            let s = 1.0 + 2.0 * rng.unit();
            zipf_logits(rng, vocab, s)
        }
        1 => (0..vocab).map(|_| 3.0 * rng.normal()).collect(),
        // coarse values: many exact ties
        2 => (0..vocab).map(|_| (rng.below(6) as f32) * 0.5).collect(),
        _ => (0..vocab).map(|_| 20.0 * rng.normal()).collect(),
    };
    if rng.below(8) == 0 {
        let n = rng.below(vocab as u64) as usize;
        for _ in 0..n {
            let i = rng.below(vocab as u64) as usize;
            x[i] = f32::NEG_INFINITY;
        }
        x[rng.below(vocab as u64) as usize] = 1.0;
    }
    let pick = |rng: &mut Rng, opts: &[f32]| opts[rng.below(opts.len() as u64) as usize];
    let mut p = SamplingParams {
        temperature: pick(rng, &[0.0, 1e-6, 0.3, 0.7, 1.0, 1.0, 1.5, 3.0]),
        top_k: [0, 1, 2, 5, 50, vocab as u32, vocab as u32 + 3][rng.below(7) as usize],
        top_p: pick(rng, &[1.0, 1.0, 0.9, 0.5, 0.95, 0.1, 0.999]),
        min_p: pick(rng, &[0.0, 0.0, 0.05, 0.2, 1.0]),
        repetition_penalty: pick(rng, &[1.0, 1.0, 1.3, 0.8]),
        frequency_penalty: pick(rng, &[0.0, 0.0, 0.5, -0.7, 2.0]),
        presence_penalty: pick(rng, &[0.0, 0.0, 0.4, -2.0]),
        ..Default::default()
    };
    if rng.below(3) == 0 {
        for _ in 0..rng.below(4) {
            let b = pick(rng, &[5.0, -5.0, f32::NEG_INFINITY, 0.5]);
            p.logit_bias.insert(rng.below(vocab as u64) as u32, b);
        }
    }
    if rng.below(3) == 0 {
        p.logprobs = Some(rng.below(21) as u32);
        p.logprobs_mode = if rng.below(2) == 0 {
            LogprobsMode::Raw
        } else {
            LogprobsMode::Processed
        };
    }
    let mut req = Request::new(p, rng.next_u64());
    req.state.step = rng.below(1000);
    for _ in 0..rng.below(12) {
        req.state.prompt.push(rng.below(vocab as u64) as u32);
    }
    for _ in 0..rng.below(12) {
        req.state.output.push(rng.below(vocab as u64) as u32);
    }
    (x, req)
}

fn sample1(b: &dyn Backend, x: &[f32], req: &Request) -> Result<RowResult, String> {
    let l = Logits::f32(x, 1, x.len()).map_err(|e| e.to_string())?;
    let mut out = b
        .sample(&l, std::slice::from_ref(req))
        .map_err(|e| e.to_string())?;
    out.pop().ok_or_else(|| "no result".to_string())
}

fn token1(b: &dyn Backend, x: &[f32], req: &Request) -> Result<u32, String> {
    match sample1(b, x, req)? {
        Ok(s) => Ok(s.token),
        Err(e) => Err(format!("unexpected row error {e}")),
    }
}

/// Draws `n` tokens of one row at steps `0..n` ([`Backend::sample_draws`]); returns the
/// histogram.
fn histogram(
    b: &dyn Backend,
    x: &[f32],
    params: &SamplingParams,
    seed: u64,
    n: usize,
) -> Result<Vec<u64>, String> {
    let v = x.len();
    let mut hist = vec![0u64; v];
    let l = Logits::f32(x, 1, v).map_err(|e| e.to_string())?;
    let req = Request::new(params.clone(), seed);
    let out = b
        .sample_draws(&l, std::slice::from_ref(&req), n)
        .map_err(|e| e.to_string())?;
    let row = out.into_iter().next().ok_or("no row")?;
    if row.len() != n {
        return Err(format!("{} draws returned, {n} asked", row.len()));
    }
    for r in row {
        let t = r.map_err(|e| e.to_string())?.token as usize;
        if t >= v {
            return Err(format!("token {t} out of range {v}"));
        }
        hist[t] += 1;
    }
    Ok(hist)
}

fn expect(cond: bool, msg: impl FnOnce() -> String) -> Result<(), String> {
    if cond {
        Ok(())
    } else {
        Err(msg())
    }
}

/// Greedy picks the smallest id among equal maxima.
pub fn greedy_ties_to_smallest_id(b: &dyn Backend) -> Result<(), String> {
    let x = [1.0, 5.0, 2.0, 5.0, 5.0, -1.0];
    let t = token1(b, &x, &Request::new(SamplingParams::greedy(), 1))?;
    expect(t == 1, || format!("greedy tie chose {t}, expected 1"))
}

/// Bias is added before everything; `-inf` bans a token.
pub fn stage_bias(b: &dyn Backend) -> Result<(), String> {
    let x = [1.0, 5.0, 2.0, 4.5];
    let mut p = SamplingParams::greedy();
    p.logit_bias.insert(3, 1.0);
    expect(token1(b, &x, &Request::new(p.clone(), 1))? == 3, || {
        "bias +1 should make 3 the max".into()
    })?;
    p.logit_bias.insert(3, f32::NEG_INFINITY);
    p.logit_bias.insert(1, f32::NEG_INFINITY);
    expect(token1(b, &x, &Request::new(p.clone(), 1))? == 2, || {
        "banned tokens must not win".into()
    })?;
    p.temperature = 1.0;
    for seed in 0..200 {
        let t = token1(b, &x, &Request::new(p.clone(), seed))?;
        expect(t != 1 && t != 3, || format!("banned token {t} drawn"))?;
    }
    Ok(())
}

/// Stage 0, the token mask ([`Request::allowed`]), at a real vocabulary with a width that
/// is not a multiple of 32: a masked row draws what the same row with its disallowed
/// logits at `-inf` draws (token and log-probabilities, raw and processed) under every
/// filter, penalty and bias, and never a disallowed token; bits past V are ignored; a
/// disallowed NaN is out of the row, not an error; a mask that allows one token draws
/// it; one that allows none is that row's `NoCandidate` and nothing else's; a mask of
/// the wrong width is an error naming the row and the field; draws honour the mask.
pub fn stage_token_mask(b: &dyn Backend) -> Result<(), String> {
    let v: usize = 32_003;
    let w = v.div_ceil(32);
    let mut rng = Rng::new(0x3a5c);
    let x: Vec<f32> = (0..v).map(|_| 2.0 * rng.normal()).collect();
    // about one token in eight allowed, the row's top token among the disallowed ones
    let mut mask = vec![0u32; w];
    for (i, m) in (0..v).map(|i| (i, rng.below(8) == 0)) {
        if m {
            mask[i / 32] |= 1 << (i % 32);
        }
    }
    let top = (0..v).max_by(|&i, &j| x[i].total_cmp(&x[j])).unwrap_or(0);
    mask[top / 32] &= !(1 << (top % 32));
    let banned: Vec<f32> = (0..v)
        .map(|i| {
            if mask[i / 32] >> (i % 32) & 1 == 1 {
                x[i]
            } else {
                f32::NEG_INFINITY
            }
        })
        .collect();
    let t8 = SamplingParams {
        temperature: 0.8,
        ..SamplingParams::default()
    };
    let mut mixed = SamplingParams {
        top_k: 40,
        top_p: 0.8,
        repetition_penalty: 1.3,
        presence_penalty: 0.5,
        ..t8.clone()
    };
    mixed.logit_bias.insert(top as u32, 5.0);
    mixed.logit_bias.insert(7, 1.0);
    let configs = [
        SamplingParams::greedy(),
        t8.clone(),
        SamplingParams {
            top_k: 50,
            ..t8.clone()
        },
        SamplingParams {
            top_p: 0.9,
            ..t8.clone()
        },
        SamplingParams {
            min_p: 0.1,
            ..t8.clone()
        },
        mixed,
    ];
    for (c, params) in configs.iter().enumerate() {
        for (mode, n) in [(LogprobsMode::Raw, 5), (LogprobsMode::Processed, 3)] {
            let mut q = Request::new(
                SamplingParams {
                    logprobs: Some(n),
                    logprobs_mode: mode,
                    ..params.clone()
                },
                40 + c as u64,
            );
            q.state.output = vec![top as u32, 7, 9];
            let want = sample1(b, &banned, &q)?;
            q.allowed = Some(mask.clone());
            let got = sample1(b, &x, &q)?;
            expect(got == want, || {
                format!("config {c} {mode:?}: masked {got:?}, -inf logits {want:?}")
            })?;
            let t = got.map_err(|e| format!("config {c}: row error {e}"))?.token as usize;
            expect(mask[t / 32] >> (t % 32) & 1 == 1, || {
                format!("config {c}: disallowed token {t} drawn")
            })?;
        }
    }
    // bits past V are ignored; a disallowed NaN is out of the row
    let mut q = Request::new(SamplingParams::default(), 5);
    q.allowed = Some(mask.clone());
    let want = sample1(b, &x, &q)?;
    let mut wide = mask.clone();
    wide[w - 1] |= !0 << (v % 32);
    q.allowed = Some(wide);
    let mut nan = x.clone();
    nan[top] = f32::NAN;
    expect(sample1(b, &nan, &q)? == want, || {
        "bits past V or a disallowed NaN changed the draw".into()
    })?;
    // one allowed token (the row's smallest) is drawn; none allowed is a row error
    let low = (0..v).min_by(|&i, &j| x[i].total_cmp(&x[j])).unwrap_or(0);
    let mut one = vec![0u32; w];
    one[low / 32] = 1 << (low % 32);
    let mut reqs = vec![Request::new(SamplingParams::default(), 1); 3];
    reqs[0].allowed = Some(one);
    reqs[1].allowed = Some(vec![0; w]);
    let rows: Vec<f32> = x.iter().chain(&x).chain(&x).copied().collect();
    let l = Logits::f32(&rows, 3, v).map_err(|e| e.to_string())?;
    let out = b.sample(&l, &reqs).map_err(|e| e.to_string())?;
    expect(matches!(&out[0], Ok(s) if s.token as usize == low), || {
        format!("the one allowed token {low}: {:?}", out[0])
    })?;
    expect(out[1] == Err(RowError::NoCandidate), || {
        format!("an all-zero mask: {:?}", out[1])
    })?;
    expect(out[2].is_ok(), || format!("the unmasked row: {:?}", out[2]))?;
    // draws at consecutive steps honour the mask too
    let l1 = Logits::f32(&x, 1, v).map_err(|e| e.to_string())?;
    let draws = b
        .sample_draws(&l1, &reqs[..1], 8)
        .map_err(|e| e.to_string())?;
    expect(
        draws[0]
            .iter()
            .all(|d| matches!(d, Ok(s) if s.token as usize == low)),
        || format!("draws of a one-token mask: {:?}", draws[0]),
    )?;
    // a mask of the wrong width names the row and the field
    reqs[2].allowed = Some(vec![!0; w + 1]);
    match b.sample(&l, &reqs) {
        Err(Error::InvalidParameter {
            row: 2,
            field: "allowed",
            ..
        }) => Ok(()),
        other => Err(format!("a mask of {} words for V = {v}: {other:?}", w + 1)),
    }
}

/// Repetition divides positive and multiplies negative logits of seen tokens (once each).
pub fn stage_repetition(b: &dyn Backend) -> Result<(), String> {
    let x = [2.0, 2.5, -1.0, -0.5];
    let mut req = Request::new(
        SamplingParams {
            repetition_penalty: 1.5,
            ..SamplingParams::greedy()
        },
        1,
    );
    req.state.prompt = vec![1, 1, 1];
    // 2.5 / 1.5 = 1.67 < 2.0
    expect(token1(b, &x, &req)? == 0, || {
        "repetition should demote token 1".into()
    })?;
    let x = [-1.0, -0.9, -3.0];
    req.state.prompt = vec![1];
    // -0.9 * 1.5 = -1.35 < -1.0
    expect(token1(b, &x, &req)? == 0, || {
        "negative logits are multiplied".into()
    })?;
    // a penalty below 1 promotes
    req.params.repetition_penalty = 0.5;
    req.state.prompt = vec![2];
    req.state.output = vec![2];
    // -3.0 * 0.5 = -1.5 < -0.9
    expect(token1(b, &x, &req)? == 1, || {
        "penalty < 1 applied once per distinct token".into()
    })
}

/// Frequency counts output occurrences only; presence applies once.
pub fn stage_frequency_presence(b: &dyn Backend) -> Result<(), String> {
    let x = [3.0, 2.0, 1.0];
    let mut req = Request::new(
        SamplingParams {
            frequency_penalty: 0.6,
            ..SamplingParams::greedy()
        },
        1,
    );
    req.state.output = vec![0];
    expect(token1(b, &x, &req)? == 0, || "3.0 - 0.6 > 2.0".into())?;
    req.state.output = vec![0, 0];
    expect(token1(b, &x, &req)? == 1, || "3.0 - 1.2 < 2.0".into())?;
    req.state.prompt = vec![0, 0, 0, 0, 0];
    req.state.output = vec![];
    expect(token1(b, &x, &req)? == 0, || {
        "the prompt does not count for frequency".into()
    })?;
    let mut req = Request::new(
        SamplingParams {
            presence_penalty: 0.9,
            ..SamplingParams::greedy()
        },
        1,
    );
    req.state.output = vec![0, 0, 0, 0];
    expect(token1(b, &x, &req)? == 0, || {
        "presence applies once: 3.0 - 0.9 > 2".into()
    })?;
    req.params.presence_penalty = 1.1;
    expect(token1(b, &x, &req)? == 1, || "3.0 - 1.1 < 2".into())
}

/// The "off" values of every field give the same tokens as the defaults.
pub fn sentinels_leave_result_unchanged(b: &dyn Backend) -> Result<(), String> {
    let mut rng = Rng::new(11);
    let x = zipf_logits(&mut rng, 300, 1.2);
    let base = SamplingParams::default();
    let offs = [
        SamplingParams {
            top_k: 300,
            ..base.clone()
        },
        SamplingParams {
            top_k: 100_000,
            ..base.clone()
        },
        SamplingParams {
            top_p: 1.0,
            min_p: 0.0,
            ..base.clone()
        },
        SamplingParams {
            repetition_penalty: 1.0,
            frequency_penalty: 0.0,
            presence_penalty: 0.0,
            ..base.clone()
        },
    ];
    for seed in 0..40u64 {
        let mut r0 = Request::new(base.clone(), seed);
        r0.state.prompt = vec![1, 2, 3];
        r0.state.output = vec![3, 4];
        r0.state.step = seed * 3;
        let want = token1(b, &x, &r0)?;
        for off in &offs {
            let mut r = r0.clone();
            r.params = off.clone();
            let got = token1(b, &x, &r)?;
            expect(got == want, || {
                format!("off params {off:?} changed token {want} -> {got}")
            })?;
        }
    }
    Ok(())
}

/// Top-k keeps every token tied with the k-th value.
pub fn top_k_keeps_ties(b: &dyn Backend) -> Result<(), String> {
    let x = [3.0, 2.0, 2.0, 1.0, 2.0, 0.0];
    let p = SamplingParams {
        top_k: 2,
        temperature: 1.0,
        ..Default::default()
    };
    let h = histogram(b, &x, &p, 5, 4000)?;
    expect(h[3] == 0 && h[5] == 0, || {
        format!("tokens below the k-th value drawn: {h:?}")
    })?;
    expect(h[1] > 0 && h[2] > 0 && h[4] > 0, || {
        format!("tied tokens must all be kept: {h:?}")
    })
}

/// Top-p keeps every token tied with the m-th probability.
pub fn top_p_keeps_ties(b: &dyn Backend) -> Result<(), String> {
    // probabilities ~ [0.42, 0.155, 0.155, 0.155, 0.057, ...]
    let x = [2.0, 1.0, 1.0, 1.0, 0.0, -1.0];
    let p = SamplingParams {
        top_p: 0.6,
        ..Default::default()
    };
    let h = histogram(b, &x, &p, 9, 4000)?;
    expect(h[4] == 0 && h[5] == 0, || {
        format!("tokens past the nucleus drawn: {h:?}")
    })?;
    expect(h[1] > 0 && h[2] > 0 && h[3] > 0, || {
        format!("tied tokens must all be kept: {h:?}")
    })
}

/// `min_p = 1` keeps only the maximum (and its ties).
pub fn min_p_one_keeps_only_the_max(b: &dyn Backend) -> Result<(), String> {
    let x = [1.0, 4.0, 3.9, 4.0, -2.0];
    let p = SamplingParams {
        min_p: 1.0,
        temperature: 2.0,
        ..Default::default()
    };
    let h = histogram(b, &x, &p, 3, 2000)?;
    expect(h[0] == 0 && h[2] == 0 && h[4] == 0, || {
        format!("min_p=1 kept a non-max token: {h:?}")
    })?;
    expect(h[1] > 0 && h[3] > 0, || {
        format!("both maxima should be drawn: {h:?}")
    })
}

/// Temperatures below 1e-5 are greedy; 1e-5 itself samples.
pub fn temperature_floor(b: &dyn Backend) -> Result<(), String> {
    let x = [1.0, 1.0 + 1e-6, 1.0];
    for seed in 0..50 {
        let p = SamplingParams {
            temperature: 9e-6,
            ..Default::default()
        };
        let t = token1(b, &x, &Request::new(p, seed))?;
        expect(t == 1, || format!("T < 1e-5 must be greedy, got {t}"))?;
    }
    let x = [0.0, 0.0, 0.0];
    let p = SamplingParams {
        temperature: 1e-5,
        ..Default::default()
    };
    let h = histogram(b, &x, &p, 1, 600)?;
    expect(h.iter().all(|&c| c > 100), || {
        format!("T = 1e-5 with equal logits must sample: {h:?}")
    })?;
    // overflow of z / T: greedy
    let x = [3.0e38, 1.0, 2.9e38];
    let p = SamplingParams {
        temperature: 0.5,
        ..Default::default()
    };
    let t = token1(b, &x, &Request::new(p, 3))?;
    expect(t == 0, || {
        format!("overflowing division must be greedy, got {t}")
    })
}

/// V = 1 always yields token 0.
pub fn vocab_of_one(b: &dyn Backend) -> Result<(), String> {
    for (i, p) in [
        SamplingParams::default(),
        SamplingParams::greedy(),
        SamplingParams {
            top_k: 1,
            top_p: 0.1,
            min_p: 1.0,
            ..Default::default()
        },
    ]
    .into_iter()
    .enumerate()
    {
        let t = token1(b, &[-3.5], &Request::new(p, i as u64))?;
        expect(t == 0, || format!("V=1 gave {t}"))?;
    }
    Ok(())
}

/// NaN / +inf and all -inf rows fail alone; their neighbours are drawn as if alone.
pub fn row_errors_stay_in_their_row(b: &dyn Backend) -> Result<(), String> {
    let v = 5;
    let good = [0.1, 2.0, 0.3, 1.5, -1.0];
    let mut data = Vec::new();
    data.extend_from_slice(&good);
    data.extend_from_slice(&[0.0, f32::NAN, 1.0, f32::INFINITY, f32::NAN]);
    data.extend_from_slice(&[f32::NEG_INFINITY; 5]);
    data.extend_from_slice(&[1.0, 2.0, 3.0, 4.0, 5.0]);
    data.extend_from_slice(&good);
    let mut banned = SamplingParams::default();
    for t in 0..5 {
        banned.logit_bias.insert(t, f32::NEG_INFINITY);
    }
    let reqs = vec![
        Request::new(SamplingParams::default(), 1),
        Request::new(SamplingParams::default(), 1),
        Request::new(SamplingParams::default(), 1),
        Request::new(banned, 1),
        Request::new(SamplingParams::default(), 1),
    ];
    let l = Logits::f32(&data, 5, v).map_err(|e| e.to_string())?;
    let out = b.sample(&l, &reqs).map_err(|e| e.to_string())?;
    expect(
        out[1] == Err(RowError::NonFiniteLogits { count: 3 }),
        || format!("row 1: {:?}", out[1]),
    )?;
    expect(out[2] == Err(RowError::NoCandidate), || {
        format!("row 2: {:?}", out[2])
    })?;
    expect(out[3] == Err(RowError::NoCandidate), || {
        format!("row 3: {:?}", out[3])
    })?;
    let alone = token1(b, &good, &reqs[0])?;
    for r in [0, 4] {
        let t = out[r].as_ref().map_err(|e| format!("row {r}: {e}"))?.token;
        expect(t == alone, || format!("row {r} drew {t}, alone {alone}"))?;
    }
    Ok(())
}

/// Every out-of-range parameter is a whole-call error naming field, value and row.
pub fn invalid_parameters_name_field_value_row(b: &dyn Backend) -> Result<(), String> {
    let x = [0.0f32; 8];
    let base = SamplingParams::default();
    let mut bad_bias = base.clone();
    bad_bias.logit_bias.insert(1, f32::NAN);
    let cases: Vec<(SamplingParams, &str)> = vec![
        (
            SamplingParams {
                temperature: -0.5,
                ..base.clone()
            },
            "temperature",
        ),
        (
            SamplingParams {
                temperature: f32::INFINITY,
                ..base.clone()
            },
            "temperature",
        ),
        (
            SamplingParams {
                temperature: f32::NAN,
                ..base.clone()
            },
            "temperature",
        ),
        (
            SamplingParams {
                top_p: 0.0,
                ..base.clone()
            },
            "top_p",
        ),
        (
            SamplingParams {
                top_p: 1.5,
                ..base.clone()
            },
            "top_p",
        ),
        (
            SamplingParams {
                min_p: -0.1,
                ..base.clone()
            },
            "min_p",
        ),
        (
            SamplingParams {
                min_p: 1.1,
                ..base.clone()
            },
            "min_p",
        ),
        (
            SamplingParams {
                repetition_penalty: 0.0,
                ..base.clone()
            },
            "repetition_penalty",
        ),
        (
            SamplingParams {
                repetition_penalty: f32::NAN,
                ..base.clone()
            },
            "repetition_penalty",
        ),
        (
            SamplingParams {
                frequency_penalty: 2.5,
                ..base.clone()
            },
            "frequency_penalty",
        ),
        (
            SamplingParams {
                presence_penalty: -2.01,
                ..base.clone()
            },
            "presence_penalty",
        ),
        (
            SamplingParams {
                presence_penalty: f32::NAN,
                ..base.clone()
            },
            "presence_penalty",
        ),
        (
            SamplingParams {
                logprobs: Some(21),
                ..base.clone()
            },
            "logprobs",
        ),
        (bad_bias, "logit_bias"),
    ];
    let data: Vec<f32> = x.iter().copied().cycle().take(24).collect();
    let l = Logits::f32(&data, 3, 8).map_err(|e| e.to_string())?;
    for (p, field) in cases {
        let reqs = vec![
            Request::new(base.clone(), 0),
            Request::new(base.clone(), 0),
            Request::new(p.clone(), 0),
        ];
        match b.sample(&l, &reqs) {
            Err(Error::InvalidParameter {
                row: 2, field: f, ..
            }) if f == field => {
                let msg = b.sample(&l, &reqs).unwrap_err().to_string();
                expect(msg.contains(field) && msg.contains("row 2"), || {
                    format!("message {msg:?}")
                })?;
            }
            other => {
                return Err(format!(
                    "{field}: expected InvalidParameter at row 2, got {other:?}"
                ))
            }
        }
    }
    Ok(())
}

/// History ids `>= V`, bias ids `>= V` and mismatched shapes are whole-call errors.
pub fn history_and_shape_errors(b: &dyn Backend) -> Result<(), String> {
    let x = [0.0f32; 4];
    let l = Logits::f32(&x, 1, 4).map_err(|e| e.to_string())?;
    let mut r = Request::new(SamplingParams::default(), 0);
    r.state.output = vec![1, 4];
    match b.sample(&l, std::slice::from_ref(&r)) {
        Err(Error::TokenOutOfRange {
            row: 0,
            field: "output",
            id: 4,
            vocab: 4,
        }) => {}
        other => return Err(format!("output id 4: got {other:?}")),
    }
    r.state.output.clear();
    r.state.prompt = vec![9];
    match b.sample(&l, std::slice::from_ref(&r)) {
        Err(Error::TokenOutOfRange {
            field: "prompt",
            id: 9,
            ..
        }) => {}
        other => return Err(format!("prompt id 9: got {other:?}")),
    }
    r.state.prompt.clear();
    r.params.logit_bias.insert(4, 1.0);
    match b.sample(&l, std::slice::from_ref(&r)) {
        Err(Error::TokenOutOfRange {
            field: "logit_bias",
            id: 4,
            ..
        }) => {}
        other => return Err(format!("bias id 4: got {other:?}")),
    }
    let two = vec![Request::default(), Request::default()];
    match b.sample(&l, &two) {
        Err(Error::Shape(_)) => {}
        other => return Err(format!("2 requests for 1 row: got {other:?}")),
    }
    expect(Logits::f32(&x, 3, 2).is_err(), || {
        "4 values as [3, 2] must fail".into()
    })?;
    expect(Logits::f32(&[], 0, 0).is_err(), || "V = 0 must fail".into())
}

/// Raw logprobs are `log_softmax` of the input; processed ones live on the kept set.
pub fn logprobs_raw_and_processed(b: &dyn Backend) -> Result<(), String> {
    let x = [1.0f32, 3.0, 2.0, 3.0, -1.0, 0.5];
    let lse = x.iter().map(|&v| f64::from(v).exp()).sum::<f64>().ln();
    let p = SamplingParams {
        logprobs: Some(4),
        temperature: 0.0,
        ..Default::default()
    };
    let s = sample1(b, &x, &Request::new(p, 0))?.map_err(|e| e.to_string())?;
    let lp = s.logprobs.ok_or("no logprobs")?;
    expect(s.token == 1 && lp.rank == 1, || {
        format!("token {} rank {}", s.token, lp.rank)
    })?;
    let ids: Vec<u32> = lp.top.iter().map(|t| t.token).collect();
    expect(ids == vec![1, 3, 2, 0], || format!("top ids {ids:?}"))?;
    for t in &lp.top {
        let want = f64::from(x[t.token as usize]) - lse;
        expect((f64::from(t.logprob) - want).abs() < 1e-5, || {
            format!("raw logprob of {}: {} vs {want}", t.token, t.logprob)
        })?;
    }
    // processed with top-k 2 at T = 1: two tokens of equal probability
    let p = SamplingParams {
        top_k: 2,
        logprobs: Some(3),
        logprobs_mode: LogprobsMode::Processed,
        ..Default::default()
    };
    for seed in 0..20 {
        let s = sample1(b, &x, &Request::new(p.clone(), seed))?.map_err(|e| e.to_string())?;
        let lp = s.logprobs.ok_or("no logprobs")?;
        expect(s.token == 1 || s.token == 3, || {
            format!("top-k 2 drew {}", s.token)
        })?;
        expect(lp.top.len() == 2, || {
            format!("processed top lists {} tokens", lp.top.len())
        })?;
        expect((lp.logprob - (0.5f32).ln()).abs() < 1e-5, || {
            format!("logprob {}", lp.logprob)
        })?;
        expect(lp.rank == if s.token == 1 { 1 } else { 2 }, || {
            format!("rank {}", lp.rank)
        })?;
    }
    Ok(())
}

/// f16 and bf16 logits draw the same tokens as the same values in f32.
pub fn half_precision_inputs(b: &dyn Backend) -> Result<(), String> {
    let mut rng = Rng::new(77);
    let v = 1000;
    let rows = 6;
    let x: Vec<f32> = (0..rows)
        .flat_map(|_| zipf_logits(&mut rng, v, 1.1))
        .collect();
    let h16: Vec<half::f16> = x.iter().map(|&a| half::f16::from_f32(a)).collect();
    let hb16: Vec<half::bf16> = x.iter().map(|&a| half::bf16::from_f32(a)).collect();
    let reqs: Vec<Request> = (0..rows)
        .map(|r| {
            Request::new(
                SamplingParams {
                    top_p: 0.9,
                    temperature: 0.8,
                    top_k: [0, 40][r % 2],
                    ..Default::default()
                },
                r as u64,
            )
        })
        .collect();
    let w16: Vec<f32> = h16.iter().map(|h| h.to_f32()).collect();
    let wb16: Vec<f32> = hb16.iter().map(|h| h.to_f32()).collect();
    for (name, l, wide) in [
        ("f16", Logits::f16(&h16, rows, v), &w16),
        ("bf16", Logits::bf16(&hb16, rows, v), &wb16),
    ] {
        let l = l.map_err(|e| e.to_string())?;
        let got = b.sample(&l, &reqs).map_err(|e| e.to_string())?;
        let want = b
            .sample(
                &Logits::f32(wide, rows, v).map_err(|e| e.to_string())?,
                &reqs,
            )
            .map_err(|e| e.to_string())?;
        expect(got == want, || {
            format!("{name} differs from its f32 widening")
        })?;
    }
    Ok(())
}

/// A row draws the same token alone and in batches of other sizes, at any position.
pub fn batch_invariance(b: &dyn Backend) -> Result<(), String> {
    let mut rng = Rng::new(5);
    let v = 2000;
    let cases: Vec<(Vec<f32>, Request)> = (0..24).map(|_| random_case(&mut rng, v)).collect();
    let alone: Vec<RowResult> = cases
        .iter()
        .map(|(x, r)| sample1(b, x, r))
        .collect::<Result<_, _>>()?;
    for (shift, size) in [(0usize, 24usize), (7, 24), (3, 11), (20, 5)] {
        let idx: Vec<usize> = (0..size).map(|j| (j + shift) % cases.len()).collect();
        let data: Vec<f32> = idx
            .iter()
            .flat_map(|&i| cases[i].0.iter().copied())
            .collect();
        let reqs: Vec<Request> = idx.iter().map(|&i| cases[i].1.clone()).collect();
        let out = b
            .sample(
                &Logits::f32(&data, size, v).map_err(|e| e.to_string())?,
                &reqs,
            )
            .map_err(|e| e.to_string())?;
        for (j, &i) in idx.iter().enumerate() {
            expect(out[j] == alone[i], || {
                format!(
                    "case {i} at position {j} of {size}: {:?} vs alone {:?}",
                    out[j], alone[i]
                )
            })?;
        }
    }
    Ok(())
}

/// Outcome of comparing a backend with the reference on random rows.
#[derive(Debug, Default, Clone, Copy)]
pub struct Parity {
    /// Rows compared.
    pub rows: usize,
    /// Rows whose token (or error) matched exactly.
    pub same: usize,
    /// Rows that differed on a floating-point tie that the contract allows.
    pub allowed_ties: usize,
    /// Rows that differed otherwise (must be 0).
    pub mismatches: usize,
    /// Largest logprob difference seen on matching rows (relative to `max(1, |logprob|)`).
    pub max_logprob_diff: f32,
}

/// How a backend's result for one row compares with the reference's.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Verdict {
    /// The same token (and logprobs within tolerance), or the same row error.
    Same {
        /// Largest logprob difference (relative to `max(1, |logprob|)`), 0 without logprobs.
        logprob_diff: f32,
    },
    /// A different token on a floating-point tie that the contract allows, or on a top-p
    /// tie the same token with logprobs over a kept set one token larger or smaller.
    AllowedTie,
    /// Any other difference.
    Mismatch,
}

/// Classifies `got` against the reference's `want` and `tie` (the contract's "same
/// result" rule; logprobs within `1e-5` relative, ranks and listed tokens equal, except
/// on a top-p tie, where the kept set and so the processed logprobs may differ).
pub fn classify(got: &RowResult, want: &RowResult, tie: &TieReport) -> Verdict {
    match (got, want) {
        (Ok(g), Ok(w)) if g.token == w.token => {
            if !same_kept(&g.kept, &w.kept) {
                return if tie.is_set_tie() {
                    Verdict::AllowedTie
                } else {
                    Verdict::Mismatch
                };
            }
            let (Some(a), Some(bb)) = (&g.logprobs, &w.logprobs) else {
                return if g.logprobs.is_some() == w.logprobs.is_some() {
                    Verdict::Same { logprob_diff: 0.0 }
                } else {
                    Verdict::Mismatch
                };
            };
            // relative to the value's size: f32 log-probabilities of -100 are 8e-6 apart
            let diff = |x: f32, y: f32| (x - y).abs() / x.abs().max(1.0);
            let mut d = diff(a.logprob, bb.logprob);
            if a.rank != bb.rank || a.top.len() != bb.top.len() {
                d = f32::INFINITY;
            }
            for (ta, tb) in a.top.iter().zip(&bb.top) {
                if ta.token != tb.token && diff(ta.logprob, tb.logprob) > 1e-5 {
                    d = f32::INFINITY;
                }
                d = d.max(diff(ta.logprob, tb.logprob));
            }
            if d <= 1e-5 {
                Verdict::Same { logprob_diff: d }
            } else if tie.is_set_tie() {
                // a top-p or top-n-σ tie may keep one token more or fewer: the same draw, but
                // processed logprobs normalised over another set
                Verdict::AllowedTie
            } else {
                Verdict::Mismatch
            }
        }
        (Err(g), Err(w)) if g == w => Verdict::Same { logprob_diff: 0.0 },
        (Ok(_), Ok(_)) if tie.is_tie() => Verdict::AllowedTie,
        _ => Verdict::Mismatch,
    }
}

/// Whether two kept distributions agree: the same size and ids, probabilities within
/// 1e-6 (or both absent).
fn same_kept(a: &Option<crate::pipeline::Kept>, b: &Option<crate::pipeline::Kept>) -> bool {
    match (a, b) {
        (None, None) => true,
        (Some(a), Some(b)) => {
            a.size == b.size
                && a.top.len() == b.top.len()
                && a.top
                    .iter()
                    .zip(&b.top)
                    .all(|(x, y)| x.id == y.id && (x.p - y.p).abs() <= 1e-6)
        }
        _ => false,
    }
}

/// Compares `b` with the reference on `cases` (row logits, request) in one batch call,
/// classifying every difference (the contract's "same result" rule). `Err` lists the first mismatches.
pub fn parity(b: &dyn Backend, cases: &[(Vec<f32>, Request)]) -> Result<Parity, String> {
    let v = cases[0].0.len();
    let data: Vec<f32> = cases.iter().flat_map(|c| c.0.iter().copied()).collect();
    let reqs: Vec<Request> = cases.iter().map(|c| c.1.clone()).collect();
    let out = b
        .sample(
            &Logits::f32(&data, cases.len(), v).map_err(|e| e.to_string())?,
            &reqs,
        )
        .map_err(|e| e.to_string())?;
    let mut p = Parity {
        rows: cases.len(),
        ..Default::default()
    };
    let mut msgs = Vec::new();
    for (i, ((x, req), got)) in cases.iter().zip(&out).enumerate() {
        let (want, tie) = reference_row(x, req);
        match classify(got, &want, &tie) {
            Verdict::Same { logprob_diff } => {
                p.same += 1;
                p.max_logprob_diff = p.max_logprob_diff.max(logprob_diff);
            }
            Verdict::AllowedTie => p.allowed_ties += 1,
            Verdict::Mismatch => {
                p.mismatches += 1;
                if msgs.len() < 5 {
                    msgs.push(format!(
                        "case {i}: {got:?} vs reference {want:?} (tie {tie:?}, params {:?})",
                        req.params
                    ));
                }
            }
        }
    }
    if p.mismatches > 0 {
        Err(format!(
            "{} mismatches of {}: {}",
            p.mismatches,
            p.rows,
            msgs.join("; ")
        ))
    } else {
        Ok(p)
    }
}

/// Random rows and parameters agree with the reference except allowed ties.
pub fn matches_reference_random_rows(b: &dyn Backend) -> Result<(), String> {
    let mut rng = Rng::new(2024);
    for v in [1usize, 2, 7, 64, 1000, 5000] {
        let cases: Vec<_> = (0..if v > 1000 { 60 } else { 300 })
            .map(|_| random_case(&mut rng, v))
            .collect();
        parity(b, &cases).map_err(|e| format!("V={v}: {e}"))?;
    }
    Ok(())
}

/// At least 10^5 draws per case match the exact processed distribution (chi-square).
pub fn distribution_chi_square(b: &dyn Backend) -> Result<(), String> {
    let x: Vec<f32> = vec![
        1.0, 0.2, 2.1, -0.5, 1.7, 0.9, 2.1, -2.0, 0.0, 1.2, 0.6, -1.0,
    ];
    let panel = [
        SamplingParams::default(),
        SamplingParams {
            temperature: 0.7,
            ..Default::default()
        },
        SamplingParams {
            temperature: 1.8,
            ..Default::default()
        },
        SamplingParams {
            top_k: 4,
            ..Default::default()
        },
        SamplingParams {
            top_p: 0.8,
            ..Default::default()
        },
        SamplingParams {
            min_p: 0.3,
            temperature: 0.9,
            ..Default::default()
        },
        SamplingParams {
            top_k: 6,
            top_p: 0.9,
            min_p: 0.1,
            temperature: 1.3,
            ..Default::default()
        },
    ];
    let n = 100_000;
    for (c, params) in panel.iter().enumerate() {
        // exact processed distribution from the reference's logprobs over the kept set
        let mut probe = Request::new(params.clone(), 0);
        probe.params.logprobs = Some(x.len() as u32);
        probe.params.logprobs_mode = LogprobsMode::Processed;
        let lp = reference_row(&x, &probe)
            .0
            .map_err(|e| e.to_string())?
            .logprobs
            .ok_or("no logprobs")?;
        let mut expected = vec![0f64; x.len()];
        for t in &lp.top {
            expected[t.token as usize] = f64::from(t.logprob).exp();
        }
        let h = histogram(b, &x, params, 1000 + c as u64, n)?;
        let mut chi = 0.0;
        let mut df = 0usize;
        for (i, &e) in expected.iter().enumerate() {
            if e == 0.0 {
                expect(h[i] == 0, || {
                    format!("case {c}: filtered token {i} drawn {} times", h[i])
                })?;
                continue;
            }
            let ex = e * n as f64;
            chi += (h[i] as f64 - ex).powi(2) / ex;
            df += 1;
        }
        let df = df.saturating_sub(1).max(1) as f64;
        // far in the tail: p < 1e-9 for a right filter; a wrong one lands in the thousands
        let limit = df + 12.0 * (2.0 * df).sqrt() + 20.0;
        expect(chi < limit, || {
            format!("case {c} ({params:?}): chi2 {chi:.1} > {limit:.1}, hist {h:?}")
        })?;
    }
    Ok(())
}

/// [`Backend::sample_draws`] gives, at every step, what [`Backend::sample`] gives at that
/// step: for rows with every filter, penalties, errors and greedy rows.
pub fn draws_match_single_steps(b: &dyn Backend) -> Result<(), String> {
    let mut rng = Rng::new(404);
    for v in [1usize, 9, 300] {
        let mut cases: Vec<(Vec<f32>, Request)> =
            (0..6).map(|_| random_case(&mut rng, v)).collect();
        for c in &mut cases {
            c.1.params.logprobs = None;
        }
        cases[0].0[0] = f32::NAN;
        let data: Vec<f32> = cases.iter().flat_map(|c| c.0.iter().copied()).collect();
        let reqs: Vec<Request> = cases.iter().map(|c| c.1.clone()).collect();
        let l = Logits::f32(&data, cases.len(), v).map_err(|e| e.to_string())?;
        let draws = 23;
        let many = b
            .sample_draws(&l, &reqs, draws)
            .map_err(|e| e.to_string())?;
        expect(many.len() == reqs.len(), || {
            format!("{} rows back", many.len())
        })?;
        for d in 0..draws {
            // the requests moved d steps on, as a user would write them
            let at: Vec<Request> = reqs
                .iter()
                .map(|r| {
                    let mut r = r.clone();
                    r.state.step = r.state.step.wrapping_add(d as u64);
                    r
                })
                .collect();
            let one = b.sample(&l, &at).map_err(|e| e.to_string())?;
            for (r, want) in one.iter().enumerate() {
                expect(many[r].len() == draws && &many[r][d] == want, || {
                    format!(
                        "V={v} row {r} step {d}: draws {:?} vs sample {want:?}",
                        many[r].get(d)
                    )
                })?;
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::{classify, TieReport, Verdict};
    use crate::pipeline::{Sample, TokenLogprobs};

    fn row(token: u32, logprob: f32) -> super::RowResult {
        Ok(Sample {
            token,
            logprobs: Some(TokenLogprobs {
                logprob,
                rank: 1,
                top: Vec::new(),
            }),
            kept: None,
        })
    }

    /// A top-p, top-n-σ or XTC tie excuses a different token, and the same token with
    /// logprobs over another kept set; a tie of the draw (`s` within 4 ulp) excuses only
    /// the token.
    #[test]
    fn classify_follows_the_same_result_rule() {
        let none = TieReport {
            s_gap_ulps: u32::MAX,
            top_p_margin: f64::INFINITY,
            sigma_margin: f64::INFINITY,
            xtc_margin: f64::INFINITY,
            typical_margin: f64::INFINITY,
        };
        let top_p = TieReport {
            top_p_margin: 3e-8,
            ..none
        };
        let draw = TieReport {
            s_gap_ulps: 2,
            ..none
        };
        let sigma = TieReport {
            sigma_margin: 4e-7,
            ..none
        };
        let far_sigma = TieReport {
            sigma_margin: 1e-4,
            ..none
        };
        let xtc = TieReport {
            xtc_margin: 5e-7,
            ..none
        };
        let far_xtc = TieReport {
            xtc_margin: 2e-6,
            ..none
        };
        let (want, close, shifted) = (row(7, -2.0), row(7, -2.000_01), row(7, -2.000_05));
        let other = row(8, -2.0);
        assert!(matches!(
            classify(&close, &want, &none),
            Verdict::Same { .. }
        ));
        assert_eq!(classify(&shifted, &want, &none), Verdict::Mismatch);
        assert_eq!(classify(&shifted, &want, &top_p), Verdict::AllowedTie);
        assert_eq!(classify(&shifted, &want, &draw), Verdict::Mismatch);
        assert_eq!(classify(&other, &want, &none), Verdict::Mismatch);
        assert_eq!(classify(&other, &want, &top_p), Verdict::AllowedTie);
        assert_eq!(classify(&other, &want, &draw), Verdict::AllowedTie);
        assert_eq!(classify(&shifted, &want, &sigma), Verdict::AllowedTie);
        assert_eq!(classify(&other, &want, &sigma), Verdict::AllowedTie);
        assert_eq!(classify(&other, &want, &far_sigma), Verdict::Mismatch);
        assert_eq!(classify(&shifted, &want, &xtc), Verdict::AllowedTie);
        assert_eq!(classify(&other, &want, &xtc), Verdict::AllowedTie);
        assert_eq!(classify(&other, &want, &far_xtc), Verdict::Mismatch);
    }
}
