//! Top-n-σ (stage 5a) on the device: rows that use it take the full-row path, whose
//! workgroup computes the threshold from integer sums over the row
//! (`wgpu/step/sigma.wgsl`). Per-call rows through the device API, the host API and
//! many draws, and slots of the device head, each checked against the reference at
//! decode vocabularies: the same token and log-probabilities but on the contract's
//! ties (a `y` within `1e-6 (|ymax| + n σ)` of the threshold among them). Runs on
//! lavapipe in CI; skips without an adapter unless `DECODA_REQUIRE_GPU=1`.

use decoda::head::{Head, SlotRequest};
use decoda::reference::reference_row;
use decoda::testing::{classify, zipf_logits, Rng, Verdict};
use decoda::wgpu::{DeviceLogits, WgpuHead, WgpuSampler};
use decoda::{
    Backend, DType, Logits, LogprobsMode, Request, RowResult, SamplingParams, SequenceState,
};

fn sampler() -> Option<&'static WgpuSampler> {
    static S: std::sync::OnceLock<Option<WgpuSampler>> = std::sync::OnceLock::new();
    S.get_or_init(|| match WgpuSampler::new() {
        Ok(s) => Some(s),
        Err(e) => {
            assert!(
                std::env::var("DECODA_REQUIRE_GPU").is_err(),
                "DECODA_REQUIRE_GPU is set but no adapter opened: {e}"
            );
            eprintln!("skipped: {e}");
            None
        }
    })
    .as_ref()
}

/// The rows through the device API: uploaded, recorded into an encoder of ours,
/// submitted and read back.
fn device_api(b: &WgpuSampler, logits: &Logits<'_>, reqs: &[Request]) -> Vec<RowResult> {
    let buf = b.upload_logits(logits);
    let out = b.outputs(reqs.len()).unwrap();
    let view = DeviceLogits {
        buffer: &buf,
        dtype: DType::F32,
        rows: reqs.len(),
        vocab: logits.vocab(),
        row_stride: logits.vocab(),
        offset: 0,
    };
    let mut enc = b
        .device()
        .create_command_encoder(&wgpu::CommandEncoderDescriptor { label: None });
    b.record(&mut enc, &view, reqs, &out).unwrap();
    b.queue().submit([enc.finish()]);
    b.read(&out, reqs).unwrap()
}

/// Row kinds: Zipf-like, Gaussian, coarse ties (a few values), a row whose values are
/// all equal (σ = 0), a row with a token banned by a `-inf` bias, one with a token pushed
/// 1e30 down by its bias (a range of 2^100) and one of a range of 2^-21, winners
/// anywhere.
fn row_of(kind: usize, rng: &mut Rng, v: usize) -> Vec<f32> {
    match kind {
        0 | 5 | 6 => zipf_logits(rng, v, 1.1),
        1 => (0..v).map(|_| 3.0 * rng.normal()).collect(),
        2 => (0..v).map(|_| rng.below(6) as f32 * 0.5).collect(),
        3 => vec![1.25; v],
        // eight values a few ulps apart: a range of 2^-21
        7 => (0..v)
            .map(|_| 1.0 + rng.below(8) as f32 * 2f32.powi(-23))
            .collect(),
        _ => (0..v).map(|_| rng.normal()).collect(),
    }
}

