//! The model's ops, apart from any model family: what a backend provides for a forward
//! pass ([`Ops`]), the names the ops use for weights and activations ([`WeightId`],
//! [`NormId`], [`Act`]), RoPE's table, and what a backend reads of a model
//! ([`ModelWeights`]). A backend implements [`Ops`] over any [`ModelWeights`] without
//! naming a model; a model family (Qwen3-MoE in `qwen3_moe.rs`) is one implementation of
//! [`ModelWeights`] whose forward pass calls the ops.

use crate::error::Result;
use crate::moe::{Dispatch, ExpertWeights, Router, SwitchMlp, WeightDtype};

use super::config::Config;

/// A matrix of the model, by role.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum WeightId {
    /// The LM head (or the tied embeddings).
    LmHead,
    /// Layer `l`'s `q_proj`.
    Q(usize),
    /// Layer `l`'s `k_proj`.
    K(usize),
    /// Layer `l`'s `v_proj`.
    V(usize),
    /// Layer `l`'s `o_proj`.
    O(usize),
    /// Layer `l`'s router.
    Router(usize),
    /// Layer `l`'s dense `gate_proj`.
    Gate(usize),
    /// Layer `l`'s dense `up_proj`.
    Up(usize),
    /// Layer `l`'s dense `down_proj`.
    Down(usize),
}

/// A norm weight of the model, by role.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum NormId {
    /// Layer `l`'s `input_layernorm`.
    Input(usize),
    /// Layer `l`'s `post_attention_layernorm`.
    Post(usize),
    /// Layer `l`'s `q_norm` (per head).
    QNorm(usize),
    /// Layer `l`'s `k_norm` (per head).
    KNorm(usize),
    /// The final norm.
    Final,
}

/// The activations the forward passes between ops, each `[rows, width]` f32.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Act {
    /// The residual stream `[rows, D]`.
    X,
    /// A normed copy of it `[rows, D]`.
    H,
    /// Queries `[rows, Hq * hd]`.
    Q,
    /// Keys `[rows, Hkv * hd]`.
    K,
    /// Values `[rows, Hkv * hd]`.
    V,
    /// Attention output `[rows, Hq * hd]`.
    A,
    /// The dense MLP's activation `[rows, I]`.
    G,
    /// Router logits `[rows, E]`.
    R,
    /// The MLP's output `[rows, D]`.
    M,
}

impl Act {
    /// The width of this activation for `cfg`.
    pub fn width(self, cfg: &Config) -> usize {
        match self {
            Act::X | Act::H | Act::M => cfg.hidden_size,
            Act::Q | Act::A => cfg.q_width(),
            Act::K | Act::V => cfg.kv_width(),
            Act::G => cfg.intermediate_size,
            Act::R => cfg.num_experts,
        }
    }
}

/// Whether a product replaces its destination or adds to it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Acc {
    /// `dst = W src`.
    Store,
    /// `dst += W src` (the residual connections).
    Add,
}

/// What a backend provides for the forward pass. Each op runs over every row of the
/// current call (a backend's own entry point sets the call up: which slots, which
/// positions, which tokens) except [`Ops::lm_head`], which runs over the rows whose
/// logits the call wants.
pub trait Ops {
    /// `X` = the embedding rows of the call's tokens.
    fn embed(&mut self) -> Result<()>;
    /// `dst = rms_norm(src) * w`, each row split into `groups` equal parts normed apart
    /// (`groups` > 1: the per-head q/k norms). `src` and `dst` may be the same.
    fn rms_norm(&mut self, src: Act, dst: Act, w: NormId, groups: usize) -> Result<()>;
    /// `dst (=|+=) W src`.
    fn linear(&mut self, src: Act, dst: Act, w: WeightId, acc: Acc) -> Result<()>;
    /// `dst = silu(gate src) * (up src)`.
    fn swiglu(&mut self, src: Act, dst: Act, gate: WeightId, up: WeightId) -> Result<()>;
    /// `Q`, `K` and `V` of layer `layer` from `H` (its `q_proj`, `k_proj`, `v_proj`): one
    /// op a backend may fuse (the device does: one dispatch for the three).
    fn qkv(&mut self, layer: usize) -> Result<()> {
        self.linear(Act::H, Act::Q, WeightId::Q(layer), Acc::Store)?;
        self.linear(Act::H, Act::K, WeightId::K(layer), Acc::Store)?;
        self.linear(Act::H, Act::V, WeightId::V(layer), Acc::Store)
    }
    /// RoPE on `Q` and `K` at each row's position; `K` and `V` into layer `layer`'s cache
    /// at those positions.
    fn rope_store(&mut self, layer: usize) -> Result<()>;
    /// `Q` and `K` RMS-normed per head (`QNorm(layer)` over `heads` groups, `KNorm(layer)`
    /// over `kv_heads`), then [`Ops::rope_store`]: one op a backend may fuse (the device
    /// does, one dispatch for the three).
    fn norm_rope_store(&mut self, layer: usize, heads: usize, kv_heads: usize) -> Result<()> {
        self.rms_norm(Act::Q, Act::Q, NormId::QNorm(layer), heads)?;
        self.rms_norm(Act::K, Act::K, NormId::KNorm(layer), kv_heads)?;
        self.rope_store(layer)
    }
    /// `A` = causal attention of `Q` over layer `layer`'s cache up to each row's position.
    fn attention(&mut self, layer: usize) -> Result<()>;
    /// `M` = layer `layer`'s experts over `H`, routed by the router logits `R`; returns
    /// the branch the call took (from the call's row count against the layer's cutoff).
    fn moe(&mut self, layer: usize) -> Result<Dispatch>;
    /// `dst += src`.
    fn add(&mut self, src: Act, dst: Act) -> Result<()>;
    /// [`Ops::moe`], then `X += M` ([`Ops::add`]): one op a backend may fuse (the device
    /// adds the experts' combination into `X` in the dispatch that combines them).
    fn moe_add(&mut self, layer: usize) -> Result<Dispatch> {
        let d = self.moe(layer)?;
        self.add(Act::M, Act::X)?;
        Ok(d)
    }
    /// The logits of the call's output rows: `LM head · H`.
    fn lm_head(&mut self) -> Result<()>;
}

