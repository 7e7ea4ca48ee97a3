//! The sampler object and the device API: recording one call into the caller's encoder.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Mutex;

use crate::error::{Error, Result};
use crate::logits::{DType, Logits};
use crate::params::{LogprobsMode, Request, MAX_LOGPROBS};
use crate::pipeline::{self as pl, Row};

use super::adapter;
use super::buffers::{make_buffer, Grow};
use super::call::{call_block, CallShape};
use super::device::{poisoned, WgpuDevice};
use super::kernels::{self, Kernels, Plan, RowNeeds, Sizes, StepBuffers, StepShape, StepStamps};
use super::layout::*;
use super::options::WgpuOptions;

/// Longest row the device sampler takes (token ids and per-invocation loops stay small).
pub(crate) const MAX_VOCAB: usize = 1 << 24;

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
/// by [`WgpuSampler::outputs_kept`] also hold, after the `[rows, 46]` results of a call of
/// B rows (at word `46 B`), B kept areas of 2,050 words: the kept set's size, the tokens
/// listed (n), then n pairs of token and probability (f32 bits), most likely first.
#[derive(Debug)]
pub struct DeviceOutputs {
    pub(crate) rows: usize,
    /// V of the last call recorded into these buffers (what [`WgpuSampler::read`]
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

/// Token masks on the device for [`WgpuSampler::record_masked`] and
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

/// The rows of a device API call: validated, with no host mask (`host_mask` says what one
/// would be) and no stage the kernels do not run yet, each refused naming its row.
fn device_rows<'r>(
    logits: &DeviceLogits<'_>,
    requests: &'r [Request],
    host_mask: &str,
) -> Result<Vec<Row<'r>>> {
    let rows = pl::validated_rows(logits.rows, logits.vocab, requests)?;
    if let Some(row) = requests.iter().position(|r| r.allowed.is_some()) {
        return Err(Error::InvalidParameter {
            row,
            field: "allowed",
            value: host_mask.into(),
            expected: "masks on the device API in a device buffer (record_masked); the host \
                       API, Backend::sample, takes host masks",
        });
    }
    for (row, r) in requests.iter().enumerate() {
        let history = r.state.prompt.len() + r.state.output.len();
        crate::params::on_device_only(&r.params, row, history)?;
    }
    Ok(rows)
}

/// The per-call working buffers, the cached bind group and the host API's buffers.
pub(crate) struct Scratch {
    bufs: StepBuffers,
    bind: Option<(BindKey, wgpu::BindGroup)>,
    host_lists: HostLists,
    /// The host API's logits and outputs (see `host.rs`).
    pub host_logits: Grow,
    pub host_out: Option<DeviceOutputs>,
    /// Bumped when `host_logits` is replaced.
    pub generation: u64,
}

impl Scratch {
    /// The per-row state calls leave (`STATE_WORDS` words a row first), and the
    /// generation of the step buffers (bumped when a call replaces them).
    pub(crate) fn work(&self) -> (&wgpu::Buffer, u64) {
        (&self.bufs.work.buf, self.bufs.generation)
    }
}

/// Per-call parameter lists built on the host, kept to reuse their allocations.
#[derive(Default)]
struct HostLists {
    slots: Vec<SlotU>,
    state: Vec<u32>,
    rmap: Vec<u32>,
    lists: Vec<u32>,
    bytes: Vec<u8>,
}

#[derive(PartialEq)]
struct BindKey {
    logits: wgpu::Buffer,
    masks: Option<wgpu::Buffer>,
    tokens: wgpu::Buffer,
    generation: u64,
}

/// The wgpu sampler. Cheap to share between threads (`&self` everywhere; calls are
/// serialised internally). Built on a [`WgpuDevice`], whose pipelines and staging pool
/// it shares with every other part made from that device.
pub struct WgpuSampler {
    pub(crate) ctx: WgpuDevice,
    pub(crate) kernels: std::sync::Arc<Kernels>,
    pub(crate) scratch: Mutex<Scratch>,
    /// Held for a whole host call (upload, record, submit, read back).
    pub(crate) host_call: Mutex<()>,
    min_chunk: AtomicUsize,
    /// Device objects (buffers, bind groups) `record` has created: flat after warm-up.
    created: AtomicU64,
}

