//! End-to-end tests of `weir lab` on the real kernel: the real `weir` binary, real namespaces, the
//! real CNI plugins (weir-cni and Debian's reference bridge + host-local). Needs root.
//!
//! Each test uses its own lab name (test + pid) and state directory, so the tests run in parallel
//! with each other and with other tests; a guard runs `weir lab down` even when a test panics.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use serde_json::Value;

mod common;
use common::*;

impl Lab {
    fn topology(&self, cni: &str) -> PathBuf {
        let path = self.state.path().join("topology-input.yaml");
        // No proxy: these tests are about the CNI plugins (tests/lab_services.rs covers the
        // proxy).
        let yaml = format!(
            "name: {}\nunderlay: 172.30.0.0/24\nclusterCIDR: 10.244.0.0/16\noutside: 198.51.100.1\ncni: {cni}\nproxy: none\n\
             nodes:\n  - name: a\n    podCIDR: 10.244.1.0/24\n    pods: [a1, a2]\n\
             \x20 - name: b\n    podCIDR: 10.244.2.0/24\n    pods: [b1]\n",
            self.name
        );
        std::fs::write(&path, yaml).unwrap();
        path
    }

    fn namespaces(&self) -> Vec<String> {
        namespaces_of(&self.name)
    }
}

fn namespaces_of(lab: &str) -> Vec<String> {
    let prefix = format!("wl-{lab}-");
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

fn expected_namespaces(lab: &str) -> Vec<String> {
    let mut v: Vec<String> = ["sw", "out", "a", "b", "a-a1", "a-a2", "b-b1"]
        .iter()
        .map(|s| format!("wl-{lab}-{s}"))
        .collect();
    v.sort();
    v
}

/// The underlay addresses of nodes a and b in the shared-segment topologies.
const SHARED: [&str; 2] = ["172.30.0.11", "172.30.0.12"];
/// ... and in the routed-underlay one (each node on its own /28).
const ROUTED: [&str; 2] = ["172.31.0.18", "172.31.0.34"];

/// Asserts every cell of the matrix of a two-node topology (pods named after their node),
/// whose nodes a and b have the underlay addresses `nodes`.
fn assert_matrix(results: &[Value], cni: &str, pods: &[&str], nodes: [&str; 2]) {
    let node_of = |pod: &str| if pod.starts_with('a') { "a" } else { "b" };
    let underlay = |node: &str| if node == "a" { nodes[0] } else { nodes[1] };
    let mut expected = BTreeSet::new();
    for &from in pods {
        for proto in ["tcp", "udp"] {
            for to in pods.iter().filter(|&&t| t != from) {
                let kind = if node_of(to) == node_of(from) {
                    "same-node"
                } else {
                    "other-node"
                };
                expected.insert((
                    from.to_string(),
                    to.to_string(),
                    kind.to_string(),
                    proto.to_string(),
                ));
            }
            expected.insert((
                from.into(),
                node_of(from).into(),
                "own-node".into(),
                proto.into(),
            ));
            expected.insert((
                from.into(),
                "outside".into(),
                "outside".into(),
                proto.into(),
            ));
        }
    }
    let got: BTreeSet<_> = results
        .iter()
        .map(|r| {
            let s = |k: &str| {
                r[k].as_str()
                    .unwrap_or_else(|| panic!("{k} in {r}"))
                    .to_string()
            };
            (s("from"), s("to"), s("kind"), s("proto"))
        })
        .collect();
    assert_eq!(got, expected, "matrix cells");
    assert_eq!(results.len(), expected.len(), "no duplicate cells");

    for r in results {
        let s = |k: &str| r[k].as_str().unwrap_or_default().to_string();
        let (from, to, kind) = (s("from"), s("to"), s("kind"));
        let from_ip = s("from_ip");
        let from_node = node_of(&from);
        assert_eq!(r["ok"], true, "probe failed: {r}");
        assert_eq!(s("answered_by"), to, "answered by the probed target: {r}");
        let prefix = if from_node == "a" {
            "10.244.1."
        } else {
            "10.244.2."
        };
        assert!(
            from_ip.starts_with(prefix),
            "pod IP in its node's pod CIDR: {r}"
        );
        let seen = s("seen_source");
        match kind.as_str() {
            "same-node" | "own-node" => assert_eq!(seen, from_ip, "{r}"),
            "other-node" => {
                // weir-cni exempts the cluster CIDR from masquerade; the reference bridge
                // masquerades everything leaving the pod subnet.
                let want = if cni == "weir" {
                    from_ip.clone()
                } else {
                    underlay(from_node).to_string()
                };
                assert_eq!(seen, want, "{r}")
            }
            "outside" => {
                assert_eq!(s("to_ip"), "198.51.100.1", "{r}");
                assert_eq!(
                    seen,
                    underlay(from_node),
                    "masqueraded to the node's underlay IP: {r}"
                )
            }
            other => panic!("unexpected kind {other}"),
        }
        if kind == "own-node" {
            assert_eq!(s("to_ip"), underlay(from_node), "{r}");
        }
    }
}

fn lifecycle(tag: &str, cni: &str) {
    if !runnable() {
        return;
    }
    if cni == "weir" {
        weir_cni();
    } else {
        assert!(
            Path::new("/usr/lib/cni/bridge").exists(),
            "apt-get install containernetworking-plugins"
        );
    }
    let lab = Lab::new(tag);
    let topo = lab.topology(cni);
    let up = lab.ok(&["lab", "up", topo.to_str().unwrap()]);
    let progress = String::from_utf8_lossy(&up.stderr);
    assert!(progress.contains("[10/10]"), "progress lines: {progress}");
    assert!(progress.contains("node b: pod b1 10.244.2."), "{progress}");
    assert_eq!(lab.namespaces(), expected_namespaces(&lab.name));
    assert!(lab.lab_dir().join("state.json").exists());
    assert!(lab.lab_dir().join("nodes/a/cni/ipam").is_dir());

    let check = lab.weir(&["lab", "check", &lab.name, "--json"]);
    let out: Value = serde_json::from_slice(&check.stdout).unwrap_or_else(|e| {
        panic!(
            "check --json output: {e}\n{}",
            String::from_utf8_lossy(&check.stdout)
        )
    });
    assert_matrix(
        out["matrix"].as_array().unwrap(),
        cni,
        &["a1", "a2", "b1"],
        SHARED,
    );
    // The cross-node routes are weir routes' (proto 87, host-gw on the shared segment), not
    // the lab's.
    let routes = lab.ok(&[
        "lab", "exec", &lab.name, "a", "--", "ip", "route", "show", "proto", "87",
    ]);
    assert_eq!(
        String::from_utf8_lossy(&routes.stdout).trim(),
        "10.244.2.0/24 via 172.30.0.12 dev eth0"
    );
    assert_eq!(
        out["services"],
        Value::Array(vec![]),
        "no proxy, no service probes"
    );
    assert!(check.status.success(), "check exit code {}", check.status);

    let table = lab.ok(&["lab", "check", &lab.name]);
    let table = String::from_utf8_lossy(&table.stdout);
    assert!(table.contains("24 probes: 24 ok, 0 failed"), "{table}");

    let status = lab.ok(&["lab", "status", &lab.name, "--json"]);
    let rows: Vec<Value> = serde_json::from_slice(&status.stdout).unwrap();
    assert_eq!(rows.len(), 7, "{rows:?}");
    for row in &rows {
        if row["role"] != "switch" {
            assert_eq!(row["echo_alive"], true, "{row}");
        }
    }
    let status = lab.ok(&["lab", "status", &lab.name]);
    assert!(String::from_utf8_lossy(&status.stdout).contains("pod b/b1"));

    let exec = lab.ok(&[
        "lab", "exec", &lab.name, "a/a1", "--", "ip", "-4", "-o", "addr", "show", "eth0",
    ]);
    assert!(
        String::from_utf8_lossy(&exec.stdout).contains("10.244.1."),
        "exec runs in the pod"
    );

    lab.ok(&["lab", "down", &lab.name]);
    assert_eq!(lab.namespaces(), Vec::<String>::new(), "no namespace left");
    assert!(!lab.lab_dir().exists(), "no state left");
}

#[test]
fn lab_reference_cni_end_to_end() {
    lifecycle("rf", "reference");
}

#[test]
fn lab_weir_cni_end_to_end() {
    lifecycle("wc", "weir");
}

#[test]
fn down_after_crash_removes_everything() {
    if !runnable() {
        return;
    }
    let lab = Lab::new("cr");
    let topo = lab.topology("reference");
    lab.ok(&["lab", "up", topo.to_str().unwrap()]);
    let state: Value =
        serde_json::from_slice(&std::fs::read(lab.lab_dir().join("state.json")).unwrap()).unwrap();
    let pids: Vec<i32> = state["echo"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["pid"].as_i64().unwrap() as i32)
        .collect();
    assert_eq!(pids.len(), 6);
    // Crash: the first echo servers die hard, state.json is lost; the others keep running
    // (down must find them through their namespaces).
    for &pid in &pids[..3] {
        let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), nix::sys::signal::SIGKILL);
    }
    std::fs::remove_file(lab.lab_dir().join("state.json")).unwrap();

    lab.ok(&["lab", "down", &lab.name]);
    assert_eq!(lab.namespaces(), Vec::<String>::new(), "no namespace left");
    assert!(!lab.lab_dir().exists(), "no state left");
    std::thread::sleep(std::time::Duration::from_millis(100));
    for pid in pids {
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
        let alive = stat
            .rsplit_once(')')
            .is_some_and(|(_, r)| !r.trim_start().starts_with('Z'));
        assert!(!alive, "echo server {pid} still running");
    }
    // A second down is a no-op.
    lab.ok(&["lab", "down", &lab.name]);
}

