//! A generated 10,000 pods / 10,000 policies / 1,000 namespaces cluster, planned for one
//! node's share (100 nodes) and for every pod on one node (the worst case). Prints the
//! times; asserts only the shape (timing depends on the machine and the build profile: run
//! with `--release -- --nocapture` for the figure that matters).

use std::time::Instant;

use weir_policy::model::{
    IpBlock, Labels, NamedPort, NamespaceInfo, NamespaceScope, Peer, Peers, PodInfo, PolicyInfo,
    PortSelector, PortSpec, Ports, Protocol, Requirement, Rule, Selector,
};
use weir_policy::{nft, plan, Cluster, NodePlanner, ObjectKey};

const NAMESPACES: usize = 1_000;
const PODS_PER_NAMESPACE: usize = 10;
const POLICIES_PER_NAMESPACE: usize = 10;
const NODES: usize = 100;

fn labels(pairs: &[(&str, String)]) -> Labels {
    pairs
        .iter()
        .map(|(k, v)| ((*k).into(), v.as_str().into()))
        .collect()
}

fn equals(key: &str, value: &str) -> Selector {
    Selector {
        requirements: vec![Requirement::In(key.into(), vec![value.into()])],
    }
}

fn rule(peers: Vec<Peer>, ports: Vec<PortSpec>) -> Rule {
    Rule {
        peers: if peers.is_empty() {
            Peers::Any
        } else {
            Peers::Only(peers)
        },
        ports: if ports.is_empty() {
            Ports::Any
        } else {
            Ports::Only(ports)
        },
    }
}

fn tcp(port: PortSelector) -> PortSpec {
    PortSpec {
        protocol: Protocol::Tcp,
        port,
    }
}

/// Ten policies per namespace, the shapes clusters use: default deny, app to app, from
/// other teams' namespaces, from a CIDR with exceptions, DNS egress by named port, egress to
/// a shared service in any namespace.
fn generated(one_node: bool) -> Cluster {
    let mut cluster = Cluster::default();
    for n in 0..NAMESPACES {
        let ns = format!("ns-{n}");
        let team = format!("t{}", n % 20);
        cluster.insert_namespace(NamespaceInfo::new(&ns, labels(&[("team", team)])));
        for i in 0..PODS_PER_NAMESPACE {
            let id = n * PODS_PER_NAMESPACE + i;
            let mut ips = vec![
                format!("10.{}.{}.{}", id / 65536, (id / 256) % 256, id % 256)
                    .parse()
                    .unwrap(),
            ];
            if id.is_multiple_of(5) {
                ips.push(format!("fd00::{id:x}").parse().unwrap());
            }
            let mut named_ports = std::collections::BTreeMap::new();
            named_ports.insert(
                ("http".into(), Protocol::Tcp),
                NamedPort::Port(8080 + (i % 3) as u16),
            );
            named_ports.insert(("dns".into(), Protocol::Udp), NamedPort::Port(53));
            let node = if one_node { 0 } else { id % NODES };
            cluster.insert_pod(PodInfo {
                key: ObjectKey::new(&ns, &format!("pod-{i}")),
                labels: labels(&[
                    ("app", format!("a{}", i % 5)),
                    ("tier", if i % 2 == 0 { "fe" } else { "be" }.into()),
                ]),
                node: Some(format!("node-{node}").into()),
                ips,
                host_network: false,
                terminated: false,
                named_ports: named_ports.into_iter().collect(),
            });
        }
        for j in 0..POLICIES_PER_NAMESPACE {
            let app = format!("a{}", j % 5);
            let (pod_selector, ingress, egress) = match j {
                0 => (Selector::everything(), vec![], vec![]),
                1 | 2 => (
                    equals("app", &app),
                    vec![rule(
                        vec![Peer::Pods {
                            namespaces: NamespaceScope::Own,
                            pods: equals("app", &format!("a{}", (j + 1) % 5)),
                        }],
                        vec![tcp(PortSelector::Named("http".into()))],
                    )],
                    vec![],
                ),
                3 | 4 => (
                    equals("app", &app),
                    vec![rule(
                        vec![Peer::Pods {
                            namespaces: NamespaceScope::Matching(equals(
                                "team",
                                &format!("t{}", (n + j) % 20),
                            )),
                            pods: equals("tier", "fe"),
                        }],
                        vec![tcp(PortSelector::Range(8000, 8100))],
                    )],
                    vec![],
                ),
                5 => (
                    equals("tier", "fe"),
                    vec![rule(
                        vec![Peer::Block(IpBlock {
                            cidr: "192.168.0.0/16".parse().unwrap(),
                            except: vec!["192.168.1.0/24".parse().unwrap()],
                        })],
                        vec![tcp(PortSelector::Range(443, 443))],
                    )],
                    vec![],
                ),
                6 => (
                    Selector::everything(),
                    vec![],
                    vec![rule(
                        vec![Peer::Pods {
                            namespaces: NamespaceScope::Matching(equals(
                                "kubernetes.io/metadata.name",
                                "ns-0",
                            )),
                            pods: Selector::everything(),
                        }],
                        vec![PortSpec {
                            protocol: Protocol::Udp,
                            port: PortSelector::Named("dns".into()),
                        }],
                    )],
                ),
                7 => (
                    equals("app", &app),
                    vec![],
                    vec![rule(
                        vec![Peer::Pods {
                            namespaces: NamespaceScope::Matching(Selector::everything()),
                            pods: equals("app", "a1"),
                        }],
                        vec![tcp(PortSelector::Named("http".into()))],
                    )],
                ),
                _ => (
                    equals("app", &app),
                    vec![rule(
                        vec![Peer::Pods {
                            namespaces: NamespaceScope::Own,
                            pods: Selector::everything(),
                        }],
                        vec![],
                    )],
                    vec![rule(
                        vec![Peer::Block(IpBlock {
                            cidr: "0.0.0.0/0".parse().unwrap(),
                            except: vec!["10.0.0.0/8".parse().unwrap()],
                        })],
                        vec![],
                    )],
                ),
            };
            let isolates_egress = !egress.is_empty();
            cluster.insert_policy(PolicyInfo {
                key: ObjectKey::new(&ns, &format!("pol-{j}")),
                pod_selector,
                isolates_ingress: true,
                isolates_egress,
                ingress,
                egress,
            });
        }
    }
    cluster
}

