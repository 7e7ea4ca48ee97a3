//! Timing hooks for the CLI's benchmarks (`decoda bench --device wgpu`): GPU time from
//! timestamp queries, wall-clock time, and the device's copy bandwidth. Not part of the
//! sampling API.

use crate::error::{Error, Result};
use crate::params::Request;
use crate::pipeline as pl;

use super::buffers::{make_buffer, read_back};
use super::head::{Stamping, WgpuHead};
use super::kernels::StepStamps;
use super::sampler::WgpuSampler;
use super::views::{DeviceLogits, DeviceMasks, DeviceOutputs};

/// Host and device time of one step or call, in microseconds.
#[doc(hidden)]
#[derive(Debug, Clone, Copy)]
pub struct StepTime {
    /// Recording and submitting on the host (for the per-call API, building its
    /// parameter lists from the requests' histories too).
    pub host_us: f64,
    /// The step's compute pass on the device (timestamp queries), or the wall time from
    /// submit to done when the adapter has none.
    pub device_us: f64,
}

/// What a call records ([`WgpuSampler::call_structure`]).
#[doc(hidden)]
#[derive(Debug, Clone, PartialEq)]
pub struct CallStructure {
    /// Compute dispatches per call.
    pub dispatches: usize,
    /// Their kernels, in order.
    pub stages: Vec<&'static str>,
    /// Reads of each row's logits on the common path.
    pub row_reads: f64,
    /// The workgroups each dispatch launches, in the order of `stages`.
    pub workgroups: Vec<u64>,
}

/// A timestamp query set and the buffers to read it.
struct Stamps {
    qs: wgpu::QuerySet,
    resolve: wgpu::Buffer,
    read: wgpu::Buffer,
    count: u32,
}

impl Stamps {
    /// `count` queries.
    fn new(device: &wgpu::Device, count: u32) -> Self {
        use wgpu::BufferUsages as U;
        let bytes = (8 * u64::from(count)).next_multiple_of(256).max(256);
        Self {
            qs: device.create_query_set(&wgpu::QuerySetDescriptor {
                label: Some("decoda timing"),
                ty: wgpu::QueryType::Timestamp,
                count,
            }),
            resolve: make_buffer(device, "decoda ts", bytes, U::QUERY_RESOLVE | U::COPY_SRC),
            read: make_buffer(device, "decoda ts read", bytes, U::MAP_READ | U::COPY_DST),
            count,
        }
    }

    fn copy(&self, enc: &mut wgpu::CommandEncoder) {
        enc.resolve_query_set(&self.qs, 0..self.count, &self.resolve, 0);
        enc.copy_buffer_to_buffer(&self.resolve, 0, &self.read, 0, 8 * u64::from(self.count));
    }

    /// The stamps, in ticks (after the submission is done).
    fn ticks(&self, device: &wgpu::Device) -> Result<Vec<u64>> {
        let w: Vec<u32> = read_back(device, &self.read, 8 * u64::from(self.count))?;
        Ok(w.chunks(2)
            .map(|p| u64::from(p[0]) | (u64::from(p[1]) << 32))
            .collect())
    }

    /// Microseconds between the first two stamps (after the submission is done).
    fn read(&self, device: &wgpu::Device, period: f64) -> Result<f64> {
        let t = self.ticks(device)?;
        Ok(t[1].saturating_sub(t[0]) as f64 * period / 1000.0)
    }
}

impl WgpuHead {
    /// Times `iters` steps of `rows` over `logits`: host time to record and submit, and
    /// device time. The steps advance the slots like any other.
    #[doc(hidden)]
    pub fn time_steps(
        &mut self,
        logits: &DeviceLogits<'_>,
        rows: &[usize],
        iters: usize,
    ) -> Result<Vec<StepTime>> {
        let ts = self.ctx.has_timestamps();
        let stamps = ts.then(|| Stamps::new(self.ctx.device(), 2));
        let period = f64::from(self.ctx.queue().get_timestamp_period());
        let mut out = Vec::with_capacity(iters);
        for _ in 0..iters {
            let t = std::time::Instant::now();
            let mut enc = self
                .ctx
                .device()
                .create_command_encoder(&wgpu::CommandEncoderDescriptor { label: None });
            self.record_step_with(
                &mut enc,
                logits,
                None,
                rows,
                stamps
                    .as_ref()
                    .map_or(Stamping::None, |s| Stamping::Step(&s.qs)),
            )?;
            if let Some(s) = &stamps {
                s.copy(&mut enc);
            }
            self.ctx.queue().submit([enc.finish()]);
            let host_us = t.elapsed().as_secs_f64() * 1e6;
            let device_us = match &stamps {
                Some(s) => s.read(self.ctx.device(), period)?,
                None => {
                    self.ctx
                        .device()
                        .poll(wgpu::PollType::wait_indefinitely())
                        .map_err(|e| Error::Device(format!("waiting for the device: {e}")))?;
                    t.elapsed().as_secs_f64() * 1e6 - host_us
                }
            };
            self.wait()?;
            out.push(StepTime { host_us, device_us });
        }
        Ok(out)
    }
}

