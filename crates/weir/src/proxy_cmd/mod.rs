//! `weir proxy`: the service proxy agent (kube-proxy's job) and `weir proxy cleanup`.
//!
//! The sync loop is `weir_proxy::agent`; this module keeps the flags and configuration file
//! (`config`) and the part as the agent runs it ([`ProxyPart`]). The object source is the
//! agent runtime's (`crate::runtime`).

mod config;
mod host;
mod kube_proxy;
mod problems;
mod validate;

use std::convert::Infallible;
use std::ffi::OsString;
use std::net::IpAddr;
use std::process::ExitCode;
use std::sync::{Arc, OnceLock};

use anyhow::Context;
use clap::{Args, Subcommand};
use tracing::warn;
use weir_model::ProxyConfig;
use weir_proxy::agent::{LoopSettings, Operations, OperationsSettings, ProxyLoop, SystemClock};
use weir_proxy::health::OtherParts;
use weir_proxy::iptables::{BackendChoice, IptablesBackend, IptablesOptions};
use weir_proxy::ipvs::{IpvsBackend, IpvsOptions};
use weir_proxy::metrics::ProxyMetrics;
use weir_proxy::nft::{NftBackend, NftOptions};
use weir_proxy::userspace::UserspaceBackend;
use weir_proxy::Backend;
use weir_source::api::{ApiReport, Selectors};
use weir_source::WatchEvent;

pub use config::{parse_duration, IpvsSettings, ProxyFlags, ProxyMode};
pub(crate) use config::{LogSettings, Settings};
use kube_proxy::{Findings, Refused};
pub(crate) use problems::go_duration;
use validate::{Invalid, Report};
pub(crate) use validate::{Output as ValidateOutput, Problem};

use crate::runtime::source::{Origin, RunningSource, SourceReports, Wanted};
use crate::runtime::views::{View, PROXY_KINDS};

/// One glibc arena for the whole process instead of one per thread that allocates: the API
/// source's thread builds the objects the main loop keeps, and a second arena held the
/// objects in one heap and its free space in another (at 10,000 services: RSS 1.4 MiB and
/// the high-water mark 3.6 MiB lower with one). The threads seldom allocate at the same
/// time (the store's lock orders them), so sharing one arena costs little. Must run before
/// the threads start.
pub(crate) fn use_one_malloc_arena() {
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
        node_ips: s.node_ips.clone(),
        local_addresses: local_addresses()?,
        cluster_cidrs: s.cluster_cidrs.clone(),
        masquerade_all: s.masquerade_all,
        nodeport_addresses: s.nodeport_addresses.clone(),
        nodeport_default: s.nodeport_default,
        localhost_nodeports: s.localhost_nodeports,
        zone: None,
    })
}

/// The source's reports in the proxy's metrics, once its metrics exist.
#[derive(Default)]
pub(crate) struct ProxyReports(OnceLock<Arc<ProxyMetrics>>);

impl SourceReports for ProxyReports {
    fn api(&self, r: &ApiReport) {
        let Some(metrics) = self.0.get() else { return };
        match r {
            ApiReport::Listed { kind, objects } => metrics.source_listed(kind.as_str(), *objects),
            ApiReport::Objects { kind, objects } => metrics.source_objects(kind.as_str(), *objects),
            ApiReport::Failed { kind, .. } => metrics.source_watch_restarted(kind.as_str()),
            ApiReport::Recovered { .. } | ApiReport::Compat { .. } => {}
        }
    }

    fn scanned(&self, ev: &WatchEvent<'_>) {
        let Some(metrics) = self.0.get() else { return };
        match ev {
            WatchEvent::Error(_) => metrics.source_errors_changed(1),
            WatchEvent::Resolved(_) => metrics.source_errors_changed(-1),
            WatchEvent::Scanned { duration, failed } => metrics.source_scanned(*duration, *failed),
        }
    }
}

/// Where the proxy's settings say the objects are.
pub(crate) fn origin(s: &Settings) -> Origin {
    match &s.api {
        Some(api) => Origin::Api {
            kubeconfig: api.kubeconfig.clone(),
            master: api.master.clone(),
            watch_timeout: Some(api.watch_timeout),
        },
        None => Origin::Manifests {
            dir: s.manifests.clone(),
            poll: s.manifest_poll_interval,
            max_file_bytes: Some(s.manifest_max_file_size),
            state_dir: Some(s.state_dir.clone()),
        },
    }
}

