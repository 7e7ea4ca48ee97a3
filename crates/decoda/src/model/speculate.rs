//! Speculative decoding end to end (docs/CONTRACT.md, "Verifying drafted tokens"): a
//! draft model proposes K tokens per sequence with decoda's sampler and the sequence's
//! own seed, the target model scores the K + 1 positions in one forward, and the target's
//! head verifies them (coupled verification, [`Head::verify`]). The tokens are those of
//! plain decoding for the same seeds and parameters, bit for bit, whenever the target's
//! K + 1-position forward gives each position the logits a one-position step gives
//! ([`Forward::extend`]); a draft only changes how many forwards that takes.
//!
//! A round, for every sequence still going:
//! 1. the draft catches up on the tokens it has not run (the last round's draw, and its
//!    own last drafted token when all K stood), then draws K tokens one position at a
//!    time: position j at the sequence's step + j, its history extended by the drafted
//!    tokens before it (the request plain decoding would send there) — so where the
//!    draft's logits agree with the target's, its draws are the target's;
//! 2. the target runs the tokens it has not run (the last round's draw) and the K drafted
//!    tokens in one call, logits for every position;
//! 3. the head verifies: the drafted tokens stand while they equal the target's own draw
//!    there, and the first draw that differs (or the one after all K) is emitted too;
//! 4. both models drop the positions of rejected tokens ([`Forward::truncate`]).

use std::time::Instant;

use serde::Serialize;

use crate::backend::Backend;
use crate::error::{Error, Result};
use crate::head::{FinishReason, Head};
use crate::logits::Logits;
use crate::pipeline::RowResult;

use super::generate::{CheckedSequences, Report, SequenceOutput};

/// A model that runs several positions of its sequences in one call: what speculative
/// decoding needs of the target and of the draft (the CPU's is `crate::cpu::CpuModel`).
pub trait Forward {
    /// A short name for reports (`cpu`).
    fn name(&self) -> String;
    /// The model's vocabulary size.
    fn vocab(&self) -> usize;
    /// How many sequences it holds.
    fn slots(&self) -> usize;
    /// The most positions a sequence may reach, when the model says.
    fn max_positions(&self) -> Option<usize>;
    /// Empties `slot` and runs `prompt` (a prefill, as a plain run's); returns the logits
    /// of its last token `[V]`.
    fn prefill(&mut self, slot: usize, prompt: &[u32]) -> Result<Vec<f32>>;
    /// Appends each segment's tokens to its slot's sequence in one call and returns the
    /// logits of every token, segments in order (`[Σ tokens, V]`), each row bit for bit
    /// what a decode call of that token alone gives at that position.
    fn extend(&mut self, segments: &[(usize, &[u32])]) -> Result<Vec<f32>>;
    /// Keeps `slot`'s first `len` positions (drops rejected drafted tokens).
    fn truncate(&mut self, slot: usize, len: usize) -> Result<()>;
    /// Positions `slot` holds.
    fn positions(&self, slot: usize) -> usize;
    /// Makes `to` a copy of `from` (its positions and cache: a second sequence from the
    /// same prompt, prefilled once). Returns whether it copied; the default does not
    /// (the caller then prefills).
    fn fork(&mut self, from: usize, to: usize) -> Result<bool> {
        let _ = (from, to);
        Ok(false)
    }
}

/// The door of a call of several positions of several slots ([`Forward::extend`],
/// `crate::cpu::CpuModel::run`), the same for every backend: at least one segment, each
/// slot below `slots` and at most once, each segment of at least one token, every token
/// below `vocab`. Errors name the segment.
pub fn check_segments(segments: &[(usize, &[u32])], slots: usize, vocab: usize) -> Result<()> {
    if segments.is_empty() {
        return Err(Error::Model("a call needs at least one segment".into()));
    }
    let mut seen = vec![false; slots];
    for (i, &(slot, toks)) in segments.iter().enumerate() {
        if slot >= slots {
            return Err(Error::Model(format!(
                "segment {i}: slot {slot}: the model has {slots} slots"
            )));
        }
        if std::mem::replace(&mut seen[slot], true) {
            return Err(Error::Model(format!(
                "segment {i}: slot {slot} appears twice"
            )));
        }
        if toks.is_empty() {
            return Err(Error::Model(format!("segment {i}: no tokens")));
        }
        if let Some((j, t)) = toks.iter().enumerate().find(|(_, &t)| t as usize >= vocab) {
            return Err(Error::Model(format!(
                "segment {i} (slot {slot}): token {j} = {t} is not below vocab_size {vocab}"
            )));
        }
    }
    Ok(())
}

