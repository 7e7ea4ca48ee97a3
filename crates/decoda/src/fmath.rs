//! The natural logarithm and exponential that decide tokens, written out so that every
//! backend runs the same algorithm.
//!
//! The Gumbel noise (`-ln(-ln(u))`) and the top-p weights (`exp(y - ymax)`) go through
//! these two functions on the CPU, and through copies in the WGSL shaders
//! (`wgpu/fmath.wgsl`) that run the same rounded operations in the same order on the
//! device. They use only `+`, `-`, `*`, comparisons
//! and bit manipulation — no platform `libm`, no hardware approximation — so the CPU draws
//! the same tokens on every operating system, and a device that rounds its arithmetic
//! correctly (as IEEE 754 and WGSL require for these operations) draws the same ones too.
//! Both are within 2 ulp of the exact result (tested below against f64).
//!
//! The algorithms are the classic Cephes single-precision ones (Moshier): range reduction
//! by the exponent and a polynomial on the reduced argument.

/// `ln(x)` for a positive normal `x` (the only inputs the samplers give it: `u` in
/// `[2^-24, 1 - 2^-24]` and `-ln(u)`). Zero, subnormal, negative, infinite and NaN
/// inputs are not supported (the result is unspecified but never a panic).
#[inline]
pub fn ln(x: f32) -> f32 {
    let bits = x.to_bits();
    let mut e = ((bits >> 23) & 0xff) as i32 - 126;
    // m in [0.5, 1)
    let mut m = f32::from_bits((bits & 0x007f_ffff) | 0x3f00_0000);
    if m < std::f32::consts::FRAC_1_SQRT_2 {
        e -= 1;
        m = m + m - 1.0;
    } else {
        m -= 1.0;
    }
    let ef = e as f32;
    let z = m * m;
    let mut y = 7.037_683_6e-2_f32;
    y = y * m - 1.151_461e-1;
    y = y * m + 1.167_699_9e-1;
    y = y * m - 1.242_014_1e-1;
    y = y * m + 1.424_932_3e-1;
    y = y * m - 1.666_805_8e-1;
    y = y * m + 2.000_071_4e-1;
    y = y * m - 2.499_999_4e-1;
    y = y * m + 3.333_333e-1;
    y = y * m * z;
    y += ef * -2.121_944_4e-4;
    y += -0.5 * z;
    let mut r = m + y;
    r += ef * 0.693_359_4;
    r
}

