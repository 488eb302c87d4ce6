//! weir's own small copies of the Kubernetes objects it consumes.
//!
//! A k8s-openapi `Service` is 824 bytes before its strings and an EndpointSlice endpoint 352;
//! managed fields, owner references, conditions and every annotation come along. At 10,000
//! services × 10 endpoints that was ~80 MiB of the agent's 118 MiB. Sources convert each
//! object at ingestion ([`From`] impls on [`crate::Object`]) into these types, which hold only
//! what the planner, the DNS zone and node routes read, and drop the original at once.
//!
//! Kept, per consumer:
//! * planner: cluster/external/load-balancer IPs, ports, node ports, traffic policies,
//!   affinity, health-check node port, source ranges; endpoint addresses, conditions, node,
//!   zone and hints; this node's addresses and zone label.
//! * DNS: type and externalName, `publishNotReadyAddresses`, port names, endpoint hostnames.
//! * node routes: podCIDRs, InternalIPs and the node's non-Kubernetes annotations (weir's
//!   `weir.dev/*` under whatever prefix is configured; annotations in the `kubernetes.io` and
//!   `k8s.io` domains, such as `kubectl.kubernetes.io/last-applied-configuration`, are dropped).
//! * health (`/healthz`): whether the Node is being deleted, its taint keys.
//! * sync latency metrics: the EndpointSlice's `last-change-trigger-time` annotation.
//!
//! Strings that repeat across objects (namespaces, node names, zones, port names, protocols)
//! are interned: equal values share one allocation.
//!
//! Values are kept as the API wrote them where a consumer reports invalid ones by their text
//! (an address that does not parse stays text, see [`IpText`]); conversion never fails.

use std::collections::{BTreeMap, HashSet};
use std::net::IpAddr;
use std::sync::{Arc, Mutex};

use k8s_openapi::api::core::v1::{Node, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;

/// The label tying an EndpointSlice to its Service.
pub const LABEL_SERVICE_NAME: &str = "kubernetes.io/service-name";
/// The Node label naming its zone.
pub const LABEL_ZONE: &str = "topology.kubernetes.io/zone";
/// The EndpointSlice annotation the EndpointSlice controller sets to when the change that
/// produced the slice happened (kube-proxy's network-programming latency starts there).
pub const ANNOTATION_TRIGGER_TIME: &str = "endpoints.kubernetes.io/last-change-trigger-time";

/// The shared copy of `s`. The table forgets strings nobody else holds any more whenever it
/// has doubled since the last sweep, so churn of unique values cannot grow it without bound.
pub fn intern(s: &str) -> Arc<str> {
    static TABLE: Mutex<(Option<HashSet<Arc<str>>>, usize)> = Mutex::new((None, 1024));
    let mut guard = TABLE.lock().unwrap_or_else(|e| e.into_inner());
    let (table, sweep_at) = &mut *guard;
    let table = table.get_or_insert_with(HashSet::new);
    if let Some(hit) = table.get(s) {
        return hit.clone();
    }
    if table.len() >= *sweep_at {
        table.retain(|a| Arc::strong_count(a) > 1);
        *sweep_at = (2 * table.len()).max(1024);
    }
    let new: Arc<str> = Arc::from(s);
    table.insert(new.clone());
    new
}

fn intern_opt(s: Option<&String>) -> Option<Arc<str>> {
    s.map(|s| intern(s))
}

fn boxed(list: Option<&Vec<String>>) -> Box<[Box<str>]> {
    list.into_iter()
        .flatten()
        .map(|s| s.as_str().into())
        .collect()
}

/// An IP address as written in an object: parsed when it parses (surrounding blanks
/// ignored), else the original text, which consumers report. `None` and `""` (a headless
/// or unallocated clusterIP) are text too.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum IpText {
    Ip(IpAddr),
    Text(Box<str>),
}

impl IpText {
    pub fn parse(s: &str) -> IpText {
        match s.trim().parse() {
            Ok(ip) => IpText::Ip(ip),
            Err(_) => IpText::Text(s.into()),
        }
    }
    pub fn ip(&self) -> Option<IpAddr> {
        match self {
            IpText::Ip(ip) => Some(*ip),
            IpText::Text(_) => None,
        }
    }
    /// The value as text (an address in its canonical form).
    pub fn text(&self) -> String {
        match self {
            IpText::Ip(ip) => ip.to_string(),
            IpText::Text(t) => t.to_string(),
        }
    }
    pub fn is(&self, text: &str) -> bool {
        matches!(self, IpText::Text(t) if &**t == text)
    }
}

