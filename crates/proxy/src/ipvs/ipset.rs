//! ipset entries added and deleted over netlink (nfnetlink's ipset subsystem,
//! `include/uapi/linux/netfilter/ipset/ip_set.h`), in batches. A partial sync starts no
//! `ipset restore` process (under the test VM's emulation it was 73 of a one-endpoint sync's
//! 101 ms), and a full sync fills its freshly created sets this way (the tool took 13 of its
//! 15 s at 1,000 services); sets are still created and swapped by `ipset restore`.
//!
//! No crate speaks ipset's protocol for the set types kube-proxy uses (`ripset` handles plain
//! addresses only; `ipset` and `ipset-sys` link the C library), so the one message weir needs,
//! ADD/DEL of one entry, is encoded here on `netlink-packet-netfilter`, byte for byte as
//! ipset 7.17 sends it (the tests hold bytes captured from the tool with strace).

use std::io;
use std::net::IpAddr;

use netlink_packet_core::{DefaultNla, NetlinkMessage, NLM_F_ACK, NLM_F_REQUEST};
use netlink_packet_netfilter::{
    NetfilterHeader, NetfilterMessage, NetfilterMessageInner, NetfilterProtoFamily,
    NetfilterSubsystem,
};
use netlink_sys::{protocols::NETLINK_NETFILTER, Socket, SocketAddr};

use super::render::EntryChange;
use crate::{Error, Result};
use weir_kernel::netlink_reply::{read_acks, read_answer, Next};

// ip_set.h
const NFNL_SUBSYS_IPSET: u8 = 6;
const CMD_PROTOCOL: u8 = 1;
const CMD_ADD: u8 = 9;
const CMD_DEL: u8 = 10;
const ATTR_PROTOCOL: u16 = 1;
const ATTR_SETNAME: u16 = 2;
const ATTR_DATA: u16 = 7;
// Inside ATTR_DATA.
const ATTR_IP: u16 = 1;
const ATTR_CIDR: u16 = 3;
const ATTR_PORT: u16 = 4;
const ATTR_PROTO: u16 = 7;
const ATTR_LINENO: u16 = 9;
const ATTR_IP2: u16 = 20;
const ATTR_CIDR2: u16 = 21;
// Inside ATTR_IP and ATTR_IP2.
const ATTR_IPADDR_IPV4: u16 = 1;
const ATTR_IPADDR_IPV6: u16 = 2;
const NLA_F_NESTED: u16 = 0x8000;
const NLA_F_NET_BYTEORDER: u16 = 0x4000;
/// The protocol version weir speaks (ipset 7.x, kernels since 4.x).
const PROTOCOL: u8 = 7;
/// Bytes of requests per datagram: as for IPVS (`netlink::BATCH_BYTES`), their
/// acknowledgements must fit a receive buffer capped by the default `net.core.rmem_max`.
const BATCH_BYTES: usize = 8 << 10;

/// One entry in ipset's syntax, parsed: `30080` (bitmap:port), `10.96.0.1` (hash:ip),
/// `10.96.0.1,tcp:80` (hash:ip,port), then `,10.244.1.2` (hash:ip,port,ip) or
/// `,10.0.0.0/8` (hash:ip,port,net).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Entry {
    pub ip: Option<(IpAddr, Option<u8>)>,
    /// Protocol number (None for bitmap:port) and port.
    pub port: Option<(Option<u8>, u16)>,
    pub ip2: Option<(IpAddr, Option<u8>)>,
}

