//! The generation loop, over any backend's [`Engine`] (a model and a sampling head on one
//! device): one prefill per sequence, then batched decode steps through the head's
//! slots; a sequence that finishes leaves its slot.
//!
//! A step samples the rows whose logits the previous call made, then runs the model on
//! the drawn tokens for the sequences that go on. Engines may run ahead of their results
//! (the device's does: results come back through the head's readback ring), so a
//! sequence the host has not yet seen finish may be sampled again; the head reports such
//! a row as finished and the loop ignores it.

use std::borrow::Cow;
use std::time::Instant;

use serde::Serialize;

use crate::error::{Error, Result};
use crate::head::{FinishReason, SlotRequest, SlotStep};
use crate::moe::Dispatch;
use crate::pipeline::TokenLogprobs;

/// A model and a sampling head on one backend.
pub trait Engine {
    /// A short name for reports (`cpu`, `wgpu:<adapter>`).
    fn name(&self) -> String;
    /// The model's vocabulary size.
    fn vocab(&self) -> usize;
    /// How many sequences can run at once.
    fn slots(&self) -> usize;
    /// Starts a sequence in `slot`: joins the head with `request`, empties the slot's
    /// cache and runs `prompt` (the prefill); the logits of its last token are row
    /// `logits_row` of the first step. Waits for the device. Returns the branch each MoE
    /// layer took.
    fn start(
        &mut self,
        slot: usize,
        request: SlotRequest,
        prompt: &[u32],
        logits_row: usize,
    ) -> Result<Vec<Dispatch>>;
    /// One decode step: samples row `r` of the last call's logits for slot
    /// `sample[r]`, then runs the model on the drawn tokens of the slots in `forward` (a
    /// subsequence of `sample`), whose logits become the next step's rows in that order.
    /// Returns the branch each MoE layer took in the forward.
    fn step(&mut self, sample: &[usize], forward: &[usize]) -> Result<Vec<Dispatch>>;
    /// The rows of the steps whose results are in, oldest first, without waiting.
    fn poll(&mut self) -> Result<Vec<Vec<SlotStep>>>;
    /// Waits for every recorded step and returns the results not yet returned.
    fn wait(&mut self) -> Result<Vec<Vec<SlotStep>>>;
    /// Frees `slot` (after its last step).
    fn leave(&mut self, slot: usize) -> Result<()>;
    /// The first `rows` rows of the last call's logits (read back from the device after
    /// waiting for it): for tests and tools, never needed to generate.
    fn read_logits(&mut self, rows: usize) -> Result<Vec<f32>>;
    /// The most positions a sequence may reach (prompt and output): the model's
    /// `max_position_embeddings`, when its config says; `None` for no limit.
    fn max_positions(&self) -> Option<usize> {
        None
    }
    /// How many steps may be recorded before the loop must collect results.
    fn ahead(&self) -> usize {
        1
    }
    /// Waits for the oldest step still in flight (not for every one) and returns the
    /// results in, as [`Engine::poll`]; by default waits for all ([`Engine::wait`]).
    fn wait_oldest(&mut self) -> Result<Vec<Vec<SlotStep>>> {
        self.wait()
    }
    /// Compute dispatches the last decode step recorded (sampling and the forward), for
    /// engines that record them (a device); `None` elsewhere.
    fn step_dispatches(&self) -> Option<usize> {
        None
    }
    /// Profiles every decode step from now on (each dispatch timed in a pass of its own,
    /// its plan beside it; see [`crate::profile`]): slower steps, exact device times.
    /// Returns whether the engine can (a device engine; the CPU's cannot).
    fn set_profile(&mut self, on: bool) -> bool {
        let _ = on;
        false
    }
    /// The decode steps profiled so far (empty without [`Engine::set_profile`]).
    fn profile(&self) -> crate::profile::StepProfile {
        crate::profile::StepProfile::default()
    }
    /// Starts a sequence in `slot` whose prompt is the one `from` was started with (and
    /// that has run nothing since): joins the head with `request` and copies `from`'s
    /// cache and its logits row `from_row` to row `logits_row`, so the prompt is
    /// prefilled once for both. Returns whether it forked; the default does not (the
    /// caller then calls [`Engine::start`]).
    fn fork(
        &mut self,
        from: usize,
        from_row: usize,
        slot: usize,
        request: SlotRequest,
        logits_row: usize,
    ) -> Result<bool> {
        let _ = (from, from_row, slot, request, logits_row);
        Ok(false)
    }
}

