//! Objects → one node's [`PolicyPlan`], kept current change by change.
//!
//! [`NodePlanner`] owns the objects ([`Cluster`]), the pod index and every policy it has
//! compiled. Only the policies selecting a local pod are compiled, each once per direction:
//! peer selectors become address sets through [`PodIndex`], and the compiled rules are
//! shared (`Arc`) by every local pod the policy selects. A change drops only the compiled
//! policies it can affect (a pod a peer of theirs matches before or after, a named port, a
//! namespace's labels, the policy itself) and marks the local pods whose programs it can
//! change; each plan makes only those programs again, compiling what was dropped, and keeps
//! the others (shared `Arc`s, so a plan after one change costs what the change touched, not
//! the node: this machine's caches are cold after a second idle). Only ingress named ports
//! differ per pod (each resolves against the local pod's own container ports); egress named
//! ports resolve against each destination pod, so they become (destination IPs, one port)
//! rules.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::net::IpAddr;
use std::sync::Arc;

use crate::index::{in_scope, PodIndex};
use crate::key::ObjectKey;
use crate::model::{
    Cluster, Direction, NamespaceInfo, NamespaceScope, Peer, Peers, PodInfo, PolicyInfo,
    PortSelector, Ports, Protocol, Rule, Selector,
};
use crate::plan::{
    AddressSet, AllowRule, L4Match, PeerMatch, PodProgram, PolicyPlan, PortMatch, Program,
};

/// The plan for the pods on `node`: every live, non-hostNetwork pod scheduled there.
pub fn plan(cluster: &Cluster, node: &str) -> PolicyPlan {
    NodePlanner::new(cluster.clone(), node).plan()
}

/// One node's planner: the cluster as the agent sees it, and what planning it needs kept
/// between changes. Equal plans to [`plan`] of the same objects, after any changes
/// (`tests/incremental.rs`).
pub struct NodePlanner {
    node: Arc<str>,
    cluster: Cluster,
    index: PodIndex,
    /// Live, non-hostNetwork pods on this node.
    local: BTreeSet<ObjectKey>,
    /// Each with the policy it was compiled from (a change checks it without a lookup).
    compiled: HashMap<(ObjectKey, Direction), CompiledPolicy>,
    /// Namespaces holding policy pods that a namespace selector matches.
    namespace_matches: HashMap<Selector, Arc<[Arc<str>]>>,
    /// The last plan's programs, and for each local pod the policies that selected it
    /// then; for each policy the local pods it selected.
    programs: BTreeMap<ObjectKey, Arc<PodProgram>>,
    selected_by: HashMap<ObjectKey, Vec<ObjectKey>>,
    selects: HashMap<ObjectKey, BTreeSet<ObjectKey>>,
    /// Local pods (or pods that were local) whose programs the next plan makes again.
    dirty: BTreeSet<ObjectKey>,
}

impl NodePlanner {
    pub fn new(cluster: Cluster, node: &str) -> NodePlanner {
        let index = PodIndex::new(&cluster);
        let mut planner = NodePlanner {
            node: node.into(),
            cluster: Cluster::default(),
            index,
            local: BTreeSet::new(),
            compiled: HashMap::new(),
            namespace_matches: HashMap::new(),
            programs: BTreeMap::new(),
            selected_by: HashMap::new(),
            selects: HashMap::new(),
            dirty: BTreeSet::new(),
        };
        planner.local = cluster
            .pods
            .values()
            .filter(|p| planner.is_local(p))
            .map(|p| p.key.clone())
            .collect();
        planner.dirty = planner.local.clone();
        planner.cluster = cluster;
        planner
    }

    /// Drops compiled policies `keep` says no to; the local pods they selected are planned
    /// again.
    fn drop_compiled(&mut self, keep: impl Fn(&Cluster, &PolicyInfo, Direction) -> bool) {
        let (cluster, selects, dirty) = (&self.cluster, &self.selects, &mut self.dirty);
        self.compiled.retain(|(key, direction), (policy, _)| {
            let kept = keep(cluster, policy, *direction);
            if !kept {
                dirty.extend(selects.get(key).into_iter().flatten().cloned());
            }
            kept
        });
    }

    pub fn cluster(&self) -> &Cluster {
        &self.cluster
    }

    fn is_local(&self, pod: &PodInfo) -> bool {
        pod.is_policy_pod() && pod.node.as_deref() == Some(&*self.node)
    }

    pub fn insert_namespace(&mut self, ns: impl Into<Arc<NamespaceInfo>>) {
        self.cluster.insert_namespace(ns);
        self.namespace_changed();
    }

