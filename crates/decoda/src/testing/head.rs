//! The sampling head against sequences driven by hand: every backend's [`Head`] must give
//! each slot the tokens that [`CpuSampler`] draws for it step by step, with the history
//! extended by [`crate::SequenceState::push`] — through joins and leaves at random steps,
//! stop tokens, `max_tokens`, and penalties over histories of thousands of tokens.

use crate::backend::Backend;
use crate::cpu::CpuSampler;
use crate::head::{FinishReason, Head, SlotRequest};
use crate::logits::Logits;
use crate::params::{Request, SequenceState};
use crate::reference::reference_row;

use super::shapes::mixed_request;
use super::{classify, Rng, Verdict};

/// Counts of a run of [`head_matches_sequences`].
#[derive(Debug, Default, Clone, Copy)]
pub struct HeadTally {
    /// Steps run.
    pub steps: usize,
    /// Rows sampled (slot-steps).
    pub rows: usize,
    /// Joins and leaves.
    pub joins: usize,
    /// Leaves.
    pub leaves: usize,
    /// Slots that finished on a stop id.
    pub stops: usize,
    /// Slots that finished at `max_tokens`.
    pub lengths: usize,
    /// Rows that differed on a floating-point tie the contract allows (the test then
    /// follows the head's token).
    pub allowed_ties: usize,
}

struct Model {
    req: Request,
    max_tokens: Option<u64>,
    stop: Vec<u32>,
    generated: u64,
    finished: Option<FinishReason>,
}

