//! End-to-end tests of services in `weir lab`: `weir proxy` on every node (nftables and iptables
//! modes), probed from pods, nodes and the outside; a long-lived connection across proxy
//! restarts; cleanup after a crash. Needs root (the manifest test does not).
//!
//! Each test uses its own lab name (tag + pid) and state directory, so the tests run in parallel;
//! a guard runs `weir lab down` even when a test panics.

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Write};
use std::net::TcpStream;
use std::path::PathBuf;
use std::process::Output;
use std::time::Duration;

use serde_json::Value;

mod common;
use common::services::*;
use common::*;

impl Lab {
    fn write_topology(&self, body: &str) -> PathBuf {
        let path = self.state.path().join("topology-input.yaml");
        std::fs::write(&path, format!("name: {}\n{body}", self.name)).unwrap();
        path
    }

    fn up(&self, body: &str, mode: &str) -> Output {
        let topo = self.write_topology(body);
        self.ok(&["lab", "up", topo.to_str().unwrap(), "--proxy-mode", mode])
    }

    fn state_json(&self) -> Value {
        serde_json::from_slice(&std::fs::read(self.lab_dir().join("state.json")).unwrap()).unwrap()
    }

    fn proxy_pids(&self) -> BTreeMap<String, i32> {
        self.state_json()["proxies"]
            .as_array()
            .unwrap()
            .iter()
            .map(|p| {
                (
                    p["node"].as_str().unwrap().to_string(),
                    p["pid"].as_i64().unwrap() as i32,
                )
            })
            .collect()
    }

    fn namespaces(&self) -> Vec<String> {
        let prefix = format!("wl-{}-", self.name);
        let mut names: Vec<String> = std::fs::read_dir("/run/netns")
            .map(|rd| {
                rd.flatten()
                    .filter_map(|e| e.file_name().into_string().ok())
                    .filter(|n| n.starts_with(&prefix))
                    .collect()
            })
            .unwrap_or_default();
        names.sort();
        names
    }

    /// `weir lab check --json`, with the table printed on failure for diagnosis.
    fn check(&self) -> (bool, Value) {
        let out = self.weir(&["lab", "check", &self.name, "--json"]);
        let json: Value = serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
            panic!(
                "check --json: {e}\n{}\n{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            )
        });
        let ok = out.status.success();
        if !ok {
            // The rows that failed, from this run: a rerun's table may pass (a flake), and
            // then only these say what happened.
            eprintln!(
                "lab check failed:\n{}\n{}",
                failed_rows(&json).join("\n"),
                String::from_utf8_lossy(&out.stderr)
            );
        }
        (ok, json)
    }

    fn check_table(&self) -> String {
        let out = self.weir(&["lab", "check", &self.name]);
        String::from_utf8_lossy(&out.stdout).into_owned()
    }
}

/// Every result of `lab check --json` that failed: a probe or name check with `ok` false, a
/// process with `alive` false.
fn failed_rows(json: &Value) -> Vec<String> {
    let Some(sections) = json.as_object() else {
        return vec![json.to_string()];
    };
    sections
        .iter()
        .filter_map(|(section, rows)| Some((section, rows.as_array()?)))
        .flat_map(|(section, rows)| {
            rows.iter()
                .filter(|r| r["ok"] == false || r["alive"] == false)
                .map(move |r| format!("{section}: {r}"))
        })
        .collect()
}

fn alive(pid: i32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .map(|stat| {
            stat.rsplit_once(')')
                .is_some_and(|(_, r)| !r.trim_start().starts_with(['Z', 'X']))
        })
        .unwrap_or(false)
}

