//! Speculative decoding's checks, written once for every backend's [`Forward`] (the
//! CPU's in `cargo test`): the K + 1-position forward gives every position the logits a
//! one-position call gives, bit for bit, also after rejected positions are dropped; and
//! speculative generation emits plain decoding's tokens, log-probabilities and finishes
//! for a mix of stages, stops and lengths, with a draft that mostly agrees and one that
//! does not.

use std::path::Path;
use std::sync::Arc;

use crate::backend::Backend;
use crate::head::{Head, SlotRequest};
use crate::model::generate::{generate_until, CheckedSequences, Sequence};
use crate::model::qwen3_moe::Qwen3Moe;
use crate::model::speculate::{generate_speculative, Forward};
use crate::moe::Affine;
use crate::params::SamplingParams;
use crate::pipeline::TokenLogprobs;
use crate::testing::model::MakeEngine;
use crate::testing::tiny::TinySpec;

/// Builds a backend's model for speculative decoding with `slots` slots.
pub type MakeForward<'a> = &'a dyn Fn(Arc<Qwen3Moe>, usize) -> Result<Box<dyn Forward>, String>;

/// Builds a backend's sampling head with `slots` slots of `vocab` tokens.
pub type MakeHead<'a> = &'a dyn Fn(usize, usize) -> Result<Box<dyn Head>, String>;

fn write(spec: TinySpec, dir: &Path, name: &str) -> Result<std::path::PathBuf, String> {
    let d = dir.join(name);
    spec.write(&d).map_err(|e| e.to_string())?;
    Ok(d)
}

fn bits(rows: &[f32]) -> Vec<u32> {
    rows.iter().map(|x| x.to_bits()).collect()
}

/// Two slots run five and three tokens as one call each; every row equals, bit for bit,
/// the row of one-token calls of both slots at that position; after dropping a slot's
/// last three positions, running them again gives the same rows. For an f32 checkpoint
/// whose MoE layers sort every call of more than one token, and with `every_format` bf16
/// and 4-bit (q4g64) ones too.
pub fn forward_is_position_invariant(
    make: MakeForward<'_>,
    dir: &Path,
    every_format: bool,
) -> Result<(), String> {
    let specs = [
        ("f32", TinySpec::default()),
        (
            "bf16",
            TinySpec {
                dtype: "bf16".into(),
                seed: 3,
                ..TinySpec::default()
            },
        ),
        (
            "q4g64",
            TinySpec {
                quantize: Affine::parse("q4g64"),
                seed: 4,
                ..TinySpec::default()
            },
        ),
    ];
    let formats = if every_format { specs.len() } else { 1 };
    for (name, spec) in specs.into_iter().take(formats) {
        let v = spec.vocab as u32;
        let model = Arc::new(
            // a sort cutoff of 1: a call of more than one token would sort, unless the
            // forward keeps every row on the one-row branch as it must
            Qwen3Moe::load(&write(spec, dir, &format!("inv-{name}"))?, 1)
                .map_err(|e| e.to_string())?,
        );
        let prompts: [&[u32]; 2] = [&[256, 5, 6, 7], &[1, 2]];
        let toks: [Vec<u32>; 2] = [
            (0..5).map(|s| (s * 37 + 11) % v).collect(),
            (0..3).map(|s| (s * 53 + 200) % v).collect(),
        ];
        let err = |e: crate::Error| format!("{name}: {e}");
        let mut one = make(Arc::clone(&model), 2)?;
        let mut many = make(Arc::clone(&model), 2)?;
        for (s, p) in prompts.iter().enumerate() {
            let a = one.prefill(s, p).map_err(err)?;
            let b = many.prefill(s, p).map_err(err)?;
            if bits(&a) != bits(&b) {
                return Err(format!("{name}: slot {s}: two prefills differ"));
            }
        }
        // one token a call (slot 1 stops after its three)
        let mut alone: [Vec<Vec<f32>>; 2] = [Vec::new(), Vec::new()];
        for j in 0..5 {
            let segs: Vec<(usize, &[u32])> = (0..2)
                .filter(|&s| j < toks[s].len())
                .map(|s| (s, &toks[s][j..=j]))
                .collect();
            let rows = one.extend(&segs).map_err(err)?;
            let vu = v as usize;
            for (r, &(s, _)) in segs.iter().enumerate() {
                alone[s].push(rows[r * vu..(r + 1) * vu].to_vec());
            }
        }
        let vu = v as usize;
        let check = |rows: &[f32], s: usize, from: usize, what: &str| -> Result<(), String> {
            for (j, row) in rows.chunks_exact(vu).enumerate() {
                if bits(row) != bits(&alone[s][from + j]) {
                    return Err(format!(
                        "{name}: {what}: slot {s}, position {} differs from the one-token call's",
                        from + j
                    ));
                }
            }
            Ok(())
        };
        let rows = many
            .extend(&[(0, &toks[0][..]), (1, &toks[1][..])])
            .map_err(err)?;
        check(&rows[..5 * vu], 0, 0, "5 + 3 tokens in one call")?;
        check(&rows[5 * vu..], 1, 0, "5 + 3 tokens in one call")?;
        // rejected positions dropped and run again
        let at = many.positions(0);
        many.truncate(0, at - 3).map_err(err)?;
        let rows = many.extend(&[(0, &toks[0][2..])]).map_err(err)?;
        check(&rows, 0, 2, "after dropping 3 positions")?;
        if many.positions(0) != at || many.positions(1) != prompts[1].len() + 3 {
            return Err(format!(
                "{name}: positions {} and {} after the calls; expected {at} and {}",
                many.positions(0),
                many.positions(1),
                prompts[1].len() + 3
            ));
        }
        if many.truncate(1, many.positions(1) + 1).is_ok() {
            return Err(format!(
                "{name}: keeping more positions than held was accepted"
            ));
        }
    }
    Ok(())
}

