//! `decoda sample` and `decoda explain`.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::Args;
use decoda::reference::explain_row;
use serde_json::json;

use crate::device::{backend, Device};
use crate::inputs::{read_npy, requests, ParamArgs};

#[derive(Args)]
pub struct SampleArgs {
    /// Logits: a C-order f32 or f16 .npy of shape [V] or [B, V].
    #[arg(long)]
    logits: PathBuf,
    #[command(flatten)]
    params: ParamArgs,
    /// Draw N tokens per row, at steps step .. step+N-1 (the history is not extended).
    #[arg(long, default_value_t = 1)]
    draws: u32,
    /// Where to sample.
    #[arg(long, value_enum, default_value_t = Device::Auto)]
    device: Device,
    /// CPU threads (0 = all cores).
    #[arg(long, default_value_t = 0)]
    threads: usize,
    /// Print JSON instead of text.
    #[arg(long)]
    json: bool,
}

pub fn run_sample(a: SampleArgs) -> Result<ExitCode, String> {
    let batch = read_npy(&a.logits)?;
    let reqs = requests(&a.params, batch.rows)?;
    let be = backend(a.device, a.threads)?;
    let logits = batch.logits()?;
    let mut per_row: Vec<Vec<decoda::RowResult>> = vec![Vec::new(); batch.rows];
    for d in 0..a.draws {
        let step_reqs: Vec<decoda::Request> = reqs
            .iter()
            .map(|r| {
                let mut r = r.clone();
                r.state.step = r.state.step.wrapping_add(u64::from(d));
                r
            })
            .collect();
        let out = be.sample(&logits, &step_reqs).map_err(|e| e.to_string())?;
        for (r, res) in out.into_iter().enumerate() {
            per_row[r].push(res);
        }
    }
    let mut failed = false;
    if a.json {
        let rows: Vec<serde_json::Value> = per_row
            .iter()
            .enumerate()
            .map(|(r, results)| {
                let seed = reqs[r].state.seed;
                match results.iter().find_map(|x| x.as_ref().err()) {
                    Some(e) => {
                        failed = true;
                        json!({"row": r, "seed": seed, "error": {"kind": e.kind(), "message": e.to_string()}})
                    }
                    None => {
                        let ok: Vec<&decoda::Sample> = results.iter().map(|x| x.as_ref().unwrap()).collect();
                        let mut v = json!({"row": r, "seed": seed, "tokens": ok.iter().map(|s| s.token).collect::<Vec<_>>()});
                        if reqs[r].params.logprobs.is_some() {
                            v["logprobs"] = json!(ok.iter().map(|s| &s.logprobs).collect::<Vec<_>>());
                        }
                        v
                    }
                }
            })
            .collect();
        println!(
            "{}",
            json!({"device": be.name(), "vocab": batch.vocab, "rows": rows})
        );
    } else {
        println!(
            "device {}, vocab {}, {} rows",
            be.name(),
            batch.vocab,
            batch.rows
        );
        for (r, results) in per_row.iter().enumerate() {
            let seed = reqs[r].state.seed;
            match results.iter().find_map(|x| x.as_ref().err()) {
                Some(e) => {
                    failed = true;
                    println!("row {r} (seed {seed}): error {}: {e}", e.kind());
                }
                None => {
                    let toks: Vec<String> = results
                        .iter()
                        .map(|x| x.as_ref().unwrap().token.to_string())
                        .collect();
                    println!("row {r} (seed {seed}): tokens {}", toks.join(" "));
                    for (d, x) in results.iter().enumerate() {
                        if let Some(lp) = &x.as_ref().unwrap().logprobs {
                            let top: Vec<String> = lp
                                .top
                                .iter()
                                .map(|t| format!("{}:{:.4}", t.token, t.logprob))
                                .collect();
                            println!(
                                "  draw {d}: logprob {:.4} rank {} top [{}]",
                                lp.logprob,
                                lp.rank,
                                top.join(" ")
                            );
                        }
                    }
                }
            }
        }
    }
    Ok(if failed {
        ExitCode::from(1)
    } else {
        ExitCode::SUCCESS
    })
}

#[derive(Args)]
pub struct ExplainArgs {
    /// Logits: a C-order f32 or f16 .npy of shape [V] or [1, V].
    #[arg(long)]
    logits: PathBuf,
    /// Row of the file to explain.
    #[arg(long, default_value_t = 0)]
    row: usize,
    #[command(flatten)]
    params: ParamArgs,
    /// How many tokens to show per stage.
    #[arg(long, default_value_t = 10)]
    show: usize,
}

pub fn bar(p: f64, width: usize) -> String {
    let cells = (p * width as f64 * 8.0).round() as usize;
    let full = cells / 8;
    let part = [" ", "▏", "▎", "▍", "▌", "▋", "▊", "▉"][cells % 8];
    let mut s = "█".repeat(full.min(width));
    if full < width && !cells.is_multiple_of(8) {
        s.push_str(part);
    }
    s
}

pub fn run_explain(a: ExplainArgs) -> Result<ExitCode, String> {
    let batch = read_npy(&a.logits)?;
    if a.row >= batch.rows {
        return Err(format!(
            "--row {} is out of range: the file has {} rows",
            a.row, batch.rows
        ));
    }
    let mut reqs = requests(&a.params, batch.rows)?;
    let req = reqs.swap_remove(a.row);
    decoda::pipeline::validate_call(1, batch.vocab, std::slice::from_ref(&req))
        .map_err(|e| e.to_string())?;
    let x = batch.row_f32(a.row);
    let ex = explain_row(&x, &req);
    println!(
        "row {} of {} (vocab {}), seed {}, step {}",
        a.row,
        a.logits.display(),
        batch.vocab,
        req.state.seed,
        req.state.step
    );
    for st in &ex.stages {
        println!();
        println!(
            "== {} == {} | kept {} (removed {}), entropy {:.3} bits",
            st.name,
            st.note,
            st.probs.len(),
            st.removed,
            st.entropy_bits
        );
        for &(t, p) in st.probs.iter().take(a.show) {
            println!("  {t:>8}  {:>7.3}%  {}", p * 100.0, bar(p, 40));
        }
        if st.probs.len() > a.show {
            let rest: f64 = st.probs[a.show..].iter().map(|p| p.1).sum();
            println!(
                "  {:>8}  {:>7.3}%  ({} more tokens)",
                "...",
                rest * 100.0,
                st.probs.len() - a.show
            );
        }
    }
    println!();
    match &ex.result {
        Ok(s) => {
            println!(
                "drawn: token {} (Gumbel-max over the kept set with seed {}, step {})",
                s.token, req.state.seed, req.state.step
            );
            Ok(ExitCode::SUCCESS)
        }
        Err(e) => {
            println!("row error {}: {e}", e.kind());
            Ok(ExitCode::from(1))
        }
    }
}
