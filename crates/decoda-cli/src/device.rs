//! `--device cpu|cuda|auto`.

use clap::ValueEnum;
use decoda::Backend;

/// Where to run.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum Device {
    /// The fast CPU sampler.
    Cpu,
    /// The CUDA sampler (an error when no GPU is present).
    Cuda,
    /// CUDA when a GPU is present, else the CPU.
    Auto,
}

/// A backend for `device`, with `threads` CPU threads (0 = all cores).
pub fn backend(device: Device, threads: usize) -> Result<Box<dyn Backend>, String> {
    let cpu = || -> Result<Box<dyn Backend>, String> {
        Ok(if threads == 0 {
            Box::new(decoda::CpuSampler::new())
        } else {
            Box::new(decoda::CpuSampler::with_threads(threads).map_err(|e| e.to_string())?)
        })
    };
    match device {
        Device::Cpu => cpu(),
        Device::Cuda => cuda(),
        Device::Auto => cuda().or_else(|_| cpu()),
    }
}

/// The CUDA backend is not part of decoda yet: asking for it is the "no CUDA device" error
/// that `auto` falls back from.
fn cuda() -> Result<Box<dyn Backend>, String> {
    Err("no CUDA device: this build of decoda has no CUDA backend yet; use --device cpu".into())
}
