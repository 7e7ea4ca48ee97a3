//! Recording dispatches, profiled or not: [`Passes`] records a step's dispatches into
//! one compute pass, or, with a [`Profiler`], each dispatch in a pass of its own with
//! timestamps around it and its plan ([`Launch`]) kept beside it.

use crate::error::Result;
use crate::profile::{DispatchTime, Launch};

use super::buffers::{make_buffer, read_back};
use super::device::WgpuDevice;

/// Timestamp queries one profiled step may use (two per dispatch); wgpu's limit per set.
const QUERIES: u32 = 4096;

/// A step's timestamps and plans: a query set of [`QUERIES`], the buffers to read it,
/// and the plan of each dispatch recorded so far.
pub(crate) struct Profiler {
    stamps: Option<(wgpu::QuerySet, wgpu::Buffer, wgpu::Buffer)>,
    launches: Vec<Launch>,
}

impl Profiler {
    /// Timestamps where `ctx`'s device has them; the plans always.
    pub fn new(ctx: &WgpuDevice) -> Self {
        use wgpu::BufferUsages as U;
        let stamps = ctx.has_timestamps().then(|| {
            let bytes = 8 * u64::from(QUERIES);
            (
                ctx.device().create_query_set(&wgpu::QuerySetDescriptor {
                    label: Some("decoda profile"),
                    ty: wgpu::QueryType::Timestamp,
                    count: QUERIES,
                }),
                make_buffer(
                    ctx.device(),
                    "decoda profile resolve",
                    bytes,
                    U::QUERY_RESOLVE | U::COPY_SRC,
                ),
                make_buffer(
                    ctx.device(),
                    "decoda profile read",
                    bytes,
                    U::MAP_READ | U::COPY_DST,
                ),
            )
        });
        Self {
            stamps,
            launches: Vec::new(),
        }
    }

    /// Copies the step's timestamps to the readback buffer (record after every
    /// dispatch of the step).
    pub fn resolve(&self, enc: &mut wgpu::CommandEncoder) {
        if let Some((qs, resolve, read)) = &self.stamps {
            let n = 2 * self.launches.len().min(QUERIES as usize / 2) as u32;
            if n > 0 {
                enc.resolve_query_set(qs, 0..n, resolve, 0);
                enc.copy_buffer_to_buffer(resolve, 0, read, 0, 8 * u64::from(n));
            }
        }
    }

    /// The step's dispatches with their device times, once the submission holding
    /// [`Profiler::resolve`] has run (this waits for it); the profiler is empty after.
    pub fn finish(&mut self, ctx: &WgpuDevice) -> Result<Vec<DispatchTime>> {
        let launches = std::mem::take(&mut self.launches);
        let ticks: Option<Vec<u64>> = match &self.stamps {
            Some((_, _, read)) if !launches.is_empty() => {
                let n = 2 * launches.len().min(QUERIES as usize / 2);
                Some(read_back(ctx.device(), read, 8 * n as u64)?)
            }
            _ => None,
        };
        let period = f64::from(ctx.queue().get_timestamp_period());
        Ok(launches
            .into_iter()
            .enumerate()
            .map(|(i, launch)| DispatchTime {
                device_ns: ticks.as_ref().and_then(|t| {
                    let (a, b) = (*t.get(2 * i)?, *t.get(2 * i + 1)?);
                    Some(b.saturating_sub(a) as f64 * period)
                }),
                launch,
            })
            .collect())
    }
}

/// Where a step's dispatches go: one compute pass kept open across them, or with a
/// [`Profiler`], a pass per dispatch with timestamps around it. Commands that are not
/// dispatches (copies, clears) take the encoder through [`Passes::encoder`], which ends
/// the open pass.
pub(crate) struct Passes<'e> {
    enc: &'e mut wgpu::CommandEncoder,
    pass: Option<wgpu::ComputePass<'static>>,
    prof: Option<&'e mut Profiler>,
}

