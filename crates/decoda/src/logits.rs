//! Host views of a `[B, V]` batch of logits in f32, f16 or bf16.

use half::{bf16, f16};

use crate::error::{Error, Result};
use crate::params::Request;

/// A logit element type the samplers accept.
pub trait LogitElem: Copy + Send + Sync + 'static {
    /// The element's name (`f32`, `f16`, `bf16`).
    const NAME: &'static str;
    /// Widens to f32 (exact for all three types).
    fn to_f32(self) -> f32;
}

impl LogitElem for f32 {
    const NAME: &'static str = "f32";
    #[inline(always)]
    fn to_f32(self) -> f32 {
        self
    }
}

impl LogitElem for f16 {
    const NAME: &'static str = "f16";
    #[inline(always)]
    fn to_f32(self) -> f32 {
        f16::to_f32(self)
    }
}

impl LogitElem for bf16 {
    const NAME: &'static str = "bf16";
    #[inline(always)]
    fn to_f32(self) -> f32 {
        bf16::to_f32(self)
    }
}

/// Element type of a logits buffer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum DType {
    /// IEEE single precision.
    F32,
    /// IEEE half precision.
    F16,
    /// bfloat16.
    Bf16,
}

impl DType {
    /// Size of one element in bytes.
    pub fn size(self) -> usize {
        match self {
            DType::F32 => 4,
            DType::F16 | DType::Bf16 => 2,
        }
    }
}

impl std::fmt::Display for DType {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            DType::F32 => "f32",
            DType::F16 => "f16",
            DType::Bf16 => "bf16",
        })
    }
}

/// The data of a logits batch, row-major.
#[derive(Debug, Clone, Copy)]
pub enum LogitsData<'a> {
    /// f32 values.
    F32(&'a [f32]),
    /// f16 values.
    F16(&'a [f16]),
    /// bf16 values.
    Bf16(&'a [bf16]),
}

/// A `[rows, vocab]` batch of logits on the host, row-major (C order).
#[derive(Debug, Clone, Copy)]
pub struct Logits<'a> {
    data: LogitsData<'a>,
    rows: usize,
    vocab: usize,
}

impl<'a> Logits<'a> {
    /// Wraps `data` as `[rows, vocab]`; an error if the length does not match or `vocab == 0`.
    pub fn new(data: LogitsData<'a>, rows: usize, vocab: usize) -> Result<Self> {
        let len = match data {
            LogitsData::F32(d) => d.len(),
            LogitsData::F16(d) => d.len(),
            LogitsData::Bf16(d) => d.len(),
        };
        if vocab == 0 {
            return Err(Error::Shape("the vocabulary size V must be >= 1".into()));
        }
        if rows.checked_mul(vocab) != Some(len) {
            return Err(Error::Shape(format!(
                "{len} logits do not form [{rows}, {vocab}] (expected {} values)",
                rows.saturating_mul(vocab)
            )));
        }
        Ok(Self { data, rows, vocab })
    }

    /// f32 logits `[rows, vocab]`.
    pub fn f32(data: &'a [f32], rows: usize, vocab: usize) -> Result<Self> {
        Self::new(LogitsData::F32(data), rows, vocab)
    }

    /// f16 logits `[rows, vocab]`.
    pub fn f16(data: &'a [f16], rows: usize, vocab: usize) -> Result<Self> {
        Self::new(LogitsData::F16(data), rows, vocab)
    }

    /// bf16 logits `[rows, vocab]`.
    pub fn bf16(data: &'a [bf16], rows: usize, vocab: usize) -> Result<Self> {
        Self::new(LogitsData::Bf16(data), rows, vocab)
    }

    /// Number of rows B.
    pub fn rows(&self) -> usize {
        self.rows
    }

    /// Vocabulary size V.
    pub fn vocab(&self) -> usize {
        self.vocab
    }

    /// The element type.
    pub fn dtype(&self) -> DType {
        match self.data {
            LogitsData::F32(_) => DType::F32,
            LogitsData::F16(_) => DType::F16,
            LogitsData::Bf16(_) => DType::Bf16,
        }
    }

    /// The raw data.
    pub fn data(&self) -> LogitsData<'a> {
        self.data
    }

    /// Rows `start..end` as a batch of their own (panics if `end` exceeds the rows).
    pub fn slice_rows(&self, start: usize, end: usize) -> Result<Logits<'a>> {
        let v = self.vocab;
        let (a, b) = (start * v, end * v);
        let data = match self.data {
            LogitsData::F32(d) => LogitsData::F32(&d[a..b]),
            LogitsData::F16(d) => LogitsData::F16(&d[a..b]),
            LogitsData::Bf16(d) => LogitsData::Bf16(&d[a..b]),
        };
        Logits::new(data, end - start, v)
    }

    /// Row `r` widened to f32, written into `out` (resized to V).
    pub fn row_to_f32(&self, r: usize, out: &mut Vec<f32>) {
        let range = r * self.vocab..(r + 1) * self.vocab;
        out.clear();
        match self.data {
            LogitsData::F32(d) => out.extend_from_slice(&d[range]),
            LogitsData::F16(d) => out.extend(d[range].iter().map(|v| v.to_f32())),
            LogitsData::Bf16(d) => out.extend(d[range].iter().map(|v| v.to_f32())),
        }
    }

    /// Row `r` if the batch is f32.
    pub fn row_f32(&self, r: usize) -> Option<&'a [f32]> {
        match self.data {
            LogitsData::F32(d) => Some(&d[r * self.vocab..(r + 1) * self.vocab]),
            _ => None,
        }
    }
}

