//! A blocking rtnetlink client: one socket, bound to the namespace it was opened in.
//!
//! A netlink socket keeps the namespace it was created in for its whole life, so a caller that
//! needs both the host and a container namespace opens one [`Rtnl`] in each and never has to
//! switch namespaces while talking to the kernel.

use std::io;
use std::net::IpAddr;

use ipnet::IpNet;
use netlink_packet_core::{
    NetlinkMessage, NetlinkPayload, NLM_F_ACK, NLM_F_CREATE, NLM_F_DUMP, NLM_F_EXCL,
    NLM_F_MULTIPART, NLM_F_REPLACE, NLM_F_REQUEST,
};
use netlink_packet_route::address::{AddressAttribute, AddressMessage};
use netlink_packet_route::link::{
    InfoData, InfoKind, InfoVxlan, LinkAttribute, LinkFlags, LinkInfo, LinkMessage,
};
use netlink_packet_route::neighbour::{
    NeighbourAddress, NeighbourAttribute, NeighbourFlags, NeighbourMessage, NeighbourState,
};
use netlink_packet_route::route::{
    RouteAddress, RouteAttribute, RouteFlags, RouteMessage, RouteProtocol,
};
use netlink_packet_route::rule::RuleMessage;
use netlink_packet_route::{AddressFamily, RouteNetlinkMessage};
use netlink_sys::{protocols::NETLINK_ROUTE, Socket, SocketAddr};

use crate::{netlink_reply, NetNs};

/// Address families of dumps (`Inet`, `Inet6`, `Bridge` for forwarding entries).
pub use netlink_packet_route::AddressFamily as Family;

/// A failed netlink request: the kernel's errno and what we asked for.
#[derive(Debug, thiserror::Error)]
#[error("{context}: {source}")]
pub struct NlError {
    pub context: String,
    #[source]
    pub source: io::Error,
}

impl NlError {
    fn new(context: impl Into<String>, source: io::Error) -> Self {
        Self {
            context: context.into(),
            source,
        }
    }
    pub fn errno(&self) -> Option<i32> {
        self.source.raw_os_error()
    }
    /// The object already exists (EEXIST).
    pub fn is_exists(&self) -> bool {
        self.errno() == Some(libc::EEXIST)
    }
    /// The object, or the device it refers to, is gone (ENOENT, ENODEV, ESRCH, EADDRNOTAVAIL).
    pub fn is_not_found(&self) -> bool {
        matches!(
            self.errno(),
            Some(libc::ENOENT) | Some(libc::ENODEV) | Some(libc::ESRCH) | Some(libc::EADDRNOTAVAIL)
        )
    }
}

pub type Result<T> = std::result::Result<T, NlError>;

/// The facts about a link that weir reads back.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Link {
    pub index: u32,
    pub name: String,
    pub mac: Vec<u8>,
    pub mtu: u32,
    pub up: bool,
    /// Index of the bridge (or other controller) this link is a port of.
    pub controller: Option<u32>,
    /// `veth`, `bridge`, `vxlan`, … (None for physical or unknown links).
    pub kind: Option<String>,
    /// For a veth: the peer's index, valid in the peer's namespace.
    pub peer_index: Option<u32>,
    /// The interface alias (IFLA_IFALIAS), if one is set.
    pub alias: Option<String>,
    /// For a vxlan device: its tunnel settings.
    pub vxlan: Option<VxlanInfo>,
}

/// The settings of a vxlan device that weir compares.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct VxlanInfo {
    pub vni: Option<u32>,
    pub local: Option<IpAddr>,
    pub port: Option<u16>,
    /// Index of the underlay device (`dev` in `ip link add … type vxlan`).
    pub underlay: Option<u32>,
    pub learning: Option<bool>,
}

impl VxlanInfo {
    fn from_infos(infos: &[InfoVxlan]) -> Self {
        let mut v = VxlanInfo::default();
        for info in infos {
            match info {
                InfoVxlan::Id(id) => v.vni = Some(*id),
                InfoVxlan::Local(a) => v.local = Some(IpAddr::V4(*a)),
                InfoVxlan::Local6(a) => v.local = Some(IpAddr::V6(*a)),
                InfoVxlan::Port(p) => v.port = Some(*p),
                InfoVxlan::Link(l) => v.underlay = Some(*l),
                InfoVxlan::Learning(l) => v.learning = Some(*l),
                _ => {}
            }
        }
        v
    }
}

