//! Renderer: [`Plan`] → `iptables-restore` input in kube-proxy's layout, for one IP family
//! (the same text goes to `iptables-restore` or `ip6tables-restore`).
//!
//! nat:
//! * `KUBE-SERVICES` (from PREROUTING and OUTPUT): one rule per ClusterIP, externalIP and LB
//!   frontend with somewhere to go, then the jump to `KUBE-NODEPORTS` as the last rule
//!   (`-m addrtype --dst-type LOCAL` minus loopback, or one rule per node-port address).
//! * `KUBE-SVC-…` / `KUBE-SVL-…`: the ClusterIP masquerade rule, ClientIP affinity
//!   (`-m recent --rcheck`), then `-m statistic` spreading with probabilities 1/n,
//!   1/(n-1), …, the last rule unconditional, to the `KUBE-SEP-…` chains.
//! * `KUBE-SEP-…`: hairpin (`-s <ep> -j KUBE-MARK-MASQ`), then DNAT (recording the client
//!   with `-m recent --set` when affinity is on).
//! * `KUBE-EXT-…`: external frontends; masquerade (policy Cluster) or the policy-Local
//!   short-circuits (pods and the node itself go to `KUBE-SVC`), then SVC/SVL.
//! * `KUBE-FW-…`: loadBalancerSourceRanges: allowed sources go on to `KUBE-EXT` (and are
//!   DNATed); the rest falls through un-DNATed and the filter table's `KUBE-PROXY-FIREWALL`
//!   drops it (kube-proxy ≥ 1.25's layout: no `KUBE-MARK-DROP`).
//! * `KUBE-MARK-MASQ`, `KUBE-POSTROUTING` (masquerades marked packets, clearing the mark
//!   first so a packet re-entering the stack is not masqueraded twice).
//!
//! filter: `KUBE-SERVICES` / `KUBE-EXTERNAL-SERVICES` REJECT frontends of services without
//! endpoints (DROP when endpoints exist but none is local under policy Local); these run
//! before any DNAT could apply, because no nat rule exists for those frontends.
//! `KUBE-FORWARD` accepts marked and established traffic (FORWARD policy DROP nodes),
//! `KUBE-NODEPORTS` accepts health-check node ports, `KUBE-PROXY-FIREWALL` drops traffic to
//! source-range-guarded load balancer IPs that `KUBE-FW-…` did not let through.
//! `KUBE-PROXY-CANARY` (mangle, nat, filter) is never used by a rule; it is kube-proxy's flush
//! detector, kept for tools that look for it (weir's own check reads rule contents: see
//! `IptablesBackend`).
//!
//! Not weir's: kubelet's `KUBE-FIREWALL` (its CVE-2020-8558 localnet rule) and the
//! `KUBE-MARK-DROP` of kubelets before 1.28 — weir neither writes nor deletes them.

use std::cmp::Ordering;
use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;
use std::sync::Arc;

use ipnet::IpNet;
use weir_model::{
    Changed, Endpoint, EndpointSet, Frontend, FrontendKind, IpFamily, Masquerade,
    NodePortAddresses, Plan, PlanDiff, ServicePortKey, ServicePortPlan, Verdict,
};

use super::detect::BackendChoice;
use super::names::{
    endpoint_chain, endpoint_string, is_service_chain, service_port_name, ServiceChains,
};
use super::restore::{Restore, Table};

pub const KUBE_SERVICES: &str = "KUBE-SERVICES";
pub const KUBE_EXTERNAL_SERVICES: &str = "KUBE-EXTERNAL-SERVICES";
pub const KUBE_NODEPORTS: &str = "KUBE-NODEPORTS";
pub const KUBE_FORWARD: &str = "KUBE-FORWARD";
/// kubelet's chain (not weir's): weir never writes or deletes it.
pub const KUBE_FIREWALL: &str = "KUBE-FIREWALL";
pub const KUBE_PROXY_FIREWALL: &str = "KUBE-PROXY-FIREWALL";
pub const KUBE_POSTROUTING: &str = "KUBE-POSTROUTING";
pub const KUBE_MARK_MASQ: &str = "KUBE-MARK-MASQ";
pub const KUBE_PROXY_CANARY: &str = "KUBE-PROXY-CANARY";
/// Only with more than one cluster CIDR in a family: "masquerade unless the source is in
/// one of them" needs a chain (iptables takes one `! -s` per rule). kube-proxy accepts a
/// single CIDR per family and has no such chain.
pub const KUBE_MARK_MASQ_OFFCLUSTER: &str = "KUBE-MARK-MASQ-OFFCLUSTER";

/// Every fixed chain weir may create, per table (what cleanup removes besides the
/// per-service chains). kubelet's `KUBE-FIREWALL` and `KUBE-MARK-DROP` are not among them.
pub const STATIC_CHAINS: [(Table, &str); 13] = [
    (Table::Mangle, KUBE_PROXY_CANARY),
    (Table::Filter, KUBE_SERVICES),
    (Table::Filter, KUBE_EXTERNAL_SERVICES),
    (Table::Filter, KUBE_FORWARD),
    (Table::Filter, KUBE_NODEPORTS),
    (Table::Filter, KUBE_PROXY_FIREWALL),
    (Table::Filter, KUBE_PROXY_CANARY),
    (Table::Nat, KUBE_SERVICES),
    (Table::Nat, KUBE_NODEPORTS),
    (Table::Nat, KUBE_POSTROUTING),
    (Table::Nat, KUBE_MARK_MASQ),
    (Table::Nat, KUBE_PROXY_CANARY),
    (Table::Nat, KUBE_MARK_MASQ_OFFCLUSTER),
];

