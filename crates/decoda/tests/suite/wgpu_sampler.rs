//! The device backend (wgpu) against the contract: the conformance suite (one workgroup
//! per row, and several per row), a parity run of thousands of mixed rows (over 10,000 in the full tier) against
//! the CPU sampler, and the device API.
//!
//! Without an adapter these tests print why and pass, unless `DECODA_REQUIRE_GPU=1` (as
//! in CI, which installs Mesa's lavapipe), where "no adapter" fails them.

use std::sync::OnceLock;

use decoda::reference::reference_row;
use decoda::testing::gpu::PerDevice;
use decoda::testing::{random_case, Rng};
use decoda::wgpu::{DeviceLogits, WgpuOptions, WgpuSampler};
use decoda::{Backend, CpuSampler, DType, Error, Logits, Request, RowResult, SamplingParams};

/// A sampler on a device of its own with these reductions (`subgroups`) and Philox
/// products (`int64`: `None` for the adapter's choice), rows cut at 4,096 logits.
fn open(subgroups: Option<bool>, int64: Option<bool>) -> Option<WgpuSampler> {
    let options = WgpuOptions {
        subgroups,
        int64,
        ..Default::default()
    };
    let s = decoda::testing::gpu::or_skip(WgpuSampler::with_options(options))?;
    eprintln!(
        "wgpu tests on {} (subgroups: {})",
        s.adapter(),
        s.uses_subgroups()
    );
    if subgroups == Some(false) {
        assert!(!s.uses_subgroups(), "subgroups were turned off");
    }
    if subgroups == Some(true) && s.adapter().contains("llvmpipe") {
        assert!(s.uses_subgroups(), "lavapipe has subgroup operations");
    }
    s.set_min_chunk(4096);
    Some(s)
}

/// The sampler with its defaults, but workgroup-memory reductions: on the shared test
/// device (`decoda::testing::gpu`) when that one does not use subgroups (lavapipe),
/// else on a device of its own.
fn sampler() -> Option<&'static WgpuSampler> {
    static S: PerDevice<Option<WgpuSampler>> = PerDevice::new();
    S.get_or_init(|| match decoda::testing::gpu::device() {
        Some(d) if !d.uses_subgroups() => WgpuSampler::on(d).ok(),
        _ => open(Some(false), None),
    })
    .as_ref()
}

/// The default sampler's reductions, with Philox's products from 16-bit ones even where
/// the adapter has 64-bit integers (which the others use: lavapipe has them).
fn int32_sampler() -> Option<&'static WgpuSampler> {
    static S: OnceLock<Option<WgpuSampler>> = OnceLock::new();
    S.get_or_init(|| open(Some(false), Some(false))).as_ref()
}

/// The same with subgroup reductions wherever the adapter has them (lavapipe does).
fn subgroup_sampler() -> Option<&'static WgpuSampler> {
    static S: OnceLock<Option<WgpuSampler>> = OnceLock::new();
    S.get_or_init(|| open(Some(true), None)).as_ref()
}

/// Both variants at once: subgroup reductions (where the adapter has them) and Philox's
/// products from 16-bit ones, as on an adapter with subgroups and no `SHADER_INT64`.
/// The two are separate code (the reductions never call Philox), so in the quick tier
/// this one sampler runs each against the default's bits and the step kernels compile
/// for one variant module, not two; the full tier runs each alone as well.
fn subgroup_int32_sampler() -> Option<&'static WgpuSampler> {
    static S: OnceLock<Option<WgpuSampler>> = OnceLock::new();
    S.get_or_init(|| open(Some(true), Some(false))).as_ref()
}

/// A sampler on the shared test device (default options) that cuts every row into
/// 64-logit pieces, one workgroup each: the multi-workgroup reductions on small
/// vocabularies.
fn split_sampler() -> Option<&'static WgpuSampler> {
    static S: PerDevice<Option<WgpuSampler>> = PerDevice::new();
    S.get_or_init(|| {
        let s = decoda::testing::gpu::sampler()?;
        s.set_min_chunk(64);
        Some(s)
    })
    .as_ref()
}

