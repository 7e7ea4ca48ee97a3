//! Seeing a step: what each dispatch of a device step is planned to do (workgroups,
//! bytes read and written) and, where the adapter has timestamp queries, what it took.
//!
//! A backend fills a [`StepProfile`] from its plan ([`Launch`], one per dispatch) and
//! its timestamps; [`StepProfile::by_kernel`] sums it per kernel for a report, and
//! [`KernelLine::bytes_us`] gives the bytes' time at a bandwidth, the figure each
//! kernel's device time is read against.

/// The plan of one dispatch: exact on any adapter (it is what the launcher asks for),
/// whatever the adapter's clock says.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Launch {
    /// The kernel (entry point), prefixed by its module: `model.linear`, `moe.act`,
    /// `sample.scan`.
    pub kernel: String,
    /// Workgroups launched.
    pub workgroups: u64,
    /// Bytes the kernel reads from device memory (weights in their stored format,
    /// activations, caches, logits), counting a value read by several workgroups once
    /// per workgroup that reads it.
    pub bytes_read: u64,
    /// Bytes it writes.
    pub bytes_written: u64,
}

/// One dispatch of a profiled step: its plan and its device time.
#[derive(Clone, Debug, PartialEq)]
pub struct DispatchTime {
    /// The plan.
    pub launch: Launch,
    /// Nanoseconds between the timestamps written around it (its own compute pass);
    /// `None` where the adapter has no timestamp queries.
    pub device_ns: Option<f64>,
}

/// Profiled steps of a decode loop (or calls of a layer): every dispatch of each, in
/// order.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct StepProfile {
    /// Steps (or calls) profiled.
    pub steps: usize,
    /// The dispatches of every profiled step, in recording order.
    pub dispatches: Vec<DispatchTime>,
}

/// One kernel's share of a step: summed over its dispatches and averaged over the
/// steps.
#[derive(Clone, Debug, PartialEq)]
pub struct KernelLine {
    /// The kernel.
    pub kernel: String,
    /// Its dispatches per step.
    pub dispatches: f64,
    /// Workgroups per step.
    pub workgroups: f64,
    /// Bytes read per step.
    pub bytes_read: f64,
    /// Bytes written per step.
    pub bytes_written: f64,
    /// Device microseconds per step (`None` without timestamps).
    pub device_us: Option<f64>,
}

impl KernelLine {
    /// Microseconds the kernel's bytes (read and written) take at `gbs` GB/s.
    pub fn bytes_us(&self, gbs: f64) -> f64 {
        (self.bytes_read + self.bytes_written) / (gbs * 1e3)
    }
}

impl StepProfile {
    /// Adds one step's dispatches.
    pub fn push_step(&mut self, dispatches: impl IntoIterator<Item = DispatchTime>) {
        self.steps += 1;
        self.dispatches.extend(dispatches);
    }

    /// Per kernel, in the order each kernel first runs, per step.
    pub fn by_kernel(&self) -> Vec<KernelLine> {
        let steps = self.steps.max(1) as f64;
        let mut lines: Vec<KernelLine> = Vec::new();
        let mut timed: Vec<bool> = Vec::new();
        for d in &self.dispatches {
            let at = match lines.iter().position(|l| l.kernel == d.launch.kernel) {
                Some(i) => i,
                None => {
                    lines.push(KernelLine {
                        kernel: d.launch.kernel.clone(),
                        dispatches: 0.0,
                        workgroups: 0.0,
                        bytes_read: 0.0,
                        bytes_written: 0.0,
                        device_us: Some(0.0),
                    });
                    timed.push(true);
                    lines.len() - 1
                }
            };
            let l = &mut lines[at];
            l.dispatches += 1.0;
            l.workgroups += d.launch.workgroups as f64;
            l.bytes_read += d.launch.bytes_read as f64;
            l.bytes_written += d.launch.bytes_written as f64;
            match d.device_ns {
                Some(ns) => {
                    if let Some(us) = l.device_us.as_mut() {
                        *us += ns / 1e3;
                    }
                }
                None => timed[at] = false,
            }
        }
        for (l, t) in lines.iter_mut().zip(timed) {
            l.dispatches /= steps;
            l.workgroups /= steps;
            l.bytes_read /= steps;
            l.bytes_written /= steps;
            l.device_us = if t {
                l.device_us.map(|u| u / steps)
            } else {
                None
            };
        }
        lines
    }

    /// The whole step: dispatches, bytes read and written, and device microseconds
    /// (when every dispatch was timed), per step.
    pub fn total(&self) -> KernelLine {
        let lines = self.by_kernel();
        KernelLine {
            kernel: "total".into(),
            dispatches: lines.iter().map(|l| l.dispatches).sum(),
            workgroups: lines.iter().map(|l| l.workgroups).sum(),
            bytes_read: lines.iter().map(|l| l.bytes_read).sum(),
            bytes_written: lines.iter().map(|l| l.bytes_written).sum(),
            device_us: lines.iter().map(|l| l.device_us).sum(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn d(kernel: &str, wg: u64, r: u64, ns: Option<f64>) -> DispatchTime {
        DispatchTime {
            launch: Launch {
                kernel: kernel.into(),
                workgroups: wg,
                bytes_read: r,
                bytes_written: 4,
            },
            device_ns: ns,
        }
    }

    #[test]
    fn lines_sum_per_kernel_and_average_per_step() {
        let mut p = StepProfile::default();
        p.push_step([
            d("a", 2, 100, Some(1000.0)),
            d("b", 1, 10, Some(500.0)),
            d("a", 2, 100, Some(3000.0)),
        ]);
        p.push_step([
            d("a", 2, 100, Some(2000.0)),
            d("b", 1, 10, None),
            d("a", 2, 100, Some(2000.0)),
        ]);
        let l = p.by_kernel();
        assert_eq!(l.len(), 2);
        assert_eq!(l[0].kernel, "a");
        assert_eq!(l[0].dispatches, 2.0);
        assert_eq!(l[0].workgroups, 4.0);
        assert_eq!(l[0].bytes_read, 200.0);
        assert_eq!(l[0].device_us, Some(4.0));
        // one of b's dispatches was not timed: no device time for it
        assert_eq!(l[1].device_us, None);
        let t = p.total();
        assert_eq!(t.dispatches, 3.0);
        assert_eq!(t.device_us, None);
        // 200 + 8 bytes at 1 GB/s: 0.208 µs
        assert!((l[0].bytes_us(1.0) - 0.208).abs() < 1e-12);
    }
}
