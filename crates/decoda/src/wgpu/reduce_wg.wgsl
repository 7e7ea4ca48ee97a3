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

// Each reduction is a tree of fan-in four: a barrier a level, six for 256 invocations
// (a binary tree takes ten, and lavapipe pays for each barrier by switching between
// every group of invocations). Sums are exact integers and maxima order-free, so the
// result is any tree's, and reduce_sg.wgsl's.

fn wg_argmax(lid: u32, key: u32, idx: u32) -> vec2<u32> {
    ra[lid] = key;
    rb[lid] = idx;
    workgroupBarrier();
    for (var s = 64u; s > 0u; s = s >> 2u) {
        if (lid < s) {
            var bk = ra[lid];
            var bi = rb[lid];
            for (var q = 1u; q < 4u; q = q + 1u) {
                let ok = ra[lid + q * s];
                let oi = rb[lid + q * s];
                if (ok > bk || (ok == bk && oi < bi)) {
                    bk = ok;
                    bi = oi;
                }
            }
            ra[lid] = bk;
            rb[lid] = bi;
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
    for (var k = 64u; k > 0u; k = k >> 2u) {
        if (lid < k) {
            ra[lid] = ra[lid] + ra[lid + k] + ra[lid + 2u * k] + ra[lid + 3u * k];
            rb[lid] = max(max(rb[lid], rb[lid + k]), max(rb[lid + 2u * k], rb[lid + 3u * k]));
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
    for (var k = 64u; k > 0u; k = k >> 2u) {
        if (lid < k) {
            var t = vec2<u32>(ra[lid], rb[lid]);
            t = add64(t, vec2<u32>(ra[lid + k], rb[lid + k]));
            t = add64(t, vec2<u32>(ra[lid + 2u * k], rb[lid + 2u * k]));
            t = add64(t, vec2<u32>(ra[lid + 3u * k], rb[lid + 3u * k]));
            ra[lid] = t.x;
            rb[lid] = t.y;
        }
        workgroupBarrier();
    }
    let r = vec2<u32>(ra[0], rb[0]);
    workgroupBarrier();
    return r;
}
