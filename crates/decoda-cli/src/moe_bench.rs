//! `decoda moe-bench`: one SwiGLU MoE layer timed with the sort forced on and forced off for
//! each token count, the crossover, and the `sort_cutoff` it recommends.

use std::process::ExitCode;
use std::time::Instant;

use clap::Args;
use decoda::moe::{Dispatch, MoeShape, WeightDtype};
use decoda::testing::synthetic;
use decoda::MoeLayer;
use indicatif::{ProgressBar, ProgressStyle};
use serde_json::json;

use crate::profile::Bandwidth;
use decoda::profile::StepProfile;

use crate::bench::round2;

fn parse_dtype(s: &str) -> Result<WeightDtype, String> {
    WeightDtype::parse(s).ok_or_else(|| {
        format!("unknown weight format {s:?} (f32, bf16, f16, q4g32, q4g64, q8g64, ...)")
    })
}

#[derive(Args)]
pub struct MoeBenchArgs {
    /// Experts E (default: 128, as Qwen3-30B-A3B).
    #[arg(long, default_value_t = MoeShape::QWEN3_30B_A3B_HALF.experts)]
    experts: usize,
    /// Experts per token k (default: 8, as Qwen3-30B-A3B).
    #[arg(long, default_value_t = MoeShape::QWEN3_30B_A3B_HALF.top_k)]
    top_k: usize,
    /// Model width D (default: 1024, half of Qwen3-30B-A3B's 2048).
    #[arg(long, default_value_t = MoeShape::QWEN3_30B_A3B_HALF.hidden)]
    hidden: usize,
    /// Expert width H (default: 384, half of Qwen3-30B-A3B's 768).
    #[arg(long, default_value_t = MoeShape::QWEN3_30B_A3B_HALF.intermediate)]
    intermediate: usize,
    /// Token counts N (comma list).
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "1,2,4,8,16,32,64,128,256,512,1024"
    )]
    tokens: Vec<usize>,
    /// Weight format: f32, bf16, f16, or MLX's affine q4g32, q4g64, q8g64 (4 or 8 bits, groups
    /// of 32, 64 or 128 inputs).
    #[arg(long, default_value = "bf16", value_parser = parse_dtype)]
    dtype: WeightDtype,
    /// Where to run the layer.
    #[arg(long, value_enum, default_value_t = crate::device::Device::Auto)]
    device: crate::device::Device,
    /// Keep gate and up as two matrices instead of one fused `[E, 2H, D]`.
    #[arg(long)]
    separate: bool,
    /// CPU threads (0 = all cores).
    #[arg(long, default_value_t = 0)]
    threads: usize,
    /// Minimum measuring time per branch and N, in milliseconds (at least 3 runs each).
    #[arg(long, default_value_t = 500)]
    time_ms: u64,
    /// Print JSON lines (one per N, then the crossover) instead of a table.
    #[arg(long)]
    json: bool,
    /// wgpu: after timing each N, profile one call of each branch: per kernel, its device
    /// time (each dispatch timed in a pass of its own) beside its plan (workgroups,
    /// bytes read and written) and the bytes' time at --bandwidth-gbs.
    #[arg(long)]
    profile: bool,
    /// With --profile: the bandwidth in GB/s the planned bytes' times are taken at
    /// (default: the adapter's copy rate, measured first).
    #[arg(long)]
    bandwidth_gbs: Option<f64>,
}

/// Medians of `a` and `b` run alternately (so drift on a shared machine hits both
/// alike): at least `min_runs` runs of each, and at least `time_ms` in all, after one
/// warm-up of each.
fn time_pair(
    time_ms: u64,
    min_runs: usize,
    mut a: impl FnMut(),
    mut b: impl FnMut(),
) -> (f64, f64) {
    a();
    b();
    let (mut sa, mut sb) = (Vec::new(), Vec::new());
    let start = Instant::now();
    while sa.len() < min_runs || (start.elapsed().as_millis() as u64) < time_ms {
        let t = Instant::now();
        a();
        sa.push(t.elapsed().as_secs_f64() * 1e6);
        let t = Instant::now();
        b();
        sb.push(t.elapsed().as_secs_f64() * 1e6);
        if sa.len() >= 10_000 {
            break;
        }
    }
    let median = |mut v: Vec<f64>| {
        v.sort_by(f64::total_cmp);
        v[v.len() / 2]
    };
    (median(sa), median(sb))
}

/// The crossover (smallest swept N from which the sorted branch is faster at every larger
/// swept N) and the recommended `sort_cutoff` (the largest swept N below it, at least 1;
/// with no crossover, the largest N swept).
pub fn crossover(points: &[(usize, f64, f64)]) -> (Option<usize>, usize) {
    let mut cross = None;
    for (i, &(_, s, u)) in points.iter().enumerate().rev() {
        if s >= u {
            break;
        }
        cross = Some(i);
    }
    match cross {
        Some(0) => (Some(points[0].0), points[0].0.saturating_sub(1).max(1)),
        Some(i) => (Some(points[i].0), points[i - 1].0.max(1)),
        None => (None, points.last().map_or(1, |p| p.0.max(1))),
    }
}

