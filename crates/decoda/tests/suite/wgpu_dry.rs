//! DRY (stage 3a) on the device: per-call rows through the device API and the host API,
//! and slots of the device head whose DRY window the kernels read from the slot's ring on
//! the device. Each is checked against the reference (per-call rows) or the CPU head
//! (slots, which `later_stages.rs` checks against the reference), at real vocabularies,
//! with histories up to the device's 4,096-token window, sequence breakers and the
//! window's edge cases. Runs on lavapipe in CI; skips without an adapter unless
//! `DECODA_REQUIRE_GPU=1`.

use decoda::head::{Head, SlotRequest};
use decoda::reference::reference_row;
use decoda::testing::{classify, Rng, Verdict};
use decoda::wgpu::{DeviceLogits, WgpuHead, WgpuSampler};
use decoda::{Backend, CpuHead, DType, Error, Logits, Request, SamplingParams, SequenceState};

/// A long-lived sampler on the calling thread's shared test device, one per device
/// (`decoda::testing::gpu`).
fn sampler() -> Option<&'static WgpuSampler> {
    static S: decoda::testing::gpu::PerDevice<Option<WgpuSampler>> =
        decoda::testing::gpu::PerDevice::new();
    S.get_or_init(decoda::testing::gpu::sampler).as_ref()
}

/// A history that repeats phrases (so DRY finds long repeats) over `ids` ids, ending
/// inside a repeat.
fn repeating_history(rng: &mut Rng, len: usize, ids: u64, v: usize) -> Vec<u32> {
    let phrase: Vec<u32> = (0..3 + rng.below(12))
        .map(|_| rng.below(ids) as u32 * (v as u32 / ids as u32))
        .collect();
    let mut h = Vec::with_capacity(len);
    while h.len() < len {
        if rng.below(4) == 0 {
            h.push(rng.below(v as u64) as u32);
        } else {
            h.extend(&phrase[..phrase.len().min(len - h.len())]);
        }
    }
    h
}

/// DRY parameters at random: multipliers, bases (1 included: no cap on the exponent),
/// allowed lengths, windows (-1, short, long) and breakers, some of them ids of the
/// history.
fn dry_params(rng: &mut Rng, history: &[u32]) -> SamplingParams {
    let pick = |rng: &mut Rng, o: &[f32]| o[rng.below(o.len() as u64) as usize];
    let mut p = SamplingParams {
        dry_multiplier: pick(rng, &[0.8, 2.0, 5.0]),
        dry_base: pick(rng, &[1.0, 1.75, 3.0]),
        dry_allowed_length: rng.below(4) as u32,
        dry_penalty_last_n: [-1, 8, 64, 700, 4096][rng.below(5) as usize],
        temperature: pick(rng, &[0.0, 0.0, 0.8, 1.0]),
        ..SamplingParams::default()
    };
    match rng.below(4) {
        0 => p.top_k = 40,
        1 => p.top_p = 0.9,
        2 => p.logprobs = Some(3),
        _ => {}
    }
    for _ in 0..rng.below(4) {
        let len = 1 + rng.below(3) as usize;
        let at = rng.below(history.len().max(1) as u64) as usize;
        let seq: Vec<u32> = history.iter().skip(at).take(len).copied().collect();
        if !seq.is_empty() {
            p.dry_sequence_breakers.push(seq);
        }
    }
    p
}

/// Logits where the history's ids stand out, so DRY's penalties decide tokens.
fn logits_for(rng: &mut Rng, history: &[u32], v: usize) -> Vec<f32> {
    let mut x: Vec<f32> = (0..v).map(|_| rng.normal()).collect();
    for &t in history.iter().rev().take(64) {
        x[t as usize] = 6.0 + rng.normal();
    }
    x
}

/// The rows through the device API: uploaded, recorded into an encoder of ours,
/// submitted and read back (or the error `record` returns).
fn device_api(
    b: &WgpuSampler,
    logits: &Logits<'_>,
    reqs: &[Request],
) -> decoda::Result<Vec<decoda::RowResult>> {
    let buf = b.upload_logits(logits);
    let out = b.outputs(reqs.len())?;
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
    b.record(&mut enc, &view, reqs, &out)?;
    b.queue().submit([enc.finish()]);
    b.read(&out, reqs)
}

