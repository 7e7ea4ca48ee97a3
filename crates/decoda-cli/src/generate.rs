//! `decoda generate`: a Qwen3-MoE checkpoint end to end — prefill, then decode steps
//! whose logits the sampling head samples where they were made.

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;

use clap::Args;
use decoda::head::SlotRequest;
use decoda::model::{
    generate_checked, CheckedSequences, Engine, Qwen3Moe, Report, Sequence, SequenceOutput,
    DEFAULT_SORT_CUTOFF,
};
use decoda::CpuEngine;
use serde_json::{json, Value};

use crate::profile::Bandwidth;

mod speculate;

use crate::device::{check_threads, Device};
use crate::inputs::SamplingFlags;

#[derive(Args)]
pub struct GenerateArgs {
    /// Checkpoint directory: config.json and *.safetensors (one file, or shards with
    /// model.safetensors.index.json); tokenizer.json for --prompt.
    #[arg(long)]
    model: PathBuf,
    /// Prompt token ids, "1,2,3".
    #[arg(long, conflicts_with_all = ["prompt", "prompts"])]
    prompt_ids: Option<String>,
    /// Prompt text (needs tokenizer.json in the model directory).
    #[arg(long, conflicts_with = "prompts")]
    prompt: Option<String>,
    /// Several sequences: a file with one JSON object per line ("prompt" text or
    /// "prompt_ids", and any of "max_tokens", "seed", "stop" and the sampling keys).
    #[arg(long)]
    prompts: Option<PathBuf>,
    /// Tokens to generate per sequence.
    #[arg(long, default_value_t = 32)]
    max_tokens: u64,
    /// Stop ids, "256,1": a sequence ends after drawing one.
    #[arg(long)]
    stop: Option<String>,
    /// Stop string (repeatable): a sequence ends when its decoded text contains it, and
    /// its output is cut before it (needs tokenizer.json).
    #[arg(long = "stop-str")]
    stop_str: Vec<String>,
    /// N sequences from the one prompt, with seeds seed, seed+1, ...; the prompt is
    /// prefilled once.
    #[arg(long, default_value_t = 1)]
    n: usize,
    /// A fixed token mask for every step (a grammar's allowed tokens): an int32 or
    /// uint32 .npy of shape [ceil(V/32)], bit i % 32 of word i / 32 set for token i.
    #[arg(long)]
    grammar_mask: Option<PathBuf>,
    /// DRY sequence breaker as text (repeatable; needs tokenizer.json), e.g. "\n" or ":";
    /// added to --dry-sequence-breakers.
    #[arg(long = "dry-breaker")]
    dry_breaker: Vec<String>,
    #[command(flatten)]
    sampling: SamplingFlags,
    /// RNG seed (default: drawn from OS entropy per sequence, and reported).
    #[arg(long)]
    seed: Option<u64>,
    /// Where to run.
    #[arg(long, value_enum, default_value_t = Device::Auto)]
    device: Device,
    /// MoE calls with more tokens than this sort the pairs by expert.
    #[arg(long, default_value_t = DEFAULT_SORT_CUTOFF)]
    sort_cutoff: usize,
    /// CPU threads (0 = all cores).
    #[arg(long, default_value_t = 0)]
    threads: usize,
    /// wgpu: sample on the host (copy the logits back each step) instead of on the device;
    /// for comparison.
    #[arg(long)]
    host_sampling: bool,
    /// Print JSON.
    #[arg(long)]
    json: bool,
    /// wgpu: profile every decode step: per kernel, its device time per step (each
    /// dispatch timed in a pass of its own, so steps run slower) beside its plan
    /// (workgroups, bytes read and written) and the bytes' time at --bandwidth-gbs.
    #[arg(long)]
    profile: bool,
    /// With --profile: the bandwidth in GB/s the planned bytes' times are taken at
    /// (default: the adapter's copy rate, measured first).
    #[arg(long)]
    bandwidth_gbs: Option<f64>,
    /// Speculative decoding: a second checkpoint with the same vocabulary (a smaller
    /// model, or a dense Qwen3) drafts --speculate tokens a round with the same seeds and
    /// parameters; the model verifies them in one forward. The tokens are plain
    /// decoding's; the run also decodes plainly and prints both speeds and the
    /// acceptance.
    #[arg(long)]
    draft: Option<PathBuf>,
    /// Tokens the draft proposes a round (with --draft).
    #[arg(long, default_value_t = 4, requires = "draft")]
    speculate: usize,
}

