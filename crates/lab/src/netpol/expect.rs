//! Every policy row's expectation, computed by weir-policy's oracle
//! ([`weir_policy::oracle::allowed`], the specification read literally) from the objects the
//! lab wrote, never written by hand (pure).
//!
//! The oracle is asked about the packet the policy hook sees: `weir policy`'s table sits in
//! the forward (and input) hook, after the proxy's DNAT in prerouting and before its
//! masquerade in postrouting. So a Service row is judged against its backend pod and the
//! echo port, and a NodePort row against the source the backend's node receives: the
//! outside's own address when the backend is on the node dialled (masqueraded only after the
//! hook) or the policy is Local, else the address the node dialled masquerades to.

use std::net::IpAddr;

use weir_policy::model::Protocol;
use weir_policy::oracle::{allowed, Endpoint};
use weir_policy::Cluster;

use crate::echo::ECHO_PORT;
use crate::matrix::{Kind, Probe, Proto, Verdict};
use crate::names;
use crate::services::Family;
use crate::state::{LabState, NodeState, PodState, ServiceState};
use crate::topology::{Network, ServiceType};

/// Who `ip` is to a policy: a live pod of the objects (by its address), a node (any address
/// it sends from: underlay, pod gateway or ENI address, VTEP), or the outside world.
pub fn endpoint(cluster: &Cluster, state: &LabState, ip: IpAddr) -> Endpoint {
    if let Some(pod) = cluster
        .pods
        .values()
        .find(|p| p.is_live() && p.ips.contains(&ip))
    {
        return Endpoint::Pod {
            pod: pod.key.clone(),
            ip,
        };
    }
    let node_ips = |n: &NodeState| {
        let mut ips = vec![IpAddr::from(n.underlay_ip), n.pod_gateway.into()];
        ips.extend(n.vtep_ip.map(IpAddr::from));
        ips.extend(n.underlay_ip6.map(IpAddr::from));
        ips.extend(n.pod_gateway6.map(IpAddr::from));
        ips.extend(n.vtep_ip6.map(IpAddr::from));
        ips
    };
    match state.nodes.iter().find(|n| node_ips(n).contains(&ip)) {
        Some(n) => Endpoint::Node {
            node: n.name.as_str().into(),
            ip,
        },
        None => Endpoint::Outside(ip),
    }
}

fn protocol(p: Proto) -> Protocol {
    match p {
        Proto::Tcp => Protocol::Tcp,
        Proto::Udp => Protocol::Udp,
    }
}

fn verdict(cluster: &Cluster, state: &LabState, src: IpAddr, dst: IpAddr, proto: Proto) -> Verdict {
    let (src, dst) = (endpoint(cluster, state, src), endpoint(cluster, state, dst));
    Verdict::of(allowed(cluster, &src, &dst, protocol(proto), ECHO_PORT))
}

/// Gives every row of the open-network matrix (pod → pod, → its node, → the outside, on the
/// echo port) the oracle's verdict.
pub fn expect(cluster: &Cluster, state: &LabState, probes: &mut [Probe]) {
    for p in probes {
        p.policy = Some(verdict(cluster, state, p.from_ip, p.to_ip, p.proto));
    }
}

/// The address `node` masquerades NodePort traffic from the outside to towards another
/// node's pod: its VTEP's over a vxlan overlay, else its underlay address. In an eni network
/// too: the request came in on eth0 and is routed by the main table, out of eth0 to the VPC
/// (only traffic from a pod's own address takes the ENI's table and so the ENI's address).
fn masquerade_towards_pods(f: Family, node: &NodeState) -> Option<IpAddr> {
    match f.v6 {
        false => Some(node.vtep_ip.unwrap_or(node.underlay_ip).into()),
        true => node.vtep_ip6.or(node.underlay_ip6).map(IpAddr::from),
    }
}

/// The address `node` masquerades NodePort traffic to towards its own pods: the bridge's
/// (the pods' gateway) in a bridge network; in an eni network the pods sit behind
/// addressless host veths, so the kernel picks the node's primary address, eth0's.
fn masquerade_towards_local_pods(f: Family, state: &LabState, node: &NodeState) -> Option<IpAddr> {
    match (state.network, f.v6) {
        (Network::Bridge, false) => Some(node.pod_gateway.into()),
        (Network::Bridge, true) => node.pod_gateway6.map(IpAddr::from),
        (Network::Eni, _) => f.node(node),
    }
}

