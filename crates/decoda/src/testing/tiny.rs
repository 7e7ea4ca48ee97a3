//! Small random Qwen3-MoE checkpoints in the formats people have: Hugging Face's layout
//! (one tensor per expert) with f32, bf16 or f16 weights, or MLX's (stacked
//! `switch_mlp` experts, 4- or 8-bit affine linears and embeddings with `scales` and
//! `biases`, the router at 8 bits as `mlx-lm` quantizes it), one file or sharded with
//! `model.safetensors.index.json`, and a byte-level `tokenizer.json` (ids 0..255 are
//! the bytes, 256 is `<|endoftext|>`).

use std::collections::BTreeMap;
use std::path::Path;

use half::{bf16, f16};
use safetensors::tensor::TensorView;
use safetensors::Dtype;
use serde_json::json;

use crate::error::{Error, Result};
use crate::moe::{quant, Affine};
use crate::testing::synthetic::uniform;

/// The shape and format of a random checkpoint.
#[derive(Clone, Debug, PartialEq)]
pub struct TinySpec {
    /// `hidden_size`.
    pub hidden: usize,
    /// `num_hidden_layers`.
    pub layers: usize,
    /// `num_attention_heads`.
    pub heads: usize,
    /// `num_key_value_heads`.
    pub kv_heads: usize,
    /// `head_dim`.
    pub head_dim: usize,
    /// `vocab_size` (at least 257: the tokenizer's bytes and end-of-text).
    pub vocab: usize,
    /// `num_experts`.
    pub experts: usize,
    /// `num_experts_per_tok`.
    pub top_k: usize,
    /// `moe_intermediate_size`.
    pub moe_intermediate: usize,
    /// `intermediate_size` (the dense layers).
    pub intermediate: usize,
    /// `mlp_only_layers`.
    pub dense_layers: Vec<usize>,
    /// `tie_word_embeddings`.
    pub tie: bool,
    /// `norm_topk_prob`.
    pub norm_topk: bool,
    /// `rope_theta`.
    pub rope_theta: f32,
    /// Weight dtype: `f32`, `bf16` or `f16` (also the dtype of scales and biases).
    pub dtype: String,
    /// MLX affine quantization of every linear and the embeddings (MLX's layout).
    pub quantize: Option<Affine>,
    /// Write MLX's stacked layout even unquantized.
    pub mlx_layout: bool,
    /// Files to spread the tensors over (more than 1: with an index).
    pub shards: usize,
    /// The seed of every value.
    pub seed: u64,
    /// Each value moved by up to this fraction of its scale, by noise of its own seed
    /// ([`TinySpec::perturb_seed`]): with the same `seed` and shapes, a model close to the
    /// unperturbed one (a draft for speculative decoding that mostly agrees). 0: none.
    pub perturb: f32,
    /// The seed of the perturbation's noise.
    pub perturb_seed: u64,
}

impl Default for TinySpec {
    fn default() -> Self {
        Self {
            hidden: 64,
            layers: 3,
            heads: 4,
            kv_heads: 2,
            head_dim: 16,
            vocab: 320,
            experts: 8,
            top_k: 2,
            moe_intermediate: 64,
            intermediate: 128,
            dense_layers: vec![1],
            tie: false,
            norm_topk: true,
            rope_theta: 10000.0,
            dtype: "f32".into(),
            quantize: None,
            mlx_layout: false,
            shards: 1,
            seed: 0,
            perturb: 0.0,
            perturb_seed: 1,
        }
    }
}

/// A tensor being written: dtype, shape, little-endian bytes.
type Tensor = (Dtype, Vec<usize>, Vec<u8>);

fn encode(values: &[f32], dtype: &str) -> Result<(Dtype, Vec<u8>)> {
    Ok(match dtype {
        "f32" => (
            Dtype::F32,
            values.iter().flat_map(|v| v.to_le_bytes()).collect(),
        ),
        "bf16" => (
            Dtype::BF16,
            values
                .iter()
                .flat_map(|v| bf16::from_f32(*v).to_le_bytes())
                .collect(),
        ),
        "f16" => (
            Dtype::F16,
            values
                .iter()
                .flat_map(|v| f16::from_f32(*v).to_le_bytes())
                .collect(),
        ),
        other => {
            return Err(Error::Model(format!(
                "dtype = {other}: expected f32, bf16 or f16"
            )))
        }
    })
}

struct Writer<'a> {
    spec: &'a TinySpec,
    tensors: BTreeMap<String, Tensor>,
    next_seed: u64,
}