/// Keys of a --prompts line besides the sampling parameters' (`decoda::params::PARAM_KEYS`).
const LINE_KEYS: &[&str] = &["prompt", "prompt_ids", "max_tokens", "seed", "stop"];

fn parse_ids(what: &str, s: &str) -> Result<Vec<u32>, String> {
    s.split(',')
        .map(str::trim)
        .filter(|t| !t.is_empty())
        .map(|t| {
            t.parse::<u32>()
                .map_err(|_| format!("{what}: {t:?} is not a token id"))
        })
        .collect()
}

fn load_tokenizer(dir: &Path) -> Result<Option<tokenizers::Tokenizer>, String> {
    let path = dir.join("tokenizer.json");
    if !path.exists() {
        return Ok(None);
    }
    tokenizers::Tokenizer::from_file(&path)
        .map(Some)
        .map_err(|e| format!("{}: {e}", path.display()))
}

fn encode(tok: Option<&tokenizers::Tokenizer>, dir: &Path, text: &str) -> Result<Vec<u32>, String> {
    let tok = tok.ok_or_else(|| {
        format!(
            "--prompt needs {}; give token ids with --prompt-ids",
            dir.join("tokenizer.json").display()
        )
    })?;
    let enc = tok
        .encode(text, false)
        .map_err(|e| format!("tokenizing the prompt: {e}"))?;
    Ok(enc.get_ids().to_vec())
}

fn seed_or_entropy(seed: Option<u64>) -> Result<u64, String> {
    match seed {
        Some(s) => Ok(s),
        None => decoda::SequenceState::from_entropy()
            .map(|s| s.seed)
            .map_err(|e| e.to_string()),
    }
}

/// DRY breakers given as text, each tokenized into one id sequence.
fn text_breakers(
    a: &GenerateArgs,
    tok: Option<&tokenizers::Tokenizer>,
) -> Result<Vec<Vec<u32>>, String> {
    a.dry_breaker
        .iter()
        .map(|text| {
            let ids = encode(tok, &a.model, text).map_err(|e| format!("--dry-breaker: {e}"))?;
            if ids.is_empty() {
                return Err(format!("--dry-breaker {text:?} encodes to no token"));
            }
            Ok(ids)
        })
        .collect()
}

fn sequences(
    a: &GenerateArgs,
    tok: Option<&tokenizers::Tokenizer>,
) -> Result<Vec<Sequence>, String> {
    let mut base = a.sampling.params()?;
    base.dry_sequence_breakers.extend(text_breakers(a, tok)?);
    let mask = match &a.grammar_mask {
        None => None,
        Some(path) => Some(crate::inputs::read_mask(path, 1)?.remove(0)),
    };
    let mut seqs = sequences_unmasked(a, tok, &base)?;
    if a.n == 0 {
        return Err("--n 0: expected at least 1 sequence".into());
    }
    if a.n > 1 {
        if seqs.len() != 1 {
            return Err("--n takes one prompt (--prompt or --prompt-ids), not --prompts".into());
        }
        let one = seqs.remove(0);
        let seed0 = one.request.seed.expect("seeded");
        seqs = (0..a.n as u64)
            .map(|k| Sequence {
                prompt: one.prompt.clone(),
                request: SlotRequest {
                    seed: Some(seed0.wrapping_add(k)),
                    ..one.request.clone()
                },
            })
            .collect();
    }
    if let Some(m) = mask {
        for s in &mut seqs {
            s.request.allowed = Some(m.clone());
        }
    }
    Ok(seqs)
}

