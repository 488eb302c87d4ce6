//! Snapshot + config → [`Plan`], following kube-proxy's semantics (servicechangetracker,
//! endpointslicecache, topology.go, the nftables proxier).

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::net::IpAddr;
use std::sync::Arc;

use ipnet::IpNet;
use k8s_openapi::api::core::v1::{Node, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;

use crate::objects::Snapshot;
use crate::plan::*;

/// kube-proxy's default ClientIP affinity timeout (3 hours).
pub const DEFAULT_AFFINITY_TIMEOUT_SECONDS: u32 = 10800;

const LABEL_SERVICE_NAME: &str = "kubernetes.io/service-name";
const LABEL_ZONE: &str = "topology.kubernetes.io/zone";

/// Per-node proxy configuration (the planner's other input).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ProxyConfig {
    /// This node's name (endpoints with this `nodeName` are local; PreferSameNode hints).
    pub node_name: String,
    /// This node's primary addresses. Empty: taken from the Node object named `node_name`
    /// (first InternalIP per family, else first ExternalIP).
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

/// An EndpointSlice with its snapshot key.
type SliceRef<'a> = (&'a (String, String), &'a Arc<EndpointSlice>);

/// Slices by the (namespace, name) of the service they belong to; unlabelled ones are
/// reported and skipped.
fn group_slices<'a>(
    snapshot: &'a Snapshot,
    warnings: &mut BTreeSet<String>,
) -> HashMap<(&'a str, &'a str), Vec<SliceRef<'a>>> {
    let mut groups: HashMap<(&str, &str), Vec<SliceRef<'a>>> = HashMap::new();
    for (key, slice) in &snapshot.endpoint_slices {
        match slice_service(slice) {
            Some(svc) => groups.entry((&key.0, svc)).or_default().push((key, slice)),
            None => {
                warnings.insert(format!(
                    "EndpointSlice {}/{}: no {LABEL_SERVICE_NAME} label, ignored",
                    key.0, key.1
                ));
            }
        }
    }
    groups
}

/// The plan of one service, remembered with the exact objects it came from.
struct CachedService {
    service: Arc<Service>,
    slices: Vec<Arc<EndpointSlice>>,
    ports: Vec<(ServicePortKey, Arc<ServicePortPlan>)>,
    warnings: Vec<String>,
}

impl CachedService {
    fn made_from(&self, service: &Arc<Service>, slices: &[SliceRef<'_>]) -> bool {
        Arc::ptr_eq(&self.service, service)
            && self.slices.len() == slices.len()
            && self
                .slices
                .iter()
                .zip(slices)
                .all(|(a, (_, b))| Arc::ptr_eq(a, b))
    }
}

/// The planner with a memory: a service whose Service and EndpointSlice objects are the same
/// `Arc`s as last time (the store keeps unchanged objects' `Arc`s) keeps its previous
/// [`ServicePortPlan`]s, by pointer. So a change costs the planning of the services it
/// touches, not of the cluster, and [`Plan::diff`] recognises unchanged ports by pointer.
/// The result always equals [`plan`] of the same input.
#[derive(Default)]
pub struct Planner {
    /// What node-wide input the cache was computed with.
    context: Option<(ProxyConfig, Option<Arc<Node>>)>,
    cache: HashMap<(String, String), CachedService>,
}

impl Planner {
    pub fn plan(&mut self, snapshot: &Snapshot, config: &ProxyConfig) -> Plan {
        let node = snapshot.nodes.get(&config.node_name).cloned();
        let same_context = self.context.as_ref().is_some_and(|(c, n)| {
            c == config
                && match (n, &node) {
                    (Some(a), Some(b)) => Arc::ptr_eq(a, b),
                    (None, None) => true,
                    _ => false,
                }
        });
        if !same_context {
            self.cache.clear();
            self.context = Some((config.clone(), node.clone()));
        }
        let this_node = node.as_deref();
        let node_ips = if config.node_ips.is_empty() {
            this_node.map(primary_node_ips).unwrap_or_default()
        } else {
            config.node_ips.clone()
        };
        let zone = config.zone.clone().or_else(|| {
            this_node.and_then(|n| n.metadata.labels.as_ref()?.get(LABEL_ZONE).cloned())
        });
        let ctx = Ctx {
            config,
            node_ips: &node_ips,
            zone: zone.as_deref().unwrap_or(""),
        };

        let mut warnings = BTreeSet::new();
        let mut groups = group_slices(snapshot, &mut warnings);
        let mut services = BTreeMap::new();
        let mut cache = HashMap::with_capacity(snapshot.services.len());
        for (key, svc) in &snapshot.services {
            let slices = groups
                .remove(&(key.0.as_str(), key.1.as_str()))
                .unwrap_or_default();
            let entry = match self.cache.remove(key) {
                Some(c) if c.made_from(svc, &slices) => c,
                _ => {
                    let mut own_warnings = BTreeSet::new();
                    let index = EndpointIndex::build(
                        slices.iter().copied(),
                        &config.node_name,
                        &mut own_warnings,
                    );
                    let mut ports = BTreeMap::new();
                    plan_service(
                        &ctx,
                        &key.0,
                        &key.1,
                        svc,
                        &index,
                        &mut ports,
                        &mut own_warnings,
                    );
                    CachedService {
                        service: svc.clone(),
                        slices: slices.iter().map(|(_, s)| Arc::clone(s)).collect(),
                        ports: ports.into_iter().map(|(k, v)| (k, Arc::new(v))).collect(),
                        warnings: own_warnings.into_iter().collect(),
                    }
                }
            };
            services.extend(entry.ports.iter().cloned());
            warnings.extend(entry.warnings.iter().cloned());
            cache.insert(key.clone(), entry);
        }
        // Slices of services that do not exist: no rules, but their problems are reported.
        for slices in groups.into_values() {
            EndpointIndex::build(slices, &config.node_name, &mut warnings);
        }
        self.cache = cache;

        Plan {
            services,
            node_port_addresses_v4: nodeport_addresses(config, &node_ips, IpFamily::V4),
            node_port_addresses_v6: nodeport_addresses(config, &node_ips, IpFamily::V6),
            cluster_cidrs: config.cluster_cidrs.clone(),
            masquerade_all: config.masquerade_all,
            warnings: warnings.into_iter().collect(),
        }
    }
}

struct Ctx<'a> {
    config: &'a ProxyConfig,
    node_ips: &'a [IpAddr],
    zone: &'a str,
}