impl Writer<'_> {
    fn values(&mut self, n: usize, scale: f32) -> Vec<f32> {
        self.next_seed += 1;
        let mut v = uniform(
            n,
            scale,
            self.spec
                .seed
                .wrapping_mul(0x9E37_79B9)
                .wrapping_add(self.next_seed),
        );
        if self.spec.perturb != 0.0 {
            let noise = uniform(
                n,
                scale * self.spec.perturb,
                self.spec
                    .perturb_seed
                    .wrapping_mul(0x85EB_CA6B)
                    .wrapping_add(self.next_seed)
                    ^ 0x5EED,
            );
            v.iter_mut().zip(noise).for_each(|(x, e)| *x += e);
        }
        v
    }

    fn plain(&mut self, name: String, shape: Vec<usize>, v: &[f32]) -> Result<()> {
        let (dt, bytes) = encode(v, &self.spec.dtype)?;
        self.tensors.insert(name, (dt, shape, bytes));
        Ok(())
    }

    /// A norm weight: 1 plus a little noise.
    fn norm(&mut self, name: String, n: usize) -> Result<()> {
        let v: Vec<f32> = self.values(n, 0.1).iter().map(|x| 1.0 + x).collect();
        self.plain(name, vec![n], &v)
    }

    /// A matrix `lead + [out, inp]` (one linear, or experts stacked), quantized with `q`.
    fn matrix(
        &mut self,
        prefix: &str,
        lead: &[usize],
        out: usize,
        inp: usize,
        scale: f32,
        q: Option<Affine>,
    ) -> Result<()> {
        let count = lead.iter().product::<usize>() * out;
        // weights: values in the dtype's precision, so the quantizer sees what a reader would
        let v: Vec<f32> = self
            .values(count * inp, scale)
            .into_iter()
            .map(|x| match self.spec.dtype.as_str() {
                "bf16" => bf16::from_f32(x).to_f32(),
                "f16" => f16::from_f32(x).to_f32(),
                _ => x,
            })
            .collect();
        let mut shape = lead.to_vec();
        match q {
            None => {
                shape.extend([out, inp]);
                self.plain(format!("{prefix}.weight"), shape, &v)
            }
            Some(q) => {
                let (packed, scales, biases) = quant::quantize(q, &v, inp)?;
                let mut ws = shape.clone();
                ws.extend([out, q.row_words(inp)]);
                let mut ss = shape;
                ss.extend([out, q.row_groups(inp)]);
                let bytes = packed.iter().flat_map(|w| w.to_le_bytes()).collect();
                self.tensors
                    .insert(format!("{prefix}.weight"), (Dtype::U32, ws, bytes));
                let scales: Vec<f32> = scales
                    .iter()
                    .map(|s| round_to(*s, &self.spec.dtype))
                    .collect();
                let biases: Vec<f32> = biases
                    .iter()
                    .map(|s| round_to(*s, &self.spec.dtype))
                    .collect();
                self.plain(format!("{prefix}.scales"), ss.clone(), &scales)?;
                self.plain(format!("{prefix}.biases"), ss, &biases)
            }
        }
    }
}

fn round_to(x: f32, dtype: &str) -> f32 {
    match dtype {
        "bf16" => bf16::from_f32(x).to_f32(),
        "f16" => f16::from_f32(x).to_f32(),
        _ => x,
    }
}

/// The router's quantization in MLX checkpoints (`mlx-lm` keeps `mlp.gate` at 8 bits).
const ROUTER_Q: (u32, usize) = (8, 64);

impl TinySpec {
    /// The `config.json` of this spec.
    pub fn config(&self) -> serde_json::Value {
        let mut c = json!({
            "architectures": ["Qwen3MoeForCausalLM"],
            "model_type": "qwen3_moe",
            "hidden_size": self.hidden,
            "num_hidden_layers": self.layers,
            "num_attention_heads": self.heads,
            "num_key_value_heads": self.kv_heads,
            "head_dim": self.head_dim,
            "rms_norm_eps": 1e-6,
            "rope_theta": self.rope_theta,
            "rope_scaling": null,
            "vocab_size": self.vocab,
            "tie_word_embeddings": self.tie,
            "num_experts": self.experts,
            "num_experts_per_tok": self.top_k,
            "moe_intermediate_size": self.moe_intermediate,
            "intermediate_size": self.intermediate,
            "norm_topk_prob": self.norm_topk,
            "decoder_sparse_step": 1,
            "mlp_only_layers": self.dense_layers,
            "max_position_embeddings": 4096,
            "hidden_act": "silu",
            "attention_bias": false,
            "use_sliding_window": false,
            "bos_token_id": 256,
            "eos_token_id": 256,
            "torch_dtype": match self.dtype.as_str() { "bf16" => "bfloat16", "f16" => "float16", _ => "float32" },
        });
        if let Some(q) = self.quantize {
            let mut qc = json!({ "group_size": q.group, "bits": q.bits });
            let gate = json!({ "group_size": ROUTER_Q.1, "bits": ROUTER_Q.0 });
            for l in 0..self.layers {
                if self.is_moe(l) {
                    qc[format!("model.layers.{l}.mlp.gate")] = gate.clone();
                }
            }
            c["quantization"] = qc.clone();
            c["quantization_config"] = qc;
        }
        c
    }

