//! What policy enforcement keeps of a NetworkPolicy, and the safe reading of malformed ones.

use std::net::IpAddr;

use ipnet::IpNet;
use k8s_openapi::api::networking::v1::{
    NetworkPolicy, NetworkPolicyPeer, NetworkPolicyPort, NetworkPolicySpec,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;

use super::{is_iana_service_name, Cluster, PodInfo, Protocol, Selector};
use crate::key::ObjectKey;
use crate::warning::{Outcome, Problem, Warning};

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Direction {
    Ingress,
    Egress,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PolicyInfo {
    pub key: ObjectKey,
    /// Which pods of the policy's namespace it applies to (`{}`: all).
    pub pod_selector: Selector,
    /// `policyTypes` after the API's defaulting: Ingress always, Egress when `spec.egress`
    /// has rules.
    pub isolates_ingress: bool,
    pub isolates_egress: bool,
    /// Rules count only in a direction the policy isolates (as Calico, Cilium and kube-router
    /// do): ingress rules of an Egress-only policy allow nothing.
    pub ingress: Vec<Rule>,
    pub egress: Vec<Rule>,
}

impl PolicyInfo {
    pub fn isolates(&self, direction: Direction) -> bool {
        match direction {
            Direction::Ingress => self.isolates_ingress,
            Direction::Egress => self.isolates_egress,
        }
    }

    /// Whether the policy applies to `pod`: the same namespace and a matching podSelector.
    /// Whether the pod can be policed at all (live, not hostNetwork) is the caller's
    /// question.
    pub fn selects(&self, pod: &PodInfo) -> bool {
        self.key.namespace == pod.key.namespace && self.pod_selector.matches(&pod.labels)
    }

    /// The rules that count in `direction`: none when the policy does not isolate it.
    pub fn rules(&self, direction: Direction) -> &[Rule] {
        match direction {
            _ if !self.isolates(direction) => &[],
            Direction::Ingress => &self.ingress,
            Direction::Egress => &self.egress,
        }
    }
}

/// One ingress or egress rule: traffic matching one of its peers on one of its ports.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rule {
    pub peers: Peers,
    pub ports: Ports,
}

/// `from`/`to`. An absent or empty list is [`Peers::Any`]; a list whose every peer was
/// unreadable is `Only(vec![])`, which matches nothing (never everything).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Peers {
    Any,
    Only(Vec<Peer>),
}

#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Peer {
    /// Pods (never hostNetwork ones) matching `pods` in the namespaces of `namespaces`.
    Pods {
        namespaces: NamespaceScope,
        pods: Selector,
    },
    Block(IpBlock),
}

impl Peer {
    /// Whether this peer of a policy in `policy_namespace` selects `pod` by the labels of
    /// the pod and of its namespace. An ipBlock selects addresses, not pods: false.
    pub fn selects_pod(&self, cluster: &Cluster, policy_namespace: &str, pod: &PodInfo) -> bool {
        let Peer::Pods { namespaces, pods } = self else {
            return false;
        };
        let namespace_ok = match namespaces {
            NamespaceScope::Own => *pod.key.namespace == *policy_namespace,
            NamespaceScope::Matching(selector) => {
                selector.matches(&cluster.namespace_labels(&pod.key.namespace))
            }
        };
        namespace_ok && pods.matches(&pod.labels)
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum NamespaceScope {
    /// No namespaceSelector: the policy's own namespace.
    Own,
    Matching(Selector),
}

#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct IpBlock {
    /// Host bits cleared.
    pub cidr: IpNet,
    pub except: Vec<IpNet>,
}

impl IpBlock {
    pub fn contains(&self, ip: IpAddr) -> bool {
        self.cidr.contains(&ip) && !self.except.iter().any(|e| e.contains(&ip))
    }
}

/// `ports`. Absent or empty is [`Ports::Any`]; unreadable entries are dropped from `Only`,
/// so a list left empty matches nothing.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Ports {
    Any,
    Only(Vec<PortSpec>),
}

#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct PortSpec {
    pub protocol: Protocol,
    pub port: PortSelector,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum PortSelector {
    /// No `port`: every port of the protocol.
    All,
    /// `port` to `endPort` (or `port` alone), inclusive.
    Range(u16, u16),
    /// A container port name, resolved against the destination pod.
    Named(Box<str>),
}

