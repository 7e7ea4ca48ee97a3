//! Expert weights `[E, out, in]` in f32, bf16, f16 or MLX's affine 4/8-bit format, and
//! the CPU products over them.

use std::cell::RefCell;

use half::{bf16, f16};
use serde::Serialize;

use crate::cpu::kernels;
use crate::error::{Error, Result};

use super::quant::{self, Affine};

/// Element type of expert weights. Activations and accumulation are always f32.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum WeightDtype {
    /// 32-bit floats.
    F32,
    /// bfloat16, widened exactly to f32 in the products.
    Bf16,
    /// IEEE half, widened exactly to f32 in the products.
    F16,
    /// MLX's affine quantization (see [`super::quant`]), dequantized in the products.
    Affine(Affine),
}

impl WeightDtype {
    /// `f32`, `bf16`, `f16`, `q4g64`, ...
    pub fn name(self) -> String {
        match self {
            WeightDtype::F32 => "f32".into(),
            WeightDtype::Bf16 => "bf16".into(),
            WeightDtype::F16 => "f16".into(),
            WeightDtype::Affine(q) => q.name(),
        }
    }

    /// Parses a [`WeightDtype::name`].
    pub fn parse(s: &str) -> Option<Self> {
        match s {
            "f32" => Some(WeightDtype::F32),
            "bf16" => Some(WeightDtype::Bf16),
            "f16" => Some(WeightDtype::F16),
            _ => Affine::parse(s).map(WeightDtype::Affine),
        }
    }

    /// Bytes per weight (fractional for the packed formats, with their scales and biases
    /// as f16).
    pub fn bytes_per_weight(self) -> f64 {
        match self {
            WeightDtype::F32 => 4.0,
            WeightDtype::Bf16 | WeightDtype::F16 => 2.0,
            WeightDtype::Affine(q) => f64::from(q.bits) / 8.0 + 4.0 / q.group as f64,
        }
    }
}

impl Serialize for WeightDtype {
    fn serialize<S: serde::Serializer>(&self, s: S) -> std::result::Result<S::Ok, S::Error> {
        s.serialize_str(&self.name())
    }
}

#[derive(Clone, Debug)]
pub(crate) enum WeightData {
    F32(Vec<f32>),
    Bf16(Vec<bf16>),
    F16(Vec<f16>),
    Affine {
        q: Affine,
        packed: Vec<u32>,
        scales: Vec<f32>,
        biases: Vec<f32>,
    },
}

/// One matrix per expert, `[E, out, in]` in row-major order: expert `e` maps an `in`-vector
/// `x` to `W[e] · x`.
#[derive(Clone, Debug)]
pub struct ExpertWeights {
    pub(crate) experts: usize,
    pub(crate) out_features: usize,
    pub(crate) in_features: usize,
    pub(crate) data: WeightData,
}