/// The contract's "same log-probabilities" across backends: ranks and listed tokens
/// equal, values within `1e-5` relative (a plain run's head may be another backend's).
fn logprobs_close(a: &TokenLogprobs, b: &TokenLogprobs) -> bool {
    let near = |x: f32, y: f32| (x - y).abs() <= 1e-5 * x.abs().max(1.0);
    a.rank == b.rank
        && near(a.logprob, b.logprob)
        && a.top.len() == b.top.len()
        && a.top.iter().zip(&b.top).all(|(x, y)| {
            near(x.logprob, y.logprob) && (x.token == y.token || x.logprob == y.logprob)
        })
}

fn mix() -> Vec<Sequence> {
    let p = |f: fn(&mut SamplingParams)| {
        let mut s = SamplingParams::default();
        f(&mut s);
        s
    };
    vec![
        Sequence {
            prompt: vec![256, 72, 101, 108],
            request: SlotRequest::new(p(|s| s.temperature = 0.0))
                .seed(1)
                .max_tokens(30),
        },
        Sequence {
            prompt: vec![40, 41, 42, 43, 44, 45],
            request: SlotRequest::new(p(|s| {
                s.temperature = 0.9;
                s.top_p = 0.95;
                s.repetition_penalty = 1.1;
                s.presence_penalty = 0.3;
                s.logprobs = Some(2);
            }))
            .seed(11)
            .max_tokens(25),
        },
        Sequence {
            prompt: vec![7],
            request: SlotRequest::new(p(|s| {
                s.temperature = 1.0;
                s.top_k = 40;
                s.dry_multiplier = 0.8;
                s.dry_allowed_length = 2;
            }))
            .seed(12)
            .max_tokens(20),
        },
        // the third's prompt again: prefilled once and copied (a fork)
        Sequence {
            prompt: vec![7],
            request: SlotRequest::new(p(|s| {
                s.temperature = 0.7;
                s.min_p = 0.05;
            }))
            .seed(13)
            .max_tokens(1),
        },
    ]
}

