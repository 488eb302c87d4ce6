//! `weir routes`: routes to the other nodes' pods (flanneld's job), host-gw or vxlan, and
//! `weir routes cleanup`.
//!
//! Publishing: a manifest source cannot write to the API, so the agent writes what it would
//! put on its own Node as a patch file (`--publish FILE`, for `kubectl patch node <name>
//! --patch-file FILE`, or for the lab/operator to merge into the Node manifest) and logs it.
//! The annotations are flannel's keys under `--annotation-prefix` (default `weir.dev`); with
//! the Kubernetes API as the Node source the agent also merges the same map into its own Node.
//!
//! The loop is `weir_routes::agent::RoutesLoop`; this module keeps the flags, starting the
//! Node source, and what follows each reconciliation (publishing, metrics).

mod flanneld;
mod metrics;
mod publish;
mod validate;

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use clap::{Args, Subcommand, ValueEnum};
use tracing::info;
use weir_http::{HttpRuntime, MetricsServer};
use weir_kernel::Rtnl;
use weir_routes::agent::{Kernel, LoopSettings, NodeView, RoutesLoop, RoutesObserver};
use weir_routes::annotations::DEFAULT_PREFIX;
use weir_routes::kernel::{cleanup, Reconciled};
use weir_routes::plan::{DEFAULT_PORT, DEFAULT_VNI};
use weir_routes::{Backend, Config, VxlanConfig};
use weir_source::api::{patch_node_annotations, ApiOptions};
use weir_source::{Event, ManifestDir, SharedStore};

pub(crate) use metrics::RoutesMetrics;

use crate::foreign_flags::Findings;
use crate::proxy_cmd::parse_duration;
use crate::runtime::flags::{metrics_default, parse_listen, Listen, NodeFlag, SourceFlags};
use crate::runtime::source::{wait_ready, LogOnly, Origin, RunningSource, SourceHealth, Wanted};
use crate::runtime::views::{View, ROUTES_KINDS};

/// After each reconciliation: the patch, status and MTU files (and the Node, from the API),
/// the metrics and the health state.
pub(crate) struct Reporting {
    publisher: publish::Publisher,
    metrics: Arc<RoutesMetrics>,
    health: Arc<RoutesHealth>,
}

impl RoutesObserver for Reporting {
    type Error = anyhow::Error;

    fn reconciled(&mut self, r: &Reconciled) -> anyhow::Result<()> {
        self.publisher.report(&r.desired)?;
        self.metrics.reconciled(&r.desired, !r.failed.is_empty());
        self.health.reconciled.store(true, Ordering::Release);
        self.health
            .failing
            .store(!r.failed.is_empty(), Ordering::Release);
        Ok(())
    }

    fn failed(&mut self, _error: &weir_routes::kernel::Error) {
        self.metrics.failed();
        self.health.failing.store(true, Ordering::Release);
    }
}

/// The node routes part's state, as the agent's `/healthz` reports it.
#[derive(Default)]
pub(crate) struct RoutesHealth {
    reconciled: AtomicBool,
    failing: AtomicBool,
}

