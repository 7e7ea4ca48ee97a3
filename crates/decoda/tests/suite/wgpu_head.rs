//! The sampling head on the device: the same tokens as `CpuSampler` driven by hand (64
//! slots, joins and leaves, stops, long penalised histories, 300 steps), nothing written
//! by the host across steps of an unchanged batch, steps recorded ahead of their
//! readbacks, and the token buffer a model's next step reads.

use decoda::head::{FinishReason, Head, SlotRequest};
use decoda::testing::head::head_matches_sequences;
use decoda::testing::Rng;
use decoda::wgpu::{DeviceLogits, WgpuHead, WgpuSampler};
use decoda::{Backend, CpuSampler, DType, Logits, Request, SamplingParams, SequenceState};

/// A fresh sampler on the calling thread's shared test device (`decoda::testing::gpu`).
fn sampler() -> Option<WgpuSampler> {
    decoda::testing::gpu::sampler()
}

/// The device head's verify step (speculative decoding) is plain decoding: each slot's
/// tokens, accepted count and finish are the CPU sampler's coupled verification cut where
/// a step would stop it, and the slots' device state moves by exactly those tokens.
#[test]
fn head_verify_is_plain_decoding() {
    let Some(s) = sampler() else { return };
    let mut head = WgpuHead::new(&s, 4, 300).unwrap();
    decoda::testing::verify::head_verify_is_plain_decoding(&mut head)
        .unwrap_or_else(|e| panic!("{e}"));
}

#[test]
fn head_matches_driven_sequences() {
    let Some(s) = sampler() else { return };
    let mut head = WgpuHead::new(&s, 64, 3000).unwrap();
    // 300 steps in the full tier; 60 already hold every event (on the CPU head with this
    // seed: 116 joins, 54 leaves, 25 stops, 27 lengths)
    let steps = if decoda::testing::full_tier() {
        300
    } else {
        60
    };
    let t = head_matches_sequences(&mut head, steps, 4000, 99).unwrap_or_else(|e| panic!("{e}"));
    eprintln!("wgpu head: {t:?}");
    assert!(t.stops > 0 && t.lengths > 0 && t.leaves > 0, "{t:?}");
}

#[test]
fn head_at_a_real_vocabulary() {
    let Some(s) = sampler() else { return };
    let mut head = WgpuHead::new(&s, 8, 151_936).unwrap();
    let t = head_matches_sequences(&mut head, 25, 3000, 7).unwrap_or_else(|e| panic!("{e}"));
    eprintln!("wgpu head, V = 151936: {t:?}");
}

