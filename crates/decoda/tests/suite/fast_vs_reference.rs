//! The fast CPU path against the reference on many thousands of random rows and
//! parameter sets (proptest): identical tokens and logprobs (within 1e-5), except the
//! floating-point ties that the contract allows, which are counted.

use decoda::testing::{parity, random_case, Rng};
use decoda::CpuSampler;
use proptest::prelude::*;

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    /// 256 cases x 24 rows = 6144 random rows over vocabularies up to 20000.
    #[test]
    fn fast_path_matches_reference(seed in any::<u64>(), vocab in prop_oneof![1usize..16, 16usize..600, 8192usize..20_000]) {
        let mut rng = Rng::new(seed);
        let cases: Vec<_> = (0..24).map(|_| random_case(&mut rng, vocab)).collect();
        let p = parity(&CpuSampler::new(), &cases).map_err(TestCaseError::fail)?;
        prop_assert_eq!(p.same + p.allowed_ties, p.rows);
        prop_assert!(p.max_logprob_diff <= 1e-5);
    }
}

/// Large vocabularies exercise the sampled thresholds and the block passes.
#[test]
fn large_vocab_parity() {
    let mut rng = Rng::new(4242);
    let mut ties = 0;
    let mut rows = 0;
    for v in [32_000usize, 131_072] {
        let cases: Vec<_> = (0..40).map(|_| random_case(&mut rng, v)).collect();
        let p = parity(&CpuSampler::new(), &cases).unwrap();
        ties += p.allowed_ties;
        rows += p.rows;
    }
    eprintln!("{rows} rows, {ties} allowed ties");
}

/// Top-p without top-k over nuclei from a handful of tokens to most of the vocabulary:
/// the candidate gathering, its retries from lower thresholds and the whole-row fallback.
#[test]
fn top_p_nucleus_sizes_parity() {
    use decoda::testing::zipf_logits;
    use decoda::{LogprobsMode, Request, SamplingParams};
    let mut rng = Rng::new(77);
    let v = 50_000;
    let mut cases = Vec::new();
    for s in [0.2f32, 0.5, 0.8, 1.1, 1.5, 2.5] {
        for temperature in [0.5f32, 1.0, 2.0] {
            for top_p in [0.5f32, 0.9, 0.99] {
                let params = SamplingParams {
                    temperature,
                    top_p,
                    logprobs: Some(3),
                    logprobs_mode: LogprobsMode::Processed,
                    ..Default::default()
                };
                cases.push((
                    zipf_logits(&mut rng, v, s),
                    Request::new(params, cases.len() as u64),
                ));
            }
        }
    }
    let p = parity(&CpuSampler::new(), &cases).unwrap();
    assert_eq!(p.same + p.allowed_ties, p.rows);
    assert!(p.max_logprob_diff <= 1e-5);
}

/// Top-k rows without bias or penalties take a one-pass path (max, non-finite check and
/// candidate gathering together): its error and greedy exits against the reference.
#[test]
fn top_k_one_pass_edge_rows() {
    use decoda::testing::zipf_logits;
    use decoda::{LogprobsMode, Request, SamplingParams};
    let mut rng = Rng::new(5);
    for v in [300usize, 20_000] {
        let mut cases = Vec::new();
        for (case, k) in [1u32, 7, 50, 299].into_iter().enumerate() {
            for edit in 0..6 {
                let mut x = zipf_logits(&mut rng, v, 1.1);
                let at = (case * 977 + edit * 131) % v;
                match edit {
                    0 => {}
                    1 => x[at] = f32::NAN,
                    2 => x[at] = f32::INFINITY,
                    3 => x.iter_mut().for_each(|z| *z = f32::NEG_INFINITY),
                    4 => x[at] = f32::MAX, // max / T overflows: greedy
                    _ => x.iter_mut().step_by(3).for_each(|z| *z = f32::NEG_INFINITY),
                }
                let params = SamplingParams {
                    temperature: 0.7,
                    top_k: k,
                    logprobs: Some(2),
                    logprobs_mode: LogprobsMode::Processed,
                    ..Default::default()
                };
                cases.push((x, Request::new(params, (case * 10 + edit) as u64)));
            }
        }
        let p = parity(&CpuSampler::new(), &cases).unwrap();
        assert_eq!(p.same + p.allowed_ties, p.rows, "V = {v}");
    }
}

