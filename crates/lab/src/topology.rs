//! The lab's topology file: nodes, their pod CIDRs and pods, the underlay and the outside world.
//!
//! Parsing is strict (unknown keys are errors) and every error names the field it is about, e.g.
//! `nodes[1].podCIDR: 10.245.1.0/24 is not inside clusterCIDR 10.244.0.0/16`.

use std::collections::BTreeSet;
use std::net::Ipv4Addr;

use ipnet::Ipv4Net;
use serde::{Deserialize, Serialize};

/// The two-node topology `weir lab demo` uses.
pub const DEFAULT_TOPOLOGY: &str = "\
name: demo
underlay: 172.30.0.0/24
clusterCIDR: 10.244.0.0/16
outside: 198.51.100.1
cni: weir
nodes:
  - name: a
    podCIDR: 10.244.1.0/24
    pods: [a1, a2]
  - name: b
    podCIDR: 10.244.2.0/24
    pods: [b1]
";

/// Which CNI plugin creates the pods' interfaces.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum CniKind {
    /// weir's own plugin, `weir-cni` in bridge mode.
    #[default]
    Weir,
    /// Debian's reference plugins (`/usr/lib/cni/bridge` + `host-local`), for comparison.
    Reference,
}

impl CniKind {
    pub fn as_str(self) -> &'static str {
        match self {
            CniKind::Weir => "weir",
            CniKind::Reference => "reference",
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Topology {
    pub name: String,
    pub underlay: Ipv4Net,
    #[serde(rename = "clusterCIDR")]
    pub cluster_cidr: Ipv4Net,
    pub outside: Ipv4Addr,
    #[serde(default)]
    pub cni: CniKind,
    pub nodes: Vec<Node>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Node {
    pub name: String,
    #[serde(rename = "podCIDR")]
    pub pod_cidr: Ipv4Net,
    #[serde(default)]
    pub pods: Vec<String>,
}

/// A topology error: the field it concerns (`nodes[1].podCIDR`) and what is wrong.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TopologyError {
    pub field: String,
    pub message: String,
}

impl std::fmt::Display for TopologyError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.field.is_empty() || self.field == "." {
            write!(f, "topology: {}", self.message)
        } else {
            write!(f, "topology: {}: {}", self.field, self.message)
        }
    }
}

impl std::error::Error for TopologyError {}

fn err(field: impl Into<String>, message: impl Into<String>) -> TopologyError {
    TopologyError {
        field: field.into(),
        message: message.into(),
    }
}

/// Names of labs, nodes and pods: short, lower-case, no dashes (dashes separate the parts of
/// namespace names, so a namespace name can always be split back into lab, node and pod).
pub fn valid_name(name: &str) -> bool {
    (1..=10).contains(&name.len())
        && name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit())
}

const NAME_RULE: &str = "must be 1 to 10 characters from [a-z0-9]";

/// Node names that would collide with the lab's own namespaces.
const RESERVED_NODE_NAMES: [&str; 2] = ["sw", "out"];

impl Topology {
    /// Parses and validates a topology file.
    pub fn parse(yaml: &str) -> Result<Self, TopologyError> {
        let de = serde_yaml::Deserializer::from_str(yaml);
        let topo: Topology = serde_path_to_error::deserialize(de).map_err(|e| {
            let path = e.path().to_string();
            let mut inner = e.into_inner().to_string();
            // serde_yaml prefixes some messages with (part of) the path already: drop it.
            if let Some((head, rest)) = inner.split_once(": ") {
                if !head.contains(' ') && path.starts_with(head) {
                    inner = rest.to_string();
                }
            }
            err(path, inner)
        })?;
        topo.validate()?;
        Ok(topo)
    }

    /// The embedded two-node topology.
    pub fn default_demo() -> Self {
        Self::parse(DEFAULT_TOPOLOGY).expect("the embedded topology is valid")
    }

    pub fn to_yaml(&self) -> String {
        serde_yaml::to_string(self).expect("a topology serializes")
    }

