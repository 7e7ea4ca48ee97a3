//! A whole decode step: the model's ops apart from any family (`ops`: what a backend
//! implements, what it reads of a model), Qwen3-MoE checkpoints (`config.json` and safetensors, Hugging
//! Face's and MLX's layouts, f32/bf16/f16 and MLX's 4- and 8-bit affine weights), the
//! forward pass written once over each backend's ops (the CPU's are
//! `decoda::cpu::CpuEngine`, the device's `decoda::wgpu::WgpuEngine`), and the generation loop that feeds
//! the sampling head's tokens back to the model.
//!
//! ```no_run
//! use std::sync::Arc;
//! use decoda::model::{generate, Qwen3Moe, Sequence, DEFAULT_SORT_CUTOFF};
//! use decoda::CpuEngine;
//! use decoda::head::SlotRequest;
//! use decoda::SamplingParams;
//!
//! let model = Arc::new(Qwen3Moe::load("tiny".as_ref(), DEFAULT_SORT_CUTOFF)?);
//! let mut engine = CpuEngine::new(model, 1)?;
//! let greedy = SamplingParams { temperature: 0.0, ..Default::default() };
//! let seq = Sequence {
//!     prompt: vec![1, 2, 3],
//!     request: SlotRequest::new(greedy).seed(7).max_tokens(16),
//! };
//! let report = generate(&mut engine, &[seq], &mut |_| {})?;
//! println!("{:?}", report.outputs[0].tokens);
//! # Ok::<(), decoda::Error>(())
//! ```

pub mod config;
pub mod generate;
pub mod load;
pub mod ops;
pub mod qwen3_moe;
pub mod speculate;

pub use config::Config;
pub use generate::{
    check_sequences, generate, generate_checked, generate_until, CheckedSequences, Engine, Report,
    Sequence, SequenceOutput,
};
pub use load::Checkpoint;
pub use ops::{ModelWeights, MoeBlock, Ops, RopeTable};
pub use qwen3_moe::{Qwen3Moe, DEFAULT_SORT_CUTOFF};
pub use speculate::{generate_speculative, Forward, SpeculativeReport};
