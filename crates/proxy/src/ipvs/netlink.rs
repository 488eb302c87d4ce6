//! IPVS over generic netlink (`include/uapi/linux/ip_vs.h`, family "IPVS", version 1).
//!
//! No maintained Rust crate covers IPVS (`netlink-packet-ipvs` 0.0.1 is on an old
//! `netlink-packet-core`, `ipvs` only reserves the name), so the few messages weir needs are
//! encoded here: headers by `netlink-packet-generic`, attributes by `netlink-packet-core`'s
//! [`DefaultNla`]. The encoders are pure and tested against bytes written out from the uapi
//! header; [`Ipvs`] carries them over a blocking socket in the calling thread's namespace.

use std::io;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use netlink_packet_core::{
    DecodeError, DefaultNla, Emitable, NetlinkMessage, NlasIterator, ParseableParametrized,
    NLM_F_ACK, NLM_F_DUMP, NLM_F_REQUEST,
};
use netlink_packet_generic::ctrl::nlas::GenlCtrlAttrs;
use netlink_packet_generic::ctrl::{GenlCtrl, GenlCtrlCmd};
use netlink_packet_generic::{GenlFamily, GenlHeader, GenlMessage};
use netlink_sys::{protocols::NETLINK_GENERIC, Socket, SocketAddr};
use weir_model::{IpFamily, Protocol};

use crate::{Error, Result};
use weir_kernel::netlink_reply::{read_acks, read_answer, Next};

// ip_vs.h: commands.
const CMD_NEW_SERVICE: u8 = 1;
const CMD_SET_SERVICE: u8 = 2;
const CMD_DEL_SERVICE: u8 = 3;
const CMD_GET_SERVICE: u8 = 4;
const CMD_NEW_DEST: u8 = 5;
const CMD_SET_DEST: u8 = 6;
const CMD_DEL_DEST: u8 = 7;
const CMD_GET_DEST: u8 = 8;
const CMD_SET_CONFIG: u8 = 12;
// Command attributes.
const CMD_ATTR_SERVICE: u16 = 1;
const CMD_ATTR_DEST: u16 = 2;
const CMD_ATTR_TIMEOUT_TCP: u16 = 4;
const CMD_ATTR_TIMEOUT_TCP_FIN: u16 = 5;
const CMD_ATTR_TIMEOUT_UDP: u16 = 6;
// Service attributes.
const SVC_AF: u16 = 1;
const SVC_PROTOCOL: u16 = 2;
const SVC_ADDR: u16 = 3;
const SVC_PORT: u16 = 4;
const SVC_SCHED_NAME: u16 = 6;
const SVC_FLAGS: u16 = 7;
const SVC_TIMEOUT: u16 = 8;
const SVC_NETMASK: u16 = 9;
// Destination (real server) attributes.
const DEST_ADDR: u16 = 1;
const DEST_PORT: u16 = 2;
const DEST_FWD_METHOD: u16 = 3;
const DEST_WEIGHT: u16 = 4;
const DEST_U_THRESH: u16 = 5;
const DEST_L_THRESH: u16 = 6;
const DEST_ACTIVE_CONNS: u16 = 7;
const DEST_INACT_CONNS: u16 = 8;
const DEST_ADDR_FAMILY: u16 = 11;
/// `IP_VS_SVC_F_PERSISTENT`: sessionAffinity ClientIP.
const SVC_F_PERSISTENT: u32 = 0x1;
/// `IP_VS_CONN_F_MASQ`: NAT forwarding, the only method kube-proxy uses.
const FWD_MASQ: u32 = 0;
const GENL_HDRLEN: usize = 4;
/// How many bytes of requests go in one datagram: about a hundred requests, whose
/// acknowledgements (some 768 bytes of socket buffer each) stay well inside a receive buffer
/// capped by the default `net.core.rmem_max` (208 KiB); an overflow would lose them.
const BATCH_BYTES: usize = 8 << 10;