/// Speculative generation's outputs (tokens and finishes exactly, log-probabilities as
/// the contract compares backends') equal plain decoding's on `engine` for four
/// sequences of different stages and lengths (one of a single token, one sharing
/// another's prompt), a stop id met in a drafted run, and a stop closure (a stop
/// string's stand-in), with each K of `ks`, for a draft that perturbs the target's
/// weights (acceptance above 0.3) and, with `unrelated_too`, an unrelated smaller one
/// (below the perturbed one's). K = 0 and a draft of another vocabulary are errors.
pub fn speculative_is_plain(
    make: MakeForward<'_>,
    head: MakeHead<'_>,
    engine: MakeEngine<'_>,
    sampler: &dyn Backend,
    ks: &[usize],
    unrelated_too: bool,
    dir: &Path,
) -> Result<(), String> {
    let target = Arc::new(
        Qwen3Moe::load(&write(TinySpec::default(), dir, "target")?, 16)
            .map_err(|e| e.to_string())?,
    );
    let close = TinySpec {
        perturb: 0.05,
        ..TinySpec::default()
    };
    let unrelated = TinySpec {
        seed: 9,
        layers: 1,
        hidden: 32,
        dense_layers: Vec::new(),
        ..TinySpec::default()
    };
    let mut drafts = vec![("perturbed", write(close, dir, "close")?)];
    if unrelated_too {
        drafts.push(("unrelated", write(unrelated, dir, "unrelated")?));
    }
    let mut seqs = mix();
    let v = target.config.vocab_size;
    let checked = |seqs: &[Sequence]| {
        CheckedSequences::new(std::borrow::Cow::Owned(seqs.to_vec()), v, seqs.len(), None)
            .map_err(|e| e.to_string())
    };
    let mut e = engine(Arc::clone(&target), seqs.len(), 128)?;
    let mut plain = generate_until(e.as_mut(), &seqs, &mut |_| {}, &mut |i, t: &[u32]| {
        i == 0 && t.len() == 13
    })
    .map_err(|e| e.to_string())?;
    // a stop id the third sequence draws at its 9th token: plain decoding with it stops
    // there (the sequences are independent), which the speculative runs must do too
    let stop_id = plain.outputs[2].tokens[8];
    seqs[2].request.stop = vec![stop_id];
    let out = &mut plain.outputs[2];
    let first = out.tokens.iter().position(|&t| t == stop_id).unwrap_or(8);
    out.tokens.truncate(first + 1);
    out.logprobs.truncate(first + 1);
    out.finish = Some(crate::head::FinishReason::Stop);
    plain.decode_tokens = plain.outputs.iter().map(|o| o.tokens.len()).sum();
    let mut acceptance = Vec::new();
    for (what, d) in &drafts {
        let draft = Arc::new(Qwen3Moe::load(d, 16).map_err(|e| e.to_string())?);
        for &k in ks {
            let mut t = make(Arc::clone(&target), seqs.len())?;
            let mut dm = make(Arc::clone(&draft), seqs.len())?;
            let mut h = head(seqs.len(), v)?;
            let r = generate_speculative(
                t.as_mut(),
                h.as_mut(),
                dm.as_mut(),
                sampler,
                k,
                &checked(&seqs)?,
                &mut |_| {},
                &mut |i, t: &[u32]| i == 0 && t.len() == 13,
            )
            .map_err(|e| format!("{what} draft, K = {k}: {e}"))?;
            for (i, (s, p)) in r.report.outputs.iter().zip(&plain.outputs).enumerate() {
                if s.tokens != p.tokens || s.finish != p.finish || s.error != p.error {
                    return Err(format!(
                        "{what} draft, K = {k}: sequence {i}: {:?} ({:?}) vs plain {:?} ({:?})",
                        s.tokens, s.finish, p.tokens, p.finish
                    ));
                }
                let close = s.logprobs.len() == p.logprobs.len()
                    && s.logprobs
                        .iter()
                        .zip(&p.logprobs)
                        .all(|(a, b)| logprobs_close(a, b));
                if !close {
                    return Err(format!(
                        "{what} draft, K = {k}: sequence {i}: log-probabilities differ"
                    ));
                }
            }
            if r.report.decode_tokens != plain.decode_tokens {
                return Err(format!(
                    "{what} draft, K = {k}: {} tokens counted; plain {}",
                    r.report.decode_tokens, plain.decode_tokens
                ));
            }
            acceptance.push((what, k, r.acceptance()));
        }
    }
    let (close_min, far_max) = (
        acceptance[..ks.len()]
            .iter()
            .map(|a| a.2)
            .fold(1.0, f64::min),
        acceptance[ks.len()..]
            .iter()
            .map(|a| a.2)
            .fold(0.0, f64::max),
    );
    if close_min <= 0.3 || (unrelated_too && far_max >= close_min) {
        return Err(format!(
            "acceptance (draft, K, fraction): {acceptance:?}: expected the perturbed draft's \
             above 0.3 and the unrelated one's below it"
        ));
    }
    // bad input
    let draft = Arc::new(Qwen3Moe::load(&drafts[0].1, 16).map_err(|e| e.to_string())?);
    let mut t = make(Arc::clone(&target), seqs.len())?;
    let mut dm = make(Arc::clone(&draft), seqs.len())?;
    let mut h = head(seqs.len(), v)?;
    let e = generate_speculative(
        t.as_mut(),
        h.as_mut(),
        dm.as_mut(),
        sampler,
        0,
        &checked(&seqs)?,
        &mut |_| {},
        &mut |_, _| false,
    );
    if !matches!(&e, Err(x) if x.to_string().contains("K = 0")) {
        return Err(format!("K = 0: {:?}", e.map(|r| r.drafted)));
    }
    let other = Arc::new(
        Qwen3Moe::load(
            &write(
                TinySpec {
                    vocab: 400,
                    ..TinySpec::default()
                },
                dir,
                "v400",
            )?,
            16,
        )
        .map_err(|e| e.to_string())?,
    );
    let mut dm = make(other, seqs.len())?;
    let e = generate_speculative(
        t.as_mut(),
        h.as_mut(),
        dm.as_mut(),
        sampler,
        2,
        &checked(&seqs)?,
        &mut |_| {},
        &mut |_, _| false,
    );
    if !matches!(&e, Err(x) if x.to_string().contains("V = 400")) {
        return Err(format!("a draft of V = 400: {:?}", e.map(|r| r.drafted)));
    }
    Ok(())
}
