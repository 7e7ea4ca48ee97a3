//! `decoda bench --head`: decode steps of the sampling head next to the per-call API on
//! the same rows, with histories of increasing length.

use std::process::ExitCode;
use std::time::Instant;

use decoda::head::{Head, SlotRequest};
use decoda::CpuHead;
use decoda::{Backend, Request, SamplingParams, SequenceState};
use serde_json::json;

use crate::bench::{quantiles, round2, Timing};

/// The parameters every slot runs with: the usual filters and all three penalties.
fn params() -> SamplingParams {
    SamplingParams {
        temperature: 0.8,
        top_k: 50,
        top_p: 0.9,
        repetition_penalty: 1.1,
        frequency_penalty: 0.2,
        presence_penalty: 0.1,
        ..Default::default()
    }
}

/// Steps to time: enough for `time_ms`, at least 5.
fn iters_for(first_ms: f64, time_ms: u64) -> usize {
    ((time_ms as f64 / first_ms.max(0.01)).ceil() as usize).clamp(5, 200)
}

pub fn run(
    vocabs: &[usize],
    slots: &[usize],
    histories: &[usize],
    time_ms: u64,
    as_json: bool,
    gpu: Option<&decoda::wgpu::WgpuSampler>,
) -> Result<ExitCode, String> {
    let v = *vocabs.first().ok_or("--vocab is empty")?;
    let mut lines = Vec::new();
    let mut emit = |line: serde_json::Value| {
        if as_json {
            println!("{line}");
        }
        lines.push(line);
    };
    for &s in slots {
        let data = decoda::testing::workload::logits(s, v, 7);
        for &h in histories {
            // every slot: a history of h tokens (half prompt, half earlier output)
            let mut rng = decoda::testing::Rng::new(h as u64 + 1);
            let reqs: Vec<Request> = (0..s)
                .map(|k| {
                    let mut st = SequenceState::new(k as u64);
                    st.prompt = (0..h / 2).map(|_| rng.below(v as u64) as u32).collect();
                    st.output = (0..h - h / 2).map(|_| rng.below(v as u64) as u32).collect();
                    Request {
                        params: params(),
                        state: st,
                        allowed: None,
                    }
                })
                .collect();
            let rows: Vec<usize> = (0..s).collect();
            let join = |head: &mut dyn Head| -> Result<(), String> {
                for (k, r) in reqs.iter().enumerate() {
                    head.join(
                        k,
                        SlotRequest::new(r.params.clone())
                            .seed(r.state.seed)
                            .prompt(r.state.prompt.clone())
                            .output(r.state.output.clone()),
                    )
                    .map_err(|e| e.to_string())?;
                }
                Ok(())
            };
            match gpu {
                Some(g) => {
                    let logits = decoda::Logits::f32(&data, s, v).map_err(|e| e.to_string())?;
                    let buf = g.upload_logits(&logits);
                    let view = decoda::wgpu::DeviceLogits {
                        buffer: &buf,
                        dtype: decoda::DType::F32,
                        rows: s,
                        vocab: v,
                        row_stride: v,
                        offset: 0,
                    };
                    let mut head =
                        decoda::wgpu::WgpuHead::new(g, s, v).map_err(|e| e.to_string())?;
                    join(&mut head)?;
                    let first = head
                        .time_steps(&view, &rows, 1)
                        .map_err(|e| e.to_string())?;
                    let n = iters_for((first[0].host_us + first[0].device_us) / 1e3, time_ms);
                    let t = head
                        .time_steps(&view, &rows, n)
                        .map_err(|e| e.to_string())?;
                    let out = g.outputs_kept(s).map_err(|e| e.to_string())?;
                    let c = g
                        .time_calls(&view, &reqs, &out, n)
                        .map_err(|e| e.to_string())?;
                    for (api, times) in [("head", t), ("per-call", c)] {
                        let host = quantiles(times.iter().map(|x| x.host_us).collect());
                        let dev = quantiles(times.iter().map(|x| x.device_us).collect());
                        emit(json!({
                            "api": api, "device": g.adapter(), "slots": s, "history": h,
                            "vocab": v, "host_us": round2(host.median),
                            "device_us": round2(dev.median), "steps": n,
                        }));
                    }
                }
                None => {
                    let logits = decoda::Logits::f32(&data, s, v).map_err(|e| e.to_string())?;
                    let mut head = CpuHead::new(s, v).map_err(|e| e.to_string())?;
                    join(&mut head)?;
                    let cpu = decoda::CpuSampler::new();
                    let time =
                        |f: &mut dyn FnMut() -> Result<(), String>| -> Result<Timing, String> {
                            let t = Instant::now();
                            f()?;
                            let n = iters_for(t.elapsed().as_secs_f64() * 1e3, time_ms);
                            let mut v = Vec::with_capacity(n);
                            for _ in 0..n {
                                let t = Instant::now();
                                f()?;
                                v.push(t.elapsed().as_secs_f64() * 1e6);
                            }
                            Ok(quantiles(v))
                        };
                    let th = time(&mut || {
                        head.step(&logits, &rows)
                            .map(|_| ())
                            .map_err(|e| e.to_string())
                    })?;
                    let tc = time(&mut || {
                        cpu.sample(&logits, &reqs)
                            .map(|_| ())
                            .map_err(|e| e.to_string())
                    })?;
                    for (api, t) in [("head", th), ("per-call", tc)] {
                        emit(json!({
                            "api": api, "device": "cpu", "slots": s, "history": h, "vocab": v,
                            "host_us": round2(t.median), "device_us": 0.0,
                        }));
                    }
                }
            }
        }
    }
    if !as_json {
        println!(
            "sampling head vs per-call API, V = {v}, top-k 50, top-p 0.9, T 0.8 and all three \
             penalties; per step: host_us = record + submit on the host (the CPU: the whole \
             step), device_us = the step on the device"
        );
        println!(
            "{:<9} {:>6} {:>8} {:>12} {:>12}",
            "api", "slots", "history", "host_us", "device_us"
        );
        for l in &lines {
            println!(
                "{:<9} {:>6} {:>8} {:>12.1} {:>12.1}",
                l["api"].as_str().unwrap_or(""),
                l["slots"].as_u64().unwrap_or(0),
                l["history"].as_u64().unwrap_or(0),
                l["host_us"].as_f64().unwrap_or(0.0),
                l["device_us"].as_f64().unwrap_or(0.0)
            );
        }
    }
    Ok(ExitCode::SUCCESS)
}
