//! Conformance checks of the stages after the first ones: DRY, top-n-σ, typical-p, XTC
//! and the kept distribution. Each stage alone on a row whose answer is worked out by
//! hand, then every stage combined with every other at random against the reference.

use super::{expect, random_case, sample1, Rng};
use crate::backend::Backend;
use crate::logits::Logits;
use crate::params::{Request, SamplingParams};
use crate::pipeline::{self as pl, RowResult};

/// The ids of a row's kept distribution, most likely first.
fn kept_ids(r: &RowResult) -> Result<Vec<u32>, String> {
    let s = r.as_ref().map_err(|e| format!("row error {e}"))?;
    let k = s.kept.as_ref().ok_or("no kept distribution returned")?;
    Ok(k.top.iter().map(|t| t.id).collect())
}

fn ln_probs(p: &[f32]) -> Vec<f32> {
    p.iter().map(|v| v.ln()).collect()
}

/// DRY penalises the token that would extend a repeat, by `multiplier *
/// base^(length - allowed)`, reads prompt and output as one sequence, stops at a
/// breaker, and leaves a single-token breaker itself unpenalised.
pub fn stage_dry(b: &dyn Backend) -> Result<(), String> {
    // history 1 2 3 1 2: "1 2" repeats, and 3 followed it
    let x = [0.0, 0.0, 0.0, 0.5, 0.0];
    let p = SamplingParams {
        dry_multiplier: 1.0,
        dry_base: 2.0,
        dry_allowed_length: 2,
        ..SamplingParams::greedy()
    };
    let mut req = Request::new(p.clone(), 1);
    req.state.prompt = vec![1, 2, 3];
    req.state.output = vec![1, 2];
    let t = super::token1(b, &x, &req)?;
    expect(t == 0, || {
        format!("DRY should push token 3 (0.5 - 1) below 0: drew {t}")
    })?;
    // a longer repeat: 1 2 3 4 1 2 3 -> token 4 extends a repeat of 3, penalty 2^1
    let x = [0.0, 0.0, 0.0, 0.0, 1.9];
    req.state.prompt = vec![1, 2, 3, 4];
    req.state.output = vec![1, 2, 3];
    let t = super::token1(b, &x, &req)?;
    expect(t == 0, || {
        format!("a repeat of 3 costs 2: token 4 at 1.9 should lose, drew {t}")
    })?;
    let x = [0.0, 0.0, 0.0, 0.0, 2.1];
    let t = super::token1(b, &x, &req)?;
    expect(t == 4, || {
        format!("token 4 at 2.1 - 2 should still win, drew {t}")
    })?;
    // a breaker inside the repeat limits its length: "3" breaks, so 1 2 3 | ... no repeat
    let mut brk = req.clone();
    brk.params.dry_sequence_breakers = vec![vec![3]];
    let x = [0.0, 0.0, 0.0, 0.0, 1.9];
    let t = super::token1(b, &x, &brk)?;
    expect(t == 4, || {
        format!("the breaker should end the repeat: drew {t}")
    })?;
    // a window shorter than the repeat: only the last 2 tokens are scanned
    let mut short = req.clone();
    short.params.dry_penalty_last_n = 2;
    let t = super::token1(b, &x, &short)?;
    expect(t == 4, || {
        format!("a window of 2 holds no repeat: drew {t}")
    })?;
    // multiplier 0 or last_n 0: off
    for off in [
        SamplingParams {
            dry_multiplier: 0.0,
            ..req.params.clone()
        },
        SamplingParams {
            dry_penalty_last_n: 0,
            ..req.params.clone()
        },
    ] {
        let r = Request {
            params: off,
            ..req.clone()
        };
        let t = super::token1(b, &x, &r)?;
        expect(t == 4, || {
            format!("DRY off should leave token 4 on top: drew {t}")
        })?;
    }
    // empty history, history of breakers only: nothing to penalise
    let mut empty = req.clone();
    empty.state.prompt.clear();
    empty.state.output.clear();
    let t = super::token1(b, &x, &empty)?;
    expect(t == 4, || format!("no history: drew {t}"))?;
    let mut breakers = req.clone();
    breakers.params.dry_sequence_breakers = vec![vec![1], vec![2], vec![3], vec![4]];
    let t = super::token1(b, &x, &breakers)?;
    expect(t == 4, || format!("a history of breakers: drew {t}"))
}

/// Top-n-σ keeps `y >= ymax - n σ`: a small `n` keeps only the top of a spread row, a
/// large one everything; `-inf` tokens do not count in σ.
pub fn stage_top_n_sigma(b: &dyn Backend) -> Result<(), String> {
    // values 0 0 0 0 10: mean 2, σ 4; n = 1 keeps y >= 6 (token 4 only)
    let x = [0.0, 0.0, 0.0, 0.0, 10.0, f32::NEG_INFINITY];
    let p = SamplingParams {
        top_n_sigma: 1.0,
        kept: Some(10),
        ..SamplingParams::default()
    };
    let r = sample1(b, &x, &Request::new(p.clone(), 3))?;
    let ids = kept_ids(&r)?;
    expect(ids == [4], || {
        format!("top-n-σ 1 kept {ids:?}, expected [4]")
    })?;
    // n = 2.6 keeps y >= 10 - 10.4: all five finite tokens
    let p2 = SamplingParams {
        top_n_sigma: 2.6,
        ..p.clone()
    };
    let r = sample1(b, &x, &Request::new(p2, 3))?;
    let ids = kept_ids(&r)?;
    expect(ids == [4, 0, 1, 2, 3], || {
        format!("top-n-σ 2.6 kept {ids:?}, expected [4, 0, 1, 2, 3]")
    })
}