fn sequences_unmasked(
    a: &GenerateArgs,
    tok: Option<&tokenizers::Tokenizer>,
    base: &decoda::SamplingParams,
) -> Result<Vec<Sequence>, String> {
    let base = base.clone();
    let stop = a
        .stop
        .as_deref()
        .map(|s| parse_ids("--stop", s))
        .transpose()?
        .unwrap_or_default();
    let Some(path) = &a.prompts else {
        let prompt = match (&a.prompt_ids, &a.prompt) {
            (Some(ids), _) => parse_ids("--prompt-ids", ids)?,
            (None, Some(text)) => encode(tok, &a.model, text)?,
            (None, None) => return Err("give --prompt-ids, --prompt or --prompts".into()),
        };
        let request = SlotRequest::new(base)
            .seed(seed_or_entropy(a.seed)?)
            .max_tokens(a.max_tokens)
            .stop(stop);
        return Ok(vec![Sequence { prompt, request }]);
    };
    let shown = path.display();
    let text = std::fs::read_to_string(path).map_err(|e| format!("cannot read {shown}: {e}"))?;
    let mut out = Vec::new();
    for (n, line) in text
        .lines()
        .enumerate()
        .filter(|(_, l)| !l.trim().is_empty())
    {
        let at = format!("{shown}:{}", n + 1);
        let v: Value = serde_json::from_str(line).map_err(|e| format!("{at}: not JSON: {e}"))?;
        let obj = v
            .as_object()
            .ok_or_else(|| format!("{at}: not a JSON object"))?;
        let known: Vec<&str> = LINE_KEYS
            .iter()
            .chain(decoda::params::PARAM_KEYS)
            .copied()
            .collect();
        if let Some(k) = obj.keys().find(|k| !known.contains(&k.as_str())) {
            return Err(format!(
                "{at}: unknown key {k:?} (known: {})",
                known.join(", ")
            ));
        }
        let prompt = match (obj.get("prompt_ids"), obj.get("prompt")) {
            (Some(ids), _) => serde_json::from_value::<Vec<u32>>(ids.clone())
                .map_err(|e| format!("{at}: prompt_ids: {e}"))?,
            (None, Some(Value::String(t))) => {
                encode(tok, &a.model, t).map_err(|e| format!("{at}: {e}"))?
            }
            (None, Some(other)) => {
                return Err(format!("{at}: prompt = {other}: expected a string"))
            }
            (None, None) => return Err(format!("{at}: needs \"prompt\" or \"prompt_ids\"")),
        };
        // the line's sampling keys over the flags'
        let mut p = serde_json::to_value(&base).map_err(|e| e.to_string())?;
        for (k, val) in obj {
            if !["prompt", "prompt_ids", "max_tokens", "seed", "stop"].contains(&k.as_str()) {
                p[k] = val.clone();
            }
        }
        let params: decoda::SamplingParams =
            serde_json::from_value(p).map_err(|e| format!("{at}: {e}"))?;
        let num = |key: &str| -> Result<Option<u64>, String> {
            obj.get(key)
                .map(|x| {
                    x.as_u64()
                        .ok_or_else(|| format!("{at}: {key} = {x}: expected a whole number"))
                })
                .transpose()
        };
        let seq_stop = match obj.get("stop") {
            Some(s) => serde_json::from_value::<Vec<u32>>(s.clone())
                .map_err(|e| format!("{at}: stop: {e}"))?,
            None => stop.clone(),
        };
        let request = SlotRequest::new(params)
            .seed(seed_or_entropy(num("seed")?.or(a.seed))?)
            .max_tokens(num("max_tokens")?.unwrap_or(a.max_tokens))
            .stop(seq_stop);
        out.push(Sequence { prompt, request });
    }
    if out.is_empty() {
        return Err(format!("{shown}: no prompts"));
    }
    Ok(out)
}

/// The engine for `--device`; a device's caches hold `positions` tokens per sequence.
fn engine(
    a: &GenerateArgs,
    model: Arc<Qwen3Moe>,
    slots: usize,
    positions: usize,
    cpu_head: bool,
) -> Result<(Box<dyn Engine + Send>, Option<Bandwidth>), String> {
    let gpu = match a.device {
        Device::Cpu => None,
        Device::Wgpu => Some(decoda::wgpu::WgpuSampler::new().map_err(|e| e.to_string())?),
        Device::Auto => crate::device::auto_gpu(),
    };
    match gpu {
        None => {
            if a.host_sampling {
                return Err(
                    "--host-sampling compares device runs; the CPU always samples on the host"
                        .into(),
                );
            }
            if a.profile {
                return Err(
                    "--profile times device dispatches; the CPU engine has none (--device wgpu)"
                        .into(),
                );
            }
            Ok((
                Box::new(CpuEngine::new(model, slots).map_err(|e| e.to_string())?),
                None,
            ))
        }
        Some(s) => {
            if cpu_head && !a.host_sampling {
                eprintln!(
                    "note: a DRY window past 4,096 tokens is sampled on the host \
                     (the device head does not hold it)"
                );
            }
            let host: Option<Box<dyn decoda::head::Head + Send>> = if a.host_sampling || cpu_head {
                let v = model.config.vocab_size;
                Some(Box::new(
                    decoda::CpuHead::new(slots, v).map_err(|e| e.to_string())?,
                ))
            } else {
                None
            };
            let bw = if a.profile {
                Some(Bandwidth::of(a.bandwidth_gbs, || s.copy_bandwidth())?)
            } else {
                None
            };
            let mut e = decoda::wgpu::WgpuEngine::new(&s, model, slots, positions, host)
                .map_err(|e| e.to_string())?;
            if a.profile {
                e.set_profile(true);
            }
            Ok((Box::new(e), bw))
        }
    }
}

