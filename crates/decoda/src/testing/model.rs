//! The model suite: checks of a whole decode step, written once and run against every
//! backend's [`Engine`] (the CPU's and the device's in `cargo test`).
//!
//! The golden cases come from mlx-lm (`scripts/mlx_qwen3_golden.py`); the caller parses
//! them (the test files read `tests/golden/qwen3_moe.json`), so the library carries no
//! data.

use std::path::Path;
use std::sync::Arc;

use crate::head::SlotRequest;
use crate::model::generate::{generate, Engine, Sequence};
use crate::model::qwen3_moe::Qwen3Moe;
use crate::params::SamplingParams;
use crate::testing::tiny::TinySpec;

/// Builds an engine for a model with `slots` slots of `positions` positions.
pub type MakeEngine<'a> =
    &'a dyn Fn(Arc<Qwen3Moe>, usize, usize) -> Result<Box<dyn Engine>, String>;

/// A golden case: a checkpoint, a prompt, mlx-lm's greedy ids, and its logits at some
/// steps (step 0: the prefill's last position).
#[derive(Debug, Clone)]
pub struct Golden {
    /// The case's name.
    pub name: String,
    /// Where the checkpoint is.
    pub dir: std::path::PathBuf,
    /// The prompt.
    pub prompt: Vec<u32>,
    /// The greedy ids.
    pub ids: Vec<u32>,
    /// Steps whose logits are given.
    pub logit_steps: Vec<usize>,
    /// The logits of those steps.
    pub logits: Vec<Vec<f32>>,
}

fn greedy() -> SamplingParams {
    SamplingParams {
        temperature: 0.0,
        ..Default::default()
    }
}

/// The largest `|a - b|` over the row, relative to the row's scale (its largest `|b|`).
pub fn relative_gap(a: &[f32], b: &[f32]) -> f64 {
    let scale = b
        .iter()
        .fold(0f64, |m, x| m.max(f64::from(x.abs())))
        .max(1e-30);
    a.iter()
        .zip(b)
        .fold(0f64, |m, (x, y)| m.max(f64::from((x - y).abs())))
        / scale
}

/// Runs `g` greedily on `make`'s engine step by step: the ids must equal mlx-lm's, and the
/// logits of the given steps must be within `tol` of its (relative to the row's scale).
/// Returns the largest relative gap seen.
pub fn matches_golden(
    make: MakeEngine<'_>,
    g: &Golden,
    sort_cutoff: usize,
    tol: f64,
    max_steps: usize,
) -> Result<f64, String> {
    let model =
        Arc::new(Qwen3Moe::load(&g.dir, sort_cutoff).map_err(|e| format!("{}: {e}", g.name))?);
    let steps = g.ids.len().min(max_steps);
    let mut e = make(model, 1, g.prompt.len() + steps)?;
    let err = |x: crate::Error| format!("{}: {x}", g.name);
    e.start(
        0,
        SlotRequest::new(greedy()).seed(0).max_tokens(steps as u64),
        &g.prompt,
        0,
    )
    .map_err(err)?;
    let mut worst = 0f64;
    let mut ids = Vec::new();
    for step in 0..steps {
        if let Some(k) = g.logit_steps.iter().position(|&s| s == step) {
            let got = e.read_logits(1).map_err(err)?;
            let gap = relative_gap(&got, &g.logits[k]);
            worst = worst.max(gap);
            if gap > tol {
                return Err(format!(
                    "{} ({}): logits of step {step} differ from mlx-lm's by {gap:.2e} of the row's scale (tolerance {tol:.0e})",
                    g.name,
                    e.name()
                ));
            }
        }
        let forward: &[usize] = if step + 1 < steps { &[0] } else { &[] };
        e.step(&[0], forward).map_err(err)?;
        for row in e.wait().map_err(err)?.into_iter().flatten() {
            ids.push(
                row.result
                    .map_err(|x| format!("{}: step {step}: {x}", g.name))?
                    .token,
            );
        }
    }
    e.leave(0).map_err(err)?;
    if ids != g.ids[..steps] {
        let at = ids
            .iter()
            .zip(&g.ids)
            .position(|(a, b)| a != b)
            .unwrap_or(ids.len());
        return Err(format!(
            "{} ({}): greedy ids differ from mlx-lm's from step {at}: {:?} vs {:?}",
            g.name,
            e.name(),
            &ids[at..(at + 8).min(ids.len())],
            &g.ids[at..(at + 8).min(g.ids.len())]
        ));
    }
    Ok(worst)
}

/// Writes the suite's own checkpoint (the tiny default at `seed`) under `dir`.
pub fn tiny_model(dir: &Path, seed: u64) -> Result<std::path::PathBuf, String> {
    let d = dir.join(format!("tiny-{seed}"));
    TinySpec {
        seed,
        ..TinySpec::default()
    }
    .write(&d)
    .map_err(|e| e.to_string())?;
    Ok(d)
}

fn sampled(seed: u64, max: u64) -> SlotRequest {
    let params = SamplingParams {
        temperature: 0.9,
        top_p: 0.95,
        repetition_penalty: 1.1,
        ..Default::default()
    };
    SlotRequest::new(params).seed(seed).max_tokens(max)
}

