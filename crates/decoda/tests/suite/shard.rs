//! Vocabulary-sharded sampling (`decoda::shard`) against the unsharded CPU sampler and
//! the reference: the same token for every split (uneven, 1 to 6 shards, in any order),
//! log-probabilities within the contract's `1e-5` with the same ranks and listed ids,
//! the same row errors; bad splits, disagreeing shards and unsharded stages refused.

use decoda::shard::{plan, round1, sample_sharded, ShardRows};
use decoda::{Backend, CpuSampler, Logits, LogprobsMode, ReferenceSampler, Request};
use decoda::{SamplingParams, SequenceState};
use proptest::prelude::*;

use crate::shard_util::{close, request, spans, split};

proptest! {
    #![proptest_config(ProptestConfig::with_cases(if decoda::testing::full_tier() { 400 } else { 60 }))]

    /// Random rows of V = 2 to 5,000 (ties and `-inf` among them), random supported
    /// parameters per row, 1 to 6 uneven shards given in any order: the CPU sampler's
    /// and the reference's results.
    #[test]
    fn sharded_matches_unsharded(
        v in 2usize..5000,
        rows in 1usize..5,
        seed in any::<u64>(),
        cuts in proptest::collection::vec(any::<usize>(), 0..6),
        reverse in any::<bool>(),
        knobs in proptest::collection::vec(
            (0u8..6, 0u32..40, 0u8..4, 0u8..3, 0u8..2, proptest::option::of(0u32..6), any::<bool>(), any::<bool>()),
            5,
        ),
    ) {
        let mut x = decoda::testing::synthetic::uniform(rows * v, 6.0, seed);
        // ties and banned tokens
        for i in (0..x.len()).step_by(7) {
            x[i] = x[i / 2];
        }
        for i in (3..x.len()).step_by(11) {
            x[i] = f32::NEG_INFINITY;
        }
        let reqs: Vec<Request> = (0..rows)
            .map(|r| {
                let (tsel, k, mp, pen, dry, lp, raw, masked) = knobs[r];
                let t = [0.0, 0.5, 1.0, 1.7, 1e-6, 3.0][tsel as usize];
                let history: Vec<u32> = (0..(seed as usize % 12))
                    .map(|j| ((seed >> (j % 48)) as usize % v) as u32)
                    .collect();
                let bias = vec![((seed as usize % v) as u32, 2.5), (((seed / 7) as usize % v) as u32, f32::NEG_INFINITY)];
                let mask = masked.then(|| {
                    (0..v.div_ceil(32)).map(|w| (seed as u32).rotate_left(w as u32) | 1).collect()
                });
                request(
                    seed ^ r as u64,
                    seed % 1000 + r as u64,
                    t,
                    k,
                    [0.0, 0.05, 0.3, 0.9][mp as usize],
                    [(1.0, 0.0, 0.0), (1.3, 0.2, 0.1), (0.8, -0.5, 0.4)][pen as usize],
                    [0.0, 0.8][dry as usize],
                    lp,
                    raw,
                    history,
                    bias,
                    mask,
                )
            })
            .collect();
        let logits = Logits::f32(&x, rows, v).unwrap();
        let want = CpuSampler::new().sample(&logits, &reqs).unwrap();
        let reference = ReferenceSampler.sample(&logits, &reqs).unwrap();
        let mut sp = spans(v, &cuts);
        if reverse {
            sp.reverse();
        }
        let parts = split(&x, rows, v, &sp);
        let shards: Vec<ShardRows> = sp
            .iter()
            .zip(&parts)
            .map(|(&(offset, width), l)| ShardRows { logits: l, width, offset })
            .collect();
        let got = sample_sharded(&shards, v, &reqs).unwrap();
        for r in 0..rows {
            prop_assert!(close(&got[r], &want[r]).is_ok(), "row {} of V = {} in {:?}: {:?} vs the CPU's {:?} ({:?})", r, v, sp, got[r], want[r], reqs[r].params);
            prop_assert!(close(&got[r], &reference[r]).is_ok(), "row {}: {:?} vs the reference's {:?}", r, got[r], reference[r]);
        }
    }
}

