//! Qwen3-MoE: the weights, and the forward pass written once over [`Ops`], the small set
//! of operations each backend provides (`super::ops`; the CPU's in `crate::cpu::model`,
//! the device's in `crate::wgpu::model`). [`Qwen3Moe`] is one [`ModelWeights`]: the
//! backends run it without naming it.
//!
//! A layer is `h = x + o_proj(attention(rope(q_norm(q)), rope(k_norm(k)), v))`, then
//! `x = h + mlp(post_norm(h))` where the MLP is a SwiGLU MoE layer (router softmax over
//! E, top-k, optional renormalisation, experts through decoda's MoE dispatch) or a dense
//! SwiGLU MLP, as the config says; then the final norm and the LM head (or the tied
//! embeddings). RMSNorm is `x * w / sqrt(mean(x^2) + eps)`; RoPE rotates the two halves of
//! each head (`x_i`, `x_{i + d/2}`) by `pos * theta^(-2i/d)`; attention is causal with
//! scale `head_dim^-1/2` and grouped key/value heads.

use std::path::Path;

use crate::error::{Error, Result};
use crate::moe::{Dispatch, ExpertWeights, GateUp, Router, SwitchMlp};

use super::config::Config;
use super::load::Checkpoint;
pub use super::ops::{Acc, Act, ModelWeights, MoeBlock, NormId, Ops, RopeTable, WeightId};

/// The `sort_cutoff` a model's MoE layers get unless the caller names one: calls with more
/// tokens than this sort the pairs by expert (prefill), others do not (decode). The CPU's
/// measured crossover at Qwen3-30B-A3B's layer shape is 32 tokens for f32 and 4-bit
/// weights (BENCHMARKS.md); 16 keeps decode batches of up to 16 rows on the unsorted path.
pub const DEFAULT_SORT_CUTOFF: usize = 16;

/// One decoder layer's weights.
#[derive(Debug)]
pub struct Layer {
    /// `input_layernorm` `[D]`.
    pub input_norm: Vec<f32>,
    /// `post_attention_layernorm` `[D]`.
    pub post_norm: Vec<f32>,
    /// `q_proj` `[Hq * hd, D]`.
    pub q: ExpertWeights,
    /// `k_proj` `[Hkv * hd, D]`.
    pub k: ExpertWeights,
    /// `v_proj` `[Hkv * hd, D]`.
    pub v: ExpertWeights,
    /// `o_proj` `[D, Hq * hd]`.
    pub o: ExpertWeights,
    /// `q_norm` `[hd]`.
    pub q_norm: Vec<f32>,
    /// `k_norm` `[hd]`.
    pub k_norm: Vec<f32>,
    /// The MLP.
    pub mlp: Mlp,
}

/// A layer's MLP.
#[derive(Debug)]
pub enum Mlp {
    /// SwiGLU experts behind a router.
    Moe {
        /// `mlp.gate` `[E, D]`: the router.
        router: ExpertWeights,
        /// The experts (`[E, H, D]` gate and up, `[E, D, H]` down).
        experts: SwitchMlp,
        /// Experts per token.
        top_k: usize,
        /// How router logits become weights.
        routing: Router,
    },
    /// A dense SwiGLU MLP.
    Dense {
        /// `gate_proj` `[I, D]`.
        gate: ExpertWeights,
        /// `up_proj` `[I, D]`.
        up: ExpertWeights,
        /// `down_proj` `[D, I]`.
        down: ExpertWeights,
    },
}

/// A Qwen3-MoE model's weights (each matrix `[1, out, in]` in the checkpoint's own format).
#[derive(Debug)]
pub struct Qwen3Moe {
    /// The config.
    pub config: Config,
    /// `embed_tokens` `[V, D]`.
    pub embed: ExpertWeights,
    /// The decoder layers.
    pub layers: Vec<Layer>,
    /// The final norm `[D]`.
    pub norm: Vec<f32>,
    /// `lm_head` `[V, D]`; `None` when the embeddings are tied.
    pub lm_head: Option<ExpertWeights>,
}