impl PolicyInfo {
    /// Converts a policy, pushing a warning for each part it cannot enforce as written.
    ///
    /// Safe outcomes (never allow more than the author meant, keep the pods isolated):
    /// an unreadable peer or port entry matches nothing; an unreadable policy podSelector
    /// selects the whole namespace with no rules (deny in the policy's directions); an
    /// unknown policy type isolates both directions.
    pub fn convert(o: &NetworkPolicy, warnings: &mut Vec<Warning>) -> PolicyInfo {
        let key = ObjectKey::new(
            o.metadata.namespace.as_deref().unwrap_or("default"),
            o.metadata.name.as_deref().unwrap_or_default(),
        );
        let mut cx = Context {
            key: &key,
            warnings,
        };
        let no_spec = NetworkPolicySpec::default();
        let spec = o.spec.as_ref().unwrap_or(&no_spec);

        let ingress_rules = spec.ingress.as_deref().unwrap_or_default();
        let egress_rules = spec.egress.as_deref().unwrap_or_default();
        let (mut isolates_ingress, mut isolates_egress) = (false, false);
        match spec.policy_types.as_deref() {
            None | Some([]) => {
                isolates_ingress = true;
                isolates_egress = !egress_rules.is_empty();
            }
            Some(types) => {
                for (i, t) in types.iter().enumerate() {
                    match t.as_str() {
                        "Ingress" => isolates_ingress = true,
                        "Egress" => isolates_egress = true,
                        other => {
                            cx.warn(
                                format!("spec.policyTypes[{i}]"),
                                Problem::UnknownPolicyType(other.into()),
                                Outcome::PolicyIsolatesBothDirections,
                            );
                            (isolates_ingress, isolates_egress) = (true, true);
                        }
                    }
                }
            }
        }

        let default_selector = LabelSelector::default();
        let selector = spec.pod_selector.as_ref().unwrap_or(&default_selector);
        let (pod_selector, readable) = match Selector::parse(selector) {
            Ok(s) => (s, true),
            Err(problem) => {
                cx.warn(
                    "spec.podSelector".into(),
                    problem,
                    Outcome::PolicyIsolatesNamespace,
                );
                (Selector::everything(), false)
            }
        };
        let (ingress, egress) = if readable {
            let ingress = ingress_rules.iter().enumerate().map(|(i, r)| {
                let field = format!("spec.ingress[{i}]");
                cx.rule(&field, "from", r.from.as_deref(), r.ports.as_deref())
            });
            let ingress = ingress.collect();
            let egress = egress_rules.iter().enumerate().map(|(i, r)| {
                let field = format!("spec.egress[{i}]");
                cx.rule(&field, "to", r.to.as_deref(), r.ports.as_deref())
            });
            (ingress, egress.collect())
        } else {
            (Vec::new(), Vec::new())
        };
        PolicyInfo {
            key,
            pod_selector,
            isolates_ingress,
            isolates_egress,
            ingress,
            egress,
        }
    }
}

struct Context<'a> {
    key: &'a ObjectKey,
    warnings: &'a mut Vec<Warning>,
}

