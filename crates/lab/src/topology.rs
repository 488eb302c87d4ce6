//! The lab's topology file: nodes, their pod CIDRs and pods, the underlay and the outside world.
//!
//! Parsing is strict (unknown keys are errors) and every error names the field it is about, e.g.
//! `nodes[1].podCIDR: 10.245.1.0/24 is not inside clusterCIDR 10.244.0.0/16`.

use std::collections::{BTreeMap, BTreeSet};
use std::net::Ipv4Addr;

use ipnet::Ipv4Net;
use serde::{Deserialize, Serialize};

use crate::addr::{dns_cluster_ip, nth_host, take_ip};
use crate::dualstack::Ipv6;
use crate::policy_spec::{self, PodMeta};

/// The two-node topology `weir lab demo` uses.
pub const DEFAULT_TOPOLOGY: &str = include_str!("../topologies/default.yaml");

/// The eni-shared topology `weir lab demo --topology eni` uses: the brief's cloud. Every node has
/// `eth0` on the underlay and an ENI (`eth1`, no address of its own unless weir's fix gives it
/// one) wired to the VPC router (the outside namespace), which delivers each ENI address to its
/// ENI and, with `sourceCheck`, drops packets whose source is not assigned to the interface they
/// left from. A node's podCIDR is the address block the cloud assigned to its ENI (like an AWS
/// prefix delegation): its first host is the ENI's own address, the rest go to pods;
/// clusterCIDR is the ENI subnet, whose first host is the ENI gateway.
pub const ENI_TOPOLOGY: &str = include_str!("../topologies/eni.yaml");

/// The routed-underlay topology `weir lab demo --topology vxlan` uses: every node on its own
/// underlay subnet (a /28 of `underlay` each), wired to the outside namespace, which routes
/// between them, so no node shares a segment with another and host-gw cannot work; `weir routes
/// --backend vxlan` on every node builds the overlay from the Node objects.
pub const VXLAN_TOPOLOGY: &str = include_str!("../topologies/vxlan.yaml");

/// The dual-stack topology `weir lab demo --topology dual-stack` uses: the default two nodes
/// with an `ipv6:` block, so every node, pod and Service has an IPv6 address beside its IPv4
/// one (crate::dualstack derives them) and `weir routes` routes both families host-gw.
pub const DUAL_STACK_TOPOLOGY: &str = include_str!("../topologies/dual-stack.yaml");

/// The NetworkPolicy lab `weir lab demo --topology policy` uses: bridge mode, pods in three
/// namespaces on two nodes, a default deny, a podSelector+namespaceSelector allow, an ipBlock
/// with an except and an egress policy ([`crate::netpol`] computes every row's expectation).
pub const POLICY_TOPOLOGY: &str = include_str!("../topologies/policy.yaml");

/// The same lab in eni-shared mode (`weir lab demo --topology policy-eni`).
pub const POLICY_ENI_TOPOLOGY: &str = include_str!("../topologies/policy-eni.yaml");

/// How nodes reach each other's pods: the backend of the `weir routes` agent every node runs
/// (bridge network only; in an eni network the VPC router delivers pod addresses).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "kebab-case")]
pub enum Overlay {
    /// Plain routes `<podCIDR> via <nodeIP>`: the nodes must share a segment.
    #[default]
    HostGw,
    /// A flannel-shaped VXLAN overlay (VNI 1, UDP 8472): any routed underlay.
    Vxlan,
}

impl Overlay {
    /// `weir routes --backend` (and flannel's backend-type).
    pub fn as_str(self) -> &'static str {
        match self {
            Overlay::HostGw => "host-gw",
            Overlay::Vxlan => "vxlan",
        }
    }
}

/// How pods are wired to the network.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum Network {
    /// weir-cni bridge mode, per-node pod CIDRs routed host-gw over the underlay.
    #[default]
    Bridge,
    /// weir-cni eni-shared mode: each node's pods share an addressless secondary ENI.
    Eni,
}

impl Network {
    pub fn as_str(self) -> &'static str {
        match self {
            Network::Bridge => "bridge",
            Network::Eni => "eni",
        }
    }
}

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

/// Which service proxy the lab runs on every node.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "kebab-case")]
pub enum ProxyKind {
    /// `weir proxy --proxy-mode nftables`.
    #[default]
    Nftables,
    /// `weir proxy --proxy-mode iptables`.
    Iptables,
    /// `weir proxy --proxy-mode userspace` (not in [`ProxyKind::ALL`]: the matrix runs the
    /// kernel datapaths).
    Userspace,
    /// `weir proxy --proxy-mode ipvs`; needs a kernel with IPVS and `dummy` (the qemu VM,
    /// docs/vm.md), so not in [`ProxyKind::ALL`] either.
    Ipvs,
    /// No `weir proxy`: upstream kube-proxy's iptables-mode rules, written once
    /// ([`crate::kube_proxy`]).
    KubeProxyIptables,
    /// Upstream kube-proxy's nftables-mode rules (table `ip kube-proxy`), written once.
    KubeProxyNftables,
    /// Upstream kube-proxy's ipvs-mode rules (`kube-ipvs0`, ipsets, IPVS virtual servers);
    /// needs a kernel with IPVS and `dummy`.
    KubeProxyIpvs,
    /// No proxy: services are written as manifests but nothing serves them.
    None,
}

impl ProxyKind {
    pub const ALL: [ProxyKind; 6] = [
        ProxyKind::Nftables,
        ProxyKind::Iptables,
        ProxyKind::KubeProxyIptables,
        ProxyKind::KubeProxyNftables,
        ProxyKind::KubeProxyIpvs,
        ProxyKind::None,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            ProxyKind::Nftables => "nftables",
            ProxyKind::Iptables => "iptables",
            ProxyKind::Userspace => "userspace",
            ProxyKind::Ipvs => "ipvs",
            ProxyKind::KubeProxyIptables => "kube-proxy-iptables",
            ProxyKind::KubeProxyNftables => "kube-proxy-nftables",
            ProxyKind::KubeProxyIpvs => "kube-proxy-ipvs",
            ProxyKind::None => "none",
        }
    }

    /// The proxy's name if something serves the lab's services.
    pub fn mode(self) -> Option<&'static str> {
        (self != ProxyKind::None).then(|| self.as_str())
    }

    /// The `--proxy-mode` of `weir proxy`, if the lab runs it.
    pub fn weir_mode(self) -> Option<&'static str> {
        matches!(
            self,
            ProxyKind::Nftables | ProxyKind::Iptables | ProxyKind::Userspace | ProxyKind::Ipvs
        )
        .then(|| self.as_str())
    }

    /// Whether the lab writes upstream kube-proxy's rules instead of running a proxy (which
    /// mode: [`crate::kube_proxy::Mode::of`]).
    pub fn is_kube_proxy(self) -> bool {
        matches!(
            self,
            ProxyKind::KubeProxyIptables | ProxyKind::KubeProxyNftables | ProxyKind::KubeProxyIpvs
        )
    }

    /// For humans: "weir proxy, nftables mode" / "kube-proxy-shaped ipvs rules".
    pub fn describe(self) -> String {
        match (self.weir_mode(), self.is_kube_proxy()) {
            (Some(m), _) => format!("weir proxy, {m} mode"),
            (None, true) => format!(
                "upstream kube-proxy's {} rules, static",
                self.as_str().trim_start_matches("kube-proxy-")
            ),
            _ => "no proxy".into(),
        }
    }
}

