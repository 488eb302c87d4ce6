use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::net::IpAddr;
use std::sync::Arc;

use ipnet::IpNet;

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Protocol {
    Tcp,
    Udp,
    Sctp,
}

impl Protocol {
    /// Parses a Kubernetes protocol name; `None` (unset) means TCP.
    pub fn parse(s: Option<&str>) -> Option<Protocol> {
        match s.unwrap_or("TCP") {
            "TCP" => Some(Protocol::Tcp),
            "UDP" => Some(Protocol::Udp),
            "SCTP" => Some(Protocol::Sctp),
            _ => None,
        }
    }
    /// Lower-case name, as nftables and iptables spell it.
    pub fn as_str(self) -> &'static str {
        match self {
            Protocol::Tcp => "tcp",
            Protocol::Udp => "udp",
            Protocol::Sctp => "sctp",
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum IpFamily {
    V4,
    V6,
}

impl IpFamily {
    pub fn of(ip: &IpAddr) -> IpFamily {
        if ip.is_ipv4() {
            IpFamily::V4
        } else {
            IpFamily::V6
        }
    }
    pub fn of_net(net: &IpNet) -> IpFamily {
        Self::of(&net.addr())
    }
}

/// Identity of one planned service port. Dual-stack services yield one entry per family,
/// each holding only that family's frontends and endpoints.
///
/// The names are shared, not copied: the planner takes them from the Service object (the
/// port name interned), so the plan, the planner's per-service results, the backend's
/// applied plan and every diff hold pointers to one copy (at 100,000 services, each copy
/// of the plan's keys with their own `String`s was ~20 MiB).
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ServicePortKey {
    pub namespace: Arc<str>,
    pub name: Arc<str>,
    /// `ServicePort.name` ("" when unnamed); matched against `EndpointPort.name`.
    pub port_name: Arc<str>,
    pub protocol: Protocol,
    pub family: IpFamily,
}

impl fmt::Display for ServicePortKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.namespace, self.name)?;
        if !self.port_name.is_empty() {
            write!(f, ":{}", self.port_name)?;
        }
        let fam = match self.family {
            IpFamily::V4 => "v4",
            IpFamily::V6 => "v6",
        };
        write!(f, "/{}/{}", self.protocol.as_str(), fam)
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum FrontendKind {
    ClusterIp,
    /// Address `None`: every node-port address of the plan ([`Plan::node_port_addresses`]).
    NodePort,
    ExternalIp,
    LoadBalancer,
}

impl FrontendKind {
    pub fn is_external(self) -> bool {
        self != FrontendKind::ClusterIp
    }
}

/// Which endpoint list of the [`ServicePortPlan`] a frontend balances over.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum EndpointSet {
    Cluster,
    Local,
}

/// What to do with a new connection to a frontend.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Verdict {
    /// DNAT to one of the selected endpoints.
    Forward,
    /// No usable endpoint anywhere in the cluster: reject at once (ICMP unreachable / TCP reset).
    Reject,
    /// Endpoints exist, but none local while the traffic policy is Local: drop.
    Drop,
}

/// Source-NAT policy of a frontend (hairpin, `saddr == endpoint`, is always masqueraded
/// in addition; renderers must add that per endpoint).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Masquerade {
    /// Every packet (masquerade-all, or external traffic with policy Cluster).
    Always,
    /// Packets whose source is outside [`Plan::cluster_cidrs`].
    OffCluster,
    /// Keep the client source (policy Local for external traffic; see
    /// [`Frontend::short_circuit`]).
    Never,
}

#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Frontend {
    pub kind: FrontendKind,
    /// The destination address; `None` for NodePort (see [`FrontendKind::NodePort`]).
    pub addr: Option<IpAddr>,
    /// The destination port (the service port, or the node port).
    pub port: u16,
    pub endpoints: EndpointSet,
    pub verdict: Verdict,
    pub masquerade: Masquerade,
    /// externalTrafficPolicy Local only: traffic from the cluster CIDR (pods) and from this
    /// node itself is sent to the *cluster* endpoints instead (node-originated traffic then
    /// masqueraded), as kube-proxy does, so that pods reaching an external VIP work.
    /// False when internalTrafficPolicy is Local as well (no cluster endpoint list exists).
    pub short_circuit: bool,
    /// LoadBalancer only: allowed source ranges (`None` = any). Already includes the LB
    /// ingress IPs themselves when a range covers a node address (VIP loopback).
    pub source_ranges: Option<Vec<IpNet>>,
}

