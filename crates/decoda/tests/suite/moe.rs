//! MoE dispatch (the contract's section 7): both branches against a naive reference, the
//! run-time decision, the permutations, and every error path.

use decoda::cpu::grouped_matmul;
use decoda::moe::{
    combine, gather, route, scatter, stable_argsort, Dispatch, ExpertWeights, GateUp, MoeShape,
    Routing, SwitchMlp, WeightDtype,
};
use decoda::testing::moe::{dense, reference, rel_err, Dense, BOUND};
use decoda::testing::synthetic;
use decoda::{Backend, CpuSampler, Error, Logits, Request, SamplingParams};
use proptest::prelude::*;

/// Bound of a bf16 layer against the f32 weights it was rounded from (bf16 keeps 8
/// significant bits: about 2e-3 per weight, partly averaging out over a dot product).
const BF16_VS_F32_BOUND: f64 = 2e-2;

fn weights(e: usize, out: usize, inp: usize, dtype: WeightDtype, seed: u64) -> ExpertWeights {
    let v = synthetic::uniform(e * out * inp, 1.0 / (inp as f32).sqrt(), seed);
    match dtype {
        WeightDtype::F32 => ExpertWeights::from_f32(v, e, out, inp).unwrap(),
        WeightDtype::Bf16 => ExpertWeights::from_bf16(
            v.iter().map(|&x| half::bf16::from_f32(x)).collect(),
            e,
            out,
            inp,
        )
        .unwrap(),
        other => ExpertWeights::from_f32(v, e, out, inp)
            .unwrap()
            .converted(other)
            .unwrap(),
    }
}

struct Case {
    layer: SwitchMlp,
    dense: Dense,
}

fn case(e: usize, d: usize, h: usize, dtype: WeightDtype, fused: bool, cutoff: usize) -> Case {
    let gate_up = if fused {
        GateUp::Fused(weights(e, 2 * h, d, dtype, 1))
    } else {
        GateUp::Separate {
            gate: weights(e, h, d, dtype, 2),
            up: weights(e, h, d, dtype, 3),
        }
    };
    let down = weights(e, d, h, dtype, 4);
    let layer = SwitchMlp::new(gate_up, down, cutoff).unwrap();
    Case {
        dense: dense(&layer),
        layer,
    }
}

/// Runs the layer's own choice and both forced branches; checks each against the reference
/// and returns the dispatch the layer chose.
fn check(c: &Case, x: &[f32], r: &Routing) -> Dispatch {
    let want = reference(&c.dense, x, r);
    let d = c.layer.hidden();
    let auto = c.layer.forward(x, r).unwrap();
    for (name, y) in [
        ("auto", auto.y.clone()),
        (
            "sorted",
            c.layer.forward_with(x, r, Dispatch::Sorted).unwrap().y,
        ),
        (
            "unsorted",
            c.layer.forward_with(x, r, Dispatch::Unsorted).unwrap().y,
        ),
    ] {
        let err = rel_err(&y, &want, d);
        assert!(
            err <= BOUND,
            "{name}: relative error {err:e} > {BOUND:e} (N={}, k={})",
            r.tokens,
            r.top_k
        );
    }
    auto.dispatch
}

fn random_routing(tokens: usize, e: usize, k: usize, seed: u64) -> Routing {
    let logits = synthetic::uniform(tokens * e, 3.0, seed);
    route(&logits, e, k, true).unwrap()
}

fn x(tokens: usize, d: usize, seed: u64) -> Vec<f32> {
    synthetic::uniform(tokens * d, 1.0, seed)
}

#[test]
fn one_token_all_layouts_and_dtypes() {
    for dtype in [WeightDtype::F32, WeightDtype::Bf16] {
        for fused in [true, false] {
            let c = case(16, 37, 23, dtype, fused, 4);
            let r = random_routing(1, 16, 4, 9);
            assert_eq!(check(&c, &x(1, 37, 5), &r), Dispatch::Unsorted);
        }
    }
}

