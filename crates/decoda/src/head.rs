//! The sampling head: per-sequence decode state kept by the sampler, in slots.
//!
//! A head has a fixed number of slots. [`Head::join`] puts a sequence in a slot once
//! (parameters, seed, step, prompt and earlier output, logit bias, `max_tokens`, stop
//! ids); each [`Head::step`] then samples one row of logits for each listed slot and
//! advances that slot: its step, its history (the drawn token's presence and count) and
//! its stop conditions. A slot's token at its step `n` is exactly what
//! [`crate::CpuSampler`] draws for (row, parameters, seed, step `n`, history = prompt +
//! earlier output + the slot's own tokens) — the same token on every backend.
//!
//! `decoda::cpu::CpuHead` is the CPU's head; `decoda::wgpu::WgpuHead` keeps the state on the GPU, so
//! that a decode loop writes nothing from the host per token.
//!
//! ```
//! use decoda::head::{Head, SlotRequest};
//! use decoda::CpuHead;
//! use decoda::{Logits, SamplingParams};
//!
//! let mut head = CpuHead::new(2, 4)?; // two slots, V = 4
//! head.join(0, SlotRequest::new(SamplingParams::default()).seed(7).max_tokens(2))?;
//! head.join(1, SlotRequest::new(SamplingParams::greedy()).seed(1))?;
//! let logits = [0.1f32, 2.0, 0.3, 1.0, 3.0, 0.0, 0.0, 0.0];
//! let out = head.step(&Logits::f32(&logits, 2, 4)?, &[0, 1])?; // row 0 -> slot 0, row 1 -> slot 1
//! assert_eq!(out[1].result.as_ref().unwrap().token, 0);
//! # Ok::<(), decoda::Error>(())
//! ```

use crate::error::{Error, Result};
use crate::logits::Logits;
use crate::params::{SamplingParams, SequenceState};
use crate::pipeline::RowResult;

/// Most logit-bias entries a slot may hold.
pub const MAX_SLOT_BIAS: usize = 1024;
/// Most stop token ids a slot may hold.
pub const MAX_SLOT_STOP: usize = 64;

/// What a sequence joins a slot with.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct SlotRequest {
    /// Sampling parameters (changeable later with [`Head::set_params`]).
    pub params: SamplingParams,
    /// The RNG key; `None` draws one from the OS ([`Head::join`] returns it).
    pub seed: Option<u64>,
    /// The step of the first token the slot draws.
    pub step: u64,
    /// Prompt token ids (repetition penalty).
    pub prompt: Vec<u32>,
    /// Tokens generated before the slot joined (all penalties).
    pub output: Vec<u32>,
    /// The slot finishes after drawing this many tokens (`None`: no limit).
    pub max_tokens: Option<u64>,
    /// The slot finishes after drawing one of these ids (it is part of the output).
    pub stop: Vec<u32>,
    /// A token mask applied at every step of the slot (a fixed grammar mask; the layout of
    /// [`crate::Request::allowed`]); `None` allows every token. [`crate::CpuHead`] takes
    /// it; the device head does not yet.
    pub allowed: Option<Vec<u32>>,
}

impl SlotRequest {
    /// A request with `params`, a seed from the OS, step 0 and no history or limits.
    pub fn new(params: SamplingParams) -> Self {
        Self {
            params,
            ..Default::default()
        }
    }
    /// With this seed.
    pub fn seed(mut self, seed: u64) -> Self {
        self.seed = Some(seed);
        self
    }
    /// With this first step.
    pub fn step(mut self, step: u64) -> Self {
        self.step = step;
        self
    }
    /// With this prompt.
    pub fn prompt(mut self, prompt: Vec<u32>) -> Self {
        self.prompt = prompt;
        self
    }
    /// With this earlier output.
    pub fn output(mut self, output: Vec<u32>) -> Self {
        self.output = output;
        self
    }
    /// Finishing after `n` tokens.
    pub fn max_tokens(mut self, n: u64) -> Self {
        self.max_tokens = Some(n);
        self
    }
    /// Finishing at any of these ids.
    pub fn stop(mut self, ids: Vec<u32>) -> Self {
        self.stop = ids;
        self
    }
    /// With this token mask at every step.
    pub fn allowed(mut self, mask: Vec<u32>) -> Self {
        self.allowed = Some(mask);
        self
    }