#[test]
fn demo_runs_end_to_end() {
    if !runnable() {
        return;
    }
    weir_cni();
    let lab = Lab::new("dm");
    let out = lab.ok(&["lab", "demo", "--name", &lab.name, "--json"]);
    let json: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_matrix(
        json["matrix"].as_array().unwrap(),
        "weir",
        &["a1", "a2", "b1", "b2"],
        SHARED,
    );
    // The demo's services (tests/lab_services.rs checks them in detail).
    let services = json["services"].as_array().unwrap();
    assert!(services.len() >= 20, "{services:?}");
    for r in services {
        assert_eq!(r["ok"], true, "service probe failed: {r}");
    }
    for p in json["proxies"].as_array().unwrap() {
        assert_eq!(p["alive"], true, "{p}");
    }
    let agents = json["routes"].as_array().unwrap();
    assert_eq!(agents.len(), 2, "weir routes on both nodes");
    for r in agents {
        assert_eq!(r["alive"], true, "{r}");
    }
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("torn down"), "{stderr}");
    assert_eq!(lab.namespaces(), Vec::<String>::new());
    assert!(!lab.lab_dir().exists());
}

#[test]
fn up_rejects_a_bad_topology_naming_the_field() {
    let lab = Lab::new("bad");
    let path = lab.state.path().join("bad.yaml");
    std::fs::write(
        &path,
        format!(
            "name: {}\nunderlay: 172.30.0.0/24\nclusterCIDR: 10.244.0.0/16\noutside: 198.51.100.1\n\
             nodes:\n  - name: a\n    podCIDR: 10.99.1.0/24\n",
            lab.name
        ),
    )
    .unwrap();
    let out = lab.weir(&["lab", "up", path.to_str().unwrap()]);
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("nodes[0].podCIDR") && stderr.contains("not inside clusterCIDR"),
        "{stderr}"
    );
    assert!(lab.namespaces().is_empty());
}

