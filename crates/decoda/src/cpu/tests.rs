use super::draw::{draw, draw_whole_row, wide_draw, WIDE_DRAW};
use super::kernels::Terms;
use super::scratch::Scratch;
use super::select::sampled_threshold;
use super::top_p::{
    first_top_p_list, rest_error, sampled_retry, top_p_candidates, top_p_peel, top_p_scan,
    top_p_walk, wide_top_p, TopPScan, TOP_P_CAP, TOP_P_WIDE,
};
use crate::philox;
use crate::pipeline as pl;

/// The whole-row draw (gates, skipped chunks, vector Philox) against every token's
/// exact noise: the same token on rows with winners anywhere, plateaus of ties, a few
/// spikes far above the rest (most chunks skipped), lengths off the chunk size.
#[test]
fn whole_row_draw_matches_every_token_drawn() {
    let mut rng = crate::testing::Rng::new(0x9e37_79b9_7f4a_7c15u64);
    let mut next = move || rng.next_u64();
    for case in 0..300u64 {
        let v = [1usize, 5, 127, 128, 129, 1000, 4099, 32000, 65536][case as usize % 9];
        let style = case % 4;
        let z: Vec<f32> = (0..v)
            .map(|_| {
                let u = (next() >> 40) as f32 / (1u64 << 24) as f32;
                match style {
                    0 => 12.0 * u,
                    1 => (8.0 * u).floor(),
                    2 if next() % 500 == 0 => 40.0 + u,
                    2 => u,
                    _ => -30.0 * u * u,
                }
            })
            .collect();
        let t = [0.05f32, 0.7, 1.0, 3.0][(case / 4) as usize % 4];
        let (seed, step) = (next(), next() % 1000);
        let mut want = (0u32, f32::NEG_INFINITY);
        for (i, &zi) in z.iter().enumerate() {
            let s = zi / t + philox::gumbel(seed, step, i as u32);
            if s > want.1 {
                want = (i as u32, s);
            }
        }
        let one_pass = match draw_whole_row(&z, t, seed, step) {
            Some(Ok(s)) => s.token,
            other => panic!("case {case}: {other:?}"),
        };
        assert_eq!(
            one_pass, want.0,
            "one pass, case {case}: v {v} style {style} t {t}"
        );
    }
}

/// Plain temperature rows through the one-pass draw against the reference: NaN and
/// `+inf` anywhere (counted), `-inf` tokens, rows of only `-inf`, `max / T` overflow
/// (greedy), sums that overflow without any non-finite value, lengths off the chunk.
#[test]
fn one_pass_draw_edge_rows_match_the_reference() {
    use crate::params::{Request, SamplingParams};
    let mut rng = crate::testing::Rng::new(0x51_7cc1_b727_220au64);
    let mut next = move || rng.next_u64();
    for case in 0..400u64 {
        let v = [1usize, 7, 128, 130, 300, 1024, 5000][case as usize % 7];
        let mut z: Vec<f32> = (0..v)
            .map(|_| (next() % 2000) as f32 / 100.0 - 10.0)
            .collect();
        let at = (next() % v as u64) as usize;
        match case % 8 {
            0 => z[at] = f32::NAN,
            1 => z[at] = f32::INFINITY,
            2 => z.iter_mut().for_each(|v| *v = f32::NEG_INFINITY),
            3 => z.iter_mut().step_by(3).for_each(|v| *v = f32::NEG_INFINITY),
            4 => z[at] = 3.0e38,
            5 => z.iter_mut().for_each(|v| *v = 3.0e38 * v.signum()),
            6 => {
                z[at] = f32::NAN;
                let b = (next() % v as u64) as usize;
                z[b] = f32::INFINITY;
            }
            _ => {}
        }
        let t = [1e-3f32, 0.7, 1.0, 2.5][(case / 8) as usize % 4];
        let req = Request::new(
            SamplingParams {
                temperature: t,
                ..Default::default()
            },
            next(),
        );
        let want = crate::reference::reference_row(&z, &req).0;
        let got = super::sample_row_f32(&z, &req);
        assert_eq!(got, want, "case {case}: v {v} t {t}");
    }
}