    fn is_moe(&self, l: usize) -> bool {
        self.experts > 0 && !self.dense_layers.contains(&l)
    }

    fn check(&self) -> Result<()> {
        let bad = |f: &str, v: String, e: &str| {
            Err(Error::Model(format!("tiny-model: {f} = {v}: expected {e}")))
        };
        if !(self.perturb.is_finite() && self.perturb >= 0.0) {
            return bad(
                "perturb",
                self.perturb.to_string(),
                "a finite fraction >= 0",
            );
        }
        if self.vocab < 257 {
            return bad(
                "vocab",
                self.vocab.to_string(),
                "at least 257 (the tokenizer's bytes and end-of-text)",
            );
        }
        if self.heads == 0 || self.kv_heads == 0 || !self.heads.is_multiple_of(self.kv_heads) {
            return bad("kv_heads", self.kv_heads.to_string(), "a divisor of heads");
        }
        if self.head_dim == 0 || !self.head_dim.is_multiple_of(2) {
            return bad("head_dim", self.head_dim.to_string(), "an even number");
        }
        if self.experts > 0 && (self.top_k == 0 || self.top_k > self.experts) {
            return bad("top_k", self.top_k.to_string(), "between 1 and experts");
        }
        if self.shards == 0 {
            return bad("shards", "0".into(), "at least 1");
        }
        if let Some(l) = self.dense_layers.iter().find(|&&l| l >= self.layers) {
            return bad("dense_layers", l.to_string(), "layer indices below layers");
        }
        Ok(())
    }

