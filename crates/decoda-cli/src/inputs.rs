//! Reading logits (.npy) and per-row parameters (flags or JSON).

use std::collections::BTreeMap;
use std::path::Path;

use clap::Args;
use decoda::{LogprobsMode, Request, SamplingParams, SequenceState};
use half::f16;

/// Logits read from a .npy file, widened to their own type.
pub enum LogitsFile {
    /// f32 values.
    F32(Vec<f32>),
    /// f16 values.
    F16(Vec<f16>),
}

/// A `[rows, vocab]` batch read from disk.
pub struct Batch {
    pub data: LogitsFile,
    pub rows: usize,
    pub vocab: usize,
}

impl Batch {
    pub fn logits(&self) -> Result<decoda::Logits<'_>, String> {
        match &self.data {
            LogitsFile::F32(d) => decoda::Logits::f32(d, self.rows, self.vocab),
            LogitsFile::F16(d) => decoda::Logits::f16(d, self.rows, self.vocab),
        }
        .map_err(|e| e.to_string())
    }

    pub fn row_f32(&self, r: usize) -> Vec<f32> {
        let range = r * self.vocab..(r + 1) * self.vocab;
        match &self.data {
            LogitsFile::F32(d) => d[range].to_vec(),
            LogitsFile::F16(d) => d[range].iter().map(|h| h.to_f32()).collect(),
        }
    }
}

/// Reads a C-order f32 or f16 .npy of shape `[V]` or `[B, V]`.
pub fn read_npy(path: &Path) -> Result<Batch, String> {
    let shown = path.display();
    let (data, shape) = read_array(path, &[1, 2])?;
    let (rows, vocab) = match shape.as_slice() {
        [v] => (1, *v),
        [b, v] => (*b, *v),
        other => {
            return Err(format!(
                "{shown}: logits must have shape [V] or [B, V], not {other:?}"
            ))
        }
    };
    Ok(Batch { data, rows, vocab })
}

/// Reads a C-order f32 or f16 .npy whose rank is one of `ranks`; its values and shape.
/// The header's shape is checked against the file's size before anything is allocated.
pub fn read_array(path: &Path, ranks: &[usize]) -> Result<(LogitsFile, Vec<usize>), String> {
    let shown = path.display();
    let file = std::fs::File::open(path).map_err(|e| format!("cannot open {shown}: {e}"))?;
    let npy = npyz::NpyFile::new(std::io::BufReader::new(file))
        .map_err(|e| format!("{shown} is not a valid .npy file: {e}"))?;
    if npy.order() != npyz::Order::C {
        return Err(format!(
            "{shown}: Fortran-order arrays are not supported; save in C order"
        ));
    }
    let shape = npy.shape().to_vec();
    if !ranks.contains(&shape.len()) {
        return Err(format!(
            "{shown}: logits of shape {shape:?}; expected {} dimensions",
            ranks
                .iter()
                .map(|r| r.to_string())
                .collect::<Vec<_>>()
                .join(" or ")
        ));
    }
    if shape.contains(&0) {
        return Err(format!("{shown}: empty logits of shape {shape:?}"));
    }
    // the header's shape must fit the file before anything is allocated for it
    let file_len = std::fs::metadata(path)
        .map_err(|e| format!("cannot read {shown}: {e}"))?
        .len();
    let elem = npy.dtype().num_bytes().unwrap_or(1) as u64;
    let need = shape
        .iter()
        .try_fold(1u64, |acc, &d| acc.checked_mul(d))
        .and_then(|n| n.checked_mul(elem));
    match need {
        Some(n) if n <= file_len => {}
        _ => {
            return Err(format!(
                "{shown}: the header's shape {shape:?} needs more data than the file's {file_len} bytes"
            ))
        }
    }
    let vocab = *shape.last().expect("rank >= 1") as usize;
    if vocab > u32::MAX as usize {
        return Err(format!(
            "{shown}: vocabulary size {vocab} does not fit u32 token ids"
        ));
    }
    let dtype = npy.dtype().descr().trim_matches('\'').to_string();
    let data = match dtype.trim_start_matches(['<', '=', '|']) {
        "f4" => LogitsFile::F32(npy.into_vec::<f32>().map_err(|e| format!("{shown}: {e}"))?),
        "f2" => LogitsFile::F16(npy.into_vec::<f16>().map_err(|e| format!("{shown}: {e}"))?),
        _ => {
            return Err(format!(
                "{shown}: logits must be float32 or float16 (little-endian), not {dtype}"
            ))
        }
    };
    Ok((data, shape.iter().map(|&d| d as usize).collect()))
}

