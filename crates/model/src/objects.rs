use std::collections::BTreeMap;
use std::fmt;
use std::sync::Arc;

use k8s_openapi::api::core::v1::{Namespace, Node, Pod, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use k8s_openapi::api::networking::v1::NetworkPolicy;

use crate::compact::{EndpointSliceInfo, NodeInfo, ServiceInfo};
use crate::pod::{PodForPolicy, PodInfo};
use crate::{NamespaceInfo, PolicyObject};

/// The kinds of objects weir's agents consume.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Kind {
    Service,
    EndpointSlice,
    Node,
    /// `weir dns --pods verified` (namespace, name, IPs) and `weir policy` (labels, node,
    /// named ports too: [`PodInfo::policy`]) watch Pods.
    Pod,
    /// Only `weir policy` reads Namespaces and NetworkPolicies.
    Namespace,
    NetworkPolicy,
}

impl Kind {
    /// Every kind, in the store's (and the keys') order.
    pub const ALL: [Kind; 6] = [
        Kind::Service,
        Kind::EndpointSlice,
        Kind::Node,
        Kind::Pod,
        Kind::Namespace,
        Kind::NetworkPolicy,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Kind::Service => "Service",
            Kind::EndpointSlice => "EndpointSlice",
            Kind::Node => "Node",
            Kind::Pod => "Pod",
            Kind::Namespace => "Namespace",
            Kind::NetworkPolicy => "NetworkPolicy",
        }
    }
}

/// kind/namespace/name. `namespace` is empty for cluster-scoped objects (Node, Namespace).
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ObjectKey {
    pub kind: Kind,
    pub namespace: String,
    pub name: String,
}

impl ObjectKey {
    pub fn new(kind: Kind, namespace: impl Into<String>, name: impl Into<String>) -> Self {
        ObjectKey {
            kind,
            namespace: namespace.into(),
            name: name.into(),
        }
    }
}

impl fmt::Display for ObjectKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.namespace.is_empty() {
            write!(f, "{}/{}", self.kind.as_str(), self.name)
        } else {
            write!(f, "{}/{}/{}", self.kind.as_str(), self.namespace, self.name)
        }
    }
}

/// One cluster object of a kind weir cares about, in weir's compact form
/// ([`crate::compact`]); `Object::from(k8s_openapi object)` converts at ingestion.
#[derive(Debug, Clone)]
pub enum Object {
    Service(Arc<ServiceInfo>),
    EndpointSlice(Arc<EndpointSliceInfo>),
    Node(Arc<NodeInfo>),
    Pod(Arc<PodInfo>),
    Namespace(Arc<NamespaceInfo>),
    /// The policy as weir-policy reads it, with its conversion warnings.
    NetworkPolicy(Arc<PolicyObject>),
}

/// Equal by pointer first: an object nobody changed is the same `Arc` in every snapshot.
impl PartialEq for Object {
    fn eq(&self, other: &Self) -> bool {
        fn same<T: PartialEq>(a: &Arc<T>, b: &Arc<T>) -> bool {
            Arc::ptr_eq(a, b) || a == b
        }
        match (self, other) {
            (Object::Service(a), Object::Service(b)) => same(a, b),
            (Object::EndpointSlice(a), Object::EndpointSlice(b)) => same(a, b),
            (Object::Node(a), Object::Node(b)) => same(a, b),
            (Object::Pod(a), Object::Pod(b)) => same(a, b),
            (Object::Namespace(a), Object::Namespace(b)) => same(a, b),
            (Object::NetworkPolicy(a), Object::NetworkPolicy(b)) => same(a, b),
            _ => false,
        }
    }
}

impl Object {
    pub fn kind(&self) -> Kind {
        match self {
            Object::Service(_) => Kind::Service,
            Object::EndpointSlice(_) => Kind::EndpointSlice,
            Object::Node(_) => Kind::Node,
            Object::Pod(_) => Kind::Pod,
            Object::Namespace(_) => Kind::Namespace,
            Object::NetworkPolicy(_) => Kind::NetworkPolicy,
        }
    }

    pub fn key(&self) -> ObjectKey {
        match self {
            Object::Service(o) => ObjectKey::new(Kind::Service, &*o.namespace, &*o.name),
            Object::EndpointSlice(o) => {
                ObjectKey::new(Kind::EndpointSlice, &*o.namespace, &*o.name)
            }
            Object::Node(o) => ObjectKey::new(Kind::Node, "", &*o.name),
            Object::Pod(o) => ObjectKey::new(Kind::Pod, &*o.namespace, &*o.name),
            Object::Namespace(o) => ObjectKey::new(Kind::Namespace, "", &*o.name),
            Object::NetworkPolicy(o) => {
                let key = &o.value.key;
                ObjectKey::new(Kind::NetworkPolicy, &*key.namespace, &*key.name)
            }
        }
    }
}

