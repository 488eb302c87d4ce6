//! `weir lab …` (owned by the lab work; placeholder until it lands).

use std::process::ExitCode;

#[derive(clap::Args)]
pub struct LabArgs {}

pub fn run(_args: LabArgs) -> anyhow::Result<ExitCode> {
    anyhow::bail!("weir lab is not built yet")
}
