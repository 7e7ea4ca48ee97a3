//! Sampling parameters, per-sequence state, and their validation (the contract's ranges).

use std::collections::BTreeMap;

use serde::{Deserialize, Deserializer, Serialize};

use crate::error::{Error, Result};

/// Which log-probabilities to report (the contract's log-probabilities).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum LogprobsMode {
    /// `log_softmax` of the logits as given, before bias, penalties and temperature.
    #[default]
    Raw,
    /// `log_softmax` over the kept set after the whole pipeline (`-inf` outside it).
    Processed,
}

impl std::str::FromStr for LogprobsMode {
    type Err = String;
    fn from_str(s: &str) -> std::result::Result<Self, String> {
        match s {
            "raw" => Ok(Self::Raw),
            "processed" => Ok(Self::Processed),
            other => Err(format!(
                "logprobs mode must be raw or processed, not {other:?}"
            )),
        }
    }
}

/// Largest number of top log-probabilities a row may ask for.
pub const MAX_LOGPROBS: u32 = 20;
/// Most tokens of a DRY window (stage 3a) the device kernels hold: a per-call row's
/// `min(dry_penalty_last_n, history)`, or the most a device-head slot's history can reach.
pub const MAX_DEVICE_DRY_WINDOW: usize = 4096;

/// Longest DRY sequence breaker, in tokens (llama.cpp's limit on a breaker's tail, plus its head).
pub const MAX_BREAKER_LEN: usize = 20;

/// Most DRY sequence breakers a row may list.
pub const MAX_BREAKERS: usize = 256;

/// Largest kept distribution a row may ask for ([`SamplingParams::kept`]).
pub const MAX_KEPT: u32 = 1024;

/// The JSON keys of [`SamplingParams`] (a `--params` row's parameters, the Python
/// bindings' names), in declaration order.
pub const PARAM_KEYS: &[&str] = &[
    "temperature",
    "top_k",
    "top_p",
    "min_p",
    "repetition_penalty",
    "frequency_penalty",
    "presence_penalty",
    "logit_bias",
    "logprobs",
    "logprobs_mode",
    "dry_multiplier",
    "dry_base",
    "dry_allowed_length",
    "dry_penalty_last_n",
    "dry_sequence_breakers",
    "top_n_sigma",
    "typical_p",
    "xtc_probability",
    "xtc_threshold",
    "kept",
];

/// The JSON keys a [`Request`] adds to [`PARAM_KEYS`]: its sequence state and its mask.
pub const STATE_KEYS: &[&str] = &["seed", "step", "prompt", "output", "allowed"];

/// Temperatures below this are treated as greedy (as vLLM does).
pub const GREEDY_TEMPERATURE: f32 = 1e-5;