/// One backend of a service port.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Endpoint {
    pub ip: IpAddr,
    pub port: u16,
    /// The endpoint's `nodeName` equals this node's name. (Its node and zone names are not
    /// kept: the planner has already applied them, locality here and topology hints in the
    /// choice of `cluster_endpoints`; a million endpoints at 100,000 services held 32 MiB
    /// of the two pointers.)
    pub is_local: bool,
    pub ready: bool,
    pub serving: bool,
    pub terminating: bool,
}

/// Which topology hints selected `cluster_endpoints`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub enum TopologyMode {
    /// All usable endpoints.
    #[default]
    None,
    PreferSameZone,
    PreferSameNode,
}

/// The plan of one service port for one IP family.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServicePortPlan {
    /// The service port (what the ClusterIP listens on).
    pub port: u16,
    pub frontends: Vec<Frontend>,
    /// Usable endpoints for Cluster traffic policy (topology-filtered; ready, else
    /// serving+terminating). Sorted by (ip, port).
    pub cluster_endpoints: Vec<Endpoint>,
    /// Usable local endpoints for Local traffic policy (ready local, else serving+terminating
    /// local). Empty when no frontend uses Local policy. Sorted by (ip, port).
    pub local_endpoints: Vec<Endpoint>,
    /// ClientIP session affinity timeout in seconds (`None`: no affinity).
    pub affinity_timeout: Option<u32>,
    pub internal_policy_local: bool,
    pub external_policy_local: bool,
    /// Recorded for externalTrafficPolicy Local services (served by the proxy's health server).
    pub health_check_node_port: Option<u16>,
    pub topology: TopologyMode,
    /// Some endpoint, ready or serving+terminating, exists anywhere in the cluster.
    pub has_any_endpoints: bool,
}

impl ServicePortPlan {
    pub fn endpoints(&self, set: EndpointSet) -> &[Endpoint] {
        match set {
            EndpointSet::Cluster => &self.cluster_endpoints,
            EndpointSet::Local => &self.local_endpoints,
        }
    }
}

/// Addresses on which NodePorts are served.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum NodePortAddresses {
    /// Every local address except loopback (a `0.0.0.0/0` / `::/0` nodeport-addresses entry).
    /// Renderers use `fib daddr type local` plus a loopback exclusion.
    AllLocal,
    /// Exactly these addresses (never loopback).
    List(BTreeSet<IpAddr>),
    /// No NodePorts for this family.
    #[default]
    None,
}

/// The whole desired service state of one node.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Plan {
    /// Shared so that copies of a plan are cheap and an unchanged service port is recognised
    /// by pointer (see [`crate::Planner`]).
    pub services: BTreeMap<ServicePortKey, Arc<ServicePortPlan>>,
    pub node_port_addresses_v4: NodePortAddresses,
    pub node_port_addresses_v6: NodePortAddresses,
    pub cluster_cidrs: Vec<IpNet>,
    pub masquerade_all: bool,
    /// Problems found while planning (invalid IPs, unknown protocols …), sorted, for logs.
    pub warnings: Vec<String>,
}

impl Plan {
    pub fn node_port_addresses(&self, family: IpFamily) -> &NodePortAddresses {
        match family {
            IpFamily::V4 => &self.node_port_addresses_v4,
            IpFamily::V6 => &self.node_port_addresses_v6,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The plan holds one per endpoint of every service port (a million at 100,000 services
    /// × 10 endpoints): an address, a port and flags, no names.
    #[test]
    fn a_planned_endpoint_is_small() {
        assert!(std::mem::size_of::<Endpoint>() <= 24);
    }
}