impl std::str::FromStr for ProxyKind {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        ProxyKind::ALL
            .into_iter()
            .find(|k| k.as_str() == s)
            .ok_or_else(|| {
                let names: Vec<&str> = ProxyKind::ALL.iter().map(|k| k.as_str()).collect();
                format!("unknown proxy {s:?} ({})", names.join(", "))
            })
    }
}

fn yes() -> bool {
    true
}

fn default_service_cidr() -> Ipv4Net {
    "10.96.0.0/16".parse().expect("valid")
}

fn default_lb_cidr() -> Ipv4Net {
    "203.0.113.0/24".parse().expect("valid")
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
    /// How pods are wired (default bridge).
    #[serde(default, skip_serializing_if = "is_default")]
    pub network: Network,
    /// eni network only: whether weir's fix is in place (default true); false removes it after
    /// the pods are added, to show the failure it prevents.
    #[serde(rename = "eniFix", default = "yes")]
    pub eni_fix: bool,
    /// eni network only: the VPC router's source check (default true).
    #[serde(rename = "sourceCheck", default = "yes")]
    pub source_check: bool,
    /// The proxy every node runs (default nftables).
    #[serde(default)]
    pub proxy: ProxyKind,
    /// The `weir routes` backend every node runs (bridge network; default host-gw).
    #[serde(default, skip_serializing_if = "is_default")]
    pub overlay: Overlay,
    /// Each node on its own underlay subnet (the (i+1)-th /28 of `underlay`, wired to the
    /// outside namespace, which routes between them) instead of one shared segment.
    #[serde(rename = "routedUnderlay", default, skip_serializing_if = "is_default")]
    pub routed_underlay: bool,
    /// Where ClusterIPs come from.
    #[serde(rename = "serviceCIDR", default = "default_service_cidr")]
    pub service_cidr: Ipv4Net,
    /// Where LoadBalancer ingress IPs come from (the outside routes each via a node).
    #[serde(rename = "loadBalancerCIDR", default = "default_lb_cidr")]
    pub lb_cidr: Ipv4Net,
    /// Cluster DNS ([`crate::dns`]): `weir dns` behind serviceCIDR host 10 (default false);
    /// `node-local` adds a node-local cache the pods ask instead.
    #[serde(default, skip_serializing_if = "is_default")]
    pub dns: Dns,
    /// Dual-stack: the IPv6 networks (crate::dualstack). Absent, the lab is IPv4-only.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ipv6: Option<Ipv6>,
    pub nodes: Vec<Node>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub services: Vec<Service>,
    /// NetworkPolicy ([`crate::policy_spec`]): the labels of the lab's namespaces (`default`
    /// needs no entry).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub namespaces: BTreeMap<String, BTreeMap<String, String>>,
    /// Each pod's namespace and labels (default: namespace `default`, no labels).
    #[serde(
        rename = "podMetadata",
        default,
        skip_serializing_if = "BTreeMap::is_empty"
    )]
    pub pod_metadata: BTreeMap<String, PodMeta>,
    /// NetworkPolicy objects (`networking.k8s.io/v1`, as `kubectl apply` takes them). Any:
    /// the lab writes Namespaces, Pods and these, and runs `weir policy` on every node.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub policies: Vec<serde_json::Value>,
    /// More addresses of the outside world (on its `lo`), which the policy rows probe
    /// NodePorts from too (an `ipBlock` `except`); a topology with policies only.
    #[serde(
        rename = "outsideAddresses",
        default,
        skip_serializing_if = "Vec::is_empty"
    )]
    pub outside_addresses: Vec<Ipv4Addr>,
}

/// The lab's cluster DNS (`dns:`): `false` (none), `true` or `cluster-ip` (pods' resolv.conf
/// names the DNS Service's ClusterIP), or `node-local` (the same, plus `weir dns` on
/// 169.254.20.10 on every node, NOTRACKed, which the pods' resolv.conf names instead, as
/// kubelet `--cluster-dns` does with NodeLocal DNSCache).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Dns {
    #[default]
    Off,
    ClusterIp,
    NodeLocal,
}

impl Dns {
    /// Whether the lab runs cluster DNS at all.
    pub fn on(self) -> bool {
        self != Dns::Off
    }
}

impl Serialize for Dns {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match self {
            Dns::Off => s.serialize_bool(false),
            Dns::ClusterIp => s.serialize_bool(true),
            Dns::NodeLocal => s.serialize_str("node-local"),
        }
    }
}

