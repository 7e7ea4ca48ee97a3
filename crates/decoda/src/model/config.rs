//! A Qwen3-MoE `config.json`: the fields the model honours, checked before anything is
//! allocated for them.

use serde_json::Value;

use crate::error::{Error, Result};

/// The shape of a Qwen3-MoE model.
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct Config {
    /// Model width D (`hidden_size`).
    pub hidden_size: usize,
    /// Decoder layers (`num_hidden_layers`).
    pub num_hidden_layers: usize,
    /// Query heads (`num_attention_heads`).
    pub num_attention_heads: usize,
    /// Key/value heads (`num_key_value_heads`; a divisor of the query heads).
    pub num_key_value_heads: usize,
    /// Width of a head (`head_dim`; default `hidden_size / num_attention_heads`).
    pub head_dim: usize,
    /// RMSNorm epsilon (`rms_norm_eps`).
    pub rms_norm_eps: f32,
    /// RoPE base (`rope_theta`, or `rope_parameters.rope_theta`).
    pub rope_theta: f32,
    /// Vocabulary size V (`vocab_size`).
    pub vocab_size: usize,
    /// The LM head is the embedding table (`tie_word_embeddings`).
    pub tie_word_embeddings: bool,
    /// Experts per MoE layer (`num_experts`; 0: every layer dense).
    pub num_experts: usize,
    /// Experts per token (`num_experts_per_tok`).
    pub num_experts_per_tok: usize,
    /// Expert width H (`moe_intermediate_size`).
    pub moe_intermediate_size: usize,
    /// Width of the dense MLP layers (`intermediate_size`).
    pub intermediate_size: usize,
    /// Renormalise the top-k routing weights (`norm_topk_prob`).
    pub norm_topk_prob: bool,
    /// Every `decoder_sparse_step`-th layer is MoE (`decoder_sparse_step`).
    pub decoder_sparse_step: usize,
    /// Layers that are dense whatever the step (`mlp_only_layers`).
    pub mlp_only_layers: Vec<usize>,
    /// MLX's `quantization` block (`group_size`, `bits`), when the checkpoint has one.
    pub quantization: Option<(usize, u32)>,
    /// The positions the model was trained for (`max_position_embeddings`), when the
    /// config says: a sequence's prompt and output together stay within it.
    pub max_position_embeddings: Option<usize>,
}

/// Largest size of any dimension a config may declare (a hostile file's 10^9 experts is
/// an error before any allocation).
const MAX_DIM: usize = 1 << 20;
const MAX_VOCAB: usize = 1 << 24;
const MAX_LAYERS: usize = 1024;

fn get<'a>(v: &'a Value, key: &str) -> Option<&'a Value> {
    v.get(key).filter(|x| !x.is_null())
}

fn count(v: &Value, key: &'static str, max: usize) -> Result<usize> {
    let x = get(v, key).ok_or_else(|| bad(key, "missing", "a count"))?;
    let n = x
        .as_u64()
        .ok_or_else(|| bad(key, &x.to_string(), "a whole number"))?;
    if n == 0 || n as usize > max {
        return Err(bad(
            key,
            &n.to_string(),
            "between 1 and the supported maximum",
        ));
    }
    Ok(n as usize)
}

fn bad(field: &'static str, value: &str, expected: &'static str) -> Error {
    Error::Model(format!(
        "config.json: {field} = {value}: expected {expected}"
    ))
}

fn float(v: &Value, key: &'static str) -> Result<Option<f32>> {
    match get(v, key) {
        None => Ok(None),
        Some(x) => {
            let f = x
                .as_f64()
                .ok_or_else(|| bad(key, &x.to_string(), "a number"))?;
            if !f.is_finite() || f <= 0.0 {
                return Err(bad(key, &f.to_string(), "a positive number"));
            }
            Ok(Some(f as f32))
        }
    }
}

fn flag(v: &Value, key: &'static str, default: bool) -> Result<bool> {
    match get(v, key) {
        None => Ok(default),
        Some(x) => x
            .as_bool()
            .ok_or_else(|| bad(key, &x.to_string(), "true or false")),
    }
}