/// Runs `steps` steps of random traffic through `head` and checks every row against
/// [`CpuSampler`] driven with [`crate::SequenceState::push`]. `history` is the length of
/// the longest penalised histories slots join with.
pub fn head_matches_sequences(
    head: &mut dyn Head,
    steps: usize,
    history: usize,
    seed: u64,
) -> Result<HeadTally, String> {
    let mut rng = Rng::new(seed);
    let slots = head.slots();
    let v = head.vocab();
    let cpu = CpuSampler::with_threads(1).map_err(|e| e.to_string())?;
    let mut models: Vec<Option<Model>> = (0..slots).map(|_| None).collect();
    let mut tally = HeadTally::default();
    // a few "hot" ids get boosted logits, so that stop ids get drawn
    let hot: Vec<u32> = (0..4).map(|_| rng.below(v as u64) as u32).collect();
    for step in 0..steps {
        #[allow(clippy::needless_range_loop)] // `s` is also the head's slot index
        for s in 0..slots {
            if models[s].is_some() && rng.below(60) == 0 {
                head.leave(s)
                    .map_err(|e| format!("step {step}: leave {s}: {e}"))?;
                models[s] = None;
                tally.leaves += 1;
            }
            if models[s].is_none() && rng.below(4) == 0 {
                let mix = rng.below(64) as usize;
                let mut r = mixed_request(&mut rng, v, mix);
                r.params.logprobs = if rng.below(5) == 0 { Some(3) } else { None };
                let long = rng.below(6) == 0;
                let n = if long {
                    history
                } else {
                    rng.below(30) as usize
                };
                r.state.prompt = (0..n).map(|_| rng.below(v as u64) as u32).collect();
                r.state.output = (0..n / 2).map(|_| rng.below(v as u64) as u32).collect();
                if long {
                    r.params.repetition_penalty = 1.15;
                    r.params.frequency_penalty = 0.4;
                    r.params.presence_penalty = 0.3;
                }
                let max_tokens = (rng.below(3) != 0).then(|| 1 + rng.below(80));
                let stop: Vec<u32> = (0..rng.below(3)).map(|k| hot[k as usize]).collect();
                let request = SlotRequest {
                    params: r.params.clone(),
                    seed: Some(r.state.seed),
                    step: r.state.step,
                    prompt: r.state.prompt.clone(),
                    output: r.state.output.clone(),
                    max_tokens,
                    stop: stop.clone(),
                    allowed: None,
                };
                let got = head
                    .join(s, request)
                    .map_err(|e| format!("step {step}: join {s}: {e}"))?;
                if got != r.state.seed {
                    return Err(format!(
                        "join {s} returned seed {got}, not {}",
                        r.state.seed
                    ));
                }
                models[s] = Some(Model {
                    req: r,
                    max_tokens,
                    stop,
                    generated: 0,
                    finished: None,
                });
                tally.joins += 1;
            }
        }
        // the rows: joined slots, some left out of this step, in a random order
        let mut rows: Vec<usize> = (0..slots)
            .filter(|&s| models[s].is_some() && rng.below(8) != 0)
            .collect();
        for i in (1..rows.len()).rev() {
            rows.swap(i, rng.below(i as u64 + 1) as usize);
        }
        if rows.is_empty() {
            continue;
        }
        let mut data = Vec::with_capacity(rows.len() * v);
        for _ in &rows {
            let start = data.len();
            data.extend((0..v).map(|_| 3.0 * rng.normal()));
            for (k, &h) in hot.iter().enumerate() {
                data[start + h as usize] += 4.0 + k as f32;
            }
        }
        let logits = Logits::f32(&data, rows.len(), v).map_err(|e| e.to_string())?;
        let got = head
            .step(&logits, &rows)
            .map_err(|e| format!("step {step}: {e}"))?;
        if got.len() != rows.len() {
            return Err(format!(
                "step {step}: {} results for {} rows",
                got.len(),
                rows.len()
            ));
        }
        tally.steps += 1;
        for (r, (&s, out)) in rows.iter().zip(&got).enumerate() {
            tally.rows += 1;
            let m = models[s].as_mut().expect("joined");
            if out.slot != s {
                return Err(format!(
                    "step {step} row {r}: slot {} for slot {s}",
                    out.slot
                ));
            }
            if m.finished.is_some() {
                if out.result != Err(crate::RowError::Finished) || out.finished != m.finished {
                    return Err(format!(
                        "step {step} slot {s}: finished ({:?}) but got {out:?}",
                        m.finished
                    ));
                }
                continue;
            }
            let x = &data[r * v..(r + 1) * v];
            let want = cpu
                .sample(
                    &Logits::f32(x, 1, v).map_err(|e| e.to_string())?,
                    std::slice::from_ref(&m.req),
                )
                .map_err(|e| e.to_string())?
                .remove(0);
            let token = match classify(&out.result, &want, &reference_row(x, &m.req).1) {
                Verdict::Same { .. } => out.result.as_ref().ok().map(|t| t.token),
                Verdict::AllowedTie => {
                    tally.allowed_ties += 1;
                    out.result.as_ref().ok().map(|t| t.token)
                }
                Verdict::Mismatch => {
                    return Err(format!(
                        "step {step} slot {s} (its step {}, {} history tokens, params {:?}): \
                         head {:?}, CpuSampler {want:?}",
                        m.req.state.step,
                        m.req.state.prompt.len() + m.req.state.output.len(),
                        m.req.params,
                        out.result
                    ))
                }
            };
            if let Some(t) = token {
                SequenceState::push(&mut m.req.state, t);
                m.generated += 1;
                if m.stop.contains(&t) {
                    m.finished = Some(FinishReason::Stop);
                    tally.stops += 1;
                } else if m.max_tokens.is_some_and(|n| m.generated >= n) {
                    m.finished = Some(FinishReason::Length);
                    tally.lengths += 1;
                }
            }
            if out.finished != m.finished {
                return Err(format!(
                    "step {step} slot {s}: finished {:?}, expected {:?}",
                    out.finished, m.finished
                ));
            }
        }
    }
    Ok(tally)
}

/// The head check of the conformance suite: 64 slots over V = 3,000 for `steps` steps
/// (300 in `decoda selftest`, 60 with `--quick`; 60 already hold over 100 joins, 50
/// leaves, 25 stops and 25 lengths), with histories of 4,000 penalised tokens.
pub fn head_sequences(head: &mut dyn Head, steps: usize) -> Result<(), String> {
    let t = head_matches_sequences(head, steps, 4000, 99)?;
    if t.stops == 0 || t.lengths == 0 || t.leaves == 0 {
        return Err(format!("the traffic missed a case: {t:?}"));
    }
    Ok(())
}
