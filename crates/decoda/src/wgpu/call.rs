//! A step's call block: the uniform every pass of a sampling call reads (shapes, the
//! logits view, the mask view, the passes' mode bits, where each working area starts).
//! The per-call API ([`super::WgpuSampler::record`]) and the head
//! ([`super::WgpuHead::record_step`]) both build it here.

use crate::logits::DType;

use super::kernels::{Plan, Sizes};
use super::layout::*;
use super::sampler::{DeviceLogits, DeviceMasks};

/// What a call block is made from, besides the logits and mask views.
pub(crate) struct CallShape<'a> {
    /// Rows of the call (`B`).
    pub rows: usize,
    /// Workgroups per row and logits per workgroup ([`super::kernels::split`]).
    pub splits: usize,
    pub chunk: usize,
    /// The working buffers' sizes (where the partials and candidates start).
    pub sizes: &'a Sizes,
    /// The passes the rows need.
    pub plan: Plan,
    /// Mode bits of the caller (`M_SCATTER` for a call with penalties, `M_HEAD` and
    /// `M_SLOT_MASK` for a head's step); `M_MASK` and the plan's bits are added here.
    pub mode: u32,
    /// Many draws per row (0: one token per row) and the lanes sharing one draw.
    pub draws: usize,
    pub draw_lanes: usize,
}

/// The call block of a call over `logits` (with `masks`, if any) shaped by `shape`.
pub(crate) fn call_block(
    logits: &DeviceLogits<'_>,
    masks: Option<&DeviceMasks<'_>>,
    shape: CallShape<'_>,
) -> CallU {
    let v = logits.vocab;
    CallU {
        rows: shape.rows as u32,
        vocab: v as u32,
        stride: logits.row_stride as u32,
        dtype: dtype_code(logits.dtype),
        base: logits.offset as u32,
        splits: shape.splits as u32,
        chunk: shape.chunk as u32,
        bm_words: v.div_ceil(32) as u32,
        cap: CAP as u32,
        mode: shape.mode | if masks.is_some() { M_MASK } else { 0 } | shape.plan.mode(),
        draws: shape.draws as u32,
        draw_lanes: shape.draw_lanes as u32,
        part_base: shape.sizes.part_base() as u32,
        cand_base: shape.sizes.cand_base() as u32,
        zero: 0,
        mask_base: masks.map_or(0, |m| m.offset as u32),
        mask_stride: masks.map_or(0, |m| m.row_stride as u32),
        kept_base: (shape.rows * (RES_WORDS + shape.draws)) as u32,
        ..CallU::default()
    }
}

/// The kernels' code for a logits dtype.
pub(crate) fn dtype_code(d: DType) -> u32 {
    match d {
        DType::F32 => 0,
        DType::F16 => 1,
        DType::Bf16 => 2,
    }
}
