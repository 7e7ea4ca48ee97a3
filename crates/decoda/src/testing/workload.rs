//! Synthetic workloads shared by the benchmarks (criterion and `decoda bench`): Zipf-like
//! logits (two laws) and the named parameter configurations.

use crate::params::{LogprobsMode, Request, SamplingParams};
use crate::testing::{zipf_logits, Rng};

/// The benchmark configurations, in table order.
pub const CONFIGS: &[&str] = &[
    "greedy",
    "temp",
    "topk50",
    "topp09",
    "topk50_topp09",
    "minp005",
    "minp01",
    "full",
    "topp095",
    "topp098",
    "topp099",
    "mask_dense",
    "mask_sparse",
    "dry",
    "topnsigma1",
    "typical095",
    "xtc",
    "minp005_xtc",
    "kept64",
    "minp005_kept64",
];

/// Parameters of a named configuration (all sampled ones at temperature 0.8), or `None`.
///
/// `minp01` = min-p 0.1 alone (the GPU peers' setting in `scripts/gpu-peers/bench_peers.py`).
/// `full` = repetition 1.1, frequency 0.3, presence 0.2, top-k 50, top-p 0.9, min-p 0.05
/// and top-5 processed logprobs; its rows carry 256 history tokens (see [`requests`]).
/// `topp095`, `topp098` and `topp099` = top-p 0.95, 0.98 and 0.99: on the benchmark rows
/// of V = 131,072, nuclei of about 500, 3,700 and 12,600 tokens (the first candidate
/// list, a list gathered again from a sampled threshold, and the whole row).
/// `mask_dense` and `mask_sparse` = temperature with a token mask ([`named_requests`]:
/// half the tokens at random, or 1,000 of them, a grammar state's few choices);
/// `dry` = DRY 0.8 / 1.75 / 2 over 256 history tokens with repeats; `topnsigma1` =
/// top-n-σ 1; `typical095` = typical-p 0.95; `xtc` = XTC at probability 0.5, threshold
/// 0.1; `minp005_xtc` = min-p 0.05 then that XTC (llama.cpp's usual XTC chain);
/// `kept64` = temperature with the kept distribution's 64 most likely tokens (no filter:
/// the whole row is the set), `minp005_kept64` = the same after min-p 0.05.
pub fn config(name: &str) -> Option<SamplingParams> {
    let t = SamplingParams {
        temperature: 0.8,
        ..Default::default()
    };
    Some(match name {
        "greedy" => SamplingParams::greedy(),
        "temp" => t,
        "topk50" => SamplingParams { top_k: 50, ..t },
        "topp09" => SamplingParams { top_p: 0.9, ..t },
        "topk50_topp09" => SamplingParams {
            top_k: 50,
            top_p: 0.9,
            ..t
        },
        "minp005" => SamplingParams { min_p: 0.05, ..t },
        "minp01" => SamplingParams { min_p: 0.1, ..t },
        "topp095" => SamplingParams { top_p: 0.95, ..t },
        "topp098" => SamplingParams { top_p: 0.98, ..t },
        "topp099" => SamplingParams { top_p: 0.99, ..t },
        "mask_dense" | "mask_sparse" => t,
        "dry" => SamplingParams {
            dry_multiplier: 0.8,
            ..t
        },
        "topnsigma1" => SamplingParams {
            top_n_sigma: 1.0,
            ..t
        },
        "typical095" => SamplingParams {
            typical_p: 0.95,
            ..t
        },
        "xtc" => SamplingParams {
            xtc_probability: 0.5,
            xtc_threshold: 0.1,
            ..t
        },
        "minp005_xtc" => SamplingParams {
            min_p: 0.05,
            xtc_probability: 0.5,
            xtc_threshold: 0.1,
            ..t
        },
        "kept64" => SamplingParams {
            kept: Some(64),
            ..t
        },
        "minp005_kept64" => SamplingParams {
            min_p: 0.05,
            kept: Some(64),
            ..t
        },
        "full" => SamplingParams {
            repetition_penalty: 1.1,
            frequency_penalty: 0.3,
            presence_penalty: 0.2,
            top_k: 50,
            top_p: 0.9,
            min_p: 0.05,
            logprobs: Some(5),
            logprobs_mode: LogprobsMode::Processed,
            ..t
        },
        _ => return None,
    })
}

/// `rows` rows of Zipf-like logits (exponent 1.1 over a random permutation, plus noise).
pub fn logits(rows: usize, vocab: usize, seed: u64) -> Vec<f32> {
    let mut rng = Rng::new(seed);
    let mut out = Vec::with_capacity(rows * vocab);
    for _ in 0..rows {
        out.extend(zipf_logits(&mut rng, vocab, 1.1));
    }
    out
}