/// The sampling flags shared by `sample` and `generate`.
#[derive(clap::Args, Clone, Debug)]
pub struct SamplingFlags {
    /// Temperature (0 = greedy).
    #[arg(long, default_value_t = 1.0, allow_negative_numbers = true)]
    pub temperature: f32,
    /// Keep the k most likely tokens (0 = off).
    #[arg(long, default_value_t = 0)]
    pub top_k: u32,
    /// Nucleus mass (1 = off).
    #[arg(long, default_value_t = 1.0, allow_negative_numbers = true)]
    pub top_p: f32,
    /// Minimum probability relative to the most likely token (0 = off).
    #[arg(long, default_value_t = 0.0, allow_negative_numbers = true)]
    pub min_p: f32,
    /// Multiplicative repetition penalty (1 = off).
    #[arg(long, default_value_t = 1.0, allow_negative_numbers = true)]
    pub repetition_penalty: f32,
    /// Frequency penalty in [-2, 2].
    #[arg(long, default_value_t = 0.0, allow_negative_numbers = true)]
    pub frequency_penalty: f32,
    /// Presence penalty in [-2, 2].
    #[arg(long, default_value_t = 0.0, allow_negative_numbers = true)]
    pub presence_penalty: f32,
    /// Logit bias, "id:bias,id:bias" (bias may be -inf).
    #[arg(long, allow_hyphen_values = true)]
    pub logit_bias: Option<String>,
    /// Report the N most likely tokens' logprobs (0..=20).
    #[arg(long)]
    pub logprobs: Option<u32>,
    /// Which logprobs: raw or processed.
    #[arg(long, default_value = "raw")]
    pub logprobs_mode: LogprobsMode,
    /// DRY penalty multiplier (0 = off).
    #[arg(long, default_value_t = 0.0, allow_negative_numbers = true)]
    pub dry_multiplier: f32,
    /// DRY base (>= 1): the penalty grows as base^(length - allowed length).
    #[arg(long, default_value_t = 1.75, allow_negative_numbers = true)]
    pub dry_base: f32,
    /// DRY: repeats up to this many tokens go unpenalised.
    #[arg(long, default_value_t = 2)]
    pub dry_allowed_length: u32,
    /// DRY: how many of the last tokens it scans (-1 = all, 0 = off).
    #[arg(long, default_value_t = -1, allow_negative_numbers = true)]
    pub dry_penalty_last_n: i32,
    /// DRY sequence breakers as token ids: sequences separated by ';', ids by ','
    /// ("13;25,26"). `generate` also takes text breakers (--dry-breaker).
    #[arg(long)]
    pub dry_sequence_breakers: Option<String>,
    /// Top-n-sigma: keep tokens within n standard deviations of the top (0 = off).
    #[arg(long, default_value_t = 0.0, allow_negative_numbers = true)]
    pub top_n_sigma: f32,
    /// Locally typical sampling mass (1 = off).
    #[arg(long, default_value_t = 1.0, allow_negative_numbers = true)]
    pub typical_p: f32,
    /// XTC: the chance per step that the top choices are excluded (0 = off).
    #[arg(long, default_value_t = 0.0, allow_negative_numbers = true)]
    pub xtc_probability: f32,
    /// XTC: the probability that makes a token a top choice.
    #[arg(long, default_value_t = 0.1, allow_negative_numbers = true)]
    pub xtc_threshold: f32,
    /// Report the kept distribution: its N most likely tokens (0..=1024) and its size.
    #[arg(long)]
    pub kept: Option<u32>,
}

impl SamplingFlags {
    /// The parameters these flags name.
    pub fn params(&self) -> Result<SamplingParams, String> {
        Ok(SamplingParams {
            temperature: self.temperature,
            top_k: self.top_k,
            top_p: self.top_p,
            min_p: self.min_p,
            repetition_penalty: self.repetition_penalty,
            frequency_penalty: self.frequency_penalty,
            presence_penalty: self.presence_penalty,
            logit_bias: self
                .logit_bias
                .as_deref()
                .map(parse_bias)
                .transpose()?
                .unwrap_or_default(),
            logprobs: self.logprobs,
            logprobs_mode: self.logprobs_mode,
            dry_multiplier: self.dry_multiplier,
            dry_base: self.dry_base,
            dry_allowed_length: self.dry_allowed_length,
            dry_penalty_last_n: self.dry_penalty_last_n,
            dry_sequence_breakers: self
                .dry_sequence_breakers
                .as_deref()
                .map(parse_breakers)
                .transpose()?
                .unwrap_or_default(),
            top_n_sigma: self.top_n_sigma,
            typical_p: self.typical_p,
            xtc_probability: self.xtc_probability,
            xtc_threshold: self.xtc_threshold,
            kept: self.kept,
        })
    }
}

