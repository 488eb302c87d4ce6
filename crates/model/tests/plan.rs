mod common;
use common::*;
use weir_model::*;

fn plan_of(files: &[&str]) -> Plan {
    let mut all = vec!["nodes.yaml"];
    all.extend_from_slice(files);
    plan(&snapshot(&all), &config())
}

#[test]
fn endpoints_merged_across_slices_deduplicated_and_matched_by_port_name() {
    let p = plan_of(&["basic.yaml"]);
    let http = &p.services[&tcp4("shop", "web", "http")];
    assert_eq!(http.port, 80);
    assert_eq!(
        ips(&http.cluster_endpoints),
        ["10.244.0.4:8080", "10.244.1.5:8080", "10.244.2.9:8080"]
    );
    assert!(http.cluster_endpoints[0].is_local && !http.cluster_endpoints[1].is_local);
    let metrics = &p.services[&tcp4("shop", "web", "metrics")];
    assert_eq!(metrics.port, 9090);
    assert_eq!(
        ips(&metrics.cluster_endpoints),
        ["10.244.0.4:9100", "10.244.1.5:9100", "10.244.2.9:9100"]
    );
    // Only the service's own slices.
    assert!(!ips(&http.cluster_endpoints)
        .iter()
        .any(|e| e.starts_with("10.244.9.9")));
    let cip = fe(http, FrontendKind::ClusterIp);
    assert_eq!(cip.len(), 1);
    assert_eq!(cip[0].addr, Some(ip("10.96.0.10")));
    assert_eq!(cip[0].verdict, Verdict::Forward);
    assert_eq!(cip[0].masquerade, Masquerade::OffCluster);
    assert_eq!(http.affinity_timeout, None);
    // No NodePort frontend for a ClusterIP service.
    assert!(fe(http, FrontendKind::NodePort).is_empty());
}

#[test]
fn protocols_tcp_udp_sctp() {
    let p = plan_of(&["basic.yaml"]);
    for (port, proto) in [
        ("dns", Protocol::Udp),
        ("dns-tcp", Protocol::Tcp),
        ("sig", Protocol::Sctp),
    ] {
        let k = key("kube-system", "dns", port, proto, IpFamily::V4);
        let sp = &p.services[&k];
        assert_eq!(sp.cluster_endpoints.len(), 1, "{k}");
        assert_eq!(sp.frontends[0].verdict, Verdict::Forward);
    }
    assert_eq!(p.services.keys().filter(|k| &*k.name == "dns").count(), 3);
}

#[test]
fn conditions_ready_then_serving_terminating_then_reject() {
    let p = plan_of(&["conditions.yaml"]);
    let mixed = &p.services[&tcp4("default", "mixed", "")];
    assert_eq!(
        ips(&mixed.cluster_endpoints),
        ["10.244.0.1:8080"],
        "nil ready counts as ready; others ignored"
    );
    let draining = &p.services[&tcp4("default", "draining", "")];
    assert_eq!(
        ips(&draining.cluster_endpoints),
        ["10.244.0.4:8080"],
        "only serving AND terminating"
    );
    assert_eq!(draining.frontends[0].verdict, Verdict::Forward);
    let dead = &p.services[&tcp4("default", "dead", "")];
    assert!(dead.cluster_endpoints.is_empty() && !dead.has_any_endpoints);
    assert_eq!(dead.frontends.len(), 2);
    assert!(
        dead.frontends.iter().all(|f| f.verdict == Verdict::Reject),
        "cluster IP and nodeport rejected"
    );
    let nil = &p.services[&tcp4("default", "draining-nil", "")];
    assert_eq!(
        ips(&nil.cluster_endpoints),
        ["10.244.0.8:8080"],
        "nil serving counts as serving"
    );
    let empty = &p.services[&tcp4("default", "empty", "")];
    assert_eq!(empty.frontends[0].verdict, Verdict::Reject);
}

