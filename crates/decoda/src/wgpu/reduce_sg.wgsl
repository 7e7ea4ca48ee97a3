// Workgroup reductions with subgroup operations: each subgroup reduces in registers,
// its first invocation leaves the partial in workgroup memory, and every invocation
// combines the few partials. The same functions without subgroups are in
// reduce_wg.wgsl; both give identical results (integer keys and exact integer sums).
// Call from uniform control flow. Every entry point takes a `Lanes` and calls
// lanes_init with it first.

var<private> sg_lane: u32;
var<private> sg_index: u32;
var<private> sg_count: u32;

struct Lanes {
    @builtin(local_invocation_index) lid: u32,
    @builtin(subgroup_invocation_id) sg_lane: u32,
    @builtin(subgroup_id) sg_index: u32,
    @builtin(num_subgroups) sg_count: u32,
}

fn lanes_init(l: Lanes) {
    sg_lane = l.sg_lane;
    sg_index = l.sg_index;
    sg_count = l.sg_count;
}

fn wg_argmax(lid: u32, key: u32, idx: u32) -> vec2<u32> {
    let m = subgroupMax(key);
    var cand = 0xffffffffu;
    if (key == m) {
        cand = idx;
    }
    let i = subgroupMin(cand);
    if (sg_lane == 0u) {
        ra[sg_index] = m;
        rb[sg_index] = i;
    }
    workgroupBarrier();
    var bk = ra[0];
    var bi = rb[0];
    for (var s = 1u; s < sg_count; s = s + 1u) {
        let k = ra[s];
        let j = rb[s];
        if (k > bk || (k == bk && j < bi)) {
            bk = k;
            bi = j;
        }
    }
    workgroupBarrier();
    return vec2<u32>(bk, bi);
}

// x: sum, y: max
fn wg_sum_max(lid: u32, s: u32, m: u32) -> vec2<u32> {
    let a = subgroupAdd(s);
    let b = subgroupMax(m);
    if (sg_lane == 0u) {
        ra[sg_index] = a;
        rb[sg_index] = b;
    }
    workgroupBarrier();
    var ts = ra[0];
    var tm = rb[0];
    for (var k = 1u; k < sg_count; k = k + 1u) {
        ts = ts + ra[k];
        tm = max(tm, rb[k]);
    }
    workgroupBarrier();
    return vec2<u32>(ts, tm);
}

fn wg_sum_u32(lid: u32, v: u32) -> u32 {
    return wg_sum_max(lid, v, 0u).x;
}

// 64-bit sum in 16-bit limbs (no limb sum can overflow a u32 within a subgroup).
fn wg_sum64(lid: u32, v: vec2<u32>) -> vec2<u32> {
    let l0 = subgroupAdd(v.x & 0xffffu);
    let l1 = subgroupAdd(v.x >> 16u);
    let h = subgroupAdd(v.y);
    let part = add64(vec2<u32>(l0, h), vec2<u32>(l1 << 16u, l1 >> 16u));
    if (sg_lane == 0u) {
        ra[sg_index] = part.x;
        rb[sg_index] = part.y;
    }
    workgroupBarrier();
    var t = vec2<u32>(ra[0], rb[0]);
    for (var k = 1u; k < sg_count; k = k + 1u) {
        t = add64(t, vec2<u32>(ra[k], rb[k]));
    }
    workgroupBarrier();
    return t;
}

// The 96-bit sum (mod 2^96) in one pass, in 16-bit limbs below the top word (no limb sum
// can overflow a u32 within a subgroup; the top word's wraps mod 2^32, as the sum's
// does): two barriers, where two 64-bit sums take four.
fn wg_sum96(lid: u32, v: vec3<u32>) -> vec3<u32> {
    let x0 = subgroupAdd(v.x & 0xffffu);
    let x1 = subgroupAdd(v.x >> 16u);
    let y0 = subgroupAdd(v.y & 0xffffu);
    let y1 = subgroupAdd(v.y >> 16u);
    let z = subgroupAdd(v.z);
    let lo = add96(vec3<u32>(x0, 0u, 0u), vec3<u32>(x1 << 16u, x1 >> 16u, 0u));
    let hi = add96(vec3<u32>(0u, y0, 0u), vec3<u32>(0u, y1 << 16u, (y1 >> 16u) + z));
    let part = add96(lo, hi);
    if (sg_lane == 0u) {
        ra[sg_index] = part.x;
        rb[sg_index] = part.y;
        rc[sg_index] = part.z;
    }
    workgroupBarrier();
    var t = vec3<u32>(ra[0], rb[0], rc[0]);
    for (var k = 1u; k < sg_count; k = k + 1u) {
        t = add96(t, vec3<u32>(ra[k], rb[k], rc[k]));
    }
    workgroupBarrier();
    return t;
}