/// The forward pass of one call, over any backend's [`Ops`]. Returns the branch each
/// MoE layer took (empty when no layer is MoE).
pub fn forward<O: Ops + ?Sized>(cfg: &Config, ops: &mut O) -> Result<Vec<Dispatch>> {
    let mut branches = Vec::new();
    ops.embed()?;
    for l in 0..cfg.num_hidden_layers {
        ops.rms_norm(Act::X, Act::H, NormId::Input(l), 1)?;
        ops.qkv(l)?;
        ops.norm_rope_store(l, cfg.num_attention_heads, cfg.num_key_value_heads)?;
        ops.attention(l)?;
        ops.linear(Act::A, Act::X, WeightId::O(l), Acc::Add)?;
        ops.rms_norm(Act::X, Act::H, NormId::Post(l), 1)?;
        if cfg.is_moe(l) {
            ops.linear(Act::H, Act::R, WeightId::Router(l), Acc::Store)?;
            branches.push(ops.moe_add(l)?);
        } else {
            ops.swiglu(Act::H, Act::G, WeightId::Gate(l), WeightId::Up(l))?;
            ops.linear(Act::G, Act::X, WeightId::Down(l), Acc::Add)?;
        }
    }
    ops.rms_norm(Act::X, Act::H, NormId::Final, 1)?;
    ops.lm_head()?;
    Ok(branches)
}

impl Qwen3Moe {
    /// Loads `dir` (`config.json` and its safetensors), MoE layers with `sort_cutoff`.
    pub fn load(dir: &Path, sort_cutoff: usize) -> Result<Self> {
        let path = dir.join("config.json");
        let text = std::fs::read_to_string(&path)
            .map_err(|e| Error::Model(format!("cannot read {}: {e}", path.display())))?;
        let config = Config::parse(&text)?;
        let ckpt = Checkpoint::open(dir)?;
        Self::from_checkpoint(config, &ckpt, sort_cutoff)
    }

    /// Builds the model from an opened checkpoint (Hugging Face's or MLX's names).
    pub fn from_checkpoint(config: Config, ck: &Checkpoint, sort_cutoff: usize) -> Result<Self> {
        let c = &config;
        let (d, v) = (c.hidden_size, c.vocab_size);
        let embed = ck.linear("model.embed_tokens", v, d)?;
        let lm_head = if c.tie_word_embeddings {
            None
        } else {
            Some(ck.linear("lm_head", v, d)?)
        };
        let norm = ck.vector("model.norm.weight", d)?;
        let mut layers = Vec::with_capacity(c.num_hidden_layers);
        for l in 0..c.num_hidden_layers {
            let p = format!("model.layers.{l}");
            let a = format!("{p}.self_attn");
            let mlp = if c.is_moe(l) {
                let e = c.num_experts;
                let h = c.moe_intermediate_size;
                let each = |name: &str| -> Vec<String> {
                    (0..e)
                        .map(|x| format!("{p}.mlp.experts.{x}.{name}"))
                        .collect()
                };
                let stacked = |name: &str| format!("{p}.mlp.switch_mlp.{name}");
                let gate = ck.experts(&stacked("gate_proj"), &each("gate_proj"), h, d)?;
                let up = ck.experts(&stacked("up_proj"), &each("up_proj"), h, d)?;
                let down = ck.experts(&stacked("down_proj"), &each("down_proj"), d, h)?;
                Mlp::Moe {
                    router: ck.linear(&format!("{p}.mlp.gate"), e, d)?,
                    experts: SwitchMlp::new(GateUp::Separate { gate, up }, down, sort_cutoff)?,
                    top_k: c.num_experts_per_tok,
                    routing: Router::SoftmaxTopK {
                        renormalize: c.norm_topk_prob,
                    },
                }
            } else {
                let i = c.intermediate_size;
                Mlp::Dense {
                    gate: ck.linear(&format!("{p}.mlp.gate_proj"), i, d)?,
                    up: ck.linear(&format!("{p}.mlp.up_proj"), i, d)?,
                    down: ck.linear(&format!("{p}.mlp.down_proj"), d, i)?,
                }
            };
            layers.push(Layer {
                input_norm: ck.vector(&format!("{p}.input_layernorm.weight"), d)?,
                post_norm: ck.vector(&format!("{p}.post_attention_layernorm.weight"), d)?,
                q: ck.linear(&format!("{a}.q_proj"), c.q_width(), d)?,
                k: ck.linear(&format!("{a}.k_proj"), c.kv_width(), d)?,
                v: ck.linear(&format!("{a}.v_proj"), c.kv_width(), d)?,
                o: ck.linear(&format!("{a}.o_proj"), d, c.q_width())?,
                q_norm: ck.vector(&format!("{a}.q_norm.weight"), c.head_dim)?,
                k_norm: ck.vector(&format!("{a}.k_norm.weight"), c.head_dim)?,
                mlp,
            });
        }
        Ok(Self {
            config,
            embed,
            layers,
            norm,
            lm_head,
        })
    }