impl<'e> Passes<'e> {
    /// Dispatches into `enc`, profiled by `prof` when given.
    pub fn new(enc: &'e mut wgpu::CommandEncoder, prof: Option<&'e mut Profiler>) -> Self {
        Self {
            enc,
            pass: None,
            prof,
        }
    }

    /// Whether dispatches are being profiled (their plans are wanted).
    pub fn profiling(&self) -> bool {
        self.prof.is_some()
    }

    /// The encoder, with no compute pass open on it.
    pub fn encoder(&mut self) -> &mut wgpu::CommandEncoder {
        self.pass = None;
        self.enc
    }

    /// Records one dispatch of `pipe` over `grid` workgroups with `group` bound; `plan`
    /// gives its [`Launch`] (called only when profiling).
    pub fn dispatch(
        &mut self,
        pipe: &wgpu::ComputePipeline,
        group: &wgpu::BindGroup,
        grid: (u32, u32),
        plan: impl FnOnce() -> Launch,
    ) {
        self.dispatch3(pipe, group, (grid.0, grid.1, 1), plan);
    }

    /// [`Passes::dispatch`] over a grid of three dimensions.
    pub fn dispatch3(
        &mut self,
        pipe: &wgpu::ComputePipeline,
        group: &wgpu::BindGroup,
        grid: (u32, u32, u32),
        plan: impl FnOnce() -> Launch,
    ) {
        self.dispatch_with(pipe, group, plan, |pass| {
            pass.dispatch_workgroups(grid.0, grid.1, grid.2)
        });
    }

    /// One dispatch of `pipe` with `group` bound, recorded by `go` into the open pass
    /// (or one of its own when profiling).
    fn dispatch_with(
        &mut self,
        pipe: &wgpu::ComputePipeline,
        group: &wgpu::BindGroup,
        plan: impl FnOnce() -> Launch,
        go: impl FnOnce(&mut wgpu::ComputePass<'static>),
    ) {
        let stamp = match self.prof.as_deref_mut() {
            Some(p) => {
                let i = p.launches.len() as u32;
                p.launches.push(plan());
                // a pass of its own, timestamps 2i and 2i + 1 (past the set's end: none)
                self.pass = None;
                p.stamps
                    .as_ref()
                    .filter(|_| 2 * i + 1 < QUERIES)
                    .map(|(qs, _, _)| (qs.clone(), 2 * i))
            }
            None => None,
        };
        if self.pass.is_none() || stamp.is_some() {
            let pass = self.enc.begin_compute_pass(&wgpu::ComputePassDescriptor {
                label: Some("decoda"),
                timestamp_writes: stamp
                    .as_ref()
                    .map(|(qs, i)| wgpu::ComputePassTimestampWrites {
                        query_set: qs,
                        beginning_of_pass_write_index: Some(*i),
                        end_of_pass_write_index: Some(*i + 1),
                    }),
            });
            self.pass = Some(pass.forget_lifetime());
        }
        let pass = self.pass.as_mut().expect("opened above");
        pass.set_pipeline(pipe);
        pass.set_bind_group(0, group, &[]);
        go(pass);
        if stamp.is_some() {
            // the dispatch's own pass ends here
            self.pass = None;
        }
    }
}

impl Passes<'_> {
    /// Records one dispatch of `pipe` whose grid the step computed, read from `grids`
    /// at byte `at`; `plan` gives its [`Launch`] (its workgroups the most there can be).
    pub fn dispatch_indirect(
        &mut self,
        pipe: &wgpu::ComputePipeline,
        group: &wgpu::BindGroup,
        grids: &wgpu::Buffer,
        at: u64,
        plan: impl FnOnce() -> Launch,
    ) {
        self.dispatch_with(pipe, group, plan, |pass| {
            pass.dispatch_workgroups_indirect(grids, at)
        });
    }
}

impl Drop for Passes<'_> {
    fn drop(&mut self) {
        // the open pass ends before the encoder is used again
        self.pass = None;
    }
}
