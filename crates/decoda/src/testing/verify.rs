//! Conformance check of speculative decoding's coupled verification ([`crate::verify`]):
//! on any backend, verifying a draft gives the tokens K + 1 plain decoding steps of that
//! backend give, whatever the draft, and bad drafts are refused by name.

use super::{expect, random_case, Rng};
use crate::backend::Backend;
use crate::error::Error;
use crate::logits::Logits;
use crate::params::Request;
use crate::pipeline::RowResult;
use crate::verify::{verify_coupled, DraftRow, Verified};

/// Plain decoding of every row over its K + 1 positions (`pos[r][i]`): position i of the
/// rows still going drawn in one call at step `step + i`, each row's output extended by
/// the tokens it drew before; a row stops at its first row error.
fn plain(
    b: &dyn Backend,
    pos: &[Vec<Vec<f32>>],
    reqs: &[Request],
) -> Result<Vec<Vec<RowResult>>, String> {
    let mut out: Vec<Vec<RowResult>> = vec![Vec::new(); reqs.len()];
    let mut cur: Vec<Request> = reqs.to_vec();
    let most = pos.iter().map(Vec::len).max().unwrap_or(0);
    for i in 0..most {
        let going: Vec<usize> = (0..reqs.len())
            .filter(|&r| i < pos[r].len() && out[r].iter().all(|x| x.is_ok()))
            .collect();
        if going.is_empty() {
            break;
        }
        let v = pos[going[0]][i].len();
        let data: Vec<f32> = going
            .iter()
            .flat_map(|&r| pos[r][i].iter().copied())
            .collect();
        let at: Vec<Request> = going
            .iter()
            .map(|&r| {
                let mut q = cur[r].clone();
                q.state.step = reqs[r].state.step.wrapping_add(i as u64);
                q
            })
            .collect();
        let l = Logits::f32(&data, going.len(), v).map_err(|e| e.to_string())?;
        let res = b.sample(&l, &at).map_err(|e| e.to_string())?;
        for (&r, x) in going.iter().zip(res) {
            if let Ok(s) = &x {
                cur[r].state.output.push(s.token);
            }
            out[r].push(x);
        }
    }
    Ok(out)
}

/// What verifying `draft` must give, from plain decoding's results: its draws while the
/// draft agrees, then the first that does not (or the last position's), or the first row
/// error.
fn expected(plain: &[RowResult], draft: &[u32]) -> Verified {
    let mut v = Verified {
        accepted: 0,
        samples: Vec::new(),
        error: None,
    };
    for (i, r) in plain.iter().enumerate() {
        match r {
            Err(e) => {
                v.error = Some(*e);
                break;
            }
            Ok(s) => {
                v.samples.push(s.clone());
                if i < draft.len() && s.token == draft[i] {
                    v.accepted += 1;
                } else {
                    break;
                }
            }
        }
    }
    v
}

