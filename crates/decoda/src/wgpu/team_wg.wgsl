// How the matrix products (model/mv.wgsl, moe.wgsl) number their invocations and sum a
// team's 64 partial sums: here by a fixed tree in workgroup memory, every level (the
// portable path). team_sg.wgsl runs the lowest levels as subgroup operations, with the
// same bits. Appended by the launcher.

struct Lanes {
    @builtin(local_invocation_index) lid: u32,
}

// The invocation's index, as the products assign work by it.
fn lane_id(l: Lanes) -> u32 {
    return l.lid;
}

// The team sums' levels below this one run as a butterfly in registers: none here.
fn tree_floor() -> u32 {
    return 0u;
}

// Whether one invocation per value runs a team tree's levels in order, in workgroup
// memory, after one barrier (the same adds on the same operands, so the same bits),
// instead of the other invocations taking a level each between barriers: yes here. A
// software adapter (lavapipe) pays about 1.7 µs a workgroup barrier and runs a
// workgroup's invocations 8 at a time, so the tree's 6 barriers cost more than its
// 63 adds in series; a GPU without subgroups runs this path too, at 63 dependent
// workgroup-memory adds a value (a few hundred cycles, once a product).
fn serial_tree() -> bool {
    return true;
}

// (never called here: every level is the tree's)
fn butterfly(v: f32, top: u32) -> f32 {
    return v;
}
