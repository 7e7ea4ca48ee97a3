// One dispatch's parameters, shared by model.wgsl and mv.wgsl (`ModelOp` in
// model/mod.rs; the layout is checked by a test).

struct Op {
    rows: u32,       // rows of the call this op runs over
    kind: u32,       // linear: 0 store, 1 add, 2 swiglu, 3 q/k/v (dst, k_out, v_out); norm_rope: norms
    in_w: u32,       // input width (linear), group width (rms)
    out_w: u32,      // output rows of the matrix (linear; swiglu: I)
    dtype: u32,      // 0 f32, 1 bf16, 2 f16, 3 affine
    bits: u32,
    group: u32,      // (the products take the module's GROUP)
    row_words: u32,  // words per matrix row
    w_off: u32,      // word offsets in wts: codes or values, scales, biases
    s_off: u32,
    b_off: u32,
    aux_off: u32,    // word offset in aux: norm weight, rope table
    src_w: u32,      // floats between src rows
    dst_w: u32,      // floats between dst rows
    src_row0: u32,   // first src row read
    dst_row0: u32,   // first dst row written
    groups: u32,     // rms: groups per row
    eps: f32,        // rms: epsilon; attend: scale
    heads: u32,
    kv_heads: u32,
    head_dim: u32,
    max_pos: u32,    // positions per slot in the cache and the rope table
    map_off: u32,    // word offset of the row map in ctl (4 words per row)
    inplace: u32,    // rms: read dst instead of src
    zero: u32,       // always 0 (fp)
    out_off: u32,    // linear: first dst column of this part's rows; embed: first token
    scale: f32,      // attend: the score scale (eps stays the norms' epsilon)
    pad2: u32,
}

