//! Pure: a [`Plan`] (one family's view) → the IPVS state, ipsets, iptables rules and
//! `kube-ipvs0` addresses kube-proxy's ipvs mode would hold for it.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;
use std::net::IpAddr;

use weir_model::{
    EndpointSet, FrontendKind, IpFamily, Masquerade, Plan, Protocol, ServicePortKey,
    ServicePortPlan, Verdict,
};

use super::netlink::{RealServer, ServiceKey, ServiceSpec};
use crate::iptables::Table;

/// kube-proxy's `--ipvs-scheduler` values (`ip_vs_<name>` kernel modules).
pub const SCHEDULERS: &[&str] = &[
    "rr", "wrr", "lc", "wlc", "lblc", "lblcr", "sh", "dh", "sed", "nq", "mh",
];

/// The dummy link holding the service addresses.
pub const DUMMY: &str = "kube-ipvs0";

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IpvsOptions {
    pub families: Vec<IpFamily>,
    /// `--ipvs-scheduler` (default rr).
    pub scheduler: String,
    /// Masquerade mark bit (kube-proxy's 0x4000).
    pub masquerade_mark: u32,
    /// `ipvs.tcpTimeout`, `tcpFinTimeout`, `udpTimeout` in seconds (0: kernel default).
    pub tcp_timeout: u32,
    pub tcp_fin_timeout: u32,
    pub udp_timeout: u32,
    /// How long a removed TCP real server may keep draining (weight 0) before it is deleted
    /// with connections still open.
    pub graceful_termination_timeout: std::time::Duration,
    /// `ipvs.strictARP`: `arp_ignore=1` and `arp_announce=2` on every interface, so the node
    /// does not answer ARP for the addresses on `kube-ipvs0` (kube-proxy's meaning).
    pub strict_arp: bool,
    /// `ipvs.excludeCIDRs`: virtual servers on these addresses are never deleted as stale
    /// (another program's, on a node address).
    pub exclude_cidrs: Vec<ipnet::IpNet>,
}

impl Default for IpvsOptions {
    fn default() -> Self {
        IpvsOptions {
            families: vec![IpFamily::V4, IpFamily::V6],
            scheduler: "rr".into(),
            masquerade_mark: 0x4000,
            tcp_timeout: 0,
            tcp_fin_timeout: 0,
            udp_timeout: 0,
            graceful_termination_timeout: std::time::Duration::from_secs(15 * 60),
            strict_arp: false,
            exclude_cidrs: Vec::new(),
        }
    }
}

/// Checks a scheduler name (`--ipvs-scheduler`), for a clear error at startup.
pub fn check_scheduler(s: &str) -> Result<(), String> {
    if SCHEDULERS.contains(&s) {
        Ok(())
    } else {
        Err(format!(
            "unknown IPVS scheduler {s:?}: one of {}",
            SCHEDULERS.join(", ")
        ))
    }
}

/// One virtual server with its real servers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VirtualServer {
    pub spec: ServiceSpec,
    pub real_servers: BTreeSet<RealServer>,
}

/// An ipset kube-proxy's ipvs mode keeps.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IpSet {
    /// `hash:ip,port`, `bitmap:port`, …
    pub kind: &'static str,
    pub comment: &'static str,
    pub entries: BTreeSet<String>,
}

/// Everything one family needs.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Desired {
    pub services: BTreeMap<ServiceKey, VirtualServer>,
    /// Bound to `kube-ipvs0`.
    pub addresses: BTreeSet<IpAddr>,
    /// By name (`KUBE-6-…` for IPv6, as kube-proxy names them).
    pub ipsets: BTreeMap<String, IpSet>,
    /// `iptables-restore --noflush` input declaring (so replacing) every chain.
    pub iptables: String,
}

// Set names (IPv4 spelling; `set_name` makes the IPv6 one).
pub const LOOP_BACK: &str = "KUBE-LOOP-BACK";
pub const CLUSTER_IP: &str = "KUBE-CLUSTER-IP";
pub const EXTERNAL_IP: &str = "KUBE-EXTERNAL-IP";
pub const EXTERNAL_IP_LOCAL: &str = "KUBE-EXTERNAL-IP-LOCAL";
pub const LOAD_BALANCER: &str = "KUBE-LOAD-BALANCER";
pub const LOAD_BALANCER_FW: &str = "KUBE-LOAD-BALANCER-FW";
pub const LOAD_BALANCER_LOCAL: &str = "KUBE-LOAD-BALANCER-LOCAL";
pub const LOAD_BALANCER_SOURCE_IP: &str = "KUBE-LOAD-BALANCER-SOURCE-IP";
pub const LOAD_BALANCER_SOURCE_CIDR: &str = "KUBE-LOAD-BALANCER-SOURCE-CIDR";
pub const NODE_PORT_TCP: &str = "KUBE-NODE-PORT-TCP";
pub const NODE_PORT_LOCAL_TCP: &str = "KUBE-NODE-PORT-LOCAL-TCP";
pub const NODE_PORT_UDP: &str = "KUBE-NODE-PORT-UDP";
pub const NODE_PORT_LOCAL_UDP: &str = "KUBE-NODE-PORT-LOCAL-UDP";
pub const NODE_PORT_SCTP: &str = "KUBE-NODE-PORT-SCTP-HASH";
pub const NODE_PORT_LOCAL_SCTP: &str = "KUBE-NODE-PORT-LOCAL-SCTP-HASH";
pub const HEALTH_CHECK_NODE_PORT: &str = "KUBE-HEALTH-CHECK-NODE-PORT";
pub const IPVS_IPS: &str = "KUBE-IPVS-IPS";