impl Config {
    /// Parses `config.json` text.
    pub fn parse(text: &str) -> Result<Self> {
        let v: Value = serde_json::from_str(text)
            .map_err(|e| Error::Model(format!("config.json is not JSON: {e}")))?;
        if !v.is_object() {
            return Err(Error::Model("config.json is not a JSON object".into()));
        }
        if let Some(t) = get(&v, "model_type").and_then(Value::as_str) {
            if t != "qwen3_moe" && t != "qwen3" {
                return Err(bad("model_type", t, "qwen3_moe (or qwen3)"));
            }
        }
        // what the model would need and decoda does not do: an error, not a wrong model
        if get(&v, "rope_scaling").is_some_and(|r| r.as_object().is_some_and(|o| !o.is_empty())) {
            return Err(bad(
                "rope_scaling",
                &get(&v, "rope_scaling").map_or(String::new(), Value::to_string),
                "null (scaled RoPE is not supported)",
            ));
        }
        if flag(&v, "attention_bias", false)? {
            return Err(bad(
                "attention_bias",
                "true",
                "false (biased projections are not supported)",
            ));
        }
        if flag(&v, "use_sliding_window", false)? {
            return Err(bad(
                "use_sliding_window",
                "true",
                "false (sliding-window attention is not supported)",
            ));
        }
        if let Some(a) = get(&v, "hidden_act").and_then(Value::as_str) {
            if a != "silu" {
                return Err(bad("hidden_act", a, "silu"));
            }
        }
        let hidden_size = count(&v, "hidden_size", MAX_DIM)?;
        let num_hidden_layers = count(&v, "num_hidden_layers", MAX_LAYERS)?;
        let num_attention_heads = count(&v, "num_attention_heads", 4096)?;
        let num_key_value_heads = match get(&v, "num_key_value_heads") {
            None => num_attention_heads,
            Some(_) => count(&v, "num_key_value_heads", 4096)?,
        };
        if !num_attention_heads.is_multiple_of(num_key_value_heads) {
            return Err(bad(
                "num_key_value_heads",
                &num_key_value_heads.to_string(),
                "a divisor of num_attention_heads",
            ));
        }
        let head_dim = match get(&v, "head_dim") {
            None => hidden_size / num_attention_heads,
            Some(_) => count(&v, "head_dim", 4096)?,
        };
        if head_dim == 0 || !head_dim.is_multiple_of(2) {
            return Err(bad(
                "head_dim",
                &head_dim.to_string(),
                "an even number (RoPE)",
            ));
        }
        let rope_theta = match float(&v, "rope_theta")? {
            Some(t) => t,
            None => match get(&v, "rope_parameters") {
                Some(p) => {
                    if let Some(t) = p.get("rope_type").and_then(Value::as_str) {
                        if t != "default" {
                            return Err(bad("rope_parameters.rope_type", t, "default"));
                        }
                    }
                    float(p, "rope_theta")?
                        .ok_or_else(|| bad("rope_theta", "missing", "a number"))?
                }
                None => 10000.0,
            },
        };
        let num_experts = match get(&v, "num_experts") {
            None => 0,
            Some(x) if x.as_u64() == Some(0) => 0,
            Some(_) => count(&v, "num_experts", 65536)?,
        };
        let (num_experts_per_tok, moe_intermediate_size) = if num_experts > 0 {
            let k = count(&v, "num_experts_per_tok", 1024)?;
            if k > num_experts {
                return Err(bad(
                    "num_experts_per_tok",
                    &k.to_string(),
                    "at most num_experts",
                ));
            }
            (k, count(&v, "moe_intermediate_size", MAX_DIM)?)
        } else {
            (0, 0)
        };
        let decoder_sparse_step = match get(&v, "decoder_sparse_step") {
            None => 1,
            Some(_) => count(&v, "decoder_sparse_step", MAX_LAYERS)?,
        };
        let mlp_only_layers: Vec<usize> = match get(&v, "mlp_only_layers") {
            None => Vec::new(),
            Some(x) => x
                .as_array()
                .ok_or_else(|| bad("mlp_only_layers", &x.to_string(), "a list of layer indices"))?
                .iter()
                .map(|i| {
                    i.as_u64()
                        .filter(|&i| (i as usize) < num_hidden_layers)
                        .map(|i| i as usize)
                        .ok_or_else(|| {
                            bad(
                                "mlp_only_layers",
                                &i.to_string(),
                                "layer indices below num_hidden_layers",
                            )
                        })
                })
                .collect::<Result<_>>()?,
        };
        let cfg = Self {
            hidden_size,
            num_hidden_layers,
            num_attention_heads,
            num_key_value_heads,
            head_dim,
            rms_norm_eps: float(&v, "rms_norm_eps")?.unwrap_or(1e-6),
            rope_theta,
            vocab_size: count(&v, "vocab_size", MAX_VOCAB)?,
            tie_word_embeddings: flag(&v, "tie_word_embeddings", false)?,
            num_experts,
            num_experts_per_tok,
            moe_intermediate_size,
            intermediate_size: 0,
            norm_topk_prob: flag(&v, "norm_topk_prob", false)?,
            decoder_sparse_step,
            mlp_only_layers,
            max_position_embeddings: match get(&v, "max_position_embeddings") {
                None => None,
                Some(_) => Some(count(&v, "max_position_embeddings", 1 << 30)?),
            },
            quantization: match get(&v, "quantization") {
                None => None,
                Some(q) => {
                    if let Some(m) = get(q, "mode").and_then(Value::as_str) {
                        if m != "affine" {
                            return Err(bad("quantization.mode", m, "affine"));
                        }
                    }
                    let g = count(q, "group_size", 1024)?;
                    let b = count(q, "bits", 32)? as u32;
                    Some((g, b))
                }
            },
        };
        let intermediate_size = if (0..num_hidden_layers).any(|l| !cfg.is_moe(l)) {
            count(&v, "intermediate_size", MAX_DIM)?
        } else {
            get(&v, "intermediate_size")
                .and_then(Value::as_u64)
                .unwrap_or(0) as usize
        };
        Ok(Self {
            intermediate_size,
            ..cfg
        })
    }

    /// Whether layer `l` is an MoE layer (Qwen3-MoE's rule: not in `mlp_only_layers`, and
    /// `(l + 1)` a multiple of `decoder_sparse_step`).
    pub fn is_moe(&self, l: usize) -> bool {
        self.num_experts > 0
            && !self.mlp_only_layers.contains(&l)
            && (l + 1).is_multiple_of(self.decoder_sparse_step)
    }

    /// Query width (`num_attention_heads * head_dim`).
    pub fn q_width(&self) -> usize {
        self.num_attention_heads * self.head_dim
    }

    /// Key/value width (`num_key_value_heads * head_dim`).
    pub fn kv_width(&self) -> usize {
        self.num_key_value_heads * self.head_dim
    }
}
