//! The devices the device tests of one process share.
//!
//! Opening a device compiles (or loads from the driver's disk cache) every pipeline it
//! runs: on lavapipe a cold compile of the sampler's step kernels takes about 40 s of a
//! core, and tests that each opened a device of their own paid it each, several at once
//! when they ran in parallel. A test takes a fresh sampler, head, MoE layer or model on
//! a shared device instead (its own buffers, staging and scratch: a fresh object in
//! every way a user sees), and the pipelines are built once per shared device. The
//! checks that a brand-new device works open one of their own ([`own_device`]).
//!
//! There are [`DEVICES`] shared devices, and a test thread takes the one fewer running
//! tests hold at its first call ([`lane`]), keeping it to the thread's end: a device
//! runs one submission at a time (lavapipe executes a device's work on its one queue
//! thread), so the harness's two threads on one device waited for each other while a
//! core stood idle. Values kept across tests that hold device objects are kept per
//! device ([`PerDevice`]), so a test never mixes two devices' objects.

use std::sync::atomic::{AtomicUsize, Ordering};
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

/// How many shared test devices a process opens at most (the harness runs two tests at
/// once on two cores; `DECODA_TEST_DEVICES=1` shares one).
pub const DEVICES: usize = 2;

/// How many running test threads hold each shared device.
static HOLDERS: [AtomicUsize; DEVICES] = [const { AtomicUsize::new(0) }; DEVICES];

/// A test thread's hold on shared device `.0`, let go when the thread ends.
struct Hold(usize);

impl Drop for Hold {
    fn drop(&mut self) {
        HOLDERS[self.0].fetch_sub(1, Ordering::Relaxed);
    }
}

thread_local! {
    static HOLD: Hold = {
        let n = std::env::var("DECODA_TEST_DEVICES")
            .ok()
            .and_then(|v| v.parse::<usize>().ok())
            .map_or(DEVICES, |n| n.clamp(1, DEVICES));
        let i = (0..n)
            .min_by_key(|&i| HOLDERS[i].load(Ordering::Relaxed))
            .unwrap_or(0);
        HOLDERS[i].fetch_add(1, Ordering::Relaxed);
        Hold(i)
    };
}

/// The shared device of the calling thread (an index below [`DEVICES`]): at its first
/// call, the one fewer running threads hold.
pub fn lane() -> usize {
    HOLD.try_with(|h| h.0).unwrap_or(0)
}

/// The calling thread's shared test device (default options), opened at the first
/// call on any thread that takes it.
pub fn device() -> Option<&'static WgpuDevice> {
    static D: [OnceLock<Option<WgpuDevice>>; DEVICES] = [const { OnceLock::new() }; DEVICES];
    D[lane()]
        .get_or_init(|| {
            let d = or_skip(WgpuDevice::new())?;
            eprintln!("device tests on {}", d.adapter());
            Some(d)
        })
        .as_ref()
}

/// A value kept across tests for each shared device (a long-lived sampler, say): the
/// calling thread's device's ([`lane`]), made at its first use there.
pub struct PerDevice<T>([OnceLock<T>; DEVICES]);

impl<T> PerDevice<T> {
    /// None made yet.
    pub const fn new() -> Self {
        Self([const { OnceLock::new() }; DEVICES])
    }

    /// The calling thread's device's value, made by `make` at its first use.
    pub fn get_or_init(&self, make: impl FnOnce() -> T) -> &T {
        self.0[lane()].get_or_init(make)
    }
}

impl<T> Default for PerDevice<T> {
    fn default() -> Self {
        Self::new()
    }
}

/// A fresh sampler on the calling thread's shared test device.
pub fn sampler() -> Option<WgpuSampler> {
    device().map(|d| WgpuSampler::on(d).expect("the test device runs the sampler"))
}

/// A device of its own with `options` (compiling or loading every pipeline it runs):
/// for the checks of a brand-new device, of other options, or of device-wide settings
/// ([`WgpuDevice::set_weight_part_bytes`]) that must not reach the shared one.
pub fn own_device(options: WgpuOptions) -> Option<WgpuDevice> {
    or_skip(WgpuDevice::with_options(options))
}