impl<'de> Deserialize<'de> for Dns {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        #[derive(Deserialize)]
        #[serde(untagged)]
        enum Raw {
            Bool(bool),
            Text(String),
        }
        match Raw::deserialize(d)? {
            Raw::Bool(false) => Ok(Dns::Off),
            Raw::Bool(true) => Ok(Dns::ClusterIp),
            Raw::Text(t) if t == "cluster-ip" => Ok(Dns::ClusterIp),
            Raw::Text(t) if t == "node-local" => Ok(Dns::NodeLocal),
            Raw::Text(t) => Err(serde::de::Error::custom(format!(
                "dns: {t:?} is not one of true, false, cluster-ip, node-local"
            ))),
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
pub enum ServiceType {
    #[default]
    ClusterIP,
    NodePort,
    LoadBalancer,
}

impl ServiceType {
    pub fn as_str(self) -> &'static str {
        match self {
            ServiceType::ClusterIP => "ClusterIP",
            ServiceType::NodePort => "NodePort",
            ServiceType::LoadBalancer => "LoadBalancer",
        }
    }
    /// NodePort and LoadBalancer services have node ports.
    pub fn has_node_port(self) -> bool {
        self != ServiceType::ClusterIP
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "UPPERCASE")]
pub enum Protocol {
    #[default]
    Tcp,
    Udp,
}

impl Protocol {
    /// Kubernetes' spelling.
    pub fn as_k8s(self) -> &'static str {
        match self {
            Protocol::Tcp => "TCP",
            Protocol::Udp => "UDP",
        }
    }
    pub fn as_str(self) -> &'static str {
        match self {
            Protocol::Tcp => "tcp",
            Protocol::Udp => "udp",
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
pub enum TrafficPolicy {
    #[default]
    Cluster,
    Local,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
pub enum SessionAffinity {
    #[default]
    None,
    ClientIP,
}

fn is_default<T: Default + PartialEq>(v: &T) -> bool {
    *v == T::default()
}

/// A service of the lab: one port, served by the echo servers (port 8080) of `backends`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct Service {
    pub name: String,
    #[serde(rename = "type", default, skip_serializing_if = "is_default")]
    pub kind: ServiceType,
    pub port: u16,
    #[serde(default, skip_serializing_if = "is_default")]
    pub protocol: Protocol,
    /// Pod names; empty: a service without endpoints.
    #[serde(default)]
    pub backends: Vec<String>,
    /// Default: the next free address of serviceCIDR.
    #[serde(rename = "clusterIP", default, skip_serializing_if = "Option::is_none")]
    pub cluster_ip: Option<Ipv4Addr>,
    /// NodePort and LoadBalancer only; default: the next free port from 30000.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node_port: Option<u16>,
    #[serde(default, skip_serializing_if = "is_default")]
    pub external_traffic_policy: TrafficPolicy,
    #[serde(default, skip_serializing_if = "is_default")]
    pub session_affinity: SessionAffinity,
    /// LoadBalancer only; default: the next free address of loadBalancerCIDR.
    #[serde(
        rename = "loadBalancerIP",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub load_balancer_ip: Option<Ipv4Addr>,
}

/// What the lab assigns to a service (what an API server and a cloud LB would).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Allocation {
    pub cluster_ip: Ipv4Addr,
    /// Dual-stack labs: the IPv6 ClusterIP beside it (crate::dualstack).
    pub cluster_ip6: Option<std::net::Ipv6Addr>,
    pub node_port: Option<u16>,
    /// LoadBalancer with externalTrafficPolicy Local only.
    pub health_check_node_port: Option<u16>,
    pub load_balancer_ip: Option<Ipv4Addr>,
    /// The node the outside routes the LoadBalancer IP through (MetalLB L2 style): the first
    /// node hosting a backend, else the first node.
    pub load_balancer_node: Option<String>,
}

/// The NodePort range (kube-apiserver's default).
pub const NODE_PORT_RANGE: std::ops::RangeInclusive<u16> = 30000..=32767;

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

/// Service names: a DNS-1035 label of at most 30 characters.
pub fn valid_service_name(name: &str) -> bool {
    (1..=30).contains(&name.len())
        && name.starts_with(|c: char| c.is_ascii_lowercase())
        && !name.ends_with('-')
        && name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
}

fn overlaps(a: &Ipv4Net, b: &Ipv4Net) -> bool {
    a.contains(&b.network()) || b.contains(&a.network())
}

/// Node names that would collide with the lab's own namespaces.
const RESERVED_NODE_NAMES: [&str; 2] = ["sw", "out"];

impl Topology {
    /// Parses and validates a topology file.
    pub fn parse(yaml: &str) -> Result<Self, TopologyError> {
        let topo: Topology = weir_source::yaml::decode(yaml).map_err(|e| {
            match (e.field, e.not_a_mapping) {
                (None, Some(what)) => {
                    let first = e
                        .line
                        .map(|(n, start)| format!("; line {n}: {start:?}"))
                        .unwrap_or_default();
                    err(
                        ".",
                        format!("not a topology (a YAML mapping of fields): the file reads as {what}{first}"),
                    )
                }
                (field, _) => err(field.unwrap_or_else(|| ".".into()), e.message),
            }
        })?;
        topo.validate()?;
        Ok(topo)
    }

    /// The embedded two-node topology.
    pub fn default_demo() -> Self {
        Self::parse(DEFAULT_TOPOLOGY).expect("the embedded topology is valid")
    }

    /// The embedded eni-shared topology.
    pub fn eni_demo() -> Self {
        Self::parse(ENI_TOPOLOGY).expect("the embedded eni topology is valid")
    }

    /// The embedded routed-underlay vxlan topology.
    pub fn vxlan_demo() -> Self {
        Self::parse(VXLAN_TOPOLOGY).expect("the embedded vxlan topology is valid")
    }

    /// The embedded dual-stack topology.
    pub fn dual_stack_demo() -> Self {
        Self::parse(DUAL_STACK_TOPOLOGY).expect("the embedded dual-stack topology is valid")
    }

    /// The embedded NetworkPolicy topology (bridge mode).
    pub fn policy_demo() -> Self {
        Self::parse(POLICY_TOPOLOGY).expect("the embedded policy topology is valid")
    }

    /// The embedded NetworkPolicy topology in eni-shared mode.
    pub fn policy_eni_demo() -> Self {
        Self::parse(POLICY_ENI_TOPOLOGY).expect("the embedded policy-eni topology is valid")
    }

    /// A node's IPv6 podCIDR (dual-stack labs).
    pub fn pod_cidr6(&self, node: &Node) -> Option<ipnet::Ipv6Net> {
        self.ipv6
            .as_ref()?
            .pod_cidr(self.cluster_cidr, node.pod_cidr)
    }

    /// Node `index`'s IPv6 underlay address (dual-stack labs): the host number of its IPv4 one.
    pub fn underlay_ip6(&self, index: usize) -> Option<std::net::Ipv6Addr> {
        self.ipv6
            .as_ref()?
            .underlay_ip(self.underlay, self.underlay_ip(index)?)
    }

    /// The IPv6 ClusterIP beside IPv4 ClusterIP `v4` (dual-stack labs).
    pub fn cluster_ip6(&self, v4: Ipv4Addr) -> Option<std::net::Ipv6Addr> {
        self.ipv6.as_ref()?.cluster_ip(self.service_cidr, v4)
    }

    /// Dual-stack only where every part of the lab has IPv6: why not, as (field, message).
    fn validate_ipv6(&self) -> Result<(), TopologyError> {
        let Some(v6) = &self.ipv6 else {
            return Ok(());
        };
        if self.network == Network::Eni {
            return Err(err(
                "ipv6",
                "network eni is IPv4-only (weir-cni's eni-shared mode and the VPC router have no \
                 IPv6): remove ipv6, or use network: bridge",
            ));
        }
        if self.routed_underlay {
            return Err(err(
                "ipv6",
                "routedUnderlay is IPv4-only (the outside routes the node subnets in IPv4): use \
                 one shared underlay",
            ));
        }
        if self.cni != CniKind::Weir {
            return Err(err(
                "ipv6",
                "the dual-stack lab runs weir-cni only (cni: weir)",
            ));
        }
        if self.proxy.is_kube_proxy() {
            return Err(err(
                "ipv6",
                format!(
                    "{} is IPv4-only in the lab: use a weir proxy mode",
                    self.proxy.as_str()
                ),
            ));
        }
        v6.check(self.underlay, self.service_cidr)
            .map_err(|(f, m)| err(format!("ipv6.{f}"), m))?;
        for (i, node) in self.nodes.iter().enumerate() {
            if self.pod_cidr6(node).is_none() {
                return Err(err(
                    format!("nodes[{i}].podCIDR"),
                    format!(
                        "{} has no IPv6 counterpart: ipv6.clusterCIDR {} has no /{} block number {}",
                        node.pod_cidr,
                        v6.cluster_cidr,
                        v6.pod_prefix,
                        (u32::from(node.pod_cidr.network()) - u32::from(self.cluster_cidr.network()))
                            >> (32 - node.pod_cidr.prefix_len())
                    ),
                ));
            }
        }
        Ok(())
    }

