//! `weir doctor`'s NetworkPolicy checks: the classic mistakes, judged from the objects
//! ([`Objects`]: a manifest directory or a `kubectl get -o yaml` dump) with weir-policy's own
//! model and selectors, the ones `weir policy` enforces with. Pure.
//!
//! - `policy-dns`: pods isolated for egress whose policies allow no UDP or TCP port 53 to
//!   anything: every name lookup fails (the default-deny-egress namespace without DNS).
//! - `policy-selector`: a policy whose podSelector matches no pod of its namespace (a typo
//!   in a label, or a label the pods lost): it protects nothing.
//! - `policy-named-port`: a named port no pod the rule reaches declares (ingress: the pods the
//!   policy selects; egress: the destination pods), so the rule allows nothing.
//! - `policy-ip-family`: a rule whose ipBlocks are all IPv4 (or all IPv6) in a policy selecting
//!   dual-stack pods: the pods' traffic of the other family from (to) those places is denied,
//!   the classic dual-stack surprise (`0.0.0.0/0` egress with no `::/0`).

use std::collections::BTreeMap;

use weir_policy::model::{
    Cluster, Direction, PodInfo, PolicyInfo, PortSelector, Ports, Protocol, Requirement, Rule,
    Selector,
};
use weir_policy::model::{IpBlock, Peer, Peers};

use crate::check::{Check, Status};
use crate::objects::Objects;

/// What the checks say when there are no objects to judge.
const NO_OBJECTS: &str = "no Kubernetes objects: give `--objects FILE|DIR` (manifests, or `kubectl get namespaces,pods,networkpolicies -A -o yaml`), or save that dump in the --dir directory";

/// The pods a selector can select: not hostNetwork (the node itself, reached only through
/// ipBlock) and not finished. Pods without an address yet count: the mistake is in the
/// objects whether or not the pod is running.
fn candidates(c: &Cluster) -> impl Iterator<Item = &PodInfo> {
    c.pods
        .values()
        .map(|p| &**p)
        .filter(|p| !p.host_network && !p.terminated)
}

fn selected<'a>(c: &'a Cluster, policy: &PolicyInfo) -> Vec<&'a PodInfo> {
    candidates(c).filter(|p| policy.selects(p)).collect()
}

/// The pods a rule's peers reach: every pod for no `to`/`from`, the pods a selector peer
/// selects, the pods with an address in an ipBlock.
fn peer_pods<'a>(c: &'a Cluster, policy: &PolicyInfo, peers: &Peers) -> Vec<&'a PodInfo> {
    candidates(c)
        .filter(|pod| match peers {
            Peers::Any => true,
            Peers::Only(list) => list.iter().any(|peer| match peer {
                Peer::Block(b) => pod.ips.iter().any(|ip| b.contains(*ip)),
                Peer::Pods { .. } => peer.selects_pod(c, &policy.key.namespace, pod),
            }),
        })
        .collect()
}

/// The check's input, or the check skipped saying what it lacks.
fn input(objects: Option<&Objects>, c: Check, needs_pods: bool) -> Result<&Cluster, Check> {
    let Some(o) = objects else {
        return Err(c.skip(NO_OBJECTS));
    };
    let cluster = &o.cluster;
    if cluster.policies.is_empty() {
        let mut c = c;
        c.note(format!(
            "no NetworkPolicy in the objects ({})",
            o.files.join(", ")
        ));
        return Err(c);
    }
    if needs_pods && cluster.pods.is_empty() {
        return Err(c.skip("no Pods in the objects: which pods the policies select is unknown (add `pods` to the kubectl get)"));
    }
    Ok(cluster)
}

