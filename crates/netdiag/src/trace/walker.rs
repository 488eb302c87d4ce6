//! The walk's state: the node it reads, the hops so far, the facts it asked and the choices
//! it met; what every stage of the walk (a sibling module each) adds to.

use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;

use crate::state::NodeState;

use super::packet::{Egress, Fact, Hop, Pkt};

pub(super) struct Walker<'a> {
    pub(super) st: &'a NodeState,
    pub(super) hops: Vec<Hop>,
    pub(super) choices: Vec<String>,
    pub(super) assumptions: BTreeSet<String>,
    /// A reject rule (not a drop) ended the walk.
    pub(super) rejected: bool,
    /// The last routing decision's route has a gateway (the next hop is a router, not the
    /// destination itself on a link).
    pub(super) via_router: bool,
    pub(super) endpoints: Vec<String>,
    pub(super) egress: Option<Egress>,
    /// `ipset list`/`save`, parsed once (`None`: not in the state).
    pub(super) sets: Option<Vec<crate::ipset::IpSet>>,
    /// `ipvsadm -Ln`/`-Sn`, parsed once.
    pub(super) ipvs: Option<Vec<crate::ipvs::VirtualServer>>,
    /// Values this walk takes for facts the dump lacks ([`facts`]).
    pub(super) forced: BTreeMap<Fact, i64>,
    /// The facts the dump lacks that this walk asked for, with the values it took.
    pub(super) asked: Vec<(Fact, i64)>,
    /// The walk reached something the dump cannot tell (a table it lacks).
    pub(super) unknown_outcome: bool,
    /// The request was taken to be for this node only because no routes were pasted
    /// ([`super::packet::Fact::Route`]): a local delivery then proves nothing.
    pub(super) local_by_guess: bool,
    /// The option to take at each choice among endpoints, in the order the walk meets them
    /// (the first where none is given).
    pub(super) picks: Vec<usize>,
    /// Each choice met: how many options, and the endpoint taken.
    pub(super) points: ChoicePoints,
    /// What weir's NetworkPolicy table decided ([`super::policy`]).
    pub(super) policy: Vec<super::packet::PolicyDecision>,
}

/// Each choice among endpoints a walk met: how many options, and the endpoint it took.
pub(super) type ChoicePoints = Vec<(usize, String)>;

/// Why the packet was dropped, and candidate fixes.
pub(super) type Dropped = (String, Vec<String>);

impl<'a> Walker<'a> {
    pub(super) fn new(st: &'a NodeState, forced: BTreeMap<Fact, i64>) -> Walker<'a> {
        Walker {
            st,
            hops: Vec::new(),
            choices: Vec::new(),
            assumptions: BTreeSet::new(),
            rejected: false,
            via_router: false,
            endpoints: Vec::new(),
            egress: None,
            sets: None,
            ipvs: None,
            forced,
            asked: Vec::new(),
            unknown_outcome: false,
            local_by_guess: false,
            picks: Vec::new(),
            points: Vec::new(),
            policy: Vec::new(),
        }
    }
}

impl Walker<'_> {
    pub(super) fn hop(
        &mut self,
        stage: &str,
        place: impl Into<String>,
        rule: Option<String>,
        note: impl Into<String>,
    ) {
        self.hops.push(Hop {
            stage: stage.into(),
            place: place.into(),
            rule,
            note: note.into(),
        });
    }

    /// A choice among endpoints (`labels`, one per option, in the rules' order): the option
    /// this walk takes, recorded so that [`trace`] walks every other one too.
    pub(super) fn choose(&mut self, labels: Vec<String>) -> usize {
        let k = self.points.len();
        let c = self
            .picks
            .get(k)
            .copied()
            .unwrap_or(0)
            .min(labels.len().saturating_sub(1));
        let taken = labels.get(c).cloned().unwrap_or_default();
        self.points.push((labels.len(), taken));
        c
    }

    /// The DNAT alternatives of a random choice; the first choice made counts.
    pub(super) fn note_endpoints(&mut self, eps: Vec<String>) {
        if self.endpoints.is_empty() {
            self.endpoints = eps;
        }
    }

    /// The interface the IP layer sees a packet arriving on `iif` on: a bridge port's packets
    /// enter IP on the bridge (a pod's veth on `cni0`), so the hooks' `iifname`, routing and
    /// rp_filter see the bridge.
    pub(super) fn ip_iif(&mut self, iif: &str) -> String {
        let Some(master) = self.st.link(iif).and_then(|l| l.master.clone()) else {
            return iif.to_string();
        };
        match self.st.link(&master).and_then(|m| m.kind.as_deref()) {
            Some("bridge") => {}
            Some(_) => return iif.to_string(),
            None => self.assume(format!(
                "{iif}'s master {master} is taken to be a bridge (no `ip -d link` kind)"
            )),
        }
        self.hop(
            "bridge",
            iif,
            None,
            format!("{iif} is a port of bridge {master}: the IP layer sees the packet arrive on {master}"),
        );
        master
    }

    /// The request leaves (or is delivered) as `p`.
    pub(super) fn note_egress(&mut self, p: &Pkt, local: bool) {
        self.egress = Some(Egress {
            src: p.src,
            dst: p.dst,
            sport: p.sport,
            dport: p.dport,
            oif: if local { None } else { p.oif.clone() },
            local,
        });
    }