impl std::fmt::Debug for WgpuSampler {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WgpuSampler")
            .field("adapter", &self.ctx.info().name)
            .field("backend", &self.ctx.info().backend)
            .field("subgroups", &self.ctx.uses_subgroups())
            .finish()
    }
}

impl AsRef<WgpuDevice> for WgpuSampler {
    fn as_ref(&self) -> &WgpuDevice {
        &self.ctx
    }
}

impl WgpuSampler {
    /// A sampler on the best adapter ([`WgpuDevice::new`]: the one named by
    /// `DECODA_WGPU_ADAPTER` when set, else a hardware adapter, else a software one such
    /// as Mesa's lavapipe). [`Error::NoDevice`] when there is none.
    pub fn new() -> Result<Self> {
        Self::on(&WgpuDevice::new()?)
    }

    /// Like [`WgpuSampler::new`], but only a hardware adapter will do (`DECODA_WGPU_ADAPTER`
    /// still applies): what `--device auto` uses before falling back to the CPU.
    pub fn hardware() -> Result<Self> {
        Self::on(&WgpuDevice::hardware()?)
    }

    /// A sampler chosen as [`WgpuSampler::new`] does, with `options`.
    pub fn with_options(options: WgpuOptions) -> Result<Self> {
        Self::on(&WgpuDevice::with_options(options)?)
    }

    /// A sampler on an application's device and queue (for example the one its model runs
    /// on), so logits never leave it: [`WgpuSampler::on`] of [`WgpuDevice::from_device`].
    /// The device needs at least 10 storage buffers per shader stage and 11 KiB of
    /// workgroup memory (what every desktop adapter offers).
    pub fn from_device(device: wgpu::Device, queue: wgpu::Queue) -> Result<Self> {
        Self::on(&WgpuDevice::from_device(device, queue))
    }

    /// A sampler on `device`, sharing its compiled kernels with every sampler and head
    /// made from it.
    pub fn on(device: &WgpuDevice) -> Result<Self> {
        let ctx = device.clone();
        adapter::check_limits(ctx.device(), ctx.info())?;
        let kernels = ctx.pipelines("sampler", || Kernels::build(ctx.device(), ctx.info()))?;
        use wgpu::BufferUsages as U;
        let scratch = Scratch {
            bufs: StepBuffers::new(ctx.device()),
            bind: None,
            host_lists: HostLists::default(),
            host_logits: Grow::new(ctx.device(), "decoda host logits", U::STORAGE | U::COPY_DST),
            host_out: None,
            generation: 0,
        };
        Ok(Self {
            ctx,
            kernels,
            scratch: Mutex::new(scratch),
            host_call: Mutex::new(()),
            min_chunk: AtomicUsize::new(4096),
            created: AtomicU64::new(0),
        })
    }

    /// The device context this sampler runs on (build heads, MoE layers and models from
    /// it to share its pipelines).
    pub fn context(&self) -> &WgpuDevice {
        &self.ctx
    }

    /// [`WgpuDevice::weight_part_bytes`] of the sampler's device.
    pub fn weight_part_bytes(&self) -> u64 {
        self.ctx.weight_part_bytes()
    }

    /// [`WgpuDevice::set_weight_part_bytes`] of the sampler's device: caps the bytes of
    /// weights per binding for the layers and models made from it afterwards.
    pub fn set_weight_part_bytes(&self, bytes: u64) {
        self.ctx.set_weight_part_bytes(bytes);
    }

    /// The adapter's name and backend, e.g. `llvmpipe (LLVM 15.0.6, 256 bits) (Vulkan)`.
    pub fn adapter(&self) -> String {
        self.ctx.adapter()
    }

    /// Whether the adapter is a software (CPU) implementation.
    pub fn is_software(&self) -> bool {
        self.ctx.is_software()
    }

    /// Whether Philox's products use 64-bit integers (the device was created with
    /// `SHADER_INT64`, see [`WgpuOptions::int64`]); the bits are the same either way.
    pub fn uses_int64(&self) -> bool {
        self.ctx.uses_int64()
    }

    /// Whether the reductions use subgroup operations (the adapter has them and they were
    /// chosen, see [`WgpuOptions::subgroups`]).
    pub fn uses_subgroups(&self) -> bool {
        self.ctx.uses_subgroups()
    }

