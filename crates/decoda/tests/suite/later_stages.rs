//! The later stages through the CPU sampling head: slots with DRY, top-n-σ, typical-p,
//! XTC and the kept distribution, stepped 40 times over fresh logits, give each slot the
//! reference's token and kept set for its history at every step (the head's DRY reads
//! the history it extends itself).

use decoda::head::{Head, SlotRequest};
use decoda::reference::reference_row;
use decoda::testing::{classify, Rng, Verdict};
use decoda::{CpuHead, Logits, Request, SamplingParams, SequenceState};

#[test]
fn cpu_head_runs_the_later_stages() {
    let (slots, v) = (4usize, 2000usize);
    let mut head = CpuHead::new(slots, v).unwrap();
    let params = [
        SamplingParams {
            dry_multiplier: 1.5,
            dry_allowed_length: 1,
            dry_sequence_breakers: vec![vec![7]],
            kept: Some(8),
            ..SamplingParams::default()
        },
        SamplingParams {
            top_n_sigma: 1.5,
            typical_p: 0.9,
            ..SamplingParams::default()
        },
        SamplingParams {
            xtc_probability: 0.5,
            xtc_threshold: 0.05,
            top_k: 40,
            kept: Some(40),
            ..SamplingParams::default()
        },
        SamplingParams {
            dry_multiplier: 0.8,
            typical_p: 0.5,
            xtc_probability: 1.0,
            temperature: 0.7,
            ..SamplingParams::default()
        },
    ];
    let mut states = Vec::new();
    for (slot, p) in params.iter().enumerate() {
        let prompt: Vec<u32> = (0..30).map(|i| (i * 7 % 11) as u32).collect();
        head.join(
            slot,
            SlotRequest::new(p.clone())
                .seed(slot as u64 + 5)
                .prompt(prompt.clone()),
        )
        .unwrap();
        let mut s = SequenceState::new(slot as u64 + 5);
        s.prompt = prompt;
        states.push(s);
    }
    let mut rng = Rng::new(8);
    let rows: Vec<usize> = (0..slots).collect();
    for step in 0..40 {
        // peaked rows over a few ids, so that repeats (and DRY) happen
        let mut data = vec![0.0f32; slots * v];
        for x in data.iter_mut() {
            *x = rng.normal();
        }
        for r in 0..slots {
            for id in 0..12 {
                data[r * v + id] += 6.0 + rng.normal();
            }
        }
        let out = head
            .step(&Logits::f32(&data, slots, v).unwrap(), &rows)
            .unwrap();
        for (r, got) in out.iter().enumerate() {
            let req = Request {
                params: params[r].clone(),
                state: states[r].clone(),
                allowed: None,
            };
            let (want, tie) = reference_row(&data[r * v..(r + 1) * v], &req);
            assert!(
                !matches!(classify(&got.result, &want, &tie), Verdict::Mismatch),
                "step {step} slot {r}: {:?} vs reference {want:?}",
                got.result
            );
            states[r].push(got.result.as_ref().unwrap().token);
        }
    }
}

/// Token masks through the CPU head: slots with a fixed mask of their own and without,
/// steps with per-step masks for some rows and steps with none (where the CPU sampler
/// masks each slot's row itself, with no copy of the batch), penalties, top-p and
/// logprobs: each slot's result is the reference's for the two masks combined, and no
/// disallowed token is ever drawn.
#[test]
fn cpu_head_applies_slot_and_step_masks() {
    let (slots, v) = (3usize, 3000usize);
    let words = v.div_ceil(32);
    let mut rng = Rng::new(21);
    let mut random_mask = |dense: bool| -> Vec<u32> {
        (0..words)
            .map(|w| match (w % 5, dense) {
                (0, _) => u32::MAX,
                (1, false) => 0,
                _ => (rng.next_u64() as u32) | (rng.next_u64() as u32),
            })
            .collect()
    };
    let own = [Some(random_mask(true)), None, Some(random_mask(false))];
    let step_masks: Vec<Vec<u32>> = (0..4).map(|i| random_mask(i % 2 == 0)).collect();
    let params = SamplingParams {
        temperature: 0.9,
        top_p: 0.9,
        repetition_penalty: 1.2,
        logprobs: Some(3),
        ..SamplingParams::default()
    };
    let mut head = CpuHead::new(slots, v).unwrap();
    let mut states = Vec::new();
    for (slot, mask) in own.iter().enumerate() {
        let mut req = SlotRequest::new(params.clone())
            .seed(slot as u64 + 40)
            .prompt(vec![5, 6, 7]);
        if let Some(m) = mask {
            req = req.allowed(m.clone());
        }
        head.join(slot, req).unwrap();
        let mut s = SequenceState::new(slot as u64 + 40);
        s.prompt = vec![5, 6, 7];
        states.push(s);
    }
    let mut rng = Rng::new(22);
    let rows: Vec<usize> = (0..slots).collect();
    for step in 0..30 {
        let data: Vec<f32> = (0..slots * v).map(|_| 2.0 * rng.normal()).collect();
        // every third step has no step masks; the others mask some rows
        let masks: Vec<Option<&[u32]>> = (0..slots)
            .map(|r| match (step % 3, (step + r) % 2) {
                (0, _) | (_, 0) => None,
                _ => Some(step_masks[(step + r) % 4].as_slice()),
            })
            .collect();
        let out = head
            .step_masked(&Logits::f32(&data, slots, v).unwrap(), &rows, &masks)
            .unwrap();
        for (r, got) in out.iter().enumerate() {
            let both: Option<Vec<u32>> = match (&own[r], masks[r]) {
                (Some(a), Some(b)) => Some(a.iter().zip(b).map(|(x, y)| x & y).collect()),
                (Some(a), None) => Some(a.clone()),
                (None, Some(b)) => Some(b.to_vec()),
                (None, None) => None,
            };
            let req = Request {
                params: params.clone(),
                state: states[r].clone(),
                allowed: both.clone(),
            };
            let (want, tie) = reference_row(&data[r * v..(r + 1) * v], &req);
            assert!(
                !matches!(classify(&got.result, &want, &tie), Verdict::Mismatch),
                "step {step} slot {r}: {:?} vs reference {want:?}",
                got.result
            );
            let token = got.result.as_ref().unwrap().token as usize;
            if let Some(m) = &both {
                assert_eq!(m[token / 32] >> (token % 32) & 1, 1, "step {step} slot {r}");
            }
            states[r].push(token as u32);
        }
    }
}

