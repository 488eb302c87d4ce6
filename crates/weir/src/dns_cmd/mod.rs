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
    parse_resolv_conf, DnsMetrics, Forwarder, ForwarderConfig, Handler, Hosts, PodRecords,
    Prefetch, ServerConfig, ZoneConfig, ZoneHandle,
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

mod config;

use config::{Settings, Upstream};

#[derive(Debug, Args)]
#[command(
    args_conflicts_with_subcommands = true,
    after_help = "Settings: flags over the --config file over the defaults. Without \
                  --manifests, --kubeconfig or --master, and outside a pod: the manifests in \
                  /etc/weir/manifests."
)]
pub struct DnsArgs {
    #[command(subcommand)]
    action: Option<DnsAction>,
    #[command(flatten)]
    source: SourceFlags,
    /// DnsConfiguration file (YAML, apiVersion weir.dev/v1alpha1; docs/dns.md): the
    /// Corefile's counterpart. Flags given beside it win over its fields.
    #[arg(long, value_name = "FILE")]
    config: Option<PathBuf>,
    /// Check the settings (the --config file, the flags, the upstream files) and exit.
    #[arg(long)]
    validate: bool,
    /// Address to serve on, UDP and TCP (default 0.0.0.0:53).
    #[arg(long)]
    listen: Option<SocketAddr>,
    /// The cluster domain (default cluster.local).
    #[arg(long)]
    zone: Option<String>,
    /// resolv.conf-style file naming the upstream servers for names outside the zone, or
    /// `none` to answer them REFUSED. Default: the config's `upstreams`, else
    /// /etc/resolv.conf (the node's resolvers, as CoreDNS's `forward . /etc/resolv.conf`).
    #[arg(long, value_name = "FILE|none")]
    upstream_resolv_conf: Option<String>,
    /// Ask the upstreams over TCP only (a node-local cache asking the cluster DNS).
    #[arg(long)]
    upstream_tcp: bool,
    /// TTL of the cluster zone's records, in seconds (default 5).
    #[arg(long)]
    ttl: Option<u32>,
    /// Answer a pod's first search-path expansion (`<name>.<ns>.svc.<zone>`, NXDOMAIN in the
    /// zone) with a CNAME to the first name its resolver would try next that has records.
    #[arg(long)]
    autopath: bool,
    /// Pod names `<a-b-c-d>.<ns>.pod.<zone>`: disabled (NXDOMAIN; the default), insecure
    /// (any well-formed name gets the address it spells) or verified (only an address a Pod
    /// in <ns> holds; Pods are watched, or read from the manifests).
    #[arg(long, value_enum)]
    pods: Option<PodsArg>,
    /// Refresh popular cached entries of forwarded names shortly before their TTL ends.
    #[arg(long)]
    prefetch: bool,
    /// Keep expired cached entries this long (e.g. `86400s`) and answer them, with a 30 s
    /// TTL, when every upstream fails (RFC 8767). Off by default.
    #[arg(long, value_name = "DURATION", value_parser = parse_duration)]
    serve_stale: Option<Duration>,
    /// UDP serving threads (one socket each) and worker threads of the TCP/forwarding
    /// runtime (default 2).
    #[arg(long)]
    threads: Option<usize>,
    /// Serve `/healthz` (200 once the zone is built from a complete first view of the
    /// objects and the DNS sockets are bound, 503 before) and `/livez` here, e.g.
    /// 0.0.0.0:8080. Off when not given.
    #[arg(long, value_name = "ADDR")]
    healthz_bind_address: Option<SocketAddr>,
    /// Serve `/metrics` (Prometheus) here; the same address as --healthz-bind-address serves
    /// all three paths on one listener. "" or 0: off. Default: the config's
    /// `metricsBindAddress`, else 127.0.0.1:9153 (CoreDNS's port), with --node-local
    /// 127.0.0.1:9253 (NodeLocal DNSCache's).
    #[arg(long, value_name = "ADDR", value_parser = crate::runtime::flags::parse_listen)]
    metrics_bind_address: Option<crate::runtime::flags::Listen>,
    /// Node-local cache setup (NodeLocal DNSCache's, in the node's network namespace): put
    /// the --listen address (e.g. 169.254.20.10) on `lo` and exempt DNS to and from it from
    /// conntrack (nft table `ip weir-nodelocal-dns`) before serving. Needs CAP_NET_ADMIN;
    /// both are removed at exit (SIGTERM, SIGINT) unless --keep-node-local.
    #[arg(long)]
    node_local: bool,
    /// With --node-local: leave the address and the table in place at exit.
    #[arg(long)]
    keep_node_local: bool,
}

