//! Cluster DNS in `weir lab` (root): `weir dns` behind the DNS Service's ClusterIP, routed by
//! `weir proxy` on every node, forwarding to NSD in the outside world; pods resolve through the
//! kubelet's ClusterFirst resolv.conf. Each test has its own lab name and state directory; a
//! guard runs `weir lab down` even after a panic.

use std::process::Command;

use serde_json::Value;

mod common;
use common::*;

const TOPOLOGY: &str = "\
underlay: 172.30.0.0/24
clusterCIDR: 10.244.0.0/16
outside: 198.51.100.1
dns: true
nodes:
  - name: a
    podCIDR: 10.244.1.0/24
    pods: [a1, a2]
  - name: b
    podCIDR: 10.244.2.0/24
    pods: [b1]
services:
  - name: web
    port: 80
    backends: [a1, b1]
";

fn up(lab: &Lab) {
    let path = lab.state.path().join("topology-input.yaml");
    std::fs::write(&path, format!("name: {}\n{TOPOLOGY}", lab.name)).unwrap();
    lab.ok(&["lab", "up", path.to_str().unwrap()]);
}

/// `weir lab check --json`: its exit status and the `dns` results.
fn check(lab: &Lab) -> (bool, Vec<Value>) {
    let out = lab.weir(&["lab", "check", &lab.name, "--json"]);
    let json: Value = serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "check --json: {e}\n{}\n{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        )
    });
    let dns = json["dns"].as_array().cloned().unwrap_or_default();
    (out.status.success(), dns)
}

#[test]
fn pods_resolve_cluster_and_external_names() {
    if !runnable() {
        return;
    }
    weir_cni();
    let lab = Lab::new("dn");
    up(&lab);

    // The kubelet's ClusterFirst resolv.conf, where `ip netns exec` mounts it.
    let pod_ns = format!("wl-{}-a-a1", lab.name);
    let conf = std::fs::read_to_string(format!("/etc/netns/{pod_ns}/resolv.conf")).unwrap();
    assert!(conf.contains("nameserver 10.96.0.10\n"), "{conf}");
    assert!(
        conf.contains("search default.svc.cluster.local svc.cluster.local cluster.local\n"),
        "{conf}"
    );
    assert!(conf.contains("options ndots:5\n"), "{conf}");

    let (ok, dns) = check(&lab);
    let failed: Vec<&Value> = dns.iter().filter(|r| r["ok"] != true).collect();
    assert!(ok && failed.is_empty(), "failed: {failed:#?}");
    // Every name form, by dig and by getaddrinfo, from a pod on each node, and a
    // ClusterFirstWithHostNet host-network lookup: 2 × 12 + 1.
    assert_eq!(dns.len(), 25, "{dns:#?}");
    let seen = |what: &str, via: &str, from: &str| {
        dns.iter().any(|r| {
            r["check"]["what"] == what
                && r["check"]["from"].as_str().unwrap().starts_with(from)
                && match via {
                    "dig" => r["check"]["via"].get("dig").is_some(),
                    _ => r["check"]["via"] == via,
                }
        })
    };
    for from in ["a/a1", "b/b1"] {
        assert!(seen("svc", "libc", from));
        assert!(seen("svc.ns", "libc", from));
        assert!(seen("service FQDN", "dig", from));
        assert!(seen("headless", "libc", from));
        assert!(seen("named port SRV", "dig", from));
        assert!(seen("ExternalName", "libc", from));
        assert!(seen("external (forwarded)", "libc", from));
        assert!(seen("pod name", "dig", from));
    }
    assert!(seen("service FQDN", "libc_host_net", "a (hostNetwork"));

    // The checks can fail: drop the headless service from the objects; the zone follows and
    // its checks (NXDOMAIN now) fail, the others still pass.
    let objects = lab.lab_dir().join("manifests/dns.yaml");
    let text = std::fs::read_to_string(&objects).unwrap();
    let kept: Vec<&str> = text
        .split("---\n")
        .filter(|d| !d.contains("web-headless"))
        .collect();
    assert_eq!(kept.len(), text.split("---\n").count() - 2);
    std::fs::write(&objects, kept.join("---\n")).unwrap();
    std::thread::sleep(std::time::Duration::from_millis(1000));
    let (ok, dns) = check(&lab);
    assert!(!ok, "check passed without the headless service");
    for r in &dns {
        let headless = r["check"]["what"] == "headless";
        assert_eq!(r["ok"] == true, !headless, "{r:#}");
    }

    // Down removes the lab's resolv.conf files.
    lab.ok(&["lab", "down", &lab.name]);
    assert!(!std::path::Path::new(&format!("/etc/netns/{pod_ns}")).exists());
    let left = Command::new("sh")
        .args([
            "-c",
            &format!("ls /etc/netns | grep -c 'wl-{}-' || true", lab.name),
        ])
        .output()
        .unwrap();
    assert_eq!(String::from_utf8_lossy(&left.stdout).trim(), "0");
}

