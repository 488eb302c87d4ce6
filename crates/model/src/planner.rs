//! Snapshot + config → [`Plan`], following kube-proxy's semantics (servicechangetracker,
//! endpointslicecache, topology.go, the nftables proxier).

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::net::IpAddr;
use std::sync::Arc;

use ipnet::IpNet;

use crate::compact::{
    intern, EndpointSliceInfo, IpText, NodeInfo, ServiceInfo, ServicePortInfo, ServiceSpecInfo,
    LABEL_SERVICE_NAME,
};
use crate::diff::{Changed, PlanDiff};
use crate::objects::{Kind, Object, ObjectKey, Snapshot};
use crate::plan::*;

/// kube-proxy's default ClientIP affinity timeout (3 hours).
pub const DEFAULT_AFFINITY_TIMEOUT_SECONDS: u32 = 10800;

/// Per-node proxy configuration (the planner's other input).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ProxyConfig {
    /// This node's name (endpoints with this `nodeName` are local; PreferSameNode hints).
    pub node_name: String,
    /// This node's primary addresses (kube-proxy's `--bind-address`). A family without one
    /// here takes the Node object's (named `node_name`: first InternalIP of that family, else
    /// first ExternalIP).
    pub node_ips: Vec<IpAddr>,
    /// All addresses configured on this node's interfaces; matched against
    /// `nodeport_addresses` CIDRs. (Gathered by the caller; the planner does no I/O.)
    pub local_addresses: Vec<IpAddr>,
    /// Pod CIDRs of the whole cluster (sources outside are masqueraded for ClusterIPs).
    pub cluster_cidrs: Vec<IpNet>,
    pub masquerade_all: bool,
    /// `--nodeport-addresses`. Empty: see `nodeport_default`. A zero-length prefix
    /// (`0.0.0.0/0`, `::/0`), or no CIDR of a family while the list has CIDRs of the other
    /// (kube-proxy's rule), means every local address of that family. Loopback addresses
    /// only with `localhost_nodeports`.
    pub nodeport_addresses: Vec<IpNet>,
    /// What an empty `nodeport_addresses` means (kube-proxy's default differs per mode).
    pub nodeport_default: NodePortDefault,
    /// Loopback addresses that `nodeport_addresses` CIDRs match serve NodePorts too (IPv4
    /// only). kube-proxy's iptables mode allows it (with `route_localnet`); nftables cannot.
    pub localhost_nodeports: bool,
    /// This node's zone. `None`: the Node object's `topology.kubernetes.io/zone` label.
    pub zone: Option<String>,
}

/// The NodePort addresses when `--nodeport-addresses` is not given.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum NodePortDefault {
    /// The node's primary IPs (kube-proxy's nftables mode, and the value `primary`): none
    /// while they are unknown (no Node object with addresses and no `node_ips`).
    #[default]
    Primary,
    /// Every local address (kube-proxy's iptables mode: `-m addrtype --dst-type LOCAL`),
    /// which needs no Node object.
    AllLocal,
}

/// Computes the plan. Pure and deterministic.
pub fn plan(snapshot: &Snapshot, config: &ProxyConfig) -> Plan {
    Planner::default().plan(snapshot, config)
}

/// (namespace, name). The planner's maps key by the strings of the objects themselves
/// (shared, not copied: four maps of 10,000 services held ~3 MiB of copied names).
type NsName = (Arc<str>, Arc<str>);

/// A key to look up or remove by (the namespace is interned, the name allocated; keys that
/// are stored come from the objects, see [`object_key`]).
fn ns_name(ns: &str, name: &str) -> NsName {
    (intern(ns), Arc::from(name))
}

fn object_key(ns: &Arc<str>, name: &Arc<str>) -> NsName {
    (ns.clone(), name.clone())
}

/// What the node-wide part of the plan was computed from: the configuration and the facts
/// of this node's Node object the planner reads.
#[derive(Clone, PartialEq)]
struct Context {
    config: ProxyConfig,
    node_ips: Vec<IpAddr>,
    zone: String,
}

/// The planner, fed object changes: it keeps the objects it was given (the `Arc`s the store
/// holds, indexed by service) and the plan of every service, and replans only what a change
/// touches — a Service change its service, an EndpointSlice change the service(s) its
/// `kubernetes.io/service-name` label names (before and after), a change of this node's
/// Node object everything when it moves this node's IPs or zone (NodePort addresses,
/// topology, externalTrafficPolicy). So a change costs the planning of the services it
/// touches, not of the cluster; unchanged service ports keep their `Arc`s, which
/// [`Plan::diff`] recognises by pointer. The plan always equals [`plan`] of the same objects.
#[derive(Default)]
pub struct Planner {
    context: Option<Context>,
    services: HashMap<NsName, Arc<ServiceInfo>>,
    slices: HashMap<NsName, Arc<EndpointSliceInfo>>,
    nodes: HashMap<String, Arc<NodeInfo>>,
    /// Labelled slices by (namespace, service name), sorted by slice name (the order the
    /// endpoints are merged in). A sorted `Vec`, not a map: most services have one slice,
    /// and a B-tree's node has room for eleven (~400 bytes per service at 10,000).
    by_service: HashMap<NsName, Vec<Arc<EndpointSliceInfo>>>,
    /// The problems each service's planning reported, for the services that had any (a
    /// service's ports are found in the plan itself, whose keys sort by namespace and name:
    /// a per-service list of them was ~170 bytes per service).
    warned: HashMap<NsName, Box<[String]>>,
    /// Every standing warning with the number of places reporting it.
    warnings: BTreeMap<String, usize>,
    plan: Plan,
}

