//! [`IpvsBackend`]: applies the rendered state to the calling thread's network namespace.

use std::collections::{BTreeMap, BTreeSet, HashSet};
use std::io::Write;
use std::net::IpAddr;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use ipnet::IpNet;
use weir_kernel::{sysctl, Rtnl};
use weir_model::{IpFamily, NodePortAddresses, Plan, PlanDiff, ServicePortKey};

use super::diff::{requests, Draining, ObservedService};
use super::incremental::Rendering;
use super::ipset::Ipset;
use super::netlink::{set_timeouts, Ipvs, Request, ServiceKey, ServiceSpec};
use super::render::{
    ipset_rebuild, ipset_update, set_names, Desired, EntryChange, IpvsOptions, VirtualServer,
    CHAINS, DUMMY, JUMPS, KUBE_MARK_MASQ,
};
use crate::backend::{Backend, Error, Result, SyncKind, SyncReport};
use crate::iptables::restore::{Restore, Table};
use crate::iptables::tools;

/// The ipvs mode (kube-proxy's layout; see the [module](super) documentation).
///
/// * A **full** sync (the first of a process, after a failure, after
///   [`invalidate`](Backend::invalidate), or when [`intact`](Backend::intact) or a sync
///   found something changed behind weir's back) dumps every virtual server and real server
///   and changes only what differs, rebuilds every ipset under a temporary name and swaps it
///   in, and replaces weir's iptables chains in one restore per table: a restart breaks no
///   connection.
/// * A **partial** sync given the planner's diff ([`sync_diff`](Backend::sync_diff)) renders
///   only the service ports it names ([`Rendering::update`]) and touches only what that
///   changed: ipset entries over netlink, the iptables chains if their text changed, the
///   changed virtual servers (fetched one by one, with those still draining), and
///   `kube-ipvs0`'s changed addresses. Nothing it does grows with the cluster. Without a diff
///   (or after a global change) a sync renders everything, dumps every virtual server and
///   address, and compares.
/// * [`intact`](Backend::intact), every `--sync-period`, checks what partial syncs do not
///   look at: `kube-ipvs0` and its addresses, every virtual server, the node addresses the
///   NodePorts were rendered for, and the nat `KUBE-MARK-MASQ` rule.
pub struct IpvsBackend {
    opts: IpvsOptions,
    applied: BTreeMap<IpFamily, Rendering>,
    /// Each family's `nodePortAddresses` of the last full rendering: [`Backend::intact`]
    /// checks that the node's addresses still give the NodePort addresses it was rendered for.
    node_ports: BTreeMap<IpFamily, NodePortAddresses>,
    draining: Draining,
    /// Whether the sysctls were ensured since the last full sync, with IPv6 forwarding or
    /// without ([`sysctls`]).
    sysctls_v6: Option<bool>,
}

impl IpvsBackend {
    pub fn new(opts: IpvsOptions) -> Self {
        IpvsBackend {
            opts,
            applied: BTreeMap::new(),
            node_ports: BTreeMap::new(),
            draining: Draining::new(),
            sysctls_v6: None,
        }
    }

    pub fn options(&self) -> &IpvsOptions {
        &self.opts
    }

    fn sync_with(&mut self, plan: &Plan, diff: Option<&PlanDiff>) -> Result<SyncReport> {
        let start = Instant::now();
        match self.sync_all(plan, diff) {
            Ok((kind, touched)) => Ok(SyncReport {
                kind,
                elapsed: start.elapsed(),
                service_ports_touched: touched,
            }),
            Err(e) => {
                self.applied.clear();
                Err(e)
            }
        }
    }

    /// Every virtual server the last sync left is still in the kernel (`held`).
    fn holds_applied(&self, held: &HashSet<ServiceKey>) -> bool {
        self.applied
            .values()
            .all(|r| r.desired.services.keys().all(|k| held.contains(k)))
    }

    /// `diff`: `applied`'s plan to `plan`, when the caller knows it ([`Backend::sync_diff`]).
    fn sync_all(&mut self, plan: &Plan, diff: Option<&PlanDiff>) -> Result<(SyncKind, usize)> {
        let mut rtnl = Rtnl::new()?;
        let (dummy, dummy_created) = ensure_dummy(&mut rtnl)?;
        if dummy_created && !self.applied.is_empty() {
            tracing::warn!("weir's kube-ipvs0 was deleted behind its back: full resync");
            self.applied.clear();
        }
        let mut ipvs = Ipvs::open()?;
        let every_family = self
            .opts
            .families
            .iter()
            .all(|f| self.applied.contains_key(f));
        let done = match diff {
            Some(d) if !d.globals_changed && every_family => {
                self.sync_changes(plan, d, &mut rtnl, dummy, &mut ipvs)
            }
            _ => self.sync_rendered(plan, &mut rtnl, dummy, &mut ipvs),
        }?;
        // IPv6 forwarding once an IPv6 virtual server is served: known after the sync (the
        // first IPv6 Service may also come in a partial one).
        let serves_v6 = self
            .applied
            .get(&IpFamily::V6)
            .is_some_and(|r| !r.desired.services.is_empty());
        if serves_v6 && self.sysctls_v6 != Some(true) {
            ensure_sysctls(true, self.opts.strict_arp)?;
            self.sysctls_v6 = Some(true);
        }
        Ok(done)
    }

