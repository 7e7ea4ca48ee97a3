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

// (never called here: every level is the tree's)
fn butterfly(v: f32, top: u32) -> f32 {
    return v;
}