/// Search-path amplification (issue 11, item 3): the UDP queries reaching the server for one
/// getaddrinfo lookup (A and AAAA, as curl asks) from a ClusterFirst pod (`ndots:5`), without
/// and with `--autopath`. Prints the table docs/dns.md reports.
#[test]
fn search_path_amplification_with_and_without_autopath() {
    if !runnable() {
        return;
    }
    weir_cni();
    let lab = Lab::new("dq");
    up(&lab);
    let state = weir_lab::lab::load_state(&lab.name, lab.state.path()).unwrap();
    let dir = weir_lab::state::LabDir::new(lab.state.path(), &lab.name);
    let pod = state.pods.iter().find(|p| p.name == "b1").unwrap();
    let names = [
        ("external name", "www.example.test"),
        ("external, no such name", "nx.example.test"),
        ("service, short name", "web"),
    ];
    let mut table = Vec::new();
    for autopath in [false, true] {
        let dns = weir_lab::dns::restart_server(std::path::Path::new(WEIR), &dir, &state, autopath)
            .unwrap();
        for (what, name) in names {
            let (queries, result) = weir_lab::dns::count_queries(&state, &dns, || {
                weir_lab::dns::getent(&pod.netns, name, None)
            })
            .unwrap();
            table.push((autopath, what, name, queries, result));
        }
    }
    for (autopath, what, name, queries, result) in &table {
        eprintln!("autopath={autopath:<5} {what:<24} {name:<18} {queries} queries  {result:?}");
    }
    let count = |autopath: bool, name: &str| -> u64 {
        table
            .iter()
            .find(|t| t.0 == autopath && t.2 == name)
            .map(|t| t.3)
            .unwrap()
    };
    // Both ways resolve the same (the answers are right with or without the option).
    for (what, name) in names {
        let r = |a: bool| {
            table
                .iter()
                .find(|t| t.0 == a && t.2 == name)
                .unwrap()
                .4
                .clone()
        };
        assert_eq!(r(false), r(true), "{what}");
    }
    // Without autopath: the three cluster search domains, then the name as given, each for A
    // and AAAA.
    assert_eq!(count(false, "www.example.test"), 8);
    assert!(
        count(true, "www.example.test") < count(false, "www.example.test"),
        "{table:?}"
    );
    // A name that exists nowhere costs the whole walk either way.
    assert_eq!(
        count(true, "nx.example.test"),
        count(false, "nx.example.test")
    );
    // A short service name is found by the first query of each family either way.
    assert_eq!(count(false, "web"), 2);
    assert_eq!(count(true, "web"), 2);
}