impl Planner {
    /// Plans `snapshot` whole: the objects that differ from what the planner was last given
    /// (by pointer, then value) are fed to [`Planner::apply`] as changes.
    pub fn plan(&mut self, snapshot: &Snapshot, config: &ProxyConfig) -> Plan {
        let mut changes: Vec<(ObjectKey, Option<Object>)> = Vec::new();
        fn same<T: PartialEq>(a: Option<&Arc<T>>, b: &Arc<T>) -> bool {
            a.is_some_and(|a| Arc::ptr_eq(a, b) || a == b)
        }
        for ((ns, name), o) in &snapshot.services {
            if !same(self.services.get(&(ns.clone(), name.clone())), o) {
                let key = ObjectKey::new(Kind::Service, &**ns, &**name);
                changes.push((key, Some(Object::Service(o.clone()))));
            }
        }
        for ((ns, name), o) in &snapshot.endpoint_slices {
            if !same(self.slices.get(&(ns.clone(), name.clone())), o) {
                let key = ObjectKey::new(Kind::EndpointSlice, &**ns, &**name);
                changes.push((key, Some(Object::EndpointSlice(o.clone()))));
            }
        }
        for (name, o) in &snapshot.nodes {
            if !same(self.nodes.get(name), o) {
                let key = ObjectKey::new(Kind::Node, "", name);
                changes.push((key, Some(Object::Node(o.clone()))));
            }
        }
        let gone = |kind| move |(ns, name): &NsName| (ObjectKey::new(kind, &**ns, &**name), None);
        let listed = |(ns, name): &NsName| (ns.clone(), name.clone());
        changes.extend(
            self.services
                .keys()
                .filter(|k| !snapshot.services.contains_key(&listed(k)))
                .map(gone(Kind::Service)),
        );
        changes.extend(
            self.slices
                .keys()
                .filter(|k| !snapshot.endpoint_slices.contains_key(&listed(k)))
                .map(gone(Kind::EndpointSlice)),
        );
        changes.extend(
            self.nodes
                .keys()
                .filter(|k| !snapshot.nodes.contains_key(*k))
                .map(|n| (ObjectKey::new(Kind::Node, "", n), None)),
        );
        self.apply(changes, config)
    }

    /// Applies object changes (`None`: deleted) and returns the new plan: [`Planner::update`]
    /// plus a copy of the plan's service map (which shares every service port's `Arc`).
    pub fn apply(
        &mut self,
        changes: impl IntoIterator<Item = (ObjectKey, Option<Object>)>,
        config: &ProxyConfig,
    ) -> Plan {
        self.update(changes, config);
        self.plan.clone()
    }

    /// The plan of every change applied so far.
    pub fn current(&self) -> &Plan {
        &self.plan
    }

