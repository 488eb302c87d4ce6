//! A node's state as the outputs add up to: read from a directory (what `weir trace collect`
//! writes, or files an operator saved by hand) or from live outputs, with what was missing,
//! skipped or assumed written down.

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::path::Path;

use serde::Serialize;

use crate::iproute::{self, Address, Link, Neighbour, PolicyRule, Route};
use crate::iptables::{self, Dump};
use crate::nft::{self, Ruleset};
use crate::sysctl::{self, Sysctls};
use crate::Skipped;

/// The file a live collection ([`crate::live::write_collection`]) lists its commands in; not an
/// output, so [`NodeState::from_dir`] skips it.
pub const MANIFEST_FILE: &str = "manifest.json";

/// One output an operator pastes, and the file it is saved as.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Output {
    IptablesSave,
    Ip6tablesSave,
    NftRuleset,
    IpsetList,
    IpRule,
    IpRoute,
    /// `ip -6 rule`: IPv6 policy rules (a family of their own: `ip rule` shows IPv4's only).
    Ip6Rule,
    /// `ip -6 route show table all`: IPv6 routes (`ip route` shows IPv4's only).
    Ip6Route,
    IpLink,
    IpAddr,
    IpNeigh,
    IpvsadmLn,
    Sysctl,
    ConntrackStats,
    /// `conntrack -L`: the connections (read for stale NAT bindings). Not collected by `weir
    /// trace collect` (it can be large); read when pasted.
    ConntrackList,
    /// `ip route get` answers under their commands: single lookups the kernel made. Pasted only.
    IpRouteGet,
    /// `ipvsadm -Lnc`: IPVS's connection entries. Pasted only.
    IpvsadmConns,
    /// Bridge ports' sysfs `hairpin_mode`. Pasted only.
    HairpinMode,
    /// The kernel log (`dmesg`): its martian-source lines. Pasted only.
    KernelLog,
    /// The pod's own `ip addr` (its address, and its eth0's peer index: the host veth).
    PodIpAddr,
    /// The pod's `/etc/resolv.conf`.
    PodResolvConf,
}

impl Output {
    pub const ALL: [Output; 21] = [
        Output::IptablesSave,
        Output::Ip6tablesSave,
        Output::NftRuleset,
        Output::IpsetList,
        Output::IpRule,
        Output::IpRoute,
        Output::Ip6Rule,
        Output::Ip6Route,
        Output::IpLink,
        Output::IpAddr,
        Output::IpNeigh,
        Output::IpvsadmLn,
        Output::Sysctl,
        Output::ConntrackStats,
        Output::ConntrackList,
        Output::IpRouteGet,
        Output::IpvsadmConns,
        Output::HairpinMode,
        Output::KernelLog,
        Output::PodIpAddr,
        Output::PodResolvConf,
    ];

