//! Node routes measured (root only; fresh network namespaces made for this run):
//!
//! * pod → pod across two nodes over vxlan and host-gw, and node → node on the underlay, side
//!   by side: throughput (iperf3, single TCP stream) and new TCP connections per second;
//! * convergence with 1,000 nodes present: the first sync, a node joining, a node leaving and
//!   a no-change resync (observe → desire → diff → apply, all of it), for both backends.
//!
//! ```sh
//! cargo bench -p weir-routes --bench routes
//! ```
//!
//! Environment: `WEIR_BENCH_NODES` (default 1000), `WEIR_BENCH_SECONDS` (iperf3 duration, 3),
//! `WEIR_BENCH_RUNS` (datapath rounds, medians taken, 5), `WEIR_BENCH_ROUNDS` (join/leave
//! rounds, 10). Pods get the MTU weir-cni gives them: 1500 on host-gw, the VTEP's 1450 on vxlan. The two "nodes" share one machine, so the
//! throughput figures compare encapsulation costs on this CPU, not a network.

use std::collections::BTreeMap;
use std::io::Read;
use std::net::{IpAddr, SocketAddr, TcpListener, TcpStream};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::{json, Value};
use weir_kernel::{NetNs, Rtnl};
use weir_model::k8s_openapi::api::core::v1::Node;
use weir_model::{Object, Snapshot};
use weir_routes::annotations::{Annotations, VtepData, DEFAULT_PREFIX};
use weir_routes::kernel::{cleanup, reconcile, Reconciled};
use weir_routes::{Backend, Config, VxlanConfig};

