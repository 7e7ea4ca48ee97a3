//! The model on the device (`model.wgsl`, and `mv.wgsl` for the matrix products):
//! weights uploaded once in their checkpoint format, activations, KV caches, positions
//! and logits in device buffers.
//!
//! A call's dispatches are planned once per shape by running the model's forward pass
//! ([`crate::model::qwen3_moe::forward`]) over a recorder of [`Ops`]: the plan holds each
//! dispatch's parameters (one uniform buffer) and bind groups, and the MoE layers'
//! [`WgpuMoe`] calls. Running a planned call records those into an encoder and writes
//! nothing from the host; the rows' positions live on the device and advance there.
//! [`WgpuEngine`] puts a [`WgpuHead`] after the model: it samples the logits where they
//! are and the next call's embedding lookup reads the head's token buffer.
//!
//! Split by job: this file holds the buffers and records planned calls; `weights`
//! uploads matrices in their formats, `plan` turns the forward pass into dispatches, and
//! `engine` is the generation loop's engine (with the host-sampling comparison).

mod engine;
mod forward;
mod plan;
mod weights;

use std::collections::HashMap;
use std::sync::Arc;

use crate::error::{Error, Result};
use crate::model::ops::{Act, ModelWeights, NormId, RopeTable, WeightId};
use crate::moe::{Dispatch, Router};

use super::buffers::make_buffer;
use super::device::{lazy_pipelines, Pipelines, WgpuDevice};
use super::moe::{MoeRouting, WgpuMoe};
use super::profile::Passes;

pub use engine::WgpuEngine;
use plan::{Plan, PlanKey, Tokens};
use weights::{init_buffer, upload, upload_stacked, Mat};

/// The WGSL of the model's kernels but the matrix products (with the `Op` block, without
/// the shared arithmetic).
pub const SHADER_MODEL: &str = concat!(include_str!("op.wgsl"), include_str!("model.wgsl"));

/// The complete module (with `fmath.wgsl` and the half conversion).
pub fn model_shader_source() -> String {
    format!(
        "{SHADER_MODEL}\n{}\n{}",
        super::shaders::SHADER_HALF,
        super::shaders::SHADER_FMATH
    )
}

/// The matrix products' WGSL (`mv.wgsl`), without the format constants.
const SHADER_MV: &str = include_str!("mv.wgsl");

/// The matrix products' module for weights of `dtype` (`ModelOp::dtype`: 0 f32, 1 bf16,
/// 2 f16, 3 affine), `bits` and `group` (affine codes and their group size), its team
/// sums a tree in workgroup memory, its inputs loaded as vec4s (input widths and call
/// rows of whole vec4s).
pub fn mv_shader_source(dtype: u32, bits: u32, group: u32) -> String {
    mv_shader_source_with(dtype, bits, group, false, true)
}

/// [`mv_shader_source`], its team sums with subgroup operations when `subgroups` (for
/// devices with `Features::SUBGROUP`): the same bits; its inputs loaded as vec4s when
/// `vec4_inputs` (`mv_x4.wgsl`: every input width and call row a whole number of vec4s),
/// else one float at a time (`mv_x1.wgsl`): the same bits.
pub fn mv_shader_source_with(
    dtype: u32,
    bits: u32,
    group: u32,
    subgroups: bool,
    vec4_inputs: bool,
) -> String {
    let team = super::shaders::team_source(subgroups);
    let inputs = if vec4_inputs {
        include_str!("mv_x4.wgsl")
    } else {
        include_str!("mv_x1.wgsl")
    };
    format!(
        "{}{}{SHADER_MV}\n{inputs}\n{}\n{team}",
        super::shaders::weight_format_source(dtype, bits, group),
        include_str!("op.wgsl"),
        super::shaders::SHADER_TILE
    )
}

/// One dispatch's parameters (`Op` in `op.wgsl`, shared by `model.wgsl` and `mv.wgsl`; the layout is checked by a test).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, bytemuck::Pod, bytemuck::Zeroable)]
pub(crate) struct ModelOp {
    pub rows: u32,
    pub kind: u32,
    pub in_w: u32,
    pub out_w: u32,
    pub dtype: u32,
    pub bits: u32,
    pub group: u32,
    pub row_words: u32,
    pub w_off: u32,
    pub s_off: u32,
    pub b_off: u32,
    pub aux_off: u32,
    pub src_w: u32,
    pub dst_w: u32,
    pub src_row0: u32,
    pub dst_row0: u32,
    pub groups: u32,
    pub eps: f32,
    pub heads: u32,
    pub kv_heads: u32,
    pub head_dim: u32,
    pub max_pos: u32,
    pub map_off: u32,
    pub inplace: u32,
    pub zero: u32,
    pub out_off: u32,
    /// attend_part: the score scale (`eps` stays the norms' epsilon).
    pub scale: f32,
    pub pad2: u32,
}

