//! Stages 4-5: greedy rows (the temperature floor and overflow) and the division by
//! the temperature, with the bound that lets a backend select in unscaled space.

/// Whether a row is drawn greedily: `T < 1e-5`, or `zmax / T` is not finite.
pub fn is_greedy(temperature: f32, zmax: f32) -> bool {
    temperature < crate::params::GREEDY_TEMPERATURE || !(zmax / temperature).is_finite()
}

/// A value `zl` such that every `z < zl` has `fl(z / t) < tau` (round to nearest): the
/// bound below which a token cannot pass a threshold `tau` in temperature-scaled space.
/// Lets a backend select in unscaled space and divide only the few tokens near the top.
pub fn z_lower_bound(tau: f32, t: f32) -> f32 {
    if tau == f32::NEG_INFINITY {
        return f32::NEG_INFINITY;
    }
    let m = f64::from(tau) * f64::from(t); // exact: 24 + 24 bits
    let margin = m.abs() * 2f64.powi(-21) + f64::from(t) * 2f64.powi(-148);
    let zl = m - margin;
    let mut f = zl as f32;
    if f64::from(f) > zl {
        f = f.next_down();
    }
    f
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn z_lower_bound_is_safe_and_tight() {
        let mut state = 0x1234_5678_u64;
        let mut next = || {
            state = state
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            (state >> 33) as u32
        };
        for _ in 0..20000 {
            let t = [0.3f32, 0.7, 1.0, 1.3, 2.0, 1e-4, 77.0][next() as usize % 7];
            let z = (next() as f32 / u32::MAX as f32 - 0.5) * 200.0;
            let tau = z / t;
            let zl = z_lower_bound(tau, t);
            assert!(zl <= z, "bound above a passing value");
            // just below the bound nothing passes
            let below = zl.next_down();
            assert!(below / t < tau, "z={z} t={t}");
            // and the bound is close (within a few ulps relative)
            assert!((z - zl).abs() <= z.abs() * 1e-5 + 1e-30);
        }
    }
}