/// A sequence to generate.
#[derive(Debug, Clone)]
pub struct Sequence {
    /// The prompt's token ids (at least one).
    pub prompt: Vec<u32>,
    /// Sampling parameters, seed, `max_tokens` (required) and stop ids.
    pub request: SlotRequest,
}

impl Sequence {
    /// The first field the device head does not run for this sequence yet
    /// ([`SlotRequest::beyond_device`], its prompt counted in the history).
    pub fn beyond_device(&self) -> Option<&'static str> {
        let mut r = self.request.clone();
        r.prompt.clone_from(&self.prompt);
        r.beyond_device()
    }
}

/// What one sequence produced.
#[derive(Debug, Clone, Default, Serialize)]
pub struct SequenceOutput {
    /// The drawn tokens (a drawn stop id included).
    pub tokens: Vec<u32>,
    /// Per token, its log-probabilities (when the request asked for them).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub logprobs: Vec<TokenLogprobs>,
    /// Why it ended.
    pub finish: Option<FinishReason>,
    /// The row error that ended it, if one did.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

/// A run's outputs and timings.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Report {
    /// One output per sequence, in order.
    pub outputs: Vec<SequenceOutput>,
    /// Milliseconds spent in prefill (all sequences).
    pub prefill_ms: f64,
    /// Prompt tokens run in prefill.
    pub prefill_tokens: usize,
    /// Milliseconds of the decode loop.
    pub decode_ms: f64,
    /// Tokens drawn in the decode loop.
    pub decode_tokens: usize,
    /// The branch the MoE layers took in prefill (the last prefill's first MoE layer).
    pub moe_prefill: Option<Dispatch>,
    /// The branch the MoE layers took in decode (the first step's first MoE layer).
    pub moe_decode: Option<Dispatch>,
    /// Decode steps run.
    pub decode_steps: usize,
    /// Mean host time of a decode step's call into the engine (recording and submitting
    /// it; the waits for results are not in it), in microseconds.
    pub host_us_per_step: f64,
    /// Compute dispatches of the first decode step that ran the model (a device engine's;
    /// `None` on the CPU).
    pub step_dispatches: Option<usize>,
    /// Sequences started from another's prefill ([`Engine::fork`]) instead of their own.
    pub forked: usize,
}

impl Report {
    /// Decode tokens per second.
    pub fn decode_tok_s(&self) -> f64 {
        if self.decode_ms > 0.0 {
            self.decode_tokens as f64 / (self.decode_ms / 1e3)
        } else {
            0.0
        }
    }
}

/// Runs `seqs` to completion on `engine`; `on_token` is called with the number of tokens
/// drawn so far (for progress bars).
pub fn generate<E: Engine + ?Sized>(
    engine: &mut E,
    seqs: &[Sequence],
    on_token: &mut dyn FnMut(usize),
) -> Result<Report> {
    generate_until(engine, seqs, on_token, &mut |_, _| false)
}

/// The door of [`generate`] and [`generate_until`], the same for every engine and
/// binding (the Python package calls it before its thread starts): at least one
/// sequence and at most `slots`; each with a prompt of ids below `vocab`, `max_tokens` of
/// at least 1 whose total with the prompt stays within `max_positions` (the model's
/// `max_position_embeddings`, when it has one), and a request valid for `vocab`
/// (parameters, history, mask, stop ids). Errors name the sequence.
pub fn check_sequences(
    seqs: &[Sequence],
    vocab: usize,
    slots: usize,
    max_positions: Option<usize>,
) -> Result<()> {
    if seqs.is_empty() {
        return Err(Error::Model("no sequence to generate".into()));
    }
    if seqs.len() > slots {
        return Err(Error::Model(format!(
            "{} sequences for {slots} slots",
            seqs.len()
        )));
    }
    for (i, s) in seqs.iter().enumerate() {
        if s.prompt.is_empty() {
            return Err(Error::Model(format!("sequence {i}: the prompt is empty")));
        }
        if let Some(&t) = s.prompt.iter().find(|&&t| t as usize >= vocab) {
            return Err(Error::TokenOutOfRange {
                row: i,
                field: "prompt",
                id: t.into(),
                vocab,
            });
        }
        let n = match s.request.max_tokens {
            Some(n) if n >= 1 => n,
            other => {
                return Err(Error::Model(format!(
                    "sequence {i}: max_tokens = {other:?}: expected at least 1"
                )))
            }
        };
        if let Some(most) = max_positions {
            let need = (s.prompt.len() as u64).saturating_add(n);
            if need > most as u64 {
                return Err(Error::Model(format!(
                    "sequence {i}: a prompt of {} tokens and max_tokens = {n} need {need} \
                     positions; the model holds {most} (max_position_embeddings)",
                    s.prompt.len()
                )));
            }
        }
        s.request.validate(i, vocab)?;
    }
    Ok(())
}

