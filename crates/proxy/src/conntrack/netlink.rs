//! ctnetlink client: dump the conntrack table, delete entries by their original tuple.
//!
//! Messages are encoded by `netlink-packet-netfilter` (rust-netlink family, same
//! `netlink-packet-core` as the rest of weir) and carried over a blocking `netlink-sys` socket.
//! The socket lives in the network namespace of the thread that opened it.

use std::io;

use netlink_packet_core::ParseableParametrized;
use netlink_packet_core::{DefaultNla, NetlinkMessage, Nla, NLM_F_ACK, NLM_F_DUMP, NLM_F_REQUEST};
use netlink_packet_netfilter::conntrack::IPTuple;
use netlink_packet_netfilter::conntrack::{
    ConntrackAttribute, ConntrackMessage, ProtoTuple, Tuple,
};
use netlink_packet_netfilter::{
    NetfilterHeader, NetfilterMessage, NetfilterMessageInner, NetfilterProtoFamily,
};
use netlink_sys::{protocols::NETLINK_NETFILTER, Socket, SocketAddr};
use weir_model::IpFamily;

use super::{ConntrackFilter, Flow, FlowTuple};
use crate::{Error, Result};
use weir_kernel::netlink_reply::{read_answer, Next};

// include/uapi/linux/netlink.h and nfnetlink_conntrack.h
const CTA_ID: u16 = 12;
const CTA_ZONE: u16 = 18;

/// A dumped entry: what it is, and what the kernel needs to delete exactly this one.
#[derive(Debug, Clone)]
struct Entry {
    flow: Flow,
    orig: Vec<Tuple>,
    /// CTA_ZONE (entries in another zone are distinct) and CTA_ID (the kernel refuses to
    /// delete if the tuple now belongs to a newer entry).
    extras: Vec<DefaultNla>,
}

/// A ctnetlink socket in the calling thread's network namespace. Needs CAP_NET_ADMIN.
pub struct Conntrack {
    socket: Socket,
    sequence: u32,
}

impl Conntrack {
    pub fn new() -> Result<Self> {
        let open = || -> io::Result<Socket> {
            let mut socket = Socket::new(NETLINK_NETFILTER)?;
            socket.bind_auto()?;
            socket.connect(&SocketAddr::new(0, 0))?;
            // Large tables come back in many messages; a larger buffer avoids ENOBUFS.
            socket.set_rx_buf_sz(4 << 20).ok();
            Ok(socket)
        };
        let socket = open().map_err(|e| Error::Netlink(format!("conntrack socket: {e}")))?;
        Ok(Self {
            socket,
            sequence: 0,
        })
    }

    /// Every entry of `family` in the table.
    pub fn flows(&mut self, family: IpFamily) -> Result<Vec<Flow>> {
        Ok(self
            .dump(family, |_| true)?
            .into_iter()
            .map(|e| e.flow)
            .collect())
    }

    /// Deletes every entry matching one of `filters`; returns how many the kernel removed
    /// (entries that expired in between are not counted).
    pub fn delete_matching(&mut self, filters: &[ConntrackFilter]) -> Result<usize> {
        let mut deleted = 0;
        for family in [IpFamily::V4, IpFamily::V6] {
            let mine: Vec<&ConntrackFilter> =
                filters.iter().filter(|f| f.family == family).collect();
            if mine.is_empty() {
                continue;
            }
            let stale = self.dump(family, |flow| mine.iter().any(|f| f.matches(flow)))?;
            for entry in stale {
                let mut attrs = vec![ConntrackAttribute::CtaTupleOrig(entry.orig)];
                attrs.extend(entry.extras.into_iter().map(ConntrackAttribute::Other));
                let what = format!("conntrack delete {:?}", entry.flow);
                match self.request(family, ConntrackMessage::Delete(attrs), NLM_F_ACK, |_| {}) {
                    Ok(()) => deleted += 1,
                    Err(e) if e.raw_os_error() == Some(libc::ENOENT) => {}
                    Err(e) => return Err(Error::Netlink(format!("{what}: {e}"))),
                }
            }
        }
        Ok(deleted)
    }

