//! What policy enforcement keeps of a Pod.

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::sync::Arc;

use k8s_openapi::api::core::v1::Pod;

use super::{is_iana_service_name, Labels, Protocol};
use crate::key::ObjectKey;
use crate::warning::{Outcome, Problem, Warning};

/// A container port name's meaning in one pod.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NamedPort {
    Port(u16),
    /// Two containers give the name different numbers for one protocol. Which one a policy
    /// meant is unknowable, so the name resolves to nothing (no implementation agrees on a
    /// choice; allowing both would allow more than either reading).
    Conflict,
}

/// A pod's named ports: ((name, protocol), meaning), sorted by name and protocol.
pub type NamedPorts = Box<[((Box<str>, Protocol), NamedPort)]>;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PodInfo {
    pub key: ObjectKey,
    pub labels: Labels,
    /// `spec.nodeName`; a pod not scheduled yet has none and no IPs.
    pub node: Option<Arc<str>>,
    /// `status.podIPs` (else `status.podIP`), each once, in the API's order.
    pub ips: Vec<IpAddr>,
    pub host_network: bool,
    /// `status.phase` is Succeeded or Failed: its IPs may already be another pod's.
    pub terminated: bool,
    /// Container (and init/sidecar container) ports by (name, protocol), sorted, each once
    /// (a slice, not a map: a pod has a handful, and a map's node is 300 bytes).
    pub named_ports: NamedPorts,
}

impl PodInfo {
    /// Holds its IPs now: not finished, and with an address.
    pub fn is_live(&self) -> bool {
        !self.terminated && !self.ips.is_empty()
    }

    /// Policies apply to it: live and in its own network namespace. Pod selectors (of a
    /// policy and of its peers) see only these pods; hostNetwork pods are the node itself,
    /// reachable by peers only through ipBlock.
    pub fn is_policy_pod(&self) -> bool {
        self.is_live() && !self.host_network
    }

    /// The port a named port means for this pod, if exactly one.
    pub fn named_port(&self, name: &str, protocol: Protocol) -> Option<u16> {
        // A pod has a handful of named ports: a scan costs less than building a key.
        self.named_ports
            .iter()
            .find(|((n, p), _)| **n == *name && *p == protocol)
            .and_then(|(_, port)| match port {
                NamedPort::Port(port) => Some(*port),
                NamedPort::Conflict => None,
            })
    }

    pub fn convert(o: &Pod, warnings: &mut Vec<Warning>) -> PodInfo {
        let key = ObjectKey::new(
            o.metadata.namespace.as_deref().unwrap_or("default"),
            o.metadata.name.as_deref().unwrap_or_default(),
        );
        let mut warn = |field: String, problem: Problem, outcome: Outcome| {
            warnings.push(Warning {
                kind: "Pod",
                object: key.clone(),
                field,
                problem,
                outcome,
            })
        };
        let status = o.status.as_ref();
        let spec = o.spec.as_ref();

        // `podIPs` when set (its first entry repeats `podIP`), else the older `podIP`.
        let texts: Vec<(String, &str)> = match status.and_then(|s| s.pod_ips.as_ref()) {
            Some(list) if !list.is_empty() => list
                .iter()
                .enumerate()
                .map(|(i, p)| (format!("status.podIPs[{i}].ip"), p.ip.as_str()))
                .collect(),
            _ => status
                .and_then(|s| s.pod_ip.as_deref())
                .map(|ip| ("status.podIP".to_string(), ip))
                .into_iter()
                .collect(),
        };
        let mut ips = Vec::new();
        for (field, text) in texts {
            match text.trim().parse::<IpAddr>() {
                Ok(ip) if !ips.contains(&ip) => ips.push(ip),
                Ok(_) => {}
                Err(_) => warn(field, Problem::InvalidIp(text.into()), Outcome::Ignored),
            }
        }

        let mut named_ports = BTreeMap::new();
        let containers = spec.into_iter().flat_map(|s| {
            let init = s
                .init_containers
                .iter()
                .flatten()
                .map(|c| ("initContainers", c));
            s.containers.iter().map(|c| ("containers", c)).chain(init)
        });
        let mut index = BTreeMap::<&str, usize>::new();
        for (list, container) in containers {
            let i = index.entry(list).or_default();
            let field = format!("spec.{list}[{i}].ports");
            *i += 1;
            for (j, port) in container.ports.iter().flatten().enumerate() {
                let Some(name) = port.name.as_deref() else {
                    continue;
                };
                let field = format!("{field}[{j}]");
                if !is_iana_service_name(name) {
                    let problem = Problem::InvalidPortName(name.into());
                    warn(format!("{field}.name"), problem, Outcome::Ignored);
                    continue;
                }
                let protocol = match Protocol::parse(port.protocol.as_deref()) {
                    Ok(p) => p,
                    Err(problem) => {
                        warn(format!("{field}.protocol"), problem, Outcome::Ignored);
                        continue;
                    }
                };
                let Some(number) = u16::try_from(port.container_port).ok().filter(|p| *p > 0)
                else {
                    let problem = Problem::InvalidPort(port.container_port);
                    warn(format!("{field}.containerPort"), problem, Outcome::Ignored);
                    continue;
                };
                let slot = named_ports.entry((name.into(), protocol));
                match slot {
                    std::collections::btree_map::Entry::Vacant(v) => {
                        v.insert(NamedPort::Port(number));
                    }
                    std::collections::btree_map::Entry::Occupied(mut o) => match *o.get() {
                        NamedPort::Port(first) if first != number => {
                            o.insert(NamedPort::Conflict);
                            let problem = Problem::ConflictingNamedPort {
                                name: name.into(),
                                protocol: protocol.as_str(),
                                first,
                                second: number,
                            };
                            warn(field, problem, Outcome::NamedPortUnresolved);
                        }
                        _ => {}
                    },
                }
            }
        }

        let labels = o
            .metadata
            .labels
            .iter()
            .flatten()
            .map(|(k, v)| (k.as_str().into(), v.as_str().into()))
            .collect();
        PodInfo {
            key,
            labels,
            node: spec.and_then(|s| s.node_name.as_deref()).map(Arc::from),
            ips,
            host_network: spec.and_then(|s| s.host_network).unwrap_or(false),
            terminated: matches!(
                status.and_then(|s| s.phase.as_deref()),
                Some("Succeeded" | "Failed")
            ),
            named_ports: named_ports.into_iter().collect(),
        }
    }
}
