//! The inputs: weir's compact copies of Namespaces, Pods and NetworkPolicies, converted from
//! k8s-openapi objects, and the [`Cluster`] that holds them.

mod pod;
mod policy;

use std::collections::BTreeMap;
use std::fmt;
use std::sync::Arc;

use k8s_openapi::api::core::v1::{Namespace, Pod};
use k8s_openapi::api::networking::v1::NetworkPolicy;

use crate::key::ObjectKey;
pub use crate::selector::{Labels, Requirement, Selector};
use crate::warning::{Problem, Warning};
pub use pod::{NamedPort, NamedPorts, PodInfo};
pub use policy::{
    Direction, IpBlock, NamespaceScope, Peer, Peers, PolicyInfo, PortSelector, PortSpec, Ports,
    Rule,
};

/// The label the API server sets on every namespace (since 1.21), equal to its name.
pub const LABEL_NAMESPACE_NAME: &str = "kubernetes.io/metadata.name";

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Protocol {
    Tcp,
    Udp,
    Sctp,
}

impl Protocol {
    pub const ALL: [Protocol; 3] = [Protocol::Tcp, Protocol::Udp, Protocol::Sctp];

    /// The API's spelling; absent means TCP (the API's default).
    pub fn parse(text: Option<&str>) -> Result<Protocol, Problem> {
        match text {
            None | Some("TCP") => Ok(Protocol::Tcp),
            Some("UDP") => Ok(Protocol::Udp),
            Some("SCTP") => Ok(Protocol::Sctp),
            Some(other) => Err(Problem::UnknownProtocol(other.to_string())),
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Protocol::Tcp => "TCP",
            Protocol::Udp => "UDP",
            Protocol::Sctp => "SCTP",
        }
    }
}

impl fmt::Display for Protocol {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NamespaceInfo {
    pub name: Arc<str>,
    /// Always holds `kubernetes.io/metadata.name`, as the API server guarantees; added here
    /// for namespaces from manifests that lack it.
    pub labels: Labels,
}

impl NamespaceInfo {
    pub fn new(name: &str, labels: Labels) -> NamespaceInfo {
        let mut labels = labels;
        labels.insert(LABEL_NAMESPACE_NAME.into(), name.into());
        NamespaceInfo {
            name: name.into(),
            labels,
        }
    }
}

impl From<&Namespace> for NamespaceInfo {
    fn from(o: &Namespace) -> Self {
        let labels = o
            .metadata
            .labels
            .iter()
            .flatten()
            .map(|(k, v)| (k.as_str().into(), v.as_str().into()))
            .collect();
        NamespaceInfo::new(o.metadata.name.as_deref().unwrap_or_default(), labels)
    }
}

/// An object as conversion left it, and what conversion found wrong with it (each warning
/// names the field and the safe outcome). The agent keeps these in its object store, so an
/// object's warnings are said once when it changes, not on every plan; the value is shared
/// (`Arc`) with the [`Cluster`] the planner reads.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Converted<T> {
    pub value: Arc<T>,
    pub warnings: Box<[Warning]>,
}

impl Converted<PodInfo> {
    pub fn pod(o: &Pod) -> Converted<PodInfo> {
        let mut warnings = Vec::new();
        let value = Arc::new(PodInfo::convert(o, &mut warnings));
        Converted {
            value,
            warnings: warnings.into(),
        }
    }
}

impl Converted<PolicyInfo> {
    pub fn policy(o: &NetworkPolicy) -> Converted<PolicyInfo> {
        let mut warnings = Vec::new();
        let value = Arc::new(PolicyInfo::convert(o, &mut warnings));
        Converted {
            value,
            warnings: warnings.into(),
        }
    }
}

/// Back to a Namespace holding what was kept (name and labels).
impl From<&NamespaceInfo> for Namespace {
    fn from(o: &NamespaceInfo) -> Self {
        let labels = o
            .labels
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        let mut ns = Namespace::default();
        ns.metadata.name = Some(o.name.to_string());
        ns.metadata.labels = Some(labels);
        ns
    }
}

/// Everything the oracle and the planner read. Pods and policies by `namespace/name`; the
/// objects are shared (`Arc`) with whoever converted them (the agent's object store).
#[derive(Debug, Clone, Default)]
pub struct Cluster {
    pub namespaces: BTreeMap<Arc<str>, Arc<NamespaceInfo>>,
    pub pods: BTreeMap<ObjectKey, Arc<PodInfo>>,
    pub policies: BTreeMap<ObjectKey, Arc<PolicyInfo>>,
}

impl Cluster {
    /// Converts every object, collecting each one's warnings.
    pub fn from_objects(
        namespaces: &[Namespace],
        pods: &[Pod],
        policies: &[NetworkPolicy],
    ) -> (Cluster, Vec<Warning>) {
        let mut cluster = Cluster::default();
        let mut warnings = Vec::new();
        for ns in namespaces {
            cluster.insert_namespace(NamespaceInfo::from(ns));
        }
        for pod in pods {
            cluster.insert_pod(PodInfo::convert(pod, &mut warnings));
        }
        for policy in policies {
            cluster.insert_policy(PolicyInfo::convert(policy, &mut warnings));
        }
        (cluster, warnings)
    }

    pub fn insert_namespace(&mut self, ns: impl Into<Arc<NamespaceInfo>>) {
        let ns = ns.into();
        self.namespaces.insert(ns.name.clone(), ns);
    }

    pub fn insert_pod(&mut self, pod: impl Into<Arc<PodInfo>>) {
        let pod = pod.into();
        self.pods.insert(pod.key.clone(), pod);
    }

    pub fn insert_policy(&mut self, policy: impl Into<Arc<PolicyInfo>>) {
        let policy = policy.into();
        self.policies.insert(policy.key.clone(), policy);
    }

    pub fn remove_namespace(&mut self, name: &str) -> bool {
        self.namespaces.remove(name).is_some()
    }

    pub fn remove_pod(&mut self, key: &ObjectKey) -> bool {
        self.pods.remove(key).is_some()
    }

    pub fn remove_policy(&mut self, key: &ObjectKey) -> bool {
        self.policies.remove(key).is_some()
    }

    /// A namespace's labels. A namespace weir has not seen (yet) has only its name label, so
    /// `namespaceSelector: {}` and selectors on `kubernetes.io/metadata.name` still match it.
    pub fn namespace_labels(&self, namespace: &str) -> std::borrow::Cow<'_, Labels> {
        match self.namespaces.get(namespace) {
            Some(ns) => std::borrow::Cow::Borrowed(&ns.labels),
            None => std::borrow::Cow::Owned(NamespaceInfo::new(namespace, Labels::new()).labels),
        }
    }
}

/// `IANA_SVC_NAME` as apimachinery's `IsValidPortName`: 1-15 characters of `a-z0-9-`, at
/// least one letter, no leading, trailing or doubled hyphen.
pub(crate) fn is_iana_service_name(name: &str) -> bool {
    let bytes = name.as_bytes();
    (1..=15).contains(&bytes.len())
        && bytes
            .iter()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || *b == b'-')
        && bytes.iter().any(|b| b.is_ascii_lowercase())
        && !name.starts_with('-')
        && !name.ends_with('-')
        && !name.contains("--")
}

#[cfg(test)]
mod tests;