/// Node-local mode (issue 11, item 4): `weir dns` on 169.254.20.10 on every node, its traffic
/// NOTRACKed, cache misses to the cluster DNS over TCP. A pod's lookups there leave no
/// conntrack entry (the ClusterIP path leaves one per query socket); then dnsperf from the same
/// pod, side by side: the ClusterIP (DNAT, across the underlay to node a) and the node-local
/// address. Prints the table docs/dns.md reports.
#[test]
fn node_local_cache_beside_the_cluster_ip() {
    if !runnable() {
        return;
    }
    weir_cni();
    let lab = Lab::new("dl");
    up(&lab);
    let state = weir_lab::lab::load_state(&lab.name, lab.state.path()).unwrap();
    let dir = weir_lab::state::LabDir::new(lab.state.path(), &lab.name);
    let weir = std::env::var_os("WEIR_BENCH_BIN").unwrap_or_else(|| WEIR.into());
    // The same binary on both paths (the lab started the cluster DNS with the test's weir).
    weir_lab::dns::restart_server(std::path::Path::new(&weir), &dir, &state, false).unwrap();
    let pids = weir_lab::dns::node_local_up(std::path::Path::new(&weir), &dir, &state).unwrap();
    assert_eq!(pids.len(), 2);
    let dns = weir_lab::dns::load(&dir).unwrap();
    let pod = state.pods.iter().find(|p| p.name == "b1").unwrap();
    let node_b = state.nodes.iter().find(|n| n.name == "b").unwrap();
    let local = weir_lab::dns::NODE_LOCAL_IP;

    // Answers: a cluster name from the local zone, an external one through the cluster DNS.
    let dig = |server, name: &str| weir_lab::dns::dig(&pod.netns, server, name, "A");
    let web = dig(local, "web.default.svc.cluster.local");
    assert_eq!(web.status, "NOERROR");
    assert_eq!(
        web.answers,
        dig(dns.cluster_ip, "web.default.svc.cluster.local").answers
    );
    let www = dig(local, "www.example.test");
    assert_eq!(www.answers, [("A".to_string(), "198.51.100.1".to_string())]);

    // Conntrack on node b: entries to the node-local address stay at none.
    let conntrack = |dst: std::net::Ipv4Addr| -> usize {
        let out = Command::new("ip")
            .args(["netns", "exec", &node_b.netns, "conntrack", "-L", "-d"])
            .arg(dst.to_string())
            .output()
            .unwrap();
        String::from_utf8_lossy(&out.stdout).lines().count()
    };
    for i in 0..5 {
        dig(local, &format!("web{i}.default.svc.cluster.local"));
        dig(dns.cluster_ip, &format!("web{i}.default.svc.cluster.local"));
    }
    assert_eq!(conntrack(local), 0, "node-local lookups were tracked");
    assert!(
        conntrack(dns.cluster_ip) >= 5,
        "ClusterIP lookups not tracked?"
    );

    // glibc's parallel A + AAAA from one socket through the ClusterIP's DNAT (the "5-second
    // timeout" race): 200 lookups, 50 at a time, each timed; a stall would show as ~5 s.
    let mut slowest = std::time::Duration::ZERO;
    let mut stalled = 0;
    for _ in 0..4 {
        let batch: Vec<_> = (0..50)
            .map(|_| {
                let ns = pod.netns.clone();
                std::thread::spawn(move || {
                    let t = std::time::Instant::now();
                    let ok = weir_lab::dns::getent(&ns, "web", None).is_ok();
                    (ok, t.elapsed())
                })
            })
            .collect();
        for h in batch {
            let (ok, took) = h.join().unwrap();
            assert!(ok, "a getaddrinfo lookup failed");
            slowest = slowest.max(took);
            stalled += usize::from(took >= std::time::Duration::from_secs(4));
        }
    }
    eprintln!("200 parallel getaddrinfo lookups via the ClusterIP: slowest {slowest:?}, {stalled} over 4 s");

    // dnsperf, side by side: cluster names and a cached external name.
    let queries = lab.state.path().join("queries");
    std::fs::write(
        &queries,
        "web.default.svc.cluster.local A\nweb-headless.default.svc.cluster.local A\n\
         _echo._tcp.web.default.svc.cluster.local SRV\nwww.example.test A\n",
    )
    .unwrap();
    let mut rows = Vec::new();
    for (path, server) in [("ClusterIP", dns.cluster_ip), ("node-local", local)] {
        let p = weir_lab::dns::dnsperf(&pod.netns, server, &queries, 2, 2000).unwrap();
        eprintln!(
            "{path:<10} {:>9.0} qps  avg {:.3} ms  p50 {:.3} ms  p99 {:.3} ms  lost {}",
            p.qps, p.avg_ms, p.p50_ms, p.p99_ms, p.lost
        );
        rows.push(p);
    }
    for p in &rows {
        assert!(p.qps > 100.0 && p.p99_ms.is_finite(), "{rows:?}");
    }
    // The counters the "5-second timeout" shows in (reported, not asserted: kernels since 5.x
    // resolve most clashes).
    let stats = Command::new("ip")
        .args(["netns", "exec", &node_b.netns, "conntrack", "-S"])
        .output()
        .unwrap();
    let sum = |key: &str| -> u64 {
        String::from_utf8_lossy(&stats.stdout)
            .split_whitespace()
            .filter_map(|w| w.strip_prefix(&format!("{key}=")))
            .filter_map(|v| v.parse::<u64>().ok())
            .sum()
    };
    eprintln!(
        "node b conntrack: insert_failed={} clash_resolve={} drop={}",
        sum("insert_failed"),
        sum("clash_resolve"),
        sum("drop")
    );
}