    /// Applies object changes (`None`: deleted) and returns what they changed in the plan:
    /// `before.diff(after)`, found while replanning, so it costs the planning of the
    /// services the changes touch, whatever the size of the cluster. The plan itself is
    /// [`Planner::current`].
    pub fn update(
        &mut self,
        changes: impl IntoIterator<Item = (ObjectKey, Option<Object>)>,
        config: &ProxyConfig,
    ) -> PlanDiff {
        let mut diff = PlanDiff::default();
        let mut dirty: BTreeSet<NsName> = BTreeSet::new();
        for (key, object) in changes {
            self.record(key, object, &mut dirty);
        }
        let node = self.nodes.get(&config.node_name).cloned();
        let mut node_ips = config.node_ips.clone();
        let from_node = node.as_deref().map(primary_node_ips).unwrap_or_default();
        node_ips.extend(from_node.into_iter().filter(|ip| {
            !config
                .node_ips
                .iter()
                .any(|c| IpFamily::of(c) == IpFamily::of(ip))
        }));
        let zone = config
            .zone
            .clone()
            .or_else(|| {
                node.as_ref()
                    .and_then(|n| n.zone.as_deref().map(String::from))
            })
            .unwrap_or_default();
        let context = Context {
            config: config.clone(),
            node_ips,
            zone,
        };
        if self.context.as_ref() != Some(&context) {
            dirty.extend(self.services.keys().cloned());
            dirty.extend(self.by_service.keys().cloned());
            dirty.extend(self.warned.keys().cloned());
            dirty.extend(
                self.plan
                    .services
                    .keys()
                    .map(|k| (k.namespace.clone(), k.name.clone())),
            );
            self.context = Some(context);
        }
        // Taken out while the services are replanned (they borrow it; `replan` needs `self`).
        let context = self.context.take().expect("set above");
        let ctx = Ctx {
            config: &context.config,
            node_ips: &context.node_ips,
            zone: &context.zone,
        };
        let replanned = dirty.len();
        for group in dirty {
            self.replan(&ctx, group, &mut diff);
        }
        if replanned >= 1024 {
            // Service ports inserted in key order (a first sync) leave the B-tree's nodes
            // half empty; rebuilt from the sorted map they are full (and so is every copy
            // of the plan: the backend keeps one).
            let services = std::mem::take(&mut self.plan.services);
            self.plan.services = services.into_iter().collect();
        }
        let before = crate::diff::globals(&self.plan);
        let p = &mut self.plan;
        p.node_port_addresses_v4 = nodeport_addresses(config, ctx.node_ips, IpFamily::V4);
        p.node_port_addresses_v6 = nodeport_addresses(config, ctx.node_ips, IpFamily::V6);
        p.cluster_cidrs = config.cluster_cidrs.clone();
        p.masquerade_all = config.masquerade_all;
        p.warnings = self.warnings.keys().cloned().collect();
        self.context = Some(context);
        diff.note_globals(&before, &self.plan);
        diff
    }

    /// Stores one change; adds the services it touches to `dirty`.
    fn record(&mut self, key: ObjectKey, object: Option<Object>, dirty: &mut BTreeSet<NsName>) {
        match (key.kind, object) {
            (Kind::Service, o) => {
                let nk = match o {
                    Some(Object::Service(s)) => {
                        let nk = object_key(&s.namespace, &s.name);
                        self.services.insert(nk.clone(), s);
                        nk
                    }
                    _ => {
                        let nk = ns_name(&key.namespace, &key.name);
                        self.services.remove(&nk);
                        nk
                    }
                };
                dirty.insert(nk);
            }
            (Kind::EndpointSlice, o) => {
                let new = match o {
                    Some(Object::EndpointSlice(s)) => Some(s),
                    _ => None,
                };
                let old = match &new {
                    Some(s) => self
                        .slices
                        .insert(object_key(&s.namespace, &s.name), s.clone()),
                    None => self.slices.remove(&ns_name(&key.namespace, &key.name)),
                };
                if let Some(old) = old {
                    self.unindex(&old, dirty);
                }
                if let Some(new) = new {
                    self.index(&new, dirty);
                }
            }
            (Kind::Node, o) => {
                match o {
                    Some(Object::Node(n)) => self.nodes.insert(key.name, n),
                    _ => self.nodes.remove(&key.name),
                };
            }
            // Pods (`weir dns --pods verified`, `weir policy`), Namespaces and NetworkPolicies
            // (`weir policy`) plan no service.
            (Kind::Pod | Kind::Namespace | Kind::NetworkPolicy, _) => {}
        }
    }

    fn index(&mut self, slice: &Arc<EndpointSliceInfo>, dirty: &mut BTreeSet<NsName>) {
        match &slice.service_name {
            Some(svc) => {
                let group = object_key(&slice.namespace, svc);
                let slices = self.by_service.entry(group.clone()).or_default();
                match slices.binary_search_by(|s| s.name.cmp(&slice.name)) {
                    Ok(i) => slices[i] = slice.clone(),
                    Err(i) => slices.insert(i, slice.clone()),
                }
                dirty.insert(group);
            }
            None => add_warning(&mut self.warnings, unlabelled(slice)),
        }
    }

    fn unindex(&mut self, slice: &EndpointSliceInfo, dirty: &mut BTreeSet<NsName>) {
        match &slice.service_name {
            Some(svc) => {
                let group = object_key(&slice.namespace, svc);
                if let Some(g) = self.by_service.get_mut(&group) {
                    if let Ok(i) = g.binary_search_by(|s| s.name.cmp(&slice.name)) {
                        g.remove(i);
                    }
                    if g.is_empty() {
                        self.by_service.remove(&group);
                    }
                }
                dirty.insert(group);
            }
            None => remove_warning(&mut self.warnings, &unlabelled(slice)),
        }
    }

