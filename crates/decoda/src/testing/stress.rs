//! The stress run: many calls of random shapes, element types, entry points and
//! parameter mixes (the suite's [`MIXES`]: every stage of the contract but token masks,
//! with the kept distribution on a row in four, rows of every [`Style`]) against the
//! reference, counting
//! what differs instead of stopping at the first difference. A scheme that merges
//! across workgroups (the candidate list's atomics, a last-workgroup completion) can be
//! right in a thousand calls and wrong in the next: `decoda selftest --stress N` runs
//! this on any backend; `scripts/gpu/device_run.sh` asks a GPU for 10^6 calls within a
//! time limit.
//!
//! [`Style`]: super::shapes::Style
//! [`MIXES`]: super::shapes::MIXES

use super::shapes::{decode_batch, run_entry, Batch, Entry, DTYPES};
use super::{classify, Rng, Verdict};
use crate::backend::Backend;

/// Vocabulary sizes the run draws from: mostly the first [`STRESS_SMALL`] (many calls
/// a second), real vocabularies now and then.
pub const STRESS_VOCABS: &[usize] = &[
    17, 100, 256, 1000, 4099, 5000, 8192, 32_000, 50_257, 131_072, 151_936, 262_144,
];

/// How many of [`STRESS_VOCABS`] are the small ones three calls in four draw from.
pub const STRESS_SMALL: usize = 7;

/// Batch sizes the run draws from (a call holds at most [`STRESS_MAX_LOGITS`] logits).
pub const STRESS_BATCHES: &[usize] = &[1, 1, 1, 2, 3, 4, 8, 16, 64];

/// The most logits one call of the run holds (so that a large vocabulary comes with a
/// small batch).
pub const STRESS_MAX_LOGITS: usize = 1 << 21;

/// What a stress run counted.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct StressTally {
    /// Calls made.
    pub calls: usize,
    /// Calls the backend refused or failed (each one counts as a mismatch of its rows).
    pub failed_calls: usize,
    /// Row results (rows times draws) compared.
    pub results: usize,
    /// Identical to the reference.
    pub same: usize,
    /// Different on a floating-point tie the contract allows.
    pub allowed_ties: usize,
    /// Different from the reference otherwise.
    pub mismatches: usize,
    /// Tokens at or past the row's vocabulary (also counted as mismatches).
    pub out_of_range: usize,
}

impl StressTally {
    /// Whether the run found nothing wrong.
    pub fn clean(&self) -> bool {
        self.failed_calls == 0 && self.mismatches == 0 && self.out_of_range == 0
    }
}

/// One call's shape: (vocabulary, batch, element type index, entry).
fn draw_call(rng: &mut Rng) -> (usize, usize, usize, Entry) {
    // three in four calls at the small vocabularies
    let v = if rng.below(4) < 3 {
        STRESS_VOCABS[rng.below(STRESS_SMALL as u64) as usize]
    } else {
        let large = (STRESS_VOCABS.len() - STRESS_SMALL) as u64;
        STRESS_VOCABS[STRESS_SMALL + rng.below(large) as usize]
    };
    let mut b = STRESS_BATCHES[rng.below(STRESS_BATCHES.len() as u64) as usize];
    while b > 1 && b * v > STRESS_MAX_LOGITS {
        b /= 2;
    }
    let dtype = rng.below(DTYPES.len() as u64) as usize;
    let entry = match rng.below(4) {
        0 | 1 => Entry::Sample,
        k => Entry::Draws(if k == 2 { 1 } else { 2 + rng.below(3) as usize }),
    };
    (v, b, dtype, entry)
}