/// The sampling parameters of one row. `Default` gives the contract's defaults (every
/// filter off, temperature 1).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct SamplingParams {
    /// Divides the logits; `0` (or below `1e-5`) is greedy. Finite, `>= 0`.
    pub temperature: f32,
    /// Keep the `k` most likely tokens (ties kept); `0` or `>= V` is off.
    pub top_k: u32,
    /// Nucleus: the fewest most likely tokens whose mass reaches `p` (ties kept); `1` is off.
    pub top_p: f32,
    /// Keep tokens with probability `>= min_p * max probability`; `0` is off.
    pub min_p: f32,
    /// HF/vLLM multiplicative penalty on tokens of prompt and output; `1` is off.
    pub repetition_penalty: f32,
    /// OpenAI frequency penalty on output tokens, in `[-2, 2]`; `0` is off.
    pub frequency_penalty: f32,
    /// OpenAI presence penalty on output tokens, in `[-2, 2]`; `0` is off.
    pub presence_penalty: f32,
    /// Added to the logit of each listed token id; finite or `-inf` (ban).
    #[serde(deserialize_with = "de_bias", serialize_with = "ser_bias")]
    pub logit_bias: BTreeMap<u32, f32>,
    /// How many top log-probabilities to report (`0..=20`), if any.
    pub logprobs: Option<u32>,
    /// Which log-probabilities to report.
    pub logprobs_mode: LogprobsMode,
    /// DRY ("don't repeat yourself"): the penalty's scale; `0` is off. Finite, `>= 0`.
    pub dry_multiplier: f32,
    /// DRY: the penalty grows as `dry_base^(length - dry_allowed_length)`. Finite, `>= 1`.
    pub dry_base: f32,
    /// DRY: repeats up to this length go unpenalised.
    pub dry_allowed_length: u32,
    /// DRY: how many of the history's last tokens it scans: `-1` the whole history, `0` off.
    pub dry_penalty_last_n: i32,
    /// DRY: token-id sequences that end a repeat (a newline, a quote...); none by default.
    pub dry_sequence_breakers: Vec<Vec<u32>>,
    /// Top-n-σ: keep tokens within `n` standard deviations of the largest scaled logit;
    /// `0` is off. Finite, `>= 0`.
    pub top_n_sigma: f32,
    /// Locally typical sampling: keep the tokens closest to the entropy whose mass
    /// exceeds `typical_p`; `1` is off. `0 < typical_p <= 1`.
    pub typical_p: f32,
    /// XTC (exclude top choices): the chance, per step, that XTC applies; `0` is off.
    pub xtc_probability: f32,
    /// XTC: tokens with probability at least this are top choices (`> 0.5` does nothing).
    pub xtc_threshold: f32,
    /// Report the kept distribution: at most this many (`<= 1024`) of its most likely
    /// tokens with their probabilities, and its size.
    pub kept: Option<u32>,
}

impl Default for SamplingParams {
    fn default() -> Self {
        Self {
            temperature: 1.0,
            top_k: 0,
            top_p: 1.0,
            min_p: 0.0,
            repetition_penalty: 1.0,
            frequency_penalty: 0.0,
            presence_penalty: 0.0,
            logit_bias: BTreeMap::new(),
            logprobs: None,
            logprobs_mode: LogprobsMode::Raw,
            dry_multiplier: 0.0,
            dry_base: 1.75,
            dry_allowed_length: 2,
            dry_penalty_last_n: -1,
            dry_sequence_breakers: Vec::new(),
            top_n_sigma: 0.0,
            typical_p: 1.0,
            xtc_probability: 0.0,
            xtc_threshold: 0.1,
            kept: None,
        }
    }
}

impl SamplingParams {
    /// Greedy decoding: temperature 0.
    pub fn greedy() -> Self {
        Self {
            temperature: 0.0,
            ..Self::default()
        }
    }

    /// Whether the temperature alone makes the row greedy (`T < 1e-5`).
    pub fn greedy_by_temperature(&self) -> bool {
        self.temperature < GREEDY_TEMPERATURE
    }

    /// Whether DRY is on (it may still change no logit of a given history).
    pub fn dry_on(&self) -> bool {
        self.dry_multiplier != 0.0 && self.dry_penalty_last_n != 0
    }

    /// Whether XTC can apply (its coin still decides each step).
    pub fn xtc_on(&self) -> bool {
        self.xtc_probability > 0.0 && self.xtc_threshold <= 0.5
    }