/// [`generate`], with `stop(i, tokens)` asked after each token of sequence `i` (its
/// tokens so far, the last one included even when it ends the sequence): `true` ends
/// the sequence there (`FinishReason::Stop`), as a stop id would — stop strings,
/// checked on the decoded text by the caller. Tokens of steps already in flight for it
/// are dropped.
pub fn generate_until<E: Engine + ?Sized>(
    engine: &mut E,
    seqs: &[Sequence],
    on_token: &mut dyn FnMut(usize),
    stop: &mut dyn FnMut(usize, &[u32]) -> bool,
) -> Result<Report> {
    let checked = CheckedSequences::new(
        Cow::Borrowed(seqs),
        engine.vocab(),
        engine.slots(),
        engine.max_positions(),
    )?;
    generate_checked(engine, &checked, on_token, stop)
}

/// Sequences that passed generate's door ([`check_sequences`]) for a vocabulary, a
/// number of slots and a position limit: what [`generate_checked`] runs without checking
/// them again. A binding that checks before it builds its engine (the CLI, before sizing
/// caches; Python, before its thread starts) makes one and hands it on.
#[derive(Debug, Clone)]
pub struct CheckedSequences<'a> {
    seqs: Cow<'a, [Sequence]>,
    vocab: usize,
    slots: usize,
    max_positions: Option<usize>,
}

impl<'a> CheckedSequences<'a> {
    /// `seqs` through [`check_sequences`].
    pub fn new(
        seqs: Cow<'a, [Sequence]>,
        vocab: usize,
        slots: usize,
        max_positions: Option<usize>,
    ) -> Result<Self> {
        check_sequences(&seqs, vocab, slots, max_positions)?;
        Ok(Self {
            seqs,
            vocab,
            slots,
            max_positions,
        })
    }

    /// The sequences.
    pub fn sequences(&self) -> &[Sequence] {
        &self.seqs
    }
}

