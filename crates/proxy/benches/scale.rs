//! The service proxy at scale: how long the backends take to program N services, to apply a
//! one-endpoint change, how fast new connections to a ClusterIP are compared with connections
//! straight to the pod, and what the real agent (`weir proxy`) costs end to end and in memory.
//! Everything runs in fresh network namespaces created for this run (root only):
//!
//! ```sh
//! cargo build --release -p weir && cargo bench -p weir-proxy --bench scale [-- --json]
//! ```
//!
//! Environment: `WEIR_BENCH_SIZES` (default `1000,5000,10000`), `WEIR_BENCH_MODES` (default
//! `nftables,iptables`; `userspace` too), `WEIR_BENCH_BIG` (default `1`: also 5,000 services × 50 endpoints, nftables,
//! backend level only), `WEIR_BENCH_JSON=path` (write the results as JSON), `WEIR_BIN` (the
//! agent binary, default `target/release/weir`), `WEIR_BENCH_CHURN` (one-endpoint syncs, default 20),
//! `WEIR_BENCH_ROUNDS` (connection-rate rounds per target, default 3), `WEIR_BENCH_AGENT_TIMEOUT`
//! (seconds to wait for the agent's first sync, default 900), `RUST_LOG` (e.g. `info`: the
//! backends' own logs, such as each full sync's phases, on stderr), `WEIR_BENCH_AGENT` (default `1`; `0`
//! skips the agent runs), `WEIR_BENCH_FULL_ROUNDS` (iptables: rounds of the side-by-side full
//! syncs, default 3), `WEIR_BENCH_KUBE_NOFLUSH_MAX` (default 2000: above it kube-proxy's
//! `--noflush` loads, quadratic with iptables-nft, are skipped), `WEIR_BENCH_ONE_CHANGES`
//! (iptables: one-endpoint changes per side-by-side round, default 5), `WEIR_BENCH_STEPS` (default
//! `1`; `0`: iptables rows run the side-by-side comparison only).
//!
//! iptables mode is measured beside kube-proxy's procedure on the same rules: kube-proxy's
//! layout (weir renders the same chains, hashes and rules) loaded as kube-proxy loads it, one
//! `iptables-restore --noflush` transaction per table, into an empty namespace ("first"), its
//! partial sync after one endpoint changed, and the whole layout over itself ("resync"); the
//! partial syncs and the resync run after kube-proxy's jump rules are inserted, as on a node
//! (with the table hooked in, every commit that adds a jump makes the kernel check the whole
//! table, so an unhooked namespace would make kube-proxy look cheaper than it is); and the
//! same layout without `--noflush` (the tool flushes the tables: what kube-proxy never does,
//! the tool's floor). Beside it weir's backend: a first full sync, the one-endpoint sync, and a
//! restarted process's full sync over its predecessor's rules.
//!
//! Figures are medians. The connection rate is measured three ways, the order rotating each
//! round so that noise on a shared machine hits all alike: through the service's VIP, through
//! one static DNAT rule in a table of its own spreading over the same endpoints (conntrack and
//! NAT with no service lookup: the floor of any NAT-based proxy on this kernel), and straight
//! to the pod.

use std::collections::BTreeSet;
use std::fmt::Write as _;
use std::io::{BufRead, BufReader};
use std::net::{IpAddr, Ipv4Addr, SocketAddr, TcpListener, TcpStream};
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc};
use std::thread;
use std::time::{Duration, Instant};

use serde_json::{json, Value};
use weir_kernel::NetNs;
use weir_model::{
    Endpoint, FrontendKind, IpFamily, NodePortAddresses, Plan, PlanDiff, Protocol, ServicePortKey,
    ServicePortPlan, TopologyMode,
};
use weir_proxy::iptables::{IptablesBackend, IptablesOptions};
use weir_proxy::nft::{NftBackend, NftOptions};
use weir_proxy::{Backend, SyncKind};
use weir_testkit::{KillOnDrop, Netns, TempDir};

#[path = "../tests/common/plans.rs"]
mod plans;
use plans::{add, frontend};

// ---------------------------------------------------------------------------------------------
// Configuration

struct Config {
    sizes: Vec<usize>,
    modes: Vec<String>,
    big: bool,
    agent: bool,
    full_rounds: usize,
    /// Above this many services, kube-proxy's `--noflush` loads are not run (quadratic in
    /// iptables-nft: about 1 min at 1,000 services, so ~25 min at 5,000).
    kube_noflush_max: usize,
    /// iptables side by side: one-endpoint changes per round (each side makes the same ones).
    one_changes: usize,
    /// `0`: iptables rows run only the side-by-side comparison, not the backend steps.
    steps: bool,
    churn: usize,
    rounds: usize,
    round_time: Duration,
    clients: usize,
    json_stdout: bool,
    json_path: Option<PathBuf>,
    weir_bin: PathBuf,
    agent_timeout: Duration,
}

fn env_or(name: &str, default: &str) -> String {
    std::env::var(name).unwrap_or_else(|_| default.to_string())
}

fn env_num(name: &str, default: usize) -> usize {
    env_or(name, &default.to_string())
        .parse()
        .unwrap_or_else(|_| panic!("{name} must be a number"))
}

impl Config {
    fn from_env() -> Config {
        let sizes = env_or("WEIR_BENCH_SIZES", "1000,5000,10000")
            .split(',')
            .map(|s| s.trim().parse().expect("WEIR_BENCH_SIZES: numbers"))
            .collect();
        let modes = env_or("WEIR_BENCH_MODES", "nftables,iptables")
            .split(',')
            .map(|s| s.trim().to_string())
            .collect();
        let workspace = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
        let weir_bin = std::env::var_os("WEIR_BIN")
            .map(PathBuf::from)
            .unwrap_or_else(|| workspace.join("target/release/weir"));
        let weir_bin = weir_bin.canonicalize().unwrap_or(weir_bin);
        Config {
            sizes,
            modes,
            big: env_or("WEIR_BENCH_BIG", "1") != "0",
            agent: env_or("WEIR_BENCH_AGENT", "1") != "0",
            full_rounds: env_num("WEIR_BENCH_FULL_ROUNDS", 3).max(1),
            kube_noflush_max: env_num("WEIR_BENCH_KUBE_NOFLUSH_MAX", 2000),
            one_changes: env_num("WEIR_BENCH_ONE_CHANGES", 5).max(1),
            steps: env_or("WEIR_BENCH_STEPS", "1") != "0",
            churn: env_num("WEIR_BENCH_CHURN", 20).max(15),
            rounds: env_num("WEIR_BENCH_ROUNDS", 3).max(3),
            round_time: Duration::from_secs(2),
            clients: 2,
            // `cargo bench` passes `--bench` to harness-less benches: ignore what we do not know.
            json_stdout: std::env::args().any(|a| a == "--json"),
            json_path: std::env::var_os("WEIR_BENCH_JSON").map(PathBuf::from),
            weir_bin,
            agent_timeout: Duration::from_secs(env_num("WEIR_BENCH_AGENT_TIMEOUT", 900) as u64),
        }
    }
}

fn progress(msg: impl AsRef<str>) {
    eprintln!("[scale] {}", msg.as_ref());
}

// ---------------------------------------------------------------------------------------------
// Generated clusters: the same objects as a Plan (for the backends) and as manifests (for the
// agent). `check_plan_matches_planner` verifies at start-up that both describe the same thing.

