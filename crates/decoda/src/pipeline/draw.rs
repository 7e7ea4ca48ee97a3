//! Stage 10, the draw: Gumbel-max over the kept set, the noise a pure function of
//! (seed, step, token id) from [`crate::philox`], so the draw is an argmax that any
//! backend computes the same.

use crate::philox::gumbel;

/// Stage 10 as the reference runs it: the Gumbel draw over the kept tokens, the
/// largest `s = y + g(seed, step, id)` (the first such id on a tie). Returns the token,
/// its `s` and the runner-up's `s` (`-inf` without one).
pub(crate) fn apply(y: &[f32], keep: &[bool], seed: u64, step: u64) -> Option<(u32, f32, f32)> {
    let mut best: Option<(u32, f32)> = None;
    let mut runner_up = f32::NEG_INFINITY;
    for (i, &yi) in y.iter().enumerate() {
        if !keep[i] {
            continue;
        }
        let s = yi + gumbel(seed, step, i as u32);
        match best {
            Some((_, bs)) if s <= bs => runner_up = runner_up.max(s),
            _ => {
                if let Some((_, bs)) = best {
                    runner_up = runner_up.max(bs);
                }
                best = Some((i as u32, s));
            }
        }
    }
    best.map(|(token, s)| (token, s, runner_up))
}
