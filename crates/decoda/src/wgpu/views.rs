//! Views of device buffers a sampling call reads and writes: the logits
//! ([`DeviceLogits`]), the token masks ([`DeviceMasks`]) and the outputs
//! ([`DeviceOutputs`]), each checked against the device and the call.

use std::sync::atomic::AtomicUsize;

use crate::error::{Error, Result};
use crate::logits::{DType, Logits};

/// Logits that already live on the device: `[rows, vocab]` with `row_stride` elements
/// between row starts, starting `offset` elements into `buffer` (which needs
/// `BufferUsages::STORAGE`). f16 and bf16 are read as packed 16-bit words.
#[derive(Debug, Clone, Copy)]
pub struct DeviceLogits<'a> {
    /// The buffer holding the logits.
    pub buffer: &'a wgpu::Buffer,
    /// Element type.
    pub dtype: DType,
    /// Number of rows B.
    pub rows: usize,
    /// Vocabulary size V.
    pub vocab: usize,
    /// Elements between the starts of consecutive rows (`>= vocab`).
    pub row_stride: usize,
    /// Elements before the first row.
    pub offset: usize,
}

impl<'a> DeviceLogits<'a> {
    /// The view of host logits uploaded whole into `buffer` (rows back to back, from
    /// its start), as `WgpuSampler::upload_logits` leaves them.
    pub fn packed(buffer: &'a wgpu::Buffer, logits: &Logits<'_>) -> Self {
        Self {
            buffer,
            dtype: logits.dtype(),
            rows: logits.rows(),
            vocab: logits.vocab(),
            row_stride: logits.vocab(),
            offset: 0,
        }
    }

    /// Checks the view against `device`: the row stride, the buffer's usage and size, a
    /// span addressable in 32 bits, and the adapter's binding limit (the per-call API and
    /// the head both call it).
    pub(crate) fn check(&self, device: &wgpu::Device) -> Result<()> {
        let l = self;
        if l.row_stride < l.vocab {
            return Err(Error::Shape(format!(
                "row_stride {} is below the vocabulary size {}",
                l.row_stride, l.vocab
            )));
        }
        if !l.buffer.usage().contains(wgpu::BufferUsages::STORAGE) {
            return Err(Error::Shape(
                "the logits buffer needs BufferUsages::STORAGE".into(),
            ));
        }
        let last = l
            .offset
            .checked_add(l.rows.saturating_sub(1).saturating_mul(l.row_stride))
            .and_then(|v| v.checked_add(l.vocab))
            .unwrap_or(usize::MAX);
        let need = (last as u64).saturating_mul(l.dtype.size() as u64);
        if l.rows > 0 && need > l.buffer.size() {
            return Err(Error::Shape(format!(
                "[{}, {}] {} logits with row stride {} at offset {} need {need} bytes; the \
             buffer has {}",
                l.rows,
                l.vocab,
                l.dtype,
                l.row_stride,
                l.offset,
                l.buffer.size()
            )));
        }
        if last > u32::MAX as usize {
            return Err(Error::Shape(format!(
                "the logits span {last} elements; at most 2^32 - 1 in one call"
            )));
        }
        let max_binding = device.limits().max_storage_buffer_binding_size;
        if l.buffer.size() > max_binding {
            return Err(Error::Shape(format!(
                "the logits buffer has {} bytes; this adapter binds at most {max_binding} \
             (split the batch)",
                l.buffer.size()
            )));
        }
        Ok(())
    }
}

/// Device buffers the sampler writes its results into, for up to `rows` rows:
/// `tokens` (u32 per row, always `< V`; 0 for a failed row: what a model's next
/// embedding lookup reads) and `results` (46 u32 per row: a status (0 = ok,
/// 1 = `NonFiniteLogits` with the count in the next word, 2 = `NoCandidate`,
/// 3 = `NoWinner`, 4 = the slot had finished (a head's step)), a word (the count above,
/// or for a head's step the slot's finish: 0 none, 1 stop token, 2 `max_tokens`), then
/// 44 words of log-probabilities: chosen logprob (f32 bits), rank, number listed, then up
/// to 20 pairs of token and logprob). Both have `STORAGE | COPY_SRC` usage. Outputs made
/// by [`super::WgpuSampler::outputs_kept`] also hold, after the `[rows, 46]` results of a call of
/// B rows (at word `46 B`), B kept areas of 2,050 words: the kept set's size, the tokens
/// listed (n), then n pairs of token and probability (f32 bits), most likely first.
#[derive(Debug)]
pub struct DeviceOutputs {
    pub(crate) rows: usize,
    /// V of the last call recorded into these buffers (what [`super::WgpuSampler::read`]
    /// checks the tokens against).
    pub(crate) vocab: AtomicUsize,
    /// Words of `results` (rows x 46, and the many-draws area after it).
    pub(crate) res_words: usize,
    pub(crate) tokens: wgpu::Buffer,
    pub(crate) results: wgpu::Buffer,
    pub(crate) readback: wgpu::Buffer,
}

impl DeviceOutputs {
    /// How many rows these buffers hold.
    pub fn rows(&self) -> usize {
        self.rows
    }
    /// Token ids, u32 `[rows]`.
    pub fn tokens(&self) -> &wgpu::Buffer {
        &self.tokens
    }
    /// Status and log-probabilities, u32 `[rows, 46]` (see the type's docs).
    pub fn results(&self) -> &wgpu::Buffer {
        &self.results
    }
}

/// Token masks on the device for [`super::WgpuSampler::record_masked`] and
/// [`crate::wgpu::WgpuHead::record_step_masked`]: row `r`'s mask is the `ceil(V / 32)`
/// u32 words at word `offset + r * row_stride` of `buffer` (a storage buffer the caller
/// fills, for example from a grammar engine's kernel), bit `i % 32` of word `i / 32` set
/// for an allowed token `i` — the layout of [`crate::Request::allowed`]. The kernels
/// read each row's mask where they read its logits; nothing passes through the host.
#[derive(Debug, Clone, Copy)]
pub struct DeviceMasks<'a> {
    /// The buffer (usage `STORAGE`).
    pub buffer: &'a wgpu::Buffer,
    /// Words from the start of the buffer to row 0's mask.
    pub offset: usize,
    /// Words between consecutive rows' masks (at least `ceil(V / 32)`).
    pub row_stride: usize,
}

impl DeviceMasks<'_> {
    /// Checks the view against `rows` rows of `vocab` tokens.
    pub(crate) fn check(&self, rows: usize, vocab: usize) -> Result<()> {
        let w = vocab.div_ceil(32);
        if self.row_stride < w {
            return Err(Error::InvalidParameter {
                row: 0,
                field: "allowed",
                value: format!("masks {} words apart for V = {vocab}", self.row_stride),
                expected: "a row stride of at least ceil(V / 32) words",
            });
        }
        let need = (self.offset + rows.saturating_sub(1) * self.row_stride + w) as u64 * 4;
        if rows > 0 && need > self.buffer.size() {
            return Err(Error::Shape(format!(
                "masks of {rows} rows need {need} bytes; the buffer has {}",
                self.buffer.size()
            )));
        }
        if (self.offset + rows * self.row_stride) > u32::MAX as usize {
            return Err(Error::Shape("mask offsets past 2^32 words".into()));
        }
        Ok(())
    }
}