    /// Plans one service afresh and puts the result in the plan, keeping the `Arc` of every
    /// port whose plan did not change; records the ports that did in `diff`.
    fn replan(&mut self, ctx: &Ctx<'_>, group: NsName, diff: &mut PlanDiff) {
        for w in self.warned.remove(&group).unwrap_or_default() {
            remove_warning(&mut self.warnings, &w);
        }
        // The service's ports: the first possible key of the service, then on while the
        // namespace and name are the same.
        let first = ServicePortKey {
            namespace: group.0.clone(),
            name: group.1.clone(),
            port_name: intern(""),
            protocol: Protocol::Tcp,
            family: IpFamily::V4,
        };
        let mut old_ports: HashMap<ServicePortKey, Arc<ServicePortPlan>> = self
            .plan
            .services
            .range(&first..)
            .take_while(|(k, _)| k.namespace == group.0 && k.name == group.1)
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
        for k in old_ports.keys() {
            self.plan.services.remove(k);
        }
        let mut warnings = BTreeSet::new();
        let slices = self.by_service.get(&group);
        let index = EndpointIndex::build(
            &group.0,
            slices.into_iter().flatten().map(|s| (&*s.name, &**s)),
            &ctx.config.node_name,
            &mut warnings,
        );
        let mut ports = BTreeMap::new();
        if let Some(svc) = self.services.get(&group) {
            plan_service(
                ctx,
                &group.0,
                &group.1,
                svc,
                &index,
                &mut ports,
                &mut warnings,
            );
        }
        let ports = ports.into_iter().map(|(k, v)| match old_ports.remove(&k) {
            Some(old) if *old == v => (k, old),
            Some(old) => {
                let new = Arc::new(v);
                let change = Changed {
                    old,
                    new: new.clone(),
                };
                diff.changed.insert(k.clone(), change);
                (k, new)
            }
            None => {
                let new = Arc::new(v);
                diff.added.insert(k.clone(), new.clone());
                (k, new)
            }
        });
        self.plan.services.extend(ports);
        diff.removed.extend(old_ports);
        for w in &warnings {
            add_warning(&mut self.warnings, w.clone());
        }
        if !warnings.is_empty() {
            self.warned.insert(group, warnings.into_iter().collect());
        }
    }
}

fn unlabelled(slice: &EndpointSliceInfo) -> String {
    let (ns, name) = (&slice.namespace, &slice.name);
    format!("EndpointSlice {ns}/{name}: no {LABEL_SERVICE_NAME} label, ignored")
}

fn add_warning(all: &mut BTreeMap<String, usize>, w: String) {
    *all.entry(w).or_default() += 1;
}

fn remove_warning(all: &mut BTreeMap<String, usize>, w: &str) {
    if let Some(n) = all.get_mut(w) {
        *n -= 1;
        if *n == 0 {
            all.remove(w);
        }
    }
}

struct Ctx<'a> {
    config: &'a ProxyConfig,
    node_ips: &'a [IpAddr],
    zone: &'a str,
}

fn primary_node_ips(node: &NodeInfo) -> Vec<IpAddr> {
    let mut out = Vec::new();
    for fam in [IpFamily::V4, IpFamily::V6] {
        let pick = |ty: &str| {
            node.addresses
                .iter()
                .filter(|a| &*a.type_ == ty)
                .filter_map(|a| a.address.trim().parse::<IpAddr>().ok())
                .find(|ip| IpFamily::of(ip) == fam)
        };
        if let Some(ip) = pick("InternalIP").or_else(|| pick("ExternalIP")) {
            out.push(ip);
        }
    }
    out
}

fn nodeport_addresses(cfg: &ProxyConfig, node_ips: &[IpAddr], fam: IpFamily) -> NodePortAddresses {
    let localhost_ok = cfg.localhost_nodeports && fam == IpFamily::V4;
    let usable = |ip: &&IpAddr| IpFamily::of(ip) == fam && (localhost_ok || !ip.is_loopback());
    if cfg.nodeport_addresses.is_empty() && cfg.nodeport_default == NodePortDefault::AllLocal {
        return NodePortAddresses::AllLocal;
    }
    if cfg.nodeport_addresses.is_empty() {
        let set: BTreeSet<IpAddr> = node_ips.iter().filter(usable).copied().collect();
        return if set.is_empty() {
            NodePortAddresses::None
        } else {
            NodePortAddresses::List(set)
        };
    }
    let cidrs: Vec<&IpNet> = cfg
        .nodeport_addresses
        .iter()
        .filter(|n| IpFamily::of_net(n) == fam)
        .collect();
    // kube-proxy: a family without any CIDR in the list matches everything of that family.
    if cidrs.is_empty() || cidrs.iter().any(|n| n.prefix_len() == 0) {
        return NodePortAddresses::AllLocal;
    }
    let set: BTreeSet<IpAddr> = cfg
        .local_addresses
        .iter()
        .chain(node_ips)
        .filter(usable)
        .filter(|ip| cidrs.iter().any(|n| n.contains(*ip)))
        .copied()
        .collect();
    if set.is_empty() {
        NodePortAddresses::None
    } else {
        NodePortAddresses::List(set)
    }
}

/// Endpoints merged across all EndpointSlices of a service, per (port name, protocol,
/// family), deduplicated by (ip, port) with a local copy winning — as kube-proxy's
/// EndpointSliceCache does.
/// (port name, protocol, family) within one service (borrowed from its slices).
type PortId<'a> = (&'a str, Protocol, IpFamily);