/// `weir lab exec <lab> <target> -- <command…>`: its stdout.
fn exec(lab: &Lab, target: &str, command: &[&str]) -> String {
    let mut args = vec!["lab", "exec", &lab.name, target, "--"];
    args.extend_from_slice(command);
    String::from_utf8_lossy(&lab.ok(&args).stdout).into_owned()
}

#[test]
fn vxlan_demo_on_a_routed_underlay_runs_end_to_end() {
    if !runnable() {
        return;
    }
    weir_cni();
    let lab = Lab::new("vx");
    let out = lab.ok(&[
        "lab",
        "demo",
        "--topology",
        "vxlan",
        "--name",
        &lab.name,
        "--json",
        "--keep",
    ]);
    let json: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_matrix(
        json["matrix"].as_array().unwrap(),
        "weir",
        &["a1", "a2", "b1", "b2"],
        ROUTED,
    );
    let services = json["services"].as_array().unwrap();
    assert!(services.len() >= 20, "{services:?}");
    for r in services {
        assert_eq!(r["ok"], true, "service probe failed: {r}");
    }
    // The nodes share no segment: b is reached through a's router …
    let get = exec(&lab, "a", &["ip", "route", "get", ROUTED[1]]);
    assert!(get.contains("via 172.31.0.17 dev eth0"), "{get}");
    // … and b's pods through the overlay weir routes built: route, permanent neighbour, FDB.
    let routes = exec(&lab, "a", &["ip", "route", "show", "proto", "87"]);
    assert_eq!(
        routes.trim(),
        "10.244.2.0/24 via 10.244.2.0 dev weir.1 onlink"
    );
    let neigh = exec(&lab, "a", &["ip", "neigh", "show", "dev", "weir.1"]);
    let mac = neigh
        .strip_prefix("10.244.2.0 lladdr ")
        .and_then(|r| r.split_whitespace().next())
        .unwrap_or_else(|| panic!("neighbour of b's gateway: {neigh}"));
    assert!(neigh.contains("PERMANENT"), "{neigh}");
    let fdb = exec(&lab, "a", &["bridge", "fdb", "show", "dev", "weir.1"]);
    assert!(
        fdb.contains(&format!("{mac} dst {} self permanent", ROUTED[1])),
        "{fdb}"
    );

    // Pod MTU = the VTEP's (1500 − 50), read by weir-cni from the file weir routes wrote.
    let vtep = exec(&lab, "a", &["ip", "-o", "link", "show", "weir.1"]);
    assert!(vtep.contains("mtu 1450 "), "{vtep}");
    for pod in ["a/a1", "b/b2"] {
        let eth0 = exec(&lab, pod, &["ip", "-o", "link", "show", "eth0"]);
        assert!(eth0.contains("mtu 1450 "), "{pod}: {eth0}");
    }
    // A 1400-byte DF ping crosses the overlay; one that does not fit fails in the pod, with the
    // MTU named (not a silent loss somewhere on the way, which would only show as a timeout).
    let ping = exec(
        &lab,
        "a/a1",
        &[
            "ping",
            "-M",
            "do",
            "-s",
            "1400",
            "-c",
            "1",
            "-W",
            "2",
            "10.244.2.3",
        ],
    );
    assert!(ping.contains("1 received"), "{ping}");
    let big = lab.weir(&[
        "lab",
        "exec",
        &lab.name,
        "a/a1",
        "--",
        "ping",
        "-M",
        "do",
        "-s",
        "1423",
        "-c",
        "1",
        "-W",
        "2",
        "10.244.2.3",
    ]);
    assert!(!big.status.success());
    let err = String::from_utf8_lossy(&big.stderr);
    assert!(
        err.contains("local error: message too long, mtu=1450"),
        "{err}"
    );
}

