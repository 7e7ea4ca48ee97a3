//! Differential test of the wgpu backend against the reference sampler, with proptest:
//! it generates (V, B, element type, per-row logit style, parameter mix and seeds, entry
//! point, fresh or long-lived sampler), runs the case, and compares every row (and every
//! draw) with `ReferenceSampler`'s contract; a failure shrinks to a minimal case (fewer
//! rows, smaller V, simpler styles and mixes).
//!
//! The default number of cases is sized for CI; `DECODA_PROPTEST_CASES=N` runs N (the
//! long runs before a release use tens of thousands).

use decoda::testing::gpu::PerDevice;

use decoda::testing::shapes::{
    check, mixed_request, run_entry, styled_logits, Batch, Entry, Tally, DECODE_VOCABS, MIXES,
    STYLES,
};
use decoda::testing::{random_case, Rng};
use decoda::wgpu::{DeviceLogits, WgpuSampler};
use decoda::{DType, LogitsData, Request, RowResult};
use proptest::prelude::*;

/// A long-lived sampler on the calling thread's shared test device, one per device
/// (`decoda::testing::gpu`).
fn long_lived() -> Option<&'static WgpuSampler> {
    static S: PerDevice<Option<WgpuSampler>> = PerDevice::new();
    S.get_or_init(decoda::testing::gpu::sampler).as_ref()
}

/// The ways into the device sampler.
#[derive(Clone, Copy, Debug)]
enum Way {
    Sample,
    Draws(usize),
    DeviceApi { offset: usize, pad: usize },
}

/// One row: its logit style, its parameter mix (the last index: `random_case`'s random
/// parameters), and the seed of its data.
#[derive(Clone, Debug)]
struct RowSpec {
    style: usize,
    mix: usize,
    seed: u64,
}

#[derive(Clone, Debug)]
struct Case {
    vocab: usize,
    dtype: DType,
    rows: Vec<RowSpec>,
    way: Way,
    fresh: bool,
}

fn row_spec() -> impl Strategy<Value = RowSpec> {
    (0..STYLES.len(), 0..=MIXES.len(), 0u64..1 << 48).prop_map(|(style, mix, seed)| RowSpec {
        style,
        mix,
        seed,
    })
}

fn case() -> impl Strategy<Value = Case> {
    let vocab = prop_oneof![
        3 => 1usize..=300,
        2 => 301usize..=20_000,
        4 => proptest::sample::select(DECODE_VOCABS),
    ];
    let dtype = proptest::sample::select(vec![DType::F32, DType::F16, DType::Bf16]);
    let way = prop_oneof![
        Just(Way::Sample),
        Just(Way::Draws(1)),
        Just(Way::Draws(3)),
        (0usize..9, 0usize..5).prop_map(|(offset, pad)| Way::DeviceApi { offset, pad }),
    ];
    // now and then a batch of 64 (a decode step of a busy server)
    let rows = prop_oneof![
        9 => proptest::collection::vec(row_spec(), 1..=8),
        1 => proptest::collection::vec(row_spec(), 64..=64),
    ];
    (vocab, dtype, way, any::<bool>(), rows).prop_map(|(vocab, dtype, way, fresh, mut rows)| {
        // keep a case quick: 64 rows only up to V = 131,072
        if vocab > 131_072 {
            rows.truncate(8);
        }
        Case {
            vocab,
            dtype,
            rows,
            way,
            fresh,
        }
    })
}

fn batch_of(c: &Case) -> Batch {
    let cases: Vec<(Vec<f32>, Request)> = c
        .rows
        .iter()
        .map(|r| {
            let mut rng = Rng::new(r.seed);
            let x = styled_logits(&mut rng, c.vocab, STYLES[r.style]);
            let req = if r.mix == MIXES.len() {
                random_case(&mut rng, c.vocab).1
            } else {
                mixed_request(&mut rng, c.vocab, r.mix)
            };
            (x, req)
        })
        .collect();
    Batch::new(cases, c.dtype)
}

