//! Mixture-of-experts dispatch with a run-time sort decision (the contract's section 7).
//!
//! A token is routed to `k` of `E` experts. The `N * k` (token, expert) pairs are
//! **gathered** into `x_in [N*k, D]` with their expert ids `idx [N*k]`, multiplied by their
//! expert's matrix (**grouped matmul**), put back in token order (**scatter**) and summed
//! with the routing weights (**combine**).
//!
//! Sorting the pairs by expert makes each expert's rows contiguous, so one matrix product
//! per expert serves all its rows (prefill). With one token (decode) the sort, the gather
//! and the scatter buy nothing, and a matrix-vector product per row is cheaper. A
//! [`SwitchMlp`] decides per call, from the token count `N`, against the `sort_cutoff` it
//! was built with: it sorts when `N > sort_cutoff`.
//!
//! ```
//! use decoda::moe::{route, ExpertWeights, GateUp, SwitchMlp, Dispatch};
//!
//! let (e, d, h) = (4, 8, 6); // experts, hidden, intermediate
//! let w = |out: usize, inp: usize| {
//!     let v = (0..e * out * inp).map(|i| ((i % 7) as f32 - 3.0) * 0.05).collect();
//!     ExpertWeights::from_f32(v, e, out, inp)
//! };
//! let layer = SwitchMlp::new(GateUp::Fused(w(2 * h, d)?), w(d, h)?, 16)?;
//! let x = vec![0.1f32; 2 * d]; // two tokens
//! let router_logits = vec![0.5f32, 2.0, -1.0, 1.0, 0.0, 0.0, 3.0, 0.0]; // [2, E]
//! let routing = route(&router_logits, e, 2, true)?;
//! let out = layer.forward(&x, &routing)?;
//! assert_eq!(out.y.len(), 2 * d);
//! assert_eq!(out.dispatch, Dispatch::Unsorted); // N = 2 <= sort_cutoff = 16
//! # Ok::<(), decoda::Error>(())
//! ```

use std::sync::atomic::{AtomicU64, Ordering};

use rayon::prelude::*;
use serde::Serialize;

use crate::error::{Error, Result};

mod plan;
pub mod quant;
pub(crate) mod weights;

pub use plan::DispatchPlan;
pub use quant::Affine;
use weights::at_least_one;
pub use weights::{ExpertWeights, WeightDtype};

/// The routing of `tokens` tokens: `k` expert ids and weights per token, `[N, k]` row-major.
#[derive(Clone, Debug, PartialEq)]
pub struct Routing {
    /// Number of tokens N.
    pub tokens: usize,
    /// Experts per token k.
    pub top_k: usize,
    /// `expert_indices [N, k]`.
    pub indices: Vec<u32>,
    /// `expert_weights [N, k]`.
    pub weights: Vec<f32>,
}

impl Routing {
    /// A routing from explicit indices and weights (`[tokens, top_k]` each). Checks the
    /// lengths and that every weight is finite; expert ids are checked against a layer's E
    /// when it runs.
    pub fn new(tokens: usize, top_k: usize, indices: Vec<u32>, weights: Vec<f32>) -> Result<Self> {
        at_least_one(&[("top_k", top_k)])?;
        for (name, len) in [
            ("expert_indices", indices.len()),
            ("expert_weights", weights.len()),
        ] {
            if Some(len) != tokens.checked_mul(top_k) {
                return Err(Error::Shape(format!(
                    "{name} holds {len} values, but [N={tokens}, k={top_k}] needs {}",
                    tokens.saturating_mul(top_k)
                )));
            }
        }
        if let Some(i) = weights.iter().position(|w| !w.is_finite()) {
            return Err(Error::InvalidMoe {
                field: "expert_weights",
                value: format!("{} at token {}, slot {}", weights[i], i / top_k, i % top_k),
                expected: "a finite number",
            });
        }
        Ok(Self {
            tokens,
            top_k,
            indices,
            weights,
        })
    }
}

/// How a router turns a token's `E` logits into `k` experts and their weights.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Router {
    /// Softmax over all `E` logits, then the `k` largest probabilities; with
    /// `renormalize`, divided by their sum (Qwen3-MoE, `norm_topk_prob`).
    SoftmaxTopK {
        /// Divide the `k` weights by their sum.
        renormalize: bool,
    },
    /// The `k` largest logits, then a softmax over those `k` (Mixtral).
    TopKSoftmax,
}