    pub fn validate(&self) -> Result<(), TopologyError> {
        if !valid_name(&self.name) {
            return Err(err("name", format!("{:?} {NAME_RULE}", self.name)));
        }
        if self.underlay.prefix_len() > 28 {
            return Err(err(
                "underlay",
                format!("{} is too small (at most /28)", self.underlay),
            ));
        }
        if self.underlay.addr() != self.underlay.network() {
            return Err(err(
                "underlay",
                format!("{} has host bits set", self.underlay),
            ));
        }
        if self.cluster_cidr.addr() != self.cluster_cidr.network() {
            return Err(err(
                "clusterCIDR",
                format!("{} has host bits set", self.cluster_cidr),
            ));
        }
        if self.cluster_cidr.contains(&self.underlay.network())
            || self.underlay.contains(&self.cluster_cidr.network())
        {
            return Err(err(
                "underlay",
                format!(
                    "{} overlaps clusterCIDR {}",
                    self.underlay, self.cluster_cidr
                ),
            ));
        }
        if self.cluster_cidr.contains(&self.outside) || self.underlay.contains(&self.outside) {
            return Err(err(
                "outside",
                format!("{} must be outside clusterCIDR and underlay", self.outside),
            ));
        }
        if self.nodes.is_empty() {
            return Err(err("nodes", "at least one node is needed"));
        }
        let mut node_names = BTreeSet::new();
        let mut pod_names = BTreeSet::new();
        for (i, node) in self.nodes.iter().enumerate() {
            let field = |f: &str| format!("nodes[{i}].{f}");
            if !valid_name(&node.name) {
                return Err(err(field("name"), format!("{:?} {NAME_RULE}", node.name)));
            }
            if RESERVED_NODE_NAMES.contains(&node.name.as_str()) {
                return Err(err(field("name"), format!("{:?} is reserved", node.name)));
            }
            if !node_names.insert(node.name.clone()) {
                return Err(err(
                    field("name"),
                    format!("duplicate node name {:?}", node.name),
                ));
            }
            if self.underlay_ip(i).is_none() {
                return Err(err(
                    field("name"),
                    format!(
                        "no address left for node {} in underlay {}",
                        i + 1,
                        self.underlay
                    ),
                ));
            }
            let cidr = node.pod_cidr;
            if cidr.addr() != cidr.network() {
                return Err(err(field("podCIDR"), format!("{cidr} has host bits set")));
            }
            if cidr.prefix_len() > 29 {
                return Err(err(
                    field("podCIDR"),
                    format!("{cidr} is too small (at most /29)"),
                ));
            }
            if !self.cluster_cidr.contains(&cidr) {
                return Err(err(
                    field("podCIDR"),
                    format!("{cidr} is not inside clusterCIDR {}", self.cluster_cidr),
                ));
            }
            for (j, other) in self.nodes[..i].iter().enumerate() {
                if other.pod_cidr.contains(&cidr.network())
                    || cidr.contains(&other.pod_cidr.network())
                {
                    return Err(err(
                        field("podCIDR"),
                        format!("{cidr} overlaps nodes[{j}].podCIDR {}", other.pod_cidr),
                    ));
                }
            }
            // Addresses: .1 is the gateway, the rest (minus broadcast) go to pods.
            let capacity = cidr.hosts().count().saturating_sub(1);
            if node.pods.len() > capacity {
                return Err(err(
                    field("pods"),
                    format!(
                        "{} pods do not fit in {cidr} ({capacity} addresses)",
                        node.pods.len()
                    ),
                ));
            }
            for (k, pod) in node.pods.iter().enumerate() {
                if !valid_name(pod) {
                    return Err(err(
                        format!("nodes[{i}].pods[{k}]"),
                        format!("{pod:?} {NAME_RULE}"),
                    ));
                }
                if !pod_names.insert(pod.clone()) {
                    return Err(err(
                        format!("nodes[{i}].pods[{k}]"),
                        format!("duplicate pod name {pod:?} (pod names are unique in a lab)"),
                    ));
                }
            }
        }
        Ok(())
    }

    /// The outside router's underlay address: the first host of the underlay (`.1`).
    pub fn router_ip(&self) -> Ipv4Addr {
        nth_host(self.underlay, 1).expect("a validated underlay has .1")
    }

