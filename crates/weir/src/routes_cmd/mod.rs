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

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use clap::{Args, Subcommand, ValueEnum};
use tracing::info;
use weir_http::{HttpRuntime, MetricsServer};
use weir_kernel::Rtnl;
use weir_model::Snapshot;
use weir_routes::agent::{Kernel, LoopSettings, NodeView, RoutesLoop, RoutesObserver};
use weir_routes::annotations::DEFAULT_PREFIX;
use weir_routes::kernel::{cleanup, Reconciled};
use weir_routes::plan::{DEFAULT_PORT, DEFAULT_VNI};
use weir_routes::{Backend, Config, VxlanConfig};
use weir_source::api::{patch_node_annotations, start_api_source, ApiOptions, ApiSource};
use weir_source::{watch_dir, Event, Kind, ManifestDir, SharedStore};

use crate::proxy_cmd::parse_duration;

/// The store as the loop sees it.
struct StoreView(SharedStore);

impl NodeView for StoreView {
    fn snapshot(&self) -> (u64, Snapshot) {
        self.0.snapshot()
    }
    fn wait_newer(&self, seen: u64, timeout: Duration) -> Option<u64> {
        self.0.wait_newer(seen, timeout).map(|(g, _)| g)
    }
}

/// After each reconciliation: the patch, status and MTU files (and the Node, from the API),
/// and the metrics.
struct Reporting {
    publisher: publish::Publisher,
    metrics: Arc<metrics::RoutesMetrics>,
}

impl RoutesObserver for Reporting {
    type Error = anyhow::Error;

    fn reconciled(&mut self, r: &Reconciled) -> anyhow::Result<()> {
        self.publisher.report(&r.desired)?;
        self.metrics.reconciled(&r.desired, !r.failed.is_empty());
        Ok(())
    }