/// Every set: name, type, comment (kube-proxy's `ipsetInfo`).
const SETS: &[(&str, &str, &str)] = &[
    (
        LOOP_BACK,
        "hash:ip,port,ip",
        "Kubernetes endpoints dst ip:port, source ip for solving hairpin purpose",
    ),
    (
        CLUSTER_IP,
        "hash:ip,port",
        "Kubernetes service cluster ip + port for masquerade purpose",
    ),
    (
        EXTERNAL_IP,
        "hash:ip,port",
        "Kubernetes service external ip + port for masquerade and filter purpose",
    ),
    (
        EXTERNAL_IP_LOCAL,
        "hash:ip,port",
        "Kubernetes service external ip + port with externalTrafficPolicy=local",
    ),
    (
        LOAD_BALANCER,
        "hash:ip,port",
        "Kubernetes service lb portal",
    ),
    (
        LOAD_BALANCER_FW,
        "hash:ip,port",
        "Kubernetes service load balancer ip + port for load balancer with sourceRange",
    ),
    (
        LOAD_BALANCER_LOCAL,
        "hash:ip,port",
        "Kubernetes service load balancer ip + port with externalTrafficPolicy=local",
    ),
    (
        LOAD_BALANCER_SOURCE_IP,
        "hash:ip,port,ip",
        "Kubernetes service load balancer ip + port + source IP for packet filter purpose",
    ),
    (
        LOAD_BALANCER_SOURCE_CIDR,
        "hash:ip,port,net",
        "Kubernetes service load balancer ip + port + source cidr for packet filter purpose",
    ),
    (
        NODE_PORT_TCP,
        "bitmap:port",
        "Kubernetes nodeport TCP port for masquerade purpose",
    ),
    (
        NODE_PORT_LOCAL_TCP,
        "bitmap:port",
        "Kubernetes nodeport TCP port with externalTrafficPolicy=local",
    ),
    (
        NODE_PORT_UDP,
        "bitmap:port",
        "Kubernetes nodeport UDP port for masquerade purpose",
    ),
    (
        NODE_PORT_LOCAL_UDP,
        "bitmap:port",
        "Kubernetes nodeport UDP port with externalTrafficPolicy=local",
    ),
    (
        NODE_PORT_SCTP,
        "hash:ip,port",
        "Kubernetes nodeport SCTP port for masquerade purpose with type 'hash ip:port'",
    ),
    (
        NODE_PORT_LOCAL_SCTP,
        "hash:ip,port",
        "Kubernetes nodeport SCTP port with externalTrafficPolicy=local with type 'hash ip:port'",
    ),
    (
        HEALTH_CHECK_NODE_PORT,
        "bitmap:port",
        "Kubernetes health check node port",
    ),
    (IPVS_IPS, "hash:ip", "Kubernetes service IP addresses"),
];

/// Every set name of `family` (what cleanup destroys).
pub fn set_names(family: IpFamily) -> Vec<String> {
    SETS.iter().map(|(n, _, _)| set_name(n, family)).collect()
}

/// kube-proxy's IPv6 names: `KUBE-` becomes `KUBE-6-`, cut at ipset's 31 characters.
pub fn set_name(base: &str, family: IpFamily) -> String {
    match family {
        IpFamily::V4 => base.to_string(),
        IpFamily::V6 => {
            let mut n = base.replacen("KUBE-", "KUBE-6-", 1);
            n.truncate(31);
            n
        }
    }
}

