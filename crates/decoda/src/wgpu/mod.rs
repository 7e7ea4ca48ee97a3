//! The device backend: the sampling contract as WGSL compute shaders, through wgpu
//! (Vulkan, Metal, DX12). Enabled by the `wgpu` feature.
//!
//! Two ways in:
//! - [`Backend::sample`](crate::Backend::sample) takes host logits like every backend: it
//!   uploads them, runs the shaders, and reads the results back.
//! - The device API keeps the logits on the device: [`WgpuSampler::record`] records the
//!   whole call into the caller's [`wgpu::CommandEncoder`] for logits already in a
//!   [`wgpu::Buffer`] ([`DeviceLogits`]), writing tokens, per-row status and log-probabilities
//!   into [`DeviceOutputs`]. It submits nothing, reads nothing back, and after the first
//!   calls of a given size allocates nothing.
//!
//! Every call runs a fixed sequence of dispatches chosen from its rows' parameters,
//! never from the data (see `step/` and `kernels::Plan`): two for rows without filters
//! or log-probabilities, three with filters, five with log-probabilities. The top-k
//! value and the top-p cut are exact radix selects, so there are no retry rounds. The noise, the top-p weights and the
//! division by the temperature use the same arithmetic as the CPU (`fmath.wgsl`, the
//! device's copy of [`crate::fmath`], with a correctly rounded division).
//!
//! The module is split by job: `device` (adapters and devices), `kernels` (the step
//! kernels' pipelines, buffers and dispatch sequence, beside `step/`, one WGSL file per pass), `layout` (the
//! structs and sizes shared with the WGSL, checked against it by tests), `sampler` (the
//! per-call device API: recording a call), `head` (the sampling head: slots whose state
//! lives on the device), `staging` (per-call parameters on their way to the device),
//! `host` (the host API: upload, submit, read back) and `bench` (timing hooks for the
//! CLI's benchmarks).
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

mod bench;
mod device;
mod head;
mod host;
mod kernels;
mod layout;
mod model;
mod moe;
mod sampler;
mod staging;

pub use bench::{CallStructure, StepTime};
pub use device::{list_adapters, AdapterSummary, WORKGROUPS_ENV};
pub use head::{StepId, StepResults, WgpuHead};
pub use model::{model_shader_source, WgpuEngine, WgpuModel, SHADER_MODEL};
pub use moe::{moe_shader_source, MoeRouting, WgpuMoe, SHADER_MOE};
pub use sampler::{DeviceLogits, DeviceMasks, DeviceOutputs, WgpuSampler};

/// The WGSL of the sampler's kernels, without the shared arithmetic and the reductions:
/// the files of `step/`, one per pass, in the order they are concatenated (`common`
/// holds the layout, the bindings and the helpers every pass uses).
pub const SHADER_MAIN: &str = concat!(
    include_str!("step/common.wgsl"),
    include_str!("step/scatter.wgsl"),
    include_str!("step/dry.wgsl"),
    include_str!("step/probe.wgsl"),
    include_str!("step/scan.wgsl"),
    include_str!("step/settle_list.wgsl"),
    include_str!("step/settle.wgsl"),
    include_str!("step/sigma.wgsl"),
    include_str!("step/typical.wgsl"),
    include_str!("step/lp.wgsl"),
    include_str!("step/kept.wgsl"),
    include_str!("step/finish.wgsl"),
    include_str!("step/draw_many.wgsl"),
);
/// The arithmetic that decides tokens (ln, exp, correctly rounded division, Philox),
/// shared with the CPU ([`crate::fmath`], [`crate::philox`]), with Philox's products
/// built from 16-bit ones (any adapter).
pub const SHADER_FMATH: &str = concat!(include_str!("fmath.wgsl"), include_str!("mulhi32.wgsl"));
/// The same with Philox's products in 64-bit integers (adapters with `SHADER_INT64`):
/// the same bits in fewer operations.
pub const SHADER_FMATH_INT64: &str =
    concat!(include_str!("fmath.wgsl"), include_str!("mulhi64.wgsl"));
/// Workgroup reductions through workgroup memory (the portable path).
pub const REDUCE_WG: &str = include_str!("reduce_wg.wgsl");
/// Workgroup reductions with subgroup operations (device feature `SUBGROUP`).
pub const REDUCE_SG: &str = include_str!("reduce_sg.wgsl");

/// The complete WGSL module: with `subgroups`, the reductions use subgroup operations
/// (every row kernel takes its subgroup builtins through the `Lanes` struct that
/// `reduce_sg.wgsl` declares); without, workgroup memory (`reduce_wg.wgsl` declares a
/// `Lanes` with the invocation index only). Both are validated and translated for every
/// platform by the `shaders` test.
pub fn shader_source(subgroups: bool) -> String {
    shader_source_with(subgroups, false)
}

/// [`shader_source`], with Philox's products in 64-bit integers when `int64` (devices
/// with `Features::SHADER_INT64`; [`SHADER_FMATH_INT64`]).
pub fn shader_source_with(subgroups: bool, int64: bool) -> String {
    // (naga, which wgpu compiles WGSL with, enables subgroup operations through the
    // device's SUBGROUP feature and rejects the `enable subgroups;` directive)
    let reduce = if subgroups { REDUCE_SG } else { REDUCE_WG };
    let fmath = if int64 {
        SHADER_FMATH_INT64
    } else {
        SHADER_FMATH
    };
    format!("{SHADER_MAIN}\n{fmath}\n{reduce}")
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
    /// Philox's products in 64-bit integers: `None` (default) or `Some(true)` whenever
    /// the adapter has `SHADER_INT64`; `Some(false)` never (the 16-bit construction).
    /// Results are the same bits either way.
    pub int64: Option<bool>,
}

/// Environment variable: a substring of the adapter name to use (`llvmpipe`, `H100`, ...).
pub const ADAPTER_ENV: &str = "DECODA_WGPU_ADAPTER";
/// Environment variable: `0` or `1` turns subgroup operations off or on where
/// [`WgpuOptions::subgroups`] is `None`.
pub const SUBGROUPS_ENV: &str = "DECODA_WGPU_SUBGROUPS";
