use std::collections::BTreeMap;
use std::fmt;
use std::sync::Arc;

use k8s_openapi::api::core::v1::{Node, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;

/// The kinds of objects the proxy consumes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Kind {
    Service,
    EndpointSlice,
    Node,
}

impl Kind {
    pub fn as_str(self) -> &'static str {
        match self {
            Kind::Service => "Service",
            Kind::EndpointSlice => "EndpointSlice",
            Kind::Node => "Node",
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

/// One cluster object of a kind weir cares about.
#[derive(Debug, Clone)]
pub enum Object {
    Service(Arc<Service>),
    EndpointSlice(Arc<EndpointSlice>),
    Node(Arc<Node>),
}

/// Equal by pointer first: an object nobody changed is the same `Arc` in every snapshot, and
/// comparing tens of thousands of them by value on every change would dominate a sync.
/// (`Arc`'s own fast path needs `Eq`, which the Kubernetes types do not implement.)
impl PartialEq for Object {
    fn eq(&self, other: &Self) -> bool {
        fn same<T: PartialEq>(a: &Arc<T>, b: &Arc<T>) -> bool {
            Arc::ptr_eq(a, b) || a == b
        }
        match (self, other) {
            (Object::Service(a), Object::Service(b)) => same(a, b),
            (Object::EndpointSlice(a), Object::EndpointSlice(b)) => same(a, b),
            (Object::Node(a), Object::Node(b)) => same(a, b),
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
        }
    }

    pub fn key(&self) -> ObjectKey {
        let meta = match self {
            Object::Service(o) => &o.metadata,
            Object::EndpointSlice(o) => &o.metadata,
            Object::Node(o) => &o.metadata,
        };
        let namespace = match self {
            Object::Node(_) => String::new(),
            _ => meta
                .namespace
                .clone()
                .unwrap_or_else(|| "default".to_string()),
        };
        ObjectKey::new(
            self.kind(),
            namespace,
            meta.name.clone().unwrap_or_default(),
        )
    }
}

impl From<Service> for Object {
    fn from(o: Service) -> Self {
        Object::Service(Arc::new(o))
    }
}
impl From<EndpointSlice> for Object {
    fn from(o: EndpointSlice) -> Self {
        Object::EndpointSlice(Arc::new(o))
    }
}
impl From<Node> for Object {
    fn from(o: Node) -> Self {
        Object::Node(Arc::new(o))
    }
}

/// An immutable, ordered view of all objects, the planner's input.
/// Keys: (namespace, name) for namespaced kinds, name for Nodes.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Snapshot {
    pub services: BTreeMap<(String, String), Arc<Service>>,
    pub endpoint_slices: BTreeMap<(String, String), Arc<EndpointSlice>>,
    pub nodes: BTreeMap<String, Arc<Node>>,
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
        let k = o.key();
        match o {
            Object::Service(v) => {
                self.services.insert((k.namespace, k.name), v);
            }
            Object::EndpointSlice(v) => {
                self.endpoint_slices.insert((k.namespace, k.name), v);
            }
            Object::Node(v) => {
                self.nodes.insert(k.name, v);
            }
        }
    }

    pub fn len(&self) -> usize {
        self.services.len() + self.endpoint_slices.len() + self.nodes.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}
