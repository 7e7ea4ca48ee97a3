// Arithmetic that decides tokens, the same on every device as on the CPU
// (crate::fmath, crate::philox): keep it line for line with them.
//
// Two rules make it so on any compiler, fast math included (wgpu's Metal backend compiles
// with Metal's default options, which turn fast math on; and a SPIR-V driver may fuse a
// multiply into an add or reorder a chain of additions unless the module forbids it,
// which naga's output does not: Mesa's compiler does reorder them):
// - every intermediate result goes through `fp`, an identity the compiler cannot see
//   through (an XOR with a zero it only learns at run time), so each operation is rounded
//   on its own and in the CPU's order, never fused or reassociated;
// - division is `div_rn`, correctly rounded in integer arithmetic (WGSL's `/` is only
//   within 2.5 ulp, and fast math may turn it into a reciprocal).
// Special values (-inf, NaN) are tested on bits, never through float comparisons.
//
// The including module defines `fn opaque_zero() -> u32`, returning a zero read from a
// uniform buffer.

fn fp(x: f32) -> f32 {
    return bitcast<f32>(bitcast<u32>(x) ^ opaque_zero());
}

// a / b correctly rounded to nearest even, for b a positive finite number and a finite
// (zero and subnormals included) or -inf (returned as is). Overflow gives +-inf,
// results below the normal range are rounded into the subnormals as IEEE 754 does.
fn div_rn(a: f32, b: f32) -> f32 {
    return div_rn_by(a, b, false, 0);
}

// div_rn with its floating-point estimate moved by `skew`: the same bits for any estimate
// near the quotient, which a test checks on any adapter (lavapipe's own division is
// exact, so it never exercises the corrections a GPU's approximate one needs).
fn div_rn_skewed(a: f32, b: f32, skew: i32) -> f32 {
    return div_rn_by(a, b, false, skew);
}

// div_rn, the same bits, with the quotient's bits found eight at a time (three digits
// estimated in floating point and corrected exactly): a fraction of the code of the
// 25 compare-and-subtract steps div_rn once took, for kernels that divide in many places
// but few times (settle, a row's later stages). A driver compiles every inlined copy, and lavapipe
// does it again in every process: the unrolled steps cost `settle` about a third of its
// build. (The 25 steps as a loop whose count the compiler cannot see were smaller
// still, but on lavapipe they changed tokens in the settle passes, for reasons not
// found; the fmath test alone passed.)
fn div_rn_cold(a: f32, b: f32) -> f32 {
    return div_rn_by(a, b, true, 0);
}

