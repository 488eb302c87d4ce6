//! `weir policy`: NetworkPolicy enforcement for the pods on this node (a network plugin's
//! policy controller's job), in nftables `table inet weir-policy`; and `weir policy cleanup`.
//!
//! The loop is `weir_policy::agent::PolicyLoop` with `weir_policy::kernel::NftBackend`; this
//! module keeps the flags, the part as the agent runs it ([`PolicyPart`]), health and metrics
//! (`metrics.rs`). The object source is the agent runtime's (`crate::runtime`).

mod metrics;

use std::net::SocketAddr;
use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use clap::{Args, Subcommand};
use tracing::info;
use weir_http::{HttpRuntime, PathResponse, PathServer};
use weir_policy::agent::{LoopSettings, PolicyLoop, PolicyObserver, Synced, SystemClock};
use weir_policy::backend::{Backend, Error};
use weir_policy::kernel::NftBackend;

use crate::proxy_cmd::parse_duration;
use crate::runtime::flags::{metrics_default, parse_listen, Listen, NodeFlag, SourceFlags};
use crate::runtime::source::{LogOnly, RunningSource, SourceHealth, Wanted};
use crate::runtime::views::{View, POLICY_KINDS};
pub(crate) use metrics::PolicyMetrics;

#[derive(Debug, Args)]
#[command(args_conflicts_with_subcommands = true)]
pub struct PolicyArgs {
    #[command(subcommand)]
    command: Option<PolicyCommand>,
    #[command(flatten)]
    flags: PolicyFlags,
}

#[derive(Debug, Subcommand)]
enum PolicyCommand {
    /// Delete table inet weir-policy (and nothing else): every pod's traffic is allowed again.
    Cleanup,
}

#[derive(Debug, Clone, Args)]
pub struct PolicyFlags {
    #[command(flatten)]
    source: SourceFlags,
    /// The pods whose spec.nodeName is this node's are enforced here.
    #[command(flatten)]
    node: NodeFlag,
    /// Serve `/healthz` (200 once the rules of a complete first view are in the kernel and
    /// while the source is current, 503 otherwise) and `/livez` here, e.g. 0.0.0.0:10258.
    /// Off when not given.
    #[arg(long, value_name = "ADDR")]
    healthz_bind_address: Option<SocketAddr>,
    /// Serve `/metrics` (Prometheus) here; the same address as --healthz-bind-address serves
    /// all three paths on one listener. "" or 0: off.
    #[arg(long, value_name = "ADDR", value_parser = parse_listen,
          default_value = metrics_default::POLICY)]
    metrics_bind_address: Listen,
    /// How often the kernel's table is checked against what was written, and rewritten if
    /// it changed (an outside `nft flush ruleset`).
    #[arg(long, value_name = "DURATION", value_parser = parse_duration, default_value = "30s")]
    sync_period: Duration,
    /// Changes arriving faster than this are written together.
    #[arg(long, value_name = "DURATION", value_parser = parse_duration, default_value = "1s")]
    min_sync_period: Duration,
}

/// What /healthz reads: a first sync done, the last one not failed, and the source current.
#[derive(Default)]
pub(crate) struct Health {
    synced: AtomicBool,
    failing: AtomicBool,
}

/// The observer: metrics and health.
struct Reporting {
    metrics: Arc<PolicyMetrics>,
    health: Arc<Health>,
}

impl PolicyObserver for Reporting {
    fn synced(&mut self, s: &Synced<'_>) {
        self.metrics.synced(s);
        self.health.synced.store(true, Ordering::Release);
        self.health.failing.store(false, Ordering::Release);
    }
    fn failed(&mut self, _error: &Error) {
        self.metrics.failed();
        self.health.failing.store(true, Ordering::Release);
    }
    fn warnings(&mut self, total: usize) {
        self.metrics.warnings(total);
    }
}

/// What the listeners answer for `path`.
fn route(
    path: &str,
    health: bool,
    metrics: bool,
    state: Result<(), String>,
    metrics_body: impl FnOnce() -> String,
) -> Option<PathResponse> {
    const TEXT: &str = "text/plain; charset=utf-8";
    match path {
        "/healthz" if health => Some(match state {
            Ok(()) => (200, TEXT, "ok\n".into()),
            Err(why) => (503, TEXT, format!("{why}\n")),
        }),
        "/livez" if health => Some((200, TEXT, "ok\n".into())),
        "/metrics" if metrics => Some((
            200,
            "text/plain; version=0.0.4; charset=utf-8",
            metrics_body(),
        )),
        _ => None,
    }
}

pub(crate) fn health_state(health: &Health, source: &SourceHealth) -> Result<(), String> {
    if !health.synced.load(Ordering::Acquire) {
        return Err(match source.check() {
            Err(why) => format!("no rules written yet: {why}"),
            Ok(()) => "no rules written yet".into(),
        });
    }
    if health.failing.load(Ordering::Acquire) {
        return Err("the last sync failed (the rules before it are enforced)".into());
    }
    source.check()
}

