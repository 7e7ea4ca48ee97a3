//! Vocabulary-sharded sampling's summaries on the device (`decoda::wgpu::WgpuShard`)
//! against the host's (`decoda::shard`): every round's summary the same (round 2's
//! partial log-sum-exp within `1e-5`), for random rows, parameters and splits; and the
//! merged results of device and host shards mixed equal to the unsharded CPU sampler's.

use decoda::shard::{decide, finish, plan, round1, round2, round3, Round2, ShardRows};
use decoda::wgpu::{DeviceLogits, WgpuShard};
use decoda::{Backend, CpuSampler, DType, Logits, LogprobsMode, Request, RowResult};
use decoda::{SamplingParams, SequenceState};
use proptest::prelude::*;
use wgpu::util::DeviceExt;

use crate::shard_util::{close, request, spans};

fn shard_kernels() -> Option<WgpuShard> {
    decoda::testing::gpu::device().map(|d| WgpuShard::new(d).expect("the shard kernels build"))
}

fn upload(s: &WgpuShard, words: &[u32]) -> wgpu::Buffer {
    s.device()
        .device()
        .create_buffer_init(&wgpu::util::BufferInitDescriptor {
            label: Some("test shard logits"),
            contents: bytemuck::cast_slice(if words.is_empty() { &[0u32] } else { words }),
            usage: wgpu::BufferUsages::STORAGE,
        })
}

fn columns(x: &[f32], rows: usize, v: usize, (o, w): (usize, usize)) -> Vec<f32> {
    (0..rows)
        .flat_map(|r| x[r * v + o..r * v + o + w].iter().copied())
        .collect()
}

fn near(p: f64, q: f64) -> bool {
    p == q || (p - q).abs() <= 1e-5 * p.abs().max(1e-30)
}

fn same_round2(dev: &[Round2], host: &[Round2]) -> Result<(), String> {
    for (r, (d, h)) in dev.iter().zip(host).enumerate() {
        if d.best != h.best || d.greedy_x != h.greedy_x || !near(d.lse_part, h.lse_part) {
            return Err(format!("row {r}: device {d:?}, host {h:?}"));
        }
    }
    Ok(())
}