/// `ROW_LAST` in `model.wgsl`: the row ends its segment.
pub(crate) const ROW_LAST: u32 = 1;
/// Bytes between the parameters of consecutive dispatches (uniform offset alignment).
pub(crate) const OP_STRIDE: u64 = 256;
/// Most rows in one call (longer prompts run in chunks).
const MAX_CALL_ROWS: usize = 256;
/// Bytes the attention scores of a call may take (bounds the prefill chunk).
const SCORE_BYTES: usize = 64 << 20;
/// Largest grid dimension used.
const GRID: usize = 32768;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
enum Pipe {
    Embed,
    Rms,
    NormRope,
    AttendPart,
    AttendMerge,
    Add,
    Advance,
    /// A matrix product (`mv.wgsl`, a module per weight format).
    Linear,
}

/// The entry points of `model.wgsl`, in the order of [`Pipe`].
const ENTRIES: [&str; 7] = [
    "embed",
    "rms",
    "norm_rope",
    "attend_part",
    "attend_merge",
    "add",
    "advance",
];

/// Positions per chunk of `attend_part` (`CH` in model.wgsl).
const ATTEND_CHUNK: usize = 64;
/// Largest head dimension whose decode calls norm and rotate q and k in `attend_part`
/// (its `qs` holds one head); larger ones run `norm_rope` first.
const ATTEND_FUSED_HEAD_DIM: usize = 256;

impl Pipe {
    /// The kernel's name in a profile.
    fn name(self) -> &'static str {
        match self {
            Pipe::Linear => "linear",
            p => ENTRIES[p as usize],
        }
    }
}

/// The model's buffers and pipelines on one device.
pub struct WgpuModel {
    ctx: WgpuDevice,
    model: Arc<dyn ModelWeights>,
    pipes: Arc<Pipelines<7>>,
    mats: HashMap<WeightId, Mat>,
    /// Each layer's q, k and v stacked (one product for the three).
    qkv: HashMap<usize, Mat>,
    embed: Mat,
    norms: wgpu::Buffer,
    norm_off: HashMap<NormId, u32>,
    moe: Vec<Option<WgpuMoe>>,
    rope: wgpu::Buffer,
    acts: HashMap<Act, wgpu::Buffer>,
    kc: Vec<wgpu::Buffer>,
    vc: Vec<wgpu::Buffer>,
    scores: wgpu::Buffer,
    ctl: wgpu::Buffer,
    logits: wgpu::Buffer,
    /// Rows the logits buffer holds (the slots; more after a verification's call).
    logits_rows: usize,
    prompt_tokens: wgpu::Buffer,
    host_tokens: wgpu::Buffer,
    /// Placeholders: one read-only, and one per read-write binding.
    dummy_ro: wgpu::Buffer,
    dummy_rw: [wgpu::Buffer; 4],
    slots: usize,
    max_pos: usize,
    max_rows: usize,
    plans: HashMap<PlanKey, Plan>,
    head_tokens: Option<wgpu::Buffer>,
    /// Host copies of what the device holds: each slot's position, the decode row map.
    positions: Vec<usize>,
    decode_map: Vec<u32>,
    /// Compute dispatches the last recorded call ran (its kernels and its MoE layers').
    last_dispatches: usize,
    /// The position of each row of the call being recorded (for the plan of `attend`).
    call_positions: Vec<usize>,
}

impl std::fmt::Debug for WgpuModel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WgpuModel")
            .field("adapter", &self.ctx.adapter())
            .field("slots", &self.slots)
            .field("max_positions", &self.max_pos)
            .finish()
    }
}

