//! The planner against the oracle: on random clusters (two nodes, IPv4 and some IPv6, every
//! policy feature, some malformed input), every first packet between every pair of
//! endpoints gets the same verdict from the oracle and from the two nodes' plans, evaluated
//! the way the nftables table walks them (egress at the source node, ingress at the
//! destination node, each node dispatching by the addresses its own plan holds).

mod common;

use std::collections::BTreeMap;
use std::net::IpAddr;

use common::{ClusterGen, PodState, NODES, OUTSIDE};
use proptest::prelude::*;
use weir_policy::model::Protocol;
use weir_policy::oracle::{self, Endpoint};
use weir_policy::{plan, Cluster, ObjectKey, PeerMatch, PolicyPlan, PortMatch, Program};

/// Where an address lives, which decides the hooks a packet passes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Place {
    /// A pod's own network namespace on node i.
    PodOn(usize),
    /// Node i itself (and its hostNetwork pods).
    Host(usize),
    Outside,
}

struct Packet<'a> {
    src: IpAddr,
    dst: IpAddr,
    protocol: Protocol,
    port: u16,
    plans: &'a [PolicyPlan],
}

impl Packet<'_> {
    /// The table's forward hook on node `n`: the source's egress chain, then the
    /// destination's ingress chain, each only if this node's maps hold the address.
    fn forward(&self, n: usize) -> bool {
        self.egress(n) && self.ingress(n)
    }

    /// The input hook: a local pod talking to its node; egress only.
    fn input(&self, n: usize) -> bool {
        self.egress(n)
    }

    fn egress(&self, n: usize) -> bool {
        match chain(&self.plans[n], self.src, |p| p.egress.as_ref()) {
            None => true,
            Some((own, program)) => self.chain_allows(own, program, self.dst),
        }
    }

    fn ingress(&self, n: usize) -> bool {
        match chain(&self.plans[n], self.dst, |p| p.ingress.as_ref()) {
            None => true,
            Some((own, program)) => self.chain_allows(own, program, self.src),
        }
    }

    /// The pod's own addresses pass, then the rules in order; the chain ends in a drop.
    fn chain_allows(&self, own: &[IpAddr], program: &Program, peer: IpAddr) -> bool {
        own.contains(&peer)
            || program.rules.iter().any(|rule| {
                let peer_ok = match &rule.peers {
                    PeerMatch::Any => true,
                    PeerMatch::Only(set) => {
                        set.ips.contains(&peer)
                            || set.blocks.iter().any(|b| {
                                b.cidr.contains(&peer)
                                    && b.except.iter().all(|e| !e.contains(&peer))
                            })
                    }
                };
                let port_ok = match &rule.ports {
                    PortMatch::Any => true,
                    PortMatch::Only(l4) => l4.iter().any(|m| {
                        m.protocol == self.protocol
                            && m.ports
                                .is_none_or(|(a, b)| a <= self.port && self.port <= b)
                    }),
                };
                peer_ok && port_ok
            })
    }

    /// The hooks along the path, each node judging by its own plan.
    fn passes(&self, from: Place, to: Place) -> bool {
        use Place::*;
        match (from, to) {
            (PodOn(a), PodOn(b)) if a == b => self.forward(a),
            (PodOn(a), PodOn(b)) => self.forward(a) && self.forward(b),
            (PodOn(a), Host(b)) if a == b => self.input(a),
            (PodOn(a), Host(b)) => self.forward(a) && self.input(b),
            (PodOn(a), Outside) => self.forward(a),
            // Leaves its node through output, which the table does not filter.
            (Host(a), PodOn(b)) if a == b => true,
            (Host(_), PodOn(b)) | (Outside, PodOn(b)) => self.forward(b),
            (Host(_) | Outside, Host(b)) => self.input(b),
            (_, Outside) => true,
        }
    }
}

/// The chain this node's map sends `ip` to in one direction: the pod's addresses and
/// program. Several claimants: the first by name, as the renderer does.
fn chain<'a>(
    plan: &'a PolicyPlan,
    ip: IpAddr,
    direction: impl Fn(&'a weir_policy::PodProgram) -> Option<&'a Program>,
) -> Option<(&'a [IpAddr], &'a Program)> {
    plan.pods
        .values()
        .filter(|p| p.ips.contains(&ip))
        .find_map(|p| direction(p).map(|program| (&p.ips[..], program)))
}

