//! Top-n-σ (stage 5a), typical-p (6a), XTC (8a) and the kept distribution on the
//! device, each checked the same way against the reference at decode vocabularies:
//! per-call rows through the device
//! API, the host API (equal to the device API) and fresh B = 1 calls (equal to the
//! batch); many draws per row; slots of the device head over 40 steps with a
//! `set_params` mid-run. The same token and log-probabilities, but on the contract's
//! ties (counted), and each stage must change a share of the rows (against the
//! reference with the stage off), so a stage the kernels skipped would fail.
//!
//! Top-n-σ's threshold `ymax - n σ` comes from integer sums (`wgpu/step/sigma.wgsl`);
//! typical-p scores `|y - c|` and walks the scores by radix levels, over the candidate
//! list when it holds the band, else over the row (`step/typical.wgsl`); XTC's coin is
//! drawn in settle, its cut made over the candidates (list path) or by two reads of
//! the row (full-row path).
//! Runs on lavapipe in CI; skips without an adapter unless `DECODA_REQUIRE_GPU=1`.

use decoda::head::{Head, SlotRequest};
use decoda::reference::reference_row;
use decoda::testing::{classify, zipf_logits, Rng, Verdict};
use decoda::wgpu::{DeviceLogits, WgpuHead, WgpuSampler};
use decoda::{Backend, Logits, LogprobsMode, Request, RowResult, SamplingParams, SequenceState};

/// A long-lived sampler on the calling thread's shared test device, one per device
/// (`decoda::testing::gpu`).
fn sampler() -> Option<&'static WgpuSampler> {
    static S: decoda::testing::gpu::PerDevice<Option<WgpuSampler>> =
        decoda::testing::gpu::PerDevice::new();
    S.get_or_init(decoda::testing::gpu::sampler).as_ref()
}

/// The rows through the device API: uploaded, recorded into an encoder of ours,
/// submitted and read back.
fn device_api(b: &WgpuSampler, logits: &Logits<'_>, reqs: &[Request]) -> Vec<RowResult> {
    let buf = b.upload_logits(logits);
    let out = b.outputs_kept(reqs.len()).unwrap();
    let view = DeviceLogits::packed(&buf, logits);
    let mut enc = b
        .device()
        .create_command_encoder(&wgpu::CommandEncoderDescriptor { label: None });
    b.record(&mut enc, &view, reqs, &out).unwrap();
    b.queue().submit([enc.finish()]);
    b.read(&out, reqs).unwrap()
}

/// Row kinds, winners anywhere: 0 Zipf-like (exponent 1.1), 1 Gaussian (σ 3), 2 a few
/// peaks over a Gaussian floor (two of them tied), 3 coarse ties (six values), 4 a row
/// of equal values (σ = 0), 5 Zipf-like (exponent 1.4), 6 eight values a few ulps apart
/// (a range of 2^-21), 7 Gaussian (σ 1).
fn row_of(kind: usize, rng: &mut Rng, v: usize) -> Vec<f32> {
    match kind {
        0 => zipf_logits(rng, v, 1.1),
        1 => (0..v).map(|_| 3.0 * rng.normal()).collect(),
        2 => {
            let mut x: Vec<f32> = (0..v).map(|_| rng.normal()).collect();
            for peak in [12.0f32, 11.5, 11.0, 11.0, 10.0] {
                x[rng.below(v as u64) as usize] = peak;
            }
            x
        }
        3 => (0..v).map(|_| rng.below(6) as f32 * 0.5).collect(),
        4 => vec![1.25; v],
        5 => zipf_logits(rng, v, 1.4),
        6 => (0..v)
            .map(|_| 1.0 + rng.below(8) as f32 * 2f32.powi(-23))
            .collect(),
        _ => (0..v).map(|_| rng.normal()).collect(),
    }
}

/// One of the device's later stages, as the tests drive it.
struct Stage {
    /// The stage's parameters for row `r` (the mix of other stages, logprobs and
    /// biases follows `r`; `v` the vocabulary).
    params: fn(&mut Rng, usize, usize) -> SamplingParams,
    /// Switches the stage off.
    off: fn(&mut SamplingParams),
    /// The kind of row `r` ([`row_of`]).
    kind: fn(usize) -> usize,
    /// The stage must change at least `rows / acted_share` of the per-call rows.
    acted_share: usize,
    /// The device head's four slots, the change `set_params` makes to slot 3 at step 20,
    /// the slots' row kinds and how many slot-steps the stage must change.
    head: [SamplingParams; 4],
    head_change: fn(&mut SamplingParams),
    head_kinds: [usize; 4],
    head_acted: usize,
}