    /// Renders every service port and compares with the last rendering (none: a full sync).
    /// Dumps every virtual server and address: a virtual server of the last sync gone means a
    /// full resync, and missing VIPs are added back.
    fn sync_rendered(
        &mut self,
        plan: &Plan,
        rtnl: &mut Rtnl,
        dummy: u32,
        ipvs: &mut Ipvs,
    ) -> Result<(SyncKind, usize)> {
        let services: Vec<(ServiceKey, _)> = ipvs
            .services()
            .map_err(|e| Error::Netlink(format!("IPVS list services: {e}")))?;
        let held: HashSet<ServiceKey> = services.iter().map(|(k, _)| *k).collect();
        if !self.applied.is_empty() && !self.holds_applied(&held) {
            tracing::warn!("weir's ipvs state was changed behind its back: full resync");
            self.applied.clear();
        }
        let full = self.applied.is_empty();
        let mut phases = Phases::default();
        if full {
            // Before any virtual server: IPVS connections need `vs.conntrack` for MASQUERADE.
            ensure_sysctls(false, self.opts.strict_arp)?;
            self.sysctls_v6 = Some(false);
            self.set_timeouts(ipvs)?;
        }
        let addrs = rtnl.addrs(None)?;
        let (on_dummy, on_node): (Vec<_>, Vec<_>) = addrs.iter().partition(|a| a.index == dummy);
        let kernel = Observed {
            services,
            held,
            dummy_addrs: on_dummy.iter().map(|a| a.net.addr()).collect(),
            node_addrs: on_node.iter().map(|a| a.net.addr()).collect(),
        };
        let mut touched = 0;
        let mut all_addresses = BTreeSet::new();
        let mut kinds = Vec::new();
        for family in self.opts.families.clone() {
            let (kind, sent) = self.sync_family(plan, family, &kernel, ipvs, &mut phases)?;
            touched += sent;
            kinds.push(kind);
            all_addresses.extend(self.applied[&family].desired.addresses.iter().copied());
        }
        // Addresses last: a VIP appears once its virtual server exists, and goes after it.
        let address_changes: Vec<(IpNet, bool)> = all_addresses
            .difference(&kernel.dummy_addrs)
            .map(|a| (IpNet::from(*a), true))
            .chain(
                (kernel.dummy_addrs.difference(&all_addresses)).map(|a| (IpNet::from(*a), false)),
            )
            .collect();
        let mut clock = Instant::now();
        rtnl.addrs_change(dummy, &address_changes)?;
        phases.addresses = lap(&mut clock);
        if full {
            phases.log(touched, address_changes.len());
        }
        let kind = if kinds.contains(&SyncKind::Full) {
            SyncKind::Full
        } else if kinds.contains(&SyncKind::Partial) {
            SyncKind::Partial
        } else {
            SyncKind::Noop
        };
        Ok((kind, touched))
    }

