//! Typical-p (stage 6a) on the device: rows that use it take the full-row path, whose
//! workgroup sums the kept set's weights and weighted distances as integers, walks the
//! scores `|y - c|` upward by radix levels to the cut and finds the largest `y` left
//! (`wgpu/step/typical.wgsl`). Per-call rows through the device API, the host API and
//! many draws, and slots of the device head, each checked against the reference at
//! decode vocabularies: the same token and log-probabilities but on the contract's ties
//! (a score within `1e-5 (1 + |y| + |ymax|)` of the cut, a sum within `1e-6` of `p`).
//! Runs on lavapipe in CI; skips without an adapter unless `DECODA_REQUIRE_GPU=1`.

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

/// Row kinds: Zipf-like (two exponents), Gaussian, a few peaks over a Gaussian floor,
/// coarse ties (a few values), a row of equal values, winners anywhere.
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
        4 => vec![0.75; v],
        _ => zipf_logits(rng, v, 1.4),
    }
}

fn typical_params(rng: &mut Rng, r: usize) -> SamplingParams {
    let pick = |rng: &mut Rng, o: &[f32]| o[rng.below(o.len() as u64) as usize];
    let mut p = SamplingParams {
        typical_p: pick(rng, &[0.2, 0.5, 0.9, 0.95, 0.99]),
        temperature: pick(rng, &[0.3, 0.7, 1.0, 1.5]),
        ..SamplingParams::default()
    };
    match r % 6 {
        0 => {}
        1 => p.top_k = 40,
        2 => p.top_p = 0.9,
        3 => p.min_p = 0.05,
        4 => {
            p.top_k = 5000;
            p.repetition_penalty = 1.3;
            p.frequency_penalty = 0.4;
        }
        _ => {
            p.top_n_sigma = 2.0;
            p.xtc_probability = 1.0;
            p.xtc_threshold = 0.05;
        }
    }
    if r % 3 != 2 {
        p.logprobs = Some(3);
        p.logprobs_mode = if r.is_multiple_of(3) {
            LogprobsMode::Processed
        } else {
            LogprobsMode::Raw
        };
    }
    p
}

/// Whether typical-p changes the reference's result for this row.
fn typical_acts(data: &[f32], req: &Request) -> bool {
    let mut off = req.clone();
    off.params.typical_p = 1.0;
    off.params.logprobs = Some(3);
    off.params.logprobs_mode = LogprobsMode::Processed;
    let mut on = req.clone();
    on.params.logprobs = Some(3);
    on.params.logprobs_mode = LogprobsMode::Processed;
    reference_row(data, &off).0 != reference_row(data, &on).0
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

/// Per-call rows with typical-p alone and with every other stage, penalties and both
/// kinds of log-probabilities at V = 32,000 and 151,936 (a batch of 36, then B = 1
/// rows): the device API, the host API and the reference agree, and typical-p changed
/// most rows. Processed log-probabilities are normalised over the kept set, so a wrong
/// band shows in them even where the token is the same.
#[test]
fn per_call_typical_p_matches_the_reference() {
    let Some(b) = sampler() else { return };
    let (mut ties, mut rows, mut acted) = (0, 0, 0);
    for v in [32_000usize, 151_936] {
        let mut rng = Rng::new(v as u64 + 9);
        let (mut data, mut reqs) = (Vec::new(), Vec::new());
        for r in 0..36 {
            // every kind of row with every combination of stages
            data.extend(row_of((r / 6) % 6, &mut rng, v));
            let mut req = Request::new(typical_params(&mut rng, r), rng.below(1 << 40));
            req.state.step = rng.below(1000);
            req.state.output = (0..rng.below(40))
                .map(|_| rng.below(v as u64) as u32)
                .collect();
            if typical_acts(&data[r * v..(r + 1) * v], &req) {
                acted += 1;
            }
            reqs.push(req);
        }
        let logits = Logits::f32(&data, reqs.len(), v).unwrap();
        let dev = device_api(b, &logits, &reqs);
        ties += check(&dev, &data, &reqs, v, &format!("device API, V {v}"));
        let host = b.sample(&logits, &reqs).unwrap();
        assert_eq!(host, dev, "host API against device API, V {v}");
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
    eprintln!("{ties} ties, typical-p acted on {acted} of {rows} rows");
    assert!(ties * 10 <= rows, "{ties} ties in {rows} rows");
    assert!(
        acted * 2 >= rows,
        "typical-p acted on only {acted} of {rows} rows"
    );
}

/// Many draws per row (`sample_draws`: the draw pass over the full-row path's kept set)
/// equal the reference's token at each step.
#[test]
fn typical_p_draws_match_the_reference() {
    let Some(b) = sampler() else { return };
    let v = 32_000;
    let mut rng = Rng::new(79);
    let (mut data, mut reqs) = (Vec::new(), Vec::new());
    for r in 0..6 {
        data.extend(row_of(r % 3, &mut rng, v));
        let mut p = typical_params(&mut rng, r);
        p.xtc_probability = 0.0;
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

/// Slots of the device head with typical-p (alone, with top-k and top-p, with penalties
/// and processed log-probabilities, turned on mid-run by `set_params`), stepped 40 times
/// over fresh logits: each slot's result is the reference's for its history at every
/// step.
#[test]
fn head_typical_p_matches_the_reference() {
    let Some(b) = sampler() else { return };
    let (slots, v) = (4usize, 32_000usize);
    let params = [
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
    let mut rng = Rng::new(7);
    let rows: Vec<usize> = (0..slots).collect();
    for step in 0..40 {
        if step == 20 {
            now[3].typical_p = 0.8;
            head.set_params(3, now[3].clone()).unwrap();
        }
        let mut data = Vec::new();
        for r in 0..slots {
            data.extend(row_of([0, 2, 5, 1][r], &mut rng, v));
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
