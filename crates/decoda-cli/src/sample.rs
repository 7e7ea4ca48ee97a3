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

/// Draws computed per call when streaming `--draws` (bounds memory for any N).
const DRAW_CHUNK: usize = 65_536;

/// Where a row's results come from: one [`decoda::Backend::sample`] call over the whole
/// batch when every row draws once (a decode step), else each row's draws streamed in
/// chunks of [`DRAW_CHUNK`] steps through [`decoda::Backend::sample_draws`].
enum Results {
    Once(Vec<decoda::RowResult>),
    Stream(u64),
}

/// Row `row`'s results handed to `each` in order; the first error of the row (the same at
/// every step) stops it and is returned.
fn for_each_result(
    be: &dyn decoda::Backend,
    batch: &crate::inputs::Batch,
    row: usize,
    req: &decoda::Request,
    results: &Results,
    mut each: impl FnMut(&decoda::RowResult) -> std::io::Result<()>,
) -> Result<Option<decoda::RowError>, String> {
    let draws = match results {
        Results::Once(all) => {
            return match &all[row] {
                Err(e) => Ok(Some(*e)),
                ok => {
                    each(ok).map_err(|e| format!("writing the output: {e}"))?;
                    Ok(None)
                }
            };
        }
        Results::Stream(draws) => *draws,
    };
    let one = batch
        .logits()?
        .slice_rows(row, row + 1)
        .map_err(|e| e.to_string())?;
    let mut done = 0u64;
    while done < draws {
        let n = (draws - done).min(DRAW_CHUNK as u64) as usize;
        let mut r = req.clone();
        r.state.step = r.state.step.wrapping_add(done);
        let out = be
            .sample_draws(&one, std::slice::from_ref(&r), n)
            .map_err(|e| e.to_string())?;
        for res in out.into_iter().next().unwrap_or_default() {
            if let Err(e) = res {
                return Ok(Some(e));
            }
            each(&res).map_err(|e| format!("writing the output: {e}"))?;
        }
        done += n as u64;
    }
    Ok(None)
}

