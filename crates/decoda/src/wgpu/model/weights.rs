//! Matrices on the device in their checkpoint format: f32 words, 16-bit values two to a
//! word (each row starting on a word), or MLX affine codes followed by the scales and
//! biases.

use crate::error::{Error, Result};
use crate::moe::weights::WeightData;
use crate::moe::ExpertWeights;

/// A matrix on the device.
#[derive(Debug, Clone)]
pub(super) struct Mat {
    pub(super) buf: wgpu::Buffer,
    pub(super) dtype: u32,
    pub(super) bits: u32,
    pub(super) group: u32,
    pub(super) row_words: u32,
    pub(super) w_off: u32,
    pub(super) s_off: u32,
    pub(super) b_off: u32,
    pub(super) out: usize,
    pub(super) inp: usize,
}

/// Uploads one or more `[1, out, in]` matrices of one format as rows of one matrix
/// (`swiglu` reads gate rows `0 .. I` and up rows `I .. 2I`).
pub(super) fn upload(device: &wgpu::Device, name: &str, parts: &[&ExpertWeights]) -> Result<Mat> {
    let first = parts[0];
    let inp = first.in_features();
    let mut main: Vec<u32> = Vec::new();
    let mut scales: Vec<u32> = Vec::new();
    let mut biases: Vec<u32> = Vec::new();
    let (mut dtype, mut bits, mut group, mut row_words) = (0, 0, 1, inp as u32);
    let mut out = 0;
    for w in parts {
        if w.experts() != 1 || w.in_features() != inp || w.dtype() != first.dtype() {
            return Err(Error::Model(format!(
                "{name}: parts of different shapes or formats"
            )));
        }
        out += w.out_features();
        match w.data() {
            WeightData::F32(v) => main.extend(v.iter().map(|x| x.to_bits())),
            WeightData::Bf16(v) => {
                dtype = 1;
                row_words = inp.div_ceil(2) as u32;
                push_rows(&mut main, v.iter().map(|x| x.to_bits()), inp);
            }
            WeightData::F16(v) => {
                dtype = 2;
                row_words = inp.div_ceil(2) as u32;
                push_rows(&mut main, v.iter().map(|x| x.to_bits()), inp);
            }
            WeightData::Affine {
                q,
                packed,
                scales: s,
                biases: b,
            } => {
                (dtype, bits, group) = (3, q.bits, q.group as u32);
                row_words = q.row_words(inp) as u32;
                main.extend_from_slice(packed);
                scales.extend(s.iter().map(|x| x.to_bits()));
                biases.extend(b.iter().map(|x| x.to_bits()));
            }
        }
    }
    let w_off = 0u32;
    let s_off = main.len() as u32;
    let b_off = s_off + scales.len() as u32;
    main.extend(scales);
    main.extend(biases);
    let bytes = (main.len() * 4) as u64;
    let limit = device.limits().max_storage_buffer_binding_size;
    if bytes > limit {
        return Err(Error::Model(format!(
            "{name} takes {bytes} bytes on the device; this adapter binds at most {limit}"
        )));
    }
    Ok(Mat {
        buf: init_buffer(device, name, &main, wgpu::BufferUsages::STORAGE),
        dtype,
        bits,
        group,
        row_words,
        w_off,
        s_off,
        b_off,
        out,
        inp,
    })
}

/// 16-bit values two to a word, each row starting on a word.
fn push_rows(all: &mut Vec<u32>, it: impl Iterator<Item = u16>, inp: usize) {
    let v: Vec<u16> = it.collect();
    for row in v.chunks(inp) {
        for pair in row.chunks(2) {
            all.push(u32::from(pair[0]) | (u32::from(*pair.get(1).unwrap_or(&0)) << 16));
        }
    }
}

pub(super) fn init_buffer(
    device: &wgpu::Device,
    label: &str,
    words: &[u32],
    usage: wgpu::BufferUsages,
) -> wgpu::Buffer {
    use wgpu::util::DeviceExt;
    let contents: &[u8] = if words.is_empty() {
        &[0u8; 4]
    } else {
        bytemuck::cast_slice(words)
    };
    device.create_buffer_init(&wgpu::util::BufferInitDescriptor {
        label: Some(label),
        contents,
        usage,
    })
}
