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

/// One row of a rejection verification: the row as plain decoding would send it for the
/// first drafted position, the drafted tokens, and how the drafter drew them.
#[derive(Debug, Clone, PartialEq)]
pub struct RejectRow {
    /// The target's parameters, seed, step (the first drafted position's) and history.
    pub request: Request,
    /// The K >= 1 drafted tokens, each `< V`.
    pub draft: Vec<u32>,
    /// The draft's parameters: its distribution p at position i is the processed
    /// distribution of its logits row i with these parameters and the target's seed,
    /// step and history at that position. `None`: the draft is one-hot (greedy and
    /// n-gram drafters: p(d_i) = 1).
    pub draft_params: Option<crate::params::SamplingParams>,
}

/// A processed distribution: (token, probability) in id order.
type Dist = Vec<(u32, f64)>;

/// The uniforms of a rejection verification at `step` (stream 2, apart from the draw's
/// noise and XTC's coin): word 0 decides the acceptance, word 1 the residual's draw.
fn reject_uniforms(seed: u64, step: u64) -> (f64, f64) {
    let c = [0, step as u32, (step >> 32) as u32, 2];
    let w = crate::philox::philox4x32_10(c, crate::philox::seed_key(seed));
    (
        f64::from(crate::philox::uniform(w[0])),
        f64::from(crate::philox::uniform(w[1])),
    )
}

