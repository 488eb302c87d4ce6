//! The real `weir proxy` agent at scale, end to end: N services × 10 endpoints fed by an object
//! source, measuring
//! * full sync: spawn → the first "synced" line (initial list, planning, rules in the kernel),
//! * RSS after the first sync, and the high-water mark at the end,
//! * one endpoint change: the agent's own `event_to_rules_ms` (the change reaching its store →
//!   rules in the kernel), split into `plan_ms` and the backend's `elapsed_ms`, plus the wall time
//!   from the source change to the "synced" line (which adds the source's own delay: for the
//!   manifest directory, the poll interval and re-reading the file).
//!
//! ```sh
//! cargo build --release -p weir && cargo bench -p weir --bench agent
//! ```
//!
//! Environment: `WEIR_BENCH_SIZES` (default `1000,10000,100000`), `WEIR_BIN` (default
//! `target/release/weir`), `WEIR_BIN_BASE` (a second binary, e.g. an older build, measured side
//! by side with runs interleaved; ratios are new / base), `WEIR_BENCH_BASE_MAX` (largest size the
//! base binary runs, default 100000), `WEIR_BENCH_CHANGES` (endpoint changes per run, default 15),
//! `WEIR_BENCH_RUNS` (agent starts per binary and size, default 1), `WEIR_BENCH_MODE` (default
//! `nftables`), `WEIR_BENCH_AGENT_TIMEOUT` (seconds for the first sync, default 900),
//! `WEIR_BENCH_MEMORY_MAX` (largest size of the in-process heap accounting, default 10000).
//!
//! The source is behind [`Feed`], chosen by `WEIR_BENCH_FEED`: `api` (default), weir's fake
//! Kubernetes API server ([`ApiFeed`], crates/fakeapi) serving list and watch on the agent
//! namespace's loopback, or `manifests`, a manifest directory ([`ManifestFeed`]). Root only: every agent runs in a fresh
//! network namespace. No figure here is asserted: this prints medians, it does not pass or fail.

use std::alloc::{GlobalAlloc, Layout, System};
use std::fmt::Write as _;
use std::io::{BufRead, BufReader};
use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc;
use std::thread;
use std::time::{Duration, Instant};

use weir_testkit::{KillOnDrop, Netns, TempDir};

fn progress(msg: impl AsRef<str>) {
    eprintln!("[agent-bench] {}", msg.as_ref());
}

fn env_or(name: &str, default: &str) -> String {
    std::env::var(name).unwrap_or_else(|_| default.to_string())
}

fn env_num(name: &str, default: usize) -> usize {
    env_or(name, &default.to_string())
        .parse()
        .unwrap_or_else(|_| panic!("{name} must be a number"))
}

// ---------------------------------------------------------------------------------------------
// The generated cluster

const NAMESPACE: &str = "bench";
const ENDPOINTS: usize = 10;
const NODE_IP: Ipv4Addr = Ipv4Addr::new(10, 0, 0, 10);
const CLUSTER_CIDR: &str = "10.244.0.0/16";
/// Services per manifest file.
const SERVICES_PER_FILE: usize = 100;

fn add(base: Ipv4Addr, offset: usize) -> Ipv4Addr {
    Ipv4Addr::from(u32::from(base) + offset as u32)
}

fn vip(i: usize) -> Ipv4Addr {
    add(Ipv4Addr::new(10, 96, 0, 1), i)
}

fn endpoint_ip(svc: usize, ep: usize) -> Ipv4Addr {
    add(Ipv4Addr::new(10, 128, 0, 1), svc * ENDPOINTS + ep)
}

/// The k-th replacement endpoint, from a range nothing else uses.
fn fresh_ip(k: usize) -> Ipv4Addr {
    add(Ipv4Addr::new(10, 200, 0, 1), k)
}

/// Every 10th service is also a NodePort, while the NodePort range lasts.
fn node_port(i: usize) -> Option<u16> {
    (i.is_multiple_of(10) && i / 10 < 2768).then(|| 30000 + (i / 10) as u16)
}