    /// The file name `weir trace collect` writes.
    pub fn file_name(self) -> &'static str {
        match self {
            Output::IptablesSave => "iptables-save.txt",
            Output::Ip6tablesSave => "ip6tables-save.txt",
            Output::NftRuleset => "nft-ruleset.json",
            Output::IpsetList => "ipset-list.txt",
            Output::IpRule => "ip-rule.json",
            Output::IpRoute => "ip-route.json",
            Output::Ip6Rule => "ip6-rule.json",
            Output::Ip6Route => "ip6-route.json",
            Output::IpLink => "ip-link.json",
            Output::IpAddr => "ip-addr.json",
            Output::IpNeigh => "ip-neigh.json",
            Output::IpvsadmLn => "ipvsadm-Ln.txt",
            Output::Sysctl => "sysctl.txt",
            Output::ConntrackStats => "conntrack-stats.txt",
            Output::ConntrackList => "conntrack-L.txt",
            Output::IpRouteGet => "ip-route-get.txt",
            Output::IpvsadmConns => "ipvsadm-Lnc.txt",
            Output::HairpinMode => "hairpin_mode.txt",
            Output::KernelLog => "dmesg.txt",
            Output::PodIpAddr => "pod-ip-addr.txt",
            Output::PodResolvConf => "pod-resolv.conf",
        }
    }

    /// Names a hand-made directory may use instead (compared without the extension): the
    /// command line with spaces or dashes, as people name their pastes.
    fn stems(self) -> &'static [&'static str] {
        match self {
            Output::IptablesSave => &[
                "iptables-save",
                "iptables",
                "iptables-nft-save",
                "iptables-legacy-save",
                "iptables-S",
            ],
            Output::Ip6tablesSave => &[
                "ip6tables-save",
                "ip6tables",
                "ip6tables-nft-save",
                "ip6tables-legacy-save",
            ],
            Output::NftRuleset => &[
                "nft-ruleset",
                "nft",
                "nft-list-ruleset",
                "nft-j-list-ruleset",
            ],
            Output::IpsetList => &["ipset-list", "ipset", "ipset-save"],
            Output::IpRule => &["ip-rule", "ip-rule-show", "ip-j-rule"],
            Output::IpRoute => &[
                "ip-route",
                "ip-route-show-table-all",
                "ip-j-route",
                "ip-route-show",
            ],
            Output::Ip6Rule => &["ip6-rule", "ip-6-rule", "ip-6-rule-show", "ip-6-j-rule"],
            Output::Ip6Route => &[
                "ip6-route",
                "ip-6-route",
                "ip-6-route-show-table-all",
                "ip-6-j-route",
                "ip-6-route-show",
            ],
            Output::IpLink => &["ip-link", "ip-d-link", "ip-j-d-link", "ip-link-show"],
            Output::IpAddr => &["ip-addr", "ip-a", "ip-j-addr", "ip-addr-show"],
            Output::IpNeigh => &["ip-neigh", "ip-n", "ip-j-neigh"],
            Output::IpvsadmLn => &[
                "ipvsadm-Ln",
                "ipvsadm",
                "ipvsadm-ln",
                "ipvsadm-Sn",
                "ipvsadm-save",
            ],
            Output::Sysctl => &["sysctl", "sysctl-a", "sysctls"],
            Output::ConntrackStats => &["conntrack-stats", "conntrack-S", "conntrack"],
            Output::ConntrackList => &["conntrack-L", "conntrack-list", "conntrack-L-n"],
            Output::IpRouteGet => &["ip-route-get", "ip-r-g", "ip-route-get-all"],
            Output::IpvsadmConns => &["ipvsadm-Lnc", "ipvsadm-Lcn", "ipvsadm-L-n-c"],
            Output::HairpinMode => &["hairpin-mode", "hairpin"],
            Output::KernelLog => &["dmesg", "dmesg-T", "journalctl-k"],
            Output::PodIpAddr => &[
                "pod-ip-addr",
                "pod-ip-a",
                "pod-addr",
                "ip-addr-pod",
                "ip-a-pod",
                "pod-ip-addr-show",
            ],
            Output::PodResolvConf => &[
                "pod-resolv.conf",
                "resolv.conf",
                "pod-resolv-conf",
                "pod-resolv",
                "resolv-conf",
            ],
        }
    }

    /// The output a file name stands for, if any.
    pub fn for_file_name(name: &str) -> Option<Output> {
        let stem = name
            .strip_suffix(".txt")
            .or_else(|| name.strip_suffix(".json"))
            .or_else(|| name.strip_suffix(".out"))
            .or_else(|| name.strip_suffix(".log"))
            .unwrap_or(name);
        let stem = stem.replace(['_', ' '], "-");
        Output::ALL
            .into_iter()
            .find(|o| o.stems().iter().any(|s| s.eq_ignore_ascii_case(&stem)))
    }
}

/// A saved output no part of which could be read: the file, where (a 1-based line, or the
/// element's index in a JSON array; none for the whole file) and what was expected.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Unreadable {
    #[serde(skip)]
    pub output: Output,
    /// The file's name (its path when read from a directory).
    pub file: String,
    pub line: Option<usize>,
    pub reason: String,
}

impl std::fmt::Display for Unreadable {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.line {
            Some(n) => write!(f, "{}: unreadable (line {n}: {})", self.file, self.reason),
            None => write!(f, "{}: unreadable ({})", self.file, self.reason),
        }
    }
}

/// A pod's side of its veth, from the pod's own `ip addr`, and the host interface it maps to.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct PodSide {
    pub addr: std::net::Ipv4Addr,
    /// The pod's interface (`eth0`).
    pub ifname: String,
    /// `eth0@if7`: the host-side peer's ifindex.
    pub peer_index: Option<u32>,
    /// The host veth: the node's link with the peer index, else the device of the node's route
    /// to the pod's address.
    pub host_iface: Option<String>,
    /// How the host veth was found, for the assumptions list.
    pub how: String,
}

