//! Expert weights `[E, out, in]` in f32, bf16, f16 or MLX's affine 4/8-bit format, and
//! the CPU products over them.

use half::{bf16, f16};
use serde::Serialize;

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

    pub(crate) fn span(&self, e: usize) -> (usize, usize) {
        let n = self.out_features * self.in_features;
        (e * n, n)
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
}

fn dims(e: usize, o: usize, i: usize) -> String {
    format!("[E={e}, out={o}, in={i}]")
}

#[cfg(test)]
mod tests {
    use super::*;

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
