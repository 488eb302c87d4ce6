//! What a running lab is made of, as recorded in `<state dir>/<lab>/state.json`.

use std::collections::BTreeMap;
use std::net::{Ipv4Addr, Ipv6Addr};
use std::path::{Path, PathBuf};

use anyhow::Context;
use serde::{Deserialize, Serialize};

use crate::addr::pod_gateway;
use crate::dualstack::nth6;
use crate::names;
use crate::topology::{
    Allocation, CniKind, Network, Protocol, ProxyKind, Service, ServiceType, SessionAffinity,
    Topology, TrafficPolicy,
};

/// The root of all labs' state: `${WEIR_LAB_STATE:-/run/weir-lab}`.
pub fn state_root() -> PathBuf {
    std::env::var_os("WEIR_LAB_STATE")
        .filter(|v| !v.is_empty())
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("/run/weir-lab"))
}

/// The files of one lab.
#[derive(Debug, Clone)]
pub struct LabDir {
    pub dir: PathBuf,
}

impl LabDir {
    pub fn new(root: &Path, lab: &str) -> Self {
        Self {
            dir: root.join(lab),
        }
    }
    pub fn topology(&self) -> PathBuf {
        self.dir.join("topology.yaml")
    }
    pub fn state(&self) -> PathBuf {
        self.dir.join("state.json")
    }
    pub fn node_cni(&self, node: &str) -> PathBuf {
        self.dir.join("nodes").join(node).join("cni")
    }
    pub fn ipam(&self, node: &str) -> PathBuf {
        self.node_cni(node).join("ipam")
    }
    pub fn log(&self, netns: &str) -> PathBuf {
        self.dir.join("logs").join(format!("{netns}.log"))
    }
    /// `weir proxy`'s log on a node (appended to across restarts).
    pub fn proxy_log(&self, node: &str) -> PathBuf {
        self.dir.join("logs").join(format!("proxy-{node}.log"))
    }
    /// A node proxy's `--state-dir` (last-known-good copies), inside the lab.
    pub fn proxy_state(&self, node: &str) -> PathBuf {
        self.dir.join("proxy-state").join(node)
    }
    /// `weir routes`' log on a node.
    pub fn routes_log(&self, node: &str) -> PathBuf {
        self.dir.join("logs").join(format!("routes-{node}.log"))
    }
    /// What a node's `weir routes` writes: its Node patch, status and the pod MTU file.
    pub fn routes_dir(&self, node: &str) -> PathBuf {
        self.dir.join("routes").join(node)
    }
    /// The pod MTU a node's `weir routes` writes (vxlan) and weir-cni reads there.
    pub fn routes_mtu(&self, node: &str) -> PathBuf {
        self.routes_dir(node).join("mtu")
    }
    /// `weir policy`'s log on a node.
    pub fn policy_log(&self, node: &str) -> PathBuf {
        self.dir.join("logs").join(format!("policy-{node}.log"))
    }
    /// The Kubernetes objects every node's proxy watches (the lab's "API server").
    pub fn manifests(&self) -> PathBuf {
        self.dir.join("manifests")
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct NodeState {
    pub name: String,
    pub netns: String,
    pub underlay_ip: Ipv4Addr,
    /// The pods' gateway (cni0's address): the source of traffic masqueraded towards local pods.
    #[serde(default = "unspecified")]
    pub pod_gateway: Ipv4Addr,
    /// What the node's `weir routes` published (its VTEP), merged into its Node object.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub annotations: BTreeMap<String, String>,
    /// vxlan overlay: the node's address on its VTEP (the first address of its pod CIDR, as
    /// flannel's `10.244.1.0` on `flannel.1`), the source it masquerades to towards other
    /// nodes' pods.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub vtep_ip: Option<Ipv4Addr>,
    /// Dual-stack labs: the node's IPv6 underlay address.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub underlay_ip6: Option<Ipv6Addr>,
    /// Dual-stack labs: the pods' IPv6 gateway (cni0's IPv6 address).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pod_gateway6: Option<Ipv6Addr>,
    /// Dual-stack vxlan labs: the node's IPv6 address on its VTEP (its IPv6 podCIDR's first
    /// address, `fd00:…::`), the source it masquerades to towards other nodes' pods.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub vtep_ip6: Option<Ipv6Addr>,
}

fn unspecified() -> Ipv4Addr {
    Ipv4Addr::UNSPECIFIED
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PodState {
    pub node: String,
    pub name: String,
    pub netns: String,
    pub ip: Ipv4Addr,
    pub prefix_len: u8,
    /// Dual-stack labs: the pod's IPv6 address.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ip6: Option<Ipv6Addr>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct EchoState {
    pub netns: String,
    pub name: String,
    pub pid: u32,
}

/// A running `weir proxy`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ProxyState {
    pub node: String,
    pub netns: String,
    pub pid: u32,
}

/// A service as the lab declared and allocated it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ServiceState {
    pub name: String,
    #[serde(rename = "type")]
    pub kind: ServiceType,
    pub protocol: Protocol,
    pub port: u16,
    pub cluster_ip: Ipv4Addr,
    /// Dual-stack labs: the IPv6 ClusterIP (the Service is PreferDualStack).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cluster_ip6: Option<Ipv6Addr>,
    pub node_port: Option<u16>,
    pub health_check_node_port: Option<u16>,
    pub load_balancer_ip: Option<Ipv4Addr>,
    pub load_balancer_node: Option<String>,
    pub external_traffic_policy: TrafficPolicy,
    pub session_affinity: SessionAffinity,
    /// Pod names.
    pub backends: Vec<String>,
}

impl ServiceState {
    pub fn new(svc: &Service, alloc: &Allocation) -> Self {
        Self {
            name: svc.name.clone(),
            kind: svc.kind,
            protocol: svc.protocol,
            port: svc.port,
            cluster_ip: alloc.cluster_ip,
            cluster_ip6: alloc.cluster_ip6,
            node_port: alloc.node_port,
            health_check_node_port: alloc.health_check_node_port,
            load_balancer_ip: alloc.load_balancer_ip,
            load_balancer_node: alloc.load_balancer_node.clone(),
            external_traffic_policy: svc.external_traffic_policy,
            session_affinity: svc.session_affinity,
            backends: svc.backends.clone(),
        }
    }