    pub fn remove_namespace(&mut self, name: &str) -> bool {
        let removed = self.cluster.remove_namespace(name);
        self.namespace_changed();
        removed
    }

    /// Namespace labels decide namespace selectors: every compiled policy with one goes.
    fn namespace_changed(&mut self) {
        self.namespace_matches.clear();
        self.drop_compiled(|_, policy, direction| {
            !policy.rules(direction).iter().any(|rule| {
                matches!(&rule.peers, Peers::Only(list) if list.iter().any(|peer| matches!(
                    peer,
                    Peer::Pods { namespaces: NamespaceScope::Matching(_), .. }
                )))
            })
        });
    }

    pub fn insert_pod(&mut self, pod: impl Into<Arc<PodInfo>>) {
        let pod = pod.into();
        let old = self.cluster.pods.get(&pod.key).cloned();
        self.cluster.insert_pod(pod.clone());
        self.pod_changed(old, Some(pod));
    }

    pub fn remove_pod(&mut self, key: &ObjectKey) -> bool {
        let old = self.cluster.pods.remove(key);
        let removed = old.is_some();
        self.pod_changed(old, None);
        removed
    }

    fn pod_changed(&mut self, old: Option<Arc<PodInfo>>, new: Option<Arc<PodInfo>>) {
        // A namespace gaining its first policy pod or losing its last changes which
        // namespaces a selector's list holds.
        let mut namespaces_changed = false;
        if let Some(old) = &old {
            namespaces_changed |= self.index.remove(&old.key);
            if self.local.remove(&old.key) {
                self.dirty.insert(old.key.clone());
            }
        }
        if let Some(new) = &new {
            namespaces_changed |= self.index.insert(new);
            if self.is_local(new) {
                self.local.insert(new.key.clone());
                self.dirty.insert(new.key.clone());
            }
        }
        if namespaces_changed {
            self.namespace_matches.clear();
        }
        let versions: Vec<&PodInfo> = [&old, &new]
            .into_iter()
            .flatten()
            .map(|p| &**p)
            .filter(|p| p.is_policy_pod())
            .collect();
        if versions.is_empty() {
            return;
        }
        self.drop_compiled(|cluster, policy, direction| {
            !versions
                .iter()
                .any(|pod| depends_on(cluster, policy, direction, pod))
        });
    }

    pub fn insert_policy(&mut self, policy: impl Into<Arc<PolicyInfo>>) {
        let policy = policy.into();
        self.forget_policy(&policy.key);
        self.cluster.insert_policy(policy);
    }

    pub fn remove_policy(&mut self, key: &ObjectKey) -> bool {
        self.forget_policy(key);
        self.cluster.remove_policy(key)
    }

    /// A policy comes, goes or changes: what it compiled to goes, and the local pods of its
    /// namespace are planned again (the old version selected some, the new one may select
    /// others).
    fn forget_policy(&mut self, key: &ObjectKey) {
        for direction in [Direction::Ingress, Direction::Egress] {
            self.compiled.remove(&(key.clone(), direction));
        }
        let from = ObjectKey {
            namespace: key.namespace.clone(),
            name: "".into(),
        };
        let in_namespace = self.local.range(from..);
        let in_namespace = in_namespace.take_while(|k| k.namespace == key.namespace);
        self.dirty.extend(in_namespace.cloned());
    }

