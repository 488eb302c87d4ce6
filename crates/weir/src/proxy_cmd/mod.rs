//! `weir proxy`: the service proxy agent (kube-proxy's job) and `weir proxy cleanup`.
//!
//! The sync loop is `weir_proxy::agent`; this module keeps the flags and configuration file
//! (`config`), starting the object source (`source`) and the wiring.

mod config;
mod source;

use std::net::IpAddr;
use std::process::ExitCode;

use anyhow::Context;
use clap::{Args, Subcommand};
use tracing::warn;
use weir_model::ProxyConfig;
use weir_proxy::agent::{LoopSettings, Operations, OperationsSettings, ProxyLoop, SystemClock};
use weir_proxy::iptables::{BackendChoice, IptablesBackend, IptablesOptions};
use weir_proxy::ipvs::{IpvsBackend, IpvsOptions};
use weir_proxy::nft::{NftBackend, NftOptions};
use weir_proxy::userspace::UserspaceBackend;
use weir_proxy::Backend;

use config::Settings;
pub use config::{parse_duration, IpvsSettings, ProxyFlags, ProxyMode};

/// One glibc arena for the whole process instead of one per thread that allocates: the API
/// source's thread builds the objects the main loop keeps, and a second arena held the
/// objects in one heap and its free space in another (at 10,000 services: RSS 1.4 MiB and
/// the high-water mark 3.6 MiB lower with one). The threads seldom allocate at the same
/// time (the store's lock orders them), so sharing one arena costs little. Must run before
/// the threads start.
fn use_one_malloc_arena() {
    // SAFETY: mallopt only changes glibc's allocator's tuning.
    unsafe {
        libc::mallopt(libc::M_ARENA_MAX, 1);
    }
}

/// Every address configured in this network namespace (NodePort address matching).
fn local_addresses() -> anyhow::Result<Vec<IpAddr>> {
    let mut rtnl = weir_kernel::Rtnl::new().context("open rtnetlink")?;
    Ok(rtnl
        .addrs(None)
        .context("list addresses")?
        .into_iter()
        .map(|a| a.net.addr())
        .collect())
}

fn proxy_config(s: &Settings) -> anyhow::Result<ProxyConfig> {
    Ok(ProxyConfig {
        node_name: s.node_name.clone(),
        node_ips: Vec::new(),
        local_addresses: local_addresses()?,
        cluster_cidrs: s.cluster_cidrs.clone(),
        masquerade_all: s.masquerade_all,
        nodeport_addresses: s.nodeport_addresses.clone(),
        nodeport_default: s.nodeport_default,
        localhost_nodeports: s.localhost_nodeports,
        zone: None,
    })
}

/// The agent: health and metrics servers, the object source, and the sync loop on `backend`
/// in this thread (so in this network namespace), until the process is killed.
fn agent(settings: Settings, backend: Box<dyn Backend>) -> anyhow::Result<()> {
    let operations = Operations::start(
        &OperationsSettings {
            healthz: Some(settings.healthz_bind_address),
            metrics: Some(settings.metrics_bind_address),
            sync_period: settings.sync_period,
        },
        backend.mode(),
    )?;
    let source = source::StoreSource::start(&settings, operations.metrics())?;
    let loop_settings = LoopSettings {
        node_name: settings.node_name.clone(),
        sync_period: settings.sync_period,
        full_sync_period: settings.full_sync_period,
        min_sync_period: settings.min_sync_period,
    };
    let config = Box::new(move || proxy_config(&settings).map_err(|e| format!("{e:#}")));
    let sync_loop = ProxyLoop::new(
        loop_settings,
        config,
        backend,
        source,
        SystemClock,
        operations,
    );
    match sync_loop.run() {
        Ok(never) => match never {},
        Err(e) => Err(e.into()),
    }
}

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
    use_one_malloc_arena();
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
            let backend = backend(settings.mode, &settings.ipvs, settings.iptables_backend)?;
            agent(settings, backend)?;
            Ok(ExitCode::SUCCESS)
        }
    }
}
