//! Real conntrack entries in throwaway network namespaces (root only; skipped otherwise).
//!
//! A "node" namespace holds an nftables DNAT ruleset standing in for a proxy mode and sends UDP
//! from its own address 10.244.0.1; a "pod" namespace behind a veth holds the endpoints
//! 10.244.0.5 and 10.244.0.6 (sockets bound on 5353 so nothing answers with ICMP). The
//! entries live in the node namespace; `conntrack -L` is the independent witness.

use std::collections::BTreeSet;
use std::net::{IpAddr, SocketAddr, UdpSocket};
use std::process::Command;

use weir_kernel::NetNs;
use weir_model::{
    Endpoint, EndpointSet, Frontend, FrontendKind, IpFamily, Masquerade, Plan, Protocol,
    ServicePortKey, ServicePortPlan, TopologyMode, Verdict,
};
use weir_proxy::conntrack;

const RULES: &str = r#"
table ip wct {
  chain out {
    type nat hook output priority -100;
    ip daddr 10.96.0.10 udp dport 53 udp sport 40001 dnat to 10.244.0.5:5353
    ip daddr 10.96.0.10 udp dport 53 udp sport 40002 dnat to 10.244.0.6:5353
    ip daddr 10.96.0.20 udp dport 53 dnat to 10.244.0.5:5353
    ip daddr 10.244.0.1 udp dport 30053 dnat to 10.244.0.5:5353
  }
}
table ip6 wct {
  chain out {
    type nat hook output priority -100;
    ip6 daddr fd00:96::10 udp dport 53 udp sport 43001 dnat to [fd00::5]:5353
    ip6 daddr fd00:96::10 udp dport 53 udp sport 43002 dnat to [fd00::6]:5353
  }
}
"#;

/// Node and pod namespaces ($N, $P) joined by a veth, IPv4 and IPv6 (no DAD, so addresses
/// are usable at once).
const SETUP: &str = r#"
ip -n $N link add veth0 type veth peer name veth1 netns $P
ip -n $N link set lo up
ip -n $N addr add 10.244.0.1/24 dev veth0
ip -n $N addr add fd00::1/64 dev veth0 nodad
ip -n $N link set veth0 up
ip -n $N route add 10.96.0.0/16 dev veth0
ip -n $N route add fd00:96::/64 dev veth0
ip -n $P addr add 10.244.0.5/24 dev veth1
ip -n $P addr add 10.244.0.6/24 dev veth1
ip -n $P addr add fd00::5/64 dev veth1 nodad
ip -n $P addr add fd00::6/64 dev veth1 nodad
ip -n $P link set veth1 up
printf '%s' "$RULES" | ip netns exec $N nft -f -
"#;

/// Root and `ip`, `nft`, `conntrack`, or the test is skipped (a failure under CI=true, naming what is missing).
fn runnable() -> bool {
    weir_testkit::can_run(weir_testkit::missing(true, &["ip", "nft", "conntrack"]))
}