    /// Node `index`'s (0-based) underlay address: host number 11, 12, … of the underlay.
    pub fn underlay_ip(&self, index: usize) -> Option<Ipv4Addr> {
        nth_host(self.underlay, 11 + index as u32)
    }

    pub fn node(&self, name: &str) -> Option<(usize, &Node)> {
        self.nodes.iter().enumerate().find(|(_, n)| n.name == name)
    }

    /// Every pod with its node, in topology order.
    pub fn pods(&self) -> impl Iterator<Item = (&Node, &str)> {
        self.nodes
            .iter()
            .flat_map(|n| n.pods.iter().map(move |p| (n, p.as_str())))
    }
}

/// Host number `n` of `net` (network address + n), if it is a usable host address.
fn nth_host(net: Ipv4Net, n: u32) -> Option<Ipv4Addr> {
    let base = u32::from(net.network());
    let addr = Ipv4Addr::from(base.checked_add(n)?);
    (net.contains(&addr) && addr != net.broadcast() && n != 0).then_some(addr)
}

/// Namespace names of a lab: everything is `wl-<lab>-…`.
pub mod names {
    pub fn prefix(lab: &str) -> String {
        format!("wl-{lab}-")
    }
    pub fn switch(lab: &str) -> String {
        format!("wl-{lab}-sw")
    }
    pub fn outside(lab: &str) -> String {
        format!("wl-{lab}-out")
    }
    pub fn node(lab: &str, node: &str) -> String {
        format!("wl-{lab}-{node}")
    }
    pub fn pod(lab: &str, node: &str, pod: &str) -> String {
        format!("wl-{lab}-{node}-{pod}")
    }

    /// What a namespace of `lab` stands for, recovered from its name alone.
    #[derive(Debug, Clone, PartialEq, Eq)]
    pub enum NsRole {
        Switch,
        Outside,
        Node(String),
        Pod { node: String, pod: String },
    }

