//! `weir dns`: the cluster DNS server. Objects come from a watched manifest directory or from
//! the Kubernetes API (as `weir proxy`'s, but with every Service and EndpointSlice: headless
//! ones are the DNS's business, and Pods for verified pod records); the zone is rebuilt on
//! every change and swapped in whole.
//!
//! Health and metrics are served by the agents' HTTP layer (`weir-http`'s [`PathServer`]): `/healthz` says
//! ready only once the zone is built from a complete first view of the objects and the DNS
//! sockets are bound (a pod is not sent queries it would answer NXDOMAIN for every service);
//! `/livez` only that the process answers, so a long wait for the API does not get it killed.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use clap::Args;
use tracing::{info, warn};
use weir_dns::agent::{ZoneBuilder, ZoneLoop};
use weir_dns::{
    parse_resolv_conf, DnsMetrics, Forwarder, ForwarderConfig, Handler, PodRecords, Prefetch,
    ServerConfig, ZoneConfig, ZoneHandle,
};
use weir_http::{HttpRuntime, PathResponse, PathServer};
use weir_source::api::Selectors;
use weir_source::Kind;

use crate::proxy_cmd::parse_duration;
use crate::runtime::flags::SourceFlags;
use crate::runtime::source::{wait_ready, LogOnly, Origin, RunningSource, Wanted};
use crate::runtime::views::View;

/// Where the manifests are read when no source is named (and not in a cluster).
const DEFAULT_MANIFESTS: &str = "/etc/weir/manifests";