// div_rn with the quotient's bits found eight at a time (`chunks`) or all at once (the
// estimate moved by `skew`: 0 but in a test).
fn div_rn_by(a: f32, b: f32, chunks: bool, skew: i32) -> f32 {
    let ab = bitcast<u32>(a);
    let sign = ab & 0x80000000u;
    let mag = ab & 0x7fffffffu;
    if (mag == 0u || mag >= 0x7f800000u) {
        return a;
    }
    let na = significand(mag);
    let nb = significand(bitcast<u32>(b) & 0x7fffffffu);
    var ma = na.x;
    let mb = nb.x;
    // the quotient of the significands is in [1, 2) after this
    var e = i32(na.y) - i32(nb.y);
    if (ma < mb) {
        ma = ma << 1u;
        e = e - 1;
    }
    // 24 quotient bits, a guard bit, and whether anything is left (sticky)
    var rem = ma;
    var q = 0u;
    if (chunks) {
        // ma < 2 mb: the first bit, then 24 more eight at a time (rem < mb < 2^24, so
        // rem << 8 fits a word); rem doubled at the end as the steps leave it. Each digit
        // (below 256) is estimated in floating point, within one of the true one (the
        // estimate's error is far below one), then corrected in exact integers (d mb
        // stays below 2^32 for d <= 256).
        q = select(0u, 1u, rem >= mb);
        rem = rem - mb * q;
        for (var i = 0u; i < 3u; i = i + 1u) {
            let t = rem << 8u;
            var d = u32(f32(t) / f32(mb));
            d = d - select(0u, 1u, d * mb > t);
            d = d + select(0u, 1u, t - d * mb >= mb);
            q = (q << 8u) | d;
            rem = t - d * mb;
        }
        rem = rem << 1u;
    } else {
        // the 25 bits at once: an estimate in floating point (ma and mb are exact f32s
        // and WGSL's division is within 2.5 ulp, so it lies within 6 of the true
        // floor(ma 2^24 / mb)), then corrected in exact integers. The remainder
        // ma 2^24 - q mb is then small (|r| < 7 mb < 2^27), so its low word, computed
        // modulo 2^32, is all of it. (It was 25 compare-and-subtract steps: about 125
        // operations a division against about 20; issue 56, the review's #7.)
        q = u32(i32(fp(fp(f32(ma) / f32(mb)) * 16777216.0)) + skew);
        var r = bitcast<i32>((ma << 24u) - q * mb);
        let m = i32(mb);
        for (var i = 0u; i < 64u && r < 0; i = i + 1u) {
            q = q - 1u;
            r = r + m;
        }
        for (var i = 0u; i < 64u && r >= m; i = i + 1u) {
            q = q + 1u;
            r = r - m;
        }
        rem = u32(r);
    }
    // q: 25 bits (bit 24 set); x = q << 1 | sticky: 26 bits, two below the last kept one
    var x = (q << 1u) | select(0u, 1u, rem != 0u);
    let biased = e + 127;
    if (biased >= 255) {
        return bitcast<f32>(sign | 0x7f800000u);
    }
    var expo = 0u;
    if (biased >= 1) {
        expo = u32(biased - 1);
    } else {
        // below the normal range: shift out 1 - biased more bits, keeping the sticky
        let sh = u32(1 - biased);
        if (sh >= 26u) {
            x = select(0u, 1u, x != 0u);
        } else {
            let lost = x & ((1u << sh) - 1u);
            x = (x >> sh) | select(0u, 1u, lost != 0u);
        }
    }
    var mant = x >> 2u;
    let guard = (x >> 1u) & 1u;
    let sticky = x & 1u;
    if (guard == 1u && (sticky == 1u || (mant & 1u) == 1u)) {
        mant = mant + 1u;
    }
    // the implicit bit of a normal result adds one to the exponent field; a carry out of
    // the significand moves to the next binade (or to infinity) by the same addition
    return bitcast<f32>(sign | ((expo << 23u) + mant));
}

// The significand of a positive finite non-zero float with its implicit bit (in
// [2^23, 2^24), subnormals normalised) and its biased exponent plus 128 (so it stays
// non-negative for subnormals).
fn significand(mag: u32) -> vec2<u32> {
    let e = mag >> 23u;
    let m = mag & 0x7fffffu;
    if (e == 0u) {
        let lz = countLeadingZeros(m) - 8u;
        return vec2<u32>(m << lz, 129u - lz);
    }
    return vec2<u32>(m | 0x800000u, e + 128u);
}

fn ln_f32(x: f32) -> f32 {
    let bits = bitcast<u32>(x);
    var e = i32((bits >> 23u) & 0xffu) - 126;
    var m = bitcast<f32>((bits & 0x007fffffu) | 0x3f000000u);
    if (m < 0.70710677) {
        e = e - 1;
        m = fp(m + m) - 1.0;
    } else {
        m = m - 1.0;
    }
    m = fp(m);
    let ef = f32(e);
    let z = fp(m * m);
    var y = 7.0376836e-2;
    y = fp(fp(y * m) - 1.151461e-1);
    y = fp(fp(y * m) + 1.1676999e-1);
    y = fp(fp(y * m) - 1.2420141e-1);
    y = fp(fp(y * m) + 1.4249323e-1);
    y = fp(fp(y * m) - 1.6668058e-1);
    y = fp(fp(y * m) + 2.0000714e-1);
    y = fp(fp(y * m) - 2.4999994e-1);
    y = fp(fp(y * m) + 3.333333e-1);
    y = fp(fp(y * m) * z);
    y = fp(y + fp(ef * -2.1219444e-4));
    y = fp(y + fp(-0.5 * z));
    let r = fp(m + y);
    return fp(r + fp(ef * 0.6933594));
}

