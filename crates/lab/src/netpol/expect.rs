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

use std::net::{IpAddr, Ipv4Addr};

use weir_policy::model::Protocol;
use weir_policy::oracle::{allowed, Endpoint};
use weir_policy::Cluster;

use crate::echo::ECHO_PORT;
use crate::matrix::{Kind, Probe, Proto, Verdict};
use crate::names;
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
fn masquerade_towards_pods(node: &NodeState) -> Ipv4Addr {
    node.vtep_ip.unwrap_or(node.underlay_ip)
}

/// The address `node` masquerades NodePort traffic to towards its own pods: the bridge's
/// (the pods' gateway) in a bridge network; in an eni network the pods sit behind
/// addressless host veths, so the kernel picks the node's primary address, eth0's.
fn masquerade_towards_local_pods(state: &LabState, node: &NodeState) -> Ipv4Addr {
    match state.network {
        Network::Bridge => node.pod_gateway,
        Network::Eni => node.underlay_ip,
    }
}

/// The rows through Services of a lab with policies, each with the oracle's verdict: every
/// other pod → a ClusterIP Service's ClusterIP, and every outside address → a NodePort
/// Service's port on every node that forwards it (all nodes; with policy Local only those
/// with the endpoint). Only Services with one backend: then the answerer, and so the
/// verdict, is known.
pub fn service_rows(cluster: &Cluster, state: &LabState) -> Vec<Probe> {
    let mut rows = Vec::new();
    for svc in &state.services {
        let [backend] = svc.backends.as_slice() else {
            continue;
        };
        let Some(backend) = state.pods.iter().find(|p| &p.name == backend) else {
            continue;
        };
        if svc.kind == ServiceType::ClusterIP {
            rows.extend(cluster_ip_rows(cluster, state, svc, backend));
        }
        if svc.kind == ServiceType::NodePort {
            rows.extend(node_port_rows(cluster, state, svc, backend));
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
    svc: &ServiceState,
    backend: &PodState,
) -> Vec<Probe> {
    let proto = proto(svc);
    state
        .pods
        .iter()
        .filter(|c| c.name != backend.name)
        .map(|client| Probe {
            from: client.name.clone(),
            from_ns: client.netns.clone(),
            from_ip: client.ip.into(),
            to: svc.name.clone(),
            to_ip: svc.cluster_ip.into(),
            kind: Kind::ClusterIp,
            proto,
            expect_answer: backend.name.clone(),
            // Pod to ClusterIP keeps the pod's address (the proxy masquerades only sources
            // outside the cluster CIDR, and hairpin, which no row is).
            expect_source: Some(client.ip.into()),
            port: svc.port,
            bind: false,
            policy: Some(verdict(
                cluster,
                state,
                client.ip.into(),
                backend.ip.into(),
                proto,
            )),
        })
        .collect()
}

fn node_port_rows(
    cluster: &Cluster,
    state: &LabState,
    svc: &ServiceState,
    backend: &PodState,
) -> Vec<Probe> {
    let Some(node_port) = svc.node_port else {
        return Vec::new();
    };
    let proto = proto(svc);
    let outside_ns = names::outside(&state.lab);
    let mut rows = Vec::new();
    let sources = std::iter::once(state.outside).chain(state.outside_addresses.iter().copied());
    for addr in sources {
        for node in &state.nodes {
            let local = node.name == backend.node;
            if svc.local_policy() && !local {
                continue; // no local endpoint: the proxy drops it, whatever the policy says
            }
            // (what the policy hook on the backend's node sees, what the backend sees)
            let (hook, seen) = match (svc.local_policy(), local) {
                (true, _) => (addr, addr),
                (false, true) => (addr, masquerade_towards_local_pods(state, node)),
                (false, false) => {
                    let m = masquerade_towards_pods(node);
                    (m, m)
                }
            };
            rows.push(Probe {
                from: "outside".into(),
                from_ns: outside_ns.clone(),
                from_ip: addr.into(),
                to: format!("{} via {}", svc.name, node.name),
                to_ip: node.underlay_ip.into(),
                kind: Kind::NodePort,
                proto,
                expect_answer: backend.name.clone(),
                expect_source: Some(seen.into()),
                port: node_port,
                bind: true,
                policy: Some(verdict(
                    cluster,
                    state,
                    hook.into(),
                    backend.ip.into(),
                    proto,
                )),
            });
        }
    }
    rows
}

#[cfg(test)]
mod tests;