/// One Service and its EndpointSlice, as manifest YAML.
fn service_yaml(out: &mut String, i: usize, endpoints: &[Ipv4Addr]) {
    let name = format!("svc-{i:06}");
    let (ty, np) = match node_port(i) {
        Some(p) => ("NodePort", format!(", nodePort: {p}")),
        None => ("ClusterIP", String::new()),
    };
    let _ = write!(
        out,
        "---\napiVersion: v1\nkind: Service\nmetadata: {{name: {name}, namespace: {NAMESPACE}}}\n\
         spec: {{type: {ty}, clusterIP: {}, ports: [{{port: 80, targetPort: 8080, \
         protocol: TCP{np}}}]}}\n",
        vip(i)
    );
    let _ = write!(
        out,
        "---\napiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\nmetadata: {{name: {name}-1, \
         namespace: {NAMESPACE}, labels: {{kubernetes.io/service-name: {name}}}}}\n\
         addressType: IPv4\nports: [{{name: \"\", port: 8080, protocol: TCP}}]\nendpoints:\n"
    );
    for ip in endpoints {
        let _ = writeln!(
            out,
            "  - {{addresses: [{ip}], conditions: {{ready: true}}, nodeName: node-1}}"
        );
    }
}

fn endpoints_of(i: usize) -> Vec<Ipv4Addr> {
    (0..ENDPOINTS).map(|e| endpoint_ip(i, e)).collect()
}

// ---------------------------------------------------------------------------------------------
// Sources

/// Where the agent gets its objects from.
trait Feed {
    /// Makes `services` services available to an agent in network namespace `ns`; returns
    /// the `weir proxy` arguments that select this source.
    fn start(&mut self, ns: &str, services: usize) -> Result<Vec<String>, String>;
    /// Replaces one endpoint of service `svc` (the `k`-th change of the run).
    fn change_endpoint(&mut self, svc: usize, k: usize) -> Result<(), String>;
}

/// A manifest directory, one file per [`SERVICES_PER_FILE`] services, polled every 100 ms.
struct ManifestFeed {
    dir: TempDir,
    services: usize,
}

impl ManifestFeed {
    fn new(tag: &str) -> Result<Self, String> {
        Ok(ManifestFeed {
            dir: TempDir::new(&format!("wab-{tag}"))?,
            services: 0,
        })
    }

    fn write_file(&self, file: usize, changed: Option<(usize, &[Ipv4Addr])>) -> Result<(), String> {
        let mut text = String::new();
        let first = file * SERVICES_PER_FILE;
        for i in first..(first + SERVICES_PER_FILE).min(self.services) {
            match changed {
                Some((svc, eps)) if svc == i => service_yaml(&mut text, i, eps),
                _ => service_yaml(&mut text, i, &endpoints_of(i)),
            }
        }
        // Written aside and renamed: the poller never reads half a file.
        let tmp = self.dir.0.join(".tmp");
        std::fs::write(&tmp, text).map_err(|e| e.to_string())?;
        let path = self.dir.0.join(format!("services-{file:05}.yaml"));
        std::fs::rename(&tmp, path).map_err(|e| e.to_string())
    }
}

impl Feed for ManifestFeed {
    fn start(&mut self, _ns: &str, services: usize) -> Result<Vec<String>, String> {
        self.services = services;
        let node = format!(
            "apiVersion: v1\nkind: Node\nmetadata: {{name: bench}}\n\
             status: {{addresses: [{{type: InternalIP, address: {NODE_IP}}}]}}\n"
        );
        std::fs::write(self.dir.0.join("node.yaml"), node).map_err(|e| e.to_string())?;
        for file in 0..services.div_ceil(SERVICES_PER_FILE) {
            self.write_file(file, None)?;
        }
        Ok(vec![
            "--manifests".into(),
            self.dir.0.display().to_string(),
            "--manifest-poll-interval".into(),
            "100ms".into(),
        ])
    }

