// The products for many call rows at once (prefill, the MoE layer's sorted calls): a
// workgroup of 256 invocations computes a tile of 8 weight rows x 32 call rows, in the
// matrix-vector kernels' order, so every output has one summation order whichever
// kernel computes it (issue 55, item 7).
//
// The matrix-vector order: lane l (of 64) sums chunk_dot over the chunks c = l, l + 64,
// .. of the row, in chunk order, and a tree adds the 64 lane sums (level s = 32, 16,
// .., 1: lane l < s adds lane l + s). Here invocation (call row r, group g of 8) holds
// the lane sums of lanes g, g + 8, .., g + 56 for the 8 weight rows (64 values): it
// streams chunks g, g + 8, g + 16, .. (each weight chunk loaded once for its 8 rows'
// outputs, each input chunk once for the 8 weight rows), takes the tree's levels 32,
// 16 and 8 in registers (they pair lanes of one invocation), and levels 4, 2 and 1 across
// the 8 invocations of the call row as reduce_red8's levels (workgroup memory, or a
// subgroup butterfly: the same bits). The 32 call rows' invocations read the same weight
// chunks, so a tile reads its weights once from memory (the rest from the cache).
//
// The including module defines `xin` (chunk.wgsl), `wvec(i) -> vec4<u32>` (vec4 i of
// its weights), `wword(i) -> u32` (word i) and `wgroup() -> u32` (the affine group).

const TEAM_LANES: u32 = 64u;

// Partial sums: [invocation][8 values]
var<workgroup> red: array<f32, 2048>;
// A tile's results: [weight row o][call row r] at o * 32 + r
var<workgroup> tile_out: array<f32, 256>;

// Sums each team's 64 partial sums (8 values an invocation, red[lid * 8 + j]) into its
// lane 0: the tree's levels in workgroup memory down to `tree_floor`, the rest as a
// butterfly in registers (team_wg.wgsl or team_sg.wgsl: the same bits).
fn reduce_red8(lane: u32, lid: u32) {
    reduce_red8_from(TEAM_LANES / 2u, lane, lid);
}

// reduce_red8's levels top, top / 2, .., 1 (teams of 2 top invocations).
fn reduce_red8_from(top: u32, lane: u32, lid: u32) {
    workgroupBarrier();
    var s = top;
    for (; s > 0u && s >= tree_floor(); s = s >> 1u) {
        if (lane < s) {
            for (var j = 0u; j < 8u; j = j + 1u) {
                red[lid * 8u + j] = red[lid * 8u + j] + red[(lid + s) * 8u + j];
            }
        }
        workgroupBarrier();
    }
    if (s > 0u) {
        var v: array<f32, 8>;
        for (var j = 0u; j < 8u; j = j + 1u) {
            v[j] = butterfly(red[lid * 8u + j], s);
        }
        workgroupBarrier();
        if (lane == 0u) {
            for (var j = 0u; j < 8u; j = j + 1u) {
                red[lid * 8u + j] = v[j];
            }
        }
        workgroupBarrier();
    }
}

// A weight row: its first vec4, and the words of its first group's scale and bias
// (affine formats).
struct WRow {
    wb: u32,
    sb: u32,
    bb: u32,
}

// Row `r` of a matrix at word `w` (scales at `s`, biases at `b`) of `rw` words a row and
// `gpr` groups a row.
fn wrow(w: u32, s: u32, b: u32, r: u32, rw: u32, gpr: u32) -> WRow {
    return WRow((w + r * rw) / 4u, s + r * gpr, b + r * gpr);
}

// A tile's 8 weight rows.
struct TileW {
    rows: array<WRow, 8>,
}

// The team tree's levels 32, 16 and 8 of pair k's lane sums (acc[m * 8 + k]: lane
// g + 8m's), which pair lanes of one invocation: lanes g + 8m and g + 8(m + s / 8).
fn fold8(acc: array<f32, 64>, k: u32) -> f32 {
    let b0 = acc[k] + acc[32u + k];
    let b1 = acc[8u + k] + acc[40u + k];
    let b2 = acc[16u + k] + acc[48u + k];
    let b3 = acc[24u + k] + acc[56u + k];
    return (b0 + b2) + (b1 + b3);
}

