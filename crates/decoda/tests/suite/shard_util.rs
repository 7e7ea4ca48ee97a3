//! Helpers the sharded-sampling tests share (`tests/suite/shard.rs`, `tests/suite/wgpu_shard.rs`):
//! cutting a vocabulary into shards, a row's request from a few knobs, and the contract's
//! "same result" between a sharded and an unsharded call.
#![allow(dead_code)]

use std::collections::BTreeMap;

use decoda::{LogprobsMode, Request, RowResult, SamplingParams, SequenceState};

/// Cuts `0 .. v` into pieces at `cuts` (sorted, deduplicated, inside).
pub fn spans(v: usize, cuts: &[usize]) -> Vec<(usize, usize)> {
    let mut c: Vec<usize> = cuts.iter().map(|&x| x % v).filter(|&x| x > 0).collect();
    c.sort_unstable();
    c.dedup();
    let mut out = Vec::new();
    let mut at = 0;
    for x in c.into_iter().chain([v]) {
        out.push((at, x - at));
        at = x;
    }
    out
}

/// Each shard's `[rows, width]` copy of its columns.
pub fn split(x: &[f32], rows: usize, v: usize, spans: &[(usize, usize)]) -> Vec<Vec<f32>> {
    spans
        .iter()
        .map(|&(o, w)| {
            (0..rows)
                .flat_map(|r| x[r * v + o..r * v + o + w].iter().copied())
                .collect()
        })
        .collect()
}

/// Same token (or the same row error); log-probabilities within `1e-5` relative,
/// the same rank and listed ids.
pub fn close(a: &RowResult, b: &RowResult) -> Result<(), String> {
    match (a, b) {
        (Ok(a), Ok(b)) => {
            if a.token != b.token {
                return Err(format!("token {} vs {}", a.token, b.token));
            }
            match (&a.logprobs, &b.logprobs) {
                (None, None) => Ok(()),
                (Some(x), Some(y)) => {
                    let near = |p: f32, q: f32| p == q || (p - q).abs() <= 1e-5 * p.abs().max(1.0);
                    let ids = |l: &decoda::TokenLogprobs| {
                        l.top.iter().map(|t| t.token).collect::<Vec<_>>()
                    };
                    if x.rank != y.rank
                        || !near(x.logprob, y.logprob)
                        || ids(x) != ids(y)
                        || x.top
                            .iter()
                            .zip(&y.top)
                            .any(|(p, q)| !near(p.logprob, q.logprob))
                    {
                        return Err(format!("logprobs {x:?} vs {y:?}"));
                    }
                    Ok(())
                }
                _ => Err("logprobs on one side only".into()),
            }
        }
        (Err(a), Err(b)) if a == b => Ok(()),
        _ => Err(format!("{a:?} vs {b:?}")),
    }
}

#[allow(clippy::too_many_arguments)]
pub fn request(
    seed: u64,
    step: u64,
    t: f32,
    k: u32,
    min_p: f32,
    pen: (f32, f32, f32),
    dry: f32,
    lp: Option<u32>,
    raw: bool,
    history: Vec<u32>,
    bias: Vec<(u32, f32)>,
    mask: Option<Vec<u32>>,
) -> Request {
    Request {
        params: SamplingParams {
            temperature: t,
            top_k: k,
            min_p,
            repetition_penalty: pen.0,
            frequency_penalty: pen.1,
            presence_penalty: pen.2,
            dry_multiplier: dry,
            dry_allowed_length: 1,
            logprobs: lp,
            logprobs_mode: if raw {
                LogprobsMode::Raw
            } else {
                LogprobsMode::Processed
            },
            logit_bias: bias.into_iter().collect::<BTreeMap<_, _>>(),
            ..Default::default()
        },
        state: SequenceState {
            seed,
            step,
            prompt: history[..history.len() / 2].to_vec(),
            output: history[history.len() / 2..].to_vec(),
        },
        allowed: mask,
    }
}
