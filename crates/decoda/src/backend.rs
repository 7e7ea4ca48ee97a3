//! The backend trait that every sampler implements.

use crate::error::Result;
use crate::logits::{Logits, LogitsData};
use crate::params::Request;
use crate::pipeline::RowResult;

/// A sampler: draws one token per row of a `[B, V]` batch of host logits, each row with
/// its own parameters and state, returning per row a token or that row's error.
///
/// Every implementation computes the contract stated in the README ("The sampling
/// contract"): a row's token depends only on its logits, parameters, seed, step and
/// history.
pub trait Backend: Send + Sync {
    /// A short name for reports (`cpu`, `reference`, `wgpu:<adapter>`).
    fn name(&self) -> String;

    /// Samples every row. Whole-call problems (shapes, parameters, history ids) are an
    /// [`Err`](crate::Error) before any work; a bad row yields its own [`crate::RowError`].
    fn sample(&self, logits: &Logits<'_>, requests: &[Request]) -> Result<Vec<RowResult>>;

    /// Draws `draws` tokens per row from the same logits at steps `step, step + 1, ...`
    /// (the history is not extended): `out[r][d]` is row `r`'s result at step
    /// `step + d`, the same as [`Backend::sample`] would give at that step. The default
    /// batches the steps into calls of [`Backend::sample`]; device backends run the
    /// filters once and draw every step in parallel.
    fn sample_draws(
        &self,
        logits: &Logits<'_>,
        requests: &[Request],
        draws: usize,
    ) -> Result<Vec<Vec<RowResult>>> {
        draws_by_steps(self, logits, requests, draws)
    }
}

/// The requests moved `offset` steps on (the history unchanged).
pub fn at_step(requests: &[Request], offset: u64) -> Vec<Request> {
    requests
        .iter()
        .map(|r| {
            let mut r = r.clone();
            r.state.step = r.state.step.wrapping_add(offset);
            r
        })
        .collect()
}

/// [`Backend::sample_draws`] through [`Backend::sample`]: the rows repeated for several
/// steps per call (at most about 8192 rows and 16M logits a call).
pub fn draws_by_steps<B: Backend + ?Sized>(
    backend: &B,
    logits: &Logits<'_>,
    requests: &[Request],
    draws: usize,
) -> Result<Vec<Vec<RowResult>>> {
    crate::pipeline::validate_call(logits.rows(), logits.vocab(), requests)?;
    let b = logits.rows();
    let v = logits.vocab();
    let mut out: Vec<Vec<RowResult>> = vec![Vec::with_capacity(draws); b];
    if b == 0 || draws == 0 {
        return Ok(out);
    }
    // at most ~8192 rows and ~16M logits (64 MiB of f32) per call
    let steps_per_call = (8192 / b).min((1 << 24) / (b * v).max(1)).clamp(1, draws);
    let mut done = 0;
    while done < draws {
        let n = steps_per_call.min(draws - done);
        let reqs: Vec<Request> = (0..n)
            .flat_map(|d| at_step(requests, (done + d) as u64))
            .collect();
        let results = match logits.data() {
            LogitsData::F32(x) => {
                let rep: Vec<f32> = x.iter().copied().cycle().take(n * b * v).collect();
                backend.sample(&Logits::f32(&rep, n * b, v)?, &reqs)?
            }
            LogitsData::F16(x) => {
                let rep: Vec<half::f16> = x.iter().copied().cycle().take(n * b * v).collect();
                backend.sample(&Logits::f16(&rep, n * b, v)?, &reqs)?
            }
            LogitsData::Bf16(x) => {
                let rep: Vec<half::bf16> = x.iter().copied().cycle().take(n * b * v).collect();
                backend.sample(&Logits::bf16(&rep, n * b, v)?, &reqs)?
            }
        };
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
}

/// A layer of SwiGLU experts on some backend: the MoE contract (README, "MoE dispatch")
/// for `x [N, D]` and a routing, sorting the pairs by expert iff `N > sort_cutoff`.
/// [`crate::moe::SwitchMlp`] is the CPU's; `decoda::wgpu::WgpuMoe` the device's.
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