    /// One family of [`Self::sync_rendered`]: rendered, then ipsets (the rules name them),
    /// the rules, and the virtual servers that differ; returns the kind of sync it was and
    /// how many virtual servers it changed.
    fn sync_family(
        &mut self,
        plan: &Plan,
        family: IpFamily,
        kernel: &Observed,
        ipvs: &mut Ipvs,
        phases: &mut Phases,
    ) -> Result<(SyncKind, usize)> {
        let np = plan.node_port_addresses(family).clone();
        let node_ips = node_port_ips(&np, &kernel.node_addrs, family);
        let old = self.applied.remove(&family).map(|o| o.desired);
        let mut clock = Instant::now();
        let rendering = Rendering::full(plan, family, &node_ips, &self.opts);
        self.node_ports.insert(family, np);
        let desired = &rendering.desired;
        phases.render += lap(&mut clock);
        apply_sets(old.as_ref(), desired, family)?;
        phases.ipsets += lap(&mut clock);
        if old.as_ref().map(|o| &o.iptables) != Some(&desired.iptables) {
            tools::restore(family, &desired.iptables)?;
            if old.is_none() {
                ensure_jumps(family)?;
            }
        }
        phases.iptables += lap(&mut clock);
        let mut look = changed_servers(old.as_ref(), desired, kernel, family);
        look.extend(self.draining_keys(family));
        let mut observed = BTreeMap::new();
        for (k, spec) in kernel.services.iter().filter(|(k, _)| look.contains(k)) {
            observed.insert(*k, observe(ipvs, k, spec.clone())?);
        }
        let wanted: BTreeMap<ServiceKey, _> = desired
            .services
            .iter()
            .filter(|(k, _)| look.contains(k) || !kernel.held.contains(k))
            .map(|(k, v)| (*k, v.clone()))
            .collect();
        // What weir made before.
        let previous: BTreeSet<IpAddr> = old
            .iter()
            .flat_map(|o| o.services.keys().map(|k| k.addr))
            .collect();
        let exclude = self.opts.exclude_cidrs.clone();
        let owned = |k: &ServiceKey| {
            let ours = kernel.dummy_addrs.contains(&k.addr)
                || kernel.node_addrs.contains(&k.addr)
                || previous.contains(&k.addr);
            weir_owns(ours, k.addr, &exclude)
        };
        let sent = self.send(ipvs, &wanted, &observed, owned)?;
        phases.ipvs += lap(&mut clock);
        let kind = match &old {
            None => SyncKind::Full,
            Some(o) if sent == 0 && *o == rendering.desired => SyncKind::Noop,
            Some(_) => SyncKind::Partial,
        };
        self.applied.insert(family, rendering);
        Ok((kind, sent))
    }

    /// A partial sync from the planner's diff: each family's rendering is updated for the
    /// service ports `diff` names ([`Rendering::update`]), and only what that changed is
    /// looked at and sent — ipset entries over netlink, the iptables chains if their text
    /// changed, the changed virtual servers fetched one by one, `kube-ipvs0`'s changed
    /// addresses — so its cost follows the change, not the cluster. What no change touches
    /// (node addresses, every other virtual server and VIP, the iptables chains) is
    /// [`intact`](Backend::intact)'s, which the agent runs every `--sync-period`.
    fn sync_changes(
        &mut self,
        plan: &Plan,
        diff: &PlanDiff,
        rtnl: &mut Rtnl,
        dummy: u32,
        ipvs: &mut Ipvs,
    ) -> Result<(SyncKind, usize)> {
        let keys: Vec<&ServicePortKey> = diff
            .added
            .keys()
            .chain(diff.removed.keys())
            .chain(diff.changed.keys())
            .collect();
        let mut touched = 0;
        let mut addresses = Vec::new();
        let mut changed = false;
        for family in self.opts.families.clone() {
            let mut rendering = self.applied.remove(&family).expect("every family rendered");
            let c = rendering.update(plan, keys.iter().copied(), &self.opts);
            apply_entries(&c.ipset)?;
            if c.iptables_changed {
                tools::restore(family, &rendering.desired.iptables)?;
            }
            let mut look: BTreeSet<ServiceKey> = c.servers.clone();
            look.extend(self.draining_keys(family));
            let mut observed = BTreeMap::new();
            for k in &look {
                let spec = ipvs
                    .service(k)
                    .map_err(|e| Error::Netlink(format!("IPVS get {k}: {e}")))?;
                if let Some(spec) = spec {
                    observed.insert(*k, observe(ipvs, k, spec)?);
                }
            }
            let wanted: BTreeMap<ServiceKey, _> = look
                .iter()
                .filter_map(|k| Some((*k, rendering.desired.services.get(k)?.clone())))
                .collect();
            // Every server looked at is weir's: one it changed, or one still draining.
            let sent = self.send(ipvs, &wanted, &observed, |_| true)?;
            touched += sent;
            changed |= sent > 0 || !c.is_empty();
            addresses.extend(c.addresses.iter().copied());
            self.applied.insert(family, rendering);
        }
        // Addresses last: a VIP appears once its virtual server exists, and goes after it.
        let address_changes: Vec<(IpNet, bool)> = addresses
            .into_iter()
            .map(|(a, add)| (IpNet::from(a), add))
            .collect();
        rtnl.addrs_change(dummy, &address_changes)?;
        let kind = if changed {
            SyncKind::Partial
        } else {
            SyncKind::Noop
        };
        Ok((kind, touched))
    }

    /// The virtual servers of `family` with real servers still draining.
    fn draining_keys(&self, family: IpFamily) -> Vec<ServiceKey> {
        self.draining
            .keys()
            .map(|(k, _, _)| *k)
            .filter(|k| k.family() == family)
            .collect()
    }

