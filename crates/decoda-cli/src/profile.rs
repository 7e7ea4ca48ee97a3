//! `--profile`: a profiled run's kernels as a table or JSON, each beside the time its
//! planned bytes take at a bandwidth (`--bandwidth-gbs`, or the adapter's measured copy
//! rate).

use decoda::profile::{KernelLine, StepProfile};
use serde_json::{json, Value};

/// The bandwidth the bytes' times are taken at, and where it came from.
#[derive(Clone, Copy, Debug)]
pub struct Bandwidth {
    /// GB/s.
    pub gbs: f64,
    /// Given with `--bandwidth-gbs` (else measured: the device's copy rate).
    pub given: bool,
}

impl Bandwidth {
    /// `given`, or the copy rate `measure` returns (bytes per second).
    pub fn of(
        given: Option<f64>,
        measure: impl FnOnce() -> decoda::Result<f64>,
    ) -> Result<Self, String> {
        match given {
            Some(g) if g > 0.0 && g.is_finite() => Ok(Self {
                gbs: g,
                given: true,
            }),
            Some(g) => Err(format!("--bandwidth-gbs {g}: expected a positive number")),
            None => Ok(Self {
                gbs: measure().map_err(|e| e.to_string())? / 1e9,
                given: false,
            }),
        }
    }

    fn source(&self) -> &'static str {
        if self.given {
            "given"
        } else {
            "measured copy rate"
        }
    }
}

fn r2(x: f64) -> f64 {
    (x * 100.0).round() / 100.0
}

fn line_json(l: &KernelLine, bw: Bandwidth) -> Value {
    let bytes_us = l.bytes_us(bw.gbs);
    json!({
        "kernel": l.kernel,
        "dispatches": r2(l.dispatches),
        "workgroups": r2(l.workgroups),
        "bytes_read": l.bytes_read.round(),
        "bytes_written": l.bytes_written.round(),
        "bytes_us": r2(bytes_us),
        "device_us": l.device_us.map(r2),
        "x_bytes": l.device_us.map(|d| r2(d / bytes_us.max(1e-9))),
    })
}

/// The profile as JSON: per kernel and the total, per step.
pub fn to_json(p: &StepProfile, bw: Bandwidth) -> Value {
    json!({
        "steps": p.steps,
        "bandwidth_gbs": r2(bw.gbs),
        "bandwidth": bw.source(),
        "kernels": p.by_kernel().iter().map(|l| line_json(l, bw)).collect::<Vec<_>>(),
        "total": line_json(&p.total(), bw),
    })
}

/// The profile as a table on stdout, `what` naming the steps (`decode steps`).
pub fn print(p: &StepProfile, bw: Bandwidth, what: &str, adapter: &str) {
    println!(
        "profile: {} {what} on {adapter}; means per step, each dispatch timed in a pass of \
         its own; bytes' time at {:.1} GB/s ({})",
        p.steps,
        bw.gbs,
        bw.source()
    );
    println!(
        "{:<20} {:>9} {:>11} {:>12} {:>12} {:>11} {:>11} {:>9}",
        "kernel",
        "dispatch",
        "workgroups",
        "read MB",
        "written MB",
        "device µs",
        "bytes µs",
        "x bytes"
    );
    let lines = p.by_kernel();
    for l in lines.iter().chain(std::iter::once(&p.total())) {
        let bytes_us = l.bytes_us(bw.gbs);
        let dev = l.device_us.map_or("-".to_string(), |d| format!("{d:.2}"));
        let x = l.device_us.map_or("-".to_string(), |d| {
            format!("{:.2}", d / bytes_us.max(1e-9))
        });
        println!(
            "{:<20} {:>9.2} {:>11.0} {:>12.4} {:>12.4} {:>11} {:>11.3} {:>9}",
            l.kernel,
            l.dispatches,
            l.workgroups,
            l.bytes_read / 1e6,
            l.bytes_written / 1e6,
            dev,
            bytes_us,
            x
        );
    }
}