#[derive(Debug, Clone, Default, Serialize)]
pub struct NodeState {
    pub iptables: Option<Dump>,
    pub ip6tables: Option<Dump>,
    pub nft: Option<Ruleset>,
    pub ipset: Option<String>,
    pub rules: Option<Vec<PolicyRule>>,
    pub routes: Option<Vec<Route>>,
    /// `ip -6 rule`: the IPv6 policy rules (IPv6 packets are routed by these, not `rules`).
    pub rules6: Option<Vec<PolicyRule>>,
    /// `ip -6 route show table all`: the IPv6 routes.
    pub routes6: Option<Vec<Route>>,
    pub links: Option<Vec<Link>>,
    pub addrs: Option<Vec<Address>>,
    pub neighbours: Option<Vec<Neighbour>>,
    pub ipvs: Option<String>,
    pub sysctls: Option<Sysctls>,
    pub conntrack_stats: Option<String>,
    /// `conntrack -L` entries.
    pub conntrack: Option<Vec<crate::conntrack::Entry>>,
    /// Pasted `ip route get` answers.
    pub route_gets: Option<Vec<crate::route_get::RouteGet>>,
    /// `ipvsadm -Lnc` connection entries.
    pub ipvs_conns: Option<Vec<crate::ipvs::Connection>>,
    /// Bridge ports' `hairpin_mode`.
    pub hairpin: Option<Vec<crate::hairpin::HairpinPort>>,
    /// Martian-source lines of a pasted kernel log.
    pub martians: Option<Vec<crate::kernel_log::Martian>>,
    /// The kernel log's `nf_conntrack: table full, dropping packet` lines, as pasted.
    pub conntrack_full: Option<Vec<String>>,
    /// Addresses learnt from the routes when `ip addr` is missing or cut (table local's
    /// `local` routes, `proto kernel` routes' `src`): see [`NodeState::local_addresses`].
    pub inferred_addrs: Vec<Address>,
    /// The pod a packet comes from, read from its own `ip addr` (`pod-ip-addr.txt`).
    pub pod: Option<PodSide>,
    /// The pod's resolv.conf (`pod-resolv.conf`), for doctor's pod-dns check.
    pub pod_resolv_conf: Option<String>,
    /// `ip addr` shows only part of the node: cut with grep, or one device's
    /// (`ip addr show eth0`).
    pub addrs_partial: bool,
    /// The sysctl output was cut with grep (`sysctl -a | grep rp_filter`).
    pub sysctls_cut: bool,
    /// What each parser left out, by output.
    pub skipped: Vec<(Output, Skipped)>,
    /// Outputs present but not read at all (not JSON, not the tool's format): left out as if
    /// not collected, so that the checks needing them cannot tell instead of passing.
    pub unreadable: Vec<Unreadable>,
    /// Guesses made for missing or partial input.
    pub assumptions: Vec<String>,
    /// The outputs that were there.
    pub present: Vec<Output>,
    /// Kubernetes objects (Namespaces, Pods, NetworkPolicies) found among the files, by
    /// content, for doctor's policy checks.
    #[serde(skip)]
    pub objects: Option<crate::objects::Objects>,
}

impl NodeState {
    /// Builds the state from outputs (each at most once; a later one replaces an earlier one).
    pub fn from_outputs(outputs: impl IntoIterator<Item = (Output, String)>) -> NodeState {
        let mut st = NodeState::default();
        let mut pod_text = None;
        let mut addrs_cut = false;
        let mut by_kind: BTreeMap<Output, String> = BTreeMap::new();
        for (o, text) in outputs {
            by_kind.insert(o, text);
        }
        for (o, text) in by_kind {
            let blank = text.trim().is_empty();
            addrs_cut |= st.note_paste(o, &text);
            let skipped = st.read_output(o, text, &mut pod_text);
            match skipped.first() {
                Some(first) if !blank && st.read_nothing(o) => st.forget(o, first),
                _ => st.present.push(o),
            }
            st.skipped.extend(skipped.into_iter().map(|s| (o, s)));
        }
        st.addrs_partial = addrs_cut;
        st.infer_addresses(addrs_cut);
        if let Some(text) = pod_text {
            st.pod = st.read_pod(&text);
        }
        st
    }