/// Kept sets of tens of thousands of tokens (top-p 0.95-0.99 on flat rows, a small
/// min-p, a large top-k, with and without penalties): the pruned walk, the row's draw
/// above the smallest kept `y` and the token-by-token draw of a changed top-k all
/// match the reference, with logprobs.
#[test]
fn wide_kept_sets_match_the_reference() {
    use crate::params::{Request, SamplingParams};
    let mut rng = crate::testing::Rng::new(0x9e37_79b9_7f4a_7c15u64);
    let mut next = move || rng.next_u64();
    for case in 0..24u64 {
        let v = [65536usize, 131072, 40000][case as usize % 3];
        // flat rows: a gentle slope plus noise, many near-equal values
        let z: Vec<f32> = (0..v)
            .map(|_| {
                let u = (next() >> 40) as f32 / (1u64 << 24) as f32;
                -2.0 * u.ln().max(-20.0).abs().sqrt() + [0.0, 0.5][(next() % 2) as usize]
            })
            .collect();
        let mut params = SamplingParams {
            temperature: [1.0f32, 2.0, 0.7][(case % 3) as usize],
            ..Default::default()
        };
        match case % 4 {
            0 => params.top_p = [0.99, 0.95][(case / 4) as usize % 2],
            1 => params.min_p = 1e-4,
            2 => params.top_k = 20_000,
            _ => {
                params.top_k = 20_000;
                params.top_p = 0.97;
                params.repetition_penalty = 1.3;
            }
        }
        params.logprobs = (case % 2 == 0).then_some(3);
        let mut req = Request::new(params, next());
        req.state.step = next() % 1000;
        req.state.output = (0..64).map(|_| (next() % v as u64) as u32).collect();
        let want = crate::reference::reference_row(&z, &req).0;
        let got = super::sample_row_f32(&z, &req);
        assert_eq!(got, want, "case {case}: v {v}");
    }
}

/// The smallest `y` of the reference's top-p kept set over the whole row, and the
/// reference walk's distance to `p` (for its ties).
fn reference_top_p_edge(y: &[f32], ymax: f32, p: f32) -> (f32, f64) {
    let mut keep = vec![true; y.len()];
    let margin = crate::pipeline::top_p::apply(y, ymax, p, &mut keep);
    let edge = y
        .iter()
        .zip(&keep)
        .filter(|(_, &k)| k)
        .fold(f32::INFINITY, |m, (&yi, _)| m.min(yi));
    (edge, margin)
}

/// The wide nucleus from bucket masses against the reference's stage 7 over the whole
/// row (every weight the contract's, summed in order): the same smallest kept `y` except
/// where the reference's cumulative sum comes within `1e-6` of `p` (a tie the contract
/// allows), on Zipf rows of several slopes and temperatures, rows with banned tokens
/// and rows of coarse, tied values; most of them must take this way.
#[test]
fn wide_nucleus_matches_the_exact_walk() {
    let mut rng = crate::testing::Rng::new(0x5851_f42d_4c95_7f2d);
    let (mut taken, mut ties, mut cases) = (0, 0, 0);
    for case in 0..48usize {
        let v = [131_072usize, 32_000, 151_936][case % 3];
        let mut z = crate::testing::zipf_logits(&mut rng, v, [1.1, 0.9, 1.3][case / 3 % 3]);
        if case % 5 == 1 {
            for i in (0..v).step_by(37) {
                z[i] = f32::NEG_INFINITY;
            }
        }
        if case % 4 == 2 {
            for zi in &mut z {
                *zi = (*zi * 8.0).round() / 8.0;
            }
        }
        for (p, t) in [(0.99f32, 0.8f32), (0.95, 1.0), (0.999, 1.3), (0.9, 2.0)] {
            cases += 1;
            let y: Vec<f32> = z.iter().map(|&zi| zi / t).collect();
            let ymax = y.iter().copied().fold(f32::NEG_INFINITY, f32::max);
            let (want, margin) = reference_top_p_edge(&y, ymax, p);
            let mut s = Scratch::default();
            let Some(got) = wide_top_p(&z, t, ymax, p, &mut s) else {
                continue;
            };
            taken += 1;
            if got != want {
                assert!(
                    margin <= 1e-6,
                    "case {case}, p {p}, T {t}: y {got} vs {want}, margin {margin}"
                );
                ties += 1;
            }
        }
    }
    assert!(
        taken * 4 >= cases * 3,
        "{taken} of {cases} rows took the bucket way"
    );
    assert!(ties * 20 <= taken, "{ties} ties in {taken} rows");
}

