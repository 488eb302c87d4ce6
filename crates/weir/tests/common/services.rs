//! The service probe set the lab tests share: a two-node topology with every kind of service,
//! how many probes of each kind `weir lab check` plans for it, and what Kubernetes semantics
//! require of their results. Used by `lab_services` (nftables, iptables, userspace on this
//! kernel) and `proxy_ipvs_vm` (ipvs mode in the qemu VM), so every mode passes the same checks.

use std::collections::{BTreeMap, BTreeSet};

use serde_json::Value;

pub const TWO_NODES: &str = "\
underlay: 172.30.0.0/24
clusterCIDR: 10.244.0.0/16
outside: 198.51.100.1
nodes:
  - name: a
    podCIDR: 10.244.1.0/24
    pods: [a1, a2]
  - name: b
    podCIDR: 10.244.2.0/24
    pods: [b1, b2]
";

/// Every kind of service the lab knows, on two nodes.
pub const SERVICES: &str = "\
services:
  - name: web
    port: 80
    backends: [a1, b1]
  - name: dns
    port: 53
    protocol: UDP
    backends: [a2, b2]
  - name: shop
    type: NodePort
    port: 80
    nodePort: 30080
    externalTrafficPolicy: Local
    backends: [a1]
  - name: api
    type: LoadBalancer
    port: 443
    backends: [a2, b1]
  - name: edge
    type: LoadBalancer
    port: 8443
    externalTrafficPolicy: Local
    backends: [b1, b2]
  - name: sticky
    port: 81
    sessionAffinity: ClientIP
    backends: [a1, a2, b1]
  - name: udpnp
    type: NodePort
    port: 5353
    protocol: UDP
    nodePort: 30053
    backends: [a1, b2]
  - name: gone
    type: NodePort
    port: 80
    backends: []
  - name: gone-udp
    port: 54
    protocol: UDP
    backends: []
";

pub fn s(v: &Value, k: &str) -> String {
    v[k].as_str().unwrap_or_default().to_string()
}

/// Which backends answered a probe, and which sources they saw.
pub fn answers(r: &Value) -> (BTreeSet<String>, BTreeSet<String>) {
    let mut by = BTreeSet::new();
    let mut src = BTreeSet::new();
    for a in r["answers"].as_array().unwrap() {
        by.insert(s(a, "by"));
        src.insert(s(a, "source"));
    }
    (by, src)
}

pub fn set(items: &[&str]) -> BTreeSet<String> {
    items.iter().map(|s| s.to_string()).collect()
}

/// How many probes of each kind `check` plans for [`SERVICES`] on [`TWO_NODES`].
pub fn expected_kinds() -> BTreeMap<String, usize> {
    [
        // 7 services with backends × 2 nodes with a non-backend pod, except edge (both of
        // b's pods are backends) and sticky (both of a's).
        ("cluster-ip", 12),
        ("hairpin", 7),
        ("host-network", 7),
        // api, udpnp on a and b (gone's are no-endpoints).
        ("node-port", 4),
        // shop and edge (its node port) on a and b.
        ("node-port-local", 4),
        ("load-balancer", 1),
        ("load-balancer-local", 1),
        // api and edge, from a1 (the first pod that is not a backend).
        ("pod-load-balancer", 2),
        // api and udpnp (policy Cluster), from their first non-backend pod to a and b.
        ("pod-node-port", 4),
        ("health-check", 2),
        // gone: cluster-ip + node port; gone-udp: cluster-ip.
        ("no-endpoints", 3),
    ]
    .iter()
    .map(|(k, n)| (k.to_string(), *n))
    .collect()
}

/// Checks the results of the service probes against what Kubernetes semantics require, on
/// top of the lab's own verdicts (`ok`), from the raw answers.
pub fn assert_services(results: &[Value]) {
    assert_services_within(results, std::time::Duration::from_secs(1));
}

