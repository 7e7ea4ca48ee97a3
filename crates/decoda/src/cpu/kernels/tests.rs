use super::*;

/// Deterministic test values with NaN, infinities, repeats and signed zeros mixed in.
fn values(n: usize, seed: u64) -> Vec<f32> {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..n)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            match x % 23 {
                // both signs: x86's default NaN has the sign bit set
                0 if x & 64 == 0 => f32::NAN,
                0 => -f32::NAN,
                1 => f32::INFINITY,
                2 => f32::NEG_INFINITY,
                3 => -0.0,
                4 => 1.5,
                _ => ((x >> 20) % 2000) as f32 / 100.0 - 10.0,
            }
        })
        .collect()
}

/// The gathering by threshold, the max with its non-finite count and the search for
/// a value (dispatched, and the SSE2 and generic variants) against plain loops.
#[test]
fn searches_match_the_plain_loops() {
    type Gather = fn(&[f32], u32, f32, &mut Vec<(u32, f32)>);
    type Max = fn(&[f32]) -> (f32, u64);
    let mut variants: Vec<(&str, Gather, Max)> = vec![
        ("dispatched", collect_ge, max_nonfinite),
        ("generic", portable::collect_ge, portable::max_nonfinite),
    ];
    #[cfg(target_arch = "x86_64")]
    variants.push((
        "sse2",
        // SAFETY: SSE2 is part of x86-64.
        |z, b, t, o| unsafe { sse2::collect_ge(z, b, t, o) },
        // SAFETY: as above.
        |z| unsafe { sse2::max_nonfinite(z) },
    ));
    for n in [0, 1, 7, 63, 64, 65, 130, 1000, 4099] {
        let z = values(n, n as u64 + 3);
        for &(name, gather, max_nf) in &variants {
            for thr in [f32::NEG_INFINITY, -10.0, 0.0, 1.5, 9.5, f32::INFINITY] {
                let mut fast = Vec::new();
                gather(&z, 7, thr, &mut fast);
                let want: Vec<(u32, f32)> = z
                    .iter()
                    .enumerate()
                    .filter(|(_, &x)| x >= thr)
                    .map(|(i, &x)| (7 + i as u32, x))
                    .collect();
                assert_eq!(fast.len(), want.len(), "{name} n={n} thr={thr}");
                for (a, b) in fast.iter().zip(&want) {
                    assert!(
                        a.0 == b.0 && a.1.to_bits() == b.1.to_bits(),
                        "{name} n={n} thr={thr}"
                    );
                }
            }
            // NaN ignored by the max; NaN and +inf counted; with and without them
            let finite: Vec<f32> = z
                .iter()
                .map(|&x| if x.is_finite() { x } else { -3.0 })
                .collect();
            for row in [&z, &finite] {
                let want_max = row
                    .iter()
                    .fold(f32::NEG_INFINITY, |m, &x| if x > m { x } else { m });
                let want_bad = row
                    .iter()
                    .filter(|x| x.is_nan() || **x == f32::INFINITY)
                    .count();
                let (m, bad) = max_nf(row);
                assert_eq!(bad, want_bad as u64, "{name} n={n}");
                assert_eq!(m.to_bits(), want_max.to_bits(), "{name} n={n}");
            }
        }
        for v in [
            1.5f32,
            0.0,
            f32::INFINITY,
            f32::NEG_INFINITY,
            123.0,
            f32::NAN,
        ] {
            let want = z.iter().position(|&x| x == v);
            assert_eq!(first_eq(&z, v), want, "n={n} v={v}");
        }
    }
}

#[test]
fn exp2_est_is_accurate_and_keeps_non_finite_visible() {
    let mut worst = [0f64; 2];
    let mut w = -126.0f32;
    while w < 127.0 {
        for (k, v) in [exp2_est::<false>(w), exp2_est::<true>(w)]
            .into_iter()
            .enumerate()
        {
            let want = f64::from(w).exp2();
            worst[k] = worst[k].max((f64::from(v) - want).abs() / want);
        }
        w += 0.000_913;
    }
    assert!(
        worst[0] < 2.5e-7 && worst[1] < 2.5e-7,
        "worst relative errors {worst:?}"
    );
    for f in [exp2_est::<false>, exp2_est::<true>] {
        assert!(f(f32::NEG_INFINITY) <= 2f32.powi(-126));
        assert!(f(-1e30) <= 2f32.powi(-126));
        assert!(!f(f32::INFINITY).is_finite());
        assert!(!f(128.5).is_finite());
        assert!(f(f32::NAN).is_nan());
    }
}

/// The one-pass greedy max (every variant this CPU runs) against plain loops: the
/// same max, the first index that holds it (ties between lanes and chunks, signed
/// zeros, rows of `-inf`), NaN or `+inf` flagged wherever it sits, partial tails.
#[test]
fn argmax_nonfinite_matches_the_plain_loops() {
    type Pass = fn(&[f32]) -> (f32, usize, bool);
    let mut variants: Vec<(&str, Pass)> = vec![("dispatched", argmax_nonfinite)];
    #[cfg(target_arch = "x86_64")]
    if detected() == Level::Avx512 {
        variants.push(("avx512", |z| {
            if z.len() < 64 {
                return argmax_nonfinite(z);
            }
            // SAFETY: `detected()` found AVX-512 F; 64 values or more.
            unsafe { avx512::argmax_nonfinite(z) }
        }));
    }
    #[cfg(target_arch = "x86_64")]
    if detected() != Level::Base {
        variants.push(("avx2", |z| {
            if z.len() < 32 {
                return argmax_nonfinite(z);
            }
            // SAFETY: `detected()` found AVX2; 32 values or more.
            unsafe { avx2::argmax_nonfinite(z) }
        }));
    }
    let check = |z: &[f32], what: &str| {
        let bad = z.iter().any(|v| v.is_nan() || *v == f32::INFINITY);
        let max = z.iter().copied().fold(f32::NEG_INFINITY, f32::max);
        let first = z.iter().position(|&v| v == max).unwrap_or(usize::MAX);
        for (name, f) in &variants {
            let (m, at, flagged) = f(z);
            assert_eq!(flagged, bad, "{name} {what}");
            if !bad {
                assert!(m == max && at == first, "{name} {what}: {m} at {at}");
            }
        }
    };
    for n in [0, 1, 7, 31, 32, 33, 63, 64, 65, 130, 1000, 4099, 131_072] {
        for seed in [1u64, 2, 3] {
            let mut z = values(n, n as u64 + seed);
            check(&z, &format!("n={n} seed={seed}"));
            z.iter_mut()
                .filter(|v| v.is_nan() || **v == f32::INFINITY)
                .for_each(|v| *v = 3.5);
            check(&z, &format!("finite n={n} seed={seed}"));
            // coarse values: the max held many times, in many lanes and chunks
            let coarse: Vec<f32> = z.iter().map(|v| (v.abs() % 4.0).floor()).collect();
            check(&coarse, &format!("coarse n={n} seed={seed}"));
        }
        check(&vec![f32::NEG_INFINITY; n], &format!("-inf n={n}"));
        // signed zeros: the first zero of either sign
        let zeros: Vec<f32> = (0..n)
            .map(|i| if i % 3 == 0 { 0.0 } else { -0.0 })
            .collect();
        check(&zeros, &format!("zeros n={n}"));
        if n > 0 {
            // one winner, or one NaN / +inf, at every tenth position and the last
            for at in (0..n).step_by(n.div_ceil(10)).chain([n - 1]) {
                let mut z = vec![-1.0f32; n];
                z[at] = 2.0;
                check(&z, &format!("n={n} winner at {at}"));
                for v in [f32::NAN, -f32::NAN, f32::INFINITY] {
                    z[at] = v;
                    check(&z, &format!("n={n} {v} at {at}"));
                }
            }
        }
    }
}

