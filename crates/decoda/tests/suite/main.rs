//! The library's integration tests, in one test binary.
//!
//! One binary, not a binary per file: the tests share one process, so the device tests
//! share one device (`decoda::testing::gpu`) whose pipelines are built once, not once
//! per binary, and the harness keeps its test threads busy across every file instead
//! of waiting at the end of each binary for its longest test. Each file is a module;
//! `cargo test --release --test suite wgpu_head::` runs one of them (a filter matches
//! any part of a name: `shard::` runs `wgpu_shard::` too). proptest keeps a file's
//! failure seeds in `tests/proptest-regressions/FILE.txt`.

// the CPU's samplers, head, MoE layer, model and shards against the reference (and,
// in `model` and `moe_suite`, the device's layer and model with the `wgpu` feature)
mod batch_threads;
mod conformance_cpu;
mod decode_shapes;
mod fast_vs_reference;
mod later_stages;
mod llama_cpp_goldens;
mod model;
mod model_fuzz;
mod moe;
mod moe_suite;
mod shard;
mod shard_util;

// the device backend (the `wgpu` feature)
#[cfg(feature = "wgpu")]
mod shaders;
#[cfg(feature = "wgpu")]
mod wgpu_dry;
#[cfg(feature = "wgpu")]
mod wgpu_fmath;
#[cfg(feature = "wgpu")]
mod wgpu_head;
#[cfg(feature = "wgpu")]
mod wgpu_later_stages;
#[cfg(feature = "wgpu")]
mod wgpu_proptest;
#[cfg(feature = "wgpu")]
mod wgpu_sampler;
#[cfg(feature = "wgpu")]
mod wgpu_shapes;
#[cfg(feature = "wgpu")]
mod wgpu_shard;

/// The harness's filter for the tests of the module `path` names (its `module_path!()`):
/// the path inside this crate, then `::`. For the tests that run this binary again in a
/// child process with other settings, which must run their own module's tests only.
fn tests_of(path: &str) -> String {
    let inner = path.split_once("::").map_or(path, |(_, rest)| rest);
    format!("{inner}::")
}
