//! `decoda moe-bench`.

use std::process::ExitCode;

use clap::Args;

#[derive(Args)]
pub struct MoeBenchArgs {}

pub fn run(_a: MoeBenchArgs) -> Result<ExitCode, String> {
    Err("moe-bench is not built yet".into())
}
