//! The host API: host logits in, results read back ([`Backend`] for [`WgpuSampler`]),
//! and reading a device call's results.

use crate::backend::Backend;
use crate::error::{Error, Result, RowError};
use crate::logits::Gathered;
use crate::logits::{Logits, LogitsData};
use crate::params::{Request, SamplingParams, MAX_LOGPROBS};
use crate::pipeline::{
    self as pl, Kept, KeptToken, Row, RowResult, Sample, TokenLogprobs, TopLogprob,
};
use crate::reference::ReferenceSampler;

use super::buffers::make_buffer;
use super::device::poisoned;
use super::kernels::StepStamps;
use super::layout::*;
use super::sampler::WgpuSampler;
use super::views::{DeviceLogits, DeviceOutputs};

/// Rows per piece when [`Backend::sample`] splits a large host batch.
const HOST_PIECE_ROWS: usize = 1024;
/// Most draw tokens one host call of `sample_draws` brings back.
const MAX_DRAW_WORDS: usize = 1 << 24;

impl WgpuSampler {
    /// Copies the results of the last call recorded into `out` to the host (one submit
    /// and a blocking map) and turns them into per-row results.
    pub fn read(&self, out: &DeviceOutputs, requests: &[Request]) -> Result<Vec<RowResult>> {
        let b = requests.len();
        if b > out.rows {
            return Err(Error::Shape(format!(
                "{b} requests for outputs of {} rows",
                out.rows
            )));
        }
        if b == 0 {
            return Ok(Vec::new());
        }
        let mut enc = self
            .ctx
            .device()
            .create_command_encoder(&wgpu::CommandEncoderDescriptor { label: None });
        let kept = requests.iter().any(|r| r.params.kept.is_some());
        if b * res_stride(kept, 0) > out.res_words {
            return Err(Error::Shape(
                "requests asking for the kept distribution read outputs made by \
                 WgpuSampler::outputs_kept"
                    .into(),
            ));
        }
        let bytes = copy_results(&mut enc, out, b, b * res_stride(kept, 0));
        self.ctx.queue().submit([enc.finish()]);
        let words = self.ctx.read_back(&out.readback, bytes)?;
        let vocab = out.vocab.load(std::sync::atomic::Ordering::Relaxed);
        Ok(parse_results(
            &words,
            requests.iter().map(|r| &r.params),
            vocab,
        ))
    }

