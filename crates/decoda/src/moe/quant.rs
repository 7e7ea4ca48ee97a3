//! MLX's affine quantization of weight matrices, the format its community checkpoints
//! ship (`mlx.core.quantize`).
//!
//! A matrix `[out, in]` of `bits`-bit codes (4 or 8) in groups of `group` consecutive
//! inputs (32, 64 or 128; `in` a multiple of it) is stored as
//! - `weight`: u32 `[out, in * bits / 32]`, each word holding `32 / bits` codes from the
//!   low bits up (the code of input `i` is bits `bits * (i % (32 / bits))` and up of word
//!   `i / (32 / bits)`);
//! - `scales` and `biases`: `[out, in / group]`, one pair per group (f16, bf16 or f32 in
//!   a file; kept as f32 here, which widens them exactly);
//!
//! and weight `w[o][i] = scales[o][g] * q + biases[o][g]` with `g = i / group`. A stack of
//! experts adds a leading `[E, ...]` axis to all three. The reference value of a weight
//! is that expression in f32, a product rounded and then a sum rounded
//! ([`dequantize`]); kernels may fuse the two (one rounding), so their results agree with
//! the reference within f32 rounding.

use crate::error::{Error, Result};

/// An affine quantization: `bits` per code, `group` inputs per scale and bias.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Serialize)]
pub struct Affine {
    /// Bits per code: 4 or 8.
    pub bits: u32,
    /// Inputs per group: 32, 64 or 128.
    pub group: usize,
}

impl Affine {
    /// A quantization, checked: 4 or 8 bits, groups of 32, 64 or 128.
    pub fn new(bits: u32, group: usize) -> Result<Self> {
        if bits != 4 && bits != 8 {
            return Err(Error::InvalidMoe {
                field: "bits",
                value: bits.to_string(),
                expected: "4 or 8",
            });
        }
        if ![32, 64, 128].contains(&group) {
            return Err(Error::InvalidMoe {
                field: "group_size",
                value: group.to_string(),
                expected: "32, 64 or 128",
            });
        }
        Ok(Self { bits, group })
    }

    /// Codes per u32 word.
    pub fn per_word(self) -> usize {
        (32 / self.bits) as usize
    }

    /// u32 words of one row of `in_features` inputs.
    pub fn row_words(self, in_features: usize) -> usize {
        in_features / self.per_word()
    }

    /// Groups of one row.
    pub fn row_groups(self, in_features: usize) -> usize {
        in_features / self.group
    }

    /// `q4g64`, `q8g32`, ...
    pub fn name(self) -> String {
        format!("q{}g{}", self.bits, self.group)
    }

    /// Parses `q4g64` and friends.
    pub fn parse(s: &str) -> Option<Self> {
        let rest = s.strip_prefix('q')?;
        let (b, g) = rest.split_once('g')?;
        Self::new(b.parse().ok()?, g.parse().ok()?).ok()
    }

    /// Checks that rows of `in_features` inputs split into whole groups.
    pub fn check_in(self, in_features: usize) -> Result<()> {
        if in_features == 0 || !in_features.is_multiple_of(self.group) {
            return Err(Error::Shape(format!(
                "{} weights need in_features divisible by the group size {}, not {in_features}",
                self.name(),
                self.group
            )));
        }
        Ok(())
    }

    /// The code of input `i` of a row of packed words.
    #[inline(always)]
    pub fn code(self, row: &[u32], i: usize) -> u32 {
        let per = self.per_word();
        let mask = (1u32 << self.bits) - 1;
        (row[i / per] >> (self.bits as usize * (i % per))) & mask
    }
}

/// The reference weights of an affine-quantized matrix `[rows, in_features]`:
/// `scale * q + bias` in f32, rounded after the product and after the sum.
pub fn dequantize(
    q: Affine,
    packed: &[u32],
    scales: &[f32],
    biases: &[f32],
    in_features: usize,
) -> Vec<f32> {
    let rw = q.row_words(in_features);
    let rg = q.row_groups(in_features);
    let rows = packed.len() / rw.max(1);
    let mut out = Vec::with_capacity(rows * in_features);
    for r in 0..rows {
        let row = &packed[r * rw..(r + 1) * rw];
        for i in 0..in_features {
            let g = r * rg + i / q.group;
            let c = q.code(row, i) as f32;
            let p = scales[g] * c;
            out.push(p + biases[g]);
        }
    }
    out
}

/// Quantizes a matrix `[rows, in_features]` (f32, row-major): per group, the codes span
/// the group's range, `scale = (max - min) / (2^bits - 1)`, `bias = min`, `q =
/// round((w - bias) / scale)`. (MLX's own quantizer chooses its scales differently; the
/// format is the same, and every value a file holds is read the same way.)
pub fn quantize(
    q: Affine,
    w: &[f32],
    in_features: usize,
) -> Result<(Vec<u32>, Vec<f32>, Vec<f32>)> {
    q.check_in(in_features)?;
    if !w.len().is_multiple_of(in_features) {
        return Err(Error::Shape(format!(
            "{} values are not rows of {in_features}",
            w.len()
        )));
    }
    let levels = ((1u32 << q.bits) - 1) as f32;
    let per = q.per_word();
    let rows = w.len() / in_features;
    let mut packed = vec![0u32; rows * q.row_words(in_features)];
    let mut scales = Vec::with_capacity(rows * q.row_groups(in_features));
    let mut biases = Vec::with_capacity(scales.capacity());
    for (gi, grp) in w.chunks_exact(q.group).enumerate() {
        let lo = grp.iter().copied().fold(f32::INFINITY, f32::min);
        let hi = grp.iter().copied().fold(f32::NEG_INFINITY, f32::max);
        let scale = if hi > lo { (hi - lo) / levels } else { 1.0 };
        scales.push(scale);
        biases.push(lo);
        for (j, &v) in grp.iter().enumerate() {
            let code = (((v - lo) / scale).round()).clamp(0.0, levels) as u32;
            let i = gi * q.group + j;
            packed[i / per] |= code << (q.bits as usize * (i % per));
        }
    }
    Ok((packed, scales, biases))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pack_unpack_round_trip() {
        for (bits, group) in [(4, 32), (4, 64), (8, 64), (8, 32), (4, 128)] {
            let q = Affine::new(bits, group).unwrap();
            let inf = group * 3;
            let w: Vec<f32> = (0..2 * inf)
                .map(|i| ((i * 37 % 101) as f32 - 50.0) * 0.01)
                .collect();
            let (p, s, b) = quantize(q, &w, inf).unwrap();
            assert_eq!(p.len(), 2 * inf * bits as usize / 32);
            assert_eq!(s.len(), 2 * 3);
            let d = dequantize(q, &p, &s, &b, inf);
            let levels = ((1u32 << bits) - 1) as f32;
            for (i, (&a, &r)) in w.iter().zip(&d).enumerate() {
                let g = i / group;
                assert!(
                    (a - r).abs() <= s[g] / 2.0 + 1e-6,
                    "{} vs {r} (scale {})",
                    a,
                    s[g]
                );
                assert!(s[g] * levels > 0.0);
            }
        }
        assert_eq!(Affine::parse("q4g64"), Some(Affine { bits: 4, group: 64 }));
        assert!(Affine::parse("q3g64").is_none() && Affine::parse("q4g48").is_none());
    }
}
