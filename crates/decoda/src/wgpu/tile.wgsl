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
// chunks, so a tile reads its weights once from memory (the rest from the cache); for
// affine formats the tile unpacks each word of codes once into workgroup memory
// (tile_affine) instead of once per call row.
//
// The including module defines `xin4` (chunk.wgsl), `wvec(i) -> vec4<u32>` (vec4 i of
// its weights), `wword(i) -> u32` (word i) and `wgroup() -> u32` (the affine group).

const TEAM_LANES: u32 = 64u;

// Partial sums: [invocation][8 values]
var<workgroup> red: array<f32, 2048>;
// A tile's results: [weight row o][call row r] at o * 32 + r
var<workgroup> tile_out: array<f32, 256>;
// Affine formats: a round's codes as floats, unpacked once for the tile's 32 call rows
// (tile_products): [weight row of the round][chunk of the step (group g)][vec4 of the
// chunk's inputs], 1,024 floats
var<workgroup> stage: array<vec4<f32>, 256>;

// Sums each team's 64 partial sums (8 values an invocation, red[lid * 8 + j], of which
// the first `nv` are wanted) into its lane 0: the tree's levels in workgroup memory down
// to `tree_floor`, the rest as a butterfly in registers (team_wg.wgsl or team_sg.wgsl:
// the same bits). A value's sum does not depend on nv.
fn reduce_red8(lane: u32, lid: u32, nv: u32) {
    reduce_red8_from(TEAM_LANES / 2u, lane, lid, nv);
}