#[derive(Debug, clap::Subcommand)]
enum DnsAction {
    /// Remove what --node-local set up: the address on `lo` and the nft table
    /// `ip weir-nodelocal-dns` (each only if present).
    Cleanup {
        /// The node-local address, as given to --listen.
        #[arg(long, default_value = "169.254.20.10:53")]
        listen: SocketAddr,
    },
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum PodsArg {
    Disabled,
    Insecure,
    Verified,
}

/// Whether `upstream` is this server itself: its listen address, or a loopback address on
/// its port while it listens on every address (a static form of CoreDNS's `loop`).
fn is_own(upstream: SocketAddr, listen: SocketAddr) -> bool {
    upstream == listen
        || (upstream.port() == listen.port()
            && listen.ip().is_unspecified()
            && upstream.ip().is_loopback())
}

/// The addresses `list` names (resolv.conf files read now), this server's own left out.
fn resolve_upstreams(
    list: &[Upstream],
    listen: SocketAddr,
    what: &str,
) -> anyhow::Result<Vec<SocketAddr>> {
    let mut out = Vec::new();
    for u in list {
        match u {
            Upstream::Addr(a) => out.push(*a),
            Upstream::ResolvConf(path) => {
                let text = std::fs::read_to_string(path)
                    .with_context(|| format!("{what}: read {}", path.display()))?;
                let found = parse_resolv_conf(&text)
                    .map_err(|e| anyhow::anyhow!("{what}: {}: {e}", path.display()))?;
                out.extend(found);
            }
        }
    }
    // Forwarding to ourselves would loop each query until it timed out.
    out.retain(|u| {
        let own = is_own(*u, listen);
        if own {
            warn!(upstream = %u, "upstream is this server's own address: ignored");
        }
        !own
    });
    anyhow::ensure!(!out.is_empty(), "{what}: no usable upstream");
    Ok(out)
}

/// One forwarder over `list`'s upstreams with the cache settings.
fn forwarder_over(
    s: &Settings,
    list: &[Upstream],
    what: &str,
    metrics: &Arc<DnsMetrics>,
) -> anyhow::Result<Arc<Forwarder>> {
    let upstreams = resolve_upstreams(list, s.listen, what)?;
    info!(?upstreams, tcp_only = s.upstream_tcp, what, "forwarding");
    let mut config = ForwarderConfig::new(upstreams);
    config.tcp_only = s.upstream_tcp;
    config.cache_entries = s.cache.size;
    config.max_ttl = s.cache.max_ttl;
    config.max_negative_ttl = s.cache.denial_ttl;
    config.prefetch = s.cache.prefetch.then(Prefetch::default);
    config.serve_stale = s.cache.serve_stale;
    config.metrics = metrics.clone();
    Ok(Forwarder::new(config))
}

/// The default forwarder (None: `upstreams` empty, outside names REFUSED) and one per stub
/// domain.
type Forwarders = (
    Option<Arc<Forwarder>>,
    Vec<(weir_dns::Name, Arc<Forwarder>)>,
);

fn forwarders(s: &Settings, metrics: &Arc<DnsMetrics>) -> anyhow::Result<Forwarders> {
    let default = if s.upstreams.is_empty() {
        info!("no upstreams: names outside the zone are answered REFUSED");
        None
    } else {
        Some(forwarder_over(s, &s.upstreams, "upstreams", metrics)?)
    };
    let mut stubs = Vec::new();
    for (zone, list) in &s.stub_domains {
        let what = format!("stubDomains.{zone}");
        stubs.push((zone.clone(), forwarder_over(s, list, &what, metrics)?));
    }
    Ok((default, stubs))
}

/// What `weir dns` reads: every Service and EndpointSlice (kube-proxy's selectors leave out
/// headless Services, which DNS answers), and Pods only for verified pod records.
fn wanted(pods: PodsArg) -> Wanted {
    let mut kinds = vec![Kind::Service, Kind::EndpointSlice];
    if pods == PodsArg::Verified {
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
    s: &Settings,
    ready: &Arc<AtomicBool>,
    metrics: &Arc<DnsMetrics>,
    forwarders: &[Arc<Forwarder>],
) -> anyhow::Result<Option<Http>> {
    let (healthz, metrics_at) = (s.healthz_bind_address, s.metrics_bind_address);
    if healthz.is_none() && metrics_at.is_none() {
        return Ok(None);
    }
    let runtime = HttpRuntime::new().context("HTTP runtime")?;
    let wanted = crate::runtime::parts::listeners(healthz, metrics_at);
    let mut servers = Vec::new();
    for (addr, health, with_metrics) in wanted {
        let (ready, metrics, forwarders) = (ready.clone(), metrics.clone(), forwarders.to_vec());
        let server = PathServer::start(&runtime, addr, move |path| {
            let body = || {
                for f in &forwarders {
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
        })
        .with_context(|| crate::runtime::parts::listen_flag(health, addr))?;
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
    let script = format!("{}{table}", weir_dns::node_local::REMOVE_TABLE);
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

/// `weir dns cleanup`, and `--node-local` at exit: the table, then the address (the reverse
/// of the setup's order is not needed: with the address gone nothing is sent to it). Both
/// are tried; a missing one is not an error; every failure is reported.
fn node_local_cleanup(listen: SocketAddr) -> anyhow::Result<()> {
    let std::net::IpAddr::V4(ip) = listen.ip() else {
        anyhow::bail!("{listen} is not an IPv4 address");
    };
    let mut errors = Vec::new();
    if let Err(e) = weir_kernel::nft::apply(weir_dns::node_local::REMOVE_TABLE) {
        errors.push(format!(
            "nft table ip {}: {e:#}",
            weir_dns::node_local::TABLE
        ));
    }
    let net = ipnet::IpNet::V4(ipnet::Ipv4Net::new(ip, 32).expect("/32 is a valid prefix"));
    let removed = weir_kernel::rtnl::Rtnl::new()
        .context("rtnetlink")
        .and_then(|mut rtnl| {
            let lo = rtnl.require_link("lo")?;
            rtnl.addrs_change(lo.index, &[(net, false)])?;
            Ok(())
        });
    if let Err(e) = removed {
        errors.push(format!("{ip}/32 on lo: {e:#}"));
    }
    anyhow::ensure!(
        errors.is_empty(),
        "node-local cleanup: {}",
        errors.join("; ")
    );
    info!(%ip, "node-local: address and table removed");
    Ok(())
}

/// With --node-local and without --keep-node-local: SIGTERM or SIGINT removes the address
/// and the table, then exits. The signals are blocked in this thread before any other
/// starts, so every thread inherits the mask and only the waiting thread takes them.
fn cleanup_on_signal(listen: SocketAddr) -> anyhow::Result<()> {
    use nix::sys::signal::{SigSet, Signal};
    let mut set = SigSet::empty();
    set.add(Signal::SIGTERM);
    set.add(Signal::SIGINT);
    set.thread_block().context("block SIGTERM and SIGINT")?;
    std::thread::Builder::new()
        .name("weir-dns-signals".into())
        .spawn(move || {
            let signal = set.wait();
            info!(?signal, "exiting: node-local cleanup");
            let code = match node_local_cleanup(listen) {
                Ok(()) => 0,
                Err(e) => {
                    tracing::error!("{e:#}");
                    1
                }
            };
            std::process::exit(code);
        })
        .context("spawn the signal thread")?;
    Ok(())
}

/// The settings from the flags and the --config file.
fn settings(args: &DnsArgs) -> anyhow::Result<Settings> {
    let file = match &args.config {
        Some(path) => config::load(path)?,
        None => config::DnsConfiguration::default(),
    };
    config::settings(args, &file, args.config.as_deref())
}

/// The `/metrics` address the arguments (and their --config) give.
#[cfg(test)]
pub(crate) fn metrics_address(args: &DnsArgs) -> Option<SocketAddr> {
    settings(args).unwrap().metrics_bind_address
}

pub fn run(args: DnsArgs) -> anyhow::Result<ExitCode> {
    weir_dns::keep_large_blocks_mapped();
    crate::init_logging();
    if let Some(DnsAction::Cleanup { listen }) = args.action {
        node_local_cleanup(listen)?;
        return Ok(ExitCode::SUCCESS);
    }
    // A configuration weir dns would not apply ends it with exit code 2, as weir proxy's does.
    let s = match settings(&args) {
        Ok(s) => s,
        Err(e) => {
            for line in format!("{e:#}").lines() {
                eprintln!("weir dns: {line}");
            }
            return Ok(ExitCode::from(2));
        }
    };
    let metrics = Arc::new(DnsMetrics::for_listen(s.listen));
    let (forwarder, stubs) = forwarders(&s, &metrics)?;
    let mut config = ZoneConfig::new(&s.zone).map_err(anyhow::Error::msg)?;
    config.ttl = s.ttl;
    config.pods = match s.pods {
        PodsArg::Disabled => PodRecords::Disabled,
        PodsArg::Insecure => PodRecords::Insecure,
        PodsArg::Verified => PodRecords::Verified,
    };
    if args.validate {
        println!("weir dns: settings valid");
        return Ok(ExitCode::SUCCESS);
    }
    if s.node_local {
        if !s.keep_node_local {
            cleanup_on_signal(s.listen)?;
        }
        node_local_setup(s.listen)?;
    }
    // Before the objects are read: /healthz says 503 while waiting for them.
    let ready = Arc::new(AtomicBool::new(false));
    let all: Vec<_> = forwarder
        .iter()
        .chain(stubs.iter().map(|(_, f)| f))
        .cloned()
        .collect();
    let _http = start_http(&s, &ready, &metrics, &all)?;

    // Nothing is served from a partial view: a restart never answers NXDOMAIN for every
    // service because the directory is missing, a file is still being written, or the API's
    // first lists are not in.
    let wanted = wanted(s.pods);
    let source = RunningSource::start(&origin(&args)?, &wanted, Arc::new(LogOnly))
        .context("object source")?;
    wait_ready(&source.health());
    let view = View::new(source.store(), &wanted.kinds, source.health());

    // The zone loop (weir_dns::agent): the first zone now, then a new one on every change.
    let builder = ZoneBuilder::new(config, metrics.clone());
    let mut zones = ZoneLoop::new(builder, view);
    let handle = ZoneHandle::new(zones.build());
    let updater = handle.clone();
    std::thread::Builder::new()
        .name("weir-dns-zone".into())
        .spawn(move || zones.run(updater))
        .context("spawn the zone updater")?;

    info!(listen = %s.listen, zone = %s.zone, "serving");
    let handler = Handler::new(handle, forwarder)
        .with_stub_domains(stubs)
        .with_hosts(Hosts::new(&s.hosts, weir_dns::hosts::DEFAULT_TTL))
        .with_rewrites(s.rewrites.clone())
        .with_autopath(s.autopath)
        .with_metrics(metrics);
    let served = weir_dns::serve_blocking(
        s.listen,
        handler,
        ServerConfig {
            udp_workers: s.threads,
            ..ServerConfig::default()
        },
        s.threads,
        || ready.store(true, Ordering::Release),
    )
    .with_context(|| format!("serve on {}", s.listen));
    // Exiting on an error is an exit too: the node-local setup goes with it.
    if served.is_err() && s.node_local && !s.keep_node_local {
        if let Err(e) = node_local_cleanup(s.listen) {
            tracing::error!("{e:#}");
        }
    }
    served?;
    Ok(ExitCode::SUCCESS)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_upstream_that_is_this_server_is_left_out() {
        let any: SocketAddr = "0.0.0.0:53".parse().unwrap();
        assert!(is_own("127.0.0.1:53".parse().unwrap(), any));
        assert!(is_own("[::1]:53".parse().unwrap(), any));
        assert!(!is_own(
            "127.0.0.53:53".parse().unwrap(),
            "127.0.0.1:53".parse().unwrap()
        ));
        assert!(!is_own("127.0.0.1:5353".parse().unwrap(), any));
        assert!(!is_own("10.0.0.1:53".parse().unwrap(), any));
        assert!(is_own(
            "10.0.0.1:53".parse().unwrap(),
            "10.0.0.1:53".parse().unwrap()
        ));
    }

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