// The scale and bias of weight row `w`'s group holding input i0 (0 for formats
// without them).
fn chunk_affine(w: WRow, i0: u32) -> vec2<f32> {
    if (DTYPE != 3u) {
        return vec2<f32>(0.0, 0.0);
    }
    let q = i0 / wgroup();
    return vec2<f32>(bitcast<f32>(wword(w.sb + q)), bitcast<f32>(wword(w.bb + q)));
}

// The tile's 8 x 32 products into tile_out (call in uniform control flow; every
// invocation of the workgroup takes part). Invocation lid brings call row lid / 8 (its
// inputs `sel` at `xb`, `n` of them; `live` false past the tile's rows) over weight rows
// of `chunks` vec4s.
fn tile_products(t: TileW, chunks: u32, n: u32, sel: u32, xb: u32, lid: u32, live: bool) {
    let g = lid % 8u;
    // acc[m * 8 + o]: lane g + 8m's sum for weight row o
    var acc: array<f32, 64>;
    for (var i = 0u; i < 64u; i = i + 1u) {
        acc[i] = 0.0;
    }
    if (live) {
        for (var c0 = 0u; c0 < chunks; c0 = c0 + 64u) {
            for (var m = 0u; m < 8u; m = m + 1u) {
                let c = c0 + g + 8u * m;
                if (c < chunks) {
                    let i0 = c * per_chunk();
                    let xv = chunk_x(sel, xb, i0, n);
                    let sx = chunk_sum(xv);
                    for (var o = 0u; o < 8u; o = o + 1u) {
                        let w = t.rows[o];
                        let a = chunk_affine(w, i0);
                        let d = chunk_dot_x(wvec(w.wb + c), xv, sx, a.x, a.y);
                        acc[m * 8u + o] = acc[m * 8u + o] + d;
                    }
                }
            }
        }
    }
    for (var o = 0u; o < 8u; o = o + 1u) {
        red[lid * 8u + o] = fold8(acc, o);
    }
    // levels 4, 2 and 1 across the row's 8 invocations
    reduce_red8_from(4u, g, lid);
    if (lid < 32u) {
        // weight row lid / 4's results of call rows 8 (lid % 4) ..
        let o = lid / 4u;
        for (var k = 0u; k < 8u; k = k + 1u) {
            let r = (lid % 4u) * 8u + k;
            tile_out[o * 32u + r] = red[r * 64u + o];
        }
    }
    workgroupBarrier();
}

// The matrix-vector shape of the same order (`mv_wide`, for matrices of many rows: the
// LM head): 32 weight rows by up to 8 call rows a workgroup, invocation (weight row
// lid / 8, group g = lid % 8) holding lanes g, g + 8, .., g + 56 of its row for each call
// row (inputs `sel` at `xb[j]`, j < nr). The 32 rows' invocations read the call rows' inputs once per
// workgroup through the cache (4 rows a workgroup in `mv` read them 8 times as often).
// Results in tile_out[o * 8 + j].
fn wide_products(t: WRow, chunks: u32, n: u32, sel: u32, xb: array<u32, 8>, nr: u32,
                 lid: u32, live: bool) {
    let g = lid % 8u;
    // acc[m * 8 + j]: lane g + 8m's sum for call row j
    var acc: array<f32, 64>;
    for (var i = 0u; i < 64u; i = i + 1u) {
        acc[i] = 0.0;
    }
    if (live) {
        for (var c0 = 0u; c0 < chunks; c0 = c0 + 64u) {
            for (var m = 0u; m < 8u; m = m + 1u) {
                let c = c0 + g + 8u * m;
                if (c < chunks) {
                    let i0 = c * per_chunk();
                    let a = chunk_affine(t, i0);
                    let w = wvec(t.wb + c);
                    for (var j = 0u; j < 8u; j = j + 1u) {
                        if (j < nr) {
                            let xv = chunk_x(sel, xb[j], i0, n);
                            let d = chunk_dot_x(w, xv, chunk_sum(xv), a.x, a.y);
                            acc[m * 8u + j] = acc[m * 8u + j] + d;
                        }
                    }
                }
            }
        }
    }
    // the tree's levels 32, 16 and 8 in registers, then 4, 2 and 1 across the row's 8
    // invocations
    for (var j = 0u; j < 8u; j = j + 1u) {
        red[lid * 8u + j] = fold8(acc, j);
    }
    reduce_red8_from(4u, g, lid);
    if (g == 0u) {
        for (var j = 0u; j < 8u; j = j + 1u) {
            tile_out[(lid / 8u) * 8u + j] = red[lid * 8u + j];
        }
    }
    workgroupBarrier();
}