/// True for every chain weir's iptables mode owns in `table`.
pub fn is_weir_chain(table: Table, chain: &str) -> bool {
    STATIC_CHAINS.contains(&(table, chain)) || (table == Table::Nat && is_service_chain(chain))
}

/// Renderer options.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IptablesOptions {
    /// The families the backend programs (`iptables` for V4, `ip6tables` for V6).
    pub families: Vec<IpFamily>,
    /// Masquerade mark bit (kube-proxy's 0x4000).
    pub masquerade_mark: u32,
    /// At most about this many nat chains per `COMMIT` (whole service ports per commit);
    /// `None`: one commit per table. iptables-nft needs batches: its restore is quadratic in
    /// the chains one commit names. iptables-legacy needs one commit: each replaces the whole
    /// table blob. [`IptablesBackend`](super::IptablesBackend) picks by the back end it finds.
    pub chains_per_commit: Option<usize>,
    /// Which implementation to drive (`--iptables-backend`).
    pub backend: BackendChoice,
}

/// The nat chains per commit that the iptables-nft back end gets: the batch is small enough
/// that the restore's sorted list stays short, big enough that per-commit costs (a cache
/// fetch and a kernel transaction) do not dominate (measured in docs/benchmarks.md).
pub const NFT_CHAINS_PER_COMMIT: usize = 100;

/// The nat chains per commit for iptables-nft when the table's `chains` are (or will be)
/// reachable from the built-in chains. Each commit that adds a jump makes the kernel walk
/// every rule reachable from the base chains (nf_tables' loop and hook check), so over a
/// hooked-in table the kernel's share grows as commits × table size while the tool's
/// sorted-list share grows as table size × batch: the sum is least near a batch of
/// √(90 × chains) (measured at 1,000 services × 10: 11,000 chains, batch 100 → 4.6 s of
/// CPU, 300 → 2.5 s, 1,000 → 1.8 s, 3,000 → 2.4 s; a first load, not yet hooked in,
/// 1.1 s at 100). Never below [`NFT_CHAINS_PER_COMMIT`].
pub fn nft_chains_per_commit(chains: usize, reachable: bool) -> usize {
    if !reachable {
        return NFT_CHAINS_PER_COMMIT;
    }
    ((90.0 * chains as f64).sqrt() as usize).max(NFT_CHAINS_PER_COMMIT)
}

/// The number of nat chains `view`'s service ports need, about (per port: one per endpoint,
/// plus SVC, SVL, EXT and FW at most).
pub fn chains_in(view: &Plan) -> usize {
    view.services
        .values()
        .map(|sp| sp.cluster_endpoints.len() + sp.local_endpoints.len() + 4)
        .sum()
}

impl Default for IptablesOptions {
    fn default() -> Self {
        IptablesOptions {
            families: vec![IpFamily::V4, IpFamily::V6],
            masquerade_mark: 0x4000,
            chains_per_commit: None,
            backend: BackendChoice::Auto,
        }
    }
}

/// The part of `plan` that one family's tables hold: its service ports and its globals
/// (the other family's node-port addresses cleared), so that diffs of two views see only
/// changes that matter to this family.
pub fn family_view(plan: &Plan, family: IpFamily) -> Plan {
    let (v4, v6) = match family {
        IpFamily::V4 => (plan.node_port_addresses_v4.clone(), NodePortAddresses::None),
        IpFamily::V6 => (NodePortAddresses::None, plan.node_port_addresses_v6.clone()),
    };
    Plan {
        services: plan
            .services
            .iter()
            .filter(|(k, _)| k.family == family)
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect(),
        node_port_addresses_v4: v4,
        node_port_addresses_v6: v6,
        cluster_cidrs: plan
            .cluster_cidrs
            .iter()
            .filter(|n| IpFamily::of_net(n) == family)
            .map(|n| n.trunc())
            .collect(),
        masquerade_all: plan.masquerade_all,
        warnings: Vec::new(),
    }
}

/// What every rule of one family needs besides the service port itself.
struct Ctx<'a> {
    family: IpFamily,
    cidrs: &'a [IpNet],
    node_ports: &'a NodePortAddresses,
    o: &'a IptablesOptions,
}

impl<'a> Ctx<'a> {
    fn new(view: &'a Plan, family: IpFamily, o: &'a IptablesOptions) -> Self {
        Ctx {
            family,
            cidrs: &view.cluster_cidrs,
            node_ports: view.node_port_addresses(family),
            o,
        }
    }