#[test]
fn external_traffic_policy_local() {
    let p = plan_of(&["policies.yaml"]);
    let etp = &p.services[&tcp4("default", "etp", "")];
    assert!(etp.external_policy_local);
    assert_eq!(etp.health_check_node_port, Some(32000));
    assert_eq!(ips(&etp.local_endpoints), ["10.244.0.10:8080"]);
    assert_eq!(
        ips(&etp.cluster_endpoints),
        ["10.244.0.10:8080", "10.244.1.10:8080"]
    );
    let cip = fe(etp, FrontendKind::ClusterIp)[0];
    assert_eq!(
        (cip.endpoints, cip.masquerade, cip.short_circuit),
        (EndpointSet::Cluster, Masquerade::OffCluster, false)
    );
    for kind in [
        FrontendKind::NodePort,
        FrontendKind::LoadBalancer,
        FrontendKind::ExternalIp,
    ] {
        let f = fe(etp, kind);
        assert_eq!(f.len(), 1, "{kind:?}");
        let f = f[0];
        assert_eq!(f.endpoints, EndpointSet::Local, "{kind:?}");
        assert_eq!(
            f.masquerade,
            Masquerade::Never,
            "client source kept ({kind:?})"
        );
        assert!(f.short_circuit);
        assert_eq!(f.verdict, Verdict::Forward);
    }
    assert_eq!(fe(etp, FrontendKind::NodePort)[0].port, 30080);

    // No local endpoint: external frontends drop, cluster IP forwards.
    let remote = &p.services[&tcp4("default", "etp-remote", "")];
    assert!(remote.local_endpoints.is_empty());
    assert_eq!(fe(remote, FrontendKind::NodePort)[0].verdict, Verdict::Drop);
    assert_eq!(
        fe(remote, FrontendKind::ClusterIp)[0].verdict,
        Verdict::Forward
    );
    assert_eq!(remote.health_check_node_port, None);

    // Local serving+terminating endpoint used when no local one is ready.
    let term = &p.services[&tcp4("default", "etp-term", "")];
    assert_eq!(ips(&term.local_endpoints), ["10.244.0.13:8080"]);
    assert_eq!(ips(&term.cluster_endpoints), ["10.244.1.13:8080"]);
}

#[test]
fn internal_traffic_policy_local() {
    let p = plan_of(&["policies.yaml"]);
    let itp = &p.services[&tcp4("default", "itp", "")];
    assert!(itp.internal_policy_local);
    let cip = fe(itp, FrontendKind::ClusterIp)[0];
    assert_eq!(
        (cip.endpoints, cip.verdict),
        (EndpointSet::Local, Verdict::Drop),
        "endpoints exist, none local"
    );
    let np = fe(itp, FrontendKind::NodePort)[0];
    assert_eq!(
        (np.endpoints, np.verdict, np.masquerade),
        (EndpointSet::Cluster, Verdict::Forward, Masquerade::Always)
    );
}

#[test]
fn load_balancer_ingress_external_ips_and_source_ranges() {
    let p = plan_of(&["lb.yaml"]);
    let lb = &p.services[&key("default", "lb", "https", Protocol::Tcp, IpFamily::V4)];
    let lbs: Vec<_> = fe(lb, FrontendKind::LoadBalancer)
        .iter()
        .map(|f| f.addr.unwrap())
        .collect();
    assert_eq!(
        lbs,
        [ip("192.0.2.10"), ip("192.0.2.11")],
        "ipMode Proxy and hostname-only skipped"
    );
    let eips: Vec<_> = fe(lb, FrontendKind::ExternalIp)
        .iter()
        .map(|f| f.addr.unwrap())
        .collect();
    assert_eq!(
        eips,
        [ip("198.51.100.1")],
        "deduplicated, v6 one not in the v4 plan"
    );
    let f = fe(lb, FrontendKind::LoadBalancer)[0];
    assert_eq!(f.port, 443);
    assert_eq!(f.masquerade, Masquerade::Always);
    let ranges: Vec<String> = f
        .source_ranges
        .as_ref()
        .unwrap()
        .iter()
        .map(|n| n.to_string())
        .collect();
    // 192.168.0.0/16 covers the node (192.168.0.10): the VIPs themselves are allowed too.
    assert_eq!(
        ranges,
        [
            "192.0.2.10/32",
            "192.0.2.11/32",
            "192.168.0.0/16",
            "203.0.113.0/24"
        ]
    );
    assert_eq!(fe(lb, FrontendKind::ExternalIp)[0].source_ranges, None);
    assert_eq!(fe(lb, FrontendKind::NodePort)[0].port, 30443);
    // The service has no cluster IP of family v6, so the v6 externalIP yields nothing.
    assert!(!p
        .services
        .contains_key(&key("default", "lb", "https", Protocol::Tcp, IpFamily::V6)));

    let strict = &p.services[&tcp4("default", "lb-strict", "")];
    let f = fe(strict, FrontendKind::LoadBalancer)[0];
    let ranges: Vec<String> = f
        .source_ranges
        .as_ref()
        .unwrap()
        .iter()
        .map(|n| n.to_string())
        .collect();
    assert_eq!(ranges, ["203.0.113.0/24"]);
}

