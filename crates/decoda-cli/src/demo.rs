//! `decoda demo` and `decoda selftest`.

use std::process::ExitCode;

use clap::Args;
use decoda::reference::explain_row;
use decoda::testing::{self, random_case, Rng};
use decoda::{Logits, Request, SamplingParams};

use crate::device::{backend, Device};
use crate::sample::bar;

#[derive(Args)]
pub struct DemoArgs {
    /// Where to sample.
    #[arg(long, value_enum, default_value_t = Device::Auto)]
    device: Device,
}

const WORDS: [&str; 12] = [
    "the", "a", "cat", "dog", "sat", "ran", "on", "under", "mat", "sofa", "quietly", "zebra",
];
const LOGITS: [f32; 12] = [
    3.2, 2.9, 2.4, 2.2, 1.6, 1.1, 0.9, 0.3, 0.0, -0.4, -1.2, -3.0,
];

fn show(title: &str, req: &Request) {
    let ex = explain_row(&LOGITS, req);
    let last = ex.stages.last().expect("stages");
    println!(
        "{title}  (kept {}, entropy {:.2} bits)",
        last.probs.len(),
        last.entropy_bits
    );
    let mut probs = vec![0f64; WORDS.len()];
    for &(t, p) in &last.probs {
        probs[t as usize] = p;
    }
    for (w, p) in WORDS.iter().zip(&probs) {
        println!("  {w:>8} {:>6.1}% {}", p * 100.0, bar(*p, 40));
    }
    println!();
}

pub fn run_demo(a: DemoArgs) -> Result<ExitCode, String> {
    let be = backend(a.device, 0)?;
    println!(
        "decoda demo on {}: a 12-token distribution, what each parameter does to it\n",
        be.name()
    );
    let base = SamplingParams::default();
    for t in [0.5f32, 1.0, 1.5] {
        show(
            &format!("temperature {t}"),
            &Request::new(
                SamplingParams {
                    temperature: t,
                    ..base.clone()
                },
                0,
            ),
        );
    }
    show(
        "top-k 3",
        &Request::new(
            SamplingParams {
                top_k: 3,
                ..base.clone()
            },
            0,
        ),
    );
    show(
        "top-p 0.8",
        &Request::new(
            SamplingParams {
                top_p: 0.8,
                ..base.clone()
            },
            0,
        ),
    );
    show(
        "min-p 0.2",
        &Request::new(
            SamplingParams {
                min_p: 0.2,
                ..base.clone()
            },
            0,
        ),
    );

    let params = SamplingParams {
        temperature: 0.9,
        top_p: 0.95,
        ..base.clone()
    };
    let seed = 42u64;
    let draws = 16;
    let run = |batch_around: bool, be: &dyn decoda::Backend| -> Result<Vec<u32>, String> {
        let mut tokens = Vec::new();
        for step in 0..draws {
            let mut req = Request::new(params.clone(), seed);
            req.state.step = step;
            let (data, reqs, pos) = if batch_around {
                // the same row at position 3 of a batch of 8 other random rows
                let mut rng = Rng::new(step + 100);
                let mut data = Vec::new();
                let mut reqs = Vec::new();
                for r in 0..8 {
                    if r == 3 {
                        data.extend_from_slice(&LOGITS);
                        reqs.push(req.clone());
                    } else {
                        let (x, q) = random_case(&mut rng, LOGITS.len());
                        data.extend(x);
                        reqs.push(q);
                    }
                }
                (data, reqs, 3)
            } else {
                (LOGITS.to_vec(), vec![req], 0)
            };
            let l = Logits::f32(&data, reqs.len(), LOGITS.len()).map_err(|e| e.to_string())?;
            let out = be.sample(&l, &reqs).map_err(|e| e.to_string())?;
            tokens.push(out[pos].as_ref().map_err(|e| e.to_string())?.token);
        }
        Ok(tokens)
    };
    let words = |t: &[u32]| {
        t.iter()
            .map(|&i| WORDS[i as usize])
            .collect::<Vec<_>>()
            .join(" ")
    };
    let first = run(false, be.as_ref())?;
    println!(
        "{draws} draws, temperature 0.9, top-p 0.95, seed {seed}, steps 0..{draws}:\n  {}",
        words(&first)
    );
    let again = run(false, be.as_ref())?;
    println!(
        "same seed and steps again:\n  {}  -> {}",
        words(&again),
        if again == first {
            "identical"
        } else {
            "DIFFERENT"
        }
    );
    let batched = run(true, be.as_ref())?;
    println!(
        "the same row at position 3 of a batch of 8 other rows:\n  {}  -> {}",
        words(&batched),
        if batched == first {
            "identical"
        } else {
            "DIFFERENT"
        }
    );
    let cpu = run(false, &decoda::ReferenceSampler)?;
    println!(
        "the reference sampler (the contract, written plainly):\n  {}  -> {}",
        words(&cpu),
        if cpu == first {
            "identical"
        } else {
            "DIFFERENT"
        }
    );
    if again == first && batched == first && cpu == first {
        println!("\nA token is a pure function of (logits, parameters, seed, step, history).");
        Ok(ExitCode::SUCCESS)
    } else {
        Ok(ExitCode::from(1))
    }
}