    fn reject(&self) -> &'static str {
        match self.family {
            IpFamily::V4 => "REJECT --reject-with icmp-port-unreachable",
            IpFamily::V6 => "REJECT --reject-with icmp6-port-unreachable",
        }
    }

    fn host_prefix(&self) -> u8 {
        match self.family {
            IpFamily::V4 => 32,
            IpFamily::V6 => 128,
        }
    }

    fn loopback(&self) -> &'static str {
        match self.family {
            IpFamily::V4 => "127.0.0.0/8",
            IpFamily::V6 => "::1/128",
        }
    }

    /// The rule marking `m`-matched packets for masquerade under policy `masq`, if any.
    fn masq_rule(&self, m: &str, masq: Masquerade) -> Option<String> {
        let sep = if m.is_empty() { "" } else { " " };
        match (masq, self.cidrs) {
            (Masquerade::Never, _) => None,
            // No cluster CIDR of this family: every source is off-cluster.
            (Masquerade::Always, _) | (Masquerade::OffCluster, []) => {
                Some(format!("{m}{sep}-j {KUBE_MARK_MASQ}"))
            }
            (Masquerade::OffCluster, [cidr]) => {
                Some(format!("{m}{sep}! -s {cidr} -j {KUBE_MARK_MASQ}"))
            }
            (Masquerade::OffCluster, _) => Some(format!("{m}{sep}-j {KUBE_MARK_MASQ_OFFCLUSTER}")),
        }
    }
}

/// `-m comment --comment …`, quoted only when needed (as kube-proxy writes it).
fn comment(text: &str) -> String {
    if text.contains(' ') {
        format!("-m comment --comment \"{text}\"")
    } else {
        format!("-m comment --comment {text}")
    }
}

/// kube-proxy's `computeProbability`: Go's `%0.10f` of 1/n (both round half to even).
pub fn probability(n: usize) -> String {
    format!("{:.10}", 1.0 / n as f64)
}

/// How one service port maps onto kube-proxy's chains (shared by the rules that list it
/// and the rules of its own chains).
struct Shape<'a> {
    key: &'a ServicePortKey,
    sp: &'a ServicePortPlan,
    spn: String,
    ch: ServiceChains,
    /// `-m tcp -p tcp`.
    proto: String,
    /// `KUBE-SVC` exists: cluster endpoints, used by a forwarding frontend or a short-circuit.
    svc: bool,
    /// `KUBE-SVL` exists: local endpoints used by a forwarding frontend.
    svl: bool,
    /// The external frontends' common policy. The planner gives every external frontend of a
    /// service port the same endpoints, verdict, masquerade and short-circuit, so the first
    /// one describes `KUBE-EXT` (kube-proxy has one EXT chain per service port, too).
    ext: Option<&'a Frontend>,
    /// `KUBE-EXT` exists: external traffic is forwarded, or at least short-circuited.
    ext_used: bool,
    /// `KUBE-FW` exists with these allowed sources.
    fw: Option<&'a [IpNet]>,
}

impl<'a> Shape<'a> {
    fn new(key: &'a ServicePortKey, sp: &'a ServicePortPlan) -> Self {
        let fes = &sp.frontends;
        let forwards = |set: EndpointSet| {
            fes.iter()
                .any(|f| f.verdict == Verdict::Forward && f.endpoints == set)
        };
        let short_circuit = |f: &Frontend| f.short_circuit && !sp.cluster_endpoints.is_empty();
        let ext = fes.iter().find(|f| f.kind.is_external());
        let ext_used = ext.is_some_and(|f| f.verdict == Verdict::Forward || short_circuit(f));
        let fw = fes
            .iter()
            .find(|f| f.kind == FrontendKind::LoadBalancer)
            .and_then(|f| f.source_ranges.as_deref())
            .filter(|_| ext_used);
        let p = key.protocol.as_str();
        Shape {
            key,
            sp,
            spn: service_port_name(key),
            ch: ServiceChains::of(key),
            proto: format!("-m {p} -p {p}"),
            svc: !sp.cluster_endpoints.is_empty()
                && (forwards(EndpointSet::Cluster) || fes.iter().any(short_circuit)),
            svl: !sp.local_endpoints.is_empty() && forwards(EndpointSet::Local),
            ext,
            ext_used,
            fw,
        }
    }

    fn policy_chain(&self, set: EndpointSet) -> &str {
        match set {
            EndpointSet::Cluster => &self.ch.svc,
            EndpointSet::Local => &self.ch.svl,
        }
    }

    /// Comment, protocol and destination of a frontend with an address.
    fn vip_match(&self, what: &str, addr: IpAddr, port: u16) -> String {
        format!(
            "{} {} -d {addr} --dport {port}",
            comment(&format!("{} {what}", self.spn)),
            self.proto
        )
    }

    fn no_endpoints_comment(&self, v: Verdict) -> String {
        match v {
            Verdict::Drop => comment(&format!("{} has no local endpoints", self.spn)),
            _ => comment(&format!("{} has no endpoints", self.spn)),
        }
    }