    pub fn parse(lab: &str, ns: &str) -> Option<NsRole> {
        let rest = ns.strip_prefix(&prefix(lab))?;
        let parts: Vec<&str> = rest.split('-').collect();
        match parts.as_slice() {
            ["sw"] => Some(NsRole::Switch),
            ["out"] => Some(NsRole::Outside),
            [node] if !node.is_empty() => Some(NsRole::Node(node.to_string())),
            [node, pod] if !node.is_empty() && !pod.is_empty() => Some(NsRole::Pod {
                node: node.to_string(),
                pod: pod.to_string(),
            }),
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn with(replace: &str, by: &str) -> Result<Topology, TopologyError> {
        assert!(DEFAULT_TOPOLOGY.contains(replace), "{replace}");
        Topology::parse(&DEFAULT_TOPOLOGY.replacen(replace, by, 1))
    }

    #[test]
    fn default_parses() {
        let t = Topology::default_demo();
        assert_eq!(t.name, "demo");
        assert_eq!(t.cni, CniKind::Weir);
        assert_eq!(t.nodes.len(), 2);
        assert_eq!(
            t.pods()
                .map(|(n, p)| format!("{}/{p}", n.name))
                .collect::<Vec<_>>(),
            ["a/a1", "a/a2", "b/b1"]
        );
        // Round trip.
        assert_eq!(Topology::parse(&t.to_yaml()).unwrap(), t);
    }

    #[test]
    fn addresses() {
        let t = Topology::default_demo();
        assert_eq!(t.router_ip(), Ipv4Addr::new(172, 30, 0, 1));
        assert_eq!(t.underlay_ip(0), Some(Ipv4Addr::new(172, 30, 0, 11)));
        assert_eq!(t.underlay_ip(1), Some(Ipv4Addr::new(172, 30, 0, 12)));
        let small = with("172.30.0.0/24", "172.30.0.0/28").unwrap();
        assert_eq!(small.underlay_ip(3), Some(Ipv4Addr::new(172, 30, 0, 14)));
        assert_eq!(small.underlay_ip(4), None, ".15 is the broadcast address");
    }

    #[test]
    fn bad_cidr_names_the_field() {
        let e = with("podCIDR: 10.244.2.0/24", "podCIDR: 10.244.2.0/33").unwrap_err();
        assert_eq!(e.field, "nodes[1].podCIDR", "{e}");
        let e = with("underlay: 172.30.0.0/24", "underlay: banana").unwrap_err();
        assert_eq!(e.field, "underlay", "{e}");
        assert!(e.to_string().starts_with("topology: underlay: "), "{e}");
        let e = with("podCIDR: 10.244.2.0/24", "podCIDR: 10.244.2.1/24").unwrap_err();
        assert_eq!(e.field, "nodes[1].podCIDR");
        assert!(e.message.contains("host bits"), "{e}");
    }

    #[test]
    fn pod_cidr_outside_cluster_cidr() {
        let e = with("podCIDR: 10.244.2.0/24", "podCIDR: 10.245.2.0/24").unwrap_err();
        assert_eq!(e.field, "nodes[1].podCIDR");
        assert!(
            e.message.contains("not inside clusterCIDR 10.244.0.0/16"),
            "{e}"
        );
        let e = with("podCIDR: 10.244.2.0/24", "podCIDR: 10.244.1.0/25").unwrap_err();
        assert!(e.message.contains("overlaps nodes[0].podCIDR"), "{e}");
    }

    #[test]
    fn duplicates() {
        let e = with("name: b", "name: a").unwrap_err();
        assert_eq!(e.field, "nodes[1].name");
        assert!(e.message.contains("duplicate node name"), "{e}");
        let e = with("pods: [b1]", "pods: [a2]").unwrap_err();
        assert_eq!(e.field, "nodes[1].pods[0]");
        assert!(e.message.contains("duplicate pod name"), "{e}");
    }

    #[test]
    fn names_too_long_or_bad() {
        let e = with("name: demo", "name: abcdefghijk").unwrap_err();
        assert_eq!(e.field, "name");
        assert!(e.message.contains("1 to 10 characters"), "{e}");
        let e = with("pods: [a1, a2]", "pods: [a1, a-2]").unwrap_err();
        assert_eq!(e.field, "nodes[0].pods[1]");
        let e = with("name: b", "name: out").unwrap_err();
        assert!(e.message.contains("reserved"), "{e}");
    }

    #[test]
    fn unknown_and_missing_fields() {
        let e = with("outside: 198.51.100.1", "outside: 198.51.100.1\nextra: 1").unwrap_err();
        assert!(e.message.contains("unknown field `extra`"), "{e}");
        let e = with("    pods: [b1]", "    pods: [b1]\n    color: red").unwrap_err();
        assert_eq!(e.field, "nodes[1].color", "{e}");
        assert!(!e.message.contains("nodes[1]"), "{e}");
        assert!(e.message.contains("unknown field `color`"), "{e}");
        let e = with("cni: weir", "cni: calico").unwrap_err();
        assert_eq!(e.field, "cni", "{e}");
        let e = with("clusterCIDR: 10.244.0.0/16\n", "").unwrap_err();
        assert!(e.message.contains("missing field `clusterCIDR`"), "{e}");
    }

    #[test]
    fn outside_and_underlay_overlaps() {
        let e = with("outside: 198.51.100.1", "outside: 10.244.9.9").unwrap_err();
        assert_eq!(e.field, "outside");
        let e = with("underlay: 172.30.0.0/24", "underlay: 10.244.200.0/24").unwrap_err();
        assert_eq!(e.field, "underlay");
    }

    #[test]
    fn namespace_names_round_trip() {
        use names::*;
        assert_eq!(parse("x1", &switch("x1")), Some(NsRole::Switch));
        assert_eq!(parse("x1", &outside("x1")), Some(NsRole::Outside));
        assert_eq!(
            parse("x1", &node("x1", "a")),
            Some(NsRole::Node("a".into()))
        );
        assert_eq!(
            parse("x1", &pod("x1", "a", "a1")),
            Some(NsRole::Pod {
                node: "a".into(),
                pod: "a1".into()
            })
        );
        assert_eq!(parse("x", &pod("x1", "a", "a1")), None, "another lab");
        assert_eq!(parse("x1", "wl-x1-a-b-c"), None);
    }
}