/// Router softmax and top-k: `router_logits [N, E]` to `k` experts per token, as
/// [`route_with`] with [`Router::SoftmaxTopK`].
pub fn route(
    router_logits: &[f32],
    experts: usize,
    top_k: usize,
    renormalize: bool,
) -> Result<Routing> {
    route_with(
        router_logits,
        experts,
        top_k,
        Router::SoftmaxTopK { renormalize },
    )
}

/// Routing: `router_logits [N, E]` to `k` experts per token and their weights.
///
/// Every backend computes exactly this, in f32: `m` = the row's max, `e_i = exp(l_i - m)`
/// with decoda's own `exp` ([`crate::fmath::exp`]), `p_i = e_i / Σ e` (summed in expert
/// order, an IEEE division). [`Router::SoftmaxTopK`] keeps the `k` largest `p_i` (ties to
/// the smaller expert id, in decreasing order) and with `renormalize` divides each by
/// their sum (summed in that order). [`Router::TopKSoftmax`] keeps the `k` largest logits
/// the same way and takes the softmax over them alone.
pub fn route_with(
    router_logits: &[f32],
    experts: usize,
    top_k: usize,
    router: Router,
) -> Result<Routing> {
    at_least_one(&[("experts", experts)])?;
    if top_k == 0 || top_k > experts {
        return Err(Error::InvalidMoe {
            field: "top_k",
            value: top_k.to_string(),
            expected: "1 ..= experts",
        });
    }
    if !router_logits.len().is_multiple_of(experts) {
        return Err(Error::Shape(format!(
            "router_logits holds {} values, not a multiple of E = {experts}",
            router_logits.len()
        )));
    }
    let tokens = router_logits.len() / experts;
    if let Some(i) = router_logits.iter().position(|v| !v.is_finite()) {
        return Err(Error::InvalidMoe {
            field: "router_logits",
            value: format!(
                "{} at token {}, expert {}",
                router_logits[i],
                i / experts,
                i % experts
            ),
            expected: "a finite number",
        });
    }
    let mut indices = Vec::with_capacity(tokens * top_k);
    let mut weights = Vec::with_capacity(tokens * top_k);
    let mut probs = vec![0f32; experts];
    let mut ids: Vec<u32> = Vec::with_capacity(experts);
    for row in router_logits.chunks_exact(experts) {
        let m = row.iter().copied().fold(f32::NEG_INFINITY, f32::max);
        let mut pick = |v: &[f32]| {
            let by = |a: &u32, b: &u32| v[*b as usize].total_cmp(&v[*a as usize]).then(a.cmp(b));
            ids.clear();
            ids.extend(0..experts as u32);
            if top_k < experts {
                ids.select_nth_unstable_by(top_k - 1, by);
            }
            ids[..top_k].sort_unstable_by(by);
        };
        match router {
            Router::SoftmaxTopK { renormalize } => {
                let mut sum = 0f32;
                for (p, &v) in probs.iter_mut().zip(row) {
                    *p = crate::fmath::exp(v - m);
                    sum += *p;
                }
                for p in probs.iter_mut() {
                    *p /= sum;
                }
                pick(&probs);
                let chosen = &ids[..top_k];
                indices.extend_from_slice(chosen);
                if renormalize {
                    let norm: f32 = chosen.iter().fold(0f32, |a, &e| a + probs[e as usize]);
                    weights.extend(chosen.iter().map(|&e| probs[e as usize] / norm));
                } else {
                    weights.extend(chosen.iter().map(|&e| probs[e as usize]));
                }
            }
            Router::TopKSoftmax => {
                pick(row);
                let chosen = &ids[..top_k];
                let top = row[chosen[0] as usize];
                let e: Vec<f32> = chosen
                    .iter()
                    .map(|&c| crate::fmath::exp(row[c as usize] - top))
                    .collect();
                let sum: f32 = e.iter().fold(0f32, |a, &v| a + v);
                indices.extend_from_slice(chosen);
                weights.extend(e.iter().map(|&v| v / sum));
            }
        }
    }
    Ok(Routing {
        tokens,
        top_k,
        indices,
        weights,
    })
}

/// The result of [`gather`]: the `N*k` rows in the order the grouped matmul reads them.
#[derive(Clone, Debug, PartialEq)]
pub struct Gathered {
    /// `x_in [N*k, D]`: row `j` is the activation of the token that pair `j` belongs to.
    pub x_in: Vec<f32>,
    /// `idx [N*k]`: the expert of row `j` (non-decreasing when `sorted`).
    pub idx: Vec<u32>,
    /// Whether the pairs were sorted by expert.
    pub sorted: bool,
    /// Sorted: the stable argsort of the flattened expert ids (`idx = flat[order]`).
    /// Unsorted: empty.
    pub order: Vec<u32>,
    /// Sorted: the inverse permutation of `order` (`inv_order[order[j]] == j`).
    /// Unsorted: empty.
    pub inv_order: Vec<u32>,
}

