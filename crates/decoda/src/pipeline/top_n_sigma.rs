//! Stage 5a, top-n-σ: keep `y >= ymax - n σ` over the finite values.

/// Stage 5a, top-n-σ: the threshold `ymax - n * σ` (f64) over the finite values `ys`,
/// `σ` their population standard deviation (mean, then mean squared deviation, in f64).
pub fn top_n_sigma_threshold(ys: &[f32], ymax: f32, n: f32) -> f64 {
    let finite = || {
        ys.iter()
            .filter(|y| **y > f32::NEG_INFINITY)
            .map(|&y| f64::from(y))
    };
    // the count and the sum in one pass (the sum's additions in id order, as two passes)
    let (count, sum) = finite().fold((0usize, 0.0f64), |(c, s), y| (c + 1, s + y));
    if count == 0 {
        return f64::NEG_INFINITY;
    }
    let mean = sum / count as f64;
    let var = finite().map(|y| (y - mean) * (y - mean)).sum::<f64>() / count as f64;
    f64::from(ymax) - f64::from(n) * var.sqrt()
}

/// Stage 5a: keeps `y >= ymax - n * σ` over the finite values (f64); returns the threshold.
pub(crate) fn apply(y: &[f32], ymax: f32, n: f32, keep: &mut [bool]) -> f64 {
    let tau = top_n_sigma_threshold(y, ymax, n);
    for (kp, &yi) in keep.iter_mut().zip(y) {
        *kp = *kp && f64::from(yi) >= tau;
    }
    tau
}

/// The smallest distance of a finite `y` to top-n-σ's threshold `tau`, relative to
/// `|ymax| + n σ` (`n σ = ymax - tau`).
pub(crate) fn margin(y: &[f32], ymax: f32, tau: f64) -> f64 {
    let scale = f64::from(ymax).abs() + (f64::from(ymax) - tau);
    y.iter()
        .filter(|v| **v > f32::NEG_INFINITY)
        .map(|&v| (f64::from(v) - tau).abs())
        .fold(f64::INFINITY, f64::min)
        / scale
}
