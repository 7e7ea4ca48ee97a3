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
        Device::Auto => match decoda::wgpu::WgpuSampler::hardware() {
            Ok(s) => Ok(Box::new(s)),
            Err(_) => Ok(Box::new(cpu(threads)?)),
        },
    }
}