/// What identifies an IPVS virtual server (weir never uses fwmark services).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ServiceKey {
    pub protocol: Protocol,
    pub addr: IpAddr,
    pub port: u16,
}

impl ServiceKey {
    pub fn family(&self) -> IpFamily {
        IpFamily::of(&self.addr)
    }
}

impl std::fmt::Display for ServiceKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let p = self.protocol.as_str().to_uppercase();
        match self.addr {
            IpAddr::V4(a) => write!(f, "{p} {a}:{}", self.port),
            IpAddr::V6(a) => write!(f, "{p} [{a}]:{}", self.port),
        }
    }
}

/// A virtual server's settings.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ServiceSpec {
    pub scheduler: String,
    /// Persistence (sessionAffinity ClientIP) timeout in seconds.
    pub persistence: Option<u32>,
}

/// A real server of a virtual server, always masqueraded (`ipvsadm -m`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct RealServer {
    pub addr: IpAddr,
    pub port: u16,
    pub weight: u32,
}

/// A real server as the kernel reports it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RealServerState {
    pub server: RealServer,
    pub active: u32,
    pub inactive: u32,
}

/// One generic netlink IPVS message body: the command and its encoded attributes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IpvsPayload {
    pub cmd: u8,
    pub attrs: Vec<u8>,
}

impl GenlFamily for IpvsPayload {
    fn family_name() -> &'static str {
        "IPVS"
    }
    fn command(&self) -> u8 {
        self.cmd
    }
    fn version(&self) -> u8 {
        1
    }
}

impl Emitable for IpvsPayload {
    fn buffer_len(&self) -> usize {
        self.attrs.len()
    }
    fn emit(&self, buffer: &mut [u8]) {
        buffer[..self.attrs.len()].copy_from_slice(&self.attrs);
    }
}

impl ParseableParametrized<[u8], GenlHeader> for IpvsPayload {
    fn parse_with_param(buf: &[u8], header: GenlHeader) -> std::result::Result<Self, DecodeError> {
        Ok(IpvsPayload {
            cmd: header.cmd,
            attrs: buf.to_vec(),
        })
    }
}

/// One attribute, header and padding included.
fn nla(kind: u16, value: &[u8]) -> Vec<u8> {
    let a = DefaultNla::new(kind, value.to_vec());
    let mut out = vec![0u8; a.buffer_len()];
    a.emit(&mut out);
    out
}

fn nested(kind: u16, children: &[Vec<u8>]) -> Vec<u8> {
    nla(kind, &children.concat())
}

fn af(family: IpFamily) -> u16 {
    match family {
        IpFamily::V4 => libc::AF_INET as u16,
        IpFamily::V6 => libc::AF_INET6 as u16,
    }
}

fn proto_number(p: Protocol) -> u16 {
    match p {
        Protocol::Tcp => libc::IPPROTO_TCP as u16,
        Protocol::Udp => libc::IPPROTO_UDP as u16,
        Protocol::Sctp => libc::IPPROTO_SCTP as u16,
    }
}

/// `union nf_inet_addr`: 16 bytes, an IPv4 address in the first four (as ipvsadm sends it).
fn inet_addr(a: IpAddr) -> [u8; 16] {
    let mut out = [0u8; 16];
    match a {
        IpAddr::V4(v4) => out[..4].copy_from_slice(&v4.octets()),
        IpAddr::V6(v6) => out.copy_from_slice(&v6.octets()),
    }
    out
}

/// The attributes that name a virtual server.
fn service_id(key: &ServiceKey) -> Vec<Vec<u8>> {
    vec![
        nla(SVC_AF, &af(key.family()).to_ne_bytes()),
        nla(SVC_PROTOCOL, &proto_number(key.protocol).to_ne_bytes()),
        nla(SVC_ADDR, &inet_addr(key.addr)),
        nla(SVC_PORT, &key.port.to_be_bytes()),
    ]
}