/// Typical-p keeps the tokens closest to the entropy until their mass exceeds `p`: on
/// probabilities 1/2 1/4 1/8 1/8 (entropy 1.75 ln 2) token 1 comes first, then token 0.
pub fn stage_typical_p(b: &dyn Backend) -> Result<(), String> {
    let x = ln_probs(&[0.5, 0.25, 0.125, 0.125]);
    for (p, want) in [
        (0.2f32, vec![1u32]),
        (0.5, vec![0, 1]),
        (0.9, vec![0, 1, 2, 3]),
    ] {
        let params = SamplingParams {
            typical_p: p,
            kept: Some(8),
            ..SamplingParams::default()
        };
        let r = sample1(b, &x, &Request::new(params, 5))?;
        let ids = kept_ids(&r)?;
        expect(ids == want, || {
            format!("typical-p {p} kept {ids:?}, expected {want:?}")
        })?;
    }
    Ok(())
}

/// XTC, when its coin comes up, removes every top choice (`q >= threshold`) but the
/// least likely; with one top choice nothing; its coin is Philox stream 1.
pub fn stage_xtc(b: &dyn Backend) -> Result<(), String> {
    let x = ln_probs(&[0.4, 0.3, 0.2, 0.1]);
    for (threshold, want) in [(0.15f32, vec![2u32, 3]), (0.35, vec![0, 1, 2, 3])] {
        let params = SamplingParams {
            xtc_probability: 1.0,
            xtc_threshold: threshold,
            kept: Some(8),
            ..SamplingParams::default()
        };
        let r = sample1(b, &x, &Request::new(params, 9))?;
        let ids = kept_ids(&r)?;
        expect(ids == want, || {
            format!("XTC at threshold {threshold} kept {ids:?}, expected {want:?}")
        })?;
    }
    // probability 0.5: fires exactly on the steps whose coin is at most 0.5
    let params = SamplingParams {
        xtc_probability: 0.5,
        xtc_threshold: 0.15,
        kept: Some(8),
        ..SamplingParams::default()
    };
    let (mut fired, steps) = (0, 64u64);
    for step in 0..steps {
        let mut req = Request::new(params.clone(), 77);
        req.state.step = step;
        let ids = kept_ids(&sample1(b, &x, &req)?)?;
        let fires = pl::xtc_coin(77, step) <= 0.5;
        fired += usize::from(fires);
        let want: &[u32] = if fires { &[2, 3] } else { &[0, 1, 2, 3] };
        expect(ids == want, || {
            format!("step {step}: XTC kept {ids:?}, coin says {want:?}")
        })?;
    }
    expect((16..=48).contains(&fired), || {
        format!("XTC at 0.5 fired on {fired} of {steps} steps")
    })
}

/// The kept distribution: its size, its most likely tokens first with the processed
/// probabilities, a greedy row's single token at 1, and the drawn token in the set.
pub fn kept_distribution(b: &dyn Backend) -> Result<(), String> {
    let x = ln_probs(&[0.1, 0.4, 0.2, 0.3]);
    let params = SamplingParams {
        top_k: 3,
        kept: Some(2),
        ..SamplingParams::default()
    };
    let r = sample1(b, &x, &Request::new(params.clone(), 2))?;
    let s = r.map_err(|e| e.to_string())?;
    let k = s.kept.ok_or("no kept distribution")?;
    expect(k.size == 3, || format!("kept size {} for top-k 3", k.size))?;
    let want = [(1u32, 0.4f32 / 0.9), (3, 0.3 / 0.9)];
    expect(k.top.len() == 2, || {
        format!("{} listed, 2 asked", k.top.len())
    })?;
    for (got, want) in k.top.iter().zip(want) {
        expect(got.id == want.0 && (got.p - want.1).abs() < 1e-6, || {
            format!("kept {got:?}, expected {want:?}")
        })?;
    }
    expect([1, 2, 3].contains(&s.token), || {
        format!("drew {} outside S", s.token)
    })?;
    let greedy = SamplingParams {
        kept: Some(5),
        ..SamplingParams::greedy()
    };
    let s = sample1(b, &x, &Request::new(greedy, 2))?.map_err(|e| e.to_string())?;
    let k = s.kept.ok_or("no kept distribution")?;
    expect(
        k.size == 1 && k.top.len() == 1 && k.top[0].id == 1 && k.top[0].p == 1.0,
        || format!("greedy kept {k:?}"),
    )
}