// reduce_red8's levels top, top / 2, .., 1 (teams of 2 top invocations).
fn reduce_red8_from(top: u32, lane: u32, lid: u32, nv: u32) {
    workgroupBarrier();
    if (serial_tree()) {
        // invocation j of the team runs value j's tree: level s adds lane l + s into
        // lane l for l < s, as below, one level after another
        if (lane < nv) {
            let b = (lid - lane) * 8u + lane;
            for (var s = top; s > 0u; s = s >> 1u) {
                for (var l = 0u; l < s; l = l + 1u) {
                    red[b + l * 8u] = red[b + l * 8u] + red[b + (l + s) * 8u];
                }
            }
        }
        workgroupBarrier();
        return;
    }
    var s = top;
    for (; s > 0u && s >= tree_floor(); s = s >> 1u) {
        if (lane < s) {
            for (var j = 0u; j < nv; j = j + 1u) {
                red[lid * 8u + j] = red[lid * 8u + j] + red[(lid + s) * 8u + j];
            }
        }
        workgroupBarrier();
    }
    if (s > 0u) {
        let at = lid * 8u;
        var a = vec4<f32>(butterfly(red[at], s), 0.0, 0.0, 0.0);
        var b = vec4<f32>(0.0);
        if (nv > 1u) {
            a.y = butterfly(red[at + 1u], s);
            a.z = butterfly(red[at + 2u], s);
            a.w = butterfly(red[at + 3u], s);
        }
        if (nv > 4u) {
            b = vec4<f32>(butterfly(red[at + 4u], s), butterfly(red[at + 5u], s),
                          butterfly(red[at + 6u], s), butterfly(red[at + 7u], s));
        }
        workgroupBarrier();
        if (lane == 0u) {
            put_red8(lid, V8(a, b));
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

// A tile's 8 weight rows (named fields: no array indexed at run time).
struct TileW {
    r0: WRow,
    r1: WRow,
    r2: WRow,
    r3: WRow,
    r4: WRow,
    r5: WRow,
    r6: WRow,
    r7: WRow,
}

// Eight sums (8 weight rows, or 8 call rows), a then b.
struct V8 {
    a: vec4<f32>,
    b: vec4<f32>,
}

fn v8_add(x: V8, y: V8) -> V8 {
    return V8(x.a + y.a, x.b + y.b);
}

// v with its value j (< 8) set to x: a, then b.
fn v8_set(v: V8, j: u32, x: f32) -> V8 {
    var r = v;
    if (j < 4u) {
        r.a[j] = x;
    } else {
        r.b[j - 4u] = x;
    }
    return r;
}

// red[lid * 8 ..] = v
fn put_red8(lid: u32, v: V8) {
    let at = lid * 8u;
    red[at] = v.a.x;
    red[at + 1u] = v.a.y;
    red[at + 2u] = v.a.z;
    red[at + 3u] = v.a.w;
    red[at + 4u] = v.b.x;
    red[at + 5u] = v.b.y;
    red[at + 6u] = v.b.z;
    red[at + 7u] = v.b.w;
}

// The team tree's levels 32, 16 and 8 over the lane sums an invocation holds (lanes
// g + 8m, m < 8), taken step by step in m order: slot m % 4 holds lane m's sums and then
// adds lane m + 4's (level 32), and the sums are (s0 + s2) + (s1 + s3) (levels 16 and
// 8): the tree's own order, with four V8s live. A step past the row's chunks (8m >=
// chunks: every group's lane sums are 0) is not run; its slot keeps 0, and x + 0 is x
// (a lane sum, begun at +0, is never -0), so the sums are those of all eight steps. A
// software adapter runs a loop's body once, masked, even when no invocation enters it,
// so an empty step cost it a whole step (8 of 8 steps, for rows of at most 8 chunks).
struct Tree {
    s0: V8,
    s1: V8,
    s2: V8,
    s3: V8,
}

// The steps that have chunks: m < tree_steps(chunks).
fn tree_steps(chunks: u32) -> u32 {
    return min(8u, (chunks + 7u) / 8u);
}

fn tree_add(t: Tree, m: u32, l: V8) -> Tree {
    var o = t;
    let j = m & 3u;
    if (j == 0u) {
        o.s0 = v8_add(t.s0, l);
    } else if (j == 1u) {
        o.s1 = v8_add(t.s1, l);
    } else if (j == 2u) {
        o.s2 = v8_add(t.s2, l);
    } else {
        o.s3 = v8_add(t.s3, l);
    }
    return o;
}

fn tree_sum(t: Tree) -> V8 {
    return v8_add(v8_add(t.s0, t.s2), v8_add(t.s1, t.s3));
}

fn tree_zero() -> Tree {
    let z = V8(vec4<f32>(0.0), vec4<f32>(0.0));
    return Tree(z, z, z, z);
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

// Weight row w's chunk c (first input i0) against the inputs xv (sum sx).
fn row_chunk(w: WRow, c: u32, i0: u32, xv: XChunk, sx: f32) -> f32 {
    let a = chunk_affine(w, i0);
    return chunk_dot_x(wvec(w.wb + c), xv, sx, a.x, a.y);
}

// Weight row w (< 8) of the tile.
fn tile_wrow(t: TileW, w: u32) -> WRow {
    var r = t.r0;
    if (w == 1u) {
        r = t.r1;
    } else if (w == 2u) {
        r = t.r2;
    } else if (w == 3u) {
        r = t.r3;
    } else if (w == 4u) {
        r = t.r4;
    } else if (w == 5u) {
        r = t.r5;
    } else if (w == 6u) {
        r = t.r6;
    } else if (w == 7u) {
        r = t.r7;
    }
    return r;
}

// Value j (< 8) of v: a, then b.
fn v8_get(v: V8, j: u32) -> f32 {
    if (j < 4u) {
        return v.a[j];
    }
    return v.b[j - 4u];
}

// Affine formats: unpacks the codes of weight rows w0 .. w0 + rows - 1, chunks cb .. cb + 7
// (those below `chunks`), into `stage` as floats (codes_f32: exact), one word an
// invocation (4 words a chunk: 8 codes each at 4 bits, 4 at 8).
fn stage_round(t: TileW, w0: u32, rows: u32, cb: u32, chunks: u32, lid: u32) {
    let wr = lid / 32u;
    let gg = (lid / 4u) % 8u;
    let q = lid % 4u;
    let c = cb + gg;
    if (wr < rows && c < chunks) {
        let row = tile_wrow(t, w0 + wr);
        let word = wword((row.wb + c) * 4u + q);
        let at = (wr * 8u + gg) * (per_chunk() / 4u);
        // (chunk_w's floats for this word)
        if (BITS == 4u) {
            stage[at + 2u * q] = q4_lo(word);
            stage[at + 2u * q + 1u] = q4_hi(word);
        } else {
            stage[at + q] = q8_of(word);
        }
    }
}

// The staged chunk of round row wr, group g: chunk_w's floats for it.
fn staged_chunk(wr: u32, g: u32) -> XChunk {
    let at = (wr * 8u + g) * (per_chunk() / 4u);
    let z = vec4<f32>(0.0);
    var c = XChunk(stage[at], stage[at + 1u], stage[at + 2u], stage[at + 3u], z, z, z, z);
    if (BITS == 4u) {
        c.v4 = stage[at + 4u];
        c.v5 = stage[at + 5u];
        c.v6 = stage[at + 6u];
        c.v7 = stage[at + 7u];
    }
    return c;
}

// tile_products' lane sums for affine formats (every invocation calls it: barriers).
// The lane sums and their order are tile_lane's; only the codes' unpacking moves: the
// 32 call rows of a tile read the same weight chunks, and unpacking each word once per
// workgroup (into `stage`) rather than once per call row cuts the integer operations of
// a 4-bit tile step from about 768 an invocation (8 rows x 32 codes x a shift, an AND
// and an OR) to at most 48. A step (lane group m, chunks 64j + 8m .. + 7, one per group
// g) runs in rounds of 4 weight rows at 4 bits, 8 at 8 (1,024 staged floats).
fn tile_affine(t: TileW, chunks: u32, n: u32, sel: u32, xb: u32, lid: u32, live: bool) -> V8 {
    let g = lid % 8u;
    let z = V8(vec4<f32>(0.0), vec4<f32>(0.0));
    var f = tree_zero();
    let rows = 1024u / (8u * per_chunk());
    for (var m = 0u; m < tree_steps(chunks); m = m + 1u) {
        var acc = z;
        for (var cb = 0u; cb + 8u * m < chunks; cb = cb + TEAM_LANES) {
            let c = cb + g + 8u * m;
            let i0 = c * per_chunk();
            let on = live && c < chunks;
            let zx = vec4<f32>(0.0);
            var xv = XChunk(zx, zx, zx, zx, zx, zx, zx, zx);
            var sx = 0.0;
            if (on) {
                xv = chunk_x(sel, xb, i0, n);
                sx = chunk_sum(xv);
            }
            for (var w0 = 0u; w0 < 8u; w0 = w0 + rows) {
                workgroupBarrier();
                stage_round(t, w0, rows, cb + 8u * m, chunks, lid);
                workgroupBarrier();
                if (on) {
                    for (var wr = 0u; wr < rows; wr = wr + 1u) {
                        let w = w0 + wr;
                        let af = chunk_affine(tile_wrow(t, w), i0);
                        let d = chunk_dot_q(staged_chunk(wr, g), xv, sx, af.x, af.y);
                        acc = v8_set(acc, w, v8_get(acc, w) + d);
                    }
                }
            }
        }
        f = tree_add(f, m, acc);
    }
    return tree_sum(f);
}

// Lane `lane`'s sums for the tile's 8 weight rows: chunks lane, lane + 64, .. in order.
fn tile_lane(t: TileW, lane: u32, chunks: u32, n: u32, sel: u32, xb: u32) -> V8 {
    var a = vec4<f32>(0.0);
    var b = vec4<f32>(0.0);
    for (var c = lane; c < chunks; c = c + TEAM_LANES) {
        let i0 = c * per_chunk();
        let xv = chunk_x(sel, xb, i0, n);
        let sx = chunk_sum(xv);
        a.x = a.x + row_chunk(t.r0, c, i0, xv, sx);
        a.y = a.y + row_chunk(t.r1, c, i0, xv, sx);
        a.z = a.z + row_chunk(t.r2, c, i0, xv, sx);
        a.w = a.w + row_chunk(t.r3, c, i0, xv, sx);
        b.x = b.x + row_chunk(t.r4, c, i0, xv, sx);
        b.y = b.y + row_chunk(t.r5, c, i0, xv, sx);
        b.z = b.z + row_chunk(t.r6, c, i0, xv, sx);
        b.w = b.w + row_chunk(t.r7, c, i0, xv, sx);
    }
    return V8(a, b);
}

// The tile's 8 x 32 products into tile_out (call in uniform control flow; every
// invocation of the workgroup takes part). Invocation lid brings call row lid / 8 (its
// inputs `sel` at `xb`, `n` of them; `live` false past the tile's rows) over weight rows
// of `chunks` vec4s.
fn tile_products(t: TileW, chunks: u32, n: u32, sel: u32, xb: u32, lid: u32, live: bool) {
    let g = lid % 8u;
    var sums = V8(vec4<f32>(0.0), vec4<f32>(0.0));
    if (DTYPE == 3u) {
        sums = tile_affine(t, chunks, n, sel, xb, lid, live);
    } else if (live) {
        var f = tree_zero();
        for (var m = 0u; m < tree_steps(chunks); m = m + 1u) {
            f = tree_add(f, m, tile_lane(t, g + 8u * m, chunks, n, sel, xb));
        }
        sums = tree_sum(f);
    }
    put_red8(lid, sums);
    // levels 4, 2 and 1 across the row's 8 invocations
    reduce_red8_from(4u, g, lid, 8u);
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

// Chunk w of a weight row (first input i0, its group's scale sc and bias bi) against
// call rows j < nr (row j's inputs at x0 + j * stride, read with `sel`, or with j when
// `per_row`: the mv kernels' normed rows); 0 past nr. The row-by-row products' step.
// The rows are a loop, not eight inlined copies of the chunk's product: the same sums
// from a far smaller kernel, which a CPU adapter pays for per workgroup even where it
// has nothing to compute (lavapipe, a 4-bit `mv` of 22 workgroups and no rows: 4.2 ms
// with the copies, 0.9 ms with the loop; docs/TESTING.md).
fn rows_dot(w: vec4<u32>, i0: u32, sc: f32, bi: f32, n: u32, sel: u32, per_row: bool, x0: u32,
            stride: u32, nr: u32) -> V8 {
    var r = V8(vec4<f32>(0.0), vec4<f32>(0.0));
    // the weights unpacked once for every call row (exact: each row's sum is the same)
    let q = chunk_w(w);
    for (var j = 0u; j < min(nr, 8u); j = j + 1u) {
        let xv = chunk_x(select(sel, j, per_row), x0 + j * stride, i0, n);
        r = v8_set(r, j, chunk_dot_q(q, xv, chunk_sum(xv), sc, bi));
    }
    return r;
}

// Lane `lane`'s sums of weight row t for the call rows j < nr (0 past them).
fn wide_lane(t: WRow, lane: u32, chunks: u32, n: u32, sel: u32, x0: u32, stride: u32,
             nr: u32) -> V8 {
    var acc = V8(vec4<f32>(0.0), vec4<f32>(0.0));
    for (var c = lane; c < chunks; c = c + TEAM_LANES) {
        let i0 = c * per_chunk();
        let af = chunk_affine(t, i0);
        acc = v8_add(acc, rows_dot(wvec(t.wb + c), i0, af.x, af.y, n, sel, false, x0, stride, nr));
    }
    return acc;
}

// The matrix-vector shape of the same order (`mv_wide`, for matrices of many rows: the
// LM head): 32 weight rows by up to 8 call rows a workgroup, invocation (weight row
// lid / 8, group g = lid % 8) holding lanes g, g + 8, .., g + 56 of its row for each call
// row (call row j's inputs `sel` at x0 + j * stride, j < nr). The 32 rows' invocations
// read the call rows' inputs once per workgroup through the cache (4 rows a workgroup in
// `mv` read them 8 times as often). Results in tile_out[o * 8 + j].
fn wide_products(t: WRow, chunks: u32, n: u32, sel: u32, x0: u32, stride: u32, nr: u32,
                 lid: u32, live: bool) {
    let g = lid % 8u;
    var sums = V8(vec4<f32>(0.0), vec4<f32>(0.0));
    if (live) {
        var f = tree_zero();
        for (var m = 0u; m < tree_steps(chunks); m = m + 1u) {
            f = tree_add(f, m, wide_lane(t, g + 8u * m, chunks, n, sel, x0, stride, nr));
        }
        sums = tree_sum(f);
    }
    // the tree's levels 32, 16 and 8 in registers (above), then 4, 2 and 1 across the
    // row's 8 invocations
    put_red8(lid, sums);
    reduce_red8_from(4u, g, lid, nr);
    if (g == 0u) {
        for (var j = 0u; j < 8u; j = j + 1u) {
            tile_out[(lid / 8u) * 8u + j] = red[lid * 8u + j];
        }
    }
    workgroupBarrier();
}