    /// The ENI subnet's gateway (eni network): the first host of clusterCIDR, on the VPC router.
    pub fn eni_gateway(&self) -> Ipv4Addr {
        nth_host(self.cluster_cidr, 1).expect("a validated clusterCIDR has .1")
    }

    /// The addresses the cloud assigned to `node`'s ENI (eni network): every host of its podCIDR,
    /// the first being the ENI's own.
    pub fn eni_addresses(node: &Node) -> Vec<Ipv4Addr> {
        node.pod_cidr.hosts().collect()
    }

    pub fn to_yaml(&self) -> String {
        weir_source::yaml::to_string(self).expect("a topology serializes")
    }

    pub fn validate(&self) -> Result<(), TopologyError> {
        self.validate_addressing()?;
        let pod_names = self.validate_nodes()?;
        self.validate_network()?;
        self.validate_ipv6()?;
        self.validate_services(&pod_names)?;
        self.validate_policy(&pod_names)?;
        self.allocate()?;
        self.validate_dns()
    }

    /// The lab's name, the underlay, clusterCIDR and the outside address: well-formed and
    /// apart.
    fn validate_addressing(&self) -> Result<(), TopologyError> {
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
        Ok(())
    }

    /// Every node and its pods; the pod names (unique in the lab).
    fn validate_nodes(&self) -> Result<BTreeSet<String>, TopologyError> {
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
            self.validate_pod_cidr(i)?;
            validate_pods(i, node, &mut pod_names)?;
        }
        Ok(pod_names)
    }