    fn no_endpoints_target(&self, v: Verdict, ctx: &Ctx) -> &'static str {
        match v {
            Verdict::Drop => "DROP",
            _ => ctx.reject(),
        }
    }

    /// Rules of the chains every sync rewrites: (table, chain, rule).
    fn listed(&self, ctx: &Ctx) -> Vec<(Table, &'static str, String)> {
        let mut out = Vec::new();
        for fe in &self.sp.frontends {
            let forwarded = fe.verdict == Verdict::Forward;
            match (fe.kind, fe.addr) {
                (FrontendKind::ClusterIp, Some(addr)) => {
                    let m = self.vip_match("cluster IP", addr, fe.port);
                    if forwarded {
                        let to = self.policy_chain(fe.endpoints);
                        out.push((Table::Nat, KUBE_SERVICES, format!("{m} -j {to}")));
                    } else {
                        let m = format!(
                            "{} {} -d {addr} --dport {}",
                            self.no_endpoints_comment(fe.verdict),
                            self.proto,
                            fe.port
                        );
                        let to = self.no_endpoints_target(fe.verdict, ctx);
                        out.push((Table::Filter, KUBE_SERVICES, format!("{m} -j {to}")));
                    }
                }
                (FrontendKind::ExternalIp | FrontendKind::LoadBalancer, Some(addr)) => {
                    let lb = fe.kind == FrontendKind::LoadBalancer;
                    if let (true, Some(_)) = (lb, self.fw) {
                        let c = comment(&format!(
                            "{} traffic not accepted by {}",
                            self.spn, self.ch.fw
                        ));
                        out.push((
                            Table::Filter,
                            KUBE_PROXY_FIREWALL,
                            format!("{c} {} -d {addr} --dport {} -j DROP", self.proto, fe.port),
                        ));
                    }
                    if self.ext_used {
                        let what = if lb { "loadbalancer IP" } else { "external IP" };
                        let to = match self.fw {
                            Some(_) if lb => &self.ch.fw,
                            _ => &self.ch.ext,
                        };
                        let m = self.vip_match(what, addr, fe.port);
                        out.push((Table::Nat, KUBE_SERVICES, format!("{m} -j {to}")));
                    }
                    if !forwarded {
                        let m = format!(
                            "{} {} -d {addr} --dport {}",
                            self.no_endpoints_comment(fe.verdict),
                            self.proto,
                            fe.port
                        );
                        let to = self.no_endpoints_target(fe.verdict, ctx);
                        out.push((
                            Table::Filter,
                            KUBE_EXTERNAL_SERVICES,
                            format!("{m} -j {to}"),
                        ));
                    }
                }
                (FrontendKind::NodePort, _) => {
                    if self.ext_used {
                        let m =
                            format!("{} {} --dport {}", comment(&self.spn), self.proto, fe.port);
                        out.push((
                            Table::Nat,
                            KUBE_NODEPORTS,
                            format!("{m} -j {}", self.ch.ext),
                        ));
                    }
                    if !forwarded {
                        let c = self.no_endpoints_comment(fe.verdict);
                        let to = self.no_endpoints_target(fe.verdict, ctx);
                        let (p, port) = (&self.proto, fe.port);
                        let dsts: Vec<String> = match ctx.node_ports {
                            NodePortAddresses::None => vec![],
                            NodePortAddresses::AllLocal => {
                                vec!["-m addrtype --dst-type LOCAL".to_string()]
                            }
                            NodePortAddresses::List(l) => {
                                l.iter().map(|a| format!("-d {a}")).collect()
                            }
                        };
                        for d in dsts {
                            out.push((
                                Table::Filter,
                                KUBE_EXTERNAL_SERVICES,
                                format!("{c} {d} {p} --dport {port} -j {to}"),
                            ));
                        }
                    }
                }
                // A frontend kind that needs an address but has none: nothing to match.
                _ => {}
            }
        }
        if let Some(hc) = self.sp.health_check_node_port {
            let c = comment(&format!("{} health check node port", self.spn));
            out.push((
                Table::Filter,
                KUBE_NODEPORTS,
                format!("{c} -m tcp -p tcp --dport {hc} -j ACCEPT"),
            ));
        }
        out
    }

    /// This service port's own nat chains, in order, with their rules.
    fn chains(&self, ctx: &Ctx) -> Vec<(String, Vec<String>)> {
        let mut out = Vec::new();
        if let (true, Some(fe)) = (self.ext_used, self.ext) {
            out.push((self.ch.ext.clone(), self.ext_rules(fe, ctx)));
        }
        if let Some(ranges) = self.fw {
            let c = comment(&format!("{} loadbalancer IP", self.spn));
            let mut rules: Vec<String> = ranges
                .iter()
                .filter(|r| IpFamily::of_net(r) == ctx.family)
                .map(|r| format!("{c} -s {r} -j {}", self.ch.ext))
                .collect();
            // No target: what is not let through stays un-DNATed, for KUBE-PROXY-FIREWALL.
            let c = comment(&format!(
                "other traffic to {} loadbalancer IP will be dropped by {KUBE_PROXY_FIREWALL}",
                self.spn
            ));
            rules.push(c);
            out.push((self.ch.fw.clone(), rules));
        }
        let mut seps: Vec<&Endpoint> = Vec::new();
        for (used, set) in [
            (self.svc, EndpointSet::Cluster),
            (self.svl, EndpointSet::Local),
        ] {
            if !used {
                continue;
            }
            let eps = self.sp.endpoints(set);
            let mut rules = self.clusterip_masq_rules(set, ctx);
            rules.extend(self.balance_rules(eps));
            out.push((self.policy_chain(set).to_string(), rules));
            seps.extend(eps);
        }
        let mut seen = BTreeSet::new();
        for ep in seps {
            let chain = endpoint_chain(self.key, ep);
            if seen.insert(chain.clone()) {
                let rules = self.endpoint_rules(&chain, ep, ctx);
                out.push((chain, rules));
            }
        }
        out
    }

    /// kube-proxy's EXT chain.
    fn ext_rules(&self, fe: &Frontend, ctx: &Ctx) -> Vec<String> {
        let mut rules = Vec::new();
        let spn = &self.spn;
        if fe.short_circuit && self.svc {
            // Pods and the node itself reach an external VIP of a policy-Local service as
            // if it were the ClusterIP (they would otherwise see only this node's endpoints).
            let c = comment(&format!("pod traffic for {spn} external destinations"));
            for cidr in ctx.cidrs {
                rules.push(format!("{c} -s {cidr} -j {}", self.ch.svc));
            }
            let c = comment(&format!(
                "masquerade LOCAL traffic for {spn} external destinations"
            ));
            rules.push(format!(
                "{c} -m addrtype --src-type LOCAL -j {KUBE_MARK_MASQ}"
            ));
            let c = comment(&format!(
                "route LOCAL traffic for {spn} external destinations"
            ));
            rules.push(format!(
                "{c} -m addrtype --src-type LOCAL -j {}",
                self.ch.svc
            ));
        }
        let c = comment(&format!(
            "masquerade traffic for {spn} external destinations"
        ));
        rules.extend(ctx.masq_rule(&c, fe.masquerade));
        // Without a final jump (policy Local, no local endpoint) the packet falls through
        // undNATed and the filter table's KUBE-EXTERNAL-SERVICES drops it.
        if fe.verdict == Verdict::Forward {
            rules.push(format!("-j {}", self.policy_chain(fe.endpoints)));
        }
        rules
    }

    /// ClusterIP masquerade rules at the top of the SVC/SVL chain: that chain is shared with
    /// external traffic, so the rule matches the ClusterIP destination only.
    fn clusterip_masq_rules(&self, set: EndpointSet, ctx: &Ctx) -> Vec<String> {
        self.sp
            .frontends
            .iter()
            .filter(|f| {
                f.kind == FrontendKind::ClusterIp
                    && f.verdict == Verdict::Forward
                    && f.endpoints == set
            })
            .filter_map(|f| {
                let m = self.vip_match("cluster IP", f.addr?, f.port);
                ctx.masq_rule(&m, f.masquerade)
            })
            .collect()
    }

    /// Affinity checks, then random spreading: rule i (of n) matches with probability
    /// 1/(n-i) of what reaches it, which makes every endpoint equally likely.
    fn balance_rules(&self, eps: &[Endpoint]) -> Vec<String> {
        let mut rules = Vec::new();
        let target = |ep: &Endpoint| {
            let c = comment(&format!(
                "{} -> {}",
                self.spn,
                endpoint_string(ep.ip, ep.port)
            ));
            (c, endpoint_chain(self.key, ep))
        };
        if let Some(t) = self.sp.affinity_timeout {
            for ep in eps {
                let (c, sep) = target(ep);
                rules.push(format!(
                    "{c} -m recent --name {sep} --rcheck --seconds {t} --reap -j {sep}"
                ));
            }
        }
        let n = eps.len();
        for (i, ep) in eps.iter().enumerate() {
            let (c, sep) = target(ep);
            if i + 1 < n {
                rules.push(format!(
                    "{c} -m statistic --mode random --probability {} -j {sep}",
                    probability(n - i)
                ));
            } else {
                rules.push(format!("{c} -j {sep}"));
            }
        }
        rules
    }

    fn endpoint_rules(&self, chain: &str, ep: &Endpoint, ctx: &Ctx) -> Vec<String> {
        let c = comment(&self.spn);
        // Hairpin: a pod reaching itself through the service must see the reply come from
        // the service, so the node masquerades it (the reply then returns via the node).
        let hairpin = format!("{c} -s {}/{} -j {KUBE_MARK_MASQ}", ep.ip, ctx.host_prefix());
        let recent = if self.sp.affinity_timeout.is_some() {
            format!(" -m recent --name {chain} --set")
        } else {
            String::new()
        };
        let dnat = format!(
            "{c}{recent} {} -j DNAT --to-destination {}",
            self.proto,
            endpoint_string(ep.ip, ep.port)
        );
        vec![hairpin, dnat]
    }
}

