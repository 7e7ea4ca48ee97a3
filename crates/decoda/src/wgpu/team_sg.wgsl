// team_wg.wgsl with subgroup operations, the same bits. A team's sum is a tree: at level
// s (32, 16, .., 1) lane l < s adds lane l + s. The levels at or above the subgroup size
// still go through workgroup memory; the levels below are a butterfly in registers,
// where lane l adds lane l ^ s: for l < s that is the tree's own sum, in the same order,
// and a lane past s computes its partner's sum with the operands swapped, the same
// value; so lane 0 ends with the tree's result. Invocations are numbered subgroup by
// subgroup (subgroup id times size plus the lane), so lane l ^ s is in l's subgroup.

var<private> sg_size: u32;

struct Lanes {
    @builtin(subgroup_invocation_id) sg_lane: u32,
    @builtin(subgroup_size) size: u32,
    @builtin(subgroup_id) sg_id: u32,
}

fn lane_id(l: Lanes) -> u32 {
    sg_size = l.size;
    return l.sg_id * l.size + l.sg_lane;
}

fn tree_floor() -> u32 {
    return sg_size;
}

// (team_wg.wgsl's: the levels run between barriers and as the butterfly here)
fn serial_tree() -> bool {
    return false;
}

// The tree's levels top, top / 2, .., 1 of this lane's value, as the butterfly.
fn butterfly(v: f32, top: u32) -> f32 {
    var x = v;
    for (var s = top; s > 0u; s = s >> 1u) {
        x = x + subgroupShuffleXor(x, s);
    }
    return x;
}