impl From<Service> for Object {
    fn from(o: Service) -> Self {
        Object::Service(Arc::new(ServiceInfo::from(&o)))
    }
}
impl From<EndpointSlice> for Object {
    fn from(o: EndpointSlice) -> Self {
        Object::EndpointSlice(Arc::new(EndpointSliceInfo::from(&o)))
    }
}
impl From<Node> for Object {
    fn from(o: Node) -> Self {
        Object::Node(Arc::new(NodeInfo::from(&o)))
    }
}

impl From<Pod> for Object {
    fn from(o: Pod) -> Self {
        Object::Pod(Arc::new(PodInfo::from(&o)))
    }
}

/// A Pod with what NetworkPolicy needs (labels, node, hostNetwork, named ports).
impl From<PodForPolicy> for Object {
    fn from(o: PodForPolicy) -> Self {
        Object::Pod(Arc::new(PodInfo::with_policy(&o.0)))
    }
}

impl From<Namespace> for Object {
    fn from(o: Namespace) -> Self {
        Object::Namespace(Arc::new(NamespaceInfo::from(&o)))
    }
}

impl From<NetworkPolicy> for Object {
    fn from(o: NetworkPolicy) -> Self {
        Object::NetworkPolicy(Arc::new(PolicyObject::policy(&o)))
    }
}

impl From<ServiceInfo> for Object {
    fn from(o: ServiceInfo) -> Self {
        Object::Service(Arc::new(o))
    }
}
impl From<EndpointSliceInfo> for Object {
    fn from(o: EndpointSliceInfo) -> Self {
        Object::EndpointSlice(Arc::new(o))
    }
}
impl From<NodeInfo> for Object {
    fn from(o: NodeInfo) -> Self {
        Object::Node(Arc::new(o))
    }
}
impl From<PodInfo> for Object {
    fn from(o: PodInfo) -> Self {
        Object::Pod(Arc::new(o))
    }
}

/// (namespace, name) of a namespaced object: the object's own strings, shared (a copy of
/// both per object was ~100 bytes at 100,000 services and their slices).
pub type NsKey = (Arc<str>, Arc<str>);

/// An immutable, ordered view of all objects (DNS and node routes read it; the proxy's
/// planner is fed changes instead, see [`crate::Planner::apply`]).
/// Keys: (namespace, name) for namespaced kinds, name for Nodes.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Snapshot {
    pub services: BTreeMap<NsKey, Arc<ServiceInfo>>,
    pub endpoint_slices: BTreeMap<NsKey, Arc<EndpointSliceInfo>>,
    pub nodes: BTreeMap<String, Arc<NodeInfo>>,
    /// Empty unless Pods are watched (`weir dns --pods verified`, `weir policy`).
    pub pods: BTreeMap<NsKey, Arc<PodInfo>>,
    /// Empty unless `weir policy` reads them.
    pub namespaces: BTreeMap<String, Arc<NamespaceInfo>>,
    pub network_policies: BTreeMap<NsKey, Arc<PolicyObject>>,
}

/// A key to look up by (allocated; stored keys are the objects' own strings).
fn ns_key(key: &ObjectKey) -> NsKey {
    (key.namespace.as_str().into(), key.name.as_str().into())
}