/// Rules of the listing chains (both tables), for every service port of `view`.
fn listing(r: &mut Restore, view: &Plan, ctx: &Ctx) {
    for (t, c) in [
        (Table::Filter, KUBE_SERVICES),
        (Table::Filter, KUBE_EXTERNAL_SERVICES),
        (Table::Filter, KUBE_NODEPORTS),
        (Table::Filter, KUBE_PROXY_FIREWALL),
        (Table::Nat, KUBE_SERVICES),
        (Table::Nat, KUBE_NODEPORTS),
    ] {
        r.declare(t, c);
    }
    for (k, sp) in &view.services {
        for (t, chain, rule) in Shape::new(k, sp).listed(ctx) {
            r.rule(t, chain, &rule);
        }
    }
    // Node ports last: KUBE-NODEPORTS matches on port only, it must not shadow a VIP.
    let c = comment("kubernetes service nodeports; NOTE: this must be the last rule in this chain");
    match ctx.node_ports {
        NodePortAddresses::None => {}
        NodePortAddresses::AllLocal => {
            let lo = ctx.loopback();
            let rule = format!("{c} -m addrtype --dst-type LOCAL ! -d {lo} -j {KUBE_NODEPORTS}");
            r.rule(Table::Nat, KUBE_SERVICES, &rule);
        }
        NodePortAddresses::List(addrs) => {
            for a in addrs.iter().filter(|a| IpFamily::of(a) == ctx.family) {
                r.rule(
                    Table::Nat,
                    KUBE_SERVICES,
                    &format!("{c} -d {a} -j {KUBE_NODEPORTS}"),
                );
            }
        }
    }
}

