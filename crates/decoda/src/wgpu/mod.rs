//! The device backend: the sampling contract as WGSL compute shaders, through wgpu
//! (Vulkan, Metal, DX12). Enabled by the `wgpu` feature.
//!
//! Two ways in:
//! - [`Backend::sample`] takes host logits like every backend: it uploads them, runs the
//!   shaders, and reads the results back.
//! - The device API keeps the logits on the device: [`WgpuSampler::record`] records the
//!   whole call into the caller's [`wgpu::CommandEncoder`] for logits already in a
//!   [`wgpu::Buffer`] ([`DeviceLogits`]), writing tokens, per-row status and log-probabilities
//!   into [`DeviceOutputs`]. It submits nothing, reads nothing back, and after the first
//!   call of a given size allocates nothing.
//!
//! Every call runs the same fixed sequence of dispatches whatever the data (see
//! `sample.wgsl`): the top-k value and the top-p cut are exact radix selects (three
//! passes each), so there are no retry rounds. The noise and the top-p weights use the
//! same `ln`/`exp` algorithm as the CPU ([`crate::fmath`]).
//!
//! ```no_run
//! use decoda::wgpu::WgpuSampler;
//! use decoda::{Backend, Logits, Request, SamplingParams};
//!
//! let sampler = WgpuSampler::new()?; // a hardware adapter first, else a software one
//! let logits = vec![0.5f32, 2.0, 1.0, -1.0];
//! let out = sampler.sample(&Logits::f32(&logits, 1, 4)?, &[Request::new(SamplingParams::default(), 7)])?;
//! assert!(out[0].as_ref().unwrap().token < 4);
//! # Ok::<(), decoda::Error>(())
//! ```

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Mutex;

use crate::backend::Backend;
use crate::error::{Error, Result, RowError};
use crate::logits::{DType, Logits, LogitsData};
use crate::params::{LogprobsMode, Request, MAX_LOGPROBS};
use crate::pipeline::{self as pl, RowResult, Sample, TokenLogprobs, TopLogprob};

/// The WGSL of the sampler's kernels, without the reductions.
pub const SHADER_MAIN: &str = include_str!("sample.wgsl");
/// Workgroup reductions through workgroup memory (the portable path).
pub const REDUCE_WG: &str = include_str!("reduce_wg.wgsl");
/// Workgroup reductions with subgroup operations (device feature `SUBGROUP`).
pub const REDUCE_SG: &str = include_str!("reduce_sg.wgsl");

/// The complete WGSL module: with `subgroups`, the reductions use subgroup operations
/// (every entry point then also takes its subgroup builtins); without, workgroup memory.
/// Both are validated and translated for every platform by the `shaders` test.
pub fn shader_source(subgroups: bool) -> String {
    if !subgroups {
        return format!("{SHADER_MAIN}\n{REDUCE_WG}");
    }
    let sig = "@builtin(local_invocation_index) lid: u32) {\n";
    let with = "@builtin(local_invocation_index) lid: u32, \
                @builtin(subgroup_invocation_id) sg_l: u32, @builtin(subgroup_id) sg_i: u32, \
                @builtin(num_subgroups) sg_n: u32) {\n    sg_set(sg_l, sg_i, sg_n);\n";
    // (naga, which wgpu compiles WGSL with, enables subgroup operations through the
    // device's SUBGROUP feature and rejects the `enable subgroups;` directive)
    format!("{}\n{REDUCE_SG}", SHADER_MAIN.replace(sig, with))
}

/// How to build a [`WgpuSampler`]; `Default` = subgroups by adapter kind, any adapter.
#[derive(Debug, Clone, Copy, Default)]
pub struct WgpuOptions {
    /// Subgroup operations for the reductions: `None` (default) uses them on hardware
    /// adapters that have them and not on software ones (on lavapipe they measured
    /// 1.3-2x slower than workgroup memory); `Some(true)` whenever the adapter has them;
    /// `Some(false)` never. Results are the same either way. `DECODA_WGPU_SUBGROUPS=0`
    /// or `=1` overrides `None`.
    pub subgroups: Option<bool>,
    /// Accept only a hardware adapter (no software one such as lavapipe).
    pub hardware_only: bool,
}

/// Environment variable: a substring of the adapter name to use (`llvmpipe`, `H100`, ...).
pub const ADAPTER_ENV: &str = "DECODA_WGPU_ADAPTER";
/// Environment variable: `0` or `1` turns subgroup operations off or on where
/// [`WgpuOptions::subgroups`] is `None`.
pub const SUBGROUPS_ENV: &str = "DECODA_WGPU_SUBGROUPS";