/// `IPVS_CMD_ATTR_SERVICE` naming `key`, with the full settings when `spec` is given (the
/// kernel requires scheduler, flags, timeout and netmask for NEW and SET).
pub fn service_attr(key: &ServiceKey, spec: Option<&ServiceSpec>) -> Vec<u8> {
    let mut attrs = service_id(key);
    if let Some(spec) = spec {
        let mut sched = spec.scheduler.as_bytes().to_vec();
        sched.push(0);
        let flags = if spec.persistence.is_some() {
            SVC_F_PERSISTENT
        } else {
            0
        };
        // struct ip_vs_flags { flags, mask }: the mask says every bit is given.
        let mut fl = flags.to_ne_bytes().to_vec();
        fl.extend(u32::MAX.to_ne_bytes());
        // Persistence groups clients by source masked with this: the whole address
        // (kube-proxy's choice): a v4 mask, or a v6 prefix length.
        let netmask = match key.family() {
            IpFamily::V4 => u32::MAX,
            IpFamily::V6 => 128,
        };
        attrs.extend([
            nla(SVC_SCHED_NAME, &sched),
            nla(SVC_FLAGS, &fl),
            nla(SVC_TIMEOUT, &spec.persistence.unwrap_or(0).to_ne_bytes()),
            nla(SVC_NETMASK, &netmask.to_ne_bytes()),
        ]);
    }
    nested(CMD_ATTR_SERVICE, &attrs)
}

/// `IPVS_CMD_ATTR_DEST`; `full` adds what NEW and SET need (method, weight, thresholds).
pub fn dest_attr(rs: &RealServer, full: bool) -> Vec<u8> {
    let mut attrs = vec![
        nla(DEST_ADDR, &inet_addr(rs.addr)),
        nla(DEST_PORT, &rs.port.to_be_bytes()),
        nla(DEST_ADDR_FAMILY, &af(IpFamily::of(&rs.addr)).to_ne_bytes()),
    ];
    if full {
        attrs.extend([
            nla(DEST_FWD_METHOD, &FWD_MASQ.to_ne_bytes()),
            nla(DEST_WEIGHT, &rs.weight.to_ne_bytes()),
            nla(DEST_U_THRESH, &0u32.to_ne_bytes()),
            nla(DEST_L_THRESH, &0u32.to_ne_bytes()),
        ]);
    }
    nested(CMD_ATTR_DEST, &attrs)
}

/// The requests weir sends.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Request {
    NewService(ServiceKey, ServiceSpec),
    SetService(ServiceKey, ServiceSpec),
    DelService(ServiceKey),
    NewDest(ServiceKey, RealServer),
    SetDest(ServiceKey, RealServer),
    DelDest(ServiceKey, RealServer),
}

impl Request {
    pub fn payload(&self) -> IpvsPayload {
        let (cmd, attrs) = match self {
            Request::NewService(k, s) => (CMD_NEW_SERVICE, service_attr(k, Some(s))),
            Request::SetService(k, s) => (CMD_SET_SERVICE, service_attr(k, Some(s))),
            Request::DelService(k) => (CMD_DEL_SERVICE, service_attr(k, None)),
            Request::NewDest(k, r) => (
                CMD_NEW_DEST,
                [service_attr(k, None), dest_attr(r, true)].concat(),
            ),
            Request::SetDest(k, r) => (
                CMD_SET_DEST,
                [service_attr(k, None), dest_attr(r, true)].concat(),
            ),
            Request::DelDest(k, r) => (
                CMD_DEL_DEST,
                [service_attr(k, None), dest_attr(r, false)].concat(),
            ),
        };
        IpvsPayload { cmd, attrs }
    }
}

