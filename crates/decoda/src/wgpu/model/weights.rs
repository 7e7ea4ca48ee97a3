//! Matrices on the device in their checkpoint format: f32 words, 16-bit values two to a
//! word (each row starting on a word), or MLX affine codes followed by the scales and
//! biases.

use crate::error::{Error, Result};
use crate::moe::weights::WeightData;
use crate::moe::ExpertWeights;

/// A matrix on the device, in one or more parts of whole rows.
#[derive(Debug, Clone)]
pub(super) struct Mat {
    pub(super) dtype: u32,
    pub(super) bits: u32,
    pub(super) group: u32,
    pub(super) row_words: u32,
    /// Output rows (for a gate-and-up pair: the intermediate width, each part holding
    /// its gate rows and then the same up rows).
    pub(super) out: usize,
    pub(super) inp: usize,
    pub(super) parts: Vec<Part>,
}

impl Mat {
    /// Bytes one row takes on the device (values or codes, and for affine matrices the
    /// row's scales and biases as f32 words).
    pub(super) fn row_bytes(&self) -> u64 {
        let side = if self.dtype == 3 {
            2 * (self.inp as u64 / u64::from(self.group))
        } else {
            0
        };
        4 * (u64::from(self.row_words) + side)
    }
}

/// Rows `first .. first + rows` of a matrix in a buffer of their own: the codes or
/// values from word `w_off`, then the scales and biases.
#[derive(Debug, Clone)]
pub(super) struct Part {
    pub(super) buf: wgpu::Buffer,
    pub(super) first: usize,
    pub(super) rows: usize,
    pub(super) w_off: u32,
    pub(super) s_off: u32,
    pub(super) b_off: u32,
}

/// Uploads a `[1, out, in]` matrix, or with two parts a gate-and-up pair of the same
/// shape (`swiglu` reads gate row `o` at part row `o` and up row `o` at part row
/// `rows + o`), in parts of at most `limit` bytes, each of whole rows.
pub(super) fn upload(
    device: &wgpu::Device,
    name: &str,
    parts: &[&ExpertWeights],
    limit: u64,
) -> Result<Mat> {
    let first = parts[0];
    let inp = first.in_features();
    let out = first.out_features();
    for w in parts {
        if w.experts() != 1
            || w.in_features() != inp
            || w.out_features() != out
            || w.dtype() != first.dtype()
        {
            return Err(Error::Model(format!(
                "{name}: parts of different shapes or formats"
            )));
        }
    }
    // rows of values padded to whole vec4<u32> (the matrix products' loads; affine
    // rows are already: their inputs come in whole groups of 32 or more)
    let (dtype, bits, group, row_words, side) = match first.data() {
        WeightData::F32(_) => (0, 0, 1, inp.next_multiple_of(4), 0),
        WeightData::Bf16(_) => (1, 0, 1, inp.div_ceil(2).next_multiple_of(4), 0),
        WeightData::F16(_) => (2, 0, 1, inp.div_ceil(2).next_multiple_of(4), 0),
        WeightData::Affine { q, .. } => (
            3,
            q.bits,
            q.group as u32,
            q.row_words(inp),
            2 * q.row_groups(inp),
        ),
    };
    // bytes of one row of the part (of each matrix of a pair)
    let row_bytes = ((row_words + side) * 4 * parts.len()) as u64;
    let per = (limit / row_bytes) as usize;
    if per == 0 {
        return Err(Error::Model(format!(
            "{name}: one row takes {row_bytes} bytes on the device; this adapter binds at \
             most {limit}"
        )));
    }
    let mut out_parts = Vec::new();
    for lo in (0..out).step_by(per) {
        let hi = (lo + per).min(out);
        let mut main: Vec<u32> = Vec::new();
        let mut scales: Vec<u32> = Vec::new();
        let mut biases: Vec<u32> = Vec::new();
        for w in parts {
            match w.data() {
                WeightData::F32(v) => {
                    for row in v[lo * inp..hi * inp].chunks(inp) {
                        main.extend(row.iter().map(|x| x.to_bits()));
                        main.resize(main.len() + row_words - inp, 0);
                    }
                }
                WeightData::Bf16(v) => push_rows(
                    &mut main,
                    v[lo * inp..hi * inp].iter().map(|x| x.to_bits()),
                    inp,
                    row_words,
                ),
                WeightData::F16(v) => push_rows(
                    &mut main,
                    v[lo * inp..hi * inp].iter().map(|x| x.to_bits()),
                    inp,
                    row_words,
                ),
                WeightData::Affine {
                    packed,
                    scales: sc,
                    biases: bi,
                    ..
                } => {
                    main.extend_from_slice(&packed[lo * row_words..hi * row_words]);
                    let g = side / 2;
                    scales.extend(sc[lo * g..hi * g].iter().map(|x| x.to_bits()));
                    biases.extend(bi[lo * g..hi * g].iter().map(|x| x.to_bits()));
                }
            }
        }
        let s_off = main.len() as u32;
        let b_off = s_off + scales.len() as u32;
        main.extend(scales);
        main.extend(biases);
        // read as vec4<u32> by the matrix products: whole vec4s
        main.resize(main.len().next_multiple_of(4), 0);
        let label = format!("{name} rows {lo}..{hi}");
        out_parts.push(Part {
            buf: init_buffer(device, &label, &main, wgpu::BufferUsages::STORAGE),
            first: lo,
            rows: hi - lo,
            w_off: 0,
            s_off,
            b_off,
        });
    }
    Ok(Mat {
        dtype,
        bits,
        group,
        row_words: row_words as u32,
        out,
        inp,
        parts: out_parts,
    })
}