/// A B = 1 row of Qwen3's vocabulary (151,936) with its winner anywhere, cut in 2, 3
/// and 4 uneven shards: the CPU sampler's token and logprobs, at temperature, top-k 50
/// and min-p.
#[test]
fn large_vocabulary_rows() {
    let v = 151_936;
    let x = decoda::testing::synthetic::uniform(v, 8.0, 42);
    for (i, params) in [
        SamplingParams::default(),
        SamplingParams {
            top_k: 50,
            temperature: 0.7,
            logprobs: Some(5),
            ..Default::default()
        },
        SamplingParams {
            min_p: 0.1,
            logprobs: Some(3),
            logprobs_mode: LogprobsMode::Raw,
            ..Default::default()
        },
    ]
    .into_iter()
    .enumerate()
    {
        let req = Request {
            params,
            state: SequenceState {
                seed: 7 + i as u64,
                step: 3,
                ..Default::default()
            },
            allowed: None,
        };
        let logits = Logits::f32(&x, 1, v).unwrap();
        let want = CpuSampler::new()
            .sample(&logits, std::slice::from_ref(&req))
            .unwrap();
        for cuts in [
            vec![70_001],
            vec![1, 151_935],
            vec![40_000, 40_001, 100_000],
        ] {
            let sp = spans(v, &cuts);
            let parts = split(&x, 1, v, &sp);
            let shards: Vec<ShardRows> = sp
                .iter()
                .zip(&parts)
                .map(|(&(offset, width), l)| ShardRows {
                    logits: l,
                    width,
                    offset,
                })
                .collect();
            let got = sample_sharded(&shards, v, std::slice::from_ref(&req)).unwrap();
            close(&got[0], &want[0]).unwrap_or_else(|e| panic!("{cuts:?}: {e}"));
        }
    }
}

/// Overlapping or missing ids, shards past V, shards disagreeing on a row's request and
/// the stages not yet sharded are errors naming what is wrong.
#[test]
fn bad_splits_and_requests_are_refused() {
    let v = 100;
    let x = vec![0.5f32; v];
    let req = Request::default();
    let reqs = std::slice::from_ref(&req);
    let a = ShardRows {
        logits: &x[..60],
        width: 60,
        offset: 0,
    };
    let b = ShardRows {
        logits: &x[..40],
        width: 40,
        offset: 60,
    };
    assert!(sample_sharded(&[a, b], v, reqs).is_ok());
    let overlap = ShardRows {
        logits: &x[..41],
        width: 41,
        offset: 59,
    };
    let e = sample_sharded(&[a, overlap], v, reqs)
        .unwrap_err()
        .to_string();
    assert!(e.contains("two shards"), "{e}");
    let gap = ShardRows {
        logits: &x[..39],
        width: 39,
        offset: 61,
    };
    let e = sample_sharded(&[a, gap], v, reqs).unwrap_err().to_string();
    assert!(e.contains("no shard"), "{e}");
    let past = ShardRows {
        logits: &x[..41],
        width: 41,
        offset: 60,
    };
    let e = sample_sharded(&[a, past], v, reqs).unwrap_err().to_string();
    assert!(e.contains("vocabulary of 100"), "{e}");
    // shard b was given another seed: plan() names the row
    let other = Request {
        state: SequenceState {
            seed: 9,
            ..Default::default()
        },
        ..Request::default()
    };
    let r1 = vec![
        round1(&a, v, reqs).unwrap(),
        round1(&b, v, std::slice::from_ref(&other)).unwrap(),
    ];
    let e = plan(&r1, v, reqs).unwrap_err().to_string();
    assert!(e.contains("row 0") && e.contains("digest"), "{e}");
    for (field, params) in [
        (
            "top_p",
            SamplingParams {
                top_p: 0.9,
                ..Default::default()
            },
        ),
        (
            "typical_p",
            SamplingParams {
                typical_p: 0.5,
                ..Default::default()
            },
        ),
        (
            "top_n_sigma",
            SamplingParams {
                top_n_sigma: 1.0,
                ..Default::default()
            },
        ),
        (
            "kept",
            SamplingParams {
                kept: Some(3),
                ..Default::default()
            },
        ),
    ] {
        let q = Request {
            params,
            ..Request::default()
        };
        let e = sample_sharded(&[a, b], v, std::slice::from_ref(&q))
            .unwrap_err()
            .to_string();
        assert!(e.contains(field) && e.contains("row 0"), "{field}: {e}");
    }
}