    /// One host call: uploads the logits into the sampler's buffer, records the call
    /// (with `draws` > 0, the many-draws kernel too), copies the results into the readback
    /// buffer in the same encoder, submits once and maps them. Returns the words: tokens
    /// `[B]`, results `[B, 46]`, then (draws) `[B, draws]` tokens.
    fn host_call(&self, logits: &Logits<'_>, rows: &[Row<'_>], draws: usize) -> Result<Vec<u32>> {
        let _call = self.host_call.lock().map_err(|_| poisoned())?;
        let b = logits.rows();
        let kept = rows.iter().any(|r| r.params.kept.is_some());
        let res_words = b * res_stride(kept, draws);
        let (buf, out) = {
            let mut sc = self.scratch.lock().map_err(|_| poisoned())?;
            if sc
                .host_logits
                .ensure(self.ctx.device(), logits_size(logits))
            {
                sc.generation += 1;
            }
            self.write_logits(&sc.host_logits.buf, logits);
            let out = match sc.host_out.take() {
                Some(o) if o.rows >= b && o.res_words >= res_words => o,
                _ => self.outputs_for(b.max(64), draws.max(res_words.div_ceil(b.max(64))))?,
            };
            (sc.host_logits.buf.clone(), out)
        };
        let view = DeviceLogits::packed(&buf, logits);
        let result = self
            .ctx
            .submit_checked(|enc| {
                self.record_inner(enc, &view, rows, &out, StepStamps::None, draws)?;
                Ok(copy_results(enc, &out, b, res_words))
            })
            .and_then(|bytes| self.ctx.read_back(&out.readback, bytes));
        self.scratch.lock().map_err(|_| poisoned())?.host_out = Some(out);
        result
    }

    /// Rows per host call: as many as one storage binding holds, at most `cap`.
    fn rows_per_call(&self, logits: &Logits<'_>, cap: usize) -> Result<usize> {
        let limits = self.ctx.device().limits();
        let max_bytes = limits
            .max_storage_buffer_binding_size
            .min(limits.max_buffer_size);
        let row_bytes = (logits.vocab() * logits.dtype().size()) as u64;
        if row_bytes + 4 > max_bytes {
            return Err(Error::Shape(format!(
                "one row of {} {} logits exceeds this adapter's largest storage binding \
                 ({max_bytes} bytes)",
                logits.vocab(),
                logits.dtype()
            )));
        }
        Ok(((max_bytes - 4) / row_bytes).clamp(1, cap as u64) as usize)
    }

    /// Uploads host logits into a new device buffer (STORAGE usage), for benchmarks and
    /// tests of the device API.
    pub fn upload_logits(&self, logits: &Logits<'_>) -> wgpu::Buffer {
        let buf = make_buffer(
            self.ctx.device(),
            "decoda logits",
            logits_size(logits),
            wgpu::BufferUsages::STORAGE | wgpu::BufferUsages::COPY_DST,
        );
        self.write_logits(&buf, logits);
        buf
    }

    /// Writes the logits into `buf` as the shader reads them (f32 words, or 16-bit values
    /// two to a word), straight from the caller's slice; a last half word is padded.
    fn write_logits(&self, buf: &wgpu::Buffer, logits: &Logits<'_>) {
        use half::slice::HalfFloatSliceExt;
        let bytes: &[u8] = match logits.data() {
            LogitsData::F32(d) => bytemuck::cast_slice(d),
            LogitsData::F16(d) => bytemuck::cast_slice(d.reinterpret_cast()),
            LogitsData::Bf16(d) => bytemuck::cast_slice(d.reinterpret_cast()),
        };
        let whole = bytes.len() / 4 * 4;
        if whole > 0 {
            self.ctx.queue().write_buffer(buf, 0, &bytes[..whole]);
        }
        if whole < bytes.len() {
            let mut tail = [0u8; 4];
            tail[..bytes.len() - whole].copy_from_slice(&bytes[whole..]);
            self.ctx.queue().write_buffer(buf, whole as u64, &tail);
        }
    }
}

impl WgpuSampler {
    /// A call with rows whose DRY window is longer than the kernels hold
    /// ([`crate::pipeline::Row::beyond_device`]): those rows are drawn on the host from
    /// the host's logits by the contract's own oracle ([`ReferenceSampler`], from the
    /// neutral layer: the backends never name each other), the others on the device;
    /// results in the rows' order.
    fn sample_rows_split(&self, logits: &Logits<'_>, rows: &[Row<'_>]) -> Result<Vec<RowResult>> {
        let (host, device): (Vec<usize>, Vec<usize>) =
            (0..rows.len()).partition(|&i| rows[i].beyond_device().is_some());
        let pick = |ids: &[usize]| ids.iter().map(|&i| rows[i]).collect::<Vec<_>>();
        let on_host = ReferenceSampler.sample_rows(logits, &pick(&host))?;
        let on_device = if device.is_empty() {
            Vec::new()
        } else {
            self.sample_rows(logits, &pick(&device))?
        };
        let mut out: Vec<Option<RowResult>> = vec![None; rows.len()];
        for (i, r) in host
            .into_iter()
            .zip(on_host)
            .chain(device.into_iter().zip(on_device))
        {
            out[i] = Some(r);
        }
        Ok(out
            .into_iter()
            .map(|r| r.expect("every row drawn once"))
            .collect())
    }
}

/// Result words per row of a call: the results, then the many draws' tokens or (rows
/// asking for it, which never have many draws) the kept distribution.
fn res_stride(kept: bool, draws: usize) -> usize {
    RES_WORDS + if kept { KEPT_WORDS.max(draws) } else { draws }
}

