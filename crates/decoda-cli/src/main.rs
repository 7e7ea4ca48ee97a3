//! `decoda`: sample, explain, benchmark and demonstrate the decoda sampler from the shell.

mod bench;
mod bench_head;
mod demo;
mod device;
mod generate;
mod inputs;
mod moe_bench;
mod profile;
mod replay;
mod sample;
mod tiny_model;
mod verify;

use std::process::ExitCode;

use clap::{Parser, Subcommand};

/// Reproducible LLM token sampling and MoE dispatch, on the CPU or a GPU (wgpu).
#[derive(Parser)]
#[command(name = "decoda", version, about)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Sample tokens from logits in a .npy file.
    Sample(sample::SampleArgs),
    /// Show the pipeline stage by stage for one row.
    Explain(sample::ExplainArgs),
    /// Benchmark the sampler on synthetic Zipf-like logits.
    Bench(bench::BenchArgs),
    /// Show what sampling does on a small built-in distribution.
    Demo(demo::DemoArgs),
    /// Time an MoE layer with the sort forced on and off for each token count.
    MoeBench(moe_bench::MoeBenchArgs),
    /// Run the conformance suite against a device (works without cargo).
    Selftest(demo::SelftestArgs),
    /// Run the sampling head over logged logits [T, S, V] to reproduce a decode.
    Replay(replay::ReplayArgs),
    /// Verify drafted tokens (speculative decoding): the tokens K + 1 plain steps would draw, up to the first disagreement.
    Verify(verify::VerifyArgs),
    /// Generate with a Qwen3-MoE checkpoint: prefill, then decode steps sampled on the device.
    Generate(generate::GenerateArgs),
    /// Write a small random Qwen3-MoE checkpoint (and a byte-level tokenizer).
    TinyModel(tiny_model::TinyModelArgs),
}

/// A closed standard output (`decoda generate ... | head`) ends the process quietly, as
/// it does other Unix tools, instead of a panic in the first print after it.
#[cfg(unix)]
fn die_on_closed_pipe() {
    // SAFETY: called first in main, before any other thread exists; SIG_DFL is a valid
    // disposition for SIGPIPE and no handler of ours is replaced.
    unsafe {
        libc::signal(libc::SIGPIPE, libc::SIG_DFL);
    }
}

#[cfg(not(unix))]
fn die_on_closed_pipe() {}

fn main() -> ExitCode {
    die_on_closed_pipe();
    device::quiet_vulkan_layers();
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Sample(a) => sample::run_sample(a),
        Command::Explain(a) => sample::run_explain(a),
        Command::Bench(a) => bench::run(a),
        Command::Demo(a) => demo::run_demo(a),
        Command::MoeBench(a) => moe_bench::run(a),
        Command::Selftest(a) => demo::run_selftest(a),
        Command::Replay(a) => replay::run(a),
        Command::Verify(a) => verify::run(a),
        Command::Generate(a) => generate::run(a),
        Command::TinyModel(a) => tiny_model::run(a),
    };
    match result {
        Ok(code) => code,
        Err(msg) => {
            eprintln!("decoda: error: {msg}");
            ExitCode::from(2)
        }
    }
}