/// `policy-dns`: pods isolated for egress with no DNS allowed.
pub fn policy_dns(objects: Option<&Objects>) -> Check {
    let c = Check::new(
        "policy-dns",
        "pods isolated for egress can reach DNS (UDP/TCP 53)",
    );
    let cluster = match input(objects, c.clone(), true) {
        Ok(cluster) => cluster,
        Err(done) => return done,
    };
    let mut c = c;
    // The isolating policies → the pods they leave without DNS.
    let mut without: BTreeMap<Vec<String>, Vec<String>> = BTreeMap::new();
    let mut isolated = 0;
    for pod in candidates(cluster) {
        let isolating: Vec<&PolicyInfo> = cluster
            .policies
            .values()
            .map(|p| &**p)
            .filter(|p| p.isolates(Direction::Egress) && p.selects(pod))
            .collect();
        if isolating.is_empty() {
            continue;
        }
        isolated += 1;
        let dns = isolating.iter().any(|p| {
            p.rules(Direction::Egress)
                .iter()
                .any(|r| allows_dns(cluster, p, r))
        });
        if !dns {
            let keys = isolating.iter().map(|p| p.key.to_string()).collect();
            without.entry(keys).or_default().push(pod.key.to_string());
        }
    }
    for (policies, pods) in &without {
        c.found(
            Status::Warn,
            format!(
                "{} isolated for egress by {}: no rule allows UDP or TCP port 53 to anything, so every name lookup fails",
                pods.join(", "),
                policies.join(", ")
            ),
        );
    }
    if without.is_empty() {
        c.note(format!(
            "{isolated} pod(s) isolated for egress; each may reach port 53"
        ));
    } else {
        c.add_fix("add an egress rule to one of those policies (or a policy of its own selecting the pods) allowing DNS: `to: [{namespaceSelector: {matchLabels: {kubernetes.io/metadata.name: kube-system}}, podSelector: {matchLabels: {k8s-app: kube-dns}}}]`, `ports: [{protocol: UDP, port: 53}, {protocol: TCP, port: 53}]`");
    }
    c
}

/// Whether an egress rule lets some UDP or TCP traffic to port 53 through: its peers are not
/// empty and a port entry covers 53 (a named port: as some destination pod declares it).
fn allows_dns(c: &Cluster, policy: &PolicyInfo, rule: &Rule) -> bool {
    if matches!(&rule.peers, Peers::Only(list) if list.is_empty()) {
        return false;
    }
    let specs = match &rule.ports {
        Ports::Any => return true,
        Ports::Only(specs) => specs,
    };
    specs.iter().any(|s| {
        matches!(s.protocol, Protocol::Udp | Protocol::Tcp)
            && match &s.port {
                PortSelector::All => true,
                PortSelector::Range(first, last) => (*first..=*last).contains(&53),
                PortSelector::Named(name) => peer_pods(c, policy, &rule.peers)
                    .iter()
                    .any(|p| p.named_port(name, s.protocol) == Some(53)),
            }
    })
}

/// `policy-selector`: policies that select no pod.
pub fn policy_selector(objects: Option<&Objects>) -> Check {
    let c = Check::new(
        "policy-selector",
        "every NetworkPolicy's podSelector matches a pod",
    );
    let cluster = match input(objects, c.clone(), true) {
        Ok(cluster) => cluster,
        Err(done) => return done,
    };
    let mut c = c;
    let mut empty = 0;
    for policy in cluster.policies.values() {
        if !selected(cluster, policy).is_empty() {
            continue;
        }
        // `{}` in a namespace without pods protects pods yet to come: not a mistake.
        if policy.pod_selector.selects_everything() {
            empty += 1;
            continue;
        }
        let ns = &policy.key.namespace;
        c.found(
            Status::Warn,
            format!(
                "{}: podSelector {} matches no pod in namespace {ns}{}",
                policy.key,
                selector_text(&policy.pod_selector),
                label_hint(cluster, ns, &policy.pod_selector)
            ),
        );
        c.add_fix("correct the podSelector (or the pods' labels): `kubectl -n <ns> get pods --show-labels`; a policy that selects nothing isolates and allows nothing");
    }
    if empty > 0 {
        c.note(format!(
            "{empty} policy(ies) with `podSelector: {{}}` in a namespace without pods (they apply to pods yet to come)"
        ));
    }
    c
}