/// The fused gather-and-max pass (every variant this CPU runs) against plain loops:
/// the same hits in order, the same max, and NaN or `+inf` flagged.
#[test]
fn collect_ge_max_matches_the_plain_loops() {
    type Pass = fn(&[f32], u32, f32, &mut Vec<(u32, f32)>) -> (f32, bool);
    let mut variants: Vec<(&str, Pass)> = vec![("dispatched", collect_ge_max)];
    #[cfg(target_arch = "x86_64")]
    if matches!(detected(), Level::Avx512 | Level::Avx2) {
        // SAFETY: `detected()` found AVX2 and FMA (implied by its AVX-512 level).
        variants.push(("avx2", |z, b, t, o| unsafe {
            avx2::collect_ge_max(z, b, t, o)
        }));
    }
    // SAFETY: SSE2 is part of x86-64.
    #[cfg(target_arch = "x86_64")]
    variants.push(("sse2", |z, b, t, o| unsafe {
        sse2::collect_ge_max(z, b, t, o)
    }));
    for n in [0, 1, 7, 63, 64, 65, 130, 1000, 4099] {
        for seed in [1u64, 2, 3] {
            let mut z = values(n, n as u64 + seed);
            if seed == 1 {
                // finite only
                z.iter_mut()
                    .filter(|v| v.is_nan() || **v == f32::INFINITY)
                    .for_each(|v| *v = 3.5);
            }
            let bad = z.iter().any(|v| v.is_nan() || *v == f32::INFINITY);
            let want_max = z.iter().copied().fold(f32::NEG_INFINITY, f32::max);
            for thr in [f32::NEG_INFINITY, -10.0, 0.0, 9.5, f32::INFINITY] {
                let want: Vec<(u32, f32)> = z
                    .iter()
                    .enumerate()
                    .filter(|(_, &x)| x >= thr)
                    .map(|(i, &x)| (3 + i as u32, x))
                    .collect();
                for (name, f) in &variants {
                    let mut got = Vec::new();
                    let (m, flagged) = f(&z, 3, thr, &mut got);
                    assert_eq!(flagged, bad, "{name} n={n} seed={seed}");
                    if bad {
                        continue;
                    }
                    assert_eq!(m, want_max, "{name} n={n} seed={seed}");
                    assert_eq!(got.len(), want.len(), "{name} n={n} thr={thr}");
                    for (a, b) in got.iter().zip(&want) {
                        assert!(a.0 == b.0 && a.1.to_bits() == b.1.to_bits(), "{name}");
                    }
                }
            }
        }
    }
    // past one staged segment of 4096 values: the max, a NaN or `+inf` in a later
    // segment, or only in the first one, are each found (the segments' states folded)
    for at in [5, 4100, 8191, 8700, 9000] {
        let n = 9001;
        let mut z: Vec<f32> = (0..n).map(|i| (i % 97) as f32 * 0.01).collect();
        z[at] = 7.25;
        for (name, f) in &variants {
            let mut got = Vec::new();
            let (m, flagged) = f(&z, 0, 5.0, &mut got);
            assert_eq!((m, flagged), (7.25, false), "{name} at={at}");
            assert_eq!(got, vec![(at as u32, 7.25)], "{name} at={at}");
            for bad in [f32::NAN, -f32::NAN, f32::INFINITY] {
                let mut zb = z.clone();
                zb[at] = bad;
                assert!(f(&zb, 0, 5.0, &mut Vec::new()).1, "{name} at={at} {bad}");
            }
        }
    }
}

