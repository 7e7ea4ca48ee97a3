//! The CPU's MoE layer: [`SwitchMlp`]'s forward pass (both branches of the contract's
//! dispatch, docs/CONTRACT.md), the grouped matrix products, and
//! the products of [`ExpertWeights`] in each weight format over the CPU's kernels
//! (16-bit widened and affine dequantized in registers, f32 through the `gemm` crate).
//! The layer's definition (weights, shapes, cutoff, counts) and the shared semantics
//! (routing, the plan, gather, scatter, combine) are `crate::moe`'s.

use std::cell::RefCell;
use std::sync::atomic::Ordering;

use half::{bf16, f16};
use rayon::prelude::*;

use super::kernels;
use crate::backend::MoeLayer;
use crate::error::{Error, Result};
use crate::moe::weights::WeightData;
use crate::moe::{
    check_routing, combine, scatter, silu, Dispatch, DispatchPlan, ExpertWeights, GateUp, Gathered,
    MoeOutput, Routing, SwitchMlp,
};

/// Largest number of rows given to one matrix product; longer expert segments are split so
/// that both cores work when many tokens go to one expert.
const PIECE: usize = 256;

/// Grouped matmul: `out[j] = W[idx[j]] · x_in[j]`, giving `[N*k, out]`.
///
/// With `sorted`, `idx` must be non-decreasing (checked in every build: an error, not a
/// wrong result) and each expert's contiguous rows go through one matrix product (the
/// `gemm` crate; bf16 weights are widened to f32 once per product). Without it, each row
/// is one matrix-vector product that reads its expert's weights directly. Rows run in
/// parallel (rayon) either way.
pub fn grouped_matmul(
    x_in: &[f32],
    idx: &[u32],
    sorted: bool,
    weights: &ExpertWeights,
) -> Result<Vec<f32>> {
    let inf = weights.in_features;
    if Some(x_in.len()) != idx.len().checked_mul(inf) {
        return Err(Error::Shape(format!(
            "x_in holds {} values, but [rows={}, in={inf}] needs {}",
            x_in.len(),
            idx.len(),
            idx.len().saturating_mul(inf)
        )));
    }
    if let Some(j) = idx.iter().position(|&e| e as usize >= weights.experts) {
        return Err(Error::InvalidMoe {
            field: "idx",
            value: format!("idx[{j}] = {}", idx[j]),
            expected: "an expert id below E",
        });
    }
    if sorted {
        if let Some(j) = (1..idx.len()).find(|&j| idx[j] < idx[j - 1]) {
            return Err(Error::NotSorted {
                position: j,
                previous: idx[j - 1],
                next: idx[j],
            });
        }
    }
    let mut out = vec![0f32; idx.len() * weights.out_features];
    grouped_into(x_in, idx, sorted, weights, &mut out);
    Ok(out)
}

/// [`grouped_matmul`] on checked inputs, into `out`.
fn grouped_into(x_in: &[f32], idx: &[u32], sorted: bool, w: &ExpertWeights, out: &mut [f32]) {
    let (inf, of) = (w.in_features, w.out_features);
    if !sorted {
        out.par_chunks_mut(of)
            .zip(x_in.par_chunks(inf))
            .zip(idx.par_iter())
            .for_each(|((y, x), &e)| w.matvec(e as usize, x, y));
        return;
    }
    // Runs of equal ids, split into pieces of at most PIECE rows.
    let mut jobs = Vec::new();
    let mut rest = out;
    let mut s = 0;
    while s < idx.len() {
        let e = idx[s];
        let mut t = s + 1;
        while t < idx.len() && idx[t] == e && t - s < PIECE {
            t += 1;
        }
        let (dst, tail) = rest.split_at_mut((t - s) * of);
        jobs.push((e as usize, &x_in[s * inf..t * inf], dst));
        rest = tail;
        s = t;
    }
    jobs.into_par_iter()
        .for_each(|(e, lhs, dst)| w.matmul(e, lhs, dst));
}

impl SwitchMlp {
    /// `y [N, D]` for activations `x [N, D]` and a routing of the same N, choosing the
    /// branch from N.
    pub fn forward(&self, x: &[f32], routing: &Routing) -> Result<MoeOutput> {
        check_routing(routing)?;
        self.forward_with(x, routing, self.dispatch_for(routing.tokens))
    }