// Chains.
pub const KUBE_SERVICES: &str = "KUBE-SERVICES";
pub const KUBE_POSTROUTING: &str = "KUBE-POSTROUTING";
pub const KUBE_NODE_PORT: &str = "KUBE-NODE-PORT";
pub const KUBE_LOAD_BALANCER: &str = "KUBE-LOAD-BALANCER";
pub const KUBE_MARK_MASQ: &str = "KUBE-MARK-MASQ";
pub const KUBE_FORWARD: &str = "KUBE-FORWARD";
pub const KUBE_PROXY_FIREWALL: &str = "KUBE-PROXY-FIREWALL";
pub const KUBE_SOURCE_RANGES_FIREWALL: &str = "KUBE-SOURCE-RANGES-FIREWALL";
pub const KUBE_IPVS_FILTER: &str = "KUBE-IPVS-FILTER";
pub const KUBE_IPVS_OUT_FILTER: &str = "KUBE-IPVS-OUT-FILTER";

/// The chains of ipvs mode, per table (kube-proxy's `iptablesChains`).
pub const CHAINS: &[(Table, &str)] = &[
    (Table::Nat, KUBE_SERVICES),
    (Table::Nat, KUBE_POSTROUTING),
    (Table::Nat, KUBE_NODE_PORT),
    (Table::Nat, KUBE_LOAD_BALANCER),
    (Table::Nat, KUBE_MARK_MASQ),
    (Table::Filter, KUBE_FORWARD),
    (Table::Filter, KUBE_NODE_PORT),
    (Table::Filter, KUBE_PROXY_FIREWALL),
    (Table::Filter, KUBE_SOURCE_RANGES_FIREWALL),
    (Table::Filter, KUBE_IPVS_FILTER),
    (Table::Filter, KUBE_IPVS_OUT_FILTER),
];

/// The jumps from built-in chains (kube-proxy's `iptablesJumpChain`), in order:
/// (table, built-in chain, comment, target).
pub const JUMPS: &[(Table, &str, &str, &str)] = &[
    (
        Table::Nat,
        "OUTPUT",
        "kubernetes service portals",
        KUBE_SERVICES,
    ),
    (
        Table::Nat,
        "PREROUTING",
        "kubernetes service portals",
        KUBE_SERVICES,
    ),
    (
        Table::Nat,
        "POSTROUTING",
        "kubernetes postrouting rules",
        KUBE_POSTROUTING,
    ),
    (
        Table::Filter,
        "FORWARD",
        "kubernetes forwarding rules",
        KUBE_FORWARD,
    ),
    (
        Table::Filter,
        "INPUT",
        "kubernetes health check rules",
        KUBE_NODE_PORT,
    ),
    (
        Table::Filter,
        "INPUT",
        "kube-proxy firewall rules",
        KUBE_PROXY_FIREWALL,
    ),
    (
        Table::Filter,
        "FORWARD",
        "kube-proxy firewall rules",
        KUBE_PROXY_FIREWALL,
    ),
    (
        Table::Filter,
        "INPUT",
        "kubernetes ipvs access filter",
        KUBE_IPVS_FILTER,
    ),
    (
        Table::Filter,
        "OUTPUT",
        "kubernetes ipvs access filter",
        KUBE_IPVS_OUT_FILTER,
    ),
];

fn ip_port(ip: IpAddr, proto: Protocol, port: u16) -> String {
    format!("{ip},{}:{port}", proto.as_str())
}

/// Renders one family. `node_ips`: the addresses NodePorts are served on (the apply layer
/// resolves [`weir_model::NodePortAddresses`] against the node's addresses, leaving out
/// loopback and `kube-ipvs0`'s own).
///
/// The plain way, kept as the oracle of [`super::incremental::Rendering`] (which a sync uses,
/// and which must come to the same state): every service port's fragment added in plan order,
/// the first one to name a virtual server giving its scheduler and persistence.
pub fn render(plan: &Plan, family: IpFamily, node_ips: &[IpAddr], opts: &IpvsOptions) -> Desired {
    let mut d = Desired {
        ipsets: empty_sets(family),
        ..Desired::default()
    };
    let mut no_local = Vec::new();
    for (key, sp) in plan.services.iter().filter(|(k, _)| k.family == family) {
        let f = render_service(key, sp, node_ips, opts);
        for (set, entry) in f.sets {
            let name = set_name(set, family);
            d.ipsets
                .get_mut(&name)
                .expect("every set")
                .entries
                .insert(entry);
        }
        d.addresses.extend(f.addresses);
        for (k, spec, real_servers) in f.servers {
            d.services
                .entry(k)
                .or_insert_with(|| VirtualServer {
                    spec,
                    real_servers: BTreeSet::new(),
                })
                .real_servers
                .extend(real_servers);
        }
        no_local.extend(f.no_local);
    }
    d.iptables = iptables_rules(plan, family, &d, opts, &no_local);
    d
}

/// An external frontend short-circuited to cluster endpoints: (VIP, protocol, port, service).
pub(super) type NoLocal = (IpAddr, Protocol, u16, String);