/// What the proxy reads: kube-proxy's Services and EndpointSlices, and its own Node.
pub(crate) fn wanted(s: &Settings) -> Wanted {
    Wanted {
        kinds: PROXY_KINDS.to_vec(),
        only_node: Some(s.node_name.clone()),
        selectors: Selectors::KubeProxy,
        policy_pods: false,
    }
}

/// The service proxy as the agent runs it.
pub(crate) struct ProxyPart {
    pub settings: Settings,
    pub backend: Box<dyn Backend>,
}

impl ProxyPart {
    /// Builds the backend the settings ask for (after the host settings are applied).
    pub fn new(settings: Settings) -> anyhow::Result<Self> {
        host::apply(&settings)?;
        let backend = backend(
            settings.mode,
            &settings.ipvs,
            settings.iptables_backend,
            settings.masquerade_mark,
        )?;
        Ok(ProxyPart { settings, backend })
    }

    /// Health and metrics servers (answering for the agent's `others` too), then the sync
    /// loop on `view` in this thread (so in this network namespace), until it fails.
    pub fn run(
        self,
        view: View,
        reports: &ProxyReports,
        others: OtherParts,
    ) -> anyhow::Result<Infallible> {
        let ProxyPart { settings, backend } = self;
        let operations = Operations::start_with(
            &OperationsSettings {
                healthz: settings.healthz_bind_address,
                metrics: settings.metrics_bind_address,
                sync_period: settings.sync_period,
            },
            backend.mode(),
            others,
        )?;
        let _ = reports.0.set(operations.metrics().clone());
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
            view,
            SystemClock,
            operations,
        );
        Ok(sync_loop.run()?)
    }
}

/// `weir proxy`: the agent runtime with the proxy part alone.
fn agent(settings: Settings) -> anyhow::Result<()> {
    let part = ProxyPart::new(settings)?;
    let reports = Arc::new(ProxyReports::default());
    let (origin, wanted) = (origin(&part.settings), wanted(&part.settings));
    let source = RunningSource::start(&origin, &wanted, reports.clone())?;
    let view = View::new(source.store(), &PROXY_KINDS, source.health());
    match part.run(view, &reports, OtherParts::default())? {}
}

#[derive(Debug, Args)]
#[command(
    args_conflicts_with_subcommands = true,
    // pflag's rule: a flag given twice takes the last value (lists append).
    args_override_self = true,
    after_help = "Every flag of kube-proxy 1.37 is accepted with its meaning, accepted with a \
                  notice saying how weir differs, or refused by name saying why \
                  (docs/proxy.md, \"kube-proxy 1.37 beside weir proxy\")."
)]
pub struct ProxyArgs {
    #[command(subcommand)]
    command: Option<ProxyCommand>,
    /// Remove weir's proxy rules of every mode (or of --proxy-mode) and exit, like
    /// `weir proxy cleanup` (kube-proxy's spelling).
    #[arg(long, value_name = "BOOL", num_args = 0..=1, require_equals = true,
          default_missing_value = "true", value_parser = kube_proxy::parse_go_bool)]
    cleanup: Option<bool>,
    /// Read the flags and --config, print the settings the agent would run with, a notice for
    /// each of kube-proxy's flags and fields that weir takes differently or ignores, and every
    /// problem (unknown or refused fields, bad values, contradictions, an unreadable
    /// kubeconfig: exit code 2); exit without touching anything.
    #[arg(long, conflicts_with = "cleanup")]
    validate: bool,
    /// --validate's output: text (a list) or json (for CI).
    #[arg(short = 'o', long = "output", value_enum, requires = "validate",
          default_value_t = validate::Output::Text)]
    output: validate::Output,
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
    masquerade_mark: u32,
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
                masquerade_mark,
                strict_arp: ipvs.strict_arp,
                exclude_cidrs: ipvs.exclude_cidrs.clone(),
                ..IpvsOptions::default()
            };
            if v4_only {
                opts.families.retain(|f| *f == weir_model::IpFamily::V4);
            }
            Ok(Box::new(IpvsBackend::new(opts)))
        }
        ProxyMode::Nftables => Ok(Box::new(NftBackend::new(NftOptions {
            masquerade_mark,
            ..NftOptions::default()
        }))),
        ProxyMode::Iptables => {
            let mut opts = IptablesOptions {
                backend: iptables_backend,
                masquerade_mark,
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
        backend(m, &IpvsSettings::default(), BackendChoice::Auto, 0x4000)?.cleanup()?;
        eprintln!("weir proxy cleanup: {} rules removed", m.as_str());
    }
    Ok(ExitCode::SUCCESS)
}