/// A random case with the later stages switched on at random.
pub fn random_staged_case(rng: &mut Rng, vocab: usize) -> (Vec<f32>, Request) {
    let (x, mut req) = random_case(rng, vocab);
    let pick = |rng: &mut Rng, opts: &[f32]| opts[rng.below(opts.len() as u64) as usize];
    let p = &mut req.params;
    p.top_n_sigma = pick(rng, &[0.0, 0.0, 0.5, 1.0, 2.5]);
    p.typical_p = pick(rng, &[1.0, 1.0, 0.3, 0.7, 0.95]);
    p.xtc_probability = pick(rng, &[0.0, 0.0, 0.5, 1.0]);
    p.xtc_threshold = pick(rng, &[0.05, 0.1, 0.3, 0.6]);
    if rng.below(2) == 0 {
        p.dry_multiplier = pick(rng, &[0.5, 1.0, 3.0]);
        p.dry_base = pick(rng, &[1.0, 1.75, 3.0]);
        p.dry_allowed_length = rng.below(4) as u32;
        p.dry_penalty_last_n = [-1, 0, 3, 16][rng.below(4) as usize];
        for _ in 0..rng.below(3) {
            let len = 1 + rng.below(3) as usize;
            let seq = (0..len)
                .map(|_| rng.below(vocab.min(6) as u64) as u32)
                .collect();
            p.dry_sequence_breakers.push(seq);
        }
        // repeats: a history over a few ids
        let ids = vocab.min(6) as u64;
        req.state.prompt = (0..rng.below(20)).map(|_| rng.below(ids) as u32).collect();
        req.state.output = (0..rng.below(20)).map(|_| rng.below(ids) as u32).collect();
    }
    if rng.below(2) == 0 {
        req.params.kept = Some([0, 1, 5, 64, 1024][rng.below(5) as usize]);
    }
    (x, req)
}

/// Every later stage combined with every other and with the first ones, on random rows
/// of 1 to 5,000 tokens, agrees with the reference except allowed ties.
pub fn later_stages_match_reference(b: &dyn Backend) -> Result<(), String> {
    let mut rng = Rng::new(4242);
    for v in [1usize, 2, 7, 64, 1000, 5000] {
        let cases: Vec<_> = (0..if v > 1000 { 60 } else { 240 })
            .map(|_| random_staged_case(&mut rng, v))
            .collect();
        super::parity(b, &cases).map_err(|e| format!("V={v}: {e}"))?;
    }
    Ok(())
}

/// Every later parameter out of range is a whole-call error naming field, value and row.
pub fn later_parameters_name_field_value_row(b: &dyn Backend) -> Result<(), String> {
    let x = [0.0f32; 8];
    let base = SamplingParams::default();
    let cases: Vec<(SamplingParams, &str)> = vec![
        (
            SamplingParams {
                top_n_sigma: -1.0,
                ..base.clone()
            },
            "top_n_sigma",
        ),
        (
            SamplingParams {
                top_n_sigma: f32::NAN,
                ..base.clone()
            },
            "top_n_sigma",
        ),
        (
            SamplingParams {
                typical_p: 0.0,
                ..base.clone()
            },
            "typical_p",
        ),
        (
            SamplingParams {
                typical_p: 1.5,
                ..base.clone()
            },
            "typical_p",
        ),
        (
            SamplingParams {
                xtc_probability: -0.1,
                ..base.clone()
            },
            "xtc_probability",
        ),
        (
            SamplingParams {
                xtc_threshold: 2.0,
                ..base.clone()
            },
            "xtc_threshold",
        ),
        (
            SamplingParams {
                dry_multiplier: -1.0,
                ..base.clone()
            },
            "dry_multiplier",
        ),
        (
            SamplingParams {
                dry_multiplier: f32::INFINITY,
                ..base.clone()
            },
            "dry_multiplier",
        ),
        (
            SamplingParams {
                dry_base: 0.5,
                ..base.clone()
            },
            "dry_base",
        ),
        (
            SamplingParams {
                dry_penalty_last_n: -2,
                ..base.clone()
            },
            "dry_penalty_last_n",
        ),
        (
            SamplingParams {
                dry_sequence_breakers: vec![vec![]],
                ..base.clone()
            },
            "dry_sequence_breakers",
        ),
        (
            SamplingParams {
                dry_sequence_breakers: vec![vec![3, 99]],
                ..base.clone()
            },
            "dry_sequence_breakers",
        ),
        (
            SamplingParams {
                kept: Some(1025),
                ..base.clone()
            },
            "kept",
        ),
    ];
    for (params, field) in cases {
        let reqs = vec![
            Request::new(base.clone(), 1),
            Request::new(base.clone(), 1),
            Request::new(params.clone(), 1),
        ];
        let data: Vec<f32> = x.iter().cycle().take(24).copied().collect();
        let l = Logits::f32(&data, 3, 8).map_err(|e| e.to_string())?;
        match b.sample(&l, &reqs) {
            Ok(_) => return Err(format!("{field}: {params:?} was accepted")),
            Err(e) => {
                let msg = e.to_string();
                expect(msg.contains(field) && msg.contains("row 2"), || {
                    format!("{field}: the error {msg:?} does not name the field and row 2")
                })?;
            }
        }
    }
    Ok(())
}