    /// Sends the requests turning `observed` into `wanted`; returns how many virtual servers
    /// they changed.
    fn send(
        &mut self,
        ipvs: &mut Ipvs,
        wanted: &BTreeMap<ServiceKey, VirtualServer>,
        observed: &BTreeMap<ServiceKey, ObservedService>,
        owned: impl Fn(&ServiceKey) -> bool,
    ) -> Result<usize> {
        let reqs = requests(
            wanted,
            observed,
            owned,
            &mut self.draining,
            Instant::now(),
            self.opts.graceful_termination_timeout,
        );
        ipvs.request_all(&reqs)
            .map_err(|(i, e)| Error::Netlink(format!("IPVS {:?}: {e}", reqs[i])))?;
        Ok(reqs.iter().map(request_key).collect::<BTreeSet<_>>().len())
    }

    fn set_timeouts(&self, ipvs: &mut Ipvs) -> Result<()> {
        let o = &self.opts;
        if (o.tcp_timeout, o.tcp_fin_timeout, o.udp_timeout) == (0, 0, 0) {
            return Ok(());
        }
        ipvs.send_payload(set_timeouts(
            o.tcp_timeout,
            o.tcp_fin_timeout,
            o.udp_timeout,
        ))
        .map_err(|e| Error::Netlink(format!("IPVS timeouts: {e}")))
    }
}

/// A virtual server as the kernel has it: `spec` and its real servers.
fn observe(ipvs: &mut Ipvs, k: &ServiceKey, spec: ServiceSpec) -> Result<ObservedService> {
    let real_servers = ipvs
        .dests(k)
        .map_err(|e| Error::Netlink(format!("IPVS list real servers of {k}: {e}")))?;
    Ok(ObservedService { spec, real_servers })
}

/// What a full comparison reads from the kernel once, for every family.
struct Observed {
    /// Every virtual server, with its spec.
    services: Vec<(ServiceKey, ServiceSpec)>,
    held: HashSet<ServiceKey>,
    /// The addresses on `kube-ipvs0`.
    dummy_addrs: BTreeSet<IpAddr>,
    /// Every other local address.
    node_addrs: Vec<IpAddr>,
}

/// The family's ipsets: every one rebuilt under a temporary name and swapped in on a full
/// sync (`old` is `None`), else the entries that changed.
fn apply_sets(old: Option<&Desired>, desired: &Desired, family: IpFamily) -> Result<()> {
    match old {
        None => {
            let rebuild = ipset_rebuild(&desired.ipsets, family);
            run_tool("ipset", &["restore"], &rebuild.create)?;
            apply_entries(&rebuild.fill)?;
            run_tool("ipset", &["restore"], &rebuild.swap)
        }
        Some(o) => apply_entries(&ipset_update(&o.ipsets, &desired.ipsets)),
    }
}

/// Which virtual servers to look at: all of the family's on a full sync, else those whose
/// rendering changed (the caller adds those still draining).
fn changed_servers(
    old: Option<&Desired>,
    desired: &Desired,
    kernel: &Observed,
    family: IpFamily,
) -> BTreeSet<ServiceKey> {
    match old {
        None => (kernel.services.iter())
            .map(|(k, _)| *k)
            .filter(|k| k.family() == family)
            .collect(),
        Some(o) => {
            let mut look: BTreeSet<ServiceKey> = (desired.services.iter())
                .filter(|(k, vs)| o.services.get(k) != Some(*vs))
                .map(|(k, _)| *k)
                .collect();
            look.extend(
                o.services
                    .keys()
                    .filter(|k| !desired.services.contains_key(k)),
            );
            look
        }
    }
}

/// Adds and deletes ipset entries over netlink (no socket when there are none).
fn apply_entries(changes: &[EntryChange]) -> Result<()> {
    if changes.is_empty() {
        return Ok(());
    }
    Ipset::open()?.apply(changes)
}

fn request_key(r: &Request) -> ServiceKey {
    match r {
        Request::NewService(k, _)
        | Request::SetService(k, _)
        | Request::DelService(k)
        | Request::NewDest(k, _)
        | Request::SetDest(k, _)
        | Request::DelDest(k, _) => *k,
    }
}

/// The addresses NodePorts are served on: kube-proxy takes every local address of the
/// family except the dummy's (filtered by the caller) and loopback / link-local ones.
pub fn node_port_ips(np: &NodePortAddresses, local: &[IpAddr], family: IpFamily) -> Vec<IpAddr> {
    let usable = |a: &IpAddr| {
        IpFamily::of(a) == family
            && !a.is_loopback()
            && !matches!(a, IpAddr::V6(v6) if v6.segments()[0] & 0xffc0 == 0xfe80)
    };
    let mut out: Vec<IpAddr> = match np {
        NodePortAddresses::None => vec![],
        NodePortAddresses::AllLocal => local.iter().copied().filter(usable).collect(),
        NodePortAddresses::List(l) => l.iter().copied().filter(usable).collect(),
    };
    out.sort();
    out.dedup();
    out
}

