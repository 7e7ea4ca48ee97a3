//! Synthetic MoE layers and inputs for benchmarks and tests (seeded, deterministic).

use rayon::prelude::*;

use crate::error::Result;
use crate::moe::{route, ExpertWeights, GateUp, MoeShape, Routing, SwitchMlp, WeightDtype};

fn splitmix(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// `len` values uniform in `[-scale, scale)`, a pure function of `(seed, index)`.
pub fn uniform(len: usize, scale: f32, seed: u64) -> Vec<f32> {
    let mut v = vec![0f32; len];
    v.par_chunks_mut(4096).enumerate().for_each(|(c, chunk)| {
        for (i, x) in chunk.iter_mut().enumerate() {
            let r = splitmix(seed ^ splitmix((c * 4096 + i) as u64));
            let u = (r >> 40) as f32 / (1u64 << 24) as f32;
            *x = (2.0 * u - 1.0) * scale;
        }
    });
    v
}

fn weights(
    experts: usize,
    out: usize,
    inp: usize,
    dtype: WeightDtype,
    seed: u64,
) -> Result<ExpertWeights> {
    let v = uniform(experts * out * inp, 1.0 / (inp as f32).sqrt(), seed);
    let w = ExpertWeights::from_f32(v, experts, out, inp)?;
    if dtype == WeightDtype::F32 {
        Ok(w)
    } else {
        w.converted(dtype)
    }
}

/// A layer of random SwiGLU experts of `shape` (weights uniform in `±1/sqrt(in)`).
pub fn layer(
    shape: MoeShape,
    dtype: WeightDtype,
    fused: bool,
    sort_cutoff: usize,
    seed: u64,
) -> Result<SwitchMlp> {
    let MoeShape {
        experts: e,
        hidden: d,
        intermediate: h,
        ..
    } = shape;
    let gate_up = if fused {
        GateUp::Fused(weights(e, 2 * h, d, dtype, seed)?)
    } else {
        GateUp::Separate {
            gate: weights(e, h, d, dtype, seed)?,
            up: weights(e, h, d, dtype, seed ^ 1)?,
        }
    };
    SwitchMlp::new(gate_up, weights(e, d, h, dtype, seed ^ 2)?, sort_cutoff)
}

/// Activations `x [tokens, D]` in `[-1, 1)` and a routing from random router logits
/// (softmax, top-k, renormalised).
pub fn inputs(shape: MoeShape, tokens: usize, seed: u64) -> Result<(Vec<f32>, Routing)> {
    let x = uniform(tokens * shape.hidden, 1.0, seed ^ 0x5851_F42D);
    let logits = uniform(tokens * shape.experts, 2.0, seed ^ 0x4C95_7F2D);
    let routing = route(&logits, shape.experts, shape.top_k, true)?;
    Ok((x, routing))
}