    /// [`SwitchMlp::forward`] with the branch forced (benchmarks, tests).
    pub fn forward_with(
        &self,
        x: &[f32],
        routing: &Routing,
        dispatch: Dispatch,
    ) -> Result<MoeOutput> {
        check_routing(routing)?;
        let sorted = dispatch == Dispatch::Sorted;
        let (d, h) = (self.hidden, self.intermediate);
        if Some(x.len()) != routing.tokens.checked_mul(d) {
            return Err(Error::Shape(format!(
                "x holds {} values, but [N={}, D={d}] needs {}",
                x.len(),
                routing.tokens,
                routing.tokens.saturating_mul(d)
            )));
        }
        let plan = DispatchPlan::new(&routing.indices, routing.top_k, self.experts, dispatch)?;
        if !sorted {
            // Two parallel phases over the pairs, each running the same one-row products
            // as the sorted branch's phases: gate/up with SwiGLU, then down. Each pair
            // reads its token's row and its expert's weights in place, so the plan's sort,
            // the gathered copy of x and the scatter back are all skipped.
            let rows = plan.rows();
            let mut act = vec![0f32; rows * h];
            act.par_chunks_mut(h)
                .with_min_len(1)
                .enumerate()
                .for_each(|(j, a)| {
                    let t = plan.token(j);
                    self.act_row(plan.idx[j] as usize, &x[t * d..(t + 1) * d], a);
                });
            let mut out = vec![0f32; rows * d];
            out.par_chunks_mut(d)
                .with_min_len(1)
                .enumerate()
                .for_each(|(j, o)| {
                    let e = plan.idx[j] as usize;
                    self.down.product_rows(e, 0, d, &act[j * h..(j + 1) * h], o);
                });
            let y = combine(&out, routing.top_k, d, &routing.weights)?;
            self.unsorted_calls.fetch_add(1, Ordering::Relaxed);
            return Ok(MoeOutput { y, dispatch });
        }
        // the gathered rows: row j is the activation of token plan.token(j)
        let mut x_in = vec![0f32; plan.rows() * d];
        x_in.par_chunks_mut(d)
            .with_min_len(64)
            .enumerate()
            .for_each(|(j, dst)| {
                let t = plan.token(j);
                dst.copy_from_slice(&x[t * d..(t + 1) * d]);
            });
        let g = Gathered {
            x_in,
            idx: plan.idx.clone(),
            sorted,
            order: if sorted {
                plan.order.clone()
            } else {
                Vec::new()
            },
            inv_order: if sorted {
                plan.inv_order.clone()
            } else {
                Vec::new()
            },
        };
        let rows = g.idx.len();
        let mut act = vec![0f32; rows * h];
        match &self.gate_up {
            GateUp::Fused(w) => {
                let mut gu = vec![0f32; rows * 2 * h];
                grouped_into(&g.x_in, &g.idx, sorted, w, &mut gu);
                act.par_chunks_mut(h)
                    .with_min_len(16)
                    .zip(gu.par_chunks(2 * h))
                    .for_each(|(a, gu)| {
                        let (gate, up) = gu.split_at(h);
                        for ((a, &g), &u) in a.iter_mut().zip(gate).zip(up) {
                            *a = silu(g) * u;
                        }
                    });
            }
            GateUp::Separate { gate, up } => {
                let mut gv = vec![0f32; rows * h];
                grouped_into(&g.x_in, &g.idx, sorted, gate, &mut gv);
                grouped_into(&g.x_in, &g.idx, sorted, up, &mut act);
                act.par_chunks_mut(h)
                    .with_min_len(16)
                    .zip(gv.par_chunks(h))
                    .for_each(|(a, gate)| {
                        for (a, &g) in a.iter_mut().zip(gate) {
                            *a *= silu(g);
                        }
                    });
            }
        }
        let mut out = vec![0f32; rows * d];
        grouped_into(&act, &g.idx, sorted, &self.down, &mut out);
        let out = scatter(out, d, sorted.then_some(g.inv_order.as_slice()))?;
        let y = combine(&out, routing.top_k, d, &routing.weights)?;
        let counter = if sorted {
            &self.sorted_calls
        } else {
            &self.unsorted_calls
        };
        counter.fetch_add(1, Ordering::Relaxed);
        Ok(MoeOutput { y, dispatch })
    }
}