/// What one service port contributes to its family's [`Desired`] (see
/// [`super::incremental`], which adds and removes these).
#[derive(Debug, Clone, Default)]
pub(super) struct Fragment {
    /// (set base name, entry)
    pub sets: Vec<(&'static str, String)>,
    pub addresses: Vec<IpAddr>,
    /// Virtual servers with this service port's real servers (a key may repeat).
    pub servers: Vec<(ServiceKey, ServiceSpec, BTreeSet<RealServer>)>,
    pub no_local: Vec<NoLocal>,
}

/// One service port's part of the rendering.
pub(super) fn render_service(
    key: &ServicePortKey,
    sp: &ServicePortPlan,
    node_ips: &[IpAddr],
    opts: &IpvsOptions,
) -> Fragment {
    let mut f = Fragment::default();
    let proto = key.protocol;
    let spec = ServiceSpec {
        scheduler: opts.scheduler.clone(),
        persistence: sp.affinity_timeout,
    };
    for fe in &sp.frontends {
        let short_circuited = short_circuited(sp, fe);
        let endpoints = frontend_endpoints(sp, fe, short_circuited);
        let real_servers = rs_of(endpoints);
        // Hairpin (a pod reaching itself through a service) can only start on the pod's own
        // node: kube-proxy puts this node's endpoints in the set and no others, which also
        // keeps it far below its 65,536 entries in a large cluster.
        for e in endpoints.iter().filter(|e| e.is_local) {
            let entry = format!("{},{}:{},{}", e.ip, proto.as_str(), e.port, e.ip);
            f.sets.push((LOOP_BACK, entry));
        }
        let Some(vips) = frontend_sets(&mut f.sets, key, fe, node_ips) else {
            continue;
        };
        if fe.kind != FrontendKind::NodePort {
            f.addresses.extend(vips.iter().copied());
        }
        if short_circuited {
            for &addr in &vips {
                f.no_local.push((addr, proto, fe.port, key.to_string()));
            }
        }
        for addr in vips {
            let vs = ServiceKey {
                protocol: proto,
                addr,
                port: fe.port,
            };
            f.servers.push((vs, spec.clone(), real_servers.clone()));
        }
    }
    if let Some(p) = sp.health_check_node_port {
        f.sets.push((HEALTH_CHECK_NODE_PORT, p.to_string()));
    }
    f
}

/// The endpoints a frontend's virtual servers get.
fn frontend_endpoints<'a>(
    sp: &'a ServicePortPlan,
    fe: &weir_model::Frontend,
    short_circuited: bool,
) -> &'a [weir_model::Endpoint] {
    match fe.verdict {
        Verdict::Forward => sp.endpoints(fe.endpoints),
        // Policy Local without a local endpoint: kube-proxy's syncEndpoint gives the
        // virtual server every cluster endpoint (kubernetes#97081), so pods and the
        // node reach the service; outside sources are dropped by
        // `no_local_endpoint_drops` below, as in the other modes.
        Verdict::Drop if short_circuited => &sp.cluster_endpoints,
        // No real server: IPVS answers with ICMP port unreachable (a rejection).
        Verdict::Reject | Verdict::Drop => &[],
    }
}