impl RoutesHealth {
    pub fn state(&self) -> Result<(), String> {
        if !self.reconciled.load(Ordering::Acquire) {
            return Err("no routes reconciled yet".into());
        }
        if self.failing.load(Ordering::Acquire) {
            return Err("the last reconciliation failed (see the log)".into());
        }
        Ok(())
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum BackendName {
    HostGw,
    Vxlan,
}

#[derive(Debug, Args)]
#[command(args_conflicts_with_subcommands = true)]
pub struct RoutesArgs {
    #[command(subcommand)]
    command: Option<RoutesCommand>,
    #[command(flatten)]
    flags: RoutesFlags,
}

#[derive(Debug, Subcommand)]
enum RoutesCommand {
    /// Remove every route (proto 87) and VTEP device (`weir.*`) weir's routes agent made.
    Cleanup,
}

/// The heading of the flanneld flags weir applies that have no other place in its help.
const FLANNELD: &str = "flanneld's flags (its meaning unless said)";

#[derive(Debug, Clone, Args)]
// flanneld's names of the source flags (docs/routes.md lists all of flanneld's flags).
#[command(
    mut_arg("master", |a| a.alias("kube-api-url")),
    mut_arg("kubeconfig", |a| a.alias("kubeconfig-file"))
)]
pub struct RoutesFlags {
    #[command(flatten)]
    source: SourceFlags,
    #[command(flatten)]
    node: NodeFlag,
    #[command(flatten)]
    options: RoutesOptions,
    /// Periodic full reconciliation, repairing entries changed behind weir's back (a Go
    /// duration).
    // `--resync-period`, its former name, is still taken (hidden).
    #[arg(long, alias = "resync-period", value_name = "DURATION",
          value_parser = parse_duration, default_value = "30s")]
    sync_period: Duration,
    /// Reconcile once and exit (non-zero if any operation failed).
    #[arg(long)]
    once: bool,
    /// Serve `/metrics` (routed and refused nodes, failures) here; "" or 0: off.
    #[arg(long, value_name = "ADDR:PORT", value_parser = parse_listen,
          default_value = metrics_default::ROUTES)]
    metrics_bind_address: Listen,
    /// Check the flags and the source (the manifest directory, the kubeconfig) as the agent
    /// would read them, print the settings (or every problem) and exit: 0 valid, 2 not.
    #[arg(long)]
    validate: bool,
    /// --validate's output: text or json (for CI).
    #[arg(short = 'o', long = "output", value_enum, requires = "validate",
          default_value_t = crate::proxy_cmd::ValidateOutput::Text)]
    output: crate::proxy_cmd::ValidateOutput,
    /// klog's verbosity as weir's log level, as `weir proxy -v`: 0-1 info; 2-3 debug and 4-5
    /// trace for weir's crates; 6+ its libraries' debug too. RUST_LOG, when set, wins.
    #[arg(short = 'v', long = "v", value_name = "LEVEL", help_heading = FLANNELD)]
    v: Option<u32>,
    /// Print weir's version line and exit.
    #[arg(long = "version", id = "flanneld_version", value_name = "BOOL", num_args = 0..=1,
          require_equals = true, default_missing_value = "true",
          value_parser = crate::foreign_flags::parse_go_bool, default_value = "false",
          help_heading = FLANNELD)]
    version: bool,
    /// flanneld's flags weir has no flag of its own for: noticed or refused by name.
    #[command(flatten)]
    flanneld: flanneld::FlanneldOnlyFlags,
}

impl RoutesFlags {
    /// The log filter `-v` asks for (`None`: weir's default).
    fn log_filter(&self) -> Option<String> {
        crate::proxy_cmd::LogSettings {
            format: None,
            verbosity: self.v,
        }
        .filter()
    }
}

/// What node routes do, the same flags in `weir routes` and `weir agent`.
#[derive(Debug, Clone, Args)]
pub struct RoutesOptions {
    /// How pod traffic reaches other nodes: host-gw (a route via each node's address; the
    /// nodes share one L2 network) or vxlan (an overlay device, any underlay).
    #[arg(long, value_enum, default_value = "vxlan")]
    backend: BackendName,
    /// VXLAN network identifier (flannel's default 1).
    #[arg(long, default_value_t = DEFAULT_VNI)]
    vni: u32,
    /// VXLAN UDP port (flannel's default 8472; IANA's is 4789).
    #[arg(long, default_value_t = DEFAULT_PORT)]
    port: u16,
    /// Underlay interface of the VTEP (default: the one holding this node's InternalIP).
    #[arg(long, value_name = "IF")]
    iface: Option<String>,
    /// Prefix of the Node annotations read and published (flannel's is flannel.alpha.coreos.com).
    #[arg(long, alias = "kube-annotation-prefix", default_value = DEFAULT_PREFIX)]
    annotation_prefix: String,
    /// Write this node's annotations here, as a Node patch (YAML).
    #[arg(long, value_name = "FILE")]
    publish: Option<PathBuf>,
    /// Write the per-node status and the overlay MTU here (JSON).
    #[arg(long, value_name = "FILE")]
    status: Option<PathBuf>,
    /// Write the pod MTU here (the VTEP's, vxlan) for weir-cni, which reads it when its
    /// conflist sets no `mtu`; removed under host-gw (pods keep the underlay's MTU).
    #[arg(long, value_name = "FILE", default_value = weir_routes::MTU_FILE)]
    mtu_file: PathBuf,
}

