//! The MoE suite, run against every backend's [`MoeLayer`]: both branches against a plain
//! f64 reference over the same (dequantized) weights, for every weight format; the
//! run-time decision; routing on the backend equal to the CPU's, bit for bit; shapes with
//! experts that get no tokens, N from 1 to 4096, E up to 128, k up to 8, and D and H off
//! every block size.

use crate::backend::MoeLayer;
use crate::error::Result;
use crate::moe::{
    route_with, Affine, Dispatch, ExpertWeights, GateUp, MoeOutput, MoeShape, Router, Routing,
    SwitchMlp, WeightDtype,
};
use crate::testing::synthetic;

/// Every weight format the suite runs.
pub fn dtypes() -> Vec<WeightDtype> {
    vec![
        WeightDtype::F32,
        WeightDtype::Bf16,
        WeightDtype::F16,
        WeightDtype::Affine(Affine { bits: 4, group: 32 }),
        WeightDtype::Affine(Affine { bits: 4, group: 64 }),
        WeightDtype::Affine(Affine { bits: 8, group: 64 }),
    ]
}

/// Bound of `max|Δy| / max|y|` per token against the reference, every format alike (the
/// reference uses the same weight values; only the order of the f32 sums differs).
pub const BOUND: f64 = 1e-5;

/// The layer's experts as f64 matrices `(gate [H][D], up [H][D], down [D][H])` per expert
/// ([`dense`]), for [`reference()`].
pub struct Dense {
    gate: Vec<Vec<f64>>,
    up: Vec<Vec<f64>>,
    down: Vec<Vec<f64>>,
    d: usize,
    h: usize,
}

/// A layer's experts widened to f64 (16-bit and affine weights widen exactly).
pub fn dense(layer: &SwitchMlp) -> Dense {
    let down = layer.down();
    let (d, h) = (down.out_features(), down.in_features());
    let f64s = |v: Vec<f32>| v.into_iter().map(f64::from).collect::<Vec<f64>>();
    let mut out = Dense {
        gate: vec![],
        up: vec![],
        down: vec![],
        d,
        h,
    };
    for e in 0..down.experts() {
        match layer.gate_up() {
            GateUp::Fused(w) => {
                let m = f64s(w.expert_f32(e));
                out.gate.push(m[..h * d].to_vec());
                out.up.push(m[h * d..].to_vec());
            }
            GateUp::Separate { gate, up } => {
                out.gate.push(f64s(gate.expert_f32(e)));
                out.up.push(f64s(up.expert_f32(e)));
            }
        }
        out.down.push(f64s(down.expert_f32(e)));
    }
    out
}

/// `y[n] = Σ_s w[n,s] · down_e(silu(gate_e x[n]) * up_e x[n])` in f64.
pub fn reference(m: &Dense, x: &[f32], r: &Routing) -> Vec<f64> {
    let (d, h) = (m.d, m.h);
    let mut y = vec![0f64; r.tokens * d];
    for n in 0..r.tokens {
        let xn: Vec<f64> = x[n * d..(n + 1) * d]
            .iter()
            .map(|&v| f64::from(v))
            .collect();
        for s in 0..r.top_k {
            let e = r.indices[n * r.top_k + s] as usize;
            let w = f64::from(r.weights[n * r.top_k + s]);
            let mut act = vec![0f64; h];
            for (i, a) in act.iter_mut().enumerate() {
                let g: f64 = (0..d).map(|j| m.gate[e][i * d + j] * xn[j]).sum();
                let u: f64 = (0..d).map(|j| m.up[e][i * d + j] * xn[j]).sum();
                *a = g / (1.0 + (-g).exp()) * u;
            }
            for o in 0..d {
                let v: f64 = (0..h).map(|i| m.down[e][o * h + i] * act[i]).sum();
                y[n * d + o] += w * v;
            }
        }
    }
    y
}

/// Largest `max|Δy| / max|y|` over the tokens.
pub fn rel_err(y: &[f32], r: &[f64], d: usize) -> f64 {
    let mut worst = 0f64;
    for (a, b) in y.chunks(d).zip(r.chunks(d)) {
        let scale = b.iter().fold(0f64, |m, v| m.max(v.abs())).max(1e-30);
        let diff = a
            .iter()
            .zip(b)
            .fold(0f64, |m, (&p, &q)| m.max((f64::from(p) - q).abs()));
        worst = worst.max(diff / scale);
    }
    worst
}