/// `ipvsadm --set tcp tcpfin udp`: connection timeouts in seconds; 0 leaves one unchanged.
pub fn set_timeouts(tcp: u32, tcp_fin: u32, udp: u32) -> IpvsPayload {
    IpvsPayload {
        cmd: CMD_SET_CONFIG,
        attrs: [
            nla(CMD_ATTR_TIMEOUT_TCP, &tcp.to_ne_bytes()),
            nla(CMD_ATTR_TIMEOUT_TCP_FIN, &tcp_fin.to_ne_bytes()),
            nla(CMD_ATTR_TIMEOUT_UDP, &udp.to_ne_bytes()),
        ]
        .concat(),
    }
}

fn attrs(buf: &[u8]) -> impl Iterator<Item = (u16, &[u8])> {
    NlasIterator::new(buf).filter_map(|n| n.ok()).map(|n| {
        let (kind, len) = (n.kind() & 0x3fff, n.length() as usize);
        (kind, &n.into_inner()[4..len])
    })
}

fn u16_ne(v: &[u8]) -> Option<u16> {
    Some(u16::from_ne_bytes(v.get(..2)?.try_into().ok()?))
}

fn u32_ne(v: &[u8]) -> Option<u32> {
    Some(u32::from_ne_bytes(v.get(..4)?.try_into().ok()?))
}

fn addr_of(family: u16, v: &[u8]) -> Option<IpAddr> {
    if family == libc::AF_INET as u16 {
        let o: [u8; 4] = v.get(..4)?.try_into().ok()?;
        Some(IpAddr::V4(Ipv4Addr::from(o)))
    } else if family == libc::AF_INET6 as u16 {
        let o: [u8; 16] = v.get(..16)?.try_into().ok()?;
        Some(IpAddr::V6(Ipv6Addr::from(o)))
    } else {
        None
    }
}

/// A virtual server from a GET_SERVICE answer; `None` for fwmark services and other
/// families or protocols (not weir's).
pub fn parse_service(payload: &[u8]) -> Option<(ServiceKey, ServiceSpec)> {
    let (_, svc) = attrs(payload).find(|(k, _)| *k == CMD_ATTR_SERVICE)?;
    let (mut family, mut proto, mut addr, mut port) = (None, None, None, None);
    let (mut sched, mut flags, mut timeout) = (String::new(), 0, 0);
    for (k, v) in attrs(svc) {
        match k {
            SVC_AF => family = u16_ne(v),
            SVC_PROTOCOL => proto = u16_ne(v),
            SVC_ADDR => addr = Some(v),
            SVC_PORT => port = v.get(..2).map(|b| u16::from_be_bytes([b[0], b[1]])),
            SVC_SCHED_NAME => {
                sched = String::from_utf8_lossy(v.split(|b| *b == 0).next().unwrap_or(v)).into()
            }
            SVC_FLAGS => flags = u32_ne(v).unwrap_or(0),
            SVC_TIMEOUT => timeout = u32_ne(v).unwrap_or(0),
            _ => {}
        }
    }
    let protocol = match proto? as i32 {
        libc::IPPROTO_TCP => Protocol::Tcp,
        libc::IPPROTO_UDP => Protocol::Udp,
        libc::IPPROTO_SCTP => Protocol::Sctp,
        _ => return None,
    };
    let key = ServiceKey {
        protocol,
        addr: addr_of(family?, addr?)?,
        port: port?,
    };
    let persistence = (flags & SVC_F_PERSISTENT != 0).then_some(timeout);
    Some((
        key,
        ServiceSpec {
            scheduler: sched,
            persistence,
        },
    ))
}