/// Every round on every shard, shards `on_device[i]` by the device and the others by the
/// host, each round's device summary checked against the host's; the merged results.
fn run_mixed(
    s: &WgpuShard,
    x: &[f32],
    rows: usize,
    v: usize,
    sp: &[(usize, usize)],
    on_device: &[bool],
    reqs: &[Request],
) -> Result<Vec<RowResult>, String> {
    let cols: Vec<Vec<f32>> = sp.iter().map(|&c| columns(x, rows, v, c)).collect();
    let bufs: Vec<wgpu::Buffer> = cols
        .iter()
        .map(|c| upload(s, bytemuck::cast_slice(c)))
        .collect();
    let views: Vec<DeviceLogits> = sp
        .iter()
        .zip(&bufs)
        .map(|(&(_, w), b)| DeviceLogits {
            buffer: b,
            dtype: DType::F32,
            rows,
            vocab: w,
            row_stride: w,
            offset: 0,
        })
        .collect();
    let host: Vec<ShardRows> = sp
        .iter()
        .zip(&cols)
        .map(|(&(offset, width), l)| ShardRows {
            logits: l,
            width,
            offset,
        })
        .collect();
    let e = |e: decoda::Error| e.to_string();
    let mut r1 = Vec::new();
    for i in 0..sp.len() {
        let h = round1(&host[i], v, reqs).map_err(e)?;
        let d = s.round1(&views[i], sp[i].0, v, reqs).map_err(e)?;
        if d != h {
            return Err(format!(
                "round 1 of shard {:?}: device {d:?}\nhost {h:?}",
                sp[i]
            ));
        }
        r1.push(if on_device[i] { d } else { h });
    }
    let plans = plan(&r1, v, reqs).map_err(e)?;
    let mut r2 = Vec::new();
    for i in 0..sp.len() {
        let h = round2(&host[i], v, reqs, &plans).map_err(e)?;
        let d = s.round2(&views[i], sp[i].0, v, reqs, &plans).map_err(e)?;
        same_round2(&d, &h).map_err(|m| format!("round 2 of shard {:?}: {m}", sp[i]))?;
        r2.push(if on_device[i] { d } else { h });
    }
    let decisions = decide(&r2, &plans, reqs);
    let mut r3 = Vec::new();
    for i in 0..sp.len() {
        let h = round3(&host[i], v, reqs, &plans, &decisions).map_err(e)?;
        let d = s
            .round3(&views[i], sp[i].0, v, reqs, &plans, &decisions)
            .map_err(e)?;
        if d != h {
            return Err(format!(
                "round 3 of shard {:?}: device {d:?}, host {h:?}",
                sp[i]
            ));
        }
        r3.push(if on_device[i] { d } else { h });
    }
    Ok(finish(&r1, &r3, &plans, &decisions, reqs))
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(if decoda::testing::full_tier() { 120 } else { 16 }))]

    /// Random rows of V = 2 to 12,000 (ties, `-inf`, crowded values), random supported
    /// parameters per row (penalties, bias, DRY, masks, top-k up to 300, min-p,
    /// log-probabilities raw and processed), 1 to 4 uneven shards, some on the device and
    /// some on the host: every round's summaries equal, the results the CPU sampler's.
    #[test]
    fn device_summaries_are_the_hosts(
        v in 2usize..12_000,
        rows in 1usize..4,
        seed in any::<u64>(),
        cuts in proptest::collection::vec(any::<usize>(), 0..4),
        device_mask in any::<u8>(),
        knobs in proptest::collection::vec(
            (0u8..6, 0u32..300, 0u8..4, 0u8..3, 0u8..2, proptest::option::of(0u32..6), any::<bool>(), any::<bool>()),
            4,
        ),
        crowd in any::<bool>(),
        poison in any::<bool>(),
    ) {
        let Some(s) = shard_kernels() else { return Ok(()) };
        let mut x = decoda::testing::synthetic::uniform(rows * v, 6.0, seed);
        for i in (0..x.len()).step_by(7) {
            x[i] = x[i / 2];
        }
        for i in (3..x.len()).step_by(11) {
            x[i] = f32::NEG_INFINITY;
        }
        if crowd {
            // values crowded into few histogram bins: a handful of distinct values
            for (i, xi) in x.iter_mut().enumerate() {
                if xi.is_finite() {
                    *xi = (i % 3) as f32 * 0.25 + 1.0;
                }
            }
        }
        // histories over a few ids (so DRY finds repeats), those ids among the row's
        // largest logits (so penalties and DRY decide lists and draws)
        let alphabet: Vec<u32> = (0..4).map(|a| ((seed as usize >> (8 * a)) % v) as u32).collect();
        for r in 0..rows {
            for (a, &id) in alphabet.iter().enumerate() {
                x[r * v + id as usize] = 7.5 - a as f32 * 0.25;
            }
        }
        if poison {
            // row 0: +inf where the rows' -inf bias lands (the CPU's z is NaN there);
            // the last row: a NaN
            x[((seed / 7) as usize) % v] = f32::INFINITY;
            x[(rows - 1) * v + (seed as usize % v)] = f32::NAN;
        }
        let reqs: Vec<Request> = (0..rows)
            .map(|r| {
                let (tsel, k, mp, pen, dry, lp, raw, masked) = knobs[r];
                let t = [0.0, 0.5, 1.0, 1.7, 1e-6, 3.0][tsel as usize];
                let history: Vec<u32> = (0..(seed as usize % 12))
                    .map(|j| alphabet[(seed >> (2 * j)) as usize % 2 + j % 2])
                    .collect();
                let bias = vec![((seed as usize % v) as u32, 2.5), (((seed / 7) as usize % v) as u32, f32::NEG_INFINITY)];
                let mask = masked.then(|| {
                    (0..v.div_ceil(32)).map(|w| (seed as u32).rotate_left(w as u32) | 1).collect()
                });
                request(
                    seed ^ r as u64,
                    seed % 1000 + r as u64,
                    t,
                    k,
                    [0.0, 0.05, 0.3, 0.9][mp as usize],
                    [(1.0, 0.0, 0.0), (1.3, 0.2, 0.1), (0.8, -0.5, 0.4)][pen as usize],
                    [0.0, 0.8][dry as usize],
                    lp,
                    raw,
                    history,
                    bias,
                    mask,
                )
            })
            .collect();
        let want = CpuSampler::new().sample(&Logits::f32(&x, rows, v).unwrap(), &reqs).unwrap();
        let sp = spans(v, &cuts);
        let on_device: Vec<bool> = (0..sp.len()).map(|i| device_mask >> i & 1 == 1).collect();
        let got = run_mixed(&s, &x, rows, v, &sp, &on_device, &reqs);
        prop_assert!(got.is_ok(), "V = {} in {:?}: {}", v, sp, got.unwrap_err());
        let got = got.unwrap();
        for r in 0..rows {
            prop_assert!(close(&got[r], &want[r]).is_ok(), "row {} of V = {} in {:?}: {:?} vs the CPU's {:?}", r, v, sp, got[r], want[r]);
        }
    }
}

