//! The model's [`Ops`] on the CPU: activations and the KV cache in host memory, matrices
//! read in their checkpoint format (16-bit widened, affine dequantized in registers),
//! output rows of every product split across threads in fixed ranges, attention one task
//! per (row, head), MoE through [`crate::moe::SwitchMlp`].
//!
//! Every value depends only on its own row and the weights, summed in an order fixed by
//! the shapes: the thread count never changes a result, and a decode call (one token per
//! slot) runs each row as a one-row product, so a sequence's logits are the same in any
//! batch (the MoE layers too, as long as the batch stays within their `sort_cutoff`).

use std::sync::Arc;

use rayon::prelude::*;

use super::head::CpuHead;
use crate::error::{Error, Result};
use crate::head::{Head, SlotRequest, SlotStep};
use crate::logits::Logits;
use crate::model::generate::Engine;
use crate::model::ops::{Acc, Act, ModelWeights, MoeBlock, NormId, Ops, RopeTable, WeightId};
use crate::model::speculate::{check_segments, Forward};
use crate::moe::{route_with, Dispatch, ExpertWeights};

/// Floats of weights one task of a product reads (so ranges are fixed by the shapes).
const TASK_FLOATS: usize = 1 << 16;

/// A sequence's keys and values, per layer `[positions, Hkv * hd]`.
#[derive(Debug, Default, Clone)]
struct SlotCache {
    k: Vec<Vec<f32>>,
    v: Vec<Vec<f32>>,
    len: usize,
}

/// The model on the CPU, with `slots` KV caches.
#[derive(Debug)]
pub struct CpuModel {
    model: Arc<dyn ModelWeights>,
    rope: RopeTable,
    caches: Vec<SlotCache>,
    // the current call
    rows: Vec<(usize, usize)>,
    tokens: Vec<u32>,
    out_rows: Vec<usize>,
    one_row_products: bool,
    /// The call's MoE layers take the unsorted branch whatever its token count
    /// ([`CpuModel::run_every`]: every row as it would run alone).
    unsorted_moe: bool,
    acts: [Vec<f32>; 9],
    logits: Vec<f32>,
}

fn slot_of(a: Act) -> usize {
    match a {
        Act::X => 0,
        Act::H => 1,
        Act::Q => 2,
        Act::K => 3,
        Act::V => 4,
        Act::A => 5,
        Act::G => 6,
        Act::R => 7,
        Act::M => 8,
    }
}

/// `out [m, of] = x [m, in] · W^T` (or `+=`), output rows split into fixed ranges across
/// threads; with `one_row`, each row of `x` is its own one-row product.
fn product(w: &ExpertWeights, x: &[f32], one_row: bool, out: &mut [f32], acc: Acc) {
    let (of, inf) = (w.out_features(), w.in_features());
    let m = x.len() / inf;
    let per = (TASK_FLOATS / inf).clamp(1, of);
    let ranges: Vec<(usize, usize)> = (0..of)
        .step_by(per)
        .map(|r0| (r0, (r0 + per).min(of)))
        .collect();
    let blocks: Vec<Vec<f32>> = ranges
        .par_iter()
        .map(|&(r0, r1)| {
            let n = r1 - r0;
            let mut o = vec![0.0f32; m * n];
            if one_row {
                for (xr, orow) in x.chunks_exact(inf).zip(o.chunks_exact_mut(n)) {
                    w.product_rows(0, r0, r1, xr, orow);
                }
            } else {
                w.product_rows(0, r0, r1, x, &mut o);
            }
            o
        })
        .collect();
    for (&(r0, r1), b) in ranges.iter().zip(&blocks) {
        let n = r1 - r0;
        for i in 0..m {
            let dst = &mut out[i * of + r0..i * of + r1];
            let src = &b[i * n..(i + 1) * n];
            match acc {
                Acc::Store => dst.copy_from_slice(src),
                Acc::Add => dst.iter_mut().zip(src).for_each(|(d, s)| *d += s),
            }
        }
    }
}

/// `y = x * w / sqrt(mean(x^2) + eps)` over one group.
fn rms(x: &mut [f32], w: &[f32], eps: f32) {
    let ss: f32 = x.iter().map(|v| v * v).sum();
    let inv = 1.0 / (ss / x.len() as f32 + eps).sqrt();
    for (v, g) in x.iter_mut().zip(w) {
        *v = (*v * inv) * g;
    }
}