    /// Writes the checkpoint, its config and tokenizer to `dir` (created if needed).
    pub fn write(&self, dir: &Path) -> Result<()> {
        self.check()?;
        std::fs::create_dir_all(dir)
            .map_err(|e| Error::Model(format!("cannot create {}: {e}", dir.display())))?;
        let s = self;
        let mut w = Writer {
            spec: s,
            tensors: BTreeMap::new(),
            next_seed: 0,
        };
        let q = s.quantize;
        let mlx = s.mlx_layout || q.is_some();
        let (d, v) = (s.hidden, s.vocab);
        let lin = |i: usize| 1.0 / (i as f32).sqrt() * 1.7;
        w.matrix("model.embed_tokens", &[], v, d, 1.0, q)?;
        for l in 0..s.layers {
            let p = format!("model.layers.{l}");
            w.norm(format!("{p}.input_layernorm.weight"), d)?;
            w.norm(format!("{p}.post_attention_layernorm.weight"), d)?;
            let (qw, kvw) = (s.heads * s.head_dim, s.kv_heads * s.head_dim);
            w.matrix(&format!("{p}.self_attn.q_proj"), &[], qw, d, lin(d), q)?;
            w.matrix(&format!("{p}.self_attn.k_proj"), &[], kvw, d, lin(d), q)?;
            w.matrix(&format!("{p}.self_attn.v_proj"), &[], kvw, d, lin(d), q)?;
            w.matrix(&format!("{p}.self_attn.o_proj"), &[], d, qw, lin(qw), q)?;
            w.norm(format!("{p}.self_attn.q_norm.weight"), s.head_dim)?;
            w.norm(format!("{p}.self_attn.k_norm.weight"), s.head_dim)?;
            if s.is_moe(l) {
                let (e, h) = (s.experts, s.moe_intermediate);
                let rq = q.map(|_| Affine::new(ROUTER_Q.0, ROUTER_Q.1)).transpose()?;
                w.matrix(&format!("{p}.mlp.gate"), &[], e, d, 2.0 * lin(d), rq)?;
                for (name, out, inp) in
                    [("gate_proj", h, d), ("up_proj", h, d), ("down_proj", d, h)]
                {
                    if mlx {
                        w.matrix(
                            &format!("{p}.mlp.switch_mlp.{name}"),
                            &[e],
                            out,
                            inp,
                            lin(inp),
                            q,
                        )?;
                    } else {
                        for x in 0..e {
                            w.matrix(
                                &format!("{p}.mlp.experts.{x}.{name}"),
                                &[],
                                out,
                                inp,
                                lin(inp),
                                q,
                            )?;
                        }
                    }
                }
            } else {
                let i = s.intermediate;
                w.matrix(&format!("{p}.mlp.gate_proj"), &[], i, d, lin(d), q)?;
                w.matrix(&format!("{p}.mlp.up_proj"), &[], i, d, lin(d), q)?;
                w.matrix(&format!("{p}.mlp.down_proj"), &[], d, i, lin(i), q)?;
            }
        }
        w.norm("model.norm.weight".into(), d)?;
        if !s.tie {
            w.matrix("lm_head", &[], v, d, 2.0 * lin(d), q)?;
        }
        let tensors = w.tensors;
        let io = |e: std::io::Error, what: &Path| {
            Error::Model(format!("cannot write {}: {e}", what.display()))
        };
        let write_file = |names: &[&String], file: &Path| -> Result<()> {
            let views: Vec<(String, TensorView<'_>)> = names
                .iter()
                .map(|n| {
                    let (dt, shape, bytes) = &tensors[*n];
                    TensorView::new(*dt, shape.clone(), bytes)
                        .map(|t| ((*n).clone(), t))
                        .map_err(|e| Error::Model(format!("tensor {n}: {e}")))
                })
                .collect::<Result<_>>()?;
            let mut meta = std::collections::HashMap::new();
            meta.insert(
                "format".to_string(),
                if mlx { "mlx" } else { "pt" }.to_string(),
            );
            safetensors::serialize_to_file(views, Some(meta), file)
                .map_err(|e| Error::Model(format!("cannot write {}: {e}", file.display())))
        };
        let names: Vec<&String> = tensors.keys().collect();
        if s.shards == 1 {
            write_file(&names, &dir.join("model.safetensors"))?;
        } else {
            let per = names.len().div_ceil(s.shards);
            let mut map = serde_json::Map::new();
            for (i, chunk) in names.chunks(per).enumerate() {
                let file = format!("model-{:05}-of-{:05}.safetensors", i + 1, s.shards);
                for n in chunk {
                    map.insert((*n).clone(), json!(file));
                }
                write_file(chunk, &dir.join(&file))?;
            }
            let index = json!({ "metadata": {}, "weight_map": map });
            let path = dir.join("model.safetensors.index.json");
            std::fs::write(
                &path,
                serde_json::to_string_pretty(&index).unwrap_or_default(),
            )
            .map_err(|e| io(e, &path))?;
        }
        let path = dir.join("config.json");
        std::fs::write(
            &path,
            serde_json::to_string_pretty(&self.config()).unwrap_or_default(),
        )
        .map_err(|e| io(e, &path))?;
        let path = dir.join("tokenizer.json");
        std::fs::write(&path, byte_tokenizer()).map_err(|e| io(e, &path))?;
        Ok(())
    }
}

/// GPT-2's byte-to-character map: printable bytes stand for themselves, the others for
/// the characters from U+0100 on.
fn byte_char(b: u8) -> char {
    let printable = |b: u8| {
        (b'!'..=b'~').contains(&b) || (0xA1..=0xAC).contains(&b) || (0xAE..=0xFF).contains(&b)
    };
    if printable(b) {
        return char::from(b);
    }
    let n = (0..b).filter(|&x| !printable(x)).count() as u32;
    char::from_u32(256 + n).unwrap_or('?')
}

/// A byte-level BPE tokenizer without merges: one token per byte (id = the byte), and
/// `<|endoftext|>` = 256.
pub fn byte_tokenizer() -> String {
    let vocab: serde_json::Map<String, serde_json::Value> = (0..=255u8)
        .map(|b| (byte_char(b).to_string(), json!(b)))
        .collect();
    let t = json!({
        "version": "1.0",
        "truncation": null,
        "padding": null,
        "added_tokens": [{
            "id": 256, "content": "<|endoftext|>", "single_word": false, "lstrip": false,
            "rstrip": false, "normalized": false, "special": true
        }],
        "normalizer": null,
        "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true, "use_regex": true},
        "post_processor": null,
        "decoder": {"type": "ByteLevel", "add_prefix_space": true, "trim_offsets": true, "use_regex": true},
        "model": {
            "type": "BPE", "dropout": null, "unk_token": null, "continuing_subword_prefix": null,
            "end_of_word_suffix": null, "fuse_unk": false, "byte_fallback": false,
            "ignore_merges": false, "vocab": vocab, "merges": []
        }
    });
    serde_json::to_string_pretty(&t).unwrap_or_default()
}
