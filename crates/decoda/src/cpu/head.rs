//! The CPU's sampling head: each step samples the live slots' rows with the CPU sampler
//! and pushes the drawn tokens into the slots' histories. The head's semantics (slots,
//! requests, finishing) are `crate::head`'s.

use super::sampler::CpuSampler;
use crate::error::{Error, Result, RowError};
use crate::head::{
    check_slot, join_door, set_params_door, step_door, FinishReason, Head, SlotRequest, SlotStep,
};
use crate::logits::Logits;
use crate::params::{Request, SamplingParams, SequenceState};
use crate::pipeline::{Row, RowResult};
use crate::Backend;

/// One sequence of a [`CpuHead`].
#[derive(Debug, Clone)]
struct Sequence {
    request: Request,
    max_tokens: Option<u64>,
    stop: Vec<u32>,
    generated: u64,
    finished: Option<FinishReason>,
}

/// The CPU's sampling head: each step samples with [`CpuSampler`] and pushes the drawn
/// tokens into the slots' histories.
#[derive(Debug)]
pub struct CpuHead {
    sampler: CpuSampler,
    vocab: usize,
    seqs: Vec<Option<Sequence>>,
}

impl CpuHead {
    /// A head of `slots` slots for a vocabulary of `vocab` tokens.
    pub fn new(slots: usize, vocab: usize) -> Result<Self> {
        Self::with_sampler(CpuSampler::new(), slots, vocab)
    }

    /// The same with a given CPU sampler (for its thread pool).
    pub fn with_sampler(sampler: CpuSampler, slots: usize, vocab: usize) -> Result<Self> {
        if vocab == 0 {
            return Err(Error::Shape(
                "a head needs a vocabulary of at least one token".into(),
            ));
        }
        Ok(Self {
            sampler,
            vocab,
            seqs: vec![None; slots],
        })
    }

    /// The request slot `slot` would be sampled with now (parameters and full state).
    pub fn request(&self, slot: usize) -> Option<&Request> {
        self.seqs.get(slot)?.as_ref().map(|s| &s.request)
    }
}

impl Head for CpuHead {
    fn name(&self) -> String {
        "cpu".into()
    }

    fn slots(&self) -> usize {
        self.seqs.len()
    }

    fn vocab(&self) -> usize {
        self.vocab
    }

    fn join(&mut self, slot: usize, request: SlotRequest) -> Result<u64> {
        let joined: Vec<bool> = self.seqs.iter().map(Option::is_some).collect();
        let seed = join_door(slot, &joined, &request, self.vocab)?;
        self.seqs[slot] = Some(Sequence {
            request: Request {
                params: request.params,
                state: SequenceState {
                    seed,
                    step: request.step,
                    prompt: request.prompt,
                    output: request.output,
                },
                allowed: request.allowed,
            },
            max_tokens: request.max_tokens,
            stop: request.stop,
            generated: 0,
            finished: None,
        });
        Ok(seed)
    }

    fn leave(&mut self, slot: usize) -> Result<()> {
        check_slot(slot, self.seqs.len())?;
        self.seqs[slot] = None;
        Ok(())
    }

    fn set_params(&mut self, slot: usize, params: SamplingParams) -> Result<()> {
        let stops = self
            .seqs
            .get(slot)
            .and_then(Option::as_ref)
            .map(|s| s.stop.len());
        set_params_door(slot, self.seqs.len(), stops, &params, self.vocab)?;
        let seq = self.seqs[slot].as_mut().expect("checked by the door");
        seq.request.params = params;
        Ok(())
    }

    fn step(&mut self, logits: &Logits<'_>, rows: &[usize]) -> Result<Vec<SlotStep>> {
        self.step_masked(logits, rows, &[])
    }

    /// The step's masks and the slots' own ([`SlotRequest::allowed`]) both apply: a
    /// token must be allowed by each. Without step masks (`masks` empty or all `None`)
    /// there is no copy of the batch: the sampler masks each slot's row with its own.
    fn step_masked(
        &mut self,
        logits: &Logits<'_>,
        rows: &[usize],
        masks: &[Option<&[u32]>],
    ) -> Result<Vec<SlotStep>> {
        let own = |s: usize| {
            self.seqs
                .get(s)
                .and_then(Option::as_ref)
                .and_then(|q| q.request.allowed.as_deref())
        };
        let joined: Vec<bool> = self.seqs.iter().map(Option::is_some).collect();
        step_door(
            rows,
            &joined,
            logits.rows(),
            logits.vocab(),
            self.vocab,
            masks,
        )?;
        if masks.iter().all(Option::is_none) {
            // the slots' own masks ride on their requests: the CPU sampler applies each
            // to its row's copy on the row's thread (no copy of the batch)
            return self.step_checked(logits, rows);
        }
        let both: Vec<Option<Vec<u32>>> = rows
            .iter()
            .enumerate()
            .map(|(r, &s)| match (own(s), masks.get(r).copied().flatten()) {
                (Some(a), Some(b)) => Some(a.iter().zip(b).map(|(x, y)| x & y).collect()),
                (Some(a), None) | (None, Some(a)) => Some(a.to_vec()),
                (None, None) => None,
            })
            .collect();
        let refs: Vec<Option<&[u32]>> = both.iter().map(|m| m.as_deref()).collect();
        match crate::logits::Gathered::masked_rows(logits, &refs) {
            Some(copy) => self.step_checked(&copy.view()?, rows),
            None => self.step_checked(logits, rows),
        }
    }
}

impl CpuHead {
    /// A step that passed the door, over logits whose step masks are already applied;
    /// the slots' own masks ride on their requests, and the sampler applies them.
    fn step_checked(&mut self, logits: &Logits<'_>, rows: &[usize]) -> Result<Vec<SlotStep>> {
        // finished slots draw nothing: sample the others as one batch
        let live: Vec<usize> = (0..rows.len())
            .filter(|&r| {
                self.seqs[rows[r]]
                    .as_ref()
                    .expect("checked")
                    .finished
                    .is_none()
            })
            .collect();
        let mut results: Vec<Option<RowResult>> = vec![None; rows.len()];
        if !live.is_empty() {
            // each live slot's request (validated when it joined) reads its row in place:
            // no copy of the logits, none of the histories
            let views: Vec<Row<'_>> = live
                .iter()
                .map(|&r| {
                    let seq = self.seqs[rows[r]].as_ref().expect("checked");
                    Row::of(&seq.request).reading(r)
                })
                .collect();
            let sampled = self.sampler.sample_rows(logits, &views)?;
            for (&r, res) in live.iter().zip(sampled) {
                results[r] = Some(res);
            }
        }
        let mut out = Vec::with_capacity(rows.len());
        for (&s, result) in rows.iter().zip(results) {
            let seq = self.seqs[s].as_mut().expect("checked");
            let Some(result) = result else {
                out.push(SlotStep {
                    slot: s,
                    result: Err(RowError::Finished),
                    finished: seq.finished,
                });
                continue;
            };
            if let Ok(sample) = &result {
                seq.request.state.push(sample.token);
                seq.generated += 1;
                if seq.stop.contains(&sample.token) {
                    seq.finished = Some(FinishReason::Stop);
                } else if seq.max_tokens.is_some_and(|m| seq.generated >= m) {
                    seq.finished = Some(FinishReason::Length);
                }
            }
            out.push(SlotStep {
                slot: s,
                result,
                finished: seq.finished,
            });
        }
        Ok(out)
    }
}