/// A CPU layer of `shape` in `dtype` (weights from `seed`).
pub fn layer(
    shape: MoeShape,
    dtype: WeightDtype,
    fused: bool,
    cutoff: usize,
    seed: u64,
) -> Result<SwitchMlp> {
    synthetic::layer(shape, dtype, fused, cutoff, seed)
}

/// Builds the backend's layer from a CPU layer (its weights, its cutoff).
pub type MoeFactory<'a> = &'a dyn Fn(&SwitchMlp) -> std::result::Result<Box<dyn MoeLayer>, String>;

/// The shapes of the suite: (E, k, D, H, N values). The large-N shape (hundreds of pairs
/// per expert: long sorted segments, the CPU's split products, the device's counting
/// sort at scale) takes N = 4096 in the full tier and N = 512 in the quick one, where
/// [`branches_match_reference`] runs it in f32 only.
pub fn shapes() -> Vec<(MoeShape, Vec<usize>)> {
    let s = |experts, top_k, hidden, intermediate| MoeShape {
        experts,
        top_k,
        hidden,
        intermediate,
    };
    vec![
        (s(4, 2, 64, 32), vec![1, 2, 3, 9]),
        (s(16, 4, 72, 50), vec![1, 5, 40]),
        // a hidden width of no whole vec4s (the device loads its inputs a float at a time)
        (s(4, 2, 30, 18), vec![1, 33]),
        (s(128, 8, 64, 32), vec![1, 3, 64]),
        (s(8, 8, 96, 64), vec![1, 7]),
        // more than 8 choices a token (the device's down_combine takes them 8 at a time)
        (s(12, 10, 64, 32), vec![1, 5]),
        (s(8, 2, 128, 192), vec![1, 6, 33]),
        (
            s(16, 2, 64, 32),
            vec![if super::full_tier() { 4096 } else { 512 }],
        ),
    ]
}

/// Both branches of `make(layer)` against the reference, for every format (affine
/// formats need D and H in whole groups, so D = 72, H = 50 and D = 30, H = 18 run the
/// 16-bit and f32 ones).
pub fn branches_match_reference(make: MoeFactory<'_>) -> std::result::Result<usize, String> {
    let mut checked = 0;
    let mut formats = std::collections::BTreeSet::new();
    for (shape, ns) in shapes() {
        let large = ns.iter().any(|&n| n >= 512);
        for dtype in dtypes() {
            if large && dtype != WeightDtype::F32 && !super::full_tier() {
                continue;
            }
            if let WeightDtype::Affine(q) = dtype {
                if !shape.hidden.is_multiple_of(q.group)
                    || !shape.intermediate.is_multiple_of(q.group)
                {
                    continue;
                }
            }
            let fused = shape.experts % 2 == 0;
            let cpu = layer(shape, dtype, fused, 8, 42).map_err(|e| e.to_string())?;
            let be = make(&cpu)?;
            let dense = dense(&cpu);
            for &n in &ns {
                let (x, routing) =
                    synthetic::inputs(shape, n, n as u64 + 7).map_err(|e| e.to_string())?;
                let want = reference(&dense, &x, &routing);
                for dispatch in [Dispatch::Sorted, Dispatch::Unsorted] {
                    let out = be
                        .forward_with(&x, &routing, dispatch)
                        .map_err(|e| e.to_string())?;
                    let err = rel_err(&out.y, &want, shape.hidden);
                    if err > BOUND || out.dispatch != dispatch {
                        return Err(format!(
                            "{} {shape:?} {} N={n} {dispatch:?}: relative error {err:.2e} \
                             (bound {BOUND:.0e}), took {:?}",
                            be.name(),
                            dtype.name(),
                            out.dispatch
                        ));
                    }
                    checked += 1;
                    formats.insert(dtype.name());
                }
                let auto = be.forward(&x, &routing).map_err(|e| e.to_string())?;
                let want_d = if n > be.sort_cutoff() {
                    Dispatch::Sorted
                } else {
                    Dispatch::Unsorted
                };
                if auto.dispatch != want_d {
                    return Err(format!(
                        "N = {n}: took {:?}, expected {want_d:?}",
                        auto.dispatch
                    ));
                }
            }
        }
    }
    if formats.len() != dtypes().len() {
        return Err(format!("only {formats:?} ran"));
    }
    Ok(checked)
}

