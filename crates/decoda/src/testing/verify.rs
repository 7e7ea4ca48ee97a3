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

/// A head's verify step ([`crate::head::Head::verify`]) is plain decoding: a head of 4
/// slots over V = 300 (penalties on one, DRY on one, a stop id on one, `max_tokens` on
/// one) runs rounds of verify steps with K of 1 to 3; each slot's tokens, accepted
/// count and finish equal the CPU sampler's coupled verification of the same rows cut
/// where a step would stop, and after the rounds a plain step draws what the sampler
/// draws for the histories that implies. A draft of the wrong count or an id past V is
/// an error before any slot moves.
pub fn head_verify_is_plain_decoding(head: &mut dyn crate::head::Head) -> Result<(), String> {
    use crate::head::{FinishReason, SlotRequest};
    use crate::params::SamplingParams;
    let v = head.vocab();
    let cpu = crate::CpuSampler::new();
    let mut rng = Rng::new(90210);
    let mut mirror: Vec<Request> = Vec::new();
    let mut stops: Vec<Vec<u32>> = Vec::new();
    let mut max: Vec<Option<u64>> = Vec::new();
    for s in 0..4usize {
        let mut p = SamplingParams {
            temperature: 0.9,
            top_k: 60,
            ..Default::default()
        };
        if s == 1 {
            p.repetition_penalty = 1.5;
            p.frequency_penalty = 0.3;
        }
        if s == 3 {
            p.dry_multiplier = 0.8;
            p.dry_allowed_length = 1;
            // (a window the device head holds whatever the slot's length)
            p.dry_penalty_last_n = 64;
        }
        let prompt: Vec<u32> = (0..5).map(|_| rng.below(v as u64) as u32).collect();
        let mut req = SlotRequest::new(p.clone())
            .seed(100 + s as u64)
            .prompt(prompt.clone());
        // slot 2 stops at the ids the rows below favour, slot 0 after 2 tokens: each
        // finishes inside a draft of 3 that stands (round 0)
        let stop = if s == 2 { (0..8).collect() } else { Vec::new() };
        req = req.stop(stop.clone());
        if s == 0 {
            req = req.max_tokens(2);
        }
        head.join(s, req).map_err(|e| e.to_string())?;
        let mut r = Request::new(p, 100 + s as u64);
        r.state.prompt = prompt;
        mirror.push(r);
        stops.push(stop);
        max.push(if s == 0 { Some(2) } else { None });
    }
    let mut finished: Vec<Option<FinishReason>> = vec![None; 4];
    // slots that finished at a drafted token that stood, before the draft's end
    let mut inside = 0;
    let mut generated = [0u64; 4];
    let row = |rng: &mut Rng| -> Vec<f32> {
        (0..v)
            .map(|i| 2.0 * rng.normal() + if i < 8 { 2.5 } else { 0.0 })
            .collect()
    };
    for round in 0..5 {
        let live: Vec<usize> = (0..4).filter(|&s| finished[s].is_none()).collect();
        if live.is_empty() {
            break;
        }
        let mut data = Vec::new();
        let mut rows = Vec::new();
        for &s in &live {
            let k = if round == 0 && s % 2 == 0 {
                3
            } else {
                1 + rng.below(3) as usize
            };
            let pos: Vec<Vec<f32>> = (0..=k).map(|_| row(&mut rng)).collect();
            // drafts: plain decoding's own tokens in even rounds, random ones in odd
            let draft: Vec<u32> = if round % 2 == 0 {
                let mut q = mirror[s].clone();
                let mut toks = Vec::new();
                for (i, x) in pos.iter().take(k).enumerate() {
                    q.state.step = mirror[s].state.step + i as u64;
                    let l = Logits::f32(x, 1, v).map_err(|e| e.to_string())?;
                    let t = cpu
                        .sample(&l, std::slice::from_ref(&q))
                        .map_err(|e| e.to_string())?
                        .remove(0)
                        .map_or(0, |x| x.token);
                    q.state.output.push(t);
                    toks.push(t);
                }
                toks
            } else {
                (0..k).map(|_| rng.below(v as u64) as u32).collect()
            };
            for x in &pos {
                data.extend_from_slice(x);
            }
            rows.push(DraftRow::new(mirror[s].clone(), draft));
        }
        let n: usize = rows.iter().map(DraftRow::positions).sum();
        let l = Logits::f32(&data, n, v).map_err(|e| e.to_string())?;
        let want = verify_coupled(&cpu, &l, &rows).map_err(|e| e.to_string())?;
        let drafts: Vec<Vec<u32>> = rows.iter().map(|r| r.draft.clone()).collect();
        let got = head.verify(&l, &live, &drafts).map_err(|e| e.to_string())?;
        for (j, &s) in live.iter().enumerate() {
            // the sampler's tokens, cut where a step would stop the slot
            let mut toks = Vec::new();
            let mut fin = None;
            for x in &want[j].samples {
                toks.push(x.token);
                generated[s] += 1;
                if stops[s].contains(&x.token) {
                    fin = Some(FinishReason::Stop);
                } else if max[s].is_some_and(|m| generated[s] >= m) {
                    fin = Some(FinishReason::Length);
                }
                if fin.is_some() {
                    break;
                }
            }
            let accepted = want[j].accepted.min(toks.len());
            if fin.is_some() && toks.len() < want[j].samples.len() {
                inside += 1;
            }
            let g = &got[j];
            expect(
                g.slot == s && g.tokens() == toks && g.accepted == accepted && g.finished == fin,
                || {
                    format!(
                        "round {round} slot {s} (draft {:?}): head {:?} accepted {} finished {:?}; \
                         sampler {toks:?} accepted {accepted} finished {fin:?}",
                        drafts[j],
                        g.tokens(),
                        g.accepted,
                        g.finished
                    )
                },
            )?;
            expect(g.results.iter().all(|r| r.is_ok()), || {
                format!("round {round} slot {s}: {:?}", g.results)
            })?;
            finished[s] = fin;
            mirror[s].state.output.extend_from_slice(&toks);
            mirror[s].state.step += toks.len() as u64;
        }
    }
    expect(inside >= 2, || {
        format!("{inside} slots finished inside a draft that stood: the check needs both")
    })?;
    // the slots' state moved by exactly those tokens: a plain step of the live slots
    let live: Vec<usize> = (0..4).filter(|&s| finished[s].is_none()).collect();
    if !live.is_empty() {
        let data: Vec<f32> = live.iter().flat_map(|_| row(&mut rng)).collect();
        let l = Logits::f32(&data, live.len(), v).map_err(|e| e.to_string())?;
        let reqs: Vec<Request> = live.iter().map(|&s| mirror[s].clone()).collect();
        let want = cpu.sample(&l, &reqs).map_err(|e| e.to_string())?;
        let got = head.step(&l, &live).map_err(|e| e.to_string())?;
        for ((g, w), &s) in got.iter().zip(&want).zip(&live) {
            expect(&g.result == w, || {
                format!(
                    "slot {s} after the verify steps: head {:?}, sampler {w:?}",
                    g.result
                )
            })?;
        }
    }
    // bad drafts: nothing moves
    let free = (0..4).find(|&s| finished[s].is_none());
    if let Some(s) = free {
        let zeros = vec![0.0; 3 * v];
        let l = Logits::f32(&zeros, 3, v).map_err(|e| e.to_string())?;
        match head.verify(&l, &[s], &[vec![1, v as u32]]) {
            Err(Error::TokenOutOfRange {
                row: 0,
                field: "draft",
                ..
            }) => {}
            other => return Err(format!("a drafted id past V: {other:?}")),
        }
        match head.verify(&l, &[s], &[vec![1]]) {
            Err(Error::Shape(m)) if m.contains("3 rows of logits for 2 positions") => {}
            other => return Err(format!("logits for 3 positions, K = 1: {other:?}")),
        }
    }
    // no rows: nothing to verify, on every head alike
    if let Ok(l) = Logits::f32(&[], 0, v) {
        match head.verify(&l, &[], &[]) {
            Ok(out) if out.is_empty() => {}
            other => return Err(format!("a verify of no rows: {other:?}")),
        }
    }
    Ok(())
}