pub fn run(a: MoeBenchArgs) -> Result<ExitCode, String> {
    if a.tokens.is_empty() || a.tokens.contains(&0) {
        return Err("--tokens must be a comma list of counts >= 1".into());
    }
    let shape = MoeShape {
        experts: a.experts,
        top_k: a.top_k,
        hidden: a.hidden,
        intermediate: a.intermediate,
    };
    for (flag, v) in [
        ("--experts", shape.experts),
        ("--hidden", shape.hidden),
        ("--intermediate", shape.intermediate),
    ] {
        if v == 0 {
            return Err(format!("{flag} must be >= 1"));
        }
    }
    if shape.top_k == 0 || shape.top_k > shape.experts {
        return Err(format!(
            "--top-k {} must be between 1 and --experts {}",
            shape.top_k, shape.experts
        ));
    }
    crate::device::check_threads(a.threads)?;
    // Memory the run needs: the weights (gate, up, down), the largest batch's activations
    // and gathered rows; refuse sizes that overflow or exceed a budget before allocating.
    let dtype = a.dtype;
    let elem: u128 = (dtype.bytes_per_weight() * 8.0).ceil() as u128;
    let (e, k, d, h) = (
        shape.experts as u128,
        shape.top_k as u128,
        shape.hidden as u128,
        shape.intermediate as u128,
    );
    let n = *a.tokens.iter().max().expect("non-empty") as u128;
    let weights = e * 3 * h * d * elem / 8;
    let acts = n * k * (2 * d + 3 * h) * 4 + n * d * 8;
    let budget: u128 = 64 << 30;
    if weights + acts > budget {
        return Err(format!(
            "this shape needs about {} GiB (experts {}, top-k {}, hidden {}, intermediate {}, \
             tokens up to {n}); the limit is {} GiB",
            (weights + acts) >> 30,
            shape.experts,
            shape.top_k,
            shape.hidden,
            shape.intermediate,
            budget >> 30
        ));
    }
    if let WeightDtype::Affine(q) = dtype {
        if !shape.hidden.is_multiple_of(q.group) || !shape.intermediate.is_multiple_of(q.group) {
            return Err(format!(
                "{}: --hidden {} and --intermediate {} must be multiples of the group size {}",
                dtype.name(),
                shape.hidden,
                shape.intermediate,
                q.group
            ));
        }
    }
    let mut tokens = a.tokens.clone();
    tokens.sort_unstable();
    tokens.dedup();
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(a.threads)
        .build()
        .map_err(|e| e.to_string())?;
    let threads = pool.current_num_threads();
    let bytes =
        (3 * shape.experts * shape.hidden * shape.intermediate) as f64 * dtype.bytes_per_weight();
    if !a.json {
        println!(
            "building the layer: E={} k={} D={} H={} {} ({} weights, {:.0} MB)",
            shape.experts,
            shape.top_k,
            shape.hidden,
            shape.intermediate,
            dtype.name(),
            if a.separate {
                "separate gate/up"
            } else {
                "fused gate/up"
            },
            bytes / 1e6
        );
    }
    // The cutoff does not matter: every call below forces its branch.
    let cpu_layer = pool
        .install(|| synthetic::layer(shape, dtype, !a.separate, 1, 11))
        .map_err(|e| e.to_string())?;
    let gpu = match a.device {
        crate::device::Device::Cpu => None,
        crate::device::Device::Wgpu => {
            Some(decoda::wgpu::WgpuSampler::new().map_err(|e| e.to_string())?)
        }
        crate::device::Device::Auto => crate::device::auto_gpu(),
    };
    if a.bandwidth_gbs.is_some() && !a.profile {
        return Err("--bandwidth-gbs is for --profile".into());
    }
    let bw = match (&gpu, a.profile) {
        (Some(g), true) => Some(Bandwidth::of(a.bandwidth_gbs, || g.copy_bandwidth())?),
        (None, true) => {
            return Err(
                "--profile times device dispatches; the CPU layer has none (--device wgpu)".into(),
            )
        }
        _ => None,
    };
    let gpu_layer = match &gpu {
        Some(g) => Some(decoda::wgpu::WgpuMoe::new(g, &cpu_layer).map_err(|e| e.to_string())?),
        None => None,
    };
    let cpu_moe;
    let layer: &dyn MoeLayer = match &gpu_layer {
        Some(l) => l,
        None => {
            cpu_moe = decoda::cpu::CpuMoe::new(cpu_layer);
            &cpu_moe
        }
    };
    let device_name = layer.name();
    if !a.json {
        println!("on {device_name}");
    }
    let bar = ProgressBar::new(tokens.len() as u64);
    bar.set_style(
        ProgressStyle::with_template("{bar:40} {pos}/{len} {msg}").map_err(|e| e.to_string())?,
    );
    let mut rows = Vec::new();
    let mut points = Vec::new();
    for &n in &tokens {
        bar.set_message(format!("N={n}"));
        let (x, routing) = synthetic::inputs(shape, n, n as u64).map_err(|e| e.to_string())?;
        let run = |d: Dispatch| {
            pool.install(|| layer.forward_with(&x, &routing, d))
                .map_err(|e| e.to_string())
        };
        let ys = run(Dispatch::Sorted)?.y;
        let yu = run(Dispatch::Unsorted)?.y;
        let scale = yu
            .iter()
            .fold(0f32, |m, v| m.max(v.abs()))
            .max(f32::MIN_POSITIVE);
        let diff = ys
            .iter()
            .zip(&yu)
            .fold(0f32, |m, (a, b)| m.max((a - b).abs()))
            / scale;
        let (sorted_us, unsorted_us) = time_pair(
            a.time_ms,
            3,
            || {
                std::hint::black_box(run(Dispatch::Sorted).expect("checked above"));
            },
            || {
                std::hint::black_box(run(Dispatch::Unsorted).expect("checked above"));
            },
        );
        let mut line = json!({
            "experts": shape.experts, "top_k": shape.top_k, "hidden": shape.hidden,
            "intermediate": shape.intermediate, "dtype": dtype.name(), "tokens": n,
            "sorted_us": round2(sorted_us), "unsorted_us": round2(unsorted_us),
            "threads": threads, "fused": !a.separate, "max_rel_diff": diff,
            "device": device_name,
        });
        if let (Some(l), Some(bw)) = (&gpu_layer, bw) {
            for (d, key) in [
                (Dispatch::Sorted, "profile_sorted"),
                (Dispatch::Unsorted, "profile_unsorted"),
            ] {
                // one call to settle, then three profiled
                l.profile_call(&x, &routing, d).map_err(|e| e.to_string())?;
                let mut p = StepProfile::default();
                for _ in 0..3 {
                    p.push_step(l.profile_call(&x, &routing, d).map_err(|e| e.to_string())?);
                }
                if a.json {
                    line[key] = crate::profile::to_json(&p, bw);
                } else {
                    bar.suspend(|| {
                        crate::profile::print(
                            &p,
                            bw,
                            &format!("{} calls at N = {n}", key.trim_start_matches("profile_")),
                            &device_name,
                        )
                    });
                }
            }
        }
        if a.json {
            bar.suspend(|| println!("{line}"));
        }
        rows.push(line);
        points.push((n, sorted_us, unsorted_us));
        bar.inc(1);
    }
    bar.finish_and_clear();
    let (cross, cutoff) = crossover(&points);
    if a.json {
        println!(
            "{}",
            json!({"crossover": cross, "recommended_sort_cutoff": cutoff})
        );
        return Ok(ExitCode::SUCCESS);
    }
    println!("times per layer call in µs, {threads} threads; the sorted and unsorted results agree to max_rel_diff");
    println!(
        "{:>6} {:>12} {:>12} {:>16} {:>13}",
        "tokens", "sorted", "unsorted", "unsorted/sorted", "max_rel_diff"
    );
    for (l, &(n, s, u)) in rows.iter().zip(&points) {
        println!(
            "{:>6} {:>12.1} {:>12.1} {:>16.2} {:>13.1e}",
            n,
            s,
            u,
            u / s,
            l["max_rel_diff"].as_f64().unwrap_or(f64::NAN)
        );
    }
    match cross {
        Some(c) => println!(
            "crossover: sorting wins from N = {c}; recommended sort_cutoff = {cutoff} (sort when N > {cutoff})"
        ),
        None => println!(
            "crossover: sorting never won up to N = {}; recommended sort_cutoff = {cutoff}",
            points.last().map_or(0, |p| p.0)
        ),
    }
    Ok(ExitCode::SUCCESS)
}

#[cfg(test)]
mod tests {
    use super::crossover;

    #[test]
    fn crossover_rules() {
        // unsorted wins at 1, 2; sorted from 4 on
        let p = [(1, 5.0, 2.0), (2, 5.0, 4.0), (4, 5.0, 8.0), (8, 5.0, 16.0)];
        assert_eq!(crossover(&p), (Some(4), 2));
        // a sorted win followed by a loss does not count
        let p = [(1, 1.0, 2.0), (2, 5.0, 4.0), (4, 5.0, 8.0)];
        assert_eq!(crossover(&p), (Some(4), 2));
        // sorted wins everywhere
        let p = [(1, 1.0, 2.0), (2, 1.0, 4.0)];
        assert_eq!(crossover(&p), (Some(1), 1));
        // never
        let p = [(1, 5.0, 2.0), (64, 5.0, 4.0)];
        assert_eq!(crossover(&p), (None, 64));
    }
}