/// Coupled verification is plain decoding: rows of random logits, parameters (penalties
/// and DRY among them, which read the drafted history), K of 1 to 4, drafts that are
/// plain decoding's own tokens (all accepted), that leave it at a random position, or
/// that are random; one call verifies every row. Bad drafts are errors naming the row.
pub fn verify_coupled_is_plain_decoding(b: &dyn Backend) -> Result<(), String> {
    let mut rng = Rng::new(5757);
    for v in [2usize, 9, 300, 4099] {
        let mut reqs = Vec::new();
        let mut pos = Vec::new();
        for r in 0..9 {
            let (x0, mut req) = random_case(&mut rng, v);
            req.params.logprobs = req.params.logprobs.filter(|_| r % 2 == 0);
            if r % 3 == 1 {
                // DRY and a repetition penalty: the drafted history changes the logits
                req.params.dry_multiplier = 0.8;
                req.params.dry_allowed_length = 1;
                req.params.repetition_penalty = 1.3;
            }
            let k = 1 + rng.below(4) as usize;
            let mut p = vec![x0];
            for _ in 0..k {
                p.push(random_case(&mut rng, v).0);
            }
            reqs.push(req);
            pos.push(p);
        }
        let plains = plain(b, &pos, &reqs)?;
        let mut rows = Vec::new();
        let mut data = Vec::new();
        let mut want = Vec::new();
        for (r, (p, req)) in plains.iter().zip(reqs).enumerate() {
            let k = pos[r].len() - 1;
            let toks: Vec<u32> = p
                .iter()
                .filter_map(|s| s.as_ref().ok())
                .map(|s| s.token)
                .collect();
            let mut draft: Vec<u32> = (0..k).map(|i| toks.get(i).copied().unwrap_or(0)).collect();
            match r % 3 {
                // plain decoding's tokens: every one accepted (up to a row error)
                0 => {}
                // plain decoding's tokens, one changed
                1 => {
                    let j = rng.below(k as u64) as usize;
                    draft[j] = (draft[j] + 1 + rng.below(v as u64 - 1) as u32) % v as u32;
                }
                // random tokens
                _ => {
                    for t in &mut draft {
                        *t = rng.below(v as u64) as u32;
                    }
                }
            }
            want.push(expected(p, &draft));
            for x in &pos[r] {
                data.extend_from_slice(x);
            }
            rows.push(DraftRow::new(req, draft));
        }
        let n: usize = rows.iter().map(DraftRow::positions).sum();
        let l = Logits::f32(&data, n, v).map_err(|e| e.to_string())?;
        let got = verify_coupled(b, &l, &rows).map_err(|e| e.to_string())?;
        for (r, (g, w)) in got.iter().zip(&want).enumerate() {
            expect(g == w, || {
                format!(
                    "V={v} row {r} (draft {:?}): verified {:?} accepted, {:?}, error {:?}; \
                     plain decoding {:?} accepted, {:?}, error {:?}",
                    rows[r].draft,
                    g.accepted,
                    g.tokens(),
                    g.error,
                    w.accepted,
                    w.tokens(),
                    w.error
                )
            })?;
        }
        // every row drafted its plain tokens exactly in the first kind: K accepted
        // unless a position had a row error
        for (r, w) in want.iter().enumerate().step_by(3) {
            expect(
                w.error.is_some() || w.accepted == rows[r].draft.len(),
                || {
                    format!(
                        "V={v} row {r}: plain decoding's own draft accepted {}",
                        w.accepted
                    )
                },
            )?;
        }
    }
    // bad drafts: no token, an id past V, masks for the wrong count of positions, and
    // logits for another count of positions, each an error before any work
    let v = 5;
    let x = vec![0.5f32; 3 * v];
    let l = Logits::f32(&x, 3, v).map_err(|e| e.to_string())?;
    let ok = DraftRow::new(Request::new(Default::default(), 1), vec![1, 2]);
    let mut empty = ok.clone();
    empty.draft.clear();
    match verify_coupled(b, &l, &[empty]) {
        Err(Error::InvalidParameter {
            row: 0,
            field: "draft",
            ..
        }) => {}
        other => return Err(format!("K = 0: {other:?}")),
    }
    let mut far = ok.clone();
    far.draft[1] = v as u32;
    match verify_coupled(b, &l, &[ok.clone(), far]) {
        Err(Error::TokenOutOfRange {
            row: 1,
            field: "draft",
            id: 5,
            ..
        }) => {}
        other => return Err(format!("a drafted id past V: {other:?}")),
    }
    let mut masks = ok.clone();
    masks.masks = vec![None; 2];
    match verify_coupled(b, &l, &[masks]) {
        Err(Error::InvalidParameter {
            row: 0,
            field: "masks",
            ..
        }) => {}
        other => return Err(format!("2 masks for K = 2: {other:?}")),
    }
    let short = Logits::f32(&x[..2 * v], 2, v).map_err(|e| e.to_string())?;
    match verify_coupled(b, &short, std::slice::from_ref(&ok)) {
        Err(Error::Shape(m)) if m.contains("2 rows of logits for 3 positions") => {}
        other => return Err(format!("2 logits rows for K = 2: {other:?}")),
    }
    let got = verify_coupled(b, &l, &[ok]).map_err(|e| e.to_string())?;
    expect(
        got.len() == 1 && got[0].samples.len() == got[0].accepted + 1,
        || format!("a flat row: {got:?}"),
    )?;
    Ok(())
}