/// The mix of other stages for row `r` of a stage's cases: alone, top-k, top-p, min-p,
/// more tokens than the candidate list holds with penalties, and a sixth given by the
/// stage; log-probabilities raw, processed or none.
fn mixed(mut p: SamplingParams, r: usize, sixth: fn(&mut SamplingParams)) -> SamplingParams {
    match r % 6 {
        0 => {}
        1 => p.top_k = 40,
        2 => p.top_p = 0.9,
        3 => p.min_p = 0.05,
        4 => {
            p.top_k = 5000;
            p.top_p = 0.95;
            p.repetition_penalty = 1.3;
            p.frequency_penalty = 0.4;
        }
        _ => sixth(&mut p),
    }
    if r % 3 != 2 {
        p.logprobs = Some(3);
        p.logprobs_mode = if r.is_multiple_of(2) {
            LogprobsMode::Processed
        } else {
            LogprobsMode::Raw
        };
    }
    p
}

fn pick(rng: &mut Rng, o: &[f32]) -> f32 {
    o[rng.below(o.len() as u64) as usize]
}

fn top_n_sigma() -> Stage {
    Stage {
        params: |rng, r, v| {
            let mut p = mixed(
                SamplingParams {
                    top_n_sigma: pick(rng, &[0.5, 1.0, 2.0, 3.0, 10.0]),
                    temperature: pick(rng, &[0.3, 0.8, 1.0, 1.5]),
                    ..SamplingParams::default()
                },
                r,
                |p| {
                    p.typical_p = 0.9;
                    p.xtc_probability = 1.0;
                    p.xtc_threshold = 0.05;
                },
            );
            // a banned token, and one pushed 1e30 down (a range of 2^100)
            match r % 4 {
                1 => {
                    p.logit_bias
                        .insert((r * 7919 % v) as u32, f32::NEG_INFINITY);
                }
                3 => {
                    p.logit_bias.insert((r * 104_729 % v) as u32, -1e30);
                }
                _ => {}
            }
            p
        },
        off: |p| p.top_n_sigma = 0.0,
        kind: |r| r % 8,
        acted_share: 3,
        head: [
            SamplingParams {
                top_n_sigma: 1.0,
                ..SamplingParams::default()
            },
            SamplingParams {
                top_n_sigma: 2.0,
                top_k: 50,
                top_p: 0.9,
                temperature: 0.7,
                ..SamplingParams::default()
            },
            SamplingParams {
                top_n_sigma: 0.5,
                repetition_penalty: 1.2,
                presence_penalty: 0.5,
                logprobs: Some(2),
                logprobs_mode: LogprobsMode::Processed,
                ..SamplingParams::default()
            },
            SamplingParams {
                temperature: 1.2,
                ..SamplingParams::default()
            },
        ],
        head_change: |p| p.top_n_sigma = 1.5,
        head_kinds: [0, 0, 0, 0],
        head_acted: 40,
    }
}

fn typical_p() -> Stage {
    Stage {
        params: |rng, r, _| {
            mixed(
                SamplingParams {
                    typical_p: pick(rng, &[0.2, 0.5, 0.9, 0.95, 0.99]),
                    temperature: pick(rng, &[0.3, 0.7, 1.0, 1.5]),
                    ..SamplingParams::default()
                },
                r,
                |p| {
                    p.top_n_sigma = 2.0;
                    p.xtc_probability = 1.0;
                    p.xtc_threshold = 0.05;
                },
            )
        },
        off: |p| p.typical_p = 1.0,
        kind: |r| (r / 6) % 6,
        acted_share: 2,
        head: [
            SamplingParams {
                typical_p: 0.9,
                ..SamplingParams::default()
            },
            SamplingParams {
                typical_p: 0.5,
                top_k: 50,
                top_p: 0.9,
                temperature: 0.7,
                ..SamplingParams::default()
            },
            SamplingParams {
                typical_p: 0.95,
                repetition_penalty: 1.2,
                presence_penalty: 0.5,
                logprobs: Some(2),
                logprobs_mode: LogprobsMode::Processed,
                ..SamplingParams::default()
            },
            SamplingParams {
                temperature: 1.2,
                ..SamplingParams::default()
            },
        ],
        head_change: |p| p.typical_p = 0.8,
        head_kinds: [0, 2, 5, 1],
        head_acted: 40,
    }
}