impl Link {
    fn from_message(msg: &LinkMessage) -> Self {
        let mut link = Link {
            index: msg.header.index,
            name: String::new(),
            mac: Vec::new(),
            mtu: 0,
            up: msg.header.flags.contains(LinkFlags::Up),
            controller: None,
            kind: None,
            peer_index: None,
            alias: None,
            vxlan: None,
        };
        for attr in &msg.attributes {
            match attr {
                LinkAttribute::IfName(n) => link.name = n.clone(),
                LinkAttribute::Address(a) => link.mac = a.clone(),
                LinkAttribute::Mtu(m) => link.mtu = *m,
                LinkAttribute::Controller(c) => link.controller = Some(*c),
                LinkAttribute::Link(l) => link.peer_index = Some(*l),
                LinkAttribute::IfAlias(a) if !a.is_empty() => link.alias = Some(a.clone()),
                LinkAttribute::LinkInfo(infos) => {
                    for info in infos {
                        match info {
                            LinkInfo::Kind(kind) => link.kind = Some(kind_name(kind)),
                            LinkInfo::Data(InfoData::Vxlan(v)) => {
                                link.vxlan = Some(VxlanInfo::from_infos(v))
                            }
                            _ => {}
                        }
                    }
                }
                _ => {}
            }
        }
        link
    }

    /// The MAC address as `aa:bb:cc:dd:ee:ff`.
    pub fn mac_string(&self) -> String {
        self.mac
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect::<Vec<_>>()
            .join(":")
    }
}

fn kind_name(kind: &InfoKind) -> String {
    match kind {
        InfoKind::Veth => "veth".into(),
        InfoKind::Bridge => "bridge".into(),
        InfoKind::Vxlan => "vxlan".into(),
        InfoKind::Dummy => "dummy".into(),
        other => format!("{other:?}").to_lowercase(),
    }
}

/// An address as the kernel reports it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Address {
    pub index: u32,
    pub net: IpNet,
}

impl Address {
    fn from_message(m: &AddressMessage) -> Option<Self> {
        // IFA_LOCAL is the interface's own address on point-to-point links; IFA_ADDRESS otherwise.
        let mut addr = None;
        for attr in &m.attributes {
            match attr {
                AddressAttribute::Local(a) => addr = Some(*a),
                AddressAttribute::Address(a) if addr.is_none() => addr = Some(*a),
                _ => {}
            }
        }
        let net = IpNet::new(addr?, m.header.prefix_len).ok()?;
        Some(Address {
            index: m.header.index,
            net,
        })
    }
}

/// Requests per datagram of [`Rtnl::request_batch`], in bytes. Their acknowledgements must
/// fit the socket's receive buffer (a refusal echoes its request), which the default
/// `net.core.rmem_max` caps at 208 KiB: 8 KiB leaves room for refusals with extended acks.
pub const BATCH_BYTES: usize = 8 * 1024;

pub struct Rtnl {
    socket: Socket,
    sequence: u32,
}

impl Rtnl {
    /// A client in the calling thread's current namespace.
    pub fn new() -> io::Result<Self> {
        let mut socket = Socket::new(NETLINK_ROUTE)?;
        socket.bind_auto()?;
        socket.connect(&SocketAddr::new(0, 0))?;
        socket.set_ext_ack(true).ok();
        Ok(Self {
            socket,
            sequence: 0,
        })
    }

    /// A client bound to `ns`; the calling thread's namespace is unchanged afterwards.
    pub fn in_netns(ns: &NetNs) -> io::Result<Self> {
        let _guard = ns.enter()?;
        Self::new()
    }