impl CpuModel {
    /// The model with `slots` empty sequences.
    pub fn new(model: Arc<dyn ModelWeights>, slots: usize) -> Result<Self> {
        if slots == 0 {
            return Err(Error::Model("a model needs at least one slot".into()));
        }
        let layers = model.config().num_hidden_layers;
        let rope = RopeTable::new(model.config(), 256);
        Ok(Self {
            model,
            rope,
            caches: vec![
                SlotCache {
                    k: vec![Vec::new(); layers],
                    v: vec![Vec::new(); layers],
                    len: 0
                };
                slots
            ],
            rows: Vec::new(),
            tokens: Vec::new(),
            out_rows: Vec::new(),
            one_row_products: false,
            unsorted_moe: false,
            acts: Default::default(),
            logits: Vec::new(),
        })
    }

    /// The model.
    pub fn model(&self) -> &dyn ModelWeights {
        self.model.as_ref()
    }

    /// Empties `slot`'s cache (a new sequence).
    pub fn reset(&mut self, slot: usize) -> Result<()> {
        let c = self
            .caches
            .get_mut(slot)
            .ok_or_else(|| Error::Model(format!("slot {slot}: no such slot")))?;
        c.len = 0;
        c.k.iter_mut().chain(c.v.iter_mut()).for_each(Vec::clear);
        Ok(())
    }

    /// Makes `to`'s cache a copy of `from`'s (a second sequence from the same prefix).
    pub fn fork(&mut self, from: usize, to: usize) -> Result<()> {
        let n = self.caches.len();
        if from >= n || to >= n {
            return Err(Error::Model(format!(
                "fork {from} -> {to}: the model has {n} slots"
            )));
        }
        if from != to {
            self.caches[to] = self.caches[from].clone();
        }
        Ok(())
    }

    /// Tokens `slot` holds.
    pub fn positions(&self, slot: usize) -> usize {
        self.caches.get(slot).map_or(0, |c| c.len)
    }

    /// Runs one call: `segments` of `(slot, tokens)`, each appended to its slot's
    /// sequence; the logits of each segment's last token land in [`CpuModel::logits`],
    /// one row per segment. A decode call has one token per segment; a prefill one
    /// segment. Returns the branch each MoE layer took.
    pub fn run(&mut self, segments: &[(usize, &[u32])]) -> Result<Vec<Dispatch>> {
        self.call(segments, false)
    }

    /// Runs `segments` as [`CpuModel::run`] does, with logits for every token (in
    /// [`CpuModel::logits`], segments in order) and every row computed as it is in a
    /// decode call: one-row products and the MoE layers' unsorted branch (their one-row
    /// products) whatever the token count. Row `j` of a segment is then bit for bit the
    /// row a decode call of that token alone gives at that position, when that call's
    /// MoE layers are unsorted too (its batch within their `sort_cutoff`): speculative
    /// decoding's verification (`crate::model::speculate`).
    pub fn run_every(&mut self, segments: &[(usize, &[u32])]) -> Result<Vec<Dispatch>> {
        self.call(segments, true)
    }

    /// Keeps `slot`'s first `len` positions and drops the rest (rejected drafted tokens);
    /// `len` beyond what it holds is an error.
    pub fn truncate(&mut self, slot: usize, len: usize) -> Result<()> {
        let c = self
            .caches
            .get_mut(slot)
            .ok_or_else(|| Error::Model(format!("slot {slot}: no such slot")))?;
        if len > c.len {
            return Err(Error::Model(format!(
                "slot {slot}: cannot keep {len} positions of {}",
                c.len
            )));
        }
        c.len = len;
        Ok(())
    }

    fn call(&mut self, segments: &[(usize, &[u32])], every: bool) -> Result<Vec<Dispatch>> {
        let v = self.model.config().vocab_size;
        self.rows.clear();
        self.tokens.clear();
        self.out_rows.clear();
        check_segments(segments, self.caches.len(), v)?;
        for &(slot, toks) in segments {
            let at = self.caches[slot].len;
            for (j, &t) in toks.iter().enumerate() {
                self.rows.push((slot, at + j));
                self.tokens.push(t);
                if every {
                    self.out_rows.push(self.rows.len() - 1);
                }
            }
            if !every {
                self.out_rows.push(self.rows.len() - 1);
            }
        }
        let need = self.rows.iter().map(|r| r.1 + 1).max().unwrap_or(0);
        if need > self.rope.positions() {
            self.rope = RopeTable::new(self.model.config(), need.next_power_of_two());
        }
        self.one_row_products = every || segments.iter().all(|s| s.1.len() == 1);
        self.unsorted_moe = every;
        let model = Arc::clone(&self.model);
        let branches = model.forward(self)?;
        for (slot, toks) in segments {
            self.caches[*slot].len += toks.len();
        }
        Ok(branches)
    }

