//! `weir proxy`: the service proxy agent (kube-proxy's job) and `weir proxy cleanup`.

mod agent;
mod config;
mod operations;

use std::process::ExitCode;

use clap::{Args, Subcommand};
use tracing::warn;
use weir_proxy::iptables::{BackendChoice, IptablesBackend, IptablesOptions};
use weir_proxy::ipvs::{IpvsBackend, IpvsOptions};
use weir_proxy::nft::{NftBackend, NftOptions};
use weir_proxy::userspace::UserspaceBackend;
use weir_proxy::Backend;

pub use config::{parse_duration, IpvsSettings, ProxyFlags, ProxyMode};

#[derive(Debug, Args)]
#[command(args_conflicts_with_subcommands = true)]
pub struct ProxyArgs {
    #[command(subcommand)]
    command: Option<ProxyCommand>,
    /// Remove weir's proxy rules of every mode (or of --proxy-mode) and exit, like
    /// `weir proxy cleanup` (kube-proxy's spelling).
    #[arg(long)]
    cleanup: bool,
    /// Read the flags and --config, report the fields weir does not apply, print the settings
    /// the agent would run with, and exit without touching anything (checks a deployment).
    #[arg(long, conflicts_with = "cleanup")]
    validate: bool,
    #[command(flatten)]
    flags: ProxyFlags,
}

#[derive(Debug, Subcommand)]
enum ProxyCommand {
    /// Remove every table, chain and set weir's proxy modes installed.
    Cleanup {
        /// Only this mode's rules (default: every mode).
        #[arg(long, value_enum)]
        proxy_mode: Option<ProxyMode>,
    },
}

fn backend(
    mode: ProxyMode,
    ipvs: &IpvsSettings,
    iptables_backend: BackendChoice,
) -> anyhow::Result<Box<dyn Backend>> {
    let v4_only = !std::path::Path::new("/proc/sys/net/ipv6").exists();
    match mode {
        ProxyMode::Ipvs => {
            let secs = |d: std::time::Duration| d.as_secs().min(u32::MAX as u64) as u32;
            let mut opts = IpvsOptions {
                scheduler: ipvs.scheduler.clone(),
                tcp_timeout: secs(ipvs.tcp_timeout),
                tcp_fin_timeout: secs(ipvs.tcp_fin_timeout),
                udp_timeout: secs(ipvs.udp_timeout),
                ..IpvsOptions::default()
            };
            if v4_only {
                opts.families.retain(|f| *f == weir_model::IpFamily::V4);
            }
            Ok(Box::new(IpvsBackend::new(opts)))
        }
        ProxyMode::Nftables => Ok(Box::new(NftBackend::new(NftOptions::default()))),
        ProxyMode::Iptables => {
            let mut opts = IptablesOptions {
                backend: iptables_backend,
                ..IptablesOptions::default()
            };
            // ip6tables cannot work on a kernel booted with IPv6 disabled.
            if !std::path::Path::new("/proc/sys/net/ipv6").exists() {
                opts.families.retain(|f| *f == weir_model::IpFamily::V4);
            }
            Ok(Box::new(IptablesBackend::new(opts)))
        }
        ProxyMode::Userspace => Ok(Box::new(UserspaceBackend::new())),
    }
}

/// Removes the rules of `mode`, or of every mode.
fn cleanup(mode: Option<ProxyMode>) -> anyhow::Result<ExitCode> {
    let modes = match mode {
        Some(m) => vec![m],
        None => vec![
            ProxyMode::Nftables,
            ProxyMode::Iptables,
            ProxyMode::Ipvs,
            ProxyMode::Userspace,
        ],
    };
    for m in modes {
        // `auto` cleans whichever iptables implementation holds weir's chains.
        backend(m, &IpvsSettings::default(), BackendChoice::Auto)?.cleanup()?;
        eprintln!("weir proxy cleanup: {} rules removed", m.as_str());
    }
    Ok(ExitCode::SUCCESS)
}

pub fn run(args: ProxyArgs) -> anyhow::Result<ExitCode> {
    agent::use_one_malloc_arena();
    crate::init_logging();
    match args.command {
        Some(ProxyCommand::Cleanup { proxy_mode }) => cleanup(proxy_mode),
        None if args.cleanup => cleanup(args.flags.proxy_mode),
        None if args.validate => {
            let settings = args.flags.settings(&mut |w| warn!("{w}"))?;
            println!("{settings:#?}");
            Ok(ExitCode::SUCCESS)
        }
        None => {
            let settings = args.flags.settings(&mut |w| warn!("{w}"))?;
            let mut backend = backend(settings.mode, &settings.ipvs, settings.iptables_backend)?;
            let mut operations = operations::Operations::start(&settings, backend.mode())?;
            agent::run(&settings, backend.as_mut(), &mut operations)?;
            Ok(ExitCode::SUCCESS)
        }
    }
}