/// "app=web", "tier in (a,b)", "!legacy", … joined with commas; `{}` for everything.
fn selector_text(s: &Selector) -> String {
    if s.selects_everything() {
        return "{}".into();
    }
    s.requirements
        .iter()
        .map(|r| match r {
            Requirement::In(k, v) if v.len() == 1 => format!("{k}={}", v[0]),
            Requirement::In(k, v) => format!("{k} in ({})", v.join(",")),
            Requirement::NotIn(k, v) => format!("{k} notin ({})", v.join(",")),
            Requirement::Exists(k) => k.to_string(),
            Requirement::DoesNotExist(k) => format!("!{k}"),
        })
        .collect::<Vec<_>>()
        .join(",")
}

/// The values the namespace's pods have for the selector's keys: the label one meant is
/// usually among them.
fn label_hint(c: &Cluster, namespace: &str, s: &Selector) -> String {
    let mut seen: Vec<String> = Vec::new();
    for r in &s.requirements {
        let key = match r {
            Requirement::In(k, _)
            | Requirement::NotIn(k, _)
            | Requirement::Exists(k)
            | Requirement::DoesNotExist(k) => k,
        };
        for pod in candidates(c).filter(|p| *p.key.namespace == *namespace) {
            if let Some(v) = pod.labels.get(key) {
                let pair = format!("{key}={v}");
                if !seen.contains(&pair) {
                    seen.push(pair);
                }
            }
        }
    }
    let pods = candidates(c)
        .filter(|p| *p.key.namespace == *namespace)
        .count();
    match (pods, seen.is_empty()) {
        (0, _) => " (the namespace has no pods in the objects)".into(),
        (_, true) => format!(" (none of its {pods} pod(s) has those label keys)"),
        (_, false) => format!(" (its pods have {})", seen.join(", ")),
    }
}

/// `policy-named-port`: named ports no pod the rule reaches declares.
pub fn policy_named_port(objects: Option<&Objects>) -> Check {
    let c = Check::new(
        "policy-named-port",
        "every named port in a policy is declared by a pod it reaches",
    );
    let cluster = match input(objects, c.clone(), true) {
        Ok(cluster) => cluster,
        Err(done) => return done,
    };
    let mut c = c;
    for policy in cluster.policies.values() {
        let own = selected(cluster, policy);
        for direction in [Direction::Ingress, Direction::Egress] {
            for (i, rule) in policy.rules(direction).iter().enumerate() {
                let Ports::Only(specs) = &rule.ports else {
                    continue;
                };
                // Ingress: the policy's own pods serve the port; egress: the destinations.
                let (pods, whose) = match direction {
                    Direction::Ingress if own.is_empty() => continue,
                    Direction::Ingress => (own.clone(), "pod(s) it selects"),
                    Direction::Egress => (
                        peer_pods(cluster, policy, &rule.peers),
                        "destination pod(s)",
                    ),
                };
                for s in specs {
                    let PortSelector::Named(name) = &s.port else {
                        continue;
                    };
                    if pods
                        .iter()
                        .any(|p| p.named_port(name, s.protocol).is_some())
                    {
                        continue;
                    }
                    let field = match direction {
                        Direction::Ingress => format!("spec.ingress[{i}]"),
                        Direction::Egress => format!("spec.egress[{i}]"),
                    };
                    c.found(
                        Status::Warn,
                        format!(
                            "{}: {field} port {name:?} ({}): none of its {} {whose} declares it{}, so the entry allows nothing",
                            policy.key,
                            s.protocol,
                            pods.len(),
                            other_protocol_hint(&pods, name, s.protocol)
                        ),
                    );
                    c.add_fix("name a port the pods declare (`containers[].ports[].name`, with the same protocol), or use the number");
                }
            }
        }
    }
    c
}