    pub fn local_policy(&self) -> bool {
        self.external_traffic_policy == TrafficPolicy::Local
    }

    pub fn sticky(&self) -> bool {
        self.session_affinity == SessionAffinity::ClientIP
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LabState {
    pub lab: String,
    pub cni: CniKind,
    #[serde(default)]
    pub network: Network,
    pub outside: Ipv4Addr,
    /// Dual-stack labs: the outside's IPv6 "internet" address.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub outside6: Option<Ipv6Addr>,
    pub nodes: Vec<NodeState>,
    pub pods: Vec<PodState>,
    pub echo: Vec<EchoState>,
    #[serde(default)]
    pub proxy: ProxyKind,
    #[serde(default)]
    pub services: Vec<ServiceState>,
    #[serde(default)]
    pub proxies: Vec<ProxyState>,
    /// The `weir routes` agents (bridge network), one per node.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub routes: Vec<ProxyState>,
    /// The `weir policy` agents (a topology with policies), one per node.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub policy_agents: Vec<ProxyState>,
    /// The outside's more addresses (`outsideAddresses`), which policy rows probe from.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub outside_addresses: Vec<Ipv4Addr>,
}

impl LabState {
    /// The state `up` would record for `topo`, without making anything: pod addresses are
    /// predicted (hosts 2, 3, … of the node's pod CIDR, in order, as both IPAMs hand them
    /// out on a fresh node). For tests and dry runs.
    pub fn simulated(topo: &Topology) -> Self {
        let alloc = topo.allocate().unwrap_or_default();
        let nodes = topo
            .nodes
            .iter()
            .enumerate()
            .map(|(i, n)| NodeState {
                name: n.name.clone(),
                netns: names::node(&topo.name, &n.name),
                underlay_ip: topo.underlay_ip(i).unwrap_or(Ipv4Addr::UNSPECIFIED),
                pod_gateway: pod_gateway(n.pod_cidr),
                annotations: BTreeMap::new(),
                vtep_ip: (topo.overlay == crate::topology::Overlay::Vxlan
                    && topo.network == Network::Bridge)
                    .then(|| n.pod_cidr.network()),
                underlay_ip6: topo.underlay_ip6(i),
                pod_gateway6: topo.pod_cidr6(n).and_then(|c| nth6(c, 1)),
                vtep_ip6: (topo.overlay == crate::topology::Overlay::Vxlan)
                    .then(|| topo.pod_cidr6(n).map(|c| c.network()))
                    .flatten(),
            })
            .collect();
        let mut pods = Vec::new();
        for n in &topo.nodes {
            for (k, p) in n.pods.iter().enumerate() {
                pods.push(PodState {
                    node: n.name.clone(),
                    name: p.clone(),
                    netns: names::pod(&topo.name, &n.name, p),
                    ip: (u32::from(n.pod_cidr.network()) + 2 + k as u32).into(),
                    prefix_len: match topo.network {
                        Network::Bridge => n.pod_cidr.prefix_len(),
                        Network::Eni => 32,
                    },
                    ip6: topo.pod_cidr6(n).and_then(|c| nth6(c, 2 + k as u128)),
                });
            }
        }
        LabState {
            lab: topo.name.clone(),
            cni: topo.cni,
            network: topo.network,
            outside: topo.outside,
            outside6: topo.ipv6.as_ref().map(|v6| v6.outside),
            nodes,
            pods,
            echo: vec![],
            proxy: topo.proxy,
            services: topo
                .services
                .iter()
                .zip(&alloc)
                .map(|(s, a)| ServiceState::new(s, a))
                .collect(),
            proxies: vec![],
            routes: vec![],
            policy_agents: vec![],
            outside_addresses: topo.outside_addresses.clone(),
        }
    }

    pub fn load(path: &Path) -> anyhow::Result<Self> {
        let text =
            std::fs::read_to_string(path).with_context(|| format!("read {}", path.display()))?;
        serde_json::from_str(&text).with_context(|| format!("parse {}", path.display()))
    }

    /// Writes atomically (temp file + rename), so a crash never leaves half a file.
    pub fn save(&self, path: &Path) -> anyhow::Result<()> {
        let tmp = path.with_extension("json.tmp");
        std::fs::write(&tmp, serde_json::to_vec_pretty(self)?)
            .with_context(|| format!("write {}", tmp.display()))?;
        std::fs::rename(&tmp, path).with_context(|| format!("rename to {}", path.display()))?;
        Ok(())
    }
}
