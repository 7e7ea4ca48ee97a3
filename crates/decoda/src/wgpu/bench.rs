//! Timing hooks for the CLI's benchmarks (`decoda bench --device wgpu`): GPU time from
//! timestamp queries, wall-clock time, and the device's copy bandwidth. Not part of the
//! sampling API.

use crate::error::{Error, Result};
use crate::params::Request;

use super::sampler::{make_buffer, DeviceLogits, DeviceOutputs, WgpuSampler};

impl WgpuSampler {
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
        if !self.timestamps {
            return Err(Error::Device(format!(
                "{} has no timestamp queries",
                self.info.name
            )));
        }
        let qs = self.device.create_query_set(&wgpu::QuerySetDescriptor {
            label: Some("decoda timing"),
            ty: wgpu::QueryType::Timestamp,
            count: 2,
        });
        use wgpu::BufferUsages as U;
        let resolve = make_buffer(
            &self.device,
            "decoda ts",
            256,
            U::QUERY_RESOLVE | U::COPY_SRC,
        );
        let read = make_buffer(
            &self.device,
            "decoda ts read",
            256,
            U::MAP_READ | U::COPY_DST,
        );
        let period = f64::from(self.queue.get_timestamp_period());
        let mut times = Vec::with_capacity(iters);
        for _ in 0..iters {
            let mut enc = self
                .device
                .create_command_encoder(&wgpu::CommandEncoderDescriptor { label: None });
            self.record_inner(&mut enc, logits, requests, out, Some(&qs), 0)?;
            enc.resolve_query_set(&qs, 0..2, &resolve, 0);
            enc.copy_buffer_to_buffer(&resolve, 0, &read, 0, 16);
            self.queue.submit([enc.finish()]);
            let w = self.map_words(&read, 16)?;
            let t0 = u64::from(w[0]) | (u64::from(w[1]) << 32);
            let t1 = u64::from(w[2]) | (u64::from(w[3]) << 32);
            times.push(t1.saturating_sub(t0) as f64 * period / 1000.0);
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
        let mut times = Vec::with_capacity(iters);
        for _ in 0..iters {
            let t = std::time::Instant::now();
            let mut enc = self
                .device
                .create_command_encoder(&wgpu::CommandEncoderDescriptor { label: None });
            self.record(&mut enc, logits, requests, out)?;
            self.queue.submit([enc.finish()]);
            self.device
                .poll(wgpu::PollType::wait_indefinitely())
                .map_err(|e| Error::Device(format!("waiting for the device: {e}")))?;
            times.push(t.elapsed().as_secs_f64() * 1e6);
        }
        Ok(times)
    }

    /// Copy bandwidth of the device in bytes per second (read plus write), measured by
    /// copying a 64 MiB buffer a few times; the basis of the benchmarks' `floor_us`.
    #[doc(hidden)]
    pub fn copy_bandwidth(&self) -> Result<f64> {
        use wgpu::BufferUsages as U;
        let size: u64 = 64 << 20;
        let a = make_buffer(&self.device, "decoda bw a", size, U::COPY_SRC | U::COPY_DST);
        let b = make_buffer(&self.device, "decoda bw b", size, U::COPY_SRC | U::COPY_DST);
        let mut best = f64::INFINITY;
        for _ in 0..5 {
            let t = std::time::Instant::now();
            let mut enc = self
                .device
                .create_command_encoder(&wgpu::CommandEncoderDescriptor { label: None });
            for _ in 0..4 {
                enc.copy_buffer_to_buffer(&a, 0, &b, 0, size);
            }
            self.queue.submit([enc.finish()]);
            self.device
                .poll(wgpu::PollType::wait_indefinitely())
                .map_err(|e| Error::Device(format!("waiting for the device: {e}")))?;
            best = best.min(t.elapsed().as_secs_f64());
        }
        Ok(2.0 * 4.0 * size as f64 / best)
    }
}