/// RoPE's cosines and sines for positions `0 .. positions`: `[pos, hd / 2]` each,
/// computed in f64 and rounded once, so every backend rotates by the same values.
#[derive(Clone, Debug)]
pub struct RopeTable {
    /// Half the head width.
    pub half: usize,
    /// `cos(pos * theta^(-2i/hd))`, `[positions, half]`.
    pub cos: Vec<f32>,
    /// `sin(pos * theta^(-2i/hd))`, `[positions, half]`.
    pub sin: Vec<f32>,
}

impl RopeTable {
    /// The table for `positions` positions of `cfg`'s heads.
    pub fn new(cfg: &Config, positions: usize) -> Self {
        let half = cfg.head_dim / 2;
        let theta = f64::from(cfg.rope_theta);
        let inv: Vec<f64> = (0..half)
            .map(|i| theta.powf(-(2.0 * i as f64) / cfg.head_dim as f64))
            .collect();
        let mut cos = Vec::with_capacity(positions * half);
        let mut sin = Vec::with_capacity(positions * half);
        for p in 0..positions {
            for f in &inv {
                let a = p as f64 * f;
                cos.push(a.cos() as f32);
                sin.push(a.sin() as f32);
            }
        }
        Self { half, cos, sin }
    }

    /// Positions the table covers.
    pub fn positions(&self) -> usize {
        self.cos.len() / self.half.max(1)
    }
}

/// A layer's mixture of experts as a backend runs it: the experts, how many each token
/// takes, and how the router's logits become weights.
#[derive(Clone, Copy, Debug)]
pub struct MoeBlock<'a> {
    /// The experts' weights and their sort cutoff.
    pub experts: &'a SwitchMlp,
    /// Experts per token.
    pub top_k: usize,
    /// How router logits become weights.
    pub routing: Router,
}

/// What a backend reads of a model: its config, its weights by role, its MoE blocks, and
/// its forward pass over the backend's [`Ops`]. A model family implements it once; every
/// backend then runs it (`crate::cpu::CpuEngine`, `crate::wgpu::WgpuEngine`).
pub trait ModelWeights: std::fmt::Debug + Send + Sync {
    /// The model's shapes.
    fn config(&self) -> &Config;
    /// The token embeddings `[V, D]`.
    fn embed(&self) -> &ExpertWeights;
    /// Whether the LM head is the embedding matrix (tied).
    fn tied_lm_head(&self) -> bool;
    /// The matrix `id` names; an error when the model has no such matrix.
    fn weight(&self, id: WeightId) -> Result<&ExpertWeights>;
    /// The norm weight `id` names.
    fn norm_weight(&self, id: NormId) -> Result<&[f32]>;
    /// Every matrix id of the model (for backends that upload them).
    fn weight_ids(&self) -> Vec<WeightId>;
    /// Every norm id of the model.
    fn norm_ids(&self) -> Vec<NormId>;
    /// Layer `layer`'s mixture of experts, `None` for a dense layer.
    fn moe(&self, layer: usize) -> Option<MoeBlock<'_>>;
    /// The dtype of the expert weights (of the first MoE layer), for reports.
    fn expert_dtype(&self) -> Option<WeightDtype> {
        (0..self.config().num_hidden_layers).find_map(|l| self.moe(l).map(|m| m.experts.dtype()))
    }
    /// One call's forward pass over `ops`; returns the branch each MoE layer took.
    fn forward(&self, ops: &mut dyn Ops) -> Result<Vec<Dispatch>>;
}
