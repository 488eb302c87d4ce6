//! The request's way through the node: PREROUTING, routing, then INPUT or FORWARD and
//! POSTROUTING.

use super::packet::{Fact, Pkt};
use super::walker::{Dropped, Walker};

impl Walker<'_> {
    pub(super) fn request_and_reply(&mut self, p: &mut Pkt) -> Result<(), Dropped> {
        let orig = p.clone();
        // PREROUTING
        self.hook("PREROUTING", p)?;
        // Routing (and the reverse-path check of the request).
        let local = self.is_local(p.dst);
        let route = self.route("routing", p.src, p.dst, p.mark, &p.iif)?;
        self.rp_check("routing", p, &p.iif.clone())?;
        if local || route.local {
            self.hook("INPUT", p)?;
            if let Some(done) = self.ipvs_local_in(p, &orig) {
                return done;
            }
            if self.local_by_guess {
                // Nothing shows the address is this node's, nor what answers there.
                self.unknown_outcome = true;
                return Err((
                    format!(
                        "deliver: {} passes INPUT if it is this node's, but no pasted route or address says it is; settle it with {}",
                        p.dst,
                        super::routing::routes_settle(p.v6())
                    ),
                    vec![],
                ));
            }
            self.note_egress(p, true);
            self.hop(
                "deliver",
                "local",
                None,
                format!(
                    "to a local socket on {} (assumed listening)",
                    super::packet::destination(p.dst, p.dport, p.proto)
                ),
            );
            return Ok(());
        }
        let forward = Fact::forwarding(p.v6());
        if self.fact(forward.clone()) == 0 {
            let key = forward.name();
            self.hop(
                "routing",
                "ip_forward",
                None,
                format!("{} must be forwarded and {key} is 0", p.dst),
            );
            return Err((
                format!("{key} = 0: the node does not forward"),
                vec![format!("sysctl -w {key}=1")],
            ));
        }
        p.oif = Some(route.oif.clone());
        self.hook("FORWARD", p)?;
        // POSTROUTING: srcnat, including MASQUERADE's choice of source.
        let before = p.src;
        self.hook("POSTROUTING", p)?;
        let masq_src = p.src;
        let mut sent = format!(
            "out {} {} → {}",
            route.oif,
            p.src,
            super::packet::destination(p.dst, p.dport, p.proto)
        );
        if masq_src != before
            && self.via_router
            && self.owner_of(masq_src).is_some_and(|o| o != route.oif)
        {
            sent.push_str(&format!(
                "; {masq_src} is not {}'s address: a cloud's source/destination check on {} drops it before any reply",
                route.oif, route.oif
            ));
        }
        self.hop("send", route.oif.clone(), None, sent);
        self.note_egress(p, false);

        self.reply(p, &orig, before, &route.oif)
    }
}