const NAMESPACE: &str = "bench";
const SVC_PORT: u16 = 80;
const EP_PORT: u16 = 8080;
/// The node's own address (NodePorts are served on it).
const NODE_IP: Ipv4Addr = Ipv4Addr::new(10, 0, 0, 10);
const CLUSTER_CIDR: &str = "10.244.0.0/16";
/// Endpoints live on another node, so none is local (the common case for a big cluster).
const EP_NODE: &str = "node-1";

#[derive(Clone, Copy)]
struct Shape {
    services: usize,
    endpoints: usize,
}

impl Shape {
    fn label(self) -> String {
        if self.endpoints == 10 {
            self.services.to_string()
        } else {
            format!("{}x{}", self.services, self.endpoints)
        }
    }
}

fn svc_name(i: usize) -> String {
    format!("svc-{i:05}")
}

/// ClusterIPs from 10.96.0.0/12.
fn vip(i: usize) -> Ipv4Addr {
    add(Ipv4Addr::new(10, 96, 0, 1), i)
}

/// Endpoints from 10.128.0.0/10 (disjoint from the pod addresses of the datapath test).
fn endpoint_ip(shape: Shape, svc: usize, ep: usize) -> Ipv4Addr {
    add(Ipv4Addr::new(10, 128, 0, 1), svc * shape.endpoints + ep)
}

/// Replacement endpoints of the one-endpoint changes, from a range nothing else uses.
fn fresh_ip(k: usize) -> Ipv4Addr {
    add(Ipv4Addr::new(10, 200, 0, 1), k)
}

/// Every 10th service is also a NodePort (30000–32767 holds 2,768 of them).
fn node_port(i: usize) -> Option<u16> {
    i.is_multiple_of(10)
        .then(|| 30000 + u16::try_from(i / 10).expect("too many NodePorts"))
}

fn key(i: usize) -> ServicePortKey {
    ServicePortKey {
        namespace: NAMESPACE.into(),
        name: svc_name(i).into(),
        port_name: "".into(),
        protocol: Protocol::Tcp,
        family: IpFamily::V4,
    }
}

fn endpoint(ip: Ipv4Addr) -> Endpoint {
    Endpoint {
        ip: IpAddr::V4(ip),
        port: EP_PORT,
        is_local: false,
        ready: true,
        serving: true,
        terminating: false,
    }
}

fn service_plan(i: usize, endpoints: &[Ipv4Addr]) -> ServicePortPlan {
    let mut frontends = vec![frontend(
        FrontendKind::ClusterIp,
        Some(IpAddr::V4(vip(i))),
        SVC_PORT,
    )];
    if let Some(np) = node_port(i) {
        frontends.push(frontend(FrontendKind::NodePort, None, np));
    }
    let mut cluster_endpoints: Vec<Endpoint> = endpoints.iter().map(|ip| endpoint(*ip)).collect();
    cluster_endpoints.sort_by_key(|e| (e.ip, e.port));
    ServicePortPlan {
        port: SVC_PORT,
        frontends,
        cluster_endpoints,
        local_endpoints: Vec::new(),
        affinity_timeout: None,
        internal_policy_local: false,
        external_policy_local: false,
        health_check_node_port: None,
        topology: TopologyMode::None,
        has_any_endpoints: true,
    }
}

fn generated_endpoints(shape: Shape, i: usize) -> Vec<Ipv4Addr> {
    (0..shape.endpoints)
        .map(|j| endpoint_ip(shape, i, j))
        .collect()
}

/// The plan of `shape`; the last service (last in the plan's order, so last in iptables'
/// KUBE-SERVICES walk) gets `last_endpoints` when given.
fn generate_plan(shape: Shape, last_endpoints: Option<&[Ipv4Addr]>) -> Plan {
    let services = (0..shape.services)
        .map(|i| {
            let eps = match last_endpoints {
                Some(eps) if i + 1 == shape.services => eps.to_vec(),
                _ => generated_endpoints(shape, i),
            };
            (key(i), service_plan(i, &eps).into())
        })
        .collect();
    Plan {
        services,
        node_port_addresses_v4: NodePortAddresses::List(BTreeSet::from([IpAddr::V4(NODE_IP)])),
        node_port_addresses_v6: NodePortAddresses::None,
        cluster_cidrs: vec![CLUSTER_CIDR.parse().unwrap()],
        masquerade_all: false,
        warnings: Vec::new(),
    }
}

/// Replaces endpoint `ep` of service `svc` with `ip`, keeping the list sorted as the planner does.
fn replace_endpoint(plan: &mut Plan, svc: usize, ep: usize, ip: Ipv4Addr) {
    let sp = std::sync::Arc::make_mut(plan.services.get_mut(&key(svc)).expect("service exists"));
    sp.cluster_endpoints[ep] = endpoint(ip);
    sp.cluster_endpoints.sort_by_key(|e| (e.ip, e.port));
}

fn service_yaml(out: &mut String, i: usize, endpoints: &[Ipv4Addr]) {
    let name = svc_name(i);
    let (ty, np) = match node_port(i) {
        Some(p) => ("NodePort", format!(", nodePort: {p}")),
        None => ("ClusterIP", String::new()),
    };
    let _ = write!(
        out,
        "---\napiVersion: v1\nkind: Service\nmetadata: {{name: {name}, namespace: {NAMESPACE}}}\n\
         spec: {{type: {ty}, clusterIP: {}, ports: [{{port: {SVC_PORT}, targetPort: {EP_PORT}, \
         protocol: TCP{np}}}]}}\n",
        vip(i)
    );
    let _ = write!(
        out,
        "---\napiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\nmetadata: {{name: {name}-1, \
         namespace: {NAMESPACE}, labels: {{kubernetes.io/service-name: {name}}}}}\n\
         addressType: IPv4\nports: [{{name: \"\", port: {EP_PORT}, protocol: TCP}}]\nendpoints:\n"
    );
    for ip in endpoints {
        let _ = writeln!(
            out,
            "  - {{addresses: [{ip}], conditions: {{ready: true}}, nodeName: {EP_NODE}}}"
        );
    }
}

const NODE_YAML: &str = "apiVersion: v1\nkind: Node\nmetadata: {name: bench}\n\
                         status: {addresses: [{type: InternalIP, address: 10.0.0.10}]}\n";

/// Services per manifest file: big enough to keep the directory small, small enough that a
/// rewrite of one file is cheap.
const SERVICES_PER_FILE: usize = 500;

fn chunk_path(dir: &Path, chunk: usize) -> PathBuf {
    dir.join(format!("services-{chunk:03}.yaml"))
}

/// Writes one manifest file of services; `changed` overrides one service's endpoints. Written
/// to a temporary name and renamed, so the agent's poller never reads half a file.
fn write_chunk(dir: &Path, shape: Shape, chunk: usize, changed: Option<(usize, &[Ipv4Addr])>) {
    let mut text = String::new();
    let first = chunk * SERVICES_PER_FILE;
    for i in first..(first + SERVICES_PER_FILE).min(shape.services) {
        let eps = match changed {
            Some((svc, eps)) if svc == i => eps.to_vec(),
            _ => generated_endpoints(shape, i),
        };
        service_yaml(&mut text, i, &eps);
    }
    let tmp = dir.join(".tmp");
    std::fs::write(&tmp, text).expect("write manifest");
    std::fs::rename(&tmp, chunk_path(dir, chunk)).expect("rename manifest");
}

fn write_manifests(dir: &Path, shape: Shape) {
    std::fs::write(dir.join("node.yaml"), NODE_YAML).expect("write node manifest");
    for chunk in 0..shape.services.div_ceil(SERVICES_PER_FILE) {
        write_chunk(dir, shape, chunk, None);
    }
}

