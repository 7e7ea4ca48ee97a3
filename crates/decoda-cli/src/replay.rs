//! `decoda replay`: runs the sampling head over logged logits, to reproduce a decode.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::Args;
use decoda::head::{FinishReason, Head, SlotRequest};
use decoda::CpuHead;
use decoda::Request;
use serde_json::json;

use crate::device::Device;
use crate::inputs::{keys, read_array, LogitsFile};

#[derive(Args)]
pub struct ReplayArgs {
    /// Logits: a C-order f32 or f16 .npy of shape [T, S, V], what slot s sees at step t.
    #[arg(long)]
    logits: PathBuf,
    /// A JSON array with one object per slot: the sampling parameters (as in `sample
    /// --params`), `seed`, `step`, `prompt`, `output` (history before its first step),
    /// `join` (its first step, default 0), `max_tokens` and `stop` (ids).
    #[arg(long)]
    params: PathBuf,
    /// Token masks per step and slot: an int32 or uint32 .npy of shape [T, S, ceil(V/32)]
    /// (bit i % 32 of word i / 32 set for an allowed token i), applied at their step.
    #[arg(long)]
    mask: Option<PathBuf>,
    /// Where to run the head (auto: the GPU when there is one, unless a slot's
    /// parameters need the CPU head).
    #[arg(long, value_enum, default_value_t = Device::Auto)]
    device: Device,
    /// Print JSON instead of text.
    #[arg(long)]
    json: bool,
}

/// One slot of the params file.
struct SlotSpec {
    request: Request,
    seeded: bool,
    join: u64,
    max_tokens: Option<u64>,
    stop: Vec<u32>,
}

fn read_specs(a: &ReplayArgs, slots: usize) -> Result<Vec<SlotSpec>, String> {
    let shown = a.params.display();
    let text =
        std::fs::read_to_string(&a.params).map_err(|e| format!("cannot read {shown}: {e}"))?;
    let items: Vec<serde_json::Value> = serde_json::from_str(&text)
        .map_err(|e| format!("{shown}: not a JSON array of objects: {e}"))?;
    if items.len() != slots {
        return Err(format!(
            "{shown} has {} slot objects; the logits have {slots} slots",
            items.len()
        ));
    }
    items
        .into_iter()
        .enumerate()
        .map(|(s, item)| {
            let mut obj = item
                .as_object()
                .cloned()
                .ok_or_else(|| format!("{shown}: slot {s} is not an object"))?;
            let extra = ["join", "max_tokens", "stop"];
            let known = keys();
            if let Some(k) = obj
                .keys()
                .find(|k| !known.contains(&k.as_str()) && !extra.contains(&k.as_str()))
            {
                return Err(format!(
                    "{shown}: slot {s}: unknown key {k:?} (known: {}, {})",
                    known.join(", "),
                    extra.join(", ")
                ));
            }
            let num = |v: Option<serde_json::Value>, field: &str| -> Result<Option<u64>, String> {
                match v {
                    None | Some(serde_json::Value::Null) => Ok(None),
                    Some(v) => v
                        .as_u64()
                        .map(Some)
                        .ok_or_else(|| format!("{shown}: slot {s}: {field} = {v} is not a count")),
                }
            };
            let join = num(obj.remove("join"), "join")?.unwrap_or(0);
            let max_tokens = num(obj.remove("max_tokens"), "max_tokens")?;
            let stop: Vec<u32> = match obj.remove("stop") {
                None | Some(serde_json::Value::Null) => Vec::new(),
                Some(v) => serde_json::from_value(v)
                    .map_err(|e| format!("{shown}: slot {s}: stop: {e}"))?,
            };
            let seeded = obj.contains_key("seed");
            let request: Request = serde_json::from_value(serde_json::Value::Object(obj))
                .map_err(|e| format!("{shown}: slot {s}: {e}"))?;
            Ok(SlotSpec {
                request,
                seeded,
                join,
                max_tokens,
                stop,
            })
        })
        .collect()
}

/// What became of a slot.
struct Outcome {
    seed: u64,
    tokens: Vec<u32>,
    finished: Option<FinishReason>,
    error: Option<decoda::RowError>,
}

