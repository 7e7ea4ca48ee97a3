//! Adapters: finding them, choosing one, opening a device on it and checking its limits.

use crate::error::{Error, Result};

use super::layout::{STORAGE_BUFFERS, WG, WORKGROUP_BYTES};
use super::options::{WgpuOptions, ADAPTER_ENV, FUSED_ENV, SUBGROUPS_ENV, WORKGROUPS_ENV};

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
///
/// wgpu's check of indirect dispatch grids (`InstanceFlags::VALIDATION_INDIRECT_CALL`)
/// is off unless `WGPU_VALIDATION_INDIRECT_CALL` asks for it: the only grids decoda's
/// kernels compute are the step's after settle (at most `MAX_SPLITS` by the call's rows,
/// by construction), and the check, a dispatch of wgpu's own before each of them, cost
/// lavapipe about 15 ms a dispatch (a filtered call at V = 1,000, B = 8: 197 ms with it,
/// 21 ms without). A device made by the caller ([`super::WgpuDevice::from_device`])
/// keeps the caller's flags.
fn instance() -> wgpu::Instance {
    let mut desc = wgpu::InstanceDescriptor::new_without_display_handle_from_env();
    desc.backends &= wgpu::Backends::VULKAN | wgpu::Backends::METAL | wgpu::Backends::DX12;
    if std::env::var_os("WGPU_VALIDATION_INDIRECT_CALL").is_none() {
        desc.flags
            .remove(wgpu::InstanceFlags::VALIDATION_INDIRECT_CALL);
    }
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

/// An opened device: what [`super::WgpuDevice`] is built from.
pub(crate) struct Opened {
    pub device: wgpu::Device,
    pub queue: wgpu::Queue,
    pub info: wgpu::AdapterInfo,
}

/// Picks an adapter as [`super::WgpuDevice::new`] documents and opens a device on it.
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
    if options.int64 != Some(false) && chosen.features().contains(wgpu::Features::SHADER_INT64) {
        features |= wgpu::Features::SHADER_INT64;
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

/// Whether calls settle and finish their rows in one dispatch on this adapter
/// ([`WgpuOptions::fused_settle`]): `option`, else `DECODA_WGPU_FUSED`, else on hardware
/// adapters only.
pub(crate) fn fused_settle(option: Option<bool>, info: &wgpu::AdapterInfo) -> bool {
    option.unwrap_or_else(|| match std::env::var(FUSED_ENV).as_deref() {
        Ok("0") => false,
        Ok("1") => true,
        _ => !is_software(info),
    })
}

/// Whether the probe samples a row in pieces ([`super::WgpuOptions::sample_pieces`]).
pub(crate) fn sample_pieces(option: Option<bool>, software: bool) -> bool {
    option.unwrap_or_else(
        || match std::env::var(super::options::SAMPLE_PIECES_ENV).as_deref() {
            Ok("0") => false,
            Ok("1") => true,
            _ => !software,
        },
    )
}

/// The fewest logits a workgroup of the scan handles by default: 1,024 on a hardware
/// adapter, so a decode row (B = 1, V >= 32,000) spreads over at least 32 workgroups
/// (issue 56: a pass over a row's tokens uses the device, not a few of its units), and
/// 4,096 on a software one, whose few threads gain nothing from more, smaller pieces.
/// Results never depend on it.
pub(crate) fn min_chunk(software: bool) -> usize {
    if software {
        4096
    } else {
        1024
    }
}

/// Workgroups a step aims to keep busy on this adapter. wgpu does not report an
/// adapter's compute units, so: `DECODA_WGPU_WORKGROUPS` when set; on a software adapter
/// (its "compute units" are CPU threads) four per thread; on a hardware one 1024, enough
/// for the largest GPUs (an H100 has 132 multiprocessors, each running several
/// workgroups at once). Results never depend on it.
pub(crate) fn target_workgroups(info: &wgpu::AdapterInfo) -> usize {
    if let Some(n) = std::env::var(WORKGROUPS_ENV)
        .ok()
        .and_then(|v| v.parse::<usize>().ok())
    {
        return n.clamp(1, 1 << 20);
    }
    if is_software(info) {
        4 * std::thread::available_parallelism().map_or(4, |n| n.get())
    } else {
        1024
    }
}
