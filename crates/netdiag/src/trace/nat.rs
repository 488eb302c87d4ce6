//! Source NAT: MASQUERADE's choice of address.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use super::packet::Pkt;
use super::walker::Walker;

impl Walker<'_> {
    /// SNAT (iptables `SNAT --to-source`, nft `snat to`): the source becomes `to` when the rule
    /// names one address, and the flow's NAT is bound either way.
    pub(super) fn snat(
        &mut self,
        p: &mut Pkt,
        to: Option<IpAddr>,
        stage: &str,
        place: &str,
        rule: &str,
    ) {
        if let Some(ip) = to {
            p.src = ip;
        }
        p.nat_bound = true;
        self.hop(
            stage,
            place,
            Some(rule.to_string()),
            format!("SNAT to {}", p.src),
        );
    }

    /// The hop of a destination NAT already applied to `p` (`verb` as the dump spells it:
    /// DNAT, REDIRECT, redirect).
    pub(super) fn dnat_hop(&mut self, p: &Pkt, verb: &str, stage: &str, place: &str, rule: &str) {
        let note = format!(
            "{verb} to {}",
            super::packet::destination(p.dst, p.dport, p.proto)
        );
        self.hop(stage, place, Some(rule.to_string()), note);
    }

    /// MASQUERADE (`verb` as the dump spells it): the source becomes [`Self::masquerade_source`].
    pub(super) fn masquerade(
        &mut self,
        p: &mut Pkt,
        verb: &str,
        stage: &str,
        place: &str,
        rule: &str,
    ) {
        let src = self.masquerade_source(p);
        self.hop(
            stage,
            place,
            Some(rule.to_string()),
            format!("{verb}: source {} → {src}", p.src),
        );
        p.src = src;
        p.nat_bound = true;
    }

    /// MASQUERADE's source (`inet_select_addr(out, …)`, not the route's `src`): the outgoing
    /// interface's primary IPv4 address, else (an interface with no address) the first global
    /// address of another interface, in interface order.
    pub(super) fn masquerade_source(&mut self, p: &Pkt) -> IpAddr {
        if p.v6() {
            return self.masquerade_source6(p);
        }
        let oif = p.oif.clone().unwrap_or_default();
        let on_oif: Vec<Ipv4Addr> = self
            .st
            .local_addresses()
            .filter(|a| a.ifname == oif && !a.secondary)
            .filter_map(|a| match a.addr {
                IpAddr::V4(v) => Some(v),
                _ => None,
            })
            .collect();
        if let Some(a) = on_oif.first() {
            return IpAddr::V4(*a);
        }
        let fallback = self
            .st
            .links
            .iter()
            .flatten()
            .map(|l| l.name.clone())
            .chain(self.st.local_addresses().map(|a| a.ifname.clone()))
            .find_map(|ifname| {
                self.st.local_addresses().find_map(|a| match a.addr {
                    IpAddr::V4(v)
                        if a.ifname == ifname && a.scope == "global" && !v.is_loopback() =>
                    {
                        Some(v)
                    }
                    _ => None,
                })
            });
        match fallback {
            Some(a) => {
                let known = if self.st.addresses_complete() {
                    ""
                } else {
                    " (as far as the dump shows: neither a whole ip addr nor table local says it has none)"
                };
                self.assume(format!("masquerade on {oif}, which has no IPv4 address{known}: the kernel takes another interface's ({a}), as inet_select_addr does"));
                IpAddr::V4(a)
            }
            None => {
                self.assume(format!(
                    "no IPv4 address known for masquerade on {oif}: source left unchanged"
                ));
                p.src
            }
        }
    }

    /// IPv6 MASQUERADE's source (`nf_nat_masquerade_ipv6`: `ipv6_dev_get_saddr`, RFC 6724
    /// source selection on the outgoing interface): taken as the outgoing interface's first
    /// global address, else another interface's, which is what the selection picks for a global
    /// destination unless address labels, preferences or deprecated addresses say otherwise.
    fn masquerade_source6(&mut self, p: &Pkt) -> IpAddr {
        let oif = p.oif.clone().unwrap_or_default();
        let global = |a: &crate::iproute::Address| match a.addr {
            IpAddr::V6(v) => a.scope == "global" && !v.is_loopback(),
            _ => false,
        };
        let on_oif = self
            .st
            .local_addresses()
            .find(|a| a.ifname == oif && global(a))
            .map(|a| a.addr);
        let other = || {
            self.st
                .local_addresses()
                .find(|a| global(a))
                .map(|a| a.addr)
        };
        match on_oif.or_else(other) {
            Some(a) => {
                self.assume(format!(
                    "IPv6 masquerade on {oif}: source taken as {a}, the first global address (the kernel's RFC 6724 source selection is not modelled: address labels, preferences and deprecated addresses can change it)"
                ));
                a
            }
            None => {
                self.assume(format!(
                    "no global IPv6 address known for masquerade on {oif}: source left unchanged"
                ));
                p.src
            }
        }
    }

    /// `redirect` (nft) / `REDIRECT` (iptables): DNAT to this node — the input interface's
    /// primary address, or 127.0.0.1 for the node's own packets (`nf_nat_redirect_ipv4`) —
    /// and to `port` when given.
    pub(super) fn redirect(&mut self, port: Option<u64>, p: &mut Pkt) {
        let to = self.redirect_target(p);
        match to {
            Some(a) => p.dst = a,
            None => self.assume(format!(
                "redirect on {}, which has no {} address known: destination kept (the kernel drops it)",
                p.iif,
                if p.v6() { "IPv6" } else { "IPv4" }
            )),
        }
        if let Some(port) = port {
            p.dport = port as u16;
        }
        p.dnat = true;
        p.nat_bound = true;
    }

    /// Where `redirect` sends a packet: the input interface's primary address
    /// (`nf_nat_redirect_ipv4`), for IPv6 its first address (`nf_nat_redirect_ipv6`), or the
    /// loopback address for the node's own packets.
    pub(super) fn redirect_target(&self, p: &Pkt) -> Option<IpAddr> {
        if p.iif == "lo" {
            Some(if p.v6() {
                IpAddr::V6(Ipv6Addr::LOCALHOST)
            } else {
                IpAddr::V4(Ipv4Addr::LOCALHOST)
            })
        } else if p.v6() {
            self.st
                .local_addresses()
                .find(|a| a.ifname == p.iif && a.addr.is_ipv6())
                .map(|a| a.addr)
        } else {
            self.st
                .ipv4_on(&p.iif)
                .into_iter()
                .find(|a| !a.secondary)
                .map(|a| a.addr)
        }
    }
}

/// `ip:port` as iptables and nft write it: `[ip6]:port` for IPv6.
pub(super) fn endpoint(a: IpAddr, port: Option<u16>) -> String {
    match (port, a) {
        (Some(p), IpAddr::V6(_)) => format!("[{a}]:{p}"),
        (Some(p), _) => format!("{a}:{p}"),
        (None, _) => a.to_string(),
    }
}
