//! How a device is chosen and opened: [`WgpuOptions`] and the environment variables that
//! override it.

/// How to open a [`WgpuDevice`](super::WgpuDevice) (and so a [`WgpuSampler`](super::WgpuSampler)); `Default` = subgroups by adapter kind, any adapter.
#[derive(Debug, Clone, Copy, Default)]
pub struct WgpuOptions {
    /// Subgroup operations for the reductions: `None` (default) uses them on hardware
    /// adapters that have them and not on software ones (on lavapipe they measured
    /// 1.3-2x slower than workgroup memory); `Some(true)` whenever the adapter has them;
    /// `Some(false)` never. Results are the same either way. `DECODA_WGPU_SUBGROUPS=0`
    /// or `=1` overrides `None`.
    pub subgroups: Option<bool>,
    /// Accept only a hardware adapter (no software one such as lavapipe).
    pub hardware_only: bool,
    /// Philox's products in 64-bit integers: `None` (default) or `Some(true)` whenever
    /// the adapter has `SHADER_INT64`; `Some(false)` never (the 16-bit construction).
    /// Results are the same bits either way.
    pub int64: Option<bool>,
    /// A call without log-probabilities or draws settles its rows and finishes them in
    /// one dispatch (`settle_finish`): `None` (default) on hardware adapters, where it
    /// saves a dispatch a step, and not on software ones, where a dispatch costs
    /// nothing and that kernel costs lavapipe about 40 s of LLVM to build (`settle`
    /// and `draw_finish` instead, a few seconds; and `settle` itself as `settle_first`
    /// and `settle_rest` in every call but a light one); `Some(true)` always,
    /// `Some(false)` never. Results are the same bits either way. `DECODA_WGPU_FUSED=0` or `=1`
    /// overrides `None`.
    pub fused_settle: Option<bool>,
    /// The probe samples a row in pieces, the scan's (at least 4,096 logits each): `None`
    /// (default) on hardware adapters, so a decode row's sample spreads over many
    /// workgroups, and not on software ones, which pay per workgroup (the whole row's
    /// sample by one); `Some(true)` always, `Some(false)` never. Results are the same
    /// bits either way. `DECODA_WGPU_SAMPLE_PIECES=0` or `=1` overrides `None` (a
    /// hardware adapter's probe on lavapipe, for a stress run).
    pub sample_pieces: Option<bool>,
}

/// Environment variable: a substring of the adapter name to use (`llvmpipe`, `H100`, ...).
pub const ADAPTER_ENV: &str = "DECODA_WGPU_ADAPTER";
/// Environment variable: `0` or `1` turns subgroup operations off or on where
/// [`WgpuOptions::subgroups`] is `None`.
pub const SUBGROUPS_ENV: &str = "DECODA_WGPU_SUBGROUPS";

/// Environment variable: `0` or `1` turns the one-dispatch `settle_finish` off or on
/// where [`WgpuOptions::fused_settle`] is `None`.
pub const FUSED_ENV: &str = "DECODA_WGPU_FUSED";

/// Environment variable: `0` or `1` turns the probe's sample in pieces off or on where
/// [`WgpuOptions::sample_pieces`] is `None`.
pub const SAMPLE_PIECES_ENV: &str = "DECODA_WGPU_SAMPLE_PIECES";

/// Environment variable: how many workgroups a step aims to keep busy (rows times
/// splits); the row split follows from it and the batch.
pub const WORKGROUPS_ENV: &str = "DECODA_WGPU_WORKGROUPS";
