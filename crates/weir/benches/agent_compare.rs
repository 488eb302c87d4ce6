//! One `weir agent` against the separate `weir proxy`, `weir routes` and `weir policy`
//! (issue 31.2), on weir's fake Kubernetes API server holding a cluster at a node's realistic
//! share: every run is a fresh API server and a fresh node, and reports
//! * the list and watch requests opened per kind (the API server's own request log),
//! * bytes the node received from the API server: during the first sync and over a churn
//!   period (endpoint changes and pod label changes at a steady rate), counted as rx bytes of
//!   the node's end of the veth between the API server's namespace and the node's,
//! * RSS (and its anonymous part) of each process after the first sync and after the churn,
//!   and the CPU time each spent during the churn.
//!
//! ```sh
//! cargo build --release -p weir && cargo bench -p weir --bench agent_compare
//! ```
//!
//! Environment: `WEIR_BENCH_SERVICES` (default 10000; each with one EndpointSlice of 10
//! endpoints, the pods' IPs), `WEIR_BENCH_NODES` (100), `WEIR_BENCH_NAMESPACES` (1000),
//! `WEIR_BENCH_PODS` (10000, spread over the nodes and namespaces), `WEIR_BENCH_POLICIES`
//! (1000, one per namespace while they last), `WEIR_BENCH_CHURN_SECONDS` (120; the issue's 10
//! minutes: 600), `WEIR_BENCH_ENDPOINT_RATE` and `WEIR_BENCH_POD_RATE` (changes per second,
//! default 10 and 5), `WEIR_BENCH_RUNS` (starts of each side, interleaved, default 1),
//! `WEIR_BIN` (default `target/release/weir`), `WEIR_BENCH_SYNC_TIMEOUT` (seconds, 600).
//!
//! Root only. No figure is asserted: it prints medians and ends with one summary line.

use std::collections::BTreeMap;
use std::fs::File;
use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::thread;
use std::time::{Duration, Instant};

use serde_json::{json, Value};
use weir_fakeapi::FakeApi;
use weir_testkit::{KillOnDrop, Netns, TempDir};

fn progress(msg: impl AsRef<str>) {
    eprintln!("[agent-compare] {}", msg.as_ref());
}

fn env_num(name: &str, default: usize) -> usize {
    std::env::var(name).map_or(default, |v| {
        v.parse()
            .unwrap_or_else(|_| panic!("{name} must be a number"))
    })
}

// ---------------------------------------------------------------------------------------------
// The generated cluster

const ENDPOINTS: usize = 10;
const API_IP: Ipv4Addr = Ipv4Addr::new(172, 30, 0, 1);
const NODE_IP: Ipv4Addr = Ipv4Addr::new(172, 30, 0, 10);
const NODE: &str = "node-0000";
const CLUSTER_CIDR: &str = "10.128.0.0/9";

#[derive(Clone, Copy)]
struct Sizes {
    services: usize,
    nodes: usize,
    namespaces: usize,
    pods: usize,
    policies: usize,
}

impl Sizes {
    fn from_env() -> Sizes {
        Sizes {
            services: env_num("WEIR_BENCH_SERVICES", 10_000),
            nodes: env_num("WEIR_BENCH_NODES", 100).max(1),
            namespaces: env_num("WEIR_BENCH_NAMESPACES", 1_000).max(1),
            pods: env_num("WEIR_BENCH_PODS", 10_000).max(1),
            policies: env_num("WEIR_BENCH_POLICIES", 1_000),
        }
    }
}

fn add(base: Ipv4Addr, offset: usize) -> Ipv4Addr {
    Ipv4Addr::from(u32::from(base) + offset as u32)
}

/// Node 0 is this node; the others are on the same underlay, so host-gw routes are on-link.
fn node_ip(i: usize) -> Ipv4Addr {
    match i {
        0 => NODE_IP,
        _ => add(Ipv4Addr::new(172, 30, 1, 0), i),
    }
}

