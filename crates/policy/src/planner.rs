//! Objects → one node's [`PolicyPlan`].
//!
//! Only the policies selecting a local pod are compiled, each once per direction: peer
//! selectors become address sets through [`PodIndex`], and the compiled rules are shared
//! (`Arc`) by every local pod the policy selects. Only ingress named ports differ per pod
//! (each resolves against the local pod's own container ports); egress named ports resolve
//! against each destination pod, so they become (destination IPs, one port) rules.

use std::collections::{BTreeMap, HashMap};
use std::net::IpAddr;
use std::sync::Arc;

use crate::index::PodIndex;
use crate::key::ObjectKey;
use crate::model::{
    Cluster, Direction, Peer, Peers, PodInfo, PolicyInfo, PortSelector, Ports, Protocol, Rule,
};
use crate::plan::{
    AddressSet, AllowRule, L4Match, PeerMatch, PodProgram, PolicyPlan, PortMatch, Program,
};

/// The plan for the pods on `node`: every live, non-hostNetwork pod scheduled there.
pub fn plan(cluster: &Cluster, node: &str) -> PolicyPlan {
    let mut planner = Planner {
        index: PodIndex::new(cluster),
        compiled: HashMap::new(),
        named_everywhere: HashMap::new(),
    };
    let mut by_namespace: HashMap<&str, Vec<&PolicyInfo>> = HashMap::new();
    for policy in cluster.policies.values() {
        by_namespace
            .entry(&policy.key.namespace)
            .or_default()
            .push(policy);
    }
    let local = cluster
        .pods
        .values()
        .filter(|p| p.is_policy_pod() && p.node.as_deref() == Some(node));
    let mut pods = BTreeMap::new();
    for pod in local {
        let selecting: Vec<&PolicyInfo> = by_namespace
            .get(&*pod.key.namespace)
            .into_iter()
            .flatten()
            .copied()
            .filter(|p| p.pod_selector.matches(&pod.labels))
            .collect();
        let program = PodProgram {
            ips: pod.ips.clone(),
            ingress: planner.program(&selecting, Direction::Ingress, pod),
            egress: planner.program(&selecting, Direction::Egress, pod),
        };
        pods.insert(pod.key.clone(), program);
    }
    PolicyPlan {
        node: node.into(),
        pods,
    }
}

struct Planner<'a> {
    index: PodIndex<'a>,
    compiled: HashMap<(&'a ObjectKey, Direction), Arc<[Compiled]>>,
    /// Egress named ports with any destination: (name, protocol) → port → pod IPs.
    named_everywhere: HashMap<(Box<str>, Protocol), Arc<BTreeMap<u16, Vec<IpAddr>>>>,
}

/// A policy rule compiled for every pod the policy selects.
enum Compiled {
    Fixed(Arc<AllowRule>),
    /// Ingress named ports: the peers are fixed, the ports depend on the local pod.
    IngressNamed {
        policy: ObjectKey,
        peers: PeerMatch,
        names: Vec<(Box<str>, Protocol)>,
    },
}