/// After the joins, 100 steps over logits on the device write nothing from the host, and
/// every step's tokens are CpuSampler's for the slot's state (recorded 8 steps ahead of
/// the readbacks).
#[test]
fn steps_write_nothing_from_the_host() {
    let Some(s) = sampler() else { return };
    let (slots, v) = (6usize, 5000usize);
    let mut head = WgpuHead::new(&s, slots, v).unwrap();
    let mut rng = Rng::new(3);
    let mut states = Vec::new();
    for slot in 0..slots {
        let params = SamplingParams {
            temperature: 0.9,
            top_k: [0, 40][slot % 2],
            top_p: [1.0, 0.9, 0.95][slot % 3],
            repetition_penalty: 1.1,
            frequency_penalty: 0.2,
            ..Default::default()
        };
        let prompt: Vec<u32> = (0..500).map(|_| rng.below(v as u64) as u32).collect();
        head.join(
            slot,
            SlotRequest::new(params.clone())
                .seed(slot as u64 + 10)
                .prompt(prompt.clone()),
        )
        .unwrap();
        let mut st = SequenceState::new(slot as u64 + 10);
        st.prompt = prompt;
        states.push(Request {
            params,
            state: st,
            allowed: None,
        });
    }
    // one set of logits on the device for every step
    let data: Vec<f32> = (0..slots * v).map(|_| 3.0 * rng.normal()).collect();
    let buf = s.upload_logits(&Logits::f32(&data, slots, v).unwrap());
    let view = DeviceLogits {
        buffer: &buf,
        dtype: DType::F32,
        rows: slots,
        vocab: v,
        row_stride: v,
        offset: 0,
    };
    let rows: Vec<usize> = (0..slots).collect();
    // the first step writes the row map once
    let mut enc = s.device().create_command_encoder(&Default::default());
    head.record_step(&mut enc, &view, &rows).unwrap();
    s.queue().submit([enc.finish()]);
    let mut results = head.wait().unwrap();
    let before = head.host_bytes_written();
    assert!(before > 0);
    for _ in 0..100 / 4 {
        // four steps in one submission, read back later
        let mut enc = s.device().create_command_encoder(&Default::default());
        for _ in 0..4 {
            head.record_step(&mut enc, &view, &rows).unwrap();
        }
        s.queue().submit([enc.finish()]);
        results.extend(head.poll().unwrap());
    }
    results.extend(head.wait().unwrap());
    assert_eq!(
        head.host_bytes_written(),
        before,
        "bytes written by the host in 100 steps"
    );
    assert_eq!(results.len(), 101);
    let cpu = CpuSampler::new();
    for (k, step) in results.iter().enumerate() {
        assert_eq!(step.id, k as u64, "steps come back in order");
        let want = cpu
            .sample(&Logits::f32(&data, slots, v).unwrap(), &states)
            .unwrap();
        for (r, out) in step.rows.iter().enumerate() {
            let w = want[r].as_ref().unwrap().token;
            assert_eq!(out.result.as_ref().unwrap().token, w, "step {k} slot {r}");
            states[r].state.push(w);
        }
    }
    // the token buffer holds the last step's tokens, for the next embedding lookup
    let last: Vec<u32> = results[100]
        .rows
        .iter()
        .map(|r| r.result.as_ref().unwrap().token)
        .collect();
    let read = s.device().create_buffer(&wgpu::BufferDescriptor {
        label: None,
        size: (slots * 4) as u64,
        usage: wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_DST,
        mapped_at_creation: false,
    });
    let mut enc = s.device().create_command_encoder(&Default::default());
    enc.copy_buffer_to_buffer(head.tokens(), 0, &read, 0, (slots * 4) as u64);
    s.queue().submit([enc.finish()]);
    read.slice(..)
        .map_async(wgpu::MapMode::Read, |r| r.unwrap());
    s.device()
        .poll(wgpu::PollType::wait_indefinitely())
        .unwrap();
    let got: Vec<u32> =
        bytemuck::cast_slice::<u8, u32>(&read.slice(..).get_mapped_range().unwrap()).to_vec();
    assert_eq!(got, last);
}

/// Stop ids and max_tokens finish a slot; later steps report it finished, and a new
/// sequence can join the slot after it leaves.
#[test]
fn stops_and_rejoin() {
    let Some(s) = sampler() else { return };
    let v = 50;
    let mut head = WgpuHead::new(&s, 2, v).unwrap();
    // slot 0: greedy on a row whose largest logit is token 7, which is a stop id
    head.join(
        0,
        SlotRequest::new(SamplingParams::greedy())
            .seed(1)
            .stop(vec![7]),
    )
    .unwrap();
    head.join(
        1,
        SlotRequest::new(SamplingParams::default())
            .seed(2)
            .max_tokens(3),
    )
    .unwrap();
    let mut x = vec![0.0f32; 2 * v];
    x[7] = 5.0;
    let logits = Logits::f32(&x, 2, v).unwrap();
    let a = head.step(&logits, &[0, 1]).unwrap();
    assert_eq!(a[0].result.as_ref().unwrap().token, 7);
    assert_eq!(a[0].finished, Some(FinishReason::Stop));
    assert_eq!(a[1].finished, None);
    let b = head.step(&logits, &[0, 1]).unwrap();
    assert_eq!(b[0].result, Err(decoda::RowError::Finished));
    assert_eq!(b[0].finished, Some(FinishReason::Stop));
    let one = Logits::f32(&x[..v], 1, v).unwrap();
    let c = head.step(&one, &[1]).unwrap();
    assert_eq!(c[0].finished, Some(FinishReason::Length));
    let d = head.step(&one, &[1]).unwrap();
    assert_eq!(d[0].result, Err(decoda::RowError::Finished));
    head.leave(0).unwrap();
    head.join(0, SlotRequest::new(SamplingParams::greedy()).seed(1))
        .unwrap();
    let e = head.step(&one, &[0]).unwrap();
    assert_eq!(e[0].result.as_ref().unwrap().token, 7);
    assert_eq!(e[0].finished, None);
    // bad requests name the slot and the field
    assert!(head
        .join(5, SlotRequest::new(SamplingParams::default()))
        .is_err());
    let err = head
        .join(1, SlotRequest::new(SamplingParams::default()))
        .unwrap_err();
    assert!(err.to_string().contains("slot 1"), "{err}");
    assert!(head.step(&logits, &[0, 0]).is_err());
}