/// Node i's pod CIDR, 10.128.0.0/24 onwards (inside [`CLUSTER_CIDR`]).
fn pod_ip(node: usize, k: usize) -> Ipv4Addr {
    add(Ipv4Addr::new(10, 128, 0, 0), node * 256 + 2 + k)
}

fn pod_node(p: usize, s: &Sizes) -> usize {
    p % s.nodes
}

/// Pod p is the (p / nodes)-th pod of its node.
fn pod_addr(p: usize, s: &Sizes) -> Ipv4Addr {
    pod_ip(pod_node(p, s), (p / s.nodes) % 250)
}

fn node_json(i: usize) -> Value {
    json!({"kind": "Node", "metadata": {"name": format!("node-{i:04}")},
           "spec": {"podCIDR": format!("{}/24", add(Ipv4Addr::new(10, 128, 0, 0), i * 256))},
           "status": {"addresses": [{"type": "InternalIP", "address": node_ip(i).to_string()}]}})
}

fn namespace_json(n: usize) -> Value {
    let name = format!("ns-{n:04}");
    json!({"kind": "Namespace", "metadata": {"name": name, "labels": {"name": name}}})
}

/// Pod p: namespace p mod namespaces, node p mod nodes; `rev` is the label the churn changes.
fn pod_json(p: usize, s: &Sizes, rev: usize) -> Value {
    let ip = pod_addr(p, s).to_string();
    json!({"kind": "Pod",
           "metadata": {"name": format!("pod-{p:05}"), "namespace": format!("ns-{:04}", p % s.namespaces),
                        "labels": {"app": format!("a{}", p % 10), "rev": format!("r{rev}")}},
           "spec": {"nodeName": format!("node-{:04}", pod_node(p, s)),
                    "containers": [{"name": "c", "ports": [{"name": "http", "containerPort": 8080}]}]},
           "status": {"phase": "Running", "podIP": ip, "podIPs": [{"ip": ip}]}})
}

/// Policy k in namespace k: pods `app=a<k mod 10>` take port 8080 from `app=a0` in namespaces
/// labelled like theirs.
fn policy_json(k: usize, s: &Sizes) -> Value {
    let ns = format!("ns-{:04}", k % s.namespaces);
    json!({"kind": "NetworkPolicy",
           "metadata": {"name": format!("np-{k:04}"), "namespace": ns},
           "spec": {"podSelector": {"matchLabels": {"app": format!("a{}", k % 10)}},
                    "policyTypes": ["Ingress"],
                    "ingress": [{"from": [{"namespaceSelector": {"matchLabels": {"name": ns}},
                                           "podSelector": {"matchLabels": {"app": "a0"}}}],
                                 "ports": [{"protocol": "TCP", "port": 8080}]}]}})
}

fn service_json(i: usize, s: &Sizes) -> Value {
    let mut port = json!({"port": 80, "targetPort": 8080, "protocol": "TCP"});
    let ty = if i.is_multiple_of(10) && i / 10 < 2768 {
        port["nodePort"] = (30000 + i / 10).into();
        "NodePort"
    } else {
        "ClusterIP"
    };
    json!({"kind": "Service",
           "metadata": {"name": format!("svc-{i:05}"), "namespace": format!("ns-{:04}", i % s.namespaces)},
           "spec": {"type": ty, "clusterIP": add(Ipv4Addr::new(10, 96, 0, 1), i).to_string(),
                    "ports": [port]}})
}

/// Service i's slice: 10 of the pods' IPs; `fresh` replaces the first (the churn's change).
fn slice_json(i: usize, s: &Sizes, fresh: Option<usize>) -> Value {
    let eps: Vec<Value> = (0..ENDPOINTS)
        .map(|e| {
            let p = (i * ENDPOINTS + e) % s.pods;
            let ip = match (e, fresh) {
                (0, Some(k)) => add(Ipv4Addr::new(10, 250, 0, 1), k),
                _ => pod_addr(p, s),
            };
            json!({"addresses": [ip.to_string()], "conditions": {"ready": true},
                   "nodeName": format!("node-{:04}", pod_node(p, s))})
        })
        .collect();
    let name = format!("svc-{i:05}");
    json!({"kind": "EndpointSlice",
           "metadata": {"name": format!("{name}-1"), "namespace": format!("ns-{:04}", i % s.namespaces),
                        "labels": {"kubernetes.io/service-name": name}},
           "addressType": "IPv4",
           "ports": [{"name": "", "port": 8080, "protocol": "TCP"}],
           "endpoints": eps})
}

