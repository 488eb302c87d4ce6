//! Pasted tcpdump lines as evidence of which way the packet went: each leg of the walk (the
//! request as it arrived and as it left, its reply as it came back and as it left for the
//! client) on an interface a capture covers is shown as a hop, seen (the first matching line
//! quoted, with how many) or not seen, or seen on another interface than the walk's. The
//! client's port is not compared (the walk's is a placeholder; masquerade may change it):
//! addresses, protocol and the service's port are.

use std::net::IpAddr;

use crate::state::NodeState;
use crate::tcpdump::{Capture, Seen, SeenKind};

use super::packet::{Hop, Proto, Trace, LOCAL};

/// One leg of the connection on one interface.
struct Leg {
    what: &'static str,
    iface: String,
    src: IpAddr,
    dst: IpAddr,
    /// The service's port: the destination's on the request, the source's on the reply.
    port: u16,
    reply: bool,
}

/// The capture hops for a walk (none without a capture).
pub(super) fn hops(st: &NodeState, t: &Trace) -> Vec<Hop> {
    let Some(captures) = st.captures.as_ref().filter(|c| !c.is_empty()) else {
        return Vec::new();
    };
    legs(t)
        .iter()
        .filter_map(|leg| leg_hop(captures, leg, t.packet.proto))
        .collect()
}

fn legs(t: &Trace) -> Vec<Leg> {
    let p = &t.packet;
    let mut out = Vec::new();
    let arrived = (p.iif != LOCAL).then(|| p.iif.clone());
    if let Some(iif) = &arrived {
        out.push(Leg {
            what: "the request as it arrived",
            iface: iif.clone(),
            src: p.src,
            dst: p.dst,
            port: p.dport,
            reply: false,
        });
    }
    let Some(e) = &t.egress else {
        return out;
    };
    if let Some(oif) = &e.oif {
        out.push(Leg {
            what: "the request as it left",
            iface: oif.clone(),
            src: e.src,
            dst: e.dst,
            port: e.dport,
            reply: false,
        });
        out.push(Leg {
            what: "its reply as it came back",
            iface: oif.clone(),
            src: e.dst,
            dst: e.src,
            port: e.dport,
            reply: true,
        });
    }
    if let Some(iif) = arrived {
        out.push(Leg {
            what: "its reply as it left for the client",
            iface: iif,
            src: p.dst,
            dst: p.src,
            port: p.dport,
            reply: true,
        });
    }
    out
}

/// Whether line `s` is the leg's packet: both addresses (`loose`: only the service's side,
/// the other one possibly translated in a way the walk did not take).
fn matches(s: &Seen, leg: &Leg, proto: Proto, loose: bool) -> bool {
    let (service, peer) = if leg.reply {
        (s.src == leg.src, s.dst == leg.dst)
    } else {
        (s.dst == leg.dst, s.src == leg.src)
    };
    if !service || !(peer || loose) {
        return false;
    }
    let port = if leg.reply { s.sport } else { s.dport };
    match (&s.kind, proto) {
        (SeenKind::Tcp(_), Proto::Tcp) | (SeenKind::Udp, Proto::Udp) => port == Some(leg.port),
        (SeenKind::EchoRequest, Proto::Icmp) => !leg.reply,
        (SeenKind::EchoReply, Proto::Icmp) => leg.reply,
        _ => false,
    }
}

/// Whether a capture shows interface `iface`: taken on it, or on `any` with each line's
/// interface printed.
fn covers(c: &Capture, iface: &str) -> bool {
    match &c.iface {
        Some(i) => i == iface,
        None => !c.packets.is_empty() && c.packets.iter().all(|s| s.direction.is_some()),
    }
}

fn leg_hop(captures: &[Capture], leg: &Leg, proto: Proto) -> Option<Hop> {
    let all = || captures.iter().flat_map(|c| &c.packets);
    let seen: Vec<&Seen> = all().filter(|s| matches(s, leg, proto, false)).collect();
    let here: Vec<&Seen> = seen
        .iter()
        .copied()
        .filter(|s| s.iface.as_deref() == Some(leg.iface.as_str()))
        .collect();
    let elsewhere: Vec<&Seen> = all()
        .filter(|s| matches(s, leg, proto, true))
        .filter(|s| s.iface.as_deref().is_some_and(|i| i != leg.iface))
        .collect();
    let unplaced: Vec<&Seen> = seen.iter().copied().filter(|s| s.iface.is_none()).collect();
    let tuple = format!("{} → {}", leg.src, leg.dst);
    let (rule, note) = if let Some(first) = here.first() {
        (
            Some(first.text.clone()),
            format!("{} ({tuple}): seen, {}", leg.what, count(&here)),
        )
    } else if let Some(first) = elsewhere.first() {
        let on = first.iface.clone().unwrap_or_default();
        (
            Some(first.text.clone()),
            format!(
                "{} ({tuple}): not seen on {}, but on {on}: {}",
                leg.what,
                leg.iface,
                count(&elsewhere)
            ),
        )
    } else if captures.iter().any(|c| covers(c, &leg.iface)) {
        (
            None,
            format!(
                "{} ({tuple}): not seen: the capture on {} holds no such packet",
                leg.what, leg.iface
            ),
        )
    } else if let Some(first) = unplaced.first() {
        (
            Some(first.text.clone()),
            format!(
                "{} ({tuple}): seen by a capture whose interface is not shown, {}",
                leg.what,
                count(&unplaced)
            ),
        )
    } else {
        return None;
    };
    Some(Hop {
        stage: "capture".into(),
        place: format!("tcpdump on {}", leg.iface),
        rule,
        note,
    })
}

/// `3 packets (the first at line 12)`.
fn count(seen: &[&Seen]) -> String {
    let n = seen.len();
    format!(
        "{n} packet{} (the first at line {})",
        if n == 1 { "" } else { "s" },
        seen[0].line
    )
}