/// A real server from a GET_DEST answer (`family` of its virtual server, for kernels that
/// do not send the destination's own).
pub fn parse_dest(payload: &[u8], family: IpFamily) -> Option<RealServerState> {
    let (_, d) = attrs(payload).find(|(k, _)| *k == CMD_ATTR_DEST)?;
    let (mut addr, mut port, mut weight) = (None, None, 0);
    let (mut active, mut inactive, mut dfamily) = (0, 0, af(family));
    for (k, v) in attrs(d) {
        match k {
            DEST_ADDR => addr = Some(v),
            DEST_PORT => port = v.get(..2).map(|b| u16::from_be_bytes([b[0], b[1]])),
            DEST_WEIGHT => weight = u32_ne(v).unwrap_or(0),
            DEST_ACTIVE_CONNS => active = u32_ne(v).unwrap_or(0),
            DEST_INACT_CONNS => inactive = u32_ne(v).unwrap_or(0),
            DEST_ADDR_FAMILY => dfamily = u16_ne(v).unwrap_or(dfamily),
            _ => {}
        }
    }
    Some(RealServerState {
        server: RealServer {
            addr: addr_of(dfamily, addr?)?,
            port: port?,
            weight,
        },
        active,
        inactive,
    })
}

/// A generic netlink socket bound to the IPVS family, in the calling thread's namespace.
pub struct Ipvs {
    socket: Socket,
    family_id: u16,
    sequence: u32,
}

impl Ipvs {
    /// Opens the socket and resolves the family; fails when the kernel has no IPVS.
    pub fn open() -> Result<Self> {
        let socket = (|| -> io::Result<Socket> {
            let mut s = Socket::new(NETLINK_GENERIC)?;
            s.bind_auto()?;
            s.connect(&SocketAddr::new(0, 0))?;
            s.set_rx_buf_sz(4 << 20).ok();
            Ok(s)
        })()
        .map_err(|e| Error::Netlink(format!("generic netlink socket: {e}")))?;
        let mut me = Ipvs {
            socket,
            family_id: 0,
            sequence: 0,
        };
        let mut id = None;
        let ctrl = GenlCtrl {
            cmd: GenlCtrlCmd::GetFamily,
            nlas: vec![GenlCtrlAttrs::FamilyName("IPVS".into())],
        };
        me.exchange(
            GenlMessage::from_payload(ctrl),
            libc::GENL_ID_CTRL as u16,
            0,
            |p| {
                // CTRL_ATTR_FAMILY_ID (1), a u16.
                if let Some((_, v)) = attrs(p).find(|(k, _)| *k == 1) {
                    id = u16_ne(v);
                }
            },
        )
        .map_err(|e| {
            Error::Netlink(format!(
                "IPVS generic netlink family: {e} (is the ip_vs module loaded?)"
            ))
        })?;
        me.family_id = id.ok_or_else(|| Error::Netlink("IPVS family id missing".into()))?;
        Ok(me)
    }

    /// Sends one request and waits for its acknowledgement.
    pub fn request(&mut self, r: &Request) -> io::Result<()> {
        self.send_payload(r.payload())
    }

    pub fn send_payload(&mut self, p: IpvsPayload) -> io::Result<()> {
        self.exchange(
            GenlMessage::from_payload(p),
            self.family_id,
            NLM_F_ACK,
            |_| {},
        )
    }

    /// Sends `reqs` in order, many to a datagram, and waits for every acknowledgement. The
    /// kernel takes a datagram's messages one by one and acknowledges each, so a full sync's
    /// tens of thousands of requests cost a few hundred system calls, not one round trip each.
    /// On a refusal the rest of that datagram is still applied; the first refusal is returned
    /// with its request's index.
    pub fn request_all(&mut self, reqs: &[Request]) -> std::result::Result<(), (usize, io::Error)> {
        let mut next = 0;
        while next < reqs.len() {
            let start = next;
            let first = self.sequence.wrapping_add(1);
            let mut datagram = Vec::new();
            while next < reqs.len() && datagram.len() < BATCH_BYTES {
                datagram.extend(
                    self.encode(GenlMessage::from_payload(reqs[next].payload()), NLM_F_ACK),
                );
                next += 1;
            }
            self.socket.send(&datagram, 0).map_err(|e| (start, e))?;
            let refused =
                read_acks(&mut self.socket, first, next - start).map_err(|e| (start, e))?;
            if let Some((i, e)) = refused {
                return Err((start + i, e));
            }
        }
        Ok(())
    }