/// A frontend's set entries (pushed on `sets`) and the addresses of its virtual servers;
/// `None` for an address frontend without an address.
fn frontend_sets(
    sets: &mut Vec<(&'static str, String)>,
    key: &ServicePortKey,
    fe: &weir_model::Frontend,
    node_ips: &[IpAddr],
) -> Option<Vec<IpAddr>> {
    let proto = key.protocol;
    let local = fe.masquerade == Masquerade::Never && fe.endpoints == EndpointSet::Local;
    let mut add = |set: &'static str, e: String| sets.push((set, e));
    if fe.kind == FrontendKind::NodePort {
        node_port_sets(&mut add, proto, fe.port, local, node_ips);
        let family = key.family;
        return Some(
            node_ips
                .iter()
                .copied()
                .filter(|ip| IpFamily::of(ip) == family)
                .collect(),
        );
    }
    let ip = fe.addr?;
    let e = ip_port(ip, proto, fe.port);
    match fe.kind {
        FrontendKind::ClusterIp => add(CLUSTER_IP, e),
        FrontendKind::ExternalIp if local => add(EXTERNAL_IP_LOCAL, e),
        FrontendKind::ExternalIp => add(EXTERNAL_IP, e),
        FrontendKind::LoadBalancer => {
            add(LOAD_BALANCER, e.clone());
            if local {
                add(LOAD_BALANCER_LOCAL, e.clone());
            }
            if let Some(ranges) = &fe.source_ranges {
                add(LOAD_BALANCER_FW, e.clone());
                for r in ranges {
                    add(LOAD_BALANCER_SOURCE_CIDR, format!("{e},{r}"));
                }
            }
        }
        // Above: a NodePort has no address of its own.
        FrontendKind::NodePort => {}
    }
    add(IPVS_IPS, ip.to_string());
    Some(vec![ip])
}

/// A NodePort's set entries: its port for TCP and UDP, each node address with it for SCTP.
fn node_port_sets(
    add: &mut impl FnMut(&'static str, String),
    proto: Protocol,
    port: u16,
    local: bool,
    node_ips: &[IpAddr],
) {
    let (all, loc) = match proto {
        Protocol::Tcp => (NODE_PORT_TCP, NODE_PORT_LOCAL_TCP),
        Protocol::Udp => (NODE_PORT_UDP, NODE_PORT_LOCAL_UDP),
        Protocol::Sctp => {
            for ip in node_ips {
                add(NODE_PORT_SCTP, ip_port(*ip, proto, port));
                if local {
                    add(NODE_PORT_LOCAL_SCTP, ip_port(*ip, proto, port));
                }
            }
            return;
        }
    };
    add(all, port.to_string());
    if local {
        add(loc, port.to_string());
    }
}

/// The family's sets, every one present (empty or not), by name.
pub fn empty_sets(family: IpFamily) -> BTreeMap<String, IpSet> {
    SETS.iter()
        .map(|(name, kind, comment)| {
            (
                set_name(name, family),
                IpSet {
                    kind,
                    comment,
                    entries: BTreeSet::new(),
                },
            )
        })
        .collect()
}

/// A frontend with externalTrafficPolicy Local, no local endpoint, but cluster endpoints
/// that pods and the node may use instead ([`weir_model::Frontend::short_circuit`]).
fn short_circuited(sp: &weir_model::ServicePortPlan, fe: &weir_model::Frontend) -> bool {
    fe.verdict == Verdict::Drop && fe.short_circuit && !sp.cluster_endpoints.is_empty()
}

fn rs_of(eps: &[weir_model::Endpoint]) -> BTreeSet<RealServer> {
    eps.iter()
        .map(|e| RealServer {
            addr: e.ip,
            port: e.port,
            weight: 1,
        })
        .collect()
}

/// Drops, in filter `KUBE-PROXY-FIREWALL` (INPUT, before IPVS at LOCAL_IN), new traffic
/// from outside the cluster CIDR and the node to short-circuited frontends: their virtual
/// servers hold every cluster endpoint for the pods' sake, but an outside client of a
/// policy-Local frontend must not be sent to another node (kube-proxy's ipvs mode forwards
/// it unmasqueraded, so the reply never finds the client; the other modes drop it).
fn no_local_endpoint_drops(
    filter: &mut String,
    plan: &Plan,
    family: IpFamily,
    frontends: &[(IpAddr, Protocol, u16, String)],
) {
    let not_pods = plan
        .cluster_cidrs
        .iter()
        .find(|c| IpFamily::of_net(c) == family)
        .map(|c| format!("! -s {c} "))
        .unwrap_or_default();
    let host = if family == IpFamily::V4 { 32 } else { 128 };
    for (addr, proto, port, svc) in frontends {
        let _ = writeln!(
            filter,
            "-A {KUBE_PROXY_FIREWALL} {not_pods}-d {addr}/{host} -p {} -m {} --dport {port} -m addrtype ! --src-type LOCAL -m conntrack --ctstate NEW -m comment --comment \"{svc} has no local endpoints\" -j DROP",
            proto.as_str(),
            proto.as_str()
        );
    }
}

/// kube-proxy's `writeIptablesRules`: rules for the non-empty sets only; `no_local`: the
/// short-circuited frontends (see [`no_local_endpoint_drops`]).
pub(super) fn iptables_rules(
    plan: &Plan,
    family: IpFamily,
    d: &Desired,
    opts: &IpvsOptions,
    no_local: &[(IpAddr, Protocol, u16, String)],
) -> String {
    let sets = SetRules {
        family,
        sets: &d.ipsets,
    };
    let filter = filter_rules(&sets, plan, opts, no_local);
    let nat = nat_rules(&sets, plan, opts);
    let mut out = String::from("# weir ipvs mode\n");
    for (t, body) in [(Table::Filter, filter), (Table::Nat, nat)] {
        let _ = writeln!(out, "*{}", t.name());
        for (ct, c) in CHAINS {
            if *ct == t {
                let _ = writeln!(out, ":{c} - [0:0]");
            }
        }
        out += &body;
        out += "COMMIT\n";
    }
    out
}

/// kube-proxy's `ipsetWithIptablesChain`, in its order: (table, set, from chain, target,
/// match flags, protocol). A rule is written only for a set with entries.
#[rustfmt::skip]
const SET_CHAINS: &[(Table, &str, &str, &str, &str, &str)] = &[
    (Table::Nat, LOOP_BACK, KUBE_POSTROUTING, "MASQUERADE", "dst,dst,src", ""),
    (Table::Nat, LOAD_BALANCER, KUBE_SERVICES, KUBE_LOAD_BALANCER, "dst,dst", ""),
    (Table::Nat, LOAD_BALANCER_LOCAL, KUBE_LOAD_BALANCER, "RETURN", "dst,dst", ""),
    (Table::Nat, NODE_PORT_LOCAL_TCP, KUBE_NODE_PORT, "RETURN", "dst", "tcp"),
    (Table::Nat, NODE_PORT_TCP, KUBE_NODE_PORT, KUBE_MARK_MASQ, "dst", "tcp"),
    (Table::Nat, NODE_PORT_LOCAL_UDP, KUBE_NODE_PORT, "RETURN", "dst", "udp"),
    (Table::Nat, NODE_PORT_UDP, KUBE_NODE_PORT, KUBE_MARK_MASQ, "dst", "udp"),
    (Table::Nat, NODE_PORT_LOCAL_SCTP, KUBE_NODE_PORT, "RETURN", "dst,dst", "sctp"),
    (Table::Nat, NODE_PORT_SCTP, KUBE_NODE_PORT, KUBE_MARK_MASQ, "dst,dst", "sctp"),
    (Table::Filter, LOAD_BALANCER_FW, KUBE_PROXY_FIREWALL, KUBE_SOURCE_RANGES_FIREWALL, "dst,dst", ""),
    (Table::Filter, LOAD_BALANCER_SOURCE_CIDR, KUBE_SOURCE_RANGES_FIREWALL, "RETURN", "dst,dst,src", ""),
    (Table::Filter, LOAD_BALANCER_SOURCE_IP, KUBE_SOURCE_RANGES_FIREWALL, "RETURN", "dst,dst,src", ""),
];

/// One family's sets as its iptables rules name and match them.
struct SetRules<'a> {
    family: IpFamily,
    sets: &'a BTreeMap<String, IpSet>,
}

impl SetRules<'_> {
    fn name(&self, base: &str) -> String {
        set_name(base, self.family)
    }

    /// The set has entries (rules for empty sets are left out, as kube-proxy does).
    fn full(&self, base: &str) -> bool {
        self.sets
            .get(&self.name(base))
            .is_some_and(|s| !s.entries.is_empty())
    }

    /// `-m comment --comment "<the set's comment>" -m set --match-set <name>`.
    fn matching(&self, base: &str) -> String {
        let comment = SETS
            .iter()
            .find(|(n, _, _)| *n == base)
            .map(|(_, _, c)| *c)
            .unwrap_or_default();
        format!(
            "-m comment --comment \"{comment}\" -m set --match-set {}",
            self.name(base)
        )
    }

    /// The [`SET_CHAINS`] rules of `table`, for the sets with entries.
    fn chained(&self, out: &mut String, table: Table) {
        for (t, set, from, to, m, proto) in SET_CHAINS {
            if *t == table && self.full(set) {
                let p = if proto.is_empty() {
                    String::new()
                } else {
                    format!("-p {proto} ")
                };
                let _ = writeln!(out, "-A {from} {p}{} {m} -j {to}", self.matching(set));
            }
        }
    }
}

