//! `decoda verify`: speculative decoding's verification (coupled, or by rejection for
//! drafts made elsewhere) over `.npy` inputs.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::Args;
use serde_json::json;

use crate::device::{backend, Device};
use crate::inputs::{read_array, read_words, requests, LogitsFile, ParamArgs};

#[derive(Args)]
pub struct VerifyArgs {
    /// The target's logits: a C-order f32 or f16 .npy of shape [B, K + 1, V] (or
    /// [K + 1, V] for one row): each row's K + 1 positions.
    #[arg(long)]
    logits: PathBuf,
    /// The drafted tokens: an int32 or uint32 .npy of shape [B, K] (or [K]).
    #[arg(long)]
    draft: PathBuf,
    #[command(flatten)]
    params: ParamArgs,
    /// The rule: `coupled` (the draft sampled with the target's noise: the tokens of
    /// plain decoding) or `rejection` (drafts made elsewhere: accept with probability
    /// min(1, q / p), computed on the host from the contract's stages, whatever
    /// `--device`).
    #[arg(long, value_enum, default_value_t = Rule::Coupled)]
    rule: Rule,
    /// With `--rule rejection`: the draft model's logits, a C-order f32 or f16 .npy of
    /// shape [B, K, V] (or [K, V]), its distribution p taken with the target's parameters;
    /// without it the draft is one-hot (greedy and n-gram drafters).
    #[arg(long)]
    draft_logits: Option<PathBuf>,
    /// Where to verify.
    #[arg(long, value_enum, default_value_t = Device::Auto)]
    device: Device,
    /// CPU threads (0 = all cores).
    #[arg(long, default_value_t = 0)]
    threads: usize,
    /// Print JSON instead of text.
    #[arg(long)]
    json: bool,
}

/// How drafted tokens are checked.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Rule {
    /// The coupled rule (docs/CONTRACT.md): the tokens plain decoding gives.
    Coupled,
    /// The rejection rule for drafts made elsewhere, with their distributions.
    Rejection,
}

pub fn run(a: VerifyArgs) -> Result<ExitCode, String> {
    let (data, shape) = read_array(&a.logits, &[2, 3])?;
    let (b, positions, vocab) = match shape.as_slice() {
        [p, v] => (1, *p, *v),
        [b, p, v] => (*b, *p, *v),
        _ => unreachable!("read_array checked the rank"),
    };
    let (words, dshape) = read_words(&a.draft, &[1, 2])?;
    let (db, k) = match dshape.as_slice() {
        [k] => (1, *k),
        [db, k] => (*db, *k),
        _ => unreachable!("read_words checked the rank"),
    };
    if db != b || k + 1 != positions {
        return Err(format!(
            "{}: drafts of shape {dshape:?} for logits of shape {shape:?}: the logits need \
             [B, K + 1, V] for drafts of [B, K]",
            a.draft.display()
        ));
    }
    let logits = match &data {
        LogitsFile::F32(d) => decoda::Logits::f32(d, b * positions, vocab),
        LogitsFile::F16(d) => decoda::Logits::f16(d, b * positions, vocab),
    }
    .map_err(|e| e.to_string())?;
    let rows: Vec<decoda::DraftRow> = requests(&a.params, b)?
        .into_iter()
        .enumerate()
        .map(|(r, req)| decoda::DraftRow::new(req, words[r * k..(r + 1) * k].to_vec()))
        .collect();
    let be = backend(a.device, a.threads)?;
    let out = match a.rule {
        Rule::Coupled => {
            if a.draft_logits.is_some() {
                return Err("--draft-logits goes with --rule rejection".into());
            }
            decoda::verify_coupled(be.as_ref(), &logits, &rows).map_err(|e| e.to_string())?
        }
        Rule::Rejection => {
            let draft = match &a.draft_logits {
                None => None,
                Some(path) => {
                    let (d, dshape) = read_array(path, &[2, 3])?;
                    let want = if b == 1 && dshape.len() == 2 {
                        vec![k, vocab]
                    } else {
                        vec![b, k, vocab]
                    };
                    if dshape != want {
                        return Err(format!(
                            "{}: draft logits of shape {dshape:?}; the drafts need {want:?}",
                            path.display()
                        ));
                    }
                    Some(d)
                }
            };
            let dl = match &draft {
                None => None,
                Some(LogitsFile::F32(d)) => Some(decoda::Logits::f32(d, b * k, vocab)),
                Some(LogitsFile::F16(d)) => Some(decoda::Logits::f16(d, b * k, vocab)),
            }
            .transpose()
            .map_err(|e| e.to_string())?;
            let rej: Vec<decoda::RejectRow> = rows
                .iter()
                .map(|r| decoda::RejectRow {
                    request: r.request.clone(),
                    draft: r.draft.clone(),
                    draft_params: dl.as_ref().map(|_| r.request.params.clone()),
                })
                .collect();
            decoda::verify_rejection(&logits, &rej, dl.as_ref()).map_err(|e| e.to_string())?
        }
    };
    let failed = out.iter().any(|v| v.error.is_some());
    if a.json {
        let accepted: usize = out.iter().map(|v| v.accepted).sum();
        let drafted: usize = rows.iter().map(|r| r.draft.len()).sum();
        let rows: Vec<_> = out
            .iter()
            .zip(&rows)
            .enumerate()
            .map(|(r, (v, row))| {
                let mut o = json!({
                    "row": r,
                    "seed": row.request.state.seed,
                    "drafted": row.draft.len(),
                    "accepted": v.accepted,
                    "tokens": v.tokens(),
                });
                if row.request.params.logprobs.is_some() {
                    o["logprobs"] =
                        json!(v.samples.iter().map(|s| &s.logprobs).collect::<Vec<_>>());
                }
                if let Some(e) = &v.error {
                    o["error"] = json!({"kind": e.kind(), "message": e.to_string()});
                }
                o
            })
            .collect();
        println!(
            "{}",
            json!({
                "device": be.name(),
                "vocab": vocab,
                "acceptance": accepted as f64 / drafted as f64,
                "rows": rows,
            })
        );
    } else {
        println!(
            "device {}, vocab {vocab}, {b} rows of {k} drafted tokens",
            be.name()
        );
        for (r, (v, row)) in out.iter().zip(&rows).enumerate() {
            let toks: Vec<String> = v.tokens().iter().map(u32::to_string).collect();
            print!(
                "row {r} (seed {}): accepted {} of {}, tokens {}",
                row.request.state.seed,
                v.accepted,
                row.draft.len(),
                toks.join(" ")
            );
            match &v.error {
                Some(e) => println!(" error {}: {e}", e.kind()),
                None => println!(),
            }
        }
    }
    Ok(if failed {
        ExitCode::from(1)
    } else {
        ExitCode::SUCCESS
    })
}
