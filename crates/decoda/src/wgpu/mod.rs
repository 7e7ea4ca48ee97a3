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
//! Everything is built from one [`WgpuDevice`]: the device, its queue, its pipelines
//! (compiled once per device), its staging pool and the weight part size. The sampler,
//! the head, the MoE layer and the model take it (or a sampler, which holds one).
//!
//! The module is split by job: `options` (how a device is chosen), `adapter` (finding
//! and opening adapters), `device` (the context, [`WgpuDevice`], and its pipeline
//! cache), `buffers` (working buffers and the one readback), `shaders` (the sampler's
//! WGSL put together), `kernels` (the step kernels' pipelines, buffers and dispatch
//! sequence, beside `step/`, one WGSL file per pass), `layout` (the structs and sizes
//! shared with the WGSL, checked against it by tests), `views` (the logits, masks and
//! outputs a call reads and writes), `sampler` (the per-call device API: recording a
//! call), `call` (a step's call block, which the sampler and the head
//! both build), `head` (the sampling head: slots whose state lives on the device),
//! `staging` (per-call parameters on their way to the device), `host` (the host API:
//! upload, submit, read back), `shard` (a vocabulary shard's summaries for sharded
//! sampling, [`WgpuShard`]), `moe` (the MoE layer), `model` (the model's ops) and
//! `bench` (timing hooks for the CLI's benchmarks).
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

mod adapter;
mod bench;
mod buffers;
mod call;
mod device;
mod head;
mod host;
mod kernels;
mod layout;
mod model;
mod moe;
mod options;
mod profile;
mod rows;
mod sampler;
mod shaders;
mod shard;
mod staging;
mod views;

pub use adapter::{list_adapters, AdapterSummary};
pub use bench::{CallStructure, StepTime};
pub use device::WgpuDevice;
pub use head::{StepId, StepResults, WgpuHead};
pub use model::{
    model_shader_source, mv_shader_source, mv_shader_source_with, WgpuEngine, WgpuModel,
    SHADER_MODEL,
};
pub use moe::{
    moe_shader_source, moe_shader_source_for, moe_shader_source_with, MoeRouting, WgpuMoe,
    SHADER_MOE,
};
pub use options::{
    WgpuOptions, ADAPTER_ENV, FUSED_ENV, SAMPLE_PIECES_ENV, SUBGROUPS_ENV, WORKGROUPS_ENV,
};
pub use sampler::WgpuSampler;
pub use shaders::{
    shader_source, shader_source_with, weight_format_source, REDUCE_SG, REDUCE_WG, SHADER_FMATH,
    SHADER_FMATH_INT64, SHADER_HALF, SHADER_MAIN, WEIGHT_FORMATS,
};
pub use shard::{shard_shader_source, WgpuShard};
pub use views::{DeviceLogits, DeviceMasks, DeviceOutputs};