    /// Node `i`'s podCIDR: a network inside clusterCIDR, room for pods, no overlap with an
    /// earlier node's.
    fn validate_pod_cidr(&self, i: usize) -> Result<(), TopologyError> {
        let field = |f: &str| format!("nodes[{i}].{f}");
        let cidr = self.nodes[i].pod_cidr;
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
            if other.pod_cidr.contains(&cidr.network()) || cidr.contains(&other.pod_cidr.network())
            {
                return Err(err(
                    field("podCIDR"),
                    format!("{cidr} overlaps nodes[{j}].podCIDR {}", other.pod_cidr),
                ));
            }
        }
        Ok(())
    }

    /// What the overlay and the eni network need of each other and of the CNI.
    fn validate_network(&self) -> Result<(), TopologyError> {
        if self.routed_underlay
            && self.overlay == Overlay::HostGw
            && self.network == Network::Bridge
        {
            return Err(err(
                "overlay",
                "host-gw needs the nodes on one segment; with routedUnderlay use overlay: vxlan",
            ));
        }
        if self.network != Network::Eni {
            return Ok(());
        }
        if self.cni != CniKind::Weir {
            return Err(err(
                "cni",
                "network eni needs cni weir (the reference plugins have no eni-shared mode)",
            ));
        }
        if self.overlay != Overlay::HostGw || self.routed_underlay {
            return Err(err(
                "overlay",
                "network eni routes pod addresses in the VPC: no overlay, no routedUnderlay",
            ));
        }
        let gw = self.eni_gateway();
        if let Some(i) = self.nodes.iter().position(|n| n.pod_cidr.contains(&gw)) {
            return Err(err(
                format!("nodes[{i}].podCIDR"),
                format!("contains {gw}, the ENI subnet's gateway (first host of clusterCIDR)"),
            ));
        }
        Ok(())
    }

    /// `dns: true` needs a proxy and host 10 of serviceCIDR, which no Service may claim.
    fn validate_dns(&self) -> Result<(), TopologyError> {
        if !self.dns.on() {
            return Ok(());
        }
        if self.proxy.mode().is_none() {
            return Err(err(
                "dns",
                "the DNS Service's ClusterIP needs a proxy (proxy: none)",
            ));
        }
        if self.service_cidr.prefix_len() > 28 {
            return Err(err(
                "dns",
                format!(
                    "serviceCIDR {} has no host 10 for the DNS Service",
                    self.service_cidr
                ),
            ));
        }
        let dns_ip = dns_cluster_ip(self.service_cidr);
        if let Some(i) = self
            .services
            .iter()
            .position(|s| s.cluster_ip == Some(dns_ip))
        {
            return Err(err(
                format!("services[{i}].clusterIP"),
                format!("{dns_ip} is the DNS Service's (dns: true)"),
            ));
        }
        Ok(())
    }

    fn validate_policy(&self, pods: &BTreeSet<String>) -> Result<(), TopologyError> {
        policy_spec::validate(&policy_spec::Parts {
            namespaces: &self.namespaces,
            pod_metadata: &self.pod_metadata,
            policies: &self.policies,
            outside_addresses: &self.outside_addresses,
            pods,
        })
        .map_err(|(f, m)| err(f, m))?;
        for (i, a) in self.outside_addresses.iter().enumerate() {
            let taken = [
                self.cluster_cidr,
                self.underlay,
                self.service_cidr,
                self.lb_cidr,
            ]
            .iter()
            .any(|n| n.contains(a));
            if taken || *a == self.outside {
                return Err(err(
                    format!("outsideAddresses[{i}]"),
                    format!(
                        "{a} must be outside clusterCIDR, underlay, serviceCIDR and \
                         loadBalancerCIDR, and not `outside` itself"
                    ),
                ));
            }
        }
        Ok(())
    }

    /// Whether the lab enforces NetworkPolicy (its topology has policies).
    pub fn enforces_policy(&self) -> bool {
        !self.policies.is_empty()
    }

    /// A pod's namespace and labels (`podMetadata`, else namespace `default` and none).
    pub fn pod_meta(&self, pod: &str) -> PodMeta {
        self.pod_metadata
            .get(pod)
            .cloned()
            .unwrap_or_else(|| PodMeta {
                namespace: policy_spec::DEFAULT_NAMESPACE.into(),
                labels: BTreeMap::new(),
            })
    }

    fn validate_services(&self, pods: &BTreeSet<String>) -> Result<(), TopologyError> {
        self.validate_service_networks()?;
        let mut taken = TakenByServices::default();
        for (i, svc) in self.services.iter().enumerate() {
            validate_service_basics(i, svc, pods, &mut taken.names)?;
            self.validate_cluster_ip(i, svc, &mut taken.cluster_ips)?;
            validate_node_port(i, svc, &mut taken.node_ports)?;
            if svc.external_traffic_policy == TrafficPolicy::Local && !svc.kind.has_node_port() {
                return Err(err(
                    format!("services[{i}].externalTrafficPolicy"),
                    "Local applies to NodePort and LoadBalancer services only",
                ));
            }
            self.validate_load_balancer_ip(i, svc, &mut taken.lb_ips)?;
        }
        Ok(())
    }

    /// serviceCIDR and loadBalancerCIDR: networks with room, apart from each other, from
    /// clusterCIDR and the underlay, and not holding the outside address.
    fn validate_service_networks(&self) -> Result<(), TopologyError> {
        let nets = [
            ("clusterCIDR", self.cluster_cidr),
            ("underlay", self.underlay),
            ("serviceCIDR", self.service_cidr),
            ("loadBalancerCIDR", self.lb_cidr),
        ];
        for (i, (field, net)) in nets.iter().enumerate().skip(2) {
            if net.addr() != net.network() {
                return Err(err(*field, format!("{net} has host bits set")));
            }
            if net.prefix_len() > 30 {
                return Err(err(*field, format!("{net} is too small (at most /30)")));
            }
            for (other_field, other) in &nets[..i] {
                if overlaps(net, other) {
                    return Err(err(*field, format!("{net} overlaps {other_field} {other}")));
                }
            }
            if net.contains(&self.outside) {
                return Err(err(
                    "outside",
                    format!("{} must be outside {field} {net}", self.outside),
                ));
            }
        }
        Ok(())
    }

    /// Service `i`'s clusterIP, if given: a host of serviceCIDR no other service has.
    fn validate_cluster_ip(
        &self,
        i: usize,
        svc: &Service,
        taken: &mut BTreeMap<Ipv4Addr, usize>,
    ) -> Result<(), TopologyError> {
        let Some(ip) = svc.cluster_ip else {
            return Ok(());
        };
        let field = format!("services[{i}].clusterIP");
        let net = self.service_cidr;
        if !net.contains(&ip) || ip == net.network() || ip == net.broadcast() {
            return Err(err(
                field,
                format!("{ip} is not a host address of serviceCIDR {net}"),
            ));
        }
        if let Some(j) = taken.insert(ip, i) {
            return Err(err(
                field,
                format!("{ip} is already services[{j}].clusterIP"),
            ));
        }
        Ok(())
    }

    /// Service `i`'s loadBalancerIP, if given: a LoadBalancer's, a host of loadBalancerCIDR no
    /// other service has.
    fn validate_load_balancer_ip(
        &self,
        i: usize,
        svc: &Service,
        taken: &mut BTreeMap<Ipv4Addr, usize>,
    ) -> Result<(), TopologyError> {
        let Some(ip) = svc.load_balancer_ip else {
            return Ok(());
        };
        let field = format!("services[{i}].loadBalancerIP");
        if svc.kind != ServiceType::LoadBalancer {
            return Err(err(
                field,
                format!(
                    "only LoadBalancer services have one, not {}",
                    svc.kind.as_str()
                ),
            ));
        }
        let net = self.lb_cidr;
        if !net.contains(&ip) || ip == net.network() || ip == net.broadcast() {
            return Err(err(
                field,
                format!("{ip} is not a host address of loadBalancerCIDR {net}"),
            ));
        }
        if let Some(j) = taken.insert(ip, i) {
            return Err(err(
                field,
                format!("{ip} is already services[{j}].loadBalancerIP"),
            ));
        }
        Ok(())
    }

    /// ClusterIPs, node ports and LoadBalancer IPs of every service (in `services` order):
    /// explicit values first, the rest allocated in order from serviceCIDR (host 1 up), the
    /// node port range (30000 up) and loadBalancerCIDR (host 1 up). Deterministic.
    pub fn allocate(&self) -> Result<Vec<Allocation>, TopologyError> {
        let mut used_ips: BTreeSet<Ipv4Addr> =
            self.services.iter().filter_map(|s| s.cluster_ip).collect();
        if self.dns.on() {
            used_ips.insert(dns_cluster_ip(self.service_cidr));
        }
        let mut used_ports: BTreeSet<u16> =
            self.services.iter().filter_map(|s| s.node_port).collect();
        let mut used_lb: BTreeSet<Ipv4Addr> = self
            .services
            .iter()
            .filter_map(|s| s.load_balancer_ip)
            .collect();
        let mut next_ip = 1u32;
        let mut next_port = *NODE_PORT_RANGE.start();
        let mut next_lb = 1u32;
        let mut out = Vec::new();
        for (i, svc) in self.services.iter().enumerate() {
            let field = |f: &str| format!("services[{i}].{f}");
            let cluster_ip = match svc.cluster_ip {
                Some(ip) => ip,
                None => {
                    take_ip(self.service_cidr, &mut next_ip, &mut used_ips).ok_or_else(|| {
                        err(
                            field("clusterIP"),
                            format!("serviceCIDR {} is exhausted", self.service_cidr),
                        )
                    })?
                }
            };
            let mut take_port = || -> Result<u16, TopologyError> {
                while NODE_PORT_RANGE.contains(&next_port) {
                    let p = next_port;
                    next_port += 1;
                    if used_ports.insert(p) {
                        return Ok(p);
                    }
                }
                Err(err(field("nodePort"), "the node port range is exhausted"))
            };
            let node_port = match (svc.kind.has_node_port(), svc.node_port) {
                (false, _) => None,
                (true, Some(p)) => Some(p),
                (true, None) => Some(take_port()?),
            };
            let lb = svc.kind == ServiceType::LoadBalancer;
            let health_check_node_port =
                if lb && svc.external_traffic_policy == TrafficPolicy::Local {
                    Some(take_port()?)
                } else {
                    None
                };
            let load_balancer_ip = match (lb, svc.load_balancer_ip) {
                (false, _) => None,
                (true, Some(ip)) => Some(ip),
                (true, None) => Some(
                    take_ip(self.lb_cidr, &mut next_lb, &mut used_lb).ok_or_else(|| {
                        err(
                            field("loadBalancerIP"),
                            format!("loadBalancerCIDR {} is exhausted", self.lb_cidr),
                        )
                    })?,
                ),
            };
            let load_balancer_node = lb.then(|| {
                self.nodes
                    .iter()
                    .find(|n| n.pods.iter().any(|p| svc.backends.contains(p)))
                    .unwrap_or(&self.nodes[0])
                    .name
                    .clone()
            });
            out.push(Allocation {
                cluster_ip,
                cluster_ip6: self.cluster_ip6(cluster_ip),
                node_port,
                health_check_node_port,
                load_balancer_ip,
                load_balancer_node,
            });
        }
        Ok(out)
    }

    /// The node a pod runs on.
    pub fn node_of_pod(&self, pod: &str) -> Option<&Node> {
        self.nodes.iter().find(|n| n.pods.iter().any(|p| p == pod))
    }

    /// The outside's address on the switch: the first host of the underlay (`.1`); with a
    /// shared underlay also every node's default router.
    pub fn router_ip(&self) -> Ipv4Addr {
        nth_host(self.outside_net(), 1).expect("a validated underlay has .1")
    }

    /// The subnet of the outside's switch port: the whole underlay, or (routed) its first /28.
    pub fn outside_net(&self) -> Ipv4Net {
        if self.routed_underlay {
            self.routed_block(0).unwrap_or(self.underlay)
        } else {
            self.underlay
        }
    }

    /// The `n`-th /28 of the underlay.
    fn routed_block(&self, n: usize) -> Option<Ipv4Net> {
        self.underlay.subnets(28).ok()?.nth(n)
    }

    /// The underlay subnet node `index` sits on: the shared underlay, or (routed) the
    /// (index+1)-th /28 of it, its own.
    pub fn node_subnet(&self, index: usize) -> Option<Ipv4Net> {
        if self.routed_underlay {
            self.routed_block(index + 1)
        } else {
            Some(self.underlay)
        }
    }

    /// Node `index`'s (0-based) underlay address: host number 11, 12, … of the shared underlay,
    /// or (routed) host 2 of its own subnet.
    pub fn underlay_ip(&self, index: usize) -> Option<Ipv4Addr> {
        if self.routed_underlay {
            nth_host(self.node_subnet(index)?, 2)
        } else {
            nth_host(self.underlay, 11 + index as u32)
        }
    }

    /// Node `index`'s default router: the outside's address on the node's subnet.
    pub fn node_router(&self, index: usize) -> Option<Ipv4Addr> {
        if self.routed_underlay {
            nth_host(self.node_subnet(index)?, 1)
        } else {
            Some(self.router_ip())
        }
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

/// What one service claims that no other may: its name, clusterIP, nodePort, loadBalancerIP
/// (each with the index of the service that claimed it).
#[derive(Default)]
struct TakenByServices {
    names: BTreeSet<String>,
    cluster_ips: BTreeMap<Ipv4Addr, usize>,
    node_ports: BTreeMap<u16, usize>,
    lb_ips: BTreeMap<Ipv4Addr, usize>,
}

/// Service `i`'s name (valid, not taken), port and backends (pods of the lab, each once).
fn validate_service_basics(
    i: usize,
    svc: &Service,
    pods: &BTreeSet<String>,
    names: &mut BTreeSet<String>,
) -> Result<(), TopologyError> {
    let field = |f: &str| format!("services[{i}].{f}");
    if !valid_service_name(&svc.name) {
        return Err(err(
            field("name"),
            format!(
                "{:?} must be 1 to 30 characters from [a-z0-9-], starting with a letter, \
                 not ending with -",
                svc.name
            ),
        ));
    }
    if !names.insert(svc.name.clone()) {
        return Err(err(
            field("name"),
            format!("duplicate service name {:?}", svc.name),
        ));
    }
    if svc.port == 0 {
        return Err(err(field("port"), "must be 1 to 65535"));
    }
    let mut seen = BTreeSet::new();
    for (k, b) in svc.backends.iter().enumerate() {
        if !pods.contains(b) {
            return Err(err(
                format!("services[{i}].backends[{k}]"),
                format!("no pod named {b:?}"),
            ));
        }
        if !seen.insert(b) {
            return Err(err(
                format!("services[{i}].backends[{k}]"),
                format!("duplicate backend {b:?}"),
            ));
        }
    }
    Ok(())
}

/// Service `i`'s nodePort, if given: a NodePort's or LoadBalancer's, in the node port range,
/// not another service's.
fn validate_node_port(
    i: usize,
    svc: &Service,
    taken: &mut BTreeMap<u16, usize>,
) -> Result<(), TopologyError> {
    let Some(np) = svc.node_port else {
        return Ok(());
    };
    let field = format!("services[{i}].nodePort");
    if !svc.kind.has_node_port() {
        return Err(err(
            field,
            format!(
                "only NodePort and LoadBalancer services have one, not {}",
                svc.kind.as_str()
            ),
        ));
    }
    if !NODE_PORT_RANGE.contains(&np) {
        return Err(err(
            field,
            format!(
                "{np} is outside the node port range {}-{}",
                NODE_PORT_RANGE.start(),
                NODE_PORT_RANGE.end()
            ),
        ));
    }
    if let Some(j) = taken.insert(np, i) {
        return Err(err(
            field,
            format!("{np} is already services[{j}].nodePort"),
        ));
    }
    Ok(())
}

/// Node `i`'s pods: they fit its podCIDR (.1 is the gateway, the rest minus broadcast go to
/// pods) and their names are valid and not taken (`pod_names` collects them).
fn validate_pods(
    i: usize,
    node: &Node,
    pod_names: &mut BTreeSet<String>,
) -> Result<(), TopologyError> {
    let cidr = node.pod_cidr;
    let capacity = cidr.hosts().count().saturating_sub(1);
    if node.pods.len() > capacity {
        return Err(err(
            format!("nodes[{i}].pods"),
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
    Ok(())
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
            ["a/a1", "a/a2", "b/b1", "b/b2"]
        );
        assert_eq!(t.proxy, ProxyKind::Nftables);
        assert_eq!(t.services.len(), 5);
        // Round trip.
        assert_eq!(Topology::parse(&t.to_yaml()).unwrap(), t);
    }

    #[test]
    fn dual_stack_is_opt_in_with_ula_defaults() {
        // Every embedded IPv4 topology stays IPv4-only.
        for t in [
            Topology::default_demo(),
            Topology::eni_demo(),
            Topology::vxlan_demo(),
        ] {
            assert_eq!(t.ipv6, None, "{}", t.name);
            assert!(!t.to_yaml().contains("ipv6"));
            assert!(t
                .allocate()
                .unwrap()
                .iter()
                .all(|a| a.cluster_ip6.is_none()));
        }
        let d = Topology::dual_stack_demo();
        assert_eq!(Topology::parse(&d.to_yaml()).unwrap(), d);
        // `ipv6: {}` takes every default.
        let t = with("dns: true", "ipv6: {}\ndns: true").unwrap();
        let v6 = t.ipv6.clone().unwrap();
        assert_eq!(v6, d.ipv6.clone().unwrap());
        assert_eq!(
            t.pod_cidr6(&t.nodes[1]).unwrap().to_string(),
            "fd00:10:244:2::/64"
        );
        assert_eq!(t.underlay_ip6(0).unwrap().to_string(), "fd00:172:30::b");
        let a = t.allocate().unwrap();
        assert_eq!(a[0].cluster_ip6.unwrap().to_string(), "fd00:10:96::1");
        assert_eq!(Topology::parse(&t.to_yaml()).unwrap(), t);
    }

    #[test]
    fn dual_stack_refusals_name_the_field() {
        let e = |yaml: &str| Topology::parse(yaml).unwrap_err().to_string();
        let dual = DUAL_STACK_TOPOLOGY;
        let eni = ENI_TOPOLOGY.replacen("nodes:", "ipv6: {}\nnodes:", 1);
        assert!(
            e(&eni).starts_with("topology: ipv6: network eni is IPv4-only"),
            "{}",
            e(&eni)
        );
        let vx = VXLAN_TOPOLOGY.replacen("nodes:", "ipv6: {}\nnodes:", 1);
        assert!(e(&vx).starts_with("topology: ipv6: routedUnderlay is IPv4-only"));
        let kp = dual.replacen("proxy: nftables", "proxy: kube-proxy-iptables", 1);
        assert!(
            e(&kp).contains("kube-proxy-iptables is IPv4-only"),
            "{}",
            e(&kp)
        );
        let rf = dual.replacen("cni: weir", "cni: reference", 1);
        assert!(e(&rf).starts_with("topology: ipv6: the dual-stack lab runs weir-cni only"));
        let ov = dual.replacen(
            "serviceCIDR: fd00:10:96::/112",
            "serviceCIDR: fd00:10:244::/112",
            1,
        );
        assert!(
            e(&ov).starts_with("topology: ipv6.serviceCIDR: fd00:10:244::/112 overlaps"),
            "{}",
            e(&ov)
        );
        let small = dual.replacen(
            "clusterCIDR: fd00:10:244::/48",
            "clusterCIDR: fd00:10:244::/63",
            1,
        );
        assert!(
            e(&small)
                .starts_with("topology: nodes[1].podCIDR: 10.244.2.0/24 has no IPv6 counterpart"),
            "{}",
            e(&small)
        );
        let unknown = dual.replacen("  outside: fd00", "  outsde: fd00", 1);
        assert!(e(&unknown).contains("outsde"), "{}", e(&unknown));
    }

    #[test]
    fn defaults_for_an_old_topology() {
        let t = Topology::parse(
            "name: x\nunderlay: 172.30.0.0/24\nclusterCIDR: 10.244.0.0/16\noutside: 198.51.100.1\n\
             nodes:\n  - name: a\n    podCIDR: 10.244.1.0/24\n",
        )
        .unwrap();
        assert_eq!(t.proxy, ProxyKind::Nftables);
        assert_eq!(t.service_cidr.to_string(), "10.96.0.0/16");
        assert_eq!(t.lb_cidr.to_string(), "203.0.113.0/24");
        assert!(t.services.is_empty());
        assert!(!t.to_yaml().contains("services"), "{}", t.to_yaml());
        assert_eq!(Topology::parse(&t.to_yaml()).unwrap(), t);
    }

    #[test]
    fn service_fields_parse() {
        let t = Topology::default_demo();
        let s = |name: &str| t.services.iter().find(|s| s.name == name).unwrap();
        assert_eq!(s("web").kind, ServiceType::ClusterIP);
        assert_eq!(s("web").protocol, Protocol::Tcp);
        assert_eq!(s("dns").protocol, Protocol::Udp);
        assert_eq!(s("shop").external_traffic_policy, TrafficPolicy::Local);
        assert_eq!(s("shop").node_port, Some(30080));
        assert_eq!(s("api").kind, ServiceType::LoadBalancer);
        assert!(s("gone").backends.is_empty());
        let t = with(
            "    backends: [a1, b1]\n",
            "    backends: [a1, b1]\n    sessionAffinity: ClientIP\n    clusterIP: 10.96.7.7\n",
        )
        .unwrap();
        assert_eq!(t.services[0].session_affinity, SessionAffinity::ClientIP);
        assert_eq!(t.services[0].cluster_ip, Some(Ipv4Addr::new(10, 96, 7, 7)));
        assert_eq!(Topology::parse(&t.to_yaml()).unwrap(), t);
    }

    #[test]
    fn allocation_is_deterministic_and_skips_explicit_values() {
        let t = Topology::default_demo();
        let a = t.allocate().unwrap();
        let ips: Vec<String> = a.iter().map(|a| a.cluster_ip.to_string()).collect();
        assert_eq!(
            ips,
            [
                "10.96.0.1",
                "10.96.0.2",
                "10.96.0.3",
                "10.96.0.4",
                "10.96.0.5"
            ]
        );
        let ports: Vec<Option<u16>> = a.iter().map(|a| a.node_port).collect();
        // shop has 30080; api and gone get the first free ones.
        assert_eq!(ports, [None, None, Some(30080), Some(30000), Some(30001)]);
        assert_eq!(a[3].load_balancer_ip, Some(Ipv4Addr::new(203, 0, 113, 1)));
        assert_eq!(a[3].load_balancer_node.as_deref(), Some("a"), "a2 is on a");
        assert_eq!(a[3].health_check_node_port, None, "policy Cluster");
        assert_eq!(a[0].load_balancer_ip, None);

        let t = with(
            "    backends: [a1, b1]\n",
            "    backends: [a1, b1]\n    clusterIP: 10.96.0.2\n",
        )
        .unwrap();
        let ips: Vec<String> = t
            .allocate()
            .unwrap()
            .iter()
            .map(|a| a.cluster_ip.to_string())
            .collect();
        assert_eq!(
            ips,
            [
                "10.96.0.2",
                "10.96.0.1",
                "10.96.0.3",
                "10.96.0.4",
                "10.96.0.5"
            ]
        );

        // LoadBalancer + Local: a health check node port; the LB routed via a backend's node.
        let t = with(
            "    port: 443\n    backends: [a2, b1]\n",
            "    port: 443\n    externalTrafficPolicy: Local\n    backends: [b1]\n    loadBalancerIP: 203.0.113.9\n",
        )
        .unwrap();
        let a = t.allocate().unwrap();
        assert_eq!(a[3].health_check_node_port, Some(30001));
        assert_eq!(a[4].node_port, Some(30002));
        assert_eq!(a[3].load_balancer_ip, Some(Ipv4Addr::new(203, 0, 113, 9)));
        assert_eq!(a[3].load_balancer_node.as_deref(), Some("b"));
    }

    #[test]
    fn service_errors_name_the_field() {
        let cases: &[(&str, &str, &str, &str)] = &[
            ("name: web ", "name: Web ", "services[0].name", "[a-z0-9-]"),
            (
                "name: dns ",
                "name: web ",
                "services[1].name",
                "duplicate service name",
            ),
            (
                "    port: 53\n",
                "    port: 0\n",
                "services[1].port",
                "1 to 65535",
            ),
            (
                "    port: 53\n",
                "    port: 70000\n",
                "services[1].port",
                "",
            ),
            (
                "protocol: UDP",
                "protocol: ICMP",
                "services[1].protocol",
                "unknown variant",
            ),
            (
                "type: NodePort\n    port: 80\n    nodePort",
                "type: Nodeport\n    port: 80\n    nodePort",
                "services[2].type",
                "unknown variant",
            ),
            (
                "backends: [a1, b1]",
                "backends: [a1, c9]",
                "services[0].backends[1]",
                "no pod named \"c9\"",
            ),
            (
                "backends: [a1, b1]",
                "backends: [a1, a1]",
                "services[0].backends[1]",
                "duplicate backend",
            ),
            (
                "nodePort: 30080",
                "nodePort: 8080",
                "services[2].nodePort",
                "node port range",
            ),
            (
                "    port: 53\n",
                "    port: 53\n    nodePort: 30001\n",
                "services[1].nodePort",
                "only NodePort and LoadBalancer",
            ),
            (
                "    port: 443\n",
                "    port: 443\n    nodePort: 30080\n",
                "services[3].nodePort",
                "already services[2].nodePort",
            ),
            (
                "    port: 53\n",
                "    port: 53\n    externalTrafficPolicy: Local\n",
                "services[1].externalTrafficPolicy",
                "NodePort and LoadBalancer",
            ),
            (
                "    port: 53\n",
                "    port: 53\n    loadBalancerIP: 203.0.113.5\n",
                "services[1].loadBalancerIP",
                "only LoadBalancer",
            ),
            (
                "    port: 443\n",
                "    port: 443\n    loadBalancerIP: 198.51.100.7\n",
                "services[3].loadBalancerIP",
                "loadBalancerCIDR",
            ),
            (
                "    port: 53\n",
                "    port: 53\n    clusterIP: 10.97.0.1\n",
                "services[1].clusterIP",
                "serviceCIDR 10.96.0.0/16",
            ),
            (
                "    port: 53\n",
                "    port: 53\n    color: red\n",
                "services[1].color",
                "unknown field `color`",
            ),
            (
                "serviceCIDR: 10.96.0.0/16",
                "serviceCIDR: 10.244.128.0/20",
                "serviceCIDR",
                "overlaps clusterCIDR",
            ),
            (
                "serviceCIDR: 10.96.0.0/16",
                "serviceCIDR: 10.96.0.1/16",
                "serviceCIDR",
                "host bits",
            ),
            (
                "loadBalancerCIDR: 203.0.113.0/24",
                "loadBalancerCIDR: 10.96.1.0/24",
                "loadBalancerCIDR",
                "overlaps serviceCIDR",
            ),
            (
                "loadBalancerCIDR: 203.0.113.0/24",
                "loadBalancerCIDR: 198.51.100.0/24",
                "outside",
                "loadBalancerCIDR",
            ),
            ("proxy: nftables", "proxy: ebpf", "proxy", "unknown variant"),
            ("proxy: nftables", "proxy: none", "dns", "needs a proxy"),
            (
                "serviceCIDR: 10.96.0.0/16",
                "serviceCIDR: 10.96.0.0/29",
                "dns",
                "no host 10",
            ),
            (
                "    port: 80\n    backends: [a1, b1]\n",
                "    port: 80\n    clusterIP: 10.96.0.10\n    backends: [a1, b1]\n",
                "services[0].clusterIP",
                "the DNS Service's",
            ),
        ];
        for (from, to, field, msg) in cases {
            let e = match with(from, to) {
                Err(e) => e,
                Ok(_) => panic!("{from:?} -> {to:?} should fail"),
            };
            assert_eq!(&e.field, field, "{from:?} -> {to:?}: {e}");
            assert!(e.message.contains(msg), "{from:?} -> {to:?}: {e}");
        }
        // Exhaustion names the service whose allocation failed.
        let e = with("serviceCIDR: 10.96.0.0/16", "serviceCIDR: 10.96.0.0/30").unwrap_err();
        assert_eq!(e.field, "services[2].clusterIP", "{e}");
        assert!(e.message.contains("exhausted"), "{e}");
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
    fn routed_underlay_gives_every_node_its_own_subnet() {
        let t = Topology::vxlan_demo();
        assert_eq!(t.overlay, Overlay::Vxlan);
        assert_eq!(t.outside_net().to_string(), "172.31.0.0/28");
        assert_eq!(t.router_ip(), Ipv4Addr::new(172, 31, 0, 1));
        assert_eq!(t.node_subnet(0).unwrap().to_string(), "172.31.0.16/28");
        assert_eq!(t.underlay_ip(0), Some(Ipv4Addr::new(172, 31, 0, 18)));
        assert_eq!(t.node_router(0), Some(Ipv4Addr::new(172, 31, 0, 17)));
        assert_eq!(t.underlay_ip(1), Some(Ipv4Addr::new(172, 31, 0, 34)));
        assert_eq!(t.node_router(1), Some(Ipv4Addr::new(172, 31, 0, 33)));
        assert_eq!(Topology::parse(&t.to_yaml()).unwrap(), t);
        // A /24 holds 15 nodes after the outside's block; a /27 only one.
        let small = Topology::parse(&VXLAN_TOPOLOGY.replace("172.31.0.0/24", "172.31.0.0/27"));
        assert_eq!(small.unwrap_err().field, "nodes[1].name");
        // The default topology is unchanged: one segment, host-gw.
        let d = Topology::default_demo();
        assert_eq!((d.overlay, d.routed_underlay), (Overlay::HostGw, false));
        assert!(!d.to_yaml().contains("overlay"), "{}", d.to_yaml());
        let e =
            Topology::parse(&ENI_TOPOLOGY.replace("network: eni", "network: eni\noverlay: vxlan"));
        assert_eq!(e.unwrap_err().field, "overlay");
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
        let e = with("pods: [b1, b2]", "pods: [b1, a2]").unwrap_err();
        assert_eq!(e.field, "nodes[1].pods[1]");
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
        let e = with("    pods: [b1, b2]", "    pods: [b1, b2]\n    color: red").unwrap_err();
        assert_eq!(e.field, "nodes[1].color", "{e}");
        assert!(!e.message.contains("nodes[1]"), "{e}");
        assert!(e.message.contains("unknown field `color`"), "{e}");
        let e = with("cni: weir", "cni: calico").unwrap_err();
        assert_eq!(e.field, "cni", "{e}");
        // A file that is not a topology at all is named, not echoed.
        let passwd = "root:x:0:0:root:/root:/bin/bash\nsecret:x:1:1::/s:/bin/sh\n".repeat(30);
        let e = Topology::parse(&passwd).unwrap_err().to_string();
        assert_eq!(
            e,
            "topology: not a topology (a YAML mapping of fields): the file reads as a YAML \
             string; line 1: \"root:x:0:0:root:/root:/bin/bash\""
        );
        let long = "x".repeat(500);
        let e = with("cni: weir", &format!("cni: {long}")).unwrap_err();
        assert!(e.message.len() < 200, "{e}");
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
        use crate::names::*;
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

    #[test]
    fn allocation_skips_the_dns_ip() {
        let mut t = Topology::default_demo();
        for i in 0..8 {
            let mut s = t.services[0].clone();
            s.name = format!("x{i}");
            t.services.push(s);
        }
        let dns_ip = Ipv4Addr::new(10, 96, 0, 10);
        let ips = |t: &Topology| -> Vec<Ipv4Addr> {
            t.allocate().unwrap().iter().map(|a| a.cluster_ip).collect()
        };
        assert!(t.dns.on());
        assert!(!ips(&t).contains(&dns_ip), "{:?}", ips(&t));
        assert_eq!(ips(&t).len(), 13);
        t.dns = Dns::Off;
        assert!(ips(&t).contains(&dns_ip));
    }

    #[test]
    fn dns_key_takes_true_false_cluster_ip_and_node_local() {
        let with = |v: &str| {
            Topology::parse(
                &crate::topology::DEFAULT_TOPOLOGY
                    .lines()
                    .map(|l| {
                        if l.starts_with("dns:") {
                            format!("dns: {v}")
                        } else {
                            l.into()
                        }
                    })
                    .collect::<Vec<_>>()
                    .join("\n"),
            )
        };
        assert_eq!(with("true").unwrap().dns, Dns::ClusterIp);
        assert_eq!(with("cluster-ip").unwrap().dns, Dns::ClusterIp);
        assert_eq!(with("node-local").unwrap().dns, Dns::NodeLocal);
        assert_eq!(with("false").unwrap().dns, Dns::Off);
        let e = with("nodelocal").unwrap_err().to_string();
        assert!(e.contains("node-local"), "{e}");
        // The default demo keeps the ClusterIP.
        assert_eq!(Topology::default_demo().dns, Dns::ClusterIp);
    }
}