/// The nat table's rules: set matches, masquerade marks, and the jump to NodePorts.
fn nat_rules(sets: &SetRules<'_>, plan: &Plan, opts: &IpvsOptions) -> String {
    let mut nat = String::new();
    if sets.family == IpFamily::V4 {
        // IPVS cannot serve connections from 127.0.0.0/8: dismiss them early.
        let _ = writeln!(nat, "-A {KUBE_SERVICES} -s 127.0.0.0/8 -j RETURN");
    }
    sets.chained(&mut nat, Table::Nat);
    cluster_ip_masquerade(&mut nat, sets, plan);
    external_ip_rules(&mut nat, sets);
    let _ = writeln!(
        nat,
        "-A {KUBE_SERVICES} -m addrtype --dst-type LOCAL -j {KUBE_NODE_PORT}"
    );
    let _ = writeln!(nat, "-A {KUBE_LOAD_BALANCER} -j {KUBE_MARK_MASQ}");
    // Accept what IPVS will take, in case later rules would drop it.
    for set in [CLUSTER_IP, LOAD_BALANCER] {
        if sets.full(set) {
            let _ = writeln!(
                nat,
                "-A {KUBE_SERVICES} -m set --match-set {} dst,dst -j ACCEPT",
                sets.name(set)
            );
        }
    }
    let mark = opts.masquerade_mark;
    let _ = writeln!(
        nat,
        "-A {KUBE_POSTROUTING} -m mark ! --mark {mark:#x}/{mark:#x} -j RETURN"
    );
    let _ = writeln!(nat, "-A {KUBE_POSTROUTING} -j MARK --xor-mark {mark:#x}");
    let _ = writeln!(
        nat,
        "-A {KUBE_POSTROUTING} -m comment --comment \"kubernetes service traffic requiring SNAT\" -j MASQUERADE --random-fully"
    );
    let _ = writeln!(nat, "-A {KUBE_MARK_MASQ} -j MARK --or-mark {mark:#x}");
    nat
}