    /// The request plain decoding samples this sequence's next token with once it has
    /// drawn `drawn` tokens in the slot: its parameters and mask, `seed`, step `step +
    /// drawn.len()`, history prompt + earlier output + `drawn` (what a head holds then).
    pub fn request_after(&self, seed: u64, drawn: &[u32]) -> crate::params::Request {
        let mut output = self.output.clone();
        output.extend_from_slice(drawn);
        crate::params::Request {
            params: self.params.clone(),
            state: SequenceState {
                seed,
                step: self.step.wrapping_add(drawn.len() as u64),
                prompt: self.prompt.clone(),
                output,
            },
            allowed: self.allowed.clone(),
        }
    }

    /// The most tokens the slot's history can reach: prompt, earlier output and
    /// `max_tokens` (`usize::MAX` without a limit).
    pub fn history_most(&self) -> usize {
        let had = self.prompt.len() + self.output.len();
        self.max_tokens.map_or(usize::MAX, |m| {
            had.saturating_add(m.try_into().unwrap_or(usize::MAX))
        })
    }

    /// The first field the device head does not run for this request yet: a later stage
    /// ([`SamplingParams::beyond_device`]), or a DRY window that can grow past
    /// [`crate::params::MAX_DEVICE_DRY_WINDOW`] tokens ([`SlotRequest::history_most`]).
    pub fn beyond_device(&self) -> Option<&'static str> {
        self.params.beyond_device_with(self.history_most())
    }

    /// Checks the request for slot `slot` of a head over `vocab` tokens (the error names
    /// the slot as its row).
    pub fn validate(&self, slot: usize, vocab: usize) -> Result<()> {
        self.params.validate(slot, vocab)?;
        let state = SequenceState {
            seed: 0,
            step: self.step,
            prompt: self.prompt.clone(),
            output: self.output.clone(),
        };
        state.validate(slot, vocab)?;
        check_masks(&[self.allowed.as_deref()], 1, vocab).map_err(|e| match e {
            Error::InvalidParameter {
                field,
                value,
                expected,
                ..
            } => Error::InvalidParameter {
                row: slot,
                field,
                value,
                expected,
            },
            other => other,
        })?;
        if let Some(&id) = self.stop.iter().find(|&&id| id as usize >= vocab) {
            return Err(Error::TokenOutOfRange {
                row: slot,
                field: "stop",
                id: id.into(),
                vocab,
            });
        }
        check_slot_lists(slot, &self.params, self.stop.len())
    }
}

pub(crate) fn check_slot_lists(slot: usize, params: &SamplingParams, stops: usize) -> Result<()> {
    if params.logit_bias.len() > MAX_SLOT_BIAS {
        return Err(Error::InvalidParameter {
            row: slot,
            field: "logit_bias",
            value: format!("{} entries", params.logit_bias.len()),
            expected: "at most 1024 entries per slot",
        });
    }
    if stops > MAX_SLOT_STOP {
        return Err(Error::InvalidParameter {
            row: slot,
            field: "stop",
            value: format!("{stops} ids"),
            expected: "at most 64 stop ids per slot",
        });
    }
    Ok(())
}

/// Why a slot finished.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum FinishReason {
    /// It drew one of its stop ids.
    Stop,
    /// It drew `max_tokens` tokens.
    Length,
}

/// The result of one row of a step.
#[derive(Debug, Clone, PartialEq)]
pub struct SlotStep {
    /// The slot the row belonged to.
    pub slot: usize,
    /// The drawn token (with log-probabilities if the slot asked for them), or the row's
    /// error ([`crate::RowError::Finished`] for a slot that had already finished).
    pub result: RowResult,
    /// Set when the slot has finished (at this step or before).
    pub finished: Option<FinishReason>,
}