impl WgpuSampler {
    /// [`Error::Device`] when the adapter has no timestamp queries.
    fn need_timestamps(&self) -> Result<()> {
        if self.ctx.has_timestamps() {
            Ok(())
        } else {
            Err(Error::Device(format!(
                "{} has no timestamp queries",
                self.ctx.info().name
            )))
        }
    }

    /// A bench call's rows, and its requests' host masks as a device buffer: the bench
    /// times what the device runs (masked rows with device masks, as `record_masked`);
    /// a row using a stage the kernels do not run yet is an error naming it.
    fn bench_call<'r>(
        &self,
        logits: &DeviceLogits<'_>,
        requests: &'r [Request],
    ) -> Result<(Vec<crate::pipeline::Row<'r>>, Option<wgpu::Buffer>)> {
        let rows = pl::validated_rows(logits.rows, logits.vocab, requests)?;
        for (row, r) in requests.iter().enumerate() {
            let history = r.state.prompt.len() + r.state.output.len();
            crate::params::on_device_only(&r.params, row, history)?;
        }
        if requests.iter().all(|r| r.allowed.is_none()) {
            return Ok((rows, None));
        }
        let w = logits.vocab.div_ceil(32);
        let words: Vec<u32> = requests
            .iter()
            .flat_map(|r| r.allowed.clone().unwrap_or_else(|| vec![u32::MAX; w]))
            .collect();
        let buf = make_buffer(
            self.ctx.device(),
            "decoda bench masks",
            (words.len() * 4) as u64,
            wgpu::BufferUsages::STORAGE | wgpu::BufferUsages::COPY_DST,
        );
        self.ctx
            .queue()
            .write_buffer(&buf, 0, bytemuck::cast_slice(&words));
        Ok((rows, Some(buf)))
    }

    fn encoder(&self) -> wgpu::CommandEncoder {
        self.ctx
            .device()
            .create_command_encoder(&wgpu::CommandEncoderDescriptor { label: None })
    }

    /// GPU time of `iters` calls on device logits, in microseconds each, from timestamp
    /// queries around the call's compute pass. [`Error::Device`] when the adapter has no
    /// timestamps.
    #[doc(hidden)]
    pub fn time_gpu(
        &self,
        logits: &DeviceLogits<'_>,
        requests: &[Request],
        out: &DeviceOutputs,
        iters: usize,
    ) -> Result<Vec<f64>> {
        self.need_timestamps()?;
        let (rows, mbuf) = self.bench_call(logits, requests)?;
        let masks = masks_view(&mbuf, logits.vocab);
        let st = Stamps::new(self.ctx.device(), 2);
        let period = f64::from(self.ctx.queue().get_timestamp_period());
        let mut times = Vec::with_capacity(iters);
        for _ in 0..iters {
            let mut enc = self.encoder();
            let stamps = StepStamps::Step(&st.qs);
            self.record_inner_masked(&mut enc, logits, masks.as_ref(), &rows, out, stamps, 0)?;
            st.copy(&mut enc);
            self.ctx.queue().submit([enc.finish()]);
            times.push(st.read(self.ctx.device(), period)?);
        }
        Ok(times)
    }

    /// A profile of one call: each stage of the step in a compute pass of its own, with
    /// timestamps around each; the stages' names and device times in microseconds, in
    /// order (the call's plan: `scan, settle_finish` for rows without filters or
    /// log-probabilities, `probe` before them for filtered rows and `lp, finish` after,
    /// with the full-row path's `walk, decide` between for the stages that have phases,
    /// `probe, scan, settle, lp, finish` with log-probabilities (`settle_first,
    /// settle_rest` for `settle` where the device does not fuse `settle_finish`, and
    /// `settle_first, settle_rest, draw_finish` for `settle_finish` but in a light
    /// call); a stage recorded many
    /// times gives its sum). The passes' boundaries add little to a
    /// call's time, since the stages are dependent dispatches anyway.
    /// [`Error::Device`] when the adapter has no timestamps.
    #[doc(hidden)]
    pub fn time_stages(
        &self,
        logits: &DeviceLogits<'_>,
        requests: &[Request],
        out: &DeviceOutputs,
    ) -> Result<Vec<(&'static str, f64)>> {
        self.need_timestamps()?;
        let (rows, mbuf) = self.bench_call(logits, requests)?;
        let masks = masks_view(&mbuf, logits.vocab);
        let names = self.stage_names(&rows, logits.vocab);
        let st = Stamps::new(self.ctx.device(), 2 * names.len() as u32);
        let mut enc = self.encoder();
        let stamps = StepStamps::Stages(&st.qs);
        self.record_inner_masked(&mut enc, logits, masks.as_ref(), &rows, out, stamps, 0)?;
        st.copy(&mut enc);
        self.ctx.queue().submit([enc.finish()]);
        let t = st.ticks(self.ctx.device())?;
        let period = f64::from(self.ctx.queue().get_timestamp_period());
        // a stage recorded many times (the full-row path's phases) is their sum
        let mut out: Vec<(&'static str, f64)> = Vec::new();
        for (i, n) in names.iter().copied().enumerate() {
            let us = t[2 * i + 1].saturating_sub(t[2 * i]) as f64 * period / 1000.0;
            match out.iter_mut().find(|(m, _)| *m == n) {
                Some((_, total)) => *total += us,
                None => out.push((n, us)),
            }
        }
        Ok(out)
    }

    /// The dispatches a call of these rows records: (name, workgroups; at most that
    /// many for the grids the call computes), in order.
    fn grid_of(&self, rows: &[pl::Row<'_>], vocab: usize) -> Vec<(&'static str, u64)> {
        let (plan, phases) = WgpuSampler::plan_for(rows, vocab, 0);
        let (splits, chunk) = self.shape(vocab, rows.len());
        self.kernels.grid(super::kernels::StepShape {
            rows: rows.len(),
            splits,
            draw_groups: 0,
            plan,
            phases,
            sample_parts: self.kernels.sample_split(vocab, chunk).0,
            vocab,
        })
    }

    /// The names of the dispatches a call of these rows records, in order.
    fn stage_names(&self, rows: &[pl::Row<'_>], vocab: usize) -> Vec<&'static str> {
        self.grid_of(rows, vocab)
            .into_iter()
            .map(|(n, _)| n)
            .collect()
    }

    /// The structure of a call of these requests on rows of `vocab` logits: the
    /// compute dispatches it records, their names and workgroups in order, and the reads of a row's
    /// logits on the common path (see `Plan::row_reads`; a row on the full-row path
    /// reads more). Known before the call runs: the plan follows the parameters only.
    #[doc(hidden)]
    pub fn call_structure(&self, vocab: usize, requests: &[Request]) -> Result<CallStructure> {
        let rows = pl::validated_rows(requests.len(), vocab, requests)?;
        let logprobs = requests.iter().any(|r| r.params.logprobs.is_some());
        let plan = WgpuSampler::plan_for(&rows, vocab, 0).0;
        // the dispatches as the call records them
        let (stages, workgroups): (Vec<_>, Vec<_>) = self.grid_of(&rows, vocab).into_iter().unzip();
        Ok(CallStructure {
            dispatches: workgroups.len(),
            stages,
            row_reads: plan.row_reads(logprobs),
            workgroups,
        })
    }

    /// Which rows of one call on these rows were drawn on the full-row path, their
    /// candidate list not settling them: a test's view of where each row's work went.
    /// The call and the copy of the rows' state are one submission, so calls of other
    /// threads cannot come between them.
    #[doc(hidden)]
    pub fn full_row_rows(
        &self,
        logits: &crate::logits::Logits<'_>,
        requests: &[Request],
    ) -> Result<Vec<bool>> {
        use super::layout::{P_FULL, S_PATH};
        let st = self.row_states(logits, requests)?;
        Ok(st.iter().map(|w| w[S_PATH] == P_FULL).collect())
    }

    /// Which top-n-σ rows of one call on these rows had their sums made by the full-row
    /// path's first phase over the row's pieces, the scan's being out of their range
    /// (the others' came from the scan): a test's
    /// view, as [`Self::full_row_rows`]; false for rows without top-n-σ.
    #[doc(hidden)]
    pub fn sigma_walked_rows(
        &self,
        logits: &crate::logits::Logits<'_>,
        requests: &[Request],
    ) -> Result<Vec<bool>> {
        let st = self.row_states(logits, requests)?;
        Ok(st
            .iter()
            .zip(requests)
            .map(|(w, q)| w[super::layout::S_SD_WALK] == 1 && q.params.top_n_sigma > 0.0)
            .collect())
    }

    /// What the probe left each row of one call on these rows: its words named in
    /// `PROBE_WORDS` (candidate threshold, gathering threshold, top-p reference, needs,
    /// sample maximum, top-n-σ's reference and scale), as bits: a test's view (results
    /// never depend on them, so comparing results cannot check them).
    #[doc(hidden)]
    pub fn probe_states(
        &self,
        logits: &crate::logits::Logits<'_>,
        requests: &[Request],
    ) -> Result<Vec<[u32; 7]>> {
        let st = self.row_states(logits, requests)?;
        Ok(st
            .iter()
            .map(|w| super::layout::PROBE_WORDS.map(|(_, k)| w[k]))
            .collect())
    }

    /// The state words of each row after one call on these rows.
    fn row_states(
        &self,
        logits: &crate::logits::Logits<'_>,
        requests: &[Request],
    ) -> Result<Vec<Vec<u32>>> {
        use super::layout::STATE_WORDS;
        let buf = self.upload_logits(logits);
        let out = self.outputs_kept(requests.len())?;
        let view = DeviceLogits::packed(&buf, logits);
        let bytes = (requests.len() * STATE_WORDS * 4) as u64;
        let read = make_buffer(
            self.ctx.device(),
            "decoda paths",
            bytes,
            wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_DST,
        );
        let generation = || -> Result<u64> {
            Ok(self
                .scratch
                .lock()
                .map_err(|_| super::device::poisoned())?
                .work()
                .1)
        };
        // the copy must read the buffers the call bound: a call of another thread (or
        // this one, the first time) may replace them, and then this tries again
        let mut tries = 0;
        let enc = loop {
            let before = generation()?;
            let mut enc = self.encoder();
            self.record(&mut enc, &view, requests, &out)?;
            let sc = self.scratch.lock().map_err(|_| super::device::poisoned())?;
            let (work, now) = sc.work();
            if now == before {
                enc.copy_buffer_to_buffer(work, 0, &read, 0, bytes);
                break enc;
            }
            drop(sc);
            self.ctx.queue().submit([enc.finish()]);
            tries += 1;
            if tries == 8 {
                return Err(Error::Device("the step buffers kept changing".into()));
            }
        };
        self.ctx.queue().submit([enc.finish()]);
        let words: Vec<u32> = self.ctx.read_back(&read, bytes)?;
        Ok(words.chunks(STATE_WORDS).map(<[u32]>::to_vec).collect())
    }

    /// Calls issued back to back, as a serving loop issues them: `n` calls, call `i` on
    /// `logits[i % len]`, each recorded and submitted without waiting for the one
    /// before. Returns the `n - 1` intervals between consecutive calls' end timestamps
    /// in microseconds: a call's device time plus any gap the host leaves while it
    /// records the next. [`Error::Device`] when the adapter has no timestamps.
    #[doc(hidden)]
    pub fn time_stream(
        &self,
        logits: &[DeviceLogits<'_>],
        requests: &[Request],
        out: &DeviceOutputs,
        n: usize,
    ) -> Result<Vec<f64>> {
        self.need_timestamps()?;
        if logits.is_empty() || n < 2 {
            return Ok(Vec::new());
        }
        let (rows, mbuf) = self.bench_call(&logits[0], requests)?;
        let masks = masks_view(&mbuf, logits[0].vocab);
        use wgpu::BufferUsages as U;
        let sets: Vec<wgpu::QuerySet> = (0..n)
            .map(|_| {
                self.ctx
                    .device()
                    .create_query_set(&wgpu::QuerySetDescriptor {
                        label: Some("decoda stream timing"),
                        ty: wgpu::QueryType::Timestamp,
                        count: 2,
                    })
            })
            .collect();
        // one 256-byte slot per call (resolve offsets must be 256-aligned)
        let resolve = make_buffer(
            self.ctx.device(),
            "decoda stream ts",
            256 * n as u64,
            U::QUERY_RESOLVE | U::COPY_SRC,
        );
        let read = make_buffer(
            self.ctx.device(),
            "decoda stream ts read",
            256 * n as u64,
            U::MAP_READ | U::COPY_DST,
        );
        for (i, qs) in sets.iter().enumerate() {
            let mut enc = self.encoder();
            self.record_inner_masked(
                &mut enc,
                &logits[i % logits.len()],
                masks.as_ref(),
                &rows,
                out,
                StepStamps::Step(qs),
                0,
            )?;
            enc.resolve_query_set(qs, 0..2, &resolve, 256 * i as u64);
            self.ctx.queue().submit([enc.finish()]);
        }
        let mut enc = self.encoder();
        enc.copy_buffer_to_buffer(&resolve, 0, &read, 0, 256 * n as u64);
        self.ctx.queue().submit([enc.finish()]);
        let w: Vec<u32> = self.ctx.read_back(&read, 256 * n as u64)?;
        let period = f64::from(self.ctx.queue().get_timestamp_period());
        let end = |i: usize| u64::from(w[64 * i + 2]) | (u64::from(w[64 * i + 3]) << 32);
        Ok((1..n)
            .map(|i| end(i).saturating_sub(end(i - 1)) as f64 * period / 1000.0)
            .collect())
    }

    /// Times `iters` calls of the per-call API: host time to build the parameters,
    /// record and submit, and device time.
    #[doc(hidden)]
    pub fn time_calls(
        &self,
        logits: &DeviceLogits<'_>,
        requests: &[Request],
        out: &DeviceOutputs,
        iters: usize,
    ) -> Result<Vec<StepTime>> {
        let stamps = self
            .ctx
            .has_timestamps()
            .then(|| Stamps::new(self.ctx.device(), 2));
        let period = f64::from(self.ctx.queue().get_timestamp_period());
        let (_, mbuf) = self.bench_call(logits, requests)?;
        let masks = masks_view(&mbuf, logits.vocab);
        let mut times = Vec::with_capacity(iters);
        for _ in 0..iters {
            let t = std::time::Instant::now();
            let mut enc = self.encoder();
            self.record_inner_masked(
                &mut enc,
                logits,
                masks.as_ref(),
                &pl::validated_rows(logits.rows, logits.vocab, requests)?,
                out,
                stamps
                    .as_ref()
                    .map_or(StepStamps::None, |s| StepStamps::Step(&s.qs)),
                0,
            )?;
            if let Some(s) = &stamps {
                s.copy(&mut enc);
            }
            self.ctx.queue().submit([enc.finish()]);
            let host_us = t.elapsed().as_secs_f64() * 1e6;
            let device_us = match &stamps {
                Some(s) => s.read(self.ctx.device(), period)?,
                None => {
                    self.ctx
                        .device()
                        .poll(wgpu::PollType::wait_indefinitely())
                        .map_err(|e| Error::Device(format!("waiting for the device: {e}")))?;
                    t.elapsed().as_secs_f64() * 1e6 - host_us
                }
            };
            times.push(StepTime { host_us, device_us });
        }
        Ok(times)
    }

    /// Wall-clock microseconds of `iters` calls (record, submit, wait), for adapters
    /// without timestamps.
    #[doc(hidden)]
    pub fn time_wall(
        &self,
        logits: &DeviceLogits<'_>,
        requests: &[Request],
        out: &DeviceOutputs,
        iters: usize,
    ) -> Result<Vec<f64>> {
        let (rows, mbuf) = self.bench_call(logits, requests)?;
        let masks = masks_view(&mbuf, logits.vocab);
        let mut times = Vec::with_capacity(iters);
        for _ in 0..iters {
            let t = std::time::Instant::now();
            let mut enc = self.encoder();
            let stamps = StepStamps::None;
            self.record_inner_masked(&mut enc, logits, masks.as_ref(), &rows, out, stamps, 0)?;
            self.ctx.queue().submit([enc.finish()]);
            self.ctx
                .device()
                .poll(wgpu::PollType::wait_indefinitely())
                .map_err(|e| Error::Device(format!("waiting for the device: {e}")))?;
            times.push(t.elapsed().as_secs_f64() * 1e6);
        }
        Ok(times)
    }

    /// Copy bandwidth of the device in bytes per second (read plus write): the basis of
    /// the benchmarks' `floor_us` and of `--profile`'s bytes' times. A buffer of up to
    /// 256 MiB (the adapter's binding limit) is copied by a compute kernel (`copy.wgsl`)
    /// and by the copy command, 2 and then 10 times in one submission (the best of three
    /// wall-clock times each); each way's rate is that of the 8 copies between them, so
    /// the fixed cost of a submission and its wait cancels, and the faster way counts.
    /// (The copy command alone read 840 GB/s on an H200 whose copies PyTorch's kernels
    /// run at 4,219: NVIDIA's driver can give it to a copy engine.) On an adapter where
    /// one copy (after the untimed one) takes 20 ms or more (lavapipe on two cores: 30 to 80
    /// ms), each way's rate is that copy's.
    #[doc(hidden)]
    pub fn copy_bandwidth(&self) -> Result<f64> {
        use super::device::{lazy_pipelines, Bind};
        use wgpu::BufferUsages as U;
        let device = self.ctx.device();
        // whole workgroups of 1,024 vec4s (16 KiB)
        let limit = device.limits().max_storage_buffer_binding_size;
        let size: u64 = (256u64 << 20).min(limit) / (16 << 10) * (16 << 10);
        if size == 0 {
            return Err(Error::Device("no storage binding to measure with".into()));
        }
        let usage = U::STORAGE | U::COPY_SRC | U::COPY_DST;
        let a = make_buffer(device, "decoda bw a", size, usage);
        let b = make_buffer(device, "decoda bw b", size, usage);
        let pipes = lazy_pipelines::<1>(
            device,
            "decoda copy",
            include_str!("copy.wgsl").to_string(),
            &[Bind::Read, Bind::Write],
            ["copy4"],
            "the bandwidth probe's kernel",
        )?;
        let group = device.create_bind_group(&wgpu::BindGroupDescriptor {
            label: Some("decoda bw"),
            layout: &pipes.binds,
            entries: &[
                wgpu::BindGroupEntry {
                    binding: 0,
                    resource: a.as_entire_binding(),
                },
                wgpu::BindGroupEntry {
                    binding: 1,
                    resource: b.as_entire_binding(),
                },
            ],
        });
        let groups = (size / (16 << 10)) as u32;
        let max = device.limits().max_compute_workgroups_per_dimension;
        let (gx, gy) = (groups.min(max), groups.div_ceil(max));
        let time = |copies: usize, kernel: bool, tries: usize| -> Result<f64> {
            let mut best = f64::INFINITY;
            for _ in 0..tries {
                let t = std::time::Instant::now();
                let mut enc = self.encoder();
                for _ in 0..copies {
                    if kernel {
                        let mut pass = enc.begin_compute_pass(&Default::default());
                        pass.set_pipeline(pipes.get(0));
                        pass.set_bind_group(0, &group, &[]);
                        pass.dispatch_workgroups(gx, gy, 1);
                    } else {
                        enc.copy_buffer_to_buffer(&a, 0, &b, 0, size);
                    }
                }
                self.ctx.queue().submit([enc.finish()]);
                device
                    .poll(wgpu::PollType::wait_indefinitely())
                    .map_err(|e| Error::Device(format!("waiting for the device: {e}")))?;
                best = best.min(t.elapsed().as_secs_f64());
            }
            Ok(best)
        };
        let mut rate: f64 = 0.0;
        for kernel in [true, false] {
            // one untimed submission first: the buffers' pages exist after it
            time(1, kernel, 1)?;
            let one = time(1, kernel, 1)?;
            let r = if one >= SLOW_COPY_S {
                // a slow adapter (a software one): a copy's bytes dwarf a submission's
                // fixed cost, so that copy's time is its rate (the 36 copies of 256 MiB
                // below take lavapipe seconds a process)
                2.0 * size as f64 / one
            } else {
                let (few, many) = (time(2, kernel, 3)?, time(10, kernel, 3)?);
                // a difference lost in timing noise falls back to the 10 copies' own rate
                let dt = if many > few { many - few } else { many };
                let copies = if many > few { 8.0 } else { 10.0 };
                2.0 * copies * size as f64 / dt
            };
            rate = rate.max(r);
        }
        Ok(rate)
    }
}

/// The bench's mask buffer as a view: row `r`'s mask at word `r * ceil(V / 32)`.
fn masks_view(buf: &Option<wgpu::Buffer>, vocab: usize) -> Option<DeviceMasks<'_>> {
    buf.as_ref().map(|buffer| DeviceMasks {
        buffer,
        offset: 0,
        row_stride: vocab.div_ceil(32),
    })
}

/// The time of one copy of the bandwidth probe's buffer at or above which the adapter is
/// slow enough that one copy measures its rate (a copy of 256 MiB takes an H200 about a
/// tenth of a millisecond, lavapipe on two cores 30 to 80 ms).
const SLOW_COPY_S: f64 = 0.02;
