//! The backend trait that every sampler implements.

use crate::error::Result;
use crate::logits::{Gathered, Logits};
use crate::params::Request;
use crate::pipeline::{validate_call, Row, RowResult};

/// A sampler: draws one token per row of a `[B, V]` batch of host logits, each row with
/// its own parameters and state, returning per row a token or that row's error.
///
/// Every implementation computes the contract (docs/CONTRACT.md): a row's token depends
/// only on its logits, parameters, seed, step and history.
///
/// [`Backend::sample`] and [`Backend::sample_draws`] are the public door: they validate
/// the call once, apply the rows' token masks ([`Request::allowed`]: disallowed logits
/// become `-inf` on a copy of the batch, or on each row's own copy where the backend
/// masks rows itself, [`Backend::masks_rows`]) and hand its rows to [`Backend::sample_rows`]
/// (and [`Backend::sample_rows_draws`]), which a backend implements on validated inputs.
pub trait Backend: Send + Sync {
    /// A short name for reports (`cpu`, `reference`, `wgpu:<adapter>`).
    fn name(&self) -> String;

    /// Samples every row. Whole-call problems (shapes, parameters, history ids) are an
    /// [`Err`](crate::Error) before any work; a bad row yields its own [`crate::RowError`].
    fn sample(&self, logits: &Logits<'_>, requests: &[Request]) -> Result<Vec<RowResult>> {
        validate_call(logits.rows(), logits.vocab(), requests)?;
        if self.masks_rows() {
            return self.sample_rows(logits, &Row::each(requests));
        }
        // stage 0, the token masks: on a copy of the batch, for every backend that does
        // not mask its rows itself
        match Gathered::masked(logits, requests) {
            Some(copy) => self.sample_rows(&copy.view()?, &Row::each(requests)),
            None => self.sample_rows(logits, &Row::each(requests)),
        }
    }

    /// Draws `draws` tokens per row from the same logits at steps `step, step + 1, ...`
    /// (the history is not extended): `out[r][d]` is row `r`'s result at step
    /// `step + d`, the same as [`Backend::sample`] would give at that step. Validates
    /// like [`Backend::sample`].
    fn sample_draws(
        &self,
        logits: &Logits<'_>,
        requests: &[Request],
        draws: usize,
    ) -> Result<Vec<Vec<RowResult>>> {
        validate_call(logits.rows(), logits.vocab(), requests)?;
        if self.masks_rows() {
            return self.sample_rows_draws(logits, &Row::each(requests), draws);
        }
        match Gathered::masked(logits, requests) {
            Some(copy) => self.sample_rows_draws(&copy.view()?, &Row::each(requests), draws),
            None => self.sample_rows_draws(logits, &Row::each(requests), draws),
        }
    }

    /// The backend's work on a validated call: one result per row, row `i` drawn from
    /// logits row `rows[i].logits_row()` at step `rows[i].step()`. Rows come only from
    /// [`Backend::sample`] and the crate's own per-step views, after validation;
    /// implementations do not validate again.
    fn sample_rows(&self, logits: &Logits<'_>, rows: &[Row<'_>]) -> Result<Vec<RowResult>>;

    /// Whether [`Backend::sample_rows`] applies each row's token mask itself (stage 0:
    /// the CPU masks its own copy of each row, on the row's thread), so the public door
    /// hands it the batch as given instead of a masked copy. Applying a mask twice
    /// changes nothing, so such a backend may also be handed masked logits.
    fn masks_rows(&self) -> bool {
        false
    }

    /// [`Backend::sample_draws`] on a validated call whose rows read the logits in order.
    /// The default batches the steps into calls of [`Backend::sample_rows`] over per-step
    /// views of the rows; device backends run the filters once and draw every step in
    /// parallel.
    fn sample_rows_draws(
        &self,
        logits: &Logits<'_>,
        rows: &[Row<'_>],
        draws: usize,
    ) -> Result<Vec<Vec<RowResult>>> {
        draws_by_steps(self, logits, rows, draws)
    }
}