/// What weir keeps of a Service.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServiceInfo {
    pub namespace: Arc<str>,
    pub name: Arc<str>,
    /// `None`: the object had no spec (no rules, no DNS records).
    pub spec: Option<ServiceSpecInfo>,
}

#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ServiceSpecInfo {
    /// `spec.type` as written (`ClusterIP`, `NodePort`, `LoadBalancer`, `ExternalName`).
    pub type_: Option<Arc<str>>,
    /// `spec.clusterIPs`, or `spec.clusterIP` when that list is empty (both as written).
    pub cluster_ips: Addresses,
    /// `sessionAffinity: ClientIP`.
    pub client_ip_affinity: bool,
    /// `internalTrafficPolicy: Local`.
    pub internal_policy_local: bool,
    /// `externalTrafficPolicy: Local`.
    pub external_policy_local: bool,
    pub publish_not_ready_addresses: bool,
    pub ports: Box<[ServicePortInfo]>,
    /// What most services do not set, boxed (inline it was 80 bytes per service).
    pub extra: Option<Box<ServiceSpecExtra>>,
}

/// The fields of a Service's spec that most services leave unset.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ServiceSpecExtra {
    pub external_name: Option<Box<str>>,
    pub external_ips: Box<[IpText]>,
    /// `status.loadBalancer.ingress[].ip`, without empty ones and without those with
    /// `ipMode: Proxy` (that load balancer proxies itself; short-circuiting would bypass it).
    pub load_balancer_ips: Box<[IpText]>,
    pub load_balancer_source_ranges: Box<[Box<str>]>,
    /// `sessionAffinityConfig.clientIP.timeoutSeconds` as written.
    pub affinity_timeout_seconds: Option<i32>,
    pub health_check_node_port: Option<i32>,
}

