//! `decoda bench`: the sampler on synthetic Zipf-like logits over a grid of shapes and
//! configurations, against the memory floor (one streaming max pass over the same rows).

use std::process::ExitCode;
use std::time::Instant;

use clap::Args;
use decoda::workload;
use indicatif::{ProgressBar, ProgressStyle};
use rayon::prelude::*;
use serde_json::json;

use crate::device::Device;

#[derive(Args)]
pub struct BenchArgs {
    /// Configurations (comma list) from: greedy, temp, topk50, topp09, topk50_topp09, minp005, full.
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "greedy,temp,topk50,topp09,topk50_topp09,minp005,full"
    )]
    config: Vec<String>,
    /// Vocabulary sizes (comma list).
    #[arg(long, value_delimiter = ',', default_value = "32000,131072,262144")]
    vocab: Vec<usize>,
    /// Batch sizes (comma list).
    #[arg(long, value_delimiter = ',', default_value = "1,8,64,256")]
    rows: Vec<usize>,
    /// CPU thread counts (comma list; 0 = all cores).
    #[arg(long, value_delimiter = ',', default_value = "0")]
    threads: Vec<usize>,
    /// Where to run.
    #[arg(long, value_enum, default_value_t = Device::Cpu)]
    device: Device,
    /// Minimum measuring time per cell, in milliseconds.
    #[arg(long, default_value_t = 300)]
    time_ms: u64,
    /// Print one JSON object per cell instead of a table.
    #[arg(long)]
    json: bool,
}

/// Times of one cell, in microseconds.
pub struct Timing {
    pub median: f64,
    pub p10: f64,
    pub p90: f64,
}

/// Runs `f` repeatedly for at least `time_ms` (and at least 7 times) after a warm-up.
pub fn time_it(time_ms: u64, mut f: impl FnMut()) -> Timing {
    f();
    let mut samples = Vec::new();
    let start = Instant::now();
    while samples.len() < 7 || (start.elapsed().as_millis() as u64) < time_ms {
        let t = Instant::now();
        f();
        samples.push(t.elapsed().as_secs_f64() * 1e6);
        if samples.len() >= 100_000 {
            break;
        }
    }
    samples.sort_by(f64::total_cmp);
    let at = |q: f64| samples[((samples.len() - 1) as f64 * q).round() as usize];
    Timing {
        median: at(0.5),
        p10: at(0.1),
        p90: at(0.9),
    }
}

pub fn run(a: BenchArgs) -> Result<ExitCode, String> {
    for c in &a.config {
        if workload::config(c).is_none() {
            return Err(format!(
                "--config: unknown configuration {c:?} (known: {})",
                workload::CONFIGS.join(", ")
            ));
        }
    }
    if a.vocab.contains(&0) || a.rows.contains(&0) {
        return Err("--vocab and --rows must be >= 1".into());
    }
    if a.device == Device::Cuda {
        crate::device::backend(Device::Cuda, 0)?;
    }
    let cells = a.config.len() * a.vocab.len() * a.rows.len() * a.threads.len();
    let bar = ProgressBar::new(cells as u64);
    bar.set_style(
        ProgressStyle::with_template("{bar:40} {pos}/{len} {msg}").map_err(|e| e.to_string())?,
    );
    let mut lines = Vec::new();
    for &vocab in &a.vocab {
        for &rows in &a.rows {
            let data = workload::logits(rows, vocab, 7);
            let logits = decoda::Logits::f32(&data, rows, vocab).map_err(|e| e.to_string())?;
            for &threads in &a.threads {
                let sampler = if threads == 0 {
                    decoda::CpuSampler::new()
                } else {
                    decoda::CpuSampler::with_threads(threads).map_err(|e| e.to_string())?
                };
                let nthreads = sampler.threads();
                let pool = rayon::ThreadPoolBuilder::new()
                    .num_threads(nthreads)
                    .build()
                    .map_err(|e| e.to_string())?;
                // The floor runs the way the sampler does: one row on the calling thread,
                // several rows spread over the pool.
                let floor = time_it(a.time_ms, || {
                    let m: f32 = if rows == 1 {
                        decoda::cpu::kernels::max(std::hint::black_box(&data))
                    } else {
                        pool.install(|| {
                            data.par_chunks(vocab)
                                .map(decoda::cpu::kernels::max)
                                .reduce(|| f32::NEG_INFINITY, f32::max)
                        })
                    };
                    std::hint::black_box(m);
                });
                for config in &a.config {
                    bar.set_message(format!("{config} V={vocab} B={rows} threads={nthreads}"));
                    let params = workload::config(config).expect("checked");
                    let reqs = workload::requests(&params, rows, vocab);
                    let t = time_it(a.time_ms, || {
                        let out =
                            decoda::Backend::sample(&sampler, &logits, &reqs).expect("valid call");
                        std::hint::black_box(out);
                    });
                    let line = json!({
                        "impl": "decoda", "device": "cpu", "config": config, "vocab": vocab, "rows": rows,
                        "threads": nthreads, "median_us": round2(t.median), "p10_us": round2(t.p10),
                        "p90_us": round2(t.p90), "floor_us": round2(floor.median),
                    });
                    if a.json {
                        bar.suspend(|| println!("{line}"));
                    }
                    lines.push(line);
                    bar.inc(1);
                }
            }
        }
    }
    bar.finish_and_clear();
    if !a.json {
        println!("decoda bench on cpu ({} kernels); times per call in µs; floor = one streaming max pass over the same rows", decoda::cpu::kernels::isa());
        println!(
            "{:<14} {:>7} {:>5} {:>7} {:>11} {:>11} {:>11} {:>10} {:>8}",
            "config", "vocab", "rows", "threads", "median", "p10", "p90", "floor", "x floor"
        );
        for l in &lines {
            let med = l["median_us"].as_f64().unwrap_or(0.0);
            let floor = l["floor_us"].as_f64().unwrap_or(1.0);
            println!(
                "{:<14} {:>7} {:>5} {:>7} {:>11.2} {:>11.2} {:>11.2} {:>10.2} {:>8.2}",
                l["config"].as_str().unwrap_or(""),
                l["vocab"],
                l["rows"],
                l["threads"],
                med,
                l["p10_us"].as_f64().unwrap_or(0.0),
                l["p90_us"].as_f64().unwrap_or(0.0),
                floor,
                med / floor
            );
        }
    }
    Ok(ExitCode::SUCCESS)
}

pub fn round2(x: f64) -> f64 {
    (x * 100.0).round() / 100.0
}