struct EndpointIndex<'a> {
    by_port: BTreeMap<PortId<'a>, BTreeMap<(IpAddr, u16), EpInfo>>,
}

#[derive(Clone)]
struct EpInfo {
    ep: Endpoint,
    zone_hints: Box<[Arc<str>]>,
    node_hints: Box<[Arc<str>]>,
}

fn hinted(hints: &[Arc<str>], name: &str) -> bool {
    hints.iter().any(|h| &**h == name)
}

impl<'a> EndpointIndex<'a> {
    /// Indexes the `slices` (name, slice) of one service in namespace `ns`.
    fn build(
        ns: &str,
        slices: impl IntoIterator<Item = (&'a str, &'a EndpointSliceInfo)>,
        node_name: &str,
        warnings: &mut BTreeSet<String>,
    ) -> Self {
        let mut by_port: BTreeMap<_, BTreeMap<(IpAddr, u16), EpInfo>> = BTreeMap::new();
        for (slice_name, slice) in slices {
            if slice.service_name.is_none() {
                continue;
            }
            let family = match &*slice.address_type {
                "IPv4" => IpFamily::V4,
                "IPv6" => IpFamily::V6,
                _ => continue, // FQDN slices are not proxied
            };
            for port in slice.ports.iter() {
                let Some(num) = port.port.filter(|p| (1..=65535).contains(p)) else {
                    warnings.insert(format!(
                        "EndpointSlice {ns}/{slice_name}: port {:?} without a valid number, ignored",
                        port.name.as_deref().unwrap_or("")
                    ));
                    continue;
                };
                let Some(proto) = Protocol::parse(port.protocol.as_deref()) else {
                    warnings.insert(format!(
                        "EndpointSlice {ns}/{slice_name}: unknown protocol {:?}",
                        port.protocol.as_deref()
                    ));
                    continue;
                };
                let key = (port.name.as_deref().unwrap_or_default(), proto, family);
                let set = by_port.entry(key).or_default();
                for e in slice.endpoints.iter() {
                    let Some(first) = e.addresses.first() else {
                        continue;
                    };
                    let Some(ip) = first.ip() else {
                        warnings.insert(format!(
                            "EndpointSlice {ns}/{slice_name}: invalid address {:?}",
                            first.text()
                        ));
                        continue;
                    };
                    if IpFamily::of(&ip) != family {
                        warnings.insert(format!(
                            "EndpointSlice {ns}/{slice_name}: address {ip} does not match addressType {}",
                            slice.address_type
                        ));
                        continue;
                    }
                    let ready = e.ready.unwrap_or(true);
                    let is_local =
                        !node_name.is_empty() && e.node_name().map(|n| &**n) == Some(node_name);
                    let info = EpInfo {
                        ep: Endpoint {
                            ip,
                            port: num as u16,
                            is_local,
                            ready,
                            serving: e.serving.unwrap_or(true),
                            terminating: e.terminating.unwrap_or(false),
                        },
                        zone_hints: e.zone_hints().into(),
                        node_hints: e.node_hints().into(),
                    };
                    let k = (ip, num as u16);
                    if !set.contains_key(&k) || is_local {
                        set.insert(k, info);
                    }
                }
            }
        }
        EndpointIndex { by_port }
    }

    fn get(&self, key: &ServicePortKey) -> Vec<EpInfo> {
        let k = (&*key.port_name, key.protocol, key.family);
        self.by_port
            .get(&k)
            .map(|m| m.values().cloned().collect())
            .unwrap_or_default()
    }
}

fn parse_ips(
    list: &[IpText],
    what: &str,
    svc: &str,
    warnings: &mut BTreeSet<String>,
) -> Vec<IpAddr> {
    let mut out = Vec::new();
    for s in list {
        match s {
            IpText::Ip(ip) if !out.contains(ip) => out.push(*ip),
            IpText::Ip(_) => {}
            IpText::Text(t) => {
                warnings.insert(format!("Service {svc}: invalid {what} {t:?}, ignored"));
            }
        }
    }
    out
}

fn plan_service(
    ctx: &Ctx<'_>,
    ns: &Arc<str>,
    name: &Arc<str>,
    svc: &ServiceInfo,
    index: &EndpointIndex,
    out: &mut BTreeMap<ServicePortKey, ServicePortPlan>,
    warnings: &mut BTreeSet<String>,
) {
    let Some(spec) = svc.spec.as_ref() else {
        return;
    };
    let Some(facts) = ServiceFacts::read(spec, format!("{ns}/{name}"), warnings) else {
        return;
    };
    let families: BTreeSet<IpFamily> = facts.cluster_ips.iter().map(IpFamily::of).collect();
    for (pi, sp) in spec.ports.iter().enumerate() {
        let Some(protocol) = port_protocol(&facts.id, pi, sp, warnings) else {
            continue;
        };
        let node_port = sp
            .node_port
            .filter(|p| (1..=65535).contains(p))
            .map(|p| p as u16);
        for &family in &families {
            let key = ServicePortKey {
                namespace: ns.clone(),
                name: name.clone(),
                port_name: sp.name.clone().unwrap_or_else(|| intern("")),
                protocol,
                family,
            };
            let plan = plan_port(
                ctx,
                &facts,
                &key,
                sp.port as u16,
                node_port,
                index,
                warnings,
            );
            out.insert(key, plan);
        }
    }
}

