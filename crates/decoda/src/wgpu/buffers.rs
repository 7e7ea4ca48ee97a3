//! Buffers: the working buffers that grow on demand, plain ones, and reading a buffer
//! back to the host.

use crate::error::{Error, Result};

/// A working buffer, grown on demand and reused.
pub(crate) struct Grow {
    pub buf: wgpu::Buffer,
    usage: wgpu::BufferUsages,
    label: &'static str,
}

impl Grow {
    pub(crate) fn new(
        device: &wgpu::Device,
        label: &'static str,
        usage: wgpu::BufferUsages,
    ) -> Self {
        Self {
            buf: make_buffer(device, label, 256, usage),
            usage,
            label,
        }
    }

    /// Makes the buffer at least `bytes` long; true when it was replaced. It grows by
    /// doubling, but never past what one binding may hold unless `bytes` itself is more
    /// (a caller that checked `bytes` against the limit can bind the buffer).
    pub fn ensure(&mut self, device: &wgpu::Device, bytes: u64) -> bool {
        if self.buf.size() >= bytes {
            return false;
        }
        let cap = device.limits().max_storage_buffer_binding_size;
        let mut size = bytes.max(self.buf.size() * 2).next_multiple_of(256);
        if size > cap {
            size = bytes.max(cap).next_multiple_of(4);
        }
        self.buf = make_buffer(device, self.label, size, self.usage);
        true
    }
}

pub(crate) fn make_buffer(
    device: &wgpu::Device,
    label: &str,
    size: u64,
    usage: wgpu::BufferUsages,
) -> wgpu::Buffer {
    device.create_buffer(&wgpu::BufferDescriptor {
        label: Some(label),
        size,
        usage,
        mapped_at_creation: false,
    })
}

/// The first `bytes` bytes of `buf` (usage `MAP_READ`), once `device` has finished the
/// work submitted so far, as values of `T` (every read of results, logits, timestamps).
pub(crate) fn read_back<T: bytemuck::Pod>(
    device: &wgpu::Device,
    buf: &wgpu::Buffer,
    bytes: u64,
) -> Result<Vec<T>> {
    let slice = buf.slice(0..bytes);
    let (tx, rx) = std::sync::mpsc::channel();
    slice.map_async(wgpu::MapMode::Read, move |r| {
        let _ = tx.send(r);
    });
    device
        .poll(wgpu::PollType::wait_indefinitely())
        .map_err(|e| Error::Device(format!("waiting for the device: {e}")))?;
    rx.recv()
        .map_err(|_| Error::Device("the map callback never ran".into()))?
        .map_err(|e| Error::Device(format!("mapping a buffer to read it: {e}")))?;
    let values = {
        let view = slice
            .get_mapped_range()
            .map_err(|e| Error::Device(format!("mapping a buffer to read it: {e}")))?;
        bytemuck::cast_slice::<u8, T>(&view).to_vec()
    };
    buf.unmap();
    Ok(values)
}