/// The sample's guess of the nucleus ([`sampled_retry`]) on Zipf rows of three
/// vocabularies, slopes and temperatures, nuclei from about 500 to 60,000 tokens:
/// within a factor of 1.5 of the reference's count on nine rows in ten, and its
/// threshold gathers the whole nucleus (or a list at the cap) on 19 rows in 20 (a
/// guess far off sends rows down a slower route, never to a different token).
#[test]
fn sampled_retry_guesses_the_nucleus() {
    let mut rng = crate::testing::Rng::new(0x9e37_79b9_7f4a_7c15);
    let (mut close, mut held, mut rows) = (0, 0, 0);
    for case in 0..27usize {
        let v = [131_072usize, 32_000, 151_936][case % 3];
        let slope = [1.1f32, 0.9, 1.3][case / 3 % 3];
        let t = [0.8f32, 1.0, 0.6][case / 9];
        let z = crate::testing::zipf_logits(&mut rng, v, slope);
        let zmax = z.iter().copied().fold(f32::NEG_INFINITY, f32::max);
        let (zthr, _) = sampled_threshold(&z, 512, &mut Vec::new());
        let weight = |zi: f32| f64::from(((zi - zmax) / t).exp());
        let have: f64 = z
            .iter()
            .filter(|&&zi| zi >= zthr)
            .map(|&zi| weight(zi))
            .sum();
        let n = z.iter().filter(|&&zi| zi >= zthr).count();
        let y: Vec<f32> = z.iter().map(|&zi| zi / t).collect();
        let ymax = zmax / t;
        for p in [0.95f32, 0.97, 0.98, 0.99] {
            let mut keep = vec![true; v];
            crate::pipeline::top_p::apply(&y, ymax, p, &mut keep);
            let truth = keep.iter().filter(|&&k| k).count();
            if truth <= n {
                continue;
            }
            let mut tmp = Vec::new();
            let (m, zt) = sampled_retry(&z, (zmax, zthr, t), (p, have), n, 1, &mut tmp)
                .expect("a long row with tokens below the threshold");
            rows += 1;
            close += usize::from(m * 3 >= truth * 2 && m * 2 <= truth * 3);
            let gathered = z.iter().filter(|&&zi| zi >= zt).count();
            if m > TOP_P_WIDE {
                // the whole row at once: right when no list of the cap would do
                held += usize::from(truth > TOP_P_CAP / 2);
            } else {
                held += usize::from(gathered >= truth);
            }
        }
    }
    assert!(rows >= 60, "{rows} rows");
    assert!(
        held * 20 >= rows * 19,
        "the first retry holds the nucleus on {held} of {rows} rows"
    );
    assert!(
        close * 10 >= rows * 9,
        "{close} of {rows} guesses within 1.5x"
    );
}

/// Top-k with penalties where the history holds the row's largest tokens (all of the
/// top k, some of them, none), so the gathering that skips changed tokens must reach
/// below them or fall back to a full pass: the same token as the reference.
#[test]
fn top_k_with_history_at_the_top_matches_the_reference() {
    use crate::params::{Request, SamplingParams};
    let mut rng = crate::testing::Rng::new(0x2545_f491_4f6c_dd1du64);
    let mut next = move || rng.next_u64();
    for case in 0..60u64 {
        let v = [9000usize, 32000, 65536][case as usize % 3];
        let z: Vec<f32> = (0..v)
            .map(|_| {
                let u = (next() >> 40) as f32 / (1u64 << 24) as f32;
                -8.0 * u.ln().max(-20.0).abs().sqrt()
            })
            .collect();
        let mut order: Vec<u32> = (0..v as u32).collect();
        order.sort_by(|&a, &b| z[b as usize].total_cmp(&z[a as usize]));
        let k = [1u32, 5, 50, 300][(case / 3) as usize % 4];
        let history: Vec<u32> = match case % 5 {
            // the top 2k and then some
            0 => order[..2 * k as usize + 40].to_vec(),
            // every other one of the top
            1 => order[..4 * k as usize].iter().step_by(2).copied().collect(),
            // the top k exactly
            2 => order[..k as usize].to_vec(),
            // far below the top
            3 => order[v - 200..].to_vec(),
            _ => (0..256).map(|_| (next() % v as u64) as u32).collect(),
        };
        let mut req = Request::new(
            SamplingParams {
                temperature: [0.3f32, 0.8, 1.5][(case % 3) as usize],
                top_k: k,
                top_p: [1.0f32, 0.9][(case / 2) as usize % 2],
                repetition_penalty: [1.1f32, 0.8][(case / 5) as usize % 2],
                frequency_penalty: 0.3,
                presence_penalty: -0.2,
                ..Default::default()
            },
            next(),
        );
        req.state.step = next() % 1000;
        req.state.output = history;
        let want = crate::reference::reference_row(&z, &req).0;
        let got = super::sample_row_f32(&z, &req);
        assert_eq!(got, want, "case {case}: v {v} k {k}");
    }
}