    /// Whether the parsed field of output `o` holds nothing (outputs kept as text: never).
    fn read_nothing(&self, o: Output) -> bool {
        fn none<T>(v: &Option<Vec<T>>) -> bool {
            v.as_ref().is_some_and(Vec::is_empty)
        }
        match o {
            Output::IptablesSave => self.iptables.as_ref().is_some_and(|d| d.tables.is_empty()),
            Output::Ip6tablesSave => self.ip6tables.as_ref().is_some_and(|d| d.tables.is_empty()),
            Output::NftRuleset => self.nft.as_ref().is_some_and(Ruleset::is_empty),
            Output::IpRule => none(&self.rules),
            Output::IpRoute => none(&self.routes),
            Output::Ip6Rule => none(&self.rules6),
            Output::Ip6Route => none(&self.routes6),
            Output::IpLink => none(&self.links),
            Output::IpAddr => none(&self.addrs),
            Output::IpNeigh => none(&self.neighbours),
            Output::Sysctl => self.sysctls.as_ref().is_some_and(|s| s.0.is_empty()),
            Output::ConntrackList => none(&self.conntrack),
            Output::IpRouteGet => none(&self.route_gets),
            Output::IpvsadmConns => none(&self.ipvs_conns),
            Output::HairpinMode => none(&self.hairpin),
            Output::KernelLog => none(&self.martians),
            _ => false,
        }
    }

    /// Leaves output `o` out, as if not collected (its parser read nothing of it), and says so.
    fn forget(&mut self, o: Output, first: &Skipped) {
        match o {
            Output::IptablesSave => self.iptables = None,
            Output::Ip6tablesSave => self.ip6tables = None,
            Output::NftRuleset => self.nft = None,
            Output::IpRule => self.rules = None,
            Output::IpRoute => self.routes = None,
            Output::Ip6Rule => self.rules6 = None,
            Output::Ip6Route => self.routes6 = None,
            Output::IpLink => self.links = None,
            Output::IpAddr => self.addrs = None,
            Output::IpNeigh => self.neighbours = None,
            Output::Sysctl => self.sysctls = None,
            Output::ConntrackList => self.conntrack = None,
            Output::IpRouteGet => self.route_gets = None,
            Output::IpvsadmConns => self.ipvs_conns = None,
            Output::HairpinMode => self.hairpin = None,
            Output::KernelLog => self.martians = None,
            _ => {}
        }
        self.unreadable.push(Unreadable {
            output: o,
            file: o.file_name().to_string(),
            line: (first.line > 0).then_some(first.line),
            reason: first.reason.clone(),
        });
    }

    /// What the paste itself tells of output `o`: a grep-cut sysctl listing, the paste's notes;
    /// true when the addresses are cut (grep, or one device's shown).
    fn note_paste(&mut self, o: Output, text: &str) -> bool {
        let pasted = crate::paste::lines(text);
        let mut addrs_cut = false;
        if o == Output::Sysctl && pasted.grep_cut {
            self.sysctls_cut = true;
        }
        if o == Output::IpAddr
            && (pasted.grep_cut || pasted.commands.iter().any(|c| shows_one_device(c)))
        {
            addrs_cut = true;
            if !pasted.grep_cut {
                self.assumptions.push(format!(
                    "{}: `{}` shows one device's addresses: the others are unknown",
                    o.file_name(),
                    pasted
                        .commands
                        .iter()
                        .find(|c| shows_one_device(c))
                        .expect("one")
                ));
            }
        }
        for note in pasted.notes() {
            self.assumptions.push(format!("{}: {note}", o.file_name()));
        }
        addrs_cut
    }

