use std::collections::BTreeMap;
use std::fmt;
use std::sync::Arc;

use k8s_openapi::api::core::v1::{Node, Pod, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;

use crate::compact::{EndpointSliceInfo, NodeInfo, ServiceInfo};
use crate::pod::PodInfo;

/// The kinds of objects the proxy consumes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Kind {
    Service,
    EndpointSlice,
    Node,
    /// Only `weir dns --pods verified` watches Pods.
    Pod,
}

impl Kind {
    pub fn as_str(self) -> &'static str {
        match self {
            Kind::Service => "Service",
            Kind::EndpointSlice => "EndpointSlice",
            Kind::Node => "Node",
            Kind::Pod => "Pod",
        }
    }
}

/// kind/namespace/name. `namespace` is empty for cluster-scoped objects (Node).
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
    /// Empty unless Pods are watched (`weir dns --pods verified`).
    pub pods: BTreeMap<NsKey, Arc<PodInfo>>,
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
        }
    }

    /// No object of `kind`.
    pub fn kind_is_empty(&self, kind: Kind) -> bool {
        match kind {
            Kind::Service => self.services.is_empty(),
            Kind::EndpointSlice => self.endpoint_slices.is_empty(),
            Kind::Node => self.nodes.is_empty(),
            Kind::Pod => self.pods.is_empty(),
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
        for o in objects {
            match o {
                Object::Service(v) => s.push(((v.namespace.clone(), v.name.clone()), v)),
                Object::EndpointSlice(v) => e.push(((v.namespace.clone(), v.name.clone()), v)),
                Object::Node(v) => n.push((v.name.to_string(), v)),
                Object::Pod(v) => p.push(((v.namespace.clone(), v.name.clone()), v)),
            }
        }
        append(&mut self.services, &mut s);
        append(&mut self.endpoint_slices, &mut e);
        append(&mut self.nodes, &mut n);
        append(&mut self.pods, &mut p);
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
    }

    /// Removes the object with `key`; returns whether there was one.
    pub fn remove(&mut self, key: &ObjectKey) -> bool {
        let nk = ns_key(key);
        match key.kind {
            Kind::Service => self.services.remove(&nk).is_some(),
            Kind::EndpointSlice => self.endpoint_slices.remove(&nk).is_some(),
            Kind::Node => self.nodes.remove(&key.name).is_some(),
            Kind::Pod => self.pods.remove(&nk).is_some(),
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
        services.chain(slices).chain(nodes).chain(pods)
    }

    pub fn len(&self) -> usize {
        self.services.len() + self.endpoint_slices.len() + self.nodes.len() + self.pods.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}
