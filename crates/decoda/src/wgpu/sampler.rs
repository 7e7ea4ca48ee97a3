//! The sampler object and the device API: recording one call into the caller's encoder.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Mutex;

use crate::error::{Error, Result};
use crate::logits::DType;
use crate::params::{LogprobsMode, Request, MAX_LOGPROBS};
use crate::pipeline as pl;

use super::device::{self, Pipelines};
use super::layout::*;
use super::staging::StagePool;
use super::WgpuOptions;

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

/// Device buffers the sampler writes its results into, for up to `rows` rows:
/// `tokens` (u32 per row, always `< V`; 0 for a failed row), `status` (two u32 per row:
/// 0 = ok, 1 = `NonFiniteLogits` with the count in the second word, 2 = `NoCandidate`,
/// 3 = `NoWinner`) and `logprobs` (44 u32 per row: chosen logprob (f32 bits), rank,
/// number listed, then up to 20 pairs of token and logprob). All three have
/// `STORAGE | COPY_SRC` usage.
#[derive(Debug)]
pub struct DeviceOutputs {
    pub(crate) rows: usize,
    /// V of the last call recorded into these buffers (what [`WgpuSampler::read`]
    /// checks the tokens against).
    pub(crate) vocab: AtomicUsize,
    pub(crate) lp_words: usize,
    pub(crate) tokens: wgpu::Buffer,
    pub(crate) status: wgpu::Buffer,
    pub(crate) logprobs: wgpu::Buffer,
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
    /// Row status, u32 `[rows, 2]`.
    pub fn status(&self) -> &wgpu::Buffer {
        &self.status
    }
    /// Log-probabilities, u32 `[rows, 44]` (see the type's docs).
    pub fn logprobs(&self) -> &wgpu::Buffer {
        &self.logprobs
    }
}

/// A working buffer, grown on demand and reused.
pub(crate) struct Grow {
    pub buf: wgpu::Buffer,
    usage: wgpu::BufferUsages,
    label: &'static str,
}

impl Grow {
    fn new(device: &wgpu::Device, label: &'static str, usage: wgpu::BufferUsages) -> Self {
        Self {
            buf: make_buffer(device, label, 256, usage),
            usage,
            label,
        }
    }

    /// Makes the buffer at least `bytes` long; true when it was replaced.
    pub fn ensure(&mut self, device: &wgpu::Device, bytes: u64) -> bool {
        if self.buf.size() >= bytes {
            return false;
        }
        let size = bytes.max(self.buf.size() * 2).next_multiple_of(256);
        self.buf = make_buffer(device, self.label, size, self.usage);
        true
    }
}

pub(crate) fn make_buffer(
    device: &wgpu::Device,
    label: &str,
    size: u64,
    usage: wgpu::BufferUsages,
) -> wgpu::Buffer {
    device.create_buffer(&wgpu::BufferDescriptor {
        label: Some(label),
        size,
        usage,
        mapped_at_creation: false,
    })
}

/// The working buffers the kernels share, grown on demand, and the cached bind group.
pub(crate) struct Scratch {
    call: wgpu::Buffer,
    rows: Grow,
    touches: Grow,
    state: Grow,
    slots: Grow,
    hist: Grow,
    bitmap: Grow,
    /// Bumped whenever a scratch buffer is replaced (cached bind groups are then stale).
    pub generation: u64,
    bind: Option<(BindKey, wgpu::BindGroup)>,
    host_lists: HostLists,
    /// The host API's logits and outputs (see `host.rs`).
    pub host_logits: Grow,
    pub host_out: Option<DeviceOutputs>,
}

/// Per-call parameter lists built on the host, kept to reuse their allocations.
#[derive(Default)]
struct HostLists {
    rows: Vec<RowU>,
    touches: Vec<TouchU>,
    touched: Vec<(u32, pl::Touch)>,
    bytes: Vec<u8>,
}

#[derive(PartialEq)]
struct BindKey {
    logits: wgpu::Buffer,
    tokens: wgpu::Buffer,
    generation: u64,
}

