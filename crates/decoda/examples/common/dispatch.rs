//! What the lavapipe cost examples (`barrier_cost`, `branch_cost`) share: a one-entry
//! kernel built from WGSL with its buffers bound in order, and the wall time of one
//! dispatch of it.

use decoda::wgpu::WgpuDevice;

/// A kernel ready to dispatch: `main` of `src`, binding `i` bound to `buffers[i]`.
pub struct Kernel {
    pipe: wgpu::ComputePipeline,
    bind: wgpu::BindGroup,
}

impl Kernel {
    /// Builds `main` of `src` (its layout from the shader) and binds `buffers` in order.
    pub fn new(ctx: &WgpuDevice, name: &str, src: String, buffers: &[&wgpu::Buffer]) -> Self {
        let dev = ctx.device();
        let module = dev.create_shader_module(wgpu::ShaderModuleDescriptor {
            label: Some(name),
            source: wgpu::ShaderSource::Wgsl(src.into()),
        });
        let pipe = dev.create_compute_pipeline(&wgpu::ComputePipelineDescriptor {
            label: Some(name),
            layout: None,
            module: &module,
            entry_point: Some("main"),
            compilation_options: Default::default(),
            cache: None,
        });
        let entries: Vec<_> = buffers
            .iter()
            .enumerate()
            .map(|(i, b)| wgpu::BindGroupEntry {
                binding: i as u32,
                resource: b.as_entire_binding(),
            })
            .collect();
        let bind = dev.create_bind_group(&wgpu::BindGroupDescriptor {
            label: Some(name),
            layout: &pipe.get_bind_group_layout(0),
            entries: &entries,
        });
        Self { pipe, bind }
    }

    /// Wall seconds per dispatch of `groups` workgroups: after two dispatches to warm
    /// up, the best of 3 runs of `n` dispatches recorded back to back.
    pub fn seconds(
        &self,
        ctx: &WgpuDevice,
        groups: u32,
        n: usize,
    ) -> Result<f64, Box<dyn std::error::Error>> {
        let (dev, queue) = (ctx.device(), ctx.queue());
        let run = |n: usize| -> Result<f64, Box<dyn std::error::Error>> {
            let t = std::time::Instant::now();
            let mut enc = dev.create_command_encoder(&Default::default());
            {
                let mut pass = enc.begin_compute_pass(&Default::default());
                pass.set_pipeline(&self.pipe);
                pass.set_bind_group(0, &self.bind, &[]);
                for _ in 0..n {
                    pass.dispatch_workgroups(groups, 1, 1);
                }
            }
            queue.submit([enc.finish()]);
            dev.poll(wgpu::PollType::wait_indefinitely())?;
            Ok(t.elapsed().as_secs_f64())
        };
        run(2)?;
        let mut best = f64::MAX;
        for _ in 0..3 {
            best = best.min(run(n)?);
        }
        Ok(best / n as f64)
    }
}

/// A storage buffer of `size` bytes (a new one reads as zeros).
pub fn storage(ctx: &WgpuDevice, size: u64) -> wgpu::Buffer {
    ctx.device().create_buffer(&wgpu::BufferDescriptor {
        label: Some("cost example"),
        size,
        usage: wgpu::BufferUsages::STORAGE,
        mapped_at_creation: false,
    })
}