fn device_api(
    s: &WgpuSampler,
    batch: &Batch,
    offset: usize,
    pad: usize,
) -> Result<Vec<Vec<RowResult>>, String> {
    use wgpu::util::DeviceExt;
    let (b, v) = (batch.rows.len(), batch.vocab);
    let stride = v + pad;
    let n = offset + b * stride;
    let l = batch.logits();
    let bytes: Vec<u8> = match l.data() {
        LogitsData::F32(d) => {
            let mut out = vec![f32::NAN; n];
            for r in 0..b {
                out[offset + r * stride..][..v].copy_from_slice(&d[r * v..(r + 1) * v]);
            }
            bytemuck::cast_slice(&out).to_vec()
        }
        LogitsData::F16(d) => {
            let mut out = vec![0x7e00u16; n.next_multiple_of(2)];
            for r in 0..b {
                for i in 0..v {
                    out[offset + r * stride + i] = d[r * v + i].to_bits();
                }
            }
            bytemuck::cast_slice(&out).to_vec()
        }
        LogitsData::Bf16(d) => {
            let mut out = vec![0x7fc0u16; n.next_multiple_of(2)];
            for r in 0..b {
                for i in 0..v {
                    out[offset + r * stride + i] = d[r * v + i].to_bits();
                }
            }
            bytemuck::cast_slice(&out).to_vec()
        }
    };
    let buf = s
        .device()
        .create_buffer_init(&wgpu::util::BufferInitDescriptor {
            label: None,
            contents: &bytes,
            usage: wgpu::BufferUsages::STORAGE,
        });
    let out = s.outputs(b).map_err(|e| e.to_string())?;
    let view = DeviceLogits {
        buffer: &buf,
        dtype: batch.dtype,
        rows: b,
        vocab: v,
        row_stride: stride,
        offset,
    };
    let mut enc = s.device().create_command_encoder(&Default::default());
    s.record(&mut enc, &view, &batch.requests, &out)
        .map_err(|e| e.to_string())?;
    s.queue().submit([enc.finish()]);
    Ok(s.read(&out, &batch.requests)
        .map_err(|e| e.to_string())?
        .into_iter()
        .map(|r| vec![r])
        .collect())
}

fn run_case(c: &Case) -> Result<(), String> {
    let Some(long) = long_lived() else {
        return Ok(());
    };
    let fresh;
    let s = if c.fresh {
        // a fresh sampler (its own buffers, staging, scratch) on the shared device; in
        // the full tier on a device of its own
        fresh = if decoda::testing::full_tier() {
            WgpuSampler::new().map_err(|e| e.to_string())?
        } else {
            decoda::testing::gpu::sampler().ok_or("no adapter")?
        };
        &fresh
    } else {
        long
    };
    let batch = batch_of(c);
    let (got, entry) = match c.way {
        Way::Sample => (run_entry(s, &batch, Entry::Sample)?, Entry::Sample),
        Way::Draws(n) => (run_entry(s, &batch, Entry::Draws(n))?, Entry::Draws(n)),
        Way::DeviceApi { offset, pad } => (device_api(s, &batch, offset, pad)?, Entry::Sample),
    };
    let want = batch.expected(entry);
    let mut tally = Tally::default();
    check(&format!("{c:?}"), &batch, &got, &want, &mut tally)
}

fn cases() -> u32 {
    std::env::var("DECODA_PROPTEST_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(if decoda::testing::full_tier() {
            400
        } else {
            16
        })
}

proptest! {
    #![proptest_config(ProptestConfig {
        cases: cases(),
        failure_persistence: None,
        max_shrink_iters: 2000,
        ..ProptestConfig::default()
    })]

    #[test]
    fn wgpu_matches_the_reference(c in case()) {
        if let Err(e) = run_case(&c) {
            prop_assert!(false, "{}", e);
        }
    }
}