    /// The matrix `id` names. Errors if the layer has no such matrix (a dense weight of an
    /// MoE layer, or the reverse).
    pub fn weight(&self, id: WeightId) -> Result<&ExpertWeights> {
        let layer = |l: usize| {
            self.layers
                .get(l)
                .ok_or_else(|| Error::Model(format!("no layer {l}")))
        };
        let wrong = || Error::Model(format!("{id:?}: the layer has no such matrix"));
        Ok(match id {
            WeightId::LmHead => self.lm_head.as_ref().unwrap_or(&self.embed),
            WeightId::Q(l) => &layer(l)?.q,
            WeightId::K(l) => &layer(l)?.k,
            WeightId::V(l) => &layer(l)?.v,
            WeightId::O(l) => &layer(l)?.o,
            WeightId::Router(l) => match &layer(l)?.mlp {
                Mlp::Moe { router, .. } => router,
                Mlp::Dense { .. } => return Err(wrong()),
            },
            WeightId::Gate(l) | WeightId::Up(l) | WeightId::Down(l) => match &layer(l)?.mlp {
                Mlp::Dense { gate, up, down } => match id {
                    WeightId::Gate(_) => gate,
                    WeightId::Up(_) => up,
                    _ => down,
                },
                Mlp::Moe { .. } => return Err(wrong()),
            },
        })
    }

    /// The norm weight `id` names.
    pub fn norm_weight(&self, id: NormId) -> Result<&[f32]> {
        let layer = |l: usize| {
            self.layers
                .get(l)
                .ok_or_else(|| Error::Model(format!("no layer {l}")))
        };
        Ok(match id {
            NormId::Input(l) => &layer(l)?.input_norm,
            NormId::Post(l) => &layer(l)?.post_norm,
            NormId::QNorm(l) => &layer(l)?.q_norm,
            NormId::KNorm(l) => &layer(l)?.k_norm,
            NormId::Final => &self.norm,
        })
    }

    /// Every matrix id of the model (for backends that upload them).
    pub fn weight_ids(&self) -> Vec<WeightId> {
        let mut v = vec![WeightId::LmHead];
        for (l, layer) in self.layers.iter().enumerate() {
            v.extend([
                WeightId::Q(l),
                WeightId::K(l),
                WeightId::V(l),
                WeightId::O(l),
            ]);
            match layer.mlp {
                Mlp::Moe { .. } => v.push(WeightId::Router(l)),
                Mlp::Dense { .. } => {
                    v.extend([WeightId::Gate(l), WeightId::Up(l), WeightId::Down(l)])
                }
            }
        }
        v
    }

    /// Every norm id of the model.
    pub fn norm_ids(&self) -> Vec<NormId> {
        let mut v = vec![NormId::Final];
        for l in 0..self.layers.len() {
            v.extend([
                NormId::Input(l),
                NormId::Post(l),
                NormId::QNorm(l),
                NormId::KNorm(l),
            ]);
        }
        v
    }

    /// The dtype of the expert weights (of the first MoE layer), for reports.
    pub fn expert_dtype(&self) -> Option<crate::moe::WeightDtype> {
        self.layers.iter().find_map(|l| match &l.mlp {
            Mlp::Moe { experts, .. } => Some(experts.dtype()),
            Mlp::Dense { .. } => None,
        })
    }
}

impl ModelWeights for Qwen3Moe {
    fn config(&self) -> &Config {
        &self.config
    }

    fn embed(&self) -> &ExpertWeights {
        &self.embed
    }

    fn tied_lm_head(&self) -> bool {
        self.lm_head.is_none()
    }

    fn weight(&self, id: WeightId) -> Result<&ExpertWeights> {
        Qwen3Moe::weight(self, id)
    }

    fn norm_weight(&self, id: NormId) -> Result<&[f32]> {
        Qwen3Moe::norm_weight(self, id)
    }

    fn weight_ids(&self) -> Vec<WeightId> {
        Qwen3Moe::weight_ids(self)
    }

    fn norm_ids(&self) -> Vec<NormId> {
        Qwen3Moe::norm_ids(self)
    }

    fn moe(&self, layer: usize) -> Option<MoeBlock<'_>> {
        match &self.layers.get(layer)?.mlp {
            Mlp::Moe {
                experts,
                top_k,
                routing,
                ..
            } => Some(MoeBlock {
                experts,
                top_k: *top_k,
                routing: *routing,
            }),
            Mlp::Dense { .. } => None,
        }
    }

    fn forward(&self, ops: &mut dyn Ops) -> Result<Vec<Dispatch>> {
        forward(&self.config, ops)
    }
}
