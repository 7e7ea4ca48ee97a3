//! Stage 6, top-k: keep the `k` largest `y` (ties at the k-th value kept). Backends find
//! the k-th value by selection (the CPU's sampled thresholds, the device's radix walk);
//! the reference selects it from the row in decreasing order (the value a sort would
//! put k-th).

/// Stage 6: keeps `y >=` the k-th largest value (ties kept); returns that value.
pub(crate) fn apply(y: &[f32], k: usize, keep: &mut [bool]) -> f32 {
    let mut order = y.to_vec();
    let (_, &mut tau, _) = order.select_nth_unstable_by(k - 1, |a, b| b.total_cmp(a));
    for (kp, &yi) in keep.iter_mut().zip(y) {
        *kp = *kp && yi >= tau;
    }
    tau
}