fn config(node_name: &str, opts: &RoutesOptions) -> anyhow::Result<Config> {
    let backend = match opts.backend {
        BackendName::HostGw => Backend::HostGw,
        BackendName::Vxlan => {
            anyhow::ensure!(
                opts.vni > 0 && opts.vni < 1 << 24,
                "--vni {} is outside 1..16777215",
                opts.vni
            );
            Backend::Vxlan(VxlanConfig::new(opts.vni, opts.port))
        }
    };
    let mut cfg = Config::new(node_name, backend);
    cfg.annotation_prefix = opts.annotation_prefix.clone();
    Ok(cfg)
}

/// Checks the options as the part will read them (`--vni` in range).
pub(crate) fn check(node_name: &str, opts: &RoutesOptions) -> anyhow::Result<()> {
    config(node_name, opts).map(|_| ())
}

/// The node routes part as the agent runs it: its loop over `view`, reporting to `metrics`
/// and `health`; `api`: where to publish this node's annotations on its Node.
pub(crate) struct RoutesPart {
    pub node_name: String,
    pub options: RoutesOptions,
    /// `--sync-period`: the periodic full reconciliation.
    pub sync_period: Duration,
    pub api: Option<ApiOptions>,
    pub metrics: Arc<RoutesMetrics>,
    pub health: Arc<RoutesHealth>,
}

impl RoutesPart {
    /// Runs the loop in this thread until it fails.
    pub fn run<V: NodeView>(self, view: V) -> anyhow::Result<std::convert::Infallible> {
        let routes = self.routes_loop(view)?;
        routes.run()
    }

    fn routes_loop<V: NodeView>(self, view: V) -> anyhow::Result<RoutesLoop<Kernel, V, Reporting>> {
        let cfg = config(&self.node_name, &self.options)?;
        let rtnl = Rtnl::new().context("open rtnetlink")?;
        let opts = &self.options;
        let mut publisher = publish::Publisher::new(
            &cfg,
            opts.publish.clone(),
            opts.status.clone(),
            opts.mtu_file.clone(),
        );
        if let Some(api) = self.api.clone() {
            let node = cfg.node_name.clone();
            publisher = publisher.patch_node_with(Box::new(move |annotations| {
                Ok(patch_node_annotations(&api, &node, annotations)?)
            }));
        }
        let settings = LoopSettings {
            config: cfg,
            iface: opts.iface.clone(),
            resync_period: self.sync_period,
        };
        let reporting = Reporting {
            publisher,
            metrics: self.metrics,
            health: self.health,
        };
        Ok(RoutesLoop::new(settings, Kernel(rtnl), view, reporting))
    }
}

/// `--once`: one reconciliation from one complete view, without watching.
fn once(origin: &Origin, part: RoutesPart) -> anyhow::Result<ExitCode> {
    let (store, health, _running) = match origin {
        Origin::Manifests { dir, poll, .. } => {
            // An unreadable directory is an error here, not a wait.
            let mut dir = ManifestDir::new(dir);
            crate::manifest_view::wait_for_complete_view(&mut dir, *poll, true)?;
            let store = SharedStore::new();
            store.apply(Event::Resync(dir.objects()));
            (store, SourceHealth::ReadOnce, None)
        }
        Origin::Api { .. } => {
            let source = RunningSource::start(origin, &wanted(), Arc::new(LogOnly))?;
            wait_ready(&source.health());
            (source.store().clone(), source.health(), Some(source))
        }
    };
    let view = View::new(&store, &ROUTES_KINDS, health);
    let failed = part.routes_loop(view)?.reconcile()?;
    Ok(if failed {
        ExitCode::FAILURE
    } else {
        ExitCode::SUCCESS
    })
}