fn apply(api: &FakeApi, v: Value) -> Result<(), String> {
    use weir_model::k8s_openapi::api::core::v1::{Namespace, Node, Pod, Service};
    use weir_model::k8s_openapi::api::discovery::v1::EndpointSlice;
    use weir_model::k8s_openapi::api::networking::v1::NetworkPolicy;
    fn typed<K: serde::de::DeserializeOwned>(v: Value) -> Result<K, String> {
        serde_json::from_value(v).map_err(|e| e.to_string())
    }
    let r = match v["kind"].as_str() {
        Some("Service") => api.apply(&typed::<Service>(v)?),
        Some("EndpointSlice") => api.apply(&typed::<EndpointSlice>(v)?),
        Some("Node") => api.apply(&typed::<Node>(v)?),
        Some("Namespace") => api.apply(&typed::<Namespace>(v)?),
        Some("Pod") => api.apply(&typed::<Pod>(v)?),
        _ => api.apply(&typed::<NetworkPolicy>(v)?),
    };
    r.map_err(|e| format!("{e:#}"))
}

fn load(api: &FakeApi, s: &Sizes) -> Result<(), String> {
    for i in 0..s.nodes {
        apply(api, node_json(i))?;
    }
    for n in 0..s.namespaces {
        apply(api, namespace_json(n))?;
    }
    for p in 0..s.pods {
        apply(api, pod_json(p, s, 0))?;
    }
    for k in 0..s.policies {
        apply(api, policy_json(k, s))?;
    }
    for i in 0..s.services {
        apply(api, service_json(i, s))?;
        apply(api, slice_json(i, s, None))?;
    }
    // Watches start from the lists: the creation history is not needed.
    api.compact();
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// The node and its API server

static COUNTER: AtomicUsize = AtomicUsize::new(0);

/// Two namespaces joined by a veth: the API server's (172.30.0.1) and the node's
/// (172.30.0.10, `api0`, whose rx bytes are what the node received from the API server).
struct Bed {
    api: FakeApi,
    node: Netns,
    _api_ns: Netns,
    dir: TempDir,
}

impl Bed {
    fn new(s: &Sizes) -> Result<Bed, String> {
        let tag = format!(
            "{}-{}",
            std::process::id(),
            COUNTER.fetch_add(1, Ordering::Relaxed)
        );
        let api_ns = Netns::create(format!("wac-api-{tag}"))?;
        let node = Netns::create(format!("wac-node-{tag}"))?;
        node.ip(&[
            "link",
            "add",
            "api0",
            "type",
            "veth",
            "peer",
            "name",
            "node0",
            "netns",
            &api_ns.name,
        ])?;
        node.ip(&["addr", "add", &format!("{NODE_IP}/16"), "dev", "api0"])?;
        node.ip(&["link", "set", "api0", "up"])?;
        api_ns.ip(&["addr", "add", &format!("{API_IP}/16"), "dev", "node0"])?;
        api_ns.ip(&["link", "set", "node0", "up"])?;
        let api = FakeApi::start(
            Some(&api_ns.name),
            format!("{API_IP}:6443").parse().unwrap(),
        )
        .map_err(|e| format!("fake API server: {e:#}"))?;
        load(&api, s)?;
        let dir = TempDir::new(&format!("wac-{tag}"))?;
        Ok(Bed {
            api,
            node,
            _api_ns: api_ns,
            dir,
        })
    }

    fn rx_bytes(&self) -> Result<u64, String> {
        let out = Command::new("ip")
            .args(["netns", "exec", &self.node.name, "cat"])
            .arg("/sys/class/net/api0/statistics/rx_bytes")
            .output()
            .map_err(|e| e.to_string())?;
        String::from_utf8_lossy(&out.stdout)
            .trim()
            .parse()
            .map_err(|e| format!("rx_bytes: {e}"))
    }

    /// Node routes' routes in the node (protocol 87).
    fn routes(&self) -> usize {
        Command::new("ip")
            .args(["-n", &self.node.name, "route", "show", "proto", "87"])
            .output()
            .map_or(0, |o| String::from_utf8_lossy(&o.stdout).lines().count())
    }
}

// ---------------------------------------------------------------------------------------------
// The two sides

#[derive(Clone, Copy, PartialEq)]
enum Side {
    Separate,
    Agent,
}

impl Side {
    fn name(self) -> &'static str {
        match self {
            Side::Separate => "separate",
            Side::Agent => "agent",
        }
    }
}

