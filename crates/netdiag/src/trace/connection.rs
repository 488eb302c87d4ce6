//! `weir trace --reply`: the connection a pasted `conntrack -L` entry records. Its reply
//! tuple says which endpoint the rules chose and which source the request left with, so of
//! every endpoint the walk tried, the one the connection took is the one whose reply matters.

use crate::conntrack::Entry;
use crate::state::NodeState;

use super::packet::{Packet, Proto, Trace};

/// The pasted entry of the connection `packet` opens (same protocol, source, destination and
/// destination port; the source port too when the entry is one of several).
pub fn pasted_entry<'a>(st: &'a NodeState, packet: &Packet) -> Option<&'a Entry> {
    let proto = match packet.proto {
        Proto::Tcp => "tcp",
        Proto::Udp => "udp",
        Proto::Icmp if packet.is_v6() => "icmpv6",
        Proto::Icmp => "icmp",
    };
    let port = |p: Option<u16>, want: u16| !packet.proto.has_ports() || p == Some(want);
    let matching: Vec<&Entry> = st
        .conntrack
        .iter()
        .flatten()
        .filter(|e| {
            e.proto == proto
                && e.orig.dst == packet.dst
                && (packet.src.is_unspecified() || e.orig.src == packet.src)
                && port(e.orig.dport, packet.dport)
        })
        .collect();
    match matching.as_slice() {
        [one] => Some(one),
        many => many
            .iter()
            .find(|e| port(e.orig.sport, packet.sport))
            .or(many.first())
            .copied(),
    }
}

/// The walk narrowed to the endpoint `entry` records (its reply's source), with that
/// endpoint's verdict, hops and fixes; unchanged when the walk made no choice or none of its
/// endpoints is the entry's. The second value says which, for the output.
pub fn along_entry(mut t: Trace, entry: &Entry) -> (Trace, String) {
    let to = match entry.reply.sport {
        Some(p) => std::net::SocketAddr::new(entry.reply.src, p).to_string(),
        None => entry.reply.src.to_string(),
    };
    let Some(taken) = t
        .endpoint_outcomes
        .iter()
        .find(|e| e.endpoint == to || e.endpoint.ends_with(&format!(" then {to}")))
        .cloned()
    else {
        let note = if t.endpoint_outcomes.is_empty() {
            format!("the pasted connection went to {to}, as the walk does")
        } else {
            format!("the pasted connection went to {to}, which is none of the endpoints the rules choose among: every endpoint is shown")
        };
        return (t, note);
    };
    t.verdict = taken.verdict.clone();
    t.cause = taken.cause.clone();
    t.fixes = taken.fixes.clone();
    t.branches = taken.branches.clone();
    t.hops = taken.hops.clone();
    t.egress = taken.egress.clone();
    t.policy = taken.policy.clone();
    (
        t,
        format!("the pasted connection went to {to}: its walk and reply are shown"),
    )
}