#[derive(Args)]
pub struct SelftestArgs {
    /// Which backend to test.
    #[arg(long, value_enum, default_value_t = Device::Auto)]
    device: Device,
    /// Random rows for the parity check against the reference.
    #[arg(long, default_value_t = 10_000)]
    parity_rows: usize,
    /// A shorter run: the head check over 60 steps instead of 300, and the decode shapes
    /// at the smallest and largest vocabulary only (V = 32,000 and 262,144, B = 1 and 3)
    /// instead of every real model's at B = 1, 2 and 3.
    #[arg(long)]
    quick: bool,
    /// Steps of the head check (default 300, or 60 with `--quick`).
    #[arg(long)]
    head_steps: Option<usize>,
    /// Only these checks of the conformance suite (a comma list of the names the run
    /// prints, such as `stage_xtc,kept_distribution`), to rerun one that failed; the head
    /// check, the parity rows and the decode shapes run as before.
    #[arg(long, value_delimiter = ',', value_name = "NAMES")]
    only: Vec<String>,
    /// Instead of the suite: N calls of random shapes (V = 17 to 262,144, B = 1 to 64),
    /// element types, entry points and parameter mixes (every stage but token masks and
    /// the kept distribution) against the reference, counting mismatches and
    /// out-of-range ids; fails if there is any.
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u64).range(1..),
          conflicts_with_all = ["quick", "parity_rows", "head_steps", "only"])]
    stress: Option<u64>,
    /// The seed of `--stress`'s random calls.
    #[arg(long, default_value_t = 1, requires = "stress")]
    stress_seed: u64,
    /// Stop `--stress` after this many seconds (the counts so far are its result).
    #[arg(long, value_name = "S", requires = "stress")]
    stress_secs: Option<f64>,
}

/// `selftest --stress N`: the stress run on the chosen backend.
fn run_stress(
    gpu: Option<&decoda::wgpu::WgpuDevice>,
    calls: usize,
    seed: u64,
    secs: Option<f64>,
) -> Result<ExitCode, String> {
    let make = || crate::device::sampler_on(gpu);
    let name = make()?.name();
    println!("stress run on {name}: {calls} calls, seed {seed}");
    let t = std::time::Instant::now();
    let until = match secs {
        Some(s) if s.is_finite() && s >= 0.0 => Some(t + std::time::Duration::from_secs_f64(s)),
        Some(s) => return Err(format!("--stress-secs {s}: a number of seconds, 0 or more")),
        None => None,
    };
    let tally = testing::stress::stress(
        &make,
        calls,
        seed,
        until,
        |n, t| {
            if n % 1000 == 0 || n == calls {
                println!(
                    "  {n} calls: {} results, {} identical, {} allowed ties, {} mismatches, {} out of range",
                    t.results, t.same, t.allowed_ties, t.mismatches, t.out_of_range
                );
            }
        },
        |d| println!("  MISMATCH {d}"),
    )?;
    println!(
        "stress: {} calls ({} failed), {} results, {} identical, {} allowed floating-point ties, {} mismatches, {} out-of-range ids in {:.1} s",
        tally.calls,
        tally.failed_calls,
        tally.results,
        tally.same,
        tally.allowed_ties,
        tally.mismatches,
        tally.out_of_range,
        t.elapsed().as_secs_f64()
    );
    Ok(if tally.clean() {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    })
}

