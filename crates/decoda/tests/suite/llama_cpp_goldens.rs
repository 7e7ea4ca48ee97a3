//! decoda's kept distribution against llama.cpp's own samplers.
//!
//! `tests/golden/llama_cpp_kept.jsonl` was written by `scripts/llama_cpp/make_goldens.sh`
//! (llama.cpp 0.3.36's `src/llama-sampler.cpp`, built from the llama-cpp-python sdist):
//! random logits and histories, each sampler applied in decoda's pipeline order, and the
//! surviving candidates with their probabilities. Every case must give decoda the same
//! kept set, size and order, with probabilities within 1e-6, on the reference and the
//! CPU sampler; only a case whose top-p or typical-p walk comes within 1e-6 of its mass
//! (a floating-point tie, which llama.cpp sums in f32) may differ, and there must be few.

use decoda::reference::reference_row;
use decoda::{Backend, CpuSampler, Logits, ReferenceSampler, Request, SamplingParams};
use serde_json::Value;

const GOLDEN: &str = include_str!("../golden/llama_cpp_kept.jsonl");

struct Case {
    stage: String,
    logits: Vec<f32>,
    request: Request,
    size: usize,
    kept: Vec<(u32, f64)>,
}

fn cases() -> Vec<Case> {
    GOLDEN
        .lines()
        .map(|line| {
            let v: Value = serde_json::from_str(line).expect("a JSON case");
            let mut params: SamplingParams = serde_json::from_value(v.clone()).expect("params");
            params.kept = Some(256);
            let ids = |key: &str| -> Vec<u32> {
                v[key]
                    .as_array()
                    .expect("ids")
                    .iter()
                    .map(|x| x.as_u64().expect("an id") as u32)
                    .collect()
            };
            let history = ids("history");
            let mut request = Request::new(params, 0);
            // Penalties count the output only; without them the history is split
            // between prompt and output, which DRY reads as one sequence.
            let p = &request.params;
            let split = if p.repetition_penalty == 1.0
                && p.frequency_penalty == 0.0
                && p.presence_penalty == 0.0
            {
                history.len() / 2
            } else {
                0
            };
            request.state.prompt = history[..split].to_vec();
            request.state.output = history[split..].to_vec();
            Case {
                stage: v["stage"].as_str().expect("stage").to_string(),
                logits: v["logits"]
                    .as_array()
                    .expect("logits")
                    .iter()
                    .map(|x| x.as_f64().expect("a logit") as f32)
                    .collect(),
                request,
                size: v["candidates"].as_u64().expect("candidates") as usize,
                kept: v["top"]
                    .as_array()
                    .expect("top")
                    .iter()
                    .map(|e| (e[0].as_u64().unwrap() as u32, e[1].as_f64().unwrap()))
                    .collect(),
            }
        })
        .collect()
}

fn check(backend: &dyn Backend) {
    let cases = cases();
    assert_eq!(cases.len(), 160, "the golden file holds 160 cases");
    let (mut ties, mut checked) = (0, 0);
    for (n, c) in cases.iter().enumerate() {
        let (_, tie) = reference_row(&c.logits, &c.request);
        if tie.is_top_p_tie() {
            ties += 1;
            continue;
        }
        let logits = Logits::f32(&c.logits, 1, c.logits.len()).unwrap();
        let got = backend
            .sample(&logits, std::slice::from_ref(&c.request))
            .unwrap()
            .remove(0)
            .unwrap_or_else(|e| panic!("case {n} ({}): {e}", c.stage));
        let kept = got.kept.expect("kept asked");
        let what = format!("{}: case {n} ({})", backend.name(), c.stage);
        assert_eq!(kept.size as usize, c.size, "{what}: kept set size");
        assert_eq!(kept.top.len(), c.kept.len(), "{what}: listed");
        for (i, (k, want)) in kept.top.iter().zip(&c.kept).enumerate() {
            assert_eq!(k.id, want.0, "{what}: id at {i}");
            assert!(
                (f64::from(k.p) - want.1).abs() <= 1e-6,
                "{what}: p of {} is {} in decoda, {} in llama.cpp",
                k.id,
                k.p,
                want.1
            );
        }
        // the drawn token is in the kept set
        assert!(
            kept.size as usize != c.size || c.size > 256 || c.kept.iter().any(|e| e.0 == got.token),
            "{what}: token {} outside the kept set",
            got.token
        );
        checked += 1;
    }
    assert!(ties <= 4, "{ties} cases within 1e-6 of a walk's mass");
    assert!(checked >= 150);
}

#[test]
fn reference_matches_llama_cpp() {
    check(&ReferenceSampler);
}

#[test]
fn cpu_matches_llama_cpp() {
    check(&CpuSampler::new());
}