/// The backends and the agent must be measured on the same rules: plan a small generated
/// manifest directory with the real planner and compare with [`generate_plan`].
fn check_plan_matches_planner() -> Result<(), String> {
    let shape = Shape {
        services: 25,
        endpoints: 10,
    };
    let dir = TempDir::new("wbench-check")?;
    write_manifests(&dir.0, shape);
    // Just written: without settle 0 the files would wait out the source's settle time.
    let limits = weir_source::Limits {
        settle: std::time::Duration::ZERO,
        ..Default::default()
    };
    let mut md = weir_source::ManifestDir::with_limits(&dir.0, limits);
    let report = md.scan();
    if !report.errors.is_empty() || report.pending > 0 {
        return Err(format!(
            "manifests not read: {} pending, errors {:?}",
            report.pending, report.errors
        ));
    }
    let config = weir_model::ProxyConfig {
        node_name: "bench".into(),
        local_addresses: vec![IpAddr::V4(NODE_IP)],
        cluster_cidrs: vec![CLUSTER_CIDR.parse().unwrap()],
        ..Default::default()
    };
    let planned = weir_model::plan(&weir_model::Snapshot::from_objects(&md.objects()), &config);
    let generated = generate_plan(shape, None);
    if planned == generated {
        Ok(())
    } else {
        Err(format!(
            "generated plan differs from the planner's: {:?}",
            generated.diff(&planned)
        ))
    }
}

// ---------------------------------------------------------------------------------------------
// Namespaces (weir_testkit's, removed on drop, also on panic).

/// Entering a bench namespace from this thread (weir-kernel's handle on it).
trait Enter {
    fn handle(&self) -> Result<NetNs, String>;
    /// Runs `f` on the calling thread inside this namespace.
    fn run<T>(&self, f: impl FnOnce() -> T) -> Result<T, String>;
}

fn ns_name(mode: &str, label: &str, role: &str) -> String {
    format!("wbench-{mode}-{label}-{}{role}", std::process::id())
}

impl Enter for Netns {
    fn handle(&self) -> Result<NetNs, String> {
        NetNs::named(&self.name).map_err(|e| format!("open netns {}: {e}", self.name))
    }
    fn run<T>(&self, f: impl FnOnce() -> T) -> Result<T, String> {
        self.handle()?
            .run(f)
            .map_err(|e| format!("enter netns {}: {e}", self.name))
    }
}

// ---------------------------------------------------------------------------------------------
// Statistics

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

/// Nearest-rank percentile (`q` in 0..=1) of unsorted samples.
fn percentile(samples: &[f64], q: f64) -> f64 {
    let mut v = samples.to_vec();
    v.sort_by(f64::total_cmp);
    let rank = ((q * v.len() as f64).ceil() as usize).clamp(1, v.len());
    v[rank - 1]
}

fn median(samples: &[f64]) -> f64 {
    let mut v = samples.to_vec();
    v.sort_by(f64::total_cmp);
    let n = v.len();
    if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    }
}

// ---------------------------------------------------------------------------------------------
// Backend level: full sync and one-endpoint changes

fn new_backend(mode: &str) -> Result<Box<dyn Backend>, String> {
    match mode {
        "nftables" => Ok(Box::new(NftBackend::new(NftOptions::default()))),
        "iptables" => Ok(Box::new(IptablesBackend::new(IptablesOptions::default()))),
        // Its syncs are always full (the whole table is rewritten), so its one-endpoint
        // rows say "not partial"; what it is here for is the connection rate.
        "userspace" => Ok(Box::new(weir_proxy::userspace::UserspaceBackend::new())),
        // Needs IPVS and dummy: run it in the qemu VM (`bash scripts/dev.sh vm-bench`).
        "ipvs" => Ok(Box::new(weir_proxy::ipvs::IpvsBackend::new(
            weir_proxy::ipvs::IpvsOptions::default(),
        ))),
        other => Err(format!("unknown mode {other}")),
    }
}

/// Runs one sync inside `ns`, timed from outside the backend (its own report is not trusted
/// to include everything). `diff`: the planner's diff from the last synced plan, given as the
/// agent gives it (`sync_diff`).
fn timed_sync(
    ns: &Netns,
    backend: &mut dyn Backend,
    plan: &Plan,
    diff: Option<&PlanDiff>,
) -> Result<(f64, SyncKind), String> {
    ns.run(|| {
        let start = Instant::now();
        let report = match diff {
            Some(d) => backend.sync_diff(plan, d),
            None => backend.sync(plan),
        }
        .map_err(|e| e.to_string())?;
        Ok((ms(start.elapsed()), report.kind))
    })?
}

struct Churn {
    median_ms: f64,
    p90_ms: f64,
    /// The plan diff alone and a clone of the plan: the parts of a sync that are pure
    /// computation over the whole plan, whatever the change (a backend diffs against, and keeps
    /// a copy of, the plan it applied).
    diff_median_ms: f64,
    clone_median_ms: f64,
    /// Kinds other than Partial (a one-endpoint change should never need a full sync).
    unexpected: Vec<String>,
}

/// `count` successive syncs, each replacing one endpoint of a different service (never the
/// last one, whose endpoints are the datapath test's pod).
fn churn(
    ns: &Netns,
    backend: &mut dyn Backend,
    plan: &mut Plan,
    shape: Shape,
    count: usize,
) -> Result<Churn, String> {
    let (mut times, mut diffs, mut clones) = (Vec::new(), Vec::new(), Vec::new());
    let mut unexpected = Vec::new();
    let candidates = shape.services - 1;
    for k in 0..count {
        let svc = k * candidates / count;
        let start = Instant::now();
        let before = plan.clone();
        clones.push(ms(start.elapsed()));
        replace_endpoint(plan, svc, k % shape.endpoints, fresh_ip(k));
        let start = Instant::now();
        let diff = before.diff(plan);
        diffs.push(ms(start.elapsed()));
        drop(before);
        let (t, kind) = timed_sync(ns, backend, plan, Some(&diff))?;
        if kind != SyncKind::Partial {
            unexpected.push(format!("sync {k}: {kind:?}"));
        }
        times.push(t);
    }
    Ok(Churn {
        median_ms: median(&times),
        p90_ms: percentile(&times, 0.9),
        diff_median_ms: median(&diffs),
        clone_median_ms: median(&clones),
        unexpected,
    })
}

// ---------------------------------------------------------------------------------------------
// Datapath: new TCP connections per second to the VIP versus straight to the pod

const NODE_VETH: &str = "wb0";
const POD_VETH: &str = "wb1";
const NODE_VETH_IP: &str = "10.244.0.1/24";

fn pod_ips() -> Vec<Ipv4Addr> {
    (0..10).map(|k| Ipv4Addr::new(10, 244, 0, 10 + k)).collect()
}

/// A pod namespace behind a veth with the 10 pod addresses; the node routes the service range
/// to it (the route lookup happens before the DNAT, so the VIP needs one).
fn wire_pod(node: &Netns, pod: &Netns) -> Result<(), String> {
    node.ip(&[
        "link", "add", NODE_VETH, "type", "veth", "peer", "name", POD_VETH, "netns", &pod.name,
    ])?;
    node.ip(&["addr", "add", NODE_VETH_IP, "dev", NODE_VETH])?;
    node.ip(&["link", "set", NODE_VETH, "up"])?;
    node.ip(&["route", "add", "10.96.0.0/12", "dev", NODE_VETH])?;
    for ip in pod_ips() {
        pod.ip(&["addr", "add", &format!("{ip}/24"), "dev", POD_VETH])?;
    }
    pod.ip(&["link", "set", POD_VETH, "up"])?;
    // Clients reset their connections (no TIME_WAIT), but leave room anyway: a round makes
    // tens of thousands of connections to one VIP:port.
    node.exec(&["sysctl", "-qw", "net.ipv4.ip_local_port_range=1024 65535"])
}

