//! Planning a call: the model's forward pass ([`forward`]) run over a recorder of
//! [`Ops`], each op one dispatch with its parameters (one uniform buffer per plan, a
//! block per dispatch) and bind group made once; the MoE layers' calls in between.

use crate::error::{Error, Result};
use crate::model::ops::{Acc, Act, NormId, Ops, WeightId};
use crate::moe::Dispatch;
use crate::profile::Launch;

use super::weights::Part;
use super::{grid_of, Mat, ModelOp, Pipe, WgpuModel, OP_STRIDE};

/// Where a call's tokens come from.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(super) enum Tokens {
    /// The prefill buffer (a prompt chunk).
    Prompt,
    /// The head's token buffer (decode).
    Head,
    /// The host-sampling comparison's token buffer.
    Host,
}

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub(super) struct PlanKey {
    pub(super) rows: usize,
    pub(super) map_off: usize,
    pub(super) tokens: Tokens,
    /// (first src row, first logits row, rows) of the LM head; None: no logits.
    pub(super) out: Option<(usize, usize, usize)>,
}

pub(super) struct Kernel {
    pub(super) pipe: Pipe,
    /// The pipeline (the model module's `pipe`, or a matrix product's).
    pub(super) pipeline: wgpu::ComputePipeline,
    pub(super) group: wgpu::BindGroup,
    pub(super) grid: (u32, u32),
    /// Its plan (for `attend`, without the caches, whose length is known when a call
    /// is recorded: [`WgpuModel::attend_bytes`]).
    pub(super) launch: Launch,
}

/// A run of kernels, then optionally an MoE layer's call.
pub(super) struct Segment {
    pub(super) kernels: Vec<Kernel>,
    /// (layer, rows, whether the layer adds into `X` instead of writing `M`).
    pub(super) moe: Option<(usize, usize, bool)>,
}

pub(super) struct Plan {
    pub(super) segments: Vec<Segment>,
    pub(super) branches: Vec<Dispatch>,
    pub(super) _params: wgpu::Buffer,
}

/// The buffers a dispatch binds (None: that binding's placeholder).
#[derive(Default, Clone)]
pub(super) struct Binds {
    pub(super) wts: Option<wgpu::Buffer>,
    pub(super) aux: Option<wgpu::Buffer>,
    pub(super) src: Option<wgpu::Buffer>,
    pub(super) dst: Option<wgpu::Buffer>,
    pub(super) kc: Option<wgpu::Buffer>,
    pub(super) vc: Option<wgpu::Buffer>,
    pub(super) scr: Option<wgpu::Buffer>,
}

pub(super) struct Pending {
    pub(super) pipe: Pipe,
    pub(super) op: ModelOp,
    pub(super) binds: Binds,
    pub(super) grid: usize,
    /// Bytes read and written (see [`Launch`]).
    pub(super) bytes: (u64, u64),
    /// A matrix product's pipeline (else the model module's `pipe`).
    pub(super) mv: Option<wgpu::ComputePipeline>,
    /// Which matrix-product kernel runs, as its launch's name ends: "" (`mv`,
    /// `mv_swiglu`), "_norm" (`mv_norm`, `mv_swiglu_norm`), "_wide" (`mv_wide`) or
    /// "_tiled" (`mm`, `mm_swiglu`); "" for every other kernel.
    pub(super) variant: &'static str,
}

