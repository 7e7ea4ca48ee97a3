//! The wgpu backend on real decode shapes (B = 1, 2, 3, 8, 64 at V = 32,000 to 262,144;
//! f32, f16, bf16; every logit style and parameter mix) through every entry point a user
//! has — `sample`, `sample_draws` (1 and 3 draws), and the device API (logits at an
//! offset with a row stride, recorded into the caller's encoder) — against the
//! reference, on fresh samplers and on long-lived ones that just served a larger and then
//! a smaller call. Also the regression case of the many-draws bug (V = 65,536).

use decoda::reference::reference_row;
use decoda::testing::full_tier;
use decoda::testing::shapes::{
    check, decode_batch, decode_shapes_part, Batch, Entry, Tally, DECODE_BATCHES, DECODE_VOCABS,
    DTYPES, ENTRIES,
};
use decoda::testing::Rng;
use decoda::wgpu::{DeviceLogits, WgpuSampler};
use decoda::{Backend, LogitsData, Request, SamplingParams};

/// A fresh sampler on the calling thread's shared test device (`decoda::testing::gpu`).
fn sampler() -> Option<WgpuSampler> {
    decoda::testing::gpu::sampler()
}

/// A fresh sampler: on the shared test device in the quick tier, on a device of its own
/// (every pipeline compiled or loaded anew) in the full tier.
fn make() -> Result<Box<dyn Backend>, String> {
    if full_tier() {
        return Ok(Box::new(WgpuSampler::new().map_err(|e| e.to_string())?));
    }
    Ok(Box::new(sampler().ok_or("no adapter")?))
}

/// `sample`, `sample_draws(1)` and `sample_draws(3)` at every decode shape, fresh and
/// long-lived: half of the cases (by size, the largest first); the other half is
/// [`decode_shapes_every_entry_point_other_half`]. Two tests, so the harness runs the
/// halves side by side: as one, the suite's longest test (about 25 s on lavapipe on two
/// cores) ran alone at the end of the run.
#[test]
fn decode_shapes_every_entry_point() {
    decode_shapes_half(0);
}

/// The other half of [`decode_shapes_every_entry_point`]'s cases (by size, the second
/// largest first).
#[test]
fn decode_shapes_every_entry_point_other_half() {
    decode_shapes_half(1);
}

fn decode_shapes_half(part: usize) {
    if sampler().is_none() {
        return;
    }
    let t = decode_shapes_part(
        &make,
        DECODE_VOCABS,
        DECODE_BATCHES,
        ENTRIES,
        12,
        full_tier(),
        (part, 2),
        |case| eprintln!("ok {case}"),
    )
    .unwrap_or_else(|e| panic!("{e}"));
    eprintln!("wgpu, part {part} of 2: {t:?}");
}

/// The batch's bytes inside a larger buffer: `offset` elements of padding first, rows
/// `stride` elements apart (the padding holds NaN, which must never be read).
fn padded_bytes(batch: &Batch, offset: usize, stride: usize) -> Vec<u8> {
    let v = batch.vocab;
    let b = batch.rows.len();
    let l = batch.logits();
    let n = offset + b * stride;
    match l.data() {
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
    }
}

/// Records the batch through the device API (logits at an odd offset, padded rows) into
/// a caller's encoder, submits, and reads the results.
fn record_and_read(s: &WgpuSampler, batch: &Batch, salt: usize) -> Vec<Vec<decoda::RowResult>> {
    use wgpu::util::DeviceExt;
    let offset = 3 + salt % 5;
    let stride = batch.vocab + 1 + salt % 7;
    let bytes = padded_bytes(batch, offset, stride);
    let buf = s
        .device()
        .create_buffer_init(&wgpu::util::BufferInitDescriptor {
            label: Some("test logits"),
            contents: &bytes,
            usage: wgpu::BufferUsages::STORAGE,
        });
    let out = s.outputs(batch.rows.len()).unwrap();
    let view = DeviceLogits {
        buffer: &buf,
        dtype: batch.dtype,
        rows: batch.rows.len(),
        vocab: batch.vocab,
        row_stride: stride,
        offset,
    };
    let mut enc = s.device().create_command_encoder(&Default::default());
    s.record(&mut enc, &view, &batch.requests, &out).unwrap();
    s.queue().submit([enc.finish()]);
    s.read(&out, &batch.requests)
        .unwrap()
        .into_iter()
        .map(|r| vec![r])
        .collect()
}