/// Each term of the normaliser within 2.5e-7 of `2^w` (coarse ones within
/// [`Terms::error`], and the AVX2 and SSE2 ones within 4e-6 and no closer than 1e-6
/// somewhere), across the range and at the kernels' rounding boundaries,
/// one value at a time (the padding lanes add `2^-126` each, nothing at these
/// magnitudes) and sixteen at a time: the dispatched variant, the AVX2 one wherever
/// the CPU runs it, the SSE2 one and the generic loop.
#[test]
fn exp2_sum_terms_are_accurate() {
    type Sum = fn(&[f32]) -> f64;
    let mut variants: Vec<(&str, Sum, f64)> = vec![
        (
            "dispatched",
            |z| exp2_sum(z, (1.0, 0.0), Terms::Precise),
            2.5e-7,
        ),
        (
            "dispatched coarse",
            |z| exp2_sum(z, (1.0, 0.0), Terms::Coarse),
            Terms::Coarse.error(),
        ),
    ];
    #[cfg(target_arch = "x86_64")]
    if matches!(detected(), Level::Avx512 | Level::Avx2) {
        variants.push((
            "avx2",
            |z| {
                // SAFETY: `detected()` found AVX2 and FMA (implied by its AVX-512 level).
                unsafe {
                    avx2::exp2_sum_collect::<false, false>(z, 1.0, 0.0, 0, 0.0, &mut Vec::new())
                }
            },
            2.5e-7,
        ));
        variants.push((
            "avx2 coarse",
            |z| {
                // SAFETY: as above.
                unsafe {
                    avx2::exp2_sum_collect::<false, true>(z, 1.0, 0.0, 0, 0.0, &mut Vec::new())
                }
            },
            4e-6,
        ));
    }
    #[cfg(target_arch = "x86_64")]
    variants.push((
        "sse2",
        |z| {
            // SAFETY: SSE2 is part of x86-64.
            unsafe { sse2::exp2_sum_collect::<false, false>(z, 1.0, 0.0, 0, 0.0, &mut Vec::new()) }
        },
        2.5e-7,
    ));
    #[cfg(target_arch = "x86_64")]
    variants.push((
        "sse2 coarse",
        |z| {
            // SAFETY: SSE2 is part of x86-64.
            unsafe { sse2::exp2_sum_collect::<false, true>(z, 1.0, 0.0, 0, 0.0, &mut Vec::new()) }
        },
        4e-6,
    ));
    variants.push((
        "generic",
        |z| portable::exp2_sum::<false>(z, 1.0, 0.0),
        2.5e-7,
    ));
    for (name, f, bound) in variants {
        // the term of `w` alone and sixteen at a time
        let error = |w: f32| {
            let want = f64::from(w).exp2();
            let one = (f(&[w]) - want).abs() / want;
            one.max((f(&[w; 16]) / 16.0 - want).abs() / want)
        };
        let mut worst = 0f64;
        let mut w = -100.0f32;
        while w < 127.0 {
            worst = worst.max(error(w));
            w += 0.000_913;
        }
        // at the kernels' rounding boundaries (multiples of 1/32, and so of 1/8 and 1)
        // and one f32 step to either side, where a table index and an exponent taken
        // from w in different operations must agree; and either side of 0
        let boundaries = (-3200..4064).map(|k| k as f32 / 32.0);
        let near = boundaries.flat_map(|at| [at.next_down(), at, at.next_up()]);
        for w in near.chain([-1e-10, -0.0, 1e-10]) {
            worst = worst.max(error(w));
        }
        assert!(worst < bound, "{name}: worst relative error {worst}");
        if bound > Terms::Precise.error() {
            // coarse indeed: a bound that could not fail would test nothing (the
            // AVX-512 kernels' coarse terms are their precise ones, bounded as such)
            assert!(worst > 1e-6, "{name}: worst relative error {worst}");
        }
        assert!(!f(&[128.5]).is_finite(), "{name}");
        assert!(!f(&[1.0, f32::INFINITY]).is_finite(), "{name}");
        assert!(f(&[f32::NAN]).is_nan(), "{name}");
        assert!(f(&[f32::NEG_INFINITY; 3]) < 1e-36, "{name}");
    }
}

/// The SSE2 normaliser's terms are `exp2_est::<false>(z c1 + c0)` bit for bit: one
/// value is one term in lane 0 and `2^-126` (the `-inf` padding) in the other three,
/// added in f64 as `(t + s) + (s + s)`; across the range, the clamps and NaN.
#[cfg(target_arch = "x86_64")]
#[test]
fn sse2_terms_are_exp2_est_bit_for_bit() {
    let (c1, c0) = (1.3f32, -0.7f32);
    let s = 2f64.powi(-126);
    // SAFETY: SSE2 is part of x86-64.
    let sum = |x: f32| unsafe {
        sse2::exp2_sum_collect::<false, false>(&[x], c1, c0, 0, 0.0, &mut Vec::new())
    };
    let want = |x: f32| (f64::from(exp2_est::<false>(x * c1 + c0)) + s) + (s + s);
    let mut x = -120.0f32;
    let mut checked = 0;
    while x < 100.0 {
        assert_eq!(sum(x).to_bits(), want(x).to_bits(), "x = {x}");
        x += 0.001_37;
        checked += 1;
    }
    assert!(checked > 100_000);
    for x in [f32::NEG_INFINITY, -1e30, 1e30, f32::INFINITY, f32::NAN] {
        let (got, want) = (sum(x), want(x));
        assert!(
            got == want || (got.is_nan() && want.is_nan()),
            "x = {x}: {got} {want}"
        );
    }
}

/// The fused normaliser-and-gather pass (dispatched, the AVX2 variant where the CPU
/// has it, the SSE2 one on x86-64) against plain loops: the same hits in order
/// (thresholds equal to values of the row included), the sum within 1e-6 of the f64
/// one and equal to the sum-only pass, `-inf` adding nothing, NaN, `+inf` and values
/// far above the reference making the sum non-finite.
#[test]
fn exp2_sum_collect_matches_the_plain_loops() {
    type Collect = fn(&[f32], f32, f32, u32, f32, &mut Vec<(u32, f32)>) -> f64;
    type Sum = fn(&[f32], f32, f32) -> f64;
    let mut variants: Vec<(&str, Collect, Sum)> = vec![
        (
            "dispatched",
            |z, c1, c0, base, thr, out| {
                exp2_sum_collect(z, (c1, c0), Terms::Precise, base, thr, out)
            },
            |z, c1, c0| exp2_sum(z, (c1, c0), Terms::Precise),
        ),
        (
            "dispatched coarse",
            |z, c1, c0, base, thr, out| {
                exp2_sum_collect(z, (c1, c0), Terms::Coarse, base, thr, out)
            },
            |z, c1, c0| exp2_sum(z, (c1, c0), Terms::Coarse),
        ),
    ];
    // the gathering pass and the sum-only pass of the kernel in module `$m`
    #[cfg(target_arch = "x86_64")]
    macro_rules! kernel {
        ($name:literal, $m:ident $(, $coarse:literal)?) => {
            (
                $name,
                // SAFETY: pushed only where this CPU runs module `$m`'s instructions
                // (AVX2 as detected; SSE2 is part of x86-64).
                |z, c1, c0, base, thr, out| unsafe {
                    $m::exp2_sum_collect::<true $(, $coarse)?>(z, c1, c0, base, thr, out)
                },
                // SAFETY: as above.
                |z, c1, c0| unsafe {
                    $m::exp2_sum_collect::<false $(, $coarse)?>(
                        z, c1, c0, 0, 0.0, &mut Vec::new()
                    )
                },
            )
        };
    }
    #[cfg(target_arch = "x86_64")]
    if matches!(detected(), Level::Avx512 | Level::Avx2) {
        variants.push(kernel!("avx2", avx2, false));
        variants.push(kernel!("avx2 coarse", avx2, true));
    }
    #[cfg(target_arch = "x86_64")]
    variants.push(kernel!("sse2", sse2, false));
    #[cfg(target_arch = "x86_64")]
    variants.push(kernel!("sse2 coarse", sse2, true));
    let (c1, c0) = (1.7f32, -3.1f32);
    for &(name, collect, sum_only) in &variants {
        for n in [0, 1, 15, 16, 17, 63, 64, 65, 1000, 1023, 1024, 1025, 4099] {
            let z: Vec<f32> = values(n, n as u64 + 11)
                .into_iter()
                .map(|x| {
                    if x.is_nan() || x == f32::INFINITY {
                        -2.5
                    } else {
                        x
                    }
                })
                .collect();
            let want_sum: f64 = z
                .iter()
                .map(|&x| (f64::from(x) * f64::from(c1) + f64::from(c0)).exp2())
                .sum();
            let thresholds = [f32::NEG_INFINITY, -2.5, 0.0, 1.5, 7.77, 9.5, f32::INFINITY];
            for thr in thresholds {
                let mut hits = vec![(0, 0.0)];
                let sum = collect(&z, c1, c0, 5, thr, &mut hits);
                let want: Vec<(u32, f32)> = std::iter::once((0, 0.0))
                    .chain(
                        z.iter()
                            .enumerate()
                            .filter(|(_, &x)| x >= thr)
                            .map(|(i, &x)| (5 + i as u32, x)),
                    )
                    .collect();
                assert_eq!(hits, want, "{name}: n={n} thr={thr}");
                // the exp's 2.5e-7 (coarse: 4e-6) plus a few roundings of the f32 sum
                // (the baseline variant adds in a different order than the vector
                // ones)
                let within = if name.ends_with("coarse") { 5e-6 } else { 1e-6 };
                assert!(
                    (sum - want_sum).abs() <= within * want_sum,
                    "{name}: n={n}: {sum} vs {want_sum}"
                );
                assert_eq!(sum, sum_only(&z, c1, c0), "{name}: n={n}");
            }
            let bad = [
                (f32::NAN, n / 2),
                (f32::INFINITY, n.saturating_sub(1)),
                (1e30, n / 3),
                // 2^w overflows without the value reaching 2^31 in units of 1/8
                (300.0, n / 4),
            ];
            for (bad, at) in bad {
                if n == 0 {
                    continue;
                }
                let mut z = z.clone();
                z[at] = bad;
                let mut hits = Vec::new();
                let sum = collect(&z, c1, c0, 0, 0.0, &mut hits);
                assert!(!sum.is_finite(), "{name}: n={n} {bad}");
                assert!(!sum_only(&z, c1, c0).is_finite(), "{name}: n={n} {bad}");
                let want = z.iter().filter(|&&x| x >= 0.0).count();
                assert_eq!(hits.len(), want, "{name}: n={n} {bad}");
            }
        }
    }
    // a NaN after a block's only hit, in the same lane of a later vector or nearby,
    // leaves the hit found
    for (name, collect, _) in &variants {
        for d in [1, 4, 8, 16, 32, 60] {
            let mut z = vec![-1.0f32; 128];
            z[3] = 2.0;
            z[3 + d] = f32::NAN;
            let mut hits = Vec::new();
            assert!(
                collect(&z, c1, c0, 0, 0.0, &mut hits).is_nan(),
                "{name}: d={d}"
            );
            assert_eq!(hits, [(3, 2.0)], "{name}: d={d}");
        }
    }
    // the generic loop (with and without FMA) agrees with the dispatched one
    let z: Vec<f32> = (0..3000).map(|i| (i % 97) as f32 * 0.3 - 20.0).collect();
    let fast = exp2_sum(&z, (c1, c0), Terms::Precise);
    for plain in [
        portable::exp2_sum::<false>(&z, c1, c0),
        portable::exp2_sum::<true>(&z, c1, c0),
    ] {
        assert!((plain - fast).abs() <= 3e-7 * fast, "{plain} vs {fast}");
    }
}