/// Both branches give the same bits, for every format: a sorted call's tiled products
/// (32 rows of an expert at a time) sum each output in the order of an unsorted call's
/// row-by-row products (issue 55, item 7). Routings with experts of 1 to 3 tiles and a
/// partial last tile, and every token to one expert. (The device's contract: the CPU's
/// sorted branch sums in blocks of its own, within [`BOUND`] of the unsorted one.) The
/// quick tier runs `formats` of [`dtypes`]; the full tier all of them.
pub fn branches_agree_bitwise(
    make: MoeFactory<'_>,
    formats: &[WeightDtype],
) -> std::result::Result<usize, String> {
    let shape = MoeShape {
        experts: 6,
        top_k: 2,
        hidden: 128,
        intermediate: 64,
    };
    let mut checked = 0;
    let all = dtypes();
    let run = if super::full_tier() {
        &all[..]
    } else {
        formats
    };
    for &dtype in run {
        for fused in [false, true] {
            let cpu = layer(shape, dtype, fused, 4, 11).map_err(|e| e.to_string())?;
            let be = make(&cpu)?;
            for (n, seed) in [(45, 1u64), (70, 2), (40, 3)] {
                let (x, mut routing) =
                    synthetic::inputs(shape, n, seed).map_err(|e| e.to_string())?;
                if seed == 3 {
                    // every token to experts 4 and 1: 40 rows each (two tiles, one partial)
                    let indices = (0..n).flat_map(|_| [4u32, 1]).collect();
                    routing = Routing::new(n, 2, indices, routing.weights.clone())
                        .map_err(|e| e.to_string())?;
                }
                let s = be.forward_with(&x, &routing, Dispatch::Sorted);
                let u = be.forward_with(&x, &routing, Dispatch::Unsorted);
                let (s, u) = (s.map_err(|e| e.to_string())?, u.map_err(|e| e.to_string())?);
                if let Some(i) = (0..s.y.len()).find(|&i| s.y[i].to_bits() != u.y[i].to_bits()) {
                    return Err(format!(
                        "{} {} fused={fused} N={n}: sorted y[{i}] = {:e}, unsorted {:e}",
                        be.name(),
                        dtype.name(),
                        s.y[i],
                        u.y[i]
                    ));
                }
                checked += 1;
            }
        }
    }
    Ok(checked)
}

/// Experts that get no tokens, and every token to one expert.
pub fn uneven_routings(make: MoeFactory<'_>) -> std::result::Result<(), String> {
    let shape = MoeShape {
        experts: 12,
        top_k: 3,
        hidden: 64,
        intermediate: 32,
    };
    for dtype in [
        WeightDtype::F32,
        WeightDtype::Affine(Affine { bits: 4, group: 32 }),
    ] {
        let cpu = layer(shape, dtype, false, 2, 5).map_err(|e| e.to_string())?;
        let be = make(&cpu)?;
        let dense = dense(&cpu);
        let n = 10;
        let (x, _) = synthetic::inputs(shape, n, 3).map_err(|e| e.to_string())?;
        for pick in [[0u32, 5, 11], [7, 7, 7]] {
            let indices: Vec<u32> = (0..n)
                .flat_map(|t| pick.map(|e| (e + t as u32 % 2) % 12))
                .collect();
            let weights: Vec<f32> = (0..n * 3).map(|i| 0.2 + 0.1 * (i % 3) as f32).collect();
            let routing = Routing::new(n, 3, indices, weights).map_err(|e| e.to_string())?;
            let want = reference(&dense, &x, &routing);
            for dispatch in [Dispatch::Sorted, Dispatch::Unsorted] {
                let out = be
                    .forward_with(&x, &routing, dispatch)
                    .map_err(|e| e.to_string())?;
                let err = rel_err(&out.y, &want, shape.hidden);
                if err > BOUND {
                    return Err(format!("{pick:?} {dispatch:?}: relative error {err:.2e}"));
                }
            }
        }
    }
    Ok(())
}