/// A variant for the whole conformance suite in the full tier (`DECODA_TESTS=full`). In
/// the quick tier the variants run `variants_give_the_same_bits` instead: every token,
/// log-probability and kept distribution of mixed rows equal to the default sampler's,
/// which the default's suite checks against the reference.
fn full_tier_only(variant: &str, s: Option<&'static WgpuSampler>) -> Option<&'static WgpuSampler> {
    if decoda::testing::full_tier() {
        return s;
    }
    eprintln!(
        "{variant}: its suite runs in the full tier; variants_give_the_same_bits checks it here"
    );
    None
}

mod conformance {
    decoda::conformance_suite!(super::sampler());
}

mod conformance_split {
    decoda::conformance_suite!(super::split_sampler());
}

mod conformance_subgroups {
    decoda::conformance_suite!(super::full_tier_only(
        "subgroups",
        super::subgroup_sampler()
    ));
}

mod conformance_int32 {
    decoda::conformance_suite!(super::full_tier_only("int32", super::int32_sampler()));
}

/// Every variant of the device sampler draws the default sampler's bits: Philox with
/// 16-bit products (where the adapter has `SHADER_INT64`, the others use 64-bit ones)
/// together with subgroup reductions, and rows cut into 64-logit workgroups; in the full
/// tier also each of the first two alone. Every token, log-probability and kept
/// distribution of mixed rows (every stage), per call and through many draws per row, at
/// V = 1 to 151,936.
#[test]
fn variants_give_the_same_bits() {
    let Some(a) = sampler() else {
        return;
    };
    let (Some(both), Some(split)) = (subgroup_int32_sampler(), split_sampler()) else {
        return;
    };
    let mut variants = vec![("subgroups and int32", both), ("split", split)];
    if decoda::testing::full_tier() {
        let (Some(b), Some(c)) = (int32_sampler(), subgroup_sampler()) else {
            return;
        };
        assert!(!b.uses_int64());
        variants.extend([("int32", b), ("subgroups", c)]);
    }
    assert!(!both.uses_int64());
    if a.adapter().contains("llvmpipe") {
        assert!(a.uses_int64(), "lavapipe has 64-bit integers");
        assert!(
            !a.uses_subgroups(),
            "the default sampler's reductions are in workgroup memory"
        );
        assert!(both.uses_subgroups(), "lavapipe has subgroup operations");
    }
    if !a.uses_int64() {
        eprintln!(
            "{}: no SHADER_INT64, both run the 16-bit products",
            a.adapter()
        );
    }
    let mut rng = Rng::new(0x64b1);
    for v in [1usize, 1000, 32_768, 151_936] {
        let cases: Vec<(Vec<f32>, Request)> = (0..24).map(|_| random_case(&mut rng, v)).collect();
        let flat: Vec<f32> = cases.iter().flat_map(|c| c.0.iter().copied()).collect();
        let reqs: Vec<Request> = cases.iter().map(|c| c.1.clone()).collect();
        let l = Logits::f32(&flat, reqs.len(), v).unwrap();
        let one = Logits::f32(&cases[0].0, 1, v).unwrap();
        let want = a.sample(&l, &reqs).unwrap();
        let want_draws = a.sample_draws(&one, &reqs[..1], 64).unwrap();
        for &(name, s) in &variants {
            assert_eq!(s.sample(&l, &reqs).unwrap(), want, "{name}, V = {v}");
            assert_eq!(
                s.sample_draws(&one, &reqs[..1], 64).unwrap(),
                want_draws,
                "{name}, V = {v}, 64 draws"
            );
        }
    }
}

/// A device builds a step kernel's pipeline only when a call first needs it: none at
/// construction, 2 for a greedy call (scan, settle_finish; 3 where the device does not
/// fuse settle_finish: scan, settle, draw_finish), 9 in all after a call with
/// log-probabilities (11 unfused: settle is settle_first and settle_rest there), and a
/// second sampler on the same device builds none again.
#[test]
fn pipelines_are_built_when_first_needed() {
    let Some(d) = decoda::testing::gpu::own_device(Default::default()) else {
        return;
    };
    let s = WgpuSampler::on(&d).unwrap();
    assert_eq!(s.pipelines_built(), 0);
    let x = [0.5f32, 2.0, 1.0, -1.0];
    let l = Logits::f32(&x, 1, 4).unwrap();
    let greedy = [Request::new(SamplingParams::greedy(), 1)];
    assert_eq!(s.sample(&l, &greedy).unwrap()[0].as_ref().unwrap().token, 1);
    assert_eq!(s.pipelines_built(), if d.fuses_settle() { 2 } else { 3 });
    let lp = [Request::new(
        SamplingParams {
            logprobs: Some(2),
            ..SamplingParams::default()
        },
        1,
    )];
    s.sample(&l, &lp).unwrap()[0].as_ref().unwrap();
    // (the greedy call ran the light plan's scan_light and settle_finish_light, or
    // settle_light and draw_finish_light where they are not fused; this one the full
    // plan's own: settle_first and settle_rest where settle_finish is not fused)
    let both = if d.fuses_settle() { 9 } else { 11 };
    assert_eq!(
        s.pipelines_built(),
        both,
        "probe, sample, pick, scan, settle, lp and finish too"
    );
    let again = WgpuSampler::on(&d).unwrap();
    assert_eq!(
        again.pipelines_built(),
        both,
        "the device's pipelines are shared"
    );
}

/// A handle with its own weight part size shares the device and leaves the part size
/// of the handle it came from (and of that one's samplers) as it was.
#[test]
fn weight_part_handles_are_their_own() {
    let Some(d) = decoda::testing::gpu::device() else {
        return;
    };
    let whole = d.weight_part_bytes();
    let parts = d.with_weight_part_bytes(8192);
    assert_eq!(parts.weight_part_bytes(), 8192);
    assert_eq!(d.weight_part_bytes(), whole);
    let s = WgpuSampler::on(&parts).unwrap();
    assert_eq!(s.weight_part_bytes(), 8192);
    assert_eq!(
        d.with_weight_part_bytes(1).weight_part_bytes(),
        4096,
        "at least 4 KiB"
    );
}

#[derive(Default, Debug)]
struct Count {
    rows: usize,
    same: usize,
    ties: usize,
    mismatches: Vec<String>,
}

fn widen(x: &[f32], dtype: DType) -> Vec<f32> {
    match dtype {
        DType::F32 => x.to_vec(),
        DType::F16 => x.iter().map(|&v| half::f16::from_f32(v).to_f32()).collect(),
        DType::Bf16 => x
            .iter()
            .map(|&v| half::bf16::from_f32(v).to_f32())
            .collect(),
    }
}

fn compare(
    count: &mut Count,
    rows: &[Vec<f32>],
    reqs: &[Request],
    gpu: &[RowResult],
    cpu: &[RowResult],
) {
    for (i, (g, c)) in gpu.iter().zip(cpu).enumerate() {
        count.rows += 1;
        let v = rows[i].len() as u32;
        if let Ok(s) = g {
            assert!(s.token < v, "token {} out of range {v}", s.token);
        }
        match (g, c) {
            (Ok(a), Ok(b)) if a.token == b.token => {
                count.same += 1;
                if let (Some(la), Some(lb)) = (&a.logprobs, &b.logprobs) {
                    let close = |x: f32, y: f32| (x - y).abs() <= 1e-5 * x.abs().max(1.0);
                    let ok = la.rank == lb.rank
                        && close(la.logprob, lb.logprob)
                        && la.top.len() == lb.top.len()
                        && la.top.iter().zip(&lb.top).all(|(p, q)| {
                            close(p.logprob, q.logprob)
                                && (p.token == q.token || p.logprob == q.logprob)
                        });
                    if !ok && count.mismatches.len() < 8 {
                        count.mismatches.push(format!(
                            "V={v} row {i}: logprobs {la:?} vs cpu {lb:?} ({:?})",
                            reqs[i].params
                        ));
                    }
                }
            }
            (Err(a), Err(b)) if a == b => count.same += 1,
            _ => {
                let (_, tie) = reference_row(&rows[i], &reqs[i]);
                if matches!((g, c), (Ok(_), Ok(_))) && tie.is_tie() {
                    count.ties += 1;
                } else {
                    count.mismatches.push(format!(
                        "V={v} row {i}: gpu {g:?} vs cpu {c:?} (tie {tie:?}, params {:?}, state step {} prompt {:?} output {:?})",
                        reqs[i].params, reqs[i].state.step, reqs[i].state.prompt, reqs[i].state.output
                    ));
                }
            }
        }
    }
}

fn run_batch(b: &WgpuSampler, count: &mut Count, rng: &mut Rng, v: usize, n: usize, dtype: DType) {
    let cases: Vec<(Vec<f32>, Request)> = (0..n).map(|_| random_case(rng, v)).collect();
    run_cases(b, count, cases, dtype);
}

fn run_cases(b: &WgpuSampler, count: &mut Count, cases: Vec<(Vec<f32>, Request)>, dtype: DType) {
    let n = cases.len();
    let v = cases[0].0.len();
    let rows: Vec<Vec<f32>> = cases.iter().map(|c| widen(&c.0, dtype)).collect();
    let reqs: Vec<Request> = cases.into_iter().map(|c| c.1).collect();
    let flat: Vec<f32> = rows.iter().flatten().copied().collect();
    let cpu = CpuSampler::new();
    let (g, c) = match dtype {
        DType::F32 => {
            let l = Logits::f32(&flat, n, v).unwrap();
            (b.sample(&l, &reqs), cpu.sample(&l, &reqs))
        }
        DType::F16 => {
            let h: Vec<half::f16> = flat.iter().map(|&x| half::f16::from_f32(x)).collect();
            let l = Logits::f16(&h, n, v).unwrap();
            (b.sample(&l, &reqs), cpu.sample(&l, &reqs))
        }
        DType::Bf16 => {
            let h: Vec<half::bf16> = flat.iter().map(|&x| half::bf16::from_f32(x)).collect();
            let l = Logits::bf16(&h, n, v).unwrap();
            (b.sample(&l, &reqs), cpu.sample(&l, &reqs))
        }
    };
    compare(count, &rows, &reqs, &g.unwrap(), &c.unwrap());
}

/// The stress run (`decoda::testing::stress`, `selftest --stress`): calls of random
/// shapes (V = 17 to 262,144, B = 1 to 64), element types, entry points and every
/// stage's parameters against the reference, on a long-lived sampler and fresh ones:
/// no mismatch, no failed call, no out-of-range id. 32 calls in the quick tier; in
/// the full tier `DECODA_STRESS_CALLS` (default 100,000: about three hours on lavapipe).
#[test]
fn stress_run_matches_the_reference() {
    if decoda::testing::gpu::sampler().is_none() {
        return;
    }
    let calls = if decoda::testing::full_tier() {
        std::env::var("DECODA_STRESS_CALLS").map_or(100_000, |v| {
            v.parse()
                .unwrap_or_else(|_| panic!("DECODA_STRESS_CALLS={v}: not a count"))
        })
    } else {
        32
    };
    let make = || -> Result<Box<dyn Backend>, String> {
        Ok(Box::new(
            decoda::testing::gpu::sampler().ok_or("no adapter")?,
        ))
    };
    let t = decoda::testing::stress::stress(
        &make,
        calls,
        5,
        None,
        |n, t| eprintln!("{n} calls: {t:?}"),
        |d| eprintln!("MISMATCH {d}"),
    )
    .unwrap_or_else(|e| panic!("{e}"));
    assert!(t.clean(), "{t:?}");
    assert_eq!(t.calls, calls);
}

/// Thousands of rows (over 10,000 in the full tier; with `parity_with_cpu_large_rows`)
/// of every kind (V from 1 to 262,144; f32, f16, bf16; every filter, penalty, bias,
/// sentinel and logprobs mode) draw the same token as the CPU, except where the
/// reference shows a floating-point tie. This test: the small vocabularies, many rows,
/// also through the multi-workgroup split and with subgroup operations (with Philox's
/// 16-bit products).
#[test]
fn parity_with_cpu_many_rows() {
    let Some(b) = sampler() else { return };
    let mut rng = Rng::new(0xdec0da);
    let mut count = Count::default();
    let dtypes = [DType::F32, DType::F16, DType::Bf16];
    // (a quarter as many in the quick tier)
    let full = decoda::testing::full_tier();
    let per_batch = if full { 256 } else { 64 };
    for &v in &[1usize, 2, 3, 5, 8, 17, 64, 100, 257, 1000, 2048, 4099] {
        for dtype in dtypes {
            run_batch(b, &mut count, &mut rng, v, per_batch, dtype);
        }
    }
    // the same through the multi-workgroup split (V = 20,000: more pieces than a
    // workgroup has invocations), and with subgroup operations and Philox's 16-bit
    // products
    if let Some(s) = split_sampler() {
        for &(v, n) in &[(300usize, 100usize), (5000, 100), (20000, 25)] {
            run_batch(
                s,
                &mut count,
                &mut rng,
                v,
                if full { 100 } else { n },
                DType::F32,
            );
        }
    }
    // (the full tier: with 64-bit Philox products too; the quick tier: 16 rows a
    // vocabulary, since `variants_give_the_same_bits` checks this variant against the
    // default sampler's bits at every stage: 64 rows took about 11 million of the
    // test's 13.5 million logits, each through the reference too)
    let mut variants = vec![subgroup_int32_sampler()];
    if full {
        variants.push(subgroup_sampler());
    }
    for s in variants.into_iter().flatten() {
        for &v in &[700usize, 40000, 131072] {
            run_batch(
                s,
                &mut count,
                &mut rng,
                v,
                if full { 64 } else { 16 },
                DType::Bf16,
            );
        }
    }
    parity_holds(&count, if full { 9_000 } else { 2_500 });
}

/// `parity_with_cpu_many_rows` at the large vocabularies (8,192 to 262,144), fewer rows,
/// and rows with long histories: thousands of penalised tokens each (the touch lists'
/// search). A test of its own so the harness runs the two side by side.
#[test]
fn parity_with_cpu_large_rows() {
    let Some(b) = sampler() else { return };
    let mut rng = Rng::new(0xdec0da + 1);
    let mut count = Count::default();
    let full = decoda::testing::full_tier();
    for &(v, n) in &[
        (8192usize, 160usize),
        (32000, 64),
        (65536, 24),
        (131072, 12),
        (151936, 6),
        (262144, 6),
    ] {
        for dtype in [DType::F32, DType::F16, DType::Bf16] {
            let n = if full { n } else { n.div_ceil(2) };
            run_batch(b, &mut count, &mut rng, v, n, dtype);
        }
    }
    let mut cases: Vec<(Vec<f32>, Request)> =
        (0..40).map(|_| random_case(&mut rng, 50_000)).collect();
    for (k, c) in cases.iter_mut().enumerate() {
        let p = &mut c.1.params;
        p.repetition_penalty = 1.2;
        p.frequency_penalty = 0.3;
        p.presence_penalty = 0.2;
        for _ in 0..(500 + 100 * k) {
            c.1.state.prompt.push(rng.below(50_000) as u32);
            c.1.state.output.push(rng.below(50_000) as u32);
        }
    }
    run_cases(b, &mut count, cases, DType::F32);
    parity_holds(&count, if full { 850 } else { 440 });
}

/// At least `least` rows, none differing from the CPU outside the tie allowance.
fn parity_holds(count: &Count, least: usize) {
    eprintln!("{count:?}");
    assert!(count.rows >= least, "only {} rows", count.rows);
    assert!(
        count.mismatches.is_empty(),
        "{} of {} rows differ outside the tie allowance: {:#?}",
        count.mismatches.len(),
        count.rows,
        count.mismatches
    );
}

/// Logits inside a larger device buffer (offset, row stride > V, bf16), recorded into
/// the caller's encoder, give the host path's tokens.
#[test]
fn device_api_with_stride_and_offset() {
    let Some(b) = sampler() else { return };
    let (rows, v, stride, offset) = (5usize, 1000usize, 1030usize, 6usize);
    let mut rng = Rng::new(5);
    let mut host = Vec::new();
    let mut padded = vec![half::bf16::from_f32(f32::NAN); offset + rows * stride];
    let mut reqs = Vec::new();
    for r in 0..rows {
        let (x, req) = random_case(&mut rng, v);
        for (i, &xi) in x.iter().enumerate() {
            padded[offset + r * stride + i] = half::bf16::from_f32(xi);
        }
        host.extend(x.iter().map(|&xi| half::bf16::from_f32(xi)));
        reqs.push(req);
    }
    let want = b
        .sample(&Logits::bf16(&host, rows, v).unwrap(), &reqs)
        .unwrap();
    let buf = b.upload_logits(&Logits::bf16(&padded, 1, padded.len()).unwrap());
    let out = b.outputs(rows).unwrap();
    let view = DeviceLogits {
        buffer: &buf,
        dtype: DType::Bf16,
        rows,
        vocab: v,
        row_stride: stride,
        offset,
    };
    for _ in 0..2 {
        let mut enc = b
            .device()
            .create_command_encoder(&wgpu::CommandEncoderDescriptor { label: None });
        b.record(&mut enc, &view, &reqs, &out).unwrap();
        b.queue().submit([enc.finish()]);
        assert_eq!(b.read(&out, &reqs).unwrap(), want);
    }
    // a view past the end of the buffer is refused before anything is recorded
    let mut enc = b
        .device()
        .create_command_encoder(&wgpu::CommandEncoderDescriptor { label: None });
    let bad = DeviceLogits {
        rows: rows + 1,
        ..view
    };
    let mut more = reqs.clone();
    more.push(Request::new(SamplingParams::default(), 1));
    match b.record(&mut enc, &bad, &more, &b.outputs(rows + 1).unwrap()) {
        Err(Error::Shape(m)) => assert!(m.contains("bytes"), "{m}"),
        other => panic!("expected a shape error, got {other:?}"),
    }
}

/// After the first calls of a given size, recording allocates nothing on the device.
#[test]
fn device_api_steady_state_creates_nothing() {
    // a sampler of its own: the shared ones are used by other tests concurrently
    let Some(b) = open(None, None) else { return };
    let mut rng = Rng::new(9);
    let v = 3000;
    let rows = 4;
    let mut data = Vec::new();
    let mut reqs = Vec::new();
    for _ in 0..rows {
        let (x, req) = random_case(&mut rng, v);
        data.extend(x);
        reqs.push(req);
    }
    let buf = b.upload_logits(&Logits::f32(&data, rows, v).unwrap());
    let out = b.outputs(rows).unwrap();
    let view = DeviceLogits {
        buffer: &buf,
        dtype: DType::F32,
        rows,
        vocab: v,
        row_stride: v,
        offset: 0,
    };
    let want = CpuSampler::new()
        .sample(&Logits::f32(&data, rows, v).unwrap(), &reqs)
        .unwrap();
    let mut after_warmup = 0;
    for call in 0..12 {
        let mut enc = b
            .device()
            .create_command_encoder(&wgpu::CommandEncoderDescriptor { label: None });
        b.record(&mut enc, &view, &reqs, &out).unwrap();
        b.queue().submit([enc.finish()]);
        assert_eq!(b.read(&out, &reqs).unwrap(), want, "call {call}");
        // every staging area has been used once after 8 calls
        if call == 8 {
            after_warmup = b.device_objects_created();
        }
    }
    assert!(after_warmup > 0);
    assert_eq!(
        b.device_objects_created(),
        after_warmup,
        "created objects after warm-up"
    );
}

/// Many calls recorded before their submit keep their own parameters: 2, 8, 9 and 20
/// calls with different rows and requests, into one encoder or one encoder each
/// (submitted in reverse order), all give the host path's results. The staging buffers
/// come back once the work is done, so a steady loop stops creating them.
#[test]
fn recorded_calls_keep_their_parameters() {
    let Some(b) = open(None, None) else { return };
    let mut rng = Rng::new(31);
    let v = 2000;
    for (n, one_encoder) in [
        (2usize, true),
        (8, true),
        (9, true),
        (9, false),
        (20, false),
    ] {
        let calls: Vec<(Vec<f32>, Vec<Request>)> = (0..n)
            .map(|_| {
                let rows = 1 + rng.below(4) as usize;
                let mut data = Vec::new();
                let mut reqs = Vec::new();
                for _ in 0..rows {
                    let (x, r) = random_case(&mut rng, v);
                    data.extend(x);
                    reqs.push(r);
                }
                (data, reqs)
            })
            .collect();
        let want: Vec<Vec<RowResult>> = calls
            .iter()
            .map(|(d, r)| b.sample(&Logits::f32(d, r.len(), v).unwrap(), r).unwrap())
            .collect();
        let bufs: Vec<wgpu::Buffer> = calls
            .iter()
            .map(|(d, r)| b.upload_logits(&Logits::f32(d, r.len(), v).unwrap()))
            .collect();
        let outs: Vec<_> = calls
            .iter()
            .map(|(_, r)| b.outputs(r.len()).unwrap())
            .collect();
        let mut encoders = Vec::new();
        let mut enc = b.device().create_command_encoder(&Default::default());
        for (i, (_, reqs)) in calls.iter().enumerate() {
            let view = DeviceLogits {
                buffer: &bufs[i],
                dtype: DType::F32,
                rows: reqs.len(),
                vocab: v,
                row_stride: v,
                offset: 0,
            };
            b.record(&mut enc, &view, reqs, &outs[i]).unwrap();
            if !one_encoder {
                encoders.push(std::mem::replace(
                    &mut enc,
                    b.device().create_command_encoder(&Default::default()),
                ));
            }
        }
        if one_encoder {
            b.queue().submit([enc.finish()]);
        } else {
            for e in encoders.into_iter().rev() {
                b.queue().submit([e.finish()]);
            }
        }
        for (i, (_, reqs)) in calls.iter().enumerate() {
            assert_eq!(
                b.read(&outs[i], reqs).unwrap(),
                want[i],
                "{n} calls ({}), call {i}",
                if one_encoder {
                    "one encoder"
                } else {
                    "an encoder each, submitted last first"
                }
            );
        }
    }
    // once the work is done every staging buffer is free again
    b.device()
        .poll(wgpu::PollType::wait_indefinitely())
        .unwrap();
    assert!(
        b.free_staging_buffers() >= 20,
        "{} free",
        b.free_staging_buffers()
    );
}

/// The passes a call records follow its parameters: greedy and temperature rows take
/// two dispatches, filtered rows (top-k, top-p, min-p, top-n-σ, typical-p, XTC, the kept
/// distribution; or per-call penalties, whose history the probe scatters) five, and
/// two more for each phase of the full-row path their stages have (lp, finish and the
/// phases run only for a row on that path: over grids settle counts),
/// log-probabilities five; each reads the row once on its common path. (One more for
/// the first two where the device does not fuse `settle_finish`: lavapipe, so this
/// test checks the fused plan on a device of its own, which it never runs.)
#[test]
fn calls_record_the_passes_their_rows_need() {
    let Some(d) = decoda::testing::gpu::own_device(WgpuOptions {
        fused_settle: Some(true),
        ..Default::default()
    }) else {
        return;
    };
    let fused = WgpuSampler::on(&d).unwrap();
    let b = &fused;
    let v = 32_768;
    let with = |f: &dyn Fn(&mut SamplingParams)| {
        let mut p = SamplingParams::default();
        f(&mut p);
        b.call_structure(v, &[Request::new(p, 1)]).unwrap()
    };
    let greedy = with(&|p| p.temperature = 0.0);
    assert_eq!(greedy.stages, ["scan", "settle_finish"]);
    assert_eq!(greedy.row_reads, 1.0);
    // the workgroups of each dispatch: the scan's pieces of the row (none under 4,096
    // logits, so 1 to 8 at V = 32,768, as many as the adapter's target allows), one
    // workgroup a row after it
    assert_eq!(greedy.workgroups.len(), 2);
    assert!((1..=8).contains(&greedy.workgroups[0]), "{greedy:?}");
    assert_eq!(greedy.workgroups[1], 1);
    assert_eq!(with(&|_| {}).dispatches, 2);
    // a greedy row's filters do nothing, so they cost no probe
    assert_eq!(
        with(&|p| {
            p.temperature = 0.0;
            p.top_k = 50;
        })
        .dispatches,
        2
    );
    // (each with the full-row path's phases for its stage: walk over the row's pieces,
    // then decide, for a row its candidates cannot settle)
    for (f, phases) in [
        (
            (|p: &mut SamplingParams| p.top_k = 50) as fn(&mut SamplingParams),
            3,
        ),
        (|p| p.top_p = 0.9, 3),
        (|p| p.min_p = 0.1, 0),
        (
            |p| {
                p.logit_bias.insert(3, 1.0);
            },
            0,
        ),
        // the later stages: the probe builds their list too (XTC's when its coin fires)
        (|p| p.top_n_sigma = 1.0, 1),
        (|p| p.typical_p = 0.9, 4),
        (|p| p.xtc_probability = 0.5, 2),
        (|p| p.kept = Some(8), 5),
        (
            |p| {
                p.top_k = 50;
                p.typical_p = 0.9;
                p.top_p = 0.9;
                p.xtc_probability = 0.5;
            },
            12,
        ),
    ] {
        let s = with(&f);
        let mut want = PROBE.to_vec();
        want.extend(["scan", "settle_finish"]);
        for _ in 0..phases {
            want.extend(["walk", "decide"]);
        }
        want.extend(["lp", "finish"]);
        assert_eq!(s.stages, want);
        assert_eq!(s.row_reads, 1.125);
        // the probe's sample passes over the row's sample pieces, its picks a workgroup
        // a row; the phases and lp work on a full-row-path row over the scan's pieces
        let w = &s.workgroups;
        assert_eq!((w[0], w[2], w[3], w[4]), (1, 1, w[1], 1), "{s:?}");
        assert_eq!(w[6], 1, "{s:?}");
        for (k, n) in w[7..].iter().enumerate() {
            assert_eq!(*n, if k % 2 == 0 { w[5] } else { 1 }, "{s:?}");
        }
    }
    // a call records the most phases one of its rows runs
    let two = b
        .call_structure(
            v,
            &[
                Request::new(
                    SamplingParams {
                        top_k: 50,
                        ..Default::default()
                    },
                    1,
                ),
                Request::new(
                    SamplingParams {
                        xtc_probability: 0.5,
                        ..Default::default()
                    },
                    2,
                ),
            ],
        )
        .unwrap();
    assert_eq!(two.dispatches, 9 + 2 * 3);
    // a penalty over a history: the probe scatters it; over none, nothing to do
    let mut q = Request::new(
        SamplingParams {
            presence_penalty: 0.5,
            ..Default::default()
        },
        1,
    );
    assert_eq!(b.call_structure(v, &[q.clone()]).unwrap().dispatches, 2);
    q.state.output = vec![7, 9];
    assert_eq!(b.call_structure(v, &[q]).unwrap().dispatches, 9);
    let lp = with(&|p| {
        p.min_p = 0.05;
        p.logprobs = Some(2);
    });
    let mut want = PROBE.to_vec();
    want.extend(["scan", "settle", "lp", "finish"]);
    assert_eq!(lp.stages, want);
    assert_eq!(lp.row_reads, 2.125);
    // lp walks the row in the scan's pieces
    let w = &lp.workgroups;
    assert_eq!((w[6], w[7], w[8]), (1, w[5], 1), "{lp:?}");
    // with top-k, its phases come after settle
    let lpk = with(&|p| {
        p.top_k = 50;
        p.logprobs = Some(2);
    });
    let mut want = PROBE.to_vec();
    want.extend([
        "scan", "settle", "walk", "decide", "walk", "decide", "walk", "decide",
    ]);
    want.extend(["lp", "finish"]);
    assert_eq!(lpk.stages, want);
    // one row with log-probabilities takes the whole call through the nine dispatches
    let mixed = b
        .call_structure(
            v,
            &[
                Request::new(SamplingParams::greedy(), 1),
                Request::new(
                    SamplingParams {
                        logprobs: Some(0),
                        ..Default::default()
                    },
                    2,
                ),
            ],
        )
        .unwrap();
    assert_eq!(mixed.dispatches, 9);
    // a row the candidate list holds whole (V <= 4,096) has its threshold from the
    // probe's first pick: no second sample and pick
    let topk = |v| {
        let p = SamplingParams {
            top_k: 50,
            ..Default::default()
        };
        b.call_structure(v, &[Request::new(p, 1)]).unwrap().stages
    };
    assert_eq!(topk(4096)[..4], ["probe", "sample", "pick", "scan"]);
    assert_eq!(topk(4097)[..6], [&PROBE[..], &["scan"]].concat());
    // unfused (a software adapter's default), settle_finish is settle then draw_finish,
    // and settle itself two dispatches, settle_first and settle_rest (a light call's
    // settle is one: settle_light)
    let Some(d) = decoda::testing::gpu::own_device(WgpuOptions {
        fused_settle: Some(false),
        ..Default::default()
    }) else {
        return;
    };
    let split = WgpuSampler::on(&d).unwrap();
    let plain = [Request::new(SamplingParams::default(), 1)];
    let topk = [Request::new(
        SamplingParams {
            top_k: 50,
            ..Default::default()
        },
        1,
    )];
    let s = split.call_structure(v, &plain).unwrap();
    assert_eq!(s.stages, ["scan", "settle", "draw_finish"]);
    assert_eq!(s.row_reads, 1.0);
    let s = split.call_structure(v, &topk).unwrap();
    let mut want = PROBE.to_vec();
    want.extend(["scan", "settle_first", "settle_rest", "draw_finish"]);
    for _ in 0..3 {
        want.extend(["walk", "decide"]);
    }
    want.extend(["lp", "finish"]);
    assert_eq!(s.stages, want);
    assert_eq!(split.call_structure(v, &lp_req()).unwrap().dispatches, 10);
}

/// The probe's sample passes in pieces (a hardware adapter's default; forced here on
/// any adapter) and in one piece a row (a software adapter's) give the same bits: what
/// the probe leaves each row, and the tokens, kept sets and log-probabilities of rows
/// with every stage (top-n-σ's sums take
/// the sample's range too), in calls of one to three rows, at V = 32,001 and 151,936
/// (32,001 is no multiple of 256: the last piece is short).
#[test]
fn probe_in_pieces_gives_the_whole_row_bits() {
    // the shared test device where its probe takes a row in one piece (a software
    // adapter), else a device of its own
    let own_whole;
    let whole = match decoda::testing::gpu::device() {
        Some(d) if !d.samples_in_pieces() => d,
        _ => {
            own_whole = decoda::testing::gpu::own_device(WgpuOptions {
                sample_pieces: Some(false),
                ..Default::default()
            });
            let Some(d) = own_whole.as_ref() else { return };
            d
        }
    };
    let Some(pieces) = decoda::testing::gpu::own_device(WgpuOptions {
        sample_pieces: Some(true),
        ..Default::default()
    }) else {
        return;
    };
    assert!(pieces.samples_in_pieces() && !whole.samples_in_pieces());
    let (a, b) = (
        WgpuSampler::on(whole).unwrap(),
        WgpuSampler::on(&pieces).unwrap(),
    );
    for v in [32_001usize, 151_936] {
        let mut rng = Rng::new(v as u64 ^ 0x9e11);
        let (mut data, mut reqs) = (Vec::new(), Vec::new());
        for r in 0..12u64 {
            let (x, mut q) = if r % 2 == 0 {
                decoda::testing::stages::random_staged_case(&mut rng, v)
            } else {
                let x = decoda::testing::zipf_logits(&mut rng, v, 1.1);
                let mut p = SamplingParams::default();
                match r % 6 {
                    1 => p.top_k = 40,
                    3 => p.top_p = 0.9,
                    _ => {
                        p.top_n_sigma = 1.5;
                        p.min_p = 0.02;
                    }
                }
                (x, Request::new(p, 0x51 + r))
            };
            q.state.step = r * 3;
            data.extend(x);
            reqs.push(q);
        }
        // calls of one to three rows: the scan cuts their rows in pieces (a big batch's
        // are whole), and so does the probe's sample
        for (k, n) in [1usize, 2, 3, 3, 1, 2].into_iter().enumerate() {
            let at = [0, 1, 3, 6, 9, 10][k];
            let q = &reqs[at..at + n];
            let st = b.call_structure(v, q).unwrap();
            assert_eq!(st.stages[1], "sample");
            assert!(st.workgroups[1] > n as u64, "{st:?}");
            let logits = Logits::f32(&data[at * v..(at + n) * v], n, v).unwrap();
            // what the probe leaves (results never depend on it: a wrong threshold only
            // sends rows down the full-row path)
            assert_eq!(
                a.probe_states(&logits, q).unwrap(),
                b.probe_states(&logits, q).unwrap(),
                "V {v} rows {at}.."
            );
            let (ga, gb) = (a.sample(&logits, q).unwrap(), b.sample(&logits, q).unwrap());
            for (r, (x, y)) in ga.iter().zip(&gb).enumerate() {
                assert_eq!(format!("{x:?}"), format!("{y:?}"), "V {v} row {}", at + r);
            }
        }
    }
}

/// The probe's dispatches: what each row needs first, then the row's sample counted and
/// picked from twice (once where the candidate list holds a row whole, V <= 4,096).
const PROBE: [&str; 5] = ["probe", "sample", "pick", "sample", "pick"];

fn lp_req() -> [Request; 1] {
    [Request::new(
        SamplingParams {
            logprobs: Some(2),
            ..Default::default()
        },
        1,
    )]
}

/// `settle_finish` in one dispatch and as `settle` then `draw_finish` give the same bits
/// (and so `settle` whole, a fused device's, and as `settle_first` then `settle_rest`,
/// an unfused one's):
/// tokens of mixed rows (greedy, temperature, every filter, the full-row path, penalties,
/// the later stages and the kept distribution) from the per-call API, and a head's
/// tokens over steps. Each device runs the default suites with its own choice (a GPU
/// fuses, lavapipe does not); this checks the other. On a software adapter the fused
/// kernel costs about 40 s of LLVM to build, so there it runs in the full tier only.
#[test]
fn fused_settle_finish_gives_the_unfused_bits() {
    let Some(d) = decoda::testing::gpu::device() else {
        return;
    };
    if !d.fuses_settle() && !decoda::testing::full_tier() {
        eprintln!("the fused settle_finish on a software adapter: in the full tier");
        return;
    }
    let other = decoda::testing::gpu::own_device(WgpuOptions {
        fused_settle: Some(!d.fuses_settle()),
        ..Default::default()
    })
    .unwrap();
    assert_ne!(other.fuses_settle(), d.fuses_settle());
    let (a, b) = (
        WgpuSampler::on(d).unwrap(),
        WgpuSampler::on(&other).unwrap(),
    );
    let v = 32_000;
    let mut rng = Rng::new(0xf05e);
    let mut data = Vec::new();
    let mut reqs = Vec::new();
    for r in 0..40u64 {
        let (x, mut q) = if r % 3 == 0 {
            decoda::testing::stages::random_staged_case(&mut rng, v)
        } else {
            let row: Vec<f32> = (0..v).map(|_| rng.normal() * 2.0).collect();
            let mut p = SamplingParams::default();
            match r % 6 {
                1 => p.temperature = 0.0,
                2 => p.top_k = 3_000,
                4 => p.top_p = 0.995,
                _ => {
                    p.min_p = 0.05;
                    p.presence_penalty = 0.7;
                }
            }
            let mut q = Request::new(p, 0x77 + r);
            q.state.output = (0..20)
                .map(|i| ((r * 131 + i * 7) % v as u64) as u32)
                .collect();
            (row, q)
        };
        q.params.logprobs = None;
        q.state.step = r * 5;
        data.extend(x);
        reqs.push(q);
    }
    let logits = Logits::f32(&data, reqs.len(), v).unwrap();
    let (ga, gb) = (
        a.sample(&logits, &reqs).unwrap(),
        b.sample(&logits, &reqs).unwrap(),
    );
    for (r, (x, y)) in ga.iter().zip(&gb).enumerate() {
        assert_eq!(format!("{x:?}"), format!("{y:?}"), "row {r}");
    }
    // the same rows with log-probabilities on every third (a full call: `settle`
    // whole against `settle_first` then `settle_rest` where settle_finish is not fused)
    let mut full = reqs.clone();
    for (r, q) in full.iter_mut().enumerate() {
        if r % 3 == 1 {
            q.params.logprobs = Some(3);
        }
    }
    assert_eq!(
        format!("{:?}", a.sample(&logits, &full).unwrap()),
        format!("{:?}", b.sample(&logits, &full).unwrap()),
        "a call with log-probabilities"
    );
    // a light call (greedy and temperature rows alone): `settle_finish_light` against
    // `settle_light` then `draw_finish_light`
    let light: Vec<Request> = (0..reqs.len() as u64)
        .map(|r| {
            let p = SamplingParams {
                temperature: [0.0, 0.7, 1.3][r as usize % 3],
                // on greedy rows only: the call stays light
                kept: (r % 6 == 0).then_some(2),
                ..SamplingParams::default()
            };
            Request::new(p, 0x99 + r)
        })
        .collect();
    assert_eq!(
        format!("{:?}", a.sample(&logits, &light).unwrap()),
        format!("{:?}", b.sample(&logits, &light).unwrap()),
        "a light call"
    );
    for q in reqs.iter().take(8) {
        let one = Logits::f32(&data[..v], 1, v).unwrap();
        let q = [q.clone()];
        assert_eq!(
            format!("{:?}", a.sample(&one, &q).unwrap()),
            format!("{:?}", b.sample(&one, &q).unwrap()),
            "B = 1"
        );
    }
    // a head on the other device: its slots' tokens are CpuSampler's, step by step
    let mut head = decoda::wgpu::WgpuHead::new(&other, 16, 3000).unwrap();
    let t = decoda::testing::head::head_matches_sequences(&mut head, 20, 1000, 41)
        .unwrap_or_else(|e| panic!("{e}"));
    eprintln!("head on the other device: {t:?}");
}

/// Rows whose candidates cannot settle them take the full-row path. With or without
/// log-probabilities their draw runs in lp's split pass (without: after
/// `settle_finish` finished the call's other rows, over grids settle counts). Both draw
/// the CPU's token, alone (B = 1) and in a batch, at every step tried, on one sampler
/// whose calls alternate between B = 1 and 24 (a call's words in the shared buffers
/// must not be another batch size's: the last round's batch leads with a top-p row
/// summing masses in its histogram right after single-row calls).
#[test]
fn full_row_path_draws_the_cpu_token_in_every_plan() {
    let Some(b) = sampler() else { return };
    let v = 32_768;
    let mut rng = Rng::new(0x5eed_f011);
    let mut cases = Vec::new();
    for k in 0..24u64 {
        // a flat row (scale 1): top-k beyond the list, a wide nucleus, a low min-p, and
        // those with a penalty and a bias
        let row: Vec<f32> = (0..v).map(|_| rng.normal()).collect();
        let mut p = SamplingParams::default();
        match k % 4 {
            0 => p.top_k = 3_000,
            1 => p.top_p = 0.995,
            2 => p.min_p = 0.01,
            _ => {
                p.top_k = 2_500;
                p.top_p = 0.99;
                p.presence_penalty = 1.0;
                p.logit_bias.insert((k * 977 % v as u64) as u32, 2.0);
            }
        }
        let mut q = Request::new(p, 0xabc0 + k);
        q.state.step = k * 3;
        q.state.output = (0..40)
            .map(|i| ((k * 31 + i * 17) % v as u64) as u32)
            .collect();
        cases.push((row, q));
    }
    let mut count = Count::default();
    for (logprobs, rot) in [(None, 0), (Some(3), 1), (None, 1)] {
        let mut cs = cases.clone();
        cs.rotate_left(rot);
        for c in &mut cs {
            c.1.params.logprobs = logprobs;
        }
        for one in cs.iter().take(8) {
            run_cases(b, &mut count, vec![one.clone()], DType::F32);
        }
        run_cases(b, &mut count, cs, DType::F32);
    }
    assert!(count.mismatches.is_empty(), "{:#?}", count.mismatches);
    assert_eq!(count.rows, 3 * (8 + 24));
    assert!(
        count.same + count.ties == count.rows && count.ties <= 3,
        "{count:?}"
    );
}

/// Top-p alone skips the division for tokens that add nothing to its mass (issue 56:
/// the scan's bound `mass_floor`): those whose `exp(y - R)` truncates to 0 in 2^-72
/// units. Tokens just above that bound still count. A row whose nucleus is decided by
/// its far tail: token 0 alone holds a share of the mass just under `p` only because
/// 80% of 131,070 tokens lie about 25.5 under the max (each 2^-36.8 of it; the rest lie
/// 40 under, where nothing counts). The CPU sampler then keeps token 1 as well; a bound
/// that dropped the near tail would keep token 0 alone. The gap is about six ulps of
/// `p`, far wider than the sums' rounding (fixed point: 2^-72 a token).
#[test]
fn top_p_mass_counts_the_far_tail() {
    let Some(b) = sampler() else { return };
    let v = 131_072usize;
    let mut rng = Rng::new(0x7a11);
    let mut x = vec![0f32; v];
    x[1] = -0.5;
    for (i, e) in x.iter_mut().enumerate().skip(2) {
        let far = if i % 5 == 0 { -14.5 } else { 0.0 };
        *e = -25.7 + far + 0.4 * rng.unit();
    }
    // token 0's share of the mass with and without the near tail; p between them
    let m: Vec<f64> = x.iter().map(|&e| (e as f64).exp()).collect();
    let near: f64 = m[2..].iter().filter(|&&w| w > 1e-15).sum();
    let with = m[0] / (m[0] + m[1] + near);
    let without = m[0] / (m[0] + m[1]);
    let p = ((with + without) / 2.0) as f32;
    let ulp = f32::EPSILON as f64 * 0.5;
    assert!(
        (p as f64) - with > 2.0 * ulp && without - (p as f64) > 2.0 * ulp,
        "the row leaves p no room: {with} {without} {p}"
    );
    let cpu = CpuSampler::new();
    for t in [1.0f32, 0.8] {
        // (at T = 0.8 the values scale; p is set from T = 1, so only agreement counts)
        let reqs: Vec<Request> = (0..16u64)
            .map(|seed| {
                Request::new(
                    SamplingParams {
                        top_p: p,
                        temperature: t,
                        ..Default::default()
                    },
                    seed,
                )
            })
            .collect();
        let data: Vec<f32> = (0..reqs.len()).flat_map(|_| x.iter().copied()).collect();
        let l = Logits::f32(&data, reqs.len(), v).unwrap();
        let want: Vec<u32> = cpu
            .sample(&l, &reqs)
            .unwrap()
            .into_iter()
            .map(|r| r.unwrap().token)
            .collect();
        let got: Vec<u32> = b
            .sample(&l, &reqs)
            .unwrap()
            .into_iter()
            .map(|r| r.unwrap().token)
            .collect();
        assert_eq!(got, want, "T = {t}");
        if t == 1.0 {
            assert!(
                want.contains(&1),
                "the near tail must put token 1 in the nucleus: {want:?}"
            );
            assert!(want.iter().all(|&k| k < 2), "{want:?}");
        }
    }
}

/// Rows using the later stages (DRY, top-n-σ, typical-p, XTC, the kept distribution) in a
/// batch with plain rows, at a real vocabulary: the host API draws them on the device,
/// each row the reference's; the device API gives the same results with outputs made
/// by `outputs_kept`, and refuses outputs without room for the kept distributions,
/// naming the first row that asks for one and the field (and `read` an error).
#[test]
fn later_stages_on_the_host_and_device_apis() {
    let Some(b) = sampler() else { return };
    let v = 32_000usize;
    let mut rng = Rng::new(17);
    let mut data = Vec::new();
    let mut reqs = Vec::new();
    for r in 0..6 {
        let (x, mut req) = decoda::testing::stages::random_staged_case(&mut rng, v);
        req.params.kept = None;
        if r % 2 == 1 {
            req.params.typical_p = 0.8;
            req.params.kept = Some(16);
        }
        data.extend(x);
        reqs.push(req);
    }
    let logits = Logits::f32(&data, reqs.len(), v).unwrap();
    let got = b.sample(&logits, &reqs).unwrap();
    for (r, (g, req)) in got.iter().zip(&reqs).enumerate() {
        let (want, tie) = decoda::reference::reference_row(&data[r * v..(r + 1) * v], req);
        assert!(
            !matches!(
                decoda::testing::classify(g, &want, &tie),
                decoda::testing::Verdict::Mismatch
            ),
            "row {r}: {g:?} vs {want:?}"
        );
    }
    let buf = b.upload_logits(&logits);
    let view = DeviceLogits {
        buffer: &buf,
        dtype: DType::F32,
        rows: reqs.len(),
        vocab: v,
        row_stride: v,
        offset: 0,
    };
    let mut enc = b
        .device()
        .create_command_encoder(&wgpu::CommandEncoderDescriptor { label: None });
    match b.record(&mut enc, &view, &reqs, &b.outputs(reqs.len()).unwrap()) {
        Err(Error::InvalidParameter { row: 1, field, .. }) => assert_eq!(field, "kept"),
        other => panic!("expected the device API to refuse row 1, got {other:?}"),
    }
    // and reading such rows from outputs without the room is an error, not a panic
    let small = b.outputs(reqs.len()).unwrap();
    assert!(matches!(b.read(&small, &reqs), Err(Error::Shape(_))));
    let out = b.outputs_kept(reqs.len()).unwrap();
    b.record(&mut enc, &view, &reqs, &out).unwrap();
    b.queue().submit([enc.finish()]);
    assert_eq!(b.read(&out, &reqs).unwrap(), got);
}

/// Token masks on the device (`record_masked`): the kernels read each row's mask where
/// they read its logits. Every row is the CPU's token (and logprobs) for the same
/// request with the mask given on the host, at V = 32,000 and 151,936 with masks
/// sparse, dense, all ones and all zeros (`NoCandidate`), greedy, filtered and
/// logprob rows; a mask stride below ceil(V/32) and a buffer too short are errors.
#[test]
fn device_masks_match_host_masks() {
    let Some(b) = sampler() else { return };
    let cpu = CpuSampler::new();
    for v in [32_000usize, 151_936] {
        let w = v.div_ceil(32);
        let rows = 6usize;
        let mut rng = Rng::new(v as u64);
        let mut data = Vec::new();
        let mut reqs = Vec::new();
        let mut words = Vec::new();
        for r in 0..rows {
            let (x, mut req) = random_case(&mut rng, v);
            data.extend(x);
            let mask: Vec<u32> = match r {
                0 => vec![u32::MAX; w],
                1 => vec![0; w],
                // a handful of allowed ids anywhere in the row
                2 => {
                    let mut m = vec![0u32; w];
                    for _ in 0..7 {
                        let t = rng.below(v as u64) as usize;
                        m[t / 32] |= 1 << (t % 32);
                    }
                    m
                }
                _ => (0..w).map(|_| rng.next_u64() as u32).collect(),
            };
            if r == 4 {
                req.params.logprobs = Some(5);
                req.params.logprobs_mode = decoda::LogprobsMode::Raw;
            }
            words.extend_from_slice(&mask);
            req.allowed = Some(mask);
            reqs.push(req);
        }
        let logits = Logits::f32(&data, rows, v).unwrap();
        let want = cpu.sample(&logits, &reqs).unwrap();
        assert!(
            matches!(want[1], Err(decoda::RowError::NoCandidate)),
            "{:?}",
            want[1]
        );
        let plain: Vec<Request> = reqs
            .iter()
            .map(|r| Request {
                allowed: None,
                ..r.clone()
            })
            .collect();
        let buf = b.upload_logits(&logits);
        // the masks after 3 words of padding, rows w + 5 words apart
        let stride = w + 5;
        let mut padded = vec![0u32; 3 + rows * stride];
        for r in 0..rows {
            padded[3 + r * stride..3 + r * stride + w].copy_from_slice(&words[r * w..(r + 1) * w]);
        }
        let mbuf = b.device().create_buffer(&wgpu::BufferDescriptor {
            label: None,
            size: (padded.len() * 4) as u64,
            usage: wgpu::BufferUsages::STORAGE | wgpu::BufferUsages::COPY_DST,
            mapped_at_creation: false,
        });
        b.queue()
            .write_buffer(&mbuf, 0, bytemuck::cast_slice(&padded));
        let masks = decoda::wgpu::DeviceMasks {
            buffer: &mbuf,
            offset: 3,
            row_stride: stride,
        };
        let view = DeviceLogits {
            buffer: &buf,
            dtype: DType::F32,
            rows,
            vocab: v,
            row_stride: v,
            offset: 0,
        };
        let out = b.outputs(rows).unwrap();
        let mut enc = b
            .device()
            .create_command_encoder(&wgpu::CommandEncoderDescriptor { label: None });
        b.record_masked(&mut enc, &view, &masks, &plain, &out)
            .unwrap();
        b.queue().submit([enc.finish()]);
        let got = b.read(&out, &plain).unwrap();
        for r in 0..rows {
            let (reference, tie) = reference_row(&data[r * v..(r + 1) * v], &reqs[r]);
            assert_eq!(got[r].is_ok(), want[r].is_ok(), "V={v} row {r}");
            assert!(
                !matches!(
                    decoda::testing::classify(&got[r], &reference, &tie),
                    decoda::testing::Verdict::Mismatch
                ),
                "V={v} row {r}: device {:?} vs reference {reference:?}",
                got[r]
            );
        }
        // bad views: a stride below the width, a buffer too short
        let mut enc = b
            .device()
            .create_command_encoder(&wgpu::CommandEncoderDescriptor { label: None });
        let narrow = decoda::wgpu::DeviceMasks {
            row_stride: w - 1,
            ..masks
        };
        assert!(b
            .record_masked(&mut enc, &view, &narrow, &plain, &out)
            .is_err());
        let far = decoda::wgpu::DeviceMasks {
            offset: padded.len(),
            ..masks
        };
        assert!(b
            .record_masked(&mut enc, &view, &far, &plain, &out)
            .is_err());
    }
}
