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
    Cluster, Direction, NamespaceScope, Peer, Peers, PodInfo, PolicyInfo, PortSelector, Ports,
    Protocol, Rule, Selector,
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
        named_to_peers: HashMap::new(),
        selections: HashMap::new(),
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
    named_everywhere: HashMap<(Box<str>, Protocol), Arc<PortAddresses>>,
    /// Egress named ports to listed peers; the policy's namespace is part of the key only
    /// when a peer means "the policy's own namespace".
    named_to_peers: HashMap<NamedKey<'a>, Arc<PortAddresses>>,
    /// Selected pods by (own namespace if the scope is `Own`, scope, pod selector).
    selections: HashMap<SelectionKey<'a>, Arc<[u32]>>,
}

/// Where a named port leads: port → the destination pods' addresses.
type PortAddresses = BTreeMap<u16, Vec<IpAddr>>;
type NamedKey<'a> = (Option<&'a str>, &'a Peers, Box<str>, Protocol);
type SelectionKey<'a> = (Option<&'a str>, &'a NamespaceScope, &'a Selector);

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
            let program = program.get_or_insert_with(Program::default);
            program.isolated_by.push(policy.key.clone());
            let rules = &mut program.rules;
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
        // Egress named ports carry their own addresses: the peer set is needed only for
        // numbered ports and ingress.
        if fixed.is_some() || direction == Direction::Ingress && !names.is_empty() {
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
            if direction == Direction::Ingress && !names.is_empty() {
                out.push(Compiled::IngressNamed {
                    policy: policy.key.clone(),
                    peers,
                    names: names.clone(),
                });
            }
        }
        if direction == Direction::Egress {
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

    /// The pods a peer selects, once per distinct (namespace scope, selector): clusters
    /// repeat the same peers across namespaces ("from the monitoring namespace").
    fn select(
        &mut self,
        policy: &'a PolicyInfo,
        namespaces: &'a NamespaceScope,
        pods: &'a Selector,
    ) -> Arc<[u32]> {
        let own = matches!(namespaces, NamespaceScope::Own).then_some(&*policy.key.namespace);
        let index = &mut self.index;
        self.selections
            .entry((own, namespaces, pods))
            .or_insert_with(|| index.select(&policy.key.namespace, namespaces, pods).into())
            .clone()
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
                    let selected = self.select(policy, namespaces, pods);
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
    ) -> Arc<PortAddresses> {
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
                    by_port.values_mut().for_each(|ips| ips.sort_unstable());
                    Arc::new(by_port)
                })
                .clone();
        };
        let own = list
            .iter()
            .any(|p| {
                matches!(
                    p,
                    Peer::Pods {
                        namespaces: NamespaceScope::Own,
                        ..
                    }
                )
            })
            .then_some(&*policy.key.namespace);
        let cache_key = (own, peers, Box::<str>::from(name), protocol);
        if let Some(done) = self.named_to_peers.get(&cache_key) {
            return done.clone();
        }
        let mut by_port = BTreeMap::<u16, Vec<IpAddr>>::new();
        for peer in list {
            match peer {
                Peer::Pods { namespaces, pods } => {
                    let selected = self.select(policy, namespaces, pods);
                    for i in selected.iter().copied() {
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
        let by_port = Arc::new(by_port);
        self.named_to_peers.insert(cache_key, by_port.clone());
        by_port
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

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::Pod;
    use k8s_openapi::api::networking::v1::NetworkPolicy;
    use serde_json::json;

    fn cluster(pods: serde_json::Value, policies: serde_json::Value) -> Cluster {
        let pods: Vec<Pod> = serde_json::from_value(pods).unwrap();
        let policies: Vec<NetworkPolicy> = serde_json::from_value(policies).unwrap();
        let (cluster, warnings) = Cluster::from_objects(&[], &pods, &policies);
        assert!(warnings.is_empty(), "{warnings:?}");
        cluster
    }

    fn pod(
        name: &str,
        node: &str,
        app: &str,
        ips: &[&str],
        ports: serde_json::Value,
    ) -> serde_json::Value {
        json!({
            "metadata": {"namespace": "shop", "name": name, "labels": {"app": app}},
            "spec": {"nodeName": node, "containers": [{"name": "c", "ports": ports}]},
            "status": {"phase": "Running", "podIPs": ips.iter().map(|ip| json!({"ip": ip})).collect::<Vec<_>>()},
        })
    }

    fn key(name: &str) -> ObjectKey {
        ObjectKey::new("shop", name)
    }

    #[test]
    fn named_ports_resolve_per_destination() {
        let c = cluster(
            json!([
                pod(
                    "web-0",
                    "n1",
                    "web",
                    &["10.0.0.1"],
                    json!([{"name": "http", "containerPort": 8080}])
                ),
                pod(
                    "web-1",
                    "n1",
                    "web",
                    &["10.0.0.2"],
                    json!([{"name": "http", "containerPort": 9000}])
                ),
                pod(
                    "db-0",
                    "n2",
                    "db",
                    &["10.0.1.1", "fd00::1"],
                    json!([{"name": "pg", "containerPort": 5432}])
                ),
                pod(
                    "db-1",
                    "n2",
                    "db",
                    &["10.0.1.2"],
                    json!([{"name": "pg", "containerPort": 5433}])
                ),
            ]),
            json!([
                {"metadata": {"namespace": "shop", "name": "web-in"},
                 "spec": {"podSelector": {"matchLabels": {"app": "web"}},
                          "ingress": [{"ports": [{"port": "http"}]}]}},
                {"metadata": {"namespace": "shop", "name": "web-out"},
                 "spec": {"podSelector": {"matchLabels": {"app": "web"}},
                          "egress": [{"to": [{"ipBlock": {"cidr": "10.0.1.0/24"}}], "ports": [{"port": "pg"}]}]}},
            ]),
        );
        let plan = plan(&c, "n1");
        assert_eq!(
            plan.pods.keys().collect::<Vec<_>>(),
            [&key("web-0"), &key("web-1")]
        );
        let ingress_port = |name: &str| {
            let rules = &plan.pods[&key(name)].ingress.as_ref().unwrap().rules;
            assert_eq!(rules.len(), 1);
            rules[0].ports.clone()
        };
        let tcp = |port| {
            PortMatch::Only(vec![L4Match {
                protocol: Protocol::Tcp,
                ports: Some((port, port)),
            }])
        };
        assert_eq!(ingress_port("web-0"), tcp(8080));
        assert_eq!(ingress_port("web-1"), tcp(9000));

        let egress = &plan.pods[&key("web-0")].egress.as_ref().unwrap().rules;
        let to = |ip: &str| {
            PeerMatch::Only(AddressSet {
                ips: vec![ip.parse().unwrap()],
                blocks: vec![],
            })
        };
        // db-0's IPv6 address is outside the block: only its IPv4 one is reachable.
        let got: Vec<(PeerMatch, PortMatch)> = egress
            .iter()
            .map(|r| (r.peers.clone(), r.ports.clone()))
            .collect();
        assert_eq!(
            got,
            [(to("10.0.1.1"), tcp(5432)), (to("10.0.1.2"), tcp(5433))]
        );
        // The egress rules are compiled once and shared by both selected pods.
        let other = &plan.pods[&key("web-1")].egress.as_ref().unwrap().rules;
        assert!(Arc::ptr_eq(&egress[0], &other[0]));
        assert_eq!(&*egress[0].policy.to_string(), "shop/web-out");
    }

    #[test]
    fn unselected_and_unenforced_pods_and_other_nodes_are_left_alone() {
        let mut host = pod("agent", "n1", "web", &["192.168.0.1"], json!([]));
        host["spec"]["hostNetwork"] = json!(true);
        let mut done = pod("job", "n1", "web", &["10.0.0.9"], json!([]));
        done["status"]["phase"] = json!("Failed");
        let c = cluster(
            json!([
                pod("web-0", "n1", "web", &["10.0.0.1"], json!([])),
                pod("db-0", "n1", "db", &["10.0.0.2"], json!([])),
                pod("web-9", "n2", "web", &["10.0.1.9"], json!([])),
                host,
                done,
                pod("pending", "n1", "web", &[], json!([])),
            ]),
            json!([{"metadata": {"namespace": "shop", "name": "deny"},
                    "spec": {"podSelector": {"matchLabels": {"app": "web"}}}}]),
        );
        let plan = plan(&c, "n1");
        assert_eq!(
            plan.pods.keys().collect::<Vec<_>>(),
            [&key("db-0"), &key("web-0")]
        );
        let web = &plan.pods[&key("web-0")];
        assert_eq!(
            web.ingress,
            Some(Program {
                isolated_by: vec![key("deny")],
                rules: vec![],
            }),
            "isolated by deny, nothing allowed"
        );
        assert_eq!(web.egress, None);
        assert_eq!(plan.pods[&key("db-0")].ingress, None);
    }
}
