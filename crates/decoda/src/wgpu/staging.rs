//! Per-call parameters on their way to the device, by submission.
//!
//! A recorded call needs its parameters (a few dozen bytes a row) in device buffers when
//! its commands run, which may be long after `record` returns and after other calls were
//! recorded. Each call therefore gets a staging buffer of its own: written with
//! [`wgpu::Queue::write_buffer`] (which lands before the next submission's commands) and
//! copied into the working buffers by the call's own recorded commands. The buffer goes
//! back to the pool only when the GPU has finished the submission that holds those copies
//! (the encoder's `on_submitted_work_done` callback), so no later call can overwrite the
//! parameters of a call that is recorded but not yet run, however many calls are recorded
//! before a submit. The pool grows to the largest number of calls in flight at once and
//! then stops allocating. (An encoder that is dropped without being submitted keeps its
//! staging buffer out of the pool.)

use std::sync::{Arc, Mutex};

/// Staging buffers that no recorded, unfinished call uses.
pub(crate) struct StagePool {
    free: Arc<Mutex<Vec<wgpu::Buffer>>>,
}

impl StagePool {
    pub fn new() -> Self {
        Self {
            free: Arc::new(Mutex::new(Vec::new())),
        }
    }

    /// A free staging buffer of at least `bytes` bytes and whether it had to be created.
    pub fn take(&self, device: &wgpu::Device, bytes: u64) -> (wgpu::Buffer, bool) {
        let mut free = self.free.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(i) = free.iter().position(|b| b.size() >= bytes) {
            return (free.swap_remove(i), false);
        }
        // none large enough: drop the smallest free one (if any) and make a new one
        if let Some(i) = (0..free.len()).min_by_key(|&i| free[i].size()) {
            free.swap_remove(i);
        }
        let size = bytes.max(256).next_power_of_two();
        let buf = device.create_buffer(&wgpu::BufferDescriptor {
            label: Some("decoda parameters (staging)"),
            size,
            usage: wgpu::BufferUsages::COPY_SRC | wgpu::BufferUsages::COPY_DST,
            mapped_at_creation: false,
        });
        (buf, true)
    }

    /// Returns `buf` to the pool once the work of `encoder`'s submission is done.
    pub fn release_after(&self, encoder: &wgpu::CommandEncoder, buf: wgpu::Buffer) {
        let free = Arc::clone(&self.free);
        encoder.on_submitted_work_done(move || {
            free.lock().unwrap_or_else(|p| p.into_inner()).push(buf);
        });
    }

    /// Staging buffers currently free (for tests).
    pub fn free_count(&self) -> usize {
        self.free.lock().unwrap_or_else(|p| p.into_inner()).len()
    }
}