impl<'a> Planner<'a> {
    fn program(
        &mut self,
        selecting: &[&'a PolicyInfo],
        direction: Direction,
        pod: &PodInfo,
    ) -> Option<Program> {
        let isolating = selecting.iter().filter(|p| p.isolates(direction));
        let mut program: Option<Program> = None;
        for policy in isolating {
            let rules = &mut program.get_or_insert_with(Program::default).rules;
            for compiled in self.compiled(policy, direction).iter() {
                match compiled {
                    Compiled::Fixed(rule) => rules.push(rule.clone()),
                    Compiled::IngressNamed {
                        policy,
                        peers,
                        names,
                    } => {
                        let mut l4: Vec<L4Match> = names
                            .iter()
                            .filter_map(|(name, protocol)| {
                                let port = pod.named_port(name, *protocol)?;
                                Some(L4Match {
                                    protocol: *protocol,
                                    ports: Some((port, port)),
                                })
                            })
                            .collect();
                        if !l4.is_empty() {
                            l4.sort();
                            l4.dedup();
                            rules.push(Arc::new(AllowRule {
                                policy: policy.clone(),
                                peers: peers.clone(),
                                ports: PortMatch::Only(l4),
                            }));
                        }
                    }
                }
            }
        }
        program
    }

    fn compiled(&mut self, policy: &'a PolicyInfo, direction: Direction) -> Arc<[Compiled]> {
        if let Some(done) = self.compiled.get(&(&policy.key, direction)) {
            return done.clone();
        }
        let mut out = Vec::new();
        for rule in policy.rules(direction) {
            self.compile_rule(policy, direction, rule, &mut out);
        }
        let out: Arc<[Compiled]> = out.into();
        self.compiled.insert((&policy.key, direction), out.clone());
        out
    }

    fn compile_rule(
        &mut self,
        policy: &'a PolicyInfo,
        direction: Direction,
        rule: &'a Rule,
        out: &mut Vec<Compiled>,
    ) {
        let (fixed, names) = split_ports(&rule.ports);
        let peers = self.peer_addresses(policy, &rule.peers);
        if matches!(&peers, PeerMatch::Only(set) if set.is_empty()) {
            return;
        }
        if let Some(ports) = fixed {
            out.push(Compiled::Fixed(Arc::new(AllowRule {
                policy: policy.key.clone(),
                peers: peers.clone(),
                ports,
            })));
        }
        if names.is_empty() {
            return;
        }
        match direction {
            Direction::Ingress => out.push(Compiled::IngressNamed {
                policy: policy.key.clone(),
                peers,
                names,
            }),
            Direction::Egress => {
                for (name, protocol) in &names {
                    let by_port = self.egress_named(policy, &rule.peers, name, *protocol);
                    for (port, ips) in by_port.iter() {
                        out.push(Compiled::Fixed(Arc::new(AllowRule {
                            policy: policy.key.clone(),
                            peers: PeerMatch::Only(AddressSet {
                                ips: ips.clone(),
                                blocks: Vec::new(),
                            }),
                            ports: PortMatch::Only(vec![L4Match {
                                protocol: *protocol,
                                ports: Some((*port, *port)),
                            }]),
                        })));
                    }
                }
            }
        }
    }

    /// Peers as addresses: the IPs of the pods their selectors match, and their blocks.
    fn peer_addresses(&mut self, policy: &'a PolicyInfo, peers: &'a Peers) -> PeerMatch {
        let Peers::Only(list) = peers else {
            return PeerMatch::Any;
        };
        let mut set = AddressSet::default();
        for peer in list {
            match peer {
                Peer::Block(block) => set.blocks.push(block.clone()),
                Peer::Pods { namespaces, pods } => {
                    let selected = self.index.select(&policy.key.namespace, namespaces, pods);
                    let ips = selected.iter().map(|i| &self.index.pods[*i as usize].ips);
                    set.ips.extend(ips.flatten());
                }
            }
        }
        set.normalize();
        PeerMatch::Only(set)
    }

    /// Where an egress named port leads: destination port → the matching pods' IPs (only the
    /// IPs a block peer covers, all IPs of selector-matched pods).
    fn egress_named(
        &mut self,
        policy: &'a PolicyInfo,
        peers: &'a Peers,
        name: &str,
        protocol: Protocol,
    ) -> Arc<BTreeMap<u16, Vec<IpAddr>>> {
        let Peers::Only(list) = peers else {
            let index = &self.index;
            return self
                .named_everywhere
                .entry((name.into(), protocol))
                .or_insert_with(|| {
                    let mut by_port = BTreeMap::<u16, Vec<IpAddr>>::new();
                    for pod in &index.pods {
                        if let Some(port) = pod.named_port(name, protocol) {
                            by_port.entry(port).or_default().extend(&pod.ips);
                        }
                    }
                    Arc::new(by_port)
                })
                .clone();
        };
        let mut by_port = BTreeMap::<u16, Vec<IpAddr>>::new();
        for peer in list {
            match peer {
                Peer::Pods { namespaces, pods } => {
                    let selected = self.index.select(&policy.key.namespace, namespaces, pods);
                    for i in selected {
                        let pod = self.index.pods[i as usize];
                        if let Some(port) = pod.named_port(name, protocol) {
                            by_port.entry(port).or_default().extend(&pod.ips);
                        }
                    }
                }
                Peer::Block(block) => {
                    for pod in &self.index.pods {
                        let Some(port) = pod.named_port(name, protocol) else {
                            continue;
                        };
                        let ips = pod.ips.iter().filter(|ip| block.contains(**ip));
                        by_port.entry(port).or_default().extend(ips);
                    }
                }
            }
        }
        by_port.retain(|_, ips| {
            ips.sort_unstable();
            ips.dedup();
            !ips.is_empty()
        });
        Arc::new(by_port)
    }
}

/// A rule's ports as numbers (`None`: the rule has only named ports, or none readable) and
/// the named ones. `Ports::Only` left with neither allows nothing.
fn split_ports(ports: &Ports) -> (Option<PortMatch>, Vec<(Box<str>, Protocol)>) {
    let Ports::Only(specs) = ports else {
        return (Some(PortMatch::Any), Vec::new());
    };
    let mut numbers = Vec::new();
    let mut names = Vec::new();
    for spec in specs {
        match &spec.port {
            PortSelector::All => numbers.push(L4Match {
                protocol: spec.protocol,
                ports: None,
            }),
            PortSelector::Range(first, last) => numbers.push(L4Match {
                protocol: spec.protocol,
                ports: Some((*first, *last)),
            }),
            PortSelector::Named(name) => names.push((name.clone(), spec.protocol)),
        }
    }
    numbers.sort();
    numbers.dedup();
    names.sort();
    names.dedup();
    (
        (!numbers.is_empty()).then_some(PortMatch::Only(numbers)),
        names,
    )
}