#[test]
fn no_tokens() {
    let c = case(4, 8, 6, WeightDtype::F32, true, 2);
    let r = Routing::new(0, 2, vec![], vec![]).unwrap();
    let out = c.layer.forward(&[], &r).unwrap();
    assert!(out.y.is_empty());
    assert_eq!(out.dispatch, Dispatch::Unsorted);
    assert!(c
        .layer
        .forward_with(&[], &r, Dispatch::Sorted)
        .unwrap()
        .y
        .is_empty());
}

#[test]
fn around_the_cutoff() {
    let c = case(12, 40, 24, WeightDtype::F32, true, 5);
    for (n, want) in [
        (4, Dispatch::Unsorted),
        (5, Dispatch::Unsorted),
        (6, Dispatch::Sorted),
    ] {
        let r = random_routing(n, 12, 3, n as u64);
        assert_eq!(check(&c, &x(n, 40, 7), &r), want, "N = {n}");
    }
}

#[test]
fn k_is_one_and_k_is_e() {
    let c = case(6, 33, 17, WeightDtype::F32, false, 2);
    for k in [1, 6] {
        for n in [1, 7] {
            let r = random_routing(n, 6, k, 100 + k as u64);
            check(&c, &x(n, 33, 3), &r);
        }
    }
}

#[test]
fn experts_without_tokens() {
    let c = case(16, 24, 20, WeightDtype::Bf16, true, 1);
    // only experts 3 and 11 are used
    let n = 9;
    let indices: Vec<u32> = (0..n)
        .flat_map(|t| if t % 2 == 0 { [3, 11] } else { [11, 3] })
        .collect();
    let weights: Vec<f32> = (0..n).flat_map(|t| [0.25 + 0.05 * t as f32, 0.5]).collect();
    let r = Routing::new(n, 2, indices, weights).unwrap();
    assert_eq!(check(&c, &x(n, 24, 1), &r), Dispatch::Sorted);
}

#[test]
fn every_token_to_one_expert() {
    // 600 rows on one expert: more than one matrix-product piece
    let c = case(8, 19, 13, WeightDtype::F32, true, 16);
    let n = 600;
    let r = Routing::new(n, 1, vec![5; n], vec![1.0; n]).unwrap();
    assert_eq!(check(&c, &x(n, 19, 2), &r), Dispatch::Sorted);
}

#[test]
fn sizes_off_every_block() {
    // (300, 250): a bf16 gate_up expert holds 150,000 values, more than one widened block
    for (d, h) in [(1, 1), (3, 2), (129, 65), (200, 131), (300, 250)] {
        for dtype in [WeightDtype::F32, WeightDtype::Bf16] {
            let c = case(5, d, h, dtype, d % 2 == 1, 2);
            let r = random_routing(4, 5, 2, d as u64);
            check(&c, &x(4, d, 8), &r);
        }
    }
}

#[test]
fn more_than_32768_gathered_rows() {
    let c = case(64, 12, 6, WeightDtype::F32, true, 64);
    let n = 4_100; // 32,800 rows with k = 8
    let r = random_routing(n, 64, 8, 77);
    assert!(n * 8 > 32_768);
    assert_eq!(check(&c, &x(n, 12, 4), &r), Dispatch::Sorted);
}

#[test]
fn bf16_layer_against_its_f32_weights() {
    let (e, d, h) = (8, 64, 48);
    let f32_layer = case(e, d, h, WeightDtype::F32, true, 4);
    let bf16_layer = case(e, d, h, WeightDtype::Bf16, true, 4);
    let r = random_routing(10, e, 2, 3);
    let xs = x(10, d, 6);
    let exact = reference(&f32_layer.dense, &xs, &r);
    for disp in [Dispatch::Sorted, Dispatch::Unsorted] {
        let y = bf16_layer.layer.forward_with(&xs, &r, disp).unwrap().y;
        let err = rel_err(&y, &exact, d);
        assert!(err <= BF16_VS_F32_BOUND, "{disp:?}: {err:e}");
        assert!(err > 0.0, "bf16 rounding must show");
    }
}