/// The matrix products of one weight format: `mv` and `mv_swiglu`, and both with the
/// RMS norm before them (`mv_norm`, `mv_swiglu_norm`).
fn build_mv(
    device: &wgpu::Device,
    dtype: u32,
    bits: u32,
    group: u32,
    sg: bool,
    x4: bool,
) -> Result<Pipelines<7>> {
    use crate::wgpu::device::Bind::*;
    lazy_pipelines(
        device,
        "decoda mv.wgsl",
        mv_shader_source_with(dtype, bits, group, sg, x4),
        &[Uniform, Read, Read, Read, Write, Write, Write, Write, Write],
        [
            "mv",
            "mv_swiglu",
            "mv_norm",
            "mv_swiglu_norm",
            "mm",
            "mm_swiglu",
            "mv_wide",
        ],
        "building the model's matrix products",
    )
}

/// Calls of at least this many rows (prefill) run the tiled products (`mm`, tile.wgsl:
/// a matrix's weights read once per 32 rows of the call rather than once per 8).
pub(crate) const TILED_ROWS: usize = 32;

/// Row-by-row products of at least this many output rows (a part of the LM head) run
/// `mv_wide`, 32 output rows a workgroup (reading the call's inputs a quarter as often
/// as `mv`'s 4), which still launches at least 264 workgroups (two per compute unit of a
/// 132-SM GPU).
pub(crate) const WIDE_ROWS: usize = 264 * 32;

/// How a matrix product runs: row by row (`mv`, the norm before it taken in or not; or
/// `mv_wide`, 32 output rows a workgroup), or tiled (`mm`).
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum MvKind {
    Rows { norm: bool },
    Wide,
    Tiled,
}

/// The matrix products' pipeline for `mat`, SwiGLU or not, of `kind` (built at its
/// first use), over inputs `src_w` floats apart: loading them as vec4s where the rows and
/// the matrix's input width are whole vec4s.
fn mv_pipeline(
    ctx: &WgpuDevice,
    mat: &Mat,
    swiglu: bool,
    kind: MvKind,
    src_w: u32,
) -> Result<wgpu::ComputePipeline> {
    let (bits, group) = if mat.dtype == 3 {
        (mat.bits, mat.group)
    } else {
        (0, 0)
    };
    let device = ctx.device().clone();
    // subgroup sums where the device was opened with them (as the sampler's)
    let sg = device.features().contains(wgpu::Features::SUBGROUP);
    let x4 = mat.inp.is_multiple_of(4) && src_w.is_multiple_of(4);
    let pipes = ctx.pipelines(
        &format!("mv {} {bits} {group} {sg} {x4}", mat.dtype),
        || build_mv(&device, mat.dtype, bits, group, sg, x4),
    )?;
    let index = match kind {
        MvKind::Rows { norm } => 2 * usize::from(norm) + usize::from(swiglu),
        MvKind::Tiled => 4 + usize::from(swiglu),
        MvKind::Wide => 6,
    };
    Ok(pipes.get(index).clone())
}

/// The model's pipelines (built when a model is made), indexed by [`Pipe`].
fn build_pipes(device: &wgpu::Device) -> Result<Pipelines<7>> {
    use crate::wgpu::device::Bind::*;
    lazy_pipelines(
        device,
        "decoda model.wgsl",
        model_shader_source(),
        &[Uniform, Read, Read, Read, Write, Write, Write, Write, Write],
        ENTRIES,
        "building the model's kernels",
    )
}

fn grid_of(n: usize) -> (u32, u32) {
    let n = n.max(1);
    (n.min(GRID) as u32, n.div_ceil(GRID) as u32)
}