#[test]
fn candidate_weight_helpers_match_the_plain_loops() {
    for n in [0, 1, 17, 64, 100, 1000, 1025] {
        let z: Vec<f32> = values(n, n as u64 + 5)
            .into_iter()
            .map(|x| if x.is_finite() { x } else { 0.25 })
            .collect();
        let zmax = z.iter().copied().fold(f32::NEG_INFINITY, f32::max);
        let want_min = z.iter().copied().fold(f32::INFINITY, f32::min);
        assert_eq!(min(&z), want_min, "n={n}");
        let mut w = vec![0f32; n];
        exp_into(&z, zmax, 0.8, &mut w);
        for (&wi, &zi) in w.iter().zip(&z) {
            let want = f64::from((zi - zmax) * 0.8).exp();
            assert!(
                (f64::from(wi) - want).abs() <= 3e-7 * want,
                "{zi}: {wi} vs {want}"
            );
        }
        for thr in [f32::NEG_INFINITY, -3.0, 0.25, 9.0, f32::INFINITY] {
            let want: f64 = z
                .iter()
                .zip(&w)
                .filter(|(&zi, _)| zi >= thr)
                .map(|(_, &wi)| f64::from(wi))
                .sum();
            let got = mass_ge(&z, &w, thr);
            assert!(
                (got - want).abs() <= 1e-6 * want.max(1e-30),
                "n={n} thr={thr}"
            );
        }
    }
}

type Philox = fn(u32, u64, [u32; 2], &mut [u32; 128]);

/// Every variant this CPU can run, whatever `DECODA_ISA` says.
fn philox_variants() -> Vec<(&'static str, Philox)> {
    let mut v: Vec<(&'static str, Philox)> = vec![
        ("baseline", portable::philox_x32),
        ("dispatched", philox_x32),
    ];
    #[cfg(target_arch = "x86_64")]
    {
        if detected() == Level::Avx512 {
            // SAFETY: `detected()` found AVX-512 F.
            v.push(("avx512", |f, s, k, o| unsafe {
                avx512::philox_x32(f, s, k, o)
            }));
        }
        if detected() != Level::Base {
            // SAFETY: `detected()` found AVX2.
            v.push(("avx2", |f, s, k, o| unsafe { avx2::philox_x32(f, s, k, o) }));
        }
    }
    v
}

/// The chunks of a row: one per 128 tokens (the last one partial), each the words of
/// the scalar generator for its blocks.
#[test]
fn philox_chunks_are_the_rows_words() {
    let (seed, step) = (77u64, 5u64);
    let key = crate::philox::seed_key(seed);
    for v in [1, 127, 128, 129, 1000, 4096] {
        let mut seen = Vec::new();
        philox_chunks(v, step, key, |c, words| {
            for (j, &w) in words.iter().enumerate() {
                let t = (128 * c + j) as u32;
                assert_eq!(
                    w,
                    crate::philox::token_bits(seed, step, t),
                    "v {v} token {t}"
                );
            }
            seen.push(c);
        });
        assert_eq!(seen, (0..v.div_ceil(128)).collect::<Vec<_>>(), "v {v}");
    }
}

type Listed = fn(&[u32; 32], u64, [u32; 2], &mut [u32; 128]);

fn philox_listed_variants() -> Vec<(&'static str, Listed)> {
    let mut v: Vec<(&'static str, Listed)> = vec![
        ("baseline", portable::philox_listed),
        ("dispatched", philox_listed),
    ];
    #[cfg(target_arch = "x86_64")]
    {
        if detected() == Level::Avx512 {
            // SAFETY: `detected()` found AVX-512 F.
            v.push(("avx512", |b, s, k, o| unsafe {
                avx512::philox_listed(b, s, k, o)
            }));
        }
        if detected() != Level::Base {
            // SAFETY: `detected()` found AVX2.
            v.push(("avx2", |b, s, k, o| unsafe {
                avx2::philox_listed(b, s, k, o)
            }));
        }
    }
    v
}