#[test]
fn one_layer_takes_both_branches() {
    let shape = MoeShape {
        experts: 16,
        top_k: 4,
        hidden: 32,
        intermediate: 16,
    };
    let layer = synthetic::layer(shape, WeightDtype::Bf16, true, 32, 5).unwrap();
    assert_eq!(layer.counts().sorted + layer.counts().unsorted, 0);
    let (x1, r1) = synthetic::inputs(shape, 1, 1).unwrap();
    assert_eq!(
        layer.forward(&x1, &r1).unwrap().dispatch,
        Dispatch::Unsorted
    );
    let (x512, r512) = synthetic::inputs(shape, 512, 2).unwrap();
    assert_eq!(
        layer.forward(&x512, &r512).unwrap().dispatch,
        Dispatch::Sorted
    );
    let counts = layer.counts();
    assert_eq!((counts.sorted, counts.unsorted), (1, 1));
    assert_eq!(layer.dispatch_for(32), Dispatch::Unsorted);
    assert_eq!(layer.dispatch_for(33), Dispatch::Sorted);
}

#[test]
fn greedy_tokens_do_not_depend_on_the_cutoff() {
    // A toy model: two MoE layers with residuals, then a vocabulary projection and the
    // decoda sampler in greedy mode. sort_cutoff = 1 and = usize::MAX give the same tokens.
    let shape = MoeShape {
        experts: 32,
        top_k: 4,
        hidden: 48,
        intermediate: 40,
    };
    let vocab = 97;
    let head = synthetic::uniform(vocab * shape.hidden, 0.3, 99);
    let router: Vec<Vec<f32>> = (0..2)
        .map(|l| synthetic::uniform(shape.experts * shape.hidden, 0.5, 50 + l))
        .collect();
    let tokens = |cutoff: usize| {
        let layers: Vec<SwitchMlp> = (0..2)
            .map(|l| synthetic::layer(shape, WeightDtype::F32, l == 0, cutoff, 20 + l).unwrap())
            .collect();
        let n = 64;
        let mut h = x(n, shape.hidden, 31);
        for (layer, wr) in layers.iter().zip(&router) {
            let logits: Vec<f32> = h
                .chunks(shape.hidden)
                .flat_map(|t| {
                    wr.chunks(shape.hidden)
                        .map(|w| w.iter().zip(t).map(|(a, b)| a * b).sum::<f32>())
                        .collect::<Vec<_>>()
                })
                .collect();
            let r = route(&logits, shape.experts, shape.top_k, true).unwrap();
            let y = layer.forward(&h, &r).unwrap().y;
            for (a, b) in h.iter_mut().zip(y) {
                *a += b;
            }
        }
        let logits: Vec<f32> = h
            .chunks(shape.hidden)
            .flat_map(|t| {
                head.chunks(shape.hidden)
                    .map(|w| w.iter().zip(t).map(|(a, b)| a * b).sum::<f32>())
                    .collect::<Vec<_>>()
            })
            .collect();
        let batch = Logits::f32(&logits, n, vocab).unwrap();
        let reqs = vec![Request::new(SamplingParams::greedy(), 0); n];
        let out = CpuSampler::new().sample(&batch, &reqs).unwrap();
        let picked: Vec<u32> = out.into_iter().map(|r| r.unwrap().token).collect();
        let counts = layers[0].counts();
        (picked, counts)
    };
    let (sorted_tokens, c1) = tokens(1);
    let (unsorted_tokens, cinf) = tokens(usize::MAX);
    assert_eq!((c1.sorted, c1.unsorted), (1, 0));
    assert_eq!((cinf.sorted, cinf.unsorted), (0, 1));
    assert_eq!(sorted_tokens, unsorted_tokens);
}

#[test]
fn gather_scatter_combine_by_hand() {
    // N = 3, k = 2, E = 3, D = 2; identity-like experts are not needed: check the plumbing.
    let xs = [1.0f32, 2.0, 3.0, 4.0, 5.0, 6.0];
    let ids = [2u32, 0, 0, 1, 2, 0];
    let g = gather(&xs, 2, &ids, 2, 3, true).unwrap();
    assert!(g.sorted);
    assert_eq!(g.order, vec![1, 2, 5, 3, 0, 4]);
    assert_eq!(g.idx, vec![0, 0, 0, 1, 2, 2]);
    assert_eq!(g.x_in, vec![1., 2., 3., 4., 5., 6., 3., 4., 1., 2., 5., 6.]);
    assert_eq!(g.inv_order, vec![4, 0, 1, 3, 5, 2]);
    let u = gather(&xs, 2, &ids, 2, 3, false).unwrap();
    assert!(!u.sorted && u.order.is_empty() && u.inv_order.is_empty());
    assert_eq!(u.idx, ids.to_vec());
    assert_eq!(u.x_in, vec![1., 2., 1., 2., 3., 4., 3., 4., 5., 6., 5., 6.]);
    // rows tagged with their sorted position; scatter puts them back in flat order
    let tagged: Vec<f32> = (0..6).map(|j| j as f32).collect();
    let back = scatter(tagged, 1, Some(&g.inv_order)).unwrap();
    assert_eq!(back, vec![4., 0., 1., 3., 5., 2.]);
    let y = combine(&[1.0, 10.0, 2.0, 20.0], 2, 1, &[0.5, 0.1, 1.0, 2.0]).unwrap();
    assert_eq!(y, vec![1.5, 42.0]);
}