impl WgpuModel {
    /// Uploads `model` to a device (a [`WgpuDevice`], or a [`super::WgpuSampler`] on
    /// one) with `slots` KV caches of `positions` positions each.
    pub fn new(
        on: &impl AsRef<WgpuDevice>,
        model: Arc<dyn ModelWeights>,
        slots: usize,
        positions: usize,
    ) -> Result<Self> {
        let ctx = on.as_ref().clone();
        let device = ctx.device().clone();
        let cfg = model.config().clone();
        if slots == 0 || positions == 0 {
            return Err(Error::Model(
                "a model needs at least one slot and one position".into(),
            ));
        }
        // compiled once per device, shared by every model made from it
        let pipes = ctx.pipelines("model", || build_pipes(&device))?;
        // a model runs many calls: every kernel now, none inside a call
        pipes.build_all();
        let mut mats = HashMap::new();
        // a matrix larger than one binding goes up in parts of whole rows
        let part = ctx.weight_part_bytes();
        // each layer's q, k and v stacked in one matrix: one product for the three
        let mut qkv = HashMap::new();
        for id in model.weight_ids() {
            if let WeightId::Q(l) = id {
                let m = upload_stacked(
                    &device,
                    &format!("qkv {l}"),
                    &[
                        model.weight(id)?,
                        model.weight(WeightId::K(l))?,
                        model.weight(WeightId::V(l))?,
                    ],
                    part,
                )?;
                mv_pipeline(&ctx, &m, false, MvKind::Rows { norm: true }, m.inp as u32)?;
                mv_pipeline(&ctx, &m, false, MvKind::Tiled, m.inp as u32)?;
                qkv.insert(l, m);
            }
        }
        for id in model.weight_ids() {
            let name = format!("{id:?}");
            let m = match id {
                WeightId::Q(_) | WeightId::K(_) | WeightId::V(_) => continue,
                // swiglu reads gate and up as one matrix
                WeightId::Gate(l) => upload(
                    &device,
                    &name,
                    &[model.weight(id)?, model.weight(WeightId::Up(l))?],
                    part,
                )?,
                WeightId::Up(_) => continue,
                WeightId::LmHead if model.tied_lm_head() => continue,
                _ => upload(&device, &name, &[model.weight(id)?], part)?,
            };
            mats.insert(id, m);
        }
        // the matrix products of the model's formats, now (none inside a call)
        for (id, m) in &mats {
            let gate = matches!(id, WeightId::Gate(_));
            mv_pipeline(&ctx, m, gate, MvKind::Rows { norm: false }, m.inp as u32)?;
            mv_pipeline(&ctx, m, gate, MvKind::Tiled, m.inp as u32)?;
            if m.parts.iter().any(|p| p.rows >= WIDE_ROWS) {
                mv_pipeline(&ctx, m, gate, MvKind::Wide, m.inp as u32)?;
            }
            // the router and the dense MLPs' gate and up take the norm before them
            if gate || matches!(id, WeightId::Router(_)) {
                mv_pipeline(&ctx, m, gate, MvKind::Rows { norm: true }, m.inp as u32)?;
            }
        }
        let embed = upload(&device, "embed_tokens", &[model.embed()], part)?;
        if model.tied_lm_head() {
            mv_pipeline(
                &ctx,
                &embed,
                false,
                MvKind::Rows { norm: false },
                embed.inp as u32,
            )?;
            mv_pipeline(&ctx, &embed, false, MvKind::Tiled, embed.inp as u32)?;
            if embed.parts.iter().any(|p| p.rows >= WIDE_ROWS) {
                mv_pipeline(&ctx, &embed, false, MvKind::Wide, embed.inp as u32)?;
            }
            mats.insert(WeightId::LmHead, embed.clone());
        }
        let mut norm_words = Vec::new();
        let mut norm_off = HashMap::new();
        for id in model.norm_ids() {
            norm_off.insert(id, norm_words.len() as u32);
            norm_words.extend(model.norm_weight(id)?.iter().map(|x| x.to_bits()));
        }
        let norms = init_buffer(
            &device,
            "decoda model norms",
            &norm_words,
            wgpu::BufferUsages::STORAGE,
        );
        let mut moe = Vec::new();
        for l in 0..cfg.num_hidden_layers {
            moe.push(match model.moe(l) {
                Some(block) => Some(WgpuMoe::new(&ctx, block.experts)?),
                None => None,
            });
        }
        let table = RopeTable::new(&cfg, positions);
        let rope_words: Vec<u32> = table
            .cos
            .iter()
            .chain(&table.sin)
            .map(|x| x.to_bits())
            .collect();
        let rope = init_buffer(
            &device,
            "decoda rope",
            &rope_words,
            wgpu::BufferUsages::STORAGE,
        );
        let limit = device.limits().max_storage_buffer_binding_size as usize;
        // attend_part's partials: per query head and chunk, a max, a sum and the values
        let score_row =
            cfg.num_attention_heads * positions.div_ceil(ATTEND_CHUNK) * (cfg.head_dim + 2) * 4;
        let max_rows = (SCORE_BYTES.min(limit) / score_row)
            .clamp(1, MAX_CALL_ROWS)
            .max(slots.min(MAX_CALL_ROWS));
        if slots > MAX_CALL_ROWS {
            return Err(Error::Model(format!(
                "{slots} slots: at most {MAX_CALL_ROWS}"
            )));
        }
        // attend_part's grid has a dimension of the cache's chunks
        let dim = device.limits().max_compute_workgroups_per_dimension as usize;
        if positions.div_ceil(ATTEND_CHUNK) > dim {
            return Err(Error::Model(format!(
                "{positions} positions: attention runs at most {dim} chunks of {ATTEND_CHUNK}"
            )));
        }
        let st = wgpu::BufferUsages::STORAGE
            | wgpu::BufferUsages::COPY_DST
            | wgpu::BufferUsages::COPY_SRC;
        let sized = |label: &str, bytes: usize| -> Result<wgpu::Buffer> {
            if bytes > limit {
                return Err(Error::Model(format!(
                    "{label} needs {bytes} bytes; this adapter binds at most {limit} (fewer slots or positions)"
                )));
            }
            Ok(make_buffer(
                &device,
                label,
                bytes.max(16).next_multiple_of(16) as u64,
                st,
            ))
        };
        let mut acts = HashMap::new();
        for a in [
            Act::X,
            Act::H,
            Act::Q,
            Act::K,
            Act::V,
            Act::A,
            Act::G,
            Act::R,
            Act::M,
        ] {
            acts.insert(
                a,
                sized("decoda model activations", max_rows * a.width(&cfg) * 4)?,
            );
        }
        let kv_bytes = slots * positions * cfg.kv_width() * 4;
        let mut kc = Vec::new();
        let mut vc = Vec::new();
        for _ in 0..cfg.num_hidden_layers {
            kc.push(sized("decoda kv cache", kv_bytes)?);
            vc.push(sized("decoda kv cache", kv_bytes)?);
        }
        let scores = sized("decoda attention scores", max_rows * score_row)?;
        let ctl = sized("decoda model rows", (slots + 4 * (slots + max_rows)) * 4)?;
        let logits = sized("decoda model logits", slots * cfg.vocab_size * 4)?;
        let prompt_tokens = sized("decoda prompt tokens", max_rows * 4)?;
        let host_tokens = sized("decoda host tokens", slots * 4)?;
        let dummy = |l| make_buffer(&device, l, 16, st);
        Ok(Self {
            pipes,
            mats,
            qkv,
            embed,
            norms,
            norm_off,
            moe,
            rope,
            acts,
            kc,
            vc,
            scores,
            ctl,
            logits,
            logits_rows: slots,
            prompt_tokens,
            host_tokens,
            dummy_ro: dummy("decoda dummy"),
            dummy_rw: [
                dummy("decoda dummy"),
                dummy("decoda dummy"),
                dummy("decoda dummy"),
                dummy("decoda dummy"),
            ],
            slots,
            max_pos: positions,
            max_rows,
            plans: HashMap::new(),
            head_tokens: None,
            positions: vec![0; slots],
            decode_map: Vec::new(),
            last_dispatches: 0,
            call_positions: Vec::new(),
            ctx,
            model,
        })
    }