/// Listed blocks (scattered, repeated, out of order, at both ends of the counter
/// range) get the scalar generator's words, in every variant.
#[test]
fn philox_listed_matches_the_scalar_generator() {
    let mut rng = 0x9e37_79b9_7f4a_7c15u64;
    let mut next = || {
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        rng
    };
    for (name, f) in philox_listed_variants() {
        for (seed, step) in [(0u64, 0u64), (42, 7), (u64::MAX, u64::MAX), (9, 1 << 40)] {
            let key = crate::philox::seed_key(seed);
            for case in 0..8 {
                let blocks: [u32; 32] = std::array::from_fn(|j| match (case, j % 4) {
                    (0, _) => j as u32,
                    (1, _) => 7,
                    (2, 0) => u32::MAX - j as u32,
                    (3, _) => (31 - j) as u32 * 1000,
                    _ => (next() >> 32) as u32 % (1 << 16),
                });
                let mut out = [0u32; 128];
                f(&blocks, step, key, &mut out);
                for (j, &b) in blocks.iter().enumerate() {
                    let want =
                        crate::philox::philox4x32_10([b, step as u32, (step >> 32) as u32, 0], key);
                    assert_eq!(
                        &out[4 * j..4 * j + 4],
                        &want[..],
                        "{name}: seed {seed} step {step} case {case} lane {j} block {b}"
                    );
                }
            }
        }
    }
}

#[test]
fn philox_x32_matches_the_scalar_generator() {
    for (name, f) in philox_variants() {
        for (seed, step, first) in [
            (0u64, 0u64, 0u32),
            (42, 7, 16),
            (u64::MAX, u64::MAX, 1 << 28),
            (0x1234_5678_9abc_def0, 3, 5),
            // blocks wrap past u32::MAX within one call
            (9, 1 << 40, u32::MAX - 5),
            // the last call whose blocks reach u32::MAX without wrapping, and the first
            // that wraps (AVX-512 adds round 1's products for the one, multiplies for
            // the other)
            (5, 1 << 33, u32::MAX - 31),
            (5, 1 << 33, u32::MAX - 30),
        ] {
            let key = crate::philox::seed_key(seed);
            let mut out = [0u32; 128];
            f(first, step, key, &mut out);
            for j in 0..32u32 {
                let b = first.wrapping_add(j);
                let want =
                    crate::philox::philox4x32_10([b, step as u32, (step >> 32) as u32, 0], key);
                assert_eq!(
                    &out[4 * j as usize..4 * j as usize + 4],
                    &want[..],
                    "{name}: seed {seed} step {step} block {b}"
                );
                if b < u32::MAX / 4 {
                    assert_eq!(
                        out[4 * j as usize + 2],
                        crate::philox::token_bits(seed, step, 4 * b + 2)
                    );
                }
            }
        }
    }
}

/// The lanes of the AVX-512 chunk: the words' maxima of `pairs_max` and the values'
/// maxima of `lane_max` hold exactly the tokens `word_lane` names, the pairs put in
/// token order are the row's words, and the lanes name every residue mod 32 once.
#[cfg(target_arch = "x86_64")]
#[test]
fn avx512_lanes_hold_the_tokens_they_name() {
    if detected() != Level::Avx512 {
        return;
    }
    let mut residues: Vec<usize> = (0..16).flat_map(avx512::word_lane).collect();
    residues.sort_unstable();
    assert_eq!(residues, (0..32).collect::<Vec<_>>());
    let tokens = |d: usize| -> Vec<usize> {
        (0..4)
            .flat_map(|h| avx512::word_lane(d).map(|r| 32 * h + r))
            .collect()
    };
    for (seed, step, first) in [(3u64, 0u64, 0u32), (99, 7, 64), (u64::MAX, 1 << 35, 4096)] {
        let key = crate::philox::seed_key(seed);
        // SAFETY: AVX-512 F was detected.
        let (top, out) = unsafe { avx512::words_and_top(first, step, key) };
        for (j, &w) in out.iter().enumerate() {
            let t = 4 * first + j as u32;
            assert_eq!(
                w,
                crate::philox::token_bits(seed, step, t),
                "seed {seed} token {t}"
            );
        }
        for (d, &t) in top.iter().enumerate() {
            let want = tokens(d).iter().map(|&j| out[j]).max().expect("tokens");
            assert_eq!(t, want, "seed {seed} lane {d}");
        }
    }
    for seed in 0..20u64 {
        let z: Vec<f32> = values(128, seed + 50)
            .into_iter()
            .map(|v| if v.is_finite() { v } else { 1.0 })
            .collect();
        let full = <&[f32; 128]>::try_from(&z[..]).expect("a chunk");
        // SAFETY: AVX-512 F and DQ were detected.
        let (m, flagged) = unsafe { avx512::lane_max(full) };
        assert!(!flagged, "seed {seed}");
        // SAFETY: sixteen f32 lanes are 64 bytes, as is the array.
        let m: [f32; 16] = unsafe { std::mem::transmute(m) };
        for (d, &md) in m.iter().enumerate() {
            let want = tokens(d)
                .into_iter()
                .map(|j| z[j])
                .fold(f32::NEG_INFINITY, f32::max);
            assert_eq!(md, want, "seed {seed} lane {d}");
        }
    }
}