pub fn run_sample(a: SampleArgs) -> Result<ExitCode, String> {
    use std::io::Write;
    let batch = read_npy(&a.logits)?;
    let reqs = requests(&a.params, batch.rows)?;
    let be = backend(a.device, a.threads)?;
    // Nothing is printed for a bad call: one draw per row is one call, which the library
    // validates before any work; streamed draws are many calls, so the whole call is
    // validated here first, once.
    let draws = u64::from(a.draws);
    let results = if draws == 1 {
        Results::Once(
            be.sample(&batch.logits()?, &reqs)
                .map_err(|e| e.to_string())?,
        )
    } else {
        decoda::pipeline::validate_call(batch.rows, batch.vocab, &reqs)
            .map_err(|e| e.to_string())?;
        Results::Stream(draws)
    };
    let stdout = std::io::stdout();
    let mut w = std::io::BufWriter::new(stdout.lock());
    let io = |e: std::io::Error| format!("writing the output: {e}");
    let mut failed = false;
    if a.json {
        write!(
            w,
            "{{\"device\":{},\"vocab\":{},\"rows\":[",
            json!(be.name()),
            batch.vocab
        )
        .map_err(io)?;
        for (r, req) in reqs.iter().enumerate() {
            let seed = req.state.seed;
            if r > 0 {
                write!(w, ",").map_err(io)?;
            }
            write!(w, "{{\"row\":{r},\"seed\":{seed}").map_err(io)?;
            let mut first = true;
            // errors do not depend on the step: an erroneous row fails at its first draw,
            // before any token is written
            let err = for_each_result(be.as_ref(), &batch, r, req, &results, |res| {
                let s = res.as_ref().expect("errors stop the row");
                let sep = if first { ",\"tokens\":[" } else { "," };
                first = false;
                write!(w, "{sep}{}", s.token)
            })?;
            if err.is_none() {
                write!(w, "{}", if first { ",\"tokens\":[]" } else { "]" }).map_err(io)?;
            }
            if let Some(e) = err {
                failed = true;
                write!(
                    w,
                    ",\"error\":{}",
                    json!({"kind": e.kind(), "message": e.to_string()})
                )
                .map_err(io)?;
            } else if req.params.logprobs.is_some() {
                // a second pass over the same (reproducible) draws streams the logprobs
                write!(w, ",\"logprobs\":[").map_err(io)?;
                let mut first = true;
                for_each_result(be.as_ref(), &batch, r, req, &results, |res| {
                    let s = res.as_ref().expect("errors stop the row");
                    let sep = if first { "" } else { "," };
                    first = false;
                    write!(w, "{sep}{}", json!(s.logprobs))
                })?;
                write!(w, "]").map_err(io)?;
            }
            if err.is_none() && req.params.kept.is_some() {
                // per draw: the kept set's size, and its most likely tokens
                let (mut sizes, mut lists) = (Vec::new(), Vec::new());
                for_each_result(be.as_ref(), &batch, r, req, &results, |res| {
                    let k = res.as_ref().expect("errors stop the row").kept.as_ref();
                    let k = k.expect("kept asked");
                    sizes.push(k.size);
                    lists.push(json!(k.top));
                    Ok(())
                })?;
                write!(
                    w,
                    ",\"kept_size\":{},\"kept\":{}",
                    json!(sizes),
                    json!(lists)
                )
                .map_err(io)?;
            }
            write!(w, "}}").map_err(io)?;
        }
        writeln!(w, "]}}").map_err(io)?;
    } else {
        writeln!(
            w,
            "device {}, vocab {}, {} rows",
            be.name(),
            batch.vocab,
            batch.rows
        )
        .map_err(io)?;
        for (r, req) in reqs.iter().enumerate() {
            let seed = req.state.seed;
            write!(w, "row {r} (seed {seed}):").map_err(io)?;
            let mut first = true;
            let mut lps = Vec::new();
            let mut kepts = Vec::new();
            let want_lp = req.params.logprobs.is_some();
            let err = for_each_result(be.as_ref(), &batch, r, req, &results, |res| {
                let s = res.as_ref().expect("errors stop the row");
                if want_lp && lps.len() < 1000 {
                    lps.push(s.logprobs.clone());
                }
                if kepts.len() < 1000 {
                    if let Some(k) = &s.kept {
                        kepts.push(k.clone());
                    }
                }
                let sep = if first { " tokens " } else { " " };
                first = false;
                write!(w, "{sep}{}", s.token)
            })?;
            if let Some(e) = err {
                failed = true;
                writeln!(w, " error {}: {e}", e.kind()).map_err(io)?;
                continue;
            }
            writeln!(w).map_err(io)?;
            for (d, lp) in lps.iter().enumerate() {
                if let Some(lp) = lp {
                    let top: Vec<String> = lp
                        .top
                        .iter()
                        .map(|t| format!("{}:{:.4}", t.token, t.logprob))
                        .collect();
                    writeln!(
                        w,
                        "  draw {d}: logprob {:.4} rank {} top [{}]",
                        lp.logprob,
                        lp.rank,
                        top.join(" ")
                    )
                    .map_err(io)?;
                }
            }
            for (d, k) in kepts.iter().enumerate() {
                let top: Vec<String> = k
                    .top
                    .iter()
                    .map(|t| format!("{}:{:.4}", t.id, t.p))
                    .collect();
                writeln!(
                    w,
                    "  draw {d}: kept {} tokens, top [{}]",
                    k.size,
                    top.join(" ")
                )
                .map_err(io)?;
            }
            if (want_lp || !kepts.is_empty()) && draws > 1000 {
                writeln!(w, "  (the first 1000 draws shown; --json streams them all)")
                    .map_err(io)?;
            }
        }
    }
    w.flush().map_err(io)?;
    Ok(if failed {
        ExitCode::from(1)
    } else {
        ExitCode::SUCCESS
    })
}

#[derive(Args)]
pub struct ExplainArgs {
    /// Logits: a C-order f32 or f16 .npy of shape [V] or [B, V] (see --row).
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
