//! Building a sampling call, for the per-call API ([`super::WgpuSampler::record`]) and
//! the head ([`super::WgpuHead::record_step`]) alike: the call block (the uniform every
//! pass reads: shapes, the logits and mask views, the passes' mode bits, where each
//! working area starts), a row's or slot's parameters as the kernels read them, its
//! history and DRY lists, and the bind group of a step.

use crate::error::{Error, Result};
use crate::logits::DType;
use crate::params::{LogprobsMode, MAX_LOGPROBS};
use crate::pipeline as pl;

use super::kernels::{Kernels, Plan, Sizes, StepBuffers};
use super::layout::*;
use super::views::{DeviceLogits, DeviceMasks, DeviceOutputs};

/// Longest row the device sampler takes (token ids and per-invocation loops stay small).
pub(crate) const MAX_VOCAB: usize = 1 << 24;

/// What a call block is made from, besides the logits and mask views.
pub(crate) struct CallShape<'a> {
    /// Rows of the call (`B`).
    pub rows: usize,
    /// Workgroups per row and logits per workgroup ([`super::kernels::split`]).
    pub splits: usize,
    pub chunk: usize,
    /// Logits per piece of the probe's sample pass ([`Kernels::sample_split`]).
    pub sample_chunk: usize,
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
        sample_chunk: shape.sample_chunk as u32,
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

/// The bind group of a step over `logits` into `out`.
pub(crate) fn bind_group(
    device: &wgpu::Device,
    kernels: &Kernels,
    bufs: &StepBuffers,
    logits: &wgpu::Buffer,
    masks: &wgpu::Buffer,
    out: &DeviceOutputs,
) -> wgpu::BindGroup {
    bind_group_raw(
        device,
        kernels,
        bufs,
        (logits, masks),
        &out.tokens,
        &out.results,
    )
}

/// The bind group of a step over `logits` into `tokens` and `results`.
pub(crate) fn bind_group_raw(
    device: &wgpu::Device,
    kernels: &Kernels,
    bufs: &StepBuffers,
    (logits, masks): (&wgpu::Buffer, &wgpu::Buffer),
    tokens: &wgpu::Buffer,
    results: &wgpu::Buffer,
) -> wgpu::BindGroup {
    let all = [
        &bufs.call,
        logits,
        &bufs.sparams.buf,
        &bufs.sstate.buf,
        &bufs.rmap.buf,
        &bufs.pen.buf,
        &bufs.lists.buf,
        &bufs.work.buf,
        &bufs.ctr.buf,
        tokens,
        results,
        masks,
    ];
    step_group(device, kernels, "decoda", all)
}

/// A bind group of the step kernels over `all`, binding `i` to `all[i]` (the call
/// block, logits, slot parameters, slot state, row map, penalty areas, lists, work,
/// counters, tokens, results, masks).
pub(crate) fn step_group(
    device: &wgpu::Device,
    kernels: &Kernels,
    label: &str,
    all: [&wgpu::Buffer; 12],
) -> wgpu::BindGroup {
    let entries: Vec<wgpu::BindGroupEntry<'_>> = all
        .iter()
        .enumerate()
        .map(|(i, buf)| wgpu::BindGroupEntry {
            binding: i as u32,
            resource: buf.as_entire_binding(),
        })
        .collect();
    device.create_bind_group(&wgpu::BindGroupDescriptor {
        label: Some(label),
        layout: &kernels.layout,
        entries: &entries,
    })
}

/// The device's view of a slot's parameters; its logit bias is appended to `lists` as
/// (token, bias bits) pairs in token order.
pub(crate) fn slot_params(
    p: &crate::params::SamplingParams,
    seed: u64,
    vocab: usize,
    touch: bool,
    pen_slot: usize,
    lists: &mut Vec<u32>,
) -> Result<SlotU> {
    let mut flags = row_flags(p, vocab);
    if touch {
        flags |= F_TOUCH;
    } else {
        // DRY over a history too short to repeat: nothing to compute
        flags &= !F_DRY;
    }
    let bias_off = to_u32(lists.len(), "logit biases")?;
    for (&t, &b) in &p.logit_bias {
        lists.extend([t, b.to_bits()]);
    }
    Ok(SlotU {
        temperature: p.temperature,
        top_k: p.top_k,
        top_p: p.top_p,
        ln_min_p: pl::min_p_threshold(0.0, p.min_p),
        rep: p.repetition_penalty,
        freq: p.frequency_penalty,
        pres: p.presence_penalty,
        flags,
        seed_lo: seed as u32,
        seed_hi: (seed >> 32) as u32,
        n_lp: p.logprobs.unwrap_or(0).min(MAX_LOGPROBS),
        bias_off,
        bias_len: p.logit_bias.len() as u32,
        stop_off: 0,
        stop_len: 0,
        hist_off: 0,
        hist_len: 0,
        max_lo: u32::MAX,
        max_hi: u32::MAX,
        pen_slot: pen_slot as u32,
        dry_allowed: p.dry_allowed_length,
        dry_n: u32::try_from(p.dry_penalty_last_n).unwrap_or(u32::MAX),
        top_n_sigma: p.top_n_sigma,
        xtc_p: p.xtc_probability,
        xtc_thr: p.xtc_threshold,
        typical_p: p.typical_p,
        n_kept: p.kept.unwrap_or(0),
        ..SlotU::default()
    })
}