/// Routing on the backend gives the CPU's experts and weights, bit for bit, for both
/// routers.
/// Experts 64, Qwen3-MoE's 128, a count past one workgroup's 256 invocations, and
/// Mixtral's 8.
pub fn routing_matches_cpu(make: MoeFactory<'_>) -> std::result::Result<(), String> {
    for (experts, top_k) in [(64, 8), (128, 8), (300, 6), (8, 2)] {
        routing_matches_cpu_at(make, experts, top_k)?;
    }
    Ok(())
}

fn routing_matches_cpu_at(
    make: MoeFactory<'_>,
    experts: usize,
    top_k: usize,
) -> std::result::Result<(), String> {
    let shape = MoeShape {
        experts,
        top_k,
        hidden: 32,
        intermediate: 32,
    };
    let cpu = layer(shape, WeightDtype::F32, true, 4, 9).map_err(|e| e.to_string())?;
    let be = make(&cpu)?;
    let n = 37;
    let (x, _) = synthetic::inputs(shape, n, 1).map_err(|e| e.to_string())?;
    let mut logits = synthetic::uniform(n * shape.experts, 3.0, 77);
    // ties: equal logits in some rows
    for v in logits.iter_mut().take(8) {
        *v = 1.25;
    }
    // and the signed zeros on top of row 1 (the CPU's total order puts -0 below +0)
    let row1 = &mut logits[experts..2 * experts];
    row1.fill(-1.0);
    row1[0] = -0.0;
    row1[1] = 0.0;
    row1[experts - 1] = 0.0;
    // the layer's routing of the call (and its output) against the CPU's routing
    let route = |router: Router, when: &str| -> std::result::Result<(Routing, MoeOutput), String> {
        let want =
            route_with(&logits, shape.experts, shape.top_k, router).map_err(|e| e.to_string())?;
        let (got, out) = be
            .route_forward(&x, &logits, shape.top_k, router)
            .map_err(|e| e.to_string())?;
        if got != want {
            return Err(format!(
                "E {experts} k {top_k} {router:?}{when}: routing {:?}.. vs cpu {:?}..",
                &got.indices[..top_k],
                &want.indices[..top_k]
            ));
        }
        Ok((want, out))
    };
    for router in [
        Router::SoftmaxTopK { renormalize: true },
        Router::SoftmaxTopK { renormalize: false },
        Router::TopKSoftmax,
    ] {
        let (want, out) = route(router, "")?;
        let cpu_out = cpu.forward(&x, &want).map_err(|e| e.to_string())?;
        let err = rel_err(
            &out.y,
            &cpu_out.y.iter().map(|&v| f64::from(v)).collect::<Vec<_>>(),
            shape.hidden,
        );
        if err > BOUND {
            return Err(format!(
                "E {experts} k {top_k} {router:?}: output differs from the CPU by {err:.2e}"
            ));
        }
    }
    // a call of more (token, expert) rows grows the layer's working space; the first
    // call again must still route as the CPU does (a device layer's kept calls must not
    // compute into the space it had before)
    let wide = MoeShape {
        top_k: experts.min(4 * top_k),
        ..shape
    };
    let (_, more) = synthetic::inputs(wide, n, 2).map_err(|e| e.to_string())?;
    be.forward_with(&x, &more, Dispatch::Sorted)
        .map_err(|e| e.to_string())?;
    route(
        Router::TopKSoftmax,
        &format!(", after a call of top-k {}", wide.top_k),
    )?;
    Ok(())
}

/// Expert weights of `dtype` from f32 values (what the suite's layers are made of).
pub fn expert_weights(
    e: usize,
    out: usize,
    inp: usize,
    dtype: WeightDtype,
    seed: u64,
) -> Result<ExpertWeights> {
    let v = synthetic::uniform(e * out * inp, 1.0 / (inp as f32).sqrt(), seed);
    ExpertWeights::from_f32(v, e, out, inp)?.converted(dtype)
}