/// Parses DRY sequence breakers, "13;25,26": sequences of token ids.
pub fn parse_breakers(s: &str) -> Result<Vec<Vec<u32>>, String> {
    s.split(';')
        .filter(|seq| !seq.trim().is_empty())
        .map(|seq| {
            seq.split(',')
                .map(|id| {
                    id.trim().parse::<u32>().map_err(|_| {
                        format!("--dry-sequence-breakers: {id:?} is not a token id (\"13;25,26\")")
                    })
                })
                .collect()
        })
        .collect()
}

/// Parameters for every row, as flags, or per row from a JSON file.
#[derive(Args, Debug, Clone)]
pub struct ParamArgs {
    #[command(flatten)]
    pub sampling: SamplingFlags,
    /// RNG seed (default: drawn from OS entropy per row, and reported).
    #[arg(long)]
    pub seed: Option<u64>,
    /// Step of the first draw.
    #[arg(long, default_value_t = 0)]
    pub step: u64,
    /// Prompt token ids, "1,2,3".
    #[arg(long)]
    pub prompt: Option<String>,
    /// Output token ids so far, "4,5".
    #[arg(long)]
    pub output: Option<String>,
    /// Per-row parameters: a JSON array with one object per row (overrides the flags).
    #[arg(long)]
    pub params: Option<std::path::PathBuf>,
    /// Allowed-token masks: an int32 or uint32 .npy of shape [B, ceil(V/32)] (or
    /// [ceil(V/32)] for every row), bit i % 32 of word i / 32 set for an allowed token i.
    #[arg(long)]
    pub mask: Option<std::path::PathBuf>,
}

/// Reads `--mask`: one mask per row, from an int32 or uint32 .npy of shape `[W]` (every
/// row) or `[rows, W]`. Its width is checked against the vocabulary by the sampler.
pub fn read_mask(path: &Path, rows: usize) -> Result<Vec<Vec<u32>>, String> {
    let shown = path.display();
    let (words, shape) = read_words(path, &[1, 2])?;
    let (b, w) = match shape.as_slice() {
        [w] => (1, *w),
        [b, w] => (*b, *w),
        other => {
            return Err(format!(
                "{shown}: a mask of shape {other:?}; expected [W] or [B, W]"
            ))
        }
    };
    if b != 1 && b != rows {
        return Err(format!(
            "{shown}: masks for {b} rows; the logits have {rows}"
        ));
    }
    Ok((0..rows)
        .map(|r| words[(r % b) * w..(r % b + 1) * w].to_vec())
        .collect())
}

/// Reads an int32 or uint32 .npy (token masks) whose rank is one of `ranks`: its words
/// and shape, the header's shape checked against the file's size first.
pub fn read_words(path: &Path, ranks: &[usize]) -> Result<(Vec<u32>, Vec<usize>), String> {
    let shown = path.display();
    let file = std::fs::File::open(path).map_err(|e| format!("cannot open {shown}: {e}"))?;
    let npy = npyz::NpyFile::new(std::io::BufReader::new(file))
        .map_err(|e| format!("{shown} is not a valid .npy file: {e}"))?;
    if npy.order() != npyz::Order::C {
        return Err(format!("{shown}: save the mask in C order"));
    }
    let shape: Vec<usize> = npy.shape().iter().map(|&d| d as usize).collect();
    if !ranks.contains(&shape.len()) {
        return Err(format!(
            "{shown}: a mask of shape {shape:?}; expected {} dimensions",
            ranks
                .iter()
                .map(|r| r.to_string())
                .collect::<Vec<_>>()
                .join(" or ")
        ));
    }
    let file_len = std::fs::metadata(path)
        .map_err(|e| format!("cannot read {shown}: {e}"))?
        .len();
    let need = shape
        .iter()
        .try_fold(4u64, |acc, &d| acc.checked_mul(d as u64));
    if need.is_none_or(|n| n > file_len) {
        return Err(format!(
            "{shown}: the header's shape {shape:?} needs more data than the file's {file_len} bytes"
        ));
    }
    let dtype = npy.dtype().descr().trim_matches('\'').to_string();
    let words: Vec<u32> = match dtype.trim_start_matches(['<', '=', '|']) {
        "i4" => npy
            .into_vec::<i32>()
            .map_err(|e| format!("{shown}: {e}"))?
            .into_iter()
            .map(|x| x as u32)
            .collect(),
        "u4" => npy.into_vec::<u32>().map_err(|e| format!("{shown}: {e}"))?,
        _ => {
            return Err(format!(
                "{shown}: a mask must be int32 or uint32, not {dtype}"
            ))
        }
    };
    Ok((words, shape))
}

