//! `generate --draft DIR --speculate K`: speculative decoding of the sequences on the
//! CPU ([`decoda::model::generate_speculative`]), then plain decoding of the same
//! sequences, so the run shows the acceptance, both speeds, and that the tokens agree.

use std::path::Path;
use std::sync::Arc;

use decoda::cpu::CpuModel;
use decoda::model::{
    generate_checked, generate_speculative, CheckedSequences, Qwen3Moe, Report, SpeculativeReport,
};
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

/// Runs `checked` speculatively with the draft in `dir`, then plainly.
pub fn run(
    a: &GenerateArgs,
    dir: &Path,
    model: Arc<Qwen3Moe>,
    checked: &CheckedSequences<'_>,
    pool: &rayon::ThreadPool,
    stop: &mut (dyn FnMut(usize, &[u32]) -> bool + Send),
) -> Result<Compared, String> {
    if a.device == Device::Wgpu {
        return Err(
            "--draft runs on the CPU for now (--device cpu): the device model's \
                    K + 1-position forward is not written yet"
                .into(),
        );
    }
    if a.host_sampling || a.profile {
        return Err(
            "--host-sampling and --profile are for device runs; --draft runs on the CPU".into(),
        );
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
    let n = checked.sequences().len();
    let speculative = pool
        .install(|| {
            let mut target = CpuModel::new(Arc::clone(&model) as _, n)?;
            let mut head = CpuHead::new(n, v)?;
            let mut drafter = CpuModel::new(draft as _, n)?;
            generate_speculative(
                &mut target,
                &mut head,
                &mut drafter,
                &CpuSampler::new(),
                a.speculate,
                checked,
                &mut |_| {},
                stop,
            )
        })
        .map_err(|e| e.to_string())?;
    let plain = pool
        .install(|| {
            let mut eng = CpuEngine::new(Arc::clone(&model) as _, n)?;
            generate_checked(&mut eng, checked, &mut |_| {}, stop)
        })
        .map_err(|e| e.to_string())?;
    Ok(Compared {
        speculative,
        plain,
        k: a.speculate,
        unsorted: n <= a.sort_cutoff,
        cutoff: a.sort_cutoff,
    })
}
