//! A node's state as the outputs add up to: read from a directory (what `weir trace collect`
//! writes, or files an operator saved by hand) or from live outputs, with what was missing,
//! skipped or assumed written down.

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::path::Path;

use serde::Serialize;

use crate::intake::{Kind, Section, Status};
use crate::iproute::{self, Address, Link, Neighbour, PolicyRule, Route};
use crate::iptables::{self, Dump};
use crate::nft::{self, Ruleset};
pub use crate::output::Output;
use crate::sysctl::{self, Sysctls};
use crate::Skipped;

/// The file a live collection ([`crate::live::write_collection`]) lists its commands in; not an
/// output, so [`NodeState::from_dir`] skips it.
pub const MANIFEST_FILE: &str = "manifest.json";

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
    /// Pasted `tcpdump -n` captures: packets seen, evidence of which way one went.
    pub captures: Option<Vec<crate::tcpdump::Capture>>,
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
    /// What the input held, section by section, and what became of each (read, recognised
    /// but not read yet, not recognised): the "what was read" table.
    pub sections: Vec<Section>,
}

impl NodeState {
    /// Builds the state from outputs, each given whole (a live collection).
    pub fn from_outputs(outputs: impl IntoIterator<Item = (Output, String)>) -> NodeState {
        NodeState::from_sections(
            outputs
                .into_iter()
                .map(|(o, text)| Section::given(o, text))
                .collect(),
        )
    }

    /// Builds the state from inputs as pasted: `(name, text)`, each holding one output or many
    /// ([`crate::intake::sections`]).
    pub fn from_sources(sources: impl IntoIterator<Item = (String, String)>) -> NodeState {
        let mut sections = Vec::new();
        for (name, text) in sources {
            sections.extend(crate::intake::sections(&name, &text));
        }
        NodeState::from_sections(sections)
    }

