//! nf_tables set elements over netlink, without the `nft` tool: the fast path for the
//! changes that dominate a proxy's life (endpoints and services coming and going are element
//! updates in weir's ruleset shape).
//!
//! Hand-encoded: the rust-netlink family has no nf_tables support, and `rustables`/`nftnl`
//! cover neither map data nor verdict elements (nftnl also needs libnftnl). The encoding is
//! small (a batch, one message type, a few nested attributes) and every path is checked
//! against the `nft` tool's own view of the result in the kernel tests.

use std::collections::HashMap;
use std::io;
use std::time::Duration;

use netlink_sys::{protocols::NETLINK_NETFILTER, Socket, SocketAddr};

use super::element::{encode, Data, Element};
use crate::backend::{Error, Result};

const NFNL_SUBSYS_NFTABLES: u16 = 10;
const NFNL_MSG_BATCH_BEGIN: u16 = 0x10;
const NFNL_MSG_BATCH_END: u16 = 0x11;
const NFT_MSG_GETCHAIN: u16 = 4;
const NFT_MSG_NEWGEN: u16 = 15;
const NFT_MSG_GETGEN: u16 = 16;
const NFTA_GEN_ID: u16 = 1;
const NFT_MSG_GETRULE: u16 = 7;
const NFT_MSG_GETSET: u16 = 10;
const NFT_MSG_NEWSETELEM: u16 = 12;
const NFT_MSG_GETSETELEM: u16 = 13;
const NFT_MSG_DELSETELEM: u16 = 14;
const NLMSG_ERROR: u16 = 2;
const NLMSG_DONE: u16 = 3;
const NLM_F_REQUEST: u16 = 0x1;
const NLM_F_ACK: u16 = 0x4;
const NLM_F_DUMP: u16 = 0x300;
const NLM_F_CREATE: u16 = 0x400;
const NFPROTO_INET: u8 = 1;
const NLA_F_NESTED: u16 = 0x8000;
const NFTA_CHAIN_TABLE: u16 = 1;
const NFTA_CHAIN_NAME: u16 = 3;
const NFTA_RULE_TABLE: u16 = 1;
const NFTA_RULE_CHAIN: u16 = 2;
const NFTA_SET_TABLE: u16 = 1;
const NFTA_SET_NAME: u16 = 2;
const NFTA_SET_ELEM_LIST_TABLE: u16 = 1;
const NFTA_SET_ELEM_LIST_SET: u16 = 2;
const NFTA_SET_ELEM_LIST_ELEMENTS: u16 = 3;
const NFTA_LIST_ELEM: u16 = 1;
const NFTA_SET_ELEM_KEY: u16 = 1;
const NFTA_SET_ELEM_DATA: u16 = 2;
const NFTA_DATA_VALUE: u16 = 1;
const NFTA_DATA_VERDICT: u16 = 2;
const NFTA_VERDICT_CODE: u16 = 1;
const NFTA_VERDICT_CHAIN: u16 = 2;
const NF_DROP: i32 = 0;
const NFT_GOTO: i32 = -4;
/// Elements per netlink message; a transaction holds as many messages as it needs.
const ELEMENTS_PER_MESSAGE: usize = 1024;

/// Element data as the kernel stores it (what a dump returns), for comparing with a plan.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum RawData {
    Value(Vec<u8>),
    Verdict(i32, Option<String>),
}

impl RawData {
    pub fn of(data: &Data) -> RawData {
        match data {
            Data::Goto(chain) => RawData::Verdict(NFT_GOTO, Some(chain.clone())),
            Data::Drop => RawData::Verdict(NF_DROP, None),
            Data::Values(v) => RawData::Value(encode(v)),
        }
    }
}

/// One element as raw bytes.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct RawElement {
    pub key: Vec<u8>,
    pub data: Option<RawData>,
}