/// Every address with its endpoint and place.
fn endpoints(gen: &ClusterGen, cluster: &Cluster) -> Vec<(Endpoint, Place)> {
    let mut out = Vec::new();
    for (i, pod) in gen.pods.iter().enumerate() {
        let key = ObjectKey::new(common::NAMESPACES[pod.namespace], &common::pod_name(i));
        assert!(cluster.pods.contains_key(&key));
        for ip in common::pod_ips(i, pod) {
            let (e, place) = match pod.state {
                PodState::Running => (
                    Endpoint::Pod {
                        pod: key.clone(),
                        ip,
                    },
                    Place::PodOn(pod.node),
                ),
                PodState::HostNetwork => (
                    Endpoint::Pod {
                        pod: key.clone(),
                        ip,
                    },
                    Place::Host(pod.node),
                ),
                // A finished pod's address: nobody's now.
                PodState::Succeeded | PodState::NoIp => (Endpoint::Outside(ip), Place::Outside),
            };
            out.push((e, place));
        }
    }
    for (n, node) in NODES.iter().enumerate() {
        for v6 in [false, true] {
            let ip = common::node_ip(n, v6);
            out.push((
                Endpoint::Node {
                    node: (*node).into(),
                    ip,
                },
                Place::Host(n),
            ));
        }
    }
    for ip in OUTSIDE {
        out.push((Endpoint::Outside(ip.parse().unwrap()), Place::Outside));
    }
    out
}

const PORTS: [u16; 6] = [53, 80, 81, 8080, 8085, 9090];

fn check(gen: &ClusterGen) -> Result<usize, TestCaseError> {
    let (namespaces, pods, policies) = gen.objects();
    let (cluster, _warnings) = Cluster::from_objects(&namespaces, &pods, &policies);
    let plans: Vec<PolicyPlan> = NODES.iter().map(|n| plan(&cluster, n)).collect();
    let endpoints = endpoints(gen, &cluster);
    let mut checked = 0;
    for (src, from) in &endpoints {
        for (dst, to) in &endpoints {
            if src.ip().is_ipv4() != dst.ip().is_ipv4() {
                continue;
            }
            for protocol in Protocol::ALL {
                for port in PORTS {
                    let want = oracle::allowed(&cluster, src, dst, protocol, port);
                    let packet = Packet {
                        src: src.ip(),
                        dst: dst.ip(),
                        protocol,
                        port,
                        plans: &plans,
                    };
                    let got = packet.passes(*from, *to);
                    prop_assert_eq!(
                        got,
                        want,
                        "{:?} -> {:?} {} {}: plans {:#?}",
                        src,
                        dst,
                        protocol,
                        port,
                        plans
                    );
                    checked += 1;
                }
            }
        }
    }
    Ok(checked)
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]

    #[test]
    fn plans_agree_with_the_oracle(gen in common::cluster()) {
        let checked = check(&gen)?;
        prop_assert!(checked > 0);
    }
}

/// The generator reaches what the property is about: isolated pods, both verdicts.
#[test]
fn generated_clusters_isolate_pods_and_give_both_verdicts() {
    use proptest::strategy::ValueTree;
    use proptest::test_runner::TestRunner;
    let mut runner = TestRunner::deterministic();
    let mut verdicts = BTreeMap::new();
    let mut isolated = 0;
    for _ in 0..200 {
        let gen = common::cluster().new_tree(&mut runner).unwrap().current();
        let (namespaces, pods, policies) = gen.objects();
        let (cluster, _) = Cluster::from_objects(&namespaces, &pods, &policies);
        for node in NODES {
            let plan = plan(&cluster, node);
            isolated += plan
                .pods
                .values()
                .filter(|p| p.ingress.is_some() || p.egress.is_some())
                .count();
        }
        for (src, _) in endpoints(&gen, &cluster) {
            for (dst, _) in endpoints(&gen, &cluster) {
                if src.ip().is_ipv4() == dst.ip().is_ipv4() {
                    let v = oracle::allowed(&cluster, &src, &dst, Protocol::Tcp, 80);
                    *verdicts.entry(v).or_insert(0) += 1;
                }
            }
        }
    }
    println!("isolated pod plans: {isolated}, verdicts: {verdicts:?}");
    assert!(isolated > 100);
    assert!(
        verdicts[&true] > 1000 && verdicts[&false] > 1000,
        "{verdicts:?}"
    );
}