    /// The last call's logits, `[segments, V]` (`[tokens, V]` after
    /// [`CpuModel::run_every`]).
    pub fn logits(&self) -> &[f32] {
        &self.logits
    }

    fn act(&mut self, a: Act) -> &mut Vec<f32> {
        let n = self.rows.len() * a.width(self.model.config());
        let v = &mut self.acts[slot_of(a)];
        v.resize(n, 0.0);
        v
    }

    fn take(&mut self, a: Act) -> Vec<f32> {
        self.act(a);
        std::mem::take(&mut self.acts[slot_of(a)])
    }

    fn put(&mut self, a: Act, v: Vec<f32>) {
        self.acts[slot_of(a)] = v;
    }
}

impl Ops for CpuModel {
    fn embed(&mut self) -> Result<()> {
        let d = self.model.config().hidden_size;
        let mut x = self.take(Act::X);
        let model = Arc::clone(&self.model);
        x.par_chunks_mut(d)
            .zip(self.tokens.par_iter())
            .for_each(|(row, &t)| row.copy_from_slice(&model.embed().row_f32(0, t as usize)));
        self.put(Act::X, x);
        Ok(())
    }

    fn rms_norm(&mut self, src: Act, dst: Act, w: NormId, groups: usize) -> Result<()> {
        let model = Arc::clone(&self.model);
        let weight = model.norm_weight(w)?;
        let eps = model.config().rms_norm_eps;
        let width = src.width(model.config()) / groups;
        if src != dst {
            let s = std::mem::take(&mut self.acts[slot_of(src)]);
            let d = self.act(dst);
            d.copy_from_slice(&s);
            self.acts[slot_of(src)] = s;
        }
        self.act(dst)
            .par_chunks_mut(width)
            .for_each(|g| rms(g, weight, eps));
        Ok(())
    }

    fn linear(&mut self, src: Act, dst: Act, w: WeightId, acc: Acc) -> Result<()> {
        let model = Arc::clone(&self.model);
        let weight = model.weight(w)?;
        let x = self.take(src);
        let one = self.one_row_products;
        let mut out = self.take(dst);
        product(weight, &x, one, &mut out, acc);
        self.put(src, x);
        self.put(dst, out);
        Ok(())
    }

    fn swiglu(&mut self, src: Act, dst: Act, gate: WeightId, up: WeightId) -> Result<()> {
        let model = Arc::clone(&self.model);
        let (g, u) = (model.weight(gate)?, model.weight(up)?);
        let x = self.take(src);
        let one = self.one_row_products;
        let mut a = self.take(dst);
        let mut b = vec![0.0f32; a.len()];
        product(g, &x, one, &mut a, Acc::Store);
        product(u, &x, one, &mut b, Acc::Store);
        for (a, b) in a.iter_mut().zip(&b) {
            *a = crate::moe::silu(*a) * b;
        }
        self.put(src, x);
        self.put(dst, a);
        Ok(())
    }

    fn rope_store(&mut self, layer: usize) -> Result<()> {
        let cfg = self.model.config().clone();
        let (hd, half) = (cfg.head_dim, cfg.head_dim / 2);
        let kvw = cfg.kv_width();
        let rows = self.rows.clone();
        let rope = &self.rope;
        let rotate = |buf: &mut [f32], width: usize| {
            buf.par_chunks_mut(width)
                .zip(rows.par_iter())
                .for_each(|(row, &(_, pos))| {
                    let (c, s) = (
                        &rope.cos[pos * half..(pos + 1) * half],
                        &rope.sin[pos * half..(pos + 1) * half],
                    );
                    for head in row.chunks_exact_mut(hd) {
                        let (a, b) = head.split_at_mut(half);
                        for i in 0..half {
                            let (x0, x1) = (a[i], b[i]);
                            a[i] = x0 * c[i] - x1 * s[i];
                            b[i] = x1 * c[i] + x0 * s[i];
                        }
                    }
                });
        };
        let mut q = std::mem::take(&mut self.acts[slot_of(Act::Q)]);
        let mut k = std::mem::take(&mut self.acts[slot_of(Act::K)]);
        rotate(&mut q, cfg.q_width());
        rotate(&mut k, kvw);
        let v = &self.acts[slot_of(Act::V)];
        for (r, &(slot, pos)) in rows.iter().enumerate() {
            let c = &mut self.caches[slot];
            for (cache, src) in [(&mut c.k[layer], &k), (&mut c.v[layer], v)] {
                if cache.len() < (pos + 1) * kvw {
                    cache.resize((pos + 1) * kvw, 0.0);
                }
                cache[pos * kvw..(pos + 1) * kvw].copy_from_slice(&src[r * kvw..(r + 1) * kvw]);
            }
        }
        self.acts[slot_of(Act::Q)] = q;
        self.acts[slot_of(Act::K)] = k;
        Ok(())
    }