    /// Parses output `o` into its field (the pod's addresses into `pod_text`, read once the
    /// node's are known); the lines it could not read.
    fn read_output(
        &mut self,
        o: Output,
        text: String,
        pod_text: &mut Option<String>,
    ) -> Vec<Skipped> {
        match o {
            Output::IptablesSave | Output::Ip6tablesSave => {
                let p = iptables::parse(&text);
                let mut d = p.value;
                for a in d.assumptions.drain(..) {
                    self.assumptions.push(format!("{}: {a}", o.file_name()));
                }
                if o == Output::IptablesSave {
                    self.iptables = Some(d);
                } else {
                    self.ip6tables = Some(d);
                }
                p.skipped
            }
            Output::NftRuleset => {
                let p = nft::parse(&text);
                self.nft = Some(p.value);
                p.skipped
            }
            Output::IpRule => {
                let p = iproute::parse_rules(&text);
                self.rules = Some(p.value);
                p.skipped
            }
            Output::IpRoute => {
                let p = iproute::parse_routes(&text);
                self.routes = Some(p.value);
                p.skipped
            }
            Output::Ip6Rule => {
                let p = iproute::parse_rules(&text);
                self.rules6 = Some(p.value);
                p.skipped
            }
            Output::Ip6Route => {
                let p = iproute::parse_routes6(&text);
                self.routes6 = Some(p.value);
                p.skipped
            }
            Output::IpLink => {
                let p = iproute::parse_links(&text);
                self.links = Some(p.value);
                p.skipped
            }
            Output::IpAddr => {
                let p = iproute::parse_addrs(&text);
                self.addrs = Some(p.value);
                p.skipped
            }
            Output::IpNeigh => {
                let p = iproute::parse_neighbours(&text);
                self.neighbours = Some(p.value);
                p.skipped
            }
            Output::Sysctl => {
                let p = sysctl::parse(&text);
                self.sysctls = Some(p.value);
                p.skipped
            }
            Output::IpsetList => {
                self.ipset = Some(text);
                Vec::new()
            }
            Output::IpvsadmLn => {
                self.ipvs = Some(text);
                Vec::new()
            }
            Output::ConntrackStats => {
                self.conntrack_stats = Some(text);
                Vec::new()
            }
            Output::ConntrackList => {
                let p = crate::conntrack::parse(&text);
                self.conntrack = Some(p.value);
                p.skipped
            }
            Output::IpRouteGet => {
                let p = crate::route_get::parse(&text);
                self.route_gets = Some(p.value);
                p.skipped
            }
            Output::IpvsadmConns => {
                let p = crate::ipvs::parse_connections(&text);
                self.ipvs_conns = Some(p.value);
                p.skipped
            }
            Output::HairpinMode => {
                let p = crate::hairpin::parse(&text);
                self.hairpin = Some(p.value);
                p.skipped
            }
            Output::KernelLog => {
                let p = crate::kernel_log::parse(&text);
                self.martians = Some(p.value);
                self.conntrack_full = Some(crate::kernel_log::conntrack_full(&text));
                p.skipped
            }
            Output::PodIpAddr => {
                *pod_text = Some(text);
                Vec::new()
            }
            Output::PodResolvConf => {
                self.pod_resolv_conf = Some(text);
                Vec::new()
            }
        }
    }

    /// Whether the routes hold more than table main (`ip route show table all`, or table local
    /// pasted): every local address then has its `local` route in table local.
    pub fn has_table_local(&self) -> bool {
        self.routes
            .iter()
            .flatten()
            .any(|r| r.table == "local" || r.table == "255")
    }

    /// Whether the routes hold every table (`show table all`: table local is in it), so a table a
    /// rule names and the dump lacks is empty rather than unknown.
    pub fn has_all_tables(&self) -> bool {
        self.has_table_local()
    }

    /// Whether the sysctls look like a whole `sysctl -a` (or `weir trace collect`'s cut of it,
    /// which keeps every key of the families it keeps) rather than a few pasted lines or a
    /// grep: only then does a missing key mean the kernel has no such setting (a module not
    /// loaded).
    pub fn sysctls_whole(&self) -> bool {
        self.sysctls.as_ref().is_some_and(|s| s.0.len() >= 20) && !self.sysctls_cut
    }

    /// Whether this node's IPv4 addresses are all known: a whole `ip addr`, or table local.
    pub fn addresses_complete(&self) -> bool {
        self.has_table_local() || (self.addrs.is_some() && !self.addrs_partial)
    }