/// One row's words on the device: values or codes (padded), scales, biases.
type RowWords = (Vec<u32>, Vec<u32>, Vec<u32>);

/// Uploads matrices of one input width and format stacked by rows (q, k and v: one
/// matrix whose rows are q's, then k's, then v's), in parts of at most `limit` bytes,
/// each of whole rows, laid out as [`upload`] lays out one matrix.
pub(super) fn upload_stacked(
    device: &wgpu::Device,
    name: &str,
    mats: &[&ExpertWeights],
    limit: u64,
) -> Result<Mat> {
    let first = mats[0];
    let inp = first.in_features();
    if mats
        .iter()
        .any(|w| w.experts() != 1 || w.in_features() != inp || w.dtype() != first.dtype())
    {
        return Err(Error::Model(format!(
            "{name}: matrices of different input widths or formats"
        )));
    }
    // each row's words (values or codes, padded), scales and biases
    let mut rows: Vec<RowWords> = Vec::new();
    for w in mats {
        let one = upload_words(w)?;
        rows.extend(one);
    }
    let (dtype, bits, group) = match first.data() {
        WeightData::F32(_) => (0, 0, 1),
        WeightData::Bf16(_) => (1, 0, 1),
        WeightData::F16(_) => (2, 0, 1),
        WeightData::Affine { q, .. } => (3, q.bits, q.group as u32),
    };
    let row_words = rows[0].0.len();
    let side = rows[0].1.len() + rows[0].2.len();
    let row_bytes = ((row_words + side) * 4) as u64;
    let per = (limit / row_bytes) as usize;
    if per == 0 {
        return Err(Error::Model(format!(
            "{name}: one row takes {row_bytes} bytes on the device; this adapter binds at \
             most {limit}"
        )));
    }
    let out = rows.len();
    let mut parts = Vec::new();
    for lo in (0..out).step_by(per) {
        let hi = (lo + per).min(out);
        let mut main: Vec<u32> = rows[lo..hi].iter().flat_map(|r| r.0.clone()).collect();
        let s_off = main.len() as u32;
        main.extend(rows[lo..hi].iter().flat_map(|r| r.1.clone()));
        let b_off = main.len() as u32;
        main.extend(rows[lo..hi].iter().flat_map(|r| r.2.clone()));
        main.resize(main.len().next_multiple_of(4), 0);
        let label = format!("{name} rows {lo}..{hi}");
        parts.push(Part {
            buf: init_buffer(device, &label, &main, wgpu::BufferUsages::STORAGE),
            first: lo,
            rows: hi - lo,
            w_off: 0,
            s_off,
            b_off,
        });
    }
    Ok(Mat {
        dtype,
        bits,
        group,
        row_words: row_words as u32,
        out,
        inp,
        parts,
    })
}

/// A matrix's rows as [`upload`] lays them out: each row's words (values padded to whole
/// vec4<u32>, or codes), its scales and its biases (affine).
fn upload_words(w: &ExpertWeights) -> Result<Vec<RowWords>> {
    let (out, inp) = (w.out_features(), w.in_features());
    let mut rows = Vec::with_capacity(out);
    match w.data() {
        WeightData::F32(v) => {
            let rw = inp.next_multiple_of(4);
            for row in v.chunks(inp) {
                let mut words: Vec<u32> = row.iter().map(|x| x.to_bits()).collect();
                words.resize(rw, 0);
                rows.push((words, Vec::new(), Vec::new()));
            }
        }
        WeightData::Bf16(v) => {
            let rw = inp.div_ceil(2).next_multiple_of(4);
            for row in v.chunks(inp) {
                let mut words = Vec::new();
                push_rows(&mut words, row.iter().map(|x| x.to_bits()), inp, rw);
                rows.push((words, Vec::new(), Vec::new()));
            }
        }
        WeightData::F16(v) => {
            let rw = inp.div_ceil(2).next_multiple_of(4);
            for row in v.chunks(inp) {
                let mut words = Vec::new();
                push_rows(&mut words, row.iter().map(|x| x.to_bits()), inp, rw);
                rows.push((words, Vec::new(), Vec::new()));
            }
        }
        WeightData::Affine {
            q,
            packed,
            scales,
            biases,
        } => {
            let (rw, g) = (q.row_words(inp), q.row_groups(inp));
            for r in 0..out {
                rows.push((
                    packed[r * rw..(r + 1) * rw].to_vec(),
                    scales[r * g..(r + 1) * g]
                        .iter()
                        .map(|x| x.to_bits())
                        .collect(),
                    biases[r * g..(r + 1) * g]
                        .iter()
                        .map(|x| x.to_bits())
                        .collect(),
                ));
            }
        }
    }
    if rows.len() != out {
        return Err(Error::Model("a matrix of the wrong size".into()));
    }
    Ok(rows)
}

/// 16-bit values two to a word, each row `row_words` words (zeros after its values).
fn push_rows(all: &mut Vec<u32>, it: impl Iterator<Item = u16>, inp: usize, row_words: usize) {
    let v: Vec<u16> = it.collect();
    for row in v.chunks(inp) {
        let start = all.len();
        for pair in row.chunks(2) {
            all.push(u32::from(pair[0]) | (u32::from(*pair.get(1).unwrap_or(&0)) << 16));
        }
        all.resize(start + row_words, 0);
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