/// A speculative run's outputs, timings and acceptance.
#[derive(Debug, Clone, Serialize)]
pub struct SpeculativeReport {
    /// Outputs and timings as a plain run reports them (`decode_steps` counts rounds:
    /// one target forward each).
    #[serde(flatten)]
    pub report: Report,
    /// Tokens the draft proposed.
    pub drafted: usize,
    /// Drafted tokens that stood.
    pub accepted: usize,
    /// Milliseconds of the rounds spent in the draft (catching up and drafting).
    pub draft_ms: f64,
}

impl SpeculativeReport {
    /// The fraction of drafted tokens that stood (0 when none was drafted).
    pub fn acceptance(&self) -> f64 {
        if self.drafted == 0 {
            0.0
        } else {
            self.accepted as f64 / self.drafted as f64
        }
    }
}

/// One sequence's place in the run.
#[derive(Debug, Default)]
struct Place {
    seed: u64,
    /// Tokens emitted so far.
    drawn: Vec<u32>,
    /// The target's logits for the next position, when no call of the target has made
    /// them yet (the prefill's, before the first round).
    target_row: Option<Vec<f32>>,
    /// Emitted tokens the target has not run.
    target_behind: Vec<u32>,
    /// The draft's logits for the next position (after its prefill).
    draft_row: Option<Vec<f32>>,
    /// Emitted tokens the draft has not run.
    draft_behind: Vec<u32>,
    done: bool,
}