/// One TCP server in the pod namespace: two threads accepting on one listener and closing.
struct Server {
    listener: TcpListener,
    stop: Arc<AtomicBool>,
    threads: Vec<thread::JoinHandle<()>>,
}

impl Server {
    fn start(pod: &Netns) -> Result<Server, String> {
        // Bound from inside the namespace, the socket stays there whatever thread uses it.
        let listener = pod
            .run(|| TcpListener::bind(("0.0.0.0", EP_PORT)))?
            .map_err(|e| format!("bind :{EP_PORT} in the pod: {e}"))?;
        // std's backlog (128) drops SYNs under a connect storm; the retransmit would cost 1 s.
        // SAFETY: listen(2) on a socket we own.
        unsafe { libc::listen(listener.as_raw_fd(), 4096) };
        let stop = Arc::new(AtomicBool::new(false));
        let mut threads = Vec::new();
        for _ in 0..2 {
            let l = listener.try_clone().map_err(|e| e.to_string())?;
            let stop = stop.clone();
            threads.push(thread::spawn(move || {
                while !stop.load(Ordering::Relaxed) {
                    if let Ok((c, _)) = l.accept() {
                        drop(c);
                    }
                }
            }));
        }
        Ok(Server {
            listener,
            stop,
            threads,
        })
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        // shutdown(2) on a listening socket wakes every thread blocked in accept(2).
        // SAFETY: plain syscall on a socket we own.
        unsafe { libc::shutdown(self.listener.as_raw_fd(), libc::SHUT_RDWR) };
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }
}

/// Connections per second from `clients` threads in the node namespace for `time`.
fn connect_round(
    node: &Netns,
    targets: &[SocketAddr],
    clients: usize,
    time: Duration,
) -> Result<(f64, u64), String> {
    let start = Instant::now();
    let until = start + time;
    let handles: Vec<_> = (0..clients)
        .map(|c| {
            let targets = targets.to_vec();
            let ns = node.handle();
            thread::spawn(move || -> Result<(u64, u64), String> {
                let ns = ns?;
                ns.run(|| {
                    let (mut ok, mut failed) = (0u64, 0u64);
                    let mut i = c;
                    while Instant::now() < until {
                        match TcpStream::connect(targets[i % targets.len()]) {
                            Ok(s) => {
                                weir_proxy::userspace::serve::reset_on_close(&s);
                                ok += 1;
                            }
                            Err(_) => failed += 1,
                        }
                        i += 1;
                    }
                    (ok, failed)
                })
                .map_err(|e| e.to_string())
            })
        })
        .collect();
    let (mut ok, mut failed) = (0, 0);
    for h in handles {
        let (o, f) = h.join().map_err(|_| "client thread panicked")??;
        ok += o;
        failed += f;
    }
    Ok((ok as f64 / start.elapsed().as_secs_f64(), failed))
}

struct ConnRates {
    vip: f64,
    /// Through one static DNAT rule of a table of its own, balancing over the same endpoints:
    /// conntrack and NAT with no service lookup — the floor any NAT-based proxy stands on.
    floor: f64,
    direct: f64,
    failed: u64,
}

/// The bare DNAT rule's address (inside the routed service range, used by no service).
const FLOOR_VIP: Ipv4Addr = Ipv4Addr::new(10, 111, 255, 254);

/// Rounds through the VIP, the bare DNAT rule and straight to the pod, the order rotating each
/// round, conntrack flushed before each so that no round inherits the previous one's table.
fn conn_rates(
    node: &Netns,
    pod: &Netns,
    vip_addr: Ipv4Addr,
    cfg: &Config,
) -> Result<ConnRates, String> {
    wire_pod(node, pod)?;
    let _server = Server::start(pod)?;
    // Spread over the same 10 endpoints as the VIP (numgen, an anonymous map), so that both
    // paths meet the same conntrack tuples and the same server addresses.
    let endpoints: Vec<String> = pod_ips()
        .iter()
        .enumerate()
        .map(|(k, ip)| format!("{k} : {ip} . {EP_PORT}"))
        .collect();
    node.exec(&[
        "nft",
        &format!(
            "add table ip weir_bench_floor; \
             add chain ip weir_bench_floor out {{ type nat hook output priority -110; }}; \
             add rule ip weir_bench_floor out ip daddr {FLOOR_VIP} tcp dport {SVC_PORT} \
             dnat ip addr . port to numgen inc mod {} map {{ {} }}",
            endpoints.len(),
            endpoints.join(", ")
        ),
    ])?;
    let direct: Vec<SocketAddr> = pod_ips()
        .into_iter()
        .map(|ip| SocketAddr::from((ip, EP_PORT)))
        .collect();
    let paths: [Vec<SocketAddr>; 3] = [
        vec![SocketAddr::from((vip_addr, SVC_PORT))],
        vec![SocketAddr::from((FLOOR_VIP, SVC_PORT))],
        direct,
    ];
    // A first connection through each path proves it works before timing anything.
    for t in paths.iter().map(|p| p[0]) {
        node.run(|| TcpStream::connect_timeout(&t, Duration::from_secs(3)))?
            .map_err(|e| format!("connect {t}: {e}"))?;
    }
    let mut rates: [Vec<f64>; 3] = Default::default();
    let mut failed = 0;
    for r in 0..cfg.rounds {
        for k in 0..3 {
            let path = (r + k) % 3;
            let _ = node.exec(&["conntrack", "-F"]);
            let (rate, f) = connect_round(node, &paths[path], cfg.clients, cfg.round_time)?;
            failed += f;
            rates[path].push(rate);
        }
    }
    Ok(ConnRates {
        vip: median(&rates[0]),
        floor: median(&rates[1]),
        direct: median(&rates[2]),
        failed,
    })
}

// ---------------------------------------------------------------------------------------------
// The real agent: end-to-end first sync, memory, and one EndpointSlice change

struct AgentResult {
    full_e2e_ms: f64,
    /// `elapsed_ms` of the first "synced" line: the backend's share of the end-to-end time.
    full_logged_ms: f64,
    rss_mib: f64,
    hwm_mib: f64,
    change_e2e_ms: f64,
}

/// Lines of the agent's stderr as they arrive, stamped.
fn stderr_lines(child: &mut Child) -> mpsc::Receiver<(Instant, String)> {
    let (tx, rx) = mpsc::channel();
    let stderr = child.stderr.take().expect("stderr piped");
    thread::spawn(move || {
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            if tx.send((Instant::now(), line)).is_err() {
                break;
            }
        }
    });
    rx
}

/// Waits for the next "synced" line; returns when it arrived and the line. A failed sync or an
/// exit is an error quoting the agent.
fn wait_synced(
    rx: &mpsc::Receiver<(Instant, String)>,
    timeout: Duration,
) -> Result<(Instant, String), String> {
    let deadline = Instant::now() + timeout;
    let mut tail = Vec::new();
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        match rx.recv_timeout(left) {
            Ok((at, line)) if line.contains(" synced") => return Ok((at, line)),
            Ok((_, line)) if line.contains("sync failed") => return Err(line),
            Ok((_, line)) => tail.push(line),
            Err(mpsc::RecvTimeoutError::Timeout) => {
                return Err(format!("no sync within {timeout:?}"))
            }
            Err(mpsc::RecvTimeoutError::Disconnected) => {
                return Err(format!("agent exited: {}", tail.join(" | ")))
            }
        }
    }
}