/// The stable argsort of expert ids `flat` (each `< experts`): positions ordered by expert,
/// and by position within an expert. A counting sort, O(len + experts).
pub fn stable_argsort(flat: &[u32], experts: usize) -> Result<Vec<u32>> {
    check_ids(flat, 1, experts)?;
    let mut start = vec![0usize; experts + 1];
    for &e in flat {
        start[e as usize + 1] += 1;
    }
    for i in 0..experts {
        start[i + 1] += start[i];
    }
    let mut order = vec![0u32; flat.len()];
    for (pos, &e) in flat.iter().enumerate() {
        let slot = &mut start[e as usize];
        order[*slot] = pos as u32;
        *slot += 1;
    }
    Ok(order)
}

pub(crate) fn check_ids(flat: &[u32], top_k: usize, experts: usize) -> Result<()> {
    if let Some(i) = flat.iter().position(|&e| e as usize >= experts) {
        return Err(Error::ExpertOutOfRange {
            token: i / top_k,
            slot: i % top_k,
            expert: flat[i],
            experts,
        });
    }
    Ok(())
}

/// Gather: `x [N, D]` and `expert_indices [N, k]` to the rows of the grouped matmul.
///
/// Sorted (`sort = true`): `order` is the stable argsort of the flattened ids,
/// `idx = flat[order]`, `x_in[j] = x[order[j] / k]`, and `inv_order` inverts `order`.
/// Unsorted: `idx = flat`, `x_in[j] = x[j / k]`. Both give `x_in [N*k, D]` and `idx [N*k]`.
pub fn gather(
    x: &[f32],
    hidden: usize,
    expert_indices: &[u32],
    top_k: usize,
    experts: usize,
    sort: bool,
) -> Result<Gathered> {
    at_least_one(&[("top_k", top_k), ("hidden", hidden)])?;
    if !expert_indices.len().is_multiple_of(top_k) {
        return Err(Error::Shape(format!(
            "expert_indices holds {} values, not a multiple of k = {top_k}",
            expert_indices.len()
        )));
    }
    let tokens = expert_indices.len() / top_k;
    if Some(x.len()) != tokens.checked_mul(hidden) {
        return Err(Error::Shape(format!(
            "x holds {} values, but [N={tokens}, D={hidden}] needs {}",
            x.len(),
            tokens.saturating_mul(hidden)
        )));
    }
    check_ids(expert_indices, top_k, experts)?;
    let rows = expert_indices.len();
    if rows > u32::MAX as usize {
        return Err(Error::Shape(format!(
            "{rows} gathered rows: more than 2^32 - 1"
        )));
    }
    let mut x_in = vec![0f32; rows * hidden];
    if sort {
        let order = stable_argsort(expert_indices, experts)?;
        let idx: Vec<u32> = order.iter().map(|&p| expert_indices[p as usize]).collect();
        let mut inv_order = vec![0u32; rows];
        for (j, &p) in order.iter().enumerate() {
            inv_order[p as usize] = j as u32;
        }
        x_in.par_chunks_mut(hidden)
            .with_min_len(64)
            .zip(order.par_iter())
            .for_each(|(dst, &p)| {
                let t = p as usize / top_k;
                dst.copy_from_slice(&x[t * hidden..(t + 1) * hidden]);
            });
        Ok(Gathered {
            x_in,
            idx,
            sorted: true,
            order,
            inv_order,
        })
    } else {
        x_in.par_chunks_mut(hidden)
            .with_min_len(64)
            .enumerate()
            .for_each(|(j, dst)| {
                let t = j / top_k;
                dst.copy_from_slice(&x[t * hidden..(t + 1) * hidden]);
            });
        Ok(Gathered {
            x_in,
            idx: expert_indices.to_vec(),
            sorted: false,
            order: Vec::new(),
            inv_order: Vec::new(),
        })
    }
}

