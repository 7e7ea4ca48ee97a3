//! `decoda bench`: the sampler on synthetic Zipf-like logits over a grid of shapes and
//! configurations, against the memory floor (one streaming max pass over the same rows).

use std::process::ExitCode;
use std::time::Instant;

use clap::Args;
use decoda::testing::workload;
use indicatif::{ProgressBar, ProgressStyle};
use rayon::prelude::*;
use serde_json::json;

use crate::device::Device;

#[derive(Args)]
pub struct BenchArgs {
    /// Configurations (comma list) from: greedy, temp, topk50, topp09, topk50_topp09,
    /// minp005, minp01, full, topp095, topp098, topp099, mask_dense, mask_sparse, dry,
    /// topnsigma1, typical095, xtc, minp005_xtc, kept64, minp005_kept64.
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
    /// Where to run (as `sample`: a hardware GPU when there is one, else the CPU).
    #[arg(long, value_enum, default_value_t = Device::Auto)]
    device: Device,
    /// Minimum measuring time per cell, in milliseconds.
    #[arg(long, default_value_t = 300)]
    time_ms: u64,
    /// Logit element types on the wgpu device (comma list of f32, f16, bf16): the
    /// rows are rounded to the type and uploaded as the model would leave them. The
    /// CPU grid runs f32.
    #[arg(long, value_delimiter = ',', default_value = "f32")]
    dtype: Vec<String>,
    /// The law of the synthetic rows: `zipf` (a random permutation of ranks, exponent
    /// 1.1, noise 0.3: about 13 units from the largest logit to the smallest at
    /// V = 151,936), `wide` (the same with exponent 2.5: about 30 units, the span of an
    /// LLM's rows) or `affine` (the GPU peers' rows in `scripts/gpu-peers/bench_peers.py`:
    /// affine rank permutations, noise 0.5).
    #[arg(long, value_enum, default_value_t = Law::Zipf)]
    law: Law,
    /// On the wgpu device, the calls of a cell rotate over copies of the logits in
    /// distinct buffers of at least this many MiB in all, so that no call reads its
    /// logits from the GPU's cache.
    #[arg(long, default_value_t = 256)]
    rotate_mib: u64,
    /// Print one JSON object per cell instead of a table.
    #[arg(long)]
    json: bool,
    /// Time decode steps of the sampling head (slots with penalised histories) next to
    /// the per-call API on the same rows: host time to record and submit, device time.
    /// Uses the first `--vocab`, `--slots` and `--history`.
    #[arg(long)]
    head: bool,
    /// Slot counts for `--head` (comma list).
    #[arg(long, value_delimiter = ',', default_value = "64,256")]
    slots: Vec<usize>,
    /// History lengths (tokens per slot) for `--head` (comma list).
    #[arg(long, value_delimiter = ',', default_value = "0,4096,32768")]
    history: Vec<usize>,
}

/// The law of the benchmark rows (`--law`).
#[derive(Clone, Copy, clap::ValueEnum)]
enum Law {
    /// `decoda::testing::workload::logits`.
    Zipf,
    /// `decoda::testing::zipf_logits` with exponent 2.5.
    Wide,
    /// `decoda::testing::workload::affine_logits`.
    Affine,
}

impl Law {
    fn name(self) -> &'static str {
        match self {
            Law::Zipf => "zipf",
            Law::Wide => "wide",
            Law::Affine => "affine",
        }
    }

    /// `rows` rows of `vocab` logits of this law (seed 7).
    fn rows(self, rows: usize, vocab: usize) -> Vec<f32> {
        match self {
            Law::Zipf => workload::logits(rows, vocab, 7),
            Law::Wide => {
                let mut rng = decoda::testing::Rng::new(7);
                (0..rows)
                    .flat_map(|_| decoda::testing::zipf_logits(&mut rng, vocab, 2.5))
                    .collect()
            }
            Law::Affine => workload::affine_logits(rows, vocab, 7),
        }
    }
}

/// Times of one cell, in microseconds.
pub struct Timing {
    pub median: f64,
    pub p10: f64,
    pub p90: f64,
}

/// Runs `f` repeatedly for at least `time_ms` (and at least 7 times) after a warm-up.
pub fn time_it(time_ms: u64, mut f: impl FnMut()) -> Timing {
    let timed = || -> Result<f64, String> {
        let t = Instant::now();
        f();
        Ok(t.elapsed().as_secs_f64() * 1e6)
    };
    collect(time_ms, 100_000, timed).expect("infallible")
}