    /// How many times [`WgpuSampler::record`] has had to create device objects (grow a
    /// working or staging buffer, build a bind group). It stops moving once calls repeat
    /// the same sizes and buffers: the steady state allocates nothing on the device.
    pub fn device_objects_created(&self) -> u64 {
        self.created.load(Ordering::Relaxed)
    }

    /// Parameter staging buffers that are free for the next recorded call: a buffer is
    /// taken by each `record` and comes back when the submission holding that call has
    /// finished on the device.
    #[doc(hidden)]
    pub fn free_staging_buffers(&self) -> usize {
        self.ctx.stages().free_count()
    }

    /// Whether GPU timestamps are available ([`WgpuSampler::time_gpu`]).
    pub fn has_timestamps(&self) -> bool {
        self.ctx.has_timestamps()
    }

    /// The device the sampler runs on.
    pub fn device(&self) -> &wgpu::Device {
        self.ctx.device()
    }

    /// The queue the sampler submits to.
    pub fn queue(&self) -> &wgpu::Queue {
        self.ctx.queue()
    }

    /// The fewest logits one workgroup handles (default 4096): a row of V logits is cut
    /// into up to `V / min_chunk` pieces handled by separate workgroups when the batch is
    /// too small to fill the device. Results do not depend on it; tests lower it to run
    /// the multi-workgroup path on small vocabularies.
    pub fn set_min_chunk(&self, elements: usize) {
        self.min_chunk.store(elements.max(4), Ordering::Relaxed);
    }

    /// Output buffers for up to `rows` rows.
    pub fn outputs(&self, rows: usize) -> Result<DeviceOutputs> {
        self.outputs_for(rows, 0)
    }

    /// Output buffers for up to `rows` rows with room for their kept distributions
    /// ([`crate::SamplingParams::kept`]): what [`WgpuSampler::record`] needs for a
    /// request that asks for one.
    pub fn outputs_kept(&self, rows: usize) -> Result<DeviceOutputs> {
        self.outputs_for(rows, KEPT_WORDS)
    }

    /// Output buffers with room for `draws` many-draws tokens per row after the results.
    pub(crate) fn outputs_for(&self, rows: usize, draws: usize) -> Result<DeviceOutputs> {
        use wgpu::BufferUsages as U;
        let rows1 = rows.max(1) as u64;
        let res_words = rows.max(1) * (RES_WORDS + draws);
        let u = U::STORAGE | U::COPY_SRC | U::COPY_DST;
        Ok(DeviceOutputs {
            rows,
            vocab: AtomicUsize::new(0),
            res_words,
            tokens: make_buffer(self.ctx.device(), "decoda tokens", rows1 * 4, u),
            results: make_buffer(self.ctx.device(), "decoda results", res_words as u64 * 4, u),
            readback: make_buffer(
                self.ctx.device(),
                "decoda readback",
                (rows1 + res_words as u64) * 4,
                U::MAP_READ | U::COPY_DST,
            ),
        })
    }

    /// Records one sampling call into `encoder`: every row of `logits` with its request,
    /// results into `out`. Nothing is submitted or read back. The call's parameters (a
    /// few dozen bytes a row, and the rows' histories and logit biases) go through a
    /// staging buffer of its own, written with
    /// [`wgpu::Queue::write_buffer`] and copied by the recorded commands themselves, which
    /// returns to the sampler only when the submission holding the call has run: any
    /// number of calls may be recorded (into one encoder or several) before they are
    /// submitted, in any order. Calls that share `out` overwrite each other's results in
    /// the order they run.
    ///
    /// Whole-call problems (shapes, parameters, history ids, a buffer too small) are an
    /// error here, before anything is recorded. Host token masks ([`Request::allowed`])
    /// are taken by the host API ([`Backend::sample`](crate::Backend::sample)); here a
    /// request with one is an error (device masks go through [`Self::record_masked`]), as
    /// is one with a DRY window longer than the kernels hold
    /// ([`crate::SamplingParams::beyond_device_with`]), which the host API draws on the
    /// host, and one asking for the kept distribution when `out` has no room for it
    /// (make it with [`Self::outputs_kept`]).
    pub fn record(
        &self,
        encoder: &mut wgpu::CommandEncoder,
        logits: &DeviceLogits<'_>,
        requests: &[Request],
        out: &DeviceOutputs,
    ) -> Result<()> {
        let rows = device_rows(logits, requests, "a token mask")?;
        self.record_inner(encoder, logits, &rows, out, StepStamps::None, 0)
    }