fn log_field<'a>(line: &'a str, field: &str) -> Option<&'a str> {
    let start = line.find(&format!("{field}="))? + field.len() + 1;
    line[start..].split_whitespace().next()
}

/// (VmRSS, VmHWM) in MiB.
fn memory_mib(pid: u32) -> Result<(f64, f64), String> {
    let status =
        std::fs::read_to_string(format!("/proc/{pid}/status")).map_err(|e| e.to_string())?;
    let field = |name: &str| -> Result<f64, String> {
        let line = status
            .lines()
            .find(|l| l.starts_with(name))
            .ok_or(format!("{name} missing"))?;
        let kib: f64 = line[name.len()..]
            .trim()
            .trim_end_matches("kB")
            .trim()
            .parse()
            .map_err(|e| format!("{name}: {e}"))?;
        Ok(kib / 1024.0)
    };
    Ok((field("VmRSS:")?, field("VmHWM:")?))
}

fn agent(mode: &str, shape: Shape, cfg: &Config) -> Result<AgentResult, String> {
    if !cfg.weir_bin.exists() {
        return Err(format!(
            "{} missing (cargo build --release -p weir, or set WEIR_BIN)",
            cfg.weir_bin.display()
        ));
    }
    let ns = Netns::create(ns_name(mode, &shape.label(), "-agent"))?;
    // The node's InternalIP, so NodePorts are planned as in the backend runs (on a veth:
    // this kernel has no dummy driver).
    ns.ip(&[
        "link", "add", "node0", "type", "veth", "peer", "name", "node0p",
    ])?;
    ns.ip(&["addr", "add", &format!("{NODE_IP}/24"), "dev", "node0"])?;
    ns.ip(&["link", "set", "node0", "up"])?;
    let dir = TempDir::new(&format!("wbench-{mode}-{}", shape.label()))?;
    write_manifests(&dir.0, shape);

    let mut cmd = Command::new(&cfg.weir_bin);
    cmd.args(["proxy", "--manifests"])
        .arg(&dir.0)
        .args(["--proxy-mode", mode, "--cluster-cidr", CLUSTER_CIDR])
        .args(["--hostname-override", "bench"])
        .args([
            "--manifest-poll-interval",
            "100ms",
            "--min-sync-period",
            "0s",
        ])
        // A periodic resync in the middle of a measurement would only add noise.
        .args(["--sync-period", "1h"])
        .env("RUST_LOG", "info")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
    let handle = ns.handle()?;
    handle.spawn_inside(&mut cmd);
    let start = Instant::now();
    let mut child = KillOnDrop(cmd.spawn().map_err(|e| format!("spawn weir: {e}"))?);
    let rx = stderr_lines(&mut child.0);

    let (at, line) = wait_synced(&rx, cfg.agent_timeout)?;
    let full_e2e_ms = ms(at - start);
    let full_logged_ms = log_field(&line, "elapsed_ms")
        .and_then(|v| v.parse().ok())
        .unwrap_or(f64::NAN);
    let (rss_mib, _) = memory_mib(child.0.id())?;

    // One address of one EndpointSlice, in the middle of the plan.
    let svc = shape.services / 2;
    let mut eps = generated_endpoints(shape, svc);
    eps[0] = fresh_ip(0);
    let changed_at = Instant::now();
    write_chunk(&dir.0, shape, svc / SERVICES_PER_FILE, Some((svc, &eps)));
    let (at, line) = wait_synced(&rx, Duration::from_secs(120))?;
    let change_e2e_ms = ms(at - changed_at);
    progress(format!("  the agent's log of that change: {}", line.trim()));
    let (_, hwm_mib) = memory_mib(child.0.id())?;
    Ok(AgentResult {
        full_e2e_ms,
        full_logged_ms,
        rss_mib,
        hwm_mib,
        change_e2e_ms,
    })
}

// ---------------------------------------------------------------------------------------------
// One row: (mode, shape)

#[derive(Default)]
struct Row {
    mode: String,
    label: String,
    services: usize,
    endpoints: usize,
    full_ms: Option<f64>,
    side_by_side: Option<SideBySide>,
    churn: Option<Churn>,
    conn: Option<ConnRates>,
    agent: Option<AgentResult>,
    errors: Vec<String>,
}

impl Row {
    fn record<T>(&mut self, what: &str, r: Result<T, String>) -> Option<T> {
        r.map_err(|e| {
            progress(format!("  {what} FAILED: {e}"));
            self.errors.push(format!("{what}: {e}"));
        })
        .ok()
    }
}

/// One measured step: wall-clock time and the CPU time it cost (this thread plus the child
/// processes it waited for: `iptables-restore`, `iptables`, `nft`), both in ms. On a shared
/// machine at a load of 20 the wall time is mostly waiting for a core; the CPU time is what the
/// step itself costs.
#[derive(Clone, Copy, Default)]
struct Cost {
    wall: f64,
    cpu: f64,
}

/// CPU time so far of the calling thread and of every waited-for child, in ms.
fn cpu_ms() -> f64 {
    let usage = |who| {
        // SAFETY: getrusage fills the struct it is given; zeroed is a valid rusage.
        let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
        unsafe { libc::getrusage(who, &mut ru) };
        let tv = |t: libc::timeval| t.tv_sec as f64 * 1e3 + t.tv_usec as f64 / 1e3;
        tv(ru.ru_utime) + tv(ru.ru_stime)
    };
    usage(libc::RUSAGE_THREAD) + usage(libc::RUSAGE_CHILDREN)
}

/// Runs `f`, measuring its [`Cost`].
fn costed<T>(f: impl FnOnce() -> Result<T, String>) -> Result<(Cost, T), String> {
    let (start, cpu) = (Instant::now(), cpu_ms());
    let out = f()?;
    let cost = Cost {
        wall: ms(start.elapsed()),
        cpu: cpu_ms() - cpu,
    };
    Ok((cost, out))
}

fn median_cost(v: &[Cost]) -> Option<Cost> {
    (!v.is_empty()).then(|| Cost {
        wall: median(&v.iter().map(|c| c.wall).collect::<Vec<_>>()),
        cpu: median(&v.iter().map(|c| c.cpu).collect::<Vec<_>>()),
    })
}

/// iptables syncs, weir's backend beside kube-proxy's procedure on the same machine, in one
/// run: medians of `full_rounds` rounds, each in fresh namespaces. `None`: not measured
/// (kube-proxy's `--noflush` loads above `WEIR_BENCH_KUBE_NOFLUSH_MAX` services).
struct SideBySide {
    /// weir: first full sync into an empty namespace.
    weir_first: Cost,
    /// weir: the sync after one endpoint of one service changed (partial), given the
    /// planner's diff (`sync_diff`, as the agent calls it).
    weir_one: Cost,
    /// weir: a restarted process (new backend) fully syncing over its predecessor's rules.
    weir_resync: Cost,
    /// kube-proxy's layout (one commit per table), `iptables-restore --noflush`, as
    /// kube-proxy loads it: into an empty namespace, then over itself.
    kube_first: Option<Cost>,
    kube_resync: Option<Cost>,
    /// kube-proxy's partial sync after the same one-endpoint change: listing chains plus the
    /// changed service's chains, one `--noflush` commit per table ([`kube_partial`]), over
    /// its layout with its jumps inserted ([`hook_in`]).
    kube_one: Option<Cost>,
    /// The same layout without `--noflush` (the tool flushes each table first): into an empty
    /// namespace, then over itself.
    kube_flush_first: Cost,
    kube_flush_resync: Cost,
    /// One-endpoint changes behind each side's median.
    one_changes: usize,
    /// Load average (1 min) at the start and the end of the measurement.
    load: (f64, f64),
}