/// The command lines: (name, arguments after `weir`). Flags as scripts/cluster/up.sh gives
/// them, with every path in the run's own directory.
fn commands(side: Side, dir: &Path) -> Vec<(&'static str, Vec<String>)> {
    let master = format!("--master=http://{API_IP}:6443");
    let p = |f: &str| dir.join(f).display().to_string();
    let proxy = vec![
        master.clone(),
        "--proxy-mode=nftables".into(),
        format!("--cluster-cidr={CLUSTER_CIDR}"),
        format!("--hostname-override={NODE}"),
        format!("--state-dir={}", p("state")),
    ];
    let routes = vec![
        "--backend=host-gw".into(),
        format!("--mtu-file={}", p("mtu")),
        format!("--status={}", p("routes-status.json")),
    ];
    match side {
        Side::Agent => vec![("agent", [vec!["agent".into()], proxy, routes].concat())],
        Side::Separate => vec![
            ("proxy", [vec!["proxy".into()], proxy].concat()),
            (
                "routes",
                [
                    vec![
                        "routes".into(),
                        master.clone(),
                        format!("--node-name={NODE}"),
                    ],
                    routes,
                ]
                .concat(),
            ),
            (
                "policy",
                vec!["policy".into(), master, format!("--node-name={NODE}")],
            ),
        ],
    }
}

struct Proc {
    name: &'static str,
    child: KillOnDrop,
    log: PathBuf,
}

fn spawn(bin: &Path, bed: &Bed, side: Side) -> Result<Vec<Proc>, String> {
    let mut procs = Vec::new();
    for (name, args) in commands(side, bed.dir.path()) {
        let log = bed.dir.path().join(format!("{name}.log"));
        let file = File::create(&log).map_err(|e| e.to_string())?;
        let child = Command::new("ip")
            .args(["netns", "exec", &bed.node.name])
            .arg(bin)
            .args(&args)
            .env("RUST_LOG", "info")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(file)
            .spawn()
            .map_err(|e| format!("spawn weir {name}: {e}"))?;
        procs.push(Proc {
            name,
            child: KillOnDrop(child),
            log,
        });
    }
    Ok(procs)
}

/// Every part has synced once: the proxy's and policy's first "synced" lines, and a route to
/// every other node's pods.
fn synced(bed: &Bed, procs: &mut [Proc], nodes: usize) -> Result<bool, String> {
    let mut logs = String::new();
    for p in procs.iter_mut() {
        let text = std::fs::read_to_string(&p.log).unwrap_or_default();
        if let Ok(Some(status)) = p.child.0.try_wait() {
            return Err(format!("weir {} exited ({status}): {text}", p.name));
        }
        logs.push_str(&text);
    }
    let proxy = logs
        .lines()
        .any(|l| l.contains(" synced") && !l.contains("policy: synced"));
    let policy = logs.contains("policy: synced");
    Ok(proxy && policy && bed.routes() + 1 >= nodes)
}

// ---------------------------------------------------------------------------------------------
// Figures

