//! Matrices on the device in their checkpoint format: f32 words, 16-bit values two to a
//! word (each row starting on a word), or MLX affine codes followed by the scales and
//! biases.

use crate::error::{Error, Result};
use crate::moe::weights::WeightData;
use crate::moe::ExpertWeights;
use crate::wgpu::rows;

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
    if parts
        .iter()
        .any(|w| w.out_features() != first.out_features())
    {
        return Err(Error::Model(format!(
            "{name}: parts of different shapes or formats"
        )));
    }
    let lists = parts
        .iter()
        .map(|w| upload_words(w))
        .collect::<Result<_>>()?;
    upload_lists(device, name, parts, lists, limit)
}

/// Uploads matrices of one input width and format stacked by rows (q, k and v: one
/// matrix whose rows are q's, then k's, then v's), in parts of at most `limit` bytes,
/// each of whole rows, laid out as [`upload`] lays out one matrix.
pub(super) fn upload_stacked(
    device: &wgpu::Device,
    name: &str,
    mats: &[&ExpertWeights],
    limit: u64,
) -> Result<Mat> {
    let mut rows = Vec::new();
    for w in mats {
        rows.extend(upload_words(w)?);
    }
    upload_lists(device, name, mats, vec![rows], limit)
}

/// One row's words on the device: values or codes (padded), scales, biases.
type RowWords = (Vec<u32>, Vec<u32>, Vec<u32>);

/// Uploads `lists` (rows of `mats`, each list as long as the first) in parts of whole
/// rows of at most `limit` bytes: a part holds rows `lo .. hi` of every list, their
/// words, then their scales, then their biases.
fn upload_lists(
    device: &wgpu::Device,
    name: &str,
    mats: &[&ExpertWeights],
    lists: Vec<Vec<RowWords>>,
    limit: u64,
) -> Result<Mat> {
    let first = mats[0];
    let inp = first.in_features();
    if mats
        .iter()
        .any(|w| w.experts() != 1 || w.in_features() != inp || w.dtype() != first.dtype())
    {
        return Err(Error::Model(format!(
            "{name}: parts of different shapes or formats"
        )));
    }
    let (dtype, bits, group) = match first.data() {
        WeightData::F32(_) => (0, 0, 1),
        WeightData::Bf16(_) => (1, 0, 1),
        WeightData::F16(_) => (2, 0, 1),
        WeightData::Affine { q, .. } => (3, q.bits, q.group as u32),
    };
    let row = &lists[0][0];
    let row_words = row.0.len();
    // bytes of one row of the part (of each list)
    let row_bytes = ((row_words + row.1.len() + row.2.len()) * 4 * lists.len()) as u64;
    let per = (limit / row_bytes) as usize;
    if per == 0 {
        return Err(Error::Model(format!(
            "{name}: one row takes {row_bytes} bytes on the device; this adapter binds at \
             most {limit}"
        )));
    }
    let out = lists[0].len();
    let mut parts = Vec::new();
    for lo in (0..out).step_by(per) {
        let hi = (lo + per).min(out);
        let rows = || lists.iter().flat_map(|l| &l[lo..hi]);
        let mut main: Vec<u32> = rows().flat_map(|r| r.0.iter().copied()).collect();
        let s_off = main.len() as u32;
        main.extend(rows().flat_map(|r| r.1.iter().copied()));
        let b_off = main.len() as u32;
        main.extend(rows().flat_map(|r| r.2.iter().copied()));
        // read as vec4<u32> by the matrix products: whole vec4s
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

/// A matrix's rows as the device holds them ([`crate::wgpu::rows`]): each row's words,
/// scales and biases.
fn upload_words(w: &ExpertWeights) -> Result<Vec<RowWords>> {
    if w.experts() != 1 {
        return Err(Error::Model("a matrix of more than one expert".into()));
    }
    Ok((0..w.out_features())
        .map(|r| {
            let (mut words, mut scales, mut biases) = (Vec::new(), Vec::new(), Vec::new());
            rows::push_rows(&mut words, w, r, r + 1);
            rows::push_side(&mut scales, w, r, r + 1, false);
            rows::push_side(&mut biases, w, r, r + 1, true);
            (words, scales, biases)
        })
        .collect())
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