pub fn run(a: ReplayArgs) -> Result<ExitCode, String> {
    let (data, shape) = read_array(&a.logits, &[3])?;
    let (t, slots, v) = (shape[0], shape[1], shape[2]);
    let specs = read_specs(&a, slots)?;
    let masks = match &a.mask {
        None => None,
        Some(path) => {
            let (words, shape) = crate::inputs::read_words(path, &[3])?;
            if shape[0] != t || shape[1] != slots || shape[2] != v.div_ceil(32) {
                return Err(format!(
                    "{}: masks of shape {shape:?}; the logits need [{t}, {slots}, {}]",
                    path.display(),
                    v.div_ceil(32)
                ));
            }
            Some(words)
        }
    };
    // the device head runs neither masks nor the later stages yet
    // (a slot's fixed mask and step masks together: only the CPU head combines them)
    let cpu_only = specs.iter().any(|s| {
        s.request.beyond_device().is_some() || (masks.is_some() && s.request.allowed.is_some())
    });
    let mut head: Box<dyn Head> = match a.device {
        Device::Cpu => Box::new(CpuHead::new(slots, v).map_err(|e| e.to_string())?),
        Device::Wgpu => {
            let s = decoda::wgpu::WgpuSampler::new().map_err(|e| e.to_string())?;
            Box::new(decoda::wgpu::WgpuHead::new(&s, slots, v).map_err(|e| e.to_string())?)
        }
        Device::Auto => match crate::device::auto_gpu().filter(|_| !cpu_only) {
            Some(s) => {
                Box::new(decoda::wgpu::WgpuHead::new(&s, slots, v).map_err(|e| e.to_string())?)
            }
            None => Box::new(CpuHead::new(slots, v).map_err(|e| e.to_string())?),
        },
    };
    // every request is checked before anything runs
    for (s, spec) in specs.iter().enumerate() {
        slot_request(spec)
            .validate(s, v)
            .map_err(|e| e.to_string())?;
    }
    let mut out: Vec<Outcome> = specs
        .iter()
        .map(|spec| Outcome {
            seed: spec.request.state.seed,
            tokens: Vec::new(),
            finished: None,
            error: None,
        })
        .collect();
    let mut active = vec![false; slots];
    for step in 0..t {
        for (s, spec) in specs.iter().enumerate() {
            if spec.join == step as u64 {
                let mut req = slot_request(spec);
                if !spec.seeded {
                    req.seed = None;
                }
                out[s].seed = head.join(s, req).map_err(|e| e.to_string())?;
                active[s] = true;
            }
        }
        let rows: Vec<usize> = (0..slots).filter(|&s| active[s]).collect();
        if rows.is_empty() {
            continue;
        }
        let w = v.div_ceil(32);
        let step_masks: Vec<Option<&[u32]>> = rows
            .iter()
            .map(|&s| {
                masks
                    .as_ref()
                    .map(|m| &m[(step * slots + s) * w..(step * slots + s + 1) * w])
            })
            .collect();
        let got = step_rows(head.as_mut(), &data, step, (slots, v), &rows, &step_masks)?;
        for r in got {
            let o = &mut out[r.slot];
            match r.result {
                Ok(sample) => o.tokens.push(sample.token),
                Err(e) => o.error = Some(e),
            }
            o.finished = r.finished;
            if o.finished.is_some() || o.error.is_some() {
                head.leave(r.slot).map_err(|e| e.to_string())?;
                active[r.slot] = false;
            }
        }
    }
    print(&a, head.name(), &out)
}

fn slot_request(spec: &SlotSpec) -> SlotRequest {
    SlotRequest {
        params: spec.request.params.clone(),
        seed: Some(spec.request.state.seed),
        step: spec.request.state.step,
        prompt: spec.request.state.prompt.clone(),
        output: spec.request.state.output.clone(),
        max_tokens: spec.max_tokens,
        stop: spec.stop.clone(),
        allowed: spec.request.allowed.clone(),
    }
}

/// One step of the head over the slots `rows`, with their logits of step `step`.
fn step_rows(
    head: &mut dyn Head,
    data: &LogitsFile,
    step: usize,
    (slots, v): (usize, usize),
    rows: &[usize],
    masks: &[Option<&[u32]>],
) -> Result<Vec<decoda::head::SlotStep>, String> {
    let at = |s: usize| (step * slots + s) * v;
    let r = match data {
        LogitsFile::F32(d) => {
            let rows_data: Vec<f32> = rows
                .iter()
                .flat_map(|&s| d[at(s)..at(s) + v].iter().copied())
                .collect();
            let l = decoda::Logits::f32(&rows_data, rows.len(), v).map_err(|e| e.to_string())?;
            head.step_masked(&l, rows, masks)
        }
        LogitsFile::F16(d) => {
            let rows_data: Vec<half::f16> = rows
                .iter()
                .flat_map(|&s| d[at(s)..at(s) + v].iter().copied())
                .collect();
            let l = decoda::Logits::f16(&rows_data, rows.len(), v).map_err(|e| e.to_string())?;
            head.step_masked(&l, rows, masks)
        }
    };
    r.map_err(|e| format!("step {step}: {e}"))
}

fn print(a: &ReplayArgs, device: String, out: &[Outcome]) -> Result<ExitCode, String> {
    let failed = out.iter().any(|o| o.error.is_some());
    let finished = |f: Option<FinishReason>| match f {
        Some(FinishReason::Stop) => json!("stop"),
        Some(FinishReason::Length) => json!("length"),
        None => serde_json::Value::Null,
    };
    if a.json {
        let slots: Vec<serde_json::Value> = out
            .iter()
            .enumerate()
            .map(|(s, o)| {
                let mut v = json!({
                    "slot": s, "seed": o.seed, "tokens": o.tokens, "finished": finished(o.finished),
                });
                if let Some(e) = o.error {
                    v["error"] = json!({"kind": e.kind(), "message": e.to_string()});
                }
                v
            })
            .collect();
        println!("{}", json!({ "device": device, "slots": slots }));
    } else {
        println!("device {device}, {} slots", out.len());
        for (s, o) in out.iter().enumerate() {
            let toks: Vec<String> = o.tokens.iter().map(|t| t.to_string()).collect();
            let end = match (o.error, o.finished) {
                (Some(e), _) => format!(" (error {}: {e})", e.kind()),
                (None, Some(FinishReason::Stop)) => " (stop)".into(),
                (None, Some(FinishReason::Length)) => " (length)".into(),
                (None, None) => String::new(),
            };
            println!("slot {s} (seed {}): {}{end}", o.seed, toks.join(" "));
        }
    }
    Ok(if failed {
        ExitCode::from(1)
    } else {
        ExitCode::SUCCESS
    })
}