/// A copy of some rows of a batch, in a given order (a device backend's rows must be
/// contiguous in the order it reads them).
pub(crate) enum Gathered {
    /// f32 rows.
    F32(Vec<f32>, usize, usize),
    /// f16 rows.
    F16(Vec<half::f16>, usize, usize),
    /// bf16 rows.
    Bf16(Vec<half::bf16>, usize, usize),
}

impl Gathered {
    /// Rows `rows` of `logits`, in that order.
    pub(crate) fn new(logits: &Logits<'_>, rows: impl Iterator<Item = usize> + Clone) -> Self {
        let v = logits.vocab();
        let n = rows.clone().count();
        fn pick<T: Copy>(d: &[T], rows: impl Iterator<Item = usize>, v: usize) -> Vec<T> {
            rows.flat_map(|r| d[r * v..(r + 1) * v].iter().copied())
                .collect()
        }
        match logits.data() {
            LogitsData::F32(d) => Gathered::F32(pick(d, rows, v), n, v),
            LogitsData::F16(d) => Gathered::F16(pick(d, rows, v), n, v),
            LogitsData::Bf16(d) => Gathered::Bf16(pick(d, rows, v), n, v),
        }
    }

    /// The batch with each row's disallowed tokens ([`Request::allowed`]) at `-inf`, in
    /// the batch's own element type (stage 0 of the contract, for every backend that
    /// takes host logits); `None` when no row has a mask. Requests are validated.
    pub(crate) fn masked(logits: &Logits<'_>, requests: &[Request]) -> Option<Self> {
        let masks: Vec<Option<&[u32]>> = requests.iter().map(|r| r.allowed.as_deref()).collect();
        Self::masked_rows(logits, &masks)
    }

    /// The batch with row `r`'s tokens outside `masks[r]` at `-inf` (`None` = no mask);
    /// `None` when no row has a mask. Masks are `ceil(V / 32)` words (checked before).
    pub(crate) fn masked_rows(logits: &Logits<'_>, masks: &[Option<&[u32]>]) -> Option<Self> {
        if masks.iter().all(Option::is_none) {
            return None;
        }
        let v = logits.vocab();
        let mut g = Gathered::new(logits, 0..logits.rows());
        fn ban<T: Copy>(d: &mut [T], masks: &[Option<&[u32]>], v: usize, neg_inf: T) {
            for (r, m) in masks.iter().enumerate() {
                let Some(m) = m else { continue };
                // a word at a time: all allowed (skipped), none (filled), or bit by bit
                for (x, &word) in d[r * v..(r + 1) * v].chunks_mut(32).zip(m.iter()) {
                    match word {
                        u32::MAX => {}
                        0 => x.fill(neg_inf),
                        mut bits => {
                            bits = !bits;
                            while bits != 0 {
                                let b = bits.trailing_zeros() as usize;
                                if b < x.len() {
                                    x[b] = neg_inf;
                                }
                                bits &= bits - 1;
                            }
                        }
                    }
                }
            }
        }
        match &mut g {
            Gathered::F32(d, ..) => ban(d, masks, v, f32::NEG_INFINITY),
            Gathered::F16(d, ..) => ban(d, masks, v, f16::NEG_INFINITY),
            Gathered::Bf16(d, ..) => ban(d, masks, v, bf16::NEG_INFINITY),
        }
        Some(g)
    }

    /// The copy as a batch.
    pub(crate) fn view(&self) -> Result<Logits<'_>> {
        match self {
            Gathered::F32(d, b, v) => Logits::f32(d, *b, *v),
            Gathered::F16(d, b, v) => Logits::f16(d, *b, *v),
            Gathered::Bf16(d, b, v) => Logits::bf16(d, *b, *v),
        }
    }
}