/// The device API at every decode shape, on one sampler that served the largest shape
/// first (checked like the rest) and a small call before each case, and on a fresh
/// sampler for the first case of each vocabulary (every case in the full tier).
#[test]
fn decode_shapes_device_api() {
    let Some(long) = sampler() else { return };
    let mut rng = Rng::new(77);
    let mut tally = Tally::default();
    let full = decoda::testing::full_tier();
    let last = DECODE_VOCABS.len() - 1;
    // quick tier: B = 1 and 3 at every vocabulary, and 64 at the largest and at the one
    // that is not a multiple of 4 (50,257: its rows start at every offset mod 4); the
    // per-call entry points take every B, and B = 64 at every other vocabulary
    let odd = DECODE_VOCABS.iter().position(|&v| v % 4 != 0).unwrap();
    let mut cells: Vec<(usize, usize)> = (0..DECODE_VOCABS.len())
        .flat_map(|vi| (0..DECODE_BATCHES.len()).map(move |bi| (vi, bi)))
        .filter(|&(vi, bi)| {
            let b = DECODE_BATCHES[bi];
            full || !(b == 2 || b == 8 || (b == 64 && vi != last && vi != odd))
        })
        .collect();
    // the largest first: every later case runs on buffers a larger call grew
    let k = (0..cells.len())
        .max_by_key(|&k| DECODE_VOCABS[cells[k].0] * DECODE_BATCHES[cells[k].1])
        .unwrap();
    let first = cells.remove(k);
    cells.insert(0, first);
    let small = Batch::new(decode_batch(&mut rng, 9, 1, 3), decoda::DType::F16);
    for (n, &(vi, bi)) in cells.iter().enumerate() {
        let (v, b) = (DECODE_VOCABS[vi], DECODE_BATCHES[bi]);
        let salt = vi * 5 + bi;
        let dtype = DTYPES[(vi + 2 * bi) % 3];
        let batch = Batch::new(decode_batch(&mut rng, v, b, salt), dtype);
        let want = batch.expected(Entry::Sample);
        let label = format!("device API V={v} B={b} {dtype}");
        // a fresh sampler for the first batch of each vocabulary (every cell in the
        // full tier)
        if bi == 0 || full {
            let fresh = sampler().unwrap();
            let got = record_and_read(&fresh, &batch, salt);
            check(&format!("{label} (fresh)"), &batch, &got, &want, &mut tally)
                .unwrap_or_else(|e| panic!("{e}"));
        }
        record_and_read(&long, &small, salt);
        let got = record_and_read(&long, &batch, salt + 1);
        let after = if n == 0 {
            "the largest, after a small call"
        } else {
            "long-lived"
        };
        check(
            &format!("{label} ({after})"),
            &batch,
            &got,
            &want,
            &mut tally,
        )
        .unwrap_or_else(|e| panic!("{e}"));
    }
    eprintln!("device API: {tally:?}");
}

/// The reported case: one row of V = 65,536 normal logits (sd 3), plain temperature
/// sampling at seed 0 and top-k 1 at seed 5. Before the fix the many-draws path (which
/// `decoda sample` used for every row) returned token 0 for top-k 1 and never an id above
/// ~23,800; the argmax is a fact independent of any sampler.
#[test]
fn regression_many_draws_large_vocabulary() {
    let Some(s) = sampler() else { return };
    let v = 65_536;
    // the first data seed whose winner lies in the upper half of the row
    let (row, argmax) = (1..)
        .map(|seed| {
            let mut rng = Rng::new(seed);
            let row: Vec<f32> = (0..v).map(|_| 3.0 * rng.normal()).collect();
            let argmax = (0..v)
                .max_by(|&a, &b| row[a].total_cmp(&row[b]).then(b.cmp(&a)))
                .unwrap() as u32;
            (row, argmax)
        })
        .find(|(_, a)| *a >= 32_768)
        .unwrap();
    let mut data = row.clone();
    data.extend_from_slice(&row);
    let reqs = [
        Request::new(SamplingParams::default(), 0),
        Request::new(
            SamplingParams {
                top_k: 1,
                ..Default::default()
            },
            5,
        ),
    ];
    let l = decoda::Logits::f32(&data, 2, v).unwrap();
    let want: Vec<u32> = reqs
        .iter()
        .map(|r| reference_row(&row, r).0.unwrap().token)
        .collect();
    assert_eq!(want[1], argmax);
    let one = s.sample(&l, &reqs).unwrap();
    let draws = s.sample_draws(&l, &reqs, 3).unwrap();
    for r in 0..2 {
        assert_eq!(one[r].as_ref().unwrap().token, want[r], "sample, row {r}");
        assert_eq!(
            draws[r][0].as_ref().unwrap().token,
            want[r],
            "sample_draws, row {r}"
        );
    }
    for (d, t) in draws[1].iter().enumerate() {
        assert_eq!(t.as_ref().unwrap().token, argmax, "top-k 1, draw {d}");
    }
    // plain sampling: 200 draws, each the reference's, reaching the whole row
    let first = decoda::Logits::f32(&row, 1, v).unwrap();
    let many = s.sample_draws(&first, &reqs[..1], 200).unwrap();
    let mut top = 0;
    for (d, got) in many[0].iter().enumerate() {
        let mut r = reqs[0].clone();
        r.state.step = d as u64;
        let want = reference_row(&row, &r).0.unwrap().token;
        let got = got.as_ref().unwrap().token;
        assert_eq!(got, want, "draw {d}");
        top = top.max(got);
    }
    assert!(top >= 32_768, "the largest of 200 draws is {top}");
}