    /// The field of a stage the device kernels do not run for this row, if any: DRY runs
    /// on the device for windows of up to [`MAX_DEVICE_DRY_WINDOW`] tokens
    /// ([`SamplingParams::beyond_device_with`]); every other stage and the kept
    /// distribution always, so with no history this is always `None`.
    pub fn beyond_device(&self) -> Option<&'static str> {
        self.beyond_device_with(0)
    }

    /// DRY's window over a history of `len` tokens: `min(dry_penalty_last_n, len)`, `len`
    /// for `-1`, 0 when DRY is off.
    pub fn dry_window(&self, len: usize) -> usize {
        if !self.dry_on() {
            return 0;
        }
        match self.dry_penalty_last_n {
            -1 => len,
            k => len.min(k as usize),
        }
    }

    /// [`SamplingParams::beyond_device`], and `dry_penalty_last_n` when DRY's window over
    /// a history that reaches `history` tokens is longer than [`MAX_DEVICE_DRY_WINDOW`].
    pub fn beyond_device_with(&self, history: usize) -> Option<&'static str> {
        (self.dry_window(history) > MAX_DEVICE_DRY_WINDOW).then_some("dry_penalty_last_n")
    }

    /// Whether any of bias, repetition, frequency, presence or DRY changes a logit of this row.
    pub fn modifies_logits(&self, state: &SequenceState) -> bool {
        (self.dry_on()
            && state.prompt.len() + state.output.len() > self.dry_allowed_length as usize)
            || !self.logit_bias.is_empty()
            || (self.repetition_penalty != 1.0
                && !(state.prompt.is_empty() && state.output.is_empty()))
            || ((self.frequency_penalty != 0.0 || self.presence_penalty != 0.0)
                && !state.output.is_empty())
    }

    /// Checks every field against its range (the contract's ranges), naming field, value and row.
    pub fn validate(&self, row: usize, vocab: usize) -> Result<()> {
        let bad = |field: &'static str, value: String, expected: &'static str| {
            Err(Error::InvalidParameter {
                row,
                field,
                value,
                expected,
            })
        };
        let t = self.temperature;
        if !(t.is_finite() && t >= 0.0) {
            return bad("temperature", t.to_string(), "a finite value >= 0");
        }
        let p = self.top_p;
        if !(p > 0.0 && p <= 1.0) {
            return bad("top_p", p.to_string(), "0 < top_p <= 1");
        }
        let m = self.min_p;
        if !(0.0..=1.0).contains(&m) {
            return bad("min_p", m.to_string(), "0 <= min_p <= 1");
        }
        let r = self.repetition_penalty;
        if !(r.is_finite() && r > 0.0) {
            return bad("repetition_penalty", r.to_string(), "a finite value > 0");
        }
        for (field, v) in [
            ("frequency_penalty", self.frequency_penalty),
            ("presence_penalty", self.presence_penalty),
        ] {
            if !(-2.0..=2.0).contains(&v) {
                return bad(field, v.to_string(), "a finite value in [-2, 2]");
            }
        }
        for (&id, &b) in &self.logit_bias {
            if id as usize >= vocab {
                return Err(Error::TokenOutOfRange {
                    row,
                    field: "logit_bias",
                    id: id.into(),
                    vocab,
                });
            }
            if !(b.is_finite() || b == f32::NEG_INFINITY) {
                return bad("logit_bias", format!("{id}: {b}"), "a finite bias or -inf");
            }
        }
        if let Some(n) = self.logprobs {
            if n > MAX_LOGPROBS {
                return bad("logprobs", n.to_string(), "an integer in 0..=20");
            }
        }
        if let Some(n) = self.kept {
            if n > MAX_KEPT {
                return bad("kept", n.to_string(), "an integer in 0..=1024");
            }
        }
        let m = self.dry_multiplier;
        if !(m.is_finite() && m >= 0.0) {
            return bad("dry_multiplier", m.to_string(), "a finite value >= 0");
        }
        let b = self.dry_base;
        if !(b.is_finite() && b >= 1.0) {
            return bad("dry_base", b.to_string(), "a finite value >= 1");
        }
        if self.dry_penalty_last_n < -1 {
            return bad(
                "dry_penalty_last_n",
                self.dry_penalty_last_n.to_string(),
                "-1 (the whole history), 0 (off) or a count > 0",
            );
        }
        for (i, seq) in self.dry_sequence_breakers.iter().enumerate() {
            if seq.is_empty() || seq.len() > MAX_BREAKER_LEN {
                return bad(
                    "dry_sequence_breakers",
                    format!("breaker {i} of {} tokens", seq.len()),
                    "sequences of 1 to 20 token ids",
                );
            }
            if let Some(&id) = seq.iter().find(|&&id| id as usize >= vocab) {
                return Err(Error::TokenOutOfRange {
                    row,
                    field: "dry_sequence_breakers",
                    id: id.into(),
                    vocab,
                });
            }
        }
        if self.dry_sequence_breakers.len() > MAX_BREAKERS {
            return bad(
                "dry_sequence_breakers",
                format!("{} sequences", self.dry_sequence_breakers.len()),
                "at most 256 sequences",
            );
        }
        let n = self.top_n_sigma;
        if !(n.is_finite() && n >= 0.0) {
            return bad("top_n_sigma", n.to_string(), "a finite value >= 0");
        }
        let p = self.typical_p;
        if !(p > 0.0 && p <= 1.0) {
            return bad("typical_p", p.to_string(), "0 < typical_p <= 1");
        }
        for (field, v) in [
            ("xtc_probability", self.xtc_probability),
            ("xtc_threshold", self.xtc_threshold),
        ] {
            if !(0.0..=1.0).contains(&v) {
                return bad(field, v.to_string(), "a value in [0, 1]");
            }
        }
        Ok(())
    }
}