/// Long lists take the pruned walk: the same `τp` as the sorted walk, for ties,
/// smooth and steep distributions, and values of `p` placed exactly on a partial sum
/// (where only the exact walk can decide).
#[test]
fn pruned_walk_matches_the_sorted_walk() {
    let mut rng = crate::testing::Rng::new(0x0bad_cafe_1234_5677u64);
    let mut next = move || rng.next_u64();
    for case in 0..30 {
        let n = [4_097usize, 20_001, 131_072][case % 3];
        let mut q: Vec<f32> = (0..n)
            .map(|i| match case / 3 % 5 {
                // multiples of 2^-22 that sum to less than 1: every partial sum is
                // exact, so `p` on one leaves no margin and the exact walk decides
                4 => ((next() >> 40) % 30 + 1) as f32 / (1u32 << 22) as f32,
                // repeats: ties everywhere
                0 => ((next() >> 40) % 50) as f32 + 1.0,
                // a Zipf-like fall
                1 => 1.0 / (1.0 + (next() >> 44) as f32),
                // steep: a few carry almost everything
                2 => (-(((next() >> 40) % 4000) as f32) / 100.0).exp(),
                _ => (i % 7) as f32 + ((next() >> 52) as f32) * 1e-3,
            })
            .collect();
        if case / 3 % 5 != 4 {
            let total: f64 = q.iter().map(|&v| f64::from(v)).sum();
            for v in q.iter_mut() {
                *v = (f64::from(*v) / total) as f32;
            }
        }
        let mut sorted = q.clone();
        sorted.sort_unstable_by(|a, b| b.total_cmp(a));
        // p on partial sums of the sorted values, as f32 (just below, on, above)
        let mut cum = 0f64;
        let at: Vec<f32> = sorted
            .iter()
            .map(|&v| {
                cum += f64::from(v);
                cum as f32
            })
            .collect();
        let mut ps = vec![0.05f32, 0.5, 0.9, 0.95, 0.99, 0.999, 1.0];
        for k in [n / 50, n / 3, n - n / 20] {
            ps.extend([at[k].next_down(), at[k], at[k].next_up()].map(|p| p.min(1.0)));
        }
        for p in ps {
            let (want, _) = pl::top_p_cut(sorted.iter().copied(), p);
            let mut work = q.clone();
            assert_eq!(
                top_p_walk(&mut work, p).to_bits(),
                want.to_bits(),
                "case {case}: n={n} p={p}"
            );
        }
    }
}

/// Top-p over rows whose tokens outside the candidate list hold much of the mass, with
/// `p` on a cumulative sum of the sorted probabilities and between two: with coarse
/// terms the cut either stays clear of `p` by the rest's error or is deferred
/// ([`TopPScan::Unsure`]), and [`top_p_scan`] keeps the reference's set but on the
/// contract's ties. Where this CPU's coarse terms are its precise ones, nothing is
/// deferred.
#[test]
fn coarse_normaliser_defers_unclear_cuts() {
    let mut rng = crate::testing::Rng::new(0x9e37_79b9_7f4a_7c15);
    let (mut unsure, mut clear, mut ties, mut done) = (0, 0, 0, 0);
    for case in 0..12usize {
        let v = [32_000usize, 131_072][case % 2];
        let z = crate::testing::zipf_logits(&mut rng, v, [0.9, 1.0, 1.1][case / 2 % 3]);
        let t = [1.0f32, 1.6][case / 6];
        let y: Vec<f32> = z.iter().map(|&zi| zi / t).collect();
        let (zmax, ymax) = (
            z.iter().copied().fold(f32::NEG_INFINITY, f32::max),
            y.iter().copied().fold(f32::NEG_INFINITY, f32::max),
        );
        let sum: f64 = y.iter().map(|&yi| f64::from(pl::weight(yi, ymax))).sum();
        let mut q: Vec<f32> = y
            .iter()
            .map(|&yi| pl::prob(pl::weight(yi, ymax), sum))
            .collect();
        q.sort_by(|a, b| b.total_cmp(a));
        let mut cum = 0f64;
        let cums: Vec<f64> = q
            .iter()
            .map(|&qi| {
                cum += f64::from(qi);
                cum
            })
            .collect();
        for k in [30usize, 100, 300] {
            // on a sum, between two, and 1.5e-6 to either side of one: outside the
            // contract's tie, inside the coarse terms' reach
            for (p, on_sum) in [
                (cums[k] as f32, true),
                (((cums[k] + cums[k + 1]) / 2.0) as f32, false),
                ((cums[k] + 1.5e-6) as f32, false),
                ((cums[k] - 1.5e-6) as f32, false),
            ] {
                let (want, margin) = reference_top_p_edge(&y, ymax, p);
                let mut s = Scratch::default();
                let zthr = sampled_threshold(&z, first_top_p_list(p), &mut s.tmp).0;
                let bufs = (&mut s.q, &mut s.walk, &mut s.tmp2);
                let coarse = (Terms::Coarse, rest_error(Terms::Coarse.error()));
                let scan = top_p_candidates(&z, zmax, zthr, t, p, &mut s.cands, bufs, coarse);
                match scan {
                    TopPScan::Unsure => unsure += 1,
                    TopPScan::Done(_, Some(_)) => clear += 1,
                    _ => {}
                }
                let bufs = (&mut s.q, &mut s.walk, &mut s.tmp2);
                let scan = top_p_scan(&z, (zmax, zthr), (t, p), &mut s.cands, bufs);
                if let TopPScan::Done(_, Some(_)) = scan {
                    done += 1;
                    let got = s.cands.iter().fold(f32::INFINITY, |m, c| m.min(c.1));
                    if got != want {
                        // only on a sum: between two, the walk is well clear of `p`
                        assert!(
                            on_sum && margin <= 1e-6,
                            "case {case}, k {k}, p {p}: y {got} vs {want}, margin {margin}"
                        );
                        ties += 1;
                    }
                }
            }
        }
    }
    assert!(
        done >= 96,
        "{done} of 144 cuts found on the candidate lists"
    );
    assert!(ties * 2 <= done, "{ties} ties in {done}");
    if Terms::Coarse.error() > Terms::Precise.error() {
        assert!(unsure > 0 && clear > 0, "{unsure} deferred, {clear} clear");
    } else {
        assert_eq!(unsure, 0);
    }
}