/// The device head refuses a DRY window its kernels cannot hold (no `max_tokens` bounds
/// the history) at join and at set_params, naming the slot and the field; the slot stays
/// usable. It takes the kept distribution.
#[test]
fn later_stages_refused_by_the_device_head() {
    let Some(s) = sampler() else { return };
    let mut head = WgpuHead::new(&s, 2, 1000).unwrap();
    let dry = SamplingParams {
        dry_multiplier: 0.8,
        ..SamplingParams::default()
    };
    match head.join(1, SlotRequest::new(dry.clone()).seed(3)) {
        Err(decoda::Error::InvalidParameter { row: 1, field, .. }) => {
            assert_eq!(field, "dry_penalty_last_n")
        }
        other => panic!("expected a refusal naming slot 1, got {other:?}"),
    }
    let kept = SamplingParams {
        kept: Some(4),
        ..SamplingParams::default()
    };
    head.join(1, SlotRequest::new(kept).seed(3)).unwrap();
    match head.set_params(1, dry) {
        Err(decoda::Error::InvalidParameter { row: 1, field, .. }) => {
            assert_eq!(field, "dry_penalty_last_n")
        }
        other => panic!("expected a refusal, got {other:?}"),
    }
    let x = vec![0.5f32; 1000];
    let steps = head.step(&Logits::f32(&x, 1, 1000).unwrap(), &[1]).unwrap();
    let kept = steps[0].result.as_ref().unwrap().kept.as_ref().unwrap();
    assert_eq!((kept.size, kept.top.len()), (1000, 4), "{kept:?}");
    assert_eq!(
        kept.top.iter().map(|k| k.id).collect::<Vec<_>>(),
        [0, 1, 2, 3],
        "equal logits: the smallest ids first"
    );
}