    /// Sends one request and collects every reply until the ACK or the end of a dump.
    pub fn request(
        &mut self,
        message: RouteNetlinkMessage,
        flags: u16,
        context: &str,
    ) -> Result<Vec<RouteNetlinkMessage>> {
        let mut msg = NetlinkMessage::from(message);
        self.sequence = self.sequence.wrapping_add(1);
        msg.header.flags = flags;
        msg.header.sequence_number = self.sequence;
        msg.finalize();
        let mut buf = vec![0u8; msg.buffer_len()];
        msg.serialize(&mut buf);
        self.socket
            .send(&buf, 0)
            .map_err(|e| NlError::new(context, e))?;

        let mut replies = Vec::new();
        loop {
            let (data, _) = self
                .socket
                .recv_from_full()
                .map_err(|e| NlError::new(context, e))?;
            let mut offset = 0;
            while offset < data.len() {
                let reply = NetlinkMessage::<RouteNetlinkMessage>::deserialize(&data[offset..])
                    .map_err(|e| NlError::new(context, io::Error::other(e.to_string())))?;
                let len = reply.header.length as usize;
                if len == 0 {
                    break;
                }
                offset += (len + 3) & !3;
                if reply.header.sequence_number != self.sequence {
                    continue; // a late answer to an earlier request
                }
                let multipart = reply.header.flags & NLM_F_MULTIPART != 0;
                match reply.payload {
                    NetlinkPayload::Done(_) => return Ok(replies),
                    NetlinkPayload::Error(e) if e.code.is_none() => return Ok(replies),
                    NetlinkPayload::Error(e) => return Err(NlError::new(context, e.to_io())),
                    NetlinkPayload::InnerMessage(inner) => {
                        replies.push(inner);
                        if !multipart && flags & NLM_F_ACK == 0 {
                            return Ok(replies);
                        }
                    }
                    _ => {}
                }
            }
        }
    }

    /// Sends `requests` (each a message and its flags; every one acknowledged) many to a
    /// datagram and returns each one's outcome, in order: one round trip per
    /// [`BATCH_BYTES`] of requests instead of one per request. `context` names a request in
    /// its error.
    pub fn request_batch(
        &mut self,
        requests: Vec<(RouteNetlinkMessage, u16)>,
        context: impl Fn(usize) -> String,
    ) -> Vec<Result<()>> {
        let mut outcomes: Vec<Option<io::Result<()>>> = Vec::with_capacity(requests.len());
        let mut pending = requests.into_iter().peekable();
        while pending.peek().is_some() {
            let start = outcomes.len();
            let first = self.sequence.wrapping_add(1);
            let mut datagram = Vec::new();
            while datagram.len() < BATCH_BYTES {
                let Some((message, flags)) = pending.next() else {
                    break;
                };
                let mut msg = NetlinkMessage::from(message);
                self.sequence = self.sequence.wrapping_add(1);
                msg.header.flags = flags | NLM_F_ACK;
                msg.header.sequence_number = self.sequence;
                msg.finalize();
                let at = datagram.len();
                datagram.resize(at + msg.buffer_len(), 0);
                msg.serialize(&mut datagram[at..]);
                outcomes.push(None);
            }
            let batch = &mut outcomes[start..];
            let count = batch.len();
            let answered = self.socket.send(&datagram, 0).and_then(|_| {
                netlink_reply::read_each_ack(&mut self.socket, first, count, |i, errno| {
                    batch[i] = Some(match errno {
                        0 => Ok(()),
                        e => Err(io::Error::from_raw_os_error(e)),
                    })
                })
            });
            if let Err(e) = answered {
                // Whatever was not acknowledged has an unknown fate: it reports the failure.
                for o in batch.iter_mut().filter(|o| o.is_none()) {
                    *o = Some(Err(io::Error::new(e.kind(), e.to_string())));
                }
            }
        }
        outcomes
            .into_iter()
            .enumerate()
            .map(|(i, o)| {
                o.expect("every request has an outcome")
                    .map_err(|e| NlError::new(context(i), e))
            })
            .collect()
    }

    fn create(&mut self, message: RouteNetlinkMessage, context: &str) -> Result<()> {
        let flags = NLM_F_REQUEST | NLM_F_ACK | NLM_F_CREATE | NLM_F_EXCL;
        self.request(message, flags, context).map(|_| ())
    }

    fn change(&mut self, message: RouteNetlinkMessage, context: &str) -> Result<()> {
        self.request(message, NLM_F_REQUEST | NLM_F_ACK, context)
            .map(|_| ())
    }

    /// Creates the object, or replaces the one with the same key (`ip … replace`).
    fn replace(&mut self, message: RouteNetlinkMessage, context: &str) -> Result<()> {
        let flags = NLM_F_REQUEST | NLM_F_ACK | NLM_F_CREATE | NLM_F_REPLACE;
        self.request(message, flags, context).map(|_| ())
    }

