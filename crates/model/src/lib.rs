//! weir-model: cluster objects as weir sees them ([`Object`], compact: [`compact`]; [`Snapshot`]) and the pure
//! service [`Plan`] computed from them ([`plan()`]), with a deterministic [`PlanDiff`].
//!
//! Everything here is pure: no I/O, no clock, no randomness. Ordering is BTreeMap-based
//! so the same input always yields the same plan.

pub mod compact;
pub mod conditions;
mod diff;
mod objects;
mod plan;
mod planner;
mod pod;

pub use compact::{
    Addresses, EndpointExtra, EndpointInfo, EndpointPortInfo, EndpointSliceInfo, IpText,
    NodeAddressInfo, NodeInfo, Placement, ServiceInfo, ServicePortInfo, ServiceSpecExtra,
    ServiceSpecInfo,
};
pub use diff::{Changed, PlanDiff};
pub use objects::{Kind, NsKey, Object, ObjectKey, Snapshot};
pub use plan::{
    Endpoint, EndpointSet, Frontend, FrontendKind, IpFamily, Masquerade, NodePortAddresses, Plan,
    Protocol, ServicePortKey, ServicePortPlan, TopologyMode, Verdict,
};
pub use planner::{plan, NodePortDefault, Planner, ProxyConfig, DEFAULT_AFFINITY_TIMEOUT_SECONDS};
pub use pod::{PodForPolicy, PodInfo, PolicyPod};

/// NetworkPolicy's inputs in weir-policy's compact form: a Namespace (name and labels).
pub use weir_policy::model::NamespaceInfo;
/// A NetworkPolicy as weir-policy reads it, with what conversion found wrong.
pub type PolicyObject = weir_policy::Converted<weir_policy::model::PolicyInfo>;
/// Re-export of the NetworkPolicy crate whose types the store holds.
pub use weir_policy;

/// Re-export of the Kubernetes API types this crate is built on.
pub use k8s_openapi;