/// Bytes of a device copy of the logits: whole 4-byte words, at least one.
fn logits_size(logits: &Logits<'_>) -> u64 {
    ((logits.rows() * logits.vocab() * logits.dtype().size()).next_multiple_of(4)).max(4) as u64
}

impl Backend for WgpuSampler {
    fn name(&self) -> String {
        format!("wgpu:{}", self.ctx.info().name)
    }

    fn sample_rows(&self, logits: &Logits<'_>, rows: &[Row<'_>]) -> Result<Vec<RowResult>> {
        if rows.iter().any(|r| r.beyond_device().is_some()) {
            return self.sample_rows_split(logits, rows);
        }
        if !pl::reads_in_order(rows, logits.rows()) {
            // per-step views of rows: the device reads its rows contiguously
            let copy = Gathered::new(logits, rows.iter().map(|r| r.logits_row()));
            let in_order: Vec<Row<'_>> =
                rows.iter().enumerate().map(|(i, r)| r.reading(i)).collect();
            return self.sample_rows(&copy.view()?, &in_order);
        }
        let piece = self.rows_per_call(logits, HOST_PIECE_ROWS)?;
        let mut results = Vec::with_capacity(rows.len());
        for start in (0..logits.rows()).step_by(piece) {
            let end = (start + piece).min(logits.rows());
            let part: Vec<Row<'_>> = rows[start..end]
                .iter()
                .enumerate()
                .map(|(i, r)| r.reading(i))
                .collect();
            let words = self.host_call(&logits.slice_rows(start, end)?, &part, 0)?;
            let params = part.iter().map(|r| &r.params);
            results.extend(parse_results(&words, params, logits.vocab()));
        }
        Ok(results)
    }

    /// The filters run once per row, then the Gumbel-max over the kept set runs once per
    /// draw at its own step, spread over as many invocations as the row needs. Rows
    /// asking for logprobs, or with XTC (whose coin changes the kept set from step to
    /// step), go through per-step calls.
    fn sample_rows_draws(
        &self,
        logits: &Logits<'_>,
        rows: &[Row<'_>],
        draws: usize,
    ) -> Result<Vec<Vec<RowResult>>> {
        if rows.iter().any(|r| {
            r.params.logprobs.is_some()
                || r.params.kept.is_some()
                || r.params.xtc_on()
                || r.request().beyond_device().is_some()
        }) || !pl::reads_in_order(rows, logits.rows())
        {
            return crate::backend::draws_by_steps(self, logits, rows, draws);
        }
        let mut out: Vec<Vec<RowResult>> = vec![Vec::with_capacity(draws); rows.len()];
        if draws == 0 {
            return Ok(out);
        }
        let v = logits.vocab();
        let max_words = ((self.ctx.device().limits().max_storage_buffer_binding_size / 4) as usize)
            .min(MAX_DRAW_WORDS);
        let piece = self.rows_per_call(logits, 64)?;
        // draws one call can dispatch: a workgroup holds 256 / lanes draws of a row
        let lanes = super::kernels::draw_lanes(v);
        let max_draws = MAX_GRID * (DRAW_WG / lanes);
        let mut views = Vec::with_capacity(piece);
        for start in (0..logits.rows()).step_by(piece) {
            let end = (start + piece).min(logits.rows());
            let b = end - start;
            let sub = logits.slice_rows(start, end)?;
            let per_call = (max_words / b).clamp(1, max_draws);
            let mut done = 0;
            while done < draws {
                let n = per_call.min(draws - done);
                views.clear();
                views.extend(
                    rows[start..end]
                        .iter()
                        .enumerate()
                        .map(|(i, r)| r.reading(i).at_step(done as u64)),
                );
                let words = self.host_call(&sub, &views, n)?;
                let (res, tokens) = words[b..].split_at(b * RES_WORDS);
                for r in 0..b {
                    let row = &tokens[r * n..(r + 1) * n];
                    let err = row_status(res[r * RES_WORDS], res[r * RES_WORDS + 1]);
                    out[start + r].extend(row.iter().map(|&token| match err {
                        None => checked(token, v, None),
                        Some(e) => Err(e),
                    }));
                }
                done += n;
            }
        }
        Ok(out)
    }
}

