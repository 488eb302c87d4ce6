//! Shell completions and man pages, generated from the command-line definition itself
//! (clap_complete, clap_mangen), so they can never disagree with `--help`.

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::Context;
use clap::{Args, CommandFactory};
use clap_complete::Shell;

#[derive(Debug, Args)]
pub struct CompletionsArgs {
    /// The shell to complete for; the script goes to stdout (e.g. `weir completions bash >
    /// /etc/bash_completion.d/weir`).
    shell: Shell,
}

#[derive(Debug, Args)]
pub struct ManArgs {
    /// A directory for `weir.1` and one page per subcommand (`weir-proxy.1`, …).
    dir: PathBuf,
}

pub fn completions(args: CompletionsArgs) -> anyhow::Result<ExitCode> {
    let mut cmd = crate::Cli::command();
    let mut out = Vec::new();
    clap_complete::generate(args.shell, &mut cmd, "weir", &mut out);
    crate::out::write_stdout(&out);
    Ok(ExitCode::SUCCESS)
}

pub fn man(args: ManArgs) -> anyhow::Result<ExitCode> {
    std::fs::create_dir_all(&args.dir)
        .with_context(|| format!("cannot create {}", args.dir.display()))?;
    let cmd = crate::Cli::command();
    let written = pages(&cmd, "weir", &args.dir)?;
    outln!("{written} man pages in {}", args.dir.display());
    Ok(ExitCode::SUCCESS)
}

/// `name.1` for `cmd`, then each visible subcommand's as `name-sub.1`; how many were written.
fn pages(cmd: &clap::Command, name: &str, dir: &Path) -> anyhow::Result<usize> {
    let cmd = cmd.clone().bin_name(name.replace('-', " "));
    let path = dir.join(format!("{name}.1"));
    let mut page = Vec::new();
    clap_mangen::Man::new(cmd.clone())
        .title(name.to_string())
        .render(&mut page)?;
    std::fs::write(&path, page).with_context(|| format!("cannot write {}", path.display()))?;
    let mut written = 1;
    for sub in cmd.get_subcommands().filter(|s| !s.is_hide_set()) {
        written += pages(sub, &format!("{name}-{}", sub.get_name()), dir)?;
    }
    Ok(written)
}
