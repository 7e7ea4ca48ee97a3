//! `generate --draft DIR --speculate K`: speculative decoding of the sequences
//! ([`decoda::model::generate_speculative`]) on the CPU or the device, then plain
//! decoding of the same sequences, so the run shows the acceptance, both speeds, and
//! that the tokens agree.

use std::path::Path;
use std::sync::Arc;

use decoda::cpu::CpuModel;
use decoda::model::{
    generate_checked, generate_speculative, CheckedSequences, Engine, Forward, Qwen3Moe, Report,
    SpeculativeReport,
};
use decoda::wgpu::{WgpuEngine, WgpuModel};
use decoda::{CpuEngine, CpuHead, CpuSampler};
use serde_json::{json, Value};

use super::GenerateArgs;
use crate::device::Device;

/// A speculative run beside the plain one.
pub struct Compared {
    /// The speculative run.
    pub speculative: SpeculativeReport,
    /// Plain decoding of the same sequences.
    pub plain: Report,
    /// The engine of the plain run (its name and device).
    pub engine: Box<dyn Engine + Send>,
    /// Tokens drafted a round.
    k: usize,
    /// Plain decoding's calls took the MoE layers' unsorted branch (its batch within the
    /// sort cutoff), as verification's do: the tokens must then be equal.
    unsorted: bool,
    /// The MoE layers' sort cutoff.
    cutoff: usize,
}

impl Compared {
    /// Whether every sequence's tokens and finish equal plain decoding's.
    pub fn equal(&self) -> bool {
        let (s, p) = (&self.speculative.report.outputs, &self.plain.outputs);
        s.len() == p.len()
            && s.iter()
                .zip(p)
                .all(|(a, b)| a.tokens == b.tokens && a.finish == b.finish)
    }

    /// Whether the tokens must be equal: plain decoding ran each row as verification
    /// does (one-row products, unsorted MoE calls). A plain batch past the sort cutoff
    /// sums its experts' products as one matrix product, in an order that depends on the
    /// batch, so its tokens may differ in the last bits' ties.
    pub fn must_equal(&self) -> bool {
        self.unsorted
    }

    fn speedup(&self) -> f64 {
        let p = self.plain.decode_tok_s();
        if p > 0.0 {
            self.speculative.report.decode_tok_s() / p
        } else {
            0.0
        }
    }

    /// The speculative keys of `generate --json`.
    pub fn add_json(&self, out: &mut Value) {
        let s = &self.speculative;
        out["speculate"] = json!(self.k);
        out["acceptance"] = json!(s.acceptance());
        out["drafted"] = json!(s.drafted);
        out["accepted"] = json!(s.accepted);
        out["rounds"] = json!(s.report.decode_steps);
        out["draft_ms"] = json!(s.draft_ms);
        out["plain_decode_tok_s"] = json!(self.plain.decode_tok_s());
        out["speedup"] = json!(self.speedup());
        out["equal_to_plain"] = json!(self.equal());
    }

    /// The speculative lines of `generate`'s text report (stderr).
    pub fn print(&self) {
        let s = &self.speculative;
        eprintln!(
            "speculative (K = {}): acceptance {:.3} ({} of {} drafted tokens), {} rounds, \
             draft {:.1} ms; plain decoding {:.1} tok/s, speed-up {:.2}x",
            self.k,
            s.acceptance(),
            s.accepted,
            s.drafted,
            s.report.decode_steps,
            s.draft_ms,
            self.plain.decode_tok_s(),
            self.speedup()
        );
        if self.equal() {
            eprintln!("tokens: equal to plain decoding's");
        } else if self.must_equal() {
            eprintln!("error: tokens differ from plain decoding's (a bug: please report it)");
        } else {
            eprintln!(
                "note: tokens differ from plain decoding's, whose batch of {} sorted its MoE \
                 calls (--sort-cutoff {}): raise --sort-cutoff to at least the batch for \
                 batch-invariant plain steps",
                self.plain.outputs.len(),
                self.cutoff
            );
        }
    }
}

/// Runs `checked` speculatively with the draft in `dir`, then plainly: on the CPU, or on
/// the device (`--device wgpu`, or `auto` with a GPU) with both models there, their
/// logits read back for the host's head and sampler; the plain run samples on the
/// device. `positions`: the caches' positions a sequence; `cpu_head`: some sequence needs
/// the host's head in the plain run.
#[allow(clippy::too_many_arguments)]
pub fn run(
    a: &GenerateArgs,
    dir: &Path,
    model: Arc<Qwen3Moe>,
    checked: &CheckedSequences<'_>,
    positions: usize,
    cpu_head: bool,
    pool: &rayon::ThreadPool,
    stop: &mut (dyn FnMut(usize, &[u32]) -> bool + Send),
) -> Result<Compared, String> {
    if a.host_sampling || a.profile {
        return Err("--host-sampling and --profile are for plain device runs, not --draft".into());
    }
    if a.speculate == 0 {
        return Err("--speculate 0: expected at least 1 drafted token a round".into());
    }
    if !dir.is_dir() {
        return Err(format!(
            "--draft {}: no such directory (a checkpoint directory, as --model)",
            dir.display()
        ));
    }
    let draft = Arc::new(Qwen3Moe::load(dir, a.sort_cutoff).map_err(|e| format!("--draft: {e}"))?);
    let v = model.config.vocab_size;
    if draft.config.vocab_size != v {
        return Err(format!(
            "--draft {}: vocab_size {}; the model's is {v} (a draft must share the vocabulary)",
            dir.display(),
            draft.config.vocab_size
        ));
    }
    let gpu = match a.device {
        Device::Cpu => None,
        Device::Wgpu => Some(decoda::wgpu::WgpuSampler::new().map_err(|e| e.to_string())?),
        Device::Auto => crate::device::auto_gpu(),
    };
    let n = checked.sequences().len();
    let (speculative, plain, engine) = pool
        .install(|| -> decoda::Result<_> {
            let mut head = CpuHead::new(n, v)?;
            let sampler = CpuSampler::new();
            let (mut target, mut drafter, mut engine): (
                Box<dyn Forward>,
                Box<dyn Forward>,
                Box<dyn Engine + Send>,
            ) = match &gpu {
                None => (
                    Box::new(CpuModel::new(Arc::clone(&model) as _, n)?),
                    Box::new(CpuModel::new(draft as _, n)?),
                    Box::new(CpuEngine::new(Arc::clone(&model) as _, n)?),
                ),
                Some(s) => {
                    let host: Option<Box<dyn decoda::head::Head + Send>> = if cpu_head {
                        Some(Box::new(CpuHead::new(n, v)?))
                    } else {
                        None
                    };
                    (
                        Box::new(WgpuModel::new(s, Arc::clone(&model) as _, n, positions)?),
                        Box::new(WgpuModel::new(s, draft as _, n, positions)?),
                        Box::new(WgpuEngine::new(
                            s,
                            Arc::clone(&model) as _,
                            n,
                            positions,
                            host,
                        )?),
                    )
                }
            };
            let speculative = generate_speculative(
                target.as_mut(),
                &mut head,
                drafter.as_mut(),
                &sampler,
                a.speculate,
                checked,
                &mut |_| {},
                stop,
            )?;
            let plain = generate_checked(engine.as_mut(), checked, &mut |_| {}, stop)?;
            Ok((speculative, plain, engine))
        })
        .map_err(|e| e.to_string())?;
    Ok(Compared {
        speculative,
        plain,
        engine,
        k: a.speculate,
        unsorted: n <= a.sort_cutoff,
        cutoff: a.sort_cutoff,
    })
}
