//! # decoda
//!
//! The kernels at the end of an LLM decode step: reproducible per-row token sampling on
//! the CPU and, with the `wgpu` feature, on GPUs through wgpu (Vulkan, Metal, DX12:
//! `wgpu::WgpuSampler`), and mixture-of-experts dispatch that decides at run time
//! whether to sort tokens by expert.
//!
//! A token is a pure function of (logits row, parameters, seed, step, history): it does
//! not depend on the batch, the row's position, the thread count or the device. The
//! contract is stated in docs/CONTRACT.md.
//!
//! ```
//! use decoda::{Backend, CpuSampler, Logits, Request, SamplingParams};
//!
//! let logits = vec![0.5f32, 2.0, 1.0, -1.0, 0.0, 3.0, 2.5, 1.5]; // [2, 4]
//! let batch = Logits::f32(&logits, 2, 4)?;
//! let rows = vec![
//!     Request::new(SamplingParams { temperature: 0.8, top_p: 0.9, ..Default::default() }, 42),
//!     Request::new(SamplingParams::greedy(), 7),
//! ];
//! let out = CpuSampler::new().sample(&batch, &rows)?;
//! assert_eq!(out[1].as_ref().unwrap().token, 1); // greedy: the largest logit of row 1
//! # Ok::<(), decoda::Error>(())
//! ```
#![warn(missing_docs)]

pub mod backend;
pub mod cpu;
pub mod error;
pub mod fmath;
pub mod head;
pub mod logits;
pub mod model;
pub mod moe;
pub mod params;
pub mod philox;
pub mod pipeline;
pub mod profile;
pub mod reference;
pub mod shard;
pub mod testing;
pub mod verify;
#[cfg(feature = "wgpu")]
pub mod wgpu;

/// The README's Rust examples, compiled and run as doctests.
#[cfg(all(doctest, feature = "wgpu"))]
#[doc = include_str!("../../../README.md")]
pub struct ReadmeDoctests;

/// The Rust examples of `docs/`, compiled and run as doctests.
#[cfg(all(doctest, feature = "wgpu"))]
pub mod docs_doctests {
    /// docs/DEVICE.md
    #[doc = include_str!("../../../docs/DEVICE.md")]
    pub struct Device;
    /// docs/MOE.md
    #[doc = include_str!("../../../docs/MOE.md")]
    pub struct Moe;
    /// docs/MODEL.md
    #[doc = include_str!("../../../docs/MODEL.md")]
    pub struct Model;
}

pub use backend::{Backend, MoeLayer};
pub use cpu::{CpuEngine, CpuHead, CpuSampler};
pub use error::{Error, Result, RowError};
pub use logits::{DType, LogitElem, Logits, LogitsData};
pub use params::{LogprobsMode, Request, SamplingParams, SequenceState};
pub use pipeline::{Kept, KeptToken, RowResult, Sample, TokenLogprobs, TopLogprob};
pub use reference::ReferenceSampler;
pub use verify::{verify_coupled, verify_rejection, DraftRow, RejectRow, Verified};
