//! Stage 6, top-k: keep the `k` largest `y` (ties at the k-th value kept). Backends find
//! the k-th value by selection (the CPU's sampled thresholds, the device's radix walk);
//! the reference sorts.

/// Stage 6: keeps `y >=` the k-th largest value (ties kept); returns that value.
pub(crate) fn apply(y: &[f32], k: usize, keep: &mut [bool]) -> f32 {
    let mut sorted = y.to_vec();
    sorted.sort_by(|a, b| b.total_cmp(a));
    let tau = sorted[k - 1];
    for (kp, &yi) in keep.iter_mut().zip(y) {
        *kp = *kp && yi >= tau;
    }
    tau
}