impl WgpuModel {
    pub(super) fn plan(&self, key: &PlanKey) -> Result<Plan> {
        let mut rec = Recorder {
            m: self,
            key,
            pending: Vec::new(),
            cuts: Vec::new(),
            rope: None,
            norm: None,
        };
        let branches = self.model.forward(&mut rec)?;
        rec.flush_norm();
        let map_off = key.map_off as u32;
        rec.push(
            Pipe::Advance,
            ModelOp {
                rows: key.rows as u32,
                map_off,
                ..Default::default()
            },
            Binds::default(),
            1,
            (16 * key.rows as u64, 4 * key.rows as u64),
        );
        let Recorder { pending, cuts, .. } = rec;
        let mut bytes = vec![0u8; pending.len().max(1) * OP_STRIDE as usize];
        for (i, p) in pending.iter().enumerate() {
            let at = i * OP_STRIDE as usize;
            bytes[at..at + std::mem::size_of::<ModelOp>()]
                .copy_from_slice(bytemuck::bytes_of(&p.op));
        }
        use wgpu::util::DeviceExt;
        let params = self
            .ctx
            .device()
            .create_buffer_init(&wgpu::util::BufferInitDescriptor {
                label: Some("decoda model plan"),
                contents: &bytes,
                usage: wgpu::BufferUsages::UNIFORM,
            });
        let mut segments = vec![Segment {
            kernels: Vec::new(),
            moe: None,
        }];
        let mut cut = cuts.iter().peekable();
        for (i, p) in pending.into_iter().enumerate() {
            while let Some(&&(at, layer, residual)) = cut.peek() {
                if at != i {
                    break;
                }
                segments.last_mut().expect("non-empty").moe = Some((layer, key.rows, residual));
                segments.push(Segment {
                    kernels: Vec::new(),
                    moe: None,
                });
                cut.next();
            }
            let b = &p.binds;
            let or_ro =
                |x: &Option<wgpu::Buffer>| x.clone().unwrap_or_else(|| self.dummy_ro.clone());
            let or_rw = |x: &Option<wgpu::Buffer>, k: usize| {
                x.clone().unwrap_or_else(|| self.dummy_rw[k].clone())
            };
            let bufs = [
                or_ro(&b.wts),
                or_ro(&b.aux),
                or_ro(&b.src),
                or_rw(&b.dst, 0),
                self.ctl.clone(),
                or_rw(&b.kc, 1),
                or_rw(&b.vc, 2),
                or_rw(&b.scr, 3),
            ];
            let mut entries = vec![wgpu::BindGroupEntry {
                binding: 0,
                resource: wgpu::BindingResource::Buffer(wgpu::BufferBinding {
                    buffer: &params,
                    offset: i as u64 * OP_STRIDE,
                    size: std::num::NonZeroU64::new(std::mem::size_of::<ModelOp>() as u64),
                }),
            }];
            for (k, buf) in bufs.iter().enumerate() {
                entries.push(wgpu::BindGroupEntry {
                    binding: k as u32 + 1,
                    resource: buf.as_entire_binding(),
                });
            }
            let group = self
                .ctx
                .device()
                .create_bind_group(&wgpu::BindGroupDescriptor {
                    label: Some("decoda model"),
                    layout: &self.pipes.binds,
                    entries: &entries,
                });
            segments
                .last_mut()
                .expect("non-empty")
                .kernels
                .push(Kernel {
                    pipe: p.pipe,
                    pipeline: p
                        .mv
                        .clone()
                        .unwrap_or_else(|| self.pipes.get(p.pipe as usize).clone()),
                    group,
                    grid: grid_of(p.grid),
                    launch: Launch {
                        kernel: format!("model.{}{}", p.pipe.name(), p.variant),
                        workgroups: p.grid as u64,
                        bytes_read: p.bytes.0,
                        bytes_written: p.bytes.1,
                    },
                });
        }
        Ok(Plan {
            segments,
            branches,
            _params: params,
        })
    }
}

/// Plans a call: the [`Ops`] of the forward pass, recorded as dispatches.
struct Recorder<'a> {
    m: &'a WgpuModel,
    key: &'a PlanKey,
    pending: Vec<Pending>,
    /// (index of the next kernel, layer, adds into `X`): an MoE call goes there.
    cuts: Vec<(usize, usize, bool)>,
    /// A decode call's norm_rope left to the next `attend_part` (its norms, if any).
    rope: Option<Option<(u32, u32)>>,
    /// An RMS norm left to the matrix product that reads its output (`mv_norm`); any
    /// other op records it as a dispatch first.
    norm: Option<PendingNorm>,
}

/// An RMS norm not recorded yet: `dst` = norm(`src`) with weights `w`.
#[derive(Clone, Copy)]
struct PendingNorm {
    src: Act,
    dst: Act,
    w: NormId,
}