/// [`generate_until`] for sequences already through the door. The engine must be one
/// they were checked for (its vocabulary and position limit, at least their slots).
pub fn generate_checked<E: Engine + ?Sized>(
    engine: &mut E,
    checked: &CheckedSequences<'_>,
    on_token: &mut dyn FnMut(usize),
    stop: &mut dyn FnMut(usize, &[u32]) -> bool,
) -> Result<Report> {
    if engine.vocab() != checked.vocab
        || engine.slots() < checked.seqs.len()
        || engine.max_positions() != checked.max_positions
    {
        return Err(Error::Model(format!(
            "sequences checked for V = {}, {} slots, {:?} positions; the engine has V = {}, \
             {} slots, {:?} positions",
            checked.vocab,
            checked.slots,
            checked.max_positions,
            engine.vocab(),
            engine.slots(),
            engine.max_positions()
        )));
    }
    let seqs = checked.sequences();
    let limits: Vec<usize> = seqs
        .iter()
        .map(|s| s.request.max_tokens.unwrap_or(1) as usize)
        .collect();
    let mut report = Report {
        outputs: vec![SequenceOutput::default(); seqs.len()],
        ..Report::default()
    };
    let mut host_s = 0.0f64;
    let t0 = Instant::now();
    for (i, s) in seqs.iter().enumerate() {
        // a prompt already prefilled (n completions of one prompt) is copied, not rerun
        if let Some(j) = seqs[..i].iter().position(|o| o.prompt == s.prompt) {
            if engine.fork(j, j, i, s.request.clone(), i)? {
                report.forked += 1;
                continue;
            }
        }
        let branches = engine.start(i, s.request.clone(), &s.prompt, i)?;
        report.prefill_tokens += s.prompt.len();
        if let Some(&b) = branches.first() {
            report.moe_prefill = Some(b);
        }
    }
    report.prefill_ms = t0.elapsed().as_secs_f64() * 1e3;

    let t1 = Instant::now();
    let mut done = vec![false; seqs.len()];
    let mut left = vec![false; seqs.len()];
    // the rows of the last call's logits, and the steps each sequence has been sampled
    let mut sample: Vec<usize> = (0..seqs.len()).collect();
    let mut sampled = vec![0usize; seqs.len()];
    let mut drawn = 0usize;
    let mut in_flight = 0usize;
    let take = |rows: Vec<Vec<SlotStep>>,
                report: &mut Report,
                done: &mut Vec<bool>,
                drawn: &mut usize,
                stop: &mut dyn FnMut(usize, &[u32]) -> bool|
     -> usize {
        let n = rows.len();
        for row in rows.into_iter().flatten() {
            let i = row.slot;
            if done[i] {
                continue;
            }
            let out = &mut report.outputs[i];
            match row.result {
                Ok(s) => {
                    out.tokens.push(s.token);
                    if let Some(lp) = s.logprobs {
                        out.logprobs.push(lp);
                    }
                    *drawn += 1;
                    // asked after every token (a caller may stream them), acted on
                    // only while the sequence runs
                    let ends = stop(i, &out.tokens);
                    if row.finished.is_none() && ends {
                        out.finish = Some(FinishReason::Stop);
                        done[i] = true;
                    }
                }
                Err(e) => {
                    out.error = Some(e.to_string());
                    done[i] = true;
                }
            }
            if row.finished.is_some() {
                out.finish = row.finished;
                done[i] = true;
            }
        }
        n
    };
    while !sample.is_empty() {
        for &i in &sample {
            sampled[i] += 1;
        }
        // the slots whose next token is wanted: not known to be done, and not at their limit
        let forward: Vec<usize> = sample
            .iter()
            .copied()
            .filter(|&i| !done[i] && sampled[i] < limits[i])
            .collect();
        let t = Instant::now();
        let branches = engine.step(&sample, &forward)?;
        host_s += t.elapsed().as_secs_f64();
        report.decode_steps += 1;
        if report.moe_decode.is_none() && !forward.is_empty() {
            report.moe_decode = branches.first().copied();
            report.step_dispatches = engine.step_dispatches();
        }
        in_flight += 1;
        // at most `ahead` steps in flight: wait for the oldest only, so the device always
        // has the next steps queued behind it
        let got = if in_flight >= engine.ahead() {
            engine.wait_oldest()?
        } else {
            engine.poll()?
        };
        in_flight -= take(got, &mut report, &mut done, &mut drawn, stop).min(in_flight);
        on_token(drawn);
        // the next step samples exactly the rows this step's forward made
        sample = forward;
        if in_flight == 0 {
            // every result is in: slots no longer sampled leave
            for (i, l) in left.iter_mut().enumerate() {
                if !*l && !sample.contains(&i) {
                    engine.leave(i)?;
                    *l = true;
                }
            }
        }
    }
    let rest = engine.wait()?;
    take(rest, &mut report, &mut done, &mut drawn, stop);
    on_token(drawn);
    for (i, l) in left.iter_mut().enumerate() {
        if !*l {
            engine.leave(i)?;
            *l = true;
        }
    }
    report.decode_ms = t1.elapsed().as_secs_f64() * 1e3;
    report.decode_tokens = drawn;
    report.host_us_per_step = host_s * 1e6 / report.decode_steps.max(1) as f64;
    for (i, out) in report.outputs.iter_mut().enumerate() {
        if out.finish.is_none() && out.error.is_none() && out.tokens.len() >= limits[i] {
            out.finish = Some(FinishReason::Length);
        }
    }
    Ok(report)
}