pub fn run(a: GenerateArgs) -> Result<ExitCode, String> {
    check_threads(a.threads)?;
    if a.sort_cutoff == 0 {
        return Err("--sort-cutoff 0: expected at least 1 (calls with more tokens sort)".into());
    }
    if !a.model.is_dir() {
        return Err(format!(
            "--model {}: no such directory (a checkpoint is a directory with config.json and \
             its safetensors)",
            a.model.display()
        ));
    }
    let tok = load_tokenizer(&a.model)?;
    let seqs = sequences(&a, tok.as_ref())?;
    let model = Arc::new(Qwen3Moe::load(&a.model, a.sort_cutoff).map_err(|e| e.to_string())?);
    // generate's door, before any cache is sized from the sequences
    let checked = CheckedSequences::new(
        std::borrow::Cow::Borrowed(&seqs),
        model.config.vocab_size,
        seqs.len(),
        model.config.max_position_embeddings,
    )
    .map_err(|e| e.to_string())?;
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(a.threads)
        .build()
        .map_err(|e| e.to_string())?;
    let positions = seqs
        .iter()
        .map(|s| s.prompt.len() + s.request.max_tokens.unwrap_or(0) as usize)
        .max()
        .unwrap_or(1);
    let cpu_head = seqs.iter().any(|s| s.beyond_device().is_some());
    if a.bandwidth_gbs.is_some() && !a.profile {
        return Err("--bandwidth-gbs is for --profile".into());
    }
    if !a.stop_str.is_empty() && tok.is_none() {
        return Err(format!(
            "--stop-str needs {}",
            a.model.join("tokenizer.json").display()
        ));
    }
    let stops = a.stop_str.clone();
    let decoder = tok.clone();
    let mut stop_check = move |_: usize, ids: &[u32]| -> bool {
        match &decoder {
            Some(t) if !stops.is_empty() => t
                .decode(ids, false)
                .is_ok_and(|text| stops.iter().any(|s| text.contains(s.as_str()))),
            _ => false,
        }
    };
    if let Some(dir) = &a.draft {
        let spec = speculate::run(
            &a,
            dir,
            model,
            &checked,
            positions,
            cpu_head,
            &pool,
            &mut stop_check,
        )?;
        let mut report = spec.speculative.report.clone();
        (report.moe_prefill, report.moe_decode) = (spec.plain.moe_prefill, spec.plain.moe_decode);
        let texts = cut_texts(&a, tok.as_ref(), &mut report.outputs);
        let eng = spec.engine.as_ref();
        return print_report(
            &a,
            eng,
            &seqs,
            &report,
            tok.as_ref(),
            &texts,
            None,
            Some(&spec),
        );
    }
    let (mut eng, bw) = engine(&a, model, seqs.len(), positions, cpu_head)?;
    let total: u64 = seqs.iter().filter_map(|s| s.request.max_tokens).sum();
    let bar = if a.json || total < 64 {
        indicatif::ProgressBar::hidden()
    } else {
        let b = indicatif::ProgressBar::new(total);
        b.set_style(
            indicatif::ProgressStyle::with_template("{bar:40} {pos}/{len} tokens {per_sec} {eta}")
                .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar()),
        );
        b
    };
    let mut report = pool
        .install(|| {
            generate_checked(
                eng.as_mut(),
                &checked,
                &mut |n| bar.set_position(n as u64),
                &mut stop_check,
            )
        })
        .map_err(|e| e.to_string())?;
    bar.finish_and_clear();
    let texts = cut_texts(&a, tok.as_ref(), &mut report.outputs);
    print_report(
        &a,
        eng.as_ref(),
        &seqs,
        &report,
        tok.as_ref(),
        &texts,
        bw,
        None,
    )
}

/// Each output cut at its stop string, when it met one: the text before it.
fn cut_texts(
    a: &GenerateArgs,
    tok: Option<&tokenizers::Tokenizer>,
    outputs: &mut [SequenceOutput],
) -> Vec<Option<String>> {
    outputs
        .iter_mut()
        .map(|out| tok.and_then(|t| cut_at_stop_string(t, &a.stop_str, out)))
        .collect()
}