    /// The replies to a Get request's dump that `pick` keeps (`what` names them in errors).
    fn dump<T>(
        &mut self,
        request: RouteNetlinkMessage,
        what: &str,
        pick: impl FnMut(RouteNetlinkMessage) -> Option<T>,
    ) -> Result<Vec<T>> {
        let replies = self.request(request, NLM_F_REQUEST | NLM_F_DUMP, &format!("list {what}"))?;
        Ok(replies.into_iter().filter_map(pick).collect())
    }

    // ---- links ----

    pub fn links(&mut self) -> Result<Vec<Link>> {
        self.dump(
            RouteNetlinkMessage::GetLink(LinkMessage::default()),
            "links",
            |r| match r {
                RouteNetlinkMessage::NewLink(m) => Some(Link::from_message(&m)),
                _ => None,
            },
        )
    }

    /// The link called `name`, or None when there is none.
    pub fn link_by_name(&mut self, name: &str) -> Result<Option<Link>> {
        let mut msg = LinkMessage::default();
        msg.attributes.push(LinkAttribute::IfName(name.to_string()));
        match self.request(
            RouteNetlinkMessage::GetLink(msg),
            NLM_F_REQUEST,
            &format!("get link {name}"),
        ) {
            Ok(replies) => Ok(replies.iter().find_map(|r| match r {
                RouteNetlinkMessage::NewLink(m) => Some(Link::from_message(m)),
                _ => None,
            })),
            Err(e) if e.is_not_found() => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// Like [`Rtnl::link_by_name`] but absence is an error.
    pub fn require_link(&mut self, name: &str) -> Result<Link> {
        self.link_by_name(name)?.ok_or_else(|| {
            NlError::new(
                format!("link {name}"),
                io::Error::from_raw_os_error(libc::ENODEV),
            )
        })
    }

    /// Creates a link from an rtnetlink builder message (`LinkVeth::new(..).build()`, …).
    pub fn link_add(&mut self, msg: LinkMessage, what: &str) -> Result<()> {
        self.create(RouteNetlinkMessage::NewLink(msg), &format!("create {what}"))
    }

    /// Changes a link (`ip link set`), from a builder message that carries the index.
    pub fn link_set(&mut self, msg: LinkMessage, what: &str) -> Result<()> {
        self.change(RouteNetlinkMessage::SetLink(msg), &format!("set {what}"))
    }

    /// Changes bridge-port (or bond-port) settings: these need RTM_NEWLINK without NLM_F_CREATE.
    pub fn link_set_port(&mut self, msg: LinkMessage, what: &str) -> Result<()> {
        self.change(RouteNetlinkMessage::NewLink(msg), &format!("set {what}"))
    }

    pub fn link_up(&mut self, index: u32, what: &str) -> Result<()> {
        let msg = rtnetlink::LinkUnspec::new_with_index(index).up().build();
        self.link_set(msg, &format!("{what} up"))
    }

    pub fn link_set_mtu(&mut self, index: u32, mtu: u32, what: &str) -> Result<()> {
        let msg = rtnetlink::LinkUnspec::new_with_index(index)
            .mtu(mtu)
            .build();
        self.link_set(msg, &format!("{what} mtu {mtu}"))
    }

    pub fn link_del(&mut self, index: u32, what: &str) -> Result<()> {
        let mut msg = LinkMessage::default();
        msg.header.index = index;
        self.change(RouteNetlinkMessage::DelLink(msg), &format!("delete {what}"))
    }

    /// Deletes the link called `name`; absence is success.
    pub fn link_del_by_name(&mut self, name: &str) -> Result<bool> {
        match self.link_by_name(name)? {
            Some(link) => match self.link_del(link.index, name) {
                Ok(()) => Ok(true),
                Err(e) if e.is_not_found() => Ok(false),
                Err(e) => Err(e),
            },
            None => Ok(false),
        }
    }

    // ---- addresses ----

    pub fn addr_add(&mut self, index: u32, net: IpNet) -> Result<()> {
        self.create(
            RouteNetlinkMessage::NewAddress(address_message(index, net)),
            &format!("add address {net}"),
        )
    }

    /// Removes an address from a link.
    pub fn addr_del(&mut self, index: u32, net: IpNet) -> Result<()> {
        self.change(
            RouteNetlinkMessage::DelAddress(address_message(index, net)),
            &format!("delete address {net}"),
        )
    }

    /// Adds an address unless the link already has it.
    pub fn addr_ensure(&mut self, index: u32, net: IpNet) -> Result<()> {
        exists_is_ok(self.addr_add(index, net))
    }

    /// Adds (`true`) and deletes (`false`) addresses of link `index` in the given order, in
    /// batches ([`Rtnl::request_batch`]). An address to add that is there already, or one to
    /// delete that is gone, is success; the first other refusal is returned, after every
    /// request has been made.
    pub fn addrs_change(&mut self, index: u32, changes: &[(IpNet, bool)]) -> Result<()> {
        let requests = changes
            .iter()
            .map(|(net, add)| match add {
                true => (
                    RouteNetlinkMessage::NewAddress(address_message(index, *net)),
                    NLM_F_REQUEST | NLM_F_CREATE | NLM_F_EXCL,
                ),
                false => (
                    RouteNetlinkMessage::DelAddress(address_message(index, *net)),
                    NLM_F_REQUEST,
                ),
            })
            .collect();
        let context = |i: usize| match changes[i] {
            (net, true) => format!("add address {net}"),
            (net, false) => format!("delete address {net}"),
        };
        let outcomes = self.request_batch(requests, context);
        for (outcome, (_, add)) in outcomes.into_iter().zip(changes) {
            match outcome {
                Err(e) if *add && e.is_exists() => {}
                Err(e) if !*add && e.is_not_found() => {}
                other => other?,
            }
        }
        Ok(())
    }

    /// All addresses, or those of one link.
    pub fn addrs(&mut self, index: Option<u32>) -> Result<Vec<Address>> {
        let request = RouteNetlinkMessage::GetAddress(AddressMessage::default());
        self.dump(request, "addresses", |r| match r {
            RouteNetlinkMessage::NewAddress(m) if index.is_none_or(|i| i == m.header.index) => {
                Address::from_message(&m)
            }
            _ => None,
        })
    }

    // ---- routes ----

    pub fn route_add(&mut self, msg: RouteMessage, what: &str) -> Result<()> {
        self.create(
            RouteNetlinkMessage::NewRoute(msg),
            &format!("add route {what}"),
        )
    }

    /// Adds a route unless an identical one exists.
    pub fn route_ensure(&mut self, msg: RouteMessage, what: &str) -> Result<()> {
        exists_is_ok(self.route_add(msg, what))
    }

    pub fn route_del(&mut self, msg: RouteMessage, what: &str) -> Result<()> {
        self.change(
            RouteNetlinkMessage::DelRoute(msg),
            &format!("delete route {what}"),
        )
    }

    /// Every route of a family in every table.
    pub fn routes(&mut self, family: AddressFamily) -> Result<Vec<Route>> {
        let mut req = RouteMessage::default();
        req.header.address_family = family;
        self.dump(RouteNetlinkMessage::GetRoute(req), "routes", |r| match r {
            RouteNetlinkMessage::NewRoute(m) => Some(Route::from_message(&m)),
            _ => None,
        })
    }

    /// Replaces a route with the same destination, table and metric (`ip route replace`).
    pub fn route_replace(&mut self, msg: RouteMessage, what: &str) -> Result<()> {
        self.replace(
            RouteNetlinkMessage::NewRoute(msg),
            &format!("replace route {what}"),
        )
    }

    // ---- neighbours and bridge/vxlan forwarding entries ----

    /// Adds or replaces a neighbour or FDB entry (`ip neigh replace`, `bridge fdb replace`).
    pub fn neigh_replace(&mut self, msg: NeighbourMessage, what: &str) -> Result<()> {
        self.replace(
            RouteNetlinkMessage::NewNeighbour(msg),
            &format!("set {what}"),
        )
    }

    pub fn neigh_del(&mut self, msg: NeighbourMessage, what: &str) -> Result<()> {
        self.change(
            RouteNetlinkMessage::DelNeighbour(msg),
            &format!("delete {what}"),
        )
    }

    /// Every neighbour (`Inet`, `Inet6`) or FDB (`Bridge`) entry of a family, optionally of one
    /// link only.
    pub fn neighbours(
        &mut self,
        family: AddressFamily,
        index: Option<u32>,
    ) -> Result<Vec<Neighbour>> {
        let mut req = NeighbourMessage::default();
        req.header.family = family;
        self.dump(
            RouteNetlinkMessage::GetNeighbour(req),
            "neighbours",
            |r| match r {
                RouteNetlinkMessage::NewNeighbour(m) => {
                    Some(Neighbour::from_message(&m)).filter(|n| index.is_none_or(|i| i == n.index))
                }
                _ => None,
            },
        )
    }

    // ---- policy rules ----

    pub fn rule_add(&mut self, msg: RuleMessage, what: &str) -> Result<()> {
        self.create(
            RouteNetlinkMessage::NewRule(msg),
            &format!("add rule {what}"),
        )
    }

    pub fn rule_del(&mut self, msg: RuleMessage, what: &str) -> Result<()> {
        self.change(
            RouteNetlinkMessage::DelRule(msg),
            &format!("delete rule {what}"),
        )
    }

    pub fn rules(&mut self, family: AddressFamily) -> Result<Vec<RuleMessage>> {
        let mut req = RuleMessage::default();
        req.header.family = family;
        self.dump(RouteNetlinkMessage::GetRule(req), "rules", |r| match r {
            RouteNetlinkMessage::NewRule(m) => Some(m),
            _ => None,
        })
    }
}

/// A route as the kernel reports it, reduced to what weir compares.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Route {
    /// None means the default route.
    pub destination: Option<IpNet>,
    pub gateway: Option<IpAddr>,
    pub oif: Option<u32>,
    pub table: u32,
    /// Who installed the route (`proto` in `ip route`): 2 kernel, 3 boot, 4 static, …
    pub protocol: u8,
    /// The gateway is used without checking it is on a connected subnet (`onlink`).
    pub onlink: bool,
}

impl Route {
    fn from_message(m: &RouteMessage) -> Self {
        let mut route = Route {
            destination: None,
            gateway: None,
            oif: None,
            table: m.header.table as u32,
            protocol: m.header.protocol.into(),
            onlink: m.header.flags.contains(RouteFlags::Onlink),
        };
        for attr in &m.attributes {
            match attr {
                RouteAttribute::Destination(a) => {
                    route.destination = route_addr(a)
                        .and_then(|ip| IpNet::new(ip, m.header.destination_prefix_length).ok())
                }
                RouteAttribute::Gateway(a) => route.gateway = route_addr(a),
                RouteAttribute::Oif(i) => route.oif = Some(*i),
                RouteAttribute::Table(t) => route.table = *t,
                _ => {}
            }
        }
        route
    }
}

/// A neighbour (IP → MAC) or, in the `Bridge` family, a forwarding entry (MAC → remote `ip`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Neighbour {
    pub family: AddressFamily,
    pub index: u32,
    /// The neighbour's address; for a vxlan FDB entry, the remote VTEP's underlay address.
    pub ip: Option<IpAddr>,
    pub mac: Vec<u8>,
    pub permanent: bool,
}