/// How often the coarse terms send a row back for the precise pass ([`TopPScan::Unsure`]
/// costs a second pass over the row), on rows like a model's: Zipf-like logits of
/// exponent 0.9 to 1.2 and the GPU peers' law, V = 32,000, 131,072 and 151,936, T 0.6 to
/// 1.3, `p` 0.8, 0.9, 0.95, 0.99 and random in [0.5, 0.99]. With this CPU's terms at most
/// 1% of the cuts found on a candidate list may be sent back. Also printed (`--nocapture`):
/// the same with the bounds of coarser terms, such as a degree-1 polynomial after
/// AVX-512's 32-entry table (within 2.93e-5 at best).
#[test]
fn coarse_terms_seldom_defer() {
    let bounds = [Terms::Coarse.error(), 4e-6, 3.3e-5, 6e-5];
    // per bound: (sent back, cuts), all rows and those at T >= 1
    let mut tally = [[(0usize, 0usize); 2]; 4];
    let mut rng = crate::testing::Rng::new(0x00c0_a25e_0def_e225);
    // (law, V, exponent, repeat): Zipf-like rows, then the peers' law
    let mut rows = Vec::new();
    for law in 0..2 {
        for v in [32_000usize, 131_072, 151_936] {
            for s in [0.9f32, 1.0, 1.1, 1.2] {
                if law == 0 || s == 1.1 {
                    rows.extend((0..4u64).map(|rep| (law, v, s, rep)));
                }
            }
        }
    }
    for (law, v, s, rep) in rows {
        let z = if law == 0 {
            crate::testing::zipf_logits(&mut rng, v, s)
        } else {
            crate::testing::workload::affine_logits(1, v, 77 + rep)
        };
        let zmax = z.iter().copied().fold(f32::NEG_INFINITY, f32::max);
        for t in [0.6f32, 0.8, 1.0, 1.3] {
            for p in [0.8f32, 0.9, 0.95, 0.99, 0.0, 0.0] {
                let p = if p == 0.0 { 0.5 + 0.49 * rng.unit() } else { p };
                let mut sc = Scratch::default();
                let zthr = sampled_threshold(&z, first_top_p_list(p), &mut sc.tmp).0;
                for (&bound, counts) in bounds.iter().zip(&mut tally) {
                    let bufs = (&mut sc.q, &mut sc.walk, &mut sc.tmp2);
                    let terms = (Terms::Coarse, rest_error(bound));
                    let sent_back =
                        match top_p_candidates(&z, zmax, zthr, t, p, &mut sc.cands, bufs, terms) {
                            TopPScan::Unsure => true,
                            TopPScan::Done(_, Some(_)) => false,
                            _ => continue,
                        };
                    for (k, hot) in counts.iter_mut().zip([true, t >= 1.0]) {
                        if hot {
                            k.0 += usize::from(sent_back);
                            k.1 += 1;
                        }
                    }
                }
            }
        }
    }
    for (b, (bound, [all, hot])) in bounds.iter().zip(tally).enumerate() {
        let whose = if b == 0 {
            "this CPU's coarse terms"
        } else {
            "terms"
        };
        println!(
            "{whose} within {bound:.3e}: {} of {} cuts sent back, at T >= 1 {} of {}",
            all.0, all.1, hot.0, hot.1
        );
    }
    let [(back, cuts), _] = tally[0];
    assert!(cuts >= 600, "{cuts} cuts");
    assert!(back * 100 <= cuts, "{back} of {cuts} cuts sent back");
}