/// Qwen3's vocabulary (151,936) at B = 1 and 3, winners anywhere, every shard on the
/// device, 2 and 4 uneven shards: greedy, top-k 50 with logprobs, min-p with raw logprobs.
#[test]
fn large_vocabulary_rows_on_the_device() {
    let Some(s) = shard_kernels() else { return };
    let v = 151_936;
    let rows = 3;
    let mut x = decoda::testing::synthetic::uniform(rows * v, 8.0, 42);
    x[v - 1] = 40.0; // row 0's winner at the last id
    x[v + 70_000] = 30.0;
    let params = [
        SamplingParams::default(),
        SamplingParams {
            top_k: 50,
            temperature: 0.7,
            logprobs: Some(5),
            ..Default::default()
        },
        SamplingParams {
            min_p: 0.1,
            logprobs: Some(3),
            logprobs_mode: LogprobsMode::Raw,
            ..Default::default()
        },
    ];
    let reqs: Vec<Request> = params
        .iter()
        .enumerate()
        .map(|(i, p)| Request {
            params: p.clone(),
            state: SequenceState {
                seed: 7 + i as u64,
                step: 3,
                ..Default::default()
            },
            allowed: None,
        })
        .collect();
    let want = CpuSampler::new()
        .sample(&Logits::f32(&x, rows, v).unwrap(), &reqs)
        .unwrap();
    for cuts in [vec![70_001], vec![1, 40_001, 100_000]] {
        let sp = spans(v, &cuts);
        let got = run_mixed(&s, &x, rows, v, &sp, &vec![true; sp.len()], &reqs)
            .unwrap_or_else(|e| panic!("{cuts:?}: {e}"));
        for r in 0..rows {
            close(&got[r], &want[r]).unwrap_or_else(|e| panic!("{cuts:?} row {r}: {e}"));
        }
    }
    // a greedy row alone (no lists: round 1 reads back no histograms)
    let first = &x[..v];
    let want = CpuSampler::new()
        .sample(&Logits::f32(first, 1, v).unwrap(), &reqs[..1])
        .unwrap();
    let got = run_mixed(&s, first, 1, v, &spans(v, &[3]), &[true, true], &reqs[..1]).unwrap();
    close(&got[0], &want[0]).unwrap();
    // B = 1, the row alone
    let one = &x[v..2 * v];
    let want = CpuSampler::new()
        .sample(&Logits::f32(one, 1, v).unwrap(), &reqs[1..2])
        .unwrap();
    let got = run_mixed(
        &s,
        one,
        1,
        v,
        &spans(v, &[75_968]),
        &[true, true],
        &reqs[1..2],
    )
    .unwrap();
    close(&got[0], &want[0]).unwrap();
}

/// A y list whose last entry ties, after the division by T, with a value just below the
/// histogram bin the device gathered from: the device must gather the lower bin too
/// (the tie goes to the smaller id, which is below the bin).
#[test]
fn a_y_tie_across_a_bin_boundary_is_gathered() {
    let Some(s) = shard_kernels() else { return };
    let hi = 1.0f32; // the first value of its bin (its key's low 21 bits are zero)
    let lo = f32::from_bits(hi.to_bits() - 1); // the last value of the bin below
    let t = (1..400)
        .map(|i| 1.0 + i as f32 * 0.01)
        .find(|t| hi / t == lo / t)
        .expect("a temperature that makes the two quotients equal");
    let v = 5000;
    let mut x = vec![-5.0f32; v];
    x[4000] = hi;
    x[100] = lo;
    let req = Request {
        params: SamplingParams {
            temperature: t,
            top_k: 1,
            ..Default::default()
        },
        state: SequenceState {
            seed: 3,
            step: 1,
            ..Default::default()
        },
        allowed: None,
    };
    let reqs = [req];
    let buf = upload(&s, bytemuck::cast_slice(&x));
    let view = DeviceLogits {
        buffer: &buf,
        dtype: DType::F32,
        rows: 1,
        vocab: v,
        row_stride: v,
        offset: 0,
    };
    let host = round1(
        &ShardRows {
            logits: &x,
            width: v,
            offset: 0,
        },
        v,
        &reqs,
    )
    .unwrap();
    assert_eq!(
        host[0].top_y[0].0, 100,
        "the tie's smaller id leads on the host"
    );
    let dev = s.round1(&view, 0, v, &reqs).unwrap();
    assert_eq!(dev, host);
    let want = CpuSampler::new()
        .sample(&Logits::f32(&x, 1, v).unwrap(), &reqs)
        .unwrap();
    let got = run_mixed(&s, &x, 1, v, &[(0, v)], &[true], &reqs).unwrap();
    close(&got[0], &want[0]).unwrap();
}