thread_local! {
    /// Per-thread buffer of one row's gate and up projections.
    static GATE_UP: std::cell::RefCell<Vec<f32>> = const { std::cell::RefCell::new(Vec::new()) };
}

impl SwitchMlp {
    /// `a = silu(gate_e x) * up_e x` for one row `x` and expert `e`.
    fn act_row(&self, e: usize, x: &[f32], a: &mut [f32]) {
        let h = self.intermediate;
        GATE_UP.with(|b| {
            let gu = &mut *b.borrow_mut();
            gu.resize(2 * h, 0.0);
            match &self.gate_up {
                GateUp::Fused(w) => w.product_rows(e, 0, 2 * h, x, gu),
                GateUp::Separate { gate, up } => {
                    let (g, u) = gu.split_at_mut(h);
                    gate.product_rows(e, 0, h, x, g);
                    up.product_rows(e, 0, h, x, u);
                }
            }
            let (g, u) = gu.split_at(h);
            for ((a, &gv), &uv) in a.iter_mut().zip(g).zip(u) {
                *a = silu(gv) * uv;
            }
        });
    }
}

/// The CPU's MoE layer, beside the device's `WgpuMoe`: a [`SwitchMlp`]'s weights run by
/// the CPU's kernels, both branches in parallel with rayon. It owns the layer (moving it
/// in copies nothing).
#[derive(Debug)]
pub struct CpuMoe {
    layer: SwitchMlp,
}

impl CpuMoe {
    /// The layer run on the CPU.
    pub fn new(layer: SwitchMlp) -> Self {
        Self { layer }
    }

    /// The weights, shapes and cutoff it runs.
    pub fn layer(&self) -> &SwitchMlp {
        &self.layer
    }

    /// The layer back.
    pub fn into_inner(self) -> SwitchMlp {
        self.layer
    }
}

impl MoeLayer for CpuMoe {
    fn name(&self) -> String {
        "cpu".into()
    }
    fn dims(&self) -> (usize, usize, usize) {
        (
            self.layer.experts,
            self.layer.hidden,
            self.layer.intermediate,
        )
    }
    fn sort_cutoff(&self) -> usize {
        self.layer.sort_cutoff
    }
    fn forward_with(&self, x: &[f32], routing: &Routing, dispatch: Dispatch) -> Result<MoeOutput> {
        self.layer.forward_with(x, routing, dispatch)
    }
}

thread_local! {
    /// Per-thread buffer for a block of one expert's rows widened to f32 (sorted branch).
    static WIDE: RefCell<Vec<f32>> = const { RefCell::new(Vec::new()) };
}

/// Floats of a widened block (256 KiB: well inside a core's L2).
const WIDE_BLOCK: usize = 64 * 1024;

impl ExpertWeights {
    /// `y = W[e] · x` (`x.len() == in`, `y.len() == out`), reading the weights in their
    /// own format (16-bit widened, affine dequantized, in registers). f32 weights go
    /// through the `gemm` crate's one-row product, affine ones through the one-row case
    /// of [`kernels::matmul_affine`] (both measured faster than a dot-product loop).
    pub(crate) fn matvec(&self, e: usize, x: &[f32], y: &mut [f32]) {
        let (s, n) = self.span(e);
        let inf = self.in_features;
        match &self.data {
            WeightData::F32(v) => gemm_nt(x, &v[s..s + n], inf, y, self.out_features, 0),
            WeightData::Bf16(v) => kernels::matvec_bf16(bits16(&v[s..s + n]), x, y),
            WeightData::F16(v) => kernels::matvec_f16(bits16f(&v[s..s + n]), x, y),
            WeightData::Affine {
                q,
                packed,
                scales,
                biases,
            } => {
                let (rw, rg) = (q.row_words(inf), q.row_groups(inf));
                let r0 = e * self.out_features;
                let r1 = r0 + self.out_features;
                kernels::matmul_affine(
                    q.bits,
                    q.group,
                    inf,
                    &packed[r0 * rw..r1 * rw],
                    &scales[r0 * rg..r1 * rg],
                    &biases[r0 * rg..r1 * rg],
                    x,
                    y,
                );
            }
        }
    }

