//! Stage 7, top-p: the nucleus, the fewest tokens (by decreasing probability) whose
//! mass reaches `p`, the sum walked in f64.

use super::weights::{prob, weight};

/// The walk of stage 7: `q` sorted in decreasing order; returns `τp`, the q of the m-th
/// token where m is the fewest tokens whose q sum (in f64) reaches `p`, together with the
/// distance of the cumulative sum to `p` at the decision (for counting floating-point
/// ties). If the sum never reaches `p` (rounding), every token is kept.
pub fn top_p_cut(q_desc: impl IntoIterator<Item = f32>, p: f32) -> (f32, f64) {
    let mut walk = TopPWalk::new(p);
    for q in q_desc {
        if let Some(tau) = walk.step(q) {
            return (tau, walk.margin());
        }
    }
    (walk.end(), walk.margin())
}

/// The walk of [`top_p_cut`] one value at a time, for callers that sort `q` piece by piece.
#[derive(Clone, Copy, Debug)]
pub struct TopPWalk {
    p64: f64,
    cum: f64,
    last: f32,
    margin: f64,
}

impl TopPWalk {
    /// A walk towards `p`.
    pub fn new(p: f32) -> Self {
        Self {
            p64: f64::from(p),
            cum: 0.0,
            last: f32::NEG_INFINITY,
            margin: f64::INFINITY,
        }
    }

    /// A walk towards `p` that has already added values of total `mass` (less than `p`)
    /// without walking them one by one.
    pub fn after(p: f32, mass: f64) -> Self {
        let mut walk = Self::new(p);
        walk.cum = mass;
        walk.margin = (mass - walk.p64).abs();
        walk
    }

    /// Adds the next value (in decreasing order); `Some(τp)` when the sum reaches `p`.
    #[inline]
    pub fn step(&mut self, q: f32) -> Option<f32> {
        let before = self.cum;
        self.cum += f64::from(q);
        self.last = q;
        self.margin = self
            .margin
            .min((self.cum - self.p64).abs())
            .min((before - self.p64).abs());
        (self.cum >= self.p64).then_some(q)
    }

    /// `τp` when every value was added without reaching `p`: keep everything.
    pub fn end(&self) -> f32 {
        self.last.min(0.0)
    }

    /// Smallest distance of the cumulative sum to `p` seen so far.
    pub fn margin(&self) -> f64 {
        self.margin
    }
}

/// Stage 7 over the kept tokens; returns the walk's distance to `p` (for tie counting).
pub(crate) fn apply(y: &[f32], ymax: f32, p: f32, keep: &mut [bool]) -> f64 {
    let v = y.len();
    let sum: f64 = (0..v)
        .filter(|&i| keep[i])
        .map(|i| f64::from(weight(y[i], ymax)))
        .sum();
    let q: Vec<f32> = y.iter().map(|&yi| prob(weight(yi, ymax), sum)).collect();
    let mut in_k: Vec<f32> = (0..v).filter(|&i| keep[i]).map(|i| q[i]).collect();
    in_k.sort_by(|a, b| b.total_cmp(a));
    let (tau, margin) = top_p_cut(in_k, p);
    for (kp, &qi) in keep.iter_mut().zip(&q) {
        *kp = *kp && qi >= tau;
    }
    margin
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn top_p_walk() {
        let (tau, _) = top_p_cut([0.5, 0.3, 0.2], 0.8);
        assert_eq!(tau, 0.3);
        let (tau, _) = top_p_cut([0.5, 0.3, 0.2], 0.81);
        assert_eq!(tau, 0.2);
        let (tau, _) = top_p_cut([0.5, 0.3, 0.2], 0.5);
        assert_eq!(tau, 0.5);
    }
}