/// Adds a service port's own chains.
fn service_chains(r: &mut Restore, k: &ServicePortKey, sp: &ServicePortPlan, ctx: &Ctx) {
    for (chain, rules) in Shape::new(k, sp).chains(ctx) {
        r.declare(Table::Nat, &chain);
        for rule in rules {
            r.rule(Table::Nat, &chain, &rule);
        }
    }
}

/// The names of a service port's own chains.
fn chain_names(k: &ServicePortKey, sp: &ServicePortPlan, ctx: &Ctx) -> BTreeSet<String> {
    Shape::new(k, sp)
        .chains(ctx)
        .into_iter()
        .map(|(n, _)| n)
        .collect()
}

/// The fixed chains, with their rules (full syncs only: they change with the options or
/// the cluster CIDRs, never with a service).
fn fixed(r: &mut Restore, ctx: &Ctx, batched: bool) {
    // Batched, the listing chains get their own (last) commit: declaring them here would
    // leave them empty until then.
    let listing_here = !batched;
    let masq = format!("{:#x}", ctx.o.masquerade_mark);
    // Declared in kube-proxy's order (the listing chains are filled by `listing`).
    r.declare(Table::Mangle, KUBE_PROXY_CANARY);
    for c in [
        KUBE_SERVICES,
        KUBE_EXTERNAL_SERVICES,
        KUBE_FORWARD,
        KUBE_NODEPORTS,
        KUBE_PROXY_FIREWALL,
        KUBE_PROXY_CANARY,
    ] {
        r.declare(Table::Filter, c);
    }
    for c in [
        KUBE_SERVICES,
        KUBE_NODEPORTS,
        KUBE_POSTROUTING,
        KUBE_MARK_MASQ,
        KUBE_PROXY_CANARY,
    ] {
        if listing_here || !matches!(c, KUBE_SERVICES | KUBE_NODEPORTS) {
            r.declare(Table::Nat, c);
        }
    }
    r.rule(
        Table::Filter,
        KUBE_FORWARD,
        &format!(
            "{} -m mark --mark {masq}/{masq} -j ACCEPT",
            comment("kubernetes forwarding rules")
        ),
    );
    r.rule(
        Table::Filter,
        KUBE_FORWARD,
        &format!(
            "{} -m conntrack --ctstate RELATED,ESTABLISHED -j ACCEPT",
            comment("kubernetes forwarding conntrack rule")
        ),
    );
    r.rule(
        Table::Nat,
        KUBE_POSTROUTING,
        &format!("-m mark ! --mark {masq}/{masq} -j RETURN"),
    );
    // Clear the mark so a packet that re-traverses the stack is not masqueraded again.
    r.rule(
        Table::Nat,
        KUBE_POSTROUTING,
        &format!("-j MARK --xor-mark {masq}"),
    );
    r.rule(
        Table::Nat,
        KUBE_POSTROUTING,
        &format!(
            "{} -j MASQUERADE --random-fully",
            comment("kubernetes service traffic requiring SNAT")
        ),
    );
    r.rule(
        Table::Nat,
        KUBE_MARK_MASQ,
        &format!("-j MARK --or-mark {masq}"),
    );
    if ctx.cidrs.len() > 1 {
        r.declare(Table::Nat, KUBE_MARK_MASQ_OFFCLUSTER);
        for cidr in ctx.cidrs {
            r.rule(
                Table::Nat,
                KUBE_MARK_MASQ_OFFCLUSTER,
                &format!("-s {cidr} -j RETURN"),
            );
        }
        r.rule(
            Table::Nat,
            KUBE_MARK_MASQ_OFFCLUSTER,
            &format!("-j {KUBE_MARK_MASQ}"),
        );
    }
}

/// Adds the service ports' own chains, the listing chains and the deletion of `stale(r)`
/// (chains no longer used, computed once everything else is declared).
///
/// Batched (`chains_per_commit`), the nat table goes in several commits ordered so that
/// each leaves a working ruleset: the fixed chains (already in `r`), then the service
/// ports' chains, whole ports at a time (a port's chains only jump to each other and to
/// the fixed chains), then the listing chains that jump to them, then the deletions,
/// referring chains before the chains they refer to. Unbatched, it is one commit in
/// kube-proxy's order (listing chains first).
fn commits<'p>(
    r: &mut Restore,
    view: &Plan,
    ctx: &Ctx,
    services: impl Iterator<Item = (&'p ServicePortKey, &'p std::sync::Arc<ServicePortPlan>)>,
    stale: impl Fn(&Restore) -> Vec<String>,
    batch: Option<usize>,
    rewrite_listing: bool,
) {
    let Some(batch) = batch else {
        if rewrite_listing {
            listing(r, view, ctx);
        }
        for (k, sp) in services {
            service_chains(r, k, sp, ctx);
        }
        for c in stale(r) {
            r.delete(Table::Nat, &c);
        }
        return;
    };
    r.next_commit(Table::Nat);
    for (k, sp) in services {
        if r.declared_now(Table::Nat) >= batch {
            r.next_commit(Table::Nat);
        }
        service_chains(r, k, sp, ctx);
    }
    r.next_commit(Table::Nat);
    if rewrite_listing {
        listing(r, view, ctx);
    }
    r.next_commit(Table::Nat);
    delete_in_batches(r, Table::Nat, stale(r), batch);
}