/// `conn_reuse_mode` as kube-proxy sets it by kernel release: 0 on 4.1 ≤ kernel < 5.9
/// (where 1 dropped the first SYN of a reused source port for a second), left alone
/// otherwise (before 4.1 it does not exist; from 5.9 the default is right).
pub fn conn_reuse_mode(release: &str) -> Option<&'static str> {
    let mut it = release
        .split(|c: char| !c.is_ascii_digit())
        .filter_map(|p| p.parse::<u32>().ok());
    let v = (it.next()?, it.next().unwrap_or(0));
    ((4, 1)..(5, 9)).contains(&v).then_some("0")
}

/// Whether a virtual server at `addr` is weir's to delete when no plan wants it: `ours` (on
/// its dummy, on a node address, or one it made) unless `ipvs.excludeCIDRs` holds the
/// address (kube-proxy never touches those either).
pub fn weir_owns(ours: bool, addr: IpAddr, exclude: &[IpNet]) -> bool {
    ours && !exclude.iter().any(|n| n.contains(&addr))
}

/// The sysctls ipvs mode needs, as (key, value): IPVS's own, forwarding, and
/// `conn_reuse_mode` by kernel `release` ([`conn_reuse_mode`]). `serves_v6`: the node has
/// IPv6 virtual servers, so IPv6 forwarding is needed as `ip_forward` is for IPv4: a masqueraded
/// real server's replies (and connections from pods, which arrive routed) cross FORWARD.
/// `strict_arp`: kube-proxy's `strictARP` (`arp_ignore=1`, `arp_announce=2` on every
/// interface).
pub fn sysctls(
    release: &str,
    serves_v6: bool,
    strict_arp: bool,
) -> Vec<(&'static str, &'static str)> {
    let mut v = vec![
        ("net.ipv4.vs.conntrack", "1"),
        ("net.ipv4.vs.expire_nodest_conn", "1"),
        ("net.ipv4.vs.expire_quiescent_template", "1"),
        ("net.ipv4.ip_forward", "1"),
    ];
    if serves_v6 {
        v.push(("net.ipv6.conf.all.forwarding", "1"));
    }
    if let Some(m) = conn_reuse_mode(release) {
        v.push(("net.ipv4.vs.conn_reuse_mode", m));
    }
    if strict_arp {
        v.push(("net.ipv4.conf.all.arp_ignore", "1"));
        v.push(("net.ipv4.conf.all.arp_announce", "2"));
    }
    v
}

fn ensure_sysctls(serves_v6: bool, strict_arp: bool) -> Result<()> {
    let release = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default();
    for (k, v) in sysctls(release.trim(), serves_v6, strict_arp) {
        sysctl::ensure(k, v).map_err(|e| Error::Tool {
            tool: "sysctl".into(),
            detail: format!("{k}={v}: {e}"),
        })?;
    }
    Ok(())
}

/// Creates `kube-ipvs0` (a dummy, left down as kube-proxy leaves it) unless it exists;
/// returns its index and whether it had to be created.
fn ensure_dummy(rtnl: &mut Rtnl) -> Result<(u32, bool)> {
    if let Some(l) = rtnl.link_by_name(DUMMY)? {
        return Ok((l.index, false));
    }
    let msg = rtnetlink::LinkDummy::new(DUMMY).build();
    if let Err(e) = rtnl.link_add(msg, DUMMY) {
        if !e.is_exists() {
            return Err(e.into());
        }
    }
    Ok((rtnl.require_link(DUMMY)?.index, true))
}

/// Inserts the missing jumps: one `iptables-save` says which exist, one `iptables-restore
/// --noflush` inserts the others. (A process per rule, as `iptables -C`/`-I` would take, costs
/// seconds each under the test VM's emulation: with one per jump, the two lab nodes' first
/// syncs took 43 s.)
fn ensure_jumps(family: IpFamily) -> Result<()> {
    let script = missing_jumps(&tools::save(family, None)?);
    if !script.is_empty() {
        tools::restore(family, &script)?;
    }
    Ok(())
}

/// Pure: the `iptables-restore --noflush` input inserting each of [`JUMPS`] that `saved`
/// (an `iptables-save` of every table) lacks, so that they stand at the head of their chains in
/// [`JUMPS`]' order; empty when none is missing.
fn missing_jumps(saved: &str) -> String {
    let mut present: BTreeSet<(&str, &str)> = BTreeSet::new();
    let mut table = "";
    for line in saved.lines() {
        if let Some(t) = line.strip_prefix('*') {
            table = t.trim();
        } else {
            present.insert((table, line.trim_end()));
        }
    }
    let mut out = String::new();
    for t in [Table::Filter, Table::Nat] {
        let mut body = String::new();
        // Each goes first in its chain: inserting in reverse leaves JUMPS' order.
        for (_, chain, comment, target) in JUMPS.iter().rev().filter(|j| j.0 == t) {
            let rule = format!("-m comment --comment \"{comment}\" -j {target}");
            if !present.contains(&(t.name(), format!("-A {chain} {rule}").as_str())) {
                body += &format!("-I {chain} 1 {rule}\n");
            }
        }
        if !body.is_empty() {
            out += &format!("*{}\n{body}COMMIT\n", t.name());
        }
    }
    out
}

