//! The facts about a Node that routing needs, read from the object (pure).

use std::net::IpAddr;

use ipnet::IpNet;
use weir_model::NodeInfo;

use crate::annotations::{Annotations, VtepData};

/// What one Node object says about reaching its pods.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeFacts {
    pub name: String,
    /// `spec.podCIDRs` (or the older `spec.podCIDR`), deduplicated, in the object's order.
    pub pod_cidrs: Vec<IpNet>,
    /// `status.addresses` of type `InternalIP`, in the object's order.
    pub internal_ips: Vec<IpAddr>,
    /// The backend the node announces (`<prefix>/backend-type`).
    pub backend_type: Option<String>,
    /// The node's VTEP (`<prefix>/backend-data`), for the vxlan backend.
    pub vtep: Option<VtepData>,
    /// `<prefix>/public-ip` and `<prefix>/public-ipv6`: the underlay addresses it tunnels from.
    pub public_ip: Option<IpAddr>,
    pub public_ipv6: Option<IpAddr>,
    /// Fields that were present but unreadable (reported per node, never fatal).
    pub problems: Vec<String>,
}

impl NodeFacts {
    /// Reads a Node; the annotations are looked up under `prefix` (e.g. `weir.dev`).
    pub fn from_node(node: &NodeInfo, prefix: &str) -> Self {
        let mut problems = Vec::new();
        let name = node.name.to_string();
        let mut pod_cidrs: Vec<IpNet> = Vec::new();
        for text in node.pod_cidrs.iter() {
            match text.parse::<IpNet>() {
                Ok(net) if !pod_cidrs.contains(&net.trunc()) => pod_cidrs.push(net.trunc()),
                Ok(_) => {}
                Err(_) => problems.push(format!("pod CIDR {text:?} is not a CIDR")),
            }
        }
        let mut internal_ips = Vec::new();
        for a in node.addresses.iter() {
            if &*a.type_ != "InternalIP" {
                continue;
            }
            match a.address.parse::<IpAddr>() {
                Ok(ip) => internal_ips.push(ip),
                Err(_) => problems.push(format!("InternalIP {:?} is not an address", a.address)),
            }
        }
        let annotations = &node.annotations;
        let keys = Annotations::new(prefix);
        let get = |key: &str| annotations.get(key).map(|v| v.trim().to_string());
        let vtep = get(&keys.backend_data()).and_then(|text| match VtepData::parse(&text) {
            Ok(v) => Some(v),
            Err(e) => {
                problems.push(format!("{}: {e}", keys.backend_data()));
                None
            }
        });
        let mut ip_annotation = |key: String| {
            get(&key).and_then(|text| match text.parse::<IpAddr>() {
                Ok(ip) => Some(ip),
                Err(_) => {
                    problems.push(format!("{key}: {text:?} is not an address"));
                    None
                }
            })
        };
        let public_ip = ip_annotation(keys.public_ip());
        let public_ipv6 = ip_annotation(keys.public_ipv6());
        NodeFacts {
            name,
            pod_cidrs,
            internal_ips,
            backend_type: get(&keys.backend_type()),
            vtep,
            public_ip,
            public_ipv6,
            problems,
        }
    }

    /// The first InternalIP of the family of `like`.
    pub fn internal_ip_like(&self, like: IpAddr) -> Option<IpAddr> {
        self.internal_ips
            .iter()
            .copied()
            .find(|ip| ip.is_ipv4() == like.is_ipv4())
    }

    /// The address this node's VTEP sends from, in the family of `like`: the `public-ip(v6)`
    /// annotation (flannel's meaning), else its InternalIP of that family.
    pub fn underlay_ip_like(&self, like: IpAddr) -> Option<IpAddr> {
        let published = if like.is_ipv4() {
            self.public_ip
        } else {
            self.public_ipv6
        };
        published
            .filter(|ip| ip.is_ipv4() == like.is_ipv4())
            .or_else(|| self.internal_ip_like(like))
    }
}
