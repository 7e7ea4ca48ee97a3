// The bandwidth probe of `copy_bandwidth` (bench.rs): b = a, as vec4<u32>s, by compute
// invocations (a GPU's copy command can run on a copy engine far below the memory's
// rate: 840 GB/s on an H200 whose kernels copy at 4,200). Workgroup w copies vec4s
// 1024 w .. 1024 w + 1023, each invocation four of them 256 apart (coalesced), all four
// loads issued before any store.

@group(0) @binding(0) var<storage, read> a: array<vec4<u32>>;
@group(0) @binding(1) var<storage, read_write> b: array<vec4<u32>>;

@compute @workgroup_size(256)
fn copy4(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
         @builtin(local_invocation_index) lid: u32) {
    let i = (wid.x + wid.y * nwg.x) * 1024u + lid;
    let n = arrayLength(&a);
    if (i + 768u < n) {
        let v0 = a[i];
        let v1 = a[i + 256u];
        let v2 = a[i + 512u];
        let v3 = a[i + 768u];
        b[i] = v0;
        b[i + 256u] = v1;
        b[i + 512u] = v2;
        b[i + 768u] = v3;
    }
}