    fn change_endpoint(&mut self, svc: usize, k: usize) -> Result<(), String> {
        let mut eps = endpoints_of(svc);
        eps[0] = fresh_ip(k);
        self.write_file(svc / SERVICES_PER_FILE, Some((svc, &eps)))
    }
}

/// weir's fake Kubernetes API server (crates/fakeapi) on the agent namespace's loopback: the
/// agent lists and watches it as it would a real API server, and an endpoint change reaches
/// it as one MODIFIED watch event.
struct ApiFeed {
    api: Option<weir_fakeapi::FakeApi>,
}

impl ApiFeed {
    fn new() -> Self {
        ApiFeed { api: None }
    }

    fn api(&self) -> Result<&weir_fakeapi::FakeApi, String> {
        self.api
            .as_ref()
            .ok_or_else(|| "fake API server not started".to_string())
    }

    fn apply_json(&self, v: serde_json::Value) -> Result<(), String> {
        use weir_model::k8s_openapi::api::core::v1::{Node, Service};
        use weir_model::k8s_openapi::api::discovery::v1::EndpointSlice;
        let api = self.api()?;
        let r = match v["kind"].as_str() {
            Some("Service") => {
                api.apply(&serde_json::from_value::<Service>(v).map_err(|e| e.to_string())?)
            }
            Some("EndpointSlice") => {
                api.apply(&serde_json::from_value::<EndpointSlice>(v).map_err(|e| e.to_string())?)
            }
            _ => api.apply(&serde_json::from_value::<Node>(v).map_err(|e| e.to_string())?),
        };
        r.map_err(|e| e.to_string())
    }
}

/// One Service and its EndpointSlice as JSON (the same objects as [`service_yaml`]).
fn service_json(i: usize, endpoints: &[Ipv4Addr]) -> [serde_json::Value; 2] {
    use serde_json::json;
    let name = format!("svc-{i:06}");
    let mut port = json!({"port": 80, "targetPort": 8080, "protocol": "TCP"});
    let ty = match node_port(i) {
        Some(p) => {
            port["nodePort"] = p.into();
            "NodePort"
        }
        None => "ClusterIP",
    };
    let svc = json!({
        "kind": "Service",
        "metadata": {"name": name, "namespace": NAMESPACE},
        "spec": {"type": ty, "clusterIP": vip(i).to_string(), "ports": [port]},
    });
    let eps: Vec<_> = endpoints
        .iter()
        .map(|ip| {
            json!({"addresses": [ip.to_string()], "conditions": {"ready": true}, "nodeName": "node-1"})
        })
        .collect();
    let slice = json!({
        "kind": "EndpointSlice",
        "metadata": {"name": format!("{name}-1"), "namespace": NAMESPACE,
                     "labels": {"kubernetes.io/service-name": name}},
        "addressType": "IPv4",
        "ports": [{"name": "", "port": 8080, "protocol": "TCP"}],
        "endpoints": eps,
    });
    [svc, slice]
}

impl Feed for ApiFeed {
    fn start(&mut self, ns: &str, services: usize) -> Result<Vec<String>, String> {
        let api = weir_fakeapi::FakeApi::start(Some(ns), "127.0.0.1:6443".parse().expect("addr"))
            .map_err(|e| format!("fake API server: {e:#}"))?;
        self.api = Some(api);
        self.apply_json(serde_json::json!({
            "kind": "Node",
            "metadata": {"name": "bench"},
            "status": {"addresses": [{"type": "InternalIP", "address": NODE_IP.to_string()}]},
        }))?;
        for i in 0..services {
            for o in service_json(i, &endpoints_of(i)) {
                self.apply_json(o)?;
            }
        }
        // The objects' creation history is not needed: watches start from the list.
        self.api()?.compact();
        Ok(vec!["--master".into(), self.api()?.url()])
    }

    fn change_endpoint(&mut self, svc: usize, k: usize) -> Result<(), String> {
        let mut eps = endpoints_of(svc);
        eps[0] = fresh_ip(k);
        let [_, slice] = service_json(svc, &eps);
        self.apply_json(slice)
    }
}

