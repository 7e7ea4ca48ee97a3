//! The weights and probabilities the filters share: `exp(y - ymax)` with decoda's
//! own `exp`, and a weight's probability under a total in f64.

/// The unnormalised top-p weight of a token: `exp(y - ymax)` in f32, with
/// [`crate::fmath::exp`] (the algorithm the device shaders use too).
#[inline]
pub fn weight(y: f32, ymax: f32) -> f32 {
    crate::fmath::exp(y - ymax)
}

/// The top-p probability of a token of weight `e` under total weight `sum`.
#[inline]
pub fn prob(e: f32, sum: f64) -> f32 {
    (f64::from(e) / sum) as f32
}

/// A candidate's probability over a set of total weight `sum`: `weight / sum` in f64
/// (the probabilities of stages 6a and 8a and of the kept distribution's walks).
#[inline]
pub fn prob64(w: f32, sum: f64) -> f64 {
    f64::from(w) / sum
}

/// The largest value still kept (`-inf` for none).
pub(crate) fn kept_max(y: &[f32], keep: &[bool]) -> f32 {
    (0..y.len())
        .filter(|&i| keep[i])
        .map(|i| y[i])
        .fold(f32::NEG_INFINITY, f32::max)
}