/// `calls` calls (fewer if `until` passes first) on one long-lived backend from `make`
/// (and on a fresh one every 64th call), each of a random shape, element type, entry
/// point (`sample`, `sample_draws` of 1 to 4 draws) and rows of mixed styles and
/// parameters, against the reference. `progress` is told (calls so far, the tally)
/// every 100 calls and at the end; `detail` describes the first eight differences
/// (a failed call, a result unlike the reference's, rows or draws missing or extra).
pub fn stress(
    make: &dyn Fn() -> Result<Box<dyn Backend>, String>,
    calls: usize,
    seed: u64,
    until: Option<std::time::Instant>,
    mut progress: impl FnMut(usize, &StressTally),
    mut detail: impl FnMut(&str),
) -> Result<StressTally, String> {
    let mut rng = Rng::new(seed);
    let mut tally = StressTally::default();
    let long = make()?;
    let mut described = 0usize;
    for n in 0..calls {
        let (v, b, dt, entry) = draw_call(&mut rng);
        let salt = rng.below(1 << 20) as usize;
        let mut batch = Batch::new(decode_batch(&mut rng, v, b, salt), DTYPES[dt]);
        // a row in four asks for its kept distribution too (the device finds it from
        // the candidates, or over the row's pieces with atomics: a merge to stress)
        for req in &mut batch.requests {
            if rng.below(4) == 0 {
                req.params.kept = Some([1, 5, 64, 1024][rng.below(4) as usize]);
            }
        }
        let want = batch.expected(entry);
        let fresh;
        let backend: &dyn Backend = if n % 64 == 63 {
            fresh = make()?;
            fresh.as_ref()
        } else {
            long.as_ref()
        };
        tally.calls += 1;
        let label = format!("call {n}: V={v} B={b} {} {entry:?}", DTYPES[dt]);
        let mut describe = |what: String| {
            if described < 8 {
                described += 1;
                detail(&what);
            }
        };
        let asked = b * entry.steps();
        match run_entry(backend, &batch, entry) {
            Err(e) => {
                tally.failed_calls += 1;
                tally.results += asked;
                tally.mismatches += asked;
                describe(format!("{label}: the call failed: {e}"));
            }
            Ok(got) => {
                let mut compared = 0;
                for (r, (g, w)) in got.iter().zip(&want).enumerate() {
                    for (d, (gr, (wr, tie))) in g.iter().zip(w).enumerate() {
                        compared += 1;
                        let oob = gr.as_ref().is_ok_and(|s| s.token as usize >= v);
                        let verdict = if oob {
                            tally.out_of_range += 1;
                            Verdict::Mismatch
                        } else {
                            classify(gr, wr, tie)
                        };
                        match verdict {
                            Verdict::Same { .. } => tally.same += 1,
                            Verdict::AllowedTie => tally.allowed_ties += 1,
                            Verdict::Mismatch => {
                                tally.mismatches += 1;
                                let req = &batch.requests[r];
                                describe(format!(
                                    "{label} row {r} draw {d}: got {gr:?}, reference {wr:?} \
                                     (params {:?}; seed {} step {})",
                                    req.params, req.state.seed, req.state.step
                                ));
                            }
                        }
                    }
                    if g.len() != w.len() {
                        describe(format!(
                            "{label} row {r}: {} draws back, {} asked",
                            g.len(),
                            w.len()
                        ));
                    }
                }
                if got.len() != want.len() {
                    describe(format!(
                        "{label}: {} rows back, {} sent",
                        got.len(),
                        want.len()
                    ));
                }
                // what the answer lacks, or holds beyond what was asked: each a mismatch
                let returned: usize = got.iter().map(|g| g.len()).sum();
                let off = asked.abs_diff(compared) + returned.abs_diff(compared);
                tally.results += compared + off;
                tally.mismatches += off;
            }
        }
        let out_of_time = until.is_some_and(|t| std::time::Instant::now() >= t);
        if (n + 1) % 100 == 0 || n + 1 == calls || out_of_time {
            progress(n + 1, &tally);
        }
        if out_of_time {
            break;
        }
    }
    Ok(tally)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::Result;
    use crate::logits::Logits;
    use crate::pipeline::{Row, RowResult};
    use crate::CpuSampler;
    use std::sync::atomic::{AtomicUsize, Ordering};

    /// The CPU sampler with defects: every 7th call's first row comes back as token V
    /// (out of range), every 5th call's last row as another id, every 11th call fails.
    struct Faulty {
        inner: CpuSampler,
        calls: AtomicUsize,
    }

    impl Backend for Faulty {
        fn name(&self) -> String {
            "faulty".into()
        }

        fn masks_rows(&self) -> bool {
            self.inner.masks_rows()
        }

        fn sample_rows(&self, logits: &Logits<'_>, rows: &[Row<'_>]) -> Result<Vec<RowResult>> {
            let n = self.calls.fetch_add(1, Ordering::Relaxed);
            if n % 11 == 10 {
                return Err(crate::Error::Device("a failing call".into()));
            }
            let mut out = self.inner.sample_rows(logits, rows)?;
            let v = logits.vocab() as u32;
            if n % 7 == 6 {
                if let Some(Ok(s)) = out.first_mut() {
                    s.token = v;
                }
            }
            if n % 5 == 4 && v > 1 {
                if let Some(Ok(s)) = out.last_mut() {
                    s.token = (s.token + 1) % v;
                }
            }
            Ok(out)
        }
    }

    #[test]
    fn a_sound_backend_runs_clean() {
        let make = || Ok(Box::new(CpuSampler::new()) as Box<dyn Backend>);
        let t = stress(&make, 40, 3, None, |_, _| {}, |d| panic!("{d}")).unwrap();
        assert!(t.clean(), "{t:?}");
        assert_eq!(t.calls, 40);
        assert_eq!(t.same + t.allowed_ties, t.results);
    }

    #[test]
    fn a_faulty_backend_is_counted() {
        let make = || {
            Ok(Box::new(Faulty {
                inner: CpuSampler::new(),
                calls: AtomicUsize::new(0),
            }) as Box<dyn Backend>)
        };
        let mut described = 0;
        let t = stress(&make, 40, 3, None, |_, _| {}, |_| described += 1).unwrap();
        assert!(!t.clean());
        assert!(t.out_of_range > 0 && t.failed_calls > 0, "{t:?}");
        assert!(t.mismatches > t.out_of_range, "{t:?}");
        assert_eq!(t.same + t.allowed_ties + t.mismatches, t.results, "{t:?}");
        assert!(described > 0 && described <= 8);
    }

    #[test]
    fn a_time_limit_stops_the_run() {
        let make = || Ok(Box::new(CpuSampler::new()) as Box<dyn Backend>);
        let mut last = 0;
        let past = std::time::Instant::now();
        let t = stress(&make, 1000, 3, Some(past), |n, _| last = n, |_| {}).unwrap();
        assert_eq!((t.calls, last), (1, 1), "{t:?}");
    }
}