impl Entry {
    pub fn parse(text: &str) -> std::result::Result<Entry, String> {
        let bad = |why: &str| format!("ipset entry {text:?}: {why}");
        let parts: Vec<&str> = text.split(',').collect();
        if let [port] = parts[..] {
            if let Ok(port) = port.parse::<u16>() {
                return Ok(Entry {
                    port: Some((None, port)),
                    ..Entry::default()
                });
            }
        }
        if parts.len() > 3 {
            return Err(bad("more than three parts"));
        }
        let net = |s: &str| -> std::result::Result<(IpAddr, Option<u8>), String> {
            let (addr, cidr) = match s.split_once('/') {
                Some((a, c)) => (a, Some(c.parse::<u8>().map_err(|_| bad("bad prefix"))?)),
                None => (s, None),
            };
            Ok((addr.parse().map_err(|_| bad("bad address"))?, cidr))
        };
        let mut entry = Entry {
            ip: Some(net(parts[0])?),
            ..Entry::default()
        };
        if let Some(pp) = parts.get(1) {
            let (proto, port) = pp.split_once(':').ok_or_else(|| bad("no proto:port"))?;
            let proto = match proto {
                "tcp" => libc::IPPROTO_TCP,
                "udp" => libc::IPPROTO_UDP,
                "sctp" => libc::IPPROTO_SCTP,
                _ => return Err(bad("unknown protocol")),
            } as u8;
            let port = port.parse().map_err(|_| bad("bad port"))?;
            entry.port = Some((Some(proto), port));
        }
        if let Some(ip2) = parts.get(2) {
            entry.ip2 = Some(net(ip2)?);
        }
        Ok(entry)
    }
}

fn nla(kind: u16, value: &[u8]) -> DefaultNla {
    DefaultNla::new(kind, value.to_vec())
}

fn emit(attrs: &[DefaultNla]) -> Vec<u8> {
    use netlink_packet_core::Emitable;
    let mut out = vec![0u8; attrs.buffer_len()];
    attrs.emit(&mut out);
    out
}

/// `ATTR_IP`/`ATTR_IP2`: the address nested in its family's attribute, in network order.
fn addr(kind: u16, a: IpAddr) -> DefaultNla {
    let inner = match a {
        IpAddr::V4(v4) => nla(ATTR_IPADDR_IPV4 | NLA_F_NET_BYTEORDER, &v4.octets()),
        IpAddr::V6(v6) => nla(ATTR_IPADDR_IPV6 | NLA_F_NET_BYTEORDER, &v6.octets()),
    };
    nla(kind | NLA_F_NESTED, &emit(&[inner]))
}

/// The attributes of an ADD or DEL of `entry` in `set`, in the order ipset sends them.
pub fn entry_attrs(protocol: u8, set: &str, entry: &Entry) -> Vec<DefaultNla> {
    let mut name = set.as_bytes().to_vec();
    name.push(0);
    let mut data = Vec::new();
    if let Some((ip, cidr)) = entry.ip {
        data.push(addr(ATTR_IP, ip));
        if let Some(c) = cidr {
            data.push(nla(ATTR_CIDR, &[c]));
        }
    }
    if let Some((proto, port)) = entry.port {
        data.push(nla(ATTR_PORT | NLA_F_NET_BYTEORDER, &port.to_be_bytes()));
        if let Some(p) = proto {
            data.push(nla(ATTR_PROTO, &[p]));
        }
    }
    if let Some((ip2, cidr2)) = entry.ip2 {
        data.push(addr(ATTR_IP2, ip2));
        if let Some(c) = cidr2 {
            data.push(nla(ATTR_CIDR2, &[c]));
        }
    }
    data.push(nla(ATTR_LINENO | NLA_F_NET_BYTEORDER, &0u32.to_be_bytes()));
    vec![
        nla(ATTR_PROTOCOL, &[protocol]),
        nla(ATTR_SETNAME, &name),
        nla(ATTR_DATA | NLA_F_NESTED, &emit(&data)),
    ]
}

/// The command and attributes adding or deleting one entry. Sent without `NLM_F_EXCL`, the
/// kernel ignores an entry already there (add) or already gone (del), as `-exist` does.
pub fn entry_request(protocol: u8, change: &EntryChange) -> Result<(u8, Vec<DefaultNla>)> {
    let entry = Entry::parse(&change.entry).map_err(Error::Netlink)?;
    let cmd = if change.add { CMD_ADD } else { CMD_DEL };
    Ok((cmd, entry_attrs(protocol, &change.set, &entry)))
}