impl Context<'_> {
    fn warn(&mut self, field: String, problem: Problem, outcome: Outcome) {
        self.warnings.push(Warning {
            kind: "NetworkPolicy",
            object: self.key.clone(),
            field,
            problem,
            outcome,
        });
    }

    fn rule(
        &mut self,
        field: &str,
        peers_name: &str,
        peers: Option<&[NetworkPolicyPeer]>,
        ports: Option<&[NetworkPolicyPort]>,
    ) -> Rule {
        let peers = match peers {
            None | Some([]) => Peers::Any,
            Some(list) => Peers::Only(
                list.iter()
                    .enumerate()
                    .filter_map(|(i, p)| self.peer(&format!("{field}.{peers_name}[{i}]"), p))
                    .collect(),
            ),
        };
        let ports = match ports {
            None | Some([]) => Ports::Any,
            Some(list) => {
                let mut specs: Vec<PortSpec> = list
                    .iter()
                    .enumerate()
                    .filter_map(|(i, p)| self.port(&format!("{field}.ports[{i}]"), p))
                    .collect();
                specs.sort();
                specs.dedup();
                Ports::Only(specs)
            }
        };
        Rule { peers, ports }
    }

    fn peer(&mut self, field: &str, p: &NetworkPolicyPeer) -> Option<Peer> {
        let selectors = p.pod_selector.is_some() || p.namespace_selector.is_some();
        match &p.ip_block {
            Some(_) if selectors => {
                self.warn(
                    field.into(),
                    Problem::MalformedPeer,
                    Outcome::PeerAllowsNothing,
                );
                None
            }
            Some(block) => {
                let field = format!("{field}.ipBlock");
                let cidr = self.cidr(&format!("{field}.cidr"), &block.cidr)?;
                let except = block.except.iter().flatten().enumerate();
                let except = except
                    .map(|(i, e)| self.cidr(&format!("{field}.except[{i}]"), e))
                    .collect::<Option<Vec<_>>>()?;
                let mut except = except;
                except.sort();
                except.dedup();
                Some(Peer::Block(IpBlock { cidr, except }))
            }
            None if !selectors => {
                self.warn(
                    field.into(),
                    Problem::MalformedPeer,
                    Outcome::PeerAllowsNothing,
                );
                None
            }
            None => {
                let pods = match &p.pod_selector {
                    None => Selector::everything(),
                    Some(s) => self.selector(&format!("{field}.podSelector"), s)?,
                };
                let namespaces = match &p.namespace_selector {
                    None => NamespaceScope::Own,
                    Some(s) => NamespaceScope::Matching(
                        self.selector(&format!("{field}.namespaceSelector"), s)?,
                    ),
                };
                Some(Peer::Pods { namespaces, pods })
            }
        }
    }

    fn selector(&mut self, field: &str, s: &LabelSelector) -> Option<Selector> {
        Selector::parse(s)
            .map_err(|problem| self.warn(field.into(), problem, Outcome::PeerAllowsNothing))
            .ok()
    }

    /// A CIDR; an unreadable one (or unreadable `except`) voids the whole peer: a block
    /// without the exceptions its author wrote would allow more.
    fn cidr(&mut self, field: &str, text: &str) -> Option<IpNet> {
        match text.trim().parse::<IpNet>() {
            Ok(net) => Some(net.trunc()),
            Err(_) => {
                let problem = Problem::InvalidCidr(text.into());
                self.warn(field.into(), problem, Outcome::PeerAllowsNothing);
                None
            }
        }
    }

    fn port(&mut self, field: &str, p: &NetworkPolicyPort) -> Option<PortSpec> {
        let protocol = Protocol::parse(p.protocol.as_deref())
            .map_err(|problem| {
                self.warn(
                    format!("{field}.protocol"),
                    problem,
                    Outcome::PortAllowsNothing,
                )
            })
            .ok()?;
        let port = match (&p.port, p.end_port) {
            (None, None) => PortSelector::All,
            (None, Some(_)) | (Some(IntOrString::String(_)), Some(_)) => {
                let problem = Problem::EndPortWithoutNumber;
                self.warn(
                    format!("{field}.endPort"),
                    problem,
                    Outcome::PortAllowsNothing,
                );
                return None;
            }
            (Some(IntOrString::String(name)), None) => {
                if !is_iana_service_name(name) {
                    let problem = Problem::InvalidPortName(name.clone());
                    self.warn(format!("{field}.port"), problem, Outcome::PortAllowsNothing);
                    return None;
                }
                PortSelector::Named(name.as_str().into())
            }
            (Some(IntOrString::Int(port)), end) => {
                let Some(first) = u16::try_from(*port).ok().filter(|p| *p > 0) else {
                    let problem = Problem::InvalidPort(*port);
                    self.warn(format!("{field}.port"), problem, Outcome::PortAllowsNothing);
                    return None;
                };
                let last = match end {
                    None => first,
                    Some(end) => match u16::try_from(end).ok().filter(|e| *e >= first) {
                        Some(last) => last,
                        None => {
                            let problem = Problem::InvalidEndPort { port: *port, end };
                            let field = format!("{field}.endPort");
                            self.warn(field, problem, Outcome::PortAllowsNothing);
                            return None;
                        }
                    },
                };
                PortSelector::Range(first, last)
            }
        };
        Some(PortSpec { protocol, port })
    }
}
