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
