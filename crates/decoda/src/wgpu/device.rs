//! Adapters, devices and the sampler's compute pipelines.

use crate::error::{Error, Result};

use super::layout::{WG, WORKGROUP_BYTES};
use super::{WgpuOptions, ADAPTER_ENV, SUBGROUPS_ENV};

/// Storage buffers one kernel binds.
pub(crate) const STORAGE_BUFFERS: u32 = 10;

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

/// An instance with the backends that run compute shaders (Vulkan, Metal, DX12) and no
/// display connection: the sampler presents nothing.
fn instance() -> wgpu::Instance {
    let mut desc = wgpu::InstanceDescriptor::new_without_display_handle_from_env();
    desc.backends &= wgpu::Backends::VULKAN | wgpu::Backends::METAL | wgpu::Backends::DX12;
    wgpu::Instance::new(desc)
}

fn adapters(instance: &wgpu::Instance) -> Vec<wgpu::Adapter> {
    pollster::block_on(instance.enumerate_adapters(wgpu::Backends::all()))
        .into_iter()
        .filter(|a| {
            let i = a.get_info();
            i.backend != wgpu::Backend::Noop && i.backend != wgpu::Backend::Gl
        })
        .collect()
}

pub(crate) fn is_software(info: &wgpu::AdapterInfo) -> bool {
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

/// An opened device: what [`super::WgpuSampler`] is built from.
pub(crate) struct Opened {
    pub device: wgpu::Device,
    pub queue: wgpu::Queue,
    pub info: wgpu::AdapterInfo,
}

/// Picks an adapter as [`super::WgpuSampler::new`] documents and opens a device on it.
pub(crate) fn open(options: WgpuOptions) -> Result<Opened> {
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
            if options.hardware_only && is_software(&a.get_info()) {
                return Err(Error::NoDevice(format!(
                    "no hardware GPU adapter (found only software ones: {names:?})"
                )));
            }
            a
        }
    };
    let mut features = wgpu::Features::empty();
    if chosen.features().contains(wgpu::Features::TIMESTAMP_QUERY) {
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
    Ok(Opened {
        device,
        queue,
        info: chosen.get_info(),
    })
}

/// Fails when the device's limits are below what the kernels need.
pub(crate) fn check_limits(device: &wgpu::Device, info: &wgpu::AdapterInfo) -> Result<()> {
    let limits = device.limits();
    if limits.max_storage_buffers_per_shader_stage < STORAGE_BUFFERS {
        return Err(Error::NoDevice(format!(
            "{}: max_storage_buffers_per_shader_stage = {}, the sampler needs {STORAGE_BUFFERS} \
             (request the adapter's limits when creating the device)",
            info.name, limits.max_storage_buffers_per_shader_stage
        )));
    }
    if limits.max_compute_workgroup_storage_size < WORKGROUP_BYTES
        || limits.max_compute_invocations_per_workgroup < WG as u32
    {
        return Err(Error::NoDevice(format!(
            "{}: compute limits too small (workgroup storage {} B, {} invocations; the \
             sampler needs {WORKGROUP_BYTES} B and {WG})",
            info.name,
            limits.max_compute_workgroup_storage_size,
            limits.max_compute_invocations_per_workgroup
        )));
    }
    Ok(())
}

/// The sampler's compute pipelines, one per entry point of `sample.wgsl`.
pub(crate) struct Pipelines {
    pub layout: wgpu::BindGroupLayout,
    pub touch: wgpu::ComputePipeline,
    pub untouch: wgpu::ComputePipeline,
    pub stats: wgpu::ComputePipeline,
    pub decide_stats: wgpu::ComputePipeline,
    pub hist_k: wgpu::ComputePipeline,
    pub decide_k: wgpu::ComputePipeline,
    pub hist_p: wgpu::ComputePipeline,
    pub decide_p: wgpu::ComputePipeline,
    pub draw: wgpu::ComputePipeline,
    pub finish: wgpu::ComputePipeline,
    pub rank_topn: wgpu::ComputePipeline,
    pub finish_lp: wgpu::ComputePipeline,
    pub draw_many: wgpu::ComputePipeline,
}

impl Pipelines {
    /// Compiles the module (with subgroup reductions when the device has the feature)
    /// and builds every pipeline; a shader error is [`Error::Device`].
    pub fn build(device: &wgpu::Device, info: &wgpu::AdapterInfo) -> Result<Self> {
        let subgroups = device.features().contains(wgpu::Features::SUBGROUP);
        let scope = device.push_error_scope(wgpu::ErrorFilter::Validation);
        let module = device.create_shader_module(wgpu::ShaderModuleDescriptor {
            label: Some("decoda sample.wgsl"),
            source: wgpu::ShaderSource::Wgsl(super::shader_source(subgroups).into()),
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
        for b in 3..=STORAGE_BUFFERS {
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
        let pipes = Self {
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
            layout,
        };
        if let Some(e) = pollster::block_on(scope.pop()) {
            return Err(Error::Device(format!(
                "{}: building the shaders failed: {e}",
                info.name
            )));
        }
        Ok(pipes)
    }
}