/// Checks that row `row`'s token mask has `ceil(V / 32)` words, naming the row and
/// `allowed` otherwise.
pub fn check_mask_width(row: usize, mask: &[u32], vocab: usize) -> Result<()> {
    if mask.len() == vocab.div_ceil(32) {
        return Ok(());
    }
    Err(Error::InvalidParameter {
        row,
        field: "allowed",
        value: format!("a mask of {} words for V = {vocab}", mask.len()),
        expected: "ceil(V / 32) words, one bit per token",
    })
}

/// An error naming the first parameter of row `row` that the device kernels do not run
/// yet over a history that reaches `history` tokens
/// ([`SamplingParams::beyond_device_with`]): the device API and the device head refuse
/// it; the per-call host API draws such rows on the host (with the reference sampler).
pub fn on_device_only(p: &SamplingParams, row: usize, history: usize) -> Result<()> {
    match p.beyond_device_with(history) {
        None => Ok(()),
        Some("dry_penalty_last_n") => Err(Error::InvalidParameter {
            row,
            field: "dry_penalty_last_n",
            value: format!(
                "{} (a DRY window of up to {} tokens)",
                p.dry_penalty_last_n,
                if history == usize::MAX {
                    "unbounded".to_string()
                } else {
                    p.dry_window(history).to_string()
                }
            ),
            expected: "a DRY window of at most 4096 tokens on the device API and the device \
                       head (set dry_penalty_last_n, or max_tokens on a head's slot; \
                       Backend::sample and CpuHead take any)",
        }),
        Some(field) => Err(Error::InvalidParameter {
            row,
            field,
            value: "set".into(),
            expected: "off on the device API and the device head for now (Backend::sample \
                       and CpuHead take it)",
        }),
    }
}

fn de_bias<'de, D: Deserializer<'de>>(d: D) -> std::result::Result<BTreeMap<u32, f32>, D::Error> {
    #[derive(Deserialize)]
    #[serde(untagged)]
    enum Bias {
        Num(f32),
        Text(String),
    }
    // Keys arrive as strings (JSON object keys), also through `#[serde(flatten)]`.
    let raw: BTreeMap<String, Bias> = BTreeMap::deserialize(d)?;
    raw.into_iter()
        .map(|(k, v)| {
            let k: u32 = k.trim().parse().map_err(|_| {
                serde::de::Error::custom(format!("logit_bias key {k:?} is not a token id"))
            })?;
            Ok((k, v))
        })
        .collect::<std::result::Result<Vec<_>, D::Error>>()?
        .into_iter()
        .map(|(k, v)| match v {
            Bias::Num(x) => Ok((k, x)),
            Bias::Text(s) => s.trim().parse::<f32>().map(|x| (k, x)).map_err(|_| {
                serde::de::Error::custom(format!("logit_bias {k}: {s:?} is not a number"))
            }),
        })
        .collect()
}

fn ser_bias<S: serde::Serializer>(
    m: &BTreeMap<u32, f32>,
    s: S,
) -> std::result::Result<S::Ok, S::Error> {
    use serde::ser::SerializeMap;
    let mut map = s.serialize_map(Some(m.len()))?;
    for (k, v) in m {
        if v.is_finite() {
            map.serialize_entry(k, v)?;
        } else {
            map.serialize_entry(k, &v.to_string())?;
        }
    }
    map.end()
}