    /// The logits buffer: `[slots, V]` f32, row `r` of the last call's output rows.
    pub fn logits(&self) -> &wgpu::Buffer {
        &self.logits
    }

    /// Positions each slot's cache holds.
    pub fn max_positions(&self) -> usize {
        self.max_pos
    }

    /// Empties `slot` (its position back to 0).
    fn reset(&mut self, slot: usize) {
        self.positions[slot] = 0;
        self.ctx
            .queue()
            .write_buffer(&self.ctl, (slot * 4) as u64, &0u32.to_le_bytes());
    }

    /// Makes `to`'s cache a copy of `from`'s (positions, keys and values of every layer)
    /// and logits row `to_row` a copy of row `from_row`, through a scratch buffer (a
    /// buffer cannot be copied onto itself); submits the copies.
    fn fork(&mut self, from: usize, to: usize, from_row: usize, to_row: usize) -> Result<()> {
        let kvw = self.model.config().kv_width();
        let v = self.model.config().vocab_size;
        let n = self.positions[from];
        self.positions[to] = n;
        self.ctx
            .queue()
            .write_buffer(&self.ctl, (to * 4) as u64, &(n as u32).to_le_bytes());
        let region = (n * kvw * 4) as u64;
        let scratch_bytes = region.max((v * 4) as u64).max(4);
        let scratch = super::buffers::make_buffer(
            self.ctx.device(),
            "decoda fork scratch",
            scratch_bytes,
            wgpu::BufferUsages::COPY_SRC | wgpu::BufferUsages::COPY_DST,
        );
        let slot_bytes = (self.max_pos * kvw * 4) as u64;
        let mut enc = self
            .ctx
            .device()
            .create_command_encoder(&Default::default());
        if region > 0 {
            for buf in self.kc.iter().chain(&self.vc) {
                enc.copy_buffer_to_buffer(buf, from as u64 * slot_bytes, &scratch, 0, region);
                enc.copy_buffer_to_buffer(&scratch, 0, buf, to as u64 * slot_bytes, region);
            }
        }
        let row = (v * 4) as u64;
        enc.copy_buffer_to_buffer(&self.logits, from_row as u64 * row, &scratch, 0, row);
        enc.copy_buffer_to_buffer(&scratch, 0, &self.logits, to_row as u64 * row, row);
        self.ctx.queue().submit([enc.finish()]);
        Ok(())
    }