/// `iptables-restore -w [--noflush]` of `script` inside `ns`.
fn timed_restore(ns: &Netns, script: &str, noflush: bool) -> Result<Cost, String> {
    use std::io::Write as _;
    let mut args = vec!["netns", "exec", &ns.name, "iptables-restore", "-w"];
    if noflush {
        args.push("--noflush");
    }
    costed(|| {
        let mut child = Command::new("ip")
            .args(&args)
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .map_err(|e| format!("iptables-restore: {e}"))?;
        child
            .stdin
            .take()
            .expect("piped")
            .write_all(script.as_bytes())
            .map_err(|e| e.to_string())?;
        let out = child.wait_with_output().map_err(|e| e.to_string())?;
        if !out.status.success() {
            return Err(format!(
                "iptables-restore: {}",
                String::from_utf8_lossy(&out.stderr).trim()
            ));
        }
        Ok(())
    })
    .map(|(c, ())| c)
}

/// One weir sync inside `ns` that must be of `want` kind.
/// `diff`: the planner's diff from the previous plan (`sync_diff`, as the agent calls it).
fn costed_sync(
    ns: &Netns,
    b: &mut IptablesBackend,
    plan: &Plan,
    diff: Option<&PlanDiff>,
    want: SyncKind,
) -> Result<Cost, String> {
    let sync = |b: &mut IptablesBackend| match diff {
        Some(d) => b.sync_diff(plan, d),
        None => b.sync(plan),
    };
    let (cost, kind) = costed(|| ns.run(|| sync(b).map(|r| r.kind).map_err(|e| e.to_string()))?)?;
    if kind != want {
        return Err(format!("weir's sync was {kind:?}, not {want:?}"));
    }
    Ok(cost)
}

fn load_average() -> f64 {
    std::fs::read_to_string("/proc/loadavg")
        .ok()
        .and_then(|s| s.split_whitespace().next()?.parse().ok())
        .unwrap_or(f64::NAN)
}

fn v4_backend() -> IptablesBackend {
    IptablesBackend::new(IptablesOptions {
        families: vec![IpFamily::V4],
        ..IptablesOptions::default()
    })
}

/// kube-proxy's partial sync: `update` (the changed service's chains, which weir's renderer
/// writes without the listing chains) plus the listing chains rewritten whole from `full`, as
/// kube-proxy's proxier does on every sync; one commit per table.
fn kube_partial(full: &str, update: &str) -> String {
    const LISTING: [&str; 4] = [
        "KUBE-SERVICES",
        "KUBE-EXTERNAL-SERVICES",
        "KUBE-NODEPORTS",
        "KUBE-PROXY-FIREWALL",
    ];
    let listed = |l: &str| {
        let name = l
            .strip_prefix(':')
            .or_else(|| l.strip_prefix("-A "))
            .and_then(|r| r.split_whitespace().next());
        name.is_some_and(|n| LISTING.contains(&n))
    };
    /// One table of the restore input: its name, declarations, rules and deletions.
    type Table = (String, Vec<String>, Vec<String>, Vec<String>);
    let mut tables: Vec<Table> = Vec::new();
    let mut add = |text: &str, only_listing: bool| {
        let mut current: Option<usize> = None;
        for l in text.lines() {
            if let Some(t) = l.strip_prefix('*') {
                let i = match tables.iter().position(|x| x.0 == t) {
                    Some(i) => i,
                    None => {
                        tables.push((t.to_string(), vec![], vec![], vec![]));
                        tables.len() - 1
                    }
                };
                current = Some(i);
            } else if l == "COMMIT" {
                current = None;
            } else if let Some(i) = current {
                if only_listing && !listed(l) {
                    continue;
                }
                let entry = &mut tables[i];
                if l.starts_with(':') {
                    if !entry.1.iter().any(|d| d == l) {
                        entry.1.push(l.to_string());
                    }
                } else if l.starts_with("-A ") {
                    entry.2.push(l.to_string());
                } else if l.starts_with("-X ") {
                    entry.3.push(l.to_string());
                }
            }
        }
    };
    add(update, false);
    add(full, true);
    let mut out = String::from("# kube-proxy partial sync\n");
    for (t, decl, rules, del) in tables.into_iter().filter(|t| t.0 != "mangle") {
        let _ = writeln!(out, "*{t}");
        for l in decl.iter().chain(&rules).chain(&del) {
            let _ = writeln!(out, "{l}");
        }
        out.push_str("COMMIT\n");
    }
    out
}

/// Inserts kube-proxy's jump rules from the built-in chains into weir's chains in `ns`
/// (weir's backend inserts the same ones), so kube-proxy's layout is hooked in as on a node.
fn hook_in(ns: &Netns) -> Result<(), String> {
    for j in weir_proxy::iptables::jumps().iter().rev() {
        let mut args = vec!["iptables", "-w", "-t", j.table.name(), "-I", j.chain, "1"];
        args.extend(j.args.iter().copied());
        ns.exec(&args)?;
    }
    Ok(())
}

/// `plans[0]` and `changes` more, each with one endpoint of a different service replaced.
fn one_endpoint_plans(shape: Shape, changes: usize) -> Vec<Plan> {
    let mut plans = vec![generate_plan(shape, None)];
    for k in 0..changes {
        let mut next = plans[k].clone();
        replace_endpoint(
            &mut next,
            (shape.services / 2 + k) % shape.services,
            0,
            fresh_ip(k),
        );
        plans.push(next);
    }
    plans
}