    /// The plan for this node's pods now: the programs of the pods the changes since the
    /// last plan touched are made again, the others kept.
    pub fn plan(&mut self) -> PolicyPlan {
        let mut compiler = Compiler {
            cluster: &self.cluster,
            index: &self.index,
            namespace_matches: &mut self.namespace_matches,
            selections: HashMap::new(),
            named_everywhere: HashMap::new(),
            named_to_peers: HashMap::new(),
        };
        for key in std::mem::take(&mut self.dirty) {
            for policy in self.selected_by.remove(&key).into_iter().flatten() {
                if let Some(pods) = self.selects.get_mut(&policy) {
                    pods.remove(&key);
                    if pods.is_empty() {
                        self.selects.remove(&policy);
                    }
                }
            }
            if !self.local.contains(&key) {
                self.programs.remove(&key);
                continue;
            }
            let pod = &self.cluster.pods[&key];
            let selecting: Vec<&Arc<PolicyInfo>> = policies_in(&self.cluster, &key.namespace)
                .filter(|p| p.pod_selector.matches(&pod.labels))
                .collect();
            for policy in &selecting {
                let pods = self.selects.entry(policy.key.clone()).or_default();
                pods.insert(key.clone());
            }
            let selected_by = selecting.iter().map(|p| p.key.clone()).collect();
            self.selected_by.insert(key.clone(), selected_by);
            let mut program = |direction| {
                let isolating = selecting.iter().filter(|p| p.isolates(direction));
                let mut program: Option<Program> = None;
                for policy in isolating {
                    let (_, compiled) = self
                        .compiled
                        .entry((policy.key.clone(), direction))
                        .or_insert_with(|| {
                            let rules = compiler.compile(policy, direction);
                            (Arc::clone(policy), rules)
                        })
                        .clone();
                    let program = program.get_or_insert_with(Program::default);
                    program.isolated_by.push(policy.key.clone());
                    add_rules(&mut program.rules, &compiled, pod);
                }
                program
            };
            let program = PodProgram {
                ips: pod.ips.clone(),
                ingress: program(Direction::Ingress),
                egress: program(Direction::Egress),
            };
            // An unchanged program keeps its allocation: later comparisons cost a pointer.
            if self.programs.get(&key).map(|p| &**p) != Some(&program) {
                self.programs.insert(key, Arc::new(program));
            }
        }
        PolicyPlan {
            node: self.node.clone(),
            pods: self.programs.clone(),
        }
    }
}

/// The policies of `namespace`, in key order (keys sort by namespace first).
fn policies_in<'a>(
    cluster: &'a Cluster,
    namespace: &Arc<str>,
) -> impl Iterator<Item = &'a Arc<PolicyInfo>> + use<'a> {
    let namespace = namespace.clone();
    let from = ObjectKey {
        namespace: namespace.clone(),
        name: "".into(),
    };
    cluster
        .policies
        .range(from..)
        .take_while(move |(k, _)| k.namespace == namespace)
        .map(|(_, p)| p)
}

/// Whether what `policy` compiles to in `direction` can change when `pod` (a policy pod)
/// comes, goes or changes: a peer of a rule selects it, or an egress rule's named port could
/// lead to it (the pod has a port of that name, and the rule allows any peer or a block
/// covering the pod). Errs on the side of yes.
fn depends_on(cluster: &Cluster, policy: &PolicyInfo, direction: Direction, pod: &PodInfo) -> bool {
    let has_port = |name: &str| pod.named_ports.iter().any(|((n, _), _)| **n == *name);
    policy.rules(direction).iter().any(|rule| {
        let named_here = direction == Direction::Egress
            && matches!(&rule.ports, Ports::Only(specs) if specs.iter().any(|s| {
                matches!(&s.port, PortSelector::Named(name) if has_port(name))
            }));
        let Peers::Only(list) = &rule.peers else {
            return named_here;
        };
        list.iter().any(|peer| match peer {
            Peer::Pods { namespaces, pods } => {
                in_scope(
                    cluster,
                    &policy.key.namespace,
                    namespaces,
                    &pod.key.namespace,
                ) && pods.matches(&pod.labels)
            }
            Peer::Block(block) => named_here && pod.ips.iter().any(|ip| block.cidr.contains(ip)),
        })
    })
}
/// `compiled` as rules for `pod`: ingress named ports resolve against its own ports.
fn add_rules(rules: &mut Vec<Arc<AllowRule>>, compiled: &[Compiled], pod: &PodInfo) {
    for compiled in compiled {
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

/// A policy's rules in one direction, and the policy they come from.
type CompiledPolicy = (Arc<PolicyInfo>, Arc<[Compiled]>);

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

/// One plan's compiling: caches that live as long as the objects cannot change.
struct Compiler<'a> {
    cluster: &'a Cluster,
    index: &'a PodIndex,
    namespace_matches: &'a mut HashMap<Selector, Arc<[Arc<str>]>>,
    /// Egress named ports with any destination: (name, protocol) → port → pod IPs.
    named_everywhere: HashMap<(Box<str>, Protocol), Arc<PortAddresses>>,
    /// Egress named ports to listed peers; the policy's namespace is part of the key only
    /// when a peer means "the policy's own namespace".
    named_to_peers: HashMap<NamedKey<'a>, Arc<PortAddresses>>,
    /// Selected pods by (own namespace if the scope is `Own`, scope, pod selector).
    selections: HashMap<SelectionKey<'a>, Arc<[&'a PodInfo]>>,
}

/// Where a named port leads: port → the destination pods' addresses.
type PortAddresses = BTreeMap<u16, Vec<IpAddr>>;
type NamedKey<'a> = (Option<&'a str>, &'a Peers, Box<str>, Protocol);
type SelectionKey<'a> = (Option<&'a str>, &'a NamespaceScope, &'a Selector);