/// What a Service says for all its ports and families: its addresses (invalid ones warned
/// about and left out), source ranges, affinity and traffic policies.
struct ServiceFacts {
    /// `namespace/name`, for warnings.
    id: String,
    cluster_ips: Vec<IpAddr>,
    external_ips: Vec<IpAddr>,
    lb_ips: Vec<IpAddr>,
    source_ranges: Vec<IpNet>,
    affinity_timeout: Option<u32>,
    itp_local: bool,
    etp_local_requested: bool,
    health_check_node_port: Option<i32>,
}

impl ServiceFacts {
    /// `None`: kube-proxy's ShouldSkipService (ExternalName and headless services get no
    /// rules).
    fn read(
        spec: &ServiceSpecInfo,
        id: String,
        warnings: &mut BTreeSet<String>,
    ) -> Option<ServiceFacts> {
        if spec.type_.as_deref() == Some("ExternalName") {
            return None;
        }
        if spec.cluster_ips.is_empty() || spec.cluster_ips.iter().any(|s| s.is("None") || s.is(""))
        {
            return None;
        }
        let cluster_ips = parse_ips(&spec.cluster_ips, "clusterIP", &id, warnings);
        let external_ips = parse_ips(spec.external_ips(), "externalIP", &id, warnings);
        let lb_ips = parse_ips(
            spec.load_balancer_ips(),
            "load-balancer ingress IP",
            &id,
            warnings,
        );
        let mut source_ranges = Vec::new();
        for s in spec.load_balancer_source_ranges() {
            match s.trim().parse::<IpNet>() {
                Ok(n) => source_ranges.push(n.trunc()),
                Err(_) => {
                    warnings.insert(format!(
                        "Service {id}: invalid loadBalancerSourceRange {s:?}, ignored"
                    ));
                }
            }
        }
        let affinity_timeout = spec.client_ip_affinity.then(|| {
            spec.affinity_timeout_seconds()
                .filter(|t| *t > 0)
                .map(|t| t as u32)
                .unwrap_or(DEFAULT_AFFINITY_TIMEOUT_SECONDS)
        });
        Some(ServiceFacts {
            id,
            cluster_ips,
            external_ips,
            lb_ips,
            source_ranges,
            affinity_timeout,
            itp_local: spec.internal_policy_local,
            etp_local_requested: spec.external_policy_local,
            health_check_node_port: spec.health_check_node_port(),
        })
    }
}

/// A service port's protocol, or `None` (warned) for an unknown protocol or a port out of range.
fn port_protocol(
    id: &str,
    pi: usize,
    sp: &ServicePortInfo,
    warnings: &mut BTreeSet<String>,
) -> Option<Protocol> {
    let Some(protocol) = Protocol::parse(sp.protocol.as_deref()) else {
        warnings.insert(format!(
            "Service {id}: port #{pi}: unknown protocol {:?}, ignored",
            sp.protocol.as_deref()
        ));
        return None;
    };
    if !(1..=65535).contains(&sp.port) {
        warnings.insert(format!(
            "Service {id}: port #{pi}: invalid port {}, ignored",
            sp.port
        ));
        return None;
    }
    Some(protocol)
}