const WG: usize = 256;
const HIST_WORDS: usize = 6144;
const STATE_WORDS: usize = 32;
const SLOT_WORDS: usize = 52;
/// Staging areas for per-call parameters: up to this many calls may be recorded before
/// their submit.
const STAGES: usize = 8;
const LP_WORDS: usize = 44;
const MAX_SPLITS: usize = 256;
const MAX_GRID: usize = 65535;
/// Rows per piece when [`Backend::sample`] splits a large host batch.
const HOST_PIECE_ROWS: usize = 1024;

const F_TOUCH: u32 = 1;
const F_LOGPROBS: u32 = 2;
const F_PROCESSED: u32 = 4;
const F_TOP_P: u32 = 8;
const F_TOP_K: u32 = 16;

#[repr(C)]
#[derive(Clone, Copy, Debug, Default, bytemuck::Pod, bytemuck::Zeroable)]
struct CallU {
    rows: u32,
    vocab: u32,
    stride: u32,
    dtype: u32,
    splits: u32,
    chunk: u32,
    base: u32,
    bm_words: u32,
    n_touches: u32,
    draws: u32,
    pad: [u32; 2],
}

#[repr(C)]
#[derive(Clone, Copy, Debug, Default, bytemuck::Pod, bytemuck::Zeroable)]
struct RowU {
    temperature: f32,
    top_k: u32,
    top_p: f32,
    ln_min_p: f32,
    rep: f32,
    freq: f32,
    pres: f32,
    flags: u32,
    seed_lo: u32,
    seed_hi: u32,
    step_lo: u32,
    step_hi: u32,
    touch_off: u32,
    touch_len: u32,
    n_lp: u32,
    pad: u32,
}