/// The lanes of the AVX2 chunk: the words' maxima of `philox_top` and the values'
/// maxima of `lane_max` hold exactly the tokens their docs name, and the values' lanes
/// cover the words' (what the lane test needs).
#[cfg(target_arch = "x86_64")]
#[test]
fn avx2_lanes_hold_the_tokens_they_name() {
    if detected() == Level::Base {
        return;
    }
    let lanes = |v: std::arch::x86_64::__m256i| -> [u32; 8] {
        // SAFETY: a register of eight 32-bit lanes is 32 bytes, as is the array.
        unsafe { std::mem::transmute(v) }
    };
    // the tokens of the words' lane l: l, l + 4 (l < 4) or l + 4, l + 8, in every
    // chain of 16
    let word_lane = |l: usize| -> Vec<usize> {
        let r = if l < 4 { [l, l + 4] } else { [l + 4, l + 8] };
        (0..8).flat_map(|c| r.map(|r| 16 * c + r)).collect()
    };
    for (seed, first) in [(3u64, 0u32), (99, 64), (u64::MAX, 4096)] {
        let key = crate::philox::seed_key(seed);
        let mut out = [0u32; 128];
        // SAFETY: AVX2 was detected.
        let top = lanes(unsafe { avx2::philox_top(first, &avx2::row_keys(11, key), &mut out) });
        for (l, &t) in top.iter().enumerate() {
            let want = word_lane(l).iter().map(|&j| out[j]).max().expect("tokens");
            assert_eq!(t, want, "seed {seed} lane {l}");
        }
    }
    for seed in 0..20u64 {
        let z: Vec<f32> = values(128, seed + 50)
            .into_iter()
            .map(|v| if v.is_finite() { v } else { 1.0 })
            .collect();
        let full = <&[f32; 128]>::try_from(&z[..]).expect("a chunk");
        // SAFETY: AVX2 was detected.
        let (m, flagged) = unsafe { avx2::lane_max(full) };
        assert!(!flagged, "seed {seed}");
        // SAFETY: eight f32 lanes are 32 bytes, as is the array.
        let m: [f32; 8] = unsafe { std::mem::transmute(m) };
        for (l, &ml) in m.iter().enumerate() {
            let want = (0..128)
                .filter(|j| j % 4 == l % 4)
                .map(|j| z[j])
                .fold(f32::NEG_INFINITY, f32::max);
            assert_eq!(ml, want, "seed {seed} lane {l}");
            for j in word_lane(l) {
                assert!(j % 4 == l % 4, "lane {l} token {j}");
            }
        }
    }
}

#[test]
fn chunk_max_matches_every_variant() {
    for n in [0usize, 1, 127, 128] {
        for seed in 0..40u64 {
            let z = values(n, seed + 3);
            let bad = z.iter().any(|v| v.is_nan() || *v == f32::INFINITY);
            let want = z.iter().fold(f32::NEG_INFINITY, |a, &b| a.max(b));
            let mut got = vec![("baseline", portable::chunk_max(&z))];
            #[cfg(target_arch = "x86_64")]
            if let (Level::Avx512, Ok(full)) = (detected(), <&[f32; 128]>::try_from(&z[..])) {
                // SAFETY: `detected()` found AVX-512 F and DQ.
                let (m, flagged) = unsafe { avx512::lane_max(full) };
                // SAFETY: sixteen f32 lanes are 64 bytes, as is the array.
                let m: [f32; 16] = unsafe { std::mem::transmute(m) };
                let m = m.iter().fold(f32::NEG_INFINITY, |a, &b| a.max(b));
                got.push(("avx512 lanes", (m, flagged)));
            }
            #[cfg(target_arch = "x86_64")]
            if let (Level::Avx512 | Level::Avx2, Ok(full)) =
                (detected(), <&[f32; 128]>::try_from(&z[..]))
            {
                // SAFETY: `detected()` found AVX2 (implied by its AVX-512 level too).
                let (m, flagged) = unsafe { avx2::lane_max(full) };
                // SAFETY: eight f32 lanes are 32 bytes, as is the array.
                let m: [f32; 8] = unsafe { std::mem::transmute(m) };
                let m = m.iter().fold(f32::NEG_INFINITY, |a, &b| a.max(b));
                got.push(("avx2 lanes", (m, flagged)));
            }
            for (name, (m, flagged)) in got {
                // a NaN or +inf must be flagged (a flag without one is allowed)
                assert!(flagged || !bad, "{name} n={n} seed={seed}");
                if !flagged {
                    assert_eq!(m, want, "{name} n={n} seed={seed}");
                }
                assert_eq!(count_nonfinite(&z) > 0, bad);
            }
        }
    }
}

/// The per-token reach test: every variant gives the generic code's mask bit for bit
/// (full chunks, partial ones, `-inf` logits, leaders high and low, the pass-all
/// constants).
#[test]
fn gumbel_reach_variants_agree() {
    let mut rng = crate::testing::Rng::new(17);
    let key = crate::philox::seed_key(5);
    for case in 0..200u32 {
        let n = [128usize, 128, 77, 1][case as usize % 4];
        let mut words = [0u32; 128];
        philox_x32(case * 32, 3, key, &mut words);
        let z: Vec<f32> = (0..n)
            .map(|_| match rng.below(20) {
                0 => f32::NEG_INFINITY,
                _ => (rng.below(4000) as f32 - 2000.0) / 100.0,
            })
            .collect();
        let t = [0.05f32, 0.8, 1.0, 3.0][case as usize % 4];
        let floor = [-20.0f32, 0.0, 7.5, 25.0, f32::NEG_INFINITY][case as usize % 5];
        let (c0, c1) = crate::philox::gumbel_reach_consts(t, floor);
        let want = portable::gumbel_reach(&z, &words, c0, c1);
        assert_eq!(gumbel_reach(&z, &words, c0, c1), want, "case {case}");
        #[cfg(target_arch = "x86_64")]
        if let (true, Ok(full)) = (detected() != Level::Base, <&[f32; 128]>::try_from(&z[..])) {
            // SAFETY: `detected()` found AVX2.
            let got = unsafe { avx2::gumbel_reach(full, &words, c0, c1) };
            assert_eq!(got, want, "avx2 case {case}");
        }
        // the generic mask is the scalar test's, token by token
        for (j, &zj) in z.iter().enumerate() {
            let pass = zj >= crate::philox::gumbel_reach_threshold(words[j], c0, c1);
            assert_eq!(want >> j & 1 == 1, pass, "case {case} token {j}");
        }
    }
}