/// A sampling head: slots of decode state, stepped together.
pub trait Head {
    /// A short name for reports (`cpu`, `wgpu:<adapter>`).
    fn name(&self) -> String;
    /// The number of slots.
    fn slots(&self) -> usize;
    /// The vocabulary size.
    fn vocab(&self) -> usize;
    /// Puts a sequence in `slot` (which must be free); returns its seed.
    fn join(&mut self, slot: usize, request: SlotRequest) -> Result<u64>;
    /// Frees `slot`.
    fn leave(&mut self, slot: usize) -> Result<()>;
    /// Replaces the sampling parameters of a joined slot (its state stays).
    fn set_params(&mut self, slot: usize, params: SamplingParams) -> Result<()>;
    /// Samples row `r` of `logits` for slot `rows[r]` and advances each slot. A slot may
    /// appear once per step.
    fn step(&mut self, logits: &Logits<'_>, rows: &[usize]) -> Result<Vec<SlotStep>>;
    /// [`Head::step`] with a token mask per row for this step only (`masks[r]` for row
    /// `r`: `ceil(V / 32)` words in the layout of [`crate::Request::allowed`], or `None`).
    /// The default takes no masks (an error naming the first masked row) unless none is
    /// given; [`crate::CpuHead`] applies them.
    fn step_masked(
        &mut self,
        logits: &Logits<'_>,
        rows: &[usize],
        masks: &[Option<&[u32]>],
    ) -> Result<Vec<SlotStep>> {
        match masks.iter().position(Option::is_some) {
            None => self.step(logits, rows),
            Some(row) => Err(Error::InvalidParameter {
                row,
                field: "allowed",
                value: "a token mask".into(),
                expected: "none on this head yet (CpuHead takes masks)",
            }),
        }
    }

    /// Speculative decoding's verify step (docs/CONTRACT.md, coupled verification): slot
    /// `rows[r]` drafted `drafts[r]` (K_r >= 1 tokens); `logits` holds each row's K_r + 1
    /// positions in turn (row r's position i at logits row `Σ_{q<r} (K_q + 1) + i`). Each
    /// slot advances by the tokens plain steps would give it, up to and including the
    /// first that differs from its drafted token (or position K_r's draw), and by no
    /// more: a stop id or `max_tokens` ends it where a step would. The default runs the
    /// positions as [`Head::step`]s of the slots still going, so every head verifies
    /// exactly; bad input is an error before any slot moves.
    fn verify(
        &mut self,
        logits: &Logits<'_>,
        rows: &[usize],
        drafts: &[Vec<u32>],
    ) -> Result<Vec<SlotVerify>> {
        verify_by_steps(self, logits, rows, drafts)
    }
}

/// What [`Head::verify`] did for one slot.
#[derive(Debug, Clone, PartialEq)]
pub struct SlotVerify {
    /// The slot.
    pub slot: usize,
    /// How many drafted tokens stood.
    pub accepted: usize,
    /// Each position's result, in order, as [`Head::step`] returned it: the accepted
    /// tokens, then the next draw, or the error or stop that ended the slot there.
    pub results: Vec<RowResult>,
    /// Set when the slot has finished (during this step or before).
    pub finished: Option<FinishReason>,
}

impl SlotVerify {
    /// The tokens the slot emitted.
    pub fn tokens(&self) -> Vec<u32> {
        self.results
            .iter()
            .filter_map(|r| r.as_ref().ok().map(|s| s.token))
            .collect()
    }
}

/// [`Head::verify`] by steps: position i of every slot still going (its drafted tokens
/// before i all stood, it has not finished or failed, i <= K) as one [`Head::step`].
/// Position 0 steps every row, so the step's door checks every slot before any moves;
/// the drafts and the logits' shape are checked before that.
pub fn verify_by_steps<H: Head + ?Sized>(
    head: &mut H,
    logits: &Logits<'_>,
    rows: &[usize],
    drafts: &[Vec<u32>],
) -> Result<Vec<SlotVerify>> {
    let start = verify_door(head.vocab(), logits, rows, drafts)?;
    let mut v = Verifying::new(rows, drafts);
    for i in 0..=v.most() {
        let idx = v.going_at(i);
        if idx.is_empty() {
            break;
        }
        let picked = crate::logits::Gathered::new(logits, idx.iter().map(|&r| start[r] + i));
        let slots: Vec<usize> = idx.iter().map(|&r| rows[r]).collect();
        let steps = head.step(&picked.view()?, &slots)?;
        v.take(i, &idx, steps);
    }
    Ok(v.out)
}

/// The door of [`Head::verify`], the same for every head: one draft a row, drafted ids
/// inside the vocabulary, and one row of logits for each position (a row's drafted
/// tokens plus one, rows back to back). Returns where each row's positions start.
pub fn verify_door(
    vocab: usize,
    logits: &Logits<'_>,
    rows: &[usize],
    drafts: &[Vec<u32>],
) -> Result<Vec<usize>> {
    if drafts.len() != rows.len() {
        return Err(Error::Shape(format!(
            "{} drafts for {} rows: give one draft a row",
            drafts.len(),
            rows.len()
        )));
    }
    for (r, d) in drafts.iter().enumerate() {
        crate::verify::check_tokens(r, d, vocab)?;
    }
    let mut start = Vec::with_capacity(rows.len());
    let mut n = 0;
    for d in drafts {
        start.push(n);
        n += d.len() + 1;
    }
    if logits.rows() != n {
        return Err(Error::Shape(format!(
            "{} rows of logits for {n} positions: each row of the verification takes its \
             drafted tokens plus one",
            logits.rows()
        )));
    }
    Ok(start)
}

/// A verification's bookkeeping, position by position, the same for every head: which
/// rows are still going and what each emitted. A head that runs every position of its
/// rows at once (the device head) hands it each position's results for the rows still
/// going; the positions of a row after it stopped are not its results.
#[derive(Debug)]
pub struct Verifying<'a> {
    drafts: &'a [Vec<u32>],
    going: Vec<bool>,
    /// What each row emitted so far.
    pub out: Vec<SlotVerify>,
}