/// [`assert_services`] with the time a no-endpoints probe may take to be refused (the VM
/// test's lab scales its windows under software emulation: `WEIR_LAB_TIMEOUT_SCALE`).
pub fn assert_services_within(results: &[Value], reject_within: std::time::Duration) {
    let node_of = |pod: &str| if pod.starts_with('a') { "a" } else { "b" };
    let node_addrs = |node: &str| {
        if node == "a" {
            set(&["172.30.0.11", "10.244.1.1"])
        } else {
            set(&["172.30.0.12", "10.244.2.1"])
        }
    };
    let find = |svc: &str, kind: &str, from: &str, via: &str| -> &Value {
        results
            .iter()
            .find(|r| {
                s(r, "service") == svc
                    && s(r, "kind") == kind
                    && s(r, "from") == from
                    && s(r, "via") == via
            })
            .unwrap_or_else(|| panic!("no probe {svc} {kind} from {from} via {via}"))
    };

    // Every probe the plan should contain is there (a planner regression would hide cells).
    let mut kinds: BTreeMap<String, usize> = BTreeMap::new();
    for r in results {
        *kinds.entry(s(r, "kind")).or_default() += 1;
    }
    let expected = expected_kinds();
    assert_eq!(kinds, expected, "probe kinds");

    let failed: Vec<String> = results
        .iter()
        .filter(|r| r["ok"] != true)
        .map(|r| {
            format!(
                "{} {} from {} via {} {}:{} ({}): {}",
                s(r, "service"),
                s(r, "kind"),
                s(r, "from"),
                s(r, "via"),
                s(r, "to_ip"),
                r["port"],
                s(r, "proto"),
                s(r, "error")
            )
        })
        .collect();
    assert!(
        failed.is_empty(),
        "{} service probes failed:\n  {}",
        failed.len(),
        failed.join("\n  ")
    );

    for r in results {
        let (by, src) = answers(r);
        let from = s(r, "from");
        let from_ip = s(r, "from_ip");
        match s(r, "kind").as_str() {
            // Spreading over several backends (or one with ClientIP affinity); pods keep
            // their source.
            "cluster-ip" => {
                let want = if s(r, "service") == "sticky" { 1 } else { 2 };
                if s(r, "service") != "shop" {
                    assert_eq!(by.len(), want, "{r}");
                }
                assert_eq!(src, set(&[&from_ip]), "pod source kept: {r}");
            }
            "hairpin" if s(r, "service") != "sticky" => {
                assert!(by.contains(&from), "answered by itself: {r}");
                for a in r["answers"].as_array().unwrap() {
                    let seen = s(a, "source");
                    if s(a, "by") == from {
                        assert!(
                            node_addrs(node_of(&from)).contains(&seen),
                            "hairpin masqueraded to the node: {r}"
                        );
                    } else {
                        assert_eq!(seen, from_ip, "{r}");
                    }
                }
            }
            "node-port" | "load-balancer" => {
                let node = s(r, "via").rsplit(' ').next().unwrap().to_string();
                assert!(by.len() >= 2, "spread over both backends: {r}");
                assert!(src.is_subset(&node_addrs(&node)), "masqueraded: {r}");
            }
            "node-port-local" | "load-balancer-local" => {
                let node = s(r, "via").rsplit(' ').next().unwrap().to_string();
                if by.is_empty() {
                    let cell = (s(r, "service"), node.clone());
                    assert!(
                        cell == ("shop".into(), "b".into()) || cell == ("edge".into(), "a".into()),
                        "only shop on b and edge on a have no local endpoint: {r}"
                    );
                    assert!(s(r, "outcome").starts_with("no answer"), "{r}");
                } else {
                    assert!(by.iter().all(|b| node_of(b) == node), "local only: {r}");
                    assert_eq!(src, set(&["198.51.100.1"]), "client source kept: {r}");
                }
            }
            "no-endpoints" => {
                assert!(s(r, "outcome").starts_with("rejected"), "{r}");
                // The lab's own measure, from the connect or send to the refusal (the probe's
                // `ms` also counts entering the pod's namespace, which the VM's one emulated
                // CPU can delay by seconds while every other probe starts).
                let refused_ms: u128 = s(r, "outcome")
                    .strip_prefix("rejected in ")
                    .and_then(|o| o.split(' ').next())
                    .and_then(|n| n.parse().ok())
                    .unwrap_or_else(|| panic!("no refusal time: {r}"));
                assert!(refused_ms < reject_within.as_millis(), "fails fast: {r}");
            }
            _ => {}
        }
    }
    assert_eq!(
        s(find("edge", "health-check", "outside", "node b"), "outcome"),
        "HTTP 200"
    );
    assert_eq!(
        s(find("edge", "health-check", "outside", "node a"), "outcome"),
        "HTTP 503"
    );
    let lb = find("edge", "load-balancer-local", "outside", "lb via b");
    assert_eq!(answers(lb).0, set(&["b1", "b2"]));
    let np = find("shop", "node-port-local", "outside", "node a");
    assert_eq!(answers(np).0, set(&["a1"]));
}