/// Runs `checked`'s sequences with `draft` proposing up to `k` tokens a round for
/// `target`, verified by `head` (the target's sampling head, its slots free); `sampler`
/// draws the draft's tokens. Returns the outputs — plain decoding's tokens for the same
/// seeds and parameters — with the acceptance. `stop(i, tokens)` is asked after each
/// token as in [`super::generate_until`].
#[allow(clippy::too_many_arguments)]
pub fn generate_speculative(
    target: &mut dyn Forward,
    head: &mut dyn Head,
    draft: &mut dyn Forward,
    sampler: &dyn Backend,
    k: usize,
    checked: &CheckedSequences<'_>,
    on_token: &mut dyn FnMut(usize),
    stop: &mut dyn FnMut(usize, &[u32]) -> bool,
) -> Result<SpeculativeReport> {
    let seqs = checked.sequences();
    let n = seqs.len();
    let v = target.vocab();
    if k == 0 {
        return Err(Error::Model(
            "speculate: K = 0; draft at least one token a round".into(),
        ));
    }
    if draft.vocab() != v || head.vocab() != v {
        return Err(Error::Model(format!(
            "speculate: the target has V = {v}, the draft V = {}, the head V = {}: they \
             must share the vocabulary",
            draft.vocab(),
            head.vocab()
        )));
    }
    let short = [
        ("target", target.slots()),
        ("draft", draft.slots()),
        ("head", head.slots()),
    ]
    .into_iter()
    .find(|&(_, s)| s < n);
    if let Some((what, s)) = short {
        return Err(Error::Model(format!(
            "speculate: {n} sequences; the {what} holds {s}"
        )));
    }
    let limits: Vec<usize> = seqs
        .iter()
        .map(|s| s.request.max_tokens.unwrap_or(1) as usize)
        .collect();
    // drafted positions run past a sequence's end by up to k - 1 before they are dropped
    if let Some(most) = draft.max_positions() {
        if let Some(i) = (0..n).find(|&i| seqs[i].prompt.len() + limits[i] > most) {
            return Err(Error::Model(format!(
                "sequence {i}: {} positions; the draft holds {most}",
                seqs[i].prompt.len() + limits[i]
            )));
        }
    }
    let mut report = SpeculativeReport {
        report: Report {
            outputs: vec![SequenceOutput::default(); n],
            ..Report::default()
        },
        drafted: 0,
        accepted: 0,
        draft_ms: 0.0,
    };
    let mut places: Vec<Place> = Vec::with_capacity(n);
    let t0 = Instant::now();
    for (i, s) in seqs.iter().enumerate() {
        let seed = head.join(i, s.request.clone())?;
        // a prompt already prefilled (n completions of one prompt) is copied, not rerun
        let same = seqs[..i].iter().position(|o| o.prompt == s.prompt);
        let (target_row, draft_row) = match same {
            Some(j) if target.fork(j, i)? && draft.fork(j, i)? => {
                report.report.forked += 1;
                (
                    places[j].target_row.clone().unwrap_or_default(),
                    places[j].draft_row.clone().unwrap_or_default(),
                )
            }
            _ => {
                report.report.prefill_tokens += s.prompt.len();
                (target.prefill(i, &s.prompt)?, draft.prefill(i, &s.prompt)?)
            }
        };
        places.push(Place {
            seed,
            target_row: Some(target_row),
            draft_row: Some(draft_row),
            ..Place::default()
        });
    }
    report.report.prefill_ms = t0.elapsed().as_secs_f64() * 1e3;

    let t1 = Instant::now();
    let mut drawn_total = 0usize;
    let mut draft_s = 0.0f64;
    loop {
        let going: Vec<usize> = (0..n).filter(|&i| !places[i].done).collect();
        if going.is_empty() {
            break;
        }
        // how many tokens each sequence drafts: at most k, and no more than it may still
        // emit after the verified draw
        let mut want: Vec<usize> = going
            .iter()
            .map(|&i| k.min(limits[i] - places[i].drawn.len() - 1))
            .collect();

        // 1. the draft
        let td = Instant::now();
        let drafted = draft_round(draft, sampler, seqs, &mut places, &going, &mut want)?;
        draft_s += td.elapsed().as_secs_f64();
        let drafts: Vec<Vec<u32>> = drafted.iter().map(|d| d.tokens.clone()).collect();

        // 2. the target: its lagging token and the drafted ones, logits for each
        let before: Vec<usize> = going.iter().map(|&i| target.positions(i)).collect();
        let runs: Vec<Vec<u32>> = going
            .iter()
            .zip(&drafts)
            .map(|(&i, d)| [places[i].target_behind.as_slice(), d].concat())
            .collect();
        let segments: Vec<(usize, &[u32])> = going
            .iter()
            .zip(&runs)
            .filter(|(_, t)| !t.is_empty())
            .map(|(&i, t)| (i, t.as_slice()))
            .collect();
        let rows = if segments.is_empty() {
            Vec::new()
        } else {
            target.extend(&segments)?
        };
        // each sequence's K + 1 positions: its prefill row first when it has one
        let mut logits = Vec::with_capacity(going.len() * (k + 1) * v);
        let mut at = 0;
        for (&i, t) in going.iter().zip(&runs) {
            if let Some(row) = places[i].target_row.take() {
                logits.extend_from_slice(&row);
            }
            logits.extend_from_slice(&rows[at * v..(at + t.len()) * v]);
            at += t.len();
        }

        // 3. the head verifies the rows that drafted, steps the others
        let results = verify_round(head, &logits, v, &going, &drafts)?;
        report.report.decode_steps += 1;

        // 4. emit, drop rejected positions
        for (((&i, dr), (accepted, results, finished)), &pos) in
            going.iter().zip(&drafted).zip(results).zip(&before)
        {
            let d = &dr.tokens;
            report.drafted += d.len();
            report.accepted += accepted;
            let place = &mut places[i];
            let out = &mut report.report.outputs[i];
            let behind = place.target_behind.len();
            let mut emitted = Vec::new();
            for r in results {
                match r {
                    Ok(s) => {
                        out.tokens.push(s.token);
                        if let Some(lp) = s.logprobs {
                            out.logprobs.push(lp);
                        }
                        emitted.push(s.token);
                        drawn_total += 1;
                        if stop(i, &out.tokens) && finished.is_none() {
                            out.finish = Some(FinishReason::Stop);
                            place.done = true;
                            break;
                        }
                    }
                    Err(e) => {
                        out.error = Some(e.to_string());
                        place.done = true;
                        break;
                    }
                }
            }
            if finished.is_some() && out.finish.is_none() {
                out.finish = finished;
                place.done = true;
            }
            place.drawn.extend_from_slice(&emitted);
            if place.done {
                head.leave(i)?;
                continue;
            }
            // the target keeps what it ran of the accepted tokens; the last draw lags
            target.truncate(i, pos + behind + accepted)?;
            place.target_behind = emitted[accepted..].to_vec();
            // the draft keeps the accepted tokens it ran; the rest lag
            let kept = accepted.min(dr.ran);
            draft.truncate(i, dr.base + kept)?;
            place.draft_behind.extend_from_slice(&d[kept..accepted]);
            place.draft_behind.extend_from_slice(&emitted[accepted..]);
        }
        on_token(drawn_total);
    }
    report.report.decode_ms = t1.elapsed().as_secs_f64() * 1e3;
    report.report.decode_tokens = drawn_total;
    report.draft_ms = draft_s * 1e3;
    for (i, out) in report.report.outputs.iter_mut().enumerate() {
        if out.finish.is_none() && out.error.is_none() && out.tokens.len() >= limits[i] {
            out.finish = Some(FinishReason::Length);
        }
    }
    Ok(report)
}

