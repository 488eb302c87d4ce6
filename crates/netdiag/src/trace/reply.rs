//! The reply's way back (conntrack's reverse NAT) and the reverse-path check.

use std::net::IpAddr;

use super::packet::{Fact, Pkt};
use super::walker::{Dropped, Walker};

impl Walker<'_> {
    /// The reply to the request `p` (as it left; `orig` as it arrived, `before` its source
    /// before POSTROUTING, `oif` the interface it left by).
    pub(super) fn reply(
        &mut self,
        p: &Pkt,
        orig: &Pkt,
        before: IpAddr,
        oif: &str,
    ) -> Result<(), Dropped> {
        let masq_src = p.src;
        // The reply: from the (possibly DNATed) destination back to the (possibly
        // masqueraded) source. A destination on the outgoing link itself (no gateway: a pod's
        // veth, a neighbour on the segment) answers on that link. Beyond a router, the network
        // delivers it where that source lives: on the interface holding the address when it
        // is this node's, else on the interface the request left by.
        let reply_iif = if masq_src != before && self.via_router {
            self.owner_of(masq_src).unwrap_or_else(|| oif.to_string())
        } else {
            oif.to_string()
        };
        self.bridged_reply(p, orig, &reply_iif)?;
        self.hop(
            "reply",
            reply_iif.clone(),
            None,
            format!(
                "{} → {} arrives on {reply_iif}; conntrack restores its destination to {}",
                super::packet::destination(p.dst, p.dport, p.proto),
                masq_src,
                orig.src
            ),
        );
        let mut r = Pkt {
            src: p.dst,
            dst: orig.src,
            sport: p.dport,
            dport: orig.sport,
            proto: p.proto,
            iif: reply_iif.clone(),
            oif: None,
            mark: 0,
            ct_mark: p.ct_mark,
            ct_state: "established",
            dnat: p.dnat,
            nat_bound: false,
            skip_nat: false,
        };
        self.hook("reply PREROUTING", &mut r)?;
        let back = self.route("reply routing", r.src, r.dst, r.mark, &r.iif)?;
        self.rp_check("reply routing", &r, &reply_iif)?;
        if back.local {
            self.hook("reply INPUT", &mut r)?;
            self.hop("reply deliver", "local", None, "the reply is for this node");
            return Ok(());
        }
        let forward = Fact::forwarding(r.v6());
        if self.fact(forward.clone()) == 0 {
            let key = forward.name();
            self.hop(
                "reply routing",
                "ip_forward",
                None,
                format!("the reply to {} must be forwarded and {key} is 0", orig.src),
            );
            return Err((
                format!(
                    "reply routing: {key} = 0: the node does not forward the reply to {}",
                    orig.src
                ),
                vec![format!("sysctl -w {key}=1")],
            ));
        }
        r.oif = Some(back.oif.clone());
        self.hook("reply FORWARD", &mut r)?;
        self.hop(
            "reply send",
            back.oif.clone(),
            None,
            format!(
                "out {} to {} (source restored to {})",
                back.oif,
                orig.src,
                super::packet::destination(orig.dst, orig.dport, orig.proto)
            ),
        );
        Ok(())
    }

    /// A reply to a client on the same bridge, to the client's own address (no
    /// masquerade), is bridged, not routed: only br_netfilter hands it to conntrack, which
    /// must restore its source (the service address) for the client to take it.
    fn bridged_reply(&mut self, p: &Pkt, orig: &Pkt, reply_iif: &str) -> Result<(), Dropped> {
        let bridge = self
            .st
            .link(reply_iif)
            .is_some_and(|l| l.kind.as_deref() == Some("bridge"));
        if !(bridge && p.src == orig.src && p.dnat && orig.iif == reply_iif) {
            return Ok(());
        }
        let (brnf, brkey) = if p.v6() {
            (Fact::BrNetfilter6, "bridge-nf-call-ip6tables")
        } else {
            (Fact::BrNetfilter, "bridge-nf-call-iptables")
        };
        if self.fact(brnf) == 0 {
            self.hop(
                "reply",
                reply_iif.to_string(),
                None,
                format!(
                    "{} → {} is bridged on {reply_iif} past netfilter ({brkey} 0): conntrack never restores its source to {}", super::packet::destination(p.dst, p.dport, p.proto), orig.src, super::packet::destination(orig.dst, orig.dport, orig.proto)),
            );
            return Err((
                format!(
                    "reply: {} answers {} across bridge {reply_iif} without br_netfilter, from {} instead of {}: the client drops it (TCP answers a reset)", p.dst, orig.src, super::packet::destination(p.dst, p.dport, p.proto), super::packet::destination(orig.dst, orig.dport, orig.proto)),
                vec![
                    format!("modprobe br_netfilter (and list it in /etc/modules-load.d/), then sysctl -w net.bridge.{brkey}=1"),
                    format!(
                        "or masquerade this traffic (the client then gets the reply through {reply_iif}'s address, routed): e.g. kube-proxy's --masquerade-all"
                    ),
                ],
            ));
        }
        self.hop(
            "reply",
            reply_iif.to_string(),
            None,
            format!(
                "{} → {} is bridged on {reply_iif}; br_netfilter hands it to conntrack ({brkey} 1)",
                super::packet::destination(p.dst, p.dport, p.proto),
                orig.src
            ),
        );
        Ok(())
    }

    /// The reverse-path check of a packet that arrived on `iif` (`fib_validate_source`): the
    /// route back to its source, looked up from its destination with `iif lo` and the packet's
    /// mark only under `src_valid_mark`, must leave by `iif` (strict, 1) or exist (loose, 2).
    pub(super) fn rp_check(&mut self, stage: &str, p: &Pkt, iif: &str) -> Result<(), Dropped> {
        if p.v6() {
            // IPv6 routing validates no source: its reverse-path check is a rule's
            // (`-m rpfilter`, nft `fib saddr . iif oif missing`), walked in the hooks.
            self.assume("IPv6: no rp_filter (the net.ipv4.conf.*.rp_filter sysctls are IPv4's); a reverse-path check exists only as an ip6tables `-m rpfilter` or nft `fib saddr . iif oif` rule, and is walked as one");
            return Ok(());
        }
        let rp = self.fact(Fact::RpFilter(iif.to_string()));
        if rp == 0 {
            return Ok(());
        }
        // src_valid_mark only matters for a marked packet.
        let svm = p.mark != 0 && self.fact(Fact::SrcValidMark(iif.to_string())) != 0;
        let mark = if svm { p.mark } else { 0 };
        let back = self.lookup(p.dst, p.src, mark, Some("lo"));
        if back.as_ref().is_some_and(|(_, r)| r.kind == "unknown") {
            let (rule, route) = back.expect("checked");
            self.unknown_outcome = true;
            self.hop(stage, "rp_filter", Some(rule.clone()), route.text.clone());
            return Err((
                format!("{stage}: reverse-path check: the route back to {} is in a table the dump lacks (`{rule}`)", p.src),
                vec![],
            ));
        }
        let Some((rule, route)) = back else {
            // The kernel's own input lookup (`ip route get DST from SRC iif IIF`) validates
            // the source: an answer means the reverse-path check passed.
            if self.routes_missing_for(p.v6()).is_some() {
                if let Some(g) = self.route_get_for(p.src, p.dst, p.mark, iif) {
                    if let Ok(a) = &g.answer {
                        let asked = g.command.clone().unwrap_or_default();
                        self.hop(
                            stage,
                            "rp_filter",
                            Some(format!("{asked} → {}", a.text)),
                            format!(
                                "reverse path to {}: the kernel's input lookup answered: passes",
                                p.src
                            ),
                        );
                        return Ok(());
                    }
                }
            }
            if let Some(why) = self.routes_missing_for(p.v6()) {
                self.unknown_outcome = true;
                self.hop(
                    stage,
                    "rp_filter",
                    None,
                    format!("route back to {}: {why}", p.src),
                );
                return Err((
                    format!(
                        "{stage}: reverse-path check: cannot tell whether there is a route back to {}: {why}; settle it with {}",
                        p.src,
                        super::routing::routes_settle(p.v6())
                    ),
                    vec![],
                ));
            }
            self.hop(
                stage,
                "rp_filter",
                None,
                format!("no route back to {}", p.src),
            );
            return Err((
                format!("{stage}: reverse-path check: no route back to {} ", p.src),
                vec![],
            ));
        };
        let out = route.dev.clone().unwrap_or_default();
        if rp == 2 || out == iif {
            self.hop(
                stage,
                "rp_filter",
                Some(format!("{rule} → {}", route.text)),
                format!(
                    "reverse path to {} via {out}: passes (rp_filter {rp})",
                    p.src
                ),
            );
            return Ok(());
        }
        self.hop(
            stage,
            "rp_filter",
            Some(format!("{rule} → {}", route.text)),
            format!("reverse path from {} to {} leaves by {out}, not {iif}: strict rp_filter drops it (TcpExtIPReversePathFilter)", p.dst, p.src),
        );
        let mut fixes = Vec::new();
        let out_has_addr = !self.st.ipv4_on(&out).is_empty();
        if stage.starts_with("reply") {
            if !out_has_addr {
                fixes.push(format!("give {out} an IPv4 address of its own, so masquerade picks it and the reply returns on {out} (weir-cni eni-shared's eniAddress)"));
            }
            fixes.push(format!("connmark the connection and restore the mark on its packets and replies, with `ip rule add fwmark <mark> lookup main` before `{}` and net.ipv4.conf.all.src_valid_mark=1: the request then follows main's route out of {iif} with {iif}'s address, and the reply's reverse-path lookup carries the mark into main, back to {iif}", rule.trim()));
            fixes.push(format!("loose reverse-path filtering on {iif}: sysctl -w net.ipv4.conf.{iif}.rp_filter=2 (the effective value is max(conf/all, conf/{iif})); a cloud's source check may still drop the request"));
        } else {
            fixes.push(format!("connmark connections arriving on {iif} and add `ip rule add fwmark <mark> lookup main` before `{}`, with net.ipv4.conf.all.src_valid_mark=1 (weir-cni eni-shared does this)", rule.trim()));
            fixes.push(format!(
                "loose reverse-path filtering on {iif}: sysctl -w net.ipv4.conf.{iif}.rp_filter=2"
            ));
            fixes.push(format!(
                "mark the traffic in mangle and route it through main with a fwmark rule before `{}`",
                rule.trim()
            ));
        }
        Err((format!("{stage}: strict reverse-path filter on {iif} drops {} → {} (the route back leaves by {out})", p.src, p.dst), fixes))
    }
}