/// Cuts a sequence that met a stop string: its tokens whose text lies wholly before the
/// string, and a `text` ending right before it.
fn cut_at_stop_string(
    t: &tokenizers::Tokenizer,
    stops: &[String],
    out: &mut SequenceOutput,
) -> Option<String> {
    if stops.is_empty() {
        return None;
    }
    let text = t.decode(&out.tokens, false).ok()?;
    let at = stops.iter().filter_map(|s| text.find(s.as_str())).min()?;
    // the tokens whose text lies wholly before the stop string
    let before = &text[..at];
    let n = (0..=out.tokens.len())
        .take_while(|&n| {
            t.decode(&out.tokens[..n], false)
                .is_ok_and(|p| before.starts_with(p.as_str()))
        })
        .last()
        .unwrap_or(0);
    out.tokens.truncate(n);
    out.logprobs.truncate(n);
    out.finish = Some(decoda::head::FinishReason::Stop);
    Some(text[..at].to_string())
}

fn text_of(tok: Option<&tokenizers::Tokenizer>, ids: &[u32]) -> Option<String> {
    tok.and_then(|t| t.decode(ids, false).ok())
}

#[allow(clippy::too_many_arguments)]
fn print_report(
    a: &GenerateArgs,
    eng: &dyn Engine,
    seqs: &[Sequence],
    r: &Report,
    tok: Option<&tokenizers::Tokenizer>,
    cut: &[Option<String>],
    bw: Option<Bandwidth>,
    spec: Option<&speculate::Compared>,
) -> Result<ExitCode, String> {
    // a sequence cut at a stop string shows the text before it
    let text_at = |i: usize| {
        cut[i]
            .clone()
            .or_else(|| text_of(tok, &r.outputs[i].tokens))
    };
    let moe = json!({ "prefill": r.moe_prefill, "decode": r.moe_decode });
    let failed = r.outputs.iter().any(|o| o.error.is_some());
    if a.json {
        let seq_json = |i: usize| {
            let o = &r.outputs[i];
            let mut v = json!({
                "seed": seqs[i].request.seed,
                "prompt_tokens": seqs[i].prompt.len(),
                "tokens": o.tokens,
                "finish": o.finish,
            });
            if !o.logprobs.is_empty() {
                v["logprobs"] = json!(o.logprobs);
            }
            if let Some(t) = text_at(i) {
                v["text"] = json!(t);
            }
            if let Some(e) = &o.error {
                v["error"] = json!(e);
            }
            v
        };
        let mut out = json!({
            "device": eng.name(),
            "prefill_ms": r.prefill_ms,
            "prefill_tokens": r.prefill_tokens,
            "decode_tokens": r.decode_tokens,
            "decode_tok_s": r.decode_tok_s(),
            "decode_steps": r.decode_steps,
            "host_us_per_step": (r.host_us_per_step * 10.0).round() / 10.0,
            "dispatches_per_step": r.step_dispatches,
            "moe": moe,
        });
        out["prefills_shared"] = json!(r.forked);
        if let Some(c) = spec {
            c.add_json(&mut out);
        }
        if let Some(bw) = bw {
            out["profile"] = crate::profile::to_json(&eng.profile(), bw);
        }
        if a.prompts.is_some() || seqs.len() > 1 {
            out["sequences"] = Value::Array((0..seqs.len()).map(seq_json).collect());
        } else if let Value::Object(m) = seq_json(0) {
            for (k, v) in m {
                out[k] = v;
            }
        }
        println!("{out}");
    } else {
        for (i, o) in r.outputs.iter().enumerate() {
            let ids: Vec<String> = o.tokens.iter().map(u32::to_string).collect();
            let tag = if seqs.len() > 1 {
                format!("[{i}] ")
            } else {
                String::new()
            };
            println!("{tag}tokens: {}", ids.join(","));
            if let Some(t) = text_at(i) {
                println!("{tag}text: {t:?}");
            }
            if let Some(e) = &o.error {
                println!("{tag}error: {e}");
            }
        }
        let name = |d: Option<decoda::moe::Dispatch>| {
            d.map_or("-".to_string(), |d| format!("{d:?}").to_lowercase())
        };
        eprintln!(
            "{}: prefill {} tokens in {:.1} ms, decode {} tokens at {:.1} tok/s; MoE prefill {}, decode {}",
            eng.name(),
            r.prefill_tokens,
            r.prefill_ms,
            r.decode_tokens,
            r.decode_tok_s(),
            name(r.moe_prefill),
            name(r.moe_decode)
        );
        if let Some(bw) = bw {
            crate::profile::print(&eng.profile(), bw, "decode steps", &eng.name());
        }
        if let Some(c) = spec {
            c.print();
        }
    }
    let unequal = spec.is_some_and(|c| c.must_equal() && !c.equal());
    Ok(if failed || unequal {
        ExitCode::from(1)
    } else {
        ExitCode::SUCCESS
    })
}