#[derive(Debug, Args)]
#[command(
    after_help = "Without --manifests, --kubeconfig or --master, and outside a pod: the \
                        manifests in /etc/weir/manifests."
)]
pub struct DnsArgs {
    #[command(flatten)]
    source: SourceFlags,
    /// Address to serve on, UDP and TCP.
    #[arg(long, default_value = "0.0.0.0:53")]
    listen: SocketAddr,
    /// The cluster domain.
    #[arg(long, default_value = "cluster.local")]
    zone: String,
    /// resolv.conf-style file naming the upstream servers for names outside the zone
    /// (without it, such names are REFUSED).
    #[arg(long)]
    upstream_resolv_conf: Option<PathBuf>,
    /// Ask the upstreams over TCP only (a node-local cache asking the cluster DNS).
    #[arg(long)]
    upstream_tcp: bool,
    /// TTL of the cluster zone's records, in seconds.
    #[arg(long, default_value_t = 5)]
    ttl: u32,
    /// Answer a pod's first search-path expansion (`<name>.<ns>.svc.<zone>`, NXDOMAIN in the
    /// zone) with a CNAME to the first name its resolver would try next that has records.
    #[arg(long)]
    autopath: bool,
    /// Pod names `<a-b-c-d>.<ns>.pod.<zone>`: disabled (NXDOMAIN), insecure (any well-formed
    /// name gets the address it spells) or verified (only an address a Pod in <ns> holds;
    /// Pods are watched, or read from the manifests).
    #[arg(long, value_enum, default_value_t = PodsArg::Disabled)]
    pods: PodsArg,
    /// Refresh popular cached entries of forwarded names shortly before their TTL ends.
    #[arg(long)]
    prefetch: bool,
    /// Keep expired cached entries this long (e.g. `86400s`) and answer them, with a 30 s
    /// TTL, when every upstream fails (RFC 8767). Off by default.
    #[arg(long, value_name = "DURATION", value_parser = parse_duration)]
    serve_stale: Option<Duration>,
    /// UDP serving threads (one socket each) and worker threads of the TCP/forwarding runtime.
    #[arg(long, default_value_t = 2)]
    threads: usize,
    /// Serve `/healthz` (200 once the zone is built from a complete first view of the
    /// objects and the DNS sockets are bound, 503 before) and `/livez` here, e.g.
    /// 0.0.0.0:8080. Off when not given.
    #[arg(long, value_name = "ADDR")]
    healthz_bind_address: Option<SocketAddr>,
    /// Serve `/metrics` (Prometheus) here, e.g. 0.0.0.0:9153; the same address as
    /// --healthz-bind-address serves all three paths on one listener. Off when not given.
    #[arg(long, value_name = "ADDR")]
    metrics_bind_address: Option<SocketAddr>,
    /// Node-local cache setup (NodeLocal DNSCache's, in the node's network namespace): put
    /// the --listen address (e.g. 169.254.20.10) on `lo` and exempt DNS to and from it from
    /// conntrack (nft table `ip weir-nodelocal-dns`) before serving. Needs CAP_NET_ADMIN; both
    /// stay after exit, so a restart does not break lookups in between.
    #[arg(long)]
    node_local: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
enum PodsArg {
    Disabled,
    Insecure,
    Verified,
}

fn forwarder(args: &DnsArgs, metrics: &Arc<DnsMetrics>) -> anyhow::Result<Option<Arc<Forwarder>>> {
    let Some(path) = &args.upstream_resolv_conf else {
        return Ok(None);
    };
    let text = std::fs::read_to_string(path).with_context(|| format!("read {}", path.display()))?;
    let mut upstreams =
        parse_resolv_conf(&text).map_err(|e| anyhow::anyhow!("{}: {e}", path.display()))?;
    // Forwarding to ourselves would loop each query until it timed out.
    upstreams.retain(|u| {
        let own = *u == args.listen;
        if own {
            warn!(upstream = %u, "upstream is this server's own address: ignored");
        }
        !own
    });
    anyhow::ensure!(
        !upstreams.is_empty(),
        "{}: no usable upstream",
        path.display()
    );
    info!(
        ?upstreams,
        tcp_only = args.upstream_tcp,
        "forwarding names outside the zone"
    );
    let mut config = ForwarderConfig::new(upstreams);
    config.tcp_only = args.upstream_tcp;
    config.prefetch = args.prefetch.then(Prefetch::default);
    config.serve_stale = args.serve_stale;
    config.metrics = metrics.clone();
    Ok(Some(Forwarder::new(config)))
}

/// What `weir dns` reads: every Service and EndpointSlice (kube-proxy's selectors leave out
/// headless Services, which DNS answers), and Pods only for verified pod records.
fn wanted(args: &DnsArgs) -> Wanted {
    let mut kinds = vec![Kind::Service, Kind::EndpointSlice];
    if args.pods == PodsArg::Verified {
        kinds.push(Kind::Pod);
    }
    Wanted {
        kinds,
        selectors: Selectors::Everything,
        ..Wanted::default()
    }
}

/// The source the flags name; with none, outside a pod, the default manifest directory.
fn origin(args: &DnsArgs) -> anyhow::Result<Origin> {
    let mut source = args.source.clone();
    let in_cluster = std::env::var_os("KUBERNETES_SERVICE_HOST").is_some_and(|v| !v.is_empty());
    let named =
        source.manifests.is_some() || source.kubeconfig.is_some() || source.master.is_some();
    if !named && !in_cluster {
        source.manifests = Some(PathBuf::from(DEFAULT_MANIFESTS));
    }
    source.origin()
}

/// What the health and metrics listeners answer for `path`: `health` and `metrics` say which
/// paths this listener serves; `metrics_body` is only called for `/metrics`.
fn route(
    path: &str,
    health: bool,
    metrics: bool,
    ready: bool,
    metrics_body: impl FnOnce() -> String,
) -> Option<PathResponse> {
    const TEXT: &str = "text/plain; charset=utf-8";
    match path {
        "/healthz" if health && ready => Some((200, TEXT, "ok\n".into())),
        "/healthz" if health => Some((
            503,
            TEXT,
            "waiting for a complete first view of the objects\n".into(),
        )),
        "/livez" if health => Some((200, TEXT, "ok\n".into())),
        "/metrics" if metrics => Some((200, weir_dns::metrics::CONTENT_TYPE, metrics_body())),
        _ => None,
    }
}

/// The health and metrics listeners, open while this is held.
struct Http {
    _servers: Vec<PathServer>,
    _runtime: HttpRuntime,
}

/// Starts `/healthz` and `/livez` on --healthz-bind-address and `/metrics` on
/// --metrics-bind-address (one listener for all three when both are the same address).
fn start_http(
    args: &DnsArgs,
    ready: &Arc<AtomicBool>,
    metrics: &Arc<DnsMetrics>,
    forwarder: &Option<Arc<Forwarder>>,
) -> anyhow::Result<Option<Http>> {
    let (healthz, metrics_at) = (args.healthz_bind_address, args.metrics_bind_address);
    if healthz.is_none() && metrics_at.is_none() {
        return Ok(None);
    }
    let runtime = HttpRuntime::new().context("HTTP runtime")?;
    // Port 0 twice means two free ports, not one.
    let shared = healthz.is_some_and(|a| a.port() != 0) && healthz == metrics_at;
    let mut wanted = Vec::new();
    if let Some(a) = healthz {
        wanted.push((a, true, shared));
    }
    if let Some(a) = metrics_at.filter(|_| !shared) {
        wanted.push((a, false, true));
    }
    let mut servers = Vec::new();
    for (addr, health, with_metrics) in wanted {
        let (ready, metrics, forwarder) = (ready.clone(), metrics.clone(), forwarder.clone());
        let server = PathServer::start(&runtime, addr, move |path| {
            let body = || {
                if let Some(f) = &forwarder {
                    metrics.set_upstreams_up(&f.upstreams_up());
                }
                metrics.encode()
            };
            route(
                path,
                health,
                with_metrics,
                ready.load(Ordering::Acquire),
                body,
            )
        })?;
        let paths = match (health, with_metrics) {
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

/// `--node-local`: the NOTRACK table the lab's node-local mode uses
/// ([`weir_dns::node_local::notrack_table`]), replaced whole (`nft -f` with a delete first), then the
/// listen address on `lo`.
fn node_local_setup(listen: SocketAddr) -> anyhow::Result<()> {
    let std::net::IpAddr::V4(ip) = listen.ip() else {
        anyhow::bail!("--node-local: {listen} is not an IPv4 address");
    };
    anyhow::ensure!(
        !ip.is_unspecified(),
        "--node-local needs the cache's own address in --listen (e.g. 169.254.20.10:53)"
    );
    let table = weir_dns::node_local::notrack_table(ip);
    // `add table` first makes the delete valid on a first start; the file is one transaction.
    let script =
        format!("add table ip weir-nodelocal-dns\ndelete table ip weir-nodelocal-dns\n{table}");
    weir_kernel::nft::apply(&script)?;
    // The address only once its traffic is untracked: queries sent to it in between would
    // each leave a conntrack entry (the test saw them).
    let mut rtnl = weir_kernel::rtnl::Rtnl::new().context("rtnetlink")?;
    let lo = rtnl.require_link("lo")?;
    let net = ipnet::Ipv4Net::new(ip, 32).expect("/32 is a valid prefix");
    rtnl.addr_ensure(lo.index, ipnet::IpNet::V4(net))
        .with_context(|| format!("add {ip}/32 to lo"))?;
    info!(%ip, "node-local: address on lo, DNS to and from it not tracked");
    Ok(())
}

pub fn run(args: DnsArgs) -> anyhow::Result<ExitCode> {
    weir_dns::keep_large_blocks_mapped();
    crate::init_logging();
    if args.node_local {
        node_local_setup(args.listen)?;
    }
    let mut config = ZoneConfig::new(&args.zone).map_err(anyhow::Error::msg)?;
    config.ttl = args.ttl;
    config.pods = match args.pods {
        PodsArg::Disabled => PodRecords::Disabled,
        PodsArg::Insecure => PodRecords::Insecure,
        PodsArg::Verified => PodRecords::Verified,
    };
    let metrics = Arc::new(DnsMetrics::new());
    let forwarder = forwarder(&args, &metrics)?;
    // Before the objects are read: /healthz says 503 while waiting for them.
    let ready = Arc::new(AtomicBool::new(false));
    let _http = start_http(&args, &ready, &metrics, &forwarder)?;

    // Nothing is served from a partial view: a restart never answers NXDOMAIN for every
    // service because the directory is missing, a file is still being written, or the API's
    // first lists are not in.
    let source = RunningSource::start(&origin(&args)?, &wanted(&args), Arc::new(LogOnly))
        .context("object source")?;
    wait_ready(&source.health());
    let view = View::new(source.store(), &wanted(&args).kinds, source.health());

    // The zone loop (weir_dns::agent): the first zone now, then a new one on every change.
    let builder = ZoneBuilder::new(config, metrics.clone());
    let mut zones = ZoneLoop::new(builder, view);
    let handle = ZoneHandle::new(zones.build());
    let updater = handle.clone();
    std::thread::Builder::new()
        .name("weir-dns-zone".into())
        .spawn(move || zones.run(updater))
        .context("spawn the zone updater")?;

    info!(listen = %args.listen, zone = %args.zone, "serving");
    weir_dns::serve_blocking(
        args.listen,
        Handler::new(handle, forwarder)
            .with_autopath(args.autopath)
            .with_metrics(metrics),
        ServerConfig {
            udp_workers: args.threads,
            ..ServerConfig::default()
        },
        args.threads,
        || ready.store(true, Ordering::Release),
    )
    .with_context(|| format!("serve on {}", args.listen))?;
    Ok(ExitCode::SUCCESS)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn health_paths_say_ready_only_when_ready() {
        let status = |path, health, metrics, ready| {
            route(path, health, metrics, ready, || "m".into()).map(|r| r.0)
        };
        assert_eq!(status("/healthz", true, false, false), Some(503));
        assert_eq!(status("/healthz", true, false, true), Some(200));
        assert_eq!(status("/livez", true, false, false), Some(200));
        assert_eq!(status("/metrics", true, false, true), None);
        assert_eq!(status("/metrics", false, true, false), Some(200));
        assert_eq!(status("/healthz", false, true, true), None);
        assert_eq!(status("/", true, true, true), None);
    }
}
