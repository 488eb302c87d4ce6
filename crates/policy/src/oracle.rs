//! The specification, read literally: would the first packet of a connection pass?
//!
//! Written from the NetworkPolicy API documentation, independently of the planner, and
//! deliberately naive (every policy, every pod, no index) so it can be checked by reading.
//! The property test in `tests/oracle.rs` holds the planner's output to it.

use std::net::IpAddr;
use std::sync::Arc;

use crate::key::ObjectKey;
use crate::model::{Cluster, Direction, Peer, Peers, PodInfo, PortSelector, Ports, Protocol, Rule};

/// One end of a connection, with the address the packet carries.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Endpoint {
    /// A pod (hostNetwork ones too: their address is their node's).
    Pod { pod: ObjectKey, ip: IpAddr },
    /// A node itself (kubelet, node processes).
    Node { node: Arc<str>, ip: IpAddr },
    /// Anything else.
    Outside(IpAddr),
}

impl Endpoint {
    pub fn ip(&self) -> IpAddr {
        match self {
            Endpoint::Pod { ip, .. } | Endpoint::Node { ip, .. } | Endpoint::Outside(ip) => *ip,
        }
    }
}

/// Whether a connection from `src` to `dst` on (`protocol`, `port`) is allowed: egress must
/// be allowed at the source pod and ingress at the destination pod.
pub fn allowed(
    cluster: &Cluster,
    src: &Endpoint,
    dst: &Endpoint,
    protocol: Protocol,
    port: u16,
) -> bool {
    // "a pod cannot block access to itself"
    if let (Endpoint::Pod { pod: a, .. }, Endpoint::Pod { pod: b, .. }) = (src, dst) {
        if a == b {
            return true;
        }
    }
    let egress = match policed_pod(cluster, src) {
        None => true,
        Some(pod) => direction_allows(cluster, pod, Direction::Egress, dst, protocol, port),
    };
    let ingress = match policed_pod(cluster, dst) {
        None => true,
        // "traffic to and from the node where a Pod is running is always allowed"
        Some(pod) if comes_from_node_of(cluster, src, pod) => true,
        Some(pod) => direction_allows(cluster, pod, Direction::Ingress, src, protocol, port),
    };
    egress && ingress
}

/// The endpoint's pod if policies can apply to it (live, not hostNetwork).
fn policed_pod<'a>(cluster: &'a Cluster, e: &Endpoint) -> Option<&'a PodInfo> {
    match e {
        Endpoint::Pod { pod, .. } => cluster
            .pods
            .get(pod)
            .map(|p| &**p)
            .filter(|p| p.is_policy_pod()),
        _ => None,
    }
}

/// The node itself, or a hostNetwork pod (which is the node's network), on `pod`'s node.
fn comes_from_node_of(cluster: &Cluster, src: &Endpoint, pod: &PodInfo) -> bool {
    let node = match src {
        Endpoint::Node { node, .. } => Some(node.clone()),
        Endpoint::Pod { pod: key, .. } => cluster
            .pods
            .get(key)
            .filter(|p| p.host_network && p.is_live())
            .and_then(|p| p.node.clone()),
        Endpoint::Outside(_) => None,
    };
    node.is_some() && node == pod.node
}

/// `pod` is isolated in `direction` if a policy of its namespace selects it and has that
/// policy type; then some rule of such a policy must allow the traffic.
fn direction_allows(
    cluster: &Cluster,
    pod: &PodInfo,
    direction: Direction,
    peer: &Endpoint,
    protocol: Protocol,
    port: u16,
) -> bool {
    let selecting: Vec<_> = cluster
        .policies
        .values()
        .filter(|p| p.selects(pod) && p.isolates(direction))
        .collect();
    if selecting.is_empty() {
        return true;
    }
    // Named ports are looked up on the destination: the pod itself for ingress, the peer
    // for egress.
    let destination = match direction {
        Direction::Ingress => Some(pod),
        Direction::Egress => policed_pod(cluster, peer),
    };
    selecting.iter().any(|policy| {
        policy.rules(direction).iter().any(|rule| {
            rule_allows(
                cluster,
                &policy.key.namespace,
                rule,
                peer,
                destination,
                protocol,
                port,
            )
        })
    })
}

fn rule_allows(
    cluster: &Cluster,
    policy_namespace: &str,
    rule: &Rule,
    peer: &Endpoint,
    destination: Option<&PodInfo>,
    protocol: Protocol,
    port: u16,
) -> bool {
    let peer_ok = match &rule.peers {
        Peers::Any => true,
        Peers::Only(peers) => peers
            .iter()
            .any(|p| peer_matches(cluster, policy_namespace, p, peer)),
    };
    let port_ok = match &rule.ports {
        Ports::Any => true,
        Ports::Only(specs) => specs.iter().any(|spec| {
            spec.protocol == protocol
                && match &spec.port {
                    PortSelector::All => true,
                    PortSelector::Range(first, last) => *first <= port && port <= *last,
                    PortSelector::Named(name) => {
                        destination.and_then(|d| d.named_port(name, protocol)) == Some(port)
                    }
                }
        }),
    };
    peer_ok && port_ok
}

fn peer_matches(cluster: &Cluster, policy_namespace: &str, peer: &Peer, e: &Endpoint) -> bool {
    match peer {
        Peer::Block(block) => block.contains(e.ip()),
        Peer::Pods { .. } => policed_pod(cluster, e)
            .is_some_and(|pod| peer.selects_pod(cluster, policy_namespace, pod)),
    }
}
