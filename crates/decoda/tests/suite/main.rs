//! The library's integration tests, in one test binary.
//!
//! One binary, not a binary per file: the tests share one process, so the device tests
//! share its devices (`decoda::testing::gpu`: one per harness thread) whose pipelines
//! are built once, not once per binary, and the harness keeps its test threads busy
//! across every file instead of waiting at the end of each binary for its longest test.
//! Each file is a module; `cargo test --release --test suite wgpu_head::` runs one of
//! them (a filter matches any part of a name: `shard::` runs `wgpu_shard::` too).
//! proptest keeps a file's failure seeds in `tests/proptest-regressions/FILE.txt`.

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

/// Runs tests of this binary again, in a child process for each of the CPU kernels'
/// instruction sets below the one in use (`DECODA_ISA`), and fails unless each child's
/// tests pass and at least one ran. `module` is the caller's `module_path!()`; `tests`
/// are test names inside it, run `--exact`, or none for every test of the module (the
/// binary holds every file's tests: a child runs its caller's only).
fn run_on_lower_isas(module: &str, tests: &[&str]) {
    let lower: &[&str] = match decoda::cpu::kernels::isa() {
        "avx512" => &["avx2", "baseline"],
        "avx2" => &["baseline"],
        _ => &[],
    };
    // the module's path inside this crate: the prefix of its tests' names
    let prefix = format!("{}::", module.split_once("::").map_or(module, |(_, m)| m));
    let args: Vec<String> = if tests.is_empty() {
        vec![prefix]
    } else {
        let names = tests.iter().map(|t| format!("{prefix}{t}"));
        names.chain(["--exact".to_string()]).collect()
    };
    for want in lower {
        let out = std::process::Command::new(std::env::current_exe().expect("test binary"))
            .env("DECODA_ISA", want)
            .args(&args)
            .output()
            .expect("run the tests again");
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(out.status.success(), "DECODA_ISA={want}:\n{text}");
        assert!(
            text.contains("test result: ok") && !text.contains(" 0 passed"),
            "DECODA_ISA={want}:\n{text}"
        );
    }
}