/// `Ok` when every `(field, value)` is at least 1, else an error naming the first zero.
pub(crate) fn at_least_one(fields: &[(&'static str, usize)]) -> Result<()> {
    match fields.iter().find(|f| f.1 == 0) {
        Some(&(field, _)) => Err(Error::InvalidMoe {
            field,
            value: "0".into(),
            expected: "at least 1",
        }),
        None => Ok(()),
    }
}

fn count(experts: usize, out: usize, inp: usize) -> Result<usize> {
    at_least_one(&[
        ("experts", experts),
        ("out_features", out),
        ("in_features", inp),
    ])?;
    experts
        .checked_mul(out)
        .and_then(|v| v.checked_mul(inp))
        .ok_or_else(|| Error::Shape(format!("[{experts}, {out}, {inp}] overflows usize")))
}

fn check_len(name: &str, len: usize, want: usize, dims: String) -> Result<()> {
    if len != want {
        return Err(Error::Shape(format!(
            "expert {name} hold {len} values, but {dims} needs {want}"
        )));
    }
    Ok(())
}

thread_local! {
    /// Per-thread buffer for a block of one expert's rows widened to f32 (sorted branch).
    static WIDE: RefCell<Vec<f32>> = const { RefCell::new(Vec::new()) };
}

/// Floats of a widened block (256 KiB: well inside a core's L2).
const WIDE_BLOCK: usize = 64 * 1024;

impl ExpertWeights {
    /// Dense weights after checking that their `len` values make
    /// `[experts, out_features, in_features]`.
    fn dense(
        len: usize,
        data: WeightData,
        experts: usize,
        out_features: usize,
        in_features: usize,
    ) -> Result<Self> {
        let n = count(experts, out_features, in_features)?;
        check_len("weights", len, n, dims(experts, out_features, in_features))?;
        Ok(Self::checked(data, experts, out_features, in_features))
    }

    /// Weights from f32 values laid out as `[experts, out_features, in_features]`.
    pub fn from_f32(
        data: Vec<f32>,
        experts: usize,
        out_features: usize,
        in_features: usize,
    ) -> Result<Self> {
        Self::dense(
            data.len(),
            WeightData::F32(data),
            experts,
            out_features,
            in_features,
        )
    }

    /// Weights from bf16 values laid out as `[experts, out_features, in_features]`.
    pub fn from_bf16(
        data: Vec<bf16>,
        experts: usize,
        out_features: usize,
        in_features: usize,
    ) -> Result<Self> {
        Self::dense(
            data.len(),
            WeightData::Bf16(data),
            experts,
            out_features,
            in_features,
        )
    }

    /// Weights from f16 values laid out as `[experts, out_features, in_features]`.
    pub fn from_f16(
        data: Vec<f16>,
        experts: usize,
        out_features: usize,
        in_features: usize,
    ) -> Result<Self> {
        Self::dense(
            data.len(),
            WeightData::F16(data),
            experts,
            out_features,
            in_features,
        )
    }

    /// Weights in MLX's affine format (see [`super::quant`]): `packed` u32
    /// `[experts, out, in * bits / 32]`, `scales` and `biases` `[experts, out, in / group]`.
    pub fn from_affine(
        q: Affine,
        packed: Vec<u32>,
        scales: Vec<f32>,
        biases: Vec<f32>,
        experts: usize,
        out_features: usize,
        in_features: usize,
    ) -> Result<Self> {
        count(experts, out_features, in_features)?;
        q.check_in(in_features)?;
        let rows = experts * out_features;
        let d = dims(experts, out_features, in_features);
        check_len(
            "packed weights",
            packed.len(),
            rows * q.row_words(in_features),
            d.clone(),
        )?;
        check_len(
            "scales",
            scales.len(),
            rows * q.row_groups(in_features),
            d.clone(),
        )?;
        check_len("biases", biases.len(), rows * q.row_groups(in_features), d)?;
        if let Some(i) = scales.iter().chain(&biases).position(|v| !v.is_finite()) {
            return Err(Error::InvalidMoe {
                field: if i < scales.len() { "scales" } else { "biases" },
                value: format!("a non-finite value at {}", i % scales.len()),
                expected: "finite numbers",
            });
        }
        Ok(Self::checked(
            WeightData::Affine {
                q,
                packed,
                scales,
                biases,
            },
            experts,
            out_features,
            in_features,
        ))
    }

    /// These weights quantized to `q` (from their f32 values; see [`quant::quantize`]).
    pub fn quantized(&self, q: Affine) -> Result<Self> {
        let mut packed = Vec::new();
        let mut scales = Vec::new();
        let mut biases = Vec::new();
        for e in 0..self.experts {
            let (p, s, b) = quant::quantize(q, &self.expert_f32(e), self.in_features)?;
            packed.extend(p);
            scales.extend(s);
            biases.extend(b);
        }
        Self::from_affine(
            q,
            packed,
            scales,
            biases,
            self.experts,
            self.out_features,
            self.in_features,
        )
    }

    /// These weights in another dtype (rounded from their f32 values).
    pub fn converted(&self, dtype: WeightDtype) -> Result<Self> {
        let all: Vec<f32> = (0..self.experts).flat_map(|e| self.expert_f32(e)).collect();
        let (e, o, i) = (self.experts, self.out_features, self.in_features);
        match dtype {
            WeightDtype::F32 => Self::from_f32(all, e, o, i),
            WeightDtype::Bf16 => {
                Self::from_bf16(all.iter().map(|&v| bf16::from_f32(v)).collect(), e, o, i)
            }
            WeightDtype::F16 => {
                Self::from_f16(all.iter().map(|&v| f16::from_f32(v)).collect(), e, o, i)
            }
            WeightDtype::Affine(q) => Self::from_f32(all, e, o, i)?.quantized(q),
        }
    }

    fn checked(data: WeightData, experts: usize, out_features: usize, in_features: usize) -> Self {
        Self {
            experts,
            out_features,
            in_features,
            data,
        }
    }

    /// Number of experts E.
    pub fn experts(&self) -> usize {
        self.experts
    }

    /// Rows of each expert's matrix (length of an output vector).
    pub fn out_features(&self) -> usize {
        self.out_features
    }

    /// Columns of each expert's matrix (length of an input vector).
    pub fn in_features(&self) -> usize {
        self.in_features
    }

    /// Element type.
    pub fn dtype(&self) -> WeightDtype {
        match &self.data {
            WeightData::F32(_) => WeightDtype::F32,
            WeightData::Bf16(_) => WeightDtype::Bf16,
            WeightData::F16(_) => WeightDtype::F16,
            WeightData::Affine { q, .. } => WeightDtype::Affine(*q),
        }
    }

    /// Bytes one expert's matrix takes in this format.
    pub fn expert_bytes(&self) -> usize {
        let n = self.out_features * self.in_features;
        match &self.data {
            WeightData::F32(_) => 4 * n,
            WeightData::Bf16(_) | WeightData::F16(_) => 2 * n,
            WeightData::Affine { q, .. } => {
                self.out_features
                    * (4 * q.row_words(self.in_features) + 8 * q.row_groups(self.in_features))
            }
        }
    }

    /// Expert `e`'s matrix `[out, in]` as f32: 16-bit values widened exactly, affine ones
    /// dequantized as [`quant::dequantize`] does (the reference values). Panics if
    /// `e >= E`.
    pub fn expert_f32(&self, e: usize) -> Vec<f32> {
        let (s, n) = self.span(e);
        match &self.data {
            WeightData::F32(v) => v[s..s + n].to_vec(),
            WeightData::Bf16(v) => v[s..s + n].iter().map(|w| w.to_f32()).collect(),
            WeightData::F16(v) => v[s..s + n].iter().map(|w| w.to_f32()).collect(),
            WeightData::Affine {
                q,
                packed,
                scales,
                biases,
            } => {
                let (rw, rg) = (
                    q.row_words(self.in_features),
                    q.row_groups(self.in_features),
                );
                let r0 = e * self.out_features;
                let r1 = r0 + self.out_features;
                quant::dequantize(
                    *q,
                    &packed[r0 * rw..r1 * rw],
                    &scales[r0 * rg..r1 * rg],
                    &biases[r0 * rg..r1 * rg],
                    self.in_features,
                )
            }
        }
    }

    /// The raw storage, for backends that upload it (`(kind, words)`: f32 bits, 16-bit
    /// values two to a word (low half first), or the packed codes).
    #[cfg_attr(not(feature = "wgpu"), allow(dead_code))]
    pub(crate) fn data(&self) -> &WeightData {
        &self.data
    }

    fn span(&self, e: usize) -> (usize, usize) {
        let n = self.out_features * self.in_features;
        (e * n, n)
    }

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
}

impl ExpertWeights {
    /// Row `r` of expert `e` as f32 (an embedding lookup): widened or dequantized exactly
    /// as [`ExpertWeights::expert_f32`] does. Panics if `e` or `r` is out of range.
    pub fn row_f32(&self, e: usize, r: usize) -> Vec<f32> {
        assert!(
            e < self.experts && r < self.out_features,
            "row {r} of expert {e}"
        );
        let inf = self.in_features;
        let at = (e * self.out_features + r) * inf;
        match &self.data {
            WeightData::F32(v) => v[at..at + inf].to_vec(),
            WeightData::Bf16(v) => v[at..at + inf].iter().map(|w| w.to_f32()).collect(),
            WeightData::F16(v) => v[at..at + inf].iter().map(|w| w.to_f32()).collect(),
            WeightData::Affine {
                q,
                packed,
                scales,
                biases,
            } => {
                let (rw, rg) = (q.row_words(inf), q.row_groups(inf));
                let row = e * self.out_features + r;
                quant::dequantize(
                    *q,
                    &packed[row * rw..(row + 1) * rw],
                    &scales[row * rg..(row + 1) * rg],
                    &biases[row * rg..(row + 1) * rg],
                    inf,
                )
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

fn dims(e: usize, o: usize, i: usize) -> String {
    format!("[E={e}, out={o}, in={i}]")
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
    use super::*;

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

    #[test]
    fn affine_inputs_are_checked() {
        let q = Affine::new(4, 32).unwrap();
        assert!(
            ExpertWeights::from_affine(q, vec![0; 4], vec![1.0; 1], vec![0.0; 1], 1, 1, 32).is_ok()
        );
        let e = ExpertWeights::from_affine(q, vec![0; 3], vec![1.0; 1], vec![0.0; 1], 1, 1, 32)
            .unwrap_err();
        assert!(e.to_string().contains("packed"), "{e}");
        let e =
            ExpertWeights::from_affine(q, vec![0; 4], vec![f32::NAN; 1], vec![0.0; 1], 1, 1, 32)
                .unwrap_err();
        assert!(e.to_string().contains("scales"), "{e}");
        let e = ExpertWeights::from_affine(q, vec![0; 2], vec![1.0; 1], vec![0.0; 1], 1, 1, 16)
            .unwrap_err();
        assert!(e.to_string().contains("group"), "{e}");
        assert!(Affine::new(3, 32).is_err() && Affine::new(4, 48).is_err());
    }
}
