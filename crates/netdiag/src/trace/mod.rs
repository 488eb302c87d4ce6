//! `weir trace`: one IPv4 packet (the first of a new connection) walked through a node's state
//! the way the kernel would, then its reply on the way back.
//!
//! The path (net/ipv4/ip_input.c, ip_forward.c, ip_output.c): PREROUTING (raw −300, mangle −150,
//! dstnat −100, nft chains by priority), the routing decision with policy rules and marks and
//! the reverse-path check (`fib_validate_source`: a lookup of the route back to the source, with
//! the packet's mark only under `src_valid_mark`), then INPUT (local delivery) or FORWARD
//! (filter), and POSTROUTING (srcnat +100: MASQUERADE takes the outgoing interface's primary
//! address, `inet_select_addr`). The reply comes back with conntrack's reverse NAT: its
//! destination is restored (de-SNAT) before routing, so its reverse-path check looks up the
//! route to the backend *from the original client*.
//!
//! IPVS virtual servers are taken at LOCAL_IN and LOCAL_OUT ([`ipvs_walk`]); ipset matches
//! are looked up in `ipset list`/`save` output ([`sets`]). A packet the node sends itself
//! (`iif` [`LOCAL`]) takes the OUTPUT path ([`output`]).
//!
//! What it models and what it assumes is said in [`Trace::assumptions`]; rules it cannot
//! evaluate (match modules it does not know, sets missing from the input) count as not
//! matching, and are named there.

mod hooks;
mod iptables_walk;
mod ipvs_walk;
mod nat;
mod nft_choices;
mod nft_nat;
mod nft_walk;
mod output;
mod packet;
mod path;
mod render;
mod reply;
mod routing;
mod sets;

use std::collections::BTreeSet;
use std::net::{IpAddr, Ipv4Addr};

use crate::state::NodeState;

pub use packet::{Egress, Hop, Packet, Proto, Trace, Verdict, LOCAL};
use packet::{Flow, Pkt};
pub use render::{render, svg};

struct Walker<'a> {
    st: &'a NodeState,
    hops: Vec<Hop>,
    choices: Vec<String>,
    assumptions: BTreeSet<String>,
    /// A reject rule (not a drop) ended the walk.
    rejected: bool,
    /// The last routing decision's route has a gateway (the next hop is a router, not the
    /// destination itself on a link).
    via_router: bool,
    endpoints: Vec<String>,
    egress: Option<Egress>,
    /// `ipset list`/`save`, parsed once (`None`: not in the state).
    sets: Option<Vec<crate::ipset::IpSet>>,
    /// `ipvsadm -Ln`/`-Sn`, parsed once.
    ipvs: Option<Vec<crate::ipvs::VirtualServer>>,
}

/// Runs the walk.
pub fn trace(st: &NodeState, packet: &Packet) -> Trace {
    let mut w = Walker {
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
    };
    w.note_missing();
    w.parse_sets_and_ipvs();
    let mut p = Pkt {
        src: packet.src,
        dst: packet.dst,
        sport: packet.sport,
        dport: packet.dport,
        proto: packet.proto,
        iif: w.ip_iif(&packet.iif),
        oif: None,
        mark: 0,
        ct_mark: 0,
        ct_state: "new",
        dnat: false,
        nat_bound: false,
        skip_nat: false,
    };
    let walked = if packet.originates_here() {
        w.output_and_reply(&mut p)
    } else {
        w.request_and_reply(&mut p)
    };
    let (verdict, cause, fixes) = match walked {
        Ok(()) => (Verdict::Delivered, None, Vec::new()),
        Err((cause, fixes)) if w.rejected => (Verdict::Rejected, Some(cause), fixes),
        Err((cause, fixes)) => (Verdict::Dropped, Some(cause), fixes),
    };
    Trace {
        packet: packet.clone(),
        hops: w.hops,
        verdict,
        cause,
        fixes,
        choices: w.choices,
        endpoints: w.endpoints,
        egress: w.egress,
        assumptions: w.assumptions.into_iter().collect(),
    }
}

/// Why the packet was dropped, and candidate fixes.
type Dropped = (String, Vec<String>);

impl Walker<'_> {
    fn hop(
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

    /// The DNAT alternatives of a random choice; the first choice made counts.
    fn note_endpoints(&mut self, eps: Vec<String>) {
        if self.endpoints.is_empty() {
            self.endpoints = eps;
        }
    }

    /// The interface the IP layer sees a packet arriving on `iif` on: a bridge port's packets
    /// enter IP on the bridge (a pod's veth on `cni0`), so the hooks' `iifname`, routing and
    /// rp_filter see the bridge.
    fn ip_iif(&mut self, iif: &str) -> String {
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
    fn note_egress(&mut self, p: &Pkt, local: bool) {
        self.egress = Some(Egress {
            src: p.src,
            dst: p.dst,
            sport: p.sport,
            dport: p.dport,
            oif: if local { None } else { p.oif.clone() },
            local,
        });
    }

    fn assume(&mut self, a: impl Into<String>) {
        self.assumptions.insert(a.into());
    }

    fn note_missing(&mut self) {
        let st = self.st;
        if st.iptables.is_none() && st.nft.is_none() {
            self.assume("no iptables-save or nft ruleset: no netfilter rules, every policy ACCEPT");
        }
        if st.rules.is_none() {
            self.assume(
                "no ip rule output: the default rules (0 local, 32766 main, 32767 default)",
            );
        }
        if st.routes.is_none() {
            self.assume("no ip route output: no routes, nothing is reachable");
        }
        if st.addrs.is_none() {
            self.assume("no ip addr output: local addresses only from table local's routes; masquerade's source unknown");
        }
        if st.sysctls.is_none() {
            self.assume("no sysctl output: rp_filter 0 (the kernel's default; many distributions set 1 or 2), ip_forward 1, src_valid_mark 0");
        }
    }

    fn sysctl(&self, key: &str) -> Option<i64> {
        self.st.sysctls.as_ref()?.int(key)
    }

    fn is_local(&self, ip: Ipv4Addr) -> bool {
        self.st.is_local_address(IpAddr::V4(ip))
    }

    fn owner_of(&self, ip: Ipv4Addr) -> Option<String> {
        self.st
            .local_addresses()
            .find(|a| a.addr == IpAddr::V4(ip))
            .map(|a| a.ifname.clone())
    }
}

fn parse_num(s: &str) -> Option<u32> {
    match s.strip_prefix("0x") {
        Some(h) => u32::from_str_radix(h, 16).ok(),
        None => s.parse().ok(),
    }
}

fn cidr_contains(v: &str, ip: Ipv4Addr) -> Option<bool> {
    let net: ipnet::Ipv4Net = match v.parse() {
        Ok(n) => n,
        Err(_) => ipnet::Ipv4Net::new(v.parse().ok()?, 32).ok()?,
    };
    Some(net.contains(&ip))
}