/// Top-p rows without top-k, bias or penalties take a one-pass path: the normaliser is
/// accumulated against the max of a strided sample while the candidates are gathered, and
/// a NaN or `+inf` only shows in that sum. Its error, overflow and fallback exits against
/// the reference (the values edited sit outside the sample and in it).
#[test]
fn top_p_one_pass_edge_rows() {
    use decoda::testing::zipf_logits;
    use decoda::{LogprobsMode, Request, SamplingParams};
    let mut rng = Rng::new(6);
    let v = 20_000;
    // the sample: 64 evenly spread runs of 16 neighbours
    let gap = v / 64;
    let mut cases = Vec::new();
    for (case, top_p) in [0.3f32, 0.9, 0.999].into_iter().enumerate() {
        for edit in 0..10 {
            let mut x = zipf_logits(&mut rng, v, 1.1);
            let off = 7 * gap + 100; // not a sampled position
            let on = 11 * gap + 5; // a sampled position
            match edit {
                0 => {}
                1 => x[off] = f32::NAN,
                2 => x[on] = f32::NAN,
                3 => x[off] = f32::INFINITY,
                // far above the sample's max: 2^w overflows against it
                4 => x[off] = 1e4,
                5 => x[off] = f32::MAX, // max / T overflows: greedy
                // the sample sees only -inf
                6 => (0..64).for_each(|c| x[c * gap..c * gap + 16].fill(f32::NEG_INFINITY)),
                7 => x.iter_mut().step_by(3).for_each(|z| *z = f32::NEG_INFINITY),
                8 => x.iter_mut().for_each(|z| *z = f32::NEG_INFINITY),
                // a flat row: the nucleus is most of the vocabulary
                _ => x.iter_mut().for_each(|z| *z = (*z * 1e-3).round()),
            }
            let params = SamplingParams {
                temperature: 0.7,
                top_p,
                logprobs: Some(2),
                logprobs_mode: LogprobsMode::Processed,
                ..Default::default()
            };
            cases.push((x, Request::new(params, (case * 10 + edit) as u64)));
        }
    }
    let p = parity(&CpuSampler::new(), &cases).unwrap();
    assert_eq!(p.same + p.allowed_ties, p.rows);
    assert!(p.max_logprob_diff <= 1e-5);
}

/// Top-p alone over 600 rows (vocabularies of 9,000 to 69,000; Zipf, normal and wide
/// logits; several temperatures and p): the one-pass normaliser, the bisection that
/// narrows the candidates and the exact nucleus against the reference.
#[test]
fn top_p_only_parity_many_rows() {
    use decoda::testing::zipf_logits;
    use decoda::{LogprobsMode, Request, SamplingParams};
    let mut rng = Rng::new(991);
    for batch in 0..12u64 {
        let v = 9000 + rng.below(60_000) as usize;
        let mut cases = Vec::new();
        for _ in 0..50 {
            let x: Vec<f32> = match rng.below(3) {
                0 => {
                    let s = 0.5 + 2.0 * rng.unit();
                    zipf_logits(&mut rng, v, s)
                }
                1 => (0..v).map(|_| 3.0 * rng.normal()).collect(),
                _ => (0..v).map(|_| 20.0 * rng.normal()).collect(),
            };
            let params = SamplingParams {
                temperature: [0.3f32, 0.7, 1.0, 1.5][rng.below(4) as usize],
                top_p: [0.1f32, 0.5, 0.8, 0.9, 0.95, 0.99][rng.below(6) as usize],
                logprobs: Some(2),
                logprobs_mode: LogprobsMode::Processed,
                ..Default::default()
            };
            cases.push((x, Request::new(params, batch * 100 + cases.len() as u64)));
        }
        let p = parity(&CpuSampler::new(), &cases).unwrap();
        assert_eq!(p.same + p.allowed_ties, p.rows, "batch {batch}, V = {v}");
        assert!(p.max_logprob_diff <= 1e-5);
    }
}

