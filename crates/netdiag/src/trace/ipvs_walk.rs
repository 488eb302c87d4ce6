//! IPVS: a packet for a virtual server is taken at LOCAL_IN (a remote client: the service
//! address is local, on `kube-ipvs0`) or LOCAL_OUT (this node's own client), sent to one of
//! the real servers by the scheduler, and leaves through LOCAL_OUT and POSTROUTING, where
//! kube-proxy's `KUBE-POSTROUTING` masquerades what `KUBE-MARK-MASQ` marked.
//!
//! Modelled: masquerading (NAT) real servers, weight 0 as draining, persistence as the note
//! of ClientIP affinity, a virtual server without real servers rejecting (`ip_vs_leave` sends
//! ICMP port unreachable). Not modelled: firewall-mark virtual servers, direct routing and
//! tunnelling, the scheduler's actual pick (every real server is walked in turn).

use crate::ipvs::VirtualServer;

use super::packet::Pkt;
use super::walker::{unspecified, Dropped, Walker};

impl Walker<'_> {
    /// The virtual server the packet hits, if IPVS is in the state.
    fn virtual_server(&self, p: &Pkt) -> Option<VirtualServer> {
        self.ipvs
            .as_ref()?
            .iter()
            .find(|v| v.matches(p.proto.name(), p.dst, p.dport))
            .cloned()
    }

    /// IPVS's scheduling of a new connection: the real server the walk follows (the packet is
    /// DNATed to it), or the rejection when there is none.
    pub(super) fn ipvs_schedule(
        &mut self,
        stage: &str,
        p: &mut Pkt,
    ) -> Option<Result<(), Dropped>> {
        let vs = self.virtual_server(p)?;
        let eligible = vs.eligible();
        if eligible.is_empty() {
            if vs.cut {
                // grep cut the list right after the virtual server: its real servers are
                // unknown, not absent.
                self.unknown_outcome = true;
                self.hop(
                    stage,
                    "IPVS",
                    Some(vs.text.clone()),
                    "virtual server whose real servers grep cut from the ipvsadm output",
                );
                return Some(Err((
                    format!(
                        "{stage}: IPVS virtual server {}: its real servers are not in the dump (ipvsadm output cut with grep)", super::packet::destination(p.dst, p.dport, p.proto)),
                    vec![],
                )));
            }
            self.hop(
                stage,
                "IPVS",
                Some(vs.text.clone()),
                "virtual server with no real server that takes new connections: rejected",
            );
            // ip_vs_leave answers ICMP port unreachable: the client is refused at once.
            self.rejected = true;
            return Some(Err((
                format!(
                    "{stage}: IPVS virtual server {} has no real servers (weight > 0): rejected with ICMP port unreachable", super::packet::destination(p.dst, p.dport, p.proto)),
                vec!["give the Service ready endpoints (IPVS rejects while it has none)".into()],
            )));
        }
        let all: Vec<String> = eligible.iter().map(|r| r.addr.to_string()).collect();
        if vs.cut {
            self.assume(format!(
                "the real servers of `{}` end where grep cut the ipvsadm output: there may be more than {}",
                vs.text,
                all.len()
            ));
        }
        let persistent = vs
            .persistent
            .map(|t| format!(", persistent {t}s (ClientIP affinity)"))
            .unwrap_or_default();
        self.choices.push(format!(
            "one of {} (IPVS scheduler {}{persistent}): each walked",
            all.join(", "),
            vs.scheduler
        ));
        let first = eligible[self.choose(all.clone())];
        if first.forward != "Masq" {
            self.assume(format!(
                "IPVS forwarding method {} not modelled: treated as masquerading (NAT)",
                first.forward
            ));
        }
        let ip = first.addr.ip();
        if ip.is_ipv6() != p.v6() {
            self.assume(
                "a real server of the other IP family than its virtual server: not modelled",
            );
            return None;
        }
        p.dst = ip;
        p.dport = first.addr.port();
        p.dnat = true;
        self.hop(
            stage,
            "IPVS",
            Some(vs.text.clone()),
            format!(
                "virtual server → real server {} ({})",
                super::packet::destination(p.dst, p.dport, p.proto),
                first.forward
            ),
        );
        Some(Ok(()))
    }

    /// A packet delivered locally that IPVS takes (LOCAL_IN): scheduled, then sent on to the
    /// real server, then its reply. `None` when no virtual server matches.
    pub(super) fn ipvs_local_in(&mut self, p: &mut Pkt, orig: &Pkt) -> Option<Result<(), Dropped>> {
        if let Err(e) = self.ipvs_schedule("IPVS LOCAL_IN", p)? {
            return Some(Err(e));
        }
        Some(self.ipvs_send(p, orig))
    }

    /// From IPVS to the wire: IPVS's route to the real server (an output lookup by its address
    /// alone, as `do_output_route4` does), LOCAL_OUT (nat already bound, but nf_nat routes the
    /// DNATed packet again with its source and mark), POSTROUTING (masquerade), then the reply.
    fn ipvs_send(&mut self, p: &mut Pkt, orig: &Pkt) -> Result<(), Dropped> {
        if self.is_local(p.dst) {
            self.hop(
                "deliver",
                "local",
                None,
                format!(
                    "the real server {} is this node's (assumed listening)",
                    super::packet::destination(p.dst, p.dport, p.proto)
                ),
            );
            return Ok(());
        }
        // IPVS's own route (do_output_route4): the real server's address alone, no source,
        // no mark.
        let route = self.route("IPVS routing", unspecified(p.dst), p.dst, 0, "lo")?;
        if route.local {
            self.hop("deliver", "local", None, "the real server is local");
            return Ok(());
        }
        p.oif = Some(route.oif.clone());
        p.skip_nat = true;
        self.hook("OUTPUT", p)?;
        p.skip_nat = false;
        // nf_nat's LOCAL_OUT hook (nf_nat_ipv4_local_fn): IPVS has rewritten the connection's
        // reply tuple (net.ipv4.vs.conntrack = 1), so its original destination (the virtual
        // server) differs from the reply's source (the real server), and ip_route_me_harder
        // routes the packet again, with its source and its mark: source policy rules apply.
        let route = if self.ipvs_conntrack() && self.nat_output_hooked(p.v6()) {
            let again = self.route("OUTPUT reroute", p.src, p.dst, p.mark, "lo")?;
            if again.oif != route.oif {
                self.assume(format!(
                    "IPVS's route to {} leaves by {}, but nf_nat's LOCAL_OUT hook routes the packet again with its source {} and mark {:#x} (ip_route_me_harder, as for any DNATed locally sent packet): out {}",
                    p.dst, route.oif, p.src, p.mark, again.oif
                ));
            }
            p.oif = Some(again.oif.clone());
            again
        } else {
            route
        };
        let before = p.src;
        self.hook("POSTROUTING", p)?;
        let mut sent = format!(
            "out {} {} → {}",
            route.oif,
            p.src,
            super::packet::destination(p.dst, p.dport, p.proto)
        );
        if p.src != before
            && self.via_router
            && self.owner_of(p.src).is_some_and(|o| o != route.oif)
        {
            sent.push_str(&format!(
                "; {} is not {}'s address: a cloud's source/destination check on {} drops it before any reply",
                p.src, route.oif, route.oif
            ));
        }
        self.hop("send", route.oif.clone(), None, sent);
        self.note_egress(p, false);
        self.reply(p, orig, before, &route.oif)
    }

    /// Whether IPVS keeps conntrack up to date (`net.ipv4.vs.conntrack`), which kube-proxy's
    /// ipvs mode sets to 1 and its masquerade rules need.
    fn ipvs_conntrack(&mut self) -> bool {
        match self
            .st
            .sysctls
            .as_ref()
            .and_then(|s| s.int("net.ipv4.vs.conntrack"))
        {
            Some(v) => v != 0,
            None => {
                self.assume("net.ipv4.vs.conntrack not in the dump: taken as 1, which kube-proxy's ipvs mode sets (its masquerade rules need conntrack)");
                true
            }
        }
    }

    /// Whether a nat chain is hooked at LOCAL_OUT (an iptables nat table, or an nft nat chain
    /// on output): only then does nf_nat route a DNATed packet again.
    fn nat_output_hooked(&self, v6: bool) -> bool {
        let (ipt, family) = if v6 {
            (&self.st.ip6tables, "ip6")
        } else {
            (&self.st.iptables, "ip")
        };
        ipt.as_ref().is_some_and(|d| d.tables.contains_key("nat"))
            || self.st.nft.as_ref().is_some_and(|rs| {
                rs.base_chains("output", &[family, "inet"])
                    .iter()
                    .any(|c| c.hook.as_ref().is_some_and(|h| h.kind == "nat"))
            })
    }

    /// The OUTPUT path's IPVS hook (LOCAL_OUT, after nat OUTPUT): a node's own connection to
    /// a virtual server. `None` when no virtual server matches.
    pub(super) fn ipvs_local_out(&mut self, p: &mut Pkt) -> Option<Result<(), Dropped>> {
        self.ipvs_schedule("IPVS LOCAL_OUT", p)
    }
}