/// The walk from the smallest values gives the walk's `τp` whenever it answers, and
/// answers on lists that hold little more than the nucleus (as a bisection leaves
/// them), ties and all; `p` on a partial sum leaves no margin, and it declines.
#[test]
fn peeled_walk_matches_the_sorted_walk() {
    let mut rng = crate::testing::Rng::new(0x005e_ed0f_9ee1_u64);
    let mut next = move || rng.next_u64();
    let (mut answered, mut declined) = (0, 0);
    for case in 0..40 {
        let n = [9usize, 101, 300, 2_000][case % 4];
        let mut q: Vec<f32> = (0..n)
            .map(|_| match case / 4 % 4 {
                // repeats: ties everywhere
                0 => ((next() >> 40) % 20) as f32 + 1.0,
                // a Zipf-like fall
                1 => 1.0 / (1.0 + (next() >> 54) as f32),
                // steep
                2 => (-(((next() >> 40) % 2000) as f32) / 300.0).exp(),
                _ => 1.0 + ((next() >> 52) as f32) * 1e-4,
            })
            .collect();
        // the list's share of the row: p and a little more (the rest lies elsewhere)
        let share = [0.9001f64, 0.905, 0.93, 0.99][case / 16 % 4];
        let total: f64 = q.iter().map(|&v| f64::from(v)).sum();
        for v in q.iter_mut() {
            *v = (f64::from(*v) * share / total) as f32;
        }
        let mut sorted = q.clone();
        sorted.sort_unstable_by(|a, b| b.total_cmp(a));
        let mut ps = vec![0.5f32, 0.8, 0.9, 0.899, share as f32];
        // p on a partial sum near the list's end: no margin
        let mut cum = 0f64;
        for &v in &sorted[..n - n / 10 - 1] {
            cum += f64::from(v);
        }
        ps.push(cum as f32);
        for p in ps {
            let (want, _) = pl::top_p_cut(sorted.iter().copied(), p);
            let mut work = q.clone();
            match top_p_peel(&mut work, p) {
                Some(tau) => {
                    answered += 1;
                    assert_eq!(tau.to_bits(), want.to_bits(), "case {case}: n={n} p={p}");
                }
                None => declined += 1,
            }
            // the list as the walk from the top then finds it (reordered)
            assert_eq!(top_p_walk(&mut work, p).to_bits(), want.to_bits());
        }
    }
    assert!(answered > 150, "answered {answered}");
    assert!(declined > 0, "declined {declined}");
}

/// A kept set that is every token of the row at or above some `y` (ties at the edge,
/// sets of 16k to the whole row) draws the same token in one pass over the row as
/// token by token, over many seeds and steps.
#[test]
fn row_draw_above_a_value_matches_the_token_draw() {
    let mut rng = crate::testing::Rng::new(0x005e_ed0f_da7a_u64);
    let mut next = move || rng.next_u64();
    let (mut live, mut words) = (Vec::new(), Vec::new());
    for case in 0..12 {
        let v = [20_000usize, 70_000, 131_072][case % 3];
        let t = [1.0f32, 0.7, 2.5][case / 3 % 3];
        // coarse values: many tokens share the edge value
        let z: Vec<f32> = (0..v)
            .map(|_| -(((next() >> 40) % 400) as f32) * 0.02)
            .collect();
        let mut ys: Vec<f32> = z.iter().map(|&zi| zi / t).collect();
        ys.sort_unstable_by(|a, b| b.total_cmp(a));
        for rank in [WIDE_DRAW, (v / 2).max(WIDE_DRAW + 1), v - 1] {
            let y_min = ys[rank.min(v - 1)];
            let cands: Vec<(u32, f32)> = z
                .iter()
                .enumerate()
                .map(|(i, &zi)| (i as u32, zi / t))
                .filter(|c| c.1 >= y_min)
                .collect();
            for _ in 0..40 {
                let (seed, step) = (next(), next() % 100_000);
                let want = draw(&cands, seed, step, &mut live, &mut words);
                assert_eq!(
                    wide_draw(&z, t, &cands, seed, step),
                    Some(want),
                    "case {case}: v {v} t {t} y_min {y_min} seed {seed} step {step}"
                );
            }
        }
    }
}

#[test]
fn partial_walk_matches_the_sorted_walk() {
    let mut x = 0x1234_5678_9abc_def1u64;
    for case in 0..400 {
        let n = 1 + case * 7 % 3000;
        let mut q: Vec<f32> = (0..n)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                // repeats on purpose: ties at the cut
                ((x >> 40) % 50) as f32 + 1.0
            })
            .collect();
        let total: f32 = q.iter().sum();
        for v in q.iter_mut() {
            *v /= total;
        }
        for p in [0.05f32, 0.5, 0.9, 0.999, 1.0] {
            let mut sorted = q.clone();
            sorted.sort_unstable_by(|a, b| b.total_cmp(a));
            let (want, _) = pl::top_p_cut(sorted.iter().copied(), p);
            let mut work = q.clone();
            assert_eq!(
                top_p_walk(&mut work, p).to_bits(),
                want.to_bits(),
                "n={n} p={p}"
            );
        }
    }
}

