//! The packet the walk follows, and what it reports.

use std::net::Ipv4Addr;

use serde::Serialize;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Proto {
    Tcp,
    Udp,
}

impl Proto {
    pub(super) fn name(self) -> &'static str {
        match self {
            Proto::Tcp => "tcp",
            Proto::Udp => "udp",
        }
    }
    pub(super) fn number(self) -> u64 {
        match self {
            Proto::Tcp => 6,
            Proto::Udp => 17,
        }
    }
}

/// The packet to trace: the first packet of a connection arriving on `iif` (from outside or
/// from a pod's veth).
#[derive(Debug, Clone, Serialize)]
pub struct Packet {
    pub src: Ipv4Addr,
    pub dst: Ipv4Addr,
    pub proto: Proto,
    pub sport: u16,
    pub dport: u16,
    /// The interface it arrives on; `local` (or empty) for a packet this node sends itself
    /// (the OUTPUT path), from `src` or, when `src` is 0.0.0.0, from the source routing picks.
    pub iif: String,
}

impl Packet {
    /// Whether the packet is sent by this node rather than received.
    pub fn originates_here(&self) -> bool {
        self.iif.is_empty() || self.iif == LOCAL
    }
}

/// The `iif` of a packet the node sends itself.
pub const LOCAL: &str = "local";

/// The packet as the walk changes it.
#[derive(Debug, Clone)]
pub(super) struct Pkt {
    pub(super) src: Ipv4Addr,
    pub(super) dst: Ipv4Addr,
    pub(super) sport: u16,
    pub(super) dport: u16,
    pub(super) proto: Proto,
    pub(super) iif: String,
    pub(super) oif: Option<String>,
    pub(super) mark: u32,
    pub(super) ct_mark: u32,
    /// `new` for the first packet, `established` for the reply.
    pub(super) ct_state: &'static str,
    /// The connection was DNATed (conntrack's `DNAT` status).
    pub(super) dnat: bool,
    /// A nat chain of the current hook set up a binding: the kernel's nat core runs no further
    /// nat chains on that hook (nf_nat_inet_fn).
    pub(super) nat_bound: bool,
    /// The connection's nat bindings are already set up (a packet IPVS sends on, or one
    /// looped back over `lo`): no nat chain runs on this hook.
    pub(super) skip_nat: bool,
}

#[derive(Debug, Clone, Serialize)]
pub struct Hop {
    /// `PREROUTING`, `routing`, `FORWARD`, `POSTROUTING`, `reply routing`, …
    pub stage: String,
    /// `iptables nat KUBE-SERVICES`, `nft ip kube-proxy nat-prerouting`, `table 1003`, …
    pub place: String,
    /// The rule or route that decided, as written in the dump.
    pub rule: Option<String>,
    pub note: String,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Verdict {
    /// The connection works as far as this node can tell.
    Delivered,
    /// Dropped on this node (request or reply).
    Dropped,
    /// Refused on this node by a reject rule (TCP reset or ICMP unreachable): the client
    /// learns at once, unlike a drop.
    Rejected,
    /// The outcome depends on facts the dump lacks: see [`Trace::branches`].
    Conditional,
    /// The walk reached something the dump cannot tell (a route table it lacks).
    Unknown,
}

/// The request as it leaves this node (or is handed to a local socket): after DNAT and
/// masquerade, so a walk can be continued on the next node.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Egress {
    pub src: Ipv4Addr,
    pub dst: Ipv4Addr,
    pub sport: u16,
    pub dport: u16,
    /// The interface it leaves by (`None` when delivered locally).
    pub oif: Option<String>,
    /// Delivered to a socket on this node.
    pub local: bool,
}

#[derive(Debug, Clone, Serialize)]
pub struct Trace {
    pub packet: Packet,
    pub hops: Vec<Hop>,
    pub verdict: Verdict,
    /// Where and why it was dropped.
    pub cause: Option<String>,
    /// Candidate fixes, cheapest first.
    pub fixes: Vec<String>,
    /// Random choices the walk made ("one of …") and what it followed.
    pub choices: Vec<String>,
    /// The destinations (`ip:port`) DNAT may pick for this packet: every alternative of a
    /// random choice, or the one DNAT target; empty without DNAT.
    pub endpoints: Vec<String>,
    /// The request as it left (`None` when dropped before).
    pub egress: Option<Egress>,
    pub assumptions: Vec<String>,
    /// With a [`Verdict::Conditional`] verdict: each outcome and the facts' values that lead
    /// to it. Empty otherwise.
    pub branches: Vec<super::Branch>,
    /// The facts the dump lacks that the verdict depends on, and what settles each.
    pub unknowns: Vec<super::Unknown>,
}

/// How a chain (or a whole hook) ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Flow {
    Accept,
    Drop(String),
    Return,
}