#[test]
fn session_affinity_client_ip() {
    let p = plan_of(&["lb.yaml"]);
    assert_eq!(
        p.services[&tcp4("default", "lb-strict", "")].affinity_timeout,
        Some(DEFAULT_AFFINITY_TIMEOUT_SECONDS)
    );
    assert_eq!(
        p.services[&tcp4("default", "sticky", "")].affinity_timeout,
        Some(60)
    );
    assert_eq!(
        p.services[&tcp4("default", "lb", "https")].affinity_timeout,
        None
    );
}

#[test]
fn headless_external_name_and_ip_less_services_get_nothing() {
    let p = plan_of(&["skipped.yaml"]);
    assert!(
        p.services.is_empty(),
        "{:?}",
        p.services.keys().collect::<Vec<_>>()
    );
}

#[test]
fn dual_stack_one_plan_per_family() {
    let p = plan_of(&["dualstack.yaml"]);
    let v4 = &p.services[&tcp4("default", "ds", "")];
    let v6 = &p.services[&key("default", "ds", "", Protocol::Tcp, IpFamily::V6)];
    assert_eq!(
        fe(v4, FrontendKind::ClusterIp)[0].addr,
        Some(ip("10.96.4.1"))
    );
    assert_eq!(
        fe(v6, FrontendKind::ClusterIp)[0].addr,
        Some(ip("fd00:96::4:1"))
    );
    assert_eq!(ips(&v4.cluster_endpoints), ["10.244.0.40:8080"]);
    assert_eq!(
        ips(&v6.cluster_endpoints),
        ["fd00:244::40:8080", "fd00:244::41:8080"]
    );
    assert_eq!(fe(v6, FrontendKind::NodePort)[0].port, 30090);
    assert_eq!(
        fe(v6, FrontendKind::ClusterIp)[0].masquerade,
        Masquerade::OffCluster
    );
    // Node primary addresses per family, from the Node object (InternalIP preferred).
    assert_eq!(
        p.node_port_addresses_v4,
        NodePortAddresses::List([ip("192.168.0.10")].into())
    );
    assert_eq!(
        p.node_port_addresses_v6,
        NodePortAddresses::List([ip("fd00::10")].into())
    );
    let v6only = &p.services[&key("default", "v6only", "", Protocol::Udp, IpFamily::V6)];
    assert_eq!(v6only.frontends[0].verdict, Verdict::Reject);
    assert!(!p
        .services
        .contains_key(&key("default", "v6only", "", Protocol::Udp, IpFamily::V4)));
}