/// XTC on the CPU's streaming path: rows with top-k or min-p (whose kept set the path
/// holds as a list) and XTC whose coin fires, with penalties and processed
/// log-probabilities, at decode vocabularies, equal the reference (ties counted), and
/// XTC changed a good share of them.
#[test]
fn cpu_xtc_on_the_kept_list_matches_the_reference() {
    use decoda::testing::zipf_logits;
    use decoda::{Backend, CpuSampler, LogprobsMode};
    let cpu = CpuSampler::new();
    let (mut rows, mut acted, mut ties) = (0, 0, 0);
    for v in [32_000usize, 151_936] {
        let mut rng = Rng::new(v as u64 + 3);
        for r in 0..48 {
            let mut x = zipf_logits(&mut rng, v, [1.1f32, 1.4][r % 2]);
            if r % 3 == 0 {
                for peak in [14.0f32, 13.5, 13.0, 13.0] {
                    x[rng.below(v as u64) as usize] = peak;
                }
            }
            let mut p = SamplingParams {
                xtc_probability: [1.0f32, 0.5][(r / 2) % 2],
                xtc_threshold: [0.01f32, 0.05, 0.1, 0.2][(r / 4) % 4],
                temperature: [0.5f32, 0.8, 1.2][r % 3],
                ..SamplingParams::default()
            };
            match r % 4 {
                0 => p.top_k = 40,
                1 => p.min_p = 0.05,
                2 => {
                    p.top_k = 5000;
                    p.repetition_penalty = 1.3;
                    p.logprobs = Some(3);
                    p.logprobs_mode = LogprobsMode::Processed;
                }
                _ => {
                    p.top_k = 50;
                    p.top_p = 0.9;
                    p.min_p = 0.02;
                    p.logprobs = Some(2);
                    p.logprobs_mode = LogprobsMode::Processed;
                }
            }
            let mut req = Request::new(p, rng.below(1 << 40));
            req.state.step = rng.below(1000);
            req.state.output = (0..20).map(|_| rng.below(v as u64) as u32).collect();
            let got = cpu
                .sample(&Logits::f32(&x, 1, v).unwrap(), std::slice::from_ref(&req))
                .unwrap()
                .remove(0);
            let (want, tie) = reference_row(&x, &req);
            match classify(&got, &want, &tie) {
                Verdict::Mismatch => panic!("V {v} row {r}: {got:?} vs {want:?} ({tie:?})"),
                Verdict::AllowedTie => ties += 1,
                Verdict::Same { .. } => {}
            }
            let mut off = req.clone();
            off.params.xtc_probability = 0.0;
            off.params.logprobs = Some(3);
            off.params.logprobs_mode = LogprobsMode::Processed;
            let mut on = req.clone();
            on.params.logprobs = Some(3);
            on.params.logprobs_mode = LogprobsMode::Processed;
            if reference_row(&x, &off).0 != reference_row(&x, &on).0 {
                acted += 1;
            }
            rows += 1;
        }
    }
    assert!(ties * 10 <= rows, "{ties} ties in {rows} rows");
    assert!(
        acted * 4 >= rows,
        "XTC acted on only {acted} of {rows} rows"
    );
}