#[repr(C)]
#[derive(Clone, Copy, Debug, Default, bytemuck::Pod, bytemuck::Zeroable)]
struct TouchU {
    token: u32,
    row: u32,
    flags: u32,
    count: u32,
    bias: f32,
    z: f32,
    pad: [u32; 2],
}

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
/// 0 = ok, 1 = `NonFiniteLogits` with the count in the second word, 2 = `NoCandidate`)
/// and `logprobs` (44 u32 per row: chosen logprob (f32 bits), rank, number listed, then
/// up to 20 pairs of token and logprob). All three have `STORAGE | COPY_SRC` usage.
#[derive(Debug)]
pub struct DeviceOutputs {
    rows: usize,
    lp_words: usize,
    tokens: wgpu::Buffer,
    status: wgpu::Buffer,
    logprobs: wgpu::Buffer,
    readback: wgpu::Buffer,
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

struct Pipelines {
    touch: wgpu::ComputePipeline,
    untouch: wgpu::ComputePipeline,
    stats: wgpu::ComputePipeline,
    decide_stats: wgpu::ComputePipeline,
    hist_k: wgpu::ComputePipeline,
    decide_k: wgpu::ComputePipeline,
    hist_p: wgpu::ComputePipeline,
    decide_p: wgpu::ComputePipeline,
    draw: wgpu::ComputePipeline,
    finish: wgpu::ComputePipeline,
    rank_topn: wgpu::ComputePipeline,
    finish_lp: wgpu::ComputePipeline,
    draw_many: wgpu::ComputePipeline,
}

/// One call's parameters on their way to the device: written with `Queue::write_buffer`
/// and copied into the working buffers by the call's own commands, so calls recorded
/// before a submit do not overwrite each other's parameters.
struct Stage {
    call: wgpu::Buffer,
    rows: Grow,
    touches: Grow,
}

/// Scratch buffers, grown on demand and reused.
struct Scratch {
    stages: Vec<Stage>,
    next_stage: usize,
    call: wgpu::Buffer,
    rows: Grow,
    touches: Grow,
    state: Grow,
    slots: Grow,
    hist: Grow,
    bitmap: Grow,
    /// Bumped whenever a scratch buffer is replaced (cached bind groups are then stale).
    generation: u64,
    bind: Option<(BindKey, wgpu::BindGroup)>,
    host_logits: Grow,
    host_out: Option<DeviceOutputs>,
    host_lists: HostLists,
}

/// Per-call parameter lists built on the host, kept to reuse their allocations.
#[derive(Default)]
struct HostLists {
    rows: Vec<RowU>,
    touches: Vec<TouchU>,
    touched: Vec<(u32, pl::Touch)>,
}

#[derive(PartialEq)]
struct BindKey {
    logits: wgpu::Buffer,
    tokens: wgpu::Buffer,
    generation: u64,
}

struct Grow {
    buf: wgpu::Buffer,
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
    fn ensure(&mut self, device: &wgpu::Device, bytes: u64) -> bool {
        if self.buf.size() >= bytes {
            return false;
        }
        let size = bytes.max(self.buf.size() * 2).next_multiple_of(256);
        self.buf = make_buffer(device, self.label, size, self.usage);
        true
    }
}

fn make_buffer(
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

/// The wgpu sampler. Cheap to share between threads (`&self` everywhere; calls are
/// serialised internally).
pub struct WgpuSampler {
    device: wgpu::Device,
    queue: wgpu::Queue,
    info: wgpu::AdapterInfo,
    layout: wgpu::BindGroupLayout,
    pipes: Pipelines,
    scratch: Mutex<Scratch>,
    /// Held for a whole host call (upload, record, submit, read back).
    host_call: Mutex<()>,
    min_chunk: AtomicUsize,
    /// Device objects (buffers, bind groups) `record` has created: flat after warm-up.
    created: AtomicU64,
    timestamps: bool,
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

/// One adapter the sampler can run on.
#[derive(Debug, Clone)]
pub struct AdapterSummary {
    /// The adapter's name (`NVIDIA H100 80GB HBM3`, `llvmpipe (LLVM 15.0.6, 256 bits)`).
    pub name: String,
    /// Vulkan, Metal, Dx12, ...
    pub backend: String,
    /// Whether it is a CPU (software) adapter.
    pub software: bool,
}

fn instance() -> wgpu::Instance {
    wgpu::Instance::default()
}

fn adapters(instance: &wgpu::Instance) -> Vec<wgpu::Adapter> {
    pollster::block_on(instance.enumerate_adapters(wgpu::Backends::all()))
        .into_iter()
        .filter(|a| {
            let i = a.get_info();
            // only adapters that can run compute shaders
            i.backend != wgpu::Backend::Noop && i.backend != wgpu::Backend::Gl
        })
        .collect()
}

fn is_software(info: &wgpu::AdapterInfo) -> bool {
    info.device_type == wgpu::DeviceType::Cpu
}

/// Lists the adapters wgpu finds, hardware ones first.
pub fn list_adapters() -> Vec<AdapterSummary> {
    let mut v: Vec<AdapterSummary> = adapters(&instance())
        .iter()
        .map(|a| {
            let i = a.get_info();
            AdapterSummary {
                name: i.name.clone(),
                backend: format!("{:?}", i.backend),
                software: is_software(&i),
            }
        })
        .collect();
    v.sort_by_key(|a| a.software);
    v
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
        let hardware_only = options.hardware_only;
        let inst = instance();
        let mut all = adapters(&inst);
        if all.is_empty() {
            return Err(Error::NoDevice(
                "wgpu found no Vulkan, Metal or DX12 adapter (on Linux without a GPU, install \
                 Mesa's lavapipe: apt-get install mesa-vulkan-drivers libvulkan1)"
                    .into(),
            ));
        }
        all.sort_by_key(|a| is_software(&a.get_info()));
        let names: Vec<String> = all.iter().map(|a| a.get_info().name).collect();
        let chosen = match std::env::var(ADAPTER_ENV) {
            Ok(want) if !want.is_empty() => {
                let w = want.to_lowercase();
                all.into_iter()
                    .find(|a| a.get_info().name.to_lowercase().contains(&w))
                    .ok_or_else(|| {
                        Error::NoDevice(format!(
                            "{ADAPTER_ENV}={want:?} matches no adapter (found: {names:?})"
                        ))
                    })?
            }
            _ => {
                let a = all.into_iter().next().expect("non-empty");
                if hardware_only && is_software(&a.get_info()) {
                    return Err(Error::NoDevice(format!(
                        "no hardware GPU adapter (found only software ones: {names:?})"
                    )));
                }
                a
            }
        };
        let mut features = wgpu::Features::empty();
        let timestamps = chosen.features().contains(wgpu::Features::TIMESTAMP_QUERY);
        if timestamps {
            features |= wgpu::Features::TIMESTAMP_QUERY;
        }
        let want_subgroups =
            options
                .subgroups
                .unwrap_or_else(|| match std::env::var(SUBGROUPS_ENV).as_deref() {
                    Ok("0") => false,
                    Ok("1") => true,
                    _ => !is_software(&chosen.get_info()),
                });
        if want_subgroups && chosen.features().contains(wgpu::Features::SUBGROUP) {
            features |= wgpu::Features::SUBGROUP;
        }
        let (device, queue) = pollster::block_on(chosen.request_device(&wgpu::DeviceDescriptor {
            label: Some("decoda"),
            required_features: features,
            required_limits: chosen.limits(),
            ..Default::default()
        }))
        .map_err(|e| Error::NoDevice(format!("{}: {e}", chosen.get_info().name)))?;
        Self::build(device, queue, chosen.get_info(), timestamps)
    }

    /// A sampler on an application's device and queue (for example the one its model runs
    /// on), so logits never leave it. Subgroup operations are used when the device was
    /// created with `Features::SUBGROUP`. The device needs at least 10 storage buffers per
    /// shader stage and 16 KiB of workgroup memory (what every desktop adapter offers).
    pub fn from_device(device: wgpu::Device, queue: wgpu::Queue) -> Result<Self> {
        let info = device.adapter_info();
        let timestamps = device.features().contains(wgpu::Features::TIMESTAMP_QUERY);
        Self::build(device, queue, info, timestamps)
    }

    fn build(
        device: wgpu::Device,
        queue: wgpu::Queue,
        info: wgpu::AdapterInfo,
        timestamps: bool,
    ) -> Result<Self> {
        let subgroups = device.features().contains(wgpu::Features::SUBGROUP);
        let limits = device.limits();
        if limits.max_storage_buffers_per_shader_stage < 10 {
            return Err(Error::NoDevice(format!(
                "{}: max_storage_buffers_per_shader_stage = {}, the sampler needs 10 (request \
                 the adapter's limits when creating the device)",
                info.name, limits.max_storage_buffers_per_shader_stage
            )));
        }
        if limits.max_compute_workgroup_storage_size < 16384
            || limits.max_compute_invocations_per_workgroup < WG as u32
        {
            return Err(Error::NoDevice(format!(
                "{}: compute limits too small (workgroup storage {} B, {} invocations)",
                info.name,
                limits.max_compute_workgroup_storage_size,
                limits.max_compute_invocations_per_workgroup
            )));
        }
        let scope = device.push_error_scope(wgpu::ErrorFilter::Validation);
        let module = device.create_shader_module(wgpu::ShaderModuleDescriptor {
            label: Some("decoda sample.wgsl"),
            source: wgpu::ShaderSource::Wgsl(shader_source(subgroups).into()),
        });
        let storage = |binding: u32, read_only: bool| wgpu::BindGroupLayoutEntry {
            binding,
            visibility: wgpu::ShaderStages::COMPUTE,
            ty: wgpu::BindingType::Buffer {
                ty: wgpu::BufferBindingType::Storage { read_only },
                has_dynamic_offset: false,
                min_binding_size: None,
            },
            count: None,
        };
        let mut entries = vec![wgpu::BindGroupLayoutEntry {
            binding: 0,
            visibility: wgpu::ShaderStages::COMPUTE,
            ty: wgpu::BindingType::Buffer {
                ty: wgpu::BufferBindingType::Uniform,
                has_dynamic_offset: false,
                min_binding_size: None,
            },
            count: None,
        }];
        entries.push(storage(1, true));
        entries.push(storage(2, true));
        for b in 3..=10 {
            entries.push(storage(b, false));
        }
        let layout = device.create_bind_group_layout(&wgpu::BindGroupLayoutDescriptor {
            label: Some("decoda"),
            entries: &entries,
        });
        let pl_layout = device.create_pipeline_layout(&wgpu::PipelineLayoutDescriptor {
            label: Some("decoda"),
            bind_group_layouts: &[Some(&layout)],
            immediate_size: 0,
        });
        let make = |entry: &str| {
            device.create_compute_pipeline(&wgpu::ComputePipelineDescriptor {
                label: Some(entry),
                layout: Some(&pl_layout),
                module: &module,
                entry_point: Some(entry),
                compilation_options: Default::default(),
                cache: None,
            })
        };
        let pipes = Pipelines {
            touch: make("touch"),
            untouch: make("untouch"),
            stats: make("stats"),
            decide_stats: make("decide_stats"),
            hist_k: make("hist_k"),
            decide_k: make("decide_k"),
            hist_p: make("hist_p"),
            decide_p: make("decide_p"),
            draw: make("draw"),
            finish: make("finish"),
            rank_topn: make("rank_topn"),
            finish_lp: make("finish_lp"),
            draw_many: make("draw_many"),
        };
        if let Some(e) = pollster::block_on(scope.pop()) {
            return Err(Error::Device(format!(
                "{}: building the shaders failed: {e}",
                info.name
            )));
        }
        use wgpu::BufferUsages as U;
        let st = U::STORAGE | U::COPY_DST;
        let stage_usage = U::COPY_SRC | U::COPY_DST;
        let scratch = Scratch {
            stages: (0..STAGES)
                .map(|_| Stage {
                    call: make_buffer(
                        &device,
                        "decoda call stage",
                        std::mem::size_of::<CallU>() as u64,
                        stage_usage,
                    ),
                    rows: Grow::new(&device, "decoda rows stage", stage_usage),
                    touches: Grow::new(&device, "decoda touches stage", stage_usage),
                })
                .collect(),
            next_stage: 0,
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
            host_logits: Grow::new(&device, "decoda host logits", st),
            host_out: None,
            host_lists: HostLists::default(),
        };
        Ok(Self {
            device,
            queue,
            info,
            layout,
            pipes,
            scratch: Mutex::new(scratch),
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
        is_software(&self.info)
    }

    /// Whether the reductions use subgroup operations (the adapter has them and they
    /// chosen, see [`WgpuOptions::subgroups`]).
    pub fn uses_subgroups(&self) -> bool {
        self.subgroups
    }

    /// How many times [`WgpuSampler::record`] has had to create device objects (grow a
    /// scratch or staging buffer, build a bind group). It stops moving once calls repeat
    /// the same sizes and buffers: the steady state allocates nothing on the device.
    pub fn device_objects_created(&self) -> u64 {
        self.created.load(Ordering::Relaxed)
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
    fn outputs_for(&self, rows: usize, lp_words: usize) -> Result<DeviceOutputs> {
        use wgpu::BufferUsages as U;
        let rows1 = rows.max(1) as u64;
        let lp_words = lp_words.max(LP_WORDS) as u64;
        let u = U::STORAGE | U::COPY_SRC | U::COPY_DST;
        Ok(DeviceOutputs {
            rows,
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
    /// results into `out`. Nothing is submitted or read back. The per-call parameters
    /// (a few dozen bytes a row) go through one of 8 staging areas, written with
    /// [`wgpu::Queue::write_buffer`] and copied by the recorded commands themselves, so up
    /// to 8 calls may be recorded (into one encoder or several) before they are
    /// submitted; calls that share `out` overwrite each other's results in order.
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

    fn record_inner(
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
        if b == 0 {
            return Ok(());
        }
        let v = logits.vocab;
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
        // Splits.
        let min_chunk = self.min_chunk.load(Ordering::Relaxed).max(4);
        let by_size = v.div_ceil(min_chunk).max(1);
        let by_batch = 512usize.div_ceil(b).max(1);
        let mut splits = by_size.min(by_batch).clamp(1, MAX_SPLITS);
        let chunk = v.div_ceil(splits).next_multiple_of(4);
        splits = v.div_ceil(chunk);
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
            pad: [0; 2],
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
        let rows_bytes: &[u8] = bytemuck::cast_slice(&host.rows);
        let touch_bytes: &[u8] = bytemuck::cast_slice(&host.touches);
        let k = sc.next_stage;
        sc.next_stage = (k + 1) % STAGES;
        let stage = &mut sc.stages[k];
        if stage.rows.ensure(dev, rows_bytes.len() as u64)
            | stage.touches.ensure(dev, touch_bytes.len() as u64)
        {
            self.created.fetch_add(1, Ordering::Relaxed);
        }
        self.queue
            .write_buffer(&stage.call, 0, bytemuck::bytes_of(&call));
        self.queue.write_buffer(&stage.rows.buf, 0, rows_bytes);
        self.queue.write_buffer(&stage.touches.buf, 0, touch_bytes);
        let stage = &sc.stages[k];
        let copies = [
            (&stage.call, &sc.call, std::mem::size_of::<CallU>()),
            (&stage.rows.buf, &sc.rows.buf, rows_bytes.len()),
            (&stage.touches.buf, &sc.touches.buf, touch_bytes.len()),
        ];
        for (from, to, bytes) in copies {
            encoder.copy_buffer_to_buffer(from, 0, to, 0, bytes as u64);
        }
        sc.host_lists = host;

        let key = BindKey {
            logits: logits.buffer.clone(),
            tokens: out.tokens.clone(),
            generation: sc.generation,
        };
        let fresh = !matches!(&sc.bind, Some((k, _)) if *k == key);
        if fresh {
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
                layout: &self.layout,
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
            run(&p.draw_many, draws.div_ceil(64) as u32, rows);
        }
        run(&p.untouch, tx as u32, ty as u32);
        Ok(())
    }

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
            .device
            .create_command_encoder(&wgpu::CommandEncoderDescriptor { label: None });
        let bytes = copy_results(&mut enc, out, b, b * LP_WORDS);
        self.queue.submit([enc.finish()]);
        Ok(parse_results(
            &self.map_words(&out.readback, bytes)?,
            requests,
        ))
    }

    fn map_words(&self, buf: &wgpu::Buffer, bytes: u64) -> Result<Vec<u32>> {
        let slice = buf.slice(0..bytes);
        let (tx, rx) = std::sync::mpsc::channel();
        slice.map_async(wgpu::MapMode::Read, move |r| {
            let _ = tx.send(r);
        });
        self.device
            .poll(wgpu::PollType::wait_indefinitely())
            .map_err(|e| Error::Device(format!("waiting for the device: {e}")))?;
        rx.recv()
            .map_err(|_| Error::Device("the map callback never ran".into()))?
            .map_err(|e| Error::Device(format!("mapping the results: {e}")))?;
        let words = {
            let view = slice
                .get_mapped_range()
                .map_err(|e| Error::Device(format!("mapping the results: {e}")))?;
            bytemuck::cast_slice::<u8, u32>(&view).to_vec()
        };
        buf.unmap();
        Ok(words)
    }

    /// One host call: uploads the logits into the sampler's buffer, records the call
    /// (with `draws` > 0, the many-draws kernel too), copies the results into the readback
    /// buffer in the same encoder, submits once and maps them. Returns the words: tokens
    /// `[B]`, status `[B, 2]`, then `[B, 44]` logprobs or `[B, draws]` tokens.
    fn host_call(
        &self,
        logits: &Logits<'_>,
        requests: &[Request],
        draws: usize,
    ) -> Result<Vec<u32>> {
        let _call = self.host_call.lock().map_err(|_| poisoned())?;
        let b = logits.rows();
        let lp_words = if draws > 0 { b * draws } else { b * LP_WORDS };
        let (buf, out) = {
            let mut sc = self.scratch.lock().map_err(|_| poisoned())?;
            if sc.host_logits.ensure(&self.device, logits_size(logits)) {
                sc.generation += 1;
            }
            self.write_logits(&sc.host_logits.buf, logits);
            let out = match sc.host_out.take() {
                Some(o) if o.rows >= b && o.lp_words >= lp_words => o,
                _ => self.outputs_for(b.max(64), lp_words.max(64 * LP_WORDS))?,
            };
            (sc.host_logits.buf.clone(), out)
        };
        let view = DeviceLogits {
            buffer: &buf,
            dtype: logits.dtype(),
            rows: b,
            vocab: logits.vocab(),
            row_stride: logits.vocab(),
            offset: 0,
        };
        let result = (|| {
            let mut enc = self
                .device
                .create_command_encoder(&wgpu::CommandEncoderDescriptor { label: None });
            let scope = self.device.push_error_scope(wgpu::ErrorFilter::Validation);
            self.record_inner(&mut enc, &view, requests, &out, None, draws)?;
            let bytes = copy_results(&mut enc, &out, b, lp_words);
            self.queue.submit([enc.finish()]);
            if let Some(e) = pollster::block_on(scope.pop()) {
                return Err(Error::Device(format!("{}: {e}", self.info.name)));
            }
            self.map_words(&out.readback, bytes)
        })();
        self.scratch.lock().map_err(|_| poisoned())?.host_out = Some(out);
        result
    }

    /// Rows per host call: as many as one storage binding holds, at most `cap`.
    fn rows_per_call(&self, logits: &Logits<'_>, cap: usize) -> Result<usize> {
        let limits = self.device.limits();
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

    /// GPU time of `iters` calls on device logits, in microseconds each, from timestamp
    /// queries around the call's compute pass. [`Error::Device`] when the adapter has no
    /// timestamps.
    pub fn time_gpu(
        &self,
        logits: &DeviceLogits<'_>,
        requests: &[Request],
        out: &DeviceOutputs,
        iters: usize,
    ) -> Result<Vec<f64>> {
        if !self.timestamps {
            return Err(Error::Device(format!(
                "{} has no timestamp queries",
                self.info.name
            )));
        }
        let qs = self.device.create_query_set(&wgpu::QuerySetDescriptor {
            label: Some("decoda timing"),
            ty: wgpu::QueryType::Timestamp,
            count: 2,
        });
        use wgpu::BufferUsages as U;
        let resolve = make_buffer(
            &self.device,
            "decoda ts",
            256,
            U::QUERY_RESOLVE | U::COPY_SRC,
        );
        let read = make_buffer(
            &self.device,
            "decoda ts read",
            256,
            U::MAP_READ | U::COPY_DST,
        );
        let period = f64::from(self.queue.get_timestamp_period());
        let mut times = Vec::with_capacity(iters);
        for _ in 0..iters {
            let mut enc = self
                .device
                .create_command_encoder(&wgpu::CommandEncoderDescriptor { label: None });
            self.record_inner(&mut enc, logits, requests, out, Some(&qs), 0)?;
            enc.resolve_query_set(&qs, 0..2, &resolve, 0);
            enc.copy_buffer_to_buffer(&resolve, 0, &read, 0, 16);
            self.queue.submit([enc.finish()]);
            let w = self.map_words(&read, 16)?;
            let t0 = u64::from(w[0]) | (u64::from(w[1]) << 32);
            let t1 = u64::from(w[2]) | (u64::from(w[3]) << 32);
            times.push(t1.saturating_sub(t0) as f64 * period / 1000.0);
        }
        Ok(times)
    }

    /// Wall-clock microseconds of `iters` calls (record, submit, wait), for adapters
    /// without timestamps.
    pub fn time_wall(
        &self,
        logits: &DeviceLogits<'_>,
        requests: &[Request],
        out: &DeviceOutputs,
        iters: usize,
    ) -> Result<Vec<f64>> {
        let mut times = Vec::with_capacity(iters);
        for _ in 0..iters {
            let t = std::time::Instant::now();
            let mut enc = self
                .device
                .create_command_encoder(&wgpu::CommandEncoderDescriptor { label: None });
            self.record(&mut enc, logits, requests, out)?;
            self.queue.submit([enc.finish()]);
            self.device
                .poll(wgpu::PollType::wait_indefinitely())
                .map_err(|e| Error::Device(format!("waiting for the device: {e}")))?;
            times.push(t.elapsed().as_secs_f64() * 1e6);
        }
        Ok(times)
    }

    /// Copy bandwidth of the device in bytes per second (read plus write), measured by
    /// copying a 64 MiB buffer a few times; the basis of the benchmarks' `floor_us`.
    pub fn copy_bandwidth(&self) -> Result<f64> {
        use wgpu::BufferUsages as U;
        let size: u64 = 64 << 20;
        let a = make_buffer(&self.device, "decoda bw a", size, U::COPY_SRC | U::COPY_DST);
        let b = make_buffer(&self.device, "decoda bw b", size, U::COPY_SRC | U::COPY_DST);
        let mut best = f64::INFINITY;
        for _ in 0..5 {
            let t = std::time::Instant::now();
            let mut enc = self
                .device
                .create_command_encoder(&wgpu::CommandEncoderDescriptor { label: None });
            for _ in 0..4 {
                enc.copy_buffer_to_buffer(&a, 0, &b, 0, size);
            }
            self.queue.submit([enc.finish()]);
            self.device
                .poll(wgpu::PollType::wait_indefinitely())
                .map_err(|e| Error::Device(format!("waiting for the device: {e}")))?;
            best = best.min(t.elapsed().as_secs_f64());
        }
        Ok(2.0 * 4.0 * size as f64 / best)
    }

    /// Uploads host logits into a new device buffer (STORAGE usage), for benchmarks and
    /// tests of the device API.
    pub fn upload_logits(&self, logits: &Logits<'_>) -> wgpu::Buffer {
        let buf = make_buffer(
            &self.device,
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
            self.queue.write_buffer(buf, 0, &bytes[..whole]);
        }
        if whole < bytes.len() {
            let mut tail = [0u8; 4];
            tail[..bytes.len() - whole].copy_from_slice(&bytes[whole..]);
            self.queue.write_buffer(buf, whole as u64, &tail);
        }
    }
}

/// Bytes of a device copy of the logits: whole 4-byte words, at least one.
fn logits_size(logits: &Logits<'_>) -> u64 {
    ((logits.rows() * logits.vocab() * logits.dtype().size()).next_multiple_of(4)).max(4) as u64
}

fn poisoned() -> Error {
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

fn parse_logprobs(w: &[u32]) -> TokenLogprobs {
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

impl Backend for WgpuSampler {
    fn name(&self) -> String {
        format!("wgpu:{}", self.info.name)
    }

    fn sample(&self, logits: &Logits<'_>, requests: &[Request]) -> Result<Vec<RowResult>> {
        pl::validate_call(logits.rows(), logits.vocab(), requests)?;
        let piece = self.rows_per_call(logits, HOST_PIECE_ROWS)?;
        let mut results = Vec::with_capacity(requests.len());
        for start in (0..logits.rows()).step_by(piece) {
            let end = (start + piece).min(logits.rows());
            let reqs = &requests[start..end];
            let words = self.host_call(&logits.slice_rows(start, end)?, reqs, 0)?;
            results.extend(parse_results(&words, reqs));
        }
        Ok(results)
    }

    /// The filters run once per row, then one invocation per draw runs the Gumbel-max over
    /// the kept set at its own step. Rows asking for logprobs go through `sample`.
    fn sample_draws(
        &self,
        logits: &Logits<'_>,
        requests: &[Request],
        draws: usize,
    ) -> Result<Vec<Vec<RowResult>>> {
        pl::validate_call(logits.rows(), logits.vocab(), requests)?;
        if requests.iter().any(|r| r.params.logprobs.is_some()) {
            return crate::backend::draws_by_steps(self, logits, requests, draws);
        }
        let mut out: Vec<Vec<RowResult>> = vec![Vec::with_capacity(draws); requests.len()];
        if draws == 0 {
            return Ok(out);
        }
        let max_words =
            (self.device.limits().max_storage_buffer_binding_size / 4).min(1 << 24) as usize;
        let piece = self.rows_per_call(logits, 64)?;
        for start in (0..logits.rows()).step_by(piece) {
            let end = (start + piece).min(logits.rows());
            let b = end - start;
            let sub = logits.slice_rows(start, end)?;
            let per_call = (max_words / b).clamp(1, MAX_GRID * 64);
            let mut done = 0;
            while done < draws {
                let n = per_call.min(draws - done);
                let reqs = crate::backend::at_step(&requests[start..end], done as u64);
                let words = self.host_call(&sub, &reqs, n)?;
                let (status, tokens) = words[b..].split_at(2 * b);
                for r in 0..b {
                    let row = &tokens[r * n..(r + 1) * n];
                    out[start + r].extend(row.iter().map(|&token| {
                        match row_status(status[2 * r], status[2 * r + 1]) {
                            None => Ok(Sample {
                                token,
                                logprobs: None,
                            }),
                            Some(e) => Err(e),
                        }
                    }));
                }
                done += n;
            }
        }
        Ok(out)
    }
}

/// Records copies of the results of `rows` rows (tokens, status, `lp_words` words of
/// logprobs or draws) into `out.readback`, in that order; returns the bytes copied.
fn copy_results(
    enc: &mut wgpu::CommandEncoder,
    out: &DeviceOutputs,
    rows: usize,
    lp_words: usize,
) -> u64 {
    let parts = [
        (&out.tokens, rows as u64 * 4),
        (&out.status, rows as u64 * 8),
        (&out.logprobs, lp_words as u64 * 4),
    ];
    let mut at = 0;
    for (buf, bytes) in parts {
        enc.copy_buffer_to_buffer(buf, 0, &out.readback, at, bytes);
        at += bytes;
    }
    at
}

/// A row's error from its two status words (`None` = sampled).
fn row_status(code: u32, count: u32) -> Option<RowError> {
    match code {
        0 => None,
        1 => Some(RowError::NonFiniteLogits {
            count: u64::from(count),
        }),
        _ => Some(RowError::NoCandidate),
    }
}

/// Per-row results from words laid out by [`copy_results`] with `[B, 44]` logprobs.
fn parse_results(words: &[u32], requests: &[Request]) -> Vec<RowResult> {
    let b = requests.len();
    let (tokens, rest) = words.split_at(b);
    let (status, lps) = rest.split_at(2 * b);
    requests
        .iter()
        .enumerate()
        .map(
            |(r, req)| match row_status(status[2 * r], status[2 * r + 1]) {
                None => Ok(Sample {
                    token: tokens[r],
                    logprobs: req
                        .params
                        .logprobs
                        .map(|_| parse_logprobs(&lps[r * LP_WORDS..(r + 1) * LP_WORDS])),
                }),
                Some(e) => Err(e),
            },
        )
        .collect()
}