/// Takes samples (µs) from `sample` for at least `time_ms` and at least 7 of them, at
/// most `max`, after one warm-up sample; their median and 10th/90th percentiles.
pub fn collect(
    time_ms: u64,
    max: usize,
    mut sample: impl FnMut() -> Result<f64, String>,
) -> Result<Timing, String> {
    sample()?;
    let mut samples = Vec::new();
    let start = Instant::now();
    while samples.len() < 7 || (start.elapsed().as_millis() as u64) < time_ms {
        samples.push(sample()?);
        if samples.len() >= max {
            break;
        }
    }
    Ok(quantiles(samples))
}

/// The median and 10th/90th percentiles of `samples` (at least one).
pub fn quantiles(mut samples: Vec<f64>) -> Timing {
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
    for &t in &a.threads {
        crate::device::check_threads(t)?;
    }
    for d in &a.dtype {
        dtype(d)?;
    }
    let gpu = match a.device {
        Device::Cpu => None,
        Device::Wgpu => Some(decoda::wgpu::WgpuSampler::new().map_err(|e| e.to_string())?),
        Device::Auto => crate::device::auto_gpu(),
    };
    if a.head {
        return crate::bench_head::run(
            &a.vocab,
            &a.slots,
            &a.history,
            a.time_ms,
            a.json,
            gpu.as_ref(),
        );
    }
    if let Some(g) = &gpu {
        return run_wgpu(&a, g);
    }
    if a.dtype.iter().any(|d| d != "f32") {
        return Err("--dtype: the CPU grid runs f32 logits only (use --device wgpu)".into());
    }
    let cells = a.config.len() * a.vocab.len() * a.rows.len() * a.threads.len();
    let bar = ProgressBar::new(cells as u64);
    bar.set_style(
        ProgressStyle::with_template("{bar:40} {pos}/{len} {msg}").map_err(|e| e.to_string())?,
    );
    let mut lines = Vec::new();
    for &vocab in &a.vocab {
        for &rows in &a.rows {
            let data = a.law.rows(rows, vocab);
            let logits = decoda::Logits::f32(&data, rows, vocab).map_err(|e| e.to_string())?;
            for &threads in &a.threads {
                let sampler = crate::device::cpu(threads)?;
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
                // The Philox limit: every token's Philox word, each row at its own seed,
                // computed the way the draw does (16 blocks across vector lanes) and
                // nothing else: the least work a draw over the whole row can do.
                let philox = time_it(a.time_ms, || {
                    let w: u32 = if rows == 1 {
                        decoda::cpu::philox_row_words(vocab, 1, 0)
                    } else {
                        pool.install(|| {
                            (0..rows)
                                .into_par_iter()
                                .map(|r| decoda::cpu::philox_row_words(vocab, r as u64, 0))
                                .reduce(|| 0, |a, b| a ^ b)
                        })
                    };
                    std::hint::black_box(w);
                });
                for config in &a.config {
                    bar.set_message(format!("{config} V={vocab} B={rows} threads={nthreads}"));
                    let reqs = workload::named_requests(config, rows, vocab).expect("checked");
                    let t = time_it(a.time_ms, || {
                        let out =
                            decoda::Backend::sample(&sampler, &logits, &reqs).expect("valid call");
                        std::hint::black_box(out);
                    });
                    let line = json!({
                        "impl": "decoda", "device": "cpu", "config": config, "vocab": vocab, "rows": rows,
                        "threads": nthreads, "median_us": round2(t.median), "p10_us": round2(t.p10),
                        "p90_us": round2(t.p90), "floor_us": round2(floor.median),
                        "philox_us": round2(philox.median), "law": a.law.name(),
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
        println!("decoda bench on cpu ({} kernels); times per call in µs; floor = one streaming max pass over the same rows; philox = every token's Philox word, nothing else", decoda::cpu::kernels::isa());
        print_table(&lines, "threads");
    }
    Ok(ExitCode::SUCCESS)
}

/// The table of `lines`; `extra` names the column between rows and the times. Lines with
/// `philox_us` (the CPU's) get the Philox limit and the ratio to it too.
fn print_table(lines: &[serde_json::Value], extra: &str) {
    let philox = lines.iter().any(|l| l.get("philox_us").is_some());
    let gpu = lines.iter().any(|l| l.get("gpu_us").is_some());
    print!(
        "{:<14} {:>7} {:>5} {:>8} {:>11} {:>11} {:>11} {:>10} {:>8}",
        "config", "vocab", "rows", extra, "median", "p10", "p90", "floor", "x floor"
    );
    if philox {
        print!(" {:>10} {:>9}", "philox", "x philox");
    }
    if gpu {
        print!(" {:>11} {:>8}", "gpu", "x floor");
    }
    println!();
    for l in lines {
        let med = l["median_us"].as_f64().unwrap_or(0.0);
        let floor = l["floor_us"].as_f64().unwrap_or(1.0);
        let extra_value = match &l[extra] {
            serde_json::Value::String(s) => s.clone(),
            other => other.to_string(),
        };
        print!(
            "{:<14} {:>7} {:>5} {:>8} {:>11.2} {:>11.2} {:>11.2} {:>10.2} {:>8.2}",
            l["config"].as_str().unwrap_or(""),
            l["vocab"].as_u64().unwrap_or(0),
            l["rows"].as_u64().unwrap_or(0),
            extra_value,
            med,
            l["p10_us"].as_f64().unwrap_or(0.0),
            l["p90_us"].as_f64().unwrap_or(0.0),
            floor,
            med / floor
        );
        if let Some(p) = l.get("philox_us").and_then(serde_json::Value::as_f64) {
            print!(" {:>10.2} {:>9.2}", p, med / p);
        }
        if let Some(t) = l.get("gpu_us").and_then(serde_json::Value::as_f64) {
            print!(" {:>11.2} {:>8.2}", t, t / floor);
        }
        println!();
    }
}

/// The grid on the wgpu device. Each cell's calls rotate over copies of the rows in
/// distinct buffers (at least `--rotate-mib` in all), so no call finds its logits in the
/// GPU's cache. Two times per call: `gpu_us` from timestamp queries around one call, and
/// `median_us` with calls issued back to back (the interval between consecutive calls'
/// ends: device time plus any gap the host leaves). Without timestamps, both are wall
/// clock per call (record, submit, wait). `floor_us` = one read of the logits at the
/// adapter's measured copy bandwidth.
fn run_wgpu(a: &BenchArgs, g: &decoda::wgpu::WgpuSampler) -> Result<ExitCode, String> {
    for c in &a.config {
        let p = workload::config(c).expect("checked");
        if let Some(field) = p.beyond_device() {
            return Err(format!(
                "--config {c}: {field} runs on the CPU only for now (the device kernels do \
                 not run it yet); bench it with --device cpu"
            ));
        }
    }
    let bw = g.copy_bandwidth().map_err(|e| e.to_string())?;
    let timer = if g.has_timestamps() { "gpu" } else { "wall" };
    let cells = a.config.len() * a.vocab.len() * a.rows.len() * a.dtype.len();
    let bar = ProgressBar::new(cells as u64);
    bar.set_style(
        ProgressStyle::with_template("{bar:40} {pos}/{len} {msg}").map_err(|e| e.to_string())?,
    );
    let mut lines = Vec::new();
    for &vocab in &a.vocab {
        for &rows in &a.rows {
            // distinct rows for up to 64 rows of calls; copies of them fill the rotation
            let sets = 64usize.div_ceil(rows).max(1);
            let data = a.law.rows(rows * sets, vocab);
            for name in &a.dtype {
                let dt = dtype(name)?;
                let bytes = rows * vocab * dt.size();
                let nbuf = ((a.rotate_mib << 20) as usize)
                    .div_ceil(bytes)
                    .clamp(1, 4096);
                let (h16, b16): (Vec<half::f16>, Vec<half::bf16>) = match dt {
                    decoda::DType::F32 => (Vec::new(), Vec::new()),
                    decoda::DType::F16 => (
                        data.iter().map(|&x| half::f16::from_f32(x)).collect(),
                        Vec::new(),
                    ),
                    decoda::DType::Bf16 => (
                        Vec::new(),
                        data.iter().map(|&x| half::bf16::from_f32(x)).collect(),
                    ),
                };
                let set = |k: usize| {
                    let r = k % sets * rows * vocab..(k % sets + 1) * rows * vocab;
                    match dt {
                        decoda::DType::F32 => decoda::Logits::f32(&data[r], rows, vocab),
                        decoda::DType::F16 => decoda::Logits::f16(&h16[r], rows, vocab),
                        decoda::DType::Bf16 => decoda::Logits::bf16(&b16[r], rows, vocab),
                    }
                };
                let bufs = (0..nbuf)
                    .map(|k| set(k).map(|l| g.upload_logits(&l)))
                    .collect::<Result<Vec<_>, _>>()
                    .map_err(|e| e.to_string())?;
                let views: Vec<_> = bufs
                    .iter()
                    .map(|buffer| decoda::wgpu::DeviceLogits {
                        buffer,
                        dtype: dt,
                        rows,
                        vocab,
                        row_stride: vocab,
                        offset: 0,
                    })
                    .collect();
                // (outputs with room for the kept distributions serve every config)
                let out = g.outputs_kept(rows).map_err(|e| e.to_string())?;
                let floor = bytes as f64 / bw * 1e6;
                for (c, config) in a.config.iter().enumerate() {
                    bar.set_message(format!("{config} V={vocab} B={rows} {name}"));
                    let reqs = workload::named_requests(config, rows, vocab).expect("checked");
                    // warm up: an idle GPU runs its first calls at low clocks (on a
                    // fresh H200, B = 1 greedy read 79 µs instead of 29 with 50 ms of
                    // warm-up), and the host may have spent seconds making and
                    // uploading the rows; 500 ms before a group's first cell, 50 ms
                    // before the others
                    let warm_ms = if c == 0 { 500 } else { 50 };
                    // the cell's first call, stage by stage, before any warm-up: a stage
                    // whose pipeline this process has not dispatched yet includes what
                    // the driver does at a first dispatch (llvmpipe compiles the
                    // machine code then, or loads it from its disk cache)
                    let mut first = serde_json::Map::new();
                    if g.has_timestamps() {
                        for (stage, t) in g
                            .time_stages(&views[0], &reqs, &out)
                            .map_err(|e| e.to_string())?
                        {
                            first.insert(stage.into(), json!(round2(t)));
                        }
                    }
                    let warm = std::time::Instant::now();
                    for view in views.iter().cycle() {
                        g.time_wall(view, &reqs, &out, 1)
                            .map_err(|e| e.to_string())?;
                        if warm.elapsed().as_millis() >= warm_ms {
                            break;
                        }
                    }
                    let mut k = 0usize;
                    let one = collect(a.time_ms, 10_000, || {
                        k += 1;
                        let view = &views[k % views.len()];
                        if g.has_timestamps() {
                            g.time_gpu(view, &reqs, &out, 1)
                        } else {
                            g.time_wall(view, &reqs, &out, 1)
                        }
                        .map(|v| v[0])
                        .map_err(|e| e.to_string())
                    })?;
                    // back to back: as many calls as fill about --time-ms, 16 to 256
                    let n = ((a.time_ms as f64 * 1e3 / one.median) as usize).clamp(16, 256);
                    let stream = if g.has_timestamps() {
                        quantiles(
                            g.time_stream(&views, &reqs, &out, n)
                                .map_err(|e| e.to_string())?,
                        )
                    } else {
                        Timing { ..one }
                    };
                    // a profile: each stage in a pass of its own, over 15 calls that
                    // rotate through the rows' data sets as the timed calls do; the
                    // stages of the call whose total is the median (so they add up to a
                    // real call; medians taken stage by stage need not, when the sets
                    // differ: at B = 32 two sets alternate, and one row on the full-row
                    // path made half the calls 14x slower on an H200), and of the slowest
                    let mut stages = serde_json::Map::new();
                    let mut slowest = serde_json::Map::new();
                    if g.has_timestamps() {
                        let mut runs = Vec::new();
                        for i in 0..15 {
                            runs.push(
                                g.time_stages(&views[i % views.len()], &reqs, &out)
                                    .map_err(|e| e.to_string())?,
                            );
                        }
                        let total = |r: &Vec<(&str, f64)>| r.iter().map(|x| x.1).sum::<f64>();
                        runs.sort_by(|a, b| total(a).total_cmp(&total(b)));
                        for (map, run) in [
                            (&mut stages, &runs[runs.len() / 2]),
                            (&mut slowest, &runs[runs.len() - 1]),
                        ] {
                            for (stage, t) in run {
                                map.insert((*stage).into(), json!(round2(*t)));
                            }
                        }
                    }
                    // the call's structure: known from the parameters before it runs
                    let shape = g.call_structure(vocab, &reqs).map_err(|e| e.to_string())?;
                    let line = json!({
                        "impl": "decoda", "device": g.adapter(), "config": config,
                        "vocab": vocab, "rows": rows, "dtype": name, "law": a.law.name(),
                        "dispatches": shape.dispatches, "kernels": shape.stages,
                        "workgroups": shape.workgroups,
                        "row_reads": shape.row_reads,
                        "stages_us": stages, "stages_slowest_us": slowest,
                        "first_stages_us": first,
                        "timer": timer, "median_us": round2(stream.median),
                        "p10_us": round2(stream.p10), "p90_us": round2(stream.p90),
                        "gpu_us": round2(one.median), "gpu_p10_us": round2(one.p10),
                        "gpu_p90_us": round2(one.p90), "bytes_read": bytes,
                        "floor_us": round2(floor), "nbuf": nbuf,
                        "copy_bw_gbs": round2(bw / 1e9),
                        "frac_of_measured_bw": round_sig3(floor / stream.median),
                        "gpu_frac_of_measured_bw": round_sig3(floor / one.median),
                        "pipelines_s": pipeline_times(g),
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
        println!(
            "decoda bench on {} (subgroups: {}); times per call in µs ({timer} clock): median = calls back to back, gpu = one call alone; floor = one read of the logits at the measured copy bandwidth ({:.1} GB/s)",
            g.adapter(),
            g.uses_subgroups(),
            bw / 1e9
        );
        print_table(&lines, "dtype");
        let built: Vec<String> = g
            .pipeline_build_times()
            .iter()
            .map(|(e, t)| format!("{e} {t:.2}"))
            .collect();
        println!(
            "pipelines built by this process (seconds each, the start-up a first call pays): {}",
            built.join(", ")
        );
        // the first calls' slowest stages: the driver's work at a first dispatch
        let mut firsts: Vec<(f64, String)> = lines
            .iter()
            .flat_map(|l| {
                let config = l["config"].as_str().unwrap_or("").to_string();
                l["first_stages_us"]
                    .as_object()
                    .into_iter()
                    .flatten()
                    .map(move |(k, t)| (t.as_f64().unwrap_or(0.0), format!("{k} ({config})")))
            })
            .collect();
        if !firsts.is_empty() {
            firsts.sort_by(|a, b| b.0.total_cmp(&a.0));
            let top: Vec<String> = firsts
                .iter()
                .take(5)
                .map(|(t, k)| format!("{k} {:.2}", t / 1e6))
                .collect();
            println!(
                "slowest stages of the cells' first calls (seconds; a first dispatch includes the driver's compile or cache load): {}",
                top.join(", ")
            );
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// The step kernels' pipelines built so far and the seconds each took, as JSON.
fn pipeline_times(g: &decoda::wgpu::WgpuSampler) -> serde_json::Value {
    let m: serde_json::Map<String, serde_json::Value> = g
        .pipeline_build_times()
        .into_iter()
        .map(|(e, t)| (e.to_string(), json!(round_sig3(t))))
        .collect();
    serde_json::Value::Object(m)
}

/// The logit element type named `name` (`--dtype`).
fn dtype(name: &str) -> Result<decoda::DType, String> {
    match name {
        "f32" => Ok(decoda::DType::F32),
        "f16" => Ok(decoda::DType::F16),
        "bf16" => Ok(decoda::DType::Bf16),
        other => Err(format!(
            "--dtype: unknown element type {other:?} (known: f32, f16, bf16)"
        )),
    }
}

pub fn round2(x: f64) -> f64 {
    (x * 100.0).round() / 100.0
}

/// A fraction to three significant figures: on a slow device (lavapipe) the fraction of
/// bandwidth is 1e-5 or less, and a fixed number of decimals would print it as 0.
fn round_sig3(x: f64) -> f64 {
    if x == 0.0 || !x.is_finite() {
        return x;
    }
    let scale = 10f64.powi(2 - x.abs().log10().floor() as i32);
    (x * scale).round() / scale
}

#[cfg(test)]
mod tests {
    use super::round_sig3;

    #[test]
    fn fractions_keep_three_significant_figures() {
        // lavapipe on a slow CI machine: 0.88 µs of floor against 18 ms
        assert_eq!(round_sig3(0.88 / 18386.2), 4.79e-5);
        assert_eq!(round_sig3(0.51234), 0.512);
        assert_eq!(round_sig3(1.0), 1.0);
        assert_eq!(round_sig3(0.0), 0.0);
    }
}