/// "(web-0 declares it as UDP)": the name exists with another protocol.
fn other_protocol_hint(pods: &[&PodInfo], name: &str, protocol: Protocol) -> String {
    let other = pods.iter().find_map(|p| {
        Protocol::ALL
            .into_iter()
            .filter(|o| *o != protocol)
            .find(|o| p.named_port(name, *o).is_some())
            .map(|o| (p.key.to_string(), o))
    });
    match other {
        Some((pod, o)) => format!(" ({pod} declares it as {o})"),
        None => String::new(),
    }
}

/// `policy-ip-family`: ipBlocks of one family in a policy whose pods have both.
pub fn policy_ip_family(objects: Option<&Objects>) -> Check {
    let c = Check::new(
        "policy-ip-family",
        "a rule's ipBlocks cover each address family of the pods its policy selects",
    );
    let cluster = match input(objects, c.clone(), true) {
        Ok(cluster) => cluster,
        Err(done) => return done,
    };
    let mut c = c;
    let (mut judged, mut dual_policies) = (0, 0);
    for policy in cluster.policies.values() {
        let own = selected(cluster, policy);
        let dual: Vec<&&PodInfo> = own
            .iter()
            .filter(|p| p.ips.iter().any(|ip| ip.is_ipv4()) && p.ips.iter().any(|ip| ip.is_ipv6()))
            .collect();
        if dual.is_empty() {
            continue;
        }
        dual_policies += 1;
        for direction in [Direction::Ingress, Direction::Egress] {
            for (i, rule) in policy.rules(direction).iter().enumerate() {
                let Peers::Only(peers) = &rule.peers else {
                    continue;
                };
                let blocks: Vec<&IpBlock> = peers
                    .iter()
                    .filter_map(|p| match p {
                        Peer::Block(b) => Some(b),
                        Peer::Pods { .. } => None,
                    })
                    .collect();
                let Some(first) = blocks.first() else {
                    continue;
                };
                judged += 1;
                let v4 = first.cidr.addr().is_ipv4();
                if blocks.iter().any(|b| b.cidr.addr().is_ipv4() != v4) {
                    continue;
                }
                let (has, lacks) = if v4 {
                    ("IPv4", "IPv6")
                } else {
                    ("IPv6", "IPv4")
                };
                let example = dual[0];
                let other = example
                    .ips
                    .iter()
                    .find(|ip| ip.is_ipv4() != v4)
                    .expect("a dual-stack pod has both");
                let (field, way) = match direction {
                    Direction::Ingress => (format!("spec.ingress[{i}]"), "from"),
                    Direction::Egress => (format!("spec.egress[{i}]"), "to"),
                };
                let cidrs: Vec<String> = blocks.iter().map(|b| b.cidr.to_string()).collect();
                c.found(
                    Status::Warn,
                    format!(
                        "{}: {field} allows {has} addresses only (ipBlock {}), but {} of its {} pod(s) are dual-stack ({} has {other}): their {lacks} traffic {way} those places is denied unless another rule allows it",
                        policy.key,
                        cidrs.join(", "),
                        dual.len(),
                        own.len(),
                        example.key,
                    ),
                );
                c.add_fix(format!("add each ipBlock's {lacks} twin beside it (`- ipBlock: {{cidr: <{lacks} CIDR>}}`; `::/0` beside `0.0.0.0/0`), or leave it if the pods' {lacks} traffic there is meant to be denied"));
            }
        }
    }
    if dual_policies == 0 {
        c.note("no policy selects a dual-stack pod");
    } else if c.status == Status::Ok {
        c.note(format!(
            "{dual_policies} policy(ies) select dual-stack pods; their {judged} rule(s) with ipBlocks cover both families"
        ));
    }
    c
}