/// pflag's spelling of `weir proxy`'s flags, as kube-proxy takes them: `_` in a flag's name is
/// `-` (`--iptables_sync_period=30s`). Other subcommands' arguments are left as they are.
pub fn kube_proxy_spelling(args: Vec<OsString>) -> Vec<OsString> {
    // The subcommand: the first argument that is not a flag nor the global flag's value.
    let mut sub = None;
    let mut i = 1;
    while i < args.len() {
        match args[i].to_str() {
            Some("--log-format") => i += 2,
            Some(a) if a.starts_with('-') => i += 1,
            Some(a) => {
                // `weir agent` takes the proxy's flags too.
                sub = Some((i, a == "proxy" || a == "agent"));
                break;
            }
            None => break,
        }
    }
    let Some((at, true)) = sub else {
        return args;
    };
    let mut rest_are_values = false;
    args.into_iter()
        .enumerate()
        .map(|(i, a)| {
            let Some(s) = a.to_str().filter(|_| i > at && !rest_are_values) else {
                return a;
            };
            if s == "--" {
                rest_are_values = true;
                return a;
            }
            match s.strip_prefix("--") {
                Some(flag) if flag.split('=').next().is_some_and(|n| n.contains('_')) => {
                    let (name, value) = match flag.split_once('=') {
                        Some((n, v)) => (n.replace('_', "-"), Some(v)),
                        None => (flag.replace('_', "-"), None),
                    };
                    match value {
                        Some(v) => format!("--{name}={v}").into(),
                        None => format!("--{name}").into(),
                    }
                }
                _ => a,
            }
        })
        .collect()
}

pub fn run(args: ProxyArgs) -> anyhow::Result<ExitCode> {
    use_one_malloc_arena();
    run_checked(args).or_else(|e| refused_exit(e, "weir proxy"))
}

/// Invalid settings (a refused flag or field, a value that does not parse, an unknown
/// field) end the command with exit code 2 and every problem on stderr; other errors pass
/// through.
pub(crate) fn refused_exit(e: anyhow::Error, command: &str) -> anyhow::Result<ExitCode> {
    if e.downcast_ref::<Refused>().is_none() && e.downcast_ref::<Invalid>().is_none() {
        return Err(e);
    }
    for line in e.to_string().lines() {
        eprintln!("{command}: {line}");
    }
    Ok(ExitCode::from(2))
}

/// `--validate`: the settings, or every problem; and what only a validation checks.
pub(crate) fn validate_report(flags: &ProxyFlags) -> Report {
    let mut notices = Vec::new();
    match flags.settings(&mut |n| notices.push(n)) {
        Ok(s) => Report {
            problems: validate::check_environment(&s),
            settings: Some(s),
            notices,
        },
        Err(e) => Report {
            settings: None,
            notices,
            problems: validate::problems_of(&e),
        },
    }
}

/// The `/metrics` address the arguments give.
#[cfg(test)]
pub(crate) fn metrics_address(args: &ProxyArgs) -> Option<std::net::SocketAddr> {
    args.flags
        .settings(&mut |_| {})
        .unwrap()
        .metrics_bind_address
}

fn run_checked(args: ProxyArgs) -> anyhow::Result<ExitCode> {
    if let Some(v) = &args.flags.version {
        match config::version_request(v) {
            Ok(true) => {
                outln!("weir {}", env!("WEIR_VERSION_LINE"));
                return Ok(ExitCode::SUCCESS);
            }
            Ok(false) => {}
            Err(refused) => return Err(Refused(vec![refused]).into()),
        }
    }
    let flag_log = args.flags.log_flags();
    match args.command {
        Some(ProxyCommand::Cleanup { proxy_mode }) => {
            crate::init_logging_with(flag_log.format, flag_log.filter());
            cleanup(proxy_mode)
        }
        None if args.cleanup == Some(true) => {
            let mut found = Findings::default();
            args.flags.kube_proxy.check(&mut found);
            if !found.refused.is_empty() {
                return Err(Refused(found.refused).into());
            }
            crate::init_logging_with(flag_log.format, flag_log.filter());
            for n in found.notices {
                warn!("{n}");
            }
            cleanup(args.flags.proxy_mode)
        }
        None if args.validate => {
            let report = validate_report(&args.flags);
            out!("{}", report.render(args.output));
            Ok(ExitCode::from(if report.valid() { 0 } else { 2 }))
        }
        None => {
            let mut notices = Vec::new();
            let settings = args.flags.settings(&mut |n| notices.push(n))?;
            crate::init_logging_with(settings.log.format, settings.log.filter());
            for n in notices {
                warn!("{n}");
            }
            agent(settings)?;
            Ok(ExitCode::SUCCESS)
        }
    }
}