fn run_tool(bin: &str, args: &[&str], stdin: &str) -> Result<()> {
    let mut child = Command::new(bin)
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| Error::Tool {
            tool: bin.into(),
            detail: format!("cannot start: {e}"),
        })?;
    child
        .stdin
        .take()
        .expect("piped")
        .write_all(stdin.as_bytes())?;
    let out = child.wait_with_output()?;
    if out.status.success() {
        Ok(())
    } else {
        Err(Error::Tool {
            tool: format!("{bin} {}", args.join(" ")),
            detail: String::from_utf8_lossy(&out.stderr).trim().to_string(),
        })
    }
}

impl Backend for IpvsBackend {
    fn mode(&self) -> &'static str {
        "ipvs"
    }

    fn sync(&mut self, plan: &Plan) -> Result<SyncReport> {
        self.sync_with(plan, None)
    }

    /// Renders only the service ports `diff` names (see [`Rendering::update`]).
    fn sync_diff(&mut self, plan: &Plan, diff: &PlanDiff) -> Result<SyncReport> {
        self.sync_with(plan, Some(diff))
    }

    /// `kube-ipvs0` exists with every VIP, the kernel holds every virtual server weir made,
    /// the node's addresses still give the NodePort addresses of the last rendering, and the
    /// nat `KUBE-MARK-MASQ` chain (emptied by any nat flush) still has its rule.
    fn intact(&mut self) -> Result<bool> {
        if self.applied.is_empty() {
            return Ok(true);
        }
        let mut rtnl = Rtnl::new()?;
        let Some(dummy) = rtnl.link_by_name(DUMMY)? else {
            return Ok(false);
        };
        let held: HashSet<ServiceKey> = Ipvs::open()?
            .services()
            .map_err(|e| Error::Netlink(format!("IPVS list services: {e}")))?
            .into_iter()
            .map(|(k, _)| k)
            .collect();
        if !self.holds_applied(&held) {
            return Ok(false);
        }
        let addrs = rtnl.addrs(None)?;
        let vips: HashSet<IpAddr> = addrs
            .iter()
            .filter(|a| a.index == dummy.index)
            .map(|a| a.net.addr())
            .collect();
        let node_addrs: Vec<IpAddr> = addrs
            .iter()
            .filter(|a| a.index != dummy.index)
            .map(|a| a.net.addr())
            .collect();
        for (family, r) in &self.applied {
            if !r.desired.addresses.iter().all(|a| vips.contains(a)) {
                return Ok(false);
            }
            let np = self.node_ports.get(family).cloned().unwrap_or_default();
            if !r.serves(&node_port_ips(&np, &node_addrs, *family)) {
                tracing::info!(
                    ?family,
                    "the node's NodePort addresses changed: full resync"
                );
                return Ok(false);
            }
            let masq = tools::list_chain(*family, Table::Nat, KUBE_MARK_MASQ, None)?;
            if !masq.is_some_and(|t| t.lines().any(|l| l.starts_with("-A "))) {
                return Ok(false);
            }
        }
        Ok(true)
    }

    fn invalidate(&mut self) {
        self.applied.clear();
    }

    /// Removes the jumps, chains, virtual servers on weir's addresses, ipsets and
    /// `kube-ipvs0`; absence is not an error.
    fn cleanup(&mut self) -> Result<()> {
        let previous: BTreeSet<IpAddr> = self
            .applied
            .values()
            .flat_map(|r| r.desired.services.keys().map(|k| k.addr))
            .collect();
        self.applied.clear();
        self.draining.clear();
        let mut rtnl = Rtnl::new()?;
        let dummy = rtnl.link_by_name(DUMMY)?;
        let dummy_addrs: BTreeSet<IpAddr> = match &dummy {
            Some(l) => rtnl
                .addrs(Some(l.index))?
                .iter()
                .map(|a| a.net.addr())
                .collect(),
            None => BTreeSet::new(),
        };
        // No IPVS in the kernel: no virtual servers to remove.
        if let Ok(mut ipvs) = Ipvs::open() {
            let node: BTreeSet<IpAddr> = rtnl.addrs(None)?.iter().map(|a| a.net.addr()).collect();
            let exclude = &self.opts.exclude_cidrs;
            for (k, _) in ipvs.services().map_err(|e| Error::Netlink(e.to_string()))? {
                let ours = dummy_addrs.contains(&k.addr)
                    || previous.contains(&k.addr)
                    || node.contains(&k.addr);
                if weir_owns(ours, k.addr, exclude) {
                    ipvs.request(&Request::DelService(k))
                        .map_err(|e| Error::Netlink(format!("IPVS delete {k}: {e}")))?;
                }
            }
        }
        for family in self.opts.families.clone() {
            if !tools::available(family) {
                continue;
            }
            for (table, chain, comment, target) in JUMPS {
                let args = ["-m", "comment", "--comment", comment, "-j", target];
                while tools::delete_rule(family, *table, chain, &args) {}
            }
            let Ok(saved) = tools::save(family, None) else {
                continue;
            };
            let present = tools::chains_in_save(&saved);
            let mut r = Restore::default();
            let mut any = false;
            for (t, c) in CHAINS {
                if present.get(t.name()).is_some_and(|cs| cs.contains(*c)) {
                    r.delete(*t, c);
                    any = true;
                }
            }
            if any {
                tools::restore(family, &r.text("weir ipvs cleanup"))?;
            }
            // Sets go once no rule names them.
            let listed = Command::new("ipset").args(["list", "-n"]).output();
            if let Ok(out) = listed {
                let have: BTreeSet<String> = String::from_utf8_lossy(&out.stdout)
                    .lines()
                    .map(str::to_string)
                    .collect();
                let script: String = set_names(family)
                    .into_iter()
                    .filter(|n| have.contains(n))
                    .map(|n| format!("destroy {n}\n"))
                    .collect();
                if !script.is_empty() {
                    run_tool("ipset", &["restore"], &script)?;
                }
            }
        }
        rtnl.link_del_by_name(DUMMY)?;
        Ok(())
    }
}