    fn map_off_decode(&self) -> usize {
        self.slots
    }

    fn map_off_prompt(&self) -> usize {
        self.slots + 4 * self.slots
    }

    /// Records the prefill of `prompt` for `slot` (in chunks), the logits of its last
    /// token into row `logits_row`; submits each chunk. Returns the MoE branches.
    fn prefill(&mut self, slot: usize, prompt: &[u32], logits_row: usize) -> Result<Vec<Dispatch>> {
        let v = self.model.config().vocab_size;
        if let Some((j, t)) = prompt.iter().enumerate().find(|(_, &t)| t as usize >= v) {
            return Err(Error::Model(format!(
                "prompt token {j} = {t} is not below vocab_size {v}"
            )));
        }
        if self.positions[slot] + prompt.len() > self.max_pos {
            return Err(Error::Model(format!(
                "slot {slot}: {} tokens exceed the {} positions the cache holds",
                self.positions[slot] + prompt.len(),
                self.max_pos
            )));
        }
        let mut branches = Vec::new();
        let chunks: Vec<&[u32]> = prompt.chunks(self.max_rows).collect();
        for (c, chunk) in chunks.iter().enumerate() {
            let n = chunk.len();
            let last = c + 1 == chunks.len();
            let mut map = Vec::with_capacity(4 * n);
            for j in 0..n {
                map.extend([
                    slot as u32,
                    j as u32,
                    j as u32,
                    if j + 1 == n { ROW_LAST } else { 0 },
                ]);
            }
            self.ctx
                .queue()
                .write_buffer(&self.prompt_tokens, 0, bytemuck::cast_slice(chunk));
            self.ctx.queue().write_buffer(
                &self.ctl,
                (self.map_off_prompt() * 4) as u64,
                bytemuck::cast_slice(&map),
            );
            let key = PlanKey {
                rows: n,
                map_off: self.map_off_prompt(),
                tokens: Tokens::Prompt,
                out: last.then_some((n - 1, logits_row, 1)),
            };
            let mut enc = self
                .ctx
                .device()
                .create_command_encoder(&Default::default());
            let at = self.positions[slot];
            self.call_positions.clear();
            self.call_positions.extend(at..at + n);
            branches = self.record(&mut Passes::new(&mut enc, None), key)?;
            self.ctx.queue().submit([enc.finish()]);
            self.positions[slot] += n;
        }
        Ok(branches)
    }

    /// Records a decode call for `rows` (slot, index of its token in the token source),
    /// logits into rows `0 .. rows.len()`.
    fn record_decode(
        &mut self,
        passes: &mut Passes<'_>,
        rows: &[(usize, usize)],
        tokens: Tokens,
    ) -> Result<Vec<Dispatch>> {
        for &(slot, _) in rows {
            if self.positions[slot] + 1 > self.max_pos {
                return Err(Error::Model(format!(
                    "slot {slot}: {} tokens exceed the {} positions the cache holds",
                    self.positions[slot] + 1,
                    self.max_pos
                )));
            }
        }
        let map: Vec<u32> = rows
            .iter()
            .flat_map(|&(slot, src)| [slot as u32, 0, src as u32, ROW_LAST])
            .collect();
        if map != self.decode_map {
            // the batch changed: the new row map (the only host write of a decode step)
            self.ctx.queue().write_buffer(
                &self.ctl,
                (self.map_off_decode() * 4) as u64,
                bytemuck::cast_slice(&map),
            );
            self.decode_map = map;
        }
        let n = rows.len();
        let key = PlanKey {
            rows: n,
            map_off: self.map_off_decode(),
            tokens,
            out: Some((0, 0, n)),
        };
        // (kept, not rebuilt: a decode step allocates nothing)
        self.call_positions.clear();
        let positions = &self.positions;
        self.call_positions
            .extend(rows.iter().map(|&(slot, _)| positions[slot]));
        let b = self.record(passes, key)?;
        for &(slot, _) in rows {
            self.positions[slot] += 1;
        }
        Ok(b)
    }