// exp(x) for x <= 88; 0 below -87.33654 (and for -inf or NaN).
fn exp_f32(x_in: f32) -> f32 {
    let x = fp(x_in);
    let bits = bitcast<u32>(x);
    // -87.33654 is 0xc2aeac4f: a negative float is smaller when its bits are larger
    if (bits >= 0xc2aeac50u || (bits > 0x7f800000u && bits < 0x80000000u)) {
        return 0.0;
    }
    if (bits > 0x42b00000u && bits < 0x80000000u) {
        return bitcast<f32>(0x7f800000u);
    }
    let n = floor(fp(fp(x * 1.442695) + 0.5));
    var r = fp(x - fp(n * 0.6933594));
    r = fp(r - fp(n * -2.1219444e-4));
    let z = fp(r * r);
    var y = 1.9875691e-4;
    y = fp(fp(y * r) + 1.3981999e-3);
    y = fp(fp(y * r) + 8.333452e-3);
    y = fp(fp(y * r) + 4.1665796e-2);
    y = fp(fp(y * r) + 1.6666665e-1);
    y = fp(fp(y * r) + 0.5);
    y = fp(fp(fp(y * z) + r) + 1.0);
    let ni = i32(n);
    let hn = ni / 2;
    let s1 = bitcast<f32>(u32(hn + 127) << 23u);
    let s2 = bitcast<f32>(u32(ni - hn + 127) << 23u);
    let v = fp(fp(y * s1) * s2);
    if (bitcast<u32>(v) < 0x00800000u) {
        return 0.0;
    }
    return v;
}

// (`mulhilo`: mulhi32.wgsl or, on devices with 64-bit integers, mulhi64.wgsl, appended
// by the launcher)
fn philox(counter: vec4<u32>, key: vec2<u32>) -> vec4<u32> {
    return philox_rounds(counter, key, 10u);
}

// philox, the same bits, with its ten rounds left as a loop the compiler cannot unroll
// (a count read from a uniform): for passes that draw in many places but few times (the
// list's and the full row's draws, XTC's coin), so each inlined copy is one round's code.
fn philox_cold(counter: vec4<u32>, key: vec2<u32>) -> vec4<u32> {
    return philox_rounds(counter, key, 10u + opaque_zero());
}

// Philox4x32 with `rounds` rounds (10, constant or not).
fn philox_rounds(counter: vec4<u32>, key: vec2<u32>, rounds: u32) -> vec4<u32> {
    var c = counter;
    var k = key;
    for (var rd = 0u; rd < rounds; rd = rd + 1u) {
        if (rd > 0u) {
            k = vec2<u32>(k.x + 0x9E3779B9u, k.y + 0xBB67AE85u);
        }
        let p0 = mulhilo(0xD2511F53u, c.x);
        let p1 = mulhilo(0xCD9E8D57u, c.z);
        c = vec4<u32>(p1.x ^ c.y ^ k.x, p1.y, p0.x ^ c.w ^ k.y, p0.y);
    }
    return c;
}

fn gumbel(x: u32) -> f32 {
    let u = f32(2u * (x >> 9u) + 1u) * (1.0 / 16777216.0);
    return -ln_f32(-ln_f32(u));
}

// The per-word reach test of the CPU's gated draw (philox::gumbel_reach_chord,
// gumbel_reach_consts): a token of logit z and Philox word x can reach a score `floor`
// (z / t + g(x) >= floor) only if z >= c1 chord(x) + c0, where c1 chord(x) + c0 is
// t (floor - slack - bound(x)) and bound(x) = ln 2 (151 - chord(x) 2^-23) bounds the
// noise of x. The constants are computed here in f32, not f64, so the slack is twice
// the CPU's; (f32 min, 0) where the test cannot be made safely (every finite z passes).
// (Here beside the noise so `wgpu_fmath` checks them on the CPU test's grid.)
fn reach_chord(x: u32) -> f32 {
    let d = 16777215u - 2u * (x >> 9u);
    return f32(bitcast<i32>(f32(d)));
}

fn reach_consts(t: f32, floor: f32) -> vec2<f32> {
    let slack = 2e-3 + 2e-5 * abs(floor);
    let c0 = t * (floor - slack - 104.66522);
    let c1 = t * 8.262958e-8;
    // (an exponent of all ones: not finite)
    let inf = 0x7f800000u;
    let big = c1 * 1.3e9;
    if ((bitcast<u32>(c0) & inf) == inf || !(c1 >= 1.1754944e-38) || (bitcast<u32>(big) & inf) == inf) {
        return vec2<f32>(-3.4028235e38, 0.0);
    }
    return vec2<f32>(c0, c1);
}