#[test]
fn topology_hints_and_fallbacks() {
    let p = plan_of(&["topology.yaml"]);
    let z = &p.services[&tcp4("default", "zonal", "")];
    assert_eq!(z.topology, TopologyMode::PreferSameZone);
    assert_eq!(
        ips(&z.cluster_endpoints),
        ["10.244.0.50:80", "10.244.1.51:80"]
    );
    let partial = &p.services[&tcp4("default", "partial", "")];
    assert_eq!(partial.topology, TopologyMode::None);
    assert_eq!(partial.cluster_endpoints.len(), 2);
    let other = &p.services[&tcp4("default", "otherzone", "")];
    assert_eq!(other.topology, TopologyMode::None);
    assert_eq!(other.cluster_endpoints.len(), 2);
    let sn = &p.services[&tcp4("default", "samenode", "")];
    assert_eq!(sn.topology, TopologyMode::PreferSameNode);
    assert_eq!(ips(&sn.cluster_endpoints), ["10.244.0.80:80"]);
    let nf = &p.services[&tcp4("default", "nodefallback", "")];
    assert_eq!(nf.topology, TopologyMode::PreferSameZone);
    assert_eq!(ips(&nf.cluster_endpoints), ["10.244.1.90:80"]);

    // Zone unknown (no Node object, no config): zone hints cannot apply.
    let p = plan(&snapshot(&["topology.yaml"]), &config());
    assert_eq!(
        p.services[&tcp4("default", "zonal", "")].topology,
        TopologyMode::None
    );
    // Zone from config overrides.
    let cfg = ProxyConfig {
        zone: Some("zone-b".into()),
        ..config()
    };
    let p = plan(&snapshot(&["topology.yaml"]), &cfg);
    assert_eq!(
        ips(&p.services[&tcp4("default", "zonal", "")].cluster_endpoints),
        ["10.244.1.50:80"]
    );
}

#[test]
fn masquerade_all_and_no_cluster_cidr() {
    let snap = snapshot(&["nodes.yaml", "basic.yaml"]);
    let cfg = ProxyConfig {
        masquerade_all: true,
        ..config()
    };
    let p = plan(&snap, &cfg);
    assert!(p.masquerade_all);
    assert_eq!(
        p.services[&tcp4("shop", "web", "http")].frontends[0].masquerade,
        Masquerade::Always
    );
    let cfg = ProxyConfig {
        cluster_cidrs: vec![],
        ..config()
    };
    let p = plan(&snap, &cfg);
    assert_eq!(
        p.services[&tcp4("shop", "web", "http")].frontends[0].masquerade,
        Masquerade::Never
    );
}

#[test]
fn nodeport_addresses() {
    let snap = snapshot(&["nodes.yaml", "dualstack.yaml"]);
    // CIDRs select among local addresses; loopback never.
    let cfg = ProxyConfig {
        local_addresses: vec![
            ip("127.0.0.1"),
            ip("10.0.0.5"),
            ip("192.168.0.10"),
            ip("::1"),
        ],
        nodeport_addresses: vec![
            "10.0.0.0/8".parse().unwrap(),
            "127.0.0.0/8".parse().unwrap(),
        ],
        ..config()
    };
    let p = plan(&snap, &cfg);
    assert_eq!(
        p.node_port_addresses_v4,
        NodePortAddresses::List([ip("10.0.0.5")].into())
    );
    // No v6 CIDR given: every v6 local address (kube-proxy's rule).
    assert_eq!(p.node_port_addresses_v6, NodePortAddresses::AllLocal);
    let v6 = &p.services[&key("default", "ds", "", Protocol::Tcp, IpFamily::V6)];
    assert_eq!(fe(v6, FrontendKind::NodePort).len(), 1);
    // CIDRs that match no local address: no NodePorts for that family.
    let cfg = ProxyConfig {
        nodeport_addresses: vec!["172.16.0.0/12".parse().unwrap()],
        ..config()
    };
    let p = plan(&snap, &cfg);
    assert_eq!(p.node_port_addresses_v4, NodePortAddresses::None);
    assert!(fe(
        &p.services[&tcp4("default", "ds", "")],
        FrontendKind::NodePort
    )
    .is_empty());
    // 0.0.0.0/0: every local address.
    let cfg = ProxyConfig {
        nodeport_addresses: vec!["0.0.0.0/0".parse().unwrap()],
        ..config()
    };
    assert_eq!(
        plan(&snap, &cfg).node_port_addresses_v4,
        NodePortAddresses::AllLocal
    );
    // Explicit node IPs override the Node object; a loopback one is dropped.
    let cfg = ProxyConfig {
        node_ips: vec![ip("127.0.0.1"), ip("192.168.7.7")],
        ..config()
    };
    assert_eq!(
        plan(&snap, &cfg).node_port_addresses_v4,
        NodePortAddresses::List([ip("192.168.7.7")].into())
    );
}