impl<'a> Verifying<'a> {
    /// Every row going, nothing emitted.
    pub fn new(rows: &[usize], drafts: &'a [Vec<u32>]) -> Self {
        Self {
            drafts,
            going: vec![true; rows.len()],
            out: rows
                .iter()
                .map(|&slot| SlotVerify {
                    slot,
                    accepted: 0,
                    results: Vec::new(),
                    finished: None,
                })
                .collect(),
        }
    }

    /// The last position any row has (its K).
    pub fn most(&self) -> usize {
        self.drafts.iter().map(Vec::len).max().unwrap_or(0)
    }

    /// The rows with a position `i` (`i <= K`), going or not.
    pub fn rows_at(&self, i: usize) -> Vec<usize> {
        (0..self.drafts.len())
            .filter(|&r| i <= self.drafts[r].len())
            .collect()
    }

    /// The rows still going at position `i`.
    pub fn going_at(&self, i: usize) -> Vec<usize> {
        (0..self.drafts.len())
            .filter(|&r| self.going[r] && i <= self.drafts[r].len())
            .collect()
    }

    /// Position `i`'s results for rows `idx` (all going): a row goes on while its draw
    /// is its drafted token and it has not finished.
    pub fn take(&mut self, i: usize, idx: &[usize], steps: Vec<SlotStep>) {
        for (&r, st) in idx.iter().zip(steps) {
            let v = &mut self.out[r];
            v.finished = st.finished;
            let agrees = matches!(&st.result, Ok(s) if i < self.drafts[r].len() && s.token == self.drafts[r][i]);
            if agrees {
                v.accepted += 1;
            }
            self.going[r] = agrees && st.finished.is_none();
            v.results.push(st.result);
        }
    }
}