/// 16-bit logits (f16 and bf16, row stride and offset in the buffer) give the summaries
/// of their f32 values.
#[test]
fn half_logits() {
    let Some(s) = shard_kernels() else { return };
    let (rows, v, stride, first) = (2, 3000, 3010, 6);
    let x = decoda::testing::synthetic::uniform(rows * v, 5.0, 9);
    let req = Request {
        params: SamplingParams {
            temperature: 0.9,
            top_k: 20,
            logprobs: Some(3),
            ..Default::default()
        },
        state: SequenceState {
            seed: 5,
            step: 2,
            ..Default::default()
        },
        allowed: None,
    };
    let reqs = vec![req.clone(), req];
    for dtype in [DType::F16, DType::Bf16] {
        let halves: Vec<u16> = x
            .iter()
            .map(|&f| match dtype {
                DType::F16 => half::f16::from_f32(f).to_bits(),
                _ => half::bf16::from_f32(f).to_bits(),
            })
            .collect();
        let back: Vec<f32> = halves
            .iter()
            .map(|&h| match dtype {
                DType::F16 => half::f16::from_bits(h).to_f32(),
                _ => half::bf16::from_bits(h).to_f32(),
            })
            .collect();
        let mut packed = vec![0u16; first + rows * stride + 2];
        for r in 0..rows {
            packed[first + r * stride..][..v].copy_from_slice(&halves[r * v..][..v]);
        }
        let buf = upload(&s, bytemuck::cast_slice(&packed));
        let view = DeviceLogits {
            buffer: &buf,
            dtype,
            rows,
            vocab: v,
            row_stride: stride,
            offset: first,
        };
        let host = round1(
            &ShardRows {
                logits: &back,
                width: v,
                offset: 1000,
            },
            4000,
            &reqs,
        )
        .unwrap();
        let dev = s.round1(&view, 1000, 4000, &reqs).unwrap();
        assert_eq!(dev, host, "{dtype}");
        // rounds 2 and 3 over the same view (this shard alone merged)
        let shard = ShardRows {
            logits: &back,
            width: v,
            offset: 1000,
        };
        let plans = plan(&[host], 4000, &reqs).unwrap();
        let h2 = round2(&shard, 4000, &reqs, &plans).unwrap();
        let d2 = s.round2(&view, 1000, 4000, &reqs, &plans).unwrap();
        same_round2(&d2, &h2).unwrap_or_else(|e| panic!("{dtype}: {e}"));
        let dec = decide(&[h2], &plans, &reqs);
        let h3 = round3(&shard, 4000, &reqs, &plans, &dec).unwrap();
        let d3 = s.round3(&view, 1000, 4000, &reqs, &plans, &dec).unwrap();
        assert_eq!(d3, h3, "{dtype}");
    }
}

/// Bad calls are errors naming the problem: rows and requests that disagree, a shard
/// past V, a stage not sharded.
#[test]
fn bad_device_calls_are_refused() {
    let Some(s) = shard_kernels() else { return };
    let x = vec![0.5f32; 200];
    let buf = upload(&s, bytemuck::cast_slice(&x));
    let view = DeviceLogits {
        buffer: &buf,
        dtype: DType::F32,
        rows: 2,
        vocab: 100,
        row_stride: 100,
        offset: 0,
    };
    let one = [Request::default()];
    let e = s.round1(&view, 0, 100, &one).unwrap_err().to_string();
    assert!(e.contains("2 rows of logits for 1 requests"), "{e}");
    let two = [Request::default(), Request::default()];
    let e = s.round1(&view, 50, 100, &two).unwrap_err().to_string();
    assert!(e.contains("50 .. 150"), "{e}");
    let mut top_p = Request::default();
    top_p.params.top_p = 0.9;
    let e = s
        .round1(&view, 0, 100, &[Request::default(), top_p])
        .unwrap_err()
        .to_string();
    assert!(e.contains("top_p") && e.contains("row 1"), "{e}");
}