fn xtc() -> Stage {
    Stage {
        params: |rng, r, _| {
            mixed(
                SamplingParams {
                    xtc_probability: [1.0f32, 0.5][(r / 6 + r) % 2],
                    xtc_threshold: pick(rng, &[0.01, 0.05, 0.1, 0.2]),
                    temperature: pick(rng, &[0.3, 0.7, 1.0, 1.5]),
                    ..SamplingParams::default()
                },
                r,
                |p| {
                    p.top_k = 100;
                    p.top_p = 0.95;
                    p.top_n_sigma = 2.0;
                    p.typical_p = 0.95;
                },
            )
        },
        off: |p| p.xtc_probability = 0.0,
        // peaked and Zipf-like rows, where several tokens reach the thresholds
        kind: |r| [0, 2, 5, 1, 3, 2][(r / 6) % 6],
        acted_share: 4,
        head: [
            SamplingParams {
                xtc_probability: 0.5,
                xtc_threshold: 0.05,
                ..SamplingParams::default()
            },
            SamplingParams {
                xtc_probability: 0.7,
                xtc_threshold: 0.1,
                top_k: 50,
                min_p: 0.02,
                temperature: 0.7,
                ..SamplingParams::default()
            },
            SamplingParams {
                xtc_probability: 1.0,
                xtc_threshold: 0.02,
                repetition_penalty: 1.2,
                presence_penalty: 0.5,
                logprobs: Some(2),
                logprobs_mode: LogprobsMode::Processed,
                ..SamplingParams::default()
            },
            SamplingParams {
                temperature: 1.2,
                ..SamplingParams::default()
            },
        ],
        head_change: |p| {
            p.xtc_probability = 0.6;
            p.xtc_threshold = 0.05;
        },
        head_kinds: [2, 5, 2, 5],
        head_acted: 30,
    }
}

/// The kept distribution (`kept = n`): on the list path from the candidates, on
/// the full-row path (unfiltered rows, typical-p, top-n-σ, sets the list does not hold)
/// by a radix select of the n-th largest y, ties split by id on rows of coarse ties and
/// equal values; greedy rows keep their token.
fn kept() -> Stage {
    Stage {
        params: |rng, r, _| {
            mixed(
                SamplingParams {
                    kept: Some([1u32, 7, 64, 1024][(r / 6 + r) % 4]),
                    temperature: pick(rng, &[0.0, 0.7, 1.0, 1.5]),
                    ..SamplingParams::default()
                },
                r,
                |p| {
                    p.top_n_sigma = 2.0;
                    p.typical_p = 0.95;
                    p.xtc_probability = 1.0;
                    p.xtc_threshold = 0.05;
                },
            )
        },
        off: |p| p.kept = None,
        kind: |r| (r / 6 + r) % 8,
        acted_share: 1,
        head: [
            SamplingParams {
                kept: Some(16),
                ..SamplingParams::default()
            },
            SamplingParams {
                kept: Some(1024),
                top_k: 50,
                top_p: 0.9,
                temperature: 0.7,
                ..SamplingParams::default()
            },
            SamplingParams {
                kept: Some(5),
                min_p: 0.05,
                repetition_penalty: 1.2,
                presence_penalty: 0.5,
                logprobs: Some(2),
                logprobs_mode: LogprobsMode::Processed,
                ..SamplingParams::default()
            },
            SamplingParams {
                temperature: 1.2,
                ..SamplingParams::default()
            },
        ],
        head_change: |p| p.kept = Some(300),
        head_kinds: [0, 2, 3, 1],
        head_acted: 140,
    }
}

/// Checks each row against the reference; returns how many were ties.
fn check(got: &[RowResult], data: &[f32], reqs: &[Request], v: usize, what: &str) -> usize {
    let mut ties = 0;
    for (r, (g, req)) in got.iter().zip(reqs).enumerate() {
        let (want, tie) = reference_row(&data[r * v..(r + 1) * v], req);
        match classify(g, &want, &tie) {
            Verdict::Mismatch => panic!(
                "{what}, row {r} ({:?}): {g:?} vs the reference's {want:?} (ties {tie:?})",
                req.params
            ),
            Verdict::AllowedTie => ties += 1,
            Verdict::Same { .. } => {}
        }
    }
    ties
}

/// Whether the stage changes the reference's result for this row (its processed
/// top-3 log-probabilities show a changed kept set even when the token is the same).
fn acts(stage: &Stage, data: &[f32], req: &Request) -> bool {
    let mut on = req.clone();
    on.params.logprobs = Some(3);
    on.params.logprobs_mode = LogprobsMode::Processed;
    let mut off = on.clone();
    (stage.off)(&mut off.params);
    reference_row(data, &off).0 != reference_row(data, &on).0
}