/// (VmRSS, RssAnon) in MiB, and CPU seconds (user + system).
fn memory_cpu(pid: u32) -> Result<(f64, f64, f64), String> {
    let status =
        std::fs::read_to_string(format!("/proc/{pid}/status")).map_err(|e| e.to_string())?;
    let kib = |name: &str| -> f64 {
        status
            .lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
            .unwrap_or(f64::NAN)
    };
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).map_err(|e| e.to_string())?;
    // Fields after the command name's closing parenthesis: utime and stime are 12th and 13th.
    let after = stat.rsplit_once(')').map_or("", |(_, r)| r);
    let f: Vec<f64> = after
        .split_whitespace()
        .map(|x| x.parse().unwrap_or(0.0))
        .collect();
    let ticks = (f.get(11).unwrap_or(&0.0) + f.get(12).unwrap_or(&0.0)) / 100.0;
    Ok((kib("VmRSS:") / 1024.0, kib("RssAnon:") / 1024.0, ticks))
}

/// List and watch requests per kind (the collection's last path segment).
fn requests(api: &FakeApi) -> BTreeMap<String, (usize, usize)> {
    let mut per = BTreeMap::new();
    for r in api.requests() {
        let Some(uri) = r.strip_prefix("GET ") else {
            continue;
        };
        let (path, query) = uri.split_once('?').unwrap_or((uri, ""));
        let kind = path.rsplit('/').next().unwrap_or("").to_string();
        let kinds = [
            "services",
            "endpointslices",
            "nodes",
            "namespaces",
            "pods",
            "networkpolicies",
        ];
        if !kinds.contains(&kind.as_str()) {
            continue;
        }
        let e = per.entry(kind).or_insert((0, 0));
        if query.contains("watch=true") || query.contains("watch=1") {
            e.1 += 1;
        } else {
            e.0 += 1;
        }
    }
    per
}

fn totals(per: &BTreeMap<String, (usize, usize)>) -> (usize, usize) {
    per.values().fold((0, 0), |(l, w), (a, b)| (l + a, w + b))
}