/// `gated_chunks` on every variant: a row far below the leader but for one token set
/// exactly at its own threshold, at every position of the row in turn (each lane of
/// each chunk, the partial last chunk): that token and no other is visited, with its
/// words, and the row's max comes back; a NaN stops the row; the pass-all constants
/// visit every finite token and no `-inf` one.
#[test]
fn gated_chunks_visits_every_token_that_passes() {
    type Gated = fn(&[f32], u64, [u32; 2], (f32, f32), &mut Vec<(u32, u32)>) -> Option<f32>;
    fn run(
        f: impl FnOnce(
            &[f32],
            &dyn Fn() -> (f32, f32),
            &mut dyn FnMut(usize, u128, &[u32; 128]),
        ) -> Option<f32>,
        z: &[f32],
        consts: (f32, f32),
        out: &mut Vec<(u32, u32)>,
    ) -> Option<f32> {
        f(z, &|| consts, &mut |c, mut m, words| {
            while m != 0 {
                let j = m.trailing_zeros() as usize;
                m &= m - 1;
                out.push(((128 * c + j) as u32, words[j]));
            }
        })
    }
    let mut variants: Vec<(&str, Gated)> = vec![
        ("dispatched", |z, s, k, r, o| {
            run(|z, r, v| gated_chunks(z, s, k, r, v), z, r, o)
        }),
        ("generic", |z, s, k, r, o| {
            run(
                |z, r, v| {
                    gated_chunks_scalar(z, r, v, portable::chunk_max, |b, out| {
                        portable::philox_x32(b, s, k, out);
                        portable::word_max_top15(out)
                    })
                },
                z,
                r,
                o,
            )
        }),
    ];
    #[cfg(target_arch = "x86_64")]
    if detected() == Level::Avx512 {
        variants.push(("avx512", |z, s, k, r, o| {
            // SAFETY: `detected()` found AVX-512 F and DQ.
            run(
                |z, r, v| unsafe { avx512::gated_chunks(z, s, k, r, v) },
                z,
                r,
                o,
            )
        }));
    }
    #[cfg(target_arch = "x86_64")]
    if detected() != Level::Base {
        variants.push(("avx2", |z, s, k, r, o| {
            // SAFETY: `detected()` found AVX2 and FMA.
            run(
                |z, r, v| unsafe { avx2::gated_chunks(z, s, k, r, v) },
                z,
                r,
                o,
            )
        }));
    }
    let (seed, step) = (0xfeed_u64, 9u64);
    let key = crate::philox::seed_key(seed);
    let consts = crate::philox::gumbel_reach_consts(1.0, 10.0);
    let thr = |i: usize| {
        let w = crate::philox::token_bits(seed, step, i as u32);
        (
            crate::philox::gumbel_reach_threshold(w, consts.0, consts.1),
            w,
        )
    };
    // 1,330 values: three triples of chunks (AVX-512 takes three at a time), a full
    // chunk and a partial one after them
    for (name, f) in &variants {
        let n = 1330;
        // every chunk could be lifted by its largest words (each value at the
        // threshold of the largest word there is), so triples are made whole; the
        // tokens that pass are exactly those the scalar test passes, winners set at
        // their own thresholds across the row among them
        let lift = crate::philox::gumbel_reach_threshold(u32::MAX, consts.0, consts.1);
        let mut z = vec![lift; n];
        for p in (0..n)
            .step_by(37)
            .chain([383, 384, 767, 1151, 1152, 1279, 1280, 1329])
        {
            z[p] = thr(p).0;
        }
        let want: Vec<(u32, u32)> = (0..n)
            .filter(|&i| z[i] >= thr(i).0)
            .map(|i| (i as u32, thr(i).1))
            .collect();
        assert!(want.len() >= 40, "{name}: {} winners", want.len());
        let mut seen = Vec::new();
        f(&z, step, key, consts, &mut seen);
        assert_eq!(seen, want, "{name}: whole triples");
    }
    for (name, f) in &variants {
        for n in [300, 1330] {
            for p in 0..n {
                let mut z = vec![-50.0f32; n];
                let w = crate::philox::token_bits(seed, step, p as u32);
                z[p] = crate::philox::gumbel_reach_threshold(w, consts.0, consts.1);
                let mut seen = Vec::new();
                let max = f(&z, step, key, consts, &mut seen);
                assert_eq!(seen, vec![(p as u32, w)], "{name}: token {p}");
                assert_eq!(max, Some(z[p]), "{name}: token {p}");
                // just below its threshold it is not visited
                z[p] = z[p].next_down();
                seen.clear();
                f(&z, step, key, consts, &mut seen);
                assert!(seen.is_empty(), "{name}: token {p} below");
            }
            let mut z: Vec<f32> = (0..n).map(|i| (i % 7) as f32).collect();
            z[5] = f32::NEG_INFINITY;
            z[200] = f32::NEG_INFINITY;
            let mut seen = Vec::new();
            let max = f(&z, step, key, (f32::MIN, 0.0), &mut seen);
            assert_eq!(max, Some(6.0), "{name}");
            let want: Vec<u32> = (0..n as u32).filter(|&i| i != 5 && i != 200).collect();
            assert_eq!(seen.iter().map(|s| s.0).collect::<Vec<_>>(), want, "{name}");
            for at in [150, n - 1, n / 2] {
                let mut zb = z.clone();
                zb[at] = f32::NAN;
                assert_eq!(
                    f(&zb, step, key, consts, &mut Vec::new()),
                    None,
                    "{name} {at}"
                );
            }
        }
    }
}

/// `exp_shifted` on every instruction set gives the contract's top-p weight
/// (`pipeline::weight`, i.e. `fmath::exp(y - ymax)`) bit for bit: one in 509 of all
/// bit patterns (NaN, infinities, subnormals, both signs) under shifts that move the
/// difference across the cut-offs, odd lengths for the vector tails.
#[test]
fn exp_shifted_is_the_contract_weight() {
    let run = |stride: u64| {
        let v: Vec<f32> = (0..=u64::from(u32::MAX))
            .step_by(stride as usize)
            .map(|b| f32::from_bits(b as u32))
            .chain([0.0, -0.0, -87.336_54, -87.336_55, 88.0, 88.000_01, 1e-45])
            .collect();
        for shift in [0.0f32, 1.5, -3.25, 40.0, f32::INFINITY] {
            let want: Vec<u32> = v
                .iter()
                .map(|&y| crate::pipeline::weight(y, shift).to_bits())
                .collect();
            for (name, f) in [
                ("dispatched", exp_shifted as fn(&mut [f32], f32)),
                ("baseline", portable::exp_shifted),
            ] {
                for len in [v.len(), 13] {
                    let mut got = v[..len].to_vec();
                    f(&mut got, shift);
                    for (j, g) in got.iter().enumerate() {
                        assert_eq!(
                            g.to_bits(),
                            want[j],
                            "{name}: y {:#x} shift {shift}",
                            v[j].to_bits()
                        );
                    }
                }
            }
        }
    };
    run(509);
}

/// [`exp_shifted_is_the_contract_weight`] over every f32 bit pattern (a minute or
/// more): `cargo test --release -p decoda --lib -- --ignored every_bit_pattern`.
#[test]
#[ignore = "exhaustive: about a minute per instruction set"]
fn exp_shifted_is_the_contract_weight_for_every_bit_pattern() {
    for shift in [0.0f32, 1.5] {
        let mut got = vec![0f32; 1 << 20];
        for start in (0..=u64::from(u32::MAX)).step_by(1 << 20) {
            for (j, g) in got.iter_mut().enumerate() {
                *g = f32::from_bits((start + j as u64) as u32);
            }
            exp_shifted(&mut got, shift);
            for (j, g) in got.iter().enumerate() {
                let y = f32::from_bits((start + j as u64) as u32);
                let want = crate::pipeline::weight(y, shift);
                assert_eq!(
                    g.to_bits(),
                    want.to_bits(),
                    "y {:#x} shift {shift}",
                    y.to_bits()
                );
            }
        }
    }
}

