//! Random clusters for the property tests: k8s-openapi objects built from small plain
//! descriptions (so proptest shrinks the descriptions and prints them readably), on two
//! nodes, IPv4 with some IPv6, using every NetworkPolicy feature and some malformed input.

#![allow(dead_code)]

use std::collections::BTreeMap;
use std::net::IpAddr;

use k8s_openapi::api::core::v1::{
    Container, ContainerPort, Namespace, Pod, PodIP, PodSpec, PodStatus,
};
use k8s_openapi::api::networking::v1::{
    IPBlock, NetworkPolicy, NetworkPolicyEgressRule, NetworkPolicyIngressRule, NetworkPolicyPeer,
    NetworkPolicyPort, NetworkPolicySpec,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{
    LabelSelector, LabelSelectorRequirement, ObjectMeta,
};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use proptest::prelude::*;
use proptest::sample::select;

pub const NODES: [&str; 2] = ["node-a", "node-b"];
pub const NAMESPACES: [&str; 3] = ["a", "b", "c"];
const KEYS: [&str; 3] = ["app", "tier", "team"];
const VALUES: [&str; 4] = ["web", "db", "x", "y"];
/// Named container ports; two "http" entries make a conflict when both are chosen.
pub const CONTAINER_PORTS: [(&str, &str, i32); 6] = [
    ("http", "TCP", 80),
    ("http", "TCP", 8080),
    ("dns", "UDP", 53),
    ("dns", "TCP", 53),
    ("metrics", "TCP", 9090),
    ("Bad_Name", "TCP", 81),
];
const CIDRS: [&str; 12] = [
    "10.0.0.0/16",
    "10.0.1.0/24",
    "10.0.0.0/8",
    "10.0.1.10/31",
    "192.168.0.0/24",
    "0.0.0.0/0",
    "fd00::/16",
    "fd00:1::/32",
    "::/0",
    "10.0.0.0/33",
    "bogus",
    "10.0.0.12/32",
];
const EXCEPTS: [&str; 6] = [
    "10.0.1.0/28",
    "10.0.0.10/32",
    "10.0.1.8/29",
    "fd00:1::/64",
    "192.168.0.2/32",
    "nope",
];

pub fn node_ip(node: usize, v6: bool) -> IpAddr {
    if v6 {
        format!("fd00:ffff::{}", node + 1).parse().unwrap()
    } else {
        format!("192.168.0.{}", node + 1).parse().unwrap()
    }
}

/// Addresses that belong to no pod or node.
pub const OUTSIDE: [&str; 4] = ["172.16.0.1", "10.0.1.200", "fd00:1::ff", "2001:db8::1"];

#[derive(Debug, Clone)]
pub struct NamespaceGen {
    /// Whether a Namespace object exists at all (pods may live in one weir has not seen).
    pub exists: bool,
    pub team: Option<&'static str>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PodState {
    Running,
    Succeeded,
    NoIp,
    HostNetwork,
}

#[derive(Debug, Clone)]
pub struct PodGen {
    pub namespace: usize,
    pub labels: Vec<(&'static str, &'static str)>,
    pub node: usize,
    pub state: PodState,
    pub ipv6: bool,
    pub ports: Vec<usize>,
}

#[derive(Debug, Clone)]
pub struct SelectorGen {
    pub labels: Vec<(&'static str, &'static str)>,
    pub expressions: Vec<(&'static str, &'static str, Vec<&'static str>)>,
}

#[derive(Debug, Clone)]
pub enum PeerGen {
    Pods(Option<SelectorGen>, Option<SelectorGen>),
    Block(&'static str, Vec<&'static str>),
    Empty,
    BlockAndPods(&'static str),
}

#[derive(Debug, Clone)]
pub struct PortGen {
    pub protocol: Option<&'static str>,
    pub port: Option<Result<i32, &'static str>>,
    pub end_port: Option<i32>,
}

#[derive(Debug, Clone)]
pub struct RuleGen {
    pub peers: Option<Vec<PeerGen>>,
    pub ports: Option<Vec<PortGen>>,
}

#[derive(Debug, Clone)]
pub struct PolicyGen {
    pub namespace: usize,
    pub pod_selector: Option<SelectorGen>,
    pub types: Option<Vec<&'static str>>,
    pub ingress: Option<Vec<RuleGen>>,
    pub egress: Option<Vec<RuleGen>>,
}

#[derive(Debug, Clone)]
pub struct ClusterGen {
    pub namespaces: Vec<NamespaceGen>,
    pub pods: Vec<PodGen>,
    pub policies: Vec<PolicyGen>,
}

fn selector() -> impl Strategy<Value = SelectorGen> {
    let pair = (select(&KEYS[..]), select(&VALUES[..]));
    let operator = prop_oneof![
        6 => select(vec!["In", "NotIn", "Exists", "DoesNotExist"]),
        1 => Just("Equals"),
    ];
    let expression = (
        select(&KEYS[..]),
        operator,
        prop::collection::vec(select(&VALUES[..]), 0..3),
    )
        .prop_map(|(k, op, values)| match op {
            // Mostly well-formed: values only where the operator takes them.
            "Exists" | "DoesNotExist" if values.len() != 1 => (k, op, vec![]),
            "In" | "NotIn" if values.is_empty() => (k, op, vec!["web"]),
            _ => (k, op, values),
        });
    (
        prop::collection::vec(pair, 0..2),
        prop::collection::vec(expression, 0..2),
    )
        .prop_map(|(labels, expressions)| SelectorGen {
            labels,
            expressions,
        })
}

fn peer() -> impl Strategy<Value = PeerGen> {
    prop_oneof![
        4 => (prop::option::of(selector()), prop::option::of(selector()))
            .prop_map(|(p, n)| match (p, n) {
                (None, None) => PeerGen::Pods(Some(SelectorGen { labels: vec![], expressions: vec![] }), None),
                (p, n) => PeerGen::Pods(p, n),
            }),
        3 => (select(&CIDRS[..]), prop::collection::vec(select(&EXCEPTS[..]), 0..3))
            .prop_map(|(c, e)| PeerGen::Block(c, e)),
        1 => Just(PeerGen::Empty),
        1 => select(&CIDRS[..]).prop_map(PeerGen::BlockAndPods),
    ]
}

fn port() -> impl Strategy<Value = PortGen> {
    let protocol = prop_oneof![
        3 => Just(None),
        2 => select(vec![Some("TCP"), Some("UDP"), Some("SCTP")]),
        1 => Just(Some("ICMP")),
    ];
    let number = select(vec![53, 80, 81, 8080, 9090, 0]).prop_map(Ok);
    let name = select(vec!["http", "dns", "metrics", "nope", "Bad_Name", "80"]).prop_map(Err);
    let port = prop_oneof![1 => Just(None), 3 => number.prop_map(Some), 2 => name.prop_map(Some)];
    let end_port = prop_oneof![4 => Just(None), 2 => select(vec![Some(82), Some(8090), Some(50)])];
    (protocol, port, end_port).prop_map(|(protocol, port, end_port)| PortGen {
        protocol,
        port,
        end_port,
    })
}

fn rule() -> impl Strategy<Value = RuleGen> {
    (
        prop::option::of(prop::collection::vec(peer(), 0..3)),
        prop::option::of(prop::collection::vec(port(), 0..3)),
    )
        .prop_map(|(peers, ports)| RuleGen { peers, ports })
}

fn policy() -> impl Strategy<Value = PolicyGen> {
    let types = prop_oneof![
        3 => Just(None),
        1 => Just(Some(vec!["Ingress"])),
        2 => Just(Some(vec!["Egress"])),
        2 => Just(Some(vec!["Ingress", "Egress"])),
        1 => Just(Some(vec!["Sideways"])),
    ];
    let rules = || prop::option::of(prop::collection::vec(rule(), 0..3));
    (
        0..NAMESPACES.len(),
        prop::option::of(selector()),
        types,
        rules(),
        rules(),
    )
        .prop_map(
            |(namespace, pod_selector, types, ingress, egress)| PolicyGen {
                namespace,
                pod_selector,
                types,
                ingress,
                egress,
            },
        )
}

fn pod() -> impl Strategy<Value = PodGen> {
    let labels = prop::collection::vec((select(&KEYS[..]), select(&VALUES[..])), 0..3);
    let state = prop_oneof![
        10 => Just(PodState::Running),
        1 => Just(PodState::Succeeded),
        1 => Just(PodState::NoIp),
        1 => Just(PodState::HostNetwork),
    ];
    let ports = prop::collection::vec(0..CONTAINER_PORTS.len(), 0..3);
    (
        0..NAMESPACES.len(),
        labels,
        0..NODES.len(),
        state,
        prop::bool::weighted(0.3),
        ports,
    )
        .prop_map(|(namespace, labels, node, state, ipv6, ports)| PodGen {
            namespace,
            labels,
            node,
            state,
            ipv6,
            ports,
        })
}

pub fn cluster() -> impl Strategy<Value = ClusterGen> {
    let namespace = (
        prop::bool::weighted(0.8),
        prop::option::of(select(vec!["x", "y"])),
    )
        .prop_map(|(exists, team)| NamespaceGen { exists, team });
    (
        prop::collection::vec(namespace, NAMESPACES.len()),
        prop::collection::vec(pod(), 2..10),
        prop::collection::vec(policy(), 1..6),
    )
        .prop_map(|(namespaces, pods, policies)| ClusterGen {
            namespaces,
            pods,
            policies,
        })
}

fn labels(pairs: &[(&str, &str)]) -> Option<BTreeMap<String, String>> {
    Some(
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect(),
    )
}

fn meta(namespace: &str, name: String, pairs: &[(&str, &str)]) -> ObjectMeta {
    ObjectMeta {
        namespace: Some(namespace.into()),
        name: Some(name),
        labels: labels(pairs),
        ..Default::default()
    }
}

impl SelectorGen {
    fn build(&self) -> LabelSelector {
        LabelSelector {
            match_labels: labels(&self.labels),
            match_expressions: Some(
                self.expressions
                    .iter()
                    .map(|(k, op, values)| LabelSelectorRequirement {
                        key: k.to_string(),
                        operator: op.to_string(),
                        values: Some(values.iter().map(|v| v.to_string()).collect()),
                    })
                    .collect(),
            ),
        }
    }
}

impl PeerGen {
    fn build(&self) -> NetworkPolicyPeer {
        let block = |cidr: &str, except: &[&str]| IPBlock {
            cidr: cidr.into(),
            except: Some(except.iter().map(|e| e.to_string()).collect()),
        };
        match self {
            PeerGen::Pods(pods, namespaces) => NetworkPolicyPeer {
                pod_selector: pods.as_ref().map(SelectorGen::build),
                namespace_selector: namespaces.as_ref().map(SelectorGen::build),
                ip_block: None,
            },
            PeerGen::Block(cidr, except) => NetworkPolicyPeer {
                ip_block: Some(block(cidr, except)),
                ..Default::default()
            },
            PeerGen::Empty => NetworkPolicyPeer::default(),
            PeerGen::BlockAndPods(cidr) => NetworkPolicyPeer {
                ip_block: Some(block(cidr, &[])),
                pod_selector: Some(LabelSelector::default()),
                namespace_selector: None,
            },
        }
    }
}

impl PortGen {
    fn build(&self) -> NetworkPolicyPort {
        NetworkPolicyPort {
            protocol: self.protocol.map(str::to_string),
            port: self.port.map(|p| match p {
                Ok(n) => IntOrString::Int(n),
                Err(name) => IntOrString::String(name.into()),
            }),
            end_port: self.end_port,
        }
    }
}

impl RuleGen {
    fn peers(&self) -> Option<Vec<NetworkPolicyPeer>> {
        self.peers
            .as_ref()
            .map(|l| l.iter().map(PeerGen::build).collect())
    }

    fn ports(&self) -> Option<Vec<NetworkPolicyPort>> {
        self.ports
            .as_ref()
            .map(|l| l.iter().map(PortGen::build).collect())
    }
}

/// The IPs a generated pod has (none unless running or host-networked).
pub fn pod_ips(i: usize, pod: &PodGen) -> Vec<IpAddr> {
    let mut ips: Vec<IpAddr> = vec![format!("10.0.{}.{}", pod.node, i + 10).parse().unwrap()];
    if pod.ipv6 {
        ips.push(format!("fd00:{}::{}", pod.node, i + 10).parse().unwrap());
    }
    match pod.state {
        PodState::NoIp => vec![],
        PodState::HostNetwork => {
            let mut ips = vec![node_ip(pod.node, false)];
            if pod.ipv6 {
                ips.push(node_ip(pod.node, true));
            }
            ips
        }
        PodState::Running | PodState::Succeeded => ips,
    }
}

pub fn pod_name(i: usize) -> String {
    format!("pod-{i}")
}

impl ClusterGen {
    pub fn objects(&self) -> (Vec<Namespace>, Vec<Pod>, Vec<NetworkPolicy>) {
        let namespaces = self
            .namespaces
            .iter()
            .zip(NAMESPACES)
            .filter(|(n, _)| n.exists)
            .map(|(n, name)| Namespace {
                metadata: ObjectMeta {
                    name: Some(name.into()),
                    labels: labels(&n.team.map(|t| ("team", t)).into_iter().collect::<Vec<_>>()),
                    ..Default::default()
                },
                ..Default::default()
            })
            .collect();
        let pods = self
            .pods
            .iter()
            .enumerate()
            .map(|(i, p)| {
                let ports = p
                    .ports
                    .iter()
                    .map(|j| {
                        let (name, protocol, port) = CONTAINER_PORTS[*j];
                        ContainerPort {
                            name: Some(name.into()),
                            protocol: Some(protocol.into()),
                            container_port: port,
                            ..Default::default()
                        }
                    })
                    .collect();
                Pod {
                    metadata: meta(NAMESPACES[p.namespace], pod_name(i), &p.labels),
                    spec: Some(PodSpec {
                        node_name: Some(NODES[p.node].into()),
                        host_network: Some(p.state == PodState::HostNetwork),
                        containers: vec![Container {
                            name: "c".into(),
                            ports: Some(ports),
                            ..Default::default()
                        }],
                        ..Default::default()
                    }),
                    status: Some(PodStatus {
                        phase: Some(
                            if p.state == PodState::Succeeded {
                                "Succeeded"
                            } else {
                                "Running"
                            }
                            .into(),
                        ),
                        pod_ips: Some(
                            pod_ips(i, p)
                                .iter()
                                .map(|ip| PodIP { ip: ip.to_string() })
                                .collect(),
                        ),
                        ..Default::default()
                    }),
                }
            })
            .collect();
        let policies = self
            .policies
            .iter()
            .enumerate()
            .map(|(i, p)| NetworkPolicy {
                metadata: meta(NAMESPACES[p.namespace], format!("pol-{i}"), &[]),
                spec: Some(NetworkPolicySpec {
                    pod_selector: p.pod_selector.as_ref().map(SelectorGen::build),
                    policy_types: p
                        .types
                        .as_ref()
                        .map(|t| t.iter().map(|s| s.to_string()).collect()),
                    ingress: p.ingress.as_ref().map(|rules| {
                        rules
                            .iter()
                            .map(|r| NetworkPolicyIngressRule {
                                from: r.peers(),
                                ports: r.ports(),
                            })
                            .collect()
                    }),
                    egress: p.egress.as_ref().map(|rules| {
                        rules
                            .iter()
                            .map(|r| NetworkPolicyEgressRule {
                                to: r.peers(),
                                ports: r.ports(),
                            })
                            .collect()
                    }),
                }),
            })
            .collect();
        (namespaces, pods, policies)
    }
}