/// The wgpu sampler. Cheap to share between threads (`&self` everywhere; calls are
/// serialised internally).
pub struct WgpuSampler {
    pub(crate) device: wgpu::Device,
    pub(crate) queue: wgpu::Queue,
    pub(crate) info: wgpu::AdapterInfo,
    pipes: Pipelines,
    pub(crate) scratch: Mutex<Scratch>,
    stages: StagePool,
    /// Held for a whole host call (upload, record, submit, read back).
    pub(crate) host_call: Mutex<()>,
    min_chunk: AtomicUsize,
    /// Device objects (buffers, bind groups) `record` has created: flat after warm-up.
    created: AtomicU64,
    pub(crate) timestamps: bool,
    subgroups: bool,
}

impl std::fmt::Debug for WgpuSampler {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WgpuSampler")
            .field("adapter", &self.info.name)
            .field("backend", &self.info.backend)
            .field("subgroups", &self.subgroups)
            .finish()
    }
}

impl WgpuSampler {
    /// A sampler on the best adapter: the one named by `DECODA_WGPU_ADAPTER` (a substring
    /// of its name) when set, else a hardware adapter, else a software one (such as Mesa's
    /// lavapipe). [`Error::NoDevice`] when there is none.
    pub fn new() -> Result<Self> {
        Self::with_options(WgpuOptions::default())
    }

    /// Like [`WgpuSampler::new`], but only a hardware adapter will do (`DECODA_WGPU_ADAPTER`
    /// still applies): what `--device auto` uses before falling back to the CPU.
    pub fn hardware() -> Result<Self> {
        Self::with_options(WgpuOptions {
            hardware_only: true,
            ..Default::default()
        })
    }

    /// A sampler chosen as [`WgpuSampler::new`] does, with `options`.
    pub fn with_options(options: WgpuOptions) -> Result<Self> {
        let o = device::open(options)?;
        Self::build(o.device, o.queue, o.info)
    }

    /// A sampler on an application's device and queue (for example the one its model runs
    /// on), so logits never leave it. Subgroup operations are used when the device was
    /// created with `Features::SUBGROUP`. The device needs at least 10 storage buffers per
    /// shader stage and 8 KiB of workgroup memory (what every desktop adapter offers).
    pub fn from_device(device: wgpu::Device, queue: wgpu::Queue) -> Result<Self> {
        let info = device.adapter_info();
        Self::build(device, queue, info)
    }

    fn build(device: wgpu::Device, queue: wgpu::Queue, info: wgpu::AdapterInfo) -> Result<Self> {
        device::check_limits(&device, &info)?;
        let pipes = Pipelines::build(&device, &info)?;
        let timestamps = device.features().contains(wgpu::Features::TIMESTAMP_QUERY);
        let subgroups = device.features().contains(wgpu::Features::SUBGROUP);
        use wgpu::BufferUsages as U;
        let st = U::STORAGE | U::COPY_DST;
        let scratch = Scratch {
            call: make_buffer(
                &device,
                "decoda call",
                std::mem::size_of::<CallU>() as u64,
                U::UNIFORM | U::COPY_DST,
            ),
            rows: Grow::new(&device, "decoda rows", st),
            touches: Grow::new(&device, "decoda touches", st),
            state: Grow::new(&device, "decoda state", st),
            slots: Grow::new(&device, "decoda slots", st),
            hist: Grow::new(&device, "decoda hist", st),
            bitmap: Grow::new(&device, "decoda bitmap", st),
            generation: 0,
            bind: None,
            host_lists: HostLists::default(),
            host_logits: Grow::new(&device, "decoda host logits", st),
            host_out: None,
        };
        Ok(Self {
            device,
            queue,
            info,
            pipes,
            scratch: Mutex::new(scratch),
            stages: StagePool::new(),
            host_call: Mutex::new(()),
            min_chunk: AtomicUsize::new(4096),
            created: AtomicU64::new(0),
            timestamps,
            subgroups,
        })
    }

    /// The adapter's name and backend, e.g. `llvmpipe (LLVM 15.0.6, 256 bits) (Vulkan)`.
    pub fn adapter(&self) -> String {
        format!("{} ({:?})", self.info.name, self.info.backend)
    }

    /// Whether the adapter is a software (CPU) implementation.
    pub fn is_software(&self) -> bool {
        device::is_software(&self.info)
    }

    /// Whether the reductions use subgroup operations (the adapter has them and they were
    /// chosen, see [`WgpuOptions::subgroups`]).
    pub fn uses_subgroups(&self) -> bool {
        self.subgroups
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
        self.stages.free_count()
    }

