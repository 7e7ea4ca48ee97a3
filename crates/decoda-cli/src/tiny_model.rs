//! `decoda tiny-model`: a small random Qwen3-MoE checkpoint for tests, CI and trying
//! `generate` without a download.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::Args;
use decoda::moe::Affine;
use decoda::testing::tiny::TinySpec;

#[derive(Args)]
pub struct TinyModelArgs {
    /// Directory to write (created if needed).
    dir: PathBuf,
    /// A real model's shape with random weights: `qwen3-30b-a3b` (hidden 2048, 128
    /// experts top-8 with moe_intermediate 768, 32 query and 4 key/value heads of 128,
    /// vocabulary 151,936, no dense layer, untied; 48 layers unless --layers says, at
    /// q4g64 unless --quantize or a --dtype says). One layer at q4g64 takes 779 MB.
    #[arg(long, conflicts_with_all = ["hidden", "heads", "kv_heads", "head_dim", "vocab",
        "experts", "top_k", "moe_intermediate", "intermediate", "dense_layers", "tie",
        "no_norm_topk"])]
    preset: Option<String>,
    /// Quantize every linear and the embeddings as MLX does: q4g32, q4g64 or q8g64 (MLX's
    /// stacked layout; the router at 8 bits).
    #[arg(long)]
    quantize: Option<String>,
    /// Weight dtype (and of scales and biases): f32, bf16 or f16 [default: f32].
    #[arg(long)]
    dtype: Option<String>,
    /// Seed of every value.
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// hidden_size.
    #[arg(long, default_value_t = 64)]
    hidden: usize,
    /// num_hidden_layers [default: 3; 48 with --preset qwen3-30b-a3b].
    #[arg(long)]
    layers: Option<usize>,
    /// num_attention_heads.
    #[arg(long, default_value_t = 4)]
    heads: usize,
    /// num_key_value_heads.
    #[arg(long, default_value_t = 2)]
    kv_heads: usize,
    /// head_dim.
    #[arg(long, default_value_t = 16)]
    head_dim: usize,
    /// vocab_size (at least 257).
    #[arg(long, default_value_t = 320)]
    vocab: usize,
    /// num_experts.
    #[arg(long, default_value_t = 8)]
    experts: usize,
    /// num_experts_per_tok.
    #[arg(long, default_value_t = 2)]
    top_k: usize,
    /// moe_intermediate_size.
    #[arg(long, default_value_t = 64)]
    moe_intermediate: usize,
    /// intermediate_size (dense layers).
    #[arg(long, default_value_t = 128)]
    intermediate: usize,
    /// mlp_only_layers: dense layers, "1,3" ("" for none).
    #[arg(long, default_value = "1")]
    dense_layers: String,
    /// Tie the LM head to the embeddings.
    #[arg(long)]
    tie: bool,
    /// norm_topk_prob = false (routing weights not renormalised).
    #[arg(long)]
    no_norm_topk: bool,
    /// Write MLX's stacked expert layout even unquantized.
    #[arg(long)]
    mlx_layout: bool,
    /// Spread the tensors over N files with an index.
    #[arg(long, default_value_t = 1)]
    shards: usize,
    /// Move every value by up to this fraction of its scale, by noise of its own seed
    /// (--perturb-seed): with the same --seed and shape, a close copy of that model (a
    /// draft for `generate --draft` that mostly agrees with it).
    #[arg(long, default_value_t = 0.0)]
    perturb: f32,
    /// The seed of --perturb's noise.
    #[arg(long, default_value_t = 1)]
    perturb_seed: u64,
}

pub fn run(mut a: TinyModelArgs) -> Result<ExitCode, String> {
    let mut layers = a.layers.unwrap_or(3);
    let mut quantize_default = None;
    match a.preset.as_deref() {
        None => {}
        Some("qwen3-30b-a3b") => {
            (a.hidden, a.heads, a.kv_heads, a.head_dim) = (2048, 32, 4, 128);
            (a.vocab, a.experts, a.top_k) = (151_936, 128, 8);
            (a.moe_intermediate, a.intermediate) = (768, 6144);
            a.dense_layers = String::new();
            layers = a.layers.unwrap_or(48);
            if a.dtype.is_none() {
                quantize_default = Some("q4g64".to_string());
            }
        }
        Some(p) => return Err(format!("--preset {p}: expected qwen3-30b-a3b")),
    }
    let quantize = match a.quantize.as_deref().or(quantize_default.as_deref()) {
        None => None,
        Some(s) => Some(Affine::parse(s).ok_or_else(|| {
            format!(
                "--quantize {s}: expected q4g32, q4g64 or q8g64 (bits 4 or 8, group 32, 64 or 128)"
            )
        })?),
    };
    let dense_layers = a
        .dense_layers
        .split(',')
        .map(str::trim)
        .filter(|t| !t.is_empty())
        .map(|t| {
            t.parse::<usize>()
                .map_err(|_| format!("--dense-layers: {t:?} is not a layer index"))
        })
        .collect::<Result<Vec<_>, _>>()?;
    let spec = TinySpec {
        hidden: a.hidden,
        layers,
        heads: a.heads,
        kv_heads: a.kv_heads,
        head_dim: a.head_dim,
        vocab: a.vocab,
        experts: a.experts,
        top_k: a.top_k,
        moe_intermediate: a.moe_intermediate,
        intermediate: a.intermediate,
        dense_layers,
        tie: a.tie,
        norm_topk: !a.no_norm_topk,
        dtype: a.dtype.unwrap_or_else(|| "f32".into()),
        quantize,
        mlx_layout: a.mlx_layout,
        shards: a.shards,
        seed: a.seed,
        perturb: a.perturb,
        perturb_seed: a.perturb_seed,
        ..TinySpec::default()
    };
    spec.write(&a.dir).map_err(|e| e.to_string())?;
    let bytes: u64 = std::fs::read_dir(&a.dir)
        .map_err(|e| e.to_string())?
        .filter_map(|e| e.ok()?.metadata().ok())
        .map(|m| m.len())
        .sum();
    println!(
        "wrote {} ({:.1} MB): hidden {}, {} layers, {} experts (top-{}), vocab {}{}",
        a.dir.display(),
        bytes as f64 / 1e6,
        spec.hidden,
        spec.layers,
        spec.experts,
        spec.top_k,
        spec.vocab,
        spec.quantize
            .map_or(String::new(), |q| format!(", {}", q.name()))
    );
    Ok(ExitCode::SUCCESS)
}