/// The batch size for the chains of `services` (written or deleted), or `None` for one commit: batches only
/// when the options ask for them and the chains would not fit in one, so that small
/// updates (the common case: an endpoint changed) stay one atomic commit. The count is an
/// upper bound (per port: its endpoints' chains plus SVC, SVL, EXT and FW).
fn batch_for<'p>(
    o: &IptablesOptions,
    services: impl Iterator<Item = &'p ServicePortPlan>,
) -> Option<usize> {
    let batch = o.chains_per_commit?;
    let mut chains = 0;
    for sp in services {
        chains += sp.cluster_endpoints.len() + sp.local_endpoints.len() + 4;
        if chains > batch {
            return Some(batch);
        }
    }
    None
}

/// Where `chain` goes in a batched deletion: a chain can only be deleted once nothing jumps
/// to it, so the chains that jump come first (listing chains → FW → EXT → SVC/SVL → SEP →
/// the masquerade chains every other chain may jump to).
fn deletion_rank(chain: &str) -> usize {
    const ORDER: [&str; 7] = [
        "KUBE-FW-",
        "KUBE-EXT-",
        "KUBE-SVC-",
        "KUBE-SVL-",
        "KUBE-SEP-",
        KUBE_MARK_MASQ_OFFCLUSTER,
        KUBE_MARK_MASQ,
    ];
    ORDER
        .iter()
        .position(|p| chain.starts_with(p))
        .map_or(0, |i| i + 1)
}

/// Deletes `chains` of table `t`, at most about `batch` per commit when batched, in an order
/// where no commit deletes a chain that a later one still empties (`deletion_rank`).
pub(super) fn delete_in_batches(r: &mut Restore, t: Table, mut chains: Vec<String>, batch: usize) {
    chains.sort_by_key(|c| deletion_rank(c));
    for c in chains {
        if r.declared_now(t) >= batch {
            r.next_commit(t);
        }
        r.delete(t, &c);
    }
}

fn family_name(f: IpFamily) -> &'static str {
    match f {
        IpFamily::V4 => "IPv4",
        IpFamily::V6 => "IPv6",
    }
}

/// The complete `iptables-restore --noflush` input for `family` (mangle, filter, nat).
pub fn render_full(plan: &Plan, family: IpFamily, o: &IptablesOptions) -> String {
    render_full_replacing(plan, family, o, &BTreeSet::new())
}

/// [`render_full`], also deleting every per-service chain (and the optional off-cluster
/// chain) in `existing_nat_chains` — the nat chains the kernel holds now, from
/// `iptables-save` — that the new ruleset does not use. That is how a restarted process
/// removes what its predecessor left for services that are gone.
pub fn render_full_replacing(
    plan: &Plan,
    family: IpFamily,
    o: &IptablesOptions,
    existing_nat_chains: &BTreeSet<String>,
) -> String {
    let view = family_view(plan, family);
    let ctx = Ctx::new(&view, family, o);
    let mut r = Restore::default();
    let batch = batch_for(o, view.services.values().map(|sp| &**sp));
    fixed(&mut r, &ctx, batch.is_some());
    let stale = |r: &Restore| -> Vec<String> {
        existing_nat_chains
            .iter()
            .filter(|c| is_service_chain(c) || *c == KUBE_MARK_MASQ_OFFCLUSTER)
            .filter(|c| !r.is_declared(Table::Nat, c))
            .cloned()
            .collect()
    };
    commits(
        &mut r,
        &view,
        &ctx,
        view.services.iter(),
        stale,
        batch,
        true,
    );
    r.text(&format!(
        "weir iptables full: {} service ports ({})",
        view.services.len(),
        family_name(family)
    ))
}

/// An incremental update of `family` from `old` (what the kernel holds) to `new`: the
/// chains of changed or added service ports are replaced, chains no longer used are
/// deleted, the listing chains (KUBE-SERVICES, KUBE-NODEPORTS, KUBE-EXTERNAL-SERVICES, …)
/// are rewritten only when a changed port's listing rules differ, and nothing else is
/// named. When this family's node-wide settings changed it
/// is a full render instead (first line `# weir iptables full`). No change: only the
/// header line. (Compares and copies both plans; the backend uses [`render_diff`].)
pub fn render_update(old: &Plan, new: &Plan, family: IpFamily, o: &IptablesOptions) -> String {
    let (ov, nv) = (family_view(old, family), family_view(new, family));
    let diff = ov.diff(&nv);
    if diff.globals_changed {
        let octx = Ctx::new(&ov, family, o);
        let mut existing: BTreeSet<String> = ov
            .services
            .iter()
            .flat_map(|(k, sp)| chain_names(k, sp, &octx))
            .collect();
        if octx.cidrs.len() > 1 {
            existing.insert(KUBE_MARK_MASQ_OFFCLUSTER.to_string());
        }
        return render_full_replacing(new, family, o, &existing);
    }
    render_diff(&ov, &diff, family, o)
}