/// `rows` rows of the GPU peers' law (`scripts/gpu-peers/bench_peers.py`): token `t` of a row has
/// rank `r = (a t + b) mod vocab` (`a`, `b` drawn per row, `gcd(a, vocab) = 1`) and logit
/// `-1.1 ln(r + 1) + 0.5 N(0, 1)`. The same law as the peers' rows, not the same values.
pub fn affine_logits(rows: usize, vocab: usize, seed: u64) -> Vec<f32> {
    fn gcd(mut a: u64, mut b: u64) -> u64 {
        while b != 0 {
            (a, b) = (b, a % b);
        }
        a
    }
    let mut rng = Rng::new(seed);
    let v = vocab as u64;
    let mut out = Vec::with_capacity(rows * vocab);
    for _ in 0..rows {
        let a = loop {
            let a = 1 + rng.below(v.saturating_sub(1).max(1));
            if gcd(a, v) == 1 {
                break a;
            }
        };
        let b = rng.below(v);
        for t in 0..v {
            let r = (a * t + b) % v;
            out.push(-1.1 * ((r + 1) as f32).ln() + 0.5 * rng.normal());
        }
    }
    out
}

/// The requests of a named configuration ([`config`]) for `rows` rows: [`requests`], with
/// the `mask_*` configurations' masks and `dry`'s repeating history. `None` for an
/// unknown name.
pub fn named_requests(name: &str, rows: usize, vocab: usize) -> Option<Vec<Request>> {
    let params = config(name)?;
    let mut reqs = requests(&params, rows, vocab);
    let mut rng = Rng::new(1234);
    let w = vocab.div_ceil(32);
    for req in &mut reqs {
        match name {
            "mask_dense" => req.allowed = Some((0..w).map(|_| rng.next_u64() as u32).collect()),
            "mask_sparse" => {
                let mut m = vec![0u32; w];
                for _ in 0..1000.min(vocab) {
                    let t = rng.below(vocab as u64) as usize;
                    m[t / 32] |= 1 << (t % 32);
                }
                req.allowed = Some(m);
            }
            "dry" => {
                // 256 tokens over 40 ids: repeats that DRY penalises
                let ids = 40.min(vocab as u64);
                req.state.prompt = (0..128).map(|_| rng.below(ids) as u32).collect();
                let copy = req.state.prompt[64..].to_vec();
                req.state.output = copy
                    .into_iter()
                    .chain((0..64).map(|_| rng.below(ids) as u32))
                    .collect();
            }
            _ => {}
        }
    }
    Some(reqs)
}

/// One request per row for configuration `params`; `full`-style penalties get 256 history
/// tokens (128 prompt, 128 output).
pub fn requests(params: &SamplingParams, rows: usize, vocab: usize) -> Vec<Request> {
    let mut rng = Rng::new(99);
    let penalised = params.repetition_penalty != 1.0
        || params.frequency_penalty != 0.0
        || params.presence_penalty != 0.0;
    (0..rows)
        .map(|r| {
            let mut req = Request::new(params.clone(), 1_000 + r as u64);
            req.state.step = 17;
            if penalised {
                req.state.prompt = (0..128).map(|_| rng.below(vocab as u64) as u32).collect();
                req.state.output = (0..128).map(|_| rng.below(vocab as u64) as u32).collect();
            }
            req
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Each row of the peers' law holds every rank once: with the noise taken out (its
    /// scale is known), the rows' values are `-1.1 ln(r + 1)` for a permutation of the
    /// ranks, so the largest is near 0 and the mean is the law's mean; rows differ.
    #[test]
    fn affine_rows_follow_the_law() {
        let v = 4099;
        let x = affine_logits(3, v, 5);
        assert_eq!(x.len(), 3 * v);
        let want_mean = (0..v).map(|r| -1.1 * ((r + 1) as f64).ln()).sum::<f64>() / v as f64;
        for row in x.chunks(v) {
            assert!(row.iter().all(|t| t.is_finite()));
            let mean = row.iter().map(|&t| f64::from(t)).sum::<f64>() / v as f64;
            // the noise's mean over 4,099 tokens is within 0.05 (6 sigma)
            assert!((mean - want_mean).abs() < 0.05, "{mean} vs {want_mean}");
            let max = row.iter().copied().fold(f32::MIN, f32::max);
            assert!(max > -1.0 && max < 3.0, "{max}");
        }
        assert_ne!(x[..v], x[v..2 * v]);
        assert_eq!(affine_logits(3, v, 5), x, "seeded");
        assert_eq!(affine_logits(1, 1, 5).len(), 1);
    }
}
