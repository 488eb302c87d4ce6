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

use crate::proxy_cmd::parse_duration;
use crate::runtime::flags::{NodeFlag, SourceFlags};
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

#[derive(Debug, Clone, Args)]
pub struct RoutesFlags {
    #[command(flatten)]
    source: SourceFlags,
    #[command(flatten)]
    node: NodeFlag,
    #[command(flatten)]
    options: RoutesOptions,
    /// Reconcile once and exit (non-zero if any operation failed).
    #[arg(long)]
    once: bool,
    /// Serve `/metrics` (routed and refused nodes, failures) here; off when not given.
    #[arg(long, value_name = "ADDR:PORT")]
    metrics_bind_address: Option<std::net::SocketAddr>,
    /// Check the flags and the source (the manifest directory, the kubeconfig) as the agent
    /// would read them, print the settings (or every problem) and exit: 0 valid, 2 not.
    #[arg(long)]
    validate: bool,
    /// --validate's output: text or json (for CI).
    #[arg(short = 'o', long = "output", value_enum, requires = "validate",
          default_value_t = crate::proxy_cmd::ValidateOutput::Text)]
    output: crate::proxy_cmd::ValidateOutput,
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
    #[arg(long, default_value = DEFAULT_PREFIX)]
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
    /// Periodic full reconciliation (repairs entries changed behind weir's back).
    #[arg(long, value_name = "DURATION", value_parser = parse_duration, default_value = "30s")]
    resync_period: Duration,
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
            resync_period: opts.resync_period,
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

pub fn run(args: RoutesArgs) -> anyhow::Result<ExitCode> {
    crate::init_logging();
    if let Some(RoutesCommand::Cleanup) = args.command {
        let mut rtnl = Rtnl::new().context("open rtnetlink")?;
        let cleaned = cleanup(&mut rtnl)?;
        eprintln!(
            "weir routes cleanup: {} routes, devices {:?} removed",
            cleaned.routes, cleaned.devices
        );
        for e in &cleaned.errors {
            eprintln!("weir routes cleanup: {e}");
        }
        return Ok(if cleaned.errors.is_empty() {
            ExitCode::SUCCESS
        } else {
            ExitCode::FAILURE
        });
    }
    let flags = args.flags;
    if flags.validate {
        let json = flags.output == crate::proxy_cmd::ValidateOutput::Json;
        return Ok(validate::run(&flags, json));
    }
    let origin = flags.source.origin()?;
    let part = RoutesPart {
        node_name: flags.node.resolve()?,
        options: flags.options.clone(),
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
    let _metrics_server = match flags.metrics_bind_address {
        Some(addr) => {
            let rt = HttpRuntime::new().context("metrics runtime")?;
            let m = part.metrics.clone();
            let server = MetricsServer::start(&rt, addr, move || m.encode())?;
            info!(addr = %server.addr(), "serving /metrics");
            Some((server, rt))
        }
        None => None,
    };
    // Nothing is reconciled from a partial world (an empty one would remove every route).
    wait_ready(&source.health());
    let view = View::new(source.store(), &ROUTES_KINDS, source.health());
    match part.run(view)? {}
}