fn check_rows(got: &[decoda::RowResult], data: &[f32], reqs: &[Request], v: usize, what: &str) {
    for (r, (g, req)) in got.iter().zip(reqs).enumerate() {
        let (want, tie) = reference_row(&data[r * v..(r + 1) * v], req);
        assert!(
            !matches!(classify(g, &want, &tie), Verdict::Mismatch),
            "{what}, row {r} ({:?}): {g:?} vs the reference's {want:?}",
            req.params
        );
    }
}

/// Per-call rows with DRY on the device API (`record`) and the host API, at V = 32,000
/// and 151,936 with histories of up to 4,096 tokens: each row is the reference's token
/// (and log-probabilities). Greedy rows show DRY decides: without it, some draw
/// another token.
#[test]
fn per_call_dry_matches_the_reference() {
    let Some(b) = sampler() else { return };
    let mut changed = 0;
    for v in [32_000usize, 151_936] {
        let mut rng = Rng::new(v as u64 + 3);
        let (mut data, mut reqs) = (Vec::new(), Vec::new());
        for r in 0..12 {
            let len = [0usize, 1, 3, 40, 300, 4096][r % 6];
            let hist = repeating_history(&mut rng, len, 9, v);
            let mut req = Request::new(dry_params(&mut rng, &hist), r as u64);
            req.state.step = rng.below(50);
            let split = rng.below(len as u64 + 1) as usize;
            req.state.prompt = hist[..split].to_vec();
            req.state.output = hist[split..].to_vec();
            data.extend(logits_for(&mut rng, &hist, v));
            reqs.push(req);
        }
        let logits = Logits::f32(&data, reqs.len(), v).unwrap();
        let host = b.sample(&logits, &reqs).unwrap();
        check_rows(&host, &data, &reqs, v, "host API");
        // the device API: the same rows recorded from a device buffer
        let dev = device_api(b, &logits, &reqs).unwrap();
        assert_eq!(dev, host, "device API vs host API at V = {v}");
        // without DRY, greedy rows with repeats draw another token
        for (r, req) in reqs.iter().enumerate() {
            let mut plain = req.clone();
            plain.params.dry_multiplier = 0.0;
            let x = &data[r * v..(r + 1) * v];
            let (without, _) = reference_row(x, &plain);
            if let (Ok(a), Ok(w)) = (&host[r], &without) {
                if a.token != w.token {
                    changed += 1;
                }
            }
        }
    }
    assert!(
        changed >= 4,
        "DRY changed only {changed} tokens: the test does not reach it"
    );
}

/// A per-call DRY window longer than the device holds: the device API refuses the row,
/// naming it and `dry_penalty_last_n`; the host API draws it (on the CPU) with the
/// other rows on the device.
#[test]
fn windows_past_the_device_are_refused_or_drawn_on_the_host() {
    let Some(b) = sampler() else { return };
    let v = 32_000usize;
    let mut rng = Rng::new(5);
    let hist = repeating_history(&mut rng, 5000, 7, v);
    let long = Request {
        params: SamplingParams {
            dry_multiplier: 1.0,
            temperature: 0.0,
            ..SamplingParams::default()
        },
        state: SequenceState {
            output: hist.clone(),
            ..SequenceState::new(1)
        },
        allowed: None,
    };
    let mut short = long.clone();
    short.params.dry_penalty_last_n = 4096;
    let reqs = vec![short, long];
    let data: Vec<f32> = (0..2)
        .flat_map(|_| logits_for(&mut rng, &hist, v))
        .collect();
    let logits = Logits::f32(&data, 2, v).unwrap();
    let got = b.sample(&logits, &reqs).unwrap();
    check_rows(&got, &data, &reqs, v, "host API");
    match device_api(b, &logits, &reqs) {
        Err(Error::InvalidParameter { row: 1, field, .. }) => {
            assert_eq!(field, "dry_penalty_last_n")
        }
        other => panic!("expected the device API to refuse row 1, got {other:?}"),
    }
}

/// The same token, rank and listed tokens; log-probabilities within 1e-5 relative (the
/// contract's tolerance between backends).
fn same_sample(a: &decoda::RowResult, b: &decoda::RowResult, what: &str) {
    let (Ok(x), Ok(y)) = (a, b) else {
        assert_eq!(a, b, "{what}");
        return;
    };
    assert_eq!(x.token, y.token, "{what}");
    let close = |p: f32, q: f32| (p - q).abs() <= 1e-5 * p.abs().max(1.0);
    match (&x.logprobs, &y.logprobs) {
        (Some(l), Some(m)) => {
            assert!(
                close(l.logprob, m.logprob) && l.rank == m.rank,
                "{what}: {l:?} vs {m:?}"
            );
            assert_eq!(l.top.len(), m.top.len(), "{what}");
            for (p, q) in l.top.iter().zip(&m.top) {
                assert!(
                    p.token == q.token && close(p.logprob, q.logprob),
                    "{what}: {l:?} vs {m:?}"
                );
            }
        }
        (l, m) => assert_eq!(l.is_some(), m.is_some(), "{what}"),
    }
}

