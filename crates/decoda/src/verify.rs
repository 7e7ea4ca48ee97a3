//! Speculative decoding's verification (docs/CONTRACT.md, "Verifying drafted tokens").
//!
//! A drafter proposes K tokens for a row; the target model scores K + 1 positions in one
//! forward; [`verify_coupled`] decides which drafted tokens stand. Position i of a row is
//! sampled exactly as plain decoding samples it: the row's request at step `step + i`,
//! its output extended by the i drafted tokens before it (so penalties, DRY and per-position
//! masks apply as they would), with the same noise. A drafted token is accepted while it
//! equals that draw; the row emits the accepted tokens and one more draw (the first
//! disagreement's, or position K's when all K were accepted). Those are the tokens of
//! K + 1 plain steps, bit for bit, for every seed and every stage: a draft can only make
//! decoding faster, never different.
//!
//! All positions of every row are one call of [`Backend::sample`] (a position's history is
//! the drafted prefix, which is the accepted one whenever that position's draw counts), so
//! every backend verifies: the reference, the CPU sampler and the device sampler.

use crate::backend::Backend;
use crate::error::{Error, Result, RowError};
use crate::logits::Logits;
use crate::params::Request;
use crate::pipeline::Sample;

/// One row of a verification: the row as plain decoding would send it for the first
/// drafted position, and the tokens a drafter proposed after it.
#[derive(Debug, Clone, PartialEq)]
pub struct DraftRow {
    /// The row's parameters, seed, step (the first drafted position's) and history; its
    /// `allowed` mask applies at every position unless [`DraftRow::masks`] gives them.
    pub request: Request,
    /// The K >= 1 drafted tokens, each `< V`.
    pub draft: Vec<u32>,
    /// Per-position token masks, K + 1 of them (position i's as the grammar stands after
    /// the first i drafted tokens), replacing `request.allowed`; empty: `request.allowed`
    /// at every position.
    pub masks: Vec<Option<Vec<u32>>>,
}

impl DraftRow {
    /// A row drafting `draft` after `request`, with the request's mask at every position.
    pub fn new(request: Request, draft: Vec<u32>) -> Self {
        Self {
            request,
            draft,
            masks: Vec::new(),
        }
    }

    /// Positions this row takes in the call: its drafted tokens plus one.
    pub fn positions(&self) -> usize {
        self.draft.len() + 1
    }
}

/// What a verified row emits.
#[derive(Debug, Clone, PartialEq)]
pub struct Verified {
    /// How many drafted tokens were accepted (0 ..= K).
    pub accepted: usize,
    /// The tokens emitted, in order, each as [`Backend::sample`] returns it at that
    /// position (log-probabilities and the kept distribution included when the row asks
    /// for them): the accepted drafted tokens, then the target's own draw at the next
    /// position. `accepted + 1` samples, or `accepted` when that position has a row error.
    pub samples: Vec<Sample>,
    /// The row error of the position after the accepted ones, when it has one: plain
    /// decoding would stop there with it.
    pub error: Option<RowError>,
}

impl Verified {
    /// The emitted token ids.
    pub fn tokens(&self) -> Vec<u32> {
        self.samples.iter().map(|s| s.token).collect()
    }
}

/// The requests of every position of a coupled verification, row after row: row r's
/// position i is its request at step `step + i` with the first i drafted tokens appended
/// to its output, and position i's mask. Validates each row (as row r of the call) and
/// its draft: K >= 1, drafted ids `< V`, K + 1 masks when any are given.
pub fn position_requests(rows: &[DraftRow], vocab: usize) -> Result<Vec<Request>> {
    let mut out = Vec::with_capacity(rows.iter().map(DraftRow::positions).sum());
    for (r, row) in rows.iter().enumerate() {
        check_draft(r, row, vocab)?;
        for i in 0..row.positions() {
            let mut q = row.request.clone();
            q.state.step = row.request.state.step.wrapping_add(i as u64);
            q.state.output.extend_from_slice(&row.draft[..i]);
            if !row.masks.is_empty() {
                q.allowed = row.masks[i].clone();
            }
            q.validate(r, vocab)?;
            out.push(q);
        }
    }
    Ok(out)
}

/// Row `r`'s drafted tokens against the contract: at least one, every id below V.
pub fn check_tokens(r: usize, draft: &[u32], vocab: usize) -> Result<()> {
    if draft.is_empty() {
        return Err(Error::InvalidParameter {
            row: r,
            field: "draft",
            value: "[] (K = 0)".into(),
            expected: "at least one drafted token",
        });
    }
    if let Some(&id) = draft.iter().find(|&&t| t as usize >= vocab) {
        return Err(Error::TokenOutOfRange {
            row: r,
            field: "draft",
            id: id.into(),
            vocab,
        });
    }
    Ok(())
}

/// Row `r`'s draft against the contract: its tokens ([`check_tokens`]) and K + 1 masks
/// or none.
fn check_draft(r: usize, row: &DraftRow, vocab: usize) -> Result<()> {
    check_tokens(r, &row.draft, vocab)?;
    if !row.masks.is_empty() && row.masks.len() != row.positions() {
        return Err(Error::InvalidParameter {
            row: r,
            field: "masks",
            value: format!("{} masks for K = {}", row.masks.len(), row.draft.len()),
            expected: "K + 1 masks (one a position), or none",
        });
    }
    Ok(())
}

/// Coupled verification: `logits` holds every row's K + 1 positions, row after row (row
/// r's position i at logits row `Σ_{s<r} (K_s + 1) + i`). Returns per row the accepted
/// count and the tokens K + 1 plain steps of `backend` would give up to and including the
/// first disagreement. Whole-call problems are an [`Err`] before any work, naming the row
/// and the field.
pub fn verify_coupled(
    backend: &dyn Backend,
    logits: &Logits<'_>,
    rows: &[DraftRow],
) -> Result<Vec<Verified>> {
    let reqs = position_requests(rows, logits.vocab())?;
    if logits.rows() != reqs.len() {
        return Err(Error::Shape(format!(
            "{} rows of logits for {} positions: each row of the verification takes its \
             drafted tokens plus one",
            logits.rows(),
            reqs.len()
        )));
    }
    let results = backend.sample(logits, &reqs)?;
    Ok(accept(rows, results))
}

/// Walks each row's position results in order: drafted tokens stand while they equal the
/// draw at their position; the first that does not (or position K) emits the draw.
pub fn accept(rows: &[DraftRow], results: Vec<crate::RowResult>) -> Vec<Verified> {
    let mut it = results.into_iter();
    rows.iter()
        .map(|row| {
            let mut v = Verified {
                accepted: 0,
                samples: Vec::with_capacity(row.positions()),
                error: None,
            };
            let mut done = false;
            for i in 0..row.positions() {
                let res = it.next().expect("one result a position");
                if done {
                    continue;
                }
                match res {
                    Ok(s) => {
                        let agrees = i < row.draft.len() && s.token == row.draft[i];
                        v.samples.push(s);
                        if agrees {
                            v.accepted += 1;
                        } else {
                            done = true;
                        }
                    }
                    Err(e) => {
                        v.error = Some(e);
                        done = true;
                    }
                }
            }
            v
        })
        .collect()
}