struct Http {
    _servers: Vec<PathServer>,
    _runtime: HttpRuntime,
}

fn start_http(
    flags: &PolicyFlags,
    health: &Arc<Health>,
    source: SourceHealth,
    metrics: &Arc<PolicyMetrics>,
) -> anyhow::Result<Option<Http>> {
    let (healthz, metrics_at) = (flags.healthz_bind_address, flags.metrics_bind_address.0);
    if healthz.is_none() && metrics_at.is_none() {
        return Ok(None);
    }
    let runtime = HttpRuntime::new().context("HTTP runtime")?;
    let wanted = crate::runtime::parts::listeners(healthz, metrics_at);
    let mut servers = Vec::new();
    for (addr, with_health, with_metrics) in wanted {
        let (health, source, metrics) = (health.clone(), source.clone(), metrics.clone());
        let server = PathServer::start(&runtime, addr, move |path| {
            let state = if path == "/healthz" {
                health_state(&health, &source)
            } else {
                Ok(())
            };
            route(path, with_health, with_metrics, state, || metrics.encode())
        })
        .with_context(|| crate::runtime::parts::listen_flag(with_health, addr))?;
        let paths = match (with_health, with_metrics) {
            (true, true) => "/healthz, /livez, /metrics",
            (true, false) => "/healthz, /livez",
            _ => "/metrics",
        };
        info!(addr = %server.addr(), paths, "serving HTTP");
        servers.push(server);
    }
    Ok(Some(Http {
        _servers: servers,
        _runtime: runtime,
    }))
}

/// What the policy enforcer reads: Namespaces, Pods with their policy part, NetworkPolicies.
pub(crate) fn wanted() -> Wanted {
    Wanted {
        kinds: POLICY_KINDS.to_vec(),
        policy_pods: true,
        ..Wanted::default()
    }
}

/// The NetworkPolicy part as the agent runs it.
pub(crate) struct PolicyPart {
    pub settings: LoopSettings,
    pub metrics: Arc<PolicyMetrics>,
    pub health: Arc<Health>,
}

impl PolicyPart {
    /// Runs the loop in this thread (so in its network namespace) until it fails.
    pub fn run(self, view: View) -> anyhow::Result<ExitCode> {
        info!(
            node = %self.settings.node_name,
            sync_period_s = self.settings.sync_period.as_secs_f64(),
            min_sync_period_s = self.settings.min_sync_period.as_secs_f64(),
            "enforcing NetworkPolicy in table inet weir-policy"
        );
        let reporting = Reporting {
            metrics: self.metrics,
            health: self.health,
        };
        let backend = NftBackend::new();
        info!(
            "policy: rules are written with {}",
            backend.nft().describe()
        );
        PolicyLoop::new(self.settings, backend, view, SystemClock, reporting).run()
    }
}

/// The `/metrics` address the arguments give.
#[cfg(test)]
pub(crate) fn metrics_address(args: &PolicyArgs) -> Option<SocketAddr> {
    args.flags.metrics_bind_address.0
}

pub fn run(args: PolicyArgs) -> anyhow::Result<ExitCode> {
    crate::init_logging();
    if let Some(PolicyCommand::Cleanup) = args.command {
        NftBackend::new().cleanup().context("weir policy cleanup")?;
        eprintln!("weir policy cleanup: table inet weir-policy removed");
        return Ok(ExitCode::SUCCESS);
    }
    let flags = args.flags;
    let node = flags.node.resolve()?;
    anyhow::ensure!(
        flags.sync_period > Duration::ZERO,
        "--sync-period must be above zero"
    );
    let origin = flags.source.origin()?;
    let source =
        RunningSource::start(&origin, &wanted(), Arc::new(LogOnly)).context("object source")?;
    let part = PolicyPart {
        settings: LoopSettings {
            node_name: node,
            sync_period: flags.sync_period,
            min_sync_period: flags.min_sync_period,
        },
        metrics: Arc::new(PolicyMetrics::new()),
        health: Arc::new(Health::default()),
    };
    // Bound before the loop, in this thread's network namespace.
    let _http = start_http(&flags, &part.health, source.health(), &part.metrics)?;
    let view = View::new(source.store(), &POLICY_KINDS, source.health());
    part.run(view)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn health_says_why_not_and_metrics_only_where_served() {
        let status = |path, health, metrics, state: Result<(), String>| {
            route(path, health, metrics, state, || "m".into()).map(|r| (r.0, r.2))
        };
        assert_eq!(
            status("/healthz", true, false, Err("no rules written yet".into())),
            Some((503, "no rules written yet\n".into()))
        );
        assert_eq!(status("/healthz", true, false, Ok(())).unwrap().0, 200);
        assert_eq!(
            status("/livez", true, false, Err("x".into())).unwrap().0,
            200
        );
        assert_eq!(status("/metrics", true, false, Ok(())), None);
        assert_eq!(status("/metrics", false, true, Ok(())).unwrap().0, 200);
        assert_eq!(status("/healthz", false, true, Ok(())), None);
    }
}