fn primary_node_ips(node: &Node) -> Vec<IpAddr> {
    let addrs = node.status.as_ref().and_then(|s| s.addresses.as_ref());
    let Some(addrs) = addrs else { return vec![] };
    let mut out = Vec::new();
    for fam in [IpFamily::V4, IpFamily::V6] {
        let pick = |ty: &str| {
            addrs
                .iter()
                .filter(|a| a.type_ == ty)
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
type PortId = (String, String, String, Protocol, IpFamily);

struct EndpointIndex {
    by_port: BTreeMap<PortId, BTreeMap<(IpAddr, u16), EpInfo>>,
}

#[derive(Clone)]
struct EpInfo {
    ep: Endpoint,
    zone_hints: BTreeSet<String>,
    node_hints: BTreeSet<String>,
}

impl EndpointIndex {
    /// Indexes `slices` (all labelled with their service; see [`group_slices`]).
    fn build<'a>(
        slices: impl IntoIterator<Item = SliceRef<'a>>,
        node_name: &str,
        warnings: &mut BTreeSet<String>,
    ) -> Self {
        let mut by_port: BTreeMap<_, BTreeMap<(IpAddr, u16), EpInfo>> = BTreeMap::new();
        for ((ns, slice_name), slice) in slices {
            let Some(svc) = slice_service(slice) else {
                continue;
            };
            let family = match slice.address_type.as_str() {
                "IPv4" => IpFamily::V4,
                "IPv6" => IpFamily::V6,
                _ => continue, // FQDN slices are not proxied
            };
            for port in slice.ports.iter().flatten() {
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
                        port.protocol
                    ));
                    continue;
                };
                let key = (
                    ns.clone(),
                    svc.to_string(),
                    port.name.clone().unwrap_or_default(),
                    proto,
                    family,
                );
                let set = by_port.entry(key).or_default();
                for e in slice.endpoints.iter().flatten() {
                    let Some(first) = e.addresses.first() else {
                        continue;
                    };
                    let Ok(ip) = first.trim().parse::<IpAddr>() else {
                        warnings.insert(format!(
                            "EndpointSlice {ns}/{slice_name}: invalid address {first:?}"
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
                    let cond = e.conditions.clone().unwrap_or_default();
                    let ready = cond.ready.unwrap_or(true);
                    let is_local =
                        !node_name.is_empty() && e.node_name.as_deref() == Some(node_name);
                    let hints = e.hints.as_ref();
                    let info = EpInfo {
                        ep: Endpoint {
                            ip,
                            port: num as u16,
                            node_name: e.node_name.clone(),
                            zone: e.zone.clone(),
                            is_local,
                            ready,
                            serving: cond.serving.unwrap_or(true),
                            terminating: cond.terminating.unwrap_or(false),
                        },
                        zone_hints: hints
                            .and_then(|h| h.for_zones.as_ref())
                            .map(|z| z.iter().map(|z| z.name.clone()).collect())
                            .unwrap_or_default(),
                        node_hints: hints
                            .and_then(|h| h.for_nodes.as_ref())
                            .map(|z| z.iter().map(|z| z.name.clone()).collect())
                            .unwrap_or_default(),
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
        let k = (
            key.namespace.clone(),
            key.name.clone(),
            key.port_name.clone(),
            key.protocol,
            key.family,
        );
        self.by_port
            .get(&k)
            .map(|m| m.values().cloned().collect())
            .unwrap_or_default()
    }
}

fn slice_service(slice: &EndpointSlice) -> Option<&str> {
    slice
        .metadata
        .labels
        .as_ref()?
        .get(LABEL_SERVICE_NAME)
        .map(String::as_str)
        .filter(|s| !s.is_empty())
}

fn parse_ips(
    list: impl IntoIterator<Item = String>,
    what: &str,
    svc: &str,
    warnings: &mut BTreeSet<String>,
) -> Vec<IpAddr> {
    let mut out = Vec::new();
    for s in list {
        match s.trim().parse::<IpAddr>() {
            Ok(ip) if !out.contains(&ip) => out.push(ip),
            Ok(_) => {}
            Err(_) => {
                warnings.insert(format!("Service {svc}: invalid {what} {s:?}, ignored"));
            }
        }
    }
    out
}

fn plan_service(
    ctx: &Ctx<'_>,
    ns: &str,
    name: &str,
    svc: &Service,
    index: &EndpointIndex,
    out: &mut BTreeMap<ServicePortKey, ServicePortPlan>,
    warnings: &mut BTreeSet<String>,
) {
    let Some(spec) = svc.spec.as_ref() else {
        return;
    };
    let id = format!("{ns}/{name}");
    // kube-proxy's ShouldSkipService: ExternalName and headless services get no rules.
    if spec.type_.as_deref() == Some("ExternalName") {
        return;
    }
    let cluster_ip_strs: Vec<String> = match &spec.cluster_ips {
        Some(v) if !v.is_empty() => v.clone(),
        _ => spec.cluster_ip.clone().into_iter().collect(),
    };
    if cluster_ip_strs.is_empty() || cluster_ip_strs.iter().any(|s| s == "None" || s.is_empty()) {
        return;
    }
    let cluster_ips = parse_ips(cluster_ip_strs, "clusterIP", &id, warnings);
    let external_ips = parse_ips(
        spec.external_ips.clone().unwrap_or_default(),
        "externalIP",
        &id,
        warnings,
    );
    let lb_ips = {
        let ingress = svc
            .status
            .as_ref()
            .and_then(|s| s.load_balancer.as_ref())
            .and_then(|lb| lb.ingress.as_ref());
        let ips = ingress
            .into_iter()
            .flatten()
            // ipMode Proxy: the LB proxies itself; short-circuiting would bypass it.
            .filter(|i| i.ip_mode.as_deref() != Some("Proxy"))
            .filter_map(|i| i.ip.clone())
            .filter(|s| !s.is_empty());
        parse_ips(ips, "load-balancer ingress IP", &id, warnings)
    };
    let mut source_ranges = Vec::new();
    for s in spec.load_balancer_source_ranges.iter().flatten() {
        match s.trim().parse::<IpNet>() {
            Ok(n) => source_ranges.push(n.trunc()),
            Err(_) => {
                warnings.insert(format!(
                    "Service {id}: invalid loadBalancerSourceRange {s:?}, ignored"
                ));
            }
        }
    }
    let affinity_timeout = (spec.session_affinity.as_deref() == Some("ClientIP")).then(|| {
        spec.session_affinity_config
            .as_ref()
            .and_then(|c| c.client_ip.as_ref())
            .and_then(|c| c.timeout_seconds)
            .filter(|t| *t > 0)
            .map(|t| t as u32)
            .unwrap_or(DEFAULT_AFFINITY_TIMEOUT_SECONDS)
    });
    let itp_local = spec.internal_traffic_policy.as_deref() == Some("Local");
    let etp_local_requested = spec.external_traffic_policy.as_deref() == Some("Local");

    let families: BTreeSet<IpFamily> = cluster_ips.iter().map(IpFamily::of).collect();
    for (pi, sp) in spec.ports.iter().flatten().enumerate() {
        let Some(protocol) = Protocol::parse(sp.protocol.as_deref()) else {
            warnings.insert(format!(
                "Service {id}: port #{pi}: unknown protocol {:?}, ignored",
                sp.protocol
            ));
            continue;
        };
        if !(1..=65535).contains(&sp.port) {
            warnings.insert(format!(
                "Service {id}: port #{pi}: invalid port {}, ignored",
                sp.port
            ));
            continue;
        }
        let node_port = sp
            .node_port
            .filter(|p| (1..=65535).contains(p))
            .map(|p| p as u16);
        for &family in &families {
            let key = ServicePortKey {
                namespace: ns.to_string(),
                name: name.to_string(),
                port_name: sp.name.clone().unwrap_or_default(),
                protocol,
                family,
            };
            let fam = |ips: &[IpAddr]| -> Vec<IpAddr> {
                ips.iter()
                    .filter(|ip| IpFamily::of(ip) == family)
                    .copied()
                    .collect()
            };
            let cips = fam(&cluster_ips);
            let eips = fam(&external_ips);
            let lbs = fam(&lb_ips);
            let np_addrs = nodeport_addresses(ctx.config, ctx.node_ips, family);
            if let (Some(p), NodePortAddresses::None) = (node_port, &np_addrs) {
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
            let node_port = node_port.filter(|_| np_addrs != NodePortAddresses::None);
            let externally_accessible = node_port.is_some() || !eips.is_empty() || !lbs.is_empty();
            let etp_local = externally_accessible && etp_local_requested;

            let eps = index.get(&key);
            let cat = categorize(&eps, itp_local, etp_local, &ctx.config.node_name, ctx.zone);

            let verdict = |set: EndpointSet| {
                let eps = match set {
                    EndpointSet::Cluster => &cat.cluster,
                    EndpointSet::Local => &cat.local,
                };
                if !cat.has_any {
                    Verdict::Reject
                } else if eps.is_empty() {
                    Verdict::Drop
                } else {
                    Verdict::Forward
                }
            };
            let internal_set = if itp_local {
                EndpointSet::Local
            } else {
                EndpointSet::Cluster
            };
            let external_set = if etp_local {
                EndpointSet::Local
            } else {
                EndpointSet::Cluster
            };
            let cluster_masq = if ctx.config.masquerade_all {
                Masquerade::Always
            } else if ctx
                .config
                .cluster_cidrs
                .iter()
                .any(|n| IpFamily::of_net(n) == family)
            {
                Masquerade::OffCluster
            } else {
                Masquerade::Never
            };
            let ext = |kind: FrontendKind,
                       addr: Option<IpAddr>,
                       port: u16,
                       ranges: Option<Vec<IpNet>>| Frontend {
                kind,
                addr,
                port,
                endpoints: external_set,
                verdict: verdict(external_set),
                masquerade: if etp_local {
                    Masquerade::Never
                } else {
                    Masquerade::Always
                },
                // Only meaningful when the cluster endpoints are computed (ITP is not Local too).
                short_circuit: etp_local && !itp_local,
                source_ranges: ranges,
            };

            let mut frontends = Vec::new();
            for ip in &cips {
                frontends.push(Frontend {
                    kind: FrontendKind::ClusterIp,
                    addr: Some(*ip),
                    port: sp.port as u16,
                    endpoints: internal_set,
                    verdict: verdict(internal_set),
                    masquerade: cluster_masq,
                    short_circuit: false,
                    source_ranges: None,
                });
            }
            for ip in &eips {
                frontends.push(ext(
                    FrontendKind::ExternalIp,
                    Some(*ip),
                    sp.port as u16,
                    None,
                ));
            }
            let lb_ranges = if source_ranges.is_empty() {
                None
            } else {
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
            };
            for ip in &lbs {
                frontends.push(ext(
                    FrontendKind::LoadBalancer,
                    Some(*ip),
                    sp.port as u16,
                    lb_ranges.clone(),
                ));
            }
            if let Some(np) = node_port {
                frontends.push(ext(FrontendKind::NodePort, None, np, None));
            }
            frontends.sort();

            let health_check_node_port = spec
                .health_check_node_port
                .filter(|p| etp_local && (1..=65535).contains(p))
                .map(|p| p as u16);
            out.insert(
                key,
                ServicePortPlan {
                    port: sp.port as u16,
                    frontends,
                    cluster_endpoints: cat.cluster,
                    local_endpoints: cat.local,
                    affinity_timeout,
                    internal_policy_local: itp_local,
                    external_policy_local: etp_local,
                    health_check_node_port,
                    topology: cat.topology,
                    has_any_endpoints: cat.has_any,
                },
            );
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
            TopologyMode::PreferSameNode => e.node_hints.contains(node),
            TopologyMode::PreferSameZone => e.zone_hints.contains(zone),
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
        && ready.iter().any(|e| e.node_hints.contains(node))
    {
        return TopologyMode::PreferSameNode;
    }
    if ready.iter().all(|e| !e.zone_hints.is_empty())
        && !zone.is_empty()
        && ready.iter().any(|e| e.zone_hints.contains(zone))
    {
        return TopologyMode::PreferSameZone;
    }
    TopologyMode::None
}
