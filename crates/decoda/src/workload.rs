//! Synthetic workloads shared by the benchmarks (criterion and `decoda bench`): Zipf-like
//! logits and the named parameter configurations.

use crate::conformance::{zipf_logits, Rng};
use crate::params::{LogprobsMode, Request, SamplingParams};

/// The benchmark configurations, in table order.
pub const CONFIGS: &[&str] = &[
    "greedy",
    "temp",
    "topk50",
    "topp09",
    "topk50_topp09",
    "minp005",
    "full",
    "topp095",
    "topp098",
    "topp099",
];

/// Parameters of a named configuration (all sampled ones at temperature 0.8), or `None`.
///
/// `full` = repetition 1.1, frequency 0.3, presence 0.2, top-k 50, top-p 0.9, min-p 0.05
/// and top-5 processed logprobs; its rows carry 256 history tokens (see [`requests`]).
/// `topp095`, `topp098` and `topp099` = top-p 0.95, 0.98 and 0.99: on the benchmark rows
/// of V = 131,072, nuclei of about 500, 3,700 and 12,600 tokens (the first candidate
/// list, a list gathered again from a sampled threshold, and the whole row).
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
        "topp095" => SamplingParams { top_p: 0.95, ..t },
        "topp098" => SamplingParams { top_p: 0.98, ..t },
        "topp099" => SamplingParams { top_p: 0.99, ..t },
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