fn services_in_mode(tag: &str, mode: &str) {
    if !runnable() {
        return;
    }
    weir_cni();
    let lab = Lab::new(tag);
    let started = std::time::Instant::now();
    let up = lab.up(&format!("{TWO_NODES}{SERVICES}"), mode);
    let progress = String::from_utf8_lossy(&up.stderr);
    assert!(
        progress.contains(&format!("weir proxy --proxy-mode {mode} healthy on 2")),
        "{progress}"
    );
    eprintln!("lab up with {mode} proxies in {:?}", started.elapsed());
    for pid in lab.proxy_pids().values() {
        assert!(alive(*pid), "proxy {pid}");
    }
    let manifests = lab.lab_dir().join("manifests");
    assert!(manifests.join("service-edge.yaml").exists());

    let started = std::time::Instant::now();
    let (ok, json) = lab.check();
    eprintln!("check in {:?}", started.elapsed());
    let results = json["services"].as_array().unwrap();
    if !ok {
        eprintln!("rerun:\n{}", lab.check_table());
    }
    assert_services(results);
    for r in json["matrix"].as_array().unwrap() {
        assert_eq!(r["ok"], true, "pod matrix with the proxy running: {r}");
    }
    assert!(ok, "check exit status");

    let status = lab.ok(&["lab", "status", &lab.name]);
    let status = String::from_utf8_lossy(&status.stdout);
    assert!(status.contains("PROXY"), "{status}");
    assert!(
        status.contains("edge") && status.contains("203.0.113.2 via b"),
        "{status}"
    );

    let pids = lab.proxy_pids();
    lab.ok(&["lab", "down", &lab.name]);
    assert!(lab.namespaces().is_empty());
    for pid in pids.values() {
        assert!(!alive(*pid), "proxy {pid} still running after down");
    }
}

#[test]
fn services_nftables() {
    services_in_mode("sn", "nftables");
}

#[test]
fn services_iptables() {
    services_in_mode("si", "iptables");
}

/// userspace mode: every probe passes (the lab expects the proxying node's address at the
/// endpoints), and no pod's own address ever reaches an endpoint through a ClusterIP — the
/// one semantic a user-space proxy changes.
#[test]
fn services_userspace() {
    if !runnable() {
        return;
    }
    weir_cni();
    let lab = Lab::new("su");
    lab.up(&format!("{TWO_NODES}{SERVICES}"), "userspace");
    let (ok, json) = lab.check();
    if !ok {
        eprintln!("rerun:\n{}", lab.check_table());
    }
    assert!(ok, "check exit status");
    let results = json["services"].as_array().unwrap();
    let mut kinds: BTreeMap<String, usize> = BTreeMap::new();
    for r in results {
        *kinds.entry(s(r, "kind")).or_default() += 1;
    }
    assert_eq!(kinds, expected_kinds(), "probe kinds");
    let node_addrs = set(&["172.30.0.11", "10.244.1.1", "172.30.0.12", "10.244.2.1"]);
    let mut cluster_ip = 0;
    for r in results.iter().filter(|r| s(r, "kind") == "cluster-ip") {
        let (by, src) = answers(r);
        assert!(!by.is_empty(), "{r}");
        assert!(
            src.is_subset(&node_addrs),
            "the node's address, not the pod's: {r}"
        );
        assert!(!src.contains(&s(r, "from_ip")), "{r}");
        cluster_ip += 1;
    }
    assert!(cluster_ip >= 4, "{results:?}");
    lab.ok(&["lab", "down", &lab.name]);
    assert!(lab.namespaces().is_empty());
}

/// Sends `line` on a long-lived connection to an echo server and returns its answer.
fn echo(conn: &mut TcpStream, reader: &mut BufReader<TcpStream>, line: &str) -> String {
    conn.write_all(format!("{line}\n").as_bytes())
        .unwrap_or_else(|e| panic!("send {line:?}: {e}"));
    let mut answer = String::new();
    reader
        .read_line(&mut answer)
        .unwrap_or_else(|e| panic!("answer to {line:?}: {e}"));
    assert!(!answer.is_empty(), "connection closed after {line:?}");
    answer.trim().to_string()
}