/// Which traffic to a ClusterIP is masqueraded: all of it (`masqueradeAll`), what comes from
/// off the cluster CIDR, or without a cluster CIDR what the node sends from a VIP.
fn cluster_ip_masquerade(nat: &mut String, sets: &SetRules<'_>, plan: &Plan) {
    if !sets.full(CLUSTER_IP) {
        return;
    }
    let head = format!("-A {KUBE_SERVICES} {}", sets.matching(CLUSTER_IP));
    let cidr = plan
        .cluster_cidrs
        .iter()
        .find(|c| IpFamily::of_net(c) == sets.family);
    let _ = match (plan.masquerade_all, cidr) {
        (true, _) => writeln!(nat, "{head} dst,dst -j {KUBE_MARK_MASQ}"),
        (false, Some(c)) => writeln!(nat, "{head} dst,dst ! -s {c} -j {KUBE_MARK_MASQ}"),
        (false, None) => writeln!(nat, "{head} src,dst -j {KUBE_MARK_MASQ}"),
    };
}

/// externalIPs: masqueraded unless policy Local, and accepted from off the machine (not
/// bridged, not local) or to a local address.
fn external_ip_rules(nat: &mut String, sets: &SetRules<'_>) {
    for (set, masquerade) in [(EXTERNAL_IP, true), (EXTERNAL_IP_LOCAL, false)] {
        if !sets.full(set) {
            continue;
        }
        let args = format!("-A {KUBE_SERVICES} {} dst,dst", sets.matching(set));
        if masquerade {
            let _ = writeln!(nat, "{args} -j {KUBE_MARK_MASQ}");
        }
        let _ = writeln!(
            nat,
            "{args} -m physdev ! --physdev-is-in -m addrtype ! --src-type LOCAL -j ACCEPT"
        );
        let _ = writeln!(nat, "{args} -m addrtype --dst-type LOCAL -j ACCEPT");
    }
}

/// The filter table's rules: source ranges, short-circuited frontends, forwarding accepts,
/// healthCheckNodePorts and the VIP access filter.
fn filter_rules(
    sets: &SetRules<'_>,
    plan: &Plan,
    opts: &IpvsOptions,
    no_local: &[(IpAddr, Protocol, u16, String)],
) -> String {
    let mut filter = String::new();
    sets.chained(&mut filter, Table::Filter);
    let _ = writeln!(filter, "-A {KUBE_SOURCE_RANGES_FIREWALL} -j DROP");
    no_local_endpoint_drops(&mut filter, plan, sets.family, no_local);
    let mark = opts.masquerade_mark;
    let _ = writeln!(
        filter,
        "-A {KUBE_FORWARD} -m comment --comment \"kubernetes forwarding rules\" -m mark --mark {mark:#x}/{mark:#x} -j ACCEPT"
    );
    let _ = writeln!(
        filter,
        "-A {KUBE_FORWARD} -m comment --comment \"kubernetes forwarding conntrack rule\" -m conntrack --ctstate RELATED,ESTABLISHED -j ACCEPT"
    );
    let _ = writeln!(
        filter,
        "-A {KUBE_NODE_PORT} {} dst -j ACCEPT",
        sets.matching(HEALTH_CHECK_NODE_PORT)
    );
    // Only the service ports of a VIP are open: anything else to it is rejected (a VIP is a
    // local address, so without this it would reach the node's own listeners).
    for (set, m) in [
        (LOAD_BALANCER, "dst,dst"),
        (CLUSTER_IP, "dst,dst"),
        (EXTERNAL_IP, "dst,dst"),
        (EXTERNAL_IP_LOCAL, "dst,dst"),
        (HEALTH_CHECK_NODE_PORT, "dst"),
    ] {
        let _ = writeln!(
            filter,
            "-A {KUBE_IPVS_FILTER} -m set --match-set {} {m} -j RETURN",
            sets.name(set)
        );
    }
    let _ = writeln!(
        filter,
        "-A {KUBE_IPVS_FILTER} -m conntrack --ctstate NEW -m set --match-set {} dst -j REJECT",
        sets.name(IPVS_IPS)
    );
    filter
}