fn parse_ids(field: &str, s: &str) -> Result<Vec<u32>, String> {
    s.split(',')
        .map(str::trim)
        .filter(|t| !t.is_empty())
        .map(|t| {
            t.parse::<u32>()
                .map_err(|_| format!("--{field}: {t:?} is not a token id"))
        })
        .collect()
}

fn parse_bias(s: &str) -> Result<BTreeMap<u32, f32>, String> {
    let mut m = BTreeMap::new();
    for item in s.split(',').map(str::trim).filter(|t| !t.is_empty()) {
        let (id, b) = item
            .split_once(':')
            .ok_or_else(|| format!("--logit-bias: {item:?} is not id:bias"))?;
        let id = id
            .trim()
            .parse::<u32>()
            .map_err(|_| format!("--logit-bias: {id:?} is not a token id"))?;
        let b = b
            .trim()
            .parse::<f32>()
            .map_err(|_| format!("--logit-bias: {b:?} is not a number"))?;
        m.insert(id, b);
    }
    Ok(m)
}

/// The keys of a row's parameters in a JSON file: the library's request keys.
pub fn keys() -> Vec<&'static str> {
    decoda::params::PARAM_KEYS
        .iter()
        .chain(decoda::params::STATE_KEYS)
        .copied()
        .collect()
}

fn entropy_seed() -> Result<u64, String> {
    SequenceState::from_entropy()
        .map(|s| s.seed)
        .map_err(|e| e.to_string())
}

/// The requests for `rows` rows, with `--mask`'s masks when it is given.
pub fn requests(a: &ParamArgs, rows: usize) -> Result<Vec<Request>, String> {
    let mut reqs = unmasked_requests(a, rows)?;
    if let Some(path) = &a.mask {
        for (q, m) in reqs.iter_mut().zip(read_mask(path, rows)?) {
            q.allowed = Some(m);
        }
    }
    Ok(reqs)
}

fn unmasked_requests(a: &ParamArgs, rows: usize) -> Result<Vec<Request>, String> {
    if let Some(path) = &a.params {
        let shown = path.display();
        let text =
            std::fs::read_to_string(path).map_err(|e| format!("cannot read {shown}: {e}"))?;
        let items: Vec<serde_json::Value> = serde_json::from_str(&text)
            .map_err(|e| format!("{shown}: not a JSON array of objects: {e}"))?;
        if items.len() != rows {
            return Err(format!(
                "{shown} has {} parameter objects for {rows} rows of logits",
                items.len()
            ));
        }
        return items
            .into_iter()
            .enumerate()
            .map(|(r, item)| {
                let obj = item
                    .as_object()
                    .ok_or_else(|| format!("{shown}: row {r} is not an object"))?;
                let known = keys();
                if let Some(k) = obj.keys().find(|k| !known.contains(&k.as_str())) {
                    return Err(format!(
                        "{shown}: row {r}: unknown key {k:?} (known: {})",
                        known.join(", ")
                    ));
                }
                let has_seed = obj.contains_key("seed");
                let mut req: Request =
                    serde_json::from_value(item).map_err(|e| format!("{shown}: row {r}: {e}"))?;
                if !has_seed {
                    req.state.seed = entropy_seed()?;
                }
                Ok(req)
            })
            .collect();
    }
    let params = a.sampling.params()?;
    let prompt = a
        .prompt
        .as_deref()
        .map(|s| parse_ids("prompt", s))
        .transpose()?
        .unwrap_or_default();
    let output = a
        .output
        .as_deref()
        .map(|s| parse_ids("output", s))
        .transpose()?
        .unwrap_or_default();
    (0..rows)
        .map(|_| {
            let seed = match a.seed {
                Some(s) => s,
                None => entropy_seed()?,
            };
            Ok(Request {
                params: params.clone(),
                state: SequenceState {
                    seed,
                    step: a.step,
                    prompt: prompt.clone(),
                    output: output.clone(),
                },
                allowed: None,
            })
        })
        .collect()
}