/// Rejection verification (docs/CONTRACT.md): for drafts made elsewhere, with their
/// distributions. Position i of row r: q is the target's processed distribution
/// ([`crate::reference::processed_distribution`]) of `target` row `Σ_{s<r} (K_s + 1) + i`
/// at step `step + i` with the first i drafted tokens appended to the output, p the
/// draft's (row `Σ_{s<r} K_s + i` of `draft_logits` with the row's `draft_params`, or
/// one-hot). Drafted token d is accepted when `u p(d) <= q(d)` (u the position's
/// uniform); the first rejection emits a draw from `max(0, q - p)` normalised (inverse
/// CDF in id order with the second uniform), and K acceptances emit the target's plain
/// draw at position K. The emitted tokens are distributed exactly as the target's
/// sampling. Computed on the host from the contract's stages, so it is the same for every
/// backend; samples carry the token only.
pub fn verify_rejection(
    target: &Logits<'_>,
    rows: &[RejectRow],
    draft_logits: Option<&Logits<'_>>,
) -> Result<Vec<Verified>> {
    let vocab = target.vocab();
    let coupled: Vec<DraftRow> = rows
        .iter()
        .map(|r| DraftRow::new(r.request.clone(), r.draft.clone()))
        .collect();
    let reqs = position_requests(&coupled, vocab)?;
    if target.rows() != reqs.len() {
        return Err(Error::Shape(format!(
            "{} rows of target logits for {} positions: each row of the verification takes \
             its drafted tokens plus one",
            target.rows(),
            reqs.len()
        )));
    }
    let drafted: usize = rows.iter().map(|r| r.draft.len()).sum();
    let needs_logits = rows.iter().any(|r| r.draft_params.is_some());
    match draft_logits {
        Some(d) if d.rows() != drafted || d.vocab() != vocab => {
            return Err(Error::Shape(format!(
                "draft logits [{}, {}] for {drafted} drafted tokens of a vocabulary of {vocab}",
                d.rows(),
                d.vocab()
            )))
        }
        None if needs_logits => {
            return Err(Error::Shape(
                "rows with draft_params need draft logits (one row a drafted token)".into(),
            ))
        }
        _ => {}
    }
    for (r, row) in rows.iter().enumerate() {
        if let Some(p) = &row.draft_params {
            p.validate(r, vocab)?;
        }
    }
    // p at every drafted position first: a draft that gives its own token no probability
    // is the caller's error, before anything is drawn
    let mut ps: Vec<Vec<Option<Dist>>> = Vec::with_capacity(rows.len());
    let (mut at, mut dat) = (0, 0);
    let (mut x, mut xd) = (Vec::new(), Vec::new());
    for (r, row) in rows.iter().enumerate() {
        let mut per = Vec::with_capacity(row.draft.len());
        for (i, &d) in row.draft.iter().enumerate() {
            let p = match (&row.draft_params, draft_logits) {
                (Some(params), Some(dl)) => {
                    dl.row_to_f32(dat + i, &mut xd);
                    let mut q = reqs[at + i].clone();
                    q.params = params.clone();
                    match crate::reference::processed_distribution(&xd, &q) {
                        Ok(dist) => {
                            let pd = dist.iter().find(|e| e.0 == d).map_or(0.0, |e| e.1);
                            if pd <= 0.0 {
                                return Err(Error::InvalidParameter {
                                    row: r,
                                    field: "draft_logits",
                                    value: format!("p({d}) = 0 at position {i}"),
                                    expected: "a draft distribution that gives its own token a probability",
                                });
                            }
                            Some(dist)
                        }
                        Err(e) => {
                            return Err(Error::InvalidParameter {
                                row: r,
                                field: "draft_logits",
                                value: format!("position {i}: {e}"),
                                expected: "finite draft logits with a candidate",
                            })
                        }
                    }
                }
                _ => None,
            };
            per.push(p);
        }
        ps.push(per);
        at += row.draft.len() + 1;
        dat += row.draft.len();
    }
    let mut out = Vec::with_capacity(rows.len());
    let mut at = 0;
    for (r, row) in rows.iter().enumerate() {
        let mut v = Verified {
            accepted: 0,
            samples: Vec::new(),
            error: None,
        };
        for i in 0..=row.draft.len() {
            let q_req = &reqs[at + i];
            target.row_to_f32(at + i, &mut x);
            if i == row.draft.len() {
                // every drafted token stood: the target's own draw at position K
                match crate::reference::reference_row(&x, q_req).0 {
                    Ok(s) => v.samples.push(Sample::token(s.token, None)),
                    Err(e) => v.error = Some(e),
                }
                break;
            }
            let q = match crate::reference::processed_distribution(&x, q_req) {
                Ok(q) => q,
                Err(e) => {
                    v.error = Some(e);
                    break;
                }
            };
            let d = row.draft[i];
            let qd = q.iter().find(|e| e.0 == d).map_or(0.0, |e| e.1);
            let p = ps[r][i].as_deref();
            let pd = p.map_or(1.0, |p| p.iter().find(|e| e.0 == d).map_or(0.0, |e| e.1));
            let (u, w) = reject_uniforms(q_req.state.seed, q_req.state.step);
            if u * pd <= qd {
                v.accepted += 1;
                v.samples.push(Sample::token(d, None));
                continue;
            }
            // rejected: a draw from max(0, q - p), normalised, in id order
            let p_of = |t: u32| match p {
                None => f64::from(u8::from(t == d)),
                Some(p) => p.binary_search_by_key(&t, |e| e.0).map_or(0.0, |k| p[k].1),
            };
            let resid: Vec<(u32, f64)> = q
                .iter()
                .map(|&(t, qt)| (t, (qt - p_of(t)).max(0.0)))
                .filter(|e| e.1 > 0.0)
                .collect();
            let total: f64 = resid.iter().map(|e| e.1).sum();
            if total <= 0.0 {
                // (p >= q everywhere yet d rejected: only rounding gets here) the
                // target's own draw
                match crate::reference::reference_row(&x, q_req).0 {
                    Ok(s) => v.samples.push(Sample::token(s.token, None)),
                    Err(e) => v.error = Some(e),
                }
                break;
            }
            let goal = w * total;
            let mut cum = 0.0;
            let mut pick = resid[resid.len() - 1].0;
            for &(t, m) in &resid {
                cum += m;
                if cum > goal {
                    pick = t;
                    break;
                }
            }
            v.samples.push(Sample::token(pick, None));
            break;
        }
        at += row.draft.len() + 1;
        out.push(v);
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::params::SamplingParams;

    fn rows_of(x: &[f32], v: usize) -> Logits<'_> {
        Logits::f32(x, x.len() / v, v).unwrap()
    }

    /// The first emitted token of K = 1 rejection verifications over `n` seeds, counted
    /// per id, and the chi-square of those counts against q (the target's processed
    /// distribution at position 0).
    fn chi_square(
        target: &[f32],
        draft: Option<&[f32]>,
        params: &SamplingParams,
        d: u32,
        n: u64,
    ) -> f64 {
        let v = target.len() / 2;
        let mut counts = vec![0u64; v];
        // a drafter samples its token from p with randomness of its own
        let p = draft.map(|x| {
            crate::reference::processed_distribution(x, &Request::new(SamplingParams::default(), 0))
                .unwrap()
        });
        let mut rng = crate::testing::Rng::new(77);
        for seed in 0..n {
            let d = match &p {
                None => d,
                Some(p) => {
                    let u = f64::from(rng.unit());
                    let mut cum = 0.0;
                    p.iter()
                        .find(|e| {
                            cum += e.1;
                            cum > u
                        })
                        .map_or(p[p.len() - 1].0, |e| e.0)
                }
            };
            let row = RejectRow {
                request: Request::new(params.clone(), seed),
                draft: vec![d],
                draft_params: draft.map(|_| SamplingParams::default()),
            };
            let dl = draft.map(|x| rows_of(x, v));
            let got = verify_rejection(&rows_of(target, v), &[row], dl.as_ref()).unwrap();
            counts[got[0].samples[0].token as usize] += 1;
        }
        let q = crate::reference::processed_distribution(
            &target[..v],
            &Request::new(params.clone(), 0),
        )
        .unwrap();
        let mut qv = vec![0.0; v];
        for (t, p) in q {
            qv[t as usize] = p;
        }
        (0..v)
            .map(|t| {
                let e = qv[t] * n as f64;
                let o = counts[t] as f64;
                if e == 0.0 {
                    assert_eq!(o, 0.0, "token {t} outside q drawn");
                    0.0
                } else {
                    (o - e) * (o - e) / e
                }
            })
            .sum()
    }

    /// Rejection verification is distributed as the target's sampling: a draft far from
    /// the target (and a one-hot draft of an unlikely token) give first tokens whose
    /// counts pass a chi-square test against q at the 0.001 level over 40,000 seeds
    /// (df = 7: 24.32), where a 1% shift of mass between two tokens would give about 64;
    /// drafting the draft's own distribution instead fails it.
    #[test]
    fn rejection_is_distributed_as_the_target() {
        let target = [
            2.0f32, 1.5, 1.0, 0.5, 0.0, -0.5, -1.0, -1.5, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0,
        ];
        let draft = [-1.5f32, -1.0, -0.5, 0.0, 0.5, 1.0, 1.5, 2.0];
        let params = SamplingParams {
            temperature: 1.0,
            ..Default::default()
        };
        let n = 40_000;
        let c = chi_square(&target, Some(&draft), &params, 0, n);
        eprintln!("chi-square far {c}");
        assert!(c < 24.32, "draft far from q: chi-square {c}");
        let c = chi_square(&target, None, &params, 6, n);
        eprintln!("chi-square one-hot {c}");
        assert!(c < 24.32, "one-hot draft: chi-square {c}");
        // a sampler that accepted every drafted token would emit the draft's token
        let always: f64 = {
            let q = crate::reference::processed_distribution(
                &target[..8],
                &Request::new(params.clone(), 0),
            )
            .unwrap();
            let e = q[7].1 * n as f64;
            (n as f64 - e) * (n as f64 - e) / e
        };
        assert!(always > 1e4, "{always}");
    }

    /// p = q accepts everything; a greedy target accepts exactly its argmax and emits it
    /// on a rejection; a draft that gives its own token no probability is refused.
    #[test]
    fn rejection_edges() {
        let v = 6;
        let x: Vec<f32> = (0..3 * v).map(|i| ((i * 37 % 11) as f32) * 0.3).collect();
        let params = SamplingParams {
            temperature: 0.8,
            top_k: 4,
            ..Default::default()
        };
        for seed in 0..50 {
            // the draft is the target itself at the first two positions: every token it
            // draws (the coupled draw) stands
            let req = Request::new(params.clone(), seed);
            let coupled = verify_coupled(
                &crate::ReferenceSampler,
                &rows_of(&x, v),
                &[DraftRow::new(req.clone(), vec![0, 0])],
            )
            .unwrap();
            let mut draft = coupled[0].tokens();
            draft.truncate(1);
            if draft.is_empty() {
                continue;
            }
            let d0 = draft[0];
            let row = RejectRow {
                request: req.clone(),
                draft: vec![d0, 0],
                draft_params: Some(params.clone()),
            };
            let mut dl: Vec<f32> = x[..v].to_vec();
            dl.extend_from_slice(&x[v..2 * v]);
            // position 1's drafted token 0 may lie outside q (rejected): only position 0 is
            // p = q with a token of p's support
            let got = verify_rejection(&rows_of(&x, v), &[row], Some(&rows_of(&dl, v)));
            match got {
                Ok(g) => assert!(
                    g[0].accepted >= 1,
                    "seed {seed}: p = q rejected {d0}: {g:?}"
                ),
                Err(e) => assert!(e.to_string().contains("draft_logits"), "{e}"),
            }
        }
        // greedy target: argmax of row 0 is id with the largest value
        let greedy = SamplingParams::greedy();
        let argmax = (0..v)
            .max_by(|&a, &b| x[a].total_cmp(&x[b]).then(b.cmp(&a)))
            .unwrap() as u32;
        for d in 0..v as u32 {
            let row = RejectRow {
                request: Request::new(greedy.clone(), 3),
                draft: vec![d],
                draft_params: None,
            };
            let g = verify_rejection(&rows_of(&x[..2 * v], v), &[row], None).unwrap();
            assert_eq!(g[0].accepted, usize::from(d == argmax), "draft {d}");
            assert_eq!(g[0].samples[0].token, argmax, "draft {d}");
        }
        // p(d) = 0: top-k 1 of a draft row whose top is not d
        let row = RejectRow {
            request: Request::new(params.clone(), 1),
            draft: vec![(argmax + 1) % v as u32],
            draft_params: Some(SamplingParams {
                top_k: 1,
                ..Default::default()
            }),
        };
        let err = verify_rejection(
            &rows_of(&x[..2 * v], v),
            std::slice::from_ref(&row),
            Some(&rows_of(&x[..v], v)),
        )
        .unwrap_err();
        assert!(err.to_string().contains("draft_logits"), "{err}");
        let err = verify_rejection(&rows_of(&x[..2 * v], v), &[row], None).unwrap_err();
        assert!(err.to_string().contains("need draft logits"), "{err}");
    }
}