/// Name, RSS and RssAnon after the first sync, after the churn (MiB), CPU s during the churn.
type ProcFigures = (&'static str, f64, f64, f64, f64, f64);

#[derive(Default, Clone)]
struct Run {
    sync_s: f64,
    sync_bytes: u64,
    churn_bytes: u64,
    churn_s: f64,
    /// At the first sync: (lists, watches); over the whole run.
    at_sync: (usize, usize),
    whole: (usize, usize),
    per_kind: BTreeMap<String, (usize, usize)>,
    /// Per process: name, RSS and RssAnon after sync, after churn, CPU seconds during churn.
    procs: Vec<ProcFigures>,
}

impl Run {
    fn rss(&self, after_churn: bool) -> f64 {
        self.procs
            .iter()
            .map(|p| if after_churn { p.3 } else { p.1 })
            .sum()
    }
    fn cpu(&self) -> f64 {
        self.procs.iter().map(|p| p.5).sum()
    }
}

// ---------------------------------------------------------------------------------------------
// Churn

/// Endpoint changes and pod label changes, evenly spaced, for `seconds`; returns how many of
/// each were made.
fn churn(api: &FakeApi, s: &Sizes, seconds: u64, round: usize) -> Result<(usize, usize), String> {
    let (e_rate, p_rate) = (
        env_num("WEIR_BENCH_ENDPOINT_RATE", 10),
        env_num("WEIR_BENCH_POD_RATE", 5),
    );
    let total = (e_rate + p_rate).max(1);
    let spacing = Duration::from_secs_f64(1.0 / total as f64);
    let start = Instant::now();
    let end = start + Duration::from_secs(seconds);
    let (mut eps, mut pods) = (0, 0);
    for k in 0.. {
        let at = start + spacing * k as u32;
        if at >= end {
            break;
        }
        thread::sleep(at.saturating_duration_since(Instant::now()));
        if k % total < e_rate {
            // A prime stride spreads the changes over the services.
            let svc = (eps * 7919) % s.services.max(1);
            apply(api, slice_json(svc, s, Some(eps)))?;
            eps += 1;
        } else {
            let pod = (pods * 104_729) % s.pods;
            apply(api, pod_json(pod, s, round * 1_000_000 + pods + 1))?;
            pods += 1;
        }
    }
    Ok((eps, pods))
}

fn run_side(bin: &Path, s: &Sizes, side: Side, churn_s: u64, round: usize) -> Result<Run, String> {
    progress(format!("{}: loading the fake API server", side.name()));
    let bed = Bed::new(s)?;
    let timeout = Duration::from_secs(env_num("WEIR_BENCH_SYNC_TIMEOUT", 600) as u64);
    let rx0 = bed.rx_bytes()?;
    let start = Instant::now();
    let mut procs = spawn(bin, &bed, side)?;
    while !synced(&bed, &mut procs, s.nodes)? {
        if start.elapsed() > timeout {
            return Err(format!("{}: no first sync within {timeout:?}", side.name()));
        }
        thread::sleep(Duration::from_millis(200));
    }
    let mut run = Run {
        sync_s: start.elapsed().as_secs_f64(),
        ..Run::default()
    };
    // Let the watches open after the lists (a watch follows its list's completion).
    thread::sleep(Duration::from_secs(2));
    let rx1 = bed.rx_bytes()?;
    run.sync_bytes = rx1 - rx0;
    run.at_sync = totals(&requests(&bed.api));
    let first: Vec<_> = procs
        .iter()
        .map(|p| memory_cpu(p.child.0.id()))
        .collect::<Result<_, _>>()?;
    progress(format!(
        "{}: synced in {:.1} s, {:.1} MiB received; churn for {churn_s} s",
        side.name(),
        run.sync_s,
        run.sync_bytes as f64 / 1048576.0
    ));
    let t = Instant::now();
    let (eps, pods) = churn(&bed.api, s, churn_s, round)?;
    // The last changes' events are on their way: let them arrive.
    thread::sleep(Duration::from_secs(2));
    run.churn_s = t.elapsed().as_secs_f64();
    run.churn_bytes = bed.rx_bytes()? - rx1;
    for (p, (rss, anon, cpu)) in procs.iter_mut().zip(first) {
        if let Ok(Some(status)) = p.child.0.try_wait() {
            return Err(format!(
                "weir {} exited during the churn ({status})",
                p.name
            ));
        }
        let (rss2, anon2, cpu2) = memory_cpu(p.child.0.id())?;
        run.procs.push((p.name, rss, anon, rss2, anon2, cpu2 - cpu));
    }
    run.per_kind = requests(&bed.api);
    run.whole = totals(&run.per_kind);
    progress(format!(
        "{}: {eps} endpoint and {pods} pod changes, {:.2} MiB received",
        side.name(),
        run.churn_bytes as f64 / 1048576.0
    ));
    Ok(run)
}

// ---------------------------------------------------------------------------------------------
// Report

fn median(mut v: Vec<f64>) -> f64 {
    if v.is_empty() {
        return f64::NAN;
    }
    v.sort_by(f64::total_cmp);
    let n = v.len();
    if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    }
}

fn med(runs: &[Run], f: impl Fn(&Run) -> f64) -> f64 {
    median(runs.iter().map(f).collect())
}

