//! `--device cpu|wgpu|auto`.

use clap::ValueEnum;
use decoda::Backend;

/// Where to run.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum Device {
    /// The fast CPU sampler.
    Cpu,
    /// The wgpu device sampler (Vulkan, Metal, DX12): a hardware adapter, else a software
    /// one such as Mesa's lavapipe; `DECODA_WGPU_ADAPTER` picks one by name.
    Wgpu,
    /// A hardware GPU adapter (wgpu) when present, else the CPU.
    Auto,
}

/// Most CPU threads a command accepts.
pub const MAX_THREADS: usize = 1024;

/// Checks a `--threads` value.
pub fn check_threads(threads: usize) -> Result<(), String> {
    if threads > MAX_THREADS {
        return Err(format!(
            "--threads {threads} is too many: at most {MAX_THREADS} (0 = all cores)"
        ));
    }
    Ok(())
}

/// The CPU sampler with `threads` threads (0 = all cores).
pub fn cpu(threads: usize) -> Result<decoda::CpuSampler, String> {
    check_threads(threads)?;
    if threads == 0 {
        Ok(decoda::CpuSampler::new())
    } else {
        decoda::CpuSampler::with_threads(threads).map_err(|e| e.to_string())
    }
}

/// A backend for `device`, with `threads` CPU threads (0 = all cores).
pub fn backend(device: Device, threads: usize) -> Result<Box<dyn Backend>, String> {
    check_threads(threads)?;
    match device {
        Device::Cpu => Ok(Box::new(cpu(threads)?)),
        Device::Wgpu => Ok(Box::new(
            decoda::wgpu::WgpuSampler::new().map_err(|e| e.to_string())?,
        )),
        Device::Auto => match auto_gpu() {
            Some(s) => Ok(Box::new(s)),
            None => Ok(Box::new(cpu(threads)?)),
        },
    }
}

/// A fresh sampler on `gpu` (from [`gpu_device`]), else the CPU's on every core.
pub fn sampler_on(gpu: Option<&decoda::wgpu::WgpuDevice>) -> Result<Box<dyn Backend>, String> {
    Ok(match gpu {
        Some(d) => Box::new(decoda::wgpu::WgpuSampler::on(d).map_err(|e| e.to_string())?),
        None => Box::new(cpu(0)?),
    })
}

/// The device context for `device`: `None` for the CPU (`cpu`, or `auto` without a
/// hardware GPU, said on stderr); every GPU part of a command is built from it, so
/// each shader is compiled once per run.
pub fn gpu_device(device: Device) -> Result<Option<decoda::wgpu::WgpuDevice>, String> {
    match device {
        Device::Cpu => Ok(None),
        Device::Wgpu => decoda::wgpu::WgpuDevice::new()
            .map(Some)
            .map_err(|e| e.to_string()),
        Device::Auto => match decoda::wgpu::WgpuDevice::hardware() {
            Ok(d) => Ok(Some(d)),
            Err(e) => {
                eprintln!("decoda: --device auto: using the CPU ({e})");
                Ok(None)
            }
        },
    }
}

/// `--device auto`: a hardware GPU adapter, or `None` after saying on stderr why the
/// command falls back to the CPU.
pub fn auto_gpu() -> Option<decoda::wgpu::WgpuSampler> {
    match decoda::wgpu::WgpuSampler::hardware() {
        Ok(s) => Some(s),
        Err(e) => {
            eprintln!("decoda: --device auto: using the CPU ({e})");
            None
        }
    }
}

/// Keeps stderr clean of the Vulkan loader's display probing: Mesa's device-selection
/// layer (an implicit layer installed with Mesa's drivers) connects to the Wayland and X
/// displays when it orders the GPUs, and on a machine without a desktop session prints
/// `error: XDG_RUNTIME_DIR is invalid or not set in the environment.` at every adapter
/// enumeration. decoda chooses its adapter itself and presents nothing, so the layer is
/// turned off (its documented switch, `NODEVICE_SELECT=1`) unless the user configured it.
/// Called first thing in `main`, before any thread exists.
pub fn quiet_vulkan_layers() {
    if std::env::var_os("NODEVICE_SELECT").is_none()
        && std::env::var_os("MESA_VK_DEVICE_SELECT").is_none()
    {
        // sound: no other thread exists yet (and `set_var` is a safe fn in edition 2021)
        std::env::set_var("NODEVICE_SELECT", "1");
    }
}