/// Pod a1 → b1 over a TCP stream (iperf3, 4 s in 0.5 s intervals) while node c joins (with a
/// pod every node then reaches) and leaves again: the stream never stalls, and c's routes,
/// neighbours and FDB entries are gone from a and b afterwards.
#[test]
fn a_node_joins_and_leaves_while_traffic_flows() {
    if !runnable() {
        return;
    }
    weir_cni();
    let lab = Lab::new("jl");
    let topo = lab.state.path().join("topology-input.yaml");
    std::fs::write(
        &topo,
        format!(
            "name: {}\nunderlay: 172.31.0.0/24\nroutedUnderlay: true\noverlay: vxlan\n\
             clusterCIDR: 10.244.0.0/16\noutside: 198.51.100.1\nproxy: none\n\
             nodes:\n  - name: a\n    podCIDR: 10.244.1.0/24\n    pods: [a1]\n\
             \x20 - name: b\n    podCIDR: 10.244.2.0/24\n    pods: [b1]\n",
            lab.name
        ),
    )
    .unwrap();
    lab.ok(&["lab", "up", topo.to_str().unwrap()]);
    let b1 = format!("wl-{}-b-b1", lab.name);
    let a1 = format!("wl-{}-a-a1", lab.name);
    let mut server = std::process::Command::new("ip")
        .args([
            "netns",
            "exec",
            &b1,
            "iperf3",
            "-s",
            "-1",
            "-B",
            "10.244.2.2",
        ])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    std::thread::sleep(std::time::Duration::from_millis(300));
    let client = std::process::Command::new("ip")
        .args([
            "netns",
            "exec",
            &a1,
            "iperf3",
            "-c",
            "10.244.2.2",
            "-t",
            "4",
        ])
        .args(["-i", "0.5", "-b", "50M", "-J"])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    std::thread::sleep(std::time::Duration::from_millis(500));

    lab.ok(&[
        "lab",
        "add-node",
        &lab.name,
        "c",
        "--pod-cidr",
        "10.244.3.0/24",
        "--pods",
        "c1",
    ]);
    let check = lab.weir(&["lab", "check", &lab.name, "--json"]);
    let results: Value = serde_json::from_slice(&check.stdout).unwrap();
    let matrix = results["matrix"].as_array().unwrap();
    assert_eq!(matrix.len(), 24, "3 pods × 8 probes");
    for r in matrix {
        assert_eq!(r["ok"], true, "with c joined: {r}");
    }
    for node in ["a", "b"] {
        let routes = exec(&lab, node, &["ip", "route", "show", "proto", "87"]);
        assert!(
            routes.contains("10.244.3.0/24 via 10.244.3.0 dev weir.1 onlink"),
            "{node}: {routes}"
        );
        let fdb = exec(&lab, node, &["bridge", "fdb", "show", "dev", "weir.1"]);
        assert!(
            fdb.contains("dst 172.31.0.50 self permanent"),
            "{node}: {fdb}"
        );
    }

    lab.ok(&["lab", "remove-node", &lab.name, "c"]);
    for node in ["a", "b"] {
        let routes = exec(&lab, node, &["ip", "route", "show", "proto", "87"]);
        assert!(!routes.contains("10.244.3.0"), "{node}: {routes}");
        assert_eq!(routes.lines().count(), 1, "{node}: {routes}");
        let neigh = exec(&lab, node, &["ip", "neigh", "show", "dev", "weir.1"]);
        assert!(!neigh.contains("10.244.3.0"), "{node}: {neigh}");
        assert_eq!(neigh.lines().count(), 1, "{node}: {neigh}");
        let fdb = exec(&lab, node, &["bridge", "fdb", "show", "dev", "weir.1"]);
        assert!(!fdb.contains("172.31.0.50"), "{node}: {fdb}");
    }
    assert!(!namespaces_of(&lab.name)
        .iter()
        .any(|n| n.ends_with("-c") || n.contains("-c-")));

    let done = client.wait_with_output().unwrap();
    let _ = server.wait();
    assert!(
        done.status.success(),
        "iperf3: {}",
        String::from_utf8_lossy(&done.stderr)
    );
    let report: Value = serde_json::from_slice(&done.stdout).unwrap();
    let intervals = report["intervals"].as_array().unwrap();
    assert!(intervals.len() >= 7, "{report}");
    for i in intervals {
        let bytes = i["sum"]["bytes"].as_f64().unwrap();
        assert!(bytes > 0.0, "the stream stalled: {i}");
    }
    let check = lab.weir(&["lab", "check", &lab.name, "--json"]);
    let results: Value = serde_json::from_slice(&check.stdout).unwrap();
    for r in results["matrix"].as_array().unwrap() {
        assert_eq!(r["ok"], true, "after c left: {r}");
    }
}