/// Per-call rows of the stage alone and with every other stage, at V = 32,000 and
/// 151,936: a batch of 36 through the device API against the reference, the host API
/// against the device API (at 32,000 only in the quick tier), and rows alone (B = 1)
/// against the batch: every third row, at 151,936 only the first in the quick tier.
fn per_call(stage: &Stage, seed: u64) {
    let Some(b) = sampler() else { return };
    let (mut ties, mut rows, mut acted) = (0, 0, 0);
    for v in [32_000usize, 151_936] {
        let mut rng = Rng::new(v as u64 + seed);
        let (mut data, mut reqs) = (Vec::new(), Vec::new());
        for r in 0..36 {
            data.extend(row_of((stage.kind)(r), &mut rng, v));
            let mut req = Request::new((stage.params)(&mut rng, r, v), rng.below(1 << 40));
            // some steps past 2^32 (the counter's high word)
            req.state.step = if r % 7 == 3 {
                (1u64 << 32) + rng.below(1000)
            } else {
                rng.below(1000)
            };
            req.state.output = (0..rng.below(40))
                .map(|_| rng.below(v as u64) as u32)
                .collect();
            if acts(stage, &data[r * v..(r + 1) * v], &req) {
                acted += 1;
            }
            reqs.push(req);
        }
        let logits = Logits::f32(&data, reqs.len(), v).unwrap();
        let dev = device_api(b, &logits, &reqs);
        ties += check(&dev, &data, &reqs, v, &format!("device API, V {v}"));
        // (the host API's upload, record and read at one vocabulary in the quick tier)
        if v == 32_000 || decoda::testing::full_tier() {
            let host = b.sample(&logits, &reqs).unwrap();
            assert_eq!(host, dev, "host API against device API, V {v}");
        }
        // (at 151,936 the first row alone in the quick tier: every third row there
        // took about 2 s of the binary's 35, without AVX-512)
        let singles = if v == 32_000 || decoda::testing::full_tier() {
            3
        } else {
            usize::MAX
        };
        for (r, req) in reqs.iter().enumerate().step_by(singles) {
            let row = &data[r * v..(r + 1) * v];
            let one = device_api(
                b,
                &Logits::f32(row, 1, v).unwrap(),
                std::slice::from_ref(req),
            );
            assert_eq!(one[0], dev[r], "B = 1 against the batch, V {v} row {r}");
        }
        rows += reqs.len();
    }
    eprintln!("{ties} ties, the stage changed {acted} of {rows} rows");
    assert!(ties * 10 <= rows, "{ties} ties in {rows} rows");
    assert!(
        acted * stage.acted_share >= rows,
        "the stage changed only {acted} of {rows} rows"
    );
}

/// Many draws per row (`sample_draws`) equal the reference's token at each draw's step.
fn draws(stage: &Stage, seed: u64) {
    let Some(b) = sampler() else { return };
    let v = 32_000;
    let mut rng = Rng::new(seed);
    let (mut data, mut reqs) = (Vec::new(), Vec::new());
    for r in 0..6 {
        data.extend(row_of([0, 1, 2][r % 3], &mut rng, v));
        let mut p = (stage.params)(&mut rng, r, v);
        p.logprobs = None;
        reqs.push(Request::new(p, r as u64 + 1));
    }
    let logits = Logits::f32(&data, reqs.len(), v).unwrap();
    let out = b.sample_draws(&logits, &reqs, 6).unwrap();
    for (r, draws) in out.iter().enumerate() {
        for (d, got) in draws.iter().enumerate() {
            let mut req = reqs[r].clone();
            req.state.step += d as u64;
            let (want, tie) = reference_row(&data[r * v..(r + 1) * v], &req);
            assert!(
                !matches!(classify(got, &want, &tie), Verdict::Mismatch),
                "row {r} draw {d}: {got:?} vs {want:?}"
            );
        }
    }
}