/// Slots of the device head with DRY, stepped 60 times over logits that favour the
/// slots' recent tokens: every step's tokens (and log-probabilities) equal the CPU
/// head's, whose DRY reads the history it extends itself. The slots cover a prompt
/// longer than the ring (a 64-token window over it), the whole history (`-1` with
/// `max_tokens`), breakers, allowed length 0 and a parameter change mid-way.
#[test]
fn device_head_dry_matches_the_cpu_head() {
    let Some(s) = sampler() else { return };
    let (slots, v) = (5usize, 32_000usize);
    let mut dev = WgpuHead::new(s, slots, v).unwrap();
    let mut cpu = CpuHead::new(slots, v).unwrap();
    let mut rng = Rng::new(77);
    let mut reqs = Vec::new();
    for slot in 0..slots {
        let len = [20usize, 5000, 300, 0, 64][slot];
        let prompt = repeating_history(&mut rng, len, 6, 12);
        let mut p = SamplingParams {
            dry_multiplier: [1.0, 0.8, 3.0, 0.0, 0.5][slot],
            dry_base: [1.75, 1.75, 1.0, 2.0, 1.75][slot],
            dry_allowed_length: [2, 1, 0, 2, 3][slot],
            dry_penalty_last_n: [-1, 64, 500, -1, 16][slot],
            temperature: [0.0, 0.7, 1.0, 0.0, 0.9][slot],
            ..SamplingParams::default()
        };
        if slot == 2 {
            p.dry_sequence_breakers = vec![vec![3], vec![5, 1]];
            p.logprobs = Some(2);
        }
        if slot == 4 {
            p.top_k = 5;
        }
        let req = SlotRequest::new(p)
            .seed(slot as u64 + 11)
            .prompt(prompt)
            .max_tokens(100);
        dev.join(slot, req.clone()).unwrap();
        cpu.join(slot, req.clone()).unwrap();
        reqs.push(req);
    }
    let rows: Vec<usize> = (0..slots).collect();
    let mut same_as_without = 0usize;
    for step in 0..60 {
        if step == 30 {
            // DRY switched on for a slot that had it off (its ring kept up all along),
            // and changed for another
            let mut p = reqs[3].params.clone();
            p.dry_multiplier = 1.5;
            dev.set_params(3, p.clone()).unwrap();
            cpu.set_params(3, p).unwrap();
            let mut p = reqs[0].params.clone();
            p.dry_allowed_length = 1;
            p.dry_sequence_breakers = vec![vec![0]];
            dev.set_params(0, p.clone()).unwrap();
            cpu.set_params(0, p).unwrap();
        }
        // peaked over 12 ids: the slots repeat themselves, and DRY pushes back
        let mut data = vec![0.0f32; slots * v];
        for (i, x) in data.iter_mut().enumerate() {
            *x = rng.normal() + if i % v < 12 { 7.0 } else { 0.0 };
        }
        let logits = Logits::f32(&data, slots, v).unwrap();
        let a = dev.step(&logits, &rows).unwrap();
        let b = cpu.step(&logits, &rows).unwrap();
        for (x, y) in a.iter().zip(&b) {
            same_sample(
                &x.result,
                &y.result,
                &format!("step {step}, slot {}", x.slot),
            );
            assert_eq!(x.finished, y.finished, "step {step}, slot {}", x.slot);
        }
        if let Ok(t) = &a[0].result {
            // greedy slot 0 without DRY would take the row's argmax
            let row = &data[..12];
            let top = (0..12).max_by(|&i, &j| row[i].total_cmp(&row[j])).unwrap();
            if t.token as usize == top {
                same_as_without += 1;
            }
        }
    }
    assert!(
        same_as_without < 60,
        "slot 0 always drew the argmax: DRY never acted"
    );
}

