//! What a workgroup and a workgroup barrier cost on this machine's wgpu adapter: the
//! wall time of dispatches of 256-invocation workgroups with no barrier, 9 and 33 (one
//! and four tree sums of 256 values), and of 64-invocation ones with none and 7 (one
//! tree sum), over 1 to 4,096 workgroups. On a GPU both are small; on a CPU adapter
//! (Mesa's lavapipe) a barrier switches between every group of SIMD lanes of the
//! workgroup, which is what a kernel with many barriers per workgroup pays there
//! (docs/TESTING.md).
//!
//! ```sh
//! cargo run --release --features wgpu --example barrier_cost
//! ```

use decoda::wgpu::WgpuDevice;

#[path = "common/dispatch.rs"]
mod dispatch;

/// (name, barriers per workgroup, WGSL). Every kernel writes one value
/// per invocation; the barrier kernels sum workgroup memory by a tree, `rounds` times.
fn kernels() -> Vec<(&'static str, u32, String)> {
    let tree = |size: u32, rounds: u32| {
        format!(
            "var<workgroup> s: array<f32, {size}>;
@group(0) @binding(0) var<storage, read_write> o: array<f32>;
@compute @workgroup_size({size})
fn main(@builtin(local_invocation_index) l: u32, @builtin(workgroup_id) w: vec3<u32>) {{
    s[l] = f32(l);
    for (var r = 0u; r < {rounds}u; r++) {{
        for (var k = {half}u; k > 0u; k = k >> 1u) {{
            workgroupBarrier();
            if (l < k) {{ s[l] = s[l] + s[l + k]; }}
        }}
    }}
    workgroupBarrier();
    o[w.x * 256u + l] = s[0];
}}",
            half = size / 2
        )
    };
    let plain = "@group(0) @binding(0) var<storage, read_write> o: array<f32>;
@compute @workgroup_size(256)
fn main(@builtin(local_invocation_index) l: u32, @builtin(workgroup_id) w: vec3<u32>) {
    o[w.x * 256u + l] = f32(l);
}"
    .to_string();
    let plain64 = plain.replace("workgroup_size(256)", "workgroup_size(64)");
    vec![
        ("256 invocations", 0, plain),
        ("256 invocations, a tree sum", 9, tree(256, 1)),
        ("256 invocations, 4 tree sums", 33, tree(256, 4)),
        ("64 invocations", 0, plain64),
        ("64 invocations, a tree sum", 7, tree(64, 1)),
    ]
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let ctx = WgpuDevice::new()?;
    let out = dispatch::storage(&ctx, 4 << 20);
    println!(
        "{}: wall µs per dispatch (µs per workgroup), the best of 3 runs of 20 dispatches",
        ctx.adapter_name()
    );
    println!(
        "{:32} {:>8} {:>20} {:>20} {:>20} {:>20}",
        "kernel", "barriers", "1 wg", "64 wg", "512 wg", "4096 wg"
    );
    for (name, barriers, src) in kernels() {
        let kernel = dispatch::Kernel::new(&ctx, name, src, &[&out]);
        let mut cells = Vec::new();
        for groups in [1u32, 64, 512, 4096] {
            let us = kernel.seconds(&ctx, groups, 20)? * 1e6;
            cells.push(format!("{us:.1} ({:.2})", us / f64::from(groups)));
        }
        println!(
            "{name:32} {barriers:>8} {:>20} {:>20} {:>20} {:>20}",
            cells[0], cells[1], cells[2], cells[3]
        );
    }
    Ok(())
}