impl Neighbour {
    fn from_message(m: &NeighbourMessage) -> Self {
        let mut n = Neighbour {
            family: m.header.family,
            index: m.header.ifindex,
            ip: None,
            mac: Vec::new(),
            permanent: m.header.state == NeighbourState::Permanent,
        };
        for attr in &m.attributes {
            match attr {
                NeighbourAttribute::Destination(NeighbourAddress::Inet(a)) => {
                    n.ip = Some(IpAddr::V4(*a))
                }
                NeighbourAttribute::Destination(NeighbourAddress::Inet6(a)) => {
                    n.ip = Some(IpAddr::V6(*a))
                }
                // In a Bridge-family (FDB) message the address is not typed by the family:
                // its length tells.
                NeighbourAttribute::Destination(NeighbourAddress::Other(bytes)) => {
                    n.ip = match bytes.len() {
                        4 => <[u8; 4]>::try_from(&bytes[..]).ok().map(IpAddr::from),
                        16 => <[u8; 16]>::try_from(&bytes[..]).ok().map(IpAddr::from),
                        _ => None,
                    }
                }
                NeighbourAttribute::LinkLayerAddress(mac) => n.mac = mac.clone(),
                _ => {}
            }
        }
        n
    }

    /// A permanent neighbour entry `ip lladdr mac` on link `index` (`ip neigh replace … nud permanent`).
    pub fn permanent_message(index: u32, ip: IpAddr, mac: &[u8]) -> NeighbourMessage {
        let mut m = NeighbourMessage::default();
        m.header.family = family_of(ip);
        m.header.ifindex = index;
        m.header.state = NeighbourState::Permanent;
        m.attributes
            .push(NeighbourAttribute::Destination(neigh_addr(ip)));
        m.attributes
            .push(NeighbourAttribute::LinkLayerAddress(mac.to_vec()));
        m
    }