/// One service port in one family: its frontends, endpoints and policies.
fn plan_port(
    ctx: &Ctx<'_>,
    facts: &ServiceFacts,
    key: &ServicePortKey,
    port: u16,
    node_port: Option<u16>,
    index: &EndpointIndex,
    warnings: &mut BTreeSet<String>,
) -> ServicePortPlan {
    let family = key.family;
    let fam = |ips: &[IpAddr]| -> Vec<IpAddr> {
        ips.iter()
            .filter(|ip| IpFamily::of(ip) == family)
            .copied()
            .collect()
    };
    let addrs = PortAddrs {
        cluster: fam(&facts.cluster_ips),
        external: fam(&facts.external_ips),
        lbs: fam(&facts.lb_ips),
    };
    let node_port = served_node_port(ctx, &facts.id, family, node_port, warnings);
    let externally_accessible =
        node_port.is_some() || !addrs.external.is_empty() || !addrs.lbs.is_empty();
    let etp_local = externally_accessible && facts.etp_local_requested;

    let eps = index.get(key);
    let mut cat = categorize(
        &eps,
        facts.itp_local,
        etp_local,
        &ctx.config.node_name,
        ctx.zone,
    );
    let serving = Serving {
        cat: &cat,
        itp_local: facts.itp_local,
        etp_local,
        cluster_masq: cluster_masquerade(ctx.config, family),
    };
    let lb_ranges = lb_source_ranges(ctx, &facts.source_ranges, &addrs.lbs, family);
    let mut frontends = serving.frontends(&addrs, port, lb_ranges, node_port);
    // The plan lives until the service changes: no growth slack (a filtered
    // collect of ten endpoints has room for sixteen; ~3 MiB at 10,000 services).
    frontends.shrink_to_fit();
    cat.cluster.shrink_to_fit();
    cat.local.shrink_to_fit();

    let health_check_node_port = facts
        .health_check_node_port
        .filter(|p| etp_local && (1..=65535).contains(p))
        .map(|p| p as u16);
    ServicePortPlan {
        port,
        frontends,
        cluster_endpoints: cat.cluster,
        local_endpoints: cat.local,
        affinity_timeout: facts.affinity_timeout,
        internal_policy_local: facts.itp_local,
        external_policy_local: etp_local,
        health_check_node_port,
        topology: cat.topology,
        has_any_endpoints: cat.has_any,
    }
}

/// A service port's addresses of one family.
struct PortAddrs {
    cluster: Vec<IpAddr>,
    external: Vec<IpAddr>,
    lbs: Vec<IpAddr>,
}

/// The NodePort when this node serves it in `family`: warned about and `None` when no
/// address of the node can carry it.
fn served_node_port(
    ctx: &Ctx<'_>,
    id: &str,
    family: IpFamily,
    node_port: Option<u16>,
    warnings: &mut BTreeSet<String>,
) -> Option<u16> {
    let np_addrs = nodeport_addresses(ctx.config, ctx.node_ips, family);
    if np_addrs != NodePortAddresses::None {
        return node_port;
    }
    if let Some(p) = node_port {
        let family = match family {
            IpFamily::V4 => "IPv4",
            IpFamily::V6 => "IPv6",
        };
        let why = if ctx.config.nodeport_addresses.is_empty() {
            format!(
                "this node's own {family} address is unknown (no Node object {:?} \
                 with an InternalIP or ExternalIP); add the Node or set \
                 --nodeport-addresses",
                ctx.config.node_name
            )
        } else {
            format!("no local {family} address matches --nodeport-addresses")
        };
        warnings.insert(format!("Service {id}: NodePort {p} not served: {why}"));
    }
    None
}

/// Traffic to a ClusterIP is masqueraded always (`masqueradeAll`), from off the cluster CIDR
/// when the family has one, or never.
fn cluster_masquerade(config: &ProxyConfig, family: IpFamily) -> Masquerade {
    if config.masquerade_all {
        Masquerade::Always
    } else if config
        .cluster_cidrs
        .iter()
        .any(|n| IpFamily::of_net(n) == family)
    {
        Masquerade::OffCluster
    } else {
        Masquerade::Never
    }
}

/// A LoadBalancer's allowed sources in `family` (`None`: any).
fn lb_source_ranges(
    ctx: &Ctx<'_>,
    source_ranges: &[IpNet],
    lbs: &[IpAddr],
    family: IpFamily,
) -> Option<Vec<IpNet>> {
    if source_ranges.is_empty() {
        return None;
    }
    let mut r: Vec<IpNet> = source_ranges
        .iter()
        .filter(|n| IpFamily::of_net(n) == family)
        .copied()
        .collect();
    // A request from this node to a VIP bound locally loops back with the VIP as
    // source: allow it when the node itself is allowed (kube-proxy's allowFromNode).
    let node_allowed = ctx
        .node_ips
        .iter()
        .any(|ip| r.iter().any(|n| n.contains(ip)));
    if node_allowed {
        r.extend(lbs.iter().map(|ip| IpNet::from(*ip)));
    }
    r.sort();
    r.dedup();
    Some(r)
}

/// How a service port's frontends are served: which endpoint set, what verdict, whether
/// masqueraded.
struct Serving<'a> {
    cat: &'a Categorized,
    itp_local: bool,
    etp_local: bool,
    cluster_masq: Masquerade,
}

