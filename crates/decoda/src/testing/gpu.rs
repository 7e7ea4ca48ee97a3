//! The device the device tests of one process share.
//!
//! Opening a device compiles (or loads from the driver's disk cache) every pipeline it
//! runs: on lavapipe a cold compile of the sampler's step kernels takes about 40 s of a
//! core, and tests that each opened a device of their own paid it each, several at once
//! when they ran in parallel. A test takes a fresh sampler, head, MoE layer or model on
//! this device instead (its own buffers, staging and scratch: a fresh object in every
//! way a user sees), and the pipelines are built once per process. The checks that a
//! brand-new device works open one of their own ([`own_device`]).

use std::sync::OnceLock;

use crate::error::Result;
use crate::wgpu::{WgpuDevice, WgpuOptions, WgpuSampler};

/// Whether the run requires an adapter (`DECODA_REQUIRE_GPU=1`, as in CI): then "no
/// adapter" fails the device tests instead of skipping them.
pub fn required() -> bool {
    std::env::var("DECODA_REQUIRE_GPU").is_ok_and(|v| v == "1")
}

/// `Some` of an opened device, or `None` after saying why on stderr; a panic when an
/// adapter is [`required`].
pub fn or_skip<T>(opened: Result<T>) -> Option<T> {
    match opened {
        Ok(t) => Some(t),
        Err(e) => {
            if required() {
                panic!("DECODA_REQUIRE_GPU=1 but the wgpu backend is unavailable: {e}");
            }
            eprintln!("device tests skipped: {e}");
            None
        }
    }
}

/// The process's test device (default options), opened at the first call.
pub fn device() -> Option<&'static WgpuDevice> {
    static D: OnceLock<Option<WgpuDevice>> = OnceLock::new();
    D.get_or_init(|| {
        let d = or_skip(WgpuDevice::new())?;
        eprintln!("device tests on {}", d.adapter());
        Some(d)
    })
    .as_ref()
}

/// A fresh sampler on the process's test device.
pub fn sampler() -> Option<WgpuSampler> {
    device().map(|d| WgpuSampler::on(d).expect("the test device runs the sampler"))
}

/// A device of its own with `options` (compiling or loading every pipeline it runs):
/// for the checks of a brand-new device, of other options, or of device-wide settings
/// ([`WgpuDevice::set_weight_part_bytes`]) that must not reach the shared one.
pub fn own_device(options: WgpuOptions) -> Option<WgpuDevice> {
    or_skip(WgpuDevice::with_options(options))
}