    /// A permanent FDB entry of a vxlan device: frames for `mac` go to the VTEP at `remote`
    /// (`bridge fdb replace <mac> dev <vxlan> dst <remote> self permanent`).
    pub fn vxlan_fdb_message(index: u32, mac: &[u8], remote: IpAddr) -> NeighbourMessage {
        let mut m = NeighbourMessage::default();
        m.header.family = AddressFamily::Bridge;
        m.header.ifindex = index;
        m.header.state = NeighbourState::Permanent;
        m.header.flags = NeighbourFlags::Own;
        m.attributes
            .push(NeighbourAttribute::LinkLayerAddress(mac.to_vec()));
        m.attributes
            .push(NeighbourAttribute::Destination(neigh_addr(remote)));
        m
    }
}

/// For the `…_ensure` calls: what is to be added being there already is success.
fn exists_is_ok(result: Result<()>) -> Result<()> {
    match result {
        Err(e) if e.is_exists() => Ok(()),
        other => other,
    }
}

/// The message that adds or deletes address `net` on link `index`.
fn address_message(index: u32, net: IpNet) -> AddressMessage {
    match net {
        IpNet::V4(n) => rtnetlink::AddressMessageBuilder::<std::net::Ipv4Addr>::new()
            .index(index)
            .address(n.addr(), n.prefix_len())
            .build(),
        IpNet::V6(n) => rtnetlink::AddressMessageBuilder::<std::net::Ipv6Addr>::new()
            .index(index)
            .address(n.addr(), n.prefix_len())
            .build(),
    }
}