/// The device head's slots stepped 40 times over fresh logits (slot 3 changed by
/// `set_params` at step 20): each slot's result is the reference's for its history and
/// step at every step.
fn head(stage: &Stage, seed: u64) {
    let Some(b) = sampler() else { return };
    let (slots, v) = (4usize, 32_000usize);
    let mut head = WgpuHead::new(b, slots, v).unwrap();
    let mut states = Vec::new();
    let mut now = stage.head.to_vec();
    for (slot, p) in stage.head.iter().enumerate() {
        let prompt: Vec<u32> = (0..20).map(|i| (i * 131 % v) as u32).collect();
        head.join(
            slot,
            SlotRequest::new(p.clone())
                .seed(slot as u64 + 3)
                .prompt(prompt.clone()),
        )
        .unwrap();
        let mut s = SequenceState::new(slot as u64 + 3);
        s.prompt = prompt;
        states.push(s);
    }
    let mut rng = Rng::new(seed);
    let rows: Vec<usize> = (0..slots).collect();
    let mut acted = 0;
    for step in 0..40 {
        if step == 20 {
            (stage.head_change)(&mut now[3]);
            head.set_params(3, now[3].clone()).unwrap();
        }
        let mut data = Vec::new();
        for &kind in &stage.head_kinds {
            data.extend(row_of(kind, &mut rng, v));
        }
        let out = head
            .step(&Logits::f32(&data, slots, v).unwrap(), &rows)
            .unwrap();
        for (r, got) in out.iter().enumerate() {
            let req = Request {
                params: now[r].clone(),
                state: states[r].clone(),
                allowed: None,
            };
            let row = &data[r * v..(r + 1) * v];
            let (want, tie) = reference_row(row, &req);
            assert!(
                !matches!(classify(&got.result, &want, &tie), Verdict::Mismatch),
                "step {step} slot {r}: {:?} vs reference {want:?}",
                got.result
            );
            if acts(stage, row, &req) {
                acted += 1;
            }
            states[r].push(got.result.as_ref().unwrap().token);
        }
    }
    assert!(
        acted >= stage.head_acted,
        "the stage changed only {acted} slot-steps"
    );
}

#[test]
fn per_call_top_n_sigma_matches_the_reference() {
    per_call(&top_n_sigma(), 11);
}

#[test]
fn top_n_sigma_draws_match_the_reference() {
    draws(&top_n_sigma(), 77);
}

#[test]
fn head_top_n_sigma_matches_the_reference() {
    head(&top_n_sigma(), 5);
}

#[test]
fn per_call_typical_p_matches_the_reference() {
    per_call(&typical_p(), 9);
}

#[test]
fn typical_p_draws_match_the_reference() {
    draws(&typical_p(), 79);
}

#[test]
fn head_typical_p_matches_the_reference() {
    head(&typical_p(), 7);
}

#[test]
fn per_call_xtc_matches_the_reference() {
    per_call(&xtc(), 5);
}

/// XTC's coin changes the kept set from step to step, so its many draws go step by
/// step; each is the reference's token at its own step.
#[test]
fn xtc_draws_match_the_reference() {
    draws(&xtc(), 78);
}

#[test]
fn head_xtc_matches_the_reference() {
    head(&xtc(), 6);
}

#[test]
fn per_call_kept_matches_the_reference() {
    per_call(&kept(), 3);
}

/// Rows asking for the kept distribution draw step by step, each draw's set its own.
#[test]
fn kept_draws_match_the_reference() {
    draws(&kept(), 80);
}

#[test]
fn head_kept_matches_the_reference() {
    head(&kept(), 8);
}

/// The f64 top-n-σ threshold of a row at temperature 1 with biases, and the contract's
/// margin `3e-7 (|ymax| + n σ)` around it.
fn sigma_threshold(x: &[f32], p: &SamplingParams) -> (f64, f64, Vec<f64>) {
    let y: Vec<f64> = x
        .iter()
        .enumerate()
        .map(|(i, &x)| {
            let z = x + p.logit_bias.get(&(i as u32)).copied().unwrap_or(0.0);
            f64::from(z / p.temperature)
        })
        .collect();
    let n = y.len() as f64;
    let ymax = y.iter().copied().fold(f64::MIN, f64::max);
    let mean = y.iter().sum::<f64>() / n;
    let sigma = (y.iter().map(|v| (v - mean) * (v - mean)).sum::<f64>() / n).sqrt();
    let n_sigma = f64::from(p.top_n_sigma) * sigma;
    (ymax - n_sigma, 3e-7 * (ymax.abs() + n_sigma), y)
}