/// `Head::step_masked` on the device head: 30 steps of 4 slots with a fresh mask per
/// step (some rows unmasked, some allowing a few ids), the same tokens as the CPU head
/// given the same masks.
#[test]
fn masked_steps_match_the_cpu_head() {
    let Some(s) = sampler() else { return };
    let (slots, v) = (4usize, 5000usize);
    let w = v.div_ceil(32);
    let mut dev = WgpuHead::new(&s, slots, v).unwrap();
    let mut cpu = decoda::CpuHead::new(slots, v).unwrap();
    let params = [
        SamplingParams::default(),
        SamplingParams::greedy(),
        SamplingParams {
            top_p: 0.9,
            repetition_penalty: 1.2,
            ..SamplingParams::default()
        },
        SamplingParams {
            top_k: 30,
            temperature: 0.7,
            ..SamplingParams::default()
        },
    ];
    for (slot, p) in params.iter().enumerate() {
        let req = SlotRequest::new(p.clone()).seed(slot as u64 + 1);
        dev.join(slot, req.clone()).unwrap();
        cpu.join(slot, req).unwrap();
    }
    let mut rng = Rng::new(11);
    let rows: Vec<usize> = (0..slots).collect();
    for step in 0..30 {
        let data: Vec<f32> = (0..slots * v).map(|_| 2.0 * rng.normal()).collect();
        let masks: Vec<Option<Vec<u32>>> = (0..slots)
            .map(|r| match (step + r) % 3 {
                0 => None,
                1 => {
                    let mut m = vec![0u32; w];
                    for _ in 0..5 {
                        let t = rng.below(v as u64) as usize;
                        m[t / 32] |= 1 << (t % 32);
                    }
                    Some(m)
                }
                _ => Some((0..w).map(|_| rng.next_u64() as u32).collect()),
            })
            .collect();
        let refs: Vec<Option<&[u32]>> = masks.iter().map(|m| m.as_deref()).collect();
        let l = Logits::f32(&data, slots, v).unwrap();
        let a = dev.step_masked(&l, &rows, &refs).unwrap();
        let c = cpu.step_masked(&l, &rows, &refs).unwrap();
        for r in 0..slots {
            let (ta, tc) = (
                a[r].result.as_ref().map(|x| x.token),
                c[r].result.as_ref().map(|x| x.token),
            );
            assert_eq!(ta, tc, "step {step} slot {r}");
            if let (Some(m), Ok(t)) = (&masks[r], ta) {
                assert!(
                    m[t as usize / 32] >> (t % 32) & 1 == 1,
                    "step {step}: {t} masked out"
                );
            }
        }
    }
}

/// A slot's fixed mask (`SlotRequest::allowed`, a grammar's allowed tokens) on the device
/// head: bound by slot at every step, written at the join only; the same tokens as the
/// CPU head; a slot that rejoins without a mask draws anything again.
#[test]
fn fixed_slot_masks_match_the_cpu_head() {
    let Some(s) = sampler() else { return };
    let (slots, v) = (3usize, 3000usize);
    let w = v.div_ceil(32);
    let mut dev = WgpuHead::new(&s, slots, v).unwrap();
    let mut cpu = decoda::CpuHead::new(slots, v).unwrap();
    let mut rng = Rng::new(5);
    let mut mask = vec![0u32; w];
    for _ in 0..40 {
        let t = rng.below(v as u64) as usize;
        mask[t / 32] |= 1 << (t % 32);
    }
    let reqs = [
        SlotRequest::new(SamplingParams::default())
            .seed(1)
            .allowed(mask.clone()),
        SlotRequest::new(SamplingParams::default()).seed(2),
        SlotRequest::new(SamplingParams {
            top_k: 5,
            ..SamplingParams::default()
        })
        .seed(3)
        .allowed(mask.clone()),
    ];
    for (slot, r) in reqs.iter().enumerate() {
        dev.join(slot, r.clone()).unwrap();
        cpu.join(slot, r.clone()).unwrap();
    }
    let rows: Vec<usize> = (0..slots).collect();
    let mut outside = false;
    for step in 0..20 {
        if step == 10 {
            // slot 0 rejoins without its mask
            let plain = SlotRequest::new(SamplingParams::default()).seed(9);
            for h in [&mut dev as &mut dyn Head, &mut cpu] {
                h.leave(0).unwrap();
                h.join(0, plain.clone()).unwrap();
            }
        }
        let data: Vec<f32> = (0..slots * v).map(|_| 2.0 * rng.normal()).collect();
        let l = Logits::f32(&data, slots, v).unwrap();
        let a = dev.step(&l, &rows).unwrap();
        let c = cpu.step(&l, &rows).unwrap();
        for r in 0..slots {
            let t = a[r].result.as_ref().unwrap().token;
            assert_eq!(
                t,
                c[r].result.as_ref().unwrap().token,
                "step {step} slot {r}"
            );
            let allowed = mask[t as usize / 32] >> (t % 32) & 1 == 1;
            if r == 2 || (r == 0 && step < 10) {
                assert!(allowed, "step {step} slot {r}: {t} outside the mask");
            } else if !allowed {
                outside = true;
            }
        }
    }
    assert!(outside, "unmasked slots should draw outside the mask");
}