    /// Local addresses from every source the dump offers besides `ip addr`: table local's
    /// `local` routes (each address has one), and the `src` of `proto kernel` routes in any
    /// table (the primary address of the subnet on that device). Only what `ip addr` lacks is
    /// added, and what was learnt is an assumption with its evidence.
    fn infer_addresses(&mut self, addrs_cut: bool) {
        if self.addrs.is_some() && !addrs_cut {
            return;
        }
        let Some(routes) = &self.routes else { return };
        let mut found: Vec<(Address, String)> = Vec::new();
        let known = |ifname: &str, ip: IpAddr, found: &[(Address, String)]| {
            self.addrs
                .iter()
                .flatten()
                .chain(found.iter().map(|(a, _)| a))
                .any(|a| a.ifname == ifname && a.addr == ip)
        };
        // `proto kernel` prefix routes first: they carry the prefix length and mark the primary.
        for r in routes {
            let (Some(dev), Some(src)) = (&r.dev, r.prefsrc) else {
                continue;
            };
            if r.proto.as_deref() == Some("kernel")
                && src.is_ipv4()
                && r.kind == "unicast"
                && dev != "lo"
                && r.dst.contains(&src)
                && !known(dev, src, &found)
            {
                found.push((
                    Address {
                        ifname: dev.clone(),
                        addr: src,
                        prefix_len: r.dst.prefix_len(),
                        scope: "global".into(),
                        secondary: false,
                        noprefixroute: false,
                    },
                    format!("`{}`", r.text.trim()),
                ));
            }
        }
        for r in routes {
            let Some(dev) = &r.dev else { continue };
            if r.kind == "local"
                && r.dst.addr().is_ipv4()
                && (r.table == "local" || r.table == "255")
                && r.dst.prefix_len() == r.dst.max_prefix_len()
                && dev != "lo"
                && !known(dev, r.dst.addr(), &found)
            {
                found.push((
                    Address {
                        ifname: dev.clone(),
                        addr: r.dst.addr(),
                        prefix_len: r.dst.max_prefix_len(),
                        scope: "global".into(),
                        secondary: false,
                        noprefixroute: true,
                    },
                    format!("`{}`", r.text.trim()),
                ));
            }
        }
        if found.is_empty() {
            return;
        }
        let list: Vec<String> = found
            .iter()
            .map(|(a, why)| format!("{} {}/{} ({why})", a.ifname, a.addr, a.prefix_len))
            .collect();
        let mut note = format!(
            "{}: local addresses learnt from the routes: {}",
            if self.addrs.is_some() {
                "ip addr is cut"
            } else {
                "no ip addr output"
            },
            list.join("; ")
        );
        let without: Vec<&str> = self
            .links
            .iter()
            .flatten()
            .map(|l| l.name.as_str())
            .filter(|n| *n != "lo")
            .filter(|n| {
                !found
                    .iter()
                    .any(|(a, _)| a.ifname == *n && a.addr.is_ipv4())
                    && !self
                        .addrs
                        .iter()
                        .flatten()
                        .any(|a| a.ifname == *n && a.addr.is_ipv4())
            })
            .collect();
        if !without.is_empty() {
            if self.has_table_local() {
                note.push_str(&format!(
                    "; no IPv4 address on {} (table local has a route for every local address)",
                    without.join(", ")
                ));
            } else {
                note.push_str(&format!(
                    "; {} may still hold addresses the routes do not show (no table local)",
                    without.join(", ")
                ));
            }
        }
        self.assumptions.push(note);
        self.inferred_addrs = found.into_iter().map(|(a, _)| a).collect();
    }

    /// The pod's address and interface from its `ip addr`, and the host veth they map to.
    fn read_pod(&mut self, text: &str) -> Option<PodSide> {
        let pasted = crate::paste::lines(text);
        let mut cur: Option<(String, Option<u32>)> = None;
        let mut side = None;
        for l in pasted.data() {
            let t = l.text;
            if !t.starts_with(char::is_whitespace) {
                // `3: eth0@if7: <BROADCAST,…>`
                let mut parts = t.splitn(3, ": ");
                let _index = parts.next();
                cur = parts.next().map(|full| {
                    let (name, peer) = full.split_once('@').unwrap_or((full, ""));
                    (
                        name.to_string(),
                        peer.strip_prefix("if").and_then(|n| n.parse().ok()),
                    )
                });
                continue;
            }
            let words: Vec<&str> = t.split_whitespace().collect();
            if words.first() != Some(&"inet") {
                continue;
            }
            let Some((ifname, peer)) = cur.clone() else {
                continue;
            };
            let Some(Ok(addr)) = words
                .get(1)
                .and_then(|w| w.split('/').next())
                .map(|a| a.parse::<std::net::Ipv4Addr>())
            else {
                continue;
            };
            if ifname == "lo" || addr.is_loopback() {
                continue;
            }
            side = Some(PodSide {
                addr,
                ifname,
                peer_index: peer,
                host_iface: None,
                how: String::new(),
            });
            break;
        }
        let mut side = side?;
        let by_index = side.peer_index.and_then(|i| {
            self.links
                .iter()
                .flatten()
                .find(|l| l.index == i)
                .map(|l| l.name.clone())
        });
        let by_route = self
            .routes
            .iter()
            .flatten()
            .find(|r| {
                r.table == "main"
                    && r.dst.prefix_len() == 32
                    && r.dst.addr() == IpAddr::V4(side.addr)
                    && r.gateway.is_none()
            })
            .and_then(|r| r.dev.clone());
        (side.host_iface, side.how) = match (by_index, by_route) {
            (Some(i), _) => (
                Some(i.clone()),
                format!(
                    "the pod's {}@if{} is the peer of the node's link {} (ifindex {})",
                    side.ifname,
                    side.peer_index.unwrap_or(0),
                    i,
                    side.peer_index.unwrap_or(0)
                ),
            ),
            (None, Some(d)) => (
                Some(d.clone()),
                format!(
                    "the node routes the pod's {} to {d} (no ip link with ifindex {:?})",
                    side.addr, side.peer_index
                ),
            ),
            (None, None) => (None, String::new()),
        };
        if side.host_iface.is_some() {
            self.assumptions.push(format!(
                "pod-ip-addr.txt: the pod is {}; {}",
                side.addr, side.how
            ));
        }
        Some(side)
    }