    fn dump(&mut self, family: IpFamily, keep: impl Fn(&Flow) -> bool) -> Result<Vec<Entry>> {
        let mut out = Vec::new();
        self.request(family, ConntrackMessage::Get(vec![]), NLM_F_DUMP, |m| {
            if let Some(e) = entry(m).filter(|e| keep(&e.flow)) {
                out.push(e);
            }
        })
        .map_err(|e| Error::Netlink(format!("conntrack dump: {e}")))?;
        Ok(out)
    }

    /// Sends one request; hands each conntrack message of the answer to `each` until the
    /// ACK or the end of the dump.
    fn request(
        &mut self,
        family: IpFamily,
        message: ConntrackMessage,
        flags: u16,
        mut each: impl FnMut(ConntrackMessage),
    ) -> io::Result<()> {
        let nf_family = match family {
            IpFamily::V4 => NetfilterProtoFamily::IPv4,
            IpFamily::V6 => NetfilterProtoFamily::IPv6,
        };
        let mut msg = NetlinkMessage::from(NetfilterMessage::new(
            NetfilterHeader::new(nf_family, 0, 0),
            message,
        ));
        self.sequence = self.sequence.wrapping_add(1);
        msg.header.flags = NLM_F_REQUEST | flags;
        msg.header.sequence_number = self.sequence;
        msg.finalize();
        let mut buf = vec![0u8; msg.buffer_len()];
        msg.serialize(&mut buf);
        self.socket.send(&buf, 0)?;
        read_answer(&mut self.socket, self.sequence, |kind, payload| {
            // An entry the decoder does not understand is skipped, not fatal: it cannot be
            // one of ours if we cannot read its tuples anyway.
            if let Ok(NetfilterMessage {
                inner: NetfilterMessageInner::Conntrack(m),
                ..
            }) = NetfilterMessage::parse_with_param(payload, kind)
            {
                each(m);
            }
            Next::More
        })
    }
}

/// Deletes every conntrack entry matching one of `filters` in the calling thread's network
/// namespace; returns how many were deleted. No filters: no netlink traffic at all.
pub fn delete(filters: &[ConntrackFilter]) -> Result<usize> {
    if filters.is_empty() {
        return Ok(0);
    }
    Conntrack::new()?.delete_matching(filters)
}

fn entry(message: ConntrackMessage) -> Option<Entry> {
    let attrs = match message {
        ConntrackMessage::New(a) | ConntrackMessage::Get(a) | ConntrackMessage::Delete(a) => a,
        _ => return None,
    };
    let (mut orig, mut reply, mut extras) = (None, None, Vec::new());
    for attr in attrs {
        match attr {
            ConntrackAttribute::CtaTupleOrig(t) => orig = Some(t),
            ConntrackAttribute::CtaTupleReply(t) => reply = Some(t),
            ConntrackAttribute::Other(nla) if matches!(nla.kind(), CTA_ID | CTA_ZONE) => {
                extras.push(nla)
            }
            _ => {}
        }
    }
    let orig = orig?;
    let (o, protocol) = flow_tuple(&orig)?;
    let (r, _) = flow_tuple(&reply?)?;
    Some(Entry {
        flow: Flow {
            protocol,
            orig: o,
            reply: r,
        },
        orig,
        extras,
    })
}

fn flow_tuple(tuples: &[Tuple]) -> Option<(FlowTuple, u8)> {
    let (mut src, mut dst, mut sport, mut dport, mut proto) = (None, None, 0, 0, None);
    for t in tuples {
        match t {
            Tuple::Ip(ips) => {
                for ip in ips {
                    match ip {
                        IPTuple::SourceAddress(a) => src = Some(*a),
                        IPTuple::DestinationAddress(a) => dst = Some(*a),
                        _ => {}
                    }
                }
            }
            Tuple::Proto(ps) => {
                for p in ps {
                    match p {
                        ProtoTuple::Protocol(n) => proto = Some(u8::from(*n)),
                        ProtoTuple::SourcePort(n) => sport = *n,
                        ProtoTuple::DestinationPort(n) => dport = *n,
                        _ => {}
                    }
                }
            }
            _ => {}
        }
    }
    Some((
        FlowTuple {
            src: src?,
            dst: dst?,
            src_port: sport,
            dst_port: dport,
        },
        proto?,
    ))
}