fn side_by_side(shape: Shape, cfg: &Config) -> Result<SideBySide, String> {
    let load_start = load_average();
    let plans = one_endpoint_plans(shape, cfg.one_changes);
    let (plan, last) = (&plans[0], plans.last().expect("plans[0] exists"));
    // The diffs the agent's planner hands the backend with each change (computed here, outside
    // the measured sync, as the planner computes them outside the backend).
    let diffs: Vec<_> = plans.windows(2).map(|w| w[0].diff(&w[1])).collect();
    // kube-proxy's transaction shape: the whole ruleset, one commit per table; its partial
    // sync: the listing chains and the changed service's chains, one commit.
    let kopts = IptablesOptions {
        families: vec![IpFamily::V4],
        chains_per_commit: None,
        ..IptablesOptions::default()
    };
    let script = weir_proxy::iptables::render_full(plan, IpFamily::V4, &kopts);
    let updates: Vec<String> = plans
        .windows(2)
        .map(|w| {
            let changed = weir_proxy::iptables::render_update(&w[0], &w[1], IpFamily::V4, &kopts);
            kube_partial(&script, &changed)
        })
        .collect();
    let kube_noflush = shape.services <= cfg.kube_noflush_max;
    let (mut wf, mut wo, mut wr) = (vec![], vec![], vec![]);
    let (mut kf, mut ko, mut kr, mut xf, mut xr) = (vec![], vec![], vec![], vec![], vec![]);
    for round in 0..cfg.full_rounds {
        // Alternate who goes first, so that load on a shared machine hits both alike.
        for weir_turn in [round % 2 == 0, round % 2 == 1] {
            let ns = Netns::create(ns_name("iptables", &shape.label(), &format!("-sbs{round}")))?;
            if weir_turn {
                let mut b = v4_backend();
                wf.push(costed_sync(&ns, &mut b, plan, None, SyncKind::Full)?);
                for (next, diff) in plans[1..].iter().zip(&diffs) {
                    wo.push(costed_sync(
                        &ns,
                        &mut b,
                        next,
                        Some(diff),
                        SyncKind::Partial,
                    )?);
                }
                // A restart: a new process knows nothing of what its predecessor wrote.
                let mut b = v4_backend();
                wr.push(costed_sync(&ns, &mut b, last, None, SyncKind::Full)?);
            } else {
                if kube_noflush {
                    kf.push(timed_restore(&ns, &script, true)?);
                }
                let flushing =
                    Netns::create(ns_name("iptables", &shape.label(), &format!("-fl{round}")))?;
                xf.push(timed_restore(&flushing, &script, false)?);
                xr.push(timed_restore(&flushing, &script, false)?);
                // The partial syncs go to whichever namespace holds the layout (the same
                // rules either way), hooked in as kube-proxy's are on a node.
                let node = if kube_noflush { &ns } else { &flushing };
                hook_in(node)?;
                for update in &updates {
                    ko.push(timed_restore(node, update, true)?);
                }
                if kube_noflush {
                    kr.push(timed_restore(&ns, &script, true)?);
                }
            }
        }
        let c = |v: &Vec<Cost>, n: usize| {
            let this_round = v.get(round * n..(round + 1) * n).unwrap_or_default();
            median_cost(this_round).map_or("not run".into(), |c| {
                format!("{:.0} ms ({:.0} ms CPU)", c.wall, c.cpu)
            })
        };
        let n = cfg.one_changes;
        progress(format!(
            "  round {round}: weir first {}, one-endpoint {} (median of {n}), restart resync {}; \
             kube-proxy layout --noflush first {}, one-endpoint {}, resync {}; \
             flushing first {}, resync {} (load {:.1})",
            c(&wf, 1),
            c(&wo, n),
            c(&wr, 1),
            c(&kf, 1),
            c(&ko, n),
            c(&kr, 1),
            c(&xf, 1),
            c(&xr, 1),
            load_average()
        ));
    }
    let cpus = |v: &Vec<Cost>| {
        v.iter()
            .map(|c| format!("{:.1}", c.cpu))
            .collect::<Vec<_>>()
    };
    progress(format!(
        "  one-endpoint CPU ms, every change: weir {:?}, kube-proxy {:?}",
        cpus(&wo),
        cpus(&ko)
    ));
    let m = |v: &Vec<Cost>| median_cost(v).unwrap_or_default();
    Ok(SideBySide {
        weir_first: m(&wf),
        weir_one: m(&wo),
        weir_resync: m(&wr),
        kube_first: median_cost(&kf),
        kube_one: median_cost(&ko),
        kube_resync: median_cost(&kr),
        kube_flush_first: m(&xf),
        kube_flush_resync: m(&xr),
        one_changes: wo.len(),
        load: (load_start, load_average()),
    })
}

/// Backend-level steps (full sync, churn, datapath) in one node namespace.
fn backend_steps(row: &mut Row, mode: &str, shape: Shape, datapath: bool, cfg: &Config) {
    let node = match Netns::create(ns_name(mode, &shape.label(), "")) {
        Ok(ns) => ns,
        Err(e) => return row.errors.push(e),
    };
    let pods = pod_ips();
    let mut plan = generate_plan(shape, Some(&pods));
    let mut backend = match row.record("backend", new_backend(mode)) {
        Some(b) => b,
        None => return,
    };
    progress(format!("{mode} {}: full sync", shape.label()));
    let full = timed_sync(&node, backend.as_mut(), &plan, None);
    let Some((full_ms, _)) = row.record("full sync", full) else {
        return;
    };
    progress(format!("  full sync {full_ms:.1} ms"));
    row.full_ms = Some(full_ms);

    progress(format!(
        "{mode} {}: {} one-endpoint changes",
        shape.label(),
        cfg.churn
    ));
    let c = churn(&node, backend.as_mut(), &mut plan, shape, cfg.churn);
    if let Some(c) = row.record("one-endpoint change", c) {
        progress(format!(
            "  one-endpoint sync median {:.2} ms, p90 {:.2} ms (plan diff alone {:.2} ms, \
             plan clone {:.2} ms){}",
            c.median_ms,
            c.p90_ms,
            c.diff_median_ms,
            c.clone_median_ms,
            if c.unexpected.is_empty() {
                String::new()
            } else {
                format!("; not partial: {:?}", c.unexpected)
            }
        ));
        row.churn = Some(c);
    }

    if !datapath {
        return;
    }
    progress(format!(
        "{mode} {}: connection rate, VIP vs a bare DNAT rule vs direct",
        shape.label()
    ));
    let pod = match Netns::create(ns_name(mode, &shape.label(), "-pod")) {
        Ok(ns) => ns,
        Err(e) => return row.errors.push(e),
    };
    let vip_addr = vip(shape.services - 1);
    if let Some(r) = row.record("connection rate", conn_rates(&node, &pod, vip_addr, cfg)) {
        progress(format!(
            "  conn/s VIP {:.0}, bare DNAT {:.0}, direct {:.0}, ratio {:.2} ({} failed connects)",
            r.vip,
            r.floor,
            r.direct,
            r.vip / r.direct,
            r.failed
        ));
        row.conn = Some(r);
    }
}

fn measure(mode: &str, shape: Shape, full_suite: bool, cfg: &Config) -> Row {
    let mut row = Row {
        mode: mode.into(),
        label: shape.label(),
        services: shape.services,
        endpoints: shape.endpoints,
        ..Default::default()
    };
    if mode == "iptables" && shape.endpoints == 10 {
        progress(format!(
            "iptables {}: full syncs beside kube-proxy's layout ({} rounds)",
            shape.label(),
            cfg.full_rounds
        ));
        row.side_by_side = row.record("side by side", side_by_side(shape, cfg));
        if !cfg.steps {
            return row;
        }
    }
    backend_steps(&mut row, mode, shape, full_suite, cfg);
    if full_suite && cfg.agent {
        progress(format!("{mode} {}: agent end to end", shape.label()));
        if let Some(a) = row.record("agent", agent(mode, shape, cfg)) {
            progress(format!(
                "  agent first sync {:.0} ms end to end ({:.0} ms in the backend), RSS {:.1} MiB, \
                 HWM {:.1} MiB, one-endpoint change {:.0} ms end to end",
                a.full_e2e_ms, a.full_logged_ms, a.rss_mib, a.hwm_mib, a.change_e2e_ms
            ));
            row.agent = Some(a);
        }
    }
    row
}

// ---------------------------------------------------------------------------------------------
// Output

/// A figure, or why there is none: "failed" when the row recorded errors, "—" when the part
/// was not measured for this row (the big case is backend-only).
fn cell(v: Option<f64>, decimals: usize, missing: &str) -> String {
    v.filter(|v| v.is_finite())
        .map(|v| format!("{v:.decimals$}"))
        .unwrap_or_else(|| missing.into())
}