#[test]
fn grouped_matmul_matches_rows() {
    let (e, out, inp) = (4, 5, 7);
    let w = weights(e, out, inp, WeightDtype::F32, 12);
    let rows = 9;
    let xs = x(rows, inp, 13);
    let idx = vec![0u32, 0, 1, 1, 1, 3, 3, 3, 3];
    let s = grouped_matmul(&xs, &idx, true, &w).unwrap();
    let u = grouped_matmul(&xs, &idx, false, &w).unwrap();
    for j in 0..rows {
        let m = w.expert_f32(idx[j] as usize);
        for o in 0..out {
            let want: f64 = (0..inp)
                .map(|i| f64::from(m[o * inp + i]) * f64::from(xs[j * inp + i]))
                .sum();
            for (name, got) in [("sorted", s[j * out + o]), ("unsorted", u[j * out + o])] {
                assert!(
                    (f64::from(got) - want).abs() <= 1e-5 * want.abs().max(1.0),
                    "{name} row {j}"
                );
            }
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, .. ProptestConfig::default() })]

    #[test]
    fn argsort_is_stable_and_inverted(flat in proptest::collection::vec(0u32..9, 0..300)) {
        let order = stable_argsort(&flat, 9).unwrap();
        // a permutation, ordered by expert, by position within an expert
        let mut seen = vec![false; flat.len()];
        for &p in &order {
            prop_assert!(!seen[p as usize]);
            seen[p as usize] = true;
        }
        for w in order.windows(2) {
            let (a, b) = (w[0] as usize, w[1] as usize);
            prop_assert!(flat[a] < flat[b] || (flat[a] == flat[b] && a < b));
        }
        // gather's inv_order inverts order both ways
        let k = 3;
        let n = flat.len() / k;
        let flat = &flat[..n * k];
        let xs = vec![0f32; n];
        let g = gather(&xs, 1, flat, k, 9, true).unwrap();
        for (j, &p) in g.order.iter().enumerate() {
            prop_assert_eq!(g.inv_order[p as usize] as usize, j);
        }
        for (i, &j) in g.inv_order.iter().enumerate() {
            prop_assert_eq!(g.order[j as usize] as usize, i);
        }
        for (j, &p) in g.order.iter().enumerate() {
            prop_assert_eq!(g.idx[j], flat[p as usize]);
        }
    }
}

#[test]
fn routing_softmax_top_k() {
    // ties to the smaller expert id, in decreasing probability
    let logits = [1.0f32, 3.0, 3.0, 0.0, 2.0];
    let r = route(&logits, 5, 3, false).unwrap();
    assert_eq!(r.indices, vec![1, 2, 4]);
    let z: f32 = logits.iter().map(|v| (v - 3.0).exp()).sum();
    let p = |v: f32| (v - 3.0).exp() / z;
    for (w, want) in r.weights.iter().zip([p(3.0), p(3.0), p(2.0)]) {
        assert!((w - want).abs() < 1e-6);
    }
    let rn = route(&logits, 5, 3, true).unwrap();
    assert_eq!(rn.indices, r.indices);
    assert!((rn.weights.iter().sum::<f32>() - 1.0).abs() < 1e-6);
    let all_equal = route(&[0.5f32; 6], 6, 2, true).unwrap();
    assert_eq!(all_equal.indices, vec![0, 1]);
}