impl Recorder<'_> {
    /// Records the pending RMS norm, if any, as an `rms` dispatch.
    fn flush_norm(&mut self) {
        if let Some(n) = self.norm.take() {
            self.push_rms(n.src, n.dst, n.w, 1);
        }
    }

    fn push_rms(&mut self, src: Act, dst: Act, w: NormId, groups: usize) {
        let width = self.width(src);
        let op = ModelOp {
            rows: self.key.rows as u32,
            in_w: width / groups as u32,
            groups: groups as u32,
            src_w: width,
            dst_w: self.width(dst),
            eps: self.m.model.config().rms_norm_eps,
            aux_off: self.m.norm_off[&w],
            inplace: u32::from(src == dst),
            ..Default::default()
        };
        let binds = Binds {
            aux: Some(self.m.norms.clone()),
            src: if src == dst { None } else { self.act(src) },
            dst: self.act(dst),
            ..Default::default()
        };
        let bytes = (
            self.act_bytes(width) + 4 * u64::from(width) / groups as u64,
            self.act_bytes(width),
        );
        self.push(Pipe::Rms, op, binds, self.key.rows * groups, bytes);
    }

    fn push(&mut self, pipe: Pipe, mut op: ModelOp, binds: Binds, grid: usize, bytes: (u64, u64)) {
        // an op that does not take the pending norm in: the norm runs before it
        if pipe != Pipe::Linear {
            self.flush_norm();
        }
        op.zero = 0;
        self.pending.push(Pending {
            pipe,
            op,
            binds,
            grid,
            bytes,
            mv: None,
            variant: "",
        });
    }

    /// Rows of the call, as bytes of f32 activations `width` wide.
    fn act_bytes(&self, width: u32) -> u64 {
        4 * self.key.rows as u64 * u64::from(width)
    }

    fn act(&self, a: Act) -> Option<wgpu::Buffer> {
        Some(self.m.acts[&a].clone())
    }

    fn width(&self, a: Act) -> u32 {
        a.width(self.m.model.config()) as u32
    }

    /// The parameters of one part of a matrix: its format, offsets, rows (`out_w`) and
    /// where they land (`out_off`).
    fn mat_op(mat: &Mat, part: &Part) -> ModelOp {
        ModelOp {
            dtype: mat.dtype,
            bits: mat.bits,
            group: mat.group,
            row_words: mat.row_words,
            w_off: part.w_off,
            s_off: part.s_off,
            b_off: part.b_off,
            in_w: mat.inp as u32,
            out_w: part.rows as u32,
            out_off: part.first as u32,
            ..Default::default()
        }
    }

    /// One matrix product (`mv.wgsl`) per part of `mat`: `op` with each part's matrix
    /// fields. Row by row (`mv`), four output rows a workgroup, each streaming its weight
    /// rows once per eight rows of the call (for SwiGLU the up rows beside the gate
    /// rows); a call of [`super::TILED_ROWS`] rows or more (prefill) runs tiled (`mm`),
    /// 8 weight rows by 32 call rows a workgroup, the weights read once per 32 rows. The
    /// inputs are counted once.
    fn push_linear(&mut self, mat: &Mat, op: ModelOp, binds: &Binds) -> Result<()> {
        let swiglu = op.kind == 2;
        let tiled = op.rows as usize >= super::TILED_ROWS;
        // the RMS norm before it, taken into a row-by-row product (`mv_norm`): its input
        // is the norm's, normed on the fly, and the normed rows go to the norm's output
        // as well; before a tiled product the norm runs as its own dispatch
        let fused = self.norm.filter(|n| !tiled && binds.src == self.act(n.dst));
        if fused.is_some() {
            self.norm = None;
        } else {
            self.flush_norm();
        }
        let (op, binds) = match fused {
            Some(n) => (
                ModelOp {
                    aux_off: self.m.norm_off[&n.w],
                    eps: self.m.model.config().rms_norm_eps,
                    ..op
                },
                Binds {
                    aux: Some(self.m.norms.clone()),
                    src: self.act(n.src),
                    kc: if op.kind == 3 {
                        binds.kc.clone()
                    } else {
                        self.act(n.dst)
                    },
                    ..binds.clone()
                },
            ),
            None => (op, binds.clone()),
        };
        let binds = &binds;
        let kind = if tiled {
            super::MvKind::Tiled
        } else {
            super::MvKind::Rows {
                norm: fused.is_some(),
            }
        };
        let pipeline = super::mv_pipeline(&self.m.ctx, mat, swiglu, kind, op.src_w)?;
        // a plain product of many rows (the LM head): 32 output rows a workgroup
        let wide_ok = !tiled && !swiglu && fused.is_none() && op.kind == 0;
        let wide_pipeline = if wide_ok && mat.parts.iter().any(|p| p.rows >= super::WIDE_ROWS) {
            Some(super::mv_pipeline(
                &self.m.ctx,
                mat,
                false,
                super::MvKind::Wide,
                op.src_w,
            )?)
        } else {
            None
        };
        let rows = u64::from(op.rows);
        let streams = if tiled {
            rows.div_ceil(super::TILED_ROWS as u64)
        } else {
            rows.div_ceil(8)
        };
        let pair = if swiglu { 2 } else { 1 };
        for part in &mat.parts {
            let w = part.rows as u64 * mat.row_bytes() * pair * streams;
            let x = 4 * rows * mat.inp as u64;
            let out = 4 * rows * part.rows as u64;
            // accumulating reads what it adds to; a norm reads the input twice (its sum of
            // squares, then the product) and writes the normed rows once (workgroup 0)
            let normed = if fused.is_some() { x } else { 0 };
            let bytes = (
                w + x + normed + if op.kind == 1 { out } else { 0 },
                out + if fused.is_some() && op.kind != 3 {
                    normed
                } else {
                    0
                },
            );
            let op = ModelOp {
                rows: op.rows,
                kind: op.kind,
                src_w: op.src_w,
                dst_w: op.dst_w,
                src_row0: op.src_row0,
                dst_row0: op.dst_row0,
                heads: op.heads,
                kv_heads: op.kv_heads,
                head_dim: op.head_dim,
                max_pos: op.max_pos,
                map_off: op.map_off,
                aux_off: op.aux_off,
                eps: op.eps,
                ..Self::mat_op(mat, part)
            };
            let binds = Binds {
                wts: Some(part.buf.clone()),
                ..binds.clone()
            };
            let wide = wide_pipeline
                .as_ref()
                .filter(|_| part.rows >= super::WIDE_ROWS);
            let grid = if tiled {
                let per = if swiglu { 4 } else { 8 };
                part.rows.div_ceil(per) * (op.rows as usize).div_ceil(super::TILED_ROWS)
            } else if wide.is_some() {
                part.rows.div_ceil(32)
            } else {
                part.rows.div_ceil(4)
            };
            self.push(Pipe::Linear, op, binds, grid, bytes);
            let last = self.pending.last_mut().expect("pushed");
            last.mv = Some(wide.unwrap_or(&pipeline).clone());
            last.variant = if tiled {
                "_tiled"
            } else if wide.is_some() {
                "_wide"
            } else if fused.is_some() {
                "_norm"
            } else {
                ""
            };
        }
        Ok(())
    }

    fn mat(&self, id: WeightId) -> Result<&Mat> {
        self.m
            .mats
            .get(&id)
            .ok_or_else(|| Error::Model(format!("{id:?} is not on the device")))
    }

    /// One `norm_rope` dispatch (a workgroup per row and head): the q and k heads normed
    /// by the norms at `norms` (q's, k's word offsets; none: not normed), rotated, and k
    /// stored in layer `layer`'s cache. A decode call (each row its slot's only one)
    /// leaves it to `attend_part`, which does the same for its head and chunk.
    fn push_norm_rope(&mut self, layer: usize, norms: Option<(u32, u32)>) -> Result<()> {
        if self.key.tokens != Tokens::Prompt
            && self.m.model.config().head_dim <= super::ATTEND_FUSED_HEAD_DIM
        {
            self.rope = Some(norms);
            return Ok(());
        }
        let (q_norm, k_norm) = norms.unwrap_or((0, 0));
        let op = ModelOp {
            kind: if norms.is_some() { 3 } else { 0 },
            s_off: q_norm,
            b_off: k_norm,
            eps: self.m.model.config().rms_norm_eps,
            ..self.cfg_op()
        };
        let binds = Binds {
            wts: Some(self.m.norms.clone()),
            aux: Some(self.m.rope.clone()),
            src: self.act(Act::K),
            dst: self.act(Act::Q),
            kc: Some(self.m.kc[layer].clone()),
            ..Default::default()
        };
        let (q, kv) = (self.width(Act::Q), self.width(Act::K));
        let c = self.m.model.config();
        let heads = c.num_attention_heads + c.num_key_value_heads;
        let table = 4 * self.key.rows as u64 * c.head_dim as u64;
        let bytes = (
            self.act_bytes(q) + self.act_bytes(kv) + table,
            self.act_bytes(q) + self.act_bytes(kv),
        );
        self.push(Pipe::NormRope, op, binds, self.key.rows * heads, bytes);
        Ok(())
    }

    fn cfg_op(&self) -> ModelOp {
        let c = self.m.model.config();
        ModelOp {
            rows: self.key.rows as u32,
            heads: c.num_attention_heads as u32,
            kv_heads: c.num_key_value_heads as u32,
            head_dim: c.head_dim as u32,
            max_pos: self.m.max_pos as u32,
            map_off: self.key.map_off as u32,
            ..Default::default()
        }
    }
}