/// kube-proxy's `--bind-address`: the given address replaces the Node object's primary IP
/// of its own family only; the other family's still comes from the Node object.
#[test]
fn node_ips_override_the_node_objects_per_family() {
    let snap = snapshot(&["nodes.yaml", "dualstack.yaml"]);
    let p = plan(&snap, &config());
    assert_eq!(
        p.node_port_addresses_v4,
        NodePortAddresses::List([ip("192.168.0.10")].into())
    );
    let cfg = ProxyConfig {
        node_ips: vec![ip("192.168.7.7")],
        ..config()
    };
    let p = plan(&snap, &cfg);
    assert_eq!(
        p.node_port_addresses_v4,
        NodePortAddresses::List([ip("192.168.7.7")].into())
    );
    assert_eq!(
        p.node_port_addresses_v6,
        NodePortAddresses::List([ip("fd00::10")].into())
    );
}

#[test]
fn nodeport_defaults_per_mode_and_localhost() {
    // No Node object: the node's primary IPs are unknown.
    let snap = snapshot(&["dualstack.yaml"]);
    let ds = tcp4("default", "ds", "");
    // nftables mode's default (primary): no NodePort, and a warning saying why and what to do.
    let p = plan(&snap, &config());
    assert_eq!(p.node_port_addresses_v4, NodePortAddresses::None);
    assert!(fe(&p.services[&ds], FrontendKind::NodePort).is_empty());
    assert!(
        p.warnings
            .iter()
            .any(|w| w.starts_with("Service default/ds: NodePort")
                && w.contains("IPv4 address is unknown")
                && w.contains("--nodeport-addresses")),
        "{:?}",
        p.warnings
    );
    // iptables mode's default: every local address, no Node object needed, no warning.
    let cfg = ProxyConfig {
        nodeport_default: NodePortDefault::AllLocal,
        ..config()
    };
    let p = plan(&snap, &cfg);
    assert_eq!(p.node_port_addresses_v4, NodePortAddresses::AllLocal);
    assert_eq!(p.node_port_addresses_v6, NodePortAddresses::AllLocal);
    assert_eq!(fe(&p.services[&ds], FrontendKind::NodePort).len(), 1);
    assert!(
        !p.warnings.iter().any(|w| w.contains("NodePort")),
        "{:?}",
        p.warnings
    );
    // A loopback CIDR: localhost NodePorts where allowed (iptables, IPv4 only).
    let cfg = ProxyConfig {
        local_addresses: vec![ip("127.0.0.1"), ip("10.0.0.5"), ip("::1")],
        nodeport_addresses: vec!["127.0.0.0/8".parse().unwrap(), "::1/128".parse().unwrap()],
        localhost_nodeports: true,
        ..config()
    };
    let p = plan(&snap, &cfg);
    assert_eq!(
        p.node_port_addresses_v4,
        NodePortAddresses::List([ip("127.0.0.1")].into())
    );
    assert_eq!(p.node_port_addresses_v6, NodePortAddresses::None);
}

#[test]
fn plan_is_deterministic_regardless_of_insertion_order() {
    let files = [
        "nodes.yaml",
        "basic.yaml",
        "policies.yaml",
        "lb.yaml",
        "topology.yaml",
        "dualstack.yaml",
    ];
    let a = plan(&snapshot(&files), &config());
    let mut rev = files;
    rev.reverse();
    let b = plan(&snapshot(&rev), &config());
    assert_eq!(a, b);
}

