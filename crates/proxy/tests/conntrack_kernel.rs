//! Real conntrack entries in throwaway network namespaces (root only; skipped otherwise).
//!
//! A "node" namespace holds an nftables DNAT ruleset standing in for a proxy mode and sends UDP
//! from its own address 10.244.0.1; a "pod" namespace behind a veth holds the endpoints
//! 10.244.0.5 and 10.244.0.6 (sockets bound on 5353 so nothing answers with ICMP). The
//! entries live in the node namespace; `conntrack -L` is the independent witness.

use std::collections::BTreeSet;
use std::io::Write;
use std::net::{IpAddr, SocketAddr, UdpSocket};
use std::process::{Command, Stdio};

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
"#;

fn runnable() -> bool {
    let root = Command::new("id")
        .arg("-u")
        .output()
        .is_ok_and(|o| o.stdout == b"0\n");
    let tools = ["ip", "nft", "conntrack"].iter().all(|t| {
        Command::new("sh")
            .args(["-c", &format!("command -v {t}")])
            .output()
            .is_ok_and(|o| o.status.success())
    });
    if !(root && tools) {
        eprintln!("skipping: needs root, ip, nft, conntrack");
    }
    root && tools
}

fn sh(args: &[&str], stdin: Option<&str>) -> String {
    let mut child = Command::new(args[0])
        .args(&args[1..])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    if let Some(s) = stdin {
        child.stdin.take().unwrap().write_all(s.as_bytes()).unwrap();
    }
    let out = child.wait_with_output().unwrap();
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
            sh(&["ip", "netns", "add", ns], None);
        }
        let (n, p) = (lab.node.as_str(), lab.pod.as_str());
        sh(
            &[
                "ip", "-n", n, "link", "add", "veth0", "type", "veth", "peer", "name", "veth1",
                "netns", p,
            ],
            None,
        );
        sh(
            &[
                "ip",
                "-n",
                n,
                "addr",
                "add",
                "10.244.0.1/24",
                "dev",
                "veth0",
            ],
            None,
        );
        sh(&["ip", "-n", n, "link", "set", "veth0", "up"], None);
        sh(&["ip", "-n", n, "link", "set", "lo", "up"], None);
        sh(
            &[
                "ip",
                "-n",
                n,
                "route",
                "add",
                "10.96.0.0/16",
                "dev",
                "veth0",
            ],
            None,
        );
        sh(
            &[
                "ip",
                "-n",
                p,
                "addr",
                "add",
                "10.244.0.5/24",
                "dev",
                "veth1",
            ],
            None,
        );
        sh(
            &[
                "ip",
                "-n",
                p,
                "addr",
                "add",
                "10.244.0.6/24",
                "dev",
                "veth1",
            ],
            None,
        );
        sh(&["ip", "-n", p, "link", "set", "veth1", "up"], None);
        sh(&["ip", "netns", "exec", n, "nft", "-f", "-"], Some(RULES));
        let pod = NetNs::named(p).unwrap();
        lab._sinks = pod
            .run(|| {
                ["10.244.0.5:5353", "10.244.0.6:5353"]
                    .map(|a| UdpSocket::bind(a).unwrap())
                    .into()
            })
            .unwrap();
        lab
    }

    /// Sends one datagram from node-address port `sport` to `dst`, inside the node namespace.
    fn send(&self, sport: u16, dst: &str) {
        let node = NetNs::named(&self.node).unwrap();
        node.run(|| {
            let s = UdpSocket::bind(("10.244.0.1", sport)).unwrap();
            s.send_to(b"q", dst.parse::<SocketAddr>().unwrap()).unwrap();
        })
        .unwrap();
    }

    /// Client source ports of the UDP entries `conntrack -L` lists in the node namespace.
    fn listed_sports(&self) -> BTreeSet<u16> {
        let out = sh(
            &[
                "ip",
                "netns",
                "exec",
                &self.node,
                "conntrack",
                "-L",
                "-p",
                "udp",
            ],
            None,
        );
        out.lines()
            .filter_map(|l| {
                let v = l
                    .split_whitespace()
                    .find_map(|w| w.strip_prefix("sport="))?;
                v.parse().ok()
            })
            .collect()
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

fn key(name: &str) -> ServicePortKey {
    ServicePortKey {
        namespace: "default".into(),
        name: name.into(),
        port_name: String::new(),
        protocol: Protocol::Udp,
        family: IpFamily::V4,
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
                node_name: None,
                zone: None,
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
        services: services.into_iter().map(|(n, s)| (key(n), s)).collect(),
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