    /// Whether GPU timestamps are available ([`WgpuSampler::time_gpu`]).
    pub fn has_timestamps(&self) -> bool {
        self.timestamps
    }

    /// The device the sampler runs on.
    pub fn device(&self) -> &wgpu::Device {
        &self.device
    }

    /// The queue the sampler submits to.
    pub fn queue(&self) -> &wgpu::Queue {
        &self.queue
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
        self.outputs_for(rows, rows * LP_WORDS)
    }

    /// Output buffers whose logprobs area holds `lp_words` words (the many-draws mode
    /// puts its tokens there).
    pub(crate) fn outputs_for(&self, rows: usize, lp_words: usize) -> Result<DeviceOutputs> {
        use wgpu::BufferUsages as U;
        let rows1 = rows.max(1) as u64;
        let lp_words = lp_words.max(LP_WORDS) as u64;
        let u = U::STORAGE | U::COPY_SRC | U::COPY_DST;
        Ok(DeviceOutputs {
            rows,
            vocab: AtomicUsize::new(0),
            lp_words: lp_words as usize,
            tokens: make_buffer(&self.device, "decoda tokens", rows1 * 4, u),
            status: make_buffer(&self.device, "decoda status", rows1 * 8, u),
            logprobs: make_buffer(&self.device, "decoda logprobs", lp_words * 4, u),
            readback: make_buffer(
                &self.device,
                "decoda readback",
                (rows1 * 3 + lp_words) * 4,
                U::MAP_READ | U::COPY_DST,
            ),
        })
    }

