//! The fast CPU sampler: O(V) streaming passes, no sort of the vocabulary, noise only for
//! tokens that can still win, rows in parallel with rayon.
//!
//! The folder is split by job, mirroring `wgpu/`: `sampler` (the per-call sampler and
//! the stages of a row), `head` (the sampling head), `moe` (the MoE layer), `model` (the
//! model's ops), `scratch` (per-thread buffers), `settings` (tuning constants); under
//! the sampler `select` (the sampled thresholds and the top-k and min-p gathering),
//! `top_p` (stage 7 without top-k), `general` (the general path), `draw` (the Gumbel
//! draws), `logprobs` (the log-probabilities) and `kernels` (the vector loops under them
//! all).
//!
//! The folder is the whole CPU backend: the per-call sampler ([`CpuSampler`]), the
//! sampling head ([`CpuHead`]), the MoE layer ([`CpuMoe`], `moe.rs`: [`SwitchMlp`]'s
//! forward pass and the expert products), the model's ops ([`CpuModel`], [`CpuEngine`])
//! and the SIMD kernels under all of them.
//!
//! [`SwitchMlp`]: crate::moe::SwitchMlp

pub mod kernels;
pub mod model;

mod draw;
mod general;
mod head;
mod logprobs;
mod moe;
mod sampler;
mod scratch;
mod select;
mod settings;
mod top_p;

pub use draw::philox_row_words;
pub use head::CpuHead;
pub use model::{CpuEngine, CpuModel};
pub use moe::{grouped_matmul, CpuMoe};
pub use sampler::{sample_row_f32, CpuSampler};

#[cfg(test)]
mod tests;
