//! IPVS: a packet for a virtual server is taken at LOCAL_IN (a remote client: the service
//! address is local, on `kube-ipvs0`) or LOCAL_OUT (this node's own client), sent to one of
//! the real servers by the scheduler, and leaves through LOCAL_OUT and POSTROUTING, where
//! kube-proxy's `KUBE-POSTROUTING` masquerades what `KUBE-MARK-MASQ` marked.
//!
//! Modelled: masquerading (NAT) real servers, weight 0 as draining, persistence as the note
//! of ClientIP affinity, a virtual server without real servers rejecting (`ip_vs_leave` sends
//! ICMP port unreachable). Not modelled: firewall-mark virtual servers, direct routing and
//! tunnelling, the scheduler's actual pick (the walk follows the first real server and lists
//! the others).

use std::net::{IpAddr, Ipv4Addr};

use crate::ipvs::VirtualServer;

use super::{Dropped, Pkt, Walker};

impl Walker<'_> {
    /// The virtual server the packet hits, if IPVS is in the state.
    fn virtual_server(&self, p: &Pkt) -> Option<VirtualServer> {
        self.ipvs
            .as_ref()?
            .iter()
            .find(|v| v.matches(p.proto.name(), IpAddr::V4(p.dst), p.dport))
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
        let Some(first) = eligible.first() else {
            self.hop(
                stage,
                "IPVS",
                Some(vs.text.clone()),
                "virtual server with no real server that takes new connections: rejected",
            );
            return Some(Err((
                format!(
                    "{stage}: IPVS virtual server {}:{} has no real servers (weight > 0): rejected with ICMP port unreachable",
                    p.dst, p.dport
                ),
                vec!["give the Service ready endpoints (IPVS rejects while it has none)".into()],
            )));
        };
        let all: Vec<String> = eligible.iter().map(|r| r.addr.to_string()).collect();
        let persistent = vs
            .persistent
            .map(|t| format!(", persistent {t}s (ClientIP affinity)"))
            .unwrap_or_default();
        self.choices.push(format!(
            "one of {} (IPVS scheduler {}{persistent}): followed the first",
            all.join(", "),
            vs.scheduler
        ));
        if first.forward != "Masq" {
            self.assume(format!(
                "IPVS forwarding method {} not modelled: treated as masquerading (NAT)",
                first.forward
            ));
        }
        let IpAddr::V4(ip) = first.addr.ip() else {
            self.assume("an IPv6 real server behind an IPv4 virtual server: not modelled");
            return None;
        };
        p.dst = ip;
        p.dport = first.addr.port();
        p.dnat = true;
        self.hop(
            stage,
            "IPVS",
            Some(vs.text.clone()),
            format!(
                "virtual server → real server {}:{} ({})",
                p.dst, p.dport, first.forward
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

    /// From IPVS to the wire: the route to the real server (an output lookup without the
    /// packet's mark, as `do_output_route4` does), LOCAL_OUT (nat already bound), POSTROUTING
    /// (masquerade), then the reply.
    fn ipvs_send(&mut self, p: &mut Pkt, orig: &Pkt) -> Result<(), Dropped> {
        if self.is_local(p.dst) {
            self.hop(
                "deliver",
                "local",
                None,
                format!(
                    "the real server {}:{} is this node's (assumed listening)",
                    p.dst, p.dport
                ),
            );
            return Ok(());
        }
        self.assume("IPVS routes to the real server by its address alone (do_output_route4: an output lookup with no source and no mark), so source and fwmark policy rules do not apply to it");
        let route = self.route("IPVS routing", Ipv4Addr::UNSPECIFIED, p.dst, 0, "lo")?;
        if route.local {
            self.hop("deliver", "local", None, "the real server is local");
            return Ok(());
        }
        p.oif = Some(route.oif.clone());
        p.skip_nat = true;
        self.hook("OUTPUT", p)?;
        p.skip_nat = false;
        let before = p.src;
        self.hook("POSTROUTING", p)?;
        self.hop(
            "send",
            route.oif.clone(),
            None,
            format!("out {} {} → {}:{}", route.oif, p.src, p.dst, p.dport),
        );
        self.reply(p, orig, before, &route.oif)
    }

    /// The OUTPUT path's IPVS hook (LOCAL_OUT, after nat OUTPUT): a node's own connection to
    /// a virtual server. `None` when no virtual server matches.
    pub(super) fn ipvs_local_out(&mut self, p: &mut Pkt) -> Option<Result<(), Dropped>> {
        self.ipvs_schedule("IPVS LOCAL_OUT", p)
    }
}