/// The feed `WEIR_BENCH_FEED` names: `api` (default) or `manifests`.
fn make_feed(tag: &str) -> Result<Box<dyn Feed>, String> {
    match env_or("WEIR_BENCH_FEED", "api").as_str() {
        "api" => Ok(Box::new(ApiFeed::new())),
        "manifests" => Ok(Box::new(ManifestFeed::new(tag)?)),
        other => Err(format!("WEIR_BENCH_FEED={other}: api or manifests")),
    }
}

// ---------------------------------------------------------------------------------------------
// One agent run

#[derive(Default)]
struct Run {
    full_e2e_ms: f64,
    first_plan_ms: f64,
    first_backend_ms: f64,
    rss_mib: f64,
    hwm_mib: f64,
    /// Per change: wall (source change → synced line), and the agent's own figures.
    wall_ms: Vec<f64>,
    plan_ms: Vec<f64>,
    backend_ms: Vec<f64>,
    event_to_rules_ms: Vec<f64>,
}

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
            // The nftables backend's split of a full sync: shown as it comes.
            Ok((_, line)) if line.contains("full sync phases") => {
                progress(format!(
                    "  {}",
                    line.split_once("INFO").map_or(&*line, |(_, l)| l.trim())
                ));
            }
            Ok((_, line)) if line.contains("planned the initial objects") => {
                progress(format!(
                    "  {}",
                    line.split_once("INFO").map_or(&*line, |(_, l)| l.trim())
                ));
            }
            Ok((_, line)) if line.contains("sync failed") => return Err(line),
            Ok((_, line)) => {
                tail.push(line);
                if tail.len() > 20 {
                    tail.remove(0);
                }
            }
            Err(mpsc::RecvTimeoutError::Timeout) => {
                return Err(format!("no sync within {timeout:?}"))
            }
            Err(mpsc::RecvTimeoutError::Disconnected) => {
                return Err(format!("agent exited: {}", tail.join(" | ")))
            }
        }
    }
}

/// A numeric `field=value` of a log line (NaN when absent: an older binary).
fn field(line: &str, name: &str) -> f64 {
    let Some(start) = line.find(&format!(" {name}=")) else {
        return f64::NAN;
    };
    let rest = &line[start + name.len() + 2..];
    rest.split_whitespace()
        .next()
        .and_then(|v| v.parse().ok())
        .unwrap_or(f64::NAN)
}

