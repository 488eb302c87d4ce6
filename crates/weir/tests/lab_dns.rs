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
    if !is_root() {
        eprintln!("skipped: needs root");
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
    if !is_root() {
        eprintln!("skipped: needs root");
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