/// Typical-p's cut by selection against the sorted walk: scores with many ties (the
/// walk may cross inside a run of equal scores), smooth and steep masses, `p` on a
/// partial sum (the first halving's split among them) and either side of it. The masses
/// are multiples of a power of two at least 2^-24 and sum to at most 1, so every sum is
/// exact in any order, `p` can sit exactly on one, and the cut must be the same bits.
#[test]
fn typical_selection_matches_the_sorted_walk() {
    let mut rng = crate::testing::Rng::new(0x7c15_9e37_79b9_0a0a);
    let mut next = move || rng.next_u64();
    for case in 0..24 {
        let n = [300usize, 4_097, 60_001][case % 3];
        let pairs: Vec<(f64, f64)> = (0..n)
            .map(|i| {
                let score = match case / 3 % 4 {
                    0 => ((next() >> 40) % 40) as f64 / 8.0,
                    1 => (next() >> 11) as f64 / (1u64 << 53) as f64 * 12.0,
                    2 => (i % 5) as f64,
                    _ => ((next() >> 40) % 3000) as f64 * 1e-3,
                };
                let units = match case % 2 {
                    0 => (next() >> 40) % 200 + 1,
                    _ => 1u64 << ((next() >> 40) % 10),
                };
                (score, units as f64)
            })
            .collect();
        let total: f64 = pairs.iter().map(|e| e.1).sum();
        // normalise by a power of two: the masses stay multiples of a power of two
        let scale = 2f64.powi(-(total.log2().ceil() as i32));
        let pairs: Vec<(f64, f64)> = pairs.iter().map(|&(s, v)| (s, v * scale)).collect();
        let mut sorted = pairs.clone();
        sorted.sort_by(|a, b| a.0.total_cmp(&b.0));
        let mut cum = 0f64;
        let at: Vec<f64> = sorted
            .iter()
            .map(|e| {
                cum += e.1;
                cum
            })
            .collect();
        let mut ps = vec![0.05f32, 0.3, 0.7, 0.95, 0.999, 1.0];
        assert!(scale >= 2f64.powi(-24));
        for k in [n / 7, n / 2 - 1, n / 2, n - n / 9] {
            let a = at[k] as f32;
            assert_eq!(f64::from(a), at[k]);
            ps.extend([a.next_down(), a, a.next_up()]);
        }
        for p in ps {
            let want = pl::typical_walk(sorted.iter().copied(), p)
                .0
                .unwrap_or(f64::INFINITY);
            let mut work = pairs.clone();
            let got = super::general::typical_select(&mut work, p);
            assert_eq!(got.to_bits(), want.to_bits(), "case {case}: n={n} p={p}");
        }
    }
}

/// Typical-p rows at decode vocabularies, alone and after top-n-σ and top-k, with top-p,
/// min-p and log-probabilities after it: the reference's token and kept set, but on the
/// contract's ties.
#[test]
fn typical_rows_match_the_reference() {
    use crate::params::{LogprobsMode, Request, SamplingParams};
    let mut rng = crate::testing::Rng::new(0x51ed_2701_dead_beefu64);
    let mut next = move || rng.next_u64();
    let (mut ties, mut rows) = (0, 0);
    for case in 0..24u64 {
        let v = [32_000usize, 151_936][case as usize % 2];
        let z = crate::testing::zipf_logits(&mut crate::testing::Rng::new(next()), v, 1.1);
        let req = Request::new(
            SamplingParams {
                temperature: [0.5f32, 0.8, 1.3][(case % 3) as usize],
                typical_p: [0.2f32, 0.6, 0.9, 0.95, 0.99][(case / 2) as usize % 5],
                top_n_sigma: [0.0f32, 0.0, 2.0][(case / 3) as usize % 3],
                top_k: [0u32, 0, 0, 1000][(case / 4) as usize % 4],
                top_p: [1.0f32, 0.9][(case / 5) as usize % 2],
                min_p: [0.0f32, 0.02][(case / 7) as usize % 2],
                logprobs: Some(3),
                logprobs_mode: LogprobsMode::Processed,
                kept: Some(16),
                ..Default::default()
            },
            next(),
        );
        let (want, tie) = crate::reference::reference_row(&z, &req);
        let got = super::sample_row_f32(&z, &req);
        rows += 1;
        if got != want {
            assert!(tie.is_tie(), "case {case}: v {v}: {got:?} against {want:?}");
            ties += 1;
        }
    }
    assert!(ties * 4 <= rows, "{ties} ties in {rows} rows");
}