/// `exp(x)` for `x <= 0` (the only inputs the samplers give it: `y - ymax` and
/// `v - vmax`). Results that would be subnormal (`x < -87.33`) are 0, on every backend
/// alike (devices may flush subnormals); `-inf` gives 0. Positive inputs up to 88 are
/// handled too, for the tests.
///
/// Every step runs for every input and the special cases are chosen at the end, with no
/// branch and no call into `libm` (the floor is a conversion and a compare), so a loop of
/// calls runs in vector lanes ([`crate::cpu::kernels`] computes the top-p weights so);
/// lanes compute each operation as the scalar code does, bit for bit.
#[inline(always)]
pub fn exp(x: f32) -> f32 {
    // Kept inside [-88, 88.5] so that every step stays in range; inside it (which holds
    // every input that is not a special case below) nothing changes. A NaN becomes -88.
    // (not `clamp`, which keeps a NaN: the conversion below must not see one)
    #[allow(clippy::manual_clamp)]
    let xc = x.max(-88.0).min(88.5);
    // n = round(x / ln 2) as floor(x log2(e) + 0.5), then r = x - n ln 2 in two pieces
    // (Cody-Waite).
    let h = xc * std::f32::consts::LOG2_E + 0.5;
    // SAFETY: `h` is finite with |h| < 129 (`xc` is not NaN and lies in [-88, 88.5]), so
    // it converts to an i32 (truncating toward zero).
    let t: i32 = unsafe { h.to_int_unchecked() };
    // the floor: one less when truncation went up
    let ni = t - i32::from((t as f32) > h);
    let n = ni as f32;
    let mut r = xc - n * 0.693_359_4;
    r -= n * -2.121_944_4e-4;
    let z = r * r;
    let mut y = 1.987_569_1e-4_f32;
    y = y * r + 1.398_199_9e-3;
    y = y * r + 8.333_452e-3;
    y = y * r + 4.166_579_6e-2;
    y = y * r + 1.666_666_5e-1;
    y = y * r + 0.5;
    y = y * z + r + 1.0;
    // y in [0.7, 1.42]; scale by 2^n in two steps so that n = -126 stays normal.
    let half = ni / 2;
    let s1 = f32::from_bits(((half + 127) as u32) << 23);
    let s2 = f32::from_bits(((ni - half + 127) as u32) << 23);
    let v = y * s1 * s2;
    let v = if v < f32::MIN_POSITIVE { 0.0 } else { v };
    let v = if x > 88.0 { f32::INFINITY } else { v };
    // The smallest x whose exp is a normal f32 (2^-126 = exp(-87.3365...)); also NaN and
    // -inf.
    if x.is_nan() || x < -87.336_54 {
        0.0
    } else {
        v
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ulps(a: f32, exact: f64) -> f64 {
        let e = exact as f32;
        let ulp = (f64::from(e.abs().next_up()) - f64::from(e.abs())).max(f64::MIN_POSITIVE);
        (f64::from(a) - exact).abs() / ulp
    }

    #[test]
    fn ln_within_two_ulp() {
        let mut worst = 0f64;
        // every uniform the samplers produce near both ends, and a sweep of the rest
        let mut xs: Vec<f32> = (0..200_000u32)
            .map(|k| ((2 * k + 1) as f32) * (1.0 / 16_777_216.0))
            .collect();
        xs.extend((0..200_000u32).map(|k| 1.0 - ((2 * k + 1) as f32) * (1.0 / 16_777_216.0)));
        let mut s = 0x9e37_79b9u32;
        for _ in 0..500_000 {
            s ^= s << 13;
            s ^= s >> 17;
            s ^= s << 5;
            let x = f32::from_bits(0x0080_0000 + s % (0x7f00_0000 - 0x0080_0000));
            xs.push(x);
        }
        for x in xs {
            let exact = f64::from(x).ln();
            if exact == 0.0 {
                assert_eq!(ln(x), 0.0);
                continue;
            }
            worst = worst.max(ulps(ln(x), exact));
        }
        assert!(worst <= 2.0, "ln: worst error {worst} ulp");
    }

    #[test]
    fn exp_within_two_ulp() {
        let mut worst = 0f64;
        let mut x = -87.33f32;
        while x <= 88.0 {
            let exact = f64::from(x).exp();
            worst = worst.max(ulps(exp(x), exact));
            x += 0.000_731;
        }
        assert!(worst <= 2.0, "exp: worst error {worst} ulp");
        assert_eq!(exp(0.0), 1.0);
        assert_eq!(exp(f32::NEG_INFINITY), 0.0);
        assert_eq!(exp(-100.0), 0.0);
        assert!(exp(-87.0) >= f32::MIN_POSITIVE);
    }

    /// Every `x <= -51` has `exp(x) < 2^-72`: a top-p weight `exp(y - R)` there truncates
    /// to 0 in the device's fixed point (units of 2^-72), which lets its scan skip such
    /// tokens (`mass_floor` in `wgpu/step/scan.wgsl`). Checked for every f32 in
    /// `[-88, -51]` (below -87.34 the result is 0 by construction).
    #[test]
    fn exp_adds_no_fixed_point_mass_past_51() {
        let unit = (-72f32).exp2();
        let mut x = -51.0f32;
        let mut n = 0u64;
        while x >= -88.0 {
            let v = exp(x);
            assert!(v < unit, "exp({x}) = {v:e} reaches 2^-72");
            x = x.next_down();
            n += 1;
        }
        assert!(n > 6_000_000, "{n}");
        assert_eq!(exp(f32::NEG_INFINITY), 0.0);
    }

    #[test]
    fn exp_is_monotone_near_zero() {
        let mut x = 0.0f32;
        let mut prev = exp(x);
        for _ in 0..1_000_000 {
            x = x.next_down();
            let v = exp(x);
            assert!(v <= prev, "exp({x}) = {v} > {prev}");
            prev = v;
        }
    }
}