fn env(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn sh(cmd: &str) -> String {
    let out = Command::new("sh").args(["-ec", cmd]).output().unwrap();
    assert!(
        out.status.success(),
        "{cmd}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Namespaces deleted on drop.
struct Namespaces(Vec<String>);
impl Drop for Namespaces {
    fn drop(&mut self) {
        for ns in &self.0 {
            let _ = Command::new("ip").args(["netns", "del", ns]).status();
        }
    }
}

fn node(name: &str, cidr: &str, ip: &str, annotations: &BTreeMap<String, String>) -> Object {
    let n: Node = serde_json::from_value(json!({
        "metadata": {"name": name, "annotations": annotations},
        "spec": {"podCIDR": cidr, "podCIDRs": [cidr]},
        "status": {"addresses": [{"type": "InternalIP", "address": ip}]},
    }))
    .unwrap();
    n.into()
}

fn published(r: &Reconciled, backend: &Backend) -> BTreeMap<String, String> {
    let v = r.desired.vtep.as_ref();
    Annotations::new(DEFAULT_PREFIX).publish(
        backend.type_name(),
        v.map(|v| VtepData {
            vni: Some(1),
            mac: v.mac,
        })
        .as_ref(),
        v.map(|v| v.local),
    )
}

fn sync(ns: &str, name: &str, backend: &Backend, objects: &[Object]) -> Reconciled {
    let mut rtnl = Rtnl::in_netns(&NetNs::named(ns).unwrap()).unwrap();
    let r = reconcile(
        &mut rtnl,
        &Config::new(name, backend.clone()),
        &Snapshot::from_objects(objects),
        None,
    )
    .unwrap();
    assert!(r.failed.is_empty(), "{:?}", r.failed);
    r
}

// ---- pod → pod ----

struct Pair {
    _ns: Namespaces,
    tag: String,
}

impl Pair {
    fn ns(&self, what: &str) -> String {
        format!("{}-{what}", self.tag)
    }
}

/// Two nodes on one segment (10.91.0.1/.2), each with a pod 10.244.<i>.2 behind a veth (its
/// MTU set per backend before each measurement).
fn pair() -> Pair {
    let tag = format!("wrb{}", std::process::id());
    let names: Vec<String> = ["n1", "n2", "p1", "p2"]
        .iter()
        .map(|s| format!("{tag}-{s}"))
        .collect();
    let guard = Namespaces(Vec::new());
    let mut guard = guard;
    for n in &names {
        sh(&format!("ip netns add {n}"));
        guard.0.push(n.clone());
        sh(&format!(
            "ip netns exec {n} sysctl -qw net.ipv4.ip_forward=1; ip -n {n} link set lo up"
        ));
    }
    let (n1, n2) = (&names[0], &names[1]);
    sh(&format!(
        "ip -n {n1} link add eth0 type veth peer name eth0 netns {n2}
         ip -n {n1} addr add 10.91.0.1/24 dev eth0; ip -n {n1} link set eth0 up
         ip -n {n2} addr add 10.91.0.2/24 dev eth0; ip -n {n2} link set eth0 up"
    ));
    for i in [1, 2] {
        let (n, p) = (&names[i - 1], &names[i + 1]);
        sh(&format!(
            "ip -n {n} link add pod type veth peer name eth0 netns {p}
             ip -n {n} addr add 10.244.{i}.1/24 dev pod; ip -n {n} link set pod up
             ip -n {p} link set eth0 mtu 1450
             ip -n {p} addr add 10.244.{i}.2/24 dev eth0; ip -n {p} link set eth0 up
             ip -n {p} route add default via 10.244.{i}.1"
        ));
    }
    Pair { _ns: guard, tag }
}

fn bring_up(p: &Pair, backend: &Backend) {
    let bare = |i: u8, a: &BTreeMap<String, String>| {
        node(
            &format!("node{i}"),
            &format!("10.244.{i}.0/24"),
            &format!("10.91.0.{i}"),
            a,
        )
    };
    let objects = vec![bare(1, &BTreeMap::new()), bare(2, &BTreeMap::new())];
    let r1 = sync(&p.ns("n1"), "node1", backend, &objects);
    let r2 = sync(&p.ns("n2"), "node2", backend, &objects);
    let objects = vec![
        bare(1, &published(&r1, backend)),
        bare(2, &published(&r2, backend)),
    ];
    sync(&p.ns("n1"), "node1", backend, &objects);
    sync(&p.ns("n2"), "node2", backend, &objects);
}

fn tear_down(p: &Pair) {
    for n in ["n1", "n2"] {
        let mut rtnl = Rtnl::in_netns(&NetNs::named(&p.ns(n)).unwrap()).unwrap();
        cleanup(&mut rtnl).unwrap();
    }
}

/// iperf3 from `from` to `ip` in `to`: Gbit/s received.
fn iperf(from: &str, to: &str, ip: &str, seconds: u64) -> f64 {
    let mut server = Command::new("ip")
        .args(["netns", "exec", to, "iperf3", "-s", "-1", "-B", ip])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    std::thread::sleep(Duration::from_millis(300));
    let out = sh(&format!(
        "ip netns exec {from} iperf3 -c {ip} -t {seconds} -J"
    ));
    let _ = server.wait();
    let v: Value = serde_json::from_str(&out).unwrap();
    v["end"]["sum_received"]["bits_per_second"]
        .as_f64()
        .unwrap()
        / 1e9
}

/// New TCP connections per second from `from` to `ip` in `to` (connect, server accepts and
/// closes, client reads EOF), for one second.
fn connection_rate(from: &str, to: &str, ip: IpAddr) -> f64 {
    let listener = NetNs::named(to)
        .unwrap()
        .run(|| TcpListener::bind(SocketAddr::new(ip, 0)))
        .unwrap()
        .unwrap();
    let addr = listener.local_addr().unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    let stop2 = stop.clone();
    let server = std::thread::spawn(move || {
        for conn in listener.incoming() {
            if stop2.load(Ordering::SeqCst) {
                return;
            }
            drop(conn);
        }
    });
    let client_ns = NetNs::named(from).unwrap();
    let _inside = client_ns.enter().unwrap();
    let start = Instant::now();
    let mut n = 0u64;
    while start.elapsed() < Duration::from_secs(1) {
        let mut s = TcpStream::connect_timeout(&addr, Duration::from_secs(2)).unwrap();
        let mut buf = [0u8; 1];
        let _ = s.read(&mut buf);
        n += 1;
    }
    let rate = n as f64 / start.elapsed().as_secs_f64();
    stop.store(true, Ordering::SeqCst);
    let _ = TcpStream::connect(addr);
    server.join().unwrap();
    rate
}

/// The pod MTU weir-cni gives pods on each backend: the underlay's, or the VTEP's.
fn pod_mtu(backend: &Backend) -> u32 {
    match backend {
        Backend::HostGw => 1500,
        Backend::Vxlan(_) => 1450,
    }
}

/// One measurement of every path, in the same round so that load drifting on the shared
/// machine hits them alike: underlay node → node, then pod → pod over host-gw and vxlan.
fn datapath_round(p: &Pair, seconds: u64) -> Vec<(String, f64, f64)> {
    let mut out = Vec::new();
    let gbps = iperf(&p.ns("n1"), &p.ns("n2"), "10.91.0.2", seconds);
    let rate = connection_rate(&p.ns("n1"), &p.ns("n2"), "10.91.0.2".parse().unwrap());
    out.push(("underlay node → node".to_string(), gbps, rate));
    for backend in [Backend::HostGw, Backend::Vxlan(VxlanConfig::default())] {
        for pod in ["p1", "p2"] {
            sh(&format!(
                "ip -n {} link set eth0 mtu {}",
                p.ns(pod),
                pod_mtu(&backend)
            ));
        }
        bring_up(p, &backend);
        let gbps = iperf(&p.ns("p1"), &p.ns("p2"), "10.244.2.2", seconds);
        let rate = connection_rate(&p.ns("p1"), &p.ns("p2"), "10.244.2.2".parse().unwrap());
        out.push((format!("pod → pod, {}", backend.type_name()), gbps, rate));
        tear_down(p);
    }
    out
}

/// `WEIR_BENCH_RUNS` rounds of [`datapath_round`]: per path every sample, the medians and the
/// medians' ratio to the underlay's.
fn datapath() -> Value {
    let seconds = env("WEIR_BENCH_SECONDS", 3);
    let runs = env("WEIR_BENCH_RUNS", 5).max(1);
    let p = pair();
    let mut samples: BTreeMap<String, (Vec<f64>, Vec<f64>)> = BTreeMap::new();
    let mut order = Vec::new();
    for round in 0..runs {
        for (path, gbps, rate) in datapath_round(&p, seconds) {
            eprintln!("round {round}: {path}: {gbps:.2} Gbit/s, {rate:.0} conn/s");
            if !order.contains(&path) {
                order.push(path.clone());
            }
            let e = samples.entry(path).or_default();
            e.0.push(gbps);
            e.1.push(rate);
        }
    }
    let base = &samples[&order[0]];
    let (base_gbps, base_rate) = (median(base.0.clone()), median(base.1.clone()));
    let rows = order
        .iter()
        .map(|path| {
            let (g, r) = &samples[path];
            let (mg, mr) = (median(g.clone()), median(r.clone()));
            json!({
                "path": path, "runs": runs,
                "gbps_median": mg, "conn_per_s_median": mr,
                "gbps_vs_underlay": mg / base_gbps, "conn_vs_underlay": mr / base_rate,
                "gbps_samples": g, "conn_per_s_samples": r,
            })
        })
        .collect();
    Value::Array(rows)
}

// ---- convergence ----

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.partial_cmp(b).unwrap());
    v[v.len() / 2]
}

/// Remote node k: pod CIDR 10.(128+k/256).(k%256).0/24, underlay 10.90.(k/250).(k%250+2), a
/// made-up VTEP MAC.
fn remote(k: u32) -> Object {
    let mac = format!("02:00:00:00:{:02x}:{:02x}", k >> 8, k & 0xff);
    let annotations: BTreeMap<String, String> = [
        ("weir.dev/backend-type".to_string(), "vxlan".to_string()),
        (
            "weir.dev/backend-data".to_string(),
            format!(r#"{{"VNI":1,"VtepMAC":"{mac}"}}"#),
        ),
    ]
    .into();
    node(
        &format!("remote{k}"),
        &format!("10.{}.{}.0/24", 128 + k / 256, k % 256),
        &format!("10.90.{}.{}", k / 250, k % 250 + 2),
        &annotations,
    )
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

fn converge(backend: &Backend, nodes: u32, rounds: u64) -> Value {
    let ns = format!("wrb{}-c", std::process::id());
    sh(&format!("ip netns add {ns}"));
    let _guard = Namespaces(vec![ns.clone()]);
    sh(&format!(
        "ip -n {ns} link add eth0 type veth peer name peer
         ip -n {ns} addr add 10.90.0.1/16 dev eth0
         ip -n {ns} link set eth0 up; ip -n {ns} link set peer up"
    ));
    let me = node("me", "10.127.0.0/24", "10.90.0.1", &BTreeMap::new());
    let mut objects: Vec<Object> = vec![me];
    objects.extend((1..=nodes).map(remote));
    let timed = |objects: &[Object]| {
        let t = Instant::now();
        let r = sync(&ns, "me", backend, objects);
        (t.elapsed(), r.applied.len())
    };
    let (first, first_ops) = timed(&objects);
    let (noop, noop_ops) = timed(&objects);
    assert_eq!(noop_ops, 0);
    let mut joins = Vec::new();
    let mut leaves = Vec::new();
    let mut join_ops = 0;
    for _ in 0..rounds {
        objects.push(remote(nodes + 1));
        let (t, n) = timed(&objects);
        joins.push(ms(t));
        join_ops = n;
        objects.pop();
        leaves.push(ms(timed(&objects).0));
    }
    json!({
        "backend": backend.type_name(), "nodes": nodes,
        "first_sync_ms": ms(first), "first_sync_ops": first_ops,
        "noop_resync_ms": ms(noop),
        "join_ms_median": median(joins), "join_ops": join_ops,
        "leave_ms_median": median(leaves),
    })
}

fn main() {
    // SAFETY: getuid cannot fail.
    if unsafe { libc::getuid() } != 0 {
        eprintln!("routes bench: needs root (network namespaces); skipped");
        return;
    }
    // `cargo bench` passes --bench; `cargo test --all-targets` runs this binary without it,
    // and the suite has no place for a benchmark.
    if !std::env::args().any(|a| a == "--bench") {
        return;
    }
    let nodes = env("WEIR_BENCH_NODES", 1000) as u32;
    let rounds = env("WEIR_BENCH_ROUNDS", 10);
    let mut results = json!({});
    results["datapath"] = datapath();
    results["convergence"] = json!([
        converge(&Backend::HostGw, nodes, rounds),
        converge(&Backend::Vxlan(VxlanConfig::default()), nodes, rounds),
    ]);
    println!("{}", serde_json::to_string_pretty(&results).unwrap());
}