    /// `dst [m, out] = lhs [m, in] · W[e]^T`: one matrix product for f32 weights; 16-bit
    /// weights are widened a block of rows at a time into a per-thread buffer that stays
    /// in L2, each block one matrix product into its columns of `dst`; affine weights go
    /// through [`kernels::matmul_affine`], which dequantizes 16 packed words at a time in
    /// registers and applies them to every row of `lhs`.
    pub(crate) fn matmul(&self, e: usize, lhs: &[f32], dst: &mut [f32]) {
        let (s, n) = self.span(e);
        let (inf, of) = (self.in_features, self.out_features);
        let mut widen_blocks = |widen: &dyn Fn(usize, usize, &mut [f32])| {
            WIDE.with(|buf| {
                let mut buf = buf.borrow_mut();
                let block = (WIDE_BLOCK / inf).clamp(1, of);
                buf.resize(block * inf, 0.0);
                let mut r0 = 0;
                while r0 < of {
                    let r1 = (r0 + block).min(of);
                    let wb = &mut buf[..(r1 - r0) * inf];
                    widen(r0, r1, wb);
                    gemm_nt(lhs, wb, inf, dst, of, r0);
                    r0 = r1;
                }
            })
        };
        match &self.data {
            WeightData::F32(v) => gemm_nt(lhs, &v[s..s + n], inf, dst, of, 0),
            WeightData::Bf16(v) => {
                let w = bits16(&v[s..s + n]);
                widen_blocks(&|r0, r1, wb| kernels::widen_bf16(&w[r0 * inf..r1 * inf], wb));
            }
            WeightData::F16(v) => {
                let w = bits16f(&v[s..s + n]);
                widen_blocks(&|r0, r1, wb| kernels::widen_f16(&w[r0 * inf..r1 * inf], wb));
            }
            WeightData::Affine {
                q,
                packed,
                scales,
                biases,
            } => {
                let (rw, rg) = (q.row_words(inf), q.row_groups(inf));
                let r0 = e * of;
                let r1 = r0 + of;
                kernels::matmul_affine(
                    q.bits,
                    q.group,
                    inf,
                    &packed[r0 * rw..r1 * rw],
                    &scales[r0 * rg..r1 * rg],
                    &biases[r0 * rg..r1 * rg],
                    lhs,
                    dst,
                );
            }
        }
    }

    /// `out [m, r1 - r0] = lhs [m, in] · W[e][r0 .. r1]^T`: the product for a range of
    /// output rows, so that a caller can split a large matrix across threads. Each output
    /// depends only on its own row of `lhs` and of the weights, read in the same order
    /// whatever the range and `m` is 1 (one-row products are what a decode step runs);
    /// with `m > 1`, f32 and 16-bit weights go through the `gemm` crate.
    pub(crate) fn product_rows(
        &self,
        e: usize,
        r0: usize,
        r1: usize,
        lhs: &[f32],
        out: &mut [f32],
    ) {
        let inf = self.in_features;
        let (s, _) = self.span(e);
        let n = r1 - r0;
        let m = lhs.len() / inf;
        debug_assert!(r0 <= r1 && r1 <= self.out_features && out.len() == m * n);
        let at = s + r0 * inf;
        match &self.data {
            WeightData::F32(v) => gemm_nt(lhs, &v[at..at + n * inf], inf, out, n, 0),
            WeightData::Bf16(v) if m == 1 => {
                kernels::matvec_bf16(bits16(&v[at..at + n * inf]), lhs, out)
            }
            WeightData::F16(v) if m == 1 => {
                kernels::matvec_f16(bits16f(&v[at..at + n * inf]), lhs, out)
            }
            WeightData::Bf16(v) => WIDE.with(|buf| {
                let mut buf = buf.borrow_mut();
                buf.resize(n * inf, 0.0);
                kernels::widen_bf16(bits16(&v[at..at + n * inf]), &mut buf);
                gemm_nt(lhs, &buf, inf, out, n, 0);
            }),
            WeightData::F16(v) => WIDE.with(|buf| {
                let mut buf = buf.borrow_mut();
                buf.resize(n * inf, 0.0);
                kernels::widen_f16(bits16f(&v[at..at + n * inf]), &mut buf);
                gemm_nt(lhs, &buf, inf, out, n, 0);
            }),
            WeightData::Affine {
                q,
                packed,
                scales,
                biases,
            } => {
                let (rw, rg) = (q.row_words(inf), q.row_groups(inf));
                let a = e * self.out_features + r0;
                let b = a + n;
                kernels::matmul_affine(
                    q.bits,
                    q.group,
                    inf,
                    &packed[a * rw..b * rw],
                    &scales[a * rg..b * rg],
                    &biases[a * rg..b * rg],
                    lhs,
                    out,
                );
            }
        }
    }
}