/// What the draft did for one sequence in a round.
#[derive(Debug, Default)]
struct Drafted {
    /// The drafted tokens.
    tokens: Vec<u32>,
    /// Positions the draft held before drafting (after catching up).
    base: usize,
    /// How many of the drafted tokens it ran (all but the last, or all when a row
    /// error cut the draft short).
    ran: usize,
}

/// The draft's part of a round: catch up on the tokens it lags by, then draw `want[g]`
/// tokens for sequence `going[g]` one position at a time (fewer when the draft's row
/// fails there: the target then verifies what was drafted, or steps).
fn draft_round(
    draft: &mut dyn Forward,
    sampler: &dyn Backend,
    seqs: &[super::generate::Sequence],
    places: &mut [Place],
    going: &[usize],
    want: &mut [usize],
) -> Result<Vec<Drafted>> {
    let v = draft.vocab();
    // each drafting sequence's logits for its next position
    let mut cur: Vec<Option<Vec<f32>>> = vec![None; going.len()];
    let mut behind: Vec<(usize, Vec<u32>)> = Vec::new();
    for (g, &i) in going.iter().enumerate() {
        if want[g] > 0 && !places[i].draft_behind.is_empty() {
            behind.push((g, std::mem::take(&mut places[i].draft_behind)));
        }
    }
    if !behind.is_empty() {
        let segs: Vec<(usize, &[u32])> = behind
            .iter()
            .map(|(g, t)| (going[*g], t.as_slice()))
            .collect();
        let rows = draft.extend(&segs)?;
        let mut at = 0;
        for (g, t) in &behind {
            at += t.len();
            cur[*g] = Some(rows[(at - 1) * v..at * v].to_vec());
        }
    }
    let mut out: Vec<Drafted> = going
        .iter()
        .enumerate()
        .map(|(g, &i)| {
            if cur[g].is_none() && want[g] > 0 {
                cur[g] = places[i].draft_row.take();
            }
            Drafted {
                base: draft.positions(i),
                ..Drafted::default()
            }
        })
        .collect();
    let most = want.iter().copied().max().unwrap_or(0);
    for j in 0..most {
        let live: Vec<usize> = (0..going.len())
            .filter(|&g| want[g] > j && cur[g].is_some())
            .collect();
        if live.is_empty() {
            break;
        }
        let mut rows = Vec::with_capacity(live.len() * v);
        let mut reqs = Vec::with_capacity(live.len());
        for &g in &live {
            let i = going[g];
            rows.extend_from_slice(cur[g].take().as_deref().unwrap_or_default());
            let mut had = places[i].drawn.clone();
            had.extend_from_slice(&out[g].tokens);
            reqs.push(seqs[i].request.request_after(places[i].seed, &had));
        }
        let results = sampler.sample(&Logits::f32(&rows, live.len(), v)?, &reqs)?;
        let mut next = Vec::new();
        for (&g, r) in live.iter().zip(results) {
            match r {
                Ok(s) => {
                    out[g].tokens.push(s.token);
                    if j + 1 < want[g] {
                        next.push(g);
                    }
                }
                // the draft cannot go on here: the target takes what it drafted
                Err(_) => want[g] = out[g].tokens.len(),
            }
        }
        if !next.is_empty() {
            let toks: Vec<[u32; 1]> = next.iter().map(|&g| [out[g].tokens[j]]).collect();
            let segs: Vec<(usize, &[u32])> = next
                .iter()
                .zip(&toks)
                .map(|(&g, t)| (going[g], &t[..]))
                .collect();
            let rows = draft.extend(&segs)?;
            for (r, &g) in next.iter().enumerate() {
                out[g].ran += 1;
                cur[g] = Some(rows[r * v..(r + 1) * v].to_vec());
            }
        }
    }
    Ok(out)
}