/// Scatter: rows of the grouped matmul `out [N*k, width]` back to token order.
/// Sorted (`inv_order` given): row `i` of the result is `out[inv_order[i]]`; unsorted
/// (`None`): `out` as is. View the result as `[N, k, width]`.
pub fn scatter(out: Vec<f32>, width: usize, inv_order: Option<&[u32]>) -> Result<Vec<f32>> {
    let Some(inv) = inv_order else {
        return Ok(out);
    };
    if width == 0 || Some(out.len()) != inv.len().checked_mul(width) {
        return Err(Error::Shape(format!(
            "out holds {} values, but [rows={}, width={width}] needs {}",
            out.len(),
            inv.len(),
            inv.len().saturating_mul(width)
        )));
    }
    if let Some(i) = inv.iter().position(|&p| p as usize >= inv.len()) {
        return Err(Error::InvalidMoe {
            field: "inv_order",
            value: format!("inv_order[{i}] = {}", inv[i]),
            expected: "a permutation of 0 .. N*k",
        });
    }
    let mut res = vec![0f32; out.len()];
    res.par_chunks_mut(width)
        .with_min_len(64)
        .zip(inv.par_iter())
        .for_each(|(dst, &p)| {
            let p = p as usize;
            dst.copy_from_slice(&out[p * width..(p + 1) * width]);
        });
    Ok(res)
}

/// Combine: `y[n] = Σ_s expert_weights[n, s] * out[n, s]` for `out [N, k, width]`, summed in
/// slot order `s = 0 .. k`.
pub fn combine(
    out: &[f32],
    top_k: usize,
    width: usize,
    expert_weights: &[f32],
) -> Result<Vec<f32>> {
    if top_k == 0 || !expert_weights.len().is_multiple_of(top_k) {
        return Err(Error::Shape(format!(
            "expert_weights holds {} values, not a multiple of k = {top_k}",
            expert_weights.len()
        )));
    }
    let tokens = expert_weights.len() / top_k;
    if Some(out.len()) != expert_weights.len().checked_mul(width) {
        return Err(Error::Shape(format!(
            "out holds {} values, but [N={tokens}, k={top_k}, width={width}] needs {}",
            out.len(),
            expert_weights.len().saturating_mul(width)
        )));
    }
    let mut y = vec![0f32; tokens * width];
    if width == 0 {
        return Ok(y);
    }
    y.par_chunks_mut(width)
        .zip(out.par_chunks(top_k * width))
        .zip(expert_weights.par_chunks(top_k))
        .for_each(|((dst, rows), ws)| {
            for (row, &wt) in rows.chunks_exact(width).zip(ws) {
                for (d, &v) in dst.iter_mut().zip(row) {
                    *d += wt * v;
                }
            }
        });
    Ok(y)
}

/// `silu(g) = g / (1 + exp(-g))`.
#[inline]
pub fn silu(g: f32) -> f32 {
    g / (1.0 + (-g).exp())
}

/// The gate and up projections of SwiGLU experts.
#[derive(Clone, Debug)]
pub enum GateUp {
    /// Two matrices, each `[E, H, D]`.
    Separate {
        /// `gate [E, H, D]`.
        gate: ExpertWeights,
        /// `up [E, H, D]`.
        up: ExpertWeights,
    },
    /// One `[E, 2H, D]` matrix: rows `0 .. H` of each expert are the gate, `H .. 2H` the up
    /// projection.
    Fused(ExpertWeights),
}

/// Which branch a call took.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Dispatch {
    /// Pairs sorted by expert, one matrix product per expert.
    Sorted,
    /// Pairs in token order, one matrix-vector product per pair.
    Unsorted,
}

/// How many calls of a layer took each branch.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct DispatchCounts {
    /// Calls that sorted.
    pub sorted: u64,
    /// Calls that did not.
    pub unsorted: u64,
}

/// The output of a [`SwitchMlp`] call.
#[derive(Clone, Debug, PartialEq)]
pub struct MoeOutput {
    /// `y [N, D]`.
    pub y: Vec<f32>,
    /// The branch this call took.
    pub dispatch: Dispatch,
}

/// A layer of SwiGLU experts: `y[n] = Σ_s w[n,s] · down_e(silu(gate_e x[n]) * up_e x[n])`
/// with `e = expert_indices[n, s]`, sorting the pairs by expert iff `N > sort_cutoff`.
#[derive(Debug)]
pub struct SwitchMlp {
    pub(crate) gate_up: GateUp,
    pub(crate) down: ExpertWeights,
    pub(crate) experts: usize,
    pub(crate) hidden: usize,
    pub(crate) intermediate: usize,
    pub(crate) sort_cutoff: usize,
    pub(crate) sorted_calls: AtomicU64,
    pub(crate) unsorted_calls: AtomicU64,
}

