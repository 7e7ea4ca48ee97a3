//! Weight rows as the device holds them, for the matrix products (`model/mv.wgsl`) and
//! the MoE layer (`moe.wgsl`) alike: each row's values or codes padded to whole
//! `vec4<u32>` (the products' loads), then, for affine matrices, the rows' scales and
//! biases as f32 words.

use crate::moe::weights::WeightData;
use crate::moe::ExpertWeights;

/// Words one row's values or codes take: f32 one a word, 16-bit values two a word, both
/// padded to whole `vec4<u32>`; affine codes are whole already (their inputs come in
/// groups of 32 or more).
pub(crate) fn row_words(w: &ExpertWeights) -> usize {
    let inp = w.in_features();
    match w.data() {
        WeightData::F32(_) => inp.next_multiple_of(4),
        WeightData::Bf16(_) | WeightData::F16(_) => inp.div_ceil(2).next_multiple_of(4),
        WeightData::Affine { q, .. } => q.row_words(inp),
    }
}

/// Scales (and as many biases) one row has: its groups, for affine matrices; else none.
pub(crate) fn row_groups(w: &ExpertWeights) -> usize {
    match w.data() {
        WeightData::Affine { q, .. } => q.row_groups(w.in_features()),
        _ => 0,
    }
}

/// Appends rows `r0 .. r1` (over all experts) of `w`'s values or codes to `all`, each
/// [`row_words`] long.
pub(crate) fn push_rows(all: &mut Vec<u32>, w: &ExpertWeights, r0: usize, r1: usize) {
    let (inp, rw) = (w.in_features(), row_words(w));
    match w.data() {
        WeightData::F32(v) => {
            for row in v[r0 * inp..r1 * inp].chunks(inp) {
                all.extend(row.iter().map(|x| x.to_bits()));
                all.resize(all.len() + rw - inp, 0);
            }
        }
        WeightData::Bf16(v) => {
            for row in v[r0 * inp..r1 * inp].chunks(inp) {
                push_halves(all, row.iter().map(|x| x.to_bits()), rw);
            }
        }
        WeightData::F16(v) => {
            for row in v[r0 * inp..r1 * inp].chunks(inp) {
                push_halves(all, row.iter().map(|x| x.to_bits()), rw);
            }
        }
        WeightData::Affine { packed, .. } => {
            all.extend_from_slice(&packed[r0 * rw..r1 * rw]);
        }
    }
}

/// Appends rows `r0 .. r1`'s scales (with `biases`, their biases) as f32 words; nothing
/// for unquantized matrices.
pub(crate) fn push_side(all: &mut Vec<u32>, w: &ExpertWeights, r0: usize, r1: usize, biases: bool) {
    if let WeightData::Affine {
        scales, biases: b, ..
    } = w.data()
    {
        let g = row_groups(w);
        let v = if biases { b } else { scales };
        all.extend(v[r0 * g..r1 * g].iter().map(|x| x.to_bits()));
    }
}

/// One row of 16-bit values two to a word, padded with zeros to `words` words.
fn push_halves(all: &mut Vec<u32>, it: impl Iterator<Item = u16>, words: usize) {
    let start = all.len();
    let v: Vec<u16> = it.collect();
    for pair in v.chunks(2) {
        let lo = u32::from(pair[0]);
        let hi = pair.get(1).map_or(0, |&h| u32::from(h));
        all.push(lo | (hi << 16));
    }
    all.resize(start + words, 0);
}