impl ServiceSpecInfo {
    fn extra(&self) -> Option<&ServiceSpecExtra> {
        self.extra.as_deref()
    }
    pub fn external_name(&self) -> Option<&str> {
        self.extra().and_then(|x| x.external_name.as_deref())
    }
    pub fn external_ips(&self) -> &[IpText] {
        self.extra().map_or(&[], |x| &x.external_ips)
    }
    pub fn load_balancer_ips(&self) -> &[IpText] {
        self.extra().map_or(&[], |x| &x.load_balancer_ips)
    }
    pub fn load_balancer_source_ranges(&self) -> &[Box<str>] {
        self.extra().map_or(&[], |x| &x.load_balancer_source_ranges)
    }
    pub fn affinity_timeout_seconds(&self) -> Option<i32> {
        self.extra().and_then(|x| x.affinity_timeout_seconds)
    }
    pub fn health_check_node_port(&self) -> Option<i32> {
        self.extra().and_then(|x| x.health_check_node_port)
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServicePortInfo {
    pub name: Option<Arc<str>>,
    /// As written; `None` means TCP.
    pub protocol: Option<Arc<str>>,
    pub port: i32,
    pub node_port: Option<i32>,
}

/// What weir keeps of an EndpointSlice.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EndpointSliceInfo {
    pub namespace: Arc<str>,
    pub name: Arc<str>,
    /// The `kubernetes.io/service-name` label (`None` when missing or empty).
    pub service_name: Option<Arc<str>>,
    /// `addressType` as written (`IPv4`, `IPv6`, `FQDN`).
    pub address_type: Arc<str>,
    pub ports: Box<[EndpointPortInfo]>,
    pub endpoints: Box<[EndpointInfo]>,
    /// The `endpoints.kubernetes.io/last-change-trigger-time` annotation.
    pub trigger_time: Option<Box<str>>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EndpointPortInfo {
    pub name: Option<Arc<str>>,
    /// As written; `None` means TCP.
    pub protocol: Option<Arc<str>>,
    pub port: Option<i32>,
}

/// Addresses as written, nearly always one (an endpoint's: the API allows one today; a
/// single-stack Service's clusterIPs): a single one is held inline, other counts boxed. A
/// boxed slice of one address was a separate 24-byte allocation per endpoint (24 MiB at
/// 100,000 services × 10 endpoints).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Addresses {
    One(IpText),
    Many(Box<[IpText]>),
}

impl Default for Addresses {
    fn default() -> Self {
        Addresses::Many(Box::new([]))
    }
}

impl std::ops::Deref for Addresses {
    type Target = [IpText];
    fn deref(&self) -> &[IpText] {
        match self {
            Addresses::One(a) => std::slice::from_ref(a),
            Addresses::Many(m) => m,
        }
    }
}

impl FromIterator<IpText> for Addresses {
    fn from_iter<I: IntoIterator<Item = IpText>>(iter: I) -> Self {
        let mut iter = iter.into_iter();
        let Some(first) = iter.next() else {
            return Addresses::default();
        };
        match iter.next() {
            None => Addresses::One(first),
            Some(second) => Addresses::Many([first, second].into_iter().chain(iter).collect()),
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EndpointInfo {
    pub addresses: Addresses,
    /// The conditions as written (`None`: unset, which the API reads as true for ready and
    /// serving, false for terminating).
    pub ready: Option<bool>,
    pub serving: Option<bool>,
    pub terminating: Option<bool>,
    /// `nodeName` and `zone`, interned as a pair: a cluster has as many pairs as nodes, and
    /// two pointers per endpoint were 16 MiB at 100,000 services × 10 endpoints.
    pub placement: Option<Arc<Placement>>,
    /// The hostname and topology hints, boxed: most endpoints have none of them, and inline
    /// they would cost 24 bytes per endpoint (24 MiB at 100,000 services × 10 endpoints).
    pub extra: Option<Box<EndpointExtra>>,
}

/// What few endpoints carry: `hostname`, `hints.forZones[].name` and `hints.forNodes[].name`.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct EndpointExtra {
    pub hostname: Option<Box<str>>,
    pub zones: Box<[Arc<str>]>,
    pub nodes: Box<[Arc<str>]>,
}

/// An endpoint's node and zone.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Default)]
pub struct Placement {
    pub node_name: Option<Arc<str>>,
    pub zone: Option<Arc<str>>,
}

impl Placement {
    /// The shared copy of this node and zone (`None` when both are unset). Like [`intern`],
    /// the table forgets pairs nobody holds whenever it has doubled since the last sweep.
    pub fn interned(node_name: Option<&str>, zone: Option<&str>) -> Option<Arc<Placement>> {
        if node_name.is_none() && zone.is_none() {
            return None;
        }
        // The endpoints of a slice are converted one after the other and often share their
        // node: the last pair is checked first, without a lock.
        thread_local! {
            static LAST: std::cell::RefCell<Option<Arc<Placement>>> =
                const { std::cell::RefCell::new(None) };
        }
        let same = |p: &Placement| p.node_name.as_deref() == node_name && p.zone.as_deref() == zone;
        if let Some(hit) = LAST.with_borrow(|l| l.as_ref().filter(|p| same(p)).cloned()) {
            return Some(hit);
        }
        let found = Self::lookup(node_name, zone);
        LAST.with_borrow_mut(|l| *l = Some(found.clone()));
        Some(found)
    }

    fn lookup(node_name: Option<&str>, zone: Option<&str>) -> Arc<Placement> {
        let p = Placement {
            node_name: node_name.map(intern),
            zone: zone.map(intern),
        };
        type Table = (Option<HashSet<Arc<Placement>>>, usize);
        static TABLE: Mutex<Table> = Mutex::new((None, 1024));
        let mut guard = TABLE.lock().unwrap_or_else(|e| e.into_inner());
        let (table, sweep_at) = &mut *guard;
        let table = table.get_or_insert_with(HashSet::new);
        if let Some(hit) = table.get(&p) {
            return hit.clone();
        }
        if table.len() >= *sweep_at {
            table.retain(|a| Arc::strong_count(a) > 1);
            *sweep_at = (2 * table.len()).max(1024);
        }
        let new = Arc::new(p);
        table.insert(new.clone());
        new
    }
}

impl EndpointInfo {
    pub fn node_name(&self) -> Option<&Arc<str>> {
        self.placement.as_deref().and_then(|p| p.node_name.as_ref())
    }
    pub fn zone(&self) -> Option<&Arc<str>> {
        self.placement.as_deref().and_then(|p| p.zone.as_ref())
    }
    pub fn hostname(&self) -> Option<&str> {
        self.extra.as_deref().and_then(|x| x.hostname.as_deref())
    }
    pub fn zone_hints(&self) -> &[Arc<str>] {
        self.extra.as_deref().map_or(&[], |h| &h.zones)
    }
    pub fn node_hints(&self) -> &[Arc<str>] {
        self.extra.as_deref().map_or(&[], |h| &h.nodes)
    }
}

/// What weir keeps of a Node.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeInfo {
    pub name: Arc<str>,
    /// `status.addresses` in the object's order.
    pub addresses: Box<[NodeAddressInfo]>,
    /// `spec.podCIDRs` followed by `spec.podCIDR`, as written.
    pub pod_cidrs: Box<[Box<str>]>,
    /// The `topology.kubernetes.io/zone` label.
    pub zone: Option<Arc<str>>,
    /// Annotations outside the `kubernetes.io` and `k8s.io` domains.
    pub annotations: BTreeMap<Box<str>, Box<str>>,
    /// `metadata.deletionTimestamp` is set.
    pub deleting: bool,
    pub taint_keys: Box<[Box<str>]>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeAddressInfo {
    /// `InternalIP`, `ExternalIP`, `Hostname` …
    pub type_: Arc<str>,
    pub address: Box<str>,
}

/// Whether an annotation key belongs to Kubernetes itself (`kubernetes.io`, `k8s.io` and
/// their subdomains), which no consumer of weir's reads.
fn kubernetes_annotation(key: &str) -> bool {
    let Some((domain, _)) = key.split_once('/') else {
        return false;
    };
    ["kubernetes.io", "k8s.io"]
        .iter()
        .any(|d| domain == *d || domain.ends_with(&format!(".{d}")))
}

impl From<&Service> for ServiceInfo {
    fn from(o: &Service) -> Self {
        let spec = o.spec.as_ref().map(|spec| {
            let cluster_ips: Vec<&String> = match &spec.cluster_ips {
                Some(v) if !v.is_empty() => v.iter().collect(),
                _ => spec.cluster_ip.iter().collect(),
            };
            let ingress = o
                .status
                .as_ref()
                .and_then(|s| s.load_balancer.as_ref())
                .and_then(|lb| lb.ingress.as_ref());
            let extra = ServiceSpecExtra {
                external_name: spec.external_name.as_deref().map(Into::into),
                external_ips: spec
                    .external_ips
                    .iter()
                    .flatten()
                    .map(|s| IpText::parse(s))
                    .collect(),
                load_balancer_ips: ingress
                    .into_iter()
                    .flatten()
                    .filter(|i| i.ip_mode.as_deref() != Some("Proxy"))
                    .filter_map(|i| i.ip.as_deref())
                    .filter(|s| !s.is_empty())
                    .map(IpText::parse)
                    .collect(),
                load_balancer_source_ranges: boxed(spec.load_balancer_source_ranges.as_ref()),
                affinity_timeout_seconds: spec
                    .session_affinity_config
                    .as_ref()
                    .and_then(|c| c.client_ip.as_ref())
                    .and_then(|c| c.timeout_seconds),
                health_check_node_port: spec.health_check_node_port,
            };
            ServiceSpecInfo {
                type_: intern_opt(spec.type_.as_ref()),
                cluster_ips: cluster_ips.into_iter().map(|s| IpText::parse(s)).collect(),
                client_ip_affinity: spec.session_affinity.as_deref() == Some("ClientIP"),
                internal_policy_local: spec.internal_traffic_policy.as_deref() == Some("Local"),
                external_policy_local: spec.external_traffic_policy.as_deref() == Some("Local"),
                extra: (extra != ServiceSpecExtra::default()).then(|| Box::new(extra)),
                publish_not_ready_addresses: spec.publish_not_ready_addresses.unwrap_or(false),
                ports: spec
                    .ports
                    .iter()
                    .flatten()
                    .map(|p| ServicePortInfo {
                        name: intern_opt(p.name.as_ref()),
                        protocol: intern_opt(p.protocol.as_ref()),
                        port: p.port,
                        node_port: p.node_port,
                    })
                    .collect(),
            }
        });
        ServiceInfo {
            namespace: intern(o.metadata.namespace.as_deref().unwrap_or("default")),
            name: o.metadata.name.as_deref().unwrap_or_default().into(),
            spec,
        }
    }
}

impl From<&EndpointSlice> for EndpointSliceInfo {
    fn from(o: &EndpointSlice) -> Self {
        let names = |list: Option<Vec<&String>>| -> Box<[Arc<str>]> {
            list.into_iter().flatten().map(|s| intern(s)).collect()
        };
        EndpointSliceInfo {
            namespace: intern(o.metadata.namespace.as_deref().unwrap_or("default")),
            name: o.metadata.name.as_deref().unwrap_or_default().into(),
            service_name: o
                .metadata
                .labels
                .as_ref()
                .and_then(|l| l.get(LABEL_SERVICE_NAME))
                .filter(|s| !s.is_empty())
                .map(|s| intern(s)),
            address_type: intern(&o.address_type),
            ports: o
                .ports
                .iter()
                .flatten()
                .map(|p| EndpointPortInfo {
                    name: intern_opt(p.name.as_ref()),
                    protocol: intern_opt(p.protocol.as_ref()),
                    port: p.port,
                })
                .collect(),
            endpoints: o
                .endpoints
                .iter()
                .flatten()
                .map(|e| {
                    let cond = e.conditions.as_ref();
                    let hints = e.hints.as_ref();
                    EndpointInfo {
                        addresses: e.addresses.iter().map(|a| IpText::parse(a)).collect(),
                        ready: cond.and_then(|c| c.ready),
                        serving: cond.and_then(|c| c.serving),
                        terminating: cond.and_then(|c| c.terminating),
                        placement: Placement::interned(e.node_name.as_deref(), e.zone.as_deref()),
                        extra: Some(EndpointExtra {
                            hostname: e.hostname.as_deref().map(Into::into),
                            zones: names(
                                hints
                                    .and_then(|h| h.for_zones.as_ref())
                                    .map(|z| z.iter().map(|z| &z.name).collect()),
                            ),
                            nodes: names(
                                hints
                                    .and_then(|h| h.for_nodes.as_ref())
                                    .map(|n| n.iter().map(|n| &n.name).collect()),
                            ),
                        })
                        .filter(|h| {
                            h.hostname.is_some() || !h.zones.is_empty() || !h.nodes.is_empty()
                        })
                        .map(Box::new),
                    }
                })
                .collect(),
            trigger_time: o
                .metadata
                .annotations
                .as_ref()
                .and_then(|a| a.get(ANNOTATION_TRIGGER_TIME))
                .map(|t| t.as_str().into()),
        }
    }
}

impl From<&Node> for NodeInfo {
    fn from(o: &Node) -> Self {
        let spec = o.spec.as_ref();
        let listed = spec
            .and_then(|s| s.pod_cidrs.as_ref())
            .into_iter()
            .flatten();
        NodeInfo {
            name: intern(o.metadata.name.as_deref().unwrap_or_default()),
            addresses: o
                .status
                .as_ref()
                .and_then(|s| s.addresses.as_ref())
                .into_iter()
                .flatten()
                .map(|a| NodeAddressInfo {
                    type_: intern(&a.type_),
                    address: a.address.as_str().into(),
                })
                .collect(),
            pod_cidrs: listed
                .chain(spec.and_then(|s| s.pod_cidr.as_ref()))
                .map(|s| s.as_str().into())
                .collect(),
            zone: o
                .metadata
                .labels
                .as_ref()
                .and_then(|l| l.get(LABEL_ZONE))
                .map(|z| intern(z)),
            annotations: o
                .metadata
                .annotations
                .iter()
                .flatten()
                .filter(|(k, _)| !kubernetes_annotation(k))
                .map(|(k, v)| (k.as_str().into(), v.as_str().into()))
                .collect(),
            deleting: o.metadata.deletion_timestamp.is_some(),
            taint_keys: spec
                .and_then(|s| s.taints.as_ref())
                .into_iter()
                .flatten()
                .map(|t| t.key.as_str().into())
                .collect(),
        }
    }
}

// Back to Kubernetes objects holding exactly what was kept (for the manifest source's
// last-known-good copies on disk): converting the result again gives the same value.

fn strings<T: AsRef<str>>(list: &[T]) -> Option<Vec<String>> {
    (!list.is_empty()).then(|| list.iter().map(|s| s.as_ref().to_string()).collect())
}

fn meta(
    namespace: Option<&str>,
    name: &str,
) -> k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta {
    k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta {
        namespace: namespace.map(String::from),
        name: Some(name.to_string()),
        ..Default::default()
    }
}

impl From<&ServiceInfo> for Service {
    fn from(o: &ServiceInfo) -> Self {
        use k8s_openapi::api::core::v1 as core;
        let spec = o.spec.as_ref().map(|s| core::ServiceSpec {
            type_: s.type_.as_deref().map(String::from),
            external_name: s.external_name().map(String::from),
            cluster_ips: (!s.cluster_ips.is_empty())
                .then(|| s.cluster_ips.iter().map(IpText::text).collect()),
            external_ips: (!s.external_ips().is_empty())
                .then(|| s.external_ips().iter().map(IpText::text).collect()),
            load_balancer_source_ranges: strings(s.load_balancer_source_ranges()),
            session_affinity: s.client_ip_affinity.then(|| "ClientIP".into()),
            session_affinity_config: s.affinity_timeout_seconds().map(|t| {
                core::SessionAffinityConfig {
                    client_ip: Some(core::ClientIPConfig {
                        timeout_seconds: Some(t),
                    }),
                }
            }),
            internal_traffic_policy: s.internal_policy_local.then(|| "Local".into()),
            external_traffic_policy: s.external_policy_local.then(|| "Local".into()),
            health_check_node_port: s.health_check_node_port(),
            publish_not_ready_addresses: s.publish_not_ready_addresses.then_some(true),
            ports: (!s.ports.is_empty()).then(|| {
                s.ports
                    .iter()
                    .map(|p| core::ServicePort {
                        name: p.name.as_deref().map(String::from),
                        protocol: p.protocol.as_deref().map(String::from),
                        port: p.port,
                        node_port: p.node_port,
                        ..Default::default()
                    })
                    .collect()
            }),
            ..Default::default()
        });
        let status = o
            .spec
            .as_ref()
            .filter(|s| !s.load_balancer_ips().is_empty())
            .map(|s| core::ServiceStatus {
                load_balancer: Some(core::LoadBalancerStatus {
                    ingress: Some(
                        s.load_balancer_ips()
                            .iter()
                            .map(|ip| core::LoadBalancerIngress {
                                ip: Some(ip.text()),
                                ..Default::default()
                            })
                            .collect(),
                    ),
                }),
                ..Default::default()
            });
        Service {
            metadata: meta(Some(&o.namespace), &o.name),
            spec,
            status,
        }
    }
}

impl From<&EndpointSliceInfo> for EndpointSlice {
    fn from(o: &EndpointSliceInfo) -> Self {
        use k8s_openapi::api::discovery::v1 as discovery;
        let mut metadata = meta(Some(&o.namespace), &o.name);
        metadata.labels = o
            .service_name
            .as_ref()
            .map(|s| [(LABEL_SERVICE_NAME.to_string(), s.to_string())].into());
        metadata.annotations = o
            .trigger_time
            .as_ref()
            .map(|t| [(ANNOTATION_TRIGGER_TIME.to_string(), t.to_string())].into());
        let hints = |e: &EndpointInfo| {
            (!e.zone_hints().is_empty() || !e.node_hints().is_empty()).then(|| {
                discovery::EndpointHints {
                    for_zones: (!e.zone_hints().is_empty()).then(|| {
                        e.zone_hints()
                            .iter()
                            .map(|z| discovery::ForZone {
                                name: z.to_string(),
                            })
                            .collect()
                    }),
                    for_nodes: (!e.node_hints().is_empty()).then(|| {
                        e.node_hints()
                            .iter()
                            .map(|n| discovery::ForNode {
                                name: n.to_string(),
                            })
                            .collect()
                    }),
                }
            })
        };
        EndpointSlice {
            metadata,
            address_type: o.address_type.to_string(),
            ports: (!o.ports.is_empty()).then(|| {
                o.ports
                    .iter()
                    .map(|p| discovery::EndpointPort {
                        name: p.name.as_deref().map(String::from),
                        protocol: p.protocol.as_deref().map(String::from),
                        port: p.port,
                        ..Default::default()
                    })
                    .collect()
            }),
            endpoints: (!o.endpoints.is_empty()).then(|| {
                o.endpoints
                    .iter()
                    .map(|e| discovery::Endpoint {
                        addresses: e.addresses.iter().map(IpText::text).collect(),
                        conditions: (e.ready.is_some()
                            || e.serving.is_some()
                            || e.terminating.is_some())
                        .then_some(discovery::EndpointConditions {
                            ready: e.ready,
                            serving: e.serving,
                            terminating: e.terminating,
                        }),
                        hostname: e.hostname().map(String::from),
                        node_name: e.node_name().map(|n| n.to_string()),
                        zone: e.zone().map(|z| z.to_string()),
                        hints: hints(e),
                        ..Default::default()
                    })
                    .collect()
            }),
        }
    }
}

impl From<&NodeInfo> for Node {
    fn from(o: &NodeInfo) -> Self {
        use k8s_openapi::api::core::v1 as core;
        let mut metadata = meta(None, &o.name);
        metadata.labels = o
            .zone
            .as_ref()
            .map(|z| [(LABEL_ZONE.to_string(), z.to_string())].into());
        metadata.annotations = (!o.annotations.is_empty()).then(|| {
            o.annotations
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect()
        });
        if o.deleting {
            // The time itself is not kept: only that deletion started.
            metadata.deletion_timestamp =
                Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
                    k8s_openapi::jiff::Timestamp::UNIX_EPOCH,
                ));
        }
        Node {
            metadata,
            spec: Some(core::NodeSpec {
                pod_cidrs: strings(&o.pod_cidrs),
                taints: (!o.taint_keys.is_empty()).then(|| {
                    o.taint_keys
                        .iter()
                        .map(|k| core::Taint {
                            key: k.to_string(),
                            effect: "NoSchedule".into(),
                            ..Default::default()
                        })
                        .collect()
                }),
                ..Default::default()
            }),
            status: (!o.addresses.is_empty()).then(|| core::NodeStatus {
                addresses: Some(
                    o.addresses
                        .iter()
                        .map(|a| core::NodeAddress {
                            type_: a.type_.to_string(),
                            address: a.address.to_string(),
                        })
                        .collect(),
                ),
                ..Default::default()
            }),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_kubernetes_own_annotation_domains_are_dropped() {
        assert!(kubernetes_annotation(
            "kubectl.kubernetes.io/last-applied-configuration"
        ));
        assert!(kubernetes_annotation("node.alpha.kubernetes.io/ttl"));
        assert!(kubernetes_annotation(
            "kubeadm.alpha.kubernetes.io/cri-socket"
        ));
        assert!(kubernetes_annotation("k8s.io/x"));
        assert!(!kubernetes_annotation("weir.dev/backend-data"));
        assert!(!kubernetes_annotation("flannel.alpha.coreos.com/public-ip"));
        assert!(!kubernetes_annotation("notkubernetes.io/x"));
        assert!(!kubernetes_annotation("plain"));
    }

    /// An endpoint is held per endpoint of every slice (a million at 100,000 services × 10
    /// endpoints): its one address inline, its rare hostname and hints behind one pointer.
    #[test]
    fn an_endpoint_is_small() {
        assert!(std::mem::size_of::<EndpointInfo>() <= 48);
        let a = Placement::interned(Some("node-a"), Some("zone-1")).unwrap();
        let b = Placement::interned(Some("node-a"), Some("zone-1")).unwrap();
        assert!(Arc::ptr_eq(&a, &b), "one copy per node and zone");
        assert_eq!(Placement::interned(None, None), None);
        let one: Addresses = [IpText::parse("10.0.0.1")].into_iter().collect();
        assert!(matches!(one, Addresses::One(_)));
        assert_eq!(one.len(), 1);
        let two: Addresses = [IpText::parse("10.0.0.1"), IpText::parse("x")]
            .into_iter()
            .collect();
        assert_eq!(two[1], IpText::Text("x".into()));
    }

    #[test]
    fn interned_strings_are_shared_and_unused_ones_forgotten() {
        let a = intern("zone-a-interned");
        let b = intern(&String::from("zone-a-interned"));
        assert!(Arc::ptr_eq(&a, &b));
        // Many unique strings nobody keeps: the table sweeps them instead of growing.
        for i in 0..10_000 {
            intern(&format!("unique-{i}"));
        }
        let c = intern("zone-a-interned");
        assert!(Arc::ptr_eq(&a, &c), "a value still held stays shared");
    }
}