#[test]
fn plans_ten_thousand_pods_and_policies() {
    for (one_node, what) in [
        (false, "one node's share of 100"),
        (true, "every pod on one node"),
    ] {
        let cluster = generated(one_node);
        assert_eq!(
            (cluster.pods.len(), cluster.policies.len()),
            (10_000, 10_000)
        );
        let started = Instant::now();
        let plan = plan(&cluster, "node-0");
        let planned = started.elapsed();
        let started = Instant::now();
        let text = nft::render(&plan);
        let rendered = started.elapsed();
        let rules: usize = plan
            .pods
            .values()
            .flat_map(|p| [&p.ingress, &p.egress])
            .flatten()
            .map(|p| p.rules.len())
            .sum();
        println!(
            "10k pods / 10k policies / 1k namespaces, {what}: plan {planned:?} ({} pods, {rules} rules), nft text {rendered:?} ({} KiB)",
            plan.pods.len(),
            text.len() / 1024
        );
        let (relabel, replace) = kept_planner_changes(&cluster);
        println!("  kept planner: one pod relabelled → plan {relabel:?}; one policy replaced → plan {replace:?}");
        let want = if one_node { 10_000 } else { 100 };
        assert_eq!(plan.pods.len(), want);
        assert!(
            plan.pods.values().all(|p| p.ingress.is_some()),
            "default deny everywhere"
        );
    }
}

/// A planner kept across changes, as the agent keeps it: the replan after one pod label
/// change (a local pod, in a namespace with policies) and after one policy replaced; each
/// plan also compared with one from scratch.
fn kept_planner_changes(cluster: &Cluster) -> (std::time::Duration, std::time::Duration) {
    let mut planner = NodePlanner::new(cluster.clone(), "node-0");
    planner.plan();
    let mut reference = cluster.clone();
    let key = ObjectKey::new("ns-0", "pod-0");
    let mut pod = (*cluster.pods[&key]).clone();
    pod.labels = labels(&[("app", "a1".into()), ("tier", "be".into())]);
    reference.insert_pod(pod.clone());
    planner.insert_pod(pod);
    let started = Instant::now();
    let after_relabel = planner.plan();
    let relabel = started.elapsed();
    assert_eq!(after_relabel, plan(&reference, "node-0"));

    let policy_key = cluster.policies.keys().nth(3).unwrap().clone();
    let mut policy = (*cluster.policies[&policy_key]).clone();
    policy.ingress.clear();
    reference.insert_policy(policy.clone());
    planner.insert_policy(policy);
    let started = Instant::now();
    let after_replace = planner.plan();
    let replace = started.elapsed();
    assert_eq!(after_replace, plan(&reference, "node-0"));
    (relabel, replace)
}