/// The rows through Services of a lab with policies, each with the oracle's verdict: every
/// other pod → a ClusterIP Service's ClusterIP, and every outside address → a NodePort
/// Service's port on every node that forwards it (all nodes; with policy Local only those
/// with the endpoint), in each family the lab has. Only Services with one backend: then the
/// answerer, and so the verdict, is known.
pub fn service_rows(cluster: &Cluster, state: &LabState) -> Vec<Probe> {
    let mut rows = Vec::new();
    for f in [Family { v6: false }, Family { v6: true }] {
        for svc in &state.services {
            let [backend] = svc.backends.as_slice() else {
                continue;
            };
            let Some(backend) = state.pods.iter().find(|p| &p.name == backend) else {
                continue;
            };
            if svc.kind == ServiceType::ClusterIP {
                rows.extend(cluster_ip_rows(cluster, state, f, svc, backend));
            }
            if svc.kind == ServiceType::NodePort {
                rows.extend(node_port_rows(cluster, state, f, svc, backend));
            }
        }
    }
    rows
}

fn proto(svc: &ServiceState) -> Proto {
    match svc.protocol {
        crate::topology::Protocol::Tcp => Proto::Tcp,
        crate::topology::Protocol::Udp => Proto::Udp,
    }
}

fn cluster_ip_rows(
    cluster: &Cluster,
    state: &LabState,
    f: Family,
    svc: &ServiceState,
    backend: &PodState,
) -> Vec<Probe> {
    let proto = proto(svc);
    let (Some(cluster_ip), Some(backend_ip)) = (f.cluster_ip(svc), f.pod(backend)) else {
        return Vec::new();
    };
    state
        .pods
        .iter()
        .filter(|c| c.name != backend.name)
        .filter_map(|client| {
            let client_ip = f.pod(client)?;
            Some(Probe {
                from: client.name.clone(),
                from_ns: client.netns.clone(),
                from_ip: client_ip,
                to: svc.name.clone(),
                to_ip: cluster_ip,
                kind: Kind::ClusterIp,
                proto,
                expect_answer: backend.name.clone(),
                // Pod to ClusterIP keeps the pod's address (the proxy masquerades only
                // sources outside the cluster CIDR, and hairpin, which no row is).
                expect_source: Some(client_ip),
                port: svc.port,
                bind: false,
                policy: Some(verdict(cluster, state, client_ip, backend_ip, proto)),
            })
        })
        .collect()
}

fn node_port_rows(
    cluster: &Cluster,
    state: &LabState,
    f: Family,
    svc: &ServiceState,
    backend: &PodState,
) -> Vec<Probe> {
    let (Some(node_port), Some(backend_ip)) = (svc.node_port, f.pod(backend)) else {
        return Vec::new();
    };
    let proto = proto(svc);
    let outside_ns = names::outside(&state.lab);
    let mut rows = Vec::new();
    let mut sources: Vec<IpAddr> = f.outside(state).into_iter().collect();
    if !f.v6 {
        sources.extend(state.outside_addresses.iter().map(|a| IpAddr::from(*a)));
    }
    for addr in sources {
        for node in &state.nodes {
            let local = node.name == backend.node;
            if svc.local_policy() && !local {
                continue; // no local endpoint: the proxy drops it, whatever the policy says
            }
            let Some(node_ip) = f.node(node) else {
                continue;
            };
            // (what the policy hook on the backend's node sees, what the backend sees)
            let (hook, seen) = match (svc.local_policy(), local) {
                (true, _) => (Some(addr), Some(addr)),
                (false, true) => (Some(addr), masquerade_towards_local_pods(f, state, node)),
                (false, false) => {
                    let m = masquerade_towards_pods(f, node);
                    (m, m)
                }
            };
            let (Some(hook), Some(seen)) = (hook, seen) else {
                continue;
            };
            rows.push(Probe {
                from: "outside".into(),
                from_ns: outside_ns.clone(),
                from_ip: addr,
                to: format!("{} via {}", svc.name, node.name),
                to_ip: node_ip,
                kind: Kind::NodePort,
                proto,
                expect_answer: backend.name.clone(),
                expect_source: Some(seen),
                port: node_port,
                bind: true,
                policy: Some(verdict(cluster, state, hook, backend_ip, proto)),
            });
        }
    }
    rows
}

#[cfg(test)]
mod tests;