fn table(rows: &[Row], mode: &str) -> String {
    let mut out = format!(
        "\n### {mode}\n\n| services × endpoints | full sync ms | one-endpoint median ms | p90 ms \
         | agent e2e full sync ms | agent 1-ep change e2e ms | agent RSS MiB (HWM) \
         | conn/s VIP | conn/s bare DNAT | conn/s direct | VIP / direct | bare DNAT / direct |\n|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n"
    );
    for r in rows.iter().filter(|r| r.mode == mode) {
        let c = r.churn.as_ref();
        let a = r.agent.as_ref();
        let k = r.conn.as_ref();
        let m = if r.errors.is_empty() { "—" } else { "failed" };
        let rss = a.map(|a| format!("{:.1} ({:.1})", a.rss_mib, a.hwm_mib));
        let _ = writeln!(
            out,
            "| {} × {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} |",
            r.services,
            r.endpoints,
            cell(r.full_ms, 0, m),
            cell(c.map(|c| c.median_ms), 2, m),
            cell(c.map(|c| c.p90_ms), 2, m),
            cell(a.map(|a| a.full_e2e_ms), 0, m),
            cell(a.map(|a| a.change_e2e_ms), 0, m),
            rss.unwrap_or_else(|| m.into()),
            cell(k.map(|k| k.vip), 0, m),
            cell(k.map(|k| k.floor), 0, m),
            cell(k.map(|k| k.direct), 0, m),
            cell(k.map(|k| k.vip / k.direct), 2, m),
            cell(k.map(|k| k.floor / k.direct), 2, m),
        );
    }
    for r in rows.iter().filter(|r| r.mode == mode) {
        for e in &r.errors {
            let _ = writeln!(out, "\n* {}: {e}", r.label);
        }
    }
    out
}

fn side_by_side_table(rows: &[Row]) -> String {
    let mut out = String::from(
        "\n### iptables beside kube-proxy's layout (medians: wall ms / CPU ms; ratio of CPU \
         times, weir / kube-proxy --noflush; one-endpoint: medians of every change)\n\n\
         | services × endpoints | weir first | kube-proxy first | ratio | kube-proxy first, flushing \
         | weir one-endpoint | kube-proxy one-endpoint | ratio | weir restart resync \
         | kube-proxy resync | ratio | kube-proxy resync, flushing | load avg |\n\
         |---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|\n",
    );
    let c = |v: Option<Cost>| {
        v.map_or("not run".into(), |c| {
            format!("{:.0} / {:.0}", c.wall, c.cpu)
        })
    };
    let ratio = |w: Cost, k: Option<Cost>| cell(k.map(|k| w.cpu / k.cpu), 2, "—");
    for r in rows {
        if let Some(s) = &r.side_by_side {
            let _ = writeln!(
                out,
                "| {} × {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {:.1}–{:.1} |",
                r.services,
                r.endpoints,
                c(Some(s.weir_first)),
                c(s.kube_first),
                ratio(s.weir_first, s.kube_first),
                c(Some(s.kube_flush_first)),
                c(Some(s.weir_one)),
                c(s.kube_one),
                ratio(s.weir_one, s.kube_one),
                c(Some(s.weir_resync)),
                c(s.kube_resync),
                ratio(s.weir_resync, s.kube_resync),
                c(Some(s.kube_flush_resync)),
                s.load.0,
                s.load.1,
            );
        }
    }
    out
}

fn cost_json(c: Option<Cost>) -> Value {
    c.map_or(
        Value::Null,
        |c| json!({ "wall_ms": c.wall, "cpu_ms": c.cpu }),
    )
}

fn row_json(r: &Row) -> Value {
    json!({
        "mode": r.mode,
        "services": r.services,
        "endpoints_per_service": r.endpoints,
        "full_sync_ms": r.full_ms,
        "side_by_side": r.side_by_side.as_ref().map(|s| json!({
            "weir_first": cost_json(Some(s.weir_first)),
            "kube_proxy_first": cost_json(s.kube_first),
            "weir_one_endpoint": cost_json(Some(s.weir_one)),
            "kube_proxy_one_endpoint": cost_json(s.kube_one),
            "one_endpoint_changes": s.one_changes,
            "weir_restart_resync": cost_json(Some(s.weir_resync)),
            "kube_proxy_resync": cost_json(s.kube_resync),
            "kube_proxy_flushing_first": cost_json(Some(s.kube_flush_first)),
            "kube_proxy_flushing_resync": cost_json(Some(s.kube_flush_resync)),
            "load_average": [s.load.0, s.load.1],
        })),
        "one_endpoint": r.churn.as_ref().map(|c| json!({
            "median_ms": c.median_ms, "p90_ms": c.p90_ms,
            "plan_diff_median_ms": c.diff_median_ms, "plan_clone_median_ms": c.clone_median_ms,
            "not_partial": c.unexpected,
        })),
        "connections_per_s": r.conn.as_ref().map(|k| json!({
            "vip": k.vip, "bare_dnat": k.floor, "direct": k.direct, "ratio": k.vip / k.direct,
            "bare_dnat_ratio": k.floor / k.direct, "failed_connects": k.failed,
        })),
        "agent": r.agent.as_ref().map(|a| json!({
            "full_sync_e2e_ms": a.full_e2e_ms, "full_sync_logged_ms": a.full_logged_ms,
            "rss_mib": a.rss_mib, "hwm_mib": a.hwm_mib,
            "one_endpoint_change_e2e_ms": a.change_e2e_ms,
        })),
        "errors": r.errors,
    })
}

fn main() {
    // `cargo bench` passes --bench; `cargo test --all-targets` runs this binary without it,
    // and a multi-minute benchmark has no place in the test suite.
    if !std::env::args().any(|a| a == "--bench") {
        return;
    }
    // RUST_LOG=info shows what the backends log, such as each full sync's phases.
    if std::env::var_os("RUST_LOG").is_some() {
        tracing_subscriber::fmt()
            .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
            .with_writer(std::io::stderr)
            .init();
    }
    let cfg = Config::from_env();
    if !nix_is_root() {
        eprintln!("scale bench: needs root (network namespaces); skipping");
        return;
    }
    // Only the agent runs read manifests: without them the check has nothing to protect.
    if cfg.agent {
        if let Err(e) = check_plan_matches_planner() {
            panic!("the bench would measure different rules in the agent and the backends: {e}");
        }
    }
    progress(format!(
        "sizes {:?}, modes {:?}, big case {}, agent {}",
        cfg.sizes,
        cfg.modes,
        cfg.big,
        cfg.weir_bin.display()
    ));
    let mut rows = Vec::new();
    for mode in &cfg.modes {
        for &n in &cfg.sizes {
            let shape = Shape {
                services: n,
                endpoints: 10,
            };
            rows.push(measure(mode, shape, true, &cfg));
        }
        if cfg.big && mode == "nftables" {
            let shape = Shape {
                services: 5000,
                endpoints: 50,
            };
            rows.push(measure(mode, shape, false, &cfg));
        }
    }
    let doc = json!({ "rows": rows.iter().map(row_json).collect::<Vec<_>>() });
    if let Some(p) = &cfg.json_path {
        std::fs::write(p, serde_json::to_string_pretty(&doc).unwrap())
            .expect("write WEIR_BENCH_JSON");
    }
    if cfg.json_stdout {
        println!("{}", serde_json::to_string_pretty(&doc).unwrap());
    } else {
        for mode in &cfg.modes {
            print!("{}", table(&rows, mode));
        }
        if rows.iter().any(|r| r.side_by_side.is_some()) {
            print!("{}", side_by_side_table(&rows));
        }
    }
}

fn nix_is_root() -> bool {
    // SAFETY: geteuid(2) cannot fail.
    unsafe { libc::geteuid() == 0 }
}