    /// [`WgpuSampler::record`] with a token mask per row on the device (stage 0 of the
    /// contract, applied where the kernels read the logits: one extra read of
    /// `ceil(V / 32)` words per row, no copy of the logits). Requests must not carry host
    /// masks ([`Request::allowed`]) as well.
    pub fn record_masked(
        &self,
        encoder: &mut wgpu::CommandEncoder,
        logits: &DeviceLogits<'_>,
        masks: &DeviceMasks<'_>,
        requests: &[Request],
        out: &DeviceOutputs,
    ) -> Result<()> {
        let rows = device_rows(logits, requests, "a host mask beside the device masks")?;
        self.record_inner_masked(
            encoder,
            logits,
            Some(masks),
            &rows,
            out,
            StepStamps::None,
            0,
        )
    }

    fn check_device_logits(&self, l: &DeviceLogits<'_>, out: &DeviceOutputs) -> Result<()> {
        if l.rows > MAX_GRID {
            return Err(Error::Shape(format!(
                "{} rows in one device call; at most {MAX_GRID}",
                l.rows
            )));
        }
        if l.vocab > MAX_VOCAB {
            return Err(Error::Shape(format!(
                "rows of {} logits; the device sampler takes at most {MAX_VOCAB}",
                l.vocab
            )));
        }
        if out.rows < l.rows {
            return Err(Error::Shape(format!(
                "the outputs hold {} rows, the call has {}",
                out.rows, l.rows
            )));
        }
        l.check(self.ctx.device())
    }

    /// The grid of a call of `b` rows of `v` logits.
    pub(crate) fn shape(&self, v: usize, b: usize) -> (usize, usize) {
        kernels::split(
            v,
            b,
            self.ctx.target_wg(),
            self.min_chunk.load(Ordering::Relaxed),
        )
    }