/// What the head did for one sequence in a round: accepted drafted tokens, each
/// position's result, and whether the sequence finished.
type RoundResult = (usize, Vec<RowResult>, Option<FinishReason>);

/// The head's part of a round: [`Head::verify`] for the sequences that drafted, one
/// [`Head::step`] for those that did not; `logits` holds each sequence's positions in
/// `going`'s order (drafted tokens + 1 each).
fn verify_round(
    head: &mut dyn Head,
    logits: &[f32],
    v: usize,
    going: &[usize],
    drafts: &[Vec<u32>],
) -> Result<Vec<RoundResult>> {
    let mut start = Vec::with_capacity(going.len());
    let mut at = 0;
    for d in drafts {
        start.push(at);
        at += d.len() + 1;
    }
    let all = Logits::f32(logits, at, v)?;
    let mut out: Vec<Option<RoundResult>> = vec![None; going.len()];
    let verifying: Vec<usize> = (0..going.len())
        .filter(|&g| !drafts[g].is_empty())
        .collect();
    if !verifying.is_empty() {
        let picked = crate::logits::Gathered::new(
            &all,
            verifying
                .iter()
                .flat_map(|&g| start[g]..start[g] + drafts[g].len() + 1),
        );
        let slots: Vec<usize> = verifying.iter().map(|&g| going[g]).collect();
        let ds: Vec<Vec<u32>> = verifying.iter().map(|&g| drafts[g].clone()).collect();
        let got = head.verify(&picked.view()?, &slots, &ds)?;
        for (&g, sv) in verifying.iter().zip(got) {
            out[g] = Some((sv.accepted, sv.results, sv.finished));
        }
    }
    let stepping: Vec<usize> = (0..going.len()).filter(|&g| drafts[g].is_empty()).collect();
    if !stepping.is_empty() {
        let picked = crate::logits::Gathered::new(&all, stepping.iter().map(|&g| start[g]));
        let slots: Vec<usize> = stepping.iter().map(|&g| going[g]).collect();
        let got = head.step(&picked.view()?, &slots)?;
        for (&g, st) in stepping.iter().zip(got) {
            out[g] = Some((0, vec![st.result], st.finished));
        }
    }
    Ok(out.into_iter().map(|o| o.unwrap_or_default()).collect())
}