    /// Reads every file of `dir` whose name stands for an output ([`Output::for_file_name`]),
    /// and any other file holding Kubernetes objects ([`NodeState::objects`]); other files
    /// are listed in `ignored`. Unreadable outputs are an error: losing one silently would
    /// make the checks lie.
    pub fn from_dir(dir: &Path) -> std::io::Result<(NodeState, Vec<String>)> {
        let mut objects = None;
        let mut outputs = Vec::new();
        let mut ignored = Vec::new();
        let mut paths = BTreeMap::new();
        let mut entries: Vec<_> = std::fs::read_dir(dir)?.collect::<Result<_, _>>()?;
        entries.sort_by_key(|e| e.file_name());
        for e in entries {
            let name = e.file_name().to_string_lossy().into_owned();
            if !e.file_type()?.is_file() || name == MANIFEST_FILE {
                continue;
            }
            match Output::for_file_name(&name) {
                Some(o) => {
                    let text = std::fs::read_to_string(e.path()).map_err(|err| {
                        std::io::Error::new(err.kind(), format!("{}: {err}", e.path().display()))
                    })?;
                    paths.insert(o, e.path());
                    outputs.push((o, text));
                }
                // Kubernetes objects (`kubectl get … -o yaml`) under any name, by content.
                None => match std::fs::read_to_string(e.path()) {
                    Ok(text) if crate::objects::looks_like_objects(&text) => {
                        let found = objects
                            .get_or_insert_with(crate::objects::Objects::default)
                            .add_text(&name, &text);
                        if found == 0 {
                            ignored.push(name);
                        }
                    }
                    _ => ignored.push(name),
                },
            }
        }
        let mut st = NodeState::from_outputs(outputs);
        for u in &mut st.unreadable {
            u.file = paths[&u.output].display().to_string();
        }
        st.objects = objects;
        Ok((st, ignored))
    }

    /// Whether nothing was there to read: no output (readable or not) and no objects.
    pub fn nothing_read(&self) -> bool {
        self.present.is_empty() && self.unreadable.is_empty() && self.objects.is_none()
    }

    /// Every address assigned on this node, with its interface: `ip addr`'s, then those learnt
    /// from the routes ([`NodeState::inferred_addrs`]).
    pub fn local_addresses(&self) -> impl Iterator<Item = &Address> {
        self.addrs
            .iter()
            .flatten()
            .chain(self.inferred_addrs.iter())
    }

    pub fn is_local_address(&self, ip: IpAddr) -> bool {
        self.local_addresses().any(|a| a.addr == ip)
            || self
                .all_routes()
                .any(|r| r.kind == "local" && r.table == "local" && r.dst.contains(&ip))
    }

    /// The routes of both families (`ip route` and `ip -6 route`): a prefix of one family
    /// never contains an address of the other, so a lookup may search them together.
    pub fn all_routes(&self) -> impl Iterator<Item = &Route> {
        self.routes
            .iter()
            .flatten()
            .chain(self.routes6.iter().flatten())
    }

    /// The routes the dump holds for a family: IPv4's from `ip route`; IPv6's from `ip -6
    /// route`, else the IPv6 routes in `ip route`'s output (`ip route show table all` without
    /// `-4` lists both families). `None`: that family's routes are not in the dump.
    pub fn routes_of(&self, v6: bool) -> Option<Vec<&Route>> {
        if !v6 {
            return self.routes.as_ref().map(|r| r.iter().collect());
        }
        if let Some(r) = &self.routes6 {
            return Some(r.iter().collect());
        }
        let listed: Vec<&Route> = self
            .routes
            .iter()
            .flatten()
            .filter(|r| r.dst.addr().is_ipv6())
            .collect();
        (!listed.is_empty()).then_some(listed)
    }