impl RawElement {
    pub fn of(e: &Element) -> RawElement {
        RawElement {
            key: encode(&e.key),
            data: e.data.as_ref().map(RawData::of),
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Op {
    Add,
    Delete,
}

/// A netfilter netlink socket in the network namespace of the thread that opened it.
pub struct NftNetlink {
    socket: Socket,
    seq: u32,
}

fn attr(buf: &mut Vec<u8>, kind: u16, payload: &[u8]) {
    let len = 4 + payload.len();
    buf.extend_from_slice(&(len as u16).to_ne_bytes());
    buf.extend_from_slice(&kind.to_ne_bytes());
    buf.extend_from_slice(payload);
    buf.resize(buf.len() + (4 - len % 4) % 4, 0);
}

fn attr_str(buf: &mut Vec<u8>, kind: u16, s: &str) {
    let mut p = s.as_bytes().to_vec();
    p.push(0);
    attr(buf, kind, &p);
}

/// Starts a nested attribute; returns its offset for [`nest_end`].
fn nest_start(buf: &mut Vec<u8>, kind: u16) -> usize {
    let at = buf.len();
    buf.extend_from_slice(&[0, 0]);
    buf.extend_from_slice(&(kind | NLA_F_NESTED).to_ne_bytes());
    at
}

fn nest_end(buf: &mut [u8], at: usize) {
    let len = (buf.len() - at) as u16;
    buf[at..at + 2].copy_from_slice(&len.to_ne_bytes());
}

fn encode_element(buf: &mut Vec<u8>, e: &RawElement, with_data: bool) {
    let el = nest_start(buf, NFTA_LIST_ELEM);
    let key = nest_start(buf, NFTA_SET_ELEM_KEY);
    attr(buf, NFTA_DATA_VALUE, &e.key);
    nest_end(buf, key);
    if let (true, Some(d)) = (with_data, &e.data) {
        let data = nest_start(buf, NFTA_SET_ELEM_DATA);
        match d {
            RawData::Value(v) => attr(buf, NFTA_DATA_VALUE, v),
            RawData::Verdict(code, chain) => {
                let v = nest_start(buf, NFTA_DATA_VERDICT);
                attr(buf, NFTA_VERDICT_CODE, &code.to_be_bytes());
                if let Some(c) = chain {
                    attr_str(buf, NFTA_VERDICT_CHAIN, c);
                }
                nest_end(buf, v);
            }
        }
        nest_end(buf, data);
    }
    nest_end(buf, el);
}

/// Iterates over the attributes in `buf`: (type without flags, payload).
fn attrs(mut buf: &[u8]) -> impl Iterator<Item = (u16, &[u8])> {
    std::iter::from_fn(move || {
        if buf.len() < 4 {
            return None;
        }
        let len = u16::from_ne_bytes([buf[0], buf[1]]) as usize;
        let kind = u16::from_ne_bytes([buf[2], buf[3]]) & 0x3fff;
        if len < 4 || len > buf.len() {
            return None;
        }
        let payload = &buf[4..len];
        buf = &buf[(len + 3) & !3..];
        Some((kind, payload))
    })
}

fn find(buf: &[u8], kind: u16) -> Option<&[u8]> {
    attrs(buf).find(|(k, _)| *k == kind).map(|(_, p)| p)
}

fn decode_element(buf: &[u8]) -> Option<RawElement> {
    let key = find(find(buf, NFTA_SET_ELEM_KEY)?, NFTA_DATA_VALUE)?.to_vec();
    let data = find(buf, NFTA_SET_ELEM_DATA).and_then(|d| {
        if let Some(v) = find(d, NFTA_DATA_VALUE) {
            return Some(RawData::Value(v.to_vec()));
        }
        let v = find(d, NFTA_DATA_VERDICT)?;
        let code = i32::from_be_bytes(find(v, NFTA_VERDICT_CODE)?.try_into().ok()?);
        let chain = find(v, NFTA_VERDICT_CHAIN)
            .map(|c| String::from_utf8_lossy(c.split(|b| *b == 0).next().unwrap_or(c)).into());
        Some(RawData::Verdict(code, chain))
    });
    Some(RawElement { key, data })
}

/// Appends one netlink message (header + nfgenmsg + body) to `buf`.
fn message(buf: &mut Vec<u8>, kind: u16, flags: u16, seq: u32, res_id: u16, body: &[u8]) {
    let len = 16 + 4 + body.len();
    buf.extend_from_slice(&(len as u32).to_ne_bytes());
    buf.extend_from_slice(&kind.to_ne_bytes());
    buf.extend_from_slice(&flags.to_ne_bytes());
    buf.extend_from_slice(&seq.to_ne_bytes());
    buf.extend_from_slice(&0u32.to_ne_bytes());
    buf.extend_from_slice(&[NFPROTO_INET, 0]);
    buf.extend_from_slice(&res_id.to_be_bytes());
    buf.extend_from_slice(body);
}

fn netlink_error(what: &str, errno: i32) -> Error {
    Error::Netlink(format!(
        "{what}: {}",
        io::Error::from_raw_os_error(errno.abs())
    ))
}

impl NftNetlink {
    pub fn new() -> Result<Self> {
        let mut socket = Socket::new(NETLINK_NETFILTER)?;
        socket.bind_auto()?;
        socket.connect(&SocketAddr::new(0, 0))?;
        // A cold-start transaction can be megabytes; the default send buffer is ~200 KiB.
        set_buffers(&socket, 64 << 20);
        Ok(NftNetlink { socket, seq: 1 })
    }

    fn next_seq(&mut self) -> u32 {
        self.seq = self.seq.wrapping_add(1);
        self.seq
    }

    /// Applies `ops` to sets of `table` (family inet) as ONE transaction: all or nothing.
    pub fn apply(&mut self, table: &str, ops: &[(Op, &str, RawElement)]) -> Result<()> {
        if ops.is_empty() {
            return Ok(());
        }
        let mut buf = Vec::with_capacity(64 + ops.len() * 96);
        let begin = self.next_seq();
        message(
            &mut buf,
            NFNL_MSG_BATCH_BEGIN,
            NLM_F_REQUEST,
            begin,
            NFNL_SUBSYS_NFTABLES,
            &[],
        );
        let mut sent = Vec::new();
        let mut i = 0;
        while i < ops.len() {
            let (op, set) = (ops[i].0, ops[i].1);
            let mut j = i;
            while j < ops.len() && j - i < ELEMENTS_PER_MESSAGE && ops[j].0 == op && ops[j].1 == set
            {
                j += 1;
            }
            let mut body = Vec::new();
            attr_str(&mut body, NFTA_SET_ELEM_LIST_TABLE, table);
            attr_str(&mut body, NFTA_SET_ELEM_LIST_SET, set);
            let list = nest_start(&mut body, NFTA_SET_ELEM_LIST_ELEMENTS);
            for (_, _, e) in &ops[i..j] {
                encode_element(&mut body, e, op == Op::Add);
            }
            nest_end(&mut body, list);
            let (kind, flags) = match op {
                Op::Add => (NFT_MSG_NEWSETELEM, NLM_F_REQUEST | NLM_F_ACK | NLM_F_CREATE),
                Op::Delete => (NFT_MSG_DELSETELEM, NLM_F_REQUEST | NLM_F_ACK),
            };
            let seq = self.next_seq();
            message(
                &mut buf,
                (NFNL_SUBSYS_NFTABLES << 8) | kind,
                flags,
                seq,
                0,
                &body,
            );
            sent.push((seq, op, set.to_string()));
            i = j;
        }
        let end = self.next_seq();
        message(
            &mut buf,
            NFNL_MSG_BATCH_END,
            NLM_F_REQUEST,
            end,
            NFNL_SUBSYS_NFTABLES,
            &[],
        );
        self.socket.send(&buf, 0)?;
        // One answer per message (ack or error), delivered after the whole batch ran.
        let mut answered = 0;
        let mut first_error = None;
        while answered < sent.len() {
            for (kind, seq, payload) in self.recv()? {
                if kind != NLMSG_ERROR || !sent.iter().any(|s| s.0 == seq) {
                    continue;
                }
                answered += 1;
                let errno = i32::from_ne_bytes(payload[..4].try_into().unwrap_or_default());
                if errno != 0 && first_error.is_none() {
                    let (_, op, set) = sent.iter().find(|s| s.0 == seq).expect("seq is ours");
                    first_error = Some(netlink_error(
                        &format!("{op:?} elements of {table} {set}"),
                        errno,
                    ));
                }
            }
        }
        match first_error {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }

    /// Whether chain `chain` exists in table `table` (family inet): the canary that tells a
    /// proxy its table was deleted or replaced behind its back.
    pub fn chain_exists(&mut self, table: &str, chain: &str) -> Result<bool> {
        let mut body = Vec::new();
        attr_str(&mut body, NFTA_CHAIN_TABLE, table);
        attr_str(&mut body, NFTA_CHAIN_NAME, chain);
        let seq = self.next_seq();
        let mut buf = Vec::new();
        message(
            &mut buf,
            (NFNL_SUBSYS_NFTABLES << 8) | NFT_MSG_GETCHAIN,
            NLM_F_REQUEST | NLM_F_ACK,
            seq,
            0,
            &body,
        );
        self.socket.send(&buf, 0)?;
        loop {
            for (kind, s, payload) in self.recv()? {
                if s != seq {
                    continue;
                }
                if kind != NLMSG_ERROR {
                    // The chain itself; the ack follows.
                    continue;
                }
                let errno = i32::from_ne_bytes(payload[..4].try_into().unwrap_or_default());
                return match -errno {
                    0 => Ok(true),
                    libc::ENOENT => Ok(false),
                    _ => Err(netlink_error(&format!("get chain {table} {chain}"), errno)),
                };
            }
        }
    }

    /// The ruleset's generation: a counter the kernel bumps on every committed nf_tables
    /// transaction in this namespace, whatever the table or the tool (`nft`, iptables-nft).
    /// Unchanged means nothing at all was changed in between: a one-message check.
    pub fn generation(&mut self) -> Result<u32> {
        let seq = self.next_seq();
        let mut buf = Vec::new();
        message(
            &mut buf,
            (NFNL_SUBSYS_NFTABLES << 8) | NFT_MSG_GETGEN,
            NLM_F_REQUEST | NLM_F_ACK,
            seq,
            0,
            &[],
        );
        self.socket.send(&buf, 0)?;
        let mut gen = None;
        loop {
            for (kind, s, payload) in self.recv()? {
                if s != seq {
                    continue;
                }
                if kind == (NFNL_SUBSYS_NFTABLES << 8) | NFT_MSG_NEWGEN {
                    gen = find(payload.get(4..).unwrap_or_default(), NFTA_GEN_ID)
                        .and_then(|v| v.get(..4)?.try_into().ok())
                        .map(u32::from_be_bytes);
                    continue;
                }
                if kind != NLMSG_ERROR {
                    continue;
                }
                let errno = i32::from_ne_bytes(payload[..4].try_into().unwrap_or_default());
                if errno != 0 {
                    return Err(netlink_error("get ruleset generation", errno));
                }
                return gen.ok_or_else(|| Error::Netlink("no generation in the answer".into()));
            }
        }
    }

    /// The number of rules in each chain of table `table` (family inet; chains without
    /// rules are absent). One dump of the table's rules: weir's table has a fixed number of
    /// chains whatever the number of services, so this stays cheap. It is how the backend
    /// notices that someone flushed its chains (`nft flush table`, `nft flush chain`).
    pub fn rule_counts(&mut self, table: &str) -> Result<HashMap<String, usize>> {
        let mut body = Vec::new();
        attr_str(&mut body, NFTA_RULE_TABLE, table);
        let mut counts: HashMap<String, usize> = HashMap::new();
        for msg in self.dump_request(NFT_MSG_GETRULE, &body, &format!("list rules of {table}"))? {
            // The kernel filters the dump by table; check anyway (older kernels did not).
            let name = |kind| {
                find(&msg, kind).map(|n| {
                    String::from_utf8_lossy(n.split(|b| *b == 0).next().unwrap_or(n)).into_owned()
                })
            };
            if name(NFTA_RULE_TABLE).as_deref() != Some(table) {
                continue;
            }
            if let Some(chain) = name(NFTA_RULE_CHAIN) {
                *counts.entry(chain).or_default() += 1;
            }
        }
        Ok(counts)
    }

    /// Every element of set `set` in table `table` (family inet).
    pub fn dump(&mut self, table: &str, set: &str) -> Result<Vec<RawElement>> {
        let mut body = Vec::new();
        attr_str(&mut body, NFTA_SET_ELEM_LIST_TABLE, table);
        attr_str(&mut body, NFTA_SET_ELEM_LIST_SET, set);
        let mut out = Vec::new();
        for msg in self.dump_request(NFT_MSG_GETSETELEM, &body, &format!("dump {table} {set}"))? {
            if let Some(list) = find(&msg, NFTA_SET_ELEM_LIST_ELEMENTS) {
                out.extend(
                    attrs(list)
                        .filter(|(k, _)| *k == NFTA_LIST_ELEM)
                        .filter_map(|(_, e)| decode_element(e)),
                );
            }
        }
        Ok(out)
    }

    /// Names of the sets and maps of table `table` (family inet). (`nft list sets` would
    /// print every element too: seconds at 10k services.)
    pub fn set_names(&mut self, table: &str) -> Result<Vec<String>> {
        let mut body = Vec::new();
        attr_str(&mut body, NFTA_SET_TABLE, table);
        let msgs = self.dump_request(NFT_MSG_GETSET, &body, &format!("list sets of {table}"))?;
        Ok(msgs
            .iter()
            .filter_map(|m| find(m, NFTA_SET_NAME))
            .map(|n| String::from_utf8_lossy(n.split(|b| *b == 0).next().unwrap_or(n)).into())
            .collect())
    }

    /// Sends a dump request and returns the attributes of every answer (after nfgenmsg).
    fn dump_request(&mut self, kind: u16, body: &[u8], what: &str) -> Result<Vec<Vec<u8>>> {
        let seq = self.next_seq();
        let mut buf = Vec::new();
        message(
            &mut buf,
            (NFNL_SUBSYS_NFTABLES << 8) | kind,
            NLM_F_REQUEST | NLM_F_DUMP,
            seq,
            0,
            body,
        );
        self.socket.send(&buf, 0)?;
        let mut out = Vec::new();
        loop {
            for (kind, s, payload) in self.recv()? {
                if s != seq {
                    continue;
                }
                match kind {
                    NLMSG_DONE => return Ok(out),
                    NLMSG_ERROR => {
                        let errno = i32::from_ne_bytes(payload[..4].try_into().unwrap_or_default());
                        return Err(netlink_error(what, errno));
                    }
                    _ => out.push(payload.get(4..).unwrap_or_default().to_vec()),
                }
            }
        }
    }

    /// Reads one datagram: (type, seq, payload after the header) of each message in it.
    fn recv(&mut self) -> Result<Vec<(u16, u32, Vec<u8>)>> {
        let mut buf = vec![0u8; 1 << 20];
        let n = self.socket.recv(&mut &mut buf[..], 0)?;
        let mut out = Vec::new();
        let mut b = &buf[..n];
        while b.len() >= 16 {
            let len = u32::from_ne_bytes(b[0..4].try_into().expect("4 bytes")) as usize;
            if len < 16 || len > b.len() {
                break;
            }
            let kind = u16::from_ne_bytes([b[4], b[5]]);
            let seq = u32::from_ne_bytes(b[8..12].try_into().expect("4 bytes"));
            out.push((kind, seq, b[16..len].to_vec()));
            b = &b[(len + 3) & !3..];
        }
        Ok(out)
    }
}

/// Raises the socket buffers (SO_*BUFFORCE works for root beyond the sysctl limits) and
/// bounds receive waits so that a lost answer cannot hang the proxy.
fn set_buffers(socket: &Socket, size: i32) {
    use std::os::fd::AsRawFd;
    let fd = socket.as_raw_fd();
    let tv = libc::timeval {
        tv_sec: Duration::from_secs(30).as_secs() as libc::time_t,
        tv_usec: 0,
    };
    // SAFETY: plain setsockopt calls on a socket we own, with correctly sized values.
    unsafe {
        for opt in [libc::SO_SNDBUFFORCE, libc::SO_RCVBUFFORCE] {
            libc::setsockopt(
                fd,
                libc::SOL_SOCKET,
                opt,
                &size as *const i32 as *const libc::c_void,
                std::mem::size_of::<i32>() as libc::socklen_t,
            );
        }
        libc::setsockopt(
            fd,
            libc::SOL_SOCKET,
            libc::SO_RCVTIMEO,
            &tv as *const libc::timeval as *const libc::c_void,
            std::mem::size_of::<libc::timeval>() as libc::socklen_t,
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::nft::element::Val;

    #[test]
    fn element_roundtrips_through_the_attribute_encoding() {
        let e = Element::map(
            vec![Val::Proto(weir_model::Protocol::Tcp), Val::Port(30080)],
            Data::Goto("ep4-n2-o".into()),
        );
        let raw = RawElement::of(&e);
        let mut buf = Vec::new();
        encode_element(&mut buf, &raw, true);
        let (kind, inner) = attrs(&buf).next().unwrap();
        assert_eq!(kind, NFTA_LIST_ELEM);
        assert_eq!(decode_element(inner), Some(raw));
    }
}