impl<'a> Compiler<'a> {
    fn compile(&mut self, policy: &'a PolicyInfo, direction: Direction) -> Arc<[Compiled]> {
        let mut out = Vec::new();
        for rule in policy.rules(direction) {
            self.compile_rule(policy, direction, rule, &mut out);
        }
        out.into()
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
    ) -> Arc<[&'a PodInfo]> {
        let own = matches!(namespaces, NamespaceScope::Own).then_some(&*policy.key.namespace);
        if let Some(done) = self.selections.get(&(own, namespaces, pods)) {
            return done.clone();
        }
        let (cluster, index) = (self.cluster, self.index);
        let scoped: Arc<[Arc<str>]> = match namespaces {
            NamespaceScope::Own => Arc::new([policy.key.namespace.clone()]),
            NamespaceScope::Matching(selector) => self
                .namespace_matches
                .entry(selector.clone())
                .or_insert_with(|| index.matching_namespaces(cluster, selector).into())
                .clone(),
        };
        let scoped: Vec<&str> = scoped.iter().map(|n| &**n).collect();
        let selected: Arc<[&'a PodInfo]> = index.select(&scoped, pods).into();
        self.selections
            .insert((own, namespaces, pods), selected.clone());
        selected
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
                    set.ips.extend(selected.iter().flat_map(|p| &p.ips));
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
            let index = self.index;
            return self
                .named_everywhere
                .entry((name.into(), protocol))
                .or_insert_with(|| {
                    let mut by_port = BTreeMap::<u16, Vec<IpAddr>>::new();
                    for pod in index.pods() {
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
                    for pod in selected.iter() {
                        if let Some(port) = pod.named_port(name, protocol) {
                            by_port.entry(port).or_default().extend(&pod.ips);
                        }
                    }
                }
                Peer::Block(block) => {
                    for pod in self.index.pods() {
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
    use crate::model::NamespaceInfo;
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

    /// A namespace relabelled, a peer pod relabelled, a policy replaced: each change reaches
    /// the compiled rules it affects, and only those are compiled again.
    #[test]
    fn a_kept_planner_follows_each_kind_of_change() {
        let c = cluster(
            json!([
                pod("web-0", "n1", "web", &["10.0.0.1"], json!([])),
                {"metadata": {"namespace": "ops", "name": "prom", "labels": {"app": "prom"}},
                 "spec": {"nodeName": "n2", "containers": [{"name": "c"}]},
                 "status": {"phase": "Running", "podIP": "10.0.1.1"}},
            ]),
            json!([{"metadata": {"namespace": "shop", "name": "from-monitoring"},
                    "spec": {"podSelector": {},
                             "ingress": [{"from": [{"namespaceSelector": {"matchLabels": {"team": "monitoring"}},
                                                    "podSelector": {"matchLabels": {"app": "prom"}}}]}]}}]),
        );
        let mut planner = NodePlanner::new(c, "n1");
        let peers = |planner: &mut NodePlanner| -> Vec<PeerMatch> {
            let plan = planner.plan();
            let ingress = plan.pods[&key("web-0")].ingress.clone().unwrap();
            ingress.rules.iter().map(|r| r.peers.clone()).collect()
        };
        assert_eq!(
            peers(&mut planner),
            vec![],
            "ops is not labelled team=monitoring yet"
        );
        let ops = |team: &str| {
            NamespaceInfo::new("ops", [("team".into(), team.into())].into_iter().collect())
        };
        planner.insert_namespace(ops("monitoring"));
        let prom = PeerMatch::Only(AddressSet {
            ips: vec!["10.0.1.1".parse().unwrap()],
            blocks: vec![],
        });
        assert_eq!(peers(&mut planner), vec![prom.clone()]);

        // The peer relabelled: it no longer matches.
        let mut relabelled = (*planner.cluster().pods[&ObjectKey::new("ops", "prom")]).clone();
        relabelled.labels = [("app".into(), "other".into())].into_iter().collect();
        planner.insert_pod(relabelled.clone());
        assert_eq!(peers(&mut planner), vec![]);
        relabelled.labels = [("app".into(), "prom".into())].into_iter().collect();
        planner.insert_pod(relabelled);
        assert_eq!(peers(&mut planner), vec![prom]);

        planner.insert_namespace(ops("dev"));
        assert_eq!(peers(&mut planner), vec![]);
        planner.remove_policy(&key("from-monitoring"));
        assert_eq!(planner.plan().pods[&key("web-0")].ingress, None);
    }
}