    /// The policy rules of a family (`ip rule` or `ip -6 rule`), if in the dump.
    pub fn rules_of(&self, v6: bool) -> Option<&Vec<PolicyRule>> {
        if v6 {
            self.rules6.as_ref()
        } else {
            self.rules.as_ref()
        }
    }

    pub fn link(&self, name: &str) -> Option<&Link> {
        self.links.iter().flatten().find(|l| l.name == name)
    }

    /// The IPv4 addresses on `iface`.
    pub fn ipv4_on(&self, iface: &str) -> Vec<&Address> {
        self.local_addresses()
            .filter(|a| a.ifname == iface && a.addr.is_ipv4())
            .collect()
    }

    /// The longest-prefix route for `dst` in `table` (ties: lowest metric), unicast or not.
    pub fn lookup(&self, table: &str, dst: IpAddr) -> Option<&Route> {
        self.all_routes()
            .filter(|r| r.table == table && r.dst.contains(&dst))
            .max_by(|a, b| {
                a.dst
                    .prefix_len()
                    .cmp(&b.dst.prefix_len())
                    .then(b.metric.cmp(&a.metric))
            })
    }
}

/// What an input directory that holds nothing readable should hold, for the error saying so.
pub fn what_to_collect(dir: &Path) -> String {
    let names: Vec<&str> = Output::ALL.iter().map(|o| o.file_name()).collect();
    format!(
        "{} holds none of the outputs weir reads: save them with `weir trace collect {}` on the \
         node, or save the commands' outputs by hand under these names: {}",
        dir.display(),
        dir.display(),
        names.join(", ")
    )
}

/// Whether an `ip addr` command line names one device (`ip addr show eth0`, `ip -4 a s dev
/// eth1`, `ip addr show dev eth0`).
fn shows_one_device(cmd: &str) -> bool {
    let words: Vec<&str> = cmd
        .split('|')
        .next()
        .unwrap_or("")
        .split_whitespace()
        .skip_while(|w| *w == "sudo")
        .collect();
    if words.first().map(|w| w.rsplit('/').next().unwrap_or(w)) != Some("ip") {
        return false;
    }
    let mut rest = words[1..].iter().skip_while(|w| w.starts_with('-'));
    if !matches!(rest.next(), Some(&("a" | "addr" | "address"))) {
        return false;
    }
    let after: Vec<&&str> = rest
        .skip_while(|w| matches!(**w, "show" | "s" | "list" | "ls" | "l"))
        .collect();
    after.iter().any(|w| {
        !w.starts_with('-')
            && !matches!(
                **w,
                "up" | "scope" | "global" | "primary" | "secondary" | "permanent" | "dynamic"
            )
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn file_names_round_trip_and_aliases() {
        for o in Output::ALL {
            assert_eq!(Output::for_file_name(o.file_name()), Some(o));
        }
        assert_eq!(
            Output::for_file_name("ip route show table all.txt"),
            Some(Output::IpRoute)
        );
        assert_eq!(
            Output::for_file_name("iptables.txt"),
            Some(Output::IptablesSave)
        );
        assert_eq!(Output::for_file_name("notes.md"), None);
    }

    #[test]
    fn an_ip_addr_of_one_device_is_partial() {
        for c in [
            "ip addr show eth0",
            "ip -4 a s dev eth1",
            "sudo ip address show eth0",
        ] {
            assert!(shows_one_device(c), "{c}");
        }
        for c in [
            "ip addr",
            "ip -4 addr show",
            "ip a",
            "ip addr show up",
            "ip route",
        ] {
            assert!(!shows_one_device(c), "{c}");
        }
        let st = NodeState::from_outputs([(
            Output::IpAddr,
            "$ ip addr show eth0\n2: eth0: <BROADCAST,MULTICAST,UP,LOWER_UP> mtu 9001 qdisc mq state UP group default qlen 1000\n    inet 10.12.97.49/24 brd 10.12.97.255 scope global eth0\n".to_string(),
        )]);
        assert!(st.addrs_partial && !st.addresses_complete());
    }
}