/// Where a slot's DRY table and breakers are in `lists` ([`dry_lists`]).
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct DryLists {
    pub tab_off: u32,
    pub tab_len: u32,
    pub brk_off: u32,
    pub brk_len: u32,
}

impl SlotU {
    /// Points the slot at its DRY table and breakers.
    pub(crate) fn set_dry(&mut self, d: DryLists) {
        self.dry_tab_off = d.tab_off;
        self.dry_tab_len = d.tab_len;
        self.dry_brk_off = d.brk_off;
        self.dry_brk_len = d.brk_len;
    }
}

/// Appends DRY's penalty for each excess `e` a window allows (`0..=most_excess`, fewer
/// when the base's cap on `e` comes first: a larger `e` takes the last entry) as f32
/// bits, computed by [`pl::dry_penalty`] on the host so no device arithmetic decides
/// one, then the sequence breakers as (length, ids...) each.
pub(crate) fn dry_lists(
    p: &crate::params::SamplingParams,
    most_excess: usize,
    lists: &mut Vec<u32>,
) -> Result<DryLists> {
    let last = pl::dry_max_exponent(p).map_or(most_excess, |m| {
        most_excess.min(usize::try_from(m).unwrap_or(usize::MAX))
    });
    let tab_off = to_u32(lists.len(), "DRY penalties")?;
    lists.extend((0..=last).map(|e| pl::dry_penalty(p, e).to_bits()));
    let brk_off = to_u32(lists.len(), "DRY breakers")?;
    for b in &p.dry_sequence_breakers {
        lists.push(b.len() as u32);
        lists.extend_from_slice(b);
    }
    Ok(DryLists {
        tab_off,
        tab_len: last as u32 + 1,
        brk_off,
        brk_len: to_u32(lists.len(), "DRY breakers")? - brk_off,
    })
}

/// A row's flags (`F_*`) but `F_TOUCH`, from its parameters.
pub(crate) fn row_flags(p: &crate::params::SamplingParams, vocab: usize) -> u32 {
    let mut flags = 0;
    if p.logprobs.is_some() {
        flags |= F_LOGPROBS;
    }
    if p.logprobs_mode == LogprobsMode::Processed {
        flags |= F_PROCESSED;
    }
    if p.top_p < 1.0 {
        flags |= F_TOP_P;
    }
    if p.top_k > 0 && (p.top_k as usize) < vocab {
        flags |= F_TOP_K;
    }
    if p.min_p > 0.0 {
        flags |= F_MIN_P;
    }
    if p.dry_on() {
        flags |= F_DRY;
    }
    if p.top_n_sigma > 0.0 {
        flags |= F_TOP_N_SIGMA;
    }
    if p.xtc_on() {
        flags |= F_XTC;
    }
    if p.typical_p < 1.0 {
        flags |= F_TYPICAL;
    }
    if p.kept.is_some() {
        flags |= F_KEPT;
    }
    flags
}

/// Appends a history for the scatter kernels (prompt tokens as they are, output tokens
/// with bit 31 set); returns its offset and length.
pub(crate) fn push_history(
    lists: &mut Vec<u32>,
    prompt: &[u32],
    output: &[u32],
) -> Result<(u32, u32)> {
    let off = to_u32(lists.len(), "history tokens")?;
    lists.extend_from_slice(prompt);
    lists.extend(output.iter().map(|&t| t | 1 << 31));
    Ok((off, to_u32(prompt.len() + output.len(), "history tokens")?))
}

fn to_u32(n: usize, what: &str) -> Result<u32> {
    u32::try_from(n).map_err(|_| Error::Shape(format!("too many {what} in one call")))
}
