//! The device context every part of the device backend is built from: [`WgpuDevice`].
//!
//! It holds what lives once per device: the adapter's device and queue (its limits and
//! features: the outcome of the options it was opened with), the compiled pipelines (built once per
//! device, by shader, and shared by every sampler, head, MoE layer and model made from
//! it), the pool of staging buffers that carries per-call parameters, and the size of a
//! weight part. A CUDA or Metal backend written later would hold the same things in a
//! context of its own.

use std::any::Any;
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use crate::error::{Error, Result};

use super::adapter::{self, Opened};
use super::buffers::read_back;
use super::options::WgpuOptions;
use super::staging::StagePool;

/// Pipelines built once per device, by key, of any type.
type PipelineCache = Mutex<HashMap<String, Arc<dyn Any + Send + Sync>>>;

/// One wgpu device and what is kept once per device (see the module docs). Cheap to
/// clone (a reference count); every clone is the same context. [`super::WgpuSampler`],
/// [`super::WgpuHead`], [`super::WgpuMoe`], [`super::WgpuModel`] and
/// [`super::WgpuEngine`] are built from one (or from anything that holds one, such as a
/// sampler: `AsRef<WgpuDevice>`), and share its pipelines.
///
/// ```no_run
/// use decoda::wgpu::{WgpuDevice, WgpuHead, WgpuSampler};
///
/// let device = WgpuDevice::new()?; // a hardware adapter first, else a software one
/// let sampler = WgpuSampler::on(&device)?;
/// let head = WgpuHead::new(&device, 8, 32_000)?; // the same device and pipelines
/// # Ok::<(), decoda::Error>(())
/// ```
#[derive(Clone)]
pub struct WgpuDevice {
    inner: Arc<Context>,
    /// Most bytes of weights one binding holds (`set_weight_part_bytes`): shared by the
    /// clones of this handle, not by handles from [`WgpuDevice::with_weight_part_bytes`].
    weight_part: Arc<AtomicU64>,
}

/// What a [`WgpuDevice`] shares.
struct Context {
    device: wgpu::Device,
    queue: wgpu::Queue,
    info: wgpu::AdapterInfo,
    /// Workgroups a step aims to keep busy (rows times splits).
    target_wg: usize,
    /// The fewest logits a workgroup of the scan handles by default.
    min_chunk: usize,
    /// Calls settle and finish in one dispatch ([`WgpuOptions::fused_settle`]).
    fused: bool,
    /// The probe samples a row in pieces ([`WgpuOptions::sample_pieces`]).
    sample_pieces: bool,
    /// Staging buffers for per-call parameters, shared by everything on the device.
    stages: StagePool,
    pipelines: PipelineCache,
}

impl std::fmt::Debug for WgpuDevice {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WgpuDevice")
            .field("adapter", &self.inner.info.name)
            .field("backend", &self.inner.info.backend)
            .field("subgroups", &self.uses_subgroups())
            .finish()
    }
}

impl AsRef<WgpuDevice> for WgpuDevice {
    fn as_ref(&self) -> &WgpuDevice {
        self
    }
}

impl WgpuDevice {
    /// A device on the best adapter: the one named by `DECODA_WGPU_ADAPTER` (a substring
    /// of its name) when set, else a hardware adapter, else a software one (such as Mesa's
    /// lavapipe). [`Error::NoDevice`] when there is none.
    pub fn new() -> Result<Self> {
        Self::with_options(WgpuOptions::default())
    }

    /// Like [`WgpuDevice::new`], but only a hardware adapter will do (`DECODA_WGPU_ADAPTER`
    /// still applies): what `--device auto` uses before falling back to the CPU.
    pub fn hardware() -> Result<Self> {
        Self::with_options(WgpuOptions {
            hardware_only: true,
            ..Default::default()
        })
    }

    /// A device chosen as [`WgpuDevice::new`] does, with `options`.
    pub fn with_options(options: WgpuOptions) -> Result<Self> {
        let Opened {
            device,
            queue,
            info,
        } = adapter::open(options)?;
        Ok(Self::build(device, queue, info, options))
    }