    /// Bytes `attend_part` and `attend_merge` read and write besides q and the output:
    /// each key and value of a row's cache up to its position once per query head (a
    /// workgroup per query head and chunk: the heads of a key/value group read the same
    /// chunk, as neighbouring workgroups, so from memory about once), q once per chunk,
    /// and the partials (a max, a sum and the weighted values per query head and chunk)
    /// written, then read by the merge.
    fn attend_bytes(&self, pipe: Pipe) -> (u64, u64) {
        let c = self.model.config();
        let (heads, hd) = (c.num_attention_heads as u64, c.head_dim as u64);
        let keys: u64 = self.call_positions.iter().map(|&p| p as u64 + 1).sum();
        let chunks: u64 = self
            .call_positions
            .iter()
            .map(|&p| (p / ATTEND_CHUNK) as u64 + 1)
            .sum();
        let partials = heads * chunks * (hd + 2) * 4;
        match pipe {
            Pipe::AttendPart => (
                heads * keys * hd * 8
                    + (chunks - self.call_positions.len() as u64) * heads * hd * 4,
                partials,
            ),
            Pipe::AttendMerge => (partials, 0),
            _ => (0, 0),
        }
    }

    fn record(&mut self, passes: &mut Passes<'_>, key: PlanKey) -> Result<Vec<Dispatch>> {
        if !self.plans.contains_key(&key) {
            if self.plans.len() >= 64 {
                self.plans.clear();
            }
            let plan = self.plan(&key)?;
            self.plans.insert(key.clone(), plan);
        }
        let plan = &self.plans[&key];
        let cfg = self.model.config();
        let attend = if passes.profiling() {
            [
                self.attend_bytes(Pipe::AttendPart),
                self.attend_bytes(Pipe::AttendMerge),
            ]
        } else {
            [(0, 0); 2]
        };
        // attend_part's chunks: those the call's furthest row reaches, not the cache's
        // (a workgroup past its row's position does nothing, and a software adapter
        // still runs its code; every position is below max_pos, so they are at most the
        // cache's)
        let reached = self
            .call_positions
            .iter()
            .map(|&p| p / ATTEND_CHUNK + 1)
            .max()
            .unwrap_or(1);
        let attend_grid = (
            reached as u32,
            cfg.num_attention_heads as u32,
            key.rows as u32,
        );
        let mut dispatches = 0;
        for seg in &plan.segments {
            dispatches += seg.kernels.len();
            for k in &seg.kernels {
                let grid = match k.pipe {
                    Pipe::AttendPart => attend_grid,
                    _ => (k.grid.0, k.grid.1, 1),
                };
                passes.dispatch3(&k.pipeline, &k.group, grid, || {
                    let mut l = k.launch.clone();
                    let extra = match k.pipe {
                        Pipe::AttendPart => {
                            l.workgroups = u64::from(grid.0 * grid.1 * grid.2);
                            attend[0]
                        }
                        Pipe::AttendMerge => attend[1],
                        _ => (0, 0),
                    };
                    l.bytes_read += extra.0;
                    l.bytes_written += extra.1;
                    l
                });
            }
            if let Some((layer, n, residual)) = seg.moe {
                let moe = self.moe[layer].as_ref().ok_or_else(|| {
                    Error::Model(format!("layer {layer} has no experts on the device"))
                })?;
                let branch = moe.record_in(
                    passes,
                    &self.acts[&Act::H],
                    n,
                    MoeRouting::Logits {
                        buffer: &self.acts[&Act::R],
                        top_k: cfg.num_experts_per_tok,
                        router: Router::SoftmaxTopK {
                            renormalize: cfg.norm_topk_prob,
                        },
                    },
                    &self.acts[if residual { &Act::X } else { &Act::M }],
                    None,
                    residual,
                )?;
                dispatches += moe.dispatches(true, branch);
            }
        }
        self.last_dispatches = dispatches;
        Ok(plan.branches.clone())
    }
}