#[test]
fn bad_inputs_are_clear_errors() {
    let c = case(4, 8, 6, WeightDtype::F32, true, 2);
    let xs = x(2, 8, 1);
    // expert id >= E, named by token and slot
    let r = Routing::new(2, 2, vec![0, 1, 3, 4], vec![0.5; 4]).unwrap();
    let e = c.layer.forward(&xs, &r).unwrap_err();
    assert_eq!(
        e,
        Error::ExpertOutOfRange {
            token: 1,
            slot: 1,
            expert: 4,
            experts: 4
        }
    );
    assert!(
        e.to_string().contains("token 1, slot 1: expert id 4"),
        "{e}"
    );
    assert!(gather(&xs, 8, &[0, 9], 1, 4, false).is_err());
    // x of the wrong length
    let r = random_routing(2, 4, 2, 1);
    let e = c.layer.forward(&xs[..15], &r).unwrap_err();
    assert!(matches!(e, Error::Shape(_)), "{e}");
    assert!(e.to_string().contains("x holds 15 values"), "{e}");
    // a hand-built routing whose N disagrees with its ids
    let mut bad = random_routing(2, 4, 2, 1);
    bad.tokens = 600;
    let e = c.layer.forward(&xs, &bad).unwrap_err();
    assert!(e.to_string().contains("N = 600"), "{e}");
    // routing lengths, weights
    assert!(matches!(
        Routing::new(2, 2, vec![0; 3], vec![0.0; 4]),
        Err(Error::Shape(_))
    ));
    let e = Routing::new(1, 2, vec![0, 1], vec![0.5, f32::NAN]).unwrap_err();
    assert!(e.to_string().contains("token 0, slot 1"), "{e}");
    assert!(Routing::new(1, 0, vec![], vec![]).is_err());
    // sort_cutoff = 0
    let gu = GateUp::Fused(weights(4, 12, 8, WeightDtype::F32, 1));
    let e = SwitchMlp::new(gu.clone(), weights(4, 8, 6, WeightDtype::F32, 2), 0).unwrap_err();
    assert!(e.to_string().contains("sort_cutoff = 0"), "{e}");
    // mismatched expert shapes
    let e = SwitchMlp::new(gu, weights(4, 8, 5, WeightDtype::F32, 2), 1).unwrap_err();
    assert!(matches!(e, Error::Shape(_)), "{e}");
    let e = SwitchMlp::new(
        GateUp::Separate {
            gate: weights(4, 6, 8, WeightDtype::F32, 1),
            up: weights(3, 6, 8, WeightDtype::F32, 1),
        },
        weights(4, 8, 6, WeightDtype::F32, 2),
        1,
    )
    .unwrap_err();
    assert!(e.to_string().contains("up is [3, 6, 8]"), "{e}");
    assert!(ExpertWeights::from_f32(vec![0.0; 10], 2, 2, 2).is_err());
    assert!(ExpertWeights::from_f32(vec![], 0, 2, 2).is_err());
    // grouped matmul told "sorted" on unsorted ids
    let w = weights(4, 3, 2, WeightDtype::F32, 3);
    let e = grouped_matmul(&[0.0; 6], &[1, 2, 0], true, &w).unwrap_err();
    assert_eq!(
        e,
        Error::NotSorted {
            position: 2,
            previous: 2,
            next: 0
        }
    );
    assert!(grouped_matmul(&[0.0; 6], &[1, 2, 4], false, &w).is_err());
    assert!(grouped_matmul(&[0.0; 5], &[1, 2, 3], false, &w).is_err());
    // routing
    assert!(route(&[0.0; 8], 4, 5, true).is_err());
    assert!(route(&[0.0; 7], 4, 2, true).is_err());
    let e = route(&[0.0, 1.0, f32::INFINITY, 0.0], 2, 1, true).unwrap_err();
    assert!(e.to_string().contains("token 1, expert 0"), "{e}");
    // scatter and combine shapes
    assert!(scatter(vec![0.0; 5], 2, Some(&[0, 1, 2])).is_err());
    assert!(scatter(vec![0.0; 6], 2, Some(&[0, 1, 3])).is_err());
    assert!(combine(&[0.0; 5], 2, 1, &[0.5; 4]).is_err());
}