/// The decode state of one sequence: its RNG key and position, and its token history.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct SequenceState {
    /// The RNG key of the sequence.
    pub seed: u64,
    /// The index of the token being drawn (0 for the first generated token).
    pub step: u64,
    /// The prompt's token ids (used by the repetition penalty).
    pub prompt: Vec<u32>,
    /// The generated token ids so far (repetition, frequency and presence penalties).
    pub output: Vec<u32>,
}

impl Default for SequenceState {
    fn default() -> Self {
        Self::new(0)
    }
}

impl SequenceState {
    /// A new sequence at step 0 with an empty history.
    pub fn new(seed: u64) -> Self {
        Self {
            seed,
            step: 0,
            prompt: Vec::new(),
            output: Vec::new(),
        }
    }

    /// A new sequence whose seed is drawn from the operating system's entropy; read it back
    /// from [`SequenceState::seed`] to reproduce the sequence.
    pub fn from_entropy() -> Result<Self> {
        let mut b = [0u8; 8];
        getrandom::fill(&mut b)
            .map_err(|e| Error::Shape(format!("OS entropy unavailable: {e}")))?;
        Ok(Self::new(u64::from_le_bytes(b)))
    }

    /// Records a drawn token: appends it to `output` and advances `step`.
    pub fn push(&mut self, token: u32) {
        self.output.push(token);
        self.step += 1;
    }

    /// Checks the history ids against the vocabulary size.
    pub fn validate(&self, row: usize, vocab: usize) -> Result<()> {
        for (field, ids) in [("prompt", &self.prompt), ("output", &self.output)] {
            if let Some(&id) = ids.iter().find(|&&id| id as usize >= vocab) {
                return Err(Error::TokenOutOfRange {
                    row,
                    field,
                    id: id.into(),
                    vocab,
                });
            }
        }
        Ok(())
    }
}

/// One row of a sampling call: its parameters and its sequence state.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
pub struct Request {
    /// The row's sampling parameters.
    #[serde(flatten)]
    pub params: SamplingParams,
    /// The row's sequence state.
    #[serde(flatten)]
    pub state: SequenceState,
    /// The tokens this step may draw (structured output): `ceil(V / 32)` words, bit
    /// `i % 32` of word `i / 32` set for an allowed token `i` (the layout of xgrammar's and
    /// llguidance's token bitmasks); bits of ids `>= V` are ignored. `None` allows every
    /// token. A disallowed token's logit is `-inf` for every stage, log-probabilities
    /// included (docs/CONTRACT.md, stage 0).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub allowed: Option<Vec<u32>>,
}

impl Request {
    /// A request with `params` for a fresh sequence with `seed`.
    pub fn new(params: SamplingParams, seed: u64) -> Self {
        Self {
            params,
            state: SequenceState::new(seed),
            allowed: None,
        }
    }

    /// The first field of this row the device kernels do not run yet, its DRY window over
    /// its history included ([`SamplingParams::beyond_device_with`]).
    pub fn beyond_device(&self) -> Option<&'static str> {
        self.params
            .beyond_device_with(self.state.prompt.len() + self.state.output.len())
    }

    /// Validates the parameters, the history and the token mask of row `row` for
    /// vocabulary `vocab`.
    pub fn validate(&self, row: usize, vocab: usize) -> Result<()> {
        self.params.validate(row, vocab)?;
        self.state.validate(row, vocab)?;
        match &self.allowed {
            Some(m) => check_mask_width(row, m, vocab),
            None => Ok(()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The key lists are the structs' own JSON names, every one of them.
    #[test]
    fn key_lists_are_the_serde_names() {
        let mut r = Request::new(SamplingParams::default(), 1);
        r.params.logprobs = Some(1);
        r.params.kept = Some(1);
        r.allowed = Some(vec![0]);
        let v = serde_json::to_value(&r).unwrap();
        let mut got: Vec<&str> = v.as_object().unwrap().keys().map(String::as_str).collect();
        got.sort_unstable();
        let mut want: Vec<&str> = PARAM_KEYS.iter().chain(STATE_KEYS).copied().collect();
        want.sort_unstable();
        assert_eq!(got, want);
    }
}