    /// Builds the state from sections: each output's sections are read in the order given and
    /// add up (two `iptables -L` of two tables, `ip route` and `ip route show table local`);
    /// Kubernetes objects go to [`NodeState::objects`]; the rest is only listed.
    pub fn from_sections(sections: Vec<Section>) -> NodeState {
        let mut st = NodeState::default();
        let mut pod_text = None;
        let mut addrs_cut = false;
        let mut by_kind: BTreeMap<Output, Vec<&Section>> = BTreeMap::new();
        for s in &sections {
            if let Some(o) = s.output.filter(|_| s.status == Status::Read) {
                by_kind.entry(o).or_default().push(s);
            } else if s.kind == Kind::Objects {
                // Under a prompt (`$ kubectl get pods -o yaml`), the YAML starts below it.
                let text = match s.command {
                    Some(_) => s.text.split_once('\n').map_or("", |(_, rest)| rest),
                    None => &s.text,
                };
                st.objects
                    .get_or_insert_with(crate::objects::Objects::default)
                    .add_text(&s.source, text);
            }
        }
        for (o, list) in by_kind {
            let blank = list.iter().all(|s| s.text.trim().is_empty());
            let mut skipped_here = Vec::new();
            for s in &list {
                addrs_cut |= st.note_paste(o, s);
                let skipped = st.read_output(o, s.text.clone(), &mut pod_text);
                skipped_here.extend(skipped.into_iter().map(|mut k| {
                    if !s.json && k.line > 0 {
                        k.line = s.input_line(k.line);
                    }
                    k.origin = Some(format!("{}:{}", s.source, k.line));
                    k
                }));
            }
            match skipped_here.first() {
                Some(first) if !blank && st.read_nothing(o) => {
                    st.forget(o, first);
                    let u = st.unreadable.last_mut().expect("forgotten");
                    u.file = list[0].source.clone();
                }
                _ => st.present.push(o),
            }
            st.skipped.extend(skipped_here.into_iter().map(|k| (o, k)));
        }
        st.addrs_partial = addrs_cut;
        st.infer_addresses(addrs_cut);
        if let Some(text) = pod_text {
            st.pod = st.read_pod(&text);
        }
        st.sections = sections;
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
            Output::Tcpdump => self
                .captures
                .as_ref()
                .is_some_and(|c| c.iter().all(|c| c.packets.is_empty())),
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
            Output::Tcpdump => self.captures = None,
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
    fn note_paste(&mut self, o: Output, s: &Section) -> bool {
        let pasted = crate::paste::lines(&s.text);
        // Where it came from, when that is not the output's own file.
        let from = if s.source == o.file_name() {
            String::new()
        } else {
            format!(" ({})", s.origin())
        };
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
                    "{}: `{}` shows one device's addresses: the others are unknown{from}",
                    o.file_name(),
                    pasted
                        .commands
                        .iter()
                        .find(|c| shows_one_device(c))
                        .expect("one")
                ));
            }
        }
        // `nft list table X` (or `list chain`): the other tables are not in the paste.
        if o == Output::NftRuleset {
            let one = pasted.commands.iter().find(|c| {
                let w: Vec<&str> = c.split_whitespace().collect();
                w.windows(2)
                    .any(|p| p[0] == "list" && matches!(p[1], "table" | "chain"))
            });
            if let Some(cmd) = one {
                self.assumptions.push(format!(
                    "{}: `{cmd}` lists one table: other tables' chains on the same hooks (another firewall's, a CNI's) are not shown, and are walked as absent{from}",
                    o.file_name()
                ));
            }
        }
        for note in pasted.notes() {
            self.assumptions
                .push(format!("{}: {note}{from}", o.file_name()));
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
            Output::IptablesSave | Output::Ip6tablesSave => self.read_iptables(o, &text),
            Output::NftRuleset => self.read_nft(&text),
            Output::IpRule
            | Output::IpRoute
            | Output::Ip6Rule
            | Output::Ip6Route
            | Output::IpLink
            | Output::IpAddr
            | Output::IpNeigh => self.read_iproute(o, &text),
            Output::Sysctl
            | Output::ConntrackList
            | Output::IpRouteGet
            | Output::IpvsadmConns
            | Output::HairpinMode
            | Output::KernelLog => self.read_kernel(o, &text),
            Output::Tcpdump => {
                let p = crate::tcpdump::parse(&text);
                self.captures.get_or_insert_with(Vec::new).push(p.value);
                p.skipped
            }
            // Kept as text: read by the checks that use them.
            Output::IpsetList => self.keep(|s| &mut s.ipset, text),
            Output::IpvsadmLn => self.keep(|s| &mut s.ipvs, text),
            Output::ConntrackStats => self.keep(|s| &mut s.conntrack_stats, text),
            Output::PodResolvConf => self.keep(|s| &mut s.pod_resolv_conf, text),
            Output::PodIpAddr => {
                append(pod_text, text);
                Vec::new()
            }
        }
    }

    /// `iptables-save` / `ip6tables-save`: merged into what earlier sections gave; the dump's
    /// assumptions become the state's, naming the output.
    fn read_iptables(&mut self, o: Output, text: &str) -> Vec<Skipped> {
        let p = iptables::parse(text);
        let slot = if o == Output::IptablesSave {
            &mut self.iptables
        } else {
            &mut self.ip6tables
        };
        let d = match slot {
            Some(have) => {
                have.merge(p.value);
                have
            }
            None => slot.insert(p.value),
        };
        for a in d.assumptions.drain(..) {
            self.assumptions.push(format!("{}: {a}", o.file_name()));
        }
        p.skipped
    }

    /// `nft -j list ruleset` or `nft list ruleset`: one model either way.
    fn read_nft(&mut self, text: &str) -> Vec<Skipped> {
        let json = crate::paste::lines(text)
            .data()
            .next()
            .is_some_and(|l| crate::intake::classify::looks_json(l.text));
        let p = if json {
            nft::parse(text)
        } else {
            crate::nft_text::parse(text)
        };
        match &mut self.nft {
            Some(have) => have.merge(p.value),
            None => self.nft = Some(p.value),
        }
        p.skipped
    }

    /// `ip rule`, `ip route`, `ip link`, `ip addr`, `ip neigh` (and `ip -6`'s).
    fn read_iproute(&mut self, o: Output, text: &str) -> Vec<Skipped> {
        match o {
            Output::IpRule => parsed(&mut self.rules, iproute::parse_rules(text)),
            Output::Ip6Rule => parsed(&mut self.rules6, iproute::parse_rules(text)),
            Output::IpRoute => parsed(&mut self.routes, iproute::parse_routes(text)),
            Output::Ip6Route => parsed(&mut self.routes6, iproute::parse_routes6(text)),
            Output::IpLink => parsed(&mut self.links, iproute::parse_links(text)),
            Output::IpAddr => parsed(&mut self.addrs, iproute::parse_addrs(text)),
            Output::IpNeigh => parsed(&mut self.neighbours, iproute::parse_neighbours(text)),
            other => unreachable!("{other:?} is not an ip output"),
        }
    }

    /// The kernel's other state: sysctls, conntrack entries, `ip route get`, IPVS connections,
    /// hairpin modes, the kernel log.
    fn read_kernel(&mut self, o: Output, text: &str) -> Vec<Skipped> {
        match o {
            Output::Sysctl => {
                let p = sysctl::parse(text);
                self.sysctls
                    .get_or_insert_with(Sysctls::default)
                    .0
                    .extend(p.value.0);
                p.skipped
            }
            Output::ConntrackList => parsed(&mut self.conntrack, crate::conntrack::parse(text)),
            Output::IpRouteGet => parsed(&mut self.route_gets, crate::route_get::parse(text)),
            Output::IpvsadmConns => {
                parsed(&mut self.ipvs_conns, crate::ipvs::parse_connections(text))
            }
            Output::HairpinMode => parsed(&mut self.hairpin, crate::hairpin::parse(text)),
            Output::KernelLog => {
                let full = crate::kernel_log::conntrack_full(text);
                add(&mut self.conntrack_full, full);
                parsed(&mut self.martians, crate::kernel_log::parse(text))
            }
            other => unreachable!("{other:?} is not kernel state"),
        }
    }

    /// An output kept as text, added to what earlier sections gave.
    fn keep(
        &mut self,
        slot: impl FnOnce(&mut Self) -> &mut Option<String>,
        text: String,
    ) -> Vec<Skipped> {
        append(slot(self), text);
        Vec::new()
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

    /// Reads every file of `dir` ([`NodeState::from_sources`]: each file's content says what
    /// it holds, its name is a hint), skipping `manifest.json`; files of which nothing was read
    /// (not even recognised) are listed in `ignored`. An unreadable file is an error: losing one silently would make
    /// the checks lie.
    pub fn from_dir(dir: &Path) -> std::io::Result<(NodeState, Vec<String>)> {
        let mut entries: Vec<_> = std::fs::read_dir(dir)?.collect::<Result<_, _>>()?;
        entries.sort_by_key(|e| e.file_name());
        let mut sources = Vec::new();
        for e in entries {
            let name = e.file_name().to_string_lossy().into_owned();
            if !e.file_type()?.is_file() || name == MANIFEST_FILE {
                continue;
            }
            let bytes = std::fs::read(e.path()).map_err(|err| {
                std::io::Error::new(err.kind(), format!("{}: {err}", e.path().display()))
            })?;
            sources.push((name, text_of(bytes)));
        }
        let names: Vec<String> = sources.iter().map(|(n, _)| n.clone()).collect();
        let mut st = NodeState::from_sources(sources);
        for u in &mut st.unreadable {
            u.file = dir.join(&u.file).display().to_string();
        }
        let ignored = names
            .into_iter()
            .filter(|n| {
                !st.sections
                    .iter()
                    .any(|s| &s.source == n && s.status != Status::NotRecognised)
            })
            .collect();
        Ok((st, ignored))
    }

    /// Reads a directory ([`NodeState::from_dir`]) or one file holding one output or many.
    pub fn from_path(path: &Path) -> std::io::Result<(NodeState, Vec<String>)> {
        if path.is_dir() {
            return NodeState::from_dir(path);
        }
        let bytes = std::fs::read(path)?;
        let name = path
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_else(|| path.display().to_string());
        let mut st = NodeState::from_sources([(name.clone(), text_of(bytes))]);
        for u in &mut st.unreadable {
            u.file = path.display().to_string();
        }
        let read = st
            .sections
            .iter()
            .any(|s| s.status != Status::NotRecognised);
        Ok((st, if read { Vec::new() } else { vec![name] }))
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

/// A file's text; bytes that are not UTF-8 (a binary capture, a Latin-1 paste) are replaced,
/// so the lines around them are still read.
fn text_of(bytes: Vec<u8>) -> String {
    String::from_utf8(bytes).unwrap_or_else(|e| String::from_utf8_lossy(e.as_bytes()).into_owned())
}

/// Adds a section's values to what earlier sections of the same output gave.
fn add<T>(slot: &mut Option<Vec<T>>, values: Vec<T>) {
    slot.get_or_insert_with(Vec::new).extend(values);
}

/// Adds a parser's values to `slot`; returns what it skipped.
fn parsed<T>(slot: &mut Option<Vec<T>>, p: crate::Parsed<Vec<T>>) -> Vec<Skipped> {
    add(slot, p.value);
    p.skipped
}

/// Adds a section's text to what earlier sections of the same output gave, on a line of its own.
fn append(slot: &mut Option<String>, text: String) {
    match slot {
        Some(have) => {
            if !have.ends_with('\n') {
                have.push('\n');
            }
            have.push_str(&text);
        }
        None => *slot = Some(text),
    }
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