/// [`render_update`] from what the kernel holds (`held`, a [`family_view`]) by `diff`: this
/// family's service ports that changed, node-wide settings equal (`diff.globals_changed`
/// must be false). Reads only the touched service ports of `diff` and `held`'s node-wide
/// settings, so its cost follows the change, not the cluster.
pub fn render_diff(held: &Plan, diff: &PlanDiff, family: IpFamily, o: &IptablesOptions) -> String {
    debug_assert!(!diff.globals_changed, "render_diff needs unchanged globals");
    let header = format!(
        "weir iptables update: {} service ports touched ({})",
        diff.touched().len(),
        family_name(family)
    );
    if diff.is_empty() {
        return format!("# {header}\n");
    }
    // Node-wide settings are the same before and after: one context serves both sides.
    let ctx = Ctx::new(held, family, o);
    let old_of = |k: &ServicePortKey| {
        diff.removed
            .get(k)
            .or_else(|| diff.changed.get(k).map(|c| &c.old))
    };
    let new_of = |k: &ServicePortKey| {
        diff.added
            .get(k)
            .or_else(|| diff.changed.get(k).map(|c| &c.new))
    };
    let mut r = Restore::default();
    let touched = diff.touched();
    let stale = |r: &Restore| -> Vec<String> {
        touched
            .iter()
            .filter_map(|k| old_of(k).map(|sp| chain_names(k, sp, &ctx)))
            .flatten()
            .filter(|c| !r.is_declared(Table::Nat, c))
            .collect()
    };
    let changed = || touched.iter().filter_map(|k| new_of(k).map(|sp| (*k, sp)));
    // Written and deleted chains both count.
    let sizes = touched
        .iter()
        .flat_map(|k| [new_of(k), old_of(k)])
        .flatten()
        .map(|sp| &**sp);
    let batch = batch_for(o, sizes);
    // The listing chains name every service port (and, as jump targets, each one's chains):
    // rewriting them makes a one-endpoint change cost as much as the cluster is big. They
    // only need it when a touched port's listing rules differ (a port came or went, a
    // frontend or a verdict changed); an endpoint change alone names its own chains only.
    let rewrite_listing = touched.iter().any(|k| match (old_of(k), new_of(k)) {
        (Some(o), Some(n)) => Shape::new(k, o).listed(&ctx) != Shape::new(k, n).listed(&ctx),
        _ => true,
    });
    if rewrite_listing {
        // Only now is the whole new family needed: the listing chains name every port.
        let mut new = held.clone();
        new.apply(diff);
        commits(&mut r, &new, &ctx, changed(), stale, batch, true);
    } else {
        commits(&mut r, held, &ctx, changed(), stale, batch, false);
    }
    r.text(&header)
}

/// The part of `diff` (a whole plan's) that `family`'s tables hold: its service ports. The
/// node-wide flag is kept as it is (a change of either family's settings sets it).
pub fn family_diff(diff: &PlanDiff, family: IpFamily) -> PlanDiff {
    let ours = |k: &&ServicePortKey| k.family == family;
    let mut d = PlanDiff::default();
    d.added = clone_where(&diff.added, ours);
    d.removed = clone_where(&diff.removed, ours);
    d.changed = clone_where(&diff.changed, ours);
    d.globals_changed = diff.globals_changed;
    d
}

fn clone_where<V: Clone>(
    m: &BTreeMap<ServicePortKey, V>,
    keep: impl Fn(&&ServicePortKey) -> bool,
) -> BTreeMap<ServicePortKey, V> {
    m.iter()
        .filter(|(k, _)| keep(k))
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect()
}

/// `held.diff(&family_view(plan, family))` without building the view: the two service maps
/// are walked side by side (pointer comparisons for the ports the planner left alone), and
/// only the ports that differ are copied. `globals_changed` says whether this family's
/// node-wide settings differ from `held`'s.
pub fn diff_to_plan(held: &Plan, plan: &Plan, family: IpFamily) -> PlanDiff {
    let mut d = PlanDiff::default();
    let mut old_it = held.services.iter().peekable();
    let mut new_it = plan
        .services
        .iter()
        .filter(|(k, _)| k.family == family)
        .peekable();
    loop {
        let order = match (old_it.peek(), new_it.peek()) {
            (None, None) => break,
            (Some(_), None) => Ordering::Less,
            (None, Some(_)) => Ordering::Greater,
            (Some((ok, _)), Some((nk, _))) => ok.cmp(nk),
        };
        match order {
            Ordering::Less => {
                let (k, v) = old_it.next().expect("peeked");
                d.removed.insert(k.clone(), v.clone());
            }
            Ordering::Greater => {
                let (k, v) = new_it.next().expect("peeked");
                d.added.insert(k.clone(), v.clone());
            }
            Ordering::Equal => {
                let ((k, ov), (_, nv)) = (
                    old_it.next().expect("peeked"),
                    new_it.next().expect("peeked"),
                );
                if !Arc::ptr_eq(ov, nv) && ov != nv {
                    let (old, new) = (ov.clone(), nv.clone());
                    d.changed.insert(k.clone(), Changed { old, new });
                }
            }
        }
    }
    let cidrs: Vec<IpNet> = plan
        .cluster_cidrs
        .iter()
        .filter(|n| IpFamily::of_net(n) == family)
        .map(|n| n.trunc())
        .collect();
    d.globals_changed = held.node_port_addresses(family) != plan.node_port_addresses(family)
        || held.cluster_cidrs != cidrs
        || held.masquerade_all != plan.masquerade_all;
    d
}

/// The nat chains a full render of `plan` declares for its service ports (for tests and
/// diagnostics).
pub fn service_chain_names(plan: &Plan, family: IpFamily, o: &IptablesOptions) -> BTreeSet<String> {
    let view = family_view(plan, family);
    let ctx = Ctx::new(&view, family, o);
    view.services
        .iter()
        .flat_map(|(k, sp)| chain_names(k, sp, &ctx))
        .collect()
}