    /// The passes a call of these rows records (`draws`: many draws per row).
    pub(crate) fn plan_for(rows: &[Row<'_>], vocab: usize, draws: usize) -> Plan {
        let scatter = rows.iter().any(|r| {
            let q = r.request();
            q.params.modifies_logits(&q.state)
        });
        Plan::of(
            rows.iter().map(|r| {
                let p = &r.request().params;
                RowNeeds::of(row_flags(p, vocab), p.temperature)
            }),
            scatter,
            draws > 0,
        )
    }

    /// Records a validated call whose rows read the view's rows in order; with
    /// `draws > 0`, also the many-draws kernel, whose tokens go to
    /// `out.results` after the rows' results (`[B, draws]`).
    pub(crate) fn record_inner(
        &self,
        encoder: &mut wgpu::CommandEncoder,
        logits: &DeviceLogits<'_>,
        rows: &[Row<'_>],
        out: &DeviceOutputs,
        stamps: StepStamps<'_>,
        draws: usize,
    ) -> Result<()> {
        self.record_inner_masked(encoder, logits, None, rows, out, stamps, draws)
    }

    /// [`WgpuSampler::record_inner`] with the rows' token masks on the device.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn record_inner_masked(
        &self,
        encoder: &mut wgpu::CommandEncoder,
        logits: &DeviceLogits<'_>,
        masks: Option<&DeviceMasks<'_>>,
        rows: &[Row<'_>],
        out: &DeviceOutputs,
        stamps: StepStamps<'_>,
        draws: usize,
    ) -> Result<()> {
        debug_assert!(pl::reads_in_order(rows, logits.rows));
        self.check_device_logits(logits, out)?;
        if let Some(m) = masks {
            m.check(logits.rows, logits.vocab)?;
        }
        let b = logits.rows;
        if let Some(row) = rows.iter().position(|r| r.params.kept.is_some()) {
            if draws > 0 {
                return Err(Error::Shape(format!(
                    "row {row} asks for its kept distribution, which many draws do not                      return: draw it step by step"
                )));
            }
            if out.res_words < b * (RES_WORDS + KEPT_WORDS) {
                return Err(Error::InvalidParameter {
                    row,
                    field: "kept",
                    value: format!("{:?}", rows[row].params.kept),
                    expected: "outputs with room for kept distributions                                (WgpuSampler::outputs_kept)",
                });
            }
        }
        if out.res_words < b * (RES_WORDS + draws) {
            return Err(Error::Shape(format!(
                "{draws} draws of {b} rows do not fit outputs of {} words",
                out.res_words
            )));
        }
        let v = logits.vocab;
        let lanes = kernels::draw_lanes(v);
        let draw_groups = draws.div_ceil(DRAW_WG / lanes);
        if draw_groups > MAX_GRID {
            return Err(Error::Shape(format!(
                "{draws} draws in one device call; at most {}",
                MAX_GRID * (DRAW_WG / lanes)
            )));
        }
        if b == 0 {
            return Ok(());
        }
        out.vocab.store(v, Ordering::Relaxed);
        let mut sc = self.scratch.lock().map_err(|_| poisoned())?;
        // The rows as transient slots: parameters, state, identity row map, lists.
        let mut host = std::mem::take(&mut sc.host_lists);
        host.slots.clear();
        host.state.clear();
        host.rmap.clear();
        host.lists.clear();
        let mut pens = 0usize;
        for (r, req) in rows.iter().enumerate() {
            let touch = req.params.modifies_logits(&req.state);
            let pen_slot = if touch {
                pens += 1;
                pens - 1
            } else {
                0
            };
            host.slots.push(slot_params(
                &req.params,
                req.state.seed,
                v,
                touch,
                pen_slot,
                &mut host.lists,
            )?);
            let (hist_off, hist_len) = if touch {
                push_history(&mut host.lists, &req.state.prompt, &req.state.output)?
            } else {
                (0, 0)
            };
            if touch && req.params.dry_on() {
                let n = req.params.dry_window(hist_len as usize);
                let excess = n.saturating_sub(req.params.dry_allowed_length as usize);
                let dry = dry_lists(&req.params, excess, &mut host.lists)?;
                host.slots.last_mut().expect("pushed above").set_dry(dry);
            }
            let sp = host.slots.last_mut().expect("pushed above");
            sp.hist_off = hist_off;
            sp.hist_len = hist_len;
            host.state.extend([
                req.step() as u32,
                (req.step() >> 32) as u32,
                0,
                0,
                0,
                0,
                0,
                0,
            ]);
            host.rmap.push(r as u32);
        }
        let (splits, chunk) = self.shape(v, b);
        let plan = Self::plan_for(rows, v, draws);
        let sizes = Sizes {
            rows: b,
            splits,
            slots: b,
            pen_words: pens * kernels::pen_words(v),
            list_words: host.lists.len(),
        };
        let max_binding = self.ctx.device().limits().max_storage_buffer_binding_size;
        if (sizes.pen_words as u64) * 4 > max_binding
            || (sizes.work_words() as u64) * 4 > max_binding
        {
            return Err(Error::Shape(format!(
                "{b} rows of {v} logits ({pens} with penalties or bias) need more than the \
                 {max_binding} bytes this adapter binds at once; split the batch"
            )));
        }
        let call = call_block(
            logits,
            masks,
            CallShape {
                rows: b,
                splits,
                chunk,
                sizes: &sizes,
                plan,
                mode: if pens > 0 { M_SCATTER } else { 0 },
                draws,
                draw_lanes: lanes,
            },
        );
        let dev = self.ctx.device();
        if sc.bufs.ensure(dev, &sizes) {
            self.created.fetch_add(1, Ordering::Relaxed);
        }
        // The call's parameters: one staging buffer of its own.
        let parts: [&[u8]; 5] = [
            bytemuck::bytes_of(&call),
            bytemuck::cast_slice(&host.slots),
            bytemuck::cast_slice(&host.state),
            bytemuck::cast_slice(&host.rmap),
            bytemuck::cast_slice(&host.lists),
        ];
        host.bytes.clear();
        for p in parts {
            host.bytes.extend_from_slice(p);
        }
        let (stage, made) = self.ctx.stages().take(dev, host.bytes.len() as u64);
        if made {
            self.created.fetch_add(1, Ordering::Relaxed);
        }
        self.ctx.queue().write_buffer(&stage, 0, &host.bytes);
        let targets = [
            &sc.bufs.call,
            &sc.bufs.sparams.buf,
            &sc.bufs.sstate.buf,
            &sc.bufs.rmap.buf,
            &sc.bufs.lists.buf,
        ];
        let mut at = 0u64;
        for (p, to) in parts.iter().zip(targets) {
            if !p.is_empty() {
                encoder.copy_buffer_to_buffer(&stage, at, to, 0, p.len() as u64);
            }
            at += p.len() as u64;
        }
        self.ctx.stages().release_after(encoder, stage);
        sc.host_lists = host;

        let key = BindKey {
            logits: logits.buffer.clone(),
            masks: masks.map(|m| m.buffer.clone()),
            tokens: out.tokens.clone(),
            generation: sc.bufs.generation,
        };
        if !matches!(&sc.bind, Some((k, _)) if *k == key) {
            self.created.fetch_add(1, Ordering::Relaxed);
            let mask_buf = masks.map_or(&self.kernels.no_mask, |m| m.buffer);
            let group = bind_group(dev, &self.kernels, &sc.bufs, logits.buffer, mask_buf, out);
            sc.bind = Some((key, group));
        }
        let group = &sc.bind.as_ref().expect("bind group set above").1;
        self.kernels.record_step(
            encoder,
            group,
            StepShape {
                rows: b,
                splits,
                draw_groups: if draws > 0 { draw_groups } else { 0 },
                plan,
            },
            stamps,
        );
        Ok(())
    }
}

/// The bind group of a step over `logits` into `out`.
pub(crate) fn bind_group(
    device: &wgpu::Device,
    kernels: &Kernels,
    bufs: &StepBuffers,
    logits: &wgpu::Buffer,
    masks: &wgpu::Buffer,
    out: &DeviceOutputs,
) -> wgpu::BindGroup {
    bind_group_raw(
        device,
        kernels,
        bufs,
        (logits, masks),
        &out.tokens,
        &out.results,
    )
}

/// The bind group of a step over `logits` into `tokens` and `results`.
pub(crate) fn bind_group_raw(
    device: &wgpu::Device,
    kernels: &Kernels,
    bufs: &StepBuffers,
    (logits, masks): (&wgpu::Buffer, &wgpu::Buffer),
    tokens: &wgpu::Buffer,
    results: &wgpu::Buffer,
) -> wgpu::BindGroup {
    let all = [
        &bufs.call,
        logits,
        &bufs.sparams.buf,
        &bufs.sstate.buf,
        &bufs.rmap.buf,
        &bufs.pen.buf,
        &bufs.lists.buf,
        &bufs.work.buf,
        &bufs.ctr.buf,
        tokens,
        results,
        masks,
    ];
    let entries: Vec<wgpu::BindGroupEntry<'_>> = all
        .iter()
        .enumerate()
        .map(|(i, buf)| wgpu::BindGroupEntry {
            binding: i as u32,
            resource: buf.as_entire_binding(),
        })
        .collect();
    device.create_bind_group(&wgpu::BindGroupDescriptor {
        label: Some("decoda"),
        layout: &kernels.layout,
        entries: &entries,
    })
}

/// The device's view of a slot's parameters; its logit bias is appended to `lists` as
/// (token, bias bits) pairs in token order.
pub(crate) fn slot_params(
    p: &crate::params::SamplingParams,
    seed: u64,
    vocab: usize,
    touch: bool,
    pen_slot: usize,
    lists: &mut Vec<u32>,
) -> Result<SlotU> {
    let mut flags = row_flags(p, vocab);
    if touch {
        flags |= F_TOUCH;
    } else {
        // DRY over a history too short to repeat: nothing to compute
        flags &= !F_DRY;
    }
    let bias_off = to_u32(lists.len(), "logit biases")?;
    for (&t, &b) in &p.logit_bias {
        lists.extend([t, b.to_bits()]);
    }
    Ok(SlotU {
        temperature: p.temperature,
        top_k: p.top_k,
        top_p: p.top_p,
        ln_min_p: pl::min_p_threshold(0.0, p.min_p),
        rep: p.repetition_penalty,
        freq: p.frequency_penalty,
        pres: p.presence_penalty,
        flags,
        seed_lo: seed as u32,
        seed_hi: (seed >> 32) as u32,
        n_lp: p.logprobs.unwrap_or(0).min(MAX_LOGPROBS),
        bias_off,
        bias_len: p.logit_bias.len() as u32,
        stop_off: 0,
        stop_len: 0,
        hist_off: 0,
        hist_len: 0,
        max_lo: u32::MAX,
        max_hi: u32::MAX,
        pen_slot: pen_slot as u32,
        dry_allowed: p.dry_allowed_length,
        dry_n: u32::try_from(p.dry_penalty_last_n).unwrap_or(u32::MAX),
        top_n_sigma: p.top_n_sigma,
        xtc_p: p.xtc_probability,
        xtc_thr: p.xtc_threshold,
        typical_p: p.typical_p,
        n_kept: p.kept.unwrap_or(0),
        ..SlotU::default()
    })
}

/// Where a slot's DRY table and breakers are in `lists` ([`dry_lists`]).
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct DryLists {
    pub tab_off: u32,
    pub tab_len: u32,
    pub brk_off: u32,
    pub brk_len: u32,
}

impl SlotU {
    /// Points the slot at its DRY table and breakers.
    pub(crate) fn set_dry(&mut self, d: DryLists) {
        self.dry_tab_off = d.tab_off;
        self.dry_tab_len = d.tab_len;
        self.dry_brk_off = d.brk_off;
        self.dry_brk_len = d.brk_len;
    }
}

/// Appends DRY's penalty for each excess `e` a window allows (`0..=most_excess`, fewer
/// when the base's cap on `e` comes first: a larger `e` takes the last entry) as f32
/// bits, computed by [`pl::dry_penalty`] on the host so no device arithmetic decides
/// one, then the sequence breakers as (length, ids...) each.
pub(crate) fn dry_lists(
    p: &crate::params::SamplingParams,
    most_excess: usize,
    lists: &mut Vec<u32>,
) -> Result<DryLists> {
    let last = pl::dry_max_exponent(p).map_or(most_excess, |m| {
        most_excess.min(usize::try_from(m).unwrap_or(usize::MAX))
    });
    let tab_off = to_u32(lists.len(), "DRY penalties")?;
    lists.extend((0..=last).map(|e| pl::dry_penalty(p, e).to_bits()));
    let brk_off = to_u32(lists.len(), "DRY breakers")?;
    for b in &p.dry_sequence_breakers {
        lists.push(b.len() as u32);
        lists.extend_from_slice(b);
    }
    Ok(DryLists {
        tab_off,
        tab_len: last as u32 + 1,
        brk_off,
        brk_len: to_u32(lists.len(), "DRY breakers")? - brk_off,
    })
}

/// A row's flags (`F_*`) but `F_TOUCH`, from its parameters.
pub(crate) fn row_flags(p: &crate::params::SamplingParams, vocab: usize) -> u32 {
    let mut flags = 0;
    if p.logprobs.is_some() {
        flags |= F_LOGPROBS;
    }
    if p.logprobs_mode == LogprobsMode::Processed {
        flags |= F_PROCESSED;
    }
    if p.top_p < 1.0 {
        flags |= F_TOP_P;
    }
    if p.top_k > 0 && (p.top_k as usize) < vocab {
        flags |= F_TOP_K;
    }
    if p.min_p > 0.0 {
        flags |= F_MIN_P;
    }
    if p.dry_on() {
        flags |= F_DRY;
    }
    if p.top_n_sigma > 0.0 {
        flags |= F_TOP_N_SIGMA;
    }
    if p.xtc_on() {
        flags |= F_XTC;
    }
    if p.typical_p < 1.0 {
        flags |= F_TYPICAL;
    }
    if p.kept.is_some() {
        flags |= F_KEPT;
    }
    flags
}

/// Appends a history for the scatter kernels (prompt tokens as they are, output tokens
/// with bit 31 set); returns its offset and length.
pub(crate) fn push_history(
    lists: &mut Vec<u32>,
    prompt: &[u32],
    output: &[u32],
) -> Result<(u32, u32)> {
    let off = to_u32(lists.len(), "history tokens")?;
    lists.extend_from_slice(prompt);
    lists.extend(output.iter().map(|&t| t | 1 << 31));
    Ok((off, to_u32(prompt.len() + output.len(), "history tokens")?))
}

fn to_u32(n: usize, what: &str) -> Result<u32> {
    u32::try_from(n).map_err(|_| Error::Shape(format!("too many {what} in one call")))
}