/// The device head refuses a DRY window that can outgrow its ring (`-1` without
/// `max_tokens`, or a history that can pass 4,096 tokens), at join and at set_params,
/// naming the slot and `dry_penalty_last_n`; a bounded window joins.
#[test]
fn device_head_refuses_unbounded_windows() {
    let Some(s) = sampler() else { return };
    let mut head = WgpuHead::new(s, 2, 1000).unwrap();
    let dry = SamplingParams {
        dry_multiplier: 0.8,
        ..SamplingParams::default()
    };
    match head.join(1, SlotRequest::new(dry.clone()).seed(3)) {
        Err(Error::InvalidParameter { row: 1, field, .. }) => {
            assert_eq!(field, "dry_penalty_last_n")
        }
        other => panic!("expected a refusal naming slot 1, got {other:?}"),
    }
    match head.join(
        1,
        SlotRequest::new(dry.clone())
            .seed(3)
            .prompt(vec![1; 4000])
            .max_tokens(97),
    ) {
        Err(Error::InvalidParameter { row: 1, field, .. }) => {
            assert_eq!(field, "dry_penalty_last_n")
        }
        other => panic!("expected a refusal naming slot 1, got {other:?}"),
    }
    head.join(1, SlotRequest::new(dry.clone()).seed(3).max_tokens(4096))
        .unwrap();
    head.join(0, SlotRequest::new(SamplingParams::default()).seed(3))
        .unwrap();
    match head.set_params(0, dry.clone()) {
        Err(Error::InvalidParameter { row: 0, field, .. }) => {
            assert_eq!(field, "dry_penalty_last_n")
        }
        other => panic!("expected a refusal, got {other:?}"),
    }
    let bounded = SamplingParams {
        dry_penalty_last_n: 4096,
        ..dry
    };
    head.set_params(0, bounded).unwrap();
    let x = vec![0.5f32; 2000];
    let steps = head
        .step(&Logits::f32(&x, 2, 1000).unwrap(), &[0, 1])
        .unwrap();
    assert!(steps.iter().all(|s| s.result.is_ok()), "{steps:?}");
}

/// A long-lived sampler: DRY calls at small vocabularies, then rows with penalties at a
/// large one, whose penalty areas lie over the words the DRY calls wrote. Each row is
/// the reference's (the DRY pass's words are zeroed when its call finishes).
#[test]
fn dry_leaves_no_state_for_later_calls() {
    let Some(b) = sampler() else { return };
    let mut rng = Rng::new(23);
    let v = 131_072usize;
    let later = |rng: &mut Rng| {
        let (mut data, mut reqs) = (Vec::new(), Vec::new());
        for r in 0..6 {
            // flat rows: a stray penalty on any token moves the drawn token's rank
            let mut req = Request::new(
                SamplingParams {
                    repetition_penalty: 1.3,
                    frequency_penalty: 0.4,
                    top_k: 5 * (r as u32 % 2),
                    logprobs: Some(3),
                    logprobs_mode: decoda::LogprobsMode::Processed,
                    ..SamplingParams::default()
                },
                r as u64,
            );
            req.state.prompt = (0..64)
                .map(|_| v as u32 - 1 - rng.below(64) as u32)
                .collect();
            req.state.output = (0..64)
                .map(|_| v as u32 - 1 - rng.below(64) as u32)
                .collect();
            data.extend(std::iter::repeat_n(1.0f32, v));
            reqs.push(req);
        }
        (data, reqs)
    };
    // first such a call, so the buffers are already large enough for the last one
    let (data, reqs) = later(&mut rng);
    let got = b.sample(&Logits::f32(&data, 6, v).unwrap(), &reqs).unwrap();
    check_rows(&got, &data, &reqs, v, "before the DRY calls");
    for v in [1000usize, 5000, 20_000] {
        let (mut data, mut reqs) = (Vec::new(), Vec::new());
        for r in 0..6 {
            let hist = repeating_history(&mut rng, 300 + 500 * r, 9, v);
            let mut req = Request::new(dry_params(&mut rng, &hist), r as u64);
            req.params.dry_penalty_last_n = -1;
            req.state.output = hist.clone();
            data.extend(logits_for(&mut rng, &hist, v));
            reqs.push(req);
        }
        let got = b.sample(&Logits::f32(&data, 6, v).unwrap(), &reqs).unwrap();
        check_rows(&got, &data, &reqs, v, "DRY call");
    }
    let (data, reqs) = later(&mut rng);
    let got = b.sample(&Logits::f32(&data, 6, v).unwrap(), &reqs).unwrap();
    check_rows(&got, &data, &reqs, v, "after the DRY calls");
}