/// The door of [`Head::join`], the same for every head: `slot` exists and is free
/// (`joined[s]`: slot `s` holds a sequence), and the request is valid for the vocabulary
/// (parameters, history, mask, stop ids, the slot's lists). Returns the slot's seed (its
/// own, or one from the OS). A head adds only what its own storage cannot hold (the
/// device head's stages and windows).
pub fn join_door(slot: usize, joined: &[bool], request: &SlotRequest, vocab: usize) -> Result<u64> {
    check_slot(slot, joined.len())?;
    if joined[slot] {
        return Err(Error::Shape(format!(
            "slot {slot} is taken: leave it first"
        )));
    }
    request.validate(slot, vocab)?;
    seed_of(request)
}

/// The door of [`Head::set_params`], the same for every head: `slot` exists, the
/// parameters are valid for the vocabulary, the slot holds a sequence (`stops`: its
/// number of stop ids, `None` for a free slot), and the slot's lists fit.
pub fn set_params_door(
    slot: usize,
    slots: usize,
    stops: Option<usize>,
    params: &SamplingParams,
    vocab: usize,
) -> Result<()> {
    check_slot(slot, slots)?;
    params.validate(slot, vocab)?;
    let Some(stops) = stops else {
        return Err(Error::Shape(format!("slot {slot} has no sequence")));
    };
    check_slot_lists(slot, params, stops)
}

/// The door of a step, the same for every head ([`Head::step`], [`Head::step_masked`],
/// the device head's recorded steps): the row -> slot map against the joined slots, the
/// logits' vocabulary against the head's, and the step's masks when any are given (one
/// per row, `ceil(V / 32)` words each; an empty `masks` is none).
pub fn step_door(
    rows: &[usize],
    joined: &[bool],
    logits_rows: usize,
    logits_vocab: usize,
    vocab: usize,
    masks: &[Option<&[u32]>],
) -> Result<()> {
    check_rows(rows, logits_rows, joined)?;
    if logits_vocab != vocab {
        return Err(Error::Shape(format!(
            "logits of {logits_vocab} tokens for a head of {vocab}"
        )));
    }
    if !masks.is_empty() {
        check_masks(masks, logits_rows, logits_vocab)?;
    }
    Ok(())
}

/// Checks the masks of a step: one per row, each `ceil(V / 32)` words.
pub fn check_masks(masks: &[Option<&[u32]>], rows: usize, vocab: usize) -> Result<()> {
    if masks.len() != rows {
        return Err(Error::Shape(format!(
            "{} masks for {rows} rows: give one (or None) per row",
            masks.len()
        )));
    }
    for (row, m) in masks.iter().enumerate() {
        if let Some(m) = m {
            crate::params::check_mask_width(row, m, vocab)?;
        }
    }
    Ok(())
}

/// Checks a step's row -> slot map against the joined slots.
pub fn check_rows(rows: &[usize], logits_rows: usize, joined: &[bool]) -> Result<()> {
    if rows.len() != logits_rows {
        return Err(Error::Shape(format!(
            "{} slots for {logits_rows} rows of logits: give one slot per row",
            rows.len()
        )));
    }
    let mut seen = vec![false; joined.len()];
    for (r, &s) in rows.iter().enumerate() {
        if s >= joined.len() {
            return Err(Error::Shape(format!(
                "row {r}: slot {s} does not exist (the head has {})",
                joined.len()
            )));
        }
        if !joined[s] {
            return Err(Error::Shape(format!("row {r}: slot {s} has no sequence")));
        }
        if seen[s] {
            return Err(Error::Shape(format!(
                "row {r}: slot {s} appears twice in one step"
            )));
        }
        seen[s] = true;
    }
    Ok(())
}

/// Checks a slot index for a head of `slots` slots.
pub fn check_slot(slot: usize, slots: usize) -> Result<()> {
    if slot >= slots {
        return Err(Error::Shape(format!(
            "slot {slot} does not exist (the head has {slots})"
        )));
    }
    Ok(())
}

/// The seed of a request: its own, or one from the OS.
pub fn seed_of(request: &SlotRequest) -> Result<u64> {
    match request.seed {
        Some(s) => Ok(s),
        None => Ok(SequenceState::from_entropy()?.seed),
    }
}
