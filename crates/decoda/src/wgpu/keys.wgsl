// Order keys and special-value tests on bits, shared by the sampler's passes (step/)
// and the sharded sampling's summaries (shard.wgsl).

// Order-preserving key: a < b (floats, no NaN) iff key(a) < key(b).
fn key_of(v: f32) -> u32 {
    let b = bitcast<u32>(v);
    if ((b & 0x80000000u) != 0u) {
        return ~b;
    }
    return b | 0x80000000u;
}

// The key of a value for comparisons: as key_of, but -0 and +0 compare equal, as floats
// do. Comparing keys keeps -inf out of float comparisons (fast math may assume it away).
fn cmp_key(v: f32) -> u32 {
    if (bitcast<u32>(v) == 0x80000000u) {
        return 0x80000000u;
    }
    return key_of(v);
}

// NaN or +inf.
fn is_bad(v: f32) -> bool {
    let b = bitcast<u32>(v) & 0x7fffffffu;
    return b > 0x7f800000u || bitcast<u32>(v) == 0x7f800000u;
}

fn is_neg_inf(v: f32) -> bool {
    return bitcast<u32>(v) == 0xff800000u;
}
