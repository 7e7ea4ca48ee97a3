//! Stage 8, min-p: keep `y >= ymax + ln(min_p)`.

/// The min-p threshold in scaled space: `ymax + ln(min_p)` (`-inf` when `min_p = 0`).
pub fn min_p_threshold(ymax: f32, min_p: f32) -> f32 {
    if min_p > 0.0 {
        ymax + min_p.ln()
    } else {
        f32::NEG_INFINITY
    }
}

/// Stage 8: keeps `y >= ymax + ln(min_p)` (nothing removed when `min_p = 0`).
pub(crate) fn apply(y: &[f32], ymax: f32, min_p: f32, keep: &mut [bool]) {
    let tau = min_p_threshold(ymax, min_p);
    for (kp, &yi) in keep.iter_mut().zip(y) {
        *kp = *kp && yi >= tau;
    }
}