#[test]
fn invalid_input_is_skipped_with_warnings() {
    let p = plan_of(&["warnings.yaml"]);
    let a = &p.services[&tcp4("default", "odd", "a")];
    assert_eq!(ips(&a.cluster_endpoints), ["10.244.0.98:8080"]);
    assert_eq!(
        fe(a, FrontendKind::ExternalIp)[0].addr,
        Some(ip("198.51.100.9"))
    );
    assert_eq!(p.services.len(), 1, "port b (ICMP) skipped");
    let w = p.warnings.join("\n");
    for needle in ["not-an-ip", "ICMP", "orphan", "fd00::1"] {
        assert!(w.contains(needle), "{needle} missing in:\n{w}");
    }
}

#[test]
fn the_planner_replans_only_changed_services_and_shares_the_rest() {
    let mut snap = snapshot(&["nodes.yaml", "basic.yaml", "policies.yaml", "lb.yaml"]);
    let mut planner = Planner::default();
    let first = planner.plan(&snap, &config());
    assert_eq!(first, plan(&snap, &config()));
    let again = planner.plan(&snap, &config());
    assert_eq!(again, first);
    assert!(again
        .services
        .iter()
        .all(|(k, v)| std::sync::Arc::ptr_eq(v, &first.services[k])));
    assert!(first.diff(&again).is_empty());

    // One slice loses an endpoint: only its service's ports get new values, and the result
    // is what planning from scratch gives.
    let (slice_key, slice) = snap
        .endpoint_slices
        .iter()
        .find(|(_, s)| s.endpoints.len() >= 2)
        .map(|(k, s)| (k.clone(), s.clone()))
        .unwrap();
    let mut smaller = (*slice).clone();
    let mut endpoints = smaller.endpoints.to_vec();
    endpoints.pop();
    smaller.endpoints = endpoints.into();
    snap.endpoint_slices.insert(slice_key, smaller.into());
    let next = planner.plan(&snap, &config());
    assert_eq!(next, plan(&snap, &config()));
    let changed: Vec<_> = next
        .services
        .iter()
        .filter(|(k, v)| !std::sync::Arc::ptr_eq(v, &first.services[*k]))
        .map(|(k, _)| k.clone())
        .collect();
    assert!(!changed.is_empty());
    let touched: Vec<_> = first.diff(&next).touched().into_iter().cloned().collect();
    assert_eq!(touched, changed);

    // A node-wide change (configuration) replans everything, still equal to a fresh plan.
    let mut cfg = config();
    cfg.masquerade_all = true;
    assert_eq!(planner.plan(&snap, &cfg), plan(&snap, &cfg));
}

/// Issue 24: the names in the plan's keys and in the store's keys are the objects' own
/// strings, shared (a copy per key and per copy of the plan was ~20 MiB at 100,000
/// services), and the store's endpoints hold one interned node-and-zone pair.
#[test]
fn plan_and_snapshot_keys_share_the_objects_names() {
    let snap = snapshot(&["nodes.yaml", "basic.yaml"]);
    for ((ns, name), svc) in &snap.services {
        assert!(std::sync::Arc::ptr_eq(ns, &svc.namespace));
        assert!(std::sync::Arc::ptr_eq(name, &svc.name));
    }
    let p = plan(&snap, &config());
    assert!(!p.services.is_empty());
    for k in p.services.keys() {
        let svc = &snap.services[&(k.namespace.clone(), k.name.clone())];
        assert!(std::sync::Arc::ptr_eq(&k.namespace, &svc.namespace));
        assert!(std::sync::Arc::ptr_eq(&k.name, &svc.name));
    }
    let placed: Vec<_> = snap
        .endpoint_slices
        .values()
        .flat_map(|s| s.endpoints.iter())
        .filter_map(|e| e.placement.clone())
        .collect();
    for (a, b) in placed.iter().zip(placed.iter().skip(1)) {
        if a == b {
            assert!(std::sync::Arc::ptr_eq(a, b), "one copy per node and zone");
        }
    }
}