    fn attention(&mut self, layer: usize) -> Result<()> {
        let cfg = self.model.config().clone();
        let (hd, hq) = (cfg.head_dim, cfg.num_attention_heads);
        let group = hq / cfg.num_key_value_heads;
        let kvw = cfg.kv_width();
        let scale = 1.0 / (hd as f32).sqrt();
        let mut a = self.take(Act::A);
        let q = &self.acts[slot_of(Act::Q)];
        let rows = &self.rows;
        let caches = &self.caches;
        a.par_chunks_mut(hd).enumerate().for_each(|(i, out)| {
            let (r, h) = (i / hq, i % hq);
            let (slot, pos) = rows[r];
            let (kc, vc) = (&caches[slot].k[layer], &caches[slot].v[layer]);
            let g = h / group;
            let qh = &q[r * hq * hd + h * hd..][..hd];
            let scores: Vec<f32> = (0..=pos)
                .map(|t| {
                    let kt = &kc[t * kvw + g * hd..][..hd];
                    qh.iter().zip(kt).map(|(a, b)| a * b).sum::<f32>() * scale
                })
                .collect();
            let m = scores.iter().copied().fold(f32::NEG_INFINITY, f32::max);
            let e: Vec<f32> = scores.iter().map(|s| crate::fmath::exp(s - m)).collect();
            let sum: f32 = e.iter().sum();
            out.fill(0.0);
            for (t, w) in e.iter().enumerate() {
                let vt = &vc[t * kvw + g * hd..][..hd];
                for (o, x) in out.iter_mut().zip(vt) {
                    *o += w * x;
                }
            }
            for o in out.iter_mut() {
                *o /= sum;
            }
        });
        self.put(Act::A, a);
        Ok(())
    }

    fn moe(&mut self, layer: usize) -> Result<Dispatch> {
        let model = Arc::clone(&self.model);
        let Some(MoeBlock {
            experts,
            top_k,
            routing,
        }) = model.moe(layer)
        else {
            return Err(Error::Model(format!("layer {layer} is not an MoE layer")));
        };
        let r = &self.acts[slot_of(Act::R)];
        let route = route_with(r, experts.experts(), top_k, routing)?;
        let h = &self.acts[slot_of(Act::H)];
        let out = if self.unsorted_moe {
            experts.forward_with(h, &route, Dispatch::Unsorted)?
        } else {
            experts.forward(h, &route)?
        };
        self.put(Act::M, out.y);
        Ok(out.dispatch)
    }

    fn add(&mut self, src: Act, dst: Act) -> Result<()> {
        let s = std::mem::take(&mut self.acts[slot_of(src)]);
        for (d, x) in self.act(dst).iter_mut().zip(&s) {
            *d += x;
        }
        self.acts[slot_of(src)] = s;
        Ok(())
    }

    fn lm_head(&mut self) -> Result<()> {
        let model = Arc::clone(&self.model);
        let d = model.config().hidden_size;
        let h = &self.acts[slot_of(Act::H)];
        let x: Vec<f32> = self
            .out_rows
            .iter()
            .flat_map(|&r| h[r * d..(r + 1) * d].iter().copied())
            .collect();
        let mut logits = std::mem::take(&mut self.logits);
        logits.resize(self.out_rows.len() * model.config().vocab_size, 0.0);
        // one row at a time: a sequence's logits never depend on the call's other rows
        product(
            model.weight(WeightId::LmHead)?,
            &x,
            true,
            &mut logits,
            Acc::Store,
        );
        self.logits = logits;
        Ok(())
    }
}

impl Forward for CpuModel {
    fn name(&self) -> String {
        "cpu".into()
    }

    fn vocab(&self) -> usize {
        self.model.config().vocab_size
    }

    fn slots(&self) -> usize {
        self.caches.len()
    }

    fn max_positions(&self) -> Option<usize> {
        self.model.config().max_position_embeddings
    }

    fn prefill(&mut self, slot: usize, prompt: &[u32]) -> Result<Vec<f32>> {
        self.reset(slot)?;
        self.run(&[(slot, prompt)])?;
        Ok(self.logits.clone())
    }

    fn extend(&mut self, segments: &[(usize, &[u32])]) -> Result<Vec<f32>> {
        self.run_every(segments)?;
        Ok(self.logits.clone())
    }

