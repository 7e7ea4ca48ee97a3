//! The sampler's WGSL: the step passes of `step/`, the arithmetic shared with the CPU and
//! the two ways of reducing, put together for a device.

/// The WGSL of the sampler's kernels, without the shared arithmetic and the reductions:
/// the files of `step/`, one per pass, in the order they are concatenated (`common`
/// holds the layout, the bindings and the helpers every pass uses; `keys.wgsl` the order
/// keys it shares with `shard.wgsl`).
pub const SHADER_MAIN: &str = concat!(
    include_str!("step/common.wgsl"),
    include_str!("keys.wgsl"),
    include_str!("step/scatter.wgsl"),
    include_str!("step/dry.wgsl"),
    include_str!("step/probe.wgsl"),
    include_str!("step/scan.wgsl"),
    include_str!("step/settle_list.wgsl"),
    include_str!("step/settle.wgsl"),
    include_str!("step/walk.wgsl"),
    include_str!("step/sigma.wgsl"),
    include_str!("step/typical.wgsl"),
    include_str!("step/lp.wgsl"),
    include_str!("step/kept.wgsl"),
    include_str!("step/finish.wgsl"),
    include_str!("step/draw_many.wgsl"),
);
/// The arithmetic that decides tokens (ln, exp, correctly rounded division, Philox),
/// shared with the CPU ([`crate::fmath`], [`crate::philox`]), with Philox's products
/// built from 16-bit ones (any adapter).
pub const SHADER_FMATH: &str = concat!(include_str!("fmath.wgsl"), include_str!("mulhi32.wgsl"));
/// The same with Philox's products in 64-bit integers (adapters with `SHADER_INT64`):
/// the same bits in fewer operations.
pub const SHADER_FMATH_INT64: &str =
    concat!(include_str!("fmath.wgsl"), include_str!("mulhi64.wgsl"));
/// An IEEE half's bits as f32 (`f16_of`), for every module that reads 16-bit weights.
pub const SHADER_HALF: &str = include_str!("half.wgsl");

/// The weight formats the matrix products and the MoE layer are compiled for, one module
/// each: (name, `DTYPE`, `BITS`, `GROUP`).
pub const WEIGHT_FORMATS: [(&str, u32, u32, u32); 9] = [
    ("f32", 0, 0, 0),
    ("bf16", 1, 0, 0),
    ("f16", 2, 0, 0),
    ("q4g32", 3, 4, 32),
    ("q4g64", 3, 4, 64),
    ("q4g128", 3, 4, 128),
    ("q8g32", 3, 8, 32),
    ("q8g64", 3, 8, 64),
    ("q8g128", 3, 8, 128),
];

/// The weight-format prefix of the matrix products' and the MoE layer's modules: `DTYPE`,
/// `BITS` and the affine group `GROUP` as constants (one module per format: no format
/// branch and no division by a run-time group size in the inner loop), the half
/// conversion and one chunk's arithmetic (`chunk.wgsl`), shared by both. `bits` and
/// `group` matter for affine formats (`dtype` 3) only.
pub fn weight_format_source(dtype: u32, bits: u32, group: u32) -> String {
    // (a format without codes divides by no zero in its unused affine branch)
    let (bits, group) = if dtype == 3 {
        (bits, group.max(1))
    } else {
        (16, 1)
    };
    format!(
        "const DTYPE: u32 = {dtype}u;\nconst BITS: u32 = {bits}u;\nconst GROUP: u32 = {group}u;\n\
         {SHADER_HALF}\n{}\n",
        include_str!("chunk.wgsl")
    )
}

/// The tiled products for many call rows (`tile.wgsl`): the model's prefill products and
/// the MoE layer's sorted calls, in the matrix-vector kernels' summation order.
pub(crate) const SHADER_TILE: &str = include_str!("tile.wgsl");

/// Workgroup reductions through workgroup memory (the portable path).
pub const REDUCE_WG: &str = include_str!("reduce_wg.wgsl");
/// Workgroup reductions with subgroup operations (device feature `SUBGROUP`).
pub const REDUCE_SG: &str = include_str!("reduce_sg.wgsl");

/// The complete WGSL module: with `subgroups`, the reductions use subgroup operations
/// (every row kernel takes its subgroup builtins through the `Lanes` struct that
/// `reduce_sg.wgsl` declares); without, workgroup memory (`reduce_wg.wgsl` declares a
/// `Lanes` with the invocation index only). Both are validated and translated for every
/// platform by the `shaders` test.
pub fn shader_source(subgroups: bool) -> String {
    shader_source_with(subgroups, false)
}

/// [`shader_source`], with Philox's products in 64-bit integers when `int64` (devices
/// with `Features::SHADER_INT64`; [`SHADER_FMATH_INT64`]).
pub fn shader_source_with(subgroups: bool, int64: bool) -> String {
    // (naga, which wgpu compiles WGSL with, enables subgroup operations through the
    // device's SUBGROUP feature and rejects the `enable subgroups;` directive)
    let reduce = if subgroups { REDUCE_SG } else { REDUCE_WG };
    let fmath = if int64 {
        SHADER_FMATH_INT64
    } else {
        SHADER_FMATH
    };
    format!("{SHADER_MAIN}\n{fmath}\n{reduce}")
}

/// How the matrix products number their invocations and sum a team's partial sums:
/// `team_sg.wgsl` (subgroup operations) or `team_wg.wgsl` (a workgroup-memory tree),
/// the same bits.
pub(crate) fn team_source(subgroups: bool) -> &'static str {
    if subgroups {
        include_str!("team_sg.wgsl")
    } else {
        include_str!("team_wg.wgsl")
    }
}