/// Records copies of the results of `rows` rows (tokens, then `res_words` words of
/// results and draws) into `out.readback`, in that order; returns the bytes copied.
pub(crate) fn copy_results(
    enc: &mut wgpu::CommandEncoder,
    out: &DeviceOutputs,
    rows: usize,
    res_words: usize,
) -> u64 {
    let t = rows as u64 * 4;
    enc.copy_buffer_to_buffer(&out.tokens, 0, &out.readback, 0, t);
    enc.copy_buffer_to_buffer(&out.results, 0, &out.readback, t, res_words as u64 * 4);
    t + res_words as u64 * 4
}

/// A row's error from its two status words (`None` = sampled).
pub(crate) fn row_status(code: u32, count: u32) -> Option<RowError> {
    match code {
        STATUS_OK => None,
        STATUS_NON_FINITE => Some(RowError::NonFiniteLogits {
            count: u64::from(count),
        }),
        STATUS_NO_CANDIDATE => Some(RowError::NoCandidate),
        STATUS_NO_WINNER => Some(RowError::NoWinner),
        STATUS_FINISHED => Some(RowError::Finished),
        // no other code is written; should one appear, the row still gets no token
        _ => Some(RowError::NoWinner),
    }
}

/// A drawn token, which must be below V: anything else (a draw that found no winner)
/// is the row's [`RowError::NoWinner`], never a token.
pub(crate) fn checked(token: u32, vocab: usize, logprobs: Option<TokenLogprobs>) -> RowResult {
    if token != NO_TOKEN && (token as usize) < vocab {
        Ok(Sample::token(token, logprobs))
    } else {
        Err(RowError::NoWinner)
    }
}

pub(crate) fn parse_logprobs(w: &[u32]) -> TokenLogprobs {
    let listed = (w[2] as usize).min(MAX_LOGPROBS as usize);
    TokenLogprobs {
        logprob: f32::from_bits(w[0]),
        rank: w[1],
        top: (0..listed)
            .map(|k| TopLogprob {
                token: w[3 + 2 * k],
                logprob: f32::from_bits(w[4 + 2 * k]),
            })
            .collect(),
    }
}

/// A row's kept distribution from its kept area (size, listed, then (id, p) pairs).
pub(crate) fn parse_kept(w: &[u32]) -> Kept {
    let listed = (w[1] as usize).min(KEPT_TOKENS);
    Kept {
        size: w[0],
        top: (0..listed)
            .map(|k| KeptToken {
                id: w[2 + 2 * k],
                p: f32::from_bits(w[3 + 2 * k]),
            })
            .collect(),
    }
}

/// Per-row results from words laid out by [`copy_results`] (tokens, then `[B, 46]`
/// results, then, when a row asks for it, `[B, 2050]` kept areas). Tokens must be below
/// `vocab`.
pub(crate) fn parse_results<'a>(
    words: &[u32],
    params: impl ExactSizeIterator<Item = &'a SamplingParams>,
    vocab: usize,
) -> Vec<RowResult> {
    let b = params.len();
    let (tokens, res) = words.split_at(b);
    let kept_at = |r: usize| &res[b * RES_WORDS + r * KEPT_WORDS..][..KEPT_WORDS];
    params
        .enumerate()
        .map(|(r, p)| {
            let w = &res[r * RES_WORDS..(r + 1) * RES_WORDS];
            match row_status(w[0], w[1]) {
                None => checked(
                    tokens[r],
                    vocab,
                    p.logprobs.map(|_| parse_logprobs(&w[2..2 + LP_WORDS])),
                )
                .map(|mut s| {
                    s.kept = p.kept.map(|_| parse_kept(kept_at(r)));
                    s
                }),
                Some(e) => Err(e),
            }
        })
        .collect()
}