    /// The context of an application's device and queue (for example the one its model
    /// runs on), so logits never leave it. Subgroup operations are used when the device
    /// was created with `Features::SUBGROUP`, 64-bit integers with `SHADER_INT64`.
    pub fn from_device(device: wgpu::Device, queue: wgpu::Queue) -> Self {
        let info = device.adapter_info();
        Self::build(device, queue, info, WgpuOptions::default())
    }

    fn build(
        device: wgpu::Device,
        queue: wgpu::Queue,
        info: wgpu::AdapterInfo,
        options: WgpuOptions,
    ) -> Self {
        let target_wg = adapter::target_workgroups(&info);
        let software = adapter::is_software(&info);
        Self {
            inner: Arc::new(Context {
                target_wg,
                min_chunk: adapter::min_chunk(software),
                fused: adapter::fused_settle(options.fused_settle, &info),
                sample_pieces: adapter::sample_pieces(options.sample_pieces, software),
                stages: StagePool::new(),
                pipelines: Mutex::new(HashMap::new()),
                device,
                queue,
                info,
            }),
            weight_part: Arc::new(AtomicU64::new(u64::MAX)),
        }
    }

    /// The adapter's description.
    pub(crate) fn info(&self) -> &wgpu::AdapterInfo {
        &self.inner.info
    }

    /// Workgroups a step aims to keep busy on this adapter.
    pub(crate) fn target_wg(&self) -> usize {
        self.inner.target_wg
    }

    /// The fewest logits a workgroup of a step's scan handles by default
    /// (`adapter::min_chunk`).
    pub(crate) fn min_chunk(&self) -> usize {
        self.inner.min_chunk
    }

    /// Whether a call without log-probabilities or draws settles and finishes its rows
    /// in one dispatch, `settle_finish` (else `settle`, then `draw_finish`, and `settle`
    /// itself two but in a light call: `settle_first`, `settle_rest`): see
    /// [`WgpuOptions::fused_settle`]. The same bits either way.
    pub fn fuses_settle(&self) -> bool {
        self.inner.fused
    }

    /// Whether the probe samples a row in pieces, the scan's: see
    /// [`WgpuOptions::sample_pieces`]. The same bits either way.
    pub fn samples_in_pieces(&self) -> bool {
        self.inner.sample_pieces
    }

    /// The staging buffers for per-call parameters.
    pub(crate) fn stages(&self) -> &StagePool {
        &self.inner.stages
    }

    /// The wgpu device.
    pub fn device(&self) -> &wgpu::Device {
        &self.inner.device
    }

    /// The queue everything made from this context submits to.
    pub fn queue(&self) -> &wgpu::Queue {
        &self.inner.queue
    }

    /// The adapter's name and backend, e.g. `llvmpipe (LLVM 15.0.6, 256 bits) (Vulkan)`.
    pub fn adapter(&self) -> String {
        format!("{} ({:?})", self.inner.info.name, self.inner.info.backend)
    }

    /// The adapter's name alone.
    pub fn adapter_name(&self) -> &str {
        &self.inner.info.name
    }

    /// Whether the adapter is a software (CPU) implementation.
    pub fn is_software(&self) -> bool {
        adapter::is_software(&self.inner.info)
    }

    /// Whether Philox's products use 64-bit integers (the device was created with
    /// `SHADER_INT64`, see [`WgpuOptions::int64`]); the bits are the same either way.
    pub fn uses_int64(&self) -> bool {
        self.has(wgpu::Features::SHADER_INT64)
    }

    /// Whether the device was created with `feature`.
    fn has(&self, feature: wgpu::Features) -> bool {
        self.inner.device.features().contains(feature)
    }

    /// Whether the reductions use subgroup operations (the adapter has them and they were
    /// chosen, see [`WgpuOptions::subgroups`]).
    pub fn uses_subgroups(&self) -> bool {
        self.has(wgpu::Features::SUBGROUP)
    }

    /// Whether GPU timestamps are available.
    pub fn has_timestamps(&self) -> bool {
        self.has(wgpu::Features::TIMESTAMP_QUERY)
    }

    /// Bytes of weights one binding holds at most: what the adapter binds at once (and
    /// holds in one buffer), or less after [`WgpuDevice::set_weight_part_bytes`]. A
    /// model's matrix or an MoE layer larger than this is split into parts of whole rows
    /// (whole experts), each in a buffer of its own, and dispatched part by part.
    pub fn weight_part_bytes(&self) -> u64 {
        let l = self.inner.device.limits();
        l.max_storage_buffer_binding_size
            .min(l.max_buffer_size)
            .min(self.weight_part.load(Ordering::Relaxed))
            & !3
    }