/// Every set rebuilt from scratch: each is created empty under a temporary name, filled, and
/// swapped in, so no moment sees it empty.
pub struct SetRebuild {
    /// `ipset restore` input creating every set (if missing) and an empty temporary one.
    pub create: String,
    /// The entries, added to the temporary sets (over netlink: `ipset restore` took 13 of a
    /// full sync's 15 s at 1,000 services under the test VM's emulation).
    pub fill: Vec<EntryChange>,
    /// `ipset restore` input swapping each temporary set in and destroying it.
    pub swap: String,
}

pub fn ipset_rebuild(sets: &BTreeMap<String, IpSet>, family: IpFamily) -> SetRebuild {
    let mut r = SetRebuild {
        create: String::new(),
        fill: Vec::new(),
        swap: String::new(),
    };
    for (i, (name, s)) in sets.iter().enumerate() {
        let (create, tmp, swap) = rebuild_lines(i, name, s, family);
        r.create.push_str(&create);
        r.fill.extend(s.entries.iter().map(|e| EntryChange {
            add: true,
            set: tmp.clone(),
            entry: e.clone(),
        }));
        r.swap.push_str(&swap);
    }
    r
}

/// The same rebuild as one `ipset restore` input (goldens, tests).
pub fn ipset_full(sets: &BTreeMap<String, IpSet>, family: IpFamily) -> String {
    let mut out = String::new();
    for (i, (name, s)) in sets.iter().enumerate() {
        let (create, tmp, swap) = rebuild_lines(i, name, s, family);
        out.push_str(&create);
        for e in &s.entries {
            let _ = writeln!(out, "add {tmp} {e}");
        }
        out.push_str(&swap);
    }
    out
}

/// One set's create lines (the set if missing, and its temporary set emptied: a failed
/// rebuild may have left it), the temporary name, and the swap lines.
fn rebuild_lines(i: usize, name: &str, s: &IpSet, family: IpFamily) -> (String, String, String) {
    let fam = match family {
        IpFamily::V4 => "inet",
        IpFamily::V6 => "inet6",
    };
    let opts = if s.kind.starts_with("bitmap") {
        "range 0-65535".to_string()
    } else {
        format!("family {fam} hashsize 1024 maxelem 65536")
    };
    let tmp = format!("weir-{}-{i}", std::process::id());
    let create = format!(
        "create {name} {kind} {opts} comment -exist\ncreate {tmp} {kind} {opts} comment -exist\nflush {tmp}\n",
        kind = s.kind
    );
    let swap = format!("swap {tmp} {name}\ndestroy {tmp}\n");
    (create, tmp, swap)
}

/// One ipset entry to add or delete; displayed as its `ipset restore` line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EntryChange {
    pub add: bool,
    pub set: String,
    pub entry: String,
}

impl std::fmt::Display for EntryChange {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let verb = if self.add { "add" } else { "del" };
        write!(f, "{verb} {} {} -exist", self.set, self.entry)
    }
}

/// The entries turning `old` into `new` (sets already exist): deletions, then additions, set
/// by set.
pub fn ipset_update(
    old: &BTreeMap<String, IpSet>,
    new: &BTreeMap<String, IpSet>,
) -> Vec<EntryChange> {
    let empty = BTreeSet::new();
    let mut out = Vec::new();
    for (name, s) in new {
        let before = old.get(name).map(|o| &o.entries).unwrap_or(&empty);
        let change = |add: bool, e: &String| EntryChange {
            add,
            set: name.clone(),
            entry: e.clone(),
        };
        out.extend(before.difference(&s.entries).map(|e| change(false, e)));
        out.extend(s.entries.difference(before).map(|e| change(true, e)));
    }
    out
}

/// The virtual servers in `ipvsadm -Sn` syntax, sorted (for golden files, logs, and to
/// compare with what the kernel reports).
pub fn ipvsadm_save(services: &BTreeMap<ServiceKey, VirtualServer>) -> String {
    let mut lines = Vec::new();
    for (k, vs) in services {
        let flag = match k.protocol {
            Protocol::Tcp => "-t",
            Protocol::Udp => "-u",
            Protocol::Sctp => "--sctp-service",
        };
        let addr = |a: IpAddr, p: u16| match a {
            IpAddr::V4(a) => format!("{a}:{p}"),
            IpAddr::V6(a) => format!("[{a}]:{p}"),
        };
        let vip = addr(k.addr, k.port);
        let mut l = format!("-A {flag} {vip} -s {}", vs.spec.scheduler);
        if let Some(t) = vs.spec.persistence {
            l += &format!(" -p {t}");
        }
        lines.push(l);
        for rs in &vs.real_servers {
            lines.push(format!(
                "-a {flag} {vip} -r {} -m -w {}",
                addr(rs.addr, rs.port),
                rs.weight
            ));
        }
    }
    lines.join("\n") + "\n"
}
