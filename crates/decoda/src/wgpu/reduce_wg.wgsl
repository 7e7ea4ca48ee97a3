// Workgroup reductions through workgroup memory (tree reductions): the portable path,
// used when the adapter has no subgroup operations (or they are turned off). The same
// functions with subgroup operations are in reduce_sg.wgsl. Call from uniform control
// flow; every invocation gets the result.

// The builtins an entry point of the row kernels takes (reduce_sg.wgsl adds the
// subgroup ones), and what it does with them first.
struct Lanes {
    @builtin(local_invocation_index) lid: u32,
}

fn lanes_init(l: Lanes) {
}

fn wg_argmax(lid: u32, key: u32, idx: u32) -> vec2<u32> {
    ra[lid] = key;
    rb[lid] = idx;
    workgroupBarrier();
    for (var s = 128u; s > 0u; s = s >> 1u) {
        if (lid < s) {
            let ok = ra[lid + s];
            let oi = rb[lid + s];
            if (ok > ra[lid] || (ok == ra[lid] && oi < rb[lid])) {
                ra[lid] = ok;
                rb[lid] = oi;
            }
        }
        workgroupBarrier();
    }
    let r = vec2<u32>(ra[0], rb[0]);
    workgroupBarrier();
    return r;
}

// x: sum (u32), y: max (u32)
fn wg_sum_max(lid: u32, s: u32, m: u32) -> vec2<u32> {
    ra[lid] = s;
    rb[lid] = m;
    workgroupBarrier();
    for (var k = 128u; k > 0u; k = k >> 1u) {
        if (lid < k) {
            ra[lid] = ra[lid] + ra[lid + k];
            rb[lid] = max(rb[lid], rb[lid + k]);
        }
        workgroupBarrier();
    }
    let r = vec2<u32>(ra[0], rb[0]);
    workgroupBarrier();
    return r;
}

fn wg_sum_u32(lid: u32, v: u32) -> u32 {
    return wg_sum_max(lid, v, 0u).x;
}

fn wg_sum64(lid: u32, v: vec2<u32>) -> vec2<u32> {
    ra[lid] = v.x;
    rb[lid] = v.y;
    workgroupBarrier();
    for (var k = 128u; k > 0u; k = k >> 1u) {
        if (lid < k) {
            let r = add64(vec2<u32>(ra[lid], rb[lid]), vec2<u32>(ra[lid + k], rb[lid + k]));
            ra[lid] = r.x;
            rb[lid] = r.y;
        }
        workgroupBarrier();
    }
    let r = vec2<u32>(ra[0], rb[0]);
    workgroupBarrier();
    return r;
}
