//! The door every sampling call goes through: the whole call validated once
//! ([`validate_call`]), then its rows as [`Row`]s, which only the crate makes and the
//! backends' inner paths take without validating again.

use crate::error::{Error, Result};
use crate::params::Request;

use super::xtc::xtc_fires;

/// Checks a whole call before any work: the number of rows, every parameter and every
/// history id. The first offending row and field are reported.
pub fn validate_call(rows: usize, vocab: usize, requests: &[Request]) -> Result<()> {
    if vocab == 0 {
        return Err(Error::Shape("the vocabulary size V must be >= 1".into()));
    }
    if vocab > u32::MAX as usize {
        return Err(Error::Shape(format!(
            "vocabulary size {vocab} does not fit token ids in u32"
        )));
    }
    if requests.len() != rows {
        return Err(Error::Shape(format!(
            "{} requests for {rows} rows of logits: give one request per row",
            requests.len()
        )));
    }
    for (row, r) in requests.iter().enumerate() {
        r.validate(row, vocab)?;
    }
    Ok(())
}

/// One row of a call that [`validate_call`] accepted, as a backend's inner path takes
/// it: the request, the step it is drawn at, and the row of the logits it reads. A
/// per-step view of a request (the draws of [`crate::Backend::sample_draws`]) borrows
/// the request and sets only its step, so its history is never copied.
///
/// Rows are made inside the crate, after validation. It dereferences to its
/// [`Request`] for the parameters, the seed and the history; its step is
/// [`Row::step`] (the request's `state.step` plus the view's offset), which is what
/// every backend draws with.
#[derive(Debug, Clone, Copy)]
pub struct Row<'a> {
    request: &'a Request,
    step: u64,
    logits_row: usize,
}

impl<'a> Row<'a> {
    /// Row `i` of a validated call reads logits row `i` at its request's own step.
    pub(crate) fn each(requests: &'a [Request]) -> Vec<Row<'a>> {
        requests
            .iter()
            .enumerate()
            .map(|(i, request)| Row {
                request,
                step: request.state.step,
                logits_row: i,
            })
            .collect()
    }

    /// One validated request at its own step, reading logits row 0.
    pub(crate) fn of(request: &'a Request) -> Row<'a> {
        Row {
            request,
            step: request.state.step,
            logits_row: 0,
        }
    }

    /// The same row `offset` steps on.
    pub(crate) fn at_step(self, offset: u64) -> Row<'a> {
        Row {
            step: self.step.wrapping_add(offset),
            ..self
        }
    }

    /// The same request and step reading logits row `logits_row`.
    pub(crate) fn reading(self, logits_row: usize) -> Row<'a> {
        Row { logits_row, ..self }
    }

    /// The request (parameters, seed, history).
    pub fn request(&self) -> &'a Request {
        self.request
    }

    /// The step this row is drawn at.
    pub fn step(&self) -> u64 {
        self.step
    }

    /// The row of the call's logits this row reads.
    pub fn logits_row(&self) -> usize {
        self.logits_row
    }

    /// Whether XTC (stage 8a) can remove tokens from this row at its step: it is on and
    /// its coin fires. When it does not, the stage does nothing, so the row is drawn
    /// as if it were off.
    pub fn xtc_acts(&self) -> bool {
        xtc_fires(&self.request.params, self.request.state.seed, self.step)
    }

    /// [`Request::beyond_device`].
    pub fn beyond_device(&self) -> Option<&'static str> {
        self.request.beyond_device()
    }
}

impl std::ops::Deref for Row<'_> {
    type Target = Request;
    fn deref(&self) -> &Request {
        self.request
    }
}

/// [`validate_call`], then the call's rows (row `i` reads logits row `i`).
#[cfg(feature = "wgpu")]
pub(crate) fn validated_rows<'a>(
    rows: usize,
    vocab: usize,
    requests: &'a [Request],
) -> Result<Vec<Row<'a>>> {
    validate_call(rows, vocab, requests)?;
    Ok(Row::each(requests))
}

/// Whether `rows` read the logits in order, row `i` from logits row `i`, one each.
#[cfg(feature = "wgpu")]
pub(crate) fn reads_in_order(rows: &[Row<'_>], logits_rows: usize) -> bool {
    rows.len() == logits_rows && rows.iter().enumerate().all(|(i, r)| r.logits_row == i)
}

/// Counts the NaN and `+inf` values of a row.
pub fn count_non_finite(x: &[f32]) -> u64 {
    x.iter()
        .filter(|v| v.is_nan() || **v == f32::INFINITY)
        .count() as u64
}
