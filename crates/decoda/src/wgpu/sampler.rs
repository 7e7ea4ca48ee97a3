//! The sampler object and the device API: recording one call into the caller's encoder.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Mutex;

use crate::error::{Error, Result};
use crate::params::Request;
use crate::pipeline::{self as pl, Row};

use super::buffers::{make_buffer, Grow};
use super::call::{
    bind_group, call_block, dry_lists, push_history, row_flags, slot_params, CallShape, MAX_VOCAB,
};
use super::device::{poisoned, WgpuDevice};
use super::kernels::{self, Kernels, Plan, RowNeeds, Sizes, StepBuffers, StepShape, StepStamps};
use super::layout::*;
use super::options::WgpuOptions;
use super::views::{DeviceLogits, DeviceMasks, DeviceOutputs};

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
        let kernels = Kernels::of(&ctx)?;
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
            min_chunk: AtomicUsize::new(device.min_chunk()),
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

    /// How many of the step kernels' pipelines the device has built: each is built the
    /// first time a call needs it (a greedy call builds 2 of the 9).
    #[doc(hidden)]
    pub fn pipelines_built(&self) -> usize {
        self.kernels.pipes.built()
    }

    /// The step kernels' pipelines built so far, each with the seconds it took to build
    /// (wall clock, in this process): the start-up cost a first call pays. A driver with a
    /// disk cache of compiled shaders still spends its own time on each (lavapipe: its
    /// NIR passes, most of a second for `settle`).
    pub fn pipeline_build_times(&self) -> Vec<(&'static str, f64)> {
        self.kernels.pipes.build_times()
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

    /// The fewest logits one workgroup handles (default 1,024 on a GPU, 4,096 on a software
    /// adapter): a row of V logits is cut
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

    /// The passes a call of these rows records (`draws`: many draws per row), and the
    /// full-row path's phases among them ([`kernels::phases`]).
    pub(crate) fn plan_for(rows: &[Row<'_>], vocab: usize, draws: usize) -> (Plan, usize) {
        let scatter = rows.iter().any(|r| {
            let q = r.request();
            q.params.modifies_logits(&q.state)
        });
        let needs = rows.iter().map(|r| {
            let p = &r.request().params;
            RowNeeds::of(row_flags(p, vocab), p.temperature)
        });
        (
            Plan::of(needs.clone(), scatter, draws > 0),
            kernels::phases(needs),
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
        let (plan, phases) = Self::plan_for(rows, v, draws);
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
        let (sample_parts, sample_chunk) = self.kernels.sample_split(v, chunk);
        let call = call_block(
            logits,
            masks,
            CallShape {
                rows: b,
                splits,
                chunk,
                sample_chunk,
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
            &sc.bufs,
            StepShape {
                rows: b,
                splits,
                draw_groups: if draws > 0 { draw_groups } else { 0 },
                plan,
                phases,
                sample_parts,
                vocab: v,
            },
            stamps,
        );
        Ok(())
    }
}