    fn truncate(&mut self, slot: usize, len: usize) -> Result<()> {
        CpuModel::truncate(self, slot, len)
    }

    fn positions(&self, slot: usize) -> usize {
        CpuModel::positions(self, slot)
    }

    fn fork(&mut self, from: usize, to: usize) -> Result<bool> {
        CpuModel::fork(self, from, to)?;
        Ok(true)
    }
}

/// The model and a [`CpuHead`] on the CPU: the generation loop's [`Engine`].
#[derive(Debug)]
pub struct CpuEngine {
    model: CpuModel,
    head: CpuHead,
    /// The last call's logits, one row per sampled slot.
    logits: Vec<f32>,
    results: Vec<Vec<SlotStep>>,
}

impl CpuEngine {
    /// `model` with `slots` slots.
    pub fn new(model: Arc<dyn ModelWeights>, slots: usize) -> Result<Self> {
        let vocab = model.config().vocab_size;
        Ok(Self {
            head: CpuHead::new(slots, vocab)?,
            model: CpuModel::new(model, slots)?,
            logits: Vec::new(),
            results: Vec::new(),
        })
    }

    /// The model's state (for tests: the last call's logits).
    pub fn model(&self) -> &CpuModel {
        &self.model
    }
}

impl Engine for CpuEngine {
    fn name(&self) -> String {
        "cpu".into()
    }

    fn vocab(&self) -> usize {
        self.model.model.config().vocab_size
    }

    fn max_positions(&self) -> Option<usize> {
        self.model.model.config().max_position_embeddings
    }

    fn slots(&self) -> usize {
        self.head.slots()
    }

    fn start(
        &mut self,
        slot: usize,
        request: SlotRequest,
        prompt: &[u32],
        logits_row: usize,
    ) -> Result<Vec<Dispatch>> {
        self.head.join(slot, request)?;
        self.model.reset(slot)?;
        let branches = self.model.run(&[(slot, prompt)])?;
        let v = self.vocab();
        if self.logits.len() < (logits_row + 1) * v {
            self.logits.resize((logits_row + 1) * v, 0.0);
        }
        self.logits[logits_row * v..(logits_row + 1) * v].copy_from_slice(self.model.logits());
        Ok(branches)
    }

    fn fork(
        &mut self,
        from: usize,
        from_row: usize,
        slot: usize,
        request: SlotRequest,
        logits_row: usize,
    ) -> Result<bool> {
        let v = self.vocab();
        if self.logits.len() < (from_row + 1) * v {
            return Err(Error::Model(format!(
                "fork from logits row {from_row}: no such row yet"
            )));
        }
        self.model.fork(from, slot)?;
        self.head.join(slot, request)?;
        if self.logits.len() < (logits_row + 1) * v {
            self.logits.resize((logits_row + 1) * v, 0.0);
        }
        self.logits
            .copy_within(from_row * v..(from_row + 1) * v, logits_row * v);
        Ok(true)
    }

    fn step(&mut self, sample: &[usize], forward: &[usize]) -> Result<Vec<Dispatch>> {
        let v = self.vocab();
        let logits = Logits::f32(&self.logits[..sample.len() * v], sample.len(), v)?;
        let rows = self.head.step(&logits, sample)?;
        let tokens: Vec<[u32; 1]> = forward
            .iter()
            .map(|s| {
                let r = rows.iter().find(|r| r.slot == *s);
                [r.and_then(|r| r.result.as_ref().ok())
                    .map_or(0, |x| x.token)]
            })
            .collect();
        self.results.push(rows);
        if forward.is_empty() {
            return Ok(Vec::new());
        }
        let segments: Vec<(usize, &[u32])> = forward
            .iter()
            .zip(&tokens)
            .map(|(&s, t)| (s, &t[..]))
            .collect();
        let branches = self.model.run(&segments)?;
        self.logits.clear();
        self.logits.extend_from_slice(self.model.logits());
        Ok(branches)
    }

    fn poll(&mut self) -> Result<Vec<Vec<SlotStep>>> {
        Ok(std::mem::take(&mut self.results))
    }

    fn wait(&mut self) -> Result<Vec<Vec<SlotStep>>> {
        self.poll()
    }

    fn leave(&mut self, slot: usize) -> Result<()> {
        self.head.leave(slot)
    }

    fn read_logits(&mut self, rows: usize) -> Result<Vec<f32>> {
        let n = rows * self.vocab();
        self.logits.get(..n).map(<[f32]>::to_vec).ok_or_else(|| {
            Error::Model(format!(
                "{rows} rows of logits asked; the last call made fewer"
            ))
        })
    }
}