/// One nfnetlink ipset message, header included.
fn message(cmd: u8, attributes: Vec<DefaultNla>, flags: u16, sequence: u32) -> Vec<u8> {
    // ipset sends AF_INET whatever the set's family: the set knows its own.
    let mut msg = NetlinkMessage::from(NetfilterMessage::new(
        NetfilterHeader::new(NetfilterProtoFamily::IPv4, 0, 0),
        NetfilterMessageInner::Other {
            subsys: NetfilterSubsystem::Other(NFNL_SUBSYS_IPSET),
            message_type: cmd,
            attributes,
        },
    ));
    msg.header.flags = NLM_F_REQUEST | flags;
    msg.header.sequence_number = sequence;
    msg.finalize();
    let mut buf = vec![0u8; msg.buffer_len()];
    msg.serialize(&mut buf);
    buf
}

/// What an ipset error code (above the errno range) means.
fn describe(e: &io::Error) -> String {
    let text = match e.raw_os_error() {
        Some(4097) => "protocol error",
        Some(4102) => "the set's type does not match the entry",
        Some(4109) | Some(4110) => "the address does not match the set's family",
        Some(4352) => "the set is full, or the entry is outside its range",
        Some(4353) => "the entry does not fit the set's type",
        Some(libc::ENOENT) => "no such set",
        _ => return e.to_string(),
    };
    format!("{text} ({})", e.raw_os_error().unwrap_or_default())
}

/// An ipset netlink socket in the calling thread's network namespace. Needs CAP_NET_ADMIN.
pub struct Ipset {
    socket: Socket,
    sequence: u32,
    protocol: u8,
}

impl Ipset {
    /// Opens the socket and agrees on the protocol version (the kernel answers with its own,
    /// as it does for the `ipset` tool).
    pub fn open() -> Result<Self> {
        let socket = (|| -> io::Result<Socket> {
            let mut s = Socket::new(NETLINK_NETFILTER)?;
            s.bind_auto()?;
            s.connect(&SocketAddr::new(0, 0))?;
            Ok(s)
        })()
        .map_err(|e| Error::Netlink(format!("ipset netlink socket: {e}")))?;
        let mut me = Ipset {
            socket,
            sequence: 0,
            protocol: PROTOCOL,
        };
        let mut kernel = None;
        let query = vec![nla(ATTR_PROTOCOL, &[PROTOCOL])];
        me.exchange(CMD_PROTOCOL, query, 0, |payload| {
            // nfgenmsg (4 bytes), then attributes; ATTR_PROTOCOL is a u8.
            kernel = attributes(payload.get(4..).unwrap_or_default())
                .find(|(k, _)| *k == ATTR_PROTOCOL)
                .and_then(|(_, v)| v.first().copied());
        })
        .map_err(|e| Error::Netlink(format!("ipset protocol: {e} (is ip_set loaded?)")))?;
        me.protocol = kernel.map_or(PROTOCOL, |k| k.min(PROTOCOL));
        Ok(me)
    }

    /// Adds and deletes `changes` in order, many to a datagram (a full sync fills whole sets
    /// this way), each acknowledged. On a refusal the rest of that datagram is still applied;
    /// the first refusal is the error.
    pub fn apply(&mut self, changes: &[EntryChange]) -> Result<()> {
        let mut next = 0;
        while next < changes.len() {
            let start = next;
            let first = self.sequence.wrapping_add(1);
            let mut datagram = Vec::new();
            while next < changes.len() && datagram.len() < BATCH_BYTES {
                let (cmd, attrs) = entry_request(self.protocol, &changes[next])?;
                self.sequence = self.sequence.wrapping_add(1);
                datagram.extend(message(cmd, attrs, NLM_F_ACK, self.sequence));
                next += 1;
            }
            let failed = |i: usize, e: &io::Error| {
                Error::Netlink(format!("ipset {}: {}", changes[i], describe(e)))
            };
            self.socket
                .send(&datagram, 0)
                .map_err(|e| failed(start, &e))?;
            let refused =
                read_acks(&mut self.socket, first, next - start).map_err(|e| failed(start, &e))?;
            if let Some((i, e)) = refused {
                return Err(failed(start + i, &e));
            }
        }
        Ok(())
    }