    pub(super) fn assume(&mut self, a: impl Into<String>) {
        self.assumptions.insert(a.into());
    }

    pub(super) fn note_missing(&mut self, v6: bool) {
        let st = self.st;
        if v6 {
            self.note_missing6();
            return;
        }
        if st.iptables.is_none() && st.nft.is_none() {
            self.assume("no iptables-save or nft ruleset: no netfilter rules, every policy ACCEPT");
        }
        if st.rules.is_none() {
            self.assume(
                "no ip rule output: the default rules (0 local, 32766 main, 32767 default)",
            );
        }
        if st.routes.is_none() {
            self.assume("no ip route output: where a packet goes is unknown (not assumed: the request is walked both as this node's and as forwarded, and a lookup nothing else settles makes the verdict unknown)");
        }
        if st.addrs.is_none() && st.inferred_addrs.is_empty() {
            self.assume("no ip addr output, and no route names a local address: masquerade's source unknown");
        } else if st.addrs.is_none() {
            self.assume("no ip addr output: local addresses learnt from the routes (table local, `proto kernel … src`)");
        }
        if st.sysctls.is_none() {
            self.assume("no sysctl output: rp_filter, src_valid_mark and ip_forward unknown (not assumed: where one decides, the verdict is conditional)");
        }
    }

    /// What an IPv6 walk reads instead of IPv4's outputs, and what it does not model.
    pub(super) fn note_missing6(&mut self) {
        let st = self.st;
        self.assume("IPv6: neighbour discovery is not modelled: every next hop (a pod, a router) is assumed to answer neighbour solicitations (`ip -6 neigh` is not read), and ICMPv6 needed for it is assumed allowed");
        if st.ip6tables.is_none() && st.nft.is_none() {
            self.assume(
                "no ip6tables-save or nft ruleset: no IPv6 netfilter rules, every policy ACCEPT",
            );
        } else if st.ip6tables.is_none() && st.iptables.is_some() {
            self.assume("no ip6tables-save (only iptables-save, which IPv6 packets never meet): no ip6tables rules");
        }
        if st.rules6.is_none() {
            self.assume("no ip -6 rule output: the default IPv6 rules (0 local, 32766 main)");
        }
        if st.routes_of(true).is_none() {
            self.assume("no ip -6 route output: where an IPv6 packet goes is unknown (not assumed: the request is walked both as this node's and as forwarded, and a lookup nothing else settles makes the verdict unknown)");
        }
        if !st.local_addresses().any(|a| a.addr.is_ipv6()) {
            self.assume("no IPv6 address in ip addr: the node's IPv6 addresses (masquerade's source, local delivery) unknown");
        }
    }

    pub(super) fn is_local(&self, ip: IpAddr) -> bool {
        if self.st.is_local_address(ip) {
            return true;
        }
        // Without table local or a whole `ip addr`, an IPVS virtual server's address is still
        // known to be local: kube-proxy's ipvs mode binds every one to kube-ipvs0.
        if !self.st.addresses_complete()
            && self
                .ipvs
                .iter()
                .flatten()
                .any(|v| matches!(&v.key, crate::ipvs::VirtualKey::Addr(_, a) if a.ip() == ip))
        {
            return true;
        }
        false
    }

    pub(super) fn owner_of(&self, ip: IpAddr) -> Option<String> {
        self.st
            .local_addresses()
            .find(|a| a.addr == ip)
            .map(|a| a.ifname.clone())
    }
}

/// The deciding rule's counter, cited as evidence in its hop: ` (rule 3 of KUBE-FIREWALL; its
/// counter in the paste: 120 packets, 7200 bytes)`. `at` is its place in its chain, when the
/// paste shows that.
pub(super) fn counter_note(at: Option<String>, packets: &str, bytes: &str) -> String {
    let at = at.map(|a| format!("{a}; ")).unwrap_or_default();
    let none = if packets == "0" {
        ": it has matched no packet so far"
    } else {
        ""
    };
    let unit = if packets == "1" { "packet" } else { "packets" };
    format!(" ({at}its counter in the paste: {packets} {unit}, {bytes} bytes{none})")
}

pub(super) fn parse_num(s: &str) -> Option<u32> {
    match s.strip_prefix("0x") {
        Some(h) => u32::from_str_radix(h, 16).ok(),
        None => s.parse().ok(),
    }
}

/// The unspecified address (`0.0.0.0`, `::`) of `ip`'s family.
pub(super) fn unspecified(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V4(_) => IpAddr::V4(std::net::Ipv4Addr::UNSPECIFIED),
        IpAddr::V6(_) => IpAddr::V6(std::net::Ipv6Addr::UNSPECIFIED),
    }
}

/// Whether `ip` is in `v` (a prefix or one address); an address of the other family is not.
pub(super) fn cidr_contains(v: &str, ip: IpAddr) -> Option<bool> {
    let net: ipnet::IpNet = match v.parse() {
        Ok(n) => n,
        Err(_) => ipnet::IpNet::from(v.parse::<IpAddr>().ok()?),
    };
    Some(net.contains(&ip))
}