pub fn run_selftest(a: SelftestArgs) -> Result<ExitCode, String> {
    // the checks --only names (every one without it); an unknown name is refused
    if let Some(bad) = a
        .only
        .iter()
        .find(|n| !testing::CHECKS.iter().any(|(name, _)| name == n))
    {
        let names: Vec<&str> = testing::CHECKS.iter().map(|(n, _)| *n).collect();
        return Err(format!(
            "--only {bad}: no such check; the suite's checks are {}",
            names.join(", ")
        ));
    }
    // one device for every part of the run: each shader is compiled once
    let gpu = crate::device::gpu_device(a.device)?;
    if let Some(n) = a.stress {
        return run_stress(gpu.as_ref(), n as usize, a.stress_seed, a.stress_secs);
    }
    let be = crate::device::sampler_on(gpu.as_ref())?;
    println!("conformance suite on {}", be.name());
    let (mut passed, mut failed) = (0, 0);
    for (name, check) in testing::CHECKS {
        if !a.only.is_empty() && !a.only.iter().any(|n| n == name) {
            continue;
        }
        match check(be.as_ref()) {
            Ok(()) => {
                passed += 1;
                println!("  ok    {name}");
            }
            Err(e) => {
                failed += 1;
                println!("  FAIL  {name}: {e}");
            }
        }
    }
    // the sampling head: 64 slots, 300 steps of joins, leaves, stops and long histories
    let head: Result<Box<dyn decoda::head::Head>, String> = if let Some(d) = &gpu {
        decoda::wgpu::WgpuHead::new(d, 64, 3000)
            .map(|h| Box::new(h) as Box<dyn decoda::head::Head>)
            .map_err(|e| e.to_string())
    } else {
        decoda::CpuHead::new(64, 3000)
            .map(|h| Box::new(h) as Box<dyn decoda::head::Head>)
            .map_err(|e| e.to_string())
    };
    let head_steps = a.head_steps.unwrap_or(if a.quick { 60 } else { 300 });
    match head.and_then(|mut h| testing::head::head_sequences(h.as_mut(), head_steps)) {
        Ok(()) => {
            passed += 1;
            println!("  ok    head_sequences");
        }
        Err(e) => {
            failed += 1;
            println!("  FAIL  head_sequences: {e}");
        }
    }
    // parity with the reference on random rows across vocabulary sizes
    let mut rng = Rng::new(31337);
    let mut totals = testing::Parity::default();
    // exactly --parity-rows rows: a few at the large vocabularies, the rest spread over
    // the small ones (the last takes the remainder)
    let large = [32_000usize, 131_072, 262_144];
    let small = [1usize, 3, 17, 256, 1000, 4099];
    let mut plan: Vec<(usize, usize)> = Vec::new();
    let mut left = a.parity_rows;
    for &v in &large {
        let n = (a.parity_rows / 100).clamp(1, 40).min(left);
        plan.push((v, n));
        left -= n;
    }
    for (i, &v) in small.iter().enumerate() {
        let n = if i + 1 == small.len() {
            left
        } else {
            left / (small.len() - i)
        };
        plan.push((v, n));
        left -= n;
    }
    for (v, n) in plan {
        if n == 0 {
            continue;
        }
        let cases: Vec<_> = (0..n).map(|_| random_case(&mut rng, v)).collect();
        match testing::parity(be.as_ref(), &cases) {
            Ok(p) => {
                passed += 1;
                totals.rows += p.rows;
                totals.same += p.same;
                totals.allowed_ties += p.allowed_ties;
                totals.max_logprob_diff = totals.max_logprob_diff.max(p.max_logprob_diff);
                println!(
                    "  ok    parity V={v}: {} rows, {} identical, {} allowed ties",
                    p.rows, p.same, p.allowed_ties
                );
            }
            Err(e) => {
                failed += 1;
                println!("  FAIL  parity V={v}: {e}");
            }
        }
    }
    println!(
        "parity: {} rows, {} identical, {} allowed floating-point ties, max logprob diff {:.2e}",
        totals.rows, totals.same, totals.allowed_ties, totals.max_logprob_diff
    );
    // real decode shapes: every vocabulary size of real models at B = 1, 2, 3 (--quick:
    // the smallest and the largest at B = 1 and 3), through sample and sample_draws (1
    // and 3 draws), on a long-lived sampler and a fresh one per vocabulary (on the
    // run's device)
    let make = || crate::device::sampler_on(gpu.as_ref());
    let (vocabs, batches): (&[usize], &[usize]) = if a.quick {
        (&[32_000, 262_144], &[1, 3])
    } else {
        (decoda::testing::shapes::DECODE_VOCABS, &[1, 2, 3])
    };
    let shapes = decoda::testing::shapes::decode_shapes(
        &make,
        vocabs,
        batches,
        decoda::testing::shapes::ENTRIES,
        4242,
        !a.quick,
        |case| println!("  ok    shape {case}"),
    );
    match shapes {
        Ok(t) => {
            passed += 1;
            println!(
                "  ok    decode shapes: {} calls, {} results, {} identical, {} allowed ties",
                t.calls, t.results, t.same, t.allowed_ties
            );
        }
        Err(e) => {
            failed += 1;
            println!("  FAIL  decode shapes: {e}");
        }
    }
    println!("{passed} passed, {failed} failed");
    Ok(if failed == 0 {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    })
}