impl Snapshot {
    /// Builds a snapshot; a later object with the same key replaces an earlier one.
    pub fn from_objects<'a>(objects: impl IntoIterator<Item = &'a Object>) -> Self {
        let mut s = Snapshot::default();
        for o in objects {
            s.insert(o.clone());
        }
        s
    }

    pub fn insert(&mut self, o: Object) {
        match o {
            Object::Service(v) => {
                self.services
                    .insert((v.namespace.clone(), v.name.clone()), v);
            }
            Object::EndpointSlice(v) => {
                self.endpoint_slices
                    .insert((v.namespace.clone(), v.name.clone()), v);
            }
            Object::Node(v) => {
                self.nodes.insert(v.name.to_string(), v);
            }
            Object::Pod(v) => {
                self.pods.insert((v.namespace.clone(), v.name.clone()), v);
            }
            Object::Namespace(v) => {
                self.namespaces.insert(v.name.to_string(), v);
            }
            Object::NetworkPolicy(v) => {
                let key = &v.value.key;
                self.network_policies
                    .insert((key.namespace.clone(), key.name.clone()), v);
            }
        }
    }

    /// No object of `kind`.
    pub fn kind_is_empty(&self, kind: Kind) -> bool {
        match kind {
            Kind::Service => self.services.is_empty(),
            Kind::EndpointSlice => self.endpoint_slices.is_empty(),
            Kind::Node => self.nodes.is_empty(),
            Kind::Pod => self.pods.is_empty(),
            Kind::Namespace => self.namespaces.is_empty(),
            Kind::NetworkPolicy => self.network_policies.is_empty(),
        }
    }

    /// Inserts `objects`, which come in key order, appending to the maps' ends where they
    /// can (as `BTreeMap::extend` does not): a first list without a lookup per object.
    pub fn extend_sorted(&mut self, objects: impl IntoIterator<Item = Object>) {
        fn append<K: Ord, V>(m: &mut BTreeMap<K, V>, batch: &mut Vec<(K, V)>) {
            if batch.is_empty() {
                return;
            }
            let mut add: BTreeMap<K, V> = std::mem::take(batch).into_iter().collect();
            m.append(&mut add);
        }
        let (mut s, mut e, mut n, mut p) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
        let (mut ns, mut np) = (Vec::new(), Vec::new());
        for o in objects {
            match o {
                Object::Service(v) => s.push(((v.namespace.clone(), v.name.clone()), v)),
                Object::EndpointSlice(v) => e.push(((v.namespace.clone(), v.name.clone()), v)),
                Object::Node(v) => n.push((v.name.to_string(), v)),
                Object::Pod(v) => p.push(((v.namespace.clone(), v.name.clone()), v)),
                Object::Namespace(v) => ns.push((v.name.to_string(), v)),
                Object::NetworkPolicy(v) => {
                    let key = (v.value.key.namespace.clone(), v.value.key.name.clone());
                    np.push((key, v))
                }
            }
        }
        append(&mut self.services, &mut s);
        append(&mut self.endpoint_slices, &mut e);
        append(&mut self.nodes, &mut n);
        append(&mut self.pods, &mut p);
        append(&mut self.namespaces, &mut ns);
        append(&mut self.network_policies, &mut np);
    }

    /// Rebuilds the maps with full B-tree nodes. Keys inserted in order (a first list) leave
    /// every node about half full; rebuilt from a sorted sequence, ~40 % less memory for
    /// the maps. Costs one pass; worth it after many inserts.
    pub fn compact(&mut self) {
        fn dense<K: Ord, V>(m: &mut BTreeMap<K, V>) {
            *m = std::mem::take(m).into_iter().collect();
        }
        dense(&mut self.services);
        dense(&mut self.endpoint_slices);
        dense(&mut self.nodes);
        dense(&mut self.pods);
        dense(&mut self.namespaces);
        dense(&mut self.network_policies);
    }

    /// Removes the object with `key`; returns whether there was one.
    pub fn remove(&mut self, key: &ObjectKey) -> bool {
        let nk = ns_key(key);
        match key.kind {
            Kind::Service => self.services.remove(&nk).is_some(),
            Kind::EndpointSlice => self.endpoint_slices.remove(&nk).is_some(),
            Kind::Node => self.nodes.remove(&key.name).is_some(),
            Kind::Pod => self.pods.remove(&nk).is_some(),
            Kind::Namespace => self.namespaces.remove(&key.name).is_some(),
            Kind::NetworkPolicy => self.network_policies.remove(&nk).is_some(),
        }
    }

    pub fn get(&self, key: &ObjectKey) -> Option<Object> {
        let nk = ns_key(key);
        match key.kind {
            Kind::Service => self.services.get(&nk).cloned().map(Object::Service),
            Kind::EndpointSlice => self
                .endpoint_slices
                .get(&nk)
                .cloned()
                .map(Object::EndpointSlice),
            Kind::Node => self.nodes.get(&key.name).cloned().map(Object::Node),
            Kind::Pod => self.pods.get(&nk).cloned().map(Object::Pod),
            Kind::Namespace => self
                .namespaces
                .get(&key.name)
                .cloned()
                .map(Object::Namespace),
            Kind::NetworkPolicy => self
                .network_policies
                .get(&nk)
                .cloned()
                .map(Object::NetworkPolicy),
        }
    }

    /// Every object, in key order per kind.
    pub fn objects(&self) -> impl Iterator<Item = Object> + '_ {
        let services = self.services.values().cloned().map(Object::Service);
        let slices = self
            .endpoint_slices
            .values()
            .cloned()
            .map(Object::EndpointSlice);
        let nodes = self.nodes.values().cloned().map(Object::Node);
        let pods = self.pods.values().cloned().map(Object::Pod);
        let namespaces = self.namespaces.values().cloned().map(Object::Namespace);
        let policies = self
            .network_policies
            .values()
            .cloned()
            .map(Object::NetworkPolicy);
        services
            .chain(slices)
            .chain(nodes)
            .chain(pods)
            .chain(namespaces)
            .chain(policies)
    }

    pub fn len(&self) -> usize {
        self.services.len()
            + self.endpoint_slices.len()
            + self.nodes.len()
            + self.pods.len()
            + self.namespaces.len()
            + self.network_policies.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}