/// Top-p nuclei wider than the candidate lists (thousands of tokens to most of the row)
/// at real vocabulary sizes, through the batch call: the bucket masses, the edge walk and
/// the gated draw, with banned tokens, penalties, min-p and processed logprobs.
#[test]
fn wide_top_p_parity() {
    use decoda::testing::zipf_logits;
    use decoda::{LogprobsMode, Request, SamplingParams};
    let mut rng = Rng::new(77);
    for v in [32_000usize, 151_936] {
        let mut cases = Vec::new();
        for i in 0..24u64 {
            let mut x = zipf_logits(&mut rng, v, [0.9f32, 1.1, 1.3][i as usize % 3]);
            if i % 4 == 1 {
                for j in (0..v).step_by(53) {
                    x[j] = f32::NEG_INFINITY;
                }
            }
            let mut params = SamplingParams {
                temperature: [0.8f32, 1.0, 1.5][(i / 3) as usize % 3],
                top_p: [0.97f32, 0.99, 0.999, 0.9][(i / 2) as usize % 4],
                ..Default::default()
            };
            if i % 3 == 0 {
                params.logprobs = Some(3);
                params.logprobs_mode = LogprobsMode::Processed;
            }
            if i % 5 == 2 {
                params.min_p = 1e-5;
            }
            let mut req = Request::new(params, 500 + i);
            req.state.step = 3 * i;
            if i % 6 == 4 {
                req.params.repetition_penalty = 1.2;
                req.params.presence_penalty = 0.4;
                req.state.output = (0..64).map(|_| rng.below(v as u64) as u32).collect();
            }
            cases.push((x, req));
        }
        let p = parity(&CpuSampler::new(), &cases).unwrap();
        assert_eq!(p.same + p.allowed_ties, p.rows, "V = {v}");
        assert!(p.max_logprob_diff <= 1e-5);
    }
}

/// Top-p nuclei of about a thousand to tens of thousands of tokens at V = 131,072 (the
/// band where the candidate list is gathered again from a sampled threshold, or the whole
/// row is taken when the sample says the nucleus is wider than a list): the same token
/// as the reference, with banned tokens and processed logprobs on some rows.
#[test]
fn top_p_retry_band_parity() {
    use decoda::testing::zipf_logits;
    use decoda::{LogprobsMode, Request, SamplingParams};
    let mut rng = Rng::new(2026);
    let v = 131_072;
    let mut cases = Vec::new();
    for i in 0..36u64 {
        let mut x = zipf_logits(&mut rng, v, [1.1f32, 1.0, 1.2][i as usize % 3]);
        if i % 5 == 3 {
            for j in (0..v).step_by(41) {
                x[j] = f32::NEG_INFINITY;
            }
        }
        let mut params = SamplingParams {
            temperature: [0.8f32, 0.7, 1.0][(i / 3) as usize % 3],
            top_p: [0.95f32, 0.97, 0.98, 0.985][(i / 9) as usize % 4],
            ..Default::default()
        };
        if i % 4 == 0 {
            params.logprobs = Some(2);
            params.logprobs_mode = LogprobsMode::Processed;
        }
        let mut req = Request::new(params, 900 + i);
        req.state.step = i;
        cases.push((x, req));
    }
    let p = parity(&CpuSampler::new(), &cases).unwrap();
    assert_eq!(p.same + p.allowed_ties, p.rows);
    assert!(p.max_logprob_diff <= 1e-5);
}

/// The parity tests above again, in child processes whose kernels run their AVX2 and
/// baseline variants (`DECODA_ISA`), so every variant is checked against the reference
/// on one machine.
#[test]
fn parity_on_every_instruction_set() {
    let isa = decoda::cpu::kernels::isa();
    if let Ok(asked) = std::env::var("DECODA_ISA") {
        // a child: the variant asked for (or a lower one on a CPU without it) is in use
        assert!(
            asked == isa || isa == "base",
            "asked {asked}, running {isa}"
        );
        return;
    }
    crate::run_on_lower_isas(module_path!(), &[]);
}