    /// Caps the bytes of weights per binding for the layers and models made from this
    /// handle (and its clones) afterwards (at least 4 KiB). Results do not depend on it:
    /// tests use it to split small models as real ones are split on adapters that bind
    /// little.
    pub fn set_weight_part_bytes(&self, bytes: u64) {
        self.weight_part.store(bytes.max(4096), Ordering::Relaxed);
    }

    /// A handle to the same device (its queue, pipelines and staging) whose layers and
    /// models are split into weight parts of at most `bytes` (at least 4 KiB), leaving
    /// this handle's part size as it is: tests split small models as real ones are split
    /// on adapters that bind little, beside whole ones on the same device.
    pub fn with_weight_part_bytes(&self, bytes: u64) -> WgpuDevice {
        WgpuDevice {
            inner: Arc::clone(&self.inner),
            weight_part: Arc::new(AtomicU64::new(bytes.max(4096))),
        }
    }

    /// The pipelines under `key`, built by `build` the first time this device needs them
    /// and shared from then on (every sampler, head, MoE layer and model runs the same
    /// compiled shaders).
    pub(crate) fn pipelines<T: Send + Sync + 'static>(
        &self,
        key: &str,
        build: impl FnOnce() -> Result<T>,
    ) -> Result<Arc<T>> {
        let mut cache = self.inner.pipelines.lock().map_err(|_| poisoned())?;
        if let Some(p) = cache.get(key) {
            return Arc::clone(p)
                .downcast::<T>()
                .map_err(|_| Error::Device(format!("pipelines {key}: another type")));
        }
        let p = Arc::new(build()?);
        cache.insert(key.to_string(), p.clone());
        Ok(p)
    }

    /// The first `bytes` bytes of `buf` (usage `MAP_READ`) once the device has finished
    /// the work submitted so far, as values of `T`: the one way results come back to
    /// the host.
    pub(crate) fn read_back<T: bytemuck::Pod>(
        &self,
        buf: &wgpu::Buffer,
        bytes: u64,
    ) -> Result<Vec<T>> {
        read_back(&self.inner.device, buf, bytes)
    }

    /// Records commands with `record` into a new encoder and submits them, inside a
    /// validation error scope: the one way a call's work goes to the device. An error of
    /// `record` submits nothing; a validation error of the commands is [`Error::Device`]
    /// naming the adapter.
    pub(crate) fn submit_checked<T>(
        &self,
        record: impl FnOnce(&mut wgpu::CommandEncoder) -> Result<T>,
    ) -> Result<T> {
        let device = &self.inner.device;
        let scope = device.push_error_scope(wgpu::ErrorFilter::Validation);
        let mut enc =
            device.create_command_encoder(&wgpu::CommandEncoderDescriptor { label: None });
        // (on an error the scope is popped as it drops, and the encoder is dropped unused)
        let out = record(&mut enc)?;
        self.inner.queue.submit([enc.finish()]);
        if let Some(e) = pollster::block_on(scope.pop()) {
            return Err(Error::Device(format!("{}: {e}", self.adapter_name())));
        }
        Ok(out)
    }
}

/// How a kernel binds one buffer.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Bind {
    /// A uniform block.
    Uniform,
    /// A read-only storage buffer.
    Read,
    /// A read-write storage buffer.
    Write,
}