impl Ops for Recorder<'_> {
    fn embed(&mut self) -> Result<()> {
        let e = &self.m.embed;
        let tokens = match self.key.tokens {
            Tokens::Prompt => self.m.prompt_tokens.clone(),
            Tokens::Host => self.m.host_tokens.clone(),
            Tokens::Head => self
                .m
                .head_tokens
                .clone()
                .ok_or_else(|| Error::Model("decode without a head".into()))?,
        };
        // an embedding in parts: each dispatch writes the rows whose token it holds
        for part in &e.parts {
            let op = ModelOp {
                rows: self.key.rows as u32,
                dst_w: self.width(Act::X),
                map_off: self.key.map_off as u32,
                ..Self::mat_op(e, part)
            };
            let binds = Binds {
                wts: Some(part.buf.clone()),
                aux: Some(tokens.clone()),
                dst: self.act(Act::X),
                ..Default::default()
            };
            // each row's token lies in one part: a part's share of the rows is its share
            // of the vocabulary, in the plan
            let share = |b: u64| b * part.rows as u64 / e.out as u64;
            let rows = self.key.rows as u64;
            let bytes = (
                share(rows * e.row_bytes()) + 16 * rows,
                share(self.act_bytes(self.width(Act::X))),
            );
            self.push(Pipe::Embed, op, binds, self.key.rows, bytes);
        }
        Ok(())
    }

    fn rms_norm(&mut self, src: Act, dst: Act, w: NormId, groups: usize) -> Result<()> {
        self.flush_norm();
        if !self.m.norm_off.contains_key(&w) {
            return Err(Error::Model(format!("{w:?} is not on the device")));
        }
        // one norm per row, into another buffer: the next matrix product may take it
        if groups == 1 && src != dst {
            self.norm = Some(PendingNorm { src, dst, w });
            return Ok(());
        }
        self.push_rms(src, dst, w, groups);
        Ok(())
    }

    fn linear(&mut self, src: Act, dst: Act, w: WeightId, acc: Acc) -> Result<()> {
        let mat = self.mat(w)?.clone();
        let op = ModelOp {
            rows: self.key.rows as u32,
            kind: match acc {
                Acc::Store => 0,
                Acc::Add => 1,
            },
            src_w: self.width(src),
            dst_w: self.width(dst),
            ..Default::default()
        };
        let binds = Binds {
            src: self.act(src),
            dst: self.act(dst),
            ..Default::default()
        };
        self.push_linear(&mat, op, &binds)
    }

    fn qkv(&mut self, layer: usize) -> Result<()> {
        let mat = self
            .m
            .qkv
            .get(&layer)
            .ok_or_else(|| {
                Error::Model(format!("layer {layer}'s q, k and v are not on the device"))
            })?
            .clone();
        let op = ModelOp {
            kind: 3,
            src_w: self.width(Act::H),
            dst_w: self.width(Act::Q),
            ..self.cfg_op()
        };
        // v goes straight into the layer's value cache
        let binds = Binds {
            src: self.act(Act::H),
            dst: self.act(Act::Q),
            kc: self.act(Act::K),
            vc: Some(self.m.vc[layer].clone()),
            ..Default::default()
        };
        self.push_linear(&mat, op, &binds)
    }

    fn swiglu(&mut self, src: Act, dst: Act, gate: WeightId, _up: WeightId) -> Result<()> {
        let mat = self.mat(gate)?.clone();
        let op = ModelOp {
            rows: self.key.rows as u32,
            kind: 2,
            src_w: self.width(src),
            dst_w: self.width(dst),
            ..Default::default()
        };
        let binds = Binds {
            src: self.act(src),
            dst: self.act(dst),
            ..Default::default()
        };
        self.push_linear(&mat, op, &binds)
    }

    fn rope_store(&mut self, layer: usize) -> Result<()> {
        self.push_norm_rope(layer, None)
    }

    fn norm_rope_store(&mut self, layer: usize, _heads: usize, _kv_heads: usize) -> Result<()> {
        let off = |id: NormId| {
            self.m
                .norm_off
                .get(&id)
                .copied()
                .ok_or_else(|| Error::Model(format!("{id:?} is not on the device")))
        };
        let norms = (off(NormId::QNorm(layer))?, off(NormId::KNorm(layer))?);
        self.push_norm_rope(layer, Some(norms))
    }

    fn attention(&mut self, layer: usize) -> Result<()> {
        let c = self.m.model.config();
        let (heads, kv_heads) = (c.num_attention_heads, c.num_key_value_heads);
        // chunks of the longest cache: a workgroup past its row's position returns
        let chunks = self.m.max_pos.div_ceil(super::ATTEND_CHUNK);
        let op = ModelOp {
            scale: 1.0 / (c.head_dim as f32).sqrt(),
            eps: c.rms_norm_eps,
            groups: chunks as u32,
            ..self.cfg_op()
        };
        let binds = Binds {
            src: self.act(Act::Q),
            dst: self.act(Act::A),
            kc: Some(self.m.kc[layer].clone()),
            vc: Some(self.m.vc[layer].clone()),
            scr: Some(self.m.scores.clone()),
            ..Default::default()
        };
        // a decode call's norm_rope, fused into attend_part (q from src, k from dst)
        let (part_op, part_binds, fused_bytes) = match self.rope.take() {
            Some(norms) => {
                let (q_norm, k_norm) = norms.unwrap_or((0, 0));
                let op = ModelOp {
                    kind: 4 | if norms.is_some() { 3 } else { 0 },
                    s_off: q_norm,
                    b_off: k_norm,
                    ..op
                };
                let binds = Binds {
                    wts: Some(self.m.norms.clone()),
                    aux: Some(self.m.rope.clone()),
                    dst: self.act(Act::K),
                    ..binds.clone()
                };
                // each query head's workgroup norms and rotates its group's key (and
                // reads the rotation table); the group's first head writes it
                let kv = self.act_bytes(self.width(Act::K));
                let table = 4 * self.key.rows as u64 * c.head_dim as u64;
                let per = (heads / kv_heads) as u64;
                (op, binds, (per * (kv + table), kv))
            }
            None => (op, binds.clone(), (0, 0)),
        };
        // q in (the caches and partials when recorded), then the output out; the grid
        // given here is the cache's bound: a call records the chunks its rows reach
        // (`WgpuModel::record`)
        let q = self.act_bytes(self.width(Act::Q));
        self.push(
            Pipe::AttendPart,
            part_op,
            part_binds,
            self.key.rows * heads * chunks,
            (q + fused_bytes.0, fused_bytes.1),
        );
        let a = self.act_bytes(self.width(Act::A));
        self.push(Pipe::AttendMerge, op, binds, self.key.rows * heads, (0, a));
        Ok(())
    }

    fn moe(&mut self, layer: usize) -> Result<Dispatch> {
        let moe = self.m.moe[layer]
            .as_ref()
            .ok_or_else(|| Error::Model(format!("layer {layer} is not an MoE layer")))?;
        self.flush_norm();
        self.cuts.push((self.pending.len(), layer, false));
        Ok(moe.dispatch_for(self.key.rows))
    }

    fn moe_add(&mut self, layer: usize) -> Result<Dispatch> {
        let d = self.moe(layer)?;
        if let Some(c) = self.cuts.last_mut() {
            c.2 = true;
        }
        Ok(d)
    }

    fn add(&mut self, src: Act, dst: Act) -> Result<()> {
        let w = self.width(dst);
        let op = ModelOp {
            rows: self.key.rows as u32,
            dst_w: w,
            ..Default::default()
        };
        let binds = Binds {
            src: self.act(src),
            dst: self.act(dst),
            ..Default::default()
        };
        self.push(
            Pipe::Add,
            op,
            binds,
            (self.key.rows * w as usize).div_ceil(256),
            (2 * self.act_bytes(w), self.act_bytes(w)),
        );
        Ok(())
    }

    fn lm_head(&mut self) -> Result<()> {
        let Some((src_row, dst_row, count)) = self.key.out else {
            return Ok(());
        };
        // the final norm runs on its own: taken into the LM head, each of its tens of
        // thousands of workgroups would sum the row's squares again
        self.flush_norm();
        let mat = self.mat(WeightId::LmHead)?.clone();
        let op = ModelOp {
            rows: count as u32,
            kind: 0,
            src_w: self.width(Act::H),
            dst_w: mat.out as u32,
            src_row0: src_row as u32,
            dst_row0: dst_row as u32,
            ..Default::default()
        };
        let binds = Binds {
            src: self.act(Act::H),
            dst: Some(self.m.logits.clone()),
            ..Default::default()
        };
        self.push_linear(&mat, op, &binds)
    }
}
