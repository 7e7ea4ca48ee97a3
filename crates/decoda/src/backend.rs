//! The backend trait that every sampler implements.

use crate::error::Result;
use crate::logits::Logits;
use crate::params::Request;
use crate::pipeline::RowResult;

/// A sampler: draws one token per row of a `[B, V]` batch of host logits, each row with
/// its own parameters and state, returning per row a token or that row's error.
///
/// Every implementation computes the contract stated in the README ("The sampling
/// contract"): a row's token depends only on its logits, parameters, seed, step and
/// history.
pub trait Backend: Send + Sync {
    /// A short name for reports (`cpu`, `reference`, `cuda:0`).
    fn name(&self) -> String;

    /// Samples every row. Whole-call problems (shapes, parameters, history ids) are an
    /// [`Err`](crate::Error) before any work; a bad row yields its own [`crate::RowError`].
    fn sample(&self, logits: &Logits<'_>, requests: &[Request]) -> Result<Vec<RowResult>>;
}

impl<B: Backend + ?Sized> Backend for &B {
    fn name(&self) -> String {
        (**self).name()
    }

    fn sample(&self, logits: &Logits<'_>, requests: &[Request]) -> Result<Vec<RowResult>> {
        (**self).sample(logits, requests)
    }
}