/// (VmRSS, VmHWM) in MiB.
fn memory_mib(pid: u32) -> Result<(f64, f64), String> {
    let status =
        std::fs::read_to_string(format!("/proc/{pid}/status")).map_err(|e| e.to_string())?;
    let get = |name: &str| -> Result<f64, String> {
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
    Ok((get("VmRSS:")?, get("VmHWM:")?))
}

fn run_agent(
    bin: &Path,
    tag: &str,
    services: usize,
    feed: &mut dyn Feed,
    changes: usize,
) -> Result<Run, String> {
    let mode = env_or("WEIR_BENCH_MODE", "nftables");
    let timeout = Duration::from_secs(env_num("WEIR_BENCH_AGENT_TIMEOUT", 900) as u64);
    let ns = Netns::create(format!("wab-{tag}-{}", std::process::id()))?;
    ns.ip(&[
        "link", "add", "node0", "type", "veth", "peer", "name", "node0p",
    ])?;
    ns.ip(&["addr", "add", &format!("{NODE_IP}/24"), "dev", "node0"])?;
    ns.ip(&["link", "set", "node0", "up"])?;
    let source_args = feed.start(&ns.name, services)?;
    let state = TempDir::new(&format!("wab-{tag}-state"))?;

    let mut cmd = Command::new("ip");
    cmd.args(["netns", "exec", &ns.name])
        .arg(bin)
        .arg("proxy")
        .args(&source_args)
        .args(["--proxy-mode", &mode, "--cluster-cidr", CLUSTER_CIDR])
        .args(["--hostname-override", "bench", "--min-sync-period", "0s"])
        // A periodic resync in the middle of a measurement would only add noise.
        .args(["--sync-period", "1h"])
        .arg("--state-dir")
        .arg(&state.0)
        .env("RUST_LOG", "info")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
    let start = Instant::now();
    let mut child = KillOnDrop(cmd.spawn().map_err(|e| format!("spawn weir: {e}"))?);
    let rx = stderr_lines(&mut child.0);
    let (at, line) = wait_synced(&rx, timeout)?;
    let mut run = Run {
        full_e2e_ms: ms(at - start),
        first_plan_ms: field(&line, "plan_ms"),
        first_backend_ms: field(&line, "elapsed_ms"),
        ..Default::default()
    };
    // `ip netns exec` execs weir: the child's pid is the agent's.
    let pid = child.0.id();
    // Let the source settle (its first rescan) before the changes.
    thread::sleep(Duration::from_millis(500));
    while rx.try_recv().is_ok() {}
    run.rss_mib = memory_mib(pid)?.0;

    for k in 0..changes {
        // Spread over the cluster (a prime stride), never the same service twice in a row.
        let svc = (k * 7919 + services / 2) % services;
        let at_change = Instant::now();
        feed.change_endpoint(svc, k)?;
        let (at, line) = wait_synced(&rx, Duration::from_secs(120))?;
        run.wall_ms.push(ms(at - at_change));
        run.plan_ms.push(field(&line, "plan_ms"));
        run.backend_ms.push(field(&line, "elapsed_ms"));
        run.event_to_rules_ms
            .push(field(&line, "event_to_rules_ms"));
        // Past the poll interval, so each change is its own sync.
        thread::sleep(Duration::from_millis(150));
    }
    run.hwm_mib = memory_mib(pid)?.1;
    Ok(run)
}

// ---------------------------------------------------------------------------------------------
// Where the memory goes: live heap bytes of the objects in each form, in this process

/// Counts live heap bytes (this bench's own allocations; the agent is measured by RSS).
struct Counting;

static LIVE: AtomicUsize = AtomicUsize::new(0);

// SAFETY: every call is forwarded to the system allocator unchanged.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        LIVE.fetch_add(layout.size(), Ordering::Relaxed);
        unsafe { System.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        LIVE.fetch_sub(layout.size(), Ordering::Relaxed);
        unsafe { System.dealloc(ptr, layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        LIVE.fetch_add(new_size, Ordering::Relaxed);
        LIVE.fetch_sub(layout.size(), Ordering::Relaxed);
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

fn live_mib() -> f64 {
    LIVE.load(Ordering::Relaxed) as f64 / (1024.0 * 1024.0)
}

/// Heap held by `n` services × 10 endpoints as k8s-openapi objects, as weir's compact objects,
/// and by the plan and the planner's index, as markdown rows.
fn object_memory(n: usize) -> String {
    use weir_model::k8s_openapi::api::core::v1::Service;
    use weir_model::k8s_openapi::api::discovery::v1::EndpointSlice;
    let mut text = String::new();
    for i in 0..n {
        service_yaml(&mut text, i, &endpoints_of(i));
    }
    let base = live_mib();
    let mut k8s: Vec<(Option<Service>, Option<EndpointSlice>)> = Vec::new();
    let mut reader = text.as_bytes();
    for doc in weir_source::yaml::documents(&mut reader) {
        let v = doc.expect("yaml");
        k8s.push(match v["kind"].as_str() {
            Some("Service") => (serde_json::from_value(v).ok(), None),
            _ => (None, serde_json::from_value(v).ok()),
        });
    }
    let k8s_mib = live_mib() - base;
    drop(k8s);
    let base = live_mib();
    let objects = weir_source::parse_manifest(Path::new("bench.yaml"), &text).objects;
    let compact_mib = live_mib() - base;
    drop(text);
    let snapshot = weir_model::Snapshot::from_objects(&objects);
    let config = weir_model::ProxyConfig {
        node_name: "bench".into(),
        node_ips: vec![NODE_IP.into()],
        cluster_cidrs: vec![CLUSTER_CIDR.parse().expect("cidr")],
        ..Default::default()
    };
    let base = live_mib();
    let plan = weir_model::plan(&snapshot, &config);
    let plan_mib = live_mib() - base;
    drop(plan);
    let base = live_mib();
    let mut planner = weir_model::Planner::default();
    let plan = planner.plan(&snapshot, &config);
    let planner_mib = live_mib() - base;
    drop((plan, planner, snapshot, objects));
    format!(
        "| {n} | k8s-openapi objects | {k8s_mib:.1} |\n| {n} | weir's compact objects | {compact_mib:.1} |\n\
         | {n} | one plan | {plan_mib:.1} |\n| {n} | planner (index + plan + per-service results) | {planner_mib:.1} |\n"
    )
}

// ---------------------------------------------------------------------------------------------
// Statistics and output

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

/// Median of the finite samples (NaN when there are none).
fn median(samples: &[f64]) -> f64 {
    let mut v: Vec<f64> = samples.iter().copied().filter(|x| x.is_finite()).collect();
    if v.is_empty() {
        return f64::NAN;
    }
    v.sort_by(f64::total_cmp);
    let n = v.len();
    if !n.is_multiple_of(2) {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    }
}

/// The figures of one (binary, size) over its runs: medians of every sample.
struct Summary {
    full_e2e_ms: f64,
    first_plan_ms: f64,
    first_backend_ms: f64,
    rss_mib: f64,
    hwm_mib: f64,
    wall_ms: f64,
    plan_ms: f64,
    backend_ms: f64,
    event_to_rules_ms: f64,
}

const FIGURES: [&str; 10] = [
    "full sync e2e ms",
    "  of which start + initial lists ms",
    "  of which planning ms",
    "  of which backend ms",
    "RSS after first sync MiB",
    "RSS high-water MiB",
    "1-ep change: event → rules ms",
    "  planning ms",
    "  backend ms",
    "  wall, object write → synced ms",
];

impl Summary {
    fn of(runs: &[Run]) -> Summary {
        let all =
            |f: fn(&Run) -> &Vec<f64>| -> Vec<f64> { runs.iter().flat_map(f).copied().collect() };
        let each = |f: fn(&Run) -> f64| -> Vec<f64> { runs.iter().map(f).collect() };
        Summary {
            full_e2e_ms: median(&each(|r| r.full_e2e_ms)),
            first_plan_ms: median(&each(|r| r.first_plan_ms)),
            first_backend_ms: median(&each(|r| r.first_backend_ms)),
            rss_mib: median(&each(|r| r.rss_mib)),
            hwm_mib: median(&each(|r| r.hwm_mib)),
            wall_ms: median(&all(|r| &r.wall_ms)),
            plan_ms: median(&all(|r| &r.plan_ms)),
            backend_ms: median(&all(|r| &r.backend_ms)),
            event_to_rules_ms: median(&all(|r| &r.event_to_rules_ms)),
        }
    }
    fn figures(&self) -> [f64; 10] {
        [
            self.full_e2e_ms,
            self.full_e2e_ms - self.first_plan_ms - self.first_backend_ms,
            self.first_plan_ms,
            self.first_backend_ms,
            self.rss_mib,
            self.hwm_mib,
            self.event_to_rules_ms,
            self.plan_ms,
            self.backend_ms,
            self.wall_ms,
        ]
    }
}

fn cell(v: f64) -> String {
    if !v.is_finite() {
        "—".into()
    } else if v >= 100.0 {
        format!("{v:.0}")
    } else {
        format!("{v:.2}")
    }
}

fn main() {
    // `cargo bench` passes --bench; `cargo test --all-targets` runs this binary without it,
    // and a multi-minute benchmark has no place in the test suite.
    if !std::env::args().any(|a| a == "--bench") {
        return;
    }
    let sizes: Vec<usize> = env_or("WEIR_BENCH_SIZES", "1000,10000,100000")
        .split(',')
        .map(|s| s.trim().parse().expect("WEIR_BENCH_SIZES: numbers"))
        .collect();
    let workspace = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let bin = std::env::var_os("WEIR_BIN")
        .map(PathBuf::from)
        .unwrap_or_else(|| workspace.join("target/release/weir"));
    let base = std::env::var_os("WEIR_BIN_BASE").map(PathBuf::from);
    let base_max = env_num("WEIR_BENCH_BASE_MAX", 100_000);
    let changes = env_num("WEIR_BENCH_CHANGES", 15);
    let runs = env_num("WEIR_BENCH_RUNS", 1).max(1);
    for b in std::iter::once(&bin).chain(base.as_ref()) {
        if !b.exists() {
            eprintln!("{} missing (cargo build --release -p weir)", b.display());
            std::process::exit(2);
        }
    }

    let mut memory =
        String::from("| services × 10 endpoints | held as | heap MiB |\n|---|---|---:|\n");
    // Parsing 100k services as k8s-openapi values takes ~1 GiB: only up to this size.
    let memory_max = env_num("WEIR_BENCH_MEMORY_MAX", 10_000);
    for &n in sizes.iter().filter(|n| **n <= memory_max) {
        memory.push_str(&object_memory(n));
    }
    println!("\n{memory}");

    let mut out = String::from(
        "| services × 10 endpoints | figure | weir | base | weir / base |\n|---|---|---:|---:|---:|\n",
    );
    for &n in &sizes {
        let mut new_runs = Vec::new();
        let mut base_runs = Vec::new();
        for r in 0..runs {
            // Interleaved: noise on a shared machine hits both binaries alike.
            let mut order = vec![("new", &bin)];
            if let Some(b) = base.as_ref().filter(|_| n <= base_max) {
                order.push(("base", b));
            }
            if r % 2 == 1 {
                order.reverse();
            }
            for (who, b) in order {
                progress(format!("{who} {n} services, run {}", r + 1));
                let mut feed = match make_feed(&format!("{who}-{n}")) {
                    Ok(f) => f,
                    Err(e) => {
                        progress(format!("  feed: {e}"));
                        continue;
                    }
                };
                match run_agent(b, &format!("{who}{n}"), n, feed.as_mut(), changes) {
                    Ok(run) => {
                        progress(format!(
                            "  full sync {:.0} ms (plan {:.1} ms, backend {:.0} ms), RSS {:.1} MiB, HWM {:.1} MiB, \
                             change median: event→rules {:.2} ms, plan {:.3} ms, wall {:.0} ms",
                            run.full_e2e_ms,
                            run.first_plan_ms,
                            run.first_backend_ms,
                            run.rss_mib,
                            run.hwm_mib,
                            median(&run.event_to_rules_ms),
                            median(&run.plan_ms),
                            median(&run.wall_ms)
                        ));
                        if who == "new" {
                            new_runs.push(run)
                        } else {
                            base_runs.push(run)
                        }
                    }
                    Err(e) => progress(format!("  FAILED: {e}")),
                }
            }
        }
        let new = (!new_runs.is_empty()).then(|| Summary::of(&new_runs).figures());
        let old = (!base_runs.is_empty()).then(|| Summary::of(&base_runs).figures());
        for (i, name) in FIGURES.iter().enumerate() {
            let a = new.map_or(f64::NAN, |f| f[i]);
            let b = old.map_or(f64::NAN, |f| f[i]);
            let ratio = if a.is_finite() && b.is_finite() && b > 0.0 {
                format!("{:.2}", a / b)
            } else {
                "—".into()
            };
            let _ = writeln!(
                out,
                "| {n} | {name} | {} | {} | {ratio} |",
                cell(a),
                cell(b)
            );
        }
    }
    println!("\n{out}");
}