fn sh(args: &[&str]) -> String {
    let out = Command::new(args[0]).args(&args[1..]).output().unwrap();
    assert!(
        out.status.success(),
        "{args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// The node and pod namespaces of one test, removed on drop (also when the test panics).
struct Lab {
    node: String,
    pod: String,
    /// Endpoint sockets, kept open for the lab's life.
    _sinks: Vec<UdpSocket>,
}

impl Lab {
    fn new(test: &str) -> Lab {
        let pid = std::process::id();
        let mut lab = Lab {
            node: format!("wct-{test}-{pid}-n"),
            pod: format!("wct-{test}-{pid}-p"),
            _sinks: vec![],
        };
        for ns in [&lab.node, &lab.pod] {
            sh(&["ip", "netns", "add", ns]);
        }
        let out = Command::new("sh")
            .args(["-ec", SETUP])
            .env("N", &lab.node)
            .env("P", &lab.pod)
            .env("RULES", RULES)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let pod = NetNs::named(&lab.pod).unwrap();
        lab._sinks = pod
            .run(|| {
                [
                    "10.244.0.5:5353",
                    "10.244.0.6:5353",
                    "[fd00::5]:5353",
                    "[fd00::6]:5353",
                ]
                .map(|a| UdpSocket::bind(a).unwrap())
                .into()
            })
            .unwrap();
        lab
    }

    /// Sends one datagram from the node's address, port `sport`, to `dst`, inside the node
    /// namespace.
    fn send(&self, sport: u16, dst: &str) {
        let dst: SocketAddr = dst.parse().unwrap();
        let src = if dst.is_ipv4() {
            "10.244.0.1"
        } else {
            "fd00::1"
        };
        let node = NetNs::named(&self.node).unwrap();
        node.run(|| {
            let s = UdpSocket::bind((src, sport)).unwrap();
            s.send_to(b"q", dst).unwrap();
        })
        .unwrap();
    }

    /// Client source ports of the UDP entries `conntrack -L` lists in the node namespace.
    fn listed_sports(&self) -> BTreeSet<u16> {
        let mut ports = BTreeSet::new();
        for family in ["ipv4", "ipv6"] {
            let node = &self.node;
            let args = [
                "ip",
                "netns",
                "exec",
                node,
                "conntrack",
                "-L",
                "-f",
                family,
                "-p",
                "udp",
            ];
            ports.extend(sh(&args).lines().filter_map(|l| {
                let v = l
                    .split_whitespace()
                    .find_map(|w| w.strip_prefix("sport="))?;
                v.parse::<u16>().ok()
            }));
        }
        ports
    }

    fn delete(&self, filters: &[conntrack::ConntrackFilter]) -> usize {
        let node = NetNs::named(&self.node).unwrap();
        node.run(|| conntrack::delete(filters)).unwrap().unwrap()
    }
}

impl Drop for Lab {
    fn drop(&mut self) {
        for ns in [&self.node, &self.pod] {
            let _ = Command::new("ip").args(["netns", "del", ns]).status();
        }
    }
}

fn key(name: &str, family: IpFamily) -> ServicePortKey {
    ServicePortKey {
        namespace: "default".into(),
        name: name.into(),
        port_name: "".into(),
        protocol: Protocol::Udp,
        family,
    }
}

fn frontend(kind: FrontendKind, addr: Option<&str>, port: u16, forward: bool) -> Frontend {
    Frontend {
        kind,
        addr: addr.map(|a| a.parse().unwrap()),
        port,
        endpoints: EndpointSet::Cluster,
        verdict: if forward {
            Verdict::Forward
        } else {
            Verdict::Reject
        },
        masquerade: Masquerade::OffCluster,
        short_circuit: false,
        source_ranges: None,
    }
}

fn service(vip: &str, node_port: Option<u16>, endpoints: &[&str]) -> ServicePortPlan {
    let fwd = !endpoints.is_empty();
    let mut frontends = vec![frontend(FrontendKind::ClusterIp, Some(vip), 53, fwd)];
    if let Some(np) = node_port {
        frontends.push(frontend(FrontendKind::NodePort, None, np, fwd));
    }
    ServicePortPlan {
        port: 53,
        frontends,
        cluster_endpoints: endpoints
            .iter()
            .map(|ip| Endpoint {
                ip: ip.parse::<IpAddr>().unwrap(),
                port: 5353,
                is_local: false,
                ready: true,
                serving: true,
                terminating: false,
            })
            .collect(),
        local_endpoints: vec![],
        affinity_timeout: None,
        internal_policy_local: false,
        external_policy_local: false,
        health_check_node_port: None,
        topology: TopologyMode::None,
        has_any_endpoints: fwd,
    }
}

fn plan(services: Vec<(&str, ServicePortPlan)>) -> Plan {
    Plan {
        services: services
            .into_iter()
            .map(|(n, s)| {
                (
                    key(n, IpFamily::of(&s.frontends[0].addr.unwrap())),
                    s.into(),
                )
            })
            .collect(),
        ..Default::default()
    }
}

#[test]
fn removed_endpoint_flows_are_deleted_and_nothing_else() {
    if !runnable() {
        return;
    }
    let lab = Lab::new("rm");
    lab.send(40001, "10.96.0.10:53"); // dns → 10.244.0.5 (the endpoint that goes away)
    lab.send(40002, "10.96.0.10:53"); // dns → 10.244.0.6 (stays)
    lab.send(40003, "10.96.0.20:53"); // another service → 10.244.0.5 (stays)
    lab.send(40004, "10.244.0.1:30053"); // dns NodePort → 10.244.0.5
    lab.send(40005, "10.244.0.5:5353"); // straight to the pod, no service (stays)
    let before = lab.listed_sports();
    assert!(
        (40001..=40005).all(|p| before.contains(&p)),
        "entries missing: {before:?}"
    );

    let old = plan(vec![
        (
            "dns",
            service("10.96.0.10", Some(30053), &["10.244.0.5", "10.244.0.6"]),
        ),
        ("other", service("10.96.0.20", None, &["10.244.0.5"])),
    ]);
    let new = plan(vec![
        ("dns", service("10.96.0.10", Some(30053), &["10.244.0.6"])),
        ("other", service("10.96.0.20", None, &["10.244.0.5"])),
    ]);
    let filters = conntrack::stale_udp_flows(&old, &new);
    assert_eq!(filters.len(), 2, "{filters:?}");
    assert_eq!(lab.delete(&filters), 2);

    let after = lab.listed_sports();
    assert_eq!(
        before.difference(&after).copied().collect::<Vec<_>>(),
        vec![40001, 40004],
        "after: {after:?}"
    );
    // Nothing left to match: a second run deletes nothing.
    assert_eq!(lab.delete(&filters), 0);
}

#[test]
fn first_endpoint_clears_flows_that_bypassed_dnat() {
    if !runnable() {
        return;
    }
    let lab = Lab::new("first");
    // 10.96.0.30 and .31 have no DNAT rule: the entries record no NAT at all.
    lab.send(41001, "10.96.0.30:53");
    lab.send(41002, "10.96.0.30:54");
    lab.send(41003, "10.96.0.31:53");
    let before = lab.listed_sports();
    assert!((41001..=41003).all(|p| before.contains(&p)), "{before:?}");

    let old = plan(vec![("empty", service("10.96.0.30", None, &[]))]);
    let new = plan(vec![(
        "empty",
        service("10.96.0.30", None, &["10.244.0.5"]),
    )]);
    let filters = conntrack::stale_udp_flows(&old, &new);
    assert_eq!(filters.len(), 1, "{filters:?}");
    assert_eq!(lab.delete(&filters), 1);

    let after = lab.listed_sports();
    assert_eq!(
        before.difference(&after).copied().collect::<Vec<_>>(),
        vec![41001],
        "after: {after:?}"
    );
}

#[test]
fn no_filters_means_no_netlink_and_no_change() {
    if !runnable() {
        return;
    }
    let lab = Lab::new("none");
    lab.send(42001, "10.96.0.20:53");
    let before = lab.listed_sports();
    assert_eq!(lab.delete(&[]), 0);
    assert_eq!(lab.listed_sports(), before);
    // The reader sees the same entry conntrack -L does, with its DNAT.
    let node = NetNs::named(&lab.node).unwrap();
    let flows = node
        .run(|| {
            conntrack::Conntrack::new()
                .unwrap()
                .flows(IpFamily::V4)
                .unwrap()
        })
        .unwrap();
    let f = flows
        .iter()
        .find(|f| f.orig.src_port == 42001)
        .expect("flow listed");
    assert_eq!(f.protocol, 17);
    assert_eq!(f.orig.dst, "10.96.0.20".parse::<IpAddr>().unwrap());
    assert_eq!(f.reply.src, "10.244.0.5".parse::<IpAddr>().unwrap());
    assert_eq!(f.reply.src_port, 5353);
}

#[test]
fn ipv6_entries_are_matched_and_deleted() {
    if !runnable() {
        return;
    }
    let lab = Lab::new("v6");
    lab.send(43001, "[fd00:96::10]:53"); // → fd00::5 (goes away)
    lab.send(43002, "[fd00:96::10]:53"); // → fd00::6 (stays)
    lab.send(40001, "10.96.0.10:53"); // IPv4 → 10.244.0.5: another family, untouched
    let before = lab.listed_sports();
    assert!(
        [43001, 43002, 40001].iter().all(|p| before.contains(p)),
        "{before:?}"
    );

    let old = plan(vec![(
        "dns",
        service("fd00:96::10", None, &["fd00::5", "fd00::6"]),
    )]);
    let new = plan(vec![("dns", service("fd00:96::10", None, &["fd00::6"]))]);
    let filters = conntrack::stale_udp_flows(&old, &new);
    assert_eq!(filters.len(), 1, "{filters:?}");
    assert_eq!(filters[0].family, IpFamily::V6);
    assert_eq!(lab.delete(&filters), 1);
    let after = lab.listed_sports();
    assert_eq!(
        before.difference(&after).copied().collect::<Vec<_>>(),
        vec![43001]
    );
}