fn run(
    make: MakeEngine<'_>,
    model: &Arc<Qwen3Moe>,
    seqs: &[Sequence],
) -> Result<Vec<Vec<u32>>, String> {
    let positions = seqs.iter().map(|s| s.prompt.len() + 40).max().unwrap_or(1);
    let mut e = make(Arc::clone(model), seqs.len(), positions)?;
    let r = generate(e.as_mut(), seqs, &mut |_| {}).map_err(|x| x.to_string())?;
    Ok(r.outputs.into_iter().map(|o| o.tokens).collect())
}

/// A seeded, sampled sequence draws the same ids alone and in batches of other
/// sequences (in any slot), with the MoE layers sorting every call of more than one
/// token, and (full tier) none.
pub fn batch_invariant(make: MakeEngine<'_>, dir: &Path) -> Result<(), String> {
    let a = Sequence {
        prompt: vec![256, 72, 101, 108, 108, 111],
        request: sampled(11, 24),
    };
    let b = Sequence {
        prompt: vec![
            1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18,
        ],
        request: sampled(12, 30),
    };
    let c = Sequence {
        prompt: vec![300],
        request: sampled(13, 8),
    };
    // every MoE call of more than one token sorted, and (full tier) none sorted: the
    // same ids whether or not the batch changes the branch
    let both = [1, usize::MAX];
    let cutoffs = if super::full_tier() {
        &both[..]
    } else {
        &both[..1]
    };
    for &cutoff in cutoffs {
        let model = Arc::new(Qwen3Moe::load(dir, cutoff).map_err(|e| e.to_string())?);
        let alone = run(make, &model, std::slice::from_ref(&a))?;
        if alone[0].len() != 24 {
            return Err(format!("alone: {} tokens of 24", alone[0].len()));
        }
        // `a` first of three and last of two (the full tier: last of three too)
        let mut batches = vec![
            vec![a.clone(), b.clone(), c.clone()],
            vec![b.clone(), a.clone()],
        ];
        if super::full_tier() {
            batches.push(vec![c.clone(), b.clone(), a.clone()]);
        }
        for batch in batches {
            let out = run(make, &model, &batch)?;
            let i = batch
                .iter()
                .position(|s| s.request.seed == Some(11))
                .expect("a is in");
            if out[i] != alone[0] {
                return Err(format!(
                    "sort cutoff {cutoff}: in a batch of {} at slot {i}, the sequence drew {:?}; alone {:?}",
                    batch.len(),
                    out[i],
                    alone[0]
                ));
            }
        }
    }
    Ok(())
}

/// The same greedy ids whether every MoE call sorts (`sort_cutoff` 1) or none does.
pub fn sort_cutoff_does_not_change_ids(make: MakeEngine<'_>, dir: &Path) -> Result<(), String> {
    let prompt: Vec<u32> = (40..80).collect();
    let mut seen = Vec::new();
    for cutoff in [1, 4, usize::MAX] {
        let model = Arc::new(Qwen3Moe::load(dir, cutoff).map_err(|e| e.to_string())?);
        let seq = Sequence {
            prompt: prompt.clone(),
            request: SlotRequest::new(greedy()).seed(0).max_tokens(32),
        };
        seen.push(run(make, &model, &[seq])?.remove(0));
    }
    if seen.iter().any(|s| s != &seen[0]) {
        return Err(format!("ids per cutoff 1, 4, none: {seen:?}"));
    }
    Ok(())
}

/// Stop ids end a sequence after they are drawn (and the slot leaves); max_tokens ends
/// the others; the batch's other sequences carry on.
pub fn stops_and_lengths(make: MakeEngine<'_>, dir: &Path) -> Result<(), String> {
    let model = Arc::new(Qwen3Moe::load(dir, 16).map_err(|e| e.to_string())?);
    let probe = Sequence {
        prompt: vec![256, 1, 2, 3],
        request: SlotRequest::new(greedy()).seed(0).max_tokens(12),
    };
    let ids = run(make, &model, std::slice::from_ref(&probe))?.remove(0);
    let stop_at = 5;
    let stop = ids[stop_at];
    let first = ids.iter().position(|&t| t == stop).expect("present");
    let stopping = Sequence {
        request: SlotRequest::new(greedy())
            .seed(0)
            .max_tokens(12)
            .stop(vec![stop]),
        ..probe.clone()
    };
    let other = Sequence {
        prompt: vec![9, 8, 7],
        request: sampled(3, 20),
    };
    let positions = 40;
    let mut e = make(Arc::clone(&model), 2, positions)?;
    let r = generate(e.as_mut(), &[stopping, other], &mut |_| {}).map_err(|x| x.to_string())?;
    let o = &r.outputs;
    if o[0].tokens != ids[..=first] {
        return Err(format!(
            "stop {stop}: drew {:?}, want {:?}",
            o[0].tokens,
            &ids[..=first]
        ));
    }
    if o[0].finish != Some(crate::head::FinishReason::Stop)
        || o[1].finish != Some(crate::head::FinishReason::Length)
    {
        return Err(format!(
            "finish reasons {:?} {:?}",
            o[0].finish, o[1].finish
        ));
    }
    if o[1].tokens.len() != 20 {
        return Err(format!(
            "the other sequence drew {} of 20",
            o[1].tokens.len()
        ));
    }
    Ok(())
}