    /// Sends one request and hands each answer's payload to `each` until the ACK (or, without
    /// `NLM_F_ACK`, the one answer).
    fn exchange(
        &mut self,
        cmd: u8,
        attributes: Vec<DefaultNla>,
        flags: u16,
        mut each: impl FnMut(&[u8]),
    ) -> io::Result<()> {
        self.sequence = self.sequence.wrapping_add(1);
        self.socket
            .send(&message(cmd, attributes, flags, self.sequence), 0)?;
        read_answer(&mut self.socket, self.sequence, |_, payload| {
            each(payload);
            if flags & NLM_F_ACK != 0 {
                Next::More
            } else {
                Next::Done
            }
        })
    }
}

/// The attributes in `buf`: (type without flags, value).
fn attributes(buf: &[u8]) -> impl Iterator<Item = (u16, &[u8])> {
    let mut rest = buf;
    std::iter::from_fn(move || {
        if rest.len() < 4 {
            return None;
        }
        let len = u16::from_ne_bytes([rest[0], rest[1]]) as usize;
        let kind = u16::from_ne_bytes([rest[2], rest[3]]) & !(NLA_F_NESTED | NLA_F_NET_BYTEORDER);
        if len < 4 || len > rest.len() {
            return None;
        }
        let value = &rest[4..len];
        rest = &rest[((len + 3) & !3).min(rest.len())..];
        Some((kind, value))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn change(add: bool, set: &str, entry: &str) -> EntryChange {
        EntryChange {
            add,
            set: set.into(),
            entry: entry.into(),
        }
    }

    fn entry_message(change: &EntryChange) -> Result<Vec<u8>> {
        let (cmd, attrs) = entry_request(7, change)?;
        Ok(message(cmd, attrs, NLM_F_ACK, 1))
    }

    /// The message after the netlink header (nfgenmsg and attributes), as strace printed
    /// what `ipset` 7.17 sent.
    fn body(msg: &[u8]) -> &[u8] {
        &msg[16..]
    }

    fn hex(s: &str) -> Vec<u8> {
        s.split("\\x")
            .filter(|b| !b.is_empty())
            .map(|b| u8::from_str_radix(b, 16).unwrap())
            .collect()
    }

    #[test]
    fn parses_every_entry_shape_kube_proxy_uses() {
        let ip = |s: &str| s.parse::<IpAddr>().unwrap();
        assert_eq!(
            Entry::parse("30080").unwrap(),
            Entry {
                port: Some((None, 30080)),
                ..Entry::default()
            }
        );
        assert_eq!(
            Entry::parse("10.96.0.1").unwrap().ip,
            Some((ip("10.96.0.1"), None))
        );
        let e = Entry::parse("10.244.1.2,udp:53,10.244.1.2").unwrap();
        assert_eq!(e.port, Some((Some(17), 53)));
        assert_eq!(e.ip2, Some((ip("10.244.1.2"), None)));
        let e = Entry::parse("fd00::1,sctp:30000,fd00:10::/64").unwrap();
        assert_eq!(e.ip, Some((ip("fd00::1"), None)));
        assert_eq!(e.port, Some((Some(132), 30000)));
        assert_eq!(e.ip2, Some((ip("fd00:10::"), Some(64))));
        for bad in [
            "10.0.0.1,icmp:1",
            "10.0.0.1,tcp",
            "x",
            "1.2.3.4,tcp:1,1.2.3.4,5",
            "1.2.3.4/x",
        ] {
            assert!(Entry::parse(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn add_to_a_hash_ip_port_net_set_is_what_ipset_sends() {
        // strace -xx ipset add T 10.0.0.1,tcp:80,10.1.0.0/16 -exist
        let msg = entry_message(&change(true, "T", "10.0.0.1,tcp:80,10.1.0.0/16")).unwrap();
        let want = [
            hex("\\x02\\x00\\x00\\x00"), // AF_INET, NFNETLINK_V0, res_id 0
            hex("\\x05\\x00\\x01\\x00\\x07\\x00\\x00\\x00"),
            hex("\\x06\\x00\\x02\\x00\\x54\\x00\\x00\\x00"),
            hex("\\x3c\\x00\\x07\\x80"),
            hex("\\x0c\\x00\\x01\\x80\\x08\\x00\\x01\\x40\\x0a\\x00\\x00\\x01\\x06\\x00\\x04\\x40\\x00\\x50\\x00\\x00\\x05\\x00\\x07\\x00\\x06\\x00\\x00\\x00\\x0c\\x00\\x14\\x80\\x08\\x00\\x01\\x40\\x0a\\x01\\x00\\x00\\x05\\x00\\x15\\x00\\x10\\x00\\x00\\x00\\x08\\x00\\x09\\x40\\x00\\x00\\x00\\x00"),
        ]
        .concat();
        assert_eq!(body(&msg), want);
        // nlmsg_type NFNL_SUBSYS_IPSET<<8|IPSET_CMD_ADD; REQUEST|ACK, no EXCL (-exist).
        assert_eq!(u16::from_ne_bytes([msg[4], msg[5]]), 6 << 8 | 9);
        assert_eq!(u16::from_ne_bytes([msg[6], msg[7]]), 0x1 | 0x4);
        assert_eq!(u32::from_ne_bytes(msg[0..4].try_into().unwrap()), 96);
    }

    #[test]
    fn del_from_a_bitmap_port_set_is_what_ipset_sends() {
        // strace -xx ipset del B 30080 -exist
        let msg = entry_message(&change(false, "B", "30080")).unwrap();
        let want = [
            hex("\\x02\\x00\\x00\\x00"),
            hex("\\x05\\x00\\x01\\x00\\x07\\x00\\x00\\x00"),
            hex("\\x06\\x00\\x02\\x00\\x42\\x00\\x00\\x00"),
            hex("\\x14\\x00\\x07\\x80"),
            hex("\\x06\\x00\\x04\\x40\\x75\\x80\\x00\\x00\\x08\\x00\\x09\\x40\\x00\\x00\\x00\\x00"),
        ]
        .concat();
        assert_eq!(body(&msg), want);
        assert_eq!(u16::from_ne_bytes([msg[4], msg[5]]), 6 << 8 | 10);
    }

    #[test]
    fn an_ipv6_hash_ip_port_ip_entry_is_what_ipset_sends() {
        // strace -xx ipset add L6 fd00::1,udp:53,fd00::2
        let msg = entry_message(&change(true, "L6", "fd00::1,udp:53,fd00::2")).unwrap();
        let v6 = |last: &str| {
            hex(&format!(
                "\\x14\\x00\\x02\\x40\\xfd{}\\x{last}",
                "\\x00".repeat(14)
            ))
        };
        let want = [
            hex("\\x02\\x00\\x00\\x00"),
            hex("\\x05\\x00\\x01\\x00\\x07\\x00\\x00\\x00"),
            hex("\\x07\\x00\\x02\\x00\\x4c\\x36\\x00\\x00"),
            hex("\\x4c\\x00\\x07\\x80"),
            hex("\\x18\\x00\\x01\\x80"),
            v6("01"),
            hex("\\x06\\x00\\x04\\x40\\x00\\x35\\x00\\x00\\x05\\x00\\x07\\x00\\x11\\x00\\x00\\x00"),
            hex("\\x18\\x00\\x14\\x80"),
            v6("02"),
            hex("\\x08\\x00\\x09\\x40\\x00\\x00\\x00\\x00"),
        ]
        .concat();
        assert_eq!(body(&msg), want);
    }

    #[test]
    fn a_malformed_entry_is_an_error_naming_it() {
        let e = entry_message(&change(true, "S", "10.0.0.1,gre:1")).unwrap_err();
        assert!(e.to_string().contains("10.0.0.1,gre:1"), "{e}");
    }
}