fn restart_keeps_connection(tag: &str, mode: &str) {
    if !runnable() {
        return;
    }
    weir_cni();
    let lab = Lab::new(tag);
    lab.up(
        &format!("{TWO_NODES}services:\n  - name: web\n    port: 80\n    backends: [a1, b1]\n"),
        mode,
    );
    // a2 → web's ClusterIP (10.96.0.1, the first allocated), a connection kept open.
    let pod = weir_kernel::NetNs::named(&format!("wl-{}-a-a2", lab.name)).unwrap();
    let mut conn = pod
        .run(|| {
            TcpStream::connect_timeout(&"10.96.0.1:80".parse().unwrap(), Duration::from_secs(2))
        })
        .unwrap()
        .expect("connect to the ClusterIP");
    conn.set_read_timeout(Some(Duration::from_secs(3))).unwrap();
    let mut reader = BufReader::new(conn.try_clone().unwrap());
    let mut greeting = String::new();
    reader.read_line(&mut greeting).unwrap();
    let backend = greeting.split_whitespace().next().unwrap().to_string();
    assert!(backend == "a1" || backend == "b1", "{greeting}");
    let prefix = greeting.trim().to_string();
    assert_eq!(echo(&mut conn, &mut reader, "one"), format!("{prefix} one"));

    // Crash (SIGKILL) and restart every node's proxy: the connection goes on, same backend.
    let before = lab.proxy_pids();
    let out = lab.ok(&["lab", "restart-proxy", &lab.name, "--hard"]);
    eprintln!("{}", String::from_utf8_lossy(&out.stderr));
    let after = lab.proxy_pids();
    for (node, pid) in &before {
        assert!(!alive(*pid), "old proxy of {node} gone");
        assert_ne!(after[node], *pid, "new proxy on {node}");
        assert!(alive(after[node]), "new proxy on {node} runs");
    }
    assert_eq!(echo(&mut conn, &mut reader, "two"), format!("{prefix} two"));

    // A graceful restart (SIGTERM) of the client's node.
    lab.ok(&["lab", "restart-proxy", &lab.name, "a"]);
    assert_eq!(
        echo(&mut conn, &mut reader, "three"),
        format!("{prefix} three")
    );

    // New connections are served by the new proxies as well.
    let (ok, json) = lab.check();
    if !ok {
        eprintln!("rerun:\n{}", lab.check_table());
    }
    assert!(ok, "check after restarts: {json}");
    assert_eq!(
        echo(&mut conn, &mut reader, "four"),
        format!("{prefix} four")
    );
    let log = std::fs::read_to_string(lab.lab_dir().join("logs/proxy-a.log")).unwrap();
    assert_eq!(
        log.matches("--- weir lab: starting").count(),
        3,
        "the log keeps every run: {log}"
    );
}

#[test]
fn restart_keeps_connection_nftables() {
    restart_keeps_connection("rn", "nftables");
}

#[test]
fn restart_keeps_connection_iptables() {
    restart_keeps_connection("ri", "iptables");
}

#[test]
fn down_after_proxy_crash_removes_everything() {
    if !runnable() {
        return;
    }
    weir_cni();
    let lab = Lab::new("pc");
    lab.up(
        &format!("{TWO_NODES}services:\n  - name: web\n    port: 80\n    backends: [a1, b1]\n"),
        "nftables",
    );
    let pids = lab.proxy_pids();
    assert_eq!(pids.len(), 2);
    // One proxy dies hard, the state is lost; the other proxy keeps running (down finds it
    // through its namespace).
    let _ = nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(pids["a"]),
        nix::sys::signal::SIGKILL,
    );
    std::fs::remove_file(lab.lab_dir().join("state.json")).unwrap();
    lab.ok(&["lab", "down", &lab.name]);
    assert!(lab.namespaces().is_empty(), "{:?}", lab.namespaces());
    assert!(!lab.lab_dir().exists());
    std::thread::sleep(Duration::from_millis(100));
    for pid in pids.values() {
        assert!(!alive(*pid), "proxy {pid} still running");
    }
}

/// `proxy: none`: services are written as manifests, no proxy runs, check says so.
#[test]
fn proxy_none_runs_no_proxy() {
    if !runnable() {
        return;
    }
    weir_cni();
    let lab = Lab::new("pn");
    let topo = lab.write_topology(&format!(
        "{TWO_NODES}proxy: none\nservices:\n  - name: web\n    port: 80\n    backends: [a1]\n"
    ));
    let up = lab.ok(&["lab", "up", topo.to_str().unwrap()]);
    let progress = String::from_utf8_lossy(&up.stderr);
    assert!(!progress.contains("weir proxy"), "{progress}");
    assert!(lab.proxy_pids().is_empty());
    let table = lab.check_table();
    assert!(
        table.contains("1 services not probed: the lab runs no proxy"),
        "{table}"
    );
}