impl From<weir_kernel::NlError> for Error {
    fn from(e: weir_kernel::NlError) -> Self {
        Error::Netlink(e.to_string())
    }
}

/// Time spent per phase of a sync that renders everything, summed over the families.
#[derive(Default)]
struct Phases {
    render: Duration,
    ipsets: Duration,
    iptables: Duration,
    ipvs: Duration,
    addresses: Duration,
}

impl Phases {
    /// Where a full sync's time went (the figures docs/benchmarks.md reports).
    fn log(&self, touched: usize, addresses: usize) {
        tracing::info!(
            render_ms = ms(self.render),
            ipsets_ms = ms(self.ipsets),
            iptables_ms = ms(self.iptables),
            ipvs_ms = ms(self.ipvs),
            addresses_ms = ms(self.addresses),
            virtual_servers_touched = touched,
            addresses,
            "full sync phases"
        );
    }
}

/// The time since `clock`, which then restarts.
fn lap(clock: &mut Instant) -> Duration {
    let now = Instant::now();
    let lap = now - *clock;
    *clock = now;
    lap
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn missing_jumps_are_inserted_in_one_restore_and_present_ones_left() {
        // A fresh node: every jump, first in its chain, in JUMPS' order per chain.
        let all = missing_jumps("*nat\n:OUTPUT ACCEPT [0:0]\nCOMMIT\n*filter\nCOMMIT\n");
        assert_eq!(
            all,
            "*filter
-I OUTPUT 1 -m comment --comment \"kubernetes ipvs access filter\" -j KUBE-IPVS-OUT-FILTER
-I INPUT 1 -m comment --comment \"kubernetes ipvs access filter\" -j KUBE-IPVS-FILTER
-I FORWARD 1 -m comment --comment \"kube-proxy firewall rules\" -j KUBE-PROXY-FIREWALL
-I INPUT 1 -m comment --comment \"kube-proxy firewall rules\" -j KUBE-PROXY-FIREWALL
-I INPUT 1 -m comment --comment \"kubernetes health check rules\" -j KUBE-NODE-PORT
-I FORWARD 1 -m comment --comment \"kubernetes forwarding rules\" -j KUBE-FORWARD
COMMIT
*nat
-I POSTROUTING 1 -m comment --comment \"kubernetes postrouting rules\" -j KUBE-POSTROUTING
-I PREROUTING 1 -m comment --comment \"kubernetes service portals\" -j KUBE-SERVICES
-I OUTPUT 1 -m comment --comment \"kubernetes service portals\" -j KUBE-SERVICES
COMMIT
"
        );
        // Present ones (as iptables-save prints them) are not inserted again; the same rule
        // text in another table does not count.
        let saved = "*nat
-A PREROUTING -m comment --comment \"kubernetes service portals\" -j KUBE-SERVICES
-A OUTPUT -m comment --comment \"kubernetes service portals\" -j KUBE-SERVICES
-A POSTROUTING -m comment --comment \"kubernetes postrouting rules\" -j KUBE-POSTROUTING
COMMIT
*filter
-A INPUT -m comment --comment \"kubernetes health check rules\" -j KUBE-NODE-PORT
-A INPUT -m comment --comment \"kube-proxy firewall rules\" -j KUBE-PROXY-FIREWALL
-A FORWARD -m comment --comment \"kube-proxy firewall rules\" -j KUBE-PROXY-FIREWALL
-A INPUT -m comment --comment \"kubernetes ipvs access filter\" -j KUBE-IPVS-FILTER
-A OUTPUT -m comment --comment \"kubernetes ipvs access filter\" -j KUBE-IPVS-OUT-FILTER
COMMIT
";
        assert_eq!(
            missing_jumps(saved),
            "*filter\n-I FORWARD 1 -m comment --comment \"kubernetes forwarding rules\" -j KUBE-FORWARD\nCOMMIT\n"
        );
        let complete = saved.replace(
            "*filter\n",
            "*filter\n-A FORWARD -m comment --comment \"kubernetes forwarding rules\" -j KUBE-FORWARD\n",
        );
        assert_eq!(missing_jumps(&complete), "");
    }

    #[test]
    fn ipv6_forwarding_is_ensured_when_ipv6_is_served() {
        let v6 = ("net.ipv6.conf.all.forwarding", "1");
        let served = sysctls("6.1.0-41-amd64", true, false);
        assert!(served.contains(&v6), "{served:?}");
        assert!(served.contains(&("net.ipv4.ip_forward", "1")), "{served:?}");
        // An IPv4-only node's IPv6 forwarding is left alone (turning it on stops the
        // acceptance of router advertisements where accept_ra is 1).
        assert!(!sysctls("6.1.0-41-amd64", false, false).contains(&v6));
        assert!(sysctls("5.4.0", false, false).contains(&("net.ipv4.vs.conn_reuse_mode", "0")));
    }

    #[test]
    fn strict_arp_sets_arp_ignore_and_arp_announce() {
        let arp = [
            ("net.ipv4.conf.all.arp_ignore", "1"),
            ("net.ipv4.conf.all.arp_announce", "2"),
        ];
        let strict = sysctls("6.1.0", false, true);
        assert!(arp.iter().all(|a| strict.contains(a)), "{strict:?}");
        let lax = sysctls("6.1.0", false, false);
        assert!(!lax.iter().any(|(k, _)| k.contains("arp_")), "{lax:?}");
    }

    #[test]
    fn exclude_cidrs_protect_virtual_servers_from_deletion() {
        let ip = |s: &str| s.parse::<IpAddr>().unwrap();
        assert!(weir_owns(true, ip("192.168.1.10"), &[]));
        // Not on weir's addresses: someone else's, never deleted.
        assert!(!weir_owns(false, ip("192.168.1.10"), &[]));
        let exclude: Vec<IpNet> = vec!["192.168.1.0/24".parse().unwrap()];
        assert!(!weir_owns(true, ip("192.168.1.10"), &exclude));
        assert!(weir_owns(true, ip("192.168.2.10"), &exclude));
    }

    #[test]
    fn conn_reuse_mode_follows_the_kernel_version() {
        assert_eq!(conn_reuse_mode("4.0.9"), None);
        assert_eq!(conn_reuse_mode("4.19.0-25-amd64"), Some("0"));
        assert_eq!(conn_reuse_mode("5.8.18"), Some("0"));
        assert_eq!(conn_reuse_mode("5.9.0"), None);
        assert_eq!(conn_reuse_mode("6.1.0-41-amd64"), None);
        assert_eq!(conn_reuse_mode("garbage"), None);
    }

    #[test]
    fn node_ports_skip_loopback_link_local_and_the_other_family() {
        let local: Vec<IpAddr> = [
            "127.0.0.1",
            "10.0.0.5",
            "fe80::1",
            "2001:db8::5",
            "10.0.0.5",
        ]
        .iter()
        .map(|s| s.parse().unwrap())
        .collect();
        let v4 = node_port_ips(&NodePortAddresses::AllLocal, &local, IpFamily::V4);
        assert_eq!(v4, vec!["10.0.0.5".parse::<IpAddr>().unwrap()]);
        let v6 = node_port_ips(&NodePortAddresses::AllLocal, &local, IpFamily::V6);
        assert_eq!(v6, vec!["2001:db8::5".parse::<IpAddr>().unwrap()]);
        assert!(node_port_ips(&NodePortAddresses::None, &local, IpFamily::V4).is_empty());
    }
}
