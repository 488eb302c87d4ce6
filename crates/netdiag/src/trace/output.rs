//! The OUTPUT path: a packet this node sends itself (net/ipv4/ip_output.c, route.c). The
//! output route is looked up first (policy rules see `iif lo`; the socket's mark is 0) and
//! picks the source when none is given (the route's `src`, else the outgoing interface's
//! primary address). Then OUTPUT (raw −300, mangle −150, nat −100, IPVS −99, filter 0), a new
//! lookup when a rule changed the destination or the mark (`ip_route_me_harder`), and
//! POSTROUTING. A packet for a local address loops over `lo`: POSTROUTING, then PREROUTING and
//! INPUT with the output route kept (no second lookup, no reverse-path check) and no nat chain
//! (its bindings were made on the way out). Otherwise it is sent, and its reply comes back to a
//! local socket through PREROUTING, routing with the reverse-path check, and INPUT.

use std::net::IpAddr;

use super::packet::Pkt;
use super::walker::{unspecified, Dropped, Walker};

impl Walker<'_> {
    pub(super) fn output_and_reply(&mut self, p: &mut Pkt) -> Result<(), Dropped> {
        p.iif = "lo".into();
        let route = self.route("output routing", p.src, p.dst, p.mark, "lo")?;
        if p.src.is_unspecified() {
            p.src = self.output_source(p.dst, p.mark, &route.oif);
            self.hop(
                "output routing",
                "source",
                None,
                format!("source address {} (picked by the route)", p.src),
            );
        }
        let orig = p.clone();
        p.oif = Some(route.oif.clone());
        let (dst, mark) = (p.dst, p.mark);
        self.hook("OUTPUT", p)?;
        if let Some(done) = self.ipvs_local_out(p) {
            done?;
        }
        let route = if p.dst != dst || p.mark != mark {
            let again = self.route("output reroute", p.src, p.dst, p.mark, "lo")?;
            p.oif = Some(again.oif.clone());
            again
        } else {
            route
        };
        let before = p.src;
        self.hook("POSTROUTING", p)?;
        if route.local || self.is_local(p.dst) {
            // Looped back over lo: the output route stands, nat is already bound.
            p.iif = "lo".into();
            p.oif = None;
            p.skip_nat = true;
            self.hook("PREROUTING", p)?;
            self.hook("INPUT", p)?;
            self.hop(
                "deliver",
                "lo",
                None,
                format!(
                    "to a local socket on {} (assumed listening)",
                    super::packet::destination(p.dst, p.dport, p.proto)
                ),
            );
            return Ok(());
        }
        self.hop(
            "send",
            route.oif.clone(),
            None,
            format!(
                "out {} {} → {}",
                route.oif,
                p.src,
                super::packet::destination(p.dst, p.dport, p.proto)
            ),
        );
        self.reply(p, &orig, before, &route.oif)
    }

    /// The source of a locally generated packet with none bound: the route's preferred source,
    /// else the outgoing interface's primary IPv4 address (`inet_select_addr`); for IPv6 its
    /// first global address (the kernel's RFC 6724 selection is not modelled beyond that).
    fn output_source(&mut self, dst: IpAddr, mark: u32, oif: &str) -> IpAddr {
        let prefsrc = self
            .lookup(unspecified(dst), dst, mark, Some("lo"))
            .and_then(|(_, r)| r.prefsrc)
            .filter(|a| a.is_ipv6() == dst.is_ipv6());
        if let Some(a) = prefsrc {
            return a;
        }
        let primary = if dst.is_ipv6() {
            self.st
                .local_addresses()
                .find(|a| a.ifname == oif && a.addr.is_ipv6() && a.scope == "global")
                .map(|a| a.addr)
        } else {
            self.st
                .ipv4_on(oif)
                .into_iter()
                .find(|a| !a.secondary)
                .map(|a| a.addr)
        };
        match primary {
            Some(a) => a,
            None => {
                self.assume(format!(
                    "no source address known for a packet out of {oif}: {} kept",
                    unspecified(dst)
                ));
                unspecified(dst)
            }
        }
    }
}