/// The probes `check` plans for the services (no root needed).
#[test]
fn service_probe_plan_covers_every_kind() {
    let topo = weir_lab::Topology::parse(&format!("name: m\n{TWO_NODES}{SERVICES}")).unwrap();
    let probes = weir_lab::services::plan(&weir_lab::LabState::simulated(&topo));
    let mut kinds: BTreeMap<String, usize> = BTreeMap::new();
    for p in &probes {
        *kinds.entry(p.kind.as_str().to_string()).or_default() += 1;
    }
    assert_eq!(kinds, expected_kinds());
}

/// The manifests the lab writes are what `weir proxy` reads and plans (no root needed).
#[test]
fn lab_manifests_load_and_plan() {
    use weir_model::{FrontendKind, Masquerade, NodePortAddresses, ProxyConfig, Verdict};

    let topo = weir_lab::Topology::parse(&format!("name: m\n{TWO_NODES}{SERVICES}")).unwrap();
    let state = weir_lab::LabState::simulated(&topo);
    let dir = tempfile::tempdir().unwrap();
    weir_lab::manifests::write(dir.path(), &weir_lab::manifests::render(&topo, &state)).unwrap();
    // Parse at once: the files were just written (the agent waits for them to settle).
    let no_settle = weir_source::Limits {
        settle: std::time::Duration::ZERO,
        ..Default::default()
    };
    let mut md = weir_source::ManifestDir::with_limits(dir.path(), no_settle);
    let report = md.scan();
    assert!(report.errors.is_empty(), "{:?}", report.errors);
    let mut store = weir_source::Store::new();
    store.apply(weir_source::Event::Resync(md.objects()));
    let snapshot = store.snapshot();

    let config = |node: &str, ip: [u8; 4]| ProxyConfig {
        node_name: node.into(),
        local_addresses: vec![std::net::IpAddr::from(ip)],
        cluster_cidrs: vec!["10.244.0.0/16".parse().unwrap()],
        ..Default::default()
    };
    let plan_a = weir_model::plan(&snapshot, &config("a", [172, 30, 0, 11]));
    assert!(plan_a.warnings.is_empty(), "{:?}", plan_a.warnings);
    assert_eq!(plan_a.services.len(), 9);
    assert_eq!(
        plan_a.node_port_addresses_v4,
        NodePortAddresses::List(["172.30.0.11".parse().unwrap()].into()),
        "the Node's InternalIP serves NodePorts"
    );
    let svc = |plan: &weir_model::Plan, name: &str| {
        plan.services
            .iter()
            .find(|(k, _)| &*k.name == name)
            .map(|(_, v)| v.clone())
            .unwrap_or_else(|| panic!("no {name}"))
    };
    let web = svc(&plan_a, "web");
    assert_eq!(web.port, 80);
    assert_eq!(web.cluster_endpoints.len(), 2);
    assert_eq!(web.cluster_endpoints[0].port, 8080);
    let shop_a = svc(&plan_a, "shop");
    let np = shop_a
        .frontends
        .iter()
        .find(|f| f.kind == FrontendKind::NodePort)
        .unwrap();
    assert_eq!(
        (np.port, np.verdict, np.masquerade),
        (30080, Verdict::Forward, Masquerade::Never)
    );
    let plan_b = weir_model::plan(&snapshot, &config("b", [172, 30, 0, 12]));
    let shop_b = svc(&plan_b, "shop");
    let np = shop_b
        .frontends
        .iter()
        .find(|f| f.kind == FrontendKind::NodePort)
        .unwrap();
    assert_eq!(np.verdict, Verdict::Drop, "no local endpoint on b");
    let edge = svc(&plan_b, "edge");
    assert_eq!(edge.health_check_node_port, Some(30002));
    assert!(edge
        .frontends
        .iter()
        .any(|f| f.kind == FrontendKind::LoadBalancer
            && f.addr == Some("203.0.113.2".parse().unwrap())));
    let sticky = svc(&plan_a, "sticky");
    assert_eq!(sticky.affinity_timeout, Some(10800));
    for name in ["gone", "gone-udp"] {
        let p = svc(&plan_a, name);
        assert!(!p.has_any_endpoints);
        assert!(
            p.frontends.iter().all(|f| f.verdict == Verdict::Reject),
            "{name}"
        );
    }
}
