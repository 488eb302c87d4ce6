//! `weir trace collect DIR`: saves a node's state as the outputs operators paste, one file each
//! under its conventional name, with a manifest of what ran and what could not.

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context;
use clap::{Args, Subcommand};
use weir_netdiag::live::{self, Target};

#[derive(Args)]
pub struct TraceArgs {
    #[command(subcommand)]
    command: TraceCommand,
}

#[derive(Subcommand)]
enum TraceCommand {
    /// Save iptables-save, ip6tables-save, nft -j list ruleset, ipset list, ip rule/route/link/
    /// addr/neigh, ipvsadm -Ln, the relevant sysctls and conntrack counters into DIR.
    Collect {
        /// A new or empty directory (existing files are never overwritten).
        dir: PathBuf,
        /// Collect from this network namespace (a name under /run/netns, or a path).
        #[arg(long)]
        netns: Option<String>,
    },
}

pub fn run(args: TraceArgs) -> anyhow::Result<ExitCode> {
    match args.command {
        TraceCommand::Collect { dir, netns } => {
            let target = Target { netns };
            let runs = target.collect();
            let manifest = live::write_collection(&dir, &target, &runs)
                .with_context(|| format!("cannot collect into {}", dir.display()))?;
            for e in &manifest.entries {
                match (&e.file, &e.error) {
                    (Some(f), _) => println!("{:<22} {:>8} bytes  {}", f, e.bytes, e.command),
                    (None, Some(err)) => {
                        println!("{:<22} {:>8}        {}: {err}", "-", "", e.command)
                    }
                    (None, None) => {}
                }
            }
            println!("manifest: {}", dir.join(live::MANIFEST_FILE).display());
            Ok(ExitCode::SUCCESS)
        }
    }
}