impl SwitchMlp {
    /// A layer from gate/up weights (`[E, H, D]` twice, or fused `[E, 2H, D]`), down weights
    /// `[E, D, H]`, and `sort_cutoff >= 1`: calls with more than `sort_cutoff` tokens sort.
    pub fn new(gate_up: GateUp, down: ExpertWeights, sort_cutoff: usize) -> Result<Self> {
        if sort_cutoff == 0 {
            return Err(Error::InvalidMoe {
                field: "sort_cutoff",
                value: "0".into(),
                expected: "at least 1 (calls with N > sort_cutoff sort)",
            });
        }
        let (experts, hidden) = (down.experts, down.out_features);
        let intermediate = down.in_features;
        let shape =
            |w: &ExpertWeights| format!("[{}, {}, {}]", w.experts, w.out_features, w.in_features);
        let bad = |name: &str, w: &ExpertWeights, want: String| {
            Error::Shape(format!(
                "{name} is {} but down [E={experts}, D={hidden}, H={intermediate}] needs {name} {want}",
                shape(w)
            ))
        };
        match &gate_up {
            GateUp::Separate { gate, up } => {
                for (name, w) in [("gate", gate), ("up", up)] {
                    if (w.experts, w.out_features, w.in_features) != (experts, intermediate, hidden)
                    {
                        return Err(bad(
                            name,
                            w,
                            format!("[{experts}, {intermediate}, {hidden}]"),
                        ));
                    }
                }
            }
            GateUp::Fused(w) => {
                if (w.experts, w.out_features, w.in_features) != (experts, 2 * intermediate, hidden)
                {
                    return Err(bad(
                        "gate_up",
                        w,
                        format!("[{experts}, {}, {hidden}]", 2 * intermediate),
                    ));
                }
            }
        }
        Ok(Self {
            gate_up,
            down,
            experts,
            hidden,
            intermediate,
            sort_cutoff,
            sorted_calls: AtomicU64::new(0),
            unsorted_calls: AtomicU64::new(0),
        })
    }

    /// Number of experts E.
    pub fn experts(&self) -> usize {
        self.experts
    }

    /// Model width D.
    pub fn hidden(&self) -> usize {
        self.hidden
    }

    /// Expert width H.
    pub fn intermediate(&self) -> usize {
        self.intermediate
    }

    /// Element type of the down projection (and of the gate/up weights when they agree).
    pub fn dtype(&self) -> WeightDtype {
        self.down.dtype()
    }

    /// The cutoff fixed at construction.
    pub fn sort_cutoff(&self) -> usize {
        self.sort_cutoff
    }

    /// The branch a call with `tokens` tokens takes: sorted iff `tokens > sort_cutoff`.
    pub fn dispatch_for(&self, tokens: usize) -> Dispatch {
        if tokens > self.sort_cutoff {
            Dispatch::Sorted
        } else {
            Dispatch::Unsorted
        }
    }

    /// How many calls took each branch since the layer was built.
    pub fn counts(&self) -> DispatchCounts {
        DispatchCounts {
            sorted: self.sorted_calls.load(Ordering::Relaxed),
            unsorted: self.unsorted_calls.load(Ordering::Relaxed),
        }
    }
}

impl SwitchMlp {
    /// The gate and up weights.
    pub fn gate_up(&self) -> &GateUp {
        &self.gate_up
    }
    /// The down weights `[E, D, H]`.
    pub fn down(&self) -> &ExpertWeights {
        &self.down
    }
}

/// A [`Routing`] built by hand (its fields are public) must still hang together.
pub(crate) fn check_routing(r: &Routing) -> Result<()> {
    let want = r.tokens.checked_mul(r.top_k);
    if r.top_k == 0 || want != Some(r.indices.len()) || want != Some(r.weights.len()) {
        return Err(Error::Shape(format!(
            "routing of N = {} tokens, k = {} holds {} expert ids and {} weights",
            r.tokens,
            r.top_k,
            r.indices.len(),
            r.weights.len()
        )));
    }
    Ok(())
}

/// The shape of an MoE layer and its routing.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct MoeShape {
    /// Experts E.
    pub experts: usize,
    /// Experts per token k.
    pub top_k: usize,
    /// Model width D.
    pub hidden: usize,
    /// Expert width H.
    pub intermediate: usize,
}

impl MoeShape {
    /// The default benchmark shape: Qwen3-30B-A3B's expert count and k (E = 128, k = 8)
    /// with D and H halved (2048 -> 1024, 768 -> 384): 151 M expert parameters.
    pub const QWEN3_30B_A3B_HALF: MoeShape = MoeShape {
        experts: 128,
        top_k: 8,
        hidden: 1024,
        intermediate: 384,
    };
}