impl Serving<'_> {
    fn verdict(&self, set: EndpointSet) -> Verdict {
        let eps = match set {
            EndpointSet::Cluster => &self.cat.cluster,
            EndpointSet::Local => &self.cat.local,
        };
        if !self.cat.has_any {
            Verdict::Reject
        } else if eps.is_empty() {
            Verdict::Drop
        } else {
            Verdict::Forward
        }
    }

    fn set(local: bool) -> EndpointSet {
        if local {
            EndpointSet::Local
        } else {
            EndpointSet::Cluster
        }
    }

    /// Every frontend, sorted: ClusterIPs, externalIPs, load balancers, the NodePort.
    fn frontends(
        &self,
        addrs: &PortAddrs,
        port: u16,
        lb_ranges: Option<Vec<IpNet>>,
        node_port: Option<u16>,
    ) -> Vec<Frontend> {
        let internal = Self::set(self.itp_local);
        let mut frontends: Vec<Frontend> = (addrs.cluster.iter())
            .map(|ip| Frontend {
                kind: FrontendKind::ClusterIp,
                addr: Some(*ip),
                port,
                endpoints: internal,
                verdict: self.verdict(internal),
                masquerade: self.cluster_masq,
                short_circuit: false,
                source_ranges: None,
            })
            .collect();
        for ip in &addrs.external {
            frontends.push(self.external(FrontendKind::ExternalIp, Some(*ip), port, None));
        }
        for ip in &addrs.lbs {
            let ranges = lb_ranges.clone();
            frontends.push(self.external(FrontendKind::LoadBalancer, Some(*ip), port, ranges));
        }
        if let Some(np) = node_port {
            frontends.push(self.external(FrontendKind::NodePort, None, np, None));
        }
        frontends.sort();
        frontends
    }

    /// A frontend reached from outside: externalTrafficPolicy applies.
    fn external(
        &self,
        kind: FrontendKind,
        addr: Option<IpAddr>,
        port: u16,
        ranges: Option<Vec<IpNet>>,
    ) -> Frontend {
        let set = Self::set(self.etp_local);
        Frontend {
            kind,
            addr,
            port,
            endpoints: set,
            verdict: self.verdict(set),
            masquerade: if self.etp_local {
                Masquerade::Never
            } else {
                Masquerade::Always
            },
            // Only meaningful when the cluster endpoints are computed (ITP is not Local too).
            short_circuit: self.etp_local && !self.itp_local,
            source_ranges: ranges,
        }
    }
}

struct Categorized {
    cluster: Vec<Endpoint>,
    local: Vec<Endpoint>,
    has_any: bool,
    topology: TopologyMode,
}

/// kube-proxy's CategorizeEndpoints (pkg/proxy/topology.go).
fn categorize(
    eps: &[EpInfo],
    itp_local: bool,
    etp_local: bool,
    node: &str,
    zone: &str,
) -> Categorized {
    let uses_cluster = !itp_local || !etp_local;
    let uses_local = itp_local || etp_local;
    let mut c = Categorized {
        cluster: vec![],
        local: vec![],
        has_any: false,
        topology: TopologyMode::None,
    };
    if eps.is_empty() {
        return c;
    }
    let serving_terminating = |e: &EpInfo| e.ep.serving && e.ep.terminating;
    if uses_cluster {
        c.topology = topology_from_hints(eps, node, zone);
        let available = |e: &EpInfo| match c.topology {
            TopologyMode::None => true,
            TopologyMode::PreferSameNode => hinted(&e.node_hints, node),
            TopologyMode::PreferSameZone => hinted(&e.zone_hints, zone),
        };
        c.cluster = eps
            .iter()
            .filter(|e| e.ep.ready && available(e))
            .map(|e| e.ep.clone())
            .collect();
        if c.cluster.is_empty() {
            c.cluster = eps
                .iter()
                .filter(|e| serving_terminating(e))
                .map(|e| e.ep.clone())
                .collect();
        }
        c.has_any = !c.cluster.is_empty();
    }
    if !uses_local {
        return c;
    }
    let mut local_ready = false;
    let mut local_st = false;
    for e in eps {
        if e.ep.ready {
            c.has_any = true;
            local_ready |= e.ep.is_local;
        } else if serving_terminating(e) {
            c.has_any = true;
            local_st |= e.ep.is_local;
        }
    }
    if local_ready {
        c.local = eps
            .iter()
            .filter(|e| e.ep.is_local && e.ep.ready)
            .map(|e| e.ep.clone())
            .collect();
    } else if local_st {
        c.local = eps
            .iter()
            .filter(|e| e.ep.is_local && serving_terminating(e))
            .map(|e| e.ep.clone())
            .collect();
    }
    c
}

/// kube-proxy's topologyModeFromHints: node hints if every ready endpoint has one and one
/// is for this node; else zone hints likewise; else none.
fn topology_from_hints(eps: &[EpInfo], node: &str, zone: &str) -> TopologyMode {
    let ready: Vec<&EpInfo> = eps.iter().filter(|e| e.ep.ready).collect();
    if ready.is_empty() {
        return TopologyMode::None;
    }
    if ready.iter().all(|e| !e.node_hints.is_empty())
        && ready.iter().any(|e| hinted(&e.node_hints, node))
    {
        return TopologyMode::PreferSameNode;
    }
    if ready.iter().all(|e| !e.zone_hints.is_empty())
        && !zone.is_empty()
        && ready.iter().any(|e| hinted(&e.zone_hints, zone))
    {
        return TopologyMode::PreferSameZone;
    }
    TopologyMode::None
}