fn family_of(ip: IpAddr) -> AddressFamily {
    match ip {
        IpAddr::V4(_) => AddressFamily::Inet,
        IpAddr::V6(_) => AddressFamily::Inet6,
    }
}

fn neigh_addr(ip: IpAddr) -> NeighbourAddress {
    match ip {
        IpAddr::V4(a) => NeighbourAddress::Inet(a),
        IpAddr::V6(a) => NeighbourAddress::Inet6(a),
    }
}

/// A vxlan device for a point-to-point overlay: unicast only (no group), learning off (the FDB
/// is programmed), the given local address, UDP port and underlay device.
pub fn vxlan_link_message(
    name: &str,
    vni: u32,
    local: IpAddr,
    port: u16,
    underlay: u32,
    mtu: u32,
    mac: &[u8],
) -> LinkMessage {
    let builder = rtnetlink::LinkVxlan::new(name, vni)
        .dev(underlay)
        .port(port)
        .learning(false)
        .mtu(mtu)
        .address(mac.to_vec());
    match local {
        IpAddr::V4(a) => builder.local(a).build(),
        IpAddr::V6(a) => builder.local6(a).build(),
    }
}

/// A route message with weir's usual fields: destination, optional gateway and device,
/// protocol (who owns it) and the onlink flag.
pub fn route_message(
    destination: IpNet,
    gateway: Option<IpAddr>,
    oif: Option<u32>,
    protocol: u8,
    onlink: bool,
) -> RouteMessage {
    let mut m = RouteMessage::default();
    m.header.address_family = family_of(destination.addr());
    m.header.destination_prefix_length = destination.prefix_len();
    m.header.table = libc::RT_TABLE_MAIN;
    m.header.protocol = RouteProtocol::from(protocol);
    m.header.scope = netlink_packet_route::route::RouteScope::Universe;
    m.header.kind = netlink_packet_route::route::RouteType::Unicast;
    if onlink {
        m.header.flags |= RouteFlags::Onlink;
    }
    m.attributes
        .push(RouteAttribute::Destination(destination.network().into()));
    if let Some(gw) = gateway {
        m.attributes.push(RouteAttribute::Gateway(gw.into()));
    }
    if let Some(oif) = oif {
        m.attributes.push(RouteAttribute::Oif(oif));
    }
    m
}

fn route_addr(a: &RouteAddress) -> Option<IpAddr> {
    match a {
        RouteAddress::Inet(v4) => Some(IpAddr::V4(*v4)),
        RouteAddress::Inet6(v6) => Some(IpAddr::V6(*v6)),
        _ => None,
    }
}