fn bits16(v: &[bf16]) -> &[u16] {
    use half::slice::HalfFloatSliceExt;
    v.reinterpret_cast()
}

fn bits16f(v: &[f16]) -> &[u16] {
    use half::slice::HalfFloatSliceExt;
    v.reinterpret_cast()
}

/// Columns `col .. col + n` of `dst [m, width]` (row-major) get `lhs [m, k] · w^T` where
/// `w` is `[n, k]`, all row-major, with the `gemm` crate.
pub(crate) fn gemm_nt(lhs: &[f32], w: &[f32], k: usize, dst: &mut [f32], width: usize, col: usize) {
    let m = lhs.len() / k;
    let n = w.len() / k;
    assert!(lhs.len() == m * k && w.len() == n * k && dst.len() == m * width && col + n <= width);
    if m == 0 || n == 0 {
        return;
    }
    // SAFETY: lhs and w hold exactly m*k and n*k values and dst m*width (asserted above).
    // The strides address only inside them: lhs (i, kk) at i*k + kk; rhs = w^T, (kk, j) at
    // j*k + kk; dst (i, j) at col + i*width + j <= (m-1)*width + width - 1. dst is a `&mut`
    // and so aliases neither input.
    unsafe {
        gemm::gemm(
            m,
            n,
            k,
            dst.as_mut_ptr().add(col),
            1,
            width as isize,
            false,
            lhs.as_ptr(),
            1,
            k as isize,
            w.as_ptr(),
            k as isize,
            1,
            0.0,
            1.0,
            false,
            false,
            false,
            gemm::Parallelism::None,
        );
    }
}

#[cfg(test)]
mod tests {
    use crate::moe::{Affine, ExpertWeights};

    /// Products over every format equal the reference (dequantize, then f32) within f32
    /// rounding: rows that fill 16-word blocks and rows that do not, every group size.
    #[test]
    fn products_match_the_dequantized_reference() {
        let formats = [(4, 32), (4, 64), (4, 128), (8, 32), (8, 64), (8, 128)];
        for (bits, group) in formats {
            let q = Affine::new(bits, group).unwrap();
            for inf in [group, 3 * group, 1024 + group] {
                let (e, of) = (2, 5);
                let v: Vec<f32> = (0..e * of * inf)
                    .map(|i| ((i * 7919 % 1009) as f32 / 1009.0 - 0.5) * 0.3)
                    .collect();
                let w = ExpertWeights::from_f32(v, e, of, inf)
                    .unwrap()
                    .quantized(q)
                    .unwrap();
                let x: Vec<f32> = (0..3 * inf)
                    .map(|i| ((i * 31 % 17) as f32 - 8.0) * 0.1)
                    .collect();
                for ex in 0..e {
                    let r = w.expert_f32(ex);
                    let want: Vec<f64> = (0..3)
                        .flat_map(|t| {
                            let r = &r;
                            let x = &x;
                            (0..of).map(move |o| {
                                (0..inf)
                                    .map(|i| f64::from(r[o * inf + i]) * f64::from(x[t * inf + i]))
                                    .sum::<f64>()
                            })
                        })
                        .collect();
                    let scale: f64 = want.iter().fold(0f64, |m, v| m.max(v.abs()));
                    let mut y = vec![0f32; of];
                    w.matvec(ex, &x[..inf], &mut y);
                    for (o, &yv) in y.iter().enumerate() {
                        assert!(
                            (f64::from(yv) - want[o]).abs() <= 1e-5 * scale,
                            "q{bits}g{group} in={inf}: matvec {yv} vs {}",
                            want[o]
                        );
                    }
                    let mut d = vec![0f32; 3 * of];
                    w.matmul(ex, &x, &mut d);
                    for (k, &dv) in d.iter().enumerate() {
                        assert!(
                            (f64::from(dv) - want[k]).abs() <= 1e-5 * scale,
                            "q{bits}g{group} in={inf}: matmul {dv} vs {}",
                            want[k]
                        );
                    }
                }
            }
        }
    }
}