/// `dns: node-local` (issue 11, item 4): the pods' resolv.conf names the node-local cache
/// (169.254.20.10, as kubelet `--cluster-dns` does with NodeLocal DNSCache), every name check
/// of `weir lab check` passes through it, and the pods' lookups leave no conntrack entry. Then
/// `weir lab dns-measure` (small here; docs/dns.md has the full run) reports both
/// measurements.
#[test]
fn node_local_mode_from_the_topology_and_the_measurement_command() {
    if !runnable() {
        return;
    }
    weir_cni();
    let lab = Lab::new("dm");
    let path = lab.state.path().join("topology-input.yaml");
    std::fs::write(
        &path,
        format!(
            "name: {}\n{}",
            lab.name,
            TOPOLOGY.replace("dns: true", "dns: node-local")
        ),
    )
    .unwrap();
    lab.ok(&["lab", "up", path.to_str().unwrap()]);
    let pod_ns = format!("wl-{}-b-b1", lab.name);
    let conf = std::fs::read_to_string(format!("/etc/netns/{pod_ns}/resolv.conf")).unwrap();
    assert!(conf.contains("nameserver 169.254.20.10\n"), "{conf}");

    let (ok, dns) = check(&lab);
    let failed: Vec<&Value> = dns.iter().filter(|r| r["ok"] != true).collect();
    assert!(ok && failed.is_empty(), "failed: {failed:#?}");
    assert_eq!(dns.len(), 25);
    let out = lab.weir(&["lab", "check", &lab.name]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("node-local cache on 169.254.20.10"), "{text}");

    // The cluster-zone lookups of those checks went to the node-local cache, untracked: node
    // b holds no conntrack entry towards it.
    let node_b = format!("wl-{}-b", lab.name);
    let entries = Command::new("ip")
        .args([
            "netns",
            "exec",
            &node_b,
            "conntrack",
            "-L",
            "-d",
            "169.254.20.10",
        ])
        .output()
        .unwrap();
    assert_eq!(
        String::from_utf8_lossy(&entries.stdout).lines().count(),
        0,
        "node-local lookups were tracked"
    );

    let out = lab.ok(&[
        "lab",
        "dns-measure",
        &lab.name,
        "--lookups",
        "200",
        "--parallel",
        "20",
        "--json",
    ]);
    let report: Value = serde_json::from_slice(&out.stdout).unwrap();
    let queries = |autopath: bool, name: &str| {
        report["search"]
            .as_array()
            .unwrap()
            .iter()
            .find(|r| r["autopath"] == autopath && r["name"] == name)
            .unwrap()["queries"]
            .as_u64()
            .unwrap()
    };
    assert_eq!(queries(false, "www.example.test"), 8, "{report:#}");
    assert!(queries(true, "www.example.test") < 8, "{report:#}");
    let rows = report["parallel"].as_array().unwrap();
    assert_eq!(rows.len(), 2);
    for r in rows {
        assert_eq!(r["stats"]["lookups"], 200, "{r:#}");
        assert_eq!(r["stats"]["failed"], 0, "{r:#}");
        assert_eq!(r["conntrack"].as_array().unwrap().len(), 2, "{r:#}");
    }
    eprintln!("{report:#}");
}