/// Top-n-σ's threshold on the device lies within the contract's `3e-7 (|ymax| + n σ)` of
/// the f64 one: the kept set's size (`kept = 0`) counts every y above the f64 threshold
/// plus that margin and none below it less the margin, on Gaussian, Zipf-like and
/// peaked rows at V = 32,000 and 151,936, one row with a token pushed 1e30 down (a
/// range of 2^100) inside the probe's sample. The scan sums every row's terms but two
/// (`sigma_walked_rows`): one with a token pushed 1e30 down off the sample and one with
/// a token far above it are walked by settle, and meet the bound too. Half the rows
/// carry 400 values spaced `1e-6 (|ymax| + n σ)` apart across their own threshold
/// (placed by a fixed-point iteration), so a threshold off by more than about the
/// margin changes the count.
#[test]
fn top_n_sigma_threshold_within_its_bound() {
    let Some(b) = sampler() else { return };
    for v in [32_000usize, 151_936] {
        let mut rng = Rng::new(v as u64 + 1);
        let (mut data, mut reqs) = (Vec::new(), Vec::new());
        for r in 0..16 {
            let mut x = row_of([0, 1, 2, 5, 7][r % 5], &mut rng, v);
            let mut p = SamplingParams {
                top_n_sigma: [0.5f32, 1.0, 2.0, 3.0][r % 4],
                temperature: if r % 2 == 0 { 1.0 } else { 0.7 },
                kept: Some(0),
                ..SamplingParams::default()
            };
            match r {
                // in the probe's sample (runs of 16 every 256): the scan's sums hold it
                7 => {
                    p.logit_bias.insert(3, -1e30);
                }
                // off the sample, far below it or above the sums' reference: the full-row path sums them
                9 => {
                    p.logit_bias.insert(100, -1e30);
                }
                11 => {
                    let (lo, hi) = x
                        .iter()
                        .fold((f32::MAX, f32::MIN), |(l, h), &v| (l.min(v), h.max(v)));
                    x[100] = hi + 4.0 * (hi - lo);
                }
                _ => {}
            }
            if r % 2 == 0 {
                let at: Vec<usize> = (0..400).map(|j| 7 + j * (v / 401)).collect();
                for _ in 0..8 {
                    let (tau, margin, _) = sigma_threshold(&x, &p);
                    let step = margin / 0.3;
                    for (j, &i) in at.iter().enumerate() {
                        x[i] = (tau + (j as f64 - 200.0) * step) as f32;
                    }
                }
            }
            data.extend(x);
            reqs.push(Request::new(p, r as u64));
        }
        let logits = Logits::f32(&data, reqs.len(), v).unwrap();
        // every row's sums come from the scan but those two rows'
        let walked = b.sigma_walked_rows(&logits, &reqs).unwrap();
        let want: Vec<bool> = (0..16).map(|r| r == 9 || r == 11).collect();
        assert_eq!(
            walked, want,
            "V {v}: rows whose sums the full-row path made"
        );
        let full = b.full_row_rows(&logits, &reqs).unwrap();
        assert!(
            full[9] && full[11],
            "V {v}: those rows take the full-row path: {full:?}"
        );
        let got = device_api(b, &logits, &reqs);
        for (r, (g, req)) in got.iter().zip(&reqs).enumerate() {
            let (tau, margin, y) = sigma_threshold(&data[r * v..(r + 1) * v], &req.params);
            let surely = y.iter().filter(|&&v| v >= tau + margin).count() as u32;
            let at_most = y.iter().filter(|&&v| v >= tau - margin).count() as u32;
            let size = g.as_ref().unwrap().kept.as_ref().unwrap().size;
            assert!(
                (surely..=at_most).contains(&size),
                "V {v} row {r}: kept {size}, the f64 threshold {tau} keeps {surely}..={at_most}"
            );
        }
    }
}

