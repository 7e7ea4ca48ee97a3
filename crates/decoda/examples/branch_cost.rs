//! What a block of code a workgroup does not need costs on this machine's wgpu adapter:
//! the wall time per workgroup of one 256-invocation kernel with a block of 800
//! arithmetic operations per invocation placed six ways: absent, run, under a
//! workgroup-uniform false condition read from a buffer, in a loop of zero iterations,
//! after an early `return` every invocation takes, and under a false pipeline-overridable
//! constant. On a GPU a uniform branch skips the block; Mesa's lavapipe runs both sides
//! of every branch with the lanes masked, so only a constant the compiler sees removes
//! the block's cost (docs/TESTING.md).
//!
//! ```sh
//! cargo run --release --features wgpu --example branch_cost
//! ```

use decoda::wgpu::WgpuDevice;

#[path = "common/dispatch.rs"]
mod dispatch;

/// The block: 400 dependent pairs of operations on `x`, different per invocation.
fn block() -> String {
    (0..400)
        .map(|i| {
            format!("        x = fma(x, 1.0001, f32({i}u ^ l) * 0.5); x = x - floor(x * 0.001);\n")
        })
        .collect()
}

/// (name, WGSL): every kernel reads the flag (0), syncs once before and once after the
/// block, and writes one value per invocation.
fn kernels() -> Vec<(&'static str, String)> {
    let b = block();
    let head = "@group(0) @binding(0) var<storage, read_write> o: array<f32>;
@group(0) @binding(1) var<storage, read> flag: array<u32>;
var<workgroup> s: array<f32, 256>;
@compute @workgroup_size(256)
fn main(@builtin(local_invocation_index) l: u32, @builtin(workgroup_id) w: vec3<u32>) {
    var x = f32(l);
    s[l] = x;
    workgroupBarrier();
    let f = flag[0];
";
    let tail = "    workgroupBarrier();
    o[w.x * 256u + l] = x + s[(l + 1u) % 256u];
}";
    vec![
        ("no block", format!("{head}{tail}")),
        ("the block run", format!("{head}    if (f == 0u) {{\n{b}    }}\n{tail}")),
        (
            "uniform false condition",
            format!("{head}    if (f != 0u) {{\n{b}    }}\n{tail}"),
        ),
        (
            "loop of zero iterations",
            format!("{head}    for (var i = 0u; i < f; i++) {{\n{b}    }}\n{tail}"),
        ),
        (
            "early return before it",
            format!(
                "{head}    if (f == 0u) {{ workgroupBarrier(); o[w.x * 256u + l] = x; return; }}\n{b}{tail}"
            ),
        ),
        (
            "false override constant",
            format!("override ON: u32 = 0u;\n{head}    if (ON != 0u) {{\n{b}    }}\n{tail}"),
        ),
    ]
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let ctx = WgpuDevice::new()?;
    // (a new storage buffer reads as zeros: the flag is 0)
    let (out, flag) = (
        dispatch::storage(&ctx, 4 << 20),
        dispatch::storage(&ctx, 16),
    );
    let groups = 512u32;
    println!(
        "{}: wall µs per workgroup over {groups} workgroups, the best of 3 runs of 10 dispatches",
        ctx.adapter_name()
    );
    for (name, src) in kernels() {
        let kernel = dispatch::Kernel::new(&ctx, name, src, &[&out, &flag]);
        let us = kernel.seconds(&ctx, groups, 10)? / f64::from(groups) * 1e6;
        println!("{name:28} {us:8.2}");
    }
    Ok(())
}