/// The bucket masses: every value in its bucket (`floor((ymax - z / t) scale)`, the
/// last one for everything lower, `-inf` included), each bucket's mass within 3e-7 of
/// the exact sum of `exp(y - ymax)`; and the gathering of a range of buckets, against
/// filters written out (ranges at the ends, single buckets, lengths off the chunk size).
#[test]
fn bucket_masses_and_gathering() {
    let mut rng = crate::testing::Rng::new(0x3c6e_f372_fe94_f82b);
    for (v, t) in [
        (131_072usize, 0.8f32),
        (1000, 1.0),
        (70_001, 2.5),
        (37, 0.3),
    ] {
        let mut z = crate::testing::zipf_logits(&mut rng, v.max(2), 1.1);
        z.truncate(v);
        z[v / 3] = f32::NEG_INFINITY;
        let ymax = z.iter().map(|&zi| zi / t).fold(f32::NEG_INFINITY, f32::max);
        let mut bucket = vec![0u16; v];
        let mut mass = vec![[0f64; 2]; 2048];
        mass_by_y(&z, t, ymax, 64.0, &mut bucket, &mut mass);
        let mut want = vec![0f64; 2048];
        for (i, &zi) in z.iter().enumerate() {
            let d = zi / t - ymax;
            let b = (-d * 64.0).clamp(0.0, 2047.0) as u16;
            assert_eq!(bucket[i], b, "v {v}, i {i}, z {zi}");
            want[b as usize] += f64::from(d.max(-87.0)).exp();
        }
        for (b, m) in mass.iter().enumerate() {
            let got = m[0] + m[1];
            assert!(
                (got - want[b]).abs() <= 3e-7 * want[b],
                "v {v}, bucket {b}: {got} vs {}",
                want[b]
            );
        }
        for (first, last) in [
            (0u16, 0u16),
            (0, 2047),
            (700, 701),
            (2047, 2047),
            (900, 990),
        ] {
            let mut got = Vec::new();
            collect_buckets(&bucket, first, last, &mut got);
            let want: Vec<u32> = (0..v as u32)
                .filter(|&i| (first..=last).contains(&bucket[i as usize]))
                .collect();
            assert_eq!(got, want, "v {v}, buckets {first}..={last}");
        }
    }
}

#[test]
fn exp_bulk_is_accurate() {
    let mut x = -87.0f32;
    while x < 87.0 {
        for got in [exp_bulk::<false>(x), exp_bulk::<true>(x)] {
            let want = f64::from(x).exp();
            assert!(
                ((f64::from(got) - want) / want).abs() < 3e-7,
                "x={x}: {got} vs {want}"
            );
        }
        x += 0.0113;
    }
    assert!(exp_bulk::<false>(f32::NEG_INFINITY) < 1e-37);
    assert!(exp_bulk::<true>(f32::NAN) < 1e-37);
    assert_eq!(exp_bulk::<false>(0.0), 1.0);
}

#[test]
fn exp_sum_is_accurate_on_every_level() {
    let z: Vec<f32> = (0..5000)
        .map(|i| -((i * 37 % 1009) as f32) / 40.0)
        .collect();
    let exact: f64 = z.iter().map(|&x| (f64::from(x) * 1.25).exp()).sum();
    let got = exp_sum(&z, 0.0, 1.25);
    assert!(
        ((got - exact) / exact).abs() < 5e-7,
        "{got} vs {exact} ({})",
        isa()
    );
    let base = portable::exp_sum::<false>(&z, 0.0, 1.25);
    assert!(((base - exact) / exact).abs() < 5e-7, "{base} vs {exact}");
}

#[test]
fn kernels_agree_with_scalar() {
    let z: Vec<f32> = (0..1000)
        .map(|i| ((i * 7919) % 1000) as f32 * 0.01 - 3.0)
        .collect();
    let (m, bad) = max_nonfinite(&z);
    assert_eq!(m, z.iter().copied().fold(f32::NEG_INFINITY, f32::max));
    assert_eq!(max(&z), m);
    assert_eq!(bad, 0);
    let mut w = z.clone();
    w[3] = f32::NAN;
    w[999] = f32::INFINITY;
    assert_eq!(max_nonfinite(&w).1, 2);
    let mut out = Vec::new();
    collect_ge(&z, 10, 6.0, &mut out);
    let want: Vec<(u32, f32)> = z
        .iter()
        .enumerate()
        .filter(|(_, &v)| v >= 6.0)
        .map(|(i, &v)| (i as u32 + 10, v))
        .collect();
    assert_eq!(out, want);
    let s = exp_sum(&z, m, 1.0);
    let s_ref: f64 = z.iter().map(|&v| f64::from(v - m).exp()).sum();
    assert!((s - s_ref).abs() / s_ref < 1e-6);
    let v = z[500];
    let r = count_rank(&z, v, 500);
    let r_ref = z
        .iter()
        .enumerate()
        .filter(|&(i, &x)| x > v || (x == v && i < 500))
        .count();
    assert_eq!(r as usize, r_ref);
}

/// The CPU's stage 0 against the contract's bit test, token by token, at every ISA
/// level this CPU has: rows off the word size, words all set, all clear and mixed, bits
/// past V set, NaN and infinities among the values (a disallowed one becomes `-inf`).
#[test]
fn mask_in_place_matches_the_bit_test() {
    for (case, v) in [1usize, 31, 32, 33, 1000, 4097, 151_936]
        .into_iter()
        .enumerate()
    {
        let x = values(v, case as u64 + 3);
        let mut bits = (case as u64 + 1).wrapping_mul(0x2545_f491_4f6c_dd1d);
        let mask: Vec<u32> = (0..v.div_ceil(32))
            .map(|w| {
                bits ^= bits << 13;
                bits ^= bits >> 7;
                bits ^= bits << 17;
                match w % 4 {
                    0 => u32::MAX,
                    1 => 0,
                    _ => bits as u32,
                }
            })
            .collect();
        let want: Vec<u32> = (0..v)
            .map(|i| {
                if mask[i / 32] >> (i % 32) & 1 == 1 {
                    x[i].to_bits()
                } else {
                    f32::NEG_INFINITY.to_bits()
                }
            })
            .collect();
        let mut got = x.clone();
        mask_in_place(&mut got, &mask);
        let got: Vec<u32> = got.iter().map(|e| e.to_bits()).collect();
        assert_eq!(got, want, "v {v}");
        let mut port = x.clone();
        portable::mask_in_place(&mut port, &mask);
        let port: Vec<u32> = port.iter().map(|e| e.to_bits()).collect();
        assert_eq!(port, want, "portable, v {v}");
    }
}