    /// Records one sampling call into `encoder`: every row of `logits` with its request,
    /// results into `out`. Nothing is submitted or read back. The call's parameters (a
    /// few dozen bytes a row) go through a staging buffer of its own, written with
    /// [`wgpu::Queue::write_buffer`] and copied by the recorded commands themselves, which
    /// returns to the sampler only when the submission holding the call has run: any
    /// number of calls may be recorded (into one encoder or several) before they are
    /// submitted, in any order. Calls that share `out` overwrite each other's results in
    /// the order they run.
    ///
    /// Whole-call problems (shapes, parameters, history ids, a buffer too small) are an
    /// error here, before anything is recorded.
    pub fn record(
        &self,
        encoder: &mut wgpu::CommandEncoder,
        logits: &DeviceLogits<'_>,
        requests: &[Request],
        out: &DeviceOutputs,
    ) -> Result<()> {
        self.record_inner(encoder, logits, requests, out, None, 0)
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
        if l.row_stride < l.vocab {
            return Err(Error::Shape(format!(
                "row_stride {} is below the vocabulary size {}",
                l.row_stride, l.vocab
            )));
        }
        if out.rows < l.rows {
            return Err(Error::Shape(format!(
                "the outputs hold {} rows, the call has {}",
                out.rows, l.rows
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
        let max_binding = self.device.limits().max_storage_buffer_binding_size;
        if l.buffer.size() > max_binding {
            return Err(Error::Shape(format!(
                "the logits buffer has {} bytes; this adapter binds at most {max_binding} \
                 (split the batch)",
                l.buffer.size()
            )));
        }
        Ok(())
    }

    /// How many workgroups a row is cut into, and the logits of each (a multiple of 4):
    /// enough pieces to fill the device when the batch is small, never a piece over
    /// [`MAX_CHUNK`].
    fn split(&self, v: usize, b: usize) -> (usize, usize) {
        let min_chunk = self.min_chunk.load(Ordering::Relaxed).max(4);
        let by_size = v.div_ceil(min_chunk).max(1);
        let by_batch = 512usize.div_ceil(b).max(1);
        let mut splits = by_size
            .min(by_batch)
            .max(v.div_ceil(MAX_CHUNK))
            .clamp(1, MAX_SPLITS);
        let chunk = v.div_ceil(splits).next_multiple_of(4);
        splits = v.div_ceil(chunk).max(1);
        (splits, chunk)
    }

    /// Records a call; with `draws > 0`, also the many-draws kernel, whose tokens go to
    /// the logprobs area of `out` (`[B, draws]`).
    pub(crate) fn record_inner(
        &self,
        encoder: &mut wgpu::CommandEncoder,
        logits: &DeviceLogits<'_>,
        requests: &[Request],
        out: &DeviceOutputs,
        timestamps: Option<&wgpu::QuerySet>,
        draws: usize,
    ) -> Result<()> {
        pl::validate_call(logits.rows, logits.vocab, requests)?;
        self.check_device_logits(logits, out)?;
        let b = logits.rows;
        if out.lp_words < b * draws {
            return Err(Error::Shape(format!(
                "{draws} draws of {b} rows do not fit outputs of {} words",
                out.lp_words
            )));
        }
        let v = logits.vocab;
        let groups = v.div_ceil(4);
        let draw_lanes = groups
            .div_ceil(DRAW_GROUPS_PER_LANE)
            .next_power_of_two()
            .clamp(1, DRAW_WG);
        let draw_groups = draws.div_ceil(DRAW_WG / draw_lanes);
        if draw_groups > MAX_GRID {
            return Err(Error::Shape(format!(
                "{draws} draws in one device call; at most {}",
                MAX_GRID * (DRAW_WG / draw_lanes)
            )));
        }
        if b == 0 {
            return Ok(());
        }
        out.vocab.store(v, Ordering::Relaxed);
        let mut sc = self.scratch.lock().map_err(|_| poisoned())?;
        // Rows and touches, in host buffers reused between calls.
        let mut host = std::mem::take(&mut sc.host_lists);
        host.rows.clear();
        host.touches.clear();
        for (r, req) in requests.iter().enumerate() {
            let off = host.touches.len();
            host.touched.clear();
            pl::touches_into(req, &mut host.touched);
            host.touches
                .extend(host.touched.iter().map(|&(token, t)| TouchU {
                    token,
                    row: r as u32,
                    flags: u32::from(t.bias.is_some()) | (u32::from(t.seen) << 1),
                    count: t.count,
                    bias: t.bias.unwrap_or(0.0),
                    ..Default::default()
                }));
            host.rows
                .push(row_params(req, v, off, host.touches.len() - off)?);
        }
        let n_touches = host.touches.len();
        if host.touches.is_empty() {
            host.touches.push(TouchU::default());
        }
        let (splits, chunk) = self.split(v, b);
        let bm_words = v.div_ceil(32);
        let call = CallU {
            rows: b as u32,
            vocab: v as u32,
            stride: logits.row_stride as u32,
            dtype: match logits.dtype {
                DType::F32 => 0,
                DType::F16 => 1,
                DType::Bf16 => 2,
            },
            splits: splits as u32,
            chunk: chunk as u32,
            base: logits.offset as u32,
            bm_words: bm_words as u32,
            n_touches: n_touches as u32,
            draws: draws as u32,
            draw_lanes: draw_lanes as u32,
            zero: 0,
        };

        let dev = &self.device;
        let mut grown = false;
        grown |= sc
            .rows
            .ensure(dev, std::mem::size_of_val(host.rows.as_slice()) as u64);
        grown |= sc
            .touches
            .ensure(dev, std::mem::size_of_val(host.touches.as_slice()) as u64);
        grown |= sc.state.ensure(dev, (b * STATE_WORDS * 4) as u64);
        grown |= sc.slots.ensure(dev, (b * splits * SLOT_WORDS * 4) as u64);
        grown |= sc.hist.ensure(dev, (b * HIST_WORDS * 4) as u64);
        grown |= sc.bitmap.ensure(dev, (b * bm_words * 4) as u64);
        if grown {
            self.created.fetch_add(1, Ordering::Relaxed);
            sc.generation += 1;
        }
        // The call's parameters: one staging buffer of its own, [call | rows | touches].
        let call_bytes = bytemuck::bytes_of(&call);
        let rows_bytes: &[u8] = bytemuck::cast_slice(&host.rows);
        let touch_bytes: &[u8] = bytemuck::cast_slice(&host.touches);
        host.bytes.clear();
        host.bytes.extend_from_slice(call_bytes);
        host.bytes.extend_from_slice(rows_bytes);
        host.bytes.extend_from_slice(touch_bytes);
        let (stage, made) = self.stages.take(dev, host.bytes.len() as u64);
        if made {
            self.created.fetch_add(1, Ordering::Relaxed);
        }
        self.queue.write_buffer(&stage, 0, &host.bytes);
        let (c, r) = (call_bytes.len() as u64, rows_bytes.len() as u64);
        encoder.copy_buffer_to_buffer(&stage, 0, &sc.call, 0, c);
        encoder.copy_buffer_to_buffer(&stage, c, &sc.rows.buf, 0, r);
        encoder.copy_buffer_to_buffer(&stage, c + r, &sc.touches.buf, 0, touch_bytes.len() as u64);
        self.stages.release_after(encoder, stage);
        sc.host_lists = host;

        let key = BindKey {
            logits: logits.buffer.clone(),
            tokens: out.tokens.clone(),
            generation: sc.generation,
        };
        if !matches!(&sc.bind, Some((k, _)) if *k == key) {
            self.created.fetch_add(1, Ordering::Relaxed);
            let bufs = [
                &sc.call,
                logits.buffer,
                &sc.rows.buf,
                &sc.touches.buf,
                &sc.state.buf,
                &sc.slots.buf,
                &sc.hist.buf,
                &sc.bitmap.buf,
                &out.tokens,
                &out.status,
                &out.logprobs,
            ];
            let entries: Vec<wgpu::BindGroupEntry<'_>> = bufs
                .iter()
                .enumerate()
                .map(|(i, buf)| wgpu::BindGroupEntry {
                    binding: i as u32,
                    resource: buf.as_entire_binding(),
                })
                .collect();
            let group = dev.create_bind_group(&wgpu::BindGroupDescriptor {
                label: Some("decoda"),
                layout: &self.pipes.layout,
                entries: &entries,
            });
            sc.bind = Some((key, group));
        }
        let group = &sc.bind.as_ref().expect("bind group set above").1;

        let touch_groups = n_touches.div_ceil(64).max(1);
        let (tx, ty) = if touch_groups <= MAX_GRID {
            (touch_groups, 1)
        } else {
            (MAX_GRID, touch_groups.div_ceil(MAX_GRID))
        };
        let (sx, sy) = (splits as u32, b as u32);
        let rows = b as u32;
        let p = &self.pipes;
        let mut pass = encoder.begin_compute_pass(&wgpu::ComputePassDescriptor {
            label: Some("decoda sample"),
            timestamp_writes: timestamps.map(|q| wgpu::ComputePassTimestampWrites {
                query_set: q,
                beginning_of_pass_write_index: Some(0),
                end_of_pass_write_index: Some(1),
            }),
        });
        pass.set_bind_group(0, group, &[]);
        let mut run = |pipe: &wgpu::ComputePipeline, x: u32, y: u32| {
            pass.set_pipeline(pipe);
            pass.dispatch_workgroups(x, y, 1);
        };
        run(&p.touch, tx as u32, ty as u32);
        run(&p.stats, sx, sy);
        run(&p.decide_stats, rows, 1);
        for _ in 0..3 {
            run(&p.hist_k, sx, sy);
            run(&p.decide_k, rows, 1);
        }
        for _ in 0..3 {
            run(&p.hist_p, sx, sy);
            run(&p.decide_p, rows, 1);
        }
        run(&p.draw, sx, sy);
        run(&p.finish, rows, 1);
        run(&p.rank_topn, sx, sy);
        run(&p.finish_lp, rows, 1);
        if draws > 0 {
            run(&p.draw_many, draw_groups as u32, rows);
        }
        run(&p.untouch, tx as u32, ty as u32);
        Ok(())
    }
}

pub(crate) fn poisoned() -> Error {
    Error::Device("a previous call panicked while holding the sampler".into())
}

/// The sampler's view of a request's row parameters.
fn row_params(req: &Request, vocab: usize, touch_off: usize, touch_len: usize) -> Result<RowU> {
    let p = &req.params;
    let s = &req.state;
    let mut flags = 0;
    if touch_len > 0 {
        flags |= F_TOUCH;
    }
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
    let off = u32::try_from(touch_off)
        .map_err(|_| Error::Shape("too many penalised tokens in one call".into()))?;
    Ok(RowU {
        temperature: p.temperature,
        top_k: p.top_k,
        top_p: p.top_p,
        ln_min_p: pl::min_p_threshold(0.0, p.min_p),
        rep: p.repetition_penalty,
        freq: p.frequency_penalty,
        pres: p.presence_penalty,
        flags,
        seed_lo: s.seed as u32,
        seed_hi: (s.seed >> 32) as u32,
        step_lo: s.step as u32,
        step_hi: (s.step >> 32) as u32,
        touch_off: off,
        touch_len: touch_len as u32,
        n_lp: p.logprobs.unwrap_or(0).min(MAX_LOGPROBS),
        pad: 0,
    })
}