fn sigma_params(rng: &mut Rng, r: usize, v: usize) -> SamplingParams {
    let pick = |rng: &mut Rng, o: &[f32]| o[rng.below(o.len() as u64) as usize];
    let mut p = SamplingParams {
        top_n_sigma: [0.5f32, 1.0, 2.0, 3.0, 10.0][r % 5],
        temperature: pick(rng, &[0.3, 0.8, 1.0, 1.5]),
        ..SamplingParams::default()
    };
    match (r / 5) % 6 {
        0 => {}
        1 => p.top_k = 40,
        2 => p.top_p = 0.9,
        3 => p.min_p = 0.05,
        4 => {
            p.top_k = 1000;
            p.top_p = 0.95;
            p.repetition_penalty = 1.3;
            p.frequency_penalty = 0.4;
        }
        _ => {}
    }
    if r.is_multiple_of(3) {
        p.logprobs = Some(3);
        p.logprobs_mode = if r.is_multiple_of(2) {
            LogprobsMode::Processed
        } else {
            LogprobsMode::Raw
        };
    }
    let kind = r % 8;
    if kind == 5 {
        p.logit_bias
            .insert((r * 7919 % v) as u32, f32::NEG_INFINITY);
    }
    if kind == 6 {
        p.logit_bias.insert((r * 104_729 % v) as u32, -1e30);
    }
    p
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

/// Per-call rows with top-n-σ alone and with every other filter, penalties and both
/// kinds of log-probabilities, at V = 32,000 and 151,936 (B = 1 rows and a batch of
/// 30): the device API, the host API and the reference agree. Processed
/// log-probabilities are normalised over the kept set, so a wrong threshold shows in
/// them even where the token is the same.
#[test]
fn per_call_top_n_sigma_matches_the_reference() {
    let Some(b) = sampler() else { return };
    let (mut ties, mut rows) = (0, 0);
    for v in [32_000usize, 151_936] {
        let mut rng = Rng::new(v as u64 + 11);
        let (mut data, mut reqs) = (Vec::new(), Vec::new());
        for r in 0..32 {
            data.extend(row_of(r % 8, &mut rng, v));
            let mut req = Request::new(sigma_params(&mut rng, r, v), rng.below(1 << 40));
            req.state.step = rng.below(1000);
            req.state.output = (0..rng.below(40))
                .map(|_| rng.below(v as u64) as u32)
                .collect();
            reqs.push(req);
        }
        let logits = Logits::f32(&data, reqs.len(), v).unwrap();
        let dev = device_api(b, &logits, &reqs);
        ties += check(&dev, &data, &reqs, v, &format!("device API, V {v}"));
        let host = b.sample(&logits, &reqs).unwrap();
        assert_eq!(host, dev, "host API against device API, V {v}");
        // B = 1: a fresh call per row
        for (r, req) in reqs.iter().enumerate().step_by(4) {
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
    eprintln!("{ties} ties in {rows} rows");
    assert!(ties * 10 <= rows, "{ties} ties in {rows} rows");
}

/// Many draws per row (`sample_draws`: the draw pass over the full-row path's kept set)
/// equal the reference's token at each step.
#[test]
fn top_n_sigma_draws_match_the_reference() {
    let Some(b) = sampler() else { return };
    let v = 32_000;
    let mut rng = Rng::new(77);
    let (mut data, mut reqs) = (Vec::new(), Vec::new());
    for r in 0..6 {
        data.extend(row_of(r % 3, &mut rng, v));
        let mut p = sigma_params(&mut rng, r, v);
        p.logprobs = None;
        reqs.push(Request::new(p, r as u64 + 1));
    }
    let logits = Logits::f32(&data, reqs.len(), v).unwrap();
    let out = b.sample_draws(&logits, &reqs, 5).unwrap();
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

/// Slots of the device head with top-n-σ (alone, with top-k and top-p, with penalties,
/// changed mid-run by `set_params`), stepped 40 times over fresh logits: each slot's
/// token is the reference's for its history at every step.
#[test]
fn head_top_n_sigma_matches_the_reference() {
    let Some(b) = sampler() else { return };
    let (slots, v) = (4usize, 32_000usize);
    let params = [
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
    ];
    let mut head = WgpuHead::new(b, slots, v).unwrap();
    let mut states = Vec::new();
    let mut now = params.to_vec();
    for (slot, p) in params.iter().enumerate() {
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
    let mut rng = Rng::new(5);
    let rows: Vec<usize> = (0..slots).collect();
    for step in 0..40 {
        if step == 20 {
            // slot 3 turns top-n-σ on mid-run
            now[3].top_n_sigma = 1.5;
            head.set_params(3, now[3].clone()).unwrap();
        }
        let mut data = Vec::new();
        for _ in 0..slots {
            data.extend(zipf_logits(&mut rng, v, 1.1));
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
            let (want, tie) = reference_row(&data[r * v..(r + 1) * v], &req);
            assert!(
                !matches!(classify(&got.result, &want, &tie), Verdict::Mismatch),
                "step {step} slot {r}: {:?} vs reference {want:?}",
                got.result
            );
            states[r].push(got.result.as_ref().unwrap().token);
        }
    }
}
