// Workgroup reductions through workgroup memory (two levels of 16): the portable path,
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

// Each reduction takes two barriers: every invocation leaves its value in workgroup
// memory; after the first barrier, 16 invocations reduce 16 values each into `rqa`/`rqb`
// (step/common.wgsl);
// after the second, every invocation combines the 16 partials. No barrier follows: the
// next reduction writes the partials only after its own first barrier, which every
// invocation reaches after reading these. (A tree of fan-in four took six barriers;
// lavapipe pays for each one by switching between every group of invocations, and its
// LLVM compile time grows with them: each is a suspension point of the shader's
// coroutine.) Sums are exact integers and maxima order-free, so the result is any
// tree's, and reduce_sg.wgsl's.

// (key, index) with the larger key, the smaller index on a tie
fn argmax_pair(a: vec2<u32>, k: u32, i: u32) -> vec2<u32> {
    if (k > a.x || (k == a.x && i < a.y)) {
        return vec2<u32>(k, i);
    }
    return a;
}

fn wg_argmax(lid: u32, key: u32, idx: u32) -> vec2<u32> {
    ra[lid] = key;
    rb[lid] = idx;
    workgroupBarrier();
    if (lid < 16u) {
        let base = lid * 16u;
        var b = vec2<u32>(ra[base], rb[base]);
        for (var q = 1u; q < 16u + opaque_zero(); q = q + 1u) {
            b = argmax_pair(b, ra[base + q], rb[base + q]);
        }
        rqa[lid] = b.x;
        rqb[lid] = b.y;
    }
    workgroupBarrier();
    var r = vec2<u32>(rqa[0], rqb[0]);
    for (var q = 1u; q < 16u + opaque_zero(); q = q + 1u) {
        r = argmax_pair(r, rqa[q], rqb[q]);
    }
    return r;
}

// x: sum (u32), y: max (u32)
fn wg_sum_max(lid: u32, s: u32, m: u32) -> vec2<u32> {
    ra[lid] = s;
    rb[lid] = m;
    workgroupBarrier();
    if (lid < 16u) {
        let base = lid * 16u;
        var ts = ra[base];
        var tm = rb[base];
        for (var q = 1u; q < 16u + opaque_zero(); q = q + 1u) {
            ts = ts + ra[base + q];
            tm = max(tm, rb[base + q]);
        }
        rqa[lid] = ts;
        rqb[lid] = tm;
    }
    workgroupBarrier();
    var ts = rqa[0];
    var tm = rqb[0];
    for (var q = 1u; q < 16u + opaque_zero(); q = q + 1u) {
        ts = ts + rqa[q];
        tm = max(tm, rqb[q]);
    }
    return vec2<u32>(ts, tm);
}

fn wg_sum_u32(lid: u32, v: u32) -> u32 {
    return wg_sum_max(lid, v, 0u).x;
}

fn wg_sum64(lid: u32, v: vec2<u32>) -> vec2<u32> {
    wg_group_sums64(lid, v);
    var t = vec2<u32>(rqa[0], rqb[0]);
    for (var q = 1u; q < 16u + opaque_zero(); q = q + 1u) {
        t = add64(t, vec2<u32>(rqa[q], rqb[q]));
    }
    return t;
}

// The 96-bit sum (mod 2^96) in one pass: two barriers, where two 64-bit sums take four.
fn wg_sum96(lid: u32, v: vec3<u32>) -> vec3<u32> {
    ra[lid] = v.x;
    rb[lid] = v.y;
    rc[lid] = v.z;
    workgroupBarrier();
    if (lid < 16u) {
        let base = lid * 16u;
        var t = vec3<u32>(ra[base], rb[base], rc[base]);
        for (var q = 1u; q < 16u + opaque_zero(); q = q + 1u) {
            t = add96(t, vec3<u32>(ra[base + q], rb[base + q], rc[base + q]));
        }
        rqa[lid] = t.x;
        rqb[lid] = t.y;
        rqc[lid] = t.z;
    }
    workgroupBarrier();
    var t = vec3<u32>(rqa[0], rqb[0], rqc[0]);
    for (var q = 1u; q < 16u + opaque_zero(); q = q + 1u) {
        t = add96(t, vec3<u32>(rqa[q], rqb[q], rqc[q]));
    }
    return t;
}