/// The list draw over long lists in id order (the general path's wide kept sets, whose
/// words come by whole chunks of the row) against every candidate's exact noise: sets
/// that keep most ids, every fourth, runs with gaps, a band that starts and ends inside
/// chunks, plateaus of equal values (ties to the smaller id), and sparse sets that keep
/// the per-candidate words.
#[test]
fn dense_list_draw_matches_every_candidate_drawn() {
    let mut rng = crate::testing::Rng::new(0x243f_6a88_85a3_08d3u64);
    let mut next = move || rng.next_u64();
    for case in 0..120u64 {
        let v = [5000usize, 32000, 151_936][case as usize % 3];
        let keep = |i: usize, r: u64| match case % 5 {
            0 => !r.is_multiple_of(10),
            1 => i % 4 == 1,
            2 => (i / 300) % 3 != 2,
            3 => i > v / 3 && i < v / 3 + 9000,
            _ => r.is_multiple_of(9),
        };
        let plateau = case % 7 == 0;
        let cands: Vec<(u32, f32)> = (0..v)
            .filter_map(|i| {
                let r = next();
                let u = (r >> 40) as f32 / (1u64 << 24) as f32;
                let y = if plateau {
                    2.0
                } else {
                    12.0 * u - 30.0 * u * u
                };
                keep(i, r).then_some((i as u32, y))
            })
            .collect();
        let (seed, step) = (next(), next() % 5000);
        let mut want = (0u32, f32::NEG_INFINITY);
        for &(i, y) in &cands {
            let s = y + philox::gumbel(seed, step, i);
            if s > want.1 {
                want = (i, s);
            }
        }
        let (mut live, mut words) = (Vec::new(), Vec::new());
        let got = draw(&cands, seed, step, &mut live, &mut words);
        assert_eq!(
            got,
            want.0,
            "case {case}: v {v}, {} candidates",
            cands.len()
        );
    }
}

/// Top-n-σ's threshold in vector lanes keeps the same tokens as the contract's
/// sequential sums: Zipf-like and Gaussian rows, rows with `-inf` tokens, huge and tiny
/// ranges, and rows where a token sits on the sequential threshold, within an ulp
/// either side (found by moving a token onto it until it stays), where the fallback to
/// the sequential sums must decide.
#[test]
fn sigma_threshold_keeps_the_sequential_set() {
    let mut rng = crate::testing::Rng::new(0x1319_8a2e_0370_7344u64);
    let mut on_threshold = 0;
    for case in 0..60u64 {
        let v = [33usize, 4097, 32_000, 151_936][case as usize % 4];
        let n = [0.5f32, 1.0, 2.0, 3.7][(case / 4) as usize % 4];
        let mut y: Vec<f32> = match case % 5 {
            0 => crate::testing::zipf_logits(&mut rng, v, 1.1),
            1 => (0..v).map(|_| 3.0 * rng.normal()).collect(),
            2 => (0..v)
                .map(|i| {
                    if i % 7 == 0 {
                        f32::NEG_INFINITY
                    } else {
                        rng.normal()
                    }
                })
                .collect(),
            3 => (0..v).map(|_| 1e30 * rng.normal()).collect(),
            _ => (0..v).map(|_| 1.0 + 1e-6 * rng.normal()).collect(),
        };
        let ymax = y.iter().copied().fold(f32::NEG_INFINITY, f32::max);
        if case % 2 == 1 {
            // put a token (not the max) on the sequential threshold, a few times over,
            // then nudge it by an ulp
            let at = y
                .iter()
                .position(|&v| v > f32::NEG_INFINITY && v < ymax)
                .unwrap();
            for _ in 0..4 {
                y[at] = pl::top_n_sigma_threshold(&y, ymax, n) as f32;
            }
            y[at] = match case % 4 {
                1 => y[at].next_down(),
                3 => y[at].next_up(),
                _ => y[at],
            };
            let tau = pl::top_n_sigma_threshold(&y, ymax, n);
            // within an f32 ulp of it: inside the band where the fallback decides
            let ulp = f64::from(y[at].next_up() - y[at]);
            if (f64::from(y[at]) - tau).abs() <= 2.0 * ulp {
                on_threshold += 1;
            }
        }
        let want = pl::top_n_sigma_threshold(&y, ymax, n);
        let got = super::general::sigma_threshold(&y, ymax, n);
        let kept = |tau: f64| -> Vec<usize> {
            (0..v)
                .filter(|&i| y[i] > f32::NEG_INFINITY && f64::from(y[i]) >= tau)
                .collect()
        };
        assert_eq!(kept(got), kept(want), "case {case}: v {v} n {n}");
    }
    assert!(
        on_threshold >= 15,
        "{on_threshold} rows with a token on the threshold"
    );
}