/// Typical-p rows whose band the candidate list holds are settled there (no read of the
/// row after the scan), those whose band it cannot hold on the full-row path, and both
/// give the reference's token and kept set: peaked rows (Zipf 1.4) alone, with min-p,
/// top-k, top-p and the kept distribution, at V = 32,000 and 151,936; flat rows
/// (Gaussian σ 1, bands of 10^4 tokens and more) and rows whose band crosses the list's
/// threshold (thousands of tokens under it, and the band's centre above it: the
/// candidates alone would cut in the wrong place) as the full-row path's.
/// (A proof that let the crossing rows settle on the list fails the reference check.)
#[test]
fn typical_p_bands_the_list_holds_settle_there() {
    let Some(b) = sampler() else { return };
    for v in [32_000usize, 151_936] {
        let mut rng = Rng::new(v as u64 + 61);
        let (mut data, mut reqs, mut flat) = (Vec::new(), Vec::new(), Vec::new());
        for r in 0..24 {
            let (kind, mut t) = (r % 6, pick(&mut rng, &[0.7, 1.0]));
            if kind == 5 && r % 12 == 11 {
                // the crossing row: one token at 5, 50 in [2.9, 3.1), 8,000 on a grid
                // 3e-4 apart in (-2.4, 0] (scores apart by more than the contract's
                // ties), the rest at -20, in places drawn at random
                let mut x = vec![-20.0f32; v];
                let mut put = |y: f32, x: &mut Vec<f32>| loop {
                    let i = rng.below(v as u64) as usize;
                    if x[i] == -20.0 {
                        x[i] = y;
                        break;
                    }
                };
                for j in 0..8000 {
                    put(-3e-4 * j as f32, &mut x);
                }
                for j in 0..50 {
                    put(2.9 + 4e-3 * j as f32, &mut x);
                }
                put(5.0, &mut x);
                data.extend(x);
                t = 1.0;
            } else {
                data.extend(row_of(if kind == 5 { 7 } else { 5 }, &mut rng, v));
            }
            let mut p = SamplingParams {
                typical_p: pick(&mut rng, &[0.5, 0.9, 0.95]),
                temperature: t,
                kept: Some(8),
                ..SamplingParams::default()
            };
            if kind == 5 && r % 12 == 11 {
                // the whole grid holds 72% of the mass, its part the list can hold
                // (at most 4,096 tokens) less than 56%, with the 50 over 60%: the
                // candidates alone pass 0.58 of it in the wrong place
                p.typical_p = 0.58;
            }
            match r % 6 {
                1 => p.min_p = 0.05,
                2 => p.top_k = 40,
                3 => p.top_p = 0.9,
                4 => {
                    p.logprobs = Some(3);
                    p.logprobs_mode = LogprobsMode::Processed;
                }
                _ => {}
            }
            flat.push(kind == 5);
            reqs.push(Request::new(p, rng.below(1 << 40)));
        }
        let logits = Logits::f32(&data, reqs.len(), v).unwrap();
        let full = b.full_row_rows(&logits, &reqs).unwrap();
        // the reference first: a wrong proof shows as a wrong token or kept set
        let ties = check(&device_api(b, &logits, &reqs), &data, &reqs, v, "typical-p");
        assert_eq!(full, flat, "V {v}: rows on the full-row path");
        assert!(ties <= 1, "V {v}: {ties} ties");
        // many draws of the same rows draw over the band's run of the list (past the
        // top tokens typical-p removed), each at its own step
        for q in &mut reqs {
            q.params.kept = None;
            q.params.logprobs = None;
        }
        let (out, mut ties) = (b.sample_draws(&logits, &reqs, 4).unwrap(), 0);
        for (r, draws) in out.iter().enumerate() {
            for (d, got) in draws.iter().enumerate() {
                let mut q = reqs[r].clone();
                q.state.step += d as u64;
                let (want, tie) = reference_row(&data[r * v..(r + 1) * v], &q);
                match classify(got, &want, &tie) {
                    Verdict::Mismatch => panic!("V {v} row {r} draw {d}: {got:?} vs {want:?}"),
                    Verdict::AllowedTie => ties += 1,
                    Verdict::Same { .. } => {}
                }
            }
        }
        assert!(ties <= 2, "V {v}: {ties} ties in the draws");
    }
}