/// One WGSL module's pipelines, each built the first time it is used (or all at once by
/// [`Pipelines::build_all`]): the module and the bind group layout (binding `i` is
/// `binds[i]`) are made and validated at once, a compute pipeline for an entry point
/// only when a call first records it. Creating a pipeline costs real time (on lavapipe
/// seconds for the step kernels, even with the driver's disk cache warm; a GPU driver
/// compiles it to its machine code): a per-call sampler that never needs an entry point
/// (many draws, log-probabilities) should not pay for it, while the long-lived parts of
/// a decode loop (a head, an MoE layer, a model) build theirs when they are made, so no
/// step of the loop pays for one.
pub(crate) struct Pipelines<const N: usize> {
    device: wgpu::Device,
    module: wgpu::ShaderModule,
    layout: wgpu::PipelineLayout,
    entries: [&'static str; N],
    /// Each entry point's pipeline once built, with the wall-clock seconds it took.
    pipes: [std::sync::OnceLock<(wgpu::ComputePipeline, f64)>; N],
    /// The bind group layout every pipeline of the module uses.
    pub binds: wgpu::BindGroupLayout,
}

impl<const N: usize> Pipelines<N> {
    /// Entry point `i`'s pipeline, built at the first call (its build time kept).
    pub fn get(&self, i: usize) -> &wgpu::ComputePipeline {
        &self.pipes[i]
            .get_or_init(|| {
                let t = std::time::Instant::now();
                let pipe = self
                    .device
                    .create_compute_pipeline(&wgpu::ComputePipelineDescriptor {
                        label: Some(self.entries[i]),
                        layout: Some(&self.layout),
                        module: &self.module,
                        entry_point: Some(self.entries[i]),
                        compilation_options: Default::default(),
                        cache: None,
                    });
                (pipe, t.elapsed().as_secs_f64())
            })
            .0
    }

    /// Builds every pipeline not built yet.
    pub fn build_all(&self) {
        for i in 0..N {
            self.get(i);
        }
    }

    /// How many pipelines have been built so far.
    pub fn built(&self) -> usize {
        self.pipes.iter().filter(|p| p.get().is_some()).count()
    }

    /// (entry point, seconds its pipeline took to build) of each one built so far.
    pub fn build_times(&self) -> Vec<(&'static str, f64)> {
        self.entries
            .iter()
            .zip(&self.pipes)
            .filter_map(|(e, p)| p.get().map(|p| (*e, p.1)))
            .collect()
    }
}

/// One WGSL module's [`Pipelines`], built lazily, with `entries` its entry points. A
/// shader or validation error of the module is [`Error::Device`], `failed` followed by
/// the error.
pub(crate) fn lazy_pipelines<const N: usize>(
    device: &wgpu::Device,
    label: &str,
    source: String,
    binds: &[Bind],
    entries: [&'static str; N],
    failed: &str,
) -> Result<Pipelines<N>> {
    let scope = device.push_error_scope(wgpu::ErrorFilter::Validation);
    let module = device.create_shader_module(wgpu::ShaderModuleDescriptor {
        label: Some(label),
        source: wgpu::ShaderSource::Wgsl(source.into()),
    });
    let (bind_layout, layout) = layouts(device, label, binds);
    if let Some(e) = pollster::block_on(scope.pop()) {
        return Err(Error::Device(format!("{failed}: {e}")));
    }
    Ok(Pipelines {
        device: device.clone(),
        module,
        layout,
        entries,
        pipes: std::array::from_fn(|_| std::sync::OnceLock::new()),
        binds: bind_layout,
    })
}

/// The bind group layout where binding `i` is `binds[i]`, and the pipeline layout of it.
fn layouts(
    device: &wgpu::Device,
    label: &str,
    binds: &[Bind],
) -> (wgpu::BindGroupLayout, wgpu::PipelineLayout) {
    let layout_entries: Vec<_> = binds
        .iter()
        .enumerate()
        .map(|(i, b)| wgpu::BindGroupLayoutEntry {
            binding: i as u32,
            visibility: wgpu::ShaderStages::COMPUTE,
            ty: wgpu::BindingType::Buffer {
                ty: match b {
                    Bind::Uniform => wgpu::BufferBindingType::Uniform,
                    Bind::Read => wgpu::BufferBindingType::Storage { read_only: true },
                    Bind::Write => wgpu::BufferBindingType::Storage { read_only: false },
                },
                has_dynamic_offset: false,
                min_binding_size: None,
            },
            count: None,
        })
        .collect();
    let layout = device.create_bind_group_layout(&wgpu::BindGroupLayoutDescriptor {
        label: Some(label),
        entries: &layout_entries,
    });
    let pl = device.create_pipeline_layout(&wgpu::PipelineLayoutDescriptor {
        label: Some(label),
        bind_group_layouts: &[Some(&layout)],
        immediate_size: 0,
    });
    (layout, pl)
}

/// The error of a call that finds a lock poisoned by an earlier panic.
pub(crate) fn poisoned() -> Error {
    Error::Device("a previous call panicked while holding the sampler".into())
}