fn report_side(side: Side, runs: &[Run]) {
    let last = runs.last().expect("a run");
    println!("\n## {} ({} run(s), medians)\n", side.name(), runs.len());
    println!("| kind | lists | watches |\n| --- | ---: | ---: |");
    for (kind, (l, w)) in &last.per_kind {
        println!("| {kind} | {l} | {w} |");
    }
    println!(
        "\nrequests at the first sync: lists {} watches {}; over the whole run: lists {} watches {}",
        last.at_sync.0, last.at_sync.1, last.whole.0, last.whole.1
    );
    println!(
        "\n| process | RSS after sync MiB | anon | RSS after churn MiB | anon | CPU s in churn |"
    );
    println!("| --- | ---: | ---: | ---: | ---: | ---: |");
    for (i, p) in last.procs.iter().enumerate() {
        let m = |f: fn(&ProcFigures) -> f64| med(runs, |r| f(&r.procs[i]));
        println!(
            "| {} | {:.1} | {:.1} | {:.1} | {:.1} | {:.1} |",
            p.0,
            m(|p| p.1),
            m(|p| p.2),
            m(|p| p.3),
            m(|p| p.4),
            m(|p| p.5)
        );
    }
    let churn_s = med(runs, |r| r.churn_s);
    println!(
        "\nfirst sync {:.1} s, {:.2} MiB received; churn {:.0} s: {:.2} MiB received ({:.0} B/s)",
        med(runs, |r| r.sync_s),
        med(runs, |r| r.sync_bytes as f64) / 1048576.0,
        churn_s,
        med(runs, |r| r.churn_bytes as f64) / 1048576.0,
        med(runs, |r| r.churn_bytes as f64 / r.churn_s),
    );
}

fn main() {
    // `cargo bench` passes --bench; `cargo test --all-targets` runs this binary without it,
    // and a minutes-long comparison has no place in the test suite.
    if !std::env::args().any(|a| a == "--bench") {
        return;
    }
    if !weir_testkit::can_run(weir_testkit::missing(true, &["ip", "nft"])) {
        return;
    }
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let bin =
        std::env::var("WEIR_BIN").map_or_else(|_| root.join("target/release/weir"), PathBuf::from);
    assert!(
        bin.exists(),
        "{} missing: cargo build --release -p weir",
        bin.display()
    );
    let s = Sizes::from_env();
    let churn_s = env_num("WEIR_BENCH_CHURN_SECONDS", 120) as u64;
    let runs = env_num("WEIR_BENCH_RUNS", 1).max(1);
    println!(
        "# weir agent vs weir proxy + routes + policy: {} Services (+ slices x {ENDPOINTS}), {} Nodes, \
         {} Namespaces, {} Pods, {} NetworkPolicies; churn {churn_s} s at {}/s endpoint + {}/s pod label changes",
        s.services, s.nodes, s.namespaces, s.pods, s.policies,
        env_num("WEIR_BENCH_ENDPOINT_RATE", 10), env_num("WEIR_BENCH_POD_RATE", 5)
    );
    let (mut sep, mut one) = (Vec::new(), Vec::new());
    for round in 0..runs {
        for side in [Side::Separate, Side::Agent] {
            match run_side(&bin, &s, side, churn_s, round) {
                Ok(r) if side == Side::Agent => one.push(r),
                Ok(r) => sep.push(r),
                Err(e) => panic!("{}: {e}", side.name()),
            }
        }
    }
    report_side(Side::Separate, &sep);
    report_side(Side::Agent, &one);
    let rss_ratio = med(&one, |r| r.rss(true)) / med(&sep, |r| r.rss(true));
    let rss_sync_ratio = med(&one, |r| r.rss(false)) / med(&sep, |r| r.rss(false));
    let bytes_ratio = med(&one, |r| r.churn_bytes as f64 / r.churn_s)
        / med(&sep, |r| r.churn_bytes as f64 / r.churn_s);
    let sync_bytes_ratio = med(&one, |r| r.sync_bytes as f64) / med(&sep, |r| r.sync_bytes as f64);
    let cpu_ratio = med(&one, Run::cpu) / med(&sep, Run::cpu);
    println!(
        "\nagent watches={} separate_watches={} rss_ratio={rss_ratio:.2} rss_sync_ratio={rss_sync_ratio:.2} \
         bytes_ratio={bytes_ratio:.2} sync_bytes_ratio={sync_bytes_ratio:.2} churn_cpu_ratio={cpu_ratio:.2}",
        one.last().map_or(0, |r| r.at_sync.1),
        sep.last().map_or(0, |r| r.at_sync.1),
    );
}