/// Rows whose only filter is the kept distribution, or XTC (its coin fired) finding
/// fewer than two top choices, are settled from the scan's mass and winner and the
/// list's top (no read of the row after the scan); rows with coarse ties at the top (a
/// sixth of the row tied) on the full-row path. All against the reference, with kept
/// 1 to 1,024 and XTC thresholds 0.1 to 0.5, at V = 32,000 and 151,936.
#[test]
fn kept_and_xtc_alone_settle_from_the_scan() {
    let Some(b) = sampler() else { return };
    for v in [32_000usize, 151_936] {
        let mut rng = Rng::new(v as u64 + 67);
        let (mut data, mut reqs, mut want_full) = (Vec::new(), Vec::new(), Vec::new());
        let mut n_removed = 0;
        for r in 0..32 {
            let kind = [5, 1, 7, 3][r % 4];
            data.extend(row_of(kind, &mut rng, v));
            let mut p = SamplingParams {
                temperature: pick(&mut rng, &[0.7, 1.0, 1.3]),
                ..SamplingParams::default()
            };
            let xtc = r % 8 >= 4;
            if xtc {
                p.xtc_probability = 1.0;
                // (1e-5: on Gaussian rows more top choices than the list holds)
                p.xtc_threshold = pick(&mut rng, &[1e-5, 0.1, 0.3, 0.5]);
            } else {
                p.kept = Some(pick(&mut rng, &[1.0, 8.0, 64.0, 1024.0]) as u32);
            }
            if r % 3 == 0 {
                p.logprobs = Some(3);
                p.logprobs_mode = LogprobsMode::Processed;
            }
            let req = Request::new(p, rng.below(1 << 40));
            // a kept row is settled there unless its top is a sixth of the row; an XTC
            // row unless its top choices are removed (the draw over the row is left)
            let removed = xtc && acts_xtc(&data[r * v..(r + 1) * v], &req);
            n_removed += usize::from(removed);
            want_full.push(kind == 3 || removed);
            reqs.push(req);
        }
        let logits = Logits::f32(&data, reqs.len(), v).unwrap();
        let full = b.full_row_rows(&logits, &reqs).unwrap();
        let ties = check(
            &device_api(b, &logits, &reqs),
            &data,
            &reqs,
            v,
            "kept / XTC",
        );
        assert_eq!(full, want_full, "V {v}: rows on the full-row path");
        assert!(ties <= 1, "V {v}: {ties} ties");
        assert!(want_full.iter().filter(|f| !**f).count() >= 10);
        assert!(
            n_removed >= 2,
            "V {v}: XTC removed tokens from {n_removed} rows"
        );
    }
}

/// Whether XTC removes tokens from this row (the reference's kept set shrinks).
fn acts_xtc(row: &[f32], req: &Request) -> bool {
    let mut on = req.clone();
    on.params.kept = Some(1);
    let mut off = on.clone();
    off.params.xtc_probability = 0.0;
    let size = |q: &Request| reference_row(row, q).0.unwrap().kept.unwrap().size;
    size(&on) != size(&off)
}

/// The list path orders nothing but what it lists: its cuts are selections over the
/// unordered candidates, and only the listed top (log-probabilities, the kept
/// distribution) is sorted. Rows whose set the list holds with ties at the cut of what
/// is listed (10 tokens at 8, 300 at 7, a Gaussian floor): the listed ties must be the
/// smallest ids, the rank of a tied winner counts the smaller ids before it, and top-k
/// cuts inside the ties (keeping them all); with top-p, min-p, XTC and typical-p too.
/// Every row on the list path, all against the reference, at V = 32,000 and 151,936.
#[test]
fn list_path_splits_ties_by_id() {
    let Some(b) = sampler() else { return };
    for v in [32_000usize, 151_936] {
        let mut rng = Rng::new(v as u64 + 71);
        let (mut data, mut reqs) = (Vec::new(), Vec::new());
        for r in 0..24 {
            let mut x: Vec<f32> = (0..v).map(|_| rng.normal()).collect();
            let mut ids: Vec<usize> = (0..v).collect();
            for j in 0..310 {
                let at = j + rng.below((v - j) as u64) as usize;
                ids.swap(j, at);
                x[ids[j]] = if j < 10 { 8.0 } else { 7.0 };
            }
            data.extend(x);
            let mut p = SamplingParams {
                top_k: [50, 5, 200, 310][r % 4],
                temperature: pick(&mut rng, &[0.5, 1.0, 2.0]),
                kept: Some([20u32, 64, 200, 1][r % 4]),
                logprobs: Some(20),
                logprobs_mode: LogprobsMode::Processed,
                ..SamplingParams::default()
            };
            match r % 6 {
                1 => p.top_p = 0.5,
                2 => p.min_p = 0.2,
                3 => {
                    p.xtc_probability = 1.0;
                    p.xtc_threshold = 0.001;
                }
                4 => p.typical_p = 0.5,
                _ => {}
            }
            reqs.push(Request::new(p, rng.below(1 << 40)));
        }
        let logits = Logits::f32(&data, reqs.len(), v).unwrap();
        let full = b.full_row_rows(&logits, &reqs).unwrap();
        assert!(
            full.iter().all(|f| !f),
            "V {v}: rows on the full-row path: {full:?}"
        );
        let got = device_api(b, &logits, &reqs);
        let ties = check(&got, &data, &reqs, v, "ties on the list");
        assert!(ties <= 1, "V {v}: {ties} ties");
        // the listed top holds tied tokens past the first ten
        let tied = got
            .iter()
            .filter(|g| {
                g.as_ref()
                    .is_ok_and(|s| s.kept.as_ref().is_some_and(|k| k.top.len() > 10))
            })
            .count();
        assert!(tied >= 8, "V {v}: {tied} rows list ties");
    }
}