    fn failed(&mut self, _error: &weir_routes::kernel::Error) {
        self.metrics.failed();
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
    /// Directory of Kubernetes YAML manifests (Nodes), watched.
    #[arg(long, value_name = "DIR", conflicts_with_all = ["kubeconfig", "master"])]
    manifests: Option<PathBuf>,
    /// Nodes from the Kubernetes API of this kubeconfig (as `weir proxy --kubeconfig`).
    #[arg(long, value_name = "FILE")]
    kubeconfig: Option<PathBuf>,
    /// Nodes from the Kubernetes API at URL (overrides the kubeconfig's server). With neither
    /// flag nor --manifests, in a pod (KUBERNETES_SERVICE_HOST set): the in-cluster account.
    #[arg(long, value_name = "URL")]
    master: Option<String>,
    /// This node's name (default: the host name).
    #[arg(long, value_name = "NAME")]
    node_name: Option<String>,
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
    /// How often the manifest directory is checked for changes.
    #[arg(long, value_name = "DURATION", value_parser = parse_duration, default_value = "1s")]
    manifest_poll_interval: Duration,
    /// Periodic full reconciliation (repairs entries changed behind weir's back).
    #[arg(long, value_name = "DURATION", value_parser = parse_duration, default_value = "30s")]
    resync_period: Duration,
    /// Reconcile once and exit (non-zero if any operation failed).
    #[arg(long)]
    once: bool,
    /// Serve `/metrics` (routed and refused nodes, failures) here; off when not given.
    #[arg(long, value_name = "ADDR:PORT")]
    metrics_bind_address: Option<std::net::SocketAddr>,
}

fn config(flags: &RoutesFlags) -> anyhow::Result<Config> {
    let node_name = match &flags.node_name {
        Some(n) => n.clone(),
        None => std::fs::read_to_string("/proc/sys/kernel/hostname")
            .context("host name")?
            .trim()
            .to_string(),
    };
    let backend = match flags.backend {
        BackendName::HostGw => Backend::HostGw,
        BackendName::Vxlan => {
            anyhow::ensure!(
                flags.vni > 0 && flags.vni < 1 << 24,
                "--vni {} is outside 1..16777215",
                flags.vni
            );
            Backend::Vxlan(VxlanConfig::new(flags.vni, flags.port))
        }
    };
    let mut cfg = Config::new(&node_name, backend);
    cfg.annotation_prefix = flags.annotation_prefix.clone();
    Ok(cfg)
}

/// Where Nodes come from, running for as long as it is held.
enum NodeSource {
    Manifests {
        _watcher: Option<weir_source::PollWatcher>,
    },
    Api {
        _source: ApiSource,
        /// Where the API is: node routes publish this node's VTEP on its Node there.
        options: ApiOptions,
    },
}

/// Starts the Node source and returns once the store holds one complete view: nothing is
/// reconciled from a partial world (an empty one would remove every route).
fn start_source(flags: &RoutesFlags, store: &SharedStore) -> anyhow::Result<NodeSource> {
    let in_cluster = std::env::var_os("KUBERNETES_SERVICE_HOST").is_some_and(|v| !v.is_empty());
    let use_api = flags.kubeconfig.is_some() || flags.master.is_some();
    if let Some(manifests) = flags.manifests.as_ref().filter(|_| !use_api) {
        let mut dir = ManifestDir::new(manifests);
        crate::manifest_view::wait_for_complete_view(
            &mut dir,
            flags.manifest_poll_interval,
            flags.once,
        )?;
        store.apply(Event::Resync(dir.objects()));
        let watcher = (!flags.once).then(|| {
            watch_dir(
                dir,
                flags.manifest_poll_interval,
                store.clone(),
                crate::manifest_view::log_watch_event,
            )
        });
        return Ok(NodeSource::Manifests { _watcher: watcher });
    }
    anyhow::ensure!(
        use_api || in_cluster,
        "no Node source: give --manifests DIR, or --kubeconfig / --master (in a pod the \
         in-cluster service account is used)"
    );
    let opts = ApiOptions {
        kubeconfig: flags.kubeconfig.clone(),
        master: flags.master.clone(),
        kinds: vec![Kind::Node],
        ..Default::default()
    };
    let source = start_api_source(
        opts.clone(),
        store.clone(),
        crate::manifest_view::log_api_report,
    )
    .context("Kubernetes API source")?;
    crate::manifest_view::wait_for_api_lists(&source);
    Ok(NodeSource::Api {
        _source: source,
        options: opts,
    })
}

pub fn run(args: RoutesArgs) -> anyhow::Result<ExitCode> {
    crate::init_logging();
    let mut rtnl = Rtnl::new().context("open rtnetlink")?;
    if let Some(RoutesCommand::Cleanup) = args.command {
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
    let cfg = config(&flags)?;

    let store = SharedStore::new();
    let source = start_source(&flags, &store)?;

    let mut publisher = publish::Publisher::new(
        &cfg,
        flags.publish.clone(),
        flags.status.clone(),
        flags.mtu_file.clone(),
    );
    if let NodeSource::Api { options, .. } = &source {
        let (options, node) = (options.clone(), cfg.node_name.clone());
        publisher = publisher.patch_node_with(Box::new(move |annotations| {
            Ok(patch_node_annotations(&options, &node, annotations)?)
        }));
    }
    let metrics = Arc::new(metrics::RoutesMetrics::new());
    // Bound before the loop: the listener opens in this thread's network namespace.
    let _metrics_server = match flags.metrics_bind_address {
        Some(addr) => {
            let rt = HttpRuntime::new().context("metrics runtime")?;
            let m = metrics.clone();
            let server = MetricsServer::start(&rt, addr, move || m.encode())?;
            info!(addr = %server.addr(), "serving /metrics");
            Some((server, rt))
        }
        None => None,
    };
    let settings = LoopSettings {
        config: cfg,
        iface: flags.iface.clone(),
        resync_period: flags.resync_period,
    };
    let reporting = Reporting { publisher, metrics };
    let mut routes = RoutesLoop::new(settings, Kernel(rtnl), StoreView(store), reporting);
    if flags.once {
        return Ok(if routes.reconcile()? {
            ExitCode::FAILURE
        } else {
            ExitCode::SUCCESS
        });
    }
    match routes.run()? {}
}