/// [`Backend::sample_rows_draws`] through [`Backend::sample_rows`]: the rows repeated
/// for several steps per call (at most about 8192 rows and 16M logits a call, the most a
/// device backend gathers), each repetition a view that reads the same logits row at a
/// later step.
pub(crate) fn draws_by_steps<B: Backend + ?Sized>(
    backend: &B,
    logits: &Logits<'_>,
    rows: &[Row<'_>],
    draws: usize,
) -> Result<Vec<Vec<RowResult>>> {
    let b = rows.len();
    let mut out: Vec<Vec<RowResult>> = vec![Vec::with_capacity(draws); b];
    if b == 0 || draws == 0 {
        return Ok(out);
    }
    let v = logits.vocab();
    let steps_per_call = (8192 / b).min((1 << 24) / (b * v).max(1)).clamp(1, draws);
    let mut done = 0;
    let mut views = Vec::with_capacity(steps_per_call * b);
    while done < draws {
        let n = steps_per_call.min(draws - done);
        views.clear();
        views.extend((0..n).flat_map(|d| rows.iter().map(move |r| r.at_step((done + d) as u64))));
        let results = backend.sample_rows(logits, &views)?;
        for (k, res) in results.into_iter().enumerate() {
            out[k % b].push(res);
        }
        done += n;
    }
    Ok(out)
}

impl<B: Backend + ?Sized> Backend for &B {
    fn name(&self) -> String {
        (**self).name()
    }

    fn sample(&self, logits: &Logits<'_>, requests: &[Request]) -> Result<Vec<RowResult>> {
        (**self).sample(logits, requests)
    }

    fn sample_draws(
        &self,
        logits: &Logits<'_>,
        requests: &[Request],
        draws: usize,
    ) -> Result<Vec<Vec<RowResult>>> {
        (**self).sample_draws(logits, requests, draws)
    }

    fn sample_rows(&self, logits: &Logits<'_>, rows: &[Row<'_>]) -> Result<Vec<RowResult>> {
        (**self).sample_rows(logits, rows)
    }

    fn masks_rows(&self) -> bool {
        (**self).masks_rows()
    }

    fn sample_rows_draws(
        &self,
        logits: &Logits<'_>,
        rows: &[Row<'_>],
        draws: usize,
    ) -> Result<Vec<Vec<RowResult>>> {
        (**self).sample_rows_draws(logits, rows, draws)
    }
}

/// A layer of SwiGLU experts on some backend: the MoE contract (docs/CONTRACT.md)
/// for `x [N, D]` and a routing, sorting the pairs by expert iff `N > sort_cutoff`.
/// [`crate::moe::SwitchMlp`] runs on the CPU (`cpu/moe.rs`); `decoda::wgpu::WgpuMoe` on
/// the device.
pub trait MoeLayer: Send + Sync {
    /// A short name for reports (`cpu`, `wgpu:<adapter>`).
    fn name(&self) -> String;
    /// The layer's experts E, width D and expert width H.
    fn dims(&self) -> (usize, usize, usize);
    /// The cutoff fixed at construction.
    fn sort_cutoff(&self) -> usize;
    /// `y [N, D]` with the branch forced.
    fn forward_with(
        &self,
        x: &[f32],
        routing: &crate::moe::Routing,
        dispatch: crate::moe::Dispatch,
    ) -> Result<crate::moe::MoeOutput>;
    /// `y [N, D]`, the branch chosen from N.
    fn forward(&self, x: &[f32], routing: &crate::moe::Routing) -> Result<crate::moe::MoeOutput> {
        let d = if routing.tokens > self.sort_cutoff() {
            crate::moe::Dispatch::Sorted
        } else {
            crate::moe::Dispatch::Unsorted
        };
        self.forward_with(x, routing, d)
    }
    /// Routes `router_logits [N, E]` on the backend, then runs the layer (the branch
    /// from N); returns the routing it used and the output.
    fn route_forward(
        &self,
        x: &[f32],
        router_logits: &[f32],
        top_k: usize,
        router: crate::moe::Router,
    ) -> Result<(crate::moe::Routing, crate::moe::MoeOutput)> {
        let (e, _, _) = self.dims();
        let routing = crate::moe::route_with(router_logits, e, top_k, router)?;
        let out = self.forward(x, &routing)?;
        Ok((routing, out))
    }
}