    /// Every virtual server (fwmark ones left out).
    pub fn services(&mut self) -> io::Result<Vec<(ServiceKey, ServiceSpec)>> {
        let mut out = Vec::new();
        let p = IpvsPayload {
            cmd: CMD_GET_SERVICE,
            attrs: vec![],
        };
        self.exchange(
            GenlMessage::from_payload(p),
            self.family_id,
            NLM_F_DUMP,
            |b| {
                out.extend(parse_service(b));
            },
        )?;
        Ok(out)
    }

    /// One virtual server's settings, or None when the kernel has none at `key`.
    pub fn service(&mut self, key: &ServiceKey) -> io::Result<Option<ServiceSpec>> {
        let mut found = None;
        let p = IpvsPayload {
            cmd: CMD_GET_SERVICE,
            attrs: service_attr(key, None),
        };
        match self.exchange(GenlMessage::from_payload(p), self.family_id, 0, |b| {
            found = parse_service(b).map(|(_, spec)| spec);
        }) {
            Ok(()) => Ok(found),
            Err(e) if e.raw_os_error() == Some(libc::ESRCH) => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// The real servers of one virtual server, with their connection counts.
    pub fn dests(&mut self, key: &ServiceKey) -> io::Result<Vec<RealServerState>> {
        let mut out = Vec::new();
        let p = IpvsPayload {
            cmd: CMD_GET_DEST,
            attrs: service_attr(key, None),
        };
        let family = key.family();
        self.exchange(
            GenlMessage::from_payload(p),
            self.family_id,
            NLM_F_DUMP,
            |b| {
                out.extend(parse_dest(b, family));
            },
        )?;
        Ok(out)
    }

    /// An IPVS message with the next sequence number.
    fn encode(&mut self, msg: GenlMessage<IpvsPayload>, flags: u16) -> Vec<u8> {
        self.encode_for(msg, self.family_id, flags)
    }

    fn encode_for<F>(&mut self, mut msg: GenlMessage<F>, family_id: u16, flags: u16) -> Vec<u8>
    where
        F: GenlFamily + Emitable + std::fmt::Debug,
    {
        msg.set_resolved_family_id(family_id);
        let mut nl = NetlinkMessage::from(msg);
        self.sequence = self.sequence.wrapping_add(1);
        nl.header.flags = NLM_F_REQUEST | flags;
        nl.header.sequence_number = self.sequence;
        nl.finalize();
        let mut buf = vec![0u8; nl.buffer_len()];
        nl.serialize(&mut buf);
        buf
    }

    /// Sends `msg` and hands the attribute bytes of each answer to `each` until the ACK or
    /// the end of the dump.
    fn exchange<F>(
        &mut self,
        msg: GenlMessage<F>,
        family_id: u16,
        flags: u16,
        mut each: impl FnMut(&[u8]),
    ) -> io::Result<()>
    where
        F: GenlFamily + Emitable + std::fmt::Debug,
    {
        let buf = self.encode_for(msg, family_id, flags);
        self.socket.send(&buf, 0)?;
        read_answer(&mut self.socket, self.sequence, |_, payload| {
            if let Some(a) = payload.get(GENL_HDRLEN..) {
                each(a);
            }
            // A plain (non-dump) answer without ACK ends here.
            if flags & (NLM_F_DUMP | NLM_F_ACK) == 0 {
                Next::Done
            } else {
                Next::More
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key() -> ServiceKey {
        ServiceKey {
            protocol: Protocol::Tcp,
            addr: "10.96.0.1".parse().unwrap(),
            port: 80,
        }
    }

    /// NEW_SERVICE TCP 10.96.0.1:80 rr, written out from ip_vs.h by hand (little endian
    /// host order, network order port).
    #[test]
    fn new_service_bytes_follow_ip_vs_h() {
        let spec = ServiceSpec {
            scheduler: "rr".into(),
            persistence: None,
        };
        let p = Request::NewService(key(), spec).payload();
        assert_eq!(p.cmd, 1);
        #[rustfmt::skip]
        let want: Vec<u8> = vec![
            84, 0, 1, 0,                       // IPVS_CMD_ATTR_SERVICE, nested, 80 bytes inside
            6, 0, 1, 0, 2, 0, 0, 0,            // AF = AF_INET
            6, 0, 2, 0, 6, 0, 0, 0,            // PROTOCOL = TCP
            20, 0, 3, 0, 10, 96, 0, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, // ADDR
            6, 0, 4, 0, 0, 80, 0, 0,           // PORT, big endian
            7, 0, 6, 0, b'r', b'r', 0, 0,      // SCHED_NAME "rr\0"
            12, 0, 7, 0, 0, 0, 0, 0, 255, 255, 255, 255, // FLAGS {0, mask ~0}
            8, 0, 8, 0, 0, 0, 0, 0,            // TIMEOUT 0
            8, 0, 9, 0, 255, 255, 255, 255,    // NETMASK
        ];
        assert_eq!(p.attrs, want);
    }

    #[test]
    fn persistence_sets_the_flag_and_timeout() {
        let spec = ServiceSpec {
            scheduler: "sh".into(),
            persistence: Some(10800),
        };
        let a = service_attr(&key(), Some(&spec));
        // FLAGS then TIMEOUT after "sh\0" (same length as "rr\0").
        assert_eq!(&a[56..68], &[12, 0, 7, 0, 1, 0, 0, 0, 255, 255, 255, 255]);
        assert_eq!(&a[68..76], &[8, 0, 8, 0, 0x30, 0x2a, 0, 0]);
        let (k, s) = parse_service(&a).unwrap();
        assert_eq!((k, s), (key(), spec));
    }

    #[test]
    fn new_dest_bytes_follow_ip_vs_h() {
        let rs = RealServer {
            addr: "10.244.1.5".parse().unwrap(),
            port: 8080,
            weight: 1,
        };
        let p = Request::NewDest(key(), rs).payload();
        assert_eq!(p.cmd, 5);
        // The service part names it only: AF, PROTOCOL, ADDR, PORT.
        assert_eq!(&p.attrs[..4], &[48, 0, 1, 0]);
        #[rustfmt::skip]
        let dest: Vec<u8> = vec![
            72, 0, 2, 0,                       // IPVS_CMD_ATTR_DEST
            20, 0, 1, 0, 10, 244, 1, 5, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, // ADDR
            6, 0, 2, 0, 0x1f, 0x90, 0, 0,      // PORT 8080
            6, 0, 11, 0, 2, 0, 0, 0,           // ADDR_FAMILY
            8, 0, 3, 0, 0, 0, 0, 0,            // FWD_METHOD masq
            8, 0, 4, 0, 1, 0, 0, 0,            // WEIGHT 1
            8, 0, 5, 0, 0, 0, 0, 0,            // U_THRESH
            8, 0, 6, 0, 0, 0, 0, 0,            // L_THRESH
        ];
        assert_eq!(&p.attrs[48..], &dest[..]);
        let got = parse_dest(&p.attrs[48..], IpFamily::V4).unwrap();
        assert_eq!(got.server, rs);
    }

    #[test]
    fn ipv6_service_round_trips() {
        let k = ServiceKey {
            protocol: Protocol::Udp,
            addr: "fd00::a".parse().unwrap(),
            port: 53,
        };
        let s = ServiceSpec {
            scheduler: "mh".into(),
            persistence: None,
        };
        assert_eq!(parse_service(&service_attr(&k, Some(&s))), Some((k, s)));
    }
}