/// What node routes read: every Node.
pub(crate) fn wanted() -> Wanted {
    Wanted {
        kinds: ROUTES_KINDS.to_vec(),
        ..Wanted::default()
    }
}

fn cleanup_command() -> anyhow::Result<ExitCode> {
    crate::init_logging();
    let mut rtnl = Rtnl::new().context("open rtnetlink")?;
    let cleaned = cleanup(&mut rtnl)?;
    eprintln!(
        "weir routes cleanup: {} routes, devices {:?} removed",
        cleaned.routes, cleaned.devices
    );
    for e in &cleaned.errors {
        eprintln!("weir routes cleanup: {e}");
    }
    Ok(if cleaned.errors.is_empty() {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}

/// Serves `/metrics` at `addr` (bound in this thread's network namespace).
fn serve_metrics(
    addr: std::net::SocketAddr,
    metrics: &Arc<RoutesMetrics>,
) -> anyhow::Result<(MetricsServer, HttpRuntime)> {
    let rt = HttpRuntime::new().context("metrics runtime")?;
    let m = metrics.clone();
    let server = MetricsServer::start(&rt, addr, move || m.encode()).with_context(|| {
        format!("--metrics-bind-address {addr} (another address, or \"\" to turn it off)")
    })?;
    info!(addr = %server.addr(), "serving /metrics");
    Ok((server, rt))
}

/// The `/metrics` address the arguments give.
#[cfg(test)]
pub(crate) fn metrics_address(args: &RoutesArgs) -> Option<std::net::SocketAddr> {
    args.flags.metrics_bind_address.0
}

pub fn run(args: RoutesArgs) -> anyhow::Result<ExitCode> {
    if let Some(RoutesCommand::Cleanup) = args.command {
        return cleanup_command();
    }
    let flags = args.flags;
    if flags.version {
        outln!("weir {}", env!("WEIR_VERSION_LINE"));
        return Ok(ExitCode::SUCCESS);
    }
    let mut found = Findings::default();
    flags.flanneld.check(&mut found);
    if flags.validate {
        let json = flags.output == crate::proxy_cmd::ValidateOutput::Json;
        return Ok(validate::run(&flags, found, json));
    }
    if !found.refused.is_empty() {
        for r in &found.refused {
            eprintln!("weir routes: {r}");
        }
        return Ok(ExitCode::from(2));
    }
    crate::init_logging_with(None, flags.log_filter());
    for n in &found.notices {
        tracing::warn!("{n}");
    }
    let origin = flags.source.origin()?;
    let part = RoutesPart {
        node_name: flags.node.resolve()?,
        options: flags.options.clone(),
        sync_period: flags.sync_period,
        api: origin.api_options(),
        metrics: Arc::new(RoutesMetrics::new()),
        health: Arc::new(RoutesHealth::default()),
    };
    if flags.once {
        return once(&origin, part);
    }
    let source =
        RunningSource::start(&origin, &wanted(), Arc::new(LogOnly)).context("object source")?;
    // Bound before the loop: the listener opens in this thread's network namespace.
    let _metrics_server = match flags.metrics_bind_address.0 {
        Some(addr) => Some(serve_metrics(addr, &part.metrics)?),
        None => None,
    };
    // Nothing is reconciled from a partial world (an empty one would remove every route).
    wait_ready(&source.health());
    let view = View::new(source.store(), &ROUTES_KINDS, source.health());
    match part.run(view)? {}
}
